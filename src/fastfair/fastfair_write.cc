// fastfair_write.cc: the leaf writes of the FAST & FAIR tree: Insert,
// Update, Upsert, Remove, and LockAt, the write-locked descent they share
// (paper sec. 3.3-3.5 for the in-node changes, sec. 5 for the locking).
//
// A writer descends lock-free (Descend, fastfair_tree.h), write-locks the
// leaf, moves right under its lock while key >= high (B-link, remembering
// the siblings whose parent insert may be pending: Pending), repairs the
// node if it was not repaired since the open (Prepare), and changes it
// with one FAST shift (NodeOps, fastfair_node.h). A full leaf is split
// first (fastfair_smo.cc); an underfull one is merged after its lock is
// released.
//
// Persist order (block ownership: no leak at any crash). Insert with byte
// keys or values: the key/value blocks are allocated into the leaf's
// spare_a / spare_b (the allocator's commit store), the record is
// inserted (its key store is the commit), then both spares are cleared in
// one persisted line. Update of a byte value: new block into spare_a, old
// value parked in spare_b (persisted), v = new block (commit, persisted),
// old block freed, spare_a cleared. Remove: blocks parked in the spares
// (persisted), the delete shift (its first key store commits), blocks
// freed. A crash leaves at most the spares, which the repair frees when
// no record references them and clears otherwise.
//
// Thread safety: any number of writers and readers concurrently; each
// public operation runs in an epoch guard.
#include "fastfair/fastfair_tree.h"

namespace pmindex::internal::fastfair {

template <bool BK>
Status FastFair<BK>::Insert(Slice key, Slice value) {
  return Put(key, value, kInsert);
}
template <bool BK>
Status FastFair<BK>::Update(Slice key, Slice value) {
  return Put(key, value, kUpdate);
}
template <bool BK>
Status FastFair<BK>::Upsert(Slice key, Slice value) {
  return Put(key, value, kUpsert);
}

// Write-locks the node of `level` covering key, repairing it if needed.
// grow=false: *out = nullptr if the tree is not that high.
template <bool BK>
Status FastFair<BK>::LockAt(uint32_t level, const SK& key, Pending* pend, Node** out, bool grow) {
  for (kit::BoundedWalk restarts = Walk();;) {
    Node* n = Descend(level, key, pend);
    if (__builtin_expect(n == Bad(), 0)) return CorruptWalk("descent");
    if (!n) {
      if (!grow) {
        *out = nullptr;
        return Status::OK();
      }
      PMINDEX_RETURN_IF_ERROR(GrowRoot(level));
      continue;
    }
    WLock(n);
    for (kit::BoundedWalk steps = Walk();;) {
      // A node merged away while we waited (or reached through a stale
      // link): restart from the root (epochs keep its memory valid).
      if (Ld(&n->dead)) {
        WUnlock(n);
        if (!Step(restarts)) return CorruptWalk("restarts on dead nodes");
        n = nullptr;
        break;
      }
      Prepare(n, pend);
      uint64_t s = n->sibling;
      if (s && Cmp(n->high, key) <= 0) {
        if (!Step(steps)) {
          WUnlock(n);
          return CorruptWalk("move right");
        }
        pend->Add(level, s);
        WUnlock(n);
        n = At(s);
        WLock(n);
        continue;
      }
      *out = n;
      return Status::OK();
    }
  }
}

template <bool BK>
Status FastFair<BK>::Put(Slice key, Slice value, Mode mode) {
  PMINDEX_RETURN_IF_ERROR(Writable());
  PMINDEX_RETURN_IF_ERROR(ValidateKey(key_kind(), opts_.max_key_size, key));
  PMINDEX_RETURN_IF_ERROR(ValidateValue(vk_, opts_.max_value_size, value));
  EpochGuard eg(epoch_);
  const SK sk = MakeSK(key);
  Pending pend;
  Node* n = nullptr;
  PMINDEX_RETURN_IF_ERROR(LockAt(0, sk, &pend, &n));
  uint32_t pos;
  Status st;
  Node* S2 = nullptr;
  uint64_t K2 = 0;
  if (FindInLocked(n, sk, &pos)) {
    st = mode == kInsert ? Status::AlreadyExists() : UpdateAt(n, pos, value);
  } else if (mode == kUpdate) {
    st = Status::NotFound();
  } else {
    Node* t = n;
    if (Full(n, pos)) {
      st = Split(n, &K2, &S2, /*append=*/pos == n->count);
      if (st.ok()) {
        if (Cmp(K2, sk) <= 0) t = S2;
        FindInLocked(t, sk, &pos);
      }
    }
    if (st.ok()) {
      st = InsertLeafEntry(t, pos, sk, value);  // S2 is locked (see Split)
      UnlockNew(n, S2);
    }
  }
  WUnlock(n);
  // The record is durable; a failed parent insert (pool full) leaves a
  // correct B-link tree that a later writer completes.
  if (S2) (void)InsertInternal(1, K2, Off(S2));
  EnsurePending(pend);
  return st;
}

// ---- leaf writes -------------------------------------------------------
template <bool BK>
Status FastFair<BK>::InsertLeafEntry(Node* t, uint32_t pos, const SK& key, Slice value) {
  uint64_t kw, vw;
  if constexpr (BK) {
    PMINDEX_RETURN_IF_ERROR(AllocBlock(&t->spare_a, key));
    kw = Ld(&t->spare_a);
  } else {
    kw = key;
  }
  if (bv_) {
    Status st = AllocBlock(&t->spare_b, value);
    if (!st.ok()) {
      if (BK) alloc_->Free(&t->spare_a);
      return st;
    }
    vw = Ld(&t->spare_b);
  } else {
    vw = SliceToU64(value);
  }
  if (!BK && kw == t->lk) {
    pos -= Start(t);  // FixLk drops t's lk prefix
    FixLk(t, kw);
  }
  InsertAt(t, pos, kw, vw);
  if (BK || bv_) {
    // The record owns the blocks now.
    St(&t->spare_a, uint64_t(0));
    St(&t->spare_b, uint64_t(0));
    pm::Persist(&t->spare_a, 16);
  }
  return Status::OK();
}

template <bool BK>
Status FastFair<BK>::AllocBlock(uint64_t* dest, Slice s) {
  PMINDEX_RETURN_IF_ERROR(alloc_->Allocate(dest, 4 + s.size()));
  char* p = base_ + Ld(dest);
  pm::Store(reinterpret_cast<uint32_t*>(p), uint32_t(s.size()));
  if (!s.empty()) pm::Copy(p + 4, s.data(), s.size());
  pm::Persist(p, 4 + s.size());
  return Status::OK();
}

template <bool BK>
Status FastFair<BK>::UpdateAt(Node* n, uint32_t pos, Slice value) {
  Entry* e = n->ents();
  if (!bv_) {
    St(&e[pos].v, SliceToU64(value));
    AfterCommit(n);
    pm::Persist(&e[pos], sizeof(Entry));
    return Status::OK();
  }
  PMINDEX_RETURN_IF_ERROR(AllocBlock(&n->spare_a, value));
  St(&n->spare_b, e[pos].v);
  pm::Persist(&n->spare_b, 8);
  St(&e[pos].v, Ld(&n->spare_a));  // commit
  AfterCommit(n);
  pm::Persist(&e[pos], sizeof(Entry));
  alloc_->Free(&n->spare_b);
  St(&n->spare_a, uint64_t(0));
  pm::Persist(&n->spare_a, 8);  // (its fence also orders the lane clear)
  return Status::OK();
}

template <bool BK>
Status FastFair<BK>::Remove(Slice key) {
  PMINDEX_RETURN_IF_ERROR(Writable());
  PMINDEX_RETURN_IF_ERROR(ValidateKey(key_kind(), opts_.max_key_size, key));
  Status st;
  {
    EpochGuard eg(epoch_);
    st = RemoveIn(MakeSK(key));
  }
  // Outside the guard, so that this thread's own retired nodes can go; only
  // when a reclaim is due (Reclaim takes the retire list's mutex): the last
  // one left nothing waiting (reclaim_at_ 0: what waits now is new and
  // needs its stamp), or every guard that could see the waiting nodes has
  // ended. Nodes retired while others wait are stamped with them (or by the
  // next merge's ClaimSlot).
  if (limbo_->has_retired()) {
    const uint64_t at = reclaim_at_.load(std::memory_order_relaxed);
    if (at == 0 || epoch_.MinAnnounced() >= at) Reclaim(false);
  }
  return st;
}

template <bool BK>
Status FastFair<BK>::RemoveIn(const SK& sk) {
  Pending pend;
  Node* n = nullptr;
  PMINDEX_RETURN_IF_ERROR(LockAt(0, sk, &pend, &n));
  uint32_t pos;
  Status st;
  if (!FindInLocked(n, sk, &pos)) {
    st = Status::NotFound();
  } else {
    Entry* e = n->ents();
    if (BK || bv_) {
      // Park the blocks in the spare words first: after the commit no
      // record owns them, the spares do until they are freed.
      if (BK) St(&n->spare_a, e[pos].k);
      if (bv_) St(&n->spare_b, e[pos].v);
      pm::Persist(&n->spare_a, 16);
    }
    DeleteAt(n, pos, true);
    if (BK) alloc_->Free(&n->spare_a);
    if (bv_) alloc_->Free(&n->spare_b);
    if (BK || bv_) pm::Fence();  // orders the allocator's flushed lane clear
  }
  // Merge trigger: a non-root node that fell below kMergeBelow of its
  // capacity (docs/fastfair.md, Merges).
  const bool underfull = st.ok() && Underfull(n) && Off(n) != Ld(&meta_->root);
  WUnlock(n);
  EnsurePending(pend);
  if (underfull) {
    for (Node* x = n; x;) x = MergeStep(x);
  }
  return st;
}
#define PMINDEX_FASTFAIR_WRITE(BK)                                                                  \
  template Status FastFair<BK>::Insert(Slice, Slice);                                               \
  template Status FastFair<BK>::Update(Slice, Slice);                                               \
  template Status FastFair<BK>::Upsert(Slice, Slice);                                               \
  template Status FastFair<BK>::Remove(Slice);                                                      \
  template Status FastFair<BK>::LockAt(uint32_t, const SK&, Pending*, Node**, bool);                \
  template Status FastFair<BK>::Put(Slice, Slice, Mode);                                            \
  template Status FastFair<BK>::AllocBlock(uint64_t*, Slice);
PMINDEX_FASTFAIR_WRITE(false)
PMINDEX_FASTFAIR_WRITE(true)
#undef PMINDEX_FASTFAIR_WRITE

}  // namespace pmindex::internal::fastfair
