// kit/retire_list.h: a persistent retire list. Deferred frees owned in PM:
// a block that an index unlinks while lock-free readers may still stand on
// it is owned by a persistent slot from before its unlink until it is freed
// after an epoch grace period (kit/epoch.h), so a crash anywhere between
// the unlink and the free leaks nothing: recovery frees what the slots own.
// Used by fastfair for the nodes its merges and root collapses unlink (its
// limbo slots; docs/fastfair.md, "Merges"). No paper section: the FAIR
// merge (FAST'18 sec. 4.2) frees at once, with no readers to protect.
//
// Layout: a fixed array of `nslots` RetireSlot {block, tag} in one PM block
// allocated by the first Claim() into a persistent word of the caller
// (`*area_word`, 0 until then). A slot is in use iff block != 0. `tag` is
// the caller's word telling recovery whether the unlink may still be
// undone: while it is nonzero, recovery asks the caller (`linked`) whether
// the block is still reachable and, if so, calls `undo` and empties the
// slot instead of freeing the block; 0 means the unlink is durable.
//
// Persist order of one retirement:
//   Own(i, block, tag):  slot.tag, then slot.block (one line; a crash keeps
//                        a prefix of a line's stores, so block is never
//                        durable without its tag), persisted;
//   ... the caller unlinks the block (its own persist order) ...
//   Unlinked(i):         slot.tag = 0, persisted (optional: recovery asks
//                        `linked` while tag != 0);
//   Retire(i);           DRAM only: stamped with the epoch at the next
//                        Reclaim;
//   Reclaim:             after the grace period, extra(slot) (the caller
//                        frees blocks the node owns), then
//                        Allocator::Free(&slot.block), which clears the slot
//                        as its commit; one fence after the batch.
// Recover (read-write open, before any operation): every used slot either
// goes back (linked: undo, then block and tag cleared, persisted) or is
// freed (tag cleared first if set, extra, Free, fence). Constant work:
// `nslots` words.
//
// Thread safety: Claim, Release, Retire and Reclaim may be called
// concurrently (one mutex, never held across a caller callback other than
// the free functions). Own and Unlinked touch only the caller's claimed
// slot. Recover and ForEachUsed only when no operation runs.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

#include "kit/epoch.h"
#include "pmindex/pm/allocator.h"
#include "pmindex/pm/persist.h"

namespace pmindex::internal::kit {

struct RetireSlot {
  uint64_t block;  // the block to free (0: slot free)
  uint64_t tag;    // the caller's "unlink not durable yet" word (0: unlinked)
};
static_assert(sizeof(RetireSlot) == 16);

class PmRetireList {
 public:
  // base: the pool's mapping (offsets are relative to it); area_word: the
  // caller's persistent word owning the slot array.
  PmRetireList(char* base, pm::Allocator* alloc, uint64_t* area_word, uint32_t nslots);
  PmRetireList(const PmRetireList&) = delete;
  PmRetireList& operator=(const PmRetireList&) = delete;

  uint32_t size() const { return nslots_; }
  bool allocated() const { return *area_word_ != 0; }
  // The slot array (allocated() only).
  RetireSlot* slots() const { return reinterpret_cast<RetireSlot*>(base_ + *area_word_); }

  // A free slot (allocating the array on first use), or -1: none free, or
  // the pool is full. The caller owns the slot until Release or Retire.
  int Claim();
  // Gives back a claimed slot that was never Own()ed (or was emptied).
  void Release(int i);
  // Persist order above: tag, then block, one persisted line.
  void Own(int i, uint64_t block, uint64_t tag);
  // The unlink is durable: tag = 0, persisted.
  void Unlinked(int i);
  // The block is unlinked; free it once every guard of the epoch manager
  // that could see it has ended (next Reclaim).
  void Retire(int i);
  // Retired slots not freed yet (a relaxed read: a hint for the fast path).
  bool has_retired() const { return retired_count_.load(std::memory_order_relaxed) != 0; }
  // DRAM of the list itself and its busy map (not the retired entries in
  // flight: reading those would race with Retire).
  size_t dram_bytes() const { return sizeof(*this) + nslots_; }

  // Frees the retired blocks whose grace period passed (all of them if
  // `all`: no thread is in the index any more). extra(slot) frees what the
  // block owns besides itself (reclaim is rare: a std::function costs
  // nothing that matters). Returns the number freed. Call outside any
  // guard of `epoch` for this thread's own retirements to go.
  size_t Reclaim(EpochManager& epoch, bool all, const std::function<void(const RetireSlot&)>& extra);

  // Open (read-write): settles every used slot, see the persist order
  // above. linked(const RetireSlot&) -> bool is asked only when tag != 0;
  // undo(const RetireSlot&) puts a linked block back. Returns the number of
  // blocks freed.
  template <typename Linked, typename Undo, typename Extra>
  size_t Recover(Linked&& linked, Undo&& undo, Extra&& extra) {
    if (!allocated()) return 0;
    RetireSlot* s = slots();
    size_t freed = 0;
    for (uint32_t i = 0; i < nslots_; i++) {
      if (!s[i].block) continue;
      if (s[i].tag && linked(s[i])) {
        undo(s[i]);
        St(&s[i].block, uint64_t(0));
        St(&s[i].tag, uint64_t(0));
        pm::Persist(&s[i], sizeof(RetireSlot));
      } else {
        if (s[i].tag) {
          St(&s[i].tag, uint64_t(0));
          pm::Persist(&s[i].tag, 8);
        }
        FreeSlot(&s[i], extra);
        pm::Fence();
        freed++;
      }
    }
    return freed;
  }

  // fn(const RetireSlot&) for every used slot (quiescent callers).
  template <typename F>
  void ForEachUsed(F&& fn) const {
    if (!allocated()) return;
    const RetireSlot* s = slots();
    for (uint32_t i = 0; i < nslots_; i++)
      if (s[i].block) fn(s[i]);
  }

 private:
  static void St(uint64_t* p, uint64_t v) { pm::StoreAtomic(p, v); }
  template <typename Extra>
  void FreeSlot(RetireSlot* s, Extra& extra) {
    extra(static_cast<const RetireSlot&>(*s));
    alloc_->FreeOrAbort(&s->block);
  }

  char* const base_;
  pm::Allocator* const alloc_;
  uint64_t* const area_word_;
  const uint32_t nslots_;
  std::mutex mu_;
  std::unique_ptr<bool[]> busy_;  // DRAM: claimed or retired
  RetireList<uint32_t> retired_;  // slot numbers with their epoch stamps
  std::atomic<uint32_t> retired_count_{0};
};

}  // namespace pmindex::internal::kit
