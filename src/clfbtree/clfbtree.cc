// clfbtree.cc: the clfB-tree as an Index (docs/clfbtree.md): its parameters
// (leaf = encoded | append, leaf_size = 64..2048 bytes of an append leaf,
// parent = atomic | inplace | shadow, emulate_line_atomic = 0 | 1, tally =
// 0 | 1 for the figures), the factory that creates or opens a pool (checking
// Meta: magic, format version, kinds, leaf geometry and method), Stats and
// Close, and the registration under "clfbtree".
//
// Method atomic needs a failure-atomic 64-byte write (MOVDIR64B). Without
// it, only emulate_line_atomic=1 selects it: a locked 64-byte copy that the
// crash simulator treats as one atomic line write, unsafe on real power
// failure, recorded in Meta, and never the default. A pool written with
// method atomic is refused on a CPU without MOVDIR64B unless the open says
// emulate_line_atomic=1. The default is atomic where MOVDIR64B exists, else
// inplace, with 1 KiB append leaves (docs/clfbtree.md, "Choosing the
// default method").
//
// Thread safety: Create and Open once per pool; Close only when no other
// call runs; Stats at any time.
#include <chrono>

#include "clfbtree/clfbtree_tree.h"
#include "kit/root_check.h"
#include "pmindex/pm/fault.h"

namespace pmindex::internal::clfbtree {

ClfBTree::ClfBTree(std::unique_ptr<pm::Pool> pool, const Options& o, const Config& c)
    : c_(c),
      pool_(std::move(pool)),
      base_(pool_->base()),
      alloc_(&pool_->allocator()),
      max_key_(std::max<size_t>(o.max_key_size, 8)),
      max_value_(std::max<size_t>(o.max_value_size, 8)),
      fast_writes_(c.leaf == kAppendLeaf && c.kk == KeyKind::kU64 && c.vk == ValueKind::kU64) {
  if (c_.leaf == kAppendLeaf) {
    cap_ = AppendCap(c_.leaf_size);
    bm_words_ = AppendBitmapWords(c_.leaf_size);
  }
  meta_ = pool_->root<Meta>();
}

IndexStats ClfBTree::Stats() {
  IndexStats s;
  if (closed()) return s;
  s.records = Size();
  s.pm_bytes = alloc_->BytesInUse();
  // The DRAM tables' pages over the pool's used part of its reservation.
  const char* hi = base_ + pool_->size();
  s.dram_bytes = sizeof(*this) + locks_.ResidentBytes(base_, hi) + sort_cache_.ResidentBytes(base_, hi) +
                 filters_.ResidentBytes(base_, hi);
  {
    EpochManager::Guard g(epoch_);  // the table is freed after a grace period
    if (const RouteTable* t = route_.load(std::memory_order_acquire)) s.dram_bytes += 16 * t->nodes;
  }
  s.recovery_seconds = recovery_seconds_;
  return s;
}

Status ClfBTree::Close() {
  closed_.store(true, std::memory_order_relaxed);
  if (!pool_) return Status::OK();
  Status s = pool_->Close();
  pool_.reset();
  locks_.Unmap();
  sort_cache_.Unmap();
  filters_.Unmap();
  PublishRoute(nullptr);  // no reader runs: freed at once
  FreeRetiredRoutes();
  return s;
}

namespace {

Status ParseParams(const Options& o, Config* c) {
  Params p(o.params);
  PMINDEX_RETURN_IF_ERROR(p.Expect({"leaf", "leaf_size", "parent", "emulate_line_atomic", "tally"}));
  std::string leaf, parent;
  PMINDEX_RETURN_IF_ERROR(p.GetString("leaf", "append", &leaf));
  // The default: the fastest method that is crash-safe on this CPU.
  PMINDEX_RETURN_IF_ERROR(p.GetString("parent", pm::CpuHasMovdir64b() ? "atomic" : "inplace", &parent));
  long long size;
  PMINDEX_RETURN_IF_ERROR(p.GetInt("leaf_size", 1024, 64, 2048, &size));
  PMINDEX_RETURN_IF_ERROR(p.GetBool("emulate_line_atomic", false, &c->emulated));
  PMINDEX_RETURN_IF_ERROR(p.GetBool("tally", false, &c->tally));
  if (size % 64) return Status::InvalidArgument("clfbtree: leaf_size must be a multiple of 64");
  if (leaf == "append")
    c->leaf = kAppendLeaf;
  else if (leaf == "encoded")
    c->leaf = kEncodedLeaf;
  else
    return Status::InvalidArgument("clfbtree: leaf must be encoded or append");
  if (parent == "atomic")
    c->method = kAtomic;
  else if (parent == "inplace")
    c->method = kInPlace;
  else if (parent == "shadow")
    c->method = kShadow;
  else
    return Status::InvalidArgument("clfbtree: parent must be atomic, inplace or shadow");
  c->leaf_size = c->leaf == kEncodedLeaf ? 64 : uint32_t(size);
  c->kk = o.key_kind;
  c->vk = o.value_kind;
  return Status::OK();
}

// Method atomic runs only with MOVDIR64B, or emulated when asked for.
Status CheckMethod(const Config& c) {
  if (c.method != kAtomic) return Status::OK();
  if (pm::CpuHasMovdir64b()) return Status::OK();
  if (!c.emulated)
    return Status::Unsupported(
        "clfbtree: parent=atomic needs MOVDIR64B (a failure-atomic 64-byte write), which this CPU lacks; use "
        "parent=inplace or shadow, or emulate_line_atomic=1 (not safe on power failure)");
  pm::SetAtomicLineWriteEmulation(true);
  return Status::OK();
}

Status Create(std::unique_ptr<pm::Pool> pool, const Options& o, std::unique_ptr<Index>* out) {
  Config c;
  PMINDEX_RETURN_IF_ERROR(ParseParams(o, &c));
  PMINDEX_RETURN_IF_ERROR(CheckMethod(c));
  if (*pool->root_slot() != 0) return Status::InvalidArgument("pool already holds a root object");
  auto t = std::make_unique<ClfBTree>(std::move(pool), o, c);
  PMINDEX_RETURN_IF_ERROR(t->Format());
  *out = std::move(t);
  return Status::OK();
}

Status Open(std::unique_ptr<pm::Pool> pool, const Options& o, std::unique_ptr<Index>* out) {
  const auto t0 = std::chrono::steady_clock::now();
  Config asked;
  PMINDEX_RETURN_IF_ERROR(ParseParams(o, &asked));
  const kit::RootSpec spec{"clfbtree", kMagic, sizeof(Meta), offsetof(Meta, magic), 0};
  const uint64_t mo = *pool->root_slot();
  if (mo && (mo % 64 || mo >= pool->size() || pool->allocator().UsableSize(mo) < sizeof(Meta)))
    return Status::Corrupt("clfbtree root object out of the pool or too small");
  Meta* m = pool->root<Meta>();
  if (!m || m->magic == 0) {
    PMINDEX_RETURN_IF_ERROR(kit::CheckCreationBlocks(pool.get(), spec, 2, "metadata has no magic"));
    if (o.read_only) return Status::Unsupported("clfbtree pool holds an interrupted creation: open it read-write");
    if (m && m->root) {
      pm::StoreAtomic(&m->root, uint64_t(m->root & ~63ull));
      PMINDEX_RETURN_IF_ERROR(pool->allocator().Free(&m->root));
    }
    if (m) PMINDEX_RETURN_IF_ERROR(pool->allocator().Free(pool->root_slot()));
    return Create(std::move(pool), o, out);
  }
  if (m->magic != kMagic) return Status::Corrupt("clfbtree metadata has a bad magic");
  if (m->version != kVersion) return Status::Corrupt("unsupported clfbtree format version " + std::to_string(m->version));
  if (m->key_kind > 1 || m->value_kind > 1 || m->leaf_kind > 1 || m->method > 2)
    return Status::Corrupt("clfbtree metadata has bad kinds");
  if (m->leaf_size < 64 || m->leaf_size > 2048 || m->leaf_size % 64 || (m->leaf_kind == kEncodedLeaf && m->leaf_size != 64))
    return Status::Corrupt("clfbtree metadata has a bad leaf size");
  Config c = asked;
  c.kk = KeyKind(m->key_kind);
  c.vk = ValueKind(m->value_kind);
  c.leaf = LeafKind(m->leaf_kind);
  c.method = Method(m->method);
  c.leaf_size = m->leaf_size;
  if ((o.params.count("leaf") && asked.leaf != c.leaf) || (o.params.count("parent") && asked.method != c.method) ||
      (o.params.count("leaf_size") && c.leaf == kAppendLeaf && asked.leaf_size != c.leaf_size))
    return Status::InvalidArgument("clfbtree pool was created with other leaf/leaf_size/parent parameters");
  if (c.method == kAtomic && !pm::CpuHasMovdir64b() && !asked.emulated)
    return Status::Unsupported(
        "clfbtree pool was written with parent=atomic, which this CPU cannot run safely (no MOVDIR64B); open it with "
        "emulate_line_atomic=1 only for testing");
  PMINDEX_RETURN_IF_ERROR(CheckMethod(c));
  auto t = std::make_unique<ClfBTree>(std::move(pool), o, c);
  PMINDEX_RETURN_IF_ERROR(t->Recover());
  t->recovery_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  *out = std::move(t);
  return Status::OK();
}

}  // namespace

PMINDEX_FAULT_SWITCH_ARRAY(clfbtree, kFaultSwitches);

}  // namespace pmindex::internal::clfbtree

namespace pmindex::internal {

void RegisterClfBTree(std::vector<IndexFactory>* r) {
  AddIndexType(r,
               {"clfbtree", /*persistent=*/true, /*ordered=*/true, /*concurrent=*/true,
                "clfB-tree: 64-byte differentially encoded inner nodes, encoded or append-only leaves, atomic / "
                "in-place (line log) / shadowing parent updates, lock-free readers"},
               &clfbtree::Create, &clfbtree::Open);
}

}  // namespace pmindex::internal
