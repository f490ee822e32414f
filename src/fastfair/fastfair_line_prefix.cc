// The pm-model crash-state enumerator of the fastfair line-prefix crash
// tests (see fastfair_line_prefix.h).
// Thread-safety: a LineRecorder observes one test thread's stores (the
// test runs the operation under test single-threaded); an enumeration runs
// on the test thread.
#include "fastfair/fastfair_line_prefix.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <string>

#include "kit/test_watchdog.h"
#include "pm/image_file.h"

namespace fftest {

using namespace pmindex;

// Each crash image's verify() is bounded: on a broken build an image can
// make recovery or a read loop forever (with SplitAt's new node persisted
// only after the link, a read-only Scan of a rebalance's image spun in
// Descend). One watchdog per enumeration, re-armed per image; 60 s is
// thousands of times an image's check, also under ASan on a loaded machine.
constexpr int kVerifyBoundSeconds = 60;

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
  pmindex::test::TestWatchdog watchdog;
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
      watchdog.Arm(name + ": crash image " + std::to_string(run.images) + " (" + desc + "): verify()", kVerifyBoundSeconds);
      err = verify();
      watchdog.Disarm();
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
