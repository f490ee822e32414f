// clfbtree_format.h: the on-PM format of the clfB-tree (Kim et al., ACM TOS
// 2018, /work/shared/papers/clfbtree-tos18.md sec. 2 and 4; docs/clfbtree.md,
// "Layout"). Included by the write path, the readers and recovery alike.
//
// The pool's root slot holds a Meta. Every inner node is one 64-byte line in
// the differential encoding of clfbtree_node.h (sec. 2.1). A leaf is either
// an encoded 64-byte line of the same layout (leaf bit set) or an append-only
// leaf of leaf_size bytes (sec. 2.2): `cap` unsorted 16-byte entries {k, v}
// from byte 0, the validity bitmap in the last 8 or 16 bytes (its bit i set:
// entry i is valid; setting or clearing one bit is the commit of an insert
// or a delete). Entries never straddle a cache line.
//
// Keys and values are 8-byte words: the u64 itself, or (byte keys / byte
// values) the pool offset of a {len, bytes} block (kit/pm_block.h). An inner
// node's separator words own their blocks (a copy of the key, never the
// leaf's own block); a leaf's entries own theirs.
//
// Invariants (every crash state, after the open's log replay):
//  - Keys in a node are distinct and, for u64 keys, ascending in an encoded
//    node; keys of a node lie in the range its parent routes to it.
//  - SmoLog: while probe == 0 the log is idle or being filled; newn[i] own
//    nodes and blocks not yet linked, oldn[i] name nodes and blocks that the
//    structure change unlinks. The change is committed iff probe's presence
//    among anchor's children equals expect (anchor 0: Meta::root).
//  - LineLog (method inplace): copy is the image of the one node whose header
//    has the invalid bit, if any node has it.
#pragma once

#include <cstdint>

#include "pmindex/pm/persist.h"

namespace pmindex::internal::clfbtree {

constexpr uint64_t kMagic = 0x0045455254424643ull;  // "CFBTREE"
constexpr uint32_t kVersion = 1;
constexpr int kLogSlots = 48;
constexpr int kMaxDepth = 40;

enum LeafKind : uint8_t { kEncodedLeaf = 0, kAppendLeaf = 1 };
// Parent-update methods (sec. 3, 4.2, 4.1).
enum Method : uint8_t { kAtomic = 0, kInPlace = 1, kShadow = 2 };

struct SmoLog {
  uint64_t anchor;  // node updated in place by the commit (0: Meta::root)
  uint64_t probe;   // 0: not armed
  uint64_t expect;  // 1: committed iff probe is a child of anchor
  uint64_t pad[5];
  uint64_t newn[kLogSlots];
  uint64_t oldn[kLogSlots];
};

struct alignas(64) LineLog {
  uint8_t copy[64];
};

struct Meta {
  uint64_t magic;  // written and persisted last at creation
  uint32_t version;
  uint8_t key_kind, value_kind, leaf_kind, method;
  uint32_t leaf_size;  // bytes of an append leaf (64 for encoded leaves)
  uint8_t emulated;    // method atomic run with the emulated line write
  uint8_t pad0[3];
  uint64_t reserved0[5];
  // line 1
  uint64_t root;  // the 8-byte store that publishes a new root
  uint64_t reserved1[7];
  LineLog linelog;  // line 2
  SmoLog log;       // lines 3..
};
static_assert(sizeof(Meta) % 64 == 0);

// Append leaf geometry: the largest cap with 16*cap + bitmap bytes <= size.
inline uint32_t AppendBitmapWords(uint32_t size) { return size > 1032 ? 2 : 1; }
inline uint32_t AppendCap(uint32_t size) { return (size - 8 * AppendBitmapWords(size)) / 16; }

// Every fault switch (include/pmindex/pm/fault.h) the clfB-tree declares,
// in one place; docs/clfbtree.md "Fault switches" says what each breaks and
// tools/pmcheck/ci.sh checks that each is caught.
inline constexpr const char* kFaultSwitches[] = {
    "clfbtree.append.skip_entry_flush",  "clfbtree.split.skip_leaf_flush",    "clfbtree.smo.skip_arm_persist",
    "clfbtree.inplace.skip_log_persist", "clfbtree.inplace.skip_invalidate", "clfbtree.shadow.skip_node_flush",
};

template <typename T>
inline T Ld(const T* p) {
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
template <typename T>
inline T LdR(const T* p) {
  return __atomic_load_n(p, __ATOMIC_RELAXED);
}

}  // namespace pmindex::internal::clfbtree
