// pmcheck with several threads (labelled "concurrency": CI also runs it under
// TSan): crash images taken while 2+ threads mutate the index, and the
// recorder's lint rules exercised directly, including the NVC-Hashmap
// erratum pattern (acting on another thread's unflushed line).
#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <set>
#include <thread>

#include "pmcheck.h"
#include "pmindex/pm/persist.h"
#include "recorder.h"
#include "scheduler.h"

namespace pmcheck {
namespace {

namespace pm = pmindex::pm;

bool Long() { return std::getenv("PMINDEX_LONG") != nullptr; }

TEST(PmcheckThreads, ToyWithTwoThreadsHasNoFailures) {
  Config c;
  c.index = "pmcheck_toy";
  c.threads = 2;
  c.ops = Long() ? 400 : 100;
  c.points = Long() ? -1 : 300;
  c.lint = true;
  Report r;
  ASSERT_TRUE(pmcheck::Run(c, &r).ok());
  EXPECT_EQ(r.total_failures(), 0u) << FormatReport(c, r);
  EXPECT_EQ(r.ops_recorded, 1u + 2 * c.ops);
}

TEST(PmcheckThreads, DroppedFlushCaughtWithTwoThreads) {
  Config c;
  c.index = "pmcheck_toy";
  c.threads = 2;
  c.ops = 100;
  c.points = 300;
  c.faults = {"pmcheck_toy.insert.skip_kv_flush"};
  Report r;
  ASSERT_TRUE(pmcheck::Run(c, &r).ok());
  EXPECT_GT(r.total_failures(), 0u) << FormatReport(c, r);
}

// The read rule with shared keys: the faulty toy update releases its lock
// between storing a value and persisting it, so another thread's Find can
// return the value while a crash may still lose it. Nothing else reports
// this (the writer's op is in flight, so its old value is allowed): with the
// read rule off the same run is clean.
TEST(PmcheckThreads, ReadRuleCatchesAReadOfAnUndurableValue) {
  Config c;
  c.index = "pmcheck_toy";
  c.threads = 2;
  c.ops = 150;
  c.keys = 6;
  c.shared_keys = true;
  c.points = -1;
  c.images_per_point = 1;
  c.faults = {"pmcheck_toy.update.unlock_before_persist"};
  // The threads interleave differently per run: give the read a few runs.
  Report r;
  for (uint64_t seed = 1; seed <= 5 && r.counts[size_t(FailKind::kLostRead)] == 0; ++seed) {
    c.seed = seed;
    r = Report();
    ASSERT_TRUE(pmcheck::Run(c, &r).ok());
  }
  EXPECT_GT(r.reads_inflight, 0u) << FormatReport(c, r);
  EXPECT_GT(r.counts[size_t(FailKind::kLostRead)], 0u) << FormatReport(c, r);

  c.read_rule = false;
  Report off;
  ASSERT_TRUE(pmcheck::Run(c, &off).ok());
  EXPECT_EQ(off.total_failures(), 0u) << FormatReport(c, off);
}

TEST(PmcheckThreads, SharedKeysOnTheCorrectToyFindNothing) {
  Config c;
  c.index = "pmcheck_toy";
  c.threads = 2;
  c.ops = 120;
  c.keys = 8;
  c.shared_keys = true;
  c.points = 400;
  c.lint = true;
  Report r;
  ASSERT_TRUE(pmcheck::Run(c, &r).ok());
  EXPECT_GT(r.reads_observed, 0u);
  EXPECT_EQ(r.total_failures(), 0u) << FormatReport(c, r);
}

// Shared writes (--shared-writes): both threads write four keys no thread
// owns. The faulty toy update never flushes its value, so a completed
// update of such a key is lost by a crash; only the shared-write check
// judges those keys (they have no owner whose history says what is
// committed), so a failure naming one proves it runs. The correct toy gives
// none, free-running or under PCT schedules (which overlap the writes).
TEST(PmcheckThreads, SharedWritesCatchALostUpdateOfAKeyEveryThreadWrites) {
  Config c;
  c.index = "pmcheck_toy";
  c.threads = 2;
  c.ops = 150;
  c.keys = 6;
  c.shared_keys = c.shared_writes = true;
  c.image_budget = 600;
  c.faults = {"pmcheck_toy.update.skip_flush"};
  auto shared_failure = [](const Report& r) {
    for (const Failure& f : r.failures)
      if (f.what.find("shared-write key") != std::string::npos) return true;
    return false;
  };
  Report r;
  for (uint64_t seed = 1; seed <= 6 && !shared_failure(r); ++seed) {
    c.seed = seed;
    r = Report();
    ASSERT_TRUE(pmcheck::Run(c, &r).ok());
  }
  EXPECT_GT(r.shared_writes, 0u);
  EXPECT_TRUE(shared_failure(r)) << FormatReport(c, r);
  EXPECT_NE(FormatReport(c, r).find("--shared-writes"), std::string::npos);  // in the reproducer

  c.faults.clear();
  for (int pct : {-1, 3}) {
    c.pct = pct;
    c.seed = 1;
    Report clean;
    ASSERT_TRUE(pmcheck::Run(c, &clean).ok());
    EXPECT_GT(clean.shared_writes, 0u);
    EXPECT_EQ(clean.total_failures(), 0u) << FormatReport(c, clean);
  }
}

// PCT scheduling (--pct): a schedule seed names one interleaving. The
// PMwCAS target is lock-free (no thread blocks outside the primitives, so
// no stall makes a schedule depend on timing): the same seed records the
// same sequence of threads twice, and different seeds record different ones.
Config PctConfig(uint64_t schedule_seed) {
  Config c;
  c.index = "pmwcas";
  c.threads = 2;
  c.ops = 60;
  c.keys = 16;
  c.points = 0;
  c.lint = true;
  c.pct = 4;
  c.schedule_seed = schedule_seed;
  return c;
}

TEST(PmcheckSchedule, ASeedReplaysItsSchedule) {
  Report a, b;
  ASSERT_TRUE(pmcheck::Run(PctConfig(7), &a).ok());
  ASSERT_TRUE(pmcheck::Run(PctConfig(7), &b).ok());
  EXPECT_EQ(a.total_failures(), 0u) << FormatReport(PctConfig(7), a);
  ASSERT_EQ(a.schedules_run, 1u);
  EXPECT_GT(a.schedule_switches, 0u) << FormatReport(PctConfig(7), a);
  if (a.schedule_stalls == 0 && b.schedule_stalls == 0) {
    EXPECT_EQ(a.schedule_hash, b.schedule_hash);
    EXPECT_EQ(a.events, b.events);
  }
  std::set<uint64_t> hashes;
  for (uint64_t s = 1; s <= 4; ++s) {
    Report r;
    ASSERT_TRUE(pmcheck::Run(PctConfig(s), &r).ok());
    EXPECT_EQ(r.total_failures(), 0u) << FormatReport(PctConfig(s), r);
    hashes.insert(r.schedule_hash);
  }
  EXPECT_GE(hashes.size(), 3u);
}

// --schedules N records N schedules of one workload; a failure's reproducer
// names the schedule that showed it. The toy's dropped flush is found.
TEST(PmcheckSchedule, SeveralSchedulesShareTheBudgetAndReproducersNameTheirs) {
  Config c;
  c.index = "pmcheck_toy";
  c.threads = 2;
  c.ops = 40;
  c.points = 80;
  c.pct = 3;
  c.schedules = 4;
  c.faults = {"pmcheck_toy.insert.skip_kv_flush"};
  Report r;
  ASSERT_TRUE(pmcheck::Run(c, &r).ok());
  EXPECT_EQ(r.schedules_run, 4u);
  ASSERT_GT(r.total_failures(), 0u) << FormatReport(c, r);
  const std::string repro = Reproducer(c, r.failures[0]);
  EXPECT_NE(repro.find("--pct 3 --schedule-seed "), std::string::npos) << repro;
}

// Stores that bypass the primitives in a multi-threaded run: under a PCT
// schedule the flushed line is compared with the shadow at every flush (as
// in single-threaded runs); without it only the end of the run compares.
TEST(PmcheckSchedule, UnloggedStoreFoundAtAFlushWithTwoThreads) {
  Config c;
  c.index = "pmcheck_toy";
  c.threads = 2;
  c.ops = 60;
  c.points = 0;
  c.pct = 3;
  c.faults = {"pmcheck_toy.insert.unlogged_store"};
  auto at_flush = [](const Report& r) {
    for (const Failure& f : r.failures)
      if (f.kind == FailKind::kUnloggedStore && f.what.find("at a flush") != std::string::npos) return true;
    return false;
  };
  Report r;
  ASSERT_TRUE(pmcheck::Run(c, &r).ok());
  EXPECT_TRUE(at_flush(r)) << FormatReport(c, r);
  c.pct = -1;
  Report off;
  ASSERT_TRUE(pmcheck::Run(c, &off).ok());
  EXPECT_FALSE(at_flush(off)) << FormatReport(c, off);
}

// Change points are drawn over the run's ops, so each one falls inside the
// run whatever an index's points per op: FPTree with u64 keys makes about
// 6 points per op, and change points drawn over an estimate of 32 per op
// (before session 18) were mostly past the end of the run; now every
// schedule reaches its 4.
TEST(PmcheckSchedule, EveryChangePointFallsInsideTheRun) {
  Config c;
  c.index = "fptree";
  c.params = {{"leaf_size", "8"}};
  c.threads = 2;
  c.ops = 100;
  c.points = 0;
  c.pct = 4;
  c.schedules = 5;
  Report r;
  ASSERT_TRUE(pmcheck::Run(c, &r).ok());
  EXPECT_EQ(r.schedules_run, 5u);
  EXPECT_EQ(r.schedule_changes, 20u) << FormatReport(c, r);
  EXPECT_GE(r.schedule_switches, 20u) << FormatReport(c, r);
  EXPECT_EQ(r.total_failures(), 0u) << FormatReport(c, r);
}

// The spin hook: wBTree's writers and readers wait for a locked node in a
// kit::Backoff loop, whose OnSpin call hands the token on at once under a
// PCT schedule. With --no-spin-hook the same waits end only by stalls
// (20 ms without a step), which make a schedule depend on timing.
TEST(PmcheckSchedule, BackoffWaitsHandTheTokenOnThroughTheSpinHook) {
  Config c;
  c.index = "wbtree";
  c.params = {{"leaf_size", "4"}, {"inner_size", "3"}};
  c.threads = 2;
  c.ops = 100;
  c.keys = 24;
  c.shared_keys = true;
  c.points = 0;
  c.pct = 4;
  c.schedules = 5;
  Report on;
  const pmindex::Status st = pmcheck::Run(c, &on);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(on.total_failures(), 0u) << FormatReport(c, on);
  EXPECT_GT(on.schedule_spins, 0u) << FormatReport(c, on);
  EXPECT_EQ(on.schedule_stalls, 0u) << FormatReport(c, on);
  c.spin_hook = false;
  Report off;
  ASSERT_TRUE(pmcheck::Run(c, &off).ok());
  EXPECT_GT(off.schedule_stalls, 0u) << FormatReport(c, off);
}

std::atomic<bool> g_in_handler{false};
void HoldThreadAway(int) {
  g_in_handler.store(true);
  timespec t{0, 200 * 1000 * 1000};
  nanosleep(&t, nullptr);
}

// A thread handed the token inside WaitTurn that does not win the
// scheduler's lock back for longer than a stall (here: held in a signal
// handler, on a loaded machine: descheduled) is at a scheduling point already.
// It must not be stalled: a stalled thread that is already waiting is never
// picked again, so once the holder finishes it waits forever.
TEST(PctSchedulerTest, AHolderStillWakingInWaitTurnIsNotStalled) {
  struct sigaction sa {}, old {};
  sa.sa_handler = HoldThreadAway;
  sigemptyset(&sa.sa_mask);
  ASSERT_EQ(sigaction(SIGUSR1, &sa, &old), 0);
  g_in_handler.store(false);
  PctScheduler s(2, 0, 1, 100);
  // This thread plays the first holder, a second thread the other one.
  const int h = s.holder(), o = 1 - h;
  ASSERT_TRUE(h == 0 || h == 1);
  std::atomic<bool> starting{false}, done{false};
  std::thread other([&] {
    starting.store(true);
    s.Start(o);
    s.Finish(o);
    done.store(true);
  });
  s.Start(h);
  // Let the other thread block in Start's wait, hold it in the handler, and
  // hand it the token. The holder steps meanwhile (no stall of its own).
  auto step_for = [&](int ms, const std::atomic<bool>& until) {
    for (int i = 0; i < ms && !until.load(); ++i) {
      s.Point(h, false);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  };
  const std::atomic<bool> never{false};
  step_for(1000, starting);
  step_for(50, never);
  ASSERT_EQ(pthread_kill(other.native_handle(), SIGUSR1), 0);
  step_for(2000, g_in_handler);
  s.Spin(h);
  s.Finish(h);
  bool finished = false;
  for (int i = 0; i < 5000 && !(finished = done.load()); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_TRUE(finished) << "the thread handed the token while waking never ran";
  // Unstick it (a point of its tid clears its mark) so that the test ends.
  if (!finished) s.Point(o, false);
  other.join();
  sigaction(SIGUSR1, &old, nullptr);
}

// A 64 KiB fake PM region observed by a Recorder.
class RecorderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    region_ = static_cast<char*>(std::aligned_alloc(4096, kSize));
    std::memset(region_, 0, kSize);
    rec_ = std::make_unique<Recorder>(region_, kSize, [] { return kSize; }, true);
    pm::SetObserver(rec_.get());
  }
  void TearDown() override {
    pm::SetObserver(nullptr);
    Recorder::SetThreadId(0);
    std::free(region_);
  }
  size_t Count(FailKind k) const {
    size_t n = 0;
    for (const auto& f : rec_->findings) n += f.kind == k;
    return n;
  }
  uint64_t* Word(size_t line, size_t i = 0) { return reinterpret_cast<uint64_t*>(region_ + line * 64) + i; }
  // Thread 1 publishes a word in line 1 without flushing it; thread 2 reads
  // it with LoadAcquire inside an op and links behind it durably (the
  // NVC-Hashmap erratum), having first made what it read durable if
  // flush_first (the erratum's fix).
  void LinkBehindUnflushedWord(bool flush_first) {
    std::thread a([&] {
      Recorder::SetThreadId(1);
      pm::StoreAtomic(Word(1), uint64_t(42));
    });
    a.join();
    std::thread b([&] {
      Recorder::SetThreadId(2);
      Op op;
      op.type = OpType::kInsert;
      size_t r = rec_->BeginOp(op);
      uint64_t v = pm::LoadAcquire(Word(1));
      if (flush_first) pm::Persist(Word(1), 8);
      pm::Store(Word(2), v);
      pm::Persist(Word(2), 8);
      rec_->EndOp(r, pmindex::Status::Code::kOk);
    });
    b.join();
  }
  static constexpr uint64_t kSize = 64 * 1024;
  char* region_ = nullptr;
  std::unique_ptr<Recorder> rec_;
};

TEST_F(RecorderTest, ErratumReadIsReported) {
  LinkBehindUnflushedWord(/*flush_first=*/false);
  EXPECT_EQ(Count(FailKind::kErratum), 1u);
  EXPECT_EQ(rec_->erratum_reads, 1u);
}

TEST_F(RecorderTest, ReaderThatFlushesFirstIsClean) {
  LinkBehindUnflushedWord(/*flush_first=*/true);
  EXPECT_EQ(Count(FailKind::kErratum), 0u);
  EXPECT_EQ(Count(FailKind::kMissingFlush), 0u);
}

TEST_F(RecorderTest, MissingFlushFenceRedundantFlushEmptyFence) {
  Recorder::SetThreadId(0);
  Op op;
  op.type = OpType::kUpdate;
  size_t r = rec_->BeginOp(op);
  pm::Store(Word(3), uint64_t(1));  // never flushed
  pm::Store(Word(4), uint64_t(1));
  pm::Flush(Word(4), 8);  // flushed, never fenced
  rec_->EndOp(r, pmindex::Status::Code::kOk);
  EXPECT_EQ(Count(FailKind::kMissingFlush), 1u);
  EXPECT_EQ(Count(FailKind::kMissingFence), 1u);
  EXPECT_EQ(rec_->missing_flushes["update"], 1u);

  op.type = OpType::kRemove;
  r = rec_->BeginOp(op);
  pm::Store(Word(5), uint64_t(1));
  pm::Persist(Word(5), 8);
  pm::Persist(Word(5), 8);  // nothing stored since: redundant flush
  pm::Fence();              // nothing to order
  rec_->EndOp(r, pmindex::Status::Code::kOk);
  EXPECT_EQ(rec_->redundant_flushes["remove"], 1u);
  EXPECT_EQ(rec_->empty_fences["remove"], 1u);
  EXPECT_EQ(Count(FailKind::kMissingFlush), 1u);
}

TEST_F(RecorderTest, LockWordsAreNotMissingFlushes) {
  Recorder::SetThreadId(0);
  Op op;
  op.type = OpType::kInsert;
  size_t r = rec_->BeginOp(op);
  uint64_t v = 0;
  ASSERT_TRUE(pm::CasVolatile(Word(9), &v, uint64_t(1)));  // seqlock: lock ...
  pm::Store(Word(9, 1), uint64_t(5));                    // ... data in the same line
  pm::Persist(Word(9, 1), 8);
  pm::StoreVolatile(Word(9), uint64_t(4));  // ... unlock with a new version, never flushed
  pm::FetchAddVolatile(Word(10), uint64_t(2));
  rec_->EndOp(r, pmindex::Status::Code::kOk);
  EXPECT_EQ(Count(FailKind::kMissingFlush), 0u);
  EXPECT_EQ(rec_->events[1].kind, Ev::kStore);  // still logged: crash images may persist it

  // A plain lock taken and released within the op loses nothing either.
  r = rec_->BeginOp(op);
  pm::StoreAtomic(Word(11), uint64_t(1));
  pm::StoreAtomic(Word(11), uint64_t(0));
  rec_->EndOp(r, pmindex::Status::Code::kOk);
  EXPECT_EQ(Count(FailKind::kMissingFlush), 0u);
  // But a changed word is.
  r = rec_->BeginOp(op);
  pm::StoreAtomic(Word(11), uint64_t(4));
  rec_->EndOp(r, pmindex::Status::Code::kOk);
  EXPECT_EQ(Count(FailKind::kMissingFlush), 1u);
}

TEST_F(RecorderTest, UnloggedStoreIsReportedAtFlushAndAtTheEnd) {
  Recorder::SetThreadId(0);
  *Word(6) = 7;  // bypasses the primitives
  pm::Persist(Word(6), 8);
  EXPECT_EQ(Count(FailKind::kUnloggedStore), 1u);
  *Word(8, 3) = 9;  // never flushed: the final comparison finds it
  rec_->FinalCheck();
  EXPECT_EQ(Count(FailKind::kUnloggedStore), 2u);
  EXPECT_NE(rec_->findings.back().what.find("@" + std::to_string(8 * 64 + 24)), std::string::npos) << rec_->findings.back().what;
}

// Free-running multi-threaded recordings (check_each_flush off): a store
// that is in memory but not yet logged when another thread flushes its line
// is logged before that flush, so crash images after the flush hold it
// (without this, a value a reader saw and made durable was missing from
// them: a false lost read). Bytes no store ever logs are still reported.
TEST_F(RecorderTest, AFlushCoversAStoreSeenBeforeItIsLogged) {
  pm::SetObserver(nullptr);
  rec_ = std::make_unique<Recorder>(region_, kSize, [] { return kSize; }, /*check_each_flush=*/false);
  pm::SetObserver(rec_.get());
  Recorder::SetThreadId(1);
  *Word(12) = 0x1111;  // thread 1's store, its OnStore still on its way
  std::thread b([&] {
    Recorder::SetThreadId(2);
    pm::Persist(Word(12), 8);  // thread 2 read it and makes it durable
  });
  b.join();
  rec_->OnStore(Word(12), 8);  // thread 1's log entry arrives late
  ASSERT_EQ(rec_->events.size(), 4u);
  EXPECT_EQ(rec_->events[0].kind, Ev::kStore);  // caught up, before the flush
  EXPECT_EQ(rec_->events[0].tid, 2);
  EXPECT_EQ(rec_->events[0].off, 12u * 64);
  EXPECT_EQ(rec_->events[0].size, 2u);  // the bytes that changed
  EXPECT_EQ(rec_->events[1].kind, Ev::kFlush);
  EXPECT_EQ(rec_->events[2].kind, Ev::kFence);
  EXPECT_EQ(rec_->events[3].kind, Ev::kStore);
  EXPECT_EQ(rec_->caught_up_stores, 1u);

  *Word(13, 2) = 5;  // bypasses the primitives: caught up, never logged
  pm::Persist(Word(13, 2), 8);
  EXPECT_EQ(rec_->caught_up_stores, 2u);
  rec_->FinalCheck();
  ASSERT_EQ(Count(FailKind::kUnloggedStore), 1u);
  EXPECT_NE(rec_->findings[0].what.find("@" + std::to_string(13 * 64 + 16)), std::string::npos) << rec_->findings[0].what;
}

TEST_F(RecorderTest, LogsStoresWithTheirBytes) {
  Recorder::SetThreadId(0);
  char msg[40];
  for (int i = 0; i < 40; ++i) msg[i] = char('a' + i % 26);
  pm::Copy(region_ + 100, msg, sizeof msg);  // [100, 140): lines 64 and 128
  pm::Persist(region_ + 100, sizeof msg);
  ASSERT_EQ(rec_->events.size(), 4u);
  const Event& e = rec_->events[0];
  EXPECT_EQ(e.kind, Ev::kStore);
  EXPECT_EQ(e.off, 100u);
  EXPECT_EQ(e.size, sizeof msg);
  EXPECT_EQ(std::memcmp(rec_->arena.data() + e.aux, msg, sizeof msg), 0);
  EXPECT_EQ(rec_->events[1].kind, Ev::kFlush);
  EXPECT_EQ(rec_->events[1].off, 64u);
  EXPECT_EQ(rec_->events[2].kind, Ev::kFlush);
  EXPECT_EQ(rec_->events[2].off, 128u);
  EXPECT_EQ(rec_->events[3].kind, Ev::kFence);
}

}  // namespace
}  // namespace pmcheck
