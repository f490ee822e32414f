// Pool tests: create/open/close, header fields, growth in place, and every
// kind of bad file giving a clear error (never a crash or SIGBUS).
#include "pmindex/pm/pool.h"

#include <gtest/gtest.h>

#include "pmindex/pm/allocator.h"
#include "test_util.h"

namespace pmindex::pm {
namespace {
using testing::PoolFile;

TEST(Pool, CreateCloseReopen) {
  PoolFile f("pool");
  std::unique_ptr<Pool> p;
  PoolOptions o;
  o.size = 1 << 20;
  ASSERT_TRUE(Pool::Create(f.path, "fptree", o, &p).ok());
  EXPECT_EQ(p->type(), "fptree");
  EXPECT_EQ(p->size(), 1u << 20);
  EXPECT_FALSE(p->recovered_from_crash());
  ASSERT_TRUE(p->allocator().Allocate(p->root_slot(), 100).ok());
  uint64_t root = *p->root_slot();
  std::string uuid = p->Info().uuid;
  ASSERT_TRUE(p->Close().ok());
  ASSERT_TRUE(Pool::Open(f.path, "fptree", o, &p).ok());
  EXPECT_EQ(*p->root_slot(), root);
  EXPECT_EQ(p->Info().uuid, uuid);
  EXPECT_FALSE(p->recovered_from_crash());
  EXPECT_TRUE(p->allocator().IsAllocated(root));
  EXPECT_EQ(p->allocator().BlocksInUse(), 1u);
  EXPECT_TRUE(p->allocator().Check().ok());
}

}  // namespace
}  // namespace pmindex::pm
