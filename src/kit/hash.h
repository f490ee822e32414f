// kit/hash.h: the hash functions the indexes share.
//
// Both families are part of on-PM formats and must never change: fptree's
// fingerprints (one byte of FingerprintHash* stored in every leaf) and
// nvc_hashmap's split-order keys (StableKeyHash decides where a record sits in
// the list) are recomputed from keys at recovery and compared against what
// the pool holds. A new index picks one of them (or adds a new, named
// function here) and records the choice in its format version.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <cstring>

#include "pmindex/index.h"

namespace pmindex::internal::kit {

// MurmurHash3's 64-bit finaliser (fmix64): a bijection on u64.
inline uint64_t Fmix64(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ull;
  k ^= k >> 33;
  return k;
}

// SplitMix64's finaliser (Stafford's variant 13): a bijection on u64.
inline uint64_t SplitMix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

// fptree's fingerprint hashes: the fingerprint is the top byte, the home slot
// line comes from bits 8..23.
inline uint64_t FingerprintHashU64(uint64_t k) { return Fmix64(k); }
inline uint64_t FingerprintHashBytes(Slice s) {
  uint64_t h = 0xcbf29ce484222325ull ^ s.size();
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = Fmix64(h ^ w);
  }
  uint64_t w = 0;
  std::memcpy(&w, s.data() + i, s.size() - i);
  return Fmix64(h ^ w ^ 0x9e3779b97f4a7c15ull);
}

// nvc_hashmap's key hash (its split-order key is the bit reversal of it).
inline uint64_t StableKeyHash(KeyKind kind, Slice key) {
  if (kind == KeyKind::kU64) return SplitMix64(SliceToU64(key));
  uint64_t h = 0x6a09e667f3bcc909ull ^ (uint64_t(key.size()) * 0x9e3779b97f4a7c15ull);
  const char* p = key.data();
  size_t n = key.size();
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = SplitMix64(h ^ w) + 0x9e3779b97f4a7c15ull;
    p += 8;
    n -= 8;
  }
  if (n) {
    uint64_t w = 0;
    std::memcpy(&w, p, n);
    h = SplitMix64(h ^ w ^ (uint64_t(n) << 56));
  }
  return SplitMix64(h);
}

}  // namespace pmindex::internal::kit
