// Multi-threaded allocator tests (label: concurrency, also run under TSan):
// threads allocating and freeing concurrently, cross-thread frees, threads
// exiting while the pool stays open and the pool closing while threads that
// used it are still alive.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <random>
#include <set>
#include <functional>
#include <thread>
#include <vector>

#include "pmindex/pm/allocator.h"
#include "pmindex/pm/pool.h"
#include "pm/layout.h"
#include "testing/pm_test_util.h"

namespace pmindex::pm {
namespace {
using testing::CreateWithSlots;
using testing::Opts;
using testing::PoolFile;

// Each thread owns a disjoint range of slots; at the end, the allocator's
// enumeration must equal the union of what the threads own.
TEST(AllocatorMT, TwoThreadsAllocFree) {
  PoolFile f("mt");
  std::unique_ptr<Pool> p;
  constexpr int kPerThread = 1000, kThreads = 2;
  ASSERT_TRUE(CreateWithSlots(f.path, kPerThread * kThreads, &p));
  auto* slots = p->root<uint64_t>();
  std::atomic<int> failures{0};
  auto worker = [&](int t) {
    std::mt19937_64 rng(t + 1);
    Allocator& a = p->allocator();
    for (int i = 0; i < 20000; i++) {
      uint64_t* s = &slots[t * kPerThread + int(rng() % kPerThread)];
      if (*s) {
        if (!a.Free(s).ok()) failures++;
      } else if (!a.Allocate(s, 1 + rng() % (rng() % 100 == 0 ? 100000 : 1500)).ok()) {
        failures++;
      }
    }
  };
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; t++) ts.emplace_back(worker, t);
  for (auto& t : ts) t.join();
  EXPECT_EQ(failures.load(), 0);
  std::map<uint64_t, size_t> blocks;
  p->allocator().ForEachAllocated([&](uint64_t off, size_t sz) { blocks[off] = sz; });
  std::set<uint64_t> owned{*p->root_slot()};
  for (int i = 0; i < kPerThread * kThreads; i++) {
    if (slots[i]) {
      EXPECT_TRUE(owned.insert(slots[i]).second) << "block owned twice";
    }
  }
  std::set<uint64_t> listed;
  for (auto& [off, sz] : blocks) listed.insert(off);
  EXPECT_EQ(listed, owned);
  EXPECT_EQ(p->allocator().BlocksInUse(), owned.size());
  Status c = p->allocator().Check();
  EXPECT_TRUE(c.ok()) << c.ToString();
  p.reset();
  ASSERT_TRUE(Pool::Open(f.path, "t", PoolOptions{}, &p).ok());
  EXPECT_EQ(p->allocator().BlocksInUse(), owned.size());
  EXPECT_TRUE(p->allocator().Check().ok());
}

// One thread allocates, the other frees what it allocated (hand-off through
// an atomic queue of slot indexes): frees into runs owned by another thread.
TEST(AllocatorMT, CrossThreadFrees) {
  PoolFile f("mtx");
  std::unique_ptr<Pool> p;
  constexpr int kSlots = 4096;
  ASSERT_TRUE(CreateWithSlots(f.path, kSlots, &p));
  auto* slots = p->root<uint64_t>();
  std::vector<std::atomic<int>> ready(kSlots);  // 1: allocated, ready to free
  for (auto& r : ready) r.store(0);
  constexpr int kRounds = 5;
  std::thread producer([&] {
    Allocator& a = p->allocator();
    for (int r = 0; r < kRounds; r++)
      for (int i = 0; i < kSlots; i++) {
        while (ready[i].load(std::memory_order_acquire) != 0) std::this_thread::yield();
        EXPECT_TRUE(a.Allocate(&slots[i], 16 + (i % 7) * 100).ok());
        ready[i].store(1, std::memory_order_release);
      }
  });
  std::thread consumer([&] {
    Allocator& a = p->allocator();
    for (int r = 0; r < kRounds; r++)
      for (int i = 0; i < kSlots; i++) {
        while (ready[i].load(std::memory_order_acquire) != 1) std::this_thread::yield();
        EXPECT_TRUE(a.Free(&slots[i]).ok());
        ready[i].store(0, std::memory_order_release);
      }
  });
  producer.join();
  consumer.join();
  EXPECT_EQ(p->allocator().BlocksInUse(), 1u);
  EXPECT_TRUE(p->allocator().Check().ok());
  // Space was reused, not leaked: the pool did not grow past a few MiB.
  EXPECT_LE(p->size(), 8u << 20);
}

// Threads that exit release their lanes; a pool closed while a thread that
// used it is still alive does not confuse that thread's exit.
TEST(AllocatorMT, ThreadExitAndCloseOrder) {
  PoolFile f("mtexit");
  std::unique_ptr<Pool> p;
  ASSERT_TRUE(CreateWithSlots(f.path, 2048, &p));
  auto* slots = p->root<uint64_t>();
  // Many short-lived threads: more than the lanes would allow if leaked.
  for (int round = 0; round < 30; round++) {
    std::vector<std::thread> ts;
    for (int t = 0; t < 40; t++)
      ts.emplace_back([&, t] {
        uint64_t* s = &slots[t];
        if (*s) {
          EXPECT_TRUE(p->allocator().Free(s).ok());
        }
        EXPECT_TRUE(p->allocator().Allocate(s, 64).ok());
      });
    for (auto& t : ts) t.join();
  }
  EXPECT_EQ(p->allocator().BlocksInUse(), 41u);
  // A thread that outlives the pool.
  std::atomic<int> stage{0};
  std::thread late([&] {
    EXPECT_TRUE(p->allocator().Allocate(&slots[100], 64).ok());
    stage = 1;
    while (stage.load() != 2) std::this_thread::yield();
  });
  while (stage.load() != 1) std::this_thread::yield();
  p.reset();
  stage = 2;
  late.join();
  ASSERT_TRUE(Pool::Open(f.path, "t", PoolOptions{}, &p).ok());
  EXPECT_EQ(p->allocator().BlocksInUse(), 42u);
  EXPECT_TRUE(p->allocator().Check().ok());
}

// A thread_local constructed before the allocator's thread cache table is
// destroyed after it; its destructor may still allocate and free (an index
// operation at thread exit). The allocator must then neither touch the
// destroyed table (heap corruption: found by an FPTree test) nor leak the
// lane it takes: more threads than lanes each allocate and free from such a
// destructor.
TEST(AllocatorMT, AllocateAndFreeFromThreadExitDestructors) {
  PoolFile f("mtdtor");
  std::unique_ptr<Pool> p;
  constexpr int kThreads = int(layout::kLaneCount) + 76;
  ASSERT_TRUE(CreateWithSlots(f.path, 2 * kThreads, &p));
  auto* slots = p->root<uint64_t>();
  struct AtExit {
    std::function<void()> fn;
    ~AtExit() {
      if (fn) fn();
    }
  };
  std::atomic<int> failures{0};
  Allocator& a = p->allocator();
  for (int t = 0; t < kThreads; t++) {
    std::thread([&, t] {
      static thread_local AtExit at_exit;  // constructed before the allocator's cache table
      at_exit.fn = [&, t] {
        if (!a.Allocate(&slots[2 * t + 1], 100).ok()) failures++;
        if (!a.Free(&slots[2 * t]).ok()) failures++;
      };
      if (!a.Allocate(&slots[2 * t], 64).ok()) failures++;
    }).join();
  }
  EXPECT_EQ(failures.load(), 0);
  std::set<uint64_t> owned{*p->root_slot()};
  for (int t = 0; t < kThreads; t++) {
    EXPECT_EQ(slots[2 * t], 0u) << "thread " << t << ": the free at thread exit did not happen";
    EXPECT_NE(slots[2 * t + 1], 0u) << "thread " << t << ": the allocation at thread exit did not happen";
    owned.insert(slots[2 * t + 1]);
  }
  std::set<uint64_t> blocks;
  a.ForEachAllocated([&](uint64_t off, size_t) { blocks.insert(off); });
  EXPECT_EQ(blocks, owned);
  EXPECT_TRUE(a.Check().ok());
  // The same from a thread of this process still works (no lane left taken).
  EXPECT_TRUE(a.Allocate(&slots[0], 64).ok());
}

// At pool full nothing free stays stranded in another thread's caches. A
// helper thread takes a few 1 KiB blocks (its current run keeps the rest of
// that chunk's blocks) and stays alive; the main thread fills the pool, the
// helper frees every other block, the main thread fills the pool again,
// then everything is freed and the pool must hold as many whole-chunk
// blocks as it has chunks. Every count is exact: the pool (7 heap chunks at
// its max size, one of them the slot array's run) holds 6 x 255 blocks of
// 1 KiB.
TEST(AllocatorMT, PoolFullReclaimsOtherThreadsFreeBlocks) {
  PoolFile f("strand");
  std::unique_ptr<Pool> p;
  ASSERT_TRUE(Pool::Create(f.path, "t", Opts(1 << 20, 2 << 20), &p).ok());
  constexpr int kSlots = 4096, kHelper = 10, kCapacity = 6 * 255;
  Allocator& a = p->allocator();
  ASSERT_TRUE(a.AllocateZeroed(p->root_slot(), kSlots * 8).ok());
  uint64_t* slots = p->root<uint64_t>();
  std::atomic<int> phase{0}, helper_failures{0};
  int n1 = 0;
  auto wait_for = [&](int ph) {
    while (phase.load(std::memory_order_acquire) != ph) std::this_thread::yield();
  };
  std::thread helper([&] {
    for (int i = 0; i < kHelper; i++)
      if (!a.Allocate(&slots[kSlots - 1 - i], 1024).ok()) helper_failures++;
    phase.store(1, std::memory_order_release);
    wait_for(2);
    for (int i = 0; i < n1; i += 2)
      if (!a.Free(&slots[i]).ok()) helper_failures++;
    phase.store(3, std::memory_order_release);
    wait_for(4);
    for (int i = 0; i < kHelper; i++)
      if (!a.Free(&slots[kSlots - 1 - i]).ok()) helper_failures++;
    phase.store(5, std::memory_order_release);
    wait_for(6);  // stays alive, idle, with its lane and current runs
  });
  wait_for(1);
  Status s;
  for (; n1 < kSlots - kHelper; n1++)
    if (!(s = a.Allocate(&slots[n1], 1024)).ok()) break;
  EXPECT_TRUE(s.IsPoolFull()) << s.ToString();
  EXPECT_EQ(n1 + kHelper, kCapacity) << "PoolFull while the helper's current run had free blocks";
  phase.store(2, std::memory_order_release);
  wait_for(3);
  const int freed = (n1 + 1) / 2;
  int n2 = 0;
  for (int i = 0; i < n1; i += 2) {
    if (!(s = a.Allocate(&slots[i], 1024)).ok()) break;
    n2++;
  }
  EXPECT_EQ(n2, freed) << "PoolFull early after another thread's frees: " << s.ToString();
  EXPECT_TRUE(a.Check().ok());
  for (int i = 0; i < n1; i++) {
    if (slots[i]) {
      EXPECT_TRUE(a.Free(&slots[i]).ok());
    }
  }
  phase.store(4, std::memory_order_release);
  wait_for(5);
  // Everything but the slot array is free: every other chunk serves a
  // whole-chunk block, the helper's entirely free current run included.
  int large = 0;
  while (large < 16 && a.Allocate(&slots[large], Allocator::kChunkSize - 64).ok()) large++;
  EXPECT_EQ(large, 6) << "chunks stranded in another thread's current run";
  EXPECT_TRUE(a.Check().ok());
  phase.store(6, std::memory_order_release);
  helper.join();
  EXPECT_EQ(helper_failures.load(), 0);
  for (int i = 0; i < large; i++) EXPECT_TRUE(a.Free(&slots[i]).ok());
  EXPECT_TRUE(a.Check().ok());
}

}  // namespace
}  // namespace pmindex::pm
