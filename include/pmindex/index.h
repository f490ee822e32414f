// pmindex/index.h: the one interface every index implements.
//
// Operations (all thread-safe unless the index's name says "single"):
//   Insert  fails with AlreadyExists if the key is present.
//   Update  fails with NotFound if the key is absent.
//   Upsert  inserts or replaces.
//   Find    copies the value into *value; NotFound if absent.
//   FindMany  Find over a batch of keys, overlapping their cache misses
//           where the index can.
//   Remove  NotFound if absent.
//   Scan    visits up to n records with key >= start in ascending key order;
//           hash indexes return Unsupported.
// Durability, on a persistent index:
//   - An operation that returned OK is durable: it survives a crash at any
//     later instant.
//   - Reads return only durable data: no answer depends on a store that a
//     crash can still take away. A record Find or Scan returned, an
//     AlreadyExists of Insert and a NotFound of Update, Remove or Find hold
//     in the state recovery finds after a crash at any instant after the
//     call returned, and Size counts no change a crash can still undo (a
//     concurrent writer that has not made its change durable yet is waited
//     for, helped, or not seen). Each index's docs/<index>.md argues this
//     for its read paths ("Reads return only durable data");
//     nvc_hashmap's erratum_fix=none, a mode for measuring, gives it up.
// A transient index (dram_btree) keeps nothing across a crash or Close.
//
// After Close every call answers without touching the index: the calls
// returning Status return InvalidArgument "index closed", Size 0, Stats an
// empty IndexStats, pool() nullptr; Name and the kinds keep answering, and
// Close stays OK.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "pmindex/options.h"
#include "pmindex/status.h"

namespace pmindex {

namespace pm {
class Pool;
}

using Slice = std::string_view;

// Bytes of a u64 key or value as the API passes them (native endian).
inline Slice U64Slice(const uint64_t& v) { return Slice(reinterpret_cast<const char*>(&v), 8); }
inline uint64_t SliceToU64(Slice s) {
  uint64_t v = 0;
  std::memcpy(&v, s.data(), s.size() < 8 ? s.size() : 8);
  return v;
}

// A non-owning reference to a callable (like absl::FunctionRef), so the scan
// callback costs no allocation.
template <typename Sig>
class FunctionRef;
template <typename R, typename... Args>
class FunctionRef<R(Args...)> {
 public:
  template <typename F, typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, FunctionRef>>>
  FunctionRef(F&& f) noexcept  // NOLINT: implicit by design
      : obj_(const_cast<void*>(static_cast<const void*>(&f))),
        call_([](void* o, Args... a) -> R { return (*static_cast<std::remove_reference_t<F>*>(o))(std::forward<Args>(a)...); }) {}
  R operator()(Args... a) const { return call_(obj_, std::forward<Args>(a)...); }

 private:
  void* obj_;
  R (*call_)(void*, Args...);
};

// Return false to stop the scan early.
using ScanCallback = FunctionRef<bool(Slice key, Slice value)>;

struct IndexStats {
  uint64_t records = 0;
  uint64_t pm_bytes = 0;    // PM bytes allocated by the index (0 if transient)
  uint64_t dram_bytes = 0;  // DRAM held by the index's volatile structures
  double recovery_seconds = 0;  // time the last open spent recovering
};

class Index {
 public:
  virtual ~Index() = default;  // closes the index (and its pool) cleanly

  virtual std::string_view Name() const = 0;
  virtual KeyKind key_kind() const = 0;
  virtual ValueKind value_kind() const = 0;

  virtual Status Insert(Slice key, Slice value) = 0;
  virtual Status Update(Slice key, Slice value) = 0;
  virtual Status Upsert(Slice key, Slice value) = 0;
  virtual Status Find(Slice key, std::string* value) = 0;
  // Batched Find: for i < n, statuses[i] is what Find(keys[i], &values[i])
  // returns, and values[i] holds the value when statuses[i] is OK (else it
  // is unspecified). Each lookup is linearizable on its own, exactly as a
  // Find; the batch as a whole is not atomic (a writer may run between two
  // of its lookups). Keys may repeat. An index overrides this to overlap the
  // cache misses of the batch's lookups (fptree: interleaved descents with
  // software prefetch, fptree_batch.cc); the default runs them one by one.
  virtual void FindMany(const Slice* keys, size_t n, std::string* values, Status* statuses) {
    for (size_t i = 0; i < n; i++) statuses[i] = Find(keys[i], &values[i]);
  }
  virtual Status Remove(Slice key) = 0;
  // *count (if not null) receives the number of records visited.
  virtual Status Scan(Slice start, size_t n, ScanCallback cb, size_t* count = nullptr) = 0;
  virtual uint64_t Size() = 0;

  // Verifies structural invariants; Corrupt with a description if violated.
  // Must not run concurrently with writers.
  virtual Status Check() = 0;
  // Calls fn with the pool offset of every PM block the index owns (for leak
  // checks against the allocator's enumeration). Transient indexes: nothing.
  virtual Status ForEachOwnedBlock(const std::function<void(uint64_t offset)>& fn) = 0;
  virtual IndexStats Stats() = 0;
  // The pool, or nullptr for transient indexes.
  virtual pm::Pool* pool() { return nullptr; }

  // Flushes and closes; further calls answer "index closed" (see the top of
  // this file). Idempotent. Must not run concurrently with other calls.
  virtual Status Close() = 0;
};

// Facts about a registered index type.
struct IndexInfo {
  std::string name;
  bool persistent = true;
  bool ordered = true;       // supports Scan
  bool concurrent = true;    // safe for concurrent callers
  std::string description;
};

// Opens the index in options.pool_path, creating pool and index if missing.
// `name` selects the index type; when opening an existing pool, an empty name
// accepts whatever type owns the pool, and a different name is an
// InvalidArgument error naming the owner.
Status OpenIndex(std::string_view name, const Options& options, std::unique_ptr<Index>* out);

// Every index type built into this library.
std::vector<IndexInfo> ListIndexes();
bool FindIndexInfo(std::string_view name, IndexInfo* info);

}  // namespace pmindex
