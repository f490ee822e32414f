// pmcheck: power-failure simulation and durability checking (issue 5).
//
// The public face of the checker library used by the `pmcheck` binary and by
// tests/pmcheck. One Run() does, for one index type:
//   1. record: run a seeded workload with a pm::Observer installed over the
//      pool, logging every persistent store (with its bytes), flush, fence and
//      op boundary in program order; the durability lint runs on the fly;
//   2. replay: walk the log keeping a durable image and, per dirty cache
//      line, the stores not yet written back; at each chosen crash point build
//      crash images (durable + a prefix of each dirty line's pending stores);
//   3. verify: each image is written to a fresh pool file and opened in a
//      forked child (so a recovery crash is caught), then checked against the
//      op history (see verify.cc for the exact rules);
//   4. optionally (--kill N) SIGKILL a real process mutating the index N
//      times, reopening and verifying after each kill.
// The failure model, its optimistic corners and how to add an index are in
// docs/pmcheck.md.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "pmindex/options.h"
#include "pmindex/status.h"

namespace pmcheck {

// Failure kinds, as printed in the summary.
enum class FailKind : int {
  kLostAck = 0,     // an acknowledged op (or the index creation) is not reflected
  kPartialOp,       // the in-flight op is half applied, or a phantom record
  kTorn,            // a key or value that is neither old nor new (torn bytes)
  kInvariant,       // Check() failed, wrong op results, Size/Scan disagree, post-recovery ops fail
  kLeak,            // allocator blocks != blocks the index owns
  kRecoveryCrash,   // the recovering child died (signal), hung, or exited abnormally
  kUnloggedStore,   // a PM byte changed without a logged store primitive
  kMissingFlush,    // lint: a line written by an op is unflushed when it returns
  kMissingFence,    // lint: an op returned with flushes not yet ordered by a fence
  kErratum,         // lint: acted on another thread's unflushed line (NVC erratum)
  kLostRead,        // a value a completed Find/Scan returned is gone after a later crash
  kSetup,           // the workload itself could not run (index creation failed, ...)
  kCount
};
const char* FailKindName(FailKind k);

// Fence-window images per point (Config::window_images).
inline constexpr int kWindowDepth = 4;

struct Config {
  // Index type from the registry, or "pmcheck_toy" (the checker's private
  // test index, tools/pmcheck/toy_index.cc).
  std::string index = "pmcheck_toy";
  uint64_t ops = 200;            // ops per thread
  uint64_t keys = 0;             // distinct keys per thread (0: ops/2, at least 8)
  pmindex::KeyKind key_kind = pmindex::KeyKind::kU64;
  pmindex::ValueKind value_kind = pmindex::ValueKind::kU64;
  int threads = 1;
  uint64_t seed = 1;
  // Crash points: -1 all, 0 none (record + lint only), K > 0 a seeded sample.
  int64_t points = 1000;
  uint64_t image_budget = 0;     // > 0: sample points until this many images (overrides points)
  uint64_t stop_after = 0;       // > 0: stop replaying after this many failures
  int images_per_point = 4;      // 0 = "none", 1 = "all", >= 2 seeded random prefixes
  // One more image per point (number images_per_point): every flushed but
  // unfenced store dropped, every other pending store kept (where that
  // differs from images 0 and 1). --no-unfenced-image switches it off.
  bool unfenced_image = true;
  // Fence-window images (windows.cc): up to this many more images, taken
  // just before fences, every window shape (fence site and the flush sites
  // since the thread's previous fence) in turn, rarest first; at each such
  // point image images_per_point+k keeps the k most recently stored-to
  // dirty lines whole and drops every other pending store (k = 1 ..
  // kWindowDepth, fewer than the dirty lines). A later store persisting
  // without an earlier one of the same window is found in every window,
  // however rarely it runs. 0: off. --window-images N.
  uint64_t window_images = 0;
  // Shared keys: Finds and Scans of every thread pick keys of all threads
  // (writes stay with the key's owner thread, so per-key histories remain
  // totally ordered), with more reads in the mix.
  bool shared_keys = false;
  // Shared writes (with shared_keys, 2+ threads): every thread also writes
  // Workload::kSharedWriteKeys keys that no thread owns. A crash must
  // recover each of them to a version some linearization of the ops'
  // real-time order allows (shared_history.h). --shared-writes.
  bool shared_writes = false;
  // Drain: each thread's ops are a fill phase (first half: mostly inserts)
  // and a drain phase (second half: mostly removes), so that nodes thin
  // out and a recovery finds sparse ones (FPTree merges leaves at open).
  bool drain = false;
  // Key sweeps: each thread's ops are whole-range runs over its keys in key
  // order: insert ascending, remove descending, upsert descending, remove
  // ascending, again and again. Ascending and descending runs split at the
  // right and left edges and grow the root; each remove run empties the
  // whole range, so leaves are deleted, nodes merge and the root collapses.
  // --sweep (not with --shared-keys or --drain).
  bool sweep = false;
  // The read rule: a version a completed Find/Scan returned must survive
  // every later crash (that version or a later one). --no-read-rule.
  bool read_rule = true;
  // Crashes during recovery: for this many crash images, the recovery
  // itself is recorded and crashed (first-level images at every point of
  // it), and the second recovery verified against the same expectations.
  uint64_t recovery_crashes = 0;
  uint64_t recovery_image_budget = 100;  // images per crashed recovery (0: every point)
  bool lint = false;             // lint findings count as failures
  // > 0: the recording ignores every fence issued from the K-th fence site
  // (call sites numbered in the order their first fence was recorded), as
  // if that pm::Fence were deleted from the source: the lint and the crash
  // images see the flushes it ordered as unfenced. --drop-fence K.
  uint64_t drop_fence = 0;
  // Non-empty: the recording ignores every flush and fence issued from the
  // call site of this name ("object+0xoffset", as --site-counts writes it),
  // as if that pm::Flush / pm::Fence were deleted. --drop-site NAME.
  std::string drop_site;
  // Scheduled interleavings (multi-threaded runs): pct >= 0 records under
  // the PCT scheduler (scheduler.h) with that many priority change points;
  // schedule_seed names the schedule (0: taken from seed), and schedules > 1
  // records and replays that many schedules (seeds schedule_seed,
  // schedule_seed+1, ...) of the same workload, the image budget shared
  // between them. --pct D, --schedule-seed S, --schedules N.
  int pct = -1;
  uint64_t schedule_seed = 0;
  uint64_t schedules = 1;
  // Under --pct: a wait in a kit::Backoff loop (pm::Observer::OnSpin) hands
  // the token to another thread at once; off, such a wait ends only by a
  // stall (kStallMs of no progress). --no-spin-hook turns it off.
  bool spin_hook = true;
  // Under --pct: a recording in which no thread reaches a scheduling point
  // for this many seconds (a thread spinning without a pm:: primitive or a
  // hook, or every thread blocked outside the scheduler) is aborted with a
  // message naming the schedule seed, exit code 3. 0: no limit.
  // --pct-timeout SECONDS.
  double pct_timeout = 120;
  // Persist-site coverage: append "flush|fence SITE COUNT" lines (SITE is
  // object+0xoffset of the call's return address) for the recorded run to
  // this file. --site-counts FILE (scripts/pmcheck-coverage.sh).
  std::string site_counts;
  int kills = 0;                 // --kill N: process-crash rounds
  int ops_per_kill_round = 60;
  std::vector<std::string> faults;
  double timeout_s = 20;         // per recovery child
  uint64_t pool_size = 8ull << 20;
  std::map<std::string, std::string> params;  // index parameters
  int64_t only_point = -1;       // reproduce one crash point ...
  int only_image = -1;           // ... and one image of it
  bool verbose = false;
  int64_t trace_line = -1;       // print a backtrace of every store/flush to this pool offset's line
  bool progress = false;         // progress lines on stderr
  std::string dir = "/dev/shm";  // where pool files go
  size_t max_reported = 12;      // failures kept per kind
};

struct Failure {
  FailKind kind;
  std::string what;
  int64_t point = -1;  // crash point (event number), -1 if not tied to one
  int image = -1;
  int kill_round = -1;
  uint64_t schedule_seed = 0;  // the PCT schedule of the recording (0: none)
};

struct Report {
  uint64_t events = 0;            // logged events
  uint64_t crash_points = 0;      // stores + flushes + fences in the log
  uint64_t points_tried = 0;
  uint64_t images = 0;            // crash images built and checked
  uint64_t images_recovered = 0;  // images that opened and passed every check
  uint64_t unfenced_images = 0;   // of images: the "flushed but unfenced dropped" image
  uint64_t window_images = 0;     // of images: fence-window images (--window-images)
  uint64_t window_points = 0;     // ... at this many points just before a fence
  uint64_t window_shapes = 0;     // distinct window shapes in the recording(s)
  uint64_t reads_observed = 0;    // versions completed reads returned (the read rule's input)
  uint64_t reads_inflight = 0;    // ... of a key whose writing op had not yet returned
  uint64_t shared_writes = 0;     // --shared-writes: writes of shared-write keys that took effect
  uint64_t shared_overlaps = 0;   // ... of them overlapping another thread's write of the key
  uint64_t recovery_images = 0;   // crash images of a recovery (double crashes) checked
  uint64_t recoveries_recorded = 0;  // recoveries recorded for --recovery-crashes
  uint64_t creation_interrupted = 0;  // images before creation returned that did not open (allowed)
  uint64_t kills = 0;
  uint64_t kills_in_open = 0;      // killed before the open/recovery returned
  uint64_t kills_mid_workload = 0; // killed after the open, before the last op returned
  uint64_t ops_recorded = 0;
  std::array<uint64_t, size_t(FailKind::kCount)> counts{};
  std::vector<Failure> failures;  // up to Config::max_reported per kind
  // Performance lint, by op type.
  std::map<std::string, uint64_t> redundant_flushes, empty_fences, flushes, fences, missing_flushes;
  uint64_t erratum_reads = 0, acting_loads = 0, unflushed_loads = 0;
  uint64_t caught_up_stores = 0;  // stores a flush logged before their writer did (free-running threads)
  uint64_t fence_sites = 0;      // distinct call sites of recorded fences
  uint64_t fences_dropped = 0;   // --drop-fence: fences of that site ignored
  std::string dropped_site;      // --drop-fence: "object+0xoffset" of the site
  uint64_t named_drops = 0;      // --drop-site: flushes and fences ignored
  // PCT scheduling (summed over schedules): schedules recorded, token
  // switches, stalls (a thread blocked outside the primitives), spins, and
  // the last schedule's hash (equal hashes: the same interleaving).
  uint64_t schedules_run = 0, schedule_switches = 0, schedule_stalls = 0, schedule_spins = 0, schedule_steps = 0;
  uint64_t schedule_changes = 0;  // change points reached (at most D per schedule)
  uint64_t schedule_hash = 0;
  double record_seconds = 0, replay_seconds = 0, kill_seconds = 0;

  uint64_t total_failures() const;
  void Add(const Config& c, Failure f);
};

// Runs the configured check. A non-OK status means the check could not run
// at all (bad arguments, unknown index); failures found go to *report.
pmindex::Status Run(const Config& config, Report* report);

// Human-readable summary, including one reproducer line per failure.
std::string FormatReport(const Config& config, const Report& report);
// A command line reproducing one failure.
std::string Reproducer(const Config& config, const Failure& f);

}  // namespace pmcheck
