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
// Invariants: over the chunks in order, lo ascends, lo[0] == 0, and
// node[i]'s range is [lo[i], lo[i+1]) (the last one unbounded) in the tree
// as of the table's publication. A published table and its chunks are never
// changed: a writer builds a new table (sharing the unchanged chunks) and
// publishes it with a release store; a chunk lives as long as the last
// table holding it, and tables are freed after a grace period.
//
// Thread safety: built and published by the holder of write_mu_; read by
// any thread inside an epoch guard; freed after an epoch grace period.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

namespace pmindex::internal::clfbtree {

// The table is kept in chunks of up to 2 x kChunk nodes, shared between
// successive tables: a replacement copies the chunk it changes and the
// chunk directory, not the whole table.
struct RouteChunk {
  std::vector<uint64_t> lo;    // the smallest key node[i] routes
  std::vector<uint64_t> node;  // inner nodes of one level, in key order
};

struct RouteTable {
  static constexpr size_t kRouteMax = 4096, kChunk = 128;
  std::vector<uint64_t> first;                          // first[c] == chunks[c]->lo[0]
  std::vector<std::shared_ptr<const RouteChunk>> chunks;  // in key order, none empty
  size_t nodes = 0;
  uint32_t depth = 0;  // the nodes' depth below the root when built

  // From the nodes of one level (lo ascending, lo[0] == 0).
  RouteTable(const std::vector<uint64_t>& lo, const std::vector<uint64_t>& node, uint32_t d) : nodes(lo.size()), depth(d) {
    for (size_t i = 0; i < lo.size(); i += kChunk) {
      auto c = std::make_shared<RouteChunk>();
      const size_t e = std::min(lo.size(), i + kChunk);
      c->lo.assign(lo.begin() + long(i), lo.begin() + long(e));
      c->node.assign(node.begin() + long(i), node.begin() + long(e));
      first.push_back(c->lo[0]);
      chunks.push_back(std::move(c));
    }
  }
  RouteTable() = default;

  uint64_t Lookup(uint64_t key) const {
    uint64_t hi;
    bool has_hi;
    return Lookup(key, &hi, &has_hi);
  }
  // The same, and the end of the node's range: *hi, the next node's
  // smallest key (*has_hi false for the last node, whose range is unbounded).
  uint64_t Lookup(uint64_t key, uint64_t* hi, bool* has_hi) const {
    const size_t c = size_t(std::upper_bound(first.begin(), first.end(), key) - first.begin()) - 1;
    const RouteChunk& k = *chunks[c];
    const size_t i = size_t(std::upper_bound(k.lo.begin(), k.lo.end(), key) - k.lo.begin());
    *has_hi = i < k.lo.size() || c + 1 < first.size();
    *hi = i < k.lo.size() ? k.lo[i] : (c + 1 < first.size() ? first[c + 1] : 0);
    return k.node[i - 1];
  }
  // Every node and its smallest key, in order (Check).
  void Flatten(std::vector<uint64_t>* lo, std::vector<uint64_t>* node) const {
    for (const auto& c : chunks) {
      lo->insert(lo->end(), c->lo.begin(), c->lo.end());
      node->insert(node->end(), c->node.begin(), c->node.end());
    }
  }
  // A copy with node `from` replaced by `to` (separators seps between them);
  // false if `from` is not in the table. Only the changed chunk is copied.
  // hint: a key in from's range, naming the chunk to look in first (the
  // others are searched only if from is not there).
  bool Replaced(uint64_t from, uint64_t hint, const std::vector<uint64_t>& to, const std::vector<uint64_t>& seps,
                RouteTable* out) const {
    if (to.empty() || seps.size() + 1 != to.size()) return false;
    const size_t hc = size_t(std::upper_bound(first.begin(), first.end(), hint) - first.begin()) - 1;
    for (size_t step = 0; step <= chunks.size(); step++) {
      if (step > 0 && step - 1 == hc) continue;
      const size_t c = step == 0 ? hc : step - 1;
      const RouteChunk& k = *chunks[c];
      const auto it = std::find(k.node.begin(), k.node.end(), from);
      if (it == k.node.end()) continue;
      const size_t i = size_t(it - k.node.begin());
      RouteChunk n;
      n.lo.assign(k.lo.begin(), k.lo.begin() + long(i) + 1);
      n.node.assign(k.node.begin(), k.node.begin() + long(i));
      n.lo.insert(n.lo.end(), seps.begin(), seps.end());
      n.node.insert(n.node.end(), to.begin(), to.end());
      n.lo.insert(n.lo.end(), k.lo.begin() + long(i) + 1, k.lo.end());
      n.node.insert(n.node.end(), k.node.begin() + long(i) + 1, k.node.end());
      out->depth = depth;
      out->nodes = nodes + to.size() - 1;
      out->first.assign(first.begin(), first.begin() + long(c));
      out->chunks.assign(chunks.begin(), chunks.begin() + long(c));
      const size_t half = n.lo.size() > 2 * kChunk ? n.lo.size() / 2 : n.lo.size();
      for (size_t s = 0; s < n.lo.size(); s += half) {  // an overfull chunk in two
        auto p = std::make_shared<RouteChunk>();
        const size_t e = std::min(n.lo.size(), s + half);
        p->lo.assign(n.lo.begin() + long(s), n.lo.begin() + long(e));
        p->node.assign(n.node.begin() + long(s), n.node.begin() + long(e));
        out->first.push_back(p->lo[0]);
        out->chunks.push_back(std::move(p));
      }
      out->first.insert(out->first.end(), first.begin() + long(c) + 1, first.end());
      out->chunks.insert(out->chunks.end(), chunks.begin() + long(c) + 1, chunks.end());
      return true;
    }
    return false;
  }
};

}  // namespace pmindex::internal::clfbtree
