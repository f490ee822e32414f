// epoch.h: epoch-based reclamation (EBR) of memory that lock-free readers may
// still be reading, shared by every index (fptree's deleted leaves and inner
// nodes, fastfair's merged nodes in limbo slots, nvc_hashmap's removed nodes
// and replaced value records). DRAM-side bookkeeping only: nothing here is
// stored to PM, so it never changes an index's persist order or PM format.
//
// Use (one EpochManager per open index, never process-wide: a long reader of
// one index then does not hold back another's frees, and a thread inside a
// guard of index A may call index B, even to wait for B's grace period):
//
//   { EpochManager::Guard g(epoch_);   // around every lock-free read
//     ... read nodes a concurrent writer may unlink ... }
//   writer: unlink x (no guard that begins afterwards can reach it), then
//     either   epoch_.Synchronize(); free(x);      // blocking, outside any guard of epoch_
//     or       list.Add(x); ... list.Reclaim(epoch_, free);   // deferred (RetireList)
//
// Model. The manager has a counter epoch_ (starts at 1, only ever increased
// by RMWs) and one slot per participating thread. A slot's `announced` word
// is 0 while its thread is outside every guard of this manager, else the
// epoch it read when its outermost guard began. Advance() increments the
// counter and returns the old value t: an object unlinked before Advance()
// returned t may be freed once MinAnnounced() > t (no slot announces an
// epoch <= t), read after that Advance.
//
// Why that is safe (memory orders). Entering a guard stores the epoch it read
// (seq_cst), then re-reads the counter (seq_cst) and repeats until both
// agree. Take an object x unlinked, then t = Advance() (a seq_cst RMW), then
// a scan of the slots (seq_cst loads) with every announcement 0 or > t:
//  - a slot whose final announcement a > t: a was read from the RMW that
//    produced t + 1 or a later one; all writes of the counter are RMWs, so
//    that read synchronizes with our Advance (release sequence). The reader
//    happens-after the unlink and cannot find x.
//  - a slot read as 0 (or not yet bound: the high-water mark is raised,
//    seq_cst, before the first announcement): either the thread left its
//    guard (its release store of 0, read by our acquire load, orders all its
//    reads of x before our free), or its announcement store comes after our
//    load in the seq_cst order; its re-read of the counter then comes after
//    our Advance too, reads a value > t, and the first case applies.
// Guards nest per thread and manager (depth counter); only the outermost
// announces and leaves. The re-read costs one load of a line that is
// written only by Advance (rare: once per retired batch or per grace
// period), so it normally hits the cache.
//
// Threads and slots. A thread binds a slot of a manager at its first guard
// and keeps it until it exits (released then, see "Thread exit"). No fixed
// limit by default: slots come in chunks of 64, added when all are taken
// (kept until the manager is destroyed: 64 bytes per slot).
// An index whose per-thread state is bounded (nvc_hashmap: 256 persistent
// thread slots, format-bound) passes max_slots; a guard that finds no free
// slot then reports !ok() and the operation returns Busy. Slot indices are
// dense from 0 and stable while bound, so an index may keep per-thread state
// in arrays indexed by Guard::slot(); ownership passes from thread to thread
// through the slot's `used` flag (release/acquire).
// The fast path (a guard on a manager the thread used recently) is one
// initial-exec TLS access (a 4-entry fully associative cache, filled round
// robin on a miss, keyed by the manager's unique id, never reused, so a stale entry of a destroyed manager never matches), no
// lock, one seq_cst store, two loads of the counter and one release store.
// Measured against the three private copies it replaced (callgrind,
// instructions per operation, `valgrind --tool=callgrind
// build/bin/fptree_opcost --index dram_btree,fptree,fastfair,nvc_hashmap
// --records 50000 --ops 20000`, old library via LD_LIBRARY_PATH): find
// fptree 565 -> 547, fastfair 1190 -> 1160, nvc_hashmap 585 -> 561; fptree
// scan of 100 9722 -> 9843 (+1.2%: one more load per record in Scan's
// callback loop, register allocation of that large function, not the guard's
// own work); other operations within +-4 or lower.
//
// Thread exit: the binding list is released by a pthread_key destructor,
// which glibc runs after every thread_local destructor (operations run from
// thread_local destructors keep the thread's slot) and runs again when
// another pthread_key destructor binds a slot anew (the key is set again),
// up to PTHREAD_DESTRUCTOR_ITERATIONS rounds. Once the list was released,
// the thread is `exiting` (a trivially destructible flag): from then on a
// guard takes a slot for its own duration (transient) and gives it back
// when it ends. A slot whose guard is still open when the list is released
// becomes transient too. So no slot leaks, whether a thread's guards run
// from its body, from thread_local destructors or from pthread_key
// destructors; the one exception is a thread whose first guard of all runs
// from a pthread_key destructor in the last round (its slots are released
// by no one). Tests in epoch_test.cc.
//
// Manager lifetime: no guard may be active and no thread may be inside an
// operation when it is destroyed (the index contract). Threads that still
// have it bound drop the binding lazily (a process-wide registry of live
// manager ids, consulted only on the slow paths, under one mutex).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

namespace pmindex::internal {

struct alignas(64) EpochSlot {
  std::atomic<uint64_t> announced{0};  // 0: quiescent; else the epoch its outermost guard entered at
  std::atomic<bool> used{false};       // bound to a thread (or to a transient guard)
  uint32_t depth = 0;                  // bound thread only: open guards
  bool transient = false;              // bound thread only: release when the outermost guard ends
  uint32_t index = 0;                  // dense slot number (Guard::slot())
};

// The per-thread cache of bindings (epoch.cc). Trivially destructible and
// constant-initialised, so it stays usable during thread exit and the
// compiler reaches it without a TLS wrapper call.
struct EpochTlsCache {
  static constexpr int kWays = 4;
  uint64_t id[kWays];
  EpochSlot* slot[kWays];
  uint8_t next;  // the way a miss fills next (round robin)
  bool exiting;  // the thread's binding list was destroyed (thread exit)
};
extern constinit thread_local EpochTlsCache tl_epoch_cache __attribute__((tls_model("initial-exec")));

class EpochManager {
 public:
  static constexpr uint32_t kUnbounded = 0;
  static constexpr uint32_t kChunk = 64;  // slots per chunk

  // max_slots: kUnbounded, or the most threads that may be inside guards at once.
  explicit EpochManager(uint32_t max_slots = kUnbounded);
  ~EpochManager();
  EpochManager(const EpochManager&) = delete;
  EpochManager& operator=(const EpochManager&) = delete;

  // RAII read-side critical section. ok() is false only with max_slots set
  // and every slot bound to another thread (the guard then protects nothing).
  class Guard {
   public:
    explicit Guard(EpochManager& m, bool on = true) {
      if (!on) return;
      EpochSlot* s = m.CachedSlot();
      if (__builtin_expect(s == nullptr, 0)) s = m.BindSlow();
      s_ = s;
      if (s && s->depth++ == 0) m.Announce(s);
    }
    ~Guard() {
      if (s_ && --s_->depth == 0) Leave(s_);
    }
    bool ok() const { return s_ != nullptr; }
    // This thread's slot number in the manager (ok() only).
    uint32_t slot() const { return s_->index; }
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;

   private:
    EpochSlot* s_ = nullptr;  // the only state: keeps the guard to one register
  };

  // Increments the epoch; returns the old value t. Objects unlinked before
  // the call may be freed once MinAnnounced() > t.
  uint64_t Advance() { return epoch_.fetch_add(1, std::memory_order_seq_cst); }
  // The smallest epoch announced by a thread inside a guard (UINT64_MAX: none).
  uint64_t MinAnnounced() const;
  // Waits until every guard that was open when it was called has ended
  // (objects unlinked before the call may be freed when it returns). Must
  // not be called inside a guard of this manager (it would wait for itself).
  void Synchronize();
  // 1 + the highest slot number ever bound (the slots to visit for per-slot state).
  uint32_t SlotCount() const { return hwm_.load(std::memory_order_acquire); }
  uint64_t Epoch() const { return epoch_.load(std::memory_order_relaxed); }
  // Tests: SlotCount() of every live manager of the process (any order);
  // leaked slots make it grow with sequential threads.
  static std::vector<uint32_t> LiveSlotCounts();

 private:
  friend struct EpochThreadBindings;
  struct Chunk {
    EpochSlot slots[kChunk];
    std::atomic<Chunk*> next{nullptr};
  };

  // Fully associative: every way is compared (ids come from one process-wide
  // counter, so a direct-mapped cache would make two indexes used alternately
  // by one thread collide one time in four, every guard then taking BindSlow).
  EpochSlot* CachedSlot() const {
    const EpochTlsCache& c = tl_epoch_cache;
    for (int w = 0; w < EpochTlsCache::kWays; w++)
      if (c.id[w] == id_) return c.slot[w];
    return nullptr;
  }
  static void CacheFill(uint64_t id, EpochSlot* s);
  void Announce(EpochSlot* s) {
    uint64_t e = epoch_.load(std::memory_order_seq_cst);
    for (;;) {
      s->announced.store(e, std::memory_order_seq_cst);
      const uint64_t e2 = epoch_.load(std::memory_order_seq_cst);
      if (e2 == e) return;
      e = e2;
    }
  }
  static void Leave(EpochSlot* s) {
    s->announced.store(0, std::memory_order_release);
    if (__builtin_expect(s->transient, 0)) ReleaseTransient(s);
  }
  EpochSlot* BindSlow();
  EpochSlot* TakeFreeSlot();
  static void ReleaseTransient(EpochSlot* s);
  static void Release(EpochSlot* s);

  alignas(64) std::atomic<uint64_t> epoch_{1};
  const uint64_t id_;            // unique, never reused (TLS cache key)
  const uint32_t max_slots_;     // 0: unbounded
  std::atomic<uint32_t> hwm_{0};  // 1 + highest slot number ever bound
  Chunk* head_;                  // first chunk (never null), others linked by next
  std::mutex grow_mu_;           // appending chunks
};

// Retired objects of one index (or one thread slot) awaiting their grace
// period. Not thread-safe: the owner serialises Add/Reclaim (a mutex, or
// one thread). Add() does not touch shared state; the next Reclaim() stamps
// everything added since with one Advance() (so retiring costs no write to
// the shared epoch line), then frees every entry whose stamp is below the
// smallest announced epoch. An entry added by another thread must have been
// added under the lock the reclaiming thread holds (that orders its unlink
// before the Advance).
template <typename T>
class RetireList {
 public:
  void Add(T x) {
    items_.push_back({std::move(x), kUnstamped});
    unstamped_++;
  }
  // Calls free_fn(x) for (and drops) every entry whose grace period has
  // passed; returns how many. Call it outside any guard of m for this
  // thread's own entries to go (an open guard holds back what it could see).
  template <typename F>
  size_t Reclaim(EpochManager& m, F&& free_fn) {
    if (items_.empty()) return 0;
    if (unstamped_) {
      const uint64_t t = m.Advance();
      for (auto& it : items_)
        if (it.second == kUnstamped) it.second = t;
      unstamped_ = 0;
    }
    const uint64_t min = m.MinAnnounced();
    size_t keep = 0, freed = 0;
    for (size_t i = 0; i < items_.size(); i++) {
      if (items_[i].second < min) {
        free_fn(items_[i].first);
        freed++;
      } else {
        if (keep != i) items_[keep] = std::move(items_[i]);
        keep++;
      }
    }
    items_.resize(keep);
    return freed;
  }
  // Frees every entry: only when no thread can be inside a guard (close).
  template <typename F>
  size_t ReclaimAll(F&& free_fn) {
    for (auto& it : items_) free_fn(it.first);
    const size_t n = items_.size();
    items_.clear();
    unstamped_ = 0;
    return n;
  }
  template <typename F>
  void ForEach(F&& fn) const {
    for (const auto& it : items_) fn(it.first);
  }
  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  size_t dram_bytes() const { return items_.capacity() * sizeof(items_[0]); }

 private:
  static constexpr uint64_t kUnstamped = UINT64_MAX;
  std::vector<std::pair<T, uint64_t>> items_;
  size_t unstamped_ = 0;
};

}  // namespace pmindex::internal
