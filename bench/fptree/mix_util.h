// bench/fptree/mix_util.h: helpers shared by the FPTree benchmark programs
// (fptree_opcost, fptree_scanmix, fptree_findmix): pmbench's key mapping and
// a wall clock.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

namespace pmindex::benchutil {

// Ids become u64 keys as in pmbench: id * odd constant (a bijection on u64).
constexpr uint64_t kMul = 0x9E3779B97F4A7C15ull;

inline double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace pmindex::benchutil
