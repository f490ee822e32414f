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
// Design (docs/allocator.md): the heap is a sequence of 256 KiB chunks. A
// chunk is free, a run of one size class with a persistent allocation bitmap
// in its first cache lines, or the head of a large block spanning whole
// chunks. Each thread owns a lane (a one-line micro-log) and its own current
// run per size class, so two threads do not serialise. Allocate: log
// {op, block, dest} and persist; set the bitmap bit and store *dest; flush
// both, fence; clear the log (flushed, ordered by the caller's next fence).
// Recovery replays each valid lane: an allocation whose *dest does not hold
// the block is rolled back, a logged free is rolled forward.
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
  // Largest request served from a run; larger requests take whole chunks.
  static constexpr size_t kMaxRunBlock = 32 * 1024;
  // Largest request at all.
  static constexpr size_t kMaxAllocation = size_t(1) << 32;

  virtual ~Allocator() = default;

  // PoolFull (pool left consistent, *dest untouched) when the pool cannot
  // grow further; InvalidArgument if size is 0 or too large or dest is not
  // in the pool.
  virtual Status Allocate(uint64_t* dest, size_t size) = 0;
  virtual Status AllocateZeroed(uint64_t* dest, size_t size) = 0;
  // *dest must hold a block allocated from this pool (0: no-op).
  virtual void Free(uint64_t* dest) = 0;

  template <typename T>
  Status Allocate(PPtr<T>* dest, size_t size = sizeof(T)) { return Allocate(dest->raw(), size); }
  template <typename T>
  Status AllocateZeroed(PPtr<T>* dest, size_t size = sizeof(T)) { return AllocateZeroed(dest->raw(), size); }
  template <typename T>
  void Free(PPtr<T>* dest) { Free(dest->raw()); }

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
