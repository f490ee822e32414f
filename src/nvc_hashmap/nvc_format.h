// nvc_format.h: the on-PM layout of the NVC-Hashmap (format version 7; 4 to 6
// are read).
//
// Paper: Schwalb et al., IMDM'15, section 3.3 (2) (every PM word an 8-byte
// pool offset, changed by one CAS or failure-atomic store) and (3) (a fixed
// entry point: bucket 0's dummy). Prose and the persist order of every
// operation: docs/nvc_hashmap.md, "Layout". Included by the write path, by
// recovery and by Check alike; nothing here may change without a new format
// version.
//
//   pool root slot -> Root
//   +-------------------------------------------------------------------+
//   | line 0: magic version kinds max_key max_value seg0 head slab_head  |
//   |         node_alloc                          (written once, magic last)
//   | line 1: bucket_count(hint) count clean scratch slab_pending        |
//   | seg[40]: bucket-table segments (allocator blocks of 8-byte slots)  |
//   | slots[256]: PSlot {pending, pending_val, scratch} one line each    |
//   +-------------------------------------------------------------------+
//   root.xslots -> PSlot[max_threads - 256]   (only if max_threads > 256)
//   seg[0] = buckets [0, seg0); seg[s >= 1] = [seg0 << (s-1), seg0 << s)
//
//   bucket-table slot (8 bytes) = bucket b's dummy = its next word
//   slot 0 = bucket 0's dummy = the list head
//
//   head --> node --> node --> [bucket 4 link] --> slot 4 --> node --> ... kEnd
//
//   link word: | tag | successor (offset of a Node, or b << 3) | B | D | M/U |
//              bits 48-63 tag = a 12-bit window of the successor node's
//                    split-order key and the window's start (TagOf), 0:
//                    unknown; bucket links carry 0
//              bit 2 B = kBucketLink (successor is bucket b's dummy)
//              bit 1 D = kDirty (the latest store may not be durable yet)
//              bit 0 M = kMark in a node's next (deleted, word frozen)
//                    U = kUnpub in a dummy's word (claimed, not published)
//
//   Node (not compact): next so value klen flags | key bytes | pad to 8 |
//                       [byte values: u64 len | bytes]       (>= 64 bytes)
//   CompactNode (u64 keys and values): next so value key     (32 bytes)
//
//   slab (32 KiB allocator block): SlabHdr (192 bytes) | slot | slot | ...
//
// Invariants (of a durable image, after recovery):
//   - the list from slot 0 is strictly sorted by (split-order key, key) and
//     ends with kEnd (a link to bucket 0);
//   - a dummy sits in its own bucket's slot and is never removed; a slot is
//     nonzero only if its dummy is linked, or it is being linked (kUnpub);
//   - regular nodes have an odd split-order key, SoRegular(hash(key));
//   - a node is either a slot of a slab in the slab list (flags say so,
//     compact nodes in slab pools always are) or an allocator block;
//   - Root.count is valid only when Root.clean == 1, and so are the slabs'
//     free bitmaps;
//   - a nonzero tag in a link word is a window of the split-order key of the
//     node the link names (TagMatches); bucket links (and every link of a
//     version 4 or 5 pool) have tag 0;
//   - (version 7) a slab slot the list does not reach holds 0 or a marked
//     link in its `next`; after a crash, also the node of an insert whose
//     link was not durable (recovery zeroes it);
//   - Root.max_threads is 0 (version 4: 256 slots) or the number of thread
//     slots; Root.xslots is nonzero iff max_threads > 256 (both written
//     once, at creation, before the magic).
//
// Thread safety: definitions only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace pmindex::internal::nvc {

constexpr uint64_t kMagic = 0x50414d482d43564eull;  // "NVC-HMAP"
// Format versions. 2: u64 values in the node's value word, remove marks
// next. 3: 8-byte bucket-table slots, bucket-number links, kEnd; three
// incompatible layouts were written as version 3, so it is refused. 4: the
// layout of this file with 256 thread slots, compact 32-byte u64 nodes. 5:
// root.max_threads and root.xslots (more thread slots in their own block);
// a version 4 pool is a version 5 pool whose two words are 0 (256 slots), so
// it is read as one and keeps its version. 6: successor tags in bits 48-63
// of link words; a version 4 or 5 pool is a version 6 pool whose tags are
// all 0 (unknown), so it is read as one, keeps its version and is written
// without tags (a version 5 build can still open it). 7: the layout of 6,
// plus an invariant crash recovery's slab scan relies on: a slab slot the
// durable list does not reach holds 0 or a marked link in `next`, or the
// node of an insert whose link CAS was not durable (a failed insert zeroes
// its node's next before the slot is reused; recovery zeroes unreachable
// unmarked slots). A version 6 pool may break it (failed inserts left their
// nodes as written), so it is recovered by the list walk and keeps its
// version; a version 6 build refuses a version 7 pool.
constexpr uint32_t kVersion = 7;
constexpr uint32_t kFirstScanVersion = 7;
constexpr uint32_t kFirstTagVersion = 6;
constexpr uint32_t kOldestReadVersion = 4;

// Thread slots: a thread binds one for its lifetime (kit/epoch.h bounds the
// epoch manager to max_threads; scans stop at the highest slot ever bound).
// The first kRootSlots persistent slots are in the root, the others in the
// block root.xslots. max_threads is fixed at creation (parameter
// max_threads, default kRootSlots, at most kMaxThreads).
constexpr int kRootSlots = 256;
constexpr int kMaxThreads = 1 << 16;
constexpr int kMaxSegments = 40;
constexpr uint64_t kMaxBuckets = 1ull << 32;

// Low bits of a link word. kBucketLink: the link names bucket (word >> 3)'s
// dummy, not a pool offset; bucket 0 (the head) is never a successor, so
// kEnd = a link to bucket 0 ends the list. In a dummy's own word (its bucket
// slot) bit 0 is kUnpub (claimed, not published yet): dummies are never
// marked, and every CAS of a predecessor's word keeps that bit (KeepUnpub).
constexpr uint64_t kMark = 1, kDirty = 2, kBucketLink = 4, kLow = 7;
// Bits 48-63 of a link word: the successor's tag, written in the same store
// or CAS as the successor's offset; 0: unknown. A tag is a property of the
// successor node alone (so a link copied to another predecessor keeps a
// valid tag): bits 60-63 hold j, bits 48-59 the 12 bits of its split-order
// key from bit position s = 4j on, counted from the top (so << s >> 52).
// A search for split-order key T standing on a predecessor P < T whose
// link has tag (j, w): if P and T agree on their top s bits and w is above
// T's window, the successor sorts past T (it is above P, so its top s bits
// are at least P's, which are T's; equal, its window decides) and is not
// loaded. All nodes of a bucket share the top log2(bucket count) bits, so
// an insert picks s just at or below that (TagShift): the window then holds
// the bits that order a bucket's nodes. Pool offsets and bucket links fit
// in bits 0-47 (kMaxPoolBytes, kMaxBuckets).
constexpr int kTagShift = 48;
constexpr uint64_t kTagMask = ~uint64_t(0) << kTagShift;
constexpr uint64_t kMaxPoolBytes = uint64_t(1) << kTagShift;
constexpr uint64_t kUnpub = kMark;
constexpr uint64_t kEnd = kBucketLink;
constexpr uint64_t kSlotBytes = 8;  // a bucket-table slot: the dummy's next word
// A bucket-table slot word: 0 free; kUnpub set: claimed (being linked, or
// linked but its link not yet durable); else published (its dummy is in the
// list and the link to it is durable).

// A regular node's header; key bytes follow it, then (8-aligned) the inline
// value record. Non-compact nodes are >= 64 bytes, hence 64-byte aligned, so
// next, so and value share one cache line. Dummies are not Nodes: a dummy is
// the 8-byte word of its bucket-table slot.
constexpr size_t kHeader = 32;
constexpr uint32_t kSlabFlag = 2;  // flags: a node carved from a slab; class in bits 4..
struct Node {
  uint64_t next;
  uint64_t so;     // split-order key (odd)
  uint64_t value;  // u64 values: the value; byte values: the record offset; no flag bits
  uint32_t klen;
  uint32_t flags;
};
static_assert(sizeof(Node) == kHeader);

// A compact node (u64 keys and u64 values): half a cache line, no
// klen/flags (the key is 8 bytes; a compact node is a slab node iff the pool
// uses slabs, class 0). 32-byte aligned in a slab, a 64-byte block with
// node_alloc=allocator: it never straddles a line.
struct CompactNode {
  uint64_t next, so, value, key;
};
static_assert(sizeof(CompactNode) == 32 && offsetof(CompactNode, key) == 24);
constexpr size_t kCompactKeyOff = 24;

// Persistent per-thread slot: allocation destinations (allocate-into-
// destination) and the word handed to Allocator::Free.
struct alignas(64) PSlot {
  uint64_t pending;      // a new node until it is linked (allocator nodes)
  uint64_t pending_val;  // a new out-of-line value record until it is installed
  uint64_t scratch;      // a block being freed
  uint64_t pad[5];
};

struct Root {
  // Line 0: configuration, written once at creation (magic last).
  uint64_t magic;
  uint32_t version;
  uint8_t key_kind, value_kind;
  uint16_t reserved;
  uint64_t max_key, max_value;
  uint64_t seg0;        // buckets in segment 0 (power of two)
  uint64_t head;        // always 0 (bucket 0's slot is the list head); nonzero: an older format
  uint64_t slab_head;   // first node slab (node_alloc=slab), linked by SlabHdr::next
  uint64_t node_alloc;  // 0: one allocator block per node; 1: slabs (fixed at creation)
  // Line 1: mutable state.
  uint64_t bucket_count;  // a durable hint; a smaller value loses nothing
  uint64_t count;         // records; valid only when clean == 1
  uint64_t clean;         // 1 after a clean close
  uint64_t scratch;       // Free() destination during recovery
  uint64_t slab_pending;  // a new slab until it is linked into slab_head
  uint64_t max_threads;   // thread slots; 0 (version 4): kRootSlots. Written once.
  uint64_t xslots;        // PSlot[max_threads - kRootSlots] if max_threads > kRootSlots. Written once.
  uint64_t pad1[1];
  // Bucket-table segments: segment 0 holds buckets [0, seg0), segment s >= 1
  // holds [seg0 << (s-1), seg0 << s). Each slot is an 8-byte dummy (its next
  // word); slot 0 is the list head.
  uint64_t seg[kMaxSegments];
  PSlot slots[kRootSlots];
};
static_assert(offsetof(Root, bucket_count) == 64 && offsetof(Root, max_threads) == 104 && offsetof(Root, xslots) == 112);

// Node slabs (node_alloc=slab): one allocator block of kSlabSize bytes holds
// this header and fixed-size node slots of one class. 32 KiB is the
// allocator's largest run class (larger requests take a whole 256 KiB
// chunk): 1018 slots of 32 bytes (compact nodes), 509 of 64, 254 of 128, 127
// of 256.
constexpr uint64_t kSlabSize = 32 * 1024;
constexpr uint64_t kSlabHeader = 192;
constexpr uint64_t kSlabMagic = 0x42414c5343564e01ull;
constexpr int kNumClasses = 4;
constexpr uint64_t kClassSize[kNumClasses] = {32, 64, 128, 256};

// next/cls/nslots/magic are written and persisted before the slab is linked;
// the bitmap (bit set = slot free) is valid only after a clean close.
struct SlabHdr {
  uint64_t next;
  uint64_t cls;  // node class index
  uint64_t nslots;
  uint64_t magic;
  uint64_t pad[4];
  uint64_t free_bits[16];  // up to 1024 slots
};
static_assert(sizeof(SlabHdr) == kSlabHeader);

// The slab class holding a node of `size` bytes; -1: larger than any class.
inline int ClassOf(uint64_t size) {
  for (int k = 0; k < kNumClasses; k++)
    if (size <= kClassSize[k]) return k;
  return -1;
}

inline uint64_t A8(uint64_t n) { return (n + 7) & ~uint64_t(7); }

// Link-word helpers.
// The link without its mark/kUnpub and kDirty bits (its tag kept): what a new
// node's next or an unlink copies.
inline uint64_t Succ(uint64_t raw) { return raw & ~(kMark | kDirty); }
// Tag windows: 12 bits from bit position 4j (j <= kMaxTagJ) of a split-order key.
constexpr int kTagBits = 12;
constexpr uint64_t kMaxTagJ = (64 - kTagBits) / 4;
inline uint64_t TagWindow(uint64_t so, int s) { return (so << s) >> (64 - kTagBits); }
// The window start for a table of bucket_count buckets: its log2, rounded
// down to a multiple of 4.
inline int TagShift(uint64_t bucket_count) {
  const int l = 63 - __builtin_clzll(bucket_count | 1);
  return std::min<int>(l & ~3, int(4 * kMaxTagJ));
}
// The tag of a link to a node of split-order key so, window start s (a
// multiple of 4, at most 4 * kMaxTagJ).
inline uint64_t TagOf(uint64_t so, int s) { return (uint64_t(s / 4) << 60) | (TagWindow(so, s) << kTagShift); }
// True if the tag of raw (nonzero) is a window of split-order key so.
inline bool TagMatches(uint64_t raw, uint64_t so) {
  const uint64_t j = raw >> 60;
  return j <= kMaxTagJ && ((raw >> kTagShift) & ((1u << kTagBits) - 1)) == TagWindow(so, int(4 * j));
}
// True if the link raw (to a regular node), read in the word of a
// predecessor whose split-order key prev_so is below so, tells that its
// node sorts past so; false: unknown (tag 0) or not decided.
inline bool TagAbove(uint64_t raw, uint64_t prev_so, uint64_t so) {
  const uint64_t t = raw >> kTagShift;
  if (!t) return false;
  const int s = int(4 * (t >> kTagBits));
  if (s > 0 && ((prev_so ^ so) >> (64 - s)) != 0) return false;
  return (t & ((1u << kTagBits) - 1)) > TagWindow(so, s);
}
// The bucket a bucket link (raw & kBucketLink) names.
inline uint64_t LinkBucket(uint64_t raw) { return (raw & ~kTagMask) >> 3; }
// The kUnpub bit of a predecessor's word, kept by every CAS of that word: a
// dummy's word may carry it; a regular predecessor's word as loaded by a
// search is unmarked, so this is 0 for it.
inline uint64_t KeepUnpub(uint64_t exp) { return exp & kUnpub; }
inline uint64_t BucketLink(uint64_t b) { return (b << 3) | kBucketLink; }
inline bool IsPublished(uint64_t slot_word) { return slot_word && !(slot_word & kUnpub); }

}  // namespace pmindex::internal::nvc
