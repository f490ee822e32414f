// nvc_bench: the NVC-Hashmap figures of issue 7 (docs/nvc_hashmap.md).
//
// For 1 and 2 threads (--threads), in the same run and interleaved round by
// round (--rounds; the median is reported, so a noisy neighbour on the shared
// machine hits every target alike), it measures on random u64 keys/values:
//   * inserts/s loading --n records into an empty index,
//   * finds/s of --n lookups of loaded keys,
//   * removes: lines flushed and fences per remove (--n/10 removes),
// for nvc_hashmap (erratum modes dirty_bit = default, flush_on_read, none,
// with node_alloc=slab = default and allocator), fptree (if this build
// registers it), tbb::concurrent_hash_map (a transient concurrent hash map)
// and dram_btree. It prints per-target
// figures, the ratios the issue asks for, and the lines flushed / fences per
// insert and per remove (pm::ThreadCounters of the worker threads).
// Throughput is given per wall-clock second and per worker CPU-second (x
// threads): on a shared, oversubscribed machine the latter removes the time
// the workers were descheduled; neither is a timing assertion.
//
// --open N1,N2,... measures open time after a crash instead: for each N, each
// persistent target and each --recovery_threads value, a forked child loads N
// random u64 records (2 threads) and exits without closing the index (the
// pool is not clean, so the open recovers as after a crash); the parent
// times OpenIndex (wall, pool mapping included) and reports the index's own
// recovery_seconds. A size is skipped if /dev/shm lacks room for its pool.
//
// Usage: nvc_bench [--n N] [--threads 1,2] [--rounds R] [--persist_mode flush|none] [--targets a,b,...]
//        [--fixed_pool] (no 64 GiB address-space reservation: runs under valgrind)
//        nvc_bench --open 1000000,10000000,50000000 [--recovery_threads 1,2] [--rounds R] [--targets nvc_hashmap,fptree]
// A target is an index name with optional settings after ':' joined by '+':
// an erratum mode (dirty_bit, flush_on_read, none), a node allocation (slab,
// allocator) or any param=value, e.g. nvc_hashmap:none+slab. Ratios are
// printed for every nvc_hashmap target; the erratum-fix cost pairs a target
// with the same label where its mode is replaced by none.
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <tbb/concurrent_hash_map.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "pmindex/index.h"
#include "pmindex/pm/persist.h"
#include "pmindex/pm/pool.h"

using namespace pmindex;

namespace {

// --fixed_pool: the pool does not reserve room to grow (64 GiB of address
// space by default), so that the benchmark runs under valgrind.
bool g_fixed_pool = false;

struct Result {
  double insert_ops = 0, find_ops = 0;
  // Throughput per CPU-second of the workers, times the thread count: what
  // the threads would do on dedicated cores. On a shared, oversubscribed
  // machine this removes the time workers spent descheduled.
  double insert_cpu_ops = 0, find_cpu_ops = 0;
  double lines_per_insert = 0, fences_per_insert = 0, lines_per_remove = 0, fences_per_remove = 0;
};

// A target: a pmindex index (name + params) or the TBB map.
struct Target {
  std::string label;
  std::string index;  // empty: tbb::concurrent_hash_map
  std::map<std::string, std::string> params;
};

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> v;
  std::stringstream ss(s);
  std::string x;
  while (std::getline(ss, x, ','))
    if (!x.empty()) v.push_back(x);
  return v;
}

double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Runs fn(thread, begin, end) on T threads over [0, n); returns wall seconds,
// sums the workers' PM counters into *c and their CPU seconds into *cpu.
template <typename F>
double Parallel(int T, uint64_t n, pm::Counters* c, double* cpu, F fn) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<pm::Counters> cs(T);
  std::vector<double> cpus(T);
  std::vector<std::thread> th;
  for (int t = 0; t < T; t++)
    th.emplace_back([&, t] {
      const uint64_t b = n * t / T, e = n * (t + 1) / T;
      ready++;
      while (!go.load()) {
      }
      pm::Counters before = pm::ThreadCounters();
      const double c0 = ThreadCpuSeconds();
      fn(t, b, e);
      cpus[t] = ThreadCpuSeconds() - c0;
      cs[t] = pm::ThreadCounters() - before;
    });
  while (ready.load() < T) {
  }
  auto t0 = std::chrono::steady_clock::now();
  go = true;
  for (auto& x : th) x.join();
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (c) {
    *c = pm::Counters{};
    for (auto& x : cs) *c += x;
  }
  if (cpu) {
    *cpu = 0;
    for (double x : cpus) *cpu += x;
  }
  return s;
}

Result RunIndex(const Target& tg, int T, const std::vector<uint64_t>& keys, const std::vector<uint64_t>& probes) {
  Result r;
  const uint64_t n = keys.size();
  Options o;
  static int seq = 0;
  o.pool_path = "/dev/shm/nvc_bench-" + std::to_string(::getpid()) + "-" + std::to_string(seq++) + ".pool";
  o.pool_size = std::max<uint64_t>(256ull << 20, n * 256);
  if (g_fixed_pool) o.max_pool_size = o.pool_size;
  o.params = tg.params;
  o.num_threads = T;
  std::unique_ptr<Index> idx;
  Status s = OpenIndex(tg.index, o, &idx);
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", tg.label.c_str(), s.ToString().c_str());
    std::exit(1);
  }
  std::atomic<uint64_t> errors{0};
  pm::Counters c;
  double cpu = 0;
  double t = Parallel(T, n, &c, &cpu, [&](int, uint64_t b, uint64_t e) {
    for (uint64_t i = b; i < e; i++)
      if (!idx->Insert(U64Slice(keys[i]), U64Slice(keys[i])).ok()) errors++;
  });
  r.insert_ops = n / t;
  r.insert_cpu_ops = n / cpu * T;
  r.lines_per_insert = double(c.lines_flushed) / n;
  r.fences_per_insert = double(c.fences) / n;
  t = Parallel(T, probes.size(), nullptr, &cpu, [&](int, uint64_t b, uint64_t e) {
    std::string v;
    for (uint64_t i = b; i < e; i++)
      if (!idx->Find(U64Slice(probes[i]), &v).ok() || SliceToU64(v) != probes[i]) errors++;
  });
  r.find_ops = probes.size() / t;
  r.find_cpu_ops = probes.size() / cpu * T;
  const uint64_t nr = n / 10;
  Parallel(T, nr, &c, nullptr, [&](int, uint64_t b, uint64_t e) {
    for (uint64_t i = b; i < e; i++)
      if (!idx->Remove(U64Slice(keys[i])).ok()) errors++;
  });
  r.lines_per_remove = double(c.lines_flushed) / nr;
  r.fences_per_remove = double(c.fences) / nr;
  if (errors) {
    std::fprintf(stderr, "%s: %llu failed operations\n", tg.label.c_str(), (unsigned long long)errors.load());
    std::exit(1);
  }
  idx.reset();
  pm::Pool::Remove(o.pool_path);
  return r;
}

Result RunTbb(int T, const std::vector<uint64_t>& keys, const std::vector<uint64_t>& probes) {
  Result r;
  tbb::concurrent_hash_map<uint64_t, uint64_t> m;
  std::atomic<uint64_t> errors{0};
  double cpu = 0;
  double t = Parallel(T, keys.size(), nullptr, &cpu, [&](int, uint64_t b, uint64_t e) {
    for (uint64_t i = b; i < e; i++) {
      tbb::concurrent_hash_map<uint64_t, uint64_t>::accessor a;
      if (m.insert(a, keys[i])) a->second = keys[i];
      else errors++;
    }
  });
  r.insert_ops = keys.size() / t;
  r.insert_cpu_ops = keys.size() / cpu * T;
  t = Parallel(T, probes.size(), nullptr, &cpu, [&](int, uint64_t b, uint64_t e) {
    for (uint64_t i = b; i < e; i++) {
      tbb::concurrent_hash_map<uint64_t, uint64_t>::const_accessor a;
      if (!m.find(a, probes[i]) || a->second != probes[i]) errors++;
    }
  });
  r.find_ops = probes.size() / t;
  r.find_cpu_ops = probes.size() / cpu * T;
  if (errors) {
    std::fprintf(stderr, "tbb: %llu failed operations\n", (unsigned long long)errors.load());
    std::exit(1);
  }
  return r;
}

// Open after a crash (--open): see the file comment. Returns the wall
// seconds of OpenIndex and the index's recovery_seconds; false if skipped.
bool RunOpen(const Target& tg, uint64_t n, int rthreads, double* open_s, double* recovery_s) {
  Options o;
  o.pool_path = "/dev/shm/nvc_bench-open-" + std::to_string(::getpid()) + ".pool";
  o.pool_size = std::max<uint64_t>(256ull << 20, n * 64);
  if (g_fixed_pool) o.max_pool_size = o.pool_size;
  o.params = tg.params;
  struct statvfs fs;
  if (::statvfs("/dev/shm", &fs) == 0 && uint64_t(fs.f_bavail) * fs.f_frsize < n * 80 + (256ull << 20)) return false;
  pm::Pool::Remove(o.pool_path);
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::unique_ptr<Index> idx;
    if (!OpenIndex(tg.index, o, &idx).ok()) ::_exit(2);
    std::atomic<uint64_t> errors{0};
    Parallel(2, n, nullptr, nullptr, [&](int t, uint64_t b, uint64_t e) {
      std::mt19937_64 rng(77 + t);
      for (uint64_t i = b; i < e; i++)
        if (!idx->Insert(U64Slice(rng() | 1), U64Slice(i)).ok()) errors++;
    });
    ::_exit(errors ? 3 : 0);  // no Close: the pool is left as after a crash
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "%s: loading child failed (status %d)\n", tg.label.c_str(), status);
    std::exit(1);
  }
  o.create_if_missing = false;
  o.recovery_threads = rthreads;
  std::unique_ptr<Index> idx;
  const auto t0 = std::chrono::steady_clock::now();
  Status s = OpenIndex(tg.index, o, &idx);
  *open_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!s.ok() || !idx->pool()->recovered_from_crash()) {
    std::fprintf(stderr, "%s: open after the crash: %s\n", tg.label.c_str(), s.ok() ? "not a crash recovery" : s.ToString().c_str());
    std::exit(1);
  }
  *recovery_s = idx->Stats().recovery_seconds;
  if (idx->Size() != n) {  // every insert of the child was acknowledged
    std::fprintf(stderr, "%s: %llu records after the crash, %llu loaded\n", tg.label.c_str(), (unsigned long long)idx->Size(),
                 (unsigned long long)n);
    std::exit(1);
  }
  idx.reset();
  pm::Pool::Remove(o.pool_path);
  return true;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t n = 1000000;
  int rounds = 3;
  std::vector<int> threads = {1, 2};
  std::vector<uint64_t> open_sizes;  // --open
  std::vector<int> rthreads = {1, 2};
  bool targets_given = false;
  std::vector<std::string> want = {"nvc_hashmap:dirty_bit+slab",      "nvc_hashmap:flush_on_read+slab", "nvc_hashmap:none+slab",
                                   "nvc_hashmap:dirty_bit+allocator", "nvc_hashmap:none+allocator",     "fptree",
                                   "tbb",                             "dram_btree"};
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    auto next = [&] { return pmindex::benchutil::NextArg(argc, argv, &i); };
    if (a == "--n") n = std::strtoull(next().c_str(), nullptr, 10);
    else if (a == "--rounds") rounds = std::atoi(next().c_str());
    else if (a == "--threads") {
      threads.clear();
      for (auto& x : Split(next())) threads.push_back(std::atoi(x.c_str()));
    } else if (a == "--targets") {
      want = Split(next());
      targets_given = true;
    } else if (a == "--fixed_pool") {
      g_fixed_pool = true;
    } else if (a == "--open") {
      for (auto& x : Split(next())) open_sizes.push_back(std::strtoull(x.c_str(), nullptr, 10));
    } else if (a == "--recovery_threads") {
      rthreads.clear();
      for (auto& x : Split(next())) rthreads.push_back(std::atoi(x.c_str()));
    }
    else if (a == "--persist_mode") {  // flush (default) or none (eADR: no flushes, fences kept)
      pm::PersistMode m;
      if (!pm::ParsePersistMode(next(), &m)) {
        std::fprintf(stderr, "--persist_mode: flush or none\n");
        return 2;
      }
      pm::SetPersistMode(m);
    } else {
      std::fprintf(stderr, "usage: %s [--n N] [--threads 1,2] [--rounds R] [--persist_mode flush|none] [--targets nvc_hashmap,nvc_hashmap:flush_on_read,nvc_hashmap:none,fptree,tbb,dram_btree]\n"
                   "       %s --open N1,N2 [--recovery_threads 1,2] [--rounds R] [--targets nvc_hashmap,fptree]\n", argv[0], argv[0]);
      return 2;
    }
  }
  if (n < 10 || rounds < 1 || threads.empty()) {
    std::fprintf(stderr, "bad arguments\n");
    return 2;
  }
  if (!open_sizes.empty() && !targets_given) want = {"nvc_hashmap", "fptree"};
  std::vector<Target> targets;
  for (const auto& w : want) {
    if (w == "tbb") {
      targets.push_back({"tbb_concurrent_hash_map", "", {}});
      continue;
    }
    std::string name = w, fix;
    if (auto p = w.find(':'); p != std::string::npos) {
      name = w.substr(0, p);
      fix = w.substr(p + 1);
    }
    if (!FindIndexInfo(name, nullptr)) {
      std::printf("# %s: not registered in this build, skipped\n", name.c_str());
      continue;
    }
    Target t{w, name, {}};
    // "name:a+b+...": each part an erratum mode, a node allocation or param=value.
    size_t from = 0;
    while (from < fix.size()) {
      size_t to = fix.find('+', from);
      if (to == std::string::npos) to = fix.size();
      const std::string part = fix.substr(from, to - from);
      from = to + 1;
      if (auto eq = part.find('='); eq != std::string::npos) t.params[part.substr(0, eq)] = part.substr(eq + 1);
      else if (part == "slab" || part == "allocator") t.params["node_alloc"] = part;
      else if (!part.empty()) t.params["erratum_fix"] = part;
    }
    if (name == "nvc_hashmap" && fix.empty()) t.label = "nvc_hashmap:default";
    targets.push_back(t);
  }
  if (!open_sizes.empty()) {
    std::printf("# nvc_bench --open: open after a crash (a child loaded the records and exited without closing), rounds=%d (median), %u hardware threads\n",
                rounds, std::thread::hardware_concurrency());
    std::printf("%-28s %11s %4s %11s %11s\n", "target", "records", "thr", "open s", "recovery s");
    for (uint64_t sz : open_sizes)
      for (int rt : rthreads)
        for (const auto& tg : targets) {
          if (tg.index.empty()) continue;
          IndexInfo info;
          if (!FindIndexInfo(tg.index, &info) || !info.persistent) continue;
          std::vector<double> os, rs;
          for (int round = 0; round < rounds; round++) {
            double o = 0, r = 0;
            if (!RunOpen(tg, sz, rt, &o, &r)) break;
            os.push_back(o);
            rs.push_back(r);
          }
          if (os.empty()) std::printf("%-28s %11llu %4d %11s %11s\n", tg.label.c_str(), (unsigned long long)sz, rt, "skipped", "(/dev/shm)");
          else std::printf("%-28s %11llu %4d %11.3f %11.3f\n", tg.label.c_str(), (unsigned long long)sz, rt, Median(os), Median(rs));
          std::fflush(stdout);
        }
    return 0;
  }
  std::mt19937_64 rng(1729);
  std::vector<uint64_t> keys(n), probes(n);
  for (auto& k : keys) k = rng();
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  std::shuffle(keys.begin(), keys.end(), rng);
  n = keys.size();
  probes.resize(n);
  for (auto& p : probes) p = keys[rng() % n];

  std::printf("# nvc_bench: n=%llu records (u64 keys/values, uniform random), rounds=%d (median), persist mode %s, flush %s, %u hardware threads\n",
              (unsigned long long)n, rounds, pm::PersistModeName(pm::GetPersistMode()), pm::FlushInstrName(pm::GetFlushInstr()),
              std::thread::hardware_concurrency());
  // results[label][threads] -> per-round results
  std::map<std::string, std::map<int, std::vector<Result>>> res;
  for (int round = 0; round < rounds; round++)
    for (int T : threads)
      for (const auto& tg : targets) res[tg.label][T].push_back(tg.index.empty() ? RunTbb(T, keys, probes) : RunIndex(tg, T, keys, probes));

  auto med = [&](const std::string& l, int T, double Result::*f) {
    std::vector<double> v;
    for (const auto& r : res[l][T]) v.push_back(r.*f);
    return Median(v);
  };
  std::printf("\n# wall: ops / elapsed seconds; cpu: ops / worker CPU seconds x threads (excludes time descheduled)\n");
  std::printf("%-28s %3s %11s %11s %11s %11s %9s %9s %9s %9s\n", "target", "thr", "ins/s wall", "ins/s cpu", "find/s wall", "find/s cpu",
              "lines/ins", "fence/ins", "lines/rm", "fence/rm");
  for (const auto& tg : targets)
    for (int T : threads)
      std::printf("%-28s %3d %11.0f %11.0f %11.0f %11.0f %9.2f %9.2f %9.2f %9.2f\n", tg.label.c_str(), T, med(tg.label, T, &Result::insert_ops),
                  med(tg.label, T, &Result::insert_cpu_ops), med(tg.label, T, &Result::find_ops), med(tg.label, T, &Result::find_cpu_ops),
                  med(tg.label, T, &Result::lines_per_insert), med(tg.label, T, &Result::fences_per_insert),
                  med(tg.label, T, &Result::lines_per_remove), med(tg.label, T, &Result::fences_per_remove));

  std::printf("\n# ratios (medians of the same run)\n");
  for (const auto& tg : targets) {
    const std::string& nvc = tg.label;
    if (tg.index != "nvc_hashmap") continue;
    for (int T : threads) {
      for (const char* other : {"fptree", "tbb_concurrent_hash_map", "dram_btree"})
        if (res.count(other))
          std::printf("%d thr: %-32s / %-24s inserts %.2fx (cpu %.2fx)  finds %.2fx (cpu %.2fx)\n", T, nvc.c_str(), other,
                      med(nvc, T, &Result::insert_ops) / med(other, T, &Result::insert_ops),
                      med(nvc, T, &Result::insert_cpu_ops) / med(other, T, &Result::insert_cpu_ops),
                      med(nvc, T, &Result::find_ops) / med(other, T, &Result::find_ops),
                      med(nvc, T, &Result::find_cpu_ops) / med(other, T, &Result::find_cpu_ops));
      // Cost of the erratum fix: throughput with the fix / without (none).
      for (const std::string mode : {"dirty_bit", "flush_on_read"}) {
        const size_t at = nvc.find(mode);
        if (at == std::string::npos) continue;
        std::string none = nvc;
        none.replace(at, mode.size(), "none");
        if (res.count(none))
          std::printf("%d thr: erratum fix %-32s / none: inserts %.2fx (cpu %.2fx)  finds %.2fx (cpu %.2fx)\n", T, nvc.c_str(),
                      med(nvc, T, &Result::insert_ops) / med(none, T, &Result::insert_ops),
                      med(nvc, T, &Result::insert_cpu_ops) / med(none, T, &Result::insert_cpu_ops),
                      med(nvc, T, &Result::find_ops) / med(none, T, &Result::find_ops),
                      med(nvc, T, &Result::find_cpu_ops) / med(none, T, &Result::find_cpu_ops));
      }
    }
    if (res[nvc].count(1))
      for (int T : threads)
        if (T != 1)
          std::printf("scaling %s %d threads / 1 thread: wall inserts %.2fx finds %.2fx; cpu inserts %.2fx finds %.2fx\n", nvc.c_str(), T,
                      med(nvc, T, &Result::insert_ops) / med(nvc, 1, &Result::insert_ops),
                      med(nvc, T, &Result::find_ops) / med(nvc, 1, &Result::find_ops),
                      med(nvc, T, &Result::insert_cpu_ops) / med(nvc, 1, &Result::insert_cpu_ops),
                      med(nvc, T, &Result::find_cpu_ops) / med(nvc, 1, &Result::find_cpu_ops));
  }
  return 0;
}
