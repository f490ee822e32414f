// retire_list_test.cc: kit::PmRetireList (retire_list.h): a retired block
// is freed only after the epoch grace period, recovery after a "crash"
// (the pool closed with slots in use, DRAM state lost) frees what the slots
// own and gives back what is still linked, claims are bounded, and
// concurrent retirements leak nothing.
#include "kit/retire_list.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kit/epoch.h"
#include "kit/test_watchdog.h"
#include "pmindex/pm/pool.h"

namespace pmindex::internal::kit {
namespace {

// A pool whose root object holds the list's area word (word 0) and a few
// words that stand for an index's links to blocks (words 1..7).
struct TestPool {
  std::string path;
  std::unique_ptr<pm::Pool> pool;
  explicit TestPool(const std::string& tag)
      : path("/dev/shm/retire-list-test-" + tag + "-" + std::to_string(::getpid()) + ".pool") {
    pm::Pool::Remove(path);
    EXPECT_TRUE(pm::Pool::Create(path, "retire_list_test", pm::PoolOptions{}, &pool).ok());
    EXPECT_TRUE(pool->allocator().AllocateZeroed(pool->root_slot(), 64).ok());
  }
  ~TestPool() {
    pool.reset();
    pm::Pool::Remove(path);
  }
  void Reopen() {
    pool.reset();
    ASSERT_TRUE(pm::Pool::Open(path, "retire_list_test", pm::PoolOptions{}, &pool).ok());
  }
  uint64_t* word(int i) { return pool->root<uint64_t>() + i; }
  std::set<uint64_t> Allocated() {
    std::set<uint64_t> s;
    pool->allocator().ForEachAllocated([&](uint64_t off, size_t) { s.insert(off); });
    return s;
  }
};

TEST(PmRetireList, FreesAfterTheGracePeriod) {
  TestPool p("grace");
  EpochManager epoch;
  PmRetireList list(p.pool->base(), &p.pool->allocator(), p.word(0), 8);
  EXPECT_FALSE(list.allocated());
  const int slot = list.Claim();
  ASSERT_EQ(slot, 0);
  EXPECT_TRUE(list.allocated());
  ASSERT_TRUE(p.pool->allocator().Allocate(p.word(1), 100).ok());
  const uint64_t block = *p.word(1);
  // Owned by the slot, then unlinked from word 1.
  list.Own(slot, block, /*tag=*/7);
  EXPECT_EQ(list.slots()[slot].block, block);
  EXPECT_EQ(list.slots()[slot].tag, 7u);
  pm::StorePersist(p.word(1), uint64_t(0));
  list.Unlinked(slot);
  EXPECT_EQ(list.slots()[slot].tag, 0u);
  int extra = 0;
  auto count_extra = [&](const RetireSlot& s) {
    EXPECT_EQ(s.block, block);
    extra++;
  };
  {
    EpochManager::Guard g(epoch);  // a reader that may still see the block
    list.Retire(slot);
    EXPECT_TRUE(list.has_retired());
    EXPECT_EQ(list.Reclaim(epoch, false, count_extra), 0u);
    EXPECT_TRUE(p.Allocated().count(block));
  }
  EXPECT_EQ(list.Reclaim(epoch, false, count_extra), 1u);
  EXPECT_EQ(extra, 1);
  EXPECT_FALSE(list.has_retired());
  EXPECT_FALSE(p.Allocated().count(block));
  EXPECT_EQ(list.slots()[slot].block, 0u);
  EXPECT_EQ(list.Claim(), 0) << "a freed slot is free again";
}

TEST(PmRetireList, ClaimsAreBounded) {
  TestPool p("bounded");
  PmRetireList list(p.pool->base(), &p.pool->allocator(), p.word(0), 4);
  for (int i = 0; i < 4; i++) EXPECT_EQ(list.Claim(), i);
  EXPECT_EQ(list.Claim(), -1);
  list.Release(2);
  EXPECT_EQ(list.Claim(), 2);
}

// Slots left in use by a "crash" (the pool closed, the DRAM list gone):
// unlinked (tag 0) and not linked any more (tag set, linked() false) are
// freed; linked ones are undone and kept. Every slot ends empty.
TEST(PmRetireList, RecoverSettlesEverySlot) {
  TestPool p("recover");
  uint64_t unlinked, stale, linked;
  {
    PmRetireList list(p.pool->base(), &p.pool->allocator(), p.word(0), 8);
    for (int i = 1; i <= 3; i++) ASSERT_TRUE(p.pool->allocator().Allocate(p.word(i), 64).ok());
    unlinked = *p.word(1);
    stale = *p.word(2);
    linked = *p.word(3);
    const int a = list.Claim(), b = list.Claim(), c = list.Claim();
    list.Own(a, unlinked, 11);
    list.Own(b, stale, 12);
    list.Own(c, linked, 13);
    pm::StorePersist(p.word(1), uint64_t(0));
    list.Unlinked(a);
    pm::StorePersist(p.word(2), uint64_t(0));  // unlinked, the tag not cleared yet
    // word 3 keeps linking `linked`: the unlink did not happen.
  }
  p.Reopen();
  PmRetireList list(p.pool->base(), &p.pool->allocator(), p.word(0), 8);
  std::vector<uint64_t> undone, extras;
  const size_t freed = list.Recover([&](const RetireSlot& s) { return s.tag == 13 && *p.word(3) == s.block; },
                                    [&](const RetireSlot& s) { undone.push_back(s.block); },
                                    [&](const RetireSlot& s) { extras.push_back(s.block); });
  EXPECT_EQ(freed, 2u);
  EXPECT_EQ(undone, std::vector<uint64_t>{linked});
  EXPECT_EQ(extras.size(), 2u);
  const auto live = p.Allocated();
  EXPECT_FALSE(live.count(unlinked));
  EXPECT_FALSE(live.count(stale));
  EXPECT_TRUE(live.count(linked));
  int used = 0;
  list.ForEachUsed([&](const RetireSlot&) { used++; });
  EXPECT_EQ(used, 0);
  for (uint32_t i = 0; i < list.size(); i++) EXPECT_EQ(list.slots()[i].tag, 0u);
}

// Threads retire blocks concurrently, each reclaiming outside its guards;
// once all are done, a final Reclaim(all) leaves exactly the root object
// and the slot array allocated.
TEST(PmRetireList, ConcurrentRetirementsLeakNothing) {
  pmindex::test::TestWatchdog wd("PmRetireList.ConcurrentRetirementsLeakNothing", 300);
  TestPool p("concurrent");
  EpochManager epoch;
  PmRetireList list(p.pool->base(), &p.pool->allocator(), p.word(0), 16);
  constexpr int kThreads = 4, kOps = 500;
  std::atomic<uint64_t> freed{0}, skipped{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; t++) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < kOps; i++) {
        int slot;
        {
          EpochManager::Guard g(epoch);
          slot = list.Claim();
          if (slot < 0) {
            skipped.fetch_add(1);
          } else {
            uint64_t* link = p.word(1 + t);
            if (!p.pool->allocator().Allocate(link, 64).ok()) {
              list.Release(slot);
              continue;
            }
            list.Own(slot, *link, 1);
            pm::StorePersist(link, uint64_t(0));
            list.Unlinked(slot);
            list.Retire(slot);
          }
        }
        freed.fetch_add(list.Reclaim(epoch, false, [](const RetireSlot&) {}));
      }
    });
  }
  for (auto& t : ts) t.join();
  freed.fetch_add(list.Reclaim(epoch, true, [](const RetireSlot&) {}));
  EXPECT_EQ(freed.load() + skipped.load(), uint64_t(kThreads) * kOps);
  EXPECT_EQ(p.Allocated(), (std::set<uint64_t>{*p.pool->root_slot(), *p.word(0)}));
}

}  // namespace
}  // namespace pmindex::internal::kit
