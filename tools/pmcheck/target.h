// What pmcheck checks: an index type plus the storage it lives in.
//
// Target hides whether the index is a registered pmindex index (storage: a
// pm::Pool created before the simulator is installed, so that index creation
// itself is observed) or pmcheck's private toy index (storage: a plain mapped
// file, usable before the pool implementation exists). No persist ordering of
// its own: it only creates, opens and enumerates.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "pmcheck.h"
#include "pmindex/index.h"

namespace pmcheck {

class Target {
 public:
  virtual ~Target() = default;

  // Recording: create fresh storage at `path` (durable, not yet an index).
  virtual pmindex::Status Prepare(const std::string& path) = 0;
  // The observed PM range, valid between Prepare and the index's Close.
  virtual char* base() const = 0;
  virtual uint64_t size() const = 0;       // current size (may grow)
  virtual uint64_t max_size() const = 0;   // reserved range (addresses never move)
  // Format the index in the prepared storage (the simulator is installed).
  virtual pmindex::Status CreateIndex(std::unique_ptr<pmindex::Index>* out) = 0;

  // Kill mode: create storage + index at path, or open the existing one.
  virtual pmindex::Status OpenOrCreate(const std::string& path, std::unique_ptr<pmindex::Index>* out) = 0;
  // Called by Open once the storage is mapped, before recovery stores
  // anything: the mapping's base, its reserved size and its current size.
  using MappedHook = std::function<void(char* base, uint64_t max_size, std::function<uint64_t()> size)>;
  // Recovery: open (and recover) the index in the storage file at path;
  // on_mapped (if set) lets a recorder observe the recovery itself.
  virtual pmindex::Status Open(const std::string& path, std::unique_ptr<pmindex::Index>* out,
                               const MappedHook& on_mapped = {}) = 0;
  // Leak check: OK if the allocated blocks are exactly the owned ones,
  // otherwise a description of the difference.
  virtual pmindex::Status CheckLeaks(pmindex::Index* index) = 0;
  virtual bool ordered() const = 0;
  virtual bool concurrent() const = 0;
  virtual void Remove(const std::string& path) = 0;
};

// Resolves config.index; InvalidArgument for unknown or transient indexes.
pmindex::Status MakeTarget(const Config& config, std::unique_ptr<Target>* out);

// The toy index (toy_index.cc): a persistent linked list of 16-slot nodes
// with per-node bitmaps, a 64-node bitmap allocator and an allocation
// micro-log. u64 keys and values only.
inline constexpr const char* kToyName = "pmcheck_toy";
pmindex::Status ToyCreate(char* base, uint64_t size, std::unique_ptr<pmindex::Index>* out);
pmindex::Status ToyOpen(char* base, uint64_t size, std::unique_ptr<pmindex::Index>* out);
pmindex::Status ToyCheckLeaks(pmindex::Index* index);
inline constexpr uint64_t kToyRegionSize = 64 * 1024;

// The PMwCAS target (pmwcas_target.cc): a lock-free hash map built only on
// the pool's PMwCAS. u64 keys and values, unordered, concurrent.
inline constexpr const char* kPmwcasTargetName = "pmwcas";
pmindex::Status MakePmwcasTarget(const Config& config, std::unique_ptr<Target>* out);

// The allocator target (allocator_target.cc): the crash-safe allocator driven
// directly (blocks of every size class and large blocks, pool growth,
// Reclaim, cross-thread frees) behind a u64 map. Unordered, concurrent.
inline constexpr const char* kAllocatorTargetName = "allocator";
pmindex::Status MakeAllocatorTarget(const Config& config, std::unique_ptr<Target>* out);

}  // namespace pmcheck
