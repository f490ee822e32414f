// PoolTarget (see pool_target.h): the pool-based targets' shared scaffolding.
// No PM stores of its own.
#include "pool_target.h"

#include <unistd.h>

#include <set>

#include "pmindex/pm/allocator.h"

namespace pmcheck {

using pmindex::Status;
namespace pm = pmindex::pm;

Status PoolTarget::Prepare(const std::string& path) {
  PMINDEX_RETURN_IF_ERROR(pm::Pool::Create(path, type_, create_options_, &pool_));
  raw_ = pool_.get();
  return Status::OK();
}

Status PoolTarget::OpenOrCreate(const std::string& path, std::unique_ptr<pmindex::Index>* out) {
  if (::access(path.c_str(), F_OK) == 0) return Open(path, out, {});
  PMINDEX_RETURN_IF_ERROR(Prepare(path));
  return CreateIndex(out);
}

Status PoolTarget::Open(const std::string& path, std::unique_ptr<pmindex::Index>* out, const MappedHook& on_mapped) {
  pm::PoolOptions po = open_options_;
  if (on_mapped) po.on_mapped = [&on_mapped](pm::Pool* p) { on_mapped(p->base(), p->max_size(), [p] { return p->size(); }); };
  std::unique_ptr<pm::Pool> pool;
  PMINDEX_RETURN_IF_ERROR(pm::Pool::Open(path, type_, po, &pool));
  return open_(std::move(pool), out);
}

Status PoolTarget::CheckLeaks(pmindex::Index* index) {
  pm::Pool* pool = index->pool();
  PMINDEX_RETURN_IF_ERROR(pool->allocator().Check());
  std::set<uint64_t> alloc, owned;
  uint64_t dup = 0;
  pool->allocator().ForEachAllocated([&](uint64_t off, size_t) { alloc.insert(off); });
  PMINDEX_RETURN_IF_ERROR(index->ForEachOwnedBlock([&](uint64_t off) {
    if (!owned.insert(off).second && !dup) dup = off;
  }));
  std::string msg;
  for (uint64_t a : alloc)
    if (!owned.count(a)) msg += " leaked block @" + std::to_string(a);
  for (uint64_t o : owned)
    if (!alloc.count(o)) msg += " owned but free @" + std::to_string(o);
  if (dup) msg += " owned twice @" + std::to_string(dup);
  if (msg.empty()) return Status::OK();
  if (msg.size() > 200) msg = msg.substr(0, 200) + "...";
  return Status::Corrupt(std::to_string(alloc.size()) + " blocks allocated, " + std::to_string(owned.size()) + " owned:" + msg);
}

void PoolTarget::Remove(const std::string& path) { ::unlink(path.c_str()); }

}  // namespace pmcheck
