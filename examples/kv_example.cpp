// kv_example.cpp: a persistent key-value store in a few lines (pmindex::KV).
//   kv_example [pool path] [engine]     (defaults: a temporary pool, fptree)
// Opens (or creates) the store, writes, reads, counts, walks a range with a
// callback and with an iterator, and closes. Run it twice with a path to see
// the records survive.
#include <cstdio>
#include <memory>
#include <string>

#include "pmindex/kv.h"

int main(int argc, char** argv) {
  pmindex::KVConfig config;
  config.path = argc > 1 ? argv[1] : "";        // "" : a temporary pool in /dev/shm
  config.size = 64 << 20;                        // grows in place when full
  std::string engine = argc > 2 ? argv[2] : "fptree";

  std::unique_ptr<pmindex::KV> kv;
  pmindex::Status s = pmindex::KV::Open(engine, config, &kv);
  if (!s.ok()) {
    std::fprintf(stderr, "open: %s\n", s.ToString().c_str());
    return 1;
  }
  uint64_t before = 0;
  kv->count_all(&before);
  std::printf("engine %s, %llu records at open\n", kv->info().name.c_str(), (unsigned long long)before);

  for (int i = 0; i < 10; i++) {
    s = kv->put("fruit:" + std::to_string(i), "value " + std::to_string(i));  // durable once OK
    if (!s.ok()) {
      std::fprintf(stderr, "put: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  std::string value;
  if (kv->get("fruit:3", &value).ok()) std::printf("fruit:3 = %s\n", value.c_str());
  if (kv->get("vegetable", &value).IsNotFound()) std::printf("vegetable: not found\n");
  kv->remove("fruit:9");

  if (kv->info().ordered) {  // hash engines answer range reads with Unsupported
    uint64_t n = 0;
    kv->count_between("fruit:2", "fruit:6", &n);  // bounds are exclusive
    std::printf("%llu records strictly between fruit:2 and fruit:6\n", (unsigned long long)n);
    kv->get_above("fruit:6", [](pmindex::Slice k, pmindex::Slice v) {
      std::printf("  above fruit:6: %.*s = %.*s\n", (int)k.size(), k.data(), (int)v.size(), v.data());
      return true;  // false stops
    });
    std::unique_ptr<pmindex::KVIterator> it;
    kv->new_iterator(&it);
    for (it->seek("fruit:4"); it->valid(); it->next())
      std::printf("  iterator: %.*s\n", (int)it->key().size(), it->key().data());
    if (!it->status().ok()) std::fprintf(stderr, "iterator: %s\n", it->status().ToString().c_str());
  }
  s = kv->close();
  return s.ok() ? 0 : 1;
}
