// nvtree/nvtree_smo.cc: NV-Tree's leaf replacement and inner-node rebuild
// (PiBench sec. 3.2 and 5.4 "Insert": a full leaf is replaced by two new
// leaves; the inner nodes are rebuilt when a parent of leaves overflows).
//
// A full leaf (no room for the entries of the write that found it full) is
// replaced according to its live records L (cap = leaf capacity):
//   L > cap / 2     split: two new leaves with half of the records each;
//   0 < L <= cap/2  compaction (a leaf mostly of tombstones): one new leaf;
//   L = 0           unlink: the leaf is freed and its key range joins its
//                   left neighbour in the same PLN (or the right one if it
//                   is the PLN's first); a PLN's last leaf is compacted
//                   instead, into an empty leaf.
//
// Persist order (micro-log root->log, nvtree_format.h):
//   1. log.link = offset of the word pointing at the old leaf (the left
//      neighbour's next, or head), log.old = old; one line, persisted.
//   2. the new leaves are allocated into log.a / log.b (the allocator makes
//      each offset durable: the log owns them), filled with the live records
//      as inserts (a.next = b or old.next, b.next = old.next) and flushed,
//      fence. In DRAM the new leaves' locks are taken (NewBorn) and their
//      key filters written (nvtree_tree.h).
//   3. *link = a (unlink: old.next), persisted: the commit. From here the
//      list owns a and b and the log owns old.
//   4. DRAM: the PLN is replaced copy-on-write, or all inner nodes rebuilt if
//      it overflows; the new leaves' version words are unlocked and the old
//      leaf's marked obsolete.
//   5. after an epoch grace period (no reader stands on the old leaf or the
//      old PLN): byte keys/values: the old leaf's blocks that the new leaves
//      do not reference are freed (a shared block through its first word);
//      the old leaf is freed through log.old (0 durable); then log.a, log.b,
//      log.link are cleared and persisted.
// Recovery (nvtree_recovery.cc) rolls back when *link still points at
// log.old (frees log.a, log.b: their entries share the old leaf's blocks, so
// only the leaves are freed), otherwise rolls forward (step 5). A crash at
// any instant leaks nothing.
// Fault switches: nvtree.replace.skip_leaf_flush (step 2 unflushed),
// nvtree.replace.free_before_swap (byte keys/values: the old leaf's blocks
// freed before the commit). Step 1 needs none: the allocator's persist of
// log.a in step 2 carries the same line.
//
// Thread safety: Replace runs under smo_mu_ with the old leaf locked by the
// caller; it waits for no leaf lock, and waits for the grace period outside
// every epoch guard.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <unordered_map>

#include "nvtree/nvtree_tree.h"
#include "pmindex/pm/fault.h"

namespace pmindex::internal::nvtree {

template <bool kBytes>
Status NVTree<kBytes>::AllocLeaf(uint64_t* dest, bool spare_ok) {
  pm::Allocator& alloc = pool_->allocator();
  Status st = pointers_ ? alloc.AllocateZeroed(dest, leaf_bytes_) : alloc.Allocate(dest, leaf_bytes_);
  if (st.ok() || !st.IsPoolFull() || !spare_ok || !root_->spare) return st;
  const uint64_t s = root_->spare;  // the spare moves into *dest
  pm::StorePersist(dest, s);
  pm::StorePersist(&root_->spare, uint64_t(0));
  if (pointers_) {  // scratch words must be 0 (nvtree_format.h)
    pm::Set(L(s), 0, leaf_bytes_);
    pm::Flush(L(s), leaf_bytes_);
  }
  return Status::OK();
}

template <bool kBytes>
void NVTree<kBytes>::FillLeaf(uint64_t off, const std::vector<Rec>& recs, size_t lo, size_t hi, uint64_t next) {
  char* d = L(off);
  std::vector<Entry> buf;
  buf.reserve(hi - lo);
  for (size_t i = lo; i < hi; i++) buf.push_back(Entry{kInsert, recs[i].kw, recs[i].vw});
  if (!buf.empty()) pm::Copy(E(d, 0), buf.data(), buf.size() * kEntryBytes);
  pm::StoreAtomic(Next(d), next, __ATOMIC_RELAXED);
  pm::StoreAtomic(Count(d), uint64_t(buf.size()), __ATOMIC_RELAXED);
  if (!PMINDEX_FAULT("nvtree.replace.skip_leaf_flush")) pm::Flush(d, kLeafHeader + buf.size() * kEntryBytes);
}

template <bool kBytes>
Status NVTree<kBytes>::FreeDeadBlocks(char* l, const std::vector<uint64_t>& keep) {
  std::vector<uint64_t*> words;
  for (uint64_t j = 0; j < cap_; j++) {
    if (kBytes) words.push_back(&E(l, j)->key);
    if (vbytes_) words.push_back(&E(l, j)->value);
  }
  std::unordered_map<uint64_t, size_t> first;
  for (size_t x = 0; x < words.size(); x++)
    if (uint64_t w = Ld(words[x])) first.emplace(w, x);
  for (size_t x = words.size(); x-- > 0;) {
    const uint64_t w = Ld(words[x]);
    if (!w || std::binary_search(keep.begin(), keep.end(), w)) continue;
    if (first[w] < x) {  // a later reference of a shared block: drop it first
      pm::StoreAtomic(words[x], uint64_t(0));
      pm::Persist(words[x], 8);
    } else {
      PMINDEX_RETURN_IF_ERROR(pool_->allocator().Free(words[x]));
    }
  }
  return Status::OK();
}

template <bool kBytes>
void NVTree<kBytes>::RetireDram() {
  for (auto* p : dead_plns_) delete p;
  for (auto* i : dead_inners_) delete i;
  dead_plns_.clear();
  dead_inners_.clear();
}

template <bool kBytes>
Status NVTree<kBytes>::CompactAll() {
  struct Todo {
    uint64_t leaf, v;
    K k;
  };
  std::vector<Todo> todo;  // leaves with dead entries: version read, a key
  {
    EpochManager::Guard g(epoch_);
    Inner<K>* in = inner_.load(std::memory_order_acquire);
    std::vector<Rec> recs;
    for (size_t p = 0; p < in->plns(); p++) {
      for (uint64_t leaf : in->pln(p)->leaves) {
        kit::VersionLock* vl = VL(leaf);
        uint64_t v;
        if (!vl->ReadBegin(&v)) continue;
        const uint64_t c = LdAcq(Count(L(leaf)));
        const bool ok = c <= cap_ && Records(L(leaf), c, false, &recs);
        if (!vl->Validate(v) || !ok || recs.size() == c) continue;
        K k{};
        if (!ReadKey(Ld(&E(L(leaf), 0)->key), &k)) continue;
        todo.push_back(Todo{leaf, v, std::move(k)});
      }
    }
  }
  for (Todo& t : todo) {
    // A leaf written or replaced since (its address possibly reused by a
    // new leaf) holds a newer version: TryLock refuses it.
    if (!VL(t.leaf)->TryLock(t.v)) continue;
    PMINDEX_RETURN_IF_ERROR(Replace(t.leaf, t.k, t.v, false, 0, true));
  }
  return Status::OK();
}

template <bool kBytes>
void NVTree<kBytes>::Rebuild(const std::vector<K>& lows, const std::vector<uint64_t>& leaves) {
  auto* ni = new Inner<K>(lows, leaves, std::max<uint32_t>(1, pln_cap_ / 2), fanout_);
  dead_inners_.push_back(inner_.exchange(ni, std::memory_order_acq_rel));
}

template <bool kBytes>
Status NVTree<kBytes>::Replace(uint64_t leaf, const K& k, uint64_t v, bool drop, uint32_t need, bool compact) {
  std::lock_guard<std::mutex> lk(smo_mu_);
  kit::VersionLock* vl = VL(leaf);
  Inner<K>* in = inner_.load(std::memory_order_relaxed);
  const Route r = RouteKey(in, k);
  char* l = L(leaf);
  const uint64_t c = Ld(Count(l));
  std::vector<Rec> live;
  if (r.leaf != leaf || !Records(l, c, false, &live)) {
    UnlockUnchanged(vl, v);
    return Status::Corrupt("nvtree: leaf " + std::to_string(leaf) + " unreadable or not where the inner nodes route");
  }
  if (drop) live.erase(std::remove_if(live.begin(), live.end(), [&](const Rec& x) { return x.key == k; }), live.end());
  const size_t nl = live.size();
  uint64_t prev = 0;
  if (r.i > 0) {
    prev = r.pln->leaves[r.i - 1];
  } else {
    for (size_t p = r.p; p-- > 0;) {
      if (Pln<K>* q = in->pln(p); q->size()) {
        prev = q->leaves.back();
        break;
      }
    }
  }
  uint64_t* link = prev ? Next(L(prev)) : &root_->head;
  const bool unlink = nl == 0 && r.pln->size() > 1;
  bool split = !compact && nl > cap_ / 2;
  const uint64_t next = Ld(Next(l));
  ReplaceLog* lg = &root_->log;
  pm::Allocator& alloc = pool_->allocator();

  // 1. the log names the link and the old leaf
  pm::StoreAtomic(&lg->link, pool_->OffsetOf(link), __ATOMIC_RELAXED);
  pm::StoreAtomic(&lg->old, leaf, __ATOMIC_RELAXED);
  pm::Persist(lg, 16);
  auto abort = [&](const Status& st) {
    if (lg->a) alloc.FreeOrAbort(&lg->a);
    if (lg->b) alloc.FreeOrAbort(&lg->b);
    pm::StoreAtomic(&lg->old, uint64_t(0));
    pm::StoreAtomic(&lg->link, uint64_t(0));
    pm::Persist(lg, 16);
    UnlockUnchanged(vl, v);
    return st;
  };
  // 2. the new leaves, owned by the log. In a full pool a split falls back
  // to a compaction when the records and the caller's entries fit one leaf;
  // a compaction frees as much as it allocates and may take the spare.
  K sepb{};
  if (!unlink) {
    if (split) {
      Status st = AllocLeaf(&lg->a, false);
      if (st.ok()) st = AllocLeaf(&lg->b, false);
      if (!st.ok()) {
        if (!st.IsPoolFull() || nl + need > cap_) return abort(st);
        if (lg->a) alloc.FreeOrAbort(&lg->a);
        split = false;
      }
    }
    if (!split) {
      if (Status st = AllocLeaf(&lg->a, true); !st.ok()) return abort(st);
    }
    const size_t cut = split ? nl / 2 : nl;
    FillLeaf(lg->a, live, 0, cut, split ? lg->b : next);
    if (split) {
      FillLeaf(lg->b, live, cut, nl, next);
      sepb = live[cut].key;
    }
    // Locked new leaves, their key filters valid at the version their
    // unlock in step 4 publishes.
    auto born = [&](uint64_t off, size_t lo, size_t hi) {
      LeafSlot* s = Slot(off);
      s->lock.NewBorn();
      uint64_t bits[LeafSlot::kWords] = {};
      for (size_t x = lo; x < hi; x++) LeafSlot::Add(bits, KeyHash(live[x].key));
      s->Store(bits, (s->lock.LoadRelaxed() & ~kit::VersionLock::kBusy) + kit::VersionLock::kStep);
    };
    born(lg->a, 0, cut);
    if (split) born(lg->b, cut, nl);
  }
  const uint64_t na = lg->a, nb = lg->b;
  std::vector<uint64_t> keep;
  bool freed_early = false;
  if (pointers_) {
    for (const Rec& rec : live) {
      if (kBytes) keep.push_back(rec.kw);
      if (vbytes_) keep.push_back(rec.vw);
    }
    std::sort(keep.begin(), keep.end());
    if (PMINDEX_FAULT("nvtree.replace.free_before_swap")) {
      (void)FreeDeadBlocks(l, {});
      freed_early = true;  // the faulty variant: step 5 has nothing left to free
    }
  }
  pm::Fence();
  // 3. the commit
  pm::StoreAtomic(link, unlink ? next : na, __ATOMIC_RELEASE);
  pm::Persist(link, 8);

  // 4. DRAM: the PLN copy-on-write, or a rebuild of all inner nodes
  auto* np = new Pln<K>;
  np->seps = r.pln->seps;
  np->leaves = r.pln->leaves;
  if (unlink) {
    np->leaves.erase(np->leaves.begin() + long(r.i));
    np->seps.erase(np->seps.begin() + long(r.i == 0 ? 1 : r.i));
  } else {
    np->leaves[r.i] = na;
    if (split) {
      np->leaves.insert(np->leaves.begin() + long(r.i) + 1, nb);
      np->seps.insert(np->seps.begin() + long(r.i) + 1, sepb);
    }
  }
  if (np->size() > pln_cap_) {
    std::vector<K> lows;
    std::vector<uint64_t> leaves;
    for (size_t p = 0; p < in->plns(); p++) {
      const Pln<K>* q = p == r.p ? np : in->pln(p);
      lows.insert(lows.end(), q->seps.begin(), q->seps.end());
      leaves.insert(leaves.end(), q->leaves.begin(), q->leaves.end());
    }
    delete np;
    Rebuild(lows, leaves);
  } else {
    np->seps.reserve(pln_cap_);
    np->leaves.reserve(pln_cap_);
    dead_plns_.push_back(in->Swap(r.p, np));
  }
  if (na) VL(na)->Unlock();
  if (nb) VL(nb)->Unlock();
  vl->UnlockObsolete();

  // 5. after the grace period: the old leaf's dead blocks, the old leaf, the
  // log; then the spare is allocated again if it was taken
  epoch_.Synchronize();
  RetireDram();
  // After the commit the operation cannot fail: a block the allocator does
  // not know here means the pool is damaged, and the process stops.
  if (pointers_ && !freed_early) {
    if (Status st = FreeDeadBlocks(l, keep); !st.ok()) {
      std::fprintf(stderr, "pmindex: nvtree: freeing a replaced leaf's blocks failed: %s\n", st.ToString().c_str());
      std::abort();
    }
  }
  alloc.FreeOrAbort(&lg->old);
  pm::StoreAtomic(&lg->a, uint64_t(0), __ATOMIC_RELAXED);
  pm::StoreAtomic(&lg->b, uint64_t(0), __ATOMIC_RELAXED);
  pm::StoreAtomic(&lg->link, uint64_t(0), __ATOMIC_RELAXED);
  pm::Persist(lg, sizeof(ReplaceLog));
  if (!root_->spare && alloc.Allocate(&root_->spare, leaf_bytes_).ok()) pm::Fence();  // orders the allocator's log clear
  return Status::OK();
}

template class NVTree<false>;
template class NVTree<true>;

}  // namespace pmindex::internal::nvtree
