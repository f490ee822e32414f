// pmwcas_bench: the figures of docs/pmwcas.md for the PMwCAS primitive
// (include/pmindex/pm/pmwcas.h; Wang et al. ICDE'18, the primitive behind
// BzTree in PiBench VLDB'20 section 3.3).
//
//   pmwcas_bench cost        lines flushed and fences per k-word operation,
//                            k = 1..max (uncontended, words in distinct lines),
//                            from the substrate's persist counters: exact,
//                            not timing; the paper's model is 3k+1 lines.
//   pmwcas_bench throughput  millions of operations/s for k-word PMwCAS
//                            (--words 1,2,4), 1 and 2 threads (--threads),
//                            low contention (each thread its own words) and
//                            high contention (all threads on the same 4
//                            words), with persist mode flush and none, and a
//                            plain single-word CAS (__atomic CAS on the same
//                            PM words) in the same run. Each configuration
//                            runs --seconds, median of --rounds.
// Timing numbers are for the integrator to take on a quiet machine.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "pmindex/pm/allocator.h"
#include "pmindex/pm/persist.h"
#include "pmindex/pm/pmwcas.h"
#include "pmindex/pm/pool.h"

namespace {

using namespace pmindex;
using namespace pmindex::pm;

void Check(const Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "pmwcas_bench: %s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

constexpr size_t kStride = 8;  // words per cache line: one target word per line

struct Bench {
  std::unique_ptr<Pool> pool;
  uint64_t* words = nullptr;
  size_t nwords = 0;

  Bench(const std::string& path, uint32_t max_words, size_t nwords) : nwords(nwords) {
    Pool::Remove(path);
    PoolOptions po;
    po.size = 64ull << 20;
    po.pmwcas_max_words = max_words;
    Check(Pool::Create(path, "pmwcas_bench", po, &pool), "create pool");
    pool->RemoveOnClose();
    Check(pool->allocator().AllocateZeroed(pool->root_slot(), nwords * kStride * 8), "allocate words");
    words = pool->root<uint64_t>();
  }
  uint64_t* Word(size_t i) { return &words[i * kStride]; }
};

// One k-word increment of words first..first+k-1 (retried until it succeeds).
void Increment(PMwCAS* pm, Bench& b, size_t first, int k) {
  for (;;) {
    PMwCAS::Op op;
    Check(pm->Begin(&op), "begin");
    for (int i = 0; i < k; i++) {
      uint64_t* w = b.Word(first + size_t(i));
      const uint64_t v = pm->Read(w);
      op.AddWord(w, v, (v + 1) & pmwcas::kValueMask);
    }
    bool ok = false;
    Check(op.Execute(&ok), "execute");
    if (ok) return;
  }
}

int Cost(uint32_t max_k) {
  Bench b("/dev/shm/pmwcas_bench_cost.pool", std::max<uint32_t>(max_k, 1), max_k);
  PMwCAS* pm = b.pool->pmwcas();
  std::printf("k,lines_flushed,fences,descriptor_lines,model_3k_plus_1\n");
  for (uint32_t k = 1; k <= max_k; k++) {
    pm->Reclaim();  // recycling (per thread, every batch of retirements) outside the measured window
    Counters before = ThreadCounters();
    Increment(pm, b, 0, int(k));
    Counters d = ThreadCounters() - before;
    std::printf("%u,%llu,%llu,%llu,%u\n", k, (unsigned long long)d.lines_flushed, (unsigned long long)d.fences,
                (unsigned long long)((32 + 32 * k + 63) / 64), 3 * k + 1);
  }
  return 0;
}

double RunOnce(Bench& b, int threads, int k, bool high, bool plain, double seconds) {
  PMwCAS* pm = b.pool->pmwcas();
  std::atomic<bool> stop{false};
  std::vector<uint64_t> ops(size_t(threads), 0);
  std::barrier start(threads + 1);
  std::vector<std::thread> th;
  for (int t = 0; t < threads; t++) {
    th.emplace_back([&, t] {
      const size_t first = high ? 0 : size_t(t) * 8;
      start.arrive_and_wait();
      uint64_t n = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        if (plain) {
          uint64_t* w = b.Word(first);
          uint64_t v = __atomic_load_n(w, __ATOMIC_ACQUIRE);
          if (Cas(w, &v, v + 1)) {
            Persist(w, 8);
            n++;
          }
        } else {
          Increment(pm, b, first, k);
          n++;
        }
      }
      ops[size_t(t)] = n;
    });
  }
  start.arrive_and_wait();
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& x : th) x.join();
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  uint64_t total = 0;
  for (uint64_t n : ops) total += n;
  return double(total) / dt / 1e6;
}

int Throughput(const std::vector<int>& ks, const std::vector<int>& threads, double seconds, int rounds) {
  Bench b("/dev/shm/pmwcas_bench_tput.pool", 16, 64);
  std::printf("op,k,threads,contention,persist,mops_median\n");
  for (const char* mode : {"flush", "none"}) {
    SetPersistMode(std::string(mode) == "flush" ? PersistMode::kFlush : PersistMode::kNone);
    for (int t : threads)
      for (int high = 0; high < 2; high++) {
        std::vector<std::pair<std::string, int>> cases = {{"cas", 1}};
        for (int k : ks) cases.push_back({"pmwcas", k});
        for (auto& [op, k] : cases) {
          std::vector<double> r;
          for (int i = 0; i < rounds; i++) r.push_back(RunOnce(b, t, k, high, op == "cas", seconds));
          std::sort(r.begin(), r.end());
          std::printf("%s,%d,%d,%s,%s,%.3f\n", op.c_str(), k, t, high ? "high" : "low", mode, r[r.size() / 2]);
          std::fflush(stdout);
        }
      }
  }
  SetPersistMode(PersistMode::kFlush);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"PMwCAS persist cost and throughput"};
  app.require_subcommand(1);
  uint32_t max_k = 8;
  auto* cost = app.add_subcommand("cost", "lines flushed and fences per k-word operation (exact)");
  cost->add_option("--max-words", max_k, "largest k")->check(CLI::Range(1, 64));
  std::vector<int> ks = {1, 2, 4}, threads = {1, 2};
  double seconds = 1.0;
  int rounds = 3;
  auto* tput = app.add_subcommand("throughput", "operations per second (timing: quiet machine only)");
  tput->add_option("--words", ks, "k values")->delimiter(',')->check(CLI::Range(1, 16));
  tput->add_option("--threads", threads, "thread counts")->delimiter(',')->check(CLI::Range(1, 8));
  tput->add_option("--seconds", seconds, "seconds per configuration and round");
  tput->add_option("--rounds", rounds, "rounds (median)")->check(CLI::Range(1, 99));
  CLI11_PARSE(app, argc, argv);
  if (cost->parsed()) return Cost(max_k);
  return Throughput(ks, threads, seconds, rounds);
}
