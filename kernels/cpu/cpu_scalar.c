/* cpu_scalar.c - portable kernels: activation quantization and vec_dot for
 * every weight type. The integer sums follow the same structure as the SIMD
 * paths (and ggml's), so all paths agree up to float summation order. */
#include <math.h>
#include <string.h>

#include "common/fr_util.h"
#include "kernels/cpu/cpu.h"

#define F16(x) fr_fp16_to_fp32(x)

/* ---- activation quantization ---- */

/* Q8_0 / Q8_1: d = amax / 127, q = round-half-even(x * 127 / amax), as
 * ggml's AVX2 quantizer (the SIMD paths produce the same bytes). */
static float cpu__quantize_block_q8(const float *x, int8_t *qs, int *sum) {
  float amax = 0.0f;
  for (int j = 0; j < CPU_QK; j++) amax = fmaxf(amax, fabsf(x[j]));
  const float d = amax / 127.f, id = amax != 0.0f ? 127.f / amax : 0.0f;
  int s = 0;
  for (int j = 0; j < CPU_QK; j++) {
    int v = (int)nearbyintf(x[j] * id);
    qs[j] = (int8_t)v;
    s += v;
  }
  *sum = s;
  return d;
}

void cpu__quantize_q8_0_scalar(const float *x, void *vy, int n) {
  cpu_block_q8_0 *y = vy;
  for (int i = 0; i < n / CPU_QK; i++) {
    int sum;
    y[i].d = fr_fp32_to_fp16(cpu__quantize_block_q8(x + i * CPU_QK, y[i].qs, &sum));
  }
}

void cpu__quantize_q8_1_scalar(const float *x, void *vy, int n) {
  cpu_block_q8_1 *y = vy;
  for (int i = 0; i < n / CPU_QK; i++) {
    int sum;
    float d = cpu__quantize_block_q8(x + i * CPU_QK, y[i].qs, &sum);
    y[i].d = fr_fp32_to_fp16(d);
    y[i].s = fr_fp32_to_fp16(d * (float)sum);
  }
}

/* Q8_K (ggml's quantize_row_q8_K_ref): scale by -127/max of the signed
 * extreme, f32 d, bsums of each 16 values. */
void cpu__quantize_q8_K(const float *x, void *vy, int n) {
  cpu_block_q8_K *y = vy;
  for (int i = 0; i < n / CPU_QK_K; i++, x += CPU_QK_K) {
    float max = 0.0f, amax = 0.0f;
    for (int j = 0; j < CPU_QK_K; j++) {
      float ax = fabsf(x[j]);
      if (ax > amax) {
        amax = ax;
        max = x[j];
      }
    }
    if (amax == 0.0f) {
      memset(&y[i], 0, sizeof y[i]);
      continue;
    }
    const float iscale = -127.f / max;
    for (int j = 0; j < CPU_QK_K; j++) {
      /* A NaN (0 * inf) becomes 0, values past the int8 range (a scale
       * that overflowed: subnormal inputs) its ends; in range, the value. */
      const float r = nearbyintf(iscale * x[j]);
      y[i].qs[j] = (int8_t)(r != r ? 0 : r >= 127.f ? 127 : r <= -128.f ? -128 : (int)r);
    }
    for (int j = 0; j < CPU_QK_K / 16; j++) {
      int s = 0;
      for (int l = 0; l < 16; l++) s += y[i].qs[16 * j + l];
      y[i].bsums[j] = (int16_t)s;
    }
    y[i].d = 1 / iscale;
  }
}

/* ---- 32-element block types ---- */

static void cpu__vec_dot_q4_0(int n, float *s, const void *vw, const void *va) {
  const cpu_block_q4_0 *x = vw;
  const cpu_block_q8_0 *y = va;
  float sum = 0.0f;
  for (int i = 0; i < n / CPU_QK; i++) {
    int sumi = 0;
    for (int j = 0; j < 16; j++) {
      sumi += ((x[i].qs[j] & 15) - 8) * y[i].qs[j];
      sumi += ((x[i].qs[j] >> 4) - 8) * y[i].qs[j + 16];
    }
    sum += (F16(x[i].d) * F16(y[i].d)) * (float)sumi;
  }
  *s = sum;
}

static void cpu__vec_dot_q4_1(int n, float *s, const void *vw, const void *va) {
  const cpu_block_q4_1 *x = vw;
  const cpu_block_q8_1 *y = va;
  float sum = 0.0f, summs = 0.0f;
  for (int i = 0; i < n / CPU_QK; i++) {
    int sumi = 0;
    for (int j = 0; j < 16; j++) {
      sumi += (x[i].qs[j] & 15) * y[i].qs[j];
      sumi += (x[i].qs[j] >> 4) * y[i].qs[j + 16];
    }
    summs += F16(x[i].m) * F16(y[i].s);
    sum += (F16(x[i].d) * F16(y[i].d)) * (float)sumi;
  }
  *s = sum + summs;
}

/* I4G against f32 activations: per block d * sum(q x) + m * sum(x). */
static void cpu__vec_dot_i4g(int n, float *s, const void *vw, const void *va) {
  const cpu_block_i4g *x = vw;
  const float *y = va;
  float sum = 0.0f;
  for (int i = 0; i < n / CPU_QK; i++, y += CPU_QK) {
    float sq = 0.0f, sx = 0.0f;
    for (int j = 0; j < 16; j++) {
      sq += (float)(x[i].qs[j] & 15) * y[j] + (float)(x[i].qs[j] >> 4) * y[j + 16];
      sx += y[j] + y[j + 16];
    }
    sum += x[i].d * sq + x[i].m * sx;
  }
  *s = sum;
}

static uint32_t cpu__qh(const uint8_t *qh) {
  uint32_t v;
  memcpy(&v, qh, 4);
  return v;
}

static void cpu__vec_dot_q5_0(int n, float *s, const void *vw, const void *va) {
  const cpu_block_q5_0 *x = vw;
  const cpu_block_q8_0 *y = va;
  float sum = 0.0f;
  for (int i = 0; i < n / CPU_QK; i++) {
    uint32_t qh = cpu__qh(x[i].qh);
    int sumi = 0;
    for (int j = 0; j < 16; j++) {
      int lo = (x[i].qs[j] & 15) | (int)(((qh >> j) & 1) << 4);
      int hi = (x[i].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
      sumi += (lo - 16) * y[i].qs[j] + (hi - 16) * y[i].qs[j + 16];
    }
    sum += (F16(x[i].d) * F16(y[i].d)) * (float)sumi;
  }
  *s = sum;
}

static void cpu__vec_dot_q5_1(int n, float *s, const void *vw, const void *va) {
  const cpu_block_q5_1 *x = vw;
  const cpu_block_q8_1 *y = va;
  float sum = 0.0f, summs = 0.0f;
  for (int i = 0; i < n / CPU_QK; i++) {
    uint32_t qh = cpu__qh(x[i].qh);
    int sumi = 0;
    for (int j = 0; j < 16; j++) {
      int lo = (x[i].qs[j] & 15) | (int)(((qh >> j) & 1) << 4);
      int hi = (x[i].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
      sumi += lo * y[i].qs[j] + hi * y[i].qs[j + 16];
    }
    summs += F16(x[i].m) * F16(y[i].s);
    sum += (F16(x[i].d) * F16(y[i].d)) * (float)sumi;
  }
  *s = sum + summs;
}

static void cpu__vec_dot_q8_0(int n, float *s, const void *vw, const void *va) {
  const cpu_block_q8_0 *x = vw;
  const cpu_block_q8_0 *y = va;
  float sum = 0.0f;
  for (int i = 0; i < n / CPU_QK; i++) {
    int sumi = 0;
    for (int j = 0; j < CPU_QK; j++) sumi += x[i].qs[j] * y[i].qs[j];
    sum += (F16(x[i].d) * F16(y[i].d)) * (float)sumi;
  }
  *s = sum;
}

/* ---- K-quants (dot with Q8_K) ---- */

static void cpu__scale_min_k4(int j, const uint8_t *q, int *d, int *m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

/* Q4_K and Q5_K: sum = d*yd * sum_j sc_j * (q . q8)_j - dmin*yd * sum_j m_j * bsum_j. */
static float cpu__dot_qk_block(const uint16_t dd[2], const uint8_t *scales, const uint8_t *qh, const uint8_t *qs,
                               const cpu_block_q8_K *y) {
  int sumi = 0, summ = 0;
  for (int c = 0; c < 4; c++) {
    int sc0, m0, sc1, m1, s0 = 0, s1 = 0;
    cpu__scale_min_k4(2 * c, scales, &sc0, &m0);
    cpu__scale_min_k4(2 * c + 1, scales, &sc1, &m1);
    const int8_t *q8 = y->qs + 64 * c;
    for (int l = 0; l < 32; l++) {
      int lo = qs[32 * c + l] & 15, hi = qs[32 * c + l] >> 4;
      if (qh) {
        lo += ((qh[l] >> (2 * c)) & 1) << 4;
        hi += ((qh[l] >> (2 * c + 1)) & 1) << 4;
      }
      s0 += lo * q8[l];
      s1 += hi * q8[32 + l];
    }
    sumi += sc0 * s0 + sc1 * s1;
    summ += m0 * (y->bsums[4 * c] + y->bsums[4 * c + 1]) + m1 * (y->bsums[4 * c + 2] + y->bsums[4 * c + 3]);
  }
  return y->d * F16(dd[0]) * (float)sumi - y->d * F16(dd[1]) * (float)summ;
}

static void cpu__vec_dot_q4_K(int n, float *s, const void *vw, const void *va) {
  const cpu_block_q4_K *x = vw;
  const cpu_block_q8_K *y = va;
  float sum = 0.0f;
  for (int i = 0; i < n / CPU_QK_K; i++) {
    uint16_t dd[2] = {x[i].d, x[i].dmin};
    sum += cpu__dot_qk_block(dd, x[i].scales, NULL, x[i].qs, &y[i]);
  }
  *s = sum;
}

static void cpu__vec_dot_q5_K(int n, float *s, const void *vw, const void *va) {
  const cpu_block_q5_K *x = vw;
  const cpu_block_q8_K *y = va;
  float sum = 0.0f;
  for (int i = 0; i < n / CPU_QK_K; i++) {
    uint16_t dd[2] = {x[i].d, x[i].dmin};
    sum += cpu__dot_qk_block(dd, x[i].scales, x[i].qh, x[i].qs, &y[i]);
  }
  *s = sum;
}

static void cpu__vec_dot_q6_K(int n, float *s, const void *vw, const void *va) {
  const cpu_block_q6_K *x = vw;
  const cpu_block_q8_K *y = va;
  float sum = 0.0f;
  for (int i = 0; i < n / CPU_QK_K; i++) {
    int sumi = 0;
    for (int h = 0; h < 2; h++) {
      const uint8_t *ql = x[i].ql + 64 * h, *qh = x[i].qh + 32 * h;
      const int8_t *sc = x[i].scales + 8 * h, *q8 = y[i].qs + 128 * h;
      for (int g = 0; g < 8; g++) { /* 8 groups of 16: element offset 32*(g/2) + 16*(g%2) */
        int part = g / 2, base = 16 * (g % 2), s16 = 0;
        for (int l = base; l < base + 16; l++) {
          int q;
          switch (part) {
          case 0: q = (ql[l] & 15) | ((qh[l] >> 0) & 3) << 4; break;
          case 1: q = (ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4; break;
          case 2: q = (ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4; break;
          default: q = (ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4; break;
          }
          s16 += (q - 32) * q8[32 * part + l];
        }
        sumi += sc[2 * part + g % 2] * s16;
      }
    }
    sum += F16(x[i].d) * y[i].d * (float)sumi;
  }
  *s = sum;
}

/* ---- float types ---- */

static float cpu__dot_f32_scalar(int n, const float *a, const float *b) {
  float s = 0.0f;
  for (int i = 0; i < n; i++) s += a[i] * b[i];
  return s;
}

static float cpu__dot_f16_scalar(int n, const uint16_t *a, const float *b) {
  float s = 0.0f;
  for (int i = 0; i < n; i++) s += F16(a[i]) * b[i];
  return s;
}

float cpu__dot_bf16_scalar(int n, const uint16_t *a, const float *b) {
  float s = 0.0f;
  for (int i = 0; i < n; i++) s += fr_bf16_to_fp32(a[i]) * b[i];
  return s;
}

static void cpu__vec_dot_f32(int n, float *s, const void *w, const void *a) { *s = cpu__dot_f32_scalar(n, w, a); }
static void cpu__vec_dot_f16(int n, float *s, const void *w, const void *a) { *s = cpu__dot_f16_scalar(n, w, a); }
static void cpu__vec_dot_bf16(int n, float *s, const void *w, const void *a) { *s = cpu__dot_bf16_scalar(n, w, a); }

static void cpu__axpy_f32_scalar(int n, float a, const float *x, float *y) {
  for (int i = 0; i < n; i++) y[i] += a * x[i];
}

static void cpu__axpy_f16_scalar(int n, float a, const uint16_t *x, float *y) {
  for (int i = 0; i < n; i++) y[i] += a * F16(x[i]);
}

static float cpu__dot_i8_scalar(int n, const int8_t *a, const float *b) {
  float s = 0.0f;
  for (int i = 0; i < n; i++) s += (float)a[i] * b[i];
  return s;
}

static void cpu__axpy_i8_scalar(int n, float a, const int8_t *x, float *y) {
  for (int i = 0; i < n; i++) y[i] += a * (float)x[i];
}

float cpu__dot_e4m3_scalar(int n, const uint8_t *a, const float *b) {
  float s = 0.0f;
  for (int i = 0; i < n; i++) s += cpu_e4m3_to_f32(a[i]) * b[i];
  return s;
}

void cpu__axpy_e4m3_scalar(int n, float a, const uint8_t *x, float *y) {
  for (int i = 0; i < n; i++) y[i] += a * cpu_e4m3_to_f32(x[i]);
}

static void cpu__silu_mul_scalar(int d, const float *g, const float *u, float *o) {
  for (int k = 0; k < d; k++) o[k] = g[k] / (1.0f + expf(-g[k])) * u[k];
}

static void cpu__exp_shift_scalar(int n, const float *x, float m, float t, float *y) {
  if (t == 1.0f)
    for (int i = 0; i < n; i++) y[i] = expf(x[i] - m);
  else
    for (int i = 0; i < n; i++) y[i] = expf((x[i] - m) / t);
}

const cpu_isa_t cpu_isa_scalar = {
    .name = "scalar",
    .vec_dot =
        {
            [KERN_F32] = cpu__vec_dot_f32,
            [KERN_F16] = cpu__vec_dot_f16,
            [KERN_BF16] = cpu__vec_dot_bf16,
            [KERN_Q4_0] = cpu__vec_dot_q4_0,
            [KERN_Q4_1] = cpu__vec_dot_q4_1,
            [KERN_I4G] = cpu__vec_dot_i4g,
            [KERN_Q5_0] = cpu__vec_dot_q5_0,
            [KERN_Q5_1] = cpu__vec_dot_q5_1,
            [KERN_Q8_0] = cpu__vec_dot_q8_0,
            [KERN_Q4_K] = cpu__vec_dot_q4_K,
            [KERN_Q5_K] = cpu__vec_dot_q5_K,
            [KERN_Q6_K] = cpu__vec_dot_q6_K,
        },
    .quantize =
        {
            [KERN_Q8_0] = cpu__quantize_q8_0_scalar,
            [KERN_Q8_1] = cpu__quantize_q8_1_scalar,
            [KERN_Q8_K] = cpu__quantize_q8_K,
        },
    .dot_f32 = cpu__dot_f32_scalar,
    .dot_f16 = cpu__dot_f16_scalar,
    .axpy_f32 = cpu__axpy_f32_scalar,
    .axpy_f16 = cpu__axpy_f16_scalar,
    .dot_i8 = cpu__dot_i8_scalar,
    .axpy_i8 = cpu__axpy_i8_scalar,
    .dot_e4m3 = cpu__dot_e4m3_scalar,
    .axpy_e4m3 = cpu__axpy_e4m3_scalar,
    .silu_mul = cpu__silu_mul_scalar,
    .exp_shift = cpu__exp_shift_scalar,
};
