/* model_bench - prefill and batched decode throughput of the layer stack on
 * a backend, outside the engine (no scheduler, no messaging):
 *   prefill: one sequence of --prefill tokens in one step;
 *   decode:  --batch B sequences with --prompt tokens each, then --gen decode
 *            steps of B tokens (greedy, sampled on the device when the
 *            backend can, else on the host).
 * usage: model_bench [--model PATH | --dummy NAME|config.json] [--device cpu|cuda[:N]]
 *          [--type bf16|f16|q8_0|q4_0|q4_1|q4_k|...] [--threads N] [--prefill N]
 *          [--prompt N] [--gen N] [--batch 1,64] [--repeat N]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "kernels/kern.h"
#include "model/dummy.h"
#include "model/model.h"

typedef struct {
  const char *model, *dummy, *device, *type;
  int threads, prefill, prompt, gen, repeat;
  int batches[16], n_batches;
} bench_opts_t;

static int bench_parse(int argc, char **argv, bench_opts_t *o) {
  *o = (bench_opts_t){.device = "cpu", .prefill = 512, .prompt = 128, .gen = 128, .repeat = 1,
                      .batches = {1}, .n_batches = 1};
  for (int i = 1; i < argc; i += 2) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) return -1;
    if (!strcmp(a, "--model")) o->model = v;
    else if (!strcmp(a, "--dummy")) o->dummy = v;
    else if (!strcmp(a, "--device")) o->device = v;
    else if (!strcmp(a, "--type")) o->type = v;
    else if (!strcmp(a, "--threads")) o->threads = atoi(v);
    else if (!strcmp(a, "--prefill")) o->prefill = atoi(v);
    else if (!strcmp(a, "--prompt")) o->prompt = atoi(v);
    else if (!strcmp(a, "--gen")) o->gen = atoi(v);
    else if (!strcmp(a, "--repeat")) o->repeat = atoi(v);
    else if (!strcmp(a, "--batch")) {
      o->n_batches = 0;
      for (char *s = (char *)v; *s && o->n_batches < 16;) {
        o->batches[o->n_batches++] = (int)strtol(s, &s, 10);
        if (*s == ',') s++;
      }
    } else return -1;
  }
  return o->model || o->dummy ? 0 : -1;
}

typedef struct {
  model_t *m;
  kern_kv_pool_t pool;
  int blocks_per_seq, max_seqs;
  int32_t *tables, *tokens, *pos, *slots, *q_start, *ctx_len, *next;
  float *logits_host;
} bench_t;

static int bench_step(bench_t *b, int n_seqs, const int *seq, const int *start, const int *len, int32_t *out_tok) {
  int n = 0;
  b->q_start[0] = 0;
  for (int s = 0; s < n_seqs; s++) {
    for (int j = 0; j < len[s]; j++, n++) {
      int p = start[s] + j;
      b->tokens[n] = (int32_t)((seq[s] * 7919 + p * 31) % b->m->cfg.vocab_size);
      if (out_tok && len[s] == 1) b->tokens[n] = b->next[seq[s]];
      b->pos[n] = p;
      b->slots[n] = b->tables[seq[s] * b->blocks_per_seq + p / 16] * 16 + p % 16;
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
  int rc = model_forward(b->m, &b->pool, &st, &logits);
  if (rc) return rc;
  const kern_ops_t *op = b->m->be->ops;
  if (!out_tok) return op->sync(b->m->be->ctx);
  if (op->sample) {
    kern_sample_params_t sp[256] = {{0}};
    float lp[256];
    return op->sample(b->m->be->ctx, logits, n_seqs, b->m->cfg.vocab_size, sp, out_tok, lp);
  }
  int V = b->m->cfg.vocab_size;
  if ((rc = model_logits_to_host(b->m, logits, n_seqs, b->logits_host))) return rc;
  for (int s = 0; s < n_seqs; s++) {
    const float *l = b->logits_host + (size_t)s * V;
    int best = 0;
    for (int i = 1; i < V; i++)
      if (l[i] > l[best]) best = i;
    out_tok[s] = best;
  }
  return 0;
}

static int bench_prefill(bench_t *b, int n_tok, int repeat) {
  double best = 1e30;
  for (int r = 0; r < repeat + 1; r++) {
    int seq = 0, start = 0, len = n_tok;
    uint64_t t0 = fr_now_ns();
    int rc = bench_step(b, 1, &seq, &start, &len, NULL);
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
    rc = bench_step(b, k, seq, start, len, tok);
    for (int s = 0; s < k; s++) b->next[s0 + s] = tok[s];
  }
  for (int s = 0; s < B; s++) seq[s] = s, len[s] = 1;
  uint64_t t0 = 0;
  for (int g = 0; g < gen && !rc; g++) {
    if (g == 1) t0 = fr_now_ns(); /* step 0 warms up (and captures graphs) */
    for (int s = 0; s < B; s++) start[s] = prompt + g;
    rc = bench_step(b, B, seq, start, len, tok);
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

int main(int argc, char **argv) {
  bench_opts_t o;
  if (bench_parse(argc, argv, &o)) {
    fprintf(stderr, "usage: model_bench [--model PATH | --dummy NAME] [--device cpu|cuda] [--type T] "
                    "[--threads N] [--prefill N] [--prompt N] [--gen N] [--batch 1,64] [--repeat N]\n");
    return 2;
  }
  int maxB = 1;
  for (int i = 0; i < o.n_batches; i++) maxB = FR_MAX(maxB, o.batches[i]);
  kern_backend_t *be = NULL;
  model_t *m = NULL;
  int rc = kern_backend_create(&be, o.device, o.threads);
  model_load_opts_t lo = {.max_tokens = FR_MAX(o.prefill, FR_MAX(o.prompt, 256)), .max_seqs = FR_MAX(maxB, 1),
                          .progress = true, .dummy_type = (kern_type_t)FR_MAX(kern_type_from_name(o.type), 0), .seed = 1};
  if (!rc && o.dummy) {
    model_config_t cfg;
    rc = model_dummy_config(o.dummy, &cfg);
    if (!rc) rc = model_load_dummy(&m, &cfg, be, &lo);
  } else if (!rc) {
    rc = model_load(&m, o.model, be, &lo);
  }
  bench_t b = {.m = m};
  if (!rc) {
    int ctx = FR_MAX(o.prefill, o.prompt + o.gen) + 16;
    b.blocks_per_seq = (ctx + 15) / 16;
    b.max_seqs = maxB;
    kern_type_t kvt = be->act_type == KERN_F32 ? KERN_F16 : be->act_type;
    kern_kv_config_t kc = model_kv_config(m, 16, b.blocks_per_seq * maxB, kvt);
    rc = be->ops->kv_pool_init(be->ctx, &b.pool, &kc, NULL);
  }
  if (!rc) {
    b.tables = fr_malloc((size_t)maxB * b.blocks_per_seq * sizeof(int32_t));
    for (int i = 0; i < maxB * b.blocks_per_seq; i++) b.tables[i] = i;
    size_t T = (size_t)m->max_tokens;
    b.tokens = fr_malloc(T * 4), b.pos = fr_malloc(T * 4), b.slots = fr_malloc(T * 4);
    b.q_start = fr_malloc((T + 1) * 4), b.ctx_len = fr_malloc(T * 4), b.next = fr_calloc((size_t)maxB, 4);
    b.logits_host = fr_malloc((size_t)maxB * m->cfg.vocab_size * sizeof(float));
    printf("model %s (%s), device %s, %d layers, dim %d\n", o.dummy ? o.dummy : o.model, m->cfg.arch_name,
           be->ops->name, m->cfg.n_layers, m->cfg.dim);
    if (o.prefill > 0) rc = bench_prefill(&b, o.prefill, o.repeat);
    for (int i = 0; i < o.n_batches && !rc; i++) rc = bench_decode(&b, o.batches[i], o.prompt, o.gen);
  }
  if (rc) fprintf(stderr, "model_bench: %s\n", fr_last_error());
  if (m) be->ops->kv_pool_deinit(be->ctx, &b.pool);
  model_destroy(m);
  kern_backend_destroy(be);
  return rc ? 1 : 0;
}
