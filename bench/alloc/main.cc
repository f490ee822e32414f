// pmbench-alloc: PM allocator throughput in the spirit of PiBench (VLDB'20)
// figure 19: each thread allocates N blocks of S bytes (default 1024 x 1 KiB)
// into persistent destinations, then frees them; repeated for several rounds.
// Allocators, side by side in one run on the same machine:
//   pmindex   our crash-safe allocator (Allocate into a slot of a persistent
//             array in a pool in /dev/shm)
//   pmemobj   PMDK libpmemobj: pmemobj_alloc into a PMEMoid of a persistent
//             array (pool in /dev/shm; PMEM_IS_PMEM_FORCE=1 so it flushes with
//             clwb/clflushopt like we do instead of msync)
//   jemalloc  volatile DRAM allocation (mallocx/dallocx), the upper bound
// Reported: allocation and free throughput (millions of ops/s, timed per
// phase from a barrier to the last thread) and the ratio to libpmemobj.
// Workload options: --mixed draws each slot's size log-uniformly from
// [--min-size, --max-size] (default 64 B to 64 KiB; the same sizes for
// every allocator), and --cross-thread makes thread t free the blocks that
// thread t+1 allocated (frees from another thread; needs 2+ threads):
//     pmbench-alloc --mixed --cross-thread --threads 2
// No assertion on speed here; the numbers go in docs/allocator.md.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "pmindex/pm/allocator.h"
#include "pmindex/pm/persist.h"
#include "pmindex/pm/pool.h"

#ifdef PMBENCH_HAVE_PMEMOBJ
#include <libpmemobj.h>
#endif
#ifdef PMBENCH_HAVE_JEMALLOC
#include <jemalloc/jemalloc.h>
#endif

namespace {

using Clock = std::chrono::steady_clock;

double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

struct Config {
  int blocks = 1024;
  size_t size = 1024;
  int rounds = 50;
  int reps = 5;
  std::vector<int> threads{1, 2};
  std::string dir = "/dev/shm";
  bool mixed = false, cross_thread = false;
  size_t min_size = 64, max_size = 64 * 1024;
  std::vector<size_t> sizes;  // per slot (thread t, block i at t * blocks + i)
  size_t SizeOf(int t, int i) const { return sizes[size_t(t) * blocks + i]; }
};

// An allocator under test: per-thread alloc/free of slot i of thread t.
struct Subject {
  std::string name;
  std::function<bool(int t, int i)> alloc;
  std::function<void(int t, int i)> free;
};

struct Result {
  double alloc_mops = 0, free_mops = 0;
  double ops = 0, alloc_s = 0, free_s = 0;  // accumulated over repetitions
  double alloc_cpu_s = 0, free_cpu_s = 0;    // thread CPU time
  double alloc_cpu_mops = 0, free_cpu_mops = 0;
  bool ok = true;
  void Add(const Result& r) {
    ops += r.ops;
    alloc_s += r.alloc_s;
    free_s += r.free_s;
    alloc_cpu_s += r.alloc_cpu_s;
    free_cpu_s += r.free_cpu_s;
    ok &= r.ok;
    alloc_mops = ops / alloc_s / 1e6;
    free_mops = ops / free_s / 1e6;
    alloc_cpu_mops = ops / alloc_cpu_s / 1e6;
    free_cpu_mops = ops / free_cpu_s / 1e6;
  }
};

Result RunSubject(const Subject& s, const Config& cfg, int nthreads) {
  std::barrier sync(nthreads);
  std::vector<double> alloc_s(nthreads, 0), free_s(nthreads, 0), alloc_cpu(nthreads, 0), free_cpu(nthreads, 0);
  std::atomic<bool> ok{true};
  // Round 0 is a warm-up (first touch of the pool pages, runs formatted).
  auto worker = [&](int t) {
    for (int r = 0; r <= cfg.rounds; r++) {
      sync.arrive_and_wait();
      auto t0 = Clock::now();
      double c0 = ThreadCpuSeconds();
      for (int i = 0; i < cfg.blocks; i++)
        if (!s.alloc(t, i)) ok = false;
      auto t1 = Clock::now();
      double c1 = ThreadCpuSeconds();
      sync.arrive_and_wait();
      auto t2 = Clock::now();
      double c2 = ThreadCpuSeconds();
      const int owner = cfg.cross_thread ? (t + 1) % nthreads : t;  // whose blocks this thread frees
      for (int i = 0; i < cfg.blocks; i++) s.free(owner, i);
      auto t3 = Clock::now();
      double c3 = ThreadCpuSeconds();
      if (r > 0) {
        alloc_s[t] += std::chrono::duration<double>(t1 - t0).count();
        free_s[t] += std::chrono::duration<double>(t3 - t2).count();
        alloc_cpu[t] += c1 - c0;
        free_cpu[t] += c3 - c2;
      }
    }
  };
  std::vector<std::thread> ts;
  for (int t = 0; t < nthreads; t++) ts.emplace_back(worker, t);
  for (auto& th : ts) th.join();
  // Throughput: all threads' operations over the mean per-thread time.
  double a = 0, f = 0, ac = 0, fc = 0;
  for (int t = 0; t < nthreads; t++) {
    a += alloc_s[t];
    f += free_s[t];
    ac += alloc_cpu[t];
    fc += free_cpu[t];
  }
  a /= nthreads;
  f /= nthreads;
  ac /= nthreads;
  fc /= nthreads;
  const double ops = double(cfg.blocks) * cfg.rounds * nthreads;
  Result res;
  res.ops = ops;
  res.alloc_s = a;
  res.free_s = f;
  res.alloc_cpu_s = ac;
  res.free_cpu_s = fc;
  res.alloc_mops = ops / a / 1e6;
  res.free_mops = ops / f / 1e6;
  res.ok = ok;
  return res;
}

}  // namespace

int main(int argc, char** argv) {
#ifdef PMBENCH_HAVE_PMEMOBJ
  // libpmem decides at load time whether the mapping is "pmem"; on /dev/shm
  // it is not, and it would msync on every persist. Force flush instructions
  // (as on real PM) by re-executing with the variable set.
  if (!std::getenv("PMEM_IS_PMEM_FORCE")) {
    setenv("PMEM_IS_PMEM_FORCE", "1", 1);
    execv("/proc/self/exe", argv);
    perror("re-exec with PMEM_IS_PMEM_FORCE=1");
  }
#endif
  Config cfg;
  CLI::App app{"pmbench-alloc: PM allocator throughput (PiBench figure 19 style)"};
  app.add_option("--blocks", cfg.blocks, "blocks each thread allocates per round")->check(CLI::Range(1, 1 << 20));
  app.add_option("--size", cfg.size, "block size in bytes")->check(CLI::Range(1, 1 << 20));
  app.add_option("--rounds", cfg.rounds, "measured rounds (after one warm-up round)")->check(CLI::Range(1, 100000));
  app.add_option("--reps", cfg.reps, "repetitions, interleaving the allocators (fair under a noisy machine)")
      ->check(CLI::Range(1, 1000));
  app.add_option("--threads", cfg.threads, "thread counts")->delimiter(',')->check(CLI::Range(1, 64));
  app.add_option("--dir", cfg.dir, "directory for the pools");
  app.add_flag("--mixed", cfg.mixed, "mixed sizes: log-uniform in [--min-size, --max-size] per slot");
  app.add_option("--min-size", cfg.min_size, "smallest size with --mixed")->check(CLI::Range(1, 1 << 20));
  app.add_option("--max-size", cfg.max_size, "largest size with --mixed")->check(CLI::Range(1, 1 << 20));
  app.add_flag("--cross-thread", cfg.cross_thread, "each thread frees the blocks of the next thread");
  CLI11_PARSE(app, argc, argv);
  if (cfg.mixed && cfg.min_size > cfg.max_size) {
    std::fprintf(stderr, "pmbench-alloc: --min-size is larger than --max-size\n");
    return 2;
  }

  int max_threads = 1;
  for (int t : cfg.threads) max_threads = std::max(max_threads, t);
  const size_t nslots = size_t(max_threads) * cfg.blocks;
  cfg.sizes.assign(nslots, cfg.size);
  uint64_t total = 0;
  for (size_t k = 0; k < nslots; k++) {
    if (cfg.mixed) {
      uint64_t h = (k + 1) * 0x9E3779B97F4A7C15ull;  // deterministic: the same sizes for every allocator
      h ^= h >> 31;
      const double u = double(h % 1000003) / 1000003.0;
      cfg.sizes[k] = size_t(double(cfg.min_size) * std::pow(double(cfg.max_size) / double(cfg.min_size), u));
    }
    total += cfg.sizes[k] + 64;
  }
  const uint64_t pool_size = std::max<uint64_t>(64ull << 20, total * 2 + (16 << 20));
  const std::string tag = std::to_string(getpid());

  std::string what = std::to_string(cfg.size) + " B";
  if (cfg.mixed) what = std::to_string(cfg.min_size) + "-" + std::to_string(cfg.max_size) + " B (log-uniform)";
  std::printf("pmbench-alloc: %d blocks x %s per thread, %s, %d rounds (+1 warm-up) x %d reps, flush=%s, pools in %s\n",
              cfg.blocks, what.c_str(), cfg.cross_thread ? "freed by the next thread" : "freed by their thread",
              cfg.rounds, cfg.reps, pmindex::pm::FlushInstrName(pmindex::pm::GetFlushInstr()), cfg.dir.c_str());

  // --- ours
  std::unique_ptr<pmindex::pm::Pool> pool;
  const std::string our_path = cfg.dir + "/pmbench-alloc-ours-" + tag + ".pool";
  pmindex::pm::PoolOptions po;
  po.size = pool_size;
  if (auto s = pmindex::pm::Pool::Create(our_path, "pmbench-alloc", po, &pool); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  pool->RemoveOnClose();
  if (auto s = pool->allocator().AllocateZeroed(pool->root_slot(), nslots * 8); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  uint64_t* our_slots = pool->root<uint64_t>();
  std::vector<Subject> subjects;
  subjects.push_back({"pmindex",
                      [&](int t, int i) { return pool->allocator().Allocate(&our_slots[size_t(t) * cfg.blocks + i], cfg.SizeOf(t, i)).ok(); },
                      [&](int t, int i) { pool->allocator().FreeOrAbort(&our_slots[size_t(t) * cfg.blocks + i]); }});

#ifdef PMBENCH_HAVE_PMEMOBJ
  const std::string obj_path = cfg.dir + "/pmbench-alloc-pmemobj-" + tag + ".pool";
  // libpmemobj keeps a run of 256 KiB chunks per size class it meets, and a
  // mixed-size load meets dozens: a pool sized for the live data runs out
  // ("extending the pool ... is not supported") while pmindex's does not.
  // Give it room, so the comparison times allocations, not failures.
  const uint64_t obj_pool_size = cfg.mixed ? std::max<uint64_t>(pool_size, 1ull << 30) : pool_size;
  PMEMobjpool* pop = pmemobj_create(obj_path.c_str(), "pmbench-alloc", obj_pool_size, 0644);
  PMEMoid* obj_slots = nullptr;
  if (!pop) {
    std::fprintf(stderr, "pmemobj_create: %s (skipping libpmemobj)\n", pmemobj_errormsg());
  } else {
    PMEMoid root = pmemobj_root(pop, nslots * sizeof(PMEMoid));
    obj_slots = static_cast<PMEMoid*>(pmemobj_direct(root));
    subjects.push_back({"pmemobj",
                        [&](int t, int i) {
                          return pmemobj_alloc(pop, &obj_slots[size_t(t) * cfg.blocks + i], cfg.SizeOf(t, i), 0, nullptr, nullptr) == 0;
                        },
                        [&](int t, int i) { pmemobj_free(&obj_slots[size_t(t) * cfg.blocks + i]); }});
  }
#endif
#ifdef PMBENCH_HAVE_JEMALLOC
  std::vector<void*> je_slots(nslots, nullptr);
  subjects.push_back({"jemalloc",
                      [&](int t, int i) { return (je_slots[size_t(t) * cfg.blocks + i] = mallocx(cfg.SizeOf(t, i), 0)) != nullptr; },
                      [&](int t, int i) { dallocx(je_slots[size_t(t) * cfg.blocks + i], 0); }});
#endif

  std::map<std::pair<std::string, int>, Result> results;
  for (int nt : cfg.threads)
    for (int r = 0; r < cfg.reps; r++)
      for (auto& s : subjects) results[{s.name, nt}].Add(RunSubject(s, cfg, nt));

  std::printf("\nThroughput in million operations per second: wall = all threads' operations over the mean\n"
              "per-thread wall time of the phase; cpu = the same over the mean per-thread CPU time (robust when\n"
              "the machine is shared). Ratios are against libpmemobj in this run.\n\n");
  std::printf("%-9s %7s %10s %10s %10s %10s %9s %9s %9s %9s\n", "allocator", "threads", "alloc", "free", "alloc-cpu",
              "free-cpu", "alloc/obj", "free/obj", "a-cpu/obj", "f-cpu/obj");
  bool all_ok = true;
  for (int nt : cfg.threads) {
    const Result* base = results.count({"pmemobj", nt}) ? &results[{"pmemobj", nt}] : nullptr;
    for (auto& s : subjects) {
      const Result& r = results[{s.name, nt}];
      all_ok &= r.ok;
      char ra[32] = "-", rf[32] = "-", rac[32] = "-", rfc[32] = "-";
      if (base) {
        std::snprintf(ra, sizeof ra, "%.2fx", r.alloc_mops / base->alloc_mops);
        std::snprintf(rf, sizeof rf, "%.2fx", r.free_mops / base->free_mops);
        std::snprintf(rac, sizeof rac, "%.2fx", r.alloc_cpu_mops / base->alloc_cpu_mops);
        std::snprintf(rfc, sizeof rfc, "%.2fx", r.free_cpu_mops / base->free_cpu_mops);
      }
      std::printf("%-9s %7d %10.3f %10.3f %10.3f %10.3f %9s %9s %9s %9s%s\n", s.name.c_str(), nt, r.alloc_mops,
                  r.free_mops, r.alloc_cpu_mops, r.free_cpu_mops, ra, rf, rac, rfc, r.ok ? "" : "  (allocation failures!)");
    }
  }
#ifdef PMBENCH_HAVE_PMEMOBJ
  if (pop) {
    pmemobj_close(pop);
    unlink(obj_path.c_str());
  }
#endif
  pool.reset();
  return all_ok ? 0 : 1;
}
