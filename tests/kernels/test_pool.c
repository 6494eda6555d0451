/* test_pool.c - the thread pool (common/fr_pool.c): every part runs exactly
 * once per run with the right (ith, nth), results are visible to the caller
 * afterwards, back-to-back runs and runs after the workers went to sleep. */
#include <check.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/fr_pool.h"

typedef struct {
  int nth_seen[64];
  long hits[64];
  long data[4096];
  long round;
  atomic_int bad;
} job_t;

static void part(void *arg, int ith, int nth) {
  job_t *j = arg;
  if (ith < 0 || ith >= nth || nth > 64) {
    atomic_fetch_add(&j->bad, 1);
    return;
  }
  j->nth_seen[ith] = nth;
  j->hits[ith]++;
  long lo, hi;
  fr_pool_split(4096, ith, nth, &lo, &hi);
  for (long i = lo; i < hi; i++) j->data[i] = j->round * 4096 + i; /* plain writes: the pool publishes them */
}

static void run_rounds(int n_threads, int rounds, long sleep_ns) {
  fr_pool_t *pool = NULL;
  ck_assert_int_eq(fr_pool_create(&pool, n_threads), 0);
  int nth = fr_pool_size(pool);
  ck_assert_int_eq(nth, n_threads);
  job_t *j = calloc(1, sizeof *j);
  for (int r = 0; r < rounds; r++) {
    j->round = r;
    fr_pool_run(pool, part, j);
    for (long i = 0; i < 4096; i += 97) ck_assert_int_eq(j->data[i], (long)r * 4096 + i);
    ck_assert_int_eq(j->data[4095], (long)r * 4096 + 4095);
    if (sleep_ns) nanosleep(&(struct timespec){0, sleep_ns}, NULL);
  }
  ck_assert_int_eq(atomic_load(&j->bad), 0);
  for (int i = 0; i < nth; i++) {
    ck_assert_int_eq(j->hits[i], rounds);
    ck_assert_int_eq(j->nth_seen[i], nth);
  }
  for (int i = nth; i < 64; i++) ck_assert_int_eq(j->hits[i], 0);
  free(j);
  fr_pool_destroy(pool);
}

START_TEST(test_many_fast_rounds) {
  run_rounds(1, 1000, 0);
  run_rounds(2, 5000, 0);
  run_rounds(4, 1000, 0);
}
END_TEST

START_TEST(test_rounds_after_sleep) {
  /* 2 ms between runs: past the spin window, so workers sleep on the futex. */
  run_rounds(2, 50, 2000000);
  run_rounds(3, 30, 2000000);
}
END_TEST

START_TEST(test_split_covers_range) {
  for (int nth = 1; nth <= 7; nth++)
    for (long n = 0; n < 40; n++) {
      long expect = 0;
      for (int i = 0; i < nth; i++) {
        long lo, hi;
        fr_pool_split(n, i, nth, &lo, &hi);
        ck_assert_int_eq(lo, expect);
        ck_assert_int_ge(hi, lo);
        ck_assert_int_le(hi - lo, n / nth + 1);
        expect = hi;
      }
      ck_assert_int_eq(expect, n);
    }
}
END_TEST

START_TEST(test_create_destroy) {
  fr_pool_t *pool = NULL;
  ck_assert_int_eq(fr_pool_create(&pool, 0), 0); /* one per core */
  ck_assert_int_ge(fr_pool_size(pool), 1);
  fr_pool_destroy(pool);
  fr_pool_destroy(NULL);
  ck_assert_int_ne(fr_pool_create(&pool, 100000), 0);
  ck_assert_ptr_null(pool);
}
END_TEST

/* The shared main (tests/common/test_main.c) runs this program's suites. */
#include "tests/common/test_main.h"

static Suite *pool_suite(void) {
  Suite *s = suite_create("kernels_pool");
  TCase *tc = tcase_create("pool");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_many_fast_rounds);
  tcase_add_test(tc, test_rounds_after_sleep);
  tcase_add_test(tc, test_split_covers_range);
  tcase_add_test(tc, test_create_destroy);
  suite_add_tcase(s, tc);
  return s;
}

const test_prog_t test_prog = {.suites = {pool_suite}};
