// rw_spinlock_test.cc: kit::RwSpinLock (rw_spinlock.h): exclusion between
// writers and readers, and writer preference (a waiting writer blocks new
// readers), shown by counting acquisitions, never by timing.
#include "kit/rw_spinlock.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "kit/test_watchdog.h"

namespace pmindex::internal::kit {
namespace {

TEST(RwSpinLock, TryLockModes) {
  RwSpinLock l;
  EXPECT_TRUE(l.try_lock_shared());
  EXPECT_TRUE(l.try_lock_shared());
  EXPECT_EQ(l.readers(), 2u);
  EXPECT_FALSE(l.try_lock());
  l.unlock_shared();
  l.unlock_shared();
  EXPECT_TRUE(l.try_lock());
  EXPECT_TRUE(l.write_locked());
  EXPECT_FALSE(l.try_lock_shared());
  EXPECT_FALSE(l.try_lock());
  EXPECT_EQ(l.readers(), 0u);  // the failed reader backed out
  l.unlock();
  EXPECT_FALSE(l.write_locked());
  EXPECT_FALSE(l.writer_waiting());
}

// Writers and readers on one word: writers keep two plain counters equal,
// readers must never see them differ; the totals add up.
TEST(RwSpinLock, ExcludesWritersAndReaders) {
  pmindex::test::TestWatchdog wd("RwSpinLock.ExcludesWritersAndReaders", 300);
  RwSpinLock l;
  uint64_t a = 0, b = 0;
  std::atomic<uint64_t> torn{0};
  constexpr int kThreads = 4, kOps = 20000;
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; t++) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < kOps; i++) {
        if ((i + t) % 3 == 0) {
          l.lock();
          a++;
          b++;
          l.unlock();
        } else {
          l.lock_shared();
          if (a != b) torn.fetch_add(1);
          l.unlock_shared();
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(torn.load(), 0u);
  EXPECT_EQ(a, b);
  uint64_t writes = 0;
  for (int t = 0; t < kThreads; t++)
    for (int i = 0; i < kOps; i++) writes += (i + t) % 3 == 0;
  EXPECT_EQ(a, writes);
  EXPECT_EQ(l.readers(), 0u);
  EXPECT_FALSE(l.write_locked());
}

// Two readers hand the read lock to each other so that it is never free:
// each holds it until the other has acquired it (or failed to). A
// reader-preferring lock lets them relay forever and the writer never gets
// in; this one stops new readers as soon as the writer waits. Asserted by
// counts: no reader acquires the lock after it saw the writer waiting, and
// the writer gets in before the readers reach kBound acquisitions.
TEST(RwSpinLock, WaitingWriterBlocksNewReaders) {
  pmindex::test::TestWatchdog wd("RwSpinLock.WaitingWriterBlocksNewReaders", 300);
  constexpr uint64_t kBound = 1000000;
  RwSpinLock l;
  std::atomic<uint64_t> acquisitions{0}, failures{0}, after_wait{0};
  std::atomic<bool> stop{false}, writer_in{false}, release{false};
  auto reader = [&] {
    while (!stop.load()) {
      const bool saw_waiting = l.writer_waiting() || l.write_locked();
      if (!l.try_lock_shared()) {
        failures.fetch_add(1);
        std::this_thread::yield();
        continue;
      }
      if (saw_waiting) after_wait.fetch_add(1);
      const uint64_t a = acquisitions.fetch_add(1) + 1, f = failures.load();
      // Hold until the partner acquired too (the lock is never free), a try
      // failed, or the test ends.
      while (!stop.load() && acquisitions.load() == a && failures.load() == f && acquisitions.load() < kBound)
        std::this_thread::yield();
      l.unlock_shared();
    }
  };
  std::thread r1(reader), r2(reader);
  while (acquisitions.load() < 100) std::this_thread::yield();  // the relay runs
  std::thread w([&] {
    l.lock();
    writer_in.store(true);
    while (!release.load()) std::this_thread::yield();  // hold until the readers stopped
    l.unlock();
  });
  while (!writer_in.load() && acquisitions.load() < kBound) std::this_thread::yield();
  const bool got_in = writer_in.load();
  const uint64_t at = acquisitions.load();
  stop.store(true);
  r1.join();
  r2.join();
  release.store(true);
  w.join();
  EXPECT_TRUE(got_in) << "the writer waited through " << at << " reader acquisitions";
  EXPECT_EQ(after_wait.load(), 0u) << "readers got in while a writer waited";
}

// A writer that finds readers inside registers as waiting until they leave;
// a reader arriving meanwhile waits for the writer (blocking lock_shared).
TEST(RwSpinLock, BlockingReaderWaitsForWaitingWriter) {
  pmindex::test::TestWatchdog wd("RwSpinLock.BlockingReaderWaitsForWaitingWriter", 300);
  RwSpinLock l;
  l.lock_shared();
  std::atomic<int> order{0};
  int writer_pos = 0, reader_pos = 0;
  std::thread w([&] {
    l.lock();
    writer_pos = ++order;
    l.unlock();
  });
  while (!l.writer_waiting()) std::this_thread::yield();
  std::thread r([&] {
    l.lock_shared();
    reader_pos = ++order;
    l.unlock_shared();
  });
  l.unlock_shared();
  w.join();
  r.join();
  EXPECT_EQ(writer_pos, 1);
  EXPECT_EQ(reader_pos, 2);
}

}  // namespace
}  // namespace pmindex::internal::kit
