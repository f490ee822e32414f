// workload_test.cc: pmbench's key generation (tools/pmbench/workload.h):
// unique load keys, inserts always new and removes/updates/reads always
// existing (also with 2 threads, where PiBench's own generator fails), the
// hot-set share of the skewed distributions, reproducibility from the seed,
// and a real 2-thread run against dram_btree in which every insert and
// remove succeeds.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <unordered_set>

#include "bench.h"
#include "pmbench_test_util.h"
#include "workload.h"

namespace pmbench {
namespace {

TEST(KeyGen, ScatterIsABijection) {
  Rng rng(7);
  for (int i = 0; i < 10000; i++) {
    uint64_t x = rng.Next();
    EXPECT_EQ(UnscatterKey(ScatterId(x)), x);
  }
  EXPECT_NE(ScatterId(1), 1u);
}

TEST(KeyGen, LoadKeysAreUniqueU64) {
  KeyCodec c(8, "", 8);
  std::unordered_set<uint64_t> seen;
  const uint64_t n = 200000;
  for (uint64_t id = 0; id < n; id++) {
    uint64_t k;
    c.EncodeKey(id, reinterpret_cast<char*>(&k));
    EXPECT_TRUE(seen.insert(k).second) << "id " << id;
    EXPECT_EQ(c.DecodeKey(reinterpret_cast<char*>(&k)), id);
  }
  EXPECT_EQ(seen.size(), n);
  // Scattered over the whole domain: the top byte takes many values.
  std::set<uint64_t> top;
  for (uint64_t k : seen) top.insert(k >> 56);
  EXPECT_GT(top.size(), 250u);
}

TEST(KeyGen, LoadKeysAreUniqueBytesWithPrefix) {
  KeyCodec c(20, "user", 16);
  std::set<std::string> seen;
  const uint64_t n = 50000;
  std::string k(20, '\0');
  for (uint64_t id = 0; id < n; id++) {
    c.EncodeKey(id, k.data());
    EXPECT_EQ(k.substr(0, 4), "user");
    EXPECT_TRUE(seen.insert(k).second);
    EXPECT_EQ(c.DecodeKey(k.data()), id);
  }
  // memcmp order of byte keys == numeric order of the hash.
  uint64_t a = 5, b = 6;
  std::string ka(20, '\0'), kb(20, '\0');
  c.EncodeKey(a, ka.data());
  c.EncodeKey(b, kb.data());
  EXPECT_EQ(ka < kb, ScatterId(a) < ScatterId(b));
}

TEST(KeyGen, BadKeySpecsAreRejected) {
  EXPECT_TRUE(KeyCodec::Validate(8, "", 8).ok());
  EXPECT_TRUE(KeyCodec::Validate(0, "", 8).IsInvalidArgument());
  EXPECT_TRUE(KeyCodec::Validate(8, "p", 8).IsInvalidArgument());
  EXPECT_TRUE(KeyCodec::Validate(10, "abc", 8).IsInvalidArgument());
  EXPECT_TRUE(KeyCodec::Validate(11, "abc", 8).ok());
  EXPECT_TRUE(KeyCodec::Validate(4, "", 8).IsInvalidArgument());
  EXPECT_TRUE(KeyCodec::Validate(8, "", 0).IsInvalidArgument());
  EXPECT_TRUE(KeyCodec::Validate(8, "", 100000).IsInvalidArgument());
  EXPECT_TRUE(RankGenerator::Validate(Distribution::kSelfSimilar, 0.7).IsInvalidArgument());
  EXPECT_TRUE(RankGenerator::Validate(Distribution::kZipfian, 1.0).IsInvalidArgument());
  Ratios r;
  r[OpType::kInsert] = 0.5;  // read 1 + insert 0.5
  EXPECT_TRUE(ValidateRatios(r).IsInvalidArgument());
  r[OpType::kRead] = 0.5;
  EXPECT_TRUE(ValidateRatios(r).ok());
}

// Drives T streams round-robin against one global set of live ids and checks
// every operation's target: inserts new, everything else existing.
void CheckStreams(int T, Distribution dist, double skew) {
  const uint64_t n = 20000;
  std::set<uint64_t> live;
  for (uint64_t i = 0; i < n; i++) live.insert(i);
  std::vector<ThreadKeys> keys;
  for (int t = 0; t < T; t++) keys.emplace_back(t, T, n);
  uint64_t total = 0;
  for (auto& k : keys) total += k.live.size();
  ASSERT_EQ(total, n);
  Ratios r;
  r[OpType::kRead] = 0.2;
  r[OpType::kInsert] = 0.3;
  r[OpType::kUpdate] = 0.1;
  r[OpType::kRemove] = 0.3;
  r[OpType::kScan] = 0.1;
  for (int phase = 0; phase < 3; phase++) {
    std::vector<RankGenerator> ranks;
    std::vector<OpStream> streams;
    for (int t = 0; t < T; t++) {
      ranks.emplace_back(dist, skew);
      ranks.back().Prepare(keys[t].live.size());
    }
    for (int t = 0; t < T; t++) streams.emplace_back(&keys[t], r, &ranks[t], MixSeed(42, phase, t));
    uint64_t counts[kNumOpTypes] = {};
    for (int i = 0; i < 30000; i++) {
      for (int t = 0; t < T; t++) {
        Op op;
        ASSERT_TRUE(streams[t].Next(&op));
        counts[int(op.type)]++;
        if (op.type == OpType::kInsert) {
          ASSERT_GE(op.id, n);
          ASSERT_TRUE(live.insert(op.id).second) << "insert of an existing id " << op.id << " by thread " << t;
        } else if (op.type == OpType::kRemove) {
          ASSERT_EQ(live.erase(op.id), 1u) << "remove of a missing id " << op.id << " by thread " << t;
        } else {
          ASSERT_TRUE(live.count(op.id)) << OpName(op.type) << " of a missing id " << op.id;
        }
      }
    }
    for (int ty = 0; ty < kNumOpTypes; ty++) EXPECT_GT(counts[ty], 0u);
  }
  total = 0;
  for (auto& k : keys) total += k.live.size();
  EXPECT_EQ(total, live.size());
}

TEST(KeyGen, TargetsAreRightOneThread) { CheckStreams(1, Distribution::kUniform, 0); }
TEST(KeyGen, TargetsAreRightTwoThreads) { CheckStreams(2, Distribution::kUniform, 0); }
TEST(KeyGen, TargetsAreRightTwoThreadsSelfSimilar) { CheckStreams(2, Distribution::kSelfSimilar, 0.2); }
TEST(KeyGen, TargetsAreRightThreeThreadsZipfian) { CheckStreams(3, Distribution::kZipfian, 0.99); }

// Share of read accesses that land on the 20% smallest loaded ids.
double HotShare(int T, Distribution d, double skew, double hot_fraction, uint64_t* max_id_count = nullptr) {
  const uint64_t n = 100000;
  std::vector<ThreadKeys> keys;
  std::vector<RankGenerator> ranks;
  for (int t = 0; t < T; t++) {
    keys.emplace_back(t, T, n);
    ranks.emplace_back(d, skew);
    ranks.back().Prepare(keys.back().live.size());
  }
  Ratios r;  // read only
  std::vector<OpStream> streams;
  for (int t = 0; t < T; t++) streams.emplace_back(&keys[t], r, &ranks[t], MixSeed(1729, 1, t));
  std::vector<uint32_t> per_id(n, 0);
  const int draws = 1000000;
  uint64_t hot = 0;
  for (int i = 0; i < draws; i++) {
    Op op;
    EXPECT_TRUE(streams[i % T].Next(&op));
    EXPECT_EQ(op.type, OpType::kRead);
    per_id[op.id]++;
    hot += op.id < uint64_t(hot_fraction * double(n));
  }
  if (max_id_count) *max_id_count = *std::max_element(per_id.begin(), per_id.end());
  return double(hot) / draws;
}

TEST(KeyGen, SelfSimilarPuts80PercentOn20PercentOfKeys) {
  EXPECT_NEAR(HotShare(1, Distribution::kSelfSimilar, 0.2, 0.2), 0.8, 0.01);
  EXPECT_NEAR(HotShare(2, Distribution::kSelfSimilar, 0.2, 0.2), 0.8, 0.01);
  // Skew 0.1: 90% on 10%.
  EXPECT_NEAR(HotShare(1, Distribution::kSelfSimilar, 0.1, 0.1), 0.9, 0.01);
}

TEST(KeyGen, UniformIsFlatAndZipfianIsSkewed) {
  EXPECT_NEAR(HotShare(1, Distribution::kUniform, 0, 0.2), 0.2, 0.01);
  uint64_t top = 0;
  double z = HotShare(1, Distribution::kZipfian, 0.99, 0.2, &top);
  EXPECT_GT(z, 0.8);  // zipf(0.99) over 1e5 keys: ~87% on the top 20%
  EXPECT_GT(top, 50000u);  // the hottest key alone gets ~8% of the draws
}

TEST(KeyGen, ReproducibleFromSeed) {
  auto run = [](uint64_t seed) {
    ThreadKeys k(0, 1, 1000);
    RankGenerator rg(Distribution::kSelfSimilar, 0.2);
    rg.Prepare(k.live.size());
    Ratios r;
    r[OpType::kRead] = 0.4;
    r[OpType::kInsert] = 0.3;
    r[OpType::kRemove] = 0.3;
    OpStream s(&k, r, &rg, seed);
    std::vector<std::pair<int, uint64_t>> v;
    for (int i = 0; i < 5000; i++) {
      Op op;
      EXPECT_TRUE(s.Next(&op));
      v.push_back({int(op.type), op.id});
    }
    return v;
  };
  EXPECT_EQ(run(5), run(5));
  EXPECT_NE(run(5), run(6));
}

TEST(KeyGen, ExhaustedLiveSetIsReported) {
  ThreadKeys k(0, 1, 10);
  RankGenerator rg(Distribution::kUniform, 0);
  Ratios r;
  r[OpType::kRead] = 0;
  r[OpType::kRemove] = 1;
  OpStream s(&k, r, &rg, 1);
  Op op;
  for (int i = 0; i < 10; i++) ASSERT_TRUE(s.Next(&op));
  EXPECT_FALSE(s.Next(&op));
}

// The real driver with 2 threads on dram_btree: every insert and remove of
// every phase succeeds, and so does every read, update and scan.
TEST(Driver, TwoThreadsEveryOperationSucceeds) {
  BenchOptions o;
  o.records = 20000;
  o.operations = 20000;
  o.threads = 2;
  o.progress = false;
  o.sampling_ms = 10;
  o.latency_sampling = 0.5;
  testutil::AddPhases(&o, {"read", "insert", "update", "delete", "scan", "mixed"});
  std::vector<TargetSpec> targets{{"dram_btree", ""}};
  std::vector<TargetResult> results;
  ASSERT_TRUE(RunBenchmark(o, targets, &results).ok());
  ASSERT_EQ(results.size(), 1u);
  const TargetResult& r = results[0];
  EXPECT_EQ(r.error, "");
  EXPECT_EQ(r.threads, 2);
  ASSERT_TRUE(r.loaded);
  EXPECT_EQ(r.load.completed[int(OpType::kInsert)], 20000u);
  EXPECT_EQ(r.load.succeeded[int(OpType::kInsert)], 20000u);
  ASSERT_EQ(r.phases.size(), 6u);
  for (const auto& p : r.phases) {
    EXPECT_FALSE(p.skipped) << p.name;
    EXPECT_EQ(p.total_completed(), 20000u) << p.name;
    for (int t = 0; t < kNumOpTypes; t++) EXPECT_EQ(p.succeeded[t], p.completed[t]) << p.name << " " << OpName(OpType(t));
    EXPECT_GT(p.latency.samples, 0u);
    EXPECT_LE(p.latency.p50_ns, p.latency.p99_ns);
    EXPECT_LE(p.latency.p99_ns, p.latency.max_ns);
    ASSERT_TRUE(p.has_stats);
  }
  // 20000 loaded, +20000 inserted, -20000 removed, mixed: +20% -10%.
  const auto& mixed = r.phases[5];
  EXPECT_EQ(mixed.stats.records, 20000 + mixed.completed[int(OpType::kInsert)] - mixed.completed[int(OpType::kRemove)]);
  // Scans near the end of the key space return fewer than 100 records.
  EXPECT_LE(r.phases[4].scanned_records, 20000u * 100u);
  EXPECT_GT(r.phases[4].scanned_records, 20000u * 95u);
}

TEST(Driver, BadOptionsAreRejected) {
  BenchOptions o;
  o.ratios[OpType::kInsert] = 0.5;  // sums to 1.5
  std::vector<TargetResult> results;
  EXPECT_TRUE(RunBenchmark(o, {{"dram_btree", ""}}, &results).IsInvalidArgument());
  std::vector<TargetSpec> t;
  EXPECT_TRUE(ResolveTargets("no_such_index", "", &t).IsInvalidArgument());
  EXPECT_TRUE(ResolveTargets("", "/nonexistent/libx.so", &t).IsInvalidArgument());
  EXPECT_TRUE(ResolveTargets("", "", &t).IsInvalidArgument());
  ASSERT_TRUE(ResolveTargets("all", "", &t).ok());
  ASSERT_FALSE(t.empty());
  EXPECT_EQ(t[0].name, "dram_btree");
}

TEST(Driver, TooManyRemovesSkipThePhase) {
  BenchOptions o;
  o.records = 1000;
  o.operations = 5000;
  o.progress = false;
  PhaseSpec ps;
  ASSERT_TRUE(PhaseByName("delete", o.ratios, &ps).ok());
  o.phases.push_back(ps);
  std::vector<TargetResult> results;
  ASSERT_TRUE(RunBenchmark(o, {{"dram_btree", ""}}, &results).ok());
  ASSERT_EQ(results[0].phases.size(), 1u);
  EXPECT_TRUE(results[0].phases[0].skipped);
  EXPECT_NE(results[0].phases[0].note.find("removes"), std::string::npos);
}

}  // namespace
}  // namespace pmbench
