// pmwcas_test: the PMwCAS primitive single-threaded: outcomes, bad input,
// recycle policies, flush-on-read, the persist cost per k-word operation
// (exact, from the substrate's counters), a durability lint over every
// operation (each store's line flushed and fenced before Execute returns:
// catches flushing the descriptor's field instead of the target and a flush
// loop that strides wrongly), recovery not replaying a finished descriptor
// (ABA), and format 1 pools.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "pm/layout.h"
#include "pm/pmwcas_test_util.h"
#include "pmindex/pm/pmwcas.h"

namespace pmindex::pm {
namespace {

using pmwcas_test::TestPool;

bool Contains(std::string_view s, std::string_view sub) { return s.find(sub) != std::string_view::npos; }

// Copies a pool file while it is open (its content is the memory, as after
// a crash that lost nothing) and returns the copy's path.
std::string CrashCopy(const std::string& path) {
  std::string copy = path + ".crash";
  std::ifstream in(path, std::ios::binary);
  std::ofstream out(copy, std::ios::binary | std::ios::trunc);
  out << in.rdbuf();
  return copy;
}

TEST(Pmwcas, SucceedsOrChangesNothing) {
  TestPool t("basic");
  ASSERT_NE(t.pm(), nullptr);
  for (int i = 0; i < 4; i++) t.Set(i, 10 + i);
  PMwCAS::Op op;
  ASSERT_TRUE(t.pm()->Begin(&op).ok());
  ASSERT_TRUE(op.AddWord(&t.words[2], 12, 22).ok());
  ASSERT_TRUE(op.AddWord(&t.words[0], 10, 20).ok());
  ASSERT_TRUE(op.AddWord(&t.words[1], 11, 21).ok());
  bool ok = false;
  ASSERT_TRUE(op.Execute(&ok).ok());
  EXPECT_TRUE(ok);
  EXPECT_FALSE(op.valid());
  for (int i = 0; i < 3; i++) EXPECT_EQ(t.pm()->Read(&t.words[i]), uint64_t(20 + i));
  // One mismatch: nothing changes.
  ASSERT_TRUE(t.pm()->Begin(&op).ok());
  ASSERT_TRUE(op.AddWord(&t.words[0], 20, 30).ok());
  ASSERT_TRUE(op.AddWord(&t.words[1], 99, 31).ok());
  ASSERT_TRUE(op.AddWord(&t.words[3], 13, 33).ok());
  ASSERT_TRUE(op.Execute(&ok).ok());
  EXPECT_FALSE(ok);
  EXPECT_EQ(t.pm()->Read(&t.words[0]), 20u);
  EXPECT_EQ(t.pm()->Read(&t.words[1]), 21u);
  EXPECT_EQ(t.pm()->Read(&t.words[3]), 13u);
  // Raw words hold no reserved bits once operations are over.
  for (int i = 0; i < 4; i++) EXPECT_TRUE(pmwcas::IsValue(t.words[i])) << i;
  t.pm()->Reclaim();
  EXPECT_EQ(t.pm()->DescriptorsInUse(), 0u);
}

// TryBegin takes only from the calling thread's cache: it works inside a
// Guard, and reports false (never waits) once that cache is empty although
// the region still has free descriptors elsewhere (the shared list).
TEST(Pmwcas, TryBeginTakesFromTheThreadCacheOnly) {
  TestPool t("trybegin");
  ASSERT_NE(t.pm(), nullptr);
  t.Set(0, 1);
  {
    PMwCAS::Op warm;  // binds and fills this thread's cache
    ASSERT_TRUE(t.pm()->Begin(&warm).ok());
  }
  PMwCAS::Guard g(*t.pm());
  PMwCAS::Op op;
  ASSERT_TRUE(t.pm()->TryBegin(&op));
  ASSERT_TRUE(op.AddWord(&t.words[0], 1, 2).ok());
  bool ok = false;
  ASSERT_TRUE(op.Execute(&ok).ok());
  EXPECT_TRUE(ok);
  EXPECT_EQ(t.pm()->Read(&t.words[0]), 2u);
  std::vector<PMwCAS::Op> held;
  for (uint32_t i = 0; i < t.pm()->descriptor_count(); i++) {
    PMwCAS::Op o;
    if (!t.pm()->TryBegin(&o)) break;
    held.push_back(std::move(o));
  }
  EXPECT_GT(held.size(), 0u);
  EXPECT_LT(held.size(), t.pm()->descriptor_count() / 2);
  PMwCAS::Op none;
  EXPECT_FALSE(t.pm()->TryBegin(&none));
  EXPECT_FALSE(none.valid());
}

TEST(Pmwcas, BadInputIsAClearError) {
  TestPool t("bad");
  PMwCAS* p = t.pm();
  PMwCAS::Op op;
  bool ok = true;
  // Not begun.
  EXPECT_TRUE(op.AddWord(&t.words[0], 0, 1).IsInvalidArgument());
  // Too many words (the pool's max is 16).
  ASSERT_TRUE(p->Begin(&op).ok());
  for (int i = 0; i < 16; i++) ASSERT_TRUE(op.AddWord(&t.words[i], 0, 1).ok()) << i;
  Status s = op.AddWord(&t.words[16], 0, 1);
  EXPECT_TRUE(s.IsInvalidArgument());
  EXPECT_TRUE(Contains(s.message(), "more than 16")) << s.ToString();
  s = op.Execute(&ok);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_FALSE(ok);
  for (int i = 0; i < 17; i++) EXPECT_EQ(p->Read(&t.words[i]), 0u);
  // Duplicate address.
  ASSERT_TRUE(p->Begin(&op).ok());
  ASSERT_TRUE(op.AddWord(&t.words[3], 0, 1).ok());
  s = op.AddWord(&t.words[3], 0, 2);
  EXPECT_TRUE(s.IsInvalidArgument());
  EXPECT_TRUE(Contains(s.message(), "twice")) << s.ToString();
  EXPECT_TRUE(op.Execute(&ok).IsInvalidArgument());
  EXPECT_EQ(p->Read(&t.words[3]), 0u);
  // Outside the pool, misaligned, in the header, reserved bits, policies.
  uint64_t stack_word = 0;
  ASSERT_TRUE(p->Begin(&op).ok());
  s = op.AddWord(&stack_word, 0, 1);
  EXPECT_TRUE(s.IsInvalidArgument());
  EXPECT_TRUE(Contains(s.message(), "pool")) << s.ToString();
  EXPECT_TRUE(op.AddWord(reinterpret_cast<uint64_t*>(reinterpret_cast<char*>(&t.words[4]) + 4), 0, 1).IsInvalidArgument());
  EXPECT_TRUE(op.AddWord(reinterpret_cast<uint64_t*>(t.pool->base() + 64), 0, 1).IsInvalidArgument());
  EXPECT_TRUE(op.AddWord(&t.words[5], pmwcas::kDirtyBit, 1).IsInvalidArgument());
  EXPECT_TRUE(op.AddWord(&t.words[5], 0, pmwcas::kDescriptorBit | 1).IsInvalidArgument());
  EXPECT_TRUE(op.AddWord(&t.words[5], 0, 1, Recycle::kFreeNewOnFailure).IsInvalidArgument());
  EXPECT_TRUE(op.AddWord(&t.words[5], 0, 1, Recycle::kFreeOldOnSuccess).IsInvalidArgument());
  op.Abandon();
  // No target.
  ASSERT_TRUE(p->Begin(&op).ok());
  EXPECT_TRUE(op.Execute(&ok).IsInvalidArgument());
  // Pool creation bounds.
  std::unique_ptr<Pool> q;
  PoolOptions po;
  po.pmwcas_max_words = 0;
  EXPECT_TRUE(Pool::Create(t.path + ".x", "t", po, &q).IsInvalidArgument());
  po.pmwcas_max_words = PMwCAS::kMaxMaxWords + 1;
  EXPECT_TRUE(Pool::Create(t.path + ".x", "t", po, &q).IsInvalidArgument());
  p->Reclaim();
  EXPECT_EQ(p->DescriptorsInUse(), 0u);
}

TEST(Pmwcas, MaxWordsIsSetAtCreation) {
  TestPool t("max", 64, 40);
  EXPECT_EQ(t.pm()->max_words(), 40u);
  EXPECT_EQ(t.pool->Info().pmwcas_max_words, 40u);
  EXPECT_EQ(t.pm()->descriptor_count(), uint32_t(layout::kPmwcasRegionSize / ((32 + 40 * 32 + 63) / 64 * 64)));
  PMwCAS::Op op;
  ASSERT_TRUE(t.pm()->Begin(&op).ok());
  for (int i = 0; i < 40; i++) ASSERT_TRUE(op.AddWord(&t.words[i], 0, uint64_t(i + 1)).ok());
  bool ok = false;
  ASSERT_TRUE(op.Execute(&ok).ok());
  EXPECT_TRUE(ok);
  for (int i = 0; i < 40; i++) EXPECT_EQ(t.pm()->Read(&t.words[i]), uint64_t(i + 1));
  // The setting survives reopening.
  std::string path = t.path;
  t.pool.reset();
  ASSERT_TRUE(Pool::Open(path, "", PoolOptions{}, &t.pool).ok());
  EXPECT_EQ(t.pool->pmwcas()->max_words(), 40u);
}

// A word holding the expected value but dirty (stored, not yet persisted) is
// cleaned and compared again, not taken for a mismatch.
TEST(Pmwcas, DirtyExpectedValueIsNotAMismatch) {
  TestPool t("dirty");
  StoreAtomic(&t.words[0], uint64_t(5) | pmwcas::kDirtyBit);
  StoreAtomic(&t.words[1], uint64_t(6) | pmwcas::kDirtyBit);
  PMwCAS::Op op;
  ASSERT_TRUE(t.pm()->Begin(&op).ok());
  ASSERT_TRUE(op.AddWord(&t.words[0], 5, 7).ok());
  ASSERT_TRUE(op.AddWord(&t.words[1], 6, 8).ok());
  bool ok = false;
  ASSERT_TRUE(op.Execute(&ok).ok());
  EXPECT_TRUE(ok);
  EXPECT_EQ(t.words[0], 7u);
  EXPECT_EQ(t.words[1], 8u);
}

// Read persists a dirty word (a flush of its line and a fence) before
// returning its value, and clears the bit.
TEST(Pmwcas, ReadFlushesAndClearsADirtyWord) {
  TestPool t("read");
  StoreAtomic(&t.words[9], uint64_t(42) | pmwcas::kDirtyBit);
  Counters before = ThreadCounters();
  EXPECT_EQ(t.pm()->Read(&t.words[9]), 42u);
  Counters d = ThreadCounters() - before;
  EXPECT_EQ(d.lines_flushed, 1u);
  EXPECT_EQ(d.fences, 1u);
  EXPECT_EQ(t.words[9], 42u);
  before = ThreadCounters();
  EXPECT_EQ(t.pm()->Read(&t.words[9]), 42u);
  d = ThreadCounters() - before;
  EXPECT_EQ(d.lines_flushed, 0u);
  // The typed pointer view.
  TaggedPPtr<uint64_t> tp = TaggedPPtr<uint64_t>::FromWord(uint64_t(4096) | pmwcas::kDirtyBit);
  EXPECT_TRUE(tp.dirty());
  EXPECT_FALSE(tp.descriptor());
  EXPECT_EQ(tp.ptr().off, 4096u);
  EXPECT_FALSE(tp.clean_value());
  EXPECT_EQ(TaggedPPtr<int>::FromPPtr(PPtr<int>(64)).value(), 64u);
}

TEST(Pmwcas, RecyclePoliciesFreeExactlyOnce) {
  TestPool t("recycle");
  Allocator& a = t.pool->allocator();
  const uint64_t base_blocks = a.BlocksInUse();
  // Publish a block in word 0 through a PMwCAS.
  PMwCAS::Op op;
  void* blk = nullptr;
  ASSERT_TRUE(t.pm()->Begin(&op).ok());
  ASSERT_TRUE(op.AddAllocation(&t.words[0], 0, 128, &blk).ok());
  ASSERT_NE(blk, nullptr);
  EXPECT_EQ(a.BlocksInUse(), base_blocks + 1);
  bool ok = false;
  ASSERT_TRUE(op.Execute(&ok).ok());
  ASSERT_TRUE(ok);
  const uint64_t b1 = t.pm()->Read(&t.words[0]);
  EXPECT_EQ(t.pool->At<void>(b1), blk);
  // Failure frees the fresh block.
  ASSERT_TRUE(t.pm()->Begin(&op).ok());
  ASSERT_TRUE(op.AddWord(&t.words[1], 1, 2).ok());  // mismatches (word 1 is 0)
  ASSERT_TRUE(op.AddAllocation(&t.words[0], b1, 64, &blk, Recycle::kFreeOldOnSuccessNewOnFailure).ok());
  ASSERT_TRUE(op.Execute(&ok).ok());
  EXPECT_FALSE(ok);
  t.pm()->Reclaim();
  EXPECT_EQ(a.BlocksInUse(), base_blocks + 1);
  // Success frees the old block (after the grace period: Reclaim).
  ASSERT_TRUE(t.pm()->Begin(&op).ok());
  ASSERT_TRUE(op.AddAllocation(&t.words[0], b1, 64, &blk, Recycle::kFreeOldOnSuccessNewOnFailure).ok());
  ASSERT_TRUE(op.Execute(&ok).ok());
  EXPECT_TRUE(ok);
  const uint64_t b2 = t.pm()->Read(&t.words[0]);
  EXPECT_NE(b2, b1);
  t.pm()->Reclaim();
  EXPECT_EQ(a.BlocksInUse(), base_blocks + 1);
  EXPECT_FALSE(a.IsAllocated(b1));
  EXPECT_TRUE(a.IsAllocated(b2));
  // An abandoned operation frees its allocation; so does a destroyed Op.
  ASSERT_TRUE(t.pm()->Begin(&op).ok());
  ASSERT_TRUE(op.AddAllocation(&t.words[2], 0, 64, &blk).ok());
  EXPECT_EQ(a.BlocksInUse(), base_blocks + 2);
  op.Abandon();
  EXPECT_EQ(a.BlocksInUse(), base_blocks + 1);
  {
    PMwCAS::Op op2;
    ASSERT_TRUE(t.pm()->Begin(&op2).ok());
    ASSERT_TRUE(op2.AddAllocation(&t.words[2], 0, 64, &blk).ok());
  }
  EXPECT_EQ(a.BlocksInUse(), base_blocks + 1);
  // kFreeOldOnSuccess through AddWord.
  ASSERT_TRUE(t.pm()->Begin(&op).ok());
  ASSERT_TRUE(op.AddWord(&t.words[0], b2, 0, Recycle::kFreeOldOnSuccess).ok());
  ASSERT_TRUE(op.Execute(&ok).ok());
  EXPECT_TRUE(ok);
  t.pm()->Reclaim();
  EXPECT_EQ(a.BlocksInUse(), base_blocks);
  EXPECT_TRUE(a.Check().ok());
}

// Exact persist cost of an uncontended k-word operation on words in distinct
// lines: descriptor lines D(k) = ceil((32 + 32k) / 64), k install flushes,
// one status flush, k final-value flushes; four fences. Printed for
// docs/pmwcas.md.
TEST(Pmwcas, PersistCostPerOperation) {
  TestPool t("cost", 8 * 8);
  for (uint32_t k = 1; k <= 8; k++) {
    PMwCAS::Op op;
    ASSERT_TRUE(t.pm()->Begin(&op).ok());
    std::vector<uint64_t> cur(k);
    for (uint32_t i = 0; i < k; i++) cur[i] = t.pm()->Read(&t.words[i * 8]);
    t.pm()->Reclaim();
    Counters before = ThreadCounters();
    for (uint32_t i = 0; i < k; i++) ASSERT_TRUE(op.AddWord(&t.words[i * 8], cur[i], cur[i] + 1).ok());
    bool ok = false;
    ASSERT_TRUE(op.Execute(&ok).ok());
    ASSERT_TRUE(ok);
    Counters d = ThreadCounters() - before;
    const uint64_t desc_lines = (32 + 32 * k + 63) / 64;
    std::printf("k=%u lines_flushed=%llu fences=%llu (3k+1=%u)\n", k, (unsigned long long)d.lines_flushed,
                (unsigned long long)d.fences, 3 * k + 1);
    EXPECT_EQ(d.lines_flushed, desc_lines + 2 * k + 1) << k;
    EXPECT_EQ(d.fences, 4u) << k;
  }
}

// Targets that share a cache line are flushed once per line at install and
// at finalisation: k words in one line cost D(k) + 3 lines. The durability
// lint (EveryStoreIsFlushedAndFenced) and the crash tests check that one
// flush of the line covers every target in it.
TEST(Pmwcas, TargetsSharingALineAreFlushedOnce) {
  TestPool t("sameline", 8 * 8);
  for (uint32_t k = 1; k <= 8; k++) {
    PMwCAS::Op op;
    ASSERT_TRUE(t.pm()->Begin(&op).ok());
    std::vector<uint64_t> cur(k);
    for (uint32_t i = 0; i < k; i++) cur[i] = t.pm()->Read(&t.words[i]);
    t.pm()->Reclaim();
    Counters before = ThreadCounters();
    for (uint32_t i = 0; i < k; i++) ASSERT_TRUE(op.AddWord(&t.words[i], cur[i], cur[i] + 1).ok());
    bool ok = false;
    ASSERT_TRUE(op.Execute(&ok).ok());
    ASSERT_TRUE(ok);
    Counters d = ThreadCounters() - before;
    const uint64_t desc_lines = (32 + 32 * k + 63) / 64;
    const uint64_t word_lines = (reinterpret_cast<uintptr_t>(&t.words[k - 1]) / 64) -
                                (reinterpret_cast<uintptr_t>(&t.words[0]) / 64) + 1;
    EXPECT_EQ(d.lines_flushed, desc_lines + 2 * word_lines + 1) << k;
    for (uint32_t i = 0; i < k; i++) EXPECT_EQ(t.pm()->Read(&t.words[i]), cur[i] + 1);
  }
}

// Durability lint: during an operation, every (non-volatile) store's line is
// flushed after the store and a fence follows, before Execute returns.
// The allocator's lane clear is ordered by the thread's next fence or left
// unflushed on purpose (docs/allocator.md): lanes are not checked.
class Lint : public Observer {
 public:
  explicit Lint(const char* base) : lanes_(uintptr_t(base) + layout::kLanesOffset) {}
  std::map<uintptr_t, int> dirty;  // line -> 1 stored, 2 flushed
  void OnStore(const void* a, size_t n) override {
    for (uintptr_t l = LineOf(a); l < reinterpret_cast<uintptr_t>(a) + n; l += kCacheLine)
      if (l < lanes_ || l >= lanes_ + layout::kLaneCount * layout::kLaneSize) dirty[l] = 1;
  }
  void OnVolatileStore(const void*, size_t) override {}
  void OnNonTemporalStore(const void*, size_t) override {}
  void OnFlush(const void* l) override {
    auto it = dirty.find(reinterpret_cast<uintptr_t>(l));
    if (it != dirty.end()) it->second = 2;
  }
  void OnFence() override {
    for (auto it = dirty.begin(); it != dirty.end();) it = it->second == 2 ? dirty.erase(it) : std::next(it);
  }
  void OnLoad(const void*, size_t) override {}

 private:
  uintptr_t lanes_;
};

TEST(Pmwcas, EveryStoreIsFlushedAndFenced) {
  TestPool t("lint");
  Lint lint(t.pool->base());
  for (uint32_t k = 1; k <= 16; k++) {
    for (int fail = 0; fail < 2; fail++) {
      PMwCAS::Op op;
      ASSERT_TRUE(t.pm()->Begin(&op).ok());
      SetObserver(&lint);
      for (uint32_t i = 0; i < k; i++) {
        const uint64_t v = t.pm()->Read(&t.words[i * 3]);
        ASSERT_TRUE(op.AddWord(&t.words[i * 3], v + (fail && i == k - 1), v + 1).ok());
      }
      void* blk;
      if (k < 16) {
        const uint64_t old = t.pm()->Read(&t.words[60]);
        const Recycle r = old ? Recycle::kFreeOldOnSuccessNewOnFailure : Recycle::kFreeNewOnFailure;
        ASSERT_TRUE(op.AddAllocation(&t.words[60], old, 64, &blk, r).ok());
      }
      bool ok;
      ASSERT_TRUE(op.Execute(&ok).ok());
      t.pm()->Reclaim();
      SetObserver(nullptr);
      EXPECT_EQ(ok, !fail);
      EXPECT_TRUE(lint.dirty.empty()) << "k=" << k << " fail=" << fail << ": " << lint.dirty.size()
                                      << " lines stored to and not persisted, first at pool offset "
                                      << (lint.dirty.empty() ? 0 : lint.dirty.begin()->first - uintptr_t(t.pool->base()));
      lint.dirty.clear();
    }
  }
}

// Recovery must not replay a finished descriptor: op A sets x 1 -> 2 and
// finishes (its descriptor is retired, still "succeeded" in PM), op B sets
// x 2 -> 1. After a crash x is 1: rolling A forward by address would lose B.
TEST(Pmwcas, RecoveryDoesNotReplayAFinishedDescriptor) {
  TestPool t("aba");
  t.Set(0, 1);
  t.Set(1, 100);
  bool ok;
  PMwCAS::Op op;
  ASSERT_TRUE(t.pm()->Begin(&op).ok());
  ASSERT_TRUE(op.AddWord(&t.words[0], 1, 2).ok());
  ASSERT_TRUE(op.AddWord(&t.words[1], 100, 101).ok());
  ASSERT_TRUE(op.Execute(&ok).ok() && ok);
  ASSERT_TRUE(t.pm()->Begin(&op).ok());
  ASSERT_TRUE(op.AddWord(&t.words[0], 2, 1).ok());
  ASSERT_TRUE(op.Execute(&ok).ok() && ok);
  const std::string copy = CrashCopy(t.path);
  std::unique_ptr<Pool> p;
  ASSERT_TRUE(Pool::Open(copy, "", PoolOptions{}, &p).ok());
  EXPECT_EQ(p->pmwcas()->recovery_stats().rolled_forward, 2u);  // both retired, not yet recycled
  const uint64_t* w = p->root<uint64_t>();
  EXPECT_EQ(w[0], 1u);
  EXPECT_EQ(w[1], 101u);
  p.reset();
  ::unlink(copy.c_str());
}

// A format 1 pool (no descriptor region) opens read-write with no PMwCAS.
TEST(Pmwcas, FormatOnePoolOpensWithoutPmwcas) {
  TestPool t("v1");
  const std::string path = t.path;
  uint64_t root_block = t.pool->OffsetOf(t.words);
  t.pool.reset();
  // Rewrite the header as format 1: version 1, checksum, the region line zeroed.
  int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char h[512];
  ASSERT_EQ(::pread(fd, h, sizeof(h), 0), ssize_t(sizeof(h)));
  uint32_t v1 = 1;
  std::memcpy(h + 8, &v1, 4);
  uint64_t sum = 1469598103934665603ull;
  for (int i = 8; i < 112; i++) {
    sum ^= uint8_t(h[i]);
    sum *= 1099511628211ull;
  }
  std::memcpy(h + 112, &sum, 8);
  std::memset(h + layout::kPmwcasInfoOffset, 0, 64);
  ASSERT_EQ(::pwrite(fd, h, sizeof(h), 0), ssize_t(sizeof(h)));
  ::close(fd);
  PoolInfo info;
  ASSERT_TRUE(Pool::ReadInfo(path, &info).ok());
  EXPECT_EQ(info.version, 1u);
  EXPECT_EQ(info.pmwcas_max_words, 0u);
  std::unique_ptr<Pool> p;
  Status s = Pool::Open(path, "pmwcas_test", PoolOptions{}, &p);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(p->pmwcas(), nullptr);
  EXPECT_EQ(*p->root_slot(), root_block);
  EXPECT_TRUE(p->allocator().IsAllocated(root_block));
  uint64_t* dest = p->root<uint64_t>();
  ASSERT_TRUE(p->allocator().Allocate(dest, 64).ok());
  ASSERT_TRUE(p->allocator().Free(dest).ok());
  EXPECT_TRUE(p->allocator().Check().ok());
  p.reset();
  ASSERT_TRUE(Pool::ReadInfo(path, &info).ok());
  EXPECT_EQ(info.version, 1u);  // never rewritten
  // A corrupted region line of a format 2 pool is refused.
  TestPool t2("v2bad");
  const std::string path2 = t2.path;
  t2.pool.reset();
  fd = ::open(path2.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  uint32_t bad = 7;
  ASSERT_EQ(::pwrite(fd, &bad, 4, off_t(layout::kPmwcasInfoOffset)), 4);
  ::close(fd);
  s = Pool::Open(path2, "", PoolOptions{}, &p);
  EXPECT_TRUE(s.IsCorrupt()) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "PMwCAS")) << s.ToString();
}

}  // namespace
}  // namespace pmindex::pm
