// Concurrency stress of nvtree (run under TSan in CI, label concurrency):
// writers on disjoint key ranges with small leaves and PLNs (so that leaf
// replacements, copy-on-write PLNs and whole inner rebuilds race with
// lock-free lookups and scans), readers checking that every key they see
// has a value its writer wrote and that scans are sorted, and skewed writes
// on a few hot keys. A watchdog turns a hang (a deadlock between leaf
// locks, the structure mutex and the epoch grace period) into a failure.
#include <unistd.h>

#include <atomic>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "kit/test_watchdog.h"
#include "pmindex/index.h"
#include "pmindex/pm/pool.h"
#include "testing/stress_util.h"

namespace pmindex {
namespace {

class NVTreeConcurrency : public testutil::StressTest {
 protected:
  void SetUp() override { Open("nvtree", {{"leaf_size", "8"}, {"inner_size", "4"}}); }
};

TEST_P(NVTreeConcurrency, WritersReadersScanners) {
  test::TestWatchdog dog("nvtree writers/readers/scanners", 300);
  constexpr int kWriters = 3, kPer = 1500, kRounds = 3;
  std::atomic<bool> stop{false};
  std::atomic<int> errors{0};
  std::vector<std::map<uint64_t, std::string>> models(kWriters);
  std::vector<std::thread> ts;
  for (int w = 0; w < kWriters; w++) {
    ts.emplace_back([&, w] {
      std::mt19937_64 rng(w + 1);
      auto& m = models[size_t(w)];
      for (int round = 0; round < kRounds; round++) {
        for (int op = 0; op < kPer * 3; op++) {
          const uint64_t i = uint64_t(w) + kWriters * (rng() % kPer);  // interleaved ranges: writers share leaves
          const std::string k = Key(i), v = Val(i, uint64_t(op));
          const int r = int(rng() % 10);
          const bool present = m.count(i) > 0;
          Status s;
          if (r < 4) s = idx_->Insert(k, v);
          else if (r < 6) s = idx_->Update(k, v);
          else if (r < 7) s = idx_->Upsert(k, v);
          else s = idx_->Remove(k);
          const bool ok = s.ok();
          if (r < 4) {
            if (ok == present) errors++;
            if (ok) m[i] = v;
          } else if (r < 6) {
            if (ok != present) errors++;
            if (ok) m[i] = v;
          } else if (r < 7) {
            if (!ok) errors++;
            m[i] = v;
          } else {
            if (ok != present) errors++;
            m.erase(i);
          }
        }
      }
    });
  }
  for (int rd = 0; rd < 2; rd++) {
    ts.emplace_back([&, rd] {
      std::mt19937_64 rng(100 + rd);
      std::string v;
      while (!stop.load()) {
        const uint64_t i = rng() % (kWriters * kPer);
        if (idx_->Find(Key(i), &v).ok() && !ValOf(i, v)) errors++;
        if (rng() % 16 == 0) {
          uint64_t last = 0;
          bool first = true;
          Status s = idx_->Scan(Key(i), 40, [&](Slice k, Slice val) {
            const uint64_t n = KeyNum(k);
            if ((!first && n <= last) || n < i || !ValOf(n, std::string(val))) errors++;
            first = false;
            last = n;
            return true;
          });
          if (!s.ok()) errors++;
        }
      }
    });
  }
  for (int w = 0; w < kWriters; w++) ts[size_t(w)].join();
  stop = true;
  for (size_t t = kWriters; t < ts.size(); t++) ts[t].join();
  EXPECT_EQ(errors.load(), 0);
  Status c = idx_->Check();
  ASSERT_TRUE(c.ok()) << c.ToString();
  uint64_t total = 0;
  for (auto& m : models) {
    total += m.size();
    for (auto& [i, v] : m) {
      std::string got;
      ASSERT_TRUE(idx_->Find(Key(i), &got).ok());
      EXPECT_EQ(got, v);
    }
  }
  EXPECT_EQ(idx_->Size(), total);
}

TEST_P(NVTreeConcurrency, SkewedWritesOnHotKeys) {
  test::TestWatchdog dog("nvtree skewed writes", 300);
  for (uint64_t i = 0; i < 8; i++) ASSERT_TRUE(idx_->Insert(Key(i), Val(i, 0)).ok());
  std::atomic<int> errors{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; t++) {
    ts.emplace_back([&, t] {
      std::mt19937_64 rng(t + 7);
      std::string v;
      for (int op = 0; op < 3000; op++) {
        const uint64_t i = rng() % 8;
        if (t % 2) {
          if (!idx_->Update(Key(i), Val(i, uint64_t(op))).ok()) errors++;
        } else if (!idx_->Find(Key(i), &v).ok() || !ValOf(i, v)) {
          errors++;
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_TRUE(idx_->Check().ok());
  EXPECT_EQ(idx_->Size(), 8u);
}

INSTANTIATE_TEST_SUITE_P(All, NVTreeConcurrency, testutil::BothStressKinds(), testutil::StressKindName);

}  // namespace
}  // namespace pmindex
