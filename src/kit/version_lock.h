// kit/version_lock.h: the optimistic version lock (a seqlock word) of DRAM
// nodes and of lock words kept out of PM (kit/lock_table.h).
//
// Word: bit 0 locked, bit 1 obsolete (the node was removed; a reader that
// sees it restarts from the root), bits 2.. a version that grows by one step
// (4) per write unlock. Readers take no lock: ReadBegin records the version
// (and fails if the word is locked or obsolete), they read the node, then
// Validate checks that the word is unchanged. Writers lock by one CAS from an
// unlocked version they read (TryLock / Upgrade: optimistic lock coupling,
// Leis et al., DaMoN'16), so a writer never blocks inside the lock; the
// caller decides how to wait (kit/backoff.h) and never waits for a lock while
// holding another one unless by try-lock.
//
// The word is a plain uint64_t accessed with __atomic builtins, so that a
// zero-filled page (an mmap'd lock table, a memset node) is a table of
// unlocked words at version 0 without construction.
//
// Invariants: only the holder stores to a locked word; a version never
// decreases (NewBorn and ClearLockBits keep the version bits), so a version
// read of an earlier node that used the same word never validates against a
// later one.
//
// Thread safety: every member may be called concurrently from any thread;
// the unlock members only by the holder.
#pragma once

#include <cstdint>

namespace pmindex::internal::kit {

struct VersionLock {
  static constexpr uint64_t kLocked = 1, kObsolete = 2, kBusy = kLocked | kObsolete, kStep = 4;

  uint64_t word;  // zero: unlocked, version 0

  // Acquire load of the word (the version a reader validates against).
  uint64_t Load() const { return __atomic_load_n(&word, __ATOMIC_ACQUIRE); }
  uint64_t LoadRelaxed() const { return __atomic_load_n(&word, __ATOMIC_RELAXED); }
  static bool Busy(uint64_t v) { return v & kBusy; }

  // Starts an optimistic read: *v = the version; false if locked or obsolete.
  bool ReadBegin(uint64_t* v) const {
    *v = Load();
    return !Busy(*v);
  }
  // True if nothing was written since ReadBegin returned v (the reads in
  // between are then a consistent snapshot).
  bool Validate(uint64_t v) const {
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    return LoadRelaxed() == v;
  }
  // Locks the word if it still holds v and v is neither locked nor obsolete.
  bool TryLock(uint64_t v) {
    if (Busy(v)) return false;
    return __atomic_compare_exchange_n(&word, &v, v | kLocked, false, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED);
  }
  // Lock upgrade of a read at v (v from a successful ReadBegin).
  bool Upgrade(uint64_t v) {
    return __atomic_compare_exchange_n(&word, &v, v + kLocked, false, __ATOMIC_ACQUIRE, __ATOMIC_ACQUIRE);
  }
  // Unlock with one read-modify-write: next version.
  void Unlock() { __atomic_fetch_add(&word, kStep - kLocked, __ATOMIC_RELEASE); }
  // Unlock that marks the word obsolete (the node left the structure).
  void UnlockObsolete() { __atomic_fetch_add(&word, kStep - kLocked + kObsolete, __ATOMIC_RELEASE); }
  // Unlock with a plain release store (only the holder writes a locked word):
  // next version, obsolete if asked.
  void UnlockStore(bool obsolete = false) {
    const uint64_t v = LoadRelaxed();
    __atomic_store_n(&word, uint64_t(((v & ~kBusy) + kStep) | (obsolete ? kObsolete : 0)), __ATOMIC_RELEASE);
  }
  // Unlock of a word locked by TryLock(v): it still holds v | kLocked, so it
  // need not be loaded.
  void UnlockFrom(uint64_t v) { __atomic_store_n(&word, uint64_t((v & ~kBusy) + kStep), __ATOMIC_RELEASE); }
  // A node that is being created: locked, at a version above every earlier
  // one of this word. Relaxed: the node is published later with release.
  void NewBorn() { __atomic_store_n(&word, uint64_t(((LoadRelaxed() & ~kBusy) + kStep) | kLocked), __ATOMIC_RELAXED); }
  // Clears the lock and obsolete bits, keeping the version (recovery, single
  // threaded).
  void ClearLockBits() { __atomic_store_n(&word, uint64_t(LoadRelaxed() & ~kBusy), __ATOMIC_RELAXED); }
};
static_assert(sizeof(VersionLock) == 8);

}  // namespace pmindex::internal::kit
