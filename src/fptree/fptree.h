// fptree/fptree.h: internal hooks of the FPTree family (fptree, fptree_single,
// ptree) for tests and the figure programs in bench/fptree. The indexes
// themselves are reached through pmindex::OpenIndex; nothing here is API.
#pragma once

#include <cstdint>
#include <string>

namespace pmindex {
class Index;
}

namespace pmindex::internal {

// Shape of an open fptree/fptree_single/ptree: live DRAM inner nodes and
// leaves in the leaf list. False if idx is not one of them. Not thread-safe
// against writers.
bool FPTreeShape(Index* idx, uint64_t* inner_nodes, uint64_t* leaves);

// Home-line placement: records whose slot lies in the home line of their key
// (fptree, fptree_single; always 0 for ptree), and all records. Not
// thread-safe against writers.
bool FPTreeHomeShare(Index* idx, uint64_t* at_home, uint64_t* records);

// fptree's leaf lock/version words (a DRAM table indexed by leaf offset):
// true if every leaf in the list has its own word inside the table, none
// locked or obsolete (a quiescent tree); else false and *why. Always true for
// fptree_single and ptree. Not thread-safe against writers.
bool FPTreeLeafVersionWords(Index* idx, std::string* why);

// Per-thread number of in-leaf key comparisons (fingerprint hits that were
// compared against the search key, or every valid key for ptree) since the
// thread started. Used to measure E[T] of paper section 4.2.
uint64_t FPTreeKeyProbes();

// Number of leaf deletions deferred because the left neighbour's lock (or an
// inner node) stayed busy for 64 tries (fptree only); a deferred deletion is
// retried by a later Remove. Process-wide.
uint64_t FPTreeDeferredLeafDeletions();

}  // namespace pmindex::internal
