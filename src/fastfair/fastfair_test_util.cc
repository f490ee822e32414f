// Test helpers for the fastfair tests (see fastfair_test_util.h).
#include "fastfair/fastfair_test_util.h"

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <set>

#include "pm/image_file.h"
#include "pmindex/pm/allocator.h"

namespace fftest {

using namespace pmindex;

std::string PoolPath(const std::string& tag) {
  static std::atomic<int> n{0};
  return "/dev/shm/fastfair-test-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(n++) + ".pool";
}

PoolGuard::~PoolGuard() { pm::Pool::Remove(path); }

Options MakeOptions(const std::string& path, KeyKind kk, ValueKind vk, int node_size) {
  Options o;
  o.pool_path = path;
  o.pool_size = 16ull << 20;
  o.key_kind = kk;
  o.value_kind = vk;
  o.params["node_size"] = std::to_string(node_size);
  return o;
}

testing::AssertionResult NoLeak(Index* idx) {
  std::set<uint64_t> owned, allocated;
  std::string dup;
  Status s = idx->ForEachOwnedBlock([&](uint64_t off) {
    if (!owned.insert(off).second) dup += " " + std::to_string(off);
  });
  if (!s.ok()) return testing::AssertionFailure() << "ForEachOwnedBlock: " << s.ToString();
  if (!dup.empty()) return testing::AssertionFailure() << "blocks reported twice:" << dup;
  idx->pool()->allocator().ForEachAllocated([&](uint64_t off, size_t) { allocated.insert(off); });
  std::string leaked, foreign;
  for (uint64_t a : allocated)
    if (!owned.count(a)) leaked += " " + std::to_string(a);
  for (uint64_t o : owned)
    if (!allocated.count(o)) foreign += " " + std::to_string(o);
  if (!leaked.empty() || !foreign.empty())
    return testing::AssertionFailure() << "allocated but not owned:" << leaked.substr(0, 200)
                                       << "; owned but not allocated:" << foreign.substr(0, 200);
  return testing::AssertionSuccess();
}

}  // namespace fftest
