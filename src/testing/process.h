// Test support (not part of the library): running a command and capturing
// its output, and a child process that holds a pool open until killed, for
// the "second process opens the same pool" tests of the substrate, the tools
// and the indexes. Header-only; tests include it as "testing/process.h".
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

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

}  // namespace pmindex::testutil
