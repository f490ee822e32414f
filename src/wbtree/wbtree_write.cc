// wbtree_write.cc: wBTree's writers inside one leaf (PiBench sec. 3.1, table
// 2; docs/wbtree.md, "Persist order"): insert, update, upsert and delete,
// each committed by one 8-byte store (the bitmap, or the value word).
//
// Persist order (the node locked throughout, unlocked after the last fence):
//  insert: [byte keys/values: the blocks allocated into the node's spare
//          words and flushed] entry {k, v} stored and flushed; the new slot
//          array stored (word 0, the count, first) and flushed; fence; the
//          bitmap with the new bit (then spares cleared, same line) stored,
//          flushed, fenced. 3 lines, 2 fences (the paper's 4 flushes less
//          the validity-bit store, wbtree_format.h).
//  update: u64 values: the value word stored in place, flushed, fenced (1
//          line). Byte values: new block into spare_a; spare_b = the old
//          block; line 0 flushed, fence; the value word swapped, flushed,
//          fence; spare_a cleared and the old block freed through spare_b.
//  delete: [byte keys/values: spare_a/b = the entry's blocks] the new slot
//          array stored but not flushed (recovery repairs a slot array that
//          is not consistent with the bitmap); the bitmap without the bit
//          stored, line 0 flushed, fenced (1 line); then the blocks freed
//          through the spares.
//  wbtree_slot (no bitmap, the slot word commits): insert: entry flushed,
//          fence, slot word stored, flushed, fence (2 lines); delete:
//          [spares persisted] slot word stored, flushed, fence (1 line).
// Fault switches (tools/pmcheck/ci.sh): wbtree.insert.skip_entry_flush,
// wbtree.insert.skip_slots_flush, wbtree.update.skip_flush,
// wbtree.remove.skip_flush.
//
// Thread safety: any thread; each operation locks the one leaf it changes
// (kit/version_lock.h upgrade of the version its descent validated) and
// waits for no other lock while holding it. A full leaf is split under the
// structure lock first (wbtree_smo.cc), then the operation retries.
#include "kit/pm_block.h"
#include "pmindex/pm/fault.h"
#include "wbtree/wbtree_tree.h"

namespace pmindex::internal::wbtree {

template <bool BK>
void WBTree<BK>::LockNode(Node* n) {
  kit::Backoff bo;
  for (;;) {
    const uint64_t v = LW(n).lock.Load();
    if (!kit::VersionLock::Busy(v) && LW(n).lock.TryLock(v)) return;
    bo.Wait();
  }
}

template <bool BK>
Status WBTree<BK>::InsertEntry(Node* n, const Slots& s, uint32_t pos, Slice key, uint64_t child, Slice value,
                               uint64_t) {
  const bool leaf = LdR(&n->level) == 0;
  const uint32_t cap = CapOf(leaf ? 0 : 1);
  const uint64_t bm = Valid(n);
  const uint64_t free_bits = ~bm & CapMask(cap);
  if (!free_bits || s.count() >= cap) return Status::Corrupt("wbtree node at " + std::to_string(Off(n)) + " is full");
  const uint32_t x = __builtin_ctzll(free_bits);
  Entry* e = &n->ents()[x];
  uint64_t kw, vw;
  bool spares = false;
  if constexpr (BK) {
    PMINDEX_RETURN_IF_ERROR(kit::WriteBlock(*alloc_, base_, &n->spare_a, key));
    kw = n->spare_a;
    spares = true;
  } else {
    kw = SliceToU64(key);
  }
  if (leaf && vbytes()) {
    Status st = kit::WriteBlock(*alloc_, base_, &n->spare_b, value);
    if (!st.ok()) {
      if (BK) alloc_->FreeOrAbort(&n->spare_a);
      return st;
    }
    vw = n->spare_b;
    spares = true;
  } else {
    vw = leaf ? SliceToU64(value) : child;
  }
  St(&e->k, kw);
  St(&e->v, vw);
  if (!PMINDEX_FAULT("wbtree.insert.skip_entry_flush")) pm::Flush(e, sizeof(Entry));
  if (slot_only_) {
    // The slot word is the commit: the entry first.
    pm::Fence();
    StoreSlots(n, WithInserted(s, pos, uint8_t(x)), s, !PMINDEX_FAULT("wbtree.insert.skip_slots_flush"));
    pm::Fence();
    if (spares) {
      St(&n->spare_a, uint64_t(0));
      St(&n->spare_b, uint64_t(0));
      pm::Persist(n, 64);
    }
    return Status::OK();
  }
  StoreSlots(n, WithInserted(s, pos, uint8_t(x)), s, !PMINDEX_FAULT("wbtree.insert.skip_slots_flush"));
  pm::Fence();
  St(&n->bitmap, uint64_t(bm | (1ull << x)));
  if (spares) {
    St(&n->spare_a, uint64_t(0));
    St(&n->spare_b, uint64_t(0));
  }
  pm::Persist(n, 64);
  return Status::OK();
}

template <bool BK>
void WBTree<BK>::RemoveEntry(Node* n, const Slots& s, uint32_t pos) {
  const bool leaf = LdR(&n->level) == 0;
  const uint32_t x = s.at(pos + 1);
  Entry* e = &n->ents()[x];
  const bool own_v = leaf && vbytes();
  if (BK) St(&n->spare_a, LdR(&e->k));
  if (own_v) St(&n->spare_b, LdR(&e->v));
  if (slot_only_) {
    // The spares durable, then the slot word commits.
    if (BK || own_v) pm::Persist(n, 64);
    StoreSlots(n, WithRemoved(s, pos), s, !PMINDEX_FAULT("wbtree.remove.skip_flush"));
    pm::Fence();
    if (BK) alloc_->FreeOrAbort(&n->spare_a);
    if (own_v) alloc_->FreeOrAbort(&n->spare_b);
    return;
  }
  StoreSlots(n, WithRemoved(s, pos), s, /*flush=*/false, /*vol=*/true);
  St(&n->bitmap, uint64_t(LdR(&n->bitmap) & ~(1ull << x)));
  if (!PMINDEX_FAULT("wbtree.remove.skip_flush")) pm::Flush(n, 64);
  pm::Fence();
  if (BK) alloc_->FreeOrAbort(&n->spare_a);
  if (own_v) alloc_->FreeOrAbort(&n->spare_b);
}

template <bool BK>
Status WBTree<BK>::UpdateValue(Node* n, Entry* e, Slice value) {
  if (!vbytes()) {
    St(&e->v, SliceToU64(value));
    if (!PMINDEX_FAULT("wbtree.update.skip_flush")) pm::Flush(&e->v, 8);
    pm::Fence();
    return Status::OK();
  }
  PMINDEX_RETURN_IF_ERROR(kit::WriteBlock(*alloc_, base_, &n->spare_a, value));
  St(&n->spare_b, LdR(&e->v));
  pm::Persist(n, 64);
  St(&e->v, n->spare_a);
  if (!PMINDEX_FAULT("wbtree.update.skip_flush")) pm::Flush(&e->v, 8);
  pm::Fence();
  St(&n->spare_a, uint64_t(0));
  alloc_->FreeOrAbort(&n->spare_b);  // persists spare_b = 0, and spare_a = 0 before it (same line)
  return Status::OK();
}

template <bool BK>
Status WBTree<BK>::LockLeafFor(Slice key, Node** leaf, Slots* s, uint32_t* pos, bool* eq) {
  const KeyCtx c = Ctx();
  kit::Backoff bo;
  for (;;) {
    uint64_t v;
    PMINDEX_RETURN_IF_ERROR(DescendToLeaf(key, leaf, &v));
    if (LW(*leaf).lock.Upgrade(v)) break;
    bo.Wait();
  }
  LoadSlots(*leaf, s);
  if (LowerBound<BK>(c, *leaf, *s, leaf_cap_, key, pos, eq)) return Status::OK();
  UnlockNode(*leaf);
  return Status::Corrupt("wbtree leaf at " + std::to_string(Off(*leaf)) + " has a bad slot array or key block");
}

template <bool BK>
Status WBTree<BK>::Write(Slice key, Slice value, Mode mode) {
  if (closed()) return IndexClosed();
  PMINDEX_RETURN_IF_ERROR(ValidateKey(key_kind(), max_key_, key));
  PMINDEX_RETURN_IF_ERROR(ValidateValue(vk_, max_value_, value));
  for (;;) {
    {
      EpochManager::Guard g(epoch_);
      Node* l;
      Slots s;
      uint32_t pos;
      bool eq;
      PMINDEX_RETURN_IF_ERROR(LockLeafFor(key, &l, &s, &pos, &eq));
      Status st;
      if (eq) {
        st = mode == kInsert ? Status::AlreadyExists() : UpdateValue(l, &l->ents()[s.at(pos + 1)], value);
      } else if (mode == kUpdate) {
        st = Status::NotFound();
      } else if (s.count() < leaf_cap_) {
        st = InsertEntry(l, s, pos, key, 0, value, 0);
      } else {
        UnlockNode(l);
        goto split;  // outside the guard: SplitForKey takes smo_mu_
      }
      UnlockNode(l);
      return st;
    }
  split:
    PMINDEX_RETURN_IF_ERROR(SplitForKey(key));
  }
}

template <bool BK>
Status WBTree<BK>::Remove(Slice key) {
  if (closed()) return IndexClosed();
  PMINDEX_RETURN_IF_ERROR(ValidateKey(key_kind(), max_key_, key));
  Status st = Status::NotFound();
  bool emptied = false;
  {
    EpochManager::Guard g(epoch_);
    Node* l;
    Slots s;
    uint32_t pos;
    bool eq;
    PMINDEX_RETURN_IF_ERROR(LockLeafFor(key, &l, &s, &pos, &eq));
    if (eq) {
      RemoveEntry(l, s, pos);
      st = Status::OK();
      emptied = s.count() == 1;
    }
    UnlockNode(l);
  }
  if (emptied) {
    Status fs = FreeEmptyLeaf(key);  // the delete itself is durable already
    if (fs.IsCorrupt()) return fs;
  }
  return st;
}

#define PMINDEX_WBTREE_WRITE(BK)                                                                         \
  template void WBTree<BK>::LockNode(Node*);                                                             \
  template Status WBTree<BK>::InsertEntry(Node*, const Slots&, uint32_t, Slice, uint64_t, Slice, uint64_t); \
  template void WBTree<BK>::RemoveEntry(Node*, const Slots&, uint32_t);                                  \
  template Status WBTree<BK>::UpdateValue(Node*, Entry*, Slice);                                         \
  template Status WBTree<BK>::LockLeafFor(Slice, Node**, Slots*, uint32_t*, bool*);                   \
  template Status WBTree<BK>::Write(Slice, Slice, Mode);                                                 \
  template Status WBTree<BK>::Remove(Slice);
PMINDEX_WBTREE_WRITE(false)
PMINDEX_WBTREE_WRITE(true)

}  // namespace pmindex::internal::wbtree
