// pmcheck's PCT-style scheduler (see scheduler.h for the algorithm and its
// limits). No PM access: it only decides which workload thread runs next.
#include "scheduler.h"

#include <algorithm>
#include <chrono>
#include <random>
#include <cstdlib>
#include <cstdio>

namespace pmcheck {

PctScheduler::PctScheduler(int threads, int depth, uint64_t seed, uint64_t total_ops)
    : n_(threads), prio_(size_t(threads)), done_(size_t(threads), 0), blocked_(size_t(threads), 0),
      waiting_(size_t(threads), 0),
      load_streak_(size_t(threads), 0), low_prio_(depth > 0 ? depth - 1 : 0) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 0x5CED);
  std::vector<int64_t> p(static_cast<size_t>(threads));
  for (int i = 0; i < threads; ++i) p[size_t(i)] = depth + 1 + i;
  std::shuffle(p.begin(), p.end(), rng);
  prio_ = p;
  if (total_ops < 1) total_ops = 1;
  for (int i = 0; i < depth; ++i) {
    const uint64_t op = 1 + rng() % total_ops;
    change_points_.push_back({op, double(rng() % 1024) / 1024});
  }
  std::sort(change_points_.begin(), change_points_.end());
  running_.store(Pick(-1));
}

bool PctScheduler::Reached(const ChangePoint& cp) const {
  const uint64_t ops = ops_begun_.load(std::memory_order_relaxed), at = op_step_.load(std::memory_order_relaxed);
  if (ops != cp.op) return ops > cp.op;
  // Points per op so far (ops before this one); 8 before the first ends.
  const double mean = ops > 1 ? double(at) / double(ops - 1) : 8.0;
  return double(step_.load() - at) >= cp.frac * mean;
}

int PctScheduler::Pick(int exclude) const {
  int best = -1;
  for (int i = 0; i < n_; ++i) {
    if (i == exclude || done_[size_t(i)] || blocked_[size_t(i)]) continue;
    if (best < 0 || prio_[size_t(i)] > prio_[size_t(best)]) best = i;
  }
  return best;
}

void PctScheduler::Hand(int next) {
  if (next != running_.load()) ++switches_;
  running_.store(next);
  cv_.notify_all();
}

void PctScheduler::WaitTurn(std::unique_lock<std::mutex>& g, int tid) {
  // A thread in here is at a scheduling point: it can run. It stays
  // unblocked and is never the target of a stall: when the token was handed
  // to it and it has not yet won mu_ back (descheduled on a loaded machine),
  // it will take the token as soon as it does.
  waiting_[size_t(tid)] = 1;
  blocked_[size_t(tid)] = 0;
  while (running_.load() != tid) {
    const uint64_t seen = step_.load();
    const int holder = running_.load();
    if (cv_.wait_for(g, std::chrono::milliseconds(kStallMs),
                     [&] { return running_.load() == tid || step_.load() != seen || running_.load() != holder; }))
      continue;
    if (started_ < n_) continue;
    if (holder >= 0 && waiting_[size_t(holder)]) continue;
    // The holder made no step for kStallMs: it is blocked outside the
    // primitives (most likely on something a waiting thread holds).
    if (holder >= 0) blocked_[size_t(holder)] = 1;
    const int next = Pick(-1);
    if (next < 0) {
      if (holder >= 0) blocked_[size_t(holder)] = 0;
      continue;
    }
    ++stalls_;
    Hand(next);
  }
  waiting_[size_t(tid)] = 0;
}

void PctScheduler::Start(int tid) {
  if (!Mine(tid)) return;
  std::unique_lock<std::mutex> g(mu_);
  blocked_[size_t(tid)] = 0;
  ++started_;
  WaitTurn(g, tid);
}

void PctScheduler::Finish(int tid) {
  if (!Mine(tid)) return;
  std::unique_lock<std::mutex> g(mu_);
  done_[size_t(tid)] = 1;
  if (running_.load() == tid || running_.load() < 0) Hand(Pick(-1));
}

void PctScheduler::Point(int tid, bool load) {
  if (!Mine(tid)) return;
  bool spin = false, change = false;
  if (running_.load() == tid) {
    // The holder's step (only the holder writes these).
    step_.fetch_add(1);
    hash_.store((hash_.load(std::memory_order_relaxed) ^ uint64_t(tid + 1)) * 1099511628211ull, std::memory_order_relaxed);
    int& streak = load_streak_[size_t(tid)];
    streak = load ? streak + 1 : 0;
    spin = streak > kLoadStreak;
    if (spin) streak = 0;
    const size_t nc = next_change_.load();
    change = nc < change_points_.size() && Reached(change_points_[nc]);
    if (!spin && !change && !attention_.load()) return;
  }
  std::unique_lock<std::mutex> g(mu_);
  if (done_[size_t(tid)]) return;  // after its last op (thread-exit cleanup): not scheduled
  if (running_.load() != tid) {
    // The token was taken while this thread was blocked: it may run again.
    blocked_[size_t(tid)] = 0;
    attention_.store(true);
    WaitTurn(g, tid);
    return;
  }
  attention_.store(false);
  while (next_change_ < change_points_.size() && Reached(change_points_[next_change_])) {
    prio_[size_t(tid)] = low_prio_--;
    ++next_change_;
  }
  if (spin) {
    ++spins_;
    prio_[size_t(tid)] = spin_prio_--;
  }
  const int next = Pick(-1);
  if (next >= 0 && next != tid) Hand(next);
  WaitTurn(g, tid);
}

void PctScheduler::OpBegin(int tid) {
  if (!Mine(tid)) return;
  if (running_.load() == tid) {
    ops_begun_.fetch_add(1, std::memory_order_relaxed);
    op_step_.store(step_.load(), std::memory_order_relaxed);
  }
  Point(tid, false);
}

void PctScheduler::Spin(int tid) {
  if (!Mine(tid)) return;
  if (running_.load() == tid) load_streak_[size_t(tid)] = kLoadStreak;
  Point(tid, true);
}

PctWatchdog::PctWatchdog(const PctScheduler* sched, double seconds, int depth, uint64_t seed) {
  th_ = std::thread([this, sched, seconds, depth, seed] {
    std::unique_lock<std::mutex> g(mu_);
    uint64_t seen = sched->steps();
    auto since = std::chrono::steady_clock::now();
    while (!cv_.wait_for(g, std::chrono::milliseconds(100), [this] { return stop_; })) {
      const uint64_t steps = sched->steps();
      const auto now = std::chrono::steady_clock::now();
      if (steps != seen) {
        seen = steps;
        since = now;
      } else if (std::chrono::duration<double>(now - since).count() >= seconds) {
        std::fprintf(stderr,
                     "pmcheck: the PCT recording made no progress for %g s (no scheduling point after step %llu, "
                     "thread %d holding the token): aborted; replay: --pct %d --schedule-seed %llu\n",
                     seconds, static_cast<unsigned long long>(steps), sched->holder(), depth,
                     static_cast<unsigned long long>(seed));
        std::fflush(stderr);
        std::_Exit(3);
      }
    }
  });
}

PctWatchdog::~PctWatchdog() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  th_.join();
}

}  // namespace pmcheck
