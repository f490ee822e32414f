// NVC-Hashmap crash tests: crash images built with a DurableImage observer
// (kit/test_observer.h) for the erratum's write side (an insert behind a
// link that is not durable, behind an unpublished dummy, an in-place value a
// find returned), deterministic interleavings through test hooks (a late
// in-place update, the find's value-then-mark read order), every
// acknowledged operation durable between operations, the fault switches, and
// recovery after SIGKILL of a loading child. Without a fix (erratum_fix=none
// or the nvc.erratum.no_fix fault) each erratum scenario loses data: the
// control that shows the test can fail.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <set>
#include <thread>

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
using nvc_test::Opts;



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
// A failed insert (its node written, its link CAS lost to an insert of the
// same key, the key then found) zeroes its slab node's next, persisted,
// before the slot goes back to the free list (format 7's invariant, which
// the slab scan relies on). Thread A is held before its link CAS while B
// inserts the same key; A then answers AlreadyExists. With the fault
// nvc.insert.skip_failed_zero_persist the zeroing is not durable when A
// returns (the durable image differs from the pool); in both cases a crash
// image recovers with the key once, checked and leak-free.
TEST(NvcHashmapCrash, FailedInsertZeroesItsNodeDurably) {
  for (bool fault : {false, true}) {
    SCOPED_TRACE(fault ? "fault" : "control");
    CrashHarness h(fault ? "f-zero" : "f-zero-ctl", {{"initial_buckets", "1"}});
    const std::string k = nvc_test::U64(21);
    ASSERT_TRUE(h.idx->Insert(nvc_test::U64(22), nvc_test::U64(2)).ok());
    if (fault) pm::EnableFault("nvc.insert.skip_failed_zero_persist");
    PauseState ps;
    ps.key = k;
    g_pause = &ps;
    nvc_hashmap_testing::SetBeforeLinkHook(&PauseHook);
    Status sa;
    std::thread a([&] { sa = h.idx->Insert(k, nvc_test::U64(1)); });
    WaitPaused(ps);
    nvc_hashmap_testing::SetBeforeLinkHook(nullptr);  // B passes
    ASSERT_TRUE(h.idx->Insert(k, nvc_test::U64(3)).ok());
    ReleaseAndJoin(ps, a);
    EXPECT_TRUE(sa.IsAlreadyExists()) << sa.ToString();
    EXPECT_EQ(h.SameAsLive(), !fault) << (fault ? "the fault left nothing undurable" : "a failed insert left undurable bytes");
    std::unique_ptr<Index> rec;
    ASSERT_TRUE(h.Crash(h.Snapshot(), &rec).ok());
    std::string v;
    ASSERT_TRUE(rec->Find(k, &v).ok());
    EXPECT_EQ(v, nvc_test::U64(3));
    EXPECT_EQ(rec->Size(), 2u);
    EXPECT_TRUE(rec->Check().ok());
    ExpectNoLeak(rec.get());
  }
}

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

// Crash recovery walks the list with one thread or, split at bucket 1's
// dummy, with two (Options::recovery_threads): both give the same index, and
// so does the slab scan (u64 slab pools) with one or two threads. The pool is
// closed, marked unclean (a full recovery at open) and copied; each copy is
// recovered with 1 and with 2 threads, by the scan where it applies and by
// the walk forced: the same records and values, the same allocated blocks,
// Check and no leak in all, and after a clean close the same pool bytes. A
// table of one bucket (bucket 1 never published) is walked by one thread
// whatever the option.
TEST(NvcHashmapCrash, RecoveryWithOneOrTwoThreadsAgrees) {
  for (int variant = 0; variant < 3; variant++) {
    SCOPED_TRACE(variant);
    const KeyKind kk = variant == 1 ? KeyKind::kBytes : KeyKind::kU64;
    const ValueKind vk = variant == 1 ? ValueKind::kBytes : ValueKind::kU64;
    const std::string buckets = variant == 2 ? "1" : "16", lf = variant == 2 ? "64" : "2";
    PoolFile pf("rthreads");
    Options o = Opts(pf.path, kk, vk, {{"initial_buckets", buckets}, {"load_factor", lf}, {"node_alloc", variant == 1 ? "allocator" : "slab"}});
    o.pool_size = 8ull << 20;  // four copies are read back whole
    std::unique_ptr<Index> idx;
    ASSERT_TRUE(OpenIndex("nvc_hashmap", o, &idx).ok());
    const uint64_t n = variant == 2 ? 60 : 4000;  // one bucket holds 64 records
    for (uint64_t i = 0; i < n; i++) ASSERT_TRUE(idx->Insert(MakeKey(kk, i), MakeValue(vk, i, 0)).ok());
    for (uint64_t i = 0; i < n; i += 3) ASSERT_TRUE(idx->Remove(MakeKey(kk, i)).ok());
    for (uint64_t i = 1; i < n; i += 5) {
      if (i % 3 != 0) {
        ASSERT_TRUE(idx->Update(MakeKey(kk, i), MakeValue(vk, i, 1)).ok());
      }
    }
    idx.reset();
    nvc_test::MarkUnclean(pf.path);
    // Runs 0 and 1: 1 and 2 threads, as the pool allows (the slab scan for
    // u64 slab pools); runs 2 and 3: the list walk forced.
    PoolFile copies[4] = {PoolFile("rthreads-1"), PoolFile("rthreads-2"), PoolFile("rthreads-3"), PoolFile("rthreads-4")};
    std::vector<std::string> values[4];
    std::set<uint64_t> blocks[4];
    std::vector<char> bytes[4];
    for (int t = 0; t < 4; t++) {
      std::filesystem::copy_file(pf.path, copies[t].path, std::filesystem::copy_options::overwrite_existing);
      Options ot = o;
      ot.pool_path = copies[t].path;
      ot.create_if_missing = false;
      ot.recovery_threads = t % 2 + 1;
      std::unique_ptr<Index> rec;
      nvc_hashmap_testing::SetForceWalkRecovery(t >= 2);
      Status s = OpenIndex("", ot, &rec);
      nvc_hashmap_testing::SetForceWalkRecovery(false);
      ASSERT_TRUE(s.ok()) << s.ToString();
      const bool scanned = variant != 1 && t < 2;
      EXPECT_EQ(nvc_hashmap_testing::RecoveryScanned(rec.get()), scanned);
      EXPECT_EQ(nvc_hashmap_testing::RecoveryWalkers(rec.get()), variant == 2 && !scanned ? 1 : t % 2 + 1);
      Status c = rec->Check();
      ASSERT_TRUE(c.ok()) << c.ToString();
      ExpectNoLeak(rec.get());
      EXPECT_EQ(rec->Size(), n - (n + 2) / 3);
      std::string v;
      for (uint64_t i = 0; i < n; i++) values[t].push_back(rec->Find(MakeKey(kk, i), &v).ok() ? v : "(absent)");
      rec->pool()->allocator().ForEachAllocated([&](uint64_t off, size_t) { blocks[t].insert(off); });
      ASSERT_TRUE(rec->Close().ok());
      rec.reset();
      std::ifstream f(copies[t].path, std::ios::binary);
      bytes[t].assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    }
    for (int t = 1; t < 4; t++) {
      SCOPED_TRACE(t);
      EXPECT_TRUE(values[0] == values[t]);
      EXPECT_TRUE(blocks[0] == blocks[t]);
      EXPECT_TRUE(bytes[0] == bytes[t]) << "the pools differ after recovery (1 or 2 threads, scan or walk) and a clean close";
    }
    for (uint64_t i = 0; i < n; i++) {
      ASSERT_EQ(values[0][i], i % 3 == 0 ? "(absent)" : MakeValue(vk, i, i % 5 == 1 ? 1 : 0)) << i;
    }
  }
}

// The `next` word of the slab node holding u64 key k in pool bytes [base,
// base + size) (slots are 32-byte aligned), or ~0 if no slot holds k with
// its split-order key.
uint64_t NextOfNodeWithKey(const char* base, uint64_t size, const std::string& k) {
  const uint64_t so = nvc_hashmap_testing::SplitOrderKey(KeyKind::kU64, k);
  uint64_t key;
  std::memcpy(&key, k.data(), 8);
  for (uint64_t off = 0; off + 32 <= size; off += 32) {
    uint64_t w[4];
    std::memcpy(w, base + off, 32);
    if (w[1] == so && w[3] == key) return w[0];
  }
  return ~uint64_t(0);
}

// Crash recovery by the slab scan (format 7, u64 slab pools), each image
// taken with a writer held at a hook:
//  - an insert after its link CAS, before the link's persist: the image holds
//    its node (written, persisted, unmarked) but no durable link to it. The
//    scan must drop it (not reachable: not a record, not counted, no leak)
//    and zero its next, so that no later scan takes the free slot for a node;
//  - a remove after its mark CAS, a find having made the mark durable: the
//    marked node is still linked. The scan must unlink it (key absent,
//    Check clean).
// The list walk (forced) must leave the same: runs 2 and 3.
TEST(NvcHashmapCrash, SlabScanDropsInFlightInsertsAndCompletesRemoves) {
  for (int run = 0; run < 4; run++) {
    const int scenario = run % 2;
    const bool walk = run >= 2;  // the list walk forced: it must zero the node too
    SCOPED_TRACE(run);
    CrashHarness h("scan", {{"initial_buckets", "16"}});
    const uint64_t n = 200;
    for (uint64_t i = 0; i < n; i++) ASSERT_TRUE(h.idx->Insert(nvc_test::U64(i), nvc_test::U64(i)).ok());
    const std::string k = nvc_test::U64(scenario == 0 ? 1000 : 5);
    PauseState ps;
    ps.key = k;
    g_pause = &ps;
    std::thread t;
    if (scenario == 0) {
      nvc_hashmap_testing::SetAfterLinkHook(&PauseHook);
      t = std::thread([&] { EXPECT_TRUE(h.idx->Insert(k, nvc_test::U64(7)).ok()); });
    } else {
      nvc_hashmap_testing::SetAfterMarkHook(&PauseHook);
      t = std::thread([&] { EXPECT_TRUE(h.idx->Remove(k).ok()); });
    }
    WaitPaused(ps);
    std::string v;
    if (scenario == 1) {
      ASSERT_TRUE(h.idx->Find(k, &v).IsNotFound());  // makes the mark durable
    }
    std::vector<char> img = h.Snapshot();
    ReleaseAndJoin(ps, t);
    const uint64_t before = NextOfNodeWithKey(img.data(), img.size(), k);
    ASSERT_NE(before, ~uint64_t(0)) << "the image holds no node of the key";
    ASSERT_NE(before, 0u);
    ASSERT_EQ(before & 1, uint64_t(scenario)) << "scenario 0: an unmarked node; 1: a marked one";
    std::unique_ptr<Index> rec;
    nvc_hashmap_testing::SetForceWalkRecovery(walk);
    Status s = h.Crash(img, &rec);
    nvc_hashmap_testing::SetForceWalkRecovery(false);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(nvc_hashmap_testing::RecoveryScanned(rec.get()), !walk);
    EXPECT_TRUE(rec->Find(k, &v).IsNotFound());
    EXPECT_EQ(rec->Size(), scenario == 0 ? n : n - 1);
    Status c = rec->Check();
    EXPECT_TRUE(c.ok()) << c.ToString();
    ExpectNoLeak(rec.get());
    const uint64_t after = NextOfNodeWithKey(rec->pool()->base(), rec->pool()->size(), k);
    if (scenario == 0) {
      EXPECT_EQ(after, 0u) << "the in-flight node's next was not zeroed";
    }
    for (uint64_t i = 0; i < n; i++) {
      if (!(scenario == 1 && nvc_test::U64(i) == k)) {
        ASSERT_TRUE(rec->Find(nvc_test::U64(i), &v).ok()) << i;
      }
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
