// nvc_buckets.cc: the bucket table of the NVC-Hashmap: segments, lazy
// bucket initialisation, doubling and eager batch initialisation.
//
// Paper: Schwalb et al., IMDM'15, sections 3.1 (buckets are dummies in the
// split-ordered list, initialised lazily after their parent) and 3.3 (3)
// (the bucket table is persistent; bucket 0 is the entry point). A dummy is
// the 8-byte word of its bucket's slot, so initialising a bucket allocates
// nothing (a segment is allocated, zeroed, the first time one of its slots
// is needed). The bucket count is a DRAM value with a durable hint.
//
// Invariants: a slot is 0 (free), claimed (kUnpub: one thread is linking
// it), or published (its dummy is linked and the link is durable); a
// published slot never changes state while the index is open; a bucket is
// linked only after its parent is published, so its dummy goes behind the
// parent's.
//
// Persist order (one bucket, InitBucket): claim the slot (volatile CAS 0 ->
// kUnpub|kEnd) -> write the dummy's word (successor | kUnpub), persist ->
// make the predecessor's link durable (erratum) -> CAS the predecessor's
// word to the bucket link (with kDirty in dirty_bit mode) -> persist it ->
// clear kDirty, publish the slot (volatile; recovery recomputes slot states,
// Close persists the table). A batch (InitBatch) does the same for up to
// kInitChunk buckets with one fence for all dummies and one for all links.
// Segment allocation is an allocator transaction into root.seg[s].
//
// Thread safety: any number of threads; a segment's allocation is under
// seg_mu_, slot claims are CASes, so one thread links each dummy and the
// others start from an ancestor meanwhile (they never wait).
#include <algorithm>

#include "nvc_hashmap/nvc_list.h"
namespace pmindex::internal::nvc {

uint64_t* NvcHashmap::NewSegmentSlot(int s, uint64_t i) {
  char* seg;
  {
    std::lock_guard<std::mutex> g(seg_mu_);
    seg = segs_[s].load(std::memory_order_acquire);
    if (!seg) {
      if (!pool_->allocator().AllocateZeroed(&root_->seg[s], SegSize(s) * kSlotBytes).ok()) return nullptr;
      seg = base_ + root_->seg[s];
      segs_[s].store(seg, std::memory_order_release);
    }
  }
  return reinterpret_cast<uint64_t*>(seg) + i;
}

// The dummy to start a search from when bucket b (of bc) is not published:
// b's, initialised on demand if `init`; otherwise, or if that is not possible now (pool full,
// another thread initialising it), the nearest published ancestor's, which is
// correct (the list is complete) but walks further. Remove and Update pass
// init = false: they never allocate.
//
// On demand, the whole aligned group of kInitChunk buckets around b is
// initialised in one batch (2 fences for up to 16 dummies, instead of 2 for
// b's alone; the eager cursor then skips them). Groups of buckets
// >= kInitChunk have all their parents below the group (parent = b - 2^k,
// 2^k >= kInitChunk).
Start NvcHashmap::StartForSlow(uint64_t b, uint64_t bc, const Ctx& c, bool init) {
  if (init) {
    if (b >= kInitChunk) {
      const uint64_t g = b & ~(kInitChunk - 1);
      InitBatch(g, std::min(kInitChunk, bc - g), c);
      if (uint64_t* d = Published(b)) return Start{d, SoDummy(b)};
    }
    if (uint64_t* d = InitBucket(b, c)) return Start{d, SoDummy(b)};
  }
  while (b) {
    b = ParentBucket(b);
    if (uint64_t* d = Published(b)) return Start{d, SoDummy(b)};
  }
  return Start{BucketSlot(0, false), 0};
}

// Links bucket b's dummy, which lives in its bucket-table slot (no
// allocation). The slot is claimed with a volatile CAS (free -> claimed), so
// one thread writes it; others use an ancestor meanwhile (never wait). The
// slot is published (linked) only after its link is durable.
uint64_t* NvcHashmap::InitBucket(uint64_t b, const Ctx& c) {
  if (b == 0) return BucketSlot(0, false);
  uint64_t* d = BucketSlot(b, true);
  if (!d) return nullptr;
  if (IsPublished(LoadW(d))) return d;
  const uint64_t pb = ParentBucket(b);
  uint64_t* parent = Published(pb);
  if (!parent) parent = InitBucket(pb, c);
  if (!parent) return nullptr;
  uint64_t st = 0;
  if (!ClaimDummy(d, &st)) return IsPublished(st) ? d : nullptr;
  const uint64_t so = SoDummy(b);
  Pos pos;
  for (;;) {
    Search(Start{parent, SoDummy(pb)}, so, Slice(), c, &pos);
    if (pos.found) {  // impossible: only this slot holds bucket b's dummy
      pm::StoreVolatile(d, uint64_t(0));
      return nullptr;
    }
    // The dummy (its word, still unpublished) is durable before it is linked.
    pm::StoreAtomic(d, Succ(pos.curr_raw) | kUnpub);
    pm::Persist(d, kSlotBytes);
    EnsureWordDurable(pos.pp_word, pos.pp_raw);
    EnsureWordDurable(pos.prev_word, pos.curr_raw);  // the link we replace (Put)
    uint64_t exp = pos.curr_raw;
    const uint64_t desired = BucketLink(b) | (dirty_mode() ? kDirty : 0) | KeepUnpub(exp);
    if (!pm::Cas(pos.prev_word, &exp, desired)) continue;
    if (auto hook = g_link_hook.load(std::memory_order_acquire)) hook(Slice());
    pm::Persist(pos.prev_word, 8);
    if (dirty_mode()) ClearDirty(pos.prev_word, desired);
    Publish(d);
    return d;
  }
}

// Called by MaybeGrow every kInitEvery inserts of a thread (ops: the thread's
// insert count). Every 64 inserts of a thread: add the thread's record delta
// to approx_count_ and double the bucket count if the load factor is
// exceeded (approx_count_ lags by less than 64 records per thread). Every kInitEvery inserts:
// initialise the next kInitChunk buckets of the last doubling (a batch costs
// 2 fences in all), so that the new buckets are ready by the next doubling
// (one bucket per insert; the doubling from bc to 2bc comes after
// bc * load_factor more inserts, and inserts also initialise their own
// bucket on demand): finds then start from their own bucket instead of
// walking from an ancestor. A faster rate front-loads the same work (each
// bucket is initialised once either way) into the inserts right after a
// doubling.
void NvcHashmap::MaybeGrowSlow(const Ctx& c, uint64_t ops) {
  if (init_next_.load(std::memory_order_relaxed) < init_end_.load(std::memory_order_relaxed)) {
    const uint64_t b0 = init_next_.fetch_add(kInitChunk, std::memory_order_relaxed);
    const uint64_t end = init_end_.load(std::memory_order_relaxed);
    if (b0 < end) InitBatch(b0, std::min(kInitChunk, end - b0), c);
  }
  if ((ops & 63) != 0) return;
  PushCount(c);
  uint64_t bc = bucket_count_.load(std::memory_order_relaxed);
  const int64_t n = int64_t(base_count_) + approx_count_.load(std::memory_order_relaxed);
  if (bc >= kMaxBuckets || n <= int64_t(bc * lf_)) return;
  if (!bucket_count_.compare_exchange_strong(bc, bc * 2)) return;
  {
    // The new half [bc, 2bc), after what is left of earlier ones.
    std::lock_guard<std::mutex> g(seg_mu_);
    if (init_next_.load(std::memory_order_relaxed) >= init_end_.load(std::memory_order_relaxed))
      init_next_.store(bc, std::memory_order_relaxed);
    init_end_.store(bc * 2, std::memory_order_relaxed);
  }
  // A hint (volatile store): a smaller durable value loses nothing.
  uint64_t cur = pm::LoadRelaxed(&root_->bucket_count);
  while (cur < bc * 2 && !pm::CasVolatile(&root_->bucket_count, &cur, bc * 2)) {
  }
}

// Initialises buckets [b0, b0 + n) that are still free, with InitBucket's
// protocol but batched: write all dummies, persist them (one fence), link
// each (CAS, published with kDirty in dirty_bit mode), persist the links (one
// fence), clear kDirty, publish the slots. A dummy whose parent is not
// published yet, or whose link CAS fails, is left to InitBucket (released or
// finished individually).
void NvcHashmap::InitBatch(uint64_t b0, uint64_t n, const Ctx& c) {
  struct Item {
    uint64_t b;
    uint64_t* d;
    uint64_t desired;  // the link to d
    Pos pos;
  };
  Item items[kInitChunk];
  int k = 0;
  // The searches below are independent: start loading the first node of
  // every parent's chain at once (one miss latency for the batch instead of
  // one per search; the parents' slots are consecutive, hence cached).
  for (uint64_t b = b0; b < b0 + n; b++) {
    if (b == 0) continue;
    const uint64_t* pw = BucketSlot(ParentBucket(b), false);
    const uint64_t v = pw ? LoadW(pw) : 0;
    if (IsPublished(v) && !(v & kBucketLink)) __builtin_prefetch(N(v));
  }
  uintptr_t flushed = 0;  // consecutive buckets share lines (8 slots per line): flush each once
  for (uint64_t b = b0; b < b0 + n && k < int(kInitChunk); b++) {
    if (b == 0) continue;
    auto fail = g_batch_slot_fail_hook.load(std::memory_order_acquire);
    uint64_t* d = fail && fail(b) ? nullptr : BucketSlot(b, true);
    // No slot (pool full while allocating its segment): link the k buckets
    // claimed so far below (returning here would leave them claimed forever).
    if (!d) break;
    if (LoadW(d) != 0) continue;
    const uint64_t pb = ParentBucket(b);
    uint64_t* parent = Published(pb);
    if (!parent) continue;  // left to on-demand initialisation
    uint64_t st = 0;
    if (!ClaimDummy(d, &st)) continue;
    const uint64_t so = SoDummy(b);
    Item& it = items[k++];
    it.b = b;
    it.d = d;
    Search(Start{parent, SoDummy(pb)}, so, Slice(), c, &it.pos);
    if (it.pos.found) {  // impossible: only this slot holds bucket b's dummy
      pm::StoreVolatile(d, uint64_t(0));
      k--;
      continue;
    }
    pm::StoreAtomic(d, Succ(it.pos.curr_raw) | kUnpub);
    if (pm::LineOf(d) != flushed) {
      if (flushed) pm::Flush(reinterpret_cast<const void*>(flushed), pm::kCacheLine);
      flushed = pm::LineOf(d);
    }
  }
  if (flushed) pm::Flush(reinterpret_cast<const void*>(flushed), pm::kCacheLine);
  if (k == 0) return;
  pm::Fence();
  bool linked[kInitChunk];
  for (int i = 0; i < k; i++) {
    Item& it = items[i];
    EnsureWordDurable(it.pos.pp_word, it.pos.pp_raw);
    EnsureWordDurable(it.pos.prev_word, it.pos.curr_raw);  // the link we replace (Put)
    uint64_t exp = it.pos.curr_raw;
    it.desired = BucketLink(it.b) | (dirty_mode() ? kDirty : 0) | KeepUnpub(exp);
    linked[i] = pm::Cas(it.pos.prev_word, &exp, it.desired);
    if (linked[i]) {
      if (auto hook = g_link_hook.load(std::memory_order_acquire)) hook(Slice());
      pm::Flush(it.pos.prev_word, 8);
    }
  }
  pm::Fence();
  for (int i = 0; i < k; i++) {
    Item& it = items[i];
    if (linked[i]) {
      if (dirty_mode()) ClearDirty(it.pos.prev_word, it.desired);
      Publish(it.d);
    } else {
      // The list changed under us: release the claim; InitBucket redoes it.
      pm::StoreVolatile(it.d, uint64_t(0));
      InitBucket(it.b, c);
    }
  }
}

}  // namespace pmindex::internal::nvc
