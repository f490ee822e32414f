// lock_table_test.cc: unit tests of kit/lock_table.h: nodes at least a node
// size apart get distinct words, the words start at zero, Contains bounds
// the table, resident bytes grow as words are touched, and a misaligned
// base is refused.
#include "kit/lock_table.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <set>

#include "kit/version_lock.h"

namespace pmindex::internal::kit {
namespace {

struct Arena {
  explicit Arena(size_t n) : bytes(n), p(static_cast<char*>(std::aligned_alloc(4096, n))) {}
  ~Arena() { std::free(p); }
  size_t bytes;
  char* p;
};

TEST(LockTable, DistinctWordsForNodesANodeSizeApart) {
  Arena a(1 << 20);
  for (uint64_t node : {64u, 320u, 576u, 1024u, 4160u}) {
    LockTable<VersionLock> t;
    ASSERT_TRUE(t.Map(a.p, a.bytes, node).ok());
    EXPECT_LE(1ull << t.shift(), node);
    EXPECT_GT(2ull << t.shift(), node);
    std::set<VersionLock*> seen;
    for (uint64_t off = 0; off + node <= a.bytes; off += node) {
      VersionLock* w = t.At(a.p + off);
      ASSERT_TRUE(t.Contains(w)) << off;
      EXPECT_EQ(w->Load(), 0u);
      EXPECT_TRUE(seen.insert(w).second) << "node " << node << " at " << off;
    }
    EXPECT_FALSE(t.Contains(t.At(a.p) - 1));
  }
}

TEST(LockTable, WordsPersistWhileMappedAndResidentBytesGrow) {
  Arena a(1 << 20);
  LockTable<VersionLock> t;
  ASSERT_TRUE(t.Map(a.p, 64ull << 20, 256).ok());  // reserve more than is touched
  EXPECT_EQ(t.bytes(), ((64ull << 20) / 256 + 1) * sizeof(VersionLock));
  const uint64_t before = t.ResidentBytes();
  for (uint64_t off = 0; off < a.bytes; off += 256) ASSERT_TRUE(t.At(a.p + off)->TryLock(0));
  EXPECT_GT(t.ResidentBytes(), before);
  EXPECT_LT(t.ResidentBytes(), t.bytes());
  for (uint64_t off = 0; off < a.bytes; off += 256) EXPECT_EQ(t.At(a.p + off)->Load(), VersionLock::kLocked);
  t.Unmap();
  EXPECT_FALSE(t.mapped());
  EXPECT_EQ(t.ResidentBytes(), 0u);
}

TEST(LockTable, ResidentBytesOfARangeCountOnlyItsPages) {
  Arena a(1 << 20);
  LockTable<VersionLock> t;
  ASSERT_TRUE(t.Map(a.p, 64ull << 20, 256).ok());
  for (uint64_t off = 0; off < a.bytes; off += 256) ASSERT_TRUE(t.At(a.p + off)->TryLock(0));
  const uint64_t whole = t.ResidentBytes();
  ASSERT_GT(whole, 0u);
  // The touched words all lie over [a.p, a.p + a.bytes): the range sees them all.
  EXPECT_EQ(t.ResidentBytes(a.p, a.p + a.bytes), whole);
  // A range of the reservation no node touched has nothing resident.
  EXPECT_EQ(t.ResidentBytes(a.p + (32ull << 20), a.p + (48ull << 20)), 0u);
  // Empty and reversed ranges count nothing; a range past the table is clamped.
  EXPECT_EQ(t.ResidentBytes(a.p, a.p), 0u);
  EXPECT_EQ(t.ResidentBytes(a.p + a.bytes, a.p), 0u);
  EXPECT_EQ(t.ResidentBytes(a.p, a.p + (128ull << 20)), whole);
}

TEST(LockTable, RefusesAMisalignedBase) {
  Arena a(1 << 16);
  LockTable<VersionLock> t;
  EXPECT_TRUE(t.Map(a.p + 64, a.bytes, 4096).IsCorrupt());
  LockTable<VersionLock> z;
  EXPECT_TRUE(z.Map(a.p, a.bytes, 0).IsInvalidArgument());
}

}  // namespace
}  // namespace pmindex::internal::kit
