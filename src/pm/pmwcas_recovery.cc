// PMwCAS: recovery at Pool::Open, and recycling of finished descriptors
// (include/pmindex/pm/pmwcas.h, docs/pmwcas.md "Recovery").
//
// Follows Wang, Levandoski and Larson (ICDE'18) section 4.3, with two
// departures that the public implementation's bugs motivate:
//  * a succeeded descriptor is rolled forward only in words that still hold
//    its descriptor pointer (or its RDCSS pointer, rolled back): a
//    descriptor that finished and whose words were changed again by later
//    operations (even back to the same values) is never replayed;
//  * a block allocated for a target's new value is owned by the descriptor
//    entry from the allocation's commit on (the allocator's
//    allocate-into-destination contract), so the window between allocation
//    and publication leaks nothing.
//
// Recovery (single-threaded, before any index opens):
//   pass 1, every descriptor, every entry below its count: a target word
//     holding this entry's RDCSS pointer gets the old value; one holding the
//     descriptor pointer gets the new value (succeeded) or the old one
//     (undecided, failed); a dirty target word loses its dirty bit; each
//     repaired word is flushed. Fence.
//   pass 2, every descriptor not free: its recycle policies run (succeeded:
//     free old values, drop fresh blocks' ownership; otherwise free fresh
//     blocks), then status = free; free descriptors get their fresh-block
//     fields zeroed (H1). Flush; fence.
// Idempotent: pass 1 only rewrites words that still hold a pointer; frees go
// through Allocator::Free(&field), which zeroes the field durably, so a
// second run frees nothing twice; the status becomes free last.
//
// Recycle (a retired descriptor after its grace period, an abandoned one,
// recovery): frees first (each durable when Free returns), zeroes fresh
// fields, then status = free, flushed and fenced: a crash in between leaves a
// decided descriptor whose policies run again harmlessly (fields already 0).
//
// Thread safety: Recover runs alone. Recycle runs on a descriptor no other
// thread can reach (grace period passed, or never published), from any
// thread (pmwcas_cache.cc decides when).
#include <algorithm>
#include <vector>

#include "pm/layout.h"
#include "pm/pmwcas_internal.h"
#include "pmindex/pm/allocator.h"
#include "pmindex/pm/persist.h"
#include "pmindex/pm/pool.h"

namespace pmindex::pm {

using namespace pmwcas_format;
using pmwcas::kDirtyBit;
using pmwcas::kRdcssBit;

void PMwCAS::State::Recycle(uint32_t d, bool fence) {
  Header* h = Desc(d);
  Entry* es = Entries(d);
  const uint64_t st = __atomic_load_n(&h->status, __ATOMIC_ACQUIRE) & kStateMask;
  const uint32_t n = uint32_t(std::min<uint64_t>(h->count, max_words));
  Allocator& alloc = pool->allocator();
  for (uint32_t i = 0; i < n; i++) {
    Entry* e = &es[i];
    const uint64_t pol = e->policy & kPolicyMask;
    if (st == kSucceeded) {
      if ((pol & kPolicyFreeOld) && e->old_value) alloc.FreeOrAbort(&e->old_value);
      if ((pol & kPolicyFreshNew) && e->new_value) {
        Store(&e->new_value, uint64_t(0));  // the target word owns it now
        Flush(&e->new_value, 8);
      }
    } else if (st != kFree) {
      if ((pol & kPolicyFreshNew) && e->new_value) alloc.FreeOrAbort(&e->new_value);
    } else if ((pol & kPolicyFreshNew) && e->new_value) {
      Store(&e->new_value, uint64_t(0));  // H1: a free descriptor owns nothing
      Flush(&e->new_value, 8);
    }
  }
  if (st != kFree) {
    StoreAtomic(&h->status, kFree);
    Flush(&h->status, 8);
  }
  if (fence) Fence();
}

Status PMwCAS::State::Recover() {
  const uint64_t size = pool->size();
  auto target_ok = [&](uint64_t off) {
    return (off & 7) == 0 && (off == layout::kRootSlotOffset || (off >= layout::kHeapOffset && off + 8 <= size));
  };
  // Pass 1: target words. A free descriptor is skipped: no word points to
  // it (H3), and its entries may be stale.
  for (uint32_t d = 0; d < count; d++) {
    Header* h = Desc(d);
    const uint64_t st = h->status & kStateMask;
    if (st == kFree) continue;
    if (h->count > max_words) return Status::Corrupt("PMwCAS descriptor " + std::to_string(d) + " has an invalid count");
    const uint32_t n = uint32_t(h->count);
    const Entry* es = Entries(d);
    const uint64_t dp = DescPtr(d);
    for (uint32_t i = 0; i < n; i++) {
      const Entry* e = &es[i];
      if (e->policy > kPolicyMask)
        return Status::Corrupt("PMwCAS descriptor " + std::to_string(d) + " has an invalid recycle policy");
      // An undecided descriptor's entries may be stale (a crash while it
      // was persisted): such an entry's word never holds its pointers.
      if (!target_ok(e->addr)) {
        if (st == kUndecided) continue;
        return Status::Corrupt("PMwCAS descriptor " + std::to_string(d) + " targets a word outside the heap");
      }
      uint64_t* w = Target(e);
      const uint64_t v = __atomic_load_n(w, __ATOMIC_ACQUIRE);
      uint32_t rd, ri;
      uint64_t repl;
      if ((v & kRdcssBit) && !(v & pmwcas::kDescriptorBit) && DecodeRdcss(v, &rd, &ri) && rd == d && ri == i)
        repl = e->old_value;
      else if ((v & ~kDirtyBit) == dp)
        repl = st == kSucceeded ? e->new_value : e->old_value;
      else
        continue;  // not ours (a dirty value elsewhere is left to Read)
      if (v & kDirtyBit) stats.dirty_cleared++;
      stats.words_repaired++;
      StoreAtomic(w, repl);
      Flush(w, 8);
    }
    if (st == kSucceeded) stats.rolled_forward++;
    else stats.rolled_back++;
  }
  Fence();
  // Pass 2: recycle policies, then every descriptor free.
  Allocator& alloc = pool->allocator();
  const uint64_t before = alloc.BlocksInUse();
  for (uint32_t d = 0; d < count; d++) {
    Header* h = Desc(d);
    const uint64_t st = h->status & kStateMask;
    if (st == kFree) {
      // H1 for entries beyond the count too: every slot.
      bool any = false;
      Entry* es = Entries(d);
      for (uint32_t i = 0; i < max_words && !any; i++)
        any = (es[i].policy & kPolicyFreshNew) && es[i].new_value;
      if (!any) continue;
      Store(&h->count, uint64_t(max_words));
    }
    Recycle(d);
    if (h->count != 0 && st == kFree) {
      Store(&h->count, uint64_t(0));
      Persist(&h->count, 8);
    }
  }
  const uint64_t after = alloc.BlocksInUse();
  stats.blocks_freed = before > after ? before - after : 0;
  return Status::OK();
}

Status PMwCAS::Open(Pool* pool, uint64_t region_off, uint32_t max_words, uint32_t count, bool fresh, bool read_only,
                    std::unique_ptr<PMwCAS>* out) {
  if (max_words < 1 || max_words > kMaxMaxWords || region_off != layout::kPmwcasRegionOffset ||
      uint64_t(count) * DescriptorSize(max_words) > layout::kPmwcasRegionSize || count == 0)
    return Status::Corrupt("PMwCAS descriptor region has an unsupported geometry");
  std::unique_ptr<PMwCAS> p(new PMwCAS());
  State* s = p->s_.get();
  s->pool = pool;
  s->base = pool->base();
  s->region_off = region_off;
  s->desc_size = DescriptorSize(max_words);
  s->max_words = max_words;
  s->count = count;
  s->read_only = read_only;
  s->order.assign(size_t(count) * max_words, 0);
  if (!fresh && !read_only) PMINDEX_RETURN_IF_ERROR(s->Recover());
  s->free_list.reserve(count);
  for (uint32_t d = count; d-- > 0;) s->free_list.push_back(d);
  // Caches of `batch` (refill) to about 4 * batch (free + retired) per
  // thread: 8 at the default 334 descriptors, 5 at 64 words (91).
  s->batch = std::clamp<uint32_t>(count / 16, 1, 8);
  *out = std::move(p);
  return Status::OK();
}

}  // namespace pmindex::pm
