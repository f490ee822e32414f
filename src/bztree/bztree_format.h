// bztree/bztree_format.h: BzTree's PM layout (PiBench VLDB'20 sec. 3.3 and
// fig. 4; Arulraj et al., VLDB'18, sec. 3), shared by the write path, the
// structure changes and recovery. docs/bztree.md draws it.
//
// Every node is one PM block of node_size bytes (1 KiB default):
//
//   [0, 8)        status word (PMwCAS target): frozen | record count |
//                 block size | delete size
//   [8, 16)       node word (immutable): node bytes, sorted count, leaf flag
//   [16, 16+8n)   record metadata words (PMwCAS targets), growing forward
//   ...           free space (zero: a reserve expects a zero metadata word)
//   [.., end)     key/payload blocks, growing backward from the end
//
// A record block is the key padded to 8 bytes followed by one 8-byte
// payload word (a PMwCAS target): in a leaf the value (inline) or the
// offset of an out-of-line value block (kit/pm_block.h format); in an inner
// node the child's offset. An inner key of length 0 is +infinity.
//
// Invariants (Check verifies them on a quiescent tree):
//   - the status's count and block size cover every reserved slot and
//     block; 16 + 8 * count + block size <= node bytes;
//   - records [0, sorted) are visible or deleted, sorted by key and
//     unique; [sorted, count) is the unsorted suffix (leaves only; inner
//     nodes are sorted throughout and immutable but for child words);
//   - at most one visible record per key in a leaf;
//   - inner node: child i holds keys in (key[i-1], key[i]], the last key
//     is +infinity, every child word is a node of the level below, and all
//     leaves are at the same depth;
//   - no reachable node is frozen once no structure change is running;
//   - a leaf's u64 values are inline: payload word = low 61 bits, the
//     metadata's high field = top 3 bits (byte values are out of line);
//   - a metadata word with kInFlight holds the index epoch of its reserve
//     in its low 32 bits: once the epoch has moved on (every open bumps it)
//     the slot is dead.
// Persist order and recovery: bztree.cc, bztree_smo.cc, bztree_recovery.cc.
//
// Thread safety: plain definitions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "pmindex/pm/pmwcas.h"

namespace pmindex::internal::bztree {

inline constexpr uint64_t kMagic = 0x45455254207a42ull;  // "Bz TREE"
// 2: u64 values always inline (top 3 bits in the metadata word, which also
// carries a version instead of the record's total length).
inline constexpr uint32_t kFormat = 2;
inline constexpr size_t kNodeHeader = 16;
inline constexpr uint32_t kMinNodeSize = 256;
inline constexpr uint32_t kMaxNodeSize = 1u << 20;  // block size and offsets fit 22 bits
inline constexpr uint32_t kMinPmwcasWords = 12;    // a root split absorbing two children (bztree_smo.cc)

// The index's root object (the pool's root slot owns it).
struct Header {
  uint64_t magic;
  uint64_t initialized;  // 1 once the first leaf is in `tree`
  uint32_t format;
  uint32_t node_size;
  uint8_t key_kind;    // KeyKind
  uint8_t value_kind;  // ValueKind
  uint8_t pad[6];
  uint32_t max_key;
  uint32_t max_value;
  uint64_t epoch;  // bumped and persisted at every open
  uint64_t spare[2];
  alignas(64) uint64_t tree;  // PMwCAS target: the root node
};
static_assert(sizeof(Header) == 128);

// ---- status word: frozen(1) count(16) block size(22) delete size(22)
namespace status {
inline constexpr uint64_t kFrozen = uint64_t(1) << 60;
inline constexpr uint64_t Count(uint64_t s) { return (s >> 44) & 0xffff; }
inline constexpr uint64_t BlockSize(uint64_t s) { return (s >> 22) & 0x3fffff; }
inline constexpr uint64_t DeleteSize(uint64_t s) { return s & 0x3fffff; }
inline constexpr bool Frozen(uint64_t s) { return (s & kFrozen) != 0; }
inline constexpr uint64_t Make(bool frozen, uint64_t count, uint64_t block, uint64_t del) {
  return (frozen ? kFrozen : 0) | (count << 44) | (block << 22) | del;
}
inline constexpr uint64_t kMaxCount = 0xffff;
}  // namespace status

// ---- node word (immutable): node bytes(32) sorted count(16) leaf(8)
namespace nodeword {
inline constexpr uint64_t Make(uint32_t bytes, uint32_t sorted, bool leaf) {
  return uint64_t(bytes) | (uint64_t(sorted) << 32) | (uint64_t(leaf ? 1 : 0) << 48);
}
inline constexpr uint32_t Bytes(uint64_t w) { return uint32_t(w); }
inline constexpr uint32_t Sorted(uint64_t w) { return uint32_t((w >> 32) & 0xffff); }
inline constexpr bool Leaf(uint64_t w) { return ((w >> 48) & 0xff) == 1; }
}  // namespace nodeword

// ---- metadata word: visible(1) in-flight(1) out-of-line(1) | value
// high(3) version(16) key length(16) offset(22); an in-flight word holds the
// epoch instead. A record's block bytes follow from its key length
// (RecordBytes). An inline u64 value is split: its low 61 bits in the
// payload word (a PMwCAS target, whose top 3 bits are PMwCAS's), its top 3
// bits here; an update changes both words in one PMwCAS and bumps the
// version, so a reader that reads the metadata, the payload and the
// metadata again and sees one word twice has a consistent pair.
namespace meta {
inline constexpr uint64_t kVisible = uint64_t(1) << 60;
inline constexpr uint64_t kInFlight = uint64_t(1) << 59;
inline constexpr uint64_t kOutOfLine = uint64_t(1) << 58;
inline constexpr int kHighShift = 54;
inline constexpr uint64_t kHighMask = uint64_t(7) << kHighShift;
inline constexpr int kVersionShift = 38;
inline constexpr uint64_t kVersionMask = uint64_t(0xffff) << kVersionShift;
inline constexpr uint64_t Offset(uint64_t m) { return m & 0x3fffff; }
inline constexpr uint64_t KeyLen(uint64_t m) { return (m >> 22) & 0xffff; }
inline constexpr uint64_t Total(uint64_t m) { return (KeyLen(m) + 7) / 8 * 8 + 8; }
inline constexpr bool Visible(uint64_t m) { return (m & kVisible) != 0; }
inline constexpr bool InFlight(uint64_t m) { return (m & kInFlight) != 0; }
inline constexpr bool OutOfLine(uint64_t m) { return (m & kOutOfLine) != 0; }
inline constexpr uint32_t Epoch(uint64_t m) { return uint32_t(m); }
inline constexpr uint64_t Reserved(uint32_t epoch) { return kInFlight | epoch; }
inline constexpr uint64_t Make(bool visible, bool ool, uint64_t off, uint64_t klen) {
  return (visible ? kVisible : 0) | (ool ? kOutOfLine : 0) | (klen << 22) | off;
}
// The top 3 bits of an inline value (kept in the metadata word).
inline constexpr uint64_t High(uint64_t m) { return (m & kHighMask) >> kHighShift; }
inline constexpr uint64_t WithHigh(uint64_t m, uint64_t value) {
  return (m & ~kHighMask) | ((value >> 61) << kHighShift);
}
// m with its version advanced (wrapping) and the value's top bits: the
// metadata an update installs.
inline constexpr uint64_t Updated(uint64_t m, uint64_t value) {
  return WithHigh((m & ~kVersionMask) | ((m + (uint64_t(1) << kVersionShift)) & kVersionMask), value);
}
// The inline value of a record: payload word p (low 61 bits) and m's high bits.
inline constexpr uint64_t Value(uint64_t m, uint64_t p) { return (High(m) << 61) | (p & pm::pmwcas::kValueMask); }
// A deleted or dead record: its block stays until the node is rebuilt.
inline constexpr uint64_t Deleted(uint64_t m) { return m & ~(kVisible | kInFlight | kOutOfLine); }
}  // namespace meta

inline constexpr uint64_t Pad8(uint64_t n) { return (n + 7) & ~uint64_t(7); }
// Bytes of a record block: key padded to 8, then the payload word.
inline constexpr uint64_t RecordBytes(uint64_t klen) { return Pad8(klen) + 8; }

}  // namespace pmindex::internal::bztree
