// pmcheck proves its power on the real indexes: every fault switch an index
// declares (docs/<index>.md) must be reported. Indexes left out of the build
// (-DPMINDEX_INDEXES) are skipped. Clean runs of the real indexes with the CI
// budget are tools/pmcheck/ci.sh's job (a failure there belongs to the index).
#include <gtest/gtest.h>

#include <thread>

#include "pmcheck.h"
#include "pmindex/index.h"

namespace pmcheck {
namespace {

struct IndexFault {
  const char* index;
  const char* fault;
  // "name=value,..." or "": index parameters, except pmcheck's own "keys=N"
  // (keys per thread) and "kinds=bytes" (byte keys and values).
  const char* param;
  bool lint;
};

std::ostream& operator<<(std::ostream& o, const IndexFault& f) { return o << f.fault; }

class PmcheckIndexFault : public ::testing::TestWithParam<IndexFault> {};

TEST_P(PmcheckIndexFault, IsReported) {
  const IndexFault& f = GetParam();
  if (!pmindex::FindIndexInfo(f.index, nullptr)) GTEST_SKIP() << f.index << " is not built";
  Config c;
  c.index = f.index;
  c.ops = 300;
  c.image_budget = 3000;
  c.images_per_point = 3;
  c.stop_after = 1;
  c.timeout_s = 10;
  c.lint = f.lint;
  c.max_reported = 3;
  c.faults = {f.fault};
  std::string list = f.param;
  for (size_t from = 0; from < list.size();) {
    size_t to = list.find(',', from);
    if (to == std::string::npos) to = list.size();
    const std::string p = list.substr(from, to - from), name = p.substr(0, p.find('=')), value = p.substr(p.find('=') + 1);
    if (name == "keys") {
      c.keys = std::stoull(value);
    } else if (name == "kinds") {
      c.key_kind = pmindex::KeyKind::kBytes;
      c.value_kind = pmindex::ValueKind::kBytes;
    } else {
      c.params[name] = value;
    }
    from = to + 1;
  }
  Report r;
  ASSERT_TRUE(pmcheck::Run(c, &r).ok());
  EXPECT_GT(r.total_failures(), 0u) << FormatReport(c, r);
}

INSTANTIATE_TEST_SUITE_P(
    Faults, PmcheckIndexFault,
    ::testing::Values(IndexFault{"fptree", "fptree.insert.skip_kv_flush", "leaf_size=8", false},
                      IndexFault{"fptree", "fptree.insert.bitmap_before_kv", "leaf_size=8", false},
                      IndexFault{"fptree", "fptree.delete.skip_flush", "leaf_size=8", false},
                      IndexFault{"fptree", "fptree.split.skip_log", "leaf_size=8", false},
                      IndexFault{"fptree", "fptree.retire.clear_word_first", "leaf_size=8,kinds=bytes", false},
                      IndexFault{"fptree", "fptree.retire.skip_word_persist", "leaf_size=8,kinds=bytes", true},
                      // fptree.merge.skip_copy_flush needs recovery crashes
                      // over a draining workload (minutes on a busy
                      // machine): tools/pmcheck/ci.sh has its line.
                      IndexFault{"fastfair", "fastfair.create.skip_meta_flush", "node_size=256", false},
                      IndexFault{"fastfair", "fastfair.insert.skip_shift_flush", "node_size=256", false},
                      IndexFault{"fastfair", "fastfair.remove.skip_flush", "node_size=256", false},
                      IndexFault{"fastfair", "fastfair.split.link_before_persist", "node_size=256", false},
                      IndexFault{"nvc_hashmap", "nvc.insert.skip_node_persist", "initial_buckets=16", false},
                      IndexFault{"nvc_hashmap", "nvc.insert.skip_link_persist", "initial_buckets=16", false},
                      IndexFault{"nvc_hashmap", "nvc.remove.skip_mark_persist", "initial_buckets=16", true},
                      IndexFault{"nvc_hashmap", "nvc.create.skip_dummy_persist", "initial_buckets=16", false},
                      IndexFault{"nvc_hashmap", "nvc.create.skip_max_threads_persist", "initial_buckets=16,max_threads=300", false},
                      // Empty slabs (freed when a recovered image opens) need
                      // images with no record: a tiny key space.
                      IndexFault{"nvc_hashmap", "nvc.open.skip_empty_slab_unlink", "initial_buckets=16,keys=3", false},
                      IndexFault{"wbtree", "wbtree.insert.skip_entry_flush", "leaf_size=4,inner_size=3", false},
                      IndexFault{"wbtree", "wbtree.insert.skip_slots_flush", "leaf_size=4,inner_size=3", false},
                      IndexFault{"wbtree", "wbtree.update.skip_flush", "leaf_size=4,inner_size=3", false},
                      IndexFault{"wbtree", "wbtree.remove.skip_flush", "leaf_size=4,inner_size=3", false},
                      IndexFault{"wbtree", "wbtree.split.link_before_persist", "leaf_size=4,inner_size=3", false},
                      // Leaf frees need leaves emptied: a small key space.
                      IndexFault{"wbtree", "wbtree.free.skip_unlink_flush", "leaf_size=4,inner_size=3,keys=30", false},
                      IndexFault{"bztree", "bztree.insert.skip_record_flush", "node_size=256", false},
                      IndexFault{"bztree", "bztree.insert.skip_value_flush", "node_size=256,kinds=bytes", false},
                      IndexFault{"bztree", "bztree.smo.skip_node_flush", "node_size=256", false}),
    [](const ::testing::TestParamInfo<IndexFault>& i) {
      std::string n = i.param.fault;
      for (char& ch : n)
        if (ch == '.') ch = '_';
      return n;
    });

// The NVC-Hashmap erratum: without the fix, a thread acts durably on another
// thread's unflushed link. Two threads must interleave inside a persist
// window, which the recorder's schedule perturbation makes likely but not
// certain: try a few seeds. With the default fix nothing may be reported.
TEST(PmcheckNvcErratum, ReportedWithoutTheFixOnly) {
  if (!pmindex::FindIndexInfo("nvc_hashmap", nullptr)) GTEST_SKIP() << "nvc_hashmap is not built";
  Config c;
  c.index = "nvc_hashmap";
  c.threads = 2;
  c.ops = 2000;
  c.keys = 40;
  c.points = 0;
  c.lint = true;
  c.faults = {"nvc.erratum.no_fix"};
  uint64_t found = 0;
  for (uint64_t seed = 1; seed <= 12 && !found; ++seed) {
    c.seed = seed;
    Report r;
    ASSERT_TRUE(pmcheck::Run(c, &r).ok());
    found = r.erratum_reads;
  }
  EXPECT_GT(found, 0u) << "nvc.erratum.no_fix was not reported in 12 seeds";

  c.faults.clear();
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    c.seed = seed;
    Report r;
    ASSERT_TRUE(pmcheck::Run(c, &r).ok());
    EXPECT_EQ(r.erratum_reads, 0u) << FormatReport(c, r);
  }
}

TEST(PmcheckIndexes, SingleThreadedIndexRefusesThreads) {
  if (!pmindex::FindIndexInfo("fptree_single", nullptr)) GTEST_SKIP() << "fptree_single is not built";
  Config c;
  c.index = "fptree_single";
  c.threads = 2;
  c.points = 0;
  Report r;
  EXPECT_TRUE(pmcheck::Run(c, &r).IsInvalidArgument());
}

}  // namespace
}  // namespace pmcheck
