// fptree/fptree.cc: the FPTree family's Index adapter: insert, update,
// delete and find on one leaf (paper sec. 4.3, alg. 1, 2, 5, 8), Size,
// Stats, Close, the options, the factories and the registration of
// `fptree`, `fptree_single` and `ptree`. The class: fptree_tree.h.
//
// Persist order (2 lines + 2 fences per insert without split):
//   insert: write the slot (+ key/value blocks, allocated into the slot
//           words), persist; store the fingerprint, then set the bitmap bit
//           (same line: the fingerprint reaches PM no later than the
//           bitmap), persist line 0. The bitmap store is the commit.
//   update: u64 values with update=inplace: one p-atomic 8-byte value store,
//           persisted (1 line). Otherwise alg. 8: a new slot is written and
//           persisted, then one p-atomic bitmap store clears the old bit and
//           sets the new one; then the old slot's pointers are reset/freed
//           (recovery's alg. 17 check finishes that after a crash).
//   delete: clear the bit, persist line 0; then free the key/value blocks;
//           a leaf left empty is unlinked (fptree_smo.cc).
//   A full leaf is split first (fptree_smo.cc), under the leaf's lock.
//
// Invariants: fptree_format.h. Thread safety: fptree_tree.h (fptree: all
// operations concurrent; a writer holds the leaf's lock for the whole
// persistent update and takes no inner-node lock for it).
#include "fptree/fptree.h"

#include <cstring>

#include "fptree/fptree_tree.h"
#include "pm/allocator_format.h"
#include "pmindex/pm/fault.h"

namespace pmindex::internal {

namespace fptree {
FPT_TLS uint64_t tl_probes = 0;
std::atomic<uint64_t> g_deferred_deletions{0};
std::atomic<void (*)(uint64_t)> g_leaf_unlinked_hook{nullptr};
}  // namespace fptree

void SetFPTreeLeafUnlinkedHook(void (*hook)(uint64_t leaf)) { fptree::g_leaf_unlinked_hook.store(hook); }

uint64_t FPTreeKeyProbes() { return fptree::tl_probes; }
uint64_t FPTreeDeferredLeafDeletions() { return fptree::g_deferred_deletions.load(); }

namespace fptree {

// ---- record writes (leaf locked) ---------------------------------------------
// Writes key/value into free slot s of leaf l and commits with the bitmap.
template <bool kConc, bool kBytes>
Status FPTree<kConc, kBytes>::InsertInto(char* l, int s, const SKey& k, Slice value) {
  uint64_t* kw = Key(l, s);
  uint64_t* vw = Val(l, s);
  if constexpr (kBytes) {
    PMINDEX_RETURN_IF_ERROR(WriteBlock(kw, k.s));
  } else {
    pm::StoreAtomic(kw, k.u, __ATOMIC_RELAXED);
  }
  if (vbytes_) {
    Status st = WriteBlock(vw, value);
    if (!st.ok()) {
      if (kBytes) pool_->allocator().FreeOrAbort(kw);
      return st;
    }
  } else {
    pm::StoreAtomic(vw, SliceToU64(value), __ATOMIC_RELAXED);
  }
  if (lay_.fp) pm::StoreAtomic(Fp(l, s), k.fp, __ATOMIC_RELAXED);
  uint64_t nb = Ld(Bm(l)) | (1ull << s);
  if (PMINDEX_FAULT("fptree.insert.bitmap_before_kv")) {
    pm::StoreAtomic(Bm(l), nb);
    pm::Persist(l, 8);
    pm::Flush(kw, 8);
    pm::Flush(vw, 8);
    pm::Fence();
    return Status::OK();
  }
  if (!PMINDEX_FAULT("fptree.insert.skip_kv_flush")) {
    pm::Flush(kw, 8);
    if (!lay_.fp) pm::Flush(vw, 8);  // ptree: separate arrays
    pm::Fence();
  }
  pm::StoreAtomic(Bm(l), nb);
  pm::Persist(l, 8);
  return Status::OK();
}

// Alg. 8 (bitmap flip) or the in-place p-atomic value store.
template <bool kConc, bool kBytes>
Status FPTree<kConc, kBytes>::UpdateIn(char* l, int old, const SKey& k, Slice value, Claims* rc) {
  if (inplace_) {
    pm::StoreAtomic(Val(l, old), SliceToU64(value));
    pm::Persist(Val(l, old), 8);
    return Status::OK();
  }
  uint64_t bm = Ld(Bm(l));
  int s = FreeSlotFor(bm, HomeLine(k));  // caller guarantees a free slot
  uint64_t* vw = Val(l, s);
  if (vbytes_) {
    PMINDEX_RETURN_IF_ERROR(WriteBlock(vw, value));
  } else {
    pm::StoreAtomic(vw, SliceToU64(value), __ATOMIC_RELAXED);
  }
  pm::StoreAtomic(Key(l, s), Ld(Key(l, old)), __ATOMIC_RELAXED);
  if (lay_.fp) pm::StoreAtomic(Fp(l, s), Ld8(Fp(l, old)), __ATOMIC_RELAXED);
  pm::Flush(Key(l, s), 8);
  if (!lay_.fp) pm::Flush(vw, 8);
  pm::Fence();
  pm::StoreAtomic(Bm(l), uint64_t((bm & ~(1ull << old)) | (1ull << s)));
  pm::Persist(l, 8);
  // Cleanup of the old slot: its key pointer is now shared (reset), its value
  // block is garbage (retired: readers may still be in it; fptree_retire.cc).
  // Recovery's alg. 17 check finishes this.
  if (kBytes) {
    pm::StoreAtomic(Key(l, old), uint64_t(0));
    if (!vbytes_ || !lay_.fp) pm::Persist(Key(l, old), 8);
  }
  if (vbytes_) DropBlockWord(Val(l, old), rc);
  return Status::OK();
}

// ---- operations -----------------------------------------------------------------
template <bool kConc, bool kBytes>
Status FPTree<kConc, kBytes>::Put(Slice key, Slice value, Mode mode) {
  if (closed_) return Status::InvalidArgument("index closed");
  PMINDEX_RETURN_IF_ERROR(ValidateKey(key_kind(), max_key_, key));
  PMINDEX_RETURN_IF_ERROR(ValidateValue(value_kind(), max_value_, value));
  SKey k = MakeKey(key);
  Claims rc;  // before the guard: retires after it ends
  if (vbytes_ && mode != Mode::kInsert) PMINDEX_RETURN_IF_ERROR(ClaimRetire(1, &rc));
  EpochGuard g(epoch_, kConc);
  uint64_t lv = 0;
  const uint64_t loff = FindAndLockLeaf(k, &lv);
  char* l = L(loff);
  uint64_t bm = Ld(Bm(l));
  int slot = FindSlot(l, bm, k);
  if (slot >= 0 && mode == Mode::kInsert) {
    LeafUnlockUnchanged(l, lv);
    return Status::AlreadyExists();
  }
  if (slot < 0 && mode == Mode::kUpdate) {
    LeafUnlockUnchanged(l, lv);
    return Status::NotFound();
  }
  bool need_slot = slot < 0 || !inplace_;
  uint64_t noff = 0;
  Rec sep;
  Status st;
  char* target = l;
  if (need_slot && bm == lay_.full) {
    st = SplitLeaf(loff, &noff, &sep);
    if (!st.ok()) {
      LeafUnlock(l);
      return st;
    }
    SKey sk = RecKey(sep);
    int c = kBytes ? CompareKeys(KeyKind::kBytes, k.s, sep.ks) : (k.u < sep.k ? -1 : (k.u > sep.k ? 1 : 0));
    if (c >= 0) target = L(noff);
    // Slots keep their index in the copy, so `slot` is valid in target.
    if (slot >= 0) st = UpdateIn(target, slot, k, value, &rc);
    else st = InsertInto(target, FreeSlotFor(Ld(Bm(target)), HomeLine(k)), k, value);
    InsertSeparator(sk, KeyWordForInner(sk), noff);
    LeafUnlock(L(noff));
    LeafUnlock(l);
    return st;
  }
  if (slot >= 0) st = UpdateIn(l, slot, k, value, &rc);
  else st = InsertInto(l, FreeSlotFor(bm, HomeLine(k)), k, value);
  LeafUnlockAt(l, lv);
  return st;
}

template <bool kConc, bool kBytes>
Status FPTree<kConc, kBytes>::Find(Slice key, std::string* value) {
  if (closed_) return Status::InvalidArgument("index closed");
  PMINDEX_RETURN_IF_ERROR(ValidateKey(key_kind(), max_key_, key));
  SKey k = MakeKey(key);
  EpochGuard g(epoch_, kConc);
  for (;;) {
    uint64_t lv = 0;
    char* l = L(FindLeaf(k, &lv));
    uint64_t bm = Ld(Bm(l));
    int slot = FindSlot(l, bm, k);
    if (slot < 0) {
      if (LeafValidate(l, lv)) return Status::NotFound();
      continue;
    }
    uint64_t w = Ld(Val(l, slot));
    if (vbytes_) {
      std::string tmp;
      bool ok = ReadBlock(w, max_value_, &tmp);
      if (!LeafValidate(l, lv)) continue;
      if (!ok) return Status::Corrupt("fptree: bad value block");
      if (value) *value = std::move(tmp);
      return Status::OK();
    }
    if (!LeafValidate(l, lv)) continue;
    if (value) {  // resize + copy: a reused 8-byte string is not reallocated or re-copied via _M_replace
      value->resize(8);
      std::memcpy(value->data(), &w, 8);
    }
    return Status::OK();
  }
}

template <bool kConc, bool kBytes>
Status FPTree<kConc, kBytes>::Remove(Slice key) {
  if (closed_) return Status::InvalidArgument("index closed");
  PMINDEX_RETURN_IF_ERROR(ValidateKey(key_kind(), max_key_, key));
  SKey k = MakeKey(key);
  bool found = false;
  int pending = -1;
  Retired ret;
  Claims rc;  // before the guard: retires after it ends
  PMINDEX_RETURN_IF_ERROR(ClaimRetire(int(kBytes) + int(vbytes_), &rc));
  {
    EpochGuard g(epoch_, kConc);
    uint64_t lv = 0;
    const uint64_t loff = FindAndLockLeaf(k, &lv);
    char* l = L(loff);
    uint64_t bm = Ld(Bm(l));
    const int slot = FindSlot(l, bm, k);
    if (slot < 0) {
      LeafUnlockUnchanged(l, lv);
    } else {
      found = true;
      bm &= ~(1ull << slot);
      pm::StoreAtomic(Bm(l), bm);
      if (!PMINDEX_FAULT("fptree.delete.skip_flush")) pm::Persist(l, 8);
      if (kBytes) DropBlockWord(Key(l, slot), &rc);
      if (vbytes_) DropBlockWord(Val(l, slot), &rc);
      if (bm == 0) pending = DeleteEmptyLeaf(loff, k, &ret);
      else LeafUnlockAt(l, lv);
    }
  }
  if (pending >= 0) FinishLeafDeletion(pending, &ret);
  if (deferred_n_.load(std::memory_order_relaxed)) ProcessDeferred();
  return found ? Status::OK() : Status::NotFound();
}

template <bool kConc, bool kBytes>
uint64_t FPTree<kConc, kBytes>::Size() {
  if (closed_) return 0;
  EpochGuard g(epoch_, kConc);
  uint64_t n = 0;
  ForEachLeaf([&](uint64_t x) {
    char* l = L(x);
    // fptree: a split cuts the old leaf's bitmap before it links the new
    // leaf (both under the leaf's lock), so an unvalidated walk could read
    // the cut bitmap and the old next pointer and miss the moved half. The
    // pair (bitmap, next) is read under the leaf's version: either both from
    // before the split or both after it. Unlocked leaves only: a leaf is
    // locked for one write at a time (deferred deletions leave it unlocked).
    uint64_t bm = 0, nx = 0;
    for (Backoff bo;; bo.Wait()) {
      const uint64_t lv = LeafVersion(l);
      if (lv & kit::VersionLock::kLocked) continue;
      bm = Ld(Bm(l));
      nx = NextAcquire(l);
      if (LeafValidate(l, lv)) break;
    }
    n += __builtin_popcountll(bm);
    return nx;
  });
  return n;
}

template <bool kConc, bool kBytes>
IndexStats FPTree<kConc, kBytes>::Stats() {
  IndexStats s;
  if (closed_) return s;
  s.records = Size();
  s.pm_bytes = pool_->allocator().BytesInUse();
  s.dram_bytes = dram_bytes_.load() + free_leaves_.capacity() * 8 + group_used_.size() * 48;
  // fptree's leaf version table: its resident pages (mincore), i.e. the
  // pages leaves have touched (about 8 bytes per 2^shift bytes of the
  // pool's used range), counted over the pool's used size only, not the
  // whole reservation the table spans.
  if (kConc && vtab_.mapped()) s.dram_bytes += vtab_.ResidentBytes(base_, base_ + pool_->size());
  s.recovery_seconds = recovery_seconds_;
  return s;
}

template <bool kConc, bool kBytes>
Status FPTree<kConc, kBytes>::Close() {
  if (closed_) return Status::OK();
  closed_ = true;
  for (Inner* n : nodes_) {
    if constexpr (kBytes)
      for (uint32_t i = 0; i < n->count.load(std::memory_order_relaxed); i++) FreeKeyWord(n->keys()[i].load(std::memory_order_relaxed));
    std::free(n);
  }
  nodes_.clear();
  deferred_.clear();
  if (retire_) retire_->Reclaim(epoch_, true, [](const kit::RetireSlot&) {});
  retire_.reset();
  Status s = pool_ ? pool_->Close() : Status::OK();
  return s;
}

#define FPT_INSTANTIATE(C, B)                                                    \
  template Status FPTree<C, B>::InsertInto(char*, int, const SKey&, Slice);      \
  template Status FPTree<C, B>::UpdateIn(char*, int, const SKey&, Slice, Claims*); \
  template Status FPTree<C, B>::Put(Slice, Slice, Mode);                         \
  template Status FPTree<C, B>::Find(Slice, std::string*);                       \
  template Status FPTree<C, B>::Remove(Slice);                                   \
  template uint64_t FPTree<C, B>::Size();                                        \
  template IndexStats FPTree<C, B>::Stats();                                     \
  template Status FPTree<C, B>::Close();
FPT_INSTANTIATE_ALL(FPT_INSTANTIATE)
#undef FPT_INSTANTIATE

// ---------------------------------------------------------------------------
// Factories.
namespace {

// fptree_single's default leaves per group: as many as fill the allocator
// size class that a group of 8 leaves lands in (a group is 64 + G * leaf
// bytes: 8 leaves of 1,024 bytes take 8,256 bytes and their 10,240-byte
// class, which 9 leaves nearly fill).
long long DefaultGroupSize(bool fp, uint32_t m) {
  const uint64_t lb = LeafBytes(fp, m), b8 = 64 + 8 * lb;
  if (b8 > pm::Allocator::kMaxRunBlock) return 8;
  const uint64_t cls = pm::alloc_internal::kClassSizes[pm::alloc_internal::ClassOf(b8)];
  return std::min<long long>(64, (cls - 64) / lb);
}

template <uint8_t V>
Status Make(std::unique_ptr<pm::Pool> pool, const Options& o, std::unique_ptr<Index>* out, bool create) {
  if (o.read_only) return Status::Unsupported("fptree recovers on open and cannot open a pool read-only");
  Params p(o.params);
  PMINDEX_RETURN_IF_ERROR(V == kSingle ? p.Expect({"leaf_size", "inner_size", "group_size", "update"})
                                       : p.Expect({"leaf_size", "inner_size", "update"}));
  KeyKind kk = o.key_kind;
  ValueKind vk = o.value_kind;
  const Root* existing = nullptr;  // the root whose config is used (an initialised tree, or pm_config)
  bool pm_config = false;
  if (!create) {
    PMINDEX_RETURN_IF_ERROR(ClassifyRoot(pool.get(), V, &create, &pm_config));
    if (!create || pm_config) existing = pool->root<Root>();
  }
  if (existing) {
    kk = KeyKind(existing->key_kind);
    vk = ValueKind(existing->value_kind);
  }
  Options eff = o;
  eff.key_kind = kk;
  eff.value_kind = vk;
  if (existing) {
    eff.max_key_size = existing->max_key;
    eff.max_value_size = existing->max_value;
  }
  if (eff.max_key_size == 0 || eff.max_key_size > (1u << 20)) return Status::InvalidArgument("max_key_size out of range");
  if (eff.max_value_size > (64u << 20)) return Status::InvalidArgument("max_value_size out of range");
  bool bytes = kk == KeyKind::kBytes;
  long long leaf = 0, inner = 0, group = 0;
  long long def_leaf = V == kPTree ? 32 : 56;
  long long def_inner = V == kConcurrent ? (bytes ? 64 : 128) : V == kSingle ? (bytes ? 2048 : 4096) : (bytes ? 256 : 4096);
  PMINDEX_RETURN_IF_ERROR(p.GetInt("leaf_size", def_leaf, 2, V == kPTree ? 64 : 56, &leaf));
  PMINDEX_RETURN_IF_ERROR(p.GetInt("inner_size", def_inner, 3, 65536, &inner));
  PMINDEX_RETURN_IF_ERROR(p.GetInt("group_size", DefaultGroupSize(V != kPTree, uint32_t(leaf)), 1, 64, &group));
  std::string upd;
  PMINDEX_RETURN_IF_ERROR(p.GetString("update", "inplace", &upd));
  if (upd != "inplace" && upd != "flip") return Status::InvalidArgument("parameter update must be 'inplace' or 'flip'");
  if (pm_config) {
    // A crashed initialisation that had allocated its first leaf: finish it
    // with the config that leaf (group) was allocated for.
    leaf = existing->leaf_slots;
    inner = existing->inner_size;
    group = existing->group_size;
    upd = existing->inplace_update ? "inplace" : "flip";
  }
  std::unique_ptr<Index> idx;
  auto build = [&](auto* t) -> Status {
    idx.reset(t);
    if (create) return t->Format(V, eff, uint32_t(leaf), uint32_t(inner), uint32_t(group), upd == "inplace");
    return t->Open();
  };
  Status st;
  constexpr bool C = V == kConcurrent;
  if (bytes) st = build(new FPTree<C, true>(std::move(pool), eff));
  else st = build(new FPTree<C, false>(std::move(pool), eff));
  if (!st.ok()) {
    idx->Close();
    return st;
  }
  *out = std::move(idx);
  return Status::OK();
}
template <uint8_t V>
Status CreateV(std::unique_ptr<pm::Pool> pool, const Options& o, std::unique_ptr<Index>* out) {
  return Make<V>(std::move(pool), o, out, true);
}
template <uint8_t V>
Status OpenV(std::unique_ptr<pm::Pool> pool, const Options& o, std::unique_ptr<Index>* out) {
  return Make<V>(std::move(pool), o, out, false);
}

}  // namespace
}  // namespace fptree

using fptree::FPTreeIntrospect;

bool FPTreeShape(Index* idx, uint64_t* inner_nodes, uint64_t* leaves) {
  auto* t = dynamic_cast<FPTreeIntrospect*>(idx);
  if (!t) return false;
  t->Shape(inner_nodes, leaves);
  return true;
}

bool FPTreeLeafVersionWords(Index* idx, std::string* why) {
  auto* t = dynamic_cast<FPTreeIntrospect*>(idx);
  if (!t) {
    *why = "not an FPTree";
    return false;
  }
  return t->LeafVersionWords(why);
}

bool FPTreeGetPmWords(Index* idx, FPTreePmWords* out) {
  auto* t = dynamic_cast<FPTreeIntrospect*>(idx);
  if (!t) return false;
  t->PmWords(out);
  return true;
}

bool FPTreeInEpoch(Index* idx, const std::function<void()>& fn) {
  auto* t = dynamic_cast<FPTreeIntrospect*>(idx);
  if (!t) return false;
  t->InEpoch(fn);
  return true;
}

bool FPTreeHomeShare(Index* idx, uint64_t* at_home, uint64_t* records) {
  auto* t = dynamic_cast<FPTreeIntrospect*>(idx);
  if (!t) return false;
  t->HomeShare(at_home, records);
  return true;
}

void RegisterFPTree(std::vector<IndexFactory>* r) {
  using namespace fptree;  // NOLINT: the variants and factories
  IndexFactory f;
  f.info = {"fptree", true, true, true,
            "FPTree (SIGMOD'16), concurrent: PM leaves with fingerprints, DRAM inner nodes, optimistic locking"};
  f.create = &CreateV<kConcurrent>;
  f.open = &OpenV<kConcurrent>;
  r->push_back(f);
  f.info = {"fptree_single", true, true, false, "FPTree (SIGMOD'16), single-threaded with amortised leaf groups"};
  f.create = &CreateV<kSingle>;
  f.open = &OpenV<kSingle>;
  r->push_back(f);
  f.info = {"ptree", true, true, false, "PTree (FPTree paper sec. 5): selective persistence and unsorted leaves only"};
  f.create = &CreateV<kPTree>;
  f.open = &OpenV<kPTree>;
  r->push_back(f);
}

}  // namespace pmindex::internal

// The fault switches of this folder (pmindex/pm/fault.h; docs/CONTRIBUTING.md).
PMINDEX_FAULT_SWITCHES(fptree,
                       "fptree.delete.force_deferred",
                       "fptree.delete.keep_log_prev",
                       "fptree.delete.skip_flush",
                       "fptree.insert.bitmap_before_kv",
                       "fptree.insert.skip_kv_flush",
                       "fptree.merge.skip_copy_flush",
                       "fptree.move.skip_copy_flush",
                       "fptree.retire.clear_word_first",
                       "fptree.retire.skip_word_persist",
                       "fptree.split.skip_log");
