// fastfair_node.h: the FAST in-node protocol (FAST'18 sec. 3.3 insert,
// sec. 3.5 delete), on one node: inserts and deletes inside a node with
// their 8-byte store order and flushes, the lk prefix of a leaf and its
// left inserts. No tree, no pool: a NodeOps works on any Node in memory
// (fastfair_node_test.cc runs it on one DRAM node).
//
// Invariants (fastfair_format.h): the validity rule (a record equal to its
// left neighbour is ignored, slot 0's left neighbour being lk), I2 (slots
// count and count+1 are ignored copies of the left key of slot count), the
// lk prefix of a leaf (free slots holding lk at its front).
//
// Persist order (docs/fastfair.md, "FAST"): every store is one aligned
// 8-byte release store (pm::StoreAtomic). A shift flushes (and fences) a
// cache line when it is about to store into the next one, and the last
// dirty line at the end; the count's line shares the shift's last fence
// (after a crash the durable count may lag by the one record the shift was
// moving: Pushed, fastfair_tree.h). In the pm model (a crash keeps a prefix
// of the stores to each line since its last flush) every crash state has at
// most one ignored record besides a leaf's lk prefix, and the operation
// either happened or did not.
//
// Thread safety: the caller holds the node's write lock and has repaired
// the node (gen current). Lock-free readers may read the node at any time:
// the store order is what keeps them correct (they validate with `sw`,
// which a mode switch changes first).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "fastfair/fastfair.h"
#include "fastfair/fastfair_format.h"
#include "pmindex/pm/fault.h"
#include "pmindex/pm/persist.h"

namespace pmindex::internal::fastfair {

class PMINDEX_FASTFAIR_HIDDEN NodeOps {
 public:
  explicit NodeOps(uint32_t cap) : cap_(cap) {}
  uint32_t cap() const { return cap_; }


  // A record is ignored when its key word equals its left neighbour's.
  static bool Ignored(Node* n, uint32_t j) {
    Entry* e = n->ents();
    uint64_t left = j ? Ld(&e[j - 1].k) : Ld(&n->lk);
    return Ld(&e[j].k) == left;
  }
  // ---- the lk prefix (leaves) ---------------------------------------------
  // A leaf may begin with a run of free slots [0, s) whose keys hold lk:
  // each equals its left neighbour (slot 0: lk itself), so the rule ignores
  // them with no new word, lock-free readers included. In a repaired,
  // locked node these are the only ignored slots, so the prefix is exactly
  // the slots equal to lk at the front (no key of the node equals lk, and
  // an ignored slot equals its left neighbour): a binary search finds s.
  uint32_t Start(Node* n) const {
    if (n->level) return 0;
    Entry* e = n->ents();
    const uint64_t lk = n->lk;
    const uint32_t c = n->count;
    if (c == 0 || e[0].k != lk) return 0;
    uint32_t lo = 1, hi = c;
    while (lo < hi) {
      const uint32_t mid = (lo + hi) / 2;
      if (e[mid].k == lk) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }
  // Records of a write-locked repaired node (its prefix excluded).
  uint32_t Live(Node* n) const { return n->count - Start(n); }
  // An insert at pos must split n: no free slot behind the records, and no
  // lk prefix or one that only a long left shift (more than a third of the
  // node) would reach. Splitting then, rather than shifting far, is what
  // gives left halves room in front: the cut node keeps its prefix (Split
  // cuts in the middle of the records, not of the slots). Measured,
  // docs/fastfair.md "Windows".
  bool Full(Node* n, uint32_t pos) const {
    if (n->count < cap_) return false;
    const uint32_t s = Start(n);
    return s == 0 || pos - s > cap_ / 3;
  }
  // Removes the prefix of a write-locked repaired leaf (one left shift per
  // slot, the repair's compaction): before its lk changes (the prefix holds
  // the old lk) or when a merge needs the room. Rare.
  void DropPrefix(Node* n) {
    if (Start(n) == 0) return;
    prefix_drops_.fetch_add(1, std::memory_order_relaxed);
    while (Start(n) > 0) DeleteAt(n, 0, false);
  }

  // I2 for a write-locked node: slots count and count+1 (below cap) become
  // ignored copies of the left key of slot count; persisted if changed.
  void SetTail(Node* n) {
    Entry* e = n->ents();
    const uint32_t c = n->count;
    const uint64_t left = c ? e[c - 1].k : n->lk;
    const uint32_t end = std::min(c + 2, cap_);
    bool changed = false;
    for (uint32_t i = c; i < end; i++) {
      if (e[i].k == left) continue;
      St(&e[i].k, left);
      changed = true;
    }
    if (changed) pm::Persist(&e[c], (end - c) * sizeof(Entry));
  }

  // ---- FAST in-node shifts (caller holds the node's write lock) ----------
  // Invariant I2: slots count and count+1 are ignored copies of the left
  // key of slot count, so growing `count` reveals nothing and a crash that
  // kept a grown count but not the records is harmless. Every path that
  // grows a count re-makes it first (InsertAt: SetTail, persisted before
  // the count store).
  void InsertAt(Node* n, uint32_t pos, uint64_t k, uint64_t v) {
    const uint32_t cnt = n->count;
    Entry* e = n->ents();
    if (n->level == 0) {
      // Shift the shorter side. Left when the leaf has a prefix
      // and fewer records lie before pos than after it (or no room behind).
      const uint32_t s = Start(n);
      if (s > 0 && (cnt == cap_ || pos - s < cnt - pos)) {
        InsertLeft(n, s, pos, k, v);
        left_inserts_.fetch_add(1, std::memory_order_relaxed);
        return;
      }
    }
    SetTail(n);
    // Back to insert mode: readers scan left to right (sw shares the
    // count's line and its final fence; Pushed does not depend on the mode).
    if (n->sw & 1) St(&n->sw, n->sw + 1);
    const bool skip = PMINDEX_FAULT("fastfair.insert.skip_shift_flush");
    uintptr_t dirty = 0;
    // Flush the dirty line before the first store into another line.
    auto touch = [&](const void* p) {
      const uintptr_t line = pm::LineOf(p);
      if (dirty && line != dirty && !skip) pm::Persist(reinterpret_cast<void*>(dirty), pm::kCacheLine);
      dirty = line;
    };
    if (pos == cnt) {
      // Append: fill the invisible slot and the two copies behind it (I2 for
      // the grown node; value before key in each slot), then `count`
      // commits; one fence for all. A crash may keep any of these lines:
      // count without the record shows slot cnt as the old ignored copy; the
      // record without count is Pushed (the insert in flight happened); count
      // and the copy at cnt+1 without slot cnt show (k, v) once, at cnt+1
      // (Pushed; slot cnt is an ignored copy); count and slot cnt without
      // the copy leave at cnt+1 the old copy, below k: not Pushed (the
      // "sorts above" condition).
      const uint32_t end = std::min(cnt + 3, cap_);
      for (uint32_t i = cnt; i < end; i++) {
        St(&e[i].v, v);
        St(&e[i].k, k);
      }
      St(&n->count, cnt + 1);
      AfterCommit(n);
      pm::Flush(&e[cnt], (end - cnt) * sizeof(Entry));
      pm::Persist(&n->count, 4);
      return;
    }
    // I2 for the grown node: slot cnt+1 is a copy already, slot cnt+2
    // becomes one (only the next insert relies on it, after our last fence).
    if (cnt + 2 < cap_) {
      St(&e[cnt + 2].k, e[cnt - 1].k);
      if (pm::LineOf(&e[cnt + 2]) != pm::LineOf(&e[cnt])) pm::Flush(&e[cnt + 2].k, 8);
    }
    St(&n->count, cnt + 1);
    touch(&e[cnt]);
    St(&e[cnt].v, e[cnt - 1].v);  // complete the copy
    for (int64_t j = int64_t(cnt) - 1; j >= int64_t(pos); j--) {
      touch(&e[j]);
      St(&e[j].k, j ? e[j - 1].k : n->lk);  // slot j ignored, its copy at j+1 valid
      if (__builtin_expect(j == 0 && hooks_ != nullptr, 0) && hooks_->insert_slot0_ignored) hooks_->insert_slot0_ignored(n);
      if (j > int64_t(pos)) {
        St(&e[j].v, e[j - 1].v);
      } else {
        St(&e[j].v, v);
        St(&e[j].k, k);  // commit
        AfterCommit(n);
      }
    }
    // The count shares the final fence. Until then a crash may keep the
    // shift without the count: Pushed counts the record moved past it
    // (docs/fastfair.md, "The count's fence").
    pm::Flush(&n->count, 4);
    pm::Persist(reinterpret_cast<void*>(dirty), pm::kCacheLine);
  }

  // Insert (k, v) before record pos of a leaf whose lk prefix is
  // [0, s), s > 0, by moving records s..pos-1 one slot LEFT (the delete
  // shift's pattern): for j = s..pos-1, "v[j-1] = v[j]" (slot j-1 is the
  // prefix's last slot or an ignored copy: invisible), then "k[j-1] = k[j]"
  // (ONE store: slot j-1 valid, slot j its ignored copy); then slot pos-1,
  // an ignored copy of its left neighbour, gets "v = new value" and
  // "k = new key" (the commit). Readers scan right to left (sw odd, the
  // delete direction: records move left, towards them). `count` does not
  // change, nothing at or past slot count-1 is stored unless count == cap
  // (where no count lags), so the count's rules (I2, Pushed) are untouched.
  // A line is flushed and fenced when the shift is about to store into the
  // next line, the last one (with sw's, if the mode flipped) at the end:
  // a crash keeps a prefix of the store sequence, i.e. the prefix grown by
  // one (the slot at s-1 got a value only), or one record moved with its
  // copy still in place (one ignored copy, compacted by the repair), or
  // the new record's value in the ignored slot: the insert did not happen
  // or did, nothing else. docs/fastfair.md, "Windows".
  void InsertLeft(Node* n, uint32_t s, uint32_t pos, uint64_t k, uint64_t v) {
    Entry* e = n->ents();
    const bool flip = !(n->sw & 1);
    if (flip) St(&n->sw, n->sw + 1);  // readers scan right to left
    const bool skip = PMINDEX_FAULT("fastfair.insert.skip_shift_flush");
    uintptr_t dirty = 0;
    auto touch = [&](const void* p) {
      const uintptr_t line = pm::LineOf(p);
      if (dirty && line != dirty && !skip) pm::Persist(reinterpret_cast<void*>(dirty), pm::kCacheLine);
      dirty = line;
    };
    for (uint32_t j = s; j < pos; j++) {
      touch(&e[j - 1]);
      St(&e[j - 1].v, e[j].v);
      if (__builtin_expect(hooks_ != nullptr, 0) && hooks_->insert_left_move) hooks_->insert_left_move(n, j);
      St(&e[j - 1].k, e[j].k);  // slot j-1 valid, slot j its ignored copy
    }
    touch(&e[pos - 1]);
    St(&e[pos - 1].v, v);
    St(&e[pos - 1].k, k);  // commit
    AfterCommit(n);
    if (flip) pm::Flush(&n->sw, 8);
    pm::Persist(reinterpret_cast<void*>(dirty), pm::kCacheLine);
  }

  // Removes record pos. commit=false: the record is already ignored (repair).
  void DeleteAt(Node* n, uint32_t pos, bool commit) {
    const uint32_t cnt = n->count;
    Entry* e = n->ents();
    if (!(n->sw & 1)) St(&n->sw, n->sw + 1);  // delete mode: readers scan right to left
    const bool skip = PMINDEX_FAULT("fastfair.remove.skip_flush");
    if (commit && pos + 1 == cnt) {
      // The last record: its key becomes an ignored copy (the
      // commit for readers of the live tree), then the count shrinks; one
      // fence for both lines. A crash that kept the count but not the key
      // shows the record past the count, where Pushed counts it again (the
      // removal in flight did not happen); one that kept the key but not
      // the count shows a trailing ignored copy. So no durable state has
      // a live-looking record past the count that is not the record a
      // shift is moving, whatever the mode (Pushed needs no sw test).
      // First the I2 copy behind it (slot pos+1 holds the removed key,
      // with the value it had when the copy was made): once slot pos
      // holds its left key, that stale copy would sort above it and look
      // like a record Pushed past the count (a removed key would come back
      // with an old value). It must be durable no later than slot
      // pos: the same line keeps the store order, another line is fenced.
      const uint64_t left = pos ? e[pos - 1].k : n->lk;
      if (pos + 1 < cap_ && e[pos + 1].k != left) {
        St(&e[pos + 1].k, left);
        if (pm::LineOf(&e[pos + 1]) != pm::LineOf(&e[pos])) pm::Persist(&e[pos + 1].k, 8);
      }
      St(&e[pos].k, left);
      St(&n->count, cnt - 1);
      AfterCommit(n);
      pm::Flush(&e[pos].k, 8);
      pm::Persist(&n->count, 4);
      return;
    }
    uintptr_t dirty = pm::LineOf(&e[pos]);
    if (commit) {
      St(&e[pos].k, pos ? e[pos - 1].k : n->lk);  // commit: record pos ignored
      AfterCommit(n);
    }
    for (uint32_t j = pos; j + 1 < cnt; j++) {
      // Flush a line when the shift is about to dirty the next one.
      const uintptr_t line = pm::LineOf(&e[j]);
      if (line != dirty) {
        if (!skip) pm::Persist(reinterpret_cast<void*>(dirty), pm::kCacheLine);
        dirty = line;
      }
      St(&e[j].v, e[j + 1].v);
      St(&e[j].k, e[j + 1].k);  // slot j valid again, j+1 its ignored copy
    }
    const bool stored = commit || pos + 1 < cnt;  // the shift dirtied a line
    // Slot cnt-1 is now an ignored copy (I2 holds for the shrunk node if it
    // held before: slot cnt copied the same last key). The count must be
    // durable before a later operation changes slot cnt-2 (a stale durable
    // count would let that revive the copy in slot cnt-1), i.e. by our last
    // fence.
    // The count shares the last line's fence. A crash that kept the count
    // but not the whole last line leaves the last record R in slot cnt-1,
    // past the durable count, not yet moved: Pushed counts it (its left
    // neighbour is the record or ignored copy before it, below R, and R is
    // below high).
    St(&n->count, cnt - 1);
    if (!skip && stored) pm::Flush(reinterpret_cast<void*>(dirty), pm::kCacheLine);
    pm::Persist(&n->count, 4);
  }

  // Chooses a new lk for n that equals none of its keys nor `k`.
  // A leaf's lk prefix holds the old lk, so it is dropped first
  // (records move to slot 0: the caller's positions move by Start(n)).
  void FixLk(Node* n, uint64_t k) {
    DropPrefix(n);
    Entry* e = n->ents();
    for (uint64_t c = k + 1;; c++) {
      bool used = c == k;
      for (uint32_t j = 0; j < n->count && !used; j++) used = e[j].k == c;
      if (!used) {
        St(&n->lk, c);
        pm::Persist(&n->lk, 8);
        if (n->count == 0) SetTail(n);  // I2: slots 0 and 1 copy lk (Pushed never looks at count 0)
        return;
      }
    }
  }

  // Test hooks (fastfair_interleaving_test, fastfair_durable_read_test;
  // nullptr: none) and counters.
  void AfterCommit(Node* n) const {
    if (__builtin_expect(hooks_ != nullptr, 0) && hooks_->after_commit) hooks_->after_commit(n);
  }
  const TestHooks* hooks_ = nullptr;
  std::atomic<uint64_t> left_inserts_{0}, prefix_drops_{0};

 protected:
  const uint32_t cap_;
};

}  // namespace pmindex::internal::fastfair
