// bench.h: pmbench's benchmark driver: targets (built-in indexes and PiBench
// plugins, both driven through the tree_api ABI), the load and run phases
// (PiBench section 4 and 5.3), their measurements, and the reports.
//
// Measurement model: worker threads execute operations; the calling thread
// is PiBench's statistics thread, reading each worker's completed-operation
// counter every sampling_ms to get per-window throughput (and printing the
// progress line). A fraction latency_sampling of operations is timed.
// PM cost is each worker's pm::ThreadCounters() difference over the phase.
//
// Rounds (--rounds R, the default with several interleaved targets): every
// step but recovery (load, each run phase) is split into R chunks; in round r
// every target runs the next 1/R of its operations (time mode: of the
// seconds), in the order RoundOrder(T', r + step number) over the T' targets
// that run in that round (a balanced Latin square: positions and predecessors
// balanced over each RoundPeriod). The per-thread generators and live-key state continue across a
// target's chunks, so the operations are exactly those of --rounds 1; a
// phase's figures combine its chunks (times summed, windows measured in
// phase time, latency samples merged, PM counters summed).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "pmindex/index.h"
#include "pmindex/pibench_abi.h"
#include "pmindex/pm/persist.h"
#include "workload.h"

namespace pmbench {

struct PhaseSpec {
  std::string name;  // "run" for a plain PiBench run, else a --phases name
  Ratios ratios;
};
// read, insert, update, delete (remove), scan, mixed, custom (the -r.. ratios).
Status PhaseByName(const std::string& name, const Ratios& custom, PhaseSpec* out);

struct BenchOptions {
  uint64_t records = 1000000;     // -n
  uint64_t operations = 1000000;  // -p (per phase)
  int threads = 1;                // -t
  size_t key_size = 8;            // -k
  size_t value_size = 8;          // -v
  std::string key_prefix;         // -f
  Ratios ratios;                  // -r -i -u -d -s
  int scan_size = 100;
  Distribution distribution = Distribution::kUniform;
  double skew = 0.2;
  uint64_t seed = 1729;
  bool time_mode = false;  // --mode time
  double seconds = 20;
  int sampling_ms = 100;
  double latency_sampling = 0.1;
  std::string pool_path;  // empty: /dev/shm/pmbench-<name>-<pid>.pool, removed at exit
  uint64_t pool_size = 0;  // 0: sized from -n, -k, -v
  bool skip_load = false;
  bool recovery = false;
  pmindex::pm::PersistMode persist_mode = pmindex::pm::PersistMode::kFlush;
  uint32_t write_latency_ns = 0;
  std::vector<PhaseSpec> phases;  // empty: one "run" phase with `ratios`
  std::map<std::string, std::string> params;  // built-in index parameters
  bool progress = true;
  // Several targets: run each one completely before the next (true), or
  // (default) keep them all open and run each step (load, recovery, phase 1,
  // phase 2, ...) on every target before the next step, so drifting
  // background load affects all alike. Sequential needs one pool at a time.
  bool sequential = false;
  // --rounds: 0 picks the default (EffectiveRounds); > 1 is refused with
  // sequential (a target that runs alone has nothing to alternate with).
  int rounds = 0;

  Status Validate() const;
};

// Something to benchmark.
struct TargetSpec {
  std::string name;    // index name, or the plugin file's stem
  std::string plugin;  // path of the .so; empty for a built-in index
};

struct LatencySummary {
  uint64_t samples = 0;
  double avg_ns = 0, min_ns = 0, p50_ns = 0, p90_ns = 0, p99_ns = 0, p999_ns = 0, p9999_ns = 0, p99999_ns = 0, max_ns = 0;
};

struct Window {
  double end_seconds;  // since the phase started
  double seconds;      // window length
  uint64_t ops;
};

// The rounds a run uses: opts.rounds if set, else, when several targets run
// interleaved, the smallest whole number of RoundPeriod(targets) >= 10
// (2 or 5 targets: 10; 3, 4 or 6: 12), else 1.
int EffectiveRounds(const BenchOptions& opts, size_t ntargets);
inline constexpr int kDefaultRounds = 10;
inline constexpr int kMaxRounds = 100000;
// The round orders form a Williams balanced Latin square: RoundPeriod(n) rows
// (n for even n, 2n for odd n, 1 for n <= 1); over one period every target is
// in every position equally often and every ordered pair of targets is
// adjacent (one right after the other within a round) equally often. The
// pair formed across a round boundary (last of one round, first of the next)
// is not balanced.
int RoundPeriod(size_t ntargets);
// The order in which the targets run in round `round`: row round mod
// RoundPeriod(ntargets) of the design (row i starts with target i mod n).
// RunBenchmark uses row (round + step number) over the targets that run in
// that round.
std::vector<size_t> RoundOrder(size_t ntargets, int round);
// A thread's operations in round `round` of `rounds`: the chunks of a quota q
// are [q*r/R, q*(r+1)/R), so they add up to exactly q (some are empty when
// q < R).
uint64_t ChunkBegin(uint64_t quota, int round, int rounds);

// One target's share of one round of a phase.
struct Chunk {
  int round = 0;
  int position = 0;  // place in that round's order among the targets that ran in it (0: ran first; -1: did not run)
  std::string after;  // the target whose chunk ran just before this one in the step ("" if none)
  uint64_t ops = 0;  // operations completed in it
  double seconds = 0;
};

struct PhaseResult {
  std::string name;
  Ratios ratios;
  int threads = 1;
  bool skipped = false;
  std::string note;     // why skipped / warnings (exhausted live set, ...)
  uint64_t requested = 0;  // operations asked for (0 in time mode)
  double seconds = 0;
  uint64_t completed[kNumOpTypes] = {};
  uint64_t succeeded[kNumOpTypes] = {};
  uint64_t scanned_records = 0;
  uint64_t total_completed() const;
  uint64_t total_succeeded() const;
  double throughput() const { return seconds > 0 ? double(total_completed()) / seconds : 0; }
  std::vector<Window> windows;
  double window_mean = 0, window_stddev = 0;  // ops/s over full windows
  size_t full_windows = 0;  // windows of at least half the nominal length
  LatencySummary latency;                     // all sampled operations
  LatencySummary latency_by_type[kNumOpTypes];
  pmindex::pm::Counters pm;  // summed over workers
  bool has_stats = false;
  pmindex::IndexStats stats;  // after the phase (built-in indexes)
  std::vector<Chunk> chunks;  // one per round, in round order
};

struct TargetResult {
  TargetSpec spec;
  std::string kind;  // "builtin" | "plugin"
  std::string description;
  bool persistent = false, ordered = true, concurrent = true;
  int threads = 1;
  std::string pool_path;
  std::string mapping;  // pm::Pool::mapping_name() of a built-in persistent index's pool; empty otherwise
  std::string error;  // non-empty: the target failed (the rest still ran)
  bool loaded = false;
  PhaseResult load;
  bool has_recovery = false;
  std::string recovery_note;
  double recovery_seconds = 0;        // wall time of reopening (OpenIndex / create_tree)
  double index_recovery_seconds = -1;  // IndexStats::recovery_seconds (built-in), -1 unknown
  uint64_t recovery_probed = 0, recovery_found = 0;  // loaded records looked up after reopening
  std::vector<PhaseResult> phases;
};

struct Environment {
  std::string command_line;
  std::string start_time_utc;
  std::string hostname;
  std::string flush_instr;
  unsigned hardware_threads = 0;
  std::string version;
};

// Runs the load and run phases on every target in turn, same workload.
// Errors in one target are recorded in its result; a non-OK Status means
// the options themselves were bad.
Status RunBenchmark(const BenchOptions& opts, const std::vector<TargetSpec>& targets, std::vector<TargetResult>* results);

// Installs SIGINT/SIGTERM/SIGHUP handlers that unlink the temporary pools
// pmbench created in /dev/shm before the signal takes effect.
void RemoveTemporaryPoolsOnSignals();

// Resolves --index / --input lists ("all" = dram_btree then every other
// registered index) into targets.
Status ResolveTargets(const std::string& index_list, const std::string& input_list, std::vector<TargetSpec>* out);

// Reports.
std::string FormatSummary(const BenchOptions& opts, const std::vector<TargetResult>& results);
std::string FormatComparison(const BenchOptions& opts, const std::vector<TargetResult>& results);
std::string ToJson(const BenchOptions& opts, const Environment& env, const std::vector<TargetResult>& results);

// Figures shared by the summary and the JSON (so they always agree).
std::string FormatRate(double ops_per_sec);  // "1.234 Mops/s"
std::string FormatNs(double ns);             // "1.23 us"

}  // namespace pmbench
