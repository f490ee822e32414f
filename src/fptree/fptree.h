// fptree/fptree.h: internal hooks of the FPTree family (fptree, fptree_single,
// ptree) for tests and the figure programs in bench/fptree. The indexes
// themselves are reached through pmindex::OpenIndex; nothing here is API.
#pragma once

#include <cstdint>

namespace pmindex::internal {

// Per-thread number of in-leaf key comparisons (fingerprint hits that were
// compared against the search key, or every valid key for ptree) since the
// thread started. Used to measure E[T] of paper section 4.2.
uint64_t FPTreeKeyProbes();

// Number of leaf deletions skipped because the leaf was the only child of its
// DRAM parent or its neighbour lock could not be taken (the leaf stays empty
// and is removed at the next recovery). Process-wide.
uint64_t FPTreeSkippedLeafDeletions();

}  // namespace pmindex::internal
