// Every tool follows one exit-code convention (tools/common/cli.h,
// docs/CONTRIBUTING.md "Tool exit codes"): 0 ok, 1 the tool found a problem,
// 2 usage (unknown option, bad or out-of-range value, unknown name), 3 the
// work could not start (missing or busy pool, I/O error). Also: pmcheck
// requires --index and refuses unknown --fault names, and pmbench says what
// was wrong with a negative count.
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

#include "testing/process.h"

namespace {

struct ToolRun {
  int code;
  std::string out;
};

ToolRun Tool(const char* bin, const std::string& args) {
  auto r = pmindex::testutil::RunCommand(std::string(bin) + " " + args + " 2>&1");
  return {r.code, r.out};
}

bool Has(const ToolRun& r, const std::string& s) { return r.out.find(s) != std::string::npos; }

const std::string kMissingPool = "/dev/shm/tools-cli-test-no-such-pool-" + std::to_string(::getpid());

TEST(ToolsCli, UnknownOptionsAreUsageErrors) {
  for (const char* bin : {PMBENCH_BIN, PMCHECK_BIN, PMINDEX_POOL_BIN, PMKV_BIN}) {
    ToolRun r = Tool(bin, "--no-such-option");
    EXPECT_EQ(r.code, 2) << bin << ": " << r.out;
    r = Tool(bin, "--help");
    EXPECT_EQ(r.code, 0) << bin << ": " << r.out;
  }
}

TEST(ToolsCli, OutOfRangeValuesAreUsageErrors) {
  ToolRun r = Tool(PMCHECK_BIN, "--index pmcheck_toy --threads 100");
  EXPECT_EQ(r.code, 2) << r.out;
  r = Tool(PMCHECK_BIN, "--index pmcheck_toy --points sometimes");
  EXPECT_EQ(r.code, 2) << r.out;
  r = Tool(PMBENCH_BIN, "--index dram_btree -t 0");
  EXPECT_EQ(r.code, 2) << r.out;
}

TEST(ToolsCli, PmbenchSaysWhatIsWrongWithANegativeCount) {
  ToolRun r = Tool(PMBENCH_BIN, "--index dram_btree -n -5");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(Has(r, "--records")) << r.out;
  EXPECT_TRUE(Has(r, "must not be negative")) << r.out;
  EXPECT_FALSE(Has(r, "2^40")) << r.out;
  r = Tool(PMBENCH_BIN, "--index dram_btree -p -1");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(Has(r, "must not be negative")) << r.out;
}

TEST(ToolsCli, PmcheckRequiresAnIndex) {
  ToolRun r = Tool(PMCHECK_BIN, "");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(Has(r, "--index is required")) << r.out;
  EXPECT_FALSE(Has(r, "RESULT")) << r.out;
  r = Tool(PMCHECK_BIN, "--index no_such_index");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(Has(r, "unknown index")) << r.out;
  r = Tool(PMCHECK_BIN, "--list");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(Has(r, "pmcheck_toy")) << r.out;
  // The toy is still there by its name.
  r = Tool(PMCHECK_BIN, "--index pmcheck_toy --ops 20 --points none");
  EXPECT_EQ(r.code, 0) << r.out;
}

TEST(ToolsCli, PmcheckRefusesAnUnknownFault) {
  ToolRun r = Tool(PMCHECK_BIN, "--index pmcheck_toy --ops 20 --points none --fault pmcheck_toy.no_such_fault");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(Has(r, "no fault switch has this name")) << r.out;
  EXPECT_FALSE(Has(r, "RESULT")) << r.out;
  // A known one runs (and is caught: exit 1).
  r = Tool(PMCHECK_BIN, "--index pmcheck_toy --ops 120 --points all --images-per-point 4 --fault pmcheck_toy.insert.skip_kv_flush");
  EXPECT_EQ(r.code, 1) << r.out;
}

TEST(ToolsCli, MissingPoolCannotRun) {
  ToolRun r = Tool(PMINDEX_POOL_BIN, "check " + kMissingPool);
  EXPECT_EQ(r.code, 3) << r.out;
  r = Tool(PMINDEX_POOL_BIN, "info " + kMissingPool);
  EXPECT_EQ(r.code, 3) << r.out;
  r = Tool(PMKV_BIN, "get " + kMissingPool + " k");
  EXPECT_EQ(r.code, 3) << r.out;
  r = Tool(PMBENCH_BIN, "--index fptree -n 10 -p 10 --skip_load --pool_path " + kMissingPool);
  EXPECT_EQ(r.code, 1) << r.out;  // the target failed; the run itself went on
}

}  // namespace
