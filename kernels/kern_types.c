/* kern_types.c - type traits, row sizes, the reference dequantizer
 * (ggml's block layouts, ggml-common.h) and KV pool sizes: see kern_types.h. */
#include "kernels/kern_types.h"

#include <math.h>
#include <string.h>
#include <strings.h>

#include "common/fr_util.h"

static const kern_type_traits_t kern__traits[KERN_TYPE_MAX] = {
    [KERN_F32] = {"F32", 1, 4, false},       [KERN_F16] = {"F16", 1, 2, false},
    [KERN_Q4_0] = {"Q4_0", 32, 18, true},    [KERN_Q4_1] = {"Q4_1", 32, 20, true},
    [KERN_Q5_0] = {"Q5_0", 32, 22, true},    [KERN_Q5_1] = {"Q5_1", 32, 24, true},
    [KERN_Q8_0] = {"Q8_0", 32, 34, true},    [KERN_Q8_1] = {"Q8_1", 32, 36, true},
    [KERN_Q4_K] = {"Q4_K", 256, 144, true},  [KERN_Q5_K] = {"Q5_K", 256, 176, true},
    [KERN_Q6_K] = {"Q6_K", 256, 210, true},  [KERN_Q8_K] = {"Q8_K", 256, 292, true},
    [KERN_BF16] = {"BF16", 1, 2, false},     [KERN_I4G] = {"I4G", 32, 24, true},
    [KERN_Q4F] = {"Q4F", 32, 20, true},      [KERN_Q6F] = {"Q6F", 32, 28, true},
    [KERN_Q4G] = {"Q4G", 32, 17, true},      [KERN_F8R] = {"F8R", 1, 1, true},
    [KERN_F8B] = {"F8B", 1, 1, true},
};

const kern_type_traits_t *kern_type_traits(int type) {
  if (type < 0 || type >= KERN_TYPE_MAX || !kern__traits[type].name) return NULL;
  return &kern__traits[type];
}

int kern_type_from_name(const char *name) {
  for (int t = 0; name && t < KERN_TYPE_MAX; t++)
    if (kern__traits[t].name && !strcasecmp(kern__traits[t].name, name)) return t;
  return -1;
}

size_t kern_row_bytes(int type, int64_t n) {
  const kern_type_traits_t *t = kern_type_traits(type);
  if (!t || n < 0 || n % t->blck) return 0;
  size_t out;
  if (fr_mul_size((size_t)(n / t->blck), (size_t)t->size, &out)) return 0;
  return out;
}

static inline float kern__f16(const uint8_t *p) {
  uint16_t h;
  memcpy(&h, p, 2);
  return fr_fp16_to_fp32(h);
}

/* Q4_0 {d; qs[16]}, Q4_1 {d; m; qs[16]}: low nibble = element j, high = j+16. */
static void kern__deq_q4(const uint8_t *b, float *y, bool has_min) {
  float d = kern__f16(b), m = has_min ? kern__f16(b + 2) : 0.0f;
  const uint8_t *qs = b + (has_min ? 4 : 2);
  for (int j = 0; j < 16; j++) {
    int lo = qs[j] & 15, hi = qs[j] >> 4;
    if (has_min) {
      y[j] = d * (float)lo + m;
      y[j + 16] = d * (float)hi + m;
    } else {
      y[j] = d * (float)(lo - 8);
      y[j + 16] = d * (float)(hi - 8);
    }
  }
}

/* Q5_0 {d; qh[4]; qs[16]}, Q5_1 {d; m; qh[4]; qs[16]}. */
static void kern__deq_q5(const uint8_t *b, float *y, bool has_min) {
  float d = kern__f16(b), m = has_min ? kern__f16(b + 2) : 0.0f;
  const uint8_t *p = b + (has_min ? 4 : 2);
  uint32_t qh;
  memcpy(&qh, p, 4);
  const uint8_t *qs = p + 4;
  for (int j = 0; j < 16; j++) {
    int lo = (qs[j] & 15) | (int)(((qh >> j) & 1) << 4);
    int hi = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
    if (has_min) {
      y[j] = d * (float)lo + m;
      y[j + 16] = d * (float)hi + m;
    } else {
      y[j] = d * (float)(lo - 16);
      y[j + 16] = d * (float)(hi - 16);
    }
  }
}

static void kern__deq_q8_0(const uint8_t *b, float *y) {
  float d = kern__f16(b);
  for (int j = 0; j < 32; j++) y[j] = d * (float)(int8_t)b[2 + j];
}

/* 6-bit scale and min of sub-block j of a Q4_K/Q5_K super-block. */
static void kern__scale_min_k4(int j, const uint8_t *s, int *sc, int *m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

/* Q4_K {d; dmin; scales[12]; qs[128]} and Q5_K {d; dmin; scales[12]; qh[32]; qs[128]}. */
static void kern__deq_qk(const uint8_t *b, float *y, bool five) {
  float d = kern__f16(b), dmin = kern__f16(b + 2);
  const uint8_t *scales = b + 4, *qh = b + 16, *qs = b + (five ? 48 : 16);
  for (int c = 0; c < 4; c++) {
    int sc0, m0, sc1, m1;
    kern__scale_min_k4(2 * c, scales, &sc0, &m0);
    kern__scale_min_k4(2 * c + 1, scales, &sc1, &m1);
    float d0 = d * (float)sc0, dm0 = dmin * (float)m0;
    float d1 = d * (float)sc1, dm1 = dmin * (float)m1;
    for (int l = 0; l < 32; l++) {
      int lo = qs[32 * c + l] & 15, hi = qs[32 * c + l] >> 4;
      if (five) {
        lo += ((qh[l] >> (2 * c)) & 1) << 4;
        hi += ((qh[l] >> (2 * c + 1)) & 1) << 4;
      }
      y[64 * c + l] = d0 * (float)lo - dm0;
      y[64 * c + 32 + l] = d1 * (float)hi - dm1;
    }
  }
}

/* Q6_K {ql[128]; qh[64]; int8 scales[16]; d}. */
static void kern__deq_q6_k(const uint8_t *b, float *y) {
  float d = kern__f16(b + 208);
  for (int h = 0; h < 2; h++) {
    const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
    const int8_t *sc = (const int8_t *)(b + 192 + 8 * h);
    float *yh = y + 128 * h;
    for (int l = 0; l < 32; l++) {
      int is = l / 16;
      int q1 = (int)((ql[l] & 15) | ((qh[l] >> 0) & 3) << 4) - 32;
      int q2 = (int)((ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4) - 32;
      int q3 = (int)((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
      int q4 = (int)((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
      yh[l] = d * (float)sc[is] * (float)q1;
      yh[l + 32] = d * (float)sc[is + 2] * (float)q2;
      yh[l + 64] = d * (float)sc[is + 4] * (float)q3;
      yh[l + 96] = d * (float)sc[is + 6] * (float)q4;
    }
  }
}

/* Q8_1 {d; s; qs[32]} and Q8_K {f32 d; qs[256]; bsums[16]} (activation types). */
static void kern__deq_q8_1(const uint8_t *b, float *y) {
  float d = kern__f16(b);
  for (int j = 0; j < 32; j++) y[j] = d * (float)(int8_t)b[4 + j];
}

static void kern__deq_q8_k(const uint8_t *b, float *y) {
  float d;
  memcpy(&d, b, 4);
  for (int j = 0; j < 256; j++) y[j] = d * (float)(int8_t)b[4 + j];
}

/* I4G {f32 d; f32 m; qs[16]}, nibbles as Q4_1. With m = -d * zero (GPTQ,
 * AWQ) both products are exact in f32, so x = d * (q - zero) exactly. */
static void kern__deq_i4g(const uint8_t *b, float *y) {
  float d, m;
  memcpy(&d, b, 4);
  memcpy(&m, b + 4, 4);
  for (int j = 0; j < 16; j++) {
    y[j] = d * (float)(b[8 + j] & 15) + m;
    y[j + 16] = d * (float)(b[8 + j] >> 4) + m;
  }
}

static void kern__deq_block(int type, const uint8_t *b, float *y) {
  switch (type) {
  case KERN_Q4_0: kern__deq_q4(b, y, false); break;
  case KERN_Q4_1: kern__deq_q4(b, y, true); break;
  case KERN_Q5_0: kern__deq_q5(b, y, false); break;
  case KERN_Q5_1: kern__deq_q5(b, y, true); break;
  case KERN_Q8_0: kern__deq_q8_0(b, y); break;
  case KERN_Q8_1: kern__deq_q8_1(b, y); break;
  case KERN_Q4_K: kern__deq_qk(b, y, false); break;
  case KERN_Q5_K: kern__deq_qk(b, y, true); break;
  case KERN_Q6_K: kern__deq_q6_k(b, y); break;
  case KERN_Q8_K: kern__deq_q8_k(b, y); break;
  case KERN_I4G: kern__deq_i4g(b, y); break;
  default: FR_ASSERT(!"unknown quantized type");
  }
}

void kern_dequantize_row(int type, const void *src, float *dst, int64_t n) {
  const kern_type_traits_t *t = kern_type_traits(type);
  FR_ASSERT(t && n % t->blck == 0);
  const uint8_t *p = src;
  switch (type) {
  case KERN_F32: memcpy(dst, src, (size_t)n * 4); return;
  case KERN_F16:
    for (int64_t i = 0; i < n; i++) dst[i] = kern__f16(p + 2 * i);
    return;
  case KERN_BF16:
    for (int64_t i = 0; i < n; i++) {
      uint16_t h;
      memcpy(&h, p + 2 * i, 2);
      dst[i] = fr_bf16_to_fp32(h);
    }
    return;
  default:
    for (int64_t i = 0; i < n / t->blck; i++) kern__deq_block(type, p + i * t->size, dst + i * t->blck);
  }
}

/* Bytes per element of a pool (1 when quantized), 0 for a bad type. */
static size_t kern__kv_elem(const kern_kv_config_t *cfg) {
  if (cfg->dtype == KERN_KV_INT8 || cfg->dtype == KERN_KV_FP8) return 1;
  const kern_type_traits_t *t = cfg->dtype == KERN_KV_AUTO ? kern_type_traits(cfg->type) : NULL;
  return t && !t->quantized ? (size_t)t->size : 0;
}

/* Slots of one KV head in the pool (n_blocks * block_size * n_kv_heads), 0 when bad. */
static size_t kern__kv_head_slots(const kern_kv_config_t *cfg) {
  if (cfg->n_layers <= 0 || cfg->n_kv_heads <= 0 || cfg->head_dim <= 0 || cfg->block_size <= 0 ||
      cfg->n_blocks <= 0 || !kern__kv_elem(cfg))
    return 0;
  size_t n = (size_t)cfg->n_blocks;
  if (fr_mul_size(n, (size_t)cfg->block_size, &n) || fr_mul_size(n, (size_t)cfg->n_kv_heads, &n)) return 0;
  return n;
}

size_t kern_kv_layer_bytes(const kern_kv_config_t *cfg) {
  size_t n = kern__kv_head_slots(cfg), total;
  if (!n || fr_mul_size(n, (size_t)cfg->head_dim * kern__kv_elem(cfg), &total)) return 0;
  return total;
}

size_t kern_kv_scale_bytes(const kern_kv_config_t *cfg) {
  if (cfg->dtype == KERN_KV_AUTO) return 0;
  size_t n = kern__kv_head_slots(cfg), total;
  if (!n || fr_mul_size(n, sizeof(uint16_t), &total)) return 0;
  return total;
}

size_t kern_kv_pool_bytes(const kern_kv_config_t *cfg) {
  size_t per = kern_kv_layer_bytes(cfg), total;
  if (!per || per > SIZE_MAX - kern_kv_scale_bytes(cfg)) return 0;
  per += kern_kv_scale_bytes(cfg);
  if (fr_mul_size(per, 2 * (size_t)cfg->n_layers, &total)) return 0;
  return total;
}

size_t kern_kv_block_bytes(const kern_kv_config_t *cfg) {
  kern_kv_config_t one = *cfg;
  one.n_blocks = 1;
  return kern_kv_pool_bytes(&one);
}

int kern_kv_dtype_parse(const char *name) {
  if (!name) return -1;
  if (!strcasecmp(name, "auto")) return KERN_KV_AUTO;
  if (!strcasecmp(name, "int8")) return KERN_KV_INT8;
  if (!strcasecmp(name, "fp8") || !strcasecmp(name, "fp8_e4m3")) return KERN_KV_FP8;
  return -1;
}

const char *kern_kv_dtype_name(kern_kv_dtype_t d) {
  return d == KERN_KV_INT8 ? "int8" : d == KERN_KV_FP8 ? "fp8" : "auto";
}

float kern_fp8_e4m3_to_f32(uint8_t x) {
  const int e = (x >> 3) & 15, m = x & 7;
  float v;
  if (e == 15 && m == 7) v = NAN;
  else if (e == 0) v = ldexpf((float)m, -9);
  else v = ldexpf(1.0f + (float)m / 8.0f, e - 7);
  return x & 0x80 ? -v : v;
}

uint8_t kern_fp8_e4m3_from_f32(float x) {
  const uint8_t sign = signbit(x) ? 0x80 : 0;
  if (isnan(x)) return sign | 0x7F;
  float a = fabsf(x);
  if (a >= 448.0f) return sign | 0x7E; /* saturate: 448 = 1.75 * 2^8 */
  int ex;
  frexpf(a, &ex); /* a = f * 2^ex, f in [0.5, 1) */
  const int quantum = ex - 1 < -6 ? -9 : ex - 1 - 3; /* exponent of one unit in the last place */
  a = ldexpf(nearbyintf(ldexpf(a, -quantum)), quantum); /* exact: a power-of-two scale; RNE */
  if (a >= 448.0f) return sign | 0x7E;
  if (a < 0x1p-6f) return sign | (uint8_t)(int)ldexpf(a, 9); /* subnormal (or zero) */
  frexpf(a, &ex);
  const int m = (int)ldexpf(ldexpf(a, -(ex - 1)) - 1.0f, 3);
  return sign | (uint8_t)(((ex - 1 + 7) << 3) | m);
}

float kern_fp8_quantize_row(const float *x, int64_t n, uint8_t *q) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; i++) m = fmaxf(m, fabsf(x[i]));
  const float inv = m > 0.0f ? 448.0f / m : 0.0f;
  for (int64_t i = 0; i < n; i++) q[i] = kern_fp8_e4m3_from_f32(x[i] * inv);
  return m / 448.0f;
}

void kern_kv_quantize_row(kern_kv_dtype_t dtype, const float *x, int n, void *q, uint16_t *scale) {
  float amax = 0.0f;
  for (int i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
  const float qmax = dtype == KERN_KV_INT8 ? 127.0f : 448.0f;
  const uint16_t h = fr_fp32_to_fp16(fminf(amax / qmax, 65504.0f));
  const float s = fr_fp16_to_fp32(h), inv = s > 0.0f ? 1.0f / s : 0.0f;
  *scale = h;
  for (int i = 0; i < n; i++) {
    const float v = x[i] * inv;
    if (dtype == KERN_KV_INT8) ((int8_t *)q)[i] = (int8_t)fmaxf(-127.0f, fminf(127.0f, nearbyintf(v)));
    else ((uint8_t *)q)[i] = kern_fp8_e4m3_from_f32(v);
  }
}
