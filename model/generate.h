/* generate.h - in-process generation for one sequence over a private
 * paged KV pool (identity block table). Used by `ferrumctl run` without a
 * server, by `ferrumctl bench --offline` and by the model tests. The
 * engine (coordinator + workers) schedules many sequences instead.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/model.h"
#include "model/sampler.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  model_t *m;            /* borrowed */
  kern_kv_pool_t pool;
  int block_size, n_blocks, max_ctx;
  int32_t *block_table;  /* (n_blocks) identity */
  int32_t *tokens;       /* (max_ctx) every token fed so far */
  int n_tokens;          /* tokens in the KV cache */
  float *logits;         /* (vocab) host logits after the last feed */
  /* per-step scratch (host) */
  int32_t *pos, *slots;
} model_gen_t;

/* Creates a generator for up to max_ctx tokens (0: the model's context,
 * capped at 4096). KV type: F16 on the CPU, the act type elsewhere. */
int model_gen_create(model_gen_t **out, model_t *m, int max_ctx);
/* The same with a KV cache dtype (kern_kv_dtype_t: auto, int8, fp8);
 * FR_EUNSUPPORTED (with a message) when the backend cannot keep it. */
int model_gen_create_kv(model_gen_t **out, model_t *m, int max_ctx, kern_kv_dtype_t dtype);
void model_gen_destroy(model_gen_t *g);

/* Forgets every token (the KV pool is reused). */
void model_gen_reset(model_gen_t *g);

/* Feeds tokens (prompt chunks of up to the model's max_tokens each) and
 * leaves the logits after the last one in g->logits. FR_ECONTEXT when the
 * context would overflow. */
int model_gen_feed(model_gen_t *g, const int32_t *tokens, int n);

#ifdef __cplusplus
}
#endif
