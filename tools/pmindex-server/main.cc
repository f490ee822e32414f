// pmindex-server: a memcached text-protocol server whose items live in a
// pmindex engine (docs/server.md).
//
//   pmindex-server --engine NAME --pool PATH --port N [--threads N]
//                  [--listen ADDR] [--max_connections N] [--max_item_size BYTES]
//   (memcached's short forms: -p -t -l -c -I; and -m MB, --pool_size MB,
//    --sweep_interval S, --param k=v, -v)
//
// Start-up: opens the store (a second server on the same pool gets the
// pool's Busy error and exits 1), binds, reports "listening on ADDR:PORT" on
// stderr, and serves until SIGTERM or SIGINT; then it stops the workers,
// the sweeper, and closes the store (the pool is closed cleanly).
// A sweeper thread wakes every second: it runs a due delayed flush_all and,
// every --sweep_interval seconds, one Store::Sweep pass.
//
// Exit codes: 0 after a clean shutdown, 1 when the store or socket cannot be
// opened, 2 for a usage error.
//
// Thread safety: main owns everything; the worker threads (net.h) and the
// sweeper run between Server::Start and the joins below.
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <thread>

#include "common/cli.h"
#include "net.h"
#include "pmindex/pm/pool.h"

using namespace pmindex;
using namespace pmindex::server;

namespace {

// "1048576", "1024k", "1m" (memcached's -I syntax) to bytes.
bool ParseSize(const std::string& s, uint64_t* out) {
  if (s.empty()) return false;
  size_t pos = 0;
  uint64_t v = 0;
  try {
    v = std::stoull(s, &pos, 10);
  } catch (...) {
    return false;
  }
  std::string unit = s.substr(pos);
  if (unit == "k" || unit == "K") v <<= 10;
  else if (unit == "m" || unit == "M") v <<= 20;
  else if (!unit.empty()) return false;
  *out = v;
  return true;
}

void RaiseFileLimit(uint64_t want) {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= want) return;
  rl.rlim_cur = std::min<rlim_t>(want, rl.rlim_max);
  setrlimit(RLIMIT_NOFILE, &rl);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pmindex-server: a memcached-protocol server over a pmindex engine (docs/server.md)"};
  StoreConfig sc;
  NetConfig nc;
  std::string engine, item_size = "1m";
  uint64_t max_connections = 1024, memory_mb = 0, pool_mb = 64, sweep_interval = 60;
  std::vector<std::string> params;
  bool verbose = false;
  app.add_option("--engine", engine, "engine (default: the pool's own; fptree for a new pool)");
  app.add_option("--pool", sc.pool, "pool file (empty: a temporary pool removed at exit)");
  app.add_option("-p,--port", nc.port, "TCP port (0: any free port)")->check(CLI::Range(0, 65535));
  app.add_option("-t,--threads", nc.threads, "worker threads")->check(CLI::Range(1, 256));
  app.add_option("-l,--listen", nc.listen, "address to bind");
  app.add_option("-c,--max_connections", max_connections, "simultaneous connections")->check(CLI::Range(1, 1 << 20));
  app.add_option("-I,--max_item_size", item_size, "largest item data, bytes (k and m suffixes)");
  app.add_option("-m,--memory_limit", memory_mb, "pool growth limit in MiB (0: the library's default, 64 GiB)");
  app.add_option("--pool_size", pool_mb, "initial size of a new pool in MiB")->check(CLI::Range(1, 1 << 20));
  app.add_option("--sweep_interval", sweep_interval, "seconds between sweeps for expired items (0: never)");
  app.add_option("--param", params, "engine parameter NAME=VALUE (repeatable)");
  app.add_flag("-v", verbose, "report each start-up step");
  if (auto rc = tools::ParseArgs(app, argc, argv, 2)) return *rc;

  uint64_t item_bytes = 0;
  if (!ParseSize(item_size, &item_bytes) || item_bytes < 1024 || item_bytes > (64ull << 20) - 64) {
    std::cerr << "pmindex-server: --max_item_size is between 1k and 64m\n";
    return 2;
  }
  sc.max_item_size = item_bytes;
  sc.threads = nc.threads;
  sc.pool_size = pool_mb << 20;
  sc.max_pool_size = memory_mb << 20;
  if (sc.max_pool_size != 0 && sc.pool_size > sc.max_pool_size) sc.pool_size = sc.max_pool_size;
  sc.engine = engine;
  if (engine.empty() && (sc.pool.empty() || access(sc.pool.c_str(), F_OK) != 0)) sc.engine = "fptree";
  for (const auto& p : params) {
    size_t eq = p.find('=');
    if (eq == std::string::npos) {
      std::cerr << "pmindex-server: --param wants NAME=VALUE, got '" << p << "'\n";
      return 2;
    }
    sc.params[p.substr(0, eq)] = p.substr(eq + 1);
  }
  RaiseFileLimit(max_connections + 64);

  auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<Store> store;
  Status s = Store::Open(sc, &store);
  if (!s.ok()) {
    std::cerr << "pmindex-server: cannot open the store (engine " << (sc.engine.empty() ? "of the pool" : sc.engine)
              << ", pool " << (sc.pool.empty() ? "temporary" : sc.pool) << "): " << s.ToString() << "\n";
    return 1;
  }
  ServerState st;
  st.store = store.get();
  st.engine = store->info().name;
  st.pool = sc.pool;
  st.threads = nc.threads;
  st.max_connections = max_connections;
  pm::Pool* pool = store->kv()->index()->pool();
  st.limit_maxbytes = pool ? pool->max_size() : 0;
  st.started = Store::Now();
  st.open_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  uint64_t items = store->Items();

  Server server(&st, nc);
  std::string bound;
  s = server.Start(&bound);
  if (!s.ok()) {
    std::cerr << "pmindex-server: " << s.ToString() << "\n";
    server.Stop();
    store->Close();
    return 1;
  }
  std::fprintf(stderr, "pmindex-server: engine %s, pool %s, %llu items, opened in %.3f s; listening on %s (%d threads)\n",
               st.engine.c_str(), sc.pool.empty() ? "(temporary)" : sc.pool.c_str(), (unsigned long long)items,
               st.open_seconds, bound.c_str(), nc.threads);

  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  std::thread sweeper([&] {
    auto last = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lk(mu);
    while (!cv.wait_for(lk, std::chrono::seconds(1), [&] { return stop; })) {
      lk.unlock();
      uint32_t due = st.flush_at.load();
      if (due != 0 && due <= Store::Now() && st.flush_at.compare_exchange_strong(due, 0)) {
        Status fs = store->FlushAll();
        if (!fs.ok()) std::cerr << "pmindex-server: delayed flush_all: " << fs.ToString() << "\n";
      }
      auto now = std::chrono::steady_clock::now();
      if (sweep_interval > 0 && now - last >= std::chrono::seconds(sweep_interval)) {
        last = now;
        Status ss = store->Sweep();
        if (!ss.ok() && !ss.IsUnsupported()) std::cerr << "pmindex-server: sweep: " << ss.ToString() << "\n";
        if (verbose) std::cerr << "pmindex-server: sweep done\n";
      }
      lk.lock();
    }
  });

  server.Run();
  std::cerr << "pmindex-server: shutting down\n";
  server.Stop();
  {
    std::lock_guard<std::mutex> g(mu);
    stop = true;
  }
  cv.notify_all();
  sweeper.join();
  s = store->Close();
  if (!s.ok()) {
    std::cerr << "pmindex-server: closing the store: " << s.ToString() << "\n";
    return 1;
  }
  std::cerr << "pmindex-server: store closed\n";
  return 0;
}
