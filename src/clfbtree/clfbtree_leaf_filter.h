// clfbtree_leaf_filter.h: the DRAM fingerprint filter of an append-only
// leaf with u64 keys (docs/clfbtree.md, "Leaf fingerprints"). No paper
// section: the paper searches an append-only leaf linearly (sec. 2.2).
//
// An append leaf's entries are unsorted, so a find, and an insert's check
// that its key is absent, would read every valid entry (up to 16 PM lines
// for a 1 KiB leaf). The filter keeps one byte per slot, a hash of the
// slot's key (Fp), in DRAM: a lookup compares the key's byte with all of
// them at once, masks the result with the leaf's validity bitmap, and reads
// only the entries that match (about one in 256 slots besides the key's own
// one). One filter per leaf, found by the leaf's address through a
// kit::LockTable (granule: the leaf size, so live leaves never share one).
// Nothing here is persistent: the table is zero at every open.
//
// Invariants: the filter is valid while tag == (the leaf's unlocked
// version | 1); then fp[i] == Fp(key of slot i) for every slot whose bitmap
// bit is set (a cleared slot's byte is stale and masked out). Only a holder
// of the leaf's version lock writes the filter, and only to set tag to the
// version its own unlock publishes; every other change of the leaf changes
// its version, which invalidates the filter (a zero tag, as at open, is
// never valid; versions never repeat for a lock word: kit/version_lock.h).
//
// Thread safety: a writer holds the leaf's lock; a reader reads the tag and
// the bytes with relaxed atomic loads between its ReadBegin and Validate of
// the leaf's version (a torn read fails the validation, as for the leaf).
#pragma once

#include <emmintrin.h>

#include <cstdint>

namespace pmindex::internal::clfbtree {

struct alignas(128) LeafFilter {
  static constexpr uint32_t kSlots = 120;  // leaves of up to 120 entries (1928 bytes)
  uint64_t fp[kSlots / 8];                 // slot i's byte is byte i % 8 of fp[i / 8]
  uint64_t tag;

  static uint8_t Fp(uint64_t key) { return uint8_t((key * 0x9E3779B97F4A7C15ull) >> 56); }
  bool Valid(uint64_t version) const { return __atomic_load_n(&tag, __ATOMIC_RELAXED) == (version | 1); }
  void SetValid(uint64_t version) { __atomic_store_n(&tag, version | 1, __ATOMIC_RELAXED); }
  // Slot i's byte (the lock holder).
  void Set(uint32_t i, uint8_t f) {
    uint64_t* w = &fp[i / 8];
    const uint32_t sh = 8 * (i % 8);
    __atomic_store_n(w, (__atomic_load_n(w, __ATOMIC_RELAXED) & ~(0xffull << sh)) | (uint64_t(f) << sh),
                     __ATOMIC_RELAXED);
  }
  // The whole filter from bytes f[0..n) (the lock holder; later bytes stale).
  void Store(const uint8_t* f, uint32_t n) {
    for (uint32_t w = 0; w < (n + 7) / 8; w++) {
      uint64_t x = 0;
      for (uint32_t b = 0; b < 8 && 8 * w + b < n; b++) x |= uint64_t(f[8 * w + b]) << (8 * b);
      __atomic_store_n(&fp[w], x, __ATOMIC_RELAXED);
    }
  }
  // Bit j of word w of the result: slot 64w + j (j < 64) holds byte f, for
  // the first n slots (n <= kSlots); two words.
  void Match(uint8_t f, uint32_t n, uint64_t out[2]) const {
    const __m128i pat = _mm_set1_epi8(char(f));
    out[0] = out[1] = 0;
    for (uint32_t w = 0; 8 * w < n; w += 2) {
      const uint64_t lo = __atomic_load_n(&fp[w], __ATOMIC_RELAXED);
      const uint64_t hi = w + 1 < kSlots / 8 ? __atomic_load_n(&fp[w + 1], __ATOMIC_RELAXED) : 0;
      const __m128i x = _mm_set_epi64x(int64_t(hi), int64_t(lo));
      const uint64_t m = uint32_t(_mm_movemask_epi8(_mm_cmpeq_epi8(x, pat)));
      out[w / 8] |= m << (8 * (w % 8));
    }
    if (n < 64)
      out[0] &= (1ull << n) - 1;
    else if (n < 128)
      out[1] &= (1ull << (n - 64)) - 1;
  }
};
static_assert(sizeof(LeafFilter) == 128);

}  // namespace pmindex::internal::clfbtree
