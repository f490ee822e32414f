// phase_run.cc: one target's run of one phase (phase_run.h): the worker
// threads of a chunk, the statistics thread's windows and progress line,
// and the phase's figures (PiBench methodology, pibench-evaluation-vldb20.md
// sections 4 and 5.3).
//
// Invariants: see phase_run.h. pmbench writes no PM itself.
//
// Thread-safety: the workers of a chunk each own one ThreadState; the
// statistics thread reads only their atomic WorkerSlot counters until it
// joins them.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>

#include "phase_run.h"

namespace pmbench::detail {

using pmindex::Index;

namespace {

struct alignas(64) WorkerSlot {
  std::atomic<uint64_t> done{0};
  std::atomic<bool> finished{false};
};

LatencySummary Summarize(std::vector<uint32_t>& v) {
  LatencySummary s;
  s.samples = v.size();
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  auto q = [&](double p) {
    size_t i = size_t(std::ceil(p * double(v.size())));
    i = i ? i - 1 : 0;
    return double(v[std::min(i, v.size() - 1)]);
  };
  double sum = 0;
  for (auto x : v) sum += x;
  s.avg_ns = sum / double(v.size());
  s.min_ns = v.front();
  s.p50_ns = q(0.5);
  s.p90_ns = q(0.9);
  s.p99_ns = q(0.99);
  s.p999_ns = q(0.999);
  s.p9999_ns = q(0.9999);
  s.p99999_ns = q(0.99999);
  s.max_ns = v.back();
  return s;
}

class Progress {
 public:
  Progress(bool on, std::string label) : on_(on), label_(std::move(label)), tty_(isatty(2)) {}
  void Update(double elapsed, uint64_t done, uint64_t total, double rate) {
    if (!on_) return;
    char buf[256];
    if (total)
      std::snprintf(buf, sizeof buf, "pmbench: %s: %llu/%llu ops (%.0f%%), %s, %.0fs", label_.c_str(), (unsigned long long)done,
                    (unsigned long long)total, 100.0 * double(done) / double(total), FormatRate(rate).c_str(), elapsed);
    else
      std::snprintf(buf, sizeof buf, "pmbench: %s: %llu ops, %s, %.0fs", label_.c_str(), (unsigned long long)done,
                    FormatRate(rate).c_str(), elapsed);
    if (tty_) std::fprintf(stderr, "\r%s\033[K", buf);
    else std::fprintf(stderr, "%s\n", buf);
    std::fflush(stderr);
    printed_ = true;
  }
  ~Progress() {
    if (printed_ && tty_) std::fprintf(stderr, "\n");
  }

 private:
  bool on_;
  std::string label_;
  bool tty_;
  bool printed_ = false;
};

}  // namespace

PhaseRun::PhaseRun(const PhaseContext& c, const PhaseSpec* spec, int phase_no)
    : c_(c), phase_no_(phase_no), load_(spec == nullptr), time_mode_(spec != nullptr && c.o->time_mode) {
  const BenchOptions& o = *c.o;
  const int T = c.threads;
  res_.name = spec ? spec->name : "load";
  if (spec) res_.ratios = spec->ratios;
  else {
    res_.ratios = Ratios();
    res_.ratios.r[0] = 0;
    res_.ratios[OpType::kInsert] = 1;
  }
  res_.threads = T;
  ranks_.reserve(size_t(T));
  th_.reserve(size_t(T));
  for (int t = 0; t < T; t++) {
    ThreadKeys& keys = (*c.keys)[t];
    uint64_t q;
    if (load_) q = keys.live.size();
    else if (!time_mode_) q = o.operations / T + (uint64_t(t) < o.operations % T ? 1 : 0);
    else q = UINT64_MAX;
    if (q != UINT64_MAX) total_quota_ += q;
    ranks_.emplace_back(o.distribution, o.skew);
    ranks_.back().Prepare(keys.live.size());
    th_.emplace_back(MixSeed(o.seed ^ 0x5EED1A7Eull, uint64_t(phase_no), uint64_t(t)), q);
  }
  // The streams point at ranks_ elements: made once ranks_ is complete.
  for (int t = 0; t < T; t++)
    if (!load_)
      th_[t].stream = std::make_unique<OpStream>(&(*c.keys)[t], spec->ratios, &ranks_[t], MixSeed(o.seed, uint64_t(phase_no), uint64_t(t)));
  res_.requested = time_mode_ ? 0 : total_quota_;
}

bool PhaseRun::HasWork(int round, int rounds) const {
  for (const ThreadState& st : th_)
    if (!st.exhausted && (time_mode_ || ChunkBegin(st.quota, round + 1, rounds) > st.next)) return true;
  return false;
}

void PhaseRun::RunChunk(int round, int rounds, int position, const std::string* after, const std::string& label) {
  const BenchOptions& o = *c_.o;
  const int T = c_.threads;
  Chunk chunk;
  chunk.round = round;
  chunk.position = position;
  if (after) chunk.after = *after;
  // Each thread's end in this chunk: the next 1/rounds of its quota.
  std::vector<uint64_t> stop_at(T);
  bool any = false;
  for (int t = 0; t < T; t++) {
    const ThreadState& st = th_[t];
    stop_at[t] = time_mode_ ? UINT64_MAX : ChunkBegin(st.quota, round + 1, rounds);
    any |= !st.exhausted && stop_at[t] > st.next;
  }
  if (!any) {  // nothing to do in this round (fewer operations than rounds, or every thread out of keys)
    res_.chunks.push_back(chunk);
    return;
  }

  std::vector<WorkerSlot> slots(T);
  std::vector<Clock::time_point> ends(T);
  std::atomic<int> ready{0};
  std::atomic<bool> go{false}, stop{false};
  // Wakes the statistics thread when a worker finishes, so that the next
  // chunk (of any target) starts at once.
  std::mutex finish_mu;
  std::condition_variable finish_cv;
  tree_api* tree = c_.target->tree();
  const size_t ks = c_.codec->key_size(), vs = c_.codec->value_size();
  const uint64_t version_base = uint64_t(phase_no_ + 1) << 40;

  auto worker = [&](int t) {
    ThreadState& st = th_[t];
    WorkerOut& out = st.out;
    ThreadKeys& keys = (*c_.keys)[t];
    const double frac = o.latency_sampling;
    std::vector<char> key(ks), val(vs), val_out(vs + 8);
    ready.fetch_add(1);
    while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
    const pmindex::pm::Counters pm0 = pmindex::pm::ThreadCounters();
    const uint64_t first = st.next, end = st.exhausted ? first : stop_at[t];
    uint64_t i = first;
    for (; i < end; i++) {
      if (time_mode_ && stop.load(std::memory_order_relaxed)) break;
      Op op;
      if (load_) {
        op.type = OpType::kInsert;
        op.id = keys.live[i];
      } else if (!st.stream->Next(&op)) {
        st.exhausted = true;
        break;
      }
      c_.codec->EncodeKey(op.id, key.data());
      const bool timed = frac > 0 && (frac >= 1 || st.lat_rng.NextDouble() < frac);
      Clock::time_point t0;
      if (timed) t0 = Clock::now();
      bool ok = false;
      switch (op.type) {
        case OpType::kRead:
          ok = tree->find(key.data(), ks, val_out.data());
          break;
        case OpType::kInsert:
          c_.codec->EncodeValue(op.id, version_base + i, val.data());
          ok = tree->insert(key.data(), ks, val.data(), vs);
          break;
        case OpType::kUpdate:
          c_.codec->EncodeValue(op.id, version_base + i, val.data());
          ok = tree->update(key.data(), ks, val.data(), vs);
          break;
        case OpType::kRemove:
          ok = tree->remove(key.data(), ks);
          break;
        case OpType::kScan: {
          char* recs = nullptr;
          int n = tree->scan(key.data(), ks, o.scan_size, recs);
          if (n > 0) out.scanned += uint64_t(n);
          ok = n > 0;
          break;
        }
      }
      if (timed) {
        auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
        out.lat[int(op.type)].push_back(uint32_t(std::min<long long>(ns, UINT32_MAX)));
      }
      out.completed[int(op.type)]++;
      out.succeeded[int(op.type)] += ok;
      slots[t].done.store(i + 1 - first, std::memory_order_relaxed);
    }
    st.next = i;
    out.pm += pmindex::pm::ThreadCounters() - pm0;
    ends[t] = Clock::now();
    slots[t].finished.store(true, std::memory_order_release);
    { std::lock_guard<std::mutex> lock(finish_mu); }  // the waiter is waiting or will see `finished`
    finish_cv.notify_one();
  };

  std::vector<std::thread> workers;
  for (int t = 0; t < T; t++) workers.emplace_back(worker, t);
  while (ready.load() < T) std::this_thread::yield();

  // The statistics thread (this one): per-window throughput and progress,
  // both on the phase clock (elapsed_ + time in this chunk).
  Progress progress(o.progress, label);
  const Clock::duration window = std::chrono::milliseconds(o.sampling_ms);
  const Clock::time_point start = Clock::now();
  go.store(true, std::memory_order_release);
  Clock::time_point last_t = start, next_window = start + (window - open_len_), next_progress = start + (progress_at_ - elapsed_);
  const Clock::time_point deadline =
      time_mode_ ? start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.seconds / rounds))
                 : Clock::time_point::max();
  uint64_t last_ops = 0;
  auto total_done = [&] {
    uint64_t s = 0;
    for (auto& sl : slots) s += sl.done.load(std::memory_order_relaxed);
    return s;
  };
  auto all_finished = [&] {
    for (auto& sl : slots)
      if (!sl.finished.load(std::memory_order_acquire)) return false;
    return true;
  };
  auto phase_seconds = [&](Clock::time_point t) { return std::chrono::duration<double>(elapsed_ + (t - start)).count(); };
  while (!all_finished()) {
    // No polling: the next window, progress line or deadline, or a worker's
    // end (each worker notifies finish_cv) wakes this thread.
    Clock::time_point wake = std::min({next_window, next_progress, deadline});
    {
      std::unique_lock<std::mutex> lock(finish_mu);
      finish_cv.wait_until(lock, wake, all_finished);
    }
    Clock::time_point now = Clock::now();
    if (all_finished()) {
      // Cut no window past the last worker's end: the time after it is idle
      // and not part of the chunk's (phase clock's) time.
      Clock::time_point last = start;
      for (auto& e : ends) last = std::max(last, e);
      now = std::min(now, last);
    }
    if (now >= next_window) {
      uint64_t d = total_done();
      res_.windows.push_back({phase_seconds(now), std::chrono::duration<double>(open_len_ + (now - last_t)).count(), open_ops_ + d - last_ops});
      open_len_ = Clock::duration(0);
      open_ops_ = 0;
      last_ops = d;
      last_t = now;
      next_window += window;
      if (next_window <= now) next_window = now + window;
    }
    if (now >= next_progress) {
      double rate = res_.windows.empty() ? 0 : double(res_.windows.back().ops) / res_.windows.back().seconds;
      progress.Update(phase_seconds(now), done_ + total_done(), total_quota_, rate);
      progress_at_ += std::chrono::seconds(1);
      next_progress += std::chrono::seconds(1);
    }
    if (now >= deadline) stop.store(true, std::memory_order_relaxed);
  }
  for (auto& w : workers) w.join();

  Clock::time_point end = start;
  for (auto& e : ends) end = std::max(end, e);
  const uint64_t d = total_done();
  // The window still open carries over to the next chunk (or is closed by
  // Finish as the phase's final, partial window).
  if (end > last_t) open_len_ += end - last_t;
  open_ops_ += d - last_ops;
  elapsed_ += end - start;
  done_ += d;
  chunk.ops = d;
  chunk.seconds = Since(start, end);
  res_.chunks.push_back(chunk);
}

PhaseResult PhaseRun::Finish() {
  const BenchOptions& o = *c_.o;
  PhaseResult& res = res_;
  res.seconds = std::chrono::duration<double>(elapsed_).count();
  if (open_ops_ > 0 && open_len_ > Clock::duration(0))
    res.windows.push_back({res.seconds, std::chrono::duration<double>(open_len_).count(), open_ops_});

  // Window statistics over windows of at least half the nominal length (the
  // final partial window is listed but not averaged when shorter).
  const double wnom = o.sampling_ms / 1000.0;
  std::vector<double> rates;
  for (const auto& w : res.windows)
    if (w.seconds >= 0.5 * wnom) rates.push_back(double(w.ops) / w.seconds);
  res.full_windows = rates.size();
  if (rates.empty()) {
    // Shorter than one window: the phase is its own (only) window.
    res.window_mean = res.seconds > 0 ? double(done_) / res.seconds : 0;
  } else {
    double m = 0;
    for (double r : rates) m += r;
    m /= double(rates.size());
    double v = 0;
    for (double r : rates) v += (r - m) * (r - m);
    res.window_mean = m;
    res.window_stddev = rates.size() > 1 ? std::sqrt(v / double(rates.size() - 1)) : 0;
  }

  std::vector<uint32_t> all;
  bool exhausted = false;
  for (int ty = 0; ty < kNumOpTypes; ty++) {
    std::vector<uint32_t> v;
    for (auto& st : th_) v.insert(v.end(), st.out.lat[ty].begin(), st.out.lat[ty].end());
    all.insert(all.end(), v.begin(), v.end());
    res.latency_by_type[ty] = Summarize(v);
  }
  res.latency = Summarize(all);
  for (auto& st : th_) {
    for (int ty = 0; ty < kNumOpTypes; ty++) {
      res.completed[ty] += st.out.completed[ty];
      res.succeeded[ty] += st.out.succeeded[ty];
    }
    res.scanned_records += st.out.scanned;
    res.pm += st.out.pm;
    exhausted |= st.exhausted;
  }
  if (exhausted)
    res.note = "a thread ran out of live keys (more removes than records it owned): the phase ended early for it";
  if (res.total_succeeded() != res.total_completed()) {
    std::string n = std::to_string(res.total_completed() - res.total_succeeded()) + " operations did not succeed";
    res.note = res.note.empty() ? n : res.note + "; " + n;
  }
  if (Index* idx = c_.target->index()) {
    res.stats = idx->Stats();
    res.has_stats = true;
  }
  return std::move(res);
}

}  // namespace pmbench::detail
