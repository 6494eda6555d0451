/* cpu_matmul.c - matmul (ggml-style: activations quantized once into the
 * weight's vec_dot type, integer block dots, output rows split across threads
 * in chunks taken from an atomic counter; or, for a weight packed into
 * panels at load, the panel kernel over 16 rows and up to CPU_PANEL_TILE (8) activation rows
 * at a time, or from CPU_AMX_ROWS rows of Q4_K / Q6_K the AMX tiles, cpu_amx.c) and embedding
 * lookup. */
#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "kernels/cpu/cpu.h"

#define CPU_MM_TILE_N 8         /* activation rows per weight-row pass (prefill) */
#define CPU_MM_QUANT_SERIAL 8192 /* quantize in the caller below this many elements */
#define CPU_MM_OUTER_ACT (256 << 10) /* panels: activation bytes up to which each panel takes all tiles at once */

typedef struct {
  const kern_weight_t *w;
  const float *bias;      /* (rows) or NULL */
  const float *x;         /* (n, cols) f32 */
  uint8_t *act;           /* (n, act_row_bytes): quantized x, or x itself */
  size_t act_row_bytes;
  cpu_quantize_fn quant;  /* NULL for float weights */
  cpu_vec_dot_fn dot;
  cpu_vec_dot_x4_fn dot_x4; /* NULL when the path has no 4-row form */
  cpu_vec_dot_2x4_fn dot_2x4; /* NULL when the path has no 2x4 form */
  cpu_panel_gemm_fn gemm;   /* the table's panel kernel when w->priv holds panels, else NULL */
  int nb;                   /* panels: blocks per row */
  bool panel_outer;         /* panels: all activation tiles of a panel before the next (CPU_MM_OUTER_ACT) */
  float *out;             /* (n, rows) */
  int n;
  size_t prefetch; /* cpu_ctx_t.prefetch */
  long chunk_rows, n_chunks; /* panels: chunk_rows a multiple of CPU_PANEL_ROWS */
  atomic_long next_chunk;
} cpu_mm_job_t;

static void cpu__mm_quantize_part(void *arg, int ith, int nth) {
  cpu_mm_job_t *job = arg;
  long lo, hi;
  fr_pool_split(job->n, ith, nth, &lo, &hi);
  for (long j = lo; j < hi; j++) {
    const float *x = job->x + j * job->w->cols;
    uint8_t *a = job->act + j * job->act_row_bytes;
    if (job->gemm) cpu__panel_quantize(job->quant, job->w->type, x, a, (int)job->w->cols);
    else job->quant(x, a, (int)job->w->cols);
  }
}

/* Output row r for activation rows [j0, j1): 4 at a time where the path has
 * a 4-row form, then one by one. */
static void cpu__mm_row(const cpu_mm_job_t *job, long r, int j0, int j1) {
  const kern_weight_t *w = job->w;
  const void *wrow = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
  const int cols = (int)w->cols;
  const size_t ld = (size_t)w->rows;
  const float b = job->bias ? job->bias[r] : 0.0f;
  int j = j0;
  if (job->dot_x4)
    for (; j + 4 <= j1; j += 4) {
      float v[4];
      job->dot_x4(cols, v, wrow, job->act + (size_t)j * job->act_row_bytes, job->act_row_bytes);
      for (int k = 0; k < 4; k++) job->out[(size_t)(j + k) * ld + (size_t)r] = v[k] + b;
    }
  for (; j < j1; j++) {
    float v;
    job->dot(cols, &v, wrow, job->act + (size_t)j * job->act_row_bytes);
    job->out[(size_t)j * ld + (size_t)r] = v + b;
  }
}

/* Output rows r and r + 1 for activation rows [j0, j1) through the path's
 * 2x4 form, the leftover activation rows as cpu__mm_row does them. */
static void cpu__mm_row_pair(const cpu_mm_job_t *job, long r, int j0, int j1) {
  const kern_weight_t *w = job->w;
  const void *wrow = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
  const size_t ld = (size_t)w->rows;
  const float b0 = job->bias ? job->bias[r] : 0.0f, b1 = job->bias ? job->bias[r + 1] : 0.0f;
  int j = j0;
  for (; j + 4 <= j1; j += 4) {
    float v[8];
    job->dot_2x4((int)w->cols, v, wrow, w->row_bytes, job->act + (size_t)j * job->act_row_bytes, job->act_row_bytes);
    for (int k = 0; k < 4; k++) {
      job->out[(size_t)(j + k) * ld + (size_t)r] = v[k] + b0;
      job->out[(size_t)(j + k) * ld + (size_t)r + 1] = v[4 + k] + b1;
    }
  }
  if (j < j1) {
    cpu__mm_row(job, r, j, j1);
    cpu__mm_row(job, r + 1, j, j1);
  }
}

/* Asks for the cache lines of k weight rows' bytes job->prefetch past row
 * r's start (within the weight), before rows r.. are dotted. The weight
 * streams from memory once per decode step; on a Xeon with AVX-512 the
 * hardware prefetchers alone read it at about half the rate
 * (docs/bench/cpu-model.md, session 20; session 19 saw no change on a
 * Zen 3 EPYC).
 * Inlined always: as a function of its own GCC finds it free of side
 * effects (ipa-pure-const) and drops every call. */
static inline __attribute__((always_inline)) void cpu__mm_prefetch(const cpu_mm_job_t *job, long r, long k) {
  if (!job->prefetch) return;
  const kern_weight_t *w = job->w;
  const char *p = (const char *)w->data + (size_t)r * w->row_bytes + job->prefetch;
  const char *end = (const char *)w->data + (size_t)w->rows * w->row_bytes;
  for (size_t o = 0; o < (size_t)k * w->row_bytes && p + o < end; o += 64) __builtin_prefetch(p + o);
}

/* Output rows [r0, r1) for all n activation rows, CPU_MM_TILE_N at a time so
 * each weight row is reused from cache across the tile (and prefetched
 * only in the first pass, which brings the chunk into cache). */
static void cpu__mm_chunk(const cpu_mm_job_t *job, long r0, long r1) {
  for (int j0 = 0; j0 < job->n; j0 += CPU_MM_TILE_N) {
    int j1 = FR_MIN(job->n, j0 + CPU_MM_TILE_N);
    long r = r0;
    if (job->dot_2x4 && j1 - j0 >= 4)
      for (; r + 2 <= r1; r += 2) {
        if (j0 == 0) cpu__mm_prefetch(job, r, 2);
        cpu__mm_row_pair(job, r, j0, j1);
      }
    for (; r < r1; r++) {
      if (j0 == 0) cpu__mm_prefetch(job, r, 1);
      cpu__mm_row(job, r, j0, j1);
    }
  }
}

/* The panel kernel on output rows [r, r + 16) (one panel) and activation rows [j0,
 * j0 + CPU_PANEL_TILE); the first tile prefetches ahead. */
static void cpu__mm_panel_tile(const cpu_mm_job_t *job, long r, int j0) {
  const size_t ld = (size_t)job->w->rows, pbytes = (size_t)job->nb * cpu_panel_block_bytes(job->w->type);
  job->gemm(job->nb, (const uint8_t *)job->w->priv + (size_t)(r / CPU_PANEL_ROWS) * pbytes,
            job->act + (size_t)j0 * job->act_row_bytes, job->act_row_bytes, FR_MIN(CPU_PANEL_TILE, job->n - j0),
            job->out + (size_t)j0 * ld + (size_t)r, ld, job->bias ? job->bias + r : NULL, j0 == 0 ? job->prefetch : 0);
}

/* Output rows [r0, r1) (whole panels) for all n activation rows: panel by
 * panel, each taking every activation tile (job->panel_outer), or tile by
 * tile, each sweeping the chunk's panels, which stay in L2 across the
 * tiles. */
static void cpu__mm_panel_chunk(const cpu_mm_job_t *job, long r0, long r1) {
  if (job->panel_outer) {
    for (long r = r0; r < r1; r += CPU_PANEL_ROWS)
      for (int j0 = 0; j0 < job->n; j0 += CPU_PANEL_TILE) cpu__mm_panel_tile(job, r, j0);
    return;
  }
  for (int j0 = 0; j0 < job->n; j0 += CPU_PANEL_TILE)
    for (long r = r0; r < r1; r += CPU_PANEL_ROWS) cpu__mm_panel_tile(job, r, j0);
}

static void cpu__mm_part(void *arg, int ith, int nth) {
  cpu_mm_job_t *job = arg;
  long c = ith;
  while (c < job->n_chunks) {
    long r0 = c * job->chunk_rows, r1 = FR_MIN(job->w->rows, r0 + job->chunk_rows);
    if (job->gemm) cpu__mm_panel_chunk(job, r0, r1);
    else cpu__mm_chunk(job, r0, r1);
    c = atomic_fetch_add_explicit(&job->next_chunk, 1, memory_order_relaxed);
  }
}

static int cpu__mm_check(const cpu_ctx_t *ctx, const kern_weight_t *w, const kern_weight_t *bias, int n) {
  if (n < 0 || !w->data) return fr_errorf(-EINVAL, "matmul: bad arguments (n %d)", n);
  if (w->type < 0 || w->type >= KERN_TYPE_MAX || !ctx->isa->vec_dot[w->type])
    return fr_errorf(FR_EUNSUPPORTED, "matmul: weight type %d", (int)w->type);
  if (w->cols <= 0 || w->cols > INT_MAX || w->rows <= 0 || kern_row_bytes(w->type, w->cols) != w->row_bytes)
    return fr_errorf(-EINVAL, "matmul: bad weight shape (%lld x %lld)", (long long)w->rows, (long long)w->cols);
  if (cpu_vec_dot_type(w->type) == KERN_Q8_K && w->cols % CPU_QK_K)
    return fr_errorf(-EINVAL, "matmul: K-quant row of %lld", (long long)w->cols);
  if (w->x_cols && (!w->perm || w->x_cols < 0 || w->x_cols > w->cols))
    return fr_errorf(-EINVAL, "matmul: x_cols %lld without a permutation, or past cols %lld", (long long)w->x_cols,
                     (long long)w->cols);
  if (bias && (bias->type != KERN_F32 || bias->rows * bias->cols != w->rows || !bias->data))
    return fr_errorf(-EINVAL, "matmul: bias must be F32 with %lld elements", (long long)w->rows);
  return 0;
}

/* x (n, x_cols) gathered into the weight's column order: pbuf[j][k] =
 * x[j][perm[k]], and 0 for a padding column (perm[k] = -1): 0 adds exactly
 * nothing to a block's sum(q x) and sum(x), whatever the column's weights. */
static const float *cpu__mm_permute(cpu_ctx_t *ctx, const kern_weight_t *w, const float *x, int n) {
  const size_t cols = (size_t)w->cols, xc = (size_t)kern_weight_x_cols(w);
  cpu__scratch_reserve(&ctx->pbuf, &ctx->pbuf_cap, cols * (size_t)n * sizeof(float));
  float *p = ctx->pbuf;
  for (int j = 0; j < n; j++) {
    const float *xr = x + (size_t)j * xc;
    float *o = p + (size_t)j * cols;
    for (size_t k = 0; k < cols; k++) o[k] = w->perm[k] < 0 ? 0.0f : xr[w->perm[k]];
  }
  return p;
}

int cpu__matmul(void *vctx, void *out, const kern_weight_t *w, const kern_weight_t *bias, const void *x, int n) {
  cpu_ctx_t *ctx = vctx;
  int rc = cpu__mm_check(ctx, w, bias, n);
  if (rc || n == 0) return rc;
  if (w->perm) x = cpu__mm_permute(ctx, w, x, n);
#if defined(__x86_64__)
  if (ctx->amx_rows && n >= ctx->amx_rows && w->priv && cpu__amx_takes(w->type))
    return cpu__amx_matmul(ctx, out, w, bias ? bias->data : NULL, x, n);
#endif
  cpu_mm_job_t job = {.w = w, .bias = bias ? bias->data : NULL, .x = x, .out = out, .n = n, .prefetch = ctx->prefetch};
  job.dot = ctx->isa->vec_dot[w->type];
  job.dot_x4 = ctx->isa->vec_dot_x4[w->type];
  job.dot_2x4 = ctx->isa->vec_dot_2x4[w->type];
  if (w->priv) { /* panels (cpu__weight_pack) */
    job.gemm = ctx->isa->panel_gemm[w->type];
    job.nb = (int)(w->cols / kern_type_traits(w->type)->blck);
  }
  kern_type_t vdt = cpu_vec_dot_type(w->type);
  if (vdt == KERN_F32) {
    job.act = (uint8_t *)x;
    job.act_row_bytes = (size_t)w->cols * sizeof(float);
  } else {
    job.quant = ctx->isa->quantize[vdt];
    job.act_row_bytes = job.gemm ? (size_t)job.nb * cpu__panel_act_bytes(w->type) : kern_row_bytes(vdt, w->cols);
    cpu__scratch_reserve(&ctx->qbuf, &ctx->qbuf_cap, job.act_row_bytes * (size_t)n);
    job.act = ctx->qbuf;
    if ((long)n * w->cols < CPU_MM_QUANT_SERIAL || ctx->n_threads == 1 || n == 1)
      cpu__mm_quantize_part(&job, 0, 1);
    else
      fr_pool_run(ctx->pool, cpu__mm_quantize_part, &job);
  }
  /* ~8 chunks per thread for balance. Rows: 4 to 64 a chunk. Panels, when
   * the quantized activations are small (decode): each panel is read once
   * from memory for all activation tiles (cpu__mm_panel_chunk) and a chunk
   * is a whole eighth of a thread's share, long runs that stream better
   * than short ones (docs/bench/cpu-model.md, session 22); otherwise
   * (prefill) each activation tile sweeps the chunk's 1 to 4 panels, which
   * stay in L2 for the next tile. */
  const long per = w->rows / ((long)ctx->n_threads * 8), panels = FR_MAX(1, per / CPU_PANEL_ROWS);
  job.panel_outer = job.gemm && (size_t)n * job.act_row_bytes <= CPU_MM_OUTER_ACT;
  if (job.gemm) job.chunk_rows = CPU_PANEL_ROWS * (job.panel_outer ? panels : FR_MIN(panels, 4));
  else job.chunk_rows = FR_MAX(4, FR_MIN(per, 64));
  job.n_chunks = (w->rows + job.chunk_rows - 1) / job.chunk_rows;
  atomic_init(&job.next_chunk, ctx->n_threads);
  if (ctx->n_threads == 1 || job.n_chunks == 1) cpu__mm_part(&job, 0, 1);
  else fr_pool_run(ctx->pool, cpu__mm_part, &job);
  return 0;
}

int cpu__embed(void *vctx, void *out, const kern_weight_t *table) {
  cpu_ctx_t *ctx = vctx;
  if (!table->data || !kern_type_traits(table->type) || table->type == KERN_Q8_1 || table->type == KERN_Q8_K)
    return fr_errorf(-EINVAL, "embed: bad table");
  float *o = out;
  for (int t = 0; t < ctx->n_tokens; t++) {
    int32_t id = ctx->tokens[t];
    if (id < 0 || id >= table->rows)
      return fr_errorf(-EINVAL, "embed: token %d out of range [0, %lld)", id, (long long)table->rows);
    const uint8_t *row = (const uint8_t *)table->data + (size_t)id * table->row_bytes;
    kern_dequantize_row(table->type, row, o + (size_t)t * (size_t)table->cols, table->cols);
  }
  return 0;
}
