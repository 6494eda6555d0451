/* cpu_encoder.c - the CPU backend's ops for encoder models (BERT):
 * layer_norm, gelu and attention_full (bidirectional attention within each
 * sequence of the step, no KV cache). attention_full splits its (token,
 * head) rows over the pool; the others run on the calling thread. */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "kernels/cpu/cpu.h"

#define CPU_ENC_MAX_HEAD_DIM 1024 /* the online softmax's accumulator lives on the stack */

/* As ggml's norm: the mean, then the variance about it, in f32 summed in double. */
int cpu__layer_norm(void *vctx, void *out, const void *x, const kern_weight_t *w, const kern_weight_t *b, int n,
                    int dim, float eps) {
  (void)vctx;
  if (n < 0 || dim <= 0 || w->type != KERN_F32 || b->type != KERN_F32 || w->rows * w->cols != dim ||
      b->rows * b->cols != dim)
    return fr_errorf(-EINVAL, "layer_norm: bad shape (%d, %d) or weights", n, dim);
  const float *g = w->data, *be = b->data;
  for (int r = 0; r < n; r++) {
    const float *xr = (const float *)x + (size_t)r * dim;
    float *o = (float *)out + (size_t)r * dim;
    double s = 0.0, ss = 0.0;
    for (int i = 0; i < dim; i++) s += xr[i];
    const float mean = (float)(s / dim);
    for (int i = 0; i < dim; i++) ss += (double)((xr[i] - mean) * (xr[i] - mean));
    const float scale = 1.0f / sqrtf((float)(ss / dim) + eps);
    for (int i = 0; i < dim; i++) o[i] = (xr[i] - mean) * scale * g[i] + be[i];
  }
  return 0;
}

int cpu__gelu(void *vctx, void *x, size_t n, bool erf_form) {
  (void)vctx;
  float *v = x;
  const float k = 0.7978845608028654f; /* sqrt(2 / pi) */
  for (size_t i = 0; i < n; i++) {
    const float a = v[i];
    v[i] = erf_form ? 0.5f * a * (1.0f + erff(a * 0.70710678118654752f))
                    : 0.5f * a * (1.0f + tanhf(k * (a + 0.044715f * a * a * a)));
  }
  return 0;
}

typedef struct {
  const cpu_ctx_t *ctx;
  float *out;
  const float *q, *k, *v;
  int n_heads, head_dim;
  float scale;
} cpu_enc_att_t;

/* Query row i = token * n_heads + head over every token of its sequence,
 * with an online softmax (one pass, no score buffer). */
static void cpu__enc_att_row(const cpu_enc_att_t *a, int i) {
  const int D = a->n_heads * a->head_dim, t = i / a->n_heads, h = i % a->n_heads, hd = a->head_dim;
  const int s = a->ctx->tok_seq[t];
  float *o = a->out + (size_t)t * D + (size_t)h * hd;
  float acc[CPU_ENC_MAX_HEAD_DIM];
  memset(acc, 0, (size_t)hd * sizeof(float));
  const float *q = a->q + (size_t)t * D + (size_t)h * hd;
  float mx = -INFINITY, sum = 0.0f;
  for (int j = s < 0 ? 0 : a->ctx->q_start[s]; s >= 0 && j < a->ctx->q_start[s + 1]; j++) {
    const float *k = a->k + (size_t)j * D + (size_t)h * hd, *v = a->v + (size_t)j * D + (size_t)h * hd;
    float dot = 0.0f;
    for (int d = 0; d < hd; d++) dot += q[d] * k[d];
    dot *= a->scale;
    if (dot > mx) { /* rescale what came before */
      const float c = expf(mx - dot);
      sum *= c;
      for (int d = 0; d < hd; d++) acc[d] *= c;
      mx = dot;
    }
    const float p = expf(dot - mx);
    sum += p;
    for (int d = 0; d < hd; d++) acc[d] += p * v[d];
  }
  for (int d = 0; d < hd; d++) o[d] = sum > 0.0f ? acc[d] / sum : 0.0f;
}

static void cpu__enc_att_part(void *arg, int ith, int nth) {
  const cpu_enc_att_t *a = arg;
  long lo, hi;
  fr_pool_split((long)a->ctx->n_tokens * a->n_heads, ith, nth, &lo, &hi);
  for (long i = lo; i < hi; i++) cpu__enc_att_row(a, (int)i);
}

int cpu__attention_full(void *vctx, void *out, const void *q, const void *k, const void *v, int n_heads, int head_dim,
                        float scale) {
  cpu_ctx_t *ctx = vctx;
  if (n_heads <= 0 || head_dim <= 0 || head_dim > CPU_ENC_MAX_HEAD_DIM)
    return fr_errorf(-EINVAL, "attention_full: %d heads of %d (at most %d)", n_heads, head_dim, CPU_ENC_MAX_HEAD_DIM);
  cpu_enc_att_t a = {ctx, out, q, k, v, n_heads, head_dim, scale};
  if (ctx->n_threads == 1 || ctx->n_tokens < 2) cpu__enc_att_part(&a, 0, 1);
  else fr_pool_run(ctx->pool, cpu__enc_att_part, &a);
  return 0;
}
