// fptree_opcost: CPU cost per operation for callgrind (instruction counts do
// not depend on the machine's load, unlike throughput on a shared machine).
// For each index: load --records u64 records (keys = id * odd constant, as
// pmbench), then run --ops operations of each kind (find, insert, update,
// delete, scan of 100) on uniformly drawn live keys. Under valgrind each
// (index, phase) is dumped separately (CALLGRIND_DUMP_STATS_AT), so that
//   valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.%p build/bin/fptree_opcost
//   grep -H -E '^(desc: Trigger|summary|totals)' /tmp/cg.*
// gives the instructions of each phase; divide by --ops. Pools are capped
// (max_pool_size) so that valgrind can map them. Without valgrind it prints
// wall-clock times per phase (noisy on a shared machine).
// --skew h (0 < h <= 0.5) draws the finds' keys SELFSIMILAR as pmbench (a
// share 1-h of them on the share h of the smallest ids), e.g. for
// `valgrind --tool=callgrind --cache-sim=yes` miss counts under skew. An index
// may carry parameters: "fptree:inner_size=512:leaf_size=32".
// --find-only skips the other phases.
// Usage: fptree_opcost [--index a,b:param=v,...] [--records N] [--ops N] [--skew h] [--find-only]
#include <valgrind/callgrind.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "index_spec.h"
#include "pmindex/index.h"
#include "pmindex/pm/pool.h"

using namespace pmindex;

using benchutil::kMul;
using benchutil::Now;

namespace {

void Phase(const std::string& index, const char* phase, uint64_t ops, const std::function<void(uint64_t)>& fn) {
  CALLGRIND_ZERO_STATS;
  double t0 = Now();
  for (uint64_t i = 0; i < ops; i++) fn(i);
  double t = Now() - t0;
  std::string tag = index + "/" + phase;
  CALLGRIND_DUMP_STATS_AT(tag.c_str());
  if (!RUNNING_ON_VALGRIND) std::printf("  %-20s %8.3f us/op\n", tag.c_str(), 1e6 * t / double(ops));
}

void Run(const std::string& spec, uint64_t records, uint64_t ops, double skew, bool find_only) {
  Options o;
  std::string index;
  if (!benchutil::ParseIndexSpec(spec, &index, &o)) return;
  std::string path = "/dev/shm/fptree-opcost-" + index + "-" + std::to_string(getpid()) + ".pool";
  o.pool_path = path;
  o.pool_size = std::max<uint64_t>(64ull << 20, records * 96);
  o.max_pool_size = o.pool_size * 2;
  std::unique_ptr<Index> idx;
  Status s = OpenIndex(index, o, &idx);
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", index.c_str(), s.ToString().c_str());
    return;
  }
  std::vector<uint64_t> live(records);
  for (uint64_t i = 0; i < records; i++) live[i] = i;
  std::shuffle(live.begin(), live.end(), std::mt19937_64(1));
  for (uint64_t id : live) idx->Insert(U64Slice(id * kMul), U64Slice(id));
  std::mt19937_64 rng(7);
  std::string out;
  uint64_t next = records;
  // Find keys drawn up front (the draw's pow() stays out of the phase).
  std::vector<uint64_t> fk(ops);
  double expo = skew > 0 ? std::log(skew) / std::log(1 - skew) : 1;
  std::uniform_real_distribution<double> uni(0, 1);
  for (auto& k : fk)
    k = skew > 0 ? std::min<uint64_t>(uint64_t(double(records) * std::pow(uni(rng), expo)), records - 1) * kMul
                 : live[rng() % live.size()] * kMul;
  Phase(spec, "find", ops, [&](uint64_t i) { idx->Find(U64Slice(fk[i]), &out); });
  if (find_only) {
    idx.reset();
    pm::Pool::Remove(path);
    return;
  }
  Phase(spec, "insert", ops, [&](uint64_t) {
    live.push_back(next);
    idx->Insert(U64Slice(next * kMul), U64Slice(next));
    next++;
  });
  Phase(spec, "update", ops, [&](uint64_t i) { idx->Update(U64Slice(live[rng() % live.size()] * kMul), U64Slice(i)); });
  Phase(spec, "delete", ops, [&](uint64_t) {
    size_t r = rng() % live.size();
    idx->Remove(U64Slice(live[r] * kMul));
    live[r] = live.back();
    live.pop_back();
  });
  uint64_t sink = 0;
  Phase(spec, "scan100", ops / 10, [&](uint64_t) {
    idx->Scan(U64Slice(live[rng() % live.size()] * kMul), 100, [&](Slice k, Slice) {
      sink += k.size();
      return true;
    });
  });
  if (sink == 1) std::printf(" ");
  idx.reset();
  pm::Pool::Remove(path);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> indexes = {"dram_btree", "fptree", "fptree_single", "ptree"};
  uint64_t records = 200000, ops = 100000;
  double skew = 0;
  bool find_only = false;
  for (int i = 1; i < argc; i++) {
    if (!std::strcmp(argv[i], "--records") && i + 1 < argc) records = std::strtoull(argv[++i], nullptr, 10);
    else if (!std::strcmp(argv[i], "--ops") && i + 1 < argc) ops = std::strtoull(argv[++i], nullptr, 10);
    else if (!std::strcmp(argv[i], "--skew") && i + 1 < argc) skew = std::atof(argv[++i]);
    else if (!std::strcmp(argv[i], "--find-only")) find_only = true;
    else if (!std::strcmp(argv[i], "--index") && i + 1 < argc) {
      indexes.clear();
      std::stringstream ss(argv[++i]);
      for (std::string v; std::getline(ss, v, ',');)
        if (!v.empty()) indexes.push_back(v);
    } else {
      std::fprintf(stderr, "usage: %s [--index a,b:param=v,...] [--records N] [--ops N] [--skew h] [--find-only]\n", argv[0]);
      return 2;
    }
  }
  if (skew < 0 || skew > 0.5) {
    std::fprintf(stderr, "--skew must be in [0, 0.5]\n");
    return 2;
  }
  for (auto& ix : indexes) Run(ix, records, ops, skew, find_only);
  return 0;
}
