/* test_forward_rows.c - model_forward_rows, the verify pass of speculative
 * decoding, on the CPU: the logits of the last k + 1 positions of one
 * multi-token step are bit for bit those of feeding the same tokens one
 * decode step at a time (the CPU backend is batch-invariant), for one
 * sequence and for several in a step (mixed with a prefill chunk that gets
 * one row); bad row counts are errors. */
#include <check.h>
#include <errno.h>

#include "tests/common/forward_rows.h"
#include "tests/common/test_main.h"

#define NV 512
static const int32_t toks[12] = {5, 77, 301, 12, 9, 400, 401, 402, 33, 250, 7, 99};

START_TEST(rows_equal_token_by_token) {
  kern_backend_t *be;
  ck_assert_int_eq(kern_cpu_create(&be, 2), 0);
  fwr_t a, b;
  ck_assert_msg(fwr_init(&a, be, 7) == 0, "%s", fr_last_error());
  ck_assert_int_eq(fwr_init(&b, be, 7), 0);
  static float ra[5 * NV], rb[5 * NV];
  /* a: 7 prompt tokens, then 1 + 4 "proposals" verified in one step */
  ck_assert_int_eq(fwr_step(&a, toks, 0, 7, 0, ra), 0);
  ck_assert_int_eq(fwr_step(&a, toks + 7, 7, 5, 5, ra), 0);
  /* b: the same tokens one decode at a time */
  ck_assert_int_eq(fwr_step(&b, toks, 0, 7, 0, rb), 0);
  for (int i = 0; i < 5; i++) ck_assert_int_eq(fwr_step(&b, toks + 7 + i, 7 + i, 1, 0, rb + (size_t)i * NV), 0);
  ck_assert_mem_eq(ra, rb, sizeof ra);
  /* rows = 1 is the plain forward's row */
  static float r1[NV];
  ck_assert_int_eq(fwr_step(&b, toks + 11, 11, 1, 1, r1), 0);
  ck_assert_int_eq(fwr_step(&a, toks + 11, 11, 1, 0, rb), 0);
  ck_assert_mem_eq(r1, rb, sizeof r1);
  /* more rows than tokens, or none */
  ck_assert_int_eq(fwr_step(&a, toks, 0, 2, 3, ra), -EINVAL);
  ck_assert_int_eq(fwr_step(&a, toks, 0, 2, -1, ra), -EINVAL);
  fwr_deinit(&a), fwr_deinit(&b);
  kern_backend_destroy(be);
}
END_TEST

/* Two sequences in one step: a prefill chunk (one row) beside a verify of
 * 1 + 3 (four rows): the gathered rows are each sequence's own. */
START_TEST(rows_of_two_sequences) {
  kern_backend_t *be;
  ck_assert_int_eq(kern_cpu_create(&be, 2), 0);
  fwr_t f;
  ck_assert_int_eq(fwr_init(&f, be, 9), 0);
  static float alone[5 * NV], both[5 * NV];
  /* seq 0 alone: 6 tokens, 1 row; seq 1 alone: 4 tokens, 4 rows (its table starts at block 4) */
  ck_assert_int_eq(fwr_step(&f, toks, 0, 6, 0, alone), 0);
  int32_t t1[4] = {3, 4, 5, 6};
  for (int i = 0; i < 4; i++) f.table[i] += 4;
  ck_assert_int_eq(fwr_step(&f, t1, 0, 4, 4, alone + NV), 0);
  for (int i = 0; i < 4; i++) f.table[i] -= 4;
  /* together */
  int32_t tok[10], pos[10], slots[10], qs[3] = {0, 6, 10}, ctx[2] = {6, 4}, rows[2] = {1, 4}, bt[2 * FWR_NB];
  for (int i = 0; i < 6; i++) tok[i] = toks[i], pos[i] = i, slots[i] = i;
  for (int i = 0; i < 4; i++) tok[6 + i] = t1[i], pos[6 + i] = i, slots[6 + i] = 4 * FWR_BS + i;
  for (int i = 0; i < FWR_NB; i++) bt[i] = i, bt[FWR_NB + i] = i < 4 ? 4 + i : i;
  kern_step_t st = {.n_tokens = 10, .tokens = tok, .n_seqs = 2, .positions = pos, .slots = slots, .q_start = qs,
                    .ctx_len = ctx, .block_tables = bt, .max_blocks = FWR_NB};
  const void *lg;
  ck_assert_int_eq(model_forward_rows(f.m, &f.pool, &st, rows, &lg), 0);
  ck_assert_int_eq(model_logits_to_host(f.m, lg, 5, both), 0);
  ck_assert_mem_eq(alone, both, sizeof both);
  /* more rows than the scratch's max_seqs (8) */
  int32_t many[2] = {6, 4};
  ck_assert_int_eq(model_forward_rows(f.m, &f.pool, &st, many, &lg), FR_ETOOBIG);
  fwr_deinit(&f);
  kern_backend_destroy(be);
}
END_TEST

static Suite *rows_suite(void) {
  Suite *s = suite_create("forward_rows");
  TCase *tc = tcase_create("forward_rows");
  tcase_add_test(tc, rows_equal_token_by_token);
  tcase_add_test(tc, rows_of_two_sequences);
  suite_add_tcase(s, tc);
  return s;
}

const test_prog_t test_prog = {.suites = {rows_suite}};
