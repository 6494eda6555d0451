/* cpu_moe.c - the mixture-of-experts FFN (moe_ffn, kern.h) of the CPU
 * backend, over its matmul and silu_mul:
 *   route:   logits = x router^T; per token softmax, top-k, weights
 *   group:   the (token, k) pairs sorted by expert, their rows of x gathered
 *   experts: per expert with tokens, one matmul each of gate, up, down over
 *            all its rows (each expert's weights are read once per call)
 *   combine: out[t] = sum over k, in top-k order, of weight * its down row
 * Scratch is one buffer in the context, grown once and reused. */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "kernels/cpu/cpu.h"

/* Views into ctx->moe_buf for n tokens, k experts each (P = n * k pairs). */
typedef struct {
  float *logits;    /* (n, n_experts) router logits, then probabilities */
  int32_t *sel;     /* (n, k) chosen expert of each pair, in top-k order */
  float *w;         /* (n, k) their weights */
  int32_t *start;   /* (n_experts + 1) first slot of each expert's rows */
  int32_t *slot;    /* (n, k) row of each pair in the expert-sorted order */
  float *xs;        /* (P, dim) x rows in expert order */
  float *g, *u;     /* (P, ffn) gate (then silu(gate) * up) and up outputs */
  float *ys;        /* (P, dim) down outputs in expert order */
} cpu_moe_buf_t;

static size_t cpu__moe_align(size_t b) { return (b + 63) & ~(size_t)63; }

/* Carves the scratch at base (NULL: only sizes it); returns its bytes. */
static size_t cpu__moe_carve(uint8_t *base, cpu_moe_buf_t *b, int n, int k, int n_exp, int dim, int ffn) {
  const size_t P = (size_t)n * k, F = sizeof(float), I = sizeof(int32_t);
  const size_t bytes[9] = {(size_t)n * n_exp * F, P * I, P * F, (size_t)(n_exp + 1) * I, P * I,
                           P * dim * F, P * ffn * F, P * ffn * F, P * dim * F};
  size_t off[10] = {0};
  for (int i = 0; i < 9; i++) off[i + 1] = off[i] + cpu__moe_align(bytes[i]);
  if (base) {
    b->logits = (float *)(base + off[0]), b->sel = (int32_t *)(base + off[1]), b->w = (float *)(base + off[2]);
    b->start = (int32_t *)(base + off[3]), b->slot = (int32_t *)(base + off[4]), b->xs = (float *)(base + off[5]);
    b->g = (float *)(base + off[6]), b->u = (float *)(base + off[7]), b->ys = (float *)(base + off[8]);
  }
  return off[9];
}

/* Shapes: a router of (n_experts, dim), experts of one (ffn, dim) / (dim, ffn) shape. */
static int cpu__moe_check(const kern_moe_t *m, int n) {
  if (n < 0 || !m || !m->router || !m->gate || !m->up || !m->down || m->n_experts < 1 ||
      m->n_used < 1 || m->n_used > m->n_experts || m->router->rows != m->n_experts)
    return fr_errorf(-EINVAL, "moe_ffn: bad arguments (n %d, %d of %d experts)", n, m ? m->n_used : 0,
                     m ? m->n_experts : 0);
  const int64_t dim = m->router->cols, ffn = m->gate[0].rows;
  for (int e = 0; e < m->n_experts; e++)
    if (m->gate[e].rows != ffn || m->gate[e].cols != dim || m->up[e].rows != ffn || m->up[e].cols != dim ||
        m->down[e].rows != dim || kern_weight_x_cols(&m->down[e]) != ffn)
      return fr_errorf(-EINVAL, "moe_ffn: expert %d is not (%lld, %lld) / (%lld, %lld)", e, (long long)ffn,
                       (long long)dim, (long long)dim, (long long)ffn);
  return 0;
}

/* Softmax over one token's logits in place, as ggml's soft_max (f32
 * exponentials, their sum in double), then the k largest (ties: lower
 * index) and their weights, renormalised when norm. */
static void cpu__moe_route_row(float *p, int n_exp, int k, bool norm, int32_t *sel, float *w) {
  float max = p[0];
  for (int e = 1; e < n_exp; e++) max = fmaxf(max, p[e]);
  double sum = 0.0;
  for (int e = 0; e < n_exp; e++) sum += (double)(p[e] = expf(p[e] - max));
  const float inv = (float)(1.0 / sum);
  for (int e = 0; e < n_exp; e++) p[e] *= inv;
  double wsum = 0.0;
  for (int j = 0; j < k; j++) {
    int best = -1;
    for (int e = 0; e < n_exp; e++) {
      bool taken = false;
      for (int i = 0; i < j && !taken; i++) taken = sel[i] == e;
      if (!taken && (best < 0 || p[e] > p[best])) best = e;
    }
    sel[j] = best;
    w[j] = p[best];
    wsum += w[j];
  }
  if (norm)
    for (int j = 0; j < k; j++) w[j] /= (float)wsum;
}

/* Counting sort of the (token, j) pairs by expert: start[] and slot[]. */
static void cpu__moe_group(cpu_moe_buf_t *b, int n, int k, int n_exp) {
  const int P = n * k;
  memset(b->start, 0, (size_t)(n_exp + 1) * sizeof(int32_t));
  for (int i = 0; i < P; i++) b->start[b->sel[i] + 1]++;
  for (int e = 0; e < n_exp; e++) b->start[e + 1] += b->start[e];
  /* start[e + 1] ends expert e's rows. Shifted down by one it begins them and
   * serves as e's cursor; pairs are taken in order (stable by token), and
   * each cursor ends where its expert's rows end, so start[] is whole again. */
  for (int e = n_exp; e > 0; e--) b->start[e] = b->start[e - 1];
  for (int i = 0; i < P; i++) b->slot[i] = b->start[b->sel[i] + 1]++;
}

/* One expert's rows [r0, r1) of xs through gate, up, silu_mul and down. */
static int cpu__moe_expert(cpu_ctx_t *ctx, const kern_moe_t *m, cpu_moe_buf_t *b, int e, int r0, int r1) {
  const size_t dim = (size_t)m->router->cols, ffn = (size_t)m->gate[e].rows;
  const int rows = r1 - r0;
  float *g = b->g + (size_t)r0 * ffn, *u = b->u + (size_t)r0 * ffn;
  int rc = cpu__matmul(ctx, g, &m->gate[e], NULL, b->xs + (size_t)r0 * dim, rows);
  if (!rc) rc = cpu__matmul(ctx, u, &m->up[e], NULL, b->xs + (size_t)r0 * dim, rows);
  if (!rc) rc = cpu__silu_mul(ctx, g, g, u, rows, (int)ffn, (int)ffn);
  if (!rc) rc = cpu__matmul(ctx, b->ys + (size_t)r0 * dim, &m->down[e], NULL, g, rows);
  return rc;
}

/* out[t] = w[t,0] * y[t,0] + w[t,1] * y[t,1] + ... (llama.cpp's order). */
static void cpu__moe_combine(const cpu_moe_buf_t *b, float *out, int n, int k, size_t dim) {
  for (int t = 0; t < n; t++) {
    float *o = out + (size_t)t * dim;
    for (int j = 0; j < k; j++) {
      const float *y = b->ys + (size_t)b->slot[t * k + j] * dim, w = b->w[t * k + j];
      if (j == 0)
        for (size_t d = 0; d < dim; d++) o[d] = y[d] * w;
      else
        for (size_t d = 0; d < dim; d++) o[d] += y[d] * w;
    }
  }
}

int cpu__moe_ffn(void *vctx, void *out, const void *x, int n, const kern_moe_t *m) {
  cpu_ctx_t *ctx = vctx;
  int rc = cpu__moe_check(m, n);
  if (rc || n == 0) return rc;
  const int k = m->n_used, E = m->n_experts, ffn = (int)m->gate[0].rows;
  const size_t dim = (size_t)m->router->cols;
  cpu_moe_buf_t b = {0};
  cpu__scratch_reserve(&ctx->moe_buf, &ctx->moe_cap, cpu__moe_carve(NULL, &b, n, k, E, (int)dim, ffn));
  cpu__moe_carve(ctx->moe_buf, &b, n, k, E, (int)dim, ffn);
  if ((rc = cpu__matmul(ctx, b.logits, m->router, NULL, x, n))) return rc;
  for (int t = 0; t < n; t++)
    cpu__moe_route_row(b.logits + (size_t)t * E, E, k, m->norm_topk, b.sel + (size_t)t * k, b.w + (size_t)t * k);
  cpu__moe_group(&b, n, k, E);
  for (int i = 0; i < n * k; i++) /* gather: x row of pair i's token into its slot */
    memcpy(b.xs + (size_t)b.slot[i] * dim, (const float *)x + (size_t)(i / k) * dim, dim * sizeof(float));
  for (int e = 0, r0 = 0; e < E; e++) {
    int r1 = b.start[e + 1];
    if (r1 > r0 && (rc = cpu__moe_expert(ctx, m, &b, e, r0, r1))) return rc;
    r0 = r1;
  }
  cpu__moe_combine(&b, out, n, k, dim);
  return 0;
}
