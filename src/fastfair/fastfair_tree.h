// fastfair: the FAST & FAIR persistent B+-tree (Hwang et al., FAST'18;
// /work/shared/papers/fast-fair-fast18.md), index type "fastfair".
//
// Whole tree in PM. Every node (leaf and internal, `node_size` bytes, 512 by
// default as in sec. 6.2) is a header plus a sorted array of 16-byte records
// (k, v). Internal nodes: v is the child holding keys >= k, `leftmost` the
// child below the first key. Leaves: v is the value (inline u64, or the
// offset of an out-of-line value block); k is the u64 key or the offset of an
// out-of-line key block (byte keys, sec. 3.4 second option).
//
// The endurable transient inconsistency (sec. 3.2), mirrored: the paper
// ignores a key between two equal *pointers*, which needs every pointer to be
// unique. Leaf values are not unique (two keys may carry the same u64 value:
// the public wrapper lost records exactly that way), so here the unique word
// of a record is its KEY (u64 keys are unique in a node because Insert
// refuses an existing key; key-block offsets are unique allocations;
// separators are distinct split keys). A record whose k equals the k of its
// left neighbour (for slot 0: the node's `lk` word, chosen never to equal a
// key of the node) is ignored by every reader. The two slots past the end
// are kept ignored copies (invariant I2, see InsertAt). FAST insert (sec.
// 3.3): grow `count` (the new slot is an ignored copy; its line is
// persisted with the shift's last line: after a crash the durable count may
// lag by the one record the shift moved past it, which Pushed recognises:
// format versions 2 and 3), then shift right one record at a time: "k[j] =
// k[j-1]" flips validity from slot j to its copy at j+1 with ONE 8-byte
// store, then "v[j] = v[j-1]" fills the now-ignored
// slot; at the insertion point v is written while the slot is ignored and
// the final store of k is the commit. FAST delete (sec. 3.5) is the reverse:
// "k[pos] = k[pos-1]" is the commit, then "v[j] = v[j+1]; k[j] = k[j+1]"
// shifts left, then `count` shrinks (format 3: under the shift's last
// fence, the durable count may lag as for inserts). Deleting the last
// record makes the copy behind it and its own key copies of its left key,
// then shrinks `count` (format 3; formats 1-2: the count store alone). A
// valid record's
// v is never modified by a shift, so a reader that saw k, v, the left k and k
// again consistent has a record that existed. A cache line is flushed (and
// fenced) only when the shift is about to store into the next line, and the
// last dirty line at the end: in the pm model (a crash keeps a prefix of the
// stores of each line) every crash state has at most one ignored record
// besides a leaf's lk prefix.
//
// Windows (format 4, not in the paper): a leaf may start with free slots
// holding `lk` (the lk prefix: each equals its left neighbour, so the rule
// above ignores them; no new word). A split's new leaf sibling gets its
// records behind such a prefix (5/8 of its free slots; not when an append
// splits), and an insert into the left part of a leaf with a prefix moves
// the records before it one slot LEFT (InsertLeft: the delete shift's
// store pattern, readers scan right to left, `count` unchanged), so an
// insert shifts the shorter side. A leaf with no slot behind its records
// splits unless a short left shift reaches its prefix (the cut node keeps
// the prefix). docs/fastfair.md, "Windows".
//
// FAIR split (sec. 4.1), with fence keys: each node has `high` (exclusive
// upper bound, valid when `sibling` != 0) and `low`. Split: allocate the new
// sibling S into the node's `spare_node` word, copy the upper half, persist
// S, then in the node's first line store sibling/high (high first when the
// node was rightmost), cut `count` to the median and clear `spare_node`, one
// flush. The high key is what lets a delete or insert racing with a split
// move right correctly (the anchored "split racing with delete" pitfall:
// deciding by the sibling's first record is wrong once that record was
// deleted). The parent is updated afterwards by a traversal from the root
// (B-link); a new root is built and persisted in `spare_root`, then
// published by ONE 8-byte store of Meta::root (failure-atomic root
// replacement).
//
// FAIR merge (sec. 4.2), every key kind: a non-root node below cap/3 after a delete is merged with a sibling under
// the same parent if the result fits in 3/4 of a node (any fit if it is
// empty), in the reverse order of the split: a persistent limbo slot takes
// the right node r, its separator leaves the parent (the B-link state of a
// pending parent insert), r's records are appended invisibly past the left
// node's count, and line 0 of the left node commits count, high, sibling
// (in that order: the reverse of the split's). r is then marked dead and
// freed after an epoch grace period (lock-free readers may stand on it).
// Open settles the limbo slots: a merge whose commit did not persist is
// undone (the paper's "dangling sibling" recovery cannot tell a merge from
// a split), an unlinked node freed. Byte keys: a leaf merge leaves r's low
// key block (the separator) unreferenced; r->low keeps owning it and it is
// freed with r (after the grace period: internal readers read separator
// blocks lock-free, or at open). A root left with one child is replaced
// by it (one 8-byte store). If neither sibling fits, the paper's borrow is
// done as a split of the fuller sibling followed by a merge of the pair
// left small (Rebalance: two failure-atomic steps the tree has anyway; an
// in-place borrow would move two live fences at once). docs/fastfair.md,
// Merges.
//
// Concurrency (sec. 5): writers lock nodes with DRAM reader-writer spinlocks,
// one word per node (offset / node_size: no aliasing between nodes, the old
// hashed stripes could deadlock two concurrent splits), never persisted.
// Lock order: higher level first, then left to right within a level; a node
// not yet reachable may be locked any time; root_mu_ after node locks. A
// writer that locks a dead node restarts from the root. Every public
// operation runs in an epoch guard (deferred frees).
// Readers of u64-key/u64-value trees take no lock: they scan in the
// direction given by the node's switch counter `sw` (even: inserts, scan left
// to right; odd: deletes, right to left) and retry if `sw` changed; splits
// and merges add 2 to `sw`. Range scans emit a leaf only after a validated
// snapshot (sw, and the sibling link read before and after the records),
// and prefetch the leaves the parent lists after the first one (hints
// only: never dereferenced). Readers move right when key >= high (read
// high, sibling, high again), and a leaf reader that did not find its key
// checks the fence again after the scan: the sw check alone does not cover
// a split that completed, or was seen half done, after the first fence
// check (see SearchLeafLF). A record is read left key, key, value, left
// key, key (ReadValid: the left key must precede the value). Split locks
// the new sibling before linking it. With byte keys or byte values, out-of-line blocks are freed on
// delete/update, so leaf readers take the leaf's read lock (internal levels
// stay lock-free: a separator key block is freed only by a leaf merge,
// after the epoch grace period); `read_committed=1`
// (sec. 5.1) does the same for u64 trees.
//
// Lazy recovery (sec. 5.2): Open bumps Meta::gen and touches no node. The
// first writer to lock a node whose `gen` differs repairs it: finishes or
// undoes a split (spare_node), compacts ignored records, frees or clears the
// spare words, and a writer that moves right to a sibling makes sure that
// sibling is in its parent (idempotent parent insert).
//
// Block ownership (no leaks at any crash): every allocation goes into a
// persistent destination that owns it until it is published: spare_node
// (a new sibling), spare_a/spare_b (key/value blocks of an insert or update;
// blocks to be freed by a delete or update are parked there before the
// commit), Meta::spare_root (a new root). Repair frees a spare that no
// record references and clears one that is referenced.
#include "fastfair/fastfair.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "kit/backoff.h"
#include "kit/epoch.h"
#include "core/index_util.h"
#include "pmindex/pm/allocator.h"
#include "pmindex/pm/fault.h"
#include "pmindex/pm/persist.h"
#include "pmindex/pm/pool.h"

namespace pmindex::internal {
namespace {

constexpr uint64_t kMagic = 0x524941465453414Full;  // "OASTFAIR"-ish tag
// Format versions. 2: a node's durable `count` may lag its records by one
// after a crash (the insert shift does not fence the count; see InsertAt and
// Pushed), in insert mode only. 3: the delete shift's count shares its last
// fence too, and the removal of the last record stores the key before the
// count (so no state in either mode leaves a live-looking record past the
// durable count except the one a shift is moving: Pushed needs no mode).
// Pools of older versions are opened and written with their own protocol
// (1: counts fenced before/after the shifts; 2: as session 3's first one).
// 4: leaves may start with a run of free slots holding `lk` (the "lk
// prefix", ignored by the rule as it stands), new split siblings are
// centred, and an insert in the left part of a leaf shifts the records
// before it LEFT into the prefix (InsertLeft); Pushed's "no left key" case
// covers any slot whose left neighbour holds lk. Older builds would
// binary-search such a leaf from slot 0, hence the new version.
constexpr uint32_t kVersion = 4;
constexpr uint32_t kMinVersion = 1;
constexpr uint64_t kBytesLk = 1;  // lk of byte-key nodes: never a block offset

struct Meta {
  uint64_t magic;  // written and persisted last at creation
  uint32_t version;
  uint8_t key_kind, value_kind;
  uint16_t pad0;
  uint32_t node_size;
  uint32_t pad1;
  uint64_t gen;  // bumped at every open: nodes with another gen get repaired
  uint64_t reserved[4];
  // line 1
  uint64_t root;        // the 8-byte store that publishes a new root
  uint64_t spare_root;  // owns a new root until it is published
  uint64_t limbo;       // block of kLimboSlots LimboSlot: unlinked nodes awaiting free
  uint64_t reserved2[5];
};
static_assert(sizeof(Meta) == 128);

struct Entry {
  uint64_t k, v;
};

// Node header: line 0 holds everything a split or an insert commits
// together; line 1 the rarely written fields and the first two records.
struct Node {
  uint64_t sibling;     // right sibling (0: rightmost)
  uint64_t high;        // fence: keys >= high live right (valid if sibling)
  uint32_t count;       // records [0, count) are live (some maybe ignored)
  uint32_t level;       // 0 = leaf
  uint64_t sw;          // switch counter (scan direction), not needed durable
  uint64_t spare_node;  // owns a sibling under construction
  uint64_t spare_a;     // owns a key block / new value block in flight
  uint64_t spare_b;     // owns a value block in flight / block to free
  uint64_t gen;         // == Meta::gen once repaired in this run
  // line 1
  uint64_t low;       // lower fence (key or key-block offset; 0 for leftmost)
  uint64_t leftmost;  // internal: child below the first key
  uint64_t lk;        // "left key" of slot 0, never equal to a key here
  uint64_t dead;      // 1 once merged away (unlinked; writers that lock it restart)
  Entry* ents() { return reinterpret_cast<Entry*>(reinterpret_cast<char*>(this) + sizeof(Node)); }
};
static_assert(sizeof(Node) == 96);

template <typename T>
inline T Ld(const T* p) {
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
template <typename T>
inline void St(T* p, T v) {
  pm::StoreAtomic(p, v);
}

// Persistent limbo (Meta::limbo): a node unlinked by a merge (or an old root
// dropped by a root collapse) is owned by a slot {r, l} from before its
// unlink until it is freed after the epoch grace period. `l` names the node
// whose `sibling` still points at r while the merge is not committed (or
// kRootMark: Meta::root still points at r); 0 once the unlink is durable.
// Open (constant work: kLimboSlots words) undoes an uncommitted merge or
// frees the unlinked node.
struct LimboSlot {
  uint64_t r, l;
};
constexpr uint32_t kLimboSlots = 1024;
// Records per node at the largest node size (8192 bytes).
constexpr uint32_t kMaxCap = (8192 - sizeof(Node)) / sizeof(Entry);
constexpr uint64_t kRootMark = 1;
// Leaves a lock-free scan prefetches from the parent (DescendForScan).
constexpr uint32_t kScanHints = 16;
// A non-root node with fewer than cap / kMergeBelowDiv records (internal:
// keys) after a delete is underfull: merged with a neighbour, or rebalanced
// with one (docs/fastfair.md, Merges). Was cap / 4 with no rebalance.
constexpr uint32_t kMergeBelowDiv = 3;

// Per-node reader-writer spinlock words (DRAM, never persisted), one per
// node_size bytes of the pool's address range: distinct live nodes never
// share a word (they do not overlap, so their offsets / node_size differ).
constexpr uint32_t kWriter = 1u << 31;

// Epoch-based reclamation (kit/epoch.h), one manager per tree. Every public
// operation runs inside a guard; a node unlinked by a merge or a root
// collapse stays in its persistent limbo slot (retired_) until its grace
// period passed, then FreeLimboNode frees it. DRAM bookkeeping only: the
// limbo slots, their persist order and the PM format are as before.
using EpochGuard = EpochManager::Guard;
inline void Pause(int& spins) {
  if (++spins < 64) kit::CpuRelax();
  else std::this_thread::yield();
}

class FastFairBase : public Index {
 public:
  virtual fastfair::DebugCounters Debug() = 0;
  virtual int Cap() const = 0;
  virtual int TreeHeight() = 0;
  virtual Status Format() = 0;
  virtual Status Recover(Meta* m) = 0;
  fastfair::DebugCounters snapshot_;
  double recovery_seconds_ = 0;
  const fastfair::TestHooks* hooks_ = nullptr;  // tests only (SetTestHooks)
};

struct Pending {
  int n = 0;
  struct {
    uint32_t level;
    uint64_t child;
  } a[8];
  void Add(uint32_t level, uint64_t child) {
    for (int i = 0; i < n; i++)
      if (a[i].child == child) return;
    if (n < 8) a[n++] = {level, child};
  }
};

template <bool BK>
class FastFair final : public FastFairBase {
  using SK = std::conditional_t<BK, Slice, uint64_t>;

 public:
  FastFair(std::unique_ptr<pm::Pool> pool, const Options& o, uint32_t node_size, ValueKind vk, bool rc)
      : pool_(std::move(pool)), base_(pool_->base()), alloc_(&pool_->allocator()), opts_(o),
        node_size_(node_size), cap_((node_size - sizeof(Node)) / sizeof(Entry)),
        merge_below_(std::max<uint32_t>(1, cap_ / kMergeBelowDiv)), bv_(vk == ValueKind::kBytes),
        vk_(vk), locked_reads_(BK || vk == ValueKind::kBytes || rc) {
    lock_chunks_ = size_t(pool_->max_size() / node_size_ >> kLockChunkBits) + 1;
    max_off_ = pool_->max_size();
    walk_cap_.store(pool_->size() / node_size_ + 1, std::memory_order_relaxed);
    lock_dir_.reset(new std::atomic<std::atomic<uint32_t>*>[lock_chunks_]());
  }
  ~FastFair() override {
    Close();
    for (size_t i = 0; i < lock_chunks_; i++) delete[] lock_dir_[i].load();
  }

  // ---- creation / open -------------------------------------------------
  Status Format() override {
    uint64_t* slot = pool_->root_slot();
    PMINDEX_RETURN_IF_ERROR(alloc_->AllocateZeroed(slot, sizeof(Meta)));
    meta_ = pool_->At<Meta>(*slot);
    PMINDEX_RETURN_IF_ERROR(alloc_->AllocateZeroed(&meta_->root, node_size_));
    Node* r = At(meta_->root);
    if (BK) {
      St(&r->lk, kBytesLk);
      St(&r->ents()[0].k, kBytesLk);  // I2: slots 0 and 1 copy lk
      St(&r->ents()[1].k, kBytesLk);
      pm::Persist(&r->lk, 8);
      pm::Persist(&r->ents()[0], 2 * sizeof(Entry));
    }
    gen_ = 1;
    SetProtocol(kVersion);
    pm::Store(&meta_->version, kVersion);
    pm::Store(&meta_->key_kind, uint8_t(BK ? KeyKind::kBytes : KeyKind::kU64));
    pm::Store(&meta_->value_kind, uint8_t(vk_));
    pm::Store(&meta_->node_size, node_size_);
    pm::Store(&meta_->gen, gen_);
    // Root and metadata are durable before the magic, and the magic before
    // create returns (the anchored "not flushed at creation" pitfall).
    const bool skip = PMINDEX_FAULT("fastfair.create.skip_meta_flush");
    if (!skip) pm::Persist(meta_, sizeof(Meta));
    St(&meta_->magic, kMagic);
    if (!skip) pm::Persist(&meta_->magic, 8);
    return Status::OK();
  }

  Status Recover(Meta* m) override {
    meta_ = m;
    gen_ = m->gen;
    SetProtocol(m->version);
    read_only_ = pool_->read_only();
    if (pool_->read_only()) {
      // Open writes nothing: remember the merges whose commit did not
      // persist (constant work), so that Check, Size and ForEachOwnedBlock
      // give l the fence and count the read-write open would restore.
      if (m->limbo) {
        LimboSlot* ls = Limbo();
        for (uint32_t i = 0; i < kLimboSlots; i++)
          if (ls[i].r && ls[i].l != kRootMark && LimboLinked(ls[i])) ro_undo_.push_back(ls[i].l);
      }
      return Status::OK();
    }
    // O(1): bump the generation, settle the one spare root word. Nodes are
    // repaired lazily by the writers that lock them.
    const pm::Counters c0 = pm::ThreadCounters();
    gen_ = m->gen + 1;
    St(&m->gen, gen_);
    pm::Persist(&m->gen, 8);
    RecoverLimbo(m);
    if (m->spare_root) {
      if (m->spare_root == m->root) {
        St(&m->spare_root, uint64_t(0));
        pm::Persist(&m->spare_root, 8);
      } else {
        alloc_->Free(&m->spare_root);
        open_blocks_freed_++;
      }
    }
    const pm::Counters d = pm::ThreadCounters() - c0;
    open_pm_stores_ = d.stores;
    open_pm_lines_ = d.lines_flushed;
    return Status::OK();
  }

  // ---- Index interface -------------------------------------------------
  std::string_view Name() const override { return "fastfair"; }
  KeyKind key_kind() const override { return BK ? KeyKind::kBytes : KeyKind::kU64; }
  ValueKind value_kind() const override { return vk_; }
  pm::Pool* pool() override { return pool_.get(); }

  Status Insert(Slice key, Slice value) override { return Put(key, value, kInsert); }
  Status Update(Slice key, Slice value) override { return Put(key, value, kUpdate); }
  Status Upsert(Slice key, Slice value) override { return Put(key, value, kUpsert); }

  Status Find(Slice key, std::string* value) override {
    PMINDEX_RETURN_IF_ERROR(ValidateKey(key_kind(), opts_.max_key_size, key));
    EpochGuard eg(epoch_);
    const SK sk = MakeSK(key);
    Node* n = Descend(0, sk, nullptr);
    if (__builtin_expect(n == Bad(), 0)) return CorruptWalk("descent");
    uint64_t v = 0;
    if (!locked_reads_) {
      bool bad = false;
      if (!SearchLeafLF(n, sk, &v, &bad)) return bad ? CorruptWalk("move right") : Status::NotFound();
      if (value) value->assign(reinterpret_cast<const char*>(&v), 8);
      return Status::OK();
    }
    n = ReadLockLeaf(n, sk);
    if (n == Bad()) return CorruptWalk("leaf walk");
    uint32_t pos;
    bool found = FindInLocked(n, sk, &pos);
    if (found && value) {
      v = n->ents()[pos].v;
      if (bv_) value->assign(BlockSlice(v));
      else value->assign(reinterpret_cast<const char*>(&v), 8);
    }
    RUnlock(n);
    return found ? Status::OK() : Status::NotFound();
  }

  Status Remove(Slice key) override {
    PMINDEX_RETURN_IF_ERROR(Writable());
    PMINDEX_RETURN_IF_ERROR(ValidateKey(key_kind(), opts_.max_key_size, key));
    Status st;
    {
      EpochGuard eg(epoch_);
      st = RemoveIn(MakeSK(key));
    }
    // Outside the guard, so that this thread's own retired nodes can go.
    if (retired_count_.load(std::memory_order_relaxed)) Reclaim(false);
    return st;
  }

  Status RemoveIn(const SK& sk) {
    Pending pend;
    Node* n = nullptr;
    PMINDEX_RETURN_IF_ERROR(LockAt(0, sk, &pend, &n));
    uint32_t pos;
    Status st;
    if (!FindInLocked(n, sk, &pos)) {
      st = Status::NotFound();
    } else {
      Entry* e = n->ents();
      if (BK || bv_) {
        // Park the blocks in the spare words first: after the commit no
        // record owns them, the spares do until they are freed.
        if (BK) St(&n->spare_a, e[pos].k);
        if (bv_) St(&n->spare_b, e[pos].v);
        pm::Persist(&n->spare_a, 16);
      }
      DeleteAt(n, pos, true);
      if (BK) alloc_->Free(&n->spare_a);
      if (bv_) alloc_->Free(&n->spare_b);
      if (BK || bv_) pm::Fence();  // orders the allocator's flushed lane clear
    }
    // Merge trigger: a non-root node that fell below kMergeBelow of its
    // capacity (docs/fastfair.md, Merges).
    const bool underfull = st.ok() && Underfull(n) && Off(n) != Ld(&meta_->root);
    WUnlock(n);
    EnsurePending(pend);
    if (underfull) {
      for (Node* x = n; x;) x = MergeStep(x);
    }
    return st;
  }

  Status Scan(Slice start, size_t limit, ScanCallback cb, size_t* count) override {
    if (count) *count = 0;
    PMINDEX_RETURN_IF_ERROR(ValidateKey(key_kind(), opts_.max_key_size, start));
    if (limit == 0) return Status::OK();
    EpochGuard eg(epoch_);
    SK sk = MakeSK(start);
    size_t c = 0;
    if (!locked_reads_) {
      // Lock-free: snapshot each leaf (validated by the switch counter),
      // then call back outside the node.
      if constexpr (!BK) {
        // On the stack (a thread_local vector cost a __tls_get_addr call per
        // leaf: 3.7% of a pmbench scan profile).
        Entry buf[kMaxCap];
        // Records handed out so far are < lo; keys >= lo come next (u64:
        // the successor of the last key handed out, or the start key).
        uint64_t lo = sk;
        Node* n = DescendForScan(sk, limit);
        if (__builtin_expect(n == Bad(), 0)) return CorruptWalk("descent");
        for (uint64_t steps = 0; n && c < limit;) {
          // Every leaf goes through a validated snapshot before anything is
          // emitted. (Emitting records while scanning in insert mode, as
          // before, lost records: a delete that starts during the scan
          // flips sw and shifts records left past the reader, and the
          // records emitted already cannot be taken back, so the rescan
          // skipped the shifted ones as <= last. Found by
          // SplitsAndMergesWithReadersAndScans, with and without merges.)
          uint32_t nbuf;
          uint64_t left;  // the snapshot's lk: slot 0 is ignored if equal
          Node* next = SnapshotLeafLF(n, buf, &nbuf, &left);
          // Filter and emit in one pass: skip ignored records (equal to
          // their left neighbour) and keys below lo.
          for (uint32_t i = 0; i < nbuf; i++) {
            const uint64_t k = buf[i].k;
            const bool skip = k == left || k < lo;
            left = k;
            if (skip) continue;
            ++c;
            if (!cb(U64Slice(buf[i].k), U64Slice(buf[i].v)) || c >= limit || k == UINT64_MAX) {
              if (count) *count = c;
              return Status::OK();
            }
            lo = k + 1;
          }
          if (__builtin_expect(WalkTooLong(++steps), 0)) {
            if (count) *count = c;
            return CorruptWalk("leaf chain");
          }
          n = next;
        }
      }
      if (count) *count = c;
      return Status::OK();
    }
    Node* n = ReadLockLeaf(Descend(0, sk, nullptr), sk);
    if (n == Bad()) return CorruptWalk("descent");
    std::vector<std::pair<std::string, std::string>> buf;
    bool emitted = false;  // the last key handed out, across leaves
    uint64_t last_emitted = 0;  // (u64 keys)
    std::string last_key;       // (byte keys)
    std::string restart_key;    // (byte keys) sk's storage after a restart
    bool excl = false;          // skip keys <= sk (restart after last_key)
    for (uint64_t steps = 0; c < limit;) {
      buf.clear();
      Entry* e = n->ents();
      const uint32_t cnt = LiveCount(n);
      for (uint32_t j = 0; j < cnt && buf.size() < limit - c; j++) {
        if (Ignored(n, j)) continue;
        const int c0 = Cmp(e[j].k, sk);
        if (c0 < 0 || (excl && c0 == 0)) continue;
        std::string ks = BK ? std::string(BlockSlice(e[j].k)) : std::string(reinterpret_cast<const char*>(&e[j].k), 8);
        std::string vs = bv_ ? std::string(BlockSlice(e[j].v)) : std::string(reinterpret_cast<const char*>(&e[j].v), 8);
        buf.emplace_back(std::move(ks), std::move(vs));
      }
      uint64_t next = n->sibling;
      RUnlock(n);
      for (auto& [k, v] : buf) {
        ++c;
        emitted = true;
        if constexpr (!BK) last_emitted = SliceToU64(k);
        else last_key = k;
        if (!cb(k, v)) {
          if (count) *count = c;
          return Status::OK();
        }
      }
      if (!next || c >= limit) break;
      // Leaves visited, restarts included: each leaf once, and a restart
      // (on a distinct dead leaf) revisits at most one: <= 2x the nodes.
      if (WalkTooLong(++steps / 2)) {
        if (count) *count = c;
        return CorruptWalk("leaf chain");
      }
      n = At(next);
      RLock(n);
      if (Ld(&n->dead)) {
        // Merged into its left sibling since we read the link: continue
        // strictly after the last key handed out by ANY leaf so far (u64:
        // from its successor; byte keys have no successor word, so from the
        // key itself, exclusive)
        // (the leaf just read may have been empty: restarting from its last
        // key, or from the start key, returned records twice and out of
        // order; found by review with read_committed=1).
        RUnlock(n);
        if (emitted) {
          if constexpr (!BK) {
            if (last_emitted == UINT64_MAX) break;
            sk = last_emitted + 1;
          } else {
            restart_key = last_key;
            sk = Slice(restart_key);
            excl = true;
          }
        }
        n = ReadLockLeaf(Descend(0, sk, nullptr), sk);
        if (n == Bad()) {
          if (count) *count = c;
          return CorruptWalk("descent");
        }
      }
    }
    if (count) *count = c;
    return Status::OK();
  }

  uint64_t Size() override {
    EpochGuard eg(epoch_);  // walks nodes a concurrent merge may retire
    uint64_t total = 0;
    // Each leaf under its read lock, as the locked scan reads it: LiveCount
    // reads the links, the high key and keys with plain loads (written for
    // quiescent or locked callers) and compares byte keys, whose blocks a
    // delete frees at once. Unlocked, a Size() (or Stats()) concurrent with
    // writers was a data race: TSan reported those plain loads against the
    // writers' St stores, and key-block reads against AllocBlock reusing a
    // freed block (session 7 review, test now conformance_concurrency_test
    // SizeDuringSplitsAndDeletions). A count taken while writers run is
    // approximate; a quiescent one is exact. On a corrupt pool whose leaf
    // chain cannot be walked (no leftmost leaf, a cycle: WalkTooLong) it
    // is 0: Size() has no error channel, Check() reports the corruption.
    Node* n = LeftmostAt(0);
    if (n == Bad()) return 0;
    for (uint64_t steps = 0; n;) {
      if (WalkTooLong(++steps)) return 0;
      RLock(n);
      const uint32_t c = LiveCount(n);
      for (uint32_t j = 0; j < c; j++) total += !Ignored(n, j);
      Node* next = At(n->sibling);
      RUnlock(n);
      n = next;
    }
    return total;
  }

  Status Check() override;
  Status ForEachOwnedBlock(const std::function<void(uint64_t)>& fn) override;

  IndexStats Stats() override {
    IndexStats s;
    s.records = Size();
    s.pm_bytes = alloc_->BytesInUse();
    s.dram_bytes = sizeof(*this) + touched_lock_bytes_estimate();
    s.recovery_seconds = recovery_seconds_;
    return s;
  }

  Status Close() override {
    if (pool_) {
      if (retired_count_.load()) Reclaim(true);  // nobody is in the tree any more
      Status s = pool_->Close();
      pool_.reset();
      return s;
    }
    return Status::OK();
  }

  fastfair::DebugCounters Debug() override {
    fastfair::DebugCounters d;
    d.open_blocks_freed = open_blocks_freed_;
    d.open_pm_stores = open_pm_stores_;
    d.open_pm_lines = open_pm_lines_;
    d.nodes_repaired = nodes_repaired_.load();
    d.splits_finished_by_repair = splits_repaired_.load();
    d.counts_repaired = counts_repaired_.load();
    d.parent_links_repaired = parents_repaired_.load();
    d.root_grows = root_grows_.load();
    d.merges = merges_.load();
    d.root_collapses = root_collapses_.load();
    d.nodes_freed = nodes_freed_.load();
    d.merges_skipped = merges_skipped_.load();
    d.rebalances = rebalances_.load();
    d.rebalances_from_right = rebalances_from_right_.load();
    d.left_inserts = left_inserts_.load();
    d.prefix_drops = prefix_drops_.load();
    d.prefix_splits = prefix_splits_.load();
    return d;
  }
  int Cap() const override { return int(cap_); }
  int TreeHeight() override {
    EpochGuard eg(epoch_);
    return int(At(Ld(&meta_->root))->level) + 1;
  }

 private:
  enum Mode { kInsert, kUpdate, kUpsert };
  size_t touched_lock_bytes_estimate() const {
    size_t n = lock_chunks_ * sizeof(void*);
    for (size_t i = 0; i < lock_chunks_; i++)
      if (lock_dir_[i].load(std::memory_order_relaxed)) n += sizeof(uint32_t) << kLockChunkBits;
    return n;
  }

  Node* At(uint64_t off) const { return off ? reinterpret_cast<Node*>(base_ + off) : nullptr; }
  uint64_t Off(const void* p) const { return uint64_t(static_cast<const char*>(p) - base_); }

  // ---- walk bounds (corrupt pools; docs/fastfair.md, Bad input) ---------
  // In a healthy tree a walk never comes back to a node: levels strictly
  // decrease on a descent (a node's level is fixed at its creation, a
  // child is one level below its parent), links go right in key order
  // (splits and merges, dead nodes included, keep that), and no node is
  // freed, so none reused, while the walker's epoch guard is open. So a
  // descent with its moves right, a leaf chain, or a run of restarts on
  // dead nodes (each a node merged away, still allocated) visits at most
  // as many nodes as the pool holds, concurrent splits and merges
  // included. A walk longer than that went round a cycle of a corrupt pool
  // (a sibling link back, a child pointer to an ancestor): it ends with
  // Corrupt instead of spinning. The fast path is an increment and a
  // compare with walk_cap_, the pool's node capacity at open; the pool
  // grows in place, so past it the current size decides (cold).
  __attribute__((always_inline)) bool WalkTooLong(uint64_t steps) const {
    return __builtin_expect(steps > walk_cap_.load(std::memory_order_relaxed), 0) && WalkTooLongSlow(steps);
  }
  __attribute__((noinline, cold)) bool WalkTooLongSlow(uint64_t steps) const {
    const uint64_t cap = pool_->size() / node_size_ + 1;
    uint64_t old = walk_cap_.load(std::memory_order_relaxed);
    while (old < cap && !walk_cap_.compare_exchange_weak(old, cap, std::memory_order_relaxed)) {
    }
    return steps > cap;
  }
  // What a walk returns when it found the pool corrupt: the pool's first
  // byte (offset 0 is the pool header, never a node; At(0) is nullptr).
  Node* Bad() const { return reinterpret_cast<Node*>(base_); }
  __attribute__((noinline, cold)) static Status CorruptWalk(const char* what) {
    return Status::Corrupt(std::string("fastfair: ") + what + " (a cycle of node links, or a child on the wrong level)");
  }

  Status Writable() const {
    return pool_->read_only() ? Status::Unsupported("fastfair opened read-only") : Status::OK();
  }

  // ---- keys ------------------------------------------------------------
  Slice BlockSlice(uint64_t off) const {
    const char* p = base_ + off;
    uint32_t len;
    std::memcpy(&len, p, 4);
    return Slice(p + 4, len);
  }
  static SK MakeSK(Slice key) {
    if constexpr (BK) return key;
    else return SliceToU64(key);
  }
  SK KeyOf(uint64_t kw) const {
    if constexpr (BK) return BlockSlice(kw);
    else return kw;
  }
  // Compares a stored key word with a search key.
  int Cmp(uint64_t kw, const SK& key) const {
    if constexpr (BK) {
      Slice a = BlockSlice(kw);
      size_t n = std::min(a.size(), key.size());
      int c = n ? std::memcmp(a.data(), key.data(), n) : 0;
      if (c) return c;
      return a.size() < key.size() ? -1 : (a.size() > key.size() ? 1 : 0);
    } else {
      return kw < key ? -1 : (kw > key ? 1 : 0);
    }
  }
  // A record is ignored when its key word equals its left neighbour's.
  bool Ignored(Node* n, uint32_t j) const {
    Entry* e = n->ents();
    uint64_t left = j ? Ld(&e[j - 1].k) : Ld(&n->lk);
    return Ld(&e[j].k) == left;
  }
  // ---- the lk prefix (format 4, leaves) ----------------------------------
  // A leaf may begin with a run of free slots [0, s) whose keys hold lk:
  // each equals its left neighbour (slot 0: lk itself), so the rule ignores
  // them with no new word, lock-free readers included. In a repaired,
  // locked node these are the only ignored slots, so the prefix is exactly
  // the slots equal to lk at the front (no key of the node equals lk, and
  // an ignored slot equals its left neighbour): a binary search finds s.
  uint32_t Start(Node* n) const {
    if (!window_ || n->level) return 0;
    Entry* e = n->ents();
    const uint64_t lk = n->lk;
    const uint32_t c = n->count;
    if (c == 0 || e[0].k != lk) return 0;
    uint32_t lo = 1, hi = c;
    while (lo < hi) {
      const uint32_t mid = (lo + hi) / 2;
      if (e[mid].k == lk) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }
  // Records of a write-locked repaired node (its prefix excluded).
  uint32_t Live(Node* n) const { return n->count - Start(n); }
  // An insert at pos must split n: no free slot behind the records, and no
  // lk prefix or one that only a long left shift (more than a third of the
  // node) would reach. Splitting then, rather than shifting far, is what
  // gives left halves room in front: the cut node keeps its prefix (Split
  // cuts in the middle of the records, not of the slots). Measured,
  // docs/fastfair.md "Windows".
  bool Full(Node* n, uint32_t pos) const {
    if (n->count < cap_) return false;
    const uint32_t s = Start(n);
    return s == 0 || pos - s > cap_ / 3;
  }
  // Removes the prefix of a write-locked repaired leaf (one left shift per
  // slot, the repair's compaction): before its lk changes (the prefix holds
  // the old lk) or when a merge needs the room. Rare.
  void DropPrefix(Node* n) {
    if (Start(n) == 0) return;
    prefix_drops_.fetch_add(1, std::memory_order_relaxed);
    while (Start(n) > 0) DeleteAt(n, 0, false);
  }

  // ---- the durable count may lag by one (format versions 2 and 3) ---------
  // An insert shift stores the grown `count` first (readers of the live tree
  // see it before any record moves) but does not fence it before the shift:
  // its line is flushed with the shift's last line, under the shift's final
  // fence. So after a crash the durable count of the node being inserted
  // into may still be the old one while the shift already moved the last
  // record R from slot c-1 into slot c = count (past the durable count).
  // Format 3 does the same for a delete shift: its shrunk count shares the
  // last line's fence, so the durable count may already exclude the last
  // record R, in slot c = count, not yet moved left. Pushed() recognises
  // exactly that slot: c >= 1, c < cap, k[c] differs from k[c-1] and from
  // lk, sorts above k[c-1] (unless c == 1 and slot 0 is ignored: no left
  // key, see Pushed), and lies below `high` (if there is a sibling).
  // Otherwise slot c is an ignored copy of its left neighbour (invariant I2, below), a
  // record of a split or merge window (at or above `high`), an append or a
  // last-record removal in flight (either outcome is allowed), and a
  // removal of the last record first turns the stale I2 copy behind it into
  // a copy of the new left key (see DeleteAt). Its value is durable whenever
  // it counts: v[c] = v[c-1] is stored before the store that makes slot c-1
  // ignored, in the same line or in a line flushed and fenced before it; a
  // delete never stores into slot count-1. Format 2 removed the last record
  // by the count store alone, which leaves it live-looking past the count:
  // there the rule also requires insert mode (`sw` even), and an insert
  // switching from delete mode fences its count (sw_guard_).
  // Invariant I2 (writers; format 2: durable whenever `sw` is durably
  // even): slots count and count+1 (those below cap) are ignored copies of
  // the left key of slot count (a format 2 removal of the last record
  // leaves slot count+1 stale); everything that grows a count re-makes I2
  // first (InsertAt: SetTail, persisted before the count store). An
  // insert that grows count to c+1 therefore finds slot c+1 durably an
  // ignored copy already: a crash that kept the new count but not the
  // shift is harmless, and Pushed never looks past slot c.
  // Only nodes not repaired since the open (gen != gen_), or any node of a
  // read-only open, may lag; writers repair a node (Repair counts R) before
  // they change it. A lock-free reader that decided MayLag before the
  // repair retries (the repair adds 2 to sw after its gen store), so no
  // reader keeps a result of the rule applied to a node a writer changed.
  void SetProtocol(uint32_t version) {
    lag_ok_ = version >= 2;
    sw_guard_ = version == 2;
    lazy_delete_count_ = version >= 3;
    window_ = version >= 4;
  }
  bool MayLag(Node* n) const { return lag_ok_ && (read_only_ || Ld(&n->gen) != gen_); }
  bool Pushed(Node* n, uint32_t c) const {
    // (Format 2 only: delete mode is excluded, its last-record removal
    // committed by the count store alone.)
    if (c == 0 || c >= cap_ || (sw_guard_ && (Ld(&n->sw) & 1))) return false;
    Entry* e = n->ents();
    const uint64_t k = Ld(&e[c].k), left = Ld(&e[c - 1].k), lk = Ld(&n->lk);
    // k == lk: an I2 copy of an empty node's lk (u64 lk may sort above the
    // key of an append in flight: slot 0 written, slot 1 still lk).
    if (k == left || k == lk || (BK && (k == kBytesLk || k >= pool_->size()))) return false;
    const SK key = KeyOf(k);
    // c == 1 with slot 0 ignored (k[0] == lk): there is no left key, and lk
    // is not a key (a u64 lk may sort anywhere, a byte-key lk is no block):
    // never compare with it. Slot 0 is ignored at a durable count of 1 only
    // while a shift is moving the one record R: an insert at slot 0 into a
    // one-record node (R copied into slot 1, then k[0] = lk) or, format 3, a
    // delete (or repair) of slot 0 of a two-record node (k[0] = lk, then
    // R moved left; the count of 1 may be durable before). R is live in
    // both. An append into an empty node stores slot 0 before slot 1 (one
    // line), and the removal of a one-record node makes slot 1 lk before
    // slot 0: slot 1 is then lk, refused above.
    // Format 4 (lk prefixes): slot c-1 may hold lk at any c (all slots
    // before it are the prefix): the same "no left key" case, e.g. a delete
    // of the first record of a two-record leaf behind a prefix, or an
    // insert before the one record of a leaf behind a prefix.
    const bool no_left = left == lk && (c == 1 || window_);
    if (!no_left && Cmp(left, key) >= 0) return false;
    const uint64_t h = Ld(&n->high);
    return !Ld(&n->sibling) || !h || Cmp(h, key) > 0;
  }
  // The number of slots a reader considers (lock-free or locked).
  uint32_t CountOf(Node* n) const { return CountLF(n, MayLag(n)); }
  // The same with MayLag(n) computed by the caller after it loaded sw (it
  // only turns false, when a writer repairs the node; the repair then
  // changes sw, so the caller's sw validation fails and it retries).
  uint32_t CountLF(Node* n, bool lag) const {
    const uint32_t c = Ld(&n->count);
    if (__builtin_expect(lag, 0)) return c + Pushed(n, c);
    return c;
  }
  // I2 for a write-locked node: slots count and count+1 (below cap) become
  // ignored copies of the left key of slot count; persisted if changed.
  void SetTail(Node* n) {
    Entry* e = n->ents();
    const uint32_t c = n->count;
    const uint64_t left = c ? e[c - 1].k : n->lk;
    const uint32_t end = std::min(c + 2, cap_);
    bool changed = false;
    for (uint32_t i = c; i < end; i++) {
      if (e[i].k == left) continue;
      St(&e[i].k, left);
      changed = true;
    }
    if (changed) pm::Persist(&e[c], (end - c) * sizeof(Entry));
  }

  // Lock-free read of record j whose key was loaded as k1: true with its
  // value if the record was valid while v was read. Loads: left key, key,
  // v, left key, key. The left key MUST be read before v: an insert shift
  // turns slot j into an ignored copy of its left neighbour A (k[j] = A),
  // rewrites v[j] (v_B -> v_A), and only then makes slot j valid by storing
  // into slot j-1. The old order (k, v, left, k) could read k = A, the old
  // v_B, then the new left key, and accept (A, v_B): a separator with the
  // child of the next separator (a descent too far right: a key reported
  // missing, even with read_committed) or a leaf key with its right
  // neighbour's value. Reading the left key first: if it is the new one,
  // v_A is visible (release/acquire); if it is still A the record is
  // ignored. The left key read after v catches a delete shift that
  // rewrites v[j+1] after making slot j+1 ignored; the key read after v
  // catches v rewritten after slot j was turned into a copy.
  __attribute__((always_inline)) bool ReadValid(Node* n, Entry* e, uint32_t j, uint64_t k1, uint64_t* v) const {
    const uint64_t p1 = j ? Ld(&e[j - 1].k) : Ld(&n->lk);
    if (p1 == k1 || Ld(&e[j].k) != k1) return false;
    const uint64_t vv = Ld(&e[j].v);
    const uint64_t p2 = j ? Ld(&e[j - 1].k) : Ld(&n->lk);
    if (p2 == k1 || Ld(&e[j].k) != k1) return false;
    *v = vv;
    return true;
  }

  // Records of n below its high key (quiescent or locked callers). Only a
  // split interrupted by a crash between link and cut leaves records >= high
  // (copies of the sibling's, ignored by every reader).
  // The fence a quiescent reader should apply: a split interrupted between
  // storing `sibling` and `high` leaves the old high, but the records from
  // the sibling's low key up are already the sibling's.
  // Likewise for a merge into n that a crash interrupted before its commit
  // line persisted, seen by a read-only open (which cannot undo it): the
  // appended records from r's low key up are r's.
  uint64_t EffectiveHigh(Node* n) const {
    if (n->sibling && (n->spare_node == n->sibling || UndoPending(n))) return At(n->sibling)->low;
    return n->high;
  }
  bool UndoPending(Node* n) const {
    return !ro_undo_.empty() && std::find(ro_undo_.begin(), ro_undo_.end(), Off(n)) != ro_undo_.end();
  }
  // The search key of a low fence word (0: below every key).
  SK LowKey(uint64_t low) const {
    if constexpr (BK) return low ? BlockSlice(low) : Slice();
    else return low;
  }
  uint32_t LiveCount(Node* n) const {
    const uint32_t c = CountOf(n);
    const uint64_t h = EffectiveHigh(n);
    if (!n->sibling || !h || c == 0) return c;
    Entry* e = n->ents();
    const SK high = KeyOf(h);
    if (!Ignored(n, c - 1) && Cmp(e[c - 1].k, high) < 0) return c;
    for (uint32_t j = 0; j < c; j++)
      if (!Ignored(n, j) && Cmp(e[j].k, high) >= 0) return j;
    return c;
  }

  Status AllocBlock(uint64_t* dest, Slice s) {
    PMINDEX_RETURN_IF_ERROR(alloc_->Allocate(dest, 4 + s.size()));
    char* p = base_ + Ld(dest);
    pm::Store(reinterpret_cast<uint32_t*>(p), uint32_t(s.size()));
    if (!s.empty()) pm::Copy(p + 4, s.data(), s.size());
    pm::Persist(p, 4 + s.size());
    return Status::OK();
  }

  // ---- locks -----------------------------------------------------------
  // The lock word of node n: word Off(n) / node_size of a two-level table
  // whose chunks (2^14 words, one per 2^14 node slots of address range)
  // are allocated on first use.
  std::atomic<uint32_t>& LockOf(const Node* n) const {
    const uint64_t i = Off(n) / node_size_;
    std::atomic<uint32_t>* c = lock_dir_[i >> kLockChunkBits].load(std::memory_order_acquire);
    if (__builtin_expect(c == nullptr, 0)) c = NewLockChunk(i >> kLockChunkBits);
    return c[i & ((uint64_t(1) << kLockChunkBits) - 1)];
  }
  std::atomic<uint32_t>* NewLockChunk(uint64_t ci) const {
    auto* fresh = new std::atomic<uint32_t>[size_t(1) << kLockChunkBits]();
    std::atomic<uint32_t>* expected = nullptr;
    if (lock_dir_[ci].compare_exchange_strong(expected, fresh, std::memory_order_acq_rel)) return fresh;
    delete[] fresh;
    return expected;
  }
  void WLock(Node* n) {
    auto& l = LockOf(n);
    int spins = 0;
    for (;;) {
      uint32_t z = 0;
      if (l.load(std::memory_order_relaxed) == 0 && l.compare_exchange_weak(z, kWriter, std::memory_order_acquire)) return;
      Pause(spins);
    }
  }
  void WUnlock(Node* n) { LockOf(n).fetch_sub(kWriter, std::memory_order_release); }
  void RLock(Node* n) {
    auto& l = LockOf(n);
    int spins = 0;
    for (;;) {
      if (!(l.fetch_add(1, std::memory_order_acquire) & kWriter)) return;
      l.fetch_sub(1, std::memory_order_relaxed);
      while (l.load(std::memory_order_relaxed) & kWriter) Pause(spins);
    }
  }
  void RUnlock(Node* n) { LockOf(n).fetch_sub(1, std::memory_order_release); }

  // ---- navigation --------------------------------------------------------
  // Reads the fence of n: true and *sib if key >= high (move right). Reads
  // high, sibling, high: a split stores sibling before high (or high before
  // sibling when n was rightmost), so equal highs with a sibling are a
  // consistent pair.
  bool MoveRight(Node* n, const SK& key, uint64_t* sib) const {
    for (;;) {
      uint64_t h1 = Ld(&n->high), s = Ld(&n->sibling), h2 = Ld(&n->high);
      if (!s) return false;
      if (h1 != h2) continue;
      if (h1 == 0) return false;  // cannot happen (a split stores high first when rightmost)
      if (Cmp(h1, key) > 0) return false;
      *sib = s;
      return true;
    }
  }

  // Lock-free child choice in an internal node: the child of the last valid
  // key <= key. A stale choice is always to the left of the right child, and
  // the B-link move right fixes it.
  // Returns nullptr after more moves right than the pool has nodes
  // (`steps` counts them across the descent: WalkTooLong).
  __attribute__((always_inline)) Node* NavChild(Node* n, const SK& key, Pending* pend, uint64_t& steps,
                                                Node** from = nullptr) {
    for (;;) {
      uint64_t s;
      if (MoveRight(n, key, &s)) {
        if (WalkTooLong(++steps)) return nullptr;
        if (pend) pend->Add(n->level, s);
        n = At(s);
        continue;
      }
      const uint64_t sw = Ld(&n->sw);
      Entry* e = n->ents();
      const bool lag = MayLag(n);
      const uint32_t cnt = CountLF(n, lag);
      const uint64_t lk = Ld(&n->lk);
      // Fast path: find the last key <= key, then validate only that record
      // (k, v, left k, k again). Anything unusual takes the careful path.
      int64_t cand = -1;
      if constexpr (BK) {
        for (uint32_t j = 0; j < cnt; j++) {
          uint64_t k1 = Ld(&e[j].k);
          if (k1 == lk || k1 == kBytesLk) {
            if (j == 0) continue;
            cand = -2;  // an ignored slot in the middle: careful path
            break;
          }
          if (Cmp(k1, key) > 0) break;
          cand = j;
        }
      } else {
        // u64 keys: the slots are ascending (an ignored copy equals its left
        // neighbour), so the candidate is the slot before the first key >
        // key; no test for lk per key (session 6: 5 instructions per key
        // instead of 9). Slots holding lk: internal nodes have no prefix,
        // so only slot 0 (an insert or a delete at slot 0 in flight; lk is
        // never a key, so a slot j > 0 holding it has lk in every slot
        // before it). If lk > key the scan stops there and takes the
        // leftmost child (always safe: a choice to the left is fixed by
        // the move right); if lk <= key the candidate is validated below
        // like any other, and slot 0 holding lk fails ReadValid (careful
        // path). Safety does not rest on the order: whatever the view, the
        // child taken is that of a record validated with a key <= key, or
        // the leftmost one (both at or left of the right child).
        uint32_t j = 0;
        while (j < cnt && Ld(&e[j].k) <= key) j++;
        cand = int64_t(j) - 1;
      }
      uint64_t child = Ld(&n->leftmost);
      if (cand >= 0) {
        uint64_t k1 = Ld(&e[cand].k);
        uint64_t v;
        if (ReadValid(n, e, uint32_t(cand), k1, &v) && Cmp(k1, key) <= 0) child = v;
        else cand = -2;
      }
      if (cand == -2) {
        child = Ld(&n->leftmost);
        for (uint32_t i = 0; i < CountLF(n, lag); i++) {
          uint64_t k1 = Ld(&e[i].k);
          uint64_t p = i ? Ld(&e[i - 1].k) : Ld(&n->lk);
          if (k1 == p || (BK && k1 == kBytesLk)) continue;
          if (Cmp(k1, key) > 0) break;
          uint64_t v;
          if (ReadValid(n, e, i, k1, &v)) child = v;
        }
      }
      // Fetch every line of the child now: its header (line 0) is what the
      // next level waits for (78% of a lock-free find's own time sat on that
      // load in a pmbench read profile), and the record lines its search
      // walks then arrive in parallel instead of one after the other.
      if (child) PrefetchNode(At(child));
      if (Ld(&n->sw) != sw) continue;
      if (from) *from = n;
      return At(child);
    }
  }
  void PrefetchNode(const Node* n) const {
    const char* p = reinterpret_cast<const char*>(n);
    if (node_size_ == 512) {  // the default: 8 instructions instead of a loop of 32
      for (int o = 0; o < 512; o += 64) __builtin_prefetch(p + o);
      return;
    }
    const char* const end = p + node_size_;
    do {
      __builtin_prefetch(p);
      p += 64;
    } while (p < end);
  }

  // Descends to the node of `level` whose range should hold key (without
  // locking; the caller moves right under its lock). nullptr if the tree
  // is not that high; Bad() on a corrupt pool (a child not one level below
  // its parent, a cycle of moves right).
  Node* Descend(uint32_t level, const SK& key, Pending* pend) {
    Node* n = At(Ld(&meta_->root));
    uint32_t lv = n->level;
    if (lv < level) return nullptr;
    uint64_t steps = 0;
    while (lv > level) {
      n = NavChild(n, key, pend, steps);
      if (__builtin_expect(!n || n->level != --lv, 0)) return Bad();
    }
    return n;
  }

  // Descend(0, key) for a lock-free scan of `limit` records. The scan
  // walks the leaf chain, and each leaf's header is a dependent load (its
  // address is the previous leaf's sibling word): with the next leaf
  // prefetched only once the current one is reached, 79% of the scan's own
  // samples sat on that load (perf, fastfair_interleave). So the leaves the
  // level-1 node lists after the chosen one are prefetched now, all at
  // once (their first two lines: header and first records; the snapshot
  // prefetches the rest of the next leaf). The parent's words are read
  // with acquire loads but used as prefetch addresses only: a stale or
  // torn word costs a useless prefetch (prefetches never fault).
  Node* DescendForScan(const SK& key, size_t limit) {
    Node* n = At(Ld(&meta_->root));
    uint64_t steps = 0;
    for (uint32_t lv = n->level; lv > 0; lv--) {
      Node* from = n;
      Node* c = NavChild(n, key, nullptr, steps, &from);
      if (__builtin_expect(!c || c->level != lv - 1, 0)) return Bad();
      if (from->level == 1) {
        Entry* e = from->ents();
        const uint32_t cnt = std::min(Ld(&from->count), cap_);
        const uint64_t co = Off(c);
        uint32_t j = 0;
        if (Ld(&from->leftmost) != co) {
          while (j < cnt && Ld(&e[j].v) != co) j++;
          j++;
        }
        // Leaves needed at a fill of a third (the merge threshold keeps
        // most leaves above it), at most kScanHints.
        const uint32_t want = std::min<size_t>(kScanHints, limit / std::max<uint32_t>(1, cap_ / 3) + 1);
        for (uint32_t h = 0; j < cnt && h < want; j++, h++) {
          const uint64_t v = Ld(&e[j].v);
          if (v && v < max_off_) {  // (no pointer past the mapping)
            const char* p = base_ + v;
            __builtin_prefetch(p);
            __builtin_prefetch(p + 64);
          }
        }
      }
      n = c;
    }
    return n;
  }

  // nullptr if the tree is not that high, Bad() on a corrupt pool.
  Node* LeftmostAt(uint32_t level) {
    Node* n = At(Ld(&meta_->root));
    uint32_t lv = n->level;
    if (lv < level) return nullptr;
    while (lv > level) {
      n = At(Ld(&n->leftmost));
      if (!n || n->level != --lv) return Bad();
    }
    return n;
  }

  // Write-locks the node of `level` covering key, repairing it if needed.
  // grow=false: *out = nullptr if the tree is not that high.
  Status LockAt(uint32_t level, const SK& key, Pending* pend, Node** out, bool grow = true) {
    for (uint64_t restarts = 0;;) {
      Node* n = Descend(level, key, pend);
      if (__builtin_expect(n == Bad(), 0)) return CorruptWalk("descent");
      if (!n) {
        if (!grow) {
          *out = nullptr;
          return Status::OK();
        }
        PMINDEX_RETURN_IF_ERROR(GrowRoot(level));
        continue;
      }
      WLock(n);
      for (uint64_t steps = 0;;) {
        // A node merged away while we waited (or reached through a stale
        // link): restart from the root (epochs keep its memory valid).
        if (Ld(&n->dead)) {
          WUnlock(n);
          if (WalkTooLong(++restarts)) return CorruptWalk("restarts on dead nodes");
          n = nullptr;
          break;
        }
        Prepare(n, pend);
        uint64_t s = n->sibling;
        if (s && Cmp(n->high, key) <= 0) {
          if (WalkTooLong(++steps)) {
            WUnlock(n);
            return CorruptWalk("move right");
          }
          pend->Add(level, s);
          WUnlock(n);
          n = At(s);
          WLock(n);
          continue;
        }
        *out = n;
        return Status::OK();
      }
    }
  }

  // Bad() (nothing locked) on a corrupt pool, or if n is Bad().
  Node* ReadLockLeaf(Node* n, const SK& key) {
    if (__builtin_expect(n == Bad(), 0)) return n;
    RLock(n);
    // Restarts (each on a distinct node merged away) and the moves right
    // of one attempt are bounded separately (WalkTooLong).
    for (uint64_t restarts = 0, steps = 0;;) {
      if (Ld(&n->dead)) {
        RUnlock(n);
        n = Descend(0, key, nullptr);
        if (n == Bad() || WalkTooLong(++restarts)) return Bad();
        steps = 0;
        RLock(n);
        continue;
      }
      // (high == 0 with a sibling: only a read-only open after a crash that
      // kept count and high of a merge's commit line but not the sibling,
      // r being rightmost; n holds r's records then. As in MoveRight.)
      uint64_t s = n->sibling;
      if (s && n->high && Cmp(n->high, key) <= 0) {
        RUnlock(n);
        if (WalkTooLong(++steps)) return Bad();
        n = At(s);
        RLock(n);
        continue;
      }
      return n;
    }
  }

  // Under a lock (read or write): position of key (found) or of the first
  // larger record. Ignored records (crash leftovers seen by a reader) are
  // skipped.
  bool FindInLocked(Node* n, const SK& key, uint32_t* pos) const {
    Entry* e = n->ents();
    const uint32_t cnt = CountOf(n);
    if (n->gen == gen_ && !read_only_) {
      // Repaired and write-locked (or read-locked: a repaired node is only
      // changed under its write lock): no ignored records, binary search.
      // Not in a read-only open: there gen_ is Meta::gen, and a node
      // repaired in the run that crashed can hold a half-done shift.
      // (Format 4: from the end of the lk prefix, see Start.)
      uint32_t lo = Start(n), hi = cnt;
      while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (Cmp(e[mid].k, key) < 0) lo = mid + 1;
        else hi = mid;
      }
      *pos = lo;
      return lo < cnt && Cmp(e[lo].k, key) == 0;
    }
    for (uint32_t j = 0; j < cnt; j++) {
      if (Ignored(n, j)) continue;
      int c = Cmp(e[j].k, key);
      if (c >= 0) {
        *pos = j;
        return c == 0;
      }
    }
    *pos = cnt;
    return false;
  }

  // Lock-free leaf search (u64 keys and values), Algorithm 3 with the
  // mirrored validity rule. Returns with the value of key, or false (and
  // *bad set if the moves right went round a cycle: WalkTooLong).
  bool SearchLeafLF(Node* n, const SK& key, uint64_t* out, bool* bad) {
    for (uint64_t steps = 0;;) {
      uint64_t s;
      if (MoveRight(n, key, &s)) {
        if (WalkTooLong(++steps)) {
          *bad = true;
          return false;
        }
        n = At(s);
        continue;
      }
      const uint64_t sw = Ld(&n->sw);
      Entry* e = n->ents();
      const bool lag = MayLag(n);
      bool found = false;
      uint64_t val = 0;
      if (!(sw & 1)) {
        // Byte keys (locked callers only): a slot equal to the key loaded
        // in the previous step is skipped (that is only a filter; a match
        // is confirmed with fresh loads, ReadValid). u64 keys (session 6,
        // the same answers as the former test of each key against the
        // previous one, with fewer instructions on the common path): a
        // key below `key` is passed, a slot holding lk (the
        // prefix, or slot 0 ignored in flight; a u64 lk may sort above key)
        // is passed, any other larger key ends the scan. An ignored slot
        // other than lk equals the key just read before it, which did not
        // end the scan, so it is below key (passed) or a copy of key, which
        // ReadValid refuses (the scan goes on to the record itself). The
        // count is re-read per slot: an insert shift moves the last record
        // past the count it had when the scan began.
        uint64_t prev = Ld(&n->lk);
        const uint64_t lk = prev;
        const fastfair::TestHooks* const hooks = hooks_;
        if (__builtin_expect(hooks != nullptr, 0) && hooks->lf_forward_start) hooks->lf_forward_start(n);
        for (uint32_t j = 0; j < CountLF(n, lag); j++) {
          uint64_t k1 = Ld(&e[j].k);
          if (__builtin_expect(hooks != nullptr, 0) && hooks->lf_forward_key) hooks->lf_forward_key(n, j);
          if constexpr (BK) {
            const bool dup = k1 == prev;
            prev = k1;
            if (dup) continue;  // (locked: a real ignored record)
          } else {
            if (k1 < key) continue;
            if (k1 != key) {
              if (k1 == lk) continue;  // (a u64 lk may sort above key)
              break;
            }
          }
          int c = Cmp(k1, key);
          if (c == 0) {
            uint64_t v;
            if (ReadValid(n, e, uint32_t(j), k1, &v)) {
              found = true;
              val = v;
              break;
            }
          } else if (c > 0) {
            break;
          }
        }
        // lk is loaded once, before the scan: an insert of a key equal to
        // lk (FixLk raises lk to a free value, with no shift and so no sw
        // flip when the leaf has no prefix, then the right shift stores
        // k[0] = the new lk before its commit) can show slot 0 holding a
        // new lk above key, which the loop above took for a larger key and
        // stopped at, with sw unchanged: Find(3) in {1, 2, 3, 5} while 0 is
        // inserted answered NotFound (found by review, session 6; the code
        // before the session 6 descent change had it too). FixLk's release
        // store of lk precedes that k[0] store, so a reader that saw it
        // sees the new lk here, and scans again.
        if (!found && Ld(&n->lk) != lk) continue;
      } else {
        for (int64_t j = int64_t(CountLF(n, lag)) - 1; j >= 0; j--) {
          uint64_t k1 = Ld(&e[j].k);
          uint64_t p = j ? Ld(&e[j - 1].k) : Ld(&n->lk);
          if (k1 == p) continue;
          int c = Cmp(k1, key);
          if (c == 0) {
            uint64_t v;
            if (ReadValid(n, e, uint32_t(j), k1, &v)) {
              found = true;
              val = v;
              break;
            }
          } else if (c < 0) {
            break;
          }
        }
      }
      if (Ld(&n->sw) != sw) continue;
      if (found) {
        *out = val;
        return true;
      }
      // Fence re-check before answering "not found". The check at the top
      // ran before sw was loaded, and a split bumps sw only after its cut
      // (sibling/high, then count, then sw, all release stores), so a split
      // can complete between that check and the sw load, or be seen half
      // done (count cut, or slot m made an ignored copy, with sw not yet
      // bumped): the scan then misses the upper half and sw validates. Every
      // split store a scan can observe comes after the split's stores of
      // sibling and high, so these later acquire loads see the new fence,
      // and key >= high sends the reader right. (Found once in CI as a
      // never-touched key reported missing by SplitRacingWithDelete.)
      if (MoveRight(n, key, &s)) {
        if (WalkTooLong(++steps)) {
          *bad = true;
          return false;
        }
        n = At(s);
        continue;
      }
      return false;
    }
  }

  // Lock-free snapshot of the record slots of leaf n, in order; returns the
  // next leaf. One pass copies count, lk and every
  // (k, v); a second pass re-reads every key, count, lk, sw and the link,
  // and the snapshot is taken only if nothing changed. Why that suffices
  // (instead of validating each record with five loads, ReadValid):
  // writers hold the node's lock, so one operation at a time changes it.
  // A right insert grows count and a delete shrinks it; a delete leaves sw
  // odd and a right insert (append included) after it makes sw even, so
  // count back at its old value with sw unchanged would need no delete and
  // no right insert in between; splits and merges add 2 to sw, FixLk
  // changes lk, a repair adds 2 to sw. What remains with count, sw and lk
  // equal in both passes are format 4 left inserts (InsertLeft changes
  // neither count nor sw once sw is odd), any number of them: each stores
  // into a slot's key word only a key above the one it replaces (a moved
  // record's key over the ignored copy of its left neighbour, or over lk
  // in the prefix; the new key over the copy of the record before it), and
  // lk is written back only by deletes and right inserts; byte-key blocks
  // are freed only by deletes. So no key word returns to an earlier value
  // (no ABA), within one shift or across several. Equal keys in both
  // passes therefore mean no key store hit
  // the node in between, and a value read in the first pass belongs to the
  // record its key names: a value rewritten by a shift is rewritten while
  // the slot is ignored, and making it valid again stores a key (in the
  // slot or its left neighbour) after the value (release), which the
  // second pass sees. Values changed by an update are the record's own.
  // The link is loaded before AND after the records, and must not change:
  // a split stores sibling before it cuts count (a new count read implies
  // the new link after it), a merge grows count before it stores sibling
  // (a new link read before implies the grown count). Reading it only
  // after the records, a scan could take the old count of a merge's left
  // node and its new link, and skip the merged node's records (found by
  // SplitsAndMergesWithReadersAndScans).
  // `snap` has room for cap_ records; *nout gets the number of slots
  // copied, *lk_out the lk they go with (the caller skips ignored records:
  // equal to their left neighbour, slot 0's being lk).
  Node* SnapshotLeafLF(Node* n, Entry* snap, uint32_t* nout, uint64_t* lk_out) {
    Entry* e = n->ents();
    for (;;) {
      const uint64_t sw = Ld(&n->sw);
      const uint64_t next1 = Ld(&n->sibling);
      if (next1) PrefetchNode(At(next1));  // the scan goes on there next
      const uint64_t lk = Ld(&n->lk);
      const bool lag = MayLag(n);
      const uint32_t c = std::min(CountLF(n, lag), cap_);
      for (uint32_t j = 0; j < c; j++) {
        snap[j].k = Ld(&e[j].k);
        snap[j].v = Ld(&e[j].v);
      }
      // Second pass: any difference (no early exit: a branch-free OR of
      // the differences is cheaper than a test per key).
      uint64_t diff = (std::min(CountLF(n, lag), cap_) ^ c) | (Ld(&n->lk) ^ lk);
      for (uint32_t j = 0; j < c; j++) diff |= Ld(&e[j].k) ^ snap[j].k;
      const uint64_t next = Ld(&n->sibling);
      if (diff || next != next1 || Ld(&n->sw) != sw) continue;
      *nout = c;
      *lk_out = lk;
      return At(next);
    }
  }

  // ---- FAST in-node shifts (caller holds the node's write lock) ----------
  // Invariant I2 (see Pushed): slots count and count+1 are ignored copies
  // of the left key of slot count, so growing `count` reveals nothing and a
  // crash that kept a grown count but not the records is harmless. Only a
  // removal of the last record breaks it (in delete mode, `sw` odd, where
  // Pushed does not look); InsertAt restores it, durably, before it makes
  // `sw` even.
  void InsertAt(Node* n, uint32_t pos, uint64_t k, uint64_t v) {
    const uint32_t cnt = n->count;
    Entry* e = n->ents();
    if (window_ && n->level == 0) {
      // Format 4: shift the shorter side. Left when the leaf has a prefix
      // and fewer records lie before pos than after it (or no room behind).
      const uint32_t s = Start(n);
      if (s > 0 && (cnt == cap_ || pos - s < cnt - pos)) {
        InsertLeft(n, s, pos, k, v);
        left_inserts_.fetch_add(1, std::memory_order_relaxed);
        return;
      }
    }
    SetTail(n);
    // Back to insert mode: readers scan left to right. A switch from delete
    // mode must be durable before a record moves (Pushed trusts only an even
    // sw), so then the count line is fenced before the shift as in format 1.
    const bool flip = n->sw & 1;
    if (flip) St(&n->sw, n->sw + 1);
    const bool lag = lag_ok_ && !(flip && sw_guard_);
    const bool skip = PMINDEX_FAULT("fastfair.insert.skip_shift_flush");
    uintptr_t dirty = 0;
    bool count_unfenced = false;  // count flushed, no fence since
    // Flush the dirty line before the first store into another line.
    auto touch = [&](const void* p, bool shift) {
      const uintptr_t line = pm::LineOf(p);
      if (dirty && line != dirty && !(skip && shift)) {
        pm::Persist(reinterpret_cast<void*>(dirty), pm::kCacheLine);
        count_unfenced = false;
      }
      dirty = line;
    };
    if (pos == cnt) {
      // Append: fill the invisible slot and the two copies behind it (I2 for
      // the grown node; value before key in each slot), then `count`
      // commits; one fence for all. A crash may keep any of these lines:
      // count without the record shows slot cnt as the old ignored copy; the
      // record without count is Pushed (the insert in flight happened); count
      // and the copy at cnt+1 without slot cnt show (k, v) once, at cnt+1
      // (Pushed; slot cnt is an ignored copy); count and slot cnt without
      // the copy leave at cnt+1 the old copy, below k: not Pushed (the
      // "sorts above" condition). Format 1 never looks past count.
      const uint32_t end = std::min(cnt + 3, cap_);
      for (uint32_t i = cnt; i < end; i++) {
        St(&e[i].v, v);
        St(&e[i].k, k);
      }
      St(&n->count, cnt + 1);
      pm::Flush(&e[cnt], (end - cnt) * sizeof(Entry));
      pm::Persist(&n->count, 4);
      return;
    }
    // I2 for the grown node: slot cnt+1 is a copy already, slot cnt+2
    // becomes one (only the next insert relies on it, after our last fence).
    if (cnt + 2 < cap_) {
      St(&e[cnt + 2].k, e[cnt - 1].k);
      if (pm::LineOf(&e[cnt + 2]) != pm::LineOf(&e[cnt])) pm::Flush(&e[cnt + 2].k, 8);
    }
    St(&n->count, cnt + 1);
    if (!lag) {
      // Format 1, or a switch from delete mode: the grown count (and sw)
      // must be durable before the first store that makes the moved record
      // valid (k[cnt-1] below). Its line shares the fence of a line
      // crossing when slot cnt starts a line, else it is fenced before it.
      pm::Flush(&n->count, 4);
      count_unfenced = true;
    }
    touch(&e[cnt], true);
    St(&e[cnt].v, e[cnt - 1].v);  // complete the copy
    for (int64_t j = int64_t(cnt) - 1; j >= int64_t(pos); j--) {
      touch(&e[j], true);
      if (count_unfenced) {
        pm::Fence();
        count_unfenced = false;
      }
      St(&e[j].k, j ? e[j - 1].k : n->lk);  // slot j ignored, its copy at j+1 valid
      if (__builtin_expect(j == 0 && hooks_ != nullptr, 0) && hooks_->insert_slot0_ignored) hooks_->insert_slot0_ignored(n);
      if (j > int64_t(pos)) {
        St(&e[j].v, e[j - 1].v);
      } else {
        St(&e[j].v, v);
        St(&e[j].k, k);  // commit
      }
    }
    // Format 2: the count shares the final fence. Until then a crash may
    // keep the shift without the count: Pushed counts the record moved past
    // it (docs/fastfair.md, "The count's fence").
    if (lag) pm::Flush(&n->count, 4);
    pm::Persist(reinterpret_cast<void*>(dirty), pm::kCacheLine);
  }

  // Format 4: insert (k, v) before record pos of a leaf whose lk prefix is
  // [0, s), s > 0, by moving records s..pos-1 one slot LEFT (the delete
  // shift's pattern): for j = s..pos-1, "v[j-1] = v[j]" (slot j-1 is the
  // prefix's last slot or an ignored copy: invisible), then "k[j-1] = k[j]"
  // (ONE store: slot j-1 valid, slot j its ignored copy); then slot pos-1,
  // an ignored copy of its left neighbour, gets "v = new value" and
  // "k = new key" (the commit). Readers scan right to left (sw odd, the
  // delete direction: records move left, towards them). `count` does not
  // change, nothing at or past slot count-1 is stored unless count == cap
  // (where no count lags), so the count's rules (I2, Pushed) are untouched.
  // A line is flushed and fenced when the shift is about to store into the
  // next line, the last one (with sw's, if the mode flipped) at the end:
  // a crash keeps a prefix of the store sequence, i.e. the prefix grown by
  // one (the slot at s-1 got a value only), or one record moved with its
  // copy still in place (one ignored copy, compacted by the repair), or
  // the new record's value in the ignored slot: the insert did not happen
  // or did, nothing else. docs/fastfair.md, "Windows".
  void InsertLeft(Node* n, uint32_t s, uint32_t pos, uint64_t k, uint64_t v) {
    Entry* e = n->ents();
    const bool flip = !(n->sw & 1);
    if (flip) St(&n->sw, n->sw + 1);  // readers scan right to left
    const bool skip = PMINDEX_FAULT("fastfair.insert.skip_shift_flush");
    uintptr_t dirty = 0;
    auto touch = [&](const void* p) {
      const uintptr_t line = pm::LineOf(p);
      if (dirty && line != dirty && !skip) pm::Persist(reinterpret_cast<void*>(dirty), pm::kCacheLine);
      dirty = line;
    };
    for (uint32_t j = s; j < pos; j++) {
      touch(&e[j - 1]);
      St(&e[j - 1].v, e[j].v);
      if (__builtin_expect(hooks_ != nullptr, 0) && hooks_->insert_left_move) hooks_->insert_left_move(n, j);
      St(&e[j - 1].k, e[j].k);  // slot j-1 valid, slot j its ignored copy
    }
    touch(&e[pos - 1]);
    St(&e[pos - 1].v, v);
    St(&e[pos - 1].k, k);  // commit
    if (flip) pm::Flush(&n->sw, 8);
    pm::Persist(reinterpret_cast<void*>(dirty), pm::kCacheLine);
  }

  // Removes record pos. commit=false: the record is already ignored (repair).
  void DeleteAt(Node* n, uint32_t pos, bool commit) {
    const uint32_t cnt = n->count;
    Entry* e = n->ents();
    if (!(n->sw & 1)) St(&n->sw, n->sw + 1);  // delete mode: readers scan right to left
    const bool skip = PMINDEX_FAULT("fastfair.remove.skip_flush");
    if (commit && pos + 1 == cnt) {
      if (lazy_delete_count_) {
        // The last record (format 3): its key becomes an ignored copy (the
        // commit for readers of the live tree), then the count shrinks; one
        // fence for both lines. A crash that kept the count but not the key
        // shows the record past the count, where Pushed counts it again (the
        // removal in flight did not happen); one that kept the key but not
        // the count shows a trailing ignored copy. So no durable state has
        // a live-looking record past the count that is not the record a
        // shift is moving, whatever the mode (Pushed needs no sw test).
        // First the I2 copy behind it (slot pos+1 holds the removed key,
        // with the value it had when the copy was made): once slot pos
        // holds its left key, that stale copy would sort above it and look
        // like a record Pushed past the count (pmcheck found a removed key
        // back with an old value). It must be durable no later than slot
        // pos: the same line keeps the store order, another line is fenced.
        const uint64_t left = pos ? e[pos - 1].k : n->lk;
        if (pos + 1 < cap_ && e[pos + 1].k != left) {
          St(&e[pos + 1].k, left);
          if (pm::LineOf(&e[pos + 1]) != pm::LineOf(&e[pos])) pm::Persist(&e[pos + 1].k, 8);
        }
        St(&e[pos].k, left);
        St(&n->count, cnt - 1);
        pm::Flush(&e[pos].k, 8);
        pm::Persist(&n->count, 4);
        return;
      }
      // Formats 1 and 2: the count store alone commits (the slot keeps the
      // record, so InsertAt re-establishes I2 before growing count again).
      St(&n->count, cnt - 1);
      pm::Persist(&n->count, 4);
      return;
    }
    uintptr_t dirty = pm::LineOf(&e[pos]);
    if (commit) St(&e[pos].k, pos ? e[pos - 1].k : n->lk);  // commit: record pos ignored
    for (uint32_t j = pos; j + 1 < cnt; j++) {
      // Flush a line when the shift is about to dirty the next one.
      const uintptr_t line = pm::LineOf(&e[j]);
      if (line != dirty) {
        if (!skip) pm::Persist(reinterpret_cast<void*>(dirty), pm::kCacheLine);
        dirty = line;
      }
      St(&e[j].v, e[j + 1].v);
      St(&e[j].k, e[j + 1].k);  // slot j valid again, j+1 its ignored copy
    }
    const bool stored = commit || pos + 1 < cnt;  // the shift dirtied a line
    // Slot cnt-1 is now an ignored copy (I2 holds for the shrunk node if it
    // held before: slot cnt copied the same last key). The count must be
    // durable before a later operation changes slot cnt-2 (a stale durable
    // count would let that revive the copy in slot cnt-1), i.e. by our last
    // fence.
    if (lazy_delete_count_) {
      // Format 3: the count shares the last line's fence. A crash that kept
      // the count but not the whole last line leaves the last record R in
      // slot cnt-1, past the durable count, not yet moved: Pushed counts it
      // (its left neighbour is the record or ignored copy before it, below
      // R, and R is below high).
      St(&n->count, cnt - 1);
      if (!skip && stored) pm::Flush(reinterpret_cast<void*>(dirty), pm::kCacheLine);
      pm::Persist(&n->count, 4);
      return;
    }
    if (!skip && stored) pm::Persist(reinterpret_cast<void*>(dirty), pm::kCacheLine);
    St(&n->count, cnt - 1);
    pm::Persist(&n->count, 4);
  }

  // Chooses a new lk for n that equals none of its keys nor `k`.
  // Format 4: a leaf's lk prefix holds the old lk, so it is dropped first
  // (records move to slot 0: the caller's positions move by Start(n)).
  void FixLk(Node* n, uint64_t k) {
    DropPrefix(n);
    Entry* e = n->ents();
    for (uint64_t c = k + 1;; c++) {
      bool used = c == k;
      for (uint32_t j = 0; j < n->count && !used; j++) used = e[j].k == c;
      if (!used) {
        St(&n->lk, c);
        pm::Persist(&n->lk, 8);
        if (n->count == 0) SetTail(n);  // I2: slots 0 and 1 copy lk (Pushed never looks at count 0)
        return;
      }
    }
  }

  // ---- FAIR split ------------------------------------------------------
  // n is write-locked, full and repaired. On return n holds the lower half,
  // *out_s the upper half (not yet in the parent), *out_k its low key.
  // Format 4: the new sibling of a leaf gets its records behind an lk
  // prefix (free slots in front and behind), so that its inserts can shift
  // either side; not when the insert that splits is an append (pos ==
  // count): ascending loads never insert into a prefix, and with centred
  // siblings every leaf of such a load kept 3 of 10 records (the cut node
  // keeps its prefix) instead of half.
  Status Split(Node* n, uint64_t* out_k, Node** out_s, bool append = false) {
    const uint32_t s = Start(n);
    if (s) prefix_splits_.fetch_add(1, std::memory_order_relaxed);
    return SplitAt(n, s + (n->count - s) / 2, out_k, out_s, /*centre=*/!append);
  }
  // The same at record m (1 <= m, m + 1 < count): n keeps [0, m); a leaf's
  // sibling gets [m, count), an internal one [m + 1, count) with m's child
  // as its leftmost (the key of m moves up). Rebalance cuts elsewhere.
  Status SplitAt(Node* n, uint32_t m, uint64_t* out_k, Node** out_s, bool centre = false) {
    const uint32_t cnt = n->count;
    const bool leaf = n->level == 0;
    Entry* e = n->ents();
    uint64_t K = e[m].k;
    if (BK && leaf) {
      // The separator gets its own block (the record's block is freed when
      // the record is deleted); S owns it as its low key.
      PMINDEX_RETURN_IF_ERROR(AllocBlock(&n->spare_a, BlockSlice(K)));
      K = Ld(&n->spare_a);
    }
    Status st = alloc_->Allocate(&n->spare_node, node_size_);
    if (!st.ok()) {
      if (BK && leaf) alloc_->Free(&n->spare_a);
      return st;
    }
    const uint64_t soff = Ld(&n->spare_node);
    Node* s = At(soff);
    Node h{};
    h.sibling = n->sibling;
    h.high = n->high;
    const uint32_t moved = leaf ? cnt - m : cnt - m - 1;
    // The sibling's lk prefix: 5/8 of its free slots (front-heavy: its
    // left half keeps what is left of the prefix when it splits in turn).
    const uint32_t o = centre && leaf && window_ ? (cap_ - moved) * 5 / 8 : 0;
    h.count = o + moved;
    h.level = n->level;
    h.gen = gen_;
    h.low = K;
    h.leftmost = leaf ? 0 : e[m].v;
    h.lk = n->lk;
    // A centred u64 leaf gets lk = K - 1: it never holds a key below its low
    // key K (low never changes; merges bring keys from the right), so no
    // insert or merge will ever need FixLk on it, which would have to drop
    // the prefix first (the prefix holds lk). An inherited lk could be a
    // key of it (FixLk raises lk just above an inserted key: loading 0, 1,
    // 2, ... in order made every split's sibling drop its prefix).
    if (o && !BK) h.lk = K - 1;
    pm::Copy(s, &h, sizeof(Node));
    for (uint32_t i = 0; i < o; i++) {
      pm::Store(&s->ents()[i].v, uint64_t(0));
      pm::Store(&s->ents()[i].k, h.lk);
    }
    if (moved) pm::Copy(s->ents() + o, leaf ? &e[m] : &e[m + 1], moved * sizeof(Entry));
    size_t slen = sizeof(Node) + h.count * sizeof(Entry);
    for (uint32_t i = h.count; i < h.count + 2 && i < cap_; i++) {  // I2
      pm::Store(&s->ents()[i].k, h.count ? s->ents()[h.count - 1].k : h.lk);
      slen += sizeof(Entry);
    }
    const bool early_link = PMINDEX_FAULT("fastfair.split.link_before_persist");
    if (!early_link) pm::Persist(s, slen);
    // S is write-locked BEFORE the link makes it reachable (nobody else can
    // hold its lock word: lock words are per node, and a freed node's word
    // is free once its grace period passed); the caller inserts into it and unlocks
    // it (UnlockNew). Locking it only after Split returned, as before, let
    // another writer move right into S and insert there while the splitter
    // computed its position unlocked: the splitter then inserted at a stale
    // position (TSan report in SplitRacingWithDeleteLong).
    WLock(s);
    // Link and cut: all in line 0 of n, one flush.
    if (n->sibling == 0) {
      St(&n->high, K);
      St(&n->sibling, soff);
    } else {
      St(&n->sibling, soff);
      St(&n->high, K);
    }
    St(&n->count, m);
    St(&n->sw, n->sw + 2);
    St(&n->spare_node, uint64_t(0));
    if (BK && leaf) St(&n->spare_a, uint64_t(0));
    pm::Persist(n, pm::kCacheLine);
    // I2 for the cut node (slots m and m+1 are past the durable count now;
    // until this persists, slot m holds the median, at n's new high: not
    // taken for a record Pushed past the count).
    St(&e[m].k, e[m - 1].k);
    St(&e[m + 1].k, e[m - 1].k);
    pm::Persist(&e[m], 2 * sizeof(Entry));
    if (early_link) pm::Persist(s, slen);
    *out_k = K;
    *out_s = s;
    return Status::OK();
  }

  // Releases the lock Split took on the new sibling s (if any).
  void UnlockNew(Node* n, Node* s) {
    if (s) WUnlock(s);
  }

  Status GrowRoot(uint32_t level) {
    std::lock_guard<std::mutex> g(root_mu_);
    for (;;) {
      Node* r = At(meta_->root);
      if (r->level >= level) return Status::OK();
      PMINDEX_RETURN_IF_ERROR(alloc_->Allocate(&meta_->spare_root, node_size_));
      Node* nr = At(Ld(&meta_->spare_root));
      Node h{};
      h.level = r->level + 1;
      h.leftmost = Off(r);
      h.lk = BK ? kBytesLk : 0;
      h.gen = gen_;
      pm::Copy(nr, &h, sizeof(Node));
      pm::Store(&nr->ents()[0].k, h.lk);  // I2
      pm::Store(&nr->ents()[1].k, h.lk);
      pm::Persist(nr, sizeof(Node) + 2 * sizeof(Entry));
      // The new root is durable; one 8-byte store publishes it.
      St(&meta_->root, Off(nr));
      St(&meta_->spare_root, uint64_t(0));
      pm::Persist(&meta_->root, 16);
      root_grows_++;
    }
  }

  // ---- FAIR merge (sec. 4.2), reverse order of the split ------------------
  // Trigger: a non-root node with fewer than cap/3 records (internal: keys)
  // after a delete. It is merged with its left (or, failing that, right)
  // sibling under the same parent if the result holds at most 3/4 of the
  // capacity (the whole capacity if the node is empty): a merged node is
  // never on the edge of a split again (no split/merge thrashing). If
  // neither fits, it is rebalanced with one (Rebalance), if both halves end
  // at or above the threshold (docs/fastfair.md).
  bool Underfull(Node* n) const { return Live(n) < merge_below_; }

  LimboSlot* Limbo() const { return reinterpret_cast<LimboSlot*>(base_ + meta_->limbo); }

  // A free limbo slot (reclaiming first), or -1: the merge is skipped.
  int ClaimSlot() {
    if (retired_count_.load(std::memory_order_relaxed)) Reclaim(false);
    std::lock_guard<std::mutex> g(limbo_mu_);
    if (!meta_->limbo) {
      if (!alloc_->AllocateZeroed(&meta_->limbo, kLimboSlots * sizeof(LimboSlot)).ok()) return -1;
      pm::Fence();  // orders the allocator's flushed lane clear (the merge may be skipped)
    }
    for (uint32_t i = 0; i < kLimboSlots; i++) {
      if (!limbo_busy_[i]) {
        limbo_busy_[i] = true;
        return int(i);
      }
    }
    return -1;
  }
  void ReleaseSlot(int i) {
    std::lock_guard<std::mutex> g(limbo_mu_);
    limbo_busy_[i] = false;
  }
  // The node in slot i is unlinked (durably); free it after the grace period.
  // (The retire list stamps it at the next Reclaim, under limbo_mu_.)
  void Retire(int i) {
    std::lock_guard<std::mutex> g(limbo_mu_);
    retired_.Add(uint32_t(i));
    retired_count_.fetch_add(1, std::memory_order_relaxed);
  }
  // Frees retired nodes whose grace period has passed (all of them if
  // `all`: no thread is in the tree any more).
  void Reclaim(bool all) {
    std::lock_guard<std::mutex> g(limbo_mu_);
    LimboSlot* ls = Limbo();
    auto free_one = [&](uint32_t i) {
      FreeLimboNode(&ls[i]);
      nodes_freed_++;
      limbo_busy_[i] = false;
      retired_count_.fetch_sub(1, std::memory_order_relaxed);
    };
    const size_t freed = all ? retired_.ReclaimAll(free_one) : retired_.Reclaim(epoch_, free_one);
    if (freed) pm::Fence();  // orders the allocator's flushed lane clears
  }

  // One merge attempt for underfull x (any level). Returns x's parent if
  // that became underfull in turn (the caller continues with it).
  Node* MergeStep(Node* x) {
    const uint32_t level = x->level;
    const uint64_t xlow = Ld(&x->low);
    const int slot = ClaimSlot();
    if (slot < 0) {
      merges_skipped_++;
      return nullptr;
    }
    Pending pend;
    Node* p = nullptr;
    Node* next = nullptr;
    bool used = false;
    if (LockAt(level + 1, LowKey(xlow), &pend, &p, /*grow=*/false).ok() && p) {
      used = MergeUnder(p, x, xlow, slot, &pend);
      if (used && p->count == 0 && Off(p) == Ld(&meta_->root)) {
        CollapseRoot(p);
      } else if (used && Underfull(p) && Off(p) != Ld(&meta_->root)) {
        next = p;
      }
      WUnlock(p);
    }
    if (used) Retire(slot);
    else ReleaseSlot(slot);
    EnsurePending(pend);
    return next;
  }

  // p write-locked: merges x with a neighbour under p if x is still a child
  // of p, still underfull, and the pair fits. Locks: p, then l, then r
  // (level by level from the top, left to right within a level).
  bool MergeUnder(Node* p, Node* x, uint64_t xlow, int slot, Pending* pend) {
    Entry* pe = p->ents();
    int64_t j;
    uint32_t pos;
    if (p->leftmost == Off(x)) j = -1;
    else if (xlow && FindInLocked(p, KeyOf(xlow), &pos) && pe[pos].v == Off(x)) j = pos;
    else return false;  // not (or no longer) listed here
    // A merge with either neighbour first; failing that, a rebalance.
    for (const bool rebalance : {false, true}) {
      for (int64_t sep : {j, j + 1}) {  // r = child of record sep
        if (sep < 0 || sep >= int64_t(p->count)) continue;
        Node* l = At(sep == 0 ? p->leftmost : pe[sep - 1].v);
        Node* r = At(pe[sep].v);
        WLock(l);
        Prepare(l, pend);
        WLock(r);
        Prepare(r, pend);
        const uint32_t total = Live(l) + Live(r) + (l->level ? 1 : 0);
        const uint32_t limit = Live(x) == 0 ? cap_ : cap_ * 3 / 4;
        const bool pair = l->sibling == Off(r) && r->low == pe[sep].k && l->level + 1 == p->level &&
                          r->level == l->level && Underfull(x);
        bool done = false;
        if (pair && !rebalance && total <= limit) {
          DoMerge(p, uint32_t(sep), l, r, slot);
          done = true;
        } else if (pair && rebalance && total > limit) {
          done = Rebalance(p, uint32_t(sep), l, r, slot);
        }
        WUnlock(r);
        WUnlock(l);
        if (done) return true;
      }
    }
    return false;
  }

  // Rebalance (the paper's borrow, sec. 4.2) of siblings l and r under p
  // (p, l, r write-locked and repaired; r is p's record sep), too full
  // together to merge, so that both end with about half of their records
  // and neither is underfull. Built from the two failure-atomic steps the
  // tree already has, in this order: (1) a split of the fuller one at the
  // balancing point (SplitAt: the new node s is linked, and its separator
  // inserted into p here, under p's lock; p has room, checked first); (2) a
  // merge (DoMerge: limbo slot, separator out of p, records appended, one
  // commit line) of the pair that is now small: r into s if l gave, r into
  // l if r gave. Between the steps, and at every crash point inside them,
  // the tree is a valid B-link tree with nothing lost (a crash after (1)
  // leaves one more node; inside (2) open undoes or completes the merge as
  // for any merge). Records only move right in (1) and (2) moves a whole
  // node left, as a merge does, so readers need nothing new. The paper's
  // borrow shifts records from a live node into its neighbour and changes
  // both fences in place, which our fence keys (readers pair high with
  // sibling) would need a new protocol for. Costs one split and one merge
  // (about 12-15 fences, an allocation, a deferred free), so it is done
  // only when both halves end at or above the threshold. False (nothing
  // changed) if it does not apply or the pool is full.
  bool Rebalance(Node* p, uint32_t sep, Node* l, Node* r, int slot) {
    const bool leaf = l->level == 0;
    // (Format 4: counted without the lk prefixes; the cut m is a slot.)
    const uint32_t ls = Start(l), rs = Start(r);
    const uint32_t lc = l->count - ls, rc = r->count - rs;
    const uint32_t t = (lc + rc) / 2;  // l's share (internal: keys; p keeps one)
    if (t < merge_below_ || lc + rc - t < merge_below_ || p->count >= cap_) return false;
    Node* donor;
    uint32_t m;
    uint32_t ds;
    if (lc > t) {
      donor = l;  // l keeps [0, t)
      m = t;
      ds = ls;
    } else {
      donor = r;  // l gets r's first m records (internal: the separator and m keys)
      if (leaf) m = t - lc;
      else if (t >= lc + 1) m = t - lc - 1;
      else return false;
      ds = rs;
    }
    if (m < 1 || ds + m + 1 >= donor->count) return false;
    m += ds;
    uint64_t K;
    Node* s;
    if (!SplitAt(donor, m, &K, &s).ok()) return false;
    // (K, s) into p, which covers both (the parent insert of the split,
    // done here under p's lock instead of from the root).
    uint32_t pos;
    FindInLocked(p, KeyOf(K), &pos);
    if (!BK && K == p->lk) FixLk(p, K);
    InsertAt(p, pos, K, Off(s));
    if (donor == l) DoMerge(p, pos + 1, s, r, slot);  // (K, s) is record sep, r's record follows it
    else DoMerge(p, sep, l, r, slot);                  // (K, s) follows r's record
    WUnlock(s);
    rebalances_++;
    if (donor == r) rebalances_from_right_++;
    return true;
  }

  // Merges r into its left sibling l (p, l, r write-locked and repaired),
  // the split in reverse: (1) the limbo slot takes r, (2) the separator
  // leaves the parent (r is now reached through l's fence only: the state
  // of a split whose parent insert is pending), (3) r's records (internal:
  // the separator with r's leftmost child first) are appended past l's
  // count, invisible, and persisted, (4) line 0 of l: count, high, sibling
  // (readers that pair the new high with the old sibling still move right
  // to r, intact), one flush: the commit, (5) r is marked dead and the slot
  // records the unlink. Open undoes a merge whose step 4 did not persist.
  void DoMerge(Node* p, uint32_t sep, Node* l, Node* r, int slot) {
    const uint64_t K = p->ents()[sep].k;
    LimboSlot* ls = Limbo() + slot;
    // Fault: the slot claims r is unlinked already; open frees a linked node.
    const bool fault = PMINDEX_FAULT("fastfair.merge.free_before_unlink");
    // l before r: a slot is in use iff r != 0, and a crash may keep any
    // prefix of the stores to this line (a cache line can be written back
    // before its flush): r without l would read as "unlinked" and open
    // would free a node still in the tree (found by pmcheck).
    St(&ls->l, fault ? uint64_t(0) : Off(l));
    St(&ls->r, Off(r));
    pm::Persist(ls, sizeof(LimboSlot));
    DeleteAt(p, sep, true);
    // On the stack: a thread_local buffer was refilled by any merge that
    // ran while this one waited in a fence (the crash tests verify each
    // image from the fence callback, whose repairs merge in another tree:
    // r's records were replaced by that tree's, found once the merge
    // threshold changed).
    Entry add[kMaxCap + 1];
    uint32_t n = 0;
    if (l->level) add[n++] = {K, r->leftmost};
    for (uint32_t j = Start(r); j < r->count; j++) add[n++] = r->ents()[j];  // (not r's lk prefix)
    // Format 4: the records go behind l's count; if l's lk prefix leaves
    // too little room there (the fit is counted without prefixes), l's
    // records move to the front first (rare).
    if (l->count + n > cap_) DropPrefix(l);
    // (l's lk prefix holds l's lk: dropped before lk changes.)
    for (uint32_t i = 0; i < n; i++)
      if (add[i].k == l->lk) DropPrefix(l);
    Entry* le = l->ents();
    const uint32_t lc = l->count;
    // l's lk must stay unequal to every key of l.
    bool clash = false;
    for (uint32_t i = 0; i < n; i++) clash |= add[i].k == l->lk;
    if (clash) {
      for (uint64_t c = l->lk + 1;; c++) {
        bool used = false;
        for (uint32_t j = 0; j < lc && !used; j++) used = le[j].k == c;
        for (uint32_t i = 0; i < n; i++) used |= add[i].k == c;
        if (!used) {
          St(&l->lk, c);
          pm::Persist(&l->lk, 8);
          break;
        }
      }
    }
    size_t len = 0;
    if (n) {
      for (uint32_t i = 0; i < n; i++) {
        St(&le[lc + i].v, add[i].v);
        St(&le[lc + i].k, add[i].k);
      }
      len = n * sizeof(Entry);
      for (uint32_t i = lc + n; i < lc + n + 2 && i < cap_; i++) {  // I2
        St(&le[i].k, add[n - 1].k);
        len += sizeof(Entry);
      }
      pm::Persist(&le[lc], len);
    }
    St(&l->count, lc + n);
    St(&l->high, r->sibling ? r->high : uint64_t(0));
    St(&l->sibling, r->sibling);
    St(&l->sw, l->sw + 2);
    pm::Persist(l, pm::kCacheLine);
    St(&r->dead, uint64_t(1));
    pm::Persist(&r->dead, 8);
    if (!fault) {
      St(&ls->l, uint64_t(0));
      pm::Persist(&ls->l, 8);
    }
    merges_++;
  }

  // p is the write-locked root and has no keys left: its only child becomes
  // the root (one 8-byte store of Meta::root), p goes to the limbo.
  void CollapseRoot(Node* p) {
    const int slot = ClaimSlot();
    if (slot < 0) return;
    std::lock_guard<std::mutex> g(root_mu_);
    // (A root with a right sibling, possible after an earlier collapse
    // while that sibling's parent insert was pending, keeps its level: its
    // siblings would become unreachable.)
    if (Ld(&meta_->root) != Off(p) || p->count != 0 || !p->leftmost || p->sibling) {
      ReleaseSlot(slot);
      return;
    }
    LimboSlot* ls = Limbo() + slot;
    St(&ls->l, kRootMark);  // l before r (see DoMerge)
    St(&ls->r, Off(p));
    pm::Persist(ls, sizeof(LimboSlot));
    St(&meta_->root, p->leftmost);
    pm::Persist(&meta_->root, 8);
    St(&p->dead, uint64_t(1));
    pm::Persist(&p->dead, 8);
    St(&ls->l, uint64_t(0));
    pm::Persist(&ls->l, 8);
    root_collapses_++;
    Retire(slot);
  }

  // Open: settles every used limbo slot (constant work).
  void RecoverLimbo(Meta* m) {
    if (!m->limbo) return;
    LimboSlot* ls = Limbo();
    for (uint32_t i = 0; i < kLimboSlots; i++) {
      if (!ls[i].r) continue;
      if (LimboLinked(ls[i])) {
        if (ls[i].l != kRootMark) UndoMerge(At(ls[i].l), At(ls[i].r));
        St(&ls[i].r, uint64_t(0));
        St(&ls[i].l, uint64_t(0));
        pm::Persist(&ls[i], sizeof(LimboSlot));
      } else {
        if (ls[i].l) {
          St(&ls[i].l, uint64_t(0));
          pm::Persist(&ls[i].l, 8);
        }
        FreeLimboNode(&ls[i]);
        pm::Fence();
        open_blocks_freed_++;
      }
    }
  }
  // Byte keys: a leaf merged away still owns its low key block K (the
  // separator: p's record and l's high referenced it until the commit,
  // nothing does after it; internal readers may still be reading it, hence
  // freed with r, after the grace period). r->low is the persistent word
  // that owns K until K is freed (then 0): a crash between the two frees
  // leaves r owning nothing else, and open frees r alone. An internal r's
  // low is p's separator moved down into l (still referenced, not r's); a
  // collapsed root is internal.
  uint64_t LimboKeyBlock(const LimboSlot& s) const {
    if constexpr (BK) {
      Node* r = At(s.r);
      if (r->level == 0) return r->low;
    }
    (void)s;
    return 0;
  }
  void FreeLimboNode(LimboSlot* s) {
    if (LimboKeyBlock(*s)) alloc_->Free(&At(s->r)->low);
    alloc_->Free(&s->r);
  }
  // True if the slot's node is still in the tree (its unlink not durable).
  bool LimboLinked(const LimboSlot& s) const {
    if (s.l == kRootMark) return meta_->root == s.r;
    return s.l && At(s.l)->sibling == s.r;
  }
  // A merge of r into l that did not commit: l gets back its fence and
  // count (records >= r's low key were appended past it); the parent's
  // separator, if already deleted, comes back through the B-link repair.
  void UndoMerge(Node* l, Node* r) {
    const uint64_t K = r->low;
    const SK key = KeyOf(K);
    Entry* e = l->ents();
    // The effective count: a format 4 merge may have shifted l (DropPrefix,
    // whose count shares the shift's last fence) before it crashed, so l's
    // durable count may lag by the record that shift moved (Pushed; r's
    // appended records are >= high = K, never counted). With l->count the
    // SetTail below overwrote that record (fastfair_prefix_repair_test
    // MergeDroppingCrashMadePrefixCrashStates: an acknowledged key lost).
    const uint32_t cnt = CountOf(l);
    uint32_t cut = 0;
    // (Ignored slots, such as a format 4 lk prefix, hold no key: skipped.)
    while (cut < cnt && (Ignored(l, cut) || Cmp(e[cut].k, key) < 0)) cut++;
    St(&l->high, K);
    St(&l->count, cut);
    pm::Persist(l, pm::kCacheLine);
    SetTail(l);  // I2 (until then slot cut holds a record >= high: not Pushed)
  }

  // ---- lazy repair -------------------------------------------------------
  bool Referenced(Node* n, uint64_t b) const {
    if (n->sibling && (n->high == b || EffectiveHigh(n) == b)) return true;
    Entry* e = n->ents();
    const uint32_t c = CountOf(n);
    for (uint32_t j = 0; j < c; j++) {
      if (Ignored(n, j)) continue;
      if (BK && e[j].k == b) return true;
      if (bv_ && n->level == 0 && e[j].v == b) return true;
    }
    return false;
  }

  void Prepare(Node* n, Pending* pend) {
    if (n->gen != gen_) Repair(n, pend);
  }

  void Repair(Node* n, Pending* pend) {
    nodes_repaired_++;
    // First the record an interrupted insert shift moved past a durable
    // count that had not caught up, or a delete shift left at the count
    // (formats 2-3, see Pushed).
    if (lag_ok_ && Pushed(n, n->count)) {
      St(&n->count, n->count + 1);
      pm::Persist(&n->count, 4);
      counts_repaired_++;
    }
    Entry* e = n->ents();
    if (n->spare_node) {
      if (n->spare_node == n->sibling) {
        // The split was linked: finish the cut.
        Node* s = At(n->sibling);
        const uint64_t K = s->low;
        if (n->high != K) St(&n->high, K);
        uint32_t m = 0;
        while (m < n->count && (Ignored(n, m) || Cmp(e[m].k, KeyOf(K)) < 0)) m++;
        St(&n->count, m);
        St(&n->sw, n->sw + 2);
        St(&n->spare_node, uint64_t(0));
        pm::Persist(n, pm::kCacheLine);
        splits_repaired_++;
        pend->Add(n->level, n->sibling);
      } else {
        // Never linked: the half-built sibling is garbage.
        alloc_->Free(&n->spare_node);
        if (!n->sibling && n->high) {
          St(&n->high, uint64_t(0));
          pm::Persist(&n->high, 8);
        }
      }
    }
    // Ignored records are compacted, except a format 4 leaf's lk prefix
    // (the leading slots equal to lk: free room, see Start).
    uint32_t j0 = 0;
    if (window_ && n->level == 0)
      while (j0 < n->count && e[j0].k == n->lk) j0++;
    for (uint32_t j = j0; j < n->count;) {
      if (Ignored(n, j)) DeleteAt(n, j, false);  // persists count
      else j++;
    }
    SetTail(n);  // I2
    for (uint64_t* sp : {&n->spare_a, &n->spare_b}) {
      if (!*sp) continue;
      if (Referenced(n, *sp)) {
        St(sp, uint64_t(0));
        pm::Persist(sp, 8);
      } else {
        alloc_->Free(sp);
      }
    }
    // Durable so that the line is clean when the op returns (losing it
    // would only cause an idempotent second repair).
    St(&n->gen, gen_);
    // Then a new sw (the mode kept: +2), after gen: a lock-free reader
    // loads sw, then gen (MayLag); one that saw the old gen (it applies
    // Pushed) and finds sw unchanged at its validation saw none of the
    // stores after the gen store, i.e. no write to the live node (St is a
    // release store, the loads acquire). Without it such a reader could
    // apply the lag rule to the live node and count an append in flight
    // before its count store while a later reader (lag false) misses it:
    // not linearizable (only right after an open; reviewer finding 4).
    // The same line as gen.
    St(&n->sw, n->sw + 2);
    pm::Persist(&n->gen, 8);
  }

  // Inserts (K, child) at `level` unless present (idempotent: the splitter
  // and a writer that found the sibling missing may both try).
  Status InsertInternal(uint32_t level, uint64_t K, uint64_t child, bool* inserted = nullptr) {
    const SK key = KeyOf(K);
    Pending pend;
    Node* n = nullptr;
    PMINDEX_RETURN_IF_ERROR(LockAt(level, key, &pend, &n));
    uint32_t pos;
    // Present as a record, or as n's leftmost child: when a parent split
    // chose K as its median, K moved up and the child became the new
    // sibling's `leftmost`, with no record keyed K left at this level. A
    // writer that had moved right to the child before (pending) then
    // inserted (K, child) a second time; the tree listed the child twice
    // (Check: "child listed ... twice"; found by SplitRacingWithDelete).
    // A child merged away meanwhile (dead is set under its parent's lock,
    // after its record left the parent) must not come back.
    if (FindInLocked(n, key, &pos) || n->leftmost == child || Ld(&At(child)->dead)) {
      WUnlock(n);
      EnsurePending(pend);
      return Status::OK();
    }
    Node* t = n;
    uint64_t K2 = 0;
    Node* S2 = nullptr;
    if (n->count == cap_) {
      Status st = Split(n, &K2, &S2);
      if (!st.ok()) {
        WUnlock(n);
        return st;
      }
      if (Cmp(K2, key) <= 0) t = S2;
      FindInLocked(t, key, &pos);
    }
    // The new sibling is reachable through n's fence already: Split locked
    // it before linking it, so nobody else changed it since.
    if (!BK && K == t->lk) FixLk(t, K);
    InsertAt(t, pos, K, child);
    UnlockNew(n, S2);
    if (inserted) *inserted = true;
    WUnlock(n);
    Status st;
    if (S2) st = InsertInternal(level + 1, K2, Off(S2));
    EnsurePending(pend);
    return st;
  }

  void EnsurePending(const Pending& pend) {
    for (int i = 0; i < pend.n; i++) {
      Node* c = At(pend.a[i].child);
      bool inserted = false;
      if (InsertInternal(pend.a[i].level + 1, c->low, pend.a[i].child, &inserted).ok() && inserted) parents_repaired_++;
    }
  }

  // ---- leaf writes -------------------------------------------------------
  Status InsertLeafEntry(Node* t, uint32_t pos, const SK& key, Slice value) {
    uint64_t kw, vw;
    if constexpr (BK) {
      PMINDEX_RETURN_IF_ERROR(AllocBlock(&t->spare_a, key));
      kw = Ld(&t->spare_a);
    } else {
      kw = key;
    }
    if (bv_) {
      Status st = AllocBlock(&t->spare_b, value);
      if (!st.ok()) {
        if (BK) alloc_->Free(&t->spare_a);
        return st;
      }
      vw = Ld(&t->spare_b);
    } else {
      vw = SliceToU64(value);
    }
    if (!BK && kw == t->lk) {
      pos -= Start(t);  // FixLk drops t's lk prefix
      FixLk(t, kw);
    }
    InsertAt(t, pos, kw, vw);
    if (BK || bv_) {
      // The record owns the blocks now.
      St(&t->spare_a, uint64_t(0));
      St(&t->spare_b, uint64_t(0));
      pm::Persist(&t->spare_a, 16);
    }
    return Status::OK();
  }

  Status UpdateAt(Node* n, uint32_t pos, Slice value) {
    Entry* e = n->ents();
    if (!bv_) {
      St(&e[pos].v, SliceToU64(value));
      pm::Persist(&e[pos], sizeof(Entry));
      return Status::OK();
    }
    PMINDEX_RETURN_IF_ERROR(AllocBlock(&n->spare_a, value));
    St(&n->spare_b, e[pos].v);
    pm::Persist(&n->spare_b, 8);
    St(&e[pos].v, Ld(&n->spare_a));  // commit
    pm::Persist(&e[pos], sizeof(Entry));
    alloc_->Free(&n->spare_b);
    St(&n->spare_a, uint64_t(0));
    pm::Persist(&n->spare_a, 8);  // (its fence also orders the lane clear)
    return Status::OK();
  }

  Status Put(Slice key, Slice value, Mode mode) {
    PMINDEX_RETURN_IF_ERROR(Writable());
    PMINDEX_RETURN_IF_ERROR(ValidateKey(key_kind(), opts_.max_key_size, key));
    PMINDEX_RETURN_IF_ERROR(ValidateValue(vk_, opts_.max_value_size, value));
    EpochGuard eg(epoch_);
    const SK sk = MakeSK(key);
    Pending pend;
    Node* n = nullptr;
    PMINDEX_RETURN_IF_ERROR(LockAt(0, sk, &pend, &n));
    uint32_t pos;
    Status st;
    Node* S2 = nullptr;
    uint64_t K2 = 0;
    if (FindInLocked(n, sk, &pos)) {
      st = mode == kInsert ? Status::AlreadyExists() : UpdateAt(n, pos, value);
    } else if (mode == kUpdate) {
      st = Status::NotFound();
    } else {
      Node* t = n;
      if (Full(n, pos)) {
        st = Split(n, &K2, &S2, /*append=*/pos == n->count);
        if (st.ok()) {
          if (Cmp(K2, sk) <= 0) t = S2;
          FindInLocked(t, sk, &pos);
        }
      }
      if (st.ok()) {
        st = InsertLeafEntry(t, pos, sk, value);  // S2 is locked (see Split)
        UnlockNew(n, S2);
      }
    }
    WUnlock(n);
    // The record is durable; a failed parent insert (pool full) leaves a
    // correct B-link tree that a later writer completes.
    if (S2) (void)InsertInternal(1, K2, Off(S2));
    EnsurePending(pend);
    return st;
  }

  // ---- members -----------------------------------------------------------
  std::unique_ptr<pm::Pool> pool_;
  char* base_;
  pm::Allocator* alloc_;
  Options opts_;
  Meta* meta_ = nullptr;
  uint64_t gen_ = 0;
  const uint32_t node_size_;
  const uint32_t cap_;
  const uint32_t merge_below_;  // a non-root node with fewer records is underfull
  const bool bv_;
  const ValueKind vk_;
  const bool locked_reads_;
  bool lag_ok_ = false;     // format version >= 2: counts may lag after a crash (Pushed)
  bool sw_guard_ = false;   // format version 2: only in insert mode (sw even)
  bool lazy_delete_count_ = false;  // format version >= 3: deletes do not fence the count alone
  bool window_ = false;  // format version >= 4: leaves may have an lk prefix (Start, InsertLeft)
  bool read_only_ = false;  // opened read-only: no node is repaired, any may lag
  static constexpr int kLockChunkBits = 14;
  size_t lock_chunks_ = 0;
  uint64_t max_off_ = 0;  // the pool's reserved address range (scan prefetch bound)
  // Nodes the pool could hold when last looked at (WalkTooLong; only grows).
  mutable std::atomic<uint64_t> walk_cap_{0};
  std::unique_ptr<std::atomic<std::atomic<uint32_t>*>[]> lock_dir_;
  // Limbo (DRAM side): slots in use, and retired slots with their epochs.
  std::mutex limbo_mu_;
  bool limbo_busy_[kLimboSlots] = {};
  RetireList<uint32_t> retired_;  // limbo slot numbers
  std::atomic<uint32_t> retired_count_{0};
  EpochManager epoch_;  // guards every public operation (lock-free readers)
  // Read-only open: left nodes of merges that did not commit (see Recover).
  std::vector<uint64_t> ro_undo_;
  std::atomic<uint64_t> merges_{0}, root_collapses_{0}, nodes_freed_{0}, merges_skipped_{0}, rebalances_{0},
      rebalances_from_right_{0};
  std::mutex root_mu_;
  uint64_t open_blocks_freed_ = 0, open_pm_stores_ = 0, open_pm_lines_ = 0;
  std::atomic<uint64_t> nodes_repaired_{0}, splits_repaired_{0}, parents_repaired_{0}, root_grows_{0};
  std::atomic<uint64_t> counts_repaired_{0};
  std::atomic<uint64_t> left_inserts_{0}, prefix_drops_{0}, prefix_splits_{0};
};

// ---- Check ------------------------------------------------------------------
template <bool BK>
Status FastFair<BK>::Check() {
  auto corrupt = [](const std::string& m) { return Status::Corrupt("fastfair: " + m); };
  Node* root = At(Ld(&meta_->root));
  if (!root) return corrupt("no root");
  std::vector<uint64_t> upper;  // children listed by the level above, in order
  uint64_t records = 0;
  for (Node* first = root;;) {
    const uint32_t level = first->level;
    if (first->low != 0) return corrupt("leftmost node of level " + std::to_string(level) + " has a low key");
    std::vector<uint64_t> children;
    size_t up = 0;  // next expected parent-listed node in this chain
    Node* prev = nullptr;
    uint64_t nodes = 0;
    for (Node* n = first; n; prev = n, n = At(n->sibling)) {
      if (WalkTooLong(++nodes)) return corrupt("sibling cycle on level " + std::to_string(level));
      const std::string where = "node " + std::to_string(Off(n)) + " (level " + std::to_string(level) + ")";
      if (n->level != level) return corrupt(where + " on the wrong level chain");
      if (n->count > cap_) return corrupt(where + " count exceeds capacity");
      if (up < upper.size() && upper[up] == Off(n)) up++;
      else if (n == first && !upper.empty()) return corrupt(where + " is not the leftmost child of the level above");
      if (prev && n->low != EffectiveHigh(prev)) return corrupt(where + " low key differs from its left sibling's high key");
      Entry* e = n->ents();
      bool have_prev = false;
      uint64_t prevk = 0;
      if (level > 0) children.push_back(n->leftmost);
      const uint32_t live = LiveCount(n);
      if (live != CountOf(n) && n->spare_node != n->sibling && !UndoPending(n))
        return corrupt(where + " has records at or above its high key outside a split");
      // A node repaired in this (read-write) run holds no ignored slot
      // except a format 4 leaf's leading lk run (Repair compacts the rest,
      // shifts complete under the lock): what Start and FindInLocked's
      // binary search rely on. Other nodes may hold a crash's half-done
      // shift until a writer repairs them.
      const bool repaired = !read_only_ && n->gen == gen_;
      uint32_t run = 0;
      if (repaired && window_ && level == 0)
        while (run < live && e[run].k == n->lk) run++;
      for (uint32_t j = 0; j < live; j++) {
        if (Ignored(n, j)) {
          if (repaired && j >= run)
            return corrupt(where + " (repaired) has an ignored slot " + std::to_string(j) + " past its lk prefix");
          continue;
        }
        if (BK && e[j].k == kBytesLk) return corrupt(where + " has a record with the byte-key lk");
        if (have_prev && Cmp(prevk, KeyOf(e[j].k)) >= 0) return corrupt(where + " records not sorted at " + std::to_string(j));
        if (n->low && Cmp(n->low, KeyOf(e[j].k)) > 0) return corrupt(where + " record below the low key");
        if (n->sibling && Cmp(EffectiveHigh(n), KeyOf(e[j].k)) <= 0) return corrupt(where + " record at or above the high key");
        have_prev = true;
        prevk = e[j].k;
        if (level > 0) {
          Node* c = At(e[j].v);
          if (!c || c->level + 1 != level) return corrupt(where + " child on the wrong level");
          if (Cmp(c->low, KeyOf(e[j].k)) != 0) return corrupt(where + " separator differs from the child's low key");
          children.push_back(e[j].v);
        } else {
          records++;
        }
      }
    }
    if (up != upper.size())
      return corrupt("level " + std::to_string(level) + ": child " + std::to_string(upper[up]) +
                     " listed by the parents is missing from the sibling chain, out of order or listed twice");
    if (level == 0) break;
    upper = std::move(children);
    first = At(first->leftmost);
    if (!first) return corrupt("internal node without leftmost child");
    if (first->level + 1 != level) return corrupt("leftmost child of level " + std::to_string(level) + " on the wrong level");
  }
  // Every record reachable from the root exactly where the chain has it.
  for (Node* n = LeftmostAt(0); n; n = At(n->sibling)) {
    Entry* e = n->ents();
    const uint32_t live = LiveCount(n);
    for (uint32_t j = 0; j < live; j++) {
      if (Ignored(n, j)) continue;
      const SK key = KeyOf(e[j].k);
      Node* l = Descend(0, key, nullptr);
      if (l == Bad()) return corrupt("descent to a record fails (a cycle of links, or a child on the wrong level)");
      while (l->sibling && Cmp(EffectiveHigh(l), key) <= 0) l = At(l->sibling);
      if (l != n) {
        // Only allowed where a crash interrupted a split before the old
        // node's high key moved: readers find the copy there.
        uint32_t pos;
        const bool copy = l->spare_node == l->sibling && l->sibling && l->gen != gen_ && FindInLocked(l, key, &pos) &&
                          l->ents()[pos].v == e[j].v;
        if (!copy) return corrupt("record in node " + std::to_string(Off(n)) + " is reached in node " + std::to_string(Off(l)));
      }
    }
  }
  if (records != Size()) return corrupt("record count mismatch");
  return Status::OK();
}

template <bool BK>
Status FastFair<BK>::ForEachOwnedBlock(const std::function<void(uint64_t)>& fn) {
  fn(*pool_->root_slot());
  if (meta_->spare_root && meta_->spare_root != meta_->root) fn(meta_->spare_root);
  if (meta_->limbo) {
    fn(meta_->limbo);
    LimboSlot* ls = Limbo();
    for (uint32_t i = 0; i < kLimboSlots; i++)
      if (ls[i].r && !LimboLinked(ls[i])) {
        fn(ls[i].r);
        if (const uint64_t k = LimboKeyBlock(ls[i])) fn(k);
      }
  }
  std::vector<uint64_t> blocks;
  for (Node* first = At(meta_->root); first;) {
    const uint32_t level = first->level;
    uint64_t steps = 0;
    for (Node* n = first; n; n = At(n->sibling)) {
      if (WalkTooLong(++steps) || n->level != level) return CorruptWalk("block enumeration");
      fn(Off(n));
      if (n->spare_node && n->spare_node != n->sibling) fn(n->spare_node);
      blocks.clear();
      Entry* e = n->ents();
      if (n->level == 0) {
        if (BK && n->low) blocks.push_back(n->low);
        const uint32_t live = LiveCount(n);
        for (uint32_t j = 0; j < live; j++) {
          if (Ignored(n, j)) continue;
          if (BK) blocks.push_back(e[j].k);
          if (bv_) blocks.push_back(e[j].v);
        }
      }
      for (uint64_t sp : {n->spare_a, n->spare_b})
        if (sp && !Referenced(n, sp)) blocks.push_back(sp);
      std::sort(blocks.begin(), blocks.end());
      blocks.erase(std::unique(blocks.begin(), blocks.end()), blocks.end());
      for (uint64_t b : blocks) fn(b);
    }
    first = level ? At(first->leftmost) : nullptr;
    if (first && first->level + 1 != level) return CorruptWalk("block enumeration");
  }
  return Status::OK();
}

// ---- factory ----------------------------------------------------------------
Status ParseParams(const Options& o, uint32_t* node_size, bool* rc) {
  Params p(o.params);
  PMINDEX_RETURN_IF_ERROR(p.Expect({"node_size", "read_committed"}));
  long long ns;
  PMINDEX_RETURN_IF_ERROR(p.GetInt("node_size", 512, 256, 8192, &ns));
  if (ns % 64) return Status::InvalidArgument("fastfair node_size must be a multiple of 64, got " + std::to_string(ns));
  *node_size = uint32_t(ns);
  return p.GetBool("read_committed", false, rc);
}

std::unique_ptr<FastFairBase> Make(std::unique_ptr<pm::Pool> pool, const Options& o, KeyKind kk, ValueKind vk,
                                   uint32_t ns, bool rc) {
  if (kk == KeyKind::kBytes) return std::make_unique<FastFair<true>>(std::move(pool), o, ns, vk, rc);
  return std::make_unique<FastFair<false>>(std::move(pool), o, ns, vk, rc);
}

Status Create(std::unique_ptr<pm::Pool> pool, const Options& o, std::unique_ptr<Index>* out) {
  uint32_t ns;
  bool rc;
  PMINDEX_RETURN_IF_ERROR(ParseParams(o, &ns, &rc));
  if (*pool->root_slot() != 0) return Status::InvalidArgument("pool already holds a root object");
  auto t = Make(std::move(pool), o, o.key_kind, o.value_kind, ns, rc);
  Status s = t->Format();
  if (!s.ok()) return s;
  *out = std::move(t);
  return Status::OK();
}

Status Open(std::unique_ptr<pm::Pool> pool, const Options& o, std::unique_ptr<Index>* out) {
  const auto t0 = std::chrono::steady_clock::now();
  uint32_t ns_param;
  bool rc;
  PMINDEX_RETURN_IF_ERROR(ParseParams(o, &ns_param, &rc));
  Meta* m = pool->root<Meta>();
  if (!m) return Status::Corrupt("fastfair pool has no root object (creation interrupted?)");
  if (pool->allocator().UsableSize(*pool->root_slot()) < sizeof(Meta))
    return Status::Corrupt("fastfair root object too small");
  if (m->magic != kMagic) return Status::Corrupt("fastfair metadata not initialised (creation interrupted?)");
  if (m->version < kMinVersion || m->version > kVersion) return Status::Corrupt("fastfair format version " + std::to_string(m->version) + " unsupported");
  if (m->key_kind > 1 || m->value_kind > 1) return Status::Corrupt("fastfair metadata has bad key/value kinds");
  if (m->node_size < 256 || m->node_size > 8192 || m->node_size % 64) return Status::Corrupt("fastfair metadata has a bad node size");
  if (o.params.count("node_size") && ns_param != m->node_size)
    return Status::InvalidArgument("pool was created with node_size=" + std::to_string(m->node_size));
  if (!m->root || m->root >= pool->size()) return Status::Corrupt("fastfair root pointer out of the pool");
  const KeyKind kk = KeyKind(m->key_kind);
  auto t = Make(std::move(pool), o, kk, ValueKind(m->value_kind), m->node_size, rc);
  Status s = t->Recover(m);
  if (!s.ok()) return s;
  t->recovery_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  *out = std::move(t);
  return Status::OK();
}

}  // namespace

namespace fastfair {
const DebugCounters* GetDebugCounters(Index* index) {
  auto* t = dynamic_cast<FastFairBase*>(index);
  if (!t) return nullptr;
  t->snapshot_ = t->Debug();
  return &t->snapshot_;
}
int NodeCapacity(Index* index) {
  auto* t = dynamic_cast<FastFairBase*>(index);
  return t ? t->Cap() : 0;
}
int Height(Index* index) {
  auto* t = dynamic_cast<FastFairBase*>(index);
  return t ? t->TreeHeight() : 0;
}
void SetTestHooks(Index* index, const TestHooks* hooks) {
  if (auto* t = dynamic_cast<FastFairBase*>(index)) t->hooks_ = hooks;
}
}  // namespace fastfair

void RegisterFastFair(std::vector<IndexFactory>* r) {
  IndexFactory f;
  f.info = {"fastfair", /*persistent=*/true, /*ordered=*/true, /*concurrent=*/true,
            "FAST & FAIR: whole B+-tree in PM, logless in-node shifts and splits, lock-free search, lazy recovery"};
  f.create = &Create;
  f.open = &Open;
  r->push_back(f);
}

}  // namespace pmindex::internal
