// nvtree/nvtree_format.h: the PM layout of NV-Tree (PiBench, VLDB'20, sec. 3.2
// and figure 3; Yang et al., IEEE TC 2016): the root object and the leaves.
// Only the leaves and the root are in PM (selective consistency); the inner
// nodes live in DRAM (nvtree_inner.h) and are rebuilt at every open.
//
// Leaf (leaf_bytes = 16 + leaf_cap * 24, 64-byte aligned):
//   word 0  count: the number of committed entries (the commit word)
//   word 1  next: pool offset of the right sibling (0: last leaf)
//   then leaf_cap entries of three words {flag, key, value}, appended in
//   order, never rewritten once committed:
//     flag  kInsert (+1) or kDelete (-1, a tombstone)
//     key   the u64 key, or (byte keys) the offset of a kit/pm_block.h block
//     value the u64 value, or (byte values) the offset of a block; 0 in a
//           tombstone
// Invariants of a leaf:
//   - count <= leaf_cap; entries [0, count) are committed, the others are
//     scratch (a crash during an append leaves them half written).
//   - For each key the committed entries alternate +1, -1, +1, ... starting
//     with +1 (an insert only when the key is absent, a tombstone only when
//     present): the last entry of a key decides, and at most one live record
//     per key exists. An update is a tombstone followed by an insert.
//   - Every entry of a key lies in the one leaf whose key range holds it; the
//     ranges follow the leaf list in key order.
//   - Byte keys: a tombstone and an update's insert share the key block of
//     the entry they follow; every other key block and every value block
//     belongs to one entry. Blocks referenced by a leaf belong to that leaf
//     (ForEachOwnedBlock reports each distinct offset once). Scratch words of
//     a leaf with byte keys or values are 0 or blocks of an append that did
//     not commit (recovery frees them): such leaves are allocated zeroed.
//
// Root object (kRootBytes, allocated zeroed into the pool's root slot):
//   line 0  magic, initialized (kit/root_check.h), format, config
//   line 1  head: offset of the first leaf; spare: a leaf kept allocated
//           so that a replacement that frees as much as it allocates (a
//           compaction, a Remove on a full leaf) succeeds in a full pool.
//           The spare moves into the micro-log's `a` by two persisted
//           stores (log.a = spare, then spare = 0); recovery clears a spare
//           that equals log.a or log.b.
//   line 2  the replacement micro-log {link, old, a, b} (nvtree_smo.cc):
//           link = pool offset of the word that points at `old` (head or the
//           left neighbour's next word); a, b own the new leaves until the
//           swap of *link commits the replacement; after it, `old` is owned
//           by the log until it is freed. All zero when no replacement runs.
//
// Format version 1. Thread safety: a layout, no code.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pmindex::internal::nvtree {

inline constexpr uint64_t kMagic = 0x3130454552545e4eull;  // "N^TREE01"
inline constexpr uint32_t kFormat = 1;
inline constexpr uint64_t kInsert = 1;
inline constexpr uint64_t kDelete = ~uint64_t(0);  // -1
inline constexpr uint32_t kLeafHeader = 16;
inline constexpr uint32_t kEntryBytes = 24;
inline constexpr uint32_t kMaxLeafCap = 1024;
inline constexpr uint32_t kMaxPlnCap = 65536;

struct Entry {
  uint64_t flag;
  uint64_t key;
  uint64_t value;
};
static_assert(sizeof(Entry) == kEntryBytes);

struct ReplaceLog {
  uint64_t link;
  uint64_t old;
  uint64_t a;
  uint64_t b;
};

struct Root {
  // line 0
  uint64_t magic;
  uint64_t initialized;
  uint32_t format;
  uint8_t key_kind, value_kind;
  uint16_t pad0;
  uint32_t leaf_cap;    // entries per leaf
  uint32_t pln_cap;     // leaves per parent-of-leaves node (DRAM only; kept for reopen)
  uint32_t max_key, max_value;
  uint32_t leaf_bytes;
  uint32_t pad1;
  uint64_t pad2[2];
  // line 1
  uint64_t head;
  uint64_t spare;
  uint64_t pad3[6];
  // line 2
  ReplaceLog log;
  uint64_t pad4[4];
};
static_assert(sizeof(Root) == 192);
static_assert(offsetof(Root, head) == 64 && offsetof(Root, log) == 128);

inline uint32_t LeafBytes(uint32_t cap) { return kLeafHeader + cap * kEntryBytes; }

}  // namespace pmindex::internal::nvtree
