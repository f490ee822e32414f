// nvc_map.h: the NvcHashmap class: its DRAM state and the map of its
// members, by the file that defines them.
//
// Paper: Schwalb et al., IMDM'15, sections 3.1-3.3 (a lock-free persistent
// hash map on a split-ordered list) plus the authors' erratum, which we fix
// (docs/nvc_hashmap.md, "The erratum").
//
//   nvc_format.h       PM layout, link bits, format version
//   nvc_split_order.h  split-order keys, parent buckets
//   nvc_list.h/.cc     the erratum helpers; search, insert/update/upsert,
//                      find, remove (the list of Michael, in split order)
//   nvc_buckets.cc     bucket table: segments, lazy and eager initialisation
//   nvc_slab.cc        node slabs, epoch reclamation of nodes and records
//   nvc_walk.h         the validating list walk shared by Check and Recover
//   nvc_recovery.cc    creation, open, crash recovery, clean close
//   nvc_check.cc       Check, owned blocks, statistics
//   nvc_hashmap.cc     options, Create/Open, registration, test hooks
//
// DRAM state (rebuilt on open, never trusted across a crash): the bucket
// count, mapped segment pointers, the eager-initialisation cursor, per-slot
// record deltas (exact, read by Size) and the shared approximate count (read
// by the growth check), retire lists and free slab slots (one SlotState per
// thread slot, max_threads of them), the slab index, and the per-stripe
// counters of in-flight value updates (dirty_bit mode).
//
// Invariants: a node is freed only after it was unlinked, the unlink was
// persisted and its epoch grace period passed (kit/epoch.h: no reader can
// hold it). Segments are never freed while the index is open.
//
// Thread safety: Insert/Update/Upsert/Find/Remove/Size may be called by any
// number of threads at once (up to max_threads bound at a time: more get
// Busy); Check, ForEachOwnedBlock, Stats and Close need quiescence (no
// operation in flight), as do Create/Open (single-threaded). After Close
// every call answers IndexClosed() (Size 0, Stats empty, pool() nullptr).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/index_util.h"
#include "kit/epoch.h"
#include "nvc_hashmap/nvc_format.h"
#include "nvc_hashmap/nvc_hashmap.h"
#include "nvc_hashmap/nvc_split_order.h"
#include "pmindex/pm/allocator.h"
#include "pmindex/pm/fault.h"
#include "pmindex/pm/persist.h"
#include "pmindex/pm/pool.h"

namespace pmindex::internal::nvc {

// DRAM counters of in-flight value updates (dirty_bit mode), by node: 8
// bytes each, 16 KiB in all, so the line a find loads for its node's stripe
// is usually in its L1 (at one counter per cache line, 128 KiB, it costs
// about one L1 miss per find). Eight stripes share a line: two updaters of
// neighbouring stripes bounce it, which random keys make rare.
constexpr uint64_t kUpdStripes = 2048;
constexpr size_t kLocalFreeMax = 4096;  // per-thread free nodes kept before sharing half
constexpr uint64_t kRetireBatch = 32;
// Eager bucket initialisation (MaybeGrow): every kInitEvery inserts of a
// thread, the next kInitChunk buckets of the last doubling, in one batch.
constexpr uint64_t kInitEvery = 16, kInitChunk = 16;

// How readers make the words they act on durable (the erratum, nvc_list.h).
enum class Fix : uint8_t { kDirtyBit, kFlushOnRead, kNone };

// Test hooks (nvc_hashmap.h; set in nvc_hashmap.cc). Process-wide.
// Everything of this header is internal to libpmindex: hidden visibility
// keeps calls and accesses between the folder's files direct (no PLT or GOT
// indirection), as within one file.
#define PMINDEX_NVC_HIDDEN __attribute__((visibility("hidden")))
PMINDEX_NVC_HIDDEN inline std::atomic<nvc_hashmap_testing::LinkHook> g_link_hook{nullptr};
PMINDEX_NVC_HIDDEN inline std::atomic<nvc_hashmap_testing::LinkHook> g_before_link_hook{nullptr};
PMINDEX_NVC_HIDDEN inline std::atomic<nvc_hashmap_testing::LinkHook> g_value_hook{nullptr};
PMINDEX_NVC_HIDDEN inline std::atomic<nvc_hashmap_testing::LinkHook> g_before_value_hook{nullptr};
PMINDEX_NVC_HIDDEN inline std::atomic<nvc_hashmap_testing::LinkHook> g_find_hook{nullptr};
PMINDEX_NVC_HIDDEN inline std::atomic<nvc_hashmap_testing::LinkHook> g_mark_hook{nullptr};
PMINDEX_NVC_HIDDEN inline std::atomic<nvc_hashmap_testing::BucketFailHook> g_batch_slot_fail_hook{nullptr};
PMINDEX_NVC_HIDDEN inline std::atomic<uint64_t> g_slab_refill_retries{0};  // SlabRefill's PoolFull path taken
PMINDEX_NVC_HIDDEN inline std::atomic<bool> g_force_walk{false};  // tests: crash recovery walks even where it could scan
PMINDEX_NVC_HIDDEN inline std::atomic<uint32_t> g_create_version{0};  // format of new pools (0: kVersion)

inline uint64_t LoadW(const uint64_t* w) { return __atomic_load_n(w, __ATOMIC_ACQUIRE); }

// A set of bucket numbers (Check, Recover: buckets whose dummy is reachable):
// one bit per bucket, 2 MiB at 2^24 buckets.
// Bucket numbers are bounded by the bucket table (the walk checks them).
class BucketSet {
 public:
  void Insert(uint64_t b) {
    if (b / 64 >= words_.size()) words_.resize(std::max<uint64_t>(b / 64 + 1, 2 * words_.size()));
    words_[b / 64] |= uint64_t(1) << (b % 64);
  }
  bool Contains(uint64_t b) const { return b / 64 < words_.size() && (words_[b / 64] >> (b % 64) & 1); }
  void Merge(const BucketSet& o) {
    if (o.words_.size() > words_.size()) words_.resize(o.words_.size());
    for (size_t w = 0; w < o.words_.size(); w++) words_[w] |= o.words_[w];
  }
  // The set whose word w (buckets 64w .. 64w + 63) is words[w].
  void Assign(std::vector<uint64_t> words) { words_ = std::move(words); }

 private:
  std::vector<uint64_t> words_;
};

// Slab slots as bits (Check, Recover: the reachable slots), one bitmap of
// 16 words per slab (128 bytes per 32 KiB slab): DRAM in proportion to the
// slabs, none per record.
class SlabBits {
 public:
  // Sets slot idx of slab `slab`; false if it was already set.
  bool Set(uint64_t slab, uint64_t idx) {
    uint64_t& w = bits_[slab][idx / 64];
    const uint64_t m = 1ull << (idx % 64);
    if (w & m) return false;
    w |= m;
    return true;
  }
  void SetWords(uint64_t slab, const std::array<uint64_t, 16>& w) { bits_[slab] = w; }
  // The slab's bitmap, or nullptr if no slot of it is set.
  const uint64_t* Words(uint64_t slab) const {
    auto it = bits_.find(slab);
    return it == bits_.end() ? nullptr : it->second.data();
  }
  bool Test(uint64_t slab, uint64_t idx) const {
    auto it = bits_.find(slab);
    return it != bits_.end() && (it->second[idx / 64] >> (idx % 64) & 1);
  }
  bool Empty(uint64_t slab) const {
    auto it = bits_.find(slab);
    if (it == bits_.end()) return true;
    for (uint64_t w : it->second)
      if (w) return false;
    return true;
  }
  // ORs o in; false if a slot is set in both.
  bool Merge(const SlabBits& o) {
    bool disjoint = true;
    for (const auto& [slab, words] : o.bits_) {
      auto& mine = bits_[slab];
      for (size_t i = 0; i < mine.size(); i++) {
        disjoint &= !(mine[i] & words[i]);
        mine[i] |= words[i];
      }
    }
    return disjoint;
  }

 private:
  std::unordered_map<uint64_t, std::array<uint64_t, 16>> bits_;
};

// Allocator blocks as bits (Recover: the blocks the list owns, nodes
// outside slabs and out-of-line value records), one bit per 16 bytes of
// the pool (the allocator's alignment), allocated on the first Set: DRAM in
// proportion to the pool, at most 1/8 of an 8-byte offset per 64-byte node.
class BlockBits {
 public:
  explicit BlockBits(uint64_t pool_size) : words_((pool_size / 16 + 63) / 64) {}
  // false if off was already set.
  bool Set(uint64_t off) {
    if (bits_.empty()) bits_.assign(words_, 0);
    uint64_t& w = bits_[off / 16 / 64];
    const uint64_t m = 1ull << (off / 16 % 64);
    if (w & m) return false;
    w |= m;
    return true;
  }
  bool Test(uint64_t off) const { return !bits_.empty() && off / 16 / 64 < bits_.size() && (bits_[off / 16 / 64] >> (off / 16 % 64) & 1); }
  // ORs o in; false if a block is set in both.
  bool Merge(const BlockBits& o) {
    if (o.bits_.empty()) return true;
    if (bits_.empty()) bits_.assign(words_, 0);
    bool disjoint = true;
    for (size_t i = 0; i < bits_.size(); i++) {
      disjoint &= !(bits_[i] & o.bits_[i]);
      bits_[i] |= o.bits_[i];
    }
    return disjoint;
  }

 private:
  uint64_t words_;
  std::vector<uint64_t> bits_;
};

// A part of the list for WalkList: from bucket `start`'s dummy (0: the
// head) up to bucket `stop`'s dummy (0: to kEnd). Reaching stop's dummy
// (which the part visits but does not walk past) sets *stopped.
struct WalkRange {
  uint64_t start = 0;
  uint64_t stop = 0;
  bool* stopped = nullptr;
};

// ---------------------------------------------------------------------------
// Thread -> slot binding: the index's epoch manager (kit/epoch.h, bounded to
// max_threads) binds each thread using the index to one slot number until the
// thread exits (an operation run during thread exit, after the binding was
// released, takes a slot for its own duration). The slot number indexes the
// DRAM SlotState and the persistent PSlot.

struct Retired {
  uint64_t off;
  bool node;  // a node (frees its value record too) or a value record
};

struct alignas(64) SlotState {
  std::atomic<int64_t> delta{0};   // records inserted - removed through this slot (read by Size)
  int64_t unpushed = 0;  // owner thread only: delta not yet added to approx_count_
  uint64_t ops = 0;  // owner thread only
  std::mutex limbo_mu;
  RetireList<Retired> limbo;  // retired by this slot's operations, freed after their grace period
  // Free slab node slots (volatile; node_alloc=slab). Used only by the thread
  // owning the slot (and by Close/recovery, single-threaded).
  std::vector<uint64_t> free_nodes[kNumClasses];
};

// Where a search starts: a published dummy's word and its split-order key.
struct Start {
  uint64_t* word;
  uint64_t so;
};

struct Pos {
  uint64_t* pp_word = nullptr;  // word pointing to prev (nullptr: prev is the start dummy)
  uint64_t pp_raw = 0;          // its value when we passed it
  uint64_t* prev_word = nullptr;
  uint64_t curr_raw = 0;  // *prev_word as loaded (exact, for CAS)
  Node* curr = nullptr;   // the regular node curr_raw names (nullptr: a dummy or the end)
  bool found = false;
};

enum class PutMode { kInsert, kUpdate, kUpsert };

class PMINDEX_NVC_HIDDEN NvcHashmap final : public Index {
 public:
  NvcHashmap(std::unique_ptr<pm::Pool> pool, Fix fix, uint64_t lf, bool slab)
      : pool_(std::move(pool)), base_(pool_->base()), fix_(fix), lf_(lf), slab_(slab) {
    root_ = pool_->root<Root>();
  }
  ~NvcHashmap() override { Close(); }

  static Status Create(std::unique_ptr<pm::Pool> pool, const Options& o, std::unique_ptr<Index>* out);
  static Status Open(std::unique_ptr<pm::Pool> pool, const Options& o, std::unique_ptr<Index>* out);
  static Status Finish(std::unique_ptr<NvcHashmap> h, Status s, std::unique_ptr<Index>* out);

  std::string_view Name() const override { return "nvc_hashmap"; }
  KeyKind key_kind() const override { return kk_; }
  ValueKind value_kind() const override { return vk_; }

  Status Insert(Slice key, Slice value) override { return Put(key, value, PutMode::kInsert); }
  Status Update(Slice key, Slice value) override { return Put(key, value, PutMode::kUpdate); }
  Status Upsert(Slice key, Slice value) override { return Put(key, value, PutMode::kUpsert); }
  Status Find(Slice key, std::string* value) override;
  Status Remove(Slice key) override;
  Status Scan(Slice, size_t, ScanCallback, size_t* count) override {
    if (count) *count = 0;
    if (closed_) return IndexClosed();
    return Status::Unsupported("nvc_hashmap is a hash index: no ordered scan");
  }
  uint64_t Size() override {
    if (closed_) return 0;
    int64_t n = int64_t(base_count_);
    const uint32_t hwm = epoch_->SlotCount();
    for (uint32_t i = 0; i < hwm; i++) n += slots_[i].delta.load(std::memory_order_relaxed);
    return n < 0 ? 0 : uint64_t(n);
  }
  Status Check() override;
  Status ForEachOwnedBlock(const std::function<void(uint64_t offset)>& fn) override;
  IndexStats Stats() override;
  pm::Pool* pool() override { return closed_ ? nullptr : pool_.get(); }
  Status Close() override;
  uint64_t BucketCountForTest() const { return bucket_count_.load(); }
  int RecoveryWalkersForTest() const { return recovery_walkers_; }
  bool RecoveryScannedForTest() const { return recovery_scanned_; }

 private:
  struct Ctx {
    int slot;
    SlotState* st;
    PSlot* ps;
  };
  // An operation: this thread's slot, inside an epoch guard. !ok(): all
  // max_threads slots are bound to other threads (the operation returns Busy).
  class Op {
   public:
    explicit Op(NvcHashmap* h) : h_(h), g_(*h->epoch_) {}
    bool ok() const { return g_.ok(); }
    Ctx ctx() const {
      const int s = int(g_.slot());
      return Ctx{s, &h_->slots_[s], h_->PS(s)};
    }

   private:
    NvcHashmap* h_;
    EpochManager::Guard g_;
  };

  // Persistent thread slot s (< nslots_): in the root, or in root.xslots.
  PSlot* PS(int s) const { return s < kRootSlots ? &root_->slots[s] : xslots_ + (s - kRootSlots); }
  // The thread slots (DRAM SlotStates, the epoch manager) for n threads;
  // called once, by InitNew or LoadRoot.
  void SetThreadSlots(uint32_t n) {
    nslots_ = n;
    slots_ = std::make_unique<SlotState[]>(n);
    epoch_ = std::make_unique<EpochManager>(n);
  }
  Status BusyStatus() const {
    return Status::Busy("nvc_hashmap: all " + std::to_string(nslots_) + " thread slots are in use (parameter max_threads)");
  }
  // Adds this slot's unpushed record delta to approx_count_ (the growth
  // check's count; Size() reads the exact per-slot deltas).
  void PushCount(const Ctx& c) {
    approx_count_.fetch_add(c.st->unpushed, std::memory_order_relaxed);
    c.st->unpushed = 0;
  }

  // The regular node a link names (raw & kBucketLink == 0): its low bits and
  // its tag masked.
  Node* N(uint64_t raw) const {
    const uint64_t off = raw & ~(kLow | kTagMask);
    return reinterpret_cast<Node*>(off ? base_ + off : nullptr);
  }
  // The tag a new link to a node of split-order key so carries: its window
  // for the current bucket count, or 0 in a pool of a version before tags.
  uint64_t NewTag(uint64_t so) const {
    return TagOf(so, TagShift(bucket_count_.load(std::memory_order_relaxed))) & tag_mask_;
  }
  uint64_t Off(const void* p) const { return uint64_t(static_cast<const char*>(p) - base_); }
  // The key of a regular node (compact: 8 bytes at offset 24; else klen bytes
  // after the 32-byte header).
  const char* KeyPtr(const Node* n) const { return reinterpret_cast<const char*>(n) + (compact_ ? kCompactKeyOff : kHeader); }
  uint32_t KeyLen(const Node* n) const { return compact_ ? 8 : n->klen; }
  Slice NodeKey(const Node* n) const { return Slice(KeyPtr(n), KeyLen(n)); }
  uint64_t InlineValueOff(const Node* n) const { return Off(n) + kHeader + A8(n->klen); }
  // True if value word v of regular node n names an out-of-line record (byte
  // values after an update); u64 values live in the value word itself.
  bool HasRecord(const Node* n, uint64_t v) const { return vk_ == ValueKind::kBytes && v != InlineValueOff(n); }
  // Bytes of the value stored after the key: none for u64 values.
  size_t ValueRecSize(Slice v) const { return vk_ == ValueKind::kU64 ? 0 : 8 + v.size(); }
  // By 32-byte unit: two compact nodes sharing a line get different stripes.
  // Regular nodes are 64-byte aligned: by 64-byte unit, else they would use
  // only the even stripes.
  std::atomic<uint64_t>& UpdStripe(const Node* n) { return upd_[(Off(n) >> (compact_ ? 5 : 6)) & (kUpdStripes - 1)].n; }

  Fix fix() const { return PMINDEX_FAULT("nvc.erratum.no_fix") ? Fix::kNone : fix_; }
  bool dirty_mode() const { return fix_ == Fix::kDirtyBit; }


  Status Validate(Slice key, Slice value) const {
    PMINDEX_RETURN_IF_ERROR(ValidateKey(kk_, max_key_, key));
    return ValidateValue(vk_, max_value_, value);
  }
  int Cmp(const Node* n, uint64_t so, Slice key) const {
    if (n->so != so) return n->so < so ? -1 : 1;
    if (!(so & 1)) return 0;
    return CompareKeys(kk_, NodeKey(n), key);
  }

  // Erratum helpers (defined in nvc_list.h, where the rule is stated).
  static void ClearDirty(uint64_t* w, uint64_t v);
  [[gnu::always_inline]] inline void EnsureWordDurable(uint64_t* w, uint64_t seen);  // inline: on every find and insert
  // dirty_bit's slow path: persist a word seen with kDirty, then clear the
  // bit (nvc_list.cc; not inlined: one persist site for every caller).
  static void PersistDirtyWord(uint64_t* w);
  // The pending slot of a linked node: recovery resolves a stale slot by
  // reachability, so the clear is a volatile store (never flushed).
  static void ClearPending(uint64_t* w) { pm::StoreVolatile(w, uint64_t(0)); }
  void EnsureDelDurable(Node* n);

  // Bucket table (nvc_buckets.cc).
  void SegOf(uint64_t b, int* s, uint64_t* i) const {
    if (b < seg0_) {
      *s = 0;
      *i = b;
      return;
    }
    uint64_t q = b >> log_seg0_;
    int w = 64 - __builtin_clzll(q);
    *s = w;
    *i = b - (seg0_ << (w - 1));
  }
  uint64_t SegSize(int s) const { return s == 0 ? seg0_ : seg0_ << (s - 1); }
  // Bucket b's slot word (its dummy); allocates its segment if `create` (slow
  // path apart, so the common lookup inlines). nullptr: no segment.
  uint64_t* BucketSlot(uint64_t b, bool create) {
    int s;
    uint64_t i;
    SegOf(b, &s, &i);
    if (s >= kMaxSegments) return nullptr;
    if (char* seg = segs_[s].load(std::memory_order_acquire)) return reinterpret_cast<uint64_t*>(seg) + i;
    return create ? NewSegmentSlot(s, i) : nullptr;
  }
  uint64_t* NewSegmentSlot(int s, uint64_t i);
  // Starts loading the bucket-table slot of hash h (the first miss of every
  // operation) while the operation sets up its epoch.
  void PrefetchBucket(uint64_t h) const {
    if (const uint64_t* d = const_cast<NvcHashmap*>(this)->BucketSlot(h & (bucket_count_.load(std::memory_order_relaxed) - 1), false))
      __builtin_prefetch(d);
  }
  uint64_t* Published(uint64_t b) {
    uint64_t* d = BucketSlot(b, false);
    return d && IsPublished(LoadW(d)) ? d : nullptr;
  }
  // Clears kUnpub of a linked dummy whose link is durable (volatile: crash
  // recovery recomputes it, Close persists the table). Concurrent inserts
  // behind the dummy keep the bit, so the CAS loop ends.
  static void Publish(uint64_t* d) {
    uint64_t v = LoadW(d);
    while ((v & kUnpub) && !pm::CasVolatile(d, &v, v & ~kUnpub)) {
    }
  }
  uint64_t FirstBucket(int s) const { return s == 0 ? 0 : seg0_ << (s - 1); }
  // The dummy to start a search for hash h from: its bucket's if published
  // (the common case, inline), else StartForSlow.
  Start StartFor(uint64_t h, const Ctx& c, bool init) {
    const uint64_t bc = bucket_count_.load(std::memory_order_relaxed);
    const uint64_t b = h & (bc - 1);
    if (uint64_t* d = Published(b)) return Start{d, SoDummy(b)};
    return StartForSlow(b, bc, c, init);
  }
  Start StartForSlow(uint64_t b, uint64_t bc, const Ctx& c, bool init);
  uint64_t* InitBucket(uint64_t b, const Ctx& c);
  // Claims bucket b's free slot d (volatile CAS free -> claimed, i.e. kUnpub;
  // on failure *st gets the word).
  static bool ClaimDummy(uint64_t* d, uint64_t* st) { return pm::CasVolatile(d, st, kUnpub | kEnd); }

  void Search(const Start& start, uint64_t so, Slice key, const Ctx& c, Pos* pos);
  uint64_t HelpUnlink(uint64_t* prev_word, uint64_t curr_raw, Node* curr, uint64_t next_raw, const Ctx& c);
  Status AllocNode(const Ctx& c, uint64_t so, Slice key, Slice value, uint64_t next, Node** out);
  Status AllocValue(const Ctx& c, Slice value, uint64_t* out);
  Status Put(Slice key, Slice value, PutMode mode);
  // v: a regular node's value word.
  void ReadValue(uint64_t v, std::string* out) const {
    if (vk_ == ValueKind::kU64) {
      out->resize(8);  // no-op when the caller reuses its string
      std::memcpy(out->data(), &v, 8);
    } else {
      const char* p = base_ + v;
      uint64_t len;
      std::memcpy(&len, p, 8);
      out->assign(p + 8, len);
    }
  }
  // Called after each successful insert: every kInitEvery inserts of a
  // thread, MaybeGrowSlow (eager bucket initialisation, doubling).
  void MaybeGrow(const Ctx& c) {
    static_assert(64 % kInitEvery == 0, "MaybeGrowSlow's doubling check runs every 64 inserts");
    const uint64_t ops = ++c.st->ops;
    if (ops % kInitEvery == 0) MaybeGrowSlow(c, ops);
  }
  void MaybeGrowSlow(const Ctx& c, uint64_t ops);
  void InitBatch(uint64_t b0, uint64_t n, const Ctx& c);

  // Reclamation (nvc_slab.cc).
  void Retire(const Ctx& c, uint64_t off, bool node);
  void Reclaim(int slot, bool all);
  // True if it freed through the allocator (which then needs a fence).
  bool FreeRetired(SlotState* st, PSlot* ps, const Retired& r);
  bool ReclaimForSpace(const Ctx& c);

  // Node slabs (node_alloc=slab; nvc_slab.cc).
  // A free slot of class cls from this thread's list (refilled from the
  // shared list or a new slab when empty).
  Status SlabAlloc(const Ctx& c, int cls, uint64_t* off) {
    auto& mine = c.st->free_nodes[cls];
    if (mine.empty()) PMINDEX_RETURN_IF_ERROR(SlabRefill(c, cls));
    *off = mine.back();
    mine.pop_back();
    return Status::OK();
  }
  Status SlabRefill(const Ctx& c, int cls);
  void SlabFree(SlotState* st, uint64_t off, int cls);
  Status NewSlab(int cls, std::vector<uint64_t>* out);
  uint64_t SlabSlot(uint64_t slab, int cls, uint64_t i) const { return slab + kSlabHeader + i * kClassSize[cls]; }
  // The slab holding pool offset off: (slab offset, class, slot index) if off
  // is exactly a slot of a slab.
  bool InSlab(uint64_t off, uint64_t* slab, int* cls, uint64_t* idx) const {
    auto it = slab_cls_.upper_bound(off);
    if (it == slab_cls_.begin()) return false;
    --it;
    if (off < it->first + kSlabHeader || off >= it->first + kSlabSize) return false;
    const uint64_t rel = off - it->first - kSlabHeader, sz = kClassSize[it->second];
    if (rel % sz || rel / sz >= (kSlabSize - kSlabHeader) / sz) return false;
    *slab = it->first;
    *cls = it->second;
    *idx = rel / sz;
    return true;
  }
  Status LoadSlabs(bool use_bitmaps);
  void WriteSlabBitmaps();
  bool IsSlabNode(const Node* n) const { return compact_ ? slab_ : (n->flags & kSlabFlag) != 0; }
  int SlabClassOf(const Node* n) const { return compact_ ? 0 : int(n->flags >> 4); }

  // The validating walk of the whole list shared by Check and Recover
  // (nvc_walk.h); live_slab collects the reachable slab nodes (*nlive: how many).
  template <class Visitor>
  Status WalkList(Visitor& v, SlabBits* live_slab, uint64_t* nlive, const WalkRange& range = {});
  // Unlinks every slab `empty` says has no slot in use from the slab list
  // and frees it (open: recovery, or after a clean close).
  void FreeEmptySlabs(const std::function<bool(uint64_t, const SlabHdr*)>& empty);
  Status InitNew(const Options& o, uint64_t initial_buckets, uint32_t max_threads);
  std::string MaxSizeMessage() const;
  Status LoadRoot(bool* needs_recovery);
  Status Recover();
  // The two walkers of Recover (nvc_recovery.cc).
  struct RecoveryPart;
  Status RecoverWalk(RecoveryPart* parts, int nparts);
  // Recovery by a sequential pass over the slabs (nvc_scan.cc): pools of
  // format kFirstScanVersion or later with compact slab nodes. *fallback:
  // the image is not one the pass can recover (nothing was stored); walk.
  struct ScanState;
  Status RecoverScan(SlabBits* live_slab, BucketSet* linked, uint64_t* count, bool* fallback);

  std::unique_ptr<pm::Pool> pool_;
  char* base_;
  Root* root_ = nullptr;
  Fix fix_;
  uint64_t lf_;
  KeyKind kk_ = KeyKind::kU64;
  ValueKind vk_ = ValueKind::kU64;
  size_t max_key_ = kMaxKeySize, max_value_ = kMaxValueSize;
  uint64_t seg0_ = 256;
  int log_seg0_ = 8;
  std::atomic<uint64_t> bucket_count_{1};
  // Eager bucket initialisation: buckets [init_next_, init_end_) still to be
  // initialised after the last doubling (DRAM; inserts take chunks of them).
  // Own cache line: inserts of all threads advance init_next_, while every
  // operation reads bucket_count_ and segs_.
  alignas(64) std::atomic<uint64_t> init_next_{0};
  std::atomic<uint64_t> init_end_{0};
  alignas(64) std::atomic<char*> segs_[kMaxSegments] = {};
  std::mutex seg_mu_;
  uint64_t base_count_ = 0;
  // Record count for the growth check: every slot adds its delta every 64
  // inserts (or removes), so growth reads one word instead of every slot.
  alignas(64) std::atomic<int64_t> approx_count_{0};
  uint32_t nslots_ = kRootSlots;  // thread slots (root.max_threads)
  PSlot* xslots_ = nullptr;       // persistent slots kRootSlots.. (root.xslots)
  std::unique_ptr<EpochManager> epoch_;  // binds threads to slots; guards every operation
  std::unique_ptr<SlotState[]> slots_;
  // dirty_bit mode: in-flight in-place value updates per stripe of nodes
  // (DRAM, so nothing stale survives a restart). An updater counts itself in
  // before its store to the value word and out after persisting it; a reader
  // that sees a nonzero count persists the value word before using it.
  struct UpdCounter {
    std::atomic<uint64_t> n{0};
  };
  alignas(64) UpdCounter upd_[kUpdStripes];
  double recovery_seconds_ = 0;
  bool closed_ = false;
  int recovery_threads_ = 1;  // Options::recovery_threads (0: hardware concurrency); the walk uses at most 2
  int recovery_walkers_ = 0;  // walkers of the last crash recovery (tests)
  bool recovery_scanned_ = false;  // the last crash recovery was RecoverScan's (tests)
  uint32_t late_max_threads_ = 0;  // fault nvc.create.skip_max_threads_persist: stored by Finish, unflushed
  uint64_t tag_mask_ = kTagMask;  // 0 in a version 4 or 5 pool: its links are written without tags
  bool slab_;                // node_alloc=slab (the pool's setting wins on open)
  bool compact_ = false;     // u64 keys and values: CompactNode layout
  std::mutex slab_mu_;       // guards slab_cls_ growth and gfree_
  std::map<uint64_t, int> slab_cls_;  // slab offset -> class (volatile index of the slab list)
  std::vector<uint64_t> gfree_[kNumClasses];  // shared free slots
};

}  // namespace pmindex::internal::nvc
