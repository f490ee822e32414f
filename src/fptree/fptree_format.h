// fptree/fptree_format.h: the on-PM format of the FPTree family (Oukid et
// al., "FPTree: A Hybrid SCM-DRAM Persistent and Concurrent B-Tree for
// Storage Class Memory", SIGMOD'16; /work/shared/papers/fptree-sigmod16.md):
// the root object with its micro-logs, the leaf layout, the format's magic
// and its configuration checks. Read this file first; the rest of the folder
// builds on it (docs/fptree.md draws the same pictures).
//
// Variants: `fptree` (concurrent, sec. 4.4 and 5), `fptree_single` (single
// threaded, leaves allocated in groups, sec. 4.3 and appendix B) and `ptree`
// (sec. 5: selective persistence and unsorted leaves, without fingerprints).
// Inner nodes live in DRAM only (sec. 4.1) and are rebuilt at open; PM holds
// the root object and the leaves (plus key/value blocks and leaf groups).
//
// Leaf of fptree / fptree_single (m <= 56 slots; 64-byte lines):
//
//   line 0      | bitmap (u64) | fp[0] fp[1] ... fp[m-1] (1 byte each)     |
//   lines 1..   | key0 val0 | key1 val1 | key2 val2 | key3 val3 |  4 slots a
//               | key4 val4 | ...                                |  line ("slot
//               |                                                |  lines")
//   trailer     | next (u64) | unused (u64) | scan-order hint (48 bytes)  |
//
// Leaf of ptree (m <= 64): line 0 holds the bitmap only, then the key array
// (8 words a line), the value array (8 words a line), the trailer line.
//
// A key word is the u64 key, or (byte keys) the offset of a key block; a
// value word is the u64 value, or (byte values) the offset of a value block
// (kit/pm_block.h: {u64 len, bytes}). The unused trailer word is zero in new
// leaves and never read (fptree keeps its leaf locks in DRAM,
// kit/lock_table.h); the scan-order hint is volatile and never trusted
// unchecked (fptree_scan.cc).
//
// A leaf group (fptree_single) is one allocation {next group (u64), 56
// unused bytes, G leaves}, linked from the root (groups_head/groups_tail).
//
// Invariants (once no operation or log is in flight):
//   - a slot holds a record iff its bitmap bit is set; bits >= m are 0;
//   - fptree variants: a record's fingerprint byte is its key hash's top byte;
//   - the leaf list (head, next, ...) is in key order: every key of a leaf is
//     below every key of the next leaf; it is never empty;
//   - every invalid slot has zero key/value block words;
//   - every PM block is owned by exactly one persistent word (the root slot,
//     the leaf or group list, a slot, a micro-log word, a retire slot); a
//     retire slot whose tag is set shares its block with the leaf word
//     the tag names until the tag is cleared (fptree_retire.cc).
//
// Persist order: see fptree_smo.cc (split, leaf delete), fptree.cc (insert,
// update, delete), fptree_retire.cc (retired key/value blocks),
// fptree_group.cc (groups), fptree_recovery.cc (creation),
// fptree_compact.cc (leaf merges and group compaction at open),
// fptree_relocate.cc (leaf moves at open).
//
// Thread safety: declarations only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "pmindex/status.h"

namespace pmindex::internal::fptree {

// Format magic, which carries the format version: "PFTRT03" (version 3).
// Each version adds words in bytes that were zero padding in every root of
// the versions before (allocated zeroed, never written): version 2
// ("PFTRT02") adds Root::retire_area (fptree_retire.cc) and the leaf-merge
// log in the head line (fptree_compact.cc) to version 1 ("PFTRT01");
// version 3 adds the leaf-move log in the same line (fptree_relocate.cc). An
// older root whose newer words are all zero is opened as a version-3 root,
// its magic rewritten to version 3 first (fptree_recovery.cc, ClassifyRoot),
// so a build that knows only an older version refuses the pool (bad magic)
// instead of ignoring a retire list, a merge or a move in flight.
constexpr uint64_t kMagic = 0x33305452544650ull;
constexpr uint64_t kMagicV2 = 0x32305452544650ull;
constexpr uint64_t kMagicV1 = 0x31305452544650ull;
// Micro-log slots per kind: concurrent splits/deletes take one each.
constexpr int kLogs = 64;
// fptree with byte keys or values: slots of the persistent retire list
// (kit/retire_list.h) that owns removed and replaced key/value blocks from
// their unlink until the epoch grace period has passed (fptree_retire.cc).
constexpr uint32_t kRetireSlots = 512;

enum Variant : uint8_t { kConcurrent = 0, kSingle = 1, kPTree = 2 };
inline const char* VariantName(uint8_t v) { return v == kConcurrent ? "fptree" : v == kSingle ? "fptree_single" : "ptree"; }

// ---------------------------------------------------------------------------
// Root object (one allocation in the pool's root slot). Each log is one line.

// Split micro-log (alg. 3/4): cur = the leaf being split, nw = the new leaf
// (allocated into nw). cur is stored before nw (same line); reset: nw, then cur.
struct alignas(64) SplitLog {
  uint64_t cur, nw, pad[6];
};
// Leaf-delete micro-log (alg. 6/7): prev is stored before cur (same line).
struct alignas(64) DeleteLog {
  uint64_t prev, cur, pad[6];
};
// fptree_single: get-leaf log (alg. 10/11), the group being linked.
struct alignas(64) GroupLog {
  uint64_t new_group, pad[7];
};
// fptree_single: free-group log (alg. 12/13), the group and its predecessor.
struct alignas(64) FreeGroupLog {
  uint64_t prev, cur, pad[6];
};
struct alignas(64) Root {
  uint64_t magic;
  uint8_t variant, key_kind, value_kind, inplace_update;
  uint32_t leaf_slots, inner_size, group_size, leaf_bytes;
  uint32_t max_key, max_value;
  uint64_t initialized;  // alg. 9 "Tree.Status": 1 once creation finished
  uint64_t retire_area;  // fptree, byte keys or values: the retire slots' block (0: none yet)
  alignas(64) uint64_t head;  // first leaf
  // Leaf-merge log (format 2; fptree_compact.cc): right is merged into left,
  // whose bitmap before the merge was left_bm. right is stored last (same
  // line) and is nonzero iff the log is in use.
  uint64_t merge_left, merge_left_bm, merge_right;
  // Leaf-move log (format 3; fptree_relocate.cc): the listed leaf `from`,
  // whose predecessor is the leaf `prev` (0: from is the head), is being
  // copied to the block `to` (allocated into this word). prev and from are
  // persisted before to is allocated; to is nonzero iff a copy may exist.
  uint64_t move_prev, move_from, move_to;
  alignas(64) uint64_t groups_head;
  uint64_t groups_tail;
  GroupLog get_log;
  FreeGroupLog free_log;
  SplitLog split[kLogs];
  DeleteLog del[kLogs];
};
static_assert(offsetof(Root, move_to) < 128 && offsetof(Root, groups_head) == 128,
              "the merge and move logs fit in the head's line; format-1 offsets unchanged");

// ---------------------------------------------------------------------------
// Leaf geometry.

// Offset of the trailer line in a leaf of m slots (fp: fptree variants).
inline uint32_t LeafTrailer(bool fp, uint32_t m) {
  return fp ? 64 + ((16 * m + 63) / 64) * 64 : 64 + 2 * (((8 * m + 63) / 64) * 64);
}
inline uint32_t LeafBytes(bool fp, uint32_t m) { return LeafTrailer(fp, m) + 64; }

// Where the words of a leaf are, from the variant and the slot count.
struct LeafLayout {
  uint32_t m, key_off, key_stride, val_off, val_stride, trailer, bytes;
  uint32_t home_lines;  // slot lines (4 slots each) of an fptree leaf; 0 for ptree
  uint64_t full;        // bitmap of a full leaf
  bool fp;              // fingerprints (fptree, fptree_single)

  static LeafLayout Of(bool fp, uint32_t m) {
    LeafLayout l{};
    l.m = m;
    l.fp = fp;
    l.full = m == 64 ? ~0ull : ((1ull << m) - 1);
    l.key_off = 64;
    if (fp) {
      l.key_stride = 16;
      l.val_off = 72;
      l.val_stride = 16;
    } else {
      l.key_stride = 8;
      l.val_off = 64 + ((8 * m + 63) / 64) * 64;
      l.val_stride = 8;
    }
    l.trailer = LeafTrailer(fp, m);
    l.bytes = LeafBytes(fp, m);
    l.home_lines = fp ? (m + 3) / 4 : 0;
    return l;
  }

  static uint64_t* Bm(char* l) { return reinterpret_cast<uint64_t*>(l); }
  static uint8_t* Fp(char* l, int i) { return reinterpret_cast<uint8_t*>(l) + 8 + i; }
  uint64_t* Key(char* l, int i) const { return reinterpret_cast<uint64_t*>(l + key_off + i * key_stride); }
  uint64_t* Val(char* l, int i) const { return reinterpret_cast<uint64_t*>(l + val_off + i * val_stride); }
  uint64_t* Next(char* l) const { return reinterpret_cast<uint64_t*>(l + trailer); }
  // The scan-order hint: 48 bytes after the next pointer and the unused word.
  uint64_t* Hint(char* l) const { return reinterpret_cast<uint64_t*>(l + trailer + 16); }
};

// ---------------------------------------------------------------------------
// Corrupt pools (docs/fptree.md "Corrupt pools"): open validates the PM
// state recovery trusts and returns Status::Corrupt naming the word.
inline Status Bad(const std::string& what) { return Status::Corrupt("fptree: " + what); }
inline std::string Num(uint64_t x) { return std::to_string(x); }

// The root's config words are within the ranges creation accepts, for
// variant v (fptree_recovery.cc).
Status CheckConfig(const Root* r, uint8_t v);

}  // namespace pmindex::internal::fptree
