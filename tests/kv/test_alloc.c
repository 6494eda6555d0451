/* test_alloc.c - kv block allocator: reference counts, the free queue's
 * order, copy-on-write, truncate, out-of-blocks; randomized against the
 * reference model (tests/kv/kv_model.c). */
#include <check.h>
#include <errno.h>
#include <stdlib.h>

#include "common/fr_err.h"
#include "kv/kv_impl.h"
#include "tests/kv/kv_model.h"

static kv_ctl_t *mk(int n_blocks, int bs, int max_seqs, int max_bps, bool prefix) {
  kv_config_t cfg = {.n_blocks = n_blocks, .block_size = bs, .max_seqs = max_seqs,
                     .max_blocks_per_seq = max_bps, .enable_prefix_cache = prefix};
  kv_ctl_t *ctl = NULL;
  int err = kv_control_create(&ctl, &cfg);
  ck_assert_msg(err == 0, "create: %s", fr_last_error());
  return ctl;
}

static void verify(const kv_ctl_t *ctl) {
  int err = kv_control_verify(ctl);
  ck_assert_msg(err == 0, "verify: %s", fr_last_error());
}

static int table(const kv_ctl_t *ctl, int slot, int32_t *row, int cap) {
  kv_seq_view_t v;
  ck_assert_int_eq(kv_seq_read(ctl, slot, row, cap, &v), 0);
  return v.n_blocks;
}

START_TEST(test_config_errors) {
  kv_ctl_t *ctl = NULL;
  kv_config_t bad[] = {
      {.n_blocks = 0, .max_seqs = 1, .max_blocks_per_seq = 1},
      {.n_blocks = 8, .max_seqs = 0, .max_blocks_per_seq = 1},
      {.n_blocks = 8, .max_seqs = 1, .max_blocks_per_seq = 0},
      {.n_blocks = 8, .block_size = -1, .max_seqs = 1, .max_blocks_per_seq = 1},
      {.n_blocks = 1 << 30, .block_size = 16, .max_seqs = 1, .max_blocks_per_seq = 1}, /* slots overflow int32 */
      {.n_blocks = 8, .block_size = 16, .max_seqs = 1, .max_blocks_per_seq = 1 << 28},
      {.instance = "bad/name", .n_blocks = 8, .max_seqs = 1, .max_blocks_per_seq = 1},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ck_assert_int_lt(kv_control_create(&ctl, &bad[i]), 0);
    ck_assert_ptr_null(ctl);
  }
  ctl = mk(8, 0, 2, 4, false); /* block size 0 = default */
  kv_info_t info;
  kv_control_info(ctl, &info);
  ck_assert_int_eq(info.block_size, KV_BLOCK_SIZE_DEFAULT);
  ck_assert_int_eq(info.n_blocks, 8);
  ck_assert_ptr_null(kv_control_segment(ctl));
  kv_control_destroy(ctl);
  kv_control_destroy(NULL);
}
END_TEST

START_TEST(test_alloc_free_counts) {
  kv_ctl_t *ctl = mk(8, 4, 4, 8, false);
  int s;
  kv_copy_t cp;
  ck_assert_int_eq(kv_seq_alloc_slot(ctl, 0, &s), 0);
  ck_assert_int_eq(kv_seq_append(ctl, s, 9, &cp), 0); /* 3 blocks */
  ck_assert_int_eq(cp.src, -1);
  ck_assert_int_eq(kv_blocks_free_count(ctl), 5);
  int32_t row[8];
  ck_assert_int_eq(table(ctl, s, row, 8), 3);
  /* Fresh blocks come from the head in ascending order. */
  ck_assert_int_eq(row[0], 0);
  ck_assert_int_eq(row[1], 1);
  ck_assert_int_eq(row[2], 2);
  for (int i = 0; i < 3; i++) ck_assert_int_eq(kv_block_ref(ctl, row[i]), 1);
  ck_assert_int_eq(kv_seq_append(ctl, s, 3, &cp), 0); /* fills block 2 */
  ck_assert_int_eq(kv_blocks_free_count(ctl), 5);
  ck_assert_int_eq(kv_seq_len(ctl, s), 12);
  verify(ctl);
  ck_assert_int_eq(kv_seq_free(ctl, s), 0);
  ck_assert_int_eq(kv_blocks_free_count(ctl), 8);
  ck_assert_int_eq(kv_seq_len(ctl, s), -EINVAL);
  ck_assert_int_eq(kv_seq_free(ctl, s), -EINVAL);
  ck_assert_int_eq(kv_block_ref(ctl, 8), -EINVAL);
  verify(ctl);
  kv_control_destroy(ctl);
}
END_TEST

START_TEST(test_out_of_blocks_is_all_or_nothing) {
  kv_ctl_t *ctl = mk(4, 4, 4, 8, false);
  int a, b;
  kv_copy_t cp;
  ck_assert_int_eq(kv_seq_alloc_slot(ctl, 0, &a), 0);
  ck_assert_int_eq(kv_seq_alloc_slot(ctl, 0, &b), 0);
  ck_assert_int_eq(kv_seq_append(ctl, a, 10, &cp), 0); /* 3 blocks */
  uint32_t ver = kv_seq_version(ctl, b);
  ck_assert_int_eq(kv_seq_append(ctl, b, 5, &cp), FR_EBUSY); /* needs 2, 1 free */
  ck_assert_int_eq(kv_seq_len(ctl, b), 0);
  ck_assert_int_eq(kv_blocks_free_count(ctl), 1);
  ck_assert_uint_eq(kv_seq_version(ctl, b), ver); /* untouched */
  ck_assert_int_eq(kv_seq_append(ctl, b, 4, &cp), 0);
  ck_assert_int_eq(kv_blocks_free_count(ctl), 0);
  ck_assert_int_eq(kv_seq_append(ctl, a, 2, &cp), 0);        /* room in the last block */
  ck_assert_int_eq(kv_seq_append(ctl, a, 1, &cp), FR_EBUSY); /* block 3 full */
  ck_assert_int_eq(kv_seq_append(ctl, a, 100, &cp), FR_ECONTEXT);
  ck_assert_int_eq(kv_seq_append(ctl, a, -1, &cp), -EINVAL);
  ck_assert_int_eq(kv_seq_append(ctl, a, 0, NULL), -EINVAL);
  /* Slots run out too. */
  int c, d, e;
  ck_assert_int_eq(kv_seq_alloc_slot(ctl, 0, &c), 0);
  ck_assert_int_eq(kv_seq_alloc_slot(ctl, 0, &d), 0);
  ck_assert_int_eq(kv_seq_alloc_slot(ctl, 0, &e), FR_EBUSY);
  ck_assert_int_eq(kv_seq_fork(ctl, a, &e), FR_EBUSY);
  verify(ctl);
  kv_control_destroy(ctl);
}
END_TEST

START_TEST(test_fork_shares_and_copies_on_write) {
  kv_ctl_t *ctl = mk(8, 4, 4, 8, false);
  int p, c;
  kv_copy_t cp;
  ck_assert_int_eq(kv_seq_alloc_slot(ctl, 0, &p), 0);
  ck_assert_int_eq(kv_seq_append(ctl, p, 6, &cp), 0); /* blocks 0 (full), 1 (2 of 4) */
  ck_assert_int_eq(kv_seq_fork(ctl, p, &c), 0);
  ck_assert_int_eq(kv_seq_len(ctl, c), 6);
  ck_assert_int_eq(kv_block_ref(ctl, 0), 2);
  ck_assert_int_eq(kv_block_ref(ctl, 1), 2);
  ck_assert_int_eq(kv_blocks_free_count(ctl), 6);
  /* The child appends into the shared partial block: copy 1 -> 2. */
  ck_assert_int_eq(kv_seq_append(ctl, c, 1, &cp), 0);
  ck_assert_int_eq(cp.src, 1);
  ck_assert_int_eq(cp.dst, 2);
  int32_t row[8];
  ck_assert_int_eq(table(ctl, c, row, 8), 2);
  ck_assert_int_eq(row[0], 0);
  ck_assert_int_eq(row[1], 2);
  ck_assert_int_eq(kv_block_ref(ctl, 1), 1);
  ck_assert_int_eq(kv_block_ref(ctl, 0), 2);
  /* The parent's block 1 is its own again: no copy. */
  ck_assert_int_eq(kv_seq_append(ctl, p, 1, &cp), 0);
  ck_assert_int_eq(cp.src, -1);
  /* A full shared last block needs no copy either. */
  ck_assert_int_eq(kv_seq_append(ctl, p, 1, &cp), 0); /* p: 8 tokens, block 1 full */
  int g;
  ck_assert_int_eq(kv_seq_fork(ctl, p, &g), 0);
  ck_assert_int_eq(kv_seq_append(ctl, g, 1, &cp), 0);
  ck_assert_int_eq(cp.src, -1);
  ck_assert_int_eq(kv_block_ref(ctl, 1), 2);
  verify(ctl);
  /* Free the parent: the shared blocks stay with the children. */
  ck_assert_int_eq(kv_seq_free(ctl, p), 0);
  ck_assert_int_eq(kv_block_ref(ctl, 0), 2);
  ck_assert_int_eq(kv_block_ref(ctl, 1), 1);
  verify(ctl);
  kv_control_destroy(ctl);
}
END_TEST

START_TEST(test_truncate_frees_and_cows) {
  kv_ctl_t *ctl = mk(8, 4, 4, 8, false);
  int s, c;
  kv_copy_t cp;
  ck_assert_int_eq(kv_seq_alloc_slot(ctl, 0, &s), 0);
  ck_assert_int_eq(kv_seq_append(ctl, s, 16, &cp), 0); /* 4 full blocks */
  ck_assert_int_eq(kv_seq_truncate(ctl, s, 17), -EINVAL);
  ck_assert_int_eq(kv_seq_truncate(ctl, s, -1), -EINVAL);
  ck_assert_int_eq(kv_seq_truncate(ctl, s, 9), 0); /* 3 blocks, last has 1 */
  ck_assert_int_eq(kv_blocks_free_count(ctl), 5);
  ck_assert_int_eq(kv_seq_len(ctl, s), 9);
  ck_assert_int_eq(kv_seq_truncate(ctl, s, 8), 0); /* exactly 2 blocks */
  ck_assert_int_eq(kv_blocks_free_count(ctl), 6);
  /* Truncating into a shared block, then appending, copies it. */
  ck_assert_int_eq(kv_seq_fork(ctl, s, &c), 0);
  ck_assert_int_eq(kv_seq_truncate(ctl, c, 6), 0);
  ck_assert_int_eq(kv_block_ref(ctl, 1), 2);
  ck_assert_int_eq(kv_seq_append(ctl, c, 1, &cp), 0);
  ck_assert_int_eq(cp.src, 1);
  ck_assert_int_ge(cp.dst, 0);
  ck_assert_int_eq(kv_block_ref(ctl, 1), 1);
  ck_assert_int_eq(kv_seq_truncate(ctl, c, 0), 0);
  ck_assert_int_eq(kv_seq_len(ctl, c), 0);
  verify(ctl);
  kv_control_destroy(ctl);
}
END_TEST

START_TEST(test_free_queue_order) {
  /* Uncached blocks freed go to the head: they are reused first. */
  kv_ctl_t *ctl = mk(6, 2, 4, 8, false);
  int a, b;
  kv_copy_t cp;
  int32_t row[8];
  ck_assert_int_eq(kv_seq_alloc_slot(ctl, 0, &a), 0);
  ck_assert_int_eq(kv_seq_append(ctl, a, 4, &cp), 0); /* 0, 1 */
  ck_assert_int_eq(kv_seq_free(ctl, a), 0);            /* head: 0, 1, 2, ... (last freed first) */
  ck_assert_int_eq(kv_seq_alloc_slot(ctl, 0, &b), 0);
  ck_assert_int_eq(kv_seq_append(ctl, b, 2, &cp), 0);
  ck_assert_int_eq(table(ctl, b, row, 8), 1);
  ck_assert_int_eq(row[0], 0);
  verify(ctl);
  kv_control_destroy(ctl);
}
END_TEST

static void random_run(uint64_t seed, bool prefix, int n_blocks, int bs, int steps) {
  kvm_params_t p = {.n_blocks = n_blocks, .block_size = bs, .max_seqs = 8, .max_bps = 12,
                    .prefix_cache = prefix, .steps = steps, .seed = seed};
  long hits = kvm_random_run(&p);
  if (prefix) ck_assert_int_gt(hits, 0);
}

START_TEST(test_random_allocator) {
  /* Allocator only: allocate / share / fork / free / truncate. */
  random_run(0x1234 + (uint64_t)_i, false, 40, 4, 4000);
}
END_TEST

START_TEST(test_random_allocator_with_cache) {
  random_run(0xabcd + (uint64_t)_i, true, 48, 4, 4000);
}
END_TEST

START_TEST(test_random_tight_pool) {
  /* Few blocks: constant eviction and out-of-blocks paths. */
  random_run(0x77 + (uint64_t)_i, true, 14, 2, 4000);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("kv_alloc");
  TCase *tc = tcase_create("alloc");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_config_errors);
  tcase_add_test(tc, test_alloc_free_counts);
  tcase_add_test(tc, test_out_of_blocks_is_all_or_nothing);
  tcase_add_test(tc, test_fork_shares_and_copies_on_write);
  tcase_add_test(tc, test_truncate_frees_and_cows);
  tcase_add_test(tc, test_free_queue_order);
  tcase_add_loop_test(tc, test_random_allocator, 0, 4);
  tcase_add_loop_test(tc, test_random_allocator_with_cache, 0, 4);
  tcase_add_loop_test(tc, test_random_tight_pool, 0, 3);
  suite_add_tcase(s, tc);
  return s;
}

/* The shared main (tests/common/test_main.c) runs this program's suites. */
#include "tests/common/test_main.h"

const test_prog_t test_prog = {.suites = {suite}};
