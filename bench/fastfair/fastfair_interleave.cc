// fastfair_interleave: same-run throughput ratios of fastfair against
// dram_btree that hold on a loaded machine. Both indexes run the SAME
// operations (pmbench's count-mode sequence: load N random u64 keys, insert
// P more, update P, delete P, then --repeat times: find P, scan P/5 of 100
// records) in chunks of --chunk operations (scans: --chunk/20), alternating which index goes first; each index's time
// is the sum of its chunks. Load bursts of other processes then hit both
// indexes alike, where pmbench runs a whole phase of one index, then of the
// other (its ratios moved by up to 1.5x between runs on the shared VM).
// Ratios here have no harness cost per operation (no rank draw, no plugin
// wrapper: docs/fastfair.md "Why fastfair_figures gives lower ratios"), so
// they are lower than pmbench's; use them to compare builds (before/after),
// and pmbench for the goals.
// Usage: fastfair_interleave [--records N] [--ops P] [--chunk C] [--index NAME]
//        [--repeat R] [--param NAME=VALUE]... (fastfair parameters)
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "pmindex/index.h"
#include "pmindex/pm/pool.h"

using namespace pmindex;

namespace {

using pmindex::benchutil::Die;
using pmindex::benchutil::Now;
using pmindex::benchutil::Scramble;



}  // namespace

int main(int argc, char** argv) {
  uint64_t n = 1000000, p = 1000000, chunk = 50000;
  int repeat = 1;
  std::string other = "fastfair";
  std::map<std::string, std::string> params;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    auto next = [&] { return pmindex::benchutil::NextArg(argc, argv, &i); };
    if (a == "--records") n = std::stoull(next());
    else if (a == "--ops") p = std::stoull(next());
    else if (a == "--chunk") chunk = std::stoull(next());
    else if (a == "--index") other = next();
    else if (a == "--repeat") repeat = std::stoi(next());
    else if (a == "--param") {
      std::string kv = next();
      const size_t eq = kv.find('=');
      if (eq == std::string::npos) {
        std::fprintf(stderr, "--param wants NAME=VALUE\n");
        return 2;
      }
      params[kv.substr(0, eq)] = kv.substr(eq + 1);
    } else {
      std::fprintf(stderr, "usage: %s [--records N] [--ops P] [--chunk C] [--repeat R] [--index NAME] [--param NAME=VALUE]...\n", argv[0]);
      return 2;
    }
  }
  const std::vector<std::string> names = {"dram_btree", other};
  std::vector<std::unique_ptr<Index>> idx(2);
  std::vector<std::string> paths(2);
  for (int x = 0; x < 2; x++) {
    Options o;
    paths[x] = "/dev/shm/fastfair-interleave-" + std::to_string(x) + "-" + std::to_string(getpid()) + ".pool";
    pm::Pool::Remove(paths[x]);
    o.pool_path = paths[x];
    o.pool_size = 64ull << 20;
    o.max_pool_size = 1ull << 30;  // (valgrind cannot reserve the default 64 GiB)
    if (x == 1) o.params = params;
    Die(OpenIndex(names[x], o, &idx[x]), "open");
  }
  // Operation streams (identical for both indexes).
  std::mt19937_64 rng(1729);
  std::vector<uint64_t> live;  // ids present
  live.reserve(n + p);
  uint64_t next_id = 0;
  uint64_t sink = 0;
  struct Phase {
    const char* name;
    uint64_t ops;
  };
  auto key = [](uint64_t id) { return Scramble(id); };
  auto S = [](const uint64_t& w) { return Slice(reinterpret_cast<const char*>(&w), 8); };
  // op(x, i): operation i of the current phase on index x.
  std::printf("%-8s %12s %12s %8s   (us/op; ratio = dram_btree time / %s time, >1: %s faster)\n", "phase",
              "dram_btree", other.c_str(), "ratio", other.c_str(), other.c_str());
  auto run = [&](const char* name, uint64_t ops, const std::function<void(int, uint64_t)>& op, uint64_t chunk) {
    double t[2] = {0, 0};
    int first = 0;
    for (uint64_t b = 0; b < ops; b += chunk) {
      const uint64_t e = std::min(ops, b + chunk);
      for (int r = 0; r < 2; r++) {
        const int x = r ? 1 - first : first;
        const double t0 = Now();
        for (uint64_t i = b; i < e; i++) op(x, i);
        t[x] += Now() - t0;
      }
      first = 1 - first;
    }
    std::printf("%-8s %12.3f %12.3f %8.3f\n", name, t[0] / ops * 1e6, t[1] / ops * 1e6, t[0] / t[1]);
    std::fflush(stdout);
  };
  // load (both, not interleaved: not a goal phase)
  for (uint64_t i = 0; i < n; i++) {
    const uint64_t k = key(next_id), v = next_id;
    for (int x = 0; x < 2; x++) Die(idx[x]->Insert(S(k), S(v)), "load");
    live.push_back(next_id++);
  }
  std::vector<uint64_t> ids(p);
  // insert: new ids
  for (uint64_t i = 0; i < p; i++) ids[i] = next_id + i;
  run("insert", p, [&](int x, uint64_t i) { const uint64_t k = key(ids[i]), v = ids[i]; Die(idx[x]->Insert(S(k), S(v)), "insert"); },
      chunk);
  for (uint64_t i = 0; i < p; i++) live.push_back(next_id++);
  // update: random live ids
  for (uint64_t i = 0; i < p; i++) ids[i] = live[rng() % live.size()];
  run("update", p, [&](int x, uint64_t i) { const uint64_t k = key(ids[i]), v = i; Die(idx[x]->Update(S(k), S(v)), "update"); },
      chunk);
  // delete: P distinct random live ids
  std::shuffle(live.begin(), live.end(), rng);
  const uint64_t dels = std::min<uint64_t>(p, live.size());
  for (uint64_t i = 0; i < dels; i++) ids[i] = live[live.size() - 1 - i];
  run("delete", dels, [&](int x, uint64_t i) { const uint64_t k = key(ids[i]); Die(idx[x]->Remove(S(k)), "delete"); }, chunk);
  live.resize(live.size() - dels);
  std::string val;
  for (int rep = 0; rep < repeat; rep++) {
    // find: random live ids
    for (uint64_t i = 0; i < p; i++) ids[i] = live[rng() % live.size()];
    run("find", p, [&](int x, uint64_t i) { const uint64_t k = key(ids[i]); Die(idx[x]->Find(S(k), &val), "find"); sink += val[0]; },
        chunk);
    // scan of 100 from random keys
    const uint64_t scans = std::max<uint64_t>(1, p / 5);
    for (uint64_t i = 0; i < scans; i++) ids[i] = rng();
    run("scan100", scans,
        [&](int x, uint64_t i) {
          const uint64_t k = ids[i];
          Die(idx[x]->Scan(S(k), 100, [&](Slice a, Slice b) { sink += uint8_t(a[0]) + uint8_t(b[0]); return true; }), "scan");
        },
        chunk / 20);
  }
  for (int x = 0; x < 2; x++) {
    idx[x].reset();
    pm::Pool::Remove(paths[x]);
  }
  return sink == 42 ? 3 : 0;
}
