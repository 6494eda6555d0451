/* model_bench - prefill and batched decode throughput of the layer stack on
 * a backend, outside the engine (no scheduler, no messaging):
 *   prefill: one sequence of --prefill tokens in one step;
 *   decode:  --batch B sequences with --prompt tokens each, then --gen decode
 *            steps of B tokens (greedy, sampled on the device when the
 *            backend can, else on the host);
 *   mixed:   with --mixed P, the same decode steps again, each with one more
 *            sequence prefilling a chunk of P tokens beside the B decodes
 *            (a serving step under chunked prefill);
 *   verify:  with --verify K, the same steps with K + 1 tokens a sequence
 *            and logits for all of them, copied to the host as the worker
 *            does to verify K speculative proposals.
 * usage: model_bench [--model PATH | --dummy NAME|config.json] [--device cpu|cuda[:N]]
 *          [--type bf16|f16|q8_0|q4_0|q4_1|q4_k|q4_k_m|i4g|gptq|fp8|fp8-block|...] [--threads N]
 *          [--prefill N] [--prompt N] [--gen N] [--batch 1,64] [--repeat N] [--mixed P]
 *          [--verify K] [--kv-cache-dtype auto|int8|fp8] [--quantization fp8]
 * --quantization fp8 keeps the layers' dense weights as FP8 (vLLM's
 * dynamic FP8; a CUDA device); --type fp8 and fp8-block make them as an FP8
 * checkpoint's, a scale a row or 128 x 128 blocks (the act type where FP8
 * is not kept). The KV pool holds what the run needs (the prefill's sequence, or the
 * largest batch's sequences of --prompt + --gen tokens); its size is printed.
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "kernels/kern.h"
#include "model/dummy.h"
#include "model/model.h"

#define BENCH_MAX_BATCHES 16
#define BENCH_MAX_BATCH 256 /* sequences per step: the device sampler's parameters below */
#define BENCH_BLOCK 16      /* tokens per KV block */

typedef struct {
  const char *model, *dummy, *device, *type;
  int threads, prefill, prompt, gen, repeat, mixed, verify;
  int kv_dtype; /* kern_kv_dtype_t */
  bool fp8;     /* --quantization fp8 */
  int batches[BENCH_MAX_BATCHES], n_batches;
} bench_opts_t;

/* A whole number in [lo, hi], or -1 (the option is refused). */
static int bench_int(const char *s, int lo, int hi, int *out) {
  char *end;
  long v = strtol(s, &end, 10);
  if (end == s || *end || v < lo || v > hi) return -1;
  *out = (int)v;
  return 0;
}

static int bench_parse_batches(const char *v, bench_opts_t *o) {
  char *copy = fr_strdup(v), *save = NULL;
  o->n_batches = 0;
  int rc = 0;
  for (char *t = strtok_r(copy, ",", &save); t && !rc; t = strtok_r(NULL, ",", &save))
    rc = o->n_batches == BENCH_MAX_BATCHES ? -1 : bench_int(t, 1, BENCH_MAX_BATCH, &o->batches[o->n_batches++]);
  free(copy);
  return rc || !o->n_batches ? -1 : 0;
}

static int bench_parse(int argc, char **argv, bench_opts_t *o) {
  *o = (bench_opts_t){.device = "cpu", .prefill = 512, .prompt = 128, .gen = 128, .repeat = 1,
                      .batches = {1}, .n_batches = 1};
  for (int i = 1; i < argc; i += 2) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    int rc = 0;
    if (!v) return -1;
    if (!strcmp(a, "--model")) o->model = v;
    else if (!strcmp(a, "--dummy")) o->dummy = v;
    else if (!strcmp(a, "--device")) o->device = v;
    else if (!strcmp(a, "--type")) o->type = v;
    else if (!strcmp(a, "--threads")) rc = bench_int(v, 0, 1024, &o->threads);
    else if (!strcmp(a, "--prefill")) rc = bench_int(v, 0, 1 << 20, &o->prefill);
    else if (!strcmp(a, "--prompt")) rc = bench_int(v, 1, 1 << 20, &o->prompt);
    else if (!strcmp(a, "--gen")) rc = bench_int(v, 1, 1 << 20, &o->gen);
    else if (!strcmp(a, "--repeat")) rc = bench_int(v, 0, 1000, &o->repeat);
    else if (!strcmp(a, "--batch")) rc = bench_parse_batches(v, o);
    else if (!strcmp(a, "--mixed")) rc = bench_int(v, 2, 1 << 20, &o->mixed);
    else if (!strcmp(a, "--verify")) rc = bench_int(v, 1, 16, &o->verify);
    else if (!strcmp(a, "--kv-cache-dtype")) rc = (o->kv_dtype = kern_kv_dtype_parse(v)) < 0 ? -1 : 0;
    else if (!strcmp(a, "--quantization")) rc = (o->fp8 = !strcmp(v, "fp8")) ? 0 : -1;
    else return -1;
    if (rc) {
      fprintf(stderr, "model_bench: bad value '%s' for %s\n", v, a);
      return -1;
    }
  }
  return o->model || o->dummy ? 0 : -1;
}

typedef struct {
  model_t *m;
  kern_kv_pool_t pool;
  bool pool_ready;
  int blocks_per_seq, max_seqs;
  int32_t *tables, *tokens, *pos, *slots, *q_start, *ctx_len, *next;
  float *logits_host;
  bool rows_to_host; /* a verify step's logits rows go to the host (else the pass alone) */
} bench_t;

/* One step: sequence seq[s] runs len[s] tokens from position start[s]. With
 * out_tok, the last token's logits of each sequence are sampled into it;
 * with rows (a verify step), the last rows[s] tokens' logits are computed
 * and, with b->rows_to_host, copied to the host and their argmax taken, as
 * the worker verifies proposals. */
/* The argmax of each of n_rows logits rows, on the host (into out_tok if
 * not NULL). */
static int bench_host_argmax(bench_t *b, const void *logits, int n_rows, int32_t *out_tok) {
  int V = b->m->cfg.vocab_size, rc = model_logits_to_host(b->m, logits, n_rows, b->logits_host);
  for (int s = 0; s < n_rows && !rc; s++) {
    const float *l = b->logits_host + (size_t)s * V;
    int best = 0;
    for (int i = 1; i < V; i++)
      if (l[i] > l[best]) best = i;
    if (out_tok) out_tok[s] = best;
  }
  return rc;
}

static int bench_step(bench_t *b, int n_seqs, const int *seq, const int *start, const int *len, const int32_t *rows_of,
                      int32_t *out_tok) {
  int n = 0;
  b->q_start[0] = 0;
  for (int s = 0; s < n_seqs; s++) {
    for (int j = 0; j < len[s]; j++, n++) {
      int p = start[s] + j;
      b->tokens[n] = (int32_t)((seq[s] * 7919 + p * 31) % b->m->cfg.vocab_size);
      if (out_tok && len[s] == 1) b->tokens[n] = b->next[seq[s]];
      b->pos[n] = p;
      b->slots[n] = b->tables[seq[s] * b->blocks_per_seq + p / BENCH_BLOCK] * BENCH_BLOCK + p % BENCH_BLOCK;
    }
    b->q_start[s + 1] = n;
    b->ctx_len[s] = start[s] + len[s];
  }
  /* block table rows of the sequences in this step */
  static int32_t *rows;
  static int rows_cap;
  if (rows_cap < n_seqs * b->blocks_per_seq) {
    rows_cap = n_seqs * b->blocks_per_seq;
    rows = fr_realloc(rows, (size_t)rows_cap * sizeof(int32_t));
  }
  for (int s = 0; s < n_seqs; s++)
    memcpy(rows + s * b->blocks_per_seq, b->tables + seq[s] * b->blocks_per_seq, b->blocks_per_seq * sizeof(int32_t));
  kern_step_t st = {.n_tokens = n, .tokens = b->tokens, .n_seqs = n_seqs, .positions = b->pos, .slots = b->slots,
                    .q_start = b->q_start, .ctx_len = b->ctx_len, .block_tables = rows,
                    .max_blocks = b->blocks_per_seq};
  const void *logits;
  int rc = model_forward_rows(b->m, &b->pool, &st, rows_of, &logits);
  if (rc) return rc;
  const kern_ops_t *op = b->m->be->ops;
  int n_rows = n_seqs;
  if (rows_of) {
    n_rows = 0;
    for (int s = 0; s < n_seqs; s++) n_rows += rows_of[s];
    return b->rows_to_host ? bench_host_argmax(b, logits, n_rows, NULL) : op->sync(b->m->be->ctx);
  }
  if (!out_tok) return op->sync(b->m->be->ctx);
  if (op->sample) {
    kern_sample_params_t sp[BENCH_MAX_BATCH + 1] = {{0}}; /* + the mixed steps' prefill */
    float lp[BENCH_MAX_BATCH + 1];
    return op->sample(b->m->be->ctx, logits, n_seqs, b->m->cfg.vocab_size, sp, out_tok, lp);
  }
  return bench_host_argmax(b, logits, n_rows, out_tok);
}

static int bench_prefill(bench_t *b, int n_tok, int repeat) {
  double best = 1e30;
  for (int r = 0; r < repeat + 1; r++) {
    int seq = 0, start = 0, len = n_tok;
    uint64_t t0 = fr_now_ns();
    int rc = bench_step(b, 1, &seq, &start, &len, NULL, NULL);
    if (rc) return rc;
    double dt = (fr_now_ns() - t0) / 1e9;
    if (r > 0 || repeat == 0) best = dt < best ? dt : best; /* first run warms up */
  }
  printf("prefill  %5d tokens: %8.3f ms  %10.1f tok/s\n", n_tok, best * 1e3, n_tok / best);
  return 0;
}

static int bench_decode(bench_t *b, int B, int prompt, int gen) {
  int *seq = fr_malloc((size_t)B * sizeof(int)), *start = fr_malloc((size_t)B * sizeof(int));
  int *len = fr_malloc((size_t)B * sizeof(int));
  int32_t *tok = fr_malloc((size_t)B * sizeof(int32_t));
  int rc = 0;
  /* prompts: as many sequences per step as the scratch holds */
  int per = b->m->max_tokens / prompt;
  if (per < 1) per = 1;
  for (int s0 = 0; s0 < B && !rc; s0 += per) {
    int k = FR_MIN(per, B - s0);
    for (int s = 0; s < k; s++) seq[s] = s0 + s, start[s] = 0, len[s] = prompt;
    rc = bench_step(b, k, seq, start, len, NULL, tok);
    for (int s = 0; s < k; s++) b->next[s0 + s] = tok[s];
  }
  for (int s = 0; s < B; s++) seq[s] = s, len[s] = 1;
  uint64_t t0 = 0;
  for (int g = 0; g < gen && !rc; g++) {
    if (g == 1) t0 = fr_now_ns(); /* step 0 warms up (and captures graphs) */
    for (int s = 0; s < B; s++) start[s] = prompt + g;
    rc = bench_step(b, B, seq, start, len, NULL, tok);
    for (int s = 0; s < B; s++) b->next[s] = tok[s];
  }
  if (!rc && gen > 1) {
    double dt = (fr_now_ns() - t0) / 1e9;
    printf("decode   batch %3d, prompt %d, %d steps: %8.3f ms/step  %10.1f tok/s\n", B, prompt, gen - 1,
           dt * 1e3 / (gen - 1), (double)B * (gen - 1) / dt);
  }
  free(seq), free(start), free(len), free(tok);
  return rc;
}

/* Decode steps of B sequences (from --prompt on, as bench_decode's), each
 * with sequence B prefilling P tokens from position 0 beside them. */
static int bench_mixed(bench_t *b, int B, int prompt, int gen, int P) {
  int n = B + 1, *seq = fr_malloc((size_t)n * sizeof(int)), *start = fr_malloc((size_t)n * sizeof(int));
  int *len = fr_malloc((size_t)n * sizeof(int));
  int32_t *tok = fr_malloc((size_t)n * sizeof(int32_t));
  int rc = 0;
  for (int s = 0; s < n; s++) seq[s] = s, len[s] = s < B ? 1 : P;
  uint64_t t0 = 0;
  for (int g = 0; g < gen && !rc; g++) {
    if (g == 1) t0 = fr_now_ns();
    for (int s = 0; s < n; s++) start[s] = s < B ? prompt + g : 0;
    rc = bench_step(b, n, seq, start, len, NULL, tok);
    for (int s = 0; s < B; s++) b->next[s] = tok[s];
  }
  if (!rc && gen > 1) {
    double dt = (fr_now_ns() - t0) / 1e9;
    printf("mixed    batch %3d + prefill %d, %d steps: %8.3f ms/step  %10.1f tok/s\n", B, P, gen - 1,
           dt * 1e3 / (gen - 1), (double)(B + P) * (gen - 1) / dt);
  }
  free(seq), free(start), free(len), free(tok);
  return rc;
}

/* Verify steps of B sequences (from --prompt on, as bench_decode's): K + 1
 * tokens each, logits for all of them on the host. */
static int bench_verify(bench_t *b, int B, int prompt, int gen, int K) {
  int *seq = fr_malloc((size_t)B * sizeof(int)), *start = fr_malloc((size_t)B * sizeof(int));
  int *len = fr_malloc((size_t)B * sizeof(int));
  int32_t *rows = fr_malloc((size_t)B * sizeof(int32_t));
  int rc = 0;
  for (int s = 0; s < B; s++) seq[s] = s, len[s] = K + 1, rows[s] = K + 1;
  double ms[2] = {0, 0}; /* the forward pass alone; with the logits on the host */
  for (int host = 0; host < 2 && !rc; host++) {
    uint64_t t0 = 0;
    for (int g = 0; g < gen && !rc; g++) {
      if (g == 1) t0 = fr_now_ns();
      for (int s = 0; s < B; s++) start[s] = prompt + g;
      b->rows_to_host = host;
      rc = bench_step(b, B, seq, start, len, rows, NULL);
    }
    if (gen > 1) ms[host] = (fr_now_ns() - t0) / 1e6 / (gen - 1);
  }
  if (!rc && gen > 1)
    printf("verify   batch %3d, k %d, %d steps: %8.3f ms/step forward, %8.3f with its %d logits rows on the host\n", B,
           K, gen - 1, ms[0], ms[1], B * (K + 1));
  free(seq), free(start), free(len), free(rows);
  return rc;
}

static int bench_blocks(int tokens) { return (tokens + BENCH_BLOCK - 1) / BENCH_BLOCK; }

/* The KV pool for what the run does, no more: the prefill's one sequence
 * of --prefill tokens, or maxB sequences of --prompt + --gen tokens, which
 * come after it and may reuse its blocks, and with --mixed one more of
 * --mixed tokens. Sequence s's blocks are s * (its share) onwards; the
 * prefill's (sequence 0) run on from block 0. */
static int bench_pool_init(bench_t *b, const bench_opts_t *o, int maxB) {
  int per_seq = bench_blocks(o->prompt + o->gen + o->verify), pre = bench_blocks(o->prefill), mix = bench_blocks(o->mixed);
  int64_t n_blocks = FR_MAX((int64_t)per_seq * maxB + mix, (int64_t)pre);
  if (n_blocks > INT32_MAX) return fr_errorf(FR_ETOOBIG, "%lld KV blocks", (long long)n_blocks);
  b->blocks_per_seq = FR_MAX(FR_MAX(per_seq, pre), mix);
  if (o->mixed) maxB++; /* the mixed steps' prefill sequence */
  b->max_seqs = maxB;
  kern_backend_t *be = b->m->be;
  kern_type_t kvt = be->act_type == KERN_F32 ? KERN_F16 : be->act_type;
  kern_kv_config_t kc = model_kv_config(b->m, BENCH_BLOCK, (int)n_blocks, kvt);
  kc.dtype = (kern_kv_dtype_t)o->kv_dtype;
  int rc = be->ops->kv_pool_init(be->ctx, &b->pool, &kc, NULL);
  if (rc) return fr_errorf(rc, "KV pool of %lld blocks: %s", (long long)n_blocks, fr_last_error());
  b->tables = fr_malloc((size_t)maxB * b->blocks_per_seq * sizeof(int32_t));
  for (int s = 0; s < maxB; s++)
    for (int j = 0; j < b->blocks_per_seq; j++)
      b->tables[s * b->blocks_per_seq + j] = (int32_t)(((int64_t)s * per_seq + j) % n_blocks);
  double mib = (double)kern_kv_pool_bytes(&kc) / (1 << 20);
  printf("KV pool: %lld blocks of %d tokens (%d sequences of %d tokens, prefill %d), %.1f MiB of %s K/V\n",
         (long long)n_blocks, BENCH_BLOCK, maxB, o->prompt + o->gen, o->prefill, mib,
         kc.dtype ? kern_kv_dtype_name(kc.dtype) : kern_type_traits(kvt)->name);
  return 0;
}

int main(int argc, char **argv) {
  bench_opts_t o;
  if (bench_parse(argc, argv, &o)) {
    fprintf(stderr, "usage: model_bench [--model PATH | --dummy NAME] [--device cpu|cuda] [--type T] "
                    "[--threads N] [--prefill N] [--prompt N] [--gen N] [--batch 1,64] [--repeat N] [--mixed P] "
                    "[--verify K] [--kv-cache-dtype auto|int8|fp8] [--quantization fp8]\n");
    return 2;
  }
  int maxB = 1;
  for (int i = 0; i < o.n_batches; i++) maxB = FR_MAX(maxB, o.batches[i]);
  kern_backend_t *be = NULL;
  model_t *m = NULL;
  int rc = kern_backend_create(&be, o.device, o.threads);
  int vrows = maxB * (o.verify + 1); /* a verify step's tokens and logits rows */
  model_load_opts_t lo = {.max_tokens = FR_MAX(FR_MAX(FR_MAX(o.prefill, o.mixed + maxB), FR_MAX(o.prompt, 256)), vrows),
                          .max_seqs = FR_MAX(maxB + 1, vrows),
                          .progress = true, .seed = 1, .fp8_weights = o.fp8};
  if (!rc) rc = model_dummy_weights(&lo, o.type);
  if (!rc && o.dummy) {
    model_config_t cfg;
    rc = model_dummy_config(o.dummy, &cfg);
    if (!rc && !o.type) rc = model_dummy_weights_of(&lo, o.dummy); /* a GPTQ / AWQ folder's own layout */
    if (!rc) rc = model_load_dummy(&m, &cfg, be, &lo);
  } else if (!rc) {
    rc = model_load(&m, o.model, be, &lo);
  }
  bench_t b = {.m = m};
  if (!rc) {
    printf("model %s (%s), device %s, %d layers, dim %d%s\n", o.dummy ? o.dummy : o.model, m->cfg.arch_name,
           be->ops->name, m->cfg.n_layers, m->cfg.dim, o.fp8 ? ", FP8 weights" : "");
    rc = bench_pool_init(&b, &o, maxB);
    b.pool_ready = !rc;
  }
  if (!rc) {
    size_t T = (size_t)m->max_tokens;
    b.tokens = fr_malloc(T * 4), b.pos = fr_malloc(T * 4), b.slots = fr_malloc(T * 4);
    b.q_start = fr_malloc((T + 1) * 4), b.ctx_len = fr_malloc(T * 4), b.next = fr_calloc((size_t)maxB, 4);
    b.logits_host = fr_malloc((size_t)FR_MAX(maxB + 1, vrows) * m->cfg.vocab_size * sizeof(float));
    if (o.prefill > 0) rc = bench_prefill(&b, o.prefill, o.repeat);
    for (int i = 0; i < o.n_batches && !rc; i++) {
      rc = bench_decode(&b, o.batches[i], o.prompt, o.gen);
      if (!rc && o.mixed) rc = bench_mixed(&b, o.batches[i], o.prompt, o.gen, o.mixed);
      if (!rc && o.verify) rc = bench_verify(&b, o.batches[i], o.prompt, o.gen, o.verify);
    }
  }
  if (rc) fprintf(stderr, "model_bench: %s\n", fr_last_error());
  if (b.pool_ready) be->ops->kv_pool_deinit(be->ctx, &b.pool);
  model_destroy(m);
  kern_backend_destroy(be);
  return rc ? 1 : 0;
}
