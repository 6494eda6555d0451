/* bert_load.c - a BERT encoder's tensors: their Hugging Face names, the
 * shape checks and the load onto the backend (model/bert.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "model/bert.h"
#include "model/model_impl.h"

/* Position rows plus token type 0's row (absent: zeros), as F32. */
static int bert_load_pos_type(model_t *m, model_bert_t *b) {
  const model_config_t *c = &m->cfg;
  const model_tensor_t *p = model_source_tensor(m->src, "position_embd.weight");
  const model_tensor_t *t = model_source_tensor(m->src, "token_types.weight");
  const size_t d = (size_t)c->dim;
  if (p->type != KERN_F32 && p->type != KERN_F16 && p->type != KERN_BF16)
    return fr_errorf(FR_EUNSUPPORTED, "tensor position_embd.weight: F32, F16 or BF16 only");
  if (t && t->type != KERN_F32 && t->type != KERN_F16 && t->type != KERN_BF16)
    return fr_errorf(FR_EUNSUPPORTED, "tensor token_types.weight: F32, F16 or BF16 only");
  float *rows = fr_malloc((size_t)c->max_ctx * d * sizeof(float)), *type0 = fr_calloc(d, sizeof(float));
  kern_dequantize_row(p->type, p->data, rows, (int64_t)c->max_ctx * c->dim);
  if (t) kern_dequantize_row(t->type, t->data, type0, c->dim);
  for (size_t r = 0; r < (size_t)c->max_ctx; r++)
    for (size_t i = 0; i < d; i++) rows[r * d + i] += type0[i];
  free(type0);
  b->pos_type = (kern_weight_t){.type = KERN_F32, .rows = c->max_ctx, .cols = c->dim, .row_bytes = d * sizeof(float)};
  model__keep(m, rows); /* the backend may borrow it */
  return model__weight_load(m, &b->pos_type, rows, "position_embd.weight + token_types.weight");
}

/* A layer's matrix and its F32 bias. */
static int bert_load_lin(model_t *m, int il, const char *what, kern_weight_t *w, kern_weight_t *bias, int64_t rows,
                         int64_t cols) {
  char name[96];
  snprintf(name, sizeof name, "blk.%d.%s.weight", il, what);
  int rc = rows == 1 ? model__load_f32_vector(m, w, name, true, cols) : model__load_weight(m, w, name, true, rows, cols);
  snprintf(name, sizeof name, "blk.%d.%s.bias", il, what);
  return rc ? rc : model__load_f32_vector(m, bias, name, true, rows == 1 ? cols : rows);
}

static int bert_load_layer(model_t *m, int il, model_bert_layer_t *L) {
  const int64_t d = m->cfg.dim, f = m->cfg.ffn_dim;
  int rc = bert_load_lin(m, il, "attn_q", &L->wq, &L->bq, d, d);
  if (!rc) rc = bert_load_lin(m, il, "attn_k", &L->wk, &L->bk, d, d);
  if (!rc) rc = bert_load_lin(m, il, "attn_v", &L->wv, &L->bv, d, d);
  if (!rc) rc = bert_load_lin(m, il, "attn_output", &L->wo, &L->bo, d, d);
  if (!rc) rc = bert_load_lin(m, il, "attn_output_norm", &L->attn_norm, &L->attn_norm_b, 1, d);
  if (!rc) rc = bert_load_lin(m, il, "ffn_up", &L->w_up, &L->b_up, f, d);
  if (!rc) rc = bert_load_lin(m, il, "ffn_down", &L->w_down, &L->b_down, d, f);
  if (!rc) rc = bert_load_lin(m, il, "layer_output_norm", &L->out_norm, &L->out_norm_b, 1, d);
  return rc;
}

int model__bert_load(model_t *m) {
  const kern_ops_t *op = m->be->ops;
  if (!op->layer_norm || !op->gelu || !op->attention_full || !op->pool_rows)
    return fr_errorf(FR_EUNSUPPORTED, "BERT encoders run on the CPU backend only for now (the %s backend has no "
                     "layer_norm, gelu or bidirectional attention op)", op->name);
  if (m->pooling == MODEL_POOL_NONE)
    return fr_errorf(FR_EUNSUPPORTED, "a BERT encoder makes embeddings, not text: serve it with --task embed");
  if (m->shard.size > 1) return fr_errorf(FR_EUNSUPPORTED, "BERT encoders run without tensor parallelism");
  model_bert_t *b = m->bert = fr_calloc(1, sizeof *b);
  b->layers = fr_calloc((size_t)m->cfg.n_layers, sizeof *b->layers);
  int rc = model__load_weight(m, &m->tok_embd, "token_embd.weight", true, m->cfg.vocab_size, m->cfg.dim);
  if (!rc) rc = bert_load_pos_type(m, b);
  if (!rc) rc = model__load_f32_vector(m, &b->embd_norm, "token_embd_norm.weight", true, m->cfg.dim);
  if (!rc) rc = model__load_f32_vector(m, &b->embd_norm_b, "token_embd_norm.bias", true, m->cfg.dim);
  for (int il = 0; il < m->cfg.n_layers && !rc; il++) rc = bert_load_layer(m, il, &b->layers[il]);
  return rc;
}

void model__bert_release(model_t *m) {
  model_bert_t *b = m->bert;
  if (!b) return;
  for (int il = 0; b->layers && il < m->cfg.n_layers; il++) {
    model_bert_layer_t *L = &b->layers[il];
    kern_weight_t *ws[] = {&L->wq, &L->wk, &L->wv, &L->bq, &L->bk, &L->bv, &L->wo, &L->bo, &L->attn_norm,
                           &L->attn_norm_b, &L->w_up, &L->b_up, &L->w_down, &L->b_down, &L->out_norm, &L->out_norm_b};
    for (size_t i = 0; i < FR_ARRAY_SIZE(ws); i++) model__release_weight(m, ws[i]);
  }
  model__release_weight(m, &b->pos_type);
  model__release_weight(m, &b->embd_norm);
  model__release_weight(m, &b->embd_norm_b);
  free(b->layers);
  free(b);
  m->bert = NULL;
}
