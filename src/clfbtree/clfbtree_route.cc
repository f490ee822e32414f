// clfbtree_route.cc: building and maintaining the clfB-tree's DRAM route
// table (clfbtree_route.h; docs/clfbtree.md, "Route table"). No paper
// section. Nothing here touches PM.
//
// The table is built at open and after a change that leaves it missing or
// oversized (route_dirty_), by a walk of the top levels. A structure change
// that replaces a node of the table's level records the replacement
// (NoteReplaced); FinishSmo publishes the updated copy after the commit and
// before the grace period that frees the replaced node (ApplyRouteChange),
// so no reader can reach a freed node through the table. A root split adds
// a level above: the table's nodes are then one level deeper.
//
// Thread safety: every function here runs under write_mu_ (or before the
// index is shared); readers only load route_ inside an epoch guard.
#include "clfbtree/clfbtree_tree.h"

namespace pmindex::internal::clfbtree {

void ClfBTree::PublishRoute(RouteTable* t) {
  RouteTable* old = route_.exchange(t, std::memory_order_acq_rel);
  if (old) route_retired_.push_back(old);
}

void ClfBTree::FreeRetiredRoutes() {
  for (RouteTable* t : route_retired_) delete t;
  route_retired_.clear();
}

void ClfBTree::NoteReplaced(int j, uint64_t from, uint64_t hint, const std::vector<uint64_t>& to,
                            const std::vector<uint64_t>& seps) {
  if (bk() || route_depth_ < 0 || j != route_depth_) return;
  if (route_change_.has) {  // two replacements at one level in one change: not expected; rebuild
    route_change_.bad = true;
    return;
  }
  route_change_.has = true;
  route_change_.from = from;
  route_change_.hint = hint;
  route_change_.to = to;
  route_change_.seps = seps;
}

void ClfBTree::ApplyRouteChange() {
  if (!route_change_.has) return;
  const RouteTable* cur = route_.load(std::memory_order_relaxed);
  auto* t = new RouteTable;
  if (route_change_.bad || !cur || !cur->Replaced(route_change_.from, route_change_.hint, route_change_.to, route_change_.seps, t)) {
    delete t;
    t = nullptr;
  }
  PublishRoute(t);
  if (!t) route_depth_ = -1;
  route_dirty_ = !t || t->nodes > 4 * RouteTable::kRouteMax;
  route_change_.has = route_change_.bad = false;
  route_change_.to.clear();
  route_change_.seps.clear();
}

void ClfBTree::MaybeRebuildRoute() {
  if (!route_dirty_ || bk()) return;
  route_dirty_ = false;
  RouteTable* best = nullptr;
  const uint64_t w = LdR(&meta_->root);
  std::vector<uint64_t> lo{0}, node{w & ~63ull};
  bool ok = !(w & 1);
  for (uint32_t depth = 0; ok && depth < uint32_t(kMaxDepth); depth++) {
    if (depth >= 1) {
      delete best;
      best = new RouteTable(lo, node, depth);
    }
    std::vector<uint64_t> nlo, nnode;
    bool leaves = false;
    for (size_t i = 0; i < node.size() && ok && !leaves; i++) {
      Line img;
      Decoded d;
      if (!NodeOk(node[i], 64)) {
        ok = false;
        break;
      }
      ReadLine(node[i], img);
      if (!Decode(img, false, &d) || d.leaf) {
        ok = false;
        break;
      }
      leaves = d.kids_leaves;
      for (uint32_t c = 0; c < d.np(); c++) {
        nlo.push_back(c == 0 ? lo[i] : d.k[c - 1]);
        nnode.push_back(d.p[c]);
      }
    }
    if (!ok || leaves || nnode.size() > RouteTable::kRouteMax) break;
    lo.swap(nlo);
    node.swap(nnode);
  }
  if (!ok) {  // a damaged node: no table (Check reports the damage)
    delete best;
    best = nullptr;
  }
  route_depth_ = best ? int(best->depth) : -1;
  PublishRoute(best);
  if (!route_retired_.empty()) {
    epoch_.Synchronize();
    FreeRetiredRoutes();
  }
}

}  // namespace pmindex::internal::clfbtree

namespace pmindex::internal::clfbtree {

Status ClfBTree::CheckHints() {
  // The route table lists exactly the nodes at depth route_depth_ with the
  // smallest key each routes.
  const RouteTable* t = route_.load(std::memory_order_acquire);
  if (t) {
    if (route_depth_ < 1) return Status::Corrupt("clfbtree: route table without a depth");
    const uint64_t w = LdR(&meta_->root);
    std::vector<uint64_t> lo{0}, node{w & ~63ull};
    for (int depth = 0; depth < route_depth_; depth++) {
      std::vector<uint64_t> nlo, nnode;
      for (size_t i = 0; i < node.size(); i++) {
        Line img;
        Decoded d;
        if (!NodeOk(node[i], 64)) return Status::Corrupt("clfbtree: bad inner node offset");
        ReadLine(node[i], img);
        if (!Decode(img, false, &d) || d.leaf || d.kids_leaves) return Status::Corrupt("clfbtree: route table too deep");
        for (uint32_t c = 0; c < d.np(); c++) {
          nlo.push_back(c == 0 ? lo[i] : d.k[c - 1]);
          nnode.push_back(d.p[c]);
        }
      }
      lo.swap(nlo);
      node.swap(nnode);
    }
    std::vector<uint64_t> tlo, tnode;
    t->Flatten(&tlo, &tnode);
    for (size_t c = 0; c < t->chunks.size(); c++)
      if (t->chunks[c]->lo.empty() || t->first[c] != t->chunks[c]->lo[0] || t->chunks[c]->lo.size() != t->chunks[c]->node.size())
        return Status::Corrupt("clfbtree: route table chunk malformed");
    if (lo != tlo || node != tnode || t->nodes != tlo.size() || t->first.size() != t->chunks.size())
      return Status::Corrupt("clfbtree: route table differs from the tree");
  }
  // A leaf filter valid at its leaf's version holds the hash of every valid
  // slot's key.
  if (!filters_.mapped()) return Status::OK();
  return WalkNodes([&](uint64_t off, bool leaf, const Decoded*, int) -> Status {
    if (!leaf) return Status::OK();
    const LeafFilter* f = Filter(off);
    if (!f->Valid(VL(off).LoadRelaxed())) return Status::OK();
    uint64_t all[2];
    const uint64_t* bm = Bitmap(off);
    for (uint32_t i = 0; i < cap_; i++) {
      if (!((bm[i / 64] >> (i % 64)) & 1)) continue;
      f->Match(LeafFilter::Fp(*Ent(off, i)), cap_, all);
      if (!((all[i / 64] >> (i % 64)) & 1)) return Status::Corrupt("clfbtree: leaf filter misses a key at " + std::to_string(off));
    }
    return Status::OK();
  });
}

}  // namespace pmindex::internal::clfbtree
