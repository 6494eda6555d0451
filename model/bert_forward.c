/* bert_forward.c - a BERT encoder's forward pass over backend ops
 * (model/bert.h has the formula). Every sequence of the step is whole:
 * its positions run from 0, its tokens attend to each other (no KV). */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "common/fr_err.h"
#include "model/bert.h"

#define CALL(expr)              \
  do {                          \
    int rc__ = (expr);          \
    if (rc__ != 0) return rc__; \
  } while (0)

/* Each sequence's positions are consecutive from its first, within the
 * position table. */
static int bert_check_positions(const model_t *m, const kern_step_t *st) {
  for (int s = 0; s < st->n_seqs; s++) {
    const int a = st->q_start[s], b = st->q_start[s + 1];
    if (b > a && (st->positions[a] < 0 || st->positions[a] + (b - a) > m->cfg.max_ctx))
      return fr_errorf(-EINVAL, "sequence %d: positions %d..%d past BERT's %d", s, st->positions[a],
                       st->positions[a] + (b - a), m->cfg.max_ctx);
    for (int t = a + 1; t < b; t++)
      if (st->positions[t] != st->positions[t - 1] + 1)
        return fr_errorf(-EINVAL, "sequence %d: positions are not consecutive", s);
  }
  return 0;
}

/* x = LayerNorm(token rows + position/type rows). */
static int bert_embed(model_t *m, const kern_step_t *st) {
  const kern_ops_t *op = m->be->ops;
  void *cx = m->be->ctx;
  const model_bert_t *b = m->bert;
  const size_t rb = (size_t)m->cfg.dim * m->be->act_size;
  CALL(op->embed(cx, m->x, &m->tok_embd));
  for (int s = 0; s < st->n_seqs; s++) {
    const int a = st->q_start[s], n = st->q_start[s + 1] - a;
    if (n > 0)
      CALL(op->copy(cx, (uint8_t *)m->xn + (size_t)a * rb, (const uint8_t *)b->pos_type.data +
                    (size_t)st->positions[a] * b->pos_type.row_bytes, (size_t)n * rb));
  }
  const int n = st->n_tokens;
  CALL(op->add(cx, m->x, m->x, m->xn, (size_t)n * m->cfg.dim));
  return op->layer_norm(cx, m->x, m->x, &b->embd_norm, &b->embd_norm_b, n, m->cfg.dim, m->cfg.norm_eps);
}

/* x = LayerNorm(x + attention(x) Wo + bo); then x = LayerNorm(x + FFN(x)). */
static int bert_layer(model_t *m, const model_bert_layer_t *L, int n) {
  const kern_ops_t *op = m->be->ops;
  void *cx = m->be->ctx;
  const model_config_t *c = &m->cfg;
  const size_t nd = (size_t)n * c->dim;
  uint8_t *q = m->qkv, *k = q + nd * m->be->act_size, *v = k + nd * m->be->act_size;
  CALL(op->matmul(cx, q, &L->wq, &L->bq, m->x, n));
  CALL(op->matmul(cx, k, &L->wk, &L->bk, m->x, n));
  CALL(op->matmul(cx, v, &L->wv, &L->bv, m->x, n));
  CALL(op->attention_full(cx, m->att, q, k, v, c->n_heads, c->head_dim, 1.0f / sqrtf((float)c->head_dim)));
  CALL(op->matmul(cx, m->xn, &L->wo, &L->bo, m->att, n));
  CALL(op->add(cx, m->x, m->x, m->xn, nd));
  CALL(op->layer_norm(cx, m->x, m->x, &L->attn_norm, &L->attn_norm_b, n, c->dim, c->norm_eps));
  CALL(op->matmul(cx, m->gate, &L->w_up, &L->b_up, m->x, n));
  CALL(op->gelu(cx, m->gate, (size_t)n * c->ffn_dim, c->gelu_erf));
  CALL(op->matmul(cx, m->xn, &L->w_down, &L->b_down, m->gate, n));
  CALL(op->add(cx, m->x, m->x, m->xn, nd));
  return op->layer_norm(cx, m->x, m->x, &L->out_norm, &L->out_norm_b, n, c->dim, c->norm_eps);
}

int model__bert_forward(model_t *m, const kern_step_t *st) {
  const kern_ops_t *op = m->be->ops;
  void *cx = m->be->ctx;
  CALL(bert_check_positions(m, st));
  CALL(op->step_begin(cx, st));
  CALL(bert_embed(m, st));
  for (int il = 0; il < m->cfg.n_layers; il++) CALL(bert_layer(m, &m->bert->layers[il], st->n_tokens));
  if (m->pooling == MODEL_POOL_LAST) return op->last_rows(cx, m->last, m->x, m->cfg.dim);
  return op->pool_rows(cx, m->last, m->x, m->cfg.dim, m->pooling == MODEL_POOL_MEAN ? KERN_POOL_MEAN : KERN_POOL_FIRST);
}
