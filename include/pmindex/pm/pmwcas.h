// pmindex/pm/pmwcas.h: a persistent multi-word compare-and-swap (PMwCAS).
//
// Follows Wang, Levandoski and Larson, "Easy lock-free indexing in
// non-volatile memory" (ICDE'18), the primitive under BzTree (PiBench,
// VLDB'20, section 3.3): change up to N 8-byte PM words atomically and
// durably, lock-free, and after a crash at any instant recover every
// operation entirely forward or entirely back. docs/pmwcas.md has the
// protocol, the persist order, recovery and the rules below at length.
//
// Where it lives: the pool owns a descriptor region (pool format 2,
// docs/pool-format.md) and one PMwCAS object, `pool->pmwcas()`, created and
// recovered by Pool::Open after the allocator and before any index opens.
// A pool of format 1 has no region: pmwcas() is nullptr there.
//
// Target words. The top 3 bits of every word a PMwCAS targets are reserved
// (kDescriptorBit, kRdcssBit, kDirtyBit); values use the low 61 bits, and a
// user with full 64-bit values stores them out of line. A target word is
// read only through PMwCAS::Read (which helps an operation in flight and
// persists a dirty word before returning it) and changed only by PMwCAS
// operations or, before it is shared, by pm::StoreAtomic + pm::Persist of a
// value without reserved bits. Targets are 8-byte aligned words in the
// pool's heap (or the root slot).
//
// An operation:
//     PMwCAS::Op op;
//     PMINDEX_RETURN_IF_ERROR(pool->pmwcas()->Begin(&op));
//     op.AddWord(&a, a0, a1);
//     op.AddAllocation(&b, b0, 64, &blk, Recycle::kFreeOldOnSuccessNewOnFailure);
//     ... initialise and persist blk ...
//     bool ok;
//     PMINDEX_RETURN_IF_ERROR(op.Execute(&ok));   // ok: all changed, else none
// Execute returns once the outcome is durable. An Op not executed is
// abandoned by its destructor (its allocations are freed).
//
// Recycling: a block freed by a policy (the old value on success, a fresh
// allocation on failure) is freed only after an epoch grace period of this
// PMwCAS's epoch manager, so readers that reach blocks through target words
// hold a PMwCAS::Guard while they use them. The epoch manager stays internal
// to the substrate (src/kit/epoch.h); Guard is its only public face.
//
// Descriptors: each thread takes them from and retires them into a private
// cache, refilled from and overflowing into the pool's shared lists in
// batches; a thread that exits hands its cache back, and a thread that runs
// short takes from other threads' caches before Begin reports Busy.
//
// Thread safety: Begin, Read and an Op's methods may be called from any
// number of threads at once (one thread per Op). Begin must not be called
// while the calling thread holds a Guard of the same PMwCAS (it may have to
// wait for a grace period). The PMwCAS is destroyed by Pool::Close; no
// operation may be running then.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "pmindex/pm/persist.h"
#include "pmindex/pm/pptr.h"
#include "pmindex/status.h"

namespace pmindex::pm {

class Pool;

namespace pmwcas {
// Reserved bits of a target word.
inline constexpr uint64_t kDescriptorBit = uint64_t(1) << 63;  // the word points to a descriptor in flight
inline constexpr uint64_t kRdcssBit = uint64_t(1) << 62;       // the word points to a descriptor entry (RDCSS in flight)
inline constexpr uint64_t kDirtyBit = uint64_t(1) << 61;       // stored, maybe not yet persisted
inline constexpr uint64_t kReservedBits = kDescriptorBit | kRdcssBit | kDirtyBit;
inline constexpr uint64_t kValueMask = ~kReservedBits;
inline constexpr bool IsValue(uint64_t v) { return (v & kReservedBits) == 0; }
}  // namespace pmwcas

// A persistent pointer kept in a PMwCAS target word: the offset in the low
// 61 bits, the reserved bits masked off. Typed so that indexes need no bit
// tricks of their own: `TaggedPPtr<Node>::FromWord(pmwcas->Read(&slot)).ptr()`.
template <typename T>
struct TaggedPPtr {
  uint64_t word = 0;

  constexpr TaggedPPtr() = default;
  static constexpr TaggedPPtr FromWord(uint64_t w) {
    TaggedPPtr t;
    t.word = w;
    return t;
  }
  static constexpr TaggedPPtr FromPPtr(PPtr<T> p) { return FromWord(p.off & pmwcas::kValueMask); }
  constexpr PPtr<T> ptr() const { return PPtr<T>(word & pmwcas::kValueMask); }
  constexpr uint64_t value() const { return word & pmwcas::kValueMask; }
  constexpr bool descriptor() const { return (word & pmwcas::kDescriptorBit) != 0; }
  constexpr bool rdcss() const { return (word & pmwcas::kRdcssBit) != 0; }
  constexpr bool dirty() const { return (word & pmwcas::kDirtyBit) != 0; }
  constexpr bool clean_value() const { return pmwcas::IsValue(word); }
  T* get(char* base) const { return ptr().get(base); }
  friend constexpr bool operator==(TaggedPPtr a, TaggedPPtr b) { return a.word == b.word; }
};
static_assert(sizeof(TaggedPPtr<int>) == 8);

// What a successful or failed operation frees, per target word.
enum class Recycle : uint8_t {
  kNone = 0,
  // The expected value is a block the word owns: freed (after a grace
  // period) once the operation succeeded.
  kFreeOldOnSuccess = 1,
  // The new value is a block allocated by AddAllocation into the descriptor:
  // freed if the operation fails (AddAllocation only).
  kFreeNewOnFailure = 2,
  kFreeOldOnSuccessNewOnFailure = 3,
};

class PMwCAS {
 public:
  static constexpr uint32_t kDefaultMaxWords = 16;
  static constexpr uint32_t kMaxMaxWords = 64;

  struct State;  // src/pm/pmwcas_internal.h

  // One operation in preparation. Movable, not copyable; one thread at a time.
  class Op {
   public:
    Op() = default;
    Op(Op&& o) noexcept;
    Op& operator=(Op&& o) noexcept;
    Op(const Op&) = delete;
    Op& operator=(const Op&) = delete;
    ~Op() { Abandon(); }

    // Adds a target: *addr is to change from `expected` to `desired`.
    // InvalidArgument (and the operation fails at Execute) for: more targets
    // than max_words(), an address already added, an address outside the
    // pool's heap or not 8-byte aligned, a value with reserved bits, a policy
    // other than kNone/kFreeOldOnSuccess, kFreeOldOnSuccess with a null
    // expected value.
    Status AddWord(uint64_t* addr, uint64_t expected, uint64_t desired, Recycle policy = Recycle::kNone);
    // Adds a target whose new value is a fresh block of `size` bytes, owned
    // by the descriptor until the operation succeeds (so a crash at any
    // instant leaks nothing). *block gets its address; initialise and
    // persist it before Execute. policy: kFreeNewOnFailure or
    // kFreeOldOnSuccessNewOnFailure. PoolFull/InvalidArgument from the
    // allocator leave the operation usable without this target.
    Status AddAllocation(uint64_t* addr, uint64_t expected, size_t size, void** block,
                         Recycle policy = Recycle::kFreeNewOnFailure);
    // Runs the operation. OK with *succeeded = true: every word held its
    // expected value and now holds its desired one; false: none changed.
    // An error (bad input above, or no target): nothing changed. The Op is
    // empty afterwards either way. Durable when it returns.
    Status Execute(bool* succeeded);
    // Gives the descriptor back without running (frees its allocations).
    void Abandon();

    bool valid() const { return s_ != nullptr; }
    uint32_t size() const { return count_; }

   private:
    friend class PMwCAS;
    Status Fail(Status s);
    State* s_ = nullptr;
    uint32_t desc_ = 0;
    uint32_t count_ = 0;
    bool undecided_persisted_ = false;  // the descriptor was persisted as undecided (an allocation)
    Status error_;
  };

  // Read-side critical section: blocks reached through values read from
  // target words are not freed by a recycle policy while it is open.
  class Guard {
   public:
    explicit Guard(PMwCAS& p);
    ~Guard();
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;

   private:
    alignas(8) unsigned char g_[8];
  };

  ~PMwCAS();
  PMwCAS(const PMwCAS&) = delete;
  PMwCAS& operator=(const PMwCAS&) = delete;

  // Takes a free descriptor. Busy if every descriptor stays taken (held by
  // operations in preparation, or retired and held back by open guards).
  Status Begin(Op* op);
  // Takes a free descriptor from the calling thread's cache only, never
  // reclaiming or waiting: unlike Begin it may be called inside a Guard.
  // False if that cache has none (the caller falls back to a path that
  // needs no descriptor, or to Begin outside its guard).
  bool TryBegin(Op* op);
  // The value of a target word (reserved bits clear): helps an operation
  // installed there to finish, and persists and clears a dirty bit first.
  // A clean value (the common case) is one inline acquire load. It is not
  // reported to the observer as a load the caller acts on: a word holds a
  // value with its reserved bits clear only once that value is durable (the
  // dirty bit is cleared after the flush and fence), so it needs no check;
  // pmcheck's erratum lint, which works on whole lines, would otherwise
  // flag a read of a clean word whose line neighbour another thread is
  // installing (false sharing). ReadSlow's loads are reported.
  uint64_t Read(const uint64_t* addr) {
    uint64_t v;
    __atomic_load(addr, &v, __ATOMIC_ACQUIRE);
    if (__builtin_expect(pmwcas::IsValue(v), 1)) return v;
    return ReadSlow(addr);
  }
  template <typename T>
  TaggedPPtr<T> ReadPtr(const TaggedPPtr<T>* addr) {
    return TaggedPPtr<T>::FromWord(Read(&addr->word));
  }

  uint32_t max_words() const;
  uint32_t descriptor_count() const;
  // Descriptors not free (in preparation, in flight, retired): tests. A
  // descriptor in a thread's cache's free list is free.
  uint32_t DescriptorsInUse() const;
  // Recycles every retired descriptor whose grace period has passed, in the
  // shared list and in every thread's cache (also done automatically);
  // tests and Close.
  void Reclaim();

  // Per-thread descriptor caches (docs/pmwcas.md "Per-thread caches"):
  // tests and benchmarks.
  struct CacheStats {
    uint32_t caches = 0;  // created (reused after their thread exits)
    uint32_t bound = 0;   // owned by a live thread
    uint32_t cached = 0;  // descriptors in caches (free or retired)
    uint64_t steals = 0;  // times a thread that ran short took from another's cache
  };
  CacheStats cache_stats() const;

  // What the recovery at Pool::Open did.
  struct RecoveryStats {
    uint64_t rolled_forward = 0;  // succeeded descriptors
    uint64_t rolled_back = 0;     // undecided or failed descriptors
    uint64_t words_repaired = 0;  // target words that held a descriptor or RDCSS pointer
    uint64_t dirty_cleared = 0;   // dirty bits cleared in target words
    uint64_t blocks_freed = 0;    // by recycle policies
  };
  const RecoveryStats& recovery_stats() const;

  // Pool-internal: creates the PMwCAS of an open pool and recovers its
  // descriptors (Pool::Open), or formats a new region (Pool::Create).
  static Status Open(Pool* pool, uint64_t region_off, uint32_t max_words, uint32_t count, bool fresh, bool read_only,
                     std::unique_ptr<PMwCAS>* out);

 private:
  PMwCAS();
  // Read of a word holding a reserved bit: help, complete, or persist and clean.
  uint64_t ReadSlow(const uint64_t* addr);
  std::unique_ptr<State> s_;
};

}  // namespace pmindex::pm
