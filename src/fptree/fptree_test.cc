// Parameterised tests of the FPTree family (fptree, fptree_single, ptree) over
// every variant and key/value kind: differential against std::map, a
// delete-heavy run that shrinks back without a reopen, reopen, zero values,
// bad input, leak checks (allocator enumeration == ForEachOwnedBlock).
// Single-configuration tests live in fptree_misc_test.cc.
// PMINDEX_LONG=1 makes the random sequences ten times longer.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fptree/fptree.h"
#include "pmindex/index.h"
#include "pmindex/pm/allocator.h"
#include "pmindex/pm/pool.h"
#include "testing/index_test_util.h"

namespace pmindex {
namespace {

bool Long() { return std::getenv("PMINDEX_LONG") != nullptr; }

struct Cfg {
  std::string name;
  KeyKind kk;
  ValueKind vk;
  std::map<std::string, std::string> params;
  std::string label;
};

std::string CfgName(const testing::TestParamInfo<Cfg>& i) { return i.param.label; }

std::vector<Cfg> AllCfgs() {
  std::vector<Cfg> v;
  for (std::string n : {"fptree", "fptree_single", "ptree"}) {
    for (int kk = 0; kk < 2; kk++)
      for (int vk = 0; vk < 2; vk++) {
        Cfg c{n, KeyKind(kk), ValueKind(vk), {}, n + (kk ? "_bkey" : "_ukey") + (vk ? "_bval" : "_uval")};
        v.push_back(c);
        // Small nodes: many splits, deep inner trees, leaf deletions.
        Cfg s = c;
        s.params = {{"leaf_size", "6"}, {"inner_size", "4"}};
        if (n == "fptree_single") s.params["group_size"] = "3";
        s.label += "_small";
        v.push_back(s);
      }
    Cfg f{n, KeyKind::kU64, ValueKind::kU64, {{"leaf_size", "5"}, {"inner_size", "3"}, {"update", "flip"}}, n + "_flip_small"};
    v.push_back(f);
  }
  return v;
}

class FPTreeTest : public testing::TestWithParam<Cfg>, protected testutil::IndexHolder {
 protected:
  void SetUp() override {
    opts_.pool_size = 64ull << 20;
    opts_.key_kind = GetParam().kk;
    opts_.value_kind = GetParam().vk;
    opts_.params = GetParam().params;
    opts_.max_key_size = 200;
    opts_.max_value_size = 300;
    CreateIndex(GetParam().name, "fptree-test-" + GetParam().name);
  }
  void Reopen() { IndexHolder::Reopen(); }
  std::string Key(uint64_t i) { return testutil::MixedKey(GetParam().kk, i); }
  std::string Val(uint64_t i, uint64_t ver) { return testutil::MixedVal(GetParam().vk, i, ver); }
  void ExpectNoLeak() { testutil::ExpectNoLeak(idx_.get()); }
  void ExpectEqualsModel(const std::map<std::string, std::string>& model) {
    std::vector<std::pair<std::string, std::string>> got;
    size_t cnt = 0;
    ASSERT_TRUE(idx_->Scan(testutil::ScanStart(GetParam().kk), SIZE_MAX, [&](Slice k, Slice v) {
                  got.emplace_back(std::string(k), std::string(v));
                  return true;
                }, &cnt).ok());
    ASSERT_EQ(cnt, got.size());
    const std::vector<testutil::Record> want = testutil::InKeyOrder(model, GetParam().kk);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_TRUE(got == want);
    EXPECT_EQ(idx_->Size(), model.size());
    for (auto& [k, v] : model) {
      std::string out;
      ASSERT_TRUE(idx_->Find(k, &out).ok());
      ASSERT_EQ(out, v);
    }
  }
  bool Less(const std::string& a, const std::string& b) {
    if (GetParam().kk == KeyKind::kU64) return SliceToU64(a) < SliceToU64(b);
    return a < b;
  }
  // Find(k) agrees with the model.
  void ExpectFind(const std::map<std::string, std::string>& model, const std::string& k) {
    std::string out;
    Status s = idx_->Find(k, &out);
    auto it = model.find(k);
    if (it == model.end()) {
      ASSERT_TRUE(s.IsNotFound()) << s.ToString();
    } else {
      ASSERT_TRUE(s.ok()) << s.ToString();
      ASSERT_EQ(out, it->second);
    }
  }
  // Insert(k, v) agrees with the model, which it updates; true if inserted.
  bool InsertLikeModel(std::map<std::string, std::string>* model, const std::string& k, const std::string& v) {
    Status s = idx_->Insert(k, v);
    if (model->count(k)) {
      EXPECT_TRUE(s.IsAlreadyExists()) << s.ToString();
      return false;
    }
    EXPECT_TRUE(s.ok()) << s.ToString();
    (*model)[k] = v;
    return true;
  }
};

TEST_P(FPTreeTest, DifferentialAgainstStdMap) {
  std::mt19937_64 rng(42);
  std::map<std::string, std::string> model;
  const int phases = 4;
  const int ops = Long() ? 40000 : (GetParam().label.find("small") != std::string::npos ? 4000 : 6000);
  const uint64_t space = 3000;
  for (int ph = 0; ph < phases; ph++) {
    for (int i = 0; i < ops; i++) {
      uint64_t id = rng() % space;
      std::string k = Key(id), v = Val(id, rng() % 1000);
      // Phase 2 deletes heavily (leaf deletion paths), others insert-heavy.
      int op = rng() % 100;
      if (ph == 2) op = op < 60 ? 45 : op;
      if (op < 30) {
        InsertLikeModel(&model, k, v);
        ASSERT_FALSE(HasFailure());
      } else if (op < 40) {
        Status s = idx_->Update(k, v);
        if (model.count(k)) {
          ASSERT_TRUE(s.ok()) << s.ToString();
          model[k] = v;
        } else {
          ASSERT_TRUE(s.IsNotFound()) << s.ToString();
        }
      } else if (op < 45) {
        ASSERT_TRUE(idx_->Upsert(k, v).ok());
        model[k] = v;
      } else if (op < 65) {
        Status s = idx_->Remove(k);
        ASSERT_EQ(s.ok(), model.erase(k) == 1) << s.ToString();
        if (!s.ok()) {
          ASSERT_TRUE(s.IsNotFound());
        }
      } else if (op < 90) {
        ASSERT_NO_FATAL_FAILURE(ExpectFind(model, k));
      } else {
        size_t n = rng() % 40;
        std::vector<std::pair<std::string, std::string>> got;
        size_t cnt = 0;
        ASSERT_TRUE(idx_->Scan(k, n, [&](Slice a, Slice b) {
                      got.emplace_back(std::string(a), std::string(b));
                      return true;
                    }, &cnt).ok());
        ASSERT_EQ(cnt, got.size());
        // Expected: the first n model keys >= k in index order.
        std::vector<std::pair<std::string, std::string>> want;
        for (auto& kv : model)
          if (!Less(kv.first, k)) want.push_back(kv);
        std::sort(want.begin(), want.end(), [&](auto& a, auto& b) { return Less(a.first, b.first); });
        if (want.size() > n) want.resize(n);
        ASSERT_TRUE(got == want) << "scan of " << n << " got " << got.size() << " want " << want.size();
      }
    }
    Status c = idx_->Check();
    ASSERT_TRUE(c.ok()) << "phase " << ph << ": " << c.ToString();
    ExpectNoLeak();
    ExpectEqualsModel(model);
  }
  // Delete everything: the tree shrinks to one empty leaf and stays usable.
  for (auto& kv : model) ASSERT_TRUE(idx_->Remove(kv.first).ok());
  model.clear();
  ASSERT_TRUE(idx_->Check().ok());
  ExpectNoLeak();
  EXPECT_EQ(idx_->Size(), 0u);
  ASSERT_TRUE(idx_->Insert(Key(7), Val(7, 1)).ok());
  model[Key(7)] = Val(7, 1);
  Reopen();
  ASSERT_TRUE(idx_->Check().ok());
  ExpectEqualsModel(model);
}

// Delete-heavy differential run (alg. 5-6 complete, no deletion left to
// recovery): two cycles of filling the tree, then emptying it with 80%
// deletes mixed with inserts and finds, checked against the model. Once
// empty, without a reopen, the tree must be back to one leaf, one DRAM inner
// node and exactly the PM blocks it had when created (allocator
// enumeration), and pass Check(). Fails if an emptied leaf that is its
// parent's only child is kept, or if empty inner nodes are not removed.
TEST_P(FPTreeTest, DeleteHeavyRunShrinksBackWithoutReopen) {
  auto shape = [&](uint64_t* inner, uint64_t* leaves) { ASSERT_TRUE(internal::FPTreeShape(idx_.get(), inner, leaves)); };
  auto blocks = [&] {
    size_t n = 0;
    idx_->pool()->allocator().ForEachAllocated([&](uint64_t, size_t) { n++; });
    return n;
  };
  uint64_t inner = 0, leaves = 0;
  shape(&inner, &leaves);
  ASSERT_EQ(leaves, 1u);
  ASSERT_EQ(inner, 1u);
  const size_t blocks0 = blocks();
  std::mt19937_64 rng(9);
  std::map<std::string, std::string> model;
  const uint64_t space = Long() ? 40000 : 3000;
  for (int cycle = 0; cycle < 2; cycle++) {
    SCOPED_TRACE("cycle " + std::to_string(cycle));
    std::vector<std::string> keys;
    for (uint64_t i = 0; i < space; i++) {
      uint64_t id = rng() % (4 * space);
      std::string k = Key(id);
      if (InsertLikeModel(&model, k, Val(id, cycle))) keys.push_back(k);
      ASSERT_FALSE(HasFailure());
    }
    shape(&inner, &leaves);
    ASSERT_GT(leaves, 20u);
    ASSERT_TRUE(idx_->Check().ok());
    uint64_t ops = 0;
    while (!model.empty()) {
      int op = int(rng() % 100);
      if (op < 80) {
        size_t j = rng() % keys.size();
        std::string k = keys[j];
        keys[j] = keys.back();
        keys.pop_back();
        Status s = idx_->Remove(k);
        ASSERT_TRUE(s.ok()) << s.ToString();
        model.erase(k);
        ASSERT_TRUE(idx_->Remove(k).IsNotFound());
      } else if (op < 90) {
        uint64_t id = rng() % (4 * space);
        std::string k = Key(id);
        if (InsertLikeModel(&model, k, Val(id, 7))) keys.push_back(k);
        ASSERT_FALSE(HasFailure());
      } else {
        ASSERT_NO_FATAL_FAILURE(ExpectFind(model, Key(rng() % (4 * space))));
      }
      if (++ops % 1500 == 0) {
        Status c = idx_->Check();
        ASSERT_TRUE(c.ok()) << c.ToString();
        ExpectNoLeak();
      }
    }
    Status c = idx_->Check();
    ASSERT_TRUE(c.ok()) << c.ToString();
    ExpectNoLeak();
    ExpectEqualsModel(model);
    shape(&inner, &leaves);
    EXPECT_EQ(leaves, 1u);
    EXPECT_EQ(inner, 1u);
    EXPECT_EQ(blocks(), blocks0);
  }
  // Still usable, and the next open has nothing to repair.
  ASSERT_TRUE(idx_->Insert(Key(5), Val(5, 1)).ok());
  model[Key(5)] = Val(5, 1);
  Reopen();
  ASSERT_TRUE(idx_->Check().ok());
  ExpectEqualsModel(model);
}

TEST_P(FPTreeTest, ReopenKeepsContentsAndChecks) {
  std::map<std::string, std::string> model;
  std::mt19937_64 rng(7);
  for (int i = 0; i < 5000; i++) {
    uint64_t id = rng() % 100000;
    std::string k = Key(id), v = Val(id, i);
    if (idx_->Insert(k, v).ok()) model[k] = v;
    if (i % 3 == 0) {
      uint64_t d = rng() % 100000;
      if (idx_->Remove(Key(d)).ok()) model.erase(Key(d));
    }
  }
  auto before = idx_->Stats();
  ASSERT_TRUE(idx_->Check().ok());
  Reopen();
  EXPECT_EQ(idx_->Name(), GetParam().name);
  EXPECT_EQ(idx_->key_kind(), GetParam().kk);  // kinds come from the pool
  EXPECT_EQ(idx_->value_kind(), GetParam().vk);
  Status c = idx_->Check();
  ASSERT_TRUE(c.ok()) << c.ToString();
  ExpectNoLeak();
  ExpectEqualsModel(model);
  auto after = idx_->Stats();
  EXPECT_EQ(before.records, after.records);
  EXPECT_GT(after.pm_bytes, 0u);
  EXPECT_GT(after.dram_bytes, 0u);
  // Keeps working after reopen.
  ASSERT_TRUE(idx_->Upsert(Key(1), Val(1, 99)).ok());
  std::string out;
  ASSERT_TRUE(idx_->Find(Key(1), &out).ok());
  EXPECT_EQ(out, Val(1, 99));
}

TEST_P(FPTreeTest, ZeroValueIsFoundAndScanReturnsRecords) {
  if (GetParam().vk != ValueKind::kU64) GTEST_SKIP();
  uint64_t zero = 0;
  for (uint64_t i = 1; i <= 300; i++) ASSERT_TRUE(idx_->Insert(Key(i), U64Slice(zero)).ok());
  std::string out = "junk";
  ASSERT_TRUE(idx_->Find(Key(5), &out).ok());
  EXPECT_EQ(SliceToU64(out), 0u);
  EXPECT_EQ(out.size(), 8u);
  std::vector<std::string> keys;
  size_t cnt = 0;
  ASSERT_TRUE(idx_->Scan(Key(1), 100, [&](Slice k, Slice v) {
                keys.emplace_back(k);
                EXPECT_EQ(SliceToU64(v), 0u);
                return true;
              }, &cnt).ok());
  EXPECT_EQ(cnt, 100u);
  EXPECT_EQ(keys.size(), 100u);
  // Early stop.
  cnt = 0;
  int calls = 0;
  ASSERT_TRUE(idx_->Scan(Key(1), 100, [&](Slice, Slice) { return ++calls < 3; }, &cnt).ok());
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(cnt, 3u);
}

// A Scan callback may scan again (the same tree here): the inner scan must
// not disturb the batch the outer one is handing out (u64 keys: scans of
// byte keys collect into vectors of their own).
TEST_P(FPTreeTest, ScanInsideAScanCallback) {
  if (GetParam().kk != KeyKind::kU64) GTEST_SKIP() << "u64 keys";
  std::map<std::string, std::string> model;
  for (uint64_t i = 0; i < 400; i++) {
    ASSERT_TRUE(idx_->Insert(Key(i), Val(i, 0)).ok());
    model[Key(i)] = Val(i, 0);
  }
  std::vector<testutil::Record> outer;
  size_t inner_total = 0;
  ASSERT_TRUE(idx_->Scan(testutil::ScanStart(GetParam().kk), SIZE_MAX, [&](Slice k, Slice v) {
                  outer.emplace_back(std::string(k), std::string(v));
                  if (outer.size() % 100 == 1) {
                    std::vector<testutil::Record> inner;
                    EXPECT_TRUE(idx_->Scan(Key(outer.size() * 7 % 400), 30, [&](Slice a, Slice b) {
                                      inner.emplace_back(std::string(a), std::string(b));
                                      return true;
                                    }).ok());
                    inner_total += inner.size();
                  }
                  return true;
                }).ok());
  EXPECT_GT(inner_total, 0u);
  ASSERT_EQ(outer.size(), model.size());
  EXPECT_TRUE(outer == testutil::InKeyOrder(model, GetParam().kk)) << "the outer scan's records changed under it";
}

TEST_P(FPTreeTest, BadInputIsAClearError) {
  std::string bigkey(opts_.max_key_size + 1, 'k');
  std::string bigval(opts_.max_value_size + 1, 'v');
  std::string k = Key(1), v = Val(1, 1);
  if (GetParam().kk == KeyKind::kBytes) {
    EXPECT_TRUE(idx_->Insert(bigkey, v).IsInvalidArgument());
    EXPECT_TRUE(idx_->Insert("", v).IsInvalidArgument());
    EXPECT_TRUE(idx_->Find(bigkey, nullptr).IsInvalidArgument());
  } else {
    EXPECT_TRUE(idx_->Insert("abc", v).IsInvalidArgument());
    EXPECT_TRUE(idx_->Remove("123456789").IsInvalidArgument());
  }
  if (GetParam().vk == ValueKind::kBytes) {
    EXPECT_TRUE(idx_->Insert(k, bigval).IsInvalidArgument());
  } else {
    EXPECT_TRUE(idx_->Insert(k, "1234").IsInvalidArgument());
  }
  EXPECT_TRUE(idx_->Check().ok());
  EXPECT_EQ(idx_->Size(), 0u);
  ExpectNoLeak();
}

INSTANTIATE_TEST_SUITE_P(Variants, FPTreeTest, testing::ValuesIn(AllCfgs()), CfgName);

}  // namespace
}  // namespace pmindex
