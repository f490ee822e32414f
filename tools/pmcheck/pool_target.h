// The scaffolding pmcheck's own pool-based targets share (the PMwCAS map,
// pmwcas_target.cc, and the allocator map, allocator_target.cc): a Target
// whose storage is a pm::Pool of one pool type, whose index is made by a
// pair of functions (format a fresh pool, open and recover one), and whose
// leak check holds the pool's allocator to exactly the blocks the index
// enumerates (nothing leaked, nothing owned twice, nothing owned but free).
// No persist ordering of its own: it only creates, opens and enumerates.
//
// Thread-safety: like every Target, used by one thread at a time.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "pmindex/pm/pool.h"
#include "target.h"

namespace pmcheck {

class PoolTarget : public Target {
 public:
  using MakeFn = std::function<pmindex::Status(std::unique_ptr<pmindex::pm::Pool>, std::unique_ptr<pmindex::Index>*)>;
  // type: the pool's type name; create / open: format a fresh pool / open
  // and recover one; create_options / open_options: the pool's options.
  PoolTarget(std::string type, pmindex::pm::PoolOptions create_options, pmindex::pm::PoolOptions open_options,
             MakeFn create, MakeFn open)
      : type_(std::move(type)), create_options_(std::move(create_options)), open_options_(std::move(open_options)),
        create_(std::move(create)), open_(std::move(open)) {}

  pmindex::Status Prepare(const std::string& path) override;
  char* base() const override { return raw_->base(); }
  uint64_t size() const override { return raw_->size(); }
  uint64_t max_size() const override { return raw_->max_size(); }
  pmindex::Status CreateIndex(std::unique_ptr<pmindex::Index>* out) override { return create_(std::move(pool_), out); }
  pmindex::Status OpenOrCreate(const std::string& path, std::unique_ptr<pmindex::Index>* out) override;
  pmindex::Status Open(const std::string& path, std::unique_ptr<pmindex::Index>* out, const MappedHook& on_mapped) override;
  pmindex::Status CheckLeaks(pmindex::Index* index) override;
  bool ordered() const override { return false; }
  bool concurrent() const override { return true; }
  void Remove(const std::string& path) override;

 private:
  std::string type_;
  pmindex::pm::PoolOptions create_options_, open_options_;
  MakeFn create_, open_;
  std::unique_ptr<pmindex::pm::Pool> pool_;
  pmindex::pm::Pool* raw_ = nullptr;
};

}  // namespace pmcheck
