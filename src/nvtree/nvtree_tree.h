// nvtree/nvtree_tree.h: the NV-Tree class (PiBench sec. 3.2): PM leaves with
// append-only entries (nvtree_format.h) under DRAM inner nodes
// (nvtree_inner.h). Templated on the key kind: K = uint64_t for u64 keys,
// std::string for byte keys; byte values are a run-time flag.
//
// Files: nvtree.cc (operations on one leaf: find, insert, update, delete,
// scan; the adapter and registration), nvtree_smo.cc (leaf replacement and
// inner rebuilds), nvtree_recovery.cc (create, open, recovery, Check, owned
// blocks).
//
// Concurrency. Each leaf has a kit::VersionLock in a DRAM lock table keyed
// by its address (kit/lock_table.h): nothing about locking is in PM, so a
// lookup writes nothing and a crash leaves no lock behind (the table is
// zero at every open). A writer locks the leaf it routed to (TryLock: a
// replaced leaf's word is obsolete, so the writer routes again), appends and
// commits, and unlocks. A lookup takes no lock: it reads the version, the
// count and the entries, and validates the version; since a writer holds the
// lock from its first store until the count is durable, a validated read saw
// only durable entries. One mutex (smo_mu_) serialises leaf replacements and
// inner rebuilds; a writer that found its leaf full takes it while holding
// the leaf's lock, and no holder of smo_mu_ waits for a leaf lock, so there
// is no cycle. Nobody waits for a lock inside an epoch guard (they leave the
// guard, back off, and retry), so the grace period a replacement waits for
// always ends.
//
// Key filter. The lock table's slot of a leaf also holds a Bloom filter of
// the keys of its committed entries (DRAM only, LeafSlot below), so that an
// insert of a new key, which must show that the key is absent, reads the
// filter instead of every entry of the leaf. The filter is valid while its
// tag equals the leaf's unlocked version | 1: only a holder of the leaf's
// lock reads or writes it, a writer that appends adds its key and sets the
// tag to the version its unlock publishes, and every other change of the
// leaf changes the version (a zero-filled slot, as at open, is never valid;
// a new leaf's filter is written by the replacement that fills it).
//
// Thread safety: every Index call may run concurrently except Check,
// ForEachOwnedBlock and Close (quiescent).
#pragma once

#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "core/index_util.h"
#include "kit/backoff.h"
#include "kit/epoch.h"
#include "kit/hash.h"
#include "kit/lock_table.h"
#include "kit/pm_block.h"
#include "kit/version_lock.h"
#include "nvtree/nvtree_format.h"
#include "nvtree/nvtree_inner.h"
#include "pmindex/pm/allocator.h"
#include "pmindex/pm/persist.h"
#include "pmindex/pm/pool.h"

namespace pmindex::internal::nvtree {

struct Config {
  uint32_t leaf_cap = 64;
  uint32_t pln_cap = 128;
  uint32_t fanout = 128;
};

inline uint64_t Ld(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
inline uint64_t LdAcq(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }

// A leaf's DRAM slot in the lock table (one per granule of the pool, zero at
// open): its version lock and a blocked Bloom filter over the keys of its
// committed entries, valid while tag == (unlocked version | 1). A key sets
// three bits of one of six words (384 bits): with 64 keys in a leaf about
// 5% of absent keys pass the filter.
struct alignas(64) LeafSlot {
  static constexpr uint64_t kWords = 6;
  kit::VersionLock lock;
  uint64_t tag;
  uint64_t bloom[kWords];

  static uint64_t Word(uint64_t h) { return ((h >> 32) * kWords) >> 32; }
  static uint64_t Mask(uint64_t h) {
    return (uint64_t(1) << (h & 63)) | (uint64_t(1) << ((h >> 6) & 63)) | (uint64_t(1) << ((h >> 12) & 63));
  }
  static void Add(uint64_t* bits, uint64_t h) { bits[Word(h)] |= Mask(h); }
  // False if no committed entry of the leaf holds a key of hash h (the
  // filter must be valid: the caller holds the lock and checked the tag).
  bool MayHold(uint64_t h) const { return (Ld(&bloom[Word(h)]) & Mask(h)) == Mask(h); }
  // Adds h to the filter (the lock holder).
  void AddKey(uint64_t h) {
    uint64_t* w = &bloom[Word(h)];
    __atomic_store_n(w, Ld(w) | Mask(h), __ATOMIC_RELAXED);
  }
  // Marks the filter valid at unlocked version `version`.
  void SetValid(uint64_t version) { __atomic_store_n(&tag, version | 1, __ATOMIC_RELAXED); }
  // Publishes bits as the filter, valid at unlocked version `version`.
  void Store(const uint64_t* bits, uint64_t version) {
    for (uint64_t w = 0; w < kWords; w++) __atomic_store_n(&bloom[w], bits[w], __ATOMIC_RELAXED);
    SetValid(version);
  }
  bool Valid(uint64_t version) const { return Ld(&tag) == (version | 1); }
};
static_assert(sizeof(LeafSlot) == 64);

template <bool kBytes>
class NVTree final : public Index {
 public:
  using K = std::conditional_t<kBytes, std::string, uint64_t>;
  enum class Mode { kInsert, kUpdate, kUpsert, kRemove };

  NVTree(std::unique_ptr<pm::Pool> pool, const Options& o);
  ~NVTree() override { Close(); }

  std::string_view Name() const override { return "nvtree"; }
  KeyKind key_kind() const override { return kBytes ? KeyKind::kBytes : KeyKind::kU64; }
  ValueKind value_kind() const override { return vbytes_ ? ValueKind::kBytes : ValueKind::kU64; }

  Status Insert(Slice key, Slice value) override { return Put(key, value, Mode::kInsert); }
  Status Update(Slice key, Slice value) override { return Put(key, value, Mode::kUpdate); }
  Status Upsert(Slice key, Slice value) override { return Put(key, value, Mode::kUpsert); }
  Status Find(Slice key, std::string* value) override;
  Status Remove(Slice key) override { return Put(key, Slice(), Mode::kRemove); }
  Status Scan(Slice start, size_t n, ScanCallback cb, size_t* count) override;
  uint64_t Size() override { return closed_ ? 0 : count_.load(std::memory_order_relaxed); }
  Status Check() override;
  Status ForEachOwnedBlock(const std::function<void(uint64_t offset)>& fn) override;
  IndexStats Stats() override;
  pm::Pool* pool() override { return closed_ ? nullptr : pool_.get(); }
  Status Close() override;

  // Creation (Format) and open (Open); both end in Recover.
  Status Format(const Options& o, const Config& c);
  Status Open(const Options& o, const Config& c);

  // Introspection for tests and figures (not thread-safe against writers).
  void Shape(uint64_t* leaves, uint64_t* plns, uint64_t* height);
  const Root* root() const { return root_; }
  uint64_t recovery_threads_used() const { return rec_threads_; }

 private:
  struct Rec {  // a record or entry of a leaf
    K key;
    uint64_t kw, vw;
    int idx;
    bool live;
  };
  struct Route {  // where a key's leaf is in the inner nodes
    size_t p, i;
    Pln<K>* pln;
    uint64_t leaf;
  };

  // ---- leaf access
  char* L(uint64_t off) const { return base_ + off; }
  static uint64_t* Count(char* l) { return reinterpret_cast<uint64_t*>(l); }
  static uint64_t* Next(char* l) { return reinterpret_cast<uint64_t*>(l + 8); }
  static Entry* E(char* l, uint64_t j) { return reinterpret_cast<Entry*>(l + kLeafHeader + kEntryBytes * j); }
  kit::VersionLock* VL(uint64_t leaf) const { return &vtab_.At(base_ + leaf)->lock; }
  LeafSlot* Slot(uint64_t leaf) const { return vtab_.At(base_ + leaf); }
  static uint64_t KeyHash(const K& k) {
    if constexpr (kBytes) return kit::FingerprintHashBytes(Slice(k));
    else return kit::Fmix64(k);
  }
  // The filter bits of the keys of entries [0, c) of leaf l; false if a key
  // block cannot be read.
  bool FilterOf(char* l, uint64_t c, uint64_t* bits) const {
    std::memset(bits, 0, LeafSlot::kWords * 8);
    K k{};
    for (uint64_t j = 0; j < c; j++) {
      if (!ReadKey(Ld(&E(l, j)->key), &k)) return false;
      LeafSlot::Add(bits, KeyHash(k));
    }
    return true;
  }
  K MakeKey(Slice s) const {
    if constexpr (kBytes) return std::string(s);
    else return SliceToU64(s);
  }
  Slice KeySlice(const K& k) const {
    if constexpr (kBytes) return Slice(k);
    else return U64Slice(k);
  }
  // True if entry key word kw holds k.
  bool KeyIs(uint64_t kw, const K& k) const {
    if constexpr (kBytes) return kit::BlockEquals(base_, pool_size(), kw, k);
    else return kw == k;
  }
  bool ReadKey(uint64_t kw, K* k) const {
    if constexpr (kBytes) return kit::TryReadBlock(base_, pool_size(), kw, max_key_, k);
    else return *k = kw, true;
  }
  bool ReadValue(uint64_t vw, std::string* v) const {
    if (vbytes_) return kit::TryReadBlock(base_, pool_size(), vw, max_value_, v);
    v->assign(reinterpret_cast<const char*>(&vw), 8);
    return true;
  }
  uint64_t pool_size() const { return pool_->size(); }
  // The deciding (last) committed entry of k among [0, c), or -1.
  // u64 keys: four key words compared per step with one branch (a write
  // of an absent key reads every entry).
  int64_t Latest(char* l, uint64_t c, const K& k) const {
    uint64_t j = c;
    if constexpr (!kBytes) {
      const Entry* e = E(l, 0);
      for (; j >= 4; j -= 4) {
        const bool m3 = Ld(&e[j - 1].key) == k, m2 = Ld(&e[j - 2].key) == k;
        const bool m1 = Ld(&e[j - 3].key) == k, m0 = Ld(&e[j - 4].key) == k;
        if (m3 | m2 | m1 | m0) return int64_t(j) - (m3 ? 1 : m2 ? 2 : m1 ? 3 : 4);
      }
    }
    for (; j-- > 0;)
      if (KeyIs(Ld(&E(l, j)->key), k)) return int64_t(j);
    return -1;
  }
  // Entries [0, c) sorted by key, the deciding entry of each key first and
  // marked live if it is an insert; all = false keeps only live records.
  // False if a key block cannot be read (a damaged or, for an optimistic
  // reader, changing leaf). from: only keys >= *from (> *from unless
  // inclusive).
  bool Records(char* l, uint64_t c, bool all, std::vector<Rec>* out, const K* from = nullptr,
               bool inclusive = true) const;

  // ---- inner nodes
  Route RouteKey(Inner<K>* in, const K& k) const {
    Route r;
    r.p = in->Route(k);
    r.pln = in->pln(r.p);
    r.i = r.pln->Route(k);
    r.leaf = r.pln->leaves[r.i];
    return r;
  }
  static void UnlockUnchanged(kit::VersionLock* vl, uint64_t v) { __atomic_store_n(&vl->word, v, __ATOMIC_RELEASE); }

  // ---- operations
  Status Put(Slice key, Slice value, Mode mode);
  // Appends n entries at c (leaf locked) and commits them with the count.
  Status Append(char* l, uint64_t c, const Entry* ents, int n, Slice key, Slice value, int new_key_at);
  // Replaces `leaf` (locked at version v by the caller, routed to by k) by
  // one or two new leaves holding its live records, or unlinks it if it holds
  // none; unlocks it (obsolete if replaced, unchanged on an error). drop:
  // k is left out (a Remove that the replacement completes). need: entries
  // the caller appends afterwards. compact: one new leaf, never a split.
  // nvtree_smo.cc.
  Status Replace(uint64_t leaf, const K& k, uint64_t v, bool drop, uint32_t need, bool compact);
  // Rebuilds the inner nodes from (lows, leaves) and publishes them (smo_mu_ held).
  void Rebuild(const std::vector<K>& lows, const std::vector<uint64_t>& leaves);
  // Frees the key/value blocks of leaf l (all slots) not in keep, last slot
  // first so that a shared block is freed through its first word.
  Status FreeDeadBlocks(char* l, const std::vector<uint64_t>& keep);
  // Compacts every leaf holding dead entries (a full pool with blocks held
  // by superseded entries). Takes each leaf's lock like a writer.
  Status CompactAll();
  void RetireDram();  // after a grace period: frees retired PLNs / Inners

  // ---- recovery (nvtree_recovery.cc)
  Status Recover();
  Status RecoverLog();
  Status LeafRange(uint64_t off, const std::string& what) const;
  Status CheckConfig(const Root* r) const;
  void LoadConfig();
  // Allocates a leaf into *dest (zeroed when entries hold blocks); with
  // spare_ok, takes the root's spare leaf when the pool is full.
  Status AllocLeaf(uint64_t* dest, bool spare_ok);
  // Writes and flushes recs [lo, hi) as inserts into leaf off (no fence).
  void FillLeaf(uint64_t off, const std::vector<Rec>& recs, size_t lo, size_t hi, uint64_t next);

  std::unique_ptr<pm::Pool> pool_;
  char* base_ = nullptr;
  Root* root_ = nullptr;
  bool closed_ = false;
  bool vbytes_ = false;
  bool pointers_ = false;  // byte keys or values: blocks in entries
  uint32_t cap_ = 64, pln_cap_ = 128, fanout_ = 128, leaf_bytes_ = 0;
  uint32_t max_key_ = 0, max_value_ = 0;
  int recovery_threads_ = 0;
  uint64_t rec_threads_ = 0;
  double recovery_seconds_ = 0;
  std::atomic<uint64_t> count_{0};
  std::atomic<Inner<K>*> inner_{nullptr};
  EpochManager epoch_;
  kit::LockTable<LeafSlot> vtab_;  // lock words and key filters of the leaves
  std::mutex smo_mu_;
  std::vector<Pln<K>*> dead_plns_;      // smo_mu_
  std::vector<Inner<K>*> dead_inners_;  // smo_mu_
};

}  // namespace pmindex::internal::nvtree
