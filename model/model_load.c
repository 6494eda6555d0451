/* model_load.c - weights from a model source (or random dummy weights) onto
 * a backend, rope tables, activation scratch. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_log.h"
#include "common/fr_util.h"
#include "model/model.h"
#include "model/model_impl.h"
#include "model/rope.h"

/* Host buffers that weights may borrow, freed with the model. */
void model__keep(model_t *m, void *p) {
  m->host_bufs = fr_realloc(m->host_bufs, (size_t)(m->n_host_bufs + 1) * sizeof(void *));
  m->host_bufs[m->n_host_bufs++] = p;
}

/* ---- load progress ------------------------------------------------------------ */

#define MODEL_GIB (1024.0 * 1024.0 * 1024.0)

void model__load_begin(model_t *m, model_progress_t *p, uint64_t total, bool log) {
  *p = (model_progress_t){.total = total, .log = log, .t0 = fr_now_ns()};
  p->t_last = p->t0;
  m->progress = p;
}

/* Logs a line when 2 s have passed since the last one and the load moved 10
 * points on, or when 10 s have passed: quick loads log only the final line. */
static void model__progress_add(model_progress_t *p, uint64_t bytes) {
  p->done += bytes;
  if (!p->log || !p->total) return;
  uint64_t now = fr_now_ns(), since = now - p->t_last;
  int pct = (int)(FR_MIN(p->done, p->total) * 100 / p->total);
  if (since < 2000000000ull || (pct < p->pct_last + 10 && since < 10000000000ull)) return;
  double secs = (double)(now - p->t0) / 1e9;
  FR_LOGI("loading weights: %d%% (%.2f of %.2f GiB, %.2f GiB/s)", pct, (double)p->done / MODEL_GIB,
          (double)p->total / MODEL_GIB, (double)p->done / MODEL_GIB / secs);
  p->t_last = now;
  p->pct_last = pct;
}

int model__weight_load(model_t *m, kern_weight_t *w, const void *host_data, const char *name) {
  uint64_t bytes = (uint64_t)w->rows * w->row_bytes; /* before the backend converts */
  int rc = m->be->ops->weight_load(m->be->ctx, w, host_data);
  if (rc) {
    char why[400];
    snprintf(why, sizeof why, "%s", fr_last_error());
    return fr_errorf(rc, "loading %s: %s", name, why);
  }
  if (m->progress) model__progress_add(m->progress, bytes);
  return 0;
}

int model__load_end(model_t *m) {
  model_progress_t *p = m->progress;
  int rc = m->be->ops->load_end ? m->be->ops->load_end(m->be->ctx) : 0;
  m->progress = NULL;
  if (rc || !p) return rc;
  if (p->total && p->done != p->total)
    FR_LOGD("weights: %llu bytes loaded, %llu expected", (unsigned long long)p->done, (unsigned long long)p->total);
  if (!p->log) return 0;
  double secs = (double)FR_MAX(fr_now_ns() - p->t0, 1) / 1e9;
  FR_LOGI("loaded weights: %.2f GiB in %.2f s (%.2f GiB/s)", (double)p->done / MODEL_GIB, secs,
          (double)p->done / MODEL_GIB / secs);
  return 0;
}

/* Bytes model_load hands to the backend: the tensors it loads (vectors as
 * f32) and the rope table. */
static uint64_t model__load_bytes(const model_t *m) {
  const model_source_t *s = m->src;
  bool output = !m->cfg.tied_embeddings && model_source_tensor(s, "output.weight");
  uint64_t total = (uint64_t)(m->cfg.rope_dim / 2) * sizeof(float);
  for (size_t i = 0; i < s->n_tensors; i++) {
    const model_tensor_t *t = &s->tensors[i];
    if (strncmp(t->name, "blk.", 4) && strcmp(t->name, "token_embd.weight") &&
        strcmp(t->name, "output_norm.weight") && !(output && !strcmp(t->name, "output.weight")))
      continue;
    total += t->rows == 1 ? (uint64_t)t->cols * sizeof(float) : (uint64_t)t->rows * kern_row_bytes(t->type, t->cols);
  }
  return total;
}

/* ---- weights --------------------------------------------------------------------- */

static int model__load_weight(model_t *m, kern_weight_t *w, const char *name, bool required, int64_t rows,
                              int64_t cols) {
  memset(w, 0, sizeof *w);
  const model_tensor_t *t = model_source_tensor(m->src, name);
  if (!t) {
    if (!required) return 0;
    return fr_errorf(FR_ENOTFOUND, "tensor %s is missing", name);
  }
  if (t->rows != rows || t->cols != cols)
    return fr_errorf(FR_EFORMAT, "tensor %s has shape (%lld, %lld), expected (%lld, %lld)", name,
                     (long long)t->rows, (long long)t->cols, (long long)rows, (long long)cols);
  if (!m->be->ops->supports_type(m->be->ctx, t->type))
    return fr_errorf(FR_EUNSUPPORTED, "tensor %s: type %s is not supported by the %s backend", name,
                     kern_type_traits(t->type) ? kern_type_traits(t->type)->name : "?", m->be->ops->name);
  w->type = t->type;
  w->rows = rows;
  w->cols = cols;
  w->row_bytes = kern_row_bytes(t->type, cols);
  return model__weight_load(m, w, t->data, name);
}

/* Norm weights and biases are used in f32 by every backend: convert
 * F16/BF16 ones (HF checkpoints) once at load. */
static int model__load_f32_vector(model_t *m, kern_weight_t *w, const char *name, bool required, int64_t n) {
  memset(w, 0, sizeof *w);
  const model_tensor_t *t = model_source_tensor(m->src, name);
  if (!t) return required ? fr_errorf(FR_ENOTFOUND, "tensor %s is missing", name) : 0;
  if (t->rows * t->cols != n)
    return fr_errorf(FR_EFORMAT, "tensor %s has %lld elements, expected %lld", name,
                     (long long)(t->rows * t->cols), (long long)n);
  if (t->type != KERN_F32 && t->type != KERN_F16 && t->type != KERN_BF16)
    return fr_errorf(FR_EUNSUPPORTED, "tensor %s: a vector must be F32, F16 or BF16", name);
  float *tmp = fr_malloc((size_t)n * sizeof(float));
  kern_dequantize_row(t->type, t->data, tmp, n);
  w->type = KERN_F32;
  w->rows = 1;
  w->cols = n;
  w->row_bytes = (size_t)n * sizeof(float);
  /* The backend may borrow host_data: the model keeps the copy alive. */
  model__keep(m, tmp);
  return model__weight_load(m, w, tmp, name);
}

static void model__release_weight(model_t *m, kern_weight_t *w) {
  if (w->data || w->priv) m->be->ops->weight_release(m->be->ctx, w);
  memset(w, 0, sizeof *w);
}

/* Loads tensors names[0..n) (same type and columns) as one weight whose
 * rows are theirs in order. Returns 1 when it fused, 0 when the tensors do
 * not allow it (the caller loads them one by one), or an error. */
static int model__load_fused(model_t *m, kern_weight_t *w, const char *const *names, int n, const int64_t *rows,
                             int64_t cols) {
  const model_tensor_t *t[4];
  int64_t total = 0;
  for (int i = 0; i < n; i++) {
    t[i] = model_source_tensor(m->src, names[i]);
    if (!t[i] || t[i]->type != t[0]->type || t[i]->rows != rows[i] || t[i]->cols != cols) return 0;
    total += rows[i];
  }
  if (!m->be->ops->supports_type(m->be->ctx, t[0]->type)) return 0;
  const size_t rb = kern_row_bytes(t[0]->type, cols);
  uint8_t *buf = fr_malloc((size_t)total * rb), *p = buf;
  for (int i = 0; i < n; i++) {
    memcpy(p, t[i]->data, (size_t)rows[i] * rb);
    p += (size_t)rows[i] * rb;
  }
  *w = (kern_weight_t){.type = t[0]->type, .rows = total, .cols = cols, .row_bytes = rb};
  char label[256] = "";
  for (int i = 0; i < n; i++) /* "blk.0.attn_q.weight+blk.0.attn_k.weight+..." */
    snprintf(label + strlen(label), sizeof label - strlen(label), "%s%s", i ? "+" : "", names[i]);
  int rc = model__weight_load(m, w, buf, label);
  if (rc == 0 && w->data == buf) model__keep(m, buf); /* borrowed (CPU) */
  else free(buf);
  return rc ? rc : 1;
}

/* Fused bias (1, qd + 2*kvd) from the three biases. */
static int model__load_fused_bias(model_t *m, kern_weight_t *w, int il, int64_t qd, int64_t kvd) {
  static const char *sfx[3] = {"attn_q.bias", "attn_k.bias", "attn_v.bias"};
  const int64_t n[3] = {qd, kvd, kvd};
  float *all = fr_malloc((size_t)(qd + 2 * kvd) * sizeof(float)), *p = all;
  char name[96];
  for (int i = 0; i < 3; i++) {
    const model_tensor_t *t;
    snprintf(name, sizeof name, "blk.%d.%s", il, sfx[i]);
    if (!(t = model_source_tensor(m->src, name)) || t->rows * t->cols != n[i] ||
        (t->type != KERN_F32 && t->type != KERN_F16 && t->type != KERN_BF16)) {
      free(all);
      return fr_errorf(FR_EFORMAT, "tensor %s is missing or misshaped", name);
    }
    kern_dequantize_row(t->type, t->data, p, n[i]);
    p += n[i];
  }
  model__keep(m, all);
  *w = (kern_weight_t){.type = KERN_F32, .rows = 1, .cols = qd + 2 * kvd,
                       .row_bytes = (size_t)(qd + 2 * kvd) * sizeof(float)};
  snprintf(name, sizeof name, "blk.%d.attn_{q,k,v}.bias", il);
  return model__weight_load(m, w, all, name);
}

/* q/k/v and gate/up as fused weights where the files allow. */
static int model__load_layer_fused(model_t *m, int il) {
  const model_config_t *c = &m->cfg;
  model_layer_t *L = &m->layers[il];
  const int64_t qd = (int64_t)c->n_heads * c->head_dim, kvd = (int64_t)c->n_kv_heads * c->head_dim;
  char q[96], k[96], v[96], g[96], u[96];
  snprintf(q, sizeof q, "blk.%d.attn_q.weight", il);
  snprintf(k, sizeof k, "blk.%d.attn_k.weight", il);
  snprintf(v, sizeof v, "blk.%d.attn_v.weight", il);
  snprintf(g, sizeof g, "blk.%d.ffn_gate.weight", il);
  snprintf(u, sizeof u, "blk.%d.ffn_up.weight", il);
  int rc = 0;
  if (!c->qk_norm) {
    const char *names[3] = {q, k, v};
    const int64_t rows[3] = {qd, kvd, kvd};
    if ((rc = model__load_fused(m, &L->wqkv, names, 3, rows, c->dim)) < 0) return rc;
    if (rc == 1 && c->attn_bias && (rc = model__load_fused_bias(m, &L->bqkv, il, qd, kvd))) return rc;
  }
  const char *gu[2] = {g, u};
  const int64_t frows[2] = {c->ffn_dim, c->ffn_dim};
  rc = model__load_fused(m, &L->w_gate_up, gu, 2, frows, c->dim);
  return rc < 0 ? rc : 0;
}

static int model__load_layer(model_t *m, int il) {
  const model_config_t *c = &m->cfg;
  model_layer_t *L = &m->layers[il];
  const int64_t qd = (int64_t)c->n_heads * c->head_dim, kvd = (int64_t)c->n_kv_heads * c->head_dim;
  char name[96];
  int rc = 0;
#define W(field, suffix, req, r, cl)                                        \
  do {                                                                      \
    snprintf(name, sizeof name, "blk.%d.%s", il, suffix);                   \
    if ((rc = model__load_weight(m, &L->field, name, req, r, cl)) != 0) return rc; \
  } while (0)
#define V(field, suffix, req, n)                                            \
  do {                                                                      \
    snprintf(name, sizeof name, "blk.%d.%s", il, suffix);                   \
    if ((rc = model__load_f32_vector(m, &L->field, name, req, n)) != 0) return rc; \
  } while (0)
  V(attn_norm, "attn_norm.weight", true, c->dim);
  if ((rc = model__load_layer_fused(m, il))) return rc;
  if (!L->wqkv.data) {
    W(wq, "attn_q.weight", true, qd, c->dim);
    W(wk, "attn_k.weight", true, kvd, c->dim);
    W(wv, "attn_v.weight", true, kvd, c->dim);
    V(bq, "attn_q.bias", c->attn_bias, qd);
    V(bk, "attn_k.bias", c->attn_bias, kvd);
    V(bv, "attn_v.bias", c->attn_bias, kvd);
  }
  V(q_norm, "attn_q_norm.weight", c->qk_norm, c->head_dim);
  V(k_norm, "attn_k_norm.weight", c->qk_norm, c->head_dim);
  W(wo, "attn_output.weight", true, c->dim, qd);
  V(ffn_norm, "ffn_norm.weight", true, c->dim);
  if (!L->w_gate_up.data) {
    W(w_gate, "ffn_gate.weight", true, c->ffn_dim, c->dim);
    W(w_up, "ffn_up.weight", true, c->ffn_dim, c->dim);
  }
  W(w_down, "ffn_down.weight", true, c->dim, c->ffn_dim);
#undef W
#undef V
  return 0;
}

static int model__load_globals(model_t *m) {
  const model_config_t *c = &m->cfg;
  int rc = model__load_weight(m, &m->tok_embd, "token_embd.weight", true, c->vocab_size, c->dim);
  if (rc) return rc;
  if ((rc = model__load_f32_vector(m, &m->output_norm, "output_norm.weight", true, c->dim))) return rc;
  if (c->tied_embeddings || !model_source_tensor(m->src, "output.weight")) {
    m->output = m->tok_embd; /* alias: released once, through tok_embd */
    return 0;
  }
  return model__load_weight(m, &m->output, "output.weight", true, c->vocab_size, c->dim);
}

int model__init_rope(model_t *m) {
  const model_config_t *c = &m->cfg;
  int half = c->rope_dim / 2;
  float *inv = fr_malloc((size_t)half * sizeof(float));
  model_rope_inv_freq(c, inv);
  /* GGUF llama3 files carry the divisors as rope_freqs.weight. */
  const model_tensor_t *rf = m->src ? model_source_tensor(m->src, "rope_freqs.weight") : NULL;
  if (rf && rf->type == KERN_F32 && rf->rows * rf->cols == half) {
    const float *f = rf->data;
    for (int i = 0; i < half; i++) inv[i] /= f[i];
  }
  memset(&m->inv_freq, 0, sizeof m->inv_freq);
  m->inv_freq.type = KERN_F32;
  m->inv_freq.rows = 1;
  m->inv_freq.cols = half;
  m->inv_freq.row_bytes = (size_t)half * sizeof(float);
  model__keep(m, inv);
  int rc = model__weight_load(m, &m->inv_freq, inv, "the rope table");
  m->rope.n_rot = c->rope_dim;
  m->rope.inv_freq = &m->inv_freq;
  m->rope.attn_factor = 1.0f;
  return rc;
}

int model__alloc_scratch(model_t *m) {
  const model_config_t *c = &m->cfg;
  size_t es = m->be->act_size, T = (size_t)m->max_tokens;
  struct {
    void **p;
    size_t n;
  } bufs[] = {
      {&m->x, T * c->dim},
      {&m->xn, T * c->dim},
      {&m->qkv, T * (c->n_heads + 2 * c->n_kv_heads) * c->head_dim},
      {&m->att, T * c->n_heads * c->head_dim},
      {&m->gate, T * 2 * c->ffn_dim},
      {&m->up, T * c->ffn_dim},
      {&m->last, (size_t)m->max_seqs * c->dim},
      {&m->logits, (size_t)m->max_seqs * c->vocab_size},
  };
  for (size_t i = 0; i < FR_ARRAY_SIZE(bufs); i++) {
    int rc = m->be->ops->alloc(m->be->ctx, bufs[i].n * es, bufs[i].p);
    if (rc) return fr_errorf(rc, "allocating %zu MiB of activation scratch: %s", bufs[i].n * es >> 20,
                             fr_strerror(rc));
    m->scratch_bytes += bufs[i].n * es;
  }
  return 0;
}

model_t *model__new(kern_backend_t *be, const model_load_opts_t *opts) {
  model_t *m = fr_calloc(1, sizeof *m);
  m->be = be;
  m->max_tokens = opts && opts->max_tokens > 0 ? opts->max_tokens : 512;
  m->max_seqs = opts && opts->max_seqs > 0 ? opts->max_seqs : 64;
  if (m->max_seqs > m->max_tokens) m->max_seqs = m->max_tokens;
  const char *ng = getenv("FERRUM_NO_GRAPHS");
  m->no_graphs = ng && *ng && strcmp(ng, "0");
  return m;
}

int model__check_config(const model_config_t *c) {
  if (c->n_layers <= 0 || c->dim <= 0 || c->n_heads <= 0 || c->n_kv_heads <= 0 || c->head_dim <= 0 ||
      c->ffn_dim <= 0 || c->vocab_size <= 0 || c->n_heads % c->n_kv_heads != 0 || c->rope_dim <= 0 ||
      c->rope_dim > c->head_dim || c->rope_dim % 2 != 0)
    return fr_errorf(FR_EFORMAT, "inconsistent model config (layers %d, dim %d, heads %d/%d, head_dim %d)",
                     c->n_layers, c->dim, c->n_heads, c->n_kv_heads, c->head_dim);
  return 0;
}

static int model__load_tokenizer(model_t *m) {
  int rc;
  if (m->src->gguf) {
    rc = model_tokenizer_from_gguf(&m->tok, m->src->gguf);
  } else if (m->src->tokenizer_json) {
    rc = model_tokenizer_from_json_files(&m->tok, m->src->tokenizer_json, m->src->tokenizer_config_json);
  } else {
    FR_LOGW("%s has no tokenizer; token ids only", m->src->path);
    return 0;
  }
  if (rc) return rc;
  m->chat = model_chat_detect(model_tokenizer_chat_template(m->tok));
  return 0;
}

int model_load(model_t **out, const char *path, kern_backend_t *be, const model_load_opts_t *opts) {
  *out = NULL;
  model_t *m = model__new(be, opts);
  uint64_t t0 = fr_now_ns();
  int rc = model_source_open(&m->src, path);
  if (rc) goto fail;
  m->cfg = m->src->config;
  if ((rc = model__check_config(&m->cfg))) goto fail;
  m->rope.mode = m->src->rope_mode;
  if ((rc = model__load_tokenizer(m))) goto fail;
  model_progress_t prog;
  model__load_begin(m, &prog, model__load_bytes(m), opts && opts->progress);
  if ((rc = model__load_globals(m))) goto fail;
  m->layers = fr_calloc((size_t)m->cfg.n_layers, sizeof *m->layers);
  for (int il = 0; il < m->cfg.n_layers; il++)
    if ((rc = model__load_layer(m, il))) goto fail;
  if ((rc = model__init_rope(m))) goto fail;
  if ((rc = model__load_end(m))) goto fail;
  if ((rc = model__alloc_scratch(m))) goto fail;
  if (opts && opts->progress)
    FR_LOGI("loaded %s (%s, %d layers, dim %d) on %s in %.2f s", path, m->cfg.arch_name, m->cfg.n_layers,
            m->cfg.dim, be->ops->name, (double)(fr_now_ns() - t0) / 1e9);
  *out = m;
  return 0;
fail: /* a backend's load staging is freed with the backend */
  m->progress = NULL;
  if (!fr_last_error()[0]) fr_errorf(rc, "%s", fr_strerror(rc));
  model_destroy(m);
  return rc;
}

void model_destroy(model_t *m) {
  if (!m) return;
  if (m->layers) {
    for (int il = 0; il < m->cfg.n_layers; il++) {
      kern_weight_t *ws[] = {&m->layers[il].wqkv, &m->layers[il].bqkv, &m->layers[il].w_gate_up,
                             &m->layers[il].attn_norm, &m->layers[il].wq, &m->layers[il].wk, &m->layers[il].wv,
                             &m->layers[il].bq, &m->layers[il].bk, &m->layers[il].bv, &m->layers[il].q_norm,
                             &m->layers[il].k_norm, &m->layers[il].wo, &m->layers[il].ffn_norm,
                             &m->layers[il].w_gate, &m->layers[il].w_up, &m->layers[il].w_down};
      for (size_t i = 0; i < FR_ARRAY_SIZE(ws); i++) model__release_weight(m, ws[i]);
    }
    free(m->layers);
  }
  if (m->output.data && m->output.data != m->tok_embd.data) model__release_weight(m, &m->output);
  model__release_weight(m, &m->tok_embd);
  model__release_weight(m, &m->output_norm);
  model__release_weight(m, &m->inv_freq);
  void *bufs[] = {m->x, m->xn, m->qkv, m->att, m->gate, m->up, m->last, m->logits};
  for (size_t i = 0; i < FR_ARRAY_SIZE(bufs); i++)
    if (bufs[i]) m->be->ops->free(m->be->ctx, bufs[i]);
  model_tokenizer_destroy(m->tok);
  model_source_close(m->src);
  for (int i = 0; i < m->n_host_bufs; i++) free(m->host_bufs[i]);
  free(m->pad.tokens), free(m->pad.positions), free(m->pad.slots);
  free(m->pad.q_start), free(m->pad.ctx_len), free(m->pad.block_tables);
  free(m->host_bufs);
  free(m);
}

kern_kv_config_t model_kv_config(const model_t *m, int block_size, int n_blocks, kern_type_t kv_type) {
  kern_kv_config_t kc = {
      .n_layers = m->cfg.n_layers,
      .n_kv_heads = m->cfg.n_kv_heads,
      .head_dim = m->cfg.head_dim,
      .block_size = block_size,
      .n_blocks = n_blocks,
      .type = kv_type,
  };
  return kc;
}
