// store.cc: Store (store.h), memcached item semantics over pmindex::KV.
// The format, invariants, persist order (one engine write per change) and
// locking (striped key locks; thread-safe) are described in store.h; this
// file follows them.
#include "store.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <functional>

namespace pmindex::server {
namespace {

constexpr int64_t kRelativeLimit = 60 * 60 * 24 * 30;  // memcached's 30 days
thread_local std::string t_error;

bool Decode(const std::string& v, Item* out) {
  if (v.size() < sizeof(ItemHeader)) return false;
  ItemHeader h;
  std::memcpy(&h, v.data(), sizeof h);
  out->flags = h.flags;
  out->exptime = h.exptime;
  out->cas = h.cas;
  out->data.assign(v, sizeof h, std::string::npos);
  return true;
}

uint64_t WallMicros() {
  return uint64_t(std::chrono::duration_cast<std::chrono::microseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count());
}

}  // namespace

const std::string& Store::error() { return t_error; }

uint32_t Store::Now() { return uint32_t(std::time(nullptr)); }

uint32_t Store::AbsoluteExptime(int64_t exptime) {
  if (exptime == 0) return 0;
  if (exptime < 0) return 1;  // in the past: expired at once
  if (exptime <= kRelativeLimit) return uint32_t(std::min<int64_t>(Now() + exptime, UINT32_MAX));
  return uint32_t(std::min<int64_t>(exptime, UINT32_MAX));
}

Status Store::Open(const StoreConfig& c, std::unique_ptr<Store>* out) {
  Options o;
  o.pool_path = c.pool;
  o.pool_size = c.pool_size;
  o.max_pool_size = c.max_pool_size;
  o.key_kind = KeyKind::kBytes;
  o.value_kind = ValueKind::kBytes;
  o.max_key_size = 256;
  o.max_value_size = c.max_item_size + sizeof(ItemHeader);
  o.params = c.params;
  o.num_threads = c.threads + 1;  // workers and the sweeper
  std::unique_ptr<Index> idx;
  PMINDEX_RETURN_IF_ERROR(OpenIndex(c.engine, o, &idx));
  if (idx->key_kind() != KeyKind::kBytes || idx->value_kind() != ValueKind::kBytes)
    return Status::InvalidArgument("the pool holds u64 keys or values; pmindex-server needs byte keys and values");
  std::unique_ptr<Store> s(new Store());
  s->kv_ = std::make_unique<KV>(std::move(idx));
  s->max_item_size_ = c.max_item_size;
  s->serialize_ = !s->kv_->info().concurrent;
  s->stripes_.reset(new std::mutex[kStripes]);
  std::string v;
  Item flush;
  Status fs = s->EFind(kFlushKey, &v);
  if (fs.ok() && Decode(v, &flush)) s->flush_cas_.store(flush.cas);
  else if (!fs.ok() && !fs.IsNotFound()) return fs;
  s->next_cas_.store(std::max(WallMicros(), s->flush_cas_.load() + 1));
  *out = std::move(s);
  return Status::OK();
}

Store::~Store() { Close(); }

Status Store::Close() { return kv_ ? kv_->close() : Status::OK(); }

std::mutex& Store::StripeOf(Slice key) { return stripes_[std::hash<std::string_view>()(key) % kStripes]; }

Status Store::EFind(Slice key, std::string* v) {
  if (!serialize_) return kv_->get(key, v);
  std::lock_guard<std::mutex> g(engine_mu_);
  return kv_->get(key, v);
}

Status Store::EPut(Slice key, Slice v) {
  if (!serialize_) return kv_->put(key, v);
  std::lock_guard<std::mutex> g(engine_mu_);
  return kv_->put(key, v);
}

Status Store::ERemove(Slice key) {
  if (!serialize_) return kv_->remove(key);
  std::lock_guard<std::mutex> g(engine_mu_);
  return kv_->remove(key);
}

bool Store::Visible(const ItemHeader& h, uint32_t now) const {
  if (h.exptime != 0 && h.exptime <= now) return false;
  return h.cas > flush_cas_.load(std::memory_order_acquire);
}

int Store::Read(Slice key, Item* out) {
  std::string v;
  if (!EFind(key, &v).ok()) return 0;
  if (!Decode(v, out)) return -1;
  return Visible(ItemHeader{out->flags, out->exptime, out->cas}, Now()) ? 1 : -1;
}

void Store::Reclaim(Slice key) {
  std::lock_guard<std::mutex> g(StripeOf(key));
  Item it;
  if (Read(key, &it) < 0 && ERemove(key).ok()) counters_.reclaimed.fetch_add(1, std::memory_order_relaxed);
}

bool Store::Get(Slice key, Item* out) {
  int r = Read(key, out);
  if (r < 0) Reclaim(key);
  return r > 0;
}

void Store::GetMany(const std::vector<Slice>& keys, std::vector<Item>* items, std::vector<bool>* found) {
  std::vector<std::string> values;
  std::vector<Status> st;
  if (serialize_) {
    std::lock_guard<std::mutex> g(engine_mu_);
    kv_->get_many(keys, &values, &st);
  } else {
    kv_->get_many(keys, &values, &st);
  }
  items->assign(keys.size(), Item());
  found->assign(keys.size(), false);
  uint32_t now = Now();
  for (size_t i = 0; i < keys.size(); i++) {
    if (!st[i].ok()) continue;
    Item& it = (*items)[i];
    if (Decode(values[i], &it) && Visible(ItemHeader{it.flags, it.exptime, it.cas}, now)) {
      (*found)[i] = true;
    } else {
      Reclaim(keys[i]);
    }
  }
}

Reply Store::Put(Slice key, const ItemHeader& h, Slice a, Slice b) {
  if (a.size() + b.size() > max_item_size_) return Reply::kTooLarge;
  std::string v(sizeof h + a.size() + b.size(), '\0');
  std::memcpy(v.data(), &h, sizeof h);
  if (!a.empty()) std::memcpy(v.data() + sizeof h, a.data(), a.size());
  if (!b.empty()) std::memcpy(v.data() + sizeof h + a.size(), b.data(), b.size());
  Status s = EPut(key, v);
  if (s.ok()) return Reply::kStored;
  if (s.IsPoolFull()) return Reply::kOutOfMemory;
  t_error = s.ToString();
  return Reply::kError;
}

Reply Store::Write(Mode mode, Slice key, uint32_t flags, uint32_t exptime, Slice data, uint64_t cas_in,
                   uint64_t* cas_out) {
  if (data.size() > max_item_size_) return Reply::kTooLarge;
  std::lock_guard<std::mutex> g(StripeOf(key));
  Item old;
  bool have = Read(key, &old) > 0;
  ItemHeader h{flags, exptime, 0};
  Slice a = data, b;
  switch (mode) {
    case Mode::kSet: break;
    case Mode::kAdd:
      if (have) return Reply::kNotStored;
      break;
    case Mode::kReplace:
      if (!have) return Reply::kNotStored;
      break;
    case Mode::kAppend:
    case Mode::kPrepend:
      if (!have) return Reply::kNotStored;
      h.flags = old.flags;
      h.exptime = old.exptime;
      a = mode == Mode::kAppend ? Slice(old.data) : data;
      b = mode == Mode::kAppend ? data : Slice(old.data);
      break;
    case Mode::kCas:
      if (!have) return Reply::kNotFound;
      if (old.cas != cas_in) return Reply::kExists;
      break;
  }
  h.cas = next_cas_.fetch_add(1, std::memory_order_relaxed);
  if (cas_out != nullptr) *cas_out = h.cas;
  return Put(key, h, a, b);
}

Reply Store::Delete(Slice key, uint64_t cas_in) {
  std::lock_guard<std::mutex> g(StripeOf(key));
  Item old;
  int r = Read(key, &old);
  if (r == 0) return Reply::kNotFound;
  if (r > 0 && cas_in != 0 && old.cas != cas_in) return Reply::kExists;
  Status s = ERemove(key);
  if (!s.ok() && !s.IsNotFound()) {
    t_error = s.ToString();
    return Reply::kError;
  }
  if (r < 0) {
    counters_.reclaimed.fetch_add(1, std::memory_order_relaxed);
    return Reply::kNotFound;
  }
  return Reply::kDeleted;
}

Reply Store::Arith(Slice key, bool incr, uint64_t delta, uint64_t* result) {
  std::lock_guard<std::mutex> g(StripeOf(key));
  Item old;
  if (Read(key, &old) <= 0) return Reply::kNotFound;
  // memcached accepts decimal digits, optionally followed by spaces.
  size_t n = 0;
  uint64_t v = 0;
  while (n < old.data.size() && old.data[n] >= '0' && old.data[n] <= '9') {
    uint64_t d = uint64_t(old.data[n] - '0');
    if (v > (UINT64_MAX - d) / 10) return Reply::kNonNumeric;
    v = v * 10 + d;
    n++;
  }
  if (n == 0) return Reply::kNonNumeric;
  for (size_t i = n; i < old.data.size(); i++)
    if (old.data[i] != ' ') return Reply::kNonNumeric;
  v = incr ? v + delta : (delta > v ? 0 : v - delta);  // incr wraps at 2^64, decr stops at 0
  std::string text = std::to_string(v);
  ItemHeader h{old.flags, old.exptime, next_cas_.fetch_add(1, std::memory_order_relaxed)};
  Reply r = Put(key, h, text, Slice());
  if (r == Reply::kStored) *result = v;
  return r;
}

Reply Store::Touch(Slice key, uint32_t exptime, Item* out) {
  std::lock_guard<std::mutex> g(StripeOf(key));
  Item old;
  if (Read(key, &old) <= 0) return Reply::kNotFound;
  Reply r = Put(key, ItemHeader{old.flags, exptime, old.cas}, old.data, Slice());
  if (r != Reply::kStored) return r;
  if (out != nullptr) {
    old.exptime = exptime;
    *out = std::move(old);
  }
  return Reply::kTouched;
}

Status Store::FlushAll() {
  // Every cas handed out so far is < next; writes that take a cas from now
  // on stay visible.
  uint64_t threshold = next_cas_.fetch_add(1, std::memory_order_relaxed);
  ItemHeader h{0, 0, threshold};
  std::string v(reinterpret_cast<const char*>(&h), sizeof h);
  std::lock_guard<std::mutex> g(StripeOf(kFlushKey));
  PMINDEX_RETURN_IF_ERROR(EPut(kFlushKey, v));
  uint64_t cur = flush_cas_.load();
  while (cur < threshold && !flush_cas_.compare_exchange_weak(cur, threshold)) {
  }
  return Status::OK();
}

Status Store::Sweep() {
  if (!kv_->info().ordered) return Status::Unsupported("hash engine: expired items are reclaimed lazily only");
  constexpr size_t kVisitBatch = 4096;
  std::string last;
  bool started = false;
  for (;;) {
    std::vector<std::string> dead;
    size_t visited = 0;
    std::string next_last;
    uint32_t now = Now();
    auto cb = [&](Slice k, Slice v) {
      next_last.assign(k);
      visited++;
      if (!k.empty() && k[0] != '\n' && v.size() >= sizeof(ItemHeader)) {
        ItemHeader h;
        std::memcpy(&h, v.data(), sizeof h);
        if (!Visible(h, now)) dead.emplace_back(k);
      }
      return visited < kVisitBatch;
    };
    Status s;
    if (serialize_) {
      std::lock_guard<std::mutex> g(engine_mu_);
      s = started ? kv_->get_above(last, cb) : kv_->get_all(cb);
    } else {
      s = started ? kv_->get_above(last, cb) : kv_->get_all(cb);
    }
    PMINDEX_RETURN_IF_ERROR(s);
    for (const auto& k : dead) Reclaim(k);
    if (visited < kVisitBatch) break;
    last = std::move(next_last);
    started = true;
  }
  counters_.sweeps.fetch_add(1, std::memory_order_relaxed);
  return Status::OK();
}

uint64_t Store::Items() {
  uint64_t n = 0;
  if (serialize_) {
    std::lock_guard<std::mutex> g(engine_mu_);
    kv_->count_all(&n);
  } else {
    kv_->count_all(&n);
  }
  std::string v;
  if (n > 0 && EFind(kFlushKey, &v).ok()) n--;
  return n;
}

}  // namespace pmindex::server
