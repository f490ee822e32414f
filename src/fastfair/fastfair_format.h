// fastfair_format.h: the on-PM format of the FAST & FAIR B+-tree (Hwang et
// al., FAST'18, /work/shared/papers/fast-fair-fast18.md; docs/fastfair.md,
// "Layout"). Included by the write paths, the readers and recovery alike;
// read this file first, the folder reads top-down from it.
//
// The whole tree lives in PM. The pool's root slot holds a Meta (128 bytes);
// every node, leaf or internal, is `node_size` bytes (a multiple of 64 in
// [256, 8192], 512 by default as in sec. 6.2): a 96-byte header, then
// (node_size - 96) / 16 records.
//
//   Node (512 bytes: 26 records)
//   line 0 +0  sibling     right sibling, 0 if rightmost        | everything a
//          +8  high        fence: keys >= high live right       | split, merge or
//          +16 count       records [0, count) | +20 level       | insert commits
//          +24 sw          switch counter: even insert mode,    | together: one
//                          odd delete mode (reader direction)   | line, one flush
//          +32 spare_node  owns a sibling under construction    |
//          +40 spare_a     owns a key/value block in flight     |
//          +48 spare_b     owns a value block in flight / to free
//          +56 gen         == Meta::gen once repaired in this run
//   line 1 +64 low         lower fence (0 for a leftmost node)
//          +72 leftmost    internal: the child below the first key
//          +80 lk          "left key" of slot 0, equal to no key of the node
//          +88 dead        1 once merged away
//          +96 record 0 (k, v), record 1 (k, v)
//   line 2.. records 2 .. 25, four per line
//
// A record is (k, v): k the u64 key or the offset of a key block
// ([u32 len][bytes]); v in a leaf the inline u64 value or the offset of a
// value block, in an internal node the child holding keys >= k.
//
// Invariants (every crash state; docs/fastfair.md, "FAST"):
//  - Validity rule: a record whose k equals its left neighbour's k (slot 0:
//    the node's lk) is ignored. u64 keys in a node are distinct, key-block
//    offsets are distinct allocations, separators are distinct split keys.
//  - I2: slots count and count+1 (below the capacity) are ignored copies of
//    the left key of slot count.
//  - lk prefix: a leaf may start with free slots holding lk (ignored by the
//    rule; an insert may shift records left into them).
//  - The durable count may lag by the one record a shift was moving
//    (Pushed, fastfair_tree.h); every other slot past it is ignored.
//  - Every allocated block is owned by a persistent word at all times: a
//    record, a fence, a spare word, Meta::spare_root or a retire slot
//    (limbo: unlinked nodes; blocks: unlinked key/value blocks).
// Thread-safety: a layout with no code that runs concurrently; who may
// write each field is said where the field is used (docs/fastfair.md,
// "Concurrency").
#pragma once

#include <cstdint>

#include "kit/retire_list.h"
#include "pmindex/pm/persist.h"

namespace pmindex::internal::fastfair {

// Everything of the tree's headers is internal to libpmindex: hidden
// visibility keeps calls between the folder's files direct (no PLT), as
// within one file.
#define PMINDEX_FASTFAIR_HIDDEN __attribute__((visibility("hidden")))

constexpr uint64_t kMagic = 0x524941465453414Full;  // "OASTFAIR"-ish tag
// The format version this build creates. Version 4 (no Meta::blocks: byte
// blocks freed at once, byte-key and byte-value trees read under leaf
// locks) is opened too; a read-write open raises it to 5 before any
// operation (its Meta::blocks word is 0, an empty list). Versions 1-3 (the
// count fenced on its own, no lk prefixes) are refused at open with
// "unsupported fastfair format version N" (docs/fastfair.md, "Format
// version").
constexpr uint32_t kVersion = 5;
constexpr uint32_t kOldestOpened = 4;
constexpr uint64_t kBytesLk = 1;  // lk of byte-key nodes: never a block offset

struct Meta {
  uint64_t magic;  // written and persisted last at creation
  uint32_t version;
  uint8_t key_kind, value_kind;
  uint16_t pad0;
  uint32_t node_size;
  uint32_t pad1;
  uint64_t gen;  // bumped at every open: nodes with another gen get repaired
  uint64_t reserved[4];
  // line 1
  uint64_t root;        // the 8-byte store that publishes a new root
  uint64_t spare_root;  // owns a new root until it is published
  uint64_t limbo;       // owns kLimboSlots retire slots (kit::RetireSlot), 0 until the first merge
  uint64_t blocks;      // owns kBlockSlots retire slots for key/value blocks (byte trees; 0: none)
  uint64_t reserved2[4];
};
static_assert(sizeof(Meta) == 128);

struct Entry {
  uint64_t k, v;
};

struct Node {
  uint64_t sibling;     // right sibling (0: rightmost)
  uint64_t high;        // fence: keys >= high live right (valid if sibling)
  uint32_t count;       // records [0, count) are live (some maybe ignored)
  uint32_t level;       // 0 = leaf
  uint64_t sw;          // switch counter (scan direction), not needed durable
  uint64_t spare_node;  // owns a sibling under construction
  uint64_t spare_a;     // owns a key block / new value block in flight
  uint64_t spare_b;     // owns a value block in flight / block to free
  uint64_t gen;         // == Meta::gen once repaired in this run
  // line 1
  uint64_t low;       // lower fence (key or key-block offset; 0 for leftmost)
  uint64_t leftmost;  // internal: child below the first key
  uint64_t lk;        // "left key" of slot 0, never equal to a key here
  uint64_t dead;      // 1 once merged away (unlinked; writers that lock it restart)
  Entry* ents() { return reinterpret_cast<Entry*>(reinterpret_cast<char*>(this) + sizeof(Node)); }
};
static_assert(sizeof(Node) == 96);

// Retire slots (Meta::limbo, kit::PmRetireList): a node unlinked by a merge
// (or an old root dropped by a root collapse) is owned by a slot
// {block = r, tag = l} from before its unlink until it is freed after the
// epoch grace period. `tag` names the node whose `sibling` still points at
// r while the merge is not committed (kRootMark: Meta::root still points at
// r); 0 once the unlink is durable.
static_assert(sizeof(kit::RetireSlot) == 16);
constexpr uint32_t kLimboSlots = 1024;
constexpr uint64_t kRootMark = 1;
// Block retire slots (Meta::blocks, a second kit::PmRetireList): a key or
// value block that a Remove or an Update unlinks while lock-free readers
// may still read it is owned by a slot {block = b, tag = leaf} from before
// the commit that unlinks it until it is freed after the epoch grace
// period. `tag` (the leaf's offset) is nonzero while the commit may not be
// durable: recovery then keeps b if a valid record of that leaf still
// references it (the commit did not persist), else frees it; 0 once the
// commit is durable (the slot alone owns b).
constexpr uint32_t kBlockSlots = 1024;
// Records per node at the largest node size (8192 bytes).
constexpr uint32_t kMaxCap = (8192 - sizeof(Node)) / sizeof(Entry);

// Every load of a word a concurrent writer may store is an acquire load;
// every store to PM a release store of one aligned word (pm::StoreAtomic).
template <typename T>
inline T Ld(const T* p) {
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
template <typename T>
inline void St(T* p, T v) {
  pm::StoreAtomic(p, v);
}

}  // namespace pmindex::internal::fastfair
