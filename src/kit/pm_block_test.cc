// pm_block_test.cc: unit tests of kit/pm_block.h on a real pool: blocks of
// every tail length round-trip, BlockEquals and CompareBlock agree with
// CompareKeys, and every kind of bad word (0, misaligned, past the pool,
// length over the limit or past the pool's end) is refused: false from
// TryReadBlock, Corrupt from ReadBlock, false from BlockEquals.
#include "kit/pm_block.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <memory>
#include <string>

#include "pmindex/pm/pool.h"

namespace pmindex::internal::kit {
namespace {

class PmBlockTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = ::testing::TempDir() + "/pm_block_test." + std::to_string(::getpid());
    pm::Pool::Remove(path_);
    pm::PoolOptions o;
    o.size = 1 << 20;
    ASSERT_TRUE(pm::Pool::Create(path_, "kit_test", o, &pool_).ok());
    pool_->RemoveOnClose();
    ASSERT_TRUE(pool_->allocator().AllocateZeroed(pool_->root_slot(), 64 * 8).ok());
    words_ = pool_->root<uint64_t>();
  }
  void TearDown() override { pool_.reset(); }
  char* base() { return pool_->base(); }
  uint64_t size() { return pool_->size(); }

  std::string path_;
  std::unique_ptr<pm::Pool> pool_;
  uint64_t* words_ = nullptr;  // PM words that own the test's blocks
};

TEST_F(PmBlockTest, RoundTripsEveryTailLength) {
  for (size_t n = 0; n < 40; n++) {
    std::string s;
    for (size_t i = 0; i < n; i++) s.push_back(char('a' + (i * 7 + n) % 26));
    uint64_t* w = &words_[n % 64];
    ASSERT_TRUE(WriteBlock(pool_->allocator(), base(), w, s).ok());
    ASSERT_NE(*w, 0u);
    std::string out;
    ASSERT_TRUE(TryReadBlock(base(), size(), *w, 64, &out));
    EXPECT_EQ(out, s);
    ASSERT_TRUE(ReadBlock(base(), size(), *w, 64, &out).ok());
    EXPECT_EQ(out, s);
    EXPECT_TRUE(BlockEquals(base(), size(), *w, s));
    EXPECT_FALSE(BlockEquals(base(), size(), *w, s + "x"));
    if (n) {
      std::string t = s;
      t.back() ^= 1;
      EXPECT_FALSE(BlockEquals(base(), size(), *w, t));  // the tail word's bytes count
    }
    ASSERT_TRUE(pool_->allocator().Free(w).ok());
  }
}

TEST_F(PmBlockTest, CompareBlockIsByteKeyOrder) {
  ASSERT_TRUE(WriteBlock(pool_->allocator(), base(), &words_[0], "abc").ok());
  int c = 9;
  for (const char* s : {"ab", "abc", "abd", "abcd", "b", ""}) {
    ASSERT_TRUE(CompareBlock(base(), size(), words_[0], 16, s, &c));
    const int want = CompareKeys(KeyKind::kBytes, "abc", s);
    EXPECT_EQ(c < 0, want < 0) << s;
    EXPECT_EQ(c == 0, want == 0) << s;
  }
  c = 9;
  EXPECT_FALSE(CompareBlock(base(), size(), 0, 16, "abc", &c));
  EXPECT_EQ(c, 9);
}

TEST_F(PmBlockTest, RefusesBadWords) {
  ASSERT_TRUE(WriteBlock(pool_->allocator(), base(), &words_[0], "0123456789").ok());
  const uint64_t good = words_[0];
  std::string out;
  // (offset, length limit)
  const std::pair<uint64_t, size_t> bad[] = {
      {0, 64},                // null
      {good + 4, 64},         // misaligned
      {size(), 64},           // past the pool
      {size() - 4, 64},       // header past the pool
      {good, 9},              // length over the limit
  };
  for (auto [off, maxlen] : bad) {
    EXPECT_FALSE(TryReadBlock(base(), size(), off, maxlen, &out)) << off;
    Status s = ReadBlock(base(), size(), off, maxlen, &out);
    EXPECT_TRUE(s.IsCorrupt()) << off;
    EXPECT_NE(s.ToString().find(std::to_string(off)), std::string::npos) << s.ToString();
  }
  EXPECT_FALSE(BlockEquals(base(), size(), 0, "0123456789"));
  EXPECT_FALSE(BlockEquals(base(), size(), good + 4, "0123456789"));
  // A damaged length word that runs past the pool's end.
  uint64_t* len = reinterpret_cast<uint64_t*>(base() + good);
  *len = size();
  EXPECT_FALSE(TryReadBlock(base(), size(), good, size_t(1) << 40, &out));
  EXPECT_FALSE(BlockEquals(base(), size(), good, "0123456789"));
  *len = 10;
  EXPECT_TRUE(TryReadBlock(base(), size(), good, 64, &out));
  EXPECT_EQ(out, "0123456789");
}

}  // namespace
}  // namespace pmindex::internal::kit
