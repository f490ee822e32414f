// The registry of index types and OpenIndex: pool creation/opening shared by
// every persistent index.
// Thread-safety: the registry is built once, at its first use (a
// function-local static), and only read afterwards; OpenIndex, IndexTypes and
// the lookups may be called from any thread.
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>

#include "core/index_util.h"

namespace pmindex {
namespace internal {

// Weak no-op registrations: an index folder that is built overrides its own.
__attribute__((weak)) void RegisterDramBtree(std::vector<IndexFactory>*) {}
__attribute__((weak)) void RegisterFPTree(std::vector<IndexFactory>*) {}
__attribute__((weak)) void RegisterFastFair(std::vector<IndexFactory>*) {}
__attribute__((weak)) void RegisterNvcHashmap(std::vector<IndexFactory>*) {}
__attribute__((weak)) void RegisterNVTree(std::vector<IndexFactory>*) {}
__attribute__((weak)) void RegisterWBTree(std::vector<IndexFactory>*) {}
__attribute__((weak)) void RegisterBzTree(std::vector<IndexFactory>*) {}
__attribute__((weak)) void RegisterClfBTree(std::vector<IndexFactory>*) {}

const std::vector<IndexFactory>& Registry() {
  static const std::vector<IndexFactory> r = [] {
    std::vector<IndexFactory> v;
    RegisterDramBtree(&v);
    RegisterFPTree(&v);
    RegisterFastFair(&v);
    RegisterNvcHashmap(&v);
    RegisterNVTree(&v);
    RegisterWBTree(&v);
    RegisterBzTree(&v);
    RegisterClfBTree(&v);
    return v;
  }();
  return r;
}

Status Params::Expect(std::initializer_list<const char*> known) const {
  for (const auto& [k, v] : p_) {
    bool ok = false;
    for (const char* n : known) ok |= (k == n);
    if (!ok) {
      std::string names;
      for (const char* n : known) names += std::string(names.empty() ? "" : ", ") + n;
      return Status::InvalidArgument("unknown index parameter '" + k + "' (accepted: " + (names.empty() ? "none" : names) + ")");
    }
  }
  return Status::OK();
}

Status Params::GetInt(const char* name, long long def, long long lo, long long hi, long long* out) const {
  auto it = p_.find(name);
  if (it == p_.end()) {
    *out = def;
    return Status::OK();
  }
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(it->second.c_str(), &end, 10);
  if (errno || end == it->second.c_str() || *end != '\0' || v < lo || v > hi)
    return Status::InvalidArgument("parameter " + std::string(name) + "=" + it->second + " is not an integer in [" +
                                   std::to_string(lo) + ", " + std::to_string(hi) + "]");
  *out = v;
  return Status::OK();
}

Status Params::GetBool(const char* name, bool def, bool* out) const {
  auto it = p_.find(name);
  if (it == p_.end()) {
    *out = def;
    return Status::OK();
  }
  const std::string& s = it->second;
  if (s == "1" || s == "true" || s == "on" || s == "yes") *out = true;
  else if (s == "0" || s == "false" || s == "off" || s == "no") *out = false;
  else return Status::InvalidArgument("parameter " + std::string(name) + "=" + s + " is not a boolean");
  return Status::OK();
}

Status Params::GetString(const char* name, const std::string& def, std::string* out) const {
  auto it = p_.find(name);
  *out = it == p_.end() ? def : it->second;
  return Status::OK();
}

}  // namespace internal

std::vector<IndexInfo> ListIndexes() {
  std::vector<IndexInfo> v;
  for (const auto& f : internal::Registry()) v.push_back(f.info);
  return v;
}

bool FindIndexInfo(std::string_view name, IndexInfo* info) {
  for (const auto& f : internal::Registry())
    if (f.info.name == name) {
      if (info) *info = f.info;
      return true;
    }
  return false;
}

namespace {
const internal::IndexFactory* FindFactory(std::string_view name) {
  for (const auto& f : internal::Registry())
    if (f.info.name == name) return &f;
  return nullptr;
}

std::string UnknownIndexMessage(std::string_view name) {
  std::string s = "unknown index type '" + std::string(name) + "'; built-in:";
  for (const auto& f : internal::Registry()) s += " " + f.info.name;
  return s;
}
}  // namespace

Status OpenIndex(std::string_view name, const Options& options, std::unique_ptr<Index>* out) {
  out->reset();
  const internal::IndexFactory* f = nullptr;
  if (!name.empty()) {
    f = FindFactory(name);
    if (!f) return Status::InvalidArgument(UnknownIndexMessage(name));
    if (!f->info.persistent) return f->create(nullptr, options, out);
  }

  pm::PoolOptions po;
  po.size = options.pool_size;
  po.max_size = options.max_pool_size;
  po.read_only = options.read_only;

  std::string path = options.pool_path;
  bool temporary = false;
  if (path.empty()) {
    if (name.empty()) return Status::InvalidArgument("an index name or a pool path is required");
    static std::atomic<uint64_t> counter{0};
    path = "/dev/shm/pmindex-tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + ".pool";
    temporary = true;
  }

  std::unique_ptr<pm::Pool> pool;
  if (!temporary && pm::Pool::Exists(path)) {
    if (options.error_if_exists) return Status::AlreadyExists("pool " + path + " exists");
    PMINDEX_RETURN_IF_ERROR(pm::Pool::Open(path, name, po, &pool));
    if (!f) {
      f = FindFactory(pool->type());
      if (!f) return Status::InvalidArgument("pool " + path + " is owned by index type '" + pool->type() + "', which this build does not have");
    }
    if (!f->open) return Status::Unsupported("index type " + f->info.name + " cannot be reopened");
    return f->open(std::move(pool), options, out);
  }
  if (!options.create_if_missing) return Status::NotFound("no pool at " + path);
  if (!f) return Status::InvalidArgument("an index name is required to create a pool");
  PMINDEX_RETURN_IF_ERROR(pm::Pool::Create(path, f->info.name, po, &pool));
  if (temporary) pool->RemoveOnClose();
  Status s = f->create(std::move(pool), options, out);
  if (!s.ok()) {
    out->reset();
    // The factory took the pool and closed it on failure: do not leave a
    // half-formatted pool behind.
    pm::Pool::Remove(path);
  }
  return s;
}

namespace internal {

Status CreateIndexInPool(std::string_view name, std::unique_ptr<pm::Pool> pool, const Options& options,
                         std::unique_ptr<Index>* out) {
  const IndexFactory* f = FindFactory(name);
  if (!f) return Status::InvalidArgument(UnknownIndexMessage(name));
  if (!f->info.persistent || !f->create) return Status::InvalidArgument(f->info.name + " is not a persistent index");
  return f->create(std::move(pool), options, out);
}

Status OpenIndexInPool(std::unique_ptr<pm::Pool> pool, const Options& options, std::unique_ptr<Index>* out) {
  const IndexFactory* f = FindFactory(pool->type());
  if (!f || !f->open) return Status::InvalidArgument("pool owned by unknown index type '" + pool->type() + "'");
  return f->open(std::move(pool), options, out);
}

}  // namespace internal
}  // namespace pmindex
