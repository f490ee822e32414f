// fptree/fptree_scan.cc: range scans of the FPTree family (paper sec. 4.3
// "range search"; leaves are unsorted, so each leaf's records are ordered
// as it is read) and the scan-order hint.
//
// A scan descends to the leaf covering its start key, then follows the leaf
// list through the next pointers, reading each leaf optimistically (fptree:
// version read before, validated after, no lock) into a batch of up to 512
// records, which it hands to the callback outside the epoch guard. A leaf
// that changed, or a next leaf that is locked or obsolete, ends the batch;
// the next batch descends again from the last key collected. Later leaves
// are filtered by the last key collected: a leaf passed may have emptied and
// been deleted meanwhile, its range merged into the next leaf, which can
// then hold smaller keys inserted after they were read.
//
// Scan-order hint:
//   Leaves are unsorted (sec. 4.1), so a scan needs each leaf's records in
//   key order. The last scan that sorted a leaf leaves that order in the 48
//   unused bytes of the leaf's trailer line (after the next pointer and the
//   unused word): up to 64 six-bit slot indices, entry j at bits [6j, 6j+6) of
//   the six little-endian words. It is a hint, not state: written with
//   volatile stores (pm::StoreVolatile: never flushed; pmcheck logs them,
//   only its lint ignores them), never touched by writers, not copied by
//   splits, and trusted only if it lists exactly the valid slots (LoadHint) in strictly ascending key order (the
//   caller checks while it reads the keys, which an unsorted leaf needs
//   anyway: a record below the last one emitted could hide in any slot).
//   Such a list *is* the sorted order of the records as read, whatever
//   happened since it was written: inserts, deletes, slot reuse with an
//   unchanged bitmap, a leaf freed and reallocated, a crash (the trailer
//   line reaches PM whenever a split flushes the next pointer, or by
//   eviction, with any hint contents), a pool written by an older version
//   (the bytes were zero or stale), or a hint torn by two scans storing at
//   once. A failed check sorts, stores a fresh hint and goes on. Concurrent
//   trees store a hint only from a version-validated read of the leaf.
//   It lives in the leaf's own trailer line, which the scan reads anyway
//   (next pointer, version), so it costs no extra miss and no DRAM and
//   scales with the tree.
//
// u64 scans (ScanU64) also prefetch the next leaves' header lines several
// leaves ahead from the bottom inner node's children (Ahead; a prefetch
// only, the list is still followed through the validated next pointers).
//
// Persist order: scans store nothing durable (the hint's stores are
// volatile). Thread safety: fptree: concurrent with every operation, no
// lock taken; the others: one thread at a time. A callback may call any
// operation of the index, Scan included (a nested u64 scan takes a record
// buffer of its own: ScanBuffer).
#include <algorithm>
#include <memory>

#include "fptree/fptree_tree.h"

namespace pmindex::internal::fptree {

// The scan's per-leaf helpers, used only in this file, are forced inline:
// at -O2 GCC otherwise calls them out of line (ReadLeafSortedU64 takes ten
// arguments), which costs about 8% more instructions per scan of 100.
#define PMINDEX_FPTREE_SCAN_INLINE __attribute__((always_inline)) inline

template <bool kConc, bool kBytes>
Status FPTree<kConc, kBytes>::Scan(Slice start, size_t n, ScanCallback cb, size_t* count) {
  if (count) *count = 0;
  if (closed_) return Status::InvalidArgument("index closed");
  PMINDEX_RETURN_IF_ERROR(ValidateKey(key_kind(), max_key_, start));
  if constexpr (!kBytes) {
    if (!vbytes_) return ScanU64(SliceToU64(start), n, cb, count);
  }
  size_t done = 0;
  Rec resume;
  bool inclusive = true;
  if constexpr (kBytes) resume.ks.assign(start.data(), start.size());
  else resume.k = SliceToU64(start);
  std::vector<Rec> out, leafrecs;
  std::vector<std::pair<Rec, int>> scratch;
  while (done < n) {
    out.clear();
    bool end = false;
    {
      EpochGuard g(epoch_, kConc);
      SKey k = RecKey(resume);
      uint64_t lv = 0;
      uint64_t loff = FindLeaf(k, &lv);
      size_t want = std::min<size_t>(n - done, 512);
      bool incl = inclusive;
      while (out.size() < want) {
        char* l = L(loff);
        uint64_t nx = 0;
        bool corrupt = false;
        if (!ReadLeafRecs(l, lv, k, incl, &leafrecs, &scratch, &nx, &corrupt)) {
          if (corrupt) {
            if (count) *count = done;
            return Status::Corrupt("fptree: unreadable key or value block in leaf " + Num(loff));
          }
          break;  // changed: re-traverse
        }
        for (auto& r : leafrecs) out.push_back(std::move(r));
        // Later leaves are filtered by the last key collected: a leaf we
        // passed may have emptied and been deleted meanwhile, its range
        // merged into the next leaf, which can then hold smaller keys
        // inserted after we read them.
        if (!out.empty()) {
          if constexpr (kBytes) k.s = out.back().ks;
          else k.u = out.back().k;
          incl = false;
        }
        if (nx == 0) {
          end = true;
          break;
        }
        // Continue along the list; an obsolete/locked next leaf re-traverses.
        if (!StepTo(nx, &loff, &lv)) break;
      }
    }
    size_t emit = std::min(out.size(), n - done);
    for (size_t i = 0; i < emit; i++) {
      Rec& r = out[i];
      Slice ks = kBytes ? Slice(r.ks) : U64Slice(r.k);
      Slice vs = vbytes_ ? Slice(r.vs) : U64Slice(r.v);
      done++;
      if (!cb(ks, vs)) {
        if (count) *count = done;
        return Status::OK();
      }
    }
    if (emit > 0) {
      resume = std::move(out[emit - 1]);
      inclusive = false;
    }
    if (end && emit == out.size()) break;
  }
  if (count) *count = done;
  return Status::OK();
}
// Per-thread record buffer of ScanU64 (kScanBatch records plus one leaf),
// reached once per scan: a thread_local name used in the loops cost a TLS
// lookup per record, and a vector a capacity check per record. The buffer
// holds the batch a scan is handing out while its callback runs; a scan
// started from that callback on the same thread (*busy is set) gets a
// buffer of its own in *own instead. Otherwise *busy is set until the
// caller clears it.
template <bool kConc, bool kBytes>
__attribute__((noinline)) typename FPTree<kConc, kBytes>::KV* FPTree<kConc, kBytes>::ScanBuffer(std::unique_ptr<KV[]>* own,
                                                                                                bool** busy) {
  static FPT_TLS std::unique_ptr<KV[]>* buf = nullptr;  // pointer: a trivial TLS object
  static FPT_TLS bool in_use = false;
  thread_local std::unique_ptr<KV[]> owner;  // frees it at thread exit
  if (in_use) {
    own->reset(new KV[kScanBatch + 64]);
    *busy = nullptr;
    return own->get();
  }
  if (!buf) {
    owner.reset(new KV[kScanBatch + 64]);
    buf = &owner;
  }
  in_use = true;
  *busy = &in_use;
  return buf->get();
}
// Scan for u64 keys and values: the same algorithm as Scan with plain
// (key, value) pairs instead of owned strings; each leaf is read in the
// order of its scan-order hint when the hint checks out (see LoadHint).
template <bool kConc, bool kBytes>
Status FPTree<kConc, kBytes>::ScanU64(uint64_t start, size_t n, ScanCallback cb, size_t* count) {
  size_t done = 0;
  uint64_t resume = start;
  bool inclusive = true;
  std::unique_ptr<KV[]> own;  // a nested scan's buffer
  bool* busy = nullptr;
  KV* out = ScanBuffer(&own, &busy);
  struct Release {
    bool* busy;
    ~Release() {
      if (busy) *busy = false;
    }
  } release{busy};
  while (done < n) {
    size_t nout = 0;
    bool end = false;
    {
      EpochGuard g(epoch_, kConc);
      SKey k;
      k.u = resume;
      uint64_t lv = 0;
      Path path;
      uint64_t loff = FindLeaf(k, &lv, &path);
      PrefetchLeaf(loff);  // its lines are read in key order, i.e. at random
      size_t want = std::min<size_t>(n - done, kScanBatch);
      Ahead ahead{path.parent, path.idx, path.idx};
      int per_leaf = int(lay_.m / 2);  // records per leaf, guessed until one is read
      while (nout < want) {
        PrefetchAhead(&ahead, (want - nout) / size_t(std::max(per_leaf, 1)) + 1);
        char* l = L(loff);
        size_t before = nout;
        bool truncated = false;
        if (!ReadLeafSortedU64(l, lv, resume, inclusive, want - before, ahead.pf > ahead.pos, out, &nout, &truncated,
                               &per_leaf)) {
          nout = before;
          break;  // changed: re-traverse from the last key collected
        }
        uint64_t nx = NextAcquire(l);  // the loop reads that leaf next (NextAcquire)
        if (!LeafValidate(l, lv)) {
          nout = before;
          break;
        }
        if (nout > before) {  // see Scan: filter later leaves by the last key collected
          resume = out[nout - 1].first;
          inclusive = false;
        }
        if (truncated) break;  // enough records; the rest of this leaf is not needed
        if (nx == 0) {
          end = true;
          break;
        }
        if (!StepTo(nx, &loff, &lv)) break;
        ahead.pos++;
      }
    }
    size_t emit = std::min(nout, n - done);
    for (size_t i = 0; i < emit; i++) {
      done++;
      if (!cb(U64Slice(out[i].first), U64Slice(out[i].second))) {
        if (count) *count = done;
        return Status::OK();
      }
    }
    if (emit > 0) {
      resume = out[emit - 1].first;
      inclusive = false;
    }
    if (end && emit == nout) break;
  }
  if (count) *count = done;
  return Status::OK();
}
// True if a whole leaf at `off` lies in the pool's current size (it grows
// in place while open, so the size at open is not a bound). The pool only
// grows (file extended and mapped before the header's size is published),
// so a size seen once stays a valid bound: the hot path compares with the
// last size seen and reads the header (an out-of-line acquire load) only
// for an offset beyond it.
template <bool kConc, bool kBytes>
PMINDEX_FPTREE_SCAN_INLINE bool FPTree<kConc, kBytes>::InPool(uint64_t off) const {
  auto fits = [&](uint64_t size) { return off && size >= lay_.bytes && off <= size - lay_.bytes; };
  if (fits(known_size_.load(std::memory_order_relaxed))) return true;
  const uint64_t size = pool_->size();  // acquire
  known_size_.store(size, std::memory_order_relaxed);
  return fits(size);
}
template <bool kConc, bool kBytes>
void FPTree<kConc, kBytes>::PrefetchLeaf(uint64_t off) const {
  if (InReserved(off))
    for (uint32_t o = 0; o < lay_.bytes; o += 64) __builtin_prefetch(L(off) + o);
}
// Scan lookahead. The leaves a scan visits next are its bottom inner
// node's next children: their offsets are known without waiting for each
// leaf's next pointer, so the leaves' header lines (bitmap, trailer) are
// fetched several leaves ahead instead of one dependent miss per leaf,
// which dominates when deletes have left leaves sparse (the paper never
// merges leaves). The child words are read without validation: a stale
// offset only wastes a prefetch (bounded by the pool size; the node is
// not freed while the scan's epoch guard is held). The list order, read
// through the next pointers and validated, is still what the scan follows.
template <bool kConc, bool kBytes>
PMINDEX_FPTREE_SCAN_INLINE void FPTree<kConc, kBytes>::PrefetchAhead(Ahead* a, size_t leaves) const {
  if (!a->parent) return;
  uint32_t cnt = std::min(a->parent->count.load(std::memory_order_relaxed), a->parent->cap);
  uint32_t last = uint32_t(std::min<size_t>(std::min<size_t>(leaves, kMaxAhead) + a->pos, cnt));
  for (; a->pf < last; a->pf++) {
    uint64_t off = a->parent->child()[a->pf + 1].load(std::memory_order_relaxed);
    if (InReserved(off)) {
      __builtin_prefetch(L(off));
      __builtin_prefetch(L(off) + lay_.trailer);
    }
  }
}
// The lines of leaf `off` that hold its valid slots (from its bitmap, whose
// line PrefetchAhead fetched earlier). This loads the bitmap: `off` must
// come from an acquire load of a next pointer (the split that published
// the leaf wrote its bitmap with plain stores before the release store of
// the next pointer), and lie in the pool's current size.
template <bool kConc, bool kBytes>
PMINDEX_FPTREE_SCAN_INLINE void FPTree<kConc, kBytes>::PrefetchRecords(uint64_t off) const {
  if (!InPool(off)) return;
  char* l = L(off);
  uint64_t bm = Ld(Bm(l)) & lay_.full;
  const uint32_t per = 64 / lay_.key_stride;  // slots per line: 4 (fptree), 8 (ptree)
  const uint64_t group = (1ull << per) - 1;
  for (uint32_t s = 0; s < lay_.m; s += per) {
    if (!((bm >> s) & group)) continue;
    __builtin_prefetch(Key(l, int(s)));
    if (!lay_.fp) __builtin_prefetch(Val(l, int(s)));
  }
}
// Appends to out[*nout..] the records of leaf l (version lv) with key >=
// from (> from if !incl), ascending, at most `room` of them (*truncated =
// true if more were left). Reads in the hinted order when it checks out,
// else sorts and stores a fresh hint. False if the leaf changed while it
// was read (torn key/bitmap); the caller also validates the version
// afterwards, which covers the values read here.
template <bool kConc, bool kBytes>
PMINDEX_FPTREE_SCAN_INLINE bool FPTree<kConc, kBytes>::ReadLeafSortedU64(char* l, uint64_t lv, uint64_t from, bool incl, size_t room,
                                             bool next_header_fetched, KV* out,
                       size_t* nout, bool* truncated, int* cnt_out) {
  uint64_t bm = Ld(Bm(l)) & lay_.full;
  int cnt = __builtin_popcountll(bm);
  *cnt_out = cnt;
  // The scan will go on to the next leaf (a random address, one dependent
  // miss after another otherwise): fetch it while this one is read, only
  // the lines with records if its bitmap is on its way already (Ahead).
  // PrefetchRecords loads that bitmap, so the next pointer is read with
  // acquire (pairs with SplitFinish's release store, which orders
  // SplitCopy's plain stores before it). A stale offset only wastes the
  // prefetch: the leaf it
  // names is not freed while this scan's epoch guard is held.
  if (room > size_t(cnt)) {
    if (next_header_fetched) PrefetchRecords(NextAcquire(l));
    else PrefetchLeaf(Ld(Next(l)));
  }
  // Layout values in locals: the loops below store to `out`, which the
  // compiler cannot tell apart from this->lay_.
  const char* kbase = l + lay_.key_off;
  const char* vbase = l + lay_.val_off;
  const size_t kstride = lay_.key_stride, vstride = lay_.val_stride;
  auto key_at = [&](unsigned s) { return Ld(reinterpret_cast<const uint64_t*>(kbase + s * kstride)); };
  auto val_at = [&](unsigned s) { return Ld(reinterpret_cast<const uint64_t*>(vbase + s * vstride)); };
  // Records below `from` (only in the first leaf) are skipped.
  auto wanted = [&](uint64_t kk) { return kk > from || (kk == from && incl); };
  size_t o = *nout;
  uint8_t ord[64];
  if (cnt > 1) {
    // Decoded on the fly: entry j names a slot of bm, and its key is above
    // entry j-1's; cnt such entries are exactly bm's slots in key order.
    uint64_t w[kHintWords + 1];
    LoadHintWords(lay_, l, cnt, w);
    size_t end = o + room;
    bool ok = true;
    uint64_t prev = 0;
    for (int j = 0; j < cnt && ok; j += 8) {
      uint64_t x = HintGroup(w, j >> 3);
      const int je = std::min(cnt, j + 8);
      for (int jj = j; jj < je; jj++, x >>= 6) {
        const unsigned s = unsigned(x & 63);
        if (!(bm >> s & 1)) {  // before the key load: s may be >= m
          ok = false;
          break;
        }
        uint64_t kk = key_at(s);
        if (jj > 0 && kk <= prev) {
          ok = false;
          break;
        }
        prev = kk;
        if (!wanted(kk)) continue;
        if (o == end) {
          *truncated = true;
          continue;  // keep verifying the order of the rest
        }
        out[o++] = {kk, val_at(s)};
      }
    }
    if (ok) {
      *nout = o;
      return true;
    }
    o = *nout;
    *truncated = false;
    if (kConc && !LeafValidate(l, lv)) return false;
  }
  // Stale hint: sort (key, slot) pairs, store the order, emit.
  std::pair<uint64_t, uint32_t> ks[64];
  int c = 0;
  for (uint64_t mm = bm; mm; mm &= mm - 1) {
    unsigned i = unsigned(__builtin_ctzll(mm));
    ks[c++] = {key_at(i), i};
  }
  if (kConc && !LeafValidate(l, lv)) return false;  // do not store a torn order
  std::sort(ks, ks + c, [](const auto& a, const auto& b) { return a.first < b.first; });
  for (int j = 0; j < c; j++) ord[j] = uint8_t(ks[j].second);
  StoreHint(lay_, l, ord, c);
  size_t end = o + room;
  for (int j = 0; j < c; j++) {
    uint64_t kk = ks[j].first;
    if (!wanted(kk)) continue;
    if (o == end) {
      *truncated = true;
      break;
    }
    out[o++] = {kk, val_at(ks[j].second)};
  }
  *nout = o;
  return true;
}

// Snapshot of leaf l's records >= k (> k if !inclusive), sorted (byte keys
// or byte values). Reads the keys in the hinted order and checks it as it
// goes; a stale hint is replaced after a sort. `all` is scratch space
// (kept between calls so its strings keep their buffers). False if the
// leaf changed meanwhile (the caller re-traverses), or, with *corrupt set,
// if a key/value block of the unchanged leaf is unreadable (a damaged
// pool: re-traversing would read it again forever).
template <bool kConc, bool kBytes>
bool FPTree<kConc, kBytes>::ReadLeafRecs(char* l, uint64_t lv, const SKey& k, bool inclusive, std::vector<Rec>* recs,
                  std::vector<std::pair<Rec, int>>* all, uint64_t* next, bool* corrupt) {
  recs->clear();
  uint64_t bm = Ld(Bm(l)) & lay_.full;
  int cnt = __builtin_popcountll(bm);
  uint8_t ord[64];
  bool sorted = LoadHint(lay_, l, bm, cnt, ord);
  if (!sorted) {
    int c = 0;
    for (uint64_t m = bm; m; m &= m - 1) ord[c++] = uint8_t(__builtin_ctzll(m));
  }
  if (all->size() < size_t(cnt)) all->resize(cnt);
  for (int j = 0; j < cnt; j++) {
    auto& a = (*all)[j];
    a.second = ord[j];
    if (!ReadSlotKey(l, ord[j], &a.first)) {  // stale key pointer: the leaf changed, or a damaged block
      *corrupt = LeafValidate(l, lv);
      return false;
    }
    if (sorted && j > 0 && CmpRec((*all)[j - 1].first, a.first) >= 0) sorted = false;
  }
  if (!sorted) {
    if (kConc && !LeafValidate(l, lv)) return false;  // do not store a torn order
    std::sort(all->begin(), all->begin() + cnt, [](const auto& a, const auto& b) { return CmpRec(a.first, b.first) < 0; });
    for (int j = 0; j < cnt; j++) ord[j] = uint8_t((*all)[j].second);
    StoreHint(lay_, l, ord, cnt);
  }
  for (int j = 0; j < cnt; j++) {
    auto& a = (*all)[j];
    int c = CmpRecKey(a.first, k);
    if (c < 0 || (c == 0 && !inclusive)) continue;
    recs->push_back(std::move(a.first));
    if (!ReadSlotVal(l, a.second, &recs->back())) {
      *corrupt = LeafValidate(l, lv);
      return false;
    }
  }
  *next = NextAcquire(l);  // the caller reads that leaf next
  return LeafValidate(l, lv);
}
#define FPT_INSTANTIATE(C, B)                                                                                    \
  template Status FPTree<C, B>::Scan(Slice, size_t, ScanCallback, size_t*);                                      \
  template FPTree<C, B>::KV* FPTree<C, B>::ScanBuffer(std::unique_ptr<KV[]>*, bool**);                           \
  template Status FPTree<C, B>::ScanU64(uint64_t, size_t, ScanCallback, size_t*);                                \
  template void FPTree<C, B>::PrefetchLeaf(uint64_t) const;                                                      \
  template bool FPTree<C, B>::ReadLeafRecs(char*, uint64_t, const SKey&, bool, std::vector<Rec>*,                \
                                           std::vector<std::pair<Rec, int>>*, uint64_t*, bool*);
FPT_INSTANTIATE_ALL(FPT_INSTANTIATE)
#undef FPT_INSTANTIATE
#undef PMINDEX_FPTREE_SCAN_INLINE

}  // namespace pmindex::internal::fptree
