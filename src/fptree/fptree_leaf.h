// fptree/fptree_leaf.h: what happens inside one leaf, independent of the
// tree: fingerprints (sec. 4.2), the fingerprint probe, home-line placement,
// free-slot choice and the scan-order hint's encoding. Layout:
// fptree_format.h. Functions here take a leaf's address and its LeafLayout
// and need no pool, so a test can run them on a buffer.
//
// Fingerprints: a key's 64-bit hash (kit/hash.h, format-fixed); the
// fingerprint is its top byte, the home line comes from bits 8..23. A lookup
// compares the search key only with the slots whose fingerprint matches
// (FpMatch: one SIMD compare over line 0), E[T] = 1 + (m-1)/256 key probes
// for a present key (paper sec. 4.2); FPTreeKeyProbes counts them.
//
// Home-line placement (not in the paper; a performance heuristic, not
// state): an insert, or an algorithm-8 update, takes a free slot in the key's
// home line if there is one, else the first free slot. The descent
// prefetches the home line (fptree: with line 0), so a find's key compare of
// a record at home does not wait for the fingerprints first. Lookups never
// rely on it: every fingerprint is probed and a record may sit in any slot.
//
// Invariants: see fptree_format.h. The hint is never trusted unchecked
// (fptree_scan.cc).
//
// Thread safety: readers load leaf words with relaxed atomics (Ld) so that
// optimistic readers racing with a writer read torn-free words; the caller
// validates the leaf's version afterwards. StoreHint is a volatile store any
// reader may make.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "fptree/fptree_format.h"
#include "kit/hash.h"
#include "pmindex/pm/persist.h"
#include "pmindex/index.h"

#if defined(__SANITIZE_THREAD__)
#define FPT_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FPT_TSAN 1
#endif
#endif

// The library is a shared object: thread_locals default to the general-dynamic
// model, one __tls_get_addr call per access (callgrind: ~10% of a find).
// initial-exec takes a few bytes of static TLS, which glibc reserves also for
// libraries loaded with dlopen (the PiBench plugins).
#define FPT_TLS thread_local __attribute__((tls_model("initial-exec")))

namespace pmindex::internal::fptree {

// In-leaf key comparisons of this thread (FPTreeKeyProbes).
extern FPT_TLS uint64_t tl_probes;

inline uint64_t Ld(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
inline uint8_t Ld8(const uint8_t* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }

inline uint64_t HashU64(uint64_t k) { return kit::FingerprintHashU64(k); }
inline uint8_t FpU64(uint64_t k) { return uint8_t(HashU64(k) >> 56); }
inline uint64_t HashBytes(Slice s) { return kit::FingerprintHashBytes(s); }
inline uint8_t FpBytes(Slice s) { return uint8_t(HashBytes(s) >> 56); }

// Fingerprint match mask over the 56 bytes following the bitmap (bit i set
// if fingerprint i equals fp). SIMD (AVX2 when compiled for it, else SSE2).
inline uint64_t FpMatch(const char* line, uint8_t fp) {
#ifdef FPT_TSAN
  alignas(64) uint64_t w[8];
  for (int i = 0; i < 8; i++) w[i] = __atomic_load_n(reinterpret_cast<const uint64_t*>(line) + i, __ATOMIC_RELAXED);
  const char* p = reinterpret_cast<const char*>(w);
#else
  const char* p = line;
#endif
#ifdef __AVX2__
  __m256i f = _mm256_set1_epi8(char(fp));
  uint64_t lo = uint32_t(_mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_load_si256(reinterpret_cast<const __m256i*>(p)), f)));
  uint64_t hi = uint32_t(_mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_load_si256(reinterpret_cast<const __m256i*>(p + 32)), f)));
  return (lo | (hi << 32)) >> 8;
#else
  __m128i f = _mm_set1_epi8(char(fp));
  uint64_t m = 0;
  for (int i = 0; i < 4; i++)
    m |= uint64_t(uint16_t(_mm_movemask_epi8(_mm_cmpeq_epi8(_mm_load_si128(reinterpret_cast<const __m128i*>(p + 16 * i)), f)))) << (16 * i);
  return m >> 8;
#endif
}

// A search key with its fingerprint.
struct SKey {
  uint64_t u = 0;
  Slice s;
  uint8_t fp = 0;
  uint16_t home = 0;  // hash bits 8..23 (HomeLine); 0 in keys not made by MakeKey
};

template <bool kBytes>
inline SKey MakeKey(Slice k) {
  SKey sk;
  if constexpr (kBytes) {
    sk.s = k;
    uint64_t h = HashBytes(k);
    sk.fp = uint8_t(h >> 56);
    sk.home = uint16_t(h >> 8);
  } else {
    sk.u = SliceToU64(k);
    uint64_t h = HashU64(sk.u);
    sk.fp = uint8_t(h >> 56);
    sk.home = uint16_t(h >> 8);
  }
  return sk;
}

// The slot among the valid ones (bm) whose key equals k (eq(slot) compares
// it), or -1. fptree variants probe the fingerprint matches only.
template <class Eq>
inline int FindSlot(const LeafLayout& lay, char* l, uint64_t bm, uint8_t fp, Eq&& eq) {
  uint64_t mask = lay.fp ? (FpMatch(l, fp) & bm) : bm;
  while (mask) {
    int i = __builtin_ctzll(mask);
    mask &= mask - 1;
    if (eq(i)) return i;
  }
  return -1;
}

// A key's home line (one of the leaf's slot lines, from its hash) and its address.
inline uint32_t HomeLine(const LeafLayout& lay, const SKey& k) { return (uint32_t(k.home) * lay.home_lines) >> 16; }
inline char* HomeLineAddr(const LeafLayout& lay, char* l, const SKey& k) { return l + lay.key_off + 64 * HomeLine(lay, k); }
// A free slot of a leaf with bitmap bm, in slot line `line` if it has one
// (the leaf must not be full).
inline int FreeSlotFor(const LeafLayout& lay, uint64_t bm, uint32_t line) {
  uint64_t freem = ~bm & lay.full;
  uint64_t in = freem & (0xFull << (4 * line));
  return __builtin_ctzll(in ? in : freem);
}

// ---------------------------------------------------------------------------
// Scan-order hint encoding: up to 64 six-bit slot indices, entry j at bits
// [6j, 6j+6) of the six little-endian hint words (48 bytes). What a hint
// means and when it is trusted: fptree_scan.cc.
constexpr int kHintWords = 6;

// Hint words needed for cnt entries, loaded into w (7 words: byte 6g..6g+7
// of group g = entries 8g..8g+7 is always inside the array).
__attribute__((always_inline)) inline int LoadHintWords(const LeafLayout& lay, char* l, int cnt, uint64_t* w) {
  const int nw = (6 * cnt + 63) / 64;
  const uint64_t* h = lay.Hint(l);
  for (int i = 0; i < nw; i++) w[i] = Ld(h + i);
  for (int i = nw; i <= kHintWords; i++) w[i] = 0;
  return nw;
}
// Entries 8g..8g+7 of the hint (six bits each, from bit 0).
inline uint64_t HintGroup(const uint64_t* w, int g) {
  uint64_t x;
  std::memcpy(&x, reinterpret_cast<const char*>(w) + 6 * g, 8);
  return x;
}
// Decodes the first cnt = popcount(bm) hint entries into ord; true iff
// they name exactly the slots of bm (then they are distinct). cnt <= 1
// needs no hint.
inline bool LoadHint(const LeafLayout& lay, char* l, uint64_t bm, int cnt, uint8_t* ord) {
  if (cnt <= 1) {
    if (cnt) ord[0] = uint8_t(__builtin_ctzll(bm));
    return true;
  }
  uint64_t w[kHintWords + 1];
  LoadHintWords(lay, l, cnt, w);
  uint64_t seen = 0;
  for (int j = 0; j < cnt; j++) {
    unsigned s = unsigned(HintGroup(w, j >> 3) >> (6 * (j & 7))) & 63;
    ord[j] = uint8_t(s);
    seen |= 1ull << s;
  }
  return seen == bm;
}
// Stores the order ord[0..cnt) as the leaf's hint (volatile stores: never
// flushed, never part of the durable state).
__attribute__((always_inline)) inline void StoreHint(const LeafLayout& lay, char* l, const uint8_t* ord, int cnt) {
  if (cnt <= 1) return;
  uint64_t w[kHintWords + 1] = {};
  char* b = reinterpret_cast<char*>(w);
  for (int g = 0; 8 * g < cnt; g++) {
    uint64_t x = 0;
    for (int j = 8 * g; j < cnt && j < 8 * g + 8; j++) x |= uint64_t(ord[j]) << (6 * (j & 7));
    std::memcpy(b + 6 * g, &x, 6);
  }
  const int nw = (6 * cnt + 63) / 64;
  uint64_t* h = lay.Hint(l);
  for (int i = 0; i < nw; i++) pm::StoreVolatile(h + i, w[i], __ATOMIC_RELAXED);
}

}  // namespace pmindex::internal::fptree
