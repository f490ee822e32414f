/* kv_c_example.c: the same store from C (pmindex/pmindex_c.h).
 *   kv_c_example [pool path] [engine]    (defaults: a temporary pool, fptree) */
#include <stdio.h>
#include <string.h>

#include "pmindex/pmindex_c.h"

static int print_record(const char* k, size_t kl, const char* v, size_t vl, void* arg) {
  (void)arg;
  printf("  %.*s = %.*s\n", (int)kl, k, (int)vl, v);
  return 0; /* nonzero stops */
}

int main(int argc, char** argv) {
  pmindex_config* cfg = pmindex_config_new();
  if (argc > 1) pmindex_config_set_path(cfg, argv[1]);
  pmindex_db* db = NULL;
  if (pmindex_open(argc > 2 ? argv[2] : "fptree", cfg, &db) != PMINDEX_OK) {
    fprintf(stderr, "open: %s\n", pmindex_errormsg());
    pmindex_config_delete(cfg);
    return 1;
  }
  pmindex_config_delete(cfg);

  char key[32], val[32];
  for (int i = 0; i < 5; i++) {
    snprintf(key, sizeof key, "city:%d", i);
    snprintf(val, sizeof val, "population %d", i * 1000);
    if (pmindex_put(db, key, strlen(key), val, strlen(val)) != PMINDEX_OK) {
      fprintf(stderr, "put: %s\n", pmindex_errormsg());
      pmindex_close(db);
      return 1;
    }
  }
  char buf[64];
  size_t len = 0;
  if (pmindex_get_copy(db, "city:2", 6, buf, sizeof buf, &len) == PMINDEX_OK) printf("city:2 = %.*s\n", (int)len, buf);
  uint64_t n = 0;
  pmindex_count_all(db, &n);
  printf("%llu records in %s\n", (unsigned long long)n, pmindex_engine(db));
  if (pmindex_is_ordered(db)) pmindex_get_all(db, print_record, NULL);
  return pmindex_close(db) == PMINDEX_OK ? 0 : 1;
}
