// wbtree.cc: wBTree as an Index (docs/wbtree.md): its parameters
// (leaf_size, inner_size: entries per node, at most 63; 7 for the
// slot-only variant), the factory that creates or opens a pool (checking
// Meta: magic, format version, variant, kinds, capacities), Stats and
// Close, and the registration under "wbtree" and "wbtree_slot".
// The tree itself: wbtree_tree.h and the files it lists.
//
// A pool whose Meta has no magic is what a creation that crashed leaves
// (kit/root_check.h tells it from damage by the number of blocks): Open
// creates the index in it again.
//
// Thread safety: Create and Open once per pool; Close only when no other
// call runs; Stats at any time.
#include <chrono>

#include "kit/root_check.h"
#include "wbtree/wbtree_tree.h"
#include "pmindex/pm/fault.h"

namespace pmindex::internal::wbtree {

template <bool BK>
WBTree<BK>::WBTree(std::unique_ptr<pm::Pool> pool, const Options& o, std::string name, ValueKind vk, uint32_t leaf_cap,
                   uint32_t inner_cap, bool slot_only)
    : name_(std::move(name)),
      pool_(std::move(pool)),
      base_(pool_->base()),
      alloc_(&pool_->allocator()),
      vk_(vk),
      leaf_cap_(leaf_cap),
      inner_cap_(inner_cap),
      min_cap_(std::min(leaf_cap, inner_cap)),
      slot_only_(slot_only),
      max_key_(std::max<size_t>(o.max_key_size, 8)),
      max_value_(std::max<size_t>(o.max_value_size, 8)) {}

template <bool BK>
IndexStats WBTree<BK>::Stats() {
  IndexStats s;
  if (closed()) return s;
  s.records = Size();
  s.pm_bytes = alloc_->BytesInUse();
  // The lock table's resident pages over the pool's used size only.
  s.dram_bytes = sizeof(*this) + locks_.ResidentBytes(base_, base_ + pool_->size());
  s.recovery_seconds = recovery_seconds_;
  return s;
}

template <bool BK>
Status WBTree<BK>::Close() {
  closed_.store(true, std::memory_order_relaxed);
  if (!pool_) return Status::OK();
  Status s = pool_->Close();
  pool_.reset();
  locks_.Unmap();
  return s;
}

template class WBTree<false>;
template class WBTree<true>;

namespace {

// The two variants: wbtree (bitmap + slot array, up to 63 entries) and
// wbtree_slot (slot word only, up to 7 entries).
struct Variant {
  const char* name;
  bool slot_only;
  uint32_t max_cap, leaf_default, inner_default;
};
constexpr Variant kBitmap{"wbtree", false, kMaxCap, 63, 32};
constexpr Variant kSlot{"wbtree_slot", true, kMaxSlotOnlyCap, kMaxSlotOnlyCap, kMaxSlotOnlyCap};

Status ParseParams(const Variant& var, const Options& o, uint32_t* leaf, uint32_t* inner) {
  Params p(o.params);
  PMINDEX_RETURN_IF_ERROR(p.Expect({"leaf_size", "inner_size"}));
  long long l, i;
  PMINDEX_RETURN_IF_ERROR(p.GetInt("leaf_size", var.leaf_default, 2, var.max_cap, &l));
  PMINDEX_RETURN_IF_ERROR(p.GetInt("inner_size", var.inner_default, 3, var.max_cap, &i));
  *leaf = uint32_t(l);
  *inner = uint32_t(i);
  return Status::OK();
}

std::unique_ptr<WBTreeBase> Make(const Variant& var, std::unique_ptr<pm::Pool> pool, const Options& o, KeyKind kk,
                                 ValueKind vk, uint32_t leaf, uint32_t inner) {
  if (kk == KeyKind::kBytes)
    return std::make_unique<WBTree<true>>(std::move(pool), o, var.name, vk, leaf, inner, var.slot_only);
  return std::make_unique<WBTree<false>>(std::move(pool), o, var.name, vk, leaf, inner, var.slot_only);
}

Status CreateVariant(const Variant& var, std::unique_ptr<pm::Pool> pool, const Options& o, std::unique_ptr<Index>* out) {
  uint32_t leaf, inner;
  PMINDEX_RETURN_IF_ERROR(ParseParams(var, o, &leaf, &inner));
  if (*pool->root_slot() != 0) return Status::InvalidArgument("pool already holds a root object");
  auto t = Make(var, std::move(pool), o, o.key_kind, o.value_kind, leaf, inner);
  PMINDEX_RETURN_IF_ERROR(t->Format());
  *out = std::move(t);
  return Status::OK();
}

Status OpenVariant(const Variant& var, std::unique_ptr<pm::Pool> pool, const Options& o, std::unique_ptr<Index>* out) {
  const auto t0 = std::chrono::steady_clock::now();
  uint32_t leaf, inner;
  PMINDEX_RETURN_IF_ERROR(ParseParams(var, o, &leaf, &inner));
  const kit::RootSpec spec{var.name, kMagic, sizeof(Meta), offsetof(Meta, magic), 0};
  const uint64_t mo = *pool->root_slot();
  if (mo && (mo % 64 || mo >= pool->size() || pool->allocator().UsableSize(mo) < sizeof(Meta)))
    return Status::Corrupt("wbtree root object out of the pool or too small");
  Meta* m = pool->root<Meta>();
  if (!m || m->magic == 0) {
    // A creation that crashed acknowledged nothing: create it again.
    PMINDEX_RETURN_IF_ERROR(kit::CheckCreationBlocks(pool.get(), spec, 2, "metadata has no magic"));
    if (o.read_only) return Status::Unsupported("wbtree pool holds an interrupted creation: open it read-write");
    if (m && m->root) PMINDEX_RETURN_IF_ERROR(pool->allocator().Free(&m->root));
    if (m) PMINDEX_RETURN_IF_ERROR(pool->allocator().Free(pool->root_slot()));
    return CreateVariant(var, std::move(pool), o, out);
  }
  if (m->magic != kMagic) return Status::Corrupt("wbtree metadata has a bad magic");
  if (m->version != kVersion)
    return Status::Corrupt("unsupported wbtree format version " + std::to_string(m->version));
  if (m->key_kind > 1 || m->value_kind > 1) return Status::Corrupt("wbtree metadata has bad key/value kinds");
  if (m->variant != (var.slot_only ? 1 : 0)) return Status::Corrupt("wbtree metadata names the other variant");
  if (m->leaf_cap < 2 || m->leaf_cap > var.max_cap || m->inner_cap < 3 || m->inner_cap > var.max_cap)
    return Status::Corrupt("wbtree metadata has bad node capacities");
  if ((o.params.count("leaf_size") && leaf != m->leaf_cap) || (o.params.count("inner_size") && inner != m->inner_cap))
    return Status::InvalidArgument("pool was created with leaf_size=" + std::to_string(m->leaf_cap) +
                                   " inner_size=" + std::to_string(m->inner_cap));
  auto t = Make(var, std::move(pool), o, KeyKind(m->key_kind), ValueKind(m->value_kind), m->leaf_cap, m->inner_cap);
  PMINDEX_RETURN_IF_ERROR(t->Recover());
  t->recovery_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  *out = std::move(t);
  return Status::OK();
}

// The maker of variant V (core/index_util.h's IndexMaker).
template <const Variant& V>
Status MakeVariant(std::unique_ptr<pm::Pool> pool, const Options& o, std::unique_ptr<Index>* out, bool fresh) {
  return fresh ? CreateVariant(V, std::move(pool), o, out) : OpenVariant(V, std::move(pool), o, out);
}

}  // namespace

}  // namespace pmindex::internal::wbtree

namespace pmindex::internal {

void RegisterWBTree(std::vector<IndexFactory>* r) {
  AddIndexType<&wbtree::MakeVariant<wbtree::kBitmap>>(
      r, {"wbtree", /*persistent=*/true, /*ordered=*/true, /*concurrent=*/true,
          "wBTree: whole B+-tree in PM, unsorted nodes with a bitmap and a sorted slot array, micro-log splits, "
          "lock-free readers, constant-time open"});
  AddIndexType<&wbtree::MakeVariant<wbtree::kSlot>>(
      r, {"wbtree_slot", /*persistent=*/true, /*ordered=*/true, /*concurrent=*/true,
          "wBTree, slot-only variant: nodes of at most 7 entries whose slot word (count and indices) is the "
          "commit word, no bitmap"});
}

}  // namespace pmindex::internal

// The fault switches of this folder (pmindex/pm/fault.h; docs/CONTRIBUTING.md).
PMINDEX_FAULT_SWITCHES(wbtree,
                       "wbtree.free.skip_unlink_flush",
                       "wbtree.insert.skip_entry_flush",
                       "wbtree.insert.skip_slots_flush",
                       "wbtree.remove.skip_flush",
                       "wbtree.split.link_before_persist",
                       "wbtree.update.skip_flush");
