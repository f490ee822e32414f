// pmcheck's driver: runs the simulator (simulator.cc) and the kill mode
// (kill.cc) for one Config, and formats the report and the reproducer
// command lines (issue 5; docs/pmcheck.md describes the failure model).
//
// Invariants: faults enabled for a run (--fault) are disabled again when the
// run ends; a report keeps at most max_reported failures per kind but counts
// them all.
// This file writes no PM: the simulator writes crash-image files, never a
// live pool.
//
// Thread-safety: Run is called by one thread at a time (the simulator installs
// a process-wide persist observer and forks).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <sstream>

#include "checker_internal.h"
#include "pmindex/pm/fault.h"
#include "pmindex/pm/persist.h"
#include "recorder.h"

// Under AddressSanitizer: a smaller quarantine. pmcheck forks a child per
// crash image, and fork copies the page tables of the whole process; with
// ASan's default 256 MiB quarantine of freed memory that copy made
// pmcheck_index_test spend 126 s in the kernel (16 MiB: 41 s). Use-after-
// free within an image's verification is still caught. ASAN_OPTIONS in the
// environment overrides this. Unused in builds without ASan.
extern "C" __attribute__((used, visibility("default"))) const char* __asan_default_options() {
  return "quarantine_size_mb=16";
}

namespace pmcheck {

using pmindex::Status;
namespace pm = pmindex::pm;

const char* FailKindName(FailKind k) {
  switch (k) {
    case FailKind::kLostAck: return "lost acknowledged op";
    case FailKind::kPartialOp: return "partial op";
    case FailKind::kTorn: return "torn data";
    case FailKind::kInvariant: return "invariant violation";
    case FailKind::kLeak: return "leak";
    case FailKind::kRecoveryCrash: return "recovery crash";
    case FailKind::kUnloggedStore: return "unlogged store";
    case FailKind::kMissingFlush: return "missing flush";
    case FailKind::kMissingFence: return "missing fence";
    case FailKind::kErratum: return "erratum read";
    case FailKind::kLostRead: return "lost read";
    case FailKind::kSetup: return "setup";
    case FailKind::kCount: break;
  }
  return "?";
}

uint64_t Report::total_failures() const {
  uint64_t n = 0;
  for (uint64_t c : counts) n += c;
  return n;
}

void Report::Add(const Config& c, Failure f) {
  uint64_t& n = counts[size_t(f.kind)];
  if (n++ < c.max_reported) failures.push_back(std::move(f));
}

// The names carry 64 random bits drawn once per process (forked children
// share them), so another user of the directory cannot predict and plant them.
std::string PoolPath(const Config& c, const char* what) {
  static const std::string token = [] {
    std::random_device rd;
    char buf[17];
    std::snprintf(buf, sizeof buf, "%08x%08x", unsigned(rd()), unsigned(rd()));
    return std::string(buf);
  }();
  return c.dir + "/pmcheck-" + c.index + "-" + std::to_string(::getpid()) + "-" + token + "-" + what + ".pool";
}


Status Run(const Config& c, Report* report) {
  if (c.threads < 1 || c.threads > 64) return Status::InvalidArgument("--threads must be in [1, 64]");
  if (c.images_per_point < 1) return Status::InvalidArgument("--images-per-point must be >= 1");
  if (c.timeout_s <= 0) return Status::InvalidArgument("--timeout must be > 0");
  if (c.sweep && (c.drain || c.shared_keys)) return Status::InvalidArgument("--sweep takes neither --drain nor --shared-keys");
  if (c.shared_writes && (!c.shared_keys || c.threads < 2))
    return Status::InvalidArgument("--shared-writes needs --shared-keys and --threads 2 or more");
  if (c.shared_writes && c.index == "allocator")
    return Status::InvalidArgument("--shared-writes: the allocator target has no keys to share");
  std::unique_ptr<Target> target;
  PMINDEX_RETURN_IF_ERROR(MakeTarget(c, &target));
  if (c.threads > 1 && !target->concurrent())
    return Status::InvalidArgument(c.index + " is not concurrent (single-threaded index): use --threads 1");
  for (const auto& f : c.faults) PMINDEX_RETURN_IF_ERROR(pm::EnableFault(f));

  if (c.ops > 0 && (c.points != 0 || c.only_point >= 0 || c.window_images > 0 || c.lint || c.kills == 0)) {
    // Several PCT schedules of one workload share the crash-point budget.
    const uint64_t n = ScheduleSeed(c) && c.only_point < 0 ? std::max<uint64_t>(1, c.schedules) : 1;
    for (uint64_t i = 0; i < n; ++i) {
      Config ci = c;
      if (n > 1) {
        ci.schedule_seed = ScheduleSeed(c) + i;
        if (c.image_budget) ci.image_budget = std::max<uint64_t>(1, c.image_budget / n);
        if (c.points > 0) ci.points = std::max<int64_t>(1, c.points / int64_t(n));
        if (c.window_images) ci.window_images = std::max<uint64_t>(1, c.window_images / n);
      }
      const size_t first = report->failures.size();
      Workload wl(ci, ci.threads, ci.ops, ci.seed);
      Recording recording;
      auto t0 = std::chrono::steady_clock::now();
      Status s = Record(ci, target.get(), wl, report, &recording);
      auto t1 = std::chrono::steady_clock::now();
      report->record_seconds += std::chrono::duration<double>(t1 - t0).count();
      if (!s.ok()) {
        for (const auto& f : c.faults) pm::DisableFault(f);
        return s;
      }
      if (ci.only_point >= 0 && (ci.only_point >= int64_t(recording.rec->events.size())))
        return Status::InvalidArgument("--point " + std::to_string(ci.only_point) + " is past the end of the log (" +
                                       std::to_string(recording.rec->events.size()) + " events)");
      if (ci.points != 0 || ci.only_point >= 0 || ci.window_images > 0) Replay(ci, target.get(), wl, *recording.rec, report);
      report->replay_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
      for (size_t j = first; j < report->failures.size(); ++j)
        if (!report->failures[j].schedule_seed) report->failures[j].schedule_seed = recording.schedule_seed;
    }
  }
  if (c.kills > 0 && c.only_point < 0) {
    auto t0 = std::chrono::steady_clock::now();
    Status s = RunKill(c, target.get(), report);
    report->kill_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!s.ok()) {
      for (const auto& f : c.faults) pm::DisableFault(f);
      return s;
    }
  }
  for (const auto& f : c.faults) pm::DisableFault(f);
  return Status::OK();
}

std::string Reproducer(const Config& c, const Failure& f) {
  std::string s = "pmcheck --index " + c.index + " --ops " + std::to_string(c.ops) + " --seed " + std::to_string(c.seed);
  if (c.keys) s += " --keys " + std::to_string(c.keys);
  if (c.threads != 1) s += " --threads " + std::to_string(c.threads);
  if (c.key_kind != pmindex::KeyKind::kU64) s += " --key-kind bytes";
  if (c.value_kind != pmindex::ValueKind::kU64) s += " --value-kind bytes";
  if (c.pool_size != (8ull << 20)) s += " --pool-mb " + std::to_string(c.pool_size >> 20);
  for (const auto& [k, v] : c.params) s += " --param " + k + "=" + v;
  for (const auto& fl : c.faults) s += " --fault " + fl;
  if (c.drop_fence) s += " --drop-fence " + std::to_string(c.drop_fence);
  if (!c.drop_site.empty()) s += " --drop-site " + c.drop_site;
  if (f.schedule_seed) s += " --pct " + std::to_string(c.pct) + " --schedule-seed " + std::to_string(f.schedule_seed);
  if (f.schedule_seed && !c.spin_hook) s += " --no-spin-hook";
  if (c.shared_keys) s += " --shared-keys";
  if (c.shared_writes) s += " --shared-writes";
  if (c.drain) s += " --drain";
  if (c.sweep) s += " --sweep";
  if (!c.read_rule) s += " --no-read-rule";
  if (!c.unfenced_image) s += " --no-unfenced-image";
  if (c.window_images && f.image > c.images_per_point) s += " --window-images " + std::to_string(c.window_images);
  if (c.recovery_crashes && f.point >= 0) {
    s += " --recovery-crashes " + std::to_string(c.recovery_crashes);
    if (c.recovery_image_budget != 100) s += " --recovery-images " + std::to_string(c.recovery_image_budget);
  }
  if (f.kill_round >= 0) {
    s += " --points 0 --kill " + std::to_string(f.kill_round + 1) + " --ops-per-kill " + std::to_string(c.ops_per_kill_round) +
         "  # kill timing is random: may need several runs";
  } else if (f.point >= 0) {
    // The point and image fully determine the crash image.
    s += " --point " + std::to_string(f.point) + " --image " + std::to_string(f.image) + " --verbose";
  } else {
    s += " --points 0";
    if (c.lint) s += " --lint";
  }
  if (c.threads > 1 && f.kill_round < 0 && !f.schedule_seed) s += "  # threads interleave differently per run: may need several runs";
  return s;
}

std::string FormatReport(const Config& c, const Report& r) {
  std::ostringstream o;
  char buf[256];
  o << "pmcheck " << c.index << ": " << c.threads << " thread(s) x " << c.ops << " ops, seed " << c.seed;
  for (const auto& f : c.faults) o << ", fault " << f;
  if (c.drop_fence) o << ", fence site " << c.drop_fence << " dropped";
  if (!c.drop_site.empty()) o << ", site " << c.drop_site << " dropped (" << r.named_drops << " flushes/fences)";
  o << "\n";
  std::snprintf(buf, sizeof buf,
                "  recorded %llu ops, %llu events (%llu crash points) in %.2f s\n"
                "  crash points tried %llu, crash images %llu, recovered cleanly %llu, creation interrupted (allowed) %llu; %.2f s\n",
                static_cast<unsigned long long>(r.ops_recorded), static_cast<unsigned long long>(r.events),
                static_cast<unsigned long long>(r.crash_points), r.record_seconds,
                static_cast<unsigned long long>(r.points_tried), static_cast<unsigned long long>(r.images),
                static_cast<unsigned long long>(r.images_recovered), static_cast<unsigned long long>(r.creation_interrupted),
                r.replay_seconds);
  o << buf;
  std::snprintf(buf, sizeof buf,
                "  unfenced images %llu%s; reads checked %llu (%llu of an op in flight)%s; double-crash images %llu of %llu recoveries\n",
                static_cast<unsigned long long>(r.unfenced_images), c.unfenced_image ? "" : " (off)",
                static_cast<unsigned long long>(r.reads_observed), static_cast<unsigned long long>(r.reads_inflight),
                c.read_rule ? "" : " (read rule off)", static_cast<unsigned long long>(r.recovery_images),
                static_cast<unsigned long long>(r.recoveries_recorded));
  o << buf;
  if (c.shared_writes) {
    std::snprintf(buf, sizeof buf, "  shared-write keys: %llu writes took effect, %llu overlapping another thread's write of the key\n",
                  static_cast<unsigned long long>(r.shared_writes), static_cast<unsigned long long>(r.shared_overlaps));
    o << buf;
  }
  if (c.window_images) {
    std::snprintf(buf, sizeof buf, "  fence-window images %llu at %llu points before fences (%llu window shapes)\n",
                  static_cast<unsigned long long>(r.window_images), static_cast<unsigned long long>(r.window_points),
                  static_cast<unsigned long long>(r.window_shapes));
    o << buf;
  }
  if (r.schedules_run) {
    std::snprintf(buf, sizeof buf,
                  "  PCT schedules %llu (%d change points, first schedule seed %llu): %llu steps, %llu change points reached, "
                  "%llu switches, %llu spins, %llu stalls%s; last schedule hash %016llx\n",
                  static_cast<unsigned long long>(r.schedules_run), c.pct, static_cast<unsigned long long>(ScheduleSeed(c)),
                  static_cast<unsigned long long>(r.schedule_steps), static_cast<unsigned long long>(r.schedule_changes),
                  static_cast<unsigned long long>(r.schedule_switches),
                  static_cast<unsigned long long>(r.schedule_spins), static_cast<unsigned long long>(r.schedule_stalls),
                  r.schedule_stalls ? " (a schedule with stalls may not replay exactly)" : "",
                  static_cast<unsigned long long>(r.schedule_hash));
    o << buf;
  }
  if (c.kills > 0) {
    std::snprintf(buf, sizeof buf, "  process kills %llu (%llu during open/recovery, %llu mid-workload) in %.2f s\n",
                  static_cast<unsigned long long>(r.kills), static_cast<unsigned long long>(r.kills_in_open),
                  static_cast<unsigned long long>(r.kills_mid_workload), r.kill_seconds);
    o << buf;
  }
  o << "  failures by kind:";
  for (size_t k = 0; k < size_t(FailKind::kCount); ++k) o << (k ? ", " : " ") << FailKindName(FailKind(k)) << " " << r.counts[k];
  o << "\n";
  auto line = [&](const char* name, const std::map<std::string, uint64_t>& m) {
    o << "  " << name << ":";
    if (m.empty()) o << " none";
    for (const auto& [k, v] : m) o << " " << k << "=" << v;
    o << "\n";
  };
  o << "  lint" << (c.lint ? " (fatal)" : " (informational; --lint makes it fatal)") << ":\n";
  line("  missing flushes (lines)", r.missing_flushes);
  o << "    erratum reads: " << r.erratum_reads << " (of " << r.acting_loads << " acting loads, " << r.unflushed_loads
    << " of a line another thread had not flushed)\n";
  if (r.caught_up_stores)
    o << "    stores logged at another thread's flush before their own log entry: " << r.caught_up_stores << "\n";
  line("  flushes", r.flushes);
  line("  redundant flushes", r.redundant_flushes);
  line("  fences", r.fences);
  line("  fences with nothing to order", r.empty_fences);
  o << "    fence sites: " << r.fence_sites;
  if (c.drop_fence)
    o << "; site " << c.drop_fence << " dropped: " << r.fences_dropped << " fence(s)"
      << (r.dropped_site.empty() ? " (the run has no such site)" : " at " + r.dropped_site);
  o << "\n";
  for (const Failure& f : r.failures) {
    o << "FAIL [" << FailKindName(f.kind) << "] " << f.what << "\n    reproduce: " << Reproducer(c, f) << "\n";
  }
  o << (r.total_failures() ? "RESULT: FAILED (" + std::to_string(r.total_failures()) + " failures)\n" : "RESULT: OK\n");
  return o.str();
}

}  // namespace pmcheck

