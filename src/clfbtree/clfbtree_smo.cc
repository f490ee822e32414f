// clfbtree_smo.cc: the clfB-tree's node updates and structure changes
// (clfB-tree sec. 3, 4.1, 4.2 and 5, figure 4; docs/clfbtree.md).
//
// A node update goes through one of three parent-update methods, fixed at
// creation:
//   atomic  (sec. 3): the new 64-byte image by pm::AtomicLineWrite
//           (MOVDIR64B, or the emulated write), fence: 1 line.
//   inplace (sec. 4.2, Algorithm 3): image copied to Meta::linelog,
//           persisted; the node's invalid bit set, persisted; the image
//           written with the invalid bit still set, persisted; the invalid
//           bit cleared, persisted: 4 lines.
//   shadow  (sec. 4.1): the image written to a new node (persisted), then
//           the parent's pointer switched by one 8-byte store when the new
//           pointer difference fits the parent's width inside one aligned
//           word; otherwise the parent is shadowed too (the upward cascade),
//           up to Meta::root.
// A leaf split (figure 4b) writes two new leaves (2k lines for k-line
// leaves) and replaces the old leaf by them in the parent with one update;
// an inner node that overflows is packed into new nodes (two, balanced,
// when two fit), replacing it in its parent; the root is replaced by a new
// root through Meta::root.
//
// No leak: every new node or block is allocated into SmoLog::newn; every
// node or block the change unlinks is named in SmoLog::oldn; the log is
// armed (anchor, probe, expect) before the commit store. After the commit
// newn is cleared, and after an epoch grace period oldn is freed. Recovery
// (clfbtree_recovery.cc) decides committed or not from the armed probe.
//
// Thread safety: under write_mu_ only. Old nodes are locked before the
// commit and marked obsolete after it (an append leaf being split or freed
// is locked by the caller before it reads the leaf); new nodes are born
// locked and unlocked after it; the anchor is locked around its store. No
// lock is held across FinishSmo's epoch wait (a reader spins on a locked
// node inside its epoch guard).
#include <algorithm>

#include "clfbtree/clfbtree_tree.h"
#include "kit/pm_block.h"
#include "pmindex/pm/fault.h"

namespace pmindex::internal::clfbtree {

namespace {
// The most entries an append leaf holds: AppendCap of the largest leaf_size
// (2048 bytes, two bitmap words), which Create and Open enforce.
constexpr uint32_t kMaxLeafEnts = (2048 - 16) / 16;
}  // namespace

ClfBTree::Mark ClfBTree::Now() const {
  const pm::Counters& c = pm::ThreadCounters();
  return Mark{c.lines_flushed + c.line_writes, excluded_};
}

void ClfBTree::TallyAdd(uint64_t* field, const Mark& before) const {
  if (!c_.tally) return;
  const Mark now = Now();
  *field += (now.lines - before.lines) - (now.excluded - before.excluded);
}


int ClfBTree::LogNew() {
  for (int i = 0; i < kLogSlots; i++)
    if (meta_->log.newn[i] == 0) {
      log_used_ = true;
      return i;
    }
  return -1;
}

Status ClfBTree::AllocNode(uint64_t bytes, uint64_t* off) {
  const int i = LogNew();
  if (i < 0) return Status::Busy("clfbtree: structure change too large for the log");
  {
    Exclude x(this);
    PMINDEX_RETURN_IF_ERROR(alloc_->Allocate(&meta_->log.newn[i], bytes));
  }
  *off = meta_->log.newn[i];
  VL(*off).NewBorn();
  locked_new_.push_back(*off);
  return Status::OK();
}

Status ClfBTree::LogOld(uint64_t off, bool node, bool held) {
  Exclude x(this);
  SmoLog& l = meta_->log;
  for (int i = 0; i < log_slots_; i++)
    if (l.oldn[i] == 0) {
      pm::StoreAtomic(&l.oldn[i], off, __ATOMIC_RELAXED);
      pm::Flush(&l.oldn[i], 8);
      log_used_ = true;
      if (node) {
        if (!held) Lock(off);
        locked_old_.push_back(off);
      }
      return Status::OK();
    }
  // No slot (a change larger than the log): the change must not commit,
  // since the unlinked block would be neither freed nor, for a node, locked
  // against writers. The caller aborts it; a held lock is released there.
  if (node && held) locked_old_.push_back(off);
  return Status::Busy("clfbtree: structure change too large for the log");
}

void ClfBTree::Arm(uint64_t anchor, uint64_t probe, Expect e) {
  Exclude x(this);
  SmoLog& l = meta_->log;
  pm::StoreAtomic(&l.anchor, anchor, __ATOMIC_RELAXED);
  pm::StoreAtomic(&l.expect, uint64_t(e), __ATOMIC_RELAXED);
  pm::StoreAtomic(&l.probe, uint64_t(probe | (probe == 0 ? 1ull << 63 : 0)), __ATOMIC_RELAXED);
  if (!PMINDEX_FAULT("clfbtree.smo.skip_arm_persist")) pm::Persist(&l.anchor, 24);
  log_used_ = true;
}

void ClfBTree::FinishSmo() {
  SmoLog& l = meta_->log;
  for (int i = 0; i < kLogSlots; i++)
    if (l.newn[i]) {
      pm::StoreAtomic(&l.newn[i], uint64_t(0), __ATOMIC_RELAXED);
      pm::Flush(&l.newn[i], 8);
    }
  pm::Fence();
  for (uint64_t off : locked_new_) Unlock(off);
  for (uint64_t off : locked_old_) VL(off).UnlockObsolete();
  locked_new_.clear();
  locked_old_.clear();
  ApplyRouteChange();  // before the grace period that frees the replaced nodes
  bool any = !route_retired_.empty();
  for (int i = 0; i < kLogSlots; i++) any |= l.oldn[i] != 0;
  if (any) {
    epoch_.Synchronize();
    FreeRetiredRoutes();
    for (int i = 0; i < kLogSlots; i++)
      if (l.oldn[i]) alloc_->FreeOrAbort(&l.oldn[i]);
  }
  pm::StoreAtomic(&l.probe, uint64_t(0), __ATOMIC_RELAXED);
  pm::Persist(&l.probe, 8);
  log_used_ = false;
}

void ClfBTree::AbortSmo() {
  SmoLog& l = meta_->log;
  for (int i = 0; i < kLogSlots; i++) {
    if (l.newn[i]) alloc_->FreeOrAbort(&l.newn[i]);
    if (l.oldn[i]) {
      pm::StoreAtomic(&l.oldn[i], uint64_t(0), __ATOMIC_RELAXED);
      pm::Flush(&l.oldn[i], 8);
    }
  }
  for (uint64_t off : locked_new_) Unlock(off);
  for (uint64_t off : locked_old_) Unlock(off);
  locked_new_.clear();
  locked_old_.clear();
  route_change_.has = route_change_.bad = false;
  pm::StoreAtomic(&l.probe, uint64_t(0), __ATOMIC_RELAXED);
  pm::Persist(&l.probe, 8);
  log_used_ = false;
}

bool ClfBTree::Committed() const {
  const SmoLog& l = meta_->log;
  const uint64_t probe = l.probe & ~(1ull << 63);
  if (l.anchor + 64 > pool_->size() || l.anchor % 8) return false;
  const uint64_t w = LdR(At<uint64_t>(l.anchor));
  switch (l.expect) {
    case kWordEq:
      return w == probe;
    case kBitsSet:
      return (w & probe) != 0;
    case kBitsClear:
      return (w & probe) == 0;
    default: {
      Line img;
      ReadLine(l.anchor & ~63ull, img);
      Decoded d;
      bool present = false;
      const bool key = l.expect == kKeyAbsent || l.expect == kKeyPresent;
      if (Decode(img, bk(), &d)) {
        if (key)
          for (uint32_t i = 0; i < d.n; i++) present |= d.k[i] == probe;
        else
          for (uint32_t i = 0; i < d.np(); i++) present |= d.p[i] == probe;
      }
      return present == (l.expect == kChild || l.expect == kKeyPresent);
    }
  }
}

void ClfBTree::InPlaceLine(uint64_t off, const uint8_t img[64]) {
  // Algorithm 3: log, invalidate, write, validate; one persisted line each.
  Line cur;
  ReadLine(off, cur);
  pm::Copy(meta_->linelog.copy, cur, 64);
  if (!PMINDEX_FAULT("clfbtree.inplace.skip_log_persist")) pm::Persist(meta_->linelog.copy, 64);
  uint64_t* w0 = At<uint64_t>(off);
  if (!PMINDEX_FAULT("clfbtree.inplace.skip_invalidate")) {
    pm::StoreAtomic(w0, LdR(w0) | kInvalidBit, __ATOMIC_RELAXED);
    pm::Persist(w0, 8);
  }
  Line tmp;
  std::memcpy(tmp, img, 64);
  tmp[0] |= kInvalidBit;
  // Words 1..7 first, then word 0: without the invalidation a torn write
  // would leave a valid header over a half-written body.
  uint64_t* w = At<uint64_t>(off);
  for (int i = 1; i < 8; i++) {
    uint64_t x;
    std::memcpy(&x, tmp + 8 * i, 8);
    pm::StoreAtomic(w + i, x, __ATOMIC_RELAXED);
  }
  uint64_t t0;
  std::memcpy(&t0, tmp, 8);
  pm::StoreAtomic(w, t0, __ATOMIC_RELAXED);
  pm::Persist(At(off), 64);
  uint64_t first;
  std::memcpy(&first, img, 8);
  pm::StoreAtomic(w0, first, __ATOMIC_RELAXED);
  pm::Persist(w0, 8);
}

Status ClfBTree::UpdateNode(Path& path, int j, uint64_t off, const uint8_t img[64], bool is_leaf, uint64_t probe,
                            Expect expect) {
  if (c_.method != kShadow) {
    const bool logged = log_used_;
    if (logged) Arm(off, probe, expect);
    Lock(off);
    const Mark before = Now();
    if (c_.method == kAtomic) {
      if (!pm::AtomicLineWrite(At(off), img)) {
        Unlock(off);
        if (logged) AbortSmo();
        return Status::Unsupported("clfbtree: failure-atomic line write unavailable on this CPU");
      }
      pm::Fence();
    } else {
      InPlaceLine(off, img);
    }
    TallyAdd(is_leaf ? &tally_.leaf_plain : &tally_.inner_update, before);
    Unlock(off);
    if (logged) FinishSmo();
    return Status::OK();
  }
  uint64_t s;
  if (Status st = AllocNode(64, &s); !st.ok()) {
    AbortSmo();
    return st;
  }
  const Mark before = Now();
  WriteLine(s, img);
  pm::Flush(At(s), 64);
  TallyAdd(is_leaf ? &tally_.leaf_plain : &tally_.inner_split, before);
  tally_.shadows++;
  if (Status st = LogOld(off, true); !st.ok()) {
    AbortSmo();
    return st;
  }
  return ReplaceChild(path, j - 1, {s}, {}, is_leaf);
}

Status ClfBTree::Pack(const std::vector<uint64_t>& k, const std::vector<uint64_t>& p, bool leaf, bool kids_leaves,
                      std::vector<uint64_t>* out, std::vector<uint64_t>* seps) {
  const uint32_t n = uint32_t(k.size());
  Line a, b;
  auto enc = [&](uint32_t from, uint32_t nk, uint8_t* o) {
    const uint32_t np = leaf ? nk : nk + 1;
    return Encode(k.data() + from, nk, p.data() + from, np, leaf, kids_leaves, bk(), o);
  };
  struct Piece {
    uint32_t from, nk;
  };
  std::vector<Piece> pieces;
  if (enc(0, n, a)) pieces = {{0, n}};  // a new root over two children
  // Two balanced halves when both fit (the split point nearest the middle).
  for (uint32_t dist = 0; dist <= n && pieces.empty(); dist++) {
    for (int sgn = 0; sgn < 2 && pieces.empty(); sgn++) {
      const int64_t m = int64_t(n / 2) + (sgn ? -int64_t(dist) : int64_t(dist));
      if (leaf ? (m < 1 || m >= int64_t(n)) : (m < 0 || m >= int64_t(n))) continue;
      const uint32_t um = uint32_t(m);
      const uint32_t rfrom = leaf ? um : um + 1;
      if (enc(0, um, a) && enc(rfrom, n - rfrom, b)) pieces = {{0, um}, {rfrom, n - rfrom}};
    }
  }
  if (pieces.empty()) {  // greedy: the longest prefix that fits, repeatedly
    uint32_t from = 0;
    while (from < n || (!leaf && from == n)) {
      uint32_t nk = 1;
      while (from + nk < n && enc(from, nk + 1, a)) nk++;
      if (from + nk > n) nk = n - from;
      pieces.push_back({from, nk});
      from += leaf ? nk : nk + 1;
      if (leaf && from >= n) break;
    }
  }
  for (size_t i = 0; i < pieces.size(); i++) {
    uint64_t off;
    PMINDEX_RETURN_IF_ERROR(AllocNode(64, &off));
    if (!enc(pieces[i].from, pieces[i].nk, a)) return Status::Corrupt("clfbtree: pack produced an oversized node");
    WriteLine(off, a);
    pm::Flush(At(off), 64);
    out->push_back(off);
    if (i + 1 < pieces.size()) {
      const uint64_t sepw = k[pieces[i + 1].from - (leaf ? 0 : 1)];
      if (leaf && bk()) {
        std::string ks;
        KeyString(sepw, &ks);
        int slot;
        uint64_t w;
        PMINDEX_RETURN_IF_ERROR(NewWord(ks, true, &slot, &w));
        seps->push_back(w);
      } else {
        seps->push_back(sepw);
      }
    }
  }
  return Status::OK();
}

Status ClfBTree::ReplaceChild(Path& path, int j, std::vector<uint64_t> kids, std::vector<uint64_t> seps,
                              bool kids_leaves) {
  for (;;) {
    const Mark before = Now();
    if (j < 0) {
      if (kids.size() == 1) {
        const uint64_t w = kids[0] | (kids_leaves ? 1 : 0);
        Arm(uint64_t(reinterpret_cast<char*>(&meta_->root) - base_), w, kWordEq);
        pm::Fence();
        const Mark at = Now();
        pm::StoreAtomic(&meta_->root, w);
        pm::Persist(&meta_->root, 8);
        TallyAdd(&tally_.inner_split, at);
        FinishSmo();
        return Status::OK();
      }
      std::vector<uint64_t> nk, ns;
      if (Status s = Pack(seps, kids, false, kids_leaves, &nk, &ns); !s.ok()) {
        AbortSmo();
        return s;
      }
      TallyAdd(&tally_.inner_split, before);
      tally_.inner_splits++;
      kids = std::move(nk);
      seps = std::move(ns);
      kids_leaves = false;
      // A new root: every node is one level deeper.
      if (route_depth_ >= 0) route_depth_++;
      route_dirty_ = true;
      continue;
    }
    PathEnt& P = path[size_t(j)];
    const uint32_t idx = P.idx;
    // The node's keys and pointers in the writer's scratch vectors (their
    // capacity is kept across changes: no allocation per change).
    std::vector<uint64_t>& k = scratch_k_;
    std::vector<uint64_t>& p = scratch_p_;
    k.assign(P.d.k, P.d.k + P.d.n);
    p.assign(P.d.p, P.d.p + P.d.np());
    uint64_t removed = 0;
    if (kids.empty()) {
      removed = p[idx];
      p.erase(p.begin() + idx);
      const uint32_t ki = idx > 0 ? idx - 1 : 0;
      if (Status st = bk() ? LogOld(k[ki], false) : Status::OK(); !st.ok()) {
        AbortSmo();
        return st;
      }
      k.erase(k.begin() + ki);
    } else {
      p[idx] = kids[0];
      p.insert(p.begin() + idx + 1, kids.begin() + 1, kids.end());
      k.insert(k.begin() + idx, seps.begin(), seps.end());
    }
    if (c_.method == kShadow && kids.size() == 1 && idx >= 1) {
      const uint64_t d = kids[0] - P.d.p[0];
      const uint32_t at = PtrOffset(P.d, idx);
      if (SignedWidth(d) <= P.d.pw && at / 8 == (at + P.d.pw - 1) / 8) {
        uint64_t* word = At<uint64_t>(P.off + (at & ~7u));
        uint64_t v = LdR(word);
        const uint32_t sh = 8 * (at % 8);
        const uint64_t mask = (P.d.pw == 8 ? ~0ull : ((1ull << (8 * P.d.pw)) - 1)) << sh;
        v = (v & ~mask) | ((EncSigned(d, P.d.pw) << sh) & mask);
        Arm(P.off, kids[0], kChild);
        Lock(P.off);
        const Mark at = Now();
        pm::StoreAtomic(word, v);
        pm::Persist(word, 8);
        TallyAdd(&tally_.inner_update, at);
        Unlock(P.off);
        FinishSmo();
        return Status::OK();
      }
      tally_.cascades++;
    }
    Line img;
    if (Encode(k.data(), uint32_t(k.size()), p.data(), uint32_t(p.size()), false, P.d.kids_leaves, bk(), img)) {
      if (c_.method != kShadow) {
        return UpdateNode(path, j, P.off, img, false, kids.empty() ? removed : kids[0], kids.empty() ? kNoChild : kChild);
      }
      uint64_t s;
      if (Status st = AllocNode(64, &s); !st.ok()) {
        AbortSmo();
        return st;
      }
      WriteLine(s, img);
      if (!PMINDEX_FAULT("clfbtree.shadow.skip_node_flush")) pm::Flush(At(s), 64);
      tally_.shadows++;
      TallyAdd(&tally_.inner_split, before);
      if (Status st = LogOld(P.off, true); !st.ok()) {
        AbortSmo();
        return st;
      }
      kids = {s};
      seps.clear();
      NoteReplaced(j, P.off, P.d.n ? P.d.k[0] : 0, kids, seps);
    } else {
      std::vector<uint64_t> nk, ns;
      if (Status s = Pack(k, p, false, P.d.kids_leaves, &nk, &ns); !s.ok()) {
        AbortSmo();
        return s;
      }
      TallyAdd(&tally_.inner_split, before);
      tally_.inner_splits++;
      if (Status st = LogOld(P.off, true); !st.ok()) {
        AbortSmo();
        return st;
      }
      kids = std::move(nk);
      seps = std::move(ns);
      NoteReplaced(j, P.off, P.d.n ? P.d.k[0] : 0, kids, seps);
    }
    kids_leaves = false;
    j--;
  }
}

Status ClfBTree::SplitAppendLeaf(Path& path, uint64_t leaf, uint64_t kw, uint64_t vw) {
  const Mark before = Now();
  // The caller's lock on the leaf: released by FinishSmo or AbortSmo.
  if (Status st = LogOld(leaf, true, true); !st.ok()) {
    AbortSmo();
    return st;
  }
  // The leaf's entries and the new one, on the stack (a leaf holds at most
  // kMaxLeafEnts), walked by the bitmap's set bits.
  struct KV {
    uint64_t first, second;
  };
  KV ents[kMaxLeafEnts + 1];
  size_t ne = 0;
  const uint64_t* bm = Bitmap(leaf);
  for (uint32_t w = 0; w < bm_words_; w++)
    for (uint64_t b = LdR(&bm[w]); b; b &= b - 1) {
      const uint32_t i = 64 * w + uint32_t(__builtin_ctzll(b));
      if (i < cap_) ents[ne++] = {LdR(Ent(leaf, i)), LdR(Ent(leaf, i) + 1)};
    }
  ents[ne++] = {kw, vw};
  if (bk()) {
    std::vector<std::pair<std::string, size_t>> ks(ne);
    for (size_t i = 0; i < ne; i++) {
      KeyString(ents[i].first, &ks[i].first);
      ks[i].second = i;
    }
    std::sort(ks.begin(), ks.end());
    std::vector<KV> sorted;
    for (auto& x : ks) sorted.push_back(ents[x.second]);
    std::copy(sorted.begin(), sorted.end(), ents);
  } else {
    // The key words are distinct (the caller's duplicate check): the key
    // alone orders them. The halves are append leaves (unsorted): only the
    // split point needs finding, not a full order.
    std::nth_element(ents, ents + ne / 2, ents + ne, [](const KV& a, const KV& b) { return a.first < b.first; });
  }
  const size_t m = ne / 2;
  uint64_t half[2];
  for (int h = 0; h < 2; h++) {
    if (Status s = AllocNode(c_.leaf_size, &half[h]); !s.ok()) {
      AbortSmo();
      return s;
    }
    const size_t from = h ? m : 0, to = h ? ne : m;
    // Slots 0..n-1 take the half's entries in one copy (KV is the slot's
    // {key, value} layout); the leaf is unreachable and locked until the commit.
    static_assert(sizeof(KV) == 16);
    const uint32_t n = uint32_t(to - from);
    pm::Copy(Ent(half[h], 0), &ents[from], 16 * size_t(n));
    uint64_t bits[2] = {n >= 64 ? ~0ull : (1ull << n) - 1, n > 64 ? (1ull << (n - 64)) - 1 : 0};
    for (uint32_t w = 0; w < bm_words_; w++) pm::StoreAtomic(Bitmap(half[h]) + w, bits[w], __ATOMIC_RELAXED);
    if (LeafFilter* f = Filter(half[h])) {
      // The new leaf is born locked (AllocNode): its filter is valid for the
      // version its unlock after the commit publishes.
      uint8_t fp[LeafFilter::kSlots];
      for (size_t i = from; i < to; i++) fp[i - from] = LeafFilter::Fp(ents[i].first);
      f->Store(fp, uint32_t(to - from));
      f->SetValid((VL(half[h]).LoadRelaxed() & ~kit::VersionLock::kBusy) + kit::VersionLock::kStep);
    }
    if (!PMINDEX_FAULT("clfbtree.split.skip_leaf_flush")) pm::Flush(At(half[h]), c_.leaf_size);
  }
  uint64_t sep = ents[m].first;
  if (bk()) {
    std::string ks;
    KeyString(sep, &ks);
    int slot;
    if (Status s = NewWord(ks, true, &slot, &sep); !s.ok()) {
      AbortSmo();
      return s;
    }
  }
  TallyAdd(&tally_.leaf_split, before);
  tally_.leaf_splits++;
  return ReplaceChild(path, int(path.size()) - 1, {half[0], half[1]}, {sep}, true);
}

Status ClfBTree::FreeEmptyLeaf(Path& path, uint64_t leaf, bool held) {
  if (path.empty() || path.back().d.np() <= 1) {
    if (held) Unlock(leaf);
    if (log_used_) FinishSmo();
    return Status::OK();
  }
  if (Status st = LogOld(leaf, true, held); !st.ok()) {
    // An append leaf's delete has committed: the empty leaf stays linked
    // (a later insert fills it). An encoded leaf's entry is removed with
    // the leaf, so nothing happened and the error is the answer.
    AbortSmo();
    return encoded() ? st : Status::OK();
  }
  const Status st = ReplaceChild(path, int(path.size()) - 1, {}, {}, true);
  return encoded() ? st : Status::OK();  // likewise when the unlink fails (aborted)
}

}  // namespace pmindex::internal::clfbtree
