/* cpu_x512_impl.h - AVX-512 (F, BW, VL, DQ) kernels: the AVX2 kernels
 * recompiled with EVEX, plus 512-bit versions of the hot 32-element types
 * that take two blocks per iteration. Included by cpu_avx512.c and
 * cpu_avx512_vnni.c (also -mavx512vnni), whose tables X512_ISA_TABLE fills.
 * With VNNI the u8 x s8 dots are vpdpbusd instead of maddubs + madd: the
 * same int32 sums (maddubs cannot saturate on these value ranges: |w| <= 128
 * and |a| <= 127 keep a pair within int16), so both tables give the same
 * bits. Everything is static: each translation unit gets its own copy. */
#pragma once

#include "kernels/cpu/cpu_x86_impl.h"

/* Two blocks' 32 bytes side by side. */
static inline __m512i x512__join(__m256i lo, __m256i hi) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

static inline __m512 x512__scales(float d0, float d1) {
  return _mm512_insertf32x8(_mm512_set1_ps(d0), _mm256_set1_ps(d1), 1);
}

/* Sum of unsigned(ax) * signed(sy) in fours -> 16 floats. */
static inline __m512 x512__mul_sum_us8_pairs_float(__m512i ax, __m512i sy) {
#if defined(__AVX512VNNI__)
  return _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ax, sy));
#else
  const __m512i dot = _mm512_maddubs_epi16(ax, sy);
  return _mm512_cvtepi32_ps(_mm512_madd_epi16(_mm512_set1_epi16(1), dot));
#endif
}

/* signed x signed: |x| * (y with x's sign), as _mm256_sign_epi8 does. */
static inline __m512 x512__mul_sum_i8_pairs_float(__m512i x, __m512i y) {
  const __mmask64 neg = _mm512_movepi8_mask(x);
  const __m512i sy = _mm512_mask_sub_epi8(y, neg, _mm512_setzero_si512(), y);
  return x512__mul_sum_us8_pairs_float(_mm512_abs_epi8(x), sy);
}

static inline __m512i x512__load_q8_2(const int8_t *a, const int8_t *b) {
  return x512__join(_mm256_loadu_si256((const __m256i *)a), _mm256_loadu_si256((const __m256i *)b));
}

static void x512__vec_dot_q4_0(int n, float *s, const void *vw, const void *va) {
  const cpu_block_q4_0 *x = vw;
  const cpu_block_q8_0 *y = va;
  const int nb = n / CPU_QK;
  __m512 acc = _mm512_setzero_ps();
  int i = 0;
  for (; i + 2 <= nb; i += 2) {
    const __m512 d = x512__scales(X86_F16(x[i].d) * X86_F16(y[i].d), X86_F16(x[i + 1].d) * X86_F16(y[i + 1].d));
    __m512i qx = x512__join(x86__bytes_from_nibbles_32(x[i].qs), x86__bytes_from_nibbles_32(x[i + 1].qs));
    qx = _mm512_sub_epi8(qx, _mm512_set1_epi8(8));
    const __m512i qy = x512__load_q8_2(y[i].qs, y[i + 1].qs);
    acc = _mm512_fmadd_ps(d, x512__mul_sum_i8_pairs_float(qx, qy), acc);
  }
  float tail = 0.0f;
  if (i < nb) x86__vec_dot_q4_0(CPU_QK, &tail, &x[i], &y[i]);
  *s = _mm512_reduce_add_ps(acc) + tail;
}

/* Two blocks' f16 (d, m) or (d, s) fields, at a and b -> [d_a, m_a, d_b, m_b]. */
static inline __m128 x512__f16x2x2(const void *a, const void *b) {
  uint32_t u, v;
  memcpy(&u, a, 4);
  memcpy(&v, b, 4);
  return _mm_cvtph_ps(_mm_unpacklo_epi32(_mm_cvtsi32_si128((int)u), _mm_cvtsi32_si128((int)v)));
}

/* Two blocks' f16 scales d at a and b -> [d_a, d_b, 0, 0]. */
static inline __m128 x512__f16x1x2(const uint16_t *a, const uint16_t *b) {
  return _mm_cvtph_ps(_mm_insert_epi16(_mm_cvtsi32_si128(*a), *b, 1));
}

/* Lanes k0 and k1 of p, each spread over 8 lanes: one block pair's scales. */
static inline __m512 x512__spread2(__m128 p, int k0, int k1) {
  const __m512i idx = _mm512_inserti64x4(_mm512_set1_epi32(k0), _mm256_set1_epi32(k1), 1);
  return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(p));
}

/* One (weight row, activation row) block pair of a Q4_1 x Q8_1 dot: the
 * products p = [x.d y.d, x.m y.s] per block (xdm and yds hold the two
 * blocks' [d, m] and [d, s]); acc += p's scales * dot(qx, qy); lane 1 of
 * summs += x0.m y0.s + x1.m y1.s as one FMA over the rounded second product
 * (the bits gcc's contraction of the scalar form gave before, which
 * tensor-parallel runs are compared against). Every Q4_1 form below goes
 * through here, so a row's result is the same whichever form computes it. */
static inline void x512__q4_1_step(__m512i qx, __m128 xdm, __m512i qy, __m128 yds, __m512 *acc, __m128 *summs) {
  const __m128 p = _mm_mul_ps(xdm, yds);
  *summs = _mm_add_ps(*summs, _mm_fmadd_ps(xdm, yds, _mm_movehl_ps(p, p)));
  *acc = _mm512_fmadd_ps(x512__spread2(p, 0, 2), x512__mul_sum_us8_pairs_float(qx, qy), *acc);
}

static inline void x512__q4_1_row(__m512i qx, __m128 xdm, const cpu_block_q8_1 *y, int i, __m512 *acc,
                                  __m128 *summs) {
  const __m512i qy = x512__load_q8_2(y[i].qs, y[i + 1].qs);
  x512__q4_1_step(qx, xdm, qy, x512__f16x2x2(&y[i].d, &y[i + 1].d), acc, summs);
}

static inline float x512__q4_1_total(__m512 acc, __m128 summs) {
  return _mm512_reduce_add_ps(acc) + _mm_cvtss_f32(_mm_movehdup_ps(summs));
}

static void x512__vec_dot_q4_1(int n, float *s, const void *vw, const void *va) {
  const cpu_block_q4_1 *x = vw;
  const cpu_block_q8_1 *y = va;
  const int nb = n / CPU_QK;
  __m512 acc = _mm512_setzero_ps();
  __m128 summs = _mm_setzero_ps();
  int i = 0;
  for (; i + 2 <= nb; i += 2) {
    const __m512i qx = x512__join(x86__bytes_from_nibbles_32(x[i].qs), x86__bytes_from_nibbles_32(x[i + 1].qs));
    x512__q4_1_row(qx, x512__f16x2x2(&x[i].d, &x[i + 1].d), y, i, &acc, &summs);
  }
  float tail = 0.0f;
  if (i < nb) x86__vec_dot_q4_1(CPU_QK, &tail, &x[i], &y[i]);
  *s = x512__q4_1_total(acc, summs) + tail;
}

/* Prefill form: one weight row against 4 activation rows; the weight pair
 * is unpacked once, and each row's arithmetic is the 1-row form's, in its
 * order, so a row's result does not depend on the batch it is in. */
static void x512__vec_dot_x4_q4_1(int n, float *s, const void *vw, const void *va, size_t a_stride) {
  const cpu_block_q4_1 *x = vw;
  const cpu_block_q8_1 *y0 = va, *y1 = (const void *)((const uint8_t *)va + a_stride),
                       *y2 = (const void *)((const uint8_t *)va + 2 * a_stride),
                       *y3 = (const void *)((const uint8_t *)va + 3 * a_stride);
  const int nb = n / CPU_QK;
  /* Four named accumulators, not an array: they stay in registers. */
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  __m128 m0 = _mm_setzero_ps(), m1 = m0, m2 = m0, m3 = m0;
  int i = 0;
  for (; i + 2 <= nb; i += 2) {
    const __m512i qx = x512__join(x86__bytes_from_nibbles_32(x[i].qs), x86__bytes_from_nibbles_32(x[i + 1].qs));
    const __m128 xdm = x512__f16x2x2(&x[i].d, &x[i + 1].d);
    x512__q4_1_row(qx, xdm, y0, i, &a0, &m0);
    x512__q4_1_row(qx, xdm, y1, i, &a1, &m1);
    x512__q4_1_row(qx, xdm, y2, i, &a2, &m2);
    x512__q4_1_row(qx, xdm, y3, i, &a3, &m3);
  }
  float t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (i < nb) {
    x86__vec_dot_q4_1(CPU_QK, &t[0], &x[i], &y0[i]);
    x86__vec_dot_q4_1(CPU_QK, &t[1], &x[i], &y1[i]);
    x86__vec_dot_q4_1(CPU_QK, &t[2], &x[i], &y2[i]);
    x86__vec_dot_q4_1(CPU_QK, &t[3], &x[i], &y3[i]);
  }
  s[0] = x512__q4_1_total(a0, m0) + t[0];
  s[1] = x512__q4_1_total(a1, m1) + t[1];
  s[2] = x512__q4_1_total(a2, m2) + t[2];
  s[3] = x512__q4_1_total(a3, m3) + t[3];
}

/* Two weight rows' steps against one activation row's block pair, both
 * rows' products in one 256-bit multiply: xdm2 = [xdm of row 0, of row 1],
 * summs2 the two rows' min-term sums side by side (lanes 1 and 5). Lane by
 * lane it is x512__q4_1_step's arithmetic. */
static inline void x512__q4_1_col2(const __m512i qx[2], __m256 xdm2, const cpu_block_q8_1 *y, int i, __m512 *acc0,
                                   __m512 *acc1, __m256 *summs2) {
  const __m512i qy = x512__load_q8_2(y[i].qs, y[i + 1].qs);
  const __m128 yds = x512__f16x2x2(&y[i].d, &y[i + 1].d);
  const __m256 yy = _mm256_insertf128_ps(_mm256_castps128_ps256(yds), yds, 1);
  const __m256 p = _mm256_mul_ps(xdm2, yy);
  *summs2 = _mm256_add_ps(*summs2, _mm256_fmadd_ps(xdm2, yy, _mm256_shuffle_ps(p, p, _MM_SHUFFLE(3, 2, 3, 2))));
  const __m512 p512 = _mm512_castps256_ps512(p);
  const __m512i idx0 = _mm512_inserti64x4(_mm512_set1_epi32(0), _mm256_set1_epi32(2), 1);
  const __m512i idx1 = _mm512_inserti64x4(_mm512_set1_epi32(4), _mm256_set1_epi32(6), 1);
  *acc0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(idx0, p512), x512__mul_sum_us8_pairs_float(qx[0], qy), *acc0);
  *acc1 = _mm512_fmadd_ps(_mm512_permutexvar_ps(idx1, p512), x512__mul_sum_us8_pairs_float(qx[1], qy), *acc1);
}

/* Batched-decode form: 2 weight rows (w, w + w_stride) against 4
 * activation rows, s[k * 4 + j] for weight row k and activation row j: each
 * activation pair is loaded and converted once for both weight rows, each
 * weight pair unpacked once for all 4 activation rows; every (k, j) sums as
 * the 1-row form does. */
static void x512__vec_dot_2x4_q4_1(int n, float *s, const void *vw, size_t w_stride, const void *va, size_t a_stride) {
  const cpu_block_q4_1 *x[2] = {vw, (const void *)((const uint8_t *)vw + w_stride)};
  const cpu_block_q8_1 *y0 = va, *y1 = (const void *)((const uint8_t *)va + a_stride),
                       *y2 = (const void *)((const uint8_t *)va + 2 * a_stride),
                       *y3 = (const void *)((const uint8_t *)va + 3 * a_stride);
  const int nb = n / CPU_QK;
  __m512 a00 = _mm512_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00, a13 = a00;
  __m256 m0 = _mm256_setzero_ps(), m1 = m0, m2 = m0, m3 = m0;
  int i = 0;
  for (; i + 2 <= nb; i += 2) {
    __m512i qx[2];
    for (int k = 0; k < 2; k++)
      qx[k] = x512__join(x86__bytes_from_nibbles_32(x[k][i].qs), x86__bytes_from_nibbles_32(x[k][i + 1].qs));
    const __m256 xdm2 = _mm256_insertf128_ps(_mm256_castps128_ps256(x512__f16x2x2(&x[0][i].d, &x[0][i + 1].d)),
                                             x512__f16x2x2(&x[1][i].d, &x[1][i + 1].d), 1);
    x512__q4_1_col2(qx, xdm2, y0, i, &a00, &a10, &m0);
    x512__q4_1_col2(qx, xdm2, y1, i, &a01, &a11, &m1);
    x512__q4_1_col2(qx, xdm2, y2, i, &a02, &a12, &m2);
    x512__q4_1_col2(qx, xdm2, y3, i, &a03, &a13, &m3);
  }
  const __m512 acc[8] = {a00, a01, a02, a03, a10, a11, a12, a13};
  const __m256 sm[4] = {m0, m1, m2, m3};
  const cpu_block_q8_1 *y[4] = {y0, y1, y2, y3};
  for (int k = 0; k < 8; k++) {
    float tail = 0.0f;
    if (i < nb) x86__vec_dot_q4_1(CPU_QK, &tail, &x[k / 4][i], &y[k % 4][i]);
    const __m128 summs = k < 4 ? _mm256_castps256_ps128(sm[k % 4]) : _mm256_extractf128_ps(sm[k % 4], 1);
    s[k] = x512__q4_1_total(acc[k], summs) + tail;
  }
}

/* A Q8_0 block pair's scales x.d y.d, spread over the pair's 16 lanes (the
 * products ggml's scalar order gives). */
static inline __m512 x512__q8_0_scales(__m128 xd, const cpu_block_q8_0 *y, int i) {
  return x512__spread2(_mm_mul_ps(xd, x512__f16x1x2(&y[i].d, &y[i + 1].d)), 0, 1);
}

/* The Q8_0 forms below also serve Q5_0 (q5: its 5-bit values, q5 - 16, as
 * signed bytes): the same arithmetic on the unpacked bytes. */

/* Blocks i and i + 1 of a Q8_0 or Q5_0 row as 64 signed bytes. */
static inline __m512i x512__w8_pair(const void *vx, int i, bool q5) {
  if (!q5) {
    const cpu_block_q8_0 *x = vx;
    return x512__load_q8_2(x[i].qs, x[i + 1].qs);
  }
  const cpu_block_q5_0 *x = vx;
  return x512__join(x86__q5_0_bytes(&x[i]), x86__q5_0_bytes(&x[i + 1]));
}

/* [d of block i, d of block i + 1, 0, 0] */
static inline __m128 x512__w8_d(const void *vx, int i, bool q5) {
  if (!q5) return x512__f16x1x2(&((const cpu_block_q8_0 *)vx)[i].d, &((const cpu_block_q8_0 *)vx)[i + 1].d);
  return x512__f16x1x2(&((const cpu_block_q5_0 *)vx)[i].d, &((const cpu_block_q5_0 *)vx)[i + 1].d);
}

/* The odd last block, by the AVX2 1-row dot. */
static inline float x512__w8_tail(const void *vx, int i, const cpu_block_q8_0 *y, bool q5) {
  float t = 0.0f;
  if (q5) x86__vec_dot_q5_0(CPU_QK, &t, &((const cpu_block_q5_0 *)vx)[i], &y[i]);
  else x86__vec_dot_q8_0(CPU_QK, &t, &((const cpu_block_q8_0 *)vx)[i], &y[i]);
  return t;
}

static inline void x512__dot_w8(int n, float *s, const void *vw, const void *va, bool q5) {
  const cpu_block_q8_0 *y = va;
  const int nb = n / CPU_QK;
  __m512 acc = _mm512_setzero_ps();
  int i = 0;
  for (; i + 2 <= nb; i += 2) {
    const __m512i qx = x512__w8_pair(vw, i, q5);
    const __m512i qy = x512__load_q8_2(y[i].qs, y[i + 1].qs);
    const __m128 xd = x512__w8_d(vw, i, q5);
    acc = _mm512_fmadd_ps(x512__q8_0_scales(xd, y, i), x512__mul_sum_i8_pairs_float(qx, qy), acc);
  }
  const float tail = i < nb ? x512__w8_tail(vw, i, y, q5) : 0.0f;
  *s = _mm512_reduce_add_ps(acc) + tail;
}

static void x512__vec_dot_q8_0(int n, float *s, const void *vw, const void *va) { x512__dot_w8(n, s, vw, va, false); }
static void x512__vec_dot_q5_0(int n, float *s, const void *vw, const void *va) { x512__dot_w8(n, s, vw, va, true); }

/* The 4-row and 2x4 forms below: a weight pair prepared once for all its
 * activation rows, an activation pair once for all its weight rows.
 * With VNNI the weight bytes stay signed and the activations become
 * unsigned (y + 128, one xor a pair): vpdpbusd then accumulates onto each
 * lane's -128 * sum(x), prepared with the weights, and ends at the lane's
 * exact sum(x y) in one instruction. Without VNNI maddubs could saturate
 * on (y + 128) x, so the weights are |x| and x's sign goes to y. The int32
 * lanes are the 1-row dot's either way, and the scales the same products
 * (x.d y.d per block, spread over its 8 lanes): the same bits. */
typedef struct {
#if defined(__AVX512VNNI__)
  __m512i x;    /* signed bytes */
  __m512i corr; /* -128 * the sum of each lane's 4 bytes */
#else
  __m512i ax;    /* |x| */
  __mmask64 neg; /* x's sign */
#endif
  __m512 xd; /* d0 in lanes 0-7, d1 in 8-15 */
} x512__q8_0_pair_t;

typedef struct {
  __m512i y;  /* the activation bytes (plus 128 as unsigned bytes with VNNI) */
  __m512 yd;  /* d0 in lanes 0-7, d1 in 8-15 */
} x512__q8_0_act_t;

static inline x512__q8_0_pair_t x512__q8_0_pair(const void *x, int i, bool q5) {
  const __m512i qx = x512__w8_pair(x, i, q5);
  const __m512 xd = x512__spread2(x512__w8_d(x, i, q5), 0, 1);
#if defined(__AVX512VNNI__)
  const __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8((char)0x80), qx);
  return (x512__q8_0_pair_t){qx, _mm512_sub_epi32(_mm512_setzero_si512(), s), xd};
#else
  return (x512__q8_0_pair_t){_mm512_abs_epi8(qx), _mm512_movepi8_mask(qx), xd};
#endif
}

static inline x512__q8_0_act_t x512__q8_0_act(const cpu_block_q8_0 *y, int i) {
  const __m512i qy = x512__load_q8_2(y[i].qs, y[i + 1].qs);
  const __m512 yd = x512__spread2(x512__f16x1x2(&y[i].d, &y[i + 1].d), 0, 1);
#if defined(__AVX512VNNI__)
  return (x512__q8_0_act_t){_mm512_xor_si512(qy, _mm512_set1_epi8((char)0x80)), yd};
#else
  return (x512__q8_0_act_t){qy, yd};
#endif
}

/* acc += the block pair's scales * dot(weight pair, activation pair). */
static inline __m512 x512__q8_0_step(const x512__q8_0_pair_t *p, const x512__q8_0_act_t *a, __m512 acc) {
#if defined(__AVX512VNNI__)
  const __m512 dot = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(p->corr, a->y, p->x));
#else
  const __m512i sy = _mm512_mask_sub_epi8(a->y, p->neg, _mm512_setzero_si512(), a->y);
  const __m512 dot = x512__mul_sum_us8_pairs_float(p->ax, sy);
#endif
  return _mm512_fmadd_ps(_mm512_mul_ps(p->xd, a->yd), dot, acc);
}

/* Two weight rows' steps against one activation row's block pair. */
static inline void x512__q8_0_col2(const x512__q8_0_pair_t *p0, const x512__q8_0_pair_t *p1, const cpu_block_q8_0 *y,
                                   int i, __m512 *acc0, __m512 *acc1) {
  const x512__q8_0_act_t a = x512__q8_0_act(y, i);
  *acc0 = x512__q8_0_step(p0, &a, *acc0);
  *acc1 = x512__q8_0_step(p1, &a, *acc1);
}

/* Batched-decode form of the Q8_0 (Q5_0) dot, as x512__vec_dot_2x4_q4_1. */
static inline void x512__dot_2x4_w8(int n, float *s, const void *vw, size_t w_stride, const void *va, size_t a_stride,
                                    bool q5) {
  const void *x0 = vw, *x1 = (const uint8_t *)vw + w_stride;
  const cpu_block_q8_0 *y0 = va, *y1 = (const void *)((const uint8_t *)va + a_stride),
                       *y2 = (const void *)((const uint8_t *)va + 2 * a_stride),
                       *y3 = (const void *)((const uint8_t *)va + 3 * a_stride);
  const int nb = n / CPU_QK;
  __m512 a00 = _mm512_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00, a13 = a00;
  int i = 0;
  for (; i + 2 <= nb; i += 2) {
    const x512__q8_0_pair_t p0 = x512__q8_0_pair(x0, i, q5), p1 = x512__q8_0_pair(x1, i, q5);
    x512__q8_0_col2(&p0, &p1, y0, i, &a00, &a10);
    x512__q8_0_col2(&p0, &p1, y1, i, &a01, &a11);
    x512__q8_0_col2(&p0, &p1, y2, i, &a02, &a12);
    x512__q8_0_col2(&p0, &p1, y3, i, &a03, &a13);
  }
  const __m512 acc[8] = {a00, a01, a02, a03, a10, a11, a12, a13};
  const void *x[2] = {x0, x1};
  const cpu_block_q8_0 *y[4] = {y0, y1, y2, y3};
  for (int k = 0; k < 8; k++) {
    const float tail = i < nb ? x512__w8_tail(x[k / 4], i, y[k % 4], q5) : 0.0f;
    s[k] = _mm512_reduce_add_ps(acc[k]) + tail;
  }
}

static void x512__vec_dot_2x4_q8_0(int n, float *s, const void *vw, size_t w_stride, const void *va, size_t a_stride) {
  x512__dot_2x4_w8(n, s, vw, w_stride, va, a_stride, false);
}

static void x512__vec_dot_2x4_q5_0(int n, float *s, const void *vw, size_t w_stride, const void *va, size_t a_stride) {
  x512__dot_2x4_w8(n, s, vw, w_stride, va, a_stride, true);
}

static inline void x512__dot_x4_w8(int n, float *s, const void *vw, const void *va, size_t a_stride, bool q5) {
  const cpu_block_q8_0 *y[4] = {va, (const void *)((const uint8_t *)va + a_stride),
                                (const void *)((const uint8_t *)va + 2 * a_stride),
                                (const void *)((const uint8_t *)va + 3 * a_stride)};
  const int nb = n / CPU_QK;
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int i = 0;
  for (; i + 2 <= nb; i += 2) {
    const x512__q8_0_pair_t p = x512__q8_0_pair(vw, i, q5);
    const x512__q8_0_act_t y0 = x512__q8_0_act(y[0], i), y1 = x512__q8_0_act(y[1], i),
                           y2 = x512__q8_0_act(y[2], i), y3 = x512__q8_0_act(y[3], i);
    a0 = x512__q8_0_step(&p, &y0, a0);
    a1 = x512__q8_0_step(&p, &y1, a1);
    a2 = x512__q8_0_step(&p, &y2, a2);
    a3 = x512__q8_0_step(&p, &y3, a3);
  }
  const __m512 acc[4] = {a0, a1, a2, a3};
  for (int k = 0; k < 4; k++) s[k] = _mm512_reduce_add_ps(acc[k]) + (i < nb ? x512__w8_tail(vw, i, y[k], q5) : 0.0f);
}

static void x512__vec_dot_x4_q8_0(int n, float *s, const void *vw, const void *va, size_t a_stride) {
  x512__dot_x4_w8(n, s, vw, va, a_stride, false);
}

static void x512__vec_dot_x4_q5_0(int n, float *s, const void *vw, const void *va, size_t a_stride) {
  x512__dot_x4_w8(n, s, vw, va, a_stride, true);
}

static float x512__dot_f32(int n, const float *a, const float *b) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  int i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
  }
  float s = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
  return s + x86__dot_f32(n - i, a + i, b + i);
}

static void x512__vec_dot_f32(int n, float *s, const void *w, const void *a) { *s = x512__dot_f32(n, w, a); }

/* 16 int8 per load: the score dot of an int8 KV cache. */
static float x512__dot_i8(int n, const int8_t *a, const float *b) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  int i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 a0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(a + i))));
    const __m512 a1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(a + i + 16))));
    s0 = _mm512_fmadd_ps(a0, _mm512_loadu_ps(b + i), s0);
    s1 = _mm512_fmadd_ps(a1, _mm512_loadu_ps(b + i + 16), s1);
  }
  float s = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
  return s + x86__dot_i8(n - i, a + i, b + i);
}

static void x512__axpy_i8(int n, float a, const int8_t *x, float *y) {
  const __m512 va = _mm512_set1_ps(a);
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 xv = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(x + i))));
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, xv, _mm512_loadu_ps(y + i)));
  }
  x86__axpy_i8(n - i, a, x + i, y + i);
}

/* Q4_K with 512-bit registers: 64 values (two sub-blocks) per step. Lanes
 * 0-7 of the int32 sums are the AVX2 form's pl, lanes 8-15 its ph, so
 * their two halves added are its exact sumi; the float part is
 * x86__qk_block_acc's, in the same 8 lanes, with one horizontal sum a row:
 * the same bits as the AVX2 table (test_matmul_kquant_avx512_exact). */
typedef struct {
  __m512i q[4];   /* chunk c: sub-block 2c's 32 values, then 2c + 1's (unsigned 4-bit) */
  __m512i scl[4]; /* chunk c: sub-block 2c's scale in 16 int16 lanes, then 2c + 1's */
  __m256i mn2;    /* the 8 mins, each twice (int16), against the 16 bsums */
  float d, dmin;
} x512__q4_K_t;

static inline void x512__q4_K_unpack(const cpu_block_q4_K *x, x512__q4_K_t *u) {
  uint8_t sc[8], mn[8];
  x86__scales_mins_k4(x->scales, sc, mn);
  const __m512i m4 = _mm512_set1_epi8(0xF);
  const __m512i sc16 = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sc)));
  for (int c = 0; c < 4; c++) {
    const __m256i bits = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * c));
    u->q[c] = _mm512_and_si512(x512__join(bits, _mm256_srli_epi16(bits, 4)), m4);
    const __m512i idx = _mm512_inserti64x4(_mm512_set1_epi16((short)(2 * c)), _mm256_set1_epi16((short)(2 * c + 1)), 1);
    u->scl[c] = _mm512_permutexvar_epi16(idx, sc16);
  }
  const __m256i mn16 = _mm256_castsi128_si256(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mn)));
  u->mn2 = _mm256_permutexvar_epi16(_mm256_setr_epi16(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7), mn16);
  u->d = X86_F16(x->d), u->dmin = X86_F16(x->dmin);
}

/* acc += one super-block against one activation block (x86__qk_block_acc's
 * expression). */
static inline __m256 x512__q4_K_block(const x512__q4_K_t *u, const cpu_block_q8_K *y, __m256 acc) {
  __m512i sum = _mm512_setzero_si512();
  for (int c = 0; c < 4; c++) {
    const __m512i y8 = _mm512_loadu_si512((const void *)(y->qs + 64 * c));
    sum = _mm512_add_epi32(sum, _mm512_madd_epi16(u->scl[c], _mm512_maddubs_epi16(u->q[c], y8)));
  }
  const __m256i sumi = _mm256_add_epi32(_mm512_castsi512_si256(sum), _mm512_extracti64x4_epi64(sum, 1));
  const __m256i summ = _mm256_madd_epi16(u->mn2, _mm256_loadu_si256((const __m256i *)y->bsums));
  acc = _mm256_fmadd_ps(_mm256_set1_ps(y->d * u->d), _mm256_cvtepi32_ps(sumi), acc);
  return _mm256_fnmadd_ps(_mm256_set1_ps(y->d * u->dmin), _mm256_cvtepi32_ps(summ), acc);
}

static void x512__vec_dot_q4_K(int n, float *s, const void *vw, const void *va) {
  const cpu_block_q4_K *x = vw;
  const cpu_block_q8_K *y = va;
  __m256 acc = _mm256_setzero_ps();
  for (int i = 0; i < n / CPU_QK_K; i++) {
    x512__q4_K_t u;
    x512__q4_K_unpack(&x[i], &u);
    acc = x512__q4_K_block(&u, &y[i], acc);
  }
  *s = x86__hsum_f32_8(acc);
}

static void x512__vec_dot_x4_q4_K(int n, float *s, const void *vw, const void *va, size_t a_stride) {
  const cpu_block_q4_K *x = vw;
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int i = 0; i < n / CPU_QK_K; i++) {
    x512__q4_K_t u;
    x512__q4_K_unpack(&x[i], &u);
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
      acc[r] = x512__q4_K_block(&u, (const cpu_block_q8_K *)((const uint8_t *)va + (size_t)r * a_stride) + i, acc[r]);
  }
  for (int r = 0; r < 4; r++) s[r] = x86__hsum_f32_8(acc[r]);
}

/* Attention scores with the query in registers: one 512-bit FMA per 16
 * elements, whose low and high halves are dot_f16's two 8-lane sums over
 * the same elements in the same order, then added and reduced as dot_f16
 * does: the same bits (hd % 16 == 0, hd <= 128 here). */
static void x512__scores_f16(int hd, const uint16_t *k, size_t stride, int n, const float *q, float scale, float *s) {
  if (hd % 16 || hd > 128) {
    x86__scores_f16(hd, k, stride, n, q, scale, s);
    return;
  }
  const int nc = hd / 16;
  __m512 qv[8];
  for (int c = 0; c < nc; c++) qv[c] = _mm512_loadu_ps(q + 16 * c);
  for (int o = 0; o < n; o++) {
    const uint16_t *kr = k + (size_t)o * stride;
    __m512 acc = _mm512_setzero_ps();
    for (int c = 0; c < nc; c++)
      acc = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(kr + 16 * c))), qv[c], acc);
    const __m256 sum = _mm256_add_ps(_mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1));
    s[o] = scale * x86__hsum_f32_8(sum);
  }
}

/* acc[0 .. 16 * nc) += the rows' weighted values, in nc registers. */
static inline void x512__pv_f16_part(int nc, const float *w, float inv, const uint16_t *v, size_t stride, int n,
                                     float *acc) {
  __m512 a[8];
  for (int c = 0; c < nc; c++) a[c] = _mm512_loadu_ps(acc + 16 * c);
  for (int o = 0; o < n; o++) {
    const __m512 p = _mm512_set1_ps(x86__round_f16(w[o] * inv));
    const uint16_t *vr = v + (size_t)o * stride;
    for (int c = 0; c < nc; c++)
      a[c] = _mm512_fmadd_ps(p, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(vr + 16 * c))), a[c]);
  }
  for (int c = 0; c < nc; c++) _mm512_storeu_ps(acc + 16 * c, a[c]);
}

/* pv_f16 with 16-wide registers: elementwise FMAs, so the width does not
 * change any element's sum. */
static void x512__pv_f16(int hd, const float *w, float inv, const uint16_t *v, size_t stride, int n, float *acc) {
  int d = 0;
  for (; d + 128 <= hd; d += 128) x512__pv_f16_part(8, w, inv, v + d, stride, n, acc + d);
  for (; d + 64 <= hd; d += 64) x512__pv_f16_part(4, w, inv, v + d, stride, n, acc + d);
  if (d < hd) x86__pv_f16(hd - d, w, inv, v + d, stride, n, acc + d);
}

/* The kernel table of the including file, named isa_name, with the panel
 * kernels `panels` ({0}: none). */
#define X512_ISA_TABLE(isa_name, panels) \
  { \
    .name = isa_name, \
    .vec_dot = \
        { \
            [KERN_F32] = x512__vec_dot_f32, \
            [KERN_F16] = x86__vec_dot_f16, \
            [KERN_BF16] = x86__vec_dot_bf16, \
            [KERN_Q4_0] = x512__vec_dot_q4_0, \
            [KERN_Q4_1] = x512__vec_dot_q4_1, \
            [KERN_I4G] = x86__vec_dot_i4g, \
            [KERN_Q5_0] = x512__vec_dot_q5_0, \
            [KERN_Q5_1] = x86__vec_dot_q5_1, \
            [KERN_Q8_0] = x512__vec_dot_q8_0, \
            [KERN_Q4_K] = x512__vec_dot_q4_K, \
            [KERN_Q5_K] = x86__vec_dot_q5_K, \
            [KERN_Q6_K] = x86__vec_dot_q6_K, \
        }, \
    /* 4-row forms whose rows sum as the 1-row forms above do: a row must \
     * give the same result alone or in a batch (the engine relies on it; \
     * test_matmul_batch_invariant). I4G's 1-row dot here is the AVX2 one, \
     * which its AVX2 4-row form matches. */ \
    .vec_dot_x4 = {[KERN_Q4_1] = x512__vec_dot_x4_q4_1, [KERN_Q8_0] = x512__vec_dot_x4_q8_0, \
                   [KERN_I4G] = x86__vec_dot_x4_i4g, [KERN_Q5_0] = x512__vec_dot_x4_q5_0, \
                   [KERN_Q4_K] = x512__vec_dot_x4_q4_K, [KERN_Q5_K] = x86__vec_dot_x4_q5_K, \
                   [KERN_Q6_K] = x86__vec_dot_x4_q6_K}, \
    .vec_dot_2x4 = {[KERN_Q4_1] = x512__vec_dot_2x4_q4_1, [KERN_Q8_0] = x512__vec_dot_2x4_q8_0, \
                    [KERN_Q5_0] = x512__vec_dot_2x4_q5_0}, \
    .quantize = \
        { \
            [KERN_Q8_0] = x86__quantize_q8_0, \
            [KERN_Q8_1] = x86__quantize_q8_1, \
            [KERN_Q8_K] = x86__quantize_q8_K, \
        }, \
    .panel_gemm = panels, \
    .dot_f32 = x512__dot_f32, \
    .dot_f16 = x86__dot_f16, \
    .axpy_f32 = x86__axpy_f32, \
    .axpy_f16 = x86__axpy_f16, \
    .dot_i8 = x512__dot_i8, \
    .axpy_i8 = x512__axpy_i8, \
    .dot_e4m3 = x86__dot_e4m3, \
    .axpy_e4m3 = x86__axpy_e4m3, \
    .scores_f16 = x512__scores_f16, \
    .pv_f16 = x512__pv_f16, \
    .silu_mul = x512__silu_mul, \
    .exp_shift = x512__exp_shift, \
  }
