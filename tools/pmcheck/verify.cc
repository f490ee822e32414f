// pmcheck's child side: verification of a recovered index, run in a forked
// child so that a crash or hang of recovery is caught and classified
// (issue 5, "Simulator"; docs/pmcheck.md). Used by the simulator
// (simulator.cc) and the kill mode (kill.cc).
//
// Protocol: the child writes result lines to a pipe: "F <kind> <message>" per
// failure, "I <note>", "V <kid> <version>", and "DONE" last; a child that
// dies, hangs past the timeout, or exits without "DONE" is a recovery crash.
//
// Invariants: a recovered index holds, per key, the committed version or (for
// a key with an op in flight) the version that op writes; nothing else.
// This file never stores to a live pool: the child opens a crash image.
//
// Thread-safety: VerifyRecovered runs in the child alone; RunInChild is called
// by one thread at a time (it forks).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>

#include "checker_internal.h"
#include "core/index_util.h"

namespace pmcheck {

using pmindex::Slice;
using pmindex::Status;

namespace {

std::string OneLine(std::string s) {
  for (char& ch : s)
    if (ch == '\n' || ch == '\r') ch = ' ';
  return s;
}

std::string Hex(Slice s, size_t max = 24) {
  static const char* d = "0123456789abcdef";
  std::string o;
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    o += d[(unsigned char)s[i] >> 4];
    o += d[(unsigned char)s[i] & 15];
  }
  if (s.size() > max) o += "...";
  return o;
}

std::string Versions(const std::vector<uint32_t>& vs) {
  std::string o;
  for (uint32_t v : vs) o += (o.empty() ? "" : ", ") + (v ? std::to_string(v) : std::string("absent"));
  return o.empty() ? "none" : o;
}

// A key every thread writes (--shared-writes): its version must be one the
// ops' real-time order allows (shared_history.h).
void CheckShared(int fd, const Workload& wl, const SharedAllowed& a, int64_t ver, const std::string& v) {
  if (ver >= 0 && std::binary_search(a.allowed.begin(), a.allowed.end(), uint32_t(ver))) return;
  const std::string got = ver < 0 ? "torn value " + Hex(v) : ver == 0 ? "absent" : "version " + std::to_string(ver);
  const std::string msg = "shared-write key " + KeyName(wl, a.kid) + ": found " + got +
                          ", allowed by the ops' real-time order: " + Versions(a.allowed) + " (overwritten by a completed op: " +
                          Versions(a.superseded) + ")";
  const bool overwritten = ver >= 0 && std::binary_search(a.superseded.begin(), a.superseded.end(), uint32_t(ver));
  EmitFail(fd, ver < 0 ? FailKind::kTorn : overwritten ? FailKind::kLostAck : FailKind::kPartialOp, msg);
}

}  // namespace

void Emit(int fd, const std::string& line) {
  std::string l = OneLine(line) + "\n";
  const char* p = l.data();
  size_t n = l.size();
  while (n) {
    ssize_t w = ::write(fd, p, n);
    if (w <= 0) {
      if (w < 0 && errno == EINTR) continue;
      return;
    }
    p += w;
    n -= size_t(w);
  }
}
void EmitFail(int fd, FailKind k, const std::string& msg) { Emit(fd, "F " + std::to_string(int(k)) + " " + msg); }

std::string KeyName(const Workload& wl, uint32_t kid) {
  const std::string& k = wl.key(kid);
  if (wl.key_kind() == pmindex::KeyKind::kU64) return std::to_string(pmindex::SliceToU64(k));
  return "'" + k + "'";
}

// ---------------------------------------------------------------------------
// Verification of a recovered index (runs in the child).
void VerifyRecovered(Target* target, const std::string& path, const Workload& wl, const Expectation& e, int fd) {
  std::unique_ptr<pmindex::Index> idx;
  const auto t0 = std::chrono::steady_clock::now();
  Status st = target->Open(path, &idx);
  Emit(fd, "I timing open " + std::to_string(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count()) + " ms");
  if (!st.ok()) {
    if (!e.created) Emit(fd, "I creation-interrupted " + st.ToString());
    else EmitFail(fd, FailKind::kLostAck, "index creation was acknowledged but recovery failed: " + st.ToString());
    Emit(fd, "DONE");
    return;
  }
  st = idx->Check();
  if (!st.ok()) EmitFail(fd, FailKind::kInvariant, "Check() after recovery: " + st.ToString());

  std::unordered_map<uint32_t, uint32_t> inflight(e.inflight.begin(), e.inflight.end());
  std::unordered_map<uint32_t, const SharedAllowed*> shared;
  for (const SharedAllowed& a : e.shared) shared[a.kid] = &a;
  const size_t n = wl.num_keys();
  std::vector<int64_t> found(n, 0);
  uint64_t present = 0;
  std::string v;
  for (uint32_t kid = 0; kid < n; ++kid) {
    st = idx->Find(wl.key(kid), &v);
    int64_t ver = 0;
    if (st.ok()) {
      ver = wl.Decode(kid, v);
      ++present;
    } else if (!st.IsNotFound()) {
      EmitFail(fd, FailKind::kInvariant, "Find(" + KeyName(wl, kid) + ") after recovery: " + st.ToString());
      found[kid] = -2;
      continue;
    }
    found[kid] = ver;
    if (auto sh = shared.find(kid); sh != shared.end()) {
      CheckShared(fd, wl, *sh->second, ver, v);
      continue;
    }
    const uint32_t c = (*e.committed)[kid];
    auto it = inflight.find(kid);
    if (it != inflight.end() && ver == int64_t(c) && ver != int64_t(it->second) &&
        std::find(e.read_inflight.begin(), e.read_inflight.end(), kid) != e.read_inflight.end()) {
      EmitFail(fd, FailKind::kLostRead, "key " + KeyName(wl, kid) + ": found " + (ver ? "version " + std::to_string(ver) : std::string("absent")) +
                                            ", but a completed read had returned version " + std::to_string(it->second) +
                                            " (written by the op in flight)");
      continue;
    }
    if (ver == int64_t(c) || (it != inflight.end() && ver == int64_t(it->second))) continue;
    std::string allowed = c ? "version " + std::to_string(c) : "absent";
    if (it != inflight.end())
      allowed += it->second ? " or version " + std::to_string(it->second) + " (op in flight)" : " or absent (op in flight)";
    const std::string got = ver < 0 ? "torn value " + Hex(v) : ver == 0 ? "absent" : "version " + std::to_string(ver);
    const std::string msg = "key " + KeyName(wl, kid) + ": found " + got + ", expected " + allowed;
    if (ver < 0) EmitFail(fd, FailKind::kTorn, msg);
    else if (ver == 0 || uint32_t(ver) <= (*e.acked)[kid]) EmitFail(fd, FailKind::kLostAck, msg);
    else EmitFail(fd, FailKind::kPartialOp, msg);
  }
  if (e.report_inflight)
    for (const auto& [kid, after] : e.inflight) Emit(fd, "V " + std::to_string(kid) + " " + std::to_string(std::max<int64_t>(0, found[kid])));

  const uint64_t size = idx->Size();
  if (size != present)
    EmitFail(fd, FailKind::kInvariant, "Size() is " + std::to_string(size) + " but Find sees " + std::to_string(present) + " records");

  if (target->ordered()) {
    uint64_t seen = 0;
    std::string prev;
    bool first = true, reported = false;
    st = idx->Scan(
        wl.MinKey(), present + 64,
        [&](Slice k, Slice val) {
          ++seen;
          int64_t kid = wl.KeyId(k);
          if (reported) return true;
          if (!first && pmindex::internal::CompareKeys(wl.key_kind(), prev, k) >= 0) {
            EmitFail(fd, FailKind::kInvariant, "Scan returned keys out of order at key " + Hex(k));
            reported = true;
          } else if (kid < 0) {
            EmitFail(fd, FailKind::kTorn, "Scan returned a key no op wrote (torn or phantom): " + Hex(k));
            reported = true;
          } else if (wl.Decode(uint32_t(kid), val) != found[size_t(kid)]) {
            EmitFail(fd, FailKind::kInvariant, "Scan and Find disagree on key " + KeyName(wl, uint32_t(kid)));
            reported = true;
          }
          prev.assign(k.data(), k.size());
          first = false;
          return true;
        },
        nullptr);
    if (!st.ok() && !st.IsUnsupported()) EmitFail(fd, FailKind::kInvariant, "Scan after recovery: " + st.ToString());
    else if (st.ok() && seen != present)
      EmitFail(fd, FailKind::kInvariant, "Scan visited " + std::to_string(seen) + " records, Find sees " + std::to_string(present));
  }

  st = target->CheckLeaks(idx.get());
  if (!st.ok()) EmitFail(fd, FailKind::kLeak, st.ToString());

  // The recovered index must keep working.
  auto post_fail = [&](const std::string& m) { EmitFail(fd, FailKind::kInvariant, "after recovery: " + m); };
  const std::string pv = wl.Value(0, 999999);
  const std::string pv2 = wl.Value(0, 999998);
  for (int j = 0; j < 3; ++j) {
    st = idx->Insert(wl.PostKey(j), pv);
    if (!st.ok()) post_fail("Insert of a new key: " + st.ToString());
  }
  st = idx->Update(wl.PostKey(0), pv2);
  if (!st.ok()) post_fail("Update: " + st.ToString());
  st = idx->Remove(wl.PostKey(1));
  if (!st.ok()) post_fail("Remove: " + st.ToString());
  st = idx->Find(wl.PostKey(0), &v);
  if (!st.ok() || v != pv2) post_fail("Find after Update: " + st.ToString());
  st = idx->Find(wl.PostKey(1), &v);
  if (!st.IsNotFound()) post_fail("Find after Remove: " + st.ToString());
  for (uint32_t kid = 0; kid < n; ++kid)
    if (found[kid] > 0) {
      st = idx->Remove(wl.key(kid));
      if (!st.ok()) post_fail("Remove of recovered key " + KeyName(wl, kid) + ": " + st.ToString());
      break;
    }
  st = idx->Check();
  if (!st.ok()) post_fail("Check(): " + st.ToString());
  idx->Close();
  idx.reset();
  Emit(fd, "DONE");
}

// ---------------------------------------------------------------------------
ChildResult RunInChild(const Config& c, const std::function<void(int fd)>& body) {
  ChildResult r;
  int p[2];
  if (::pipe(p) != 0) {
    r.failures.push_back({FailKind::kSetup, "pipe failed"});
    return r;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(p[0]);
    ::close(p[1]);
    r.failures.push_back({FailKind::kSetup, "fork failed"});
    return r;
  }
  if (pid == 0) {
    ::close(p[0]);
    ::signal(SIGPIPE, SIG_IGN);
    body(p[1]);
    ::close(p[1]);
    ::_exit(0);
  }
  ::close(p[1]);
  std::string buf;
  // The timeout runs from the child's last line, so a child that checks
  // many images of its own (--recovery-crashes) and reports each stays alive.
  const auto timeout = std::chrono::milliseconds(int64_t(c.timeout_s * 1000));
  auto deadline = std::chrono::steady_clock::now() + timeout;
  bool timed_out = false;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    struct pollfd pfd = {p[0], POLLIN, 0};
    int pr = ::poll(&pfd, 1, int(std::min<int64_t>(left, 1000)));
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) continue;
    char tmp[4096];
    ssize_t got = ::read(p[0], tmp, sizeof tmp);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    buf.append(tmp, size_t(got));
    deadline = std::chrono::steady_clock::now() + timeout;
  }
  if (timed_out) ::kill(pid, SIGKILL);
  ::close(p[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  std::istringstream in(buf);
  std::string line;
  while (std::getline(in, line)) {
    if (line == "DONE") r.done = true;
    else if (line.rfind("F ", 0) == 0) {
      size_t sp = line.find(' ', 2);
      int k = std::atoi(line.c_str() + 2);
      if (k < 0 || k >= int(FailKind::kCount)) k = int(FailKind::kInvariant);
      r.failures.push_back({FailKind(k), sp == std::string::npos ? "" : line.substr(sp + 1)});
    } else if (line.rfind("I ", 0) == 0) r.info.push_back(line.substr(2));
    else if (line.rfind("V ", 0) == 0) {
      unsigned long a = 0, b = 0;
      if (std::sscanf(line.c_str() + 2, "%lu %lu", &a, &b) == 2) r.versions.emplace_back(uint32_t(a), uint32_t(b));
    }
  }
  if (timed_out) r.failures.push_back({FailKind::kRecoveryCrash, "recovery/verification hung (killed after " + std::to_string(c.timeout_s) + " s)"});
  else if (WIFSIGNALED(status))
    r.failures.push_back({FailKind::kRecoveryCrash, std::string("recovery/verification died with signal ") + strsignal(WTERMSIG(status))});
  else if (!r.done)
    r.failures.push_back({FailKind::kRecoveryCrash, "recovery/verification exited (status " + std::to_string(WEXITSTATUS(status)) + ") before finishing"});
  return r;
}

}  // namespace pmcheck
