// pmcheck on its "pmwcas" target (tools/pmcheck/pmwcas_target.cc: a hash map
// built only on the pool's PMwCAS): clean single- and two-thread runs with the
// durability lint fatal report nothing, and each PMwCAS fault switch
// (docs/pmwcas.md) is reported.
#include <gtest/gtest.h>

#include "pmcheck.h"
#include "target_test_util.h"

namespace pmcheck {
namespace {

Config Base() {
  Config c;
  c.index = "pmwcas";
  c.ops = 60;
  c.timeout_s = 10;
  c.max_reported = 3;
  return c;
}

TEST(PmcheckPmwcas, CleanRunsReportNothing) { ExpectCleanRuns(Base(), 150, 80); }

class PmcheckPmwcasFault : public ::testing::TestWithParam<const char*> {};

TEST_P(PmcheckPmwcasFault, IsReported) {
  Config c = Base();
  c.points = 400;
  c.stop_after = 1;
  c.faults = {GetParam()};
  Report r;
  ASSERT_TRUE(pmcheck::Run(c, &r).ok());
  EXPECT_GT(r.total_failures(), 0u) << FormatReport(c, r);
}

INSTANTIATE_TEST_SUITE_P(Faults, PmcheckPmwcasFault,
                         ::testing::Values("pmwcas.skip_descriptor_persist", "pmwcas.skip_status_persist",
                                           "pmwcas.skip_dirty_flush"),
                         [](const ::testing::TestParamInfo<const char*>& i) { return FaultTestName(i.param, 7); });

}  // namespace
}  // namespace pmcheck
