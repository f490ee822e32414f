// wbtree_node.h: operations inside one wBTree node (PiBench sec. 3.1, fig.
// 2c): the slot-array snapshot, binary search through it, the consistency
// rule that replaces the paper's validity bit, the slot-array rewrite and
// rebuild, and key comparison for u64 and byte keys (docs/wbtree.md).
//
// Invariants: see wbtree_format.h. A slot array is usable iff Consistent():
// its count equals the bitmap's population, every index is below the
// node's capacity, set in the bitmap and listed once. Searches assume it
// is also sorted, which every committed state is (a writer stores the new
// slot array, with word 0 holding the count first, before the bitmap store
// that commits it; recovery rebuilds any array that fails the rule).
//
// Persist order: StoreSlots stores the changed words, word 0 first, and
// flushes the line unless asked not to (delete: recovery repairs it);
// Rebuild stores and persists a fresh sorted array.
//
// Thread safety: the loads use atomics so lock-free readers may run them on
// a node a writer changes (their result is then validated against the
// node's version, kit/version_lock.h); the stores only by the holder of the
// node's lock, or single-threaded recovery.
#pragma once

#include <algorithm>
#include <cstring>
#include <string>

#include "core/index_util.h"
#include "pmindex/pm/pool.h"
#include "wbtree/wbtree_format.h"

namespace pmindex::internal::wbtree {

// A private copy of a node's slot array.
struct Slots {
  uint8_t b[64];
  uint32_t count() const { return b[0]; }
  uint8_t at(uint32_t i) const { return b[i]; }  // i in [1, count]
};

inline void LoadSlots(const Node* n, Slots* s) {
  for (int i = 0; i < 8; i++) {
    uint64_t w = LdR(&n->slotw[i]);
    std::memcpy(s->b + 8 * i, &w, 8);
  }
}

// A slot array read in place: byte i is one relaxed byte load when it is
// needed. The lock-free searches read a count and a few indices (one per
// probe), so they do not copy the whole line; the bytes may change under
// them, which the caller's version validation catches (indices are range
// checked before use).
struct NodeSlots {
  const Node* n;
  uint32_t count() const { return at(0); }
  uint32_t at(uint32_t i) const {
    return __atomic_load_n(reinterpret_cast<const uint8_t*>(n->slotw) + i, __ATOMIC_RELAXED);
  }
};

// The entries a slot array lists (indices >= 63 ignored): the valid
// entries of a slot-only node, whose slot word is its commit word.
inline uint64_t SlotBits(const Slots& s) {
  uint64_t bits = 0;
  for (uint32_t i = 1; i <= s.count() && i < 64; i++)
    if (s.at(i) < 63) bits |= 1ull << s.at(i);
  return bits;
}

// True if s is a usable slot array for a node with this bitmap and cap.
inline bool Consistent(const Slots& s, uint64_t bitmap, uint32_t cap) {
  if (cap > kMaxCap || (bitmap & ~CapMask(cap))) return false;
  const uint32_t c = s.count();
  if (c != uint32_t(__builtin_popcountll(bitmap))) return false;
  uint64_t seen = 0;
  for (uint32_t i = 1; i <= c; i++) {
    const uint32_t x = s.at(i);
    if (x >= cap || !(bitmap >> x & 1) || (seen >> x & 1)) return false;
    seen |= 1ull << x;
  }
  return true;
}

// Stores the words of `now` that differ from `was` into n's slot array,
// word 0 first (it holds the count, so a torn write is never consistent
// with either bitmap). flush: also flush the line (no fence). vol: the
// stores are repaired by recovery and are left unflushed on purpose.
inline void StoreSlots(Node* n, const Slots& now, const Slots& was, bool flush, bool vol = false) {
  for (int i = 0; i < 8; i++) {
    uint64_t a, b;
    std::memcpy(&a, now.b + 8 * i, 8);
    std::memcpy(&b, was.b + 8 * i, 8);
    if (a == b && i != 0) continue;
    if (vol) pm::StoreVolatile(&n->slotw[i], a);
    else pm::StoreAtomic(&n->slotw[i], a, __ATOMIC_RELAXED);
  }
  if (flush) pm::Flush(n->slotw, 64);
}

// How a tree compares keys: u64 keys inline, byte keys through their blocks
// ({u64 len, bytes}, kit/pm_block.h) with bounds checks.
// The pool's size is read at each use: a key block allocated after the
// context was made may lie beyond the size the pool had then.
struct KeyCtx {
  const char* base;
  const pm::Pool* pool;
  size_t max_key;
};

// Compares the key stored in word kw with key; false if a byte key's block
// cannot be read (damaged pool, or a stale word a reader's validation will
// reject).
template <bool BK>
inline bool CompareKeyWord(const KeyCtx& c, uint64_t kw, Slice key, int* cmp) {
  if constexpr (!BK) {
    const uint64_t k = SliceToU64(key);
    *cmp = kw < k ? -1 : (kw > k ? 1 : 0);
    return true;
  } else {
    const uint64_t pool_size = c.pool->size();
    if (kw == 0 || kw % 8 || kw + 8 > pool_size) return false;
    const auto* w = reinterpret_cast<const uint64_t*>(c.base + kw);
    const uint64_t len = LdR(w);
    if (len > c.max_key || kw + 8 + len > pool_size) return false;
    const size_t n = std::min<size_t>(len, key.size());
    size_t i = 0;
    for (; i < n; i += 8) {
      uint64_t x = LdR(w + 1 + i / 8);
      char buf[8];
      std::memcpy(buf, &x, 8);
      const size_t m = std::min<size_t>(8, n - i);
      const int r = std::memcmp(buf, key.data() + i, m);
      if (r) {
        *cmp = r;
        return true;
      }
    }
    *cmp = len < key.size() ? -1 : (len > key.size() ? 1 : 0);
    return true;
  }
}

// Reads the key of word kw into out (u64: its 8 bytes); false as above.
template <bool BK>
inline bool ReadKeyWord(const KeyCtx& c, uint64_t kw, std::string* out) {
  if constexpr (!BK) {
    out->assign(reinterpret_cast<const char*>(&kw), 8);
    return true;
  } else {
    const uint64_t pool_size = c.pool->size();
    if (kw == 0 || kw % 8 || kw + 8 > pool_size) return false;
    const auto* w = reinterpret_cast<const uint64_t*>(c.base + kw);
    const uint64_t len = LdR(w);
    if (len > c.max_key || kw + 8 + len > pool_size) return false;
    out->resize(len);
    for (size_t i = 0; i < len; i += 8) {
      uint64_t x = LdR(w + 1 + i / 8);
      std::memcpy(out->data() + i, &x, std::min<size_t>(8, len - i));
    }
    return true;
  }
}

// The u64 key of a validated key slice (8 bytes: one load; SliceToU64
// copies a variable length).
inline uint64_t KeyU64(Slice key) {
  uint64_t k;
  if (key.size() == 8) std::memcpy(&k, key.data(), 8);
  else k = SliceToU64(key);
  return k;
}

// The result of SearchU64: ub, the slot position in [0, count] of the last
// entry with key <= k (0: none); x and kw, the index and key of that entry
// (when ub > 0).
struct U64Hit {
  uint32_t ub, x;
  uint64_t kw;
  // Keys in a node are distinct: k is present iff its last entry <= k is k.
  bool eq(uint64_t k) const { return ub > 0 && kw == k; }
};

// u64 keys: binary search through the slot array (a copy, Slots, or the
// node's own, NodeSlots), branch-free. The range [lo, lo + len) of slot
// positions still in question halves each step by a conditional add, not
// a branch: a probe's outcome is a coin toss for the predictor, and a
// branch on it mispredicts about every other step. Positions below lo hold
// keys <= k, those at lo + len and above keys > k; lo moves only onto a
// probed key <= k, so the last probe (at lo) decides the result: its key
// <= k gives ub = lo, else lo never moved and ub = 0. Probes: ceil(log2
// count) + 1 keys, as a lower-bound search. False if an index is out of
// range.
template <class S>
inline bool SearchU64(const Node* n, const S& s, uint32_t cap, uint64_t k, U64Hit* h) {
  const uint32_t c = s.count();
  *h = U64Hit{0, 0, 0};
  if (c > cap) return false;
  if (c == 0) return true;
  const Entry* e = n->ents();
  uint32_t lo = 1, len = c;
  while (len > 1) {
    const uint32_t half = len >> 1;
    const uint32_t x = s.at(lo + half);
    if (x >= cap) return false;
    lo += half & (0u - uint32_t(LdR(&e[x].k) <= k));
    len -= half;
  }
  const uint32_t x = s.at(lo);
  if (x >= cap) return false;
  const uint64_t kw = LdR(&e[x].k);
  if (kw <= k) *h = U64Hit{lo, x, kw};
  return true;
}

// Binary search through the slot array (a copy, Slots, or the node's own,
// NodeSlots): *pos = the number of entries with key < `key` (lower bound),
// *eq = the entry at slot *pos + 1 equals key. False if an index or block
// is out of range.
template <bool BK, class S>
inline bool LowerBound(const KeyCtx& c, const Node* n, const S& s, uint32_t cap, Slice key, uint32_t* pos, bool* eq) {
  *pos = 0;
  *eq = false;
  if constexpr (!BK) {
    const uint64_t k = KeyU64(key);
    U64Hit h;
    if (!SearchU64(n, s, cap, k, &h)) return false;
    *eq = h.eq(k);
    *pos = h.ub - (*eq ? 1 : 0);
    return true;
  }
  uint32_t lo = 0, hi = s.count();
  if (hi > cap) return false;
  while (lo < hi) {
    const uint32_t mid = (lo + hi) / 2;
    const uint32_t x = s.at(mid + 1);
    if (x >= cap) return false;
    int cmp;
    if (!CompareKeyWord<BK>(c, LdR(&n->ents()[x].k), key, &cmp)) return false;
    if (cmp < 0) {
      lo = mid + 1;
    } else {
      if (cmp == 0) *eq = true;
      hi = mid;
    }
  }
  *pos = lo;
  return true;
}

// Inner node: the child that holds key (the entry with the largest k <= key,
// else leftmost); 0 if the search failed.
template <class S>
inline uint64_t ChildForU64(const Node* n, const S& s, uint32_t cap, uint64_t k) {
  U64Hit h;
  if (!SearchU64(n, s, cap, k, &h)) return 0;
  return h.ub ? LdR(&n->ents()[h.x].v) : LdR(&n->leftmost);
}
template <bool BK, class S>
inline uint64_t ChildFor(const KeyCtx& c, const Node* n, const S& s, uint32_t cap, Slice key) {
  if constexpr (!BK) return ChildForU64(n, s, cap, KeyU64(key));
  uint32_t pos;
  bool eq;
  if (!LowerBound<BK>(c, n, s, cap, key, &pos, &eq)) return 0;
  const uint32_t upto = pos + (eq ? 1 : 0);  // entries with k <= key
  if (upto == 0) return LdR(&n->leftmost);
  const uint32_t x = s.at(upto);
  return x < cap ? LdR(&n->ents()[x].v) : 0;
}

// A slot array with x inserted at position pos (0-based) / removed at pos.
inline Slots WithInserted(const Slots& s, uint32_t pos, uint8_t x) {
  Slots r = s;
  const uint32_t c = s.count();
  std::memmove(r.b + pos + 2, s.b + pos + 1, c - pos);
  r.b[pos + 1] = x;
  r.b[0] = uint8_t(c + 1);
  return r;
}
inline Slots WithRemoved(const Slots& s, uint32_t pos) {
  Slots r = s;
  const uint32_t c = s.count();
  std::memmove(r.b + pos + 1, s.b + pos + 2, c - pos - 1);
  r.b[c] = 0;
  r.b[0] = uint8_t(c - 1);
  return r;
}

}  // namespace pmindex::internal::wbtree
