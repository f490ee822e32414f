// pmcheck's schedule explorer for multi-threaded recordings: a PCT-style
// scheduler (probabilistic concurrency testing, Burckhardt et al., ASPLOS
// 2010) whose scheduling points are the recorder's hooks (every store, flush,
// fence and acting load through the pm:: primitives, and every op boundary).
//
// Exactly one workload thread holds the token and runs; the others wait at
// their next scheduling point. A seed fixes everything: each thread gets a
// distinct initial priority (a seeded permutation of d+1..d+n), and d change
// points are drawn uniformly over the run: each is an op (of all threads'
// ops, counted in the order they begin) and a fraction of an op's length;
// it is reached at the first scheduling point at which that op has begun and
// has run that fraction of the mean number of points per op so far (or any
// later op has begun). Then the running thread's priority drops to d-i
// (below every initial priority). Ops are what the run's length is known
// in: points per op range from 5 to 50 between indexes and key kinds, so
// change points drawn over an estimate of points fell past the end of many
// runs (a u64 B+-tree made 2 switches at d = 4). The mean so far depends only
// on the schedule before the change point, so a seed still names one
// schedule. At every point the highest-priority thread
// that can run takes the token. So a seed names one interleaving, and N seeds
// explore N interleavings, each one with at most d preemptions placed at
// random points of the run (PCT finds a bug of depth d with probability at
// least 1/(n k^(d-1)) per run).
//
// Threads that cannot reach a scheduling point while waiting for another:
//  * spinning on PM words: a run of more than kLoadStreak acting loads with no
//    store, flush, fence or op boundary in between counts as a spin, and so
//    does a spin-hook call (Spin()); the spinning thread's priority drops
//    below every other's and the token moves on (deterministic);
//  * blocked outside the primitives (a std::mutex held by a waiting thread, a
//    spin loop on DRAM words): a waiting thread sees the step count not move
//    for kStallMs and takes the token (a stall). The stalled thread is left
//    out of the choice until it reaches its next scheduling point. A holder
//    still inside WaitTurn (handed the token but descheduled before it woke)
//    is at a point already and is never stalled: left blocked there it
//    would wait forever, as no later point would clear its mark. Stalls
//    depend on timing: a schedule with stalls may not replay exactly (the
//    report counts them).
// Because a thread gives the token away only at a scheduling point, which
// comes after the recorder logged the store before it, no other thread runs
// between a store's memory effect and its log entry: the log order is the
// order of the memory effects, and the recorder can compare a flushed line
// with its shadow in multi-threaded runs too.
//
// Thread-safety: every member may be called from any workload thread; the
// scheduler synchronises itself. Threads not registered (tid outside
// [0, n)) pass through every call, and so does a thread after Finish (its
// exit handlers, e.g. the allocator's thread cache release, run unscheduled).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace pmcheck {

class PctScheduler {
 public:
  // threads: workload threads 0..threads-1; depth: change points d;
  // total_ops: the ops of all threads (the change points' range).
  PctScheduler(int threads, int depth, uint64_t seed, uint64_t total_ops);

  // A workload thread starts (waits for the token) / has finished its ops.
  void Start(int tid);
  void Finish(int tid);
  // A scheduling point of thread tid; load: an acting load (spin detection).
  void Point(int tid, bool load);
  // The thread is spinning (a spin hook): let the others run first.
  void Spin(int tid);
  // Thread tid begins an op: a scheduling point that also counts the op.
  void OpBegin(int tid);

  // The thread holding the token (-1: none).
  int holder() const { return running_.load(); }
  uint64_t steps() const { return step_.load(); }
  uint64_t switches() const { return switches_; }
  uint64_t stalls() const { return stalls_; }
  uint64_t spins() const { return spins_; }
  // Change points reached (at most depth).
  uint64_t changes() const { return next_change_.load(); }
  // A hash of the sequence of token holders (equal hashes: same schedule).
  uint64_t hash() const { return hash_.load(); }

  static constexpr int kLoadStreak = 64;
  static constexpr int kStallMs = 20;

 private:
  bool Mine(int tid) const { return tid >= 0 && tid < n_; }
  int Pick(int exclude) const;
  void Hand(int next);
  void WaitTurn(std::unique_lock<std::mutex>& g, int tid);

  std::mutex mu_;
  std::condition_variable cv_;
  int n_;
  std::vector<int64_t> prio_;
  std::vector<uint8_t> done_, blocked_;
  std::vector<uint8_t> waiting_;  // in WaitTurn: at a point, never stalled
  std::vector<int> load_streak_;
  struct ChangePoint {
    uint64_t op;  // 1-based, in the order ops begin
    double frac;  // of the mean points per op
    bool operator<(const ChangePoint& o) const { return op != o.op ? op < o.op : frac < o.frac; }
  };
  bool Reached(const ChangePoint& cp) const;
  std::vector<ChangePoint> change_points_;  // ascending
  std::atomic<size_t> next_change_{0};
  // Written by the holder: ops begun, and the step count when the latest
  // one began (atomic for the same reason as hash_).
  std::atomic<uint64_t> ops_begun_{0}, op_step_{0};
  int64_t low_prio_;  // next priority given at a change point (d-1, d-2, ...)
  int64_t spin_prio_ = -1;  // priorities given to spinning threads (below all)
  // The token holder counts its steps without the lock (a waiter that
  // locked mu_ on every step of the holder could starve on it); it takes
  // the lock at a change point, a spin, or when attention_ says a thread
  // came back from a stall and may now be chosen.
  std::atomic<int> running_{-1};
  std::atomic<uint64_t> step_{0};
  std::atomic<bool> attention_{false};
  int started_ = 0;  // no stall is declared before every thread started
  uint64_t switches_ = 0, stalls_ = 0, spins_ = 0;
  // Written by the holder; atomic because a thread that was robbed of the
  // token by a stall may still take its fast path once.
  std::atomic<uint64_t> hash_{1469598103934665603ull};
};

// The backstop of a scheduled recording (--pct-timeout): a thread that
// polls the scheduler's step count every 100 ms and, when it has not moved
// for `seconds` (a thread spinning outside the primitives while the others
// wait for the token, or a deadlock), prints a message naming the schedule
// and exits the process with code 3. Stopped by its destructor.
class PctWatchdog {
 public:
  PctWatchdog(const PctScheduler* sched, double seconds, int depth, uint64_t seed);
  ~PctWatchdog();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread th_;
};

}  // namespace pmcheck
