// kv.cc: KV and KVIterator (include/pmindex/kv.h), a pmemkv-style facade
// over Index. Nothing here touches PM directly: every read and write is an
// Index call, so persistence and crash consistency are the engine's.
//
// Range reads and iterators run Index::Scan in batches of kBatch records,
// copy each batch, then call the user's callback outside the engine (so a
// callback may write to the same store) and re-seek at the last key of the
// batch, dropping it on the next pass. The ascending, at-most-once guarantee
// of kv.h holds even if a concurrent split made a scan repeat a key: every
// key at or below the last one handed out is skipped.
//
// Thread safety: as kv.h says; a KV holds no state of its own beyond the
// index pointer, so concurrent calls are as safe as the engine's.
#include "pmindex/kv.h"

#include <deque>
#include <utility>

namespace pmindex {
namespace {

constexpr size_t kBatch = 256;

bool KeyLess(KeyKind kind, Slice a, Slice b) {
  if (kind == KeyKind::kU64) return SliceToU64(a) < SliceToU64(b);
  return a.compare(b) < 0;
}

// The smallest key an engine of this kind can hold: u64 0, or the one-byte
// string "\0" (byte keys are never empty).
std::string MinKey(KeyKind kind) {
  if (kind == KeyKind::kU64) return std::string(8, '\0');
  return std::string(1, '\0');
}

Status CheckBound(KeyKind kind, Slice b) {
  if (kind == KeyKind::kU64 && b.size() != 8)
    return Status::InvalidArgument("u64 keys are exactly 8 bytes, got " + std::to_string(b.size()));
  return Status::OK();
}

using Batch = std::vector<std::pair<std::string, std::string>>;

// Reads up to kBatch records with key >= start (> start if skip_equal) into
// *out; *more says whether the engine may hold further keys.
Status ScanBatch(Index* idx, Slice start, bool skip_equal, Batch* out, bool* more) {
  out->clear();
  size_t visited = 0;
  PMINDEX_RETURN_IF_ERROR(idx->Scan(
      start, kBatch,
      [&](Slice k, Slice v) {
        if (!(skip_equal && k == start)) out->emplace_back(std::string(k), std::string(v));
        return true;
      },
      &visited));
  *more = visited == kBatch;
  return Status::OK();
}

}  // namespace

Options KVConfig::ToOptions() const {
  Options o;
  o.pool_path = path;
  o.pool_size = size;
  o.create_if_missing = create_if_missing;
  o.error_if_exists = error_if_exists;
  o.key_kind = key_kind;
  o.value_kind = value_kind;
  o.params = params;
  return o;
}

Status KV::Open(std::string_view engine, const KVConfig& config, std::unique_ptr<KV>* out) {
  if (out == nullptr) return Status::InvalidArgument("KV::Open: null output");
  out->reset();
  std::unique_ptr<Index> idx;
  PMINDEX_RETURN_IF_ERROR(OpenIndex(engine, config.ToOptions(), &idx));
  *out = std::make_unique<KV>(std::move(idx));
  return Status::OK();
}

KV::KV(std::unique_ptr<Index> index) : index_(std::move(index)) {
  if (index_ == nullptr) return;
  if (!FindIndexInfo(index_->Name(), &info_)) info_.name = std::string(index_->Name());
  key_kind_ = index_->key_kind();
  value_kind_ = index_->value_kind();
}

KV::~KV() { close(); }

Status KV::close() {
  if (index_ == nullptr) return Status::OK();
  Status s = index_->Close();
  index_.reset();
  info_ = IndexInfo();
  return s;
}

Status KV::CheckOpen() const {
  if (index_ == nullptr) return Status::InvalidArgument("the store is closed");
  return Status::OK();
}

Status KV::CheckOrdered() const {
  PMINDEX_RETURN_IF_ERROR(CheckOpen());
  if (!info_.ordered) return Status::Unsupported("engine " + info_.name + " is a hash index: no ordered reads");
  return Status::OK();
}

Status KV::get(Slice key, std::string* value) {
  PMINDEX_RETURN_IF_ERROR(CheckOpen());
  if (value == nullptr) return Status::InvalidArgument("get: null value");
  return index_->Find(key, value);
}

Status KV::put(Slice key, Slice value) {
  PMINDEX_RETURN_IF_ERROR(CheckOpen());
  return index_->Upsert(key, value);
}

Status KV::remove(Slice key) {
  PMINDEX_RETURN_IF_ERROR(CheckOpen());
  return index_->Remove(key);
}

Status KV::exists(Slice key) {
  PMINDEX_RETURN_IF_ERROR(CheckOpen());
  std::string v;
  return index_->Find(key, &v);
}

Status KV::get_many(const std::vector<Slice>& keys, std::vector<std::string>* values, std::vector<Status>* statuses) {
  PMINDEX_RETURN_IF_ERROR(CheckOpen());
  if (values == nullptr || statuses == nullptr) return Status::InvalidArgument("get_many: null output");
  values->resize(keys.size());
  statuses->resize(keys.size());
  Status first;
  index_->FindMany(keys.data(), keys.size(), values->data(), statuses->data());
  for (size_t i = 0; i < keys.size(); i++) {
    if (!(*statuses)[i].ok()) {
      (*values)[i].clear();
      if (first.ok() && !(*statuses)[i].IsNotFound()) first = (*statuses)[i];
    }
  }
  return first;
}

Status KV::Range(const Slice* lo, const Slice* hi, KVCallback cb) {
  PMINDEX_RETURN_IF_ERROR(CheckOrdered());
  if (lo) PMINDEX_RETURN_IF_ERROR(CheckBound(key_kind_, *lo));
  if (hi) PMINDEX_RETURN_IF_ERROR(CheckBound(key_kind_, *hi));
  std::string start = lo ? std::string(*lo) : MinKey(key_kind_);
  bool skip_equal = lo != nullptr;
  if (key_kind_ == KeyKind::kBytes && start.empty()) {  // every key is > ""
    start = MinKey(key_kind_);
    skip_equal = false;
  }
  Batch batch;
  std::string last;
  bool have_last = false;
  for (;;) {
    bool more = false;
    PMINDEX_RETURN_IF_ERROR(ScanBatch(index_.get(), start, skip_equal, &batch, &more));
    for (auto& [k, v] : batch) {
      if (have_last && !KeyLess(key_kind_, last, k)) continue;
      if (hi && !KeyLess(key_kind_, k, *hi)) return Status::OK();
      if (!cb(k, v)) return Status::OK();
      last = k;
      have_last = true;
    }
    if (!more || batch.empty()) return Status::OK();
    start = batch.back().first;
    skip_equal = true;
  }
}

Status KV::count_all(uint64_t* n) {
  PMINDEX_RETURN_IF_ERROR(CheckOpen());
  if (n == nullptr) return Status::InvalidArgument("count: null output");
  *n = index_->Size();
  return Status::OK();
}

#define PMINDEX_KV_COUNT(lo, hi)                                    \
  if (n == nullptr) return Status::InvalidArgument("count: null output"); \
  *n = 0;                                                           \
  uint64_t c = 0;                                                   \
  PMINDEX_RETURN_IF_ERROR(Range(lo, hi, [&](Slice, Slice) {         \
    c++;                                                            \
    return true;                                                    \
  }));                                                              \
  *n = c;                                                           \
  return Status::OK()

Status KV::count_above(Slice key, uint64_t* n) { PMINDEX_KV_COUNT(&key, nullptr); }
Status KV::count_below(Slice key, uint64_t* n) { PMINDEX_KV_COUNT(nullptr, &key); }
Status KV::count_between(Slice lo, Slice hi, uint64_t* n) { PMINDEX_KV_COUNT(&lo, &hi); }
#undef PMINDEX_KV_COUNT

Status KV::get_all(KVCallback cb) { return Range(nullptr, nullptr, cb); }
Status KV::get_above(Slice key, KVCallback cb) { return Range(&key, nullptr, cb); }
Status KV::get_below(Slice key, KVCallback cb) { return Range(nullptr, &key, cb); }
Status KV::get_between(Slice lo, Slice hi, KVCallback cb) { return Range(&lo, &hi, cb); }

Status KV::stats(IndexStats* out) {
  PMINDEX_RETURN_IF_ERROR(CheckOpen());
  if (out == nullptr) return Status::InvalidArgument("stats: null output");
  *out = index_->Stats();
  return Status::OK();
}

Status KV::new_iterator(std::unique_ptr<KVIterator>* out) {
  if (out == nullptr) return Status::InvalidArgument("new_iterator: null output");
  out->reset();
  PMINDEX_RETURN_IF_ERROR(CheckOrdered());
  out->reset(new KVIterator(this));
  return Status::OK();
}

// ---- KVIterator ----

KVIterator::~KVIterator() = default;

Status KVIterator::Fill(Slice start, bool skip_equal) {
  batch_.clear();
  pos_ = 0;
  at_end_ = true;
  status_ = kv_->CheckOrdered();
  if (status_.ok()) status_ = CheckBound(kv_->key_kind_, start);
  if (status_.ok()) {
    bool more = false;
    status_ = ScanBatch(kv_->index_.get(), start, skip_equal, &batch_, &more);
    at_end_ = !more;
  }
  if (!status_.ok()) batch_.clear();
  return status_;
}

Status KVIterator::seek(Slice key) {
  if (kv_->key_kind_ == KeyKind::kBytes && key.empty()) return seek_to_first();
  return Fill(key, false);
}

Status KVIterator::seek_to_first() {
  std::string k = MinKey(kv_->key_kind_);
  return Fill(k, false);
}

Status KVIterator::next() {
  if (!valid()) return Status::InvalidArgument("iterator is not positioned on a record");
  if (++pos_ < batch_.size() || at_end_) return Status::OK();
  std::string last = std::move(batch_.back().first);
  for (;;) {
    PMINDEX_RETURN_IF_ERROR(Fill(last, true));
    // Drop keys a concurrent change made reappear at or below `last`.
    while (pos_ < batch_.size() && !KeyLess(kv_->key_kind_, last, batch_[pos_].first)) pos_++;
    if (valid() || at_end_) return Status::OK();
    last = std::move(batch_.back().first);
  }
}

Status KVIterator::prev() {
  if (!valid()) return Status::InvalidArgument("iterator is not positioned on a record");
  if (pos_ > 0) {
    --pos_;
    return Status::OK();
  }
  // Predecessor of the first record of the batch: read from the smallest key,
  // keeping the last kBatch records below it.
  std::string cur = std::move(batch_[0].first);
  std::deque<std::pair<std::string, std::string>> window;
  std::string start = MinKey(kv_->key_kind_);
  bool skip_equal = false;
  Batch b;
  for (bool done = false; !done;) {
    bool more = false;
    status_ = kv_->CheckOrdered();
    if (status_.ok()) status_ = ScanBatch(kv_->index_.get(), start, skip_equal, &b, &more);
    if (!status_.ok()) {
      batch_.clear();
      return status_;
    }
    for (auto& r : b) {
      if (!KeyLess(kv_->key_kind_, r.first, cur)) {
        done = true;
        break;
      }
      if (!window.empty() && !KeyLess(kv_->key_kind_, window.back().first, r.first)) continue;
      window.push_back(std::move(r));
      if (window.size() > kBatch) window.pop_front();
    }
    if (!more || b.empty()) break;
    if (!done) {
      start = window.empty() ? start : window.back().first;
      skip_equal = !window.empty();
    }
  }
  batch_.assign(std::make_move_iterator(window.begin()), std::make_move_iterator(window.end()));
  at_end_ = false;
  pos_ = batch_.empty() ? 0 : batch_.size() - 1;
  return Status::OK();
}

}  // namespace pmindex
