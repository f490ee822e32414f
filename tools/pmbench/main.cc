// main.cc: the pmbench command line (CLI11). PiBench's option names and
// meanings (pibench-evaluation-vldb20.md section 4), plus --index/--input to
// pick built-in indexes and PiBench plugins, --phases, --recovery, --json,
// --persist_mode, --write_latency_ns, --sequential and --rounds. See
// docs/pmbench.md.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "bench.h"
#include "common/cli.h"

using namespace pmbench;

static std::string SelfDir() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : p.parent_path().string();
}

static void ListTargets() {
  std::printf("built-in indexes (--index NAME, or --index all):\n");
  for (const auto& i : pmindex::ListIndexes())
    std::printf("  %-14s %s%s%s  %s\n", i.name.c_str(), i.persistent ? "persistent" : "transient ", i.ordered ? ", ordered" : ", hash   ",
                i.concurrent ? ", concurrent   " : ", single-thread", i.description.c_str());
  std::string lib = SelfDir() + "/../lib";
  std::vector<std::string> plugins;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(lib, ec)) {
    std::string f = e.path().filename().string();
    if (f.rfind("libpibench_", 0) == 0 && e.path().extension() == ".so") plugins.push_back(std::filesystem::canonical(e.path(), ec).string());
  }
  std::sort(plugins.begin(), plugins.end());
  std::printf("PiBench plugins next to this binary (--input PATH):\n");
  for (const auto& p : plugins) std::printf("  %s\n", p.c_str());
  if (plugins.empty()) std::printf("  (none in %s)\n", lib.c_str());
}

int main(int argc, char** argv) {
  CLI::App app{"pmbench: a PiBench-compatible benchmark for persistent-memory indexes (docs/pmbench.md)"};
  BenchOptions o;
  std::string index_list, input_list, json_path, distribution = "UNIFORM", mode = "operation", persist_mode = "flush", phases;
  std::vector<std::string> params;
  double ratios[kNumOpTypes] = {1, 0, 0, 0, 0};
  bool list = false, no_progress = false;

  app.add_option("--index", index_list, "built-in indexes to run, comma-separated, in turn (\"all\": dram_btree then every other)");
  app.add_option("--input", input_list, "PiBench plugin libraries (.so) to run, comma-separated (after --index ones)");
  app.add_option("-n,--records", o.records, "records inserted in the load phase")
      ->capture_default_str()
      ->check(pmindex::tools::NonNegative());
  app.add_option("-p,--operations", o.operations, "operations per run phase (operation mode)")
      ->capture_default_str()
      ->check(pmindex::tools::NonNegative());
  app.add_option("-t,--threads", o.threads, "worker threads")
      ->capture_default_str()
      ->check(pmindex::tools::NonNegative());
  app.add_option("-k,--key_size", o.key_size, "key size in bytes (8: u64 keys, else byte keys)")
      ->capture_default_str()
      ->check(pmindex::tools::NonNegative());
  app.add_option("-v,--value_size", o.value_size, "value size in bytes (8: u64 values)")
      ->capture_default_str()
      ->check(pmindex::tools::NonNegative());
  app.add_option("-f,--key_prefix", o.key_prefix, "prefix prepended to every key (byte keys only)");
  auto* r_opt = app.add_option("-r,--read_ratio", ratios[0], "ratio of reads (default: whatever the other ratios leave)");
  app.add_option("-i,--insert_ratio", ratios[1], "ratio of inserts")->capture_default_str();
  app.add_option("-u,--update_ratio", ratios[2], "ratio of updates")->capture_default_str();
  app.add_option("-d,--remove_ratio", ratios[3], "ratio of removes")->capture_default_str();
  app.add_option("-s,--scan_ratio", ratios[4], "ratio of scans")->capture_default_str();
  app.add_option("--scan_size", o.scan_size, "records per scan")
      ->capture_default_str()
      ->check(pmindex::tools::NonNegative());
  app.add_option("--distribution", distribution, "key distribution: UNIFORM, SELFSIMILAR or ZIPFIAN")->capture_default_str();
  auto* skew_opt = app.add_option("--skew", o.skew, "skew: SELFSIMILAR h in (0,0.5] (default 0.2), ZIPFIAN theta in (0,1) (default 0.99)");
  app.add_option("--seed", o.seed, "random seed (same seed, same operations)")
      ->capture_default_str()
      ->check(pmindex::tools::NonNegative());
  app.add_option("--mode", mode, "operation (-p ops per phase) or time (--seconds per phase)")->capture_default_str();
  app.add_option("--seconds", o.seconds, "seconds per run phase in time mode")->capture_default_str();
  app.add_option("--sampling_ms", o.sampling_ms, "throughput sampling window, ms")
      ->capture_default_str()
      ->check(pmindex::tools::NonNegative());
  app.add_option("--latency_sampling", o.latency_sampling, "fraction of operations whose latency is measured")->capture_default_str();
  app.add_option("--pool_path", o.pool_path, "pool file (default: a fresh pool in /dev/shm, removed at exit); kept if given");
  app.add_option("--pool_size", o.pool_size, "initial pool size in bytes (0: from -n, -k, -v; pools grow)")
      ->capture_default_str()
      ->check(pmindex::tools::NonNegative());
  app.add_flag("--skip_load", o.skip_load, "skip the load phase: run on the records already in --pool_path");
  app.add_flag("--recovery", o.recovery, "after loading, close and reopen the pool and time the recovery");
  app.add_option("--persist_mode", persist_mode, "flush (clwb/clflushopt/clflush) or none (eADR: no flushes)")->capture_default_str();
  app.add_option("--write_latency_ns", o.write_latency_ns, "extra latency spun per flushed line (emulated PM)")
      ->capture_default_str()
      ->check(pmindex::tools::NonNegative());
  app.add_option("--phases", phases, "run phases, comma-separated: read,insert,update,delete,scan,mixed,custom (custom: the -r..-s ratios)");
  app.add_option("--param", params, "index parameter NAME=VALUE for built-in indexes (repeatable)");
  app.add_option("--json", json_path, "write every option and figure to this JSON file");
  app.add_flag("--no_progress", no_progress, "no progress line on stderr");
  app.add_flag("--sequential", o.sequential,
               "several indexes: run each completely before the next (default: each phase on every index in turn)");
  auto* rounds_opt = app.add_option("--rounds", o.rounds,
                                    "several indexes, interleaved: split the load and every phase into N rounds, the order of the "
                                    "indexes changing each round (a balanced Latin square; default: the smallest multiple of its "
                                    "period >= 10 with several indexes, else 1; 1: one index's whole phase after the other's)");
  app.add_flag("--list", list, "list built-in indexes and plugins, then exit");
  if (std::optional<int> rc = pmindex::tools::ParseArgs(app, argc, argv, pmindex::tools::kExitUsage)) return *rc;

  if (list) {
    ListTargets();
    return 0;
  }
  auto fail = [](const std::string& m) {
    std::fprintf(stderr, "pmbench: %s\n", m.c_str());
    return pmindex::tools::kExitUsage;
  };
  if (!ParseDistribution(distribution, &o.distribution)) return fail("unknown --distribution '" + distribution + "' (UNIFORM, SELFSIMILAR, ZIPFIAN)");
  if (o.distribution == Distribution::kZipfian && skew_opt->count() == 0) o.skew = 0.99;
  if (mode == "operation") o.time_mode = false;
  else if (mode == "time") o.time_mode = true;
  else return fail("unknown --mode '" + mode + "' (operation, time)");
  if (!pmindex::pm::ParsePersistMode(persist_mode, &o.persist_mode)) return fail("unknown --persist_mode '" + persist_mode + "' (flush, none)");
  if (r_opt->count() == 0) ratios[0] = 1 - ratios[1] - ratios[2] - ratios[3] - ratios[4];
  for (int i = 0; i < kNumOpTypes; i++) o.ratios.r[i] = ratios[i];
  for (const auto& p : params) {
    auto eq = p.find('=');
    if (eq == std::string::npos || eq == 0) return fail("--param expects NAME=VALUE, got '" + p + "'");
    o.params[p.substr(0, eq)] = p.substr(eq + 1);
  }
  if (!phases.empty()) {
    size_t i = 0;
    while (i <= phases.size()) {
      size_t j = phases.find(',', i);
      if (j == std::string::npos) j = phases.size();
      std::string n = phases.substr(i, j - i);
      if (!n.empty()) {
        PhaseSpec ps;
        pmindex::Status s = PhaseByName(n, o.ratios, &ps);
        if (!s.ok()) return fail(std::string(s.message()));
        o.phases.push_back(ps);
      }
      i = j + 1;
    }
  }
  o.progress = !no_progress;
  if (rounds_opt->count() > 0 && o.rounds < 1) return fail("--rounds must be at least 1 (got " + std::to_string(o.rounds) + ")");
  pmindex::Status s = o.Validate();
  if (!s.ok()) return fail(std::string(s.message()));
  std::vector<TargetSpec> targets;
  s = ResolveTargets(index_list, input_list, &targets);
  if (!s.ok()) return fail(std::string(s.message()));

  std::ofstream json_out;
  if (!json_path.empty()) {
    json_out.open(json_path, std::ios::trunc);
    if (!json_out) return fail("cannot write --json file " + json_path);
  }

  Environment env;
  for (int i = 0; i < argc; i++) env.command_line += (i ? " " : "") + std::string(argv[i]);
  char buf[256];
  std::time_t now = std::time(nullptr);
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  env.start_time_utc = buf;
  if (gethostname(buf, sizeof buf) == 0) env.hostname = buf;
  env.flush_instr = pmindex::pm::FlushInstrName(pmindex::pm::GetFlushInstr());
  env.hardware_threads = std::thread::hardware_concurrency();
  env.version = "pmbench 1";

  std::vector<TargetResult> results;
  RemoveTemporaryPoolsOnSignals();
  s = RunBenchmark(o, targets, &results);
  if (!s.ok()) {
    std::fprintf(stderr, "pmbench: %s\n", std::string(s.message()).c_str());
    return s.IsInvalidArgument() ? pmindex::tools::kExitUsage : pmindex::tools::kExitCannotRun;
  }
  std::cout << FormatSummary(o, results) << FormatComparison(o, results) << std::flush;
  if (json_out.is_open()) {
    json_out << ToJson(o, env, results);
    json_out.close();
    if (!json_out) {
      std::fprintf(stderr, "pmbench: writing %s failed\n", json_path.c_str());
      return pmindex::tools::kExitCannotRun;
    }
  }
  int rc = 0;
  for (const auto& r : results)
    if (!r.error.empty()) {
      std::fprintf(stderr, "pmbench: %s: %s\n", r.spec.name.c_str(), r.error.c_str());
      rc = pmindex::tools::kExitFound;
    }
  return rc;
}
