// index_tree.h: a pmindex::Index behind the PiBench tree_api ABI.
//
// Shared by the libpibench_NAME.so plugins (plugin.cc) and by pmbench, which
// drives built-in indexes through this same adapter so that a built-in run
// and a plugin run of one index pay exactly the same call overhead.
//
// Invariants: the tree owns its Index; deleting the tree closes the index and
// with it the pool (a clean shutdown). Records handed out by scan are
// key_size + value_size bytes each: shorter byte keys/values are zero-padded,
// longer ones truncated (the ABI has fixed-size records; pmbench always uses
// exactly key_size/value_size). No PM is written here: persistence is the
// index's business, through the pm:: primitives.
#pragma once

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "pmindex/index.h"
#include "pmindex/pibench_abi.h"
#include "pmindex/pm/pool.h"

namespace pmindex::pibench {

class IndexTree final : public tree_api {
 public:
  IndexTree(std::unique_ptr<Index> index, size_t key_size, size_t value_size)
      : index_(std::move(index)), key_size_(key_size), value_size_(value_size) {}
  ~IndexTree() override {
    if (index_) {
      Status s = index_->Close();
      if (!s.ok()) std::fprintf(stderr, "pibench: closing %s: %s\n", std::string(index_->Name()).c_str(), s.ToString().c_str());
    }
  }

  bool find(const char* key, size_t sz, char* value_out) override {
    if (!key) return false;
    thread_local std::string buf;
    if (!index_->Find(Slice(key, sz), &buf).ok()) return false;
    if (value_out) CopyPadded(value_out, value_size_, buf.data(), buf.size());
    return true;
  }
  bool insert(const char* key, size_t key_sz, const char* value, size_t value_sz) override {
    if (!key || (!value && value_sz)) return false;
    return index_->Insert(Slice(key, key_sz), Slice(value, value_sz)).ok();
  }
  bool update(const char* key, size_t key_sz, const char* value, size_t value_sz) override {
    if (!key || (!value && value_sz)) return false;
    return index_->Update(Slice(key, key_sz), Slice(value, value_sz)).ok();
  }
  bool remove(const char* key, size_t key_sz) override {
    if (!key) return false;
    return index_->Remove(Slice(key, key_sz)).ok();
  }
  int scan(const char* key, size_t key_sz, int scan_sz, char*& values_out) override {
    thread_local std::vector<char> buf;
    const size_t rec = key_size_ + value_size_;
    size_t want = scan_sz > 0 ? size_t(scan_sz) : 0;
    if (buf.size() < want * rec) buf.resize(want * rec);
    values_out = buf.data();
    if (!key || want == 0) return 0;
    size_t n = 0;
    char* out = buf.data();
    Status s = index_->Scan(Slice(key, key_sz), want, [&](Slice k, Slice v) {
      CopyPadded(out + n * rec, key_size_, k.data(), k.size());
      CopyPadded(out + n * rec + key_size_, value_size_, v.data(), v.size());
      return ++n < want;
    });
    return s.ok() ? int(n) : 0;
  }

  Index* index() const { return index_.get(); }
  // Closes the index now (recovery measurements); the tree is unusable after.
  Status Close() {
    Status s = index_ ? index_->Close() : Status::OK();
    index_.reset();
    return s;
  }

 private:
  static void CopyPadded(char* dst, size_t dst_size, const char* src, size_t n) {
    size_t c = n < dst_size ? n : dst_size;
    if (c) std::memcpy(dst, src, c);
    if (c < dst_size) std::memset(dst + c, 0, dst_size - c);
  }

  std::unique_ptr<Index> index_;
  size_t key_size_, value_size_;
};

// Maps PiBench options onto pmindex Options: 8-byte keys/values are the u64
// kinds, any other size the byte-string kinds. An existing pool_path is opened
// (and recovered); otherwise a pool of pool_size bytes is created (an empty
// path gives a temporary pool in /dev/shm, removed when the tree is deleted).
inline Status MakeOptions(const tree_options_t& o, Options* out) {
  if (o.key_size == 0 || o.key_size > kMaxKeySize)
    return Status::InvalidArgument("key_size " + std::to_string(o.key_size) + " not in [1, " + std::to_string(kMaxKeySize) + "]");
  if (o.value_size == 0 || o.value_size > kMaxValueSize)
    return Status::InvalidArgument("value_size " + std::to_string(o.value_size) + " not in [1, " +
                                   std::to_string(kMaxValueSize) + "]");
  Options opt;
  opt.pool_path = o.pool_path;
  if (o.pool_size) opt.pool_size = o.pool_size;
  opt.key_kind = o.key_size == 8 ? KeyKind::kU64 : KeyKind::kBytes;
  opt.value_kind = o.value_size == 8 ? ValueKind::kU64 : ValueKind::kBytes;
  opt.num_threads = o.num_threads ? int(o.num_threads) : 1;
  *out = opt;
  return Status::OK();
}

// Opens or creates index `name` for the given PiBench options.
inline Status OpenIndexTree(const std::string& name, const tree_options_t& o, const Options* base,
                            std::unique_ptr<IndexTree>* out) {
  IndexInfo info;
  if (!FindIndexInfo(name, &info)) {
    std::string s = "index '" + name + "' is not registered in this build (built-in:";
    for (const auto& i : ListIndexes()) s += " " + i.name;
    return Status::InvalidArgument(s + ")");
  }
  Options opt;
  PMINDEX_RETURN_IF_ERROR(MakeOptions(o, &opt));
  if (base) {  // pmbench passes extra knobs (params, max pool size)
    opt.params = base->params;
    opt.max_pool_size = base->max_pool_size;
  }
  std::unique_ptr<Index> idx;
  PMINDEX_RETURN_IF_ERROR(OpenIndex(name, opt, &idx));
  const bool want_u64_key = o.key_size == 8, want_u64_value = o.value_size == 8;
  if ((idx->key_kind() == KeyKind::kU64) != want_u64_key || (idx->value_kind() == ValueKind::kU64) != want_u64_value) {
    idx->Close();
    return Status::InvalidArgument("pool " + o.pool_path + " holds " +
                                   (idx->key_kind() == KeyKind::kU64 ? "u64" : "byte") + " keys and " +
                                   (idx->value_kind() == ValueKind::kU64 ? "u64" : "byte") +
                                   " values, which do not match key_size " + std::to_string(o.key_size) +
                                   " / value_size " + std::to_string(o.value_size));
  }
  out->reset(new IndexTree(std::move(idx), o.key_size, o.value_size));
  return Status::OK();
}

}  // namespace pmindex::pibench
