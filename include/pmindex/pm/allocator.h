// pmindex/pm/allocator.h: the crash-safe PM allocator.
//
// Contract (FPTree section 2, "persistent memory leaks"):
//   Allocate(dest, n) allocates a block and makes its offset durable in the
//   persistent word *dest; that store is the commit point. Free(dest) frees
//   the block *dest points to and makes *dest == 0 durable. After a crash at
//   any instant and Pool::Open, every block is either owned by exactly one
//   persistent word or free: never leaked, never owned twice.
// `dest` must lie inside the pool (a log, a node field, the root slot).
// Block contents are not initialised (AllocateZeroed zeroes and persists them
// before the commit). Blocks are 16-byte aligned, 64-byte aligned when the
// size class is >= 64 bytes.
//
// The caller's rule (docs/allocator.md, "Why step 3 needs no fence"): after
// Allocate(dest, n) returns OK, neither the calling thread nor any other
// may store to *dest, free the block, or hand the block to another thread
// until the calling thread has executed its next fence (pm::Fence, or any
// Persist/StorePersist, or its next Allocate/Free on this pool, which
// fence). Allocate's last step (clearing its micro-log) is flushed but not
// fenced; until that fence, recovery may replay the allocation and free the
// block again if *dest no longer holds it. Every index meets this by
// persisting the new node before linking it.
//
// Design (docs/allocator.md): the heap is a sequence of 256 KiB chunks. A
// chunk is free, a run of one size class with a persistent allocation bitmap
// in its first cache lines, or the head of a large block spanning whole
// chunks. Each thread owns a lane (a one-line micro-log) and its own current
// run per size class, so two threads do not serialise. Allocate: log
// {op, block, dest} and persist; set the bitmap bit and store *dest; flush
// both, fence; clear the log (flushed, ordered by the caller's next fence).
// Recovery replays each valid lane: an allocation whose *dest does not hold
// the block is rolled back, a logged free is rolled forward.
//
// Thread-safety: Allocate, AllocateZeroed, Free, UsableSize, IsAllocated and
// the counters from any number of threads (at most layout::kLaneCount = 1024
// threads at once per pool); ForEachAllocated and Check not concurrently
// with Allocate/Free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "pmindex/pm/pptr.h"
#include "pmindex/status.h"

namespace pmindex::pm {

class Pool;

class Allocator {
 public:
  static constexpr uint64_t kChunkSize = 256 * 1024;
  // Largest request served from a run of the small classes (pools of every
  // format version).
  static constexpr size_t kMaxRunBlock = 32 * 1024;
  // Largest request served from a run in a pool of format 3 or later: the
  // medium classes hold two to seven blocks per chunk. Larger requests (and
  // requests above kMaxRunBlock in older pools) take whole chunks.
  static constexpr size_t kMaxMediumBlock = 130944;
  // Largest request at all.
  static constexpr size_t kMaxAllocation = size_t(1) << 32;

  virtual ~Allocator() = default;

  // PoolFull (pool left consistent, *dest untouched) when the pool cannot
  // grow further; InvalidArgument if size is 0 or too large or dest is not
  // in the pool.
  virtual Status Allocate(uint64_t* dest, size_t size) = 0;
  virtual Status AllocateZeroed(uint64_t* dest, size_t size) = 0;
  // *dest must hold a block allocated from this pool (0: no-op, OK). The
  // block is not freed, and *dest is left unchanged, on: Unsupported (the
  // pool is open read-only), InvalidArgument (dest is not an aligned word
  // in the pool, or *dest is not an allocated block: a double free, an
  // interior pointer) and Busy (the calling thread has no lane yet and all
  // layout::kLaneCount lanes are taken by other threads).
  [[nodiscard]] virtual Status Free(uint64_t* dest) = 0;

  template <typename T>
  Status Allocate(PPtr<T>* dest, size_t size = sizeof(T)) { return Allocate(dest->raw(), size); }
  template <typename T>
  Status AllocateZeroed(PPtr<T>* dest, size_t size = sizeof(T)) { return AllocateZeroed(dest->raw(), size); }
  template <typename T>
  [[nodiscard]] Status Free(PPtr<T>* dest) { return Free(dest->raw()); }
  // Free for a step that cannot pass an error on (a void write or repair
  // step). A failure there is a corrupt pointer, a write to a read-only pool,
  // or a thread beyond the lane limit: it prints the status and aborts
  // rather than leak the block silently.
  void FreeOrAbort(uint64_t* dest);
  template <typename T>
  void FreeOrAbort(PPtr<T>* dest) { FreeOrAbort(dest->raw()); }

  // Usable bytes of the block at off (>= the requested size).
  virtual size_t UsableSize(uint64_t off) const = 0;
  virtual bool IsAllocated(uint64_t off) const = 0;
  // Sum of the usable sizes of allocated blocks, and their number.
  virtual uint64_t BytesInUse() const = 0;
  virtual uint64_t BlocksInUse() const = 0;
  // Visits every allocated block. Not concurrent with Allocate/Free.
  virtual void ForEachAllocated(const std::function<void(uint64_t off, size_t size)>& fn) const = 0;
  // Verifies allocator metadata (bitmaps, chunk headers, lanes).
  virtual Status Check() const = 0;
};

}  // namespace pmindex::pm
