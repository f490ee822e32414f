// nvc_list.cc: the list operations of the NVC-Hashmap: search with
// unlink helping, insert/update/upsert, find, remove.
//
// Paper: Schwalb et al., IMDM'15, section 3.2 (Michael's lock-free list in
// split order) and 3.3 (4), figure 3 (the persist order of an insert), with
// the erratum handled as nvc_list.h states. The paper describes neither
// remove nor update: remove linearizes at the mark of a node's next word
// (Michael's list); updates store the value word in place and stay
// linearizable against a concurrent remove because a find reads the value
// word before the mark and an update checks the mark before its store.
//
// Invariants: the list is strictly sorted by (split-order key, key); a
// link's nonzero tag is a window of its node's split-order key (an insert's
// CAS writes the new node's; every other link store copies a link with its
// tag); a marked node's next never changes; a node is retired only by the thread
// whose CAS unlinked it, after that unlink was persisted.
//
// Persist order:
//   insert: take a free slab slot (or allocate the node into this thread's
//           pending slot), write and persist it (key, value, next) -> make
//           the link to the predecessor and the
//           link the CAS replaces durable (erratum) -> CAS pred.next
//           (linearization point; kDirty set in dirty_bit mode) -> persist
//           pred.next -> clear the pending slot (volatile) and kDirty.
//   update: [byte values: a new record allocated into the pending-value
//           slot and persisted] -> make the link to the node durable ->
//           count in (dirty_bit) -> if next is unmarked, store (u64) or CAS
//           (record) the value word (linearization point) -> persist ->
//           count out; a replaced record is retired.
//   remove: CAS node.next |= kMark (| kDirty) (linearization point) ->
//           persist -> clear kDirty, count out -> CAS pred.next to the
//           successor -> persist -> retire the node.
//   find:   the value word, then the mark (marked: absent, after making the
//           mark durable); then make the link and the value word durable.
// Every operation returns with every line it stored to flushed and fenced,
// apart from volatile stores whose durable state recovery ignores (kDirty
// and pending-slot clears).
//
// Thread safety: any number of threads, each operation inside an epoch
// guard (Op), so no node it reaches is freed under it.
#include <vector>

#include "nvc_hashmap/nvc_list.h"

namespace pmindex::internal::nvc {

// Finds the position of (so, key) from the dummy word `start`: prev_word is
// the word to CAS, curr_raw its exact value, curr the regular node it names
// (found: the key's node) or nullptr (a later dummy or the end); not found,
// curr may be a node the search did not load (see below). A dummy's so comes
// from the link naming it (SoDummy of its bucket), and a window of a regular
// node's from the link's tag (nvc_format.h), so a search that stops at the
// next bucket's dummy, or at a node whose tag sorts it past so, does not
// touch it.
void NvcHashmap::Search(const Start& start, uint64_t so, Slice key, const Ctx& c, Pos* pos) {
  // Without a fix (the paper's original algorithm) every link followed is
  // acted on unchecked: report each one to the observer, so pmcheck's erratum
  // lint sees every read of a not-yet-durable link.
  const bool report = fix() == Fix::kNone;
  auto load = [report](const uint64_t* w) { return report ? pm::LoadAcquire(w) : LoadW(w); };
  uint64_t prev_so;  // the split-order key of the dummy or node owning prev_word
retry:
  pos->pp_word = nullptr;
  pos->pp_raw = 0;
  pos->prev_word = start.word;
  pos->curr_raw = load(start.word);  // exact (a dummy's word may carry kUnpub, never kMark)
  prev_so = start.so;
  for (;;) {
    const uint64_t raw = pos->curr_raw;
    if (raw & kBucketLink) {
      // A dummy (or kEnd). Dummies are never marked: no unlink to help.
      pos->curr = nullptr;
      const uint64_t b = LinkBucket(raw);
      const uint64_t dso = SoDummy(b);
      uint64_t* w;
      if (b == 0 || dso >= so || !(w = BucketSlot(b, false))) {
        pos->found = b != 0 && dso == so;
        return;
      }
      pos->pp_word = pos->prev_word;
      pos->pp_raw = raw;
      pos->prev_word = w;
      pos->curr_raw = load(w);
      prev_so = dso;
      continue;
    }
    Node* curr = N(raw);
    pos->curr = curr;
    // A tag above so: curr sorts past (so, key), so the position is found
    // without loading curr (the common end of a search: one miss less). curr
    // may be marked; an insert links before it all the same, and a later
    // search that passes it unlinks it.
    if (!curr || TagAbove(raw, prev_so, so)) {  // !curr: a 0 link (never written; Check reports it)
      pos->found = false;
      return;
    }
    const uint64_t next_raw = load(&curr->next);
    if (next_raw & kMark) {
      const uint64_t unlinked = HelpUnlink(pos->prev_word, raw, curr, next_raw, c);
      if (!unlinked) goto retry;
      pos->curr_raw = unlinked;
      continue;
    }
    const int r = Cmp(curr, so, key);
    if (r < 0) {
      pos->pp_word = pos->prev_word;
      pos->pp_raw = pos->curr_raw;
      pos->prev_word = &curr->next;
      pos->curr_raw = next_raw;
      prev_so = curr->so;
      continue;
    }
    pos->found = (r == 0);
    return;
  }
}

// Unlinks the marked node curr from *prev_word, which held curr_raw. Returns
// the word's new value, or 0 if *prev_word changed.
uint64_t NvcHashmap::HelpUnlink(uint64_t* prev_word, uint64_t curr_raw, Node* curr, uint64_t next_raw, const Ctx& c) {
  // The deletion (and curr's own next, which the new link copies) must be
  // durable before the node disappears from the volatile list.
  EnsureDelDurable(curr);
  uint64_t exp = curr_raw;
  const uint64_t desired = Succ(next_raw) | KeepUnpub(curr_raw);
  if (!pm::Cas(prev_word, &exp, desired)) return 0;
  pm::Persist(prev_word, 8);
  Retire(c, Off(curr), true);
  return desired;
}

// A regular node, allocated into this thread's pending slot, written and
// persisted. Non-compact nodes take >= 64 bytes, so they are 64-byte aligned
// and their header is one cache line (next, so and value persist together); compact
// nodes take a 32-byte slab slot (32-byte aligned: one line too), or a
// 64-byte block with node_alloc=allocator. A u64 value lives in the value
// word; a byte value in a record after the key.
Status NvcHashmap::AllocNode(const Ctx& c, uint64_t so, Slice key, Slice value, uint64_t next, Node** out) {
  const uint64_t vsize = ValueRecSize(value);
  const uint64_t voff = compact_ ? sizeof(CompactNode) : kHeader + A8(key.size());
  const uint64_t size = compact_ && slab_ ? sizeof(CompactNode) : (voff + vsize + 63) & ~uint64_t(63);
  const int cls = slab_ ? ClassOf(size) : -1;
  Node* n;
  if (cls >= 0) {
    // A slab slot: volatile bookkeeping only; an unlinked slot is free by
    // definition (recovery frees everything unreachable), so no pending slot.
    uint64_t off;
    Status s = SlabAlloc(c, cls, &off);
    if (!s.ok()) return s;
    n = N(off);
  } else {
    Status s = pool_->allocator().Allocate(&c.ps->pending, size);
    if (s.IsPoolFull() && ReclaimForSpace(c)) s = pool_->allocator().Allocate(&c.ps->pending, size);
    if (!s.ok()) return s;
    n = N(c.ps->pending);
  }
  // Built in a buffer (on the stack for slab-sized nodes), then one copy.
  alignas(64) char small[256];
  static thread_local std::vector<char> big;
  char* buf = small;
  if (size > sizeof(small)) {
    big.resize(size);
    buf = big.data();
  }
  if (compact_) {
    CompactNode cn;
    cn.next = next;
    cn.so = so;
    std::memcpy(&cn.value, value.data(), 8);
    std::memcpy(&cn.key, key.data(), 8);
    pm::Copy(n, &cn, sizeof(cn));
    if (!PMINDEX_FAULT("nvc.insert.skip_node_persist")) pm::Persist(n, sizeof(cn));
    *out = n;
    return Status::OK();
  }
  std::memset(buf + kHeader + key.size(), 0, voff - kHeader - key.size());  // key padding
  Node h{};
  h.next = next;
  h.so = so;
  h.klen = uint32_t(key.size());
  h.flags = cls >= 0 ? (kSlabFlag | uint32_t(cls) << 4) : 0;
  if (vk_ == ValueKind::kU64) std::memcpy(&h.value, value.data(), 8);
  else h.value = Off(n) + voff;
  std::memcpy(buf, &h, kHeader);
  std::memcpy(buf + kHeader, key.data(), key.size());
  if (vk_ == ValueKind::kBytes) {
    uint64_t len = value.size();
    std::memcpy(buf + voff, &len, 8);
    if (len) std::memcpy(buf + voff + 8, value.data(), len);
  }
  const size_t used = voff + vsize;
  pm::Copy(n, buf, used);
  if (!PMINDEX_FAULT("nvc.insert.skip_node_persist")) pm::Persist(n, used);
  *out = n;
  return Status::OK();
}

// The persist every dirty_bit helper shares (EnsureWordDurable,
// EnsureDelDurable): its callers meet dirty words only in race windows
// (another thread's link, unlink or mark not yet persisted), some of them
// too rarely for pmcheck's CI lines to crash inside each caller's inlined
// copy 20 times; one out-of-line copy is one site, reached from all of them.
// The path is taken only when a word is dirty, so the call costs nothing on
// the clean fast path. Order: persist, then clear kDirty, because a reader
// that sees the bit clear acts on the word without persisting it.
__attribute__((noinline)) void NvcHashmap::PersistDirtyWord(uint64_t* w) {
  const uint64_t v = pm::LoadAcquire(w);
  pm::Persist(w, 8);
  if (v & kDirty) ClearDirty(w, v);
  asm volatile("" ::: "memory");  // keeps the fence's observer call out of tail position
}

// An out-of-line byte-value record (byte values only), allocated into the
// thread's pending_val slot, written and persisted.
Status NvcHashmap::AllocValue(const Ctx& c, Slice value, uint64_t* out) {
  const size_t size = ValueRecSize(value);
  Status s = pool_->allocator().Allocate(&c.ps->pending_val, size);
  if (s.IsPoolFull() && ReclaimForSpace(c)) s = pool_->allocator().Allocate(&c.ps->pending_val, size);
  if (!s.ok()) return s;
  char* p = base_ + c.ps->pending_val;
  static thread_local std::vector<char> buf;
  uint64_t len = value.size();
  buf.resize(8 + len);
  std::memcpy(buf.data(), &len, 8);
  if (len) std::memcpy(buf.data() + 8, value.data(), len);
  pm::Copy(p, buf.data(), 8 + len);
  pm::Persist(p, size);
  *out = c.ps->pending_val;
  return Status::OK();
}

Status NvcHashmap::Put(Slice key, Slice value, PutMode mode) {
  if (closed_) return IndexClosed();
  PMINDEX_RETURN_IF_ERROR(Validate(key, value));
  const uint64_t h = HashKey(kk_, key), so = SoRegular(h);
  PrefetchBucket(h);  // segments are never freed while open: no epoch needed
  Op op(this);
  if (!op.ok()) return BusyStatus();
  const Ctx c = op.ctx();
  const Start start = StartFor(h, c, mode != PutMode::kUpdate);
  Node* fresh = nullptr;   // our node, owned by c.ps->pending until linked
  uint64_t fresh_val = 0;  // our value record, owned by c.ps->pending_val
  Status result;
  Pos pos;
  for (;;) {
    Search(start, so, key, c, &pos);
    if (pos.found) {
      // Search saw the node unmarked (present).
      Node* cur = pos.curr;
      if (mode == PutMode::kInsert) {
        EnsureWordDurable(pos.prev_word, pos.curr_raw);
        result = Status::AlreadyExists();
        break;
      }
      uint64_t nv;  // the new value word
      if (vk_ == ValueKind::kU64) {
        std::memcpy(&nv, value.data(), 8);
      } else {
        if (!fresh_val) {
          result = AllocValue(c, value, &fresh_val);
          if (!result.ok()) break;
        }
        nv = fresh_val;
      }
      // The update acts on the node being present: its link must be durable.
      EnsureWordDurable(pos.prev_word, pos.curr_raw);
      // In-place update of the value word (docs/nvc_hashmap.md, "Updates in
      // place"): count in (dirty_bit), store unless the node is marked, persist
      // the word, count out. A store that lands after a concurrent remove's
      // mark is linearized just before that mark: it is never observable
      // (finds read the value word, then check the mark).
      std::atomic<uint64_t>* stripe = dirty_mode() ? &UpdStripe(cur) : nullptr;
      if (stripe) stripe->fetch_add(1, std::memory_order_seq_cst);
      uint64_t old = LoadW(&cur->value);
      bool deleted = false;
      for (;;) {
        if (LoadW(&cur->next) & kMark) {
          deleted = true;
          break;
        }
        if (auto hook = g_before_value_hook.load(std::memory_order_acquire)) hook(key);
        if (vk_ == ValueKind::kU64) {
          pm::StoreAtomic(&cur->value, nv);
          break;
        }
        if (pm::Cas(&cur->value, &old, nv)) break;
      }
      if (!deleted) {
        if (auto hook = g_value_hook.load(std::memory_order_acquire)) hook(key);
        pm::Persist(&cur->value, 8);
      }
      if (stripe) stripe->fetch_sub(1, std::memory_order_release);
      if (deleted) {
        if (mode == PutMode::kUpdate) {
          EnsureDelDurable(cur);
          result = Status::NotFound();
          break;
        }
        continue;  // upsert: the search unlinks the marked node, then we insert
      }
      if (vk_ == ValueKind::kBytes) {
        ClearPending(&c.ps->pending_val);
        fresh_val = 0;
        if (HasRecord(cur, old)) Retire(c, old, false);
      }
      result = Status::OK();
      break;
    }
    if (mode == PutMode::kUpdate) {
      result = Status::NotFound();
      break;
    }
    const uint64_t succ = Succ(pos.curr_raw);
    if (!fresh) {
      result = AllocNode(c, so, key, value, succ, &fresh);
      if (!result.ok()) break;
    } else if (fresh->next != succ) {
      pm::StoreAtomic(&fresh->next, succ);
      if (!PMINDEX_FAULT("nvc.insert.skip_node_persist")) pm::Persist(&fresh->next, 8);
    }
    // Erratum: we are about to link behind prev; the link to prev must be
    // durable, or a crash could keep our node but lose prev.
    EnsureWordDurable(pos.pp_word, pos.pp_raw);
    // And the link we replace: our node copies it without kDirty, so once
    // linked, a find reaching its target through our node sees only clean
    // links while the target's own insert (in flight) may never have made
    // it durable; a crash before our link is persisted loses the target
    // that find returned (pmcheck's 8-thread line, lost reads).
    EnsureWordDurable(pos.prev_word, pos.curr_raw);
    if (auto hook = g_before_link_hook.load(std::memory_order_acquire)) hook(key);
    uint64_t exp = pos.curr_raw;
    const uint64_t desired = Off(fresh) | NewTag(so) | (dirty_mode() ? kDirty : 0) | KeepUnpub(exp);
    if (!pm::Cas(pos.prev_word, &exp, desired)) continue;
    if (auto hook = g_link_hook.load(std::memory_order_acquire)) hook(key);
    const bool skip_link = PMINDEX_FAULT("nvc.insert.skip_link_persist");
    if (!skip_link) pm::Persist(pos.prev_word, 8);
    if (!IsSlabNode(fresh)) ClearPending(&c.ps->pending);
    if (dirty_mode()) ClearDirty(pos.prev_word, desired);
    fresh = nullptr;
    c.st->delta.fetch_add(1, std::memory_order_relaxed);
    c.st->unpushed++;
    MaybeGrow(c);
    result = Status::OK();
    break;
  }
  const bool fresh_block = fresh && !IsSlabNode(fresh);
  if (fresh && !fresh_block) {
    // Never linked. Format 7: a free slot's next is 0 or marked (recovery's
    // slab scan takes an unmarked one for a node), durably before the slot
    // is reused.
    pm::StoreAtomic(&fresh->next, uint64_t(0));
    if (!PMINDEX_FAULT("nvc.insert.skip_failed_zero_persist")) pm::Persist(&fresh->next, 8);
    SlabFree(c.st, Off(fresh), SlabClassOf(fresh));
  }
  if (fresh_block) pool_->allocator().FreeOrAbort(&c.ps->pending);
  if (fresh_val) pool_->allocator().FreeOrAbort(&c.ps->pending_val);
  if (fresh_block || fresh_val) pm::Fence();  // Free leaves its lane clear to our next fence
  return result;
}

Status NvcHashmap::Find(Slice key, std::string* value) {
  if (closed_) return IndexClosed();
  PMINDEX_RETURN_IF_ERROR(ValidateKey(kk_, max_key_, key));
  const uint64_t h = HashKey(kk_, key), so = SoRegular(h);
  PrefetchBucket(h);  // segments are never freed while open: no epoch needed
  Op op(this);
  if (!op.ok()) return BusyStatus();
  const Ctx c = op.ctx();
  Pos pos;
  // Finds never initialise buckets (that would flush on the read path): an
  // uninitialised bucket is searched from its nearest published ancestor.
  Search(StartFor(h, c, false), so, key, c, &pos);
  if (!pos.found) return Status::NotFound();
  Node* cur = pos.curr;
  if (auto hook = g_find_hook.load(std::memory_order_acquire)) hook(key);
  // The value word first, then the mark: a value stored after a remove's
  // mark (a late in-place update) is then never returned (test
  // NvcHashmapErratum.FindNeverReturnsAValueStoredAfterTheMark).
  const uint64_t v = LoadW(&cur->value);
  if (LoadW(&cur->next) & kMark) {
    EnsureDelDurable(cur);
    return Status::NotFound();
  }
  // The answer depends on the link to the node and on its value word.
  switch (fix()) {
    case Fix::kNone:
      pm::LoadAcquire(pos.prev_word);
      pm::LoadAcquire(&cur->value);
      break;
    case Fix::kFlushOnRead:
      pm::LoadAcquire(pos.prev_word);
      pm::LoadAcquire(&cur->value);
      pm::Flush(pos.prev_word, 8);
      pm::Flush(&cur->value, 8);
      pm::Fence();
      break;
    case Fix::kDirtyBit:
      EnsureWordDurable(pos.prev_word, pos.curr_raw);
      // An update of this node (or a node sharing its stripe) is in flight:
      // the value we read may not be durable yet; persist it (helping).
      if (UpdStripe(cur).load(std::memory_order_acquire) != 0) {
        pm::LoadAcquire(&cur->value);
        pm::Persist(&cur->value, 8);
      }
      break;
  }
  if (value) ReadValue(v, value);
  return Status::OK();
}

Status NvcHashmap::Remove(Slice key) {
  if (closed_) return IndexClosed();
  PMINDEX_RETURN_IF_ERROR(ValidateKey(kk_, max_key_, key));
  const uint64_t h = HashKey(kk_, key), so = SoRegular(h);
  PrefetchBucket(h);  // segments are never freed while open: no epoch needed
  Op op(this);
  if (!op.ok()) return BusyStatus();
  const Ctx c = op.ctx();
  const Start start = StartFor(h, c, false);
  Pos pos;
  Search(start, so, key, c, &pos);
  if (!pos.found) return Status::NotFound();
  Node* cur = pos.curr;
  uint64_t n = LoadW(&cur->next);
  uint64_t desired;
  for (;;) {
    if (n & kMark) {
      EnsureDelDurable(cur);
      return Status::NotFound();
    }
    // Linearization point: the mark (published with kDirty in dirty_bit
    // mode, like a link). It freezes next: no insert behind the node, and
    // in-place updates check it before storing.
    desired = n | kMark | (dirty_mode() ? kDirty : 0);
    if (pm::Cas(&cur->next, &n, desired)) break;
  }
  if (auto hook = g_mark_hook.load(std::memory_order_acquire)) hook(key);
  const bool skip_mark = PMINDEX_FAULT("nvc.remove.skip_mark_persist");
  if (!skip_mark) pm::Persist(&cur->next, 8);
  if (dirty_mode()) ClearDirty(&cur->next, desired);
  // Counted out once the mark is durable, as an insert is counted in once its
  // link is: Size never reflects a change a crash can still undo.
  c.st->delta.fetch_sub(1, std::memory_order_relaxed);
  if (--c.st->unpushed <= -64) PushCount(c);
  // Physical unlink: one attempt here; otherwise a search unlinks it.
  uint64_t exp = pos.curr_raw;
  if (pm::Cas(pos.prev_word, &exp, Succ(n) | KeepUnpub(exp))) {
    pm::Persist(pos.prev_word, 8);
    Retire(c, Off(cur), true);
  } else {
    Search(start, so, key, c, &pos);
  }
  return Status::OK();
}

}  // namespace pmindex::internal::nvc
