// bench.cc: pmbench's driver: targets, load/run phases and measurements
// (PiBench methodology, pibench-evaluation-vldb20.md sections 4 and 5.3; the
// key-generation corrections are described in workload.h).
//
// Invariants: every target of one invocation sees the same operations (the
// streams depend only on seed, thread count and phase number, never on
// results); workers never share ids (see workload.h), so inserts and removes
// always succeed on a correct index. pmbench writes no PM itself: pools are
// created, recovered and closed by the indexes (OpenIndex) or the plugins.
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cctype>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <optional>
#include <thread>

#include "bench.h"
#include "index_tree.h"
#include "pmindex/pm/pool.h"

namespace pmbench {

using pmindex::Index;
using pmindex::IndexInfo;
using Clock = std::chrono::steady_clock;

static double Since(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

Status PhaseByName(const std::string& name, const Ratios& custom, PhaseSpec* out) {
  Ratios r;
  r.r[0] = 0;
  if (name == "read" || name == "lookup") r[OpType::kRead] = 1;
  else if (name == "insert") r[OpType::kInsert] = 1;
  else if (name == "update") r[OpType::kUpdate] = 1;
  else if (name == "delete" || name == "remove") r[OpType::kRemove] = 1;
  else if (name == "scan") r[OpType::kScan] = 1;
  else if (name == "mixed") {
    // A read-mostly mix with every point operation: 50% read, 20% insert,
    // 20% update, 10% delete (inserts outnumber deletes, so it never runs dry).
    r[OpType::kRead] = 0.5;
    r[OpType::kInsert] = 0.2;
    r[OpType::kUpdate] = 0.2;
    r[OpType::kRemove] = 0.1;
  } else if (name == "custom" || name == "run") {
    PMINDEX_RETURN_IF_ERROR(ValidateRatios(custom));
    r = custom;
  } else {
    return Status::InvalidArgument("unknown phase '" + name + "' (read, insert, update, delete, scan, mixed, custom)");
  }
  out->name = name == "remove" ? "delete" : (name == "lookup" ? "read" : name);
  out->ratios = r;
  return Status::OK();
}

Status BenchOptions::Validate() const {
  if (threads < 1 || threads > 1024) return Status::InvalidArgument("threads (-t) must be in [1, 1024]");
  PMINDEX_RETURN_IF_ERROR(KeyCodec::Validate(key_size, key_prefix, value_size));
  PMINDEX_RETURN_IF_ERROR(RankGenerator::Validate(distribution, skew));
  if (phases.empty()) PMINDEX_RETURN_IF_ERROR(ValidateRatios(ratios));
  if (scan_size < 1) return Status::InvalidArgument("--scan_size must be at least 1");
  if (time_mode && !(seconds > 0)) return Status::InvalidArgument("--seconds must be positive in time mode");
  if (sampling_ms < 1) return Status::InvalidArgument("--sampling_ms must be at least 1");
  if (!(latency_sampling >= 0 && latency_sampling <= 1)) return Status::InvalidArgument("--latency_sampling must be in [0, 1]");
  if (records > (uint64_t(1) << 40)) return Status::InvalidArgument("-n is limited to 2^40 records");
  if (rounds < 0 || rounds > kMaxRounds)
    return Status::InvalidArgument("--rounds must be in [1, " + std::to_string(kMaxRounds) + "]");
  if (sequential && rounds > 1)
    return Status::InvalidArgument("--rounds " + std::to_string(rounds) +
                                   " needs the interleaved mode: with --sequential each index runs alone, there is nothing to alternate "
                                   "(drop --rounds or --sequential)");
  return Status::OK();
}

uint64_t PhaseResult::total_completed() const {
  uint64_t s = 0;
  for (auto c : completed) s += c;
  return s;
}
uint64_t PhaseResult::total_succeeded() const {
  uint64_t s = 0;
  for (auto c : succeeded) s += c;
  return s;
}

namespace {

// ---------------------------------------------------------------------------
// Targets: everything is driven through tree_api.
class Target {
 public:
  virtual ~Target() = default;
  virtual Status Open(const tree_options_t& o) = 0;  // create, or open + recover
  virtual void Close() = 0;
  virtual tree_api* tree() = 0;
  virtual Index* index() { return nullptr; }
};

class BuiltinTarget final : public Target {
 public:
  BuiltinTarget(std::string name, pmindex::Options base) : name_(std::move(name)), base_(std::move(base)) {}
  ~BuiltinTarget() override { Close(); }
  Status Open(const tree_options_t& o) override {
    tree_.reset();
    return pmindex::pibench::OpenIndexTree(name_, o, &base_, &tree_);
  }
  void Close() override { tree_.reset(); }
  tree_api* tree() override { return tree_.get(); }
  Index* index() override { return tree_ ? tree_->index() : nullptr; }

 private:
  std::string name_;
  pmindex::Options base_;
  std::unique_ptr<pmindex::pibench::IndexTree> tree_;
};

class PluginTarget final : public Target {
 public:
  ~PluginTarget() override { Close(); }
  // The library stays loaded for the life of the process (threads that ran
  // its code may still own thread_local state).
  Status Load(const std::string& path) {
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) return Status::InvalidArgument(std::string("cannot load plugin: ") + dlerror());
    void* sym = dlsym(h, kPibenchCreateTreeSymbol);
    if (!sym) return Status::InvalidArgument("plugin " + path + " does not export create_tree");
    create_ = reinterpret_cast<pibench_create_tree_fn>(sym);
    return Status::OK();
  }
  Status Open(const tree_options_t& o) override {
    Close();
    tree_ = create_(o);
    if (!tree_) return Status::InvalidArgument("the plugin's create_tree returned nullptr (see its message above)");
    return Status::OK();
  }
  void Close() override {
    delete tree_;
    tree_ = nullptr;
  }
  tree_api* tree() override { return tree_; }

 private:
  pibench_create_tree_fn create_ = nullptr;
  tree_api* tree_ = nullptr;
};

// ---------------------------------------------------------------------------
struct alignas(64) WorkerSlot {
  std::atomic<uint64_t> done{0};
  std::atomic<bool> finished{false};
};

struct WorkerOut {
  uint64_t completed[kNumOpTypes] = {};
  uint64_t succeeded[kNumOpTypes] = {};
  uint64_t scanned = 0;
  std::vector<uint32_t> lat[kNumOpTypes];
  pmindex::pm::Counters pm;
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

struct PhaseContext {
  const BenchOptions* o;
  const KeyCodec* codec;
  Target* target;
  std::vector<ThreadKeys>* keys;
  int threads;
};

// One target's run of one phase, in one chunk per round (one chunk with
// --rounds 1). Everything that must continue from one chunk to the next lives
// here: each thread's operation stream (its generator; the live-key state is
// the target's ThreadKeys), its latency-sampling generator, its position in
// its quota (which also numbers the values written), the throughput window
// left open at the end of a chunk, and the figures so far. The clock of a
// phase is phase time, the sum of its chunks' times: windows are cut every
// sampling_ms of phase time and may span a chunk boundary.
class PhaseRun {
 public:
  // spec == nullptr: the load phase (each thread inserts the loaded ids it owns).
  PhaseRun(const PhaseContext& c, const PhaseSpec* spec, int phase_no);
  PhaseRun(const PhaseRun&) = delete;
  PhaseRun& operator=(const PhaseRun&) = delete;
  // Runs this target's share of round `round` (of `rounds`), where it is at
  // `position` in the round's order.
  // `after`: the target whose chunk ran just before (null: none in this step).
  void RunChunk(int round, int rounds, int position, const std::string* after, const std::string& label);
  // Whether this target has operations to run in round `round`.
  bool HasWork(int round, int rounds) const;
  // The phase's figures, once every round has run.
  PhaseResult Finish();

 private:
  struct ThreadState {
    ThreadState(uint64_t lat_seed, uint64_t q) : lat_rng(lat_seed), quota(q) {}
    std::unique_ptr<OpStream> stream;  // null in the load phase
    Rng lat_rng;
    uint64_t quota;     // operations over the whole phase (UINT64_MAX: time mode)
    uint64_t next = 0;  // operations done so far: the next one's number
    bool exhausted = false;
    WorkerOut out;  // summed over chunks
  };

  PhaseContext c_;
  int phase_no_;
  bool load_, time_mode_;
  uint64_t total_quota_ = 0;
  std::vector<RankGenerator> ranks_;  // prepared once, at the phase's start
  std::vector<ThreadState> th_;
  PhaseResult res_;
  Clock::duration elapsed_{0};    // phase time of the chunks run so far
  Clock::duration open_len_{0};   // phase time in the window still open
  uint64_t open_ops_ = 0;         // operations in the window still open
  uint64_t done_ = 0;             // operations of the chunks run so far
  Clock::duration progress_at_ = std::chrono::seconds(1);  // next progress line, phase time
};

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

std::string SanitizeName(const std::string& s) {
  std::string r;
  for (char ch : s) r += (std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-') ? ch : '_';
  return r;
}

// Temporary pools, remembered so that a signal handler can unlink them
// (async-signal-safe: fixed buffers, unlink only).
constexpr int kMaxTempPools = 64;
char g_temp_pools[kMaxTempPools][256];
std::atomic<int> g_num_temp_pools{0};

void RememberTempPool(const std::string& path) {
  if (path.size() >= sizeof g_temp_pools[0]) return;
  int i = g_num_temp_pools.load();
  if (i >= kMaxTempPools) return;
  std::memcpy(g_temp_pools[i], path.c_str(), path.size() + 1);
  g_num_temp_pools.store(i + 1);
}

void RemoveTempPoolsAndReraise(int sig) {
  int n = g_num_temp_pools.load();
  for (int i = 0; i < n && i < kMaxTempPools; i++) unlink(g_temp_pools[i]);
  signal(sig, SIG_DFL);
  raise(sig);
}

uint64_t AutoPoolSize(const BenchOptions& o) {
  // Roughly 3x the raw data of the loaded records plus the inserts of every
  // phase, at least 64 MiB; pools grow in place if this is not enough.
  uint64_t inserts = 0;
  for (const auto& p : o.phases) inserts += uint64_t(double(o.operations) * p.ratios[OpType::kInsert]);
  if (o.phases.empty()) inserts = uint64_t(double(o.operations) * o.ratios[OpType::kInsert]);
  uint64_t bytes = (o.records + inserts) * (o.key_size + o.value_size + 16) * 3;
  bytes = std::max<uint64_t>(bytes, 64ull << 20);
  return (bytes + (1 << 20) - 1) & ~uint64_t((1 << 20) - 1);
}

void RemovePoolFile(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(path, ec)) std::filesystem::remove(path, ec);
}

// One target's state across the steps of a run.
struct TargetRun {
  const BenchOptions* o = nullptr;
  TargetResult* r = nullptr;
  std::unique_ptr<Target> target;
  std::unique_ptr<KeyCodec> codec;
  std::vector<ThreadKeys> keys;
  tree_options_t topt;
  bool builtin = true, user_pool = false, uses_pool = false, open = false;
  int phase_no = 0;
  // The step under way: its run (null if none), or its skipped result.
  std::unique_ptr<PhaseRun> current;
  bool current_load = false;
  std::optional<PhaseResult> skipped;
  std::string step;

  bool failed() const { return !r->error.empty(); }

  void Fail(const std::string& e) {
    r->error = e;
    Cleanup();
  }

  void Cleanup() {
    if (target) target->Close();
    open = false;
    if (!user_pool && uses_pool && !r->pool_path.empty()) {
      if (builtin) pmindex::pm::Pool::Remove(r->pool_path);
      RemovePoolFile(r->pool_path);
    }
  }

  // Resolves the target, picks its pool and opens (creates) the index.
  void Setup(const TargetSpec& spec, size_t ordinal, size_t ntargets) {
    r->spec = spec;
    builtin = spec.plugin.empty();
    r->kind = builtin ? "builtin" : "plugin";
    if (builtin) {
      IndexInfo info;
      if (!pmindex::FindIndexInfo(spec.name, &info)) return Fail("index '" + spec.name + "' is not registered in this build");
      r->description = info.description;
      r->persistent = info.persistent;
      r->ordered = info.ordered;
      r->concurrent = info.concurrent;
      pmindex::Options base;
      base.params = o->params;
      target.reset(new BuiltinTarget(spec.name, base));
    } else {
      auto* p = new PluginTarget();
      target.reset(p);
      Status s = p->Load(spec.plugin);
      if (!s.ok()) return Fail(s.ToString());
      r->description = "PiBench plugin " + spec.plugin;
      r->persistent = true;  // unknown: assume it may keep state in its pool
      // Our own plugins (libpibench_NAME.so) wrap a registered index: take
      // its facts, so a single-threaded one is not driven by several threads
      // and a hash index skips scan phases.
      IndexInfo info;
      if (spec.name.rfind("pibench_", 0) == 0 && pmindex::FindIndexInfo(spec.name.substr(8), &info)) {
        r->persistent = info.persistent;
        r->ordered = info.ordered;
        r->concurrent = info.concurrent;
        r->description += " (" + info.name + ": " + info.description + ")";
      }
    }
    r->threads = r->concurrent ? o->threads : 1;

    user_pool = !o->pool_path.empty();
    if (user_pool) r->pool_path = ntargets == 1 ? o->pool_path : o->pool_path + "." + SanitizeName(spec.name);
    else
      r->pool_path = "/dev/shm/pmbench-" + SanitizeName(spec.name) + "-" + std::to_string(getpid()) + "-" + std::to_string(ordinal) + ".pool";
    uses_pool = r->persistent;  // plugins: persistent unless known otherwise
    if (!uses_pool) r->pool_path.clear();
    if (uses_pool && !user_pool) RememberTempPool(r->pool_path);

    topt.key_size = o->key_size;
    topt.value_size = o->value_size;
    topt.pool_path = r->pool_path;
    topt.pool_size = o->pool_size ? o->pool_size : AutoPoolSize(*o);
    topt.num_threads = size_t(r->threads);

    std::error_code ec;
    const bool exists = uses_pool && std::filesystem::exists(r->pool_path, ec);
    if (!o->skip_load && exists) {
      r->error = "pool " + r->pool_path + " already exists: remove it, or pass --skip_load to run on its records";
      return;  // not ours: leave it alone
    }
    if (o->skip_load && uses_pool && !exists) {
      r->error = "--skip_load: no pool at " + r->pool_path + " (load it first with the same -n and --pool_path)";
      return;
    }
    if (o->skip_load && !uses_pool) {
      r->error = "--skip_load: " + spec.name + " is transient, there is nothing to reopen";
      return;
    }
    Status s = target->Open(topt);
    if (!s.ok()) return Fail("open: " + s.ToString());
    open = true;
    if (o->skip_load) {
      // The streams assume the pool holds exactly the ids [0, n) as loaded.
      if (Index* idx = target->index()) {
        uint64_t have = idx->Stats().records;
        if (have != o->records)
          return Fail("--skip_load: the pool holds " + std::to_string(have) + " records but -n is " + std::to_string(o->records) +
                      "; --skip_load needs a pool exactly as a load with the same -n left it");
      }
    }
    codec.reset(new KeyCodec(o->key_size, o->key_prefix, o->value_size));
    for (int t = 0; t < r->threads; t++) keys.emplace_back(t, r->threads, o->records);
  }

  PhaseContext Ctx() { return PhaseContext{o, codec.get(), target.get(), &keys, r->threads}; }

  // A step (the load, or one run phase) in rounds: Begin*, then RunRound for
  // every round, then EndStep.
  void BeginLoad() {
    if (failed()) return;
    if (!o->skip_load) {
      current.reset(new PhaseRun(Ctx(), nullptr, phase_no));
      current_load = true;
      step = "load";
    }
    phase_no++;
  }

  void Recovery() {
    if (failed() || !o->recovery) return;
    r->has_recovery = true;
    if (!uses_pool) {
      r->recovery_note = "transient index: nothing to recover";
      return;
    }
    target->Close();
    auto t0 = Clock::now();
    Status s = target->Open(topt);
    r->recovery_seconds = Since(t0, Clock::now());
    if (!s.ok()) return Fail("reopen for --recovery: " + s.ToString());
    if (Index* idx = target->index()) r->index_recovery_seconds = idx->Stats().recovery_seconds;
    // Check that the loaded records survived: look up about 1000 of them.
    std::vector<char> kb(o->key_size), vb(o->value_size + 8);
    const size_t per = 1000 / keys.size() + 1;
    for (auto& k : keys)
      for (size_t i = 0; i < k.live.size() && i < per; i++) {
        codec->EncodeKey(k.live[i], kb.data());
        r->recovery_probed++;
        r->recovery_found += target->tree()->find(kb.data(), kb.size(), vb.data());
      }
    if (r->recovery_found != r->recovery_probed)
      r->recovery_note = "only " + std::to_string(r->recovery_found) + " of " + std::to_string(r->recovery_probed) +
                         " sampled loaded records were found after reopening (not persistent?)";
  }

  void BeginPhase(const PhaseSpec& ph) {
    if (failed()) return;
    uint64_t live = 0;
    for (auto& k : keys) live += k.live.size();
    step = ph.name;
    auto skip = [&](const std::string& why) {
      skipped = PhaseResult();
      skipped->name = ph.name;
      skipped->ratios = ph.ratios;
      skipped->skipped = true;
      skipped->note = "skipped: " + why;
    };
    if (!r->ordered && ph.ratios[OpType::kScan] > 0) {
      skip(r->spec.name + " is unordered (no scans)");
    } else if (!o->time_mode && double(o->operations) * ph.ratios[OpType::kRemove] > double(live) * 0.95) {
      skip("about " + std::to_string(uint64_t(double(o->operations) * ph.ratios[OpType::kRemove])) + " removes but only " +
           std::to_string(live) + " live records (raise -n or lower -p)");
    } else {
      current.reset(new PhaseRun(Ctx(), &ph, phase_no));
      current_load = false;
    }
    phase_no++;
  }

  bool HasWork(int round, int rounds) const { return current && current->HasWork(round, rounds); }

  void RunRound(int round, int rounds, int position, const std::string* after) {
    if (!current) return;
    // "fptree read" with one round, "read round 3/10 fptree" with several.
    std::string label = rounds == 1 ? r->spec.name + " " + step
                                    : step + " round " + std::to_string(round + 1) + "/" + std::to_string(rounds) + " " + r->spec.name;
    current->RunChunk(round, rounds, position, after, label);
  }

  void EndStep() {
    if (current) {
      PhaseResult pr = current->Finish();
      current.reset();
      if (current_load) {
        r->load = std::move(pr);
        r->loaded = true;
      } else {
        r->phases.push_back(std::move(pr));
      }
    } else if (skipped) {
      r->phases.push_back(std::move(*skipped));
    }
    skipped.reset();
  }

  void Finish() {
    if (open) Cleanup();
  }
};

}  // namespace

Status ResolveTargets(const std::string& index_list, const std::string& input_list, std::vector<TargetSpec>* out) {
  out->clear();
  auto split = [](const std::string& s) {
    std::vector<std::string> v;
    size_t i = 0;
    while (i <= s.size()) {
      size_t j = s.find(',', i);
      if (j == std::string::npos) j = s.size();
      std::string item = s.substr(i, j - i);
      item.erase(0, item.find_first_not_of(" \t"));
      item.erase(item.find_last_not_of(" \t") + 1);
      if (!item.empty()) v.push_back(item);
      i = j + 1;
    }
    return v;
  };
  for (const auto& name : split(index_list)) {
    if (name == "all") {
      std::vector<std::string> names;
      for (const auto& i : pmindex::ListIndexes()) names.push_back(i.name);
      std::stable_partition(names.begin(), names.end(), [](const std::string& n) { return n == "dram_btree"; });
      for (const auto& n : names) out->push_back({n, ""});
      continue;
    }
    if (!pmindex::FindIndexInfo(name, nullptr)) {
      std::string m = "unknown index '" + name + "'; built-in:";
      for (const auto& i : pmindex::ListIndexes()) m += " " + i.name;
      return Status::InvalidArgument(m);
    }
    out->push_back({name, ""});
  }
  for (const auto& path : split(input_list)) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) return Status::InvalidArgument("--input: no plugin file at " + path);
    std::string stem = std::filesystem::path(path).stem().string();
    if (stem.rfind("lib", 0) == 0) stem = stem.substr(3);
    out->push_back({stem, path});
  }
  if (out->empty()) return Status::InvalidArgument("nothing to run: give --index NAME[,NAME...] and/or --input PLUGIN.so[,...]");
  return Status::OK();
}

void RemoveTemporaryPoolsOnSignals() {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) signal(sig, RemoveTempPoolsAndReraise);
}

int EffectiveRounds(const BenchOptions& opts, size_t ntargets) {
  if (opts.rounds > 0) return opts.rounds;
  if (ntargets <= 1 || opts.sequential) return 1;
  const int period = RoundPeriod(ntargets);
  return (kDefaultRounds + period - 1) / period * period;  // a whole number of periods
}

int RoundPeriod(size_t ntargets) { return ntargets <= 1 ? 1 : int(ntargets % 2 == 0 ? ntargets : 2 * ntargets); }

std::vector<size_t> RoundOrder(size_t ntargets, int round) {
  const size_t n = ntargets;
  std::vector<size_t> order(n);
  if (n == 0) return order;
  const int period = RoundPeriod(n);
  const int row = ((round % period) + period) % period;
  const size_t shift = size_t(row) % n;
  // Williams' first row 0, 1, n-1, 2, n-2, ..., shifted by the row number;
  // for odd n the rows n..2n-1 are the first n reversed.
  for (size_t k = 0; k < n; k++) {
    size_t a = k == 0 ? 0 : (k % 2 == 1 ? (k + 1) / 2 : n - k / 2);
    order[k] = (a + shift) % n;
  }
  if (size_t(row) >= n) std::reverse(order.begin(), order.end());
  return order;
}

uint64_t ChunkBegin(uint64_t quota, int round, int rounds) {
  return uint64_t((unsigned __int128)quota * unsigned(round) / unsigned(rounds));
}

Status RunBenchmark(const BenchOptions& opts, const std::vector<TargetSpec>& targets, std::vector<TargetResult>* results) {
  PMINDEX_RETURN_IF_ERROR(opts.Validate());
  pmindex::pm::SetPersistMode(opts.persist_mode, opts.write_latency_ns);
  results->clear();
  results->resize(targets.size());
  std::vector<PhaseSpec> phases = opts.phases;
  if (phases.empty()) phases.push_back({"run", opts.ratios});
  const int rounds = EffectiveRounds(opts, targets.size());
  // Runs every step on a group of targets: interleaved, every target is
  // loaded, then every target runs phase 1, then phase 2, ... each step in
  // `rounds` rounds with rotating order (see bench.h), so that a change in
  // background load over time, and whatever running right after another
  // index costs, hits all of them alike (the ratios are what matter).
  auto run_group = [&](size_t first, size_t n) {
    std::vector<TargetRun> runs(n);
    for (size_t i = 0; i < n; i++) {
      runs[i].o = &opts;
      runs[i].r = &(*results)[first + i];
      runs[i].Setup(targets[first + i], first + i, targets.size());
    }
    int step_no = 0;
    auto step = [&](auto begin) {
      for (auto& t : runs) begin(t);
      // Each round's order is over the targets that run in it (a failed
      // target, a skipped phase or an empty chunk leaves no hole), and the
      // design's rows are offset by the step number so that the baseline
      // does not open every step (--rounds 1 keeps the order given).
      const std::string* prev = nullptr;  // the target whose chunk ran last
      for (int r = 0; r < rounds; r++) {
        std::vector<size_t> active;
        for (size_t i = 0; i < n; i++)
          if (runs[i].HasWork(r, rounds)) active.push_back(i);
        const std::vector<size_t> order = RoundOrder(active.size(), rounds > 1 ? r + step_no : 0);
        std::vector<bool> ran(n, false);
        for (size_t k = 0; k < order.size(); k++) {
          TargetRun& t = runs[active[order[k]]];
          t.RunRound(r, rounds, int(k), prev);
          ran[active[order[k]]] = true;
          prev = &t.r->spec.name;
        }
        for (size_t i = 0; i < n; i++)
          if (!ran[i]) runs[i].RunRound(r, rounds, -1, nullptr);  // records the empty chunk, if any
      }
      for (auto& t : runs) t.EndStep();
      step_no++;
    };
    step([](TargetRun& t) { t.BeginLoad(); });
    for (auto& t : runs) t.Recovery();  // a one-shot step: no rounds
    for (const auto& ph : phases) step([&](TargetRun& t) { t.BeginPhase(ph); });
    for (auto& t : runs) t.Finish();
  };
  if (opts.sequential || targets.size() == 1) {
    for (size_t i = 0; i < targets.size(); i++) run_group(i, 1);
  } else {
    run_group(0, targets.size());
  }
  return Status::OK();
}

}  // namespace pmbench
