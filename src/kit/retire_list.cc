// kit/retire_list.cc: the persistent retire list's slot bookkeeping
// (retire_list.h has the layout, persist order and thread-safety contract).
#include "kit/retire_list.h"

namespace pmindex::internal::kit {

PmRetireList::PmRetireList(char* base, pm::Allocator* alloc, uint64_t* area_word, uint32_t nslots)
    : base_(base), alloc_(alloc), area_word_(area_word), nslots_(nslots), busy_(new bool[nslots]()) {}

int PmRetireList::Claim() {
  std::lock_guard<std::mutex> g(mu_);
  if (!*area_word_) {
    if (!alloc_->AllocateZeroed(area_word_, nslots_ * sizeof(RetireSlot)).ok()) return -1;
    pm::Fence();  // orders the allocator's flushed lane clear (the caller may give up)
  }
  for (uint32_t i = 0; i < nslots_; i++) {
    if (!busy_[i]) {
      busy_[i] = true;
      return int(i);
    }
  }
  return -1;
}

void PmRetireList::Release(int i) {
  std::lock_guard<std::mutex> g(mu_);
  busy_[i] = false;
}

void PmRetireList::Own(int i, uint64_t block, uint64_t tag) {
  RetireSlot* s = slots() + i;
  St(&s->tag, tag);  // tag before block: see the persist order
  St(&s->block, block);
  pm::Persist(s, sizeof(RetireSlot));
}

void PmRetireList::Unlinked(int i) {
  RetireSlot* s = slots() + i;
  St(&s->tag, uint64_t(0));
  // The fence is not needed by any crash state: after the caller's commit
  // the slot's linked() test is false, so a crash that keeps the old tag
  // frees the block as tag 0 would (FAST & FAIR: l->sibling != r once the
  // merge committed; r is not freed, so no node links to it again before
  // the slot's free, which persists the slot's line). It is the op-return
  // rule (pmcheck's lint: no op returns with an unordered flush): when the
  // block's reclaim waits for another thread's guard, the caller's op can
  // return right after this; the two-thread merges lint line of
  // tools/pmcheck/ci.sh reports the fence's removal (docs/pmcheck.md).
  pm::Persist(&s->tag, 8);
}

void PmRetireList::Retire(int i) {
  std::lock_guard<std::mutex> g(mu_);
  retired_.Add(uint32_t(i));
  retired_count_.fetch_add(1, std::memory_order_relaxed);
}

size_t PmRetireList::Reclaim(EpochManager& epoch, bool all, const std::function<void(const RetireSlot&)>& extra) {
  std::lock_guard<std::mutex> g(mu_);
  RetireSlot* s = slots();
  auto free_one = [&](uint32_t i) {
    FreeSlot(&s[i], extra);
    busy_[i] = false;
    retired_count_.fetch_sub(1, std::memory_order_relaxed);
  };
  const size_t freed = all ? retired_.ReclaimAll(free_one) : retired_.Reclaim(epoch, free_one);
  if (freed) pm::Fence();  // orders the allocator's flushed lane clears
  return freed;
}

}  // namespace pmindex::internal::kit
