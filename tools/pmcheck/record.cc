// pmcheck's recording stage (issue 5, "Simulator"): runs the seeded
// workload on a fresh index with the recorder installed as the persist
// observer, optionally under the PCT scheduler (scheduler.h), checks every
// op's result during the run, and hands the log to the replay
// (simulator.cc), which turns it into crash images.
// This file stores to PM only through the index under test (the pool being
// recorded); it never writes a crash image.
//
// Thread-safety: Record runs the workload's threads itself; the driver
// calls it from one thread at a time (it installs a process-wide observer).
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <thread>

#include "checker_internal.h"
#include "pmindex/pm/persist.h"
#include "recorder.h"

namespace pmcheck {

using pmindex::Status;
namespace pm = pmindex::pm;

// ---------------------------------------------------------------------------
// Recording.

uint64_t ScheduleSeed(const Config& c) {
  if (c.threads < 2 || c.pct < 0) return 0;
  return c.schedule_seed ? c.schedule_seed : c.seed;
}
// --shared-writes: how many writes of the keys every thread writes took
// effect, and how many of them overlapped another thread's write of the key.
static void CountSharedWrites(const Recorder& rec, const Workload& wl, Report* report) {
  std::vector<const OpRecord*> w;
  for (const OpRecord& r : rec.ops)
    if (r.op.type != OpType::kCreate && wl.SharedWrite(r.op.kid) && r.result == Status::Code::kOk &&
        r.op.type != OpType::kFind && r.op.type != OpType::kScan)
      w.push_back(&r);
  report->shared_writes += w.size();
  for (const OpRecord* a : w) {
    bool overlap = false;
    for (const OpRecord* b : w)
      overlap |= a != b && a->op.kid == b->op.kid && a->op.tid != b->op.tid && a->begin < b->end && b->begin < a->end;
    report->shared_overlaps += overlap;
  }
}

Status Record(const Config& c, Target* target, const Workload& wl, Report* report, Recording* out) {
  const std::string path = PoolPath(c, "rec");
  target->Remove(path);
  PMINDEX_RETURN_IF_ERROR(target->Prepare(path));
  // Under a PCT schedule one thread runs at a time and gives the CPU away
  // only after its last store was logged, so flushed lines can be compared
  // with the shadow in multi-threaded runs too.
  const bool scheduled = c.threads > 1 && c.pct >= 0;
  out->rec = std::make_unique<Recorder>(target->base(), target->max_size(), [target] { return target->size(); },
                                        c.threads == 1 || scheduled);
  if (c.threads > 1 && !scheduled) out->rec->PerturbSchedule(c.seed);
  Recorder& rec = *out->rec;
  rec.TraceLine(c.trace_line);
  rec.DropFenceSite(c.drop_fence);
  rec.DropSiteNamed(c.drop_site);
  Recorder::SetThreadId(0);
  pm::SetObserver(&rec);
  std::unique_ptr<pmindex::Index> idx;
  Op create;
  create.type = OpType::kCreate;
  size_t r = rec.BeginOp(create);
  Status st = target->CreateIndex(&idx);
  rec.EndOp(r, st.code());
  if (!st.ok()) {
    pm::SetObserver(nullptr);
    target->Remove(path);
    return Status::InvalidArgument("creating " + c.index + " failed: " + st.ToString());
  }
  std::vector<uint32_t> state(wl.num_keys(), 0);
  std::mutex mu;
  std::vector<Failure> wrong;
  std::atomic<int> ready{0};
  std::unique_ptr<PctScheduler> sched;
  if (scheduled) {
    out->schedule_seed = ScheduleSeed(c);
    // Change points are drawn over the run's ops (scheduler.h).
    sched = std::make_unique<PctScheduler>(c.threads, c.pct, out->schedule_seed, c.ops * uint64_t(c.threads));
    rec.SetScheduler(sched.get());
    rec.SetSpinHook(c.spin_hook);
  }
  // The backstop of a scheduled recording (--pct-timeout).
  std::unique_ptr<PctWatchdog> watchdog;
  if (sched && c.pct_timeout > 0) watchdog = std::make_unique<PctWatchdog>(sched.get(), c.pct_timeout, c.pct, out->schedule_seed);
  auto worker = [&](int t) {
    Recorder::SetThreadId(t);
    if (sched) sched->Start(t);
    // Start together, so that the threads' ops really overlap (a schedule
    // needs no barrier: the scheduler decides who runs).
    ready.fetch_add(1);
    while (c.threads > 1 && !sched && ready.load() < c.threads) std::this_thread::yield();
    std::string got;
    for (const Op& op : wl.ops()[size_t(t)]) {
      got.clear();
      size_t rr = rec.BeginOp(op);
      Status s = wl.Apply(idx.get(), op, &got);
      rec.EndOp(rr, s.code(), s.ok() ? wl.Reads(op, got) : std::vector<std::pair<uint32_t, uint32_t>>{});
      // Only the owner writes a key (and reads its state); a Find of
      // another thread's key (shared keys) can only be checked for sense.
      // Keys every thread writes (--shared-writes): results checked for sense.
      const bool own = wl.Owner(op.kid) == t;
      std::string err = op.type != OpType::kScan && wl.SharedWrite(op.kid) ? wl.CheckSharedWrite(op, s.code(), got)
                        : own || op.type == OpType::kScan ? wl.CheckResult(op, s.code(), own ? state[op.kid] : 0, got)
                                                          : wl.CheckSharedFind(op, s.code(), got);
      if (err.empty() && op.type == OpType::kScan && s.ok()) err = wl.CheckScan(op, got, state);
      if (!err.empty()) {
        std::lock_guard<std::mutex> g(mu);
        wrong.push_back({FailKind::kInvariant, "during the workload, op " + std::to_string(rr) + " on key " + KeyName(wl, op.kid) + ": " + err});
      }
      if (own) state[op.kid] = Workload::After(op, s.code(), state[op.kid]);
    }
    if (sched) sched->Finish(t);
  };
  if (c.threads == 1) {
    worker(0);
  } else {
    std::vector<std::thread> th;
    for (int t = 0; t < c.threads; ++t) th.emplace_back(worker, t);
    for (auto& t : th) t.join();
  }
  watchdog.reset();
  rec.SetScheduler(nullptr);
  if (sched) {
    report->schedules_run++;
    report->schedule_switches += sched->switches();
    report->schedule_stalls += sched->stalls();
    report->schedule_spins += sched->spins();
    report->schedule_steps += sched->steps();
    report->schedule_changes += sched->changes();
    report->schedule_hash = sched->hash();
  }
  Recorder::SetThreadId(0);
  rec.FinalCheck();
  if (!c.site_counts.empty()) {
    if (FILE* f = std::fopen(c.site_counts.c_str(), "a")) {
      for (const auto& [site, n] : rec.flush_site_counts)
        std::fprintf(f, "flush %s %llu\n", Recorder::SiteName(site).c_str(), static_cast<unsigned long long>(n));
      const auto& order = rec.fence_site_order();
      for (const auto& [site, n] : rec.fence_site_counts) {
        const size_t k = size_t(std::find(order.begin(), order.end(), site) - order.begin()) + 1;
        std::fprintf(f, "fence %s %llu %zu\n", Recorder::SiteName(site).c_str(), static_cast<unsigned long long>(n), k);
      }
      std::fclose(f);
    }
  }
  pm::SetObserver(nullptr);
  idx->Close();
  idx.reset();
  target->Remove(path);
  for (auto& f : wrong) {
    f.schedule_seed = out->schedule_seed;
    report->Add(c, std::move(f));
  }
  for (auto& f : rec.findings) {
    f.schedule_seed = out->schedule_seed;
    if (f.kind == FailKind::kMissingFlush || f.kind == FailKind::kMissingFence || f.kind == FailKind::kErratum) {
      if (!c.lint) continue;  // counted in the lint section only
    }
    report->Add(c, f);
  }
  report->redundant_flushes = rec.redundant_flushes;
  report->empty_fences = rec.empty_fences;
  report->flushes = rec.flushes;
  report->fences = rec.fences;
  report->missing_flushes = rec.missing_flushes;
  report->erratum_reads = rec.erratum_reads;
  report->acting_loads = rec.acting_loads;
  report->unflushed_loads = rec.unflushed_loads;
  report->caught_up_stores += rec.caught_up_stores;
  report->ops_recorded = rec.ops.size();
  CountSharedWrites(rec, wl, report);
  report->fence_sites = rec.fence_sites();
  report->fences_dropped = rec.fences_dropped;
  report->dropped_site = rec.dropped_site;
  report->named_drops += rec.named_drops;
  report->events = rec.events.size();
  return Status::OK();
}

}  // namespace pmcheck
