// Conformance suite run against EVERY registered index and every key/value
// kind: the behaviour the common API promises (include/pmindex/index.h),
// checked differentially against std::map. Index folders add their own
// deeper tests (crash, concurrency, structure); this suite makes sure no
// index silently deviates from the contract (e.g. a stored value of 0 reading
// back as "not found", a scan that counts but returns no records, duplicate
// inserts accepted, records lost on reopen, PM leaked).
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "conformance_cases.h"
#include "pmindex/index.h"
#include "pmindex/pm/allocator.h"
#include "pmindex/pm/pool.h"

namespace pmindex {
namespace {

using conformance::AllCases;
using conformance::Case;
using conformance::CaseName;

class Conformance : public testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const Case& c = GetParam();
    path_ = conformance::CasePoolPath(c);
    opts_ = conformance::CaseOptions(c, path_);
    ASSERT_TRUE(OpenIndex(c.index, opts_, &idx_).ok());
  }
  void TearDown() override {
    idx_.reset();
    pm::Pool::Remove(path_);
  }

  std::string Key(uint64_t id) const { return conformance::CaseKey(GetParam().kk, id); }
  std::string Value(uint64_t id, uint64_t version) const { return conformance::CaseValue(GetParam().vk, id, version); }

  // The model in index order.
  std::vector<std::pair<std::string, std::string>> ModelInOrder() const { return {model_.begin(), model_.end()}; }

  void VerifyAll() {
    ASSERT_TRUE(idx_->Check().ok()) << idx_->Check().ToString();
    EXPECT_EQ(idx_->Size(), model_.size());
    std::string v;
    for (const auto& [k, val] : model_) {
      Status s = idx_->Find(k, &v);
      ASSERT_TRUE(s.ok()) << s.ToString();
      ASSERT_EQ(v, val);
    }
    if (GetParam().ordered) {
      auto ordered = ModelInOrder();
      std::vector<std::pair<std::string, std::string>> got;
      size_t count = 0;
      // The smallest key of each kind.
      std::string first = GetParam().kk == KeyKind::kBytes ? std::string(1, '\0') : std::string(8, '\0');
      ASSERT_TRUE(idx_->Scan(first, ordered.size() + 10, [&](Slice k, Slice val) {
                          got.emplace_back(std::string(k), std::string(val));
                          return true;
                        }, &count).ok());
      EXPECT_EQ(count, got.size());
      ASSERT_EQ(got.size(), ordered.size());
      for (size_t i = 0; i < got.size(); i++) {
        ASSERT_EQ(got[i].first, ordered[i].first) << "scan position " << i;
        ASSERT_EQ(got[i].second, ordered[i].second) << "scan position " << i;
      }
    }
    CheckNoLeak();
  }

  void CheckNoLeak() {
    if (!GetParam().persistent || !idx_->pool()) return;
    std::set<uint64_t> owned, allocated;
    ASSERT_TRUE(idx_->ForEachOwnedBlock([&](uint64_t off) { EXPECT_TRUE(owned.insert(off).second) << "block reported twice: " << off; }).ok());
    idx_->pool()->allocator().ForEachAllocated([&](uint64_t off, size_t) { allocated.insert(off); });
    EXPECT_EQ(owned, allocated) << "owned " << owned.size() << " blocks, allocator has " << allocated.size();
  }

  void Reopen() {
    ASSERT_TRUE(idx_->Close().ok());
    idx_.reset();
    Options o = opts_;
    o.create_if_missing = false;
    Status s = OpenIndex("", o, &idx_);
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_EQ(idx_->Name(), GetParam().index);
  }

  // Orders keys as the index does (numeric for u64, memcmp for bytes).
  struct KeyLess {
    KeyKind kk;
    bool operator()(const std::string& a, const std::string& b) const {
      return kk == KeyKind::kU64 ? SliceToU64(a) < SliceToU64(b) : a < b;
    }
  };

  std::string path_;
  Options opts_;
  std::unique_ptr<Index> idx_;
  std::map<std::string, std::string, KeyLess> model_{KeyLess{GetParam().kk}};
};

TEST_P(Conformance, BasicContract) {
  std::string v;
  const std::string k1 = Key(1), k2 = Key(2);
  EXPECT_TRUE(idx_->Find(k1, &v).IsNotFound());
  EXPECT_TRUE(idx_->Update(k1, Value(1, 0)).IsNotFound());
  EXPECT_TRUE(idx_->Remove(k1).IsNotFound());
  ASSERT_TRUE(idx_->Insert(k1, Value(1, 0)).ok());
  EXPECT_TRUE(idx_->Insert(k1, Value(1, 1)).IsAlreadyExists());
  ASSERT_TRUE(idx_->Find(k1, &v).ok());
  EXPECT_EQ(v, Value(1, 0)) << "a rejected duplicate insert must not change the value";
  ASSERT_TRUE(idx_->Update(k1, Value(1, 2)).ok());
  ASSERT_TRUE(idx_->Find(k1, &v).ok());
  EXPECT_EQ(v, Value(1, 2));
  ASSERT_TRUE(idx_->Upsert(k2, Value(2, 0)).ok());
  ASSERT_TRUE(idx_->Upsert(k2, Value(2, 1)).ok());
  ASSERT_TRUE(idx_->Find(k2, &v).ok());
  EXPECT_EQ(v, Value(2, 1));
  EXPECT_EQ(idx_->Size(), 2u);
  ASSERT_TRUE(idx_->Remove(k1).ok());
  EXPECT_TRUE(idx_->Find(k1, &v).IsNotFound());
  EXPECT_EQ(idx_->Size(), 1u);
  if (!GetParam().ordered) {
    EXPECT_TRUE(idx_->Scan(k2, 10, [](Slice, Slice) { return true; }).IsUnsupported());
  }
}

// After Close every call answers without touching the closed pool: each
// Status-returning method InvalidArgument "index closed", Size 0, Stats a
// zero record count and PM size, pool() nullptr; Name and the kinds keep
// answering, and Close stays OK (idempotent). A call that reached the
// index's unmapped pool would crash here.
TEST_P(Conformance, EveryCallAfterCloseIsAClearError) {
  for (uint64_t i = 0; i < 50; i++) ASSERT_TRUE(idx_->Insert(Key(i), Value(i, 0)).ok());
  ASSERT_TRUE(idx_->Close().ok());
  auto closed = [](const Status& s) {
    return s.IsInvalidArgument() && s.ToString().find("index closed") != std::string::npos;
  };
  std::string v = "untouched";
  EXPECT_PRED1(closed, idx_->Insert(Key(100), Value(100, 0)));
  EXPECT_PRED1(closed, idx_->Insert(Key(1), Value(1, 1)));
  EXPECT_PRED1(closed, idx_->Update(Key(1), Value(1, 1)));
  EXPECT_PRED1(closed, idx_->Upsert(Key(1), Value(1, 1)));
  EXPECT_PRED1(closed, idx_->Find(Key(1), &v));
  EXPECT_EQ(v, "untouched");
  EXPECT_PRED1(closed, idx_->Remove(Key(1)));
  size_t count = 7;
  bool called = false;
  EXPECT_PRED1(closed, idx_->Scan(Key(0), 10, [&](Slice, Slice) { return called = true; }, &count));
  EXPECT_FALSE(called);
  EXPECT_EQ(idx_->Size(), 0u);
  EXPECT_PRED1(closed, idx_->Check());
  called = false;
  EXPECT_PRED1(closed, idx_->ForEachOwnedBlock([&](uint64_t) { called = true; }));
  EXPECT_FALSE(called);
  const IndexStats st = idx_->Stats();
  EXPECT_EQ(st.records, 0u);
  EXPECT_EQ(st.pm_bytes, 0u);
  EXPECT_EQ(idx_->pool(), nullptr);
  EXPECT_EQ(idx_->Name(), GetParam().index);
  EXPECT_EQ(idx_->key_kind(), GetParam().kk);
  EXPECT_EQ(idx_->value_kind(), GetParam().vk);
  EXPECT_TRUE(idx_->Close().ok());
  // Input checks come after the closed check: bad input answers closed too.
  EXPECT_PRED1(closed, idx_->Find("", &v));
}

TEST_P(Conformance, ZeroAndEqualValuesAreFound) {
  // Regression for public wrappers that treat value 0 as "absent" or lose
  // records whose neighbours carry the same value.
  std::string zero8(8, '\0');
  std::string val = GetParam().vk == ValueKind::kU64 ? zero8 : std::string();
  for (uint64_t i = 0; i < 200; i++) {
    ASSERT_TRUE(idx_->Insert(Key(i), val).ok());
    model_[Key(i)] = val;
  }
  VerifyAll();
}

TEST_P(Conformance, BadInputIsAClearError) {
  std::string v;
  if (GetParam().kk == KeyKind::kU64) {
    EXPECT_TRUE(idx_->Insert("abc", Value(1, 0)).IsInvalidArgument());
    EXPECT_TRUE(idx_->Find("abcdefghij", &v).IsInvalidArgument());
  } else {
    EXPECT_TRUE(idx_->Insert(std::string(kMaxKeySize + 1, 'x'), Value(1, 0)).IsInvalidArgument());
    EXPECT_TRUE(idx_->Insert("", Value(1, 0)).IsInvalidArgument());
    EXPECT_TRUE(idx_->Insert(std::string(kMaxKeySize, 'x'), Value(1, 0)).ok()) << "keys up to 1 KiB are accepted";
    model_[std::string(kMaxKeySize, 'x')] = Value(1, 0);
  }
  if (GetParam().vk == ValueKind::kU64) {
    EXPECT_TRUE(idx_->Insert(Key(5), "1234").IsInvalidArgument());
  } else {
    EXPECT_TRUE(idx_->Insert(Key(5), std::string(kMaxValueSize + 1, 'v')).IsInvalidArgument());
    EXPECT_TRUE(idx_->Insert(Key(5), std::string(kMaxValueSize, 'v')).ok()) << "values up to 4 KiB are accepted";
    model_[Key(5)] = std::string(kMaxValueSize, 'v');
  }
  EXPECT_TRUE(idx_->Find(Key(6), &v).IsNotFound()) << "a rejected insert stored nothing";
  VerifyAll();
}

TEST_P(Conformance, RandomOpsAgainstStdMap) {
  std::mt19937_64 rng(12345);
  const uint64_t kKeys = 3000;
  std::string v;
  for (int phase = 0; phase < 4; phase++) {
    for (int i = 0; i < 6000; i++) {
      uint64_t id = rng() % kKeys;
      std::string k = Key(id);
      std::string val = Value(id, rng() % 1000);
      bool present = model_.count(k) != 0;
      switch (rng() % 7) {
        case 0:
        case 1: {
          Status s = idx_->Insert(k, val);
          ASSERT_EQ(s.ok(), !present) << s.ToString();
          if (!present) model_[k] = val;
          else ASSERT_TRUE(s.IsAlreadyExists());
          break;
        }
        case 2: {
          Status s = idx_->Update(k, val);
          ASSERT_EQ(s.ok(), present) << s.ToString();
          if (present) model_[k] = val;
          break;
        }
        case 3: {
          ASSERT_TRUE(idx_->Upsert(k, val).ok());
          model_[k] = val;
          break;
        }
        case 4: {
          Status s = idx_->Remove(k);
          ASSERT_EQ(s.ok(), present) << s.ToString();
          model_.erase(k);
          break;
        }
        case 5: {
          Status s = idx_->Find(k, &v);
          ASSERT_EQ(s.ok(), present) << s.ToString();
          if (present) {
            ASSERT_EQ(v, model_[k]);
          }
          break;
        }
        case 6: {
          if (!GetParam().ordered) break;
          size_t n = rng() % 40;
          std::vector<std::pair<std::string, std::string>> got;
          size_t count = 0;
          ASSERT_TRUE(idx_->Scan(k, n, [&](Slice a, Slice b) {
                              got.emplace_back(std::string(a), std::string(b));
                              return true;
                            }, &count).ok());
          auto it = model_.lower_bound(k);
          size_t expect = std::min<size_t>(n, std::distance(it, model_.end()));
          ASSERT_EQ(got.size(), expect);
          ASSERT_EQ(count, expect);
          for (size_t j = 0; j < got.size(); j++, ++it) {
            ASSERT_EQ(got[j].first, it->first);
            ASSERT_EQ(got[j].second, it->second);
          }
          break;
        }
      }
    }
    VerifyAll();
    if (GetParam().persistent && phase % 2 == 1) {
      Reopen();
      VerifyAll();
    }
  }
}

TEST_P(Conformance, ScanStopsWhenCallbackSaysSo) {
  if (!GetParam().ordered) GTEST_SKIP() << "hash index";
  for (uint64_t i = 0; i < 100; i++) ASSERT_TRUE(idx_->Insert(Key(i), Value(i, 0)).ok());
  size_t seen = 0, count = 0;
  std::string start = GetParam().kk == KeyKind::kU64 ? std::string(8, '\0') : std::string(1, '\0');
  ASSERT_TRUE(idx_->Scan(start, 50, [&](Slice, Slice) { return ++seen < 10; }, &count).ok());
  EXPECT_EQ(seen, 10u);
}

TEST_P(Conformance, ReopenKeepsEverything) {
  if (!GetParam().persistent) GTEST_SKIP() << "transient index";
  for (uint64_t i = 0; i < 5000; i++) {
    ASSERT_TRUE(idx_->Insert(Key(i), Value(i, 1)).ok());
    model_[Key(i)] = Value(i, 1);
  }
  for (uint64_t i = 0; i < 5000; i += 3) {
    ASSERT_TRUE(idx_->Remove(Key(i)).ok());
    model_.erase(Key(i));
  }
  Reopen();
  VerifyAll();
  // The reopened index accepts further operations.
  for (uint64_t i = 5000; i < 5500; i++) {
    ASSERT_TRUE(idx_->Insert(Key(i), Value(i, 2)).ok());
    model_[Key(i)] = Value(i, 2);
  }
  VerifyAll();
}

TEST_P(Conformance, WrongIndexTypeIsRejected) {
  if (!GetParam().persistent) GTEST_SKIP() << "transient index";
  ASSERT_TRUE(idx_->Insert(Key(1), Value(1, 0)).ok());
  idx_.reset();
  std::string other;
  for (const auto& i : ListIndexes())
    if (i.persistent && i.name != GetParam().index) other = i.name;
  if (other.empty()) GTEST_SKIP() << "only one persistent index built";
  Options o = opts_;
  std::unique_ptr<Index> wrong;
  Status s = OpenIndex(other, o, &wrong);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_NE(s.message().find(GetParam().index), std::string_view::npos) << "error names the owner: " << s.ToString();
  // Nothing was lost by the failed open.
  ASSERT_TRUE(OpenIndex(GetParam().index, o, &idx_).ok());
  std::string v;
  EXPECT_TRUE(idx_->Find(Key(1), &v).ok());
}

TEST_P(Conformance, PoolFullIsAClearErrorAndLosesNothing) {
  if (!GetParam().persistent) GTEST_SKIP() << "transient index";
  idx_.reset();
  pm::Pool::Remove(path_);
  Options o = opts_;
  o.pool_size = 4ull << 20;
  o.max_pool_size = 4ull << 20;
  ASSERT_TRUE(OpenIndex(GetParam().index, o, &idx_).ok());
  Status s;
  uint64_t i = 0;
  for (; i < 10'000'000; i++) {
    s = idx_->Insert(Key(i), Value(i, 3));
    if (!s.ok()) break;
    model_[Key(i)] = Value(i, 3);
  }
  ASSERT_TRUE(s.IsPoolFull()) << "after " << i << " inserts: " << s.ToString();
  std::string v;
  EXPECT_TRUE(idx_->Find(Key(i), &v).IsNotFound()) << "the failed insert left nothing behind";
  VerifyAll();
  // Freeing space makes room again: records of the same sizes fit again.
  // (A segregated-fit allocator cannot promise room for a new size class.)
  for (uint64_t j = 0; j < i; j += 2) {
    ASSERT_TRUE(idx_->Remove(Key(j)).ok());
    model_.erase(Key(j));
  }
  for (uint64_t j = 0; j < i; j += 4) {
    Status again = idx_->Insert(Key(j), Value(j, 3));
    ASSERT_TRUE(again.ok()) << "re-inserting record " << j << " after removing half of " << i << ": " << again.ToString();
    model_[Key(j)] = Value(j, 3);
  }
  VerifyAll();
  Reopen();
  VerifyAll();
}

// Many more threads than cores (and than the 64 micro-log slots, epoch
// slots per CPU, ... an index might size by a small constant): 96 threads
// insert, find, update and remove disjoint keys, emptying and refilling
// leaves/nodes/buckets, with scans. Logical limits on thread counts (a
// deletion once waited for a log slot held by threads waiting for it) show
// up here as a hang, which the watchdog turns into a failure.
TEST_P(Conformance, ManyThreadsOnDisjointKeys) {
  if (!GetParam().concurrent) GTEST_SKIP() << "not concurrent";
  const int T = 96, per = 40, rounds = 3;
  std::atomic<bool> done{false};
  std::thread watchdog([&] {
    for (int i = 0; i < 2400 && !done; i++) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (!done) {
      std::fprintf(stderr, "ManyThreadsOnDisjointKeys: no progress for 240 s (deadlock?)\n");
      std::_Exit(1);
    }
  });
  std::atomic<int> errors{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < T; t++) {
    ts.emplace_back([&, t] {
      std::string v;
      for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < per; i++) {
          const uint64_t id = uint64_t(i) * T + t;
          if (!idx_->Insert(Key(id), Value(id, r)).ok()) errors++;
        }
        for (int i = 0; i < per; i++) {
          const uint64_t id = uint64_t(i) * T + t;
          if (!idx_->Find(Key(id), &v).ok() || v != Value(id, r)) errors++;
          if (!idx_->Update(Key(id), Value(id, r + 100)).ok()) errors++;
        }
        if (GetParam().ordered) idx_->Scan(Key(uint64_t(t)), 20, [](Slice, Slice) { return true; });
        const int keep = r + 1 == rounds ? per / 2 : 0;  // the last round keeps half
        for (int i = keep; i < per; i++) {
          const uint64_t id = uint64_t(i) * T + t;
          if (!idx_->Remove(Key(id)).ok()) errors++;
          if (!idx_->Find(Key(id), nullptr).IsNotFound()) errors++;
        }
      }
    });
  }
  for (auto& th : ts) th.join();
  done = true;
  watchdog.join();
  ASSERT_EQ(errors.load(), 0);
  for (int t = 0; t < T; t++)
    for (int i = 0; i < per / 2; i++) {
      const uint64_t id = uint64_t(i) * T + t;
      model_[Key(id)] = Value(id, rounds - 1 + 100);
    }
  VerifyAll();
}

INSTANTIATE_TEST_SUITE_P(AllIndexes, Conformance, testing::ValuesIn(AllCases()), CaseName);

}  // namespace
}  // namespace pmindex
