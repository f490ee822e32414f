// The names of every fault switch compiled into pmindex and its tools
// (pmindex/pm/fault.h): what `pmcheck --fault NAME` accepts. A name that no
// PMINDEX_FAULT call site checks enables nothing, and a check run with it
// would report a clean result for a fault that never happened.
//
// Invariant: the list is sorted and equals the set of names given as string
// literals to PMINDEX_FAULT under src/ and tools/; tests/pm/fault_names_test.cc scans the
// sources and fails when a switch is added or removed without updating it.
// Thread safety: reads a constant table; any thread.
#include <algorithm>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "pmindex/pm/fault.h"

namespace pmindex::pm {

namespace {
const char* const kKnownFaults[] = {
    "fastfair.create.skip_meta_flush",
    "fastfair.insert.skip_shift_flush",
    "fastfair.merge.free_before_unlink",
    "fastfair.remove.skip_flush",
    "fastfair.retire.own_after_commit",
    "fastfair.retire.unlinked_before_commit",
    "fastfair.split.link_before_persist",
    "fptree.delete.force_deferred",
    "fptree.delete.keep_log_prev",
    "fptree.delete.skip_flush",
    "fptree.insert.bitmap_before_kv",
    "fptree.insert.skip_kv_flush",
    "fptree.merge.skip_copy_flush",
    "fptree.move.skip_copy_flush",
    "fptree.retire.clear_word_first",
    "fptree.retire.skip_word_persist",
    "fptree.split.skip_log",
    "nvc.create.skip_dummy_persist",
    "nvc.create.skip_max_threads_persist",
    "nvc.erratum.no_fix",
    "nvc.insert.skip_link_persist",
    "nvc.insert.skip_node_persist",
    "nvc.open.skip_empty_slab_unlink",
    "nvc.remove.skip_mark_persist",
    "nvtree.append.count_before_entry",
    "nvtree.append.skip_count_flush",
    "nvtree.append.skip_entry_flush",
    "nvtree.append.unlock_before_count_persist",
    "nvtree.replace.free_before_swap",
    "nvtree.replace.skip_leaf_flush",
    "pm.alloc.large.skip_state_flush",
    "pm.alloc.skip_commit_fence",
    "pm.alloc.skip_dest_flush",
    "pm.alloc.skip_replay",
    "pm.free.skip_bit_flush",
    "pm.grow.skip_size_persist",
    "pm.run.skip_bitmap_persist",
    "pmcheck_toy.alloc.skip_log",
    "pmcheck_toy.create.skip_meta_flush",
    "pmcheck_toy.insert.bitmap_before_kv",
    "pmcheck_toy.insert.skip_kv_fence",
    "pmcheck_toy.insert.skip_kv_flush",
    "pmcheck_toy.insert.unlogged_store",
    "pmcheck_toy.recover.clear_log_first",
    "pmcheck_toy.recover.lose_data",
    "pmcheck_toy.remove.redundant_flush",
    "pmcheck_toy.scan.skip_first",
    "pmcheck_toy.update.skip_flush",
    "pmcheck_toy.update.unlock_before_persist",
    "pmwcas.skip_descriptor_persist",
    "pmwcas.skip_dirty_flush",
    "pmwcas.skip_status_persist",
    "wbtree.free.skip_unlink_flush",
    "wbtree.insert.skip_entry_flush",
    "wbtree.insert.skip_slots_flush",
    "wbtree.remove.skip_flush",
    "wbtree.split.link_before_persist",
    "wbtree.update.skip_flush",
};
}  // namespace

bool FaultKnown(const std::string& name) {
  return std::binary_search(std::begin(kKnownFaults), std::end(kKnownFaults), name,
                            [](const auto& a, const auto& b) { return std::string_view(a) < std::string_view(b); });
}

std::vector<std::string> KnownFaults() { return {std::begin(kKnownFaults), std::end(kKnownFaults)}; }

}  // namespace pmindex::pm
