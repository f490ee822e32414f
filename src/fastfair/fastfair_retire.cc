// fastfair_retire.cc: the FAST & FAIR tree's retired key and value blocks.
// With byte keys or values, a Remove unlinks the record's key and value
// blocks and an Update (or an Upsert of a present key) the old value
// block, while lock-free finds and scans (kit/epoch.h guards) may still be
// reading them in place; the allocator would reuse a block freed at once
// and write it under such a reader. So a block is freed only after an
// epoch grace period, owned meanwhile by a slot of a persistent retire
// list (kit/retire_list.h; slot array in Meta::blocks, fastfair_format.h),
// so that a crash between unlink and free leaks nothing. No paper section:
// FAST & FAIR (sec. 5) frees at once; its readers read values inline.
//
// Persist order of one operation (the leaf write-locked):
//   1. Own(slot, block, tag = leaf offset), persisted (fault
//      fastfair.retire.own_after_commit moves this after step 2: a crash
//      in between leaks the block);
//   2. the commit that unlinks the block (the delete shift's first key
//      store, or the update's value store), persisted;
//   3. Unlinked(slot): tag = 0, persisted (fault
//      fastfair.retire.unlinked_before_commit moves this before step 2: a
//      crash in between frees a block a record still references);
//   4. after the leaf unlock and the epoch guard: Retire(slot) (DRAM), and
//      a Reclaim frees the block once the grace period has passed (the
//      free clears the slot as its commit).
// Recovery (RecoverBlocks, at a read-write open before any operation): a
// slot whose tag is set keeps its block if a valid record of the tag's
// leaf references it (the commit did not persist; the slot is emptied),
// and frees it otherwise; a slot with tag 0 is freed. The leaf is read as
// every reader reads an unrepaired node (the validity rule, Pushed):
// what the lazy repair will keep.
//
// Thread safety: ClaimBlocks and EndBlocks from any thread outside the
// operation's epoch guard (ClaimBlocks may wait for a grace period while
// every slot is taken, except inside a Scan callback: Busy, see there);
// OwnBlock and BlocksUnlinked under the leaf's write lock; RecoverBlocks at
// open only.
#include "fastfair/fastfair_tree.h"

namespace pmindex::internal::fastfair {

namespace {
void NoExtra(const kit::RetireSlot&) {}
}  // namespace

// Claims n slots into c. Waits (reclaiming) while every slot is taken;
// PoolFull if the slot array cannot be allocated.
// A write from inside a Scan callback of this tree (ScanMark) runs inside
// the scan's epoch guard, which holds back the free of every block retired
// since the scan began, its own writes' blocks included: with more such
// writes than slots, no slot comes back before the scan ends, and waiting
// for one would wait for itself. So it does not wait: a claim that still
// fails after a Reclaim answers Busy (the write did nothing; retry it
// after the scan). The test for a scan runs only once every slot is taken.
template <bool BK>
Status FastFair<BK>::ClaimBlocks(int n, BlockClaims* c) {
  for (int j = 0; j < n; j++) {
    for (kit::Backoff bo;; bo.Wait()) {
      const int i = blocks_->Claim();
      if (i >= 0) {
        c->slot[c->n++] = i;
        break;
      }
      if (!blocks_->allocated()) {
        EndBlocks(c);
        return Status::PoolFull("fastfair: no room for the block retire list");
      }
      if (__builtin_expect(bo.n > 0, 0) && ScanMark::Inside(this)) {
        EndBlocks(c);
        return Status::Busy(
            "fastfair: every block retire slot waits for a grace period that this thread's own Scan holds "
            "back (a write from a Scan callback); retry after the scan");
      }
      ReclaimBlocks(false);
    }
  }
  return Status::OK();
}

// Step 1: the next claimed slot owns block (tag: the leaf whose record
// names it).
template <bool BK>
void FastFair<BK>::OwnBlock(BlockClaims* c, uint64_t block, Node* leaf) {
  blocks_->Own(c->slot[c->used++], block, Off(leaf));
}

// Step 3: the commit is durable; the slots alone own their blocks.
template <bool BK>
void FastFair<BK>::BlocksUnlinked(BlockClaims* c) {
  for (int j = 0; j < c->used; j++) blocks_->Unlinked(c->slot[j]);
}

// Step 4, after the operation's epoch guard: the used slots are retired,
// the others released; a Reclaim runs when one is due (as Remove's for
// limbo_: nothing waited, or every guard that could see the waiting
// blocks has ended).
template <bool BK>
void FastFair<BK>::EndBlocks(BlockClaims* c) {
  for (int j = 0; j < c->n; j++) {
    if (j < c->used) blocks_->Retire(c->slot[j]);
    else blocks_->Release(c->slot[j]);
  }
  const bool retired = c->used > 0;
  c->n = c->used = 0;
  if (!retired) return;
  const uint64_t at = blocks_reclaim_at_.load(std::memory_order_relaxed);
  if (at == 0 || epoch_.MinAnnounced() >= at) ReclaimBlocks(false);
}

template <bool BK>
void FastFair<BK>::ReclaimBlocks(bool all) {
  blocks_freed_ += blocks_->Reclaim(epoch_, all, NoExtra);
  blocks_reclaim_at_.store(blocks_->has_retired() ? epoch_.Epoch() : 0, std::memory_order_relaxed);
}

// True if the tag's leaf still references the slot's block through a
// valid record (the unlinking commit did not persist). A tag that names
// no node of the pool, or a leaf whose count is out of range (a damaged
// pool), keeps the block: a leak rather than a free of a block in use.
template <bool BK>
bool FastFair<BK>::BlockLinked(const kit::RetireSlot& s) const {
  if (s.tag % 64 || s.tag < 64 || s.tag > pool_->size() - node_size_) return true;
  Node* n = At(s.tag);
  if (n->count > cap_ || n->level != 0) return true;
  return Referenced(n, s.block);
}

// Open (read-write, before any operation): settles the slots a crash left
// (see above), then makes sure the slot array exists in a tree with byte
// keys or values, so that a Remove on a full pool still finds its slots.
template <bool BK>
void FastFair<BK>::RecoverBlocks() {
  open_blocks_freed_ += blocks_->Recover([this](const kit::RetireSlot& s) { return BlockLinked(s); },
                                         NoExtra, NoExtra);
  if ((BK || bv_) && !blocks_->allocated()) {
    const int i = blocks_->Claim();  // allocates the array (if the pool has room)
    if (i >= 0) blocks_->Release(i);
  }
}

#define PMINDEX_FASTFAIR_RETIRE(BK)                                                                \
  template Status FastFair<BK>::ClaimBlocks(int, BlockClaims*);                                    \
  template void FastFair<BK>::OwnBlock(BlockClaims*, uint64_t, Node*);                             \
  template void FastFair<BK>::BlocksUnlinked(BlockClaims*);                                        \
  template void FastFair<BK>::EndBlocks(BlockClaims*);                                             \
  template void FastFair<BK>::ReclaimBlocks(bool);                                                 \
  template bool FastFair<BK>::BlockLinked(const kit::RetireSlot&) const;                           \
  template void FastFair<BK>::RecoverBlocks();
PMINDEX_FASTFAIR_RETIRE(false)
PMINDEX_FASTFAIR_RETIRE(true)
#undef PMINDEX_FASTFAIR_RETIRE

}  // namespace pmindex::internal::fastfair
