/* cpu_ops.c - elementwise and per-row ops of the CPU backend: rms_norm,
 * add_rms_norm, rope, kv_append, silu_mul, add, last_rows, pool_rows. Small ops run on
 * the calling thread; large ones split their rows over the pool. */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "kernels/cpu/cpu.h"

#define CPU_OPS_PARALLEL_MIN 32768 /* elements below which an op stays on one thread */

typedef void (*cpu_row_fn)(const void *job, int i);

typedef struct {
  cpu_row_fn fn;
  const void *job;
  int n;
} cpu_rows_t;

static void cpu__rows_part(void *arg, int ith, int nth) {
  const cpu_rows_t *r = arg;
  long lo, hi;
  fr_pool_split(r->n, ith, nth, &lo, &hi);
  for (long i = lo; i < hi; i++) r->fn(r->job, (int)i);
}

/* Calls fn(job, i) for i in [0, n), on the pool when there is enough work. */
static void cpu__run_rows(cpu_ctx_t *ctx, cpu_row_fn fn, const void *job, int n, size_t elems) {
  cpu_rows_t r = {fn, job, n};
  if (ctx->n_threads == 1 || n < 2 || elems < CPU_OPS_PARALLEL_MIN) cpu__rows_part(&r, 0, 1);
  else fr_pool_run(ctx->pool, cpu__rows_part, &r);
}

/* ---- rms_norm / add_rms_norm ---- */

typedef struct {
  float *out, *residual;
  const float *x, *w;
  int dim;
  float eps;
} cpu_norm_job_t;

/* As ggml's rms_norm: f32 squares summed in double, the mean and the scale
 * in f32, then x * scale * w. */
static void cpu__norm_row(float *o, const float *x, const float *w, int dim, float eps) {
  double ss = 0.0;
  for (int i = 0; i < dim; i++) ss += (double)(x[i] * x[i]);
  const float mean = (float)(ss / dim);
  const float scale = 1.0f / sqrtf(mean + eps);
  for (int i = 0; i < dim; i++) o[i] = x[i] * scale * w[i];
}

static void cpu__rms_norm_row(const void *vjob, int i) {
  const cpu_norm_job_t *j = vjob;
  size_t off = (size_t)i * (size_t)j->dim;
  cpu__norm_row(j->out + off, j->x + off, j->w, j->dim, j->eps);
}

static void cpu__add_rms_norm_row(const void *vjob, int i) {
  const cpu_norm_job_t *j = vjob;
  size_t off = (size_t)i * (size_t)j->dim;
  float *r = j->residual + off;
  const float *x = j->x + off;
  for (int k = 0; k < j->dim; k++) r[k] += x[k];
  cpu__norm_row(j->out + off, r, j->w, j->dim, j->eps);
}

static int cpu__norm_check(const kern_weight_t *w, int n, int dim) {
  if (n < 0 || dim <= 0 || !w || w->type != KERN_F32 || w->rows * w->cols != dim || !w->data)
    return fr_errorf(-EINVAL, "rms_norm: weight must be F32 of %d elements (n %d)", dim, n);
  return 0;
}

int cpu__rms_norm(void *vctx, void *out, const void *x, const kern_weight_t *w, int n, int dim, float eps) {
  int rc = cpu__norm_check(w, n, dim);
  if (rc) return rc;
  cpu_norm_job_t job = {.out = out, .x = x, .w = w->data, .dim = dim, .eps = eps};
  cpu__run_rows(vctx, cpu__rms_norm_row, &job, n, (size_t)n * (size_t)dim);
  return 0;
}

int cpu__add_rms_norm(void *vctx, void *out, void *residual, const void *x, const kern_weight_t *w, int n, int dim,
                      float eps) {
  int rc = cpu__norm_check(w, n, dim);
  if (rc) return rc;
  cpu_norm_job_t job = {.out = out, .residual = residual, .x = x, .w = w->data, .dim = dim, .eps = eps};
  cpu__run_rows(vctx, cpu__add_rms_norm_row, &job, n, (size_t)n * (size_t)dim);
  return 0;
}

/* ---- rope ---- */

typedef struct {
  float *x;
  const float *cs; /* (n_tokens, n_rot): cos, sin of each pair, interleaved */
  int n_heads, head_dim, row_stride, n_rot;
  kern_rope_mode_t mode;
} cpu_rope_job_t;

static void cpu__rope_row(const void *vjob, int t) {
  const cpu_rope_job_t *j = vjob;
  const float *cs = j->cs + (size_t)t * (size_t)j->n_rot;
  const int half = j->n_rot / 2;
  /* NORM pairs (2i, 2i+1); NEOX pairs (i, i + n_rot/2). */
  const int stride = j->mode == KERN_ROPE_NORM ? 2 : 1, other = j->mode == KERN_ROPE_NORM ? 1 : half;
  for (int h = 0; h < j->n_heads; h++) {
    float *x = j->x + (size_t)t * (size_t)j->row_stride + (size_t)h * (size_t)j->head_dim;
    for (int i = 0; i < half; i++) {
      float *a = x + i * stride, *b = a + other;
      const float c = cs[2 * i], s = cs[2 * i + 1], x0 = *a, x1 = *b;
      *a = x0 * c - x1 * s;
      *b = x0 * s + x1 * c;
    }
  }
}

static int cpu__rope_check(const cpu_ctx_t *ctx, int n_heads, int head_dim, int row_stride, const kern_rope_t *r) {
  if (n_heads <= 0 || head_dim <= 0 || r->n_rot <= 0 || r->n_rot % 2 || r->n_rot > head_dim ||
      row_stride < n_heads * head_dim)
    return fr_errorf(-EINVAL, "rope: bad shape (heads %d, head_dim %d, n_rot %d, stride %d)", n_heads, head_dim,
                     r->n_rot, row_stride);
  if (r->mode != KERN_ROPE_NORM && r->mode != KERN_ROPE_NEOX) return fr_errorf(-EINVAL, "rope: bad mode");
  if (!r->inv_freq || r->inv_freq->type != KERN_F32 || r->inv_freq->rows * r->inv_freq->cols != r->n_rot / 2 ||
      !r->inv_freq->data)
    return fr_errorf(-EINVAL, "rope: inv_freq must be F32 of n_rot/2 = %d elements", r->n_rot / 2);
  return 0;
}

int cpu__rope(void *vctx, void *x, int n_heads, int head_dim, int row_stride, const kern_rope_t *r) {
  cpu_ctx_t *ctx = vctx;
  int rc = cpu__rope_check(ctx, n_heads, head_dim, row_stride, r);
  if (rc) return rc;
  const int nt = ctx->n_tokens, half = r->n_rot / 2;
  const float *inv = r->inv_freq->data;
  if (ctx->rope_step != ctx->step_id || ctx->rope_inv != inv || ctx->rope_n_rot != r->n_rot ||
      ctx->rope_attn_factor != r->attn_factor) { /* q and k of every layer share one table */
    cpu__scratch_reserve((void **)&ctx->rope_cs, &ctx->rope_cap, (size_t)nt * (size_t)r->n_rot * sizeof(float));
    for (int t = 0; t < nt; t++) {
      float *cs = ctx->rope_cs + (size_t)t * (size_t)r->n_rot;
      for (int i = 0; i < half; i++) {
        const float theta = (float)ctx->positions[t] * inv[i]; /* f32, as ggml */
        cs[2 * i] = cosf(theta) * r->attn_factor;
        cs[2 * i + 1] = sinf(theta) * r->attn_factor;
      }
    }
    ctx->rope_step = ctx->step_id;
    ctx->rope_inv = inv;
    ctx->rope_n_rot = r->n_rot;
    ctx->rope_attn_factor = r->attn_factor;
  }
  cpu_rope_job_t job = {x, ctx->rope_cs, n_heads, head_dim, row_stride, r->n_rot, r->mode};
  cpu__run_rows(ctx, cpu__rope_row, &job, nt, (size_t)nt * (size_t)n_heads * (size_t)head_dim);
  return 0;
}

/* ---- kv_append ---- */

static void cpu__store_row(void *dst, kern_type_t type, const float *src, int n) {
  if (type == KERN_F32) {
    memcpy(dst, src, (size_t)n * sizeof(float));
    return;
  }
  uint16_t *d = dst;
  for (int i = 0; i < n; i++) d[i] = fr_fp32_to_fp16(src[i]);
}

/* A quantized pool: each (token, KV head) row of K and V becomes bytes and
 * an f16 scale (kern_kv_quantize_row, the reference every backend follows). */
static void cpu__kv_append_quant(const cpu_ctx_t *ctx, kern_kv_pool_t *pool, int layer, const float *k,
                                 int k_stride, const float *v, int v_stride) {
  const kern_kv_config_t *c = &pool->cfg;
  const size_t hd = (size_t)c->head_dim, nkv = (size_t)c->n_kv_heads;
  for (int isv = 0; isv < 2; isv++) {
    int8_t *q = kern_kv_pool_elems(pool, layer, isv);
    uint16_t *sc = kern_kv_pool_scales(pool, layer, isv);
    const float *x = isv ? v : k;
    const size_t stride = (size_t)(isv ? v_stride : k_stride);
    for (int t = 0; t < ctx->n_tokens; t++) {
      if (ctx->slots[t] < 0) continue;
      const size_t slot = (size_t)ctx->slots[t];
      for (size_t h = 0; h < nkv; h++)
        kern_kv_quantize_row(c->dtype, x + (size_t)t * stride + h * hd, (int)hd, q + (slot * nkv + h) * hd,
                             sc + slot * nkv + h);
    }
  }
}

int cpu__kv_append(void *vctx, kern_kv_pool_t *pool, int layer, const void *k, int k_stride, const void *v,
                   int v_stride) {
  cpu_ctx_t *ctx = vctx;
  const kern_kv_config_t *c = &pool->cfg;
  const int kvd = c->n_kv_heads * c->head_dim;
  if (layer < 0 || layer >= c->n_layers || k_stride < kvd || v_stride < kvd || !pool->base)
    return fr_errorf(-EINVAL, "kv_append: bad layer %d or strides (%d, %d) for rows of %d", layer, k_stride,
                     v_stride, kvd);
  const long n_slots = (long)c->n_blocks * c->block_size;
  for (int t = 0; t < ctx->n_tokens; t++)
    if (ctx->slots[t] >= n_slots)
      return fr_errorf(-EINVAL, "kv_append: slot %d outside the pool (%ld slots)", ctx->slots[t], n_slots);
  if (c->dtype != KERN_KV_AUTO) {
    cpu__kv_append_quant(ctx, pool, layer, k, k_stride, v, v_stride);
    return 0;
  }
  const size_t es = c->type == KERN_F16 ? 2 : 4, row_bytes = (size_t)kvd * es;
  uint8_t *kb = kern_kv_pool_elems(pool, layer, 0), *vb = kern_kv_pool_elems(pool, layer, 1);
  for (int t = 0; t < ctx->n_tokens; t++) {
    if (ctx->slots[t] < 0) continue;
    size_t off = (size_t)ctx->slots[t] * row_bytes;
    cpu__store_row(kb + off, c->type, (const float *)k + (size_t)t * (size_t)k_stride, kvd);
    cpu__store_row(vb + off, c->type, (const float *)v + (size_t)t * (size_t)v_stride, kvd);
  }
  return 0;
}

/* ---- silu_mul, add, last_rows ---- */

typedef struct {
  float *out;
  const float *gate, *up;
  int d, stride;
  void (*row)(int d, const float *g, const float *u, float *o); /* cpu_isa_t.silu_mul */
} cpu_silu_job_t;

static void cpu__silu_mul_row(const void *vjob, int i) {
  const cpu_silu_job_t *j = vjob;
  j->row(j->d, j->gate + (size_t)i * (size_t)j->stride, j->up + (size_t)i * (size_t)j->stride,
         j->out + (size_t)i * (size_t)j->d);
}

int cpu__silu_mul(void *vctx, void *out, const void *gate, const void *up, int n, int d, int stride) {
  if (n < 0 || d <= 0 || stride < d) return fr_errorf(-EINVAL, "silu_mul: bad shape (%d, %d, stride %d)", n, d, stride);
  const cpu_ctx_t *ctx = vctx;
  cpu_silu_job_t job = {out, gate, up, d, stride, ctx->isa->silu_mul};
  cpu__run_rows(vctx, cpu__silu_mul_row, &job, n, (size_t)n * (size_t)d * 8);
  return 0;
}

int cpu__add(void *vctx, void *out, const void *a, const void *b, size_t n) {
  float *o = out;
  const float *x = a, *y = b;
  for (size_t i = 0; i < n; i++) o[i] = x[i] + y[i];
  return 0;
}

int cpu__last_rows(void *vctx, void *out, const void *x, int dim) {
  cpu_ctx_t *ctx = vctx;
  if (dim <= 0) return fr_errorf(-EINVAL, "last_rows: dim %d", dim);
  for (int s = 0; s < ctx->n_seqs; s++) {
    float *o = (float *)out + (size_t)s * (size_t)dim;
    int last = ctx->q_start[s + 1] - 1;
    if (last < ctx->q_start[s]) memset(o, 0, (size_t)dim * sizeof(float)); /* no tokens this step */
    else memcpy(o, (const float *)x + (size_t)last * (size_t)dim, (size_t)dim * sizeof(float));
  }
  return 0;
}

int cpu__pool_rows(void *vctx, void *out, const void *x, int dim, kern_pool_t mode) {
  cpu_ctx_t *ctx = vctx;
  if (dim <= 0 || (mode != KERN_POOL_MEAN && mode != KERN_POOL_FIRST))
    return fr_errorf(-EINVAL, "pool_rows: dim %d, mode %d", dim, (int)mode);
  for (int s = 0; s < ctx->n_seqs; s++) {
    float *o = (float *)out + (size_t)s * (size_t)dim;
    const int first = ctx->q_start[s], n = ctx->q_start[s + 1] - first;
    const float *r = (const float *)x + (size_t)first * (size_t)dim;
    memset(o, 0, (size_t)dim * sizeof(float));
    if (n <= 0) continue;
    if (mode == KERN_POOL_FIRST) {
      memcpy(o, r, (size_t)dim * sizeof(float));
      continue;
    }
    for (int t = 0; t < n; t++, r += dim)
      for (int k = 0; k < dim; k++) o[k] += r[k];
    for (int k = 0; k < dim; k++) o[k] /= (float)n;
  }
  return 0;
}
