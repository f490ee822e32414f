// server_load: a closed-loop load generator for memcached-protocol servers
// (pmindex-server, memcached), used by bench/server/figures.sh for the
// figures in docs/server.md.
//
//   server_load --server HOST:PORT --mode set|get|mixed|load|verify
//               [--threads N] [--keys N] [--value_size B] [--seconds S]
//               [--get_ratio R] [--seed N]
//
// set/get/mixed: each thread holds one connection and sends one request at a
// time (no pipelining) for --seconds, keys uniform over [0, keys); prints
// ops/s and latency percentiles (microseconds) over all threads.
// load: stores keys 0..keys-1 once (split over the threads) and prints the
// time taken. verify: gets keys 0..keys-1 and prints how many are present
// with the value load wrote (value bytes depend on the key only).
// Keys are "key:<n>" (zero padded to 12 digits). Replies are checked; any
// unexpected reply stops the run with exit code 1.
//
// Thread safety: each thread owns its socket, RNG and latency histogram;
// the histograms are merged after the joins.
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kBuckets = 1 << 20;  // 0.1 us buckets up to ~105 ms; beyond: the last bucket

struct Conn {
  int fd = -1;
  std::string buf;  // received, not consumed
  bool Connect(const std::string& host, const std::string& port) {
    addrinfo hints{}, *res = nullptr;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0) return false;
    fd = socket(res->ai_family, SOCK_STREAM, 0);
    bool ok = fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0;
    freeaddrinfo(res);
    int one = 1;
    if (ok) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return ok;
  }
  bool Send(const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
      ssize_t n = send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += size_t(n);
    }
    return true;
  }
  bool Fill() {
    char tmp[65536];
    ssize_t n = recv(fd, tmp, sizeof tmp, 0);
    if (n <= 0) return false;
    buf.append(tmp, size_t(n));
    return true;
  }
  // One reply line without \r\n.
  bool Line(std::string* out) {
    size_t p;
    while ((p = buf.find("\r\n")) == std::string::npos)
      if (!Fill()) return false;
    out->assign(buf, 0, p);
    buf.erase(0, p + 2);
    return true;
  }
  bool Bytes(size_t n, std::string* out) {
    while (buf.size() < n)
      if (!Fill()) return false;
    out->assign(buf, 0, n);
    buf.erase(0, n);
    return true;
  }
};

std::string Key(uint64_t k) {
  char b[32];
  std::snprintf(b, sizeof b, "key:%012llu", (unsigned long long)k);
  return b;
}

std::string Value(uint64_t k, size_t size) {
  std::string v(size, 'a' + char(k % 26));
  std::string tag = std::to_string(k);
  v.replace(0, std::min(size, tag.size()), tag, 0, std::min(size, tag.size()));
  return v;
}

bool Set(Conn& c, uint64_t k, size_t vs) {
  std::string v = Value(k, vs);
  std::string req = "set " + Key(k) + " 0 0 " + std::to_string(v.size()) + "\r\n" + v + "\r\n";
  std::string line;
  return c.Send(req) && c.Line(&line) && line == "STORED";
}

// 1 hit with the expected value, 0 miss, -1 error or wrong value.
int Get(Conn& c, uint64_t k, size_t vs, bool check) {
  std::string line, data;
  if (!c.Send("get " + Key(k) + "\r\n") || !c.Line(&line)) return -1;
  if (line == "END") return 0;
  size_t sp = line.rfind(' ');
  if (line.rfind("VALUE ", 0) != 0 || sp == std::string::npos) return -1;
  size_t n = std::stoul(line.substr(sp + 1));
  if (!c.Bytes(n + 2, &data) || !c.Line(&line) || line != "END") return -1;
  if (check && data.compare(0, n, Value(k, vs)) != 0) return -1;
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"server_load: closed-loop memcached-protocol load with latency percentiles"};
  std::string server = "127.0.0.1:11211", mode = "set";
  int threads = 2;
  uint64_t keys = 100000, seed = 1;
  size_t value_size = 100;
  double seconds = 10, get_ratio = 0.9;
  app.add_option("--server", server, "HOST:PORT");
  app.add_option("--mode", mode, "set, get, mixed, load or verify")
      ->check(CLI::IsMember({"set", "get", "mixed", "load", "verify"}));
  app.add_option("--threads", threads, "client threads (one connection each)")->check(CLI::Range(1, 1024));
  app.add_option("--keys", keys, "key space");
  app.add_option("--value_size", value_size, "value bytes");
  app.add_option("--seconds", seconds, "run time of set/get/mixed");
  app.add_option("--get_ratio", get_ratio, "share of gets in mixed");
  app.add_option("--seed", seed, "random seed");
  CLI11_PARSE(app, argc, argv);
  size_t colon = server.rfind(':');
  std::string host = server.substr(0, colon), port = server.substr(colon + 1);

  std::atomic<bool> failed{false};
  std::atomic<uint64_t> hits{0}, done{0};
  std::vector<std::vector<uint32_t>> hist(static_cast<size_t>(threads));
  auto t0 = Clock::now();
  auto deadline = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; t++) {
    ts.emplace_back([&, t] {
      Conn c;
      if (!c.Connect(host, port)) return failed.store(true);
      if (mode == "load" || mode == "verify") {
        for (uint64_t k = uint64_t(t); k < keys && !failed; k += uint64_t(threads)) {
          if (mode == "load") {
            if (!Set(c, k, value_size)) failed = true;
          } else {
            int r = Get(c, k, value_size, true);
            if (r < 0) failed = true;
            hits += uint64_t(r > 0);
          }
        }
        return;
      }
      auto& h = hist[size_t(t)];
      h.assign(kBuckets, 0);
      std::mt19937_64 rng(seed * 1000003 + uint64_t(t));
      std::uniform_int_distribution<uint64_t> key(0, keys - 1);
      std::uniform_real_distribution<double> coin(0, 1);
      uint64_t n = 0;
      for (;;) {
        if ((n & 63) == 0 && Clock::now() >= deadline) break;
        uint64_t k = key(rng);
        bool get = mode == "get" || (mode == "mixed" && coin(rng) < get_ratio);
        auto a = Clock::now();
        bool ok = get ? Get(c, k, value_size, false) >= 0 : Set(c, k, value_size);
        auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - a).count();
        if (!ok) return failed.store(true);
        h[std::min<size_t>(size_t(ns / 100), kBuckets - 1)]++;
        n++;
      }
      done += n;
    });
  }
  for (auto& t : ts) t.join();
  double el = std::chrono::duration<double>(Clock::now() - t0).count();
  if (failed) {
    std::fprintf(stderr, "server_load: unexpected reply or connection failure\n");
    return 1;
  }
  if (mode == "load") {
    std::printf("mode=load keys=%llu seconds=%.3f ops_per_s=%.0f\n", (unsigned long long)keys, el, double(keys) / el);
    return 0;
  }
  if (mode == "verify") {
    std::printf("mode=verify keys=%llu present=%llu seconds=%.3f\n", (unsigned long long)keys,
                (unsigned long long)hits.load(), el);
    return 0;
  }
  std::vector<uint64_t> all(kBuckets, 0);
  for (auto& h : hist)
    for (size_t i = 0; i < h.size(); i++) all[i] += h[i];
  uint64_t total = done.load();
  auto pct = [&](double p) {
    uint64_t want = uint64_t(p * double(total)), seen = 0;
    for (size_t i = 0; i < kBuckets; i++)
      if ((seen += all[i]) > want) return double(i) / 10.0;
    return double(kBuckets) / 10.0;
  };
  std::printf("mode=%s threads=%d ops=%llu ops_per_s=%.0f p50_us=%.1f p90_us=%.1f p99_us=%.1f p999_us=%.1f\n",
              mode.c_str(), threads, (unsigned long long)total, double(total) / el, pct(0.5), pct(0.9), pct(0.99),
              pct(0.999));
  return 0;
}
