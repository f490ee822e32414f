// hello: the smallest program against pmindex. Opens (or creates) an FPTree
// in a pool file, inserts a few byte-string records, reads one back and scans
// them in order. Run it twice with the same pool path: the second run finds
// the records of the first (they were durable when Insert returned OK) and
// Insert answers AlreadyExists.
//   hello [POOL]   (default /dev/shm/hello.pool; remove it to start over)
#include <cstdio>
#include <memory>
#include <string>

#include "pmindex/index.h"

int main(int argc, char** argv) {
  pmindex::Options opt;
  opt.pool_path = argc > 1 ? argv[1] : "/dev/shm/hello.pool";  // created if missing, recovered if present
  opt.key_kind = pmindex::KeyKind::kBytes;
  opt.value_kind = pmindex::ValueKind::kBytes;

  std::unique_ptr<pmindex::Index> idx;
  pmindex::Status s = pmindex::OpenIndex("fptree", opt, &idx);
  if (!s.ok()) {
    std::fprintf(stderr, "open %s: %s\n", opt.pool_path.c_str(), s.ToString().c_str());
    return 1;
  }

  for (const char* k : {"alpha", "beta", "gamma"}) {
    s = idx->Insert(k, std::string("value of ") + k);
    std::printf("insert %-6s %s\n", k, s.ToString().c_str());  // OK, or AlreadyExists on a second run
  }

  std::string v;
  s = idx->Find("beta", &v);
  std::printf("find beta: %s %s\n", s.ToString().c_str(), s.ok() ? v.c_str() : "");

  std::printf("scan from \"a\":\n");
  idx->Scan("a", 10, [](pmindex::Slice k, pmindex::Slice val) {
    std::printf("  %.*s = %.*s\n", static_cast<int>(k.size()), k.data(), static_cast<int>(val.size()), val.data());
    return true;  // false stops the scan
  });
  std::printf("%llu records\n", static_cast<unsigned long long>(idx->Size()));
  return 0;  // the index closes cleanly when idx is destroyed
}
