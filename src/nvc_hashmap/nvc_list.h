// nvc_list.h: the erratum rule and its helpers, shared by the list
// operations (nvc_list.cc) and bucket initialisation (nvc_buckets.cc).
//
// Paper: the authors' erratum to Schwalb et al., IMDM'15, figure 3. A
// thread links a node with a CAS (step 4) and persists the link after it
// (step 5); in between, other threads see a link that is not durable yet.
// If one of them acts durably on it (links a node behind the new node,
// reports the key present, stores a value into it) and the machine crashes
// before step 5, the durable image holds the effect but not its cause.
//
// The rule (the erratum's fix (a), "the reader flushes", with a fence, and
// its fix (b), "a write-pending bit", with helping instead of waiting):
// before an operation acts durably on a word another thread may have
// written, it makes that word durable. These words are
//   - the link to the predecessor it is about to link behind (insert,
//     bucket initialisation), or to the node whose presence it reports
//     (find, failed insert, update);
//   - the mark of a node it reports absent or unlinks (find, update, remove);
//   - the value word of the node whose value a find returns.
// Modes (Options::params erratum_fix):
//   dirty_bit (default): writers publish links and marks with kDirty and
//     clear it (a volatile CAS) after persisting; a reader persists only a
//     word that carries kDirty, then clears it. Value words have no spare
//     bit: an updater counts itself in on its node's stripe (nvc_map.h)
//     while its store is not durable, and a find persists the value word if
//     the count is nonzero.
//   flush_on_read: readers always flush and fence the words above.
//   none: the paper's algorithm, to measure the fix's cost; not crash-safe
//     under concurrency (pmcheck's erratum lint finds it).
// pm::LoadAcquire (which pmcheck's durability lint watches) is issued exactly
// where an operation acts durably on such a word: in none and flush_on_read
// modes always, in dirty_bit mode when the word carries kDirty. A clean word
// in dirty_bit mode is durable by construction (kDirty is cleared only after
// the persist), even if its cache line is dirty with an unrelated word (a
// concurrent update of the same node's value), which the line-granular lint
// cannot tell.
//
// Persist order: the helpers only flush and fence words that are already
// stored; kDirty clears are volatile (recovery strips every kDirty bit).
//
// Thread safety: any thread, on any word of a live node or bucket slot.
#pragma once

#include "nvc_hashmap/nvc_map.h"

namespace pmindex::internal::nvc {

// Clears kDirty if *w still holds v (whose pointer is already durable). A
// volatile store: whether the clear reaches PM does not matter, so it is
// never flushed.
inline void NvcHashmap::ClearDirty(uint64_t* w, uint64_t v) {
  uint64_t e = v;
  pm::CasVolatile(w, &e, v & ~kDirty);
}

// Makes the value of *w that the caller is about to act on durable; seen is
// the value the caller loaded (its kDirty counts too).
inline void NvcHashmap::EnsureWordDurable(uint64_t* w, uint64_t seen) {
  if (!w) return;
  switch (fix()) {
    case Fix::kNone:
      pm::LoadAcquire(w);
      return;
    case Fix::kFlushOnRead:
      pm::LoadAcquire(w);
      pm::Persist(w, 8);
      return;
    case Fix::kDirtyBit: {
      if (!((LoadW(w) | seen) & kDirty)) return;
      PersistDirtyWord(w);
      return;
    }
  }
}

// A deleted (marked) node: its mark must be durable before anyone reports
// the key absent or unlinks the node. The remover publishes the mark with
// kDirty (dirty_bit mode), like a link.
inline void NvcHashmap::EnsureDelDurable(Node* n) {
  switch (fix()) {
    case Fix::kNone:
      pm::LoadAcquire(&n->next);
      return;
    case Fix::kFlushOnRead:
      pm::LoadAcquire(&n->next);
      pm::Persist(&n->next, 8);
      return;
    case Fix::kDirtyBit: {
      if (!(LoadW(&n->next) & kDirty)) return;
      PersistDirtyWord(&n->next);
      return;
    }
  }
}

}  // namespace pmindex::internal::nvc
