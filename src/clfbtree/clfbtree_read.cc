// clfbtree_read.cc: the clfB-tree's lock-free readers (docs/clfbtree.md,
// "Concurrency"): Find, Scan and Size. No paper section: the paper's tree is
// single-threaded.
//
// A reader runs inside an epoch guard, takes no lock and stores nothing. At
// each node it reads the node's version (DRAM lock table), copies the node
// with atomic loads, and validates the version; a busy or changed version
// restarts the descent from Meta::root. An append-only leaf's entries are
// unsorted: a scan sorts a leaf's matching entries before handing them on
// (u64 keys: through the sort cache, clfbtree_sort_cache.h).
// The next leaf of a scan is found by descending again from the smallest
// separator above the current leaf (no sibling pointers: a leaf split
// replaces one leaf by two new ones without touching a neighbour); a u64
// scan starts that descent at the inner node holding the separator while
// that node's version validates, and any other descent at the route
// table's node for its cursor (clfbtree_route.h), going on at the table's
// next key when that node's range is done.
//
// Thread safety: any number of readers concurrently with the writers
// (clfbtree_tree.h, "Concurrency").
#include <algorithm>

#include "clfbtree/clfbtree_tree.h"
#include "kit/backoff.h"

namespace pmindex::internal::clfbtree {

namespace {
constexpr int kMaxRestarts = 1 << 20;
}

Status ClfBTree::ReadLeaf(uint64_t leaf, uint64_t v, Slice key, std::string* value, bool* found) const {
  *found = false;
  if (encoded()) {
    Line img;
    ReadLine(leaf, img);
    Decoded d;
    if (!Decode(img, bk(), &d) || !d.leaf) return Status::Busy();
    for (uint32_t i = 0; i < d.n; i++) {
      int c;
      if (!CmpKey(d.k[i], key, &c)) return Status::Busy();
      if (c == 0) {
        *found = true;
        return ValueString(d.p[i], value) ? Status::OK() : Status::Busy();
      }
    }
    return Status::OK();
  }
  const uint64_t* bm = Bitmap(leaf);
  if (!bk()) {
    const uint64_t k = SliceToU64(key);
    // With the leaf's filter valid at v, only the slots whose fingerprint
    // matches are read (a filter changed meanwhile fails the validation).
    uint64_t cand[2] = {~0ull, ~0ull};
    if (const LeafFilter* f = Filter(leaf); f && f->Valid(v)) f->Match(LeafFilter::Fp(k), cap_, cand);
    for (uint32_t w = 0; w < bm_words_; w++)
      for (uint64_t b = Ld(&bm[w]) & cand[w]; b; b &= b - 1) {
        const uint32_t i = 64 * w + uint32_t(__builtin_ctzll(b));
        if (LdR(Ent(leaf, i)) != k) continue;
        *found = true;
        return ValueString(LdR(Ent(leaf, i) + 1), value) ? Status::OK() : Status::Busy();
      }
    return Status::OK();
  }
  for (uint32_t i = 0; i < cap_; i++) {
    if (!((Ld(&bm[i / 64]) >> (i % 64)) & 1)) continue;
    int c;
    if (!CmpKey(LdR(Ent(leaf, i)), key, &c)) return Status::Busy();
    if (c == 0) {
      *found = true;
      return ValueString(LdR(Ent(leaf, i) + 1), value) ? Status::OK() : Status::Busy();
    }
  }
  return Status::OK();
}

// Inlined into the u64 descents (a call per level costs a find about 50
// instructions); byte keys take RouteInnerBytes.
[[gnu::always_inline]] inline ClfBTree::Step ClfBTree::RouteInner(uint64_t off, const kit::VersionLock& vl, uint64_t v,
                                                                  Slice key, uint64_t* child, bool* kids_leaves,
                                                                  uint64_t* sep, bool* has_sep,
                                                                  std::string* sep_key) const {
  if (bk()) return RouteInnerBytes(off, vl, v, key, child, kids_leaves, sep, has_sep, sep_key);
  PadLine img;
  ReadLinePadded(off, img);
  if (!vl.Validate(v)) return Step::kRestart;
  uint32_t idx;
  if (!RouteU64Padded(img, SliceToU64(key), &idx, child, sep, kids_leaves)) return Step::kCorrupt;
  *has_sep = idx < (img[0] & kCountMask);
  return Step::kNext;
}

ClfBTree::Step ClfBTree::RouteInnerBytes(uint64_t off, const kit::VersionLock& vl, uint64_t v, Slice key,
                                         uint64_t* child, bool* kids_leaves, uint64_t* sep, bool* has_sep,
                                         std::string* sep_key) const {
  // The comparisons read separator blocks, so the version is validated
  // after them (a torn copy may fail to decode: Corrupt only if the node
  // did not change).
  Line img;
  ReadLine(off, img);
  Decoded d;
  uint32_t idx = 0;
  const bool ok = Decode(img, true, &d) && !d.leaf && ChildIndex(d, key, &idx) &&
                  (!sep_key || idx >= d.n || KeyString(d.k[idx], sep_key));
  if (!vl.Validate(v)) return Step::kRestart;
  if (!ok) return Step::kCorrupt;
  *has_sep = idx < d.n;
  *sep = *has_sep ? d.k[idx] : 0;
  *child = d.p[idx];
  *kids_leaves = d.kids_leaves;
  return Step::kNext;
}

Status ClfBTree::Find(Slice key, std::string* value) {
  if (closed()) return IndexClosed();
  PMINDEX_RETURN_IF_ERROR(ValidateKey(c_.kk, max_key_, key));
  EpochManager::Guard g(epoch_);
  kit::Backoff backoff;
  for (int attempt = 0; attempt < kMaxRestarts; attempt++) {
    // The first attempt starts at the route table's node (u64 keys); a
    // restart descends from the root.
    const uint64_t w = bk() ? Ld(&meta_->root) : StartWord(SliceToU64(key), attempt == 0);
    uint64_t off = w & ~63ull;
    bool leaf = w & 1;
    bool restart = false;
    for (int depth = 0; !restart; depth++) {
      if (depth > kMaxDepth || !NodeOk(off, leaf ? LeafBytes() : 64)) return Status::Corrupt("clfbtree: bad node offset");
      kit::VersionLock& vl = VL(off);
      uint64_t v;
      if (!vl.ReadBegin(&v)) {
        restart = true;
        break;
      }
      if (leaf) {
        bool found;
        Status s = ReadLeaf(off, v, key, value, &found);
        if (!vl.Validate(v)) {
          restart = true;
          break;
        }
        if (!s.ok()) return Status::Corrupt("clfbtree: leaf unreadable");
        return found ? Status::OK() : Status::NotFound();
      }
      uint64_t sep;
      bool has_sep;
      const Step st = RouteInner(off, vl, v, key, &off, &leaf, &sep, &has_sep);
      if (st == Step::kCorrupt) return Status::Corrupt("clfbtree: inner node does not decode");
      restart = st == Step::kRestart;
    }
    backoff.Wait();
  }
  return Status::Busy("clfbtree: find restarted too often");
}

bool ClfBTree::CachedLeafRange(uint64_t leaf, uint64_t v, uint64_t cursor, size_t want, ScanEnt* out, size_t* n,
                               const SortCacheEntry* e) const {
  uint8_t perm[127];
  uint32_t pn;
  if (!e->Get(v, perm, &pn)) return false;
  for (uint32_t i = 0; i < pn; i++)
    if (perm[i] >= cap_) return false;
  uint32_t lo = 0, hi = pn;
  while (lo < hi) {
    const uint32_t mid = (lo + hi) / 2;
    if (LdR(Ent(leaf, perm[mid])) < cursor)
      lo = mid + 1;
    else
      hi = mid;
  }
  size_t m = 0;
  for (uint32_t j = lo; j < pn && m < want; j++) out[m++] = {LdR(Ent(leaf, perm[j])), LdR(Ent(leaf, perm[j]) + 1), perm[j]};
  *n = m;
  return true;
}

Status ClfBTree::ScanU64(uint64_t cursor, size_t n, const ScanCallback& cb, size_t* count) {
  size_t done = 0;
  EpochManager::Guard g(epoch_);
  kit::Backoff backoff;
  int restarts = 0;
  ScanEnt got[kMaxN + 128];  // an append leaf holds at most 127 entries, an encoded one kMaxN
  uint8_t perm[127];
  std::vector<std::string> vals;
  // Per depth of the current path: the inner node there, its version, and
  // its separator above the path if it has one (cand[d].has). The cursor
  // moves to the deepest such separator; the next descent starts at that
  // node while its version still validates (the node is unchanged and
  // linked, and a node's range only shrinks by replacing it; the entries
  // above it stay valid the same way), else from the root.
  struct Cand {
    uint64_t off, v, sep;
    bool has;
  };
  Cand cand[kMaxDepth + 2];
  int resume_depth = -1;
  // A descent that does not resume starts at the route table's node for the
  // cursor (after a restart: at the root); base_hi is the end of that node's
  // range (none from the root), where the scan goes on once the path has no
  // separator left.
  uint64_t base_hi = 0;
  bool base_has_hi = false, restarted = false;
  while (done < n) {
    if (++restarts > kMaxRestarts) return Status::Busy("clfbtree: scan restarted too often");
    uint64_t off;
    bool leaf, restart = false;
    int depth0 = 0;
    if (resume_depth >= 0 && VL(cand[resume_depth].off).Validate(cand[resume_depth].v)) {
      off = cand[resume_depth].off;
      leaf = false;
      depth0 = resume_depth;
    } else {
      const RouteTable* t = restarted ? nullptr : route_.load(std::memory_order_acquire);
      const uint64_t w = t ? t->Lookup(cursor, &base_hi, &base_has_hi) : Ld(&meta_->root);
      if (!t) base_has_hi = false;
      off = w & ~63ull;
      leaf = w & 1;
    }
    resume_depth = -1;
    restarted = false;
    uint32_t m = 0, first = 0;
    size_t emit = 0;
    int leaf_depth = 0;
    bool publish = false;
    for (int depth = depth0;; depth++) {
      if (depth > kMaxDepth || !NodeOk(off, leaf ? LeafBytes() : 64)) return Status::Corrupt("clfbtree: bad node offset");
      // An append leaf's lines are all read (the sort and the walk visit its
      // slots in key order, not address order): fetched at once.
      if (leaf && !encoded())
        for (uint64_t o = 0; o < c_.leaf_size; o += 64) __builtin_prefetch(At(off + o));
      kit::VersionLock& vl = VL(off);
      uint64_t v;
      if (!vl.ReadBegin(&v)) {
        restart = true;
        break;
      }
      if (!leaf) {
        const uint64_t vl_off = off;
        uint64_t sep;
        bool has_sep;
        const Step st = RouteInner(off, vl, v, U64Slice(cursor), &off, &leaf, &sep, &has_sep);
        if (st == Step::kCorrupt) return Status::Corrupt("clfbtree: inner node does not decode");
        if (st == Step::kRestart) {
          restart = true;
          break;
        }
        cand[depth] = Cand{vl_off, v, sep, has_sep};
        continue;
      }
      // The leaf's entries at or above the cursor, the smallest `emit` of
      // them sorted; byte values are copied before the validation.
      leaf_depth = depth;
      bool bad = false;
      SortCacheEntry* cached = sort_cache_.mapped() ? sort_cache_.At(At(off)) : nullptr;
      if (encoded()) {
        Line img;
        ReadLine(off, img);
        Decoded d;
        if (!Decode(img, false, &d)) {
          bad = true;
        } else {
          for (uint32_t i = 0; i < d.n; i++)
            if (d.k[i] >= cursor) got[m++] = {d.k[i], d.p[i], i};
        }
        auto less = [](const ScanEnt& a, const ScanEnt& b) { return a.k < b.k; };
        emit = std::min<size_t>(m, n - done);
        if (emit < m)
          std::partial_sort(got, got + emit, got + m, less);
        else
          std::sort(got, got + m, less);
      } else if (!cached || !CachedLeafRange(off, v, cursor, n - done, got, &emit, cached)) {
        // Every valid entry sorted (the permutation is published below once
        // the read validates), then the part at or above the cursor.
        const uint64_t* bm = Bitmap(off);
        for (uint32_t bw = 0; bw < bm_words_; bw++)
          for (uint64_t b = Ld(&bm[bw]); b; b &= b - 1) {
            const uint32_t i = 64 * bw + uint32_t(__builtin_ctzll(b));
            got[m++] = {LdR(Ent(off, i)), LdR(Ent(off, i) + 1), i};
          }
        std::sort(got, got + m, [](const ScanEnt& a, const ScanEnt& b) { return a.k < b.k; });
        if (cached) {
          publish = true;
          for (uint32_t i = 0; i < m; i++) perm[i] = uint8_t(got[i].slot);
        }
        while (first < m && got[first].k < cursor) first++;
        emit = std::min<size_t>(m - first, n - done);
      }
      if (vb()) {
        vals.resize(emit);
        for (size_t i = 0; i < emit && !bad; i++) bad = !ValueString(got[first + i].v, &vals[i]);
      }
      if (!vl.Validate(v)) {
        restart = true;
        break;
      }
      if (bad) return Status::Corrupt("clfbtree: leaf unreadable");
      if (publish) cached->Put(v, perm, m);
      break;
    }
    if (restart) {
      restarted = true;
      backoff.Wait();
      continue;
    }
    for (size_t i = 0; i < emit; i++) {
      done++;
      if (count) *count = done;
      const ScanEnt& e = got[first + i];
      const Slice val = vb() ? Slice(vals[i]) : Slice(reinterpret_cast<const char*>(&e.v), 8);
      if (!cb(Slice(reinterpret_cast<const char*>(&e.k), 8), val)) return Status::OK();
    }
    for (int d = leaf_depth - 1; d >= 0; d--)
      if (cand[d].has) {
        resume_depth = d;
        break;
      }
    if (resume_depth < 0) {
      if (!base_has_hi) break;
      cursor = base_hi;  // the next route table node
      base_has_hi = false;
      continue;
    }
    cursor = cand[resume_depth].sep;
    cand[resume_depth].has = false;  // the descent from there sets it again
  }
  return Status::OK();
}

Status ClfBTree::Scan(Slice start, size_t n, ScanCallback cb, size_t* count) {
  if (count) *count = 0;
  if (closed()) return IndexClosed();
  if (!start.empty()) PMINDEX_RETURN_IF_ERROR(ValidateKey(c_.kk, max_key_, start));
  if (!bk()) return ScanU64(start.empty() ? 0 : SliceToU64(start), n, cb, count);
  std::string cursor(start.data(), start.size());
  if (!bk() && cursor.empty()) cursor.assign(8, '\0');
  size_t done = 0;
  EpochManager::Guard g(epoch_);
  kit::Backoff backoff;
  int restarts = 0;
  while (done < n) {
    if (++restarts > kMaxRestarts) return Status::Busy("clfbtree: scan restarted too often");
    const uint64_t w = Ld(&meta_->root);
    uint64_t off = w & ~63ull;
    bool leaf = w & 1;
    bool has_ub = false, restart = false;
    std::string ub;
    std::vector<std::pair<std::string, std::string>> got;
    for (int depth = 0;; depth++) {
      if (depth > kMaxDepth || !NodeOk(off, leaf ? LeafBytes() : 64)) return Status::Corrupt("clfbtree: bad node offset");
      kit::VersionLock& vl = VL(off);
      uint64_t v;
      if (!vl.ReadBegin(&v)) {
        restart = true;
        break;
      }
      if (leaf) {
        bool bad = false;
        auto take = [&](uint64_t kw, uint64_t vw) {
          std::string k, val;
          int c;
          if (!KeyString(kw, &k)) {
            bad = true;
            return;
          }
          c = CompareKeys(c_.kk, k, cursor);
          if (c < 0) return;
          if (!ValueString(vw, &val)) {
            bad = true;
            return;
          }
          got.emplace_back(std::move(k), std::move(val));
        };
        if (encoded()) {
          Line img;
          ReadLine(off, img);
          Decoded d;
          if (!Decode(img, bk(), &d)) bad = true;
          for (uint32_t i = 0; !bad && i < d.n; i++) take(d.k[i], d.p[i]);
        } else {
          const uint64_t* bm = Bitmap(off);
          for (uint32_t i = 0; i < cap_ && !bad; i++)
            if ((Ld(&bm[i / 64]) >> (i % 64)) & 1) take(LdR(Ent(off, i)), LdR(Ent(off, i) + 1));
        }
        if (!vl.Validate(v)) {
          restart = true;
          break;
        }
        if (bad) return Status::Corrupt("clfbtree: leaf unreadable");
        break;
      }
      std::string sep;
      uint64_t sep_word;
      bool has_sep;
      const Step st = RouteInner(off, vl, v, cursor, &off, &leaf, &sep_word, &has_sep, &sep);
      if (st == Step::kCorrupt) return Status::Corrupt("clfbtree: inner node does not decode");
      if (st == Step::kRestart) {
        restart = true;
        break;
      }
      if (has_sep) {
        has_ub = true;
        ub = std::move(sep);
      }
    }
    if (restart) {
      backoff.Wait();
      continue;
    }
    std::sort(got.begin(), got.end(), [&](const auto& a, const auto& b) { return CompareKeys(c_.kk, a.first, b.first) < 0; });
    for (auto& [k, val] : got) {
      if (done >= n) break;
      done++;
      if (count) *count = done;
      if (!cb(k, val)) return Status::OK();
    }
    if (!has_ub) break;
    cursor = ub;
  }
  return Status::OK();
}

uint64_t ClfBTree::Size() {
  uint64_t n = 0;
  size_t cnt = 0;
  Scan(Slice(), SIZE_MAX, [&](Slice, Slice) { return true; }, &cnt);
  n = cnt;
  return n;
}

}  // namespace pmindex::internal::clfbtree
