// nvc_recovery.cc: creation, open, crash recovery and clean close of the
// NVC-Hashmap.
//
// Paper: Schwalb et al., IMDM'15, section 3.3 (5) (recovery: walk the list
// from the entry point, rebuild the volatile state). Beyond the paper,
// recovery also completes removes and reclaims every block the structure
// does not own (the paper leaks them).
//
// Open (LoadRoot) validates the root before reading past its first line
// (block size, magic, version 4 to 7, kinds, segment size, thread slots,
// the head; pools of version 4 to 6 keep their version, 4 and 5 get no link
// tags). After
// a clean close (root.clean == 1) it takes the record count and the slabs'
// free bitmaps as written: O(threads + slabs). Otherwise Recover, in a
// version 7 pool of compact slab nodes, reads the slabs once in address
// order (nvc_scan.cc, RecoverScan) and finds the list's nodes by peeling the
// unreachable ones off the graph of links; in other pools, or if the scan
// finds the image inconsistent, it walks the list once (nvc_walk.h): it strips kDirty, publishes every reachable dummy,
// unlinks marked nodes (their remove had linearized durably), recounts,
// frees the slot of every bucket whose dummy is unreachable, resolves the
// per-thread pending slots (reachable -> clear, else free) and frees every
// allocated block the structure does not own (nodes and value records of
// unfinished operations, nodes waiting for their epoch, replaced records).
// Every unreachable slab slot is free (its next zeroed if it is an unmarked
// link: an insert in flight); a slab with none reachable is freed.
// Its DRAM is bitmaps (per bucket, per slab slot, and per 16 bytes of pool
// for blocks outside slabs), nothing per record. The walk runs on two
// threads (Options::recovery_threads), the list split at bucket 1's dummy
// when that dummy is published (RecoverWalk).
//
// Persist order:
//   create: the root zeroed (allocator) -> configuration and segment 0 ->
//           the initial buckets' dummies linked in split order (the head
//           first), persisted -> root persisted -> magic, persisted.
//   recover: the walk's or the scan's link repairs (flushed) -> fence ->
//           bucket slots reset (flushed) -> fence -> pending slots resolved,
//           unowned blocks freed (allocator transactions) -> fence ->
//           unreachable unmarked slab slots zeroed (flushed) -> fence ->
//           empty slabs unlinked (persisted) and freed, each in turn -> fence.
//   close:  retired blocks freed -> slab bitmaps -> bucket table flushed ->
//           fence -> count, persisted -> clean = 1, persisted.
//
// Thread safety: Create, Open and Close run with no operation in flight;
// Recover's two walkers store to disjoint link words and own their bitmaps.
#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "nvc_hashmap/nvc_walk.h"
namespace pmindex::internal::nvc {

Status NvcHashmap::Close() {
  if (closed_) return Status::OK();
  for (uint32_t i = 0; i < nslots_; i++) Reclaim(int(i), true);
  if (!slab_cls_.empty()) WriteSlabBitmaps();
  // Slot states were published with volatile stores: make them durable so a
  // clean open can trust them.
  for (int s = 0; s < kMaxSegments; s++)
    if (char* seg = segs_[s].load()) pm::Flush(seg, SegSize(s) * kSlotBytes);
  pm::Fence();
  pm::StoreAtomic(&root_->count, Size());
  pm::Persist(&root_->count, 8);
  pm::StoreAtomic(&root_->clean, uint64_t(1));
  pm::Persist(&root_->clean, 8);
  closed_ = true;
  return pool_->Close();
}

std::string NvcHashmap::MaxSizeMessage() const {
  return "nvc_hashmap: pool growth limit " + std::to_string(pool_->max_size()) + " bytes is above " +
         std::to_string(kMaxPoolBytes) + " (link words hold 48-bit offsets)";
}

Status NvcHashmap::InitNew(const Options& o, uint64_t initial_buckets, uint32_t max_threads) {
  if (pool_->max_size() > kMaxPoolBytes) return Status::InvalidArgument(MaxSizeMessage());
  pm::Allocator& a = pool_->allocator();
  PMINDEX_RETURN_IF_ERROR(a.AllocateZeroed(pool_->root_slot(), sizeof(Root)));
  root_ = pool_->root<Root>();
  SetThreadSlots(max_threads);
  // Fault nvc.create.skip_max_threads_persist: the word is stored only after
  // the index is handed out (Finish), and not flushed.
  late_max_threads_ = PMINDEX_FAULT("nvc.create.skip_max_threads_persist") ? max_threads : 0;
  if (!late_max_threads_) pm::Store(&root_->max_threads, uint64_t(max_threads));
  if (max_threads > uint32_t(kRootSlots)) {
    PMINDEX_RETURN_IF_ERROR(a.AllocateZeroed(&root_->xslots, (max_threads - kRootSlots) * sizeof(PSlot)));
    xslots_ = reinterpret_cast<PSlot*>(base_ + root_->xslots);
  }
  kk_ = o.key_kind;
  vk_ = o.value_kind;
  max_key_ = o.max_key_size;
  max_value_ = o.max_value_size;
  compact_ = kk_ == KeyKind::kU64 && vk_ == ValueKind::kU64;
  seg0_ = std::max<uint64_t>(256, initial_buckets);
  log_seg0_ = 63 - __builtin_clzll(seg0_);
  // Formats 5 and 6 (tests of older pools): the same layout; 5 writes links
  // without tags, 6 is recovered by the walk.
  const uint32_t want_version = g_create_version.load(std::memory_order_acquire);
  const uint32_t version = want_version == 5 || want_version == 6 ? want_version : kVersion;
  tag_mask_ = version >= kFirstTagVersion ? kTagMask : 0;
  pm::Store(&root_->version, version);
  pm::Store(&root_->key_kind, uint8_t(kk_));
  pm::Store(&root_->value_kind, uint8_t(vk_));
  pm::Store(&root_->max_key, uint64_t(max_key_));
  pm::Store(&root_->max_value, uint64_t(max_value_));
  pm::Store(&root_->seg0, seg0_);
  pm::Store(&root_->node_alloc, uint64_t(slab_ ? 1 : 0));
  pm::Store(&root_->bucket_count, initial_buckets);
  bucket_count_.store(initial_buckets);
  PMINDEX_RETURN_IF_ERROR(a.AllocateZeroed(&root_->seg[0], seg0_ * kSlotBytes));
  segs_[0].store(base_ + root_->seg[0]);
  // The list is empty: it is exactly the initial buckets' dummies in split
  // order (bucket Reverse(i) is the i-th dummy), all published, ending with
  // kEnd. Bucket 0's slot is the head. One persist pass over the slots; the
  // root's magic, written last, makes them part of the index.
  uint64_t* table = BucketSlot(0, false);
  const int bits = __builtin_ctzll(initial_buckets);
  auto nth = [bits](uint64_t i) { return bits ? Reverse64(i) >> (64 - bits) : 0; };
  for (uint64_t i = 0; i < initial_buckets; i++)
    pm::StoreAtomic(&table[nth(i)], i + 1 < initial_buckets ? BucketLink(nth(i + 1)) : kEnd);
  if (!PMINDEX_FAULT("nvc.create.skip_dummy_persist")) pm::Persist(table, initial_buckets * kSlotBytes);
  pm::Persist(root_, 2 * pm::kCacheLine);
  pm::StoreAtomic(&root_->magic, kMagic);  // the root is valid from here on
  pm::Persist(&root_->magic, 8);
  return Status::OK();
}

Status NvcHashmap::LoadRoot(bool* needs_recovery) {
  if (!root_) return Status::Corrupt("nvc_hashmap: the pool has no root object (creation interrupted?)");
  // The root block must hold a whole Root (magic, segments, thread slots)
  // before any field is read.
  const uint64_t root_off = *pool_->root_slot();
  if (!pool_->allocator().IsAllocated(root_off) || pool_->allocator().UsableSize(root_off) < sizeof(Root))
    return Status::Corrupt("nvc_hashmap: the root block is smaller than the root object (" + std::to_string(sizeof(Root)) +
                           " bytes): not an nvc_hashmap pool of this format");
  if (root_->magic != kMagic) return Status::Corrupt("nvc_hashmap: bad root magic (not an nvc_hashmap pool or creation interrupted)");
  if (root_->version < kOldestReadVersion || root_->version > kVersion)
    return Status::Corrupt("nvc_hashmap: unsupported format version " + std::to_string(root_->version) + " (this build reads versions " +
                           std::to_string(kOldestReadVersion) + " to " + std::to_string(kVersion) +
                           "; version 3 pools may hold any of three incompatible layouts; recreate the pool)");
  // Thread slots: version 4 pools have none beyond the root's (both words 0).
  uint64_t nt = root_->max_threads;
  if (root_->version == 4 && (nt || root_->xslots)) return Status::Corrupt("nvc_hashmap: a version 4 root with thread-slot words set");
  if (nt == 0) nt = kRootSlots;
  if (nt > uint64_t(kMaxThreads)) return Status::Corrupt("nvc_hashmap: bad max_threads " + std::to_string(nt) + " in root");
  if (nt > uint64_t(kRootSlots)) {
    if (!root_->xslots || !pool_->allocator().IsAllocated(root_->xslots) ||
        pool_->allocator().UsableSize(root_->xslots) < (nt - kRootSlots) * sizeof(PSlot))
      return Status::Corrupt("nvc_hashmap: the thread-slot block (root.xslots) is missing or too small");
    xslots_ = reinterpret_cast<PSlot*>(base_ + root_->xslots);
  } else if (root_->xslots) {
    return Status::Corrupt("nvc_hashmap: a thread-slot block with max_threads <= " + std::to_string(kRootSlots));
  }
  SetThreadSlots(uint32_t(nt));
  // Links carry tags from version 6 on; an older pool is written without
  // them and keeps its version.
  tag_mask_ = root_->version >= kFirstTagVersion ? kTagMask : 0;
  if (pool_->max_size() > kMaxPoolBytes) return Status::InvalidArgument(MaxSizeMessage());
  if (root_->key_kind > 1 || root_->value_kind > 1) return Status::Corrupt("nvc_hashmap: bad key/value kind in root");
  kk_ = KeyKind(root_->key_kind);
  vk_ = ValueKind(root_->value_kind);
  compact_ = kk_ == KeyKind::kU64 && vk_ == ValueKind::kU64;
  max_key_ = root_->max_key;
  max_value_ = root_->max_value;
  seg0_ = root_->seg0;
  if (root_->node_alloc > 1) return Status::Corrupt("nvc_hashmap: bad node_alloc in root");
  slab_ = root_->node_alloc == 1;
  if (!slab_ && root_->slab_head) return Status::Corrupt("nvc_hashmap: slabs in a node_alloc=allocator pool");
  if (seg0_ == 0 || (seg0_ & (seg0_ - 1)) || seg0_ > (1ull << 30)) return Status::Corrupt("nvc_hashmap: bad segment size");
  log_seg0_ = 63 - __builtin_clzll(seg0_);
  if (root_->head || !root_->seg[0]) return Status::Corrupt("nvc_hashmap: missing bucket table (or a head block: an older format)");
  for (int s = 0; s < kMaxSegments; s++)
    if (root_->seg[s]) segs_[s].store(base_ + root_->seg[s]);
  if (!IsPublished(*BucketSlot(0, false))) return Status::Corrupt("nvc_hashmap: the list head (bucket 0's slot) is not published");
  uint64_t bc = root_->bucket_count;
  if (bc == 0 || (bc & (bc - 1)) || bc > kMaxBuckets) bc = seg0_;
  bucket_count_.store(bc);
  // After a clean close, buckets of the last doubling may be uninitialised;
  // after a crash any bucket may be (recovery frees every slot whose dummy
  // link was not durable), those below bc / 2 are then initialised on demand
  // by inserts. The cursor re-covers the upper half eagerly (initialised
  // slots are skipped).
  init_next_.store(bc / 2);
  init_end_.store(bc);
  *needs_recovery = root_->clean != 1 || pool_->recovered_from_crash();
  if (!*needs_recovery) {
    PMINDEX_RETURN_IF_ERROR(LoadSlabs(/*use_bitmaps=*/true));
    base_count_ = root_->count;
    // After a clean close every slot's block is linked or freed; a nonzero
    // word is a volatile clear that did not reach PM (DAX): drop it.
    for (uint32_t i = 0; i < nslots_; i++)
      for (uint64_t* w : {&PS(int(i))->pending, &PS(int(i))->pending_val, &PS(int(i))->scratch})
        if (*w) {
          pm::StoreAtomic(w, uint64_t(0));
          pm::Persist(w, 8);
        }
  }
  return Status::OK();
}

// One part of the recovery walk and its findings (the walk's visitor, see
// nvc_walk.h): reachable nodes outside slabs and value records, reachable
// slab slots, reachable dummies, the record count.
struct NvcHashmap::RecoveryPart {
  RecoveryPart(NvcHashmap* map, uint64_t pool_size) : h(map), owned(pool_size) {}
  NvcHashmap* h;
  WalkRange range;
  bool stopped = false;  // the part reached range.stop's dummy
  BlockBits owned;
  bool twice = false;
  BucketSet linked;  // buckets whose dummy is reachable
  uint64_t count = 0;
  SlabBits live_slab;  // reachable slab nodes; every other slot is free
  uint64_t nlive = 0;
  Status status;

  Status Bad(const std::string& m) { return Status::Corrupt("nvc_hashmap recovery: " + m); }
  // The word's owner is live (marked nodes are unlinked before we step on
  // them): kDirty is moot now, and a reachable dummy is published (kUnpub,
  // the mark bit of a dummy's word, cleared).
  Status OnWord(uint64_t* w, const Node*, uint64_t* raw) {
    if (*raw & (kDirty | kMark)) {
      *raw &= ~(kDirty | kMark);
      pm::StoreAtomic(w, *raw);
      pm::Flush(w, 8);
    }
    return Status::OK();
  }
  Status OnDummy(uint64_t b, uint64_t*) {
    linked.Insert(b);
    return Status::OK();
  }
  // A remove reached its linearization point durably: complete it
  // (unlink); the node is freed by the sweep in Recover.
  bool OnMarked(uint64_t* w, Node* n) {
    if (!(n->next & kMark)) return false;
    pm::StoreAtomic(w, Succ(n->next));
    pm::Flush(w, 8);
    return true;
  }
  Status OnNode(Node* n, uint64_t off, bool in_slab, uint64_t value_word) {
    if (!in_slab && !owned.Set(off)) twice = true;
    ++count;
    if (h->HasRecord(n, value_word) && !owned.Set(value_word)) twice = true;
    return Status::OK();
  }
  void Walk() {
    range.stopped = &stopped;
    status = h->WalkList(*this, &live_slab, &nlive, range);
    pm::Fence();  // this thread's repairs are durable before the sweep
  }
};

// Walks the parts, the first on this thread, a second one (if any) on a
// thread of its own. Two parts split the list at bucket 1's dummy: bucket
// 1's split-order key is 100...0, so the dummies of even buckets (and their
// records) come before it, the odd ones after. The split is used only if
// bucket 1's slot is published in PM: a dummy is published only after its
// link was persisted, and dummies are never unlinked, so a published dummy
// is reachable (the first part must reach it: Corrupt otherwise). The parts
// store to disjoint link words.
Status NvcHashmap::RecoverWalk(RecoveryPart* parts, int nparts) {
  std::thread second;
  if (nparts > 1) second = std::thread([&] { parts[1].Walk(); });
  parts[0].Walk();
  if (second.joinable()) second.join();
  for (int i = 0; i < nparts; i++) PMINDEX_RETURN_IF_ERROR(parts[i].status);
  if (nparts > 1 && !parts[0].stopped)
    return Status::Corrupt("nvc_hashmap recovery: bucket 1's dummy is published but not in the list");
  return Status::OK();
}

Status NvcHashmap::Recover() {
  const auto t0 = std::chrono::steady_clock::now();
  pm::Allocator& a = pool_->allocator();
  auto bad = [](const std::string& m) { return Status::Corrupt("nvc_hashmap recovery: " + m); };
  std::vector<uint64_t> owned;  // the structure's own blocks (root, segments, thread slots, slabs)
  owned.push_back(*pool_->root_slot());
  for (int s = 0; s < kMaxSegments; s++)
    if (root_->seg[s]) owned.push_back(root_->seg[s]);
  if (root_->xslots) owned.push_back(root_->xslots);
  PMINDEX_RETURN_IF_ERROR(LoadSlabs(/*use_bitmaps=*/false));
  for (auto& [off, cls] : slab_cls_) owned.push_back(off);
  // Pools of format 7 with compact slab nodes: one sequential pass over the
  // slabs (nvc_scan.cc); otherwise, or if the pass finds the image
  // inconsistent, the walk: one part, or two at once (the list split at
  // bucket 1's dummy, see RecoverWalk), each with its own bitmaps, merged
  // here.
  std::vector<RecoveryPart> parts;
  parts.reserve(2);
  parts.emplace_back(this, pool_->size());
  bool walk = true;
  recovery_scanned_ = false;
  if (compact_ && slab_ && root_->version >= kFirstScanVersion && !g_force_walk.load(std::memory_order_acquire)) {
    PMINDEX_RETURN_IF_ERROR(RecoverScan(&parts[0].live_slab, &parts[0].linked, &parts[0].count, &walk));
    recovery_scanned_ = !walk;
    if (walk) parts[0] = RecoveryPart(this, pool_->size());
  }
  if (walk) {
    const int want = recovery_threads_ > 0 ? recovery_threads_ : int(std::thread::hardware_concurrency());
    const bool split = want >= 2 && IsPublished(*BucketSlot(1, false));
    if (split) {
      parts.emplace_back(this, pool_->size());
      parts[0].range.stop = 1;
      parts[1].range.start = 1;
    }
    PMINDEX_RETURN_IF_ERROR(RecoverWalk(parts.data(), int(parts.size())));
    recovery_walkers_ = int(parts.size());
  }
  RecoveryPart& all = parts[0];
  bool twice = all.twice;
  for (size_t i = 1; i < parts.size(); i++) {
    twice |= parts[i].twice || !all.owned.Merge(parts[i].owned);
    if (!all.live_slab.Merge(parts[i].live_slab)) return bad("a slab node is reached twice");
    all.linked.Merge(parts[i].linked);
    all.count += parts[i].count;
  }
  BlockBits& owned_nodes = all.owned;
  SlabBits& live_slab = all.live_slab;
  BucketSet& linked = all.linked;
  const uint64_t count = all.count;
  std::sort(owned.begin(), owned.end());
  if (std::adjacent_find(owned.begin(), owned.end()) != owned.end()) return bad("a block is owned twice");
  for (uint64_t off : owned)
    if (owned_nodes.Test(off)) twice = true;
  if (twice) return bad("a block is owned twice");
  auto is_owned = [&](uint64_t off) { return owned_nodes.Test(off) || std::binary_search(owned.begin(), owned.end(), off); };
  // Slot states: a reachable dummy is published (its word was cleaned in the
  // walk); every other slot is reset (a claim, or a dummy whose link did not
  // become durable).
  for (int s = 0; s < kMaxSegments; s++) {
    char* seg = segs_[s].load();
    if (!seg) continue;
    for (uint64_t i = 0; i < SegSize(s); i++) {
      uint64_t* d = reinterpret_cast<uint64_t*>(seg) + i;
      const uint64_t b = FirstBucket(s) + i;
      if (*d && b != 0 && !linked.Contains(b)) {
        pm::StoreAtomic(d, uint64_t(0));
        pm::Flush(d, kSlotBytes);
      }
    }
  }
  pm::Fence();
  // Blocks nobody owns: nodes and value records of unfinished inserts and
  // updates (still in a pending slot), removed nodes that waited for their
  // epoch, replaced value records.
  std::vector<uint64_t> unowned;
  a.ForEachAllocated([&](uint64_t off, size_t) {
    if (!is_owned(off)) unowned.push_back(off);
  });
  std::sort(unowned.begin(), unowned.end());
  std::vector<bool> freed(unowned.size(), false);
  // Pending slots: reachable -> clear; unreachable -> free (into the slot).
  auto resolve = [&](uint64_t* w) {
    if (!*w) return;
    auto it = std::lower_bound(unowned.begin(), unowned.end(), *w);
    if (it != unowned.end() && *it == *w && !freed[it - unowned.begin()]) {
      freed[it - unowned.begin()] = true;
      a.FreeOrAbort(w);
    } else {
      pm::StoreAtomic(w, uint64_t(0));
      pm::Persist(w, 8);
    }
  };
  for (uint32_t i = 0; i < nslots_; i++) {
    PSlot& ps = *PS(int(i));
    resolve(&ps.pending);
    resolve(&ps.pending_val);
    resolve(&ps.scratch);
  }
  resolve(&root_->scratch);
  resolve(&root_->slab_pending);
  for (size_t i = 0; i < unowned.size(); i++) {
    if (freed[i]) continue;
    pm::StoreAtomic(&root_->scratch, unowned[i]);
    PMINDEX_RETURN_IF_ERROR(a.Free(&root_->scratch));
  }
  pm::Fence();
  // An unreachable slot whose next is an unmarked link (an insert in flight
  // at the crash) is zeroed (format 7's invariant, nvc_format.h) before its
  // slab may go back to the allocator. Then every unreachable slot is free.
  // Both slot loops visit the unreachable slots only, a bitmap word at a
  // time (a full slab costs 16 word tests, not 1018 bit tests).
  auto for_each_free = [&](uint64_t off, int cls, auto&& fn) {
    const uint64_t n = (kSlabSize - kSlabHeader) / kClassSize[cls];
    const uint64_t* live = live_slab.Words(off);
    for (uint64_t w = 0; w * 64 < n; w++) {
      uint64_t x = live ? ~live[w] : ~uint64_t(0);
      if (n - w * 64 < 64) x &= (uint64_t(1) << (n - w * 64)) - 1;
      for (; x; x &= x - 1) fn(w * 64 + uint64_t(__builtin_ctzll(x)));
    }
  };
  for (auto& [off, cls] : slab_cls_) {
    for_each_free(off, cls, [&, off = off, cls = cls](uint64_t i) {
      uint64_t* next = &reinterpret_cast<Node*>(base_ + SlabSlot(off, cls, i))->next;
      if (*next && !(*next & kMark)) {
        pm::StoreAtomic(next, uint64_t(0));
        pm::Flush(next, 8);
      }
    });
  }
  pm::Fence();
  FreeEmptySlabs([&](uint64_t off, const SlabHdr*) { return live_slab.Empty(off); });
  for (auto& [off, cls] : slab_cls_)
    for_each_free(off, cls, [&, off = off, cls = cls](uint64_t i) { gfree_[cls].push_back(SlabSlot(off, cls, i)); });
  base_count_ = count;
  recovery_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return Status::OK();
}

}  // namespace pmindex::internal::nvc
