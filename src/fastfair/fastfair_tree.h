// fastfair_tree.h: the FAST & FAIR B+-tree (Hwang et al., FAST'18,
// /work/shared/papers/fast-fair-fast18.md; docs/fastfair.md), one class
// template FastFair<BK> (BK: byte keys) whose members are defined by concern:
//   fastfair_format.h    on-PM layout, version, invariants (read it first)
//   fastfair_node.h      FAST in-node shifts (NodeOps, one node)
//   fastfair_tree.h      this file: the class, keys, the count rule, locks,
//                        the lock-free descent (inline: on every hot path)
//   fastfair_read.cc     Find, Scan, Size: lock-free and locked readers
//   fastfair_write.cc    Insert/Update/Upsert/Remove on leaves
//   fastfair_smo.cc      FAIR split, parent insert, root growth, merge,
//                        rebalance, root collapse, retire slots
//   fastfair_retire.cc   retired key/value blocks (grace period, PM slots)
//   fastfair_recovery.cc create, open, undo of merges, lazy repair
//   fastfair_check.cc    Check, owned-block enumeration
//   fastfair.cc          options, factory, registration, test hooks
// Each .cc explicitly instantiates what it defines, for BK = false and true.
// Invariants: fastfair_format.h. Persist order: written above each function
// that stores to PM (fastfair_node.h, fastfair_write.cc, fastfair_smo.cc,
// fastfair_recovery.cc); this file stores nothing.
//
// The validity rule, mirrored (sec. 3.2): the paper ignores a key between
// two equal *pointers*, which needs every pointer to be unique; leaf values
// are not unique, so here the unique word of a record is its KEY and a
// record whose k equals its left neighbour's (slot 0: lk) is ignored by
// every reader. So values stay inline and may repeat.
//
// Concurrency (sec. 5): writers lock nodes with DRAM reader-writer spin
// locks (kit/rw_spinlock.h, writer-preferring) kept in a kit/lock_table.h
// table keyed by the node's address (no aliasing between live nodes),
// never persisted. Lock order: higher level first, then left to right
// within a level; a node not yet reachable may be locked any time; root_mu_
// after node locks. A writer that locks a dead node restarts from the
// root. Every public operation runs in an epoch guard (kit/epoch.h).
// Readers take no lock (unless read_committed=1): they scan in the
// direction given by the node's switch counter `sw` (even: inserts, left to
// right; odd: deletes, right to left) and retry if `sw` changed; splits and
// merges add 2 to `sw`. Readers move right when key >= high (read high,
// sibling, high again). Key and value blocks that a Remove or Update
// unlinks are freed only after an epoch grace period, owned meanwhile by
// a persistent block retire slot (fastfair_retire.cc), so a lock-free
// reader reads byte keys and values in place; separator blocks likewise
// (freed with the merged node). `read_committed=1` trees read-lock leaves;
// their internal levels stay lock-free.
//
// Walk bounds (corrupt pools; docs/fastfair.md, "Bad input"): every walk
// (descent, moves right, leaf chain, restarts on dead nodes) is bounded by
// the number of nodes the pool can hold (kit/bounded_walk.h) and ends with
// Corrupt past it. Key and value blocks are read bounds-checked
// (kit/pm_block.h): a damaged one never reads outside the pool.
//
// Closed: Close sets closed_, and every public member tests it first (a
// call after Close answers InvalidArgument "index closed", Size 0).
//
// Thread safety: every public member may be called concurrently, except
// Check, ForEachOwnedBlock, Close and the test hooks (quiescent callers).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/index_util.h"
#include "fastfair/fastfair.h"
#include "fastfair/fastfair_format.h"
#include "fastfair/fastfair_node.h"
#include "kit/backoff.h"
#include "kit/bounded_walk.h"
#include "kit/epoch.h"
#include "kit/lock_table.h"
#include "kit/pm_block.h"
#include "kit/retire_list.h"
#include "kit/rw_spinlock.h"
#include "pmindex/pm/allocator.h"
#include "pmindex/pm/fault.h"
#include "pmindex/pm/persist.h"
#include "pmindex/pm/pool.h"

namespace pmindex::internal::fastfair {

// Leaves a lock-free scan prefetches from the parent (DescendForScan).
constexpr uint32_t kScanHints = 16;
// A non-root node with fewer than cap / kMergeBelowDiv records (internal:
// keys) after a delete is underfull: merged with a neighbour, or rebalanced
// with one (docs/fastfair.md, Merges).
constexpr uint32_t kMergeBelowDiv = 3;

// Per-node lock words: 63 pause spins, then sched_yield.
using NodeLock = kit::BasicRwSpinLock<kit::BasicBackoff<63>>;
static_assert(sizeof(NodeLock) == 4);
using EpochGuard = EpochManager::Guard;

// What the factory and the introspection functions see of a tree.
class PMINDEX_FASTFAIR_HIDDEN FastFairBase : public Index {
 public:
  virtual DebugCounters Debug() = 0;
  virtual int Cap() const = 0;
  virtual int TreeHeight() = 0;
  virtual Status Format() = 0;
  virtual Status Recover(Meta* m) = 0;
  virtual void SetHooks(const TestHooks* hooks) = 0;
  DebugCounters snapshot_;
  double recovery_seconds_ = 0;
};

// Siblings reached by a move right whose parent insert may be pending
// (B-link): the operation makes sure they are in their parent before it
// returns (EnsurePending).
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

// Block retire slots claimed for one Update or Remove of byte keys or
// values (fastfair_retire.cc): claimed before the operation's epoch guard,
// owned (Own) under the leaf lock, retired or released after the guard.
struct BlockClaims {
  int n = 0, used = 0;
  int slot[2];
};

// The Scans of trees with byte keys or values this thread is inside (a
// stack through the scans' frames, innermost first): a write from a Scan
// callback runs inside its scan's epoch guard, and must not wait for a
// grace period that guard holds back (ClaimBlocks, fastfair_retire.cc).
// Pushed and popped by ScanMark; constant-initialised, so no TLS wrapper.
struct ScanFrame {
  const void* tree;
  ScanFrame* up;
};
inline constinit thread_local ScanFrame* tl_scans = nullptr;
class ScanMark {
 public:
  ScanMark(const void* tree, bool on) : f_{tree, tl_scans}, on_(on) {
    if (on) tl_scans = &f_;
  }
  ~ScanMark() {
    if (on_) tl_scans = f_.up;
  }
  ScanMark(const ScanMark&) = delete;
  ScanMark& operator=(const ScanMark&) = delete;
  // True if this thread is inside a Scan of `tree` (a marked one).
  static bool Inside(const void* tree) {
    for (const ScanFrame* f = tl_scans; f; f = f->up)
      if (f->tree == tree) return true;
    return false;
  }

 private:
  ScanFrame f_;
  const bool on_;
};

template <bool BK>
class PMINDEX_FASTFAIR_HIDDEN FastFair final : public FastFairBase, protected NodeOps {
  using SK = std::conditional_t<BK, Slice, uint64_t>;

 public:
  // merge_below: the underfull threshold if in [1, cap / kMergeBelowDiv),
  // else that default.
  FastFair(std::unique_ptr<pm::Pool> pool, const Options& o, uint32_t node_size, ValueKind vk, bool rc,
           uint32_t merge_below = 0)
      : NodeOps((node_size - sizeof(Node)) / sizeof(Entry)), pool_(std::move(pool)), base_(pool_->base()),
        alloc_(&pool_->allocator()), opts_(o), node_size_(node_size),
        merge_below_(merge_below && merge_below < cap_ / kMergeBelowDiv ? merge_below
                                                                        : std::max<uint32_t>(1, cap_ / kMergeBelowDiv)), bv_(vk == ValueKind::kBytes), vk_(vk),
        locked_reads_(rc), max_off_(pool_->max_size()),
        walk_(pool_->size(), node_size), pool_bytes_(pool_->size()) {}
  ~FastFair() override { Close(); }

  // fastfair_recovery.cc
  Status Format() override;
  Status Recover(Meta* m) override;

  std::string_view Name() const override { return "fastfair"; }
  KeyKind key_kind() const override { return BK ? KeyKind::kBytes : KeyKind::kU64; }
  ValueKind value_kind() const override { return vk_; }
  pm::Pool* pool() override { return closed_ ? nullptr : pool_.get(); }

  // fastfair_write.cc
  Status Insert(Slice key, Slice value) override;
  Status Update(Slice key, Slice value) override;
  Status Upsert(Slice key, Slice value) override;
  Status Remove(Slice key) override;
  // fastfair_read.cc
  Status Find(Slice key, std::string* value) override;
  Status Scan(Slice start, size_t limit, ScanCallback cb, size_t* count) override;
  uint64_t Size() override;
  // fastfair_check.cc
  Status Check() override;
  Status ForEachOwnedBlock(const std::function<void(uint64_t)>& fn) override;
  // fastfair.cc
  IndexStats Stats() override;
  Status Close() override;
  DebugCounters Debug() override;
  int Cap() const override { return int(cap_); }
  int TreeHeight() override {
    EpochGuard eg(epoch_);
    return int(At(Ld(&meta_->root))->level) + 1;
  }
  void SetHooks(const TestHooks* hooks) override { hooks_ = hooks; }

 private:
  enum Mode { kInsert, kUpdate, kUpsert };

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
  // Step of a kit::BoundedWalk; walks start from walk_, the pool's node
  // capacity at open (no division per walk); the pool grows in place, so
  // past that bound the current size decides (cold).
  kit::BoundedWalk Walk() const { return walk_; }
  __attribute__((always_inline)) bool Step(kit::BoundedWalk& w) const {
    return __builtin_expect(w.Step(), 1) || StepSlow(w);
  }
  __attribute__((noinline, cold)) bool StepSlow(kit::BoundedWalk& w) const {
    return w.Regrow(pool_->size(), node_size_);
  }
  // What a walk returns when it found the pool corrupt: the pool's first
  // byte (offset 0 is the pool header, never a node; At(0) is nullptr).
  Node* Bad() const { return reinterpret_cast<Node*>(base_); }
  __attribute__((noinline, cold)) static Status CorruptWalk(const char* what) {
    return Status::Corrupt(std::string("fastfair: ") + what + " (a cycle of node links, or a child on the wrong level)");
  }

  // Every public operation checks closed_ first (IndexClosed after Close:
  // the pool is unmapped by then).
  Status Writable() const {
    if (__builtin_expect(closed_, 0)) return IndexClosed();
    return pool_->read_only() ? Status::Unsupported("fastfair opened read-only") : Status::OK();
  }

  // ---- keys ------------------------------------------------------------
  // Key and value blocks ({u32 len, bytes}, fastfair_format.h) are read in
  // place through kit::TryViewBlock32, bounds-checked against the pool's
  // size: a damaged offset or length never reads outside the pool. The
  // size is the one last seen (pool_bytes_: the pool only grows, so a block
  // inside it is inside the pool); a block past it looks again (cold).
  // BlockSlice gives an empty slice for a block out of range (for key
  // comparisons, which have no error channel: Check reports the block);
  // ViewBlock reports it (Find, Scan and Check answer Corrupt).
  static constexpr size_t kMaxBlockLen = UINT32_MAX;
  bool ViewBlock(uint64_t off, Slice* out) const {
    return __builtin_expect(
               kit::TryViewBlock32(base_, pool_bytes_.load(std::memory_order_relaxed), off, kMaxBlockLen, out), 1) ||
           ViewBlockSlow(off, out);
  }
  __attribute__((noinline, cold)) bool ViewBlockSlow(uint64_t off, Slice* out) const {
    const uint64_t now = pool_->size();
    uint64_t old = pool_bytes_.load(std::memory_order_relaxed);
    while (old < now && !pool_bytes_.compare_exchange_weak(old, now, std::memory_order_relaxed)) {
    }
    return kit::TryViewBlock32(base_, now, off, kMaxBlockLen, out);
  }
  Slice BlockSlice(uint64_t off) const {
    Slice s;
    return ViewBlock(off, &s) ? s : Slice();
  }
  // The bytes of block off into *out, or Corrupt.
  Status ReadBlockTo(uint64_t off, std::string* out) const {
    Slice s;
    if (!ViewBlock(off, &s)) return kit::BlockOutOfRange(off, pool_->size());
    out->assign(s.data(), s.size());
    return Status::OK();
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
      return CompareKeys(KeyKind::kBytes, BlockSlice(kw), key);
    } else {
      return kw < key ? -1 : (kw > key ? 1 : 0);
    }
  }

  // ---- the durable count may lag by one ------------------------------------
  // An insert shift stores the grown `count` first (readers of the live tree
  // see it before any record moves) but does not fence it before the shift:
  // its line is flushed with the shift's last line, under the shift's final
  // fence. So after a crash the durable count of the node being inserted
  // into may still be the old one while the shift already moved the last
  // record R from slot c-1 into slot c = count (past the durable count).
  // A delete shift does the same: its shrunk count shares the
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
  // delete never stores into slot count-1.
  // Invariant I2: slots count and count+1 (those below cap) are ignored
  // copies of the left key of slot count; everything that grows a count re-makes I2
  // first (InsertAt: SetTail, persisted before the count store). An
  // insert that grows count to c+1 therefore finds slot c+1 durably an
  // ignored copy already: a crash that kept the new count but not the
  // shift is harmless, and Pushed never looks past slot c.
  // Only nodes not repaired since the open (gen != gen_), or any node of a
  // read-only open, may lag; writers repair a node (Repair counts R) before
  // they change it. A lock-free reader that decided MayLag before the
  // repair retries (the repair adds 2 to sw after its gen store), so no
  // reader keeps a result of the rule applied to a node a writer changed.
  bool MayLag(Node* n) const { return read_only_ || Ld(&n->gen) != gen_; }
  bool Pushed(Node* n, uint32_t c) const {
    if (c == 0 || c >= cap_) return false;
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
    // one-record node (R copied into slot 1, then k[0] = lk) or a
    // delete (or repair) of slot 0 of a two-record node (k[0] = lk, then
    // R moved left; the count of 1 may be durable before). R is live in
    // both. An append into an empty node stores slot 0 before slot 1 (one
    // line), and the removal of a one-record node makes slot 1 lk before
    // slot 0: slot 1 is then lk, refused above.
    // With lk prefixes slot c-1 may hold lk at any c (all slots before it
    // are the prefix): the same "no left key" case, e.g. a delete of the
    // first record of a two-record leaf behind a prefix, or an insert
    // before the one record of a leaf behind a prefix.
    const bool no_left = left == lk;
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

  // Lock-free read of record j whose key was loaded as k1: true with its
  // value if the record was valid while v was read. Loads: left key, key,
  // v, left key, key. The left key MUST be read before v: an insert shift
  // turns slot j into an ignored copy of its left neighbour A (k[j] = A),
  // rewrites v[j] (v_B -> v_A), and only then makes slot j valid by storing
  // into slot j-1. The order (k, v, left, k) could read k = A, the old
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

  // ---- locks -----------------------------------------------------------
  // The lock word of node n: its word in locks_ (kit::LockTable: one word
  // per granule of the pool's address range, granule = the largest power
  // of two <= node_size, so live nodes never share one; one shift and one
  // add). Mapped by Format / Recover.
  NodeLock& LockOf(const Node* n) const { return *locks_.At(n); }
  // ---- durable answers (docs/fastfair.md, "Durable reads") --------------
  // A lock-free reader can see a writer's commit store (an insert's key, an
  // update's value, a delete's ignored copy) before the writer's fence, and
  // must not answer from it while a crash can still take it away. Every
  // writer holds the node's write lock from before its first store into the
  // node until after its last fence. So once the reader has its answer
  // (its loads of the records are acquire loads, and the lock word is
  // loaded after them): if no writer holds the lock, every store the answer
  // rests on is durable (the lock was taken before those stores and
  // released after their fence); if one does, the reader flushes the lines
  // of [from, from + bytes) and fences. Its flush makes durable a prefix of
  // each line's stores, a state any crash may already leave (the writer's
  // persist order tolerates it: Pushed, I2), now with the store the answer
  // saw. Common case: one load of a DRAM lock word, no flush.
  __attribute__((always_inline)) void DurableAnswer(Node* n, const void* from, size_t bytes) const {
    if (__builtin_expect(LockOf(n).write_locked(), 0)) DurableAnswerSlow(from, bytes);
  }
  __attribute__((noinline, cold)) void DurableAnswerSlow(const void* from, size_t bytes) const {
    if (hooks_ && hooks_->no_durable_reads) return;
    pm::Flush(from, bytes);
    pm::Fence();
    read_flushes_.fetch_add(1, std::memory_order_relaxed);
  }
  void WLock(Node* n) { LockOf(n).lock(); }
  void WUnlock(Node* n) { LockOf(n).unlock(); }
  void RLock(Node* n) { LockOf(n).lock_shared(); }
  void RUnlock(Node* n) { LockOf(n).unlock_shared(); }

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
  // (`walk` counts them across the descent).
  __attribute__((always_inline)) Node* NavChild(Node* n, const SK& key, Pending* pend, kit::BoundedWalk& walk,
                                                Node** from = nullptr) {
    for (;;) {
      uint64_t s;
      if (MoveRight(n, key, &s)) {
        if (!Step(walk)) return nullptr;
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
        // key; no test for lk per key (5 instructions per key instead of
        // 9). Slots holding lk: internal nodes have no prefix,
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
    kit::BoundedWalk walk = Walk();
    while (lv > level) {
      n = NavChild(n, key, pend, walk);
      if (__builtin_expect(!n || n->level != --lv, 0)) return Bad();
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
      // (From the end of the lk prefix, see Start.)
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

  // A writer repairs a node before it changes it (fastfair_recovery.cc).
  void Prepare(Node* n, Pending* pend) {
    if (n->gen != gen_) Repair(n, pend);
  }
  bool Underfull(Node* n) const { return Live(n) < merge_below_; }
  // Releases the lock Split took on the new sibling s (if any).
  void UnlockNew(Node* n, Node* s) {
    if (s) WUnlock(s);
  }

  // ---- defined in the .cc files ------------------------------------------
  // Helpers with one caller, in the caller's file, are always inlined
  // (Find's leaf search, Scan's descent and snapshot, Put's leaf insert
  // and update, Remove's body): they are split out for reading only.
  // fastfair_read.cc
  __attribute__((always_inline)) inline Node* DescendForScan(const SK& key, size_t limit);
  template <bool kBV>
  __attribute__((always_inline)) inline Status ScanLF(const SK& sk, size_t limit, ScanCallback& cb, size_t* count);
  Node* ReadLockLeaf(Node* n, const SK& key);
  __attribute__((always_inline)) inline bool SearchLeafLF(Node* n, const SK& key, uint64_t* out, bool* bad);
  __attribute__((always_inline)) inline Node* SnapshotLeafLF(Node* n, Entry* snap, uint32_t* nout, uint64_t* lk_out);
  // fastfair_write.cc
  Status LockAt(uint32_t level, const SK& key, Pending* pend, Node** out, bool grow = true);
  Status AllocBlock(uint64_t* dest, Slice s);
  __attribute__((always_inline)) inline Status InsertLeafEntry(Node* t, uint32_t pos, const SK& key, Slice value);
  __attribute__((always_inline)) inline Status UpdateAt(Node* n, uint32_t pos, Slice value, BlockClaims* bc);
  Status Put(Slice key, Slice value, Mode mode);
  __attribute__((always_inline)) inline Status PutIn(Slice key, Slice value, Mode mode, BlockClaims* bc);
  __attribute__((always_inline)) inline Status RemoveIn(const SK& sk, BlockClaims* bc);
  // fastfair_retire.cc
  Status ClaimBlocks(int n, BlockClaims* c);
  void OwnBlock(BlockClaims* c, uint64_t block, Node* leaf);
  void BlocksUnlinked(BlockClaims* c);
  void EndBlocks(BlockClaims* c);
  void ReclaimBlocks(bool all);
  bool BlockLinked(const kit::RetireSlot& s) const;
  void RecoverBlocks();
  // fastfair_smo.cc
  Status Split(Node* n, uint64_t* out_k, Node** out_s, bool append = false);
  Status SplitAt(Node* n, uint32_t m, uint64_t* out_k, Node** out_s, bool centre = false);
  Status GrowRoot(uint32_t level);
  Status InsertInternal(uint32_t level, uint64_t K, uint64_t child, bool* inserted = nullptr);
  void EnsurePending(const Pending& pend);
  int ClaimSlot();
  void Reclaim(bool all);
  Node* MergeStep(Node* x);
  bool MergeUnder(Node* p, Node* x, uint64_t xlow, int slot, Pending* pend);
  bool Rebalance(Node* p, uint32_t sep, Node* l, Node* r, int slot);
  void DoMerge(Node* p, uint32_t sep, Node* l, Node* r, int slot);
  void CollapseRoot(Node* p);
  // fastfair_recovery.cc
  void RecoverLimbo();
  uint64_t LimboKeyBlock(const kit::RetireSlot& s) const;
  void FreeLimboExtra(const kit::RetireSlot& s);
  bool LimboLinked(const kit::RetireSlot& s) const;
  void UndoMerge(Node* l, Node* r);
  bool Referenced(Node* n, uint64_t b) const;
  void Repair(Node* n, Pending* pend);


  // ---- members -----------------------------------------------------------
  std::unique_ptr<pm::Pool> pool_;
  char* base_;
  pm::Allocator* alloc_;
  Options opts_;
  Meta* meta_ = nullptr;
  uint64_t gen_ = 0;
  const uint32_t node_size_;
  const uint32_t merge_below_;  // a non-root node with fewer records is underfull
  const bool bv_;
  const ValueKind vk_;
  const bool locked_reads_;
  bool read_only_ = false;  // opened read-only: no node is repaired, any may lag
  // Set by Close; every public member answers IndexClosed() (or 0, empty)
  // from then on. Close runs when no other call does: a plain flag.
  bool closed_ = false;
  const uint64_t max_off_;  // the pool's reserved address range (scan prefetch bound)
  const kit::BoundedWalk walk_;  // the walk bound at open (Walk, Step)
  // The pool's size when last looked at (ViewBlock; only grows).
  mutable std::atomic<uint64_t> pool_bytes_;
  kit::LockTable<NodeLock> locks_;  // DRAM lock words (LockOf)
  // Retire slots in Meta::limbo (set up by Format / Recover).
  std::optional<kit::PmRetireList> limbo_;
  // Retire slots of key/value blocks in Meta::blocks (byte keys or values;
  // set up by Format / Recover), and when their next Reclaim is due (as
  // reclaim_at_ for limbo_).
  std::optional<kit::PmRetireList> blocks_;
  std::atomic<uint64_t> blocks_reclaim_at_{0};
  std::atomic<uint64_t> blocks_freed_{0};
  EpochManager epoch_;  // guards every public operation (lock-free readers)
  // Read-only open: left nodes of merges that did not commit (see Recover).
  std::vector<uint64_t> ro_undo_;
  std::atomic<uint64_t> merges_{0}, root_collapses_{0}, nodes_freed_{0}, merges_skipped_{0}, rebalances_{0},
      rebalances_from_right_{0};
  std::mutex root_mu_;
  uint64_t open_blocks_freed_ = 0, open_pm_stores_ = 0, open_pm_lines_ = 0;
  std::atomic<uint64_t> nodes_repaired_{0}, splits_repaired_{0}, parents_repaired_{0}, root_grows_{0};
  std::atomic<uint64_t> counts_repaired_{0};
  std::atomic<uint64_t> prefix_splits_{0};
  mutable std::atomic<uint64_t> read_flushes_{0};
  std::atomic<uint64_t> lf_lock_fallbacks_{0}, reclaims_{0};
  // Remove reclaims only when one is due: 0, or the epoch after the last
  // Reclaim that left nodes waiting (they are free to go once every
  // announced epoch is at least this). A hint: relaxed.
  std::atomic<uint64_t> reclaim_at_{0};
};

}  // namespace pmindex::internal::fastfair
