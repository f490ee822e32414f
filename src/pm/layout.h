// Internal: the on-media layout shared by pool.cc, the allocator files and
// the PMwCAS descriptor region (pmwcas.cc).
//
// See docs/pool-format.md. Everything here is fixed by the format version:
//   [0, 4 KiB)          pool header (Pool::Header in pool.cc)
//   [4 KiB, 68 KiB)     1024 allocator lanes of one cache line each
//   [68 KiB, 256 KiB)   PMwCAS descriptor region (format 2; reserved and
//                       zero in format 1)
//   [256 KiB, size)     heap: chunks of Allocator::kChunkSize
// The heap starts at one chunk so that the pool size is a whole number of
// chunks and every chunk is 256 KiB aligned relative to the base.
#pragma once

#include <cstdint>
#include <memory>

#include "pmindex/pm/allocator.h"
#include "pmindex/status.h"

namespace pmindex::pm {

class Pool;

namespace layout {
// Format 2 adds the PMwCAS descriptor region and its header line; a format 1
// pool opens with the same code and has no PMwCAS (Pool::pmwcas() null).
// Format 3 adds the allocator's medium size classes (allocator_format.h);
// the allocator of a format 1 or 2 pool keeps to the small classes, so
// older builds still open it, and refuse a format 3 pool by its version.
inline constexpr uint32_t kFormatVersion = 3;
inline constexpr uint32_t kOldestFormatVersion = 1;
inline constexpr uint64_t kLanesOffset = 4096;
inline constexpr uint64_t kLaneCount = 1024;
inline constexpr uint64_t kLaneSize = 64;
inline constexpr uint64_t kHeapOffset = Allocator::kChunkSize;
inline constexpr uint64_t kMinPoolSize = kHeapOffset + Allocator::kChunkSize;
// Offset of the root slot inside the header (a valid Allocate destination).
inline constexpr uint64_t kRootSlotOffset = 192;
// PMwCAS descriptors (src/pm/pmwcas_internal.h); their fields are valid
// Allocate destinations (a fresh block owned by a descriptor entry).
inline constexpr uint64_t kPmwcasRegionOffset = kLanesOffset + kLaneCount * kLaneSize;
inline constexpr uint64_t kPmwcasRegionSize = kHeapOffset - kPmwcasRegionOffset;
// Offset of the header line that describes the region (format 2).
inline constexpr uint64_t kPmwcasInfoOffset = 320;
inline constexpr bool InPmwcasRegion(uint64_t off) {
  return off >= kPmwcasRegionOffset && off + 8 <= kHeapOffset;
}
}  // namespace layout

// Creates the allocator of a mapped pool. `fresh`: a newly formatted pool
// (all chunks free, nothing to recover). Otherwise replays the lanes (unless
// read-only) and rebuilds the volatile state from the chunk headers; returns
// Corrupt if the metadata is invalid.
Status NewPoolAllocator(Pool* pool, bool fresh, bool read_only, std::unique_ptr<Allocator>* out);
// Called by Pool::Close before unmapping: detaches every thread's cache.
void ShutdownPoolAllocator(Allocator* a);

}  // namespace pmindex::pm
