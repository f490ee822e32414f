// pmcheck's recorder and durability lint (see recorder.h for the rules).
// It only reads PM (the bytes a primitive just wrote, and lines at flushes);
// it never writes PM. Reads use relaxed atomic loads so that a lock-free
// writer in another thread does not make the checker itself racy under TSan.
#include "recorder.h"

#include <algorithm>
#include <dlfcn.h>
#include <execinfo.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <chrono>
#include <thread>

namespace pmcheck {

namespace pm = pmindex::pm;

namespace {
thread_local int tl_tid = -1;
thread_local uint64_t tl_line_writes_seen = 0;

inline void AtomicRead(char* dst, const char* src, size_t n) {
  size_t i = 0;
  while (i < n) {
    if ((reinterpret_cast<uintptr_t>(src + i) & 7) == 0 && i + 8 <= n) {
      uint64_t v = __atomic_load_n(reinterpret_cast<const uint64_t*>(src + i), __ATOMIC_RELAXED);
      std::memcpy(dst + i, &v, 8);
      i += 8;
    } else {
      dst[i] = __atomic_load_n(src + i, __ATOMIC_RELAXED);
      ++i;
    }
  }
}

std::string Off(uint64_t o) { return "@" + std::to_string(o); }
// The first and last byte where two 64-byte lines differ; false if equal.
bool DiffRange(const char* a, const char* b, int* first, int* last) {
  if (std::memcmp(a, b, 64) == 0) return false;
  *first = 0;
  *last = 63;
  while (a[*first] == b[*first]) ++*first;
  while (a[*last] == b[*last]) --*last;
  return true;
}
}  // namespace

void Recorder::SetThreadId(int tid) { tl_tid = tid; }

Recorder::Recorder(char* base, uint64_t max_size, std::function<uint64_t()> size_fn, bool check_each_flush)
    : base_(base), max_size_(max_size), size_fn_(std::move(size_fn)), check_each_flush_(check_each_flush) {
  cur_size_ = size_fn_();
  shadow_.resize(cur_size_);
  AtomicRead(shadow_.data(), base_, cur_size_);
  initial = shadow_;
  durable_ = shadow_;
  tl_line_writes_seen = pm::ThreadCounters().line_writes;
}

int Recorder::Tid() {
  if (tl_tid < 0) tl_tid = next_foreign_tid_++;
  return tl_tid;
}

bool Recorder::InRange(const void* addr, size_t size, uint64_t* off) {
  const char* p = static_cast<const char*>(addr);
  if (p < base_ || uint64_t(p - base_) + size > max_size_) {
    ++foreign_events;
    return false;
  }
  *off = uint64_t(p - base_);
  // The pool's size word is stored after the file grew: a growth is logged
  // before the store that publishes it (the header's size), so every crash
  // image that keeps that store has the grown file.
  if (*off + size > cur_size_ || size_fn_() > cur_size_) {
    uint64_t n = size_fn_();
    uint64_t need = (*off + size + 4095) & ~uint64_t(4095);
    if (n < need) n = need;
    Log(Ev::kGrow, Tid(), n, 0, 0);
    cur_size_ = n;
    shadow_.resize(n, 0);  // grown bytes are zero and durable
    durable_.resize(n, 0);
  }
  return true;
}

void Recorder::Log(Ev kind, int tid, uint64_t off, uint32_t size, uint64_t aux) {
  events.push_back(Event{kind, int16_t(tid), size, off, aux});
}

void Recorder::CopyIn(uint64_t off, size_t size) {
  size_t a = arena.size();
  arena.resize(a + size);
  AtomicRead(arena.data() + a, base_ + off, size);
  std::memcpy(shadow_.data() + off, arena.data() + a, size);
}

std::string Recorder::OpLabel(const ThreadState& ts) const {
  return ts.op >= 0 ? OpName(ops[size_t(ts.op)].op.type) : "(no op)";
}

void Recorder::Finding(FailKind k, std::string what) {
  Failure f;
  f.kind = k;
  f.what = std::move(what);
  findings.push_back(std::move(f));
}

void Recorder::Trace(const char* what, uint64_t off, size_t size) {
  if (trace_line_ < 0 || off + size <= uint64_t(trace_line_) || off >= uint64_t(trace_line_) + 64) return;
  const int tid = Tid();
  const ThreadState& ts = threads_[tid];
  std::fprintf(stderr, "pmcheck trace: event %zu: %s @%llu+%zu by thread %d in op %lld (%s)\n", events.size(), what,
               static_cast<unsigned long long>(off), size, tid, static_cast<long long>(ts.op), OpLabel(ts).c_str());
  void* frames[24];
  int n = backtrace(frames, 24);
  backtrace_symbols_fd(frames, n, STDERR_FILENO);
}

bool Recorder::Differs(uint64_t line) const {
  if (line + 64 > cur_size_) return true;
  return std::memcmp(shadow_.data() + line, durable_.data() + line, 64) != 0;
}

namespace {
thread_local bool tl_shared_store = false;  // the last store hit a line another thread acts on
}  // namespace

void Recorder::MaybeYield(bool shared_line) {
  if (!perturb_seed_) return;
  thread_local uint64_t x = 0;
  if (!x) x = perturb_seed_ ^ (uint64_t(tl_tid + 2) * 0x9E3779B97F4A7C15ull);
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  // A store to a line other threads load and act on (a link word) opens the
  // window the erratum lint looks for: hold it open for a while. Otherwise
  // mostly a yield, now and then a short sleep, which on a loaded machine is
  // what actually lets another thread run inside this one's persist window.
  if (shared_line && x % 2 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
  else if (x % 6 == 0) std::this_thread::sleep_for(std::chrono::microseconds(30));
  else if (x % 3 == 0) std::this_thread::yield();
}

void Recorder::SchedulePoint(bool load) {
  if (sched_) sched_->Point(tl_tid, load);
}

void Recorder::Store(const void* addr, size_t size, bool is_volatile) {
  tl_shared_store = false;
  StoreLocked(addr, size, is_volatile);
  if (sched_) SchedulePoint(false);
  else MaybeYield(tl_shared_store);
}

void Recorder::StoreLocked(const void* addr, size_t size, bool is_volatile) {
  std::lock_guard<std::mutex> g(mu_);
  uint64_t off;
  if (size == 0 || !InRange(addr, size, &off)) return;
  Trace(is_volatile ? "volatile store" : "store", off, size);
  const int tid = Tid();
  const uint64_t aux = arena.size();
  CopyIn(off, size);
  Log(Ev::kStore, tid, off, uint32_t(size), aux);
  if (!caught_up_.empty()) Confirm(off, size);
  if (is_volatile) return;
  ThreadState& ts = threads_[tid];
  for (uint64_t l = off & ~uint64_t(63); l < off + size; l += 64) {
    LineState& ls = lines_[l];
    ls.dirty = true;
    ls.writer = tid;
    if (ls.loaders & ~(uint64_t(1) << (tid % 64))) tl_shared_store = true;
    if (ts.op >= 0) ts.written.insert(l);
  }
}

void Recorder::OnNonTemporalStore(const void* addr, size_t size) {
  NonTemporalLocked(addr, size);
  SchedulePoint(false);
}

void Recorder::NonTemporalLocked(const void* addr, size_t size) {
  std::lock_guard<std::mutex> g(mu_);
  // AtomicLineWrite and a 64-byte CopyNT both report here; the thread's
  // line-write counter tells them apart.
  const uint64_t lw = pm::ThreadCounters().line_writes;
  const bool line_write = lw != tl_line_writes_seen;
  tl_line_writes_seen = lw;
  uint64_t off;
  if (size == 0 || !InRange(addr, size, &off)) return;
  const int tid = Tid();
  const uint64_t aux = arena.size();
  CopyIn(off, size);
  std::memcpy(durable_.data() + off, shadow_.data() + off, size);
  Log(line_write && size == 64 && off % 64 == 0 ? Ev::kLine : Ev::kNT, tid, off, uint32_t(size), aux);
  threads_[tid].unfenced = true;
}

// Free-running multi-threaded recordings: another thread may have made a
// store whose OnStore has not been logged yet (the observer runs after the
// memory effect). A real flush writes back whatever the line holds, so the
// bytes that differ from the shadow are logged here as a store of the
// flushing thread, before its flush; the writer's own log entry follows
// later with the same bytes. Without this, a value another thread already
// read and made durable would be missing from every crash image between
// this flush and the writer's log entry: a false "lost read".
void Recorder::CatchUpLocked(uint64_t line, int tid) {
  if (line + 64 > cur_size_) return;
  char now[64];
  AtomicRead(now, base_ + line, 64);
  const char* sh = shadow_.data() + line;
  int first, last;
  if (!DiffRange(now, sh, &first, &last)) return;
  uint64_t& mask = caught_up_[line];
  for (int i = first; i <= last; ++i)
    if (now[i] != sh[i]) mask |= uint64_t(1) << i;
  const uint64_t aux = arena.size();
  arena.insert(arena.end(), now + first, now + last + 1);
  std::memcpy(shadow_.data() + line + first, now + first, size_t(last - first + 1));
  Log(Ev::kStore, tid, line + uint64_t(first), uint32_t(last - first + 1), aux);
  ++caught_up_stores;
}

void Recorder::CheckLine(uint64_t line, const char* when) {
  if (line + 64 > cur_size_) return;
  char now[64];
  AtomicRead(now, base_ + line, 64);
  int first, last;
  if (!DiffRange(now, shadow_.data() + line, &first, &last)) return;
  Finding(FailKind::kUnloggedStore, "bytes " + Off(line + first) + ".." + Off(line + last) +
                                        " changed without a pm:: store primitive (found " + when + ")");
  std::memcpy(shadow_.data() + line, now, 64);  // report once
}

std::string Recorder::SiteName(uintptr_t site) {
  Dl_info info;
  char buf[64];
  // The return address points after the call: the site is the byte before.
  if (dladdr(reinterpret_cast<void*>(site), &info) && info.dli_fname) {
    const char* slash = std::strrchr(info.dli_fname, '/');
    std::snprintf(buf, sizeof buf, "+0x%llx", static_cast<unsigned long long>(site - uintptr_t(info.dli_fbase)));
    return std::string(slash ? slash + 1 : info.dli_fname) + buf;
  }
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(site));
  return buf;
}

bool Recorder::DroppedByName(uintptr_t site) {
  if (drop_name_.empty()) return false;
  auto it = drop_named_.find(site);
  if (it == drop_named_.end()) it = drop_named_.emplace(site, SiteName(site) == drop_name_).first;
  return it->second;
}

__attribute__((noinline)) void Recorder::OnFlush(const void* line) {
  const uintptr_t site = reinterpret_cast<uintptr_t>(__builtin_return_address(0));
  {
    std::lock_guard<std::mutex> g(mu_);
    if (DroppedByName(site)) {
      ++named_drops;
      return;
    }
    flush_site_counts[site]++;
  }
  FlushLocked(line, site);
  if (sched_) SchedulePoint(false);
  else MaybeYield(false);
}

void Recorder::FlushLocked(const void* line, uintptr_t site) {
  std::lock_guard<std::mutex> g(mu_);
  uint64_t off;
  if (!InRange(line, 64, &off)) return;
  Trace("flush", off, 64);
  const int tid = Tid();
  if (!check_each_flush_) CatchUpLocked(off, tid);
  Log(Ev::kFlush, tid, off, 64, site);
  ThreadState& ts = threads_[tid];
  const std::string label = OpLabel(ts);
  flushes[label]++;
  LineState& ls = lines_[off];
  if (!ls.dirty) redundant_flushes[label]++;
  ls.dirty = false;
  ts.unfenced = true;
  if (check_each_flush_) CheckLine(off, ("at a flush during " + label).c_str());
  if (off + 64 <= cur_size_) std::memcpy(durable_.data() + off, shadow_.data() + off, 64);
  for (uint64_t t : ts.tainted) {
    auto it = lines_.find(t);
    if (it != lines_.end() && it->second.dirty && Differs(t)) {
      ++erratum_reads;
      if (finding_counts_[label + "/erratum@" + std::to_string(t)]++ == 0) {
        Finding(FailKind::kErratum, "thread " + std::to_string(tid) + " (" + label + ") read line " + Off(t) +
                                        " written by thread " + std::to_string(it->second.writer) +
                                        " and not yet flushed, then flushed " + Off(off) + " before that line was durable");
      }
    }
  }
  ts.tainted.clear();
}

__attribute__((noinline)) void Recorder::OnFence() {
  FenceLocked(reinterpret_cast<uintptr_t>(__builtin_return_address(0)));
  SchedulePoint(false);
}

void Recorder::FenceLocked(uintptr_t site) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = std::find(fence_sites_.begin(), fence_sites_.end(), site);
  if (it == fence_sites_.end()) it = fence_sites_.insert(fence_sites_.end(), site);
  if (uint64_t(it - fence_sites_.begin()) + 1 == drop_site_) {
    if (fences_dropped++ == 0) dropped_site = SiteName(site);
    return;
  }
  if (DroppedByName(site)) {
    ++named_drops;
    return;
  }
  fence_site_counts[site]++;
  const int tid = Tid();
  Log(Ev::kFence, tid, 0, 0, site);
  ThreadState& ts = threads_[tid];
  const std::string label = OpLabel(ts);
  fences[label]++;
  if (!ts.unfenced) empty_fences[label]++;
  ts.unfenced = false;
}

void Recorder::OnSpin() {
  if (sched_ && spin_hook_) sched_->Spin(tl_tid);
}

void Recorder::OnLoad(const void* addr, size_t size) {
  LoadLocked(addr, size);
  SchedulePoint(true);
}

void Recorder::LoadLocked(const void* addr, size_t size) {
  std::lock_guard<std::mutex> g(mu_);
  uint64_t off;
  if (size == 0 || !InRange(addr, size, &off)) return;
  const int tid = Tid();
  ++acting_loads;
  lines_[off & ~uint64_t(63)].loaders |= uint64_t(1) << (tid % 64);
  auto it = lines_.find(off & ~uint64_t(63));
  if (it != lines_.end() && it->second.dirty && it->second.writer != tid && Differs(it->first)) {
    ++unflushed_loads;
    threads_[tid].tainted.push_back(it->first);
  }
}

size_t Recorder::BeginOp(const Op& op) {
  const size_t rec = BeginOpLocked(op);
  if (sched_) sched_->OpBegin(tl_tid);
  return rec;
}

size_t Recorder::BeginOpLocked(const Op& op) {
  std::lock_guard<std::mutex> g(mu_);
  const int tid = Tid();
  const size_t rec = ops.size();
  OpRecord r;
  r.op = op;
  r.begin = int64_t(events.size());
  ops.push_back(r);
  Log(Ev::kOpBegin, tid, 0, 0, rec);
  ThreadState& ts = threads_[tid];
  ts.op = int64_t(rec);
  ts.written.clear();
  ts.tainted.clear();
  return rec;
}

void Recorder::EndOp(size_t rec, pmindex::Status::Code result, std::vector<std::pair<uint32_t, uint32_t>> reads) {
  EndOpLocked(rec, result, std::move(reads));
  SchedulePoint(false);
}

void Recorder::EndOpLocked(size_t rec, pmindex::Status::Code result, std::vector<std::pair<uint32_t, uint32_t>> reads) {
  std::lock_guard<std::mutex> g(mu_);
  const int tid = Tid();
  ops[rec].end = int64_t(events.size());
  ops[rec].result = result;
  ops[rec].reads = std::move(reads);
  Log(Ev::kOpEnd, tid, 0, 0, rec);
  ThreadState& ts = threads_[tid];
  const std::string label = OpLabel(ts);
  std::vector<uint64_t> missing;
  for (uint64_t l : ts.written) {
    const LineState& ls = lines_[l];
    if (ls.dirty && ls.writer == tid && Differs(l)) missing.push_back(l);
  }
  if (!missing.empty()) {
    std::sort(missing.begin(), missing.end());
    missing_flushes[label] += missing.size();
    // One finding per (op type, first missing line); repeats are counted only.
    if (finding_counts_[label + "/flush@" + std::to_string(missing[0])]++ == 0) {
      std::string what = "op " + std::to_string(rec) + " (" + label + ", thread " + std::to_string(tid) + ") returned with " +
                         std::to_string(missing.size()) + " line(s) it wrote unflushed:";
      for (size_t i = 0; i < missing.size() && i < 4; ++i) what += " " + Off(missing[i]);
      what += " (later " + label + " ops leaving " + Off(missing[0]) + " unflushed are counted, not listed; --trace-line " +
              std::to_string(missing[0]) + " shows the stores)";
      Finding(FailKind::kMissingFlush, what);
    }
  }
  if (ts.unfenced && finding_counts_[label + "/fence"]++ == 0)
    Finding(FailKind::kMissingFence, "op " + std::to_string(rec) + " (" + label + ", thread " + std::to_string(tid) +
                                         ") returned with flushes or NT stores not ordered by a fence");
  ts.unfenced = false;
  ts.op = -1;
  ts.written.clear();
  ts.tainted.clear();
}

void Recorder::FinalCheck() {
  std::lock_guard<std::mutex> g(mu_);
  uint64_t n = size_fn_();
  if (n > cur_size_) {
    Log(Ev::kGrow, Tid(), n, 0, 0);
    cur_size_ = n;
    shadow_.resize(n, 0);
    durable_.resize(n, 0);
  }
  for (uint64_t l = 0; l + 64 <= cur_size_; l += 64) CheckLine(l, "at the end of the workload");
  // Bytes a flush caught up that no store primitive ever logged: a store
  // that bypassed the primitives, seen by a free-running multi-threaded run.
  for (const auto& [line, mask] : caught_up_) {
    if (!mask) continue;
    const int first = __builtin_ctzll(mask), last = 63 - __builtin_clzll(mask);
    Finding(FailKind::kUnloggedStore, "bytes " + Off(line + uint64_t(first)) + ".." + Off(line + uint64_t(last)) +
                                          " changed without a pm:: store primitive (written back by a flush, never logged)");
  }
  caught_up_.clear();
}

void Recorder::Confirm(uint64_t off, size_t size) {
  for (uint64_t l = off & ~uint64_t(63); l < off + size; l += 64) {
    auto it = caught_up_.find(l);
    if (it == caught_up_.end()) continue;
    const uint64_t lo = std::max(off, l) - l, hi = std::min(off + size, l + 64) - l;  // [lo, hi) within the line
    const uint64_t covered = (hi - lo == 64) ? ~uint64_t(0) : ((uint64_t(1) << (hi - lo)) - 1) << lo;
    it->second &= ~covered;
    if (!it->second) caught_up_.erase(it);
  }
}

}  // namespace pmcheck
