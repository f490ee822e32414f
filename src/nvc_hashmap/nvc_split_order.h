// nvc_split_order.h: split-order arithmetic of the NVC-Hashmap.
//
// Paper: Schwalb et al., IMDM'15, section 3.1, after Shalev & Shavit's
// split-ordered lists. Every record is a node of ONE list sorted by its
// split-order key: the bit reversal of its 63-bit hash with the top bit set,
// so the reversed key is odd (a regular key). Bucket b starts at a dummy
// whose key is reverse(b), which is even (a dummy key): it sorts just before
// every regular key whose hash ends in b's bits. Doubling the bucket count
// splits a bucket in two without moving a node; bucket b's parent (b with
// its highest set bit cleared) is the bucket it was split from, and its
// dummy precedes b's in the list.
//
// Part of the on-PM format: split-order keys are stored in nodes and
// recomputed from keys by Check (kit/hash.h's StableKeyHash never changes).
//
// Thread safety: pure functions. Unit test: nvc_split_order_test.cc.
#pragma once

#include <cstdint>

#include "kit/hash.h"
#include "pmindex/index.h"

namespace pmindex::internal::nvc {

inline uint64_t HashKey(KeyKind kind, Slice key) { return kit::StableKeyHash(kind, key); }

inline uint64_t Reverse64(uint64_t x) {
  x = ((x >> 1) & 0x5555555555555555ull) | ((x & 0x5555555555555555ull) << 1);
  x = ((x >> 2) & 0x3333333333333333ull) | ((x & 0x3333333333333333ull) << 2);
  x = ((x >> 4) & 0x0f0f0f0f0f0f0f0full) | ((x & 0x0f0f0f0f0f0f0f0full) << 4);
  return __builtin_bswap64(x);
}
// A regular node's split-order key (odd).
inline uint64_t SoRegular(uint64_t h) { return Reverse64(h | (1ull << 63)); }
// Bucket b's dummy's split-order key (even).
inline uint64_t SoDummy(uint64_t b) { return Reverse64(b); }
// The bucket b (> 0) was split from.
inline uint64_t ParentBucket(uint64_t b) { return b & ~(1ull << (63 - __builtin_clzll(b))); }

}  // namespace pmindex::internal::nvc
