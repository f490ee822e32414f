// nvc_walk.h: the validating walk of the whole split-ordered list, shared
// by Check (nvc_check.cc) and crash recovery (nvc_recovery.cc).
//
// Paper: Schwalb et al., IMDM'15, section 3.3 (5) (recovery walks the list
// from the persistent entry point).
//
// The walk starts at bucket 0's slot and follows links to kEnd (or walks
// one part of the list: WalkRange, from a dummy to another). It trusts
// nothing it reads from PM: every link must name a bucket inside the bucket
// table or an allocated node (a slot of a known slab with matching flags, or
// a 64-byte aligned allocator block); every regular node must have an odd
// split-order key; a link's nonzero tag must be a window of its node's
// split-order key (bucket links, and every link of a pool of a version
// before tags, carry none); keys must increase strictly in (split-order key, key)
// order, which also bounds the walk (a cycle breaks the order); a slab node
// may be reached once; a node's out-of-line value record must be allocated.
// What each caller does per step is a Visitor:
//
//   Status Bad(const std::string& msg)     the Corrupt status to return
//   Status OnWord(uint64_t* w, const Node* prev, uint64_t* raw)
//       each link word as loaded (prev: the node owning it, nullptr for a
//       dummy's word); may rewrite *raw (recovery strips kDirty and marks)
//   Status OnDummy(uint64_t b, uint64_t* slot)   a reachable dummy
//   bool OnMarked(uint64_t* w, Node* n)
//       n (reached through *w) is valid so far; true: the visitor unlinked
//       it (recovery completes a remove) and the walk reloads *w
//   Status OnNode(Node* n, uint64_t off, bool in_slab, uint64_t value_word)
//       a reachable, validated regular node
//
// Persist order: none of its own (a visitor that stores flushes, and fences
// after the walk).
//
// Thread safety: needs quiescence (open, or Check with no operation in
// flight). Walks of disjoint parts may run at once with a visitor each
// (recovery): a part stores only to the link words it walks.
#pragma once

#include <string>

#include "nvc_hashmap/nvc_map.h"

namespace pmindex::internal::nvc {

template <class Visitor>
Status NvcHashmap::WalkList(Visitor& v, SlabBits* live_slab, uint64_t* nlive, const WalkRange& range) {
  pm::Allocator& a = pool_->allocator();
  const uint64_t psize = pool_->size();
  uint64_t* pw = BucketSlot(range.start, false);  // the word we stand on (the head or a published dummy: checked by the callers)
  const Node* prev = nullptr;                     // the regular node we stand on (nullptr: a dummy)
  uint64_t prev_so = SoDummy(range.start);
  for (;;) {
    uint64_t raw = LoadW(pw);
    PMINDEX_RETURN_IF_ERROR(v.OnWord(pw, prev, &raw));
    if (raw & kBucketLink) {
      if (raw & kTagMask) return v.Bad("bucket link after split-order key " + std::to_string(prev_so) + " carries a tag");
      const uint64_t b = LinkBucket(raw);
      if (b == 0) return Status::OK();  // kEnd
      uint64_t* w = b < kMaxBuckets ? BucketSlot(b, false) : nullptr;
      if (!w) return v.Bad("link to bucket " + std::to_string(b) + " outside the bucket table");
      if (prev_so >= SoDummy(b)) return v.Bad("split order violated at bucket " + std::to_string(b) + "'s dummy");
      PMINDEX_RETURN_IF_ERROR(v.OnDummy(b, w));
      if (b == range.stop) {
        *range.stopped = true;
        return Status::OK();
      }
      pw = w;
      prev = nullptr;
      prev_so = SoDummy(b);
      continue;
    }
    Node* n = N(raw);
    if (!n) return v.Bad("null link (0) after split-order key " + std::to_string(prev_so));
    const uint64_t off = Off(n);
    int cl = 0;
    uint64_t sl = 0, ix = 0;
    const bool in_slab = InSlab(off, &sl, &cl, &ix);
    if (in_slab) {
      if (!IsSlabNode(n) || SlabClassOf(n) != cl) return v.Bad("slab node " + std::to_string(off) + " has wrong flags");
    } else if (off % 64 || off >= psize || !a.IsAllocated(off) || IsSlabNode(n)) {
      return v.Bad("next pointer " + std::to_string(off) + " after split-order key " + std::to_string(prev_so) +
                   " does not point to an allocated node");
    }
    if (!(n->so & 1)) return v.Bad("regular node " + std::to_string(off) + " has a dummy's split-order key");
    if ((raw & kTagMask) && (!tag_mask_ || !TagMatches(raw, n->so)))
      return v.Bad("the link to node " + std::to_string(off) + " carries tag " + std::to_string(raw >> kTagShift) +
                   (tag_mask_ ? ", not a window of its split-order key " + std::to_string(n->so)
                              : " in a pool of a version without tags"));
    if (v.OnMarked(pw, n)) continue;
    if (prev_so > n->so) return v.Bad("split order violated at node " + std::to_string(off));
    if (prev_so == n->so && (!prev || Cmp(prev, n->so, NodeKey(n)) >= 0))
      return v.Bad("duplicate or unordered keys at node " + std::to_string(off));
    if (in_slab && !live_slab->Set(sl, ix)) return v.Bad("slab node " + std::to_string(off) + " reached twice");
    if (in_slab) ++*nlive;
    const uint64_t value_word = LoadW(&n->value);
    if (HasRecord(n, value_word) && (value_word >= psize || !a.IsAllocated(value_word)))
      return v.Bad("value record of node " + std::to_string(off) + " not allocated");
    PMINDEX_RETURN_IF_ERROR(v.OnNode(n, off, in_slab, value_word));
    pw = &n->next;
    prev = n;
    prev_so = n->so;
  }
}

}  // namespace pmindex::internal::nvc
