// fptree_findmix: same-state, finely interleaved find and insert throughput
// of several index configurations, uniform or self-similar, for judging
// small CPU/cache-side changes on a shared machine (docs/fptree.md,
// "Session 5").
//
// Every configuration ("name" or "name:param=value:param=value", e.g.
// fptree:inner_size=512) gets the same --records u64 keys (id * odd
// constant, as pmbench; loaded in random order). Then --rounds rounds; in
// each round every configuration runs the same --finds finds (ids drawn
// uniformly or SELFSIMILAR with --skew h, as pmbench: a share 1-h of the
// finds on a share h of the ids) and then the same --inserts inserts of
// fresh ids, one configuration after the other, each slice timed. The order
// of the configurations rotates by one every round, so each one runs in
// every position equally often: a fixed order biases the ratios (the index
// that always runs right after dram_btree finds its lines evicted; measured
// up to 15% between two identical configurations).
// Prints, per configuration, the ratio of total times against the first
// configuration (>1: faster) and the median of the per-round ratios.
// Usage: fptree_findmix [--index a,b,...] [--records N] [--rounds N]
//   [--finds N] [--inserts N] [--skew h (0: uniform)] [--seed N]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "index_spec.h"
#include "pmindex/index.h"

using namespace pmindex;
using namespace pmindex::benchutil;

int main(int argc, char** argv) {
  std::vector<std::string> specs = {"dram_btree", "fptree"};
  uint64_t records = 1000000, rounds = 30, finds = 30000, inserts = 10000, seed = 1;
  double h = 0.2;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--index") {
      specs.clear();
      std::stringstream ss(next());
      std::string t;
      while (std::getline(ss, t, ',')) specs.push_back(t);
    } else if (a == "--records") {
      records = std::strtoull(next(), nullptr, 10);
    } else if (a == "--rounds") {
      rounds = std::strtoull(next(), nullptr, 10);
    } else if (a == "--finds") {
      finds = std::strtoull(next(), nullptr, 10);
    } else if (a == "--inserts") {
      inserts = std::strtoull(next(), nullptr, 10);
    } else if (a == "--skew") {
      h = std::atof(next());
    } else if (a == "--seed") {
      seed = std::strtoull(next(), nullptr, 10);
    } else {
      std::fprintf(stderr,
                   "usage: %s [--index a,b:param=v,...] [--records N] [--rounds N] [--finds N] [--inserts N] [--skew h] [--seed N]\n",
                   argv[0]);
      return 2;
    }
  }
  if (specs.size() < 2 || records == 0 || rounds == 0 || h < 0 || h > 0.5) {
    std::fprintf(stderr, "need at least two configurations, records > 0, rounds > 0, 0 <= skew <= 0.5\n");
    return 2;
  }
  size_t n = specs.size();
  std::vector<std::unique_ptr<Index>> idx(n);
  for (size_t i = 0; i < n; i++) {
    Options o;
    std::string name;
    if (!ParseIndexSpec(specs[i], &name, &o)) return 2;
    Status s = OpenIndex(name, o, &idx[i]);
    if (!s.ok()) {
      std::fprintf(stderr, "%s: %s\n", specs[i].c_str(), s.ToString().c_str());
      return 1;
    }
  }
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> ids(records);
  for (uint64_t i = 0; i < records; i++) ids[i] = i;
  std::shuffle(ids.begin(), ids.end(), rng);
  for (size_t i = 0; i < n; i++)
    for (uint64_t id : ids) {
      uint64_t k = id * kMul;
      if (!idx[i]->Insert(U64Slice(k), U64Slice(id)).ok()) {
        std::fprintf(stderr, "%s: load failed\n", specs[i].c_str());
        return 1;
      }
    }
  // SELFSIMILAR as pmbench: rank = n * u^(log h / log(1-h)).
  double expo = h > 0 ? std::log(h) / std::log(1 - h) : 1;
  std::uniform_real_distribution<double> uni(0, 1);
  std::vector<uint64_t> fk(finds), ik(inserts);
  std::vector<double> tf(n, 0), ti(n, 0);
  std::vector<std::vector<double>> rf(n), ri(n);
  std::string v;
  uint64_t fresh = records;
  for (uint64_t r = 0; r < rounds; r++) {
    for (auto& k : fk) {
      uint64_t id = uint64_t(double(records) * std::pow(uni(rng), expo));
      k = std::min<uint64_t>(id, records - 1) * kMul;
    }
    for (auto& k : ik) k = (fresh++) * kMul;
    std::vector<double> a(n), b(n);
    for (size_t p = 0; p < n; p++) {
      size_t m = (p + r) % n;
      Index* ix = idx[m].get();
      double t0 = Now();
      for (uint64_t k : fk)
        if (!ix->Find(U64Slice(k), &v).ok()) {
          std::fprintf(stderr, "%s: a loaded key was not found\n", specs[m].c_str());
          return 1;
        }
      a[m] = Now() - t0;
    }
    for (size_t p = 0; p < n; p++) {
      size_t m = (p + r) % n;
      Index* ix = idx[m].get();
      double t0 = Now();
      for (uint64_t k : ik)
        if (!ix->Insert(U64Slice(k), U64Slice(k)).ok()) {
          std::fprintf(stderr, "%s: insert failed\n", specs[m].c_str());
          return 1;
        }
      b[m] = Now() - t0;
    }
    for (size_t m = 0; m < n; m++) {
      tf[m] += a[m];
      ti[m] += b[m];
      rf[m].push_back(a[0] / a[m]);
      if (inserts) ri[m].push_back(b[0] / b[m]);
    }
  }
  std::printf("%llu records, %llu rounds of %llu finds (%s) and %llu inserts; ratio against %s (>1: faster), median of rounds in brackets\n",
              static_cast<unsigned long long>(records), static_cast<unsigned long long>(rounds),
              static_cast<unsigned long long>(finds), h > 0 ? ("self-similar " + std::to_string(h)).c_str() : "uniform",
              static_cast<unsigned long long>(inserts), specs[0].c_str());
  for (size_t m = 0; m < n; m++)
    std::printf("%-32s find %.3f (%.3f)  insert %.3f (%.3f)  [%.0f ns/find, %.0f ns/insert]\n", specs[m].c_str(), tf[0] / tf[m],
                Median(rf[m]), inserts ? ti[0] / ti[m] : 0.0, inserts ? Median(ri[m]) : 0.0, 1e9 * tf[m] / double(rounds * finds),
                inserts ? 1e9 * ti[m] / double(rounds * inserts) : 0.0);
  return 0;
}
