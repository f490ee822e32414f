// fptree/fptree_group.cc: fptree_single's leaf groups (paper sec. 4.3 and
// appendix B, alg. 10-13): leaves are allocated G at a time in one block
// {next group, 56 unused bytes, G leaves}, so that a split does not pay for
// an allocator call; a DRAM vector holds the free leaves of the groups and
// a DRAM map the number of listed leaves per group. Format: fptree_format.h.
//
// Persist order:
//   GetLeaf (alg. 10): with no free leaf, a zeroed group is allocated into
//     get_log.new_group; it is linked at the tail (tail's next, or head, then
//     groups_tail, each persisted) and the log reset (LinkNewGroup).
//     Recovery (alg. 11, RecoverGetLog): a log whose group is already the
//     tail is reset, otherwise the link is redone.
//   FreeLeaf (alg. 12): when a group's last listed leaf is freed, the log
//     {prev, cur} (prev first, same line) is persisted, the group unlinked
//     (prev's next or head), the tail repaired, the group freed into
//     free_log.cur, the log reset (FinishFreeGroup; recovery alg. 13 calls
//     it again: it is idempotent). Alg. 12 forgets the tail; we repair it.
//
// Invariants: every listed leaf is a leaf of a listed group (checked at
// open: GroupOfChecked); a group's count in group_used_ is the number of its
// leaves in the leaf list; the free vector holds exactly the group leaves
// not in the list.
//
// Thread safety: fptree_single only, one thread at a time.
#include <algorithm>

#include "fptree/fptree_tree.h"

namespace pmindex::internal::fptree {

// Alg. 10: GetLeaf.
template <bool kConc, bool kBytes>
Status FPTree<kConc, kBytes>::GetLeaf(uint64_t* out) {
  if (free_leaves_.empty()) {
    GroupLog* lg = &root_->get_log;
    PMINDEX_RETURN_IF_ERROR(pool_->allocator().AllocateZeroed(&lg->new_group, GroupBytes()));
    LinkNewGroup();
  }
  *out = free_leaves_.back();
  free_leaves_.pop_back();
  GroupOf(*out)->second++;
  return Status::OK();
}

// Alg. 10 lines 4-9 (also the recovery continuation of alg. 11).
template <bool kConc, bool kBytes>
void FPTree<kConc, kBytes>::LinkNewGroup() {
  Root* r = root_;
  uint64_t g = r->get_log.new_group;
  if (r->groups_tail == 0) pm::StorePersist(&r->groups_head, g);
  else pm::StorePersist(reinterpret_cast<uint64_t*>(L(r->groups_tail)), g);
  pm::StorePersist(&r->groups_tail, g);
  pm::StorePersist(&r->get_log.new_group, uint64_t(0));
  group_used_[g] = 0;
  for (uint32_t i = group_size_; i-- > 0;) free_leaves_.push_back(g + 64 + uint64_t(i) * lay_.bytes);
}

// Alg. 11: finish or drop an interrupted GetLeaf.
template <bool kConc, bool kBytes>
void FPTree<kConc, kBytes>::RecoverGetLog() {
  Root* r = root_;
  if (!r->get_log.new_group) return;
  if (r->groups_tail == r->get_log.new_group) pm::StorePersist(&r->get_log.new_group, uint64_t(0));
  else LinkNewGroup();
}

template <bool kConc, bool kBytes>
std::map<uint64_t, uint32_t>::iterator FPTree<kConc, kBytes>::GroupOf(uint64_t leaf) {
  auto it = group_used_.upper_bound(leaf);
  --it;
  return it;
}

// Alg. 12: FreeLeaf (the leaf is unlinked and clean).
template <bool kConc, bool kBytes>
void FPTree<kConc, kBytes>::FreeLeaf(uint64_t leaf) {
  auto it = GroupOf(leaf);
  if (--it->second > 0) {
    free_leaves_.push_back(leaf);
    return;
  }
  FreeGroup(it);
}

// Alg. 12 lines 4-19: group it has no listed leaf; drop its leaves from the
// vector, unlink it, free it.
template <bool kConc, bool kBytes>
void FPTree<kConc, kBytes>::FreeGroup(std::map<uint64_t, uint32_t>::iterator it) {
  const uint64_t g = it->first;
  uint64_t lo = g, hi = g + GroupBytes();
  free_leaves_.erase(std::remove_if(free_leaves_.begin(), free_leaves_.end(), [&](uint64_t x) { return x >= lo && x < hi; }),
                     free_leaves_.end());
  group_used_.erase(it);
  Root* r = root_;
  uint64_t prev = 0;
  for (uint64_t x = r->groups_head; x && x != g; x = *reinterpret_cast<uint64_t*>(L(x))) prev = x;
  FreeGroupLog* lg = &r->free_log;
  pm::Store(&lg->prev, prev);
  pm::Store(&lg->cur, g);  // same line, after prev
  pm::Persist(lg, 16);
  FinishFreeGroup();
}

// Alg. 12 lines 8-19 / alg. 13. Idempotent.
template <bool kConc, bool kBytes>
void FPTree<kConc, kBytes>::FinishFreeGroup() {
  Root* r = root_;
  FreeGroupLog* lg = &r->free_log;
  uint64_t g = lg->cur, prev = lg->prev;
  if (g) {
    uint64_t gnext = *reinterpret_cast<uint64_t*>(L(g));
    if (prev == 0) {
      if (r->groups_head == g) pm::StorePersist(&r->groups_head, gnext);
    } else {
      uint64_t* pn = reinterpret_cast<uint64_t*>(L(prev));
      if (*pn == g) pm::StorePersist(pn, gnext);
    }
    if (r->groups_tail == g) pm::StorePersist(&r->groups_tail, prev);
    pool_->allocator().FreeOrAbort(&lg->cur);
  }
  pm::Store(&lg->prev, uint64_t(0));
  pm::Persist(lg, 16);
}

// ---- validation at open (docs/fptree.md "Corrupt pools") -------------------------
// Every offset a whole group inside the pool, the list without a cycle.
template <bool kConc, bool kBytes>
bool FPTree<kConc, kBytes>::GroupOk(uint64_t g) const {
  const uint64_t ps = pool_->size(), gb = GroupBytes();
  return g && g % 64 == 0 && ps >= gb && g <= ps - gb;
}

template <bool kConc, bool kBytes>
Status FPTree<kConc, kBytes>::GroupWord(const std::string& what, uint64_t g) const {
  if (!g || GroupOk(g)) return Status::OK();
  return Bad(what + " = " + Num(g) + " is not a leaf group offset inside the pool");
}

template <bool kConc, bool kBytes>
Status FPTree<kConc, kBytes>::CheckGroups() const {
  const Root* r = root_;
  PMINDEX_RETURN_IF_ERROR(GroupWord("get-leaf log", r->get_log.new_group));
  PMINDEX_RETURN_IF_ERROR(GroupWord("free-group log cur", r->free_log.cur));
  if (r->free_log.cur) PMINDEX_RETURN_IF_ERROR(GroupWord("free-group log prev", r->free_log.prev));
  PMINDEX_RETURN_IF_ERROR(GroupWord("root groups_tail", r->groups_tail));
  kit::BoundedWalk walk(pool_->size(), GroupBytes());
  for (uint64_t g = r->groups_head; g; g = *reinterpret_cast<uint64_t*>(L(g))) {
    PMINDEX_RETURN_IF_ERROR(GroupWord("group list entry", g));
    if (!walk.Step()) return Bad("leaf group list has a cycle");
  }
  return Status::OK();
}

// The group a listed leaf belongs to (it must be one of a group's leaves),
// or group_used_.end().
template <bool kConc, bool kBytes>
std::map<uint64_t, uint32_t>::iterator FPTree<kConc, kBytes>::GroupOfChecked(uint64_t leaf) {
  auto it = group_used_.upper_bound(leaf);
  if (it == group_used_.begin()) return group_used_.end();
  --it;
  const uint64_t rel = leaf - it->first;
  if (rel < 64 || (rel - 64) % lay_.bytes || (rel - 64) / lay_.bytes >= group_size_) return group_used_.end();
  return it;
}

#define FPT_INSTANTIATE(C, B)                                                                   \
  template Status FPTree<C, B>::GetLeaf(uint64_t*);                                             \
  template void FPTree<C, B>::LinkNewGroup();                                                   \
  template void FPTree<C, B>::RecoverGetLog();                                                  \
  template std::map<uint64_t, uint32_t>::iterator FPTree<C, B>::GroupOf(uint64_t);              \
  template void FPTree<C, B>::FreeLeaf(uint64_t);                                               \
  template void FPTree<C, B>::FreeGroup(std::map<uint64_t, uint32_t>::iterator);                \
  template void FPTree<C, B>::FinishFreeGroup();                                                \
  template bool FPTree<C, B>::GroupOk(uint64_t) const;                                          \
  template Status FPTree<C, B>::GroupWord(const std::string&, uint64_t) const;                  \
  template Status FPTree<C, B>::CheckGroups() const;                                            \
  template std::map<uint64_t, uint32_t>::iterator FPTree<C, B>::GroupOfChecked(uint64_t);
FPT_INSTANTIATE_ALL(FPT_INSTANTIATE)
#undef FPT_INSTANTIATE

}  // namespace pmindex::internal::fptree
