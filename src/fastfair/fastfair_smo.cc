// fastfair_smo.cc: the structure changes of the FAST & FAIR tree (FAIR,
// paper sec. 4): split with its parent insert, root growth, merge,
// rebalance, root collapse, and the retire slots that own unlinked nodes.
//
// Persist order above each operation; in short:
//  - Split (sec. 4.1): new sibling S allocated into n->spare_node, filled
//    and persisted (I2 included); S write-locked; then in line 0 of n:
//    sibling and high (high first when n was rightmost), count cut to the
//    median, sw += 2, spare_node cleared: one flush (the commit); then I2
//    for the cut node. The parent insert follows from the root (B-link:
//    until then readers reach S through n's fence).
//  - Root growth: new root built and persisted in Meta::spare_root, then
//    ONE 8-byte store of Meta::root publishes it (spare_root cleared in the
//    same line).
//  - Merge of r into its left sibling l (sec. 4.2, the split in reverse):
//    retire slot owns r (tag l), separator deleted from the parent (FAST
//    delete), r's records appended past l's count (invisible) and
//    persisted, line 0 of l: count, high, sibling, sw (one flush: the
//    commit), r->dead = 1, slot tag cleared; r freed after the epoch grace
//    period. Open undoes a merge whose commit did not persist.
//  - Rebalance (the paper's borrow): a split of the fuller sibling at the
//    balancing point, then a merge of the pair left small: two
//    failure-atomic steps the tree already has.
//  - Root collapse: retire slot owns the root (tag kRootMark), ONE 8-byte
//    store of Meta::root to its only child, root->dead = 1, tag cleared.
//
// Invariants: at every crash point the tree is a valid B-link tree (a
// node's records lie in [low, high); a node not yet in its parent is
// reachable through its left sibling's fence) and every block has one
// persistent owner (spare words, Meta::spare_root, retire slots).
//
// Thread safety: callers hold the write locks named above each function;
// lock order: higher level first, left to right within a level, root_mu_
// last. Readers run concurrently (splits and merges add 2 to sw).
#include "fastfair/fastfair_tree.h"

namespace pmindex::internal::fastfair {

// ---- FAIR split ------------------------------------------------------
// n is write-locked, full and repaired. On return n holds the lower half,
// *out_s the upper half (not yet in the parent), *out_k its low key.
// The new sibling of a leaf gets its records behind an lk
// prefix (free slots in front and behind), so that its inserts can shift
// either side; not when the insert that splits is an append (pos ==
// count): ascending loads never insert into a prefix, and with centred
// siblings every leaf of such a load kept 3 of 10 records (the cut node
// keeps its prefix) instead of half.
template <bool BK>
Status FastFair<BK>::Split(Node* n, uint64_t* out_k, Node** out_s, bool append) {
  const uint32_t s = Start(n);
  if (s) prefix_splits_.fetch_add(1, std::memory_order_relaxed);
  return SplitAt(n, s + (n->count - s) / 2, out_k, out_s, /*centre=*/!append);
}

// The same at record m (1 <= m, m + 1 < count): n keeps [0, m); a leaf's
// sibling gets [m, count), an internal one [m + 1, count) with m's child
// as its leftmost (the key of m moves up). Rebalance cuts elsewhere.
template <bool BK>
Status FastFair<BK>::SplitAt(Node* n, uint32_t m, uint64_t* out_k, Node** out_s, bool centre) {
  const uint32_t cnt = n->count;
  const bool leaf = n->level == 0;
  Entry* e = n->ents();
  uint64_t K = e[m].k;
  if (BK && leaf) {
    // The separator gets its own block (the record's block is freed when
    // the record is deleted); S owns it as its low key.
    PMINDEX_RETURN_IF_ERROR(AllocBlock(&n->spare_a, BlockSlice(K)));
    K = Ld(&n->spare_a);
  }
  Status st = alloc_->Allocate(&n->spare_node, node_size_);
  if (!st.ok()) {
    if (BK && leaf) alloc_->FreeOrAbort(&n->spare_a);
    return st;
  }
  const uint64_t soff = Ld(&n->spare_node);
  Node* s = At(soff);
  Node h{};
  h.sibling = n->sibling;
  h.high = n->high;
  const uint32_t moved = leaf ? cnt - m : cnt - m - 1;
  // The sibling's lk prefix: 5/8 of its free slots (front-heavy: its
  // left half keeps what is left of the prefix when it splits in turn).
  const uint32_t o = centre && leaf ? (cap_ - moved) * 5 / 8 : 0;
  h.count = o + moved;
  h.level = n->level;
  h.gen = gen_;
  h.low = K;
  h.leftmost = leaf ? 0 : e[m].v;
  h.lk = n->lk;
  // A centred u64 leaf gets lk = K - 1: it never holds a key below its low
  // key K (low never changes; merges bring keys from the right), so no
  // insert or merge will ever need FixLk on it, which would have to drop
  // the prefix first (the prefix holds lk). An inherited lk could be a
  // key of it (FixLk raises lk just above an inserted key: loading 0, 1,
  // 2, ... in order made every split's sibling drop its prefix).
  if (o && !BK) h.lk = K - 1;
  pm::Copy(s, &h, sizeof(Node));
  for (uint32_t i = 0; i < o; i++) {
    pm::Store(&s->ents()[i].v, uint64_t(0));
    pm::Store(&s->ents()[i].k, h.lk);
  }
  if (moved) pm::Copy(s->ents() + o, leaf ? &e[m] : &e[m + 1], moved * sizeof(Entry));
  size_t slen = sizeof(Node) + h.count * sizeof(Entry);
  for (uint32_t i = h.count; i < h.count + 2 && i < cap_; i++) {  // I2
    pm::Store(&s->ents()[i].k, h.count ? s->ents()[h.count - 1].k : h.lk);
    slen += sizeof(Entry);
  }
  const bool early_link = PMINDEX_FAULT("fastfair.split.link_before_persist");
  if (!early_link) pm::Persist(s, slen);
  // S is write-locked BEFORE the link makes it reachable (nobody else can
  // hold its lock word: lock words are per node, and a freed node's word
  // is free once its grace period passed); the caller inserts into it and
  // unlocks it (UnlockNew). Unlocked, another writer could move right into
  // S and insert there while the splitter computes its position: the
  // splitter would then insert at a stale position.
  WLock(s);
  // Link and cut: all in line 0 of n, one flush.
  if (n->sibling == 0) {
    St(&n->high, K);
    St(&n->sibling, soff);
  } else {
    St(&n->sibling, soff);
    St(&n->high, K);
  }
  St(&n->count, m);
  St(&n->sw, n->sw + 2);
  St(&n->spare_node, uint64_t(0));
  if (BK && leaf) St(&n->spare_a, uint64_t(0));
  pm::Persist(n, pm::kCacheLine);
  // I2 for the cut node (slots m and m+1 are past the durable count now;
  // until this persists, slot m holds the median, at n's new high: not
  // taken for a record Pushed past the count).
  St(&e[m].k, e[m - 1].k);
  St(&e[m + 1].k, e[m - 1].k);
  pm::Persist(&e[m], 2 * sizeof(Entry));
  if (early_link) pm::Persist(s, slen);
  *out_k = K;
  *out_s = s;
  return Status::OK();
}

// Inserts (K, child) at `level` unless present (idempotent: the splitter
// and a writer that found the sibling missing may both try).
template <bool BK>
Status FastFair<BK>::InsertInternal(uint32_t level, uint64_t K, uint64_t child, bool* inserted) {
  const SK key = KeyOf(K);
  Pending pend;
  Node* n = nullptr;
  PMINDEX_RETURN_IF_ERROR(LockAt(level, key, &pend, &n));
  uint32_t pos;
  // Present as a record, or as n's leftmost child: when a parent split
  // chose K as its median, K moved up and the child became the new
  // sibling's `leftmost`, with no record keyed K left at this level. A
  // writer that had moved right to the child before (pending) must not
  // insert (K, child) a second time (the child would be listed twice).
  // A child merged away meanwhile (dead is set under its parent's lock,
  // after its record left the parent) must not come back.
  if (FindInLocked(n, key, &pos) || n->leftmost == child || Ld(&At(child)->dead)) {
    WUnlock(n);
    EnsurePending(pend);
    return Status::OK();
  }
  Node* t = n;
  uint64_t K2 = 0;
  Node* S2 = nullptr;
  if (n->count == cap_) {
    Status st = Split(n, &K2, &S2);
    if (!st.ok()) {
      WUnlock(n);
      return st;
    }
    if (Cmp(K2, key) <= 0) t = S2;
    FindInLocked(t, key, &pos);
  }
  // The new sibling is reachable through n's fence already: Split locked
  // it before linking it, so nobody else changed it since.
  if (!BK && K == t->lk) FixLk(t, K);
  InsertAt(t, pos, K, child);
  UnlockNew(n, S2);
  if (inserted) *inserted = true;
  WUnlock(n);
  Status st;
  if (S2) st = InsertInternal(level + 1, K2, Off(S2));
  EnsurePending(pend);
  return st;
}

template <bool BK>
void FastFair<BK>::EnsurePending(const Pending& pend) {
  for (int i = 0; i < pend.n; i++) {
    Node* c = At(pend.a[i].child);
    bool inserted = false;
    if (InsertInternal(pend.a[i].level + 1, c->low, pend.a[i].child, &inserted).ok() && inserted) parents_repaired_++;
  }
}

template <bool BK>
Status FastFair<BK>::GrowRoot(uint32_t level) {
  std::lock_guard<std::mutex> g(root_mu_);
  for (;;) {
    Node* r = At(meta_->root);
    if (r->level >= level) return Status::OK();
    PMINDEX_RETURN_IF_ERROR(alloc_->Allocate(&meta_->spare_root, node_size_));
    Node* nr = At(Ld(&meta_->spare_root));
    Node h{};
    h.level = r->level + 1;
    h.leftmost = Off(r);
    h.lk = BK ? kBytesLk : 0;
    h.gen = gen_;
    pm::Copy(nr, &h, sizeof(Node));
    pm::Store(&nr->ents()[0].k, h.lk);  // I2
    pm::Store(&nr->ents()[1].k, h.lk);
    pm::Persist(nr, sizeof(Node) + 2 * sizeof(Entry));
    // The new root is durable; one 8-byte store publishes it.
    St(&meta_->root, Off(nr));
    St(&meta_->spare_root, uint64_t(0));
    pm::Persist(&meta_->root, 16);
    root_grows_++;
  }
}

// ---- FAIR merge (sec. 4.2), reverse order of the split ----------------------
// Trigger: a non-root node with fewer than cap/3 records (internal: keys)
// after a delete. It is merged with its left (or, failing that, right)
// sibling under the same parent if the result holds at most 3/4 of the
// capacity (the whole capacity if the node is empty): a merged node is
// never on the edge of a split again (no split/merge thrashing). If
// neither fits, it is rebalanced with one (Rebalance), if both halves end
// at or above the threshold (docs/fastfair.md).

// A free retire slot (reclaiming first), or -1: the merge is skipped.
template <bool BK>
int FastFair<BK>::ClaimSlot() {
  if (limbo_->has_retired()) Reclaim(false);
  return limbo_->Claim();
}

// Frees retired nodes whose grace period has passed (all of them if
// `all`: no thread is in the tree any more).
template <bool BK>
void FastFair<BK>::Reclaim(bool all) {
  reclaims_.fetch_add(1, std::memory_order_relaxed);
  nodes_freed_ += limbo_->Reclaim(epoch_, all, [this](const kit::RetireSlot& s) { FreeLimboExtra(s); });
  reclaim_at_.store(limbo_->has_retired() ? epoch_.Epoch() : 0, std::memory_order_relaxed);
}

// One merge attempt for underfull x (any level). Returns x's parent if
// that became underfull in turn (the caller continues with it).
template <bool BK>
Node* FastFair<BK>::MergeStep(Node* x) {
  const uint32_t level = x->level;
  const uint64_t xlow = Ld(&x->low);
  const int slot = ClaimSlot();
  if (slot < 0) {
    merges_skipped_++;
    return nullptr;
  }
  Pending pend;
  Node* p = nullptr;
  Node* next = nullptr;
  bool used = false;
  if (LockAt(level + 1, LowKey(xlow), &pend, &p, /*grow=*/false).ok() && p) {
    used = MergeUnder(p, x, xlow, slot, &pend);
    if (used && p->count == 0 && Off(p) == Ld(&meta_->root)) {
      CollapseRoot(p);
    } else if (used && Underfull(p) && Off(p) != Ld(&meta_->root)) {
      next = p;
    }
    WUnlock(p);
  }
  if (used) limbo_->Retire(slot);
  else limbo_->Release(slot);
  EnsurePending(pend);
  return next;
}

// p write-locked: merges x with a neighbour under p if x is still a child
// of p, still underfull, and the pair fits. Locks: p, then l, then r
// (level by level from the top, left to right within a level).
template <bool BK>
bool FastFair<BK>::MergeUnder(Node* p, Node* x, uint64_t xlow, int slot, Pending* pend) {
  Entry* pe = p->ents();
  int64_t j;
  uint32_t pos;
  if (p->leftmost == Off(x)) j = -1;
  else if (xlow && FindInLocked(p, KeyOf(xlow), &pos) && pe[pos].v == Off(x)) j = pos;
  else return false;  // not (or no longer) listed here
  // A merge with either neighbour first; failing that, a rebalance.
  for (const bool rebalance : {false, true}) {
    for (int64_t sep : {j, j + 1}) {  // r = child of record sep
      if (sep < 0 || sep >= int64_t(p->count)) continue;
      Node* l = At(sep == 0 ? p->leftmost : pe[sep - 1].v);
      Node* r = At(pe[sep].v);
      WLock(l);
      Prepare(l, pend);
      WLock(r);
      Prepare(r, pend);
      const uint32_t total = Live(l) + Live(r) + (l->level ? 1 : 0);
      const uint32_t limit = Live(x) == 0 ? cap_ : cap_ * 3 / 4;
      const bool pair = l->sibling == Off(r) && r->low == pe[sep].k && l->level + 1 == p->level &&
                        r->level == l->level && Underfull(x);
      bool done = false;
      if (pair && !rebalance && total <= limit) {
        DoMerge(p, uint32_t(sep), l, r, slot);
        done = true;
      } else if (pair && rebalance && total > limit) {
        done = Rebalance(p, uint32_t(sep), l, r, slot);
      }
      WUnlock(r);
      WUnlock(l);
      if (done) return true;
    }
  }
  return false;
}

// Rebalance (the paper's borrow, sec. 4.2) of siblings l and r under p
// (p, l, r write-locked and repaired; r is p's record sep), too full
// together to merge, so that both end with about half of their records
// and neither is underfull. Built from the two failure-atomic steps the
// tree already has, in this order: (1) a split of the fuller one at the
// balancing point (SplitAt: the new node s is linked, and its separator
// inserted into p here, under p's lock; p has room, checked first); (2) a
// merge (DoMerge: limbo slot, separator out of p, records appended, one
// commit line) of the pair that is now small: r into s if l gave, r into
// l if r gave. Between the steps, and at every crash point inside them,
// the tree is a valid B-link tree with nothing lost (a crash after (1)
// leaves one more node; inside (2) open undoes or completes the merge as
// for any merge). Records only move right in (1) and (2) moves a whole
// node left, as a merge does, so readers need nothing new. The paper's
// borrow shifts records from a live node into its neighbour and changes
// both fences in place, which our fence keys (readers pair high with
// sibling) would need a new protocol for. Costs one split and one merge
// (about 12-15 fences, an allocation, a deferred free), so it is done
// only when both halves end at or above the threshold. False (nothing
// changed) if it does not apply or the pool is full.
template <bool BK>
bool FastFair<BK>::Rebalance(Node* p, uint32_t sep, Node* l, Node* r, int slot) {
  const bool leaf = l->level == 0;
  // (Counted without the lk prefixes; the cut m is a slot.)
  const uint32_t ls = Start(l), rs = Start(r);
  const uint32_t lc = l->count - ls, rc = r->count - rs;
  const uint32_t t = (lc + rc) / 2;  // l's share (internal: keys; p keeps one)
  if (t < merge_below_ || lc + rc - t < merge_below_ || p->count >= cap_) return false;
  Node* donor;
  uint32_t m;
  uint32_t ds;
  if (lc > t) {
    donor = l;  // l keeps [0, t)
    m = t;
    ds = ls;
  } else {
    donor = r;  // l gets r's first m records (internal: the separator and m keys)
    if (leaf) m = t - lc;
    else if (t >= lc + 1) m = t - lc - 1;
    else return false;
    ds = rs;
  }
  if (m < 1 || ds + m + 1 >= donor->count) return false;
  m += ds;
  uint64_t K;
  Node* s;
  if (!SplitAt(donor, m, &K, &s).ok()) return false;
  // (K, s) into p, which covers both (the parent insert of the split,
  // done here under p's lock instead of from the root).
  uint32_t pos;
  FindInLocked(p, KeyOf(K), &pos);
  if (!BK && K == p->lk) FixLk(p, K);
  InsertAt(p, pos, K, Off(s));
  if (donor == l) DoMerge(p, pos + 1, s, r, slot);  // (K, s) is record sep, r's record follows it
  else DoMerge(p, sep, l, r, slot);                  // (K, s) follows r's record
  WUnlock(s);
  rebalances_++;
  if (donor == r) rebalances_from_right_++;
  return true;
}

// Merges r into its left sibling l (p, l, r write-locked and repaired),
// the split in reverse: (1) the limbo slot takes r, (2) the separator
// leaves the parent (r is now reached through l's fence only: the state
// of a split whose parent insert is pending), (3) r's records (internal:
// the separator with r's leftmost child first) are appended past l's
// count, invisible, and persisted, (4) line 0 of l: count, high, sibling
// (readers that pair the new high with the old sibling still move right
// to r, intact), one flush: the commit, (5) r is marked dead and the slot
// records the unlink. Open undoes a merge whose step 4 did not persist.
template <bool BK>
void FastFair<BK>::DoMerge(Node* p, uint32_t sep, Node* l, Node* r, int slot) {
  const uint64_t K = p->ents()[sep].k;
  // Fault: the slot claims r is unlinked already; open frees a linked node.
  const bool fault = PMINDEX_FAULT("fastfair.merge.free_before_unlink");
  // The slot owns r, tagged with l (tag before block, one line: r without
  // l would read as "unlinked" and open would free a node still in the
  // tree).
  limbo_->Own(slot, Off(r), fault ? uint64_t(0) : Off(l));
  DeleteAt(p, sep, true);
  // On the stack, not thread_local: another merge may run on this thread
  // while this one waits in a fence (the crash tests' fence callbacks
  // open and repair other trees).
  Entry add[kMaxCap + 1];
  uint32_t n = 0;
  if (l->level) add[n++] = {K, r->leftmost};
  for (uint32_t j = Start(r); j < r->count; j++) add[n++] = r->ents()[j];  // (not r's lk prefix)
  // The records go behind l's count; if l's lk prefix leaves
  // too little room there (the fit is counted without prefixes), l's
  // records move to the front first (rare).
  if (l->count + n > cap_) DropPrefix(l);
  // (l's lk prefix holds l's lk: dropped before lk changes.)
  for (uint32_t i = 0; i < n; i++)
    if (add[i].k == l->lk) DropPrefix(l);
  Entry* le = l->ents();
  const uint32_t lc = l->count;
  // l's lk must stay unequal to every key of l.
  bool clash = false;
  for (uint32_t i = 0; i < n; i++) clash |= add[i].k == l->lk;
  if (clash) {
    for (uint64_t c = l->lk + 1;; c++) {
      bool used = false;
      for (uint32_t j = 0; j < lc && !used; j++) used = le[j].k == c;
      for (uint32_t i = 0; i < n; i++) used |= add[i].k == c;
      if (!used) {
        St(&l->lk, c);
        pm::Persist(&l->lk, 8);
        break;
      }
    }
  }
  size_t len = 0;
  if (n) {
    for (uint32_t i = 0; i < n; i++) {
      St(&le[lc + i].v, add[i].v);
      St(&le[lc + i].k, add[i].k);
    }
    len = n * sizeof(Entry);
    for (uint32_t i = lc + n; i < lc + n + 2 && i < cap_; i++) {  // I2
      St(&le[i].k, add[n - 1].k);
      len += sizeof(Entry);
    }
    pm::Persist(&le[lc], len);
  }
  St(&l->count, lc + n);
  St(&l->high, r->sibling ? r->high : uint64_t(0));
  St(&l->sibling, r->sibling);
  St(&l->sw, l->sw + 2);
  pm::Persist(l, pm::kCacheLine);
  St(&r->dead, uint64_t(1));
  pm::Persist(&r->dead, 8);
  if (!fault) limbo_->Unlinked(slot);
  merges_++;
}

// p is the write-locked root and has no keys left: its only child becomes
// the root (one 8-byte store of Meta::root), p goes to the limbo.
template <bool BK>
void FastFair<BK>::CollapseRoot(Node* p) {
  const int slot = ClaimSlot();
  if (slot < 0) return;
  std::lock_guard<std::mutex> g(root_mu_);
  // (A root with a right sibling, possible after an earlier collapse
  // while that sibling's parent insert was pending, keeps its level: its
  // siblings would become unreachable.)
  if (Ld(&meta_->root) != Off(p) || p->count != 0 || !p->leftmost || p->sibling) {
    limbo_->Release(slot);
    return;
  }
  limbo_->Own(slot, Off(p), kRootMark);
  St(&meta_->root, p->leftmost);
  pm::Persist(&meta_->root, 8);
  St(&p->dead, uint64_t(1));
  pm::Persist(&p->dead, 8);
  limbo_->Unlinked(slot);
  root_collapses_++;
  limbo_->Retire(slot);
}
#define PMINDEX_FASTFAIR_SMO(BK)                                                                   \
  template Status FastFair<BK>::Split(Node*, uint64_t*, Node**, bool);                             \
  template Status FastFair<BK>::SplitAt(Node*, uint32_t, uint64_t*, Node**, bool);                 \
  template Status FastFair<BK>::InsertInternal(uint32_t, uint64_t, uint64_t, bool*);               \
  template void FastFair<BK>::EnsurePending(const Pending&);                                       \
  template Status FastFair<BK>::GrowRoot(uint32_t);                                                \
  template int FastFair<BK>::ClaimSlot();                                                          \
  template void FastFair<BK>::Reclaim(bool);                                                       \
  template Node* FastFair<BK>::MergeStep(Node*);                                                   \
  template bool FastFair<BK>::MergeUnder(Node*, Node*, uint64_t, int, Pending*);                   \
  template bool FastFair<BK>::Rebalance(Node*, uint32_t, Node*, Node*, int);                       \
  template void FastFair<BK>::DoMerge(Node*, uint32_t, Node*, Node*, int);                         \
  template void FastFair<BK>::CollapseRoot(Node*);
PMINDEX_FASTFAIR_SMO(false)
PMINDEX_FASTFAIR_SMO(true)
#undef PMINDEX_FASTFAIR_SMO

}  // namespace pmindex::internal::fastfair
