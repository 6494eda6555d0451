/* quant_fp8.c - FP8 E4M3 checkpoint layers (quant.h): the weight and its
 * scales are checked, then decoded into BF16 rows. Formats:
 * docs/QUANTIZED.md, "FP8 checkpoints". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_pool.h"
#include "common/fr_util.h"
#include "kernels/kern_types.h"
#include "model/quant.h"

#define FP8_MAX_DIM (1 << 24) /* rows or columns of one layer */

typedef enum { FP8_PER_TENSOR, FP8_PER_ROW, FP8_PER_BLOCK } fp8_scaling_t;

typedef struct {
  const st_tensor_t *w, *s; /* the E4M3 weight [rows, cols] and its scales */
  char scale_name[24];      /* "weight_scale" or "weight_scale_inv" */
  int64_t rows, cols;
  fp8_scaling_t scaling;
  int64_t br, bc;           /* FP8_PER_BLOCK: a block's rows and columns */
  int64_t scale_cols;       /* FP8_PER_BLOCK: blocks along a row */
} fp8_layer_t;

static int64_t fp8_numel(const st_tensor_t *t) {
  int64_t n = 1;
  for (int d = 0; d < t->n_dims; d++) n *= t->shape[d]; /* fits: the reader checked the byte count */
  return n;
}

static int fp8_weight(const model_st_t *st, const char *base, fp8_layer_t *L) {
  char name[512];
  snprintf(name, sizeof name, "%s.weight", base);
  const st_tensor_t *w = L->w = model_st_tensor(st, name);
  if (!w) return fr_errorf(FR_EFORMAT, "model: tensor %s is missing", name);
  if (strcmp(w->dtype_name, "F8_E4M3"))
    return fr_errorf(FR_EFORMAT, "model: tensor %s has dtype %s, expected F8_E4M3", name, w->dtype_name);
  if (w->n_dims != 2 || w->shape[0] < 1 || w->shape[1] < 1 || w->shape[0] > FP8_MAX_DIM || w->shape[1] > FP8_MAX_DIM)
    return fr_errorf(FR_EFORMAT, "model: tensor %s: an FP8 weight must be a matrix of 1..%d rows and columns", name,
                     FP8_MAX_DIM);
  L->rows = w->shape[0], L->cols = w->shape[1];
  return 0;
}

/* base.weight_scale, else base.weight_scale_inv (the name DeepSeek-V3's
 * and vLLM's block-scaled files use; it multiplies too). */
static int fp8_scale_tensor(const model_st_t *st, const char *base, fp8_layer_t *L) {
  static const char *const names[] = {"weight_scale", "weight_scale_inv"};
  char name[512];
  for (size_t i = 0; i < FR_ARRAY_SIZE(names) && !L->s; i++) {
    snprintf(name, sizeof name, "%s.%s", base, names[i]);
    L->s = model_st_tensor(st, name);
    snprintf(L->scale_name, sizeof L->scale_name, "%s", names[i]);
  }
  if (!L->s) return fr_errorf(FR_EFORMAT, "model: %s.weight is F8_E4M3, but %s.weight_scale (or weight_scale_inv) is "
                              "missing", base, base);
  if (strcmp(L->s->dtype_name, "F32") && strcmp(L->s->dtype_name, "BF16") && strcmp(L->s->dtype_name, "F16"))
    return fr_errorf(FR_EFORMAT, "model: tensor %s has dtype %s, expected F32, BF16 or F16", name, L->s->dtype_name);
  if (L->s->n_dims > 2) return fr_errorf(FR_EFORMAT, "model: tensor %s has %d dims (at most 2)", name, L->s->n_dims);
  return 0;
}

static int64_t fp8_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* The scaling the scale tensor's shape says: one value, one a row ([rows]
 * or [rows, 1]), or one a block of the config's block size. */
static int fp8_scaling(const model_quant_t *q, const char *base, fp8_layer_t *L) {
  const st_tensor_t *s = L->s;
  const int64_t n = fp8_numel(s), d0 = s->n_dims > 0 ? s->shape[0] : 1, d1 = s->n_dims > 1 ? s->shape[1] : 1;
  if (n == 1) {
    L->scaling = FP8_PER_TENSOR;
    return 0;
  }
  if (d0 == L->rows && d1 == 1) {
    L->scaling = FP8_PER_ROW;
    return 0;
  }
  L->br = q->fp8_block[0], L->bc = q->fp8_block[1];
  if (L->br && s->n_dims == 2 && d0 == fp8_ceil_div(L->rows, L->br) && d1 == fp8_ceil_div(L->cols, L->bc)) {
    L->scaling = FP8_PER_BLOCK, L->scale_cols = d1;
    return 0;
  }
  char blocks[96] = "";
  if (L->br)
    snprintf(blocks, sizeof blocks, ", or [%lld, %lld] (blocks of %lld x %lld)",
             (long long)fp8_ceil_div(L->rows, L->br), (long long)fp8_ceil_div(L->cols, L->bc), (long long)L->br,
             (long long)L->bc);
  return fr_errorf(FR_EFORMAT, "model: tensor %s.%s has shape [%lld, %lld]: expected one scale, [%lld, 1] (a row "
                   "each)%s", base, L->scale_name, (long long)d0, (long long)d1, (long long)L->rows, blocks);
}

/* The scales as f32, every one finite; fr_malloc'd. */
static int fp8_scales(const char *base, const fp8_layer_t *L, float **out) {
  const int64_t n = fp8_numel(L->s);
  const kern_type_t t = !strcmp(L->s->dtype_name, "F32") ? KERN_F32 : !strcmp(L->s->dtype_name, "BF16") ? KERN_BF16
                                                                                                        : KERN_F16;
  float *s = *out = fr_malloc((size_t)n * sizeof *s);
  kern_dequantize_row(t, L->s->data, s, n);
  for (int64_t i = 0; i < n; i++)
    if (!isfinite(s[i])) {
      free(s);
      *out = NULL;
      return fr_errorf(FR_EFORMAT, "model: %s.%s[%lld] is %g (a scale must be finite)", base, L->scale_name,
                       (long long)i, (double)s[i]);
    }
  return 0;
}

/* Whether the weight holds a NaN byte (0x7f, 0xff in E4M3): an error
 * naming the first. */
static int fp8_check_nan(const fp8_layer_t *L, const char *base) {
  const uint8_t *q = L->w->data;
  const size_t n = (size_t)(L->rows * L->cols);
  unsigned bad = 0;
  for (size_t i = 0; i < n; i++) bad |= (q[i] & 0x7f) == 0x7f;
  for (size_t i = 0; bad && i < n; i++)
    if ((q[i] & 0x7f) == 0x7f)
      return fr_errorf(FR_EFORMAT, "model: %s.weight[%lld, %lld] is NaN (E4M3 byte 0x%02x)", base,
                       (long long)(i / (size_t)L->cols), (long long)(i % (size_t)L->cols), q[i]);
  return 0;
}

typedef struct {
  const fp8_layer_t *L;
  const float *scales;
  uint16_t *out;
} fp8_job_t;

/* Rows [r0, r1) and columns [c0, c1), which share scale s, into BF16:
 * bf16(e4m3 * s) for each of the 256 bytes once, then a lookup a weight. */
static void fp8_region(const fp8_job_t *j, float s, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  uint16_t tab[256];
  for (int b = 0; b < 256; b++) tab[b] = fr_fp32_to_bf16(kern_fp8_e4m3_to_f32((uint8_t)b) * s);
  const int64_t cols = j->L->cols;
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t *src = (const uint8_t *)j->L->w->data + r * cols;
    uint16_t *dst = j->out + r * cols;
    for (int64_t k = c0; k < c1; k++) dst[k] = tab[src[k]];
  }
}

/* A thread's rows of the weight (fr_pool_fn), region by region. */
static void fp8_rows(void *arg, int ith, int nth) {
  const fp8_job_t *j = arg;
  const fp8_layer_t *L = j->L;
  long r0, r1;
  fr_pool_split((long)L->rows, ith, nth, &r0, &r1);
  if (L->scaling == FP8_PER_TENSOR) {
    fp8_region(j, j->scales[0], r0, r1, 0, L->cols);
    return;
  }
  for (int64_t r = r0; r < r1;) {
    const int64_t end = L->scaling == FP8_PER_ROW ? r + 1 : FR_MIN((r / L->br + 1) * L->br, (int64_t)r1);
    if (L->scaling == FP8_PER_ROW) fp8_region(j, j->scales[r], r, end, 0, L->cols);
    for (int64_t b = 0; L->scaling == FP8_PER_BLOCK && b < L->scale_cols; b++)
      fp8_region(j, j->scales[(r / L->br) * L->scale_cols + b], r, end, b * L->bc, FR_MIN((b + 1) * L->bc, L->cols));
    r = end;
  }
}

int model_quant_fp8_dequant(const model_quant_t *q, const model_st_t *st, const char *base, fr_pool_t *pool,
                            int64_t *rows, int64_t *cols, uint16_t **out) {
  fp8_layer_t L = {0};
  *out = NULL;
  *rows = *cols = 0;
  if (q->method != MODEL_QUANT_FP8)
    return fr_errorf(FR_EFORMAT, "model: tensor %s.weight is F8_E4M3, but the model has no FP8 quantization config "
                     "(quant_method fp8, or compressed-tensors with 8-bit float weights)", base);
  float *scales = NULL;
  int rc = fp8_weight(st, base, &L);
  if (!rc) rc = fp8_scale_tensor(st, base, &L);
  if (!rc) rc = fp8_scaling(q, base, &L);
  if (!rc) rc = fp8_check_nan(&L, base);
  if (!rc) rc = fp8_scales(base, &L, &scales);
  if (rc) return rc;
  fp8_job_t job = {.L = &L, .scales = scales, .out = fr_malloc_aligned((size_t)(L.rows * L.cols) * sizeof *job.out)};
  if (pool) fr_pool_run(pool, fp8_rows, &job);
  else fp8_rows(&job, 0, 1);
  free(scales);
  *rows = L.rows, *cols = L.cols, *out = job.out;
  return 0;
}
