// fastfair.h: internal test/benchmark hooks of the FAST & FAIR B+-tree
// (src/fastfair/, implemented in fastfair.cc; docs/fastfair.md). Not part
// of the public API. Thread safety: the getters at any time; SetTestHooks
// only while the index is not in use.
#pragma once

#include <cstdint>
#include <functional>

#include "pmindex/index.h"

namespace pmindex::internal::fastfair {

// Counters kept by one open tree (DRAM only, reset at open).
struct DebugCounters {
  uint64_t open_blocks_freed = 0;   // blocks freed by Open (at most the spare root slot)
  uint64_t open_pm_stores = 0;      // PM stores / lines flushed by the index part of Open
  uint64_t open_pm_lines = 0;
  uint64_t nodes_repaired = 0;      // nodes a writer repaired lazily since open
  uint64_t splits_finished_by_repair = 0;
  uint64_t counts_repaired = 0;     // records an interrupted insert moved past a lagging durable count
  uint64_t parent_links_repaired = 0;  // siblings a writer found missing in their parent
  uint64_t root_grows = 0;
  uint64_t merges = 0;          // FAIR merges (node merged into its left sibling)
  uint64_t root_collapses = 0;  // root dropped when left with one child
  uint64_t nodes_freed = 0;     // nodes freed after their epoch grace period
  uint64_t merges_skipped = 0;  // underfull nodes left alone: limbo full
  uint64_t rebalances = 0;      // underfull nodes rebalanced with a sibling (a split, then a merge;
                                // `merges` counts those merges too)
  uint64_t rebalances_from_right = 0;  // ... of them with the right sibling giving records
  uint64_t left_inserts = 0;    // inserts that shifted records left into a leaf's lk prefix
  uint64_t prefix_drops = 0;    // lk prefixes removed (lk change, or a merge needing room)
  uint64_t prefix_splits = 0;   // leaf splits that cut a node with an lk prefix (it keeps it)
  uint64_t read_flushes = 0;    // lock-free answers made durable by their reader (a writer held the leaf)
  uint64_t lf_lock_fallbacks = 0;  // lock-free leaf reads that gave up and took the read lock
  uint64_t reclaims = 0;           // Reclaim calls (each takes the retire list's mutex)
};

// The tree's counters, or nullptr if `index` is not a fastfair index.
const DebugCounters* GetDebugCounters(Index* index);
// Node capacity (records per node) and height of the tree (1 = a single leaf).
int NodeCapacity(Index* index);
int Height(Index* index);

// Test-only interleaving hooks (fastfair_concurrency_test). Called with the
// leaf (opaque) and a slot; they may block, the caller holds what it holds.
struct TestHooks {
  // InsertLeft, before the store k[j-1] = k[j] that moves record j left.
  std::function<void(const void* leaf, uint32_t j)> insert_left_move;
  // The lock-free Find's left-to-right scan (sw even), after it loaded the
  // key of slot j.
  std::function<void(const void* leaf, uint32_t j)> lf_forward_key;
  // The lock-free Find's left-to-right scan, after it loaded lk and before
  // it loads slot 0.
  std::function<void(const void* leaf)> lf_forward_start;
  // A right shift (insert at slot 0 of a leaf or an internal node), right
  // after the store k[0] = lk that makes slot 0 an ignored copy.
  std::function<void(const void* node)> insert_slot0_ignored;
  // An in-node write (insert, left insert, update, delete), right after the
  // store that commits it for lock-free readers and before the fence that
  // makes it durable (the node is write-locked).
  std::function<void(const void* node)> after_commit;
  // Test-only switch: lock-free readers skip making their answer durable
  // (the control of fastfair_durable_read_test; never set otherwise).
  bool no_durable_reads = false;
  // The lock-free scan's leaf snapshot, after its first pass (the copy)
  // and before the second (the validation).
  std::function<void(const void* leaf)> lf_snapshot_copied;
};
// Installs hooks (nullptr: none) on a fastfair index; not while it is in use.
void SetTestHooks(Index* index, const TestHooks* hooks);

}  // namespace pmindex::internal::fastfair
