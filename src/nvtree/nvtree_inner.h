// nvtree/nvtree_inner.h: NV-Tree's DRAM inner nodes (PiBench sec. 3.2):
// contiguous, pointer-free levels found by offset arithmetic above an array
// of parent-of-leaves nodes (PLNs).
//
// Shape. `Inner` is built wholesale from the leaves in key order: the leaves
// are cut into PLNs of `fill` leaves (half of a PLN's capacity: the sparse
// build that leaves room for splits, at the DRAM cost PiBench measured, fig.
// 18). levels[0] holds the low key of each PLN; levels[i + 1] holds every
// fanout-th key of levels[i], up to a top level of at most `fanout` keys.
// Node j of level i is the key range [j * fanout, (j + 1) * fanout) of
// levels[i], so a lookup descends by index arithmetic alone. A PLN maps the
// keys of its range to its leaves: seps[0] is its low key, seps[i] (i > 0)
// the low key of leaf i. Key 0 / "" is below every key, so the first low
// keys route everything below the second one.
//
// Updates. The upper levels never change once built. A leaf replacement
// changes one PLN copy-on-write (a new Pln published with one atomic pointer
// store; the old one is retired and freed after an epoch grace period); a
// PLN that would exceed its capacity makes the caller rebuild the whole
// Inner. Deviation from the paper: the PLN slots are contiguous but hold
// pointers to immutable PLN bodies, so lock-free readers see a PLN either
// before or after a change and byte separators need no seqlock.
//
// Thread safety: Route/RouteLeaf from any thread inside an epoch guard; the
// PLN pointer swaps and builds by the one structure-change holder (the
// index's smo mutex) or by open; a build may run its own worker threads
// (joined before the constructor returns).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace pmindex::internal::nvtree {

template <typename K>
struct Pln {
  std::vector<K> seps;
  std::vector<uint64_t> leaves;
  size_t size() const { return leaves.size(); }
  // Index of the leaf whose range holds k: the last i with seps[i] <= k
  // (seps[0] counts as below every key).
  size_t Route(const K& k) const {
    auto it = std::upper_bound(seps.begin() + 1, seps.end(), k);
    return size_t(it - seps.begin()) - 1;
  }
  size_t Bytes() const {
    size_t b = sizeof(*this) + seps.capacity() * sizeof(K) + leaves.capacity() * 8;
    if constexpr (std::is_same_v<K, std::string>)
      for (const K& s : seps) b += s.capacity() > 15 ? s.capacity() : 0;
    return b;
  }
};

template <typename K>
class Inner {
 public:
  // Builds from leaves in key order with their low keys (lows[0] unused);
  // fill leaves per PLN, PLN capacity cap, upper fanout. The PLNs are built
  // by up to `threads` threads (at most one per 64 PLNs), each taking every
  // threads-th PLN; the upper levels, a fanout-th of the keys, by the caller.
  Inner(const std::vector<K>& lows, const std::vector<uint64_t>& leaves, uint32_t fill, uint32_t fanout,
        size_t threads = 1)
      : fanout_(fanout) {
    const size_t n = leaves.size();
    const size_t np = n ? (n + fill - 1) / fill : 1;
    nplns_ = np;
    plns_.reset(new std::atomic<Pln<K>*>[np]);
    std::vector<K> low(np);
    threads = std::max<size_t>(1, std::min(threads, np / 64));
    auto build = [&](size_t t) {
      for (size_t p = t; p < np; p += threads) {
        auto* pl = new Pln<K>;
        const size_t lo = p * fill, hi = std::min(n, lo + fill);
        pl->seps.reserve(fill * 2);
        pl->leaves.reserve(fill * 2);
        for (size_t i = lo; i < hi; i++) {
          pl->seps.push_back(i == 0 ? K{} : lows[i]);
          pl->leaves.push_back(leaves[i]);
        }
        low[p] = pl->seps.empty() ? K{} : pl->seps[0];
        plns_[p].store(pl, std::memory_order_relaxed);
      }
    };
    if (threads == 1) {
      build(0);
    } else {
      std::vector<std::thread> ts;
      for (size_t t = 0; t < threads; t++) ts.emplace_back(build, t);
      for (auto& t : ts) t.join();
    }
    levels_.push_back(std::move(low));
    while (levels_.back().size() > fanout_) {
      const auto& below = levels_.back();
      std::vector<K> up;
      up.reserve(below.size() / fanout_ + 1);
      for (size_t i = 0; i < below.size(); i += fanout_) up.push_back(below[i]);
      levels_.push_back(std::move(up));
    }
  }
  ~Inner() {
    for (size_t p = 0; p < nplns_; p++) delete plns_[p].load(std::memory_order_relaxed);
  }
  Inner(const Inner&) = delete;
  Inner& operator=(const Inner&) = delete;

  // The PLN whose range holds k.
  size_t Route(const K& k) const {
    size_t pos = 0;
    for (size_t l = levels_.size(); l-- > 0;) {
      const auto& lv = levels_[l];
      const size_t lo = pos * (l + 1 == levels_.size() ? 0 : fanout_);
      const size_t hi = l + 1 == levels_.size() ? lv.size() : std::min(lv.size(), lo + fanout_);
      auto it = std::upper_bound(lv.begin() + lo + 1, lv.begin() + hi, k);
      pos = size_t(it - lv.begin()) - 1;
    }
    return pos;
  }
  Pln<K>* pln(size_t p) const { return plns_[p].load(std::memory_order_acquire); }
  // Publishes a new body for PLN p; returns the old one (the caller retires it).
  Pln<K>* Swap(size_t p, Pln<K>* nw) { return plns_[p].exchange(nw, std::memory_order_acq_rel); }
  size_t plns() const { return nplns_; }
  size_t Bytes() const {
    size_t b = sizeof(*this) + nplns_ * sizeof(void*);
    for (const auto& lv : levels_) {
      b += lv.capacity() * sizeof(K);
      if constexpr (std::is_same_v<K, std::string>)
        for (const K& s : lv) b += s.capacity() > 15 ? s.capacity() : 0;
    }
    for (size_t p = 0; p < nplns_; p++) b += pln(p)->Bytes();
    return b;
  }
  size_t height() const { return levels_.size() + 1; }

 private:
  uint32_t fanout_;
  size_t nplns_ = 0;
  std::unique_ptr<std::atomic<Pln<K>*>[]> plns_;
  std::vector<std::vector<K>> levels_;
};

}  // namespace pmindex::internal::nvtree
