// kv_overhead: the cost of pmindex::KV over the Index it wraps, measured in
// one run on the same store (docs/kv.md). Loads N u64 records, then runs
// rounds in which each contender does a chunk of the same operations on the
// same keys, in an order that alternates per round so neither is favoured by
// its place or by load drifting:
//   find:  Index::Find per key      vs  KV::get per key
//   put:   Index::Upsert per key    vs  KV::put per key (existing keys)
//   many:  KV::get per key          vs  KV::get_many over batches of --batch keys
// Prints the median Mops/s of each and the ratio KV / Index (or get_many / get).
//   kv_overhead [--engine fptree] [--records 5000000] [--rounds 20]
//               [--chunk 200000] [--batch 16] [--pool /dev/shm/kv_overhead.pool]
// Single-threaded; the pool is removed at the end.
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.h"
#include "pmindex/kv.h"

using namespace pmindex;
using namespace pmindex::benchutil;

int main(int argc, char** argv) {
  std::string engine = "fptree", pool = "/dev/shm/kv_overhead.pool";
  uint64_t records = 5000000, chunk = 200000;
  int rounds = 20, batch = 16;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    if (a == "--engine") engine = NextArg(argc, argv, &i);
    else if (a == "--records") records = std::stoull(NextArg(argc, argv, &i));
    else if (a == "--rounds") rounds = std::stoi(NextArg(argc, argv, &i));
    else if (a == "--chunk") chunk = std::stoull(NextArg(argc, argv, &i));
    else if (a == "--batch") batch = std::stoi(NextArg(argc, argv, &i));
    else if (a == "--pool") pool = NextArg(argc, argv, &i);
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  unlink(pool.c_str());
  KVConfig cfg;
  cfg.path = pool;
  cfg.size = std::max<uint64_t>(64ull << 20, records * 64);
  cfg.key_kind = KeyKind::kU64;
  cfg.value_kind = ValueKind::kU64;
  std::unique_ptr<KV> kv;
  Die(KV::Open(engine, cfg, &kv), "open");
  Index* idx = kv->index();
  for (uint64_t i = 0; i < records; i++) {
    uint64_t k = i * kMul;
    Die(kv->put(U64Slice(k), U64Slice(i)), "load");
  }
  std::vector<uint64_t> keys(chunk);
  std::vector<double> a_mops[3], b_mops[3];
  std::string v;
  std::vector<Slice> many(batch);
  std::vector<std::string> vals;
  std::vector<Status> sts;
  uint64_t sink = 0;
  for (int r = 0; r < rounds; r++) {
    for (uint64_t j = 0; j < chunk; j++) keys[j] = Scramble(uint64_t(r) * chunk + j) % records * kMul;
    for (int test = 0; test < 3; test++) {
      for (int side = 0; side < 2; side++) {
        bool first_a = (r + test) % 2 == 0;
        bool run_a = (side == 0) == first_a;
        double t0 = Now();
        if (test == 0 && run_a) {
          for (uint64_t k : keys) sink += idx->Find(U64Slice(k), &v).ok();
        } else if (test == 0) {
          for (uint64_t k : keys) sink += kv->get(U64Slice(k), &v).ok();
        } else if (test == 1 && run_a) {
          for (uint64_t k : keys) sink += idx->Upsert(U64Slice(k), U64Slice(k)).ok();
        } else if (test == 1) {
          for (uint64_t k : keys) sink += kv->put(U64Slice(k), U64Slice(k)).ok();
        } else if (run_a) {
          for (uint64_t k : keys) sink += kv->get(U64Slice(k), &v).ok();
        } else {
          for (uint64_t j = 0; j + batch <= chunk; j += batch) {
            for (int b = 0; b < batch; b++) many[b] = U64Slice(keys[j + b]);
            sink += kv->get_many(many, &vals, &sts).ok();
          }
        }
        double mops = double(chunk) / (Now() - t0) / 1e6;
        (run_a ? a_mops : b_mops)[test].push_back(mops);
      }
    }
  }
  const char* names[3][2] = {{"Index::Find", "KV::get"}, {"Index::Upsert", "KV::put"}, {"KV::get", "KV::get_many"}};
  std::printf("engine %s, %llu records, %d rounds of %llu operations (sink %llu)\n", engine.c_str(),
              (unsigned long long)records, rounds, (unsigned long long)chunk, (unsigned long long)(sink & 1));
  for (int t = 0; t < 3; t++) {
    double a = Median(a_mops[t]), b = Median(b_mops[t]);
    std::printf("%-14s %8.3f Mops/s   %-14s %8.3f Mops/s   ratio %.3f\n", names[t][0], a, names[t][1], b, b / a);
  }
  Die(kv->close(), "close");
  unlink(pool.c_str());
  return 0;
}
