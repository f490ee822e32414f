// fastfair_interleaving_test (label: concurrency, run under TSan in CI):
// deterministic interleavings of a lock-free reader with one writer, each
// held at a test hook of fastfair.h (TestHooks) at the step where a wrong
// store order would let the reader skip a record or take a wrong child:
// a left shift's move, DropPrefix, FixLk raising lk, an insert at slot 0 of
// an internal node.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/index_util.h"
#include "fastfair/fastfair.h"
#include "fastfair/fastfair_test_util.h"
#include "pmindex/index.h"
#include "pmindex/pm/pool.h"

namespace {

using namespace pmindex;
using fftest::U64;

// The deterministic interleaving tests' waits for a hook's phase are
// bounded: a build that never reaches (or never leaves) a paused point
// fails with `what` after 20 s instead of hanging the suite.
template <typename Pred>
bool WaitPhase(std::condition_variable& cv, std::unique_lock<std::mutex>& l, Pred pred, const char* what) {
  if (cv.wait_for(l, std::chrono::seconds(20), pred)) return true;
  ADD_FAILURE() << "timed out after 20 s waiting for " << what;
  return false;
}

// A hook's pause at a phase boundary: if the phase is `from`, moves it to
// from + 1, wakes the test thread and waits (bounded, WaitPhase) until the
// phase reaches `until`. Other calls of the hook pass straight through.
void PauseAt(std::mutex& mu, std::condition_variable& cv, int& phase, int from, int until, const char* what) {
  std::unique_lock<std::mutex> l(mu);
  if (phase != from) return;
  phase = from + 1;
  cv.notify_all();
  WaitPhase(cv, l, [&] { return phase >= until; }, what);
}

// Format 4, deterministic: a lock-free Find runs while InsertLeft is paused
// before the store k[j-1] = k[j] that moves record j left, and its
// left-to-right scan (if it took one) is paused right after loading slot
// j-1's key until the insert has finished: the schedule in which a reader
// that loaded an even sw sees slot j-1 as an ignored copy of its left
// neighbour and then slot j as an ignored copy of the moved record, and
// skips a record that never left the leaf. InsertLeft makes sw odd first,
// so readers scan right to left and find it. (Fails with the flip in
// InsertLeft removed: "not found" for every moved record.)
TEST(FastFairInterleaving, FindDuringLeftShift) {
  for (int ns : {256, 512}) {
    const int cap = (ns - 96) / 16, m = cap / 2;
    const int first = 10 * (m + 1);  // the new right leaf's first key (as SplitAt)
    const int moves = 2;             // insert first+15: moves first, first+10 left
    for (int step = 0; step < moves; step++) {
      fftest::PoolGuard g("interleave");
      std::unique_ptr<Index> idx;
      ASSERT_TRUE(OpenIndex("fastfair", fftest::MakeOptions(g.path, KeyKind::kU64, ValueKind::kU64, ns), &idx).ok());
      for (int i = 1; i <= cap; i++) ASSERT_TRUE(idx->Insert(U64(10 * i), U64(1000 + 10 * i)).ok());
      ASSERT_TRUE(idx->Insert(U64(10 * cap - 5), U64(1000 + 10 * cap - 5)).ok());  // the centring split
      const uint64_t left0 = internal::fastfair::GetDebugCounters(idx.get())->left_inserts;

      std::mutex mu;
      std::condition_variable cv;
      int phase = 0;  // 1: writer paused before the move, 2: released, 3: insert done
      const void* w_leaf = nullptr;
      uint32_t w_j = 0;
      int calls = 0;
      bool reader_paused = false;
      internal::fastfair::TestHooks hooks;
      hooks.insert_left_move = [&](const void* leaf, uint32_t j) {
        std::unique_lock<std::mutex> l(mu);
        if (calls++ != step) return;
        w_leaf = leaf;
        w_j = j;
        phase = 1;
        cv.notify_all();
        WaitPhase(cv, l, [&] { return phase >= 2; }, "the reader to release the paused left shift");
      };
      hooks.lf_forward_key = [&](const void* leaf, uint32_t j) {
        std::unique_lock<std::mutex> l(mu);
        if (phase != 1 || leaf != w_leaf || j + 1 != w_j) return;
        reader_paused = true;
        phase = 2;  // let the writer store k[j] = k[j+1] and finish
        cv.notify_all();
        WaitPhase(cv, l, [&] { return phase == 3; }, "the left-shift insert to finish");
      };
      internal::fastfair::SetTestHooks(idx.get(), &hooks);
      std::thread w([&] {
        EXPECT_TRUE(idx->Insert(U64(first + 15), U64(1000 + first + 15)).ok());
        std::lock_guard<std::mutex> l(mu);
        phase = 3;
        cv.notify_all();
      });
      {
        std::unique_lock<std::mutex> l(mu);
        WaitPhase(cv, l, [&] { return phase != 0; }, "the insert to pause before a left move (or finish)");
      }
      const uint64_t key = first + 10 * step;  // the record being moved
      std::string v;
      Status s = idx->Find(U64(key), &v);
      {
        std::lock_guard<std::mutex> l(mu);
        if (phase == 1) phase = 2;
        cv.notify_all();
      }
      w.join();
      internal::fastfair::SetTestHooks(idx.get(), nullptr);
      const std::string t = "ns=" + std::to_string(ns) + " move " + std::to_string(step) + " key " + std::to_string(key) +
                            (reader_paused ? " (reader scanned left to right)" : "");
      EXPECT_EQ(calls, moves) << t;
      EXPECT_EQ(internal::fastfair::GetDebugCounters(idx.get())->left_inserts, left0 + 1) << t;
      ASSERT_TRUE(s.ok()) << t << ": " << s.ToString();
      EXPECT_EQ(SliceToU64(v), 1000 + key) << t;
      EXPECT_TRUE(idx->Check().ok()) << t;
    }
  }
}

// Format 4, deterministic: a lock-free Find's left-to-right scan is paused
// right after it loaded slot 1's key while a writer's FixLk drops the
// leaf's crash-made prefix (DropPrefix: every record one slot left) and
// inserts in the middle (a right shift that moves only the upper records
// back). The leaf: one u64 leaf of records 10..120 whose lk (65) sits in
// its key range, patched into the state a crash leaves when the removal of
// its first record (10) kept only its commit store (slot 0 = lk), reopened
// and repaired by an append (the prefix stays). The reader looks for 30
// (slot 2); when it resumes, 30 is in slot 1, behind it. DropPrefix's
// shifts make sw odd (readers scan right to left) and the insert makes it
// even again: sw changed, the reader retries and finds 30. (With DeleteAt
// not flipping sw for the repair's and DropPrefix's uncommitted shifts,
// sw is unchanged and 30 is reported missing.)
TEST(FastFairInterleaving, FindDuringDropPrefix) {
  fftest::PoolGuard g("interleave-drop");
  const Options o = fftest::MakeOptions(g.path, KeyKind::kU64, ValueKind::kU64, 512);
  {
    std::unique_ptr<Index> idx;
    ASSERT_TRUE(OpenIndex("fastfair", o, &idx).ok());
    for (uint64_t k = 10; k <= 120; k += 10) ASSERT_TRUE(idx->Insert(U64(k), U64(1000 + k)).ok());
  }
  {
    std::unique_ptr<pm::Pool> pool;
    ASSERT_TRUE(pm::Pool::Open(g.path, "fastfair", pm::PoolOptions{}, &pool).ok());
    char* base = pool->base();
    uint64_t* leaf = reinterpret_cast<uint64_t*>(base + *reinterpret_cast<uint64_t*>(base + *pool->root_slot() + 64));
    ASSERT_EQ(leaf[12], 10u);          // slot 0's key
    pm::StorePersist(&leaf[10], uint64_t(65));  // lk (as raised by FixLk)
    pm::StorePersist(&leaf[12], uint64_t(65));  // slot 0: the prefix (10 removed)
  }
  std::unique_ptr<Index> idx;
  ASSERT_TRUE(OpenIndex("fastfair", o, &idx).ok());
  ASSERT_TRUE(idx->Insert(U64(125), U64(1125)).ok());  // repairs the leaf, keeps the prefix
  const uint64_t drops0 = internal::fastfair::GetDebugCounters(idx.get())->prefix_drops;
  std::mutex mu;
  std::condition_variable cv;
  int phase = 0;  // 1: reader paused after slot 1, 2: writer done
  bool armed = true;
  internal::fastfair::TestHooks hooks;
  hooks.lf_forward_key = [&](const void*, uint32_t j) {
    std::unique_lock<std::mutex> l(mu);
    if (!armed || j != 1) return;
    armed = false;
    phase = 1;
    cv.notify_all();
    WaitPhase(cv, l, [&] { return phase == 2; }, "the writer's DropPrefix and insert while the reader is paused");
  };
  internal::fastfair::SetTestHooks(idx.get(), &hooks);
  Status fs;
  std::string v;
  std::thread r([&] { fs = idx->Find(U64(30), &v); });
  bool paused;
  {
    std::unique_lock<std::mutex> l(mu);
    paused = WaitPhase(cv, l, [&] { return phase == 1; }, "the reader to pause after loading slot 1");
  }
  // (No ASSERT before the join: the reader may be waiting in the hook.)
  const Status is = idx->Insert(U64(65), U64(1065));  // FixLk: DropPrefix, then the insert
  {
    std::lock_guard<std::mutex> l(mu);
    phase = 2;
    cv.notify_all();
  }
  r.join();
  internal::fastfair::SetTestHooks(idx.get(), nullptr);
  ASSERT_TRUE(is.ok()) << is.ToString();
  EXPECT_TRUE(paused) << "the reader never reached slot 1 of its forward scan";
  EXPECT_EQ(internal::fastfair::GetDebugCounters(idx.get())->prefix_drops, drops0 + 1);
  ASSERT_TRUE(fs.ok()) << "Find(30) during DropPrefix: " << fs.ToString();
  EXPECT_EQ(SliceToU64(v), 1030u);
  EXPECT_TRUE(idx->Check().ok());
  EXPECT_EQ(idx->Size(), 13u);
}

// Deterministic: a lock-free Find in a leaf with no
// prefix loads lk, then an insert of a key equal to lk runs FixLk (lk raised
// to a free value: no shift, so no sw flip) and its right shift stores
// k[0] = the new lk (slot 0 an ignored copy) and pauses there; the Find
// then reads slot 0, a key above its own that is not the lk it loaded.
// It must not answer NotFound for a key present throughout (it did: the
// scan stopped at slot 0 and sw had not changed).
TEST(FastFairInterleaving, FindWhileFixLkRaisesLk) {
  fftest::PoolGuard g("interleave");
  std::unique_ptr<Index> idx;
  ASSERT_TRUE(OpenIndex("fastfair", fftest::MakeOptions(g.path, KeyKind::kU64, ValueKind::kU64, 512), &idx).ok());
  for (int k : {1, 2, 3, 5}) ASSERT_TRUE(idx->Insert(U64(k), U64(100 + k)).ok());
  std::mutex mu;
  std::condition_variable cv;
  int phase = 0;  // 1: reader paused after loading lk, 2: writer paused after k[0] = lk, 3: reader done
  internal::fastfair::TestHooks hooks;
  hooks.lf_forward_start = [&](const void*) { PauseAt(mu, cv, phase, 0, 2, "the writer to make slot 0 an ignored copy"); };
  hooks.insert_slot0_ignored = [&](const void*) { PauseAt(mu, cv, phase, 1, 3, "the paused reader's Find to finish"); };
  internal::fastfair::SetTestHooks(idx.get(), &hooks);
  std::string v;
  Status s;
  std::thread r([&] {
    s = idx->Find(U64(3), &v);
    std::lock_guard<std::mutex> l(mu);
    phase = 3;
    cv.notify_all();
  });
  bool paused;
  {
    std::unique_lock<std::mutex> l(mu);
    paused = cv.wait_for(l, std::chrono::seconds(10), [&] { return phase >= 1; });
  }
  std::thread w([&] { EXPECT_TRUE(idx->Insert(U64(0), U64(100)).ok()); });
  r.join();
  w.join();
  internal::fastfair::SetTestHooks(idx.get(), nullptr);
  EXPECT_TRUE(paused) << "the reader never reached its forward scan";
  EXPECT_EQ(phase, 3) << "the writer never made slot 0 an ignored copy while the reader waited";
  ASSERT_TRUE(s.ok()) << "key 3 (present throughout) reported: " << s.ToString();
  EXPECT_EQ(SliceToU64(v), 103u);
  EXPECT_TRUE(idx->Check().ok());
}

// Deterministic: a lock-free descent through an internal
// node while an insert at its slot 0 is paused right after k[0] = lk (slot
// 0 an ignored copy whose value is still the child of the separator that
// moved to slot 1). The descent takes slot 0 as its candidate and only
// ReadValid's left-neighbour test rejects it; without that test the reader
// goes to a child too far right and reports a present key missing.
TEST(FastFairInterleaving, DescentDuringInternalSlot0Insert) {
  fftest::PoolGuard g("interleave");
  std::unique_ptr<Index> idx;
  ASSERT_TRUE(OpenIndex("fastfair", fftest::MakeOptions(g.path, KeyKind::kU64, ValueKind::kU64, 256), &idx).ok());
  const int cap = (256 - 96) / 16;
  for (int i = 1; i <= cap + 1; i++) ASSERT_TRUE(idx->Insert(U64(10 * i), U64(1000 + 10 * i)).ok());
  ASSERT_EQ(internal::fastfair::Height(idx.get()), 2);
  for (int k = 1; k <= 5; k++) ASSERT_TRUE(idx->Insert(U64(k), U64(1000 + k)).ok());
  std::mutex mu;
  std::condition_variable cv;
  int phase = 0, calls = 0;
  internal::fastfair::TestHooks hooks;
  hooks.insert_slot0_ignored = [&](const void*) {
    {
      std::lock_guard<std::mutex> l(mu);
      calls++;
    }
    PauseAt(mu, cv, phase, 0, 2, "the Find during the paused slot-0 insert");
  };
  internal::fastfair::SetTestHooks(idx.get(), &hooks);
  // Splits the leftmost leaf: its separator goes to slot 0 of the root.
  std::thread w([&] { EXPECT_TRUE(idx->Insert(U64(6), U64(1006)).ok()); });
  bool paused;
  {
    std::unique_lock<std::mutex> l(mu);
    paused = cv.wait_for(l, std::chrono::seconds(10), [&] { return phase >= 1; });
  }
  std::string v;
  Status s = idx->Find(U64(30), &v);
  {
    std::lock_guard<std::mutex> l(mu);
    phase = 2;
    cv.notify_all();
  }
  w.join();
  internal::fastfair::SetTestHooks(idx.get(), nullptr);
  EXPECT_TRUE(paused);
  EXPECT_EQ(calls, 1) << "one insert at slot 0 (the root's) expected";
  ASSERT_TRUE(s.ok()) << "key 30 reported: " << s.ToString();
  EXPECT_EQ(SliceToU64(v), 1030u);
  EXPECT_TRUE(idx->Check().ok());
}

// Deterministic, byte keys: a lock-free Find's left-to-right scan loads the
// key it looks for (k30, slot 2) and is paused there while a writer inserts
// k15 into the same leaf: the right shift moves k30 to slot 3 (slot 2 its
// ignored copy, then k20). The resumed reader's ReadValid of slot 2 fails
// (the slot no longer holds k30), and slot 3 holds the block it loaded
// from slot 2 a moment ago: the scan must validate it rather than skip it
// as a copy of its left neighbour. sw does not change (both inserts run in
// insert mode), so a skipped record is a NotFound for a key present
// throughout (it was: conformance ManyThreadsOnDisjointKeys lost a
// thread's own key this way, a few runs in 30).
TEST(FastFairInterleaving, FindOfAByteKeyMovedByAnInsert) {
  for (ValueKind vk : {ValueKind::kU64, ValueKind::kBytes}) {
    fftest::PoolGuard g("interleave-bk");
    std::unique_ptr<Index> idx;
    ASSERT_TRUE(OpenIndex("fastfair", fftest::MakeOptions(g.path, KeyKind::kBytes, vk, 512), &idx).ok());
    auto val = [&](int i) { return vk == ValueKind::kU64 ? U64(1000 + i) : "value" + std::to_string(i); };
    for (int i : {10, 20, 30, 40}) ASSERT_TRUE(idx->Insert("k" + std::to_string(i), val(i)).ok());
    std::mutex mu;
    std::condition_variable cv;
    int phase = 0;  // 1: reader paused after loading slot 2's key, 2: writer done
    bool armed = true;
    internal::fastfair::TestHooks hooks;
    hooks.lf_forward_key = [&](const void*, uint32_t j) {
      std::unique_lock<std::mutex> l(mu);
      if (!armed || j != 2) return;
      armed = false;
      phase = 1;
      cv.notify_all();
      WaitPhase(cv, l, [&] { return phase == 2; }, "the writer's insert while the reader is paused");
    };
    internal::fastfair::SetTestHooks(idx.get(), &hooks);
    Status fs;
    std::string v;
    std::thread r([&] { fs = idx->Find("k30", &v); });
    bool paused;
    {
      std::unique_lock<std::mutex> l(mu);
      paused = WaitPhase(cv, l, [&] { return phase == 1; }, "the reader to pause after loading slot 2");
    }
    // (No ASSERT before the join: the reader may be waiting in the hook.)
    const Status is = idx->Insert("k15", val(15));  // shifts k20, k30, k40 right
    {
      std::lock_guard<std::mutex> l(mu);
      phase = 2;
      cv.notify_all();
    }
    r.join();
    internal::fastfair::SetTestHooks(idx.get(), nullptr);
    const std::string t = vk == ValueKind::kU64 ? "u64 values" : "byte values";
    ASSERT_TRUE(is.ok()) << t << ": " << is.ToString();
    EXPECT_TRUE(paused) << t << ": the reader never reached slot 2 of its forward scan";
    ASSERT_TRUE(fs.ok()) << t << ": Find(k30) during the insert of k15: " << fs.ToString();
    EXPECT_EQ(v, val(30)) << t;
    EXPECT_TRUE(idx->Check().ok()) << t;
  }
}

}  // namespace
