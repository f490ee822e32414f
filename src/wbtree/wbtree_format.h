// wbtree_format.h: the on-PM format of wBTree, the write-atomic B+-tree
// (Chen & Jin, VLDB'15, as evaluated by PiBench: Lersch et al., VLDB'20,
// /work/shared/papers/pibench-evaluation-vldb20.md sec. 3.1 and fig. 2c;
// docs/wbtree.md, "Layout"). Included by the write path, the readers and
// recovery alike; the folder reads top-down from this file.
//
// The whole tree lives in PM. The pool's root slot holds a Meta; every node,
// inner or leaf, is a Node header (two cache lines) followed by `cap`
// 16-byte entries, unsorted:
//
//   line 0 +0  bitmap    bit i set: entry i is valid (the commit word)
//          +8  next      right sibling on the same level (0: rightmost)
//          +16 level     0 = leaf | +20 cap (entries of this node)
//          +24 spare_a   owns a key block in flight (byte keys)
//          +32 spare_b   owns a value block in flight / to free
//          +40 leftmost  inner: the child below the first key
//   line 1 +64 slots     slots[0] = count, slots[1..count] = indices of the
//                        valid entries in ascending key order
//   +128 entry i = {k, v}: k the u64 key or the offset of a key block
//        (kit/pm_block.h); v in a leaf the u64 value or a value block, in an
//        inner node the child holding keys >= k.
//
// With the count in byte 0 the slot array holds 63 indices in one line, so
// a node holds at most 63 entries (kMaxCap). The paper keeps one bitmap bit
// as the slot array's validity flag; this format has none: a slot array is
// valid iff it is consistent with the bitmap (Consistent, wbtree_node.h),
// which every torn write of it fails (docs/wbtree.md, "Why no validity
// bit").
//
// Invariants (every crash state, after the open's log replay):
//  - Only valid entries own blocks; a stale k/v word of an invalid entry is
//    garbage. spare_a / spare_b own a block unless a valid entry of the same
//    node holds the same offset (then they are a stale reference), repaired
//    on the node's first touch after open.
//  - Keys in a node are distinct; keys of a node lie in the range its parent
//    routes to it; the sibling chain of each level is in key order.
//  - A Meta::logs[l] with new_node != 0 owns that node until it is linked
//    (old_node's next == new_node); Meta::spare_root owns a root being built
//    until Meta::root points at it; Meta::free_leaf owns an empty leaf
//    being freed (recovery finishes its unlink and frees it).
// Thread-safety: a layout with no code that runs concurrently; writers
// hold the node's lock, readers are lock-free (docs/wbtree.md).
#pragma once

#include <cstdint>

#include "pmindex/pm/persist.h"

namespace pmindex::internal::wbtree {

#define PMINDEX_WBTREE_HIDDEN __attribute__((visibility("hidden")))

constexpr uint64_t kMagic = 0x0045455254425757ull;  // "WWBTREE"
constexpr uint32_t kVersion = 1;
constexpr uint32_t kMaxCap = 63;
// wbtree_slot: the count and seven one-byte indices fill slot word 0,
// which is then the node's commit word (no bitmap).
constexpr uint32_t kMaxSlotOnlyCap = 7;
constexpr int kMaxLevels = 32;

// One split in flight at level l (FPTree-style micro-log, PiBench sec. 4):
// old_node is being split into itself and new_node. trim is old_node's
// bitmap after the split; mid (inner splits, byte keys) the key block of the
// entry that moves up, owned by the log once the trim is done.
struct SplitLog {
  uint64_t old_node, new_node, trim, mid;
};
static_assert(sizeof(SplitLog) == 32);

struct Meta {
  uint64_t magic;  // written and persisted last at creation
  uint32_t version;
  uint8_t key_kind, value_kind, variant, pad0;  // variant 1: wbtree_slot
  uint32_t leaf_cap, inner_cap;
  uint64_t reserved0[5];
  // line 1
  uint64_t root;        // the 8-byte store that publishes a new root
  uint64_t spare_root;  // owns a root under construction
  // The empty leaf being freed (wbtree_smo.cc, FreeEmptyLeaf): owned by
  // free_leaf once it is out of the sibling chain and its parent;
  // free_prev its left neighbour, free_parent the inner node routing to it.
  uint64_t free_leaf, free_prev, free_parent;
  uint64_t reserved1[3];
  // lines 2..17
  SplitLog logs[kMaxLevels];
};
static_assert(sizeof(Meta) == 128 + 32 * kMaxLevels);

struct Entry {
  uint64_t k, v;
};

struct Node {
  uint64_t bitmap;
  uint64_t next;
  uint32_t level;
  uint32_t cap;
  uint64_t spare_a;
  uint64_t spare_b;
  uint64_t leftmost;
  uint64_t pad[2];
  // line 1: the slot array as 8 words (byte 0 of word 0 is the count)
  uint64_t slotw[8];
  Entry* ents() { return reinterpret_cast<Entry*>(reinterpret_cast<char*>(this) + sizeof(Node)); }
  const Entry* ents() const { return reinterpret_cast<const Entry*>(reinterpret_cast<const char*>(this) + sizeof(Node)); }
};
static_assert(sizeof(Node) == 128);

inline uint64_t NodeBytes(uint32_t cap) { return sizeof(Node) + uint64_t(cap) * sizeof(Entry); }
inline uint64_t CapMask(uint32_t cap) { return cap >= 64 ? ~0ull : ((1ull << cap) - 1); }

// Every load of a word a concurrent writer may store is an acquire load;
// every store to PM an atomic store of one aligned word.
template <typename T>
inline T Ld(const T* p) {
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
template <typename T>
inline T LdR(const T* p) {
  return __atomic_load_n(p, __ATOMIC_RELAXED);
}
template <typename T>
inline void St(T* p, T v) {
  pm::StoreAtomic(p, v);
}

}  // namespace pmindex::internal::wbtree
