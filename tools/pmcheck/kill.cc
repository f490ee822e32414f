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
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "checker_internal.h"

namespace pmcheck {

using pmindex::Status;

namespace {

Status CopyFile(const std::string& from, const std::string& to) {
  int in = ::open(from.c_str(), O_RDONLY);
  if (in < 0) return Status::IOError("open " + from);
  int out = ::open(to.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
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
  Workload wl(kc, 1, uint64_t(c.kills) * m, c.seed + 99);
  const auto& ops = wl.ops()[0];
  std::vector<uint32_t> committed(wl.num_keys(), 0), acked(wl.num_keys(), 0);
  bool created = false;
  std::mt19937_64 rng(c.seed * 7 + 3);
  double delay_us = 3000;

  for (int round = 0; round < c.kills; ++round) {
    int p[2];
    if (::pipe(p) != 0) return Status::IOError("pipe");
    std::fflush(stdout);
    std::fflush(stderr);
    const size_t first = size_t(round) * m;
    pid_t pid = ::fork();
    if (pid < 0) return Status::IOError("fork");
    if (pid == 0) {
      ::close(p[0]);
      std::unique_ptr<pmindex::Index> idx;
      Status s = target->OpenOrCreate(path, &idx);
      char b = s.ok() ? 'C' : 'X';
      if (::write(p[1], &b, 1) != 1 || !s.ok()) ::_exit(3);
      std::string got;
      for (size_t i = first; i < first + m; ++i) {
        Status r = wl.Apply(idx.get(), ops[i], &got);
        b = char(r.code());
        if (::write(p[1], &b, 1) != 1) ::_exit(4);
      }
      b = 'E';
      if (::write(p[1], &b, 1) != 1) ::_exit(4);
      for (;;) ::pause();  // wait for the kill
    }
    ::close(p[1]);
    const auto delay = std::chrono::microseconds(int64_t(double(rng() % 1000) / 1000.0 * delay_us));
    std::this_thread::sleep_for(delay);
    ::kill(pid, SIGKILL);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    std::string bytes;
    char tmp[512];
    for (;;) {
      ssize_t n = ::read(p[0], tmp, sizeof tmp);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      bytes.append(tmp, size_t(n));
    }
    ::close(p[0]);
    report->kills++;

    auto fail = [&](FailKind k, const std::string& what) {
      Failure f;
      f.kind = k;
      f.what = what + " [kill round " + std::to_string(round) + "]";
      f.kill_round = round;
      report->Add(c, std::move(f));
    };
    bool opened = !bytes.empty() && bytes[0] == 'C';
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
      for (size_t i = 1; i < bytes.size(); ++i) {
        if (bytes[i] == 'E') {
          finished = true;
          break;
        }
        const Op& op = ops[first + acked_ops];
        auto code = static_cast<Status::Code>(bytes[i]);
        std::string err = wl.CheckResult(op, code, committed[op.kid], "");
        if (!err.empty() && op.type != OpType::kFind) fail(FailKind::kInvariant, "op " + std::to_string(first + acked_ops) + ": " + err);
        committed[op.kid] = Workload::After(op, code, committed[op.kid]);
        acked[op.kid] = std::max(acked[op.kid], committed[op.kid]);
        ++acked_ops;
      }
    }
    // Adapt the delay so that most kills land inside the workload.
    if (finished) delay_us = std::max(200.0, delay_us * 0.7);
    else if (acked_ops < m / 4) delay_us = std::min(2e6, delay_us * 1.3);

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
