// pmindex/pm/persist.h: the persistent-memory programming model.
//
// Every store an index makes to PM goes through the primitives below, and so
// does every flush and fence. In normal runs they compile to plain stores,
// clwb/clflushopt/clflush and sfence; when an Observer is installed (the
// power-failure simulator of tools/pmcheck, or the durability lint) each
// store, flush, fence and dependent load is reported to it in program order,
// so the simulator can build crash images that keep any prefix of the stores
// to a dirty cache line.
//
// Model (see docs/persistence.md):
//  * A store is durable once its cache line was flushed and a fence followed.
//  * Only aligned 8-byte stores are failure-atomic.
//  * Stores to one cache line reach PM in program order; at a crash a line
//    holds some prefix of the stores made to it since its last flush.
//  * Non-temporal copies (CopyNT) and AtomicLineWrite bypass the cache: they
//    are durable after the next Fence.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

// The primitives below are forced inline: their memory-order arguments must
// be compile-time constants at the call site. An out-of-line copy (GCC does
// not inline every call in large functions) receives the order at run time,
// and GCC then compiles __atomic_store as seq_cst (an xchg, a full barrier
// that also waits for earlier clwb): session 7 found fptree's insert paying
// for that. always_inline also keeps Fence and Flush off the PLT.
#define PMINDEX_PM_INLINE inline __attribute__((always_inline))

namespace pmindex::pm {

inline constexpr size_t kCacheLine = 64;

inline uintptr_t LineOf(const void* p) { return reinterpret_cast<uintptr_t>(p) & ~uintptr_t(kCacheLine - 1); }

// ---------------------------------------------------------------------------
// Persist modes (process-wide, selectable at run time).
enum class PersistMode : uint8_t {
  kFlush = 0,  // flush with the best instruction available, fence with sfence
  kNone = 1,   // no flushes (eADR / persistent CPU caches); fences still order
};
const char* PersistModeName(PersistMode m);
bool ParsePersistMode(const std::string& s, PersistMode* m);  // "flush" | "none"

// extra_write_latency_ns is spun after every flushed line (emulated PM; 0 = off).
void SetPersistMode(PersistMode mode, uint32_t extra_write_latency_ns = 0);
PersistMode GetPersistMode();
uint32_t GetExtraWriteLatencyNs();

// The flush instruction chosen from CPUID at start-up.
enum class FlushInstr : uint8_t { kClwb, kClflushopt, kClflush };
FlushInstr GetFlushInstr();
const char* FlushInstrName(FlushInstr f);
// Forces a particular instruction (tests and benchmarks); false if the CPU lacks it.
bool SetFlushInstr(FlushInstr f);
// CPU features relevant to PM code.
bool CpuHasMovdir64b();
bool CpuHasRtm();

// ---------------------------------------------------------------------------
// Per-thread cost counters. Read them before and after an operation to get
// its PM cost. Lines are counted whatever the persist mode (they describe the
// algorithm; mode kNone merely skips the instruction).
struct Counters {
  uint64_t stores = 0;         // persistent store primitives executed
  uint64_t store_bytes = 0;
  uint64_t lines_flushed = 0;  // flush instructions (one per cache line)
  uint64_t fences = 0;
  uint64_t nt_bytes = 0;       // bytes written with non-temporal copies
  uint64_t line_writes = 0;    // failure-atomic 64-byte line writes
  uint64_t allocs = 0;         // PM allocations
  uint64_t frees = 0;          // PM frees

  Counters& operator+=(const Counters& o);
  Counters operator-(const Counters& o) const;
};
namespace detail {
// initial-exec: every primitive bumps these counters, and the default
// (general-dynamic) model costs a __tls_get_addr call per access from a
// shared library. The 64 bytes come from glibc's static TLS reserve, which
// also covers libpmindex loaded by dlopen (the PiBench plugins; tested).
extern constinit thread_local Counters tl_counters __attribute__((tls_model("initial-exec")));
}
inline Counters& ThreadCounters() { return detail::tl_counters; }
inline void ResetThreadCounters() { detail::tl_counters = Counters{}; }

// ---------------------------------------------------------------------------
// Observer: installed by the crash simulator / lint. All calls happen after
// the memory effect (so OnStore can read the new bytes at addr). Calls may
// come from several threads; the observer synchronises itself.
class Observer {
 public:
  virtual ~Observer() = default;
  virtual void OnStore(const void* addr, size_t size) = 0;
  // A store that bypasses the cache (CopyNT, AtomicLineWrite): it becomes
  // durable at the next fence. An AtomicLineWrite (size 64, aligned) is
  // failure-atomic as a whole; a CopyNT is atomic per aligned 8 bytes.
  virtual void OnNonTemporalStore(const void* addr, size_t size) = 0;
  virtual void OnFlush(const void* line) = 0;
  virtual void OnFence() = 0;
  // A load whose value the caller will act on (e.g. a next pointer it is
  // about to link behind). Used by the lint for the NVC-Hashmap erratum.
  virtual void OnLoad(const void* addr, size_t size) = 0;
  // A store made with StoreVolatile/CasVolatile/FetchAddVolatile: a PM word
  // that is never flushed on purpose because recovery re-initialises it.
  // pmcheck logs it like any store (it may reach PM at a crash) but its lint
  // does not report it as a missing flush. Default: an ordinary store.
  virtual void OnVolatileStore(const void* addr, size_t size) { OnStore(addr, size); }
  // The calling thread waits for another in a retry loop (kit::Backoff):
  // a scheduling observer (pmcheck's PCT scheduler) lets the other threads
  // run first. Default: nothing.
  virtual void OnSpin() {}
};
namespace detail {
extern std::atomic<Observer*> g_observer;
extern PersistMode g_mode;
extern uint32_t g_extra_latency_ns;
extern FlushInstr g_flush_instr;
void SpinNs(uint32_t ns);
}  // namespace detail
void SetObserver(Observer* obs);  // nullptr to remove
inline Observer* GetObserver() { return detail::g_observer.load(std::memory_order_acquire); }

#define PMINDEX_OBSERVE(call)                                                           \
  do {                                                                                  \
    if (__builtin_expect(::pmindex::pm::detail::g_observer.load(std::memory_order_relaxed) != nullptr, 0)) { \
      if (auto* _o = ::pmindex::pm::GetObserver()) _o->call;                            \
    }                                                                                   \
  } while (0)

// ---------------------------------------------------------------------------
// Stores. Use these for every write to PM.

namespace detail {
// The bookkeeping every store primitive ends with: count the store and tell
// the observer (the crash simulator or lint), if one is installed.
PMINDEX_PM_INLINE void NoteStore(const void* dst, size_t n) {
  tl_counters.stores++;
  tl_counters.store_bytes += n;
  PMINDEX_OBSERVE(OnStore(dst, n));
}
// The same for stores recovery re-initialises (StoreVolatile and friends).
PMINDEX_PM_INLINE void NoteVolatileStore(const void* dst, size_t n) {
  tl_counters.stores++;
  tl_counters.store_bytes += n;
  PMINDEX_OBSERVE(OnVolatileStore(dst, n));
}
}  // namespace detail


// A plain (non-atomic) store of a trivially copyable value.
template <typename T>
PMINDEX_PM_INLINE void Store(T* dst, const T& v) {
  static_assert(std::is_trivially_copyable_v<T>);
  *dst = v;
  detail::NoteStore(dst, sizeof(T));
}

// An atomic store (for words read concurrently without locks). T must be a
// 1/2/4/8-byte integer or pointer-sized type; 8-byte aligned 8-byte stores are
// failure-atomic.
template <typename T>
PMINDEX_PM_INLINE void StoreAtomic(T* dst, T v, int order = __ATOMIC_RELEASE) {
  static_assert(std::is_trivially_copyable_v<T> && (sizeof(T) == 1 || sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8));
  __atomic_store(dst, &v, order);
  detail::NoteStore(dst, sizeof(T));
}

// Compare-and-swap on a PM word. On failure *expected gets the current value.
template <typename T>
PMINDEX_PM_INLINE bool Cas(T* dst, T* expected, T desired, int success = __ATOMIC_ACQ_REL, int failure = __ATOMIC_ACQUIRE) {
  static_assert(sizeof(T) == 8 || sizeof(T) == 4 || sizeof(T) == 1 || sizeof(T) == 2);
  bool ok = __atomic_compare_exchange(dst, expected, &desired, false, success, failure);
  if (ok) {
    detail::NoteStore(dst, sizeof(T));
  }
  return ok;
}

// Atomic read-modify-write of a PM word; return the previous value.
template <typename T>
PMINDEX_PM_INLINE T FetchOr(T* dst, T bits, int order = __ATOMIC_ACQ_REL) {
  T old = __atomic_fetch_or(dst, bits, order);
  detail::NoteStore(dst, sizeof(T));
  return old;
}
template <typename T>
PMINDEX_PM_INLINE T FetchAnd(T* dst, T bits, int order = __ATOMIC_ACQ_REL) {
  T old = __atomic_fetch_and(dst, bits, order);
  detail::NoteStore(dst, sizeof(T));
  return old;
}
template <typename T>
PMINDEX_PM_INLINE T FetchAdd(T* dst, T v, int order = __ATOMIC_ACQ_REL) {
  T old = __atomic_fetch_add(dst, v, order);
  detail::NoteStore(dst, sizeof(T));
  return old;
}

// Stores to PM words that are deliberately never flushed because recovery
// re-initialises them (a lock or seqlock version kept inside a PM node).
// They may still reach PM in any state at a crash: recovery must cope. The
// durability lint does not count them as missing flushes.
template <typename T>
PMINDEX_PM_INLINE void StoreVolatile(T* dst, T v, int order = __ATOMIC_RELEASE) {
  static_assert(sizeof(T) == 1 || sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8);
  __atomic_store(dst, &v, order);
  detail::NoteVolatileStore(dst, sizeof(T));
}
template <typename T>
PMINDEX_PM_INLINE bool CasVolatile(T* dst, T* expected, T desired, int success = __ATOMIC_ACQ_REL, int failure = __ATOMIC_ACQUIRE) {
  static_assert(sizeof(T) == 8 || sizeof(T) == 4 || sizeof(T) == 1 || sizeof(T) == 2);
  bool ok = __atomic_compare_exchange(dst, expected, &desired, false, success, failure);
  if (ok) {
    detail::NoteVolatileStore(dst, sizeof(T));
  }
  return ok;
}
template <typename T>
PMINDEX_PM_INLINE T FetchAddVolatile(T* dst, T v, int order = __ATOMIC_ACQ_REL) {
  T old = __atomic_fetch_add(dst, v, order);
  detail::NoteVolatileStore(dst, sizeof(T));
  return old;
}

// A load the caller will act on durably (see Observer::OnLoad).
template <typename T>
PMINDEX_PM_INLINE T LoadAcquire(const T* src) {
  T v;
  __atomic_load(src, &v, __ATOMIC_ACQUIRE);
  PMINDEX_OBSERVE(OnLoad(src, sizeof(T)));
  return v;
}
template <typename T>
PMINDEX_PM_INLINE T LoadRelaxed(const T* src) {
  T v;
  __atomic_load(src, &v, __ATOMIC_RELAXED);
  return v;
}

// memcpy / memset into PM through the cache (flush afterwards).
void Copy(void* dst, const void* src, size_t n);
void Set(void* dst, int c, size_t n);
// Non-temporal copy into PM: bypasses the cache, durable after the next Fence.
void CopyNT(void* dst, const void* src, size_t n);

// Failure-atomic 64-byte write of a whole cache line (dst 64-byte aligned),
// with MOVDIR64B where the CPU has it; durable after the next Fence. Returns
// false (writing nothing) if the CPU lacks MOVDIR64B: callers must then use
// another protocol (e.g. a log). SetAtomicLineWriteEmulation(true) lets tests
// and the simulator model it (a locked 64-byte copy, reported to the observer
// as one atomic line write) on machines without it.
bool AtomicLineWrite(void* dst, const void* src);
bool AtomicLineWriteAvailable();
void SetAtomicLineWriteEmulation(bool on);  // tests / pmcheck only

// ---------------------------------------------------------------------------
// Flush and fence.
namespace detail {
PMINDEX_PM_INLINE void FlushLineInstr(const void* p) {
  switch (g_flush_instr) {
    case FlushInstr::kClwb:
      asm volatile("clwb %0" : "+m"(*(volatile char*)p));
      break;
    case FlushInstr::kClflushopt:
      asm volatile("clflushopt %0" : "+m"(*(volatile char*)p));
      break;
    case FlushInstr::kClflush:
      asm volatile("clflush %0" : "+m"(*(volatile char*)p));
      break;
  }
}
}  // namespace detail

// Writes back every cache line overlapping [addr, addr+len).
PMINDEX_PM_INLINE void Flush(const void* addr, size_t len) {
  if (len == 0) return;
  uintptr_t p = LineOf(addr);
  const uintptr_t end = reinterpret_cast<uintptr_t>(addr) + len;
  for (; p < end; p += kCacheLine) {
    detail::tl_counters.lines_flushed++;
    if (detail::g_mode == PersistMode::kFlush) {
      detail::FlushLineInstr(reinterpret_cast<const void*>(p));
      if (detail::g_extra_latency_ns) detail::SpinNs(detail::g_extra_latency_ns);
    }
    PMINDEX_OBSERVE(OnFlush(reinterpret_cast<const void*>(p)));
  }
}

PMINDEX_PM_INLINE void Fence() {
  detail::tl_counters.fences++;
  asm volatile("sfence" ::: "memory");
  PMINDEX_OBSERVE(OnFence());
}

PMINDEX_PM_INLINE void Persist(const void* addr, size_t len) {
  Flush(addr, len);
  Fence();
}

// Store + flush + fence of one value: the common "commit" step.
template <typename T>
PMINDEX_PM_INLINE void StorePersist(T* dst, const T& v) {
  StoreAtomic(dst, v);
  Persist(dst, sizeof(T));
}

}  // namespace pmindex::pm
