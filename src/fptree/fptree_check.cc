// fptree/fptree_check.cc: the FPTree family's consistency check (Check: the
// invariants of fptree_format.h and of the DRAM inner tree, on a quiescent
// tree), the enumeration of the PM blocks the tree owns (ForEachOwnedBlock:
// the allocator's leak check, paper sec. 2 "persistent memory leaks"), and
// the introspection hooks of fptree.h for tests and the figure programs.
//
// Persist order: nothing here stores to PM. Thread safety: not against
// writers (Check, ForEachOwnedBlock, PmWords, the shape hooks); the hooks
// walk the leaf list with acquire loads.
#include <algorithm>
#include <cstddef>

#include "fptree/fptree_tree.h"

namespace pmindex::internal::fptree {

template <bool kConc, bool kBytes>
Status FPTree<kConc, kBytes>::Check() {
  if (closed_) return Status::InvalidArgument("index closed");
  std::vector<uint64_t> leaves;
  PMINDEX_RETURN_IF_ERROR(CollectLeaves(&leaves));
  Rec prev_max;
  bool have_prev = false;
  for (uint64_t off : leaves) {
    char* l = L(off);
    uint64_t bm = *Bm(l);
    if (bm & ~lay_.full) return Status::Corrupt("bitmap has bits beyond the leaf size");
    if (kConc && kit::VersionLock::Busy(Ver(l)->LoadRelaxed())) return Status::Corrupt("leaf left locked");
    std::vector<Rec> recs;
    for (uint32_t i = 0; i < lay_.m; i++) {
      bool valid = bm >> i & 1;
      if (!valid) {
        if ((kBytes && *Key(l, i)) || (vbytes_ && *Val(l, i))) return Status::Corrupt("invalid slot holds a block pointer (leak)");
        continue;
      }
      Rec r;
      if (!ReadSlotKey(l, i, &r) || !ReadSlotVal(l, i, &r)) return Status::Corrupt("unreadable key/value block");
      if (kBytes && (r.ks.empty() || r.ks.size() > max_key_)) return Status::Corrupt("bad key length");
      if (lay_.fp) {
        uint8_t f = kBytes ? FpBytes(r.ks) : FpU64(r.k);
        if (*Fp(l, i) != f) return Status::Corrupt("fingerprint mismatch");
      }
      recs.push_back(std::move(r));
    }
    std::sort(recs.begin(), recs.end(), [](const Rec& a, const Rec& b) { return CmpRec(a, b) < 0; });
    for (size_t i = 1; i < recs.size(); i++)
      if (CmpRec(recs[i - 1], recs[i]) == 0) return Status::Corrupt("duplicate key in a leaf");
    if (!recs.empty()) {
      if (have_prev && CmpRec(prev_max, recs.front()) >= 0) return Status::Corrupt("leaves out of key order");
      prev_max = recs.back();
      have_prev = true;
    }
  }
  // Inner nodes: in-order leaves == list, keys sorted, ranges respected.
  std::vector<uint64_t> inorder;
  PMINDEX_RETURN_IF_ERROR(CheckInner(root_inner_.load(), nullptr, nullptr, &inorder, 0));
  if (inorder != leaves) return Status::Corrupt("inner nodes do not index the leaf list in order");
  for (int i = 0; i < kLogs; i++)
    if (root_->split[i].cur || root_->split[i].nw || root_->del[i].cur || root_->del[i].prev)
      return Status::Corrupt("micro-log left set");
  if (root_->merge_left || root_->merge_left_bm || root_->merge_right) return Status::Corrupt("merge log left set");
  if (root_->move_prev || root_->move_from || root_->move_to) return Status::Corrupt("move log left set");
  if (groups_) {
    if (root_->get_log.new_group || root_->free_log.cur) return Status::Corrupt("group log left set");
    size_t total = 0;
    for (uint64_t g = root_->groups_head; g; g = *reinterpret_cast<uint64_t*>(L(g))) {
      if (!group_used_.count(g)) return Status::Corrupt("group list and DRAM group map differ");
      total += group_size_;
    }
    if (total != leaves.size() + free_leaves_.size()) return Status::Corrupt("leaf group accounting mismatch");
  }
  return Status::OK();
}

// lo <= keys < hi for everything under n (null bounds: unbounded).
template <bool kConc, bool kBytes>
Status FPTree<kConc, kBytes>::CheckInner(Inner* n, const uint64_t* lo, const uint64_t* hi, std::vector<uint64_t>* inorder,
                                         int depth) {
  if (depth > 64) return Status::Corrupt("inner tree too deep");
  uint32_t c = n->count.load();
  if (c > n->cap) return Status::Corrupt("inner count over capacity");
  auto* keys = n->keys();
  for (uint32_t i = 0; i < c; i++) {
    uint64_t kw = keys[i].load();
    if (i > 0 && CmpWords<kBytes>(keys[i - 1].load(), kw) >= 0) return Status::Corrupt("inner keys not sorted");
    if (lo && CmpWords<kBytes>(kw, *lo) < 0) return Status::Corrupt("inner key below its range");
    if (hi && CmpWords<kBytes>(kw, *hi) >= 0) return Status::Corrupt("inner key above its range");
  }
  for (uint32_t i = 0; i <= c; i++) {
    uint64_t ch = n->child()[i].load();
    uint64_t klo = i > 0 ? keys[i - 1].load() : 0, khi = i < c ? keys[i].load() : 0;
    const uint64_t* clo = i > 0 ? &klo : lo;
    const uint64_t* chi = i < c ? &khi : hi;
    if (n->bottom) {
      inorder->push_back(ch);
      // Every record of the leaf must be within [clo, chi).
      char* l = L(ch);
      uint64_t bm = *Bm(l);
      for (uint64_t m = bm; m; m &= m - 1) {
        int s = __builtin_ctzll(m);
        Rec r;
        if (!ReadSlotKey(l, s, &r)) return Status::Corrupt("unreadable key");
        SKey sk = RecKey(r);
        if (clo && CmpInner<kBytes>(*clo, sk) > 0) return Status::Corrupt("record below its leaf's separator");
        if (chi && CmpInner<kBytes>(*chi, sk) <= 0) return Status::Corrupt("record above its leaf's separator");
      }
    } else {
      PMINDEX_RETURN_IF_ERROR(CheckInner(reinterpret_cast<Inner*>(ch), clo, chi, inorder, depth + 1));
    }
  }
  return Status::OK();
}

template <bool kConc, bool kBytes>
Status FPTree<kConc, kBytes>::ForEachOwnedBlock(const std::function<void(uint64_t)>& fn) {
  if (closed_) return Status::InvalidArgument("index closed");
  fn(*pool_->root_slot());
  if (groups_) {
    for (uint64_t g = root_->groups_head; g; g = *reinterpret_cast<uint64_t*>(L(g))) fn(g);
  }
  ForEachLeaf([&](uint64_t x) {
    if (!groups_) fn(x);
    char* l = L(x);
    for (uint32_t i = 0; i < lay_.m; i++) {
      if (kBytes && *Key(l, i)) fn(*Key(l, i));
      if (vbytes_ && *Val(l, i)) fn(*Val(l, i));
    }
    return NextAcquire(l);
  });
  for (int i = 0; i < kLogs; i++) {
    if (root_->split[i].nw && !groups_) fn(root_->split[i].nw);
    if (root_->del[i].cur && !groups_) fn(root_->del[i].cur);
  }
  if (root_->retire_area) fn(root_->retire_area);
  if (retire_) retire_->ForEachUsed([&](const kit::RetireSlot& s) { fn(s.block); });
  return Status::OK();
}

template <bool kConc, bool kBytes>
void FPTree<kConc, kBytes>::Shape(uint64_t* inner_nodes, uint64_t* leaves) {
  {
    std::lock_guard<std::mutex> g(nodes_mu_);
    *inner_nodes = nodes_.size();
  }
  *leaves = 0;
  ForEachLeaf([&](uint64_t x) {
    ++*leaves;
    return NextAcquire(L(x));
  });
}

// Records whose slot is in their home line (home-line placement).
template <bool kConc, bool kBytes>
void FPTree<kConc, kBytes>::HomeShare(uint64_t* at_home, uint64_t* records) {
  *at_home = *records = 0;
  ForEachLeaf([&](uint64_t x) {
    char* l = L(x);
    for (uint64_t m = Ld(Bm(l)) & lay_.full; m; m &= m - 1) {
      int i = __builtin_ctzll(m);
      Rec r;
      if (!ReadSlotKey(l, i, &r)) continue;
      SKey k = MakeKey(kBytes ? Slice(r.ks) : U64Slice(r.k));
      ++*records;
      // Counted through the address the descent prefetches (same
      // condition), so a test fails if prefetch and placement disagree.
      const char* h = HomeLineAddr(l, k);
      const char* slot = reinterpret_cast<const char*>(Key(l, i));
      if (lay_.home_lines > 1 && slot >= h && slot < h + 64) ++*at_home;
    }
    return NextAcquire(l);
  });
}

// fptree's leaf version table (MapLeafVersions): the leaves in the list have
// pairwise distinct words inside the table, none locked or obsolete.
template <bool kConc, bool kBytes>
bool FPTree<kConc, kBytes>::LeafVersionWords(std::string* why) {
  if (!kConc) return true;
  std::vector<kit::VersionLock*> words;
  bool ok = true;
  ForEachLeaf([&](uint64_t x) -> uint64_t {
    kit::VersionLock* w = Ver(L(x));
    if (!vtab_.Contains(w)) {
      *why = "leaf at " + std::to_string(x) + ": version word outside the table";
      ok = false;
      return 0;
    }
    if (kit::VersionLock::Busy(w->LoadRelaxed())) {
      *why = "leaf at " + std::to_string(x) + ": version word locked or obsolete";
      ok = false;
      return 0;
    }
    words.push_back(w);
    return NextAcquire(L(x));
  });
  if (!ok) return false;
  std::sort(words.begin(), words.end());
  if (std::adjacent_find(words.begin(), words.end()) != words.end()) {
    *why = "two leaves share a version word";
    return false;
  }
  return true;
}

template <bool kConc, bool kBytes>
void FPTree<kConc, kBytes>::PmWords(FPTreePmWords* w) {
  const uint64_t ro = *pool_->root_slot();
  w->root = ro;
  w->magic = ro + offsetof(Root, magic);
  w->initialized = ro + offsetof(Root, initialized);
  w->head = ro + offsetof(Root, head);
  w->leaf_slots = ro + offsetof(Root, leaf_slots);
  w->inner_size = ro + offsetof(Root, inner_size);
  w->split0_cur = ro + offsetof(Root, split) + offsetof(SplitLog, cur);
  w->split0_new = ro + offsetof(Root, split) + offsetof(SplitLog, nw);
  w->del0_cur = ro + offsetof(Root, del) + offsetof(DeleteLog, cur);
  w->del0_prev = ro + offsetof(Root, del) + offsetof(DeleteLog, prev);
  w->groups_head = ro + offsetof(Root, groups_head);
  w->get_log = ro + offsetof(Root, get_log);
  w->leaf_bytes = lay_.bytes;
  w->next_in_leaf = lay_.trailer;
  w->slot0_key_in_leaf = lay_.key_off;
  w->key_stride = lay_.key_stride;
  w->slot0_val_in_leaf = lay_.val_off;
  w->val_stride = lay_.val_stride;
  w->leaves.clear();
  w->leaf_versions.clear();
  ForEachLeaf([&](uint64_t x) {
    w->leaves.push_back(x);
    if (kConc) w->leaf_versions.push_back(LeafVersion(L(x)));
    return NextAcquire(L(x));
  });
}

#define FPT_INSTANTIATE(C, B)                                                                                  \
  template Status FPTree<C, B>::Check();                                                                       \
  template Status FPTree<C, B>::CheckInner(Inner*, const uint64_t*, const uint64_t*, std::vector<uint64_t>*,   \
                                           int);                                                               \
  template Status FPTree<C, B>::ForEachOwnedBlock(const std::function<void(uint64_t)>&);                       \
  template void FPTree<C, B>::Shape(uint64_t*, uint64_t*);                                                     \
  template void FPTree<C, B>::HomeShare(uint64_t*, uint64_t*);                                                 \
  template bool FPTree<C, B>::LeafVersionWords(std::string*);                                                  \
  template void FPTree<C, B>::PmWords(FPTreePmWords*);
FPT_INSTANTIATE_ALL(FPT_INSTANTIATE)
#undef FPT_INSTANTIATE

}  // namespace pmindex::internal::fptree
