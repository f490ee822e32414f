// The recording half of pmcheck: a pm::Observer that logs every persistent
// store (with the bytes written), non-temporal store, flushed line, fence and
// op boundary in one global order, keeps a shadow of the pool built only from
// logged stores, and runs the durability and performance lint on the fly.
//
// Lint rules (per thread; a thread's current op type labels the counts):
//  * missing flush: when an op returns, a line whose last logged store was made
//    by this thread and which has not been flushed since;
//  * missing fence: an op returns with flushes or NT stores not yet followed
//    by a fence of this thread;
//  * erratum read: a pm::LoadAcquire of a line that another thread stored to
//    and nobody has flushed since (content differing from the written-back
//    line), followed (before the op returns) by a flush
//    or fence of the loading thread while that line is still unflushed: the
//    loader made something durable that depends on non-durable data;
//  * redundant flush: a line flushed with no store since its last flush;
//  * empty fence: a fence with no flush or NT store of this thread before it
//    (since its previous fence).
// Volatile stores (pm::StoreVolatile & co.: lock words recovery resets) are
// logged and replayed like any store but do not make a line dirty for the lint.
// Fence sites: each fence is attributed to its call site (the return
// address of OnFence, inside the function that inlined pm::Fence); with
// DropFenceSite(k) the k-th site's fences are not recorded at all, which is
// what deleting that pm::Fence from the source would record.
// Unlogged stores: at every flush (single-threaded runs, and multi-threaded
// runs under a PCT schedule, where no thread runs between another's store
// and its log entry) the flushed line is compared with the shadow, and at
// the end the whole pool is; any difference is a store that bypassed the
// pm:: primitives and is reported with its offset.
// Free-running multi-threaded runs (no PCT schedule) cannot tell a bypassing
// store from one whose log entry is still on its way, so a flush there logs
// the line's unlogged bytes as a store first (CatchUpLocked): a flush writes
// back what the line holds. Caught-up bytes that no store ever logs are
// reported as unlogged stores by FinalCheck.
// Site counts: how often each flush and fence call site ran; DropSiteNamed
// removes one call site's flushes and fences from the recording.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "pmcheck.h"
#include "scheduler.h"
#include "pmindex/pm/persist.h"
#include "pmindex/status.h"
#include "workload.h"

namespace pmcheck {

enum class Ev : uint8_t { kStore, kNT, kLine, kFlush, kFence, kOpBegin, kOpEnd, kGrow };

struct Event {
  Ev kind;
  int16_t tid;
  uint32_t size;  // bytes (stores)
  uint64_t off;   // pool offset (stores), line offset (flush), new size (grow)
  uint64_t aux;   // arena offset of the bytes (stores), op record (op begin/end),
                  // call site (flush, fence: the return address, as --site-counts names it)
};

struct OpRecord {
  Op op;
  int64_t begin = -1;  // event index of the op-begin marker
  int64_t end = -1;    // event index of the op-end marker (-1: never returned)
  pmindex::Status::Code result = pmindex::Status::Code::kOk;
  std::vector<std::pair<uint32_t, uint32_t>> reads;  // Find/Scan: (key id, version) returned
};

class Recorder final : public pmindex::pm::Observer {
 public:
  // size_fn returns the pool's current size (it may grow in place).
  Recorder(char* base, uint64_t max_size, std::function<uint64_t()> size_fn, bool check_each_flush);

  // Prints a backtrace (stderr) of every store to and flush of the line
  // holding pool offset `off` (debugging a lint finding).
  void TraceLine(int64_t off) { trace_line_ = off < 0 ? -1 : (off & ~int64_t(63)); }

  // Multi-threaded recording: after a store or flush, sometimes yield the CPU
  // (outside the recorder's lock) so other threads run inside this one's
  // persist windows (the erratum lint needs such interleavings).
  void PerturbSchedule(uint64_t seed) { perturb_seed_ = seed | 1; }

  // Multi-threaded recording under a PCT schedule (scheduler.h): every
  // store, flush, fence, acting load and op boundary of a workload thread is
  // a scheduling point (after it is logged); PerturbSchedule is then unused.
  void SetScheduler(PctScheduler* s) { sched_ = s; }
  // Whether a spin hook call (pm::Observer::OnSpin, from kit::Backoff) is a
  // scheduling point that lets the other threads run first (default); off,
  // a thread waiting in a backoff loop for a thread without the token is
  // resolved by a stall only.
  void SetSpinHook(bool on) { spin_hook_ = on; }

  // Ignore every fence issued from the k-th fence call site (1-based, in
  // first-recorded order): the fence is neither logged nor seen by the lint.
  void DropFenceSite(uint64_t k) { drop_site_ = k; }
  // Ignore every flush or fence whose call site is `name` ("object+0xoffset"
  // as --site-counts prints it): what deleting that pm::Flush or pm::Fence
  // call from the source would record, without a rebuild (mutation testing).
  void DropSiteNamed(std::string name) { drop_name_ = std::move(name); }
  uint64_t named_drops = 0;  // flushes and fences ignored by DropSiteNamed
  uint64_t fence_sites() const { return fence_sites_.size(); }
  uint64_t fences_dropped = 0;
  // Persist-site coverage: how often each flush and fence call site ran
  // (by return address), and "object+0xoffset" for one (symbolise it with
  // addr2line -f -C -e OBJECT OFFSET; scripts/pmcheck-coverage.sh does).
  std::map<uintptr_t, uint64_t> flush_site_counts, fence_site_counts;
  // The fence sites in first-recorded order (site k is --drop-fence k).
  const std::vector<uintptr_t>& fence_site_order() const { return fence_sites_; }
  static std::string SiteName(uintptr_t site);
  std::string dropped_site;  // "object+0xoffset" of the dropped site

  // The thread id the calling thread's events are attributed to.
  static void SetThreadId(int tid);

  void OnStore(const void* addr, size_t size) override { Store(addr, size, false); }
  void OnVolatileStore(const void* addr, size_t size) override { Store(addr, size, true); }
  void OnNonTemporalStore(const void* addr, size_t size) override;
  __attribute__((noinline)) void OnFlush(const void* line) override;
  void OnFence() override;
  void OnLoad(const void* addr, size_t size) override;
  void OnSpin() override;

  size_t BeginOp(const Op& op);
  // reads: the (key id, version) pairs a Find or Scan returned.
  void EndOp(size_t rec, pmindex::Status::Code result, std::vector<std::pair<uint32_t, uint32_t>> reads = {});
  // Compares the whole pool with the shadow (call when no thread runs).
  void FinalCheck();

  // The log.
  std::vector<Event> events;
  std::vector<char> arena;
  std::vector<char> initial;  // the durable pool when recording started
  std::vector<OpRecord> ops;
  // Findings.
  std::vector<Failure> findings;
  std::map<std::string, uint64_t> redundant_flushes, empty_fences, flushes, fences, missing_flushes;
  uint64_t erratum_reads = 0;
  uint64_t acting_loads = 0;     // pm::LoadAcquire calls seen
  uint64_t unflushed_loads = 0;  // ... of a line another thread left unflushed
  uint64_t foreign_events = 0;  // primitives on memory outside the pool
  // Stores logged at a flush before their writer's OnStore (free-running
  // multi-threaded runs only; see CatchUpLocked).
  uint64_t caught_up_stores = 0;

 private:
  struct LineState {
    bool dirty = false;
    int writer = -1;
    uint64_t loaders = 0;  // threads (bit tid % 64) that ever pm::LoadAcquire'd the line
  };
  struct ThreadState {
    int64_t op = -1;  // current op record
    std::unordered_set<uint64_t> written;
    bool unfenced = false;  // flush or NT store since the last fence
    std::vector<uint64_t> tainted;
  };
  void Store(const void* addr, size_t size, bool is_volatile);
  void StoreLocked(const void* addr, size_t size, bool is_volatile);
  void FlushLocked(const void* line, uintptr_t site);
  void CatchUpLocked(uint64_t line, int tid);
  void Confirm(uint64_t off, size_t size);  // a logged store covers caught-up bytes
  std::unordered_map<uint64_t, uint64_t> caught_up_;  // line -> caught-up bytes not yet logged (bit per byte)
  int Tid();
  bool InRange(const void* addr, size_t size, uint64_t* off);
  void Log(Ev kind, int tid, uint64_t off, uint32_t size, uint64_t aux);
  void CopyIn(uint64_t off, size_t size);
  void CheckLine(uint64_t line, const char* when);
  std::string OpLabel(const ThreadState& ts) const;
  void Finding(FailKind k, std::string what);

  char* base_;
  uint64_t max_size_, cur_size_;
  std::function<uint64_t()> size_fn_;
  bool check_each_flush_;
  std::mutex mu_;
  std::vector<char> shadow_;
  std::vector<char> durable_;  // lint view: line content at its last flush (NT stores: at once)
  bool Differs(uint64_t line) const;
  std::unordered_map<uint64_t, LineState> lines_;
  std::unordered_map<int, ThreadState> threads_;
  std::unordered_map<std::string, uint64_t> finding_counts_;
  int next_foreign_tid_ = 1000;
  int64_t trace_line_ = -1;
  uint64_t perturb_seed_ = 0;
  uint64_t drop_site_ = 0;
  std::string drop_name_;
  std::unordered_map<uintptr_t, bool> drop_named_;  // site -> is the named one (cache)
  bool DroppedByName(uintptr_t site);  // mu_ held
  std::vector<uintptr_t> fence_sites_;  // call sites of fences, first-recorded order
  void MaybeYield(bool shared_line);
  PctScheduler* sched_ = nullptr;
  bool spin_hook_ = true;
  void SchedulePoint(bool load);
  void FenceLocked(uintptr_t site);
  void NonTemporalLocked(const void* addr, size_t size);
  void LoadLocked(const void* addr, size_t size);
  size_t BeginOpLocked(const Op& op);
  void EndOpLocked(size_t rec, pmindex::Status::Code result, std::vector<std::pair<uint32_t, uint32_t>> reads);
  void Trace(const char* what, uint64_t off, size_t size);
};

}  // namespace pmcheck
