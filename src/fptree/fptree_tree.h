// fptree/fptree_tree.h: the FPTree family's tree class, FPTree<kConc,
// kBytes> (kConc: the concurrent `fptree`; kBytes: byte keys), with the
// members every operation uses inline: leaf access, leaf locks, block reads,
// the one descent (Descend, FindLeaf) and the one leaf-list walk
// (ForEachLeaf). Format: fptree_format.h; one leaf: fptree_leaf.h; inner
// nodes: fptree_inner.h. The other members are defined by concern, each
// file instantiating what it defines for the four <kConc, kBytes> pairs
// (FPT_INSTANTIATE):
//   fptree.cc           the Index operations (insert/update/delete/find),
//                       options, factories, registration
//   fptree_smo.cc       leaf split and leaf deletion with their micro-logs,
//                       inner-node splits, deferred deletions
//   fptree_group.cc     fptree_single's leaf groups (appendix B)
//   fptree_recovery.cc  creation, open, validation of a damaged pool, recovery
//   fptree_compact.cc   leaf merges and group compaction at open
//   fptree_scan.cc      scans and the scan-order hint
//   fptree_check.cc     Check, owned blocks, introspection for tests
//   fptree_batch.cc     FindMany: a batch of finds with interleaved descents
//   fptree_retire.cc    fptree's retired key/value blocks (epoch + retire list)
//
// Concurrency (fptree): no HTM. DRAM inner nodes use optimistic lock
// coupling (fptree_inner.h). Each leaf has a seqlock word
// (kit/version_lock.h) in a DRAM table indexed by the leaf's pool offset
// (kit/lock_table.h; the paper's "never persisted" leaf lock, without a PM
// line per find): finds and scans read leaves optimistically and validate;
// writers lock the leaf by CAS and do the persistent work outside any
// inner-node critical section. Deleted leaves, the inner nodes a leaf
// deletion removes (unlocked obsolete), their separators, and removed or
// replaced key/value blocks (owned meanwhile by a persistent retire slot)
// are freed after an epoch grace period (kit/epoch.h). No thread waits for a leaf lock while
// holding another lock except by try-lock, and scans take no lock, so the
// scan/insert deadlock of a lock-based FPTree cannot happen.
//
// The leaf word of a leaf at pool offset off is shared over time by the
// leaves at the same table index; it never decreases (a split's new leaf is
// "born locked" at a higher version, NewBorn), so a version read of an
// earlier leaf never validates against a later one. The table is zero at
// open; recovery clears the lock bits of every listed leaf's word (a split
// redone by recovery leaves its new leaf born locked).
//
// Persist order: each file above states the order of the PM stores it
// makes; the inline members here store nothing to PM.
//
// Thread safety: fptree: every Index operation from any thread; Check,
// ForEachOwnedBlock and the introspection hooks not against writers.
// fptree_single, ptree: one thread at a time.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/index_util.h"
#include "fptree/fptree.h"
#include "fptree/fptree_format.h"
#include "fptree/fptree_inner.h"
#include "fptree/fptree_leaf.h"
#include "kit/backoff.h"
#include "kit/bounded_walk.h"
#include "kit/epoch.h"
#include "kit/lock_table.h"
#include "kit/pm_block.h"
#include "kit/retire_list.h"
#include "kit/version_lock.h"
#include "pmindex/pm/allocator.h"
#include "pmindex/pm/persist.h"
#include "pmindex/pm/pool.h"

namespace pmindex::internal::fptree {

using kit::Backoff;
using EpochGuard = EpochManager::Guard;

// Process-wide count of deferred leaf deletions (FPTreeDeferredLeafDeletions).
extern std::atomic<uint64_t> g_deferred_deletions;
// Test hook (SetFPTreeLeafUnlinkedHook in fptree.h); nullptr: none.
extern std::atomic<void (*)(uint64_t)> g_leaf_unlinked_hook;

// What an existing pool's root object is (fptree_recovery.cc): *fresh if it
// is to be formatted (absent, or a crashed creation), *pm_config if that
// creation had allocated its first leaf (format with the root's config).
Status ClassifyRoot(pm::Pool* pool, uint8_t v, bool* fresh, bool* pm_config);

// Test/figure introspection (fptree.h: FPTreeShape).
struct FPTreeIntrospect {
  virtual void Shape(uint64_t* inner_nodes, uint64_t* leaves) = 0;
  virtual void HomeShare(uint64_t* at_home, uint64_t* records) = 0;
  virtual bool LeafVersionWords(std::string* why) = 0;
  virtual void PmWords(FPTreePmWords* out) = 0;
  virtual void InEpoch(const std::function<void()>& fn) = 0;
};

template <bool kConc, bool kBytes>
class FPTree final : public Index, public FPTreeIntrospect {
 public:
  // A record read out of a leaf (owned copies of byte keys/values).
  struct Rec {
    uint64_t k = 0, v = 0;
    std::string ks, vs;
  };

  FPTree(std::unique_ptr<pm::Pool> pool, const Options& o) : pool_(std::move(pool)), opts_(o) {
    base_ = pool_->base();
    reserved_size_ = pool_->max_size();
  }
  ~FPTree() override { Close(); }

  std::string_view Name() const override { return VariantName(variant_); }
  KeyKind key_kind() const override { return kBytes ? KeyKind::kBytes : KeyKind::kU64; }
  ValueKind value_kind() const override { return vbytes_ ? ValueKind::kBytes : ValueKind::kU64; }
  pm::Pool* pool() override { return closed_ ? nullptr : pool_.get(); }

  // fptree_recovery.cc
  Status Format(uint8_t variant, const Options& o, uint32_t m, uint32_t inner, uint32_t group, bool inplace);
  Status Open();

  // fptree.cc
  enum class Mode { kInsert, kUpdate, kUpsert };
  Status Insert(Slice key, Slice value) override { return Put(key, value, Mode::kInsert); }
  Status Update(Slice key, Slice value) override { return Put(key, value, Mode::kUpdate); }
  Status Upsert(Slice key, Slice value) override { return Put(key, value, Mode::kUpsert); }
  Status Find(Slice key, std::string* value) override;
  // fptree_batch.cc
  void FindMany(const Slice* keys, size_t n, std::string* values, Status* statuses) override;
  Status Remove(Slice key) override;
  uint64_t Size() override;
  IndexStats Stats() override;
  Status Close() override;

  // fptree_scan.cc
  Status Scan(Slice start, size_t n, ScanCallback cb, size_t* count) override;

  // fptree_check.cc
  Status Check() override;
  Status ForEachOwnedBlock(const std::function<void(uint64_t)>& fn) override;
  void Shape(uint64_t* inner_nodes, uint64_t* leaves) override;
  void HomeShare(uint64_t* at_home, uint64_t* records) override;
  bool LeafVersionWords(std::string* why) override;
  void PmWords(FPTreePmWords* w) override;
  void InEpoch(const std::function<void()>& fn) override {
    EpochGuard g(epoch_, kConc);
    fn();
  }

 private:
  using Olc = fptree::Olc<kConc>;
  // DRAM objects removed from the inner tree by one leaf deletion, freed
  // after the epoch grace period (no reader can still be inside them).
  struct Retired {
    std::vector<Inner*> nodes;
    std::vector<uint64_t> keys;  // byte-key separator blobs
  };
  // A deferred leaf deletion (fptree_smo.cc).
  struct Deferred {
    uint64_t leaf;
    SKey k;
    std::string ks;  // owns k.s for byte keys
  };
  using KV = std::pair<uint64_t, uint64_t>;
  // Scan lookahead (fptree_scan.cc).
  struct Ahead {
    Inner* parent;  // bottom inner node of the first leaf (nullptr: none)
    uint32_t pos;   // child index of the leaf being read
    uint32_t pf;    // highest child index whose header lines were prefetched
  };
  static constexpr int kKept = -1, kContended = -2;
  static constexpr size_t kScanBatch = 512;
  static constexpr size_t kMaxAhead = 8;
  static constexpr size_t kInnerPrefetchMax = 4096;

  // ---- leaf access ---------------------------------------------------------
  char* L(uint64_t off) const { return base_ + off; }
  static uint64_t* Bm(char* l) { return LeafLayout::Bm(l); }
  static uint8_t* Fp(char* l, int i) { return LeafLayout::Fp(l, i); }
  uint64_t* Key(char* l, int i) const { return lay_.Key(l, i); }
  uint64_t* Val(char* l, int i) const { return lay_.Val(l, i); }
  uint64_t* Next(char* l) const { return lay_.Next(l); }
  // The next pointer for an unlocked reader that goes on to read the next
  // leaf (its version word, bitmap or slots). Acquire, paired with the
  // release store that published the pointer (SplitFinish; an unlink's
  // StorePersist): the new leaf's SplitCopy (plain copy and bitmap stores,
  // its born-locked version word) then happens before the reads. A plain
  // move on x86.
  uint64_t NextAcquire(char* l) const { return __atomic_load_n(Next(l), __ATOMIC_ACQUIRE); }

  // ---- leaf locks (fptree: the DRAM table word; no-ops otherwise) ------------
  kit::VersionLock* Ver(char* l) const { return vtab_.At(l); }
  uint64_t LeafVersion(char* l) const { return kConc ? Ver(l)->Load() : 0; }
  bool LeafValidate(char* l, uint64_t v) const {
    if constexpr (!kConc) return true;
    return Ver(l)->Validate(v);
  }
  bool LeafTryLock(char* l, uint64_t v) {
    if constexpr (!kConc) return true;
    return Ver(l)->TryLock(v);
  }
  void LeafUnlock(char* l, bool obsolete = false) {
    if constexpr (!kConc) return;
    Ver(l)->UnlockStore(obsolete);
  }
  // Unlock of a leaf locked by LeafTryLock(l, lv).
  void LeafUnlockAt(char* l, uint64_t lv) {
    if constexpr (!kConc) return;
    Ver(l)->UnlockFrom(lv);
  }
  // Unlock of a leaf locked by LeafTryLock(l, lv) that the holder did not
  // change (an Insert of a present key, a Remove of an absent one): the
  // word returns to lv, so optimistic readers that read lv still validate.
  void LeafUnlockUnchanged(char* l, uint64_t lv) {
    if constexpr (!kConc) return;
    __atomic_store_n(&Ver(l)->word, uint64_t(lv & ~kit::VersionLock::kBusy), __ATOMIC_RELEASE);
  }

  // ---- keys, values and their blocks -------------------------------------------
  Status WriteBlock(uint64_t* dest, Slice s) { return kit::WriteBlock(pool_->allocator(), base_, dest, s); }
  // False if the offset/length are not plausible (a racing reader saw a
  // stale pointer, and its validation then fails; or a damaged block).
  bool ReadBlock(uint64_t off, size_t maxlen, std::string* out) const {
    return kit::TryReadBlock(base_, pool_->size(), off, maxlen, out);
  }
  SKey MakeKey(Slice k) const { return fptree::MakeKey<kBytes>(k); }
  // The search key of a record read out of a leaf (no fingerprint).
  static SKey RecKey(const Rec& r) {
    SKey sk;
    if constexpr (kBytes) sk.s = r.ks;
    else sk.u = r.k;
    return sk;
  }
  bool SlotKeyEq(char* l, int i, const SKey& k) const {
    tl_probes++;
    uint64_t w = Ld(Key(l, i));
    if constexpr (kBytes) return kit::BlockEquals(base_, pool_->size(), w, k.s);
    else return w == k.u;
  }
  // Matching slot among the valid ones, or -1.
  int FindSlot(char* l, uint64_t bm, const SKey& k) const {
    return fptree::FindSlot(lay_, l, bm, k.fp, [&](int i) { return SlotKeyEq(l, i, k); });
  }
  uint32_t HomeLine(const SKey& k) const { return fptree::HomeLine(lay_, k); }
  char* HomeLineAddr(char* l, const SKey& k) const { return fptree::HomeLineAddr(lay_, l, k); }
  int FreeSlotFor(uint64_t bm, uint32_t line) const { return fptree::FreeSlotFor(lay_, bm, line); }
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

  // ---- the descent and the leaf-list walk (below the class) -----------------------
  enum class Step { kGo, kRetry, kDone };
  template <class At>
  Step Descend(const SKey& k, At& at);
  template <bool kPath>
  uint64_t FindLeafT(const SKey& k, uint64_t* lver, Path* path);
  uint64_t FindLeaf(const SKey& k, uint64_t* lver) { return FindLeafT<false>(k, lver, nullptr); }
  uint64_t FindLeaf(const SKey& k, uint64_t* lver, Path* path) { return FindLeafT<true>(k, lver, path); }
  // The leaf covering k, locked by a writer: LeafTryLock against the
  // version the descent read (*lv), retried with backoff.
  uint64_t FindAndLockLeaf(const SKey& k, uint64_t* lv) {
    for (Backoff bo;; bo.Wait()) {
      const uint64_t loff = FindLeaf(k, lv);
      if (LeafTryLock(L(loff), *lv)) return loff;
    }
  }
  // A list walk's step to leaf nx: false (the caller descends again) if nx
  // is locked or obsolete, else *loff and *lv are nx and its version.
  bool StepTo(uint64_t nx, uint64_t* loff, uint64_t* lv) const {
    const uint64_t nv = LeafVersion(L(nx));
    if (kConc && kit::VersionLock::Busy(nv)) return false;
    *loff = nx;
    *lv = nv;
    return true;
  }
  void PrefetchInner(const Inner* n) const;
  template <class Visit>
  void ForEachLeaf(Visit&& visit) const;

  // ---- record writes, leaf locked (fptree.cc) --------------------------------------
  Status Put(Slice key, Slice value, Mode mode);
  // Retire slots one operation claims before its epoch guard (at most two:
  // a removed record's key and value blocks); the destructor, which runs
  // after the guard, retires the used ones and releases the rest.
  struct Claims {
    FPTree* t = nullptr;
    int slot[2] = {-1, -1};
    int n = 0, used = 0;
    ~Claims() {
      if (t) t->EndClaims(this);
    }
  };
  Status InsertInto(char* l, int s, const SKey& k, Slice value);
  Status UpdateIn(char* l, int old, const SKey& k, Slice value, Claims* rc);
  // ---- retired key/value blocks (fptree_retire.cc) ----------------------------
  Status ClaimRetire(int n, Claims* c);
  void DropBlockWord(uint64_t* w, Claims* c);
  void EndClaims(Claims* c);
  Status RecoverRetired();

  // ---- inner nodes and structure changes (fptree_smo.cc) -----------------------------
  Inner* NewInner(bool bottom);
  void FreeInner(Inner* n);
  uint64_t KeyWordForInner(const SKey& k);
  void FreeKeyWord(uint64_t w);
  void InsertSeparator(const SKey& sep, uint64_t kw, uint64_t right_leaf);
  void SplitInner(Inner* n, Inner* parent);
  int AcquireLog(std::atomic<uint64_t>* mask);
  int TryAcquireLog(std::atomic<uint64_t>* mask);
  void ReleaseLog(std::atomic<uint64_t>* mask, int i);
  bool ChooseSplit(char* l, uint64_t* upper, Rec* sep);
  void SplitCopy(char* l, char* n, uint64_t upper);
  void SplitFinish(char* l, uint64_t noff, uint64_t upper);
  void ResetSplitLog(SplitLog* lg);
  Status SplitLeaf(uint64_t loff, uint64_t* noff, Rec* sep);
  int DeleteEmptyLeaf(uint64_t loff, const SKey& k, Retired* ret);
  void FinishLeafDeletion(int pending, Retired* ret);
  void Defer(uint64_t loff, const SKey& k);
  void ProcessDeferred();
  int TryDeleteLeaf(uint64_t loff, const SKey& k, Retired* ret);
  void CollapseRoot(Inner* r, Retired* ret);
  void LogUnlink(DeleteLog* lg, uint64_t prev, uint64_t cur);
  void RedoUnlink(uint64_t prev, uint64_t cur);
  void FinishDeleteLog(DeleteLog* lg);

  // ---- leaf groups, fptree_single (fptree_group.cc) -----------------------------------
  uint64_t GroupBytes() const { return 64 + uint64_t(group_size_) * lay_.bytes; }
  Status GetLeaf(uint64_t* out);
  void LinkNewGroup();
  void RecoverGetLog();
  std::map<uint64_t, uint32_t>::iterator GroupOf(uint64_t leaf);
  void FreeLeaf(uint64_t leaf);
  void FreeGroup(std::map<uint64_t, uint32_t>::iterator it);
  void FinishFreeGroup();
  bool GroupOk(uint64_t g) const;
  Status GroupWord(const std::string& what, uint64_t g) const;
  Status CheckGroups() const;
  std::map<uint64_t, uint32_t>::iterator GroupOfChecked(uint64_t leaf);

  // ---- open and recovery (fptree_recovery.cc) ------------------------------------------
  void LoadConfig();
  Status MapLeafVersions();
  bool LeafOk(uint64_t x, uint64_t ps) const { return x && x % 64 == 0 && ps >= lay_.bytes && x <= ps - lay_.bytes; }
  bool LeafOk(uint64_t x) const { return LeafOk(x, pool_->size()); }
  Status LeafWord(const std::string& what, uint64_t x) const;
  Status CollectLeaves(std::vector<uint64_t>* out) const;
  Status CheckLogs() const;
  Status Recover();
  void BuildInner(const std::vector<uint64_t>& leaves, std::vector<Rec>& mins);

  // ---- leaf merges and group compaction at open (fptree_compact.cc) ----------------------
  Status CheckMergeLog() const;
  void RedoMerge();
  void RecoverMergeLog();
  void MergeLeaves(uint64_t loff, uint64_t roff);
  void CompactLeaves(std::vector<uint64_t>* leaves, std::vector<Rec>* mins);
  void CompactGroups(std::vector<uint64_t>* leaves);

  // ---- leaf moves at open (fptree_relocate.cc) ----------------------------------------------
  Status CheckMoveLog() const;
  void RecoverMoveLog();
  void ClearMoveLog();
  void RelocateLeaves(std::vector<uint64_t>* leaves);

  // ---- scans (fptree_scan.cc) -------------------------------------------------------------
  static KV* ScanBuffer(std::unique_ptr<KV[]>* own, bool** busy);
  Status ScanU64(uint64_t start, size_t n, ScanCallback cb, size_t* count);
  bool InPool(uint64_t off) const;
  bool InReserved(uint64_t off) const { return off && reserved_size_ >= lay_.bytes && off <= reserved_size_ - lay_.bytes; }
  void PrefetchLeaf(uint64_t off) const;
  void PrefetchAhead(Ahead* a, size_t leaves) const;
  void PrefetchRecords(uint64_t off) const;
  bool ReadLeafSortedU64(char* l, uint64_t lv, uint64_t from, bool incl, size_t room, bool next_header_fetched, KV* out,
                         size_t* nout, bool* truncated, int* cnt_out);
  bool ReadLeafRecs(char* l, uint64_t lv, const SKey& k, bool inclusive, std::vector<Rec>* recs,
                    std::vector<std::pair<Rec, int>>* all, uint64_t* next, bool* corrupt);

  // ---- check (fptree_check.cc) --------------------------------------------------------------
  Status CheckInner(Inner* n, const uint64_t* lo, const uint64_t* hi, std::vector<uint64_t>* inorder, int depth);

  std::unique_ptr<pm::Pool> pool_;
  Options opts_;
  char* base_ = nullptr;
  kit::LockTable<kit::VersionLock> vtab_;  // fptree: leaf lock/version words (MapLeafVersions)
  Root* root_ = nullptr;
  LeafLayout lay_{};
  uint8_t variant_ = 0;
  bool groups_ = false, vbytes_ = false, inplace_ = false, pointers_ = false, closed_ = false;
  uint32_t max_key_ = 0, max_value_ = 0, inner_cap_ = 0, group_size_ = 0;
  // Bytes of an inner node's header + key array that a descent prefetches
  // (PrefetchInner; 0: the node is too wide to prefetch whole).
  uint32_t inner_pf_bytes_ = 0;
  std::atomic<Inner*> root_inner_{nullptr};
  std::mutex nodes_mu_;
  std::vector<Inner*> nodes_;  // live inner nodes (Inner::pos is the index)
  std::mutex deferred_mu_;
  std::vector<Deferred> deferred_;
  std::atomic<size_t> deferred_n_{0};
  std::atomic<uint64_t> dram_bytes_{0};
  EpochManager epoch_;  // fptree: guards of finds, scans and writers; leaf deletions wait for it
  std::unique_ptr<kit::PmRetireList> retire_;  // fptree with byte keys or values (fptree_retire.cc)
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
// The descent: one optimistic attempt from the root toward k. Finds and
// writes (FindLeafT), separator inserts (InsertSeparator) and leaf deletions
// (TryDeleteLeaf) differ only in what they do at each node. For each inner
// node n on the path, read-locked at version v:
//   at.Node(n, v)            kGo, or kRetry (InsertSeparator splits a full
//                            node here and retries)
//   i = UpperBound(n, k), c = child i (acquire)
//   bottom node:             the attempt ends with at.Bottom(n, v, i, c)
//   else at.Down(n, v, i, c) kGo / kRetry (path recording, a prefetch,
//                            extra validation), then the child is
//                            read-locked and n validated, else kRetry.
// No validation of n between the load of c and the read of c's version: c is
// a child word of n, which always holds a node or leaf not yet freed (slots
// past the count keep moved or duplicated children, and a child removed from
// n is freed only after the grace period following its removal, which waits
// for every guard that could still load the removed word). So reading c's
// version is safe; whether c was n's child for k at version v is what the
// Validate(n, v) after that read checks. Callers hold an epoch guard.
template <bool kConc, bool kBytes>
template <class At>
__attribute__((always_inline)) inline auto FPTree<kConc, kBytes>::Descend(const SKey& k, At& at) -> Step {
  Inner* n = root_inner_.load(std::memory_order_acquire);
  uint64_t v = 0;
  if (!Olc::ReadLock(n, &v)) return Step::kRetry;
  if (kConc && n != root_inner_.load(std::memory_order_acquire)) return Step::kRetry;
  for (;;) {
    if (at.Node(n, v) != Step::kGo) return Step::kRetry;
    uint32_t i = UpperBound<kBytes>(n, k);
    uint64_t c = n->child()[i].load(std::memory_order_acquire);
    if (n->bottom) return at.Bottom(n, v, i, c);
    if (at.Down(n, v, i, c) != Step::kGo) return Step::kRetry;
    Inner* cn = reinterpret_cast<Inner*>(c);
    uint64_t cv = 0;
    if (!Olc::ReadLock(cn, &cv)) return Step::kRetry;
    if (!Olc::Validate(n, v)) return Step::kRetry;
    n = cn;
    v = cv;
  }
}

// The leaf covering k: its offset and (fptree) an unlocked version read while
// the bottom parent was still valid. kPath: fill *path (only ScanU64 uses it;
// a separate instantiation, so that finds and writes do not track the path).
template <bool kConc, bool kBytes>
template <bool kPath>
inline uint64_t FPTree<kConc, kBytes>::FindLeafT(const SKey& k, uint64_t* lver, Path* path) {
  struct At {
    FPTree* t;
    const SKey& k;
    uint64_t* lver;
    Path* path;
    uint64_t leaf;
    Step Node(Inner*, uint64_t) { return Step::kGo; }
    Step Down(Inner*, uint64_t, uint32_t, uint64_t c) {
      t->PrefetchInner(reinterpret_cast<Inner*>(c));
      return Step::kGo;
    }
    Step Bottom(Inner* n, uint64_t v, uint32_t i, uint64_t c) {
      char* l = t->L(c);
      // The caller reads line 0 (bitmap, fingerprints) next; start that
      // miss now instead of after the version word's (DRAM table).
      if constexpr (kConc) __builtin_prefetch(l);
      if (!kPath && t->lay_.home_lines > 1) __builtin_prefetch(t->HomeLineAddr(l, k));
      uint64_t lv = t->LeafVersion(l);
      if (kConc && kit::VersionLock::Busy(lv)) {
        // Locked (or being deleted): wait for it without holding anything.
        for (int s = 0; s < 256 && (t->LeafVersion(l) & kit::VersionLock::kLocked); s++) kit::CpuRelax();
        if (t->LeafVersion(l) & kit::VersionLock::kLocked) std::this_thread::yield();
        return Step::kRetry;
      }
      if (!Olc::Validate(n, v)) return Step::kRetry;
      *lver = lv;
      if constexpr (kPath) {
        path->parent = n;
        path->idx = i;
      }
      leaf = c;
      return Step::kDone;
    }
  } at{this, k, lver, path, 0};
  Backoff bo;
  for (bool first = true;; first = false) {
    if (kConc && !first) bo.Wait();
    if (Descend(k, at) == Step::kDone) return at.leaf;
  }
}

// Starts the misses of a whole inner node's header and key array at once,
// before its version is read: UpperBound's binary search is a chain of
// dependent loads over 17 lines (cap 128), each an L2 miss for a node
// below the hot top of the tree; in flight together they cost about one
// miss. Wide nodes (fptree_single's 4096 keys) are not prefetched: their
// top probes stay cached anyway.
template <bool kConc, bool kBytes>
inline void FPTree<kConc, kBytes>::PrefetchInner(const Inner* n) const {
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

// The leaf-list walk: visit(off) for each leaf from the root's head, in list
// order; visit returns the offset of the leaf to visit next (0 ends the
// walk), normally NextAcquire(L(off)). Unbounded: for lists that were
// checked at open (CollectLeaves bounds its own visit).
template <bool kConc, bool kBytes>
template <class Visit>
inline void FPTree<kConc, kBytes>::ForEachLeaf(Visit&& visit) const {
  for (uint64_t x = __atomic_load_n(&root_->head, __ATOMIC_ACQUIRE); x;) x = visit(x);
}

// Explicit instantiation of a file's members for the four trees.
#define FPT_INSTANTIATE_ALL(M) M(false, false) M(false, true) M(true, false) M(true, true)

}  // namespace pmindex::internal::fptree
