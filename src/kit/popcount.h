// kit/popcount.h: population count of a 64-bit word with the POPCNT
// instruction where the CPU has it, checked by CPUID at run time.
//
// The build targets baseline x86-64 (no -mpopcnt), so __builtin_popcountll
// compiles to a call into libgcc (__popcountdi2, a table walk). The project
// rule is "check CPUID, never assume" (as src/pm does for clwb and
// clflushopt): PopCount64 tests a flag set once from CPUID leaf 1 (ECX bit
// 23) and runs POPCNT by inline assembly, which needs no compiler target
// flag; on a CPU without it, or before the flag is set during static
// initialisation (it starts false), it falls back to the builtin.
//
// Thread safety: the flag is written once, during static initialisation of
// the library, and only read afterwards.
#pragma once

#include <cstdint>

namespace pmindex::internal::kit {

namespace detail {
extern bool g_has_popcnt;
}  // namespace detail

// True if the CPU has POPCNT (CPUID, read once at load).
bool CpuHasPopcnt();

// The two paths, exposed for tests. PopCount64Hw only where CpuHasPopcnt().
inline uint32_t PopCount64Hw(uint64_t x) {
  uint64_t r;
  asm("popcnt %1, %0" : "=r"(r) : "r"(x) : "cc");
  return uint32_t(r);
}
inline uint32_t PopCount64Sw(uint64_t x) { return uint32_t(__builtin_popcountll(x)); }

inline uint32_t PopCount64(uint64_t x) {
  if (__builtin_expect(detail::g_has_popcnt, 1)) return PopCount64Hw(x);
  return PopCount64Sw(x);
}

}  // namespace pmindex::internal::kit
