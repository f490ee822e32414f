// json_test.cc: runs the pmbench binary on tiny workloads and checks that
// --json parses (nlohmann_json), holds every option and figure, and agrees
// with the human summary on stdout; that bad options exit with status 2 and a
// message; and that several targets (built-in + plugin) give the side-by-side
// comparison.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "bench.h"
#include "pmbench_test_util.h"

namespace {

using json = nlohmann::json;

using pmbench::testutil::LoadJsonAndRemove;
using pmbench::testutil::PmRun;

PmRun Pmbench(const std::string& args, bool merge_stderr = false) { return pmbench::testutil::RunPmbench(PMBENCH_BIN, args, merge_stderr); }

std::string TmpJson(const char* tag) { return pmbench::testutil::TmpJsonPath("jsontest", tag); }

TEST(PmbenchJson, SingleIndexMatchesSummary) {
  const std::string path = TmpJson("single");
  PmRun r = Pmbench("--index dram_btree -n 3000 -p 2000 -t 2 --phases read,insert,update,delete,scan,mixed --distribution SELFSIMILAR "
                  "--skew 0.2 --seed 99 --latency_sampling 1 --sampling_ms 5 --json " + path);
  ASSERT_EQ(r.rc, 0) << r.out;
  json j = LoadJsonAndRemove(path);

  // Every option, as given.
  const json& o = j.at("options");
  EXPECT_EQ(o.at("records"), 3000);
  EXPECT_EQ(o.at("operations"), 2000);
  EXPECT_EQ(o.at("threads"), 2);
  EXPECT_EQ(o.at("key_size"), 8);
  EXPECT_EQ(o.at("value_size"), 8);
  EXPECT_EQ(o.at("distribution"), "SELFSIMILAR");
  EXPECT_DOUBLE_EQ(o.at("skew").get<double>(), 0.2);
  EXPECT_EQ(o.at("seed"), 99);
  EXPECT_EQ(o.at("mode"), "operation");
  EXPECT_EQ(o.at("sampling_ms"), 5);
  EXPECT_EQ(o.at("persist_mode"), "flush");
  EXPECT_EQ(o.at("phases").size(), 6u);
  EXPECT_EQ(o.at("index").at(0), "dram_btree");
  for (const char* k : {"key_prefix", "read_ratio", "insert_ratio", "update_ratio", "remove_ratio", "scan_ratio", "scan_size",
                        "seconds", "latency_sampling", "pool_path", "pool_size", "skip_load", "recovery", "write_latency_ns", "params", "input"})
    EXPECT_TRUE(o.contains(k)) << k;
  EXPECT_NE(j.at("environment").at("command_line").get<std::string>().find("--seed 99"), std::string::npos);

  ASSERT_EQ(j.at("results").size(), 1u);
  const json& t = j.at("results").at(0);
  EXPECT_EQ(t.at("name"), "dram_btree");
  EXPECT_EQ(t.at("error"), "");
  EXPECT_EQ(t.at("load").at("completed_total"), 3000);
  EXPECT_EQ(t.at("load").at("succeeded").at("insert"), 3000);
  ASSERT_EQ(t.at("phases").size(), 6u);
  const char* names[] = {"read", "insert", "update", "delete", "scan", "mixed"};
  for (size_t i = 0; i < 6; i++) {
    const json& p = t.at("phases").at(i);
    SCOPED_TRACE(names[i]);
    EXPECT_EQ(p.at("name"), names[i]);
    EXPECT_EQ(p.at("completed_total"), 2000);
    EXPECT_EQ(p.at("succeeded_total"), 2000);  // every op succeeds, 2 threads included
    // The summary shows the same throughput and counts.
    const double ops = p.at("ops_per_sec").get<double>();
    EXPECT_GT(ops, 0);
    EXPECT_NE(r.out.find("  " + std::string(names[i]) + ": 2000 ops in "), std::string::npos);
    EXPECT_NE(r.out.find(pmbench::FormatRate(ops)), std::string::npos) << pmbench::FormatRate(ops);
    for (const auto& [op, n] : p.at("completed").items()) {
      if (n.get<uint64_t>() == 0) continue;
      EXPECT_NE(r.out.find(op + " " + std::to_string(n.get<uint64_t>()) + " completed / " +
                           std::to_string(p.at("succeeded").at(op).get<uint64_t>()) + " succeeded"),
                std::string::npos)
          << op;
    }
    const json& lat = p.at("latency_ns").at("all");
    EXPECT_EQ(lat.at("samples"), 2000);  // --latency_sampling 1
    for (const char* q : {"p50", "p90", "p99", "p99.9", "p99.99", "p99.999", "max"}) EXPECT_TRUE(lat.contains(q)) << q;
    EXPECT_NE(r.out.find("p99.999 " + pmbench::FormatNs(lat.at("p99.999").get<double>())), std::string::npos);
    EXPECT_TRUE(p.at("windows").contains("stddev_ops_per_sec"));
    EXPECT_FALSE(p.at("windows").at("list").empty());
    EXPECT_TRUE(p.at("pm_cost").contains("per_op"));
    EXPECT_EQ(p.at("stats").at("pm_bytes"), 0);  // dram_btree is transient
  }
  // Scans near the end of the key space return fewer than 100 records.
  EXPECT_LE(t.at("phases").at(4).at("scanned_records"), 2000 * 100);
  EXPECT_GT(t.at("phases").at(4).at("scanned_records"), 2000 * 80);
}

TEST(PmbenchJson, SeveralTargetsGiveAComparison) {
  const std::string path = TmpJson("multi");
  const std::string plugin = std::string(PMBENCH_PLUGIN_DIR) + "/libpibench_dram_btree.so";
  PmRun r = Pmbench("--index dram_btree --input " + plugin + " -n 2000 -p 1000 --phases read,mixed --json " + path);
  ASSERT_EQ(r.rc, 0) << r.out;
  json j = LoadJsonAndRemove(path);
  ASSERT_EQ(j.at("results").size(), 2u);
  EXPECT_EQ(j.at("results").at(1).at("kind"), "plugin");
  EXPECT_EQ(j.at("results").at(1).at("plugin"), plugin);
  EXPECT_EQ(j.at("comparison").at("baseline"), "dram_btree");
  ASSERT_EQ(j.at("comparison").at("rows").size(), 3u);  // load, read, mixed
  EXPECT_DOUBLE_EQ(j.at("comparison").at("rows").at(1).at("values").at("dram_btree").at("ratio").get<double>(), 1.0);
  EXPECT_NE(r.out.find("ratio against dram_btree"), std::string::npos);
  // The plugin run did the very same operations.
  for (size_t i = 0; i < 2; i++)
    EXPECT_EQ(j.at("results").at(0).at("phases").at(i).at("completed"), j.at("results").at(1).at("phases").at(i).at("completed"));

  // --sequential runs the same operations, one target after the other.
  r = Pmbench("--index dram_btree --input " + plugin + " -n 2000 -p 1000 --phases read,mixed --sequential --json " + path);
  ASSERT_EQ(r.rc, 0) << r.out;
  json k = LoadJsonAndRemove(path);
  EXPECT_EQ(k.at("options").at("sequential"), true);
  for (size_t t = 0; t < 2; t++)
    for (size_t i = 0; i < 2; i++)
      EXPECT_EQ(k.at("results").at(t).at("phases").at(i).at("completed"), j.at("results").at(t).at("phases").at(i).at("completed"));
}

TEST(PmbenchJson, ThirdPartyPluginThroughTheAbi) {
  const std::string path = TmpJson("third");
  PmRun r = Pmbench("--input " + std::string(PMBENCH_THIRD_PARTY_PLUGIN) +
                    " -n 3000 -p 2000 -t 2 -k 16 -v 24 -f ab --phases read,insert,update,delete,scan,mixed --json " + path);
  ASSERT_EQ(r.rc, 0) << r.out;
  json j = LoadJsonAndRemove(path);
  const json& t = j.at("results").at(0);
  EXPECT_EQ(t.at("kind"), "plugin");
  EXPECT_EQ(t.at("threads"), 2);
  EXPECT_EQ(t.at("load").at("succeeded_total"), 3000);
  ASSERT_EQ(t.at("phases").size(), 6u);
  for (const auto& p : t.at("phases")) {
    EXPECT_EQ(p.at("completed_total"), 2000) << p.at("name");
    EXPECT_EQ(p.at("succeeded_total"), 2000) << p.at("name");
    EXPECT_EQ(p.at("pm_cost").at("instrumented"), false);  // not built on libpmindex
    EXPECT_TRUE(p.at("stats").is_null());
  }
  EXPECT_GT(t.at("phases").at(4).at("scanned_records"), 2000 * 80);
}

TEST(PmbenchJson, TimeModeAndRecovery) {
  const std::string path = TmpJson("time");
  PmRun r = Pmbench("--index dram_btree -n 1000 --mode time --seconds 0.3 --sampling_ms 50 -r 0.5 -u 0.5 --recovery --json " + path);
  ASSERT_EQ(r.rc, 0) << r.out;
  json j = LoadJsonAndRemove(path);
  const json& p = j.at("results").at(0).at("phases").at(0);
  EXPECT_EQ(p.at("name"), "run");
  EXPECT_GE(p.at("seconds").get<double>(), 0.3);
  EXPECT_GE(p.at("windows").at("list").size(), 4u);
  EXPECT_EQ(p.at("completed_total"), p.at("succeeded_total"));
  EXPECT_EQ(j.at("results").at(0).at("recovery").at("note"), "transient index: nothing to recover");
}

// The pool mapping a persistent index ran on (here /dev/shm: not DAX) is in
// the JSON and on stderr; transient indexes have none.
TEST(PmbenchJson, PoolMappingIsReported) {
  const std::string path = TmpJson("mapping");
  PmRun r = Pmbench("--index dram_btree,fptree -n 2000 -p 1000 --phases read --json " + path, true);
  ASSERT_EQ(r.rc, 0) << r.out;
  json j = LoadJsonAndRemove(path);
  ASSERT_EQ(j.at("results").size(), 2u);
  EXPECT_TRUE(j.at("results").at(0).at("mapping").is_null());
  EXPECT_EQ(j.at("results").at(1).at("mapping"), "shared (MAP_SHARED, not DAX)");
  EXPECT_NE(r.out.find("fptree: pool"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("mapped shared (MAP_SHARED, not DAX)"), std::string::npos) << r.out;
}

TEST(PmbenchJson, BadOptionsExitWithAMessage) {
  PmRun r = Pmbench("--index dram_btree -r 0.5 -i 0.2", true);
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.out.find("sum to"), std::string::npos) << r.out;
  r = Pmbench("--index nope", true);
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.out.find("unknown index"), std::string::npos) << r.out;
  r = Pmbench("--index dram_btree -k 8 -f pre", true);
  EXPECT_EQ(r.rc, 2);
  r = Pmbench("--index dram_btree --distribution WEIRD", true);
  EXPECT_EQ(r.rc, 2);
  r = Pmbench("", true);
  EXPECT_EQ(r.rc, 2);
  r = Pmbench("--list", false);
  EXPECT_EQ(r.rc, 0);
  EXPECT_NE(r.out.find("dram_btree"), std::string::npos);
}

}  // namespace
