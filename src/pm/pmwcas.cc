// PMwCAS: the operation protocol (include/pmindex/pm/pmwcas.h, docs/pmwcas.md).
//
// Follows Wang, Levandoski and Larson (ICDE'18), sections 3-4, the primitive
// BzTree is built on (PiBench VLDB'20 section 3.3), with Harris, Fraser and
// Pratt's RDCSS (DISC'02) for installing descriptor pointers.
//
// Persist order of one operation (owner, uncontended):
//   1. entries (AddWord: policy first, then addr/old/new), count, status =
//      undecided; flush the descriptor's lines; fence.
//   2. for each target in address order: RDCSS old -> RDCSS pointer ->
//      descriptor pointer (installed only while the status is undecided).
//   3. flush every target word (each cache line once); fence (every
//      descriptor pointer durable).
//   4. CAS status undecided -> succeeded|dirty; flush it; fence: the commit
//      point. (A failed decision is a CasVolatile, never persisted: recovery
//      treats undecided and failed alike.) Clear the status's dirty bit
//      (never flushed). The thread whose CAS decided flushes the status
//      itself, whatever it reads afterwards.
//   5. each target: CAS descriptor pointer -> final value|dirty (and take
//      back any RDCSS pointer of this descriptor left in it); flush them
//      all (each line once); fence; clear the dirty bits (never flushed).
//   6. retire the descriptor; after a grace period it is recycled
//      (pmwcas_recovery.cc): its policies run, then status = free, persisted.
// Any thread that meets a descriptor pointer helps: steps 2-5 on its behalf.
// Any thread that meets an RDCSS pointer completes it. Any thread that meets
// a dirty word flushes it, fences, and clears the bit before using the value
// (also a word that holds the expected value but is dirty: it is cleaned and
// retried, never taken for a mismatch). Read also flushes a word holding a
// descriptor or RDCSS pointer (and fences) before helping, since what the
// help makes durable depends on that pointer.
//
// RDCSS pointers carry a per-attempt tag (the installing thread's id and
// counter) above the entry's offset, so a completion that read the status
// before the decision cannot succeed on a later installation of the same
// entry by another helper (the ABA that a per-entry RDCSS pointer allows).
//
// Reclamation (grace periods). A descriptor is retired when its owner's
// Execute returns, and recycled once every guard that was open at its
// retirement has closed. That is safe only if no thread can reach it
// through a target word after its retirement. Descriptor pointers carry no
// tag, so this matters: a thread that completes an RDCSS (status read as
// undecided) and is delayed before its CAS could store a descriptor pointer
// after a failed decision and after the owner's Finalize; a third thread
// whose guard began after the retirement could then read it, start
// helping, and still be inside Help when the completer leaves its guard
// and the descriptor is recycled and reused: it would then finalize the
// new use's words with the old use's outcome (a succeeded operation's word
// rolled back, or the reverse). Finalize therefore takes back every RDCSS
// pointer of the descriptor in its targets (completing it against the
// decided status) before returning, so the late CAS fails; an RDCSS
// installed after that reads the decided status when completed (the
// decision, the RDCSS install CAS, Finalize's reload and the completion's
// status load are seq_cst, so the install either precedes Finalize's
// reload or follows the decision). Hence no target word holds or gains a
// pointer to a descriptor once its owner has retired it.
//
// Invariants: H1-H3 of pmwcas_internal.h (a free descriptor owns no block;
// a fresh-block entry never pairs with a stale value; no word points to a
// free descriptor).
//
// Thread safety: every function may run concurrently with any other, inside
// the State's epoch manager (Execute and Read open the guard).
#include <algorithm>
#include <atomic>
#include <numeric>

#include "pm/pmwcas_internal.h"
#include "pmindex/pm/allocator.h"
#include "pmindex/pm/fault.h"
#include "pmindex/pm/persist.h"
#include "pmindex/pm/pool.h"
#include "pm/layout.h"

namespace pmindex::pm {

using namespace pmwcas_format;
using pmwcas::kDescriptorBit;
using pmwcas::kDirtyBit;
using pmwcas::kRdcssBit;
using pmwcas::kValueMask;

std::atomic<pmwcas_hooks::Hook> pmwcas_hooks::g_hook{nullptr};

namespace {

inline uint64_t LoadStatus(const Header* h) { return __atomic_load_n(&h->status, __ATOMIC_ACQUIRE); }

// RDCSS tags: bits [kRdcssTagShift, 61) of an RDCSS pointer; the entry's
// pool offset sits below.
constexpr int kTagCounterBits = 25;
std::atomic<uint64_t> g_next_thread_tag{1};
// initial-exec: one %fs-relative access (the library's default model would
// call __tls_get_addr on every install).
thread_local uint64_t tl_tag_base __attribute__((tls_model("initial-exec"))) = 0;
thread_local uint64_t tl_tag_counter __attribute__((tls_model("initial-exec"))) = 0;

uint64_t NextRdcssTag() {
  if (tl_tag_base == 0) tl_tag_base = g_next_thread_tag.fetch_add(1, std::memory_order_relaxed) << kTagCounterBits;
  const uint64_t t = (tl_tag_base | (++tl_tag_counter & ((uint64_t(1) << kTagCounterBits) - 1)));
  return (t << kRdcssTagShift) & (kValueMask & ~kRdcssOffsetMask);
}

enum class Installed { kYes, kMismatch, kDecided };

// Flushes the target words of descriptor d, each cache line once: the
// entries are visited in address order (ord), so words sharing a line are
// adjacent, and one flush of a line writes back every store to it.
void FlushTargets(const PMwCAS::State* s, uint32_t d, const uint8_t* ord, uint32_t n) {
  const Entry* es = s->Entries(d);
  uintptr_t last = ~uintptr_t(0);
  for (uint32_t j = 0; j < n; j++) {
    uint64_t* w = s->Target(&es[ord[j]]);
    const uintptr_t line = reinterpret_cast<uintptr_t>(w) / kCacheLine;
    if (line != last) Flush(w, 8);
    last = line;
  }
}

}  // namespace

// ---- helpers shared with recovery ------------------------------------------

void PMwCAS::State::PersistAndClear(uint64_t* w, uint64_t v) {
  if (!PMINDEX_FAULT("pmwcas.skip_dirty_flush")) Flush(w, 8);
  Fence();
  uint64_t cur = v;
  CasVolatile(w, &cur, v & ~kDirtyBit);
}

// r is an RDCSS pointer found in *w: finish that RDCSS (the descriptor
// pointer if its descriptor is still undecided, else the expected value).
// False if r does not point to an entry of this pool's region (a value that
// broke the reserved-bit rule): nothing is done.
bool PMwCAS::State::CompleteRdcss(uint64_t* w, uint64_t r, bool* installed) {
  uint32_t d, i;
  if (!DecodeRdcss(r, &d, &i)) return false;
  const Entry* e = &Entries(d)[i];
  uint64_t cur = r;
  if ((__atomic_load_n(&Desc(d)->status, __ATOMIC_SEQ_CST) & kStateMask) == kUndecided) {
    pmwcas_hooks::At(pmwcas_hooks::Point::kRdcssSawUndecided, w);
    const bool ok = Cas(w, &cur, DescPtr(d), __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    if (installed) *installed = ok;
  } else if (Cas(w, &cur, e->old_value | kDirtyBit)) {
    // The RDCSS pointer may have reached PM: the restored value must be
    // durable before this descriptor can be recycled (H3).
    PersistAndClear(w, e->old_value | kDirtyBit);
  }
  return true;
}

// Phase 2: one target. Returns kYes once the word holds the descriptor
// pointer, kMismatch if it holds another value, kDecided if the status left
// undecided meanwhile.
static Installed Install(PMwCAS::State* s, uint32_t d, uint32_t i) {
  const Header* h = s->Desc(d);
  const Entry* e = &s->Entries(d)[i];
  uint64_t* w = s->Target(e);
  const uint64_t dp = s->DescPtr(d);
  for (;;) {
    if ((LoadStatus(h) & kStateMask) != kUndecided) return Installed::kDecided;
    const uint64_t rp = s->RdcssPtr(d, i) | NextRdcssTag();
    uint64_t cur = e->old_value;
    if (Cas(w, &cur, rp, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
      bool installed = false;
      s->CompleteRdcss(w, rp, &installed);
      // This thread's CAS put dp in the word: done, without another locked
      // CAS that would only read dp back. (Had the status been decided in
      // between, Help's commit CAS fails and the decided outcome stands.)
      if (installed) return Installed::kYes;
      continue;  // reads the word again: dp, or the old value if decided
    }
    if (cur == dp) return Installed::kYes;
    if (cur & kRdcssBit) {
      if (!s->CompleteRdcss(w, cur)) return Installed::kMismatch;
      continue;
    }
    if (cur & kDescriptorBit) {
      uint32_t o;
      if (s->DecodeDesc(cur, &o)) {
        s->Help(o);
        continue;
      }
      return Installed::kMismatch;  // not a descriptor of this pool: a bad value
    }
    if (cur & kDirtyBit) {
      // Flush-on-read: a dirty word (even one holding the expected value) is
      // persisted and cleaned, then compared again.
      s->PersistAndClear(w, cur);
      continue;
    }
    return Installed::kMismatch;
  }
}

// Phase 3: replaces every descriptor pointer of d by its final value, makes
// the values durable and clears their dirty bits. Also takes back every
// RDCSS pointer of d still in a target word (its completion restores the
// expected value, d being decided): a thread that read the status as
// undecided before the decision and is about to turn such a pointer into a
// descriptor pointer then fails its CAS. So once the owner's Finalize
// returns, no target word holds a pointer to d and none can appear (an
// RDCSS installed later is completed against the decided status), and
// d's grace period, counted from its retirement, covers every thread
// that can still reach it.
static void Finalize(PMwCAS::State* s, uint32_t d, uint64_t state) {
  const Header* h = s->Desc(d);
  const Entry* es = s->Entries(d);
  const uint8_t* ord = &s->order[size_t(d) * s->max_words];
  const uint32_t n = uint32_t(std::min<uint64_t>(h->count, s->max_words));
  const uint64_t dp = s->DescPtr(d);
  for (uint32_t j = 0; j < n; j++) {
    const Entry* e = &es[ord[j]];
    uint64_t* w = s->Target(e);
    for (;;) {
      uint64_t cur = __atomic_load_n(w, __ATOMIC_SEQ_CST);
      if (cur == dp) {
        if (Cas(w, &cur, (state == kSucceeded ? e->new_value : e->old_value) | kDirtyBit)) break;
        continue;
      }
      uint32_t rd, ri;
      if ((cur & kRdcssBit) && s->DecodeRdcss(cur, &rd, &ri) && rd == d && ri == ord[j]) {
        s->CompleteRdcss(w, cur);
        continue;
      }
      break;
    }
  }
  if (!PMINDEX_FAULT("pmwcas.skip_dirty_flush")) FlushTargets(s, d, ord, n);
  Fence();
  for (uint32_t j = 0; j < n; j++) {
    const Entry* e = &es[ord[j]];
    const uint64_t v = (state == kSucceeded ? e->new_value : e->old_value);
    uint64_t cur = v | kDirtyBit;
    CasVolatile(s->Target(e), &cur, v);
  }
}

// Drives descriptor d to its end (phases 2-5); returns its final state.
uint64_t PMwCAS::State::Help(uint32_t d) {
  Header* h = Desc(d);
  uint64_t st = LoadStatus(h);
  if ((st & kStateMask) == kFree) return kFree;  // already recycled: nothing of it is left
  bool committed = false;  // this thread's CAS stored succeeded
  if ((st & kStateMask) == kUndecided) {
    const uint8_t* ord = &order[size_t(d) * max_words];
    const uint32_t n = uint32_t(std::min<uint64_t>(h->count, max_words));
    uint64_t decision = kSucceeded;
    bool all = true;
    for (uint32_t j = 0; j < n; j++) {
      const Installed r = Install(this, d, ord[j]);
      if (r == Installed::kMismatch) decision = kFailed;
      if (r != Installed::kYes) {
        all = false;
        break;
      }
    }
    if (all) {
      // Every descriptor pointer durable before the commit point.
      FlushTargets(this, d, ord, n);
      Fence();
    }
    uint64_t expect = kUndecided;
    if (decision == kSucceeded) {
      committed = Cas(&h->status, &expect, kSucceeded | kDirtyBit, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    } else {
      pmwcas_hooks::At(pmwcas_hooks::Point::kDecidingFailed, nullptr);
      // Never persisted: recovery reads undecided as failed.
      CasVolatile(&h->status, &expect, kFailed, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    }
    st = committed ? (kSucceeded | kDirtyBit) : LoadStatus(h);
  }
  if (st & kDirtyBit) {
    // The commit point: succeeded is durable before any final value is
    // stored. The thread whose CAS stored it persists it even if another
    // thread has persisted and cleaned it meanwhile (st is then its own
    // store, not a reload), so the commit's durability never rests on a
    // flush by a thread that merely saw the value.
    if (!PMINDEX_FAULT("pmwcas.skip_status_persist")) Flush(&h->status, 8);
    Fence();
    uint64_t cur = st;
    CasVolatile(&h->status, &cur, st & ~kDirtyBit);
  }
  Finalize(this, d, st & kStateMask);
  return st & kStateMask;
}

// ---- Op -------------------------------------------------------------------

PMwCAS::Op::Op(Op&& o) noexcept { *this = std::move(o); }

PMwCAS::Op& PMwCAS::Op::operator=(Op&& o) noexcept {
  if (this != &o) {
    Abandon();
    s_ = o.s_;
    desc_ = o.desc_;
    count_ = o.count_;
    undecided_persisted_ = o.undecided_persisted_;
    error_ = std::move(o.error_);
    o.s_ = nullptr;
    o.count_ = 0;
  }
  return *this;
}

Status PMwCAS::Op::Fail(Status s) {
  if (error_.ok()) error_ = s;
  return s;
}

namespace {
bool TargetOk(const Pool* pool, const void* addr) {
  if (!pool->Contains(addr) || (reinterpret_cast<uintptr_t>(addr) & 7) != 0) return false;
  const uint64_t off = pool->OffsetOf(addr);
  return off == layout::kRootSlotOffset || off >= layout::kHeapOffset;
}
}  // namespace

Status PMwCAS::Op::AddWord(uint64_t* addr, uint64_t expected, uint64_t desired, Recycle policy) {
  if (!s_) return Status::InvalidArgument("PMwCAS operation not begun (call PMwCAS::Begin)");
  if (count_ >= s_->max_words)
    return Fail(Status::InvalidArgument("PMwCAS operation has more than " + std::to_string(s_->max_words) +
                                        " target words (the pool's pmwcas_max_words)"));
  if (!TargetOk(s_->pool, addr))
    return Fail(Status::InvalidArgument("PMwCAS target word is not an 8-byte aligned word in the pool's heap"));
  if (!pmwcas::IsValue(expected) || !pmwcas::IsValue(desired))
    return Fail(Status::InvalidArgument("PMwCAS values must leave the top 3 bits (reserved) clear"));
  if (policy != Recycle::kNone && policy != Recycle::kFreeOldOnSuccess)
    return Fail(Status::InvalidArgument("PMwCAS AddWord takes Recycle::kNone or kFreeOldOnSuccess (fresh blocks: AddAllocation)"));
  const uint64_t off = s_->pool->OffsetOf(addr);
  Entry* es = s_->Entries(desc_);
  for (uint32_t i = 0; i < count_; i++)
    if (es[i].addr == off) return Fail(Status::InvalidArgument("PMwCAS target word added twice (offset " + std::to_string(off) + ")"));
  // (Whether `expected` is an allocated block is not checked: a stale value
  // read concurrently may have been freed meanwhile; the operation then
  // fails and frees nothing.)
  if (policy == Recycle::kFreeOldOnSuccess && expected == 0)
    return Fail(Status::InvalidArgument("Recycle::kFreeOldOnSuccess: the expected value is null, not a block"));
  Entry* e = &es[count_];
  // Policy first (H2: a fresh-block policy never pairs with a stale value).
  Store(&e->policy, uint64_t(policy));
  Store(&e->addr, off);
  Store(&e->old_value, expected);
  Store(&e->new_value, desired);
  count_++;
  return Status::OK();
}

Status PMwCAS::Op::AddAllocation(uint64_t* addr, uint64_t expected, size_t size, void** block, Recycle policy) {
  if (!s_) return Status::InvalidArgument("PMwCAS operation not begun (call PMwCAS::Begin)");
  if (count_ >= s_->max_words)
    return Fail(Status::InvalidArgument("PMwCAS operation has more than " + std::to_string(s_->max_words) +
                                        " target words (the pool's pmwcas_max_words)"));
  if (!TargetOk(s_->pool, addr))
    return Fail(Status::InvalidArgument("PMwCAS target word is not an 8-byte aligned word in the pool's heap"));
  if (!pmwcas::IsValue(expected)) return Fail(Status::InvalidArgument("PMwCAS values must leave the top 3 bits (reserved) clear"));
  if (policy != Recycle::kFreeNewOnFailure && policy != Recycle::kFreeOldOnSuccessNewOnFailure)
    return Fail(Status::InvalidArgument("PMwCAS AddAllocation takes Recycle::kFreeNewOnFailure or kFreeOldOnSuccessNewOnFailure"));
  const uint64_t off = s_->pool->OffsetOf(addr);
  Header* h = s_->Desc(desc_);
  Entry* es = s_->Entries(desc_);
  for (uint32_t i = 0; i < count_; i++)
    if (es[i].addr == off) return Fail(Status::InvalidArgument("PMwCAS target word added twice (offset " + std::to_string(off) + ")"));
  if (policy == Recycle::kFreeOldOnSuccessNewOnFailure && expected == 0)
    return Fail(Status::InvalidArgument("Recycle::kFreeOldOnSuccess: the expected value is null, not a block"));
  Entry* e = &es[count_];
  // new = 0 before the policy (H2), then the descriptor is made durable as
  // undecided and covering this entry before the allocation commits into
  // e->new_value: a crash at any instant after that commit finds the block
  // owned by an undecided descriptor, which recovery frees.
  Store(&e->new_value, uint64_t(0));
  Store(&e->policy, uint64_t(policy));
  Store(&e->addr, off);
  Store(&e->old_value, expected);
  Store(&h->count, uint64_t(count_ + 1));
  StoreAtomic(&h->status, kUndecided);
  if (!PMINDEX_FAULT("pmwcas.skip_descriptor_persist")) {
    Flush(h, sizeof(Header));
    Flush(e, sizeof(Entry));
  }
  Fence();
  undecided_persisted_ = true;
  Status st = s_->pool->allocator().Allocate(&e->new_value, size);
  if (!st.ok()) return st;  // e->new_value stays 0: the entry is dropped
  count_++;
  *block = s_->base + e->new_value;
  return Status::OK();
}

Status PMwCAS::Op::Execute(bool* succeeded) {
  *succeeded = false;
  if (!s_) return Status::InvalidArgument("PMwCAS operation not begun (call PMwCAS::Begin)");
  if (!error_.ok()) {
    Status e = error_;
    Abandon();
    return e;
  }
  if (count_ == 0) {
    Abandon();
    return Status::InvalidArgument("PMwCAS operation with no target word");
  }
  State* s = s_;
  const uint32_t d = desc_;
  Header* h = s->Desc(d);
  Entry* es = s->Entries(d);
  uint8_t* ord = &s->order[size_t(d) * s->max_words];
  std::iota(ord, ord + count_, uint8_t(0));
  std::sort(ord, ord + count_, [&](uint8_t a, uint8_t b) { return es[a].addr < es[b].addr; });
  // Phase 1: the descriptor durable before any target can point to it.
  Store(&h->count, uint64_t(count_));
  StoreAtomic(&h->status, kUndecided);
  if (!PMINDEX_FAULT("pmwcas.skip_descriptor_persist")) Flush(h, sizeof(Header) + size_t(count_) * sizeof(Entry));
  Fence();
  uint64_t result;
  {
    internal::EpochManager::Guard g(s->epoch);
    result = s->Help(d);
  }
  *succeeded = result == kSucceeded;
  s_ = nullptr;
  count_ = 0;
  s->Retire(d);
  return Status::OK();
}

void PMwCAS::Op::Abandon() {
  if (!s_) return;
  State* s = s_;
  s_ = nullptr;
  count_ = 0;
  error_ = Status::OK();
  // Never published: no grace period needed.
  if (undecided_persisted_) s->Recycle(desc_);
  undecided_persisted_ = false;
  s->PutFree(desc_);
}

// ---- PMwCAS ----------------------------------------------------------------

PMwCAS::PMwCAS() : s_(std::make_unique<State>()) { s_->Register(); }

PMwCAS::~PMwCAS() {
  s_->Unregister();  // no thread exit hands a cache back from here on
  s_->ReclaimEverywhere(/*all=*/true);
}

PMwCAS::Guard::Guard(PMwCAS& p) {
  static_assert(sizeof(internal::EpochManager::Guard) <= sizeof(g_));
  new (g_) internal::EpochManager::Guard(p.s_->epoch);
}
PMwCAS::Guard::~Guard() { reinterpret_cast<internal::EpochManager::Guard*>(g_)->~Guard(); }

Status PMwCAS::Begin(Op* op) {
  if (op->valid()) op->Abandon();
  uint32_t d = 0;
  if (!s_->Take(&d))
    return Status::Busy("no free PMwCAS descriptor: all " + std::to_string(s_->count) +
                        " are in preparation or held back by open guards");
  op->s_ = s_.get();
  op->desc_ = d;
  op->count_ = 0;
  op->undecided_persisted_ = false;
  op->error_ = Status::OK();
  return Status::OK();
}

bool PMwCAS::TryBegin(Op* op) {
  if (op->valid()) op->Abandon();
  uint32_t d = 0;
  if (!s_->TakeCached(&d)) return false;
  op->s_ = s_.get();
  op->desc_ = d;
  op->count_ = 0;
  op->undecided_persisted_ = false;
  op->error_ = Status::OK();
  return true;
}

uint64_t PMwCAS::ReadSlow(const uint64_t* addr) {
  uint64_t* w = const_cast<uint64_t*>(addr);
  uint64_t v;
  // Read (pmwcas.h) returned a plain value without a guard. Here the word
  // is read again inside the guard: a pointer read before it may name a
  // descriptor recycled (and reused) since.
  internal::EpochManager::Guard g(s_->epoch);
  for (;;) {
    // A clean value is returned unreported, as by Read's fast path: it is
    // durable by the protocol (docs/pmwcas.md "pmcheck target"); reported,
    // the last load of a helping loop was flagged as an erratum read when
    // the word's line still held another thread's dirty-bit clear or a
    // neighbouring word's store (line-granular lint, 16-thread target line).
    __atomic_load(w, &v, __ATOMIC_ACQUIRE);
    if (pmwcas::IsValue(v)) return v;
    PMINDEX_OBSERVE(OnLoad(w, sizeof(v)));  // acted on below: helping, persisting
    if (v & (kRdcssBit | kDescriptorBit)) {
      // Flush-on-read for pointers too: the pointer may not be durable yet,
      // and what this thread persists next (helping) depends on it.
      Flush(w, 8);
      Fence();
    }
    if (v & kRdcssBit) {
      if (!s_->CompleteRdcss(w, v)) return v & kValueMask;
      continue;
    }
    if (v & kDescriptorBit) {
      uint32_t d;
      if (!s_->DecodeDesc(v, &d)) return v & kValueMask;
      s_->Help(d);
      continue;
    }
    s_->PersistAndClear(w, v);
    return v & kValueMask;
  }
}

uint32_t PMwCAS::max_words() const { return s_->max_words; }
uint32_t PMwCAS::descriptor_count() const { return s_->count; }
void PMwCAS::Reclaim() { s_->ReclaimEverywhere(false); }
const PMwCAS::RecoveryStats& PMwCAS::recovery_stats() const { return s_->stats; }

}  // namespace pmindex::pm
