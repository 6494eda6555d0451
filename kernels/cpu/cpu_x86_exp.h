/* cpu_x86_exp.h - glibc's expf, 8 (AVX2) or 16 (AVX-512) lanes at a time,
 * with the same bits, and the two loops built on it: silu_mul (the FFN's
 * silu(gate) * up) and exp_shift (softmax numerators: attention's, the
 * sampler's through kern_cpu_expf_shift). The
 * scalar table calls libm's expf per element; these tables must give its
 * bits, or the kernel table would change which token a prompt picks.
 *
 * glibc 2.28+ computes expf (sysdeps/ieee754/flt-32/e_expf.c) in double:
 * x = (k + r) ln 2 / 32 with k an integer and |r| <= 1/2, e^x = 2^(k/32)
 * 2^(r/32), 2^(k/32) from a 32-entry table plus k / 32 in the exponent,
 * 2^(r/32) by a degree-3 polynomial, then one rounding to float. On x86-64
 * with FMA (every CPU these tables run on) libm picks __expf_fma, the same
 * C compiled with -mfma, whose contractions (read from its disassembly)
 * are the fma calls below. The table and constants are __exp2f_data's
 * (checked against the loaded libm's memory). test_expf_libm_bits compares
 * every table with expf on 2^24 inputs spread over all floats and around
 * each special-case bound; FERRUM_TEST_EXPF_ALL=1 makes it all 2^32.
 *
 * Special cases, as glibc orders them: x > 0x1.62e42ep6 (past the largest
 * float): +inf; x < -0x1.9fe368p6 (under half the least subnormal): +0;
 * x < -0x1.9d1d9ep6: 0x1.4p-75f squared, the least subnormal (the value
 * under round-to-nearest without flush-to-zero, which the engine never
 * sets); NaN: x + x. Everything else, the ranges 88 <= |x| included, takes
 * the polynomial. Included by cpu_x86_impl.h: static, compiled for the
 * including file's flags. */
#pragma once

#include <immintrin.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#define X86_EXPF_INVLN2N 0x1.71547652b82fep+5 /* 32 / ln 2 */
#define X86_EXPF_SHIFT 0x1.8p+52              /* adding it rounds to an integer */
#define X86_EXPF_C0 0x1.c6af84b912394p-20
#define X86_EXPF_C1 0x1.ebfce50fac4f3p-13
#define X86_EXPF_C2 0x1.62e42ff0c52d6p-6
#define X86_EXPF_OFLOW 0x1.62e42ep6f
#define X86_EXPF_UFLOW (-0x1.9fe368p6f)
#define X86_EXPF_MAY_UFLOW (-0x1.9d1d9ep6f)
#define X86_EXPF_LEAST 0x1p-149f /* glibc's 0x1.4p-75f * 0x1.4p-75f */

/* bits(2^(i/32)) - (i << 47): adding k << 47 for k = i mod 32 gives 2^(k/32). */
static const uint64_t x86__expf_tab[32] __attribute__((aligned(64))) = {
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51, 0x3fef72b83c7d517b,
    0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1, 0x3fef06fe0a31b715, 0x3feef1a7373aa9cb,
    0x3feedea64c123422, 0x3feece086061892d, 0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429,
    0x3feea47eb03a5585, 0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d, 0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069, 0x3fef5818dcfba487, 0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da, 0x3fefd0765b6e4540,
};

/* The polynomial path of 4 lanes, in double: e^x before its rounding to float. */
static inline __m256d x86__expf_pd4(__m256d xd) {
  const __m256d inv = _mm256_set1_pd(X86_EXPF_INVLN2N), shift = _mm256_set1_pd(X86_EXPF_SHIFT);
  __m256d kd = _mm256_fmadd_pd(inv, xd, shift);
  const __m256i ki = _mm256_castpd_si256(kd);
  kd = _mm256_sub_pd(kd, shift);
  const __m256d r = _mm256_fmsub_pd(inv, xd, kd);
  const __m256i idx = _mm256_and_si256(ki, _mm256_set1_epi64x(31));
  const __m256i t = _mm256_add_epi64(_mm256_i64gather_epi64((const long long *)x86__expf_tab, idx, 8),
                                     _mm256_slli_epi64(ki, 47));
  const __m256d z = _mm256_fmadd_pd(r, _mm256_set1_pd(X86_EXPF_C0), _mm256_set1_pd(X86_EXPF_C1));
  const __m256d r2 = _mm256_mul_pd(r, r);
  __m256d y = _mm256_fmadd_pd(r, _mm256_set1_pd(X86_EXPF_C2), _mm256_set1_pd(1.0));
  y = _mm256_fmadd_pd(z, r2, y);
  return _mm256_mul_pd(y, _mm256_castsi256_pd(t));
}

/* expf of 8 lanes. */
static inline __m256 x86__expf8(__m256 x) {
  const __m128 e0 = _mm256_cvtpd_ps(x86__expf_pd4(_mm256_cvtps_pd(_mm256_castps256_ps128(x))));
  const __m128 e1 = _mm256_cvtpd_ps(x86__expf_pd4(_mm256_cvtps_pd(_mm256_extractf128_ps(x, 1))));
  __m256 e = _mm256_insertf128_ps(_mm256_castps128_ps256(e0), e1, 1);
  const __m256 ax = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
  if (_mm256_movemask_ps(_mm256_cmp_ps(ax, _mm256_set1_ps(88.0f), _CMP_NLT_UQ))) { /* rare: |x| >= 88 or NaN */
    e = _mm256_blendv_ps(e, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(x, _mm256_set1_ps(X86_EXPF_OFLOW), _CMP_GT_OQ));
    e = _mm256_blendv_ps(e, _mm256_set1_ps(X86_EXPF_LEAST),
                         _mm256_cmp_ps(x, _mm256_set1_ps(X86_EXPF_MAY_UFLOW), _CMP_LT_OQ));
    e = _mm256_blendv_ps(e, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(X86_EXPF_UFLOW), _CMP_LT_OQ));
    e = _mm256_blendv_ps(e, _mm256_add_ps(x, x), _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  }
  return e;
}

/* o[k] = g[k] / (1 + expf(-g[k])) * u[k], k < d: the scalar table's expression. */
static inline void x86__silu_mul(int d, const float *g, const float *u, float *o) {
  const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
  int k = 0;
  for (; k + 8 <= d; k += 8) {
    const __m256 gv = _mm256_loadu_ps(g + k);
    const __m256 e = x86__expf8(_mm256_xor_ps(gv, sign));
    _mm256_storeu_ps(o + k, _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + k)));
  }
  for (; k < d; k++) o[k] = g[k] / (1.0f + expf(-g[k])) * u[k];
}

/* y[i] = expf((x[i] - m) / t), i < n; t = 1 skips the division (x / 1 is x). */
static inline void x86__exp_shift(int n, const float *x, float m, float t, float *y) {
  const __m256 mv = _mm256_set1_ps(m), tv = _mm256_set1_ps(t);
  const bool div = t != 1.0f;
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_sub_ps(_mm256_loadu_ps(x + i), mv);
    _mm256_storeu_ps(y + i, x86__expf8(div ? _mm256_div_ps(v, tv) : v));
  }
  for (; i < n; i++) y[i] = expf(div ? (x[i] - m) / t : x[i] - m);
}

#if defined(__AVX512F__) && defined(__AVX512DQ__)
/* The polynomial path of 8 lanes: the table lookup is two two-register permutes. */
static inline __m512d x512__expf_pd8(__m512d xd) {
  const __m512d inv = _mm512_set1_pd(X86_EXPF_INVLN2N), shift = _mm512_set1_pd(X86_EXPF_SHIFT);
  __m512d kd = _mm512_fmadd_pd(inv, xd, shift);
  const __m512i ki = _mm512_castpd_si512(kd);
  kd = _mm512_sub_pd(kd, shift);
  const __m512d r = _mm512_fmsub_pd(inv, xd, kd);
  const __m512i *tab = (const __m512i *)x86__expf_tab;
  const __m512i lo = _mm512_permutex2var_epi64(tab[0], ki, tab[1]), hi = _mm512_permutex2var_epi64(tab[2], ki, tab[3]);
  const __m512i t = _mm512_add_epi64(_mm512_mask_blend_epi64(_mm512_test_epi64_mask(ki, _mm512_set1_epi64(16)), lo, hi),
                                     _mm512_slli_epi64(ki, 47));
  const __m512d z = _mm512_fmadd_pd(r, _mm512_set1_pd(X86_EXPF_C0), _mm512_set1_pd(X86_EXPF_C1));
  const __m512d r2 = _mm512_mul_pd(r, r);
  __m512d y = _mm512_fmadd_pd(r, _mm512_set1_pd(X86_EXPF_C2), _mm512_set1_pd(1.0));
  y = _mm512_fmadd_pd(z, r2, y);
  return _mm512_mul_pd(y, _mm512_castsi512_pd(t));
}

/* expf of 16 lanes. */
static inline __m512 x512__expf16(__m512 x) {
  const __m256 e0 = _mm512_cvtpd_ps(x512__expf_pd8(_mm512_cvtps_pd(_mm512_castps512_ps256(x))));
  const __m256 e1 = _mm512_cvtpd_ps(x512__expf_pd8(_mm512_cvtps_pd(_mm512_extractf32x8_ps(x, 1))));
  __m512 e = _mm512_insertf32x8(_mm512_castps256_ps512(e0), e1, 1);
  if (_mm512_cmp_ps_mask(_mm512_abs_ps(x), _mm512_set1_ps(88.0f), _CMP_NLT_UQ)) { /* rare: |x| >= 88 or NaN */
    e = _mm512_mask_mov_ps(e, _mm512_cmp_ps_mask(x, _mm512_set1_ps(X86_EXPF_OFLOW), _CMP_GT_OQ),
                           _mm512_set1_ps(INFINITY));
    e = _mm512_mask_mov_ps(e, _mm512_cmp_ps_mask(x, _mm512_set1_ps(X86_EXPF_MAY_UFLOW), _CMP_LT_OQ),
                           _mm512_set1_ps(X86_EXPF_LEAST));
    e = _mm512_mask_mov_ps(e, _mm512_cmp_ps_mask(x, _mm512_set1_ps(X86_EXPF_UFLOW), _CMP_LT_OQ), _mm512_setzero_ps());
    e = _mm512_mask_add_ps(e, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x, x);
  }
  return e;
}

/* As x86__silu_mul; the last d % 16 lanes masked. */
static void x512__silu_mul(int d, const float *g, const float *u, float *o) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512i sign = _mm512_set1_epi32(INT32_MIN);
  for (int k = 0; k < d; k += 16) {
    const __mmask16 m = d - k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (d - k)) - 1);
    const __m512 gv = _mm512_maskz_loadu_ps(m, g + k), uv = _mm512_maskz_loadu_ps(m, u + k);
    const __m512 e = x512__expf16(_mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(gv), sign)));
    _mm512_mask_storeu_ps(o + k, m, _mm512_mul_ps(_mm512_div_ps(gv, _mm512_add_ps(one, e)), uv));
  }
}

/* As x86__exp_shift; the last n % 16 lanes masked. */
static void x512__exp_shift(int n, const float *x, float m, float t, float *y) {
  const __m512 mv = _mm512_set1_ps(m), tv = _mm512_set1_ps(t);
  const bool div = t != 1.0f;
  for (int i = 0; i < n; i += 16) {
    const __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
    __m512 v = _mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), mv);
    _mm512_mask_storeu_ps(y + i, k, x512__expf16(div ? _mm512_div_ps(v, tv) : v));
  }
}
#endif
