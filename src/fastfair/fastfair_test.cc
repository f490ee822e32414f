// fastfair_test: functional tests of the FAST & FAIR tree (src/fastfair):
// differential against std::map for every key/value kind and node size,
// structure checks after each phase, leak checks, reopen, the unique-slot
// rule (equal values, duplicate inserts), flush counts of FAST shifts, and
// constant-time open.
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>

#include "kit/epoch.h"
#include "kit/test_watchdog.h"
#include "fastfair/fastfair.h"
#include "fastfair/fastfair_test_util.h"
#include "pmindex/index.h"
#include "pmindex/pm/allocator.h"
#include "pmindex/pm/persist.h"
#include "pmindex/pm/pool.h"

namespace {

using namespace pmindex;
using fftest::U64;

struct Kind {
  KeyKind kk;
  ValueKind vk;
  int node_size;
};

std::string KindName(const testing::TestParamInfo<Kind>& i) {
  return std::string(i.param.kk == KeyKind::kU64 ? "u64key" : "byteskey") +
         (i.param.vk == ValueKind::kU64 ? "_u64val" : "_bytesval") + "_node" + std::to_string(i.param.node_size);
}

class FastFairDiff : public testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    opts_ = fftest::MakeOptions(guard_.path, GetParam().kk, GetParam().vk, GetParam().node_size);
    ASSERT_TRUE(OpenIndex("fastfair", opts_, &idx_).ok());
  }
  std::string Key(uint64_t id) const {
    if (GetParam().kk == KeyKind::kU64) return U64(id);
    // Varying lengths and shared prefixes; memcmp order differs from id order.
    std::string s = "key" + std::to_string(id % 1000) + "/" + std::to_string(id);
    s.append(id % 7 * 5, char('a' + id % 26));
    return s;
  }
  std::string Value(uint64_t id, uint64_t ver) const {
    if (GetParam().vk == ValueKind::kU64) return U64(id % 3 == 0 ? 7 : id * 1000 + ver);  // many equal values
    return std::string(id % 50, char('A' + ver % 26)) + std::to_string(id);
  }
  void Reopen() {
    ASSERT_TRUE(idx_->Close().ok());
    idx_.reset();
    ASSERT_TRUE(OpenIndex("fastfair", opts_, &idx_).ok());
  }
  void Verify() {
    Status c = idx_->Check();
    ASSERT_TRUE(c.ok()) << c.ToString();
    ASSERT_TRUE(fftest::NoLeak(idx_.get()));
    ASSERT_EQ(idx_->Size(), model_.size());
    for (const auto& [k, v] : model_) {
      std::string got;
      ASSERT_TRUE(idx_->Find(k, &got).ok()) << "lost key";
      ASSERT_EQ(got, v);
    }
    // Full scan in order.
    auto it = model_.begin();
    size_t n = 0;
    std::string start = GetParam().kk == KeyKind::kU64 ? U64(0) : std::string(1, '\0');
    ASSERT_TRUE(idx_->Scan(start, model_.size() + 5, [&](Slice k, Slice v) {
      EXPECT_TRUE(it != model_.end());
      if (it == model_.end()) return false;
      EXPECT_EQ(std::string(k), it->first);
      EXPECT_EQ(std::string(v), it->second);
      ++it;
      ++n;
      return true;
    }).ok());
    ASSERT_EQ(n, model_.size());
  }
  // Model keyed by the index order.
  struct Less {
    KeyKind kk;
    bool operator()(const std::string& a, const std::string& b) const {
      if (kk == KeyKind::kU64) return SliceToU64(a) < SliceToU64(b);
      return a < b;
    }
  };
  fftest::PoolGuard guard_{"diff"};
  Options opts_;
  std::unique_ptr<Index> idx_;
  std::map<std::string, std::string, Less> model_{Less{GetParam().kk}};
};

TEST_P(FastFairDiff, LongRandomSequenceAgainstStdMap) {
  std::mt19937_64 rng(42 + GetParam().node_size);
  const uint64_t universe = 6000;
  const int phases = 6, ops = 8000;
  for (int phase = 0; phase < phases; phase++) {
    for (int i = 0; i < ops; i++) {
      uint64_t id = GetParam().kk == KeyKind::kU64 ? rng() % universe * 0x9E3779B97F4A7C15ull >> (phase % 2 ? 0 : 20)
                                                   : rng() % universe;
      std::string k = Key(id), v = Value(id, rng() % 1000);
      int op = int(rng() % 100);
      // Phase shapes: growth, shrink, mixed.
      if (phase == 3) op = op < 70 ? 80 : op;  // mostly removes
      bool present = model_.count(k);
      if (op < 40) {
        Status s = idx_->Insert(k, v);
        ASSERT_EQ(s.ok(), !present) << s.ToString();
        if (!present) model_[k] = v;
        else ASSERT_TRUE(s.IsAlreadyExists());
      } else if (op < 50) {
        Status s = idx_->Update(k, v);
        ASSERT_EQ(s.ok(), present) << s.ToString();
        if (present) model_[k] = v;
      } else if (op < 60) {
        ASSERT_TRUE(idx_->Upsert(k, v).ok());
        model_[k] = v;
      } else if (op < 75) {
        std::string got;
        Status s = idx_->Find(k, &got);
        ASSERT_EQ(s.ok(), present);
        if (present) {
          ASSERT_EQ(got, model_[k]);
        }
      } else if (op < 95) {
        Status s = idx_->Remove(k);
        ASSERT_EQ(s.ok(), present) << s.ToString();
        model_.erase(k);
      } else {
        size_t n = rng() % 40;
        auto it = model_.lower_bound(k);
        size_t cnt = 0;
        ASSERT_TRUE(idx_->Scan(k, n, [&](Slice a, Slice b) {
          EXPECT_TRUE(it != model_.end());
          if (it == model_.end()) return false;
          EXPECT_EQ(std::string(a), it->first);
          EXPECT_EQ(std::string(b), it->second);
          ++it;
          return true;
        }, &cnt).ok());
        ASSERT_EQ(cnt, std::min<size_t>(n, std::distance(model_.lower_bound(k), model_.end())));
      }
    }
    Verify();
    if (HasFatalFailure()) return;
    if (phase % 2 == 1) {
      Reopen();
      Verify();
      if (HasFatalFailure()) return;
    }
  }
}

TEST_P(FastFairDiff, SequentialAndReverseLoads) {
  for (uint64_t i = 0; i < 3000; i++) {
    ASSERT_TRUE(idx_->Insert(Key(i), Value(i, 1)).ok());
    model_[Key(i)] = Value(i, 1);
  }
  for (uint64_t i = 10000; i > 7000; i--) {
    ASSERT_TRUE(idx_->Insert(Key(i), Value(i, 2)).ok());
    model_[Key(i)] = Value(i, 2);
  }
  Verify();
  // Empty the tree completely (nodes stay; no merges) and refill.
  for (auto it = model_.begin(); it != model_.end();) {
    ASSERT_TRUE(idx_->Remove(it->first).ok());
    it = model_.erase(it);
  }
  Verify();
  for (uint64_t i = 0; i < 2000; i += 3) {
    ASSERT_TRUE(idx_->Insert(Key(i), Value(i, 3)).ok());
    model_[Key(i)] = Value(i, 3);
  }
  Reopen();
  Verify();
}

// Merges (FAIR sec. 4.2): delete-heavy phases shrink the tree to empty and
// it grows again, three times, with Check, the leak check and the model
// after every phase and a reopen in between. Nodes must really be freed:
// the allocator's block count falls back to the handful of fixed blocks
// (root object, root leaf, limbo, value blocks of live records), the height
// back to 1 (root collapses). Every kind merges; with byte keys the
// separator key blocks must be freed as well.
TEST_P(FastFairDiff, ShrinkToEmptyAndGrowFreesNodes) {
  std::mt19937_64 rng(99 + GetParam().node_size);
  auto blocks = [&] { return idx_->pool()->allocator().BlocksInUse(); };
  const uint64_t empty_blocks = blocks();
  for (int cycle = 0; cycle < 3; cycle++) {
    std::vector<uint64_t> ids;
    for (uint64_t i = 0; i < 4000; i++) ids.push_back(cycle % 2 ? i : rng() % 1000000);
    for (uint64_t id : ids) {
      const std::string k = Key(id), v = Value(id, cycle);
      if (idx_->Insert(k, v).ok()) model_[k] = v;
    }
    Verify();
    if (HasFatalFailure()) return;
    const uint64_t full_blocks = blocks();
    const int full_height = internal::fastfair::Height(idx_.get());
    // Delete-heavy: 90% removes of present keys, 10% inserts, until empty.
    std::vector<std::string> keys;
    for (auto& [k, v] : model_) keys.push_back(k);
    std::shuffle(keys.begin(), keys.end(), rng);
    size_t step = 0;
    while (!model_.empty()) {
      if (rng() % 10 == 0) {
        const uint64_t id = rng() % 1000000;
        const std::string k = Key(id), v = Value(id, 7);
        if (idx_->Insert(k, v).ok()) {
          model_[k] = v;
          keys.push_back(k);
        }
        continue;
      }
      const size_t i = rng() % keys.size();
      std::swap(keys[i], keys.back());
      const std::string k = keys.back();
      keys.pop_back();
      ASSERT_TRUE(idx_->Remove(k).ok());
      model_.erase(k);
      if (++step % 1500 == 0) {
        Verify();
        if (HasFatalFailure()) return;
        if (cycle == 1 && step == 3000) {
          Reopen();
          Verify();
          if (HasFatalFailure()) return;
        }
      }
    }
    Verify();
    if (HasFatalFailure()) return;
    auto* d = internal::fastfair::GetDebugCounters(idx_.get());
    std::printf("cycle %d: blocks %llu full (height %d), %llu empty (height %d; %llu at creation), merges %llu, "
                "root collapses %llu, nodes freed %llu\n",
                cycle, (unsigned long long)full_blocks, full_height, (unsigned long long)blocks(),
                internal::fastfair::Height(idx_.get()), (unsigned long long)empty_blocks,
                (unsigned long long)d->merges, (unsigned long long)d->root_collapses,
                (unsigned long long)d->nodes_freed);
    EXPECT_GT(d->merges, 0u);
    EXPECT_GT(d->nodes_freed, 0u);
    EXPECT_GE(full_height, 2);
    // An empty tree is one leaf; beside it only the root object and the
    // limbo block (and nothing per record; byte keys: no separator key
    // block either, each leaf merge frees r's low key).
    EXPECT_LE(blocks(), empty_blocks + 1) << "nodes or key blocks not freed";
    EXPECT_EQ(internal::fastfair::Height(idx_.get()), 1);
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, FastFairDiff,
                         testing::Values(Kind{KeyKind::kU64, ValueKind::kU64, 512}, Kind{KeyKind::kU64, ValueKind::kU64, 256},
                                         Kind{KeyKind::kU64, ValueKind::kBytes, 256}, Kind{KeyKind::kBytes, ValueKind::kU64, 256},
                                         Kind{KeyKind::kBytes, ValueKind::kBytes, 512}, Kind{KeyKind::kBytes, ValueKind::kBytes, 256}),
                         KindName);

TEST(FastFair, BadParamsAreClearErrors) {
  fftest::PoolGuard g("params");
  std::unique_ptr<Index> idx;
  Options o = fftest::MakeOptions(g.path, KeyKind::kU64, ValueKind::kU64, 500);
  EXPECT_TRUE(OpenIndex("fastfair", o, &idx).IsInvalidArgument());
  o.params["node_size"] = "128";
  EXPECT_TRUE(OpenIndex("fastfair", o, &idx).IsInvalidArgument());
  o.params["node_size"] = "512";
  o.params["leaf_size"] = "5";
  EXPECT_TRUE(OpenIndex("fastfair", o, &idx).IsInvalidArgument());
  o.params.erase("leaf_size");
  ASSERT_TRUE(OpenIndex("fastfair", o, &idx).ok());
  EXPECT_TRUE(idx->Insert("short", U64(1)).IsInvalidArgument());
  EXPECT_TRUE(idx->Insert(U64(1), "short").IsInvalidArgument());
  EXPECT_TRUE(idx->Find("", nullptr).IsInvalidArgument());
  idx.reset();
  o.params["node_size"] = "1024";
  EXPECT_TRUE(OpenIndex("fastfair", o, &idx).IsInvalidArgument()) << "node_size differs from the pool's";
}

// merge_below only lowers the underfull threshold: with 1, a leaf left with
// one record stays (the default cap / 3 merges it), an emptied one merges.
TEST(FastFair, MergeBelowOneMergesOnlyEmptiedNodes) {
  for (const char* mb : {"0", "1"}) {
    fftest::PoolGuard g(std::string("merge_below") + mb);
    std::unique_ptr<Index> idx;
    Options o = fftest::MakeOptions(g.path, KeyKind::kU64, ValueKind::kU64, 256);
    o.params["merge_below"] = mb;
    ASSERT_TRUE(OpenIndex("fastfair", o, &idx).ok());
    const uint64_t n = 400;
    for (uint64_t k = 0; k < n; k++) ASSERT_TRUE(idx->Insert(U64(k), U64(k)).ok());
    // Keep every third key: every leaf of 3 or more consecutive keys keeps one.
    for (uint64_t k = 0; k < n; k++) {
      if (k % 3) {
        ASSERT_TRUE(idx->Remove(U64(k)).ok());
      }
    }
    const uint64_t thinned = internal::fastfair::GetDebugCounters(idx.get())->merges;
    for (uint64_t k = 0; k < n; k += 3) ASSERT_TRUE(idx->Remove(U64(k)).ok());
    auto* d = internal::fastfair::GetDebugCounters(idx.get());
    std::printf("merge_below=%s: merges %llu after thinning, %llu after emptying\n", mb, (unsigned long long)thinned,
                (unsigned long long)d->merges);
    if (std::string(mb) == "1") {
      EXPECT_LE(thinned, 2u) << "leaves with one record merged";
    } else {
      EXPECT_GT(thinned, 10u);
    }
    EXPECT_GT(d->merges, thinned);
    EXPECT_EQ(idx->Size(), 0u);
    EXPECT_EQ(internal::fastfair::Height(idx.get()), 1);
  }
  fftest::PoolGuard g("merge_below_bad");
  std::unique_ptr<Index> idx;
  Options o = fftest::MakeOptions(g.path, KeyKind::kU64, ValueKind::kU64, 256);
  o.params["merge_below"] = "-1";
  EXPECT_TRUE(OpenIndex("fastfair", o, &idx).IsInvalidArgument());
}

// The public wrapper stored raw values in the compared pointer slot: equal
// neighbouring values hid records, and duplicates were accepted.
TEST(FastFair, EqualNeighbourValuesAndDuplicatesAreHandled) {
  fftest::PoolGuard g("equal");
  std::unique_ptr<Index> idx;
  ASSERT_TRUE(OpenIndex("fastfair", fftest::MakeOptions(g.path, KeyKind::kU64, ValueKind::kU64, 256), &idx).ok());
  for (uint64_t i = 0; i < 2000; i++) ASSERT_TRUE(idx->Insert(U64(i * 2), U64(i % 2 ? 0 : 5)).ok());
  for (uint64_t i = 0; i < 2000; i++) EXPECT_TRUE(idx->Insert(U64(i * 2), U64(9)).IsAlreadyExists());
  // Insert between equal-valued neighbours; remove some.
  for (uint64_t i = 0; i < 2000; i += 2) ASSERT_TRUE(idx->Insert(U64(i * 2 + 1), U64(5)).ok());
  for (uint64_t i = 0; i < 2000; i += 5) ASSERT_TRUE(idx->Remove(U64(i * 2)).ok());
  ASSERT_TRUE(idx->Check().ok()) << idx->Check().ToString();
  uint64_t expect = 0;
  for (uint64_t i = 0; i < 2000; i++) {
    std::string v;
    if (i % 5) {
      ASSERT_TRUE(idx->Find(U64(i * 2), &v).ok()) << i;
      EXPECT_EQ(SliceToU64(v), i % 2 ? 0u : 5u);
      expect++;
    } else {
      EXPECT_TRUE(idx->Find(U64(i * 2), &v).IsNotFound());
    }
    if (i % 2 == 0) {
      ASSERT_TRUE(idx->Find(U64(i * 2 + 1), &v).ok());
      EXPECT_EQ(SliceToU64(v), 5u);
      expect++;
    }
  }
  EXPECT_EQ(idx->Size(), expect);
  // Key 0 and UINT64_MAX (slot-0 sentinel collisions).
  ASSERT_TRUE(idx->Insert(U64(~0ull), U64(1)).ok());
  std::string v;
  ASSERT_TRUE(idx->Find(U64(0), &v).IsNotFound());
  ASSERT_TRUE(idx->Insert(U64(0), U64(0)).ok());
  ASSERT_TRUE(idx->Find(U64(0), &v).ok());
  ASSERT_TRUE(idx->Find(U64(~0ull), &v).ok());
  ASSERT_TRUE(idx->Check().ok());
}

// FAST flushes a line only when the shift crosses into the next one, and
// remove flushes on that condition too (the anchored "remove flushed on the
// wrong condition" pitfall): count the lines of single operations.
TEST(FastFair, FlushCountsOfShifts) {
  fftest::PoolGuard g("flush");
  std::unique_ptr<Index> idx;
  ASSERT_TRUE(OpenIndex("fastfair", fftest::MakeOptions(g.path, KeyKind::kU64, ValueKind::kU64, 512), &idx).ok());
  const int cap = internal::fastfair::NodeCapacity(idx.get());
  ASSERT_EQ(cap, 26);
  // Records 0..19 at even keys: slots 0..19, 4 per line; slot 0-1 share line 1
  // of the node with the header tail (records start at byte 96).
  for (uint64_t i = 0; i < 20; i++) ASSERT_TRUE(idx->Insert(U64(100 + 2 * i), U64(i)).ok());
  auto lines = [&](auto&& op) {
    pm::ResetThreadCounters();
    op();
    return pm::ThreadCounters().lines_flushed;
  };
  // Record i sits at byte 96 + 16 i: line (96 + 16 i) / 64.
  auto line_of = [](int slot) { return uint64_t((96 + 16 * slot) / 64); };
  auto fences = [&](auto&& op) {
    pm::ResetThreadCounters();
    op();
    return pm::ThreadCounters().fences;
  };
  // Append (slot 20): the record and the two copies past it (I2: slots
  // 20-22, lines 6-7) and count, under one fence.
  EXPECT_EQ(lines([&] { ASSERT_TRUE(idx->Insert(U64(1000), U64(1)).ok()); }), 3u);
  EXPECT_EQ(fences([&] { ASSERT_TRUE(idx->Insert(U64(1002), U64(1)).ok()); }), 1u);
  // Remove the last record (format 3): the copy behind it, then its key
  // become ignored copies of the left key, then count. Slot 21: its copy
  // at slot 22 is on the next line, persisted first (3 lines); slot 20:
  // the copy shares its line (2 lines, one fence).
  EXPECT_EQ(lines([&] { ASSERT_TRUE(idx->Remove(U64(1002)).ok()); }), 3u);
  EXPECT_EQ(fences([&] { ASSERT_TRUE(idx->Remove(U64(1000)).ok()); }), 1u);
  // Insert at slot 0 with 20 records: the copies past the end are in place;
  // count; the copy at slot 22 (line 7); then every line from slot 20 down
  // to slot 0, each once.
  EXPECT_EQ(lines([&] { ASSERT_TRUE(idx->Insert(U64(1), U64(1)).ok()); }), 1 + 1 + line_of(20) - line_of(0) + 1);
  // Remove slot 0 of 21: the commit line and every line the shift stores to
  // (slots 0..19), each once, then count.
  EXPECT_EQ(lines([&] { ASSERT_TRUE(idx->Remove(U64(1)).ok()); }), line_of(19) - line_of(0) + 1 + 1);
  // Insert at slot 0 again: now the copies past the end are in place; count
  // and the copy at slot 22, then the shift's lines. The node was in delete
  // mode; format 3 does not fence the count on its own even then.
  EXPECT_EQ(lines([&] { ASSERT_TRUE(idx->Insert(U64(1), U64(1)).ok()); }), 1 + 1 + line_of(20) - line_of(0) + 1);
  // Insert at slot 0 in insert mode (21 records): the count is flushed with
  // the shift's last line and shares its fence: one fence per line of the
  // shift (slots 21..0), none of its own (format 2; docs/fastfair.md).
  EXPECT_EQ(fences([&] { ASSERT_TRUE(idx->Insert(U64(3), U64(1)).ok()); }), line_of(21) - line_of(0) + 1);
  ASSERT_TRUE(idx->Remove(U64(3)).ok());
  ASSERT_TRUE(idx->Remove(U64(1)).ok());
  // Remove in the middle (slot 10 of 20): lines of slots 10..18, then
  // count, which shares the last line's fence (format 3).
  EXPECT_EQ(lines([&] { ASSERT_TRUE(idx->Remove(U64(120)).ok()); }), line_of(18) - line_of(10) + 1 + 1);
  EXPECT_EQ(fences([&] { ASSERT_TRUE(idx->Remove(U64(122)).ok()); }), line_of(17) - line_of(10) + 1);
  // An update is one line.
  EXPECT_EQ(lines([&] { ASSERT_TRUE(idx->Update(U64(100), U64(3)).ok()); }), 1u);
  ASSERT_TRUE(idx->Check().ok());
}

// Format 4: a merge whose left node's lk prefix leaves too little room
// behind its records moves them to the front first (DropPrefix). A
// shuffled load (left inserts, centred siblings), then removes that
// underfill leaves; contents, Check and the leak check all along.
TEST(FastFair, MergesDropPrefixesWhenShort) {
  uint64_t drops = 0;
  for (const int ns : {256, 512}) {
    fftest::PoolGuard g("dropprefix");
    Options o = fftest::MakeOptions(g.path, KeyKind::kU64, ValueKind::kU64, ns);
    std::unique_ptr<Index> idx;
    ASSERT_TRUE(OpenIndex("fastfair", o, &idx).ok());
    std::vector<uint64_t> ids(4000);
    for (uint64_t i = 0; i < ids.size(); i++) ids[i] = i * 7 + 3;
    std::mt19937_64 rng(ns);
    std::shuffle(ids.begin(), ids.end(), rng);
    std::map<uint64_t, uint64_t> model;
    for (uint64_t k : ids) {
      ASSERT_TRUE(idx->Insert(U64(k), U64(k + 1)).ok());
      model[k] = k + 1;
    }
    std::shuffle(ids.begin(), ids.end(), rng);
    for (size_t i = 0; i < ids.size() * 9 / 10; i++) {
      ASSERT_TRUE(idx->Remove(U64(ids[i])).ok());
      model.erase(ids[i]);
      if (i % 500 == 0) {
        ASSERT_TRUE(idx->Check().ok()) << idx->Check().ToString();
        ASSERT_TRUE(fftest::NoLeak(idx.get()));
      }
    }
    for (auto& [k, v] : model) {
      std::string got;
      ASSERT_TRUE(idx->Find(U64(k), &got).ok());
      ASSERT_EQ(got, U64(v));
    }
    EXPECT_EQ(idx->Size(), model.size());
    ASSERT_TRUE(idx->Check().ok());
    EXPECT_TRUE(fftest::NoLeak(idx.get()));
    auto* d = internal::fastfair::GetDebugCounters(idx.get());
    std::printf("ns %d: left inserts %llu, splits behind a prefix %llu, merges %llu, prefixes dropped %llu\n", ns,
                (unsigned long long)d->left_inserts, (unsigned long long)d->prefix_splits,
                (unsigned long long)d->merges, (unsigned long long)d->prefix_drops);
    EXPECT_GT(d->left_inserts, 0u);
    EXPECT_GT(d->prefix_splits, 0u);
    EXPECT_GT(d->merges, 0u);
    drops += d->prefix_drops;
  }
  EXPECT_GT(drops, 0u);
}

// An ascending load splits on appends, which do not centre the new sibling
// (no insert of such a load ever goes into a prefix): leaves stay half
// full. Centring them too would leave every leaf of this load with a third
// of its records (the cut node keeps its prefix).
TEST(FastFair, AscendingLoadsKeepHalfFullLeaves) {
  for (const int ns : {256, 512}) {
    fftest::PoolGuard g("ascending");
    Options o = fftest::MakeOptions(g.path, KeyKind::kU64, ValueKind::kU64, ns);
    std::unique_ptr<Index> idx;
    ASSERT_TRUE(OpenIndex("fastfair", o, &idx).ok());
    const uint64_t n = 20000;
    for (uint64_t k = 1; k <= n; k++) ASSERT_TRUE(idx->Insert(U64(k), U64(k)).ok());
    uint64_t blocks = 0;
    ASSERT_TRUE(idx->ForEachOwnedBlock([&](uint64_t) { blocks++; }).ok());
    const uint64_t cap = internal::fastfair::NodeCapacity(idx.get());
    // Leaves of cap/2 records, internal nodes of cap/2 children (a quarter
    // more at 256 bytes), the root object: 4799 blocks at 256 bytes (8300
    // with a third of a leaf used).
    EXPECT_LE(blocks, n / (cap / 2) * 13 / 10 + 8) << "node size " << ns;
    auto* d = internal::fastfair::GetDebugCounters(idx.get());
    EXPECT_EQ(d->prefix_splits, 0u);
    EXPECT_EQ(d->left_inserts, 0u);
    ASSERT_TRUE(idx->Check().ok());
  }
}

TEST(FastFair, AverageLinesPerInsertAndDelete) {
  fftest::PoolGuard g("avg");
  std::unique_ptr<Index> idx;
  Options o = fftest::MakeOptions(g.path, KeyKind::kU64, ValueKind::kU64, 512);
  o.pool_size = 64ull << 20;
  ASSERT_TRUE(OpenIndex("fastfair", o, &idx).ok());
  std::mt19937_64 rng(7);
  std::vector<uint64_t> keys(100000);
  for (auto& k : keys) k = rng();
  pm::ResetThreadCounters();
  for (uint64_t k : keys) ASSERT_TRUE(idx->Insert(U64(k), U64(k)).ok());
  double ins = double(pm::ThreadCounters().lines_flushed) / keys.size();
  pm::ResetThreadCounters();
  for (size_t i = 0; i < keys.size(); i += 2) ASSERT_TRUE(idx->Remove(U64(keys[i])).ok());
  double del = double(pm::ThreadCounters().lines_flushed) / (keys.size() / 2);
  std::printf("lines flushed per insert %.2f, per delete %.2f (100K random u64 keys, 512-byte nodes)\n", ins, del);
  // FAST bound: at most every line of a node + count + copy + a split's share.
  EXPECT_LT(ins, 12.0);
  EXPECT_LT(del, 10.0);
  ASSERT_TRUE(idx->Check().ok());
}

// Open does no work proportional to the tree: the index part of Open makes
// the same PM stores and flushes for 1K and for 100K (PMINDEX_LONG: 1M)
// records, and no node is repaired until a writer touches it.
TEST(FastFair, OpenIsConstantWork) {
  const bool long_run = std::getenv("PMINDEX_LONG") != nullptr;
  uint64_t stores[2], lines_[2];
  double secs[2];
  int i = 0;
  for (uint64_t n : {uint64_t(1000), uint64_t(long_run ? 1000000 : 100000)}) {
    fftest::PoolGuard g("open");
    Options o = fftest::MakeOptions(g.path, KeyKind::kU64, ValueKind::kU64, 512);
    o.pool_size = 128ull << 20;
    std::unique_ptr<Index> idx;
    ASSERT_TRUE(OpenIndex("fastfair", o, &idx).ok());
    for (uint64_t k = 0; k < n; k++) ASSERT_TRUE(idx->Insert(U64(k * 0x9E3779B97F4A7C15ull), U64(k)).ok());
    idx.reset();
    ASSERT_TRUE(OpenIndex("fastfair", o, &idx).ok());
    auto* d = internal::fastfair::GetDebugCounters(idx.get());
    ASSERT_NE(d, nullptr);
    EXPECT_EQ(d->nodes_repaired, 0u);
    stores[i] = d->open_pm_stores;
    lines_[i] = d->open_pm_lines;
    secs[i] = idx->Stats().recovery_seconds;
    std::string v;
    ASSERT_TRUE(idx->Find(U64((n - 1) * 0x9E3779B97F4A7C15ull), &v).ok());
    EXPECT_EQ(d->nodes_repaired, 0u) << "readers do not repair";
    i++;
  }
  EXPECT_EQ(stores[0], stores[1]);
  EXPECT_EQ(lines_[0], lines_[1]);
  EXPECT_LE(stores[1], 4u);
  std::printf("index open: %.1f us at 1K records, %.1f us at %s records\n", secs[0] * 1e6, secs[1] * 1e6,
              long_run ? "1M" : "100K");
}

// An operation run by a thread_local's destructor at thread exit (thread
// exit order: thread_local destructors run in the reverse order of
// construction, this one is built before the thread's first operation). It
// must still find or get an epoch slot, and every slot must come back: the
// tree's epoch manager (kit/epoch.h, unbounded) then keeps reusing one or
// two slots over 600 sequential threads, while a slot not given back at exit
// makes its slot count grow with every thread.
Index* g_exit_idx = nullptr;
struct FindAtThreadExit {
  bool armed = false;
  ~FindAtThreadExit() {
    if (!armed) return;
    std::string v;
    EXPECT_TRUE(g_exit_idx->Find(U64(1), &v).ok());
  }
};
TEST(FastFair, OperationsInThreadExitReleaseTheirEpochSlot) {
  fftest::PoolGuard g("tlsexit");
  std::unique_ptr<Index> idx;
  ASSERT_TRUE(OpenIndex("fastfair", fftest::MakeOptions(g.path, KeyKind::kU64, ValueKind::kU64), &idx).ok());
  ASSERT_TRUE(idx->Insert(U64(1), U64(2)).ok());
  g_exit_idx = idx.get();
  for (int i = 0; i < 600; i++) {
    std::thread t([&] {
      thread_local FindAtThreadExit late;  // constructed before the releaser
      late.armed = true;
      std::string v;
      EXPECT_TRUE(idx->Find(U64(1), &v).ok());
    });
    t.join();
  }
  // The slots came back (the tree's manager is the only live one).
  for (uint32_t n : internal::EpochManager::LiveSlotCounts()) EXPECT_LE(n, 2u);
  std::string v;
  EXPECT_TRUE(idx->Find(U64(1), &v).ok());
  g_exit_idx = nullptr;
}

}  // namespace
