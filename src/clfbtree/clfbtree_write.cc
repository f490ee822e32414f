// clfbtree_write.cc: the clfB-tree's leaf operations (clfB-tree sec. 2.2;
// docs/clfbtree.md, "Persist order"): insert, update and delete in an
// append-only leaf or an encoded leaf, and the key/value word helpers.
//
// Persist order, append-only leaf (u64 keys and values):
//   insert: entry {k, v} in a free slot, flushed, fence; the bitmap bit set
//           (the commit), flushed, fence: 2 lines.
//   update: the value word (one 8-byte store), flushed, fence.
//   delete: the bitmap bit cleared, flushed, fence; an empty leaf is then
//           freed (clfbtree_smo.cc).
// Byte keys/values add their blocks: allocated into SmoLog::newn before the
// entry, the SmoLog armed with the commit's bitmap word and bit, cleared
// after the commit; a replaced or deleted block goes to SmoLog::oldn and is
// freed after the commit and an epoch grace period.
// Encoded leaf: the leaf's new image is written with the parent-update
// method (clfbtree_smo.cc, UpdateNode), or split when it does not fit.
//
// Thread safety: FastWrite runs without write_mu_ (any number of threads):
// it changes one append leaf under that leaf's DRAM version lock, taken by
// try-lock, and hands anything else to the functions below, which run
// under write_mu_ and lock the append leaf before reading it. A leaf is
// locked from before its first store until after the fence of the commit.
#include <algorithm>

#include "clfbtree/clfbtree_tree.h"
#include "kit/backoff.h"
#include "kit/pm_block.h"
#include "kit/popcount.h"
#include "pmindex/pm/fault.h"

namespace pmindex::internal::clfbtree {

bool ClfBTree::CmpKey(uint64_t kw, Slice key, int* cmp) const {
  if (!bk()) {
    const uint64_t k = SliceToU64(key);
    *cmp = kw < k ? -1 : (kw > k ? 1 : 0);
    return true;
  }
  std::string s;
  if (!kit::TryReadBlock(base_, pool_->size(), kw, max_key_, &s)) return false;
  *cmp = CompareKeys(KeyKind::kBytes, s, key);
  return true;
}

bool ClfBTree::KeyString(uint64_t kw, std::string* out) const {
  if (!bk()) {
    out->assign(reinterpret_cast<const char*>(&kw), 8);
    return true;
  }
  return kit::TryReadBlock(base_, pool_->size(), kw, max_key_, out);
}

bool ClfBTree::ValueString(uint64_t vw, std::string* out) const {
  if (!vb()) {
    out->assign(reinterpret_cast<const char*>(&vw), 8);
    return true;
  }
  return kit::TryReadBlock(base_, pool_->size(), vw, max_value_, out);
}

int ClfBTree::CmpWords(uint64_t a, uint64_t b) const {
  if (!bk()) return a < b ? -1 : (a > b ? 1 : 0);
  std::string x, y;
  KeyString(a, &x);
  KeyString(b, &y);
  return CompareKeys(KeyKind::kBytes, x, y);
}

void ClfBTree::WriteLine(uint64_t off, const uint8_t img[64]) {
  uint64_t* w = At<uint64_t>(off);
  for (int i = 0; i < 8; i++) {
    uint64_t x;
    std::memcpy(&x, img + 8 * i, 8);
    pm::StoreAtomic(w + i, x, __ATOMIC_RELAXED);
  }
}

bool ClfBTree::ChildIndex(const Decoded& d, Slice key, uint32_t* idx) const {
  if (!bk()) {
    *idx = uint32_t(std::upper_bound(d.k, d.k + d.n, SliceToU64(key)) - d.k);
    return true;
  }
  uint32_t lo = 0, hi = d.n;
  while (lo < hi) {
    const uint32_t mid = (lo + hi) / 2;
    int c;
    if (!CmpKey(d.k[mid], key, &c)) return false;
    if (c <= 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  *idx = lo;
  return true;
}

void ClfBTree::Lock(uint64_t off) {
  kit::VersionLock& l = VL(off);
  kit::Backoff backoff;
  for (;;) {
    const uint64_t v = l.Load();
    if (v & kit::VersionLock::kLocked) {  // a leaf writer's short hold (FastWrite)
      backoff.Wait();
      continue;
    }
    if (kit::VersionLock::Busy(v)) {
      l.ClearLockBits();  // an obsolete mark left in a reused word by an unlinked node
      continue;
    }
    if (l.TryLock(v)) return;
  }
}

Status ClfBTree::NewWord(Slice s, bool is_key, int* slot, uint64_t* word) {
  *slot = -1;
  if (!(is_key ? bk() : vb())) {
    *word = SliceToU64(s);
    return Status::OK();
  }
  const int i = LogNew();
  if (i < 0) return Status::Busy("clfbtree log full");
  Exclude x(this);
  PMINDEX_RETURN_IF_ERROR(kit::WriteBlock(*alloc_, base_, &meta_->log.newn[i], s));
  *slot = i;
  *word = meta_->log.newn[i];
  return Status::OK();
}

Status ClfBTree::DescendW(Slice key, Path* path, uint64_t* leaf) {
  path->clear();
  const uint64_t w = LdR(&meta_->root);
  uint64_t off = w & ~63ull;
  bool is_leaf = w & 1;
  while (!is_leaf) {
    if (!NodeOk(off, 64) || path->size() >= size_t(kMaxDepth)) return Status::Corrupt("clfbtree: bad inner node offset");
    // Decoded in place in the path (an entry is about 540 bytes).
    PathEnt& e = path->emplace_back();
    e.off = off;
    Line img;
    ReadLine(off, img);
    if (!Decode(img, bk(), &e.d) || e.d.leaf) return Status::Corrupt("clfbtree: inner node does not decode");
    if (!ChildIndex(e.d, key, &e.idx)) return Status::Corrupt("clfbtree: separator key unreadable");
    off = e.d.p[e.idx];
    is_leaf = e.d.kids_leaves;
  }
  if (!NodeOk(off, LeafBytes())) return Status::Corrupt("clfbtree: bad leaf offset");
  *leaf = off;
  return Status::OK();
}

bool ClfBTree::LeafScanU64(uint64_t leaf, uint64_t key, int* found, int* free_slot, uint32_t* live) const {
  // The caller holds the leaf's lock: no one else stores to it, so plain
  // loads suffice, and the compare runs over every slot without branches
  // (stale keys of free slots are masked out by the bitmap).
  const uint64_t* bm = Bitmap(leaf);
  const uint64_t* e = Ent(leaf, 0);
  *found = *free_slot = -1;
  *live = 0;
  for (uint32_t w = 0; w < bm_words_; w++) {
    const uint32_t slots = std::min(64u, cap_ - 64 * w);
    const uint64_t* ew = e + 128 * w;
    uint64_t eq = 0;
    for (uint32_t j = 0; j < slots; j++) eq |= uint64_t(ew[2 * j] == key) << j;
    const uint64_t bits = bm[w];
    *live += kit::PopCount64(bits);
    const uint64_t lim = 64 * w + 64 <= cap_ ? ~0ull : (1ull << (cap_ - 64 * w)) - 1;
    if (*free_slot < 0 && (~bits & lim)) *free_slot = int(64 * w + uint32_t(__builtin_ctzll(~bits & lim)));
    if (*found < 0 && (eq & bits)) *found = int(64 * w + uint32_t(__builtin_ctzll(eq & bits)));
  }
  return *found >= 0;
}

void ClfBTree::LeafProbeU64(uint64_t leaf, const LeafFilter& f, uint64_t key, int* found, int* free_slot,
                            uint32_t* live) const {
  // Only the slots whose fingerprint matches are read (the caller holds the
  // lock: plain loads of the leaf suffice).
  const uint64_t* bm = Bitmap(leaf);
  uint64_t cand[2];
  f.Match(LeafFilter::Fp(key), cap_, cand);
  *found = *free_slot = -1;
  *live = 0;
  for (uint32_t w = 0; w < bm_words_; w++) {
    const uint64_t bits = bm[w];
    *live += kit::PopCount64(bits);
    const uint64_t lim = 64 * w + 64 <= cap_ ? ~0ull : (1ull << (cap_ - 64 * w)) - 1;
    if (*free_slot < 0 && (~bits & lim)) *free_slot = int(64 * w + uint32_t(__builtin_ctzll(~bits & lim)));
    for (uint64_t c = cand[w] & bits; c && *found < 0; c &= c - 1) {
      const uint32_t i = 64 * w + uint32_t(__builtin_ctzll(c));
      if (*Ent(leaf, i) == key) *found = int(i);
    }
  }
}

void ClfBTree::RebuildFilter(uint64_t leaf, LeafFilter* f) const {
  uint8_t fp[LeafFilter::kSlots];
  for (uint32_t i = 0; i < cap_; i++) fp[i] = LeafFilter::Fp(*Ent(leaf, i));
  f->Store(fp, cap_);
}

bool ClfBTree::FastWrite(Slice key, Slice value, Mode mode, bool remove, Status* st) {
  if (!fast_writes_) return false;
  EpochManager::Guard g(epoch_);
  const uint64_t k = SliceToU64(key);
  const uint64_t w = StartWord(k, true);
  uint64_t off = w & ~63ull;
  bool leaf = w & 1;
  for (int depth = 0; !leaf; depth++) {
    if (depth > kMaxDepth || !NodeOk(off, 64)) return false;  // the locked path reports it
    kit::VersionLock& vl = VL(off);
    uint64_t v;
    if (!vl.ReadBegin(&v)) return false;
    PadLine img;
    ReadLinePadded(off, img);
    if (!vl.Validate(v)) return false;
    uint32_t idx;
    uint64_t sep;
    if (!RouteU64Padded(img, k, &idx, &off, &sep, &leaf)) return false;
  }
  if (!NodeOk(off, LeafBytes())) return false;
  // The filter and the bitmap are read right after the try-lock, a locked
  // RMW that later loads cannot pass: their misses overlap the lock word's.
  LeafFilter* f = Filter(off);
  if (f) {
    __builtin_prefetch(f);
    __builtin_prefetch(reinterpret_cast<const char*>(f) + 64);
  }
  __builtin_prefetch(Bitmap(off));
  // The leaf's lock from the version read after its parent validated: an
  // unlinked leaf is obsolete, one being split is locked; either fails here.
  kit::VersionLock& vl = VL(off);
  uint64_t v;
  if (!vl.ReadBegin(&v) || !vl.TryLock(v)) return false;
  int found, free_slot;
  uint32_t live;
  // The leaf's filter, valid again for the version the unlock publishes
  // (every path below unlocks once, by vl.UnlockFrom(v): v + kStep, a plain
  // store: a locked RMW would wait for the write-backs just issued).
  if (f && f->Valid(v)) {
    LeafProbeU64(off, *f, k, &found, &free_slot, &live);
  } else {
    LeafScanU64(off, k, &found, &free_slot, &live);
    if (f) RebuildFilter(off, f);
  }
  if (f) f->SetValid(v + kit::VersionLock::kStep);
  const uint64_t vw = remove ? 0 : SliceToU64(value);
  if (remove) {
    if (found >= 0 && live <= 1) {  // the leaf would become empty: freed by the locked path
      vl.UnlockFrom(v);
      return false;
    }
    *st = found < 0 ? Status::NotFound() : Status::OK();
    if (found >= 0) {
      uint64_t* bw = &Bitmap(off)[uint32_t(found) / 64];
      pm::StoreAtomic(bw, uint64_t(LdR(bw) & ~(1ull << (uint32_t(found) % 64))), __ATOMIC_RELEASE);
      pm::Persist(bw, 8);
    }
    vl.UnlockFrom(v);
    return true;
  }
  if (found >= 0) {
    *st = mode == kInsert ? Status::AlreadyExists() : Status::OK();
    if (mode != kInsert) {
      uint64_t* vword = Ent(off, uint32_t(found)) + 1;
      pm::StoreAtomic(vword, vw);
      pm::Persist(vword, 8);
    }
    vl.UnlockFrom(v);
    return true;
  }
  if (mode == kUpdate || free_slot < 0) {
    vl.UnlockFrom(v);
    if (mode != kUpdate) return false;  // full: the locked path splits
    *st = Status::NotFound();
    return true;
  }
  // The tally is single-threaded (figures only): its marks read counters
  // the write_mu_ holder updates.
  const Mark before = c_.tally ? Now() : Mark{0, 0};
  if (f) f->Set(uint32_t(free_slot), LeafFilter::Fp(k));
  StoreEntry(off, uint32_t(free_slot), k, vw);
  vl.UnlockFrom(v);
  TallyAdd(&tally_.leaf_plain, before);
  *st = Status::OK();
  return true;
}

void ClfBTree::StoreEntry(uint64_t leaf, uint32_t i, uint64_t kw, uint64_t vw) {
  uint64_t* e = Ent(leaf, i);
  pm::StoreAtomic(e, kw, __ATOMIC_RELAXED);
  pm::StoreAtomic(e + 1, vw, __ATOMIC_RELAXED);
  if (!PMINDEX_FAULT("clfbtree.append.skip_entry_flush")) pm::Flush(e, 16);
  pm::Fence();
  // The caller holds the leaf's lock and only a lock holder stores to a
  // bitmap: a plain store, not a locked RMW (which would wait here for the
  // entry's write-back to finish).
  uint64_t* bw = &Bitmap(leaf)[i / 64];
  pm::StoreAtomic(bw, uint64_t(LdR(bw) | (1ull << (i % 64))), __ATOMIC_RELEASE);
  pm::Persist(bw, 8);
}

Status ClfBTree::Write(Slice key, Slice value, Mode mode) {
  if (closed()) return IndexClosed();
  PMINDEX_RETURN_IF_ERROR(ValidateKey(c_.kk, max_key_, key));
  PMINDEX_RETURN_IF_ERROR(ValidateValue(c_.vk, max_value_, value));
  if (Status st; FastWrite(key, value, mode, false, &st)) return st;
  std::lock_guard<std::mutex> g(write_mu_);
  Path& path = wpath_;
  uint64_t leaf;
  PMINDEX_RETURN_IF_ERROR(DescendW(key, &path, &leaf));
  Status s = encoded() ? EncodedLeafWrite(path, leaf, key, value, mode, false)
                       : AppendLeafWrite(path, leaf, key, value, mode);
  MaybeRebuildRoute();
  return s;
}

Status ClfBTree::Remove(Slice key) {
  if (closed()) return IndexClosed();
  PMINDEX_RETURN_IF_ERROR(ValidateKey(c_.kk, max_key_, key));
  if (Status st; FastWrite(key, Slice(), kUpdate, true, &st)) return st;
  std::lock_guard<std::mutex> g(write_mu_);
  Path& path = wpath_;
  uint64_t leaf;
  PMINDEX_RETURN_IF_ERROR(DescendW(key, &path, &leaf));
  Status s = encoded() ? EncodedLeafWrite(path, leaf, key, Slice(), kUpdate, true) : AppendLeafRemove(path, leaf, key);
  MaybeRebuildRoute();
  return s;
}

Status ClfBTree::FindInLeaf(uint64_t leaf, Slice key, int* found, int* free_slot, uint32_t* live) const {
  if (!bk()) {
    LeafScanU64(leaf, SliceToU64(key), found, free_slot, live);
    return Status::OK();
  }
  const uint64_t* bm = Bitmap(leaf);
  *found = *free_slot = -1;
  *live = 0;
  for (uint32_t i = 0; i < cap_; i++) {
    const bool valid = (LdR(&bm[i / 64]) >> (i % 64)) & 1;
    if (!valid) {
      if (*free_slot < 0) *free_slot = int(i);
      continue;
    }
    ++*live;
    int c;
    if (*found < 0) {
      if (!CmpKey(LdR(Ent(leaf, i)), key, &c)) return Status::Corrupt("clfbtree: leaf key unreadable");
      if (c == 0) *found = int(i);
    }
  }
  return Status::OK();
}

// The leaf stays locked from before its scan until its change is durable
// (a FastWrite on it waits for the unlock by failing its try-lock); a split
// or free takes the lock over (LogOld with held).
Status ClfBTree::AppendLeafWrite(Path& path, uint64_t leaf, Slice key, Slice value, Mode mode) {
  Lock(leaf);
  int found, free_slot;
  uint32_t live;
  if (Status s = FindInLeaf(leaf, key, &found, &free_slot, &live); !s.ok()) {
    Unlock(leaf);
    return s;
  }
  if (found >= 0) {
    if (mode == kInsert) {
      Unlock(leaf);
      return Status::AlreadyExists();
    }
    uint64_t* vword = Ent(leaf, uint32_t(found)) + 1;
    int slot;
    uint64_t vw;
    if (Status s = NewWord(value, false, &slot, &vw); !s.ok()) {
      Unlock(leaf);
      return s;
    }
    if (vb()) {
      if (Status s = LogOld(LdR(vword), false); !s.ok()) {
        Unlock(leaf);
        AbortSmo();
        return s;
      }
      Arm(uint64_t(reinterpret_cast<char*>(vword) - base_), vw, kWordEq);
    }
    pm::StoreAtomic(vword, vw);
    pm::Persist(vword, 8);
    Unlock(leaf);
    if (vb()) FinishSmo();
    return Status::OK();
  }
  if (mode == kUpdate) {
    Unlock(leaf);
    return Status::NotFound();
  }
  int ks, vs;
  uint64_t kw, vw;
  if (Status s = NewWord(key, true, &ks, &kw); !s.ok()) {
    Unlock(leaf);
    return s;
  }
  if (Status s = NewWord(value, false, &vs, &vw); !s.ok()) {
    Unlock(leaf);
    AbortSmo();
    return s;
  }
  if (free_slot < 0) return SplitAppendLeaf(path, leaf, kw, vw);
  const uint32_t i = uint32_t(free_slot);
  const bool logged = ks >= 0 || vs >= 0;
  if (logged) Arm(uint64_t(reinterpret_cast<char*>(&Bitmap(leaf)[i / 64]) - base_), 1ull << (i % 64), kBitsSet);
  const Mark before = Now();
  StoreEntry(leaf, i, kw, vw);
  Unlock(leaf);
  TallyAdd(&tally_.leaf_plain, before);
  if (logged) FinishSmo();
  return Status::OK();
}

Status ClfBTree::AppendLeafRemove(Path& path, uint64_t leaf, Slice key) {
  Lock(leaf);
  int found, free_slot;
  uint32_t live;
  if (Status s = FindInLeaf(leaf, key, &found, &free_slot, &live); !s.ok() || found < 0) {
    Unlock(leaf);
    return s.ok() ? Status::NotFound() : s;
  }
  const uint32_t i = uint32_t(found);
  uint64_t* bw = &Bitmap(leaf)[i / 64];
  const uint64_t bit = 1ull << (i % 64);
  const bool logged = bk() || vb();
  if (logged) {
    Status s = bk() ? LogOld(LdR(Ent(leaf, i)), false) : Status::OK();
    if (s.ok() && vb()) s = LogOld(LdR(Ent(leaf, i) + 1), false);
    if (!s.ok()) {
      Unlock(leaf);
      AbortSmo();
      return s;
    }
    Arm(uint64_t(reinterpret_cast<char*>(bw) - base_), bit, kBitsClear);
  }
  pm::StoreAtomic(bw, uint64_t(LdR(bw) & ~bit), __ATOMIC_RELEASE);
  pm::Persist(bw, 8);
  if (live > 1) {
    Unlock(leaf);
    if (logged) FinishSmo();
    return Status::OK();
  }
  if (logged) {
    // FinishSmo waits for an epoch grace period: no lock is held across it.
    // Logged configurations have no FastWrite, so the leaf stays empty.
    Unlock(leaf);
    FinishSmo();
    return FreeEmptyLeaf(path, leaf, false);
  }
  return FreeEmptyLeaf(path, leaf, true);
}

Status ClfBTree::EncodedLeafWrite(Path& path, uint64_t leaf, Slice key, Slice value, Mode mode, bool remove) {
  Line img;
  ReadLine(leaf, img);
  Decoded d;
  if (!Decode(img, bk(), &d) || !d.leaf) return Status::Corrupt("clfbtree: encoded leaf does not decode");
  uint32_t pos = 0;
  bool eq = false;
  for (; pos < d.n; pos++) {
    int c;
    if (!CmpKey(d.k[pos], key, &c)) return Status::Corrupt("clfbtree: leaf key unreadable");
    if (c >= 0) {
      eq = c == 0;
      break;
    }
  }
  std::vector<uint64_t> k(d.k, d.k + d.n), p(d.p, d.p + d.n);
  uint64_t probe = 0;
  Expect expect = kChild;
  if (remove) {
    if (!eq) return Status::NotFound();
    Status s = bk() ? LogOld(k[pos], false) : Status::OK();
    if (s.ok() && vb()) s = LogOld(p[pos], false);
    if (!s.ok()) {
      AbortSmo();
      return s;
    }
    // The commit test names a block the change removes: the key's (unique
    // block offsets) for byte keys, else the value's.
    probe = bk() ? k[pos] : p[pos];
    expect = bk() ? kKeyAbsent : kNoChild;
    k.erase(k.begin() + pos);
    p.erase(p.begin() + pos);
    if (k.empty() && !path.empty() && path.back().d.np() > 1) {
      return FreeEmptyLeaf(path, leaf, false);  // the entry's blocks go with the leaf
    }
  } else if (eq) {
    if (mode == kInsert) return Status::AlreadyExists();
    int slot;
    uint64_t vw;
    PMINDEX_RETURN_IF_ERROR(NewWord(value, false, &slot, &vw));
    if (Status s = vb() ? LogOld(p[pos], false) : Status::OK(); !s.ok()) {
      AbortSmo();
      return s;
    }
    p[pos] = probe = vw;
  } else {
    if (mode == kUpdate) return Status::NotFound();
    int ks, vs;
    uint64_t kw, vw;
    PMINDEX_RETURN_IF_ERROR(NewWord(key, true, &ks, &kw));
    if (Status s = NewWord(value, false, &vs, &vw); !s.ok()) {
      AbortSmo();
      return s;
    }
    k.insert(k.begin() + pos, kw);
    p.insert(p.begin() + pos, vw);
    probe = bk() ? kw : vw;
    expect = bk() ? kKeyPresent : kChild;
  }
  const Mark before = Now();
  Line out;
  if (Encode(k.data(), uint32_t(k.size()), p.data(), uint32_t(p.size()), true, false, bk(), out))
    return UpdateNode(path, int(path.size()), leaf, out, true, probe, expect);
  std::vector<uint64_t> kids, seps;
  if (Status s = Pack(k, p, true, false, &kids, &seps); !s.ok()) {
    AbortSmo();
    return s;
  }
  TallyAdd(&tally_.leaf_split, before);
  tally_.leaf_splits++;
  if (Status s = LogOld(leaf, true); !s.ok()) {
    AbortSmo();
    return s;
  }
  return ReplaceChild(path, int(path.size()) - 1, kids, seps, true);
}

}  // namespace pmindex::internal::clfbtree
