// wbtree_concurrency_test (label: concurrency, run under TSan in CI):
// wBTree's lock-free readers beside writers that split nodes at every level
// (4-entry leaves, 3-entry inner nodes), for u64 and byte keys and values:
// finds of stable keys never miss and return the right value, scans come out
// strictly ascending with every stable key in their range, and after the
// writers stop Check, Size and a full scan agree with the model. A second
// test puts every writer on the same few keys (skewed writes) beside readers:
// no deadlock (the watchdog fails a hang), every read a written value.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/index_util.h"
#include "kit/test_watchdog.h"
#include "pmindex/index.h"

namespace pmindex {
namespace {

struct Kinds {
  KeyKind kk;
  ValueKind vk;
  const char* index = "wbtree";
};

std::string K(const Kinds& c, uint64_t k) {
  if (c.kk == KeyKind::kU64) return std::string(U64Slice(k));
  char b[32];
  std::snprintf(b, sizeof b, "k%010llu", static_cast<unsigned long long>(k));
  return b;
}
std::string V(const Kinds& c, uint64_t v) {
  if (c.vk == ValueKind::kU64) return std::string(U64Slice(v));
  return "v" + std::to_string(v) + std::string(v % 23, 'z');
}
uint64_t VId(const Kinds& c, const std::string& v) {
  if (c.vk == ValueKind::kU64) return SliceToU64(v);
  return std::stoull(v.substr(1));
}

class WBTreeConcurrency : public testing::TestWithParam<Kinds> {
 protected:
  void SetUp() override {
    Options o;
    o.pool_path = "/dev/shm/wbtree_conc_" + std::to_string(::getpid()) + ".pool";
    std::filesystem::remove(o.pool_path);
    path_ = o.pool_path;
    o.pool_size = 64ull << 20;
    o.key_kind = GetParam().kk;
    o.value_kind = GetParam().vk;
    o.params = {{"leaf_size", "4"}, {"inner_size", "3"}};
    ASSERT_TRUE(OpenIndex(GetParam().index, o, &idx_).ok());
  }
  void TearDown() override {
    idx_.reset();
    std::filesystem::remove(path_);
  }
  std::string path_;
  std::unique_ptr<Index> idx_;
};

TEST_P(WBTreeConcurrency, ReadersBesideSplittingWriters) {
  test::TestWatchdog dog("wbtree readers beside writers", 240);
  const Kinds c = GetParam();
  const int kWriters = 2, kReaders = 2;
  const uint64_t kStable = 400, kPerWriter = 1500;
  // Stable keys are the even ids below 2 * kStable; writers churn odd ids.
  for (uint64_t i = 0; i < kStable; i++) ASSERT_TRUE(idx_->Insert(K(c, 2 * i), V(c, 2 * i)).ok());
  std::atomic<bool> stop{false};
  std::atomic<int> errors{0};
  std::vector<std::thread> ts;
  for (int w = 0; w < kWriters; w++) {
    ts.emplace_back([&, w] {
      for (int round = 0; round < 2; round++) {
        for (uint64_t i = 0; i < kPerWriter; i++) {
          const uint64_t id = 2 * (i * kWriters + w) + 1;
          if (!idx_->Insert(K(c, id), V(c, id)).ok()) errors++;
        }
        for (uint64_t i = 0; i < kPerWriter; i++) {
          const uint64_t id = 2 * (i * kWriters + w) + 1;
          if (!idx_->Update(K(c, id), V(c, id + 1000000)).ok()) errors++;
          if (round == 0 && !idx_->Remove(K(c, id)).ok()) errors++;
        }
      }
    });
  }
  for (int r = 0; r < kReaders; r++) {
    ts.emplace_back([&, r] {
      std::mt19937_64 rng(r);
      std::string v;
      while (!stop.load()) {
        const uint64_t id = 2 * (rng() % kStable);
        Status s = idx_->Find(K(c, id), &v);
        if (!s.ok() || VId(c, v) != id) errors++;
        // A scan from a stable key: ascending, and every stable key of its
        // range present.
        std::string prev;
        uint64_t next_stable = id;
        bool first = true;
        s = idx_->Scan(K(c, id), 30, [&](Slice k, Slice) {
          if (!first && internal::CompareKeys(c.kk, prev, k) >= 0) errors++;
          const uint64_t kid = c.kk == KeyKind::kU64 ? SliceToU64(k) : std::stoull(std::string(k.substr(1)));
          if (kid % 2 == 0 && next_stable < 2 * kStable) {
            if (kid != next_stable) errors++;
            next_stable += 2;
          }
          prev = std::string(k);
          first = false;
          return true;
        });
        if (!s.ok()) errors++;
      }
    });
  }
  for (int w = 0; w < kWriters; w++) ts[w].join();
  stop = true;
  for (size_t i = kWriters; i < ts.size(); i++) ts[i].join();
  EXPECT_EQ(errors.load(), 0);
  ASSERT_TRUE(idx_->Check().ok()) << idx_->Check().ToString();
  EXPECT_EQ(idx_->Size(), kStable + kWriters * kPerWriter);
  std::string v;
  for (uint64_t i = 0; i < kWriters * kPerWriter; i++) {
    ASSERT_TRUE(idx_->Find(K(c, 2 * i + 1), &v).ok());
    EXPECT_EQ(VId(c, v), 2 * i + 1 + 1000000);
  }
}

TEST_P(WBTreeConcurrency, SkewedWritersAndReaders) {
  test::TestWatchdog dog("wbtree skewed writers", 240);
  const Kinds c = GetParam();
  const uint64_t kHot = 5;
  for (uint64_t i = 0; i < 200; i++) ASSERT_TRUE(idx_->Insert(K(c, i), V(c, i)).ok());
  std::atomic<int> errors{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> ts;
  for (int w = 0; w < 3; w++) {
    ts.emplace_back([&, w] {
      std::mt19937_64 rng(100 + w);
      for (int i = 0; i < 3000; i++) {
        const uint64_t id = 100 + rng() % kHot;
        const uint64_t val = id + 1000 * (rng() % 50);
        switch (rng() % 3) {
          case 0:
            if (!idx_->Upsert(K(c, id), V(c, val)).ok()) errors++;
            break;
          case 1: {
            Status s = idx_->Remove(K(c, id));
            if (!s.ok() && !s.IsNotFound()) errors++;
            break;
          }
          default: {
            Status s = idx_->Insert(K(c, id), V(c, val));
            if (!s.ok() && !s.IsAlreadyExists()) errors++;
          }
        }
      }
    });
  }
  ts.emplace_back([&] {
    std::mt19937_64 rng(7);
    std::string v;
    while (!stop.load()) {
      const uint64_t id = 100 + rng() % kHot;
      Status s = idx_->Find(K(c, id), &v);
      if (s.ok() ? VId(c, v) % 1000 != id % 1000 : !s.IsNotFound()) errors++;
      if (!idx_->Find(K(c, 50), &v).ok()) errors++;
    }
  });
  for (int w = 0; w < 3; w++) ts[w].join();
  stop = true;
  ts.back().join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_TRUE(idx_->Check().ok()) << idx_->Check().ToString();
}

INSTANTIATE_TEST_SUITE_P(Kinds, WBTreeConcurrency,
                         testing::Values(Kinds{KeyKind::kU64, ValueKind::kU64}, Kinds{KeyKind::kBytes, ValueKind::kBytes},
                                         Kinds{KeyKind::kU64, ValueKind::kU64, "wbtree_slot"},
                                         Kinds{KeyKind::kBytes, ValueKind::kBytes, "wbtree_slot"}),
                         [](const testing::TestParamInfo<Kinds>& i) {
                           return std::string(i.param.index) + (i.param.kk == KeyKind::kU64 ? "_u64" : "_bytes");
                         });

}  // namespace
}  // namespace pmindex
