/* forward.c - the decoder layer stack (llama, qwen2, qwen3) over backend ops.
 *
 * One pass over a step's tokens (mixed prefill chunks and decodes):
 *   x = embed(tokens)
 *   per layer: xn = norm(x); q,k,v = xn W (+bias); [qwen3: per-head norms];
 *              rope(q,k); kv_append(k,v); att = attention(q); x += att Wo;
 *              xn = norm(x); x += (silu(xn Wg) * xn Wu) Wd
 *   logits = norm(x at each sequence's last token) Wout
 * Residual adds are fused into the next norm (add_rms_norm).
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "common/fr_err.h"
#include "model/model.h"

#define CALL(expr)              \
  do {                          \
    int rc__ = (expr);          \
    if (rc__ != 0) return rc__; \
  } while (0)

static const kern_weight_t *model__opt(const kern_weight_t *w) { return w->data ? w : NULL; }

static int model__attention_block(model_t *m, kern_kv_pool_t *pool, int il, int n) {
  const kern_ops_t *op = m->be->ops;
  void *cx = m->be->ctx;
  const model_config_t *c = &m->cfg;
  const model_layer_t *L = &m->layers[il];
  const int qd = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim;

  CALL(op->matmul(cx, m->q, &L->wq, model__opt(&L->bq), m->xn, n));
  CALL(op->matmul(cx, m->k, &L->wk, model__opt(&L->bk), m->xn, n));
  CALL(op->matmul(cx, m->v, &L->wv, model__opt(&L->bv), m->xn, n));
  if (c->qk_norm) {
    CALL(op->rms_norm(cx, m->q, m->q, &L->q_norm, n * c->n_heads, c->head_dim, c->norm_eps));
    CALL(op->rms_norm(cx, m->k, m->k, &L->k_norm, n * c->n_kv_heads, c->head_dim, c->norm_eps));
  }
  CALL(op->rope(cx, m->q, c->n_heads, c->head_dim, qd, &m->rope));
  CALL(op->rope(cx, m->k, c->n_kv_heads, c->head_dim, kvd, &m->rope));
  CALL(op->kv_append(cx, pool, il, m->k, kvd, m->v, kvd));
  CALL(op->attention(cx, m->att, m->q, qd, pool, il, c->n_heads, c->head_dim, 1.0f / sqrtf((float)c->head_dim)));
  /* xn = att Wo: the residual add happens in the next add_rms_norm. */
  CALL(op->matmul(cx, m->xn, &L->wo, NULL, m->att, n));
  return 0;
}

static int model__ffn_block(model_t *m, int il, int n) {
  const kern_ops_t *op = m->be->ops;
  void *cx = m->be->ctx;
  const model_config_t *c = &m->cfg;
  const model_layer_t *L = &m->layers[il];
  CALL(op->matmul(cx, m->gate, &L->w_gate, NULL, m->xn, n));
  CALL(op->matmul(cx, m->up, &L->w_up, NULL, m->xn, n));
  CALL(op->silu_mul(cx, m->gate, m->gate, m->up, n, c->ffn_dim, c->ffn_dim));
  CALL(op->matmul(cx, m->xn, &L->w_down, NULL, m->gate, n));
  return 0;
}

/* The layer stack after step_begin: leaves logits in m->logits. Safe to
 * capture as a graph (reads per-step inputs only through the step). */
static int model__run_layers(model_t *m, kern_kv_pool_t *pool, int n, int n_seqs) {
  const kern_ops_t *op = m->be->ops;
  void *cx = m->be->ctx;
  const model_config_t *c = &m->cfg;

  CALL(op->embed(cx, m->x, &m->tok_embd));
  CALL(op->rms_norm(cx, m->xn, m->x, &m->layers[0].attn_norm, n, c->dim, c->norm_eps));
  for (int il = 0; il < c->n_layers; il++) {
    CALL(model__attention_block(m, pool, il, n));
    CALL(op->add_rms_norm(cx, m->xn, m->x, m->xn, &m->layers[il].ffn_norm, n, c->dim, c->norm_eps));
    CALL(model__ffn_block(m, il, n));
    const kern_weight_t *next = il + 1 < c->n_layers ? &m->layers[il + 1].attn_norm : &m->output_norm;
    CALL(op->add_rms_norm(cx, m->xn, m->x, m->xn, next, n, c->dim, c->norm_eps));
  }
  /* xn holds norm(x) for every token; logits only for each sequence's last. */
  CALL(op->last_rows(cx, m->last, m->xn, c->dim));
  CALL(op->matmul(cx, m->logits, &m->output, NULL, m->last, n_seqs));
  return 0;
}

int model_forward(model_t *m, kern_kv_pool_t *pool, const kern_step_t *step, const void **logits) {
  if (step->n_tokens <= 0 || step->n_tokens > m->max_tokens || step->n_seqs <= 0 || step->n_seqs > m->max_seqs)
    return fr_errorf(-EINVAL, "step of %d tokens / %d sequences exceeds the model's scratch (%d / %d)",
                     step->n_tokens, step->n_seqs, m->max_tokens, m->max_seqs);
  for (int i = 0; i < step->n_tokens; i++)
    if (step->tokens[i] < 0 || step->tokens[i] >= m->cfg.vocab_size)
      return fr_errorf(-EINVAL, "token id %d out of range [0, %d)", step->tokens[i], m->cfg.vocab_size);
  const kern_ops_t *op = m->be->ops;
  CALL(op->step_begin(m->be->ctx, step));
  CALL(model__run_layers(m, pool, step->n_tokens, step->n_seqs));
  *logits = m->logits;
  return 0;
}

int model_logits_to_host(model_t *m, const void *logits, int n_seqs, float *out) {
  return m->be->ops->to_f32_host(m->be->ctx, out, logits, (size_t)n_seqs * m->cfg.vocab_size);
}
