// fptree/fptree.h: internal hooks of the FPTree family (fptree, fptree_single,
// ptree) for tests and the figure programs in bench/fptree. The indexes
// themselves are reached through pmindex::OpenIndex; nothing here is API.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

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

// Pool offsets (= pool file offsets) of an open tree's PM words, for the
// corrupt-pool tests (fptree_corrupt_test.cc patches them in the pool file
// after Close). Word offsets are absolute; next_in_leaf and slot0_key_in_leaf
// are offsets inside a leaf (slot i's key word: + i * key_stride, its value
// word: slot0_val_in_leaf + i * val_stride). False if
// idx is not an FPTree. Not thread-safe against writers.
struct FPTreePmWords {
  uint64_t root = 0, magic = 0, initialized = 0, head = 0;
  uint64_t leaf_slots = 0, inner_size = 0;  // u32 words
  uint64_t split0_cur = 0, split0_new = 0, del0_cur = 0, del0_prev = 0;
  uint64_t groups_head = 0, get_log = 0;  // fptree_single
  uint32_t leaf_bytes = 0, next_in_leaf = 0, slot0_key_in_leaf = 0, key_stride = 0, slot0_val_in_leaf = 0, val_stride = 0;
  std::vector<uint64_t> leaves;  // leaf offsets in list order
  std::vector<uint64_t> leaf_versions;  // fptree: each leaf's lock/version word, list order (else empty)
};
bool FPTreeGetPmWords(Index* idx, FPTreePmWords* out);

// Per-thread number of in-leaf key comparisons (fingerprint hits that were
// compared against the search key, or every valid key for ptree) since the
// thread started. Used to measure E[T] of paper section 4.2.
uint64_t FPTreeKeyProbes();

// Number of leaf deletions deferred because the left neighbour's lock (or an
// inner node) stayed busy for 64 tries (fptree only); a deferred deletion is
// retried by a later Remove. Process-wide.
uint64_t FPTreeDeferredLeafDeletions();

// Test hook of fptree's (concurrent) leaf deletion: called with the unlinked
// leaf's offset once the unlink is durable and every lock is released,
// outside any epoch guard, before the grace period and the leaf's free. A
// hook that blocks holds that deletion there (fptree_grace_test). nullptr
// removes it. Process-wide; set it while no fptree is in use.
void SetFPTreeLeafUnlinkedHook(void (*hook)(uint64_t leaf));

// Runs fn inside one epoch guard of idx, as a lock-free reader is while it
// reads leaves and blocks (fptree; the others have no readers to wait for).
// fn must not wait for a leaf deletion of idx (its grace period waits for
// this guard). False if idx is not an FPTree.
bool FPTreeInEpoch(Index* idx, const std::function<void()>& fn);

}  // namespace pmindex::internal
