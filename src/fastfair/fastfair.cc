// fastfair.cc: the FAST & FAIR tree (FAST'18,
// /work/shared/papers/fast-fair-fast18.md) as an Index (docs/fastfair.md):
// its options (node_size, read_committed, merge_below), the factory that creates or opens a
// pool (checking the Meta written by fastfair_recovery.cc: magic, format
// version, kinds, node size), the registration under the name "fastfair",
// Stats/Close/Debug, and the introspection hooks of fastfair.h. After
// Close every call answers IndexClosed() (closed_, checked first by each
// public member; Size 0, Stats empty, pool() nullptr), as
// include/pmindex/index.h requires. The tree
// itself: fastfair_tree.h and the files it lists.
//
// A pool whose Meta has no magic is what a creation that crashed leaves
// (CheckCrashedCreation tells it from a damaged tree): Open creates the index
// in it again.
//
// Format version: kVersion (fastfair_format.h) is created; versions
// kOldestOpened..kVersion are opened (a read-write open of version 4
// raises it to 5: Recover); a pool of an earlier version (1-3) is refused
// with Unsupported ("unsupported fastfair format version N ..."), any
// other number with Corrupt.
//
// Thread safety: Create and Open are called once per pool; Close and the
// test hooks only when no operation runs; Stats and Debug at any time
// (a count taken while writers run is approximate).
#include "fastfair/fastfair_tree.h"
#include "kit/root_check.h"
#include "pmindex/pm/fault.h"

namespace pmindex::internal::fastfair {

template <bool BK>
IndexStats FastFair<BK>::Stats() {
  IndexStats s;
  if (closed_) return s;
  s.records = Size();
  s.pm_bytes = alloc_->BytesInUse();
  // The lock table's resident pages over the pool's used size only.
  s.dram_bytes = sizeof(*this) + locks_.ResidentBytes(base_, base_ + pool_->size()) +
                 (limbo_ ? limbo_->dram_bytes() : 0) + (blocks_ ? blocks_->dram_bytes() : 0);
  s.recovery_seconds = recovery_seconds_;
  return s;
}

template <bool BK>
Status FastFair<BK>::Close() {
  closed_ = true;
  if (pool_) {
    if (limbo_ && limbo_->has_retired()) Reclaim(true);  // nobody is in the tree any more
    if (blocks_ && blocks_->has_retired()) ReclaimBlocks(true);
    Status s = pool_->Close();
    pool_.reset();
    return s;
  }
  return Status::OK();
}

template <bool BK>
DebugCounters FastFair<BK>::Debug() {
  DebugCounters d;
  d.open_blocks_freed = open_blocks_freed_;
  d.open_pm_stores = open_pm_stores_;
  d.open_pm_lines = open_pm_lines_;
  d.nodes_repaired = nodes_repaired_.load();
  d.splits_finished_by_repair = splits_repaired_.load();
  d.counts_repaired = counts_repaired_.load();
  d.parent_links_repaired = parents_repaired_.load();
  d.root_grows = root_grows_.load();
  d.merges = merges_.load();
  d.root_collapses = root_collapses_.load();
  d.nodes_freed = nodes_freed_.load();
  d.merges_skipped = merges_skipped_.load();
  d.rebalances = rebalances_.load();
  d.rebalances_from_right = rebalances_from_right_.load();
  d.left_inserts = left_inserts_.load();
  d.prefix_drops = prefix_drops_.load();
  d.prefix_splits = prefix_splits_.load();
  d.read_flushes = read_flushes_.load();
  d.lf_lock_fallbacks = lf_lock_fallbacks_.load();
  d.reclaims = reclaims_.load();
  return d;
}

template IndexStats FastFair<false>::Stats();
template IndexStats FastFair<true>::Stats();
template Status FastFair<false>::Close();
template Status FastFair<true>::Close();
template DebugCounters FastFair<false>::Debug();
template DebugCounters FastFair<true>::Debug();

namespace {

FastFairBase* Tree(Index* index) { return dynamic_cast<FastFairBase*>(index); }

// merge_below (0: the default, cap / kMergeBelowDiv) only lowers the
// underfull threshold: merge_below=1 merges only emptied nodes (pmcheck's
// empty-leaf merge line, docs/pmcheck.md). Not persisted.
Status ParseParams(const Options& o, uint32_t* node_size, bool* rc, uint32_t* merge_below) {
  Params p(o.params);
  PMINDEX_RETURN_IF_ERROR(p.Expect({"node_size", "read_committed", "merge_below"}));
  long long ns;
  PMINDEX_RETURN_IF_ERROR(p.GetInt("node_size", 512, 256, 8192, &ns));
  if (ns % 64) return Status::InvalidArgument("fastfair node_size must be a multiple of 64, got " + std::to_string(ns));
  *node_size = uint32_t(ns);
  long long mb;
  PMINDEX_RETURN_IF_ERROR(p.GetInt("merge_below", 0, 0, 8192, &mb));
  *merge_below = uint32_t(mb);
  return p.GetBool("read_committed", false, rc);
}

std::unique_ptr<FastFairBase> Make(std::unique_ptr<pm::Pool> pool, const Options& o, KeyKind kk, ValueKind vk,
                                   uint32_t ns, bool rc, uint32_t mb) {
  if (kk == KeyKind::kBytes) return std::make_unique<FastFair<true>>(std::move(pool), o, ns, vk, rc, mb);
  return std::make_unique<FastFair<false>>(std::move(pool), o, ns, vk, rc, mb);
}

Status Create(std::unique_ptr<pm::Pool> pool, const Options& o, std::unique_ptr<Index>* out) {
  uint32_t ns, mb;
  bool rc;
  PMINDEX_RETURN_IF_ERROR(ParseParams(o, &ns, &rc, &mb));
  if (*pool->root_slot() != 0) return Status::InvalidArgument("pool already holds a root object");
  auto t = Make(std::move(pool), o, o.key_kind, o.value_kind, ns, rc, mb);
  Status s = t->Format();
  if (!s.ok()) return s;
  *out = std::move(t);
  return Status::OK();
}

// A pool whose Meta has no magic: OK if it is what a creation that crashed
// leaves (Format's order: Meta allocated zeroed, the root leaf allocated
// zeroed, the leaf's lk words, Meta's configuration words, the magic last),
// Corrupt if it can be an initialised tree whose magic was damaged: a retire
// list or spare root in use, more blocks than Meta and one node, or a root
// node holding anything Format does not store (records, a sibling, a level).
Status CheckCrashedCreation(pm::Pool* pool) {
  const kit::RootSpec spec{"fastfair", kMagic, sizeof(Meta), offsetof(Meta, magic), 0};
  pm::Allocator& a = pool->allocator();
  const uint64_t mo = *pool->root_slot();
  if (mo == 0) return kit::CheckCreationBlocks(pool, spec, 0, "pool has no root object");
  const Meta* m = pool->root<Meta>();
  if (m->limbo || m->blocks || m->spare_root)
    return Status::Corrupt("fastfair metadata has no magic but a retire list or spare root");
  if (m->root == 0) return kit::CheckCreationBlocks(pool, spec, 1, "metadata has no magic");
  if (m->root % 64 || m->root >= pool->size() || a.UsableSize(m->root) < sizeof(Node) ||
      m->root > pool->size() - a.UsableSize(m->root))
    return Status::Corrupt("fastfair metadata has no magic and a root pointer out of the pool");
  PMINDEX_RETURN_IF_ERROR(kit::CheckCreationBlocks(pool, spec, 2, "metadata has no magic"));
  const uint64_t* w = reinterpret_cast<const uint64_t*>(pool->base() + m->root);
  const size_t lk = offsetof(Node, lk) / 8, e0 = sizeof(Node) / 8, e1 = e0 + sizeof(Entry) / 8;
  for (size_t i = 0; i < a.UsableSize(m->root) / 8; i++)
    if (w[i] != 0 && !((i == lk || i == e0 || i == e1) && w[i] == kBytesLk))
      return Status::Corrupt("fastfair metadata has no magic but the root node is not empty (word " + std::to_string(i) + ")");
  return Status::OK();
}

Status Open(std::unique_ptr<pm::Pool> pool, const Options& o, std::unique_ptr<Index>* out) {
  const auto t0 = std::chrono::steady_clock::now();
  uint32_t ns_param, mb;
  bool rc;
  PMINDEX_RETURN_IF_ERROR(ParseParams(o, &ns_param, &rc, &mb));
  if (*pool->root_slot() && pool->allocator().UsableSize(*pool->root_slot()) < sizeof(Meta))
    return Status::Corrupt("fastfair root object too small");
  Meta* m = pool->root<Meta>();
  if (!m || m->magic == 0) {
    // A creation that crashed acknowledged nothing: create the index again
    // with this open's options (freeing the node first, then Meta; a crash
    // in between leaves a crashed creation again).
    PMINDEX_RETURN_IF_ERROR(CheckCrashedCreation(pool.get()));
    if (o.read_only) return Status::Unsupported("fastfair pool holds an interrupted creation: open it read-write to create the index");
    if (m && m->root) PMINDEX_RETURN_IF_ERROR(pool->allocator().Free(&m->root));
    if (m) PMINDEX_RETURN_IF_ERROR(pool->allocator().Free(pool->root_slot()));
    return Create(std::move(pool), o, out);
  }
  if (m->magic != kMagic) return Status::Corrupt("fastfair metadata has a bad magic");
  if (m->version < kOldestOpened || m->version > kVersion) {
    // Versions 1-3 were written by earlier builds (docs/fastfair.md,
    // "Format version"): refused, not repaired. Any other number is no
    // fastfair format at all.
    const std::string msg = "unsupported fastfair format version " + std::to_string(m->version) +
                            " (this build opens versions " + std::to_string(kOldestOpened) + " to " +
                            std::to_string(kVersion) + ")";
    return m->version >= 1 && m->version < kOldestOpened ? Status::Unsupported(msg) : Status::Corrupt(msg);
  }
  if (m->version < kVersion && m->blocks) return Status::Corrupt("fastfair version 4 metadata with a block retire list");
  if (m->key_kind > 1 || m->value_kind > 1) return Status::Corrupt("fastfair metadata has bad key/value kinds");
  if (m->node_size < 256 || m->node_size > 8192 || m->node_size % 64) return Status::Corrupt("fastfair metadata has a bad node size");
  if (o.params.count("node_size") && ns_param != m->node_size)
    return Status::InvalidArgument("pool was created with node_size=" + std::to_string(m->node_size));
  if (!m->root || m->root >= pool->size()) return Status::Corrupt("fastfair root pointer out of the pool");
  const KeyKind kk = KeyKind(m->key_kind);
  auto t = Make(std::move(pool), o, kk, ValueKind(m->value_kind), m->node_size, rc, mb);
  Status s = t->Recover(m);
  if (!s.ok()) return s;
  t->recovery_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  *out = std::move(t);
  return Status::OK();
}

}  // namespace

const DebugCounters* GetDebugCounters(Index* index) {
  auto* t = Tree(index);
  if (!t) return nullptr;
  t->snapshot_ = t->Debug();
  return &t->snapshot_;
}
int NodeCapacity(Index* index) {
  auto* t = Tree(index);
  return t ? t->Cap() : 0;
}
int Height(Index* index) {
  auto* t = Tree(index);
  return t ? t->TreeHeight() : 0;
}
void SetTestHooks(Index* index, const TestHooks* hooks) {
  if (auto* t = Tree(index)) t->SetHooks(hooks);
}

}  // namespace pmindex::internal::fastfair

namespace pmindex::internal {

void RegisterFastFair(std::vector<IndexFactory>* r) {
  IndexFactory f;
  f.info = {"fastfair", /*persistent=*/true, /*ordered=*/true, /*concurrent=*/true,
            "FAST & FAIR: whole B+-tree in PM, logless in-node shifts and splits, lock-free search, lazy recovery"};
  f.create = &fastfair::Create;
  f.open = &fastfair::Open;
  r->push_back(f);
}

}  // namespace pmindex::internal

// The fault switches of this folder (pmindex/pm/fault.h; docs/CONTRIBUTING.md).
PMINDEX_FAULT_SWITCHES(fastfair,
                       "fastfair.create.skip_meta_flush",
                       "fastfair.insert.skip_shift_flush",
                       "fastfair.merge.free_before_unlink",
                       "fastfair.remove.skip_flush",
                       "fastfair.retire.own_after_commit",
                       "fastfair.retire.unlinked_before_commit",
                       "fastfair.split.link_before_persist");
