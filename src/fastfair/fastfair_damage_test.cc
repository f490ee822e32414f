// fastfair_damage_test: the FAST & FAIR tree (src/fastfair) on pools that a
// crash or damage left in an unusual state, patched by hand: older format
// versions refused, a durable count that lags its records (Pushed), links
// that form cycles or skip levels (bounded walks: Corrupt, never a hang),
// key/value blocks whose length points outside the pool (bounds-checked
// reads: Corrupt, never a read outside the pool), and Check's test for
// ignored slots in repaired nodes.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <string>

#include "kit/test_watchdog.h"
#include "fastfair/fastfair.h"
#include "fastfair/fastfair_test_util.h"
#include "pmindex/index.h"
#include "pmindex/pm/persist.h"
#include "pmindex/pm/pool.h"

namespace {

using namespace pmindex;
using fftest::U64;

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
// message naming the version and the ones this build opens
// (docs/fastfair.md, "Format version"); a number no build wrote is
// Corrupt; versions 4 and 5 open and keep their records, and a read-write
// open raises version 4 to 5.
TEST(FastFair, OlderFormatVersionsAreRefused) {
  for (uint32_t version : {1u, 2u, 3u, 4u, 5u, 6u}) {
    SCOPED_TRACE("version " + std::to_string(version));
    fftest::PoolGuard g("v" + std::to_string(version));
    Options o = fftest::MakeOptions(g.path, KeyKind::kU64, ValueKind::kU64, 512);
    std::unique_ptr<Index> idx;
    ASSERT_TRUE(OpenIndex("fastfair", o, &idx).ok());
    for (uint64_t i = 0; i < 20; i++) ASSERT_TRUE(idx->Insert(U64(100 + 2 * i), U64(i)).ok());
    idx.reset();
    PatchPool(g.path, MetaVersion, version);
    Status st = OpenIndex("fastfair", o, &idx);
    if (version == 4 || version == 5) {
      ASSERT_TRUE(st.ok()) << st.ToString();
      for (uint64_t i = 0; i < 20; i++) {
        std::string v;
        EXPECT_TRUE(idx->Find(U64(100 + 2 * i), &v).ok());
        EXPECT_EQ(v, U64(i));
      }
      EXPECT_TRUE(idx->Check().ok());
      uint32_t now;
      std::memcpy(&now, idx->pool()->base() + *idx->pool()->root_slot() + 8, 4);
      EXPECT_EQ(now, 5u);
      continue;
    }
    if (version < 4) EXPECT_TRUE(st.IsUnsupported()) << st.ToString();
    else EXPECT_TRUE(st.IsCorrupt()) << st.ToString();
    EXPECT_NE(st.ToString().find("unsupported fastfair format version " + std::to_string(version)), std::string::npos)
        << st.ToString();
    EXPECT_NE(st.ToString().find("opens versions 4 to 5"), std::string::npos) << st.ToString();
  }
}

// A version-4 pool predates the block retire list (Meta::blocks, +72): one
// whose word is set is no pool any build wrote.
TEST(FastFair, Version4WithABlockRetireListIsCorrupt) {
  fftest::PoolGuard g("v4blocks");
  Options o = fftest::MakeOptions(g.path, KeyKind::kBytes, ValueKind::kBytes, 512);
  std::unique_ptr<Index> idx;
  ASSERT_TRUE(OpenIndex("fastfair", o, &idx).ok());
  ASSERT_TRUE(idx->Insert("a", "b").ok());
  idx.reset();
  PatchPool(g.path, MetaVersion, 4);
  Status st = OpenIndex("fastfair", o, &idx);
  EXPECT_TRUE(st.IsCorrupt()) << st.ToString();
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

// A key or value block whose length word points past the end of the pool:
// reads are bounds-checked (kit/pm_block.h), so Find (a damaged value),
// Scan and Check answer Corrupt and nothing is read outside the pool. A
// Find whose key block is damaged compares against an empty key (the
// comparison has no error channel) and may answer NotFound; Check names
// the block. Unchecked, Find and Scan copy about 4 GiB from the pool's
// mapping (a fault past its end) and Check passes.
TEST(FastFair, BlockLengthOutsideThePoolIsCorrupt) {
  for (const bool damage_key : {false, true}) {
    SCOPED_TRACE(damage_key ? "key block" : "value block");
    fftest::PoolGuard g("badblock");
    Options o = fftest::MakeOptions(g.path, KeyKind::kBytes, ValueKind::kBytes, 512);
    o.pool_size = o.max_pool_size = 8ull << 20;
    {
      std::unique_ptr<Index> idx;
      ASSERT_TRUE(OpenIndex("fastfair", o, &idx).ok());
      for (const char* k : {"alpha", "beta", "gamma"}) ASSERT_TRUE(idx->Insert(k, std::string(k) + "-value").ok());
    }
    std::string victim;
    {
      std::unique_ptr<pm::Pool> pool;
      ASSERT_TRUE(pm::Pool::Open(g.path, "fastfair", pm::PoolOptions{}, &pool).ok());
      char* const base = pool->base();
      char* const meta = base + *pool->root_slot();
      char* const leaf = base + *reinterpret_cast<uint64_t*>(meta + 64);  // Meta::root (one leaf)
      const uint64_t lk = *reinterpret_cast<uint64_t*>(leaf + 80);
      const auto* ents = reinterpret_cast<const uint64_t*>(leaf + 96);  // (k, v) pairs
      uint32_t j = 0;
      while (ents[2 * j] == lk) j++;  // past the lk prefix: the first record
      const uint64_t kw = ents[2 * j], vw = ents[2 * j + 1];
      victim.assign(base + kw + 4, *reinterpret_cast<uint32_t*>(base + kw));  // {u32 len, bytes}
      pm::StorePersist(reinterpret_cast<uint32_t*>(base + (damage_key ? kw : vw)), uint32_t(0xFFFFFFF0u));
    }
    std::unique_ptr<Index> idx;
    ASSERT_TRUE(OpenIndex("fastfair", o, &idx).ok());
    std::string v;
    Status s = idx->Find(victim, &v);
    if (!damage_key) EXPECT_TRUE(s.IsCorrupt()) << "Find: " << s.ToString();
    else EXPECT_TRUE(s.IsNotFound() || s.IsCorrupt()) << "Find: " << s.ToString();
    size_t n = 0;
    s = idx->Scan(std::string(1, '\0'), 10, [](Slice, Slice) { return true; }, &n);
    EXPECT_TRUE(s.IsCorrupt()) << "Scan: " << s.ToString();
    s = idx->Check();
    EXPECT_TRUE(s.IsCorrupt()) << "Check: " << s.ToString();
    EXPECT_NE(s.ToString().find("out of range"), std::string::npos) << s.ToString();
  }
}

}  // namespace
