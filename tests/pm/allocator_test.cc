// Allocator tests.
#include "pmindex/pm/allocator.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

#include "pmindex/pm/pool.h"
#include "test_util.h"

namespace pmindex::pm {
namespace {
using testing::PoolFile;

TEST(Allocator, Basic) {
  PoolFile f("alloc");
  std::unique_ptr<Pool> p;
  PoolOptions o;
  o.size = 1 << 20;
  ASSERT_TRUE(Pool::Create(f.path, "test", o, &p).ok());
  Allocator& a = p->allocator();
  uint64_t* slots = nullptr;
  ASSERT_TRUE(a.AllocateZeroed(p->root_slot(), 4096 * 8).ok());
  slots = p->root<uint64_t>();
  for (int i = 0; i < 4096; i++) EXPECT_EQ(slots[i], 0u);
  std::mt19937_64 rng(1);
  for (int i = 0; i < 4096; i++) {
    size_t sz = 1 + rng() % 2000;
    if (i % 100 == 0) sz = 40000 + rng() % 600000;
    ASSERT_TRUE(a.Allocate(&slots[i], sz).ok()) << i;
    EXPECT_GE(a.UsableSize(slots[i]), sz);
    if (sz >= 64) {
      EXPECT_EQ(slots[i] % 64, 0u);
    }
  }
  EXPECT_TRUE(a.Check().ok()) << a.Check().ToString();
  for (int i = 0; i < 4096; i += 2) a.Free(&slots[i]);
  EXPECT_TRUE(a.Check().ok()) << a.Check().ToString();
  uint64_t bytes = a.BytesInUse(), blocks = a.BlocksInUse();
  ASSERT_TRUE(p->Close().ok());
  ASSERT_TRUE(Pool::Open(f.path, "test", o, &p).ok());
  EXPECT_EQ(p->allocator().BytesInUse(), bytes);
  EXPECT_EQ(p->allocator().BlocksInUse(), blocks);
  EXPECT_TRUE(p->allocator().Check().ok());
}

}  // namespace
}  // namespace pmindex::pm
