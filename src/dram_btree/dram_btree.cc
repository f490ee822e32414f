// dram_btree: the transient baseline index.
//
// absl::btree_map under a reader-writer lock: the role the STX B+-tree plays
// in the papers' evaluations. Nothing is persistent; every figure for a
// persistent index is reported as a ratio against this one run side by side.
// Invariants: the map holds exactly the acknowledged records, keys in index
// order (numeric for u64 keys, memcmp for byte keys). Close drops the map;
// every call after it answers IndexClosed() (include/pmindex/index.h).
// Thread safety: every call but Close may run concurrently (mu_); Close runs
// when no other call does, so the closed flag needs no ordering.
#include <atomic>
#include <shared_mutex>

#include "absl/container/btree_map.h"
#include "core/index_util.h"

namespace pmindex::internal {
namespace {

template <typename K, typename V>
class DramBtree final : public Index {
 public:
  DramBtree(const Options& o) : opts_(o) {}

  std::string_view Name() const override { return "dram_btree"; }
  KeyKind key_kind() const override { return opts_.key_kind; }
  ValueKind value_kind() const override { return opts_.value_kind; }

  Status Insert(Slice key, Slice value) override {
    if (closed()) return IndexClosed();
    PMINDEX_RETURN_IF_ERROR(Validate(key, value));
    std::unique_lock l(mu_);
    auto [it, inserted] = map_.try_emplace(ToKey(key), ToValue(value));
    (void)it;
    return inserted ? Status::OK() : Status::AlreadyExists();
  }
  Status Update(Slice key, Slice value) override {
    if (closed()) return IndexClosed();
    PMINDEX_RETURN_IF_ERROR(Validate(key, value));
    std::unique_lock l(mu_);
    auto it = map_.find(ToKey(key));
    if (it == map_.end()) return Status::NotFound();
    it->second = ToValue(value);
    return Status::OK();
  }
  Status Upsert(Slice key, Slice value) override {
    if (closed()) return IndexClosed();
    PMINDEX_RETURN_IF_ERROR(Validate(key, value));
    std::unique_lock l(mu_);
    map_.insert_or_assign(ToKey(key), ToValue(value));
    return Status::OK();
  }
  Status Find(Slice key, std::string* value) override {
    if (closed()) return IndexClosed();
    PMINDEX_RETURN_IF_ERROR(ValidateKey(opts_.key_kind, opts_.max_key_size, key));
    std::shared_lock l(mu_);
    auto it = map_.find(ToKey(key));
    if (it == map_.end()) return Status::NotFound();
    if (value) AssignValue(it->second, value);
    return Status::OK();
  }
  Status Remove(Slice key) override {
    if (closed()) return IndexClosed();
    PMINDEX_RETURN_IF_ERROR(ValidateKey(opts_.key_kind, opts_.max_key_size, key));
    std::unique_lock l(mu_);
    return map_.erase(ToKey(key)) ? Status::OK() : Status::NotFound();
  }
  Status Scan(Slice start, size_t n, ScanCallback cb, size_t* count) override {
    if (count) *count = 0;
    if (closed()) return IndexClosed();
    PMINDEX_RETURN_IF_ERROR(ValidateKey(opts_.key_kind, opts_.max_key_size, start));
    std::shared_lock l(mu_);
    size_t c = 0;
    for (auto it = map_.lower_bound(ToKey(start)); it != map_.end() && c < n; ++it) {
      ++c;
      if (!cb(KeySlice(it->first), ValueSlice(it->second))) break;
    }
    if (count) *count = c;
    return Status::OK();
  }
  uint64_t Size() override {
    if (closed()) return 0;
    std::shared_lock l(mu_);
    return map_.size();
  }
  Status Check() override {
    if (closed()) return IndexClosed();
    std::shared_lock l(mu_);
    const K* prev = nullptr;
    for (const auto& kv : map_) {
      if (prev && !(*prev < kv.first)) return Status::Corrupt("dram_btree keys out of order");
      prev = &kv.first;
    }
    return Status::OK();
  }
  Status ForEachOwnedBlock(const std::function<void(uint64_t)>&) override {
    return closed() ? IndexClosed() : Status::OK();
  }
  IndexStats Stats() override {
    if (closed()) return IndexStats{};
    std::shared_lock l(mu_);
    IndexStats s;
    s.records = map_.size();
    // btree_map nodes hold ~ (sizeof(K)+sizeof(V)) per slot at ~70% fill;
    // heap-allocated string contents are added for byte keys/values.
    uint64_t per = sizeof(K) + sizeof(V);
    s.dram_bytes = uint64_t(double(map_.size() * per) / 0.7);
    if constexpr (std::is_same_v<K, std::string> || std::is_same_v<V, std::string>) {
      for (const auto& kv : map_) {
        if constexpr (std::is_same_v<K, std::string>) s.dram_bytes += kv.first.capacity() > 15 ? kv.first.capacity() : 0;
        if constexpr (std::is_same_v<V, std::string>) s.dram_bytes += kv.second.capacity() > 15 ? kv.second.capacity() : 0;
      }
    }
    return s;
  }
  Status Close() override {
    closed_.store(true, std::memory_order_relaxed);
    map_ = absl::btree_map<K, V>();
    return Status::OK();
  }

 private:
  bool closed() const { return closed_.load(std::memory_order_relaxed); }
  Status Validate(Slice key, Slice value) {
    PMINDEX_RETURN_IF_ERROR(ValidateKey(opts_.key_kind, opts_.max_key_size, key));
    return ValidateValue(opts_.value_kind, opts_.max_value_size, value);
  }
  static K ToKey(Slice s) {
    if constexpr (std::is_same_v<K, uint64_t>) return SliceToU64(s);
    else return K(s);
  }
  static V ToValue(Slice s) {
    if constexpr (std::is_same_v<V, uint64_t>) return SliceToU64(s);
    else return V(s);
  }
  static Slice KeySlice(const K& k) {
    if constexpr (std::is_same_v<K, uint64_t>) return U64Slice(k);
    else return Slice(k);
  }
  static Slice ValueSlice(const V& v) {
    if constexpr (std::is_same_v<V, uint64_t>) return U64Slice(v);
    else return Slice(v);
  }
  static void AssignValue(const V& v, std::string* out) {
    if constexpr (std::is_same_v<V, uint64_t>) out->assign(reinterpret_cast<const char*>(&v), 8);
    else out->assign(v);
  }

  Options opts_;
  std::shared_mutex mu_;
  absl::btree_map<K, V> map_;
  std::atomic<bool> closed_{false};
};

Status Create(std::unique_ptr<pm::Pool>, const Options& o, std::unique_ptr<Index>* out) {
  PMINDEX_RETURN_IF_ERROR(Params(o.params).Expect({}));
  if (o.key_kind == KeyKind::kU64 && o.value_kind == ValueKind::kU64) out->reset(new DramBtree<uint64_t, uint64_t>(o));
  else if (o.key_kind == KeyKind::kU64) out->reset(new DramBtree<uint64_t, std::string>(o));
  else if (o.value_kind == ValueKind::kU64) out->reset(new DramBtree<std::string, uint64_t>(o));
  else out->reset(new DramBtree<std::string, std::string>(o));
  return Status::OK();
}

}  // namespace

void RegisterDramBtree(std::vector<IndexFactory>* r) {
  AddIndexType(r,
               {"dram_btree", /*persistent=*/false, /*ordered=*/true, /*concurrent=*/true,
                "transient baseline: absl::btree_map under a reader-writer lock"},
               &Create);
}

}  // namespace pmindex::internal
