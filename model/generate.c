/* generate.c - single-sequence generation over a private KV pool. */
#include "model/generate.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_util.h"

int model_gen_create(model_gen_t **out, model_t *m, int max_ctx) {
  return model_gen_create_kv(out, m, max_ctx, KERN_KV_AUTO);
}

int model_gen_create_kv(model_gen_t **out, model_t *m, int max_ctx, kern_kv_dtype_t dtype) {
  *out = NULL;
  if (!(m->be->kv_dtypes & (1u << dtype)))
    return fr_errorf(FR_EUNSUPPORTED, "--kv-cache-dtype %s: the %s backend cannot keep it%s",
                     kern_kv_dtype_name(dtype), m->be->ops->name,
                     dtype == KERN_KV_FP8 ? " (fp8 KV needs a CUDA device)" : "");
  if (max_ctx <= 0) max_ctx = m->cfg.max_ctx > 0 && m->cfg.max_ctx < 4096 ? m->cfg.max_ctx : 4096;
  model_gen_t *g = fr_calloc(1, sizeof *g);
  g->m = m;
  g->block_size = 16;
  g->n_blocks = (max_ctx + g->block_size - 1) / g->block_size;
  g->max_ctx = g->n_blocks * g->block_size;
  kern_type_t kv_type = m->be->act_type == KERN_F32 ? KERN_F16 : m->be->act_type;
  kern_kv_config_t kc = model_kv_config(m, g->block_size, g->n_blocks, kv_type);
  kc.dtype = dtype;
  int rc = m->be->ops->kv_pool_init(m->be->ctx, &g->pool, &kc, NULL);
  if (rc) {
    int nb = g->n_blocks;
    free(g);
    return fr_errorf(rc, "KV pool of %d blocks: %s", nb, fr_strerror(rc));
  }
  g->block_table = fr_malloc((size_t)g->n_blocks * sizeof(int32_t));
  for (int i = 0; i < g->n_blocks; i++) g->block_table[i] = i;
  g->tokens = fr_malloc((size_t)g->max_ctx * sizeof(int32_t));
  g->logits = fr_malloc((size_t)m->cfg.vocab_size * sizeof(float));
  g->pos = fr_malloc((size_t)m->max_tokens * sizeof(int32_t));
  g->slots = fr_malloc((size_t)m->max_tokens * sizeof(int32_t));
  *out = g;
  return 0;
}

void model_gen_destroy(model_gen_t *g) {
  if (!g) return;
  g->m->be->ops->kv_pool_deinit(g->m->be->ctx, &g->pool);
  free(g->block_table);
  free(g->tokens);
  free(g->logits);
  free(g->pos);
  free(g->slots);
  free(g);
}

void model_gen_reset(model_gen_t *g) { g->n_tokens = 0; }

static int model__gen_chunk(model_gen_t *g, const int32_t *tokens, int n) {
  for (int i = 0; i < n; i++) {
    g->pos[i] = g->n_tokens + i;
    g->slots[i] = g->n_tokens + i; /* identity block table */
    g->tokens[g->n_tokens + i] = tokens[i];
  }
  int32_t q_start[2] = {0, n};
  int32_t ctx_len[1] = {g->n_tokens + n};
  kern_step_t step = {
      .n_tokens = n,
      .tokens = tokens,
      .n_seqs = 1,
      .positions = g->pos,
      .slots = g->slots,
      .q_start = q_start,
      .ctx_len = ctx_len,
      .block_tables = g->block_table,
      .max_blocks = g->n_blocks,
  };
  const void *logits;
  int rc = model_forward(g->m, &g->pool, &step, &logits);
  if (rc) return rc;
  g->n_tokens += n;
  return model_logits_to_host(g->m, logits, 1, g->logits);
}

int model_gen_feed(model_gen_t *g, const int32_t *tokens, int n) {
  if (n <= 0) return fr_errorf(-EINVAL, "nothing to feed");
  if (g->n_tokens + n > g->max_ctx)
    return fr_errorf(FR_ECONTEXT, "%d tokens exceed the context of %d", g->n_tokens + n, g->max_ctx);
  for (int done = 0; done < n;) {
    int c = FR_MIN(n - done, g->m->max_tokens);
    int rc = model__gen_chunk(g, tokens + done, c);
    if (rc) return rc;
    done += c;
  }
  return 0;
}
