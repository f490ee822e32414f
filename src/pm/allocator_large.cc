// The chunk heap and large blocks. The heap is the pool's space after the
// fixed regions, in whole chunks; this file finds free chunks (growing the
// pool through Pool::Grow when none fit) and allocates large blocks, which
// span whole chunks (requests above Allocator::kMaxRunBlock). Part of the
// allocator described in allocator_internal.h; format in allocator_format.h.
//
// Persist order of a large allocation (FPTree section 2, as for run blocks in
// allocator_lanes.cc, with the head chunk's header state in place of a
// bitmap bit): lane{ALLOC, arg = LARGE | span}, Persist | head state =
// LARGE(span), *dest = block, Flush both, Fence | lane.op = 0, Flush. Freeing
// (Free in allocator_lanes.cc) stores FREE into the continuation chunks'
// headers first and the head's last.
//
// Invariants: chunk_free_[i] is 1 iff chunk i is free in DRAM; a chunk freed
// by Free becomes free in DRAM only after the freeing thread's lane clear was
// fenced (Publish, allocator_runs.cc).
//
// Thread-safety: NewChunks and SyncChunkCount need heap_mu_; AllocLarge may
// run on any thread with its own cache.
#include <algorithm>
#include <mutex>
#include <string>

#include "pm/allocator_internal.h"
#include "pmindex/pm/fault.h"
#include "pmindex/pm/persist.h"
#include "pmindex/pm/pool.h"

namespace pmindex::pm::alloc_internal {

void PoolAllocator::SyncChunkCount() {
  const uint64_t n = (pool_->size() - layout::kHeapOffset) / C;
  const uint64_t old = NumChunks();
  if (n <= old) return;
  for (uint64_t s = old / kSegChunks; s <= (n - 1) / kSegChunks; s++)
    if (!segs_[s]) segs_[s].reset(new ChunkSlot[kSegChunks]);
  chunk_free_.resize(n, 1);
  nchunks_.store(n, std::memory_order_release);
}

// Finds `span` contiguous free chunks, growing the pool if needed.
Status PoolAllocator::NewChunks(uint64_t span, uint64_t* first) {
  for (int attempt = 0; attempt < 2; attempt++) {
    SyncChunkCount();  // the pool may also have been grown through Pool::Grow
    const uint64_t n = NumChunks();
    if (span == 1) {
      for (uint64_t k = 0; k < n; k++) {
        uint64_t i = (free_hint_ + k) % n;
        if (chunk_free_[i]) {
          chunk_free_[i] = 0;
          free_hint_ = i + 1;
          *first = i;
          return Status::OK();
        }
      }
    } else {
      uint64_t run = 0;
      for (uint64_t i = 0; i < n; i++) {
        run = chunk_free_[i] ? run + 1 : 0;
        if (run == span) {
          uint64_t f = i + 1 - span;
          for (uint64_t j = f; j <= i; j++) chunk_free_[j] = 0;
          *first = f;
          return Status::OK();
        }
      }
    }
    if (attempt == 1) break;
    // Grow: the free tail counts towards the span.
    uint64_t tail = 0;
    while (tail < n && chunk_free_[n - 1 - tail]) tail++;
    const uint64_t need = span > tail ? span - tail : 1;
    uint64_t step = std::max<uint64_t>({need, 8, n / 4});
    if (n + step > max_chunks_) step = max_chunks_ - n;
    if (step < need)
      return Status::PoolFull("pool " + pool_->path() + " is full: " + std::to_string(span) +
                              " chunk(s) needed, max size " + std::to_string(pool_->max_size()) + " bytes reached");
    Status s = pool_->Grow(layout::kHeapOffset + (n + step) * C);
    if (s.IsPoolFull() || s.IsIOError()) {
      // Try the bare minimum before giving up.
      if (step > need) s = pool_->Grow(layout::kHeapOffset + (n + need) * C);
      if (!s.ok()) return Status::PoolFull("pool " + pool_->path() + " is full: " + std::string(s.message()));
    } else if (!s.ok()) {
      return s;
    }
    SyncChunkCount();
  }
  return Status::PoolFull("pool " + pool_->path() + " is full");
}

Status PoolAllocator::AllocLarge(ThreadCache* tc, uint64_t* dest, size_t size, bool zero) {
  const uint64_t span = (size + 64 + C - 1) / C;
  uint64_t first;
  for (int attempt = 0;; attempt++) {
    Status s;
    {
      std::lock_guard<std::mutex> g(heap_mu_);
      s = NewChunks(span, &first);
    }
    if (s.ok()) break;
    if (!s.IsPoolFull() || attempt == 1) return s;
    Reclaim(tc);
  }
  {
    std::lock_guard<std::mutex> g(heap_mu_);
    Slot(first).span.store(span, std::memory_order_relaxed);
    Slot(first).kind.store(kLargeHead, std::memory_order_release);
    for (uint64_t i = 1; i < span; i++) Slot(first + i).kind.store(kLargeInterior, std::memory_order_release);
  }
  const uint64_t off = ChunkOff(first) + 64;
  const uint64_t usable = span * C - 64;
  if (zero) {
    Set(base_ + off, 0, usable);
    Flush(base_ + off, usable);
  }
  LogLane(tc, kOpAlloc, off, dest, kArgLarge | span);
  StoreAtomic(State(first), LargeState(span));
  StoreAtomic(dest, off);
  if (!PMINDEX_FAULT("pm.alloc.large.skip_state_flush")) Flush(State(first), 8);
  Flush(dest, 8);
  Fence();
  StoreAtomic(&tc->lane->op, kOpIdle);
  Flush(tc->lane, sizeof(Lane));
  tc->Count(int64_t(usable), 1);
  ThreadCounters().allocs++;
  return Status::OK();
}

}  // namespace pmindex::pm::alloc_internal
