// popcount_test.cc: unit tests of kit/popcount.h: both paths (POPCNT where
// the CPU has it, the builtin fallback) and the dispatching PopCount64 agree
// with a bit-by-bit count on edge words and pseudo-random words, and the
// dispatch flag matches CPUID.
#include "kit/popcount.h"

#include <gtest/gtest.h>

#include <vector>

namespace pmindex::internal::kit {
namespace {

uint32_t Naive(uint64_t x) {
  uint32_t n = 0;
  for (int i = 0; i < 64; i++) n += (x >> i) & 1;
  return n;
}

std::vector<uint64_t> Words() {
  std::vector<uint64_t> w = {0, 1, ~0ull, 1ull << 63, 0x5555555555555555ull, 0xaaaaaaaaaaaaaaaaull, 0xff00ff00ff00ff00ull};
  for (int i = 0; i < 64; i++) {
    w.push_back(1ull << i);
    w.push_back(~(1ull << i));
    w.push_back((1ull << i) - 1);
  }
  uint64_t s = 0x9E3779B97F4A7C15ull;
  for (int i = 0; i < 10000; i++) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    w.push_back(s);
    w.push_back(s & (s >> 3));  // sparser words
  }
  return w;
}

TEST(PopCount, FlagMatchesCpuid) { EXPECT_EQ(detail::g_has_popcnt, CpuHasPopcnt()); }

TEST(PopCount, FallbackMatchesNaive) {
  for (uint64_t x : Words()) ASSERT_EQ(PopCount64Sw(x), Naive(x)) << std::hex << x;
}

TEST(PopCount, HardwareMatchesNaive) {
  if (!CpuHasPopcnt()) GTEST_SKIP() << "CPU without POPCNT";
  for (uint64_t x : Words()) ASSERT_EQ(PopCount64Hw(x), Naive(x)) << std::hex << x;
}

TEST(PopCount, DispatchMatchesNaive) {
  for (uint64_t x : Words()) ASSERT_EQ(PopCount64(x), Naive(x)) << std::hex << x;
}

}  // namespace
}  // namespace pmindex::internal::kit
