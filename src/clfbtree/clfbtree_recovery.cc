// clfbtree_recovery.cc: creation, open-time recovery, Check, the owned-block
// walk and the encoding-width census of the clfB-tree (clfB-tree sec. 4.2 and
// 7.1; docs/clfbtree.md, "Recovery").
//
// Recovery at a read-write open:
//  1. method inplace: a node whose invalid bit is set was being updated in
//     place; it gets the image in Meta::linelog back (persisted). Finding it
//     walks the inner nodes and encoded leaves (append leaves are never
//     updated in place with the line log).
//  2. the SmoLog: if armed and its commit test holds, the change happened:
//     newn is cleared and oldn freed; otherwise newn is freed and oldn
//     forgotten. Then the log is idle.
// Methods atomic and shadow need step 2 only.
//
// Thread safety: Format and Recover before the index is shared; Check,
// ForEachOwnedBlock and Widths not concurrently with writers.
#include <sys/mman.h>

#include <algorithm>
#include <set>

#include "clfbtree/clfbtree_tree.h"
#include "kit/pm_block.h"

namespace pmindex::internal::clfbtree {

namespace {
// A DRAM table indexed by node address is read at every node of a descent,
// each time at a random place: on 2 MiB pages its reads do not add TLB
// misses to the nodes' own. Advice only (THP may be off): no error.
template <class W>
void AdviseHugePages(const kit::LockTable<W>& t, const char* base) {
  if (t.mapped()) (void)madvise(static_cast<void*>(t.At(base)), t.bytes(), MADV_HUGEPAGE);
}
}  // namespace

void ClfBTree::MapHints() {
  AdviseHugePages(locks_, base_);
  // A hint for scans: without its table (no address space) scans sort.
  if (c_.leaf == kAppendLeaf && !bk() && !sort_cache_.Map(base_, pool_->max_size(), c_.leaf_size).ok()) sort_cache_.Unmap();
  // Likewise the leaf filters: without them a leaf is searched linearly.
  if (fast_writes_ && cap_ <= LeafFilter::kSlots && !filters_.Map(base_, pool_->max_size(), c_.leaf_size).ok())
    filters_.Unmap();
  AdviseHugePages(sort_cache_, base_);
  AdviseHugePages(filters_, base_);
}

Status ClfBTree::Format() {
  PMINDEX_RETURN_IF_ERROR(alloc_->AllocateZeroed(pool_->root_slot(), sizeof(Meta)));
  meta_ = pool_->root<Meta>();
  PMINDEX_RETURN_IF_ERROR(locks_.Map(base_, pool_->max_size(), 64));
  MapHints();
  Meta* m = meta_;
  pm::Store(&m->version, kVersion);
  pm::Store(&m->key_kind, uint8_t(c_.kk));
  pm::Store(&m->value_kind, uint8_t(c_.vk));
  pm::Store(&m->leaf_kind, uint8_t(c_.leaf));
  pm::Store(&m->method, uint8_t(c_.method));
  pm::Store(&m->leaf_size, uint32_t(LeafBytes()));
  pm::Store(&m->emulated, uint8_t(c_.emulated));
  pm::Flush(m, 64);
  PMINDEX_RETURN_IF_ERROR(alloc_->AllocateZeroed(&m->root, LeafBytes()));
  if (encoded()) {
    Line img;
    Encode(nullptr, 0, nullptr, 0, true, false, bk(), img);
    WriteLine(m->root, img);
    pm::Flush(At(m->root), 64);
  }
  pm::StoreAtomic(&m->root, m->root | 1);
  pm::Persist(&m->root, 8);
  pm::StoreAtomic(&m->magic, kMagic);
  pm::Persist(&m->magic, 8);
  return Status::OK();
}

Status ClfBTree::WalkNodes(const std::function<Status(uint64_t off, bool leaf, const Decoded* d, int depth)>& fn) {
  struct Item {
    uint64_t off;
    bool leaf;
    int depth;
  };
  std::vector<Item> stack{{meta_->root & ~63ull, bool(meta_->root & 1), 0}};
  uint64_t visited = 0;
  const uint64_t limit = pool_->size() / 64 + 1;
  while (!stack.empty()) {
    Item it = stack.back();
    stack.pop_back();
    if (++visited > limit || it.depth > kMaxDepth) return Status::Corrupt("clfbtree: node walk does not end");
    if (!NodeOk(it.off, it.leaf ? LeafBytes() : 64)) return Status::Corrupt("clfbtree: node offset out of the pool");
    if (it.leaf && !encoded()) {
      PMINDEX_RETURN_IF_ERROR(fn(it.off, true, nullptr, it.depth));
      continue;
    }
    Line img;
    ReadLine(it.off, img);
    if (repair_ && (img[0] & kInvalidBit)) {
      // Method inplace: the node being updated in place gets its logged
      // image back before anything below it is read.
      WriteLine(it.off, meta_->linelog.copy);
      pm::Persist(At(it.off), 64);
      restored_lines_++;
      ReadLine(it.off, img);
    }
    Decoded d;
    if (!Decode(img, bk(), &d)) return Status::Corrupt("clfbtree: node does not decode at " + std::to_string(it.off));
    if (d.leaf != it.leaf) return Status::Corrupt("clfbtree: node kind differs from its parent's flag");
    PMINDEX_RETURN_IF_ERROR(fn(it.off, it.leaf, &d, it.depth));
    if (!it.leaf)
      for (int i = int(d.np()) - 1; i >= 0; i--) stack.push_back({d.p[i], d.kids_leaves, it.depth + 1});
  }
  return Status::OK();
}

Status ClfBTree::RecoverSmo() {
  SmoLog& l = meta_->log;
  const bool committed = l.probe != 0 && Committed();
  for (int i = 0; i < kLogSlots; i++) {
    if (committed) {
      if (l.newn[i]) pm::StoreAtomic(&l.newn[i], uint64_t(0));
      if (l.oldn[i]) PMINDEX_RETURN_IF_ERROR(alloc_->Free(&l.oldn[i]));
    } else {
      if (l.newn[i]) PMINDEX_RETURN_IF_ERROR(alloc_->Free(&l.newn[i]));
      if (l.oldn[i]) pm::StoreAtomic(&l.oldn[i], uint64_t(0));
    }
  }
  pm::Flush(&l, sizeof(SmoLog));
  pm::Fence();
  pm::StoreAtomic(&l.probe, uint64_t(0));
  pm::Persist(&l.probe, 8);
  return Status::OK();
}

Status ClfBTree::Recover() {
  meta_ = pool_->root<Meta>();
  PMINDEX_RETURN_IF_ERROR(locks_.Map(base_, pool_->max_size(), 64));
  MapHints();
  if (pool_->read_only()) return Status::OK();
  if (c_.method == kInPlace) {
    repair_ = true;
    Status st = WalkNodes([](uint64_t, bool, const Decoded*, int) { return Status::OK(); });
    repair_ = false;
    PMINDEX_RETURN_IF_ERROR(st);
  }
  PMINDEX_RETURN_IF_ERROR(RecoverSmo());
  MaybeRebuildRoute();
  return Status::OK();
}

Status ClfBTree::Check() {
  if (closed()) return IndexClosed();
  if (meta_->log.probe != 0) return Status::Corrupt("clfbtree: structure-change log armed while idle");
  for (int i = 0; i < kLogSlots; i++)
    if (meta_->log.newn[i] || meta_->log.oldn[i]) return Status::Corrupt("clfbtree: log owns blocks while idle");
  std::set<uint64_t> seen;
  int leaf_depth = -1;
  Status st = WalkNodes([&](uint64_t off, bool leaf, const Decoded* d, int depth) -> Status {
    if (!seen.insert(off).second) return Status::Corrupt("clfbtree: node reachable twice");
    if (leaf) {
      if (leaf_depth < 0) leaf_depth = depth;
      if (depth != leaf_depth) return Status::Corrupt("clfbtree: leaves at different depths");
    }
    std::vector<uint64_t> keys;
    if (d) {
      if (d->invalid) return Status::Corrupt("clfbtree: node left invalid");
      Line img, re;
      ReadLine(off, img);
      // Widths are minimal, except that shadowing's in-place pointer store
      // keeps a node's pointer width when a narrower one would do.
      uint8_t kw, pw;
      clfbtree::Widths(d->k, d->n, d->p, d->np(), bk(), &kw, &pw);
      if (d->kw != kw || d->pw < pw || (c_.method != kShadow && d->pw != pw))
        return Status::Corrupt("clfbtree: encoding widths not minimal at " + std::to_string(off));
      if (c_.method != kShadow &&
          (!Encode(d->k, d->n, d->p, d->np(), d->leaf, d->kids_leaves, bk(), re) || std::memcmp(img, re, 64) != 0))
        return Status::Corrupt("clfbtree: node image differs from its canonical encoding at " + std::to_string(off));
      keys.assign(d->k, d->k + d->n);
    } else {
      const uint64_t* bm = Bitmap(off);
      if (bm_words_ == 1 && cap_ < 64 && (bm[0] >> cap_)) return Status::Corrupt("clfbtree: bitmap beyond capacity");
      for (uint32_t i = 0; i < cap_; i++)
        if ((bm[i / 64] >> (i % 64)) & 1) keys.push_back(*Ent(off, i));
      std::vector<std::string> ks;
      for (uint64_t k : keys) {
        std::string s;
        if (!KeyString(k, &s)) return Status::Corrupt("clfbtree: key block unreadable");
        ks.push_back(s);
      }
      std::sort(ks.begin(), ks.end(), [&](const std::string& a, const std::string& b) { return CompareKeys(c_.kk, a, b) < 0; });
      for (size_t i = 1; i < ks.size(); i++)
        if (CompareKeys(c_.kk, ks[i - 1], ks[i]) == 0) return Status::Corrupt("clfbtree: duplicate key in a leaf");
      return Status::OK();
    }
    for (size_t i = 1; i < keys.size(); i++)
      if (CmpWords(keys[i - 1], keys[i]) >= 0) return Status::Corrupt("clfbtree: keys not ascending at " + std::to_string(off));
    return Status::OK();
  });
  PMINDEX_RETURN_IF_ERROR(st);
  PMINDEX_RETURN_IF_ERROR(CheckRanges(meta_->root & ~63ull, meta_->root & 1, nullptr, nullptr, 0));
  return CheckHints();
}

// Every key of a node lies in the range its parent routes to it: [lo, hi).
Status ClfBTree::CheckRanges(uint64_t off, bool leaf, const std::string* lo, const std::string* hi, int depth) {
  if (depth > kMaxDepth) return Status::Corrupt("clfbtree: tree too deep");
  auto in_range = [&](uint64_t kw) {
    std::string k;
    if (!KeyString(kw, &k)) return false;
    return (!lo || CompareKeys(c_.kk, *lo, k) <= 0) && (!hi || CompareKeys(c_.kk, k, *hi) < 0);
  };
  if (leaf && !encoded()) {
    const uint64_t* bm = Bitmap(off);
    for (uint32_t i = 0; i < cap_; i++)
      if (((bm[i / 64] >> (i % 64)) & 1) && !in_range(*Ent(off, i)))
        return Status::Corrupt("clfbtree: leaf key outside its parent's range at " + std::to_string(off));
    return Status::OK();
  }
  Line img;
  ReadLine(off, img);
  Decoded d;
  if (!Decode(img, bk(), &d)) return Status::Corrupt("clfbtree: node does not decode");
  for (uint32_t i = 0; i < d.n; i++)
    if (!in_range(d.k[i])) return Status::Corrupt("clfbtree: key outside its parent's range at " + std::to_string(off));
  if (leaf) return Status::OK();
  for (uint32_t i = 0; i < d.np(); i++) {
    std::string l, h;
    if (i > 0) KeyString(d.k[i - 1], &l);
    if (i < d.n) KeyString(d.k[i], &h);
    PMINDEX_RETURN_IF_ERROR(CheckRanges(d.p[i], d.kids_leaves, i > 0 ? &l : lo, i < d.n ? &h : hi, depth + 1));
  }
  return Status::OK();
}

Status ClfBTree::ForEachOwnedBlock(const std::function<void(uint64_t)>& fn) {
  if (closed()) return IndexClosed();
  fn(*pool_->root_slot());
  for (int i = 0; i < kLogSlots; i++) {
    if (meta_->log.newn[i]) fn(meta_->log.newn[i]);
    if (meta_->log.oldn[i]) fn(meta_->log.oldn[i]);
  }
  return WalkNodes([&](uint64_t off, bool leaf, const Decoded* d, int) {
    fn(off);
    if (d) {
      if (bk())
        for (uint32_t i = 0; i < d->n; i++) fn(d->k[i]);
      if (leaf && vb())
        for (uint32_t i = 0; i < d->n; i++) fn(d->p[i]);
    } else if (bk() || vb()) {
      const uint64_t* bm = Bitmap(off);
      for (uint32_t i = 0; i < cap_; i++)
        if ((bm[i / 64] >> (i % 64)) & 1) {
          if (bk()) fn(Ent(off, i)[0]);
          if (vb()) fn(Ent(off, i)[1]);
        }
    }
    return Status::OK();
  });
}

void ClfBTree::Widths(uint64_t key_w[9], uint64_t ptr_w[9], uint64_t* nodes, double* utilisation) {
  for (int i = 0; i < 9; i++) key_w[i] = ptr_w[i] = 0;
  *nodes = 0;
  double util = 0;
  WalkNodes([&](uint64_t, bool, const Decoded* d, int) {
    if (!d) return Status::OK();
    ++*nodes;
    if (d->n > 1) key_w[d->kw] += d->n - 1;
    if (d->np() > 1) ptr_w[d->pw] += d->np() - 1;
    // Unencoded, a 64-byte node holds 3 keys (and 4 children): sec. 2.1.
    util += double(d->n) / 3.0;
    return Status::OK();
  });
  *utilisation = *nodes ? util / double(*nodes) : 0;
}

}  // namespace pmindex::internal::clfbtree
