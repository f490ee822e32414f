// fastfair_recovery.cc: creation, open and lazy repair of the FAST & FAIR
// tree (paper sec. 5.2, "instantaneous recovery").
//
// Create: Meta and the root leaf are allocated zeroed into the pool's root
// slot and Meta::root; kinds, node size, version and gen are stored and
// persisted, then the magic (persisted last: a pool without it is a
// creation that did not finish).
//
// Open (read-write) does constant work and touches no node: it bumps
// Meta::gen (persisted; a version-4 pool's version becomes 5 in the same
// line), settles the retire slots (an uncommitted merge is undone, an
// unlinked node freed: kit::PmRetireList::Recover; the block retire slots:
// fastfair_retire.cc) and the one spare root word (a root that was published is kept, else freed). Every
// node whose gen differs from Meta::gen is repaired by the first writer
// that locks it (Repair): the record a shift was moving past a lagging
// durable count is counted, a linked split is finished (its cut) and an
// unlinked one's sibling freed, ignored records are compacted (not a
// leaf's lk prefix), I2 is re-made, spare blocks are freed when no record
// references them and cleared otherwise; then gen, then sw += 2 (one line,
// persisted). A writer that moved right to a sibling makes sure it is in
// its parent (Pending, idempotent parent insert).
//
// Open read-only writes nothing: every node may lag, and the merges whose
// commit did not persist are remembered (ro_undo_) so that readers apply
// the fence the read-write open would restore (EffectiveHigh).
//
// Thread safety: Format and Recover run before the tree is shared; Repair
// runs under the node's write lock; readers tolerate unrepaired nodes.
#include "fastfair/fastfair_tree.h"

namespace pmindex::internal::fastfair {

template <bool BK>
Status FastFair<BK>::Format() {
  PMINDEX_RETURN_IF_ERROR(locks_.Map(base_, pool_->max_size(), node_size_));
  uint64_t* slot = pool_->root_slot();
  PMINDEX_RETURN_IF_ERROR(alloc_->AllocateZeroed(slot, sizeof(Meta)));
  meta_ = pool_->At<Meta>(*slot);
  limbo_.emplace(base_, alloc_, &meta_->limbo, kLimboSlots);
  blocks_.emplace(base_, alloc_, &meta_->blocks, kBlockSlots);
  PMINDEX_RETURN_IF_ERROR(alloc_->AllocateZeroed(&meta_->root, node_size_));
  Node* r = At(meta_->root);
  if (BK) {
    St(&r->lk, kBytesLk);
    St(&r->ents()[0].k, kBytesLk);  // I2: slots 0 and 1 copy lk
    St(&r->ents()[1].k, kBytesLk);
    pm::Persist(&r->lk, 8);
    pm::Persist(&r->ents()[0], 2 * sizeof(Entry));
  }
  gen_ = 1;
  pm::Store(&meta_->version, kVersion);
  pm::Store(&meta_->key_kind, uint8_t(BK ? KeyKind::kBytes : KeyKind::kU64));
  pm::Store(&meta_->value_kind, uint8_t(vk_));
  pm::Store(&meta_->node_size, node_size_);
  pm::Store(&meta_->gen, gen_);
  // Root and metadata are durable before the magic, and the magic before
  // create returns (the anchored "not flushed at creation" pitfall).
  const bool skip = PMINDEX_FAULT("fastfair.create.skip_meta_flush");
  if (!skip) pm::Persist(meta_, sizeof(Meta));
  St(&meta_->magic, kMagic);
  if (!skip) pm::Persist(&meta_->magic, 8);
  // The block retire slots of a byte tree, after the magic (a crash before
  // it leaves a crashed creation of two blocks; one after it an open that
  // allocates them: RecoverBlocks).
  if (BK || bv_) {
    const int i = blocks_->Claim();
    if (i < 0) return Status::PoolFull("fastfair: no room for the block retire list");
    blocks_->Release(i);
  }
  return Status::OK();
}

template <bool BK>
Status FastFair<BK>::Recover(Meta* m) {
  PMINDEX_RETURN_IF_ERROR(locks_.Map(base_, pool_->max_size(), node_size_));
  meta_ = m;
  gen_ = m->gen;
  limbo_.emplace(base_, alloc_, &meta_->limbo, kLimboSlots);
  blocks_.emplace(base_, alloc_, &meta_->blocks, kBlockSlots);
  read_only_ = pool_->read_only();
  if (pool_->read_only()) {
    // Open writes nothing: remember the merges whose commit did not
    // persist (constant work), so that Check, Size and ForEachOwnedBlock
    // give l the fence and count the read-write open would restore.
    limbo_->ForEachUsed([&](const kit::RetireSlot& s) {
      if (s.tag != kRootMark && LimboLinked(s)) ro_undo_.push_back(s.tag);
    });
    return Status::OK();
  }
  // O(1): bump the generation, settle the one spare root word. Nodes are
  // repaired lazily by the writers that lock them.
  const pm::Counters c0 = pm::ThreadCounters();
  gen_ = m->gen + 1;
  St(&m->gen, gen_);
  if (m->version != kVersion) St(&m->version, kVersion);  // version 4: Meta::blocks is 0, an empty list
  pm::Persist(&m->gen, 8);  // (version shares gen's line)
  RecoverLimbo();
  RecoverBlocks();
  if (m->spare_root) {
    if (m->spare_root == m->root) {
      St(&m->spare_root, uint64_t(0));
      pm::Persist(&m->spare_root, 8);
    } else {
      PMINDEX_RETURN_IF_ERROR(alloc_->Free(&m->spare_root));
      open_blocks_freed_++;
    }
  }
  const pm::Counters d = pm::ThreadCounters() - c0;
  open_pm_stores_ = d.stores;
  open_pm_lines_ = d.lines_flushed;
  return Status::OK();
}

// Open: settles every used retire slot (constant work): a merge whose
// commit did not persist is undone, an unlinked node freed.
template <bool BK>
void FastFair<BK>::RecoverLimbo() {
  open_blocks_freed_ += limbo_->Recover(
      [this](const kit::RetireSlot& s) { return LimboLinked(s); },
      [this](const kit::RetireSlot& s) {
        if (s.tag != kRootMark) UndoMerge(At(s.tag), At(s.block));
      },
      [this](const kit::RetireSlot& s) { FreeLimboExtra(s); });
}

// Byte keys: a leaf merged away still owns its low key block K (the
// separator: p's record and l's high referenced it until the commit,
// nothing does after it; internal readers may still be reading it, hence
// freed with r, after the grace period). r->low is the persistent word
// that owns K until K is freed (then 0): a crash between the two frees
// leaves r owning nothing else, and open frees r alone. An internal r's
// low is p's separator moved down into l (still referenced, not r's); a
// collapsed root is internal.
template <bool BK>
uint64_t FastFair<BK>::LimboKeyBlock(const kit::RetireSlot& s) const {
  if constexpr (BK) {
    Node* r = At(s.block);
    if (r->level == 0) return r->low;
  }
  (void)s;
  return 0;
}

template <bool BK>
void FastFair<BK>::FreeLimboExtra(const kit::RetireSlot& s) {
  if (LimboKeyBlock(s)) alloc_->FreeOrAbort(&At(s.block)->low);
}

// True if the slot's node is still in the tree (its unlink not durable).
template <bool BK>
bool FastFair<BK>::LimboLinked(const kit::RetireSlot& s) const {
  if (s.tag == kRootMark) return meta_->root == s.block;
  return s.tag && At(s.tag)->sibling == s.block;
}

// A merge of r into l that did not commit: l gets back its fence and
// count (records >= r's low key were appended past it); the parent's
// separator, if already deleted, comes back through the B-link repair.
template <bool BK>
void FastFair<BK>::UndoMerge(Node* l, Node* r) {
  const uint64_t K = r->low;
  const SK key = KeyOf(K);
  Entry* e = l->ents();
  // The effective count: the merge may have shifted l (DropPrefix, whose
  // count shares the shift's last fence) before it crashed, so l's
  // durable count may lag by the record that shift moved (Pushed; r's
  // appended records are >= high = K, never counted). With l->count the
  // SetTail below would overwrite that record (fastfair_prefix_repair_test,
  // MergeDroppingCrashMadePrefixCrashStates).
  const uint32_t cnt = CountOf(l);
  uint32_t cut = 0;
  // (Ignored slots, such as an lk prefix, hold no key: skipped.)
  while (cut < cnt && (Ignored(l, cut) || Cmp(e[cut].k, key) < 0)) cut++;
  St(&l->high, K);
  St(&l->count, cut);
  pm::Persist(l, pm::kCacheLine);
  SetTail(l);  // I2 (until then slot cut holds a record >= high: not Pushed)
}

// ---- lazy repair -------------------------------------------------------
template <bool BK>
bool FastFair<BK>::Referenced(Node* n, uint64_t b) const {
  if (n->sibling && (n->high == b || EffectiveHigh(n) == b)) return true;
  Entry* e = n->ents();
  const uint32_t c = CountOf(n);
  for (uint32_t j = 0; j < c; j++) {
    if (Ignored(n, j)) continue;
    if (BK && e[j].k == b) return true;
    if (bv_ && n->level == 0 && e[j].v == b) return true;
  }
  return false;
}

template <bool BK>
void FastFair<BK>::Repair(Node* n, Pending* pend) {
  nodes_repaired_++;
  // First the record an interrupted insert shift moved past a durable
  // count that had not caught up, or a delete shift left at the count
  // (see Pushed).
  if (Pushed(n, n->count)) {
    St(&n->count, n->count + 1);
    pm::Persist(&n->count, 4);
    counts_repaired_++;
  }
  Entry* e = n->ents();
  if (n->spare_node) {
    if (n->spare_node == n->sibling) {
      // The split was linked: finish the cut.
      Node* s = At(n->sibling);
      const uint64_t K = s->low;
      if (n->high != K) St(&n->high, K);
      uint32_t m = 0;
      while (m < n->count && (Ignored(n, m) || Cmp(e[m].k, KeyOf(K)) < 0)) m++;
      St(&n->count, m);
      St(&n->sw, n->sw + 2);
      St(&n->spare_node, uint64_t(0));
      pm::Persist(n, pm::kCacheLine);
      splits_repaired_++;
      pend->Add(n->level, n->sibling);
    } else {
      // Never linked: the half-built sibling is garbage.
      alloc_->FreeOrAbort(&n->spare_node);
      if (!n->sibling && n->high) {
        St(&n->high, uint64_t(0));
        pm::Persist(&n->high, 8);
      }
    }
  }
  // Ignored records are compacted, except a leaf's lk prefix (the leading
  // slots equal to lk: free room, see Start).
  uint32_t j0 = 0;
  if (n->level == 0)
    while (j0 < n->count && e[j0].k == n->lk) j0++;
  for (uint32_t j = j0; j < n->count;) {
    if (Ignored(n, j)) DeleteAt(n, j, false);  // persists count
    else j++;
  }
  SetTail(n);  // I2
  for (uint64_t* sp : {&n->spare_a, &n->spare_b}) {
    if (!*sp) continue;
    if (Referenced(n, *sp)) {
      St(sp, uint64_t(0));
      pm::Persist(sp, 8);
    } else {
      alloc_->FreeOrAbort(sp);
    }
  }
  // Durable so that the line is clean when the op returns (losing it
  // would only cause an idempotent second repair).
  St(&n->gen, gen_);
  // Then a new sw (the mode kept: +2), after gen: a lock-free reader
  // loads sw, then gen (MayLag); one that saw the old gen (it applies
  // Pushed) and finds sw unchanged at its validation saw none of the
  // stores after the gen store, i.e. no write to the live node (St is a
  // release store, the loads acquire). Without it such a reader could
  // apply the lag rule to the live node and count an append in flight
  // before its count store while a later reader (lag false) misses it:
  // not linearizable (only right after an open).
  // The same line as gen.
  St(&n->sw, n->sw + 2);
  pm::Persist(&n->gen, 8);
}
#define PMINDEX_FASTFAIR_RECOVERY(BK)                                                              \
  template Status FastFair<BK>::Format();                                                          \
  template Status FastFair<BK>::Recover(Meta*);                                                    \
  template void FastFair<BK>::RecoverLimbo();                                                      \
  template uint64_t FastFair<BK>::LimboKeyBlock(const kit::RetireSlot&) const;                     \
  template void FastFair<BK>::FreeLimboExtra(const kit::RetireSlot&);                              \
  template bool FastFair<BK>::LimboLinked(const kit::RetireSlot&) const;                           \
  template void FastFair<BK>::UndoMerge(Node*, Node*);                                             \
  template bool FastFair<BK>::Referenced(Node*, uint64_t) const;                                   \
  template void FastFair<BK>::Repair(Node*, Pending*);
PMINDEX_FASTFAIR_RECOVERY(false)
PMINDEX_FASTFAIR_RECOVERY(true)
#undef PMINDEX_FASTFAIR_RECOVERY

}  // namespace pmindex::internal::fastfair
