/* cpu_x86_impl.h - AVX2 kernels (ggml's vec_dot structure: maddubs/madd
 * integer dots per block, one f32 FMA per block). Included by cpu_avx2.c
 * (-mavx2 -mfma -mf16c) and cpu_x512_impl.h (which overrides some slots);
 * everything here is static, so each translation unit gets its own copy
 * compiled for its flags. */
#pragma once

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "common/fr_util.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/cpu_x86_exp.h"

#define X86_F16(x) _cvtsh_ss(x) /* F16C */
/* The K-quant block dots: inlined into every loop that calls them, so the
 * unpacked values stay in registers (gcc kept them out of line and spilled). */
#define X86_INLINE static inline __attribute__((always_inline))

static inline float x86__hsum_f32_8(__m256 x) {
  __m128 r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

static inline int x86__hsum_i32_8(__m256i a) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
  return _mm_cvtsi128_si32(s);
}

/* 16 bytes of nibbles -> 32 bytes: low nibbles (elements 0..15) then high (16..31). */
static inline __m256i x86__bytes_from_nibbles_32(const uint8_t *p) {
  const __m128i tmp = _mm_loadu_si128((const __m128i *)p);
  const __m256i bytes = _mm256_insertf128_si256(_mm256_castsi128_si256(tmp), _mm_srli_epi16(tmp, 4), 1);
  return _mm256_and_si256(_mm256_set1_epi8(0xF), bytes);
}

/* 32 bits -> 32 bytes of 0xFF (bit set) or 0x00. */
static inline __m256i x86__bytes_from_bits_32(const uint8_t *p) {
  uint32_t x32;
  memcpy(&x32, p, 4);
  const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
  __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x32), shuf);
  bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
  return _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1));
}

/* Sum of unsigned(ax) * signed(sy) in pairs -> 8 floats. */
static inline __m256 x86__mul_sum_us8_pairs_float(__m256i ax, __m256i sy) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), ax, sy)); /* same sums: see cpu_x512_impl.h */
#else
  const __m256i dot = _mm256_maddubs_epi16(ax, sy);
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_set1_epi16(1), dot));
#endif
}

static inline __m256 x86__mul_sum_i8_pairs_float(__m256i x, __m256i y) {
  return x86__mul_sum_us8_pairs_float(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

/* ---- activation quantization (ggml's AVX2 quantize_row_q8_0/q8_1) ---- */

/* Quantizes 32 floats; returns d and stores the packed bytes and the sum. */
static inline float x86__quantize_block_q8(const float *x, int8_t *qs, int *sum) {
  __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
  __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 m = _mm256_andnot_ps(sign, v0);
  m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v1));
  m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v2));
  m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v3));
  __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const float amax = _mm_cvtss_f32(m4);
  const float d = amax / 127.f, id = amax != 0.0f ? 127.f / amax : 0.0f;
  const __m256 mul = _mm256_set1_ps(id);
  __m256i i0 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v0, mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  __m256i i1 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v1, mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  __m256i i2 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v2, mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  __m256i i3 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v3, mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  *sum = x86__hsum_i32_8(_mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3)));
  i0 = _mm256_packs_epi32(i0, i1);
  i2 = _mm256_packs_epi32(i2, i3);
  i0 = _mm256_packs_epi16(i0, i2);
  i0 = _mm256_permutevar8x32_epi32(i0, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256((__m256i *)qs, i0);
  return d;
}

static inline void x86__quantize_q8_0(const float *x, void *vy, int n) {
  cpu_block_q8_0 *y = vy;
  for (int i = 0; i < n / CPU_QK; i++) {
    int sum;
    y[i].d = fr_fp32_to_fp16(x86__quantize_block_q8(x + i * CPU_QK, y[i].qs, &sum));
  }
}

static inline void x86__quantize_q8_1(const float *x, void *vy, int n) {
  cpu_block_q8_1 *y = vy;
  for (int i = 0; i < n / CPU_QK; i++) {
    int sum;
    float d = x86__quantize_block_q8(x + i * CPU_QK, y[i].qs, &sum);
    y[i].d = fr_fp32_to_fp16(d);
    y[i].s = fr_fp32_to_fp16(d * (float)sum);
  }
}

/* cpu__quantize_q8_K's bits, 8 lanes at a time: the first element of the
 * largest magnitude gives the scale (NaN ignored, as its ax > amax is);
 * round half to even as nearbyintf; NaN products 0, the rest clamped to
 * [-128, 127]. */
static inline void x86__quantize_q8_K(const float *x, void *vy, int n) {
  cpu_block_q8_K *y = vy;
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int i = 0; i < n / CPU_QK_K; i++, x += CPU_QK_K) {
    __m256 m = _mm256_setzero_ps();
    for (int j = 0; j < CPU_QK_K; j += 8) m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)), m);
    __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    if (amax == 0.0f) {
      memset(&y[i], 0, sizeof y[i]);
      continue;
    }
    int first = 0;
    const __m256 am = _mm256_set1_ps(amax);
    for (int j = 0; j < CPU_QK_K; j += 8) {
      const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)), am, _CMP_EQ_OQ));
      if (hit) {
        first = j + __builtin_ctz((unsigned)hit);
        break;
      }
    }
    const float iscale = -127.f / x[first];
    const __m256 mul = _mm256_set1_ps(iscale);
    const __m256 lo = _mm256_set1_ps(-128.f), hi = _mm256_set1_ps(127.f);
    for (int j = 0; j < CPU_QK_K; j += 32) {
      __m256i q[4];
      for (int k = 0; k < 4; k++) {
        __m256 r = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + j + 8 * k), mul),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        r = _mm256_and_ps(r, _mm256_cmp_ps(r, r, _CMP_ORD_Q)); /* NaN -> 0 */
        q[k] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi));
      }
      /* bsums: the two 16-element halves of these 32 */
      y[i].bsums[j / 16] = (int16_t)x86__hsum_i32_8(_mm256_add_epi32(q[0], q[1]));
      y[i].bsums[j / 16 + 1] = (int16_t)x86__hsum_i32_8(_mm256_add_epi32(q[2], q[3]));
      __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
      b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      _mm256_storeu_si256((__m256i *)(y[i].qs + j), b);
    }
    y[i].d = 1 / iscale;
  }
}

/* ---- 32-element block types ---- */

static inline void x86__vec_dot_q4_0(int n, float *s, const void *vw, const void *va) {
  const cpu_block_q4_0 *x = vw;
  const cpu_block_q8_0 *y = va;
  __m256 acc = _mm256_setzero_ps();
  for (int i = 0; i < n / CPU_QK; i++) {
    const __m256 d = _mm256_set1_ps(X86_F16(x[i].d) * X86_F16(y[i].d));
    __m256i qx = _mm256_sub_epi8(x86__bytes_from_nibbles_32(x[i].qs), _mm256_set1_epi8(8));
    __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
    acc = _mm256_fmadd_ps(d, x86__mul_sum_i8_pairs_float(qx, qy), acc);
  }
  *s = x86__hsum_f32_8(acc);
}

/* Two adjacent f16 fields (d, m) or (d, s) -> floats in lanes 0 and 1. */
static inline __m128 x86__f16x2(const void *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return _mm_cvtph_ps(_mm_cvtsi32_si128((int)v));
}

/* ggml's Q4_1 x Q8_1 dot. The scale pairs are converted two at a time:
 * lane 0 = x.d * y.d, lane 1 = x.m * y.s (same products as ggml). */
static inline void x86__vec_dot_q4_1(int n, float *s, const void *vw, const void *va) {
  const cpu_block_q4_1 *x = vw;
  const cpu_block_q8_1 *y = va;
  __m256 acc = _mm256_setzero_ps();
  __m128 summs = _mm_setzero_ps();
  for (int i = 0; i < n / CPU_QK; i++) {
    const __m128 p = _mm_mul_ps(x86__f16x2(&x[i].d), x86__f16x2(&y[i].d));
    summs = _mm_add_ss(summs, _mm_movehdup_ps(p));
    const __m256 d = _mm256_broadcastss_ps(p);
    const __m256i qx = x86__bytes_from_nibbles_32(x[i].qs);
    const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
    acc = _mm256_fmadd_ps(d, x86__mul_sum_us8_pairs_float(qx, qy), acc);
  }
  *s = x86__hsum_f32_8(acc) + _mm_cvtss_f32(summs);
}

/* I4G (f32 activations): the block's 32 nibbles as 4 vectors of 8 floats
 * (elements 0-7, 8-15, 16-23, 24-31). */
static inline void x86__i4g_unpack(const uint8_t *qs, __m256 q[4]) {
  const __m128i b = _mm_loadu_si128((const __m128i *)qs), m = _mm_set1_epi8(15);
  const __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
  q[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
  q[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
  q[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
  q[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
}

/* acc += d * sum(q y), accm += m * sum(y) over one block of y. */
#define X86__I4G_ROW(y, acc, accm)                                                                  \
  do {                                                                                              \
    const __m256 v0 = _mm256_loadu_ps(y), v1 = _mm256_loadu_ps(y + 8), v2 = _mm256_loadu_ps(y + 16), \
                 v3 = _mm256_loadu_ps(y + 24);                                                      \
    __m256 sq = _mm256_mul_ps(q[0], v0);                                                            \
    sq = _mm256_fmadd_ps(q[1], v1, sq);                                                             \
    sq = _mm256_fmadd_ps(q[2], v2, sq);                                                             \
    sq = _mm256_fmadd_ps(q[3], v3, sq);                                                             \
    const __m256 sx = _mm256_add_ps(_mm256_add_ps(v0, v1), _mm256_add_ps(v2, v3));                  \
    acc = _mm256_fmadd_ps(d, sq, acc);                                                              \
    accm = _mm256_fmadd_ps(m, sx, accm);                                                            \
  } while (0)

static inline void x86__vec_dot_i4g(int n, float *s, const void *vw, const void *va) {
  const cpu_block_i4g *x = vw;
  const float *y = va;
  __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps(), q[4];
  for (int i = 0; i < n / CPU_QK; i++, y += CPU_QK) {
    const __m256 d = _mm256_set1_ps(x[i].d), m = _mm256_set1_ps(x[i].m);
    x86__i4g_unpack(x[i].qs, q);
    X86__I4G_ROW(y, acc, accm);
  }
  *s = x86__hsum_f32_8(_mm256_add_ps(acc, accm));
}

/* Prefill form: the block is unpacked once for 4 activation rows. */
static inline void x86__vec_dot_x4_i4g(int n, float *s, const void *vw, const void *va, size_t a_stride) {
  const cpu_block_i4g *x = vw;
  const float *p0 = va, *p1 = (const float *)((const uint8_t *)va + a_stride),
              *p2 = (const float *)((const uint8_t *)va + 2 * a_stride),
              *p3 = (const float *)((const uint8_t *)va + 3 * a_stride);
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, m0 = a0, m1 = a0, m2 = a0, m3 = a0, q[4];
  for (int i = 0; i < n / CPU_QK; i++) {
    const __m256 d = _mm256_set1_ps(x[i].d), m = _mm256_set1_ps(x[i].m);
    const int o = i * CPU_QK;
    x86__i4g_unpack(x[i].qs, q);
    X86__I4G_ROW(p0 + o, a0, m0);
    X86__I4G_ROW(p1 + o, a1, m1);
    X86__I4G_ROW(p2 + o, a2, m2);
    X86__I4G_ROW(p3 + o, a3, m3);
  }
  s[0] = x86__hsum_f32_8(_mm256_add_ps(a0, m0));
  s[1] = x86__hsum_f32_8(_mm256_add_ps(a1, m1));
  s[2] = x86__hsum_f32_8(_mm256_add_ps(a2, m2));
  s[3] = x86__hsum_f32_8(_mm256_add_ps(a3, m3));
}

/* Prefill forms: one weight row against 4 activation rows (a, a + a_stride,
 * ...). The weight block is unpacked once; each row's sums and float
 * operations are those of the single-row kernel, so results are identical. */
#define X86__Q4_1_X4_ROW(k)                                                                        \
  do {                                                                                             \
    const __m128 p = _mm_mul_ps(xdm, x86__f16x2(&y##k[i].d));                                      \
    sm##k = _mm_add_ss(sm##k, _mm_movehdup_ps(p));                                                 \
    const __m256i qy = _mm256_loadu_si256((const __m256i *)y##k[i].qs);                            \
    acc##k = _mm256_fmadd_ps(_mm256_broadcastss_ps(p), x86__mul_sum_us8_pairs_float(qx, qy), acc##k); \
  } while (0)

static inline void x86__vec_dot_x4_q4_1(int n, float *s, const void *vw, const void *va, size_t a_stride) {
  const cpu_block_q4_1 *x = vw;
  const cpu_block_q8_1 *y0 = va, *y1 = (const void *)((const uint8_t *)va + a_stride),
                       *y2 = (const void *)((const uint8_t *)va + 2 * a_stride),
                       *y3 = (const void *)((const uint8_t *)va + 3 * a_stride);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps(),
         acc3 = _mm256_setzero_ps();
  __m128 sm0 = _mm_setzero_ps(), sm1 = _mm_setzero_ps(), sm2 = _mm_setzero_ps(), sm3 = _mm_setzero_ps();
  for (int i = 0; i < n / CPU_QK; i++) {
    const __m128 xdm = x86__f16x2(&x[i].d);
    const __m256i qx = x86__bytes_from_nibbles_32(x[i].qs);
    X86__Q4_1_X4_ROW(0);
    X86__Q4_1_X4_ROW(1);
    X86__Q4_1_X4_ROW(2);
    X86__Q4_1_X4_ROW(3);
  }
  s[0] = x86__hsum_f32_8(acc0) + _mm_cvtss_f32(sm0);
  s[1] = x86__hsum_f32_8(acc1) + _mm_cvtss_f32(sm1);
  s[2] = x86__hsum_f32_8(acc2) + _mm_cvtss_f32(sm2);
  s[3] = x86__hsum_f32_8(acc3) + _mm_cvtss_f32(sm3);
}

/* Batched-decode form: 2 weight rows (w, w + w_stride) against 4 activation
 * rows, s[k * 4 + j] for weight row k and activation row j. Per block, the
 * 4 activation rows' (d, s) pairs are converted in one go and multiplied by
 * each weight row's (d, m) in one 256-bit product: lanes 2j and 2j + 1 are
 * the 1-row form's x.d * y.d and x.m * y.s for row j. The odd lanes of
 * summs[k] add up row k's min terms, lane by lane in block order. So every
 * (k, j) sums as x86__vec_dot_q4_1 does, bit for bit, and each activation
 * block is loaded once for both weight rows. */
#define X86__Q4_1_2X4_DOT(k, j)                                                                     \
  acc##k##j = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(p##k, _mm256_set1_epi32(2 * (j))),            \
                              x86__mul_sum_us8_pairs_float(qx##k, qy##j), acc##k##j)

static inline void x86__vec_dot_2x4_q4_1(int n, float *s, const void *vw, size_t w_stride, const void *va,
                                         size_t a_stride) {
  const cpu_block_q4_1 *x0 = vw, *x1 = (const void *)((const uint8_t *)vw + w_stride);
  const cpu_block_q8_1 *y0 = va, *y1 = (const void *)((const uint8_t *)va + a_stride),
                       *y2 = (const void *)((const uint8_t *)va + 2 * a_stride),
                       *y3 = (const void *)((const uint8_t *)va + 3 * a_stride);
  __m256 acc00 = _mm256_setzero_ps(), acc01 = acc00, acc02 = acc00, acc03 = acc00, acc10 = acc00, acc11 = acc00,
         acc12 = acc00, acc13 = acc00, summs0 = acc00, summs1 = acc00;
  for (int i = 0; i < n / CPU_QK; i++) {
    uint32_t yds[4], xdm[2];
    memcpy(&yds[0], &y0[i].d, 4), memcpy(&yds[1], &y1[i].d, 4);
    memcpy(&yds[2], &y2[i].d, 4), memcpy(&yds[3], &y3[i].d, 4);
    memcpy(&xdm[0], &x0[i].d, 4), memcpy(&xdm[1], &x1[i].d, 4);
    const __m256 y = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)yds));
    const __m256 p0 = _mm256_mul_ps(_mm256_cvtph_ps(_mm_set1_epi32((int)xdm[0])), y);
    const __m256 p1 = _mm256_mul_ps(_mm256_cvtph_ps(_mm_set1_epi32((int)xdm[1])), y);
    summs0 = _mm256_add_ps(summs0, p0);
    summs1 = _mm256_add_ps(summs1, p1);
    const __m256i qx0 = x86__bytes_from_nibbles_32(x0[i].qs), qx1 = x86__bytes_from_nibbles_32(x1[i].qs);
    const __m256i qy0 = _mm256_loadu_si256((const __m256i *)y0[i].qs);
    const __m256i qy1 = _mm256_loadu_si256((const __m256i *)y1[i].qs);
    const __m256i qy2 = _mm256_loadu_si256((const __m256i *)y2[i].qs);
    const __m256i qy3 = _mm256_loadu_si256((const __m256i *)y3[i].qs);
    X86__Q4_1_2X4_DOT(0, 0);
    X86__Q4_1_2X4_DOT(0, 1);
    X86__Q4_1_2X4_DOT(0, 2);
    X86__Q4_1_2X4_DOT(0, 3);
    X86__Q4_1_2X4_DOT(1, 0);
    X86__Q4_1_2X4_DOT(1, 1);
    X86__Q4_1_2X4_DOT(1, 2);
    X86__Q4_1_2X4_DOT(1, 3);
  }
  float m[16];
  _mm256_storeu_ps(m, summs0);
  _mm256_storeu_ps(m + 8, summs1);
  const __m256 acc[8] = {acc00, acc01, acc02, acc03, acc10, acc11, acc12, acc13};
  for (int k = 0; k < 8; k++) s[k] = x86__hsum_f32_8(acc[k]) + m[2 * k + 1];
}

#define X86__Q8_0_X4_ROW(k)                                                                            \
  do {                                                                                                 \
    const __m256 d = _mm256_set1_ps(xd * X86_F16(y##k[i].d));                                          \
    const __m256i sy = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)y##k[i].qs), qx);          \
    acc##k = _mm256_fmadd_ps(d, x86__mul_sum_us8_pairs_float(ax, sy), acc##k);                         \
  } while (0)

/* A Q5_0 block's values, q5 - 16, as 32 signed bytes. */
static inline __m256i x86__q5_0_bytes(const cpu_block_q5_0 *b) {
  const __m256i hi = _mm256_andnot_si256(x86__bytes_from_bits_32(b->qh), _mm256_set1_epi8((char)0xF0));
  return _mm256_or_si256(x86__bytes_from_nibbles_32(b->qs), hi);
}

static inline void x86__vec_dot_q5_0(int n, float *s, const void *vw, const void *va) {
  const cpu_block_q5_0 *x = vw;
  const cpu_block_q8_0 *y = va;
  __m256 acc = _mm256_setzero_ps();
  for (int i = 0; i < n / CPU_QK; i++) {
    const __m256 d = _mm256_set1_ps(X86_F16(x[i].d) * X86_F16(y[i].d));
    __m256i qx = x86__q5_0_bytes(&x[i]);
    __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
    acc = _mm256_fmadd_ps(d, x86__mul_sum_i8_pairs_float(qx, qy), acc);
  }
  *s = x86__hsum_f32_8(acc);
}

/* Prefill form of the Q8_0 (q5: Q5_0) dot: the weight block unpacked once
 * for 4 activation rows, each row's arithmetic the 1-row form's (its sign
 * trick spelled out). */
static inline void x86__dot_x4_w8(int n, float *s, const void *vw, const void *va, size_t a_stride, bool q5) {
  const cpu_block_q8_0 *y0 = va, *y1 = (const void *)((const uint8_t *)va + a_stride),
                       *y2 = (const void *)((const uint8_t *)va + 2 * a_stride),
                       *y3 = (const void *)((const uint8_t *)va + 3 * a_stride);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps(),
         acc3 = _mm256_setzero_ps();
  for (int i = 0; i < n / CPU_QK; i++) {
    const cpu_block_q5_0 *x5 = (const cpu_block_q5_0 *)vw + i;
    const cpu_block_q8_0 *x8 = (const cpu_block_q8_0 *)vw + i;
    const float xd = X86_F16(q5 ? x5->d : x8->d);
    const __m256i qx = q5 ? x86__q5_0_bytes(x5) : _mm256_loadu_si256((const __m256i *)x8->qs);
    const __m256i ax = _mm256_sign_epi8(qx, qx);
    X86__Q8_0_X4_ROW(0);
    X86__Q8_0_X4_ROW(1);
    X86__Q8_0_X4_ROW(2);
    X86__Q8_0_X4_ROW(3);
  }
  s[0] = x86__hsum_f32_8(acc0);
  s[1] = x86__hsum_f32_8(acc1);
  s[2] = x86__hsum_f32_8(acc2);
  s[3] = x86__hsum_f32_8(acc3);
}

static inline void x86__vec_dot_x4_q8_0(int n, float *s, const void *vw, const void *va, size_t a_stride) {
  x86__dot_x4_w8(n, s, vw, va, a_stride, false);
}

static inline void x86__vec_dot_x4_q5_0(int n, float *s, const void *vw, const void *va, size_t a_stride) {
  x86__dot_x4_w8(n, s, vw, va, a_stride, true);
}

static inline void x86__vec_dot_q5_1(int n, float *s, const void *vw, const void *va) {
  const cpu_block_q5_1 *x = vw;
  const cpu_block_q8_1 *y = va;
  __m256 acc = _mm256_setzero_ps();
  float summs = 0.0f;
  for (int i = 0; i < n / CPU_QK; i++) {
    summs += X86_F16(x[i].m) * X86_F16(y[i].s);
    const __m256 d = _mm256_set1_ps(X86_F16(x[i].d) * X86_F16(y[i].d));
    __m256i qx = x86__bytes_from_nibbles_32(x[i].qs);
    __m256i hi = _mm256_and_si256(x86__bytes_from_bits_32(x[i].qh), _mm256_set1_epi8(0x10));
    qx = _mm256_or_si256(qx, hi);
    __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
    acc = _mm256_fmadd_ps(d, x86__mul_sum_us8_pairs_float(qx, qy), acc);
  }
  *s = x86__hsum_f32_8(acc) + summs;
}

static inline void x86__vec_dot_q8_0(int n, float *s, const void *vw, const void *va) {
  const cpu_block_q8_0 *x = vw;
  const cpu_block_q8_0 *y = va;
  __m256 acc = _mm256_setzero_ps();
  for (int i = 0; i < n / CPU_QK; i++) {
    const __m256 d = _mm256_set1_ps(X86_F16(x[i].d) * X86_F16(y[i].d));
    __m256i qx = _mm256_loadu_si256((const __m256i *)x[i].qs);
    __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
    acc = _mm256_fmadd_ps(d, x86__mul_sum_i8_pairs_float(qx, qy), acc);
  }
  *s = x86__hsum_f32_8(acc);
}

/* ---- K-quants ---- */

/* Unpacks the 8 six-bit scales and mins of a Q4_K/Q5_K super-block (12
 * bytes), four at a time in 32-bit words (little-endian, as ggml does). */
static inline void x86__scales_mins_k4(const uint8_t *q, uint8_t sc[8], uint8_t m[8]) {
  uint32_t u[3], s[2], mn[2];
  memcpy(u, q, 12);
  s[0] = u[0] & 0x3f3f3f3fu;
  s[1] = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);
  mn[0] = u[1] & 0x3f3f3f3fu;
  mn[1] = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4);
  memcpy(sc, s, 8);
  memcpy(m, mn, 8);
}

/* The same as the dots use them: *sc16 the 8 scales as int16 in both
 * 128-bit halves, *mn2 the 8 mins each twice (int16) against a Q8_K
 * block's 16 bsums. */
X86_INLINE void x86__qk_scales(const uint8_t *q, __m256i *sc16, __m256i *mn2) {
  uint8_t sc[8], mn[8];
  x86__scales_mins_k4(q, sc, mn);
  *sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sc)));
  const __m128i m8 = _mm_loadl_epi64((const __m128i *)mn);
  *mn2 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
}

/* A Q4_K/Q5_K super-block's 4-bit (5-bit) values, 64 per chunk c: lo[c]
 * the first 32, hi[c] the next 32. */
X86_INLINE void x86__unpack_qk(const uint8_t *qh, const uint8_t *qs, __m256i lo[4], __m256i hi[4]) {
  const __m256i m4 = _mm256_set1_epi8(0xF), one = _mm256_set1_epi8(1);
  const __m256i hbits = qh ? _mm256_loadu_si256((const __m256i *)qh) : _mm256_setzero_si256();
  for (int c = 0; c < 4; c++) {
    const __m256i bits = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
    lo[c] = _mm256_and_si256(bits, m4);
    hi[c] = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
    if (qh) {
      __m256i b0 = _mm256_and_si256(_mm256_srl_epi16(hbits, _mm_cvtsi32_si128(2 * c)), one);
      __m256i b1 = _mm256_and_si256(_mm256_srl_epi16(hbits, _mm_cvtsi32_si128(2 * c + 1)), one);
      lo[c] = _mm256_or_si256(lo[c], _mm256_slli_epi16(b0, 4));
      hi[c] = _mm256_or_si256(hi[c], _mm256_slli_epi16(b1, 4));
    }
  }
}

/* acc += one super-block against one activation block, from the unpacked
 * values, in 8 float lanes: yd d sum(scale q q8) - yd dmin sum(min bsum),
 * each lane from its exact int32 sums (under 2^24, so converted exactly),
 * as ggml's AVX2 dot sums; one horizontal sum a row at the end. The 1-row
 * and 4-row forms evaluate it alike, so a row's bits do not depend on its
 * batch. Sub-block k's scale is int16 lane k of sc16, picked by a byte
 * shuffle. d, dmin: the super-block's, as floats. */
X86_INLINE __m256 x86__qk_block_acc(const __m256i lo[4], const __m256i hi[4], __m256i sc16, __m256i mn2, float d,
                                    float dmin, const cpu_block_q8_K *y, __m256 acc) {
  __m256i sumi = _mm256_setzero_si256();
#pragma GCC unroll 4 /* -O2 keeps the loop, and with it the shuffle indices and acc, in memory */
  for (int c = 0; c < 4; c++) {
    const __m256i sl = _mm256_shuffle_epi8(sc16, _mm256_set1_epi16((short)((4 * c + 1) << 8 | 4 * c)));
    const __m256i sh = _mm256_shuffle_epi8(sc16, _mm256_set1_epi16((short)((4 * c + 3) << 8 | (4 * c + 2))));
    const __m256i q8l = _mm256_loadu_si256((const __m256i *)(y->qs + 64 * c));
    const __m256i q8h = _mm256_loadu_si256((const __m256i *)(y->qs + 64 * c + 32));
    __m256i pl = _mm256_madd_epi16(sl, _mm256_maddubs_epi16(lo[c], q8l));
    __m256i ph = _mm256_madd_epi16(sh, _mm256_maddubs_epi16(hi[c], q8h));
    sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
  }
  const __m256i summ = _mm256_madd_epi16(mn2, _mm256_loadu_si256((const __m256i *)y->bsums));
  acc = _mm256_fmadd_ps(_mm256_set1_ps(y->d * d), _mm256_cvtepi32_ps(sumi), acc);
  return _mm256_fnmadd_ps(_mm256_set1_ps(y->d * dmin), _mm256_cvtepi32_ps(summ), acc);
}

/* Q4_K (q5 false) and Q5_K dots of one weight row against R activation
 * rows (a_stride bytes apart): each super-block unpacked once. */
X86_INLINE void x86__dot_qk(int n, float *s, const uint8_t *x, const void *va, size_t a_stride, bool q5, int R) {
  const size_t x_bytes = q5 ? sizeof(cpu_block_q5_K) : sizeof(cpu_block_q4_K);
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int i = 0; i < n / CPU_QK_K; i++, x += x_bytes) {
    const cpu_block_q4_K *b4 = (const void *)x;
    const cpu_block_q5_K *b5 = (const void *)x;
    __m256i sc16, mn2, lo[4], hi[4];
    x86__qk_scales(q5 ? b5->scales : b4->scales, &sc16, &mn2);
    x86__unpack_qk(q5 ? b5->qh : NULL, q5 ? b5->qs : b4->qs, lo, hi);
    const float d = X86_F16(q5 ? b5->d : b4->d), dmin = X86_F16(q5 ? b5->dmin : b4->dmin);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
      const cpu_block_q8_K *y = (const cpu_block_q8_K *)((const uint8_t *)va + (size_t)r * a_stride) + i;
      acc[r] = x86__qk_block_acc(lo, hi, sc16, mn2, d, dmin, y, acc[r]);
    }
  }
  for (int r = 0; r < R; r++) s[r] = x86__hsum_f32_8(acc[r]);
}

static inline void x86__vec_dot_x4_q4_K(int n, float *s, const void *vw, const void *va, size_t a_stride) {
  x86__dot_qk(n, s, vw, va, a_stride, false, 4);
}

static inline void x86__vec_dot_x4_q5_K(int n, float *s, const void *vw, const void *va, size_t a_stride) {
  x86__dot_qk(n, s, vw, va, a_stride, true, 4);
}

static inline void x86__vec_dot_q4_K(int n, float *s, const void *vw, const void *va) {
  x86__dot_qk(n, s, vw, va, 0, false, 1);
}

static inline void x86__vec_dot_q5_K(int n, float *s, const void *vw, const void *va) {
  x86__dot_qk(n, s, vw, va, 0, true, 1);
}

/* A Q6_K super-block half h's 128 values (q6, unsigned), 32 per q[p]. */
static inline void x86__unpack_q6_K(const cpu_block_q6_K *x, int h, __m256i q[4]) {
  const __m256i m4 = _mm256_set1_epi8(0xF), m3 = _mm256_set1_epi8(3);
  const uint8_t *ql = x->ql + 64 * h;
  const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
  const __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
  const __m256i hb = _mm256_loadu_si256((const __m256i *)(x->qh + 32 * h));
  q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(hb, m3), 4));
  q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), m3), 4));
  q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                         _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), m3), 4));
  q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                         _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), m3), 4));
}

/* sumi += half h of (q6 - 32) . q8 with its int16 scales:
 * maddubs(q6, q8) - maddubs(32, q8), per 16. */
static inline __m256i x86__q6_K_half(const __m256i q[4], const int8_t *sc, const int8_t *q8, __m256i sumi) {
  const __m256i m32 = _mm256_set1_epi8(32);
#pragma GCC unroll 4
  for (int p = 0; p < 4; p++) {
    const __m256i y8 = _mm256_loadu_si256((const __m256i *)(q8 + 32 * p));
    __m256i p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(q[p], y8), _mm256_maddubs_epi16(m32, y8));
    const __m256i scl = _mm256_set_m128i(_mm_set1_epi16(sc[2 * p + 1]), _mm_set1_epi16(sc[2 * p]));
    sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(scl, p16));
  }
  return sumi;
}

/* Q6_K: (q6 - 32) . q8 = maddubs(q6, q8) - maddubs(32, q8), per 16 with int16 scales. */
static inline void x86__vec_dot_q6_K(int n, float *s, const void *vw, const void *va) {
  const cpu_block_q6_K *x = vw;
  const cpu_block_q8_K *y = va;
  __m256 acc = _mm256_setzero_ps();
  for (int i = 0; i < n / CPU_QK_K; i++) {
    __m256i sumi = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
      __m256i q[4];
      x86__unpack_q6_K(&x[i], h, q);
      sumi = x86__q6_K_half(q, x[i].scales + 8 * h, y[i].qs + 128 * h, sumi);
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(X86_F16(x[i].d) * y[i].d), _mm256_cvtepi32_ps(sumi), acc);
  }
  *s = x86__hsum_f32_8(acc);
}

/* 4-row form: each half unpacked once for the 4 activation rows, each
 * row's arithmetic the 1-row form's. */
static inline void x86__vec_dot_x4_q6_K(int n, float *s, const void *vw, const void *va, size_t a_stride) {
  const cpu_block_q6_K *x = vw;
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int i = 0; i < n / CPU_QK_K; i++) {
    __m256i sumi[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int h = 0; h < 2; h++) {
      __m256i q[4];
      x86__unpack_q6_K(&x[i], h, q);
#pragma GCC unroll 4
      for (int r = 0; r < 4; r++) {
        const cpu_block_q8_K *y = (const cpu_block_q8_K *)((const uint8_t *)va + (size_t)r * a_stride) + i;
        sumi[r] = x86__q6_K_half(q, x[i].scales + 8 * h, y->qs + 128 * h, sumi[r]);
      }
    }
    for (int r = 0; r < 4; r++) {
      const cpu_block_q8_K *y = (const cpu_block_q8_K *)((const uint8_t *)va + (size_t)r * a_stride) + i;
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(X86_F16(x[i].d) * y->d), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
    }
  }
  for (int r = 0; r < 4; r++) s[r] = x86__hsum_f32_8(acc[r]);
}

/* ---- float types ---- */

static inline float x86__dot_f32(int n, const float *a, const float *b) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
  int i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
    s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  float s = x86__hsum_f32_8(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
  for (; i < n; i++) s += a[i] * b[i];
  return s;
}

static inline __m256 x86__load_f16(const uint16_t *p) {
  return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

static inline __m256 x86__load_bf16(const uint16_t *p) {
  __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

static inline float x86__dot_f16(int n, const uint16_t *a, const float *b) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(x86__load_f16(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(x86__load_f16(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(x86__load_f16(a + i), _mm256_loadu_ps(b + i), s0);
  float s = x86__hsum_f32_8(_mm256_add_ps(s0, s1));
  for (; i < n; i++) s += X86_F16(a[i]) * b[i];
  return s;
}

static inline float x86__dot_bf16(int n, const uint16_t *a, const float *b) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(x86__load_bf16(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(x86__load_bf16(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(x86__load_bf16(a + i), _mm256_loadu_ps(b + i), s0);
  float s = x86__hsum_f32_8(_mm256_add_ps(s0, s1));
  for (; i < n; i++) s += fr_bf16_to_fp32(a[i]) * b[i];
  return s;
}

static inline void x86__vec_dot_f32(int n, float *s, const void *w, const void *a) { *s = x86__dot_f32(n, w, a); }
static inline void x86__vec_dot_f16(int n, float *s, const void *w, const void *a) { *s = x86__dot_f16(n, w, a); }
static inline void x86__vec_dot_bf16(int n, float *s, const void *w, const void *a) { *s = x86__dot_bf16(n, w, a); }

static inline void x86__axpy_f32(int n, float a, const float *x, float *y) {
  const __m256 va = _mm256_set1_ps(a);
  int i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; i++) y[i] += a * x[i];
}

/* 8 int8 -> 8 f32. */
static inline __m256 x86__load_i8(const int8_t *p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* 8 FP8 E4M3 -> 8 f32, by bits as cpu_e4m3_to_f32. */
static inline __m256 x86__load_e4m3(const uint8_t *p) {
  const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
  const __m256i mag = _mm256_slli_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x7F)), 20);
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x80)), 24);
  const __m256 m = _mm256_mul_ps(_mm256_castsi256_ps(mag), _mm256_set1_ps(0x1p120f));
  return _mm256_or_ps(m, _mm256_castsi256_ps(sign));
}

static inline float x86__dot_i8(int n, const int8_t *a, const float *b) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(x86__load_i8(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(x86__load_i8(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(x86__load_i8(a + i), _mm256_loadu_ps(b + i), s0);
  float s = x86__hsum_f32_8(_mm256_add_ps(s0, s1));
  for (; i < n; i++) s += (float)a[i] * b[i];
  return s;
}

static inline void x86__axpy_i8(int n, float a, const int8_t *x, float *y) {
  const __m256 va = _mm256_set1_ps(a);
  int i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, x86__load_i8(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; i++) y[i] += a * (float)x[i];
}

static inline float x86__dot_e4m3(int n, const uint8_t *a, const float *b) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(x86__load_e4m3(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(x86__load_e4m3(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(x86__load_e4m3(a + i), _mm256_loadu_ps(b + i), s0);
  float s = x86__hsum_f32_8(_mm256_add_ps(s0, s1));
  for (; i < n; i++) s += cpu_e4m3_to_f32(a[i]) * b[i];
  return s;
}

static inline void x86__axpy_e4m3(int n, float a, const uint8_t *x, float *y) {
  const __m256 va = _mm256_set1_ps(a);
  int i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, x86__load_e4m3(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; i++) y[i] += a * cpu_e4m3_to_f32(x[i]);
}

static inline void x86__axpy_f16(int n, float a, const uint16_t *x, float *y) {
  const __m256 va = _mm256_set1_ps(a);
  int i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, x86__load_f16(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; i++) y[i] += a * X86_F16(x[i]);
}

/* Attention block kernels (cpu_isa_t's scores_f16, pv_f16). */
static inline void x86__scores_f16(int hd, const uint16_t *k, size_t stride, int n, const float *q, float scale,
                                   float *s) {
  for (int o = 0; o < n; o++) s[o] = scale * x86__dot_f16(hd, k + (size_t)o * stride, q);
}

/* x rounded to f16 and back, as the software conversion in fr_util.h rounds
 * (to nearest even). */
static inline float x86__round_f16(float x) { return _cvtsh_ss(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT)); }

/* acc[0..63] stays in eight registers across the rows (hd % 64 == 0 here;
 * each element's sum is the same chain of FMAs as axpy_f16's). */
static inline void x86__pv_f16(int hd, const float *w, float inv, const uint16_t *v, size_t stride, int n,
                               float *acc) {
  int d = 0;
  for (; d + 64 <= hd; d += 64) {
    __m256 a[8];
    for (int c = 0; c < 8; c++) a[c] = _mm256_loadu_ps(acc + d + 8 * c);
    for (int o = 0; o < n; o++) {
      const __m256 p = _mm256_set1_ps(x86__round_f16(w[o] * inv));
      const uint16_t *vr = v + (size_t)o * stride + d;
      for (int c = 0; c < 8; c++) a[c] = _mm256_fmadd_ps(p, x86__load_f16(vr + 8 * c), a[c]);
    }
    for (int c = 0; c < 8; c++) _mm256_storeu_ps(acc + d + 8 * c, a[c]);
  }
  if (d < hd)
    for (int o = 0; o < n; o++) x86__axpy_f16(hd - d, x86__round_f16(w[o] * inv), v + (size_t)o * stride + d, acc + d);
}
