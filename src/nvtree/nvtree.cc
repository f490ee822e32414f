// nvtree/nvtree.cc: NV-Tree's operations on one leaf (PiBench sec. 3.2, fig.
// 3 bottom; table 2), the Index adapter, its options and the registration
// of `nvtree`. Class and concurrency: nvtree_tree.h; layout: nvtree_format.h.
//
// Persist order (2 fences per insert, update and delete without a
// replacement; the lines flushed are those of the appended entries plus the
// count's line, docs/nvtree.md):
//   insert  the entry {+1, key, value} (byte keys/values: blocks allocated
//           into the entry's words and flushed) is stored and flushed, fence;
//           the count is raised by one with one 8-byte store, flushed, fence:
//           the count store is the commit.
//   delete  the same with a tombstone {-1, key, 0}.
//   update  a tombstone and an insert appended together, then one count
//           store raises the count by two: both commit at once.
// Unlike the paper's NV-Tree (which appends regardless), a write first finds
// the key's deciding entry, so Insert refuses a present key and Update and
// Remove an absent one, as the common API says; the alternation invariant of
// nvtree_format.h follows. A full leaf is replaced first (nvtree_smo.cc).
//
// Reads return only durable data: a lookup validates the leaf's version,
// and a writer holds the leaf lock from its first store until the count is
// durable, so no validated read sees an entry whose commit can still be
// lost; a scan does the same per leaf.
// Fault switches: nvtree.append.skip_entry_flush, .count_before_entry,
// .skip_count_flush (persist order), .unlock_before_count_persist (the read
// rule); nvtree_smo.cc has the replacement's.
//
// Thread safety: nvtree_tree.h.
#include <algorithm>
#include <thread>

#include "nvtree/nvtree_tree.h"
#include "pmindex/pm/fault.h"

namespace pmindex::internal::nvtree {

template <bool kBytes>
NVTree<kBytes>::NVTree(std::unique_ptr<pm::Pool> pool, const Options& o)
    : pool_(std::move(pool)), recovery_threads_(o.recovery_threads) {
  base_ = pool_->base();
}

template <bool kBytes>
bool NVTree<kBytes>::Records(char* l, uint64_t c, bool all, std::vector<Rec>* out, const K* from,
                             bool inclusive) const {
  out->clear();
  if (c > kMaxLeafCap) return false;
  if constexpr (!kBytes) {
    // u64 keys: (key, slot) pairs are sorted, 16 bytes each, and records
    // are made only for the entries kept.
    struct KeySlot {
      uint64_t key, j;
    };
    KeySlot ks[kMaxLeafCap];
    size_t m = 0;
    for (uint64_t j = 0; j < c; j++) {
      const uint64_t k = Ld(&E(l, j)->key);
      if (from && (k < *from || (!inclusive && k == *from))) continue;
      ks[m++] = KeySlot{k, j};
    }
    std::sort(ks, ks + m, [](const KeySlot& a, const KeySlot& b) { return a.key < b.key || (a.key == b.key && a.j > b.j); });
    out->reserve(m);
    for (size_t i = 0; i < m; i++) {
      const bool first = i == 0 || ks[i - 1].key != ks[i].key;
      const Entry* e = E(l, ks[i].j);
      const bool live = first && Ld(&e->flag) == kInsert;
      if (!all && !live) continue;
      Rec r;
      r.key = r.kw = ks[i].key;
      r.vw = Ld(&e->value);
      r.idx = int(ks[i].j);
      r.live = live;
      out->push_back(r);
    }
    return true;
  }
  out->reserve(c);
  for (uint64_t j = 0; j < c; j++) {
    const Entry* e = E(l, j);
    Rec r;
    r.kw = Ld(&e->key);
    if (!ReadKey(r.kw, &r.key)) return false;
    if (from && (r.key < *from || (!inclusive && r.key == *from))) continue;
    r.vw = Ld(&e->value);
    r.idx = int(j);
    r.live = Ld(&e->flag) == kInsert;
    out->push_back(std::move(r));
  }
  std::sort(out->begin(), out->end(), [](const Rec& a, const Rec& b) { return a.key < b.key || (a.key == b.key && a.idx > b.idx); });
  size_t w = 0;
  for (size_t i = 0; i < out->size(); i++) {
    const bool first = i == 0 || !((*out)[i - 1].key == (*out)[i].key);
    if (!first) {
      if (!all) continue;
      (*out)[i].live = false;
    } else if (!all && !(*out)[i].live) {
      continue;
    }
    if (w != i) (*out)[w] = std::move((*out)[i]);
    w++;
  }
  out->resize(w);
  return true;
}

template <bool kBytes>
Status NVTree<kBytes>::Find(Slice key, std::string* value) {
  if (closed_) return IndexClosed();
  PMINDEX_RETURN_IF_ERROR(ValidateKey(key_kind(), max_key_, key));
  const K k = MakeKey(key);
  kit::Backoff b;
  std::string tmp;
  for (;;) {
    {
      EpochManager::Guard g(epoch_);
      const Route r = RouteKey(inner_.load(std::memory_order_acquire), k);
      kit::VersionLock* vl = VL(r.leaf);
      uint64_t v;
      if (vl->ReadBegin(&v)) {
        char* l = L(r.leaf);
        const uint64_t c = LdAcq(Count(l));
        if (c > cap_) {
          if (vl->Validate(v)) return Status::Corrupt("nvtree: leaf " + std::to_string(r.leaf) + " count out of range");
        } else {
          const int64_t j = Latest(l, c, k);
          const bool found = j >= 0 && Ld(&E(l, uint64_t(j))->flag) == kInsert;
          const uint64_t vw = found ? Ld(&E(l, uint64_t(j))->value) : 0;
          if (vl->Validate(v)) {
            if (!found) return Status::NotFound();
            // The value word is immutable and its block lives until a grace
            // period after the leaf is replaced: read it under the guard.
            if (value && !ReadValue(vw, value))
              return Status::Corrupt("nvtree: value block " + std::to_string(vw) + " out of range");
            return Status::OK();
          }
        }
      }
    }
    b.Wait();
  }
}

template <bool kBytes>
Status NVTree<kBytes>::Append(char* l, uint64_t c, const Entry* ents, int n, Slice key, Slice value, int new_key_at) {
  pm::Allocator& alloc = pool_->allocator();
  for (int i = 0; i < n; i++) {
    Entry* e = E(l, c + uint64_t(i));
    pm::StoreAtomic(&e->flag, ents[i].flag, __ATOMIC_RELAXED);
    Status st;
    if (kBytes && i == new_key_at) st = kit::WriteBlock(alloc, base_, &e->key, key);
    else pm::StoreAtomic(&e->key, ents[i].key, __ATOMIC_RELAXED);
    if (st.ok()) {
      if (vbytes_ && ents[i].flag == kInsert) st = kit::WriteBlock(alloc, base_, &e->value, value);
      else pm::StoreAtomic(&e->value, ents[i].value, __ATOMIC_RELAXED);
    }
    if (!st.ok()) {  // pool full: undo the blocks of this append
      for (int x = 0; x <= i; x++) {
        Entry* f = E(l, c + uint64_t(x));
        if (kBytes && x == new_key_at && Ld(&f->key)) alloc.FreeOrAbort(&f->key);
        if (vbytes_ && ents[x].flag == kInsert && Ld(&f->value)) alloc.FreeOrAbort(&f->value);
      }
      return st;
    }
  }
  if (PMINDEX_FAULT("nvtree.append.count_before_entry")) {
    pm::StoreAtomic(Count(l), c + uint64_t(n), __ATOMIC_RELEASE);
    pm::Persist(Count(l), 8);
    pm::Persist(E(l, c), kEntryBytes * size_t(n));
    return Status::OK();
  }
  if (!PMINDEX_FAULT("nvtree.append.skip_entry_flush")) pm::Flush(E(l, c), kEntryBytes * size_t(n));
  pm::Fence();
  pm::StoreAtomic(Count(l), c + uint64_t(n), __ATOMIC_RELEASE);
  if (PMINDEX_FAULT("nvtree.append.unlock_before_count_persist")) return Status::OK();  // Put persists it after unlocking
  if (!PMINDEX_FAULT("nvtree.append.skip_count_flush")) pm::Flush(Count(l), 8);
  pm::Fence();
  return Status::OK();
}

template <bool kBytes>
Status NVTree<kBytes>::Put(Slice key, Slice value, Mode mode) {
  if (closed_) return IndexClosed();
  PMINDEX_RETURN_IF_ERROR(ValidateKey(key_kind(), max_key_, key));
  if (mode != Mode::kRemove) PMINDEX_RETURN_IF_ERROR(ValidateValue(value_kind(), max_value_, value));
  const K k = MakeKey(key);
  kit::Backoff b;
  int tries = 0;
  for (;;) {
    uint64_t leaf = 0, v = 0;
    {
      EpochManager::Guard g(epoch_);
      const Route r = RouteKey(inner_.load(std::memory_order_acquire), k);
      v = VL(r.leaf)->Load();
      if (VL(r.leaf)->TryLock(v)) leaf = r.leaf;
    }
    if (!leaf) {  // locked or replaced: wait outside the guard
      b.Wait();
      continue;
    }
    // Locked and not obsolete: the leaf is in the tree, and only its own
    // replacement (which needs this lock) could free it.
    kit::VersionLock* vl = VL(leaf);
    char* l = L(leaf);
    const uint64_t c = Ld(Count(l));
    if (c > cap_) {
      UnlockUnchanged(vl, v);
      return Status::Corrupt("nvtree: leaf " + std::to_string(leaf) + " count out of range");
    }
    // The key filter (nvtree_tree.h): made valid at v if it is not, so that
    // a key it rules out needs no search of the leaf.
    LeafSlot* slot = Slot(leaf);
    const uint64_t h = KeyHash(k);
    bool filtered = slot->Valid(v);
    if (!filtered) {
      uint64_t bits[LeafSlot::kWords];
      if (FilterOf(l, c, bits)) {
        slot->Store(bits, v);
        filtered = true;
      }
    }
    const int64_t j = filtered && !slot->MayHold(h) ? -1 : Latest(l, c, k);
    const bool present = j >= 0 && Ld(&E(l, uint64_t(j))->flag) == kInsert;
    if (mode == Mode::kInsert && present) {
      UnlockUnchanged(vl, v);
      return Status::AlreadyExists();
    }
    if ((mode == Mode::kUpdate || mode == Mode::kRemove) && !present) {
      UnlockUnchanged(vl, v);
      return Status::NotFound();
    }
    uint64_t kw = 0;
    if (present) kw = Ld(&E(l, uint64_t(j))->key);
    else if constexpr (!kBytes) kw = k;
    Entry ents[2];
    int n = 0, new_key_at = -1;
    if (present) ents[n++] = Entry{kDelete, kw, 0};
    if (mode != Mode::kRemove) {
      if (kBytes && !present) new_key_at = n;
      ents[n++] = Entry{kInsert, kw, vbytes_ ? 0 : SliceToU64(value)};
    }
    if (c + uint64_t(n) <= cap_) {
      const Status st = Append(l, c, ents, n, key, value, new_key_at);
      if (st.IsPoolFull() && pointers_ && tries < 2) {
        // Dead entries hold blocks until their leaf is replaced: compact
        // this leaf, then (a second time) every leaf, and retry.
        if (tries++ == 0 && c > 0) {
          PMINDEX_RETURN_IF_ERROR(Replace(leaf, k, v, false, uint32_t(n), true));
        } else {
          UnlockUnchanged(vl, v);
          PMINDEX_RETURN_IF_ERROR(CompactAll());
        }
        continue;
      }
      if (!st.ok()) {
        UnlockUnchanged(vl, v);
        return st;
      }
      if (filtered) {  // the filter with k, valid at the version the unlock publishes
        if (!present) slot->AddKey(h);
        slot->SetValid((v & ~kit::VersionLock::kBusy) + kit::VersionLock::kStep);
      }
      vl->UnlockFrom(v);
      if (PMINDEX_FAULT("nvtree.append.unlock_before_count_persist")) {
        // The read rule's fault: readers may see the count before it is durable.
        std::this_thread::yield();
        pm::Persist(Count(l), 8);
      }
      if (mode == Mode::kRemove) count_.fetch_sub(1, std::memory_order_relaxed);
      else if (!present) count_.fetch_add(1, std::memory_order_relaxed);
      return Status::OK();
    }
    // Full: replace the leaf first. A Remove is completed by the replacement
    // itself (the new leaves leave the key out), so it needs no room.
    const bool drop = mode == Mode::kRemove;
    PMINDEX_RETURN_IF_ERROR(Replace(leaf, k, v, drop, uint32_t(n), false));  // unlocks the leaf
    if (drop) {
      count_.fetch_sub(1, std::memory_order_relaxed);
      return Status::OK();
    }
  }
}

// Scan: one leaf at a time, its records >= from copied (byte values too)
// and validated inside an epoch guard, then handed to the callback outside
// every guard, so the callback may call any operation of the index (a
// Remove or Insert that replaces a leaf waits for a grace period, which a
// guard held across the callback would block forever). The next leaf is
// taken from the sibling pointer if no grace period can have ended since it
// was read (the epoch is unchanged: a replacement that unlinks a leaf
// advances the epoch before freeing it), else routed to from the last key
// emitted.
template <bool kBytes>
Status NVTree<kBytes>::Scan(Slice start, size_t n, ScanCallback cb, size_t* count) {
  if (count) *count = 0;
  if (closed_) return IndexClosed();
  PMINDEX_RETURN_IF_ERROR(ValidateKey(key_kind(), max_key_, start));
  K from = MakeKey(start);
  bool inclusive = true;
  size_t done = 0;
  std::vector<Rec> recs;
  std::vector<std::string> vals;  // byte values, copied under the guard
  kit::Backoff b;
  uint64_t leaf = 0, at = 0;  // the next leaf, readable while the epoch is `at`
  while (done < n) {
    uint64_t next = 0;
    bool restart = false;
    {
      EpochManager::Guard g(epoch_);
      if (leaf && epoch_.Epoch() != at) leaf = 0;
      if (!leaf) leaf = RouteKey(inner_.load(std::memory_order_acquire), from).leaf;
      // Leaves with nothing to emit are passed in the same guard, so every
      // round makes progress.
      for (;;) {
        kit::VersionLock* vl = VL(leaf);
        uint64_t v;
        if (!vl->ReadBegin(&v)) {
          restart = true;
          break;
        }
        // Read before the sibling pointer: an unlink of the leaf it names
        // comes after this read or is visible to that one.
        at = epoch_.Epoch();
        std::atomic_thread_fence(std::memory_order_acquire);
        char* l = L(leaf);
        const uint64_t c = LdAcq(Count(l));
        next = LdAcq(Next(l));
        bool ok = c <= cap_ && Records(l, c, false, &recs, &from, inclusive);
        if (recs.size() > n - done) recs.resize(n - done);
        if (ok && vbytes_) {
          vals.resize(recs.size());
          for (size_t i = 0; ok && i < recs.size(); i++) ok = ReadValue(recs[i].vw, &vals[i]);
        }
        if (!vl->Validate(v)) {
          restart = true;
          break;
        }
        if (!ok) return Status::Corrupt("nvtree: leaf " + std::to_string(leaf) + " unreadable");
        if (next && (next % 64 || next > pool_size() - leaf_bytes_))
          return Status::Corrupt("nvtree: leaf " + std::to_string(leaf) + " next word out of range");
        if (!recs.empty() || !next) break;
        leaf = next;
      }
    }
    if (restart) {
      leaf = 0;
      b.Wait();
      continue;
    }
    for (size_t i = 0; i < recs.size(); i++) {
      const Rec& r = recs[i];
      done++;
      if (count) *count = done;
      from = r.key;
      inclusive = false;
      const Slice val = vbytes_ ? Slice(vals[i]) : Slice(reinterpret_cast<const char*>(&r.vw), 8);
      if (!cb(KeySlice(r.key), val)) return Status::OK();
    }
    if (!next) break;
    leaf = next;
  }
  if (count) *count = done;
  return Status::OK();
}

template <bool kBytes>
IndexStats NVTree<kBytes>::Stats() {
  IndexStats s;
  if (closed_) return s;
  s.records = count_.load();
  s.pm_bytes = pool_->allocator().BytesInUse();
  s.recovery_seconds = recovery_seconds_;
  // The lock table's pages over the pool's current size only, and outside
  // smo_mu_ (a structure change waits for that mutex).
  s.dram_bytes = vtab_.ResidentBytes(base_, base_ + pool_->size());
  std::lock_guard<std::mutex> lk(smo_mu_);
  s.dram_bytes += inner_.load()->Bytes();
  return s;
}

template <bool kBytes>
void NVTree<kBytes>::Shape(uint64_t* leaves, uint64_t* plns, uint64_t* height) {
  Inner<K>* in = inner_.load();
  *leaves = 0;
  for (size_t p = 0; p < in->plns(); p++) *leaves += in->pln(p)->size();
  *plns = in->plns();
  *height = in->height();
}

template <bool kBytes>
Status NVTree<kBytes>::Close() {
  if (closed_) return Status::OK();
  closed_ = true;
  RetireDram();
  delete inner_.exchange(nullptr);
  vtab_.Unmap();
  Status st = pool_ ? pool_->Close() : Status::OK();
  return st;
}

template class NVTree<false>;
template class NVTree<true>;

// ---- options, factories, registration ------------------------------------------
namespace {

Status Make(std::unique_ptr<pm::Pool> pool, const Options& o, std::unique_ptr<Index>* out, bool create) {
  if (o.read_only) return Status::Unsupported("nvtree rebuilds its inner nodes on open and cannot open a pool read-only");
  Params p(o.params);
  PMINDEX_RETURN_IF_ERROR(p.Expect({"leaf_size", "inner_size"}));
  long long leaf = 0, inner = 0;
  PMINDEX_RETURN_IF_ERROR(p.GetInt("leaf_size", 64, 4, kMaxLeafCap, &leaf));
  PMINDEX_RETURN_IF_ERROR(p.GetInt("inner_size", 128, 2, kMaxPlnCap, &inner));
  Config c;
  c.leaf_cap = uint32_t(leaf);
  c.pln_cap = uint32_t(inner);
  c.fanout = uint32_t(inner);
  KeyKind kk = o.key_kind;
  ValueKind vk = o.value_kind;
  bool fresh = create;
  if (!create) {
    const uint64_t ro = *pool->root_slot();
    if (ro && ro % 8 == 0 && ro + sizeof(Root) <= pool->size()) {
      const Root* r = reinterpret_cast<const Root*>(pool->base() + ro);
      // The root's kinds hold once line 0 is durable: the first leaf is
      // allocated after its fence. A creation that crashed earlier is
      // formatted again with the options' kinds.
      if ((r->initialized == 1 || r->head != 0) && r->key_kind <= 1 && r->value_kind <= 1) {
        kk = KeyKind(r->key_kind);
        vk = ValueKind(r->value_kind);
      }
    }
  }
  Options eff = o;
  eff.key_kind = kk;
  eff.value_kind = vk;
  if (eff.max_key_size == 0 || eff.max_key_size > (1u << 20)) return Status::InvalidArgument("max_key_size out of range");
  if (eff.max_value_size > (64u << 20)) return Status::InvalidArgument("max_value_size out of range");
  std::unique_ptr<Index> idx;
  auto build = [&](auto* t) -> Status {
    idx.reset(t);
    if (fresh) return t->Format(eff, c);
    return t->Open(eff, c);
  };
  Status st = kk == KeyKind::kBytes ? build(new NVTree<true>(std::move(pool), eff)) : build(new NVTree<false>(std::move(pool), eff));
  return HandOutOrClose(std::move(st), std::move(idx), out);
}

}  // namespace
}  // namespace pmindex::internal::nvtree

namespace pmindex::internal {

void RegisterNVTree(std::vector<IndexFactory>* r) {
  AddIndexType<&nvtree::Make>(r, {"nvtree", true, true, true,
                                 "NV-Tree (PiBench VLDB'20 sec. 3.2): append-only PM leaves, DRAM inner nodes rebuilt "
                                 "on overflow and open"});
}

}  // namespace pmindex::internal

// The fault switches of this folder (pmindex/pm/fault.h; docs/CONTRIBUTING.md).
PMINDEX_FAULT_SWITCHES(nvtree,
                       "nvtree.append.count_before_entry",
                       "nvtree.append.skip_count_flush",
                       "nvtree.append.skip_entry_flush",
                       "nvtree.append.unlock_before_count_persist",
                       "nvtree.replace.free_before_swap",
                       "nvtree.replace.skip_leaf_flush");
