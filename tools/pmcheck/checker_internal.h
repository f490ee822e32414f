// Internals shared by the driver (checker.cc), the simulator (simulator.cc),
// the child-side verification (verify.cc) and the kill mode (kill.cc): what a
// recovered index must look like, running a check in a forked child so that
// a crash or hang of recovery is caught and classified, and the simulator's
// two stages.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "pmcheck.h"
#include "recorder.h"
#include "shared_history.h"
#include "target.h"
#include "workload.h"

namespace pmcheck {

// The states a recovered index may be in. Per key: the version of the last
// completed op (committed), or, for a key with an op in flight, also the
// version that op writes (after). acked is the highest version any completed
// op wrote, to tell a lost acknowledged op from a phantom.
struct Expectation {
  const std::vector<uint32_t>* committed = nullptr;
  const std::vector<uint32_t>* acked = nullptr;
  std::vector<std::pair<uint32_t, uint32_t>> inflight;  // (key id, version after)
  // Keys whose in-flight version a completed read already returned (the
  // read rule): only that version is allowed.
  std::vector<uint32_t> read_inflight;
  // --shared-writes: per key every thread writes, the versions allowed
  // (shared_history.h); those keys are in neither committed nor inflight.
  std::vector<SharedAllowed> shared;
  bool created = false;      // index creation returned OK before the crash
  bool report_inflight = false;  // kill mode: report the in-flight keys' versions ("V kid version")
};

// Result lines for the parent (verify.cc): Emit writes one line (newlines in
// it become spaces), EmitFail an "F <kind> <message>" line.
void Emit(int fd, const std::string& line);
void EmitFail(int fd, FailKind k, const std::string& msg);
// A key as reports print it: the number for u64 keys, else 'bytes'.
std::string KeyName(const Workload& wl, uint32_t kid);

// Child side: open the image at path, verify, write result lines to fd:
// "F <kind> <message>" per failure, "I <note>", "V <kid> <version>", "DONE".
void VerifyRecovered(Target* target, const std::string& path, const Workload& wl, const Expectation& e, int fd);

struct ChildResult {
  std::vector<Failure> failures;
  std::vector<std::string> info;                     // "I" lines
  std::vector<std::pair<uint32_t, uint32_t>> versions;  // "V" lines
  bool done = false;
};
// Forks; the child runs body(fd) then _exits. A child that dies, hangs past
// config.timeout_s, or exits without "DONE" yields a kRecoveryCrash failure.
ChildResult RunInChild(const Config& config, const std::function<void(int fd)>& body);

// The simulator (record.cc, simulator.cc). Record runs the workload on a fresh index
// under the recorder and adds the workload's and the lint's findings to
// report; Replay turns the recorded log into crash images and verifies each.
struct Recording {
  std::unique_ptr<Recorder> rec;
  uint64_t schedule_seed = 0;  // the PCT schedule recorded (0: none)
};
// The schedule seed a config records with (0: not scheduled).
uint64_t ScheduleSeed(const Config& config);
pmindex::Status Record(const Config& config, Target* target, const Workload& wl, Report* report, Recording* out);
void Replay(const Config& config, Target* target, const Workload& wl, const Recorder& rec, Report* report);

// Fence windows (windows.cc, --window-images): the crash points just
// before the recording's fences, one group per window shape (fence site and
// flush sites since the thread's previous fence), rarest shapes first, each
// group in a seeded random order.
std::vector<std::vector<int64_t>> FenceWindows(const Recorder& rec, uint64_t seed);

pmindex::Status RunKill(const Config& config, Target* target, Report* report);

std::string PoolPath(const Config& config, const char* what);

}  // namespace pmcheck
