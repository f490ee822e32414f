// version_lock_test.cc: unit tests of kit/version_lock.h: the word's states
// and transitions, and a seqlock stress test (writers change two fields
// under the lock, optimistic readers must never validate a torn pair; run
// under TSan in CI).
#include "kit/version_lock.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "kit/backoff.h"

namespace pmindex::internal::kit {
namespace {

TEST(VersionLock, ZeroIsUnlockedAndReadable) {
  VersionLock w{0};
  uint64_t v = 1;
  EXPECT_TRUE(w.ReadBegin(&v));
  EXPECT_EQ(v, 0u);
  EXPECT_TRUE(w.Validate(v));
}

TEST(VersionLock, TryLockUnlockAdvancesTheVersion) {
  VersionLock w{0};
  uint64_t v = 0;
  ASSERT_TRUE(w.ReadBegin(&v));
  ASSERT_TRUE(w.TryLock(v));
  EXPECT_FALSE(w.Validate(v));  // a reader that began before the lock fails
  uint64_t r = 0;
  EXPECT_FALSE(w.ReadBegin(&r));  // locked
  EXPECT_FALSE(w.TryLock(r));
  EXPECT_FALSE(w.TryLock(v));  // the word no longer holds v
  w.UnlockFrom(v);
  ASSERT_TRUE(w.ReadBegin(&r));
  EXPECT_EQ(r, v + VersionLock::kStep);
  EXPECT_FALSE(w.Validate(v));
}

TEST(VersionLock, UnlockFlavoursAgree) {
  VersionLock a{0}, b{0}, c{0};
  ASSERT_TRUE(a.TryLock(0));
  ASSERT_TRUE(b.Upgrade(0));
  ASSERT_TRUE(c.TryLock(0));
  a.Unlock();
  b.UnlockStore();
  c.UnlockFrom(0);
  EXPECT_EQ(a.Load(), VersionLock::kStep);
  EXPECT_EQ(b.Load(), VersionLock::kStep);
  EXPECT_EQ(c.Load(), VersionLock::kStep);
}

TEST(VersionLock, ObsoleteWordsRefuseReadersAndLockers) {
  VersionLock a{0}, b{0};
  ASSERT_TRUE(a.Upgrade(0));
  a.UnlockObsolete();
  ASSERT_TRUE(b.TryLock(0));
  b.UnlockStore(/*obsolete=*/true);
  for (VersionLock* w : {&a, &b}) {
    uint64_t v = 0;
    EXPECT_FALSE(w->ReadBegin(&v));
    EXPECT_TRUE(v & VersionLock::kObsolete);
    EXPECT_FALSE(v & VersionLock::kLocked);
    EXPECT_EQ(v & ~VersionLock::kBusy, VersionLock::kStep);
    EXPECT_FALSE(w->TryLock(v));
  }
}

TEST(VersionLock, UpgradeFailsAfterAWrite) {
  VersionLock w{0};
  uint64_t v = 0;
  ASSERT_TRUE(w.ReadBegin(&v));
  ASSERT_TRUE(w.TryLock(v));
  w.UnlockStore();
  EXPECT_FALSE(w.Upgrade(v));
}

TEST(VersionLock, NewBornIsLockedAboveEveryEarlierVersion) {
  VersionLock w{0};
  for (int i = 0; i < 3; i++) {
    ASSERT_TRUE(w.TryLock(w.Load()));
    w.UnlockStore();
  }
  const uint64_t before = w.Load();
  w.NewBorn();
  const uint64_t born = w.Load();
  EXPECT_TRUE(born & VersionLock::kLocked);
  EXPECT_GT(born & ~VersionLock::kBusy, before);
  w.ClearLockBits();
  EXPECT_EQ(w.Load(), born & ~VersionLock::kBusy);
  uint64_t v = 0;
  EXPECT_TRUE(w.ReadBegin(&v));
}

// Writers keep a == b under the lock; a reader's validated snapshot must
// show a == b.
TEST(VersionLock, ValidatedReadsAreNeverTorn) {
  VersionLock w{0};
  std::atomic<uint64_t> a{0}, b{0};
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> validated{0}, torn{0};
  const int kWriters = 2, kReaders = 2, kWrites = 20000;
  std::vector<std::thread> ts;
  for (int t = 0; t < kWriters; t++)
    ts.emplace_back([&] {
      for (int i = 0; i < kWrites; i++) {
        Backoff bo;
        while (!w.TryLock(w.Load())) bo.Wait();
        a.store(a.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
        b.store(b.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
        if (i & 1) w.UnlockStore();
        else w.UnlockFrom(w.LoadRelaxed() & ~VersionLock::kLocked);
      }
    });
  for (int t = 0; t < kReaders; t++)
    ts.emplace_back([&] {
      while (!stop.load()) {
        uint64_t v = 0;
        if (!w.ReadBegin(&v)) {
          CpuRelax();
          continue;
        }
        uint64_t x = a.load(std::memory_order_relaxed), y = b.load(std::memory_order_relaxed);
        if (!w.Validate(v)) continue;
        validated++;
        if (x != y) torn++;
      }
    });
  for (int t = 0; t < kWriters; t++) ts[t].join();
  stop = true;
  for (size_t t = kWriters; t < ts.size(); t++) ts[t].join();
  EXPECT_EQ(torn.load(), 0u);
  EXPECT_EQ(a.load(), uint64_t(kWriters) * kWrites);
  EXPECT_EQ(w.Load(), uint64_t(kWriters) * kWrites * VersionLock::kStep);
}

}  // namespace
}  // namespace pmindex::internal::kit
