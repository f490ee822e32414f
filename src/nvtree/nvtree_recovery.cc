// nvtree/nvtree_recovery.cc: creating and opening an NV-Tree pool, recovery
// (PiBench sec. 5.9: walk the leaf list and rebuild all inner nodes), Check
// and the owned-block enumeration. Layout: nvtree_format.h.
//
// Creation (Format), idempotent: the root (allocated zeroed into the root
// slot); line 0 (magic, config) persisted; the first, empty leaf allocated
// zeroed into head; initialized = 1. A crashed creation leaves initialized
// 0, at most two blocks, and once head is set a durable config: it is
// formatted again with that config (kit/root_check.h tells it from a
// damaged root).
//
// Recovery, in order:
//   1. the replacement micro-log (nvtree_smo.cc): rolled back if its link
//      still points at the old leaf, else rolled forward;
//   2. the leaf list is walked (bounded: kit/bounded_walk.h) to collect the
//      leaf offsets (one line per leaf);
//   3. a parallel pass over the leaves (recovery_threads, or the hardware's,
//      at most one per 256 leaves): range checks, scratch words of
//      uncommitted appends freed (byte keys/values: a key word that a
//      committed entry shares is zeroed, other words freed), the minimum key
//      and the live records of each leaf;
//   4. leaves without a committed entry are unlinked and freed (through the
//      micro-log, as at run time), except a lone last leaf;
//   5. the inner nodes are built from the minimum keys (sparse, as after an
//      overflow), the PLNs by step 3's threads (nvtree_inner.h). Lock words
//      need no reset: the lock table is new.
// Corrupt pools: everything recovery dereferences is range-checked first and
// reported as Status::Corrupt.
//
// Thread safety: open is single-threaded apart from step 3's workers, which
// touch disjoint leaves, and step 5's, which build disjoint PLNs; Check and ForEachOwnedBlock must not run with
// writers.
#include <algorithm>
#include <chrono>
#include <thread>

#include "kit/bounded_walk.h"
#include "kit/root_check.h"
#include "nvtree/nvtree_tree.h"

namespace pmindex::internal::nvtree {

namespace {
std::string Num(uint64_t x) { return std::to_string(x); }
Status Bad(const std::string& s) { return Status::Corrupt("nvtree: " + s); }
const kit::RootSpec kSpec{"nvtree", kMagic, sizeof(Root), offsetof(Root, magic), offsetof(Root, initialized)};
}  // namespace

template <bool kBytes>
Status NVTree<kBytes>::CheckConfig(const Root* r) const {
  if (r->format != kFormat) return Bad("root format " + Num(r->format) + ", expected " + Num(kFormat));
  if (r->key_kind != (kBytes ? 1 : 0) || r->value_kind > 1) return Bad("root key/value kind out of range");
  if (r->leaf_cap < 4 || r->leaf_cap > kMaxLeafCap) return Bad("root leaf_cap " + Num(r->leaf_cap) + " out of range");
  if (r->pln_cap < 2 || r->pln_cap > kMaxPlnCap) return Bad("root pln_cap " + Num(r->pln_cap) + " out of range");
  if (r->leaf_bytes != LeafBytes(r->leaf_cap)) return Bad("root leaf_bytes does not match leaf_cap");
  if (r->max_key == 0 || r->max_key > (1u << 20) || r->max_value > (64u << 20)) return Bad("root key/value limits out of range");
  return Status::OK();
}

template <bool kBytes>
void NVTree<kBytes>::LoadConfig() {
  const Root* r = root_;
  cap_ = r->leaf_cap;
  pln_cap_ = r->pln_cap;
  fanout_ = r->pln_cap;
  leaf_bytes_ = r->leaf_bytes;
  max_key_ = r->max_key;
  max_value_ = r->max_value;
  vbytes_ = r->value_kind == uint8_t(ValueKind::kBytes);
  pointers_ = kBytes || vbytes_;
}

template <bool kBytes>
Status NVTree<kBytes>::LeafRange(uint64_t off, const std::string& what) const {
  if (off == 0 || off % 64 || off < 4096 || off > pool_size() - leaf_bytes_)
    return Bad(what + " " + Num(off) + " is not a leaf offset");
  return Status::OK();
}

template <bool kBytes>
Status NVTree<kBytes>::Format(const Options& o, const Config& c) {
  uint64_t* rs = pool_->root_slot();
  if (*rs == 0) PMINDEX_RETURN_IF_ERROR(pool_->allocator().AllocateZeroed(rs, sizeof(Root)));
  root_ = pool_->root<Root>();
  Root* r = root_;
  if (r->head == 0) {
    pm::Store(&r->magic, kMagic);
    pm::Store(&r->format, kFormat);
    pm::Store(&r->key_kind, uint8_t(o.key_kind));
    pm::Store(&r->value_kind, uint8_t(o.value_kind));
    pm::Store(&r->leaf_cap, c.leaf_cap);
    pm::Store(&r->pln_cap, c.pln_cap);
    pm::Store(&r->max_key, uint32_t(o.max_key_size));
    pm::Store(&r->max_value, uint32_t(o.max_value_size));
    pm::Store(&r->leaf_bytes, LeafBytes(c.leaf_cap));
    pm::Persist(r, 64);
  }
  PMINDEX_RETURN_IF_ERROR(CheckConfig(r));
  LoadConfig();
  if (r->head == 0) PMINDEX_RETURN_IF_ERROR(pool_->allocator().AllocateZeroed(&r->head, leaf_bytes_));
  pm::StorePersist(&r->initialized, uint64_t(1));
  return Recover();
}

template <bool kBytes>
Status NVTree<kBytes>::Open(const Options& o, const Config& c) {
  kit::RootState state;
  PMINDEX_RETURN_IF_ERROR(kit::ClassifyRoot(pool_.get(), kSpec, &state));
  if (state == kit::RootState::kAbsent) return Format(o, c);
  root_ = pool_->root<Root>();
  if (state == kit::RootState::kCreating) {
    const Root* r = root_;
    if (r->log.link || r->log.old || r->log.a || r->log.b || r->spare) return Bad("root not initialised but its micro-log is in use");
    PMINDEX_RETURN_IF_ERROR(kit::CheckCreationBlocks(pool_.get(), kSpec, r->head ? 2 : 1,
                                                     "root not initialised (initialized = 0, head " + Num(r->head) + ")"));
    if (r->head) {
      if (r->magic != kMagic) return Bad("root not initialised, without magic, but a leaf allocated");
      PMINDEX_RETURN_IF_ERROR(CheckConfig(r));
      LoadConfig();
      PMINDEX_RETURN_IF_ERROR(LeafRange(r->head, "head"));
      if (Ld(Count(L(r->head))) || Ld(Next(L(r->head)))) return Bad("root not initialised but its first leaf is not empty");
    }
    return Format(o, c);
  }
  PMINDEX_RETURN_IF_ERROR(CheckConfig(root_));
  LoadConfig();
  return Recover();
}

template <bool kBytes>
Status NVTree<kBytes>::RecoverLog() {
  ReplaceLog* lg = &root_->log;
  if (root_->spare) PMINDEX_RETURN_IF_ERROR(LeafRange(root_->spare, "spare"));
  if (root_->spare && (root_->spare == lg->a || root_->spare == lg->b)) pm::StorePersist(&root_->spare, uint64_t(0));
  if (!lg->link && !lg->old && !lg->a && !lg->b) return Status::OK();
  pm::Allocator& alloc = pool_->allocator();
  if (lg->old) PMINDEX_RETURN_IF_ERROR(LeafRange(lg->old, "log.old"));
  if (lg->a) PMINDEX_RETURN_IF_ERROR(LeafRange(lg->a, "log.a"));
  if (lg->b) PMINDEX_RETURN_IF_ERROR(LeafRange(lg->b, "log.b"));
  if (lg->old) {
    const uint64_t root_off = *pool_->root_slot();
    if (lg->link % 8 || lg->link < 4096 || lg->link > pool_size() - 8) return Bad("log.link " + Num(lg->link) + " out of range");
    if (lg->link != root_off + offsetof(Root, head)) PMINDEX_RETURN_IF_ERROR(LeafRange(lg->link - 8, "log.link's leaf"));
    const uint64_t* link = reinterpret_cast<const uint64_t*>(base_ + lg->link);
    if (Ld(link) == lg->old) {  // not committed: roll back
      if (lg->a) PMINDEX_RETURN_IF_ERROR(alloc.Free(&lg->a));
      if (lg->b) PMINDEX_RETURN_IF_ERROR(alloc.Free(&lg->b));
      pm::StoreAtomic(&lg->old, uint64_t(0), __ATOMIC_RELAXED);
      pm::StoreAtomic(&lg->link, uint64_t(0), __ATOMIC_RELAXED);
      pm::Persist(lg, sizeof(ReplaceLog));
      return Status::OK();
    }
    if (pointers_) {  // committed: roll forward
      std::vector<uint64_t> keep;
      for (uint64_t nl : {lg->a, lg->b}) {
        if (!nl) continue;
        for (uint64_t j = 0; j < cap_; j++) {
          if (kBytes) keep.push_back(Ld(&E(L(nl), j)->key));
          if (vbytes_) keep.push_back(Ld(&E(L(nl), j)->value));
        }
      }
      std::sort(keep.begin(), keep.end());
      if (Status st = FreeDeadBlocks(L(lg->old), keep); !st.ok())
        return Status::Corrupt("nvtree: rolling a committed leaf replacement forward: " + st.ToString());
    }
    PMINDEX_RETURN_IF_ERROR(alloc.Free(&lg->old));
  }
  pm::StoreAtomic(&lg->a, uint64_t(0), __ATOMIC_RELAXED);
  pm::StoreAtomic(&lg->b, uint64_t(0), __ATOMIC_RELAXED);
  pm::StoreAtomic(&lg->link, uint64_t(0), __ATOMIC_RELAXED);
  pm::Persist(lg, sizeof(ReplaceLog));
  return Status::OK();
}

template <bool kBytes>
Status NVTree<kBytes>::Recover() {
  const auto t0 = std::chrono::steady_clock::now();
  base_ = pool_->base();
  PMINDEX_RETURN_IF_ERROR(vtab_.Map(base_, pool_->max_size(), leaf_bytes_));
  PMINDEX_RETURN_IF_ERROR(RecoverLog());
  // 2. the leaf list
  std::vector<uint64_t> leaves;
  kit::BoundedWalk walk(pool_size(), leaf_bytes_);
  for (uint64_t x = root_->head; x; x = Ld(Next(L(x)))) {
    PMINDEX_RETURN_IF_ERROR(LeafRange(x, leaves.empty() ? "head" : "next of leaf " + Num(leaves.back())));
    if (!walk.Step()) return walk.CycleError("nvtree leaf list", "leaves");
    leaves.push_back(x);
  }
  if (leaves.empty()) return Bad("the leaf list is empty");
  // 3. per leaf, in parallel
  const size_t n = leaves.size();
  std::vector<K> mins(n);
  std::vector<uint64_t> counts(n), lives(n);
  size_t threads = recovery_threads_ > 0 ? size_t(recovery_threads_) : std::max(1u, std::thread::hardware_concurrency());
  threads = std::max<size_t>(1, std::min(threads, n / 256));
  rec_threads_ = threads;
  std::vector<Status> errs(threads);
  auto work = [&](size_t t) {
    std::vector<Rec> recs;
    for (size_t i = t; i < n; i += threads) {
      char* l = L(leaves[i]);
      const uint64_t c = Ld(Count(l));
      if (c > cap_) {
        errs[t] = Bad("leaf " + Num(leaves[i]) + " count " + Num(c) + " above the capacity");
        return;
      }
      for (uint64_t j = 0; j < c; j++) {
        const uint64_t f = Ld(&E(l, j)->flag);
        if (f != kInsert && f != kDelete) {
          errs[t] = Bad("leaf " + Num(leaves[i]) + " entry " + Num(j) + " flag out of range");
          return;
        }
      }
      for (uint64_t j = c; pointers_ && j < cap_; j++) {  // scratch of uncommitted appends
        Entry* e = E(l, j);
        if (kBytes && Ld(&e->key)) {
          bool shared = false;
          for (uint64_t x = 0; x < c && !shared; x++) shared = Ld(&E(l, x)->key) == Ld(&e->key);
          if (shared) pm::StorePersist(&e->key, uint64_t(0));
          else if (Status fs = pool_->allocator().Free(&e->key); !fs.ok()) {
            errs[t] = fs;
            return;
          }
        }
        if (vbytes_ && Ld(&e->value)) {
          if (Status fs = pool_->allocator().Free(&e->value); !fs.ok()) {
            errs[t] = fs;
            return;
          }
        }
      }
      // One sort per leaf: the deciding entry of every key, live or not;
      // the first is the minimum key (a separator), the live ones count.
      if (!Records(l, c, true, &recs)) {
        errs[t] = Bad("leaf " + Num(leaves[i]) + " holds a key block out of range");
        return;
      }
      lives[i] = uint64_t(std::count_if(recs.begin(), recs.end(), [](const Rec& r) { return r.live; }));
      if (c) mins[i] = recs[0].key;
      counts[i] = c;
    }
  };
  if (threads == 1) {
    work(0);
  } else {
    std::vector<std::thread> ts;
    for (size_t t = 0; t < threads; t++) ts.emplace_back(work, t);
    for (auto& t : ts) t.join();
  }
  for (const Status& s : errs) PMINDEX_RETURN_IF_ERROR(s);
  // 4. leaves without entries leave the list
  std::vector<K> lows;
  std::vector<uint64_t> kept;
  uint64_t total = 0;
  ReplaceLog* lg = &root_->log;
  for (size_t i = 0; i < n; i++) {
    const bool last_alone = kept.empty() && i + 1 == n;
    if (counts[i] == 0 && !last_alone) {
      uint64_t* link = kept.empty() ? &root_->head : Next(L(kept.back()));
      pm::StoreAtomic(&lg->link, pool_->OffsetOf(link), __ATOMIC_RELAXED);
      pm::StoreAtomic(&lg->old, leaves[i], __ATOMIC_RELAXED);
      pm::Persist(lg, 16);
      pm::StorePersist(link, Ld(Next(L(leaves[i]))));
      PMINDEX_RETURN_IF_ERROR(pool_->allocator().Free(&lg->old));
      pm::StorePersist(&lg->link, uint64_t(0));
      continue;
    }
    if (!kept.empty() && !(lows.back() < mins[i])) return Bad("leaf " + Num(leaves[i]) + " keys not above its left neighbour's");
    kept.push_back(leaves[i]);
    lows.push_back(mins[i]);
    total += lives[i];
  }
  if (!root_->spare && pool_->allocator().Allocate(&root_->spare, leaf_bytes_).ok()) pm::Fence();  // orders the allocator's log clear
  // 5. the inner nodes
  RetireDram();
  delete inner_.exchange(new Inner<K>(lows, kept, std::max<uint32_t>(1, pln_cap_ / 2), fanout_, threads));
  count_.store(total);
  recovery_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return Status::OK();
}

template <bool kBytes>
Status NVTree<kBytes>::Check() {
  if (closed_) return IndexClosed();
  const ReplaceLog* lg = &root_->log;
  if (lg->link || lg->old || lg->a || lg->b) return Bad("micro-log in use while quiescent");
  Inner<K>* in = inner_.load();
  std::vector<uint64_t> routed;
  for (size_t p = 0; p < in->plns(); p++) {
    const Pln<K>* q = in->pln(p);
    if (q->size() == 0 || q->size() > pln_cap_ || q->seps.size() != q->size()) return Bad("PLN " + Num(p) + " size out of range");
    routed.insert(routed.end(), q->leaves.begin(), q->leaves.end());
  }
  kit::BoundedWalk walk(pool_size(), leaf_bytes_);
  size_t i = 0;
  uint64_t total = 0;
  std::vector<Rec> recs;
  std::string val;
  for (uint64_t x = root_->head; x; x = Ld(Next(L(x))), i++) {
    PMINDEX_RETURN_IF_ERROR(LeafRange(x, "leaf"));
    if (!walk.Step()) return walk.CycleError("nvtree leaf list", "leaves");
    if (i >= routed.size() || routed[i] != x) return Bad("leaf list and inner nodes disagree at leaf " + Num(i));
    char* l = L(x);
    const uint64_t c = Ld(Count(l));
    if (c > cap_) return Bad("leaf " + Num(x) + " count above the capacity");
    if (!Records(l, c, true, &recs)) return Bad("leaf " + Num(x) + " holds a key block out of range");
    // A valid key filter holds every committed key (nvtree_tree.h).
    if (const LeafSlot* s = Slot(x); s->Valid(s->lock.LoadRelaxed())) {
      uint64_t bits[LeafSlot::kWords];
      if (FilterOf(l, c, bits))
        for (uint64_t w = 0; w < LeafSlot::kWords; w++)
          if (bits[w] & ~s->bloom[w]) return Bad("leaf " + Num(x) + ": its key filter misses a committed key");
    }
    // Per key, in append order: +1, -1, +1, ... (records are sorted by key,
    // the latest entry of a key first).
    for (size_t a = 0; a < recs.size();) {
      size_t b = a;
      while (b < recs.size() && recs[b].key == recs[a].key) b++;
      for (size_t m = b; m-- > a;) {
        const uint64_t want = (b - 1 - m) % 2 == 0 ? kInsert : kDelete;
        if (Ld(&E(l, uint64_t(recs[m].idx))->flag) != want) return Bad("leaf " + Num(x) + ": entries of a key do not alternate insert/delete");
      }
      if (RouteKey(in, recs[a].key).leaf != x) return Bad("leaf " + Num(x) + ": a key is routed to another leaf");
      if (recs[a].live) {
        total++;
        if (!ReadValue(recs[a].vw, &val)) return Bad("leaf " + Num(x) + ": value block out of range");
      }
      a = b;
    }
  }
  if (i != routed.size()) return Bad("inner nodes hold " + Num(routed.size()) + " leaves, the list " + Num(i));
  if (total != count_.load()) return Bad("record count " + Num(count_.load()) + " but the leaves hold " + Num(total));
  return Status::OK();
}

template <bool kBytes>
Status NVTree<kBytes>::ForEachOwnedBlock(const std::function<void(uint64_t offset)>& fn) {
  if (closed_) return IndexClosed();
  fn(*pool_->root_slot());
  if (root_->spare) fn(root_->spare);
  kit::BoundedWalk walk(pool_size(), leaf_bytes_);
  std::vector<uint64_t> words;
  for (uint64_t x = root_->head; x; x = Ld(Next(L(x)))) {
    PMINDEX_RETURN_IF_ERROR(LeafRange(x, "leaf"));
    if (!walk.Step()) return walk.CycleError("nvtree leaf list", "leaves");
    fn(x);
    if (!pointers_) continue;
    char* l = L(x);
    const uint64_t c = std::min<uint64_t>(Ld(Count(l)), cap_);
    words.clear();
    for (uint64_t j = 0; j < c; j++) {
      if (kBytes) words.push_back(Ld(&E(l, j)->key));
      if (vbytes_ && Ld(&E(l, j)->flag) == kInsert) words.push_back(Ld(&E(l, j)->value));
    }
    std::sort(words.begin(), words.end());
    words.erase(std::unique(words.begin(), words.end()), words.end());
    for (uint64_t w : words)
      if (w) fn(w);
  }
  return Status::OK();
}

template class NVTree<false>;
template class NVTree<true>;

}  // namespace pmindex::internal::nvtree
