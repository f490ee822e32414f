// fptree/fptree_retire.cc: fptree's retired key/value blocks. With byte
// keys or values, a Remove unlinks the record's key and value blocks and an
// Update (or Upsert) the old value block, while optimistic finds and scans
// (kit/epoch.h guards) may still be reading them; the allocator would reuse
// a block freed at once and write it with plain stores under such a reader.
// So a block is freed only after an epoch grace period, and meanwhile it is
// owned by a slot of a persistent retire list (kit/retire_list.h; slot array
// in Root::retire_area), so that a crash between unlink and free leaks
// nothing. No paper section: the FPTree paper frees at once (its readers
// run inside HTM transactions that a concurrent free aborts).
//
// Persist order of one block word w of an invalid slot (the leaf locked,
// after the bitmap store that made the slot invalid is durable):
//   1. Own(slot, block = *w, tag = offset of w), persisted: from here the
//      retire slot and w both name the block;
//   2. w = 0, persisted;
//   3. Unlinked(slot): tag = 0, persisted: the retire slot alone owns it;
//   4. after the leaf unlock and the epoch guard: Retire(slot) (DRAM), and
//      Reclaim frees the block once the grace period has passed (the free
//      clears the slot as its commit).
// Recovery (RecoverRetired, before any other recovery step stores): a slot
// whose tag is set and whose tag word still names the block gives the block
// back to that word (the slot is cleared; the per-leaf pass of recovery
// then frees it as the block word of an invalid slot, alg. 17); every other
// used slot's block is freed.
//
// fptree_single and ptree have no concurrent readers: they free at once
// (DropBlockWord) and never allocate the retire list.
//
// Thread safety: ClaimRetire and EndClaims from any thread outside the
// operation's epoch guard (ClaimRetire may wait for a grace period when
// every slot is taken); DropBlockWord under the leaf's lock;
// RecoverRetired at open only.
#include "fptree/fptree_tree.h"
#include "pmindex/pm/fault.h"

namespace pmindex::internal::fptree {

namespace {
void NoExtra(const kit::RetireSlot&) {}
}  // namespace

// Claims n retire slots into c (fptree with a retire list; otherwise
// nothing). Waits (reclaiming) while every slot is taken; PoolFull if the
// slot array cannot be allocated.
template <bool kConc, bool kBytes>
Status FPTree<kConc, kBytes>::ClaimRetire(int n, Claims* c) {
  if (!kConc || !retire_) return Status::OK();
  c->t = this;
  for (int j = 0; j < n; j++) {
    for (Backoff bo;; bo.Wait()) {
      const int i = retire_->Claim();
      if (i >= 0) {
        c->slot[c->n++] = i;
        break;
      }
      if (!retire_->allocated()) return Status::PoolFull("fptree: no room for the retire list");
      retire_->Reclaim(epoch_, false, NoExtra);
    }
  }
  return Status::OK();
}

// Drops the block named by w, the key or value word of an invalid slot of a
// locked leaf: retired (persist order above) or, without concurrent
// readers, freed at once.
template <bool kConc, bool kBytes>
void FPTree<kConc, kBytes>::DropBlockWord(uint64_t* w, Claims* c) {
  if (!kConc || !retire_ || c->used >= c->n) {
    pool_->allocator().FreeOrAbort(w);
    return;
  }
  const uint64_t block = Ld(w);
  if (block == 0) return;
  const int i = c->slot[c->used++];
  // Fault switches: clear_word_first persists step 2 before step 1 (a
  // crash between leaks the block); skip_word_persist leaves step 2
  // unflushed when step 3 commits (the lint's missing flush).
  const bool clear_first = PMINDEX_FAULT("fptree.retire.clear_word_first");
  if (clear_first) {
    pm::StoreAtomic(w, uint64_t(0));
    pm::Persist(w, 8);
  }
  retire_->Own(i, block, uint64_t(reinterpret_cast<char*>(w) - base_));
  if (!clear_first) {
    pm::StoreAtomic(w, uint64_t(0));
    if (!PMINDEX_FAULT("fptree.retire.skip_word_persist")) pm::Persist(w, 8);
  }
  retire_->Unlinked(i);
}

// After the operation's epoch guard: the used slots are retired, the others
// released, and what has passed its grace period is freed.
template <bool kConc, bool kBytes>
void FPTree<kConc, kBytes>::EndClaims(Claims* c) {
  if (!retire_) return;
  for (int j = 0; j < c->n; j++) {
    if (j < c->used) retire_->Retire(c->slot[j]);
    else retire_->Release(c->slot[j]);
  }
  const bool retired = c->used > 0;
  c->n = c->used = 0;
  if (retired) retire_->Reclaim(epoch_, false, NoExtra);
}

// Open (Recover, after CheckLogs): settles the retire slots a crash left
// (see above), then makes sure the slot array exists for fptree with byte
// keys or values, so that the first Remove does not allocate it.
template <bool kConc, bool kBytes>
Status FPTree<kConc, kBytes>::RecoverRetired() {
  Root* r = root_;
  const uint64_t area = r->retire_area;
  const uint64_t bytes = uint64_t(kRetireSlots) * sizeof(kit::RetireSlot);
  if (area && (area % 8 || pool_->size() < bytes || area > pool_->size() - bytes))
    return Bad("root retire_area " + Num(area) + " outside the pool");
  if (area && !(kConc && pointers_)) return Bad("root retire_area " + Num(area) + " set in a tree without a retire list");
  if (!(kConc && pointers_)) return Status::OK();
  retire_ = std::make_unique<kit::PmRetireList>(base_, &pool_->allocator(), &r->retire_area, kRetireSlots);
  const uint64_t ps = pool_->size();
  auto linked = [&](const kit::RetireSlot& s) {
    return s.tag % 8 == 0 && s.tag <= ps - 8 && Ld(reinterpret_cast<uint64_t*>(base_ + s.tag)) == s.block;
  };
  retire_->Recover(linked, NoExtra, NoExtra);
  if (!retire_->allocated()) {
    const int i = retire_->Claim();  // allocates the array (if the pool has room)
    if (i >= 0) retire_->Release(i);
  }
  return Status::OK();
}

#define FPT_INSTANTIATE(C, B)                                      \
  template Status FPTree<C, B>::ClaimRetire(int, Claims*);         \
  template void FPTree<C, B>::DropBlockWord(uint64_t*, Claims*);   \
  template void FPTree<C, B>::EndClaims(Claims*);                  \
  template Status FPTree<C, B>::RecoverRetired();
FPT_INSTANTIATE_ALL(FPT_INSTANTIATE)
#undef FPT_INSTANTIATE

}  // namespace pmindex::internal::fptree
