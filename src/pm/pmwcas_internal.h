// Internal: the PMwCAS descriptor format and the state shared by
// pmwcas.cc (the protocol), pmwcas_recovery.cc (recovery, recycling) and
// pmwcas_cache.cc (per-thread descriptor caches).
//
// Descriptor region (pool format 2, docs/pool-format.md, docs/pmwcas.md):
// `count` descriptors of `desc_size` bytes (a whole number of cache lines)
// from `region_off`. A descriptor:
//   [0, 32)    header: status, count, two reserved words
//   [32, ...)  entries[max_words], 32 bytes each, two per cache line:
//              {policy, addr (pool offset), old value, new value}
// Status word: the state in its low 2 bits (kFree, kUndecided, kSucceeded,
// kFailed), plus pmwcas::kDirtyBit while a decided status is not yet durable.
//
// Invariants (PM):
//  H1 A descriptor whose durable status is kFree owns no block: recovery
//     frees nothing through it (it only clears its fresh-block fields).
//  H2 In any descriptor, an entry whose policy has the fresh-block bit holds
//     in `new` either 0 or the block allocated into it by the current use:
//     the entry's `new` is zeroed before its policy word is written
//     (stores to one line persist in program order), and recycling zeroes
//     `new` before the status becomes kFree, ordered by a fence before any
//     store of the next use.
//  H3 No target word holds a pointer (descriptor or RDCSS) to a descriptor
//     whose status is kFree in DRAM: every such pointer is replaced, and the
//     replacement persisted, before recycling.
// Invariant (DRAM): every descriptor is in exactly one place: the shared
// free list, the shared retired list, one cache's free or retired list, or
// the hands of one thread (an Op in preparation or in flight, or a batch
// being recycled or moved between lists). Which thread holds a descriptor
// is DRAM-only state: recovery scans every descriptor regardless.
// Values in target words: a descriptor pointer is kDescriptorBit | the
// descriptor's pool offset; an RDCSS pointer is kRdcssBit | the entry's pool
// offset plus a tag (see kRdcssTagShift).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "kit/epoch.h"
#include "pmindex/pm/pmwcas.h"

namespace pmindex::pm {

namespace pmwcas_format {
// An RDCSS pointer: kRdcssBit | a per-attempt tag in bits [20, 61) | the
// entry's pool offset in bits [0, 20) (the region ends below 2^18).
inline constexpr int kRdcssTagShift = 20;
inline constexpr uint64_t kRdcssOffsetMask = (uint64_t(1) << kRdcssTagShift) - 1;

inline constexpr uint64_t kFree = 0;
inline constexpr uint64_t kUndecided = 1;
inline constexpr uint64_t kSucceeded = 2;
inline constexpr uint64_t kFailed = 3;
inline constexpr uint64_t kStateMask = 3;

// Policy word bits (Recycle's values).
inline constexpr uint64_t kPolicyFreeOld = 1;  // free `old` on success
inline constexpr uint64_t kPolicyFreshNew = 2;  // `new` is owned by the descriptor until success
inline constexpr uint64_t kPolicyMask = 3;

struct Header {
  uint64_t status;
  uint64_t count;
  uint64_t reserved[2];
};
struct Entry {
  uint64_t policy;
  uint64_t addr;
  uint64_t old_value;
  uint64_t new_value;
};
static_assert(sizeof(Header) == 32 && sizeof(Entry) == 32);

inline constexpr uint64_t DescriptorSize(uint32_t max_words) {
  return (sizeof(Header) + uint64_t(max_words) * sizeof(Entry) + 63) / 64 * 64;
}
}  // namespace pmwcas_format

// Test-only interleaving points (pmwcas_concurrency_test stops threads at
// them to force rare interleavings): At calls the hook, if a test
// set one, at the named instant. Never set outside tests; the check is one
// relaxed load, on paths an uncontended operation does not take.
namespace pmwcas_hooks {
enum class Point : uint8_t {
  kRdcssSawUndecided,  // CompleteRdcss read the status as undecided, before its CAS to the descriptor pointer
  kDecidingFailed,     // Help is about to decide failed (a target held another value)
};
using Hook = void (*)(Point, const uint64_t* word);
extern std::atomic<Hook> g_hook;
inline void At(Point p, const uint64_t* word) {
  if (Hook f = g_hook.load(std::memory_order_relaxed); __builtin_expect(f != nullptr, 0)) f(p, word);
}
}  // namespace pmwcas_hooks

// A thread's private descriptor cache (pmwcas_cache.cc, docs/pmwcas.md
// "Per-thread caches"). Its lock is taken by the owner on every Begin and
// Retire (uncontended) and by other threads only to steal from it (a thread
// that ran short) or to reclaim it (Reclaim, Close).
struct alignas(64) DescCache {
  std::mutex mu;
  std::vector<uint32_t> free;                  // free descriptors (status kFree, durable)
  internal::RetireList<uint32_t> retired;      // finished, awaiting their grace period
  uint32_t pending = 0;                        // retired since the last reclaim of this cache
  bool bound = false;                          // owned by a live thread (under State::mu)
};

struct PMwCAS::State {
  Pool* pool = nullptr;
  uint64_t id = 0;  // unique in the process, never reused (thread bindings' key)
  char* base = nullptr;
  uint64_t region_off = 0;
  uint64_t desc_size = 0;
  uint32_t max_words = 0;
  uint32_t count = 0;
  bool read_only = false;
  internal::EpochManager epoch;
  // Install order of each descriptor's entries (sorted by address): written
  // by the owner before the descriptor is published, read by helpers.
  std::vector<uint8_t> order;
  // Shared pool: refills caches in batches, takes back their overflow and
  // the contents of caches whose thread exited; serves threads that are
  // exiting (no cache) directly. Lock order: mu before any DescCache::mu.
  std::mutex mu;  // free_list, retired, caches, DescCache::bound
  std::vector<uint32_t> free_list;
  internal::RetireList<uint32_t> retired;
  std::vector<std::unique_ptr<DescCache>> caches;  // never shrinks; freed with the State
  uint32_t batch = 8;  // cache refill size and reclaim period (Open: from count)
  std::atomic<uint64_t> steals{0};
  RecoveryStats stats;

  pmwcas_format::Header* Desc(uint32_t i) const {
    return reinterpret_cast<pmwcas_format::Header*>(base + region_off + uint64_t(i) * desc_size);
  }
  pmwcas_format::Entry* Entries(uint32_t i) const {
    return reinterpret_cast<pmwcas_format::Entry*>(reinterpret_cast<char*>(Desc(i)) + sizeof(pmwcas_format::Header));
  }
  uint64_t DescOff(uint32_t i) const { return region_off + uint64_t(i) * desc_size; }
  uint64_t DescPtr(uint32_t i) const { return pmwcas::kDescriptorBit | DescOff(i); }
  uint64_t RdcssPtr(uint32_t i, uint32_t e) const {
    return pmwcas::kRdcssBit | (DescOff(i) + sizeof(pmwcas_format::Header) + uint64_t(e) * sizeof(pmwcas_format::Entry));
  }
  // Decodes a descriptor pointer / RDCSS pointer (false if it does not point
  // into the region).
  bool DecodeDesc(uint64_t v, uint32_t* d) const {
    const uint64_t off = v & pmwcas::kValueMask;
    if (off < region_off || (off - region_off) % desc_size != 0) return false;
    const uint64_t i = (off - region_off) / desc_size;
    if (i >= count) return false;
    *d = uint32_t(i);
    return true;
  }
  bool DecodeRdcss(uint64_t v, uint32_t* d, uint32_t* e) const {
    const uint64_t off = v & pmwcas_format::kRdcssOffsetMask;
    if (off < region_off) return false;
    const uint64_t i = (off - region_off) / desc_size, in = (off - region_off) % desc_size;
    if (i >= count || in < sizeof(pmwcas_format::Header) || (in - sizeof(pmwcas_format::Header)) % sizeof(pmwcas_format::Entry))
      return false;
    const uint64_t ei = (in - sizeof(pmwcas_format::Header)) / sizeof(pmwcas_format::Entry);
    if (ei >= max_words) return false;
    *d = uint32_t(i);
    *e = uint32_t(ei);
    return true;
  }
  uint64_t* Target(const pmwcas_format::Entry* e) const { return reinterpret_cast<uint64_t*>(base + e->addr); }

  // pmwcas.cc
  uint64_t Help(uint32_t d);
  // installed (optional): set true iff this call's CAS stored the
  // descriptor pointer.
  bool CompleteRdcss(uint64_t* w, uint64_t r, bool* installed = nullptr);
  void PersistAndClear(uint64_t* w, uint64_t v);
  // pmwcas_cache.cc
  // A free descriptor (false: none after a bounded search, see Begin).
  bool Take(uint32_t* d);
  // A free descriptor of the calling thread's cache, if it has one (never
  // reclaims, refills or waits).
  bool TakeCached(uint32_t* d);
  // Returns a descriptor that was never published (Abandon).
  void PutFree(uint32_t d);
  void Retire(uint32_t d);
  // The calling thread's cache (bound on first use), nullptr once the
  // thread is exiting.
  DescCache* ThreadCache();
  DescCache* BindCache();
  // A cache whose thread exits: its contents go to the shared lists.
  void HandBack(DescCache* c);
  // Recycles what is past its grace period in the shared list and in every
  // cache (all: everything, at close).
  void ReclaimEverywhere(bool all);
  void ReclaimShared(bool all);
  bool ReclaimCache(DescCache* c, DescCache* into, bool all);
  bool Refill(DescCache* c);
  bool Steal(DescCache* c);
  void AddFree(DescCache* c, const uint32_t* ds, size_t n);
  std::vector<DescCache*> Caches();
  // Registers / unregisters the State for thread exits (pmwcas_cache.cc).
  void Register();
  void Unregister();
  // pmwcas_recovery.cc
  Status Recover();
  // Applies the recycle policies of a finished (or abandoned) descriptor
  // and makes it free (durable); single owner, outside any helper's reach.
  // fence = false: the caller recycles a batch and fences once after it,
  // before any descriptor of the batch is reused.
  void Recycle(uint32_t d, bool fence = true);
  // Recycle(d, false) for each of ds[0..n), then one fence (pmwcas_cache.cc).
  void RecycleBatch(const uint32_t* ds, size_t n);
};

}  // namespace pmindex::pm
