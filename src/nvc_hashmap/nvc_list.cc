// nvc_hashmap.cc: the NVC-Hashmap, a persistent lock-free hash map built on a
// split-ordered list (Schwalb et al., IMDM'15, sections 3.1-3.3, plus the
// authors' erratum, which we fix). Design notes: docs/nvc_hashmap.md.
//
// Structure (paper 3.1, Shalev & Shavit): every entry is a node in ONE sorted
// singly linked list. The sort key is the split-order key: the bit-reversed
// 63-bit hash with the lowest bit set (regular nodes), then the user key for
// equal split-order keys. Bucket b starts at a dummy node whose split-order
// key is reverse(b) (lowest bit clear). The bucket count doubles without
// moving any node; bucket b is initialised lazily by inserting its dummy after
// the dummy of its parent (b with its highest set bit cleared). A dummy is
// the 8-byte word of its bucket's slot in the persistent bucket-table
// segments (bucket 0's slot is the list head), so initialising a bucket
// allocates nothing; links to a dummy carry its bucket number, hence its
// split-order key (format 3; docs/nvc_hashmap.md "Layout").
//
// PM words (8 bytes, pool offsets, paper 3.3 (2)):
//   node.next  = successor | kMark (node deleted, word frozen) | kDirty
//   dummy word = successor | kUnpub (not published yet) | kDirty
//   successor  = a regular node's offset, or bucket << 3 | kBucketLink
//                (a dummy; kEnd = bucket 0 = the end of the list)
//   node.value = the u64 value itself, or the offset of the byte-value record
// kDirty is the erratum's "write pending" bit (fix b): the latest store to
// next (a link or the mark) may not be durable yet. The value word has no
// spare bit; its pending state is a DRAM counter per stripe of nodes.
//
// Invariants: the list is strictly sorted by (split-order key, key); dummies
// are never removed and sit in their own bucket's slot; a slot is published
// only after its dummy's link is durable; a node is freed only after it was unlinked,
// the unlink was persisted, and its epoch grace period passed (kit/epoch.h:
// no reader can hold it).
// Buckets are initialised on demand by inserts and eagerly, in batches, by a
// cursor over the new half after each doubling (MaybeGrow/InitBatch).
//
// Node memory (node_alloc, docs/nvc_hashmap.md "Node slabs"): by default
// nodes of <= 256 bytes (compact 32-byte u64 nodes included) are slots of
// index-owned 32 KiB slabs (a persistent
// list from root.slab_head; each slab is one allocator block). A slot's
// ownership is reachability from the list: free slots live only in DRAM free
// lists, rebuilt on open from the slab bitmaps written at clean close, or by
// the recovery walk after a crash (every unreachable slot is free). Larger
// nodes, and all nodes with node_alloc=allocator, are allocator blocks
// allocated into the thread's pending slot.
//
// Persist ordering (paper 3.3 (4), figure 3):
//   insert: take a free slab slot (or allocate the node into this thread's
//           persistent pending slot), write and persist it (key, value, next)
//           -> [erratum fix: make the link TO the predecessor durable] -> CAS
//           pred.next (linearization point) -> persist pred.next -> clear the
//           pending slot (allocator nodes) and kDirty.
//   new slab: allocate into root.slab_pending -> persist its header ->
//           root.slab_head = slab, persist -> clear slab_pending, persist.
//   update: [byte values: new record allocated into the pending-value slot
//           and persisted] -> count in (update stripe, dirty_bit) -> if next
//           is unmarked, store (u64) or CAS (record) node.value
//           (linearization point) -> persist -> count out; a replaced record
//           is retired. A store that lands after a concurrent remove's mark
//           is linearized just before the mark and never observed.
//   remove: CAS node.next |= kMark|kDirty (linearization point) -> persist
//           -> clear kDirty -> CAS pred.next to the successor (unlink) ->
//           persist; the node is retired and freed after its grace period.
//   find:   read node.value, then node.next (marked: absent), so a late
//           update's value is never returned.
//   bucket batch: write up to 16 dummies, persist (one fence) -> CAS each
//           link -> persist the links (one fence) -> clear kDirty, publish.
// Every operation returns with every line it stored to flushed and fenced
// (the durability lint's rule), except volatile stores (pm::StoreVolatile,
// CasVolatile): kDirty clears, pending-slot clears, bucket-table entries and
// the bucket-count hint, whose durable state recovery ignores or rebuilds.
// Readers (erratum): a word whose value an operation acts on durably (the
// link to the predecessor it links behind, the link to the node it reports,
// that node's value word) is made durable first: always (flush_on_read) or
// only when it carries kDirty, or for a value word when an update of its
// stripe is in flight (dirty_bit, the default).
//
// Recovery: a clean close stores the record count and the slab bitmaps and
// sets root.clean; the next open is O(threads + slabs). After a crash, open walks the list once: it strips
// kDirty, completes removes (unlinks marked nodes), recounts, validates bucket
// entries, resolves the per-thread pending slots (reachable -> clear, else
// free) and frees every allocated block the structure does not own (removed
// nodes that were waiting for their epoch, replaced value records).
//
// Paper deviations (also in docs/nvc_hashmap.md): the paper does not describe
// delete or update; remove linearizes at the mark of next (Michael's list),
// and in-place value updates stay linearizable against it because finds read
// the value before the mark and updates check the mark before storing. The
// paper's erratum fix (a) says no fence is needed; our persistence model
// requires flush + fence before a store that depends on the flushed word, so
// flush_on_read uses pm::Persist.
#include "nvc_hashmap/nvc_hashmap.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kit/epoch.h"
#include "kit/hash.h"
#include "core/index_util.h"
#include "pmindex/pm/allocator.h"
#include "pmindex/pm/fault.h"
#include "pmindex/pm/persist.h"
#include "pmindex/pm/pool.h"

namespace pmindex {
namespace nvc_hashmap_testing {
namespace {
std::atomic<LinkHook> g_link_hook{nullptr};
std::atomic<LinkHook> g_value_hook{nullptr};
std::atomic<LinkHook> g_before_value_hook{nullptr};
std::atomic<LinkHook> g_find_hook{nullptr};
std::atomic<BucketFailHook> g_batch_slot_fail_hook{nullptr};
}
void SetAfterLinkHook(LinkHook hook) { g_link_hook.store(hook, std::memory_order_release); }
void SetAfterValueStoreHook(LinkHook hook) { g_value_hook.store(hook, std::memory_order_release); }
void SetBeforeValueStoreHook(LinkHook hook) { g_before_value_hook.store(hook, std::memory_order_release); }
void SetFindHook(LinkHook hook) { g_find_hook.store(hook, std::memory_order_release); }
void SetInitBatchSlotFailHook(BucketFailHook hook) { g_batch_slot_fail_hook.store(hook, std::memory_order_release); }
}  // namespace nvc_hashmap_testing

namespace internal {
namespace {

constexpr uint64_t kMagic = 0x50414d482d43564eull;  // "NVC-HMAP"
// 2: u64 values in the node's value word, remove marks next.
// 3: 8-byte bucket-table slots (the dummy is its slot's next word), links to
//    dummies carry the bucket number (kBucketLink), the list ends with kEnd.
// 4: the format-3 layout as it stands now: 256 thread slots and compact
//    32-byte nodes for u64 keys and values. Earlier commits wrote three
//    incompatible layouts (64 slots; compact nodes; 256 slots) all as
//    version 3, so version 3 pools are refused rather than guessed at.
constexpr uint32_t kVersion = 4;
// Thread slots: a thread binds one for its lifetime. 256 (format 4; was 64,
// and 96 live threads got Busy): the epoch manager is bounded to it, and
// scans (epoch, Size) stop at the highest slot ever bound (SlotCount()).
constexpr int kMaxSlots = 256;
constexpr int kMaxSegments = 40;
constexpr uint64_t kMaxBuckets = 1ull << 32;
// Low bits of a link word. kBucketLink: the link names bucket (word >> 3)'s
// dummy, not a pool offset; bucket 0 (the head) is never a successor, so
// kEnd = a link to bucket 0 ends the list. In a dummy's own word (its bucket
// slot) bit 0 is kUnpub (claimed, not published yet): dummies are never
// marked, and every CAS of a predecessor's word keeps that bit (KeepUnpub).
constexpr uint64_t kMark = 1, kDirty = 2, kBucketLink = 4, kLow = 7;
constexpr uint64_t kUnpub = kMark;
constexpr uint64_t kEnd = kBucketLink;
constexpr uint64_t kSlotBytes = 8;  // a bucket-table slot: the dummy's next word
// DRAM counters of in-flight value updates (dirty_bit mode), by node: one
// counter per cache line (128 KiB), so an updater's two RMWs invalidate no
// other stripe's line for finds and other updaters.
constexpr uint64_t kUpdStripes = 2048;
constexpr uint32_t kSlabFlag = 2;  // a regular node carved from an index-owned slab
// Index-managed node slabs (node_alloc=slab): one allocator block of
// kSlabSize bytes holds a header (next slab, node class, the free bitmap
// written at clean close) and fixed-size node slots of one class.
// 32 KiB: the allocator's largest run class (larger requests take a whole
// 256 KiB chunk, of which 64 bytes are lost); 1018 slots of 32 bytes
// (compact nodes), 509 of 64, 254 of 128, 127 of 256.
constexpr uint64_t kSlabSize = 32 * 1024;
constexpr uint64_t kSlabHeader = 192;
constexpr uint64_t kSlabMagic = 0x42414c5343564e01ull;
constexpr int kNumClasses = 4;  // node slots of 32 (compact nodes), 64, 128, 256 bytes
constexpr uint64_t kClassSize[kNumClasses] = {32, 64, 128, 256};
constexpr size_t kLocalFreeMax = 4096;  // per-thread free nodes kept before sharing half
// A bucket-table slot word: 0 free; kUnpub set: claimed (being linked, or
// linked but its link not yet durable); else published (its dummy is in the
// list and the link to it is durable).
constexpr size_t kHeader = 32;
constexpr uint64_t kRetireBatch = 32;
// Eager bucket initialisation (MaybeGrow): every kInitEvery inserts of a
// thread, the next kInitChunk buckets of the last doubling, in one batch.
constexpr uint64_t kInitEvery = 16, kInitChunk = 16;

enum class Fix : uint8_t { kDirtyBit, kFlushOnRead, kNone };

// A regular list node; key bytes follow the header, then (8-aligned) the
// inline value record. Non-compact nodes are >= 64 bytes, hence 64-byte
// aligned; compact nodes (CompactNode, u64 keys and values) are 32 bytes,
// 32-byte aligned in a slab (64-byte blocks with node_alloc=allocator).
// Either way the header never straddles a cache line. Dummies are not Nodes: a dummy is the 8-byte
// word of its bucket-table slot (its next), its split-order key is
// SoDummy(bucket), known from the link that names it.
struct Node {
  uint64_t next;
  uint64_t so;     // split-order key (odd)
  uint64_t value;  // u64 values: the value; byte values: the record offset; no flag bits
  uint32_t klen;
  uint32_t flags;
};
static_assert(sizeof(Node) == kHeader);
// A compact node (u64 keys and u64 values, format 3): 32 bytes, half a cache
// line, no klen/flags (the key is 8 bytes; a compact node is a slab node iff
// the pool uses slabs, class 0). At 300K records the nodes take 9.6 MB instead
// of 19.2 MB: more of them stay in the cache (docs/nvc_hashmap.md).
struct CompactNode {
  uint64_t next, so, value, key;
};
static_assert(sizeof(CompactNode) == 32 && offsetof(CompactNode, key) == 24);
constexpr size_t kCompactKeyOff = 24;

// Persistent per-thread slot: allocation destinations (allocate-into-
// destination) and the word handed to Allocator::Free.
struct alignas(64) PSlot {
  uint64_t pending;      // a new node or dummy until it is linked
  uint64_t pending_val;  // a new out-of-line value record until it is installed
  uint64_t scratch;      // a block being freed
  uint64_t pad[5];
};

struct Root {
  // Line 0: configuration, written once at creation (magic last).
  uint64_t magic;
  uint32_t version;
  uint8_t key_kind, value_kind;
  uint16_t reserved;
  uint64_t max_key, max_value;
  uint64_t seg0;  // buckets in segment 0 (power of two)
  uint64_t head;  // unused since version 3 (0): bucket 0's slot is the list head
  uint64_t slab_head;   // first node slab (node_alloc=slab), linked by SlabHdr::next
  uint64_t node_alloc;  // 0: one allocator block per node; 1: slabs (fixed at creation)
  // Line 1: mutable state.
  uint64_t bucket_count;  // a durable hint; a smaller value loses nothing
  uint64_t count;         // records; valid only when clean == 1
  uint64_t clean;         // 1 after a clean close
  uint64_t scratch;       // Free() destination during recovery
  uint64_t slab_pending;  // a new slab until it is linked into slab_head
  uint64_t pad1[3];
  // Bucket-table segments: segment 0 holds buckets [0, seg0), segment s >= 1
  // holds [seg0 << (s-1), seg0 << s). Each slot is an 8-byte dummy (its next
  // word); slot 0 is the list head.
  uint64_t seg[kMaxSegments];
  PSlot slots[kMaxSlots];
};

// Header of a node slab (three cache lines). next/cls/nslots/magic are
// written and persisted before the slab is linked; the bitmap (bit set = slot
// free) is valid only after a clean close (root.clean == 1).
struct SlabHdr {
  uint64_t next;
  uint64_t cls;  // node class index
  uint64_t nslots;
  uint64_t magic;
  uint64_t pad[4];
  uint64_t free_bits[16];  // up to 1024 slots
};
static_assert(sizeof(SlabHdr) == kSlabHeader);

inline int ClassOf(uint64_t size) {
  for (int k = 0; k < kNumClasses; k++)
    if (size <= kClassSize[k]) return k;
  return -1;
}

inline uint64_t A8(uint64_t n) { return (n + 7) & ~uint64_t(7); }

// A stable hash (it decides where records live in PM, so it must never
// change): kit/hash.h.
inline uint64_t HashKey(KeyKind kind, Slice key) { return kit::StableKeyHash(kind, key); }

inline uint64_t Reverse64(uint64_t x) {
  x = ((x >> 1) & 0x5555555555555555ull) | ((x & 0x5555555555555555ull) << 1);
  x = ((x >> 2) & 0x3333333333333333ull) | ((x & 0x3333333333333333ull) << 2);
  x = ((x >> 4) & 0x0f0f0f0f0f0f0f0full) | ((x & 0x0f0f0f0f0f0f0f0full) << 4);
  return __builtin_bswap64(x);
}
inline uint64_t SoRegular(uint64_t h) { return Reverse64(h | (1ull << 63)); }
inline uint64_t SoDummy(uint64_t b) { return Reverse64(b); }
inline uint64_t ParentBucket(uint64_t b) { return b & ~(1ull << (63 - __builtin_clzll(b))); }

inline uint64_t LoadW(const uint64_t* w) { return __atomic_load_n(w, __ATOMIC_ACQUIRE); }

// A set of bucket numbers (Check, Recover: buckets whose dummy is reachable):
// one bit per bucket, 2 MiB at 2^24 buckets (a hash set took hundreds of MB).
// Bucket numbers are bounded by the bucket table (DummyAfter checks them).
class BucketSet {
 public:
  void Insert(uint64_t b) {
    if (b >= bits_.size()) bits_.resize(std::max<uint64_t>(b + 1, 2 * bits_.size()));
    bits_[b] = true;
  }
  bool Contains(uint64_t b) const { return b < bits_.size() && bits_[b]; }

 private:
  std::vector<bool> bits_;
};

// ---------------------------------------------------------------------------
// Thread -> slot binding: the index's epoch manager (kit/epoch.h, bounded to
// kMaxSlots) binds each thread using the index to one slot number until the
// thread exits (an operation run during thread exit, after the binding was
// released, takes a slot for its own duration). The slot number indexes the
// DRAM SlotState and the persistent PSlot.
class NvcHashmap;

struct Retired {
  uint64_t off;
  bool node;  // a node (frees its value record too) or a value record
};

struct alignas(64) SlotState {
  std::atomic<int64_t> delta{0};   // records inserted - removed through this slot
  uint64_t ops = 0;  // owner thread only
  std::mutex limbo_mu;
  RetireList<Retired> limbo;  // retired by this slot's operations, freed after their grace period
  // Free slab node slots (volatile; node_alloc=slab). Used only by the thread
  // owning the slot (and by Close/recovery, single-threaded).
  std::vector<uint64_t> free_nodes[kNumClasses];
};

struct Pos {
  uint64_t* pp_word = nullptr;  // word pointing to prev (nullptr: prev is the start dummy)
  uint64_t pp_raw = 0;          // its value when we passed it
  uint64_t* prev_word = nullptr;
  uint64_t curr_raw = 0;  // *prev_word as loaded (exact, for CAS)
  Node* curr = nullptr;   // the regular node curr_raw names (nullptr: a dummy or the end)
  bool found = false;
};

// The link without its mark/kUnpub and kDirty bits: what a new node's next
// or an unlink copies.
inline uint64_t Succ(uint64_t raw) { return raw & ~(kMark | kDirty); }
// The kUnpub bit of a predecessor's word, kept by every CAS of that word: a
// dummy's word may carry it; a regular predecessor's word as loaded by a
// search is unmarked, so this is 0 for it.
inline uint64_t KeepUnpub(uint64_t exp) { return exp & kUnpub; }
inline uint64_t BucketLink(uint64_t b) { return (b << 3) | kBucketLink; }

enum class PutMode { kInsert, kUpdate, kUpsert };

class NvcHashmap final : public Index {
 public:
  NvcHashmap(std::unique_ptr<pm::Pool> pool, Fix fix, uint64_t lf, bool slab)
      : pool_(std::move(pool)), base_(pool_->base()), fix_(fix), lf_(lf), slab_(slab) {
    root_ = pool_->root<Root>();
  }
  ~NvcHashmap() override { Close(); }

  static Status Create(std::unique_ptr<pm::Pool> pool, const Options& o, std::unique_ptr<Index>* out);
  static Status Open(std::unique_ptr<pm::Pool> pool, const Options& o, std::unique_ptr<Index>* out);

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
    return Status::Unsupported("nvc_hashmap is a hash index: no ordered scan");
  }
  uint64_t Size() override {
    int64_t n = int64_t(base_count_);
    const uint32_t hwm = epoch_.SlotCount();
    for (uint32_t i = 0; i < hwm; i++) n += slots_[i].delta.load(std::memory_order_relaxed);
    return n < 0 ? 0 : uint64_t(n);
  }
  Status Check() override;
  Status ForEachOwnedBlock(const std::function<void(uint64_t offset)>& fn) override;
  IndexStats Stats() override;
  pm::Pool* pool() override { return pool_.get(); }
  Status Close() override;

 private:
  struct Ctx {
    int slot;
    SlotState* st;
    PSlot* ps;
  };
  // An operation: this thread's slot, inside an epoch guard. !ok(): all
  // kMaxSlots slots are bound to other threads (the operation returns Busy).
  class Op {
   public:
    explicit Op(NvcHashmap* h) : h_(h), g_(h->epoch_) {}
    bool ok() const { return g_.ok(); }
    Ctx ctx() const {
      const int s = int(g_.slot());
      return Ctx{s, &h_->slots_[s], &h_->root_->slots[s]};
    }

   private:
    NvcHashmap* h_;
    EpochManager::Guard g_;
  };

  // The regular node an untagged link names (raw & kBucketLink == 0).
  Node* N(uint64_t raw) const { return reinterpret_cast<Node*>((raw & ~kLow) ? base_ + (raw & ~kLow) : nullptr); }
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

  // Erratum helpers.
  // Clears kDirty if *w still holds v (whose pointer is already durable).
  // A volatile store: whether the clear reaches PM does not matter, recovery
  // strips every kDirty bit; so it is never flushed.
  static void ClearDirty(uint64_t* w, uint64_t v) {
    uint64_t e = v;
    pm::CasVolatile(w, &e, v & ~kDirty);
  }
  void EnsureWordDurable(uint64_t* w, uint64_t seen);
  // The pending slot of a linked node: recovery resolves a stale slot by
  // reachability, so the clear is a volatile store (never flushed).
  static void ClearPending(uint64_t* w) { pm::StoreVolatile(w, uint64_t(0)); }
  void EnsureDelDurable(Node* n);

  // Bucket table.
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
  static bool IsPublished(uint64_t w) { return w && !(w & kUnpub); }
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
  uint64_t* StartFor(uint64_t h, const Ctx& c, bool init);
  uint64_t* InitBucket(uint64_t b, const Ctx& c);
  // Claims bucket b's free slot d (volatile CAS free -> claimed, i.e. kUnpub;
  // on failure *st gets the word).
  static bool ClaimDummy(uint64_t* d, uint64_t* st) { return pm::CasVolatile(d, st, kUnpub | kEnd); }

  void Search(uint64_t* start, uint64_t so, Slice key, const Ctx& c, Pos* pos);
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
  void MaybeGrow(const Ctx& c);
  void InitBatch(uint64_t b0, uint64_t n, const Ctx& c);

  // Reclamation.
  void Retire(const Ctx& c, uint64_t off, bool node);
  void Reclaim(int slot, bool all);
  // True if it freed through the allocator (which then needs a fence).
  bool FreeRetired(SlotState* st, PSlot* ps, const Retired& r);
  bool ReclaimForSpace(const Ctx& c);

  // Node slabs (node_alloc=slab).
  Status SlabAlloc(const Ctx& c, int cls, uint64_t* off);
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

  // For list walks that validate (Check, Recover): the slot word of bucket
  // b's dummy, named by a link after split-order key prev_so; nullptr and
  // *err if the bucket has no slot or the link breaks the split order.
  uint64_t* DummyAfter(uint64_t b, uint64_t prev_so, std::string* err) {
    uint64_t* w = b < kMaxBuckets ? BucketSlot(b, false) : nullptr;
    if (!w) *err = "link to bucket " + std::to_string(b) + " outside the bucket table";
    else if (prev_so >= SoDummy(b)) *err = "split order violated at bucket " + std::to_string(b) + "'s dummy";
    else return w;
    return nullptr;
  }
  Status InitNew(const Options& o, uint64_t initial_buckets);
  Status LoadRoot(bool* needs_recovery);
  Status Recover();

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
  EpochManager epoch_{kMaxSlots};  // binds threads to slots; guards every operation
  SlotState slots_[kMaxSlots];
  // dirty_bit mode: in-flight in-place value updates per stripe of nodes
  // (DRAM, so nothing stale survives a restart). An updater counts itself in
  // before its store to the value word and out after persisting it; a reader
  // that sees a nonzero count persists the value word before using it.
  struct alignas(64) UpdCounter {
    std::atomic<uint64_t> n{0};
  };
  UpdCounter upd_[kUpdStripes];
  double recovery_seconds_ = 0;
  bool closed_ = false;
  bool slab_;                // node_alloc=slab (the pool's setting wins on open)
  bool compact_ = false;     // u64 keys and values: CompactNode layout
  std::mutex slab_mu_;       // guards slab_cls_ growth and gfree_
  std::map<uint64_t, int> slab_cls_;  // slab offset -> class (volatile index of the slab list)
  std::vector<uint64_t> gfree_[kNumClasses];  // shared free slots
};

// ---------------------------------------------------------------------------
// Erratum fixes.

// Makes the value of *w that the caller is about to act on durable.
//
// pm::LoadAcquire (which the durability lint watches) is issued exactly where
// an operation acts durably on a word another thread may have written: in
// none and flush_on_read modes always, in dirty_bit mode when the word
// carries kDirty (then it is persisted before use). A clean word in dirty_bit
// mode is durable by construction (kDirty is cleared only after the persist),
// even if its cache line is dirty with an unrelated word (e.g. a concurrent
// update of the same node's value), which the line-granular lint cannot tell.
void NvcHashmap::EnsureWordDurable(uint64_t* w, uint64_t seen) {
  if (!w) return;
  switch (fix()) {
    case Fix::kNone:
      pm::LoadAcquire(w);
      return;
    case Fix::kFlushOnRead:
      pm::LoadAcquire(w);
      pm::Persist(w, 8);
      return;
    case Fix::kDirtyBit: {
      if (!((LoadW(w) | seen) & kDirty)) return;
      const uint64_t v = pm::LoadAcquire(w);
      pm::Persist(w, 8);
      if (v & kDirty) ClearDirty(w, v);
      return;
    }
  }
}

// A deleted (marked) node: its mark must be durable before anyone reports
// the key absent or unlinks the node. The remover publishes the mark with
// kDirty (dirty_bit mode), like a link.
void NvcHashmap::EnsureDelDurable(Node* n) {
  switch (fix()) {
    case Fix::kNone:
      pm::LoadAcquire(&n->next);
      return;
    case Fix::kFlushOnRead:
      pm::LoadAcquire(&n->next);
      pm::Persist(&n->next, 8);
      return;
    case Fix::kDirtyBit: {
      if (!(LoadW(&n->next) & kDirty)) return;
      const uint64_t v = pm::LoadAcquire(&n->next);
      pm::Persist(&n->next, 8);
      if (v & kDirty) ClearDirty(&n->next, v);
      return;
    }
  }
}

// ---------------------------------------------------------------------------
// Bucket table.

uint64_t* NvcHashmap::NewSegmentSlot(int s, uint64_t i) {
  char* seg;
  {
    std::lock_guard<std::mutex> g(seg_mu_);
    seg = segs_[s].load(std::memory_order_acquire);
    if (!seg) {
      if (!pool_->allocator().AllocateZeroed(&root_->seg[s], SegSize(s) * kSlotBytes).ok()) return nullptr;
      seg = base_ + root_->seg[s];
      segs_[s].store(seg, std::memory_order_release);
    }
  }
  return reinterpret_cast<uint64_t*>(seg) + i;
}

// The dummy to start a search for hash h: its bucket's, initialised on
// demand if `init`; otherwise, or if that is not possible now (pool full,
// another thread initialising it), the nearest published ancestor's, which is
// correct (the list is complete) but walks further. Remove and Update pass
// init = false: they never allocate.
//
// On demand, the whole aligned group of kInitChunk buckets around b is
// initialised in one batch (2 fences for up to 16 dummies, instead of 2 for
// b's alone; the eager cursor then skips them): after a doubling, inserts
// into not yet initialised buckets of the new half cost 2.37 -> ~2.1 fences
// per insert (docs/nvc_hashmap.md). Groups of buckets >= kInitChunk have
// all their parents below the group (parent = b - 2^k, 2^k >= kInitChunk).
uint64_t* NvcHashmap::StartFor(uint64_t h, const Ctx& c, bool init) {
  const uint64_t bc = bucket_count_.load(std::memory_order_relaxed);
  uint64_t b = h & (bc - 1);
  if (uint64_t* d = Published(b)) return d;
  if (init) {
    if (b >= kInitChunk) {
      const uint64_t g = b & ~(kInitChunk - 1);
      InitBatch(g, std::min(kInitChunk, bc - g), c);
      if (uint64_t* d = Published(b)) return d;
    }
    if (uint64_t* d = InitBucket(b, c)) return d;
  }
  while (b) {
    b = ParentBucket(b);
    if (uint64_t* d = Published(b)) return d;
  }
  return BucketSlot(0, false);
}

// Links bucket b's dummy, which lives in its bucket-table slot (no
// allocation). The slot is claimed with a volatile CAS (free -> claimed), so
// one thread writes it; others use an ancestor meanwhile (never wait). The
// slot is published (linked) only after its link is durable.
uint64_t* NvcHashmap::InitBucket(uint64_t b, const Ctx& c) {
  if (b == 0) return BucketSlot(0, false);
  uint64_t* d = BucketSlot(b, true);
  if (!d) return nullptr;
  if (IsPublished(LoadW(d))) return d;
  const uint64_t pb = ParentBucket(b);
  uint64_t* parent = Published(pb);
  if (!parent) parent = InitBucket(pb, c);
  if (!parent) return nullptr;
  uint64_t st = 0;
  if (!ClaimDummy(d, &st)) return IsPublished(st) ? d : nullptr;
  const uint64_t so = SoDummy(b);
  Pos pos;
  for (;;) {
    Search(parent, so, Slice(), c, &pos);
    if (pos.found) {  // impossible: only this slot holds bucket b's dummy
      pm::StoreVolatile(d, uint64_t(0));
      return nullptr;
    }
    // The dummy (its word, still unpublished) is durable before it is linked.
    pm::StoreAtomic(d, Succ(pos.curr_raw) | kUnpub);
    pm::Persist(d, kSlotBytes);
    EnsureWordDurable(pos.pp_word, pos.pp_raw);
    uint64_t exp = pos.curr_raw;
    const uint64_t desired = BucketLink(b) | (dirty_mode() ? kDirty : 0) | KeepUnpub(exp);
    if (!pm::Cas(pos.prev_word, &exp, desired)) continue;
    if (auto hook = nvc_hashmap_testing::g_link_hook.load(std::memory_order_acquire)) hook(Slice());
    pm::Persist(pos.prev_word, 8);
    if (dirty_mode()) ClearDirty(pos.prev_word, desired);
    Publish(d);
    return d;
  }
}

// Called after each successful insert. Every 64 inserts of a thread: double
// the bucket count if the load factor is exceeded. Every kInitEvery inserts:
// initialise the next kInitChunk buckets of the last doubling (a batch costs
// 2 fences in all), so that the new buckets are ready by the next doubling
// (one bucket per insert; the doubling from bc to 2bc comes after
// bc * load_factor more inserts, and inserts also initialise their own
// bucket on demand): finds then start from their own bucket instead of
// walking from an ancestor. A faster rate front-loads the same work (each
// bucket is initialised once either way) into the inserts right after a
// doubling.
void NvcHashmap::MaybeGrow(const Ctx& c) {
  const uint64_t ops = ++c.st->ops;
  if (ops % kInitEvery == 0 && init_next_.load(std::memory_order_relaxed) < init_end_.load(std::memory_order_relaxed)) {
    const uint64_t b0 = init_next_.fetch_add(kInitChunk, std::memory_order_relaxed);
    const uint64_t end = init_end_.load(std::memory_order_relaxed);
    if (b0 < end) InitBatch(b0, std::min(kInitChunk, end - b0), c);
  }
  if ((ops & 63) != 0) return;
  uint64_t bc = bucket_count_.load(std::memory_order_relaxed);
  if (bc >= kMaxBuckets || Size() <= bc * lf_) return;
  if (!bucket_count_.compare_exchange_strong(bc, bc * 2)) return;
  {
    // The new half [bc, 2bc), after what is left of earlier ones.
    std::lock_guard<std::mutex> g(seg_mu_);
    if (init_next_.load(std::memory_order_relaxed) >= init_end_.load(std::memory_order_relaxed))
      init_next_.store(bc, std::memory_order_relaxed);
    init_end_.store(bc * 2, std::memory_order_relaxed);
  }
  // A hint (volatile store): a smaller durable value loses nothing.
  uint64_t cur = pm::LoadRelaxed(&root_->bucket_count);
  while (cur < bc * 2 && !pm::CasVolatile(&root_->bucket_count, &cur, bc * 2)) {
  }
}

// Initialises buckets [b0, b0 + n) that are still free, with InitBucket's
// protocol but batched: write all dummies, persist them (one fence), link
// each (CAS, published with kDirty in dirty_bit mode), persist the links (one
// fence), clear kDirty, publish the slots. A dummy whose parent is not
// published yet, or whose link CAS fails, is left to InitBucket (released or
// finished individually).
void NvcHashmap::InitBatch(uint64_t b0, uint64_t n, const Ctx& c) {
  struct Item {
    uint64_t b;
    uint64_t* d;
    uint64_t desired;  // the link to d
    Pos pos;
  };
  Item items[kInitChunk];
  int k = 0;
  // The searches below are independent: start loading the first node of
  // every parent's chain at once (one miss latency for the batch instead of
  // one per search; the parents' slots are consecutive, hence cached).
  for (uint64_t b = b0; b < b0 + n; b++) {
    if (b == 0) continue;
    const uint64_t* pw = BucketSlot(ParentBucket(b), false);
    const uint64_t v = pw ? LoadW(pw) : 0;
    if (IsPublished(v) && !(v & kBucketLink)) __builtin_prefetch(N(v));
  }
  uintptr_t flushed = 0;  // consecutive buckets share lines (8 slots per line): flush each once
  for (uint64_t b = b0; b < b0 + n && k < int(kInitChunk); b++) {
    if (b == 0) continue;
    auto fail = nvc_hashmap_testing::g_batch_slot_fail_hook.load(std::memory_order_acquire);
    uint64_t* d = fail && fail(b) ? nullptr : BucketSlot(b, true);
    // No slot (pool full while allocating its segment): link the k buckets
    // claimed so far below (returning here would leave them claimed forever).
    if (!d) break;
    if (LoadW(d) != 0) continue;
    uint64_t* parent = Published(ParentBucket(b));
    if (!parent) continue;  // left to on-demand initialisation
    uint64_t st = 0;
    if (!ClaimDummy(d, &st)) continue;
    const uint64_t so = SoDummy(b);
    Item& it = items[k++];
    it.b = b;
    it.d = d;
    Search(parent, so, Slice(), c, &it.pos);
    if (it.pos.found) {  // impossible: only this slot holds bucket b's dummy
      pm::StoreVolatile(d, uint64_t(0));
      k--;
      continue;
    }
    pm::StoreAtomic(d, Succ(it.pos.curr_raw) | kUnpub);
    if (pm::LineOf(d) != flushed) {
      if (flushed) pm::Flush(reinterpret_cast<const void*>(flushed), pm::kCacheLine);
      flushed = pm::LineOf(d);
    }
  }
  if (flushed) pm::Flush(reinterpret_cast<const void*>(flushed), pm::kCacheLine);
  if (k == 0) return;
  pm::Fence();
  bool linked[kInitChunk];
  for (int i = 0; i < k; i++) {
    Item& it = items[i];
    EnsureWordDurable(it.pos.pp_word, it.pos.pp_raw);
    uint64_t exp = it.pos.curr_raw;
    it.desired = BucketLink(it.b) | (dirty_mode() ? kDirty : 0) | KeepUnpub(exp);
    linked[i] = pm::Cas(it.pos.prev_word, &exp, it.desired);
    if (linked[i]) {
      if (auto hook = nvc_hashmap_testing::g_link_hook.load(std::memory_order_acquire)) hook(Slice());
      pm::Flush(it.pos.prev_word, 8);
    }
  }
  pm::Fence();
  for (int i = 0; i < k; i++) {
    Item& it = items[i];
    if (linked[i]) {
      if (dirty_mode()) ClearDirty(it.pos.prev_word, it.desired);
      Publish(it.d);
    } else {
      // The list changed under us: release the claim; InitBucket redoes it.
      pm::StoreVolatile(it.d, uint64_t(0));
      InitBucket(it.b, c);
    }
  }
}

// ---------------------------------------------------------------------------
// The list (Michael's lock-free list in split order).

// Finds the position of (so, key) from the dummy word `start`: prev_word is
// the word to CAS, curr_raw its exact value, curr the regular node it names
// (found: the key's node) or nullptr (a later dummy or the end). A dummy's so
// comes from the link naming it (SoDummy of its bucket), so a search that
// stops at the next bucket's dummy does not touch it.
void NvcHashmap::Search(uint64_t* start, uint64_t so, Slice key, const Ctx& c, Pos* pos) {
  // Without a fix (the paper's original algorithm) every link followed is
  // acted on unchecked: report each one to the observer, so pmcheck's erratum
  // lint sees every read of a not-yet-durable link.
  const bool report = fix() == Fix::kNone;
  auto load = [report](const uint64_t* w) { return report ? pm::LoadAcquire(w) : LoadW(w); };
retry:
  pos->pp_word = nullptr;
  pos->pp_raw = 0;
  pos->prev_word = start;
  pos->curr_raw = load(start);  // exact (a dummy's word may carry kUnpub, never kMark)
  for (;;) {
    const uint64_t raw = pos->curr_raw;
    if (raw & kBucketLink) {
      // A dummy (or kEnd). Dummies are never marked: no unlink to help.
      pos->curr = nullptr;
      const uint64_t b = raw >> 3;
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
      continue;
    }
    Node* curr = N(raw);
    pos->curr = curr;
    if (!curr) {  // a 0 link (never written by this version; Check reports it)
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
  PMINDEX_RETURN_IF_ERROR(Validate(key, value));
  const uint64_t h = HashKey(kk_, key), so = SoRegular(h);
  PrefetchBucket(h);  // segments are never freed while open: no epoch needed
  Op op(this);
  if (!op.ok()) return Status::Busy("nvc_hashmap: more than 256 threads use this index");
  const Ctx c = op.ctx();
  uint64_t* start = StartFor(h, c, mode != PutMode::kUpdate);
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
        if (auto hook = nvc_hashmap_testing::g_before_value_hook.load(std::memory_order_acquire)) hook(key);
        if (vk_ == ValueKind::kU64) {
          pm::StoreAtomic(&cur->value, nv);
          break;
        }
        if (pm::Cas(&cur->value, &old, nv)) break;
      }
      if (!deleted) {
        if (auto hook = nvc_hashmap_testing::g_value_hook.load(std::memory_order_acquire)) hook(key);
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
    uint64_t exp = pos.curr_raw;
    const uint64_t desired = Off(fresh) | (dirty_mode() ? kDirty : 0) | KeepUnpub(exp);
    if (!pm::Cas(pos.prev_word, &exp, desired)) continue;
    if (auto hook = nvc_hashmap_testing::g_link_hook.load(std::memory_order_acquire)) hook(key);
    const bool skip_link = PMINDEX_FAULT("nvc.insert.skip_link_persist");
    if (!skip_link) pm::Persist(pos.prev_word, 8);
    if (!IsSlabNode(fresh)) ClearPending(&c.ps->pending);
    if (dirty_mode()) ClearDirty(pos.prev_word, desired);
    fresh = nullptr;
    c.st->delta.fetch_add(1, std::memory_order_relaxed);
    MaybeGrow(c);
    result = Status::OK();
    break;
  }
  const bool fresh_block = fresh && !IsSlabNode(fresh);
  if (fresh && !fresh_block) SlabFree(c.st, Off(fresh), SlabClassOf(fresh));  // never linked: free as is
  if (fresh_block) pool_->allocator().Free(&c.ps->pending);
  if (fresh_val) pool_->allocator().Free(&c.ps->pending_val);
  if (fresh_block || fresh_val) pm::Fence();  // Free leaves its lane clear to our next fence
  return result;
}

Status NvcHashmap::Find(Slice key, std::string* value) {
  PMINDEX_RETURN_IF_ERROR(ValidateKey(kk_, max_key_, key));
  const uint64_t h = HashKey(kk_, key), so = SoRegular(h);
  PrefetchBucket(h);  // segments are never freed while open: no epoch needed
  Op op(this);
  if (!op.ok()) return Status::Busy("nvc_hashmap: more than 256 threads use this index");
  const Ctx c = op.ctx();
  Pos pos;
  // Finds never initialise buckets (that would flush on the read path): an
  // uninitialised bucket is searched from its nearest published ancestor.
  Search(StartFor(h, c, false), so, key, c, &pos);
  if (!pos.found) return Status::NotFound();
  Node* cur = pos.curr;
  if (auto hook = nvc_hashmap_testing::g_find_hook.load(std::memory_order_acquire)) hook(key);
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
  PMINDEX_RETURN_IF_ERROR(ValidateKey(kk_, max_key_, key));
  const uint64_t h = HashKey(kk_, key), so = SoRegular(h);
  PrefetchBucket(h);  // segments are never freed while open: no epoch needed
  Op op(this);
  if (!op.ok()) return Status::Busy("nvc_hashmap: more than 256 threads use this index");
  const Ctx c = op.ctx();
  uint64_t* start = StartFor(h, c, false);
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
  c.st->delta.fetch_sub(1, std::memory_order_relaxed);
  const bool skip_mark = PMINDEX_FAULT("nvc.remove.skip_mark_persist");
  if (!skip_mark) pm::Persist(&cur->next, 8);
  if (dirty_mode()) ClearDirty(&cur->next, desired);
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

// ---------------------------------------------------------------------------
// Epoch-based reclamation (kit/epoch.h). A node or value record is retired
// by the operation that unlinked (replaced) it, after that was persisted,
// into its slot's list; every kRetireBatch retirements the slot's owner
// stamps the new ones with one epoch advance and frees those whose grace
// period passed (every operation that was active when they were stamped has
// ended). DRAM bookkeeping: the frees themselves are as before.

void NvcHashmap::Retire(const Ctx& c, uint64_t off, bool node) {
  {
    std::lock_guard<std::mutex> g(c.st->limbo_mu);
    c.st->limbo.Add({off, node});
    if (c.st->limbo.size() % kRetireBatch != 0) return;
  }
  Reclaim(c.slot, false);
}

bool NvcHashmap::FreeRetired(SlotState* st, PSlot* ps, const Retired& r) {
  pm::Allocator& a = pool_->allocator();
  bool freed = false;
  if (r.node) {
    const Node* n = reinterpret_cast<const Node*>(base_ + r.off);
    const uint64_t v = LoadW(&n->value);
    if (HasRecord(n, v)) {
      pm::StoreAtomic(&ps->scratch, v);
      a.Free(&ps->scratch);
      freed = true;
    }
    if (IsSlabNode(n)) {
      // Unlinked durably (before Retire): unreachable, hence free. Its PM
      // contents stay as they are until the slot is reused.
      SlabFree(st, r.off, SlabClassOf(n));
      return freed;
    }
  }
  pm::StoreAtomic(&ps->scratch, r.off);
  a.Free(&ps->scratch);
  return true;
}

// ---------------------------------------------------------------------------
// Node slabs. The only allocator transaction is a slab's; a slot's ownership
// is reachability from the list: a slot is in use iff a durable link points to
// it. Free slots are tracked in DRAM (per-thread lists + a shared pool) and
// recomputed on open: from the slab bitmaps after a clean close, by walking
// the list after a crash.

Status NvcHashmap::SlabAlloc(const Ctx& c, int cls, uint64_t* off) {
  auto& mine = c.st->free_nodes[cls];
  if (mine.empty()) {
    std::lock_guard<std::mutex> g(slab_mu_);
    auto& g_free = gfree_[cls];
    const size_t take = std::min<size_t>(g_free.size(), 256);
    mine.insert(mine.end(), g_free.end() - take, g_free.end());
    g_free.resize(g_free.size() - take);
    if (mine.empty()) {
      Status s = NewSlab(cls, &mine);
      if (s.IsPoolFull()) {
        slab_mu_.unlock();
        const bool got = ReclaimForSpace(c);
        slab_mu_.lock();
        if (got && !mine.empty()) s = Status::OK();
      }
      if (!s.ok()) return s;
    }
  }
  *off = mine.back();
  mine.pop_back();
  return Status::OK();
}

void NvcHashmap::SlabFree(SlotState* st, uint64_t off, int cls) {
  auto& mine = st->free_nodes[cls];
  mine.push_back(off);
  if (mine.size() >= kLocalFreeMax) {
    std::lock_guard<std::mutex> g(slab_mu_);
    gfree_[cls].insert(gfree_[cls].end(), mine.begin() + kLocalFreeMax / 2, mine.end());
    mine.resize(kLocalFreeMax / 2);
  }
}

// Allocates a slab (caller holds slab_mu_): allocate into root.slab_pending,
// write and persist the header, link it at the head of the slab list,
// persist, clear slab_pending. Recovery frees a pending slab that is not in
// the list. All its slots go to *out.
Status NvcHashmap::NewSlab(int cls, std::vector<uint64_t>* out) {
  pm::Allocator& a = pool_->allocator();
  PMINDEX_RETURN_IF_ERROR(a.Allocate(&root_->slab_pending, kSlabSize));
  const uint64_t off = root_->slab_pending;
  SlabHdr* hdr = reinterpret_cast<SlabHdr*>(base_ + off);
  const uint64_t n = (kSlabSize - kSlabHeader) / kClassSize[cls];
  SlabHdr h{};
  h.next = root_->slab_head;
  h.cls = uint64_t(cls);
  h.nslots = n;
  h.magic = kSlabMagic;
  pm::Copy(hdr, &h, sizeof(h));
  pm::Persist(hdr, sizeof(h));
  pm::StoreAtomic(&root_->slab_head, off);
  pm::Persist(&root_->slab_head, 8);
  pm::StoreAtomic(&root_->slab_pending, uint64_t(0));
  pm::Persist(&root_->slab_pending, 8);
  slab_cls_[off] = cls;
  for (uint64_t i = n; i-- > 0;) out->push_back(SlabSlot(off, cls, i));
  return Status::OK();
}

// Rebuilds slab_cls_ from the persistent slab list and, if use_bitmaps (open
// after a clean close), the shared free lists from the slabs' bitmaps.
Status NvcHashmap::LoadSlabs(bool use_bitmaps) {
  pm::Allocator& a = pool_->allocator();
  slab_cls_.clear();
  for (auto& g : gfree_) g.clear();
  uint64_t n = 0;
  for (uint64_t off = root_->slab_head; off; off = reinterpret_cast<SlabHdr*>(base_ + off)->next) {
    if (off % 64 || off >= pool_->size() || !a.IsAllocated(off) || a.UsableSize(off) < kSlabSize)
      return Status::Corrupt("nvc_hashmap: slab list points to " + std::to_string(off) + ", not a slab block");
    const SlabHdr* h = reinterpret_cast<SlabHdr*>(base_ + off);
    if (h->magic != kSlabMagic || h->cls >= uint64_t(kNumClasses) ||
        h->nslots != (kSlabSize - kSlabHeader) / kClassSize[h->cls])
      return Status::Corrupt("nvc_hashmap: bad slab header at " + std::to_string(off));
    if (!slab_cls_.emplace(off, int(h->cls)).second || ++n > pool_->size() / kSlabSize)
      return Status::Corrupt("nvc_hashmap: slab list has a cycle");
    if (use_bitmaps)
      for (uint64_t i = 0; i < h->nslots; i++)
        if (h->free_bits[i / 64] >> (i % 64) & 1) gfree_[h->cls].push_back(SlabSlot(off, int(h->cls), i));
  }
  return Status::OK();
}

// Clean close: record every free slot in its slab's bitmap (every slot that
// is not free is reachable: Close frees all retired nodes first).
void NvcHashmap::WriteSlabBitmaps() {
  std::map<uint64_t, std::vector<uint64_t>> bits;
  for (auto& [off, cls] : slab_cls_) bits[off].assign(16, 0);
  auto mark = [&](uint64_t node) {
    uint64_t slab, idx;
    int cls;
    if (InSlab(node, &slab, &cls, &idx)) bits[slab][idx / 64] |= 1ull << (idx % 64);
  };
  for (int k = 0; k < kNumClasses; k++) {
    for (uint64_t o : gfree_[k]) mark(o);
    for (auto& st : slots_)
      for (uint64_t o : st.free_nodes[k]) mark(o);
  }
  for (auto& [off, b] : bits) {
    SlabHdr* h = reinterpret_cast<SlabHdr*>(base_ + off);
    pm::Copy(h->free_bits, b.data(), sizeof(h->free_bits));
    pm::Flush(h->free_bits, sizeof(h->free_bits));
  }
  pm::Fence();
}

void NvcHashmap::Reclaim(int slot, bool all) {
  SlotState& st = slots_[slot];
  PSlot* ps = &root_->slots[slot];
  std::lock_guard<std::mutex> g(st.limbo_mu);
  bool freed = false;
  auto free_one = [&](const Retired& r) { freed |= FreeRetired(&st, ps, r); };
  if (all) st.limbo.ReclaimAll(free_one);
  else st.limbo.Reclaim(epoch_, free_one);
  // Free leaves its lane clear to the caller's next fence; returning slab
  // slots to the DRAM free lists stores nothing to PM (no fence needed).
  if (freed) pm::Fence();
}

// On PoolFull: free what this thread retired whose grace period passed.
bool NvcHashmap::ReclaimForSpace(const Ctx& c) {
  size_t before;
  {
    std::lock_guard<std::mutex> g(c.st->limbo_mu);
    before = c.st->limbo.size();
  }
  if (before == 0) return false;
  // One pass: it frees the entries stamped by an earlier Reclaim whose stamp
  // is below the smallest announced epoch. The ones it stamps now cannot go
  // in this operation (the caller's own guard announces an epoch <= their
  // stamp), so repeating it would only rescan.
  Reclaim(c.slot, false);
  std::lock_guard<std::mutex> g(c.st->limbo_mu);
  return c.st->limbo.size() < before;
}

// ---------------------------------------------------------------------------
// Whole-structure operations.

Status NvcHashmap::ForEachOwnedBlock(const std::function<void(uint64_t)>& fn) {
  if (closed_) return Status::InvalidArgument("nvc_hashmap is closed");
  fn(*pool_->root_slot());
  for (int s = 0; s < kMaxSegments; s++)
    if (root_->seg[s]) fn(root_->seg[s]);
  for (uint64_t off = root_->slab_head; off; off = reinterpret_cast<SlabHdr*>(base_ + off)->next) fn(off);
  // Dummies live in the segments; regular nodes outside slabs are blocks.
  for (uint64_t raw = LoadW(BucketSlot(0, false));;) {
    if (raw & kBucketLink) {
      const uint64_t* w = (raw >> 3) ? BucketSlot(raw >> 3, false) : nullptr;
      if (!w) break;
      raw = LoadW(w);
      continue;
    }
    Node* n = N(raw);
    if (!n) break;
    if (!IsSlabNode(n)) fn(Off(n));  // slab nodes: the slab is the block
    const uint64_t v = LoadW(&n->value);
    if (HasRecord(n, v)) fn(v);
    raw = LoadW(&n->next);
  }
  for (auto& st : slots_) {
    std::lock_guard<std::mutex> g(st.limbo_mu);
    st.limbo.ForEach([&](const Retired& r) {
      if (!r.node || !IsSlabNode(reinterpret_cast<const Node*>(base_ + r.off))) fn(r.off);
      if (r.node) {
        const Node* n = reinterpret_cast<const Node*>(base_ + r.off);
        const uint64_t v = LoadW(&n->value);
        if (HasRecord(n, v)) fn(v);
      }
    });
  }
  return Status::OK();
}

Status NvcHashmap::Check() {
  if (closed_) return Status::InvalidArgument("nvc_hashmap is closed");
  pm::Allocator& a = pool_->allocator();
  auto bad = [](const std::string& m) { return Status::Corrupt("nvc_hashmap: " + m); };
  BucketSet dummies;                       // buckets whose dummy is reachable
  std::unordered_set<uint64_t> live_slab;  // reachable slab nodes
  uint64_t count = 0;
  {
    // The slab list must equal slab_cls_ (our volatile index of it).
    size_t n = 0;
    for (uint64_t off = root_->slab_head; off; off = reinterpret_cast<SlabHdr*>(base_ + off)->next) {
      if (!slab_cls_.count(off) || ++n > slab_cls_.size()) return bad("slab list disagrees with the slab index");
      if (!a.IsAllocated(off)) return bad("slab " + std::to_string(off) + " not allocated");
    }
    if (n != slab_cls_.size()) return bad("slab list disagrees with the slab index");
  }
  uint64_t* pw = BucketSlot(0, false);  // the word we stand on
  if (!pw || !IsPublished(LoadW(pw))) return bad("bucket 0's slot (the list head) is not published");
  const Node* prev = nullptr;  // the regular node we stand on (nullptr: a dummy)
  uint64_t prev_so = 0;
  const uint64_t psize = pool_->size();
  for (;;) {
    const uint64_t raw = LoadW(pw);
    if (prev && (raw & kMark)) return bad("reachable node at " + std::to_string(Off(prev)) + " is marked deleted");
    if (raw & kBucketLink) {
      const uint64_t b = raw >> 3;
      if (b == 0) break;  // kEnd
      std::string err;
      uint64_t* w = DummyAfter(b, prev_so, &err);
      if (!w) return bad(err);
      if (!IsPublished(LoadW(w))) return bad("linked dummy of bucket " + std::to_string(b) + " is not published");
      dummies.Insert(b);
      pw = w;
      prev = nullptr;
      prev_so = SoDummy(b);
      continue;
    }
    Node* n = N(raw);
    if (!n) return bad("null link (0) after split-order key " + std::to_string(prev_so));
    const uint64_t off = Off(n);
    int cl = 0;
    uint64_t sl = 0, ix = 0;
    if (InSlab(off, &sl, &cl, &ix)) {
      if (!IsSlabNode(n) || SlabClassOf(n) != cl) return bad("slab node " + std::to_string(off) + " has wrong flags");
      if (!live_slab.emplace(off).second) return bad("slab node " + std::to_string(off) + " reached twice");
    } else if (off % 64 || off >= psize || !a.IsAllocated(off) || IsSlabNode(n)) {
      return bad("next pointer " + std::to_string(off) + " does not point to an allocated node");
    }
    if (!(n->so & 1)) return bad("regular node " + std::to_string(off) + " has a dummy's split-order key");
    if (prev_so > n->so) return bad("split order violated at node " + std::to_string(off));
    if (prev_so == n->so && (!prev || Cmp(prev, n->so, NodeKey(n)) >= 0))
      return bad("duplicate or unordered keys at node " + std::to_string(off));
    if (kk_ == KeyKind::kU64 ? KeyLen(n) != 8 : (n->klen == 0 || n->klen > max_key_))
      return bad("bad key length at node " + std::to_string(off));
    if (SoRegular(HashKey(kk_, NodeKey(n))) != n->so)
      return bad("node " + std::to_string(off) + " split-order key does not match its key's hash");
    const uint64_t rec = LoadW(&n->value);
    if (HasRecord(n, rec)) {
      if (rec >= psize || !a.IsAllocated(rec)) return bad("value record of node " + std::to_string(off) + " not allocated");
    }
    if (vk_ == ValueKind::kBytes) {
      uint64_t len;
      std::memcpy(&len, base_ + rec, 8);
      if (len > max_value_) return bad("value length out of range at node " + std::to_string(off));
    }
    count++;
    pw = &n->next;
    prev = n;
    prev_so = n->so;
  }
  // Bucket-table slots: every published (initialised) bucket's dummy is in
  // the list (the converse was checked above); none is half-initialised.
  for (int s = 0; s < kMaxSegments; s++) {
    char* seg = segs_[s].load(std::memory_order_acquire);
    if (!seg) continue;
    for (uint64_t i = 0; i < SegSize(s); i++) {
      const uint64_t b = FirstBucket(s) + i;
      const uint64_t w = LoadW(reinterpret_cast<uint64_t*>(seg) + i);
      if (w == 0 || b == 0) continue;
      if (!IsPublished(w)) return bad("bucket " + std::to_string(b) + " is still being initialised");
      if (!dummies.Contains(b)) return bad("bucket " + std::to_string(b) + " is published but its dummy is not in the list");
    }
  }
  if (count != Size())
    return bad("list holds " + std::to_string(count) + " records but the count says " + std::to_string(Size()));
  // Slab slots: every slot is exactly one of reachable, free, retired (no
  // leak, no slot handed out twice).
  if (!slab_cls_.empty()) {
    std::unordered_set<uint64_t> seen = live_slab;
    uint64_t total = 0;
    for (auto& [off, cls] : slab_cls_) total += (kSlabSize - kSlabHeader) / kClassSize[cls];
    auto add = [&](uint64_t o, const char* what) -> Status {
      uint64_t sl, ix;
      int cl;
      if (!InSlab(o, &sl, &cl, &ix)) return bad(std::string(what) + " slot " + std::to_string(o) + " is not in a slab");
      if (!seen.insert(o).second) return bad(std::string(what) + " slot " + std::to_string(o) + " is also reachable or listed twice");
      return Status::OK();
    };
    {
      std::lock_guard<std::mutex> g(slab_mu_);
      for (auto& gl : gfree_)
        for (uint64_t o : gl) PMINDEX_RETURN_IF_ERROR(add(o, "free"));
    }
    for (auto& st : slots_) {
      for (auto& fl : st.free_nodes)
        for (uint64_t o : fl) PMINDEX_RETURN_IF_ERROR(add(o, "free"));
      std::lock_guard<std::mutex> g(st.limbo_mu);
      Status rs;
      st.limbo.ForEach([&](const Retired& r) {
        if (rs.ok() && r.node && IsSlabNode(reinterpret_cast<const Node*>(base_ + r.off))) rs = add(r.off, "retired");
      });
      PMINDEX_RETURN_IF_ERROR(rs);
    }
    if (seen.size() != total)
      return bad("slabs hold " + std::to_string(total) + " slots but only " + std::to_string(seen.size()) +
                 " are reachable, free or retired (leak)");
  }
  for (int i = 0; i < kMaxSlots; i++) {
    const PSlot& ps = root_->slots[i];
    if (ps.pending || ps.pending_val || ps.scratch)
      return bad("thread slot " + std::to_string(i) + " holds a pending block after quiescence");
  }
  return Status::OK();
}

IndexStats NvcHashmap::Stats() {
  IndexStats s;
  s.records = Size();
  if (!closed_) s.pm_bytes = pool_->allocator().BytesInUse();
  s.dram_bytes = sizeof(*this);
  for (auto& st : slots_) {
    std::lock_guard<std::mutex> g(st.limbo_mu);
    s.dram_bytes += st.limbo.dram_bytes();
  }
  s.recovery_seconds = recovery_seconds_;
  return s;
}

Status NvcHashmap::Close() {
  if (closed_) return Status::OK();
  for (int i = 0; i < kMaxSlots; i++) Reclaim(i, true);
  if (!slab_cls_.empty()) WriteSlabBitmaps();
  // Slot states were published with volatile stores: make them durable so a
  // clean open can trust them.
  for (int s = 0; s < kMaxSegments; s++)
    if (char* seg = segs_[s].load()) pm::Flush(seg, SegSize(s) * kSlotBytes);
  pm::Fence();
  pm::StoreAtomic(&root_->count, Size());
  pm::Persist(&root_->count, 8);
  pm::StoreAtomic(&root_->clean, uint64_t(1));
  pm::Persist(&root_->clean, 8);
  closed_ = true;
  return pool_->Close();
}

// ---------------------------------------------------------------------------
// Creation, opening and recovery.

Status NvcHashmap::InitNew(const Options& o, uint64_t initial_buckets) {
  pm::Allocator& a = pool_->allocator();
  PMINDEX_RETURN_IF_ERROR(a.AllocateZeroed(pool_->root_slot(), sizeof(Root)));
  root_ = pool_->root<Root>();
  kk_ = o.key_kind;
  vk_ = o.value_kind;
  max_key_ = o.max_key_size;
  max_value_ = o.max_value_size;
  compact_ = kk_ == KeyKind::kU64 && vk_ == ValueKind::kU64;
  seg0_ = std::max<uint64_t>(256, initial_buckets);
  log_seg0_ = 63 - __builtin_clzll(seg0_);
  pm::Store(&root_->version, kVersion);
  pm::Store(&root_->key_kind, uint8_t(kk_));
  pm::Store(&root_->value_kind, uint8_t(vk_));
  pm::Store(&root_->max_key, uint64_t(max_key_));
  pm::Store(&root_->max_value, uint64_t(max_value_));
  pm::Store(&root_->seg0, seg0_);
  pm::Store(&root_->node_alloc, uint64_t(slab_ ? 1 : 0));
  pm::Store(&root_->bucket_count, initial_buckets);
  bucket_count_.store(initial_buckets);
  init_end_.store(initial_buckets);  // initialise the initial buckets eagerly
  PMINDEX_RETURN_IF_ERROR(a.AllocateZeroed(&root_->seg[0], seg0_ * kSlotBytes));
  segs_[0].store(base_ + root_->seg[0]);
  uint64_t* head = BucketSlot(0, false);  // bucket 0's dummy: the list head, published, empty list
  pm::StoreAtomic(head, kEnd);
  pm::Persist(head, kSlotBytes);
  pm::Persist(root_, 2 * pm::kCacheLine);
  pm::StoreAtomic(&root_->magic, kMagic);  // the root is valid from here on
  pm::Persist(&root_->magic, 8);
  return Status::OK();
}

Status NvcHashmap::LoadRoot(bool* needs_recovery) {
  if (!root_) return Status::Corrupt("nvc_hashmap: the pool has no root object (creation interrupted?)");
  // The root block must hold a whole Root (magic, segments, thread slots)
  // before any field is read.
  const uint64_t root_off = *pool_->root_slot();
  if (!pool_->allocator().IsAllocated(root_off) || pool_->allocator().UsableSize(root_off) < sizeof(Root))
    return Status::Corrupt("nvc_hashmap: the root block is smaller than the root object (" + std::to_string(sizeof(Root)) +
                           " bytes): not an nvc_hashmap pool of this format");
  if (root_->magic != kMagic) return Status::Corrupt("nvc_hashmap: bad root magic (not an nvc_hashmap pool or creation interrupted)");
  if (root_->version != kVersion)
    return Status::Corrupt("nvc_hashmap: unsupported format version " + std::to_string(root_->version) + " (this build reads version " +
                           std::to_string(kVersion) + " only; version 3 pools may hold any of three incompatible layouts; recreate the pool)");
  if (root_->key_kind > 1 || root_->value_kind > 1) return Status::Corrupt("nvc_hashmap: bad key/value kind in root");
  kk_ = KeyKind(root_->key_kind);
  vk_ = ValueKind(root_->value_kind);
  compact_ = kk_ == KeyKind::kU64 && vk_ == ValueKind::kU64;
  max_key_ = root_->max_key;
  max_value_ = root_->max_value;
  seg0_ = root_->seg0;
  if (root_->node_alloc > 1) return Status::Corrupt("nvc_hashmap: bad node_alloc in root");
  slab_ = root_->node_alloc == 1;
  if (!slab_ && root_->slab_head) return Status::Corrupt("nvc_hashmap: slabs in a node_alloc=allocator pool");
  if (seg0_ == 0 || (seg0_ & (seg0_ - 1)) || seg0_ > (1ull << 30)) return Status::Corrupt("nvc_hashmap: bad segment size");
  log_seg0_ = 63 - __builtin_clzll(seg0_);
  if (root_->head || !root_->seg[0]) return Status::Corrupt("nvc_hashmap: missing bucket table (or a head block: an older format)");
  for (int s = 0; s < kMaxSegments; s++)
    if (root_->seg[s]) segs_[s].store(base_ + root_->seg[s]);
  if (!IsPublished(*BucketSlot(0, false))) return Status::Corrupt("nvc_hashmap: the list head (bucket 0's slot) is not published");
  uint64_t bc = root_->bucket_count;
  if (bc == 0 || (bc & (bc - 1)) || bc > kMaxBuckets) bc = seg0_;
  bucket_count_.store(bc);
  // After a clean close, buckets of the last doubling may be uninitialised;
  // after a crash any bucket may be (recovery frees every slot whose dummy
  // link was not durable), those below bc / 2 are then initialised on demand
  // by inserts. The cursor re-covers the upper half eagerly (initialised
  // slots are skipped).
  init_next_.store(bc / 2);
  init_end_.store(bc);
  *needs_recovery = root_->clean != 1 || pool_->recovered_from_crash();
  if (!*needs_recovery) {
    PMINDEX_RETURN_IF_ERROR(LoadSlabs(/*use_bitmaps=*/true));
    base_count_ = root_->count;
    // After a clean close every slot's block is linked or freed; a nonzero
    // word is a volatile clear that did not reach PM (DAX): drop it.
    for (auto& ps : root_->slots)
      for (uint64_t* w : {&ps.pending, &ps.pending_val, &ps.scratch})
        if (*w) {
          pm::StoreAtomic(w, uint64_t(0));
          pm::Persist(w, 8);
        }
  }
  return Status::OK();
}

Status NvcHashmap::Recover() {
  const auto t0 = std::chrono::steady_clock::now();
  pm::Allocator& a = pool_->allocator();
  const uint64_t psize = pool_->size();
  auto bad = [](const std::string& m) { return Status::Corrupt("nvc_hashmap recovery: " + m); };
  std::vector<uint64_t> owned;
  owned.push_back(*pool_->root_slot());
  for (int s = 0; s < kMaxSegments; s++)
    if (root_->seg[s]) owned.push_back(root_->seg[s]);
  PMINDEX_RETURN_IF_ERROR(LoadSlabs(/*use_bitmaps=*/false));
  for (auto& [off, cls] : slab_cls_) owned.push_back(off);
  std::unordered_set<uint64_t> live_slab;  // reachable slab nodes; every other slot is free
  uint64_t count = 0;
  BucketSet linked;                     // buckets whose dummy is reachable
  uint64_t* pw = BucketSlot(0, false);  // the word we stand on (LoadRoot checked the head)
  const Node* prev = nullptr;           // the regular node we stand on (nullptr: a dummy)
  uint64_t prev_so = 0;
  for (;;) {
    uint64_t raw = *pw;
    if (raw & (kDirty | kMark)) {
      // The word's owner is live (marked nodes are unlinked below before we
      // step on them); kDirty is moot now, and a reachable dummy is
      // published (kUnpub, the mark bit of a dummy's word, cleared).
      raw &= ~(kDirty | kMark);
      pm::StoreAtomic(pw, raw);
      pm::Flush(pw, 8);
    }
    if (raw & kBucketLink) {
      const uint64_t b = raw >> 3;
      if (b == 0) break;  // kEnd
      std::string err;
      uint64_t* w = DummyAfter(b, prev_so, &err);
      if (!w) return bad(err);
      linked.Insert(b);
      pw = w;
      prev = nullptr;
      prev_so = SoDummy(b);
      continue;
    }
    Node* n = N(raw);
    if (!n) return bad("null link (0) after split-order key " + std::to_string(prev_so));
    const uint64_t off = Off(n);
    int cl = 0;
    uint64_t sl = 0, ix = 0;
    bool in_slab = false;
    if (InSlab(off, &sl, &cl, &ix)) {
      if (!IsSlabNode(n) || SlabClassOf(n) != cl) return bad("slab node " + std::to_string(off) + " has wrong flags");
      in_slab = true;
    } else if (off % 64 || off >= psize || !a.IsAllocated(off) || IsSlabNode(n)) {
      return bad("dangling next pointer " + std::to_string(off) + " after split-order key " + std::to_string(prev_so));
    }
    if (!(n->so & 1)) return bad("regular node " + std::to_string(off) + " has a dummy's split-order key");
    const uint64_t v = n->value;
    if (n->next & kMark) {
      // A remove reached its linearization point durably: complete it
      // (unlink); the node is freed by the sweep below.
      pm::StoreAtomic(pw, Succ(n->next));
      pm::Flush(pw, 8);
      continue;
    }
    if (prev_so > n->so || (prev_so == n->so && (!prev || Cmp(prev, n->so, NodeKey(n)) >= 0)))
      return bad("list out of split order at node " + std::to_string(off));
    if (in_slab) {
      if (!live_slab.insert(off).second) return bad("slab node " + std::to_string(off) + " linked twice");
    } else {
      owned.push_back(off);
    }
    count++;
    if (HasRecord(n, v)) {
      if (v >= psize || !a.IsAllocated(v)) return bad("value record of node " + std::to_string(off) + " not allocated");
      owned.push_back(v);
    }
    pw = &n->next;
    prev = n;
    prev_so = n->so;
  }
  pm::Fence();
  std::sort(owned.begin(), owned.end());
  if (std::adjacent_find(owned.begin(), owned.end()) != owned.end()) return bad("a block is owned twice");
  auto is_owned = [&](uint64_t off) { return std::binary_search(owned.begin(), owned.end(), off); };
  // Slot states: a reachable dummy is published (its word was cleaned in the
  // walk); every other slot is reset (a claim, or a dummy whose link did not
  // become durable).
  for (int s = 0; s < kMaxSegments; s++) {
    char* seg = segs_[s].load();
    if (!seg) continue;
    for (uint64_t i = 0; i < SegSize(s); i++) {
      uint64_t* d = reinterpret_cast<uint64_t*>(seg) + i;
      const uint64_t b = FirstBucket(s) + i;
      if (*d && b != 0 && !linked.Contains(b)) {
        pm::StoreAtomic(d, uint64_t(0));
        pm::Flush(d, kSlotBytes);
      }
    }
  }
  pm::Fence();
  // Blocks nobody owns: nodes and value records of unfinished inserts and
  // updates (still in a pending slot), removed nodes that waited for their
  // epoch, replaced value records.
  std::vector<uint64_t> unowned;
  a.ForEachAllocated([&](uint64_t off, size_t) {
    if (!is_owned(off)) unowned.push_back(off);
  });
  std::sort(unowned.begin(), unowned.end());
  std::vector<bool> freed(unowned.size(), false);
  // Pending slots: reachable -> clear; unreachable -> free (into the slot).
  auto resolve = [&](uint64_t* w) {
    if (!*w) return;
    auto it = std::lower_bound(unowned.begin(), unowned.end(), *w);
    if (it != unowned.end() && *it == *w && !freed[it - unowned.begin()]) {
      freed[it - unowned.begin()] = true;
      a.Free(w);
    } else {
      pm::StoreAtomic(w, uint64_t(0));
      pm::Persist(w, 8);
    }
  };
  for (auto& ps : root_->slots) {
    resolve(&ps.pending);
    resolve(&ps.pending_val);
    resolve(&ps.scratch);
  }
  resolve(&root_->scratch);
  resolve(&root_->slab_pending);
  for (size_t i = 0; i < unowned.size(); i++) {
    if (freed[i]) continue;
    pm::StoreAtomic(&root_->scratch, unowned[i]);
    a.Free(&root_->scratch);
  }
  pm::Fence();
  for (auto& [off, cls] : slab_cls_) {
    const uint64_t n = (kSlabSize - kSlabHeader) / kClassSize[cls];
    for (uint64_t i = 0; i < n; i++)
      if (!live_slab.count(SlabSlot(off, cls, i))) gfree_[cls].push_back(SlabSlot(off, cls, i));
  }
  base_count_ = count;
  recovery_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return Status::OK();
}

struct Config {
  Fix fix = Fix::kDirtyBit;
  long long initial_buckets = 1024;
  long long load_factor = 2;
  bool slab = true;
};

Status ParseConfig(const Options& o, Config* cfg) {
  Params p(o.params);
  PMINDEX_RETURN_IF_ERROR(p.Expect({"erratum_fix", "initial_buckets", "load_factor", "node_alloc"}));
  std::string na;
  PMINDEX_RETURN_IF_ERROR(p.GetString("node_alloc", "slab", &na));
  cfg->slab = na == "slab";
  if (na != "slab" && na != "allocator") return Status::InvalidArgument("parameter node_alloc=" + na + " is not one of slab, allocator");
  std::string fix;
  PMINDEX_RETURN_IF_ERROR(p.GetString("erratum_fix", "dirty_bit", &fix));
  if (fix == "dirty_bit") cfg->fix = Fix::kDirtyBit;
  else if (fix == "flush_on_read") cfg->fix = Fix::kFlushOnRead;
  else if (fix == "none") cfg->fix = Fix::kNone;
  else return Status::InvalidArgument("parameter erratum_fix=" + fix + " is not one of dirty_bit, flush_on_read, none");
  PMINDEX_RETURN_IF_ERROR(p.GetInt("initial_buckets", 1024, 1, 1 << 24, &cfg->initial_buckets));
  if (cfg->initial_buckets & (cfg->initial_buckets - 1))
    return Status::InvalidArgument("parameter initial_buckets must be a power of two");
  PMINDEX_RETURN_IF_ERROR(p.GetInt("load_factor", 2, 1, 64, &cfg->load_factor));
  return Status::OK();
}

Status NvcHashmap::Create(std::unique_ptr<pm::Pool> pool, const Options& o, std::unique_ptr<Index>* out) {
  Config cfg;
  PMINDEX_RETURN_IF_ERROR(ParseConfig(o, &cfg));
  if (o.read_only) return Status::Unsupported("nvc_hashmap cannot create a read-only pool");
  if (o.max_key_size == 0 || o.max_key_size > (1u << 20) || o.max_value_size > (1u << 24))
    return Status::InvalidArgument("nvc_hashmap: max_key_size/max_value_size out of range");
  auto h = std::make_unique<NvcHashmap>(std::move(pool), cfg.fix, uint64_t(cfg.load_factor), cfg.slab);
  Status s = h->InitNew(o, uint64_t(cfg.initial_buckets));
  if (!s.ok()) {
    h->closed_ = true;
    h->pool_->Close();
    return s;
  }
  pm::StoreAtomic(&h->root_->clean, uint64_t(0));
  pm::Persist(&h->root_->clean, 8);
  *out = std::move(h);
  return Status::OK();
}

Status NvcHashmap::Open(std::unique_ptr<pm::Pool> pool, const Options& o, std::unique_ptr<Index>* out) {
  Config cfg;
  PMINDEX_RETURN_IF_ERROR(ParseConfig(o, &cfg));
  if (o.read_only || pool->read_only())
    return Status::Unsupported("nvc_hashmap does not support read-only opens (recovery writes)");
  auto h = std::make_unique<NvcHashmap>(std::move(pool), cfg.fix, uint64_t(cfg.load_factor), cfg.slab);
  bool recover = false;
  Status s = h->LoadRoot(&recover);
  if (s.ok() && recover) s = h->Recover();
  if (!s.ok()) {
    h->closed_ = true;
    h->pool_->Close();
    return s;
  }
  pm::StoreAtomic(&h->root_->clean, uint64_t(0));
  pm::Persist(&h->root_->clean, 8);
  *out = std::move(h);
  return Status::OK();
}

}  // namespace

void RegisterNvcHashmap(std::vector<IndexFactory>* r) {
  IndexFactory f;
  f.info = {"nvc_hashmap", /*persistent=*/true, /*ordered=*/false, /*concurrent=*/true,
            "NVC-Hashmap: persistent lock-free split-ordered hash map (IMDM'15) with the erratum fixed"};
  f.create = &NvcHashmap::Create;
  f.open = &NvcHashmap::Open;
  r->push_back(f);
}

}  // namespace internal

namespace nvc_hashmap_testing {
uint64_t SplitOrderKey(KeyKind kind, Slice key) { return internal::SoRegular(internal::HashKey(kind, key)); }
int MaxThreadSlots() { return internal::kMaxSlots; }
}  // namespace nvc_hashmap_testing

}  // namespace pmindex
