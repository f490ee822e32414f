// bench_util.h: helpers shared by the fastfair benchmark tools
// (fastfair_figures, fastfair_interleave): wall clock, the key scramble
// both use (so that their key sets are the same), and exit on error.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "pmindex/status.h"

namespace ffbench {

inline double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A bijection on u64: distinct pseudo-random keys from 0, 1, 2, ...
inline uint64_t Scramble(uint64_t i) {
  i ^= i >> 31;
  i *= 0x7fb5d329728ea185ull;
  i ^= i >> 27;
  i *= 0x81dadef4bc2dd44dull;
  i ^= i >> 33;
  return i;
}

inline void Die(const pmindex::Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
  std::exit(1);
}

}  // namespace ffbench
