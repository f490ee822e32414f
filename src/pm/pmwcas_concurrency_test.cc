// pmwcas_concurrency_test: PMwCAS under threads (labelled concurrency: runs
// under TSan in CI).
//  * Stress: writers run random k-word transfers (k = 1..8) over 8 shared
//    words (some in one cache line) whose sum is constant; a torn or lost
//    operation changes the sum. Read-only 8-word operations (expected ==
//    desired) that succeed saw a consistent snapshot: its sum is checked.
//    Writers also replace blocks held by 2 pointer words (fresh block,
//    old one freed on success after the grace period) while readers, under a
//    PMwCAS::Guard, check that a block they reached still holds its own
//    offset (a block freed too early and reused would not).
//    At the end: the sum, no leak (allocated == owned), no descriptor in use.
//  * Helping, made deterministic by stalling the owner (an observer blocks it
//    right after it installed its descriptor or an RDCSS pointer): a Read
//    and a conflicting operation finish the stalled operation; a Read that
//    finds a descriptor pointer flushes that word before anything else.
//  * No pointer to a descriptor outlives its operation: test hooks stop a
//    helper between reading the status as undecided and its RDCSS CAS, and
//    the owner just before deciding failed; when the owner's Execute
//    returns, no target word points to its descriptor.
//  * The committing thread flushes the status it stored even when another
//    thread helped it to the end meanwhile.
//  * Per-thread descriptor caches: short-lived threads hand their caches
//    back (every descriptor accounted for afterwards), and a thread that
//    runs short steals from an idle thread's cache.
//  * History: 3 threads x 3 operations over 3 words with small values,
//    recorded with invocation/response stamps; a brute-force search must find
//    a linearization (Wing & Gong) for every round.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "pm/layout.h"
#include "pm/pmwcas_internal.h"
#include "pm/pmwcas_test_util.h"

namespace pmindex::pm {
namespace {

using pmwcas_test::TestPool;

constexpr int kWords = 8;
constexpr size_t kWord[kWords] = {0, 1, 2, 9, 17, 25, 33, 41};
constexpr size_t kPtr[2] = {50, 58};
constexpr uint64_t kInitial = 1 << 20;
constexpr size_t kBlockWords = 8;

TEST(PmwcasConcurrency, SumIsConstantAndBlocksOutliveReaders) {
  TestPool t("stress", 64, PMwCAS::kDefaultMaxWords, 8 << 20);  // a run of 64-byte blocks per thread
  PMwCAS* pm = t.pm();
  for (int i = 0; i < kWords; i++) t.Set(kWord[i], kInitial);
  auto fill = [&](void* b) {
    const uint64_t off = t.pool->OffsetOf(b);
    for (size_t i = 0; i < kBlockWords; i++) StoreAtomic(static_cast<uint64_t*>(b) + i, off);
    Persist(b, kBlockWords * 8);
  };
  for (size_t p : kPtr) {
    ASSERT_TRUE(t.pool->allocator().Allocate(&t.words[p], kBlockWords * 8).ok());
    fill(t.pool->At<void>(t.words[p]));
  }
  const int kThreads = 4;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  std::atomic<uint64_t> committed{0}, failed{0}, snapshots{0}, block_checks{0};
  std::atomic<bool> bad_snapshot{false}, bad_block{false}, error{false};
  std::vector<std::thread> th;
  for (int tid = 0; tid < kThreads; tid++) {
    th.emplace_back([&, tid] {
      std::mt19937_64 rng(tid * 7919 + 1);
      for (int n = 0; n < 20000 && std::chrono::steady_clock::now() < deadline; n++) {
        const int kind = int(rng() % 8);
        if (kind == 0) {  // snapshot
          PMwCAS::Op op;
          if (!pm->Begin(&op).ok()) { error = true; return; }
          uint64_t sum = 0;
          for (int i = 0; i < kWords; i++) {
            const uint64_t v = pm->Read(&t.words[kWord[i]]);
            sum += v;
            op.AddWord(&t.words[kWord[i]], v, v);
          }
          bool ok = false;
          if (!op.Execute(&ok).ok()) { error = true; return; }
          if (ok) {
            snapshots++;
            if (sum != kInitial * kWords) bad_snapshot = true;
          }
          continue;
        }
        if (kind == 1) {  // reader of blocks
          PMwCAS::Guard g(*pm);
          const uint64_t off = pm->Read(&t.words[kPtr[rng() % 2]]);
          const uint64_t* b = t.pool->At<uint64_t>(off);
          for (size_t i = 0; i < kBlockWords; i++)
            if (__atomic_load_n(&b[i], __ATOMIC_ACQUIRE) != off) bad_block = true;
          block_checks++;
          continue;
        }
        PMwCAS::Op op;
        if (!pm->Begin(&op).ok()) { error = true; return; }
        const int k = 1 + int(rng() % kWords);
        int idx[kWords];
        std::iota(idx, idx + kWords, 0);
        std::shuffle(idx, idx + kWords, rng);
        int64_t rest = 0;
        for (int j = 0; j < k; j++) {
          const int64_t delta = j + 1 < k ? int64_t(rng() % 21) - 10 : -rest;
          rest += delta;
          const uint64_t v = pm->Read(&t.words[kWord[idx[j]]]);
          op.AddWord(&t.words[kWord[idx[j]]], v, uint64_t(int64_t(v) + delta));
        }
        if (kind == 2) {
          const size_t p = kPtr[rng() % 2];
          void* blk = nullptr;
          if (Status st = op.AddAllocation(&t.words[p], pm->Read(&t.words[p]), kBlockWords * 8, &blk,
                                           Recycle::kFreeOldOnSuccessNewOnFailure);
              !st.ok()) {
            ADD_FAILURE() << "allocation: " << st.ToString();
            error = true;
            return;
          }
          fill(blk);
        }
        bool ok = false;
        if (Status st = op.Execute(&ok); !st.ok()) {
          ADD_FAILURE() << "execute: " << st.ToString();
          error = true;
          return;
        }
        (ok ? committed : failed)++;
      }
    });
  }
  for (auto& x : th) x.join();
  EXPECT_FALSE(error);
  EXPECT_FALSE(bad_snapshot);
  EXPECT_FALSE(bad_block);
  EXPECT_GT(committed.load(), 0u);
  uint64_t sum = 0;
  for (int i = 0; i < kWords; i++) {
    EXPECT_TRUE(pmwcas::IsValue(t.words[kWord[i]]));
    sum += pm->Read(&t.words[kWord[i]]);
  }
  EXPECT_EQ(sum, kInitial * kWords);
  pm->Reclaim();
  EXPECT_EQ(pm->DescriptorsInUse(), 0u);
  std::set<uint64_t> want = {*t.pool->root_slot()}, have;
  for (size_t p : kPtr) want.insert(pm->Read(&t.words[p]));
  t.pool->allocator().ForEachAllocated([&](uint64_t off, size_t) { have.insert(off); });
  EXPECT_EQ(want, have);
  std::printf("committed %llu failed %llu snapshots %llu block checks %llu\n", (unsigned long long)committed.load(),
              (unsigned long long)failed.load(), (unsigned long long)snapshots.load(),
              (unsigned long long)block_checks.load());
}

// ---- helping, deterministic ---------------------------------------------------

// Stops the owner thread right after it stores a value with `bit` into
// `word` (a descriptor pointer, or an RDCSS pointer), until released.
class PauseOwner : public Observer {
 public:
  PauseOwner(const uint64_t* word, uint64_t bit) : word_(word), bit_(bit) {}
  std::thread::id owner;           // set before `armed`
  std::atomic<bool> armed{false};
  std::atomic<int> state{0};  // 0 armed, 1 paused, 2 released
  void OnStore(const void* a, size_t) override {
    if (!armed.load(std::memory_order_acquire)) return;
    if (std::this_thread::get_id() != owner || a != word_ || state.load() != 0) return;
    if (!(__atomic_load_n(word_, __ATOMIC_ACQUIRE) & bit_)) return;
    state = 1;
    while (state.load() != 2) std::this_thread::yield();
  }
  void OnNonTemporalStore(const void*, size_t) override {}
  void OnFlush(const void*) override {}
  void OnFence() override {}
  void OnLoad(const void*, size_t) override {}

 private:
  const uint64_t* word_;
  uint64_t bit_;
};

// The owner stalls with its descriptor (or an RDCSS) installed in the first
// word; another thread's Read, or a conflicting operation, must finish it.
void StalledOwner(uint64_t bit, bool conflicting_op) {
  TestPool t("stall");
  PMwCAS* pm = t.pm();
  t.Set(0, 10);
  t.Set(8, 20);
  PauseOwner pause(&t.words[0], bit);
  SetObserver(&pause);
  bool owner_ok = false;
  std::thread a([&] {
    pause.owner = std::this_thread::get_id();
    pause.armed.store(true, std::memory_order_release);
    PMwCAS::Op op;
    ASSERT_TRUE(pm->Begin(&op).ok());
    ASSERT_TRUE(op.AddWord(&t.words[0], 10, 11).ok());
    ASSERT_TRUE(op.AddWord(&t.words[8], 20, 21).ok());
    ASSERT_TRUE(op.Execute(&owner_ok).ok());
  });
  while (pause.state.load() != 1) std::this_thread::yield();
  EXPECT_TRUE(t.words[0] & bit);  // stalled mid-operation
  if (conflicting_op) {
    // Expects the old values: it helps the stalled operation first, which
    // succeeds, so this one fails.
    PMwCAS::Op op;
    ASSERT_TRUE(pm->Begin(&op).ok());
    ASSERT_TRUE(op.AddWord(&t.words[0], 10, 30).ok());
    ASSERT_TRUE(op.AddWord(&t.words[8], 20, 40).ok());
    bool ok = true;
    ASSERT_TRUE(op.Execute(&ok).ok());
    EXPECT_FALSE(ok);
  }
  EXPECT_EQ(pm->Read(&t.words[0]), 11u);  // helped to the end
  EXPECT_EQ(pm->Read(&t.words[8]), 21u);
  pause.state = 2;
  a.join();
  SetObserver(nullptr);
  EXPECT_TRUE(owner_ok);
  EXPECT_EQ(t.words[0], 11u);
  EXPECT_EQ(t.words[8], 21u);
  pm->Reclaim();
  EXPECT_EQ(pm->DescriptorsInUse(), 0u);
}

TEST(PmwcasConcurrency, ReadHelpsAStalledDescriptor) { StalledOwner(pmwcas::kDescriptorBit, false); }
TEST(PmwcasConcurrency, ReadCompletesAStalledRdcss) { StalledOwner(pmwcas::kRdcssBit, false); }
TEST(PmwcasConcurrency, ConflictingOperationHelpsFirst) { StalledOwner(pmwcas::kDescriptorBit, true); }

// A Read that finds a descriptor pointer persists that word before anything
// the help persists (flush-on-read for pointers: pmcheck's erratum rule).
// The owner stalls with its descriptor installed in both words; the reader
// reads the second one, whose line the help would otherwise flush second.
class FirstFlush : public PauseOwner {
 public:
  using PauseOwner::PauseOwner;
  std::atomic<std::thread::id> reader{};
  std::atomic<uintptr_t> first{0};
  void OnFlush(const void* l) override {
    if (reader.load() != std::this_thread::get_id()) return;
    uintptr_t none = 0;
    first.compare_exchange_strong(none, reinterpret_cast<uintptr_t>(l));
  }
};

TEST(PmwcasConcurrency, ReadPersistsAPointerWordBeforeHelping) {
  TestPool t("ptrread");
  PMwCAS* pm = t.pm();
  t.Set(0, 10);
  t.Set(8, 20);
  FirstFlush watch(&t.words[8], pmwcas::kDescriptorBit);
  SetObserver(&watch);
  bool owner_ok = false;
  std::thread a([&] {
    watch.owner = std::this_thread::get_id();
    watch.armed.store(true, std::memory_order_release);
    PMwCAS::Op op;
    ASSERT_TRUE(pm->Begin(&op).ok());
    ASSERT_TRUE(op.AddWord(&t.words[0], 10, 11).ok());
    ASSERT_TRUE(op.AddWord(&t.words[8], 20, 21).ok());
    ASSERT_TRUE(op.Execute(&owner_ok).ok());
  });
  while (watch.state.load() != 1) std::this_thread::yield();
  watch.reader = std::this_thread::get_id();
  EXPECT_EQ(pm->Read(&t.words[8]), 21u);
  watch.reader = std::thread::id();
  watch.state = 2;
  a.join();
  SetObserver(nullptr);
  EXPECT_TRUE(owner_ok);
  EXPECT_EQ(watch.first.load(), reinterpret_cast<uintptr_t>(&t.words[8]));
  pm->Reclaim();
  EXPECT_EQ(pm->DescriptorsInUse(), 0u);
}

// ---- no pointer to a descriptor outlives its operation -----------------------

// Stops one thread at a PMwCAS test point (pmwcas_internal.h) until released.
struct HookStop {
  std::atomic<std::thread::id> thread{};
  pmwcas_hooks::Point point = pmwcas_hooks::Point::kDecidingFailed;
  const uint64_t* word = nullptr;  // null: any word
  std::atomic<int> state{0};       // 0 armed, 1 stopped, 2 released
};
HookStop g_stops[2];

void StopAtPoint(pmwcas_hooks::Point p, const uint64_t* w) {
  for (HookStop& s : g_stops) {
    if (s.thread.load() != std::this_thread::get_id() || s.point != p || (s.word && s.word != w)) continue;
    int armed = 0;
    if (!s.state.compare_exchange_strong(armed, 1)) continue;
    while (s.state.load() != 2) std::this_thread::yield();
  }
}

void WaitStopped(const HookStop& s) {
  while (s.state.load() != 1) std::this_thread::yield();
}

// The interleaving that let a descriptor pointer appear in a word after its
// operation was over (and its descriptor retired), where a thread whose
// guard began later could reach the descriptor after it was recycled:
//  1. the owner of {a: 0->1, b: 5->6, c: 0->1} installs a, finds b = 7 and
//     stops just before deciding failed;
//  2. b becomes 5 (another operation); a helper, reading a, helps: it
//     installs b, installs an RDCSS pointer in c, reads the status as
//     undecided and stops before its CAS to the descriptor pointer;
//  3. the owner decides failed and finishes: Execute returns.
// No target word may then hold a pointer to the owner's descriptor: the
// owner takes the helper's RDCSS pointer back, and the helper's late CAS
// fails.
TEST(PmwcasConcurrency, NoPointerToADescriptorOutlivesItsOperation) {
  TestPool t("late");
  PMwCAS* pm = t.pm();
  uint64_t* a = &t.words[0];
  uint64_t* b = &t.words[8];
  uint64_t* c = &t.words[16];
  t.Set(8, 7);
  g_stops[0].point = pmwcas_hooks::Point::kDecidingFailed;
  g_stops[0].word = nullptr;
  g_stops[0].state = 0;
  g_stops[1].point = pmwcas_hooks::Point::kRdcssSawUndecided;
  g_stops[1].word = c;
  g_stops[1].state = 0;
  pmwcas_hooks::g_hook.store(&StopAtPoint);
  bool owner_ok = true;
  std::thread owner([&] {
    g_stops[0].thread = std::this_thread::get_id();
    PMwCAS::Op op;
    ASSERT_TRUE(pm->Begin(&op).ok());
    ASSERT_TRUE(op.AddWord(a, 0, 1).ok());
    ASSERT_TRUE(op.AddWord(b, 5, 6).ok());
    ASSERT_TRUE(op.AddWord(c, 0, 1).ok());
    ASSERT_TRUE(op.Execute(&owner_ok).ok());
  });
  WaitStopped(g_stops[0]);
  EXPECT_TRUE(__atomic_load_n(a, __ATOMIC_ACQUIRE) & pmwcas::kDescriptorBit);
  {
    PMwCAS::Op op;
    ASSERT_TRUE(pm->Begin(&op).ok());
    ASSERT_TRUE(op.AddWord(b, 7, 5).ok());
    bool ok = false;
    ASSERT_TRUE(op.Execute(&ok).ok());
    EXPECT_TRUE(ok);
  }
  uint64_t helper_read = 99;
  std::thread helper([&] {
    g_stops[1].thread = std::this_thread::get_id();
    helper_read = pm->Read(a);
  });
  WaitStopped(g_stops[1]);
  EXPECT_TRUE(__atomic_load_n(c, __ATOMIC_ACQUIRE) & pmwcas::kRdcssBit);
  g_stops[0].state = 2;
  owner.join();
  EXPECT_FALSE(owner_ok);
  for (const uint64_t* w : {a, b, c})
    EXPECT_EQ(__atomic_load_n(w, __ATOMIC_ACQUIRE) & (pmwcas::kDescriptorBit | pmwcas::kRdcssBit), 0u)
        << "word " << (w - t.words) << " still points to the finished operation's descriptor";
  g_stops[1].state = 2;
  helper.join();
  pmwcas_hooks::g_hook.store(nullptr);
  for (HookStop& s : g_stops) s.thread = std::thread::id();
  EXPECT_EQ(helper_read, 0u);
  EXPECT_EQ(pm->Read(a), 0u);
  EXPECT_EQ(pm->Read(b), 5u);
  EXPECT_EQ(pm->Read(c), 0u);
  for (const uint64_t* w : {a, b, c}) EXPECT_TRUE(pmwcas::IsValue(*w));
  pm->Reclaim();
  EXPECT_EQ(pm->DescriptorsInUse(), 0u);
}

// ---- the committing thread persists its commit itself --------------------------

// Stops the owner right after its CAS stored succeeded|dirty in a status
// word, then counts the owner's flushes of that line.
class CommitWatch : public Observer {
 public:
  explicit CommitWatch(const Pool* pool) : base_(pool->base()) {}
  std::atomic<std::thread::id> owner{};
  std::atomic<int> state{0};  // 0 armed, 1 stopped, 2 released
  std::atomic<int> owner_status_flushes{0};
  void OnStore(const void* a, size_t size) override {
    if (owner.load() != std::this_thread::get_id() || state.load() != 0 || size != 8) return;
    const uint64_t off = uint64_t(static_cast<const char*>(a) - base_);
    if (off < layout::kPmwcasRegionOffset || off >= layout::kHeapOffset) return;
    if (__atomic_load_n(static_cast<const uint64_t*>(a), __ATOMIC_ACQUIRE) != (pmwcas_format::kSucceeded | pmwcas::kDirtyBit))
      return;
    line_ = reinterpret_cast<uintptr_t>(a) & ~uintptr_t(kCacheLine - 1);
    state = 1;
    while (state.load() != 2) std::this_thread::yield();
  }
  void OnFlush(const void* l) override {
    if (owner.load() == std::this_thread::get_id() && state.load() == 2 && reinterpret_cast<uintptr_t>(l) == line_)
      owner_status_flushes++;
  }
  void OnNonTemporalStore(const void*, size_t) override {}
  void OnFence() override {}
  void OnLoad(const void*, size_t) override {}

 private:
  const char* base_;
  uintptr_t line_ = 0;  // written by the owner before state = 1
};

// Another thread helps the stopped owner to the end, persisting and
// cleaning the status on the way; the owner, resumed, still flushes the
// status it stored before it finalizes (its commit's durability does not
// rest on a flush by a thread that only saw the value).
TEST(PmwcasConcurrency, CommittingThreadPersistsItsOwnCommit) {
  TestPool t("commit");
  PMwCAS* pm = t.pm();
  CommitWatch watch(t.pool.get());
  SetObserver(&watch);
  bool owner_ok = false;
  std::thread owner([&] {
    watch.owner = std::this_thread::get_id();
    PMwCAS::Op op;
    ASSERT_TRUE(pm->Begin(&op).ok());
    ASSERT_TRUE(op.AddWord(&t.words[0], 0, 1).ok());
    ASSERT_TRUE(op.Execute(&owner_ok).ok());
  });
  while (watch.state.load() != 1) std::this_thread::yield();
  EXPECT_EQ(pm->Read(&t.words[0]), 1u);  // helped: status persisted and cleaned, word finalized
  watch.state = 2;
  owner.join();
  SetObserver(nullptr);
  EXPECT_TRUE(owner_ok);
  EXPECT_GE(watch.owner_status_flushes.load(), 1);
  pm->Reclaim();
  EXPECT_EQ(pm->DescriptorsInUse(), 0u);
}

// ---- per-thread descriptor caches --------------------------------------------

// One k-word transfer over words[0, n) (sum constant); false on an error.
bool Transfer(PMwCAS* pm, uint64_t* words, int n, std::mt19937_64& rng) {
  PMwCAS::Op op;
  if (!pm->Begin(&op).ok()) return false;
  const int k = 1 + int(rng() % 4);
  int idx[16];
  std::iota(idx, idx + n, 0);
  std::shuffle(idx, idx + n, rng);
  int64_t rest = 0;
  for (int j = 0; j < k; j++) {
    const int64_t delta = j + 1 < k ? int64_t(rng() % 21) - 10 : -rest;
    rest += delta;
    const uint64_t v = pm->Read(&words[idx[j]]);
    op.AddWord(&words[idx[j]], v, uint64_t(int64_t(v) + delta));
  }
  bool ok = false;
  return op.Execute(&ok).ok();
}

// Waves of threads that each run a few dozen operations (some abandoned)
// and exit. Each exit hands the thread's cache back: afterwards no cache is
// bound or holds a descriptor, the caches were reused (not one per thread),
// and every descriptor is free again. In the first wave a guard held by
// this thread keeps every retired descriptor back, so the exiting threads
// hand back retired descriptors too.
TEST(PmwcasConcurrency, ShortLivedThreadsHandBackTheirDescriptors) {
  TestPool t("shortlived");
  PMwCAS* pm = t.pm();
  constexpr int kN = 16, kWaves = 25, kPerWave = 4, kOps = 40;
  for (int i = 0; i < kN; i++) t.Set(i, kInitial);
  std::atomic<bool> error{false};
  for (int wave = 0; wave < kWaves; wave++) {
    std::optional<PMwCAS::Guard> hold;
    if (wave == 0) hold.emplace(*pm);
    std::vector<std::thread> th;
    for (int j = 0; j < kPerWave; j++)
      th.emplace_back([&, wave, j] {
        std::mt19937_64 rng(uint64_t(wave) * 101 + uint64_t(j));
        for (int n = 0; n < kOps; n++) {
          if (n % 7 == 3) {
            PMwCAS::Op op;  // abandoned by its destructor
            if (!pm->Begin(&op).ok() || !op.AddWord(&t.words[0], 1, 2).ok()) error = true;
            continue;
          }
          if (!Transfer(pm, t.words, kN, rng)) error = true;
        }
      });
    for (auto& x : th) x.join();
    if (wave == 0) {
      EXPECT_GT(pm->DescriptorsInUse(), 0u);  // retired, held back by `hold`
    }
  }
  EXPECT_FALSE(error);
  const PMwCAS::CacheStats cs = pm->cache_stats();
  EXPECT_EQ(cs.bound, 0u);
  EXPECT_EQ(cs.cached, 0u);
  EXPECT_GE(cs.caches, 1u);
  EXPECT_LE(cs.caches, uint32_t(kPerWave));
  pm->Reclaim();
  EXPECT_EQ(pm->DescriptorsInUse(), 0u);
  uint64_t sum = 0;
  for (int i = 0; i < kN; i++) sum += pm->Read(&t.words[i]);
  EXPECT_EQ(sum, kInitial * kN);
}

// A thread holds a cache (free and retired descriptors) and stays idle
// while another thread takes every descriptor of the region: the starved
// thread steals from the idle cache and gets all of them. With every
// descriptor in preparation, Begin reports Busy after its bounded search
// (the documented limit). Afterwards both threads run on.
TEST(PmwcasConcurrency, StarvedThreadStealsFromAnIdleCache) {
  TestPool t("starve", 64, PMwCAS::kMaxMaxWords);  // the smallest region: 91 descriptors
  PMwCAS* pm = t.pm();
  const uint32_t n = pm->descriptor_count();
  for (int i = 0; i < 4; i++) t.Set(i, kInitial);
  std::atomic<int> phase{0};
  std::atomic<bool> error{false};
  std::thread idle([&] {
    std::mt19937_64 rng(7);
    for (int i = 0; i < 23; i++)
      if (!Transfer(pm, t.words, 4, rng)) error = true;
    phase = 1;
    while (phase.load() != 2) std::this_thread::yield();
    for (int i = 0; i < 23; i++)
      if (!Transfer(pm, t.words, 4, rng)) error = true;
  });
  while (phase.load() != 1) std::this_thread::yield();
  EXPECT_GT(pm->cache_stats().cached, 0u);  // the idle thread holds descriptors
  {
    std::vector<PMwCAS::Op> ops(n);
    for (uint32_t i = 0; i < n; i++) ASSERT_TRUE(pm->Begin(&ops[i]).ok()) << i << " of " << n;
    EXPECT_GT(pm->cache_stats().steals, 0u);
    EXPECT_EQ(pm->DescriptorsInUse(), n);
    PMwCAS::Op extra;
    EXPECT_TRUE(pm->Begin(&extra).IsBusy());
  }  // every Op abandoned
  phase = 2;
  idle.join();
  EXPECT_FALSE(error);
  pm->Reclaim();
  EXPECT_EQ(pm->DescriptorsInUse(), 0u);
  uint64_t sum = 0;
  for (int i = 0; i < 4; i++) sum += pm->Read(&t.words[i]);
  EXPECT_EQ(sum, kInitial * 4);
}

// ---- history check ----------------------------------------------------------

struct HOp {
  int n = 0;
  size_t word[3];
  uint64_t expected[3], desired[3];
  uint64_t inv = 0, resp = 0;
  bool ok = false;
};

TEST(PmwcasConcurrency, SmallHistoriesAreLinearizable) {
  TestPool t("history");
  PMwCAS* pm = t.pm();
  std::atomic<uint64_t> clock{1};
  int ok_rounds = 0, successes = 0;
  for (int round = 0; round < 150; round++) {
    for (int i = 0; i < 3; i++) t.Set(i * 4, 0);
    std::vector<HOp> ops(9);
    std::vector<std::thread> th;
    for (int tid = 0; tid < 3; tid++) {
      th.emplace_back([&, tid] {
        std::mt19937_64 rng(round * 31 + tid);
        for (int j = 0; j < 3; j++) {
          HOp& o = ops[tid * 3 + j];
          o.n = 1 + int(rng() % 3);
          int w[3] = {0, 1, 2};
          std::shuffle(w, w + 3, rng);
          PMwCAS::Op op;
          if (!pm->Begin(&op).ok()) return;
          o.inv = clock.fetch_add(1);
          for (int i = 0; i < o.n; i++) {
            o.word[i] = size_t(w[i]);
            // Mostly the value read (likely to succeed), sometimes a guess.
            o.expected[i] = rng() % 3 ? pm->Read(&t.words[w[i] * 4]) : rng() % 3;
            o.desired[i] = rng() % 4;
            op.AddWord(&t.words[w[i] * 4], o.expected[i], o.desired[i]);
          }
          op.Execute(&o.ok);
          o.resp = clock.fetch_add(1);
        }
      });
    }
    for (auto& x : th) x.join();
    uint64_t final_state[3];
    for (int i = 0; i < 3; i++) final_state[i] = pm->Read(&t.words[i * 4]);
    // Search the orders that respect real time, whose outcomes match the
    // sequential specification and that end in the final state.
    std::vector<bool> done(ops.size(), false);
    uint64_t state[3] = {0, 0, 0};
    bool found = false;
    std::function<bool(size_t)> search;
    search = [&](size_t left) -> bool {
      if (left == 0) return std::equal(state, state + 3, final_state);
      for (size_t i = 0; i < ops.size(); i++) {
        if (done[i]) continue;
        bool minimal = true;
        for (size_t j = 0; j < ops.size() && minimal; j++)
          if (!done[j] && j != i && ops[j].resp < ops[i].inv) minimal = false;
        if (!minimal) continue;
        const HOp& o = ops[i];
        bool match = true;
        for (int w = 0; w < o.n; w++) match = match && state[o.word[w]] == o.expected[w];
        if (match != o.ok) continue;
        uint64_t saved[3] = {state[0], state[1], state[2]};
        if (match)
          for (int w = 0; w < o.n; w++) state[o.word[w]] = o.desired[w];
        done[i] = true;
        if (search(left - 1)) return true;
        done[i] = false;
        std::copy(saved, saved + 3, state);
      }
      return false;
    };
    found = search(ops.size());
    EXPECT_TRUE(found) << "round " << round << ": no linearization";
    if (!found) break;
    ok_rounds++;
    for (auto& o : ops) successes += o.ok;
  }
  EXPECT_EQ(ok_rounds, 150);
  EXPECT_GT(successes, 150);
  pm->Reclaim();
  EXPECT_EQ(pm->DescriptorsInUse(), 0u);
}

}  // namespace
}  // namespace pmindex::pm
