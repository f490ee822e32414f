// pmcheck on its "allocator" target (tools/pmcheck/allocator_target.cc: the
// crash-safe allocator driven directly through a u64 map whose records are
// blocks of every size class and large blocks, in a pool that grows to a
// small maximum and then reclaims): clean single- and two-thread runs with
// the durability lint fatal report nothing and reach pool growth, and each
// allocator fault switch (docs/allocator.md) is reported. Also the
// checker's --drop-fence: dropping a fence site of the allocator's commit
// is reported, and the same run without the drop reports nothing; and
// fence-window images find a dropped fence that sampled images miss.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "pmcheck.h"
#include "target_test_util.h"

namespace pmcheck {
namespace {

Config Base() {
  Config c;
  c.index = "allocator";
  c.ops = 120;
  c.keys = 24;
  c.timeout_s = 10;
  c.max_reported = 3;
  return c;
}

TEST(PmcheckAllocator, CleanRunsReportNothing) { ExpectCleanRuns(Base(), 200, 100); }

TEST(PmcheckAllocator, RecoveryCrashesReportNothing) {
  Config c = Base();
  c.points = 60;
  c.recovery_crashes = 3;
  c.recovery_image_budget = 30;
  Report r;
  ASSERT_TRUE(pmcheck::Run(c, &r).ok());
  EXPECT_EQ(r.total_failures(), 0u) << FormatReport(c, r);
  EXPECT_GT(r.recovery_images, 0u);
}

TEST(PmcheckAllocator, RejectsByteKeysAndUnknownParams) {
  Config c = Base();
  c.key_kind = pmindex::KeyKind::kBytes;
  Report r;
  EXPECT_FALSE(pmcheck::Run(c, &r).ok());
  c = Base();
  c.params["leaf_size"] = "8";
  EXPECT_FALSE(pmcheck::Run(c, &r).ok());
}

// Fence-window images (--window-images) find a dropped fence of a rarely
// run allocator path that sampled images miss. The rare fence sites (run
// 4-20 times by the workload: Refill's and AllocLarge's commit fences) are
// tried in first-recorded order with 100 window images each; the first
// one reported (Refill's second fence in the GCC and the clang builds:
// a new run's bitmap and the lane durable before the lane names the
// block) must not be reported by 300 sampled images (with the unfenced
// image). Site numbers depend on the compiler's inlining, hence the
// search. The window images report nothing without a drop.
TEST(PmcheckAllocator, WindowImagesFindADroppedRareFence) {
  Config c = Base();
  c.ops = 300;
  c.images_per_point = 3;
  c.points = 0;
  const std::string sites = "/tmp/pmcheck_window_sites_" + std::to_string(::getpid()) + ".txt";
  std::remove(sites.c_str());
  c.site_counts = sites;
  Report rec;
  ASSERT_TRUE(pmcheck::Run(c, &rec).ok());
  c.site_counts.clear();
  std::vector<uint64_t> rare;
  {
    std::ifstream in(sites);
    std::string kind, name;
    uint64_t count = 0, k = 0;
    while (in >> kind >> name >> count) {
      if (kind != "fence") continue;
      in >> k;
      if (name.rfind("libpmindex_internal", 0) == 0 && count >= 4 && count <= 20) rare.push_back(k);
    }
  }
  std::remove(sites.c_str());
  std::sort(rare.begin(), rare.end());
  ASSERT_FALSE(rare.empty());
  c.window_images = 100;
  Report clean;
  ASSERT_TRUE(pmcheck::Run(c, &clean).ok());
  EXPECT_EQ(clean.total_failures(), 0u) << FormatReport(c, clean);
  EXPECT_GE(clean.window_images, 90u);
  EXPECT_GT(clean.window_shapes, 10u);
  c.stop_after = 1;
  uint64_t found = 0;
  for (uint64_t k : rare) {
    c.drop_fence = k;
    Report r;
    ASSERT_TRUE(pmcheck::Run(c, &r).ok());
    if (r.total_failures() > 0) {
      found = k;
      break;
    }
  }
  ASSERT_NE(found, 0u) << "no rare fence site's drop was reported by the window images";
  c.drop_fence = found;
  c.window_images = 0;
  c.points = 1000;
  c.image_budget = 300;
  Report off;
  ASSERT_TRUE(pmcheck::Run(c, &off).ok());
  EXPECT_EQ(off.total_failures(), 0u) << "fence site " << found << ": " << FormatReport(c, off);
  EXPECT_GT(off.unfenced_images, 0u);
}

class PmcheckAllocatorFault : public ::testing::TestWithParam<const char*> {};

TEST_P(PmcheckAllocatorFault, IsReported) {
  Config c = Base();
  c.ops = 200;
  c.image_budget = 3000;
  c.images_per_point = 3;
  c.stop_after = 1;
  c.faults = {GetParam()};
  // A new run's bitmap matters only on a chunk that held records before
  // and whose bitmap spans several lines: a smaller pool and more ops (this
  // seed reaches it; not every seed does).
  if (std::string(GetParam()) == "pm.run.skip_bitmap_persist") {
    c.ops = 1000;
    c.keys = 40;
    c.params["max_chunks"] = "12";
  }
  Report r;
  ASSERT_TRUE(pmcheck::Run(c, &r).ok());
  EXPECT_GT(r.total_failures(), 0u) << FormatReport(c, r);
}

INSTANTIATE_TEST_SUITE_P(Faults, PmcheckAllocatorFault,
                         ::testing::Values("pm.alloc.skip_dest_flush", "pm.alloc.skip_commit_fence",
                                           "pm.alloc.large.skip_state_flush", "pm.free.skip_bit_flush",
                                           "pm.run.skip_bitmap_persist", "pm.grow.skip_size_persist",
                                           "pm.alloc.skip_replay"),
                         [](const ::testing::TestParamInfo<const char*>& i) { return FaultTestName(i.param, 3); });

}  // namespace
}  // namespace pmcheck
