// bench.cc: pmbench's driver: the steps of a run (load, recovery, run
// phases) over each target, in rounds with a rotating order (bench.h), and
// the phase specifications and options (PiBench methodology,
// pibench-evaluation-vldb20.md sections 4 and 5.3; the key-generation
// corrections are described in workload.h). Targets and their pools are in
// targets.cc, one target's run of one phase in phase_run.cc.
//
// Invariants: every target of one invocation sees the same operations (the
// streams depend only on seed, thread count and phase number, never on
// results); workers never share ids (see workload.h), so inserts and removes
// always succeed on a correct index. pmbench writes no PM itself: pools are
// created, recovered and closed by the indexes (OpenIndex) or the plugins.
//
// Thread-safety: RunBenchmark runs on one thread (it starts the workers of
// each phase chunk through PhaseRun).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <optional>

#include "bench.h"
#include "phase_run.h"
#include "pmindex/pm/pool.h"
#include "targets.h"

namespace pmbench {

using pmindex::Index;
using pmindex::IndexInfo;

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
  if (records > (uint64_t(1) << 40))
    return Status::InvalidArgument("-n " + std::to_string(records) + " is more than the limit of 2^40 records");
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

using detail::AutoPoolSize;
using detail::Clock;
using detail::NewBuiltinTarget;
using detail::NewPluginTarget;
using detail::PhaseContext;
using detail::PhaseRun;
using detail::RememberTempPool;
using detail::RemovePoolFile;
using detail::SanitizeName;
using detail::Since;
using detail::Target;

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
      target = NewBuiltinTarget(spec.name, base);
    } else {
      Status s = NewPluginTarget(spec.plugin, &target);
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
    if (Index* idx = target->index())
      if (pmindex::pm::Pool* pool = idx->pool()) {
        r->mapping = pool->mapping_name();
        std::fprintf(stderr, "pmbench: %s: pool %s mapped %s\n", spec.name.c_str(), r->pool_path.c_str(), r->mapping.c_str());
      }
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

