// The allocator's volatile (DRAM) state and the PoolAllocator class that the
// allocator files implement together (include/pmindex/pm/allocator.h is the
// interface, allocator_format.h the on-PM format, docs/allocator.md the design):
//   allocator.cc        lifetime (open, shutdown), Check, ForEachAllocated,
//                       and the open-time scan that rebuilds this state;
//   allocator_lanes.cc  thread caches and their lanes, Allocate/Free into a
//                       persistent destination, and the lane replay at open;
//   allocator_runs.cc   size-class runs: formatting, handing out, reclaiming,
//                       and republishing freed blocks;
//   allocator_large.cc  the chunk heap (finding and growing free chunks) and
//                       large blocks.
// The hot helpers (TakeBlock, UsableSize, IsAllocated, LogLane) are inline
// here so that the allocate and free paths keep them inlined.
//
// DRAM state, rebuilt at open from the chunk headers and run bitmaps:
//   per chunk a ChunkSlot (kind, run descriptor or large span), in segments
//   of kSegChunks allocated as the pool grows; per run a copy of the bitmap
//   (vbits: the blocks that may be handed out), a free count and its owner
//   thread; per size class a list of partially free runs; a free-chunk map.
//
// Invariants:
//   * vbits ⊇ PM bitmap: a freed block is republished to vbits only after the
//     freeing thread's lane clear is durable (see Free in allocator_lanes.cc);
//   * only a run's owner takes blocks from it with TakeBlock (and moves its
//     hint); at pool full another thread may take a block with
//     TakeBlockShared, or drain an entirely free run, under the class mutex
//     (allocator_runs.cc, Reclaim); anyone may clear bits;
//   * tc->cur[c] changes from a run to null only under the class mutex, and
//     a run whose owner is not null is never deleted: under the class mutex,
//     a run read from another thread's cur[c] stays alive;
//   * a run is in its class's partial list iff in_list (class mutex).
//
// Thread-safety: Allocate, AllocateZeroed, Free, UsableSize, IsAllocated and
// the counters may be called from any number of threads; ForEachAllocated
// and Check not concurrently with Allocate/Free. Locks: the registry mutex
// (RegistryMu) is outermost (ReleaseCache, and Reclaim and StealBlock at
// pool full, run under it and take the others; holding it keeps every
// thread cache alive); caches_mu_, a class mutex and heap_mu_ are each
// taken alone below it, never two of them at once.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "pm/allocator_format.h"
#include "pm/layout.h"
#include "pmindex/pm/allocator.h"
#include "pmindex/pm/persist.h"
#include "pmindex/pm/pool.h"

namespace pmindex::pm {
namespace alloc_internal __attribute__((visibility("hidden"))) {

enum ChunkKind : uint8_t { kFreeChunk = 0, kRunChunk, kLargeHead, kLargeInterior };

struct ThreadCache;

struct Run {
  uint64_t chunk = 0;
  int cls = 0;
  uint32_t nblocks = 0, nwords = 0, bsize = 0;
  uint64_t blocks_off = 0;  // pool offset of block 0
  uint64_t bitmap_off = 0;  // pool offset of the PM bitmap
  std::atomic<int64_t> free_count{0};
  std::atomic<ThreadCache*> owner{nullptr};
  bool in_list = false;  // guarded by the class mutex
  uint32_t hint = 0;     // owner only
  std::unique_ptr<std::atomic<uint64_t>[]> vbits;
};

struct ChunkSlot {
  std::atomic<uint8_t> kind{kFreeChunk};
  std::atomic<Run*> run{nullptr};    // kRunChunk
  std::atomic<uint64_t> span{0};      // kLargeHead: chunks in the block
};
constexpr uint64_t kSegChunks = 4096;

class PoolAllocator;

// One per (thread, pool): the thread's lane and its current run per class.
// cur and pending are atomics because a thread that finds the pool full
// reads (and may clear) other threads' entries (Reclaim).
struct ThreadCache {
  PoolAllocator* alloc = nullptr;
  uint32_t lane_idx = 0;
  Lane* lane = nullptr;
  std::atomic<Run*> cur[kNumClasses] = {};
  std::atomic<uint64_t> pending{0};  // a freed block to republish once the lane clear is durable
  // This thread's share of BytesInUse / BlocksInUse since the cache was made
  // (negative when it frees more than it allocated). Written by the owning
  // thread only, with plain relaxed stores: a shared counter updated with a
  // locked add on every allocation bounced its line between threads and
  // made each allocation wait for the write-back of the lane's clwb.
  std::atomic<int64_t> bytes{0}, blocks{0};
  void Count(int64_t b, int64_t n) {
    bytes.store(bytes.load(std::memory_order_relaxed) + b, std::memory_order_relaxed);
    blocks.store(blocks.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
};

// Process-wide registry of live allocators, keyed by pool instance id, so a
// thread's exit can tell whether the pool it used is still open
// (allocator_lanes.cc).
std::mutex& RegistryMu();
std::unordered_map<uint64_t, PoolAllocator*>& Registry();

class PoolAllocator final : public Allocator {
 public:
  PoolAllocator(Pool* pool, bool read_only);
  ~PoolAllocator() override;

  Status Init(bool fresh);
  void Shutdown();
  void ReleaseCache(ThreadCache* tc);  // registry mutex held

  Status Allocate(uint64_t* dest, size_t size) override { return AllocateImpl(dest, size, false); }
  Status AllocateZeroed(uint64_t* dest, size_t size) override { return AllocateImpl(dest, size, true); }
  Status Free(uint64_t* dest) override;
  size_t UsableSize(uint64_t off) const override;
  bool IsAllocated(uint64_t off) const override;
  // The released caches' total plus every live cache's share.
  uint64_t BytesInUse() const override { return InUse(&ThreadCache::bytes, bytes_); }
  uint64_t BlocksInUse() const override { return InUse(&ThreadCache::blocks, blocks_); }
  void ForEachAllocated(const std::function<void(uint64_t off, size_t size)>& fn) const override;
  Status Check() const override;

 private:
  Status AllocateImpl(uint64_t* dest, size_t size, bool zero);
  Status AllocLarge(ThreadCache* tc, uint64_t* dest, size_t size, bool zero);
  // This thread's cache for this pool. *orphan is set when the thread's
  // cache table is already destroyed (thread exit): the caller must then
  // release the cache with OrphanGuard when its operation ends.
  Status GetCache(ThreadCache** out, bool* orphan);
  Status NewCache(ThreadCache** out);  // registry mutex held
  struct OrphanGuard {
    PoolAllocator* a;
    ThreadCache* tc;
    ~OrphanGuard() {
      if (!tc) return;
      std::lock_guard<std::mutex> g(RegistryMu());
      a->ReleaseCache(tc);
    }
  };
  // Writes {op, block, dest, arg} into tc's lane (op last) and persists it,
  // then republishes the block tc freed last (its lane clear is now ordered
  // by this persist's fence).
  void LogLane(ThreadCache* tc, uint64_t op, uint64_t block, const uint64_t* dest, uint64_t arg) {
    Lane* L = tc->lane;
    Store(&L->block, block);
    Store(&L->dest, uint64_t(reinterpret_cast<const char*>(dest) - base_));
    Store(&L->arg, arg);
    StoreAtomic(&L->op, op);
    Persist(L, sizeof(Lane));
    PublishPending(tc);
  }
  bool TakeBlock(Run* r, uint32_t* idx);
  static bool TakeBlockShared(Run* r, uint32_t* idx);
  // Makes a run of class cls tc's current run and takes a block of it (or,
  // at pool full, a block of another thread's current run).
  Status Refill(ThreadCache* tc, int cls, Run** out, uint32_t* idx);
  bool TakePartialRun(ThreadCache* tc, int cls, Run** out);
  void ReleaseRun(ThreadCache* tc, Run* r);
  // At pool full: publishes every thread's pending freed block and returns
  // entirely free runs (unowned ones, tc's own and other threads' current
  // runs) to the heap. No locks held.
  void Reclaim(ThreadCache* tc);
  // Takes all blocks of another thread's entirely free run (class mutex held).
  static bool DrainFreeRun(Run* r);
  // At pool full: takes a free block from another thread's current run.
  bool StealBlock(ThreadCache* tc, int cls, Run** out, uint32_t* idx);
  std::vector<ThreadCache*> OtherCaches(ThreadCache* tc);  // registry mutex held
  Status NewChunks(uint64_t span, uint64_t* first);  // heap_mu_ held
  void SyncChunkCount();                             // heap_mu_ held
  Run* MakeRun(uint64_t chunk, int cls, bool from_pm);
  void Publish(ThreadCache* tc, uint64_t off);
  void PublishPending(ThreadCache* tc) {
    if (tc->pending.load(std::memory_order_relaxed)) {
      if (uint64_t off = tc->pending.exchange(0, std::memory_order_acq_rel)) Publish(tc, off);
    }
  }
  Status Recover();
  Status ReplayLane(uint32_t i, bool alloc_pass);
  Status Scan();
  Status ValidateChunks(uint64_t* bytes, uint64_t* blocks,
                        const std::function<void(uint64_t, size_t)>* fn) const;

  uint64_t* State(uint64_t chunk) const { return reinterpret_cast<uint64_t*>(base_ + layout::kHeapOffset + chunk * C); }
  // Marks the `span` chunks of a large block free: the continuation chunks
  // first, the head last (the order Free and the lane replay both use).
  // Flushes without a fence: the caller fences.
  void StoreSpanFree(uint64_t chunk, uint64_t span) const {
    for (uint64_t i = 1; i < span; i++) {
      StoreAtomic(State(chunk + i), kStateFree);
      Flush(State(chunk + i), 8);
    }
    StoreAtomic(State(chunk), kStateFree);
    Flush(State(chunk), 8);
  }
  uint64_t ChunkOff(uint64_t chunk) const { return layout::kHeapOffset + chunk * C; }
  Lane* LaneAt(uint32_t i) const { return reinterpret_cast<Lane*>(base_ + layout::kLanesOffset + i * layout::kLaneSize); }
  ChunkSlot& Slot(uint64_t chunk) const { return segs_[chunk / kSegChunks][chunk % kSegChunks]; }
  uint64_t NumChunks() const { return nchunks_.load(std::memory_order_acquire); }
  bool ClassOk(uint64_t cls) const { return cls < uint64_t(num_classes_); }
  bool DestOk(const uint64_t* dest) const {
    auto p = reinterpret_cast<const char*>(dest);
    if (p < base_ || (reinterpret_cast<uintptr_t>(p) & 7) != 0) return false;
    uint64_t off = uint64_t(p - base_);
    return off == layout::kRootSlotOffset || layout::InPmwcasRegion(off) ||
           (off >= layout::kHeapOffset && off + 8 <= pool_->size());
  }

  Pool* pool_;
  char* base_;
  bool ro_;
  uint64_t id_;
  uint64_t max_chunks_;
  // Size classes this pool's format allows (kNumSmallClasses before format
  // 3) and the largest request they serve.
  int num_classes_;
  size_t max_run_block_;
  std::atomic<uint64_t> nchunks_{0};
  std::unique_ptr<std::unique_ptr<ChunkSlot[]>[]> segs_;
  uint64_t nsegs_ = 0;

  std::mutex heap_mu_;
  std::vector<uint8_t> chunk_free_;  // heap_mu_
  uint64_t free_hint_ = 0;           // heap_mu_
  // Runs drained from other threads' caches (Reclaim): their chunks went
  // back to the heap, but the owner may still read the Run until it
  // notices, so they are deleted only with the allocator.
  std::vector<std::unique_ptr<Run>> retired_;  // heap_mu_

  struct ClassState {
    std::mutex mu;
    std::vector<Run*> partial;
  };
  ClassState classes_[kNumClasses];

  // Totals of the recovered heap and of released caches (caches_mu_ for
  // writes after Init); live caches keep their own shares (ThreadCache).
  std::atomic<uint64_t> bytes_{0}, blocks_{0};
  uint64_t InUse(std::atomic<int64_t> ThreadCache::*share, const std::atomic<uint64_t>& base) const {
    std::lock_guard<std::mutex> g(caches_mu_);
    int64_t sum = int64_t(base.load(std::memory_order_relaxed));
    for (const auto& tc : caches_) sum += ((*tc).*share).load(std::memory_order_relaxed);
    return uint64_t(sum);
  }

  // Adds a cache's share to the totals before the cache goes (caches_mu_ held).
  void FoldCounts(const ThreadCache& tc) {
    bytes_.store(bytes_.load(std::memory_order_relaxed) + uint64_t(tc.bytes.load(std::memory_order_relaxed)),
                 std::memory_order_relaxed);
    blocks_.store(blocks_.load(std::memory_order_relaxed) + uint64_t(tc.blocks.load(std::memory_order_relaxed)),
                  std::memory_order_relaxed);
  }

  mutable std::mutex caches_mu_;
  std::vector<bool> lane_used_;
  std::vector<std::unique_ptr<ThreadCache>> caches_;
  bool shut_down_ = false;
};

// Takes a free block of r in DRAM (sets its vbits bit). Only r's owner calls
// this, so the hint needs no synchronisation; other threads only clear bits.
inline bool PoolAllocator::TakeBlock(Run* r, uint32_t* idx) {
  if (r->free_count.load(std::memory_order_relaxed) <= 0) return false;
  for (uint32_t n = 0; n < r->nwords; n++) {
    uint32_t w = r->hint + n;
    if (w >= r->nwords) w -= r->nwords;
    uint64_t v = r->vbits[w].load(std::memory_order_relaxed);
    while (v != ~0ull) {
      int b = __builtin_ctzll(~v);
      uint64_t m = 1ull << b;
      uint64_t old = r->vbits[w].fetch_or(m, std::memory_order_acq_rel);
      if (!(old & m)) {
        r->free_count.fetch_sub(1, std::memory_order_relaxed);
        r->hint = w;
        *idx = w * 64 + uint32_t(b);
        return true;
      }
      v = old | m;
    }
  }
  return false;
}

// TakeBlock for a thread that does not own r: leaves the hint alone.
inline bool PoolAllocator::TakeBlockShared(Run* r, uint32_t* idx) {
  if (r->free_count.load(std::memory_order_relaxed) <= 0) return false;
  for (uint32_t w = 0; w < r->nwords; w++) {
    uint64_t v = r->vbits[w].load(std::memory_order_relaxed);
    while (v != ~0ull) {
      const uint64_t m = 1ull << __builtin_ctzll(~v);
      const uint64_t old = r->vbits[w].fetch_or(m, std::memory_order_acq_rel);
      if (!(old & m)) {
        r->free_count.fetch_sub(1, std::memory_order_relaxed);
        *idx = w * 64 + uint32_t(__builtin_ctzll(m));
        return true;
      }
      v = old | m;
    }
  }
  return false;
}

inline size_t PoolAllocator::UsableSize(uint64_t off) const {
  if (off < layout::kHeapOffset + 64) return 0;
  const uint64_t chunk = (off - layout::kHeapOffset) / C;
  if (chunk >= NumChunks()) return 0;
  const uint8_t kind = Slot(chunk).kind.load(std::memory_order_acquire);
  const uint64_t state = __atomic_load_n(State(chunk), __ATOMIC_ACQUIRE);
  const uint64_t in = off - ChunkOff(chunk);
  if (kind == kLargeHead && IsLargeState(state)) return in == 64 ? StateArg(state) * C - 64 : 0;
  if (kind == kRunChunk && IsRunState(state)) {
    const ClassGeom& g = Classes().geom[StateArg(state)];
    if (in < g.blocks_start || (in - g.blocks_start) % g.size != 0 || (in - g.blocks_start) / g.size >= g.nblocks) return 0;
    return g.size;
  }
  return 0;
}

inline bool PoolAllocator::IsAllocated(uint64_t off) const {
  if (UsableSize(off) == 0) return false;
  const uint64_t chunk = (off - layout::kHeapOffset) / C;
  const uint64_t state = __atomic_load_n(State(chunk), __ATOMIC_ACQUIRE);
  if (IsLargeState(state)) return true;
  const ClassGeom& g = Classes().geom[StateArg(state)];
  const uint64_t idx = (off - ChunkOff(chunk) - g.blocks_start) / g.size;
  const uint64_t* word = reinterpret_cast<const uint64_t*>(base_ + ChunkOff(chunk) + 64) + idx / 64;
  return (__atomic_load_n(word, __ATOMIC_ACQUIRE) >> (idx % 64)) & 1;
}

}  // namespace alloc_internal
}  // namespace pmindex::pm
