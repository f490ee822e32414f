// find_many_test.cc: Index::FindMany (include/pmindex/index.h), the batched
// lookup behind KV::get_many, against EVERY registered index and key/value
// kind. Differential: a batch's answers must equal one Find per key,
// through the index's own FindMany (fptree family: fptree_batch.cc's
// interleaved descents) and through the interface's default (a call to
// Index::FindMany, bypassing the override). Batches mix present, absent,
// removed, repeated and invalid keys, with sizes around the override's
// group of 16 (0, 1, 15, 16, 17, 33) and large; the fptree family also
// runs on a deep tree (tiny inner nodes and leaves), so the lanes of a group
// descend several levels. A concurrent case checks every answer of batches
// read beside writers that insert, update and remove (leaf splits and leaf
// deletions), so lanes meet locked leaves and failed validations (run under
// TSan: the test is labelled concurrency).
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>

#include "conformance_cases.h"
#include "pmindex/index.h"
#include "pmindex/pm/pool.h"

namespace pmindex {
namespace {

using conformance::AllCases;
using conformance::Case;
using conformance::CaseName;

bool IsFPTreeFamily(const std::string& name) { return name == "fptree" || name == "fptree_single" || name == "ptree"; }

class FindMany : public testing::TestWithParam<Case> {
 protected:
  void SetUp() override { path_ = conformance::CasePoolPath(GetParam()); }
  void TearDown() override {
    idx_.reset();
    pm::Pool::Remove(path_);
  }
  void Open(const std::map<std::string, std::string>& params = {}) {
    Options o = conformance::CaseOptions(GetParam(), path_);
    o.params = params;
    Status s = OpenIndex(GetParam().index, o, &idx_);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  std::string Key(uint64_t id) const { return conformance::CaseKey(GetParam().kk, id); }
  std::string Value(uint64_t id, uint64_t version) const { return conformance::CaseValue(GetParam().vk, id, version); }
  // Keys of the concurrent case's churn ids: contiguous in key order and
  // apart from Key's (u64: small integers; bytes: "zz" and a number, after
  // every "k..." key), so emptying them empties whole leaves.
  std::string ChurnKey(uint64_t id) const {
    if (GetParam().kk == KeyKind::kU64) return std::string(U64Slice(id));
    return "zz" + std::to_string(id);
  }
  // A key no index accepts for this kind (wrong u64 length, empty bytes).
  std::string BadKey() const { return GetParam().kk == KeyKind::kU64 ? std::string(7, 'x') : std::string(); }

  // Loads ids [0, n) except every fifth, which is inserted and then removed.
  void Load(uint64_t n) {
    for (uint64_t id = 0; id < n; id++) ASSERT_TRUE(idx_->Insert(Key(id), Value(id, 1)).ok()) << id;
    for (uint64_t id = 0; id < n; id += 5) ASSERT_TRUE(idx_->Remove(Key(id)).ok()) << id;
  }

  // The batch answered three ways: one Find per key, the index's FindMany,
  // the interface default; all three must agree key by key.
  void ExpectSame(const std::vector<std::string>& keys) {
    std::vector<Slice> ks(keys.begin(), keys.end());
    const size_t n = ks.size();
    std::vector<std::string> want_v(n), got_v(n, "stale"), def_v(n, "stale");
    std::vector<Status> want_s(n), got_s(n), def_s(n);
    for (size_t i = 0; i < n; i++) want_s[i] = idx_->Find(ks[i], &want_v[i]);
    idx_->FindMany(ks.data(), n, got_v.data(), got_s.data());
    idx_->Index::FindMany(ks.data(), n, def_v.data(), def_s.data());
    for (size_t i = 0; i < n; i++) {
      ASSERT_EQ(got_s[i].code(), want_s[i].code()) << "key " << i << " of " << n << ": " << got_s[i].ToString();
      ASSERT_EQ(def_s[i].code(), want_s[i].code()) << "key " << i << " of " << n << ": " << def_s[i].ToString();
      if (want_s[i].ok()) {
        ASSERT_EQ(got_v[i], want_v[i]) << "key " << i << " of " << n;
        ASSERT_EQ(def_v[i], want_v[i]) << "key " << i << " of " << n;
      }
    }
  }

  // Batches of every interesting size over ids in [0, 2 * n): present,
  // removed (every fifth) and never inserted (>= n), with repeats and an
  // invalid key.
  void RunBatches(uint64_t n, uint32_t seed) {
    std::mt19937_64 rng(seed);
    for (size_t size : {0, 1, 15, 16, 17, 33, 1000}) {
      std::vector<std::string> keys;
      for (size_t i = 0; i < size; i++) keys.push_back(Key(rng() % (2 * n)));
      if (size >= 2) keys[size / 2] = keys[0];  // a repeat
      ExpectSame(keys);
      if (size >= 3) {
        keys[size - 2] = BadKey();
        ExpectSame(keys);
      }
    }
    // All keys the same, and all ids in order (neighbouring keys share leaves).
    ExpectSame(std::vector<std::string>(40, Key(1)));
    std::vector<std::string> all;
    for (uint64_t id = 0; id < n; id++) all.push_back(Key(id));
    ExpectSame(all);
  }

  std::string path_;
  std::unique_ptr<Index> idx_;
};

TEST_P(FindMany, EmptyIndex) {
  Open();
  ExpectSame({});
  ExpectSame({Key(1), Key(2), Key(1)});
}

TEST_P(FindMany, EqualsFindPerKey) {
  Open();
  Load(3000);
  RunBatches(3000, 1);
}

// A tree several inner levels deep, so the lanes of a group take several
// passes and land on many different leaves.
TEST_P(FindMany, EqualsFindPerKeyDeepTree) {
  if (!IsFPTreeFamily(GetParam().index)) GTEST_SKIP() << "tree shape parameters of the FPTree family";
  Open({{"inner_size", "4"}, {"leaf_size", "4"}});
  Load(2000);
  RunBatches(2000, 2);
}

// Calls after Close are invalid in general (index.h); the FPTree family
// answers them with InvalidArgument, its FindMany too.
TEST_P(FindMany, AfterClose) {
  if (!IsFPTreeFamily(GetParam().index)) GTEST_SKIP() << "calls after Close are undefined";
  Open();
  ASSERT_TRUE(idx_->Insert(Key(1), Value(1, 1)).ok());
  ASSERT_TRUE(idx_->Close().ok());
  std::vector<Slice> ks(3, Slice());
  std::string k1 = Key(1);
  for (Slice& s : ks) s = k1;
  std::vector<std::string> v(3);
  std::vector<Status> st(3);
  idx_->FindMany(ks.data(), 3, v.data(), st.data());
  for (const Status& s : st) EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
}

// Readers run batches beside writers. Stable ids (even, below kStable) are
// present with version 1 throughout and must always be found with that
// value; churn ids (ChurnKey: a range of their own, so whole leaves empty
// and are deleted) are inserted, updated and removed, and must be NotFound or hold
// one of the values the writers give them.
TEST_P(FindMany, BesideWriters) {
  if (!GetParam().concurrent) GTEST_SKIP() << "single-threaded index";
  Open({});
  constexpr uint64_t kStable = 600, kChurn0 = 10000, kChurn = 600, kVersions = 3;
  for (uint64_t id = 0; id < kStable; id += 2) ASSERT_TRUE(idx_->Insert(Key(id), Value(id, 1)).ok());
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> writes{0};
  auto writer = [&](uint32_t seed) {
    std::mt19937 rng(seed);
    while (!stop.load(std::memory_order_relaxed)) {
      // Fill the whole churn range (splits), then empty it (leaf deletions).
      for (uint64_t i = 0; i < kChurn && !stop.load(std::memory_order_relaxed); i++) {
        const uint64_t id = kChurn0 + (i * 7 + seed) % kChurn;
        ASSERT_TRUE(idx_->Upsert(ChurnKey(id), Value(id, 1 + rng() % kVersions)).ok());
      }
      for (uint64_t i = 0; i < kChurn && !stop.load(std::memory_order_relaxed); i++) {
        Status s = idx_->Remove(ChurnKey(kChurn0 + (i * 11 + seed) % kChurn));
        ASSERT_TRUE(s.ok() || s.IsNotFound()) << s.ToString();
      }
      writes.fetch_add(1, std::memory_order_relaxed);
    }
  };
  auto reader = [&](uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<std::string> keys;
    std::vector<uint64_t> ids;
    std::vector<std::string> v;
    std::vector<Status> st;
    for (int round = 0; round < 300 || writes.load(std::memory_order_relaxed) < 2; round++) {
      const size_t n = 1 + rng() % 40;
      ids.clear();
      keys.clear();
      for (size_t i = 0; i < n; i++) {
        const uint64_t id = rng() % 2 ? (rng() % kStable) : kChurn0 + rng() % kChurn;
        ids.push_back(id);
        keys.push_back(id < kStable ? Key(id) : ChurnKey(id));
      }
      std::vector<Slice> ks(keys.begin(), keys.end());
      v.assign(n, std::string());
      st.assign(n, Status());
      idx_->FindMany(ks.data(), n, v.data(), st.data());
      for (size_t i = 0; i < n; i++) {
        const uint64_t id = ids[i];
        if (id < kStable) {
          if (id % 2) {
            ASSERT_TRUE(st[i].IsNotFound()) << id << ": " << st[i].ToString();
          } else {
            ASSERT_TRUE(st[i].ok()) << id << ": " << st[i].ToString();
            ASSERT_EQ(v[i], Value(id, 1)) << id;
          }
          continue;
        }
        if (st[i].IsNotFound()) continue;
        ASSERT_TRUE(st[i].ok()) << id << ": " << st[i].ToString();
        bool known = false;
        for (uint64_t ver = 1; ver <= kVersions; ver++) known |= v[i] == Value(id, ver);
        ASSERT_TRUE(known) << "churn id " << id << " has a value no writer stored";
      }
    }
  };
  std::vector<std::thread> ts;
  ts.emplace_back(writer, 1);
  ts.emplace_back(writer, 2);
  std::thread r1(reader, 3), r2(reader, 4);
  r1.join();
  r2.join();
  stop.store(true);
  for (auto& t : ts) t.join();
  ASSERT_TRUE(idx_->Check().ok()) << idx_->Check().ToString();
}

INSTANTIATE_TEST_SUITE_P(AllIndexes, FindMany, testing::ValuesIn(AllCases()), CaseName);

}  // namespace
}  // namespace pmindex
