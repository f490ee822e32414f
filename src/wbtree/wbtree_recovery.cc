// wbtree_recovery.cc: wBTree's creation, open-time recovery, the lazy repair
// of a node on its first touch, Check and ForEachOwnedBlock (PiBench sec.
// 5.6 and table 3: a PM-only tree recovers in constant time; docs/
// wbtree.md, "Recovery").
//
// Open does bounded work only: the spare root, at most kMaxLevels split
// logs and the leaf-free log (wbtree_smo.cc). Everything per node is lazy: the first operation to
// reach a node after open (EnsureChecked) locks it and repairs it: its
// spare words (a spare that a valid entry also holds is a stale reference
// and is cleared; any other owns a block in flight and frees it) and its
// slot array (rebuilt from the bitmap and the keys unless Consistent).
//
// Persist order: Format allocates Meta zeroed into the root slot, the first
// leaf zeroed into Meta::root, stores the leaf's cap and Meta's
// configuration, persists them, then stores and persists the magic (a pool
// without it is a crashed creation, created again at open). Repairs persist
// each store before the node is used (Rebuild: the new slot array; spares:
// the allocator's Free, or the store of 0 with a flush and fence).
//
// Thread safety: Format, Recover, Check and ForEachOwnedBlock are
// single-threaded (no other call runs); EnsureChecked from any thread (it
// takes the node's lock).
#include <algorithm>

#include "kit/pm_block.h"
#include "wbtree/wbtree_tree.h"

namespace pmindex::internal::wbtree {

template <bool BK>
Status WBTree<BK>::Format() {
  PMINDEX_RETURN_IF_ERROR(alloc_->AllocateZeroed(pool_->root_slot(), sizeof(Meta)));
  meta_ = pool_->root<Meta>();
  PMINDEX_RETURN_IF_ERROR(alloc_->AllocateZeroed(&meta_->root, NodeBytes(leaf_cap_)));
  Node* r = N(meta_->root);
  St(&r->cap, leaf_cap_);
  pm::Persist(r, 64);
  pm::Store(&meta_->version, kVersion);
  pm::Store(&meta_->key_kind, uint8_t(BK ? 1 : 0));
  pm::Store(&meta_->value_kind, uint8_t(vk_));
  pm::Store(&meta_->leaf_cap, leaf_cap_);
  pm::Store(&meta_->inner_cap, inner_cap_);
  pm::Store(&meta_->variant, uint8_t(slot_only_ ? 1 : 0));
  pm::Persist(meta_, 64);
  St(&meta_->magic, kMagic);
  pm::Persist(&meta_->magic, 8);
  return locks_.Map(base_, pool_->max_size(), NodeBytes(min_cap_));
}

template <bool BK>
Status WBTree<BK>::Recover() {
  meta_ = pool_->root<Meta>();
  PMINDEX_RETURN_IF_ERROR(locks_.Map(base_, pool_->max_size(), NodeBytes(min_cap_)));
  if (pool_->read_only()) return Status::OK();
  if (meta_->spare_root) {
    if (meta_->spare_root == meta_->root) {
      St(&meta_->spare_root, uint64_t(0));
      pm::Persist(&meta_->spare_root, 8);
    } else {
      if (!NodeOk(meta_->spare_root) || !alloc_->IsAllocated(meta_->spare_root))
        return Status::Corrupt("wbtree spare root out of the pool");
      if (BK && N(meta_->spare_root)->ents()[0].k) PMINDEX_RETURN_IF_ERROR(alloc_->Free(&N(meta_->spare_root)->ents()[0].k));
      PMINDEX_RETURN_IF_ERROR(alloc_->Free(&meta_->spare_root));
    }
  }
  for (int l = kMaxLevels - 1; l >= 0; l--) PMINDEX_RETURN_IF_ERROR(RecoverLog(l));
  return RecoverFreeLeaf();
}

template <bool BK>
Status WBTree<BK>::RecoverLog(int level) {
  SplitLog* log = &meta_->logs[level];
  if (!log->new_node) {
    if (log->old_node || log->trim || log->mid) ClearLog(log);
    return Status::OK();
  }
  if (!NodeOk(log->old_node) || !NodeOk(log->new_node) || !alloc_->IsAllocated(log->new_node))
    return Status::Corrupt("wbtree split log " + std::to_string(level) + " names nodes out of the pool");
  Node* l = N(log->old_node);
  Node* r = N(log->new_node);
  if (LdR(&l->next) != log->new_node) {
    PMINDEX_RETURN_IF_ERROR(alloc_->Free(&log->new_node));  // never linked; its entries' blocks are l's
    ClearLog(log);
    return Status::OK();
  }
  // Committed: finish it. Byte keys: an inner split's mid block is freed
  // only after the separator is in the parent, so mid == 0 means the split
  // was complete but for clearing the log.
  if (BK && level > 0 && log->mid == 0) {
    ClearLog(log);
    return Status::OK();
  }
  if (slot_only_) {
    St(&l->slotw[0], log->trim);
    pm::Persist(l->slotw, 8);
  } else {
    St(&l->bitmap, log->trim);
    pm::Persist(l, 64);
  }
  LockNode(l);
  Status st = Repair(l);
  UnlockNode(l);
  PMINDEX_RETURN_IF_ERROR(st);
  __atomic_store_n(&LW(l).checked, uint64_t(1), __ATOMIC_RELEASE);
  std::string sep;
  if (level > 0) {
    if (!ReadKeyWord<BK>(Ctx(), log->mid, &sep)) return Status::Corrupt("wbtree split log: unreadable mid key");
  } else {
    Slots s;
    LoadSlots(r, &s);
    if (s.count() == 0 || s.at(1) >= leaf_cap_ || !ReadKeyWord<BK>(Ctx(), r->ents()[s.at(1)].k, &sep))
      return Status::Corrupt("wbtree split log: new node without keys");
  }
  std::vector<Node*> locked;
  if (meta_->root == log->old_node) {
    st = GrowRoot(l, sep, r, &locked);
  } else {
    std::vector<Node*> path;
    Node* x;
    st = PathTo(sep, uint32_t(level), &path, &x);
    if (st.ok() && path.empty()) st = Status::Corrupt("wbtree split log: no parent");
    if (st.ok()) {
      Node* p = path.back();
      bool has = p->leftmost == log->new_node;
      for (uint32_t i = 0; i < inner_cap_ && !has; i++)
        has = (Valid(p) >> i & 1) && p->ents()[i].v == log->new_node;
      if (!has) st = InsertIntoParent(path, path.size(), l, sep, r, &locked);
    }
  }
  for (Node* n : locked) UnlockNode(n);
  PMINDEX_RETURN_IF_ERROR(st);
  if (BK && level > 0) PMINDEX_RETURN_IF_ERROR(alloc_->Free(&log->mid));
  ClearLog(log);
  return Status::OK();
}

template <bool BK>
bool WBTree<BK>::SpareReferenced(const Node* n, uint64_t w) const {
  const uint32_t cap = std::min<uint32_t>(LdR(&n->cap), kMaxCap);
  const uint64_t bm = Valid(n);
  const bool leaf = LdR(&n->level) == 0;
  for (uint32_t i = 0; i < cap; i++)
    if ((bm >> i & 1) && ((BK && n->ents()[i].k == w) || (leaf && vbytes() && n->ents()[i].v == w))) return true;
  return false;
}

template <bool BK>
Status WBTree<BK>::EnsureChecked(Node* n) {
  LockWord& w = LW(n);
  if (__atomic_load_n(&w.checked, __ATOMIC_ACQUIRE)) return Status::OK();
  LockNode(n);
  Status st;
  if (!__atomic_load_n(&w.checked, __ATOMIC_RELAXED)) {
    st = Repair(n);
    if (st.ok()) {
      __atomic_store_n(&w.checked, uint64_t(1), __ATOMIC_RELEASE);
      nodes_repaired_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  UnlockNode(n);
  return st;
}

template <bool BK>
Status WBTree<BK>::Repair(Node* n) {
  const uint32_t level = LdR(&n->level), cap = LdR(&n->cap);
  const std::string at = "wbtree node at " + std::to_string(Off(n));
  if (level >= uint32_t(kMaxLevels) || cap != CapOf(level)) return Status::Corrupt(at + " has a bad level or capacity");
  if (Valid(n) & ~CapMask(cap)) return Status::Corrupt(at + " has bitmap bits beyond its capacity");
  if (!pool_->read_only()) {
    for (uint64_t* sp : {&n->spare_a, &n->spare_b}) {
      if (!*sp) continue;
      if (SpareReferenced(n, *sp)) {
        St(sp, uint64_t(0));
        pm::Persist(sp, 8);
      } else {
        if (!alloc_->IsAllocated(*sp)) return Status::Corrupt(at + " has a spare word that owns no block");
        PMINDEX_RETURN_IF_ERROR(alloc_->Free(sp));
      }
    }
  }
  Slots s;
  LoadSlots(n, &s);
  if (Consistent(s, Valid(n), cap)) return Status::OK();
  return Rebuild(n);
}

template <bool BK>
Status WBTree<BK>::Rebuild(Node* n) {
  const uint32_t cap = LdR(&n->cap);
  const uint64_t bm = Valid(n);
  std::vector<std::pair<std::string, uint8_t>> keys;
  for (uint32_t i = 0; i < cap; i++) {
    if (!(bm >> i & 1)) continue;
    keys.emplace_back();
    if (!ReadKeyWord<BK>(Ctx(), n->ents()[i].k, &keys.back().first))
      return Status::Corrupt("wbtree node at " + std::to_string(Off(n)) + ": unreadable key block");
    keys.back().second = uint8_t(i);
  }
  const KeyKind kk = key_kind();
  std::sort(keys.begin(), keys.end(), [kk](const auto& a, const auto& b) { return CompareKeys(kk, a.first, b.first) < 0; });
  Slots s{};
  s.b[0] = uint8_t(keys.size());
  for (size_t i = 0; i < keys.size(); i++) s.b[i + 1] = keys[i].second;
  if (pool_->read_only()) return Status::Corrupt("wbtree node at " + std::to_string(Off(n)) + " needs a repair (read-only open)");
  for (int i = 0; i < 8; i++) {
    uint64_t w;
    std::memcpy(&w, s.b + 8 * i, 8);
    St(&n->slotw[i], w);
  }
  pm::Persist(n->slotw, 64);
  slot_rebuilds_.fetch_add(1, std::memory_order_relaxed);
  return Status::OK();
}

// Visits every node level by level, each level along its sibling chain,
// repairing each on the way.
template <bool BK>
Status WBTree<BK>::WalkLevels(const std::function<Status(Node*, uint32_t)>& fn) {
  uint64_t first = meta_->root;
  const uint64_t bound = pool_->size() / NodeBytes(min_cap_) + 1;
  for (int d = 0; d <= kMaxLevels; d++) {
    if (!NodeOk(first)) return Status::Corrupt("wbtree: node pointer out of the pool");
    const uint32_t level = N(first)->level;
    uint64_t off = first, steps = 0;
    while (off) {
      if (!NodeOk(off) || ++steps > bound) return Status::Corrupt("wbtree: sibling chain out of the pool or cyclic");
      Node* n = N(off);
      PMINDEX_RETURN_IF_ERROR(EnsureChecked(n));
      if (n->level != level) return Status::Corrupt("wbtree: sibling chain crosses levels");
      PMINDEX_RETURN_IF_ERROR(fn(n, level));
      off = n->next;
    }
    if (level == 0) return Status::OK();
    first = N(first)->leftmost;
  }
  return Status::Corrupt("wbtree deeper than " + std::to_string(kMaxLevels) + " levels");
}

template <bool BK>
Status WBTree<BK>::Check() {
  if (closed()) return IndexClosed();
  const KeyCtx c = Ctx();
  const KeyKind kk = key_kind();
  // Expected nodes of the level being walked, with their key bounds.
  struct Want {
    uint64_t node;
    bool has_lo, has_hi;
    std::string lo, hi;
  };
  std::vector<Want> want{{meta_->root, false, false, {}, {}}}, next_want;
  size_t at = 0;
  uint32_t cur_level = ~0u;
  Status st = WalkLevels([&](Node* n, uint32_t level) -> Status {
    if (level != cur_level) {
      if (cur_level != ~0u) {
        if (at != want.size()) return Status::Corrupt("wbtree: level " + std::to_string(cur_level) + " chain is shorter than its parents say");
        want.swap(next_want);
        next_want.clear();
      }
      cur_level = level;
      at = 0;
    }
    const std::string where = "wbtree node at " + std::to_string(Off(n));
    if (at >= want.size() || want[at].node != Off(n)) return Status::Corrupt(where + " is in the sibling chain but not where its parent says");
    const Want& w = want[at++];
    Slots s;
    LoadSlots(n, &s);
    if (!Consistent(s, Valid(n), n->cap)) return Status::Corrupt(where + ": slot array inconsistent with the bitmap");
    if (n->spare_a || n->spare_b) return Status::Corrupt(where + ": spare word in use");
    std::string prev, k;
    for (uint32_t i = 1; i <= s.count(); i++) {
      const Entry& e = n->ents()[s.at(i)];
      if (!ReadKeyWord<BK>(c, e.k, &k)) return Status::Corrupt(where + ": unreadable key block");
      if (i > 1 && CompareKeys(kk, prev, k) >= 0) return Status::Corrupt(where + ": slot array not sorted");
      if ((w.has_lo && CompareKeys(kk, k, w.lo) < 0) || (w.has_hi && CompareKeys(kk, k, w.hi) >= 0))
        return Status::Corrupt(where + ": key outside the range its parent routes to it");
      if (level == 0 && vbytes()) {
        std::string v;
        PMINDEX_RETURN_IF_ERROR(ReadValue(&e, &v));
      }
      if (level > 0) {
        Want cw{e.v, true, false, k, {}};
        if (i < s.count()) {
          cw.has_hi = true;
          if (!ReadKeyWord<BK>(c, n->ents()[s.at(i + 1)].k, &cw.hi)) return Status::Corrupt(where + ": unreadable key block");
        } else {
          cw.has_hi = w.has_hi;
          cw.hi = w.hi;
        }
        next_want.push_back(std::move(cw));
      }
      prev = k;
    }
    if (level > 0) {
      Want lw{n->leftmost, w.has_lo, s.count() > 0 || w.has_hi, w.lo, {}};
      if (s.count() > 0) {
        if (!ReadKeyWord<BK>(c, n->ents()[s.at(1)].k, &lw.hi)) return Status::Corrupt(where + ": unreadable key block");
      } else {
        lw.hi = w.hi;
      }
      next_want.insert(next_want.end() - s.count(), std::move(lw));
    }
    return Status::OK();
  });
  PMINDEX_RETURN_IF_ERROR(st);
  if (at != want.size()) return Status::Corrupt("wbtree: leaf chain is shorter than its parents say");
  if (meta_->spare_root) return Status::Corrupt("wbtree: spare root in use");
  if (meta_->free_leaf || meta_->free_prev || meta_->free_parent) return Status::Corrupt("wbtree: leaf-free log in use");
  for (const SplitLog& l : meta_->logs)
    if (l.old_node || l.new_node) return Status::Corrupt("wbtree: split log in use");
  return Status::OK();
}

template <bool BK>
Status WBTree<BK>::ForEachOwnedBlock(const std::function<void(uint64_t)>& fn) {
  if (closed()) return IndexClosed();
  fn(*pool_->root_slot());
  if (meta_->spare_root) fn(meta_->spare_root);
  if (meta_->free_leaf) fn(meta_->free_leaf);
  for (const SplitLog& l : meta_->logs)
    if (l.new_node) fn(l.new_node);
  return WalkLevels([&](Node* n, uint32_t level) -> Status {
    fn(Off(n));
    for (uint32_t i = 0; i < n->cap; i++) {
      if (!(Valid(n) >> i & 1)) continue;
      if (BK) fn(n->ents()[i].k);
      if (level == 0 && vbytes()) fn(n->ents()[i].v);
    }
    return Status::OK();
  });
}

#define PMINDEX_WBTREE_RECOVERY(BK)                                                        \
  template Status WBTree<BK>::Format();                                                    \
  template Status WBTree<BK>::Recover();                                                   \
  template Status WBTree<BK>::RecoverLog(int);                                             \
  template bool WBTree<BK>::SpareReferenced(const Node*, uint64_t) const;                  \
  template Status WBTree<BK>::EnsureChecked(Node*);                                        \
  template Status WBTree<BK>::Repair(Node*);                                               \
  template Status WBTree<BK>::Rebuild(Node*);                                              \
  template Status WBTree<BK>::WalkLevels(const std::function<Status(Node*, uint32_t)>&);   \
  template Status WBTree<BK>::Check();                                                     \
  template Status WBTree<BK>::ForEachOwnedBlock(const std::function<void(uint64_t)>&);
PMINDEX_WBTREE_RECOVERY(false)
PMINDEX_WBTREE_RECOVERY(true)

}  // namespace pmindex::internal::wbtree
