// Concurrency stress of bztree (run under TSan in CI, label concurrency), on
// 256-byte nodes so that consolidations, splits, merges and root changes
// race with lock-free reads: threads on shared keys whose per-key balance of
// acknowledged inserts and removes must match the final state (a duplicate
// insert would make it 2), racing inserts of one key (exactly one wins: the
// uniqueness re-check), an insert stalled between its reserve and its
// publish (the other insert waits or kills the slot; never both win),
// disjoint writers with scanners checking order and values. A watchdog turns
// a hang into a failure.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "bztree/bztree_tree.h"
#include "kit/test_watchdog.h"
#include "pmindex/index.h"
#include "pmindex/pm/pool.h"
#include "testing/stress_util.h"

namespace pmindex {
namespace {

using internal::bztree::BzTree;

class BzTreeConcurrency : public testutil::StressTest {
 protected:
  void SetUp() override { Open("bztree", {{"node_size", "256"}}, 32); }
  void TearDown() override {
    internal::bztree::hooks.after_reserve = nullptr;
    StressTest::TearDown();
  }
  void CheckQuiescent() {
    Status c = idx_->Check();
    ASSERT_TRUE(c.ok()) << c.ToString();
    BzTree::Shape sh;
    ASSERT_TRUE(static_cast<BzTree*>(idx_.get())->GetShape(&sh).ok());
    EXPECT_EQ(sh.frozen, 0u);
  }
};

INSTANTIATE_TEST_SUITE_P(All, BzTreeConcurrency, testutil::BothStressKinds(), testutil::StressKindName);

TEST_P(BzTreeConcurrency, SharedKeysBalance) {
  test::TestWatchdog wd("bztree shared keys", 120);
  const int threads = 4, ops = 3000;
  const uint64_t keys = 96;
  std::vector<std::vector<int>> balance(threads, std::vector<int>(keys, 0));
  std::atomic<int> errors{0};
  // An unexpected status, named (a remove or update that met a record being
  // removed once returned InvalidArgument from the PMwCAS's recycle check).
  auto bad = [&](const char* op, const Status& s) {
    if (errors++ < 5) ADD_FAILURE() << op << ": " << s.ToString();
  };
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; t++)
    ts.emplace_back([&, t] {
      std::mt19937_64 rng(uint64_t(t) + 11);
      std::string v;
      for (int op = 0; op < ops; op++) {
        const uint64_t i = rng() % keys;
        const int r = int(rng() % 10);
        Status s;
        if (r < 4) {
          s = idx_->Insert(Key(i), Val(i, uint64_t(op)));
          if (s.ok()) balance[size_t(t)][i]++;
          else if (!s.IsAlreadyExists()) bad("insert", s);
        } else if (r < 7) {
          s = idx_->Remove(Key(i));
          if (s.ok()) balance[size_t(t)][i]--;
          else if (!s.IsNotFound()) bad("remove", s);
        } else if (r < 8) {
          s = idx_->Update(Key(i), Val(i, uint64_t(op)));
          if (!s.ok() && !s.IsNotFound()) bad("update", s);
        } else {
          s = idx_->Find(Key(i), &v);
          if (s.ok() && !ValOf(i, v)) bad("find (wrong value)", s);
          else if (!s.ok() && !s.IsNotFound()) bad("find", s);
        }
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(errors.load(), 0);
  uint64_t present = 0;
  for (uint64_t i = 0; i < keys; i++) {
    int b = 0;
    for (int t = 0; t < threads; t++) b += balance[size_t(t)][i];
    std::string v;
    const bool found = idx_->Find(Key(i), &v).ok();
    ASSERT_EQ(b, found ? 1 : 0) << "key " << i;
    present += found;
  }
  EXPECT_EQ(idx_->Size(), present);
  CheckQuiescent();
}

TEST_P(BzTreeConcurrency, RacingInsertsOfOneKeyHaveOneWinner) {
  test::TestWatchdog wd("bztree racing inserts", 120);
  const int threads = 4, rounds = 300;
  for (int round = 0; round < rounds; round++) {
    std::atomic<int> wins{0}, go{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; t++)
      ts.emplace_back([&, t] {
        go++;
        while (go.load() < threads) std::this_thread::yield();
        const Status s = idx_->Insert(Key(uint64_t(round)), Val(uint64_t(round), uint64_t(t)));
        if (s.ok()) wins++;
        else EXPECT_TRUE(s.IsAlreadyExists()) << s.ToString();
      });
    for (auto& t : ts) t.join();
    ASSERT_EQ(wins.load(), 1) << "round " << round;
  }
  EXPECT_EQ(idx_->Size(), uint64_t(rounds));
  CheckQuiescent();
}

// An insert stalls after its reserve (a test hook); a second insert of the
// same key must not also succeed, whether it waits for the slot or kills it.
std::atomic<int> g_stall{0};
void Stall(const void*) {
  if (g_stall.exchange(0) == 1) std::this_thread::sleep_for(std::chrono::milliseconds(30));
}

TEST_P(BzTreeConcurrency, StalledInFlightInsertKeepsKeysUnique) {
  test::TestWatchdog wd("bztree stalled insert", 120);
  internal::bztree::hooks.after_reserve = &Stall;
  for (uint64_t round = 0; round < 20; round++) {
    g_stall = 1;
    std::atomic<int> wins{0};
    std::thread a([&] { wins += idx_->Insert(Key(round), Val(round, 1)).ok(); });
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::thread b([&] { wins += idx_->Insert(Key(round), Val(round, 2)).ok(); });
    a.join();
    b.join();
    ASSERT_EQ(wins.load(), 1) << "round " << round;
  }
  internal::bztree::hooks.after_reserve = nullptr;
  EXPECT_EQ(idx_->Size(), 20u);
  CheckQuiescent();
}

TEST_P(BzTreeConcurrency, DisjointWritersWithScanners) {
  test::TestWatchdog wd("bztree writers and scanners", 120);
  const int writers = 2;
  const uint64_t per = 1500;
  std::atomic<bool> stop{false};
  std::atomic<int> errors{0};
  std::vector<std::thread> ts;
  for (int w = 0; w < writers; w++)
    ts.emplace_back([&, w] {
      std::mt19937_64 rng(uint64_t(w) * 7 + 1);
      for (uint64_t j = 0; j < per; j++) {
        const uint64_t i = uint64_t(w) + j * writers;
        if (!idx_->Insert(Key(i), Val(i, 0)).ok()) errors++;
        if (j % 3 == 2) {
          const uint64_t d = uint64_t(w) + (rng() % j) * writers;
          const Status s = idx_->Remove(Key(d));
          if (!s.ok() && !s.IsNotFound()) errors++;
        }
      }
    });
  ts.emplace_back([&] {
    while (!stop.load()) {
      std::string prev;
      bool first = true;
      const Status s = idx_->Scan(Key(0), 200, [&](Slice k, Slice v) {
        const std::string ks(k);
        if (!first && !(GetParam().bytes ? prev < ks : SliceToU64(prev) < SliceToU64(ks))) errors++;
        const uint64_t i = KeyNum(k);
        if (!ValOf(i, std::string(v))) errors++;
        prev = ks;
        first = false;
        return true;
      });
      if (!s.ok()) errors++;
    }
  });
  for (int w = 0; w < writers; w++) ts[size_t(w)].join();
  stop = true;
  ts.back().join();
  EXPECT_EQ(errors.load(), 0);
  CheckQuiescent();
}

}  // namespace
}  // namespace pmindex
