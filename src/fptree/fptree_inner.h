// fptree/fptree_inner.h: the DRAM inner nodes of the FPTree family (sec. 4.1
// "selective persistence": inner nodes are volatile and rebuilt at open;
// sec. 5 synchronises them with HTM, we use optimistic lock coupling).
//
// Node: `count` sorted keys, count + 1 children; child i holds the keys k
// with keys[i-1] <= k < keys[i]. The children of a bottom node are leaf
// offsets, of other nodes Inner pointers. A key word is the u64 key or (byte
// keys) a pointer to a KeyBlob, a DRAM copy of the separator owned by exactly
// one key slot keys[0..count) of one live node (a split moves the pointer,
// never copies it), so a blob is freed with the key slot that drops it.
// Nodes are 64-byte aligned and a whole number of lines (Bytes), so the
// header and the first keys share line 0 and a prefetch covers whole lines.
//
// Concurrency (fptree; the single-threaded variants compile the lock calls
// away, kConc = false): each node has a kit::VersionLock. Readers descend
// with ReadLock / Validate and never write; writers Upgrade the nodes they
// change (a CAS from the version they read, never waiting inside it), write,
// and Unlock. A node removed by a leaf deletion is unlocked obsolete, and it
// and its blobs are freed after an epoch grace period (kit/epoch.h), so a
// reader that still holds its address reads valid memory and fails its
// validation. Child and key words are stored with release and loaded with
// acquire where the loaded node or blob is dereferenced: a reader must see
// the node's initialisation before it reads its version.
//
// Persist order: none; nothing here is persistent.
//
// Thread safety: the functions here are called under the protocol above;
// InsertAt/RemoveAt with the node write-locked.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "core/index_util.h"
#include "fptree/fptree_leaf.h"
#include "kit/backoff.h"
#include "kit/version_lock.h"

namespace pmindex::internal::fptree {

// DRAM copy of a byte key (inner-node separators). Immutable.
struct KeyBlob {
  uint32_t len;
  char data[1];
  Slice slice() const { return Slice(data, len); }
};
inline KeyBlob* NewBlob(Slice s) {
  auto* b = static_cast<KeyBlob*>(std::malloc(sizeof(KeyBlob) + s.size()));
  b->len = uint32_t(s.size());
  if (!s.empty()) std::memcpy(b->data, s.data(), s.size());
  return b;
}

struct Inner {
  kit::VersionLock version;
  std::atomic<uint32_t> count;
  uint32_t cap;
  uint32_t bottom;
  uint32_t pos;  // index in FPTree::nodes_ (under nodes_mu_)
  std::atomic<uint64_t>* keys() { return reinterpret_cast<std::atomic<uint64_t>*>(this + 1); }
  std::atomic<uint64_t>* child() { return keys() + cap; }
  static size_t Bytes(uint32_t cap) { return (sizeof(Inner) + 8 * (2 * size_t(cap) + 1) + 63) & ~size_t(63); }
};
static_assert(sizeof(Inner) % 8 == 0);

// The bottom inner node a descent ended in and the child index of its leaf
// (the scan's lookahead).
struct Path {
  Inner* parent = nullptr;
  uint32_t idx = 0;
};

// ---- optimistic lock coupling (no-ops for kConc = false) -------------------
template <bool kConc>
struct Olc {
  // Read-locks n: false (after a pause) if it is locked or obsolete.
  static bool ReadLock(Inner* n, uint64_t* v) {
    if constexpr (!kConc) return true;
    if (n->version.ReadBegin(v)) return true;
    kit::CpuRelax();
    return false;
  }
  static bool Validate(Inner* n, uint64_t v) {
    if constexpr (!kConc) return true;
    return n->version.Validate(v);
  }
  static bool Upgrade(Inner* n, uint64_t v) {
    if constexpr (!kConc) return true;
    return n->version.Upgrade(v);
  }
  static void WriteUnlock(Inner* n) {
    if constexpr (!kConc) return;
    n->version.Unlock();
  }
  // Unlocks a node removed from the tree: readers that reach it fail ReadLock
  // or their validation and restart from the root.
  static void ObsoleteUnlock(Inner* n) {
    if constexpr (!kConc) return;
    n->version.UnlockObsolete();
  }
};

// ---- search ------------------------------------------------------------------
// Stored key word vs search key.
template <bool kBytes>
inline int CmpInner(uint64_t w, const SKey& k) {
  if constexpr (kBytes) {
    const KeyBlob* b = reinterpret_cast<const KeyBlob*>(w);
    Slice bs = b ? b->slice() : Slice();
    return CompareKeys(KeyKind::kBytes, bs, k.s);
  } else {
    return w < k.u ? -1 : (w > k.u ? 1 : 0);
  }
}
// Stored key word vs stored key word.
template <bool kBytes>
inline int CmpWords(uint64_t a, uint64_t b) {
  if constexpr (kBytes) {
    return CompareKeys(KeyKind::kBytes, reinterpret_cast<KeyBlob*>(a)->slice(), reinterpret_cast<KeyBlob*>(b)->slice());
  } else {
    return a < b ? -1 : (a > b ? 1 : 0);
  }
}

// Number of keys <= k (the child index). u64 keys: branchless binary
// search (the comparison outcomes are random, so a branchy search pays
// about one misprediction per level of the search).
template <bool kBytes>
inline uint32_t UpperBound(Inner* n, const SKey& k) {
  uint32_t c = n->count.load(std::memory_order_relaxed);
  if (c > n->cap) c = n->cap;
  auto* keys = n->keys();
  if constexpr (!kBytes) {
    if (c == 0) return 0;
    uint32_t base = 0, len = c;
    while (len > 1) {
      uint32_t half = len / 2;
      bool le = keys[base + half - 1].load(std::memory_order_relaxed) <= k.u;
      base += le ? half : 0;  // cmov
      len -= half;
    }
    return base + (keys[base].load(std::memory_order_relaxed) <= k.u);
  }
  uint32_t lo = 0, hi = c;
  while (lo < hi) {
    uint32_t mid = (lo + hi) / 2;
    // Acquire: a byte-key word points to a blob written before publication.
    if (CmpInner<kBytes>(keys[mid].load(kBytes ? std::memory_order_acquire : std::memory_order_relaxed), k) <= 0) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// ---- changes (node write-locked) ------------------------------------------------
// keys[i] = kw, child[i+1] = c, shifting the rest right.
inline void InsertAt(Inner* n, uint32_t i, uint64_t kw, uint64_t c) {
  uint32_t cnt = n->count.load(std::memory_order_relaxed);
  auto* keys = n->keys();
  auto* ch = n->child();
  for (uint32_t j = cnt; j > i; j--) keys[j].store(keys[j - 1].load(std::memory_order_relaxed), std::memory_order_release);
  for (uint32_t j = cnt + 1; j > i + 1; j--) ch[j].store(ch[j - 1].load(std::memory_order_relaxed), std::memory_order_release);
  keys[i].store(kw, std::memory_order_release);
  ch[i + 1].store(c, std::memory_order_release);
  n->count.store(cnt + 1, std::memory_order_release);
}
// Removes child j and one neighbouring key (key j-1, or key 0 if j == 0:
// the removed child's range goes to its left, resp. right, sibling).
// Returns the removed key word. n has count >= 1.
inline uint64_t RemoveAt(Inner* n, uint32_t j) {
  uint32_t cnt = n->count.load(std::memory_order_relaxed);
  auto* keys = n->keys();
  auto* ch = n->child();
  uint32_t kd = j > 0 ? j - 1 : 0;  // key removed
  uint64_t removed = keys[kd].load(std::memory_order_relaxed);
  for (uint32_t x = kd; x + 1 < cnt; x++) keys[x].store(keys[x + 1].load(std::memory_order_relaxed), std::memory_order_release);
  for (uint32_t x = j; x < cnt; x++) ch[x].store(ch[x + 1].load(std::memory_order_relaxed), std::memory_order_release);
  n->count.store(cnt - 1, std::memory_order_release);
  return removed;
}
// Moves the upper half of full node n into the empty node r; returns the
// separator key word (keys[mid], which moves up). n and r write-locked (r
// not yet reachable).
inline uint64_t SplitInto(Inner* n, Inner* r) {
  uint32_t cnt = n->count.load(std::memory_order_relaxed);
  uint32_t mid = cnt / 2;
  auto* keys = n->keys();
  auto* ch = n->child();
  uint64_t sep = keys[mid].load(std::memory_order_relaxed);
  uint32_t rc = 0;
  for (uint32_t j = mid + 1; j < cnt; j++) r->keys()[rc++].store(keys[j].load(std::memory_order_relaxed), std::memory_order_release);
  for (uint32_t j = mid + 1; j <= cnt; j++)
    r->child()[j - mid - 1].store(ch[j].load(std::memory_order_relaxed), std::memory_order_release);
  r->count.store(rc, std::memory_order_relaxed);
  n->count.store(mid, std::memory_order_release);
  return sep;
}

}  // namespace pmindex::internal::fptree
