// wbtree_test: wBTree single-threaded behaviour: differential runs against
// std::map for u64 and byte keys and values at small and default node
// sizes, with Check, a full scan and the owned-block leak check after each
// phase, and reopens (clean close, and a copy of the pool taken while open:
// what a SIGKILL leaves).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <string>

#include "kit/test_watchdog.h"
#include "pmindex/index.h"
#include "pmindex/pm/allocator.h"
#include "pmindex/pm/pool.h"
#include "testing/index_test_util.h"

namespace pmindex {
namespace {

struct Cfg {
  KeyKind kk;
  ValueKind vk;
  int leaf, inner;
  const char* index = "wbtree";
};

std::string Key(const Cfg& c, uint64_t k) { return testutil::ShortKey(c.kk, k); }
std::string Val(const Cfg& c, uint64_t v) { return testutil::ShortVal(c.vk, v); }

class WBTreeTest : public testing::TestWithParam<Cfg>, protected testutil::IndexHolder {
 protected:
  void SetUp() override { path_ = testutil::IndexPoolPath("wbtree-test"); }
  Options Opts() {
    Options o;
    o.pool_path = path_;
    o.pool_size = 32ull << 20;
    o.key_kind = GetParam().kk;
    o.value_kind = GetParam().vk;
    o.params = {{"leaf_size", std::to_string(GetParam().leaf)}, {"inner_size", std::to_string(GetParam().inner)}};
    return o;
  }
  void Open() { ASSERT_TRUE(OpenIndex(GetParam().index, Opts(), &idx_).ok()); }
  void Verify() { testutil::ExpectMatchesModel(idx_.get(), GetParam().kk, model_); }
  void RandomOps(std::mt19937_64& rng, int n, uint64_t keys) {
    const Cfg& c = GetParam();
    for (int i = 0; i < n; i++) {
      const uint64_t k = rng() % keys, v = rng();
      const std::string key = Key(c, k), val = Val(c, v);
      const int r = int(rng() % 6);
      const testutil::Op o = r < 2    ? testutil::Op::kInsert
                             : r == 2 ? testutil::Op::kUpdate
                             : r == 3 ? testutil::Op::kUpsert
                             : r == 4 ? testutil::Op::kRemove
                                      : testutil::Op::kFind;
      ASSERT_NO_FATAL_FAILURE(testutil::ApplyAndCheck(idx_.get(), &model_, o, key, val));
    }
  }
  testutil::OrderedModel model_{testutil::KeyOrder{GetParam().kk}};
};

TEST_P(WBTreeTest, RandomOpsAgainstStdMapWithReopens) {
  std::mt19937_64 rng(42);
  Open();
  for (int phase = 0; phase < 6; phase++) {
    RandomOps(rng, 4000, phase % 2 ? 300 : 3000);
    Verify();
    ASSERT_TRUE(idx_->Close().ok());
    idx_.reset();
    Open();
    Verify();
  }
}

TEST_P(WBTreeTest, ReopenOfAPoolCopiedWhileOpen) {
  std::mt19937_64 rng(7);
  Open();
  RandomOps(rng, 3000, 2000);
  testutil::ReplaceWithCopyTakenWhileOpen(path_, &idx_);  // the pool file as a SIGKILL leaves it
  Open();
  Verify();
  RandomOps(rng, 2000, 2000);
  Verify();
}

TEST_P(WBTreeTest, DescendingAndAscendingInserts) {
  Open();
  const Cfg& c = GetParam();
  for (uint64_t i = 0; i < 1500; i++) {
    ASSERT_TRUE(idx_->Insert(Key(c, 3000 - i), Val(c, i)).ok());
    model_[Key(c, 3000 - i)] = Val(c, i);
    ASSERT_TRUE(idx_->Insert(Key(c, 4000 + i), Val(c, i)).ok());
    model_[Key(c, 4000 + i)] = Val(c, i);
  }
  Verify();
  for (uint64_t i = 0; i < 1500; i++) {
    ASSERT_TRUE(idx_->Remove(Key(c, 3000 - i)).ok());
    model_.erase(Key(c, 3000 - i));
  }
  Verify();
}

// A scan callback may call every operation: here it removes each record it
// is handed (emptied leaves are freed after a grace period) and re-inserts
// keys the scan has passed. The watchdog turns a deadlock into a failure.
TEST_P(WBTreeTest, ScanCallbackWrites) {
  test::TestWatchdog wd("wbtree ScanCallbackWrites", 120);
  Open();
  const Cfg& c = GetParam();
  for (uint64_t i = 0; i < 1500; i++) {
    ASSERT_TRUE(idx_->Insert(Key(c, i), Val(c, i)).ok());
    model_[Key(c, i)] = Val(c, i);
  }
  std::vector<std::string> order, seen;
  for (auto& [k, v] : model_) order.push_back(k);
  Status inner;
  const std::string lo = c.kk == KeyKind::kU64 ? std::string(8, '\0') : std::string("\x01");
  Status s = idx_->Scan(lo, SIZE_MAX, [&](Slice k, Slice v) {
    const std::string key(k);
    seen.push_back(key);
    if (inner.ok() && std::string(v) != model_[key]) inner = Status::Corrupt("value of " + key);
    if (inner.ok()) inner = idx_->Remove(k);
    model_.erase(key);
    if (seen.size() % 3 == 0 && inner.ok() && !model_.count(seen[seen.size() / 2])) {
      const std::string nk = seen[seen.size() / 2];  // passed: inserted again, never seen
      inner = idx_->Insert(nk, Val(c, seen.size()));
      model_[nk] = Val(c, seen.size());
    }
    return inner.ok();
  });
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE(inner.ok()) << inner.ToString();
  EXPECT_EQ(seen, order);
  Verify();
}

INSTANTIATE_TEST_SUITE_P(Kinds, WBTreeTest,
                         testing::Values(Cfg{KeyKind::kU64, ValueKind::kU64, 4, 3}, Cfg{KeyKind::kU64, ValueKind::kU64, 63, 32},
                                         Cfg{KeyKind::kBytes, ValueKind::kBytes, 4, 3},
                                         Cfg{KeyKind::kBytes, ValueKind::kBytes, 63, 32},
                                         Cfg{KeyKind::kU64, ValueKind::kBytes, 5, 4},
                                         Cfg{KeyKind::kU64, ValueKind::kU64, 7, 7, "wbtree_slot"},
                                         Cfg{KeyKind::kU64, ValueKind::kU64, 2, 3, "wbtree_slot"},
                                         Cfg{KeyKind::kBytes, ValueKind::kBytes, 7, 7, "wbtree_slot"},
                                         Cfg{KeyKind::kBytes, ValueKind::kU64, 3, 3, "wbtree_slot"}),
                         [](const testing::TestParamInfo<Cfg>& i) {
                           return std::string(i.param.index) + "_" + (i.param.kk == KeyKind::kU64 ? "u64" : "bytes") +
                                  (i.param.vk == ValueKind::kU64 ? "_u64" : "_bytes") + "_" + std::to_string(i.param.leaf) +
                                  "_" + std::to_string(i.param.inner);
                         });

}  // namespace
}  // namespace pmindex

namespace pmindex {
namespace {

// Space comes back after deletes: empty leaves other than the first leaf
// and a parent's only child are freed (ascending deletes free each
// parent's leftmost child first), so a tree emptied by deletes holds well
// under half its peak PM bytes (what stays: the inner nodes and one leaf
// under each: about 36% here, ascending inserts leaving nodes half full),
// and it takes inserts again. Without the frees it would hold all of it.
TEST(WBTreeSpace, EmptyLeavesAreFreed) {
  Options o;
  o.pool_path = "/dev/shm/wbtree_space_" + std::to_string(::getpid()) + ".pool";
  std::filesystem::remove(o.pool_path);
  o.params = {{"leaf_size", "8"}, {"inner_size", "8"}};
  std::unique_ptr<Index> idx;
  ASSERT_TRUE(OpenIndex("wbtree", o, &idx).ok());
  const uint64_t before = idx->Stats().pm_bytes;
  for (uint64_t i = 0; i < 20000; i++) ASSERT_TRUE(idx->Insert(U64Slice(i), U64Slice(i)).ok());
  const uint64_t peak = idx->Stats().pm_bytes;
  for (uint64_t i = 0; i < 20000; i++) ASSERT_TRUE(idx->Remove(U64Slice(i)).ok());
  const uint64_t after = idx->Stats().pm_bytes;
  ASSERT_TRUE(idx->Check().ok()) << idx->Check().ToString();
  EXPECT_EQ(idx->Size(), 0u);
  std::printf("pm bytes: empty %llu, 20000 records %llu, all deleted %llu\n", (unsigned long long)before,
              (unsigned long long)peak, (unsigned long long)after);
  EXPECT_LT(after - before, (peak - before) / 2);
  for (uint64_t i = 0; i < 2000; i++) ASSERT_TRUE(idx->Insert(U64Slice(i * 7), U64Slice(i)).ok());
  ASSERT_TRUE(idx->Check().ok());
  EXPECT_EQ(idx->Size(), 2000u);
  idx.reset();
  std::filesystem::remove(o.pool_path);
}

}  // namespace
}  // namespace pmindex
