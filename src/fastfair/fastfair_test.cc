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

// Patches a u32 of a closed fastfair pool: `at(base, meta)` returns its
// address (Meta is the root object: version at +8, the tree root at +64; a
// node's count at +16).
void PatchPool(const std::string& path, const std::function<uint32_t*(char*, char*)>& at, uint32_t value) {
  std::unique_ptr<pm::Pool> pool;
  ASSERT_TRUE(pm::Pool::Open(path, "fastfair", pm::PoolOptions{}, &pool).ok());
  char* meta = pool->base() + *pool->root_slot();
  pm::StorePersist(at(pool->base(), meta), value);
}
uint32_t* MetaVersion(char*, char* meta) { return reinterpret_cast<uint32_t*>(meta + 8); }
uint32_t* RootCount(char* base, char* meta) {
  return reinterpret_cast<uint32_t*>(base + *reinterpret_cast<uint64_t*>(meta + 64) + 16);
}

// Pools of the older format versions 1-3 are refused: Unsupported, with a
// message naming the version and the one this build opens
// (docs/fastfair.md, "Format version"); a number no build wrote is
// Corrupt; version 4 opens and keeps its records.
TEST(FastFair, OlderFormatVersionsAreRefused) {
  for (uint32_t version : {1u, 2u, 3u, 4u, 5u}) {
    SCOPED_TRACE("version " + std::to_string(version));
    fftest::PoolGuard g("v" + std::to_string(version));
    Options o = fftest::MakeOptions(g.path, KeyKind::kU64, ValueKind::kU64, 512);
    std::unique_ptr<Index> idx;
    ASSERT_TRUE(OpenIndex("fastfair", o, &idx).ok());
    for (uint64_t i = 0; i < 20; i++) ASSERT_TRUE(idx->Insert(U64(100 + 2 * i), U64(i)).ok());
    idx.reset();
    PatchPool(g.path, MetaVersion, version);
    Status st = OpenIndex("fastfair", o, &idx);
    if (version == 4) {
      ASSERT_TRUE(st.ok()) << st.ToString();
      for (uint64_t i = 0; i < 20; i++) {
        std::string v;
        EXPECT_TRUE(idx->Find(U64(100 + 2 * i), &v).ok());
        EXPECT_EQ(v, U64(i));
      }
      EXPECT_TRUE(idx->Check().ok());
      continue;
    }
    if (version < 4) EXPECT_TRUE(st.IsUnsupported()) << st.ToString();
    else EXPECT_TRUE(st.IsCorrupt()) << st.ToString();
    EXPECT_NE(st.ToString().find("unsupported fastfair format version " + std::to_string(version)), std::string::npos)
        << st.ToString();
    EXPECT_NE(st.ToString().find("opens version 4"), std::string::npos) << st.ToString();
  }
}

// A crash that kept a shrunk or grown count but none of the records it goes
// with (format 3: the count shares the shift's last fence), made by patching
// the count of a closed one-leaf pool: the record past the durable count is
// counted (Pushed) by readers of a read-only open and of a read-write open
// before any repair, and by the first writer (counts_repaired), in insert
// mode and in delete mode.
// The model's records are found with their values, Size and a scan count
// them, Check and the leak check pass.
void VerifyModel(Index* idx, const std::map<std::string, std::string>& model) {
  for (auto& [k, v] : model) {
    std::string got;
    EXPECT_TRUE(idx->Find(k, &got).ok());
    EXPECT_EQ(got, v);
  }
  EXPECT_EQ(idx->Size(), model.size());
  size_t n = 0;
  EXPECT_TRUE(idx->Scan(U64(0), 100, [&](Slice, Slice) { return true; }, &n).ok());
  EXPECT_EQ(n, model.size());
  EXPECT_TRUE(idx->Check().ok());
  EXPECT_TRUE(fftest::NoLeak(idx));
}

// Opens o's pool read-only and runs verify, then read-write and runs verify
// again; returns the read-write index (null if an open failed).
std::unique_ptr<Index> OpenReadOnlyThenWritable(const Options& o, const std::function<void(Index*)>& verify) {
  Options ro = o;
  ro.read_only = true;
  std::unique_ptr<Index> idx;
  Status s = OpenIndex("fastfair", ro, &idx);
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (!s.ok()) return nullptr;
  verify(idx.get());
  idx.reset();
  s = OpenIndex("fastfair", o, &idx);
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (!s.ok()) return nullptr;
  verify(idx.get());
  return idx;
}

TEST(FastFair, LaggingCountAfterCrashIsCounted) {
  for (const bool delete_mode : {false, true}) {
    SCOPED_TRACE(delete_mode ? "delete mode" : "insert mode");
    fftest::PoolGuard g("lag");
    Options o = fftest::MakeOptions(g.path, KeyKind::kU64, ValueKind::kU64, 512);
    std::map<std::string, std::string> model;
    {
      std::unique_ptr<Index> idx;
      ASSERT_TRUE(OpenIndex("fastfair", o, &idx).ok());
      for (uint64_t i = 0; i < 20; i++) {
        ASSERT_TRUE(idx->Insert(U64(100 + 2 * i), U64(i)).ok());
        model[U64(100 + 2 * i)] = U64(i);
      }
      if (delete_mode) {  // the last record goes: sw odd, count 19
        ASSERT_TRUE(idx->Remove(U64(138)).ok());
        model.erase(U64(138));
      }
    }
    // The durable count lags by one: the last record sits past it.
    PatchPool(g.path, RootCount, uint32_t(model.size() - 1));
    auto verify = [&](Index* idx) { VerifyModel(idx, model); };
    std::unique_ptr<Index> idx = OpenReadOnlyThenWritable(o, verify);
    ASSERT_TRUE(idx);
    ASSERT_TRUE(idx->Insert(U64(1), U64(7)).ok());
    model[U64(1)] = U64(7);
    EXPECT_EQ(internal::fastfair::GetDebugCounters(idx.get())->counts_repaired, 1u);
    verify(idx.get());
  }
}

// Format 4: the same lag behind an lk prefix. The crash state of a removal
// of the first of two records of a leaf behind a prefix (docs/fastfair.md,
// "Windows"): k[2] = lk committed the removal of A, the shift moved B into
// slot 2 only in the cache, the shrunk count 3 is durable. B sits past the
// count with lk in the slot before it; lk (raised by FixLk, as u64 lk can
// be) sorts above B, so a rule comparing B with that "left key" (format 3
// does so except at count 1) loses B. Made by patching a closed one-leaf
// pool; read-only and read-write opens and the first writer must count B.
TEST(FastFair, LaggingCountBehindPrefixIsCounted) {
  fftest::PoolGuard g("lagprefix");
  Options o = fftest::MakeOptions(g.path, KeyKind::kU64, ValueKind::kU64, 512);
  {
    std::unique_ptr<Index> idx;
    ASSERT_TRUE(OpenIndex("fastfair", o, &idx).ok());
    ASSERT_TRUE(idx->Insert(U64(400), U64(4)).ok());
    ASSERT_TRUE(idx->Insert(U64(500), U64(5)).ok());
  }
  {
    std::unique_ptr<pm::Pool> pool;
    ASSERT_TRUE(pm::Pool::Open(g.path, "fastfair", pm::PoolOptions{}, &pool).ok());
    char* meta = pool->base() + *pool->root_slot();
    char* node = pool->base() + *reinterpret_cast<uint64_t*>(meta + 64);
    auto word = [&](size_t off, uint64_t v) { pm::StorePersist(reinterpret_cast<uint64_t*>(node + off), v); };
    const uint64_t lk = 1000;
    word(80, lk);  // lk
    const uint64_t ents[6][2] = {{lk, 0}, {lk, 0}, {lk, 4}, {500, 5}, {500, 5}, {500, 5}};
    for (int i = 0; i < 6; i++) {
      word(96 + 16 * i, ents[i][0]);
      word(96 + 16 * i + 8, ents[i][1]);
    }
    pm::StorePersist(reinterpret_cast<uint32_t*>(node + 16), uint32_t(3));  // count
  }
  std::map<std::string, std::string> model = {{U64(500), U64(5)}};
  auto verify = [&](Index* idx) {
    VerifyModel(idx, model);
    std::string got;
    EXPECT_TRUE(idx->Find(U64(400), &got).IsNotFound());
  };
  std::unique_ptr<Index> idx = OpenReadOnlyThenWritable(o, verify);
  ASSERT_TRUE(idx);
  ASSERT_TRUE(idx->Insert(U64(450), U64(7)).ok());  // repairs the leaf, then shifts left into its prefix
  EXPECT_EQ(internal::fastfair::GetDebugCounters(idx.get())->counts_repaired, 1u);
  EXPECT_EQ(internal::fastfair::GetDebugCounters(idx.get())->left_inserts, 1u);
  model[U64(450)] = U64(7);
  verify(idx.get());
}

// Bad input: a corrupt pool whose links make a walk go round forever (a
// sibling cycle, a child pointer to an ancestor, a node on the wrong level)
// makes reads return Corrupt in bounded time instead of spinning (the walk
// bounds, docs/fastfair.md "Bad input"). The pool is built by the index,
// closed, patched through the pool's bytes, reopened (read-only, then
// writable for the write). Fails (the watchdog exits) without the bounds:
// Find, Scan, Size and Check spun forever on each of these pools.
TEST(FastFair, CorruptLinksFailInBoundedTime) {
  enum Damage { kSiblingCycle, kChildIsAncestor, kLeafLevel };
  const char* const names[] = {"sibling cycle", "child pointer to the root", "leaf on level 5"};
  test::TestWatchdog wd;
  for (KeyKind kk : {KeyKind::kU64, KeyKind::kBytes}) {
    for (Damage d : {kSiblingCycle, kChildIsAncestor, kLeafLevel}) {
      const std::string what = std::string(names[d]) + (kk == KeyKind::kU64 ? ", u64 keys" : ", byte keys");
      SCOPED_TRACE(what);
      wd.Arm("CorruptLinksFailInBoundedTime: " + what, 120);
      fftest::PoolGuard g("corruptlinks");
      Options o = fftest::MakeOptions(g.path, kk, ValueKind::kU64, 512);
      o.pool_size = o.max_pool_size = 8ull << 20;  // walk bound: 16Ki nodes
      auto key = [&](uint64_t i) {
        if (kk == KeyKind::kU64) return U64(i);
        char b[16];
        std::snprintf(b, sizeof b, "k%06llu", static_cast<unsigned long long>(i));
        return std::string(b);
      };
      const uint64_t n = 3000;  // ~150 leaves of 26 slots: height 3
      std::string bad_key;      // a key whose walk goes round the damage
      {
        std::unique_ptr<Index> idx;
        ASSERT_TRUE(OpenIndex("fastfair", o, &idx).ok());
        for (uint64_t i = 1; i <= n; i++) ASSERT_TRUE(idx->Insert(key(i), U64(i)).ok());
        ASSERT_TRUE(idx->Check().ok());
      }
      {
        std::unique_ptr<pm::Pool> pool;
        ASSERT_TRUE(pm::Pool::Open(g.path, "fastfair", pm::PoolOptions{}, &pool).ok());
        char* const base = pool->base();
        char* const meta = base + *pool->root_slot();
        // Node words (fastfair.cc Node): sibling 0, high 8, count 16,
        // level 20, low 64, leftmost 72.
        auto u64 = [](char* node, size_t off) { return reinterpret_cast<uint64_t*>(node + off); };
        char* const root = base + *u64(meta, 64);
        ASSERT_GE(*reinterpret_cast<uint32_t*>(root + 20), 2u);
        char* leaf0 = root;
        while (*reinterpret_cast<uint32_t*>(leaf0 + 20) > 0) leaf0 = base + *u64(leaf0, 72);
        char* const leaf1 = base + *u64(leaf0, 0);
        switch (d) {
          case kSiblingCycle: {
            // The second leaf links back to the first, with a high key at
            // its own low key: a key at or above it moves right forever.
            const uint64_t low = *u64(leaf1, 64);
            if (kk == KeyKind::kU64) bad_key = U64(low);
            else bad_key.assign(base + low + 4, *reinterpret_cast<uint32_t*>(base + low));  // {u32 len, bytes}
            pm::StorePersist(u64(leaf1, 8), low);
            pm::StorePersist(u64(leaf1, 0), uint64_t(leaf0 - base));
            break;
          }
          case kChildIsAncestor:
            pm::StorePersist(u64(root, 72), uint64_t(root - base));
            break;
          case kLeafLevel:
            pm::StorePersist(reinterpret_cast<uint32_t*>(leaf0 + 20), uint32_t(5));
            break;
        }
        if (d != kSiblingCycle) bad_key = key(1);  // on the leftmost path
      }
      for (const bool ro : {true, false}) {
        SCOPED_TRACE(ro ? "read-only" : "writable");
        Options oo = o;
        oo.read_only = ro;
        std::unique_ptr<Index> idx;
        Status s = OpenIndex("fastfair", oo, &idx);
        if (s.IsCorrupt()) continue;  // (an open that checks more would be fine too)
        ASSERT_TRUE(s.ok()) << s.ToString();
        std::string v;
        s = idx->Find(bad_key, &v);
        EXPECT_TRUE(s.IsCorrupt()) << "Find: " << s.ToString();
        s = idx->Find(key(n - 1), &v);  // a path the damage is not on
        EXPECT_TRUE(s.ok()) << "Find(n - 1): " << s.ToString();
        size_t count = 0;
        s = idx->Scan(key(1), ~size_t(0), [](Slice, Slice) { return true; }, &count);
        EXPECT_TRUE(s.IsCorrupt()) << "Scan: " << s.ToString() << " after " << count << " records";
        EXPECT_EQ(idx->Size(), 0u) << "Size: 0 when the leaf chain cannot be walked";
        s = idx->Check();
        EXPECT_TRUE(s.IsCorrupt()) << "Check: " << s.ToString();
        std::set<uint64_t> blocks;
        s = idx->ForEachOwnedBlock([&](uint64_t b) { blocks.insert(b); });
        EXPECT_TRUE(s.IsCorrupt()) << "ForEachOwnedBlock: " << s.ToString();
        if (!ro) {
          s = idx->Insert(bad_key, U64(1));
          EXPECT_TRUE(s.IsCorrupt()) << "Insert: " << s.ToString();
        }
      }
    }
  }
  wd.Disarm();
}

// Check rejects an ignored slot past the lk prefix of a node repaired in
// this run (the binary searches of Start and FindInLocked assume none),
// and accepts the same state in a node not yet repaired (a crash's
// half-done delete). Fails without Check's "ignored slot past its lk
// prefix" test: Size and Check's record count skip the slot alike.
TEST(FastFair, CheckRejectsIgnoredSlotInRepairedNode) {
  fftest::PoolGuard g("checkignored");
  Options o = fftest::MakeOptions(g.path, KeyKind::kU64, ValueKind::kU64, 512);
  auto corrupt_slot2 = [](Index* idx) {  // the root leaf: k[2] = k[1] (record 300 ignored)
    pm::Pool* pool = idx->pool();
    char* meta = pool->base() + *pool->root_slot();
    char* node = pool->base() + *reinterpret_cast<uint64_t*>(meta + 64);
    uint64_t* k1 = reinterpret_cast<uint64_t*>(node + 96 + 16);
    uint64_t* k2 = reinterpret_cast<uint64_t*>(node + 96 + 32);
    ASSERT_EQ(*k2, 300u);
    pm::StorePersist(k2, *k1);
  };
  {
    std::unique_ptr<Index> idx;
    ASSERT_TRUE(OpenIndex("fastfair", o, &idx).ok());
    for (uint64_t k = 100; k <= 500; k += 100) ASSERT_TRUE(idx->Insert(U64(k), U64(k + 1)).ok());
    ASSERT_TRUE(idx->Check().ok());
    corrupt_slot2(idx.get());  // in the node made (so repaired) in this run
    Status s = idx->Check();
    EXPECT_TRUE(s.IsCorrupt()) << s.ToString();
    EXPECT_NE(s.ToString().find("past its lk prefix"), std::string::npos) << s.ToString();
  }
  // Reopened: the node is not repaired in this run, so the ignored slot is
  // a legal crash state (a delete's commit); a writer's lock repairs it.
  std::unique_ptr<Index> idx;
  ASSERT_TRUE(OpenIndex("fastfair", o, &idx).ok());
  Status s = idx->Check();
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(idx->Size(), 4u);
  ASSERT_TRUE(idx->Insert(U64(250), U64(251)).ok());
  s = idx->Check();
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(idx->Size(), 5u);
  std::string v;
  EXPECT_TRUE(idx->Find(U64(300), &v).IsNotFound());
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
