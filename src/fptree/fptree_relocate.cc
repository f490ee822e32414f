// fptree/fptree_relocate.cc: moving fptree's and ptree's surviving leaves
// to adjacent blocks at open. No paper section: the paper neither merges
// nor moves leaves. After random deletes of most keys, the compaction at
// open (fptree_compact.cc) leaves a tenth of the leaves, each at its place
// in the pool the full tree filled, so a scan touches several times more
// pages per record than in a tree loaded with only those records.
// Open (fptree_recovery.cc, single-threaded, after the compaction and
// before the inner nodes are built) therefore copies every listed leaf, in
// list order, into a new block when the compaction left at most half of
// the listed leaves. The allocator hands out the blocks of a size-class run
// in address order and fills one run before it takes the next, so leaves
// neighbouring in the list land next to each other, in the holes of a few
// runs; the runs the old leaves emptied go back to the heap.
// fptree_single needs none of this: CompactGroups already moves its leaves
// into the fewest groups.
//
// Persist order, moving listed leaf x (predecessor p, or the head) to y:
//   1. log.prev = p (0 for the head), log.from = x, persisted;
//   2. y allocated into log.to (the allocator's commit point);
//   3. y = a copy of x (all lines: records, fingerprints, next), flushed,
//      fence;
//   4. the word naming x (p's next, or the root's head) = y, persisted;
//   5. x freed from log.from (the free clears log.from durably);
//   6. log.to and log.prev reset, persisted.
// Recovery (RecoverMoveLog, before the leaf list is read): with from and to
// both set, the word of step 4 names y (done: free x) or x (not done: free
// y, whose contents may be partial); in every other state the log is just
// reset (no block was allocated, or x was already freed and y is listed).
// Between 3 and 5 x and y hold the same block words; only listed leaves'
// valid slots own key/value blocks, so freeing either leaf frees none.
//
// Thread safety: open only (single-threaded).
#include "fptree/fptree_tree.h"
#include "pmindex/pm/fault.h"

namespace pmindex::internal::fptree {

template <bool kConc, bool kBytes>
Status FPTree<kConc, kBytes>::CheckMoveLog() const {
  const Root* r = root_;
  if (r->move_to && (r->groups_head || groups_)) return Bad("move log in use in a tree with leaf groups");
  if (!r->move_from || !r->move_to) return Status::OK();
  PMINDEX_RETURN_IF_ERROR(LeafWord("move log from", r->move_from));
  PMINDEX_RETURN_IF_ERROR(LeafWord("move log to", r->move_to));
  if (r->move_prev) PMINDEX_RETURN_IF_ERROR(LeafWord("move log prev", r->move_prev));
  if (r->move_from == r->move_to || r->move_prev == r->move_from || r->move_prev == r->move_to)
    return Bad("move log: prev, from and to are not three distinct leaves");
  const uint64_t w = r->move_prev ? Ld(Next(L(r->move_prev))) : r->head;
  if (w != r->move_from && w != r->move_to)
    return Bad("move log: the word before the moved leaf names " + Num(w) + ", neither " + Num(r->move_from) +
               " nor " + Num(r->move_to));
  return Status::OK();
}

template <bool kConc, bool kBytes>
void FPTree<kConc, kBytes>::ClearMoveLog() {
  Root* r = root_;
  pm::Store(&r->move_to, uint64_t(0));
  pm::Store(&r->move_from, uint64_t(0));
  pm::Store(&r->move_prev, uint64_t(0));
  pm::Persist(&r->move_prev, 24);
}

template <bool kConc, bool kBytes>
void FPTree<kConc, kBytes>::RecoverMoveLog() {
  Root* r = root_;
  if (!r->move_prev && !r->move_from && !r->move_to) return;
  if (r->move_from && r->move_to) {
    const uint64_t w = r->move_prev ? Ld(Next(L(r->move_prev))) : r->head;
    pool_->allocator().FreeOrAbort(w == r->move_to ? &r->move_from : &r->move_to);
  }
  ClearMoveLog();
}

// leaves: the listed leaves in order; on return, their new offsets.
template <bool kConc, bool kBytes>
void FPTree<kConc, kBytes>::RelocateLeaves(std::vector<uint64_t>* leaves) {
  Root* r = root_;
  if (r->magic != kMagic) pm::StorePersist(&r->magic, kMagic);
  for (size_t j = 0; j < leaves->size(); j++) {
    const uint64_t x = (*leaves)[j], p = j ? (*leaves)[j - 1] : 0;
    pm::Store(&r->move_prev, p);
    pm::Store(&r->move_from, x);
    pm::Persist(&r->move_prev, 16);
    // A full pool ends the relocation: the leaves stay where they are.
    if (!pool_->allocator().Allocate(&r->move_to, lay_.bytes).ok()) {
      ClearMoveLog();
      return;
    }
    const uint64_t y = r->move_to;
    char* d = L(y);
    pm::Copy(d, L(x), lay_.bytes);
    if (!PMINDEX_FAULT("fptree.move.skip_copy_flush")) pm::Flush(d, lay_.bytes);
    pm::Fence();
    pm::StorePersist(p ? Next(L(p)) : &r->head, y);
    pool_->allocator().FreeOrAbort(&r->move_from);
    ClearMoveLog();
    (*leaves)[j] = y;
  }
}

#define FPT_INSTANTIATE(C, B)                                          \
  template Status FPTree<C, B>::CheckMoveLog() const;                  \
  template void FPTree<C, B>::ClearMoveLog();                          \
  template void FPTree<C, B>::RecoverMoveLog();                        \
  template void FPTree<C, B>::RelocateLeaves(std::vector<uint64_t>*);
FPT_INSTANTIATE_ALL(FPT_INSTANTIATE)
#undef FPT_INSTANTIATE

}  // namespace pmindex::internal::fptree
