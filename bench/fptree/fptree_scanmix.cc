// fptree_scanmix: same-state, finely interleaved find and scan throughput of
// several indexes, for a shared machine whose load changes faster than
// pmbench's 2-second phases (docs/fptree.md, "Scan and find ratios").
//
// Every index gets exactly the same history (u64 keys = id * odd constant,
// as pmbench and fptree_opcost): --records loaded in random order, --insert
// more records, then --delete uniformly drawn live records. The defaults
// mimic what pmbench's time-mode run leaves behind for fptree (1M + ~2.4M
// inserted, ~3M deleted: sparse leaves), but here every index holds the same
// records, whereas in time mode each index runs its phases for 2 s at its
// own speed and ends with a different record count.
// Then --rounds rounds; in each round every index runs the same --finds
// finds, the same --scans scans of --scan-len records (start keys drawn
// from the live keys) and the same --round-inserts inserts of fresh keys,
// one index after the other, each timed. Slices are a
// few milliseconds, so load changes hit all indexes alike. Prints per index
// the throughput over all rounds, the ratio of totals against the first
// index and the median of the per-round ratios.
// Usage: fptree_scanmix [--index a,b,...] [--records N] [--insert N]
//   [--delete N] [--rounds N] [--finds N] [--scans N] [--scan-len N]
//   [--round-inserts N] [--warm]
// --warm: one scan over all records of each index before the rounds (FPTree
// leaves then carry a checked scan-order hint, as after pmbench's first
// scans; without it the rounds also measure the first sort of each leaf).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "pmindex/index.h"
#include "pmindex/pm/pool.h"

using namespace pmindex;
using namespace pmindex::benchutil;

int main(int argc, char** argv) {
  std::vector<std::string> names = {"dram_btree", "fptree"};
  uint64_t records = 1000000, inserts = 2400000, deletes = 3000000, rounds = 40, finds = 20000, scans = 1000, scan_len = 100,
           round_inserts = 0;
  bool warm = false;
  for (int i = 1; i < argc; i++) {
    auto num = [&](uint64_t* v) {
      if (i + 1 >= argc) return false;
      *v = std::strtoull(argv[++i], nullptr, 10);
      return true;
    };
    bool ok = true;
    if (!std::strcmp(argv[i], "--records")) ok = num(&records);
    else if (!std::strcmp(argv[i], "--insert")) ok = num(&inserts);
    else if (!std::strcmp(argv[i], "--delete")) ok = num(&deletes);
    else if (!std::strcmp(argv[i], "--rounds")) ok = num(&rounds);
    else if (!std::strcmp(argv[i], "--finds")) ok = num(&finds);
    else if (!std::strcmp(argv[i], "--scans")) ok = num(&scans);
    else if (!std::strcmp(argv[i], "--scan-len")) ok = num(&scan_len);
    else if (!std::strcmp(argv[i], "--round-inserts")) ok = num(&round_inserts);
    else if (!std::strcmp(argv[i], "--warm")) warm = true;
    else if (!std::strcmp(argv[i], "--index") && i + 1 < argc) {
      names.clear();
      std::stringstream ss(argv[++i]);
      for (std::string v; std::getline(ss, v, ',');)
        if (!v.empty()) names.push_back(v);
    } else ok = false;
    if (!ok) {
      std::fprintf(stderr,
                   "usage: %s [--index a,b,...] [--records N] [--insert N] [--delete N] [--rounds N] [--finds N] [--scans N] "
                   "[--scan-len N] [--round-inserts N] [--warm]\n",
                   argv[0]);
      return 2;
    }
  }
  if (deletes > records + inserts) deletes = records + inserts;

  // The history, shared by all indexes: ids loaded, inserted, deleted.
  std::mt19937_64 rng(1);
  std::vector<uint64_t> load(records);
  for (uint64_t i = 0; i < records; i++) load[i] = i;
  std::shuffle(load.begin(), load.end(), rng);
  std::vector<uint64_t> live = load;
  for (uint64_t i = 0; i < inserts; i++) live.push_back(records + i);
  std::vector<uint64_t> dels;
  for (uint64_t i = 0; i < deletes; i++) {
    size_t r = rng() % live.size();
    dels.push_back(live[r]);
    live[r] = live.back();
    live.pop_back();
  }

  std::vector<std::unique_ptr<Index>> idx(names.size());
  std::vector<std::string> paths(names.size());
  for (size_t x = 0; x < names.size(); x++) {
    Options o;
    paths[x] = "/dev/shm/fptree-scanmix-" + names[x] + "-" + std::to_string(getpid()) + ".pool";
    o.pool_path = paths[x];
    Status s = OpenIndex(names[x], o, &idx[x]);
    if (!s.ok()) {
      std::fprintf(stderr, "%s: %s\n", names[x].c_str(), s.ToString().c_str());
      return 1;
    }
    double t0 = Now();
    for (uint64_t id : load) idx[x]->Insert(U64Slice(id * kMul), U64Slice(id));
    for (uint64_t i = 0; i < inserts; i++) idx[x]->Insert(U64Slice((records + i) * kMul), U64Slice(records + i));
    for (uint64_t id : dels) idx[x]->Remove(U64Slice(id * kMul));
    if (warm) idx[x]->Scan(U64Slice(0), records + inserts, [](Slice, Slice) { return true; });
    IndexStats st = idx[x]->Stats();
    std::printf("%-14s built in %.1f s: %llu records, PM %.1f MiB, DRAM %.1f MiB\n", names[x].c_str(), Now() - t0,
                static_cast<unsigned long long>(idx[x]->Size()), double(st.pm_bytes) / 1048576.0,
                double(st.dram_bytes) / 1048576.0);
  }

  // Interleaved rounds.
  std::vector<double> ftime(names.size()), stime(names.size()), itime(names.size());
  std::vector<std::vector<double>> fratio(names.size()), sratio(names.size()), iratio(names.size());
  uint64_t next_id = records + inserts;
  std::string out;
  uint64_t sink = 0, got = 0, found = 0;
  std::vector<uint64_t> fkeys(finds), skeys(scans);
  for (uint64_t r = 0; r < rounds; r++) {
    for (auto& k : fkeys) k = live[rng() % live.size()] * kMul;
    for (auto& k : skeys) k = live[rng() % live.size()] * kMul;
    std::vector<double> ft(names.size()), sc(names.size()), it(names.size());
    // Alternate the order between rounds so that neither index always runs
    // right after the other's cache footprint.
    for (size_t y = 0; y < names.size(); y++) {
      size_t x = r % 2 ? names.size() - 1 - y : y;
      double t0 = Now();
      for (uint64_t k : fkeys) found += idx[x]->Find(U64Slice(k), &out).ok();
      double t1 = Now();
      for (uint64_t k : skeys) {
        size_t c = 0;
        idx[x]->Scan(U64Slice(k), scan_len, [&](Slice key, Slice) {
          sink += key.size();
          return true;
        }, &c);
        got += c;
      }
      double t2 = Now();
      for (uint64_t i = 0; i < round_inserts; i++) idx[x]->Insert(U64Slice((next_id + i) * kMul), U64Slice(next_id + i));
      double t3 = Now();
      ft[x] = t1 - t0;
      sc[x] = t2 - t1;
      it[x] = t3 - t2;
      ftime[x] += ft[x];
      stime[x] += sc[x];
      itime[x] += it[x];
    }
    next_id += round_inserts;
    for (size_t x = 0; x < names.size(); x++) {
      fratio[x].push_back(ft[0] / ft[x]);
      sratio[x].push_back(sc[0] / sc[x]);
      if (round_inserts) iratio[x].push_back(it[0] / it[x]);
    }
  }
  std::printf("%llu rounds of %llu finds and %llu scans of %llu per index, %zu live records (%llu finds found, %llu records scanned)\n",
              static_cast<unsigned long long>(rounds), static_cast<unsigned long long>(finds), static_cast<unsigned long long>(scans),
              static_cast<unsigned long long>(scan_len), live.size(), static_cast<unsigned long long>(found),
              static_cast<unsigned long long>(got));
  std::printf("%-14s %12s %9s %9s %12s %9s %9s", "index", "find Mops/s", "ratio", "median", "scan Kops/s", "ratio", "median");
  if (round_inserts) std::printf(" %12s %9s %9s", "ins Mops/s", "ratio", "median");
  std::printf("\n");
  for (size_t x = 0; x < names.size(); x++) {
    double fops = double(finds) * double(rounds) / ftime[x], sops = double(scans) * double(rounds) / stime[x];
    std::printf("%-14s %12.3f %9.3f %9.3f %12.1f %9.3f %9.3f", names[x].c_str(), fops / 1e6, ftime[0] / ftime[x],
                Median(fratio[x]), sops / 1e3, stime[0] / stime[x], Median(sratio[x]));
    if (round_inserts)
      std::printf(" %12.3f %9.3f %9.3f", double(round_inserts) * double(rounds) / itime[x] / 1e6, itime[0] / itime[x],
                  Median(iratio[x]));
    std::printf("\n");
  }
  if (sink == 1) std::printf(" ");
  for (size_t x = 0; x < names.size(); x++) {
    idx[x].reset();
    pm::Pool::Remove(paths[x]);
  }
  return 0;
}
