/* test_prefix.c - kv prefix cache: chained block hashes, longest-prefix
 * lookup, salt, revive of freed blocks, LRU eviction on reuse, duplicates,
 * hash-match-but-tokens-differ safety, the admission plan; randomized
 * against the reference model (tests/kv/kv_model.c). */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "kv/kv_impl.h"
#include "tests/kv/kv_model.h"

#define BS 16

static kv_ctl_t *mk(int n_blocks, int max_bps, bool prefix) {
  kv_config_t cfg = {.n_blocks = n_blocks, .block_size = BS, .max_seqs = 8, .max_blocks_per_seq = max_bps,
                     .enable_prefix_cache = prefix};
  kv_ctl_t *ctl = NULL;
  int err = kv_control_create(&ctl, &cfg);
  ck_assert_msg(err == 0, "create: %s", fr_last_error());
  return ctl;
}

static void verify(const kv_ctl_t *ctl) {
  int err = kv_control_verify(ctl);
  ck_assert_msg(err == 0, "verify: %s", fr_last_error());
}

static void fill(int32_t *t, int n, int32_t seed) {
  for (int i = 0; i < n; i++) t[i] = seed * 1000 + i;
}

/* A sequence of n tokens, fully allocated and committed. */
static int seq_commit(kv_ctl_t *ctl, const int32_t *toks, int n, uint64_t salt) {
  int s;
  kv_copy_t cp;
  ck_assert_int_eq(kv_seq_alloc_slot(ctl, salt, &s), 0);
  ck_assert_int_eq(kv_seq_append(ctl, s, n, &cp), 0);
  ck_assert_int_eq(kv_prefix_commit(ctl, s, toks, n), 0);
  return s;
}

static int lookup(const kv_ctl_t *ctl, const int32_t *toks, int n, uint64_t salt) {
  int nb = -1;
  ck_assert_int_eq(kv_prefix_lookup(ctl, toks, n, salt, &nb, NULL, 0, NULL), 0);
  return nb;
}

START_TEST(test_longest_prefix) {
  kv_ctl_t *ctl = mk(32, 16, true);
  int32_t a[8 * BS], q[8 * BS];
  fill(a, 8 * BS, 1);
  int s = seq_commit(ctl, a, 3 * BS + 5, 0); /* 3 full blocks + a partial one */
  kv_stats_t st;
  kv_stats_get(ctl, &st);
  ck_assert_int_eq(st.n_cached, 3);
  ck_assert_int_eq(lookup(ctl, a, 8 * BS, 0), 3);
  ck_assert_int_eq(lookup(ctl, a, 3 * BS, 0), 3);
  ck_assert_int_eq(lookup(ctl, a, 3 * BS - 1, 0), 2); /* only whole blocks */
  ck_assert_int_eq(lookup(ctl, a, 0, 0), 0);
  ck_assert_int_eq(lookup(ctl, a, 8 * BS, 1), 0); /* another salt */
  /* The ids are the slot's blocks. */
  int32_t ids[8], row[16];
  int nb, nfree = -1;
  kv_seq_view_t v;
  ck_assert_int_eq(kv_seq_read(ctl, s, row, 16, &v), 0);
  ck_assert_int_eq(kv_prefix_lookup(ctl, a, 8 * BS, 0, &nb, ids, 8, &nfree), 0);
  ck_assert_int_eq(nb, 3);
  ck_assert_int_eq(nfree, 0);
  for (int i = 0; i < 3; i++) ck_assert_int_eq(ids[i], row[i]);
  /* Diverging inside block 1: one block. */
  memcpy(q, a, sizeof q);
  q[BS + 7] = -5;
  ck_assert_int_eq(lookup(ctl, q, 8 * BS, 0), 1);
  /* Block 1's tokens after another block 0: nothing (the chain differs). */
  memcpy(q, a, sizeof q);
  q[0] = -5;
  ck_assert_int_eq(lookup(ctl, q, 8 * BS, 0), 0);
  /* Same tokens at another position are another prefix. */
  ck_assert_int_eq(lookup(ctl, a + BS, 2 * BS, 0), 0);
  verify(ctl);
  kv_control_destroy(ctl);
}
END_TEST

START_TEST(test_commit_is_incremental) {
  kv_ctl_t *ctl = mk(32, 16, true);
  int32_t a[8 * BS];
  fill(a, 8 * BS, 2);
  int s;
  kv_copy_t cp;
  ck_assert_int_eq(kv_seq_alloc_slot(ctl, 0, &s), 0);
  ck_assert_int_eq(kv_seq_append(ctl, s, 2 * BS, &cp), 0);
  ck_assert_int_eq(lookup(ctl, a, 8 * BS, 0), 0); /* nothing committed yet */
  ck_assert_int_eq(kv_prefix_commit(ctl, s, a, BS + 3), 0);
  ck_assert_int_eq(lookup(ctl, a, 8 * BS, 0), 1); /* only final tokens' blocks */
  ck_assert_int_eq(kv_prefix_commit(ctl, s, a, 8 * BS), 0); /* capped by the length */
  ck_assert_int_eq(lookup(ctl, a, 8 * BS, 0), 2);
  ck_assert_int_eq(kv_seq_append(ctl, s, BS, &cp), 0); /* decode a block more */
  ck_assert_int_eq(kv_prefix_commit(ctl, s, a, 3 * BS), 0);
  ck_assert_int_eq(lookup(ctl, a, 8 * BS, 0), 3);
  ck_assert_int_eq(kv_prefix_commit(ctl, 7, a, 3 * BS), -EINVAL);
  ck_assert_int_eq(kv_prefix_commit(ctl, s, NULL, 3), -EINVAL);
  verify(ctl);
  kv_control_destroy(ctl);
}
END_TEST

START_TEST(test_disabled) {
  kv_ctl_t *ctl = mk(32, 16, false);
  int32_t a[4 * BS];
  fill(a, 4 * BS, 3);
  int s = seq_commit(ctl, a, 4 * BS, 0), t, cached = -1;
  ck_assert_int_eq(lookup(ctl, a, 4 * BS, 0), 0);
  ck_assert_int_eq(kv_seq_alloc_slot(ctl, 0, &t), 0);
  ck_assert_int_eq(kv_seq_attach_prefix(ctl, t, a, 4 * BS, &cached), 0);
  ck_assert_int_eq(cached, 0);
  ck_assert_int_eq(kv_block_cached(ctl, 0), 0);
  ck_assert_int_eq(kv_seq_free(ctl, s), 0);
  verify(ctl);
  kv_control_destroy(ctl);
}
END_TEST

START_TEST(test_revive_after_free) {
  kv_ctl_t *ctl = mk(16, 16, true);
  int32_t a[4 * BS];
  fill(a, 4 * BS, 4);
  int s = seq_commit(ctl, a, 3 * BS + 1, 0);
  ck_assert_int_eq(kv_seq_free(ctl, s), 0);
  ck_assert_int_eq(kv_blocks_free_count(ctl), 16);
  ck_assert_int_eq(kv_blocks_uncached_free_count(ctl), 13);
  int nb, nfree;
  ck_assert_int_eq(kv_prefix_lookup(ctl, a, 4 * BS, 0, &nb, NULL, 0, &nfree), 0);
  ck_assert_int_eq(nb, 3);
  ck_assert_int_eq(nfree, 3);
  /* A new sequence with the same prompt takes the cached blocks back. */
  int t, cached;
  kv_copy_t cp;
  ck_assert_int_eq(kv_seq_alloc_slot(ctl, 0, &t), 0);
  ck_assert_int_eq(kv_seq_attach_prefix(ctl, t, a, 4 * BS - 1, &cached), 0);
  ck_assert_int_eq(cached, 3 * BS);
  ck_assert_int_eq(kv_seq_len(ctl, t), 3 * BS);
  ck_assert_int_eq(kv_blocks_free_count(ctl), 13);
  ck_assert_int_eq(kv_seq_attach_prefix(ctl, t, a, 4 * BS, &cached), FR_ESTATE); /* not empty */
  ck_assert_int_eq(kv_seq_attach_prefix(ctl, t, a, -1, &cached), -EINVAL);
  ck_assert_int_eq(kv_seq_attach_prefix(ctl, t, NULL, 4, &cached), -EINVAL);
  ck_assert_int_eq(kv_seq_attach_prefix(ctl, 7, a, 4, &cached), -EINVAL);
  ck_assert_int_eq(kv_seq_append(ctl, t, BS, &cp), 0);
  ck_assert_int_eq(cp.src, -1);
  kv_stats_t st;
  kv_stats_get(ctl, &st);
  ck_assert_int_eq(st.n_hit_blocks, 3);
  ck_assert_int_eq(st.n_lookup_blocks, 3);
  /* The cached blocks hold this prompt's tokens, under the chain hash a
   * fresh computation gives: a hit is the same KV a miss would compute. */
  int32_t row[16];
  kv_seq_view_t v;
  ck_assert_int_eq(kv_seq_read(ctl, t, row, 16, &v), 0);
  uint64_t h[2];
  kv__hash_root(0, h);
  for (int i = 0; i < 3; i++) {
    kv__hash_block(h, a + i * BS, BS, 0, h);
    ck_assert(memcmp(ctl->tokens + (size_t)row[i] * BS, a + i * BS, BS * sizeof(int32_t)) == 0);
    ck_assert(ctl->blocks[row[i]].h[0] == h[0] && ctl->blocks[row[i]].h[1] == h[1]);
  }
  verify(ctl);
  kv_control_destroy(ctl);
}
END_TEST

/* A lost pool (a restarted worker's): the free cached blocks are
 * forgotten, in-use ones once their sequence is freed; the accounting
 * stays whole. */
START_TEST(test_forget_all) {
  kv_ctl_t *ctl = mk(16, 16, true);
  int32_t a[4 * BS], b[3 * BS];
  fill(a, 4 * BS, 5);
  fill(b, 3 * BS, 6);
  int s = seq_commit(ctl, a, 3 * BS + 1, 0);
  ck_assert_int_eq(kv_seq_free(ctl, s), 0); /* 3 cached free blocks */
  int live = seq_commit(ctl, b, 2 * BS, 0); /* 2 cached in use */
  ck_assert_int_eq(lookup(ctl, a, 4 * BS, 0), 3);
  ck_assert_int_eq(lookup(ctl, b, 3 * BS, 0), 2);
  ck_assert_int_eq(kv_prefix_forget(ctl), 3);
  ck_assert_int_eq(lookup(ctl, a, 4 * BS, 0), 0);
  ck_assert_int_eq(lookup(ctl, b, 3 * BS, 0), 2); /* in use: kept */
  ck_assert_int_eq(kv_blocks_free_count(ctl), 14);
  ck_assert_int_eq(kv_blocks_uncached_free_count(ctl), 14);
  verify(ctl);
  ck_assert_int_eq(kv_seq_free(ctl, live), 0);
  ck_assert_int_eq(kv_blocks_uncached_free_count(ctl), 14);
  ck_assert_int_eq(kv_prefix_forget(ctl), 2);
  ck_assert_int_eq(lookup(ctl, b, 3 * BS, 0), 0);
  ck_assert_int_eq(kv_blocks_uncached_free_count(ctl), 16);
  verify(ctl);
  /* the cache works again afterwards */
  s = seq_commit(ctl, a, 3 * BS + 1, 0);
  ck_assert_int_eq(lookup(ctl, a, 4 * BS, 0), 3);
  verify(ctl);
  kv_control_destroy(ctl);
}
END_TEST

START_TEST(test_lru_eviction_on_reuse) {
  kv_ctl_t *ctl = mk(8, 16, true);
  int32_t a[4 * BS], b[4 * BS];
  fill(a, 4 * BS, 5);
  fill(b, 4 * BS, 6);
  int sa = seq_commit(ctl, a, 3 * BS, 0), sb = seq_commit(ctl, b, 3 * BS, 0);
  ck_assert_int_eq(kv_seq_free(ctl, sa), 0); /* a freed first: evicted first */
  ck_assert_int_eq(kv_seq_free(ctl, sb), 0);
  ck_assert_int_eq(kv_blocks_uncached_free_count(ctl), 2);
  int s;
  kv_copy_t cp;
  int32_t c[8 * BS];
  fill(c, 8 * BS, 7);
  ck_assert_int_eq(kv_seq_alloc_slot(ctl, 0, &s), 0);
  ck_assert_int_eq(kv_seq_append(ctl, s, 2 * BS, &cp), 0); /* the 2 uncached blocks */
  ck_assert_int_eq(lookup(ctl, a, 4 * BS, 0), 3);
  ck_assert_int_eq(kv_seq_append(ctl, s, BS, &cp), 0); /* evicts a's last block */
  ck_assert_int_eq(lookup(ctl, a, 4 * BS, 0), 2);
  ck_assert_int_eq(lookup(ctl, b, 4 * BS, 0), 3);
  ck_assert_int_eq(kv_seq_append(ctl, s, 2 * BS, &cp), 0); /* then a's head, tail first */
  ck_assert_int_eq(lookup(ctl, a, 4 * BS, 0), 0);
  ck_assert_int_eq(lookup(ctl, b, 4 * BS, 0), 3);
  kv_stats_t st;
  kv_stats_get(ctl, &st);
  ck_assert_int_eq(st.n_evictions, 3);
  ck_assert_int_eq(st.n_cached, 3);
  verify(ctl);
  kv_control_destroy(ctl);
}
END_TEST

START_TEST(test_duplicates_stay_uncached) {
  kv_ctl_t *ctl = mk(16, 16, true);
  int32_t a[4 * BS];
  fill(a, 4 * BS, 8);
  int s1 = seq_commit(ctl, a, 2 * BS, 0), s2 = seq_commit(ctl, a, 3 * BS, 0);
  kv_stats_t st;
  kv_stats_get(ctl, &st);
  ck_assert_int_eq(st.n_cached, 3); /* s1's two blocks, then s2's third */
  int32_t r1[16], r2[16], ids[4];
  kv_seq_view_t v;
  ck_assert_int_eq(kv_seq_read(ctl, s1, r1, 16, &v), 0);
  ck_assert_int_eq(kv_seq_read(ctl, s2, r2, 16, &v), 0);
  int nb;
  ck_assert_int_eq(kv_prefix_lookup(ctl, a, 4 * BS, 0, &nb, ids, 4, NULL), 0);
  ck_assert_int_eq(nb, 3);
  ck_assert_int_eq(ids[0], r1[0]);
  ck_assert_int_eq(ids[1], r1[1]);
  ck_assert_int_eq(ids[2], r2[2]); /* chained on s2's (uncached) twin of block 1 */
  ck_assert_int_eq(kv_block_cached(ctl, r2[0]), 0);
  ck_assert_int_eq(kv_seq_free(ctl, s2), 0);
  ck_assert_int_eq(lookup(ctl, a, 4 * BS, 0), 3);
  verify(ctl);
  kv_control_destroy(ctl);
}
END_TEST

START_TEST(test_hash_match_with_other_tokens_misses) {
  /* A hash collision is simulated by changing a cached block's stored
   * tokens: its chain hash still matches, the tokens do not. */
  kv_ctl_t *ctl = mk(16, 16, true);
  int32_t a[4 * BS], row[16];
  fill(a, 4 * BS, 9);
  int s = seq_commit(ctl, a, 3 * BS, 0);
  kv_seq_view_t v;
  ck_assert_int_eq(kv_seq_read(ctl, s, row, 16, &v), 0);
  ctl->tokens[(size_t)row[1] * BS + 3] ^= 1;
  ck_assert_int_eq(lookup(ctl, a, 4 * BS, 0), 1);
  ctl->tokens[(size_t)row[1] * BS + 3] ^= 1;
  ck_assert_int_eq(lookup(ctl, a, 4 * BS, 0), 3);
  /* And the other way: same tokens, different hash (another chain). */
  ctl->blocks[row[2]].h[1] ^= 1;
  ck_assert_int_eq(lookup(ctl, a, 4 * BS, 0), 2);
  kv_control_destroy(ctl);
}
END_TEST

START_TEST(test_write_into_truncated_cached_block) {
  kv_ctl_t *ctl = mk(16, 16, true);
  int32_t a[4 * BS];
  fill(a, 4 * BS, 10);
  int s = seq_commit(ctl, a, 2 * BS, 0);
  kv_copy_t cp;
  ck_assert_int_eq(kv_seq_truncate(ctl, s, BS + 4), 0); /* into cached block 1 */
  ck_assert_int_eq(lookup(ctl, a, 4 * BS, 0), 2);        /* its KV is intact so far */
  ck_assert_int_eq(kv_seq_append(ctl, s, 1, &cp), 0);    /* about to be overwritten */
  ck_assert_int_eq(cp.src, -1);
  ck_assert_int_eq(lookup(ctl, a, 4 * BS, 0), 1);
  /* Shared: the writer copies instead and the cached block survives. */
  int t, cached;
  ck_assert_int_eq(kv_seq_truncate(ctl, s, 0), 0);
  ck_assert_int_eq(kv_prefix_commit(ctl, s, a, 0), 0);
  s = seq_commit(ctl, a, 2 * BS, 0);
  ck_assert_int_eq(kv_seq_alloc_slot(ctl, 0, &t), 0);
  ck_assert_int_eq(kv_seq_attach_prefix(ctl, t, a, 2 * BS, &cached), 0);
  ck_assert_int_eq(cached, 2 * BS);
  ck_assert_int_eq(kv_seq_truncate(ctl, t, BS + 4), 0);
  ck_assert_int_eq(kv_seq_append(ctl, t, 1, &cp), 0);
  ck_assert_int_ge(cp.src, 0);
  ck_assert_int_eq(lookup(ctl, a, 4 * BS, 0), 2);
  verify(ctl);
  kv_control_destroy(ctl);
}
END_TEST

START_TEST(test_admit_plan) {
  kv_ctl_t *ctl = mk(10, 16, true);
  int32_t a[8 * BS];
  fill(a, 8 * BS, 11);
  int s = seq_commit(ctl, a, 4 * BS, 0);
  kv_admit_t p;
  /* 50 tokens: 3 whole cached blocks in the first 49, 4 blocks in all. */
  ck_assert_int_eq(kv_admit_plan(ctl, a, 50, 0, 0, &p), 0);
  ck_assert_int_eq(p.n_cached_blocks, 3);
  ck_assert_int_eq(p.n_cached_tokens, 48);
  ck_assert_int_eq(p.n_revive, 0);
  ck_assert_int_eq(p.n_new_blocks, 1);
  ck_assert_int_eq(p.n_free, 6);
  ck_assert(p.fits);
  /* 48 tokens: the last token is computed, so block 2 is not reused. */
  ck_assert_int_eq(kv_admit_plan(ctl, a, 48, 0, 0, &p), 0);
  ck_assert_int_eq(p.n_cached_blocks, 2);
  ck_assert_int_eq(p.n_new_blocks, 1);
  /* Room for 100 more tokens: 10 blocks in all, 7 new, 6 free. */
  ck_assert_int_eq(kv_admit_plan(ctl, a, 50, 0, 100, &p), 0);
  ck_assert_int_eq(p.n_new_blocks, 7);
  ck_assert(!p.fits);
  /* After a free the hits are free blocks that admission revives. */
  ck_assert_int_eq(kv_seq_free(ctl, s), 0);
  ck_assert_int_eq(kv_admit_plan(ctl, a, 8 * BS, 0, 0, &p), 0);
  ck_assert_int_eq(p.n_cached_blocks, 4);
  ck_assert_int_eq(p.n_revive, 4);
  ck_assert_int_eq(p.n_new_blocks, 4);
  ck_assert_int_eq(p.n_free, 10);
  ck_assert(p.fits);
  ck_assert_int_eq(kv_admit_plan(ctl, a, 8 * BS, 0, 17 * BS, &p), 0); /* past max_blocks_per_seq */
  ck_assert(!p.fits);
  ck_assert_int_eq(kv_admit_plan(ctl, a, 0, 0, 0, &p), -EINVAL);
  kv_control_destroy(ctl);
}
END_TEST

START_TEST(test_long_prompt) {
  enum { N = 4096 };
  kv_ctl_t *ctl = mk(300, 300, true);
  int32_t *a = malloc(N * sizeof *a);
  for (int i = 0; i < N; i++) a[i] = (i * 7919) % 32000;
  int s = seq_commit(ctl, a, N, 42);
  ck_assert_int_eq(lookup(ctl, a, N, 42), N / BS);
  kv_admit_t p;
  ck_assert_int_eq(kv_admit_plan(ctl, a, N, 42, 1, &p), 0);
  ck_assert_int_eq(p.n_cached_blocks, N / BS - 1);
  ck_assert_int_eq(p.n_new_blocks, 2);
  ck_assert_int_eq(kv_seq_free(ctl, s), 0);
  verify(ctl);
  free(a);
  kv_control_destroy(ctl);
}
END_TEST

START_TEST(test_random_prefix) {
  kvm_params_t p = {.n_blocks = 64, .block_size = 4, .max_seqs = 10, .max_bps = 16, .prefix_cache = true,
                    .steps = 5000, .seed = 0x5eed0000u + (uint64_t)_i};
  ck_assert_int_gt(kvm_random_run(&p), 0);
}
END_TEST

START_TEST(test_random_prefix_bs16) {
  kvm_params_t p = {.n_blocks = 40, .block_size = 16, .max_seqs = 6, .max_bps = 8, .prefix_cache = true,
                    .steps = 3000, .seed = 0xfeed00u + (uint64_t)_i};
  ck_assert_int_gt(kvm_random_run(&p), 0);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("kv_prefix");
  TCase *tc = tcase_create("prefix");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_longest_prefix);
  tcase_add_test(tc, test_commit_is_incremental);
  tcase_add_test(tc, test_disabled);
  tcase_add_test(tc, test_revive_after_free);
  tcase_add_test(tc, test_lru_eviction_on_reuse);
  tcase_add_test(tc, test_duplicates_stay_uncached);
  tcase_add_test(tc, test_hash_match_with_other_tokens_misses);
  tcase_add_test(tc, test_write_into_truncated_cached_block);
  tcase_add_test(tc, test_admit_plan);
  tcase_add_test(tc, test_forget_all);
  tcase_add_test(tc, test_long_prompt);
  tcase_add_loop_test(tc, test_random_prefix, 0, 4);
  tcase_add_loop_test(tc, test_random_prefix_bs16, 0, 3);
  suite_add_tcase(s, tc);
  return s;
}

/* The shared main (tests/common/test_main.c) runs this program's suites. */
#include "tests/common/test_main.h"

const test_prog_t test_prog = {.suites = {suite}};
