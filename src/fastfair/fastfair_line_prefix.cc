// The pm-model crash-state enumerator of the fastfair line-prefix crash
// tests (see fastfair_line_prefix.h).
#include "fastfair/fastfair_line_prefix.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <condition_variable>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "pm/image_file.h"

namespace fftest {

using namespace pmindex;

namespace {

// Bounds each crash image's verify(): on a broken build an image can make
// recovery or a read loop forever (with SplitAt's new node persisted only
// after the link, a read-only Scan of a rebalance's image spun in Descend).
// A stuck check cannot be stopped, so a watchdog thread (one per
// enumeration; verify() itself runs in the caller's thread, no per-image
// thread) reports the image and exits the process with status 1 once one
// image has been checked for kVerifyBound (thousands of times an image's
// check, also under ASan on a loaded machine).
constexpr auto kVerifyBound = std::chrono::seconds(60);
class Watchdog {
 public:
  explicit Watchdog(const std::string& name) : name_(name), t_([this] { Run(); }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    t_.join();
  }
  void Begin(int image, const std::string& desc) {
    std::lock_guard<std::mutex> g(mu_);
    image_ = image;
    desc_ = desc;
    since_ = std::chrono::steady_clock::now();
    busy_ = true;
  }
  void End() {
    std::lock_guard<std::mutex> g(mu_);
    busy_ = false;
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> l(mu_);
    while (!stop_) {
      cv_.wait_for(l, std::chrono::seconds(1));
      if (busy_ && std::chrono::steady_clock::now() - since_ > kVerifyBound) {
        std::fprintf(stderr, "%s: crash image %d (%s): not verified within %lld s (recovery or a read loops?); exiting\n",
                     name_.c_str(), image_, desc_.c_str(), static_cast<long long>(kVerifyBound.count()));
        std::fflush(stdout);
        std::fflush(stderr);
        std::_Exit(1);
      }
    }
  }
  const std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false, busy_ = false;
  int image_ = 0;
  std::string desc_;
  std::chrono::steady_clock::time_point since_;
  std::thread t_;  // last: started after the members it uses
};

}  // namespace

void LineRecorder::OnStore(const void* a, size_t n) {
  const char* c = static_cast<const char*>(a);
  if (c < base_ || c >= base_ + size_) return;
  uint64_t off = c - base_, end = off + n;
  while (off < end) {
    const uint64_t e = std::min(end, (off / 8 + 1) * 8);
    events.push_back({0, {off, std::string(base_ + off, e - off)}});
    off = e;
  }
}

void LineRecorder::OnFlush(const void* line) {
  const char* c = static_cast<const char*>(line);
  if (c >= base_ && c < base_ + size_) events.push_back({1, {uint64_t(c - base_), {}}});
}

LinePrefixRun ForEachLinePrefixImage(std::string durable, uint64_t file_size,
                                     const std::vector<LineRecorder::Event>& events, const std::string& image_path,
                                     const std::string& name, const std::function<std::string()>& verify,
                                     uint64_t max_per_point) {
  using Piece = LineRecorder::Piece;
  std::map<uint64_t, std::vector<Piece>> pending;  // line -> stores since its last flush+fence
  std::map<uint64_t, size_t> flushed;              // line -> pieces covered by a flush, not fenced
  LinePrefixRun run;
  Watchdog watchdog(name);
  std::mt19937_64 rng(42);
  // `cur` is the image last written: durable plus the pieces a crash state
  // keeps, taken back out after each image. pm::WriteImageFile rewrites
  // only the pages that differ from the file (writing the whole pool per
  // image was most of the tests' time).
  std::string cur = durable;
  cur.resize(std::max<uint64_t>(file_size, durable.size()), '\0');
  auto check = [&](const std::vector<uint64_t>& lines, const std::vector<size_t>& choice) {
    std::string desc;
    for (size_t i = 0; i < lines.size(); i++) {
      for (size_t j = 0; j < choice[i]; j++) {
        const Piece& p = pending[lines[i]][j];
        std::memcpy(&cur[p.off], p.bytes.data(), p.bytes.size());
      }
      desc += " line@" + std::to_string(lines[i]) + ":" + std::to_string(choice[i]) + "/" +
              std::to_string(pending[lines[i]].size());
    }
    const bool io = pm::WriteImageFile(image_path, cur.data(), file_size);
    for (size_t i = 0; i < lines.size(); i++) {
      for (size_t j = 0; j < choice[i]; j++) {
        const Piece& p = pending[lines[i]][j];
        std::memcpy(&cur[p.off], &durable[p.off], p.bytes.size());
      }
    }
    run.images++;
    std::string err = "cannot write the image";
    if (io) {
      watchdog.Begin(run.images, desc);
      err = verify();
      watchdog.End();
    }
    if (!err.empty() && ++run.bad <= 3) ADD_FAILURE() << name << ": crash image " << run.images << " (" << desc << "):" << err;
  };
  // Every combination of per-line prefixes of the pending stores (or a sample).
  auto crash_states = [&]() {
    std::vector<uint64_t> lines;
    uint64_t combos = 1;
    for (auto& [l, v] : pending) {
      if (v.empty()) continue;
      lines.push_back(l);
      combos = combos > (uint64_t(1) << 40) ? combos : combos * (v.size() + 1);
    }
    std::vector<size_t> choice(lines.size(), 0);
    if (max_per_point && combos > max_per_point) {
      for (uint64_t s = 0; s < max_per_point; s++) {
        for (size_t i = 0; i < lines.size(); i++) {
          const size_t n = pending[lines[i]].size();
          choice[i] = s == 0 ? 0 : s == 1 ? n : size_t(rng() % (n + 1));
        }
        check(lines, choice);
      }
      return;
    }
    for (;;) {
      check(lines, choice);
      size_t i = 0;
      for (; i < lines.size(); i++) {
        if (++choice[i] <= pending[lines[i]].size()) break;
        choice[i] = 0;
      }
      if (i == lines.size()) break;
    }
  };
  crash_states();
  for (const auto& ev : events) {
    if (ev.type == 0) {
      pending[ev.p.off / 64 * 64].push_back(ev.p);
    } else if (ev.type == 1) {
      flushed[ev.p.off] = pending[ev.p.off].size();
    } else {
      for (auto& [l, n] : flushed) {
        auto& v = pending[l];
        for (size_t j = 0; j < n; j++) {
          std::memcpy(&durable[v[j].off], v[j].bytes.data(), v[j].bytes.size());
          std::memcpy(&cur[v[j].off], v[j].bytes.data(), v[j].bytes.size());
        }
        v.erase(v.begin(), v.begin() + n);
      }
      flushed.clear();
    }
    crash_states();
  }
  return run;
}

}  // namespace fftest
