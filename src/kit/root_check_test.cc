// root_check_test.cc: unit tests of kit/root_check.h on a real pool: an
// absent root, an initialised one, a crashed creation, damaged
// magic/initialized words, a root offset outside the pool, and the block
// count that separates a crashed creation from a damaged initialised root.
#include "kit/root_check.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstddef>
#include <memory>
#include <string>

namespace pmindex::internal::kit {
namespace {

struct TestRoot {
  uint64_t magic;
  uint64_t config;
  uint64_t initialized;
  uint64_t first;
};
constexpr uint64_t kTestMagic = 0x5453455454494bull;

class RootCheckTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = ::testing::TempDir() + "/root_check_test." + std::to_string(::getpid());
    pm::Pool::Remove(path_);
    pm::PoolOptions o;
    o.size = 1 << 20;
    ASSERT_TRUE(pm::Pool::Create(path_, "kit_test", o, &pool_).ok());
    pool_->RemoveOnClose();
  }
  RootState Classify(Status* st) {
    RootState s = RootState::kAbsent;
    *st = ClassifyRoot(pool_.get(), spec_, &s);
    return s;
  }
  TestRoot* MakeRoot() {
    EXPECT_TRUE(pool_->allocator().AllocateZeroed(pool_->root_slot(), sizeof(TestRoot)).ok());
    return pool_->root<TestRoot>();
  }

  std::string path_;
  std::unique_ptr<pm::Pool> pool_;
  RootSpec spec_{"kit_test", kTestMagic, sizeof(TestRoot), offsetof(TestRoot, magic), offsetof(TestRoot, initialized)};
};

TEST_F(RootCheckTest, AbsentInitializedAndCreating) {
  Status st;
  EXPECT_EQ(Classify(&st), RootState::kAbsent);
  EXPECT_TRUE(st.ok());
  TestRoot* r = MakeRoot();
  EXPECT_EQ(Classify(&st), RootState::kCreating);  // all zero: crashed right after the root's allocation
  EXPECT_TRUE(st.ok());
  r->magic = kTestMagic;
  EXPECT_EQ(Classify(&st), RootState::kCreating);
  EXPECT_TRUE(st.ok());
  r->initialized = 1;
  EXPECT_EQ(Classify(&st), RootState::kInitialized);
  EXPECT_TRUE(st.ok());
}

TEST_F(RootCheckTest, DamagedWordsAreCorrupt) {
  TestRoot* r = MakeRoot();
  Status st;
  r->magic = kTestMagic;
  r->initialized = 5;
  Classify(&st);
  EXPECT_TRUE(st.IsCorrupt());
  EXPECT_NE(st.ToString().find("kit_test: root magic/initialized words damaged (initialized = 5)"), std::string::npos)
      << st.ToString();
  r->initialized = 0;
  r->magic = kTestMagic ^ 0x100;
  Classify(&st);
  EXPECT_TRUE(st.IsCorrupt());
  r->magic = kTestMagic ^ 0x100;
  r->initialized = 1;
  Classify(&st);
  EXPECT_TRUE(st.IsCorrupt());
}

TEST_F(RootCheckTest, RootOutsideThePoolIsCorrupt) {
  MakeRoot();
  const uint64_t saved = *pool_->root_slot();
  for (uint64_t bad : {pool_->size(), pool_->size() - 8, saved + 4}) {
    *pool_->root_slot() = bad;
    Status st;
    Classify(&st);
    EXPECT_TRUE(st.IsCorrupt()) << bad;
    EXPECT_NE(st.ToString().find("outside the pool"), std::string::npos) << st.ToString();
  }
  *pool_->root_slot() = saved;
}

TEST_F(RootCheckTest, CreationBlocksBoundTheAllocator) {
  TestRoot* r = MakeRoot();
  EXPECT_TRUE(CheckCreationBlocks(pool_.get(), spec_, 1, "root not initialised").ok());
  ASSERT_TRUE(pool_->allocator().AllocateZeroed(&r->first, 256).ok());
  EXPECT_TRUE(CheckCreationBlocks(pool_.get(), spec_, 2, "root not initialised").ok());
  Status st = CheckCreationBlocks(pool_.get(), spec_, 1, "root not initialised");
  EXPECT_TRUE(st.IsCorrupt());
  EXPECT_NE(st.ToString().find("root not initialised but the pool holds 2 blocks: more than a crashed creation allocates"),
            std::string::npos)
      << st.ToString();
}

}  // namespace
}  // namespace pmindex::internal::kit
