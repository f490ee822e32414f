/* kv_c_test.c: the C API (include/pmindex/pmindex_c.h) from C, linked against
 * libpmindex.so (public symbols only). For every engine: put/get/exists/remove,
 * get_copy with a short buffer, get_many, counts and range reads on ordered
 * engines, iterators, UNSUPPORTED on hash engines, reopen, bad input and error
 * messages. Exits 0 on success; prints each failed check. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pmindex/pmindex_c.h"

static int failures = 0;

#define CHECK(cond)                                                                   \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      fprintf(stderr, "%s:%d: check failed: %s (%s)\n", __FILE__, __LINE__, #cond,    \
              pmindex_errormsg());                                                    \
      failures++;                                                                     \
    }                                                                                 \
  } while (0)

struct collect {
  int n;
  char last[64];
};

static int collect_cb(const char* k, size_t kl, const char* v, size_t vl, void* arg) {
  struct collect* c = arg;
  (void)v;
  (void)vl;
  c->n++;
  if (kl < sizeof c->last) {
    memcpy(c->last, k, kl);
    c->last[kl] = '\0';
  }
  return 0;
}

static int stop_cb(const char* k, size_t kl, const char* v, size_t vl, void* arg) {
  (void)k, (void)kl, (void)v, (void)vl;
  ++*(int*)arg;
  return 1;
}

static void value_cb(const char* v, size_t vl, void* arg) {
  memcpy(arg, v, vl);
  ((char*)arg)[vl] = '\0';
}

static int many_found;
static void many_cb(size_t i, pmindex_status s, const char* v, size_t vl, void* arg) {
  (void)i, (void)v, (void)vl, (void)arg;
  if (s == PMINDEX_OK) many_found++;
}

static void test_engine(const char* engine, int ordered, int persistent) {
  char path[256];
  char key[32], val[32];
  snprintf(path, sizeof path, "/dev/shm/pmindex_kv_c_test_%d_%s", (int)getpid(), engine);
  remove(path);

  pmindex_config* cfg = pmindex_config_new();
  CHECK(cfg != NULL);
  CHECK(pmindex_config_set_path(cfg, path) == PMINDEX_OK);
  CHECK(pmindex_config_set_size(cfg, 64u << 20) == PMINDEX_OK);
  pmindex_db* db = NULL;
  CHECK(pmindex_open(engine, cfg, &db) == PMINDEX_OK);
  if (db == NULL) {
    pmindex_config_delete(cfg);
    return;
  }
  CHECK(strcmp(pmindex_engine(db), engine) == 0);
  CHECK(pmindex_is_ordered(db) == ordered);
  CHECK(pmindex_key_kind(db) == PMINDEX_KIND_BYTES);

  for (int i = 0; i < 600; i++) {
    int kl = snprintf(key, sizeof key, "key%04d", i);
    int vl = snprintf(val, sizeof val, "v%d", i);
    CHECK(pmindex_put(db, key, (size_t)kl, val, (size_t)vl) == PMINDEX_OK);
  }
  char got[64];
  CHECK(pmindex_get(db, "key0042", 7, value_cb, got) == PMINDEX_OK);
  CHECK(strcmp(got, "v42") == 0);
  size_t vlen = 0;
  CHECK(pmindex_get_copy(db, "key0123", 7, got, sizeof got, &vlen) == PMINDEX_OK);
  CHECK(vlen == 4 && memcmp(got, "v123", 4) == 0);
  CHECK(pmindex_get_copy(db, "key0123", 7, got, 2, &vlen) == PMINDEX_INVALID_ARGUMENT);
  CHECK(vlen == 4);
  CHECK(pmindex_get(db, "nope", 4, value_cb, got) == PMINDEX_NOT_FOUND);
  CHECK(strlen(pmindex_errormsg()) > 0);
  CHECK(pmindex_exists(db, "key0001", 7) == PMINDEX_OK);
  CHECK(pmindex_remove(db, "key0001", 7) == PMINDEX_OK);
  CHECK(pmindex_exists(db, "key0001", 7) == PMINDEX_NOT_FOUND);
  CHECK(pmindex_remove(db, "key0001", 7) == PMINDEX_NOT_FOUND);

  const char* keys[3] = {"key0002", "key0001", "key0599"};
  size_t lens[3] = {7, 7, 7};
  many_found = 0;
  CHECK(pmindex_get_many(db, 3, keys, lens, many_cb, NULL) == PMINDEX_OK);
  CHECK(many_found == 2);

  uint64_t n = 0;
  CHECK(pmindex_count_all(db, &n) == PMINDEX_OK);
  CHECK(n == 599);
  struct collect c = {0, ""};
  if (ordered) {
    CHECK(pmindex_count_above(db, "key0500", 7, &n) == PMINDEX_OK);
    CHECK(n == 99);
    CHECK(pmindex_count_below(db, "key0010", 7, &n) == PMINDEX_OK);
    CHECK(n == 9); /* key0000, key0002..key0009 */
    CHECK(pmindex_count_between(db, "key0100", 7, "key0200", 7, &n) == PMINDEX_OK);
    CHECK(n == 99);
    CHECK(pmindex_get_all(db, collect_cb, &c) == PMINDEX_OK);
    CHECK(c.n == 599 && strcmp(c.last, "key0599") == 0);
    c.n = 0;
    CHECK(pmindex_get_between(db, "key0100", 7, "key0200", 7, collect_cb, &c) == PMINDEX_OK);
    CHECK(c.n == 99 && strcmp(c.last, "key0199") == 0);
    c.n = 0;
    CHECK(pmindex_get_below(db, "key0003", 7, collect_cb, &c) == PMINDEX_OK);
    CHECK(c.n == 2);
    int calls = 0;
    CHECK(pmindex_get_above(db, "key0000", 7, stop_cb, &calls) == PMINDEX_OK);
    CHECK(calls == 1);

    pmindex_iterator* it = NULL;
    CHECK(pmindex_iterator_new(db, &it) == PMINDEX_OK);
    CHECK(!pmindex_iterator_is_valid(it));
    CHECK(pmindex_iterator_seek(it, "key0300", 7) == PMINDEX_OK);
    const char* k;
    size_t kl;
    CHECK(pmindex_iterator_key(it, &k, &kl) == PMINDEX_OK);
    CHECK(kl == 7 && memcmp(k, "key0300", 7) == 0);
    CHECK(pmindex_iterator_prev(it) == PMINDEX_OK);
    CHECK(pmindex_iterator_key(it, &k, &kl) == PMINDEX_OK && memcmp(k, "key0299", 7) == 0);
    CHECK(pmindex_iterator_value(it, &k, &kl) == PMINDEX_OK && kl == 4 && memcmp(k, "v299", 4) == 0);
    int count = 0;
    CHECK(pmindex_iterator_seek_to_first(it) == PMINDEX_OK);
    for (; pmindex_iterator_is_valid(it); pmindex_iterator_next(it)) count++;
    CHECK(count == 599);
    CHECK(pmindex_iterator_status(it) == PMINDEX_OK);
    CHECK(pmindex_iterator_key(it, &k, &kl) == PMINDEX_INVALID_ARGUMENT);
    pmindex_iterator_delete(it);
  } else {
    CHECK(pmindex_count_above(db, "a", 1, &n) == PMINDEX_UNSUPPORTED);
    CHECK(pmindex_get_all(db, collect_cb, &c) == PMINDEX_UNSUPPORTED);
    pmindex_iterator* it = NULL;
    CHECK(pmindex_iterator_new(db, &it) == PMINDEX_UNSUPPORTED);
    CHECK(it == NULL);
  }

  /* Bad input. */
  CHECK(pmindex_put(db, "", 0, "x", 1) == PMINDEX_INVALID_ARGUMENT);
  CHECK(pmindex_put(db, NULL, 3, "x", 1) == PMINDEX_INVALID_ARGUMENT);
  CHECK(pmindex_put(NULL, "a", 1, "x", 1) == PMINDEX_INVALID_ARGUMENT);
  CHECK(pmindex_count_all(db, NULL) == PMINDEX_INVALID_ARGUMENT);
  CHECK(pmindex_get(db, "a", 1, NULL, NULL) == PMINDEX_INVALID_ARGUMENT);
  CHECK(pmindex_close(db) == PMINDEX_OK);

  if (persistent) { /* reopen with whatever engine owns the pool */
    CHECK(pmindex_config_set_create_if_missing(cfg, 0) == PMINDEX_OK);
    db = NULL;
    CHECK(pmindex_open(NULL, cfg, &db) == PMINDEX_OK);
    if (db) {
      CHECK(strcmp(pmindex_engine(db), engine) == 0);
      CHECK(pmindex_count_all(db, &n) == PMINDEX_OK && n == 599);
      CHECK(pmindex_close(db) == PMINDEX_OK);
    }
  }
  pmindex_config_delete(cfg);
  remove(path);
}

int main(void) {
  size_t n = pmindex_engine_count();
  CHECK(n > 0);
  for (size_t i = 0; i < n; i++) {
    int ordered = 0, persistent = 0;
    const char* name = pmindex_engine_info(i, &ordered, &persistent, NULL);
    printf("engine %s\n", name);
    test_engine(name, ordered, persistent);
  }
  CHECK(pmindex_engine_info(n, NULL, NULL, NULL) == NULL);

  pmindex_db* db = NULL;
  CHECK(pmindex_open("no_such_engine", NULL, &db) != PMINDEX_OK);
  CHECK(db == NULL);
  CHECK(strlen(pmindex_errormsg()) > 0);
  CHECK(strcmp(pmindex_status_name(PMINDEX_NOT_FOUND), "NotFound") == 0);
  CHECK(pmindex_close(NULL) == PMINDEX_OK);
  if (failures) {
    fprintf(stderr, "%d checks failed\n", failures);
    return 1;
  }
  printf("all C API checks passed\n");
  return 0;
}
