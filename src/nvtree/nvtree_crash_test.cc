// Crash tests of nvtree: a mixed workload (inserts, updates, upserts,
// removes) on small leaves and PLNs, so that splits, compactions, unlinked
// leaves and inner rebuilds all happen, with the durable image (power
// failure as of that fence, kit/test_observer.h) saved at every fence and
// verified after the operation: it opens, passes Check, leaks nothing
// (ForEachOwnedBlock == the allocator's blocks), holds every acknowledged
// operation (the one in flight either done or not), scans in key order and
// accepts writes. Each fault switch of the persist order must be caught.
// A second test SIGKILLs a child process in the middle of a load and
// reopens the pool it leaves (recovery from a real process death, not from
// a simulated image).
// The workload and the checks are testing/crash_harness.h's MixedCrashTest.
#include <unistd.h>

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "pmindex/index.h"
#include "pmindex/pm/pool.h"
#include "testing/crash_harness.h"
#include "testing/process.h"

namespace pmindex {
namespace {

class NVTreeCrash : public testutil::MixedCrashTest {
 protected:
  void SetUp() override {
    Configure("nvtree", {{"leaf_size", "4"}, {"inner_size", "2"}});
    faults_off_while_verifying_ = true;
  }
};

TEST_P(NVTreeCrash, EveryFenceRecovers) { ExpectEveryFenceRecovers(400, 300); }

std::vector<testutil::CrashCase> Cases() {
  return testutil::CrashCases({"nvtree.append.skip_entry_flush", "nvtree.append.count_before_entry", "nvtree.append.skip_count_flush",
                               "nvtree.replace.skip_leaf_flush", "nvtree.replace.free_before_swap"},
                              // u64 leaves hold no blocks
                              [](bool bytes, const std::string& f) { return !bytes && f == "nvtree.replace.free_before_swap"; });
}

INSTANTIATE_TEST_SUITE_P(All, NVTreeCrash, testing::ValuesIn(Cases()), testutil::CrashCaseName);

// SIGKILL of a process loading the tree (small leaves and PLNs: leaf
// replacements, compactions and inner rebuilds throughout): every
// acknowledged step survives the reopen, Check passes, nothing leaks, and
// the tree takes writes. Step i inserts key i and, for i % 3 == 2, removes
// key i - 1.
TEST(NVTreeKill, SigkillWhileLoading) {
  for (bool bytes : {false, true}) {
    const std::string path = "/dev/shm/nvtree-kill-" + std::to_string(getpid()) + (bytes ? "-b" : "-u") + ".pool";
    pm::Pool::Remove(path);
    Options o;
    o.pool_path = path;
    o.pool_size = 32ull << 20;
    o.key_kind = bytes ? KeyKind::kBytes : KeyKind::kU64;
    o.value_kind = bytes ? ValueKind::kBytes : ValueKind::kU64;
    o.params = {{"leaf_size", "8"}, {"inner_size", "4"}};
    auto key = [&](uint64_t i) {
      return bytes ? "k" + std::to_string(i * 7919 % 1000003) : std::string(U64Slice(i * 0x9E3779B97F4A7C15ull));
    };
    auto val = [&](uint64_t i) { return bytes ? "v" + std::to_string(i) : std::string(U64Slice(i + 1)); };
    testutil::AckingChild child([&](const testutil::AckingChild::Ack& ack) {
      std::unique_ptr<Index> idx;
      if (!OpenIndex("nvtree", o, &idx).ok()) ::_exit(2);
      for (uint64_t i = 0;; i++) {
        if (!idx->Insert(key(i), val(i)).ok()) ::_exit(3);
        if (i % 3 == 2 && !idx->Remove(key(i - 1)).ok()) ::_exit(3);
        if (!ack(i)) ::_exit(4);
      }
    });
    ASSERT_TRUE(child.started());
    uint64_t acked = 0;
    const bool any = child.ReadUntil([](uint64_t n) { return n >= 12000; }, &acked);
    child.Kill(/*drain=*/false, &acked);
    ASSERT_TRUE(any);
    std::unique_ptr<Index> idx;
    o.params.clear();
    o.create_if_missing = false;
    o.recovery_threads = 2;
    ASSERT_TRUE(OpenIndex("nvtree", o, &idx).ok());
    Status c = idx->Check();
    ASSERT_TRUE(c.ok()) << c.ToString();
    ASSERT_EQ(testutil::LeakReport(idx.get()), "") << "after the kill";
    // Steps up to `acked` are durable; the child kept going until the kill
    // (its acknowledgements sit in the pipe), so later steps may be too.
    for (uint64_t i = 0; i <= acked; i++) {
      const bool removed = (i + 1) % 3 == 2 && i + 1 <= acked;
      const bool maybe = (i + 1) % 3 == 2 && i == acked;  // step acked + 1 may have removed it
      std::string v;
      const Status f = idx->Find(key(i), &v);
      if (maybe) continue;
      if (removed) {
        ASSERT_TRUE(f.IsNotFound()) << "acknowledged remove of " << i << " lost";
      } else {
        ASSERT_TRUE(f.ok()) << "acknowledged insert " << i << " lost";
        ASSERT_EQ(v, val(i));
      }
    }
    uint64_t scanned = 0;
    ASSERT_TRUE(idx->Scan(bytes ? std::string(1, '\x01') : std::string(U64Slice(0)), SIZE_MAX, [&](Slice, Slice) {
                       scanned++;
                       return true;
                     }).ok());
    EXPECT_EQ(scanned, idx->Size());
    EXPECT_GE(scanned, acked + 1 - (acked + 1) / 3);
    for (uint64_t i = 0; i <= acked; i += 2) ASSERT_TRUE(idx->Upsert(key(i), val(i + 7)).ok());
    c = idx->Check();
    ASSERT_TRUE(c.ok()) << c.ToString();
    idx.reset();
    pm::Pool::Remove(path);
  }
}

}  // namespace
}  // namespace pmindex
