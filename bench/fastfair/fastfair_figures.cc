// fastfair_figures: the figures of docs/fastfair.md.
//   1. PM cost: cache lines flushed (and fences) per insert, splits included,
//      loading N random u64 keys into 512-byte nodes (paper sec. 6.4: ~4.2),
//      and per delete of N/10 random loaded keys, then of all the remaining
//      keys down to an empty tree (merges, root collapses, nodes freed).
//      N = --records and --big. Exact counts, independent of machine load.
//   2. Open time of a --big pool: fastfair (lazy recovery) vs fptree (rebuilds
//      its DRAM inner nodes).
// Throughput is not measured here: use `pmbench --index
// dram_btree,fptree,fastfair` (interleaved in balanced rounds, "median of the
// per-round ratios") for ratios against the baseline and
// `fastfair_interleave` (chunks alternating, no harness cost per operation)
// to compare builds (docs/fastfair.md).
// Usage: fastfair_figures [--records N] [--big N] [--skip-big]
//        [--persist_mode flush|none]
// Pools live in /dev/shm and are removed at exit.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "fastfair/fastfair.h"
#include "bench_util.h"
#include "pmindex/index.h"
#include "pmindex/pm/allocator.h"
#include "pmindex/pm/persist.h"
#include "pmindex/pm/pool.h"

using namespace pmindex;

namespace {

using pmindex::benchutil::Die;
using pmindex::benchutil::Now;
using pmindex::benchutil::Scramble;

std::string K(uint64_t i) {
  uint64_t k = Scramble(i);
  return std::string(reinterpret_cast<const char*>(&k), 8);
}
std::string V(uint64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); }

std::string PoolPath(const std::string& name) {
  return "/dev/shm/fastfair-figures-" + name + "-" + std::to_string(getpid()) + ".pool";
}

Options Opts(const std::string& path) {
  Options o;
  o.pool_path = path;
  o.pool_size = 256ull << 20;
  return o;
}


void PmCost(uint64_t n) {
  std::string path = PoolPath("cost");
  pm::Pool::Remove(path);
  std::unique_ptr<Index> idx;
  Die(OpenIndex("fastfair", Opts(path), &idx), "open");
  pm::ResetThreadCounters();
  double t0 = Now();
  for (uint64_t i = 0; i < n; i++) Die(idx->Insert(K(i), V(i)), "insert");
  double t1 = Now();
  pm::Counters ins = pm::ThreadCounters();
  std::mt19937_64 rng(1);
  std::vector<uint64_t> del(n);
  for (uint64_t i = 0; i < n; i++) del[i] = i;
  std::shuffle(del.begin(), del.end(), rng);
  del.resize(n / 10);
  const size_t half = del.size() / 2;
  // Deletes in the running tree, then reopen (lazy recovery), then deletes
  // again: the first writer of each node after an open repairs it (one more
  // line: its generation word).
  pm::ResetThreadCounters();
  for (size_t i = 0; i < half; i++) Die(idx->Remove(K(del[i])), "remove");
  pm::Counters rm1 = pm::ThreadCounters();
  idx.reset();
  double o0 = Now();
  Die(OpenIndex("fastfair", Opts(path), &idx), "reopen");
  double open_secs = Now() - o0;
  pm::ResetThreadCounters();
  for (size_t i = half; i < del.size(); i++) Die(idx->Remove(K(del[i])), "remove");
  pm::Counters rm2 = pm::ThreadCounters();
  const double h1 = double(half), h2 = double(del.size() - half);
  std::printf("  %9llu keys: lines/insert %.2f  fences/insert %.2f  allocs/insert %.4f  (load %.1f s, height %d)\n",
              (unsigned long long)n, double(ins.lines_flushed) / n, double(ins.fences) / n, double(ins.allocs) / n, t1 - t0,
              internal::fastfair::Height(idx.get()));
  std::printf("  %9s       lines/delete %.2f  fences/delete %.2f  (%zu random deletes)\n", "", rm1.lines_flushed / h1,
              rm1.fences / h1, half);
  std::printf("  %9s       after reopen: lines/delete %.2f  fences/delete %.2f  (%zu more; first touch repairs)\n", "",
              rm2.lines_flushed / h2, rm2.fences / h2, del.size() - half);
  std::printf("  %9s       open (OpenIndex, pool and index) %.6f s\n", "", open_secs);
  // Delete everything that is left, in random order: merges (leaves and
  // internal nodes) and root collapses included, nodes freed.
  const uint64_t blocks_full = idx->pool()->allocator().BlocksInUse();
  std::vector<uint64_t> rest(n);
  for (uint64_t i = 0; i < n; i++) rest[i] = i;
  std::shuffle(rest.begin(), rest.end(), rng);
  std::vector<bool> gone(n, false);
  for (size_t i = 0; i < del.size(); i++) gone[del[i]] = true;
  const auto* d0 = internal::fastfair::GetDebugCounters(idx.get());
  const uint64_t merges0 = d0->merges, rebalances0 = d0->rebalances;
  pm::ResetThreadCounters();
  uint64_t removed = 0;
  for (uint64_t i : rest) {
    if (gone[i]) continue;
    Die(idx->Remove(K(i)), "remove");
    removed++;
  }
  pm::Counters rm3 = pm::ThreadCounters();
  const auto* d = internal::fastfair::GetDebugCounters(idx.get());
  std::printf("  %9s       delete to empty: lines/delete %.2f  fences/delete %.2f  frees/delete %.4f  (%llu deletes, %llu merges, "
              "%llu of them in rebalances, %llu root collapses, %llu nodes freed; blocks %llu -> %llu, height %d)\n",
              "", double(rm3.lines_flushed) / removed, double(rm3.fences) / removed, double(rm3.frees) / removed,
              (unsigned long long)removed, (unsigned long long)(d->merges - merges0),
              (unsigned long long)(d->rebalances - rebalances0), (unsigned long long)d->root_collapses,
              (unsigned long long)d->nodes_freed, (unsigned long long)blocks_full,
              (unsigned long long)idx->pool()->allocator().BlocksInUse(), internal::fastfair::Height(idx.get()));
  idx.reset();
  pm::Pool::Remove(path);
}

double OpenTime(const std::string& name, uint64_t n) {
  std::string path = PoolPath("open-" + name);
  pm::Pool::Remove(path);
  std::unique_ptr<Index> idx;
  Die(OpenIndex(name, Opts(path), &idx), "open");
  for (uint64_t i = 0; i < n; i++) Die(idx->Insert(K(i), V(i)), "load");
  idx.reset();
  double t = Now();
  Options o = Opts(path);
  Die(OpenIndex(name, o, &idx), "reopen");
  double secs = Now() - t;
  std::string v;
  Die(idx->Find(K(n / 2), &v), "find after open");
  idx.reset();
  pm::Pool::Remove(path);
  return secs;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t records = 1000000, big = 10000000;
  bool skip_big = false;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    auto next = [&]() -> uint64_t { return i + 1 < argc ? std::strtoull(argv[++i], nullptr, 10) : 0; };
    if (a == "--records") records = next();
    else if (a == "--big") big = next();
    else if (a == "--skip-big") skip_big = true;
    else if (a == "--persist_mode" && i + 1 < argc) {
      pm::PersistMode m;
      if (!pm::ParsePersistMode(argv[++i], &m)) return 2;
      pm::SetPersistMode(m);
    } else {
      std::fprintf(stderr, "usage: %s [--records N] [--big N] [--skip-big] [--persist_mode flush|none]\n", argv[0]);
      return 2;
    }
  }
  std::printf("persist mode %s, flush instruction %s\n", pm::PersistModeName(pm::GetPersistMode()),
              pm::FlushInstrName(pm::GetFlushInstr()));
  std::printf("1. PM cost per operation, fastfair, random u64 keys, 512-byte nodes\n");
  PmCost(records);
  if (!skip_big) PmCost(big);
  std::printf("(throughput: pmbench --index dram_btree,fptree,fastfair, balanced rounds; docs/fastfair.md)\n");
  if (!skip_big) {
    IndexInfo info;
    std::printf("2. open time with %llu records\n", (unsigned long long)big);
    std::printf("  fastfair  see section 1 (lazy recovery: no node is read)\n");
    if (FindIndexInfo("fptree", &info)) std::printf("  fptree    %.6f s (rebuilds its DRAM inner nodes)\n", OpenTime("fptree", big));
  }
  return 0;
}
