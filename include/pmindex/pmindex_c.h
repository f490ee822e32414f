/* pmindex/pmindex_c.h: the C API of pmindex, for C programs and for bindings
 * of other languages. It mirrors pmindex::KV (pmindex/kv.h), whose comment
 * states the semantics and the consistency guarantee of range reads and
 * iterators; docs/kv.md describes both.
 *
 * Conventions: every function that can fail returns a pmindex_status
 * (PMINDEX_OK is 0); on failure pmindex_errormsg() gives a message for the
 * calling thread's last failure. Handles are opaque. Keys and values are
 * (pointer, length) byte strings; on a u64-key store a key is 8 native-endian
 * bytes. Pointers handed to callbacks are valid during the callback only.
 * Callbacks return 0 to continue and nonzero to stop.
 *
 * Thread safety: as pmindex::KV. A pmindex_db may be shared by threads when its
 * engine is concurrent; pmindex_close must not race with other calls on it. An
 * iterator belongs to one thread and must be deleted before its db is closed.
 *
 * ABI: the functions and enum values below only grow; removing or changing
 * one bumps the library's SOVERSION (docs/kv.md). */
#ifndef PMINDEX_PMINDEX_C_H_
#define PMINDEX_PMINDEX_C_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Same values as pmindex::Status::Code, plus two for C-only failures. */
typedef enum pmindex_status {
  PMINDEX_OK = 0,
  PMINDEX_NOT_FOUND = 1,
  PMINDEX_ALREADY_EXISTS = 2,
  PMINDEX_INVALID_ARGUMENT = 3,
  PMINDEX_POOL_FULL = 4,
  PMINDEX_CORRUPT = 5,
  PMINDEX_UNSUPPORTED = 6,
  PMINDEX_IO_ERROR = 7,
  PMINDEX_BUSY = 8,
  PMINDEX_OUT_OF_MEMORY = 64,
  PMINDEX_INTERNAL_ERROR = 65 /* an unexpected C++ exception */
} pmindex_status;

typedef enum pmindex_kind { PMINDEX_KIND_U64 = 0, PMINDEX_KIND_BYTES = 1 } pmindex_kind;

typedef struct pmindex_config pmindex_config;
typedef struct pmindex_db pmindex_db;
typedef struct pmindex_iterator pmindex_iterator;

typedef int pmindex_kv_callback(const char* key, size_t key_len, const char* value, size_t value_len, void* arg);
typedef void pmindex_value_callback(const char* value, size_t value_len, void* arg);
/* One answer of pmindex_get_many: index i of the batch, its status, its value. */
typedef void pmindex_many_callback(size_t i, pmindex_status status, const char* value, size_t value_len, void* arg);

/* The calling thread's last error message ("" if none). */
const char* pmindex_errormsg(void);
/* A static name for a status code, e.g. "NotFound". */
const char* pmindex_status_name(pmindex_status s);

/* Engines built into the library. */
size_t pmindex_engine_count(void);
/* Name of engine i (NULL if out of range); *ordered, *persistent, *concurrent
 * (each may be NULL) receive its facts. */
const char* pmindex_engine_info(size_t i, int* ordered, int* persistent, int* concurrent);

/* Configuration (defaults: temporary pool, 64 MiB, create if missing, byte
 * keys and values). */
pmindex_config* pmindex_config_new(void);
void pmindex_config_delete(pmindex_config* cfg);
pmindex_status pmindex_config_set_path(pmindex_config* cfg, const char* path);
pmindex_status pmindex_config_set_size(pmindex_config* cfg, uint64_t bytes);
pmindex_status pmindex_config_set_create_if_missing(pmindex_config* cfg, int on);
pmindex_status pmindex_config_set_error_if_exists(pmindex_config* cfg, int on);
pmindex_status pmindex_config_set_key_kind(pmindex_config* cfg, pmindex_kind kind);
pmindex_status pmindex_config_set_value_kind(pmindex_config* cfg, pmindex_kind kind);
/* An engine parameter, e.g. ("leaf_size", "56"). */
pmindex_status pmindex_config_set_param(pmindex_config* cfg, const char* name, const char* value);

/* Opens a store; engine NULL or "" accepts the engine that owns the pool. The
 * config is not consumed. */
pmindex_status pmindex_open(const char* engine, const pmindex_config* cfg, pmindex_db** db);
/* Closes the store and frees the handle (NULL is accepted). */
pmindex_status pmindex_close(pmindex_db* db);
/* The engine's name; whether it is ordered; its key and value kinds. */
const char* pmindex_engine(pmindex_db* db);
int pmindex_is_ordered(pmindex_db* db);
pmindex_kind pmindex_key_kind(pmindex_db* db);
pmindex_kind pmindex_value_kind(pmindex_db* db);

pmindex_status pmindex_put(pmindex_db* db, const char* key, size_t key_len, const char* value, size_t value_len);
pmindex_status pmindex_remove(pmindex_db* db, const char* key, size_t key_len);
pmindex_status pmindex_exists(pmindex_db* db, const char* key, size_t key_len);
/* Calls cb with the value. */
pmindex_status pmindex_get(pmindex_db* db, const char* key, size_t key_len, pmindex_value_callback* cb, void* arg);
/* Copies the value into buf; *value_len receives its full length. A value
 * longer than buf_size is cut and PMINDEX_INVALID_ARGUMENT returned. */
pmindex_status pmindex_get_copy(pmindex_db* db, const char* key, size_t key_len, char* buf, size_t buf_size,
                                size_t* value_len);
/* Batched get of n keys: cb runs once per key, in order. Returns PMINDEX_OK when
 * every lookup ran (some may be NOT_FOUND), else the first other error. */
pmindex_status pmindex_get_many(pmindex_db* db, size_t n, const char* const* keys, const size_t* key_lens,
                                pmindex_many_callback* cb, void* arg);

pmindex_status pmindex_count_all(pmindex_db* db, uint64_t* count);
pmindex_status pmindex_count_above(pmindex_db* db, const char* key, size_t key_len, uint64_t* count);
pmindex_status pmindex_count_below(pmindex_db* db, const char* key, size_t key_len, uint64_t* count);
pmindex_status pmindex_count_between(pmindex_db* db, const char* lo, size_t lo_len, const char* hi, size_t hi_len,
                                     uint64_t* count);
pmindex_status pmindex_get_all(pmindex_db* db, pmindex_kv_callback* cb, void* arg);
pmindex_status pmindex_get_above(pmindex_db* db, const char* key, size_t key_len, pmindex_kv_callback* cb, void* arg);
pmindex_status pmindex_get_below(pmindex_db* db, const char* key, size_t key_len, pmindex_kv_callback* cb, void* arg);
pmindex_status pmindex_get_between(pmindex_db* db, const char* lo, size_t lo_len, const char* hi, size_t hi_len,
                                   pmindex_kv_callback* cb, void* arg);

/* Iterators (ordered engines; PMINDEX_UNSUPPORTED on hash engines). */
pmindex_status pmindex_iterator_new(pmindex_db* db, pmindex_iterator** it);
void pmindex_iterator_delete(pmindex_iterator* it);
pmindex_status pmindex_iterator_seek(pmindex_iterator* it, const char* key, size_t key_len);
pmindex_status pmindex_iterator_seek_to_first(pmindex_iterator* it);
pmindex_status pmindex_iterator_next(pmindex_iterator* it);
pmindex_status pmindex_iterator_prev(pmindex_iterator* it);
int pmindex_iterator_is_valid(const pmindex_iterator* it);
/* The current key / value (valid until the iterator moves); INVALID_ARGUMENT
 * if the iterator is not on a record. */
pmindex_status pmindex_iterator_key(const pmindex_iterator* it, const char** key, size_t* key_len);
pmindex_status pmindex_iterator_value(const pmindex_iterator* it, const char** value, size_t* value_len);
/* The error that stopped the iterator, PMINDEX_OK otherwise. */
pmindex_status pmindex_iterator_status(const pmindex_iterator* it);

#ifdef __cplusplus
}
#endif

#endif /* PMINDEX_PMINDEX_C_H_ */
