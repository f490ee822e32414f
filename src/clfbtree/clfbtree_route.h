// clfbtree_route.h: the DRAM route table of the clfB-tree (u64 keys;
// docs/clfbtree.md, "Route table"). No paper section: the paper descends
// from the root, decoding every inner line on the way (sec. 2.1).
//
// With random 8-byte keys an inner line holds about five keys, so the tree
// is deep (7 inner levels at 1M records) and a descent decodes a line per
// level. The route table lists the inner nodes of one level (`depth`, the
// deepest with at most kRouteMax nodes) with the smallest key each routes:
// a u64 reader binary-searches it and starts its descent at that node,
// skipping the levels above.
//
// Why a stale table still routes right: an inner node's key range never
// changes while it is linked (a split or shadow replaces the node by new
// ones covering the same range and marks it obsolete; only leaves are ever
// removed, which widens a sibling leaf's range, never an inner node's; a
// root split adds a level above). So if the table says key k lies in node
// X's range and X is neither locked nor obsolete when the reader's version
// read of X begins, k lies in X's range, as when the table was built.
// Replaced nodes are locked before their replacement commits and obsolete
// after it; a reader that finds X busy descends from the root instead.
// Addresses are not reused under a reader: the writer publishes the table
// without X before the epoch grace period after which X is freed.
//
// Invariants: lo ascends, lo[0] == 0, and node[i]'s range is [lo[i],
// lo[i+1]) (the last one unbounded) in the tree as of the table's
// publication. A published table is never changed: a writer builds a new
// one and publishes it with a release store.
//
// Thread safety: built and published by the holder of write_mu_; read by
// any thread inside an epoch guard; freed after an epoch grace period.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace pmindex::internal::clfbtree {

struct RouteTable {
  static constexpr size_t kRouteMax = 4096;
  std::vector<uint64_t> lo;    // the smallest key node[i] routes
  std::vector<uint64_t> node;  // inner nodes of one level, in key order
  uint32_t depth = 0;          // their depth below the root when built

  uint64_t Lookup(uint64_t key) const {
    const size_t i = size_t(std::upper_bound(lo.begin(), lo.end(), key) - lo.begin());
    return node[i - 1];
  }
  // A copy with node `from` replaced by `to` (separators seps between them);
  // false if `from` is not in the table.
  bool Replaced(uint64_t from, const std::vector<uint64_t>& to, const std::vector<uint64_t>& seps,
                RouteTable* out) const {
    const auto it = std::find(node.begin(), node.end(), from);
    if (it == node.end() || to.empty() || seps.size() + 1 != to.size()) return false;
    const size_t i = size_t(it - node.begin());
    out->depth = depth;
    out->lo.reserve(lo.size() + to.size() - 1);
    out->node.reserve(node.size() + to.size() - 1);
    out->lo.assign(lo.begin(), lo.begin() + i + 1);
    out->node.assign(node.begin(), node.begin() + i);
    out->lo.insert(out->lo.end(), seps.begin(), seps.end());
    out->node.insert(out->node.end(), to.begin(), to.end());
    out->lo.insert(out->lo.end(), lo.begin() + i + 1, lo.end());
    out->node.insert(out->node.end(), node.begin() + i + 1, node.end());
    return true;
  }
};

}  // namespace pmindex::internal::clfbtree
