// clfbtree_test: the clfB-tree single-threaded: the differential encoding of
// one node (clfbtree_node.h) on its own, then differential runs against
// std::map for every leaf kind x parent method x key kind, with Check, a
// full scan and the owned-block leak check after each phase, reopens after
// a clean close and of a pool copied while open (what a SIGKILL leaves),
// bad input (oversize keys, a pool that fills in the middle of splits) and
// the parameter rules (atomic needs MOVDIR64B or explicit emulation).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <string>

#include "clfbtree/clfbtree_format.h"
#include "clfbtree/clfbtree_node.h"
#include "clfbtree/clfbtree_tree.h"
#include "pmindex/index.h"
#include "pmindex/pm/allocator.h"
#include "pmindex/pm/persist.h"
#include "pmindex/pm/pool.h"
#include "testing/index_test_util.h"

namespace pmindex {
namespace {

using internal::clfbtree::Decode;
using internal::clfbtree::Decoded;
using internal::clfbtree::Encode;

TEST(ClfBTreeNode, PaperExampleAndCapacity) {
  // Figure 1: keys 3, 30, 100 and four children close together.
  uint64_t k[3] = {3, 30, 100}, p[4] = {4096, 4160, 4032, 4100};
  uint8_t img[64];
  ASSERT_TRUE(Encode(k, 3, p, 4, false, true, false, img));
  EXPECT_EQ(img[1], 0x11);  // one byte per key and per pointer difference
  Decoded d;
  ASSERT_TRUE(Decode(img, false, &d));
  EXPECT_EQ(d.n, 3u);
  EXPECT_TRUE(d.kids_leaves);
  for (int i = 0; i < 3; i++) EXPECT_EQ(d.k[i], k[i]);
  for (int i = 0; i < 4; i++) EXPECT_EQ(d.p[i], p[i]);
  // 23 keys and 24 pointers at one byte each; 24 keys do not fit.
  uint64_t kk[32], pp[33];
  for (int i = 0; i < 33; i++) pp[i] = 1000 + 2 * i;
  for (int i = 0; i < 32; i++) kk[i] = 10 + i;
  EXPECT_TRUE(Encode(kk, 23, pp, 24, false, false, false, img));
  EXPECT_FALSE(Encode(kk, 24, pp, 25, false, false, false, img));
  // Eight-byte differences: 3 keys and 4 pointers at most.
  uint64_t wk[4] = {0, 1ull << 60, 2ull << 60, 3ull << 60}, wp[5] = {64, ~0ull - 63, 1ull << 62, 5, 1ull << 63};
  EXPECT_TRUE(Encode(wk, 3, wp, 4, false, false, false, img));
  ASSERT_TRUE(Decode(img, false, &d));
  for (int i = 0; i < 4; i++) EXPECT_EQ(d.p[i], wp[i]);
  EXPECT_FALSE(Encode(wk, 4, wp, 5, false, false, false, img));
}

TEST(ClfBTreeNode, RandomRoundTrips) {
  std::mt19937_64 rng(1);
  for (int t = 0; t < 20000; t++) {
    const uint32_t n = uint32_t(rng() % 24);
    const bool leaf = rng() % 2, ksigned = rng() % 2;
    uint64_t k[32], p[33];
    const int shift = int(rng() % 64);
    uint64_t base = rng();
    for (uint32_t i = 0; i < n; i++) k[i] = ksigned ? rng() >> shift : (base += 1 + (rng() >> shift));
    for (uint32_t i = 0; i < n + 1; i++) p[i] = rng() >> shift;
    const uint32_t np = leaf ? n : n + 1;
    uint8_t img[64];
    if (!Encode(k, n, p, np, leaf, false, ksigned, img)) continue;
    Decoded d;
    ASSERT_TRUE(Decode(img, ksigned, &d));
    ASSERT_EQ(d.n, n);
    for (uint32_t i = 0; i < n; i++) ASSERT_EQ(d.k[i], k[i]);
    for (uint32_t i = 0; i < np; i++) ASSERT_EQ(d.p[i], p[i]);
  }
}

struct Cfg {
  KeyKind kk;
  ValueKind vk;
  const char* leaf;
  int leaf_size;
  const char* parent;
};

std::string Key(const Cfg& c, uint64_t k) {
  return c.kk == KeyKind::kU64 ? testutil::ShortKey(c.kk, k * 2654435761ull % 1000003) : testutil::ShortKey(c.kk, k);
}
std::string Val(const Cfg& c, uint64_t v) { return testutil::ShortVal(c.vk, v); }

class ClfBTreeTest : public testing::TestWithParam<Cfg>, protected testutil::IndexHolder {
 protected:
  void SetUp() override { path_ = testutil::IndexPoolPath("clfbtree-test"); }
  Options Opts() {
    Options o;
    o.pool_path = path_;
    o.pool_size = 64ull << 20;
    o.key_kind = GetParam().kk;
    o.value_kind = GetParam().vk;
    o.params = {{"leaf", GetParam().leaf},
                {"leaf_size", std::to_string(GetParam().leaf_size)},
                {"parent", GetParam().parent}};
    if (std::string(GetParam().parent) == "atomic") o.params["emulate_line_atomic"] = "1";
    return o;
  }
  void Open() {
    Status s = OpenIndex("clfbtree", Opts(), &idx_);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  void Verify() { testutil::ExpectMatchesModel(idx_.get(), GetParam().kk, model_); }
  void RandomOps(std::mt19937_64& rng, int n, uint64_t keys, int del_bias = 0) {
    const Cfg& c = GetParam();
    for (int i = 0; i < n; i++) {
      const uint64_t k = rng() % keys, v = rng();
      const std::string key = Key(c, k), val = Val(c, v);
      const int r = int(rng() % (6 + del_bias));
      const testutil::Op o = r < 2    ? testutil::Op::kInsert
                             : r == 2 ? testutil::Op::kUpdate
                             : r == 3 ? testutil::Op::kUpsert
                             : r == 5 ? testutil::Op::kFind
                                      : testutil::Op::kRemove;
      ASSERT_NO_FATAL_FAILURE(testutil::ApplyAndCheck(idx_.get(), &model_, o, key, val));
    }
  }
  testutil::OrderedModel model_{testutil::KeyOrder{GetParam().kk}};
};

TEST_P(ClfBTreeTest, RandomOpsAgainstStdMapWithReopens) {
  std::mt19937_64 rng(42);
  Open();
  for (int phase = 0; phase < 4; phase++) {
    RandomOps(rng, 1200, phase % 2 ? 150 : 1000, phase == 3 ? 8 : 0);
    Verify();
    ASSERT_TRUE(idx_->Close().ok());
    idx_.reset();
    Open();
    Verify();
  }
}

TEST_P(ClfBTreeTest, ReopenOfAPoolCopiedWhileOpen) {
  std::mt19937_64 rng(7);
  Open();
  RandomOps(rng, 1000, 800);
  testutil::ReplaceWithCopyTakenWhileOpen(path_, &idx_);  // the pool file as a SIGKILL leaves it
  Open();
  Verify();
  RandomOps(rng, 800, 800, 6);
  Verify();
}

TEST_P(ClfBTreeTest, DescendingAndAscendingThenEmptied) {
  Open();
  const Cfg& c = GetParam();
  for (uint64_t i = 0; i < 400; i++) {
    const std::string a = c.kk == KeyKind::kU64 ? std::string(U64Slice(3000 - i)) : Key(c, 3000 - i);
    const std::string b = c.kk == KeyKind::kU64 ? std::string(U64Slice(4000 + i)) : Key(c, 4000 + i);
    ASSERT_TRUE(idx_->Insert(a, Val(c, i)).ok());
    ASSERT_TRUE(idx_->Insert(b, Val(c, i)).ok());
    model_[a] = model_[b] = Val(c, i);
  }
  Verify();
  while (!model_.empty()) {
    ASSERT_TRUE(idx_->Remove(model_.begin()->first).ok());
    model_.erase(model_.begin());
  }
  Verify();
}

// Scans of up to 120 records from random keys: across leaves, inner nodes
// and (u64 keys) the route table's nodes, where a scan's first descent
// starts, and past the last key.
TEST_P(ClfBTreeTest, BoundedScansFromRandomKeys) {
  std::mt19937_64 rng(11);
  Open();
  RandomOps(rng, 2000, 3000);
  const Cfg& c = GetParam();
  for (int i = 0; i < 100; i++)
    ASSERT_NO_FATAL_FAILURE(testutil::ExpectBoundedScan(idx_.get(), c.kk, model_, Key(c, rng() % 3200), 1 + rng() % 120));
}

std::vector<Cfg> AllConfigs() {
  std::vector<Cfg> v;
  for (const char* parent : {"atomic", "inplace", "shadow"}) {
    for (KeyKind kk : {KeyKind::kU64, KeyKind::kBytes}) {
      const ValueKind vk = kk == KeyKind::kU64 ? ValueKind::kU64 : ValueKind::kBytes;
      v.push_back({kk, vk, "encoded", 64, parent});
      v.push_back({kk, vk, "append", 128, parent});
      v.push_back({kk, vk, "append", 1024, parent});
    }
  }
  v.push_back({KeyKind::kU64, ValueKind::kBytes, "append", 64, "inplace"});
  v.push_back({KeyKind::kBytes, ValueKind::kU64, "append", 2048, "shadow"});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Kinds, ClfBTreeTest, testing::ValuesIn(AllConfigs()),
                         [](const testing::TestParamInfo<Cfg>& i) {
                           return std::string(i.param.parent) + "_" + i.param.leaf + std::to_string(i.param.leaf_size) +
                                  (i.param.kk == KeyKind::kU64 ? "_u64" : "_bytes") +
                                  (i.param.vk == ValueKind::kU64 ? "_u64" : "_bytes");
                         });

Options Plain(const std::string& path) {
  Options o;
  o.pool_path = path;
  o.pool_size = 16ull << 20;
  return o;
}

TEST(ClfBTreeParams, AtomicNeedsMovdir64bOrExplicitEmulation) {
  const std::string path = "/dev/shm/clfbtree_params_" + std::to_string(::getpid()) + ".pool";
  std::filesystem::remove(path);
  std::unique_ptr<Index> idx;
  Options o = Plain(path);
  o.params = {{"parent", "atomic"}};
  Status s = OpenIndex("clfbtree", o, &idx);
  if (pm::CpuHasMovdir64b()) {
    EXPECT_TRUE(s.ok());
  } else {
    EXPECT_EQ(s.code(), Status::Code::kUnsupported) << s.ToString();
    o.params["emulate_line_atomic"] = "1";
    ASSERT_TRUE(OpenIndex("clfbtree", o, &idx).ok());
    ASSERT_TRUE(idx->Insert(U64Slice(1), U64Slice(2)).ok());
    idx.reset();
    o.params = {};  // a pool written with emulated atomic writes is refused without the switch
    s = OpenIndex("clfbtree", o, &idx);
    EXPECT_EQ(s.code(), Status::Code::kUnsupported) << s.ToString();
  }
  idx.reset();
  std::filesystem::remove(path);
  o = Plain(path);
  for (auto bad : std::vector<std::map<std::string, std::string>>{
           {{"leaf", "x"}}, {{"parent", "rtm"}}, {{"leaf_size", "100"}}, {{"leaf_size", "4096"}}}) {
    o.params = bad;
    EXPECT_EQ(OpenIndex("clfbtree", o, &idx).code(), Status::Code::kInvalidArgument);
    std::filesystem::remove(path);
  }
}

TEST(ClfBTreeBadInput, OversizeKeysAndPoolFullMidSplit) {
  const std::string path = "/dev/shm/clfbtree_full_" + std::to_string(::getpid()) + ".pool";
  for (const char* parent : {"inplace", "shadow"}) {
    for (const char* leaf : {"append", "encoded"}) {
      std::filesystem::remove(path);
      Options o = Plain(path);
      o.pool_size = 2ull << 20;
      o.max_pool_size = 2ull << 20;
      o.key_kind = KeyKind::kBytes;
      o.value_kind = ValueKind::kBytes;
      o.max_key_size = 64;
      o.params = {{"parent", parent}, {"leaf", leaf}, {"leaf_size", "256"}};
      std::unique_ptr<Index> idx;
      ASSERT_TRUE(OpenIndex("clfbtree", o, &idx).ok());
      EXPECT_EQ(idx->Insert(std::string(65, 'k'), "v").code(), Status::Code::kInvalidArgument);
      EXPECT_EQ(idx->Insert("", "v").code(), Status::Code::kInvalidArgument);
      std::map<std::string, std::string> model;
      Status s;
      for (uint64_t i = 0; i < 1000000; i++) {
        const std::string k = "k" + std::to_string(i * 7919 % 1000003), v(100 + i % 50, 'v');
        s = idx->Insert(k, v);
        if (!s.ok()) break;
        model[k] = v;
      }
      EXPECT_EQ(s.code(), Status::Code::kPoolFull) << s.ToString();
      ASSERT_TRUE(idx->Check().ok()) << idx->Check().ToString();
      EXPECT_EQ(idx->Size(), model.size());
      testutil::ExpectNoLeak(idx.get());
      for (auto& [k, v] : model) {
        std::string got;
        ASSERT_TRUE(idx->Find(k, &got).ok());
        ASSERT_EQ(got, v);
      }
      // Deletes make room again.
      size_t n = 0;
      for (auto it = model.begin(); it != model.end() && n < model.size() / 2; n++) {
        ASSERT_TRUE(idx->Remove(it->first).ok());
        it = model.erase(it);
      }
      ASSERT_TRUE(idx->Insert("after", "full").ok());
      ASSERT_TRUE(idx->Check().ok());
      idx.reset();
    }
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace pmindex

namespace pmindex {
namespace {

// Check sees damage: a root key moved out of order, and a leaf key moved
// out of the range its parent routes to it.
TEST(ClfBTreeCheck, ReportsDamagedNodes) {
  const std::string path = "/dev/shm/clfbtree_check_" + std::to_string(::getpid()) + ".pool";
  for (int what = 0; what < 2; what++) {
    std::filesystem::remove(path);
    Options o;
    o.pool_path = path;
    o.pool_size = 16ull << 20;
    o.params = {{"leaf_size", "128"}};
    std::unique_ptr<Index> idx;
    ASSERT_TRUE(OpenIndex("clfbtree", o, &idx).ok());
    for (uint64_t i = 0; i < 3000; i++) ASSERT_TRUE(idx->Insert(U64Slice(i * 1000), U64Slice(i)).ok());
    ASSERT_TRUE(idx->Check().ok());
    char* base = idx->pool()->base();
    auto* m = idx->pool()->root<internal::clfbtree::Meta>();
    ASSERT_EQ(m->root & 1, 0u);
    uint8_t* root = reinterpret_cast<uint8_t*>(base + (m->root & ~63ull));
    Decoded d;
    ASSERT_TRUE(Decode(root, false, &d));
    ASSERT_GE(d.n, 2u);
    if (what == 0) {
      std::vector<uint64_t> k(d.k, d.k + d.n), p(d.p, d.p + d.np());
      std::swap(k[0], k[1]);  // re-encoded wrongly: keys out of order
      uint8_t img[64];
      if (!Encode(k.data(), d.n, p.data(), d.np(), false, d.kids_leaves, true, img)) GTEST_SKIP();
      img[1] = uint8_t(img[1]);
      std::memcpy(root, img, 64);
      EXPECT_EQ(idx->Check().code(), Status::Code::kCorrupt);
    } else {
      // The first key of child 1 moved below the separator of child 0.
      // (the leftmost leaf below child 1 of the root)
      uint64_t off = d.p[1];
      bool kids_leaves = d.kids_leaves;
      while (!kids_leaves) {
        Decoded cur;
        ASSERT_TRUE(Decode(reinterpret_cast<uint8_t*>(base + off), false, &cur));
        off = cur.p[0];
        kids_leaves = cur.kids_leaves;
      }
      uint64_t* leaf = reinterpret_cast<uint64_t*>(base + off);
      uint64_t* bm = reinterpret_cast<uint64_t*>(base + off + 128 - 8);
      for (int i = 0; i < 7; i++)
        if ((*bm >> i) & 1) {
          leaf[2 * i] = 0;
          break;
        }
      EXPECT_EQ(idx->Check().code(), Status::Code::kCorrupt);
    }
    idx.reset();
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace pmindex

namespace pmindex {
namespace {

// The fault-switch list is the one the code uses: each name appears in a
// PMINDEX_FAULT call of the sources (checked against the list by grep in
// docs; here: the names are well formed and distinct).
TEST(ClfBTreeFaults, SwitchListIsWellFormed) {
  std::set<std::string> names;
  for (const char* n : internal::clfbtree::kFaultSwitches) {
    EXPECT_EQ(std::string(n).rfind("clfbtree.", 0), 0u) << n;
    EXPECT_TRUE(names.insert(n).second) << n;
  }
  EXPECT_EQ(names.size(), 6u);
}

// A structure change that unlinks more old nodes or blocks than the SmoLog
// has slots for is refused with Busy before it commits: nothing leaks, the
// tree keeps every acknowledged write and stays checkable.
TEST(ClfBTreeLog, FullLogAbortsTheChangeWithoutLeaking) {
  struct Case {
    KeyKind kk;
    const char* leaf;
    const char* parent;
  };
  for (const Case& c : {Case{KeyKind::kU64, "append", "inplace"}, Case{KeyKind::kBytes, "encoded", "shadow"}}) {
    SCOPED_TRACE(c.parent);
    const std::string path = testutil::IndexPoolPath("clfbtree-log");
    std::filesystem::remove(path);
    Options o;
    o.pool_path = path;
    o.pool_size = 16ull << 20;
    o.key_kind = c.kk;
    o.value_kind = c.kk == KeyKind::kU64 ? ValueKind::kU64 : ValueKind::kBytes;
    o.params = {{"leaf", c.leaf}, {"leaf_size", "64"}, {"parent", c.parent}};
    std::unique_ptr<Index> idx;
    ASSERT_TRUE(OpenIndex("clfbtree", o, &idx).ok());
    dynamic_cast<internal::clfbtree::ClfBTree*>(idx.get())->LimitLogSlotsForTest(2);
    testutil::OrderedModel model{testutil::KeyOrder{c.kk}};
    std::mt19937_64 rng(3);
    int busy = 0;
    for (int i = 0; i < 1500; i++) {
      const std::string k = testutil::ShortKey(c.kk, rng()), v = testutil::ShortVal(o.value_kind, uint64_t(i));
      const Status s = idx->Insert(k, v);
      if (s.ok()) {
        model[k] = v;
      } else {
        ASSERT_EQ(s.code(), Status::Code::kBusy) << s.ToString();
        busy++;
      }
    }
    EXPECT_GT(busy, 0);
    ASSERT_TRUE(idx->Check().ok()) << idx->Check().ToString();
    testutil::ExpectMatchesModel(idx.get(), c.kk, model);
    testutil::ExpectNoLeak(idx.get());
    idx.reset();
    std::filesystem::remove(path);
  }
}

}  // namespace
}  // namespace pmindex
