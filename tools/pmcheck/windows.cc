// pmcheck's fence windows (--window-images; docs/pmcheck.md, "Fence-window
// images"): which crash points the window images are taken at.
//
// A fence window is what one thread did since its previous fence: the
// flushes and stores that this fence makes durable. A missing fence (or
// flush) shows up as a window that holds the flushes of two windows (or one
// flush fewer), and the bug it makes is the window's later store persisting
// without an earlier one. Such a window may run a few times per recording
// (a root growth, a merge), so uniformly sampled crash points rarely fall
// in it. Here every fence of the recording is classified by its window's
// shape: the fence's call site and the set of flush call sites in its
// window (the addresses the recorder logs in Event::aux). FenceWindows
// returns one group of crash points per shape (the event just before each
// fence of that shape: the window is complete, nothing of it is durable
// yet), the rarest shapes first and each group in a seeded random order;
// the simulator takes the groups round-robin within the image budget, so
// every shape is tried once before any is tried twice.
//
// Invariants: the groups partition the fences that have an event before
// them; the order depends on the recording and the seed only (never on the
// addresses' values, which move with ASLR).
// This file writes no PM. Thread-safety: a pure function of its arguments.
#include <algorithm>
#include <map>
#include <random>
#include <unordered_map>

#include "checker_internal.h"

namespace pmcheck {

std::vector<std::vector<int64_t>> FenceWindows(const Recorder& rec, uint64_t seed) {
  struct Group {
    std::vector<int64_t> points;
    int64_t first = 0;
  };
  // A window's shape: its fence site and its sorted, distinct flush sites.
  std::map<std::vector<uint64_t>, Group> groups;
  std::unordered_map<int16_t, std::vector<uint64_t>> open;  // thread -> flush sites since its last fence
  for (size_t i = 0; i < rec.events.size(); ++i) {
    const Event& e = rec.events[i];
    if (e.kind == Ev::kFlush) {
      open[e.tid].push_back(e.aux);
    } else if (e.kind == Ev::kFence) {
      std::vector<uint64_t>& w = open[e.tid];
      std::sort(w.begin(), w.end());
      w.erase(std::unique(w.begin(), w.end()), w.end());
      w.insert(w.begin(), e.aux);
      if (i > 0) {
        Group& g = groups[w];
        if (g.points.empty()) g.first = int64_t(i);
        g.points.push_back(int64_t(i) - 1);
      }
      w.clear();
    }
  }
  std::vector<Group> sorted;
  sorted.reserve(groups.size());
  for (auto& [shape, g] : groups) sorted.push_back(std::move(g));
  std::sort(sorted.begin(), sorted.end(), [](const Group& a, const Group& b) {
    return a.points.size() != b.points.size() ? a.points.size() < b.points.size() : a.first < b.first;
  });
  std::mt19937_64 rng(seed * 0x2545F4914F6CDD1Dull + 11);
  std::vector<std::vector<int64_t>> out;
  out.reserve(sorted.size());
  for (Group& g : sorted) {
    std::shuffle(g.points.begin(), g.points.end(), rng);
    out.push_back(std::move(g.points));
  }
  return out;
}

}  // namespace pmcheck
