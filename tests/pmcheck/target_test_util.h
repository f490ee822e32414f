// Test helpers shared by the tests of pmcheck's own pool-based targets
// (pmcheck_pmwcas_test.cc, pmcheck_allocator_test.cc): the clean single-
// and two-thread runs with the lint fatal, and gtest names for fault
// switch parameters. Test-only; no PM access of its own.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "pmcheck.h"

namespace pmcheck {

// One- and two-thread runs of base with the durability lint fatal report
// nothing and recover images (points: crash points per run).
inline void ExpectCleanRuns(const Config& base, int64_t points_one_thread, int64_t points_two_threads) {
  for (int threads : {1, 2}) {
    Config c = base;
    c.threads = threads;
    c.points = threads == 1 ? points_one_thread : points_two_threads;
    c.lint = true;
    Report r;
    ASSERT_TRUE(pmcheck::Run(c, &r).ok());
    EXPECT_EQ(r.total_failures(), 0u) << FormatReport(c, r);
    EXPECT_GT(r.images_recovered, 0u);
  }
}

// "pm.alloc.skip_dest_flush" -> "alloc_skip_dest_flush" (prefix "pm."
// dropped): a gtest parameter name.
inline std::string FaultTestName(const std::string& fault, size_t prefix) {
  std::string n = fault.substr(prefix);
  for (char& ch : n)
    if (ch == '.') ch = '_';
  return n;
}

}  // namespace pmcheck
