// Persist primitives: CPU feature detection, modes, counters, copies.
#include "pmindex/pm/persist.h"

#include <cpuid.h>
#include <immintrin.h>
#include <x86intrin.h>

#include <chrono>
#include <mutex>

namespace pmindex::pm {

namespace detail {
constinit thread_local Counters tl_counters __attribute__((tls_model("initial-exec"))) = {};
std::atomic<Observer*> g_observer{nullptr};
PersistMode g_mode = PersistMode::kFlush;
uint32_t g_extra_latency_ns = 0;
FlushInstr g_flush_instr = FlushInstr::kClflush;
}  // namespace detail

namespace {

struct CpuFeatures {
  bool clwb = false, clflushopt = false, movdir64b = false, rtm = false;
  CpuFeatures() {
    unsigned a, b, c, d;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
      clflushopt = (b >> 23) & 1;
      clwb = (b >> 24) & 1;
      rtm = (b >> 11) & 1;
      movdir64b = (c >> 28) & 1;
    }
  }
};
const CpuFeatures& Cpu() {
  static const CpuFeatures f;
  return f;
}

struct Init {
  Init() {
    const auto& f = Cpu();
    detail::g_flush_instr = f.clwb ? FlushInstr::kClwb : f.clflushopt ? FlushInstr::kClflushopt : FlushInstr::kClflush;
  }
} g_init;

// TSC ticks per ns, calibrated once (for latency emulation).
double TicksPerNs() {
  static const double tpn = [] {
    auto t0 = std::chrono::steady_clock::now();
    uint64_t c0 = __rdtsc();
    while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(10)) {
    }
    uint64_t c1 = __rdtsc();
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
    return double(c1 - c0) / double(ns);
  }();
  return tpn;
}

bool g_line_write_emulation = false;
std::mutex g_line_write_mu;

}  // namespace

namespace detail {
void SpinNs(uint32_t ns) {
  const uint64_t end = __rdtsc() + uint64_t(ns * TicksPerNs());
  while (__rdtsc() < end) _mm_pause();
}
}  // namespace detail

Counters& Counters::operator+=(const Counters& o) {
  stores += o.stores;
  store_bytes += o.store_bytes;
  lines_flushed += o.lines_flushed;
  fences += o.fences;
  nt_bytes += o.nt_bytes;
  line_writes += o.line_writes;
  allocs += o.allocs;
  frees += o.frees;
  return *this;
}

Counters Counters::operator-(const Counters& o) const {
  Counters r;
  r.stores = stores - o.stores;
  r.store_bytes = store_bytes - o.store_bytes;
  r.lines_flushed = lines_flushed - o.lines_flushed;
  r.fences = fences - o.fences;
  r.nt_bytes = nt_bytes - o.nt_bytes;
  r.line_writes = line_writes - o.line_writes;
  r.allocs = allocs - o.allocs;
  r.frees = frees - o.frees;
  return r;
}

const char* PersistModeName(PersistMode m) { return m == PersistMode::kNone ? "none" : "flush"; }

bool ParsePersistMode(const std::string& s, PersistMode* m) {
  if (s == "flush") {
    *m = PersistMode::kFlush;
    return true;
  }
  if (s == "none" || s == "eadr") {
    *m = PersistMode::kNone;
    return true;
  }
  return false;
}

void SetPersistMode(PersistMode mode, uint32_t extra_ns) {
  if (extra_ns) TicksPerNs();  // calibrate before use
  detail::g_mode = mode;
  detail::g_extra_latency_ns = extra_ns;
}
PersistMode GetPersistMode() { return detail::g_mode; }
uint32_t GetExtraWriteLatencyNs() { return detail::g_extra_latency_ns; }

FlushInstr GetFlushInstr() { return detail::g_flush_instr; }
const char* FlushInstrName(FlushInstr f) {
  switch (f) {
    case FlushInstr::kClwb: return "clwb";
    case FlushInstr::kClflushopt: return "clflushopt";
    case FlushInstr::kClflush: return "clflush";
  }
  return "?";
}
bool SetFlushInstr(FlushInstr f) {
  if (f == FlushInstr::kClwb && !Cpu().clwb) return false;
  if (f == FlushInstr::kClflushopt && !Cpu().clflushopt) return false;
  detail::g_flush_instr = f;
  return true;
}
bool CpuHasMovdir64b() { return Cpu().movdir64b; }
bool CpuHasRtm() { return Cpu().rtm; }

void SetObserver(Observer* obs) { detail::g_observer.store(obs, std::memory_order_release); }

void Copy(void* dst, const void* src, size_t n) {
  std::memcpy(dst, src, n);
  detail::NoteStore(dst, n);
}

void Set(void* dst, int c, size_t n) {
  std::memset(dst, c, n);
  detail::NoteStore(dst, n);
}

void CopyNT(void* dst, const void* src, size_t n) {
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  size_t i = 0;
  // Head: plain stores until 8-byte aligned, flushed (cannot stream them).
  size_t head = (8 - (reinterpret_cast<uintptr_t>(d) & 7)) & 7;
  if (head > n) head = n;
  if (head) {
    std::memcpy(d, s, head);
    i = head;
  }
  for (; i + 8 <= n; i += 8) {
    long long v;
    std::memcpy(&v, s + i, 8);
    _mm_stream_si64(reinterpret_cast<long long*>(d + i), v);
  }
  size_t tail = n - i;
  if (tail) std::memcpy(d + i, s + i, tail);
  detail::tl_counters.nt_bytes += n;
  detail::tl_counters.stores++;
  detail::tl_counters.store_bytes += n;
  PMINDEX_OBSERVE(OnNonTemporalStore(dst, n));
  // Head and tail went through the cache: write them back (counted and
  // reported like any other flush).
  if (head) Flush(d, head);
  if (tail && (!head || LineOf(d + i) != LineOf(d))) Flush(d + i, tail);
}

bool AtomicLineWriteAvailable() { return Cpu().movdir64b || g_line_write_emulation; }
void SetAtomicLineWriteEmulation(bool on) { g_line_write_emulation = on; }

bool AtomicLineWrite(void* dst, const void* src) {
  if ((reinterpret_cast<uintptr_t>(dst) & 63) != 0) return false;
  if (Cpu().movdir64b) {
    // movdir64b: 64-byte direct store with 64-byte write atomicity.
    asm volatile("movdir64b (%1), %0" : : "r"(dst), "r"(src) : "memory");
  } else if (g_line_write_emulation) {
    std::lock_guard<std::mutex> g(g_line_write_mu);
    std::memcpy(dst, src, 64);
  } else {
    return false;
  }
  detail::tl_counters.line_writes++;
  detail::tl_counters.stores++;
  detail::tl_counters.store_bytes += 64;
  PMINDEX_OBSERVE(OnNonTemporalStore(dst, 64));
  return true;
}

}  // namespace pmindex::pm
