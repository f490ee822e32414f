// popcount.cc: the CPUID check behind kit/popcount.h.
#include "kit/popcount.h"

#include <cpuid.h>

namespace pmindex::internal::kit {

namespace {
bool DetectPopcnt() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  return (c >> 23) & 1;
}
}  // namespace

namespace detail {
bool g_has_popcnt = DetectPopcnt();
}  // namespace detail

bool CpuHasPopcnt() {
  static const bool has = DetectPopcnt();
  return has;
}

}  // namespace pmindex::internal::kit
