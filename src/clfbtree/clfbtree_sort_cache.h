// clfbtree_sort_cache.h: the DRAM sort cache of append-only leaves, for
// scans (docs/clfbtree.md, "Concurrency" and "Scans"). No paper section: the
// paper sorts a leaf's entries on every scan (sec. 2.2).
//
// An append leaf's entries are unsorted; a scan needs them in key order. The
// first scan of a leaf at a version sorts its valid slots and publishes the
// sorted slot numbers here, tagged with the leaf's version word; later scans
// of the leaf at that version binary-search and walk the permutation instead
// of sorting. One entry per leaf, found by the leaf's address through a
// kit::LockTable (granule: the leaf size, so live leaves never share one).
// Nothing here is persistent, and nothing here is trusted: a reader uses a
// permutation only if the entry's tag equals the leaf version it read, and
// the leaf's own version validation after the walk (as for any read of the
// leaf) rejects a walk over a leaf that changed. Slot numbers are checked
// against the leaf's capacity before use.
//
// Invariants: a published entry (ver, n, slots) lists the valid slots of
// the leaf at version ver in ascending key order (versions never repeat for
// different contents of a leaf word: kit/version_lock.h).
//
// Thread safety: any number of readers and publishers concurrently. The
// entry is a seqlock: `seq` odd while one publisher (the one whose CAS made
// it odd) writes; a reader copies under two equal even seq reads. All fields
// are accessed with atomics.
#pragma once

#include <cstdint>

namespace pmindex::internal::clfbtree {

struct SortCacheEntry {
  uint64_t seq;  // even: stable; odd: being written
  uint64_t ver;  // the leaf version the permutation is for (0: none)
  uint8_t n;     // valid slots
  uint8_t slot[127];

  // Copies the permutation for leaf version v into out (n slots); false on
  // a miss or a concurrent publication.
  bool Get(uint64_t v, uint8_t out[127], uint32_t* n_out) const {
    const uint64_t s1 = __atomic_load_n(&seq, __ATOMIC_ACQUIRE);
    if ((s1 & 1) || __atomic_load_n(&ver, __ATOMIC_RELAXED) != v + 1) return false;
    const uint32_t cnt = __atomic_load_n(&n, __ATOMIC_RELAXED);
    if (cnt > 127) return false;
    for (uint32_t i = 0; i < cnt; i++) out[i] = __atomic_load_n(&slot[i], __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (__atomic_load_n(&seq, __ATOMIC_RELAXED) != s1) return false;
    *n_out = cnt;
    return true;
  }

  // Publishes the permutation of leaf version v unless another publisher is
  // writing (then this one is skipped: the cache is a hint).
  void Put(uint64_t v, const uint8_t* slots, uint32_t cnt) {
    uint64_t s = __atomic_load_n(&seq, __ATOMIC_RELAXED);
    if ((s & 1) || cnt > 127) return;
    if (!__atomic_compare_exchange_n(&seq, &s, s + 1, false, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) return;
    __atomic_thread_fence(__ATOMIC_RELEASE);
    __atomic_store_n(&ver, v + 1, __ATOMIC_RELAXED);
    __atomic_store_n(&n, uint8_t(cnt), __ATOMIC_RELAXED);
    for (uint32_t i = 0; i < cnt; i++) __atomic_store_n(&slot[i], slots[i], __ATOMIC_RELAXED);
    __atomic_store_n(&seq, s + 2, __ATOMIC_RELEASE);
  }
};
static_assert(sizeof(SortCacheEntry) == 144);

}  // namespace pmindex::internal::clfbtree
