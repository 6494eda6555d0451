/* quant_fp8.c - FP8 E4M3 checkpoint layers (quant.h): the weight and its
 * scales are checked at open; any rectangle of the weight is decoded into
 * BF16 on demand, or packed as it is for a backend that keeps FP8
 * (KERN_F8R, KERN_F8B). Formats: docs/QUANTIZED.md, "FP8 checkpoints". */
#include <errno.h>
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
#define FP8_MAX_PARTS 64      /* threads a read is shared over, at most */

static int64_t fp8_numel(const st_tensor_t *t) {
  int64_t n = 1;
  for (int d = 0; d < t->n_dims; d++) n *= t->shape[d]; /* fits: the reader checked the byte count */
  return n;
}

static int64_t fp8_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

static int fp8_weight(const model_st_t *st, const char *base, model_fp8_layer_t *L) {
  char name[512];
  snprintf(name, sizeof name, "%s.weight", base);
  const st_tensor_t *w = model_st_tensor(st, name);
  if (!w) return fr_errorf(FR_EFORMAT, "model: tensor %s is missing", name);
  if (strcmp(w->dtype_name, "F8_E4M3"))
    return fr_errorf(FR_EFORMAT, "model: tensor %s has dtype %s, expected F8_E4M3", name, w->dtype_name);
  if (w->n_dims != 2 || w->shape[0] < 2 || w->shape[1] < 1 || w->shape[0] > FP8_MAX_DIM || w->shape[1] > FP8_MAX_DIM)
    return fr_errorf(FR_EFORMAT, "model: tensor %s: an FP8 weight must be a matrix of 2..%d rows and 1..%d columns "
                     "(vectors such as norms and biases are F32, F16 or BF16)", name, FP8_MAX_DIM, FP8_MAX_DIM);
  L->bytes = w->data;
  L->rows = w->shape[0], L->cols = w->shape[1];
  return 0;
}

/* base.weight_scale, else base.weight_scale_inv (the name DeepSeek-V3's
 * and vLLM's block-scaled files use; it multiplies too). */
static int fp8_scale_tensor(const model_st_t *st, const char *base, const st_tensor_t **out, const char **sfx) {
  static const char *const names[] = {"weight_scale", "weight_scale_inv"};
  char name[512];
  *out = NULL;
  for (size_t i = 0; i < FR_ARRAY_SIZE(names) && !*out; i++) {
    snprintf(name, sizeof name, "%s.%s", base, names[i]);
    *out = model_st_tensor(st, name);
    *sfx = names[i];
  }
  const st_tensor_t *s = *out;
  if (!s) return fr_errorf(FR_EFORMAT, "model: %s.weight is F8_E4M3, but %s.weight_scale (or weight_scale_inv) is "
                           "missing", base, base);
  if (strcmp(s->dtype_name, "F32") && strcmp(s->dtype_name, "BF16") && strcmp(s->dtype_name, "F16"))
    return fr_errorf(FR_EFORMAT, "model: tensor %s has dtype %s, expected F32, BF16 or F16", name, s->dtype_name);
  if (s->n_dims > 2) return fr_errorf(FR_EFORMAT, "model: tensor %s has %d dims (at most 2)", name, s->n_dims);
  return 0;
}

/* The block of the weight that one scale covers, from the scale tensor's
 * shape: the whole weight (one value), a row ([rows] or [rows, 1]), or the
 * config's block. */
static int fp8_blocks(const model_quant_t *q, const char *base, const char *sfx, const st_tensor_t *s,
                      model_fp8_layer_t *L) {
  const int64_t d0 = s->n_dims > 0 ? s->shape[0] : 1, d1 = s->n_dims > 1 ? s->shape[1] : 1;
  const int64_t br = q->fp8_block[0], bc = q->fp8_block[1];
  L->scale_cols = 1;
  if (fp8_numel(s) == 1) {
    L->block_rows = L->rows, L->block_cols = L->cols;
  } else if (d0 == L->rows && d1 == 1) {
    L->block_rows = 1, L->block_cols = L->cols;
  } else if (br && s->n_dims == 2 && d0 == fp8_ceil_div(L->rows, br) && d1 == fp8_ceil_div(L->cols, bc)) {
    L->block_rows = br, L->block_cols = bc, L->scale_cols = d1;
  } else {
    char blocks[96] = "";
    if (br)
      snprintf(blocks, sizeof blocks, ", or [%lld, %lld] (blocks of %lld x %lld)",
               (long long)fp8_ceil_div(L->rows, br), (long long)fp8_ceil_div(L->cols, bc), (long long)br,
               (long long)bc);
    return fr_errorf(FR_EFORMAT, "model: tensor %s.%s has shape [%lld, %lld]: expected one scale, [%lld, 1] (a row "
                     "each)%s", base, sfx, (long long)d0, (long long)d1, (long long)L->rows, blocks);
  }
  return 0;
}

/* The scales as f32, every one finite. */
static int fp8_scales(const char *base, const char *sfx, const st_tensor_t *s, model_fp8_layer_t *L) {
  const int64_t n = fp8_numel(s);
  const kern_type_t t = !strcmp(s->dtype_name, "F32") ? KERN_F32 : !strcmp(s->dtype_name, "BF16") ? KERN_BF16
                                                                                                 : KERN_F16;
  L->scales = fr_malloc((size_t)n * sizeof *L->scales);
  kern_dequantize_row(t, s->data, L->scales, n);
  for (int64_t i = 0; i < n; i++)
    if (!isfinite(L->scales[i]))
      return fr_errorf(FR_EFORMAT, "model: %s.%s[%lld] is %g (a scale must be finite)", base, sfx, (long long)i,
                       (double)L->scales[i]);
  return 0;
}

int model_quant_fp8_open(const model_quant_t *q, const model_st_t *st, const char *base, model_fp8_layer_t *out) {
  memset(out, 0, sizeof *out);
  if (q->method != MODEL_QUANT_FP8)
    return fr_errorf(FR_EFORMAT, "model: tensor %s.weight is F8_E4M3, but the model has no FP8 quantization config "
                     "(quant_method fp8, or compressed-tensors with 8-bit float weights)", base);
  const st_tensor_t *s;
  const char *sfx;
  int rc = fp8_weight(st, base, out);
  if (!rc) rc = fp8_scale_tensor(st, base, &s, &sfx);
  if (!rc) rc = fp8_blocks(q, base, sfx, s, out);
  if (!rc) rc = fp8_scales(base, sfx, s, out);
  if (rc) {
    model_quant_fp8_close(out);
    return rc;
  }
  out->base = fr_strdup(base);
  return 0;
}

void model_quant_fp8_close(model_fp8_layer_t *l) {
  free(l->scales);
  free(l->base);
  memset(l, 0, sizeof *l);
}

typedef struct {
  const model_fp8_layer_t *L;
  int64_t r0, nr, c0, nc;
  uint16_t *dst;                  /* decoded BF16 (model_quant_fp8_read), or NULL */
  uint8_t *q;                     /* else the bytes as they are (model_quant_fp8_pack) */
  int64_t nan_row[FP8_MAX_PARTS]; /* a part's first row holding a NaN byte, or -1 */
} fp8_read_t;

/* Rows [r0, r1) and columns [c0, c1) of the weight, under one scale s, into
 * the read's dst: bf16(e4m3 * s) for each of the 256 bytes once, then a
 * lookup a weight. */
static void fp8_region(const fp8_read_t *j, float s, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  uint16_t tab[256];
  for (int b = 0; b < 256; b++) tab[b] = fr_fp32_to_bf16(kern_fp8_e4m3_to_f32((uint8_t)b) * s);
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t *src = j->L->bytes + r * j->L->cols;
    uint16_t *dst = j->dst + (r - j->r0) * j->nc - j->c0;
    for (int64_t k = c0; k < c1; k++) dst[k] = tab[src[k]];
  }
}

/* Whether row r holds a NaN byte (0x7f, 0xff in E4M3) in the read's columns. */
static bool fp8_row_nan(const fp8_read_t *j, int64_t r) {
  const uint8_t *src = j->L->bytes + r * j->L->cols;
  unsigned bad = 0;
  for (int64_t k = j->c0; k < j->c0 + j->nc; k++) bad |= (src[k] & 0x7f) == 0x7f;
  return bad;
}

/* A part's rows of the read (fr_pool_fn), one scale's block at a time. */
static void fp8_read_part(void *arg, int ith, int nth) {
  fp8_read_t *j = arg;
  const model_fp8_layer_t *L = j->L;
  long lo, hi;
  fr_pool_split((long)j->nr, ith, nth, &lo, &hi);
  const int64_t r1 = j->r0 + hi, k1 = j->c0 + j->nc;
  for (int64_t r = j->r0 + lo; r < r1 && j->nan_row[ith] < 0; r++)
    if (fp8_row_nan(j, r)) j->nan_row[ith] = r;
  if (j->nan_row[ith] >= 0) return;
  for (int64_t r = j->r0 + lo; j->q && r < r1; r++)
    memcpy(j->q + (r - j->r0) * j->nc, L->bytes + r * L->cols + j->c0, (size_t)j->nc);
  for (int64_t r = j->r0 + lo; j->dst && r < r1;) {
    const int64_t br = r / L->block_rows, end = FR_MIN((br + 1) * L->block_rows, r1);
    for (int64_t bc = j->c0 / L->block_cols; bc * L->block_cols < k1; bc++)
      fp8_region(j, L->scales[br * L->scale_cols + bc], r, end, FR_MAX(bc * L->block_cols, j->c0),
                 FR_MIN((bc + 1) * L->block_cols, k1));
    r = end;
  }
}

static int fp8_check_range(const model_fp8_layer_t *l, int64_t r0, int64_t nr, int64_t c0, int64_t nc) {
  if (r0 < 0 || nr <= 0 || r0 + nr > l->rows || c0 < 0 || nc <= 0 || c0 + nc > l->cols)
    return fr_errorf(-EINVAL, "model: rows [%lld, %lld) and columns [%lld, %lld) of %s.weight (%lld x %lld)",
                     (long long)r0, (long long)(r0 + nr), (long long)c0, (long long)(c0 + nc), l->base,
                     (long long)l->rows, (long long)l->cols);
  return 0;
}

/* Runs read j (set up, nan_row aside) over pool's threads; its NaN bytes,
 * if any, as the error. Frees j. */
static int fp8_run(fp8_read_t *j, fr_pool_t *pool) {
  const model_fp8_layer_t *l = j->L;
  const int64_t c0 = j->c0, nc = j->nc;
  const int parts = pool ? FR_MIN(fr_pool_size(pool), FP8_MAX_PARTS) : 1;
  for (int i = 0; i < FP8_MAX_PARTS; i++) j->nan_row[i] = -1;
  if (parts > 1 && parts == fr_pool_size(pool)) fr_pool_run(pool, fp8_read_part, j);
  else fp8_read_part(j, 0, 1);
  int rc = 0;
  for (int i = 0; i < parts && !rc; i++) {
    const int64_t r = j->nan_row[i];
    for (int64_t k = c0; r >= 0 && k < c0 + nc && !rc; k++) {
      const uint8_t b = l->bytes[r * l->cols + k];
      if ((b & 0x7f) == 0x7f)
        rc = fr_errorf(FR_EFORMAT, "model: %s.weight[%lld, %lld] is NaN (E4M3 byte 0x%02x)", l->base, (long long)r,
                       (long long)k, b);
    }
  }
  free(j);
  return rc;
}

int model_quant_fp8_read(const model_fp8_layer_t *l, int64_t r0, int64_t nr, int64_t c0, int64_t nc, fr_pool_t *pool,
                         uint16_t *dst) {
  int rc = fp8_check_range(l, r0, nr, c0, nc);
  if (rc) return rc;
  fp8_read_t *j = fr_malloc(sizeof *j);
  *j = (fp8_read_t){.L = l, .r0 = r0, .nr = nr, .c0 = c0, .nc = nc, .dst = dst};
  return fp8_run(j, pool);
}

kern_type_t model_quant_fp8_form(const model_fp8_layer_t *l, int64_t r0, int64_t nr, int64_t c0, int64_t nc) {
  if (l->scale_cols == 1) return KERN_F8R;
  const int64_t b = 128;
  if (l->block_rows == b && l->block_cols == b && r0 % b == 0 && nr % b == 0 && c0 % b == 0 && nc % b == 0)
    return KERN_F8B;
  return KERN_BF16;
}

int model_quant_fp8_pack(const model_fp8_layer_t *l, kern_type_t form, int64_t r0, int64_t nr, int64_t c0, int64_t nc,
                         fr_pool_t *pool, uint8_t *q, float *scales) {
  int rc = fp8_check_range(l, r0, nr, c0, nc);
  if (rc) return rc;
  if (form == KERN_BF16 || form != model_quant_fp8_form(l, r0, nr, c0, nc))
    return fr_errorf(-EINVAL, "model: %s.weight cannot be packed as %s", l->base,
                     kern_type_traits(form) ? kern_type_traits(form)->name : "?");
  if (form == KERN_F8R) {
    for (int64_t r = 0; r < nr; r++) scales[r] = l->scales[(r0 + r) / l->block_rows];
  } else {
    const int64_t sc = kern_f8b_scale_cols(nc);
    memset(scales, 0, kern_f8_scale_bytes(KERN_F8B, nr, nc));
    for (int64_t i = 0; i < nr / 128; i++)
      for (int64_t k = 0; k < nc / 128; k++)
        scales[i * sc + k] = l->scales[(r0 / 128 + i) * l->scale_cols + c0 / 128 + k];
  }
  fp8_read_t *j = fr_malloc(sizeof *j);
  *j = (fp8_read_t){.L = l, .r0 = r0, .nr = nr, .c0 = c0, .nc = nc, .q = q};
  return fp8_run(j, pool);
}
