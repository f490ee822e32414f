// Unit test of the split-order arithmetic (nvc_split_order.h): pure
// functions, no pool.
#include "nvc_hashmap/nvc_split_order.h"

#include <gtest/gtest.h>

namespace pmindex::internal::nvc {
namespace {

TEST(NvcSplitOrder, ReverseIsAnInvolution) {
  EXPECT_EQ(Reverse64(0), 0u);
  EXPECT_EQ(Reverse64(1), 1ull << 63);
  EXPECT_EQ(Reverse64(0x8000000000000001ull), 0x8000000000000001ull);
  EXPECT_EQ(Reverse64(0x00000000000000f0ull), 0x0f00000000000000ull);
  for (uint64_t x : {0x0123456789abcdefull, 0xfedcba9876543210ull, 0x5555555555555555ull, 42ull})
    EXPECT_EQ(Reverse64(Reverse64(x)), x);
}

TEST(NvcSplitOrder, RegularKeysAreOddDummyKeysEven) {
  for (uint64_t h : {0ull, 1ull, 7ull, 0x7fffffffffffffffull, 0xffffffffffffffffull}) EXPECT_EQ(SoRegular(h) & 1, 1u);
  for (uint64_t b : {0ull, 1ull, 2ull, 1000ull, (1ull << 32) - 1}) EXPECT_EQ(SoDummy(b) & 1, 0u);
  // The top hash bit does not matter (63-bit hashes).
  EXPECT_EQ(SoRegular(5), SoRegular(5 | (1ull << 63)));
}

TEST(NvcSplitOrder, ParentClearsTheHighestBit) {
  EXPECT_EQ(ParentBucket(1), 0u);
  EXPECT_EQ(ParentBucket(2), 0u);
  EXPECT_EQ(ParentBucket(3), 1u);
  EXPECT_EQ(ParentBucket(6), 2u);
  EXPECT_EQ(ParentBucket(13), 5u);
  EXPECT_EQ(ParentBucket(1ull << 40), 0u);
}

// Every key of bucket b (hash & (n-1) == b) sorts after b's dummy and
// before the dummy of the next bucket in split order; a parent's dummy
// precedes its child's.
TEST(NvcSplitOrder, BucketsAreContiguousRangesOfTheList) {
  const uint64_t n = 16;
  for (uint64_t b = 1; b < n; b++) EXPECT_LT(SoDummy(ParentBucket(b)), SoDummy(b)) << b;
  for (uint64_t h = 0; h < 4096; h++) {
    const uint64_t hh = h * 0x9e3779b97f4a7c15ull, b = hh & (n - 1), so = SoRegular(hh);
    EXPECT_GT(so, SoDummy(b));
    for (uint64_t o = 0; o < n; o++) {
      if (SoDummy(o) > SoDummy(b)) {
        EXPECT_LT(so, SoDummy(o)) << "hash " << hh << " bucket " << b << " other " << o;
      }
    }
  }
}

}  // namespace
}  // namespace pmindex::internal::nvc
