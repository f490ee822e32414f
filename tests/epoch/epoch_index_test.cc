// epoch_index_test.cc: the shared epoch manager (kit/epoch.h) is per index
// instance. A reader parked inside one fastfair tree's epoch guard (a scan
// callback) does not hold back the frees of another tree (with the former
// process-wide epoch it did: nodes_freed stayed 0), and a thread inside one
// index's guard may run operations of another index that wait for that
// index's grace period (fptree leaf deletions).
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "fastfair/fastfair.h"
#include "pmindex/index.h"
#include "pmindex/pm/pool.h"

namespace pmindex {
namespace {

std::string U64(uint64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); }

struct Pool {
  std::string path;
  explicit Pool(const std::string& tag) : path("/dev/shm/epoch-index-" + std::to_string(getpid()) + "-" + tag + ".pool") {
    pm::Pool::Remove(path);
  }
  ~Pool() { pm::Pool::Remove(path); }
};

std::unique_ptr<Index> Open(const std::string& name, const std::string& path, std::map<std::string, std::string> params) {
  Options o;
  o.pool_path = path;
  o.params = std::move(params);
  std::unique_ptr<Index> idx;
  Status s = OpenIndex(name, o, &idx);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return idx;
}

TEST(EpochPerIndex, ReaderInOneTreeDoesNotHoldBackAnothersFrees) {
  Pool pa("a"), pb("b");
  auto a = Open("fastfair", pa.path, {{"node_size", "256"}});
  auto b = Open("fastfair", pb.path, {{"node_size", "256"}});
  ASSERT_TRUE(a && b);
  for (uint64_t i = 0; i < 10; i++) ASSERT_TRUE(a->Insert(U64(i), U64(i)).ok());
  std::atomic<bool> parked{false}, release{false};
  std::thread reader([&] {
    size_t n = 0;
    EXPECT_TRUE(a->Scan(U64(0), 1,
                        [&](Slice, Slice) {
                          parked = true;  // inside a's epoch guard until released
                          while (!release.load()) std::this_thread::yield();
                          return true;
                        },
                        &n)
                    .ok());
  });
  while (!parked.load()) std::this_thread::yield();
  // Fill b and empty it again: merges retire nodes of b.
  for (uint64_t i = 0; i < 3000; i++) ASSERT_TRUE(b->Insert(U64(i * 7919 % 3001), U64(i)).ok());
  for (uint64_t i = 0; i < 3000; i++) ASSERT_TRUE(b->Remove(U64(i * 7919 % 3001)).ok());
  const auto* d = internal::fastfair::GetDebugCounters(b.get());
  ASSERT_NE(d, nullptr);
  EXPECT_GT(d->merges, 0u);
  EXPECT_GT(d->nodes_freed, 0u) << "b's retired nodes waited for a reader of a";
  release = true;
  reader.join();
  EXPECT_TRUE(a->Check().ok());
  EXPECT_TRUE(b->Check().ok());
  EXPECT_EQ(b->Size(), 0u);
}

TEST(EpochPerIndex, GracePeriodOfOneIndexInsideAnothersGuard) {
  Pool pa("ff"), pb("fp");
  auto a = Open("fastfair", pa.path, {});
  auto b = Open("fptree", pb.path, {{"leaf_size", "6"}, {"inner_size", "4"}});
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->Insert(U64(1), U64(1)).ok());
  for (uint64_t i = 0; i < 600; i++) ASSERT_TRUE(b->Insert(U64(i), U64(i)).ok());
  size_t n = 0;
  // Inside a's guard: b's removes empty leaves, and each leaf deletion
  // waits for b's grace period (not for this thread's guard of a).
  ASSERT_TRUE(a->Scan(U64(0), 1,
                      [&](Slice, Slice) {
                        for (uint64_t i = 0; i < 600; i++) EXPECT_TRUE(b->Remove(U64(i)).ok());
                        return true;
                      },
                      &n)
                  .ok());
  EXPECT_EQ(n, 1u);
  EXPECT_EQ(b->Size(), 0u);
  EXPECT_TRUE(b->Check().ok());
}

}  // namespace
}  // namespace pmindex
