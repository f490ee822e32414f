// Tests of nvtree over every key/value kind, default and small nodes:
// differential against std::map with Check, the model compared by a full
// scan and leak checks (ForEachOwnedBlock == the allocator's blocks) after
// each phase, reopens, delete-heavy phases (compaction, unlinked leaves),
// bad input, and the flush counts per operation (PiBench table 2).
#include <unistd.h>

#include <atomic>
#include <map>
#include <random>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "kit/test_watchdog.h"
#include "pmindex/index.h"
#include "pmindex/pm/allocator.h"
#include "pmindex/pm/persist.h"
#include "pmindex/pm/pool.h"
#include "testing/index_test_util.h"

namespace pmindex {
namespace {

std::string PoolPath() { return testutil::IndexPoolPath("nvtree-test"); }

using Cfg = testutil::KindsCfg;

std::vector<Cfg> AllCfgs() { return testutil::AllKindsDefaultAndSmall({{"leaf_size", "6"}, {"inner_size", "3"}}); }

class NVTreeTest : public testing::TestWithParam<Cfg>, protected testutil::IndexHolder {
 protected:
  void SetUp() override {
    opts_.pool_size = 64ull << 20;
    opts_.key_kind = GetParam().kk;
    opts_.value_kind = GetParam().vk;
    opts_.params = GetParam().params;
    opts_.max_key_size = 200;
    opts_.max_value_size = 300;
    CreateIndex("nvtree", "nvtree-test");
  }
  void Reopen() { IndexHolder::Reopen(2); }
  std::string Key(uint64_t i) { return testutil::MixedKey(GetParam().kk, i); }
  std::string Val(uint64_t i, uint64_t ver) { return testutil::MixedVal(GetParam().vk, i, ver); }
  void ExpectNoLeak() { testutil::ExpectNoLeak(idx_.get()); }
  void ExpectModel(const std::map<std::string, std::string>& model) {
    testutil::ExpectMatchesModel(idx_.get(), GetParam().kk, model);
  }
};

INSTANTIATE_TEST_SUITE_P(All, NVTreeTest, testing::ValuesIn(AllCfgs()), [](const auto& i) { return i.param.label; });

TEST_P(NVTreeTest, DifferentialWithReopens) {
  ASSERT_NO_FATAL_FAILURE(testutil::RunDifferentialWithReopens(
      &idx_, GetParam().kk, 6, 6000, 3000, [&](uint64_t i) { return Key(i); },
      [&](uint64_t i, uint64_t ver) { return Val(i, ver); },
      [&](const std::map<std::string, std::string>& m) { ExpectModel(m); }, [&] { Reopen(); }));
  // The run ended by removing every record (leaves compacted and unlinked).
  std::map<std::string, std::string> model;
  Reopen();
  ExpectModel(model);
  for (uint64_t i = 0; i < 500; i++) ASSERT_TRUE(idx_->Insert(Key(i), Val(i, 0)).ok());
  for (uint64_t i = 0; i < 500; i++) model[Key(i)] = Val(i, 0);
  ExpectModel(model);
}

// A scan callback may call every operation of the index: here it removes
// each record it is handed and updates or inserts others, so leaves are
// compacted, unlinked and split (each waits for a grace period) while the
// scan stands between two leaves. The watchdog turns a deadlock into a
// failure.
TEST_P(NVTreeTest, ScanCallbackWrites) {
  test::TestWatchdog wd("nvtree ScanCallbackWrites", 120);
  std::map<std::string, std::string> model;
  const uint64_t keys = 1500;
  for (uint64_t i = 0; i < keys; i++) {
    ASSERT_TRUE(idx_->Insert(Key(i), Val(i, 0)).ok());
    model[Key(i)] = Val(i, 0);
  }
  std::vector<std::string> order;
  for (auto& [k, v] : model) order.push_back(k);
  if (GetParam().kk == KeyKind::kU64)
    std::sort(order.begin(), order.end(), [](auto& a, auto& b) { return SliceToU64(a) < SliceToU64(b); });
  std::vector<std::string> seen;
  Status inner;
  const std::string start = GetParam().kk == KeyKind::kU64 ? std::string(U64Slice(0)) : std::string("\x01", 1);
  Status s = idx_->Scan(start, SIZE_MAX, [&](Slice k, Slice v) {
    const std::string key(k);
    seen.push_back(key);
    if (inner.ok() && std::string(v) != model[key]) inner = Status::Corrupt("value of " + key);
    if (inner.ok()) inner = idx_->Remove(k);
    model.erase(key);
    if (seen.size() % 3 == 0 && inner.ok()) {  // a key the scan has passed: inserted again, never seen
      const std::string nk = seen[seen.size() / 2];
      if (!model.count(nk)) {
        inner = idx_->Insert(nk, Val(seen.size(), 1));
        model[nk] = Val(seen.size(), 1);
      }
    }
    return inner.ok();
  });
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE(inner.ok()) << inner.ToString();
  EXPECT_EQ(seen, order);
  ExpectModel(model);
}

TEST_P(NVTreeTest, BadInput) {
  std::string big(opts_.max_key_size + 1, 'k');
  if (GetParam().kk == KeyKind::kU64) {
    EXPECT_TRUE(idx_->Insert("abc", Val(1, 0)).IsInvalidArgument());
  } else {
    EXPECT_TRUE(idx_->Insert("", Val(1, 0)).IsInvalidArgument());
    EXPECT_TRUE(idx_->Insert(big, Val(1, 0)).IsInvalidArgument());
  }
  if (GetParam().vk == ValueKind::kU64) EXPECT_TRUE(idx_->Insert(Key(1), "abc").IsInvalidArgument());
  else EXPECT_TRUE(idx_->Insert(Key(1), std::string(opts_.max_value_size + 1, 'v')).IsInvalidArgument());
  EXPECT_TRUE(idx_->Check().ok());
}

// PiBench table 2: NV-Tree flushes twice per insert, update and delete (the
// entries, then the count). Counted in fences (one per flush step) and lines.
TEST(NVTreeCost, FencesPerOperation) {
  Options o;
  o.pool_path = PoolPath();
  std::unique_ptr<Index> idx;
  ASSERT_TRUE(OpenIndex("nvtree", o, &idx).ok());
  for (uint64_t i = 0; i < 1000; i++) ASSERT_TRUE(idx->Insert(U64Slice(i), U64Slice(i)).ok());
  auto cost = [&](auto&& op) {
    pm::Counters before = pm::ThreadCounters();
    op();
    return pm::ThreadCounters() - before;
  };
  // A fresh key into a leaf with room (a leaf split costs more: skip those).
  uint64_t k = 5000;
  pm::Counters c = cost([&] { ASSERT_TRUE(idx->Insert(U64Slice(k), U64Slice(k)).ok()); });
  EXPECT_EQ(c.fences, 2u);
  EXPECT_LE(c.lines_flushed, 3u);
  c = cost([&] { ASSERT_TRUE(idx->Update(U64Slice(k), U64Slice(1)).ok()); });
  EXPECT_EQ(c.fences, 2u);
  EXPECT_LE(c.lines_flushed, 3u);
  c = cost([&] { ASSERT_TRUE(idx->Remove(U64Slice(k)).ok()); });
  EXPECT_EQ(c.fences, 2u);
  EXPECT_LE(c.lines_flushed, 3u);
  std::string v;
  c = cost([&] { ASSERT_TRUE(idx->Find(U64Slice(7), &v).ok()); });
  EXPECT_EQ(c.stores, 0u);
  EXPECT_EQ(c.fences, 0u);
  idx.reset();
  pm::Pool::Remove(o.pool_path);
}

}  // namespace
}  // namespace pmindex

namespace pmindex {
namespace {

// The figures of docs/nvtree.md that are counted, not timed: lines flushed
// and fences per operation at steady state (replacements included, and
// apart), and the DRAM footprint against fptree's at the same record count.
// Printed; the assertions only bound them.
TEST(NVTreeFigures, FlushesPerOperationAndDram) {
  constexpr uint64_t kLoad = 200000, kOps = 20000;
  std::mt19937_64 rng(3);
  std::vector<uint64_t> keys(kLoad);
  for (auto& k : keys) k = rng();
  for (std::string name : {"nvtree", "fptree"}) {
    Options o;
    o.pool_path = PoolPath();
    o.pool_size = 256ull << 20;
    std::unique_ptr<Index> idx;
    ASSERT_TRUE(OpenIndex(name, o, &idx).ok());
    for (uint64_t k : keys) ASSERT_TRUE(idx->Insert(U64Slice(k), U64Slice(k)).ok());
    auto measure = [&](const char* what, auto&& op) {
      pm::Counters all, plain, smo;
      uint64_t nplain = 0, nsmo = 0;
      for (uint64_t i = 0; i < kOps; i++) {
        pm::Counters before = pm::ThreadCounters();
        op(i);
        pm::Counters d = pm::ThreadCounters() - before;
        all += d;
        // An operation that allocated or freed changed the structure.
        if (d.allocs || d.frees) {
          smo += d;
          nsmo++;
        } else {
          plain += d;
          nplain++;
        }
      }
      printf("%s %-7s all: lines/op %.3f fences/op %.3f | without SMO (%llu): lines %.3f fences %.3f | with SMO (%llu): lines %.1f fences %.1f\n",
             name.c_str(), what, double(all.lines_flushed) / kOps, double(all.fences) / kOps,
             static_cast<unsigned long long>(nplain), nplain ? double(plain.lines_flushed) / double(nplain) : 0.0,
             nplain ? double(plain.fences) / double(nplain) : 0.0, static_cast<unsigned long long>(nsmo),
             nsmo ? double(smo.lines_flushed) / double(nsmo) : 0.0, nsmo ? double(smo.fences) / double(nsmo) : 0.0);
    };
    std::vector<uint64_t> fresh(kOps);
    for (auto& k : fresh) k = rng();
    measure("insert", [&](uint64_t i) { ASSERT_TRUE(idx->Insert(U64Slice(fresh[i]), U64Slice(i)).ok()); });
    measure("update", [&](uint64_t i) { ASSERT_TRUE(idx->Update(U64Slice(keys[i]), U64Slice(i)).ok()); });
    measure("delete", [&](uint64_t i) { ASSERT_TRUE(idx->Remove(U64Slice(keys[kOps + i])).ok()); });
    const IndexStats st = idx->Stats();
    printf("%s records %llu dram_bytes %llu (%.1f bytes/record) pm_bytes %llu\n", name.c_str(),
           static_cast<unsigned long long>(st.records), static_cast<unsigned long long>(st.dram_bytes),
           double(st.dram_bytes) / double(st.records), static_cast<unsigned long long>(st.pm_bytes));
    EXPECT_GT(st.dram_bytes, 0u);
    idx.reset();
    pm::Pool::Remove(o.pool_path);
  }
}

}  // namespace
}  // namespace pmindex
