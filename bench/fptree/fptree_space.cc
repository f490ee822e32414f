// fptree_space: space and scan cost after deletes for the FPTree family
// (docs/fptree.md, "Space after deletes"). For each index named by --index
// (default fptree,fptree_single,ptree), u64 keys = id * kMul:
//   deleted   --records loaded in random order, then --delete-pct percent of
//             them removed in random order (the live tree, not reopened);
//   reopened  the same history, then closed and reopened (open compacts);
//   fresh     a tree loaded (random order) with only the remaining records.
// Prints the PM bytes the pool's allocator has in use (peak after the load,
// after the deletes, after the reopen, fresh) and the leaves of each tree;
// these are deterministic. Then --rounds interleaved rounds of --scans scans
// of --scan-len records (start keys drawn from the live keys, the same for
// the three trees; the order of the trees alternates between rounds); prints
// the scan throughput per record returned of each tree and its ratio to the
// fresh tree (total and median of per-round ratios). The goal: reopened / fresh
// >= 0.8, PM after the reopen <= half of the peak.
// Usage: fptree_space [--index a,b] [--records N] [--delete-pct P]
//   [--rounds N] [--scans N] [--scan-len N]
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "fptree/fptree.h"
#include "pmindex/index.h"
#include "pmindex/pm/allocator.h"
#include "pmindex/pm/pool.h"

using namespace pmindex;
using namespace pmindex::benchutil;

namespace {

uint64_t PmBytes(Index* idx) { return idx->pool()->allocator().BytesInUse(); }
uint64_t Leaves(Index* idx) {
  uint64_t inner = 0, leaves = 0;
  internal::FPTreeShape(idx, &inner, &leaves);
  return leaves;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> names = {"fptree", "fptree_single", "ptree"};
  uint64_t records = 1000000, pct = 90, rounds = 20, scans = 2000, scan_len = 100;
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    if (a == "--records") records = std::strtoull(NextArg(argc, argv, &i).c_str(), nullptr, 10);
    else if (a == "--delete-pct") pct = std::min<uint64_t>(99, std::strtoull(NextArg(argc, argv, &i).c_str(), nullptr, 10));
    else if (a == "--rounds") rounds = std::strtoull(NextArg(argc, argv, &i).c_str(), nullptr, 10);
    else if (a == "--scans") scans = std::strtoull(NextArg(argc, argv, &i).c_str(), nullptr, 10);
    else if (a == "--scan-len") scan_len = std::strtoull(NextArg(argc, argv, &i).c_str(), nullptr, 10);
    else if (a == "--index") {
      names.clear();
      std::stringstream ss(NextArg(argc, argv, &i));
      for (std::string v; std::getline(ss, v, ',');)
        if (!v.empty()) names.push_back(v);
    } else {
      std::fprintf(stderr, "usage: %s [--index a,b] [--records N] [--delete-pct P] [--rounds N] [--scans N] [--scan-len N]\n",
                   argv[0]);
      return 2;
    }
  }
  // The history: ids loaded, deleted, and the live ids left.
  std::mt19937_64 rng(1);
  std::vector<uint64_t> load(records);
  for (uint64_t i = 0; i < records; i++) load[i] = i;
  std::shuffle(load.begin(), load.end(), rng);
  std::vector<uint64_t> order = load;
  std::shuffle(order.begin(), order.end(), rng);
  const size_t ndel = size_t(records * pct / 100);
  std::vector<uint64_t> live(order.begin() + ndel, order.end());
  std::vector<uint64_t> fresh_load = live;
  std::shuffle(fresh_load.begin(), fresh_load.end(), rng);

  for (const std::string& name : names) {
    const char* tree_names[3] = {"deleted", "reopened", "fresh"};
    std::unique_ptr<Index> t[3];
    Options o[3];
    uint64_t peak = 0, after_del = 0;
    for (int x = 0; x < 3; x++) {
      o[x].pool_path = "/dev/shm/fptree-space-" + name + "-" + std::to_string(getpid()) + "-" + tree_names[x] + ".pool";
      o[x].pool_size = 64ull << 20;
      Die(OpenIndex(name, o[x], &t[x]), "open");
      if (x < 2) {
        for (uint64_t id : load) t[x]->Insert(U64Slice(id * kMul), U64Slice(id));
        peak = PmBytes(t[x].get());
        for (size_t i = 0; i < ndel; i++) t[x]->Remove(U64Slice(order[i] * kMul));
        after_del = PmBytes(t[x].get());
      } else {
        for (uint64_t id : fresh_load) t[x]->Insert(U64Slice(id * kMul), U64Slice(id));
      }
      if (x == 1) {
        t[x].reset();
        Options r = o[x];
        r.create_if_missing = false;
        Die(OpenIndex(name, r, &t[x]), "reopen");
      }
    }
    std::printf("%s: %llu records, %llu%% deleted: PM bytes peak %llu, after deletes %llu (%.2f of peak), "
                "after reopen %llu (%.2f), fresh %llu (%.2f); leaves deleted %llu, reopened %llu, fresh %llu\n",
                name.c_str(), (unsigned long long)records, (unsigned long long)pct, (unsigned long long)peak,
                (unsigned long long)after_del, double(after_del) / double(peak), (unsigned long long)PmBytes(t[1].get()),
                double(PmBytes(t[1].get())) / double(peak), (unsigned long long)PmBytes(t[2].get()),
                double(PmBytes(t[2].get())) / double(peak), (unsigned long long)Leaves(t[0].get()),
                (unsigned long long)Leaves(t[1].get()), (unsigned long long)Leaves(t[2].get()));
    // Warm each tree's scan-order hints once.
    for (auto& x : t)
      if (rounds) x->Scan(U64Slice(0), records, [](Slice, Slice) { return true; });
    double time[3] = {0, 0, 0};
    uint64_t got[3] = {0, 0, 0}, sink = 0;
    std::vector<std::vector<double>> ratio(3);
    std::vector<uint64_t> starts(scans);
    for (uint64_t r = 0; r < rounds && !live.empty(); r++) {
      for (auto& k : starts) k = live[rng() % live.size()] * kMul;
      double per[3];
      for (int y = 0; y < 3; y++) {
        const int x = r % 2 ? 2 - y : y;
        uint64_t n = 0;
        const double t0 = Now();
        for (uint64_t k : starts) {
          size_t c = 0;
          t[x]->Scan(U64Slice(k), scan_len, [&](Slice key, Slice) {
            sink += key.size();
            return true;
          }, &c);
          n += c;
        }
        const double dt = Now() - t0;
        time[x] += dt;
        got[x] += n;
        per[x] = double(n) / dt;
      }
      for (int x = 0; x < 3; x++) ratio[x].push_back(per[x] / per[2]);
    }
    for (int x = 0; x < 3 && rounds; x++)
      std::printf("  %-9s scan %8.2f Mrecords/s, ratio to fresh %.3f (median of rounds %.3f)\n", tree_names[x],
                  double(got[x]) / time[x] / 1e6, (double(got[x]) / time[x]) / (double(got[2]) / time[2]),
                  Median(ratio[x]));
    if (sink == 1) std::printf(" ");
    for (int x = 0; x < 3; x++) {
      t[x].reset();
      pm::Pool::Remove(o[x].pool_path);
    }
  }
  return 0;
}
