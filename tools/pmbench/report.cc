// report.cc: pmbench's human summary, side-by-side comparison and JSON
// output. Every figure in the summary is printed from the same PhaseResult
// fields that go into the JSON, with the same FormatRate/FormatNs, so the two
// always agree (tests/pmbench checks it). No PM access here.
// Thread-safety: pure functions of their arguments, called by the main
// thread once the phases have ended.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bench.h"

namespace pmbench {

using json = nlohmann::ordered_json;

std::string FormatRate(double r) {
  char b[64];
  if (r >= 1e6) std::snprintf(b, sizeof b, "%.3f Mops/s", r / 1e6);
  else if (r >= 1e3) std::snprintf(b, sizeof b, "%.3f Kops/s", r / 1e3);
  else std::snprintf(b, sizeof b, "%.1f ops/s", r);
  return b;
}

std::string FormatNs(double ns) {
  char b[64];
  if (ns >= 1e6) std::snprintf(b, sizeof b, "%.2f ms", ns / 1e6);
  else if (ns >= 1e3) std::snprintf(b, sizeof b, "%.2f us", ns / 1e3);
  else std::snprintf(b, sizeof b, "%.0f ns", ns);
  return b;
}

static std::string FormatBytes(uint64_t b) {
  char s[64];
  if (b >= (1ull << 30)) std::snprintf(s, sizeof s, "%.2f GiB", double(b) / double(1ull << 30));
  else if (b >= (1ull << 20)) std::snprintf(s, sizeof s, "%.2f MiB", double(b) / double(1ull << 20));
  else if (b >= 1024) std::snprintf(s, sizeof s, "%.1f KiB", double(b) / 1024.0);
  else std::snprintf(s, sizeof s, "%llu B", (unsigned long long)b);
  return s;
}

static std::string F(const char* fmt, double v) {
  char b[64];
  std::snprintf(b, sizeof b, fmt, v);
  return b;
}

static bool HasPmCost(const PhaseResult& p) {
  return p.pm.stores || p.pm.lines_flushed || p.pm.fences || p.pm.allocs || p.pm.frees || p.pm.nt_bytes || p.pm.line_writes;
}

static double PerOp(uint64_t v, const PhaseResult& p) {
  uint64_t n = p.total_completed();
  return n ? double(v) / double(n) : 0;
}

static void SummarizePhase(std::ostringstream& os, const PhaseResult& p, int sampling_ms) {
  os << "  " << p.name << ": ";
  if (p.skipped) {
    os << p.note << "\n";
    return;
  }
  os << p.total_completed() << " ops in " << F("%.3f", p.seconds) << " s: " << FormatRate(p.throughput());
  if (p.full_windows >= 2)
    os << " (" << p.full_windows << " windows of " << sampling_ms << " ms: mean " << FormatRate(p.window_mean) << ", stddev "
       << FormatRate(p.window_stddev) << ")";
  else
    os << " (shorter than two " << sampling_ms << " ms windows: no stddev)";
  os << "\n";
  os << "    ops:";
  for (int t = 0; t < kNumOpTypes; t++)
    if (p.completed[t]) os << " " << OpName(OpType(t)) << " " << p.completed[t] << " completed / " << p.succeeded[t] << " succeeded;";
  if (p.scanned_records) os << " scanned records " << p.scanned_records;
  os << "\n";
  if (p.latency.samples) {
    const LatencySummary& l = p.latency;
    os << "    latency (" << l.samples << " samples): p50 " << FormatNs(l.p50_ns) << ", p90 " << FormatNs(l.p90_ns) << ", p99 "
       << FormatNs(l.p99_ns) << ", p99.9 " << FormatNs(l.p999_ns) << ", p99.99 " << FormatNs(l.p9999_ns) << ", p99.999 "
       << FormatNs(l.p99999_ns) << ", max " << FormatNs(l.max_ns) << "\n";
  }
  if (HasPmCost(p))
    os << "    PM per op: " << F("%.2f", PerOp(p.pm.lines_flushed, p)) << " lines flushed, " << F("%.2f", PerOp(p.pm.fences, p))
       << " fences, " << F("%.3f", PerOp(p.pm.allocs, p)) << " allocs, " << F("%.3f", PerOp(p.pm.frees, p)) << " frees, "
       << F("%.1f", PerOp(p.pm.store_bytes, p)) << " bytes stored\n";
  if (p.has_stats)
    os << "    footprint: " << p.stats.records << " records, PM " << FormatBytes(p.stats.pm_bytes) << ", DRAM "
       << FormatBytes(p.stats.dram_bytes) << "\n";
  if (!p.note.empty()) os << "    note: " << p.note << "\n";
}

// How several targets shared the run ("" for one target run in one round,
// as before rounds existed).
static std::string RoundsText(const BenchOptions& o, size_t ntargets) {
  const int rounds = EffectiveRounds(o, ntargets);
  if (ntargets > 1 && o.sequential) return ", one index after the other (--sequential)";
  if (ntargets > 1 && rounds == 1) return ", 1 round per step (each index's whole step in the order given)";
  if (ntargets < 2 && rounds == 1) return "";
  return ", " + std::to_string(rounds) + " rounds per step" + (ntargets > 1 ? " (index order rotating each round)" : "");
}

std::string FormatSummary(const BenchOptions& o, const std::vector<TargetResult>& results) {
  std::ostringstream os;
  os << "pmbench: " << o.records << " records, " << (o.time_mode ? F("%.1f s", o.seconds) + " per phase" : std::to_string(o.operations) + " ops per phase")
     << ", " << o.threads << " thread(s), key " << o.key_size << " B" << (o.key_prefix.empty() ? "" : " (prefix \"" + o.key_prefix + "\")")
     << ", value " << o.value_size << " B, " << DistributionName(o.distribution);
  if (o.distribution != Distribution::kUniform) os << " skew " << o.skew;
  os << ", seed " << o.seed << ", persist mode " << pmindex::pm::PersistModeName(o.persist_mode);
  if (o.write_latency_ns) os << " +" << o.write_latency_ns << " ns/line";
  os << RoundsText(o, results.size()) << "\n";
  for (const auto& r : results) {
    os << "\n== " << r.spec.name << " (" << r.kind << (r.spec.plugin.empty() ? "" : ": " + r.spec.plugin) << "), " << r.threads
       << " thread(s)";
    if (r.threads != o.threads) os << " [single-threaded index]";
    os << " ==\n";
    if (!r.error.empty()) os << "  ERROR: " << r.error << "\n";
    if (r.loaded) SummarizePhase(os, r.load, o.sampling_ms);
    if (r.has_recovery) {
      os << "  recovery: ";
      if (r.recovery_probed) {
        os << "reopen took " << F("%.4f", r.recovery_seconds) << " s";
        if (r.index_recovery_seconds >= 0) os << " (index reports " << F("%.4f", r.index_recovery_seconds) << " s recovering)";
        os << "; " << r.recovery_found << "/" << r.recovery_probed << " sampled loaded records found";
        if (!r.recovery_note.empty()) os << "; WARNING: " << r.recovery_note;
      } else {
        os << r.recovery_note;
      }
      os << "\n";
    }
    for (const auto& p : r.phases) SummarizePhase(os, p, o.sampling_ms);
  }
  return os.str();
}

// Rows of the comparison: load, then each phase, by name.
static std::vector<std::string> RowNames(const std::vector<TargetResult>& results) {
  std::vector<std::string> rows;
  auto add = [&](const std::string& n) {
    for (auto& x : rows)
      if (x == n) return;
    rows.push_back(n);
  };
  for (const auto& r : results) {
    if (r.loaded) add("load");
    for (const auto& p : r.phases) add(p.name);
  }
  return rows;
}

static const PhaseResult* FindPhase(const TargetResult& r, const std::string& name) {
  if (name == "load") return r.loaded ? &r.load : nullptr;
  for (const auto& p : r.phases)
    if (p.name == name) return p.skipped ? nullptr : &p;
  return nullptr;
}

// The median over rounds of p's throughput in a round divided by the
// baseline's in the same round (rounds where either did nothing are left
// out; NAN if none is left). A round's two chunks ran close together in
// time, so each ratio is little affected by load drifting over the run, and
// the median ignores the odd round hit by a burst.
static double MedianRoundRatio(const PhaseResult& p, const PhaseResult& base) {
  std::vector<double> r;
  for (const Chunk& c : p.chunks)
    for (const Chunk& b : base.chunks)
      if (b.round == c.round && c.ops && c.seconds > 0 && b.ops && b.seconds > 0)
        r.push_back((double(c.ops) / c.seconds) / (double(b.ops) / b.seconds));
  if (r.empty()) return NAN;
  std::sort(r.begin(), r.end());
  const size_t n = r.size();
  return n % 2 ? r[n / 2] : (r[n / 2 - 1] + r[n / 2]) / 2;
}

std::string FormatComparison(const BenchOptions& o, const std::vector<TargetResult>& results) {
  if (results.size() < 2) return "";
  std::ostringstream os;
  const auto rows = RowNames(results);
  const TargetResult& base = results[0];
  os << "\nsame-run comparison" << RoundsText(o, results.size()) << "\n";
  // A grid of phases x targets; cell(p, bp) formats target phase p given
  // the baseline's (bp, null if the baseline has none).
  auto grid = [&](const std::string& title, auto cell) {
    os << "\n" << title << "\n";
    std::vector<std::vector<std::string>> cells;
    std::vector<std::string> head{"phase"};
    for (const auto& r : results)  // flag targets run with fewer threads (single-threaded indexes)
      head.push_back(r.threads != base.threads ? r.spec.name + " [" + std::to_string(r.threads) + " thr]" : r.spec.name);
    cells.push_back(head);
    for (const auto& row : rows) {
      std::vector<std::string> line{row};
      const PhaseResult* bp = FindPhase(base, row);
      for (const auto& r : results) {
        const PhaseResult* p = FindPhase(r, row);
        line.push_back(p ? cell(*p, bp) : "-");
      }
      cells.push_back(line);
    }
    std::vector<size_t> w(cells[0].size(), 0);
    for (const auto& l : cells)
      for (size_t i = 0; i < l.size(); i++) w[i] = std::max(w[i], l[i].size());
    for (const auto& l : cells) {
      for (size_t i = 0; i < l.size(); i++) {
        os << l[i] << std::string(w[i] - l[i].size() + 2, ' ');
      }
      os << "\n";
    }
  };
  auto table = [&](const std::string& title, auto value, bool higher_better, const char* better = nullptr) {
    grid(title + " (ratio against " + base.spec.name + "; " + (better ? better : higher_better ? ">1 is faster" : "<1 is faster") + ")",
         [&](const PhaseResult& p, const PhaseResult* bp) -> std::string {
           double v = value(p);
           double bv = bp ? value(*bp) : NAN;
           if (std::isnan(v)) return "-";
           std::string s = F("%.3f", v);
           if (!std::isnan(bv) && bv > 0) s += F(" (%.2fx)", v / bv);
           return s;
         });
  };
  table("throughput, Mops/s", [](const PhaseResult& p) { return p.throughput() / 1e6; }, true);
  table("p99 latency, us", [](const PhaseResult& p) { return p.latency.samples ? p.latency.p99_ns / 1e3 : NAN; }, false);
  bool any_pm = false;
  for (const auto& r : results)
    for (const auto& p : r.phases) any_pm |= HasPmCost(p);
  if (any_pm)
    table("PM lines flushed per op", [](const PhaseResult& p) { return PerOp(p.pm.lines_flushed, p); }, false,
          "<1 is fewer; no ratio where it flushes nothing");
  if (EffectiveRounds(o, results.size()) > 1)
    grid("throughput ratio against " + base.spec.name +
             ", median of the per-round ratios (each pairs chunks run in the same round; >1 is faster)",
         [&](const PhaseResult& p, const PhaseResult* bp) {
           const double m = bp ? MedianRoundRatio(p, *bp) : NAN;
           return std::isnan(m) ? std::string("-") : F("%.3f", m);
         });
  return os.str();
}

static json LatencyJson(const LatencySummary& l) {
  return json{{"samples", l.samples}, {"avg", l.avg_ns},     {"min", l.min_ns},       {"p50", l.p50_ns},
              {"p90", l.p90_ns},      {"p99", l.p99_ns},     {"p99.9", l.p999_ns},    {"p99.99", l.p9999_ns},
              {"p99.999", l.p99999_ns}, {"max", l.max_ns}};
}

static json RatiosJson(const Ratios& r) {
  json j;
  for (int t = 0; t < kNumOpTypes; t++) j[OpName(OpType(t))] = r.r[t];
  return j;
}

static json PhaseJson(const PhaseResult& p, int sampling_ms) {
  json j;
  j["name"] = p.name;
  j["ratios"] = RatiosJson(p.ratios);
  j["threads"] = p.threads;
  j["skipped"] = p.skipped;
  j["note"] = p.note;
  if (p.skipped) return j;
  j["requested_ops"] = p.requested;
  j["seconds"] = p.seconds;
  j["ops_per_sec"] = p.throughput();
  j["completed_total"] = p.total_completed();
  j["succeeded_total"] = p.total_succeeded();
  json c, s;
  for (int t = 0; t < kNumOpTypes; t++) {
    c[OpName(OpType(t))] = p.completed[t];
    s[OpName(OpType(t))] = p.succeeded[t];
  }
  j["completed"] = c;
  j["succeeded"] = s;
  j["scanned_records"] = p.scanned_records;
  json w = json::array();
  for (const auto& x : p.windows) w.push_back(json{{"end_s", x.end_seconds}, {"seconds", x.seconds}, {"ops", x.ops}, {"ops_per_sec", x.seconds > 0 ? double(x.ops) / x.seconds : 0}});
  j["windows"] = json{{"sampling_ms", sampling_ms}, {"mean_ops_per_sec", p.window_mean}, {"stddev_ops_per_sec", p.window_stddev},
                     {"full_windows", p.full_windows}, {"list", w}};
  json lat;
  lat["all"] = LatencyJson(p.latency);
  for (int t = 0; t < kNumOpTypes; t++)
    if (p.latency_by_type[t].samples) lat[OpName(OpType(t))] = LatencyJson(p.latency_by_type[t]);
  j["latency_ns"] = lat;
  json pm{{"instrumented", HasPmCost(p)},
          {"total", {{"stores", p.pm.stores}, {"store_bytes", p.pm.store_bytes}, {"lines_flushed", p.pm.lines_flushed},
                     {"fences", p.pm.fences}, {"nt_bytes", p.pm.nt_bytes}, {"line_writes", p.pm.line_writes},
                     {"allocs", p.pm.allocs}, {"frees", p.pm.frees}}},
          {"per_op", {{"stores", PerOp(p.pm.stores, p)}, {"store_bytes", PerOp(p.pm.store_bytes, p)},
                      {"lines_flushed", PerOp(p.pm.lines_flushed, p)}, {"fences", PerOp(p.pm.fences, p)},
                      {"nt_bytes", PerOp(p.pm.nt_bytes, p)}, {"line_writes", PerOp(p.pm.line_writes, p)},
                      {"allocs", PerOp(p.pm.allocs, p)}, {"frees", PerOp(p.pm.frees, p)}}}};
  j["pm_cost"] = pm;
  if (p.has_stats)
    j["stats"] = json{{"records", p.stats.records}, {"pm_bytes", p.stats.pm_bytes}, {"dram_bytes", p.stats.dram_bytes},
                      {"recovery_seconds", p.stats.recovery_seconds}};
  else
    j["stats"] = nullptr;
  // The target's share of each round: where it ran in the round's order.
  json chunks = json::array();
  for (const auto& c : p.chunks)
    chunks.push_back(json{{"round", c.round}, {"position", c.position}, {"ops", c.ops}, {"seconds", c.seconds},
                          {"after", c.after.empty() ? json(nullptr) : json(c.after)}});
  j["chunks"] = chunks;
  return j;
}

std::string ToJson(const BenchOptions& o, const Environment& env, const std::vector<TargetResult>& results) {
  json j;
  j["tool"] = "pmbench";
  j["version"] = env.version;
  j["environment"] = json{{"command_line", env.command_line}, {"start_time_utc", env.start_time_utc}, {"hostname", env.hostname},
                          {"flush_instruction", env.flush_instr}, {"hardware_threads", env.hardware_threads}};
  json opt;
  opt["records"] = o.records;
  opt["operations"] = o.operations;
  opt["threads"] = o.threads;
  opt["key_size"] = o.key_size;
  opt["value_size"] = o.value_size;
  opt["key_prefix"] = o.key_prefix;
  opt["read_ratio"] = o.ratios[OpType::kRead];
  opt["insert_ratio"] = o.ratios[OpType::kInsert];
  opt["update_ratio"] = o.ratios[OpType::kUpdate];
  opt["remove_ratio"] = o.ratios[OpType::kRemove];
  opt["scan_ratio"] = o.ratios[OpType::kScan];
  opt["scan_size"] = o.scan_size;
  opt["distribution"] = DistributionName(o.distribution);
  opt["skew"] = o.skew;
  opt["seed"] = o.seed;
  opt["mode"] = o.time_mode ? "time" : "operation";
  opt["seconds"] = o.seconds;
  opt["sampling_ms"] = o.sampling_ms;
  opt["latency_sampling"] = o.latency_sampling;
  opt["pool_path"] = o.pool_path;
  opt["pool_size"] = o.pool_size;
  opt["skip_load"] = o.skip_load;
  opt["recovery"] = o.recovery;
  opt["persist_mode"] = pmindex::pm::PersistModeName(o.persist_mode);
  opt["write_latency_ns"] = o.write_latency_ns;
  opt["sequential"] = o.sequential;
  opt["rounds"] = EffectiveRounds(o, results.size());
  json ph = json::array();
  for (const auto& p : o.phases) ph.push_back(json{{"name", p.name}, {"ratios", RatiosJson(p.ratios)}});
  opt["phases"] = ph;
  opt["params"] = o.params;
  json idx = json::array(), inp = json::array();
  for (const auto& r : results) (r.spec.plugin.empty() ? idx : inp).push_back(r.spec.plugin.empty() ? r.spec.name : r.spec.plugin);
  opt["index"] = idx;
  opt["input"] = inp;
  j["options"] = opt;

  json res = json::array();
  for (const auto& r : results) {
    json t;
    t["name"] = r.spec.name;
    t["kind"] = r.kind;
    t["plugin"] = r.spec.plugin;
    t["description"] = r.description;
    t["persistent"] = r.persistent;
    t["ordered"] = r.ordered;
    t["concurrent"] = r.concurrent;
    t["threads"] = r.threads;
    t["pool_path"] = r.pool_path;
    t["mapping"] = r.mapping.empty() ? json(nullptr) : json(r.mapping);
    t["error"] = r.error;
    t["load"] = r.loaded ? PhaseJson(r.load, o.sampling_ms) : json(nullptr);
    if (r.has_recovery)
      t["recovery"] = json{{"note", r.recovery_note}, {"reopen_seconds", r.recovery_seconds},
                           {"index_recovery_seconds", r.index_recovery_seconds >= 0 ? json(r.index_recovery_seconds) : json(nullptr)},
                           {"probed_records", r.recovery_probed}, {"found_records", r.recovery_found}};
    else
      t["recovery"] = nullptr;
    json phases = json::array();
    for (const auto& p : r.phases) phases.push_back(PhaseJson(p, o.sampling_ms));
    t["phases"] = phases;
    res.push_back(t);
  }
  j["results"] = res;

  // The comparison table in numbers: throughput ratios against the first.
  json cmp;
  if (!results.empty()) {
    cmp["baseline"] = results[0].spec.name;
    json rows = json::array();
    for (const auto& row : RowNames(results)) {
      json vals;
      const PhaseResult* bp = FindPhase(results[0], row);
      for (const auto& r : results) {
        const PhaseResult* p = FindPhase(r, row);
        if (!p) {
          vals[r.spec.name] = nullptr;
          continue;
        }
        double v = p->throughput();
        double bv = bp ? bp->throughput() : 0;
        const double m = bp ? MedianRoundRatio(*p, *bp) : NAN;
        vals[r.spec.name] = json{{"ops_per_sec", v}, {"ratio", bv > 0 ? json(v / bv) : json(nullptr)},
                                 {"p99_ns", p->latency.samples ? json(p->latency.p99_ns) : json(nullptr)},
                                 {"round_ratio_median", std::isnan(m) ? json(nullptr) : json(m)}};
      }
      rows.push_back(json{{"phase", row}, {"values", vals}});
    }
    cmp["rows"] = rows;
  }
  j["comparison"] = cmp;
  return j.dump(2) + "\n";
}

}  // namespace pmbench
