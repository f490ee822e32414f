// kit/rw_spinlock.h: a reader-writer spin lock in one 32-bit word,
// writer-preferring. Used for lock words kept in DRAM tables (fastfair's
// per-node locks, FAST'18 sec. 5: writers lock nodes, readers of
// read-committed trees read-lock leaves). Never stored to PM.
//
// Word: bit 31 a writer holds the lock; bits 16-30 writers waiting; bits
// 0-15 readers holding it (plus readers briefly counted while they back out).
//
// Writer preference: a writer that finds the lock taken registers as
// waiting (+kWaiter) before it spins, and a reader that sees a writer
// holding OR waiting backs out and waits. So once a writer waits, no new
// reader gets in; the readers inside drain and the writer takes the lock
// (a waiting writer's CAS needs no writer and no readers, and drops its
// waiting count in the same CAS). Readers on a hot node cannot starve
// writers; a steady stream of writers can delay readers, which is the
// trade an index wants (writes complete, readers retry).
//
// Memory order: lock() and lock_shared() acquire, unlock() and
// unlock_shared() release. The uncontended paths are one CAS (writer) and
// one fetch_add (reader), as for a reader-preferring word.
//
// Waiting uses a Backoff policy (kit/backoff.h): pause spins, then
// sched_yield, so that a preempted holder gets the CPU.
//
// Thread safety: any thread may call any member; not recursive (a thread
// that holds the lock in either mode must not lock it again: with a writer
// waiting in between, a second lock_shared() would wait for it forever).
// Limits: fewer than 2^15 waiting writers and 2^16 readers at once.
#pragma once

#include <atomic>
#include <cstdint>

#include "kit/backoff.h"

namespace pmindex::internal::kit {

template <typename BackoffT = Backoff>
class BasicRwSpinLock {
 public:
  static constexpr uint32_t kWriter = 1u << 31;
  static constexpr uint32_t kWaiter = 1u << 16;
  static constexpr uint32_t kWaiterMask = kWriter - kWaiter;
  static constexpr uint32_t kReaderMask = kWaiter - 1;

  constexpr BasicRwSpinLock() = default;
  BasicRwSpinLock(const BasicRwSpinLock&) = delete;
  BasicRwSpinLock& operator=(const BasicRwSpinLock&) = delete;

  void lock() {
    uint32_t z = 0;
    if (__builtin_expect(w_.load(std::memory_order_relaxed) == 0 &&
                             w_.compare_exchange_weak(z, kWriter, std::memory_order_acquire),
                         1))
      return;
    LockSlow();
  }
  bool try_lock() {
    uint32_t z = 0;
    return w_.load(std::memory_order_relaxed) == 0 && w_.compare_exchange_strong(z, kWriter, std::memory_order_acquire);
  }
  void unlock() { w_.fetch_sub(kWriter, std::memory_order_release); }

  void lock_shared() {
    BackoffT b;
    for (;;) {
      if (__builtin_expect(!(w_.fetch_add(1, std::memory_order_acquire) & ~kReaderMask), 1)) return;
      w_.fetch_sub(1, std::memory_order_relaxed);
      while (w_.load(std::memory_order_relaxed) & ~kReaderMask) b.Wait();
    }
  }
  bool try_lock_shared() {
    if (!(w_.fetch_add(1, std::memory_order_acquire) & ~kReaderMask)) return true;
    w_.fetch_sub(1, std::memory_order_relaxed);
    return false;
  }
  void unlock_shared() { w_.fetch_sub(1, std::memory_order_release); }

  // Observers (tests, assertions; a snapshot, relaxed).
  bool writer_waiting() const { return (w_.load(std::memory_order_relaxed) & kWaiterMask) != 0; }
  bool write_locked() const { return (w_.load(std::memory_order_relaxed) & kWriter) != 0; }
  uint32_t readers() const { return w_.load(std::memory_order_relaxed) & kReaderMask; }

 private:
  __attribute__((noinline)) void LockSlow() {
    BackoffT b;
    w_.fetch_add(kWaiter, std::memory_order_relaxed);
    for (;;) {
      uint32_t w = w_.load(std::memory_order_relaxed);
      if (!(w & (kWriter | kReaderMask)) &&
          w_.compare_exchange_weak(w, w - kWaiter + kWriter, std::memory_order_acquire))
        return;
      b.Wait();
    }
  }

  std::atomic<uint32_t> w_{0};
};

using RwSpinLock = BasicRwSpinLock<>;

}  // namespace pmindex::internal::kit
