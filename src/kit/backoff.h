// kit/backoff.h: spin-wait backoff for retry loops (lock acquisition,
// optimistic-read restarts, CAS retries).
//
// A few pause spins, then sched_yield, so that a lock holder that was
// preempted gets the CPU: with more threads than cores (96 threads on 2 cores
// under TSan) waiters that only pause convoy behind preempted holders for
// minutes. An uncontended operation never waits, so it never yields.
//
// Thread safety: a Backoff is a local of one waiting loop.
#pragma once

#include <immintrin.h>

#include <thread>

namespace pmindex::internal::kit {

inline void CpuRelax() { _mm_pause(); }

template <int kSpins>
struct BasicBackoff {
  int n = 0;
  void Wait() {
    if (++n > kSpins) std::this_thread::yield();
    else CpuRelax();
  }
};

// The default: yield after 32 pause spins.
using Backoff = BasicBackoff<32>;

}  // namespace pmindex::internal::kit
