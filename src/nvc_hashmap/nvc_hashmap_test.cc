// NVC-Hashmap tests: differential against std::unordered_map (both key and
// value kinds, every erratum mode, bucket-table growth, reopen), parameters,
// format versions, thread slots, growth, node slabs (empty slabs freed at
// open, slot reuse, footprint), the pre-sized table's cost per insert, a
// failing bucket slot in the middle of an eager initialisation batch, and
// operations from thread-exit destructors. Crash images and the erratum's
// write side are in nvc_crash_test.cc, its read side in
// nvc_erratum_read_test.cc.
#include <gtest/gtest.h>

#include <random>
#include <thread>
#include <unordered_map>

#include "nvc_hashmap/nvc_hashmap.h"
#include "nvc_hashmap/nvc_test_util.h"
#include "pmindex/pm/fault.h"

namespace pmindex {
namespace {

using nvc_test::ExpectNoLeak;
using nvc_test::MakeKey;
using nvc_test::MakeValue;
using nvc_test::MarkUnclean;
using nvc_test::PoolFile;
using nvc_test::Opts;


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

// Format 7 (8-byte bucket slots, compact 32-byte u64 nodes, thread slots,
// link tags, free slab slots zero or marked): a pool of an older format than 4, or a newer one, is refused
// with a clear error, not misread. Version 3 included: three incompatible
// layouts were written as 3.
TEST(NvcHashmap, OlderFormatVersionIsRefused) {
  for (uint32_t old : {2u, 3u, 8u}) {
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
      ASSERT_EQ(*version, 7u);
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
    ASSERT_TRUE(p->allocator().Free(p->root_slot()).ok());
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
  nvc_hashmap_testing::SetCreateFormatVersion(5);  // links without tags, as versions 4 and 5 have them
  const Status cs = OpenIndex("nvc_hashmap", o, &idx);
  nvc_hashmap_testing::SetCreateFormatVersion(0);
  ASSERT_TRUE(cs.ok()) << cs.ToString();
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
  MarkUnclean(pf.path);
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
    if (crash) MarkUnclean(pf.path);
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

// Fault nvc.open.skip_empty_slab_unlink: an empty slab is freed at open but
// stays in the slab list; Check reports it (pmcheck's verification after
// recovery does the same). Without the fault the same reopen checks clean.
TEST(NvcHashmap, SkippedEmptySlabUnlinkIsReported) {
  for (bool fault : {false, true}) {
    SCOPED_TRACE(fault);
    PoolFile pf("slabfault");
    Options o = Opts(pf.path, KeyKind::kU64, ValueKind::kU64, {});
    std::unique_ptr<Index> idx;
    ASSERT_TRUE(OpenIndex("nvc_hashmap", o, &idx).ok());
    for (uint64_t i = 0; i < 3000; i++) ASSERT_TRUE(idx->Insert(MakeKey(KeyKind::kU64, i), nvc_test::U64(i)).ok());
    for (uint64_t i = 0; i < 3000; i++) ASSERT_TRUE(idx->Remove(MakeKey(KeyKind::kU64, i)).ok());
    idx.reset();
    o.create_if_missing = false;
    if (fault) pm::EnableFault("nvc.open.skip_empty_slab_unlink");
    Status s = OpenIndex("", o, &idx);
    pm::DisableAllFaults();
    if (s.ok()) s = idx->Check();
    EXPECT_EQ(s.ok(), !fault) << s.ToString();
  }
}

// SlabRefill's PoolFull path: a fixed 8 MiB pool (no growth) and a bucket
// table that never grows (131072 buckets at load factor 64), so only slabs
// allocate. Inserts fill the pool: the insert that finds no free slot and no
// room for a slab takes the retry path and, with nothing retired, returns a
// clean PoolFull (every record present, Check, no leak). Then 40 removes
// retire 40 slots (the first 32 are stamped by the reclaim at the 32nd
// retirement, not yet freed): the next insert takes the retry path again,
// whose reclaim frees them, and succeeds; the inserts that follow use the
// freed slots until a clean PoolFull again.
TEST(NvcHashmap, SlabRefillRetriesAfterPoolFull) {
  PoolFile pf("poolfull");
  Options o = Opts(pf.path, KeyKind::kU64, ValueKind::kU64, {{"initial_buckets", "131072"}, {"load_factor", "64"}});
  o.pool_size = 8ull << 20;
  o.max_pool_size = 8ull << 20;
  std::unique_ptr<Index> idx;
  ASSERT_TRUE(OpenIndex("nvc_hashmap", o, &idx).ok());
  const uint64_t r0 = nvc_hashmap_testing::SlabRefillRetries();
  uint64_t n = 0;
  Status s;
  while ((s = idx->Insert(MakeKey(KeyKind::kU64, n), nvc_test::U64(n))).ok()) n++;
  ASSERT_TRUE(s.IsPoolFull()) << s.ToString();
  ASSERT_GT(n, 100000u);
  EXPECT_EQ(nvc_hashmap_testing::SlabRefillRetries(), r0 + 1) << "the PoolFull insert did not take the retry path";
  auto verify = [&](uint64_t lo, uint64_t hi, uint64_t removed_below) {
    EXPECT_EQ(idx->Size(), hi - lo - removed_below);
    std::string v;
    for (uint64_t i = lo; i < hi; i++) {
      const Status f = idx->Find(MakeKey(KeyKind::kU64, i), &v);
      ASSERT_EQ(f.ok(), i >= lo + removed_below) << i;
      if (f.ok()) {
        ASSERT_EQ(v, nvc_test::U64(i));
      }
    }
    Status c = idx->Check();
    ASSERT_TRUE(c.ok()) << c.ToString();
    ExpectNoLeak(idx.get());
  };
  verify(0, n, 0);
  const uint64_t bytes = idx->pool()->allocator().BytesInUse();
  for (uint64_t i = 0; i < 40; i++) ASSERT_TRUE(idx->Remove(MakeKey(KeyKind::kU64, i)).ok());
  const uint64_t r1 = nvc_hashmap_testing::SlabRefillRetries();
  ASSERT_TRUE(idx->Insert(MakeKey(KeyKind::kU64, n), nvc_test::U64(n)).ok()) << "the retry after reclaim did not succeed";
  EXPECT_EQ(nvc_hashmap_testing::SlabRefillRetries(), r1 + 1);
  uint64_t m = n + 1;
  while ((s = idx->Insert(MakeKey(KeyKind::kU64, m), nvc_test::U64(m))).ok()) m++;
  ASSERT_TRUE(s.IsPoolFull()) << s.ToString();
  EXPECT_GE(m - n, 32u) << "the reclaimed slots were not reused";
  EXPECT_LE(m - n, 40u);
  EXPECT_EQ(idx->pool()->allocator().BytesInUse(), bytes) << "slab slots, not new allocations";
  verify(0, m, 40);
  // The state survives a clean reopen.
  idx.reset();
  o.create_if_missing = false;
  ASSERT_TRUE(OpenIndex("", o, &idx).ok());
  verify(0, m, 40);
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
    if (crash) MarkUnclean(pf.path);
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


}  // namespace
}  // namespace pmindex
