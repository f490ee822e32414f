// clfbtree_figures: prints the clfB-tree's counted figures (docs/clfbtree.md,
// "Figures"; paper tables 1 and 2, figure 5, sec. 7.4). Counts, never times:
//   tables  N random u64 keys into append-only leaves of 64, 128, 256 and
//           512 bytes with method atomic (emulated) and inplace: lines
//           written by in-place inner-node updates, by new inner nodes
//           (splits, new roots), by leaf splits and by leaf inserts that do
//           not split, their sum, and the identities the paper's numbers
//           obey;
//   widths  the key and pointer width histograms of every encoded node and
//           the node utilisation after 1K, 100K (and optionally 10M) keys,
//           append-only 512-byte leaves (figure 5);
//   flushes lines flushed or written per insert (everything: allocator and
//           logs included) by method and leaf kind.
// Usage: clfbtree_figures [tables|widths|flushes|all] [N (default 1000000)]
//        [widths_max (default 100000)]
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>

#include "clfbtree/clfbtree_tree.h"
#include "pmindex/index.h"

using namespace pmindex;
using internal::clfbtree::ClfBTree;

namespace {

std::string PoolPath() { return "/dev/shm/clfbtree_figures_" + std::to_string(::getpid()) + ".pool"; }

std::unique_ptr<Index> Make(std::map<std::string, std::string> params, uint64_t n) {
  Options o;
  o.pool_path = PoolPath();
  std::filesystem::remove(o.pool_path);
  o.pool_size = std::max<uint64_t>(64ull << 20, n * 200);
  params["tally"] = "1";
  if (params["parent"] == "atomic") params["emulate_line_atomic"] = "1";
  o.params = params;
  std::unique_ptr<Index> idx;
  Status s = OpenIndex("clfbtree", o, &idx);
  if (!s.ok()) {
    std::fprintf(stderr, "open: %s\n", s.ToString().c_str());
    std::exit(1);
  }
  return idx;
}

void Fill(Index* idx, uint64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (uint64_t i = 0; i < n; i++) {
    const uint64_t k = rng();
    Status s = idx->Insert(U64Slice(k), U64Slice(i));
    if (!s.ok() && s.code() != Status::Code::kAlreadyExists) {
      std::fprintf(stderr, "insert: %s\n", s.ToString().c_str());
      std::exit(1);
    }
  }
}

void Tables(uint64_t n) {
  for (const char* parent : {"atomic", "inplace"}) {
    std::printf("\nTable %s: lines written, %llu random u64 inserts, append-only leaves, parent=%s%s\n",
                std::strcmp(parent, "atomic") ? "2" : "1", (unsigned long long)n, parent,
                std::strcmp(parent, "atomic") ? "" : " (emulated line write)");
    std::printf("| leaf bytes | inner update | inner new nodes | leaf split | leaf no split | sum | leaf splits | "
                "inner splits | leaf split lines / (2k x splits) | leaf no-split lines / (2 x inserts) |\n"
                "|---|---|---|---|---|---|---|---|---|---|\n");
    for (int size : {64, 128, 256, 512}) {
      auto idx = Make({{"parent", parent}, {"leaf", "append"}, {"leaf_size", std::to_string(size)}}, n);
      Fill(idx.get(), n, 1);
      auto* t = dynamic_cast<ClfBTree*>(idx.get());
      const auto y = t->tally();
      const uint64_t k = uint64_t(size) / 64;
      std::printf("| %d | %llu | %llu | %llu | %llu | %llu | %llu | %llu | %.4f | %.4f |\n", size,
                  (unsigned long long)y.inner_update, (unsigned long long)y.inner_split,
                  (unsigned long long)y.leaf_split, (unsigned long long)y.leaf_plain,
                  (unsigned long long)(y.inner_update + y.inner_split + y.leaf_split + y.leaf_plain),
                  (unsigned long long)y.leaf_splits, (unsigned long long)y.inner_splits,
                  double(y.leaf_split) / double(2 * k * y.leaf_splits),
                  double(y.leaf_plain) / double(2 * (n - y.leaf_splits)));
      idx.reset();
      std::filesystem::remove(PoolPath());
    }
  }
}

void Widths(uint64_t max_n) {
  std::printf("\nFigure 5: encoding widths (bytes: share of encoded differences), append-only 512-byte leaves\n");
  std::printf("| keys | nodes | pointer widths 1..8 (%%) | key widths 1..8 (%%) | utilisation |\n|---|---|---|---|---|\n");
  for (uint64_t n : {uint64_t(1000), uint64_t(100000), uint64_t(10000000)}) {
    if (n > max_n) break;
    auto idx = Make({{"parent", "inplace"}, {"leaf", "append"}, {"leaf_size", "512"}}, n);
    Fill(idx.get(), n, 2);
    auto* t = dynamic_cast<ClfBTree*>(idx.get());
    uint64_t kw[9], pw[9], nodes;
    double util;
    t->Widths(kw, pw, &nodes, &util);
    uint64_t ks = 0, ps = 0;
    for (int i = 1; i <= 8; i++) ks += kw[i], ps += pw[i];
    std::printf("| %llu | %llu |", (unsigned long long)n, (unsigned long long)nodes);
    for (int i = 1; i <= 8; i++) std::printf(" %.1f", ps ? 100.0 * double(pw[i]) / double(ps) : 0.0);
    std::printf(" |");
    for (int i = 1; i <= 8; i++) std::printf(" %.1f", ks ? 100.0 * double(kw[i]) / double(ks) : 0.0);
    std::printf(" | %.0f%% |\n", 100 * util);
    idx.reset();
    std::filesystem::remove(PoolPath());
  }
}

void Flushes(uint64_t n) {
  std::printf("\nLines flushed or written per insert (all of them: allocator and logs included), %llu random u64 keys\n",
              (unsigned long long)n);
  std::printf("| parent | leaf | lines per insert | tree lines per insert (tally) | fences per insert |\n|---|---|---|---|---|\n");
  for (const char* parent : {"atomic", "inplace", "shadow"}) {
    for (const char* leaf : {"encoded", "append"}) {
      auto idx = Make({{"parent", parent}, {"leaf", leaf}, {"leaf_size", "1024"}}, n);
      const pm::Counters before = pm::ThreadCounters();
      Fill(idx.get(), n, 3);
      const pm::Counters d = pm::ThreadCounters() - before;
      const auto y = dynamic_cast<ClfBTree*>(idx.get())->tally();
      std::printf("| %s | %s | %.3f | %.3f | %.3f |\n", parent, leaf, double(d.lines_flushed + d.line_writes) / double(n),
                  double(y.inner_update + y.inner_split + y.leaf_split + y.leaf_plain) / double(n),
                  double(d.fences) / double(n));
      idx.reset();
      std::filesystem::remove(PoolPath());
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string what = argc > 1 ? argv[1] : "all";
  const uint64_t n = argc > 2 ? std::stoull(argv[2]) : 1000000;
  const uint64_t wmax = argc > 3 ? std::stoull(argv[3]) : 100000;
  if (what == "tables" || what == "all") Tables(n);
  if (what == "widths" || what == "all") Widths(wmax);
  if (what == "flushes" || what == "all") Flushes(n);
  return 0;
}
