// phase_run.h: one target's run of one phase (the load, or a run phase),
// in one chunk per round: its worker threads, the statistics thread's
// throughput windows and progress line, latency sampling and PM counters
// (PiBench methodology, pibench-evaluation-vldb20.md sections 4 and 5.3;
// the rounds are described in bench.h).
//
// Invariants: every target of one invocation sees the same operations (the
// streams depend only on seed, thread count and phase number, never on
// results); workers never share ids (see workload.h), so inserts and removes
// always succeed on a correct index.
//
// Thread-safety: a PhaseRun is driven by one thread (the statistics thread),
// which starts and joins the workers of each chunk.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bench.h"
#include "targets.h"
#include "workload.h"

namespace pmbench::detail {

using Clock = std::chrono::steady_clock;

inline double Since(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

struct WorkerOut {
  uint64_t completed[kNumOpTypes] = {};
  uint64_t succeeded[kNumOpTypes] = {};
  uint64_t scanned = 0;
  std::vector<uint32_t> lat[kNumOpTypes];
  pmindex::pm::Counters pm;
};

struct PhaseContext {
  const BenchOptions* o;
  const KeyCodec* codec;
  Target* target;
  std::vector<ThreadKeys>* keys;
  int threads;
};

// One target's run of one phase, in one chunk per round (one chunk with
// --rounds 1). Everything that must continue from one chunk to the next lives
// here: each thread's operation stream (its generator; the live-key state is
// the target's ThreadKeys), its latency-sampling generator, its position in
// its quota (which also numbers the values written), the throughput window
// left open at the end of a chunk, and the figures so far. The clock of a
// phase is phase time, the sum of its chunks' times: windows are cut every
// sampling_ms of phase time and may span a chunk boundary.
class PhaseRun {
 public:
  // spec == nullptr: the load phase (each thread inserts the loaded ids it owns).
  PhaseRun(const PhaseContext& c, const PhaseSpec* spec, int phase_no);
  PhaseRun(const PhaseRun&) = delete;
  PhaseRun& operator=(const PhaseRun&) = delete;
  // Runs this target's share of round `round` (of `rounds`), where it is at
  // `position` in the round's order.
  // `after`: the target whose chunk ran just before (null: none in this step).
  void RunChunk(int round, int rounds, int position, const std::string* after, const std::string& label);
  // Whether this target has operations to run in round `round`.
  bool HasWork(int round, int rounds) const;
  // The phase's figures, once every round has run.
  PhaseResult Finish();

 private:
  struct ThreadState {
    ThreadState(uint64_t lat_seed, uint64_t q) : lat_rng(lat_seed), quota(q) {}
    std::unique_ptr<OpStream> stream;  // null in the load phase
    Rng lat_rng;
    uint64_t quota;     // operations over the whole phase (UINT64_MAX: time mode)
    uint64_t next = 0;  // operations done so far: the next one's number
    bool exhausted = false;
    WorkerOut out;  // summed over chunks
  };

  PhaseContext c_;
  int phase_no_;
  bool load_, time_mode_;
  uint64_t total_quota_ = 0;
  std::vector<RankGenerator> ranks_;  // prepared once, at the phase's start
  std::vector<ThreadState> th_;
  PhaseResult res_;
  Clock::duration elapsed_{0};    // phase time of the chunks run so far
  Clock::duration open_len_{0};   // phase time in the window still open
  uint64_t open_ops_ = 0;         // operations in the window still open
  uint64_t done_ = 0;             // operations of the chunks run so far
  Clock::duration progress_at_ = std::chrono::seconds(1);  // next progress line, phase time
};

}  // namespace pmbench::detail
