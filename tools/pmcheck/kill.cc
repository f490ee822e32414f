// pmcheck --kill N: process crashes (issue 5, "Process crashes").
//
// Each round forks a child that opens (or creates) the index on a /dev/shm
// pool and runs a slice of a seeded workload, writing one byte per
// acknowledged op (its Status code) to a pipe. The parent SIGKILLs it after a
// random delay (adapted so that kills land mid-workload), then verifies a copy
// of the pool in another child with the same rules as the simulator: every
// acknowledged op present, the op in flight all or nothing, Check(), no
// leak, further ops work. The copy keeps the verifier's own ops out of the
// pool the next round continues on. A kill leaves the page cache intact, so
// this finds non-atomic multi-word updates, broken recovery of locks and logs
// and recovery that is not idempotent (a round can be killed mid-recovery),
// not missing flushes (the simulator's job).
// No PM stores of its own.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "checker_internal.h"
#include "pm/image_file.h"

namespace pmcheck {

using pmindex::Status;

namespace {

Status CopyFile(const std::string& from, const std::string& to) {
  int in = ::open(from.c_str(), O_RDONLY);
  if (in < 0) return Status::IOError("open " + from);
  int out = pmindex::pm::CreateFileExclusive(to);
  if (out < 0) {
    ::close(in);
    return Status::IOError("open " + to);
  }
  Status s;
  off_t size = ::lseek(in, 0, SEEK_END);
  if (size < 0 || ::ftruncate(out, size) != 0) s = Status::IOError("size " + from);
  std::vector<char> buf(1 << 16);
  static const char zero[4096] = {};
  for (off_t off = 0; s.ok() && off < size; off += off_t(buf.size())) {
    ssize_t n = ::pread(in, buf.data(), buf.size(), off);
    if (n <= 0) {
      s = Status::IOError("read " + from);
      break;
    }
    for (ssize_t p = 0; p < n; p += 4096) {
      size_t len = size_t(std::min<ssize_t>(4096, n - p));
      if (std::memcmp(buf.data() + p, zero, len) == 0) continue;
      if (::pwrite(out, buf.data() + p, len, off + p) != ssize_t(len)) s = Status::IOError("write " + to);
    }
  }
  ::close(in);
  ::close(out);
  return s;
}

bool Exists(const std::string& p) { return ::access(p.c_str(), F_OK) == 0; }

}  // namespace

Status RunKill(const Config& c, Target* target, Report* report) {
  const std::string path = PoolPath(c, "kill");
  const std::string vpath = PoolPath(c, "killv");
  target->Remove(path);
  const uint64_t m = uint64_t(std::max(1, c.ops_per_kill_round));
  Config kc = c;
  kc.threads = 1;
  if (kc.keys == 0) kc.keys = std::max<uint64_t>(8, std::min<uint64_t>(c.ops, uint64_t(c.kills) * m) / 2);
  Workload wl(kc, 1, uint64_t(c.kills) * m, c.seed + 99);
  const auto& ops = wl.ops()[0];
  std::vector<uint32_t> committed(wl.num_keys(), 0), acked(wl.num_keys(), 0);
  bool created = false;
  std::mt19937_64 rng(c.seed * 7 + 3);
  double open_us = 2000;  // running estimate of the open (+ recovery) time

  for (int round = 0; round < c.kills; ++round) {
    int p[2];
    if (::pipe(p) != 0) return Status::IOError("pipe");
    std::fflush(stdout);
    std::fflush(stderr);
    const size_t first = size_t(round) * m;
    // Kill plan, drawn here so the run is reproducible from the seed: one
    // round in five dies during the open (and recovery), the others inside op
    // number kill_op, at a random fraction of two average op times after it
    // began. The child arms a real-time timer whose handler SIGKILLs the
    // process, so the moment does not depend on how fast the parent reacts.
    const bool in_open = rng() % 5 == 0;
    const uint64_t kill_op = rng() % m;
    const double frac = double(rng() % 10000) / 10000.0;
    pid_t pid = ::fork();
    if (pid < 0) return Status::IOError("fork");
    if (pid == 0) {
      ::close(p[0]);
      ::signal(SIGALRM, [](int) { ::kill(::getpid(), SIGKILL); });
      auto arm = [](double us) {
        struct itimerval it = {};
        it.it_value.tv_sec = time_t(us / 1e6);
        it.it_value.tv_usec = suseconds_t(std::max(1.0, us - double(it.it_value.tv_sec) * 1e6));
        ::setitimer(ITIMER_REAL, &it, nullptr);
      };
      using Clock = std::chrono::steady_clock;
      if (in_open) arm(frac * open_us);
      const auto t0 = Clock::now();
      std::unique_ptr<pmindex::Index> idx;
      Status s = target->OpenOrCreate(path, &idx);
      const auto t1 = Clock::now();
      char msg[5] = {s.ok() ? 'C' : 'X'};
      uint32_t us = uint32_t(std::chrono::duration_cast<std::chrono::microseconds>(t1 - t0).count());
      std::memcpy(msg + 1, &us, 4);
      if (::write(p[1], msg, 5) != 5 || !s.ok()) ::_exit(3);
      std::string got;
      for (size_t i = 0; i < m; ++i) {
        if (!in_open && i == kill_op) {
          double avg = i ? std::chrono::duration<double, std::micro>(Clock::now() - t1).count() / double(i) : 20.0;
          arm(frac * 2 * avg);
        }
        Status r = wl.Apply(idx.get(), ops[first + i], &got);
        char b = char(r.code());
        if (::write(p[1], &b, 1) != 1) ::_exit(4);
      }
      char e = 'E';
      if (::write(p[1], &e, 1) != 1) ::_exit(4);
      ::kill(::getpid(), SIGKILL);
      ::_exit(5);
    }
    ::close(p[1]);
    using Clock = std::chrono::steady_clock;
    const auto deadline = Clock::now() + std::chrono::milliseconds(int64_t(c.timeout_s * 1000));
    std::string bytes;
    bool hung = false;
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) {
        hung = true;
        ::kill(pid, SIGKILL);
        break;
      }
      struct pollfd pfd = {p[0], POLLIN, 0};
      int pr = ::poll(&pfd, 1, int(std::min<int64_t>(left, 1000)));
      if (pr < 0 && errno != EINTR) break;
      if (pr <= 0) continue;
      char tmp[512];
      ssize_t n = ::read(p[0], tmp, sizeof tmp);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      bytes.append(tmp, size_t(n));
    }
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    ::close(p[0]);
    report->kills++;
    if (bytes.size() >= 5 && bytes[0] == 'C') {
      uint32_t us;
      std::memcpy(&us, bytes.data() + 1, 4);
      open_us = 0.7 * open_us + 0.3 * double(us);
    }

    auto fail = [&](FailKind k, const std::string& what) {
      Failure f;
      f.kind = k;
      f.what = what + " [kill round " + std::to_string(round) + "]";
      f.kill_round = round;
      report->Add(c, std::move(f));
    };
    bool opened = bytes.size() >= 5 && bytes[0] == 'C';
    bool finished = false;
    size_t acked_ops = 0;
    if (!bytes.empty() && bytes[0] == 'X') {
      if (created) fail(FailKind::kInvariant, "the killed process could not open the index it had used before");
      else report->creation_interrupted++;
      target->Remove(path);
      std::fill(committed.begin(), committed.end(), 0);
      created = false;
      continue;
    }
    if (opened) {
      created = true;
      for (size_t i = 5; i < bytes.size(); ++i) {
        if (bytes[i] == 'E') {
          finished = true;
          break;
        }
        const Op& op = ops[first + acked_ops];
        auto code = static_cast<Status::Code>(bytes[i]);
        std::string err = wl.CheckResult(op, code, committed[op.kid], "");
        if (!err.empty() && op.type != OpType::kFind && op.type != OpType::kScan) fail(FailKind::kInvariant, "op " + std::to_string(first + acked_ops) + ": " + err);
        committed[op.kid] = Workload::After(op, code, committed[op.kid]);
        acked[op.kid] = std::max(acked[op.kid], committed[op.kid]);
        ++acked_ops;
      }
    }
    if (c.verbose) std::fprintf(stderr, "kill round %d: %s, %zu of %llu ops acknowledged%s\n", round, opened ? "opened" : "killed in open", acked_ops, static_cast<unsigned long long>(m), finished ? ", finished" : "");
    if (!opened) report->kills_in_open++;
    else if (!finished) report->kills_mid_workload++;
    if (hung) {
      fail(FailKind::kRecoveryCrash, "the mutating process made no progress for " + std::to_string(c.timeout_s) + " s (hang)");
      target->Remove(path);
      std::fill(committed.begin(), committed.end(), 0);
      created = false;
      continue;
    }

    if (!Exists(path)) {
      if (created) fail(FailKind::kLostAck, "the pool file disappeared");
      created = false;
      continue;
    }
    Expectation ex;
    ex.committed = &committed;
    ex.acked = &acked;
    ex.created = created;
    ex.report_inflight = true;
    if (opened && !finished && acked_ops < m) {
      const Op& op = ops[first + acked_ops];
      const uint32_t before = committed[op.kid];
      Status::Code want = Status::Code::kOk;
      if ((op.type == OpType::kInsert && before) || ((op.type == OpType::kUpdate || op.type == OpType::kRemove) && !before))
        want = Status::Code::kNotFound;  // any non-OK: no change
      const uint32_t after = Workload::After(op, want, before);
      if (after != before) ex.inflight.emplace_back(op.kid, after);
    }
    Status s = CopyFile(path, vpath);
    if (!s.ok()) return s;
    ChildResult r = RunInChild(c, [&](int fd) { VerifyRecovered(target, vpath, wl, ex, fd); });
    target->Remove(vpath);
    bool interrupted = false;
    for (const std::string& i : r.info) interrupted |= i.rfind("creation-interrupted", 0) == 0;
    for (Failure& f : r.failures) fail(f.kind, f.what);
    if (interrupted || !r.failures.empty()) {
      // Start over on a fresh pool so one failure is not reported every round.
      if (interrupted) report->creation_interrupted++;
      target->Remove(path);
      std::fill(committed.begin(), committed.end(), 0);
      created = false;
      continue;
    }
    for (const auto& [kid, ver] : r.versions) {
      committed[kid] = ver;
      acked[kid] = std::max(acked[kid], ver);
    }
    if (c.progress && (round + 1) % 20 == 0)
      std::fprintf(stderr, "pmcheck %s: %d/%d kills\n", c.index.c_str(), round + 1, c.kills);
  }
  target->Remove(path);
  return Status::OK();
}

}  // namespace pmcheck
