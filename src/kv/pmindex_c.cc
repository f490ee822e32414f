// pmindex_c.cc: the C API (include/pmindex/pmindex_c.h) over pmindex::KV.
//
// Every entry point catches C++ exceptions (bad_alloc becomes
// PMINDEX_OUT_OF_MEMORY, anything else PMINDEX_INTERNAL_ERROR) so none crosses
// into C, and records the message of a failure in a thread-local string that
// pmindex_errormsg returns. Status codes map one to one (the enum values
// equal Status::Code's).
//
// Thread safety: as KV; the error message is per thread.
#include "pmindex/pmindex_c.h"

#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "pmindex/kv.h"

using pmindex::KV;
using pmindex::KVConfig;
using pmindex::KVIterator;
using pmindex::Slice;
using pmindex::Status;

struct pmindex_config {
  KVConfig cfg;
};
struct pmindex_db {
  std::unique_ptr<KV> kv;
};
struct pmindex_iterator {
  std::unique_ptr<KVIterator> it;
};

namespace {

thread_local std::string tls_error;

pmindex_status Fail(pmindex_status code, std::string msg) {
  tls_error = std::move(msg);
  return code;
}

pmindex_status Ret(const Status& s) {
  if (s.ok()) return PMINDEX_OK;
  tls_error = s.ToString();
  return static_cast<pmindex_status>(s.code());
}

template <typename F>
pmindex_status Guard(F&& f) {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return Fail(PMINDEX_OUT_OF_MEMORY, "out of memory");
  } catch (const std::exception& e) {
    return Fail(PMINDEX_INTERNAL_ERROR, e.what());
  } catch (...) {
    return Fail(PMINDEX_INTERNAL_ERROR, "unknown exception");
  }
}

pmindex_status NullArg(const char* what) { return Fail(PMINDEX_INVALID_ARGUMENT, std::string("null ") + what); }

// A (pointer, length) pair as a Slice; a null pointer is only valid with length 0.
bool MakeSlice(const char* p, size_t n, Slice* out) {
  if (p == nullptr && n != 0) return false;
  *out = p ? Slice(p, n) : Slice();
  return true;
}

#define PMINDEX_C_SLICE(var, p, n) \
  Slice var;                       \
  if (!MakeSlice(p, n, &var)) return NullArg(#p)

#define PMINDEX_C_DB(db) \
  if ((db) == nullptr || !(db)->kv) return NullArg("db")

}  // namespace

extern "C" {

const char* pmindex_errormsg(void) { return tls_error.c_str(); }

const char* pmindex_status_name(pmindex_status s) {
  switch (s) {
    case PMINDEX_OUT_OF_MEMORY: return "OutOfMemory";
    case PMINDEX_INTERNAL_ERROR: return "InternalError";
    default:
      if (s >= PMINDEX_OK && s <= PMINDEX_BUSY) return Status::CodeName(static_cast<Status::Code>(s));
      return "Unknown";
  }
}

size_t pmindex_engine_count(void) {
  try {
    return pmindex::ListIndexes().size();
  } catch (...) {
    return 0;
  }
}

const char* pmindex_engine_info(size_t i, int* ordered, int* persistent, int* concurrent) {
  // ListIndexes returns copies; the names live in a static list built once.
  static const std::vector<pmindex::IndexInfo>* infos = new std::vector<pmindex::IndexInfo>(pmindex::ListIndexes());
  if (i >= infos->size()) return nullptr;
  const auto& info = (*infos)[i];
  if (ordered) *ordered = info.ordered;
  if (persistent) *persistent = info.persistent;
  if (concurrent) *concurrent = info.concurrent;
  return info.name.c_str();
}

pmindex_config* pmindex_config_new(void) { return new (std::nothrow) pmindex_config(); }
void pmindex_config_delete(pmindex_config* cfg) { delete cfg; }

pmindex_status pmindex_config_set_path(pmindex_config* cfg, const char* path) {
  if (!cfg) return NullArg("cfg");
  if (!path) return NullArg("path");
  return Guard([&] {
    cfg->cfg.path = path;
    return PMINDEX_OK;
  });
}
pmindex_status pmindex_config_set_size(pmindex_config* cfg, uint64_t bytes) {
  if (!cfg) return NullArg("cfg");
  cfg->cfg.size = bytes;
  return PMINDEX_OK;
}
pmindex_status pmindex_config_set_create_if_missing(pmindex_config* cfg, int on) {
  if (!cfg) return NullArg("cfg");
  cfg->cfg.create_if_missing = on != 0;
  return PMINDEX_OK;
}
pmindex_status pmindex_config_set_error_if_exists(pmindex_config* cfg, int on) {
  if (!cfg) return NullArg("cfg");
  cfg->cfg.error_if_exists = on != 0;
  return PMINDEX_OK;
}
pmindex_status pmindex_config_set_key_kind(pmindex_config* cfg, pmindex_kind kind) {
  if (!cfg) return NullArg("cfg");
  if (kind != PMINDEX_KIND_U64 && kind != PMINDEX_KIND_BYTES) return Fail(PMINDEX_INVALID_ARGUMENT, "bad key kind");
  cfg->cfg.key_kind = kind == PMINDEX_KIND_U64 ? pmindex::KeyKind::kU64 : pmindex::KeyKind::kBytes;
  return PMINDEX_OK;
}
pmindex_status pmindex_config_set_value_kind(pmindex_config* cfg, pmindex_kind kind) {
  if (!cfg) return NullArg("cfg");
  if (kind != PMINDEX_KIND_U64 && kind != PMINDEX_KIND_BYTES) return Fail(PMINDEX_INVALID_ARGUMENT, "bad value kind");
  cfg->cfg.value_kind = kind == PMINDEX_KIND_U64 ? pmindex::ValueKind::kU64 : pmindex::ValueKind::kBytes;
  return PMINDEX_OK;
}
pmindex_status pmindex_config_set_param(pmindex_config* cfg, const char* name, const char* value) {
  if (!cfg) return NullArg("cfg");
  if (!name || !value) return NullArg("name or value");
  return Guard([&] {
    cfg->cfg.params[name] = value;
    return PMINDEX_OK;
  });
}

pmindex_status pmindex_open(const char* engine, const pmindex_config* cfg, pmindex_db** db) {
  if (!db) return NullArg("db");
  *db = nullptr;
  return Guard([&] {
    KVConfig def;
    auto out = std::make_unique<pmindex_db>();
    pmindex_status r = Ret(KV::Open(engine ? engine : "", cfg ? cfg->cfg : def, &out->kv));
    if (r == PMINDEX_OK) *db = out.release();
    return r;
  });
}

pmindex_status pmindex_close(pmindex_db* db) {
  if (!db) return PMINDEX_OK;
  pmindex_status r = Guard([&] { return db->kv ? Ret(db->kv->close()) : PMINDEX_OK; });
  delete db;
  return r;
}

const char* pmindex_engine(pmindex_db* db) { return db && db->kv ? db->kv->info().name.c_str() : ""; }
int pmindex_is_ordered(pmindex_db* db) { return db && db->kv && db->kv->info().ordered; }
pmindex_kind pmindex_key_kind(pmindex_db* db) {
  return db && db->kv && db->kv->key_kind() == pmindex::KeyKind::kU64 ? PMINDEX_KIND_U64 : PMINDEX_KIND_BYTES;
}
pmindex_kind pmindex_value_kind(pmindex_db* db) {
  return db && db->kv && db->kv->value_kind() == pmindex::ValueKind::kU64 ? PMINDEX_KIND_U64 : PMINDEX_KIND_BYTES;
}

pmindex_status pmindex_put(pmindex_db* db, const char* key, size_t key_len, const char* value, size_t value_len) {
  PMINDEX_C_DB(db);
  PMINDEX_C_SLICE(k, key, key_len);
  PMINDEX_C_SLICE(v, value, value_len);
  return Guard([&] { return Ret(db->kv->put(k, v)); });
}

pmindex_status pmindex_remove(pmindex_db* db, const char* key, size_t key_len) {
  PMINDEX_C_DB(db);
  PMINDEX_C_SLICE(k, key, key_len);
  return Guard([&] { return Ret(db->kv->remove(k)); });
}

pmindex_status pmindex_exists(pmindex_db* db, const char* key, size_t key_len) {
  PMINDEX_C_DB(db);
  PMINDEX_C_SLICE(k, key, key_len);
  return Guard([&] { return Ret(db->kv->exists(k)); });
}

pmindex_status pmindex_get(pmindex_db* db, const char* key, size_t key_len, pmindex_value_callback* cb, void* arg) {
  PMINDEX_C_DB(db);
  PMINDEX_C_SLICE(k, key, key_len);
  if (!cb) return NullArg("cb");
  return Guard([&] {
    std::string v;
    pmindex_status r = Ret(db->kv->get(k, &v));
    if (r == PMINDEX_OK) cb(v.data(), v.size(), arg);
    return r;
  });
}

pmindex_status pmindex_get_copy(pmindex_db* db, const char* key, size_t key_len, char* buf, size_t buf_size,
                                size_t* value_len) {
  PMINDEX_C_DB(db);
  PMINDEX_C_SLICE(k, key, key_len);
  if (!buf && buf_size) return NullArg("buf");
  return Guard([&] {
    std::string v;
    pmindex_status r = Ret(db->kv->get(k, &v));
    if (r != PMINDEX_OK) return r;
    if (value_len) *value_len = v.size();
    if (buf_size) std::memcpy(buf, v.data(), v.size() < buf_size ? v.size() : buf_size);
    if (v.size() > buf_size)
      return Fail(PMINDEX_INVALID_ARGUMENT, "value of " + std::to_string(v.size()) + " bytes does not fit the buffer");
    return PMINDEX_OK;
  });
}

pmindex_status pmindex_get_many(pmindex_db* db, size_t n, const char* const* keys, const size_t* key_lens,
                                pmindex_many_callback* cb, void* arg) {
  PMINDEX_C_DB(db);
  if (n && (!keys || !key_lens)) return NullArg("keys");
  if (!cb) return NullArg("cb");
  return Guard([&] {
    std::vector<Slice> ks(n);
    for (size_t i = 0; i < n; i++)
      if (!MakeSlice(keys[i], key_lens[i], &ks[i])) return NullArg("key");
    std::vector<std::string> vs;
    std::vector<Status> ss;
    Status s = db->kv->get_many(ks, &vs, &ss);
    for (size_t i = 0; i < n; i++) cb(i, static_cast<pmindex_status>(ss[i].code()), vs[i].data(), vs[i].size(), arg);
    return Ret(s);
  });
}

pmindex_status pmindex_count_all(pmindex_db* db, uint64_t* count) {
  PMINDEX_C_DB(db);
  if (!count) return NullArg("count");
  return Guard([&] { return Ret(db->kv->count_all(count)); });
}
pmindex_status pmindex_count_above(pmindex_db* db, const char* key, size_t key_len, uint64_t* count) {
  PMINDEX_C_DB(db);
  PMINDEX_C_SLICE(k, key, key_len);
  if (!count) return NullArg("count");
  return Guard([&] { return Ret(db->kv->count_above(k, count)); });
}
pmindex_status pmindex_count_below(pmindex_db* db, const char* key, size_t key_len, uint64_t* count) {
  PMINDEX_C_DB(db);
  PMINDEX_C_SLICE(k, key, key_len);
  if (!count) return NullArg("count");
  return Guard([&] { return Ret(db->kv->count_below(k, count)); });
}
pmindex_status pmindex_count_between(pmindex_db* db, const char* lo, size_t lo_len, const char* hi, size_t hi_len,
                                     uint64_t* count) {
  PMINDEX_C_DB(db);
  PMINDEX_C_SLICE(l, lo, lo_len);
  PMINDEX_C_SLICE(h, hi, hi_len);
  if (!count) return NullArg("count");
  return Guard([&] { return Ret(db->kv->count_between(l, h, count)); });
}

#define PMINDEX_C_VISIT [&](Slice k, Slice v) { return cb(k.data(), k.size(), v.data(), v.size(), arg) == 0; }

pmindex_status pmindex_get_all(pmindex_db* db, pmindex_kv_callback* cb, void* arg) {
  PMINDEX_C_DB(db);
  if (!cb) return NullArg("cb");
  return Guard([&] { return Ret(db->kv->get_all(PMINDEX_C_VISIT)); });
}
pmindex_status pmindex_get_above(pmindex_db* db, const char* key, size_t key_len, pmindex_kv_callback* cb, void* arg) {
  PMINDEX_C_DB(db);
  PMINDEX_C_SLICE(k0, key, key_len);
  if (!cb) return NullArg("cb");
  return Guard([&] { return Ret(db->kv->get_above(k0, PMINDEX_C_VISIT)); });
}
pmindex_status pmindex_get_below(pmindex_db* db, const char* key, size_t key_len, pmindex_kv_callback* cb, void* arg) {
  PMINDEX_C_DB(db);
  PMINDEX_C_SLICE(k0, key, key_len);
  if (!cb) return NullArg("cb");
  return Guard([&] { return Ret(db->kv->get_below(k0, PMINDEX_C_VISIT)); });
}
pmindex_status pmindex_get_between(pmindex_db* db, const char* lo, size_t lo_len, const char* hi, size_t hi_len,
                                   pmindex_kv_callback* cb, void* arg) {
  PMINDEX_C_DB(db);
  PMINDEX_C_SLICE(l, lo, lo_len);
  PMINDEX_C_SLICE(h, hi, hi_len);
  if (!cb) return NullArg("cb");
  return Guard([&] { return Ret(db->kv->get_between(l, h, PMINDEX_C_VISIT)); });
}
#undef PMINDEX_C_VISIT

pmindex_status pmindex_iterator_new(pmindex_db* db, pmindex_iterator** it) {
  PMINDEX_C_DB(db);
  if (!it) return NullArg("it");
  *it = nullptr;
  return Guard([&] {
    auto out = std::make_unique<pmindex_iterator>();
    pmindex_status r = Ret(db->kv->new_iterator(&out->it));
    if (r == PMINDEX_OK) *it = out.release();
    return r;
  });
}
void pmindex_iterator_delete(pmindex_iterator* it) { delete it; }

#define PMINDEX_C_IT(it) \
  if ((it) == nullptr || !(it)->it) return NullArg("iterator")

pmindex_status pmindex_iterator_seek(pmindex_iterator* it, const char* key, size_t key_len) {
  PMINDEX_C_IT(it);
  PMINDEX_C_SLICE(k, key, key_len);
  return Guard([&] { return Ret(it->it->seek(k)); });
}
pmindex_status pmindex_iterator_seek_to_first(pmindex_iterator* it) {
  PMINDEX_C_IT(it);
  return Guard([&] { return Ret(it->it->seek_to_first()); });
}
pmindex_status pmindex_iterator_next(pmindex_iterator* it) {
  PMINDEX_C_IT(it);
  return Guard([&] { return Ret(it->it->next()); });
}
pmindex_status pmindex_iterator_prev(pmindex_iterator* it) {
  PMINDEX_C_IT(it);
  return Guard([&] { return Ret(it->it->prev()); });
}
int pmindex_iterator_is_valid(const pmindex_iterator* it) { return it && it->it && it->it->valid(); }
pmindex_status pmindex_iterator_key(const pmindex_iterator* it, const char** key, size_t* key_len) {
  if (!pmindex_iterator_is_valid(it)) return Fail(PMINDEX_INVALID_ARGUMENT, "iterator is not on a record");
  if (!key || !key_len) return NullArg("key");
  *key = it->it->key().data();
  *key_len = it->it->key().size();
  return PMINDEX_OK;
}
pmindex_status pmindex_iterator_value(const pmindex_iterator* it, const char** value, size_t* value_len) {
  if (!pmindex_iterator_is_valid(it)) return Fail(PMINDEX_INVALID_ARGUMENT, "iterator is not on a record");
  if (!value || !value_len) return NullArg("value");
  *value = it->it->value().data();
  *value_len = it->it->value().size();
  return PMINDEX_OK;
}
pmindex_status pmindex_iterator_status(const pmindex_iterator* it) {
  if (!it || !it->it) return PMINDEX_INVALID_ARGUMENT;
  const Status& s = it->it->status();
  return static_cast<pmindex_status>(s.code());
}

}  // extern "C"
