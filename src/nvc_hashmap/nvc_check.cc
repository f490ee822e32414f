// nvc_check.cc: Check, owned-block enumeration and statistics of the
// NVC-Hashmap.
//
// Paper: none (tooling). Check validates what a durable image and the DRAM
// state must satisfy at quiescence (nvc_format.h and nvc_map.h list the
// invariants): the slab list equals the slab index; the list walk of
// nvc_walk.h, plus per node a key length in range, a split-order key equal
// to SoRegular(hash(key)) and a value length in range, and no reachable node
// marked; every published bucket's dummy is in the list and none is half
// initialised; the record count; every slab slot exactly one of reachable,
// free or retired; no thread slot holding a pending block.
//
// Persist order: none (read-only).
//
// Thread safety: quiescence (no operation in flight); Check and
// ForEachOwnedBlock refuse a closed index.
#include <string>
#include <unordered_set>

#include "nvc_hashmap/nvc_walk.h"
namespace pmindex::internal::nvc {

Status NvcHashmap::ForEachOwnedBlock(const std::function<void(uint64_t)>& fn) {
  if (closed_) return IndexClosed();
  fn(*pool_->root_slot());
  for (int s = 0; s < kMaxSegments; s++)
    if (root_->seg[s]) fn(root_->seg[s]);
  if (root_->xslots) fn(root_->xslots);
  for (uint64_t off = root_->slab_head; off; off = reinterpret_cast<SlabHdr*>(base_ + off)->next) fn(off);
  // Dummies live in the segments; regular nodes outside slabs are blocks.
  for (uint64_t raw = LoadW(BucketSlot(0, false));;) {
    if (raw & kBucketLink) {
      const uint64_t* w = LinkBucket(raw) ? BucketSlot(LinkBucket(raw), false) : nullptr;
      if (!w) break;
      raw = LoadW(w);
      continue;
    }
    Node* n = N(raw);
    if (!n) break;
    if (!IsSlabNode(n)) fn(Off(n));  // slab nodes: the slab is the block
    const uint64_t v = LoadW(&n->value);
    if (HasRecord(n, v)) fn(v);
    raw = LoadW(&n->next);
  }
  for (uint32_t si = 0; si < nslots_; si++) {
    SlotState& st = slots_[si];
    std::lock_guard<std::mutex> g(st.limbo_mu);
    st.limbo.ForEach([&](const Retired& r) {
      if (!r.node || !IsSlabNode(reinterpret_cast<const Node*>(base_ + r.off))) fn(r.off);
      if (r.node) {
        const Node* n = reinterpret_cast<const Node*>(base_ + r.off);
        const uint64_t v = LoadW(&n->value);
        if (HasRecord(n, v)) fn(v);
      }
    });
  }
  return Status::OK();
}

Status NvcHashmap::Check() {
  if (closed_) return IndexClosed();
  pm::Allocator& a = pool_->allocator();
  auto bad = [](const std::string& m) { return Status::Corrupt("nvc_hashmap: " + m); };
  BucketSet dummies;                       // buckets whose dummy is reachable
  SlabBits live_slab;  // reachable slab nodes
  uint64_t nlive = 0;
  uint64_t count = 0;
  {
    // The slab list must equal slab_cls_ (our volatile index of it).
    size_t n = 0;
    for (uint64_t off = root_->slab_head; off; off = reinterpret_cast<SlabHdr*>(base_ + off)->next) {
      if (!slab_cls_.count(off) || ++n > slab_cls_.size()) return bad("slab list disagrees with the slab index");
      if (!a.IsAllocated(off)) return bad("slab " + std::to_string(off) + " not allocated");
    }
    if (n != slab_cls_.size()) return bad("slab list disagrees with the slab index");
  }
  const uint64_t* head = BucketSlot(0, false);
  if (!head || !IsPublished(LoadW(head))) return bad("bucket 0's slot (the list head) is not published");
  struct Visitor {
    NvcHashmap* h;
    BucketSet* dummies;
    uint64_t* count;
    Status Bad(const std::string& m) { return Status::Corrupt("nvc_hashmap: " + m); }
    Status OnWord(uint64_t*, const Node* prev, uint64_t* raw) {
      if (prev && (*raw & kMark)) return Bad("reachable node at " + std::to_string(h->Off(prev)) + " is marked deleted");
      return Status::OK();
    }
    Status OnDummy(uint64_t b, uint64_t* w) {
      if (!IsPublished(LoadW(w))) return Bad("linked dummy of bucket " + std::to_string(b) + " is not published");
      dummies->Insert(b);
      return Status::OK();
    }
    bool OnMarked(uint64_t*, Node*) { return false; }
    Status OnNode(Node* n, uint64_t off, bool, uint64_t value_word) {
      if (h->kk_ == KeyKind::kU64 ? h->KeyLen(n) != 8 : (n->klen == 0 || n->klen > h->max_key_))
        return Bad("bad key length at node " + std::to_string(off));
      if (SoRegular(HashKey(h->kk_, h->NodeKey(n))) != n->so)
        return Bad("node " + std::to_string(off) + " split-order key does not match its key's hash");
      if (h->vk_ == ValueKind::kBytes) {
        uint64_t len;
        std::memcpy(&len, h->base_ + value_word, 8);
        if (len > h->max_value_) return Bad("value length out of range at node " + std::to_string(off));
      }
      ++*count;
      return Status::OK();
    }
  } visitor{this, &dummies, &count};
  PMINDEX_RETURN_IF_ERROR(WalkList(visitor, &live_slab, &nlive));
  // Bucket-table slots: every published (initialised) bucket's dummy is in
  // the list (the converse was checked above); none is half-initialised.
  for (int s = 0; s < kMaxSegments; s++) {
    char* seg = segs_[s].load(std::memory_order_acquire);
    if (!seg) continue;
    for (uint64_t i = 0; i < SegSize(s); i++) {
      const uint64_t b = FirstBucket(s) + i;
      const uint64_t w = LoadW(reinterpret_cast<uint64_t*>(seg) + i);
      if (w == 0 || b == 0) continue;
      if (!IsPublished(w)) return bad("bucket " + std::to_string(b) + " is still being initialised");
      if (!dummies.Contains(b)) return bad("bucket " + std::to_string(b) + " is published but its dummy is not in the list");
    }
  }
  if (count != Size())
    return bad("list holds " + std::to_string(count) + " records but the count says " + std::to_string(Size()));
  // Slab slots: every slot is exactly one of reachable, free, retired (no
  // leak, no slot handed out twice).
  if (!slab_cls_.empty()) {
    SlabBits& seen = live_slab;
    uint64_t nseen = nlive, total = 0;
    for (auto& [off, cls] : slab_cls_) total += (kSlabSize - kSlabHeader) / kClassSize[cls];
    auto add = [&](uint64_t o, const char* what) -> Status {
      uint64_t sl, ix;
      int cl;
      if (!InSlab(o, &sl, &cl, &ix)) return bad(std::string(what) + " slot " + std::to_string(o) + " is not in a slab");
      if (!seen.Set(sl, ix)) return bad(std::string(what) + " slot " + std::to_string(o) + " is also reachable or listed twice");
      ++nseen;
      return Status::OK();
    };
    {
      std::lock_guard<std::mutex> g(slab_mu_);
      for (auto& gl : gfree_)
        for (uint64_t o : gl) PMINDEX_RETURN_IF_ERROR(add(o, "free"));
    }
    for (uint32_t si = 0; si < nslots_; si++) {
    SlotState& st = slots_[si];
      for (auto& fl : st.free_nodes)
        for (uint64_t o : fl) PMINDEX_RETURN_IF_ERROR(add(o, "free"));
      std::lock_guard<std::mutex> g(st.limbo_mu);
      Status rs;
      st.limbo.ForEach([&](const Retired& r) {
        if (rs.ok() && r.node && IsSlabNode(reinterpret_cast<const Node*>(base_ + r.off))) rs = add(r.off, "retired");
      });
      PMINDEX_RETURN_IF_ERROR(rs);
    }
    if (nseen != total)
      return bad("slabs hold " + std::to_string(total) + " slots but only " + std::to_string(nseen) +
                 " are reachable, free or retired (leak)");
  }
  for (uint32_t i = 0; i < nslots_; i++) {
    const PSlot& ps = *PS(int(i));
    if (ps.pending || ps.pending_val || ps.scratch)
      return bad("thread slot " + std::to_string(i) + " holds a pending block after quiescence");
  }
  return Status::OK();
}

IndexStats NvcHashmap::Stats() {
  IndexStats s;
  if (closed_) return s;
  s.records = Size();
  s.pm_bytes = pool_->allocator().BytesInUse();
  s.dram_bytes = sizeof(*this);
  for (uint32_t si = 0; si < nslots_; si++) {
    SlotState& st = slots_[si];
    std::lock_guard<std::mutex> g(st.limbo_mu);
    s.dram_bytes += st.limbo.dram_bytes();
  }
  s.recovery_seconds = recovery_seconds_;
  return s;
}

}  // namespace pmindex::internal::nvc
