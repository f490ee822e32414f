// The crash-safe PM allocator (include/pmindex/pm/allocator.h,
// docs/allocator.md): the PoolAllocator's lifetime, the open-time scan that
// rebuilds the DRAM state from PM, and the read-only walks (Check,
// ForEachAllocated). The class and its DRAM state are in
// allocator_internal.h, the on-PM format in allocator_format.h; allocation
// and recovery of the lanes in allocator_lanes.cc, runs in allocator_runs.cc,
// the chunk heap and large blocks in allocator_large.cc.
//
// Follows FPTree (SIGMOD'16) section 2, "persistent memory leaks".
//
// Open: the lanes are replayed (allocator_lanes.cc), then Scan validates
// every chunk header and bitmap and rebuilds runs, class lists and the
// free-chunk map. Close (Shutdown): the lanes of every live thread cache are
// flushed and fenced, so their last (unflushed) clears are durable.
//
// Invariants checked by Check: valid chunk headers, no bitmap bits past a
// run's last block, large blocks inside the heap, idle lanes (on a writable
// pool), counters equal to what the chunks hold, and vbits ⊇ PM bitmap.
//
// Thread-safety: Init and Shutdown are called by Pool (open, close);
// ForEachAllocated and Check not concurrently with Allocate/Free.
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "pm/allocator_internal.h"
#include "pm/layout.h"
#include "pmindex/pm/allocator.h"
#include "pmindex/pm/fault.h"
#include "pmindex/pm/persist.h"
#include "pmindex/pm/pool.h"

namespace pmindex::pm {
namespace alloc_internal {

PoolAllocator::PoolAllocator(Pool* pool, bool read_only)
    : pool_(pool), base_(pool->base()), ro_(read_only), id_(pool->instance_id()) {
  max_chunks_ = (pool->max_size() - layout::kHeapOffset) / C;
  const bool medium = pool->Info().version >= kMediumClassesVersion;
  num_classes_ = medium ? kNumClasses : kNumSmallClasses;
  max_run_block_ = medium ? Allocator::kMaxMediumBlock : Allocator::kMaxRunBlock;
  nsegs_ = (max_chunks_ + kSegChunks - 1) / kSegChunks;
  segs_.reset(new std::unique_ptr<ChunkSlot[]>[nsegs_]);
  lane_used_.assign(layout::kLaneCount, false);
}

PoolAllocator::~PoolAllocator() {
  Shutdown();
  for (uint64_t i = 0; i < NumChunks(); i++) {
    if (Slot(i).kind.load(std::memory_order_relaxed) == kRunChunk) delete Slot(i).run.load(std::memory_order_relaxed);
  }
}

void PoolAllocator::Shutdown() {
  std::lock_guard<std::mutex> g(RegistryMu());
  if (shut_down_) return;
  shut_down_ = true;
  Registry().erase(id_);
  // Other threads' last lane clears were flushed but maybe not fenced: flush
  // the lanes in use again from here and fence.
  std::lock_guard<std::mutex> c(caches_mu_);
  if (!ro_) {
    for (auto& tc : caches_)
      if (tc) Flush(tc->lane, sizeof(Lane));
    Fence();
  }
  for (auto& tc : caches_)  // keep the accounting of the caches dropped here
    if (tc) FoldCounts(*tc);
  caches_.clear();
}

Status PoolAllocator::Init(bool fresh) {
  {
    std::lock_guard<std::mutex> g(heap_mu_);
    SyncChunkCount();
  }
  if (!fresh) PMINDEX_RETURN_IF_ERROR(Recover());
  std::lock_guard<std::mutex> g(RegistryMu());
  Registry()[id_] = this;
  return Status::OK();
}

// Walks the chunk headers from PM; validates and optionally visits blocks.
Status PoolAllocator::ValidateChunks(uint64_t* bytes, uint64_t* blocks,
                                     const std::function<void(uint64_t, size_t)>* fn) const {
  *bytes = *blocks = 0;
  const uint64_t n = NumChunks();
  for (uint64_t i = 0; i < n;) {
    const uint64_t s = __atomic_load_n(State(i), __ATOMIC_ACQUIRE);
    if (s == kStateFree) {
      i++;
      continue;
    }
    if (IsRunState(s)) {
      if (!ClassOk(StateArg(s)))
        return Status::Corrupt("chunk " + std::to_string(i) + " is a run of size class " + std::to_string(StateArg(s)) +
                               ", which this pool's format version does not have");
      const ClassGeom& g = Classes().geom[StateArg(s)];
      const uint64_t* bm = reinterpret_cast<const uint64_t*>(base_ + ChunkOff(i) + 64);
      for (uint32_t w = 0; w < g.nwords; w++) {
        uint64_t v = __atomic_load_n(&bm[w], __ATOMIC_ACQUIRE);
        if (w == g.nwords - 1 && g.nblocks % 64 && (v & (~0ull << (g.nblocks % 64))))
          return Status::Corrupt("chunk " + std::to_string(i) + ": bitmap bits set past the last block");
        while (v) {
          int b = __builtin_ctzll(v);
          v &= v - 1;
          (*bytes) += g.size;
          (*blocks)++;
          if (fn) (*fn)(ChunkOff(i) + g.blocks_start + uint64_t(w * 64 + b) * g.size, g.size);
        }
      }
      i++;
      continue;
    }
    if (IsLargeState(s)) {
      const uint64_t span = StateArg(s);
      if (span > n - i)
        return Status::Corrupt("chunk " + std::to_string(i) + ": large block of " + std::to_string(span) +
                               " chunks runs past the end of the heap");
      (*bytes) += span * C - 64;
      (*blocks)++;
      if (fn) (*fn)(ChunkOff(i) + 64, span * C - 64);
      i += span;
      continue;
    }
    char buf[32];
    std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long)s);
    return Status::Corrupt("chunk " + std::to_string(i) + " has an invalid header state 0x" + buf);
  }
  return Status::OK();
}

void PoolAllocator::ForEachAllocated(const std::function<void(uint64_t off, size_t size)>& fn) const {
  uint64_t b, k;
  (void)ValidateChunks(&b, &k, &fn);
}

Status PoolAllocator::Check() const {
  uint64_t bytes, blocks;
  PMINDEX_RETURN_IF_ERROR(ValidateChunks(&bytes, &blocks, nullptr));
  for (uint32_t i = 0; i < layout::kLaneCount; i++) {
    const Lane* L = LaneAt(i);
    const uint64_t op = __atomic_load_n(&L->op, __ATOMIC_ACQUIRE);
    if (op == kOpIdle) continue;
    if (op != kOpAlloc && op != kOpFree) return Status::Corrupt("lane " + std::to_string(i) + " has an invalid op word");
    if (!ro_) return Status::Corrupt("lane " + std::to_string(i) + " is not idle while the allocator is quiescent");
    if (L->block < layout::kHeapOffset || L->block >= pool_->size() || L->dest >= pool_->size() || (L->dest & 7))
      return Status::Corrupt("lane " + std::to_string(i) + " refers outside the pool");
  }
  if (bytes != BytesInUse() || blocks != BlocksInUse())
    return Status::Corrupt("allocator accounting mismatch: counters say " + std::to_string(BytesInUse()) + " bytes / " +
                           std::to_string(BlocksInUse()) + " blocks, chunks hold " + std::to_string(bytes) + " / " +
                           std::to_string(blocks));
  // DRAM runs must cover every PM-allocated block.
  for (uint64_t i = 0; i < NumChunks(); i++) {
    Run* r = Slot(i).run.load(std::memory_order_acquire);
    if (!r || Slot(i).kind.load(std::memory_order_acquire) != kRunChunk) continue;
    const uint64_t* bm = reinterpret_cast<const uint64_t*>(base_ + r->bitmap_off);
    for (uint32_t w = 0; w < r->nwords; w++)
      if (__atomic_load_n(&bm[w], __ATOMIC_ACQUIRE) & ~r->vbits[w].load(std::memory_order_relaxed))
        return Status::Corrupt("chunk " + std::to_string(i) + ": a block in use is marked free in the volatile state");
  }
  return Status::OK();
}

Status PoolAllocator::Scan() {
  uint64_t bytes, blocks;
  PMINDEX_RETURN_IF_ERROR(ValidateChunks(&bytes, &blocks, nullptr));
  std::lock_guard<std::mutex> g(heap_mu_);
  const uint64_t n = NumChunks();
  for (uint64_t i = 0; i < n;) {
    const uint64_t s = __atomic_load_n(State(i), __ATOMIC_ACQUIRE);
    if (IsRunState(s)) {
      Run* r = MakeRun(i, int(StateArg(s)), true);
      if (r->free_count.load() == int64_t(r->nblocks)) {
        delete r;  // empty run: the chunk is free
        chunk_free_[i] = 1;
      } else {
        chunk_free_[i] = 0;
        Slot(i).run.store(r, std::memory_order_release);
        Slot(i).kind.store(kRunChunk, std::memory_order_release);
        if (r->free_count.load() > 0) {
          r->in_list = true;
          classes_[r->cls].partial.push_back(r);
        }
      }
      i++;
    } else if (IsLargeState(s)) {
      const uint64_t span = StateArg(s);
      chunk_free_[i] = 0;
      Slot(i).span.store(span, std::memory_order_relaxed);
      Slot(i).kind.store(kLargeHead, std::memory_order_release);
      for (uint64_t k = 1; k < span; k++) {
        chunk_free_[i + k] = 0;
        Slot(i + k).kind.store(kLargeInterior, std::memory_order_release);
      }
      i += span;
    } else {
      chunk_free_[i] = 1;
      i++;
    }
  }
  bytes_.store(bytes);
  blocks_.store(blocks);
  return Status::OK();
}

}  // namespace alloc_internal

using alloc_internal::PoolAllocator;

void Allocator::FreeOrAbort(uint64_t* dest) {
  if (Status s = Free(dest); !s.ok()) {
    std::fprintf(stderr, "pmindex: a Free that cannot report its error failed: %s\n", s.ToString().c_str());
    std::abort();
  }
}

Status NewPoolAllocator(Pool* pool, bool fresh, bool read_only, std::unique_ptr<Allocator>* out) {
  auto a = std::make_unique<PoolAllocator>(pool, read_only);
  PMINDEX_RETURN_IF_ERROR(a->Init(fresh));
  *out = std::move(a);
  return Status::OK();
}

void ShutdownPoolAllocator(Allocator* a) { static_cast<PoolAllocator*>(a)->Shutdown(); }

}  // namespace pmindex::pm

// The fault switches of this folder (pmindex/pm/fault.h; docs/CONTRIBUTING.md).
PMINDEX_FAULT_SWITCHES(pm,
                       "pm.alloc.large.skip_state_flush",
                       "pm.alloc.skip_commit_fence",
                       "pm.alloc.skip_dest_flush",
                       "pm.alloc.skip_replay",
                       "pm.free.skip_bit_flush",
                       "pm.grow.skip_size_persist",
                       "pm.run.skip_bitmap_persist",
                       "pmwcas.skip_descriptor_persist",
                       "pmwcas.skip_dirty_flush",
                       "pmwcas.skip_status_persist");
