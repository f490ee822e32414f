// kit/backoff.h: spin-wait backoff for retry loops (lock acquisition,
// optimistic-read restarts, CAS retries).
//
// A few pause spins, then sched_yield, so that a lock holder that was
// preempted gets the CPU: with more threads than cores (96 threads on 2 cores
// under TSan) waiters that only pause convoy behind preempted holders for
// minutes. An uncontended operation never waits, so it never yields.
// Every wait also tells the persist observer (pm::Observer::OnSpin), so that
// pmcheck's PCT scheduler hands the token to the thread being waited for
// instead of declaring a stall after a timeout.
//
// Thread safety: a Backoff is a local of one waiting loop.
#pragma once

#include <immintrin.h>

#include <thread>

#include "pmindex/pm/persist.h"

namespace pmindex::internal::kit {

inline void CpuRelax() { _mm_pause(); }

template <int kSpins>
struct BasicBackoff {
  int n = 0;
  void Wait() {
    PMINDEX_OBSERVE(OnSpin());
    if (++n > kSpins) std::this_thread::yield();
    else CpuRelax();
  }
};

// The default: yield after 32 pause spins.
using Backoff = BasicBackoff<32>;

// Locks m (a std::mutex or any Lockable) by try_lock in a Backoff loop
// rather than by blocking, for locks held across persists (a structure
// change): under pmcheck's PCT scheduler a thread waiting for a holder that
// the schedule preempted hands it the token at once (OnSpin), where a
// blocked thread would wait for a stall (a timeout, which makes the
// schedule depend on timing).
template <typename M>
void LockWithBackoff(M& m) {
  if (m.try_lock()) return;
  Backoff b;
  do b.Wait();
  while (!m.try_lock());
}

}  // namespace pmindex::internal::kit
