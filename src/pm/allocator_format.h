// The on-PM format of the crash-safe allocator: chunk header states, run
// geometry per size class, and the allocation lanes. Shared by the write
// paths (allocator_lanes.cc, allocator_runs.cc, allocator_large.cc) and by
// recovery and Check (allocator.cc, allocator_lanes.cc). docs/allocator.md
// draws it; the pool's fixed regions (header page, lanes, root slot, heap
// start) are in pm/layout.h.
//
// Follows FPTree (SIGMOD'16) section 2, "persistent memory leaks": a block is
// allocated into a persistent destination word whose store is the commit
// point, with a per-thread micro-log (lane) that recovery replays.
//
// Layout:
//   heap: whole chunks of Allocator::kChunkSize (256 KiB) from
//     layout::kHeapOffset on.
//   chunk header (first 8 bytes of each chunk): FREE (0), RUN(class) or
//     LARGE(span), each tagged so random data is an invalid state. A LARGE
//     block starts 64 bytes into its head chunk and spans whole chunks; the
//     header lines of its later chunks are user data and are never
//     interpreted.
//   run: header line, then the allocation bitmap (one bit per block, 1 = in
//     use, 8-byte words) rounded up to whole lines, then the blocks.
//   lane (one cache line per thread, layout::kLaneCount of them): {op, block,
//     dest, arg}; op is written last, so a durable op implies durable fields
//     (stores to one line persist in program order). arg is the size class,
//     or kArgLarge | span.
//
// Invariants (when no operation is in flight):
//   * a block is in use iff its bitmap bit is set (RUN) / its head is LARGE;
//   * every in-use block is referenced by exactly one persistent word (the
//     caller's contract), and every lane is idle (op == kOpIdle).
//
// The format is fixed: the size-class table, the state tags and the lane op
// words are part of every existing pool. Changing any of them needs a new
// pool format version (pm/layout.h). Format 3 appended the medium classes
// (indices kNumSmallClasses..kNumClasses-1); a pool of an older format uses
// only the small classes, so the builds that read it can still open it, and
// a RUN state of a medium class in such a pool is Corrupt.
//
// Thread-safety: constants and the immutable class table only; Classes() is
// initialised once (a function-local static) and read-only afterwards.
#pragma once

#include <cstddef>
#include <cstdint>

#include "pm/layout.h"
#include "pmindex/pm/allocator.h"

// Hidden: the allocator's internals are not part of libpmindex's ABI, and
// calls between its files then bind directly inside the library.
namespace pmindex::pm {
namespace alloc_internal __attribute__((visibility("hidden"))) {

constexpr uint64_t C = Allocator::kChunkSize;

// ---- size classes --------------------------------------------------------
// The small classes (every format version): steps of at most 1.25x up to
// 32 KiB. The medium classes (format 3): the largest multiple of 64 bytes
// of which n = 7, 6, 5, 4, 3, 2 blocks fill a chunk after its two header
// lines, so a medium run wastes under 400 bytes of its chunk.
constexpr uint32_t kClassSizes[] = {16,    32,    48,    64,    128,   192,   256,   320,   384,   448,   512,
                                    640,   768,   896,   1024,  1280,  1536,  1792,  2048,  2560,  3072,  3584,
                                    4096,  5120,  6144,  7168,  8192,  10240, 12288, 14336, 16384, 20480, 24576,
                                    28672, 32768, 37376, 43648, 52352, 65472, 87296, 130944};
constexpr int kNumClasses = int(sizeof(kClassSizes) / sizeof(kClassSizes[0]));
// Classes usable in a pool of format version < kMediumClassesVersion.
constexpr int kNumSmallClasses = 35;
constexpr uint32_t kMediumClassesVersion = 3;
static_assert(kClassSizes[kNumSmallClasses - 1] == Allocator::kMaxRunBlock);
static_assert(kClassSizes[kNumClasses - 1] == Allocator::kMaxMediumBlock);
static_assert(2 * uint64_t(Allocator::kMaxMediumBlock) + 128 <= Allocator::kChunkSize);

// Where a run of one class keeps its blocks: as many blocks as fit after the
// header line and the line-rounded bitmap.
struct ClassGeom {
  uint32_t size = 0, nblocks = 0, nwords = 0, blocks_start = 0;  // blocks_start: offset inside the chunk
};

struct ClassTable {
  ClassGeom geom[kNumClasses];
  uint8_t by16[Allocator::kMaxMediumBlock / 16 + 1];  // (size+15)/16 -> class
  ClassTable() {
    for (int c = 0; c < kNumClasses; c++) {
      ClassGeom& g = geom[c];
      g.size = kClassSizes[c];
      uint32_t n = uint32_t((C - 64) / g.size);
      for (;; n--) {
        uint32_t words = (n + 63) / 64;
        uint32_t start = uint32_t(64 + ((words * 8 + 63) / 64) * 64);
        if (start + uint64_t(n) * g.size <= C) {
          g.nblocks = n;
          g.nwords = words;
          g.blocks_start = start;
          break;
        }
      }
    }
    int c = 0;
    for (uint32_t i = 0; i <= Allocator::kMaxMediumBlock / 16; i++) {
      while (kClassSizes[c] < i * 16) c++;
      by16[i] = uint8_t(c);
    }
  }
};
inline const ClassTable& Classes() {
  static const ClassTable t;
  return t;
}
inline int ClassOf(size_t size) { return Classes().by16[(size + 15) / 16]; }

// ---- chunk header states ---------------------------------------------------
constexpr uint64_t kStateFree = 0;
constexpr uint64_t kKindRun = 0x52ull << 56;    // 'R'
constexpr uint64_t kKindLarge = 0x4Cull << 56;  // 'L'
constexpr uint64_t kStateTag = 0xA5ull << 48;
constexpr uint64_t kKindMask = 0xFFFFull << 48;
inline uint64_t RunState(int cls) { return kKindRun | kStateTag | uint64_t(cls); }
inline uint64_t LargeState(uint64_t span) { return kKindLarge | kStateTag | span; }
inline bool IsRunState(uint64_t s) { return (s & kKindMask) == (kKindRun | kStateTag) && (s & 0xFFFFFFFFFFFFull) < uint64_t(kNumClasses); }
inline bool IsLargeState(uint64_t s) { return (s & kKindMask) == (kKindLarge | kStateTag) && (s & 0xFFFFFFFFFFFFull) >= 1; }
inline uint64_t StateArg(uint64_t s) { return s & 0xFFFFFFFFFFFFull; }

// ---- lanes -----------------------------------------------------------------
constexpr uint64_t kOpIdle = 0;
constexpr uint64_t kOpAlloc = 0x414C4C4F43A5A501ull;  // "ALLOC"
constexpr uint64_t kOpFree = 0x46524545A5A5A502ull;   // "FREE"
constexpr uint64_t kArgLarge = 1ull << 63;              // arg = kArgLarge | span, else class

struct alignas(64) Lane {
  uint64_t op;
  uint64_t block;
  uint64_t dest;
  uint64_t arg;
  uint64_t pad[4];
};
static_assert(sizeof(Lane) == layout::kLaneSize);

}  // namespace alloc_internal
}  // namespace pmindex::pm
