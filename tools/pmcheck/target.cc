// Targets: registered pmindex indexes in a pm::Pool, and the private toy index
// in a mapped file. See target.h. No PM stores of its own.
#include "target.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <vector>

#include "core/index_util.h"
#include "pmindex/pm/allocator.h"
#include "pmindex/pm/pool.h"

namespace pmcheck {
namespace {

using pmindex::Status;
namespace pm = pmindex::pm;

pmindex::Options IndexOptions(const Config& c) {
  pmindex::Options o;
  o.pool_size = c.pool_size;
  o.key_kind = c.key_kind;
  o.value_kind = c.value_kind;
  o.num_threads = c.threads;
  o.recovery_threads = 1;
  o.params = c.params;
  return o;
}

class RealTarget final : public Target {
 public:
  RealTarget(const Config& c, const pmindex::IndexInfo& info) : c_(c), info_(info) {}

  Status Prepare(const std::string& path) override {
    pm::PoolOptions po;
    po.size = c_.pool_size;
    PMINDEX_RETURN_IF_ERROR(pm::Pool::Create(path, info_.name, po, &pool_));
    raw_ = pool_.get();
    return Status::OK();
  }
  char* base() const override { return raw_->base(); }
  uint64_t size() const override { return raw_->size(); }
  uint64_t max_size() const override { return raw_->max_size(); }
  Status CreateIndex(std::unique_ptr<pmindex::Index>* out) override {
    return pmindex::internal::CreateIndexInPool(info_.name, std::move(pool_), IndexOptions(c_), out);
  }
  Status OpenOrCreate(const std::string& path, std::unique_ptr<pmindex::Index>* out) override {
    pmindex::Options o = IndexOptions(c_);
    o.pool_path = path;
    return pmindex::OpenIndex(info_.name, o, out);
  }
  Status Open(const std::string& path, std::unique_ptr<pmindex::Index>* out, const MappedHook& on_mapped) override {
    pm::PoolOptions po;
    po.size = c_.pool_size;
    if (on_mapped) po.on_mapped = [&on_mapped](pm::Pool* p) { on_mapped(p->base(), p->max_size(), [p] { return p->size(); }); };
    std::unique_ptr<pm::Pool> pool;
    PMINDEX_RETURN_IF_ERROR(pm::Pool::Open(path, info_.name, po, &pool));
    return pmindex::internal::OpenIndexInPool(std::move(pool), IndexOptions(c_), out);
  }
  Status CheckLeaks(pmindex::Index* index) override {
    pm::Pool* pool = index->pool();
    if (!pool) return Status::OK();
    Status s = pool->allocator().Check();
    if (!s.ok()) return Status::Corrupt("allocator Check: " + s.ToString());
    std::set<uint64_t> alloc, owned;
    pool->allocator().ForEachAllocated([&](uint64_t off, size_t) { alloc.insert(off); });
    bool dup = false;
    uint64_t dup_off = 0;
    PMINDEX_RETURN_IF_ERROR(index->ForEachOwnedBlock([&](uint64_t off) {
      if (!owned.insert(off).second && !dup) {
        dup = true;
        dup_off = off;
      }
    }));
    std::string msg;
    size_t leaked = 0, unknown = 0;
    for (uint64_t a : alloc)
      if (!owned.count(a) && leaked++ < 3) msg += " leaked block @" + std::to_string(a);
    for (uint64_t o : owned)
      if (!alloc.count(o) && unknown++ < 3) msg += " owned but not allocated @" + std::to_string(o);
    if (dup) msg += " block owned twice @" + std::to_string(dup_off);
    if (msg.empty()) return Status::OK();
    return Status::Corrupt(std::to_string(alloc.size()) + " allocated, " + std::to_string(owned.size()) + " owned, " +
                           std::to_string(leaked) + " leaked, " + std::to_string(unknown) + " unknown:" + msg);
  }
  bool ordered() const override { return info_.ordered; }
  bool concurrent() const override { return info_.concurrent; }
  void Remove(const std::string& path) override {
    ::unlink(path.c_str());
  }

 private:
  Config c_;
  pmindex::IndexInfo info_;
  std::unique_ptr<pm::Pool> pool_;
  pm::Pool* raw_ = nullptr;
};

class ToyTarget final : public Target {
 public:
  ~ToyTarget() override {
    for (char* m : maps_) ::munmap(m, kToyRegionSize);
  }
  Status Prepare(const std::string& path) override {
    ::unlink(path.c_str());
    return Map(path, true, &base_);
  }
  char* base() const override { return base_; }
  uint64_t size() const override { return kToyRegionSize; }
  uint64_t max_size() const override { return kToyRegionSize; }
  Status CreateIndex(std::unique_ptr<pmindex::Index>* out) override { return ToyCreate(base_, kToyRegionSize, out); }
  Status OpenOrCreate(const std::string& path, std::unique_ptr<pmindex::Index>* out) override {
    struct stat st;
    char* b = nullptr;
    if (::stat(path.c_str(), &st) == 0) {
      PMINDEX_RETURN_IF_ERROR(Map(path, false, &b));
      return ToyOpen(b, kToyRegionSize, out);
    }
    PMINDEX_RETURN_IF_ERROR(Map(path, true, &b));
    return ToyCreate(b, kToyRegionSize, out);
  }
  Status Open(const std::string& path, std::unique_ptr<pmindex::Index>* out, const MappedHook& on_mapped) override {
    char* b = nullptr;
    PMINDEX_RETURN_IF_ERROR(Map(path, false, &b));
    if (on_mapped) on_mapped(b, kToyRegionSize, [] { return kToyRegionSize; });
    return ToyOpen(b, kToyRegionSize, out);
  }
  Status CheckLeaks(pmindex::Index* index) override { return ToyCheckLeaks(index); }
  bool ordered() const override { return true; }
  bool concurrent() const override { return true; }
  void Remove(const std::string& path) override { ::unlink(path.c_str()); }

 private:
  Status Map(const std::string& path, bool create, char** out) {
    int fd = ::open(path.c_str(), create ? (O_RDWR | O_CREAT | O_EXCL) : O_RDWR, 0644);
    if (fd < 0) return Status::IOError("open " + path + ": " + std::strerror(errno));
    struct stat st;
    if (create && ::ftruncate(fd, kToyRegionSize) != 0) {
      ::close(fd);
      return Status::IOError("ftruncate " + path);
    }
    if (::fstat(fd, &st) != 0 || uint64_t(st.st_size) < kToyRegionSize) {
      ::close(fd);
      return Status::Corrupt("pmcheck_toy: " + path + " is too small");
    }
    void* m = ::mmap(nullptr, kToyRegionSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (m == MAP_FAILED) return Status::IOError("mmap " + path);
    maps_.push_back(static_cast<char*>(m));
    *out = static_cast<char*>(m);
    return Status::OK();
  }
  char* base_ = nullptr;
  std::vector<char*> maps_;
};

Status MakeToyTarget(const Config& c, std::unique_ptr<Target>* out) {
  if (c.key_kind != pmindex::KeyKind::kU64 || c.value_kind != pmindex::ValueKind::kU64)
    return Status::InvalidArgument("pmcheck_toy supports u64 keys and values only");
  out->reset(new ToyTarget());
  return Status::OK();
}

// pmcheck's own targets, matched by name before the registered indexes. A
// new one (in its own file) adds its name and factory here.
struct PrivateTarget {
  const char* name;
  Status (*make)(const Config& c, std::unique_ptr<Target>* out);
};
const PrivateTarget kPrivateTargets[] = {
    {kToyName, MakeToyTarget},
    {kPmwcasTargetName, MakePmwcasTarget},
    {kAllocatorTargetName, MakeAllocatorTarget},
};

}  // namespace

Status MakeTarget(const Config& c, std::unique_ptr<Target>* out) {
  for (const PrivateTarget& t : kPrivateTargets)
    if (c.index == t.name) return t.make(c, out);
  pmindex::IndexInfo info;
  if (!pmindex::FindIndexInfo(c.index, &info)) {
    std::string names;
    for (const auto& i : pmindex::ListIndexes())
      if (i.persistent) names += " " + i.name;
    std::string own;
    for (const PrivateTarget& t : kPrivateTargets) own += std::string(own.empty() ? "" : ", ") + t.name;
    return Status::InvalidArgument("unknown index '" + c.index + "'; persistent indexes in this build:" + names + " (and " +
                                   own + ")");
  }
  if (!info.persistent) return Status::InvalidArgument(c.index + " is transient: nothing to crash-check");
  out->reset(new RealTarget(c, info));
  return Status::OK();
}

}  // namespace pmcheck
