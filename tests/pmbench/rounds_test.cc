// rounds_test.cc: pmbench's rounds (--rounds, tools/pmbench/bench.h): the
// schedule (the target order rotates by one each round, so every target is
// in every position equally often), the chunks of a quota adding up to
// exactly the quota (remainders, more rounds than operations), the operation
// stream of every target being exactly the one of --rounds 1 (per-type
// completed and succeeded counts, scanned records and record counts of every
// phase, with a different seed shown to change them), threads out of keys in
// time mode, the option checks (--rounds 0, --rounds > 1 with --sequential),
// the JSON and summary reporting the rounds and the median of the per-round
// ratios, and time mode in rounds (every target runs in every round; the
// phase's windows account for all its operations; the progress line names
// the round). No timing assertions.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench.h"
#include "pmbench_test_util.h"
#include "pmindex/index.h"

namespace pmbench {
namespace {

using json = nlohmann::json;

// Over each period of the design (and so over any whole number of periods,
// from any starting row) every target is in every position equally often and
// every ordered pair of distinct targets is adjacent within a round equally
// often. Fails on the former rotation RoundOrder (r+k) mod T, whose
// predecessors are those of one cyclic sequence (T >= 3).
TEST(Rounds, OrderIsABalancedLatinSquare) {
  EXPECT_EQ(RoundPeriod(1), 1);
  for (size_t n = 1; n <= 7; n++) {
    SCOPED_TRACE(std::to_string(n) + " targets");
    const int period = RoundPeriod(n);
    EXPECT_EQ(period, n <= 1 ? 1 : int(n % 2 == 0 ? n : 2 * n));
    for (int start : {0, 1, 5}) {  // RunBenchmark offsets the rows by the step number
      std::vector<std::vector<int>> at(n, std::vector<int>(n, 0));     // at[target][position]
      std::vector<std::vector<int>> after(n, std::vector<int>(n, 0));  // after[target][predecessor]
      for (int r = start; r < start + 2 * period; r++) {
        std::vector<size_t> order = RoundOrder(n, r);
        ASSERT_EQ(order.size(), n);
        EXPECT_EQ(order, RoundOrder(n, r + period)) << "periodic";
        std::vector<size_t> sorted = order;
        std::sort(sorted.begin(), sorted.end());
        for (size_t k = 0; k < n; k++) ASSERT_EQ(sorted[k], k) << "a permutation";
        for (size_t k = 0; k < n; k++) {
          at[order[k]][k]++;
          if (k > 0) after[order[k]][order[k - 1]]++;
        }
      }
      for (size_t t = 0; t < n; t++) {
        for (size_t k = 0; k < n; k++) EXPECT_EQ(at[t][k], 2 * period / int(n)) << "target " << t << " position " << k;
        for (size_t u = 0; u < n; u++)
          EXPECT_EQ(after[t][u], t == u ? 0 : 2 * period / int(n)) << "target " << t << " right after " << u;
      }
    }
  }
}

TEST(Rounds, ChunksAddUpToTheQuota) {
  for (uint64_t q : {uint64_t(0), uint64_t(1), uint64_t(5), uint64_t(7), uint64_t(1003), uint64_t(1000003), UINT64_MAX / 3, UINT64_MAX}) {
    for (int rounds : {1, 2, 7, 10, 13, 1000}) {
      SCOPED_TRACE(std::to_string(q) + " ops in " + std::to_string(rounds) + " rounds");
      EXPECT_EQ(ChunkBegin(q, 0, rounds), 0u);
      EXPECT_EQ(ChunkBegin(q, rounds, rounds), q);  // the chunks add up exactly
      const uint64_t lo = q / uint64_t(rounds);
      uint64_t empty = 0;
      for (int r = 0; r < rounds; r++) {
        const uint64_t a = ChunkBegin(q, r, rounds), b = ChunkBegin(q, r + 1, rounds);
        ASSERT_LE(a, b);
        EXPECT_TRUE(b - a == lo || b - a == lo + 1) << "round " << r << ": " << b - a;  // as even as can be
        empty += a == b;
      }
      if (q < uint64_t(rounds)) {
        EXPECT_EQ(empty, uint64_t(rounds) - q);  // more rounds than operations
      }
    }
  }
}

TEST(Rounds, DefaultsAndOptionChecks) {
  BenchOptions o;
  EXPECT_EQ(EffectiveRounds(o, 1), 1);
  EXPECT_EQ(EffectiveRounds(o, 2), kDefaultRounds);
  EXPECT_EQ(kDefaultRounds, 10);
  // A whole number of design periods, at least 10.
  EXPECT_EQ(EffectiveRounds(o, 3), 12);
  EXPECT_EQ(EffectiveRounds(o, 4), 12);
  EXPECT_EQ(EffectiveRounds(o, 5), 10);
  EXPECT_EQ(EffectiveRounds(o, 6), 12);
  EXPECT_EQ(EffectiveRounds(o, 7), 14);
  o.sequential = true;
  EXPECT_EQ(EffectiveRounds(o, 3), 1);
  EXPECT_TRUE(o.Validate().ok());
  o.rounds = 1;
  EXPECT_TRUE(o.Validate().ok());
  o.rounds = 2;
  EXPECT_TRUE(o.Validate().IsInvalidArgument());
  std::vector<TargetResult> results;
  EXPECT_TRUE(RunBenchmark(o, {{"dram_btree", ""}, {"dram_btree", ""}}, &results).IsInvalidArgument());
  o.sequential = false;
  EXPECT_TRUE(o.Validate().ok());
  EXPECT_EQ(EffectiveRounds(o, 1), 2);
  EXPECT_EQ(EffectiveRounds(o, 3), 2);
  o.rounds = -1;
  EXPECT_TRUE(o.Validate().IsInvalidArgument());
  o.rounds = kMaxRounds + 1;
  EXPECT_TRUE(o.Validate().IsInvalidArgument());
}

// The second deterministic target: fptree if this build has it.
std::string SecondTarget() { return pmindex::FindIndexInfo("fptree", nullptr) ? "fptree" : "dram_btree"; }

BenchOptions StreamOptions(int rounds, uint64_t seed) {
  BenchOptions o;
  o.records = 6000;
  o.operations = 5003;  // not a multiple of the rounds or the threads
  o.threads = 2;
  o.distribution = Distribution::kSelfSimilar;
  o.skew = 0.2;
  o.seed = seed;
  o.progress = false;
  o.rounds = rounds;
  o.ratios.r[0] = 0.4;
  o.ratios[OpType::kInsert] = 0.2;
  o.ratios[OpType::kUpdate] = 0.2;
  o.ratios[OpType::kRemove] = 0.1;
  o.ratios[OpType::kScan] = 0.1;
  testutil::AddPhases(&o, {"read", "insert", "update", "delete", "scan", "custom"});
  return o;
}

std::vector<TargetResult> RunTwo(const BenchOptions& o) {
  std::vector<TargetResult> results;
  Status s = RunBenchmark(o, {{"dram_btree", ""}, {SecondTarget(), ""}}, &results);
  EXPECT_TRUE(s.ok()) << s.ToString();
  for (const auto& r : results) EXPECT_EQ(r.error, "") << r.spec.name;
  return results;
}

// Everything in a phase's result that depends on which operations ran (and
// only on that: records scanned count too unless other threads write while
// the scans run, which makes what a scan sees depend on timing).
std::vector<uint64_t> StreamFigures(const PhaseResult& p) {
  std::vector<uint64_t> v(p.completed, p.completed + kNumOpTypes);
  v.insert(v.end(), p.succeeded, p.succeeded + kNumOpTypes);
  const bool writes = p.ratios[OpType::kInsert] > 0 || p.ratios[OpType::kUpdate] > 0 || p.ratios[OpType::kRemove] > 0;
  if (p.threads == 1 || !writes) v.push_back(p.scanned_records);
  // Which operations are timed (the latency-sampling generator continues
  // across chunks; restarting it per chunk changes these counts).
  for (int ty = 0; ty < kNumOpTypes; ty++) v.push_back(p.latency_by_type[ty].samples);
  v.push_back(p.requested);
  v.push_back(p.has_stats ? p.stats.records : 0);
  return v;
}

TEST(Rounds, SameOperationStreamAsOneRound) {
  const std::vector<TargetResult> one = RunTwo(StreamOptions(1, 77)), seven = RunTwo(StreamOptions(7, 77));
  ASSERT_EQ(one.size(), 2u);
  ASSERT_EQ(seven.size(), 2u);
  for (size_t t = 0; t < 2; t++) {
    SCOPED_TRACE(one[t].spec.name);
    ASSERT_TRUE(one[t].loaded && seven[t].loaded);
    EXPECT_EQ(StreamFigures(one[t].load), StreamFigures(seven[t].load));
    ASSERT_EQ(one[t].phases.size(), 6u);
    ASSERT_EQ(seven[t].phases.size(), 6u);
    for (size_t i = 0; i < 6; i++) {
      const PhaseResult &a = one[t].phases[i], &b = seven[t].phases[i];
      SCOPED_TRACE(a.name);
      EXPECT_FALSE(b.skipped);
      EXPECT_EQ(b.total_completed(), 5003u);
      EXPECT_EQ(StreamFigures(a), StreamFigures(b));
      for (int ty = 0; ty < kNumOpTypes; ty++) EXPECT_EQ(b.succeeded[ty], b.completed[ty]) << OpName(OpType(ty));
      // One chunk per round, at the scheduled position, adding up.
      ASSERT_EQ(a.chunks.size(), 1u);
      EXPECT_EQ(a.chunks[0].position, int(t));  // --rounds 1: the order given
      ASSERT_EQ(b.chunks.size(), 7u);
      uint64_t sum = 0;
      double secs = 0;
      for (int r = 0; r < 7; r++) {
        EXPECT_EQ(b.chunks[r].round, r);
        EXPECT_EQ(RoundOrder(2, r + int(i) + 1)[b.chunks[r].position], t) << "round " << r;  // rows offset by the step (load: 0)
        if (b.chunks[r].position == 1) {
          EXPECT_EQ(b.chunks[r].after, seven[1 - t].spec.name) << "round " << r;
        }
        if (r == 0 && b.chunks[r].position == 0) {
          EXPECT_EQ(b.chunks[r].after, "") << "the step's first chunk";
        }
        EXPECT_GT(b.chunks[r].ops, 0u);
        sum += b.chunks[r].ops;
        secs += b.chunks[r].seconds;
      }
      EXPECT_EQ(sum, b.total_completed());
      EXPECT_NEAR(secs, b.seconds, 1e-6);  // seconds = sum of the chunk times
      // The windows account for every operation, on the phase clock.
      uint64_t wops = 0;
      double last_end = 0;
      for (const auto& w : b.windows) {
        wops += w.ops;
        EXPECT_GE(w.end_seconds, last_end);
        last_end = w.end_seconds;
      }
      EXPECT_EQ(wops, b.total_completed());
      EXPECT_LE(last_end, b.seconds + 1e-9);
    }
  }
  // The figures compared above do depend on the stream: another seed changes
  // the op mix of the custom phase and where the scans start.
  const std::vector<TargetResult> other = RunTwo(StreamOptions(7, 78));
  ASSERT_EQ(other.size(), 2u);
  ASSERT_EQ(other[1].phases.size(), 6u);
  EXPECT_NE(StreamFigures(other[1].phases[5]), StreamFigures(seven[1].phases[5]));
  EXPECT_NE(other[1].phases[4].scanned_records, seven[1].phases[4].scanned_records);
}

// The keys and values of every call, not only the counts: a recording plugin
// (third_party_plugin.cc with PMBENCH_DIGEST_FILE) sums a hash of every
// (operation, key, value, result); --rounds 7 must give the digest of
// --rounds 1. ZIPFIAN, whose rank distribution is prepared once per phase
// from the live-set size, with insert and delete phases that change that
// size. Fails if the value numbering restarts per chunk (the values differ),
// if the distribution is re-prepared per chunk (other keys are drawn in the
// delete and custom phases), or if the latency sampling restarts per chunk
// (the sample counts in StreamFigures).
TEST(Rounds, SameKeysAndValuesAsOneRound) {
  const std::string file = testing::TempDir() + "pmbench-rounds-digest-" + std::to_string(getpid());
  std::remove(file.c_str());
  setenv("PMBENCH_DIGEST_FILE", file.c_str(), 1);
  std::vector<std::vector<uint64_t>> figures[2];
  for (int k = 0; k < 2; k++) {
    BenchOptions o = StreamOptions(k == 0 ? 1 : 7, 77);
    o.distribution = Distribution::kZipfian;
    o.skew = 0.99;
    std::vector<TargetResult> results;
    Status s = RunBenchmark(o, {{"digest", PMBENCH_THIRD_PARTY_PLUGIN}}, &results);
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_EQ(results.size(), 1u);
    ASSERT_EQ(results[0].error, "");
    ASSERT_EQ(results[0].phases.size(), 6u);
    for (const auto& p : results[0].phases) {
      EXPECT_FALSE(p.skipped) << p.name;
      EXPECT_EQ(p.total_completed(), p.total_succeeded()) << p.name;
      figures[k].push_back(StreamFigures(p));
    }
    EXPECT_EQ(results[0].phases[0].chunks.size(), size_t(o.rounds));
  }
  unsetenv("PMBENCH_DIGEST_FILE");
  EXPECT_EQ(figures[0], figures[1]);
  std::ifstream in(file);
  uint64_t digest[2] = {0, 0}, calls[2] = {0, 0};
  ASSERT_TRUE(in >> digest[0] >> calls[0] >> digest[1] >> calls[1]) << "no digests in " << file;
  std::remove(file.c_str());
  EXPECT_EQ(calls[0], 6000u + 6 * 5003u);  // the load and six phases
  EXPECT_EQ(calls[1], calls[0]);
  EXPECT_EQ(digest[1], digest[0]) << "--rounds 7 ran other keys or values than --rounds 1";
}

TEST(Rounds, RemaindersAndMoreRoundsThanOperations) {
  BenchOptions o;
  o.records = 13;
  o.operations = 5;
  o.threads = 2;
  o.progress = false;
  o.rounds = 7;
  testutil::AddPhases(&o, {"read", "insert", "mixed"});
  std::vector<TargetResult> results;
  ASSERT_TRUE(RunBenchmark(o, {{"dram_btree", ""}, {SecondTarget(), ""}}, &results).ok());
  for (const auto& r : results) {
    SCOPED_TRACE(r.spec.name);
    EXPECT_EQ(r.error, "");
    EXPECT_EQ(r.load.total_completed(), 13u);
    EXPECT_EQ(r.load.total_succeeded(), 13u);
    ASSERT_EQ(r.load.chunks.size(), 7u);
    ASSERT_EQ(r.phases.size(), 3u);
    for (const auto& p : r.phases) {
      SCOPED_TRACE(p.name);
      EXPECT_EQ(p.total_completed(), 5u);
      EXPECT_EQ(p.total_succeeded(), 5u);
      ASSERT_EQ(p.chunks.size(), 7u);  // every round is recorded, empty ones too
      uint64_t sum = 0, empty = 0;
      for (const auto& c : p.chunks) {
        sum += c.ops;
        empty += c.ops == 0;
      }
      EXPECT_EQ(sum, 5u);
      EXPECT_GE(empty, 2u);  // 7 rounds, 5 operations
    }
    EXPECT_EQ(r.phases.back().stats.records, 13u + 5u + r.phases.back().completed[int(OpType::kInsert)] -
                                                 r.phases.back().completed[int(OpType::kRemove)]);
  }
}

// Time mode, removes outnumbering inserts: each thread runs out of live keys
// (after about 1500 operations, far less than the time allows); in rounds,
// the phase still ends there for each thread, with the note, and with the
// counts of one round (a thread out of keys runs nothing in later rounds).
TEST(Rounds, ThreadsOutOfKeysStop) {
  auto run = [](int rounds) {
    BenchOptions o;
    o.records = 300;
    o.threads = 2;
    o.progress = false;
    o.time_mode = true;
    o.seconds = 1;
    o.rounds = rounds;
    o.ratios.r[0] = 0;
    o.ratios[OpType::kInsert] = 0.45;
    o.ratios[OpType::kRemove] = 0.55;
    return RunTwo(o);
  };
  const std::vector<TargetResult> one = run(1), five = run(5);
  ASSERT_EQ(one.size(), 2u);
  ASSERT_EQ(five.size(), 2u);
  for (size_t t = 0; t < 2; t++) {
    SCOPED_TRACE(one[t].spec.name);
    ASSERT_EQ(one[t].phases.size(), 1u);
    ASSERT_EQ(five[t].phases.size(), 1u);
    const PhaseResult &a = one[t].phases[0], &b = five[t].phases[0];
    EXPECT_NE(b.note.find("ran out of live keys"), std::string::npos) << b.note;
    EXPECT_EQ(StreamFigures(a), StreamFigures(b));
    EXPECT_EQ(b.stats.records, 0u);  // every key removed, then nothing more
    ASSERT_EQ(b.chunks.size(), 5u);
  }
}

// --- the binary -------------------------------------------------------------

using testutil::LoadJsonAndRemove;
using testutil::PmRun;

PmRun Pmbench(const std::string& args, bool merge_stderr = false) { return testutil::RunPmbench(PMBENCH_BIN, args, merge_stderr); }

std::string TmpJson(const char* tag) { return testutil::TmpJsonPath("roundstest", tag); }

TEST(RoundsBinary, BadRoundsAreRejected) {
  PmRun r = Pmbench("--index dram_btree," + SecondTarget() + " -n 100 -p 100 --rounds 0", true);
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.out.find("--rounds must be at least 1"), std::string::npos) << r.out;
  r = Pmbench("--index dram_btree," + SecondTarget() + " -n 100 -p 100 --rounds 3 --sequential", true);
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.out.find("--sequential"), std::string::npos) << r.out;
  r = Pmbench("--index dram_btree," + SecondTarget() + " -n 100 -p 100 --rounds 1 --sequential --no_progress", true);
  EXPECT_EQ(r.rc, 0) << r.out;
}

TEST(RoundsBinary, ReportedInJsonAndSummary) {
  const std::string path = TmpJson("report");
  // Default: 10 rounds with several targets.
  PmRun r = Pmbench("--index dram_btree," + SecondTarget() + " -n 3000 -p 2000 --phases read,scan --json " + path);
  ASSERT_EQ(r.rc, 0) << r.out;
  json j = LoadJsonAndRemove(path);
  EXPECT_EQ(j.at("options").at("rounds"), 10);
  EXPECT_EQ(j.at("options").at("sequential"), false);
  EXPECT_NE(r.out.find("10 rounds per step (index order rotating each round)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("same-run comparison, 10 rounds"), std::string::npos) << r.out;
  for (size_t t = 0; t < 2; t++) {
    const json& res = j.at("results").at(t);
    size_t s = 0;  // the step: 0 load, 1 read, 2 scan
    for (const json& p : {res.at("load"), res.at("phases").at(0), res.at("phases").at(1)}) {
      ASSERT_EQ(p.at("chunks").size(), 10u) << p.at("name");
      uint64_t sum = 0;
      for (size_t k = 0; k < 10; k++) {
        const json& c = p.at("chunks").at(k);
        EXPECT_EQ(c.at("round"), k);
        // Round k of step s starts with target (k + s) mod 2.
        EXPECT_EQ(c.at("position"), (t + 2 - (k + s) % 2) % 2) << "round " << k;
        if (c.at("position") == 1) {
          EXPECT_EQ(c.at("after"), j.at("results").at(1 - t).at("name")) << "round " << k;
        }
        if (k == 0 && c.at("position") == 0) {
          EXPECT_TRUE(c.at("after").is_null());
        }
        sum += c.at("ops").get<uint64_t>();
      }
      EXPECT_EQ(sum, p.at("completed_total").get<uint64_t>());
      EXPECT_EQ(p.at("completed_total"), p.at("succeeded_total"));
      s++;
    }
  }
  // The median of the per-round ratios: 1 for the baseline, a ratio for the
  // other, in the JSON and as a table.
  EXPECT_NE(r.out.find("median of the per-round ratios"), std::string::npos) << r.out;
  for (const json& row : j.at("comparison").at("rows")) {
    SCOPED_TRACE(row.at("phase").get<std::string>());
    EXPECT_DOUBLE_EQ(row.at("values").at("dram_btree").at("round_ratio_median").get<double>(), 1.0);
    EXPECT_GT(row.at("values").at(SecondTarget()).at("round_ratio_median").get<double>(), 0.0);
  }
  // One target: one round, and the header says nothing new.
  r = Pmbench("--index dram_btree -n 1000 -p 1000 --json " + path);
  ASSERT_EQ(r.rc, 0) << r.out;
  j = LoadJsonAndRemove(path);
  EXPECT_EQ(j.at("options").at("rounds"), 1);
  EXPECT_EQ(r.out.find("round"), std::string::npos) << r.out;
  EXPECT_EQ(j.at("results").at(0).at("phases").at(0).at("chunks").size(), 1u);
  // --rounds 1 with several targets: one chunk each, in the order given.
  r = Pmbench("--index dram_btree," + SecondTarget() + " -n 1000 -p 1000 --rounds 1 --json " + path);
  ASSERT_EQ(r.rc, 0) << r.out;
  j = LoadJsonAndRemove(path);
  EXPECT_EQ(j.at("options").at("rounds"), 1);
  EXPECT_NE(r.out.find("1 round per step (each index's whole step in the order given)"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("median of the per-round ratios"), std::string::npos) << r.out;
  for (const json& row : j.at("comparison").at("rows")) {  // one round: the median is the ratio
    const json& v = row.at("values").at(SecondTarget());
    EXPECT_NEAR(v.at("round_ratio_median").get<double>(), v.at("ratio").get<double>(), 1e-9 * v.at("ratio").get<double>());
  }
  for (size_t t = 0; t < 2; t++) {
    const json& c = j.at("results").at(t).at("phases").at(0).at("chunks");
    ASSERT_EQ(c.size(), 1u);
    EXPECT_EQ(c.at(0).at("position"), t);
  }
}

TEST(RoundsBinary, TimeModeRunsEveryTargetInEveryRound) {
  const std::string path = TmpJson("time");
  // 2.1 s per phase in 3 rounds: progress lines (once a second of phase
  // time) fall in rounds 2 and 3.
  PmRun r = Pmbench("--index dram_btree," + SecondTarget() +
                        " -n 2000 --mode time --seconds 2.1 --rounds 3 --sampling_ms 50 --phases mixed --json " + path,
                    true);
  ASSERT_EQ(r.rc, 0) << r.out;
  json j = LoadJsonAndRemove(path);
  EXPECT_EQ(j.at("options").at("rounds"), 3);
  EXPECT_NE(r.out.find("mixed round 2/3 dram_btree"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("mixed round 3/3 " + SecondTarget()), std::string::npos) << r.out;
  for (size_t t = 0; t < 2; t++) {
    for (const json& p : j.at("results").at(t).at("phases")) {
      SCOPED_TRACE(p.at("name").get<std::string>() + " " + std::to_string(t));
      EXPECT_GT(p.at("completed_total").get<uint64_t>(), 0u);
      EXPECT_EQ(p.at("completed_total"), p.at("succeeded_total"));
      ASSERT_EQ(p.at("chunks").size(), 3u);
      uint64_t sum = 0;
      for (size_t k = 0; k < 3; k++) {
        EXPECT_GT(p.at("chunks").at(k).at("ops").get<uint64_t>(), 0u) << "round " << k;
        sum += p.at("chunks").at(k).at("ops").get<uint64_t>();
      }
      EXPECT_EQ(sum, p.at("completed_total").get<uint64_t>());
      uint64_t wops = 0;
      for (const json& w : p.at("windows").at("list")) wops += w.at("ops").get<uint64_t>();
      EXPECT_EQ(wops, p.at("completed_total").get<uint64_t>());
    }
  }
}

}  // namespace
}  // namespace pmbench

namespace pmbench {
namespace {

// A target that fails at setup leaves no hole in the schedule: the survivors'
// positions are their places among the targets that ran (balanced over the
// rounds), and their predecessors are survivors. Fails if the failed target
// keeps its slot (the survivors would get the nominal position 2).
TEST(RoundsBinary, FailedTargetLeavesNoHole) {
  const std::string path = TmpJson("failed"), bad = TmpJson("bad") + ".so";
  {
    std::ofstream f(bad);
    f << "not a plugin";
  }
  PmRun r = Pmbench("--index dram_btree," + SecondTarget() + " --input " + bad + " -n 2000 -p 2000 --rounds 4 --json " + path);
  std::remove(bad.c_str());
  ASSERT_EQ(r.rc, 1) << r.out;  // a target failed
  json j = LoadJsonAndRemove(path);
  ASSERT_EQ(j.at("results").size(), 3u);
  EXPECT_FALSE(j.at("results").at(2).at("error").get<std::string>().empty());
  for (size_t t = 0; t < 2; t++) {
    const json& res = j.at("results").at(t);
    for (const json& p : {res.at("load"), res.at("phases").at(0)}) {
      SCOPED_TRACE(res.at("name").get<std::string>() + " " + p.at("name").get<std::string>());
      ASSERT_EQ(p.at("chunks").size(), 4u);
      int at[2] = {0, 0};
      for (const json& c : p.at("chunks")) {
        const int pos = c.at("position");
        ASSERT_TRUE(pos == 0 || pos == 1) << pos;
        at[pos]++;
        if (pos == 1) {
          EXPECT_EQ(c.at("after"), j.at("results").at(1 - t).at("name"));
        }
      }
      EXPECT_EQ(at[0], 2);
      EXPECT_EQ(at[1], 2);
    }
  }
}

}  // namespace
}  // namespace pmbench
