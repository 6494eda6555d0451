/* forward_rows.h - test helper for model_forward_rows (speculative
 * decoding's verify pass): a tiny random llama on a backend, one sequence
 * at a time in its own KV pool, so tests can compare the logits rows of
 * one multi-token step against those of token-by-token decoding (CPU:
 * bit-exact) or against another backend (CUDA: normalized error).
 * Header-only; a test includes it once. */
#pragma once

#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "kernels/kern.h"
#include "model/model.h"

#define FWR_BS 16   /* tokens per KV block */
#define FWR_NB 8    /* blocks: 128 tokens */

typedef struct {
  model_t *m;
  kern_kv_pool_t pool;
  int32_t table[FWR_NB];
} fwr_t;

/* A 2-layer llama (head_dim 64: the CUDA attention takes 64, 128, 256) of random f16 weights (the same on every backend for a
 * seed); 0 or an error. */
static int fwr_init(fwr_t *f, kern_backend_t *be, uint64_t seed) {
  memset(f, 0, sizeof *f);
  model_config_t c = {.arch = MODEL_ARCH_LLAMA, .arch_name = "llama", .name = "fwr", .n_layers = 2, .dim = 256,
                      .ffn_dim = 256, .n_heads = 4, .n_kv_heads = 2, .head_dim = 64, .vocab_size = 512,
                      .max_ctx = FWR_BS * FWR_NB, .norm_eps = 1e-5f, .rope_theta = 10000.0f, .rope_dim = 64,
                      .bos_id = -1};
  model_load_opts_t lo = {.max_tokens = 64, .max_seqs = 8, .dummy_type = KERN_F16, .seed = seed};
  int rc = model_load_dummy(&f->m, &c, be, &lo);
  if (rc) return rc;
  kern_type_t kv = be->act_type == KERN_F32 ? KERN_F16 : be->act_type;
  kern_kv_config_t kc = model_kv_config(f->m, FWR_BS, FWR_NB, kv);
  if ((rc = be->ops->kv_pool_init(be->ctx, &f->pool, &kc, NULL))) return rc;
  for (int i = 0; i < FWR_NB; i++) f->table[i] = i;
  return 0;
}

static void fwr_deinit(fwr_t *f) {
  if (f->m) f->m->be->ops->kv_pool_deinit(f->m->be->ctx, &f->pool);
  model_destroy(f->m);
}

/* Feeds tok[0..n) at positions pos.. of the one sequence and copies its
 * last `rows` logits rows to out (rows * vocab floats; rows 0: the plain
 * model_forward, one row). */
static int fwr_step(fwr_t *f, const int32_t *tok, int pos, int n, int rows, float *out) {
  int32_t p[64], slots[64], qs[2] = {0, n}, ctx = pos + n, r[1] = {rows};
  for (int i = 0; i < n; i++) p[i] = pos + i, slots[i] = f->table[(pos + i) / FWR_BS] * FWR_BS + (pos + i) % FWR_BS;
  kern_step_t st = {.n_tokens = n, .tokens = tok, .n_seqs = 1, .positions = p, .slots = slots, .q_start = qs,
                    .ctx_len = &ctx, .block_tables = f->table, .max_blocks = FWR_NB};
  const void *logits;
  int rc = rows ? model_forward_rows(f->m, &f->pool, &st, r, &logits) : model_forward(f->m, &f->pool, &st, &logits);
  if (rc) return rc;
  return model_logits_to_host(f->m, logits, rows ? rows : 1, out);
}
