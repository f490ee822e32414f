// Size-class runs: a run is one chunk serving blocks of one size class,
// with a persistent allocation bitmap after its header line (format in
// allocator_format.h). This file formats runs, hands them to thread caches,
// returns them to their class list or to the heap, and republishes freed
// blocks. Part of the allocator described in allocator_internal.h.
//
// Follows PiBench (VLDB'20) section 5.8 (allocation is a first-order cost):
// each thread allocates from its own current run per class without a lock.
//
// Persist order: formatting a run zeroes its bitmap and persists it, then
// stores and persists the chunk header RUN(class): a crash in between leaves
// a FREE chunk. Nothing else here writes PM; the bitmap bits are set and
// cleared by the lane operations (allocator_lanes.cc).
//
// Invariants: vbits ⊇ PM bitmap (Publish runs only after the freeing thread's
// lane clear was fenced); bits past a run's last block are set in vbits; an
// entirely free run unowned by any thread goes back to the heap when it is
// not its class's only partial run. At pool full nothing free stays
// stranded: Reclaim republishes every thread's pending block and returns
// entirely free runs, other threads' current runs included, to the heap;
// StealBlock then serves a class from other threads' partly free current
// runs.
//
// Thread-safety: a run's owner takes blocks without a lock; class lists are
// guarded by their class mutex, the free-chunk map by heap_mu_; Reclaim and
// StealBlock hold the registry mutex so that other threads' caches stay
// alive, and read other threads' current runs under the class mutex.
#include <algorithm>
#include <mutex>
#include <vector>

#include "pm/allocator_internal.h"
#include "pmindex/pm/fault.h"
#include "pmindex/pm/persist.h"

namespace pmindex::pm::alloc_internal {

Run* PoolAllocator::MakeRun(uint64_t chunk, int cls, bool from_pm) {
  const ClassGeom& g = Classes().geom[cls];
  Run* r = new Run;
  r->chunk = chunk;
  r->cls = cls;
  r->nblocks = g.nblocks;
  r->nwords = g.nwords;
  r->bsize = g.size;
  r->blocks_off = ChunkOff(chunk) + g.blocks_start;
  r->bitmap_off = ChunkOff(chunk) + 64;
  r->vbits.reset(new std::atomic<uint64_t>[g.nwords]);
  const uint64_t* pmbits = reinterpret_cast<const uint64_t*>(base_ + r->bitmap_off);
  int64_t used = 0;
  for (uint32_t w = 0; w < g.nwords; w++) {
    uint64_t v = from_pm ? __atomic_load_n(&pmbits[w], __ATOMIC_ACQUIRE) : 0;
    used += __builtin_popcountll(v);
    // Bits past the last block are permanently "in use" in DRAM.
    if (w == g.nwords - 1 && g.nblocks % 64) v |= ~0ull << (g.nblocks % 64);
    r->vbits[w].store(v, std::memory_order_relaxed);
  }
  r->free_count.store(int64_t(g.nblocks) - used, std::memory_order_relaxed);
  return r;
}

// Gives up tc's current run r of its class: back to the partial list if it
// has free blocks. A no-op when r is no longer tc's current run (Reclaim,
// on another thread, drained it meanwhile).
void PoolAllocator::ReleaseRun(ThreadCache* tc, Run* r) {
  ClassState& cs = classes_[r->cls];
  std::lock_guard<std::mutex> g(cs.mu);
  if (tc->cur[r->cls].load(std::memory_order_relaxed) != r) return;
  tc->cur[r->cls].store(nullptr, std::memory_order_relaxed);
  r->owner.store(nullptr, std::memory_order_relaxed);
  if (r->free_count.load(std::memory_order_relaxed) > 0 && !r->in_list) {
    r->in_list = true;
    cs.partial.push_back(r);
  }
}

// Pops partial runs of class cls until one with a free block is found and
// makes it tc's current run. Caller holds classes_[cls].mu.
bool PoolAllocator::TakePartialRun(ThreadCache* tc, int cls, Run** out) {
  ClassState& cs = classes_[cls];
  while (!cs.partial.empty()) {
    Run* r = cs.partial.back();
    cs.partial.pop_back();
    r->in_list = false;
    if (r->free_count.load(std::memory_order_relaxed) > 0) {
      r->owner.store(tc, std::memory_order_relaxed);
      tc->cur[cls].store(r, std::memory_order_release);
      *out = r;
      return true;
    }
  }
  return false;
}

Status PoolAllocator::Refill(ThreadCache* tc, int cls, Run** out, uint32_t* idx) {
  ClassState& cs = classes_[cls];
  for (;;) {
    if (Run* cur = tc->cur[cls].load(std::memory_order_relaxed)) ReleaseRun(tc, cur);
    bool got;
    {
      std::lock_guard<std::mutex> g(cs.mu);
      got = TakePartialRun(tc, cls, out);
    }
    if (got) {
      if (TakeBlock(*out, idx)) return Status::OK();
      continue;  // another thread took its last free block (StealBlock)
    }
    uint64_t chunk;
    Status s;
    {
      std::lock_guard<std::mutex> g(heap_mu_);
      s = NewChunks(1, &chunk);
    }
    if (!s.ok()) {
      if (!s.IsPoolFull()) return s;
      Reclaim(tc);
      {
        // Reclaiming may have republished blocks of this class.
        std::lock_guard<std::mutex> g(cs.mu);
        got = TakePartialRun(tc, cls, out);
      }
      if (got) {
        if (TakeBlock(*out, idx)) return Status::OK();
        continue;
      }
      {
        std::lock_guard<std::mutex> g(heap_mu_);
        s = NewChunks(1, &chunk);
      }
      if (!s.ok()) {
        if (s.IsPoolFull() && StealBlock(tc, cls, out, idx)) return Status::OK();
        return s;
      }
    }
    // Format: zero the bitmap, persist, then the header (the chunk is ours).
    const ClassGeom& geom = Classes().geom[cls];
    Set(base_ + ChunkOff(chunk) + 64, 0, geom.nwords * 8);
    if (!PMINDEX_FAULT("pm.run.skip_bitmap_persist")) Persist(base_ + ChunkOff(chunk) + 64, geom.nwords * 8);
    StorePersist(State(chunk), RunState(cls));
    Run* r = MakeRun(chunk, cls, false);
    r->owner.store(tc, std::memory_order_relaxed);
    Slot(chunk).run.store(r, std::memory_order_release);
    Slot(chunk).kind.store(kRunChunk, std::memory_order_release);
    tc->cur[cls].store(r, std::memory_order_release);
    *out = r;
    if (TakeBlock(r, idx)) return Status::OK();
  }
}

std::vector<ThreadCache*> PoolAllocator::OtherCaches(ThreadCache* tc) {
  std::vector<ThreadCache*> v;
  std::lock_guard<std::mutex> g(caches_mu_);
  for (auto& p : caches_)
    if (p && p.get() != tc) v.push_back(p.get());
  return v;
}

bool PoolAllocator::DrainFreeRun(Run* r) {
  if (r->free_count.load(std::memory_order_relaxed) != int64_t(r->nblocks)) return false;
  std::vector<uint64_t> taken(r->nwords, 0);
  for (uint32_t w = 0; w < r->nwords; w++) {
    const uint64_t mask = (w == r->nwords - 1 && r->nblocks % 64) ? ~(~0ull << (r->nblocks % 64)) : ~0ull;
    const uint64_t old = r->vbits[w].fetch_or(mask, std::memory_order_acq_rel);
    taken[w] = ~old & mask;
    if (old & mask) {
      // The owner took a block meanwhile: give back what this drain took.
      for (uint32_t k = 0; k <= w; k++)
        if (taken[k]) r->vbits[k].fetch_and(~taken[k], std::memory_order_acq_rel);
      return false;
    }
  }
  r->free_count.store(0, std::memory_order_relaxed);
  return true;
}

// Returns entirely free runs to the heap, so that chunks can change size
// class or serve large blocks, after republishing the freed blocks that
// every thread holds back until its lane clear is durable. Called when the
// pool is full. The registry mutex keeps the other threads' caches alive.
void PoolAllocator::Reclaim(ThreadCache* tc) {
  Flush(tc->lane, sizeof(Lane));
  Fence();  // this thread's last lane clear is durable: its pending block may be reused
  PublishPending(tc);
  std::vector<Run*> freed, drained;
  std::lock_guard<std::mutex> rg(RegistryMu());
  const std::vector<ThreadCache*> others = OtherCaches(tc);
  for (ThreadCache* o : others) {
    if (const uint64_t off = o->pending.exchange(0, std::memory_order_acq_rel)) {
      // o's Free stored its lane clear before publishing off as pending:
      // make that clear durable from here, then the block may be reused.
      Flush(o->lane, sizeof(Lane));
      Fence();
      Publish(tc, off);
    }
  }
  for (int c = 0; c < kNumClasses; c++) {
    ClassState& cs = classes_[c];
    std::lock_guard<std::mutex> g(cs.mu);
    Run* cur = tc->cur[c].load(std::memory_order_relaxed);
    if (cur && cur->free_count.load(std::memory_order_relaxed) == int64_t(cur->nblocks)) {
      cur->owner.store(nullptr, std::memory_order_relaxed);
      tc->cur[c].store(nullptr, std::memory_order_relaxed);
      if (cur->in_list) {
        cs.partial.erase(std::find(cs.partial.begin(), cs.partial.end(), cur));
        cur->in_list = false;
      }
      freed.push_back(cur);
    }
    for (ThreadCache* o : others) {
      // Under cs.mu, o's current run stays alive (allocator_internal.h).
      Run* r = o->cur[c].load(std::memory_order_acquire);
      if (!r || !DrainFreeRun(r)) continue;
      o->cur[c].store(nullptr, std::memory_order_relaxed);
      r->owner.store(nullptr, std::memory_order_relaxed);
      if (r->in_list) {
        cs.partial.erase(std::find(cs.partial.begin(), cs.partial.end(), r));
        r->in_list = false;
      }
      drained.push_back(r);
    }
    for (size_t i = 0; i < cs.partial.size();) {
      Run* r = cs.partial[i];
      if (r->owner.load(std::memory_order_relaxed) == nullptr &&
          r->free_count.load(std::memory_order_relaxed) == int64_t(r->nblocks)) {
        r->in_list = false;
        cs.partial[i] = cs.partial.back();
        cs.partial.pop_back();
        freed.push_back(r);
      } else {
        i++;
      }
    }
  }
  std::lock_guard<std::mutex> g(heap_mu_);
  for (Run* r : freed) {
    Slot(r->chunk).kind.store(kFreeChunk, std::memory_order_release);
    Slot(r->chunk).run.store(nullptr, std::memory_order_release);
    chunk_free_[r->chunk] = 1;
    delete r;
  }
  for (Run* r : drained) {
    // Its former owner may still be reading r (a TakeBlock that will fail).
    Slot(r->chunk).kind.store(kFreeChunk, std::memory_order_release);
    Slot(r->chunk).run.store(nullptr, std::memory_order_release);
    chunk_free_[r->chunk] = 1;
    retired_.emplace_back(r);
  }
}

// At pool full, after Reclaim: takes a free block of class cls from another
// thread's current run (free blocks that only their owner would otherwise
// see). The run cannot be deleted while the block is taken, since it is
// then not entirely free.
bool PoolAllocator::StealBlock(ThreadCache* tc, int cls, Run** out, uint32_t* idx) {
  std::lock_guard<std::mutex> rg(RegistryMu());
  const std::vector<ThreadCache*> others = OtherCaches(tc);
  std::lock_guard<std::mutex> g(classes_[cls].mu);
  for (ThreadCache* o : others) {
    Run* r = o->cur[cls].load(std::memory_order_acquire);
    if (r && TakeBlockShared(r, idx)) {
      *out = r;
      return true;
    }
  }
  return false;
}

// Makes a freed block available for reuse. Called only after a fence that
// follows the freeing operation's lane clear.
void PoolAllocator::Publish(ThreadCache* tc, uint64_t off) {
  const uint64_t chunk = (off - layout::kHeapOffset) / C;
  ChunkSlot& slot = Slot(chunk);
  if (slot.kind.load(std::memory_order_acquire) == kLargeHead) {
    std::lock_guard<std::mutex> g(heap_mu_);
    const uint64_t span = slot.span.load(std::memory_order_relaxed);
    for (uint64_t i = chunk; i < chunk + span; i++) {
      Slot(i).kind.store(kFreeChunk, std::memory_order_release);
      Slot(i).run.store(nullptr, std::memory_order_relaxed);
      chunk_free_[i] = 1;
    }
    return;
  }
  Run* r = slot.run.load(std::memory_order_acquire);
  const uint32_t idx = uint32_t((off - r->blocks_off) / r->bsize);
  r->vbits[idx / 64].fetch_and(~(1ull << (idx % 64)), std::memory_order_acq_rel);
  if (r->owner.load(std::memory_order_relaxed) == tc) {
    r->free_count.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  ClassState& cs = classes_[r->cls];
  bool to_heap = false;
  {
    std::lock_guard<std::mutex> g(cs.mu);
    int64_t f = r->free_count.fetch_add(1, std::memory_order_relaxed) + 1;
    if (r->owner.load(std::memory_order_relaxed) == nullptr) {
      const size_t others = cs.partial.size() - (r->in_list ? 1 : 0);
      if (f == int64_t(r->nblocks) && others >= 1) {
        // Entirely free and not the only partial run: give the chunk back.
        if (r->in_list) cs.partial.erase(std::find(cs.partial.begin(), cs.partial.end(), r));
        to_heap = true;
      } else if (!r->in_list) {
        r->in_list = true;
        cs.partial.push_back(r);
      }
    }
  }
  if (to_heap) {
    std::lock_guard<std::mutex> g(heap_mu_);
    slot.kind.store(kFreeChunk, std::memory_order_release);
    slot.run.store(nullptr, std::memory_order_release);
    chunk_free_[chunk] = 1;
    delete r;
  }
}

}  // namespace pmindex::pm::alloc_internal
