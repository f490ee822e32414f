// kit/pm_block.h: out-of-line PM key/value blocks.
//
// Format (part of every index format that uses it): a block is {u64 len,
// len bytes padded to a multiple of 8}, allocated from the pool's allocator
// into the persistent word that owns it (allocate-into-destination: the
// allocation's commit is the store of the block's offset into that word, so
// a crash leaks nothing). Blocks are written with 8-byte atomic stores, so
// optimistic readers that race with a writer never race with plain stores.
//
// Reads are bounds-checked: an offset that is 0, not 8-aligned or outside
// the pool, or a length above the caller's maximum or past the pool's end,
// is refused (TryReadBlock: false; ReadBlock: Corrupt naming the offset).
// An optimistic reader that saw a stale word gets false and then fails its
// validation; a reader of a stable, damaged word reports Corrupt.
//
// Persist order (WriteBlock): the allocator makes the owning word durable;
// the block's words are then stored and flushed, without a fence: the
// caller's next fence (before it publishes the block, e.g. a bitmap commit)
// orders them.
//
// Thread safety: WriteBlock by the owner of the destination word (e.g. under
// the node's lock); the readers from any thread, concurrently with writers
// (they may return garbage that the caller's validation rejects, never read
// outside the pool).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "core/index_util.h"
#include "pmindex/pm/allocator.h"
#include "pmindex/pm/persist.h"
#include "pmindex/status.h"

namespace pmindex::internal::kit {

// Allocates a block for s into *dest (a PM word inside the pool at base) and
// writes and flushes it (no fence).
inline Status WriteBlock(pm::Allocator& alloc, char* base, uint64_t* dest, Slice s) {
  if (Status st = alloc.Allocate(dest, 8 + s.size()); !st.ok()) return st;
  auto* w = reinterpret_cast<uint64_t*>(base + *dest);
  pm::StoreAtomic(w, uint64_t(s.size()), __ATOMIC_RELAXED);
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t x;
    std::memcpy(&x, s.data() + i, 8);
    pm::StoreAtomic(w + 1 + i / 8, x, __ATOMIC_RELAXED);
  }
  if (i < s.size()) {
    uint64_t x = 0;
    std::memcpy(&x, s.data() + i, s.size() - i);
    pm::StoreAtomic(w + 1 + i / 8, x, __ATOMIC_RELAXED);
  }
  pm::Flush(w, 8 + s.size());
  return Status::OK();
}

namespace block_internal {
inline uint64_t Ld(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
}  // namespace block_internal

// Reads the block at off of a pool of pool_size bytes mapped at base into
// *out; false if off or the length is out of range (see above).
inline bool TryReadBlock(const char* base, uint64_t pool_size, uint64_t off, size_t maxlen, std::string* out) {
  using block_internal::Ld;
  if (off == 0 || off % 8) return false;
  if (off + 8 > pool_size) return false;
  const auto* w = reinterpret_cast<const uint64_t*>(base + off);
  uint64_t len = Ld(w);
  if (len > maxlen || off + 8 + len > pool_size) return false;
  out->resize(len);
  size_t i = 0;
  for (; i + 8 <= len; i += 8) {
    uint64_t x = Ld(w + 1 + i / 8);
    std::memcpy(out->data() + i, &x, 8);
  }
  if (i < len) {
    uint64_t x = Ld(w + 1 + i / 8);
    std::memcpy(out->data() + i, &x, len - i);
  }
  return true;
}

// TryReadBlock for a word that must hold a block: Corrupt if it does not.
inline Status ReadBlock(const char* base, uint64_t pool_size, uint64_t off, size_t maxlen, std::string* out) {
  if (TryReadBlock(base, pool_size, off, maxlen, out)) return Status::OK();
  return Status::Corrupt("block at " + std::to_string(off) + ": offset or length out of range (pool of " +
                         std::to_string(pool_size) + " bytes, length limit " + std::to_string(maxlen) + ")");
}

// True if the block at off holds exactly s (false also for a bad offset).
inline bool BlockEquals(const char* base, uint64_t pool_size, uint64_t off, Slice s) {
  using block_internal::Ld;
  if (off == 0 || off % 8 || off + 8 + s.size() > pool_size) return false;
  const auto* w = reinterpret_cast<const uint64_t*>(base + off);
  if (Ld(w) != s.size()) return false;
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t x;
    std::memcpy(&x, s.data() + i, 8);
    if (Ld(w + 1 + i / 8) != x) return false;
  }
  if (i < s.size()) {
    uint64_t x = Ld(w + 1 + i / 8), y = 0;
    std::memcpy(&y, s.data() + i, s.size() - i);
    uint64_t mask = (s.size() - i) == 8 ? ~0ull : ((1ull << (8 * (s.size() - i))) - 1);
    if ((x & mask) != y) return false;
  }
  return true;
}

// Byte-key order (memcmp, then length: CompareKeys) between the block at off
// and s: *cmp < 0, 0, > 0 as block < s, ==, >. False (and *cmp untouched) if
// the block cannot be read.
inline bool CompareBlock(const char* base, uint64_t pool_size, uint64_t off, size_t maxlen, Slice s, int* cmp) {
  std::string tmp;
  if (!TryReadBlock(base, pool_size, off, maxlen, &tmp)) return false;
  *cmp = CompareKeys(KeyKind::kBytes, tmp, s);
  return true;
}

// Blocks with a 32-bit length header, {u32 len, len bytes}, allocated as
// 4 + len bytes with no padding (fastfair's key and value blocks,
// docs/fastfair.md "Layout"). The same bounds rules as above. A view reads
// the bytes in place: for a block that no writer changes while it is read
// (written before its offset was published, freed only after an epoch
// grace period). False if off or the length is out of range.
inline bool TryViewBlock32(const char* base, uint64_t pool_size, uint64_t off, size_t maxlen, Slice* out) {
  if (off == 0 || off % 8 || off + 4 > pool_size) return false;
  const uint32_t len = __atomic_load_n(reinterpret_cast<const uint32_t*>(base + off), __ATOMIC_RELAXED);
  if (len > maxlen || off + 4 + len > pool_size) return false;
  *out = Slice(base + off + 4, len);
  return true;
}

// The Corrupt status of a block that TryViewBlock32 (or TryReadBlock)
// refused.
inline Status BlockOutOfRange(uint64_t off, uint64_t pool_size) {
  return Status::Corrupt("block at " + std::to_string(off) + ": offset or length out of range (pool of " +
                         std::to_string(pool_size) + " bytes)");
}

}  // namespace pmindex::internal::kit
