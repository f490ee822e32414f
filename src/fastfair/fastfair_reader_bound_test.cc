// Bounds on what one fastfair reader or Remove costs while writers keep a
// node busy (fastfair_read.cc, fastfair_write.cc). Deterministic: a test
// hook inside the lock-free reader runs a writer to completion each time
// the reader reaches it, so every validation of that leaf fails; the
// reader must give up after a bounded number of tries and read the leaf
// under its read lock (before, it retried for as long as the writes went
// on). And a Remove while retired nodes wait for a paused reader's guard
// must not take the retire list's mutex (Reclaim) each time.
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fastfair/fastfair.h"
#include "fastfair/fastfair_test_util.h"
#include "pmindex/index.h"

namespace {

using namespace pmindex;
using fftest::U64;

// More hook calls than any bound the reader may use: a reader still
// retrying after this many disturbed tries has no bound.
constexpr int kDisturbed = 1000;

// A u64 tree with one leaf: keys 0, 10, ..., 190 (20 of a 512-byte node's 26).
std::unique_ptr<Index> OneLeaf(const std::string& path) {
  std::unique_ptr<Index> idx;
  EXPECT_TRUE(OpenIndex("fastfair", fftest::MakeOptions(path, KeyKind::kU64, ValueKind::kU64, 512), &idx).ok());
  for (uint64_t k = 0; k < 200; k += 10) EXPECT_TRUE(idx->Insert(U64(k), U64(k + 1)).ok());
  EXPECT_EQ(internal::fastfair::Height(idx.get()), 1);
  return idx;
}

// Removes and re-inserts key 50 in another thread: a delete shift and a
// right insert, sw + 2, the leaf's records as before.
void DisturbLeaf(Index* idx) {
  std::thread w([idx] {
    EXPECT_TRUE(idx->Remove(U64(50)).ok());
    EXPECT_TRUE(idx->Insert(U64(50), U64(51)).ok());
  });
  w.join();
}

TEST(FastFairReaderBound, FindFallsBackToTheReadLock) {
  fftest::PoolGuard g("ff-bound-find");
  auto idx = OneLeaf(g.path);
  int calls = 0;
  internal::fastfair::TestHooks hooks;
  hooks.lf_forward_start = [&](const void*) {
    if (++calls <= kDisturbed) DisturbLeaf(idx.get());
  };
  internal::fastfair::SetTestHooks(idx.get(), &hooks);
  std::string v;
  Status s = idx->Find(U64(30), &v);
  internal::fastfair::SetTestHooks(idx.get(), nullptr);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(SliceToU64(v), 31u);
  EXPECT_LT(calls, kDisturbed) << "the lock-free Find retried without bound";
  EXPECT_GE(internal::fastfair::GetDebugCounters(idx.get())->lf_lock_fallbacks, 1u);
  EXPECT_TRUE(idx->Check().ok());
}

TEST(FastFairReaderBound, ScanFallsBackToTheReadLock) {
  fftest::PoolGuard g("ff-bound-scan");
  auto idx = OneLeaf(g.path);
  int calls = 0;
  internal::fastfair::TestHooks hooks;
  hooks.lf_snapshot_copied = [&](const void*) {
    if (++calls <= kDisturbed) DisturbLeaf(idx.get());
  };
  internal::fastfair::SetTestHooks(idx.get(), &hooks);
  std::vector<uint64_t> keys;
  Status s = idx->Scan(U64(0), 100, [&](Slice k, Slice v) {
    keys.push_back(SliceToU64(k));
    EXPECT_EQ(SliceToU64(v), SliceToU64(k) + 1);
    return true;
  });
  internal::fastfair::SetTestHooks(idx.get(), nullptr);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_LT(calls, kDisturbed) << "the lock-free scan retried without bound";
  ASSERT_EQ(keys.size(), 20u);
  for (size_t i = 0; i < keys.size(); i++) EXPECT_EQ(keys[i], i * 10);
  EXPECT_GE(internal::fastfair::GetDebugCounters(idx.get())->lf_lock_fallbacks, 1u);
  EXPECT_TRUE(idx->Check().ok());
}

// A Find paused inside its epoch guard holds back the nodes that merges
// retire meanwhile. Removes of absent keys then find a reclaim not due:
// they must not call Reclaim (its mutex) each time. Once the Find is
// released, the next Remove frees the waiting nodes.
TEST(FastFairReaderBound, RemoveReclaimsOnlyWhenDue) {
  fftest::PoolGuard g("ff-bound-reclaim");
  std::unique_ptr<Index> idx;
  ASSERT_TRUE(OpenIndex("fastfair", fftest::MakeOptions(g.path, KeyKind::kU64, ValueKind::kU64, 512), &idx).ok());
  for (uint64_t k = 0; k < 200; k++) ASSERT_TRUE(idx->Insert(U64(k), U64(k)).ok());
  std::mutex mu;
  std::condition_variable cv;
  int phase = 0;  // 1: the reader is paused in its guard, 2: released
  internal::fastfair::TestHooks hooks;
  hooks.lf_forward_start = [&](const void*) {
    std::unique_lock<std::mutex> l(mu);
    if (phase != 0) return;
    phase = 1;
    cv.notify_all();
    cv.wait(l, [&] { return phase >= 2; });
  };
  internal::fastfair::SetTestHooks(idx.get(), &hooks);
  std::thread r([&] { EXPECT_TRUE(idx->Find(U64(199), nullptr).ok()); });
  {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return phase >= 1; });
  }
  for (uint64_t k = 0; k < 150; k++) ASSERT_TRUE(idx->Remove(U64(k)).ok());
  const auto* d = internal::fastfair::GetDebugCounters(idx.get());
  const uint64_t merges = d->merges;
  ASSERT_GE(merges, 1u) << "the removes merged no node";
  ASSERT_EQ(internal::fastfair::GetDebugCounters(idx.get())->nodes_freed, 0u) << "freed under a paused reader's guard";
  const uint64_t before = internal::fastfair::GetDebugCounters(idx.get())->reclaims;
  for (uint64_t k = 1000; k < 1200; k++) ASSERT_TRUE(idx->Remove(U64(k)).IsNotFound());
  d = internal::fastfair::GetDebugCounters(idx.get());
  EXPECT_EQ(d->merges, merges);
  EXPECT_LE(d->reclaims - before, 1u) << "Remove called Reclaim (the retire list's mutex) with no reclaim due";
  EXPECT_EQ(d->nodes_freed, 0u);
  {
    std::lock_guard<std::mutex> l(mu);
    phase = 2;
    cv.notify_all();
  }
  r.join();
  internal::fastfair::SetTestHooks(idx.get(), nullptr);
  ASSERT_TRUE(idx->Remove(U64(2000)).IsNotFound());
  EXPECT_GE(internal::fastfair::GetDebugCounters(idx.get())->nodes_freed, 1u) << "the waiting nodes were not freed once due";
  EXPECT_TRUE(idx->Check().ok());
  EXPECT_TRUE(fftest::NoLeak(idx.get()));
}

}  // namespace
