// wbtree_read.cc: wBTree's lock-free readers (PiBench sec. 3.1 and 5.4;
// docs/wbtree.md, "Concurrency"): the optimistic descent shared by every
// operation, Find (binary search through the slot array of every node),
// Scan (records come out sorted from each leaf's slot array: no sort step),
// and Size (a walk of the leaf chain).
//
// Invariants relied on: a writer holds a node's version lock from before
// its first store to it until after the fence that makes the change
// durable, so a read validated against an unlocked version saw a durable
// state; a node's level never changes while it is in the tree; leftmost
// pointers change only when a leftmost leaf is freed, never along the
// tree's left edge (its first leaf and inner nodes are never freed).
//
// Persist order: none (readers store nothing to PM; EnsureChecked may
// repair a node under its lock, wbtree_recovery.cc).
//
// Thread safety: all of these run concurrently with each other and with
// writers; a scan's callback runs outside every epoch guard and may call
// any operation of the tree. A validated read of damage (an index or block out of range)
// returns Corrupt; an unvalidated one retries.
#include "kit/pm_block.h"
#include "wbtree/wbtree_tree.h"

namespace pmindex::internal::wbtree {

template <bool BK>
Status WBTree<BK>::DescendToLeaf(Slice key, Node** leaf, uint64_t* v) {
  kit::Backoff bo;
  const KeyCtx c = Ctx();
  const uint64_t k = BK ? 0 : KeyU64(key);
  // The pool's size, read once per descent: it only grows, so a node that
  // passes the check against it is inside the pool; one that fails is
  // checked again against the current size before it counts as damage.
  uint64_t pool_size = pool_->size();
  const uint64_t span = NodeBytes(std::max(leaf_cap_, inner_cap_));
  auto node_ok = [&](uint64_t off) {
    if (off && off % 64 == 0 && off + span <= pool_size) return true;
    pool_size = pool_->size();
    return NodeOk(off);
  };
  for (;;) {
    const uint64_t off = Ld(&meta_->root);
    if (!node_ok(off)) return Status::Corrupt("wbtree root pointer out of the pool");
    Node* n = N(off);
    LockWord* nw = &LW(n);  // the lock word of n (computed once per node)
    if (!__atomic_load_n(&nw->checked, __ATOMIC_ACQUIRE)) PMINDEX_RETURN_IF_ERROR(EnsureChecked(n));
    uint64_t ver;
    if (!nw->lock.ReadBegin(&ver) || Ld(&meta_->root) != off) {
      bo.Wait();
      continue;
    }
    bool restart = false;
    for (;;) {
      const uint32_t level = LdR(&n->level);
      if (level == 0) break;
      uint64_t child;
      if constexpr (!BK) child = ChildForU64(n, NodeSlots{n}, inner_cap_, k);
      else child = ChildFor<BK>(c, n, NodeSlots{n}, inner_cap_, key);
      if (!node_ok(child) || level >= uint32_t(kMaxLevels)) {
        if (!nw->lock.Validate(ver)) {
          restart = true;
          break;
        }
        return Status::Corrupt("wbtree inner node at " + std::to_string(Off(n)) + " has a bad slot array or child");
      }
      // The child's lines are fetched at once: its binary search touches
      // its header, its slot array and a few entry lines in a dependent
      // chain, each of which would otherwise miss on its own.
      Node* ch = N(child);
      const char* p = reinterpret_cast<const char*>(ch);
      const uint64_t bytes = NodeBytes(level == 1 ? leaf_cap_ : inner_cap_);
      for (uint64_t o = 0; o < bytes; o += 64) __builtin_prefetch(p + o);
      // The child's version is read before the parent is validated: one
      // validation covers both the child pointer and the version (a stale
      // pointer inside the pool only reads a lock word of the table).
      LockWord* cw = &LW(ch);
      uint64_t cv;
      const bool readable = cw->lock.ReadBegin(&cv);
      if (!nw->lock.Validate(ver)) {
        restart = true;
        break;
      }
      if (!__atomic_load_n(&cw->checked, __ATOMIC_ACQUIRE)) {
        // First touch since open: repair, then descend again (the repair
        // may have changed the child under the version just read).
        PMINDEX_RETURN_IF_ERROR(EnsureChecked(ch));
        restart = true;
        break;
      }
      if (!readable) {
        restart = true;
        break;
      }
      if (LdR(&ch->level) != level - 1) {
        if (!cw->lock.Validate(cv)) {
          restart = true;
          break;
        }
        return Status::Corrupt("wbtree node at " + std::to_string(child) + " has the wrong level");
      }
      n = ch;
      nw = cw;
      ver = cv;
    }
    if (restart) {
      bo.Wait();
      continue;
    }
    *leaf = n;
    *v = ver;
    return Status::OK();
  }
}

template <bool BK>
Status WBTree<BK>::ReadValue(const Entry* e, std::string* out) const {
  const uint64_t w = LdR(&e->v);
  if (!vbytes()) {
    out->assign(reinterpret_cast<const char*>(&w), 8);
    return Status::OK();
  }
  if (!kit::TryReadBlock(base_, pool_->size(), w, max_value_, out)) return kit::BlockOutOfRange(w, pool_->size());
  return Status::OK();
}

template <bool BK>
Status WBTree<BK>::Find(Slice key, std::string* value) {
  if (closed()) return IndexClosed();
  PMINDEX_RETURN_IF_ERROR(ValidateKey(key_kind(), max_key_, key));
  const KeyCtx c = Ctx();
  const uint64_t k = BK ? 0 : KeyU64(key);
  std::string tmp;  // read before validation: never into the caller's (maybe null) value
  EpochManager::Guard g(epoch_);
  kit::Backoff bo;
  for (;;) {
    Node* l;
    uint64_t v;
    PMINDEX_RETURN_IF_ERROR(DescendToLeaf(key, &l, &v));
    const NodeSlots s{l};
    bool ok, eq;
    uint32_t x = 0;
    if constexpr (!BK) {
      // u64 keys: the search's last probe is the entry itself.
      U64Hit h;
      ok = SearchU64(l, s, leaf_cap_, k, &h);
      eq = h.eq(k);
      x = h.x;
    } else {
      uint32_t pos;
      ok = LowerBound<BK>(c, l, s, leaf_cap_, key, &pos, &eq);
      x = ok && eq ? s.at(pos + 1) : 0;
      ok = ok && x < leaf_cap_;
    }
    Status st = Status::NotFound();
    uint64_t vw = 0;
    if (ok && eq) {
      if (vbytes()) {
        st = ReadValue(&l->ents()[x], &tmp);
      } else {
        vw = LdR(&l->ents()[x].v);  // 8-byte values: a word, copied out after the validation
        st = Status::OK();
      }
    }
    if (!LW(l).lock.Validate(v)) {
      bo.Wait();
      continue;
    }
    if (!ok) return Status::Corrupt("wbtree leaf at " + std::to_string(Off(l)) + " has a bad slot array or key block");
    if (st.ok() && value) {
      if (vbytes()) value->swap(tmp);
      else value->assign(reinterpret_cast<const char*>(&vw), 8);
    }
    return st;
  }
}

template <bool BK>
Status WBTree<BK>::Scan(Slice start, size_t n, ScanCallback cb, size_t* count) {
  if (count) *count = 0;
  if (closed()) return IndexClosed();
  PMINDEX_RETURN_IF_ERROR(ValidateKey(key_kind(), max_key_, start));
  const KeyCtx c = Ctx();
  std::string from(start);
  bool inclusive = true;
  size_t done = 0;
  std::vector<std::pair<std::string, std::string>> buf;
  // 8-byte keys and values: records are copied as words, not strings (the
  // scan's per-record cost is this copy; docs/wbtree.md, "Scans").
  const bool words = !BK && !vbytes();
  std::vector<std::pair<uint64_t, uint64_t>> wbuf;
  if (words) wbuf.reserve(leaf_cap_);
  kit::Backoff bo;
  const uint64_t bound = pool_->size() / NodeBytes(min_cap_) + 1;  // leaves a chain can hold
  uint64_t steps = 0;
  // One round per leaf with records to emit: they are copied and validated
  // inside an epoch guard (leaves with none are passed in the same guard, so
  // every round makes progress), and the callback is called outside every
  // guard (so it may call Remove, whose leaf free waits for a grace period).
  // The next round starts from the sibling pointer if the epoch has not
  // advanced since that pointer was read (a leaf free advances it before the
  // leaf returns to the allocator), else by a descent from the last key
  // emitted. `steps` counts sibling-chain steps: more than the pool can hold
  // is a cycle.
  Node* l = nullptr;  // the next leaf, readable while the epoch is `at`
  uint64_t at = 0;
  bool first = true;  // l is the leaf `from` routes to; the ones after it hold only keys above it
  while (done < n) {
    uint64_t next = 0;
    bool restart = false;
    {
      EpochManager::Guard g(epoch_);
      uint64_t v = 0;
      if (l && epoch_.Epoch() != at) l = nullptr;
      if (l) {
        PMINDEX_RETURN_IF_ERROR(EnsureChecked(l));
        if (!LW(l).lock.ReadBegin(&v)) l = nullptr;
      }
      if (!l) {
        PMINDEX_RETURN_IF_ERROR(DescendToLeaf(from, &l, &v));
        first = true;
        steps = 0;  // a cycle shows within one walk; restarts must not add up
      }
      for (;;) {
        // Read before the sibling pointer: a free of the leaf it names is
        // visible to that read or advances the epoch after this one.
        at = epoch_.Epoch();
        std::atomic_thread_fence(std::memory_order_acquire);
        // Copy the records >= from (> from once one was emitted) in
        // slot-array order, then validate. A leaf reached by the sibling
        // chain is copied whole: its keys lie in ranges above the previous
        // leaf's, which holds `from`.
        buf.clear();
        wbuf.clear();
        Slots s;
        LoadSlots(l, &s);
        uint32_t pos = 0;
        bool eq = false;
        bool ok = s.count() <= leaf_cap_ && (!first || LowerBound<BK>(c, l, s, leaf_cap_, from, &pos, &eq));
        if (ok && eq && !inclusive) pos++;
        for (uint32_t i = pos; words && ok && i < s.count() && wbuf.size() < n - done; i++) {
          const uint32_t x = s.at(i + 1);
          if (x >= leaf_cap_) {
            ok = false;
            break;
          }
          const Entry* e = &l->ents()[x];
          wbuf.emplace_back(LdR(&e->k), LdR(&e->v));
        }
        for (uint32_t i = pos; !words && ok && i < s.count() && buf.size() < n - done; i++) {
          const uint32_t x = s.at(i + 1);
          if (x >= leaf_cap_) {
            ok = false;
            break;
          }
          const Entry* e = &l->ents()[x];
          buf.emplace_back();
          ok = ReadKeyWord<BK>(c, LdR(&e->k), &buf.back().first) && ReadValue(e, &buf.back().second).ok();
        }
        next = LdR(&l->next);
        if (!LW(l).lock.Validate(v)) {  // re-descend from `from`
          restart = true;
          break;
        }
        if (!ok) return Status::Corrupt("wbtree leaf at " + std::to_string(Off(l)) + " has a bad slot array or block");
        if (!wbuf.empty() || !buf.empty() || next == 0) break;
        // Nothing to emit here: the next leaf, in the same guard.
        if (++steps > bound) return Status::Corrupt("wbtree leaf chain longer than the pool can hold (a cycle)");
        if (!NodeOk(next)) return Status::Corrupt("wbtree leaf sibling pointer out of the pool");
        l = N(next);
        first = false;
        PMINDEX_RETURN_IF_ERROR(EnsureChecked(l));
        if (!LW(l).lock.ReadBegin(&v)) {
          restart = true;
          break;
        }
      }
      // The next leaf is read whole unless this one ends the scan: its lines
      // are fetched while the callback runs.
      if (!restart && next && done + wbuf.size() + buf.size() < n && NodeOk(next)) {
        const char* p = base_ + next;
        for (uint64_t o = 0; o < NodeBytes(leaf_cap_); o += 64) __builtin_prefetch(p + o);
      }
    }
    if (restart) {
      l = nullptr;
      bo.Wait();
      continue;
    }
    // Emitting: `from` and *count are set once per leaf (and before an
    // early return).
    for (const auto& [kw, vw] : wbuf) {
      done++;
      if (!cb(Slice(reinterpret_cast<const char*>(&kw), 8), Slice(reinterpret_cast<const char*>(&vw), 8))) {
        if (count) *count = done;
        return Status::OK();
      }
    }
    if (!wbuf.empty()) {
      if (count) *count = done;
      from.assign(reinterpret_cast<const char*>(&wbuf.back().first), 8);
      inclusive = false;
    }
    for (auto& [k, val] : buf) {
      done++;
      if (count) *count = done;
      from = k;
      inclusive = false;
      if (!cb(k, val)) return Status::OK();
    }
    if (done >= n || next == 0) return Status::OK();
    if (++steps > bound) return Status::Corrupt("wbtree leaf chain longer than the pool can hold (a cycle)");
    if (!NodeOk(next)) return Status::Corrupt("wbtree leaf sibling pointer out of the pool");
    l = N(next);
    first = false;
  }
  return Status::OK();
}

template <bool BK>
uint64_t WBTree<BK>::Size() {
  if (closed()) return 0;
  EpochManager::Guard g(epoch_);
  // The first leaf: the leftmost pointers along the tree's left edge never
  // change.
  uint64_t off = Ld(&meta_->root);
  for (int d = 0; d < kMaxLevels && NodeOk(off) && LdR(&N(off)->level) > 0; d++) off = Ld(&N(off)->leftmost);
  uint64_t total = 0;
  const uint64_t bound = pool_->size() / NodeBytes(min_cap_) + 1;
  kit::Backoff bo;
  for (uint64_t steps = 0; NodeOk(off) && steps < bound; steps++) {
    Node* l = N(off);
    uint64_t v, bm, next;
    for (;;) {
      if (LW(l).lock.ReadBegin(&v)) {
        bm = Valid(l);
        next = LdR(&l->next);
        if (LW(l).lock.Validate(v)) break;
      } else if (v & kit::VersionLock::kObsolete) {
        // An empty leaf being freed (the guard keeps it readable): its
        // next pointer is the one its left neighbour now holds.
        bm = 0;
        next = LdR(&l->next);
        break;
      }
      bo.Wait();
    }
    total += __builtin_popcountll(bm & CapMask(leaf_cap_));
    off = next;
  }
  return total;
}

#define PMINDEX_WBTREE_READ(BK)                                                        \
  template Status WBTree<BK>::DescendToLeaf(Slice, Node**, uint64_t*);                 \
  template Status WBTree<BK>::ReadValue(const Entry*, std::string*) const;             \
  template Status WBTree<BK>::Find(Slice, std::string*);                               \
  template Status WBTree<BK>::Scan(Slice, size_t, ScanCallback, size_t*);              \
  template uint64_t WBTree<BK>::Size();
PMINDEX_WBTREE_READ(false)
PMINDEX_WBTREE_READ(true)

}  // namespace pmindex::internal::wbtree
