// Allocation lanes: each thread's cache and the one-line micro-log (lane) it
// owns, Allocate/Free of run blocks into a persistent destination word, and
// the replay of the lanes when a pool opens. Part of the allocator described
// in allocator_internal.h; the lane format is in allocator_format.h.
//
// Follows FPTree (SIGMOD'16) section 2, "persistent memory leaks": the store
// of the block's offset into the caller's persistent word *dest is the
// commit point, and the lane lets recovery finish or undo an allocation or
// free that a crash interrupted. PiBench (VLDB'20) section 5.8 shows
// allocation is a first-order cost, hence thread-local lanes and runs.
//
// Persist order:
//   Allocate: lane{ALLOC}, Persist | bit |= m, *dest = block, Flush both,
//     Fence | lane.op = 0, Flush (no fence: the thread's next fence orders it).
//   Free: lane{FREE}, Persist | *dest = 0, bit &= ~m, Flush both, Fence |
//     lane.op = 0 (not flushed); the block becomes reusable only once the
//     lane was overwritten durably (the next Allocate/Free of this thread) or
//     flushed and fenced (thread exit, Close, or Reclaim, which does that for
//     every thread's lane when the pool is full).
//   Recovery: ALLOC lane: *dest == block ? set bit : clear bit. FREE lane:
//     *dest == block ? *dest = 0 : -; clear bit. Then lane.op = 0; Persist.
//   (Large blocks follow the same order with the chunk header state in place
//   of the bit: allocator_large.cc. Rolling back a large allocation, like
//   freeing one, writes FREE into every chunk header of its span, later
//   chunks first.)
//
// Invariants: a lane is owned by at most one thread cache at a time
// (lane_used_, caches_mu_); a thread's cache for a pool is found through its
// thread-local table, keyed by the pool's instance id.
//
// Thread-safety: Allocate and Free from any thread, each on its own cache and
// lane. Recover runs at open, before the allocator is published.
#include <algorithm>
#include <cstdio>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "pm/allocator_internal.h"
#include "pmindex/pm/fault.h"
#include "pmindex/pm/persist.h"
#include "pmindex/pm/pool.h"

namespace pmindex::pm::alloc_internal {

// Process-wide registry of live allocators, keyed by pool instance id, so a
// thread's exit can tell whether the pool it used is still open.
std::mutex& RegistryMu() {
  static auto* m = new std::mutex;
  return *m;
}
std::unordered_map<uint64_t, PoolAllocator*>& Registry() {
  static auto* r = new std::unordered_map<uint64_t, PoolAllocator*>;
  return *r;
}

namespace {

struct TlsCaches {
  uint64_t last_id = 0;
  ThreadCache* last = nullptr;
  std::vector<std::pair<uint64_t, ThreadCache*>> all;
  ~TlsCaches();
};
thread_local TlsCaches tls_caches;
// Set by ~TlsCaches. A thread_local constructed before tls_caches is
// destroyed after it, and its destructor may still allocate or free (an
// index operation run at thread exit). tls_caches must not be touched then:
// such operations take an "orphan" cache, released when the operation ends.
// Trivially destructible, so it stays readable until the thread is gone.
thread_local bool tls_caches_gone = false;

}  // namespace

TlsCaches::~TlsCaches() {
  std::lock_guard<std::mutex> g(RegistryMu());
  for (auto& [id, tc] : all) {
    auto it = Registry().find(id);
    if (it != Registry().end()) it->second->ReleaseCache(tc);
  }
  all.clear();
  last = nullptr;
  last_id = 0;
  tls_caches_gone = true;
}

// ---- thread caches ---------------------------------------------------------

Status PoolAllocator::GetCache(ThreadCache** out, bool* orphan) {
  *orphan = false;
  if (__builtin_expect(tls_caches_gone, 0)) {
    std::lock_guard<std::mutex> rg(RegistryMu());
    PMINDEX_RETURN_IF_ERROR(NewCache(out));
    *orphan = true;
    return Status::OK();
  }
  TlsCaches& t = tls_caches;
  if (t.last_id == id_) {
    *out = t.last;
    return Status::OK();
  }
  for (auto& [id, tc] : t.all) {
    if (id == id_) {
      t.last_id = id;
      t.last = tc;
      *out = tc;
      return Status::OK();
    }
  }
  std::lock_guard<std::mutex> rg(RegistryMu());
  // Drop entries of pools closed meanwhile.
  t.all.erase(std::remove_if(t.all.begin(), t.all.end(),
                             [](const std::pair<uint64_t, ThreadCache*>& e) { return !Registry().count(e.first); }),
              t.all.end());
  ThreadCache* raw;
  PMINDEX_RETURN_IF_ERROR(NewCache(&raw));
  t.all.emplace_back(id_, raw);
  t.last_id = id_;
  t.last = raw;
  *out = raw;
  return Status::OK();
}

Status PoolAllocator::NewCache(ThreadCache** out) {
  std::lock_guard<std::mutex> g(caches_mu_);
  uint32_t lane = 0;
  while (lane < layout::kLaneCount && lane_used_[lane]) lane++;
  if (lane == layout::kLaneCount)
    return Status::Busy("all " + std::to_string(layout::kLaneCount) + " allocator lanes of pool " + pool_->path() +
                        " are in use (too many threads)");
  lane_used_[lane] = true;
  auto tc = std::make_unique<ThreadCache>();
  tc->alloc = this;
  tc->lane_idx = lane;
  tc->lane = LaneAt(lane);
  *out = tc.get();
  caches_.push_back(std::move(tc));
  return Status::OK();
}

void PoolAllocator::ReleaseCache(ThreadCache* tc) {
  if (!ro_) {
    Flush(tc->lane, sizeof(Lane));
    Fence();  // this thread's last lane clear is durable: republishing is safe
    PublishPending(tc);
  }
  for (int c = 0; c < kNumClasses; c++)
    if (Run* r = tc->cur[c].load(std::memory_order_relaxed)) ReleaseRun(tc, r);
  std::lock_guard<std::mutex> g(caches_mu_);
  lane_used_[tc->lane_idx] = false;
  FoldCounts(*tc);
  for (auto& p : caches_) {
    if (p.get() == tc) {
      p = std::move(caches_.back());
      caches_.pop_back();
      break;
    }
  }
}

// ---- allocate / free -------------------------------------------------------

Status PoolAllocator::AllocateImpl(uint64_t* dest, size_t size, bool zero) {
  if (ro_) return Status::Unsupported("pool " + pool_->path() + " is open read-only");
  if (size == 0) return Status::InvalidArgument("allocation of 0 bytes");
  if (size > kMaxAllocation)
    return Status::InvalidArgument("allocation of " + std::to_string(size) + " bytes exceeds the limit of " +
                                   std::to_string(kMaxAllocation));
  if (!DestOk(dest)) return Status::InvalidArgument("allocation destination is not an aligned word inside the pool's heap");
  ThreadCache* tc;
  bool orphan;
  PMINDEX_RETURN_IF_ERROR(GetCache(&tc, &orphan));
  OrphanGuard og{this, orphan ? tc : nullptr};
  if (size > max_run_block_) return AllocLarge(tc, dest, size, zero);

  const int cls = ClassOf(size);
  Run* r = tc->cur[cls].load(std::memory_order_relaxed);
  uint32_t idx;
  if (!r || !TakeBlock(r, &idx)) PMINDEX_RETURN_IF_ERROR(Refill(tc, cls, &r, &idx));
  const uint64_t off = r->blocks_off + uint64_t(idx) * r->bsize;
  if (zero) {
    Set(base_ + off, 0, r->bsize);
    Flush(base_ + off, r->bsize);  // ordered by the lane persist's fence
  }
  LogLane(tc, kOpAlloc, off, dest, uint64_t(cls));
  uint64_t* word = reinterpret_cast<uint64_t*>(base_ + r->bitmap_off) + idx / 64;
  FetchOr(word, uint64_t(1) << (idx % 64));
  StoreAtomic(dest, off);
  Flush(word, 8);
  if (!PMINDEX_FAULT("pm.alloc.skip_dest_flush")) Flush(dest, 8);
  if (!PMINDEX_FAULT("pm.alloc.skip_commit_fence")) Fence();
  StoreAtomic(&tc->lane->op, kOpIdle);
  Flush(tc->lane, sizeof(Lane));
  tc->Count(r->bsize, 1);
  ThreadCounters().allocs++;
  return Status::OK();
}

Status PoolAllocator::Free(uint64_t* dest) {
  if (ro_) return Status::Unsupported("Allocator::Free on pool " + pool_->path() + ", which is open read-only");
  if (!DestOk(dest))
    return Status::InvalidArgument("Allocator::Free: the destination is not an aligned word inside pool " +
                                   pool_->path());
  const uint64_t off = __atomic_load_n(dest, __ATOMIC_ACQUIRE);
  if (off == 0) return Status::OK();
  if (!IsAllocated(off))
    return Status::InvalidArgument("Allocator::Free of " + std::to_string(off) +
                                   ", which is not an allocated block of pool " + pool_->path());
  ThreadCache* tc;
  bool orphan;
  PMINDEX_RETURN_IF_ERROR(GetCache(&tc, &orphan));
  OrphanGuard og{this, orphan ? tc : nullptr};
  const uint64_t chunk = (off - layout::kHeapOffset) / C;
  const uint64_t state = __atomic_load_n(State(chunk), __ATOMIC_ACQUIRE);
  Lane* L = tc->lane;
  uint64_t usable;
  if (IsLargeState(state)) {
    const uint64_t span = StateArg(state);
    usable = span * C - 64;
    LogLane(tc, kOpFree, off, dest, kArgLarge | span);
    StoreAtomic(dest, uint64_t(0));
    Flush(dest, 8);
    StoreSpanFree(chunk, span);
  } else {
    const ClassGeom& g = Classes().geom[StateArg(state)];
    usable = g.size;
    const uint64_t idx = (off - ChunkOff(chunk) - g.blocks_start) / g.size;
    LogLane(tc, kOpFree, off, dest, StateArg(state));
    uint64_t* word = reinterpret_cast<uint64_t*>(base_ + ChunkOff(chunk) + 64) + idx / 64;
    StoreAtomic(dest, uint64_t(0));
    FetchAnd(word, ~(uint64_t(1) << (idx % 64)));
    Flush(dest, 8);
    if (!PMINDEX_FAULT("pm.free.skip_bit_flush")) Flush(word, 8);
  }
  Fence();
  // The lane clear is not flushed: a stale FREE lane is harmless (its replay
  // clears an already clear bit; *dest no longer holds the block), as long as
  // the block is not reused before the lane is overwritten or flushed, which
  // the deferred publication guarantees. Hence a volatile store: the lint
  // must not report it as a missing flush.
  StoreVolatile(&L->op, kOpIdle);
  tc->pending.store(off, std::memory_order_release);
  tc->Count(-int64_t(usable), -1);
  ThreadCounters().frees++;
  return Status::OK();
}

// ---- recovery --------------------------------------------------------------

Status PoolAllocator::ReplayLane(uint32_t i, bool alloc_pass) {
  Lane* L = LaneAt(i);
  const uint64_t op = L->op;
  if (op == kOpIdle) return Status::OK();
  if (op != kOpAlloc && op != kOpFree) return Status::Corrupt("allocator lane " + std::to_string(i) + " has an invalid op word");
  if ((op == kOpAlloc) != alloc_pass) return Status::OK();
  if (PMINDEX_FAULT("pm.alloc.skip_replay")) {
    // Deliberately broken recovery (proves the crash tests): forget the lane.
    StorePersist(&L->op, kOpIdle);
    return Status::OK();
  }
  const uint64_t size = pool_->size();
  const uint64_t block = L->block, dest_off = L->dest, arg = L->arg;
  if (block < layout::kHeapOffset + 64 || block >= size || dest_off + 8 > size || (dest_off & 7) ||
      !(dest_off == layout::kRootSlotOffset || layout::InPmwcasRegion(dest_off) || dest_off >= layout::kHeapOffset))
    return Status::Corrupt("allocator lane " + std::to_string(i) + " refers outside the pool");
  uint64_t* dest = reinterpret_cast<uint64_t*>(base_ + dest_off);
  const uint64_t chunk = (block - layout::kHeapOffset) / C;
  const bool holds = __atomic_load_n(dest, __ATOMIC_ACQUIRE) == block;
  if (arg & kArgLarge) {
    const uint64_t span = arg & ~kArgLarge;
    if (span == 0 || chunk + span > NumChunks() || block != ChunkOff(chunk) + 64)
      return Status::Corrupt("allocator lane " + std::to_string(i) + " has an invalid large block");
    if (op == kOpAlloc && holds) {
      StoreAtomic(State(chunk), LargeState(span));
      Flush(State(chunk), 8);
    } else if (op == kOpAlloc) {
      // Roll back the whole span: the later chunks' header words may hold
      // bytes written into the block, which would be read as chunk states
      // once the head is FREE.
      StoreSpanFree(chunk, span);
    } else {
      if (holds) {
        StoreAtomic(dest, uint64_t(0));
        Flush(dest, 8);
      }
      StoreSpanFree(chunk, span);
    }
  } else {
    if (!ClassOk(arg) || __atomic_load_n(State(chunk), __ATOMIC_ACQUIRE) != RunState(int(arg)))
      return Status::Corrupt("allocator lane " + std::to_string(i) + " refers to a block outside a run of its class");
    const ClassGeom& g = Classes().geom[arg];
    const uint64_t in = block - ChunkOff(chunk);
    if (in < g.blocks_start || (in - g.blocks_start) % g.size || (in - g.blocks_start) / g.size >= g.nblocks)
      return Status::Corrupt("allocator lane " + std::to_string(i) + " refers to a misaligned block");
    const uint64_t idx = (in - g.blocks_start) / g.size;
    uint64_t* word = reinterpret_cast<uint64_t*>(base_ + ChunkOff(chunk) + 64) + idx / 64;
    const uint64_t m = 1ull << (idx % 64);
    if (op == kOpAlloc && holds) {
      FetchOr(word, m);
    } else {
      if (op == kOpFree && holds) {
        StoreAtomic(dest, uint64_t(0));
        Flush(dest, 8);
      }
      FetchAnd(word, ~m);
    }
    Flush(word, 8);
  }
  Fence();
  StoreAtomic(&L->op, kOpIdle);
  Persist(&L->op, 8);
  return Status::OK();
}

Status PoolAllocator::Recover() {
  if (!ro_) {
    // Allocations first, then frees: a block logged in both (impossible under
    // the publication rule, but cheap to order) ends up free.
    for (uint32_t i = 0; i < layout::kLaneCount; i++) PMINDEX_RETURN_IF_ERROR(ReplayLane(i, true));
    for (uint32_t i = 0; i < layout::kLaneCount; i++) PMINDEX_RETURN_IF_ERROR(ReplayLane(i, false));
  }
  return Scan();
}

}  // namespace pmindex::pm::alloc_internal
