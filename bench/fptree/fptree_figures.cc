// fptree_figures: the hardware-independent FPTree figures of docs/fptree.md.
//   1. PM cost per insert/update/delete at steady state (lines flushed and
//      fences, average and most common value), fptree / fptree_single / ptree.
//   2. Keys probed per successful find vs E[T] of paper sec. 4.2.
//   3. DRAM share of the footprint with --big records (default 10M).
//   4. Recovery time of that tree vs rebuilding its records into dram_btree.
// Usage: fptree_figures [--records N] [--big N] [--skip-big] [--skip-small]
//                       [--big-variants fptree_single,fptree] [--skip-rebuild] [--force]
// Pools live in /dev/shm and are removed at exit. The machine may be shared:
// times are wall-clock of this run only. --big 100000000 (the paper's 100M)
// needs about 3.5 GB of /dev/shm for the pool plus about 6.5 GB of process
// memory for the rebuild comparison (records copy, shuffle order, dram_btree;
// --skip-rebuild leaves only the pool and the tree's DRAM part); the tool
// checks MemAvailable first and refuses to start without room (--force).
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "fptree/fptree.h"
#include "pmindex/index.h"
#include "pmindex/pm/persist.h"
#include "pmindex/pm/pool.h"

using namespace pmindex;

namespace {

using benchutil::Now;
using benchutil::Scramble;

std::string PoolPath(const std::string& name) { return "/dev/shm/fptree-figures-" + name + "-" + std::to_string(getpid()) + ".pool"; }

// E[T] = 1/2 (1 + m / (n (1 - ((n-1)/n)^m))), n = 256.
double Formula(double m) { return 0.5 * (1 + m / (256.0 * (1 - std::pow(255.0 / 256.0, m)))); }
// Exact: the searched key matches itself, each of the other m-1 keys matches
// with probability 1/n: E[K] = 1 + (m-1)/n, E[T] = (1 + E[K]) / 2.
double Exact(double m) { return 1 + (m - 1) / 512.0; }

void CostAndProbes(const std::string& name, uint64_t records) {
  std::string path = PoolPath(name);
  Options o;
  o.pool_path = path;
  o.pool_size = 256ull << 20;
  std::unique_ptr<Index> idx;
  Status s = OpenIndex(name, o, &idx);
  if (!s.ok()) {
    std::printf("%s: %s\n", name.c_str(), s.ToString().c_str());
    return;
  }
  for (uint64_t i = 0; i < records; i++) idx->Insert(U64Slice(Scramble(i)), U64Slice(i));
  // Probes per successful find.
  uint64_t p0 = internal::FPTreeKeyProbes();
  const uint64_t finds = 1000000;
  for (uint64_t i = 0; i < finds; i++) idx->Find(U64Slice(Scramble(i % records)), nullptr);
  double probes = double(internal::FPTreeKeyProbes() - p0) / finds;
  // Average valid entries per leaf (the occupancy the formula should use).
  IndexStats st = idx->Stats();
  uint64_t leaves = 0;
  idx->ForEachOwnedBlock([&](uint64_t) { leaves++; });
  double m = name == "fptree_single" ? 0 : double(st.records) / double(leaves - 1);
  std::printf("%s (%lu records loaded, u64 keys and values)\n", name.c_str(), records);
  std::printf("  keys probed per successful find: %.3f", probes);
  if (name == "ptree") std::printf("  (linear search: (m'+1)/2 = %.2f at m' = %.1f)\n", (m + 1) / 2, m);
  else if (m > 0)
    std::printf("\n    paper E[T]: %.3f at m = 56, %.3f at the measured occupancy m' = %.1f; exact 1+(m-1)/2n: %.3f at m = 56, %.3f at m'\n",
                Formula(56), Formula(m), m, Exact(56), Exact(m));
  else std::printf("\n    paper E[T]: %.3f at m = 56; exact 1+(m-1)/2n: %.3f at m = 56\n", Formula(56), Exact(56));
  const uint64_t ops = 100000;
  struct Acc {
    double lines = 0, fences = 0;
    std::map<std::pair<uint64_t, uint64_t>, uint64_t> hist;
  };
  auto measure = [&](auto fn) {
    Acc a;
    for (uint64_t i = 0; i < ops; i++) {
      pm::Counters c0 = pm::ThreadCounters();
      fn(i);
      pm::Counters d = pm::ThreadCounters() - c0;
      a.lines += d.lines_flushed;
      a.fences += d.fences;
      a.hist[{d.lines_flushed, d.fences}]++;
    }
    auto mode = std::max_element(a.hist.begin(), a.hist.end(), [](auto& x, auto& y) { return x.second < y.second; });
    std::printf("  %-7s lines/op %.3f  fences/op %.3f  most common: %lu lines + %lu fences (%.1f%% of ops)\n", "", a.lines / ops,
                a.fences / ops, mode->first.first, mode->first.second, 100.0 * mode->second / ops);
  };
  std::printf("  PM cost at steady state, %lu ops each:\n", ops);
  std::printf("  insert:");
  measure([&](uint64_t i) { idx->Insert(U64Slice(Scramble(records + i)), U64Slice(i)); });
  std::printf("  update:");
  measure([&](uint64_t i) { idx->Update(U64Slice(Scramble(i * 7 % records)), U64Slice(i + 1)); });
  std::printf("  delete:");
  measure([&](uint64_t i) { idx->Remove(U64Slice(Scramble(records + i))); });
  idx.reset();
  pm::Pool::Remove(path);
}

// MemAvailable from /proc/meminfo, bytes (0 if unknown).
uint64_t MemAvailable() {
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream is(line);
    std::string key;
    uint64_t kb = 0;
    if (is >> key >> kb && key == "MemAvailable:") return kb << 10;
  }
  return 0;
}
double PeakRssGiB() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1048576.0;  // ru_maxrss is in KiB
}
// Rough upper bounds from the 20M run (fptree_single: 32.8 B of PM per record,
// fptree 26.2 B; peak RSS 1.22 GiB = 65 B per record with the rebuild: the
// records (16 B), the shuffle order (8 B), a dram_btree), with margin.
uint64_t NeedBytes(uint64_t n, bool rebuild) { return n * (40 + (rebuild ? 72 : 4)) + (256ull << 20); }

void BigFigures(const std::string& name, uint64_t n, int threads, bool rebuild) {
  std::string path = PoolPath(name + "-big");
  Options o;
  o.pool_path = path;
  o.pool_size = std::max<uint64_t>(1ull << 30, n * 40);  // grows in place up to 64 GiB anyway
  o.recovery_threads = threads;
  std::unique_ptr<Index> idx;
  Status s = OpenIndex(name, o, &idx);
  if (!s.ok()) {
    std::printf("%s: %s\n", name.c_str(), s.ToString().c_str());
    return;
  }
  double t0 = Now();
  for (uint64_t i = 0; i < n; i++) idx->Insert(U64Slice(Scramble(i)), U64Slice(i));
  double load = Now() - t0;
  IndexStats st = idx->Stats();
  uint64_t inner_nodes = 0, leaves = 0;
  internal::FPTreeShape(idx.get(), &inner_nodes, &leaves);
  std::printf("%s, %lu records (random order, load %.1f s): PM %.1f MiB, DRAM %.2f MiB, DRAM share %.2f%% of the footprint\n",
              name.c_str(), st.records, load, st.pm_bytes / 1048576.0, st.dram_bytes / 1048576.0,
              100.0 * st.dram_bytes / double(st.dram_bytes + st.pm_bytes));
  std::printf("  %lu leaves (%.1f records per leaf), %lu DRAM inner nodes; peak RSS %.2f GiB\n", leaves,
              double(st.records) / double(leaves ? leaves : 1), inner_nodes, PeakRssGiB());
  if (!rebuild) {
    idx.reset();
    t0 = Now();
    s = OpenIndex(name, o, &idx);
    double rec = Now() - t0;
    bool ok = s.ok() && idx->Size() == n;
    std::printf("  recovery (open incl. pool mapping, %d threads): %.3f s (tree recovery %.3f s)%s; rebuild skipped\n", threads,
                rec, ok ? idx->Stats().recovery_seconds : 0.0, ok ? "" : "  [CONTENTS WRONG]");
    idx.reset();
    pm::Pool::Remove(path);
    return;
  }
  // Recovery vs a full rebuild of dram_btree with the same records.
  std::vector<std::pair<uint64_t, uint64_t>> recs;
  recs.reserve(n);
  idx->Scan(U64Slice(0), SIZE_MAX, [&](Slice k, Slice v) {
    recs.emplace_back(SliceToU64(k), SliceToU64(v));
    return true;
  });
  idx.reset();  // clean close
  t0 = Now();
  s = OpenIndex(name, o, &idx);
  double rec = Now() - t0;
  double inner = idx->Stats().recovery_seconds;
  bool ok = s.ok() && idx->Size() == n;
  idx.reset();
  std::unique_ptr<Index> dram;
  Options d;
  OpenIndex("dram_btree", d, &dram);
  std::mt19937_64 rng(5);
  std::vector<size_t> order(recs.size());
  for (size_t i = 0; i < order.size(); i++) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  t0 = Now();
  for (size_t i : order) dram->Insert(U64Slice(recs[i].first), U64Slice(recs[i].second));
  double rebuild_rand = Now() - t0;
  dram.reset();
  OpenIndex("dram_btree", d, &dram);
  t0 = Now();
  for (auto& r : recs) dram->Insert(U64Slice(r.first), U64Slice(r.second));
  double rebuild_sorted = Now() - t0;
  dram.reset();
  std::printf("  recovery (open incl. pool mapping, %d threads): %.3f s (tree recovery %.3f s)%s\n", threads, rec, inner,
              ok ? "" : "  [CONTENTS WRONG]");
  std::printf("  dram_btree rebuild of the same records: random order %.3f s (%.1fx slower than recovery), sorted %.3f s (%.1fx)\n",
              rebuild_rand, rebuild_rand / rec, rebuild_sorted, rebuild_sorted / rec);
  std::printf("  peak RSS %.2f GiB\n", PeakRssGiB());
  pm::Pool::Remove(path);
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  uint64_t records = 1000000, big = 10000000;
  bool skip_big = false, skip_small = false, rebuild = true, force = false;
  std::vector<std::string> variants = {"fptree_single", "fptree"};
  for (int i = 1; i < argc; i++) {
    if (!std::strcmp(argv[i], "--records") && i + 1 < argc) records = std::strtoull(argv[++i], nullptr, 10);
    else if (!std::strcmp(argv[i], "--big") && i + 1 < argc) big = std::strtoull(argv[++i], nullptr, 10);
    else if (!std::strcmp(argv[i], "--skip-big")) skip_big = true;
    else if (!std::strcmp(argv[i], "--skip-small")) skip_small = true;
    else if (!std::strcmp(argv[i], "--skip-rebuild")) rebuild = false;
    else if (!std::strcmp(argv[i], "--force")) force = true;
    else if (!std::strcmp(argv[i], "--big-variants") && i + 1 < argc) {
      variants.clear();
      std::stringstream ss(argv[++i]);
      for (std::string v; std::getline(ss, v, ',');)
        if (!v.empty()) variants.push_back(v);
    } else {
      std::fprintf(stderr,
                   "usage: %s [--records N] [--big N] [--skip-big] [--skip-small] [--big-variants a,b] [--skip-rebuild] [--force]\n",
                   argv[0]);
      return 2;
    }
  }
  std::printf("flush instruction: %s, persist mode: %s\n\n", pm::FlushInstrName(pm::GetFlushInstr()),
              pm::PersistModeName(pm::GetPersistMode()));
  if (!skip_small)
    for (std::string n : {"fptree", "fptree_single", "ptree"}) CostAndProbes(n, records);
  if (!skip_big) {
    // One variant at a time (its pool is removed before the next), so the
    // peak is one pool plus one rebuild.
    uint64_t need = NeedBytes(big, rebuild), avail = MemAvailable();
    std::printf("\n%lu records: needs about %.1f GiB (pool in /dev/shm + process), MemAvailable %.1f GiB\n", big, need / 1073741824.0,
                avail / 1073741824.0);
    if (avail && need > avail && !force) {
      std::fprintf(stderr, "not enough memory for --big %lu (use --skip-rebuild, a smaller --big, or --force)\n", big);
      return 1;
    }
    for (auto& v : variants) BigFigures(v, big, 2, rebuild);
  }
  return 0;
}
