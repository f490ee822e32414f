// fptree/fptree_smo.cc: the FPTree family's structure changes: leaf split
// (paper alg. 3, recovery alg. 4), leaf deletion (alg. 5/6, recovery alg.
// 7), the DRAM inner-node changes that go with them, and fptree's deferred
// leaf deletions. Format of the micro-logs: fptree_format.h.
//
// Persist order, split (alg. 3; the leaf is locked):
//   1. log.cur = leaf (stored, not yet flushed);
//   2. the new leaf is allocated into log.nw (allocate-into-destination: the
//      allocator's commit makes log.nw durable, and log.cur, same line and
//      stored earlier, with it; fptree_single takes a leaf of a group and
//      persists the log line);
//   3. SplitCopy: the new leaf gets the whole leaf but its trailer, its
//      bitmap = the upper half, next = the leaf's next; the block words of
//      the slots it does not keep are zeroed; flushed, fence;
//   4. SplitFinish: the leaf's bitmap = the lower half and next = new leaf,
//      both flushed with one fence; then (byte keys/values) the moved slots'
//      block words in the old leaf are zeroed and flushed, fence;
//   5. the log is reset: nw, then cur (same line), persisted.
// Recovery (alg. 4) of a log with cur and nw set: if cur's bitmap is still
// full, redo 3; then redo 4 (the upper half is then nw's bitmap) and 5.
//
// Persist order, leaf deletion (alg. 6; the empty leaf and its left
// neighbour locked, the inner nodes on its path write-locked):
//   1. log {prev, cur} (prev stored first, same line), persisted;
//   2. prev.next (or the root's head) = cur.next, persisted;
//   3. log.prev = 0, persisted, before prev's lock is released: once prev
//      is unlocked another deletion may unlink, free and reuse it, and
//      recovery must not redo step 2 into that memory (with prev = 0 it
//      checks the root's head, which never names the unlinked cur again);
//   4. after the epoch grace period: cur is freed (allocator, into log.cur)
//      or returned to its group (fptree_single), then the log line reset.
// Recovery (alg. 7) redoes 2 for every log before it frees any leaf (4).
// A leaf is unlinked also when it is its DRAM parent's only child: the
// single-child inner nodes above it go with it, a single-child root
// collapses; only the tree's last leaf stays. No deletion is left to
// recovery: one whose neighbour lock stays contended (fptree) is queued in
// DRAM and carried out by a later Remove.
//
// Thread safety: fptree_tree.h. Writers here hold the leaf's lock; inner
// nodes are changed under their OLC write locks, taken top-down by upgrade
// (never waiting), so holding leaf locks while taking them cannot deadlock.
#include <algorithm>
#include <cstdlib>

#include "fptree/fptree_tree.h"
#include "pmindex/pm/fault.h"

namespace pmindex::internal::fptree {

// ---- inner nodes --------------------------------------------------------------
template <bool kConc, bool kBytes>
Inner* FPTree<kConc, kBytes>::NewInner(bool bottom) {
  size_t b = Inner::Bytes(inner_cap_);
  auto* n = static_cast<Inner*>(std::aligned_alloc(64, b));
  std::memset(static_cast<void*>(n), 0, b);
  new (&n->count) std::atomic<uint32_t>(0);
  n->cap = inner_cap_;
  n->bottom = bottom;
  {
    std::lock_guard<std::mutex> g(nodes_mu_);
    n->pos = uint32_t(nodes_.size());
    nodes_.push_back(n);
  }
  dram_bytes_.fetch_add(b, std::memory_order_relaxed);
  return n;
}

// Frees an inner node no thread can reach any more (after the grace period).
template <bool kConc, bool kBytes>
void FPTree<kConc, kBytes>::FreeInner(Inner* n) {
  {
    std::lock_guard<std::mutex> g(nodes_mu_);
    Inner* last = nodes_.back();
    nodes_[n->pos] = last;
    last->pos = n->pos;
    nodes_.pop_back();
  }
  dram_bytes_.fetch_sub(Inner::Bytes(n->cap), std::memory_order_relaxed);
  std::free(n);
}

// The inner-node key word of k: the u64 key, or a new KeyBlob.
template <bool kConc, bool kBytes>
uint64_t FPTree<kConc, kBytes>::KeyWordForInner(const SKey& k) {
  if constexpr (kBytes) {
    KeyBlob* b = NewBlob(k.s);
    dram_bytes_.fetch_add(sizeof(KeyBlob) + k.s.size(), std::memory_order_relaxed);
    return reinterpret_cast<uint64_t>(b);
  } else {
    return k.u;
  }
}

template <bool kConc, bool kBytes>
void FPTree<kConc, kBytes>::FreeKeyWord(uint64_t w) {
  if constexpr (kBytes) {
    auto* b = reinterpret_cast<KeyBlob*>(w);
    dram_bytes_.fetch_sub(sizeof(KeyBlob) + b->len, std::memory_order_relaxed);
    std::free(b);
  }
}

// Inserts separator sep -> right leaf into the bottom inner node covering
// sep, splitting full nodes on the way down (OLC insert; only inner-node
// locks are taken here).
template <bool kConc, bool kBytes>
void FPTree<kConc, kBytes>::InsertSeparator(const SKey& sep, uint64_t kw, uint64_t right_leaf) {
  struct At {
    FPTree* t;
    uint64_t kw, right_leaf;
    Inner* parent = nullptr;
    uint64_t pv = 0;
    Step Node(Inner* n, uint64_t v) {
      if (n->count.load(std::memory_order_relaxed) >= n->cap) {
        if (parent && !Olc::Upgrade(parent, pv)) return Step::kRetry;
        if (!Olc::Upgrade(n, v)) {
          if (parent) Olc::WriteUnlock(parent);
          return Step::kRetry;
        }
        if (!parent && n != t->root_inner_.load(std::memory_order_relaxed)) {
          Olc::WriteUnlock(n);
          return Step::kRetry;
        }
        t->SplitInner(n, parent);
        Olc::WriteUnlock(n);
        if (parent) Olc::WriteUnlock(parent);
        return Step::kRetry;
      }
      if (parent && !Olc::Validate(parent, pv)) return Step::kRetry;
      return Step::kGo;
    }
    Step Down(Inner* n, uint64_t v, uint32_t, uint64_t) {
      if (!Olc::Validate(n, v)) return Step::kRetry;
      parent = n;  // used only if the child's read lock and n's validation succeed
      pv = v;
      return Step::kGo;
    }
    Step Bottom(Inner* n, uint64_t v, uint32_t i, uint64_t) {
      if (!Olc::Upgrade(n, v)) return Step::kRetry;
      InsertAt(n, i, kw, right_leaf);
      Olc::WriteUnlock(n);
      return Step::kDone;
    }
  } at{this, kw, right_leaf};
  Backoff bo;
  for (bool first = true;; first = false) {
    if (kConc && !first) bo.Wait();
    at.parent = nullptr;
    at.pv = 0;
    if (Descend(sep, at) == Step::kDone) return;
  }
}

// Splits full node n (locked; parent locked or n is the root).
template <bool kConc, bool kBytes>
void FPTree<kConc, kBytes>::SplitInner(Inner* n, Inner* parent) {
  Inner* r = NewInner(n->bottom);
  uint64_t sep = SplitInto(n, r);
  if (parent) {
    uint32_t i = 0;
    uint32_t pc = parent->count.load(std::memory_order_relaxed);
    while (i <= pc && parent->child()[i].load(std::memory_order_relaxed) != reinterpret_cast<uint64_t>(n)) i++;
    InsertAt(parent, i, sep, reinterpret_cast<uint64_t>(r));
  } else {
    Inner* nr = NewInner(false);
    nr->keys()[0].store(sep, std::memory_order_relaxed);
    nr->child()[0].store(reinterpret_cast<uint64_t>(n), std::memory_order_release);
    nr->child()[1].store(reinterpret_cast<uint64_t>(r), std::memory_order_release);
    nr->count.store(1, std::memory_order_relaxed);
    root_inner_.store(nr, std::memory_order_release);
  }
}

// ---- micro-log slots (fptree: a free mask; the others: slot 0) --------------
template <bool kConc, bool kBytes>
int FPTree<kConc, kBytes>::AcquireLog(std::atomic<uint64_t>* mask) {
  if constexpr (!kConc) return 0;
  for (;;) {
    uint64_t m = mask->load(std::memory_order_relaxed);
    if (m == 0) {
      std::this_thread::yield();
      continue;
    }
    int i = __builtin_ctzll(m);
    if (mask->compare_exchange_weak(m, m & ~(1ull << i), std::memory_order_acquire)) return i;
  }
}

// One try: a free slot, or -1 (the caller holds locks and must not wait).
template <bool kConc, bool kBytes>
int FPTree<kConc, kBytes>::TryAcquireLog(std::atomic<uint64_t>* mask) {
  if constexpr (!kConc) return 0;
  uint64_t m = mask->load(std::memory_order_relaxed);
  while (m) {
    int i = __builtin_ctzll(m);
    if (mask->compare_exchange_weak(m, m & ~(1ull << i), std::memory_order_acquire)) return i;
  }
  return -1;
}

template <bool kConc, bool kBytes>
void FPTree<kConc, kBytes>::ReleaseLog(std::atomic<uint64_t>* mask, int i) {
  if constexpr (!kConc) return;
  mask->fetch_or(1ull << i, std::memory_order_release);
}

// ---- leaf split (alg. 3/4) ----------------------------------------------------------
// Chooses the upper half of the (full) leaf l: returns the bitmap of the
// slots that move and the separator (smallest moving key).
template <bool kConc, bool kBytes>
bool FPTree<kConc, kBytes>::ChooseSplit(char* l, uint64_t* upper, Rec* sep) {
  uint64_t bm = Ld(Bm(l));
  if constexpr (!kBytes) {
    // u64 keys: (key, slot) pairs on the stack and a selection instead of
    // a sort of owned records (callgrind: ~40% of an insert's instructions
    // went to the Rec/std::string version below).
    std::pair<uint64_t, uint32_t> v[64];
    uint32_t c = 0;
    for (uint64_t m = bm; m; m &= m - 1) {
      int i = __builtin_ctzll(m);
      v[c++] = {Ld(Key(l, i)), uint32_t(i)};
    }
    uint32_t half = c / 2;
    std::nth_element(v, v + half, v + c);
    *upper = 0;
    for (uint32_t j = half; j < c; j++) *upper |= 1ull << v[j].second;
    sep->k = v[half].first;
    return true;
  }
  std::vector<std::pair<Rec, int>> v;
  for (uint64_t m = bm; m; m &= m - 1) {
    int i = __builtin_ctzll(m);
    Rec r;
    if (!ReadSlotKey(l, i, &r)) return false;
    v.emplace_back(std::move(r), i);
  }
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return CmpRec(a.first, b.first) < 0; });
  size_t half = v.size() / 2;
  *upper = 0;
  for (size_t j = half; j < v.size(); j++) *upper |= 1ull << v[j].second;
  *sep = v[half].first;
  return true;
}

// Copy phase (alg. 3 lines 6-10): new leaf n gets all of l, keeps `upper`.
template <bool kConc, bool kBytes>
void FPTree<kConc, kBytes>::SplitCopy(char* l, char* n, uint64_t upper) {
  // Everything but the trailer (next pointer set below; scans may store
  // scan-order hints into l's trailer meanwhile).
  pm::Copy(n, l, lay_.trailer);
  pm::Store(Bm(n), upper);
  // SplitFinish flushes l's bitmap and next with one fence, so a crash image
  // may hold l.next == n with l's bitmap still full: the copy is then redone,
  // and n.next (durable since the first copy's fence) must be kept rather
  // than set to l.next (that would make n point to itself).
  uint64_t lnext = Ld(Next(l));
  if (lnext != uint64_t(n - base_)) pm::Store(Next(n), lnext);
  // Born locked, at a version no earlier leaf at this table word had.
  if constexpr (kConc) Ver(n)->NewBorn();
  if (pointers_) {
    for (uint32_t i = 0; i < lay_.m; i++) {
      if (upper >> i & 1) continue;
      if (kBytes) pm::Store(Key(n, i), uint64_t(0));
      if (vbytes_) pm::Store(Val(n, i), uint64_t(0));
    }
  }
  pm::Flush(n, lay_.bytes);
  pm::Fence();
}

// Alg. 3 lines 11-14 plus the pointer cleanup of moved slots in l.
template <bool kConc, bool kBytes>
void FPTree<kConc, kBytes>::SplitFinish(char* l, uint64_t noff, uint64_t upper) {
  pm::StoreAtomic(Bm(l), lay_.full & ~upper);
  pm::StoreAtomic(Next(l), noff);
  pm::Flush(l, 8);
  pm::Flush(Next(l), 8);
  if (pointers_) {
    // The cut must be durable before the moved slots' pointers are cleared
    // (other lines): a crash image with the pointers cleared but the bitmap
    // still full would leave recovery unable to redo the split.
    pm::Fence();
    for (uint32_t i = 0; i < lay_.m; i++) {
      if (!(upper >> i & 1)) continue;
      if (kBytes) {
        pm::StoreAtomic(Key(l, i), uint64_t(0));
        pm::Flush(Key(l, i), 8);
      }
      if (vbytes_) {
        pm::StoreAtomic(Val(l, i), uint64_t(0));
        pm::Flush(Val(l, i), 8);
      }
    }
  }
  pm::Fence();
}

template <bool kConc, bool kBytes>
void FPTree<kConc, kBytes>::ResetSplitLog(SplitLog* lg) {
  pm::Store(&lg->nw, uint64_t(0));
  pm::Store(&lg->cur, uint64_t(0));
  pm::Persist(lg, 16);
}

// Splits the full, locked leaf loff. On success *noff is the new right leaf
// (locked, linked after loff) and *sep its smallest key.
template <bool kConc, bool kBytes>
Status FPTree<kConc, kBytes>::SplitLeaf(uint64_t loff, uint64_t* noff, Rec* sep) {
  char* l = L(loff);
  uint64_t upper = 0;
  if (!ChooseSplit(l, &upper, sep)) return Status::Corrupt("fptree: unreadable key block in a locked leaf");
  int li = AcquireLog(&split_free_);
  SplitLog* lg = &root_->split[li];
  if (!PMINDEX_FAULT("fptree.split.skip_log")) pm::Store(&lg->cur, loff);
  Status st;
  if (groups_) {
    uint64_t leaf = 0;
    st = GetLeaf(&leaf);
    if (st.ok()) {
      pm::Store(&lg->nw, leaf);
      pm::Persist(lg, 16);
    }
  } else {
    // Allocate-into-destination: log.new is the destination. log.cur sits in
    // the same line, stored earlier, so it is durable no later than log.new.
    st = pool_->allocator().Allocate(&lg->nw, lay_.bytes);
  }
  if (!st.ok()) {
    ResetSplitLog(lg);
    ReleaseLog(&split_free_, li);
    return st;
  }
  *noff = lg->nw;
  SplitCopy(l, L(*noff), upper);
  SplitFinish(l, *noff, upper);
  ResetSplitLog(lg);
  ReleaseLog(&split_free_, li);
  return Status::OK();
}

// ---- leaf deletion (alg. 5/6/7) -------------------------------------------------------
// Empty, locked leaf loff: unlinked (the lock is released) or, if that is
// not possible now, left in place (and unlocked): the tree's last leaf
// stays; a contended deletion goes to the deferred queue. Returns the
// delete log to finish after the grace period (FinishLeafDeletion), or -1.
template <bool kConc, bool kBytes>
int FPTree<kConc, kBytes>::DeleteEmptyLeaf(uint64_t loff, const SKey& k, Retired* ret) {
  int r = TryDeleteLeaf(loff, k, ret);
  if (r >= 0) return r;
  if (r == kContended) Defer(loff, k);
  LeafUnlock(L(loff));
  return -1;
}

// Outside any epoch guard: the grace period before the unlinked leaf's
// memory and the removed inner nodes may be reused, then the frees.
template <bool kConc, bool kBytes>
void FPTree<kConc, kBytes>::FinishLeafDeletion(int pending, Retired* ret) {
  if (pending < 0) return;
  if (kConc) {
    if (auto* hook = g_leaf_unlinked_hook.load(std::memory_order_acquire)) hook(root_->del[pending].cur);
    epoch_.Synchronize();
  }
  FinishDeleteLog(&root_->del[pending]);
  ReleaseLog(&del_free_, pending);
  for (Inner* n : ret->nodes) FreeInner(n);
  for (uint64_t w : ret->keys) FreeKeyWord(w);
}

// Deferred leaf deletions (fptree: the left neighbour's lock was contended
// 64 times). Each entry names an empty leaf and a key of its range (ranges
// of an empty leaf only widen, so the key keeps leading to it while it is
// in the tree). Every Remove processes one entry; an entry whose leaf is no
// longer found by its key, or no longer empty, is dropped; a leaf is queued
// once, so the queue never holds more entries than there are empty leaves.
template <bool kConc, bool kBytes>
void FPTree<kConc, kBytes>::Defer(uint64_t loff, const SKey& k) {
  g_deferred_deletions.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> g(deferred_mu_);
  for (auto& d : deferred_)
    if (d.leaf == loff) {
      // Queued before with a key that may no longer lead here (the leaf
      // was refilled and split, or its offset reused): take the new key,
      // which routes to the leaf now.
      d.k = k;
      if constexpr (kBytes) d.ks.assign(k.s.data(), k.s.size());  // ProcessDeferred points k.s at it
      return;
    }
  Deferred d;
  d.leaf = loff;
  d.k = k;
  if constexpr (kBytes) d.ks.assign(k.s.data(), k.s.size());
  deferred_.push_back(std::move(d));
  deferred_n_.store(deferred_.size(), std::memory_order_relaxed);
}

template <bool kConc, bool kBytes>
void FPTree<kConc, kBytes>::ProcessDeferred() {
  if (kConc && PMINDEX_FAULT("fptree.delete.force_deferred")) return;  // test hook: queue frozen
  Deferred d;
  {
    std::lock_guard<std::mutex> g(deferred_mu_);
    if (deferred_.empty()) return;
    d = std::move(deferred_.front());
    deferred_.erase(deferred_.begin());
    deferred_n_.store(deferred_.size(), std::memory_order_relaxed);
  }
  if constexpr (kBytes) d.k.s = d.ks;
  int pending = -1;
  Retired ret;
  {
    EpochGuard g(epoch_, kConc);
    uint64_t lv = 0;
    uint64_t loff = FindLeaf(d.k, &lv);
    char* l = L(loff);
    if (loff != d.leaf) return;  // deleted meanwhile
    if (!LeafTryLock(l, lv)) {
      Defer(loff, d.k);
      return;
    }
    if (Ld(Bm(l)) != 0) {
      LeafUnlock(l);  // refilled
      return;
    }
    pending = DeleteEmptyLeaf(loff, d.k, &ret);
  }
  FinishLeafDeletion(pending, &ret);
}

// Leaf loff (locked, empty) is unlinked from the inner nodes and the list
// (alg. 5/6). Returns the delete log index to finish after the grace period
// (the leaf is then marked obsolete and unlocked), or kKept (the tree's only
// leaf) / kContended (the left neighbour or an inner node stayed busy for 64
// tries); the leaf is then still locked by the caller.
// The DRAM part: the deepest inner node on the path with more than one
// child loses the entry of the subtree holding the leaf; the nodes of that
// subtree (single-child nodes above the leaf) are marked obsolete and
// retired; a root left with one child is replaced by that child.
template <bool kConc, bool kBytes>
int FPTree<kConc, kBytes>::TryDeleteLeaf(uint64_t loff, const SKey& k, Retired* ret) {
  constexpr int kMaxDepth = 64;
  char* l = L(loff);
  // Test hook (not a persistence fault): behave as if contended and freeze
  // the queue (ProcessDeferred), so that tests drive the deferred queue
  // deterministically on few cores.
  if (kConc && PMINDEX_FAULT("fptree.delete.force_deferred")) return kContended;
  // The path to the leaf, with the versions read.
  struct At {
    uint64_t loff;
    Inner* pn[kMaxDepth];
    uint64_t pv[kMaxDepth];
    uint32_t pi[kMaxDepth];
    int d = 0;
    Inner* left = nullptr;  // deepest node where the path goes right of child 0
    uint32_t left_idx = 0;
    void Record(Inner* n, uint64_t v, uint32_t i) {
      if (i > 0) {
        left = n;
        left_idx = i - 1;
      }
      pn[d] = n;
      pv[d] = v;
      pi[d] = i;
      d++;
    }
    Step Node(Inner*, uint64_t) { return Step::kGo; }
    Step Down(Inner* n, uint64_t v, uint32_t i, uint64_t) {
      Record(n, v, i);
      return d == kMaxDepth || !Olc::Validate(n, v) ? Step::kRetry : Step::kGo;
    }
    Step Bottom(Inner* n, uint64_t v, uint32_t i, uint64_t c) {
      Record(n, v, i);
      return c == loff && Olc::Validate(n, v) ? Step::kDone : Step::kRetry;
    }
  } at;
  at.loff = loff;
  for (int attempt = 0; attempt < 64; attempt++) {
    if (attempt) std::this_thread::yield();
    at.d = 0;
    at.left = nullptr;
    at.left_idx = 0;
    if (Descend(k, at) != Step::kDone) continue;
    Inner** pn = at.pn;
    const int d = at.d;
    int t = d - 1;
    while (t >= 0 && pn[t]->count.load(std::memory_order_relaxed) == 0) t--;
    if (t < 0) return kKept;  // the only leaf of the tree
    // Left neighbour: rightmost leaf of the left subtree (verified below).
    uint64_t prev = 0;
    if (at.left) {
      Inner* x = at.left;
      uint64_t c = x->child()[at.left_idx].load(std::memory_order_acquire);
      while (!x->bottom && c) {
        x = reinterpret_cast<Inner*>(c);
        uint32_t cnt = std::min(x->count.load(std::memory_order_relaxed), x->cap);
        c = x->child()[cnt].load(std::memory_order_acquire);
      }
      prev = c;  // verified under its lock: prev.next == loff
      if (!prev) continue;
    }
    char* p = prev ? L(prev) : nullptr;
    if (p) {
      if (prev == loff) continue;
      if (!LeafTryLock(p, LeafVersion(p))) continue;
      if (Ld(Next(p)) != loff) {
        LeafUnlock(p);
        continue;
      }
    } else if (__atomic_load_n(&root_->head, __ATOMIC_ACQUIRE) != loff) {
      continue;
    }
    // Lock pn[t..d-1] top-down against the versions read (OLC upgrades
    // never wait, so no lock order issue with the leaf locks held).
    int locked = t;
    while (locked < d && Olc::Upgrade(pn[locked], at.pv[locked])) locked++;
    if (locked < d) {
      for (int x = t; x < locked; x++) Olc::WriteUnlock(pn[x]);
      if (p) LeafUnlock(p);
      continue;
    }
    // Persistent unlink (alg. 6 lines 3-13). The log is taken with one try:
    // logs are released only after a grace period (FinishLeafDeletion),
    // which waits for this thread's epoch guard, so waiting for one here,
    // inside the guard and holding locks, could deadlock once every log is
    // pending (65+ deleting threads).
    int li = TryAcquireLog(&del_free_);
    if (li < 0) {
      for (int x = t; x < d; x++) Olc::WriteUnlock(pn[x]);
      if (p) LeafUnlock(p);
      continue;
    }
    LogUnlink(&root_->del[li], prev, loff);
    // The unlink is durable: the log must stop naming prev before prev is
    // unlocked, or prev could be deleted, freed and reused while the log
    // still sends recovery's RedoUnlink to it. With prev = 0 recovery
    // checks the root's head instead, which never names cur again.
    if (prev && !PMINDEX_FAULT("fptree.delete.keep_log_prev")) pm::StorePersist(&root_->del[li].prev, uint64_t(0));
    // DRAM unlink.
    uint64_t kw = RemoveAt(pn[t], at.pi[t]);
    if constexpr (kBytes) ret->keys.push_back(kw);
    for (int x = t + 1; x < d; x++) {
      Olc::ObsoleteUnlock(pn[x]);
      ret->nodes.push_back(pn[x]);
    }
    if (t == 0) CollapseRoot(pn[0], ret);
    else Olc::WriteUnlock(pn[t]);
    LeafUnlock(l, /*obsolete=*/true);
    if (p) LeafUnlock(p);
    return li;
  }
  return kContended;
}

// r is the root, write-locked. While it is an inner node with a single
// child, the child becomes the root (r is retired). Unlocks the final root.
// Waiting for the child's lock while holding r cannot deadlock: whoever
// holds a child's lock never waits for its parent (upgrades are top-down
// and never block) nor for a leaf lock.
template <bool kConc, bool kBytes>
void FPTree<kConc, kBytes>::CollapseRoot(Inner* r, Retired* ret) {
  while (!r->bottom && r->count.load(std::memory_order_relaxed) == 0) {
    auto* c = reinterpret_cast<Inner*>(r->child()[0].load(std::memory_order_acquire));
    bool locked = false;
    Backoff bo;
    for (;;) {
      uint64_t cv = kConc ? c->version.Load() : 0;
      if (cv & kit::VersionLock::kObsolete) break;  // cannot happen: only r could have removed c
      if (!(cv & kit::VersionLock::kLocked) && Olc::Upgrade(c, cv)) {
        locked = true;
        break;
      }
      bo.Wait();
    }
    if (!locked) break;
    root_inner_.store(c, std::memory_order_release);
    Olc::ObsoleteUnlock(r);
    ret->nodes.push_back(r);
    r = c;
  }
  Olc::WriteUnlock(r);
}

// The leaf unlink (alg. 6 lines 3-13), also used by recovery to drop empty
// leaves: log {prev, cur} (prev first, same line), persisted, then the word
// that points to cur is pointed past it.
template <bool kConc, bool kBytes>
void FPTree<kConc, kBytes>::LogUnlink(DeleteLog* lg, uint64_t prev, uint64_t cur) {
  pm::Store(&lg->prev, prev);
  pm::Store(&lg->cur, cur);
  pm::Persist(lg, 16);
  RedoUnlink(prev, cur);
}

// prev's next pointer (the root's head if prev is 0) = cur's next, persisted,
// if it still points to cur (alg. 7: idempotent, so recovery redoes it).
template <bool kConc, bool kBytes>
void FPTree<kConc, kBytes>::RedoUnlink(uint64_t prev, uint64_t cur) {
  uint64_t* w = prev ? Next(L(prev)) : &root_->head;
  if (Ld(w) == cur) pm::StorePersist(w, Ld(Next(L(cur))));
}

// Alg. 6 lines 14-15 / alg. 7 tail: free (or return to its group) the
// unlinked leaf and reset the log.
template <bool kConc, bool kBytes>
void FPTree<kConc, kBytes>::FinishDeleteLog(DeleteLog* lg) {
  if (lg->cur) {
    if (groups_) {
      uint64_t leaf = lg->cur;
      pm::Store(&lg->cur, uint64_t(0));
      pm::Persist(&lg->cur, 8);
      FreeLeaf(leaf);
    } else {
      pool_->allocator().FreeOrAbort(&lg->cur);
    }
  }
  pm::Store(&lg->prev, uint64_t(0));
  pm::Persist(lg, 16);
}

#define FPT_INSTANTIATE(C, B)                                                        \
  template Inner* FPTree<C, B>::NewInner(bool);                                      \
  template void FPTree<C, B>::FreeInner(Inner*);                                     \
  template uint64_t FPTree<C, B>::KeyWordForInner(const SKey&);                      \
  template void FPTree<C, B>::FreeKeyWord(uint64_t);                                 \
  template void FPTree<C, B>::InsertSeparator(const SKey&, uint64_t, uint64_t);      \
  template void FPTree<C, B>::SplitInner(Inner*, Inner*);                            \
  template int FPTree<C, B>::AcquireLog(std::atomic<uint64_t>*);                     \
  template int FPTree<C, B>::TryAcquireLog(std::atomic<uint64_t>*);                  \
  template void FPTree<C, B>::ReleaseLog(std::atomic<uint64_t>*, int);               \
  template bool FPTree<C, B>::ChooseSplit(char*, uint64_t*, Rec*);                   \
  template void FPTree<C, B>::SplitCopy(char*, char*, uint64_t);                     \
  template void FPTree<C, B>::SplitFinish(char*, uint64_t, uint64_t);                \
  template void FPTree<C, B>::ResetSplitLog(SplitLog*);                              \
  template Status FPTree<C, B>::SplitLeaf(uint64_t, uint64_t*, Rec*);                \
  template int FPTree<C, B>::DeleteEmptyLeaf(uint64_t, const SKey&, Retired*);       \
  template void FPTree<C, B>::FinishLeafDeletion(int, Retired*);                     \
  template void FPTree<C, B>::Defer(uint64_t, const SKey&);                          \
  template void FPTree<C, B>::ProcessDeferred();                                     \
  template int FPTree<C, B>::TryDeleteLeaf(uint64_t, const SKey&, Retired*);         \
  template void FPTree<C, B>::CollapseRoot(Inner*, Retired*);                        \
  template void FPTree<C, B>::LogUnlink(DeleteLog*, uint64_t, uint64_t);             \
  template void FPTree<C, B>::RedoUnlink(uint64_t, uint64_t);                        \
  template void FPTree<C, B>::FinishDeleteLog(DeleteLog*);
FPT_INSTANTIATE_ALL(FPT_INSTANTIATE)
#undef FPT_INSTANTIATE

}  // namespace pmindex::internal::fptree
