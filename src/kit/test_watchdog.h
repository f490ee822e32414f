// test_watchdog.h: test-only helper (not part of the library). Turns a hang
// into a failure: while armed past its deadline it prints what was being
// waited for and exits the process with status 1 (a stuck thread cannot be
// cancelled, and gtest cannot fail a test that never returns). One thread
// per watchdog for its whole life; Arm/Disarm are cheap, so a crash-image
// enumeration re-arms it for every image (a thread per image cost ~0.1 ms
// each under load).
//
//   TestWatchdog wd("SomeStressTest", 300);   // armed until destroyed or Disarm()
//   TestWatchdog wd; wd.Arm("image 7", 60); ... wd.Disarm();
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

namespace pmindex::test {

class TestWatchdog {
 public:
  TestWatchdog() : t_([this] { Run(); }) {}
  TestWatchdog(std::string what, int secs) : TestWatchdog() { Arm(std::move(what), secs); }
  ~TestWatchdog() {
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    t_.join();
  }
  TestWatchdog(const TestWatchdog&) = delete;
  TestWatchdog& operator=(const TestWatchdog&) = delete;

  // Starts (or restarts) a deadline `secs` from now for `what`.
  // Wakes the thread only if it is idle: one waiting on an earlier deadline
  // wakes then and waits again for this one (re-arming per image would
  // otherwise cost a wake-up and a context switch each).
  void Arm(std::string what, int secs) {
    bool wake;
    {
      std::lock_guard<std::mutex> g(mu_);
      what_ = std::move(what);
      secs_ = secs;
      deadline_ = Clock::now() + std::chrono::seconds(secs);
      armed_ = true;
      wake = idle_;
    }
    if (wake) cv_.notify_all();
  }
  void Disarm() {
    std::lock_guard<std::mutex> g(mu_);
    armed_ = false;
  }

 private:
  using Clock = std::chrono::steady_clock;
  void Run() {
    std::unique_lock<std::mutex> l(mu_);
    while (!stop_) {
      if (!armed_) {
        idle_ = true;
        cv_.wait(l);
        idle_ = false;
        continue;
      }
      cv_.wait_until(l, deadline_);
      if (!stop_ && armed_ && Clock::now() >= deadline_) {
        std::fprintf(stderr, "WATCHDOG: %s: not done within %d s (deadlock or a loop?); exiting\n", what_.c_str(), secs_);
        std::fflush(stdout);
        std::fflush(stderr);
        std::_Exit(1);
      }
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false, armed_ = false, idle_ = false;  // idle_: waiting with no deadline
  std::string what_;
  int secs_ = 0;
  Clock::time_point deadline_;
  std::thread t_;  // last: started after the members it uses
};

}  // namespace pmindex::test
