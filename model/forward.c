/* forward.c - the decoder layer stack (llama, qwen2, qwen3, qwen3moe) over backend ops.
 *
 * One pass over a step's tokens (mixed prefill chunks and decodes):
 *   x = embed(tokens)
 *   per layer: xn = norm(x); q,k,v = xn W (+bias); [qwen3: per-head norms];
 *              rope(q,k); kv_append(k,v); att = attention(q); x += att Wo;
 *              xn = norm(x); x += (silu(xn Wg) * xn Wu) Wd
 *              [MoE layers: x += moe_ffn(xn), the top-k experts' FFNs weighted]
 *   logits = norm(x at each sequence's last token) Wout
 * Residual adds are fused into the next norm (add_rms_norm). Under tensor
 * parallelism (model/shard.h) the outputs of Wo and Wd are all-reduced
 * before that norm (one op with it where the backend has one) and the
 * logits of each rank's vocabulary slice are gathered on rank 0.
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_hash.h"
#include "common/fr_util.h"
#include "model/bert.h"
#include "model/model.h"

#define CALL(expr)              \
  do {                          \
    int rc__ = (expr);          \
    if (rc__ != 0) return rc__; \
  } while (0)

static const kern_weight_t *model__opt(const kern_weight_t *w) { return w->data ? w : NULL; }

/* q, k, v of each token sit side by side in m->qkv (row stride qkvd),
 * from one fused matmul or three. */
static int model__qkv(model_t *m, const model_layer_t *L, int n, void *q, void *k, void *v) {
  const kern_ops_t *op = m->be->ops;
  void *cx = m->be->ctx;
  if (L->wqkv.data) return op->matmul(cx, m->qkv, &L->wqkv, model__opt(&L->bqkv), m->xn, n);
  /* unfused: three matmuls, each into its own contiguous (n, rows) block */
  CALL(op->matmul(cx, q, &L->wq, model__opt(&L->bq), m->xn, n));
  CALL(op->matmul(cx, k, &L->wk, model__opt(&L->bk), m->xn, n));
  CALL(op->matmul(cx, v, &L->wv, model__opt(&L->bv), m->xn, n));
  return 0;
}

/* x += xn, then xn = norm(x) * w. Under tensor parallelism xn holds this
 * rank's partial sum of a row-split projection (attn_output, ffn_down, the
 * experts' down): it is all-reduced first, in one op with the norm where
 * the backend has one. */
static int model__add_norm(model_t *m, const kern_weight_t *w, int n) {
  const kern_ops_t *op = m->be->ops;
  void *cx = m->be->ctx;
  const model_config_t *c = &m->cfg;
  if (m->shard.size <= 1) return op->add_rms_norm(cx, m->xn, m->x, m->xn, w, n, c->dim, c->norm_eps);
  uint64_t t0 = fr_now_ns();
  int rc = op->all_reduce_add_rms_norm ? op->all_reduce_add_rms_norm(cx, m->xn, m->x, m->xn, w, n, c->dim, c->norm_eps)
                                       : op->all_reduce(cx, m->xn, (size_t)n * (size_t)c->dim);
  m->comm_ns += fr_now_ns() - t0;
  if (rc || op->all_reduce_add_rms_norm) return rc;
  return op->add_rms_norm(cx, m->xn, m->x, m->xn, w, n, c->dim, c->norm_eps);
}

/* Keys a query of layer il sees (itself included); 0: all before it. */
static int model__window(const model_config_t *c, int il) {
  return c->sliding_window > 0 && il >= c->swa_first_layer ? c->sliding_window : 0;
}

/* q, k, v of layer il's step tokens into m->qkv (see model__attention_block
 * for the layout), rotated, and k, v appended to the pool. */
static int model__qkv_rope_append(model_t *m, kern_kv_pool_t *pool, int il, int n, void *q, void *k, void *v, int qs,
                                  int ks) {
  const kern_ops_t *op = m->be->ops;
  void *cx = m->be->ctx;
  const model_config_t *c = &m->cfg;
  const model_layer_t *L = &m->layers[il];
  if (L->wqkv.data && !c->qk_norm && op->matmul_rope_kv_append)
    return op->matmul_rope_kv_append(cx, m->qkv, &L->wqkv, model__opt(&L->bqkv), m->xn, n, pool, il, c->n_heads,
                                     &m->rope);
  CALL(model__qkv(m, L, n, q, k, v));
  if (c->qk_norm) { /* never fused: rows of head_dim must be contiguous */
    CALL(op->rms_norm(cx, q, q, &L->q_norm, n * c->n_heads, c->head_dim, c->norm_eps));
    CALL(op->rms_norm(cx, k, k, &L->k_norm, n * c->n_kv_heads, c->head_dim, c->norm_eps));
  }
  if (op->rope_kv_append) return op->rope_kv_append(cx, pool, il, q, qs, k, v, ks, c->n_heads, &m->rope);
  CALL(op->rope(cx, q, c->n_heads, c->head_dim, qs, &m->rope));
  CALL(op->rope(cx, k, c->n_kv_heads, c->head_dim, ks, &m->rope));
  return op->kv_append(cx, pool, il, k, ks, v, ks);
}

static int model__attention_block(model_t *m, kern_kv_pool_t *pool, int il, int n) {
  const kern_ops_t *op = m->be->ops;
  void *cx = m->be->ctx;
  const model_config_t *c = &m->cfg;
  const model_layer_t *L = &m->layers[il];
  const int qd = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim;
  const size_t es = m->be->act_size;
  /* fused: q/k/v interleaved per token (stride qd + 2kvd); unfused: three
   * contiguous blocks (strides qd, kvd, kvd) */
  const bool fused = L->wqkv.data != NULL;
  const int qs = fused ? qd + 2 * kvd : qd, ks = fused ? qs : kvd;
  uint8_t *base = m->qkv;
  void *q = base, *k = base + (fused ? (size_t)qd : (size_t)n * qd) * es;
  void *v = fused ? base + (size_t)(qd + kvd) * es : (uint8_t *)k + (size_t)n * kvd * es;

  CALL(model__qkv_rope_append(m, pool, il, n, q, k, v, qs, ks));
  CALL(op->attention(cx, m->att, q, qs, pool, il, c->n_heads, c->head_dim, 1.0f / sqrtf((float)c->head_dim),
                     model__window(c, il)));
  /* xn = att Wo: the residual add happens in the next norm (model__add_norm). */
  return op->matmul(cx, m->xn, &L->wo, NULL, m->att, n);
}

/* xn = the mixture-of-experts FFN of xn (the op reads all of xn first). */
static int model__moe_block(model_t *m, const model_layer_t *L, int n) {
  const model_config_t *c = &m->cfg;
  const kern_moe_t moe = {.router = &L->router, .gate = L->exp_gate, .up = L->exp_up, .down = L->exp_down,
                          .n_experts = c->n_experts, .n_used = c->n_experts_used, .norm_topk = c->norm_topk};
  return m->be->ops->moe_ffn(m->be->ctx, m->xn, m->xn, n, &moe);
}

static int model__ffn_block(model_t *m, int il, int n) {
  const kern_ops_t *op = m->be->ops;
  void *cx = m->be->ctx;
  const model_config_t *c = &m->cfg;
  const model_layer_t *L = &m->layers[il];
  const int f = c->ffn_dim;
  if (L->exp_gate) return model__moe_block(m, L, n); /* model_load checked the op is there */
  if (L->w_gate_up.data && op->matmul_silu_mul) {
    CALL(op->matmul_silu_mul(cx, m->up, &L->w_gate_up, m->xn, n, m->gate));
  } else if (L->w_gate_up.data) { /* gate, up side by side per token */
    CALL(op->matmul(cx, m->gate, &L->w_gate_up, NULL, m->xn, n));
    CALL(op->silu_mul(cx, m->up, m->gate, (uint8_t *)m->gate + (size_t)f * m->be->act_size, n, f, 2 * f));
  } else { /* gate block then up block */
    void *up = (uint8_t *)m->gate + (size_t)n * f * m->be->act_size;
    CALL(op->matmul(cx, m->gate, &L->w_gate, NULL, m->xn, n));
    CALL(op->matmul(cx, up, &L->w_up, NULL, m->xn, n));
    CALL(op->silu_mul(cx, m->up, m->gate, up, n, f, f));
  }
  return op->matmul(cx, m->xn, &L->w_down, NULL, m->up, n);
}

/* Several logits rows per sequence (speculative decoding): the last
 * rows[s] tokens of sequence s, gathered from xn into m->last with one
 * device copy per run of consecutive rows. Returns the row count. */
static int model__gather_rows(model_t *m, const kern_step_t *st, const int32_t *rows, int *n_out) {
  const size_t rb = (size_t)m->cfg.dim * m->be->act_size;
  int out = 0, run_from = -1, run_len = 0;
  for (int s = 0; s < st->n_seqs; s++) {
    int end = st->q_start[s + 1], from = end - rows[s];
    if (run_len && run_from + run_len != from) {
      CALL(m->be->ops->copy(m->be->ctx, (uint8_t *)m->last + (size_t)(out - run_len) * rb,
                            (const uint8_t *)m->xn + (size_t)run_from * rb, (size_t)run_len * rb));
      run_len = 0;
    }
    if (!run_len) run_from = from;
    run_len += rows[s];
    out += rows[s];
  }
  if (run_len)
    CALL(m->be->ops->copy(m->be->ctx, (uint8_t *)m->last + (size_t)(out - run_len) * rb,
                          (const uint8_t *)m->xn + (size_t)run_from * rb, (size_t)run_len * rb));
  *n_out = out;
  return 0;
}

/* The layer stack after step_begin: leaves logits in m->logits, one row
 * per sequence, or rows[s] rows for sequence s of st (NULL: one). Safe to
 * capture as a graph without rows (reads per-step inputs only through the
 * step). */
static int model__run_layers(model_t *m, kern_kv_pool_t *pool, int n, int n_seqs, const kern_step_t *st,
                             const int32_t *rows) {
  const kern_ops_t *op = m->be->ops;
  void *cx = m->be->ctx;
  const model_config_t *c = &m->cfg;

  CALL(op->embed(cx, m->x, &m->tok_embd));
  CALL(op->rms_norm(cx, m->xn, m->x, &m->layers[0].attn_norm, n, c->dim, c->norm_eps));
  for (int il = 0; il < c->n_layers; il++) {
    CALL(model__attention_block(m, pool, il, n));
    CALL(model__add_norm(m, &m->layers[il].ffn_norm, n));
    CALL(model__ffn_block(m, il, n));
    CALL(model__add_norm(m, il + 1 < c->n_layers ? &m->layers[il + 1].attn_norm : &m->output_norm, n));
  }
  if (m->shard.rank != 0 && !m->shard.split_vocab) return 0; /* rank 0 samples: only it needs logits */
  /* xn holds norm(x) for every token; logits only for each sequence's last
   * (or, verifying proposals, its last rows[s]). */
  if (m->pooling == MODEL_POOL_MEAN || m->pooling == MODEL_POOL_CLS) /* embeddings: no LM head */
    return op->pool_rows(cx, m->last, m->xn, c->dim, m->pooling == MODEL_POOL_MEAN ? KERN_POOL_MEAN : KERN_POOL_FIRST);
  if (rows) CALL(model__gather_rows(m, st, rows, &n_seqs));
  else CALL(op->last_rows(cx, m->last, m->xn, c->dim));
  if (m->pooling == MODEL_POOL_LAST) return 0; /* embeddings: the last token's norm(x), no LM head */
  if (!m->shard.split_vocab) return op->matmul(cx, m->logits, &m->output, NULL, m->last, n_seqs);
  /* this rank's vocabulary slice, gathered into rank 0's logits */
  CALL(op->matmul(cx, m->logits_part, &m->output, NULL, m->last, n_seqs));
  return op->gather_cols(cx, m->logits, m->logits_part, n_seqs, m->shard.n_vocab);
}

/* Decode steps on a backend with graphs run padded to a fixed shape: a
 * batch-size bucket (powers of two up to max_seqs) and a block-table width
 * rounded up to a multiple of 64, so that one captured graph serves every
 * step of that shape. Padding tokens write no K/V (slot -1) and padding
 * sequences have no context (ctx_len 0). */
static int model__bucket(int n, int max) {
  int b = 1;
  while (b < n) b <<= 1;
  return b <= max ? b : max;
}

static int model__pad_step(model_t *m, const kern_step_t *st, int B, int W, kern_step_t *out) {
  model_pad_t *p = &m->pad;
  if (p->cap_seqs < B || p->cap_bt < (size_t)B * W) {
    p->cap_seqs = FR_MAX(B, p->cap_seqs);
    p->cap_bt = FR_MAX((size_t)B * W, p->cap_bt);
    p->tokens = fr_realloc(p->tokens, (size_t)p->cap_seqs * sizeof(int32_t));
    p->positions = fr_realloc(p->positions, (size_t)p->cap_seqs * sizeof(int32_t));
    p->slots = fr_realloc(p->slots, (size_t)p->cap_seqs * sizeof(int32_t));
    p->q_start = fr_realloc(p->q_start, (size_t)(p->cap_seqs + 1) * sizeof(int32_t));
    p->ctx_len = fr_realloc(p->ctx_len, (size_t)p->cap_seqs * sizeof(int32_t));
    p->block_tables = fr_realloc(p->block_tables, p->cap_bt * sizeof(int32_t));
  }
  const int n = st->n_seqs;
  memset(p->block_tables, 0, (size_t)B * W * sizeof(int32_t));
  for (int i = 0; i < B; i++) {
    bool real = i < n;
    p->tokens[i] = real ? st->tokens[i] : 0;
    p->positions[i] = real ? st->positions[i] : 0;
    p->slots[i] = real ? st->slots[i] : -1;
    p->ctx_len[i] = real ? st->ctx_len[i] : 0;
    p->q_start[i] = i;
    if (real) memcpy(p->block_tables + (size_t)i * W, st->block_tables + (size_t)i * st->max_blocks,
                     (size_t)st->max_blocks * sizeof(int32_t));
  }
  p->q_start[B] = B;
  *out = (kern_step_t){.n_tokens = B, .tokens = p->tokens, .n_seqs = B, .positions = p->positions,
                       .slots = p->slots, .q_start = p->q_start, .ctx_len = p->ctx_len,
                       .block_tables = p->block_tables, .max_blocks = W};
  return 0;
}

static bool model__use_graph(const model_t *m, const kern_step_t *st) {
  if (!m->be->ops->graph_begin || m->no_graphs || m->pooling || st->n_tokens != st->n_seqs) return false;
  for (int i = 0; i <= st->n_seqs; i++)
    if (st->q_start[i] != i) return false;
  return true;
}

static int model__forward_graph(model_t *m, kern_kv_pool_t *pool, const kern_step_t *step) {
  const kern_ops_t *op = m->be->ops;
  const int B = model__bucket(step->n_seqs, m->max_seqs), W = (step->max_blocks + 63) / 64 * 64;
  kern_step_t padded;
  CALL(model__pad_step(m, step, B, W, &padded));
  CALL(op->step_begin(m->be->ctx, &padded));
  uint64_t key = fr_mix64(((uint64_t)W << 32) ^ (uint64_t)B ^ fr_mix64((uint64_t)(uintptr_t)pool->base));
  bool replayed = false;
  CALL(op->graph_begin(m->be->ctx, key, &replayed));
  if (!replayed) {
    int rc = model__run_layers(m, pool, B, B, NULL, NULL);
    int rc2 = op->graph_end(m->be->ctx, key);
    return rc ? rc : rc2;
  }
  return op->graph_end(m->be->ctx, key);
}

int model_forward_rows(model_t *m, kern_kv_pool_t *pool, const kern_step_t *step, const int32_t *rows,
                       const void **logits) {
  if (step->n_tokens <= 0 || step->n_tokens > m->max_tokens || step->n_seqs <= 0 || step->n_seqs > m->max_seqs)
    return fr_errorf(-EINVAL, "step of %d tokens / %d sequences exceeds the model's scratch (%d / %d)",
                     step->n_tokens, step->n_seqs, m->max_tokens, m->max_seqs);
  for (int i = 0; i < step->n_tokens; i++)
    if (step->tokens[i] < 0 || step->tokens[i] >= m->cfg.vocab_size)
      return fr_errorf(-EINVAL, "token id %d out of range [0, %d)", step->tokens[i], m->cfg.vocab_size);
  int total = 0;
  for (int s = 0; rows && s < step->n_seqs; s++) {
    if (rows[s] < 1 || rows[s] > step->q_start[s + 1] - step->q_start[s])
      return fr_errorf(-EINVAL, "sequence %d: %d logits rows of %d tokens", s, rows[s],
                       step->q_start[s + 1] - step->q_start[s]);
    total += rows[s];
  }
  if (total > m->max_seqs) return fr_errorf(FR_ETOOBIG, "%d logits rows, more than %d", total, m->max_seqs);
  const kern_ops_t *op = m->be->ops;
  if (m->bert) {
    if (rows) return fr_errorf(FR_EUNSUPPORTED, "a BERT encoder returns one pooled row per sequence");
    CALL(model__bert_forward(m, step));
    *logits = m->last;
    return 0;
  }
  if (!rows && model__use_graph(m, step)) {
    CALL(model__forward_graph(m, pool, step));
  } else {
    CALL(op->step_begin(m->be->ctx, step));
    CALL(model__run_layers(m, pool, step->n_tokens, step->n_seqs, step, rows));
  }
  *logits = m->pooling ? m->last : m->logits;
  return 0;
}

int model_forward(model_t *m, kern_kv_pool_t *pool, const kern_step_t *step, const void **logits) {
  return model_forward_rows(m, pool, step, NULL, logits);
}

int model_out_width(const model_t *m) { return m->pooling ? m->cfg.dim : m->cfg.vocab_size; }

int model_logits_tokens(model_t *m, int first, int n, const void **logits) {
  if (first < 0 || n < 1 || n > m->max_seqs || first + n > m->max_tokens)
    return fr_errorf(-EINVAL, "logits of tokens %d..%d: more than %d rows or past the step's %d tokens", first,
                     first + n, m->max_seqs, m->max_tokens);
  const kern_ops_t *op = m->be->ops;
  void *cx = m->be->ctx;
  *logits = m->logits;
  if (m->shard.rank != 0 && !m->shard.split_vocab) return 0;
  const size_t rb = (size_t)m->cfg.dim * m->be->act_size;
  CALL(op->copy(cx, m->last, (const uint8_t *)m->xn + (size_t)first * rb, (size_t)n * rb));
  if (!m->shard.split_vocab) return op->matmul(cx, m->logits, &m->output, NULL, m->last, n);
  CALL(op->matmul(cx, m->logits_part, &m->output, NULL, m->last, n));
  return op->gather_cols(cx, m->logits, m->logits_part, n, m->shard.n_vocab);
}

int model_logits_to_host(model_t *m, const void *logits, int n_seqs, float *out) {
  return m->be->ops->to_f32_host(m->be->ctx, out, logits, (size_t)n_seqs * (size_t)model_out_width(m));
}
