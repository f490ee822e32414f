// nvc_scan.cc: crash recovery by a sequential pass over the node slabs
// (RecoverScan), for pools of format 7 or later with compact nodes (u64 keys
// and values) in slabs. Other pools are recovered by the list walk
// (nvc_walk.h, nvc_recovery.cc), and so is any image this pass finds
// anomalous: the scan then stores nothing and Recover falls back to the walk,
// which reports the corruption precisely.
//
// Paper: Schwalb et al., IMDM'15, section 3.3 (5) walks the list; this pass
// finds the same reachable set without a dependent load per record.
//
// The graph. Every slab slot whose `next` is a nonzero unmarked link and
// whose `so` is SoRegular(hash(key)) is a *candidate*; every nonzero
// bucket-table slot is a dummy. Each has one out-edge: its link (kEnd ends).
// Format 7's invariant (nvc_format.h): a slab slot that the durable list
// does not reach is zero, marked, or the node of an insert in flight (whose
// link CAS was not durable) -- a failed insert zeroes its node's `next`
// before the slot is reused, recovery zeroes the in-flight ones. Edges go
// forward in split order, so the graph is acyclic, and the list is the part
// of it reachable from the head. In-flight nodes and unlinked claims of
// dummies are exactly the graph nodes no path from the head reaches;
// removing every node of in-degree 0 but the head, repeatedly ("peeling"),
// leaves exactly the reachable ones. A marked slot joins the graph only if
// an edge names it (a remove whose unlink was not durable, or the successor
// of an in-flight insert); every other marked slot is free.
//
// DRAM: per 32 KiB slab, four bitmaps (candidates, kept, and one named-
// bitmap per pass thread: 512 bytes); a table of 8 bytes per 32 KiB of
// pool; per bucket, three bits; an exact in-degree only for targets named twice (in a
// consistent image: one per in-flight insert or claim). Nothing per record.
//
// Work: the slabs and the bucket table are read once in address order, each
// halved between two threads; peeling visits the in-flight nodes only; a
// second pass over the slabs runs only if a reachable node is marked.
//
// Persist order (only once the image was found consistent): reachable
// words' kDirty bits cleared, reachable dummies published, links to
// reachable marked nodes skip them (the remove completed), in-flight nodes'
// `next` zeroed -- all flushed -> fence. Each store is idempotent, and each
// leaves an image whose peeling finds the same reachable set, so a crash
// during recovery is recovered the same way.
//
// Thread safety: open only (quiescent); the two pass threads write disjoint
// slabs' candidate bits and their own pointed-to bitmaps, merged after.
#include <atomic>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "nvc_hashmap/nvc_map.h"

namespace pmindex::internal::nvc {

namespace {

constexpr int kSlabShift = 15;  // kSlabSize == 1 << kSlabShift
constexpr uint64_t kWords = 16;  // bitmap words per slab (1018 compact slots)
static_assert(kSlabSize == uint64_t(1) << kSlabShift);

// The edge a link word names: the link without tag, mark and dirty bits (a
// pool offset, or b << 3 | kBucketLink).
inline uint64_t Target(uint64_t raw) { return raw & ~(kTagMask | kMark | kDirty); }

}  // namespace

struct NvcHashmap::ScanState {
  NvcHashmap* h;
  std::vector<uint64_t> slabs;                  // offsets, ascending (compact class only)
  std::vector<uint32_t> cover, start_in;        // per 32 KiB of pool: 1 + index of a slab covering its start / starting inside
  std::vector<uint64_t> cand, alive;            // per slab kWords words: candidates; graph nodes not peeled
  std::vector<uint64_t> pointed[2];             // per pass thread, then merged into [0]
  uint64_t nbuckets = 0;
  std::vector<uint64_t> bpointed[2], bpresent;  // per bucket
  std::unordered_map<uint64_t, uint64_t> extra;  // target -> in-degree - 1 (targets named more than once)
  std::vector<uint64_t> dirty[2];               // slots whose next carries kDirty
  bool anomaly = false;
  std::atomic<bool> thread_anomaly{false};
  uint64_t nslots_per = (kSlabSize - kSlabHeader) / kClassSize[0];

  static bool TestBit(const std::vector<uint64_t>& v, uint64_t i) { return v[i / 64] >> (i % 64) & 1; }
  static void SetBit(std::vector<uint64_t>& v, uint64_t i) { v[i / 64] |= 1ull << (i % 64); }
  static void ClearBit(std::vector<uint64_t>& v, uint64_t i) { v[i / 64] &= ~(1ull << (i % 64)); }

  // The global slot number (slab index * 1024 + slot) of pool offset off,
  // or false if it is not a slot of a compact slab.
  bool SlotNo(uint64_t off, uint64_t* no) const {
    const uint64_t c = off >> kSlabShift;
    if (c >= cover.size()) return false;
    for (uint32_t e : {cover[c], start_in[c]}) {
      if (!e) continue;
      const uint64_t s = slabs[e - 1];
      if (off < s + kSlabHeader || off >= s + kSlabSize) continue;
      const uint64_t rel = off - s - kSlabHeader;
      if (rel % kClassSize[0] || rel / kClassSize[0] >= nslots_per) return false;
      *no = (e - 1) * kWords * 64 + rel / kClassSize[0];
      return true;
    }
    return false;
  }
  uint64_t SlotOff(uint64_t no) const { return slabs[no / (kWords * 64)] + kSlabHeader + (no % (kWords * 64)) * kClassSize[0]; }
  CompactNode* At(uint64_t no) const { return reinterpret_cast<CompactNode*>(h->base_ + SlotOff(no)); }

  // Records an edge to `t` in pass thread p's bitmaps; false: t names
  // nothing a link may name.
  bool Edge(int p, uint64_t t, std::vector<std::pair<uint64_t, int>>* dup) {
    if (t & kBucketLink) {
      const uint64_t b = t >> 3;
      if (b == 0) return true;  // kEnd
      if (b >= nbuckets) return false;
      if (TestBit(bpointed[p], b)) dup->emplace_back(t, 1);
      SetBit(bpointed[p], b);
      return true;
    }
    uint64_t no;
    if (!SlotNo(t, &no)) return false;
    if (TestBit(pointed[p], no)) dup->emplace_back(t, 1);
    SetBit(pointed[p], no);
    return true;
  }

  // Pass 1 over slabs [lo, hi) and buckets [blo, bhi) (blo a multiple of 64,
  // so two threads set disjoint words of bpresent).
  void Pass(int p, size_t lo, size_t hi, uint64_t blo, uint64_t bhi, std::vector<std::pair<uint64_t, int>>* dup) {
    for (size_t si = lo; si < hi; si++) {
      const CompactNode* n = reinterpret_cast<const CompactNode*>(h->base_ + slabs[si] + kSlabHeader);
      for (uint64_t i = 0; i < nslots_per; i++, n++) {
        const uint64_t raw = LoadW(&n->next);
        if (!raw || (raw & kMark)) continue;
        if (n->so != SoRegular(HashKey(KeyKind::kU64, Slice(reinterpret_cast<const char*>(&n->key), 8)))) continue;
        const uint64_t no = si * kWords * 64 + i;
        SetBit(cand, no);
        if (raw & kDirty) dirty[p].push_back(no);
        if (!Edge(p, Target(raw), dup)) thread_anomaly.store(true, std::memory_order_relaxed);
      }
    }
    for (uint64_t b = blo; b < bhi; b++) {
      const uint64_t* w = h->BucketSlot(b, false);
      if (!w || !*w) continue;
      SetBit(bpresent, b);
      if (!Edge(p, Target(*w & ~kUnpub), dup)) thread_anomaly.store(true, std::memory_order_relaxed);
    }
  }

  // One more edge after pass 1 (marked nodes joining the graph): counted
  // into the merged bitmaps; a slot named for the first time that is not a
  // candidate is pushed to *work.
  void AddEdge(uint64_t t, std::vector<uint64_t>* work) {
    if (t & kBucketLink) {
      const uint64_t b = t >> 3;
      if (b == 0) return;
      if (b >= nbuckets) {
        anomaly = true;
        return;
      }
      if (TestBit(bpointed[0], b)) ++extra[t];
      SetBit(bpointed[0], b);
      return;
    }
    uint64_t no;
    if (!SlotNo(t, &no)) {
      anomaly = true;
      return;
    }
    if (TestBit(pointed[0], no)) {
      ++extra[t];
      return;
    }
    SetBit(pointed[0], no);
    if (!TestBit(cand, no)) work->push_back(no);
  }

  // The in-degree of the node or dummy that link target t names dropped by
  // one; at 0 it is unreachable: peel it and follow its edge. A sink (a
  // named slot or bucket holding no node) has no edge: it is only recorded
  // as no longer named. Naming a peeled node again is an anomaly.
  void Drop(uint64_t t, std::vector<uint64_t>* dead) {
    while (!anomaly) {
      if ((t & kBucketLink) && (t >> 3) == 0) return;
      auto it = extra.find(t);
      if (it != extra.end() && it->second > 0) {
        --it->second;
        return;
      }
      if (sinks.count(t)) {
        sinks_dropped.insert(t);
        return;
      }
      if (t & kBucketLink) {
        const uint64_t b = t >> 3;
        if (!TestBit(bpresent, b)) {
          anomaly = true;
          return;
        }
        ClearBit(bpresent, b);
        t = Target(*h->BucketSlot(b, false) & ~kUnpub);
        continue;
      }
      uint64_t no;
      if (!SlotNo(t, &no) || !TestBit(alive, no)) {
        anomaly = true;
        return;
      }
      ClearBit(alive, no);
      if (TestBit(cand, no)) dead->push_back(no);
      t = Target(LoadW(&At(no)->next));
    }
  }
  std::unordered_set<uint64_t> sinks, sinks_dropped;
};

Status NvcHashmap::RecoverScan(SlabBits* live_slab, BucketSet* linked, uint64_t* count, bool* fallback) {
  *fallback = true;
  ScanState st;
  st.h = this;
  for (auto& [off, cls] : slab_cls_) {
    if (cls != 0) return Status::OK();  // compact pools have class 0 slabs only
    st.slabs.push_back(off);
  }
  const size_t ns = st.slabs.size();
  if (ns >= UINT32_MAX) return Status::OK();  // slab numbers are 32-bit in the lookup table: walk
  const uint64_t chunks = (pool_->size() >> kSlabShift) + 1;
  st.cover.assign(chunks, 0);
  st.start_in.assign(chunks, 0);
  for (size_t i = 0; i < ns; i++) {
    const uint64_t s = st.slabs[i];
    if (s % kSlabSize) st.start_in[s >> kSlabShift] = uint32_t(i + 1);
    else st.cover[s >> kSlabShift] = uint32_t(i + 1);
    if (s % kSlabSize && ((s + kSlabSize) >> kSlabShift) < chunks) st.cover[(s + kSlabSize) >> kSlabShift] = uint32_t(i + 1);
  }
  const uint64_t nbits = ns * kWords * 64;
  st.cand.assign(nbits / 64, 0);
  for (int s = 0; s < kMaxSegments; s++)
    if (segs_[s].load()) st.nbuckets = FirstBucket(s) + SegSize(s);
  for (int p = 0; p < 2; p++) {
    st.pointed[p].assign(nbits / 64, 0);
    st.bpointed[p].assign(st.nbuckets / 64 + 1, 0);
  }
  st.bpresent.assign(st.nbuckets / 64 + 1, 0);

  // Pass 1: candidates and their edges, two threads, each half of the slabs
  // and half of the bucket table (at 10M records the table holds 8M
  // buckets: as much work as a third of the slabs), so neither waits for
  // the other.
  std::vector<std::pair<uint64_t, int>> dup[2];
  const int want = recovery_threads_ > 0 ? recovery_threads_ : int(std::thread::hardware_concurrency());
  if (want >= 2) {
    const size_t mid = ns / 2;
    const uint64_t bmid = st.nbuckets / 2 / 64 * 64;
    std::thread second([&] { st.Pass(1, mid, ns, bmid, st.nbuckets, &dup[1]); });
    st.Pass(0, 0, mid, 0, bmid, &dup[0]);
    second.join();
  } else {
    st.Pass(0, 0, ns, 0, st.nbuckets, &dup[0]);
  }
  recovery_walkers_ = want >= 2 ? 2 : 1;
  if (st.thread_anomaly.load()) return Status::OK();
  for (int p = 0; p < 2; p++)
    for (auto& [t, n] : dup[p]) st.extra[t] += uint64_t(n);
  // Merge: a target named by both threads is named once more.
  auto merge = [&](std::vector<uint64_t>& a, const std::vector<uint64_t>& b, bool bucket) {
    for (size_t w = 0; w < a.size(); w++) {
      uint64_t both = a[w] & b[w];
      while (both) {
        const uint64_t no = w * 64 + uint64_t(__builtin_ctzll(both));
        both &= both - 1;
        ++st.extra[bucket ? (no << 3 | kBucketLink) : st.SlotOff(no)];
      }
      a[w] |= b[w];
    }
  };
  merge(st.pointed[0], st.pointed[1], false);
  merge(st.bpointed[0], st.bpointed[1], true);
  st.pointed[1] = {};
  st.bpointed[1] = {};

  // Named slots that are not candidates: a marked node joins the graph with
  // its edge (which may name another); anything else is a sink (no edge),
  // which must end up unnamed, as must every dummy slot that is named but 0.
  st.alive = st.cand;
  std::vector<uint64_t> work;
  for (size_t w = 0; w < st.cand.size(); w++) {
    uint64_t x = st.pointed[0][w] & ~st.cand[w];
    while (x) {
      work.push_back(w * 64 + uint64_t(__builtin_ctzll(x)));
      x &= x - 1;
    }
  }
  std::vector<uint64_t> marked_live;
  while (!work.empty() && !st.anomaly) {
    const uint64_t no = work.back();
    work.pop_back();
    const CompactNode* n = st.At(no);
    const uint64_t raw = LoadW(&n->next);
    if (raw && (raw & kMark) &&
        n->so == SoRegular(HashKey(KeyKind::kU64, Slice(reinterpret_cast<const char*>(&n->key), 8)))) {
      ScanState::SetBit(st.alive, no);
      marked_live.push_back(no);
      st.AddEdge(Target(raw), &work);
    } else {
      st.sinks.insert(st.SlotOff(no));
    }
  }
  for (size_t wi = 0; wi < st.bpresent.size(); wi++)
    for (uint64_t x = st.bpointed[0][wi] & ~st.bpresent[wi] & (wi ? ~uint64_t(0) : ~uint64_t(1)); x; x &= x - 1)
      st.sinks.insert((wi * 64 + uint64_t(__builtin_ctzll(x))) << 3 | kBucketLink);
  if (st.anomaly) return Status::OK();

  // Peel: every graph node no edge names (but the head) is unreachable.
  std::vector<uint64_t> dead;
  for (size_t w = 0; w < st.alive.size() && !st.anomaly; w++) {
    uint64_t roots = st.alive[w] & ~st.pointed[0][w];
    while (roots) {
      const uint64_t no = w * 64 + uint64_t(__builtin_ctzll(roots));
      roots &= roots - 1;
      ScanState::ClearBit(st.alive, no);
      if (ScanState::TestBit(st.cand, no)) dead.push_back(no);
      st.Drop(Target(LoadW(&st.At(no)->next)), &dead);
    }
  }
  // Dummies no edge names (but the head), in ascending order; a word is
  // read again after each peel, which may have peeled its later buckets.
  for (size_t wi = 0; wi < st.bpresent.size() && !st.anomaly; wi++) {
    for (uint64_t x; !st.anomaly && (x = st.bpresent[wi] & ~st.bpointed[0][wi] & (wi ? ~uint64_t(0) : ~uint64_t(1)));) {
      const uint64_t b = wi * 64 + uint64_t(__builtin_ctzll(x));
      ScanState::ClearBit(st.bpresent, b);
      st.Drop(Target(*BucketSlot(b, false) & ~kUnpub), &dead);
    }
  }
  if (st.anomaly) return Status::OK();
  // A consistent image: every reachable node is named exactly once, and no
  // reachable node names a sink.
  for (auto& [t, n] : st.extra)
    if (n) return Status::OK();
  for (uint64_t t : st.sinks)
    if (!st.sinks_dropped.count(t)) return Status::OK();
  *fallback = false;

  // Repairs (flushed, one fence at the end).
  auto clean = [](uint64_t* w, uint64_t drop) {
    const uint64_t v = LoadW(w);
    if (v & drop) {
      pm::StoreAtomic(w, v & ~drop);
      pm::Flush(w, 8);
    }
  };
  for (int p = 0; p < 2; p++)
    for (uint64_t no : st.dirty[p])
      if (ScanState::TestBit(st.alive, no)) clean(&st.At(no)->next, kDirty);
  std::vector<uint64_t> rm;  // reachable marked nodes
  for (uint64_t no : marked_live)
    if (ScanState::TestBit(st.alive, no)) rm.push_back(no);
  // The link after a chain of reachable marked nodes starting at target t.
  auto skip = [&](uint64_t raw) {
    uint64_t no;
    while (!(raw & kBucketLink) && st.SlotNo(Target(raw), &no) && ScanState::TestBit(st.alive, no) &&
           !ScanState::TestBit(st.cand, no))
      raw = Succ(LoadW(&st.At(no)->next));
    return raw;
  };
  auto relink = [&](uint64_t* w, uint64_t keep) {
    const uint64_t v = LoadW(w);
    const uint64_t nv = skip(Succ(v)) | (v & keep);
    if (nv != v) {
      pm::StoreAtomic(w, nv);
      pm::Flush(w, 8);
    }
  };
  // The reachable dummies (the head and every bucket still present), a
  // bitmap word at a time.
  std::vector<uint64_t> reach = st.bpresent;
  reach[0] |= 1;
  for (size_t wi = 0; wi < reach.size(); wi++) {
    for (uint64_t x = reach[wi]; x; x &= x - 1) {
      uint64_t* w = BucketSlot(wi * 64 + uint64_t(__builtin_ctzll(x)), false);
      const uint64_t v = LoadW(w);
      if (v & (kDirty | kUnpub)) {
        pm::StoreAtomic(w, v & ~(kDirty | kUnpub));
        pm::Flush(w, 8);
      }
      if (!rm.empty()) relink(w, 0);
    }
  }
  linked->Assign(std::move(reach));
  for (size_t si = 0; si < ns; si++) {
    std::array<uint64_t, kWords> words;
    uint64_t any = 0;
    for (uint64_t w = 0; w < kWords; w++) {
      words[w] = st.alive[si * kWords + w] & st.cand[si * kWords + w];
      any |= words[w];
      *count += uint64_t(__builtin_popcountll(words[w]));
    }
    if (!any) continue;
    live_slab->SetWords(st.slabs[si], words);
    if (rm.empty()) continue;
    for (uint64_t w = 0; w < kWords; w++)
      for (uint64_t x = words[w]; x; x &= x - 1) relink(&st.At(si * kWords * 64 + w * 64 + uint64_t(__builtin_ctzll(x)))->next, 0);
  }
  // In-flight nodes: zeroed, so no later scan takes them for candidates.
  for (uint64_t no : dead) {
    uint64_t* w = &st.At(no)->next;
    pm::StoreAtomic(w, uint64_t(0));
    pm::Flush(w, 8);
  }
  pm::Fence();
  return Status::OK();
}

}  // namespace pmindex::internal::nvc
