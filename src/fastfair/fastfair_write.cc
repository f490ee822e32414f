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
// one persisted line. Update of a byte value: new block into spare_a, the
// old block owned by a block retire slot (persisted), v = new block
// (commit, persisted), the slot's tag cleared (persisted), spare_a
// cleared (persisted). Remove: the key and value blocks owned by retire
// slots (persisted), the delete shift (its first key store commits), the
// slots' tags cleared (persisted). The old blocks are freed after an
// epoch grace period (fastfair_retire.cc: lock-free readers may still
// read them). A crash leaves at most the spares, which the repair frees
// when no record references them and clears otherwise, and retire slots,
// which the open settles (fastfair_retire.cc).
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
  // An update of a byte value retires the old block: its slot is claimed
  // before the guard (a claim may wait for a grace period).
  BlockClaims bc;
  if (bv_ && mode != kInsert) PMINDEX_RETURN_IF_ERROR(ClaimBlocks(1, &bc));
  Status st = PutIn(key, value, mode, &bc);
  if (bv_ && mode != kInsert) EndBlocks(&bc);
  return st;
}

template <bool BK>
Status FastFair<BK>::PutIn(Slice key, Slice value, Mode mode, BlockClaims* bc) {
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
    st = mode == kInsert ? Status::AlreadyExists() : UpdateAt(n, pos, value, bc);
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
      if (BK) alloc_->FreeOrAbort(&t->spare_a);
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
Status FastFair<BK>::UpdateAt(Node* n, uint32_t pos, Slice value, BlockClaims* bc) {
  Entry* e = n->ents();
  if (!bv_) {
    St(&e[pos].v, SliceToU64(value));
    AfterCommit(n);
    pm::Persist(&e[pos], sizeof(Entry));
    return Status::OK();
  }
  PMINDEX_RETURN_IF_ERROR(AllocBlock(&n->spare_a, value));
  // The old block: owned by a retire slot before the commit unlinks it,
  // freed after the grace period (fastfair_retire.cc).
  const bool late = PMINDEX_FAULT("fastfair.retire.own_after_commit");
  const bool early = PMINDEX_FAULT("fastfair.retire.unlinked_before_commit");
  if (!late) OwnBlock(bc, e[pos].v, n);
  if (early) BlocksUnlinked(bc);
  const uint64_t old = e[pos].v;
  St(&e[pos].v, Ld(&n->spare_a));  // commit
  AfterCommit(n);
  pm::Persist(&e[pos], sizeof(Entry));
  if (late) OwnBlock(bc, old, n);
  if (!early) BlocksUnlinked(bc);
  St(&n->spare_a, uint64_t(0));
  pm::Persist(&n->spare_a, 8);
  return Status::OK();
}

template <bool BK>
Status FastFair<BK>::Remove(Slice key) {
  PMINDEX_RETURN_IF_ERROR(Writable());
  PMINDEX_RETURN_IF_ERROR(ValidateKey(key_kind(), opts_.max_key_size, key));
  // The record's key and value blocks are retired: their slots are claimed
  // before the guard (a claim may wait for a grace period).
  BlockClaims bc;
  const int nb = int(BK) + int(bv_);
  if (nb) PMINDEX_RETURN_IF_ERROR(ClaimBlocks(nb, &bc));
  Status st;
  {
    EpochGuard eg(epoch_);
    st = RemoveIn(MakeSK(key), &bc);
  }
  if (nb) EndBlocks(&bc);
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
Status FastFair<BK>::RemoveIn(const SK& sk, BlockClaims* bc) {
  Pending pend;
  Node* n = nullptr;
  PMINDEX_RETURN_IF_ERROR(LockAt(0, sk, &pend, &n));
  uint32_t pos;
  Status st;
  if (!FindInLocked(n, sk, &pos)) {
    st = Status::NotFound();
  } else {
    Entry* e = n->ents();
    // The blocks: owned by retire slots before the commit unlinks them,
    // freed after the grace period (fastfair_retire.cc).
    const uint64_t kb = e[pos].k, vb = e[pos].v;
    const bool late = (BK || bv_) && PMINDEX_FAULT("fastfair.retire.own_after_commit");
    const bool early = (BK || bv_) && PMINDEX_FAULT("fastfair.retire.unlinked_before_commit");
    auto own = [&] {
      if (BK) OwnBlock(bc, kb, n);
      if (bv_) OwnBlock(bc, vb, n);
    };
    if ((BK || bv_) && !late) own();
    if (early) BlocksUnlinked(bc);
    DeleteAt(n, pos, true);
    if (late) own();
    if ((BK || bv_) && !early) BlocksUnlinked(bc);
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
