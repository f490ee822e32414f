// Crash tests of bztree: a mixed workload (inserts, updates, upserts,
// removes) on 256-byte nodes, so that consolidations, splits, merges,
// dropped leaves and root changes all happen, with the durable image (power
// failure as of that fence, kit/test_observer.h) saved at every fence and
// verified after the operation: it opens (PMwCAS recovery and the epoch
// bump), passes Check, leaks nothing (ForEachOwnedBlock == the allocator's
// blocks: replaced nodes and out-of-line values owned by descriptors are
// freed by recovery), holds every acknowledged operation (the one in flight
// either done or not), scans in key order and accepts writes that help any
// frozen node the crash left. Each fault switch (kFaultSwitches) must be
// caught.
// The workload and the checks are testing/crash_harness.h's MixedCrashTest.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "bztree/bztree_tree.h"
#include "testing/crash_harness.h"

namespace pmindex {
namespace {

class BzTreeCrash : public testutil::MixedCrashTest {
 protected:
  void SetUp() override {
    Configure("bztree", {{"node_size", "256"}});
    opts_.max_key_size = 24;
  }
};

// About 4 fences per operation: 200 clean operations give 700+ crash images.
TEST_P(BzTreeCrash, EveryFenceRecovers) { ExpectEveryFenceRecovers(200, 150, 700); }

std::vector<testutil::CrashCase> Cases() {
  const std::vector<std::string> faults(std::begin(internal::bztree::kFaultSwitches), std::end(internal::bztree::kFaultSwitches));
  // u64 values in this workload are inline: no value to flush.
  return testutil::CrashCases(faults, [](bool bytes, const std::string& f) { return !bytes && f == "bztree.insert.skip_value_flush"; });
}

INSTANTIATE_TEST_SUITE_P(All, BzTreeCrash, testing::ValuesIn(Cases()), testutil::CrashCaseName);

}  // namespace
}  // namespace pmindex
