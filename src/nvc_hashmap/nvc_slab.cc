// nvc_slab.cc: node memory of the NVC-Hashmap: index-owned node slabs and
// the epoch-based reclamation of removed nodes and replaced value records.
//
// Paper: not in Schwalb et al. (IMDM'15 allocates every node from the PM
// allocator); docs/nvc_hashmap.md, "Node slabs" and "Concurrency".
//
// Node slabs (node_alloc=slab, the default): nodes of <= 256 bytes are slots
// of 32 KiB slabs (nvc_format.h) in a persistent list from root.slab_head.
// The only allocator transaction is a slab's. A slot's ownership is
// reachability: a slot is in use iff a durable link points to it. Free slots
// live only in DRAM (per-thread lists, used by the thread owning the slot,
// and a shared list under slab_mu_) and are rebuilt on open: from the slab
// bitmaps written at a clean close, or by the recovery walk after a crash
// (every unreachable slot is free); a slab with no slot in use goes back to
// the allocator then. Larger nodes, and all nodes with
// node_alloc=allocator, are allocator blocks (pending-slot protocol).
//
// Reclamation: a node or value record is retired by the operation that
// unlinked (replaced) it, after that was persisted, into its thread slot's
// retire list; every kRetireBatch retirements the slot's owner stamps the
// new ones with one epoch advance and frees those whose grace period passed
// (every operation that was active when they were stamped has ended).
// Allocator blocks are freed through the slot's scratch word; slab slots go
// back to the DRAM free lists (their PM contents stay until reuse).
//
// Invariants: every slab slot is exactly one of reachable, free (in a DRAM
// list) or retired (Check verifies it); a slab's bitmap is valid only after
// a clean close.
//
// Persist order: new slab: allocate into root.slab_pending -> write and
// persist its header -> root.slab_head = slab, persist -> clear
// root.slab_pending, persist. Clean close: every slab's bitmap, one fence.
// A crash after the allocation leaves the slab in slab_pending or in the
// list; recovery frees a pending slab that is not in the list. Empty slab
// (at open): its predecessor's next (or root.slab_head) skips it, persisted
// -> freed through root.scratch; a crash in between leaves a block nothing
// owns, which recovery frees.
//
// Thread safety: SlabAlloc/SlabFree on a thread's own SlotState; the shared
// list, the slab index and new slabs under slab_mu_; retire lists under
// their slot's limbo_mu. LoadSlabs and WriteSlabBitmaps are single-threaded
// (open, close).
#include <algorithm>
#include <map>
#include <vector>

#include "nvc_hashmap/nvc_map.h"
namespace pmindex::internal::nvc {

// Epoch-based reclamation (kit/epoch.h): see the file comment.

void NvcHashmap::Retire(const Ctx& c, uint64_t off, bool node) {
  {
    std::lock_guard<std::mutex> g(c.st->limbo_mu);
    c.st->limbo.Add({off, node});
    if (c.st->limbo.size() % kRetireBatch != 0) return;
  }
  Reclaim(c.slot, false);
}

bool NvcHashmap::FreeRetired(SlotState* st, PSlot* ps, const Retired& r) {
  pm::Allocator& a = pool_->allocator();
  bool freed = false;
  if (r.node) {
    const Node* n = reinterpret_cast<const Node*>(base_ + r.off);
    const uint64_t v = LoadW(&n->value);
    if (HasRecord(n, v)) {
      pm::StoreAtomic(&ps->scratch, v);
      a.FreeOrAbort(&ps->scratch);
      freed = true;
    }
    if (IsSlabNode(n)) {
      // Unlinked durably (before Retire): unreachable, hence free. Its PM
      // contents stay as they are until the slot is reused.
      SlabFree(st, r.off, SlabClassOf(n));
      return freed;
    }
  }
  pm::StoreAtomic(&ps->scratch, r.off);
  a.FreeOrAbort(&ps->scratch);
  return true;
}

// Node slabs.

// Refills this thread's empty free list of class cls: a batch from the
// shared list, else a new slab (on PoolFull, after freeing what this thread
// retired). OK means the list is not empty.
Status NvcHashmap::SlabRefill(const Ctx& c, int cls) {
  auto& mine = c.st->free_nodes[cls];
  std::lock_guard<std::mutex> g(slab_mu_);
  auto& g_free = gfree_[cls];
  const size_t take = std::min<size_t>(g_free.size(), 256);
  mine.insert(mine.end(), g_free.end() - take, g_free.end());
  g_free.resize(g_free.size() - take);
  if (mine.empty()) {
    Status s = NewSlab(cls, &mine);
    if (s.IsPoolFull()) {
      // Free what this thread retired, then try again: its slab slots may
      // be of another class, its allocator blocks make room for a slab, and
      // other threads may have shared free slots meanwhile.
      g_slab_refill_retries.fetch_add(1, std::memory_order_relaxed);
      slab_mu_.unlock();
      const bool got = ReclaimForSpace(c);
      slab_mu_.lock();
      const size_t more = std::min<size_t>(g_free.size(), 256);
      mine.insert(mine.end(), g_free.end() - more, g_free.end());
      g_free.resize(g_free.size() - more);
      if (!mine.empty()) s = Status::OK();
      else if (got) s = NewSlab(cls, &mine);
    }
    if (!s.ok()) return s;
  }
  return Status::OK();
}

void NvcHashmap::SlabFree(SlotState* st, uint64_t off, int cls) {
  auto& mine = st->free_nodes[cls];
  mine.push_back(off);
  if (mine.size() >= kLocalFreeMax) {
    std::lock_guard<std::mutex> g(slab_mu_);
    gfree_[cls].insert(gfree_[cls].end(), mine.begin() + kLocalFreeMax / 2, mine.end());
    mine.resize(kLocalFreeMax / 2);
  }
}

// Allocates a slab (caller holds slab_mu_): allocate into root.slab_pending,
// write and persist the header, link it at the head of the slab list,
// persist, clear slab_pending. Recovery frees a pending slab that is not in
// the list. All its slots go to *out.
Status NvcHashmap::NewSlab(int cls, std::vector<uint64_t>* out) {
  pm::Allocator& a = pool_->allocator();
  PMINDEX_RETURN_IF_ERROR(a.Allocate(&root_->slab_pending, kSlabSize));
  const uint64_t off = root_->slab_pending;
  SlabHdr* hdr = reinterpret_cast<SlabHdr*>(base_ + off);
  const uint64_t n = (kSlabSize - kSlabHeader) / kClassSize[cls];
  SlabHdr h{};
  h.next = root_->slab_head;
  h.cls = uint64_t(cls);
  h.nslots = n;
  h.magic = kSlabMagic;
  pm::Copy(hdr, &h, sizeof(h));
  pm::Persist(hdr, sizeof(h));
  pm::StoreAtomic(&root_->slab_head, off);
  pm::Persist(&root_->slab_head, 8);
  pm::StoreAtomic(&root_->slab_pending, uint64_t(0));
  pm::Persist(&root_->slab_pending, 8);
  slab_cls_[off] = cls;
  for (uint64_t i = n; i-- > 0;) out->push_back(SlabSlot(off, cls, i));
  return Status::OK();
}

// Unlinks and frees the slabs `empty` selects (open).
// Persist order: the predecessor's next word (or root.slab_head) skips the
// slab, persisted -> the slab freed through root.scratch (an allocator
// transaction). A crash in between leaves an allocated block that nothing
// owns, which the next recovery frees.
void NvcHashmap::FreeEmptySlabs(const std::function<bool(uint64_t, const SlabHdr*)>& empty) {
  // Fault nvc.open.skip_empty_slab_unlink: the slab is freed but stays in
  // the list.
  const bool skip_unlink = PMINDEX_FAULT("nvc.open.skip_empty_slab_unlink");
  uint64_t* pw = &root_->slab_head;
  for (uint64_t off = *pw; off;) {
    SlabHdr* h = reinterpret_cast<SlabHdr*>(base_ + off);
    const uint64_t next = h->next;
    if (!empty(off, h)) {
      pw = &h->next;
      off = next;
      continue;
    }
    if (!skip_unlink) {
      pm::StoreAtomic(pw, next);
      pm::Persist(pw, 8);
    }
    slab_cls_.erase(off);
    pm::StoreAtomic(&root_->scratch, off);
    pool_->allocator().FreeOrAbort(&root_->scratch);
    off = next;
  }
  pm::Fence();
}

// Rebuilds slab_cls_ from the persistent slab list and, if use_bitmaps (open
// after a clean close), the shared free lists from the slabs' bitmaps.
Status NvcHashmap::LoadSlabs(bool use_bitmaps) {
  pm::Allocator& a = pool_->allocator();
  slab_cls_.clear();
  for (auto& g : gfree_) g.clear();
  uint64_t n = 0;
  for (uint64_t off = root_->slab_head; off; off = reinterpret_cast<SlabHdr*>(base_ + off)->next) {
    if (off % 64 || off >= pool_->size() || !a.IsAllocated(off) || a.UsableSize(off) < kSlabSize)
      return Status::Corrupt("nvc_hashmap: slab list points to " + std::to_string(off) + ", not a slab block");
    const SlabHdr* h = reinterpret_cast<SlabHdr*>(base_ + off);
    if (h->magic != kSlabMagic || h->cls >= uint64_t(kNumClasses) ||
        h->nslots != (kSlabSize - kSlabHeader) / kClassSize[h->cls])
      return Status::Corrupt("nvc_hashmap: bad slab header at " + std::to_string(off));
    if (!slab_cls_.emplace(off, int(h->cls)).second || ++n > pool_->size() / kSlabSize)
      return Status::Corrupt("nvc_hashmap: slab list has a cycle");
  }
  if (!use_bitmaps) return Status::OK();
  // After a clean close: a slab whose bitmap says every slot is free goes
  // back to the allocator; the free slots of the others to the free lists.
  auto all_free = [](uint64_t, const SlabHdr* h) {
    for (uint64_t i = 0; i < h->nslots; i++)
      if (!(h->free_bits[i / 64] >> (i % 64) & 1)) return false;
    return true;
  };
  FreeEmptySlabs(all_free);
  for (auto& [off, cls] : slab_cls_) {
    const SlabHdr* h = reinterpret_cast<SlabHdr*>(base_ + off);
    for (uint64_t i = 0; i < h->nslots; i++)
      if (h->free_bits[i / 64] >> (i % 64) & 1) gfree_[cls].push_back(SlabSlot(off, cls, i));
  }
  return Status::OK();
}

// Clean close: record every free slot in its slab's bitmap (every slot that
// is not free is reachable: Close frees all retired nodes first).
void NvcHashmap::WriteSlabBitmaps() {
  std::map<uint64_t, std::vector<uint64_t>> bits;
  for (auto& [off, cls] : slab_cls_) bits[off].assign(16, 0);
  auto mark = [&](uint64_t node) {
    uint64_t slab, idx;
    int cls;
    if (InSlab(node, &slab, &cls, &idx)) bits[slab][idx / 64] |= 1ull << (idx % 64);
  };
  for (int k = 0; k < kNumClasses; k++) {
    for (uint64_t o : gfree_[k]) mark(o);
    for (uint32_t i = 0; i < nslots_; i++)
      for (uint64_t o : slots_[i].free_nodes[k]) mark(o);
  }
  for (auto& [off, b] : bits) {
    SlabHdr* h = reinterpret_cast<SlabHdr*>(base_ + off);
    pm::Copy(h->free_bits, b.data(), sizeof(h->free_bits));
    pm::Flush(h->free_bits, sizeof(h->free_bits));
  }
  pm::Fence();
}

void NvcHashmap::Reclaim(int slot, bool all) {
  SlotState& st = slots_[slot];
  PSlot* ps = PS(slot);
  std::lock_guard<std::mutex> g(st.limbo_mu);
  bool freed = false;
  auto free_one = [&](const Retired& r) { freed |= FreeRetired(&st, ps, r); };
  if (all) st.limbo.ReclaimAll(free_one);
  else st.limbo.Reclaim(*epoch_, free_one);
  // Free leaves its lane clear to the caller's next fence; returning slab
  // slots to the DRAM free lists stores nothing to PM (no fence needed).
  if (freed) pm::Fence();
}

// On PoolFull: free what this thread retired whose grace period passed.
bool NvcHashmap::ReclaimForSpace(const Ctx& c) {
  size_t before;
  {
    std::lock_guard<std::mutex> g(c.st->limbo_mu);
    before = c.st->limbo.size();
  }
  if (before == 0) return false;
  // One pass: it frees the entries stamped by an earlier Reclaim whose stamp
  // is below the smallest announced epoch. The ones it stamps now cannot go
  // in this operation (the caller's own guard announces an epoch <= their
  // stamp), so repeating it would only rescan.
  Reclaim(c.slot, false);
  std::lock_guard<std::mutex> g(c.st->limbo_mu);
  return c.st->limbo.size() < before;
}

}  // namespace pmindex::internal::nvc
