// bench/bench_util.h: helpers shared by the benchmark programs under bench/
// (fastfair_figures, fastfair_interleave, fptree_figures, fptree_opcost, fptree_space,
// fptree_scanmix, fptree_findmix): a wall clock, the two key mappings they
// use (pmbench's multiplication and a scramble), a median, exit on error.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "pmindex/status.h"

namespace pmindex::benchutil {

// Ids become u64 keys as in pmbench: id * odd constant (a bijection on u64).
constexpr uint64_t kMul = 0x9E3779B97F4A7C15ull;

inline double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// A bijection on u64: distinct pseudo-random keys from 0, 1, 2, ...
inline uint64_t Scramble(uint64_t i) {
  i ^= i >> 31;
  i *= 0x7fb5d329728ea185ull;
  i ^= i >> 27;
  i *= 0x81dadef4bc2dd44dull;
  i ^= i >> 33;
  return i;
}

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// The value after command-line flag argv[*i] (advancing *i); exits with a
// message if the flag is the last argument.
inline std::string NextArg(int argc, char** argv, int* i) {
  if (*i + 1 >= argc) {
    std::fprintf(stderr, "%s needs a value\n", argv[*i]);
    std::exit(2);
  }
  return argv[++*i];
}

inline void Die(const pmindex::Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
  std::exit(1);
}

}  // namespace pmindex::benchutil
