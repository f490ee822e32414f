// NVC-Hashmap tests: differential against std::unordered_map (both key and
// value kinds, every erratum mode, bucket-table growth, reopen), parameters,
// crash images built with a DurableImage observer (the erratum scenario, the
// fault switches), deterministic interleavings through test hooks (a late
// in-place update, the find's value-then-mark read order), a failing bucket
// slot in the middle of an eager initialisation batch, operations from
// thread-exit destructors, and recovery after SIGKILL of a loading child.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <random>
#include <thread>
#include <unordered_map>

#include "kit/test_observer.h"
#include "nvc_hashmap/nvc_hashmap.h"
#include "nvc_hashmap/nvc_test_util.h"
#include "pmindex/pm/fault.h"
#include "testing/process.h"

namespace pmindex {
namespace {

using internal::kit::DurableImage;
using nvc_test::CrashHarness;
using nvc_test::ExpectNoLeak;
using nvc_test::g_pause;
using nvc_test::NeighbourKeys;
using nvc_test::PauseHook;
using nvc_test::PauseState;
using nvc_test::ReleaseAndJoin;
using nvc_test::WaitPaused;
using nvc_test::MakeKey;
using nvc_test::MakeValue;
using nvc_test::PoolFile;

Options Opts(const std::string& path, KeyKind kk, ValueKind vk, std::map<std::string, std::string> params = {}) {
  Options o;
  o.pool_path = path;
  o.pool_size = 32ull << 20;
  o.key_kind = kk;
  o.value_kind = vk;
  o.params = std::move(params);
  return o;
}

struct DiffCase {
  KeyKind kk;
  ValueKind vk;
  std::string fix;
  std::string na = "allocator";  // node_alloc
};

class Differential : public testing::TestWithParam<DiffCase> {};

TEST_P(Differential, RandomOpsMatchUnorderedMap) {
  const auto& p = GetParam();
  PoolFile pf("diff");
  // Few initial buckets: the table doubles many times during the run.
  Options o = Opts(pf.path, p.kk, p.vk, {{"erratum_fix", p.fix}, {"initial_buckets", "2"}, {"node_alloc", p.na}});
  std::unique_ptr<Index> idx;
  ASSERT_TRUE(OpenIndex("nvc_hashmap", o, &idx).ok());
  std::unordered_map<std::string, std::string> model;
  std::mt19937_64 rng(42 + int(p.kk) * 3 + int(p.vk));
  const uint64_t kKeys = 4000;
  std::string v;
  auto verify = [&] {
    Status c = idx->Check();
    ASSERT_TRUE(c.ok()) << c.ToString();
    ASSERT_EQ(idx->Size(), model.size());
    for (const auto& [k, val] : model) {
      ASSERT_TRUE(idx->Find(k, &v).ok());
      ASSERT_EQ(v, val);
    }
    ExpectNoLeak(idx.get());
  };
  for (int phase = 0; phase < 6; phase++) {
    for (int i = 0; i < 12000; i++) {
      const uint64_t id = rng() % kKeys;
      const std::string k = MakeKey(p.kk, id), val = MakeValue(p.vk, id, rng() % 1000);
      const bool present = model.count(k) != 0;
      switch (rng() % 6) {
        case 0:
        case 1: {
          Status s = idx->Insert(k, val);
          ASSERT_EQ(s.ok(), !present) << s.ToString();
          if (present) ASSERT_TRUE(s.IsAlreadyExists());
          else model[k] = val;
          break;
        }
        case 2: {
          Status s = idx->Update(k, val);
          ASSERT_EQ(s.ok(), present) << s.ToString();
          if (present) model[k] = val;
          else ASSERT_TRUE(s.IsNotFound());
          break;
        }
        case 3:
          ASSERT_TRUE(idx->Upsert(k, val).ok());
          model[k] = val;
          break;
        case 4: {
          Status s = idx->Remove(k);
          ASSERT_EQ(s.ok(), present) << s.ToString();
          model.erase(k);
          break;
        }
        case 5: {
          Status s = idx->Find(k, &v);
          ASSERT_EQ(s.ok(), present) << s.ToString();
          if (present) {
        ASSERT_EQ(v, model[k]);
      }
          break;
        }
      }
    }
    verify();
    if (phase % 2 == 1) {
      ASSERT_TRUE(idx->Close().ok());
      idx.reset();
      o.create_if_missing = false;
      Status s = OpenIndex("", o, &idx);
      ASSERT_TRUE(s.ok()) << s.ToString();
      EXPECT_EQ(idx->key_kind(), p.kk);
      EXPECT_EQ(idx->value_kind(), p.vk);
      EXPECT_EQ(idx->Stats().records, model.size());
      verify();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, Differential,
    testing::Values(DiffCase{KeyKind::kU64, ValueKind::kU64, "dirty_bit"}, DiffCase{KeyKind::kU64, ValueKind::kBytes, "dirty_bit"},
                    DiffCase{KeyKind::kBytes, ValueKind::kU64, "dirty_bit"}, DiffCase{KeyKind::kBytes, ValueKind::kBytes, "dirty_bit"},
                    DiffCase{KeyKind::kU64, ValueKind::kU64, "flush_on_read"}, DiffCase{KeyKind::kBytes, ValueKind::kBytes, "flush_on_read"},
                    DiffCase{KeyKind::kU64, ValueKind::kBytes, "none"},
                    DiffCase{KeyKind::kU64, ValueKind::kU64, "dirty_bit", "slab"}, DiffCase{KeyKind::kU64, ValueKind::kBytes, "dirty_bit", "slab"},
                    DiffCase{KeyKind::kBytes, ValueKind::kU64, "dirty_bit", "slab"}, DiffCase{KeyKind::kBytes, ValueKind::kBytes, "dirty_bit", "slab"},
                    DiffCase{KeyKind::kU64, ValueKind::kU64, "flush_on_read", "slab"}, DiffCase{KeyKind::kU64, ValueKind::kBytes, "none", "slab"}),
    [](const testing::TestParamInfo<DiffCase>& i) {
      return std::string(i.param.kk == KeyKind::kU64 ? "u64key_" : "byteskey_") + (i.param.vk == ValueKind::kU64 ? "u64val_" : "bytesval_") +
             i.param.fix + "_" + i.param.na;
    });

TEST(NvcHashmap, ParametersAreValidated) {
  PoolFile pf("params");
  std::unique_ptr<Index> idx;
  EXPECT_TRUE(OpenIndex("nvc_hashmap", Opts(pf.path, KeyKind::kU64, ValueKind::kU64, {{"erratum_fix", "sometimes"}}), &idx).IsInvalidArgument());
  EXPECT_TRUE(OpenIndex("nvc_hashmap", Opts(pf.path, KeyKind::kU64, ValueKind::kU64, {{"leaf_size", "8"}}), &idx).IsInvalidArgument());
  EXPECT_TRUE(OpenIndex("nvc_hashmap", Opts(pf.path, KeyKind::kU64, ValueKind::kU64, {{"initial_buckets", "3"}}), &idx).IsInvalidArgument());
  EXPECT_TRUE(OpenIndex("nvc_hashmap", Opts(pf.path, KeyKind::kU64, ValueKind::kU64, {{"load_factor", "0"}}), &idx).IsInvalidArgument());
  EXPECT_TRUE(OpenIndex("nvc_hashmap", Opts(pf.path, KeyKind::kU64, ValueKind::kU64, {{"node_alloc", "malloc"}}), &idx).IsInvalidArgument());
  EXPECT_FALSE(pm::Pool::Exists(pf.path)) << "a rejected create leaves no pool";
  ASSERT_TRUE(OpenIndex("nvc_hashmap", Opts(pf.path, KeyKind::kU64, ValueKind::kU64, {{"erratum_fix", "flush_on_read"}}), &idx).ok());
  IndexInfo info;
  ASSERT_TRUE(FindIndexInfo("nvc_hashmap", &info));
  EXPECT_FALSE(info.ordered);
  EXPECT_TRUE(info.persistent);
  std::string v;
  EXPECT_TRUE(idx->Scan(nvc_test::U64(1), 10, [](Slice, Slice) { return true; }).IsUnsupported());
  EXPECT_TRUE(idx->Insert("short", nvc_test::U64(1)).IsInvalidArgument());
  EXPECT_TRUE(idx->Insert(nvc_test::U64(1), "short").IsInvalidArgument());
  EXPECT_TRUE(idx->Find("toolongkey", &v).IsInvalidArgument());
  EXPECT_TRUE(idx->Remove("x").IsInvalidArgument());
}

TEST(NvcHashmap, CleanReopenIsInstantAndKeepsKinds) {
  for (std::string na : {"allocator", "slab"}) {
  SCOPED_TRACE(na);
  PoolFile pf("reopen");
  Options o = Opts(pf.path, KeyKind::kBytes, ValueKind::kBytes, {{"node_alloc", na}});
  std::unique_ptr<Index> idx;
  ASSERT_TRUE(OpenIndex("nvc_hashmap", o, &idx).ok());
  for (uint64_t i = 0; i < 20000; i++) ASSERT_TRUE(idx->Insert(MakeKey(KeyKind::kBytes, i), MakeValue(ValueKind::kBytes, i, 0)).ok());
  for (uint64_t i = 0; i < 20000; i += 4) ASSERT_TRUE(idx->Remove(MakeKey(KeyKind::kBytes, i)).ok());
  idx.reset();  // the destructor closes cleanly
  o.key_kind = KeyKind::kU64;  // an existing pool keeps its own kinds
  o.value_kind = ValueKind::kU64;
  o.params["node_alloc"] = na == "slab" ? "allocator" : "slab";  // and its node allocation
  ASSERT_TRUE(OpenIndex("nvc_hashmap", o, &idx).ok());
  EXPECT_EQ(idx->key_kind(), KeyKind::kBytes);
  EXPECT_FALSE(idx->pool()->recovered_from_crash());
  EXPECT_EQ(idx->Size(), 15000u);
  EXPECT_EQ(idx->Stats().recovery_seconds, 0.0) << "a clean open does not walk the list";
  ASSERT_TRUE(idx->Check().ok()) << idx->Check().ToString();
  std::string v;
  for (uint64_t i = 0; i < 20000; i++) {
    Status s = idx->Find(MakeKey(KeyKind::kBytes, i), &v);
    ASSERT_EQ(s.ok(), i % 4 != 0);
    if (s.ok()) {
        ASSERT_EQ(v, MakeValue(ValueKind::kBytes, i, 0));
      }
  }
  ExpectNoLeak(idx.get());
  }
}

// node_alloc selects how nodes are allocated: one allocator block each, or
// slots of a few 32 KiB slabs; reopening keeps the pool's own setting.
TEST(NvcHashmap, NodeAllocIsSelectableAndKept) {
  for (std::string na : {"allocator", "slab"}) {
    SCOPED_TRACE(na);
    PoolFile pf("nodealloc");
    Options o = Opts(pf.path, KeyKind::kU64, ValueKind::kU64, {{"node_alloc", na}});
    std::unique_ptr<Index> idx;
    ASSERT_TRUE(OpenIndex("nvc_hashmap", o, &idx).ok());
    for (int round = 0; round < 2; round++) {
      const uint64_t b0 = idx->pool()->allocator().BlocksInUse();
      for (uint64_t i = 0; i < 1000; i++) ASSERT_TRUE(idx->Insert(MakeKey(KeyKind::kU64, round * 1000 + i), nvc_test::U64(i)).ok());
      const uint64_t blocks = idx->pool()->allocator().BlocksInUse() - b0;
      if (na == "allocator") {
        EXPECT_GE(blocks, 1000u);
      } else {
        EXPECT_LE(blocks, 10u);
      }
      idx.reset();
      o.create_if_missing = false;
      o.params["node_alloc"] = na == "slab" ? "allocator" : "slab";  // ignored: the pool keeps its own
      ASSERT_TRUE(OpenIndex("", o, &idx).ok());
    }
    ASSERT_TRUE(idx->Check().ok()) << idx->Check().ToString();
    ExpectNoLeak(idx.get());
  }
}

// Format 4 (8-byte bucket slots, compact 32-byte u64 nodes, 256 thread
// slots): a pool of an older format is refused with a clear error, not
// misread. Version 3 included: three incompatible layouts were written as 3.
TEST(NvcHashmap, OlderFormatVersionIsRefused) {
  for (uint32_t old : {2u, 3u, 6u}) {
    SCOPED_TRACE(old);
    PoolFile pf("version");
    Options o = Opts(pf.path, KeyKind::kU64, ValueKind::kU64, {});
    std::unique_ptr<Index> idx;
    ASSERT_TRUE(OpenIndex("nvc_hashmap", o, &idx).ok());
    ASSERT_TRUE(idx->Insert(nvc_test::U64(1), nvc_test::U64(2)).ok());
    idx.reset();
    {
      std::unique_ptr<pm::Pool> p;
      pm::PoolOptions po;
      ASSERT_TRUE(pm::Pool::Open(pf.path, "", po, &p).ok());
      auto* version = reinterpret_cast<uint32_t*>(p->base() + *p->root_slot() + 8);  // Root::version
      ASSERT_EQ(*version, 5u);
      pm::Store(version, old);
      pm::Persist(version, 4);
      ASSERT_TRUE(p->Close().ok());
    }
    o.create_if_missing = false;
    Status s = OpenIndex("", o, &idx);
    EXPECT_TRUE(s.IsCorrupt()) << s.ToString();
    EXPECT_NE(s.ToString().find("unsupported format version " + std::to_string(old)), std::string::npos) << s.ToString();
  }
}

// A root block too small for the root object (a damaged pool, or another
// layout) is refused before any field past its end is read, even when the
// magic and version in its first bytes are right.
TEST(NvcHashmap, TooSmallRootBlockIsCorrupt) {
  PoolFile pf("smallroot");
  Options o = Opts(pf.path, KeyKind::kU64, ValueKind::kU64, {});
  std::unique_ptr<Index> idx;
  ASSERT_TRUE(OpenIndex("nvc_hashmap", o, &idx).ok());
  idx.reset();
  {
    std::unique_ptr<pm::Pool> p;
    pm::PoolOptions po;
    ASSERT_TRUE(pm::Pool::Open(pf.path, "", po, &p).ok());
    char head[16];
    std::memcpy(head, p->base() + *p->root_slot(), sizeof(head));  // magic, version, kinds
    p->allocator().Free(p->root_slot());
    ASSERT_TRUE(p->allocator().AllocateZeroed(p->root_slot(), sizeof(head)).ok());
    ASSERT_LT(p->allocator().UsableSize(*p->root_slot()), 1024u);
    pm::Copy(p->base() + *p->root_slot(), head, sizeof(head));
    pm::Persist(p->base() + *p->root_slot(), sizeof(head));
    ASSERT_TRUE(p->Close().ok());
  }
  o.create_if_missing = false;
  Status s = OpenIndex("", o, &idx);
  EXPECT_TRUE(s.IsCorrupt()) << s.ToString();
  EXPECT_NE(s.ToString().find("root block is smaller than the root object"), std::string::npos) << s.ToString();
}

// Version 4 is version 5 with 256 thread slots (root.max_threads and
// root.xslots 0): such a pool opens, works and keeps its version.
TEST(NvcHashmap, Version4PoolOpens) {
  PoolFile pf("v4");
  Options o = Opts(pf.path, KeyKind::kU64, ValueKind::kU64, {});
  std::unique_ptr<Index> idx;
  ASSERT_TRUE(OpenIndex("nvc_hashmap", o, &idx).ok());
  for (uint64_t i = 0; i < 1000; i++) ASSERT_TRUE(idx->Insert(MakeKey(KeyKind::kU64, i), nvc_test::U64(i)).ok());
  idx.reset();
  auto set_v4 = [&](bool crash) {
    std::unique_ptr<pm::Pool> p;
    pm::PoolOptions po;
    ASSERT_TRUE(pm::Pool::Open(pf.path, "", po, &p).ok());
    char* root = p->base() + *p->root_slot();
    auto* version = reinterpret_cast<uint32_t*>(root + 8);  // Root::version
    ASSERT_EQ(*version, 5u);
    auto* words = reinterpret_cast<uint64_t*>(root + 64 + 5 * 8);  // Root::max_threads, xslots
    ASSERT_EQ(words[0], 256u);
    ASSERT_EQ(words[1], 0u);
    pm::Store(version, 4u);
    pm::Store(&words[0], uint64_t(0));
    if (crash) pm::Store(reinterpret_cast<uint64_t*>(root + 64 + 2 * 8), uint64_t(0));  // Root::clean
    pm::Persist(root, 128);
    ASSERT_TRUE(p->Close().ok());
  };
  for (bool crash : {false, true}) {
    SCOPED_TRACE(crash);
    set_v4(crash);
    o.create_if_missing = false;
    ASSERT_TRUE(OpenIndex("", o, &idx).ok());
    EXPECT_EQ(idx->Stats().recovery_seconds > 0, crash);
    ASSERT_TRUE(idx->Check().ok()) << idx->Check().ToString();
    EXPECT_EQ(idx->Size(), 1000u);
    std::string v;
    ASSERT_TRUE(idx->Find(MakeKey(KeyKind::kU64, 7), &v).ok());
    ExpectNoLeak(idx.get());
    idx.reset();
    {
      std::unique_ptr<pm::Pool> p;
      pm::PoolOptions po;
      ASSERT_TRUE(pm::Pool::Open(pf.path, "", po, &p).ok());
      EXPECT_EQ(*reinterpret_cast<uint32_t*>(p->base() + *p->root_slot() + 8), 4u) << "a version 4 pool keeps its version";
      // back to version 5 for the next round's check of the words
      char* root = p->base() + *p->root_slot();
      pm::Store(reinterpret_cast<uint32_t*>(root + 8), 5u);
      pm::Store(reinterpret_cast<uint64_t*>(root + 64 + 5 * 8), uint64_t(256));
      pm::Persist(root, 128);
      ASSERT_TRUE(p->Close().ok());
    }
  }
}

// max_threads: the number of live threads that may use the index (a thread
// keeps its slot until it exits), fixed at creation. With 2: the test's
// thread takes one slot, a thread held inside an operation (the find hook)
// the other; one more gets Busy naming the parameter. More than the root's
// 256 slots work (slots beyond 256 live in their own block): 300 threads
// held inside an operation at once, each then inserting with allocator nodes
// (the pending-slot protocol in the extra slots); recovery of the pool is
// consistent and leak-free.
std::atomic<int> g_held{0};
std::atomic<int> g_hold_until{0};
void HoldHook(Slice) {
  g_held.fetch_add(1);
  while (g_held.load() < g_hold_until.load()) std::this_thread::yield();
}

TEST(NvcHashmap, MaxThreadsBoundsConcurrentOperations) {
  PoolFile pf("maxthr");
  std::unique_ptr<Index> idx;
  EXPECT_TRUE(OpenIndex("nvc_hashmap", Opts(pf.path, KeyKind::kU64, ValueKind::kU64, {{"max_threads", "0"}}), &idx).IsInvalidArgument());
  EXPECT_TRUE(OpenIndex("nvc_hashmap", Opts(pf.path, KeyKind::kU64, ValueKind::kU64, {{"max_threads", "65537"}}), &idx).IsInvalidArgument());
  Options o = Opts(pf.path, KeyKind::kU64, ValueKind::kU64, {{"max_threads", "2"}});
  ASSERT_TRUE(OpenIndex("nvc_hashmap", o, &idx).ok());
  const std::string k = nvc_test::U64(5);
  ASSERT_TRUE(idx->Insert(k, k).ok());
  for (int round = 0; round < 2; round++) {
    g_held = 0;
    g_hold_until = 2;  // the holder and the test's release
    nvc_hashmap_testing::SetFindHook(&HoldHook);
    std::string v;
    ASSERT_TRUE(idx->Find(nvc_test::U64(7), &v).IsNotFound());  // this thread takes its slot (no hook: not found)
    std::vector<std::thread> ts;
    ts.emplace_back([&] {
      std::string v2;
      EXPECT_TRUE(idx->Find(k, &v2).ok());
    });
    while (g_held.load() < 1) std::this_thread::yield();
    std::thread third([&] {
      Status s = idx->Insert(nvc_test::U64(6), k);
      EXPECT_TRUE(s.IsBusy()) << s.ToString();
      EXPECT_NE(s.ToString().find("max_threads"), std::string::npos) << s.ToString();
    });
    third.join();
    g_held.fetch_add(1);
    for (auto& t : ts) t.join();
    nvc_hashmap_testing::SetFindHook(nullptr);
    // The pool keeps its own max_threads.
    idx.reset();
    o.params = {{"max_threads", "100"}};
    o.create_if_missing = false;
    ASSERT_TRUE(OpenIndex("nvc_hashmap", o, &idx).ok());
  }
}

TEST(NvcHashmap, MoreThreadsThanTheRootsSlots) {
  const int n = 300;  // and the test's thread
  PoolFile pf("maxthr300");
  Options o = Opts(pf.path, KeyKind::kU64, ValueKind::kU64, {{"max_threads", std::to_string(n + 1)}, {"node_alloc", "allocator"}});
  std::unique_ptr<Index> idx;
  ASSERT_TRUE(OpenIndex("nvc_hashmap", o, &idx).ok());
  const std::string k = nvc_test::U64(1);
  ASSERT_TRUE(idx->Insert(k, k).ok());
  g_held = 0;
  g_hold_until = n;
  nvc_hashmap_testing::SetFindHook(&HoldHook);
  std::vector<std::thread> ts;
  for (int t = 0; t < n; t++) ts.emplace_back([&, t] {
    std::string v;
    EXPECT_TRUE(idx->Find(k, &v).ok());  // all n inside an operation at once
    const Status s = idx->Insert(nvc_test::U64(1000 + t), nvc_test::U64(t));
    EXPECT_TRUE(s.ok()) << s.ToString();
  });
  for (auto& t : ts) t.join();
  nvc_hashmap_testing::SetFindHook(nullptr);
  EXPECT_EQ(idx->Size(), uint64_t(n + 1));
  ASSERT_TRUE(idx->Check().ok()) << idx->Check().ToString();
  ExpectNoLeak(idx.get());
  // Recovery with the extra slots: reopen as after a crash.
  idx.reset();
  {
    std::unique_ptr<pm::Pool> p;
    pm::PoolOptions po;
    ASSERT_TRUE(pm::Pool::Open(pf.path, "", po, &p).ok());
    auto* clean = reinterpret_cast<uint64_t*>(p->base() + *p->root_slot() + 80);  // Root::clean
    pm::Store(clean, uint64_t(0));
    pm::Persist(clean, 8);
    ASSERT_TRUE(p->Close().ok());
  }
  o.create_if_missing = false;
  ASSERT_TRUE(OpenIndex("nvc_hashmap", o, &idx).ok());
  EXPECT_GT(idx->Stats().recovery_seconds, 0);
  ASSERT_TRUE(idx->Check().ok()) << idx->Check().ToString();
  ExpectNoLeak(idx.get());
  EXPECT_EQ(idx->Size(), uint64_t(n + 1));
}

// The growth check reads one shared count (each thread adds its delta every
// 64 inserts), not every thread slot: the table still doubles on time with
// several threads inserting.
TEST(NvcHashmap, TableGrowsFromTheSharedCount) {
  PoolFile pf("grow");
  std::unique_ptr<Index> idx;
  ASSERT_TRUE(OpenIndex("nvc_hashmap", Opts(pf.path, KeyKind::kU64, ValueKind::kU64, {{"initial_buckets", "2"}}), &idx).ok());
  const uint64_t per = 20000;
  std::vector<std::thread> ts;
  for (uint64_t t = 0; t < 2; t++) ts.emplace_back([&, t] {
    for (uint64_t i = 0; i < per; i++) EXPECT_TRUE(idx->Insert(MakeKey(KeyKind::kU64, t * per + i), nvc_test::U64(i)).ok());
  });
  for (auto& t : ts) t.join();
  // 40000 records at load factor 2: 20000 buckets' worth, doubled from 2
  // every time the count passed bc * 2 (checked every 64 inserts a thread).
  EXPECT_GE(nvc_hashmap_testing::BucketCount(idx.get()), 8192u);
  EXPECT_LE(nvc_hashmap_testing::BucketCount(idx.get()), 32768u);
  for (uint64_t i = 0; i < per; i++) ASSERT_TRUE(idx->Remove(MakeKey(KeyKind::kU64, i)).ok());
  EXPECT_EQ(idx->Size(), per);
  ASSERT_TRUE(idx->Check().ok()) << idx->Check().ToString();
}

// Slabs with no slot in use go back to the allocator when the index opens,
// after a clean close (from the bitmaps) and after a crash (from the
// recovery walk's per-slab bits).
TEST(NvcHashmap, EmptySlabsGoBackToTheAllocator) {
  for (bool crash : {false, true}) {
    SCOPED_TRACE(crash);
    PoolFile pf("emptyslab");
    Options o = Opts(pf.path, KeyKind::kU64, ValueKind::kU64, {});
    std::unique_ptr<Index> idx;
    ASSERT_TRUE(OpenIndex("nvc_hashmap", o, &idx).ok());
    const uint64_t before = idx->pool()->allocator().BytesInUse();
    const uint64_t n = 8000;  // 8 slabs of 1018 compact nodes
    for (uint64_t i = 0; i < n; i++) ASSERT_TRUE(idx->Insert(MakeKey(KeyKind::kU64, i), nvc_test::U64(i)).ok());
    const uint64_t full = idx->pool()->allocator().BytesInUse();
    ASSERT_GE(full - before, 7 * 32768u);
    for (uint64_t i = 0; i < n; i++) ASSERT_TRUE(idx->Remove(MakeKey(KeyKind::kU64, i)).ok());
    ASSERT_TRUE(idx->Insert(nvc_test::U64(1), nvc_test::U64(1)).ok());  // one slot stays in use
    idx.reset();
    if (crash) {
      std::unique_ptr<pm::Pool> p;
      pm::PoolOptions po;
      ASSERT_TRUE(pm::Pool::Open(pf.path, "", po, &p).ok());
      auto* clean = reinterpret_cast<uint64_t*>(p->base() + *p->root_slot() + 80);  // Root::clean
      pm::Store(clean, uint64_t(0));
      pm::Persist(clean, 8);
      ASSERT_TRUE(p->Close().ok());
    }
    o.create_if_missing = false;
    ASSERT_TRUE(OpenIndex("nvc_hashmap", o, &idx).ok());
    EXPECT_EQ(idx->Stats().recovery_seconds > 0, crash);
    // 8 slabs in use before, 1 after (the bucket-table segments stay)
    EXPECT_GE(full - idx->pool()->allocator().BytesInUse(), 7 * 32768u) << "empty slabs were kept";
    EXPECT_EQ(idx->Size(), 1u);
    ASSERT_TRUE(idx->Check().ok()) << idx->Check().ToString();
    ExpectNoLeak(idx.get());
    for (uint64_t i = 0; i < n; i++) ASSERT_TRUE(idx->Insert(MakeKey(KeyKind::kU64, i + n), nvc_test::U64(i)).ok());
    ASSERT_TRUE(idx->Check().ok()) << idx->Check().ToString();
  }
}

// The footprint that decides find speed once the index outgrows the cache
// (docs/nvc_hashmap.md, "Layout"): u64 records take one 32-byte slab slot
// and the bucket table 8 bytes per bucket.
TEST(NvcHashmap, U64RecordsTakeCompactNodesAndSlots) {
  PoolFile pf("footprint");
  Options o = Opts(pf.path, KeyKind::kU64, ValueKind::kU64, {});
  std::unique_ptr<Index> idx;
  ASSERT_TRUE(OpenIndex("nvc_hashmap", o, &idx).ok());
  const uint64_t b0 = idx->pool()->allocator().BytesInUse();
  const uint64_t n = 100000;
  for (uint64_t i = 0; i < n; i++) ASSERT_TRUE(idx->Insert(MakeKey(KeyKind::kU64, i), nvc_test::U64(i)).ok());
  const double per = double(idx->pool()->allocator().BytesInUse() - b0) / n;
  // 32-byte node (+ slab headers) + 8-byte slots for up to n / 2 .. n buckets.
  EXPECT_LT(per, 48.0) << "PM bytes per record";
  EXPECT_GT(per, 32.0);
  ASSERT_TRUE(idx->Check().ok()) << idx->Check().ToString();
  ExpectNoLeak(idx.get());
}

// Pre-sizing: a table created with many buckets has every initial dummy
// linked at creation, so inserts into the fresh table pay only for their
// node and link (2 lines, 2 fences; a new slab every 1018 inserts adds a
// little), not for initialising buckets on demand. The persist counters are
// exact (per thread), so this is a cost assertion, not a timing.
TEST(NvcHashmap, PresizedTableCostsTwoFencesPerInsert) {
  for (const char* buckets : {"65536", "1024"}) {
    SCOPED_TRACE(buckets);
    PoolFile pf("presize");
    Options o = Opts(pf.path, KeyKind::kU64, ValueKind::kU64, {{"initial_buckets", buckets}});
    std::unique_ptr<Index> idx;
    ASSERT_TRUE(OpenIndex("nvc_hashmap", o, &idx).ok());
    const uint64_t n = std::stoull(buckets) / 2;  // below the first doubling (load factor 2)
    const pm::Counters before = pm::ThreadCounters();
    for (uint64_t i = 0; i < n; i++) ASSERT_TRUE(idx->Insert(MakeKey(KeyKind::kU64, i), nvc_test::U64(i)).ok());
    const pm::Counters d = pm::ThreadCounters() - before;
    const double fences = double(d.fences) / n, lines = double(d.lines_flushed) / n;
    EXPECT_LT(fences, 2.05) << "fences per insert into a fresh pre-sized table";
    EXPECT_LT(lines, 2.05) << "lines per insert into a fresh pre-sized table";
    ASSERT_TRUE(idx->Check().ok()) << idx->Check().ToString();
    ExpectNoLeak(idx.get());
    idx.reset();
    o.create_if_missing = false;
    ASSERT_TRUE(OpenIndex("nvc_hashmap", o, &idx).ok());
    ASSERT_TRUE(idx->Check().ok()) << idx->Check().ToString();
    EXPECT_EQ(idx->Size(), n);
  }
}

// Node slots freed before a clean close are found free again after the
// reopen (slab bitmaps) and after a crash (the list walk): inserting as many
// new records as were removed allocates nothing new.
TEST(NvcHashmap, FreedSlabSlotsAreReusedAfterReopen) {
  for (bool crash : {false, true}) {
    SCOPED_TRACE(crash ? "crash" : "clean");
    PoolFile pf("slabreuse");
    Options o = Opts(pf.path, KeyKind::kU64, ValueKind::kU64, {{"node_alloc", "slab"}});
    std::unique_ptr<Index> idx;
    ASSERT_TRUE(OpenIndex("nvc_hashmap", o, &idx).ok());
    for (uint64_t i = 0; i < 8000; i++) ASSERT_TRUE(idx->Insert(MakeKey(KeyKind::kU64, i), nvc_test::U64(i)).ok());
    for (uint64_t i = 0; i < 8000; i += 2) ASSERT_TRUE(idx->Remove(MakeKey(KeyKind::kU64, i)).ok());
    ASSERT_TRUE(idx->Close().ok());
    idx.reset();
    if (crash) {
      // Make the pool look as if the process died: open needs recovery.
      std::unique_ptr<pm::Pool> p;
      pm::PoolOptions po;
      ASSERT_TRUE(pm::Pool::Open(pf.path, "", po, &p).ok());
      auto* clean = reinterpret_cast<uint64_t*>(p->base() + *p->root_slot()) + 10;  // Root::clean
      pm::StoreAtomic(clean, uint64_t(0));
      pm::Persist(clean, 8);
      ASSERT_TRUE(p->Close().ok());
    }
    o.create_if_missing = false;
    ASSERT_TRUE(OpenIndex("", o, &idx).ok());
    EXPECT_EQ(idx->Stats().recovery_seconds > 0, crash);
    const uint64_t before = idx->pool()->allocator().BytesInUse();
    for (uint64_t i = 100000; i < 104000; i++) ASSERT_TRUE(idx->Insert(MakeKey(KeyKind::kU64, i), nvc_test::U64(i)).ok());
    EXPECT_EQ(idx->pool()->allocator().BytesInUse(), before) << "free slab slots were not reused";
    EXPECT_EQ(idx->Size(), 8000u);
    ASSERT_TRUE(idx->Check().ok()) << idx->Check().ToString();
    ExpectNoLeak(idx.get());
  }
}

// ---------------------------------------------------------------------------
// Crash images.

// The erratum's scenario: thread A links node X but has not persisted the
// link yet; thread B links its node Y behind X and persists its own link;
// the power fails. Without a fix B's acknowledged insert is lost (X, and Y
// behind it, are unreachable in the durable image); with either fix it
// survives.
//
// Returns whether B's key survived the crash; also checks the image recovers
// into a consistent, leak-free index.
bool RunErratumScenario(const std::map<std::string, std::string>& params, bool no_fix_fault) {
  // One bucket: every node is in bucket 0, so B's predecessor is A's node.
  auto p = params;
  p["initial_buckets"] = "1";
  CrashHarness h("erratum", p);
  if (no_fix_fault) pm::EnableFault("nvc.erratum.no_fix");
  std::string ka, kb;
  NeighbourKeys(1000, &ka, &kb);
  PauseState ps;
  ps.key = ka;
  g_pause = &ps;
  nvc_hashmap_testing::SetAfterLinkHook(&PauseHook);
  std::thread a([&] { EXPECT_TRUE(h.idx->Insert(ka, nvc_test::U64(1)).ok()); });
  WaitPaused(ps);
  // A is paused between its CAS and its persist. B acts on A's link.
  Status sb = h.idx->Insert(kb, nvc_test::U64(2));
  EXPECT_TRUE(sb.ok());
  std::vector<char> img = h.Snapshot();  // power failure now
  ReleaseAndJoin(ps, a);
  std::unique_ptr<Index> rec;
  Status s = h.Crash(img, &rec);
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (!s.ok()) return false;
  EXPECT_TRUE(rec->pool()->recovered_from_crash());
  Status c = rec->Check();
  EXPECT_TRUE(c.ok()) << c.ToString();
  ExpectNoLeak(rec.get());
  std::string v;
  bool found = rec->Find(kb, &v).ok();
  if (found) {
        EXPECT_EQ(v, nvc_test::U64(2));
      }
  EXPECT_EQ(rec->Size(), rec->Find(ka, &v).ok() + uint64_t(found));
  return found;
}

TEST(NvcHashmapErratum, WithoutFixAnAcknowledgedInsertIsLost) {
  EXPECT_FALSE(RunErratumScenario({{"erratum_fix", "none"}}, false)) << "the scenario must reproduce the erratum";
}
TEST(NvcHashmapErratum, NoFixFaultReproducesIt) {
  EXPECT_FALSE(RunErratumScenario({{"erratum_fix", "dirty_bit"}}, true));
}
TEST(NvcHashmapErratum, DirtyBitFixKeepsIt) { EXPECT_TRUE(RunErratumScenario({{"erratum_fix", "dirty_bit"}}, false)); }
TEST(NvcHashmapErratum, FlushOnReadFixKeepsIt) { EXPECT_TRUE(RunErratumScenario({{"erratum_fix", "flush_on_read"}}, false)); }
TEST(NvcHashmapErratum, AllocatorNodesWithoutFixLoseIt) {
  EXPECT_FALSE(RunErratumScenario({{"erratum_fix", "none"}, {"node_alloc", "allocator"}}, false));
}
TEST(NvcHashmapErratum, AllocatorNodesDirtyBitFixKeepsIt) {
  EXPECT_TRUE(RunErratumScenario({{"erratum_fix", "dirty_bit"}, {"node_alloc", "allocator"}}, false));
}
TEST(NvcHashmapErratum, AllocatorNodesFlushOnReadFixKeepsIt) {
  EXPECT_TRUE(RunErratumScenario({{"erratum_fix", "flush_on_read"}, {"node_alloc", "allocator"}}, false));
}

// A dummy is its slot's word, and bit 0 of that word is kUnpub (claimed,
// not published), not a deletion mark. The table starts with 8 buckets
// (load_factor=1, all linked at creation); 64 keys outside bucket 8 (of 16)
// double it to 16, so bucket 8 is not initialised yet. Thread A inserts a
// key of bucket 8: it initialises the bucket and is paused right after
// linking the dummy (before persisting the link and publishing); thread B
// inserts a key of bucket 8: it cannot start at the unpublished dummy, walks
// from bucket 0 through it (treating it as a live dummy, not a marked node)
// and links behind it, keeping kUnpub. B's insert is acknowledged before A
// resumes, so it must survive a crash taken then (B made the link to the
// dummy durable first); after A resumes the bucket is published and
// everything checks. With erratum_fix=none B does not persist A's link
// before its own, and its key is lost in the crash: the control that keeps
// this scenario discriminating (bucket 8's slot is on another line than the
// word that links to it, the head or a node of bucket 0, so B's own flush
// does not persist A's link).
void RunUnpublishedDummyScenario(const std::string& fix) {
  SCOPED_TRACE(fix);
  CrashHarness h("unpub", {{"erratum_fix", fix}, {"initial_buckets", "8"}, {"load_factor", "1"}});
  std::string ka, kb;  // two keys of bucket 8 (of 16): hash & 15 == 0b1000, so so's top 4 bits are 0b0001
  int loaded = 0;
  for (uint64_t i = 1; kb.empty() || loaded < 64; i++) {
    const std::string k = nvc_test::U64(i * 7919);
    if (nvc_hashmap_testing::SplitOrderKey(KeyKind::kU64, k) >> 60 != 1) {
      if (loaded < 64) {
        EXPECT_TRUE(h.idx->Insert(k, nvc_test::U64(i)).ok());
        loaded++;
      }
      continue;
    }
    if (kb.empty()) (ka.empty() ? ka : kb) = k;
  }
  PauseState ps;
  ps.key = "";  // the first dummy link (A's, bucket 8)
  g_pause = &ps;
  nvc_hashmap_testing::SetAfterLinkHook(&PauseHook);
  std::thread a([&] { EXPECT_TRUE(h.idx->Insert(ka, nvc_test::U64(1)).ok()); });
  WaitPaused(ps);
  EXPECT_TRUE(h.idx->Insert(kb, nvc_test::U64(2)).ok());
  std::string v;
  EXPECT_TRUE(h.idx->Find(kb, &v).ok());
  std::vector<char> img = h.Snapshot();  // power failure now
  ReleaseAndJoin(ps, a);
  Status c = h.idx->Check();
  EXPECT_TRUE(c.ok()) << c.ToString();  // bucket 8 published, nothing marked
  EXPECT_TRUE(h.idx->Find(ka, &v).ok() && v == nvc_test::U64(1));
  EXPECT_TRUE(h.idx->Find(kb, &v).ok() && v == nvc_test::U64(2));
  std::unique_ptr<Index> rec;
  Status s = h.Crash(img, &rec);
  ASSERT_TRUE(s.ok()) << s.ToString();
  c = rec->Check();
  EXPECT_TRUE(c.ok()) << c.ToString();
  ExpectNoLeak(rec.get());
  if (fix == "none") {
    EXPECT_FALSE(rec->Find(kb, &v).ok()) << "the scenario must reproduce the erratum (B's key lost without a fix)";
  } else {
    EXPECT_TRUE(rec->Find(kb, &v).ok() && v == nvc_test::U64(2)) << "an acknowledged insert behind an unpublished dummy was lost";
  }
  EXPECT_TRUE(rec->Insert(ka, nvc_test::U64(3)).ok());  // the recovered index keeps working
  EXPECT_TRUE(rec->Check().ok());
}
TEST(NvcHashmapErratum, InsertBehindAnUnpublishedDummyWithoutFixLosesIt) { RunUnpublishedDummyScenario("none"); }
TEST(NvcHashmapErratum, InsertBehindAnUnpublishedDummyDirtyBit) { RunUnpublishedDummyScenario("dirty_bit"); }
TEST(NvcHashmapErratum, InsertBehindAnUnpublishedDummyFlushOnRead) { RunUnpublishedDummyScenario("flush_on_read"); }

// The erratum for in-place value updates: updater A stored key ka's new u64
// value but has not persisted it; reader B finds ka and returns the new
// value; the power fails. Without a fix the image holds the old value although
// B observed the new one; with dirty_bit (B sees A counted in its update
// stripe and persists the word) and flush_on_read it holds the new one.
// Returns the value of ka in the recovered image.
std::string RunValueErratumScenario(const std::map<std::string, std::string>& params) {
  CrashHarness h("verratum", params);
  const std::string ka = nvc_test::U64(77), kb = nvc_test::U64(78);
  EXPECT_TRUE(h.idx->Insert(ka, nvc_test::U64(1)).ok());
  EXPECT_TRUE(h.idx->Insert(kb, nvc_test::U64(2)).ok());
  PauseState ps;
  ps.key = ka;
  g_pause = &ps;
  nvc_hashmap_testing::SetAfterValueStoreHook(&PauseHook);
  std::thread a([&] { EXPECT_TRUE(h.idx->Update(ka, nvc_test::U64(5)).ok()); });
  WaitPaused(ps);
  std::string v;
  EXPECT_TRUE(h.idx->Find(ka, &v).ok());
  EXPECT_EQ(v, nvc_test::U64(5)) << "B reads the in-flight value";
  std::vector<char> img = h.Snapshot();  // power failure now
  ReleaseAndJoin(ps, a);
  std::unique_ptr<Index> rec;
  Status s = h.Crash(img, &rec);
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (!s.ok()) return "";
  EXPECT_TRUE(rec->Check().ok());
  ExpectNoLeak(rec.get());
  EXPECT_TRUE(rec->Find(kb, &v).ok());
  EXPECT_TRUE(rec->Find(ka, &v).ok());
  return v;
}

TEST(NvcHashmapErratum, InPlaceValueWithoutFixLosesTheObservedValue) {
  EXPECT_EQ(RunValueErratumScenario({{"erratum_fix", "none"}}), nvc_test::U64(1));
}
TEST(NvcHashmapErratum, InPlaceValueDirtyBitFixKeepsTheObservedValue) {
  EXPECT_EQ(RunValueErratumScenario({{"erratum_fix", "dirty_bit"}}), nvc_test::U64(5));
  EXPECT_EQ(RunValueErratumScenario({{"erratum_fix", "dirty_bit"}, {"node_alloc", "allocator"}}), nvc_test::U64(5));
}
TEST(NvcHashmapErratum, InPlaceValueFlushOnReadFixKeepsTheObservedValue) {
  EXPECT_EQ(RunValueErratumScenario({{"erratum_fix", "flush_on_read"}}), nvc_test::U64(5));
}

// A late in-place update: updater A checked that ka's node is not marked and
// is paused right before its store; B removes ka (the mark is the
// linearization point) and finds it absent; A stores into the dead node and
// returns OK (linearized just before B's mark). The key must stay absent
// (no resurrection, in memory and after a crash), a new insert of ka must
// win with its own value, and nothing leaks.
TEST(NvcHashmapErratum, LateInPlaceUpdateIsNeverObserved) {
  for (std::string fix : {"dirty_bit", "flush_on_read"}) {
    SCOPED_TRACE(fix);
    CrashHarness h("late", {{"erratum_fix", fix}});
    const std::string ka = nvc_test::U64(91), kb = nvc_test::U64(92);
    ASSERT_TRUE(h.idx->Insert(ka, nvc_test::U64(1)).ok());
    ASSERT_TRUE(h.idx->Insert(kb, nvc_test::U64(2)).ok());
    PauseState ps;
    ps.key = ka;
    g_pause = &ps;
    nvc_hashmap_testing::SetBeforeValueStoreHook(&PauseHook);
    Status sa;
    std::thread a([&] { sa = h.idx->Update(ka, nvc_test::U64(5)); });
    WaitPaused(ps);
    ASSERT_TRUE(h.idx->Remove(ka).ok());
    std::string v;
    EXPECT_TRUE(h.idx->Find(ka, &v).IsNotFound());
    ReleaseAndJoin(ps, a);
    EXPECT_TRUE(sa.ok()) << "the late update linearizes just before the remove: " << sa.ToString();
    EXPECT_TRUE(h.idx->Find(ka, &v).IsNotFound()) << "a late update resurrected the key";
    EXPECT_TRUE(h.idx->Update(ka, nvc_test::U64(6)).IsNotFound());
    EXPECT_EQ(h.idx->Size(), 1u);
    std::vector<char> img_absent = h.Snapshot();
    ASSERT_TRUE(h.idx->Insert(ka, nvc_test::U64(7)).ok());
    ASSERT_TRUE(h.idx->Find(ka, &v).ok());
    EXPECT_EQ(v, nvc_test::U64(7));
    Status c = h.idx->Check();
    EXPECT_TRUE(c.ok()) << c.ToString();
    ExpectNoLeak(h.idx.get());
    std::unique_ptr<Index> rec;
    ASSERT_TRUE(h.Crash(img_absent, &rec).ok());
    EXPECT_TRUE(rec->Find(ka, &v).IsNotFound()) << "the late update's value came back after a crash";
    EXPECT_TRUE(rec->Find(kb, &v).ok());
    EXPECT_TRUE(rec->Check().ok());
    ExpectNoLeak(rec.get());
  }
}

// The find's read order: F's search found ka's node (unmarked) and F is
// paused before loading the value word; updater U passed its mark check and
// is paused before its store; R removes ka (the mark); U stores 5 into the
// dead node and returns OK (linearized just before the mark); F resumes. F
// must not return 5: it loads the value word, then re-checks the mark
// (docs/nvc_hashmap.md, "Updates in place"). A find that checked the mark
// only before loading the value (Search's load of next) returns 5 here.
PauseState* g_pause_find = nullptr;
void FindPauseHook(Slice key) {
  PauseState* saved = g_pause;
  g_pause = g_pause_find;
  PauseHook(key);
  g_pause = saved;
}
TEST(NvcHashmapErratum, FindNeverReturnsAValueStoredAfterTheMark) {
  for (std::string fix : {"dirty_bit", "flush_on_read", "none"}) {
    SCOPED_TRACE(fix);
    PoolFile pf("findorder");
    std::unique_ptr<Index> idx;
    ASSERT_TRUE(OpenIndex("nvc_hashmap", Opts(pf.path, KeyKind::kU64, ValueKind::kU64, {{"erratum_fix", fix}}), &idx).ok());
    const std::string ka = nvc_test::U64(93), kb = nvc_test::U64(94);
    ASSERT_TRUE(idx->Insert(ka, nvc_test::U64(1)).ok());
    ASSERT_TRUE(idx->Insert(kb, nvc_test::U64(2)).ok());
    PauseState pf_find, pu;
    pf_find.key = ka;
    pu.key = ka;
    g_pause_find = &pf_find;
    nvc_hashmap_testing::SetFindHook(&FindPauseHook);
    Status sf;
    std::string vf;
    std::thread f([&] { sf = idx->Find(ka, &vf); });
    WaitPaused(pf_find);
    nvc_hashmap_testing::SetFindHook(nullptr);  // only F pauses
    g_pause = &pu;
    nvc_hashmap_testing::SetBeforeValueStoreHook(&PauseHook);
    Status su;
    std::thread u([&] { su = idx->Update(ka, nvc_test::U64(5)); });
    WaitPaused(pu);
    ASSERT_TRUE(idx->Remove(ka).ok());
    ReleaseAndJoin(pu, u);  // U stores into the marked node, returns
    EXPECT_TRUE(su.ok()) << su.ToString();
    g_pause = &pf_find;
    ReleaseAndJoin(pf_find, f);
    g_pause_find = nullptr;
    EXPECT_TRUE(sf.IsNotFound()) << "a find returned " << (sf.ok() && vf.size() == 8 ? std::to_string(vf[0]) : sf.ToString())
                                 << ": a value stored after the remove's mark";
    std::string v;
    EXPECT_TRUE(idx->Find(ka, &v).IsNotFound());
    EXPECT_TRUE(idx->Find(kb, &v).ok());
    Status c = idx->Check();
    EXPECT_TRUE(c.ok()) << c.ToString();
    ExpectNoLeak(idx.get());
  }
}

// Eager bucket initialisation (InitBatch) claims up to 16 bucket slots, then
// links them. If a later bucket's slot cannot be had (pool full while
// allocating its segment; simulated by a hook for the 10th bucket of every
// batch), the buckets already claimed must still be linked and published:
// none stays claimed (check() reports "still being initialised"), also after
// a clean reopen, and the index keeps working.
std::atomic<uint64_t> g_slot_fails{0};
bool FailTenthOfBatch(uint64_t b) {
  if (b % 16 != 9) return false;
  g_slot_fails++;
  return true;
}
TEST(NvcHashmap, InitBatchLinksClaimedBucketsWhenASlotFails) {
  for (std::string na : {"slab", "allocator"}) {
    SCOPED_TRACE(na);
    PoolFile pf("batchfail");
    Options o = Opts(pf.path, KeyKind::kU64, ValueKind::kU64, {{"initial_buckets", "16"}, {"node_alloc", na}});
    std::unique_ptr<Index> idx;
    ASSERT_TRUE(OpenIndex("nvc_hashmap", o, &idx).ok());
    g_slot_fails = 0;
    nvc_hashmap_testing::SetInitBatchSlotFailHook(&FailTenthOfBatch);
    const uint64_t n = 6000;  // the table doubles from 16 to 4096 buckets
    for (uint64_t i = 0; i < n; i++) ASSERT_TRUE(idx->Insert(MakeKey(KeyKind::kU64, i), nvc_test::U64(i)).ok());
    nvc_hashmap_testing::SetInitBatchSlotFailHook(nullptr);
    EXPECT_GT(g_slot_fails.load(), 10u) << "the hook never fired: the test tests nothing";
    Status c = idx->Check();
    ASSERT_TRUE(c.ok()) << c.ToString();
    ExpectNoLeak(idx.get());
    idx.reset();
    o.create_if_missing = false;
    ASSERT_TRUE(OpenIndex("", o, &idx).ok());
    c = idx->Check();
    ASSERT_TRUE(c.ok()) << c.ToString();
    std::string v;
    for (uint64_t i = 0; i < n; i++) {
      ASSERT_TRUE(idx->Find(MakeKey(KeyKind::kU64, i), &v).ok()) << i;
      ASSERT_EQ(v, nvc_test::U64(i));
    }
    for (uint64_t i = n; i < 2 * n; i++) ASSERT_TRUE(idx->Insert(MakeKey(KeyKind::kU64, i), nvc_test::U64(i)).ok());
    c = idx->Check();
    ASSERT_TRUE(c.ok()) << c.ToString();
    ExpectNoLeak(idx.get());
  }
}

// A thread_local whose destructor runs after the index's per-thread slot
// cache was destroyed (thread exit; constructed before the thread first used
// the index, so destroyed after) and uses the index: the operation must get
// a slot of its own (the cached ones were released, and the cache must not be
// touched any more: ASan reports a use after free otherwise) and give it back.
struct ExitUser {
  Index* idx = nullptr;
  std::string key;
  Status* out = nullptr;
  ~ExitUser() {
    if (idx) *out = idx->Insert(key, nvc_test::U64(7));
  }
};
thread_local ExitUser tl_exit_user;
TEST(NvcHashmap, OperationsFromThreadExitDestructors) {
  PoolFile pa("exit-a"), pb("exit-b");
  std::unique_ptr<Index> a, b;
  ASSERT_TRUE(OpenIndex("nvc_hashmap", Opts(pa.path, KeyKind::kU64, ValueKind::kU64), &a).ok());
  ASSERT_TRUE(OpenIndex("nvc_hashmap", Opts(pb.path, KeyKind::kU64, ValueKind::kU64), &b).ok());
  // More threads than slots (MaxThreadSlots(), 256; they run one after the
  // other, so this is cheap): a slot taken at exit and not given back would
  // make the later threads fail with Busy.
  const int kThreads = nvc_hashmap_testing::MaxThreadSlots() + 44;
  std::vector<Status> st(kThreads);
  for (int i = 0; i < kThreads; i++) {
    std::thread t([&, i] {
      tl_exit_user.idx = a.get();  // constructed first: destroyed last
      tl_exit_user.key = MakeKey(KeyKind::kU64, 1000 + i);
      tl_exit_user.out = &st[i];
      ASSERT_TRUE(a->Insert(MakeKey(KeyKind::kU64, i), nvc_test::U64(i)).ok());
      ASSERT_TRUE(b->Insert(MakeKey(KeyKind::kU64, i), nvc_test::U64(i)).ok());  // the last index used is b
    });
    t.join();
    ASSERT_TRUE(st[i].ok()) << "thread " << i << ": " << st[i].ToString();
  }
  std::string v;
  for (int i = 0; i < kThreads; i++) {
    ASSERT_TRUE(a->Find(MakeKey(KeyKind::kU64, 1000 + i), &v).ok()) << i;
    ASSERT_TRUE(a->Find(MakeKey(KeyKind::kU64, i), &v).ok()) << i;
  }
  EXPECT_EQ(a->Size(), 2u * kThreads);
  Status c = a->Check();
  ASSERT_TRUE(c.ok()) << c.ToString();
  ExpectNoLeak(a.get());
}

// Without faults, every acknowledged operation is in the durable image at any
// instant between operations (checked after each one).
TEST(NvcHashmapCrash, EveryAcknowledgedOperationIsDurable) {
  for (std::string cfg : {"dirty_bit/allocator", "flush_on_read/allocator", "dirty_bit/slab", "flush_on_read/slab"}) {
    SCOPED_TRACE(cfg);
    const std::string fix = cfg.substr(0, cfg.find('/')), na = cfg.substr(cfg.find('/') + 1);
    CrashHarness h("acked", {{"erratum_fix", fix}, {"initial_buckets", "2"}, {"node_alloc", na}});
    std::map<std::string, std::string> model;
    std::mt19937_64 rng(7);
    std::vector<std::vector<char>> images;
    std::vector<std::map<std::string, std::string>> models;
    for (int i = 0; i < 300; i++) {
      uint64_t id = rng() % 60;
      std::string k = MakeKey(KeyKind::kU64, id), v = MakeValue(ValueKind::kU64, id, i);
      switch (rng() % 4) {
        case 0:
          if (h.idx->Insert(k, v).ok()) model[k] = v;
          break;
        case 1:
          ASSERT_TRUE(h.idx->Upsert(k, v).ok());
          model[k] = v;
          break;
        case 2:
          if (h.idx->Update(k, v).ok()) model[k] = v;
          break;
        case 3:
          if (h.idx->Remove(k).ok()) model.erase(k);
          break;
      }
      if (i % 37 == 0) {
        images.push_back(h.Snapshot());
        models.push_back(model);
      }
    }
    images.push_back(h.Snapshot());
    models.push_back(model);
    pm::SetObserver(nullptr);
    h.idx.reset();
    for (size_t j = 0; j < images.size(); j++) {
      PoolFile img("acked-img");
      DurableImage::Write(images[j], img.path);
      Options o;
      o.pool_path = img.path;
      o.create_if_missing = false;
      std::unique_ptr<Index> rec;
      Status s = OpenIndex("", o, &rec);
      ASSERT_TRUE(s.ok()) << s.ToString();
      ASSERT_TRUE(rec->Check().ok()) << fix << " image " << j << ": " << rec->Check().ToString();
      ASSERT_EQ(rec->Size(), models[j].size()) << fix << " image " << j;
      std::string v;
      for (const auto& [k, val] : models[j]) {
        ASSERT_TRUE(rec->Find(k, &v).ok()) << fix << " image " << j;
        ASSERT_EQ(v, val);
      }
      ExpectNoLeak(rec.get());
    }
  }
}

// Each fault switch breaks durability in a way a crash image shows.
TEST(NvcHashmapCrash, FaultSwitchesAreObservable) {
  for (std::string na : {"allocator", "slab"}) {
  SCOPED_TRACE(na);
  const std::map<std::string, std::string> prm{{"node_alloc", na}};
  const std::string k1 = nvc_test::U64(11), k2 = nvc_test::U64(12);
  {  // skip_link_persist: the acknowledged insert is not durable.
    CrashHarness h("f-link", prm);
    pm::EnableFault("nvc.insert.skip_link_persist");
    ASSERT_TRUE(h.idx->Insert(k1, nvc_test::U64(1)).ok());
    std::unique_ptr<Index> rec;
    ASSERT_TRUE(h.Crash(h.Snapshot(), &rec).ok());
    std::string v;
    EXPECT_TRUE(rec->Find(k1, &v).IsNotFound());
  }
  {  // skip_node_persist: the durable link points to a node whose content is
     // not durable; recovery finds it corrupt or the record is lost.
    CrashHarness h("f-node", prm);
    pm::EnableFault("nvc.insert.skip_node_persist");
    ASSERT_TRUE(h.idx->Insert(k1, nvc_test::U64(1)).ok());
    std::unique_ptr<Index> rec;
    Status s = h.Crash(h.Snapshot(), &rec);
    std::string v;
    EXPECT_TRUE(!s.ok() || !rec->Find(k1, &v).ok() || v != nvc_test::U64(1)) << s.ToString();
  }
  {  // skip_mark_persist: the remove returns with its logical delete (the
     // mark on next) not durable. The unlink that follows is persisted, so a
     // single-threaded crash image still loses the record; what shows is the
     // durable image differing from the pool after the op returned (pmcheck's
     // lint reports it as a missing flush; with a concurrent reader that
     // reports the key absent before the unlink, a crash resurrects it).
     // flush_on_read: in dirty_bit mode the mark's kDirty clear is a
     // volatile store to the same word, and DurableImage::SameAsLive ignores
     // words that took a volatile store.
    std::map<std::string, std::string> mprm = prm;
    mprm["erratum_fix"] = "flush_on_read";
    for (bool fault : {false, true}) {
      CrashHarness h(fault ? "f-mark" : "f-mark-ctl", mprm);
      ASSERT_TRUE(h.idx->Insert(k1, nvc_test::U64(1)).ok());
      ASSERT_TRUE(h.idx->Insert(k2, nvc_test::U64(2)).ok());
      if (fault) pm::EnableFault("nvc.remove.skip_mark_persist");
      ASSERT_TRUE(h.idx->Remove(k1).ok());
      const bool same = h.SameAsLive();
      EXPECT_EQ(same, !fault) << (fault ? "the fault left nothing undurable" : "a completed remove left undurable bytes");
    }
  }
  {  // Control: without faults the same removes are durable.
    CrashHarness h("f-ctl", prm);
    ASSERT_TRUE(h.idx->Insert(k1, nvc_test::U64(1)).ok());
    ASSERT_TRUE(h.idx->Insert(k2, nvc_test::U64(2)).ok());
    ASSERT_TRUE(h.idx->Remove(k1).ok());
    std::unique_ptr<Index> rec;
    ASSERT_TRUE(h.Crash(h.Snapshot(), &rec).ok());
    std::string v;
    EXPECT_TRUE(rec->Find(k1, &v).IsNotFound());
    EXPECT_TRUE(rec->Find(k2, &v).ok());
    EXPECT_TRUE(rec->Check().ok());
    ExpectNoLeak(rec.get());
  }
  }
}

// ---------------------------------------------------------------------------
// SIGKILL of a loading child: every acknowledged operation survives, nothing
// leaks, the structure checks.

// The child's deterministic operation sequence: op i inserts key i, and
// every third op also removes key i-30 and every fifth updates key i-10.
struct ChildOp {
  int kind;  // 0 insert, 1 remove, 2 update
  uint64_t id;
};
std::vector<ChildOp> ChildOps(uint64_t n) {
  std::vector<ChildOp> v;
  for (uint64_t i = 0; v.size() < n; i++) {
    v.push_back({0, i});
    if (i % 3 == 0 && i >= 30) v.push_back({1, i - 30});
    if (i % 5 == 0 && i >= 10) v.push_back({2, i - 10});
  }
  return v;
}

TEST(NvcHashmapCrash, SigkillOfLoadingChild) {
  for (int variant = 0; variant < 3; variant++) {
    const KeyKind kk = variant == 1 ? KeyKind::kBytes : KeyKind::kU64;
    const std::string na = variant == 2 ? "slab" : "allocator";
    SCOPED_TRACE(na);
    PoolFile pf("kill");
    Options o = Opts(pf.path, kk, ValueKind::kBytes, {{"initial_buckets", "4"}, {"node_alloc", na}});
    const auto ops = ChildOps(400000);
    testutil::AckingChild child([&](const testutil::AckingChild::Ack& ack) {
      std::unique_ptr<Index> idx;
      if (!OpenIndex("nvc_hashmap", o, &idx).ok()) ::_exit(2);
      for (uint64_t i = 0; i < ops.size(); i++) {
        const auto& op = ops[i];
        std::string k = MakeKey(kk, op.id);
        Status s = op.kind == 0   ? idx->Insert(k, MakeValue(ValueKind::kBytes, op.id, 0))
                   : op.kind == 1 ? idx->Remove(k)
                                  : idx->Update(k, MakeValue(ValueKind::kBytes, op.id, 1));
        if (!s.ok()) ::_exit(3);
        if (!ack(i + 1)) ::_exit(4);
      }
      ::_exit(0);
    });
    ASSERT_TRUE(child.started());
    uint64_t acked = 0;
    child.ReadUntil([](uint64_t n) { return n >= 30000; }, &acked);
    const int status = child.Kill(/*drain=*/true, &acked);  // with the acks written before the kill
    ASSERT_TRUE(WIFSIGNALED(status)) << "child exited early with " << WEXITSTATUS(status);
    ASSERT_GE(acked, 30000u);
    // Model of the acknowledged prefix; op `acked` may or may not have happened.
    std::map<uint64_t, int> state;  // id -> version (0 inserted, 1 updated)
    for (uint64_t i = 0; i < acked; i++) {
      if (ops[i].kind == 0) state[ops[i].id] = 0;
      else if (ops[i].kind == 1) state.erase(ops[i].id);
      else state[ops[i].id] = 1;
    }
    const uint64_t maybe = ops[acked].id;
    uint64_t max_id = 0;
    for (uint64_t i = 0; i <= acked; i++) max_id = std::max(max_id, ops[i].id);
    o.create_if_missing = false;
    std::unique_ptr<Index> idx;
    Status s = OpenIndex("", o, &idx);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_TRUE(idx->pool()->recovered_from_crash());
    Status c = idx->Check();
    ASSERT_TRUE(c.ok()) << c.ToString();
    ExpectNoLeak(idx.get());
    std::string v;
    uint64_t found = 0;
    for (uint64_t id = 0; id <= max_id + 1; id++) {
      Status f = idx->Find(MakeKey(kk, id), &v);
      found += f.ok();
      if (id == maybe) continue;
      auto it = state.find(id);
      ASSERT_EQ(f.ok(), it != state.end()) << "id " << id;
      if (f.ok()) {
        ASSERT_EQ(v, MakeValue(ValueKind::kBytes, id, it->second)) << "id " << id;
      }
    }
    EXPECT_EQ(idx->Size(), found);
    // The recovered index keeps working.
    for (uint64_t id = 1000000; id < 1001000; id++) ASSERT_TRUE(idx->Insert(MakeKey(kk, id), "v").ok());
    ASSERT_TRUE(idx->Check().ok());
    ExpectNoLeak(idx.get());
  }
}

}  // namespace
}  // namespace pmindex
