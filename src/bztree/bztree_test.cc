// Tests of bztree over every key/value kind, default and small nodes:
// differential against std::map with Check, a full scan and leak checks
// (ForEachOwnedBlock == the allocator's blocks) after each phase, reopens,
// delete-heavy phases (consolidation, merges, dropped leaves), the defects
// of the public implementation (docs/bztree.md "Defects avoided"), bad input
// and the persist cost per operation (PiBench table 2).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <random>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "bztree/bztree_tree.h"
#include "pmindex/index.h"
#include "pmindex/pm/allocator.h"
#include "pmindex/pm/persist.h"
#include "pmindex/pm/pool.h"
#include "testing/index_test_util.h"

namespace pmindex {
namespace {

std::string PoolPath() { return testutil::IndexPoolPath("bztree-test"); }

using internal::bztree::BzTree;

using Cfg = testutil::KindsCfg;

std::vector<Cfg> AllCfgs() { return testutil::AllKindsDefaultAndSmall({{"node_size", "256"}}); }

class BzTreeTest : public testing::TestWithParam<Cfg>, protected testutil::IndexHolder {
 protected:
  void SetUp() override {
    opts_.pool_size = 64ull << 20;
    opts_.key_kind = GetParam().kk;
    opts_.value_kind = GetParam().vk;
    opts_.params = GetParam().params;
    opts_.max_key_size = 40;
    opts_.max_value_size = 300;
    CreateIndex("bztree", "bztree-test");
  }
  void Reopen() { IndexHolder::Reopen(); }
  BzTree* tree() { return static_cast<BzTree*>(idx_.get()); }
  std::string Key(uint64_t i) { return testutil::MixedKey(GetParam().kk, i, 4); }
  std::string Val(uint64_t i, uint64_t ver) {
    if (GetParam().vk == ValueKind::kU64) {
      uint64_t v = i * 31 + ver;
      if ((i + ver) % 5 == 0) v |= uint64_t(7) << 61;  // PMwCAS's reserved bits set: top bits in the metadata
      return std::string(U64Slice(v));
    }
    return testutil::MixedVal(GetParam().vk, i, ver);
  }
  void ExpectNoLeak() { testutil::ExpectNoLeak(idx_.get()); }
  void ExpectModel(const std::map<std::string, std::string>& model) {
    testutil::ExpectMatchesModel(idx_.get(), GetParam().kk, model);
    BzTree::Shape sh;
    ASSERT_TRUE(tree()->GetShape(&sh).ok());
    EXPECT_EQ(sh.frozen, 0u) << "a frozen node is reachable after quiescence";
  }
};

INSTANTIATE_TEST_SUITE_P(All, BzTreeTest, testing::ValuesIn(AllCfgs()), [](const auto& i) { return i.param.label; });

TEST_P(BzTreeTest, DifferentialWithReopens) {
  ASSERT_NO_FATAL_FAILURE(testutil::RunDifferentialWithReopens(
      &idx_, GetParam().kk, 6, 5000, 3000, [&](uint64_t i) { return Key(i); },
      [&](uint64_t i, uint64_t ver) { return Val(i, ver); },
      [&](const std::map<std::string, std::string>& m) { ExpectModel(m); }, [&] { Reopen(); }));
  // The run ended by removing every record.
  std::map<std::string, std::string> model;
  BzTree::Shape sh;
  ASSERT_TRUE(tree()->GetShape(&sh).ok());
  // Empty leaves are dropped, except an inner node's last child (inner
  // nodes are not merged: docs/bztree.md "Deviations").
  EXPECT_LE(sh.leaves, sh.inner + 1);
  Reopen();
  ExpectModel(model);
  for (uint64_t i = 0; i < 500; i++) ASSERT_TRUE(idx_->Insert(Key(i), Val(i, 0)).ok());
  for (uint64_t i = 0; i < 500; i++) model[Key(i)] = Val(i, 0);
  ExpectModel(model);
}

// Public defect: an insert/delete loop on one key failed an assertion
// within ten inserts (deleted space never reclaimed, then a split of a leaf
// without live records).
TEST_P(BzTreeTest, InsertDeleteLoopOnOneKey) {
  const int rounds = GetParam().kk == KeyKind::kU64 && GetParam().vk == ValueKind::kU64 ? 100000 : 5000;
  const std::string k = Key(7);
  for (int i = 0; i < rounds; i++) {
    ASSERT_TRUE(idx_->Insert(k, Val(7, uint64_t(i))).ok()) << i;
    ASSERT_TRUE(idx_->Remove(k).ok()) << i;
  }
  ExpectModel({});
  const uint64_t bytes = idx_->Stats().pm_bytes;
  EXPECT_LT(bytes, 64u << 10) << "deleted space is reclaimed";
}

// Public defect: a split of a leaf whose records are all deleted aborted.
TEST_P(BzTreeTest, AllDeletedLeafIsConsolidatedNotSplit) {
  std::map<std::string, std::string> model;
  for (uint64_t i = 0; i < 40; i++) ASSERT_TRUE(idx_->Insert(Key(i), Val(i, 0)).ok());
  for (uint64_t i = 0; i < 40; i++) ASSERT_TRUE(idx_->Remove(Key(i)).ok());
  // The leaf is full of deleted records: the next inserts need its space.
  for (uint64_t i = 100; i < 140; i++) {
    ASSERT_TRUE(idx_->Insert(Key(i), Val(i, 0)).ok());
    model[Key(i)] = Val(i, 0);
  }
  ExpectModel(model);
}

// Public defect: unbounded retries against a frozen node (a structure change
// that stopped after its freeze). Operations must help replace it.
TEST_P(BzTreeTest, FrozenLeafIsHelpedNotSpunOn) {
  std::map<std::string, std::string> model;
  for (uint64_t i = 0; i < 300; i++) {
    ASSERT_TRUE(idx_->Insert(Key(i), Val(i, 0)).ok());
    model[Key(i)] = Val(i, 0);
  }
  for (uint64_t i : {3ull, 150ull, 299ull}) {
    ASSERT_TRUE(tree()->FreezeLeafForTest(Key(i)).ok());
    BzTree::Shape sh;
    ASSERT_TRUE(tree()->GetShape(&sh).ok());
    EXPECT_EQ(sh.frozen, 1u);
    std::string v;
    ASSERT_TRUE(idx_->Find(Key(i), &v).ok());  // reads go through a frozen leaf
    ASSERT_TRUE(idx_->Update(Key(i), Val(i, 1)).ok());
    model[Key(i)] = Val(i, 1);
  }
  ASSERT_TRUE(tree()->FreezeLeafForTest(Key(5)).ok());
  Reopen();  // a freeze left by a crash: recovery does not touch it
  ASSERT_TRUE(idx_->Remove(Key(5)).ok());
  model.erase(Key(5));
  ExpectModel(model);
}

// Public defect (PiBench wrapper): u64 keys byte-swapped for some operations
// and not others. Our keys are native u64 throughout: scans follow numeric
// order and every operation finds what another stored.
TEST_P(BzTreeTest, U64KeysInNumericOrderForEveryOperation) {
  if (GetParam().kk != KeyKind::kU64) GTEST_SKIP() << "u64 keys";
  const uint64_t ks[] = {1, 256, 65536, 2, 0x0100000000000000ull, 0xff, 0x8000000000000000ull};
  for (uint64_t k : ks) ASSERT_TRUE(idx_->Insert(U64Slice(k), Val(k, 0)).ok());
  std::vector<uint64_t> got;
  ASSERT_TRUE(idx_->Scan(U64Slice(0), 100, [&](Slice k, Slice) {
                got.push_back(SliceToU64(k));
                return true;
              }).ok());
  std::vector<uint64_t> want(std::begin(ks), std::end(ks));
  std::sort(want.begin(), want.end());
  EXPECT_EQ(got, want);
  for (uint64_t k : ks) {
    ASSERT_TRUE(idx_->Update(U64Slice(k), Val(k, 1)).ok());
    std::string v;
    ASSERT_TRUE(idx_->Find(U64Slice(k), &v).ok());
    EXPECT_EQ(v, Val(k, 1));
    ASSERT_TRUE(idx_->Remove(U64Slice(k)).ok());
  }
}

// Public defect (wrapper): the address of the value buffer stored instead of
// its bytes. Values are copied: the caller's buffer is overwritten and freed.
TEST_P(BzTreeTest, ValueBytesNotBufferAddressAreStored) {
  std::map<std::string, std::string> model;
  for (uint64_t i = 0; i < 200; i++) {
    std::string* buf = new std::string(Val(i, 3));
    ASSERT_TRUE(idx_->Insert(Key(i), *buf).ok());
    model[Key(i)] = *buf;
    std::fill(buf->begin(), buf->end(), '#');
    delete buf;
  }
  Reopen();
  ExpectModel(model);
}

TEST_P(BzTreeTest, BadInput) {
  if (GetParam().kk == KeyKind::kU64) {
    EXPECT_TRUE(idx_->Insert("abc", Val(1, 0)).IsInvalidArgument());
    EXPECT_TRUE(idx_->Find("abcdefghi", nullptr).IsInvalidArgument());
  } else {
    EXPECT_TRUE(idx_->Insert("", Val(1, 0)).IsInvalidArgument());
    EXPECT_TRUE(idx_->Insert(std::string(opts_.max_key_size + 1, 'k'), Val(1, 0)).IsInvalidArgument());
    EXPECT_TRUE(idx_->Insert(std::string(opts_.max_key_size, 'k'), Val(1, 0)).ok());
  }
  if (GetParam().vk == ValueKind::kU64) {
    EXPECT_TRUE(idx_->Insert(Key(1), "short").IsInvalidArgument());
    EXPECT_TRUE(idx_->Update(Key(1), "toolongvalue").IsInvalidArgument());
  } else {
    EXPECT_TRUE(idx_->Insert(Key(1), std::string(opts_.max_value_size + 1, 'v')).IsInvalidArgument());
  }
  EXPECT_TRUE(idx_->Remove(Key(99)).IsNotFound());
  EXPECT_TRUE(idx_->Update(Key(99), Val(1, 0)).IsNotFound());
  ASSERT_TRUE(idx_->Close().ok());
  EXPECT_TRUE(idx_->Insert(Key(1), Val(1, 0)).IsInvalidArgument());
  EXPECT_EQ(idx_->Size(), 0u);
}

// The pool grows under the tree: node and block offsets beyond the size at
// open are valid (a cached pool size made them "out of range").
// u64 values are inline whatever their top 3 bits (those live in the
// metadata word): the pool holds nodes only, and updates that change the
// top bits, in both directions, read back exactly.
TEST(BzTreeValues, U64ValuesWithReservedBitsAreInline) {
  const std::string path = PoolPath();
  Options o;
  o.pool_path = path;
  o.params = {{"node_size", "256"}};
  std::unique_ptr<Index> idx;
  ASSERT_TRUE(OpenIndex("bztree", o, &idx).ok());
  auto val = [](uint64_t i, uint64_t ver) { return (i * 0x9E3779B97F4A7C15ull) ^ (ver << 61) ^ ver; };
  const uint64_t n = 400;
  for (uint64_t i = 0; i < n; i++) ASSERT_TRUE(idx->Insert(U64Slice(i), U64Slice(val(i, 0))).ok());
  for (uint64_t ver = 1; ver < 9; ver++)
    for (uint64_t i = 0; i < n; i += 3) ASSERT_TRUE(idx->Update(U64Slice(i), U64Slice(val(i, ver))).ok());
  std::string v;
  for (uint64_t i = 0; i < n; i++) {
    ASSERT_TRUE(idx->Find(U64Slice(i), &v).ok());
    EXPECT_EQ(SliceToU64(v), val(i, i % 3 == 0 ? 8 : 0)) << i;
  }
  size_t scanned = 0;
  ASSERT_TRUE(idx->Scan(U64Slice(0), SIZE_MAX, [&](Slice k, Slice sv) {
                const uint64_t i = SliceToU64(k);
                EXPECT_EQ(SliceToU64(sv), val(i, i % 3 == 0 ? 8 : 0)) << i;
                scanned++;
                return true;
              }).ok());
  EXPECT_EQ(scanned, n);
  ASSERT_TRUE(idx->Check().ok());
  BzTree::Shape sh;
  ASSERT_TRUE(static_cast<BzTree*>(idx.get())->GetShape(&sh).ok());
  size_t blocks = 0;
  idx->pool()->allocator().ForEachAllocated([&](uint64_t, size_t) { blocks++; });
  EXPECT_EQ(blocks, sh.leaves + sh.inner + 1) << "nodes and the header only: no out-of-line value block";
  idx.reset();
  pm::Pool::Remove(path);
}

// An inner node X with room for one more entry but not two, and two of its
// leaves frozen, both needing a split (two threads each froze one): X's
// rebuild overflows and freezes X's parent, whose rebuild must split X. A
// copy of X (it has room for one entry) keeps both leaves frozen under it,
// and every operation on them went round freeze X, freeze the parent, copy
// X, until it gave up Busy after kMaxRetries rounds (pmbench with 2 threads:
// tens of node allocations per operation, failed operations).
TEST(BzTreeSmo, InnerNodeOverTwoSplittingLeavesIsSplit) {
  const std::string path = PoolPath();
  Options o;
  o.pool_path = path;
  o.params = {{"node_size", "256"}};
  std::unique_ptr<Index> idx;
  ASSERT_TRUE(OpenIndex("bztree", o, &idx).ok());
  auto* t = static_cast<BzTree*>(idx.get());
  std::vector<uint64_t> keys(3000);
  for (uint64_t i = 0; i < keys.size(); i++) keys[i] = 1000 * (i + 1);
  std::shuffle(keys.begin(), keys.end(), std::mt19937_64(7));
  for (uint64_t k : keys) ASSERT_TRUE(idx->Insert(U64Slice(k), U64Slice(k)).ok());
  std::sort(keys.begin(), keys.end());
  // 256-byte nodes hold 240 bytes of entries, 24 a u64 entry and 16 the
  // +infinity one: 9 entries (208 bytes) leave room for one more, not two.
  using Path = std::vector<std::pair<uint64_t, uint64_t>>;
  std::vector<uint64_t> leaves, firsts;  // X's leaves and the smallest key of each
  uint64_t x = 0;
  for (uint64_t k : keys) {
    Path p;
    ASSERT_TRUE(t->PathForTest(U64Slice(k), &p).ok());
    if (p.size() < 3 || p[p.size() - 2].second != 9 || (x && p[p.size() - 2].first != x)) {
      if (x) break;
      continue;
    }
    if (leaves.empty() || leaves.back() != p.back().first) {
      leaves.push_back(p.back().first);
      firsts.push_back(k);
    }
    x = p[p.size() - 2].first;
  }
  ASSERT_GE(firsts.size(), 2u) << "no inner node below the root with 9 entries";
  // Two of X's leaves filled to 9 records (216 bytes: more than 3/4 of 240, a
  // split), then frozen.
  for (size_t l = 0; l < 2; l++) {
    for (uint64_t j = 1;; j++) {
      Path p;
      ASSERT_TRUE(t->PathForTest(U64Slice(firsts[l]), &p).ok());
      ASSERT_EQ(p[p.size() - 2].first, x);
      ASSERT_EQ(p[p.size() - 2].second, 9u);
      if (p.back().second >= 9) break;
      ASSERT_TRUE(idx->Insert(U64Slice(firsts[l] + j), U64Slice(firsts[l] + j)).ok());
      keys.push_back(firsts[l] + j);
    }
  }
  ASSERT_TRUE(t->FreezeLeafForTest(U64Slice(firsts[0])).ok());
  ASSERT_TRUE(t->FreezeLeafForTest(U64Slice(firsts[1])).ok());
  Status st = idx->Update(U64Slice(firsts[0]), U64Slice(1));
  ASSERT_TRUE(st.ok()) << st.ToString();
  st = idx->Update(U64Slice(firsts[1]), U64Slice(2));
  ASSERT_TRUE(st.ok()) << st.ToString();
  BzTree::Shape sh;
  ASSERT_TRUE(t->GetShape(&sh).ok());
  EXPECT_EQ(sh.frozen, 0u);
  ASSERT_TRUE(idx->Check().ok());
  std::string v;
  for (uint64_t k : keys) {
    ASSERT_TRUE(idx->Find(U64Slice(k), &v).ok()) << k;
    EXPECT_EQ(SliceToU64(v), k == firsts[0] ? 1 : k == firsts[1] ? 2 : k) << k;
  }
  idx.reset();
  pm::Pool::Remove(path);
}

// A pool written by another index format is refused with a clear error.
TEST(BzTreeFormat, OtherFormatIsRefused) {
  const std::string path = PoolPath();
  Options o;
  o.pool_path = path;
  std::unique_ptr<Index> idx;
  ASSERT_TRUE(OpenIndex("bztree", o, &idx).ok());
  ASSERT_TRUE(idx->Insert(U64Slice(1), U64Slice(2)).ok());
  auto* h = idx->pool()->root<internal::bztree::Header>();
  pm::StorePersist(&h->format, uint32_t(1));  // the format before inline u64 values
  ASSERT_TRUE(idx->Close().ok());
  idx.reset();
  const Status s = OpenIndex("bztree", o, &idx);
  EXPECT_TRUE(s.IsUnsupported()) << s.ToString();
  EXPECT_NE(s.ToString().find("format 1"), std::string::npos) << s.ToString();
  idx.reset();
  pm::Pool::Remove(path);
}

TEST(BzTreeGrowth, OffsetsBeyondTheInitialPoolSize) {
  const std::string path = PoolPath();
  Options o;
  o.pool_path = path;
  o.pool_size = 4ull << 20;
  o.max_pool_size = 64ull << 20;
  o.value_kind = ValueKind::kBytes;
  std::unique_ptr<Index> idx;
  ASSERT_TRUE(OpenIndex("bztree", o, &idx).ok());
  const std::string v(400, 'v');
  for (uint64_t i = 0; i < 20000; i++) ASSERT_TRUE(idx->Insert(U64Slice(i), v).ok()) << i;
  EXPECT_GT(idx->pool()->size(), 4ull << 20);
  std::string got;
  for (uint64_t i = 0; i < 20000; i += 97) ASSERT_TRUE(idx->Find(U64Slice(i), &got).ok()) << i;
  ASSERT_TRUE(idx->Check().ok());
  idx.reset();
  pm::Pool::Remove(path);
}

// A full pool: the failing insert leaves nothing, deletes and updates still
// work (a frozen node that cannot be copied is unfrozen), and the room they
// free takes records again.
TEST(BzTreePoolFull, DeletesStillWorkAndFreeRoom) {
  const std::string path = PoolPath();
  Options o;
  o.pool_path = path;
  o.pool_size = 4ull << 20;
  o.max_pool_size = 4ull << 20;
  std::unique_ptr<Index> idx;
  ASSERT_TRUE(OpenIndex("bztree", o, &idx).ok());
  Status s;
  uint64_t n = 0;
  for (; n < 10000000; n++)
    if (!(s = idx->Insert(U64Slice(n * 0x9E3779B97F4A7C15ull), U64Slice(n))).ok()) break;
  ASSERT_TRUE(s.IsPoolFull()) << s.ToString();
  EXPECT_TRUE(idx->Find(U64Slice(n * 0x9E3779B97F4A7C15ull), nullptr).IsNotFound());
  ASSERT_TRUE(idx->Check().ok());
  for (uint64_t j = 0; j < n; j += 2) ASSERT_TRUE((s = idx->Remove(U64Slice(j * 0x9E3779B97F4A7C15ull))).ok()) << j << " " << s.ToString();
  for (uint64_t j = 1; j < n; j += 2) ASSERT_TRUE((s = idx->Update(U64Slice(j * 0x9E3779B97F4A7C15ull), U64Slice(j + 1))).ok()) << s.ToString();
  for (uint64_t j = 0; j < n; j += 4) ASSERT_TRUE((s = idx->Insert(U64Slice(j * 0x9E3779B97F4A7C15ull), U64Slice(j))).ok()) << j << " " << s.ToString();
  ASSERT_TRUE(idx->Check().ok());
  idx.reset();
  pm::Pool::Remove(path);
}

TEST(BzTreeOptions, BadParams) {
  const std::string path = PoolPath();
  Options o;
  o.pool_path = path;
  std::unique_ptr<Index> idx;
  o.params = {{"node_size", "100"}};
  EXPECT_TRUE(OpenIndex("bztree", o, &idx).IsInvalidArgument());
  o.params = {{"node_size", "1000"}};
  EXPECT_TRUE(OpenIndex("bztree", o, &idx).IsInvalidArgument()) << "not a multiple of 64";
  o.params = {{"leaf_size", "8"}};
  EXPECT_TRUE(OpenIndex("bztree", o, &idx).IsInvalidArgument());
  // An explicit node size caps byte keys at four records per node.
  o.params = {{"node_size", "256"}};
  o.key_kind = KeyKind::kBytes;
  o.max_key_size = 100;
  ASSERT_TRUE(OpenIndex("bztree", o, &idx).ok());
  EXPECT_TRUE(idx->Insert(std::string(44, 'k'), U64Slice(1)).ok());
  EXPECT_TRUE(idx->Insert(std::string(45, 'k'), U64Slice(1)).IsInvalidArgument());
  idx.reset();
  pm::Pool::Remove(path);
}

// PM footprint after a random load and after a mixed workload, against
// fptree's and the raw data (16 bytes per u64 record). Replaced nodes are
// freed, so it stays a small multiple of the raw size (the public BzTree,
// which never frees them, measured about 10x: PiBench figure 18).
TEST(BzTreeFootprint, AgainstFptreeAndRawData) {
  IndexInfo info;
  if (!FindIndexInfo("fptree", &info)) GTEST_SKIP() << "fptree not built";
  const uint64_t n = 50000;
  std::mt19937_64 rng(5);
  std::vector<uint64_t> keys(n);
  for (auto& k : keys) k = rng() >> 1;
  double ratio_mixed = 0;
  for (const char* name : {"fptree", "bztree"}) {
    const std::string path = PoolPath();
    Options o;
    o.pool_path = path;
    std::unique_ptr<Index> idx;
    ASSERT_TRUE(OpenIndex(name, o, &idx).ok());
    for (uint64_t k : keys) ASSERT_TRUE(idx->Upsert(U64Slice(k), U64Slice(k)).ok());
    const uint64_t load_bytes = idx->Stats().pm_bytes, load_records = idx->Size();
    const double load = double(load_bytes) / double(16 * load_records);
    for (uint64_t i = 0; i < n; i++) {
      const uint64_t k = keys[rng() % n];
      switch (rng() % 3) {
        case 0: (void)idx->Update(U64Slice(k), U64Slice(i)); break;
        case 1: (void)idx->Remove(U64Slice(k)); break;
        default: (void)idx->Upsert(U64Slice(k), U64Slice(i)); break;
      }
    }
    const double mixed = double(idx->Stats().pm_bytes) / double(16 * idx->Size());
    std::printf("%s: load %lu records, PM %.2f MiB (%.2fx raw); after %lu mixed ops %lu records, PM %.2f MiB (%.2fx raw)\n",
                name, static_cast<unsigned long>(load_records), double(load_bytes) / 1048576.0, load,
                static_cast<unsigned long>(n), static_cast<unsigned long>(idx->Size()),
                double(idx->Stats().pm_bytes) / 1048576.0, mixed);
    if (std::string(name) == "bztree") ratio_mixed = mixed;
    idx.reset();
    pm::Pool::Remove(path);
  }
  EXPECT_LT(ratio_mixed, 5.0) << "replaced nodes and deleted space are reclaimed";
}

// Lines flushed and fences per operation at steady state (PiBench table 2:
// BzTree 15 / 10 / 7 lines per insert / update / delete).
TEST(BzTreeCost, FlushesAndFencesPerOperation) {
  const std::string path = PoolPath();
  Options o;
  o.pool_path = path;
  std::unique_ptr<Index> idx;
  ASSERT_TRUE(OpenIndex("bztree", o, &idx).ok());
  const uint64_t n = 20000;
  for (uint64_t i = 0; i < n; i++) ASSERT_TRUE(idx->Insert(U64Slice(i * 2), U64Slice(i)).ok());
  auto measure = [&](const char* what, auto fn) {
    pm::ResetThreadCounters();
    const uint64_t m = 2000;
    for (uint64_t i = 0; i < m; i++) fn(i);
    const pm::Counters c = pm::ThreadCounters();
    const double lines = double(c.lines_flushed) / double(m), fences = double(c.fences) / double(m);
    std::printf("bztree %s: %.2f lines flushed, %.2f fences per operation\n", what, lines, fences);
    return std::make_pair(lines, fences);
  };
  auto ins = measure("insert", [&](uint64_t i) { ASSERT_TRUE(idx->Insert(U64Slice(i * 20 + 1), U64Slice(i)).ok()); });
  auto upd = measure("update", [&](uint64_t i) { ASSERT_TRUE(idx->Update(U64Slice(i * 2), U64Slice(i + 1)).ok()); });
  auto del = measure("delete", [&](uint64_t i) { ASSERT_TRUE(idx->Remove(U64Slice(i * 2)).ok()); });
  // Two 2-word PMwCAS and the record (insert), one 3-word (update), one 2-word (delete).
  EXPECT_LT(ins.first, 20.0);
  EXPECT_LT(upd.first, 11.0);
  EXPECT_LT(del.first, 14.0);  // 8 and the merges of the leaves the deletes empty
  EXPECT_GE(upd.second, 4.0);
  idx.reset();
  pm::Pool::Remove(path);
}

}  // namespace
}  // namespace pmindex
