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
#include "model/bert.h"
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

/* --quantization fp8 takes a layer's dense matmul weights: not the LM
 * head (as vLLM keeps it), nor a weight something else reads (embeddings,
 * routers, experts: keep_layout), nor vectors. The same weights of an FP8
 * checkpoint (w->fp8 set by the caller from model_tensor_t.fp8) stay FP8
 * where the backend keeps FP8, and run in BF16 elsewhere; a KERN_F8R or
 * KERN_F8B one is such a weight as it is in the file (model__load_fp8). */
static bool model__takes_fp8(const model_t *m, const kern_weight_t *w) {
  const kern_type_t t = w->type;
  if (t == KERN_F8R || t == KERN_F8B) return w->fp8;
  return (m->fp8 || (w->fp8 && m->be->fp8_weights)) && w != &m->output && !w->keep_layout && w->rows > 1 &&
         (t == KERN_F32 || t == KERN_F16 || t == KERN_BF16);
}

static void model__mark_fp8(const model_t *m, kern_weight_t *w) { w->fp8 = model__takes_fp8(m, w); }

int model__weight_load(model_t *m, kern_weight_t *w, const void *host_data, const char *name) {
  uint64_t bytes = (uint64_t)w->rows * w->row_bytes; /* before the backend converts */
  model__mark_fp8(m, w);
  int rc = m->be->ops->weight_load(m->be->ctx, w, host_data);
  if (rc) {
    char why[400];
    snprintf(why, sizeof why, "%s", fr_last_error());
    return fr_errorf(rc, "loading %s: %s", name, why);
  }
  if (m->progress) model__progress_add(m->progress, bytes);
  return 0;
}

int model__weight_load_file(model_t *m, kern_weight_t *w, const kern_file_span_t *spans, int n_spans,
                            const char *name) {
  uint64_t bytes = (uint64_t)w->rows * w->row_bytes;
  model__mark_fp8(m, w);
  int rc = m->be->ops->weight_load_file(m->be->ctx, w, spans, n_spans);
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
  if (p->fp8_kept || p->fp8_decoded)
    FR_LOGI("FP8 checkpoint: %d weights run as they are in the file, %d decoded into BF16%s", p->fp8_kept,
            p->fp8_decoded, p->fp8_decoded && m->be->fp8_weights ? " (a layer's then quantized again, a scale a row; "
            "FERRUM_LOG=debug says why each)" : "");
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

/* The part of a tensor a rank loads: rows [r0, r0 + nr) and columns
 * [c0, c0 + nc) of a (rows, cols) tensor. */
typedef struct {
  int64_t rows, cols; /* the whole tensor's shape, as the file must have it */
  int64_t r0, nr, c0, nc;
} model_part_t;

static model_part_t model__whole(int64_t rows, int64_t cols) {
  return (model_part_t){.rows = rows, .cols = cols, .nr = rows, .nc = cols};
}

static model_part_t model__rows(int64_t rows, int64_t cols, int64_t r0, int64_t nr) {
  return (model_part_t){.rows = rows, .cols = cols, .r0 = r0, .nr = nr, .nc = cols};
}

static model_part_t model__cols(int64_t rows, int64_t cols, int64_t c0, int64_t nc) {
  return (model_part_t){.rows = rows, .cols = cols, .nr = rows, .c0 = c0, .nc = nc};
}

/* Finds a tensor and checks it against the part's shape and the backend. */
static int model__part_tensor(model_t *m, const char *name, bool required, const model_part_t *p,
                              const model_tensor_t **out) {
  const model_tensor_t *t = *out = model_source_tensor(m->src, name);
  if (!t) return required ? fr_errorf(FR_ENOTFOUND, "tensor %s is missing", name) : 0;
  if (t->rows != p->rows || t->cols != p->cols)
    return fr_errorf(FR_EFORMAT, "tensor %s has shape (%lld, %lld), expected (%lld, %lld)", name,
                     (long long)t->rows, (long long)t->cols, (long long)p->rows, (long long)p->cols);
  if (!m->be->ops->supports_type(m->be->ctx, t->type))
    return fr_errorf(FR_EUNSUPPORTED, "tensor %s: type %s is not supported by the %s backend", name,
                     kern_type_traits(t->type) ? kern_type_traits(t->type)->name : "?", m->be->ops->name);
  int blck = kern_type_traits(t->type)->blck;
  if (p->c0 % blck || p->nc % blck)
    return fr_errorf(FR_EUNSUPPORTED, "tensor %s: tensor parallelism would cut its %s blocks of %d at column %lld",
                     name, kern_type_traits(t->type)->name, blck, (long long)(p->c0 % blck ? p->c0 : p->c0 + p->nc));
  return 0;
}

/* Whether the backend reads tensor t from its file itself (CUDA: io_uring
 * into pinned memory), rather than from the mapping. FERRUM_LOAD_MMAP=1
 * keeps the mapping. */
static bool model__file_reads(const model_t *m, const model_tensor_t *t) {
  return m->file_reads && t->fd >= 0;
}

/* Appends the part's spans of t's file to *spans (grown; *n of them). */
static void model__part_spans(const model_tensor_t *t, const model_part_t *p, kern_file_span_t **spans, int *n) {
  const size_t full = kern_row_bytes(t->type, p->cols), rb = kern_row_bytes(t->type, p->nc);
  const uint64_t first = t->file_off + (uint64_t)p->r0 * full + kern_row_bytes(t->type, p->c0);
  const int64_t count = p->nc == p->cols ? 1 : p->nr; /* whole rows: one span */
  *spans = fr_realloc(*spans, (size_t)(*n + count) * sizeof **spans);
  for (int64_t r = 0; r < count; r++)
    (*spans)[(*n)++] = (kern_file_span_t){.fd = t->fd, .off = first + (uint64_t)r * full,
                                          .len = count == 1 ? (size_t)p->nr * rb : rb};
}

/* Loads parts[0..n) of tensors t[0..n) as w, read from the files. */
static int model__load_spans(model_t *m, kern_weight_t *w, const model_tensor_t *const *t, const model_part_t *parts,
                             int n, const char *name) {
  kern_file_span_t *spans = NULL;
  int n_spans = 0;
  for (int i = 0; i < n; i++) model__part_spans(t[i], &parts[i], &spans, &n_spans);
  int rc = model__weight_load_file(m, w, spans, n_spans, name);
  free(spans);
  return rc;
}

/* The part's bytes into dst (nr rows of kern_row_bytes(type, nc)): copied,
 * or decoded (an FP8 layer). */
static int model__part_copy(const model_t *m, const model_tensor_t *t, const model_part_t *p, uint8_t *dst) {
  return model_source_read(m->src, t, p->r0, p->nr, p->c0, p->nc, dst);
}

/* Parts parts[0..n) of FP8 layers t[0..n) as one weight w (its rows theirs
 * in order, set up as their BF16 decoding), handed to a backend that keeps
 * FP8 as they are in the file: the bytes and scales in
 * model_quant_fp8_form's KERN_F8R or KERN_F8B. Returns 1 when loaded; 0
 * when w is not a weight the backend keeps as FP8 (model__takes_fp8), the
 * parts have no such form in common, or the backend cannot run it
 * (FR_EUNSUPPORTED): the caller then decodes them; or an error. */
static int model__load_fp8(model_t *m, kern_weight_t *w, const model_tensor_t *const *t, const model_part_t *parts,
                           int n, const char *name) {
  const int64_t nc = parts[0].nc;
  if (!model__takes_fp8(m, w) || !m->be->fp8_weights || nc % 16) return 0;
  kern_type_t form = KERN_BF16;
  int64_t rows = 0;
  for (int i = 0; i < n; i++) {
    const kern_type_t f = model_quant_fp8_form(t[i]->fp8, parts[i].r0, parts[i].nr, parts[i].c0, parts[i].nc);
    if (f == KERN_BF16 || (i && f != form)) return 0;
    form = f;
    rows += parts[i].nr;
  }
  const size_t qbytes = (size_t)rows * (size_t)nc;
  uint8_t *buf = fr_malloc(qbytes + kern_f8_scale_bytes(form, rows, nc));
  float *scales = (float *)(buf + qbytes);
  int rc = 0;
  for (int64_t i = 0, r = 0; i < n && !rc; r += parts[i].nr, i++)
    rc = model_quant_fp8_pack(t[i]->fp8, form, parts[i].r0, parts[i].nr, parts[i].c0, nc, m->src->pool,
                              buf + (size_t)r * nc, scales + (form == KERN_F8R ? r : r / 128 * kern_f8b_scale_cols(nc)));
  kern_weight_t f8 = {.type = form, .rows = rows, .cols = nc, .row_bytes = (size_t)nc, .fp8 = true};
  if (!rc) rc = m->be->ops->weight_load(m->be->ctx, &f8, buf);
  free(buf);
  if (rc == FR_EUNSUPPORTED) {
    FR_LOGD("%s: %s; decoding it into BF16", name, fr_last_error());
    return 0;
  }
  if (rc) {
    char why[400];
    snprintf(why, sizeof why, "%s", fr_last_error());
    return fr_errorf(rc, "loading %s: %s", name, why);
  }
  *w = f8;
  if (m->progress) {
    m->progress->fp8_kept++;
    model__progress_add(m->progress, (uint64_t)rows * kern_row_bytes(KERN_BF16, nc)); /* as model__load_bytes counts it */
  }
  return 1;
}

/* An FP8 layer's part that model__load_fp8 did not take: decoded into BF16. */
static void model__count_fp8_decoded(model_t *m) {
  if (m->progress) m->progress->fp8_decoded++;
}

/* A column range of a GPTQ act-order weight (a rank's part of o_proj or
 * down_proj): its own I4G tensor with its own permutation and padding
 * (model_quant_cols), kept, with the permutation, while the model lives. */
static int model__load_quant_cols(model_t *m, kern_weight_t *w, const model_tensor_t *t, const model_part_t *p,
                                  const char *name) {
  const size_t rb = kern_row_bytes(t->type, t->cols);
  uint8_t *rows = fr_malloc(rb * (size_t)p->nr); /* the part's whole rows, repacked */
  int rc = model_source_read(m->src, t, p->r0, p->nr, 0, t->cols, rows);
  const model_quant_weight_t whole = {.rows = p->nr, .cols = t->cols, .x_cols = t->cols, .data = rows,
                                      .perm = (int32_t *)t->perm};
  model_quant_weight_t q;
  if (!rc) rc = model_quant_cols(&whole, p->c0, p->nc, &q);
  free(rows);
  if (rc) return rc;
  if (q.cols != q.x_cols && !m->be->padded_perm) {
    free(q.data), free(q.perm);
    return fr_errorf(FR_EUNSUPPORTED, "tensor %s: the %s backend cannot split a GPTQ act-order (g_idx) weight by "
                     "input columns for tensor parallelism (its parts need padding columns); run it with tensor "
                     "parallel size 1", name, m->be->ops->name);
  }
  *w = (kern_weight_t){.type = KERN_I4G, .rows = q.rows, .cols = q.cols, .row_bytes = kern_row_bytes(KERN_I4G, q.cols),
                       .perm = q.perm, .x_cols = q.perm ? q.x_cols : 0};
  if (q.perm) model__keep(m, q.perm);
  rc = model__weight_load(m, w, q.data, name);
  if (rc == 0 && w->data == q.data) model__keep(m, q.data); /* borrowed (CPU) */
  else free(q.data);
  return rc;
}

/* Loads part p of tensor name (keep_layout: kern_weight_t's). Whole rows
 * are handed over from the file's mapping; a column range, or any part of
 * an FP8 layer, is copied or decoded first (kept while the backend borrows
 * it, freed once a backend that copies has it). */
static int model__load_part_as(model_t *m, kern_weight_t *w, const char *name, bool required, model_part_t p,
                               bool keep_layout) {
  memset(w, 0, sizeof *w);
  const model_tensor_t *t;
  int rc = model__part_tensor(m, name, required, &p, &t);
  if (rc || !t) return rc;
  if (t->perm && p.nc != p.cols) return model__load_quant_cols(m, w, t, &p, name);
  *w = (kern_weight_t){.type = t->type, .rows = p.nr, .cols = p.nc, .row_bytes = kern_row_bytes(t->type, p.nc),
                       .perm = t->perm, .keep_layout = keep_layout, .fp8 = t->fp8 != NULL};
  if (t->fp8) {
    if ((rc = model__load_fp8(m, w, &t, &p, 1, name))) return rc < 0 ? rc : 0;
    model__count_fp8_decoded(m);
  }
  if (model__file_reads(m, t)) return model__load_spans(m, w, &t, &p, 1, name);
  if (p.nc == p.cols && t->data)
    return model__weight_load(m, w, (const uint8_t *)t->data + (size_t)p.r0 * w->row_bytes, name);
  uint8_t *copy = fr_malloc((size_t)p.nr * w->row_bytes);
  rc = model__part_copy(m, t, &p, copy);
  if (!rc) rc = model__weight_load(m, w, copy, name);
  if (rc == 0 && w->data == copy) model__keep(m, copy); /* borrowed (CPU) */
  else free(copy);
  return rc;
}

/* A matmul's weight (or part of one): the backend may repack it. */
static int model__load_part(model_t *m, kern_weight_t *w, const char *name, bool required, model_part_t p) {
  return model__load_part_as(m, w, name, required, p, false);
}

int model__load_weight(model_t *m, kern_weight_t *w, const char *name, bool required, int64_t rows, int64_t cols) {
  return model__load_part_as(m, w, name, required, model__whole(rows, cols), true);
}

/* Norm weights and biases are used in f32 by every backend: convert
 * F16/BF16 ones (HF checkpoints) once at load. Elements [off, off + n) of
 * a vector of total elements. */
static int model__load_f32_part(model_t *m, kern_weight_t *w, const char *name, bool required, int64_t total,
                                int64_t off, int64_t n) {
  memset(w, 0, sizeof *w);
  const model_tensor_t *t = model_source_tensor(m->src, name);
  if (!t) return required ? fr_errorf(FR_ENOTFOUND, "tensor %s is missing", name) : 0;
  if (t->rows * t->cols != total)
    return fr_errorf(FR_EFORMAT, "tensor %s has %lld elements, expected %lld", name,
                     (long long)(t->rows * t->cols), (long long)total);
  if ((t->type != KERN_F32 && t->type != KERN_F16 && t->type != KERN_BF16) || !t->data)
    return fr_errorf(FR_EUNSUPPORTED, "tensor %s: a vector must be F32, F16 or BF16", name);
  float *tmp = fr_malloc((size_t)total * sizeof(float));
  kern_dequantize_row(t->type, t->data, tmp, total);
  if (off) memmove(tmp, tmp + off, (size_t)n * sizeof(float));
  *w = (kern_weight_t){.type = KERN_F32, .rows = 1, .cols = n, .row_bytes = (size_t)n * sizeof(float)};
  /* The backend may borrow host_data: the model keeps the copy alive. */
  model__keep(m, tmp);
  return model__weight_load(m, w, tmp, name);
}

int model__load_f32_vector(model_t *m, kern_weight_t *w, const char *name, bool required, int64_t n) {
  return model__load_f32_part(m, w, name, required, n, 0, n);
}

void model__release_weight(model_t *m, kern_weight_t *w) {
  if (w->data || w->priv) m->be->ops->weight_release(m->be->ctx, w);
  memset(w, 0, sizeof *w);
}

/* A MoE layer's router and experts (full_cfg.n_experts of each, or none). */
static void model__release_experts(model_t *m, model_layer_t *L) {
  model__release_weight(m, &L->router);
  kern_weight_t *stacks[] = {L->exp_gate, L->exp_up, L->exp_down};
  for (size_t i = 0; i < FR_ARRAY_SIZE(stacks); i++) {
    for (int e = 0; stacks[i] && e < m->full_cfg.n_experts; e++) model__release_weight(m, &stacks[i][e]);
    free(stacks[i]);
  }
  L->exp_gate = L->exp_up = L->exp_down = NULL;
}

/* Whether two tensors take their inputs in the same order (GPTQ act-order). */
static bool model__same_perm(const model_tensor_t *a, const model_tensor_t *b) {
  if (!a->perm || !b->perm) return a->perm == b->perm;
  return a->cols == b->cols && !memcmp(a->perm, b->perm, (size_t)a->cols * sizeof *a->perm);
}

/* Loads row ranges of tensors names[0..n) (same type and columns) as one
 * weight whose rows are theirs in order. Returns 1 when it fused, 0 when
 * the tensors do not allow it (the caller loads them one by one), or an
 * error. */
static int model__load_fused(model_t *m, kern_weight_t *w, const char *const *names, int n, const model_part_t *parts) {
  const model_tensor_t *t[4];
  int64_t total = 0;
  for (int i = 0; i < n; i++) {
    t[i] = model_source_tensor(m->src, names[i]);
    if (!t[i] || t[i]->type != t[0]->type || t[i]->rows != parts[i].rows || t[i]->cols != parts[i].cols ||
        !model__same_perm(t[i], t[0]) || !t[i]->fp8 != !t[0]->fp8)
      return 0;
    total += parts[i].nr;
  }
  if (!m->be->ops->supports_type(m->be->ctx, t[0]->type)) return 0;
  const size_t rb = kern_row_bytes(t[0]->type, parts[0].cols);
  char label[256] = "";
  for (int i = 0; i < n; i++) /* "blk.0.attn_q.weight+blk.0.attn_k.weight+..." */
    snprintf(label + strlen(label), sizeof label - strlen(label), "%s%s", i ? "+" : "", names[i]);
  *w = (kern_weight_t){.type = t[0]->type, .rows = total, .cols = parts[0].cols, .row_bytes = rb, .perm = t[0]->perm,
                       .fp8 = t[0]->fp8 != NULL};
  if (t[0]->fp8) {
    int rc = model__load_fp8(m, w, t, parts, n, label);
    if (rc) return rc;
    model__count_fp8_decoded(m);
  }
  bool files = true;
  for (int i = 0; i < n; i++) files = files && model__file_reads(m, t[i]);
  if (files) {
    int rc = model__load_spans(m, w, t, parts, n, label);
    return rc ? rc : 1;
  }
  uint8_t *buf = fr_malloc((size_t)total * rb), *p = buf;
  int rc = 0;
  for (int i = 0; i < n && !rc; i++) {
    rc = model__part_copy(m, t[i], &parts[i], p);
    p += (size_t)parts[i].nr * rb;
  }
  if (!rc) rc = model__weight_load(m, w, buf, label);
  if (rc == 0 && w->data == buf) model__keep(m, buf); /* borrowed (CPU) */
  else free(buf);
  return rc ? rc : 1;
}

/* This rank's q, k and v rows of a layer (whole heads, shard.h), for cols inputs. */
static void model__qkv_parts(const model_t *m, int64_t cols, model_part_t parts[3]) {
  const model_config_t *c = &m->full_cfg;
  const model_shard_t *s = &m->shard;
  const int64_t hd = c->head_dim, qd = (int64_t)c->n_heads * hd, kvd = (int64_t)c->n_kv_heads * hd;
  parts[0] = model__rows(qd, cols, s->head0 * hd, s->n_heads * hd);
  parts[1] = model__rows(kvd, cols, s->kv0 * hd, s->n_kv_heads * hd);
  parts[2] = parts[1];
}

/* Fused bias (1, qd + 2*kvd) of this rank's heads from the three biases. */
static int model__load_fused_bias(model_t *m, kern_weight_t *w, int il) {
  static const char *sfx[3] = {"attn_q.bias", "attn_k.bias", "attn_v.bias"};
  model_part_t parts[3];
  model__qkv_parts(m, 1, parts);
  const int64_t n = parts[0].nr + 2 * parts[1].nr;
  float *all = fr_malloc((size_t)n * sizeof(float)), *p = all;
  char name[96];
  for (int i = 0; i < 3; i++) {
    const model_tensor_t *t;
    snprintf(name, sizeof name, "blk.%d.%s", il, sfx[i]);
    if (!(t = model_source_tensor(m->src, name)) || t->rows * t->cols != parts[i].rows || !t->data ||
        (t->type != KERN_F32 && t->type != KERN_F16 && t->type != KERN_BF16)) {
      free(all);
      return fr_errorf(FR_EFORMAT, "tensor %s is missing or misshaped", name);
    }
    float *whole = fr_malloc((size_t)parts[i].rows * sizeof(float));
    kern_dequantize_row(t->type, t->data, whole, parts[i].rows);
    memcpy(p, whole + parts[i].r0, (size_t)parts[i].nr * sizeof(float));
    free(whole);
    p += parts[i].nr;
  }
  model__keep(m, all);
  *w = (kern_weight_t){.type = KERN_F32, .rows = 1, .cols = n, .row_bytes = (size_t)n * sizeof(float)};
  snprintf(name, sizeof name, "blk.%d.attn_{q,k,v}.bias", il);
  return model__weight_load(m, w, all, name);
}

/* q/k/v as one fused weight where the files allow (no per-head norms). */
static int model__load_layer_fused(model_t *m, int il) {
  const model_config_t *c = &m->full_cfg;
  model_layer_t *L = &m->layers[il];
  char q[96], k[96], v[96];
  snprintf(q, sizeof q, "blk.%d.attn_q.weight", il);
  snprintf(k, sizeof k, "blk.%d.attn_k.weight", il);
  snprintf(v, sizeof v, "blk.%d.attn_v.weight", il);
  int rc = 0;
  if (!c->qk_norm) {
    const char *names[3] = {q, k, v};
    model_part_t parts[3];
    model__qkv_parts(m, c->dim, parts);
    if ((rc = model__load_fused(m, &L->wqkv, names, 3, parts)) < 0) return rc;
    if (rc == 1 && c->attn_bias && (rc = model__load_fused_bias(m, &L->bqkv, il))) return rc;
  }
  return 0;
}

/* Expert e's part of a stack of n_experts (rows, cols) experts: the GGUF
 * 3-D tensor blk.il.<what>.weight, else the HF tensor of that expert. The
 * rank's rows [r0, r0 + nr) and columns [c0, c0 + nc) of the expert. */
static int model__load_expert(model_t *m, kern_weight_t *w, int il, const char *what, int e, model_part_t p) {
  const int64_t n = m->full_cfg.n_experts;
  char name[96];
  snprintf(name, sizeof name, "blk.%d.%s.weight", il, what);
  if (model_source_tensor(m->src, name)) { /* stacked: expert e is rows [e * rows, (e + 1) * rows) */
    p.r0 += e * p.rows;
    p.rows *= n;
  } else {
    snprintf(name, sizeof name, "blk.%d.%s.%d.weight", il, what, e);
  }
  return model__load_part_as(m, w, name, true, p, true);
}

/* A MoE layer's router (whole on every rank) and its experts' shards. */
static int model__load_moe(model_t *m, int il) {
  const model_config_t *c = &m->full_cfg;
  const model_shard_t *s = &m->shard;
  model_layer_t *L = &m->layers[il];
  char name[96];
  snprintf(name, sizeof name, "blk.%d.ffn_gate_inp.weight", il);
  int rc = model__load_weight(m, &L->router, name, true, c->n_experts, c->dim);
  const int64_t f = c->expert_ffn_dim;
  const model_part_t rows = model__rows(f, c->dim, s->exp0, s->exp_dim);
  const model_part_t cols = model__cols(c->dim, f, s->exp0, s->exp_dim);
  L->exp_gate = fr_calloc((size_t)c->n_experts, sizeof *L->exp_gate);
  L->exp_up = fr_calloc((size_t)c->n_experts, sizeof *L->exp_up);
  L->exp_down = fr_calloc((size_t)c->n_experts, sizeof *L->exp_down);
  for (int e = 0; e < c->n_experts && !rc; e++) {
    rc = model__load_expert(m, &L->exp_gate[e], il, "ffn_gate_exps", e, rows);
    if (!rc) rc = model__load_expert(m, &L->exp_up[e], il, "ffn_up_exps", e, rows);
    if (!rc) rc = model__load_expert(m, &L->exp_down[e], il, "ffn_down_exps", e, cols);
  }
  return rc;
}

/* The dense FFN: fused gate/up when the file allows, then down. */
static int model__load_dense_ffn(model_t *m, int il) {
  const model_config_t *c = &m->full_cfg;
  const model_shard_t *s = &m->shard;
  model_layer_t *L = &m->layers[il];
  const model_part_t ffn_rows = model__rows(c->ffn_dim, c->dim, s->ffn0, s->ffn_dim), parts[2] = {ffn_rows, ffn_rows};
  char g[96], u[96], d[96];
  snprintf(g, sizeof g, "blk.%d.ffn_gate.weight", il);
  snprintf(u, sizeof u, "blk.%d.ffn_up.weight", il);
  snprintf(d, sizeof d, "blk.%d.ffn_down.weight", il);
  const char *gu[2] = {g, u};
  int rc = model__load_fused(m, &L->w_gate_up, gu, 2, parts);
  if (rc < 0) return rc;
  if (!L->w_gate_up.data) {
    if ((rc = model__load_part(m, &L->w_gate, g, true, ffn_rows))) return rc;
    if ((rc = model__load_part(m, &L->w_up, u, true, ffn_rows))) return rc;
  }
  return model__load_part(m, &L->w_down, d, true, model__cols(c->dim, c->ffn_dim, s->ffn0, s->ffn_dim));
}

static int model__load_layer(model_t *m, int il) {
  const model_config_t *c = &m->full_cfg;
  const model_shard_t *s = &m->shard;
  model_layer_t *L = &m->layers[il];
  const int64_t hd = c->head_dim, qd = (int64_t)c->n_heads * hd;
  model_part_t qkv[3];
  model__qkv_parts(m, c->dim, qkv);
  char name[96];
  int rc = 0;
#define W(field, suffix, req, part)                                                    \
  do {                                                                                 \
    snprintf(name, sizeof name, "blk.%d.%s", il, suffix);                              \
    if ((rc = model__load_part(m, &L->field, name, req, part)) != 0) return rc;        \
  } while (0)
#define V(field, suffix, req, total, off, n)                                           \
  do {                                                                                 \
    snprintf(name, sizeof name, "blk.%d.%s", il, suffix);                              \
    if ((rc = model__load_f32_part(m, &L->field, name, req, total, off, n)) != 0) return rc; \
  } while (0)
  V(attn_norm, "attn_norm.weight", true, c->dim, 0, c->dim);
  if ((rc = model__load_layer_fused(m, il))) return rc;
  if (!L->wqkv.data) {
    W(wq, "attn_q.weight", true, qkv[0]);
    W(wk, "attn_k.weight", true, qkv[1]);
    W(wv, "attn_v.weight", true, qkv[2]);
    V(bq, "attn_q.bias", c->attn_bias, qkv[0].rows, qkv[0].r0, qkv[0].nr);
    V(bk, "attn_k.bias", c->attn_bias, qkv[1].rows, qkv[1].r0, qkv[1].nr);
    V(bv, "attn_v.bias", c->attn_bias, qkv[2].rows, qkv[2].r0, qkv[2].nr);
  }
  V(q_norm, "attn_q_norm.weight", c->qk_norm, hd, 0, hd);
  V(k_norm, "attn_k_norm.weight", c->qk_norm, hd, 0, hd);
  W(wo, "attn_output.weight", true, model__cols(c->dim, qd, s->head0 * hd, s->n_heads * hd));
  V(ffn_norm, "ffn_norm.weight", true, c->dim, 0, c->dim);
#undef W
#undef V
  return model_config_layer_moe(c, il) ? model__load_moe(m, il) : model__load_dense_ffn(m, il);
}

static int model__load_globals(model_t *m) {
  const model_config_t *c = &m->cfg;
  const model_shard_t *s = &m->shard;
  int rc = model__load_weight(m, &m->tok_embd, "token_embd.weight", true, c->vocab_size, c->dim);
  if (rc) return rc;
  if ((rc = model__load_f32_vector(m, &m->output_norm, "output_norm.weight", true, c->dim))) return rc;
  bool tied = c->tied_embeddings || !model_source_tensor(m->src, "output.weight");
  if (tied && !s->split_vocab) {
    m->output = m->tok_embd; /* alias: released once, through tok_embd */
    return 0;
  }
  return model__load_part(m, &m->output, tied ? "token_embd.weight" : "output.weight", true,
                          model__rows(c->vocab_size, c->dim, s->vocab0, s->n_vocab));
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
  /* rows rounded up to 4: a matmul may write that many (kern_ops_t.matmul) */
  size_t es = m->be->act_size, T = ((size_t)m->max_tokens + 3) & ~(size_t)3;
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
      {&m->logits_part, m->shard.split_vocab ? (size_t)m->max_seqs * m->shard.n_vocab : 0},
  };
  for (size_t i = 0; i < FR_ARRAY_SIZE(bufs); i++) {
    if (!bufs[i].n) continue;
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
  m->pooling = opts ? opts->pooling : MODEL_POOL_NONE;
  m->fp8 = opts && opts->fp8_weights;
  m->dummy_fp8 = opts ? opts->dummy_fp8 : (kern_type_t)0;
  if (m->max_seqs > m->max_tokens) m->max_seqs = m->max_tokens;
  const char *ng = getenv("FERRUM_NO_GRAPHS"), *mm = getenv("FERRUM_LOAD_MMAP");
  m->no_graphs = ng && *ng && strcmp(ng, "0");
  m->file_reads = be->ops->weight_load_file && !(mm && *mm && strcmp(mm, "0"));
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

int model__plan_shard(model_t *m, const model_load_opts_t *opts, int ffn_unit) {
  m->full_cfg = m->cfg;
  int size = opts && opts->tp_size > 1 ? opts->tp_size : 1, rank = size > 1 ? opts->tp_rank : 0;
  return model_shard_plan(&m->cfg, rank, size, ffn_unit, &m->shard);
}

void model__use_shard(model_t *m) {
  m->cfg.n_heads = m->shard.n_heads;
  m->cfg.n_kv_heads = m->shard.n_kv_heads;
  m->cfg.ffn_dim = m->shard.ffn_dim;
  m->cfg.expert_ffn_dim = m->shard.exp_dim;
}

/* The FFN's cut unit: the largest quantization block of the down
 * projections (their columns are cut), dense or expert. */
static int model__ffn_unit(const model_t *m) {
  static const char *const names[] = {"blk.0.ffn_down.weight", "blk.0.ffn_down_exps.weight",
                                      "blk.0.ffn_down_exps.0.weight"};
  int unit = 1;
  for (size_t i = 0; i < FR_ARRAY_SIZE(names); i++) {
    const model_tensor_t *t = model_source_tensor(m->src, names[i]);
    const kern_type_traits_t *tr = t ? kern_type_traits(t->type) : NULL;
    if (tr) unit = FR_MAX(unit, tr->blck);
  }
  return unit;
}

int model__check_backend(const model_t *m) {
  if (m->cfg.n_experts && !m->be->ops->moe_ffn)
    return fr_errorf(FR_EUNSUPPORTED, "%s: the %s backend has no mixture-of-experts op (moe_ffn)", m->cfg.arch_name,
                     m->be->ops->name);
  if ((m->pooling == MODEL_POOL_MEAN || m->pooling == MODEL_POOL_CLS) && !m->be->ops->pool_rows)
    return fr_errorf(FR_EUNSUPPORTED, "%s pooling needs the backend's pool_rows op, which the %s backend lacks",
                     model_pooling_name(m->pooling), m->be->ops->name);
  if (m->fp8 && !m->be->fp8_weights)
    return fr_errorf(FR_EUNSUPPORTED, "--quantization fp8: the %s backend cannot keep FP8 weights (it needs a CUDA "
                     "device of compute capability 8.9 or newer)", m->be->ops->name);
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
  return rc;
}

int model_load(model_t **out, const char *path, kern_backend_t *be, const model_load_opts_t *opts) {
  *out = NULL;
  model_t *m = model__new(be, opts);
  uint64_t t0 = fr_now_ns();
  int rc = model_source_open(&m->src, path);
  if (rc) goto fail;
  m->cfg = m->src->config;
  if ((rc = model__check_config(&m->cfg))) goto fail;
  if ((rc = model__check_backend(m))) goto fail;
  if ((rc = model__plan_shard(m, opts, model__ffn_unit(m)))) goto fail;
  m->rope.mode = m->src->rope_mode;
  if ((rc = model__load_tokenizer(m))) goto fail;
  model_progress_t prog;
  model__load_begin(m, &prog, model__load_bytes(m), opts && opts->progress);
  if (m->cfg.arch == MODEL_ARCH_BERT) {
    if ((rc = model__bert_load(m)) || (rc = model__load_end(m)) || (rc = model__alloc_scratch(m))) goto fail;
    *out = m;
    return 0;
  }
  if ((rc = model__load_globals(m))) goto fail;
  m->layers = fr_calloc((size_t)m->cfg.n_layers, sizeof *m->layers);
  for (int il = 0; il < m->cfg.n_layers; il++)
    if ((rc = model__load_layer(m, il))) goto fail;
  if ((rc = model__init_rope(m))) goto fail;
  if ((rc = model__load_end(m))) goto fail;
  model__use_shard(m);
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
      model__release_experts(m, &m->layers[il]);
    }
    free(m->layers);
  }
  /* output aliases tok_embd (tied, whole vocabulary) or is a weight of its own, which may start at
   * tok_embd's bytes (a CPU rank's vocabulary part 0) and still own panels (w->priv) */
  const bool alias = m->output.data == m->tok_embd.data && m->output.priv == m->tok_embd.priv &&
                     m->output.rows == m->tok_embd.rows;
  if (m->output.data && !alias) model__release_weight(m, &m->output);
  model__release_weight(m, &m->tok_embd);
  model__release_weight(m, &m->output_norm);
  model__release_weight(m, &m->inv_freq);
  model__bert_release(m);
  void *bufs[] = {m->x, m->xn, m->qkv, m->att, m->gate, m->up, m->last, m->logits, m->logits_part};
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
