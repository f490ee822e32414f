// pmcheck: the command-line front end of the power-failure simulator and
// durability checker (issue 5). See docs/pmcheck.md and pmcheck.h; this file
// only parses options and prints the report. Exit status (tools/common/cli.h):
// 0 no failure, 1 failures found, 2 usage (bad or missing option, unknown
// index or fault name), 3 the check could not run (I/O error, ...).
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "CLI/CLI.hpp"
#include "common/cli.h"
#include "checker_internal.h"
#include "pmcheck.h"
#include "target.h"
#include "pmindex/index.h"
#include "pmindex/pm/fault.h"

namespace {
// Pool files this run may leave in the pool directory; removed if pmcheck is
// interrupted (SIGINT/SIGTERM/SIGHUP), so an aborted run does not fill /dev/shm.
char g_paths[4][512];
void OnSignal(int sig) {
  for (auto& p : g_paths)
    if (p[0]) ::unlink(p);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}
std::string PathFor(const pmcheck::Config& c, const char* what) { return pmcheck::PoolPath(c, what); }
}  // namespace

int main(int argc, char** argv) {
  pmcheck::Config c;
  CLI::App app{"pmcheck: power-failure simulation and durability checking for pmindex indexes"};
  std::string key_kind = "u64", value_kind = "u64", points = "1000";
  std::vector<std::string> params;
  uint64_t pool_mb = c.pool_size >> 20;
  bool long_mode = false, list = false;
  app.add_option("--index", c.index, "index type (registered persistent index, or pmcheck_toy); required");
  app.add_option("--ops", c.ops, "ops per thread in the recorded workload")->check(CLI::Range(uint64_t(0), uint64_t(1) << 24));
  app.add_option("--keys", c.keys, "distinct keys per thread (0: ops/2, at least 8)");
  app.add_option("--key-kind", key_kind, "u64 | bytes")->check(CLI::IsMember({"u64", "bytes"}));
  app.add_option("--value-kind", value_kind, "u64 | bytes")->check(CLI::IsMember({"u64", "bytes"}));
  app.add_option("--threads", c.threads, "workload threads (disjoint key ranges)")->check(CLI::Range(1, 64));
  app.add_option("--seed", c.seed, "seed for workload, point sample and crash images");
  app.add_option("--points", points, "crash points: all, none (record + lint only), or a sample size K");
  app.add_option("--images-per-point", c.images_per_point, "crash images per point (image 0 keeps no pending store, 1 all, 2.. random prefixes)")
      ->check(CLI::Range(1, 1000));
  app.add_option("--images", c.image_budget, "crash-image budget: sample points until this many images (overrides --points)");
  app.add_option("--stop-after", c.stop_after, "stop replaying after this many failures (fault checks)");
  app.add_flag("--long", long_mode, "long mode: 1000 ops, every crash point, 6 images per point, 100 kills");
  bool no_unfenced = false, no_read_rule = false;
  app.add_flag("--no-unfenced-image", no_unfenced,
               "do not build the per-point image that drops every flushed-but-unfenced store and keeps the others");
  app.add_option("--window-images", c.window_images,
                 "up to N more images just before fences, every window shape (fence and flush sites) in turn, rarest first: "
                 "each keeps the 1..4 most recently stored-to dirty lines and drops every other pending store");
  app.add_flag("--drain", c.drain, "first half of each thread's ops mostly inserts, second half mostly removes");
  app.add_flag("--sweep", c.sweep,
               "ops are whole-range key runs: insert ascending, remove descending, upsert descending, remove ascending, repeated");
  app.add_flag("--shared-keys", c.shared_keys, "finds and scans read every thread's keys (writes stay with the owner thread)");
  app.add_flag("--shared-writes", c.shared_writes,
               "with --shared-keys: every thread also writes 4 keys no thread owns; a crash must recover each to a version the "
               "ops' real-time order allows");
  app.add_flag("--no-read-rule", no_read_rule, "do not require a version a completed read returned to survive later crashes");
  app.add_option("--recovery-crashes", c.recovery_crashes,
                 "record the recovery of this many crash images and crash it (double crashes)");
  app.add_option("--recovery-images", c.recovery_image_budget,
                 "crash images per crashed recovery, sampled over its points (0: every point)");
  app.add_flag("--lint", c.lint, "missing flushes/fences and erratum reads count as failures");
  app.add_option("--kill", c.kills, "process-crash rounds (SIGKILL at random moments)")->check(CLI::Range(0, 1000000));
  app.add_option("--ops-per-kill", c.ops_per_kill_round, "ops per kill round")->check(CLI::Range(1, 1000000));
  app.add_option("--fault", c.faults, "enable a fault switch (repeatable)");
  app.add_option("--drop-fence", c.drop_fence,
                 "record as if the K-th fence call site (first-recorded order; see 'fence sites' in the report) had no fence");
  app.add_option("--pct", c.pct,
                 "multi-threaded runs: record under a PCT schedule with D priority change points (a seed names one interleaving)")
      ->check(CLI::Range(0, 100000));
  bool no_spin_hook = false;
  app.add_flag("--no-spin-hook", no_spin_hook,
               "with --pct: a thread waiting in a backoff loop keeps the token until a stall (default: it hands the token on)");
  app.add_option("--schedule-seed", c.schedule_seed, "the PCT schedule to record (default: --seed)");
  app.add_option("--pct-timeout", c.pct_timeout,
                 "with --pct: abort a recording (exit 3, naming the schedule seed) when no thread reaches a scheduling "
                 "point for this many seconds (0: no limit; default 120)")
      ->check(CLI::Range(0.0, 1e6));
  app.add_option("--schedules", c.schedules, "record and replay N PCT schedules (seeds S, S+1, ...) sharing the image budget")
      ->check(CLI::Range(uint64_t(1), uint64_t(100000)));
  app.add_option("--drop-site", c.drop_site,
                 "record as if the flush or fence call at this site (object+0xoffset, see --site-counts) were deleted");
  app.add_option("--site-counts", c.site_counts,
                 "append how often each flush and fence call site ran in the recording to this file (coverage)");
  app.add_option("--timeout", c.timeout_s, "seconds allowed per recovery + verification")->check(CLI::PositiveNumber);
  app.add_option("--pool-mb", pool_mb, "initial pool size in MiB")->check(CLI::Range(uint64_t(1), uint64_t(1) << 16));
  app.add_option("--param", params, "index parameter name=value (repeatable)");
  app.add_option("--point", c.only_point, "reproduce: only this crash point (event number)");
  app.add_option("--image", c.only_image, "reproduce: only this image of the point");
  app.add_option("--dir", c.dir, "directory for pool files");
  app.add_option("--max-reported", c.max_reported, "failures printed per kind");
  app.add_flag("--verbose", c.verbose, "one line per crash image / kill round");
  app.add_option("--trace-line", c.trace_line, "print a backtrace of every store to / flush of the line holding this pool offset");
  app.add_flag("--list", list, "list the indexes (and pmcheck's own targets: the toy index, the PMwCAS primitive, the allocator) pmcheck can check");
  if (std::optional<int> rc = pmindex::tools::ParseArgs(app, argc, argv, pmindex::tools::kExitUsage)) return *rc;

  if (list) {
    for (const auto& i : pmindex::ListIndexes())
      if (i.persistent) std::printf("%s\n", i.name.c_str());
    std::printf("%s\n%s\n%s\n", pmcheck::kToyName, pmcheck::kPmwcasTargetName, pmcheck::kAllocatorTargetName);
    return 0;
  }
  auto usage = [](const std::string& m) {
    std::fprintf(stderr, "pmcheck: %s\n", m.c_str());
    return pmindex::tools::kExitUsage;
  };
  if (app.count("--index") == 0)
    return usage("--index is required (see --list; the built-in toy index is --index " + std::string(pmcheck::kToyName) + ")");
  for (const auto& f : c.faults)
    if (!pmindex::pm::FaultKnown(f))
      return usage("--fault " + f + ": no fault switch has this name (the names are in docs/<index>.md and docs/pmcheck.md)");
  c.unfenced_image = !no_unfenced;
  c.read_rule = !no_read_rule;
  c.spin_hook = !no_spin_hook;
  c.key_kind = key_kind == "u64" ? pmindex::KeyKind::kU64 : pmindex::KeyKind::kBytes;
  c.value_kind = value_kind == "u64" ? pmindex::ValueKind::kU64 : pmindex::ValueKind::kBytes;
  c.pool_size = pool_mb << 20;
  for (const auto& p : params) {
    auto eq = p.find('=');
    if (eq == std::string::npos || eq == 0) {
      return usage("--param expects name=value, got '" + p + "'");
    }
    c.params[p.substr(0, eq)] = p.substr(eq + 1);
  }
  if (long_mode) {
    if (app.count("--ops") == 0) c.ops = 1000;
    if (app.count("--points") == 0) points = "all";
    if (app.count("--images-per-point") == 0) c.images_per_point = 6;
    if (app.count("--kill") == 0) c.kills = 100;
  }
  if (points == "all") c.points = -1;
  else if (points == "none") c.points = 0;
  else {
    char* end = nullptr;
    long long k = std::strtoll(points.c_str(), &end, 10);
    if (points.empty() || *end || k < 0) {
      return usage("--points expects all, none or a number, got '" + points + "'");
    }
    c.points = k;
  }
  c.progress = true;
  const char* kinds[4] = {"rec", "img", "kill", "killv"};
  for (int i = 0; i < 4; ++i) std::snprintf(g_paths[i], sizeof g_paths[i], "%s", PathFor(c, kinds[i]).c_str());
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::signal(sig, OnSignal);
  pmcheck::Report r;
  pmindex::Status s = pmcheck::Run(c, &r);
  if (!s.ok()) {
    std::fprintf(stderr, "pmcheck: %s\n", s.ToString().c_str());
    return s.IsInvalidArgument() ? pmindex::tools::kExitUsage : pmindex::tools::kExitCannotRun;
  }
  std::fputs(pmcheck::FormatReport(c, r).c_str(), stdout);
  return r.total_failures() ? 1 : 0;
}
