// wbtree_smo.cc: wBTree's structure changes (PiBench sec. 4, "wBTree": the
// original undo-redo log replaced by FPTree-style micro-logs; docs/
// wbtree.md, "Splits"): node splits at any level and root growth.
//
// Persist order of a split of node n at level l (n locked, under smo_mu_):
//  1. Meta::logs[l] = {old = n, trim = n's bitmap after the split, mid = the
//     key word that moves up (inner nodes)}, then the new node allocated
//     into logs[l].new_node (the allocator persists the line, and the
//     earlier stores of the same line with it).
//  2. The new node r filled (upper half of n's entries in key order, its
//     slot array, next = n's next, leftmost = mid's child) and persisted.
//  3. n.next = r and n.bitmap = trim: one line, flushed, fenced (the split's
//     commit: from here recovery finishes the split instead of undoing it).
//  4. The separator inserted into the parent (a parent split first if it is
//     full, with logs[l+1]), or a new root (GrowRoot).
//  5. Inner nodes with byte keys: the mid key block freed through
//     logs[l].mid (the parent holds its own copy); the log cleared.
// A failed allocation in step 4 (PoolFull) undoes step 3 and frees r, so
// the tree is as before. Recovery (wbtree_recovery.cc, RecoverLog) replays
// logs from the highest level down: n.next != r: free r; else redo the
// trim, insert the separator if the parent lacks r, free mid, clear.
// GrowRoot: the root allocated zeroed into Meta::spare_root, its bitmap
// persisted before its key block is allocated into its entry, the node
// persisted, Meta::root = it and spare_root = 0 in one line, persisted.
// Freeing an empty leaf l (not the first leaf of the tree, not the only
// child of its parent), under smo_mu_ with parent, l and its left
// neighbour prev locked (prev: the parent's previous child, or for a
// leftmost child the rightmost leaf of the subtree to its left,
// LeftNeighbour): Meta::free_prev, free_parent, free_leaf stored in one
// line (free_leaf last) and persisted; prev.next = l.next persisted; the
// parent's entry for l removed (one bitmap store, wbtree_write.cc
// RemoveEntry) or, for a leftmost child, the first entry's child made the
// leftmost (persisted) and that entry removed; l unlocked obsolete; after
// an epoch grace period l freed through Meta::free_leaf, then the log
// cleared. Recovery (RecoverFreeLeaf) redoes each step not done and frees
// l.
// Fault switches: wbtree.split.link_before_persist (step 2 skips its
// flush), wbtree.free.skip_unlink_flush.
//
// Thread safety: under smo_mu_ only, so inner nodes change under one
// writer; every changed or new node is locked (new ones born locked) until
// the whole change is durable, so lock-free readers validate around it.
#include "kit/pm_block.h"
#include "pmindex/pm/fault.h"
#include "wbtree/wbtree_tree.h"

namespace pmindex::internal::wbtree {

template <bool BK>
void WBTree<BK>::ClearLog(SplitLog* l) {
  St(&l->new_node, uint64_t(0));
  St(&l->old_node, uint64_t(0));
  St(&l->trim, uint64_t(0));
  St(&l->mid, uint64_t(0));
  pm::Persist(l, sizeof(SplitLog));
}

template <bool BK>
Status WBTree<BK>::PathTo(Slice key, uint32_t level, std::vector<Node*>* path, Node** node) {
  path->clear();
  uint64_t off = LdR(&meta_->root);
  for (int d = 0; d <= kMaxLevels; d++) {
    if (!NodeOk(off)) return Status::Corrupt("wbtree child pointer out of the pool");
    Node* n = N(off);
    PMINDEX_RETURN_IF_ERROR(EnsureChecked(n));
    const uint32_t l = LdR(&n->level);
    if (l < level) return Status::Corrupt("wbtree node at " + std::to_string(off) + " has the wrong level");
    if (l == level) {
      *node = n;
      return Status::OK();
    }
    path->push_back(n);
    Slots s;
    LoadSlots(n, &s);
    off = ChildFor<BK>(Ctx(), n, s, inner_cap_, key);
  }
  return Status::Corrupt("wbtree deeper than " + std::to_string(kMaxLevels) + " levels");
}

template <bool BK>
Status WBTree<BK>::SplitForKey(Slice key) {
  kit::LockWithBackoff(smo_mu_);  // PCT: a wait for a preempted holder hands it the token
  std::lock_guard<std::mutex> g(smo_mu_, std::adopt_lock);
  std::vector<Node*> path;
  Node* leaf;
  PMINDEX_RETURN_IF_ERROR(PathTo(key, 0, &path, &leaf));
  LockNode(leaf);
  Slots s;
  LoadSlots(leaf, &s);
  if (s.count() < leaf_cap_) {
    UnlockNode(leaf);
    return Status::OK();
  }
  std::vector<Node*> locked{leaf};
  Node* right;
  std::string sep;
  Status st = SplitNode(path, path.size(), leaf, &right, &sep, &locked);
  for (Node* n : locked) UnlockNode(n);
  return st;
}

template <bool BK>
Status WBTree<BK>::SplitNode(std::vector<Node*>& path, size_t depth, Node* n, Node** right, std::string* sep,
                             std::vector<Node*>* locked) {
  const uint32_t level = LdR(&n->level);
  if (level + 1 >= uint32_t(kMaxLevels)) return Status::Corrupt("wbtree too deep to split");
  const uint32_t cap = CapOf(level);
  const bool inner = level > 0;
  Slots s;
  LoadSlots(n, &s);
  const uint32_t c = s.count();
  const uint32_t m = c / 2;  // n keeps positions [0, m)
  const uint32_t first_right = inner ? m + 1 : m;
  uint64_t keep = 0;
  for (uint32_t i = 0; i < m; i++) keep |= 1ull << s.at(i + 1);
  Slots ls = s;  // n's slot array after the split
  ls.b[0] = uint8_t(m);
  if (slot_only_) std::memcpy(&keep, ls.b, 8);  // the trim is n's new slot word
  const Entry* mid = &n->ents()[s.at(m + 1)];
  if (!ReadKeyWord<BK>(Ctx(), mid->k, sep)) return Status::Corrupt("wbtree: unreadable key block in a split");
  const uint64_t old_bitmap = LdR(&n->bitmap), old_next = LdR(&n->next);

  SplitLog* log = &meta_->logs[level];
  St(&log->old_node, Off(n));
  St(&log->trim, keep);
  St(&log->mid, inner ? mid->k : uint64_t(0));
  if (Status st = alloc_->Allocate(&log->new_node, NodeBytes(cap)); !st.ok()) {
    ClearLog(log);
    return st;
  }
  Node* r = N(log->new_node);
  LW(r).lock.NewBorn();
  __atomic_store_n(&LW(r).checked, uint64_t(1), __ATOMIC_RELEASE);
  locked->push_back(r);
  const uint32_t k = c - first_right;
  for (uint32_t j = 0; j < k; j++) {
    const Entry* src = &n->ents()[s.at(first_right + j + 1)];
    St(&r->ents()[j].k, LdR(&src->k));
    St(&r->ents()[j].v, LdR(&src->v));
  }
  St(&r->bitmap, slot_only_ ? uint64_t(0) : CapMask(k));
  St(&r->next, old_next);
  St(&r->level, level);
  St(&r->cap, cap);
  St(&r->spare_a, uint64_t(0));
  St(&r->spare_b, uint64_t(0));
  St(&r->leftmost, inner ? LdR(&mid->v) : uint64_t(0));
  Slots rs{};
  rs.b[0] = uint8_t(k);
  for (uint32_t j = 0; j < k; j++) rs.b[j + 1] = uint8_t(j);
  for (int i = 0; i < 8; i++) {
    uint64_t w;
    std::memcpy(&w, rs.b + 8 * i, 8);
    St(&r->slotw[i], w);
  }
  if (!PMINDEX_FAULT("wbtree.split.link_before_persist")) pm::Flush(r, NodeBytes(k));
  pm::Fence();

  // The commit: link and trim in one line (slot-only: the link, then the
  // trimmed slot word; recovery redoes the trim of a linked split).
  St(&n->next, Off(r));
  if (slot_only_) {
    pm::Persist(n, 64);
  } else {
    St(&n->bitmap, keep);
    pm::Flush(n, 64);
  }
  StoreSlots(n, ls, s, true);
  pm::Fence();

  Status st = InsertIntoParent(path, depth, n, *sep, r, locked);
  if (!st.ok()) {
    // Undo the commit (nothing above refers to r): bitmap first, so that a
    // crash in between finishes the split instead.
    if (slot_only_) {  // the slot word first, then the link
      StoreSlots(n, s, ls, true);
      pm::Fence();
      St(&n->next, old_next);
      pm::Persist(n, 64);
    } else {
      St(&n->bitmap, old_bitmap);
      St(&n->next, old_next);
      pm::Flush(n, 64);
      StoreSlots(n, s, ls, true);
      pm::Fence();
    }
    alloc_->FreeOrAbort(&log->new_node);
    ClearLog(log);
    return st;
  }
  if (BK && inner) alloc_->FreeOrAbort(&log->mid);
  ClearLog(log);
  splits_.fetch_add(1, std::memory_order_relaxed);
  *right = r;
  return Status::OK();
}

template <bool BK>
Status WBTree<BK>::InsertIntoParent(std::vector<Node*>& path, size_t depth, Node* left, Slice sep, Node* right,
                                    std::vector<Node*>* locked) {
  if (depth == 0) return GrowRoot(left, sep, right, locked);
  Node* p = path[depth - 1];
  LockNode(p);
  locked->push_back(p);
  Slots s;
  LoadSlots(p, &s);
  Node* target = p;
  if (s.count() >= inner_cap_) {
    Node* pr;
    std::string psep;
    PMINDEX_RETURN_IF_ERROR(SplitNode(path, depth - 1, p, &pr, &psep, locked));
    if (CompareKeys(key_kind(), sep, psep) >= 0) target = pr;
    LoadSlots(target, &s);
  }
  uint32_t pos;
  bool eq;
  if (!LowerBound<BK>(Ctx(), target, s, inner_cap_, sep, &pos, &eq) || eq)
    return Status::Corrupt("wbtree inner node at " + std::to_string(Off(target)) + " has a bad slot array");
  return InsertEntry(target, s, pos, sep, Off(right), Slice(), 0);
}

template <bool BK>
Status WBTree<BK>::GrowRoot(Node* left, Slice sep, Node* right, std::vector<Node*>* locked) {
  PMINDEX_RETURN_IF_ERROR(alloc_->AllocateZeroed(&meta_->spare_root, NodeBytes(inner_cap_)));
  Node* r = N(meta_->spare_root);
  LW(r).lock.NewBorn();
  __atomic_store_n(&LW(r).checked, uint64_t(1), __ATOMIC_RELEASE);
  locked->push_back(r);
  St(&r->level, LdR(&left->level) + 1);
  St(&r->cap, inner_cap_);
  St(&r->leftmost, Off(left));
  St(&r->bitmap, uint64_t(slot_only_ ? 0 : 1));
  pm::Persist(r, 64);
  if constexpr (BK) {
    if (Status st = kit::WriteBlock(*alloc_, base_, &r->ents()[0].k, sep); !st.ok()) {
      alloc_->FreeOrAbort(&meta_->spare_root);
      return st;
    }
  } else {
    St(&r->ents()[0].k, SliceToU64(sep));
  }
  St(&r->ents()[0].v, Off(right));
  St(&r->slotw[0], uint64_t(1));  // count 1, slot 1 = entry 0
  pm::Flush(r, NodeBytes(1));
  pm::Fence();
  St(&meta_->root, Off(r));
  St(&meta_->spare_root, uint64_t(0));
  pm::Persist(&meta_->root, 16);
  return Status::OK();
}

template <bool BK>
Status WBTree<BK>::FreeEmptyLeaf(Slice key) {
  kit::LockWithBackoff(smo_mu_);  // PCT: a wait for a preempted holder hands it the token
  std::lock_guard<std::mutex> g(smo_mu_, std::adopt_lock);
  std::vector<Node*> path;
  Node* l;
  PMINDEX_RETURN_IF_ERROR(PathTo(key, 0, &path, &l));
  if (path.empty()) return Status::OK();  // the root leaf stays
  Node* p = path.back();
  LockNode(p);
  LockNode(l);
  Slots ps;
  LoadSlots(p, &ps);
  uint32_t pos = 0;
  for (uint32_t i = 1; i <= ps.count() && !pos; i++)
    if (LdR(&p->ents()[ps.at(i)].v) == Off(l)) pos = i;
  // A leftmost child needs an entry to take its place (and its left
  // neighbour lies in another subtree); a refilled leaf stays.
  const bool leftmost = pos == 0;
  if ((leftmost && (ps.count() == 0 || LdR(&p->leftmost) != Off(l))) || Valid(l) != 0) {
    UnlockNode(l);
    UnlockNode(p);
    return Status::OK();
  }
  uint64_t prev_off = 0;
  Status st = leftmost ? LeftNeighbour(path, Off(l), &prev_off)
                       : Status::OK();
  if (!leftmost) prev_off = pos == 1 ? LdR(&p->leftmost) : LdR(&p->ents()[ps.at(pos - 1)].v);
  if (st.ok() && prev_off == 0) {  // the first leaf of the tree stays
    UnlockNode(l);
    UnlockNode(p);
    return Status::OK();
  }
  if (!st.ok() || !NodeOk(prev_off)) {
    UnlockNode(l);
    UnlockNode(p);
    return Status::Corrupt("wbtree inner node at " + std::to_string(Off(p)) + " has a bad child");
  }
  Node* prev = N(prev_off);
  LockNode(prev);
  if (LdR(&prev->next) != Off(l)) {
    UnlockNode(prev);
    UnlockNode(l);
    UnlockNode(p);
    return Status::Corrupt("wbtree leaf at " + std::to_string(prev_off) + " is not the left neighbour its parent says");
  }
  // Log (one line: the leaf word last), unlink from the chain, then from
  // the parent (one bitmap store; byte keys free the separator's block).
  St(&meta_->free_prev, prev_off);
  St(&meta_->free_parent, Off(p));
  St(&meta_->free_leaf, Off(l));
  pm::Persist(&meta_->free_leaf, 24);
  St(&prev->next, LdR(&l->next));
  if (!PMINDEX_FAULT("wbtree.free.skip_unlink_flush")) pm::Flush(&prev->next, 8);
  pm::Fence();
  if (leftmost) {
    // The first entry's child becomes the leftmost child (its range grows
    // down over l's, which is empty), then the entry goes.
    St(&p->leftmost, LdR(&p->ents()[ps.at(1)].v));
    pm::Persist(&p->leftmost, 8);
    RemoveEntry(p, ps, 0);
  } else {
    RemoveEntry(p, ps, pos - 1);
  }
  UnlockNode(prev);
  LW(l).lock.UnlockObsolete();
  UnlockNode(p);
  // Readers that reached l before the unlink may still read it.
  epoch_.Synchronize();
  alloc_->FreeOrAbort(&meta_->free_leaf);
  St(&meta_->free_prev, uint64_t(0));
  St(&meta_->free_parent, uint64_t(0));
  pm::Persist(&meta_->free_prev, 16);
  leaves_freed_.fetch_add(1, std::memory_order_relaxed);
  return Status::OK();
}

template <bool BK>
Status WBTree<BK>::LeftNeighbour(const std::vector<Node*>& path, uint64_t leaf, uint64_t* prev) {
  *prev = 0;
  uint64_t child = leaf;
  for (size_t d = path.size(); d-- > 0;) {
    Node* a = path[d];
    Slots s;
    LoadSlots(a, &s);
    if (LdR(&a->leftmost) != child) {
      uint32_t apos = 0;
      for (uint32_t i = 1; i <= s.count() && !apos; i++)
        if (LdR(&a->ents()[s.at(i)].v) == child) apos = i;
      if (!apos) return Status::Corrupt("wbtree inner node at " + std::to_string(Off(a)) + " lost a child");
      // The rightmost leaf of the subtree left of child.
      uint64_t sub = apos == 1 ? LdR(&a->leftmost) : LdR(&a->ents()[s.at(apos - 1)].v);
      for (int depth = 0; depth <= kMaxLevels; depth++) {
        if (!NodeOk(sub)) return Status::Corrupt("wbtree child pointer out of the pool");
        Node* n = N(sub);
        PMINDEX_RETURN_IF_ERROR(EnsureChecked(n));
        if (LdR(&n->level) == 0) {
          *prev = sub;
          return Status::OK();
        }
        Slots ns;
        LoadSlots(n, &ns);
        sub = ns.count() ? LdR(&n->ents()[ns.at(ns.count())].v) : LdR(&n->leftmost);
      }
      return Status::Corrupt("wbtree deeper than " + std::to_string(kMaxLevels) + " levels");
    }
    child = Off(a);
  }
  return Status::OK();  // leaf is the first leaf of the tree
}

template <bool BK>
Status WBTree<BK>::RecoverFreeLeaf() {
  if (meta_->free_leaf) {
    const uint64_t lo = meta_->free_leaf, po = meta_->free_prev, pa = meta_->free_parent;
    if (!NodeOk(lo) || !NodeOk(po) || !NodeOk(pa) || !alloc_->IsAllocated(lo))
      return Status::Corrupt("wbtree leaf-free log names nodes out of the pool");
    Node* prev = N(po);
    Node* p = N(pa);
    if (prev->next == lo) {
      St(&prev->next, N(lo)->next);
      pm::Persist(&prev->next, 8);
    }
    PMINDEX_RETURN_IF_ERROR(EnsureChecked(p));
    Slots s;
    LoadSlots(p, &s);
    if (s.count() > 0 && p->leftmost == lo) {  // a leftmost child: its successor takes over
      St(&p->leftmost, p->ents()[s.at(1)].v);
      pm::Persist(&p->leftmost, 8);
    }
    if (s.count() > 0 && p->ents()[s.at(1)].v == p->leftmost) {
      LockNode(p);
      RemoveEntry(p, s, 0);
      UnlockNode(p);
    }
    LoadSlots(p, &s);
    for (uint32_t i = 1; i <= s.count(); i++) {
      if (p->ents()[s.at(i)].v != lo) continue;
      LockNode(p);
      RemoveEntry(p, s, i - 1);
      UnlockNode(p);
      break;
    }
    PMINDEX_RETURN_IF_ERROR(alloc_->Free(&meta_->free_leaf));
  }
  if (meta_->free_prev || meta_->free_parent) {
    St(&meta_->free_prev, uint64_t(0));
    St(&meta_->free_parent, uint64_t(0));
    pm::Persist(&meta_->free_prev, 16);
  }
  return Status::OK();
}

#define PMINDEX_WBTREE_SMO(BK)                                                                                   \
  template void WBTree<BK>::ClearLog(SplitLog*);                                                                 \
  template Status WBTree<BK>::PathTo(Slice, uint32_t, std::vector<Node*>*, Node**);                              \
  template Status WBTree<BK>::SplitForKey(Slice);                                                                \
  template Status WBTree<BK>::SplitNode(std::vector<Node*>&, size_t, Node*, Node**, std::string*,               \
                                        std::vector<Node*>*);                                                    \
  template Status WBTree<BK>::InsertIntoParent(std::vector<Node*>&, size_t, Node*, Slice, Node*,                 \
                                               std::vector<Node*>*);                                             \
  template Status WBTree<BK>::GrowRoot(Node*, Slice, Node*, std::vector<Node*>*);                                \
  template Status WBTree<BK>::FreeEmptyLeaf(Slice);                                                              \
  template Status WBTree<BK>::RecoverFreeLeaf();                                                                 \
  template Status WBTree<BK>::LeftNeighbour(const std::vector<Node*>&, uint64_t, uint64_t*);
PMINDEX_WBTREE_SMO(false)
PMINDEX_WBTREE_SMO(true)

}  // namespace pmindex::internal::wbtree
