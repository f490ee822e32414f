// clfbtree_tree.h: the clfB-tree as an Index (clfB-tree, ACM TOS 2018;
// docs/clfbtree.md). One class for both key kinds and both value kinds
// (chosen at run time), both leaf kinds and the three parent-update methods.
// Implemented in clfbtree_write.cc (leaf operations), clfbtree_smo.cc
// (splits, leaf frees, the three parent-update methods), clfbtree_read.cc
// (lock-free Find, Scan, Size), clfbtree_recovery.cc (Format, open, Check,
// ForEachOwnedBlock) and clfbtree.cc (options, factory, registration).
//
// Concurrency: every node has a version lock (kit/version_lock.h) in a
// DRAM lock table (kit/lock_table.h), never in PM. Readers take no lock: a
// reader copies a node with atomic loads and validates its version. Writers
// on append leaves with u64 keys and values first try FastWrite without
// write_mu_: an optimistic descent, then the leaf's lock by try-lock from
// the version read after its parent validated; a change that stays inside
// the leaf (insert into a free slot, update, delete that leaves an entry)
// is done under that lock alone, so writers on different leaves run in
// parallel. Everything else (a split, a leaf that becomes empty, byte keys
// or values, encoded leaves, a busy node) runs one at a time under
// write_mu_, which is why one SmoLog and one LineLog in Meta suffice: such a
// writer locks the append leaf before reading it and keeps it to the end of
// the change, waiting for a FastWrite holder (which never waits while
// holding). A writer locks a node from before its first store to it until
// after the fence that makes the change durable (so a validated read saw
// only durable state), and marks a node it unlinks obsolete. Unlinked
// nodes and blocks are freed after an epoch grace period (kit/epoch.h),
// owned by the SmoLog until then; no lock is held across that wait and
// write_mu_ is taken outside every epoch guard. DRAM hints, none of them
// persistent: the leaf fingerprint filters (clfbtree_leaf_filter.h), the
// route table of u64 descents (clfbtree_route.h) and the scans' sort cache.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "clfbtree/clfbtree_format.h"
#include "clfbtree/clfbtree_leaf_filter.h"
#include "clfbtree/clfbtree_node.h"
#include "clfbtree/clfbtree_route.h"
#include "clfbtree/clfbtree_sort_cache.h"
#include "core/index_util.h"
#include "kit/epoch.h"
#include "kit/lock_table.h"
#include "kit/version_lock.h"
#include "pmindex/pm/allocator.h"
#include "pmindex/pm/pool.h"

namespace pmindex::internal::clfbtree {

// Lines written (flushed or written atomically) per kind of step, for the
// paper's tables 1 and 2 (counted only when Config::tally is set).
struct Tally {
  uint64_t inner_update = 0;  // in-place updates of an existing inner node
  uint64_t inner_split = 0;   // new inner nodes (splits, shadows, new roots)
  uint64_t leaf_split = 0;    // new leaves of a leaf split
  uint64_t leaf_plain = 0;    // leaf inserts that do not split
  uint64_t leaf_splits = 0, inner_splits = 0, shadows = 0, cascades = 0;
};

struct Config {
  KeyKind kk = KeyKind::kU64;
  ValueKind vk = ValueKind::kU64;
  LeafKind leaf = kAppendLeaf;
  Method method = kInPlace;
  uint32_t leaf_size = 1024;
  bool emulated = false;
  bool tally = false;
};

class ClfBTree final : public Index {
 public:
  ClfBTree(std::unique_ptr<pm::Pool> pool, const Options& o, const Config& c);
  ~ClfBTree() override { Close(); }

  std::string_view Name() const override { return "clfbtree"; }
  KeyKind key_kind() const override { return c_.kk; }
  ValueKind value_kind() const override { return c_.vk; }
  Status Insert(Slice key, Slice value) override { return Write(key, value, kInsert); }
  Status Update(Slice key, Slice value) override { return Write(key, value, kUpdate); }
  Status Upsert(Slice key, Slice value) override { return Write(key, value, kUpsert); }
  Status Find(Slice key, std::string* value) override;
  Status Remove(Slice key) override;
  Status Scan(Slice start, size_t n, ScanCallback cb, size_t* count) override;
  uint64_t Size() override;
  Status Check() override;
  Status ForEachOwnedBlock(const std::function<void(uint64_t)>& fn) override;
  IndexStats Stats() override;
  pm::Pool* pool() override { return closed() ? nullptr : pool_.get(); }
  Status Close() override;

  Status Format();
  Status Recover();
  const Config& config() const { return c_; }
  Tally tally() const { return tally_; }
  // Figure 5: histograms (index = bytes, 1..8) of the key and pointer
  // widths of every encoded node, and the utilisation sum (entries per
  // node over the unencoded capacity). Not concurrent with writers.
  void Widths(uint64_t key_w[9], uint64_t ptr_w[9], uint64_t* nodes, double* utilisation);
  // Tests: the SmoLog's old-block slots a structure change may use (1 to
  // kLogSlots), to reach a full log without a tree of kLogSlots levels.
  void LimitLogSlotsForTest(int n) { log_slots_ = std::max(1, std::min(n, kLogSlots)); }

  double recovery_seconds_ = 0;
  std::atomic<uint64_t> restored_lines_{0};

 private:
  enum Mode { kInsert, kUpdate, kUpsert };
  enum Expect : uint64_t { kNoChild = 0, kChild = 1, kWordEq = 2, kBitsSet = 3, kBitsClear = 4, kKeyAbsent = 5, kKeyPresent = 6 };
  struct PathEnt {
    uint64_t off;
    Decoded d;
    uint32_t idx;  // the child taken
  };
  using Path = std::vector<PathEnt>;
  using Line = uint8_t[64];

  bool closed() const { return closed_.load(std::memory_order_relaxed); }
  bool bk() const { return c_.kk == KeyKind::kBytes; }
  bool vb() const { return c_.vk == ValueKind::kBytes; }
  bool encoded() const { return c_.leaf == kEncodedLeaf; }
  uint64_t LeafBytes() const { return encoded() ? 64 : c_.leaf_size; }
  template <typename T = uint8_t>
  T* At(uint64_t off) const { return reinterpret_cast<T*>(base_ + off); }
  kit::VersionLock& VL(uint64_t off) const { return *locks_.At(base_ + off); }
  // A node inside the pool: checked against the last size seen first (a
  // pool only grows while open), then against the pool's current size.
  bool NodeOk(uint64_t off, uint64_t bytes) const {
    if (!off || off % 64 || off + bytes < off) return false;
    if (off + bytes <= size_seen_.load(std::memory_order_relaxed)) return true;
    const uint64_t s = pool_->size();
    size_seen_.store(s, std::memory_order_relaxed);
    return off + bytes <= s;
  }
  uint64_t* Bitmap(uint64_t leaf) const { return At<uint64_t>(leaf + c_.leaf_size - 8 * bm_words_); }
  uint64_t* Ent(uint64_t leaf, uint32_t i) const { return At<uint64_t>(leaf + 16 * i); }
  // The fingerprint filter of append leaf `leaf` (nullptr: no filters).
  LeafFilter* Filter(uint64_t leaf) const { return filters_.mapped() ? filters_.At(At(leaf)) : nullptr; }

  // Keys and values as words (clfbtree_write.cc).
  bool CmpKey(uint64_t kw, Slice key, int* cmp) const;
  bool KeyString(uint64_t kw, std::string* out) const;
  bool ValueString(uint64_t vw, std::string* out) const;
  int CmpWords(uint64_t a, uint64_t b) const;
  // Reads a node line with atomic loads.
  void ReadLine(uint64_t off, uint8_t out[64]) const {
    const uint64_t* w = At<uint64_t>(off);
    for (int i = 0; i < 8; i++) {
      const uint64_t x = LdR(w + i);
      std::memcpy(out + 8 * i, &x, 8);
    }
  }
  // The same followed by 8 zero bytes, for RouteU64Padded.
  using PadLine = uint8_t[72];
  void ReadLinePadded(uint64_t off, PadLine out) const {
    ReadLine(off, out);
    std::memset(out + 64, 0, 8);
  }
  void WriteLine(uint64_t off, const uint8_t img[64]);
  // Upper bound: the index of the child for key in d (keys <= key).
  bool ChildIndex(const Decoded& d, Slice key, uint32_t* idx) const;

  // clfbtree_write.cc
  Status Write(Slice key, Slice value, Mode mode);
  Status DescendW(Slice key, Path* path, uint64_t* leaf);
  Status AppendLeafWrite(Path& path, uint64_t leaf, Slice key, Slice value, Mode mode);
  Status EncodedLeafWrite(Path& path, uint64_t leaf, Slice key, Slice value, Mode mode, bool remove);
  Status AppendLeafRemove(Path& path, uint64_t leaf, Slice key);
  // A write or remove on an append leaf without write_mu_ (u64 keys and
  // values): true if it completed (*st its answer), false if the locked
  // path must run it (a split, a leaf that becomes empty, a busy node).
  bool FastWrite(Slice key, Slice value, Mode mode, bool remove, Status* st);
  // An append leaf's slot of key (*found, -1 if absent), its first free
  // slot (-1 if full) and its number of valid entries.
  bool LeafScanU64(uint64_t leaf, uint64_t key, int* found, int* free_slot, uint32_t* live) const;
  // The same through the leaf's valid filter f (the caller holds the lock).
  void LeafProbeU64(uint64_t leaf, const LeafFilter& f, uint64_t key, int* found, int* free_slot, uint32_t* live) const;
  // Rebuilds the filter f of leaf `leaf` from its entries (the lock holder).
  void RebuildFilter(uint64_t leaf, LeafFilter* f) const;
  Status FindInLeaf(uint64_t leaf, Slice key, int* found, int* free_slot, uint32_t* live) const;
  // The append commit: entry, flush, fence, bitmap bit, persist.
  void StoreEntry(uint64_t leaf, uint32_t i, uint64_t kw, uint64_t vw);
  Status NewWord(Slice s, bool is_key, int* slot, uint64_t* word);
  void Lock(uint64_t off);
  // A plain release store (only the holder stores to a locked word).
  void Unlock(uint64_t off) { VL(off).UnlockStore(); }

  // clfbtree_smo.cc
  // Replaces child path[j].idx of path[j] (j == -1: the root) by kids with
  // separators seps (kids empty: removes it), with the parent-update method.
  Status ReplaceChild(Path& path, int j, std::vector<uint64_t> kids, std::vector<uint64_t> seps, bool kids_leaves);
  // Updates node off (path[j], or a leaf when j == path size) to image img
  // with the method: in place (atomic, inplace) or by a shadow (shadow).
  // probe/expect: the SmoLog's commit test when blocks are logged.
  Status UpdateNode(Path& path, int j, uint64_t off, const uint8_t img[64], bool is_leaf, uint64_t probe,
                    Expect expect);
  void InPlaceLine(uint64_t off, const uint8_t img[64]);
  // Splits an overfull node's contents into encoded nodes allocated into the
  // log; *out their offsets, *seps the separators between them.
  Status Pack(const std::vector<uint64_t>& k, const std::vector<uint64_t>& p, bool leaf, bool kids_leaves,
              std::vector<uint64_t>* out, std::vector<uint64_t>* seps);
  Status SplitAppendLeaf(Path& path, uint64_t leaf, uint64_t kw, uint64_t vw);
  Status FreeEmptyLeaf(Path& path, uint64_t leaf, bool held);
  // The SmoLog: new blocks owned until commit, old ones freed after it.
  int LogNew();
  Status AllocNode(uint64_t bytes, uint64_t* off);
  // held: the node is already locked by this writer (an append leaf).
  // Busy when the log has no free slot: the caller aborts the change.
  [[nodiscard]] Status LogOld(uint64_t off, bool node, bool held = false);
  void Arm(uint64_t anchor, uint64_t probe, Expect e);
  void FinishSmo();
  void AbortSmo();  // nothing was committed: frees newn, forgets oldn
  bool Committed() const;
  struct Mark {
    uint64_t lines, excluded;
  };
  Mark Now() const;
  // Lines the allocator and the SmoLog write are not the paper's: kept out
  // of the tally (they show in the total per insert).
  struct Exclude {
    const ClfBTree* t;
    Mark m;
    explicit Exclude(const ClfBTree* tree) : t(tree), m(tree->Now()) {}
    ~Exclude() { t->excluded_ += t->Now().lines - m.lines; }
  };
  void TallyAdd(uint64_t* field, const Mark& before) const;

  // clfbtree_read.cc
  // One inner node of a lock-free descent, whose version v the caller read
  // from vl: the line copied, the child for key chosen (*child, and whether
  // it is a leaf), the separator above it (*sep, the key word; *has_sep
  // false when the child is the last; byte keys: its key copied into
  // *sep_key when given), the version validated after every read.
  enum class Step { kNext, kRestart, kCorrupt };
  Step RouteInner(uint64_t off, const kit::VersionLock& vl, uint64_t v, Slice key, uint64_t* child, bool* kids_leaves,
                  uint64_t* sep, bool* has_sep, std::string* sep_key = nullptr) const;
  Step RouteInnerBytes(uint64_t off, const kit::VersionLock& vl, uint64_t v, Slice key, uint64_t* child,
                       bool* kids_leaves, uint64_t* sep, bool* has_sep, std::string* sep_key) const;
  // v: the leaf's version from the caller's ReadBegin.
  Status ReadLeaf(uint64_t leaf, uint64_t v, Slice key, std::string* value, bool* found) const;
  struct ScanEnt {
    uint64_t k, v;
    uint32_t slot;
  };
  Status ScanU64(uint64_t cursor, size_t n, const ScanCallback& cb, size_t* count);
  // Up to `want` entries of append leaf `leaf` at or above cursor, in key
  // order, from the sort cache entry e for leaf version v; false on a miss.
  bool CachedLeafRange(uint64_t leaf, uint64_t v, uint64_t cursor, size_t want, ScanEnt* out, size_t* n,
                       const SortCacheEntry* e) const;

  // clfbtree_route.cc (under write_mu_, or before the index is shared)
  // Builds and publishes a route table when route_dirty_ (or none when the
  // tree is too shallow for one to help).
  void MaybeRebuildRoute();
  // Publishes t (may be null); the old table goes to route_retired_, freed
  // after the next epoch grace period (FreeRetiredRoutes).
  void PublishRoute(RouteTable* t);
  void FreeRetiredRoutes();
  // Records that path node `from` at depth j is replaced by `to` (seps
  // between; hint: a key in from's range): applied by FinishSmo before its
  // grace period, dropped by AbortSmo.
  void NoteReplaced(int j, uint64_t from, uint64_t hint, const std::vector<uint64_t>& to,
                    const std::vector<uint64_t>& seps);
  void ApplyRouteChange();
  // Check's part for the DRAM hints: the route table matches the tree, and
  // every valid leaf filter holds its leaf's keys.
  Status CheckHints();
  // The first node of a u64 descent for key: a route table node, else the
  // root word (bit 0: a leaf).
  uint64_t StartWord(uint64_t key, bool use_route) const {
    if (use_route)
      if (const RouteTable* t = route_.load(std::memory_order_acquire)) return t->Lookup(key);
    return Ld(&meta_->root);
  }

  // clfbtree_recovery.cc
  Status WalkNodes(const std::function<Status(uint64_t off, bool leaf, const Decoded* d, int depth)>& fn);
  Status RecoverSmo();
  void MapHints();  // the sort cache and the leaf filters (DRAM hints)
  Status CheckRanges(uint64_t off, bool leaf, const std::string* lo, const std::string* hi, int depth);

  Config c_;
  std::unique_ptr<pm::Pool> pool_;
  char* base_ = nullptr;
  pm::Allocator* alloc_ = nullptr;
  Meta* meta_ = nullptr;
  uint32_t cap_ = 0, bm_words_ = 1;
  size_t max_key_, max_value_;
  kit::LockTable<kit::VersionLock> locks_;
  kit::LockTable<SortCacheEntry> sort_cache_;  // append leaves, u64 keys (unmapped: no cache)
  kit::LockTable<LeafFilter> filters_;         // append leaves, FastWrite configurations (unmapped: none)
  EpochManager epoch_;
  bool fast_writes_ = false;  // FastWrite applies: append leaves, u64 keys and values
  std::mutex write_mu_;
  std::vector<uint64_t> locked_old_;  // nodes of the SMO in flight to mark obsolete
  int log_slots_ = kLogSlots;  // SmoLog::oldn slots LogOld may use (fewer only in tests)
  bool repair_ = false;    // WalkNodes restores invalid nodes (open only)
  bool log_used_ = false;  // the SmoLog holds something (DRAM mirror)
  std::vector<uint64_t> locked_new_;
  Path wpath_;  // the locked writers' descent (write_mu_), reused: no allocation per descent
  std::vector<uint64_t> scratch_k_, scratch_p_;  // ReplaceChild's node contents (write_mu_)
  Tally tally_;
  mutable uint64_t excluded_ = 0;  // tally: allocator and log lines (writer only)
  std::atomic<bool> closed_{false};
  // The route table (u64 keys; clfbtree_route.h) and its writer-side state
  // (write_mu_): the depth of its nodes in the current tree (-1: none),
  // whether to rebuild it, the replacement to apply at the SMO's end.
  std::atomic<RouteTable*> route_{nullptr};
  int route_depth_ = -1;
  bool route_dirty_ = true;
  struct {
    bool has = false, bad = false;
    uint64_t from = 0, hint = 0;
    std::vector<uint64_t> to, seps;
  } route_change_;
  std::vector<RouteTable*> route_retired_;
  mutable std::atomic<uint64_t> size_seen_{0};  // NodeOk's cache of pool_->size()
};

}  // namespace pmindex::internal::clfbtree
