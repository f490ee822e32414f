// Internal: the on-media layout shared by pool.cc and allocator.cc.
//
// See docs/pool-format.md. Everything here is fixed by the format version:
//   [0, 4 KiB)          pool header (Pool::Header in pool.cc)
//   [4 KiB, 68 KiB)     1024 allocator lanes of one cache line each
//   [68 KiB, 256 KiB)   reserved (zero)
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
inline constexpr uint32_t kFormatVersion = 1;
inline constexpr uint64_t kLanesOffset = 4096;
inline constexpr uint64_t kLaneCount = 1024;
inline constexpr uint64_t kLaneSize = 64;
inline constexpr uint64_t kHeapOffset = Allocator::kChunkSize;
inline constexpr uint64_t kMinPoolSize = kHeapOffset + Allocator::kChunkSize;
// Offset of the root slot inside the header (a valid Allocate destination).
inline constexpr uint64_t kRootSlotOffset = 192;
}  // namespace layout

// Creates the allocator of a mapped pool. `fresh`: a newly formatted pool
// (all chunks free, nothing to recover). Otherwise replays the lanes (unless
// read-only) and rebuilds the volatile state from the chunk headers; returns
// Corrupt if the metadata is invalid.
Status NewPoolAllocator(Pool* pool, bool fresh, bool read_only, std::unique_ptr<Allocator>* out);
// Called by Pool::Close before unmapping: detaches every thread's cache.
void ShutdownPoolAllocator(Allocator* a);

}  // namespace pmindex::pm
