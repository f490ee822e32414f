// Internal helpers shared by every index: argument validation, key order,
// the registry hooks each index folder implements and the adapters between
// an index's maker and the registry.
// Thread-safety: pure functions and registration (done once, at the first
// registry use); Params reads a map the caller owns.
#pragma once

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "pmindex/index.h"
#include "pmindex/pm/pool.h"

namespace pmindex::internal {

inline Status ValidateKey(KeyKind kind, size_t max_key, Slice key) {
  if (kind == KeyKind::kU64) {
    if (key.size() != 8) return Status::InvalidArgument("u64 keys are exactly 8 bytes, got " + std::to_string(key.size()));
    return Status::OK();
  }
  if (key.empty()) return Status::InvalidArgument("empty key");
  if (key.size() > max_key)
    return Status::InvalidArgument("key of " + std::to_string(key.size()) + " bytes exceeds the limit of " +
                                   std::to_string(max_key));
  return Status::OK();
}

inline Status ValidateValue(ValueKind kind, size_t max_value, Slice value) {
  if (kind == ValueKind::kU64) {
    if (value.size() != 8) return Status::InvalidArgument("u64 values are exactly 8 bytes, got " + std::to_string(value.size()));
    return Status::OK();
  }
  if (value.size() > max_value)
    return Status::InvalidArgument("value of " + std::to_string(value.size()) + " bytes exceeds the limit of " +
                                   std::to_string(max_value));
  return Status::OK();
}

// The answer of every Status-returning call on an index after its Close
// (include/pmindex/index.h).
inline Status IndexClosed() { return Status::InvalidArgument("index closed"); }

// Three-way comparison in the index's key order: numeric for u64 keys
// (native-endian bytes), memcmp then length for byte keys.
inline int CompareKeys(KeyKind kind, Slice a, Slice b) {
  if (kind == KeyKind::kU64) {
    uint64_t x = SliceToU64(a), y = SliceToU64(b);
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  size_t n = a.size() < b.size() ? a.size() : b.size();
  int c = n ? std::memcmp(a.data(), b.data(), n) : 0;
  if (c) return c;
  return a.size() < b.size() ? -1 : (a.size() > b.size() ? 1 : 0);
}

// Parses options.params; InvalidArgument for unknown names or bad numbers.
// `known` lists accepted names; values are returned through get().
class Params {
 public:
  Params(const std::map<std::string, std::string>& p) : p_(p) {}
  Status Expect(std::initializer_list<const char*> known) const;
  // Reads an integer parameter (default if absent); InvalidArgument if it is
  // not a number in [lo, hi].
  Status GetInt(const char* name, long long def, long long lo, long long hi, long long* out) const;
  Status GetBool(const char* name, bool def, bool* out) const;
  Status GetString(const char* name, const std::string& def, std::string* out) const;

 private:
  const std::map<std::string, std::string>& p_;
};

// One registered index type. Persistent indexes get a pool that the factory
// takes ownership of: `create` formats a fresh pool, `open` recovers one.
// Transient indexes get pool == nullptr and only `create` is called.
struct IndexFactory {
  IndexInfo info;
  Status (*create)(std::unique_ptr<pm::Pool> pool, const Options& options, std::unique_ptr<Index>* out) = nullptr;
  Status (*open)(std::unique_ptr<pm::Pool> pool, const Options& options, std::unique_ptr<Index>* out) = nullptr;
};

// Appends one index type to the registry: the body of each Register*.
inline void AddIndexType(std::vector<IndexFactory>* r, IndexInfo info, decltype(IndexFactory::create) create,
                         decltype(IndexFactory::open) open = nullptr) {
  r->push_back(IndexFactory{std::move(info), create, open});
}

// An index folder's one maker for both entry points: it formats a fresh
// pool (fresh) or recovers the index in an opened one.
using IndexMaker = Status (*)(std::unique_ptr<pm::Pool> pool, const Options& options, std::unique_ptr<Index>* out,
                              bool fresh);

// Appends an index type whose create and open are Make(..., true) and
// Make(..., false).
template <IndexMaker Make>
void AddIndexType(std::vector<IndexFactory>* r, IndexInfo info) {
  AddIndexType(
      r, std::move(info),
      [](std::unique_ptr<pm::Pool> p, const Options& o, std::unique_ptr<Index>* out) { return Make(std::move(p), o, out, true); },
      [](std::unique_ptr<pm::Pool> p, const Options& o, std::unique_ptr<Index>* out) { return Make(std::move(p), o, out, false); });
}

// The last step of a maker: hands the built index out, or closes it (which
// releases its pool) and returns the error st that stopped the build.
template <class T>
Status HandOutOrClose(Status st, std::unique_ptr<T> idx, std::unique_ptr<Index>* out) {
  if (!st.ok()) {
    if (idx) (void)idx->Close();
    return st;
  }
  *out = std::move(idx);
  return Status::OK();
}

// Implemented by each index folder; append the folder's index types.
void RegisterDramBtree(std::vector<IndexFactory>* r);
void RegisterFPTree(std::vector<IndexFactory>* r);
void RegisterFastFair(std::vector<IndexFactory>* r);
void RegisterNvcHashmap(std::vector<IndexFactory>* r);
void RegisterNVTree(std::vector<IndexFactory>* r);
void RegisterWBTree(std::vector<IndexFactory>* r);
void RegisterBzTree(std::vector<IndexFactory>* r);
void RegisterClfBTree(std::vector<IndexFactory>* r);

const std::vector<IndexFactory>& Registry();

// For tools that manage the pool themselves (pmcheck installs its simulator
// between pool creation and index creation): format a new index of type
// `name` in a freshly created pool, or recover the index in an opened pool.
Status CreateIndexInPool(std::string_view name, std::unique_ptr<pm::Pool> pool, const Options& options,
                         std::unique_ptr<Index>* out);
Status OpenIndexInPool(std::unique_ptr<pm::Pool> pool, const Options& options, std::unique_ptr<Index>* out);

}  // namespace pmindex::internal
