// fptree/fptree_recovery.cc: creating and opening an FPTree pool: the
// creation (Format), the classification of an existing root (a crashed
// creation vs a damaged root), the validation of everything recovery
// dereferences on a possibly damaged pool, and recovery itself (paper alg.
// 9, with alg. 4, 7, 11, 13 and the leak checks of alg. 17), ending in a bulk
// build of the DRAM inner nodes. Format: fptree_format.h.
//
// Persist order, creation (Format): the root block (allocated zeroed into
// the pool's root slot); line 0 (magic, config) persisted with one fence;
// the first leaf allocated into head (fptree_single: a group, via get_log,
// whose first leaf is then stored into head); initialized = 1. Format is
// idempotent: run again on a crashed creation it reuses the root, the leaf
// or the group it finds, so any number of crashes inside creation leave
// initialized == 0, magic 0
// or kMagic, at most two allocated blocks (the root, one leaf or group),
// and, once anything beyond the root is allocated, magic and a valid config
// durable, head 0 or one empty leaf that ends the list, and no split,
// delete or free-group log in use. Such a root is formatted again (alg. 9
// line 1), with the root's own config if its first leaf was allocated for
// it. Any other root that is not initialised is Corrupt: formatting it again
// would drop every record, reading it as initialised would trust damaged
// words (kit/root_check.h).
//
// Recovery, in order: group logs (alg. 11/13), split logs (alg. 4), delete
// logs (alg. 7: the unlinks of all logs before any free), then one pass over
// the leaf list (parallel per leaf): reset the leaf lock words, leak checks
// of alg. 17 for keys and values (a block word of a free slot is freed, or
// zeroed if a valid slot shares it), emptiness and minimum keys; then empty
// leaves are unlinked (with the delete log, as at run time; the tree's last
// leaf stays), sparse leaves are merged and fptree_single's groups compacted
// (fptree_compact.cc, after the merge log of an interrupted open is redone
// with the delete logs), fptree's and ptree's surviving leaves are moved to
// adjacent blocks after a compaction that dropped at least half of them
// (fptree_relocate.cc; the move log of an interrupted open is settled with
// the merge log), fptree_single's free-leaf vector is rebuilt, and
// the inner nodes are bulk-loaded about 75% full.
//
// Corrupt pools (docs/fptree.md "Corrupt pools"): before recovery stores
// anything, open range-checks what it dereferences (root config, log
// offsets, the leaf and group lists with a walk bound, bitmaps, block
// words) and returns Status::Corrupt naming the word.
//
// Thread safety: open is single-threaded (the per-leaf pass runs worker
// threads on disjoint leaves).
#include <algorithm>
#include <chrono>
#include <mutex>
#include <thread>

#include "fptree/fptree_tree.h"
#include "kit/root_check.h"

namespace pmindex::internal::fptree {

Status CheckConfig(const Root* r, uint8_t v) {
  const uint32_t maxm = v == kPTree ? 64 : 56;
  if (r->variant != v) return Bad("root variant " + Num(r->variant) + ", expected " + Num(v));
  if (r->key_kind > 1 || r->value_kind > 1 || r->inplace_update > 1)
    return Bad("root key/value kind or update mode out of range (" + Num(r->key_kind) + "/" + Num(r->value_kind) + "/" +
               Num(r->inplace_update) + ")");
  if (r->leaf_slots < 2 || r->leaf_slots > maxm)
    return Bad("root leaf_slots " + Num(r->leaf_slots) + " out of range [2, " + Num(maxm) + "]");
  if (r->inner_size < 3 || r->inner_size > 65536) return Bad("root inner_size " + Num(r->inner_size) + " out of range [3, 65536]");
  if (v == kSingle && (r->group_size < 1 || r->group_size > 64))
    return Bad("root group_size " + Num(r->group_size) + " out of range [1, 64]");
  if (r->max_key == 0 || r->max_key > (1u << 20)) return Bad("root max_key " + Num(r->max_key) + " out of range");
  if (r->max_value > (64u << 20)) return Bad("root max_value " + Num(r->max_value) + " out of range");
  if (r->leaf_bytes != LeafBytes(v != kPTree, r->leaf_slots))
    return Bad("root leaf_bytes " + Num(r->leaf_bytes) + " does not match leaf_slots " + Num(r->leaf_slots));
  return Status::OK();
}

Status ClassifyRoot(pm::Pool* pool, uint8_t v, bool* fresh, bool* pm_config) {
  *fresh = *pm_config = false;
  // Format versions 1 and 2 -> 3 (fptree_format.h): only the magic
  // differs, since an older root holds zeros where the newer versions keep
  // their words (version 2: retire area and merge log; version 3: move
  // log). An older magic beside nonzero words there is not a pool of that
  // version and stays refused.
  if (const uint64_t ro = *pool->root_slot(); ro && ro % 8 == 0 && pool->size() >= sizeof(Root) && ro <= pool->size() - sizeof(Root)) {
    Root* r = reinterpret_cast<Root*>(pool->base() + ro);
    const bool no_v3 = r->move_prev == 0 && r->move_from == 0 && r->move_to == 0;
    const bool no_v2 = r->retire_area == 0 && r->merge_left == 0 && r->merge_left_bm == 0 && r->merge_right == 0;
    if ((r->magic == kMagicV1 && no_v2 && no_v3) || (r->magic == kMagicV2 && no_v3)) pm::StorePersist(&r->magic, kMagic);
  }
  const kit::RootSpec spec{"fptree", kMagic, sizeof(Root), offsetof(Root, magic), offsetof(Root, initialized)};
  kit::RootState state;
  PMINDEX_RETURN_IF_ERROR(kit::ClassifyRoot(pool, spec, &state));
  if (state == kit::RootState::kAbsent) {
    *fresh = true;
    return Status::OK();
  }
  const Root* r = pool->root<Root>();
  if (state == kit::RootState::kInitialized) return CheckConfig(r, v);
  for (int i = 0; i < kLogs; i++)
    if (r->split[i].cur || r->split[i].nw || r->del[i].cur || r->del[i].prev)
      return Bad("root not initialised but micro-log " + Num(i) + " in use");
  if (r->free_log.cur) return Bad("root not initialised but the free-group log is in use");
  // Creation allocates the root and at most one leaf or one group before
  // initialized = 1. More blocks are a damaged initialised tree (e.g.
  // initialized and head both lost).
  const bool allocated = r->head || r->groups_head || r->get_log.new_group;
  PMINDEX_RETURN_IF_ERROR(kit::CheckCreationBlocks(pool, spec, allocated ? 2u : 1u,
                                                   "root not initialised (initialized = 0, head " + Num(r->head) + ")"));
  *fresh = true;
  if (!allocated) return Status::OK();
  if (r->magic != kMagic) return Bad("root not initialised, without magic, but leaves allocated");
  PMINDEX_RETURN_IF_ERROR(CheckConfig(r, v));
  *pm_config = true;
  if (r->head) {
    const uint64_t h = r->head;
    if (h % 64 || h > pool->size() - r->leaf_bytes) return Bad("root head " + Num(h) + " is not a leaf offset");
    const char* l = pool->base() + h;
    uint64_t bm, next;
    std::memcpy(&bm, l, 8);
    std::memcpy(&next, l + LeafTrailer(v != kPTree, r->leaf_slots), 8);
    if (bm || next)
      return Bad("root not initialised (initialized = 0) but its first leaf holds records or has a next leaf");
  }
  return Status::OK();
}

// ---- creation and open ----------------------------------------------------------
template <bool kConc, bool kBytes>
Status FPTree<kConc, kBytes>::Format(uint8_t variant, const Options& o, uint32_t m, uint32_t inner, uint32_t group,
                                     bool inplace) {
  uint64_t* rs = pool_->root_slot();
  if (*rs == 0) PMINDEX_RETURN_IF_ERROR(pool_->allocator().AllocateZeroed(rs, sizeof(Root)));
  root_ = pool_->root<Root>();
  Root* r = root_;
  pm::Store(&r->magic, kMagic);
  pm::Store(&r->variant, variant);
  pm::Store(&r->key_kind, uint8_t(o.key_kind));
  pm::Store(&r->value_kind, uint8_t(o.value_kind));
  pm::Store(&r->inplace_update, uint8_t(inplace));
  pm::Store(&r->leaf_slots, m);
  pm::Store(&r->inner_size, inner);
  pm::Store(&r->group_size, group);
  pm::Store(&r->max_key, uint32_t(o.max_key_size));
  pm::Store(&r->max_value, uint32_t(o.max_value_size));
  LoadConfig();
  pm::Store(&r->leaf_bytes, lay_.bytes);
  pm::Persist(r, 64);
  if (groups_) {
    PMINDEX_RETURN_IF_ERROR(CheckGroups());
    RecoverGetLog();  // crashed inside GetLeaf
  }
  if (r->head == 0) {
    if (groups_) {
      // One group holding the first leaf (alg. 10 path without a free
      // vector). A crashed creation may have linked that group already
      // (RecoverGetLog above finishes one it had only allocated): its
      // first leaf, still zeroed, becomes the head, so that a creation
      // crashing again never allocates a second group.
      uint64_t leaf = 0;
      if (r->groups_head) leaf = r->groups_head + 64;
      else PMINDEX_RETURN_IF_ERROR(GetLeaf(&leaf));
      pm::StorePersist(&r->head, leaf);
    } else {
      PMINDEX_RETURN_IF_ERROR(pool_->allocator().AllocateZeroed(&r->head, lay_.bytes));
    }
  }
  pm::StorePersist(&r->initialized, uint64_t(1));
  return Recover();
}

template <bool kConc, bool kBytes>
Status FPTree<kConc, kBytes>::Open() {
  root_ = pool_->root<Root>();
  if (!root_ || root_->magic != kMagic)
    return Status::Corrupt("fptree root object missing or bad magic (not an fptree pool, or a format newer than 3)");
  if (VariantName(root_->variant) != pool_->type()) return Status::Corrupt("fptree root variant does not match the pool type");
  LoadConfig();
  if (root_->leaf_bytes != lay_.bytes) return Status::Corrupt("fptree leaf size mismatch");
  return Recover();
}

template <bool kConc, bool kBytes>
void FPTree<kConc, kBytes>::LoadConfig() {
  Root* r = root_;
  variant_ = r->variant;
  groups_ = variant_ == kSingle;
  vbytes_ = r->value_kind == uint8_t(ValueKind::kBytes);
  inplace_ = r->inplace_update && !vbytes_;
  max_key_ = r->max_key;
  max_value_ = r->max_value;
  inner_cap_ = r->inner_size;
  const size_t kb = sizeof(Inner) + 8 * size_t(inner_cap_);  // header + keys
  inner_pf_bytes_ = kb <= kInnerPrefetchMax ? uint32_t(kb) : 0;
  group_size_ = r->group_size;
  lay_ = LeafLayout::Of(variant_ != kPTree, r->leaf_slots);
  pointers_ = kBytes || vbytes_;
}

// fptree: the leaf lock/version table (kit/lock_table.h), one word per
// largest power of two <= the leaf size of the pool's reserved range.
template <bool kConc, bool kBytes>
Status FPTree<kConc, kBytes>::MapLeafVersions() {
  if (!kConc || vtab_.mapped()) return Status::OK();
  return vtab_.Map(base_, reserved_size_, lay_.bytes);
}

// ---- validation of the PM state recovery trusts ------------------------------------
template <bool kConc, bool kBytes>
Status FPTree<kConc, kBytes>::LeafWord(const std::string& what, uint64_t x) const {
  if (LeafOk(x)) return Status::OK();
  return Bad(what + " = " + Num(x) + " is not a leaf offset (64-byte aligned, inside the " + Num(pool_->size()) + "-byte pool)");
}

// The leaf list from head, in order: every offset a leaf (LeafOk), at most
// one leaf per leaf size of pool (a longer walk is a cycle), not empty.
// Shared by Recover and Check.
template <bool kConc, bool kBytes>
Status FPTree<kConc, kBytes>::CollectLeaves(std::vector<uint64_t>* out) const {
  out->clear();
  const uint64_t ps = pool_->size();
  kit::BoundedWalk walk(ps, lay_.bytes);
  Status st;
  uint64_t prev = 0;
  ForEachLeaf([&](uint64_t x) -> uint64_t {
    if (!LeafOk(x, ps)) {
      st = LeafWord(prev ? "next pointer of the leaf at " + Num(prev) : std::string("root head"), x);
      return 0;
    }
    if (!walk.Step()) {
      st = Bad("leaf list has a cycle (more than " + Num(walk.bound()) + " leaves)");
      return 0;
    }
    out->push_back(x);
    prev = x;
    return Ld(Next(L(x)));
  });
  PMINDEX_RETURN_IF_ERROR(st);
  if (out->empty()) return Bad("leaf list is empty (root head is 0)");
  return Status::OK();
}

// Split and delete micro-logs: every offset recovery dereferences is a
// leaf; a split's leaves have no bitmap bit beyond the leaf size (the redo
// reads the slots of the set bits).
template <bool kConc, bool kBytes>
Status FPTree<kConc, kBytes>::CheckLogs() const {
  const Root* r = root_;
  for (int i = 0; i < kLogs; i++) {
    const SplitLog& sl = r->split[i];
    const std::string sn = "split log " + Num(i);
    if (sl.cur && sl.nw) {
      PMINDEX_RETURN_IF_ERROR(LeafWord(sn + " cur", sl.cur));
      PMINDEX_RETURN_IF_ERROR(LeafWord(sn + " new", sl.nw));
      if (sl.cur == sl.nw) return Bad(sn + ": cur and new are the same leaf");
      // The new leaf's bitmap is read only if the cut was made (cur not
      // full); before the copy it may hold anything (a reused block).
      const uint64_t cb = *Bm(L(sl.cur));
      if ((cb & ~lay_.full) || ((cb & lay_.full) != lay_.full && (*Bm(L(sl.nw)) & ~lay_.full)))
        return Bad(sn + ": bitmap has bits beyond the leaf size");
    }
    const DeleteLog& dl = r->del[i];
    if (dl.cur) {
      PMINDEX_RETURN_IF_ERROR(LeafWord("delete log " + Num(i) + " cur", dl.cur));
      if (dl.prev) PMINDEX_RETURN_IF_ERROR(LeafWord("delete log " + Num(i) + " prev", dl.prev));
    }
  }
  return Status::OK();
}

// ---- recovery (alg. 9) -------------------------------------------------------------------
template <bool kConc, bool kBytes>
Status FPTree<kConc, kBytes>::Recover() {
  PMINDEX_RETURN_IF_ERROR(MapLeafVersions());
  auto t0 = std::chrono::steady_clock::now();
  Root* r = root_;
  split_free_.store(~0ull);
  del_free_.store(~0ull);
  // Everything the log passes below dereference, before they store.
  PMINDEX_RETURN_IF_ERROR(CheckLogs());
  PMINDEX_RETURN_IF_ERROR(CheckMergeLog());
  PMINDEX_RETURN_IF_ERROR(CheckMoveLog());
  // Retired key/value blocks first: a slot may hand its block back to a
  // leaf word that the per-leaf pass below then frees (fptree_retire.cc).
  PMINDEX_RETURN_IF_ERROR(RecoverRetired());
  // Leaf groups: rebuild the DRAM map first (logs may need it).
  if (groups_) {
    PMINDEX_RETURN_IF_ERROR(CheckGroups());
    RecoverGetLog();
    FinishFreeGroup();  // alg. 13 (no-op if the log is clear)
    group_used_.clear();
    free_leaves_.clear();
    for (uint64_t g = r->groups_head; g; g = *reinterpret_cast<uint64_t*>(L(g))) group_used_[g] = 0;
  }
  // Split logs (alg. 4).
  for (int i = 0; i < kLogs; i++) {
    SplitLog* lg = &r->split[i];
    if (lg->cur == 0) {
      // nw is reset before cur (same line), so nw != 0 here only if the log
      // was never written properly (fault injection): reset, never free a
      // block that may already be linked.
      if (lg->nw) ResetSplitLog(lg);
      continue;
    }
    if (lg->nw == 0) {
      ResetSplitLog(lg);
      continue;
    }
    char* l = L(lg->cur);
    uint64_t upper = 0;
    if ((*Bm(l) & lay_.full) == lay_.full) {
      Rec sep;
      if (!ChooseSplit(l, &upper, &sep)) return Status::Corrupt("split recovery: unreadable key");
      SplitCopy(l, L(lg->nw), upper);
    } else {
      upper = *Bm(L(lg->nw));
    }
    SplitFinish(l, lg->nw, upper);
    ResetSplitLog(lg);
  }
  // Delete logs (alg. 7): every unlink first, then the frees.
  for (int i = 0; i < kLogs; i++) {
    DeleteLog* lg = &r->del[i];
    if (!lg->cur) continue;
    RedoUnlink(lg->prev, lg->cur);
  }
  RecoverMergeLog();  // fptree_compact.cc
  RecoverMoveLog();   // fptree_relocate.cc
  // Collect the leaf list.
  std::vector<uint64_t> leaves;
  PMINDEX_RETURN_IF_ERROR(CollectLeaves(&leaves));
  if (groups_) {
    for (uint64_t x : leaves) {
      auto it = GroupOfChecked(x);
      if (it == group_used_.end()) return Bad("listed leaf " + Num(x) + " is not a leaf of a listed group");
      it->second++;
    }
  }
  for (int i = 0; i < kLogs; i++) {
    DeleteLog* lg = &r->del[i];
    if (!lg->cur && !lg->prev) continue;
    if (groups_ && lg->cur) {
      pm::Store(&lg->cur, uint64_t(0));
    } else if (lg->cur) {
      PMINDEX_RETURN_IF_ERROR(pool_->allocator().Free(&lg->cur));
    }
    pm::Store(&lg->prev, uint64_t(0));
    pm::Persist(lg, 16);
  }
  // Per leaf (parallel): unlock the version word, leak checks (alg. 17 for keys
  // and values), min key, emptiness.
  size_t nl = leaves.size();
  std::vector<Rec> minkey(nl);
  std::vector<uint8_t> empty(nl, 0);
  std::vector<std::vector<std::pair<uint64_t*, bool>>> fixes(nl);  // (word, free?)
  // The per-leaf pass checks what it reads (range checks only, no extra
  // PM reads): the first problem found, by any thread, fails the open.
  std::mutex bad_mu;
  std::string bad;
  const uint64_t psize = pool_->size();
  auto fail = [&](size_t j, int i, const char* what) {
    std::lock_guard<std::mutex> g(bad_mu);
    if (bad.empty()) bad = "leaf at " + Num(leaves[j]) + (i >= 0 ? " slot " + Num(uint64_t(i)) : std::string()) + ": " + what;
  };
  // A block word recovery may free or a reader may follow: an 8-aligned
  // block header inside the pool (ReadBlock bounds the length at reads).
  auto block_ok = [psize](uint64_t w) { return w % 8 == 0 && psize >= 8 && w <= psize - 8; };
  auto work = [&](size_t from, size_t to) {
    for (size_t j = from; j < to; j++) {
      char* l = L(leaves[j]);
      // The table is zero at open, but a split redone above (SplitCopy)
      // left its new leaf's word "born locked": clear the lock bits (the
      // word keeps growing).
      if constexpr (kConc) Ver(l)->ClearLockBits();
      uint64_t bm = *Bm(l);
      if (bm & ~lay_.full) {
        fail(j, -1, "bitmap has bits beyond the leaf size");
        return;
      }
      empty[j] = bm == 0;
      bool first = true;
      for (uint64_t m = bm; m; m &= m - 1) {
        int i = __builtin_ctzll(m);
        Rec rr;
        if (!ReadSlotKey(l, i, &rr) || (kBytes && rr.ks.empty())) {
          fail(j, i, "key block offset or length out of range");
          return;
        }
        if (vbytes_ && (!*Val(l, i) || !block_ok(*Val(l, i)))) {
          fail(j, i, "value block offset out of range");
          return;
        }
        if (first || CmpRec(rr, minkey[j]) < 0) minkey[j] = std::move(rr);
        first = false;
      }
      if (!pointers_) continue;
      for (uint32_t i = 0; i < lay_.m; i++) {
        if (bm >> i & 1) continue;
        if ((kBytes && !block_ok(*Key(l, i))) || (vbytes_ && !block_ok(*Val(l, i)))) {
          fail(j, int(i), "block pointer of a free slot out of range");
          return;
        }
        if (kBytes && *Key(l, i)) {
          bool shared = false;
          for (uint64_t m = bm; m; m &= m - 1)
            if (*Key(l, __builtin_ctzll(m)) == *Key(l, i)) shared = true;
          fixes[j].push_back({Key(l, i), !shared});
        }
        if (vbytes_ && *Val(l, i)) {
          bool shared = false;
          for (uint64_t m = bm; m; m &= m - 1)
            if (*Val(l, __builtin_ctzll(m)) == *Val(l, i)) shared = true;
          fixes[j].push_back({Val(l, i), !shared});
        }
      }
    }
  };
  int threads = opts_.recovery_threads > 0 ? opts_.recovery_threads : int(std::thread::hardware_concurrency());
  threads = std::max(1, std::min(threads, 16));
  if (nl < 4096) threads = 1;
  if (threads == 1) {
    work(0, nl);
  } else {
    std::vector<std::thread> ts;
    size_t per = (nl + threads - 1) / threads;
    for (int t = 0; t < threads; t++) {
      size_t a = std::min(nl, t * per), b = std::min(nl, (t + 1) * per);
      if (a < b) ts.emplace_back(work, a, b);
    }
    for (auto& t : ts) t.join();
  }
  if (!bad.empty()) return Bad(bad);
  for (auto& fl : fixes)
    for (auto& [w, fr] : fl) {
      if (fr) PMINDEX_RETURN_IF_ERROR(pool_->allocator().Free(w));
      else pm::StorePersist(w, uint64_t(0));
    }
  if (pointers_) pm::Fence();
  // Drop empty leaves (keep at least one): deletions left for later or
  // interrupted ones.
  std::vector<uint64_t> keep;
  std::vector<Rec> keepmin;
  size_t nonempty = 0;
  for (size_t j = 0; j < nl; j++) nonempty += !empty[j];
  for (size_t j = 0; j < nl; j++) {
    bool drop = empty[j] && !(nonempty == 0 && keep.empty());
    if (!drop) {
      keep.push_back(leaves[j]);
      keepmin.push_back(std::move(minkey[j]));
      continue;
    }
    uint64_t prev = keep.empty() ? 0 : keep.back();
    DeleteLog* lg = &r->del[0];
    LogUnlink(lg, prev, leaves[j]);
    FinishDeleteLog(lg);
  }
  // Merge sparse neighbours; fptree_single: vacate the sparsest groups.
  CompactLeaves(&keep, &keepmin);
  CompactGroups(&keep);
  // fptree, ptree: after a compaction that left at most half of the listed
  // leaves, copy the survivors to adjacent blocks (fptree_relocate.cc).
  if (!groups_ && nl >= 2 * keep.size()) RelocateLeaves(&keep);
  if (groups_) {
    // Free leaves: group members not in the list.
    std::vector<uint64_t> sorted = keep;
    std::sort(sorted.begin(), sorted.end());
    free_leaves_.clear();
    for (auto& [g, used] : group_used_) {
      for (uint32_t i = 0; i < group_size_; i++) {
        uint64_t leaf = g + 64 + uint64_t(i) * lay_.bytes;
        if (std::binary_search(sorted.begin(), sorted.end(), leaf)) continue;
        char* l = L(leaf);
        if (*Bm(l)) pm::StorePersist(Bm(l), uint64_t(0));
        free_leaves_.push_back(leaf);
      }
    }
  }
  // Rebuild the inner nodes (bulk load, ~75% full).
  BuildInner(keep, keepmin);
  recovery_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return Status::OK();
}

template <bool kConc, bool kBytes>
void FPTree<kConc, kBytes>::BuildInner(const std::vector<uint64_t>& leaves, std::vector<Rec>& mins) {
  uint32_t fill = std::max<uint32_t>(1, inner_cap_ * 3 / 4);
  std::vector<uint64_t> level = leaves;
  std::vector<uint64_t> seps(leaves.size());  // seps[i]: lower bound of child i (i>0)
  for (size_t i = 1; i < leaves.size(); i++) {
    seps[i] = KeyWordForInner(RecKey(mins[i]));
  }
  bool bottom = true;
  for (;;) {
    std::vector<uint64_t> up, upseps;
    size_t i = 0;
    while (i < level.size()) {
      Inner* n = NewInner(bottom);
      size_t take = std::min<size_t>(fill + 1, level.size() - i);
      // Avoid a last node with a single child when it can be balanced.
      if (level.size() - i - take == 1 && take > 2) take--;
      n->child()[0].store(level[i], std::memory_order_release);
      for (size_t j = 1; j < take; j++) {
        n->keys()[j - 1].store(seps[i + j], std::memory_order_relaxed);
        n->child()[j].store(level[i + j], std::memory_order_release);
      }
      n->count.store(uint32_t(take - 1), std::memory_order_relaxed);
      up.push_back(reinterpret_cast<uint64_t>(n));
      upseps.push_back(seps[i]);
      i += take;
    }
    bottom = false;
    if (up.size() == 1) {
      root_inner_.store(reinterpret_cast<Inner*>(up[0]), std::memory_order_release);
      return;
    }
    level = std::move(up);
    seps = std::move(upseps);
  }
}

#define FPT_INSTANTIATE(C, B)                                                                           \
  template Status FPTree<C, B>::Format(uint8_t, const Options&, uint32_t, uint32_t, uint32_t, bool);   \
  template Status FPTree<C, B>::Open();                                                                 \
  template void FPTree<C, B>::LoadConfig();                                                             \
  template Status FPTree<C, B>::MapLeafVersions();                                                      \
  template Status FPTree<C, B>::LeafWord(const std::string&, uint64_t) const;                           \
  template Status FPTree<C, B>::CollectLeaves(std::vector<uint64_t>*) const;                            \
  template Status FPTree<C, B>::CheckLogs() const;                                                      \
  template Status FPTree<C, B>::Recover();                                                              \
  template void FPTree<C, B>::BuildInner(const std::vector<uint64_t>&, std::vector<Rec>&);
FPT_INSTANTIATE_ALL(FPT_INSTANTIATE)
#undef FPT_INSTANTIATE

}  // namespace pmindex::internal::fptree
