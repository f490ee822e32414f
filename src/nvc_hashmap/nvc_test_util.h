// Test helpers for the NVC-Hashmap tests: pool paths, key/value generators
// and a leak check. The crash tests' durable-image observer is
// kit/test_observer.h.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "pm/image_file.h"
#include "pmindex/index.h"
#include "pmindex/pm/allocator.h"
#include "pmindex/pm/persist.h"
#include "pmindex/pm/pool.h"

namespace pmindex::nvc_test {

inline std::string PoolPath(const std::string& tag) {
  static std::atomic<int> n{0};
  return "/dev/shm/nvc_hashmap-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(n++) + ".pool";
}

// Removes the pool file when the test ends.
struct PoolFile {
  std::string path;
  explicit PoolFile(const std::string& tag) : path(PoolPath(tag)) { pm::Pool::Remove(path); }
  ~PoolFile() { pm::Pool::Remove(path); ::unlink(path.c_str()); }
};

inline std::string U64(uint64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); }

// Keys for id: 8 bytes for u64 keys; variable-length strings for byte keys
// (shared prefixes, lengths 3..~60).
inline std::string MakeKey(KeyKind kk, uint64_t id) {
  if (kk == KeyKind::kU64) return U64(id * 0x9E3779B97F4A7C15ull + 7);
  std::string s = "key" + std::to_string(id);
  s.append(id % 7 * 8, char('a' + id % 26));
  return s;
}
inline std::string MakeValue(ValueKind vk, uint64_t id, uint64_t version) {
  if (vk == ValueKind::kU64) return U64((id << 20) ^ version);
  std::string s((id * 13 + version) % 200, char('A' + (id + version) % 26));
  std::string tag = std::to_string(id) + ":" + std::to_string(version) + ";";
  return tag + s;
}

// Owned blocks == allocated blocks (no leak, nothing owned twice).
inline void ExpectNoLeak(Index* idx) {
  std::set<uint64_t> owned, allocated;
  ASSERT_TRUE(idx->ForEachOwnedBlock([&](uint64_t off) { EXPECT_TRUE(owned.insert(off).second) << "reported twice: " << off; }).ok());
  idx->pool()->allocator().ForEachAllocated([&](uint64_t off, size_t) { allocated.insert(off); });
  EXPECT_EQ(owned.size(), allocated.size());
  EXPECT_TRUE(owned == allocated) << "owned " << owned.size() << " blocks, allocator has " << allocated.size();
}

}  // namespace pmindex::nvc_test
