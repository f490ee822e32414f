// bounded_walk_test.cc: unit tests of kit/bounded_walk.h: a walk may visit
// as many nodes as the pool can hold and no more, so a cycle ends in a
// Corrupt status instead of a spin.
#include "kit/bounded_walk.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace pmindex::internal::kit {
namespace {

TEST(BoundedWalk, AllowsExactlyPoolOverNodeSteps) {
  BoundedWalk w(1000, 100);
  EXPECT_EQ(w.bound(), 10u);
  for (int i = 0; i < 10; i++) EXPECT_TRUE(w.Step()) << i;
  EXPECT_FALSE(w.Step());
  EXPECT_EQ(w.visited(), 11u);
  Status s = w.CycleError("leaf list", "leaves");
  EXPECT_TRUE(s.IsCorrupt());
  EXPECT_NE(s.ToString().find("leaf list has a cycle (more than 10 leaves)"), std::string::npos) << s.ToString();
}

TEST(BoundedWalk, EndsAWalkOnACycle) {
  // next[i]: a list 0 -> 1 -> 2 -> 3 -> 1 (a cycle), in a "pool" of 4 nodes.
  std::vector<int> next = {1, 2, 3, 1};
  BoundedWalk w(4 * 64, 64);
  int x = 0, steps = 0;
  bool cycle = false;
  while (x >= 0) {
    if (!w.Step()) {
      cycle = true;
      break;
    }
    steps++;
    x = next[size_t(x)];
  }
  EXPECT_TRUE(cycle);
  EXPECT_EQ(steps, 4);
}

TEST(BoundedWalk, ZeroNodeSizeAllowsNothing) {
  BoundedWalk w(1 << 20, 0);
  EXPECT_FALSE(w.Step());
}

}  // namespace
}  // namespace pmindex::internal::kit
