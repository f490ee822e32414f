// fptree/fptree_compact.cc: space that comes back after deletes. The FPTree
// paper (sec. 4.4, alg. 5/6) frees a leaf only once it is empty; after many
// random deletes most leaves hold a few records each, so PM use stays near
// its peak and a scan reads many leaves per record. Open (fptree_recovery.cc,
// single-threaded, after the empty leaves are dropped and before the inner
// nodes are built) therefore compacts the leaf list:
//   - CompactLeaves: neighbouring leaves are merged, left to right, while the
//     records of a run of leaves fit in kMergeFill of a leaf; the left leaf
//     of the run absorbs the others (one micro-logged merge each);
//   - CompactGroups (fptree_single): leaves of the sparsest groups are moved
//     into the free leaves of the fullest ones, and the groups left without a
//     listed leaf are freed (alg. 12's free-group log), so that the groups in
//     use are as few as the listed leaves allow.
// docs/fptree.md "Space after deletes" argues why at open and not online.
//
// Persist order, merge of right into left (left.next == right):
//   0. an older root gets the current magic (persisted) first (open has
//      already rewritten it, ClassifyRoot);
//   1. log {left, left_bm = left's bitmap, right} (right stored last, same
//      line as the root's head), persisted;
//   2. right's records are copied into left's free slots (the i-th record of
//      right, in slot order, into the i-th free slot of left_bm): key, value
//      and fingerprint; left's lines up to the trailer flushed, fence;
//   3. left's bitmap = left_bm | the filled slots, persisted;
//   4. left.next = right.next, persisted (RedoUnlink);
//   5. right is freed into log.right (fptree, ptree) or log.right is reset
//      and right returned to its group (fptree_single);
//   6. log.left and log.left_bm reset, persisted.
// Recovery (RecoverMergeLog, before the leaf list is read): a log with right
// set redoes 2-4 if left.next is still right (right is not written before it
// is freed, and left_bm fixes the slots, so the redo stores the same words),
// then 5 and 6. Until 3, left's new slots are free slots; from 3 to 4 the
// moved records are in both leaves, which only the log's redo can see.
//
// Persist order, moving leaf x (fptree_single) to a free group leaf y:
//   1. y = a copy of x (all lines, next included), flushed, fence;
//   2. the word pointing to x (its predecessor's next, or head) = y, persisted;
//   3. x is returned to its group (FreeLeaf: alg. 12 frees the group when its
//      last listed leaf goes).
// No log: before 2, y is a free group leaf (recovery zeroes its bitmap);
// after 2, x is, and a group left without listed leaves by a crash before 3
// is freed by the next open's CompactGroups. Block words in free leaves own
// nothing (only listed leaves' valid slots do).
//
// Thread safety: open only (single-threaded).
#include <algorithm>

#include "fptree/fptree_tree.h"
#include "pmindex/pm/fault.h"

namespace pmindex::internal::fptree {

namespace {
// A run of neighbouring leaves is merged while its records fit in this share
// of a leaf: the merged leaf keeps room for inserts before it splits again,
// and is about as full as the leaves of a tree loaded by random inserts
// (~70%), so scans read as many leaves per record as in such a tree.
constexpr uint32_t kMergeFillNum = 3, kMergeFillDen = 4;
}  // namespace

template <bool kConc, bool kBytes>
Status FPTree<kConc, kBytes>::CheckMergeLog() const {
  const Root* r = root_;
  if (!r->merge_right) return Status::OK();
  PMINDEX_RETURN_IF_ERROR(LeafWord("merge log left", r->merge_left));
  PMINDEX_RETURN_IF_ERROR(LeafWord("merge log right", r->merge_right));
  if (r->merge_left == r->merge_right) return Bad("merge log: left and right are the same leaf");
  const uint64_t lbm = r->merge_left_bm, rbm = *Bm(L(r->merge_right));
  if ((lbm | rbm) & ~lay_.full) return Bad("merge log: bitmap has bits beyond the leaf size");
  if (Ld(Next(L(r->merge_left))) == r->merge_right &&
      __builtin_popcountll(rbm) > __builtin_popcountll(~lbm & lay_.full))
    return Bad("merge log: the right leaf's records do not fit in the left leaf's free slots");
  return Status::OK();
}

// Steps 2-6 of a merge whose log is persisted (also the recovery redo).
template <bool kConc, bool kBytes>
void FPTree<kConc, kBytes>::RedoMerge() {
  Root* r = root_;
  const uint64_t loff = r->merge_left, roff = r->merge_right;
  char* l = L(loff);
  char* rt = L(roff);
  if (Ld(Next(l)) == roff) {
    uint64_t freem = ~r->merge_left_bm & lay_.full, moved = 0;
    for (uint64_t m = *Bm(rt) & lay_.full; m; m &= m - 1) {
      const int i = __builtin_ctzll(m), s = __builtin_ctzll(freem);
      freem &= freem - 1;
      pm::Store(Key(l, s), *Key(rt, i));
      pm::Store(Val(l, s), *Val(rt, i));
      if (lay_.fp) pm::Store(Fp(l, s), *Fp(rt, i));
      moved |= 1ull << s;
    }
    if (!PMINDEX_FAULT("fptree.merge.skip_copy_flush")) pm::Flush(l, lay_.trailer);
    pm::Fence();
    pm::StoreAtomic(Bm(l), r->merge_left_bm | moved);
    pm::Persist(l, 8);
    RedoUnlink(loff, roff);
  }
  if (groups_) {
    pm::Store(&r->merge_right, uint64_t(0));
    pm::Persist(&r->merge_right, 8);
  } else {
    pool_->allocator().FreeOrAbort(&r->merge_right);
  }
  pm::Store(&r->merge_left, uint64_t(0));
  pm::Store(&r->merge_left_bm, uint64_t(0));
  pm::Persist(&r->merge_left, 16);
}

template <bool kConc, bool kBytes>
void FPTree<kConc, kBytes>::RecoverMergeLog() {
  Root* r = root_;
  if (r->merge_right) {
    RedoMerge();  // fptree_single: the right leaf is a free group leaf now
  } else if (r->merge_left || r->merge_left_bm) {
    pm::Store(&r->merge_left, uint64_t(0));
    pm::Store(&r->merge_left_bm, uint64_t(0));
    pm::Persist(&r->merge_left, 16);
  }
}

template <bool kConc, bool kBytes>
void FPTree<kConc, kBytes>::MergeLeaves(uint64_t loff, uint64_t roff) {
  Root* r = root_;
  if (r->magic != kMagic) pm::StorePersist(&r->magic, kMagic);
  pm::Store(&r->merge_left, loff);
  pm::Store(&r->merge_left_bm, *Bm(L(loff)));
  pm::Store(&r->merge_right, roff);
  pm::Persist(&r->merge_left, 24);
  RedoMerge();
  if (groups_) FreeLeaf(roff);
}

// leaves/mins: the listed leaves in order (no empty leaf but a tree's only
// one) and their minimum keys; on return, those that remain.
template <bool kConc, bool kBytes>
void FPTree<kConc, kBytes>::CompactLeaves(std::vector<uint64_t>* leaves, std::vector<Rec>* mins) {
  const size_t n = leaves->size();
  if (n < 2) return;
  const uint32_t limit = std::max<uint32_t>(1, lay_.m * kMergeFillNum / kMergeFillDen);
  auto count = [&](uint64_t x) { return uint32_t(__builtin_popcountll(*Bm(L(x)) & lay_.full)); };
  size_t out = 0;
  uint32_t cur = count((*leaves)[0]);
  for (size_t j = 1; j < n; j++) {
    const uint64_t x = (*leaves)[j];
    const uint32_t c = count(x);
    if (cur + c <= limit) {
      MergeLeaves((*leaves)[out], x);
      cur += c;
      continue;
    }
    out++;
    (*leaves)[out] = x;
    if (out != j) (*mins)[out] = std::move((*mins)[j]);
    cur = c;
  }
  leaves->resize(out + 1);
  mins->resize(out + 1);
}

// fptree_single: the fewest groups for the listed leaves (see the top).
template <bool kConc, bool kBytes>
void FPTree<kConc, kBytes>::CompactGroups(std::vector<uint64_t>* leaves) {
  if (!groups_) return;
  const size_t need = (leaves->size() + group_size_ - 1) / group_size_;
  if (group_used_.size() <= need) return;
  std::vector<std::pair<uint32_t, uint64_t>> order;  // (listed leaves, group)
  for (auto& [g, used] : group_used_) order.push_back({used, g});
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  std::vector<uint64_t> kept;
  for (size_t i = 0; i < need; i++) kept.push_back(order[i].second);
  std::sort(kept.begin(), kept.end());
  auto in_kept = [&](uint64_t leaf) {
    auto it = std::upper_bound(kept.begin(), kept.end(), leaf);
    return it != kept.begin() && leaf < *(it - 1) + GroupBytes();
  };
  std::vector<uint64_t> listed = *leaves;
  std::sort(listed.begin(), listed.end());
  std::vector<uint64_t> dest;  // free leaves of kept groups
  for (uint64_t g : kept)
    for (uint32_t i = 0; i < group_size_; i++) {
      const uint64_t leaf = g + 64 + uint64_t(i) * lay_.bytes;
      if (!std::binary_search(listed.begin(), listed.end(), leaf)) dest.push_back(leaf);
    }
  for (size_t j = 0; j < leaves->size() && !dest.empty(); j++) {
    const uint64_t x = (*leaves)[j];
    if (in_kept(x)) continue;
    const uint64_t y = dest.back();
    dest.pop_back();
    char* d = L(y);
    pm::Copy(d, L(x), lay_.bytes);
    pm::Flush(d, lay_.bytes);
    pm::Fence();
    pm::StorePersist(j ? Next(L((*leaves)[j - 1])) : &root_->head, y);
    GroupOf(y)->second++;
    FreeLeaf(x);
    (*leaves)[j] = y;
  }
  // Groups without a listed leaf (a crash inside an earlier move).
  for (auto it = group_used_.begin(); it != group_used_.end();) {
    auto nx = std::next(it);
    if (it->second == 0) FreeGroup(it);
    it = nx;
  }
}

#define FPT_INSTANTIATE(C, B)                                                              \
  template Status FPTree<C, B>::CheckMergeLog() const;                                     \
  template void FPTree<C, B>::RedoMerge();                                                 \
  template void FPTree<C, B>::RecoverMergeLog();                                           \
  template void FPTree<C, B>::MergeLeaves(uint64_t, uint64_t);                             \
  template void FPTree<C, B>::CompactLeaves(std::vector<uint64_t>*, std::vector<Rec>*);    \
  template void FPTree<C, B>::CompactGroups(std::vector<uint64_t>*);
FPT_INSTANTIATE_ALL(FPT_INSTANTIATE)
#undef FPT_INSTANTIATE

}  // namespace pmindex::internal::fptree
