// Test support (not part of the library): running a command and capturing
// its output, a child process that holds a pool open until killed (the
// "second process opens the same pool" tests of the substrate, the tools and
// the indexes), and a child that acknowledges operations through a pipe
// until it is SIGKILLed (the indexes' "kill a loading process" tests).
// Header-only; tests include it as "testing/process.h".
// Thread-safety: each object belongs to the test thread that made it; fork
// from a test with no other threads running (the child runs only `open` or
// `body`).
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

namespace pmindex::testutil {

struct CommandResult {
  int code = -1;  // exit status, -1 if the command did not exit normally
  std::string out;
};

// Runs `cmd` through the shell and captures its standard output (append
// " 2>&1" to capture standard error too).
inline CommandResult RunCommand(const std::string& cmd) {
  CommandResult r;
  FILE* f = ::popen(cmd.c_str(), "r");
  if (!f) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) r.out.append(buf, n);
  int st = ::pclose(f);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

// Forks a child that runs `open` (which opens a pool and returns whether it
// succeeded, keeping it open), reports the result to the parent and then
// waits to be killed. The destructor SIGKILLs and reaps the child if Kill()
// was not called: the pool is left as after a crash of its holder.
class ChildHoldingPool {
 public:
  explicit ChildHoldingPool(const std::function<bool()>& open) {
    int fds[2];
    if (::pipe(fds) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(fds[0]);
      char ok = open() ? 'y' : 'n';
      (void)!::write(fds[1], &ok, 1);
      ::pause();
      ::_exit(0);
    }
    ::close(fds[1]);
    char ok = 0;
    if (pid_ > 0 && ::read(fds[0], &ok, 1) == 1) opened_ = ok == 'y';
    ::close(fds[0]);
  }
  ~ChildHoldingPool() { Kill(); }
  ChildHoldingPool(const ChildHoldingPool&) = delete;
  ChildHoldingPool& operator=(const ChildHoldingPool&) = delete;

  // True when the child is running and its open succeeded.
  bool opened() const { return opened_; }

  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int st;
    ::waitpid(pid_, &st, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  bool opened_ = false;
};

// Forks a child that runs body(ack) and then _exits(0) (a body that must not
// run its locals' destructors, e.g. close an index, calls ::_exit itself);
// the child calls ack(n) after each operation it completed (n is written to a
// pipe; false once the parent has stopped reading). The parent reads the
// acknowledgements, then SIGKILLs the child mid-operation: whatever it
// acknowledged must survive recovery. The destructor kills and reaps a child
// still running.
class AckingChild {
 public:
  using Ack = std::function<bool(uint64_t)>;
  explicit AckingChild(const std::function<void(const Ack& ack)>& body) {
    int fds[2];
    if (::pipe(fds) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(fds[0]);
      const int w = fds[1];
      body([w](uint64_t n) { return ::write(w, &n, sizeof n) == ssize_t(sizeof n); });
      ::_exit(0);
    }
    ::close(fds[1]);
    if (pid_ < 0) {
      ::close(fds[0]);
      return;
    }
    fd_ = fds[0];
  }
  ~AckingChild() {
    Kill(false, nullptr);
    if (fd_ >= 0) ::close(fd_);
  }
  AckingChild(const AckingChild&) = delete;
  AckingChild& operator=(const AckingChild&) = delete;

  // True when the pipe and the fork succeeded.
  bool started() const { return pid_ > 0; }

  // Reads acknowledgements into *last until one satisfies stop or the child
  // stops writing; returns whether any was read.
  bool ReadUntil(const std::function<bool(uint64_t)>& stop, uint64_t* last) {
    bool any = false;
    uint64_t x;
    while (fd_ >= 0 && ::read(fd_, &x, sizeof x) == ssize_t(sizeof x)) {
      *last = x;
      any = true;
      if (stop(x)) break;
    }
    return any;
  }

  // SIGKILLs the child; with drain, first reads into *last the
  // acknowledgements it wrote before it died. Closes the pipe, reaps the
  // child and returns its wait status.
  int Kill(bool drain, uint64_t* last) {
    if (pid_ <= 0) return 0;
    ::kill(pid_, SIGKILL);
    if (drain) {
      uint64_t x;
      while (::read(fd_, &x, sizeof x) == ssize_t(sizeof x)) *last = x;
    }
    ::close(fd_);
    fd_ = -1;
    int st = 0;
    ::waitpid(pid_, &st, 0);
    pid_ = -1;
    return st;
  }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
};

}  // namespace pmindex::testutil
