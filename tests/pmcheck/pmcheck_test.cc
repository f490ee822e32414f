// Tests for pmcheck (issue 5): with no fault the checker reports nothing;
// with each fault switch it reports a failure of the expected kind; its
// reproducer lines reproduce; the lint finds missing flushes and the
// performance lint counts redundant flushes; bad input is a clear Status.
// The real indexes' fault switches are in pmcheck_index_test.cc; their clean
// runs with the CI budget in tools/pmcheck/ci.sh. PMINDEX_LONG=1 raises the
// budgets here.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <set>
#include <string>

#include "pmcheck.h"
#include "shared_history.h"
#include "workload.h"
#include "pmindex/index.h"

namespace pmcheck {
namespace {

bool Long() { return std::getenv("PMINDEX_LONG") != nullptr; }

Config Toy(uint64_t ops = 120, int64_t points = -1) {
  Config c;
  c.index = "pmcheck_toy";
  c.ops = Long() ? ops * 5 : ops;
  c.points = points;
  c.images_per_point = 4;
  c.max_reported = 4;
  return c;
}

std::string Describe(const Config& c, const Report& r) { return FormatReport(c, r); }

Report MustRun(const Config& c) {
  Report r;
  pmindex::Status s = pmcheck::Run(c, &r);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return r;
}

uint64_t Count(const Report& r, FailKind k) { return r.counts[size_t(k)]; }

TEST(PmcheckToy, CorrectIndexHasNoFailures) {
  Config c = Toy();
  c.lint = true;
  Report r = MustRun(c);
  EXPECT_EQ(r.total_failures(), 0u) << Describe(c, r);
  EXPECT_GT(r.images, 500u);
  EXPECT_EQ(r.images, r.images_recovered);
  EXPECT_EQ(r.points_tried, r.crash_points);  // --points all
  EXPECT_GT(r.creation_interrupted, 0u);      // creation itself was crashed
  EXPECT_TRUE(r.missing_flushes.empty());
  EXPECT_TRUE(r.redundant_flushes.empty());
  EXPECT_TRUE(r.empty_fences.empty());
}

TEST(PmcheckToy, CorrectIndexNoFailuresWithManyImagesPerPoint) {
  Config c = Toy(40);
  c.images_per_point = 12;
  c.seed = 7;
  Report r = MustRun(c);
  EXPECT_EQ(r.total_failures(), 0u) << Describe(c, r);
}

struct FaultCase {
  const char* fault;
  FailKind kind;  // the kind that must be reported
};

class PmcheckToyFault : public ::testing::TestWithParam<FaultCase> {};

TEST_P(PmcheckToyFault, IsCaught) {
  Config c = Toy();
  c.image_budget = Long() ? 0 : 600;  // a sample is enough to catch each fault
  c.stop_after = Long() ? 0 : 40;
  c.faults = {GetParam().fault};
  c.lint = true;
  Report r = MustRun(c);
  EXPECT_GT(Count(r, GetParam().kind), 0u) << GetParam().fault << "\n" << Describe(c, r);
  EXPECT_GT(r.total_failures(), 0u);
}

INSTANTIATE_TEST_SUITE_P(
    Faults, PmcheckToyFault,
    ::testing::Values(FaultCase{"pmcheck_toy.create.skip_meta_flush", FailKind::kLostAck},   // creation not durable
                      FaultCase{"pmcheck_toy.insert.skip_kv_flush", FailKind::kLostAck},     // dropped flush
                      FaultCase{"pmcheck_toy.insert.bitmap_before_kv", FailKind::kTorn},     // swapped persists
                      FaultCase{"pmcheck_toy.alloc.skip_log", FailKind::kLeak},              // skipped micro-log
                      FaultCase{"pmcheck_toy.update.skip_flush", FailKind::kMissingFlush},   // lint
                      FaultCase{"pmcheck_toy.insert.unlogged_store", FailKind::kUnloggedStore},
                      FaultCase{"pmcheck_toy.scan.skip_first", FailKind::kInvariant}));  // live scan misses a record

TEST(PmcheckToy, DroppedFlushIsAlsoCaughtByCrashImagesWithoutLint) {
  Config c = Toy();
  c.image_budget = 600;
  c.stop_after = 10;
  c.faults = {"pmcheck_toy.update.skip_flush"};
  Report r = MustRun(c);
  EXPECT_GT(Count(r, FailKind::kLostAck), 0u) << Describe(c, r);
  EXPECT_EQ(Count(r, FailKind::kMissingFlush), 0u);  // lint not fatal without --lint
  EXPECT_FALSE(r.missing_flushes.empty());           // but still counted
}

// A flush is durable only at the flushing thread's next fence: a commit store
// made between the slot's flush and that fence can persist first. The op
// ends with a fence, so the lint's missing-fence rule does not fire; only
// crash images that drop a flushed-but-unfenced line can catch it.
TEST(PmcheckToy, FlushWithoutFenceBeforeCommitIsCaughtByCrashImages) {
  Config c = Toy();
  c.image_budget = 600;
  c.stop_after = 10;
  c.faults = {"pmcheck_toy.insert.skip_kv_fence"};
  Report r = MustRun(c);
  EXPECT_GT(Count(r, FailKind::kTorn) + Count(r, FailKind::kLostAck), 0u) << Describe(c, r);
  EXPECT_EQ(Count(r, FailKind::kMissingFence), 0u);
}

// The unfenced image finds the same missing fence by construction: with
// only images 0 (keep nothing) and 1 (keep everything) per point, no random
// prefixes, it is caught only by the image that drops the flushed but
// unfenced slot and keeps the pending commit store; switched off, nothing is
// found.
TEST(PmcheckToy, MissingFenceIsCaughtByTheUnfencedImage) {
  Config c = Toy(60);
  c.images_per_point = 2;
  c.faults = {"pmcheck_toy.insert.skip_kv_fence"};
  Report r = MustRun(c);
  EXPECT_GT(r.unfenced_images, 0u);
  EXPECT_GT(Count(r, FailKind::kTorn) + Count(r, FailKind::kLostAck), 0u) << Describe(c, r);
  for (const Failure& f : r.failures) EXPECT_EQ(f.image, 2) << f.what;  // only the unfenced image

  c.unfenced_image = false;
  Report off = MustRun(c);
  EXPECT_EQ(off.unfenced_images, 0u);
  EXPECT_EQ(off.total_failures(), 0u) << Describe(c, off);

  // On the correct toy the unfenced image finds nothing (its persists
  // are one line each, so it rarely differs from images 0 and 1).
  c.unfenced_image = true;
  c.faults.clear();
  Report clean = MustRun(c);
  EXPECT_EQ(clean.total_failures(), 0u) << Describe(c, clean);
}

// Crashes during recovery: a recovery that persists its cleared micro-log
// before freeing the logged node is correct when it runs to the end, so
// crash images of the workload alone find nothing; crashing the recovery
// itself and recovering again finds the leaked node.
TEST(PmcheckToy, RecoveryCrashesFindANonIdempotentRecovery) {
  Config c = Toy();
  c.faults = {"pmcheck_toy.recover.clear_log_first"};
  // Every recovery that changes the pool (a logged allocation): the leak
  // needs a first crash after the node's alloc bit and before its link.
  c.recovery_crashes = 1000;
  Report r = MustRun(c);
  EXPECT_GT(r.recoveries_recorded, 0u) << Describe(c, r);
  EXPECT_GT(r.recovery_images, 0u);
  EXPECT_GT(Count(r, FailKind::kLeak), 0u) << Describe(c, r);
  bool double_crash = false;
  for (const Failure& f : r.failures) double_crash |= f.what.find("double crash") != std::string::npos;
  EXPECT_TRUE(double_crash) << Describe(c, r);

  c.recovery_crashes = 0;
  Report off = MustRun(c);
  EXPECT_EQ(off.recovery_images, 0u);
  EXPECT_EQ(off.total_failures(), 0u) << Describe(c, off);

  // The correct toy's recovery survives being crashed.
  c.recovery_crashes = 1000;
  c.faults.clear();
  Report clean = MustRun(c);
  EXPECT_GT(clean.recovery_images, 0u);
  EXPECT_EQ(clean.total_failures(), 0u) << Describe(c, clean);
}

TEST(PmcheckToy, SampledPointsStillCatchASwappedPersist) {
  Config c = Toy(200, 150);
  c.faults = {"pmcheck_toy.insert.bitmap_before_kv"};
  Report r = MustRun(c);
  EXPECT_EQ(r.points_tried, 150u);
  EXPECT_GT(r.total_failures(), 0u) << Describe(c, r);
}

TEST(PmcheckToy, ReproducerReproduces) {
  Config c = Toy();
  c.image_budget = 300;
  c.faults = {"pmcheck_toy.insert.skip_kv_flush"};
  Report r = MustRun(c);
  ASSERT_FALSE(r.failures.empty());
  const Failure* f = nullptr;
  for (const auto& x : r.failures)
    if (x.point >= 0) {
      f = &x;
      break;
    }
  ASSERT_NE(f, nullptr);
  std::string line = Reproducer(c, *f);
  EXPECT_NE(line.find("--point " + std::to_string(f->point)), std::string::npos) << line;
  EXPECT_NE(line.find("--image " + std::to_string(f->image)), std::string::npos) << line;
  EXPECT_NE(line.find("--fault pmcheck_toy.insert.skip_kv_flush"), std::string::npos) << line;

  Config again = c;
  again.only_point = f->point;
  again.only_image = f->image;
  Report r2 = MustRun(again);
  EXPECT_EQ(r2.images, 1u);
  EXPECT_GT(Count(r2, f->kind), 0u) << Describe(again, r2);
}

TEST(PmcheckToy, PerformanceLintCountsRedundantFlushes) {
  Config c = Toy(200, 0);
  c.faults = {"pmcheck_toy.remove.redundant_flush"};
  Report r = MustRun(c);
  ASSERT_TRUE(r.redundant_flushes.count("remove")) << Describe(c, r);
  EXPECT_GT(r.redundant_flushes.at("remove"), 0u);
  EXPECT_EQ(r.redundant_flushes.size(), 1u);
  EXPECT_EQ(r.total_failures(), 0u);  // performance lint is not a failure
}

TEST(PmcheckToy, KillModeFindsNothingOnCorrectIndex) {
  Config c = Toy(100, 0);
  c.kills = Long() ? 150 : 40;
  c.ops_per_kill_round = 60;
  Report r = MustRun(c);
  EXPECT_EQ(r.kills, uint64_t(c.kills));
  EXPECT_GT(r.kills_mid_workload + r.kills_in_open, uint64_t(c.kills) / 2);
  EXPECT_EQ(r.total_failures(), 0u) << Describe(c, r);
}

TEST(PmcheckToy, KillModeCatchesABrokenRecovery) {
  // Kills leave the page cache intact, so they cannot see a missing flush;
  // they do see recovery that loses data.
  Config c = Toy(100, 0);
  c.kills = 10;
  c.faults = {"pmcheck_toy.recover.lose_data"};
  Report r = MustRun(c);
  EXPECT_GT(Count(r, FailKind::kLostAck), 0u) << Describe(c, r);
}

// --drop-fence K records as if the K-th fence call site had no fence: on
// the toy index (11 fence sites), dropping each site in turn must be
// reported for most of them (the toy's fences are all needed except where
// a later fence of the same op orders the same flushes), every dropped site
// drops fences, a site past the last drops nothing and reports nothing,
// and the same run without a drop is clean.
TEST(PmcheckToy, DroppedFenceSitesAreReported) {
  Config c = Toy(200, 300);
  c.images_per_point = 2;
  c.stop_after = 1;
  Report clean = MustRun(c);
  ASSERT_EQ(clean.total_failures(), 0u) << Describe(c, clean);
  ASSERT_GE(clean.fence_sites, 4u) << Describe(c, clean);
  uint64_t reported = 0;
  for (uint64_t k = 1; k <= clean.fence_sites; k++) {
    c.drop_fence = k;
    Report r = MustRun(c);
    EXPECT_GT(r.fences_dropped, 0u) << "site " << k;
    EXPECT_FALSE(r.dropped_site.empty()) << "site " << k;
    reported += r.total_failures() > 0;
  }
  EXPECT_GE(reported * 2, clean.fence_sites) << reported << " of " << clean.fence_sites << " sites reported";
  c.drop_fence = clean.fence_sites + 1;
  Report none = MustRun(c);
  EXPECT_EQ(none.fences_dropped, 0u);
  EXPECT_EQ(none.total_failures(), 0u) << Describe(c, none);
}

// --site-counts lists the flush and fence call sites a run reached, and
// --drop-site deletes one of them from the model: most of the toy's flush
// sites are then reported, and the same run without the drop is clean.
TEST(PmcheckToy, SiteCountsAndDroppedSites) {
  Config c = Toy(200, 300);
  c.images_per_point = 2;
  c.stop_after = 1;
  c.site_counts = ::testing::TempDir() + "pmcheck_sites_" + std::to_string(::getpid());
  std::remove(c.site_counts.c_str());
  Report clean = MustRun(c);
  ASSERT_EQ(clean.total_failures(), 0u) << Describe(c, clean);
  std::vector<std::string> flushes;
  {
    std::ifstream in(c.site_counts);
    std::string kind, site;
    uint64_t count = 0;
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream ls(line);
      ls >> kind >> site >> count;
      EXPECT_GT(count, 0u) << line;
      if (kind == "flush") flushes.push_back(site);
    }
  }
  std::remove(c.site_counts.c_str());
  c.site_counts.clear();
  ASSERT_GE(flushes.size(), 3u);
  uint64_t reported = 0;
  for (const std::string& site : flushes) {
    c.drop_site = site;
    Report r = MustRun(c);
    EXPECT_GT(r.named_drops, 0u) << site;
    reported += r.total_failures() > 0;
  }
  EXPECT_GE(reported * 2, flushes.size()) << reported << " of " << flushes.size() << " flush sites reported";
  c.drop_site = "no-such-object+0x1";
  Report none = MustRun(c);
  EXPECT_EQ(none.named_drops, 0u);
  EXPECT_EQ(none.total_failures(), 0u) << Describe(c, none);
}

// --sweep: whole-range key runs in key order (insert ascending, remove
// descending, upsert descending, remove ascending), for u64 and byte keys.
TEST(PmcheckWorkload, SweepRunsOverTheWholeRangeInKeyOrder) {
  for (auto kk : {pmindex::KeyKind::kU64, pmindex::KeyKind::kBytes}) {
    Config c;
    c.sweep = true;
    c.keys = 7;
    c.key_kind = kk;
    c.value_kind = pmindex::ValueKind::kU64;
    Workload w(c, 2, 7 * 5, 1);
    for (int t = 0; t < 2; ++t) {
      const auto& ops = w.ops()[size_t(t)];
      ASSERT_EQ(ops.size(), 35u);
      const OpType want[4] = {OpType::kInsert, OpType::kRemove, OpType::kUpsert, OpType::kRemove};
      for (size_t i = 0; i < ops.size(); ++i) {
        EXPECT_EQ(ops[i].type, want[(i / 7) % 4]) << i;
        EXPECT_EQ(w.Owner(ops[i].kid), t);
        if (i % 7 == 0) continue;
        const std::string& prev = w.key(ops[i - 1].kid);
        const std::string& cur = w.key(ops[i].kid);
        auto less = [&](const std::string& a, const std::string& b) {
          if (kk == pmindex::KeyKind::kBytes) return a < b;
          uint64_t x, y;
          std::memcpy(&x, a.data(), 8);
          std::memcpy(&y, b.data(), 8);
          return x < y;
        };
        const bool ascending = (i / 7) % 4 == 0 || (i / 7) % 4 == 3;
        EXPECT_TRUE(ascending ? less(prev, cur) : less(cur, prev)) << "op " << i << " thread " << t;
      }
    }
  }
  Config bad = Toy();
  bad.sweep = true;
  bad.drain = true;
  Report r;
  EXPECT_TRUE(pmcheck::Run(bad, &r).IsInvalidArgument());
}

// --shared-writes: the versions a crash may recover for a key every thread
// writes follow from the ops' real-time order (shared_history.h). Events
// are numbered as in a recording; each step below is one crash point.
TEST(PmcheckSharedHistory, AllowedVersionsFollowRealTimeOrder) {
  SharedHistory h(10, 1);
  auto allowed = [&] { return h.Allowed().at(0).allowed; };
  auto superseded = [&] { return h.Allowed().at(0).superseded; };
  using V = std::vector<uint32_t>;
  EXPECT_EQ(h.Allowed().at(0).kid, 10u);
  EXPECT_EQ(allowed(), V{0});  // nothing written yet: absent
  h.WriteBegan(10, 1, 10);
  EXPECT_EQ(allowed(), (V{0, 1}));  // in flight: either
  h.WriteEnded(10, 10, 20);
  EXPECT_EQ(allowed(), V{1});  // completed: absent is gone
  EXPECT_EQ(superseded(), V{0});
  h.WriteBegan(10, 2, 30);
  EXPECT_EQ(allowed(), (V{1, 2}));
  h.WriteEnded(10, 30, 40);
  EXPECT_EQ(allowed(), V{2});  // version 2 began after version 1 ended
  EXPECT_EQ(superseded(), (V{0, 1}));
  // Two overlapping writes (an insert of 3 and a remove): either may be
  // the later one.
  h.WriteBegan(10, 3, 50);
  h.WriteBegan(10, 0, 55);
  h.WriteEnded(10, 50, 60);
  h.WriteEnded(10, 55, 65);
  EXPECT_EQ(allowed(), (V{0, 3}));
  EXPECT_EQ(superseded(), (V{1, 2}));
  // A completed read returned the version of a write still in flight: that
  // write has linearized, after both overlapping ones.
  h.WriteBegan(10, 4, 70);
  EXPECT_EQ(allowed(), (V{0, 3, 4}));
  h.ReadEnded(10, 4, 75);
  EXPECT_EQ(allowed(), V{4});
  EXPECT_EQ(superseded(), (V{0, 1, 2, 3}));
  // A read that began after write 5 ended and returned version 6 (a write
  // that began before 5 ended): 5 linearized before the read, 6 is the
  // last write before it, so 5 is overwritten although 6 began first.
  h.WriteEnded(10, 70, 80);
  h.WriteBegan(10, 6, 90);
  h.WriteBegan(10, 5, 92);
  h.WriteEnded(10, 92, 95);
  EXPECT_EQ(allowed(), (V{5, 6}));
  h.ReadEnded(10, 6, 100);
  EXPECT_EQ(allowed(), V{6});
  // Key ids outside the shared-write range are ignored.
  h.WriteBegan(3, 9, 110);
  EXPECT_EQ(allowed(), V{6});
}

TEST(PmcheckWorkload, SharedWriteKeysAreWrittenByEveryThread) {
  Config c;
  c.shared_keys = c.shared_writes = true;
  c.keys = 6;
  Workload w(c, 2, 300, 1);
  ASSERT_EQ(w.num_keys(), 2 * 6 + Workload::kSharedWriteKeys);
  for (int t = 0; t < 2; ++t) {
    std::set<OpType> types;
    for (const Op& op : w.ops()[size_t(t)]) {
      if (w.SharedWrite(op.kid)) {
        types.insert(op.type);
      } else if (op.type != OpType::kFind && op.type != OpType::kScan) {
        EXPECT_EQ(w.Owner(op.kid), t);
      }
    }
    EXPECT_TRUE(types.count(OpType::kInsert) && types.count(OpType::kRemove) && types.count(OpType::kUpdate)) << t;
  }
  // Versions of a shared-write key are unique across threads.
  for (uint32_t kid = 12; kid < w.num_keys(); ++kid) {
    std::set<uint32_t> seen;
    for (const auto& ops : w.ops())
      for (const Op& op : ops)
        if (op.kid == kid && op.version) {
          EXPECT_TRUE(seen.insert(op.version).second) << kid << " v" << op.version;
        }
  }
  // Without --shared-writes no such key exists.
  c.shared_writes = false;
  Workload plain(c, 2, 300, 1);
  EXPECT_EQ(plain.num_keys(), 12u);
  EXPECT_FALSE(plain.SharedWrite(11));
}

TEST(PmcheckBadInput, ClearStatus) {
  Report r;
  Config c;
  c.index = "no_such_index";
  EXPECT_TRUE(pmcheck::Run(c, &r).IsInvalidArgument());
  c.index = "dram_btree";
  EXPECT_TRUE(pmcheck::Run(c, &r).IsInvalidArgument());  // transient
  c = Toy();
  c.key_kind = pmindex::KeyKind::kBytes;
  EXPECT_TRUE(pmcheck::Run(c, &r).IsInvalidArgument());
  c = Toy();
  c.threads = 0;
  EXPECT_TRUE(pmcheck::Run(c, &r).IsInvalidArgument());
  c = Toy();
  c.shared_writes = true;  // needs --shared-keys and 2+ threads
  EXPECT_TRUE(pmcheck::Run(c, &r).IsInvalidArgument());
  c.threads = 2;
  EXPECT_TRUE(pmcheck::Run(c, &r).IsInvalidArgument());
  c = Toy();
  c.only_point = 1 << 30;
  EXPECT_TRUE(pmcheck::Run(c, &r).IsInvalidArgument());
}

}  // namespace
// --pct-timeout: a scheduled recording in which a thread spins without a
// pm:: call (holding the toy's lock, so the other thread cannot run either)
// is aborted with exit code 3 and the schedule seed named, instead of
// hanging (with pct_timeout = 0 this test hangs until ctest's timeout).
TEST(PmcheckPct, TimeoutAbortsARecordingThatMakesNoProgress) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Config c;
  c.index = "pmcheck_toy";
  c.threads = 2;
  c.ops = 20;
  c.pct = 3;
  c.points = 0;
  c.pct_timeout = 0.5;
  c.faults = {"pmcheck_toy.insert.spin_forever"};
  EXPECT_EXIT(
      {
        Report r;
        (void)pmcheck::Run(c, &r);
        std::_Exit(0);
      },
      testing::ExitedWithCode(3), "made no progress for 0.5 s.*--pct 3 --schedule-seed 1");
}

}  // namespace pmcheck
