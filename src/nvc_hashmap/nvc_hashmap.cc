// nvc_hashmap.cc: the NVC-Hashmap's Index adapter: options, Create and
// Open, registration, and the test hooks of nvc_hashmap.h.
//
// Paper: Schwalb et al., IMDM'15 (the index as a whole; nvc_map.h maps its
// sections to files). Design: docs/nvc_hashmap.md.
//
// Persist order: Create formats the root (nvc_recovery.cc, InitNew) and then
// clears root.clean; Open recovers if the last close was not clean, then
// clears root.clean (persisted), so a crash from here on is seen as one.
//
// Thread safety: Create and Open are single-threaded; the hook setters may
// be called at any time (atomics).
#include "nvc_hashmap/nvc_hashmap.h"

#include <string>
#include <vector>

#include "core/index_util.h"
#include "nvc_hashmap/nvc_map.h"
#include "pmindex/pm/fault.h"

namespace pmindex {
namespace nvc_hashmap_testing {
using internal::nvc::g_batch_slot_fail_hook;
using internal::nvc::g_before_link_hook;
using internal::nvc::g_before_value_hook;
using internal::nvc::g_find_hook;
using internal::nvc::g_link_hook;
using internal::nvc::g_mark_hook;
using internal::nvc::g_value_hook;
void SetAfterLinkHook(LinkHook hook) { g_link_hook.store(hook, std::memory_order_release); }
void SetBeforeLinkHook(LinkHook hook) { g_before_link_hook.store(hook, std::memory_order_release); }
void SetAfterValueStoreHook(LinkHook hook) { g_value_hook.store(hook, std::memory_order_release); }
void SetBeforeValueStoreHook(LinkHook hook) { g_before_value_hook.store(hook, std::memory_order_release); }
void SetAfterMarkHook(LinkHook hook) { g_mark_hook.store(hook, std::memory_order_release); }
void SetFindHook(LinkHook hook) { g_find_hook.store(hook, std::memory_order_release); }
void SetInitBatchSlotFailHook(BucketFailHook hook) { g_batch_slot_fail_hook.store(hook, std::memory_order_release); }
int RecoveryWalkers(Index* idx) { return static_cast<internal::nvc::NvcHashmap*>(idx)->RecoveryWalkersForTest(); }
bool RecoveryScanned(Index* idx) { return static_cast<internal::nvc::NvcHashmap*>(idx)->RecoveryScannedForTest(); }
void SetForceWalkRecovery(bool on) { internal::nvc::g_force_walk.store(on, std::memory_order_release); }
void SetCreateFormatVersion(uint32_t version) { internal::nvc::g_create_version.store(version, std::memory_order_release); }
uint64_t SlabRefillRetries() { return internal::nvc::g_slab_refill_retries.load(std::memory_order_relaxed); }

uint64_t SplitOrderKey(KeyKind kind, Slice key) { return internal::nvc::SoRegular(internal::nvc::HashKey(kind, key)); }
int MaxThreadSlots() { return internal::nvc::kRootSlots; }
uint64_t BucketCount(Index* idx) { return static_cast<internal::nvc::NvcHashmap*>(idx)->BucketCountForTest(); }
}  // namespace nvc_hashmap_testing

namespace internal {
namespace nvc {

namespace {

struct Config {
  Fix fix = Fix::kDirtyBit;
  long long initial_buckets = 1024;
  long long load_factor = 2;
  bool slab = true;
  long long max_threads = kRootSlots;
};

Status ParseConfig(const Options& o, Config* cfg) {
  Params p(o.params);
  PMINDEX_RETURN_IF_ERROR(p.Expect({"erratum_fix", "initial_buckets", "load_factor", "max_threads", "node_alloc"}));
  std::string na;
  PMINDEX_RETURN_IF_ERROR(p.GetString("node_alloc", "slab", &na));
  cfg->slab = na == "slab";
  if (na != "slab" && na != "allocator") return Status::InvalidArgument("parameter node_alloc=" + na + " is not one of slab, allocator");
  std::string fix;
  PMINDEX_RETURN_IF_ERROR(p.GetString("erratum_fix", "dirty_bit", &fix));
  if (fix == "dirty_bit") cfg->fix = Fix::kDirtyBit;
  else if (fix == "flush_on_read") cfg->fix = Fix::kFlushOnRead;
  else if (fix == "none") cfg->fix = Fix::kNone;
  else return Status::InvalidArgument("parameter erratum_fix=" + fix + " is not one of dirty_bit, flush_on_read, none");
  PMINDEX_RETURN_IF_ERROR(p.GetInt("initial_buckets", 1024, 1, 1 << 24, &cfg->initial_buckets));
  if (cfg->initial_buckets & (cfg->initial_buckets - 1))
    return Status::InvalidArgument("parameter initial_buckets must be a power of two");
  PMINDEX_RETURN_IF_ERROR(p.GetInt("load_factor", 2, 1, 64, &cfg->load_factor));
  PMINDEX_RETURN_IF_ERROR(p.GetInt("max_threads", kRootSlots, 1, kMaxThreads, &cfg->max_threads));
  return Status::OK();
}

}  // namespace

Status NvcHashmap::Create(std::unique_ptr<pm::Pool> pool, const Options& o, std::unique_ptr<Index>* out) {
  Config cfg;
  PMINDEX_RETURN_IF_ERROR(ParseConfig(o, &cfg));
  if (o.read_only) return Status::Unsupported("nvc_hashmap cannot create a read-only pool");
  if (o.max_key_size == 0 || o.max_key_size > (1u << 20) || o.max_value_size > (1u << 24))
    return Status::InvalidArgument("nvc_hashmap: max_key_size/max_value_size out of range");
  auto h = std::make_unique<NvcHashmap>(std::move(pool), cfg.fix, uint64_t(cfg.load_factor), cfg.slab);
  const Status s = h->InitNew(o, uint64_t(cfg.initial_buckets), uint32_t(cfg.max_threads));
  return Finish(std::move(h), s, out);
}

Status NvcHashmap::Open(std::unique_ptr<pm::Pool> pool, const Options& o, std::unique_ptr<Index>* out) {
  Config cfg;
  PMINDEX_RETURN_IF_ERROR(ParseConfig(o, &cfg));
  if (o.read_only || pool->read_only())
    return Status::Unsupported("nvc_hashmap does not support read-only opens (recovery writes)");
  auto h = std::make_unique<NvcHashmap>(std::move(pool), cfg.fix, uint64_t(cfg.load_factor), cfg.slab);
  h->recovery_threads_ = o.recovery_threads;
  bool recover = false;
  Status s = h->LoadRoot(&recover);
  if (s.ok() && recover) s = h->Recover();
  return Finish(std::move(h), s, out);
}

// The end of Create and Open: on failure close the pool and return s; else
// mark the index open (root.clean = 0, persisted) and hand it out.
Status NvcHashmap::Finish(std::unique_ptr<NvcHashmap> h, Status s, std::unique_ptr<Index>* out) {
  if (!s.ok()) {
    h->closed_ = true;
    h->pool_->Close();
    return s;
  }
  pm::StoreAtomic(&h->root_->clean, uint64_t(0));
  pm::Persist(&h->root_->clean, 8);
  if (h->late_max_threads_) pm::StoreAtomic(&h->root_->max_threads, uint64_t(h->late_max_threads_));
  *out = std::move(h);
  return Status::OK();
}

}  // namespace nvc

void RegisterNvcHashmap(std::vector<IndexFactory>* r) {
  AddIndexType(r,
               {"nvc_hashmap", /*persistent=*/true, /*ordered=*/false, /*concurrent=*/true,
                "NVC-Hashmap: persistent lock-free split-ordered hash map (IMDM'15) with the erratum fixed"},
               &nvc::NvcHashmap::Create, &nvc::NvcHashmap::Open);
}

}  // namespace internal
}  // namespace pmindex

// The fault switches of this folder (pmindex/pm/fault.h; docs/CONTRIBUTING.md).
PMINDEX_FAULT_SWITCHES(nvc_hashmap,
                       "nvc.create.skip_dummy_persist",
                       "nvc.create.skip_max_threads_persist",
                       "nvc.erratum.no_fix",
                       "nvc.insert.skip_failed_zero_persist",
                       "nvc.insert.skip_link_persist",
                       "nvc.insert.skip_node_persist",
                       "nvc.open.skip_empty_slab_unlink",
                       "nvc.remove.skip_mark_persist");
