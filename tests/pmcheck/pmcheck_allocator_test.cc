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

// Fence-window images (--window-images): with the 22nd fence site dropped
// (AllocLarge's commit fence: a large block's chunk state and *dest durable
// before the lane goes idle), the crash just before the next fence that
// keeps the lane's idle word and drops the state and *dest stores leaves
// a slot naming a free block. 100 window images find it; 300 sampled
// images with the unfenced image (and 6000 on a quiet run) do not, and the
// window images report nothing without the drop.
TEST(PmcheckAllocator, WindowImagesFindADroppedLargeBlockFence) {
  Config c = Base();
  c.ops = 300;
  c.images_per_point = 3;
  c.points = 0;
  c.window_images = 100;
  Report clean;
  ASSERT_TRUE(pmcheck::Run(c, &clean).ok());
  EXPECT_EQ(clean.total_failures(), 0u) << FormatReport(c, clean);
  EXPECT_GE(clean.window_images, 90u);
  EXPECT_GT(clean.window_shapes, 10u);
  c.drop_fence = 22;
  c.stop_after = 1;
  Report r;
  ASSERT_TRUE(pmcheck::Run(c, &r).ok());
  EXPECT_NE(r.dropped_site, "") << FormatReport(c, r);
  EXPECT_GT(r.total_failures(), 0u) << FormatReport(c, r);
  c.window_images = 0;
  c.points = 1000;
  c.image_budget = 300;
  Report off;
  ASSERT_TRUE(pmcheck::Run(c, &off).ok());
  EXPECT_EQ(off.total_failures(), 0u) << FormatReport(c, off);
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
