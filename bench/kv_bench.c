/* kv_bench.c - microbenchmarks of kv/: block allocate + free, sequence
 * append + free, eviction, prefix lookup of a long prompt, admission plan,
 * block-table reads. Prints the best of several repeats of each.
 *
 * Usage: kv_bench [repeats]   (default 7). Results: docs/bench/kv.md. */
#include <stdio.h>
#include <stdlib.h>

#include "common/fr_err.h"
#include "common/fr_hash.h"
#include "common/fr_util.h"
#include "kv/kv_impl.h"

#define NB 65536
#define BS 16
#define PROMPT 4096

static int g_repeats = 7;
static volatile uint64_t g_sink;

static kv_ctl_t *mk(bool prefix, int max_bps) {
  kv_config_t cfg = {.n_blocks = NB, .block_size = BS, .max_seqs = 256, .max_blocks_per_seq = max_bps,
                     .enable_prefix_cache = prefix};
  kv_ctl_t *ctl = NULL;
  if (kv_control_create(&ctl, &cfg) != 0) {
    fprintf(stderr, "kv_bench: %s\n", fr_last_error());
    exit(1);
  }
  return ctl;
}

static void report(const char *what, double best_ns, double goal_ns) {
  if (goal_ns > 0)
    printf("%-44s %10.1f ns   (goal <= %.0f ns: %s)\n", what, best_ns, goal_ns, best_ns <= goal_ns ? "met" : "MISSED");
  else
    printf("%-44s %10.1f ns\n", what, best_ns);
}

/* Raw allocator: allocate every block, free every block. */
static void bench_block_alloc_free(kv_ctl_t *ctl, const char *what) {
  static uint32_t ids[NB];
  double best = 1e30;
  for (int r = 0; r < g_repeats; r++) {
    uint64_t t0 = fr_now_ns();
    for (int i = 0; i < NB; i++) ids[i] = kv__block_alloc(ctl);
    for (int i = NB - 1; i >= 0; i--) kv__block_unref(ctl, ids[i]);
    double ns = (double)(fr_now_ns() - t0) / NB;
    best = FR_MIN(best, ns);
  }
  report(what, best, 50);
}

/* A 4k-token sequence: append (256 blocks) + free, per block. */
static void bench_seq_append_free(kv_ctl_t *ctl) {
  double best = 1e30;
  kv_copy_t cp;
  for (int r = 0; r < g_repeats; r++) {
    uint64_t t0 = fr_now_ns();
    for (int k = 0; k < 64; k++) {
      int s;
      if (kv_seq_alloc_slot(ctl, 0, &s) || kv_seq_append(ctl, s, PROMPT, &cp) || kv_seq_free(ctl, s)) exit(2);
    }
    best = FR_MIN(best, (double)(fr_now_ns() - t0) / (64.0 * PROMPT / BS));
  }
  report("seq append 4k tokens + free, per block", best, 50);
}

/* Decode-style growth: one token at a time, per token. */
static void bench_seq_decode(kv_ctl_t *ctl) {
  double best = 1e30;
  kv_copy_t cp;
  for (int r = 0; r < g_repeats; r++) {
    int s;
    if (kv_seq_alloc_slot(ctl, 0, &s)) exit(2);
    uint64_t t0 = fr_now_ns();
    for (int i = 0; i < PROMPT; i++)
      if (kv_seq_append(ctl, s, 1, &cp)) exit(2);
    best = FR_MIN(best, (double)(fr_now_ns() - t0) / PROMPT);
    kv_seq_free(ctl, s);
  }
  report("seq append 1 token (decode), per token", best, 0);
}

static int32_t *prompt(uint32_t seed) {
  int32_t *t = fr_malloc(PROMPT * sizeof *t);
  for (int i = 0; i < PROMPT; i++) t[i] = (int32_t)(fr_mix64(seed * 1000003ull + (uint64_t)i) % 49152);
  return t;
}

/* Fills the cache with many freed 4k prompts, then measures allocate + free
 * of blocks that must evict a cached prefix. */
static void bench_evicting_alloc(void) {
  kv_ctl_t *ctl = mk(true, PROMPT / BS);
  kv_copy_t cp;
  static uint32_t ids[NB];
  double best = 1e30;
  for (int r = 0; r < FR_MIN(g_repeats, 3); r++) {
    for (uint32_t p = 0; p < NB / (PROMPT / BS); p++) {
      int32_t *t = prompt(p + 1000u * (uint32_t)r);
      int s;
      if (kv_seq_alloc_slot(ctl, 0, &s) || kv_seq_append(ctl, s, PROMPT, &cp) ||
          kv_prefix_commit(ctl, s, t, PROMPT) || kv_seq_free(ctl, s))
        exit(3);
      free(t);
    }
    uint64_t t0 = fr_now_ns();
    for (int i = 0; i < NB; i++) ids[i] = kv__block_alloc(ctl); /* every one evicts */
    best = FR_MIN(best, (double)(fr_now_ns() - t0) / NB);
    for (int i = NB - 1; i >= 0; i--) kv__block_unref(ctl, ids[i]);
  }
  report("block allocate that evicts a cached block", best, 0);
  kv_control_destroy(ctl);
}

static void bench_lookup(void) {
  kv_ctl_t *ctl = mk(true, PROMPT / BS);
  kv_copy_t cp;
  /* Background: 200 other cached prompts, so the index is populated. */
  for (uint32_t p = 1; p <= 200; p++) {
    int32_t *t = prompt(p);
    int s;
    if (kv_seq_alloc_slot(ctl, 0, &s) || kv_seq_append(ctl, s, PROMPT, &cp) ||
        kv_prefix_commit(ctl, s, t, PROMPT) || kv_seq_free(ctl, s))
      exit(4);
    free(t);
  }
  int32_t *t = prompt(1), ids[PROMPT / BS];
  int nb = 0, nf = 0;
  double best = 1e30;
  for (int r = 0; r < g_repeats; r++) {
    uint64_t t0 = fr_now_ns();
    for (int k = 0; k < 100; k++) {
      kv_prefix_lookup(ctl, t, PROMPT, 0, &nb, ids, PROMPT / BS, &nf);
      g_sink += (uint64_t)nb;
    }
    best = FR_MIN(best, (double)(fr_now_ns() - t0) / 100);
  }
  if (nb != PROMPT / BS) {
    fprintf(stderr, "kv_bench: lookup found %d blocks\n", nb);
    exit(4);
  }
  report("prefix lookup, 4k-token prompt, full hit", best, 20000);
  kv_admit_t plan;
  best = 1e30;
  for (int r = 0; r < g_repeats; r++) {
    uint64_t t0 = fr_now_ns();
    for (int k = 0; k < 100; k++) kv_admit_plan(ctl, t, PROMPT, 0, 1, &plan);
    best = FR_MIN(best, (double)(fr_now_ns() - t0) / 100);
  }
  report("admission plan, 4k-token prompt, full hit", best, 0);
  /* Attach + free: takes 255 cached blocks and gives them back. */
  best = 1e30;
  for (int r = 0; r < g_repeats; r++) {
    uint64_t t0 = fr_now_ns();
    for (int k = 0; k < 100; k++) {
      int s, cached;
      kv_seq_alloc_slot(ctl, 0, &s);
      kv_seq_attach_prefix(ctl, s, t, PROMPT - 1, &cached);
      kv_seq_free(ctl, s);
    }
    best = FR_MIN(best, (double)(fr_now_ns() - t0) / 100);
  }
  report("attach 4k cached prefix + free", best, 0);
  free(t);
  kv_control_destroy(ctl);
}

static void bench_read(void) {
  kv_ctl_t *ctl = mk(false, PROMPT / BS);
  int s;
  kv_copy_t cp;
  if (kv_seq_alloc_slot(ctl, 0, &s) || kv_seq_append(ctl, s, PROMPT, &cp)) exit(5);
  int32_t row[PROMPT / BS];
  kv_seq_view_t v;
  double best = 1e30;
  for (int r = 0; r < g_repeats; r++) {
    uint64_t t0 = fr_now_ns();
    for (int k = 0; k < 10000; k++) {
      kv_seq_read(ctl, s, row, PROMPT / BS, &v);
      g_sink += (uint64_t)row[k & 255];
    }
    best = FR_MIN(best, (double)(fr_now_ns() - t0) / 10000);
  }
  report("kv_seq_read of a 256-block table", best, 0);
  kv_control_destroy(ctl);
}

int main(int argc, char **argv) {
  if (argc > 1) g_repeats = FR_MAX(1, atoi(argv[1]));
  printf("kv_bench: %d blocks of %d tokens, best of %d repeats\n", NB, BS, g_repeats);
  kv_ctl_t *ctl = mk(false, PROMPT / BS);
  bench_block_alloc_free(ctl, "block allocate + free (no cache)");
  bench_seq_append_free(ctl);
  bench_seq_decode(ctl);
  kv_control_destroy(ctl);
  ctl = mk(true, PROMPT / BS);
  bench_block_alloc_free(ctl, "block allocate + free (cache on, empty)");
  kv_control_destroy(ctl);
  bench_evicting_alloc();
  bench_lookup();
  bench_read();
  return 0;
}
