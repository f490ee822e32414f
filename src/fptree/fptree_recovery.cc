// fptree.cc: the FPTree family of hybrid SCM-DRAM B+-trees (Oukid et al.,
// SIGMOD'16): `fptree` (concurrent, sec. 4.4/5), `fptree_single`
// (single-threaded with amortised leaf groups, sec. 4.3 + appendix B) and
// `ptree` (sec. 5: selective persistence + unsorted leaves only, keys and
// values in separate arrays). Fixed u64 keys or variable-size keys (sec. 5 +
// appendix C: persistent pointers to key blocks); u64 or variable values
// (persistent pointer to an out-of-line value block).
//
// Layout. Leaves live in PM; inner nodes in DRAM (selective persistence,
// sec. 4.1), rebuilt at open. Leaf (fptree variants, m <= 56 slots):
//   line 0      : 8-byte validity bitmap, then m one-byte fingerprints
//   lines 1..   : m slots of {key word, value word} (16 bytes, 4 per line)
//   trailer line: next leaf (pptr), 8 unused bytes (the lock/version word
//                 until session 5; fptree keeps it in DRAM now),
//                 48-byte scan-order hint (volatile, never trusted unchecked)
// ptree leaf (m <= 64): line 0 = bitmap only, a key array, a value array,
// the trailer. A key word is the u64 key or the offset of a key block
// {u64 len, bytes}; a value word is the u64 value or the offset of a value
// block {u64 len, bytes}. Leaf groups (fptree_single): one allocation of
// {next group, G leaves}, linked from the root.
//
// Invariants: a slot is a record iff its bitmap bit is set; the records of
// leaf i precede those of leaf i+1 (the linked list is in key order); every
// invalid slot has null key/value pointers once no operation or log is in
// flight; every PM block is owned by exactly one persistent word (root slot,
// leaf list/group list, a slot, or a micro-log).
//
// Persist ordering (2 lines + 2 fences per insert without split):
//   insert: write KV slot (+ key/value blocks, allocated into the slot
//           words), persist; store fingerprint, then set the bitmap bit (same
//           line: the fingerprint reaches PM no later than the bitmap),
//           persist line 0. The bitmap store is the commit.
//   update: u64 values: one p-atomic 8-byte value store, persisted (1 line).
//           Otherwise alg. 8: new slot written + persisted, then one p-atomic
//           bitmap store clears the old bit and sets the new one; then the
//           old slot's pointers are reset/freed (recovery finishes that).
//   delete: clear the bit, persist line 0; then free the key/value blocks;
//           a leaf left empty is unlinked with the delete micro-log (alg. 6),
//           also when it is its DRAM parent's only child (the single-child
//           inner nodes above it go with it, a single-child root collapses);
//           only the tree's last leaf stays. No deletion is left to recovery
//           (fptree: one whose neighbour lock stays contended is queued in
//           DRAM and carried out by a later Remove).
//   split : micro-log {cur, new} (alg. 3); the new leaf is allocated into
//           log.new (allocate-into-destination), filled and persisted; the
//           old leaf's bitmap shrink + next pointer (+ pointer cleanup) are
//           persisted; the log is reset (new first, then cur, same line).
// Recovery (alg. 9): group logs (alg. 11/13), split logs (alg. 4), delete
// logs (alg. 7, unlinks of all logs before any free), then one pass over the
// leaf list (parallel per leaf): reset locks, leak checks of alg. 17 for keys
// and values, drop empty leaves, then a bulk build of the inner nodes.
// Corrupt pools: open range-checks everything recovery dereferences (root
// config, log offsets, the leaf and group lists, bitmaps, block words) and
// returns Status::Corrupt naming the word; a root that is not initialised is
// formatted again only if it is a crashed initialisation (ClassifyRoot).
//
// Concurrency (fptree): no HTM. DRAM inner nodes use optimistic lock
// coupling (a version word per node: readers validate, writers upgrade by
// CAS and never wait for a leaf lock while holding one). Each leaf has a
// seqlock word (bit 0 locked, bit 1 obsolete, +4 per write) in a DRAM table
// indexed by the leaf's pool offset (MapLeafVersions: the paper's "never
// persisted" lock, without a third PM line per find): finds and scans read
// leaves optimistically and validate, writers
// lock the leaf by CAS and do the persistent work outside any inner-node
// critical section. Deleted leaves, inner nodes removed by a leaf deletion
// (marked obsolete: readers restart) and their byte-key separators are freed
// after an epoch grace period.
// No thread ever blocks on a leaf lock while holding another lock except
// with try-locks, so the scan/insert deadlock of a public FPTree cannot
// happen (scans take no lock at all).
//
// Home-line placement (fptree, fptree_single; a heuristic, not state): an
// insert or algorithm-8 update prefers a free slot in the slot line chosen
// by the key's hash, and the descent prefetches that line (fptree: with
// line 0; fptree_single prefetches only the home line), so a find's key
// compare of a record at home does not wait for the fingerprints first.
// Lookups still probe every fingerprint; any slot may hold any record.
//
// Scans read each leaf in the order of its scan-order hint: six-bit slot
// indices in the unused 48 bytes of the leaf's trailer line, stored by the
// last scan that sorted the leaf with volatile stores (never flushed, never
// written by writers); it is used only if it lists exactly the valid slots
// with strictly ascending keys, which makes it correct whatever happened
// since it was written (see LoadHint and docs/fptree.md). u64 scans also
// prefetch the next leaves' header lines several leaves ahead from the
// bottom inner node's children (Ahead; a prefetch only, the list is still
// followed through the validated next pointers).
#include "fptree/fptree.h"

#include <immintrin.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "kit/backoff.h"
#include "kit/epoch.h"
#include "kit/hash.h"
#include "core/index_util.h"
#include "pmindex/pm/allocator.h"
#include "pmindex/pm/fault.h"
#include "pmindex/pm/persist.h"
#include "pmindex/pm/pool.h"

#if defined(__SANITIZE_THREAD__)
#define FPT_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FPT_TSAN 1
#endif
#endif

namespace pmindex::internal {

// The library is a shared object: thread_locals default to the general-dynamic
// model, one __tls_get_addr call per access (callgrind: ~10% of a find).
// initial-exec takes a few bytes of static TLS, which glibc reserves also for
// libraries loaded with dlopen (the PiBench plugins).
#define FPT_TLS thread_local __attribute__((tls_model("initial-exec")))
namespace {
FPT_TLS uint64_t tl_probes = 0;
std::atomic<uint64_t> g_deferred_deletions{0};
}  // namespace

uint64_t FPTreeKeyProbes() { return tl_probes; }
uint64_t FPTreeDeferredLeafDeletions() { return g_deferred_deletions.load(); }

namespace {

constexpr uint64_t kMagic = 0x31305452544650ull;  // "PFTRT01"
constexpr int kLogs = 64;
enum Variant : uint8_t { kConcurrent = 0, kSingle = 1, kPTree = 2 };
const char* VariantName(uint8_t v) { return v == kConcurrent ? "fptree" : v == kSingle ? "fptree_single" : "ptree"; }

inline void Pause() { kit::CpuRelax(); }
using kit::Backoff;

// ---------------------------------------------------------------------------
// PM root object.
struct alignas(64) SplitLog {
  uint64_t cur, nw, pad[6];
};
struct alignas(64) DeleteLog {
  uint64_t prev, cur, pad[6];  // prev is stored before cur (same line)
};
struct alignas(64) GroupLog {
  uint64_t new_group, pad[7];
};
struct alignas(64) FreeGroupLog {
  uint64_t prev, cur, pad[6];
};
struct alignas(64) Root {
  uint64_t magic;
  uint8_t variant, key_kind, value_kind, inplace_update;
  uint32_t leaf_slots, inner_size, group_size, leaf_bytes;
  uint32_t max_key, max_value;
  uint64_t initialized;  // alg. 9 "Tree.Status"
  alignas(64) uint64_t head;
  alignas(64) uint64_t groups_head;
  uint64_t groups_tail;
  GroupLog get_log;
  FreeGroupLog free_log;
  SplitLog split[kLogs];
  DeleteLog del[kLogs];
};

// ---------------------------------------------------------------------------
// Corrupt pools (docs/fptree.md "Corrupt pools"). Open validates the PM state
// that recovery trusts and returns Status::Corrupt naming it, before
// recovery stores anything where it can: the root's config words here
// (CheckConfig, ClassifyRoot), every offset recovery dereferences in the
// class (CheckLogs, CheckGroups, CollectLeaves, the per-leaf pass).
Status Bad(const std::string& what) { return Status::Corrupt("fptree: " + what); }
std::string Num(uint64_t x) { return std::to_string(x); }

// Leaf geometry from the variant and the slot count (LoadConfig's layout).
uint32_t LeafTrailer(bool fp, uint32_t m) {
  return fp ? 64 + ((16 * m + 63) / 64) * 64 : 64 + 2 * (((8 * m + 63) / 64) * 64);
}
uint32_t LeafBytes(bool fp, uint32_t m) { return LeafTrailer(fp, m) + 64; }

// The root's config words are within the ranges Make accepts at creation.
Status CheckConfig(const Root* r, uint8_t v) {
  const uint32_t maxm = v == kPTree ? 64 : 56;
  if (r->variant != v) return Bad("root variant " + Num(r->variant) + ", expected " + Num(v));
  if (r->key_kind > 1 || r->value_kind > 1 || r->inplace_update > 1)
    return Bad("root key/value kind or update mode out of range (" + Num(r->key_kind) + "/" + Num(r->value_kind) + "/" +
               Num(r->inplace_update) + ")");
  if (r->leaf_slots < 2 || r->leaf_slots > maxm)
    return Bad("root leaf_slots " + Num(r->leaf_slots) + " out of range [2, " + Num(maxm) + "]");
  if (r->inner_size < 3 || r->inner_size > 65536) return Bad("root inner_size " + Num(r->inner_size) + " out of range [3, 65536]");
  if (v == kSingle && (r->group_size < 1 || r->group_size > 64))
    return Bad("root group_size " + Num(r->group_size) + " out of range [1, 64]");
  if (r->max_key == 0 || r->max_key > (1u << 20)) return Bad("root max_key " + Num(r->max_key) + " out of range");
  if (r->max_value > (64u << 20)) return Bad("root max_value " + Num(r->max_value) + " out of range");
  if (r->leaf_bytes != LeafBytes(v != kPTree, r->leaf_slots))
    return Bad("root leaf_bytes " + Num(r->leaf_bytes) + " does not match leaf_slots " + Num(r->leaf_slots));
  return Status::OK();
}

// What an existing pool's root object is. Format writes, in this order: the
// root block (allocated zeroed) into the root slot; line 0 (magic, config)
// persisted with one fence; the first leaf (fptree_single: its group, via
// get_log) into head; initialized = 1. So a crash inside Format leaves
// initialized == 0, magic 0 or kMagic, at most two allocated blocks (the
// root, one leaf or group), and, once anything beyond the root is
// allocated, magic and a valid config durable, head 0 or one empty leaf
// that ends the list, and no split/delete/free-group log in use. Such a
// root is formatted again (alg. 9 line 1: *fresh = true; *pm_config: with
// the root's own config, the one its first leaf was allocated for). Every
// other root that is not initialised (initialized == 1, magic kMagic) is
// Corrupt: formatting it again would drop every record, and reading it as
// initialised would trust damaged words.
Status ClassifyRoot(pm::Pool* pool, uint8_t v, bool* fresh, bool* pm_config) {
  *fresh = *pm_config = false;
  const uint64_t ro = *pool->root_slot();
  if (ro == 0) {
    *fresh = true;
    return Status::OK();
  }
  if (ro % 8 || pool->size() < sizeof(Root) || ro > pool->size() - sizeof(Root))
    return Bad("root object offset " + Num(ro) + " outside the pool");
  const Root* r = pool->root<Root>();
  if (r->magic == kMagic && r->initialized == 1) return CheckConfig(r, v);
  if (r->initialized != 0 || (r->magic != 0 && r->magic != kMagic))
    return Bad("root magic/initialized words damaged (initialized = " + Num(r->initialized) + ")");
  for (int i = 0; i < kLogs; i++)
    if (r->split[i].cur || r->split[i].nw || r->del[i].cur || r->del[i].prev)
      return Bad("root not initialised but micro-log " + Num(i) + " in use");
  if (r->free_log.cur) return Bad("root not initialised but the free-group log is in use");
  // Creation allocates the root and at most one leaf or one group before
  // initialized = 1; the allocator counts blocks at pool open. More blocks
  // are a damaged initialised tree (e.g. initialized and head both lost).
  const uint64_t blocks = pool->allocator().BlocksInUse();
  const bool allocated = r->head || r->groups_head || r->get_log.new_group;
  if (blocks > (allocated ? 2u : 1u))
    return Bad("root not initialised (initialized = 0, head " + Num(r->head) + ") but the pool holds " + Num(blocks) +
               " blocks: more than a crashed creation allocates");
  *fresh = true;
  if (!allocated) return Status::OK();
  if (r->magic != kMagic) return Bad("root not initialised, without magic, but leaves allocated");
  PMINDEX_RETURN_IF_ERROR(CheckConfig(r, v));
  *pm_config = true;
  if (r->head) {
    const uint64_t h = r->head;
    if (h % 64 || h > pool->size() - r->leaf_bytes) return Bad("root head " + Num(h) + " is not a leaf offset");
    const char* l = pool->base() + h;
    uint64_t bm, next;
    std::memcpy(&bm, l, 8);
    std::memcpy(&next, l + LeafTrailer(v != kPTree, r->leaf_slots), 8);
    if (bm || next)
      return Bad("root not initialised (initialized = 0) but its first leaf holds records or has a next leaf");
  }
  return Status::OK();
}

// ---------------------------------------------------------------------------
// Epoch-based reclamation (kit/epoch.h), one manager per tree: finds, scans
// and writers run inside a guard; a leaf deletion waits for the grace period
// (EpochManager::Synchronize, outside any guard) before it frees the unlinked
// leaf (FinishDeleteLog), the removed inner nodes and their separators. DRAM
// bookkeeping only: no PM store, persist order or format depends on it.
using EpochGuard = EpochManager::Guard;

// ---------------------------------------------------------------------------
// Hashes for fingerprints.
// A key's 64-bit hash (kit/hash.h): the fingerprint is its top byte, the
// home line (see FreeSlotFor) comes from bits 8..23.
inline uint64_t HashU64(uint64_t k) { return kit::FingerprintHashU64(k); }
inline uint8_t FpU64(uint64_t k) { return uint8_t(HashU64(k) >> 56); }
inline uint64_t HashBytes(Slice s) { return kit::FingerprintHashBytes(s); }
inline uint8_t FpBytes(Slice s) { return uint8_t(HashBytes(s) >> 56); }

// Fingerprint match mask over the 56 bytes following the bitmap (bit i set
// if fingerprint i equals fp). SIMD (AVX2 when compiled for it, else SSE2).
inline uint64_t FpMatch(const char* line, uint8_t fp) {
#ifdef FPT_TSAN
  alignas(64) uint64_t w[8];
  for (int i = 0; i < 8; i++) w[i] = __atomic_load_n(reinterpret_cast<const uint64_t*>(line) + i, __ATOMIC_RELAXED);
  const char* p = reinterpret_cast<const char*>(w);
#else
  const char* p = line;
#endif
#ifdef __AVX2__
  __m256i f = _mm256_set1_epi8(char(fp));
  uint64_t lo = uint32_t(_mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_load_si256(reinterpret_cast<const __m256i*>(p)), f)));
  uint64_t hi = uint32_t(_mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_load_si256(reinterpret_cast<const __m256i*>(p + 32)), f)));
  return (lo | (hi << 32)) >> 8;
#else
  __m128i f = _mm_set1_epi8(char(fp));
  uint64_t m = 0;
  for (int i = 0; i < 4; i++)
    m |= uint64_t(uint16_t(_mm_movemask_epi8(_mm_cmpeq_epi8(_mm_load_si128(reinterpret_cast<const __m128i*>(p + 16 * i)), f)))) << (16 * i);
  return m >> 8;
#endif
}

inline uint64_t Ld(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
inline uint8_t Ld8(const uint8_t* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }

// A search key with its fingerprint.
struct SKey {
  uint64_t u = 0;
  Slice s;
  uint8_t fp = 0;
  uint16_t home = 0;  // hash bits 8..23 (HomeLine); 0 in keys not made by MakeKey
};

// DRAM copy of a byte key (inner-node separators). Immutable.
struct KeyBlob {
  uint32_t len;
  char data[1];
  Slice slice() const { return Slice(data, len); }
};
KeyBlob* NewBlob(Slice s) {
  auto* b = static_cast<KeyBlob*>(std::malloc(sizeof(KeyBlob) + s.size()));
  b->len = uint32_t(s.size());
  if (!s.empty()) std::memcpy(b->data, s.data(), s.size());
  return b;
}

// DRAM inner node: count keys, count+1 children, sorted. Child i holds keys
// k with keys[i-1] <= k < keys[i]. Children of a bottom node are leaf
// offsets. Version: bit 1 locked, bit 0 obsolete (removed from the tree by a
// leaf deletion; freed after an epoch grace period), +4 per unlock.
struct Inner {
  std::atomic<uint64_t> version;
  std::atomic<uint32_t> count;
  uint32_t cap;
  uint32_t bottom;
  uint32_t pos;  // index in FPTree::nodes_ (under nodes_mu_)
  // Child words are stored with release and loaded with acquire wherever the
  // loaded node is dereferenced: a reader that loads a child word and reads
  // that node's version before validating the parent must see the node's
  // initialisation (allocation, memset, placement new). Free on x86 (plain moves); TSan
  // reported the relaxed pair as a race with NewInner's calloc (session 7).
  std::atomic<uint64_t>* keys() { return reinterpret_cast<std::atomic<uint64_t>*>(this + 1); }
  std::atomic<uint64_t>* child() { return keys() + cap; }
  // Whole cache lines: nodes are 64-byte aligned (NewInner), so the header
  // and the first keys share line 0 and PrefetchInner covers whole lines.
  static size_t Bytes(uint32_t cap) { return (sizeof(Inner) + 8 * (2 * size_t(cap) + 1) + 63) & ~size_t(63); }
};
static_assert(sizeof(Inner) % 8 == 0);

// Test/figure introspection (fptree.h: FPTreeShape).
struct FPTreeIntrospect {
  virtual void Shape(uint64_t* inner_nodes, uint64_t* leaves) = 0;
  virtual void HomeShare(uint64_t* at_home, uint64_t* records) = 0;
  virtual bool LeafVersionWords(std::string* why) = 0;
  virtual void PmWords(FPTreePmWords* out) = 0;
};

template <bool kConc, bool kBytes>
class FPTree final : public Index, public FPTreeIntrospect {
 public:
  struct Rec {
    uint64_t k = 0, v = 0;
    std::string ks, vs;
  };

  FPTree(std::unique_ptr<pm::Pool> pool, const Options& o) : pool_(std::move(pool)), opts_(o) {
    base_ = pool_->base();
    reserved_size_ = pool_->max_size();
  }
  ~FPTree() override {
    Close();
    if (vtab_) munmap(vtab_, vtab_bytes_);
  }

  std::string_view Name() const override { return VariantName(variant_); }
  KeyKind key_kind() const override { return kBytes ? KeyKind::kBytes : KeyKind::kU64; }
  ValueKind value_kind() const override { return vbytes_ ? ValueKind::kBytes : ValueKind::kU64; }
  pm::Pool* pool() override { return pool_.get(); }

  // ---- setup --------------------------------------------------------------
  Status Format(uint8_t variant, const Options& o, uint32_t m, uint32_t inner, uint32_t group, bool inplace) {
    uint64_t* rs = pool_->root_slot();
    if (*rs == 0) PMINDEX_RETURN_IF_ERROR(pool_->allocator().AllocateZeroed(rs, sizeof(Root)));
    root_ = pool_->root<Root>();
    Root* r = root_;
    pm::Store(&r->magic, kMagic);
    pm::Store(&r->variant, variant);
    pm::Store(&r->key_kind, uint8_t(o.key_kind));
    pm::Store(&r->value_kind, uint8_t(o.value_kind));
    pm::Store(&r->inplace_update, uint8_t(inplace));
    pm::Store(&r->leaf_slots, m);
    pm::Store(&r->inner_size, inner);
    pm::Store(&r->group_size, group);
    pm::Store(&r->max_key, uint32_t(o.max_key_size));
    pm::Store(&r->max_value, uint32_t(o.max_value_size));
    LoadConfig();
    pm::Store(&r->leaf_bytes, lay_.bytes);
    pm::Persist(r, 64);
    if (groups_) {
      PMINDEX_RETURN_IF_ERROR(CheckGroups());
      RecoverGetLog();  // crashed inside GetLeaf
    }
    if (r->head == 0) {
      if (groups_) {
        // One group holding the first leaf (alg. 10 path without a free vector).
        uint64_t leaf = 0;
        PMINDEX_RETURN_IF_ERROR(GetLeaf(&leaf));
        pm::StorePersist(&r->head, leaf);
      } else {
        PMINDEX_RETURN_IF_ERROR(pool_->allocator().AllocateZeroed(&r->head, lay_.bytes));
      }
    }
    pm::StorePersist(&r->initialized, uint64_t(1));
    return Recover();
  }

  Status Open() {
    root_ = pool_->root<Root>();
    if (!root_ || root_->magic != kMagic) return Status::Corrupt("fptree root object missing or bad magic");
    if (VariantName(root_->variant) != pool_->type())
      return Status::Corrupt("fptree root variant does not match the pool type");
    LoadConfig();
    if (root_->leaf_bytes != lay_.bytes) return Status::Corrupt("fptree leaf size mismatch");
    return Recover();
  }

  void LoadConfig() {
    Root* r = root_;
    variant_ = r->variant;
    groups_ = variant_ == kSingle;
    vbytes_ = r->value_kind == uint8_t(ValueKind::kBytes);
    inplace_ = r->inplace_update && !vbytes_;
    max_key_ = r->max_key;
    max_value_ = r->max_value;
    inner_cap_ = r->inner_size;
    {
      const size_t kb = sizeof(Inner) + 8 * size_t(inner_cap_);  // header + keys
      inner_pf_bytes_ = kb <= kInnerPrefetchMax ? uint32_t(kb) : 0;
    }
    group_size_ = r->group_size;
    uint32_t m = r->leaf_slots;
    lay_.m = m;
    lay_.fp = variant_ != kPTree;
    lay_.full = m == 64 ? ~0ull : ((1ull << m) - 1);
    if (lay_.fp) {
      lay_.key_off = 64;
      lay_.key_stride = 16;
      lay_.val_off = 72;
      lay_.val_stride = 16;
    } else {
      lay_.key_off = 64;
      lay_.key_stride = 8;
      lay_.val_off = 64 + ((8 * m + 63) / 64) * 64;
      lay_.val_stride = 8;
    }
    lay_.trailer = LeafTrailer(lay_.fp, m);
    lay_.bytes = LeafBytes(lay_.fp, m);
    lay_.home_lines = lay_.fp ? (m + 3) / 4 : 0;
    pointers_ = kBytes || vbytes_;
  }

  // ---- leaf accessors ------------------------------------------------------
  struct Layout {
    uint32_t m, key_off, key_stride, val_off, val_stride, trailer, bytes;
    uint32_t home_lines;  // slot lines (4 slots each) of an fptree leaf; 0 for ptree
    uint64_t full;
    bool fp;
  };
  char* L(uint64_t off) const { return base_ + off; }
  static uint64_t* Bm(char* l) { return reinterpret_cast<uint64_t*>(l); }
  static uint8_t* Fp(char* l, int i) { return reinterpret_cast<uint8_t*>(l) + 8 + i; }
  uint64_t* Key(char* l, int i) const { return reinterpret_cast<uint64_t*>(l + lay_.key_off + i * lay_.key_stride); }
  uint64_t* Val(char* l, int i) const { return reinterpret_cast<uint64_t*>(l + lay_.val_off + i * lay_.val_stride); }
  uint64_t* Next(char* l) const { return reinterpret_cast<uint64_t*>(l + lay_.trailer); }
  // The next pointer for an unlocked reader that goes on to read the next
  // leaf (its version word, bitmap or slots). Acquire, paired with the
  // release store that published the pointer (SplitFinish; an unlink's
  // StorePersist): the new leaf's SplitCopy (plain copy and bitmap stores,
  // its "born locked" version word) then happens before the reads. Relaxed,
  // Size() loaded a new leaf's bitmap racing with SplitCopy's plain stores
  // (TSan, session 7 review), and a scan could in the C++ model see the new
  // leaf's table word from before SplitCopy (unlocked) and read the leaf
  // while it was copied. A plain move on x86.
  uint64_t NextAcquire(char* l) const { return __atomic_load_n(Next(l), __ATOMIC_ACQUIRE); }
  // fptree's leaf lock/version word: in DRAM, see "Leaf versions" at MapLeafVersions.
  // vbias_ is the table's address minus (base_ >> vshift_) words (base_ is
  // page aligned), so that the word is found from the leaf's address alone.
  uint64_t* Ver(char* l) const { return reinterpret_cast<uint64_t*>(vbias_ + 8 * (uintptr_t(l) >> vshift_)); }

  // ---- PM blocks (key/value) ------------------------------------------------
  // Block: {u64 len, data padded to 8}. Written with 8-byte atomic stores so
  // optimistic readers never race with plain writes.
  Status WriteBlock(uint64_t* dest, Slice s) {
    PMINDEX_RETURN_IF_ERROR(pool_->allocator().Allocate(dest, 8 + s.size()));
    auto* w = reinterpret_cast<uint64_t*>(base_ + *dest);
    pm::StoreAtomic(w, uint64_t(s.size()), __ATOMIC_RELAXED);
    size_t i = 0;
    for (; i + 8 <= s.size(); i += 8) {
      uint64_t x;
      std::memcpy(&x, s.data() + i, 8);
      pm::StoreAtomic(w + 1 + i / 8, x, __ATOMIC_RELAXED);
    }
    if (i < s.size()) {
      uint64_t x = 0;
      std::memcpy(&x, s.data() + i, s.size() - i);
      pm::StoreAtomic(w + 1 + i / 8, x, __ATOMIC_RELAXED);
    }
    pm::Flush(w, 8 + s.size());
    return Status::OK();
  }
  // Reads a block; false if the offset/length are not plausible (a racing
  // reader saw a stale pointer; the caller's validation then fails).
  bool ReadBlock(uint64_t off, size_t maxlen, std::string* out) const {
    if (off == 0 || off % 8) return false;
    uint64_t psize = pool_->size();
    if (off + 8 > psize) return false;
    const auto* w = reinterpret_cast<const uint64_t*>(base_ + off);
    uint64_t len = Ld(w);
    if (len > maxlen || off + 8 + len > psize) return false;
    out->resize(len);
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
      uint64_t x = Ld(w + 1 + i / 8);
      std::memcpy(out->data() + i, &x, 8);
    }
    if (i < len) {
      uint64_t x = Ld(w + 1 + i / 8);
      std::memcpy(out->data() + i, &x, len - i);
    }
    return true;
  }
  bool BlockEquals(uint64_t off, Slice s) const {
    if (off == 0 || off % 8 || off + 8 + s.size() > pool_->size()) return false;
    const auto* w = reinterpret_cast<const uint64_t*>(base_ + off);
    if (Ld(w) != s.size()) return false;
    size_t i = 0;
    for (; i + 8 <= s.size(); i += 8) {
      uint64_t x;
      std::memcpy(&x, s.data() + i, 8);
      if (Ld(w + 1 + i / 8) != x) return false;
    }
    if (i < s.size()) {
      uint64_t x = Ld(w + 1 + i / 8), y = 0;
      std::memcpy(&y, s.data() + i, s.size() - i);
      uint64_t mask = (s.size() - i) == 8 ? ~0ull : ((1ull << (8 * (s.size() - i))) - 1);
      if ((x & mask) != y) return false;
    }
    return true;
  }
  int CompareBlock(uint64_t off, Slice s) const {  // block vs s
    std::string tmp;
    if (!ReadBlock(off, max_key_, &tmp)) return -1;
    return CompareKeys(KeyKind::kBytes, tmp, s);
  }

  // ---- key helpers -----------------------------------------------------------
  SKey MakeKey(Slice k) const {
    SKey sk;
    if constexpr (kBytes) {
      sk.s = k;
      uint64_t h = HashBytes(k);
      sk.fp = uint8_t(h >> 56);
      sk.home = uint16_t(h >> 8);
    } else {
      sk.u = SliceToU64(k);
      uint64_t h = HashU64(sk.u);
      sk.fp = uint8_t(h >> 56);
      sk.home = uint16_t(h >> 8);
    }
    return sk;
  }
  bool SlotKeyEq(char* l, int i, const SKey& k) const {
    tl_probes++;
    uint64_t w = Ld(Key(l, i));
    if constexpr (kBytes) return BlockEquals(w, k.s);
    else return w == k.u;
  }
  // Matching slot among the valid ones, or -1.
  int FindSlot(char* l, uint64_t bm, const SKey& k) const {
    uint64_t mask = lay_.fp ? (FpMatch(l, k.fp) & bm) : bm;
    while (mask) {
      int i = __builtin_ctzll(mask);
      mask &= mask - 1;
      if (SlotKeyEq(l, i, k)) return i;
    }
    return -1;
  }
  // Home-line placement (not in the paper; a performance heuristic only).
  // A key's home line is one of the leaf's slot lines, chosen by its hash.
  // An insert takes a free slot in the home line if there is one, else the
  // first free slot; so does an algorithm-8 update (update=flip). The
  // descent prefetches the home line (fptree: together with line 0), so
  // when the key is at home (about 61% of the records of a randomly loaded
  // tree: a 4-slot line fills long before the leaf does) the slot line a
  // find compares, or an insert writes, arrives in parallel with the
  // fingerprints instead of one miss after them. Lookups never
  // rely on it: FindSlot still probes every fingerprint, and a record may
  // sit in any slot (pools written before, splits keep slot indices,
  // recovery does not move records).
  uint32_t HomeLine(const SKey& k) const { return (uint32_t(k.home) * lay_.home_lines) >> 16; }
  char* HomeLineAddr(char* l, const SKey& k) const { return l + lay_.key_off + 64 * HomeLine(k); }
  int FreeSlotFor(uint64_t bm, uint32_t line) const {
    uint64_t freem = ~bm & lay_.full;
    uint64_t in = freem & (0xFull << (4 * line));
    return __builtin_ctzll(in ? in : freem);
  }
  // Inner-node key compare: stored word vs search key.
  static int CmpInner(uint64_t w, const SKey& k) {
    if constexpr (kBytes) {
      const KeyBlob* b = reinterpret_cast<const KeyBlob*>(w);
      Slice bs = b ? b->slice() : Slice();
      return CompareKeys(KeyKind::kBytes, bs, k.s);
    } else {
      return w < k.u ? -1 : (w > k.u ? 1 : 0);
    }
  }
  // Number of keys <= k (the child index). u64 keys: branchless binary
  // search (the comparison outcomes are random, so a branchy search pays
  // about one misprediction per level of the search).
  static uint32_t UpperBound(Inner* n, const SKey& k) {
    uint32_t c = n->count.load(std::memory_order_relaxed);
    if (c > n->cap) c = n->cap;
    auto* keys = n->keys();
    if constexpr (!kBytes) {
      if (c == 0) return 0;
      uint32_t base = 0, len = c;
      while (len > 1) {
        uint32_t half = len / 2;
        bool le = keys[base + half - 1].load(std::memory_order_relaxed) <= k.u;
        base += le ? half : 0;  // cmov
        len -= half;
      }
      return base + (keys[base].load(std::memory_order_relaxed) <= k.u);
    }
    uint32_t lo = 0, hi = c;
    while (lo < hi) {
      uint32_t mid = (lo + hi) / 2;
      // Acquire: a byte-key word points to a blob written before publication.
      if (CmpInner(keys[mid].load(kBytes ? std::memory_order_acquire : std::memory_order_relaxed), k) <= 0) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }
  // Reads slot i's key as an SKey-comparable owned record key.
  bool ReadSlotKey(char* l, int i, Rec* r) const {
    uint64_t w = Ld(Key(l, i));
    if constexpr (kBytes) return ReadBlock(w, max_key_, &r->ks);
    r->k = w;
    return true;
  }
  bool ReadSlotVal(char* l, int i, Rec* r) const {
    uint64_t w = Ld(Val(l, i));
    if (vbytes_) return ReadBlock(w, max_value_, &r->vs);
    r->v = w;
    return true;
  }
  static int CmpRec(const Rec& a, const Rec& b) {
    if constexpr (kBytes) return CompareKeys(KeyKind::kBytes, a.ks, b.ks);
    else return a.k < b.k ? -1 : (a.k > b.k ? 1 : 0);
  }
  static int CmpRecKey(const Rec& a, const SKey& k) {
    if constexpr (kBytes) return CompareKeys(KeyKind::kBytes, a.ks, k.s);
    else return a.k < k.u ? -1 : (a.k > k.u ? 1 : 0);
  }

  // ---- inner nodes -------------------------------------------------------------
  Inner* NewInner(bool bottom) {
    size_t b = Inner::Bytes(inner_cap_);
    auto* n = static_cast<Inner*>(std::aligned_alloc(64, b));
    std::memset(static_cast<void*>(n), 0, b);
    new (&n->version) std::atomic<uint64_t>(0);
    new (&n->count) std::atomic<uint32_t>(0);
    n->cap = inner_cap_;
    n->bottom = bottom;
    {
      std::lock_guard<std::mutex> g(nodes_mu_);
      n->pos = uint32_t(nodes_.size());
      nodes_.push_back(n);
    }
    dram_bytes_.fetch_add(b, std::memory_order_relaxed);
    return n;
  }
  // Frees an inner node no thread can reach any more (after the grace period).
  void FreeInner(Inner* n) {
    {
      std::lock_guard<std::mutex> g(nodes_mu_);
      Inner* last = nodes_.back();
      nodes_[n->pos] = last;
      last->pos = n->pos;
      nodes_.pop_back();
    }
    dram_bytes_.fetch_sub(Inner::Bytes(n->cap), std::memory_order_relaxed);
    std::free(n);
  }
  // Byte keys: every separator blob is referenced by exactly one key slot
  // keys[0..count) of one live inner node (a split moves the pointer, never
  // copies it), so blobs are freed with the key slot that drops them.
  uint64_t KeyWordForInner(const SKey& k) {
    if constexpr (kBytes) {
      KeyBlob* b = NewBlob(k.s);
      dram_bytes_.fetch_add(sizeof(KeyBlob) + k.s.size(), std::memory_order_relaxed);
      return reinterpret_cast<uint64_t>(b);
    } else {
      return k.u;
    }
  }
  void FreeKeyWord(uint64_t w) {
    if constexpr (kBytes) {
      auto* b = reinterpret_cast<KeyBlob*>(w);
      dram_bytes_.fetch_sub(sizeof(KeyBlob) + b->len, std::memory_order_relaxed);
      std::free(b);
    }
  }

  // OLC primitives (no-ops for the single-threaded variants).
  static bool ReadLock(Inner* n, uint64_t* v) {
    if constexpr (!kConc) return true;
    *v = n->version.load(std::memory_order_acquire);
    if (*v & 3) {  // locked or obsolete
      Pause();
      return false;
    }
    return true;
  }
  static bool Validate(Inner* n, uint64_t v) {
    if constexpr (!kConc) return true;
    std::atomic_thread_fence(std::memory_order_acquire);
    return n->version.load(std::memory_order_relaxed) == v;
  }
  static bool Upgrade(Inner* n, uint64_t v) {
    if constexpr (!kConc) return true;
    return n->version.compare_exchange_strong(v, v + 2, std::memory_order_acquire);
  }
  static void WriteUnlock(Inner* n) {
    if constexpr (!kConc) return;
    n->version.fetch_add(2, std::memory_order_release);
  }
  // Unlocks a node removed from the tree: readers that reach it fail ReadLock
  // or their validation and restart from the root.
  static void ObsoleteUnlock(Inner* n) {
    if constexpr (!kConc) return;
    n->version.fetch_add(3, std::memory_order_release);
  }

  // Leaf seqlock (DRAM table word, see MapLeafVersions).
  uint64_t LeafVersion(char* l) const { return kConc ? __atomic_load_n(Ver(l), __ATOMIC_ACQUIRE) : 0; }
  bool LeafValidate(char* l, uint64_t v) const {
    if constexpr (!kConc) return true;
    std::atomic_thread_fence(std::memory_order_acquire);
    return __atomic_load_n(Ver(l), __ATOMIC_RELAXED) == v;
  }
  bool LeafTryLock(char* l, uint64_t v) {
    if constexpr (!kConc) return true;
    if (v & 3) return false;
    return __atomic_compare_exchange_n(Ver(l), &v, v | 1, false, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED);
  }
  void LeafUnlock(char* l, bool obsolete = false) {
    if constexpr (!kConc) return;
    uint64_t v = __atomic_load_n(Ver(l), __ATOMIC_RELAXED);
    __atomic_store_n(Ver(l), uint64_t(((v & ~3ull) + 4) | (obsolete ? 2 : 0)), __ATOMIC_RELEASE);
  }
  // Unlock of a leaf locked by LeafTryLock(l, lv): only the lock holder
  // writes the word, so it still holds lv | 1 and need not be loaded.
  void LeafUnlockAt(char* l, uint64_t lv) {
    if constexpr (!kConc) return;
    __atomic_store_n(Ver(l), uint64_t((lv & ~3ull) + 4), __ATOMIC_RELEASE);
  }

  // Traverses to the leaf covering k. Returns its offset and (concurrent) an
  // unlocked version read while the bottom parent was still valid.
  // parent/idx describe the bottom inner node (ScanU64's lookahead).
  struct Path {
    Inner* parent = nullptr;
    uint32_t idx = 0;
  };
  uint64_t FindLeaf(const SKey& k, uint64_t* lver) { return FindLeafT<false>(k, lver, nullptr); }
  uint64_t FindLeaf(const SKey& k, uint64_t* lver, Path* path) { return FindLeafT<true>(k, lver, path); }
  // kPath: fill *path (only ScanU64 uses it). A separate instantiation, so that
  // finds and writes do not track the path (callgrind: ~20 instructions).
  template <bool kPath>
  uint64_t FindLeafT(const SKey& k, uint64_t* lver, Path* path) {
    Backoff bo;
    bool first = true;
    for (;;) {
    restart:
      if (kConc && !first) bo.Wait();
      first = false;
      Inner* n = root_inner_.load(std::memory_order_acquire);
      uint64_t v = 0;
      if (!ReadLock(n, &v)) continue;
      if (kConc && n != root_inner_.load(std::memory_order_acquire)) continue;
      for (;;) {
        uint32_t i = UpperBound(n, k);
        // No validation of n between this load and the use of c (session 6:
        // one version load and compare less per level): c is a child word of
        // n, which always holds a node or leaf offset not yet freed: slots
        // past the count keep moved or duplicated children, and a child
        // removed from n is freed only after the grace period following its
        // removal, which waits for every guard that could still load the
        // removed word (a count read before the removal). So reading c's
        // version is safe; whether c was n's child for k at version v is
        // what the Validate(n, v) after that read checks.
        uint64_t c = n->child()[i].load(std::memory_order_acquire);
        if (n->bottom) {
          char* l = L(c);
          // The caller reads line 0 (bitmap, fingerprints) next; start that
          // miss now instead of after the version word's (DRAM table).
          if constexpr (kConc) __builtin_prefetch(l);
          if (!kPath && lay_.home_lines > 1) __builtin_prefetch(HomeLineAddr(l, k));
          uint64_t lv = LeafVersion(l);
          if (kConc && (lv & 3)) {
            // Locked (or being deleted): wait for it without holding anything.
            for (int s = 0; s < 256 && (LeafVersion(l) & 1); s++) Pause();
            if (LeafVersion(l) & 1) std::this_thread::yield();
            goto restart;
          }
          if (!Validate(n, v)) goto restart;
          *lver = lv;
          if constexpr (kPath) {
            path->parent = n;
            path->idx = i;
          }
          return c;
        }
        Inner* cn = reinterpret_cast<Inner*>(c);
        PrefetchInner(cn);
        uint64_t cv = 0;
        if (!ReadLock(cn, &cv)) goto restart;
        if (!Validate(n, v)) goto restart;
        n = cn;
        v = cv;
      }
    }
  }
  // Starts the misses of a whole inner node's header and key array at once,
  // before its version is read: UpperBound's binary search is a chain of
  // dependent loads over 17 lines (cap 128), each an L2 miss for a node
  // below the hot top of the tree; in flight together they cost about one
  // miss. (Session 8: self-similar finds at 5M records 0.88-0.97 -> 0.97-1.06
  // of dram_btree, same runs, FPX A/B.) Wide nodes (fptree_single's 4096
  // keys) are not prefetched: their top probes stay cached anyway.
  void PrefetchInner(const Inner* n) const {
    const char* p = reinterpret_cast<const char*>(n);
    // Four lines a step (a third of the loop's instructions): up to three
    // lines past the keys are prefetched too, the node's first children
    // (harmless: a prefetch never faults).
    for (uint32_t o = 0; o < inner_pf_bytes_; o += 256) {
      __builtin_prefetch(p + o);
      __builtin_prefetch(p + o + 64);
      __builtin_prefetch(p + o + 128);
      __builtin_prefetch(p + o + 192);
    }
  }

  // Inserts separator sep -> right leaf (whose left neighbour is `left_leaf`)
  // into the bottom inner node covering sep, splitting full nodes on the way
  // down (OLC insert; only inner-node locks are taken here).
  void InsertSeparator(const SKey& sep, uint64_t kw, uint64_t right_leaf) {
    Backoff bo;
    bool first = true;
    for (;;) {
    restart:
      if (kConc && !first) bo.Wait();
      first = false;
      Inner* n = root_inner_.load(std::memory_order_acquire);
      uint64_t v = 0;
      if (!ReadLock(n, &v)) continue;
      if (kConc && n != root_inner_.load(std::memory_order_acquire)) continue;
      Inner* parent = nullptr;
      uint64_t pv = 0;
      for (;;) {
        if (n->count.load(std::memory_order_relaxed) >= n->cap) {
          if (parent && !Upgrade(parent, pv)) goto restart;
          if (!Upgrade(n, v)) {
            if (parent) WriteUnlock(parent);
            goto restart;
          }
          if (!parent && n != root_inner_.load(std::memory_order_relaxed)) {
            WriteUnlock(n);
            goto restart;
          }
          SplitInner(n, parent);
          WriteUnlock(n);
          if (parent) WriteUnlock(parent);
          goto restart;
        }
        if (parent && !Validate(parent, pv)) goto restart;
        uint32_t i = UpperBound(n, sep);
        if (n->bottom) {
          if (!Upgrade(n, v)) goto restart;
          InsertAt(n, i, kw, right_leaf);
          WriteUnlock(n);
          return;
        }
        uint64_t c = n->child()[i].load(std::memory_order_acquire);
        if (!Validate(n, v)) goto restart;
        Inner* cn = reinterpret_cast<Inner*>(c);
        uint64_t cv = 0;
        if (!ReadLock(cn, &cv)) goto restart;
        if (!Validate(n, v)) goto restart;
        parent = n;
        pv = v;
        n = cn;
        v = cv;
      }
    }
  }
  // keys[i] = kw, child[i+1] = c, shifting the rest right. Caller holds n.
  static void InsertAt(Inner* n, uint32_t i, uint64_t kw, uint64_t c) {
    uint32_t cnt = n->count.load(std::memory_order_relaxed);
    auto* keys = n->keys();
    auto* ch = n->child();
    for (uint32_t j = cnt; j > i; j--) keys[j].store(keys[j - 1].load(std::memory_order_relaxed), std::memory_order_release);
    for (uint32_t j = cnt + 1; j > i + 1; j--) ch[j].store(ch[j - 1].load(std::memory_order_relaxed), std::memory_order_release);
    keys[i].store(kw, std::memory_order_release);
    ch[i + 1].store(c, std::memory_order_release);
    n->count.store(cnt + 1, std::memory_order_release);
  }
  // Splits full node n (locked; parent locked or n is the root).
  void SplitInner(Inner* n, Inner* parent) {
    uint32_t cnt = n->count.load(std::memory_order_relaxed);
    uint32_t mid = cnt / 2;
    Inner* r = NewInner(n->bottom);
    auto* keys = n->keys();
    auto* ch = n->child();
    uint64_t sep = keys[mid].load(std::memory_order_relaxed);
    uint32_t rc = 0;
    for (uint32_t j = mid + 1; j < cnt; j++) r->keys()[rc++].store(keys[j].load(std::memory_order_relaxed), std::memory_order_release);
    for (uint32_t j = mid + 1; j <= cnt; j++)
      r->child()[j - mid - 1].store(ch[j].load(std::memory_order_relaxed), std::memory_order_release);
    r->count.store(rc, std::memory_order_relaxed);
    n->count.store(mid, std::memory_order_release);
    if (parent) {
      uint32_t i = 0;
      uint32_t pc = parent->count.load(std::memory_order_relaxed);
      while (i <= pc && parent->child()[i].load(std::memory_order_relaxed) != reinterpret_cast<uint64_t>(n)) i++;
      InsertAt(parent, i, sep, reinterpret_cast<uint64_t>(r));
    } else {
      Inner* nr = NewInner(false);
      nr->keys()[0].store(sep, std::memory_order_relaxed);
      nr->child()[0].store(reinterpret_cast<uint64_t>(n), std::memory_order_release);
      nr->child()[1].store(reinterpret_cast<uint64_t>(r), std::memory_order_release);
      nr->count.store(1, std::memory_order_relaxed);
      root_inner_.store(nr, std::memory_order_release);
    }
  }

  // ---- micro-log slots (concurrent: a free mask; others: slot 0) ----------
  int AcquireLog(std::atomic<uint64_t>* mask) {
    if constexpr (!kConc) return 0;
    for (;;) {
      uint64_t m = mask->load(std::memory_order_relaxed);
      if (m == 0) {
        std::this_thread::yield();
        continue;
      }
      int i = __builtin_ctzll(m);
      if (mask->compare_exchange_weak(m, m & ~(1ull << i), std::memory_order_acquire)) return i;
    }
  }
  // One try: a free slot, or -1 (the caller holds locks and must not wait).
  int TryAcquireLog(std::atomic<uint64_t>* mask) {
    if constexpr (!kConc) return 0;
    uint64_t m = mask->load(std::memory_order_relaxed);
    while (m) {
      int i = __builtin_ctzll(m);
      if (mask->compare_exchange_weak(m, m & ~(1ull << i), std::memory_order_acquire)) return i;
    }
    return -1;
  }
  void ReleaseLog(std::atomic<uint64_t>* mask, int i) {
    if constexpr (!kConc) return;
    mask->fetch_or(1ull << i, std::memory_order_release);
  }

  // ---- leaf groups (fptree_single, appendix B) -----------------------------------
  uint64_t GroupBytes() const { return 64 + uint64_t(group_size_) * lay_.bytes; }
  // Alg. 10: GetLeaf.
  Status GetLeaf(uint64_t* out) {
    if (free_leaves_.empty()) {
      GroupLog* lg = &root_->get_log;
      PMINDEX_RETURN_IF_ERROR(pool_->allocator().AllocateZeroed(&lg->new_group, GroupBytes()));
      LinkNewGroup();
    }
    *out = free_leaves_.back();
    free_leaves_.pop_back();
    GroupOf(*out)->second++;
    return Status::OK();
  }
  // Alg. 10 lines 4-9 (also the recovery continuation of alg. 11).
  void LinkNewGroup() {
    Root* r = root_;
    uint64_t g = r->get_log.new_group;
    if (r->groups_tail == 0) pm::StorePersist(&r->groups_head, g);
    else pm::StorePersist(reinterpret_cast<uint64_t*>(L(r->groups_tail)), g);
    pm::StorePersist(&r->groups_tail, g);
    pm::StorePersist(&r->get_log.new_group, uint64_t(0));
    group_used_[g] = 0;
    for (uint32_t i = group_size_; i-- > 0;) free_leaves_.push_back(g + 64 + uint64_t(i) * lay_.bytes);
  }
  // Alg. 11: finish or drop an interrupted GetLeaf.
  void RecoverGetLog() {
    Root* r = root_;
    if (!r->get_log.new_group) return;
    if (r->groups_tail == r->get_log.new_group) pm::StorePersist(&r->get_log.new_group, uint64_t(0));
    else LinkNewGroup();
  }
  std::map<uint64_t, uint32_t>::iterator GroupOf(uint64_t leaf) {
    auto it = group_used_.upper_bound(leaf);
    --it;
    return it;
  }
  // Alg. 12: FreeLeaf (the leaf is unlinked and clean).
  void FreeLeaf(uint64_t leaf) {
    auto it = GroupOf(leaf);
    uint64_t g = it->first;
    if (--it->second > 0) {
      free_leaves_.push_back(leaf);
      return;
    }
    // The whole group is free: drop its leaves from the vector, unlink, free.
    uint64_t lo = g, hi = g + GroupBytes();
    free_leaves_.erase(std::remove_if(free_leaves_.begin(), free_leaves_.end(), [&](uint64_t x) { return x >= lo && x < hi; }),
                       free_leaves_.end());
    group_used_.erase(it);
    Root* r = root_;
    uint64_t prev = 0;
    for (uint64_t x = r->groups_head; x && x != g; x = *reinterpret_cast<uint64_t*>(L(x))) prev = x;
    FreeGroupLog* lg = &r->free_log;
    pm::Store(&lg->prev, prev);
    pm::Store(&lg->cur, g);  // same line, after prev
    pm::Persist(lg, 16);
    FinishFreeGroup();
  }
  // Alg. 12 lines 8-19 / alg. 13. Idempotent. We log prev and cur together and
  // also repair the tail pointer, which alg. 12 forgets.
  void FinishFreeGroup() {
    Root* r = root_;
    FreeGroupLog* lg = &r->free_log;
    uint64_t g = lg->cur, prev = lg->prev;
    if (g) {
      uint64_t gnext = *reinterpret_cast<uint64_t*>(L(g));
      if (prev == 0) {
        if (r->groups_head == g) pm::StorePersist(&r->groups_head, gnext);
      } else {
        uint64_t* pn = reinterpret_cast<uint64_t*>(L(prev));
        if (*pn == g) pm::StorePersist(pn, gnext);
      }
      if (r->groups_tail == g) pm::StorePersist(&r->groups_tail, prev);
      pool_->allocator().Free(&lg->cur);
    }
    pm::Store(&lg->prev, uint64_t(0));
    pm::Persist(lg, 16);
  }

  // ---- split (alg. 3/4) ------------------------------------------------------------
  // Chooses the upper half of the (full) leaf l: returns the bitmap of the
  // slots that move and the separator (smallest moving key).
  bool ChooseSplit(char* l, uint64_t* upper, Rec* sep) {
    uint64_t bm = Ld(Bm(l));
    if constexpr (!kBytes) {
      // u64 keys: (key, slot) pairs on the stack and a selection instead of
      // a sort of owned records (callgrind: ~40% of an insert's instructions
      // went to the Rec/std::string version below).
      std::pair<uint64_t, uint32_t> v[64];
      uint32_t c = 0;
      for (uint64_t m = bm; m; m &= m - 1) {
        int i = __builtin_ctzll(m);
        v[c++] = {Ld(Key(l, i)), uint32_t(i)};
      }
      uint32_t half = c / 2;
      std::nth_element(v, v + half, v + c);
      *upper = 0;
      for (uint32_t j = half; j < c; j++) *upper |= 1ull << v[j].second;
      sep->k = v[half].first;
      return true;
    }
    std::vector<std::pair<Rec, int>> v;
    for (uint64_t m = bm; m; m &= m - 1) {
      int i = __builtin_ctzll(m);
      Rec r;
      if (!ReadSlotKey(l, i, &r)) return false;
      v.emplace_back(std::move(r), i);
    }
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return CmpRec(a.first, b.first) < 0; });
    size_t half = v.size() / 2;
    *upper = 0;
    for (size_t j = half; j < v.size(); j++) *upper |= 1ull << v[j].second;
    *sep = v[half].first;
    return true;
  }
  // Copy phase (alg. 3 lines 6-10): new leaf n gets all of l, keeps `upper`.
  void SplitCopy(char* l, char* n, uint64_t upper) {
    // Everything but the trailer (next pointer set below; scans may store
    // scan-order hints into l's trailer meanwhile).
    pm::Copy(n, l, lay_.trailer);
    pm::Store(Bm(n), upper);
    // SplitFinish flushes l's bitmap and next with one fence, so a crash image
    // may hold l.next == n with l's bitmap still full: the copy is then redone,
    // and n.next (durable since the first copy's fence) must be kept rather
    // than set to l.next (that would make n point to itself).
    uint64_t lnext = Ld(Next(l));
    if (lnext != uint64_t(n - base_)) pm::Store(Next(n), lnext);
    if constexpr (kConc) {
      // Born locked, and with a version no earlier leaf at this table word
      // had (the words only grow; see MapLeafVersions).
      uint64_t* w = Ver(n);
      __atomic_store_n(w, uint64_t(((__atomic_load_n(w, __ATOMIC_RELAXED) & ~3ull) + 4) | 1), __ATOMIC_RELAXED);
    }
    if (pointers_) {
      for (uint32_t i = 0; i < lay_.m; i++) {
        if (upper >> i & 1) continue;
        if (kBytes) pm::Store(Key(n, i), uint64_t(0));
        if (vbytes_) pm::Store(Val(n, i), uint64_t(0));
      }
    }
    pm::Flush(n, lay_.bytes);
    pm::Fence();
  }
  // Alg. 3 lines 11-14 plus the pointer cleanup of moved slots in l.
  void SplitFinish(char* l, uint64_t noff, uint64_t upper) {
    char* n = L(noff);
    pm::StoreAtomic(Bm(l), lay_.full & ~upper);
    pm::StoreAtomic(Next(l), noff);
    pm::Flush(l, 8);
    pm::Flush(Next(l), 8);
    if (pointers_) {
      // The cut must be durable before the moved slots' pointers are cleared
      // (other lines): a crash image with the pointers cleared but the bitmap
      // still full would leave recovery unable to redo the split (found by
      // pmcheck once flushes became durable only at the fence).
      pm::Fence();
      for (uint32_t i = 0; i < lay_.m; i++) {
        if (!(upper >> i & 1)) continue;
        if (kBytes) {
          pm::StoreAtomic(Key(l, i), uint64_t(0));
          pm::Flush(Key(l, i), 8);
        }
        if (vbytes_) {
          pm::StoreAtomic(Val(l, i), uint64_t(0));
          pm::Flush(Val(l, i), 8);
        }
      }
    }
    (void)n;
    pm::Fence();
  }
  void ResetSplitLog(SplitLog* lg) {
    pm::Store(&lg->nw, uint64_t(0));
    pm::Store(&lg->cur, uint64_t(0));
    pm::Persist(lg, 16);
  }
  // Splits the full, locked leaf loff. On success *noff is the new right leaf
  // (locked, linked after loff) and *sep its smallest key.
  Status SplitLeaf(uint64_t loff, uint64_t* noff, Rec* sep) {
    char* l = L(loff);
    uint64_t upper = 0;
    if (!ChooseSplit(l, &upper, sep)) return Status::Corrupt("fptree: unreadable key block in a locked leaf");
    int li = AcquireLog(&split_free_);
    SplitLog* lg = &root_->split[li];
    if (!PMINDEX_FAULT("fptree.split.skip_log")) pm::Store(&lg->cur, loff);
    Status st;
    if (groups_) {
      uint64_t leaf = 0;
      st = GetLeaf(&leaf);
      if (st.ok()) {
        pm::Store(&lg->nw, leaf);
        pm::Persist(lg, 16);
      }
    } else {
      // Allocate-into-destination: log.new is the destination. log.cur sits in
      // the same line, stored earlier, so it is durable no later than log.new.
      st = pool_->allocator().Allocate(&lg->nw, lay_.bytes);
    }
    if (!st.ok()) {
      ResetSplitLog(lg);
      ReleaseLog(&split_free_, li);
      return st;
    }
    *noff = lg->nw;
    SplitCopy(l, L(*noff), upper);
    SplitFinish(l, *noff, upper);
    ResetSplitLog(lg);
    ReleaseLog(&split_free_, li);
    return Status::OK();
  }

  // ---- record writes (leaf locked) ---------------------------------------------------
  // Writes key/value into free slot s of leaf l and commits with the bitmap.
  Status InsertInto(char* l, int s, const SKey& k, Slice value) {
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
        if (kBytes) pool_->allocator().Free(kw);
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
  Status UpdateIn(char* l, int old, const SKey& k, Slice value) {
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
    // block is garbage (free). Recovery's alg. 17 check finishes this.
    if (kBytes) {
      pm::StoreAtomic(Key(l, old), uint64_t(0));
      if (!vbytes_ || !lay_.fp) pm::Persist(Key(l, old), 8);
    }
    if (vbytes_) pool_->allocator().Free(Val(l, old));
    return Status::OK();
  }

  // ---- public operations ----------------------------------------------------------------
  enum class Mode { kInsert, kUpdate, kUpsert };

  Status Insert(Slice key, Slice value) override { return Put(key, value, Mode::kInsert); }
  Status Update(Slice key, Slice value) override { return Put(key, value, Mode::kUpdate); }
  Status Upsert(Slice key, Slice value) override { return Put(key, value, Mode::kUpsert); }

  Status Put(Slice key, Slice value, Mode mode) {
    if (closed_) return Status::InvalidArgument("index closed");
    PMINDEX_RETURN_IF_ERROR(ValidateKey(key_kind(), max_key_, key));
    PMINDEX_RETURN_IF_ERROR(ValidateValue(value_kind(), max_value_, value));
    SKey k = MakeKey(key);
    EpochGuard g(epoch_, kConc);
    Backoff bo;
    for (;;) {
      uint64_t lv = 0;
      uint64_t loff = FindLeaf(k, &lv);
      char* l = L(loff);
      if (!LeafTryLock(l, lv)) {
        bo.Wait();
        continue;
      }
      uint64_t bm = Ld(Bm(l));
      int slot = FindSlot(l, bm, k);
      if (slot >= 0 && mode == Mode::kInsert) {
        LeafUnlock(l);
        return Status::AlreadyExists();
      }
      if (slot < 0 && mode == Mode::kUpdate) {
        LeafUnlock(l);
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
        SKey sk;
        if constexpr (kBytes) sk.s = sep.ks;
        else sk.u = sep.k;
        int c = kBytes ? CompareKeys(KeyKind::kBytes, k.s, sep.ks) : (k.u < sep.k ? -1 : (k.u > sep.k ? 1 : 0));
        if (c >= 0) target = L(noff);
        // Slots keep their index in the copy, so `slot` is valid in target.
        if (slot >= 0) st = UpdateIn(target, slot, k, value);
        else st = InsertInto(target, FreeSlotFor(Ld(Bm(target)), HomeLine(k)), k, value);
        InsertSeparator(sk, KeyWordForInner(sk), noff);
        LeafUnlock(L(noff));
        LeafUnlock(l);
        return st;
      }
      if (slot >= 0) st = UpdateIn(l, slot, k, value);
      else st = InsertInto(l, FreeSlotFor(bm, HomeLine(k)), k, value);
      LeafUnlockAt(l, lv);
      return st;
    }
  }

  Status Find(Slice key, std::string* value) override {
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

  Status Remove(Slice key) override {
    if (closed_) return Status::InvalidArgument("index closed");
    PMINDEX_RETURN_IF_ERROR(ValidateKey(key_kind(), max_key_, key));
    SKey k = MakeKey(key);
    bool found = false;
    int pending = -1;
    Retired ret;
    {
      EpochGuard g(epoch_, kConc);
      Backoff bo;
      for (;;) {
        uint64_t lv = 0;
        uint64_t loff = FindLeaf(k, &lv);
        char* l = L(loff);
        if (!LeafTryLock(l, lv)) {
          bo.Wait();
          continue;
        }
        uint64_t bm = Ld(Bm(l));
        int slot = FindSlot(l, bm, k);
        if (slot < 0) {
          LeafUnlock(l);
          break;
        }
        found = true;
        bm &= ~(1ull << slot);
        pm::StoreAtomic(Bm(l), bm);
        if (!PMINDEX_FAULT("fptree.delete.skip_flush")) pm::Persist(l, 8);
        if (kBytes) pool_->allocator().Free(Key(l, slot));
        if (vbytes_) pool_->allocator().Free(Val(l, slot));
        if (bm == 0) pending = DeleteEmptyLeaf(loff, k, &ret);
        else LeafUnlockAt(l, lv);
        break;
      }
    }
    FinishLeafDeletion(pending, &ret);
    if (deferred_n_.load(std::memory_order_relaxed)) ProcessDeferred();
    return found ? Status::OK() : Status::NotFound();
  }

  // DRAM objects removed from the inner tree by one leaf deletion, freed
  // after the epoch grace period (no reader can still be inside them).
  struct Retired {
    std::vector<Inner*> nodes;
    std::vector<uint64_t> keys;  // byte-key separator blobs
  };
  // Empty, locked leaf loff: unlinked (the lock is released) or, if that is
  // not possible now, left in place (and unlocked): the tree's last leaf
  // stays; a contended deletion goes to the deferred queue. Returns the
  // delete log to finish after the grace period, or -1.
  int DeleteEmptyLeaf(uint64_t loff, const SKey& k, Retired* ret) {
    int r = TryDeleteLeaf(loff, k, ret);
    if (r >= 0) return r;
    if (r == kContended) Defer(loff, k);
    LeafUnlock(L(loff));
    return -1;
  }
  void FinishLeafDeletion(int pending, Retired* ret) {
    if (pending < 0) return;
    // Grace period before the unlinked leaf's memory and the removed inner
    // nodes may be reused.
    if (kConc) epoch_.Synchronize();
    FinishDeleteLog(&root_->del[pending]);
    ReleaseLog(&del_free_, pending);
    for (Inner* n : ret->nodes) FreeInner(n);
    for (uint64_t w : ret->keys) FreeKeyWord(w);
  }

  // Deferred leaf deletions (fptree: the left neighbour's lock was contended
  // 64 times). Each entry names an empty leaf and a key of its range (ranges
  // of an empty leaf only widen, so the key keeps leading to it while it is
  // in the tree). Every Remove processes one entry; an entry whose leaf is no
  // longer found by its key, or no longer empty, is dropped; a leaf is queued
  // once, so the queue never holds more entries than there are empty leaves.
  struct Deferred {
    uint64_t leaf;
    SKey k;
    std::string ks;  // owns k.s for byte keys
  };
  void Defer(uint64_t loff, const SKey& k) {
    g_deferred_deletions.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard<std::mutex> g(deferred_mu_);
    for (auto& d : deferred_)
      if (d.leaf == loff) {
        // Queued before with a key that may no longer lead here (the leaf
        // was refilled and split, or its offset reused): take the new key,
        // which routes to the leaf now.
        d.k = k;
        if constexpr (kBytes) d.ks.assign(k.s.data(), k.s.size());  // ProcessDeferred points k.s at it
        return;
      }
    Deferred d;
    d.leaf = loff;
    d.k = k;
    if constexpr (kBytes) d.ks.assign(k.s.data(), k.s.size());
    deferred_.push_back(std::move(d));
    deferred_n_.store(deferred_.size(), std::memory_order_relaxed);
  }
  void ProcessDeferred() {
    if (kConc && PMINDEX_FAULT("fptree.delete.force_deferred")) return;  // test hook: queue frozen
    Deferred d;
    {
      std::lock_guard<std::mutex> g(deferred_mu_);
      if (deferred_.empty()) return;
      d = std::move(deferred_.front());
      deferred_.erase(deferred_.begin());
      deferred_n_.store(deferred_.size(), std::memory_order_relaxed);
    }
    if constexpr (kBytes) d.k.s = d.ks;
    int pending = -1;
    Retired ret;
    {
      EpochGuard g(epoch_, kConc);
      uint64_t lv = 0;
      uint64_t loff = FindLeaf(d.k, &lv);
      char* l = L(loff);
      if (loff != d.leaf) return;  // deleted meanwhile
      if (!LeafTryLock(l, lv)) {
        Defer(loff, d.k);
        return;
      }
      if (Ld(Bm(l)) != 0) {
        LeafUnlock(l);  // refilled
        return;
      }
      pending = DeleteEmptyLeaf(loff, d.k, &ret);
    }
    FinishLeafDeletion(pending, &ret);
  }

  static constexpr int kKept = -1, kContended = -2;
  // Leaf loff (locked, empty) is unlinked from the inner nodes and the list
  // (alg. 5/6). Returns the delete log index to finish after the grace period
  // (the leaf is then marked obsolete and unlocked), or kKept (the tree's only
  // leaf) / kContended (the left neighbour or an inner node stayed busy for 64
  // tries); the leaf is then still locked by the caller.
  // The DRAM part: the deepest inner node on the path with more than one
  // child loses the entry of the subtree holding the leaf; the nodes of that
  // subtree (single-child nodes above the leaf) are marked obsolete and
  // retired; a root left with one child is replaced by that child.
  int TryDeleteLeaf(uint64_t loff, const SKey& k, Retired* ret) {
    constexpr int kMaxDepth = 64;
    char* l = L(loff);
    // Test hook (not a persistence fault): behave as if contended and freeze
    // the queue (ProcessDeferred), so that tests drive the deferred queue
    // deterministically on few cores.
    if (kConc && PMINDEX_FAULT("fptree.delete.force_deferred")) return kContended;
    for (int attempt = 0; attempt < 64; attempt++) {
      if (attempt) std::this_thread::yield();
      Inner* pn[kMaxDepth];
      uint64_t pv[kMaxDepth];
      uint32_t pi[kMaxDepth];
      int d = 0;
      Inner* left = nullptr;  // deepest node where the path goes right of child 0
      uint32_t left_idx = 0;
      Inner* n = root_inner_.load(std::memory_order_acquire);
      uint64_t v = 0;
      if (!ReadLock(n, &v)) continue;
      if (kConc && n != root_inner_.load(std::memory_order_acquire)) continue;
      bool bad = false;
      for (;;) {
        uint32_t i = UpperBound(n, k);
        uint64_t c = n->child()[i].load(std::memory_order_acquire);
        if (i > 0) {
          left = n;
          left_idx = i - 1;
        }
        pn[d] = n;
        pv[d] = v;
        pi[d] = i;
        d++;
        if (n->bottom) {
          bad = c != loff || !Validate(n, v);
          break;
        }
        Inner* cn = reinterpret_cast<Inner*>(c);
        uint64_t cv = 0;
        if (d == kMaxDepth || !Validate(n, v) || !ReadLock(cn, &cv) || !Validate(n, v)) {
          bad = true;
          break;
        }
        n = cn;
        v = cv;
      }
      if (bad) continue;
      int t = d - 1;
      while (t >= 0 && pn[t]->count.load(std::memory_order_relaxed) == 0) t--;
      if (t < 0) return kKept;  // the only leaf of the tree
      // Left neighbour: rightmost leaf of the left subtree (verified below).
      uint64_t prev = 0;
      if (left) {
        Inner* x = left;
        uint64_t c = x->child()[left_idx].load(std::memory_order_acquire);
        while (!x->bottom && c) {
          x = reinterpret_cast<Inner*>(c);
          uint32_t cnt = std::min(x->count.load(std::memory_order_relaxed), x->cap);
          c = x->child()[cnt].load(std::memory_order_acquire);
        }
        prev = c;  // verified under its lock: prev.next == loff
        if (!prev) continue;
      }
      char* p = prev ? L(prev) : nullptr;
      if (p) {
        if (prev == loff) continue;
        if (!LeafTryLock(p, LeafVersion(p))) continue;
        if (Ld(Next(p)) != loff) {
          LeafUnlock(p);
          continue;
        }
      } else if (__atomic_load_n(&root_->head, __ATOMIC_ACQUIRE) != loff) {
        continue;
      }
      // Lock pn[t..d-1] top-down against the versions read (OLC upgrades
      // never wait, so no lock order issue with the leaf locks held).
      int locked = t;
      while (locked < d && Upgrade(pn[locked], pv[locked])) locked++;
      if (locked < d) {
        for (int x = t; x < locked; x++) WriteUnlock(pn[x]);
        if (p) LeafUnlock(p);
        continue;
      }
      // Persistent unlink (alg. 6 lines 3-13). The log is taken with one try:
      // logs are released only after a grace period (FinishLeafDeletion),
      // which waits for this thread's epoch guard, so waiting for one here,
      // inside the guard and holding locks, could deadlock once every log is
      // pending (65+ deleting threads).
      int li = TryAcquireLog(&del_free_);
      if (li < 0) {
        for (int x = t; x < d; x++) WriteUnlock(pn[x]);
        if (p) LeafUnlock(p);
        continue;
      }
      DeleteLog* lg = &root_->del[li];
      pm::Store(&lg->prev, prev);
      pm::Store(&lg->cur, loff);
      pm::Persist(lg, 16);
      uint64_t nx = Ld(Next(l));
      if (p) pm::StorePersist(Next(p), nx);
      else pm::StorePersist(&root_->head, nx);
      // DRAM unlink.
      uint64_t kw = RemoveAt(pn[t], pi[t]);
      if constexpr (kBytes) ret->keys.push_back(kw);
      for (int x = t + 1; x < d; x++) {
        ObsoleteUnlock(pn[x]);
        ret->nodes.push_back(pn[x]);
      }
      if (t == 0) CollapseRoot(pn[0], ret);
      else WriteUnlock(pn[t]);
      LeafUnlock(l, /*obsolete=*/true);
      if (p) LeafUnlock(p);
      return li;
    }
    return kContended;
  }
  // r is the root, write-locked. While it is an inner node with a single
  // child, the child becomes the root (r is retired). Unlocks the final root.
  // Waiting for the child's lock while holding r cannot deadlock: whoever
  // holds a child's lock never waits for its parent (upgrades are top-down
  // and never block) nor for a leaf lock.
  void CollapseRoot(Inner* r, Retired* ret) {
    while (!r->bottom && r->count.load(std::memory_order_relaxed) == 0) {
      auto* c = reinterpret_cast<Inner*>(r->child()[0].load(std::memory_order_acquire));
      bool locked = false;
      Backoff bo;
      for (;;) {
        uint64_t cv = kConc ? c->version.load(std::memory_order_acquire) : 0;
        if (cv & 1) break;  // cannot happen: only r could have removed c
        if (!(cv & 2) && Upgrade(c, cv)) {
          locked = true;
          break;
        }
        bo.Wait();
      }
      if (!locked) break;
      root_inner_.store(c, std::memory_order_release);
      ObsoleteUnlock(r);
      ret->nodes.push_back(r);
      r = c;
    }
    WriteUnlock(r);
  }
  // Removes child j and one neighbouring key (key j-1, or key 0 if j == 0:
  // the removed child's range goes to its left, resp. right, sibling).
  // Returns the removed key word. Caller holds n, which has count >= 1.
  static uint64_t RemoveAt(Inner* n, uint32_t j) {
    uint32_t cnt = n->count.load(std::memory_order_relaxed);
    auto* keys = n->keys();
    auto* ch = n->child();
    uint32_t kd = j > 0 ? j - 1 : 0;  // key removed
    uint64_t removed = keys[kd].load(std::memory_order_relaxed);
    for (uint32_t x = kd; x + 1 < cnt; x++) keys[x].store(keys[x + 1].load(std::memory_order_relaxed), std::memory_order_release);
    for (uint32_t x = j; x < cnt; x++) ch[x].store(ch[x + 1].load(std::memory_order_relaxed), std::memory_order_release);
    n->count.store(cnt - 1, std::memory_order_release);
    return removed;
  }
  // Alg. 6 line 14-15 / alg. 7 tail: free (or return to its group) the unlinked
  // leaf and reset the log.
  void FinishDeleteLog(DeleteLog* lg) {
    if (lg->cur) {
      if (groups_) {
        uint64_t leaf = lg->cur;
        pm::Store(&lg->cur, uint64_t(0));
        pm::Persist(&lg->cur, 8);
        FreeLeaf(leaf);
      } else {
        pool_->allocator().Free(&lg->cur);
      }
    }
    pm::Store(&lg->prev, uint64_t(0));
    pm::Persist(lg, 16);
  }

  Status Scan(Slice start, size_t n, ScanCallback cb, size_t* count) override {
    if (count) *count = 0;
    if (closed_) return Status::InvalidArgument("index closed");
    PMINDEX_RETURN_IF_ERROR(ValidateKey(key_kind(), max_key_, start));
    if constexpr (!kBytes) {
      if (!vbytes_) return ScanU64(SliceToU64(start), n, cb, count);
    }
    size_t done = 0;
    Rec resume;
    bool inclusive = true;
    if constexpr (kBytes) resume.ks.assign(start.data(), start.size());
    else resume.k = SliceToU64(start);
    std::vector<Rec> out, leafrecs;
    std::vector<std::pair<Rec, int>> scratch;
    while (done < n) {
      out.clear();
      bool end = false;
      {
        EpochGuard g(epoch_, kConc);
        SKey k;
        if constexpr (kBytes) k.s = resume.ks;
        else k.u = resume.k;
        uint64_t lv = 0;
        uint64_t loff = FindLeaf(k, &lv);
        size_t want = std::min<size_t>(n - done, 512);
        bool incl = inclusive;
        while (out.size() < want) {
          char* l = L(loff);
          uint64_t nx = 0;
          bool corrupt = false;
          if (!ReadLeafRecs(l, lv, k, incl, &leafrecs, &scratch, &nx, &corrupt)) {
            if (corrupt) {
              if (count) *count = done;
              return Status::Corrupt("fptree: unreadable key or value block in leaf " + Num(loff));
            }
            break;  // changed: re-traverse
          }
          for (auto& r : leafrecs) out.push_back(std::move(r));
          // Later leaves are filtered by the last key collected: a leaf we
          // passed may have emptied and been deleted meanwhile, its range
          // merged into the next leaf, which can then hold smaller keys
          // inserted after we read them.
          if (!out.empty()) {
            if constexpr (kBytes) k.s = out.back().ks;
            else k.u = out.back().k;
            incl = false;
          }
          if (nx == 0) {
            end = true;
            break;
          }
          // Continue along the list; an obsolete/locked next leaf re-traverses.
          char* nl = L(nx);
          uint64_t nv = LeafVersion(nl);
          if (kConc && (nv & 3)) break;
          loff = nx;
          lv = nv;
        }
      }
      size_t emit = std::min(out.size(), n - done);
      for (size_t i = 0; i < emit; i++) {
        Rec& r = out[i];
        Slice ks = kBytes ? Slice(r.ks) : U64Slice(r.k);
        Slice vs = vbytes_ ? Slice(r.vs) : U64Slice(r.v);
        done++;
        if (!cb(ks, vs)) {
          if (count) *count = done;
          return Status::OK();
        }
      }
      if (emit > 0) {
        resume = std::move(out[emit - 1]);
        inclusive = false;
      }
      if (end && emit == out.size()) break;
    }
    if (count) *count = done;
    return Status::OK();
  }
  // Per-thread record buffer of ScanU64 (kScanBatch records plus one leaf),
  // reached once per scan: a thread_local name used in the loops cost a TLS
  // lookup per record, and a vector a capacity check per record.
  using KV = std::pair<uint64_t, uint64_t>;
  static constexpr size_t kScanBatch = 512;
  static __attribute__((noinline)) KV* ScanBuffer() {
    static FPT_TLS std::unique_ptr<KV[]>* buf = nullptr;  // pointer: a trivial TLS object
    thread_local std::unique_ptr<KV[]> owner;             // frees it at thread exit
    if (!buf) {
      owner.reset(new KV[kScanBatch + 64]);
      buf = &owner;
    }
    return buf->get();
  }
  // Scan for u64 keys and values: the same algorithm as Scan with plain
  // (key, value) pairs instead of owned strings; each leaf is read in the
  // order of its scan-order hint when the hint checks out (see LoadHint).
  Status ScanU64(uint64_t start, size_t n, ScanCallback cb, size_t* count) {
    size_t done = 0;
    uint64_t resume = start;
    bool inclusive = true;
    KV* out = ScanBuffer();
    while (done < n) {
      size_t nout = 0;
      bool end = false;
      {
        EpochGuard g(epoch_, kConc);
        SKey k;
        k.u = resume;
        uint64_t lv = 0;
        Path path;
        uint64_t loff = FindLeaf(k, &lv, &path);
        PrefetchLeaf(loff);  // its lines are read in key order, i.e. at random
        size_t want = std::min<size_t>(n - done, kScanBatch);
        Ahead ahead{path.parent, path.idx, path.idx};
        int per_leaf = int(lay_.m / 2);  // records per leaf, guessed until one is read
        while (nout < want) {
          PrefetchAhead(&ahead, (want - nout) / size_t(std::max(per_leaf, 1)) + 1);
          char* l = L(loff);
          size_t before = nout;
          bool truncated = false;
          if (!ReadLeafSortedU64(l, lv, resume, inclusive, want - before, ahead.pf > ahead.pos, out, &nout, &truncated,
                                 &per_leaf)) {
            nout = before;
            break;  // changed: re-traverse from the last key collected
          }
          uint64_t nx = NextAcquire(l);  // the loop reads that leaf next (NextAcquire)
          if (!LeafValidate(l, lv)) {
            nout = before;
            break;
          }
          if (nout > before) {  // see Scan: filter later leaves by the last key collected
            resume = out[nout - 1].first;
            inclusive = false;
          }
          if (truncated) break;  // enough records; the rest of this leaf is not needed
          if (nx == 0) {
            end = true;
            break;
          }
          char* nl = L(nx);
          uint64_t nv = LeafVersion(nl);
          if (kConc && (nv & 3)) break;
          loff = nx;
          lv = nv;
          ahead.pos++;
        }
      }
      size_t emit = std::min(nout, n - done);
      for (size_t i = 0; i < emit; i++) {
        done++;
        if (!cb(U64Slice(out[i].first), U64Slice(out[i].second))) {
          if (count) *count = done;
          return Status::OK();
        }
      }
      if (emit > 0) {
        resume = out[emit - 1].first;
        inclusive = false;
      }
      if (end && emit == nout) break;
    }
    if (count) *count = done;
    return Status::OK();
  }
  // True if a whole leaf at `off` lies in the pool's current size (it grows
  // in place while open, so the size at open is not a bound: review finding).
  // The pool only grows (file extended and mapped before the header's size
  // is published), so a size seen once stays a valid bound: the hot path
  // compares with the last size seen and reads the header (an out-of-line
  // acquire load, once per leaf of every scan before) only for an offset
  // beyond it.
  bool InPool(uint64_t off) const {
    auto fits = [&](uint64_t size) { return off && size >= lay_.bytes && off <= size - lay_.bytes; };
    if (fits(known_size_.load(std::memory_order_relaxed))) return true;
    const uint64_t size = pool_->size();  // acquire
    known_size_.store(size, std::memory_order_relaxed);
    return fits(size);
  }
  bool InReserved(uint64_t off) const { return off && reserved_size_ >= lay_.bytes && off <= reserved_size_ - lay_.bytes; }
  void PrefetchLeaf(uint64_t off) const {
    if (InReserved(off))
      for (uint32_t o = 0; o < lay_.bytes; o += 64) __builtin_prefetch(L(off) + o);
  }
  // Scan lookahead. The leaves a scan visits next are its bottom inner
  // node's next children: their offsets are known without waiting for each
  // leaf's next pointer, so the leaves' header lines (bitmap, trailer) are
  // fetched several leaves ahead instead of one dependent miss per leaf,
  // which dominates when deletes have left leaves sparse (the paper never
  // merges leaves). The child words are read without validation: a stale
  // offset only wastes a prefetch (bounded by the pool size; the node is
  // not freed while the scan's epoch guard is held). The list order, read
  // through the next pointers and validated, is still what the scan follows.
  struct Ahead {
    Inner* parent;  // bottom inner node of the first leaf (nullptr: none)
    uint32_t pos;   // child index of the leaf being read
    uint32_t pf;    // highest child index whose header lines were prefetched
  };
  static constexpr size_t kMaxAhead = 8;
  void PrefetchAhead(Ahead* a, size_t leaves) const {
    if (!a->parent) return;
    uint32_t cnt = std::min(a->parent->count.load(std::memory_order_relaxed), a->parent->cap);
    uint32_t last = uint32_t(std::min<size_t>(std::min<size_t>(leaves, kMaxAhead) + a->pos, cnt));
    for (; a->pf < last; a->pf++) {
      uint64_t off = a->parent->child()[a->pf + 1].load(std::memory_order_relaxed);
      if (InReserved(off)) {
        __builtin_prefetch(L(off));
        __builtin_prefetch(L(off) + lay_.trailer);
      }
    }
  }
  // The lines of leaf `off` that hold its valid slots (from its bitmap, whose
  // line PrefetchAhead fetched earlier). This loads the bitmap: `off` must
  // come from an acquire load of a next pointer (the split that published
  // the leaf wrote its bitmap with plain stores before the release store of
  // the next pointer), and lie in the pool's current size.
  void PrefetchRecords(uint64_t off) const {
    if (!InPool(off)) return;
    char* l = L(off);
    uint64_t bm = Ld(Bm(l)) & lay_.full;
    const uint32_t per = 64 / lay_.key_stride;  // slots per line: 4 (fptree), 8 (ptree)
    const uint64_t group = (1ull << per) - 1;
    for (uint32_t s = 0; s < lay_.m; s += per) {
      if (!((bm >> s) & group)) continue;
      __builtin_prefetch(Key(l, int(s)));
      if (!lay_.fp) __builtin_prefetch(Val(l, int(s)));
    }
  }

  // ---- scan-order hint ---------------------------------------------------------------
  // Leaves are unsorted (sec. 4.1), so a scan needs each leaf's records in
  // key order. The last scan that sorted a leaf leaves that order in the 48
  // unused bytes of the leaf's trailer line (after the next pointer and the
  // lock word): up to 64 six-bit slot indices, entry j at bits [6j, 6j+6) of
  // the six little-endian words. It is a hint, not state: written with
  // volatile stores (pm::StoreVolatile: never flushed; pmcheck logs them,
  // only its lint ignores them), never touched by writers, not copied by splits, and trusted only if it lists
  // exactly the valid slots (LoadHint) in strictly ascending key order (the
  // caller checks while it reads the keys, which an unsorted leaf needs
  // anyway: a record below the last one emitted could hide in any slot).
  // Such a list *is* the sorted order of the records as read, whatever
  // happened since it was written: inserts, deletes, slot reuse with an
  // unchanged bitmap, a leaf freed and reallocated, a crash (the trailer
  // line reaches PM whenever a split flushes the next pointer, or by
  // eviction, with any hint contents), a pool written by an older version
  // (the bytes were zero or stale), or a hint torn by two scans storing at
  // once. A failed check sorts, stores a fresh hint and goes on. Concurrent
  // trees store a hint only from a version-validated read of the leaf.
  // It lives in the leaf's own trailer line, which the scan reads anyway
  // (next pointer, version), so it costs no extra miss and no DRAM and
  // scales with the tree (the DRAM table it replaces had 64K entries).
  static constexpr int kHintWords = 6;  // 48 bytes: 64 slots x 6 bits
  uint64_t* Hint(char* l) const { return reinterpret_cast<uint64_t*>(l + lay_.trailer + 16); }
  // Hint words needed for cnt entries, loaded into w (7 words: byte 6g..6g+7
  // of group g = entries 8g..8g+7 is always inside the array).
  int LoadHintWords(char* l, int cnt, uint64_t* w) const {
    const int nw = (6 * cnt + 63) / 64;
    const uint64_t* h = Hint(l);
    for (int i = 0; i < nw; i++) w[i] = Ld(h + i);
    for (int i = nw; i <= kHintWords; i++) w[i] = 0;
    return nw;
  }
  // Entries 8g..8g+7 of the hint (six bits each, from bit 0).
  static uint64_t HintGroup(const uint64_t* w, int g) {
    uint64_t x;
    std::memcpy(&x, reinterpret_cast<const char*>(w) + 6 * g, 8);
    return x;
  }
  // Decodes the first cnt = popcount(bm) hint entries into ord; true iff
  // they name exactly the slots of bm (then they are distinct). cnt <= 1
  // needs no hint.
  bool LoadHint(char* l, uint64_t bm, int cnt, uint8_t* ord) const {
    if (cnt <= 1) {
      if (cnt) ord[0] = uint8_t(__builtin_ctzll(bm));
      return true;
    }
    uint64_t w[kHintWords + 1];
    LoadHintWords(l, cnt, w);
    uint64_t seen = 0;
    for (int j = 0; j < cnt; j++) {
      unsigned s = unsigned(HintGroup(w, j >> 3) >> (6 * (j & 7))) & 63;
      ord[j] = uint8_t(s);
      seen |= 1ull << s;
    }
    return seen == bm;
  }
  void StoreHint(char* l, const uint8_t* ord, int cnt) {
    if (cnt <= 1) return;
    uint64_t w[kHintWords + 1] = {};
    char* b = reinterpret_cast<char*>(w);
    for (int g = 0; 8 * g < cnt; g++) {
      uint64_t x = 0;
      for (int j = 8 * g; j < cnt && j < 8 * g + 8; j++) x |= uint64_t(ord[j]) << (6 * (j & 7));
      std::memcpy(b + 6 * g, &x, 6);
    }
    const int nw = (6 * cnt + 63) / 64;
    uint64_t* h = Hint(l);
    for (int i = 0; i < nw; i++) pm::StoreVolatile(h + i, w[i], __ATOMIC_RELAXED);
  }

  // Appends to out[*nout..] the records of leaf l (version lv) with key >=
  // from (> from if !incl), ascending, at most `room` of them (*truncated =
  // true if more were left). Reads in the hinted order when it checks out,
  // else sorts and stores a fresh hint. False if the leaf changed while it
  // was read (torn key/bitmap); the caller also validates the version
  // afterwards, which covers the values read here.
  bool ReadLeafSortedU64(char* l, uint64_t lv, uint64_t from, bool incl, size_t room, bool next_header_fetched, KV* out,
                         size_t* nout, bool* truncated, int* cnt_out) {
    uint64_t bm = Ld(Bm(l)) & lay_.full;
    int cnt = __builtin_popcountll(bm);
    *cnt_out = cnt;
    // The scan will go on to the next leaf (a random address, one dependent
    // miss after another otherwise): fetch it while this one is read, only
    // the lines with records if its bitmap is on its way already (Ahead).
    // PrefetchRecords loads that bitmap, so the next pointer is read with
    // acquire (pairs with SplitFinish's release store; with a relaxed load
    // TSan reported the bitmap load racing with SplitCopy's plain stores:
    // review finding). A stale offset only wastes the prefetch: the leaf it
    // names is not freed while this scan's epoch guard is held.
    if (room > size_t(cnt)) {
      if (next_header_fetched) PrefetchRecords(NextAcquire(l));
      else PrefetchLeaf(Ld(Next(l)));
    }
    // Layout values in locals: the loops below store to `out`, which the
    // compiler cannot tell apart from this->lay_.
    const char* kbase = l + lay_.key_off;
    const char* vbase = l + lay_.val_off;
    const size_t kstride = lay_.key_stride, vstride = lay_.val_stride;
    auto key_at = [&](unsigned s) { return Ld(reinterpret_cast<const uint64_t*>(kbase + s * kstride)); };
    auto val_at = [&](unsigned s) { return Ld(reinterpret_cast<const uint64_t*>(vbase + s * vstride)); };
    // Records below `from` (only in the first leaf) are skipped.
    auto wanted = [&](uint64_t kk) { return kk > from || (kk == from && incl); };
    size_t o = *nout;
    uint8_t ord[64];
    if (cnt > 1) {
      // Decoded on the fly: entry j names a slot of bm, and its key is above
      // entry j-1's; cnt such entries are exactly bm's slots in key order.
      uint64_t w[kHintWords + 1];
      LoadHintWords(l, cnt, w);
      size_t end = o + room;
      bool ok = true;
      uint64_t prev = 0;
      for (int j = 0; j < cnt && ok; j += 8) {
        uint64_t x = HintGroup(w, j >> 3);
        const int je = std::min(cnt, j + 8);
        for (int jj = j; jj < je; jj++, x >>= 6) {
          const unsigned s = unsigned(x & 63);
          if (!(bm >> s & 1)) {  // before the key load: s may be >= m
            ok = false;
            break;
          }
          uint64_t kk = key_at(s);
          if (jj > 0 && kk <= prev) {
            ok = false;
            break;
          }
          prev = kk;
          if (!wanted(kk)) continue;
          if (o == end) {
            *truncated = true;
            continue;  // keep verifying the order of the rest
          }
          out[o++] = {kk, val_at(s)};
        }
      }
      if (ok) {
        *nout = o;
        return true;
      }
      o = *nout;
      *truncated = false;
      if (kConc && !LeafValidate(l, lv)) return false;
    }
    // Stale hint: sort (key, slot) pairs, store the order, emit.
    std::pair<uint64_t, uint32_t> ks[64];
    int c = 0;
    for (uint64_t mm = bm; mm; mm &= mm - 1) {
      unsigned i = unsigned(__builtin_ctzll(mm));
      ks[c++] = {key_at(i), i};
    }
    if (kConc && !LeafValidate(l, lv)) return false;  // do not store a torn order
    std::sort(ks, ks + c, [](const auto& a, const auto& b) { return a.first < b.first; });
    for (int j = 0; j < c; j++) ord[j] = uint8_t(ks[j].second);
    StoreHint(l, ord, c);
    size_t end = o + room;
    for (int j = 0; j < c; j++) {
      uint64_t kk = ks[j].first;
      if (!wanted(kk)) continue;
      if (o == end) {
        *truncated = true;
        break;
      }
      out[o++] = {kk, val_at(ks[j].second)};
    }
    *nout = o;
    return true;
  }

  // Snapshot of leaf l's records >= k (> k if !inclusive), sorted (byte keys
  // or byte values). Reads the keys in the hinted order and checks it as it
  // goes; a stale hint is replaced after a sort. `all` is scratch space
  // (kept between calls so its strings keep their buffers). False if the
  // leaf changed meanwhile (the caller re-traverses), or, with *corrupt set,
  // if a key/value block of the unchanged leaf is unreadable (a damaged
  // pool: re-traversing would read it again forever).
  bool ReadLeafRecs(char* l, uint64_t lv, const SKey& k, bool inclusive, std::vector<Rec>* recs,
                    std::vector<std::pair<Rec, int>>* all, uint64_t* next, bool* corrupt) {
    recs->clear();
    uint64_t bm = Ld(Bm(l)) & lay_.full;
    int cnt = __builtin_popcountll(bm);
    uint8_t ord[64];
    bool sorted = LoadHint(l, bm, cnt, ord);
    if (!sorted) {
      int c = 0;
      for (uint64_t m = bm; m; m &= m - 1) ord[c++] = uint8_t(__builtin_ctzll(m));
    }
    if (all->size() < size_t(cnt)) all->resize(cnt);
    for (int j = 0; j < cnt; j++) {
      auto& a = (*all)[j];
      a.second = ord[j];
      if (!ReadSlotKey(l, ord[j], &a.first)) {  // stale key pointer: the leaf changed, or a damaged block
        *corrupt = LeafValidate(l, lv);
        return false;
      }
      if (sorted && j > 0 && CmpRec((*all)[j - 1].first, a.first) >= 0) sorted = false;
    }
    if (!sorted) {
      if (kConc && !LeafValidate(l, lv)) return false;  // do not store a torn order
      std::sort(all->begin(), all->begin() + cnt, [](const auto& a, const auto& b) { return CmpRec(a.first, b.first) < 0; });
      for (int j = 0; j < cnt; j++) ord[j] = uint8_t((*all)[j].second);
      StoreHint(l, ord, cnt);
    }
    for (int j = 0; j < cnt; j++) {
      auto& a = (*all)[j];
      int c = CmpRecKey(a.first, k);
      if (c < 0 || (c == 0 && !inclusive)) continue;
      recs->push_back(std::move(a.first));
      if (!ReadSlotVal(l, a.second, &recs->back())) {
        *corrupt = LeafValidate(l, lv);
        return false;
      }
    }
    *next = NextAcquire(l);  // the caller reads that leaf next
    return LeafValidate(l, lv);
  }

  uint64_t Size() override {
    if (closed_) return 0;
    EpochGuard g(epoch_, kConc);
    uint64_t n = 0;
    uint64_t x = __atomic_load_n(&root_->head, __ATOMIC_ACQUIRE);
    while (x) {
      char* l = L(x);
      // fptree: a split cuts the old leaf's bitmap before it links the new
      // leaf (both under the leaf's lock), so an unvalidated walk could read
      // the cut bitmap and the old next pointer and miss the moved half
      // (found by tests/conformance SizeDuringSplitsAndDeletions). The pair
      // (bitmap, next) is read under the leaf's version: either both from
      // before the split or both after it. Unlocked leaves only: a leaf is
      // locked for one write at a time (deferred deletions leave it unlocked).
      uint64_t bm = 0, nx = 0;
      for (Backoff bo;; bo.Wait()) {
        const uint64_t lv = LeafVersion(l);
        if (lv & 1) continue;
        bm = Ld(Bm(l));
        nx = NextAcquire(l);
        if (LeafValidate(l, lv)) break;
      }
      n += __builtin_popcountll(bm);
      x = nx;
    }
    return n;
  }

  // ---- check / blocks / stats ---------------------------------------------------------
  Status Check() override {
    if (closed_) return Status::InvalidArgument("index closed");
    std::vector<uint64_t> leaves;
    PMINDEX_RETURN_IF_ERROR(CollectLeaves(&leaves));
    Rec prev_max;
    bool have_prev = false;
    for (uint64_t off : leaves) {
      char* l = L(off);
      uint64_t bm = *Bm(l);
      if (bm & ~lay_.full) return Status::Corrupt("bitmap has bits beyond the leaf size");
      if (kConc && (*Ver(l) & 3)) return Status::Corrupt("leaf left locked");
      std::vector<Rec> recs;
      for (uint32_t i = 0; i < lay_.m; i++) {
        bool valid = bm >> i & 1;
        if (!valid) {
          if ((kBytes && *Key(l, i)) || (vbytes_ && *Val(l, i))) return Status::Corrupt("invalid slot holds a block pointer (leak)");
          continue;
        }
        Rec r;
        if (!ReadSlotKey(l, i, &r) || !ReadSlotVal(l, i, &r)) return Status::Corrupt("unreadable key/value block");
        if (kBytes && (r.ks.empty() || r.ks.size() > max_key_)) return Status::Corrupt("bad key length");
        if (lay_.fp) {
          uint8_t f = kBytes ? FpBytes(r.ks) : FpU64(r.k);
          if (*Fp(l, i) != f) return Status::Corrupt("fingerprint mismatch");
        }
        recs.push_back(std::move(r));
      }
      std::sort(recs.begin(), recs.end(), [](const Rec& a, const Rec& b) { return CmpRec(a, b) < 0; });
      for (size_t i = 1; i < recs.size(); i++)
        if (CmpRec(recs[i - 1], recs[i]) == 0) return Status::Corrupt("duplicate key in a leaf");
      if (!recs.empty()) {
        if (have_prev && CmpRec(prev_max, recs.front()) >= 0) return Status::Corrupt("leaves out of key order");
        prev_max = recs.back();
        have_prev = true;
      }
    }
    // Inner nodes: in-order leaves == list, keys sorted, ranges respected.
    std::vector<uint64_t> inorder;
    PMINDEX_RETURN_IF_ERROR(CheckInner(root_inner_.load(), nullptr, nullptr, &inorder, 0));
    if (inorder != leaves) return Status::Corrupt("inner nodes do not index the leaf list in order");
    for (int i = 0; i < kLogs; i++)
      if (root_->split[i].cur || root_->split[i].nw || root_->del[i].cur || root_->del[i].prev)
        return Status::Corrupt("micro-log left set");
    if (groups_) {
      if (root_->get_log.new_group || root_->free_log.cur) return Status::Corrupt("group log left set");
      size_t total = 0;
      for (uint64_t g = root_->groups_head; g; g = *reinterpret_cast<uint64_t*>(L(g))) {
        if (!group_used_.count(g)) return Status::Corrupt("group list and DRAM group map differ");
        total += group_size_;
      }
      if (total != leaves.size() + free_leaves_.size()) return Status::Corrupt("leaf group accounting mismatch");
    }
    return Status::OK();
  }
  // lo <= keys < hi for everything under n (null bounds: unbounded).
  Status CheckInner(Inner* n, const uint64_t* lo, const uint64_t* hi, std::vector<uint64_t>* inorder, int depth) {
    if (depth > 64) return Status::Corrupt("inner tree too deep");
    uint32_t c = n->count.load();
    if (c > n->cap) return Status::Corrupt("inner count over capacity");
    auto* keys = n->keys();
    for (uint32_t i = 0; i < c; i++) {
      uint64_t kw = keys[i].load();
      if (i > 0 && CmpWords(keys[i - 1].load(), kw) >= 0) return Status::Corrupt("inner keys not sorted");
      if (lo && CmpWords(kw, *lo) < 0) return Status::Corrupt("inner key below its range");
      if (hi && CmpWords(kw, *hi) >= 0) return Status::Corrupt("inner key above its range");
    }
    for (uint32_t i = 0; i <= c; i++) {
      uint64_t ch = n->child()[i].load();
      uint64_t klo = i > 0 ? keys[i - 1].load() : 0, khi = i < c ? keys[i].load() : 0;
      const uint64_t* clo = i > 0 ? &klo : lo;
      const uint64_t* chi = i < c ? &khi : hi;
      if (n->bottom) {
        inorder->push_back(ch);
        // Every record of the leaf must be within [clo, chi).
        char* l = L(ch);
        uint64_t bm = *Bm(l);
        for (uint64_t m = bm; m; m &= m - 1) {
          int s = __builtin_ctzll(m);
          Rec r;
          if (!ReadSlotKey(l, s, &r)) return Status::Corrupt("unreadable key");
          SKey sk;
          if constexpr (kBytes) sk.s = r.ks;
          else sk.u = r.k;
          if (clo && CmpInner(*clo, sk) > 0) return Status::Corrupt("record below its leaf's separator");
          if (chi && CmpInner(*chi, sk) <= 0) return Status::Corrupt("record above its leaf's separator");
        }
      } else {
        PMINDEX_RETURN_IF_ERROR(CheckInner(reinterpret_cast<Inner*>(ch), clo, chi, inorder, depth + 1));
      }
    }
    return Status::OK();
  }
  static int CmpWords(uint64_t a, uint64_t b) {
    if constexpr (kBytes) {
      return CompareKeys(KeyKind::kBytes, reinterpret_cast<KeyBlob*>(a)->slice(), reinterpret_cast<KeyBlob*>(b)->slice());
    } else {
      return a < b ? -1 : (a > b ? 1 : 0);
    }
  }

  Status ForEachOwnedBlock(const std::function<void(uint64_t)>& fn) override {
    if (closed_) return Status::InvalidArgument("index closed");
    fn(*pool_->root_slot());
    if (groups_) {
      for (uint64_t g = root_->groups_head; g; g = *reinterpret_cast<uint64_t*>(L(g))) fn(g);
    }
    for (uint64_t x = root_->head; x; x = *Next(L(x))) {
      if (!groups_) fn(x);
      char* l = L(x);
      for (uint32_t i = 0; i < lay_.m; i++) {
        if (kBytes && *Key(l, i)) fn(*Key(l, i));
        if (vbytes_ && *Val(l, i)) fn(*Val(l, i));
      }
    }
    for (int i = 0; i < kLogs; i++) {
      if (root_->split[i].nw && !groups_) fn(root_->split[i].nw);
      if (root_->del[i].cur && !groups_) fn(root_->del[i].cur);
    }
    return Status::OK();
  }

  void Shape(uint64_t* inner_nodes, uint64_t* leaves) override {
    {
      std::lock_guard<std::mutex> g(nodes_mu_);
      *inner_nodes = nodes_.size();
    }
    *leaves = 0;
    for (uint64_t x = __atomic_load_n(&root_->head, __ATOMIC_ACQUIRE); x; x = NextAcquire(L(x))) ++*leaves;
  }
  // Records whose slot is in their home line (home-line placement).
  void HomeShare(uint64_t* at_home, uint64_t* records) override {
    *at_home = *records = 0;
    for (uint64_t x = __atomic_load_n(&root_->head, __ATOMIC_ACQUIRE); x; x = NextAcquire(L(x))) {
      char* l = L(x);
      for (uint64_t m = Ld(Bm(l)) & lay_.full; m; m &= m - 1) {
        int i = __builtin_ctzll(m);
        Rec r;
        if (!ReadSlotKey(l, i, &r)) continue;
        SKey k = MakeKey(kBytes ? Slice(r.ks) : U64Slice(r.k));
        ++*records;
        // Counted through the address the descent prefetches (same
        // condition), so a test fails if prefetch and placement disagree.
        const char* h = HomeLineAddr(l, k);
        const char* slot = reinterpret_cast<const char*>(Key(l, i));
        if (lay_.home_lines > 1 && slot >= h && slot < h + 64) ++*at_home;
      }
    }
  }

  // fptree's leaf version table (MapLeafVersions): the leaves in the list have
  // pairwise distinct words inside the table, none locked or obsolete.
  bool LeafVersionWords(std::string* why) override {
    if (!kConc) return true;
    std::vector<uint64_t*> words;
    for (uint64_t x = __atomic_load_n(&root_->head, __ATOMIC_ACQUIRE); x; x = NextAcquire(L(x))) {
      uint64_t* w = Ver(L(x));
      if (w < vtab_ || w >= vtab_ + vtab_bytes_ / 8) {
        *why = "leaf at " + std::to_string(x) + ": version word outside the table";
        return false;
      }
      if (*w & 3) {
        *why = "leaf at " + std::to_string(x) + ": version word locked or obsolete";
        return false;
      }
      words.push_back(w);
    }
    std::sort(words.begin(), words.end());
    if (std::adjacent_find(words.begin(), words.end()) != words.end()) {
      *why = "two leaves share a version word";
      return false;
    }
    return true;
  }

  void PmWords(FPTreePmWords* w) override {
    const uint64_t ro = *pool_->root_slot();
    w->root = ro;
    w->magic = ro + offsetof(Root, magic);
    w->initialized = ro + offsetof(Root, initialized);
    w->head = ro + offsetof(Root, head);
    w->leaf_slots = ro + offsetof(Root, leaf_slots);
    w->inner_size = ro + offsetof(Root, inner_size);
    w->split0_cur = ro + offsetof(Root, split) + offsetof(SplitLog, cur);
    w->split0_new = ro + offsetof(Root, split) + offsetof(SplitLog, nw);
    w->del0_cur = ro + offsetof(Root, del) + offsetof(DeleteLog, cur);
    w->del0_prev = ro + offsetof(Root, del) + offsetof(DeleteLog, prev);
    w->groups_head = ro + offsetof(Root, groups_head);
    w->get_log = ro + offsetof(Root, get_log);
    w->leaf_bytes = lay_.bytes;
    w->next_in_leaf = lay_.trailer;
    w->slot0_key_in_leaf = lay_.key_off;
    w->key_stride = lay_.key_stride;
    w->slot0_val_in_leaf = lay_.val_off;
    w->val_stride = lay_.val_stride;
    w->leaves.clear();
    for (uint64_t x = root_->head; x; x = *Next(L(x))) w->leaves.push_back(x);
  }

  IndexStats Stats() override {
    IndexStats s;
    if (closed_) return s;
    s.records = Size();
    s.pm_bytes = pool_->allocator().BytesInUse();
    s.dram_bytes = dram_bytes_.load() + free_leaves_.capacity() * 8 + group_used_.size() * 48;
    // fptree's leaf version table: its resident pages (mincore), i.e. the
    // pages leaves have touched (about 8 bytes per 2^vshift_ bytes of the
    // pool's used range). Counting the whole range the pool's current size
    // covers instead overstated it by the unused part of the pool (13.55
    // vs 7.5 MiB of DRAM at 10M records in a 1 GiB pool).
    if (kConc && vtab_) s.dram_bytes += VtabResidentBytes();
    s.recovery_seconds = recovery_seconds_;
    return s;
  }

  Status Close() override {
    if (closed_) return Status::OK();
    closed_ = true;
    for (Inner* n : nodes_) {
      if constexpr (kBytes)
        for (uint32_t i = 0; i < n->count.load(std::memory_order_relaxed); i++) FreeKeyWord(n->keys()[i].load(std::memory_order_relaxed));
      std::free(n);
    }
    nodes_.clear();
    deferred_.clear();
    Status s = pool_ ? pool_->Close() : Status::OK();
    return s;
  }

  // ---- recovery (alg. 9) -----------------------------------------------------------------
  // Leaf versions (fptree; session 6). The paper's leaf lock byte is "never
  // persisted"; we keep each leaf's seqlock word (bit 0 locked, bit 1
  // obsolete, +4 per unlock) in a DRAM table instead of the leaf's trailer
  // line, so that a find touches no third PM line per leaf (line 0, the slot
  // line; the trailer was a miss in about 70% of self-similar finds in
  // callgrind's cache model with a 2 MiB last level) and a write's lock
  // CAS dirties no PM line. The word of the leaf at pool offset `off` is
  // vtab_[off >> vshift_], 2^vshift_ being the largest power of two <= the
  // leaf's size: two leaves that can be reached at the same time (neither
  // freed: a leaf is freed only after the epoch grace period that follows
  // its unlink) are at least a leaf size apart, so they never share a word.
  // A word is shared only over time, by leaves (or bytes) at the same index
  // one after the other; it never decreases (a split stores (old & ~3) + 4 | 1
  // into its new leaf's word, "born locked"), so a version read of an
  // earlier leaf there never validates against a later one. The reader
  // protocol is unchanged: descent, version (acquire), reads, validation.
  // The table reserves 8 bytes per 2^vshift_ bytes of the pool's reserved
  // address space (MAP_NORESERVE: pages are backed as leaves touch them,
  // about 8 bytes of DRAM per leaf). It is zero at open; recovery clears the
  // lock bits of every leaf's word (a split redone by recovery leaves its new
  // leaf born locked; pmcheck found this when the reset was first dropped).
  // The trailer's former lock word (byte 8 of the trailer) is no longer read
  // or written.
  uint64_t VtabResidentBytes() const {
    const size_t page = size_t(::sysconf(_SC_PAGESIZE));
    std::vector<unsigned char> in((vtab_bytes_ + page - 1) / page);
    if (::mincore(vtab_, vtab_bytes_, in.data()) != 0) return vtab_bytes_;  // cannot tell: all of it
    uint64_t n = 0;
    for (unsigned char c : in) n += c & 1;
    return n * page;
  }
  Status MapLeafVersions() {
    if (!kConc || vtab_) return Status::OK();
    vshift_ = 63 - __builtin_clzll(lay_.bytes);
    vtab_bytes_ = ((reserved_size_ >> vshift_) + 1) * 8;
    void* p = mmap(nullptr, vtab_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return Status::IOError("fptree: cannot map the leaf version table");
    vtab_ = static_cast<uint64_t*>(p);
    if (uintptr_t(base_) & ((uintptr_t(1) << vshift_) - 1)) return Status::Corrupt("fptree: pool base not aligned");
    vbias_ = uintptr_t(vtab_) - 8 * (uintptr_t(base_) >> vshift_);
    return Status::OK();
  }

  // ---- validation of the PM state recovery trusts (docs/fptree.md "Corrupt pools") ----
  // A word recovery follows to a leaf: 64-byte aligned, the whole leaf inside the pool.
  bool LeafOk(uint64_t x, uint64_t ps) const { return x && x % 64 == 0 && ps >= lay_.bytes && x <= ps - lay_.bytes; }
  bool LeafOk(uint64_t x) const { return LeafOk(x, pool_->size()); }
  Status LeafWord(const std::string& what, uint64_t x) const {
    if (LeafOk(x)) return Status::OK();
    return Bad(what + " = " + Num(x) + " is not a leaf offset (64-byte aligned, inside the " + Num(pool_->size()) + "-byte pool)");
  }
  // The leaf list from head, in order: every offset a leaf (LeafOk), at most
  // one leaf per leaf size of pool (a longer walk is a cycle), not empty.
  // Shared by Recover and Check.
  Status CollectLeaves(std::vector<uint64_t>* out) const {
    out->clear();
    const uint64_t ps = pool_->size(), bound = ps / lay_.bytes;
    uint64_t prev = 0;
    for (uint64_t x = root_->head; x; prev = x, x = *Next(L(x))) {
      if (!LeafOk(x, ps)) return LeafWord(prev ? "next pointer of the leaf at " + Num(prev) : std::string("root head"), x);
      if (out->size() >= bound) return Bad("leaf list has a cycle (more than " + Num(bound) + " leaves)");
      out->push_back(x);
    }
    if (out->empty()) return Bad("leaf list is empty (root head is 0)");
    return Status::OK();
  }
  // Split and delete micro-logs: every offset recovery dereferences is a
  // leaf; a split's leaves have no bitmap bit beyond the leaf size (the redo
  // reads the slots of the set bits).
  Status CheckLogs() const {
    const Root* r = root_;
    for (int i = 0; i < kLogs; i++) {
      const SplitLog& sl = r->split[i];
      const std::string sn = "split log " + Num(i);
      if (sl.cur && sl.nw) {
        PMINDEX_RETURN_IF_ERROR(LeafWord(sn + " cur", sl.cur));
        PMINDEX_RETURN_IF_ERROR(LeafWord(sn + " new", sl.nw));
        if (sl.cur == sl.nw) return Bad(sn + ": cur and new are the same leaf");
        // The new leaf's bitmap is read only if the cut was made (cur not
        // full); before the copy it may hold anything (a reused block).
        const uint64_t cb = *Bm(L(sl.cur));
        if ((cb & ~lay_.full) || ((cb & lay_.full) != lay_.full && (*Bm(L(sl.nw)) & ~lay_.full)))
          return Bad(sn + ": bitmap has bits beyond the leaf size");
      }
      const DeleteLog& dl = r->del[i];
      if (dl.cur) {
        PMINDEX_RETURN_IF_ERROR(LeafWord("delete log " + Num(i) + " cur", dl.cur));
        if (dl.prev) PMINDEX_RETURN_IF_ERROR(LeafWord("delete log " + Num(i) + " prev", dl.prev));
      }
    }
    return Status::OK();
  }
  // fptree_single's group list and group logs: every offset a whole group
  // inside the pool, the list without a cycle.
  bool GroupOk(uint64_t g) const {
    const uint64_t ps = pool_->size(), gb = GroupBytes();
    return g && g % 64 == 0 && ps >= gb && g <= ps - gb;
  }
  Status GroupWord(const std::string& what, uint64_t g) const {
    if (!g || GroupOk(g)) return Status::OK();
    return Bad(what + " = " + Num(g) + " is not a leaf group offset inside the pool");
  }
  Status CheckGroups() const {
    const Root* r = root_;
    PMINDEX_RETURN_IF_ERROR(GroupWord("get-leaf log", r->get_log.new_group));
    PMINDEX_RETURN_IF_ERROR(GroupWord("free-group log cur", r->free_log.cur));
    if (r->free_log.cur) PMINDEX_RETURN_IF_ERROR(GroupWord("free-group log prev", r->free_log.prev));
    PMINDEX_RETURN_IF_ERROR(GroupWord("root groups_tail", r->groups_tail));
    const uint64_t bound = pool_->size() / GroupBytes();
    uint64_t n = 0;
    for (uint64_t g = r->groups_head; g; g = *reinterpret_cast<uint64_t*>(L(g))) {
      PMINDEX_RETURN_IF_ERROR(GroupWord("group list entry", g));
      if (++n > bound) return Bad("leaf group list has a cycle");
    }
    return Status::OK();
  }
  // fptree_single: the group a listed leaf belongs to (it must be one of a
  // group's leaves), or group_used_.end().
  std::map<uint64_t, uint32_t>::iterator GroupOfChecked(uint64_t leaf) {
    auto it = group_used_.upper_bound(leaf);
    if (it == group_used_.begin()) return group_used_.end();
    --it;
    const uint64_t rel = leaf - it->first;
    if (rel < 64 || (rel - 64) % lay_.bytes || (rel - 64) / lay_.bytes >= group_size_) return group_used_.end();
    return it;
  }

  Status Recover() {
    PMINDEX_RETURN_IF_ERROR(MapLeafVersions());
    auto t0 = std::chrono::steady_clock::now();
    Root* r = root_;
    split_free_.store(~0ull);
    del_free_.store(~0ull);
    // Everything the log passes below dereference, before they store.
    PMINDEX_RETURN_IF_ERROR(CheckLogs());
    // Leaf groups: rebuild the DRAM map first (logs may need it).
    if (groups_) {
      PMINDEX_RETURN_IF_ERROR(CheckGroups());
      RecoverGetLog();
      FinishFreeGroup();  // alg. 13 (no-op if the log is clear)
      group_used_.clear();
      free_leaves_.clear();
      for (uint64_t g = r->groups_head; g; g = *reinterpret_cast<uint64_t*>(L(g))) group_used_[g] = 0;
    }
    // Split logs (alg. 4).
    for (int i = 0; i < kLogs; i++) {
      SplitLog* lg = &r->split[i];
      if (lg->cur == 0) {
        // nw is reset before cur (same line), so nw != 0 here only if the log
        // was never written properly (fault injection): reset, never free a
        // block that may already be linked.
        if (lg->nw) ResetSplitLog(lg);
        continue;
      }
      if (lg->nw == 0) {
        ResetSplitLog(lg);
        continue;
      }
      char* l = L(lg->cur);
      uint64_t upper = 0;
      if ((*Bm(l) & lay_.full) == lay_.full) {
        Rec sep;
        if (!ChooseSplit(l, &upper, &sep)) return Status::Corrupt("split recovery: unreadable key");
        SplitCopy(l, L(lg->nw), upper);
      } else {
        upper = *Bm(L(lg->nw));
      }
      SplitFinish(l, lg->nw, upper);
      ResetSplitLog(lg);
    }
    // Delete logs (alg. 7): every unlink first, then the frees.
    for (int i = 0; i < kLogs; i++) {
      DeleteLog* lg = &r->del[i];
      if (!lg->cur) continue;
      uint64_t nx = *Next(L(lg->cur));
      if (lg->prev == 0) {
        if (r->head == lg->cur) pm::StorePersist(&r->head, nx);
      } else if (*Next(L(lg->prev)) == lg->cur) {
        pm::StorePersist(Next(L(lg->prev)), nx);
      }
    }
    // Collect the leaf list.
    std::vector<uint64_t> leaves;
    PMINDEX_RETURN_IF_ERROR(CollectLeaves(&leaves));
    if (groups_) {
      for (uint64_t x : leaves) {
        auto it = GroupOfChecked(x);
        if (it == group_used_.end()) return Bad("listed leaf " + Num(x) + " is not a leaf of a listed group");
        it->second++;
      }
    }
    for (int i = 0; i < kLogs; i++) {
      DeleteLog* lg = &r->del[i];
      if (!lg->cur && !lg->prev) continue;
      if (groups_ && lg->cur) {
        pm::Store(&lg->cur, uint64_t(0));
      } else if (lg->cur) {
        pool_->allocator().Free(&lg->cur);
      }
      pm::Store(&lg->prev, uint64_t(0));
      pm::Persist(lg, 16);
    }
    // Per leaf (parallel): unlock the version word, leak checks (alg. 17 for keys
    // and values), min key, emptiness.
    size_t nl = leaves.size();
    std::vector<Rec> minkey(nl);
    std::vector<uint8_t> empty(nl, 0);
    std::vector<std::vector<std::pair<uint64_t*, bool>>> fixes(nl);  // (word, free?)
    // The per-leaf pass checks what it reads (range checks only, no extra
    // PM reads): the first problem found, by any thread, fails the open.
    std::mutex bad_mu;
    std::string bad;
    const uint64_t psize = pool_->size();
    auto fail = [&](size_t j, int i, const char* what) {
      std::lock_guard<std::mutex> g(bad_mu);
      if (bad.empty()) bad = "leaf at " + Num(leaves[j]) + (i >= 0 ? " slot " + Num(uint64_t(i)) : std::string()) + ": " + what;
    };
    // A block word recovery may free or a reader may follow: an 8-aligned
    // block header inside the pool (ReadBlock bounds the length at reads).
    auto block_ok = [psize](uint64_t w) { return w % 8 == 0 && psize >= 8 && w <= psize - 8; };
    auto work = [&](size_t from, size_t to) {
      for (size_t j = from; j < to; j++) {
        char* l = L(leaves[j]);
        // The table is zero at open, but a split redone above (SplitCopy)
        // left its new leaf's word "born locked": clear the lock bits (the
        // word keeps growing).
        if constexpr (kConc) __atomic_store_n(Ver(l), __atomic_load_n(Ver(l), __ATOMIC_RELAXED) & ~3ull, __ATOMIC_RELAXED);
        uint64_t bm = *Bm(l);
        if (bm & ~lay_.full) {
          fail(j, -1, "bitmap has bits beyond the leaf size");
          return;
        }
        empty[j] = bm == 0;
        bool first = true;
        for (uint64_t m = bm; m; m &= m - 1) {
          int i = __builtin_ctzll(m);
          Rec rr;
          if (!ReadSlotKey(l, i, &rr) || (kBytes && rr.ks.empty())) {
            fail(j, i, "key block offset or length out of range");
            return;
          }
          if (vbytes_ && (!*Val(l, i) || !block_ok(*Val(l, i)))) {
            fail(j, i, "value block offset out of range");
            return;
          }
          if (first || CmpRec(rr, minkey[j]) < 0) minkey[j] = std::move(rr);
          first = false;
        }
        if (!pointers_) continue;
        for (uint32_t i = 0; i < lay_.m; i++) {
          if (bm >> i & 1) continue;
          if ((kBytes && !block_ok(*Key(l, i))) || (vbytes_ && !block_ok(*Val(l, i)))) {
            fail(j, int(i), "block pointer of a free slot out of range");
            return;
          }
          if (kBytes && *Key(l, i)) {
            bool shared = false;
            for (uint64_t m = bm; m; m &= m - 1)
              if (*Key(l, __builtin_ctzll(m)) == *Key(l, i)) shared = true;
            fixes[j].push_back({Key(l, i), !shared});
          }
          if (vbytes_ && *Val(l, i)) {
            bool shared = false;
            for (uint64_t m = bm; m; m &= m - 1)
              if (*Val(l, __builtin_ctzll(m)) == *Val(l, i)) shared = true;
            fixes[j].push_back({Val(l, i), !shared});
          }
        }
      }
    };
    int threads = opts_.recovery_threads > 0 ? opts_.recovery_threads : int(std::thread::hardware_concurrency());
    threads = std::max(1, std::min(threads, 16));
    if (nl < 4096) threads = 1;
    if (threads == 1) {
      work(0, nl);
    } else {
      std::vector<std::thread> ts;
      size_t per = (nl + threads - 1) / threads;
      for (int t = 0; t < threads; t++) {
        size_t a = std::min(nl, t * per), b = std::min(nl, (t + 1) * per);
        if (a < b) ts.emplace_back(work, a, b);
      }
      for (auto& t : ts) t.join();
    }
    if (!bad.empty()) return Bad(bad);
    for (auto& fl : fixes)
      for (auto& [w, fr] : fl) {
        if (fr) pool_->allocator().Free(w);
        else pm::StorePersist(w, uint64_t(0));
      }
    if (pointers_) pm::Fence();
    // Drop empty leaves (keep at least one): deletions left for later or
    // interrupted ones.
    std::vector<uint64_t> keep;
    std::vector<Rec> keepmin;
    size_t nonempty = 0;
    for (size_t j = 0; j < nl; j++) nonempty += !empty[j];
    for (size_t j = 0; j < nl; j++) {
      bool drop = empty[j] && !(nonempty == 0 && keep.empty());
      if (!drop) {
        keep.push_back(leaves[j]);
        keepmin.push_back(std::move(minkey[j]));
        continue;
      }
      uint64_t prev = keep.empty() ? 0 : keep.back();
      DeleteLog* lg = &r->del[0];
      pm::Store(&lg->prev, prev);
      pm::Store(&lg->cur, leaves[j]);
      pm::Persist(lg, 16);
      uint64_t nx = *Next(L(leaves[j]));
      if (prev) pm::StorePersist(Next(L(prev)), nx);
      else pm::StorePersist(&r->head, nx);
      FinishDeleteLog(lg);
    }
    if (groups_) {
      // Free leaves: group members not in the list.
      std::vector<uint64_t> sorted = keep;
      std::sort(sorted.begin(), sorted.end());
      free_leaves_.clear();
      for (auto& [g, used] : group_used_) {
        for (uint32_t i = 0; i < group_size_; i++) {
          uint64_t leaf = g + 64 + uint64_t(i) * lay_.bytes;
          if (std::binary_search(sorted.begin(), sorted.end(), leaf)) continue;
          char* l = L(leaf);
          if (*Bm(l)) pm::StorePersist(Bm(l), uint64_t(0));
          free_leaves_.push_back(leaf);
        }
      }
    }
    // Rebuild the inner nodes (bulk load, ~75% full).
    BuildInner(keep, keepmin);
    recovery_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return Status::OK();
  }

  void BuildInner(const std::vector<uint64_t>& leaves, std::vector<Rec>& mins) {
    uint32_t fill = std::max<uint32_t>(1, inner_cap_ * 3 / 4);
    std::vector<uint64_t> level = leaves;
    std::vector<uint64_t> seps(leaves.size());  // seps[i]: lower bound of child i (i>0)
    for (size_t i = 1; i < leaves.size(); i++) {
      SKey sk;
      if constexpr (kBytes) sk.s = mins[i].ks;
      else sk.u = mins[i].k;
      seps[i] = KeyWordForInner(sk);
    }
    bool bottom = true;
    for (;;) {
      std::vector<uint64_t> up, upseps;
      size_t i = 0;
      while (i < level.size()) {
        Inner* n = NewInner(bottom);
        size_t take = std::min<size_t>(fill + 1, level.size() - i);
        // Avoid a last node with a single child when it can be balanced.
        if (level.size() - i - take == 1 && take > 2) take--;
        n->child()[0].store(level[i], std::memory_order_release);
        for (size_t j = 1; j < take; j++) {
          n->keys()[j - 1].store(seps[i + j], std::memory_order_relaxed);
          n->child()[j].store(level[i + j], std::memory_order_release);
        }
        n->count.store(uint32_t(take - 1), std::memory_order_relaxed);
        up.push_back(reinterpret_cast<uint64_t>(n));
        upseps.push_back(seps[i]);
        i += take;
      }
      bottom = false;
      if (up.size() == 1) {
        root_inner_.store(reinterpret_cast<Inner*>(up[0]), std::memory_order_release);
        return;
      }
      level = std::move(up);
      seps = std::move(upseps);
    }
  }

 private:
  std::unique_ptr<pm::Pool> pool_;
  Options opts_;
  char* base_ = nullptr;
  uint64_t* vtab_ = nullptr;  // fptree: leaf lock/version words (MapLeafVersions)
  size_t vtab_bytes_ = 0;
  uintptr_t vbias_ = 0;
  uint32_t vshift_ = 0;
  Root* root_ = nullptr;
  Layout lay_{};
  uint8_t variant_ = 0;
  bool groups_ = false, vbytes_ = false, inplace_ = false, pointers_ = false, closed_ = false;
  uint32_t max_key_ = 0, max_value_ = 0, inner_cap_ = 0, group_size_ = 0;
  // Bytes of an inner node's header + key array that a descent prefetches
  // (PrefetchInner; 0: the node is too wide to prefetch whole).
  uint32_t inner_pf_bytes_ = 0;
  static constexpr size_t kInnerPrefetchMax = 4096;
  std::atomic<Inner*> root_inner_{nullptr};
  std::mutex nodes_mu_;
  std::vector<Inner*> nodes_;  // live inner nodes (Inner::pos is the index)
  std::mutex deferred_mu_;
  std::vector<Deferred> deferred_;
  std::atomic<size_t> deferred_n_{0};
  std::atomic<uint64_t> dram_bytes_{0};
  EpochManager epoch_;  // fptree: guards of finds, scans and writers; leaf deletions wait for it
  // Bound of the scan's prefetch-only paths: the address space the pool
  // reserves (pools grow in place up to it; a prefetch past the mapped part
  // is harmless). Loads are bounded by the current size (InPool).
  uint64_t reserved_size_ = 0;
  mutable std::atomic<uint64_t> known_size_{0};  // a pool size seen by InPool (only grows)
  std::atomic<uint64_t> split_free_{~0ull}, del_free_{~0ull};
  std::vector<uint64_t> free_leaves_;
  std::map<uint64_t, uint32_t> group_used_;
  double recovery_seconds_ = 0;
};

// ---------------------------------------------------------------------------
// Factories.
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
  PMINDEX_RETURN_IF_ERROR(p.GetInt("group_size", 8, 1, 64, &group));
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

bool FPTreeHomeShare(Index* idx, uint64_t* at_home, uint64_t* records) {
  auto* t = dynamic_cast<FPTreeIntrospect*>(idx);
  if (!t) return false;
  t->HomeShare(at_home, records);
  return true;
}

void RegisterFPTree(std::vector<IndexFactory>* r) {
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
