/* cpu_x512_panel.h - the panel kernels (cpu.h, CPU_PANEL_ROWS) with
 * AVX-512 VNNI: included by cpu_avx512_vnni.c only.
 *
 * Per panel (sub-)block, the vectors of 4 columns x 16 rows (unsigned
 * bytes) are made once, then each activation row adds its vpdpbusd against
 * its 4-byte groups broadcast, starting from its offset correction: every
 * lane ends at its row's exact (sub-)block sum. The conversions, scalings
 * and fmas that follow are cpu__panel_gemm_scalar's, in its order: the same
 * bits. Loops over column groups, sub-blocks and activation rows are
 * unrolled (GCC's -O2 keeps them rolled, with the accumulators in memory). */
#pragma once

#if !defined(__AVX512VNNI__)
#error "cpu_x512_panel.h needs AVX-512 VNNI"
#endif

#include <immintrin.h>

#include "kernels/cpu/cpu.h"

#define X512P_INLINE static inline __attribute__((always_inline))

X512P_INLINE void x512p__prefetch(const uint8_t *pb, size_t bytes, size_t pf) {
  if (pf)
    for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(pb + pf + o);
}

/* Column groups 2k and 2k + 1 from the nibble vector k of v. */
X512P_INLINE void x512p__nibbles(const uint8_t *v, int k, __m512i *lo, __m512i *hi) {
  const __m512i m = _mm512_set1_epi8(0x0F), b = _mm512_loadu_si512(v + 64 * k);
  *lo = _mm512_and_si512(b, m);
  *hi = _mm512_and_si512(_mm512_srli_epi16(b, 4), m);
}

/* Adds `add` to the bytes of w that the 64-bit mask at h sets. */
X512P_INLINE __m512i x512p__hibit(__m512i w, const uint64_t *h, int add) {
  return _mm512_mask_add_epi8(w, _load_mask64((__mmask64 *)h), w, _mm512_set1_epi8((char)add));
}

/* The 4 activation bytes at q as one int32, broadcast: read through a
 * may_alias type (they are int8_t), which folds into vpdpbusd's {1to16}
 * memory operand. */
typedef int32_t x512p__i32_alias __attribute__((may_alias, aligned(1)));
X512P_INLINE __m512i x512p__bcast4(const int8_t *q) { return _mm512_set1_epi32(*(const x512p__i32_alias *)q); }

/* sum over n groups (even) of w[g] . the 4 bytes q[4g..4g+3], from c: two
 * chains, or one (one_chain) where the caller interleaves enough
 * activation rows to hide its latency, which saves the add that joins
 * two (integer sums: the same result either way). Measured (bench_matmul,
 * 16 rows, docs/bench/cpu-model.md): Q6_K's 4 groups up to 13% faster in
 * one chain, Q4_K's 8 groups 4-7% slower. */
X512P_INLINE __m512i x512p__dot(const __m512i *w, const int8_t *q, int n, int32_t c, bool one_chain) {
  if (one_chain) {
    __m512i s = _mm512_set1_epi32(c);
    _Pragma("GCC unroll 16")
    for (int g = 0; g < n; g++) s = _mm512_dpbusd_epi32(s, w[g], x512p__bcast4(q + 4 * g));
    return s;
  }
  __m512i s0 = _mm512_set1_epi32(c), s1 = _mm512_setzero_si512();
  _Pragma("GCC unroll 16")
  for (int g = 0; g < n; g += 2) {
    s0 = _mm512_dpbusd_epi32(s0, w[g], x512p__bcast4(q + 4 * g));
    s1 = _mm512_dpbusd_epi32(s1, w[g + 1], x512p__bcast4(q + 4 * g + 4));
  }
  return _mm512_add_epi32(s0, s1);
}

X512P_INLINE void x512p__zero(int na, __m512 *acc) {
  _Pragma("GCC unroll 16")
  for (int j = 0; j < na; j++) acc[j] = _mm512_setzero_ps();
}

X512P_INLINE void x512p__store(int na, const __m512 *acc, float *out, size_t ld, const float *bias) {
  const __m512 bv = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
  _Pragma("GCC unroll 16")
  for (int j = 0; j < na; j++) _mm512_storeu_ps(out + (size_t)j * ld, bias ? _mm512_add_ps(acc[j], bv) : acc[j]);
}

/* ---- 32-element types ---- */

/* The 8 column groups of one panel block as unsigned bytes. */
X512P_INLINE void x512p__load32(kern_type_t t, const uint8_t *v, const uint64_t *hi, __m512i *w) {
  if (t == KERN_Q8_0) {
    _Pragma("GCC unroll 16")
    for (int g = 0; g < 8; g++) w[g] = _mm512_loadu_si512(v + 64 * g);
    return;
  }
  _Pragma("GCC unroll 16")
  for (int k = 0; k < 4; k++) x512p__nibbles(v, k, &w[2 * k], &w[2 * k + 1]);
  if (t == KERN_Q5_0)
    _Pragma("GCC unroll 16")
    for (int g = 0; g < 8; g++) w[g] = x512p__hibit(w[g], hi + g, 16);
}

X512P_INLINE void x512p__gemm32(kern_type_t t, int na, int nb, const void *panel, const void *a, size_t a_stride,
                                float *out, size_t ld, const float *bias, size_t pf) {
  const size_t pbb = cpu_panel_block_bytes(t);
  __m512 acc[CPU_PANEL_TILE];
  x512p__zero(na, acc);
  for (int b = 0; b < nb; b++) {
    const uint8_t *pb = (const uint8_t *)panel + (size_t)b * pbb;
    x512p__prefetch(pb, pbb, pf);
    const __m512 wd = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)pb));
    const __m512 wm = t == KERN_Q4_1 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(pb + CPU_PANEL_HEAD)))
                                     : _mm512_setzero_ps();
    const uint8_t *v = pb + cpu_panel_values32(t);
    __m512i w[8];
    x512p__load32(t, v, (const uint64_t *)(pb + CPU_PANEL_HEAD), w);
    _Pragma("GCC unroll 16")
    for (int j = 0; j < na; j++) {
      const cpu_block_q8_p *y = (const cpu_block_q8_p *)((const uint8_t *)a + (size_t)j * a_stride) + b;
      const __m512 f = _mm512_cvtepi32_ps(x512p__dot(w, y->qs, 8, y->c, false));
      acc[j] = _mm512_fmadd_ps(f, _mm512_mul_ps(wd, _mm512_set1_ps(y->d)), acc[j]);
      if (t == KERN_Q4_1) acc[j] = _mm512_fmadd_ps(wm, _mm512_set1_ps(y->s), acc[j]);
    }
  }
  x512p__store(na, acc, out, ld, bias);
}

/* ---- K-quants ---- */

/* Q4_K: per sub-block s (32 elements, nibble vectors 4s..4s+3), t += isum *
 * sc and mm += m * bs; then acc = fma(t, d dy, acc), acc -= mm dmin dy. */
X512P_INLINE void x512p__gemm_q4_K_n(int na, int nb, const void *panel, const void *a, size_t a_stride, float *out,
                                     size_t ld, const float *bias, size_t pf) {
  const size_t pbb = cpu_panel_block_bytes(KERN_Q4_K);
  __m512 acc[CPU_PANEL_TILE];
  x512p__zero(na, acc);
  for (int b = 0; b < nb; b++) {
    const uint8_t *pb = (const uint8_t *)panel + (size_t)b * pbb, *sc = pb + CPU_PANEL_Q4K_SC, *mk = pb + CPU_PANEL_Q4K_M,
                  *v = pb + CPU_PANEL_Q4K_V;
    x512p__prefetch(pb, pbb, pf);
    const cpu_block_q8_kp *y[CPU_PANEL_TILE];
    __m512 t[CPU_PANEL_TILE], mm[CPU_PANEL_TILE];
    _Pragma("GCC unroll 16")
    for (int j = 0; j < na; j++) {
      y[j] = (const cpu_block_q8_kp *)((const uint8_t *)a + (size_t)j * a_stride) + b;
      t[j] = _mm512_setzero_ps(), mm[j] = _mm512_setzero_ps();
    }
    _Pragma("GCC unroll 16")
    for (int s = 0; s < 8; s++) {
      const __m512 scf = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(sc + 16 * s))));
      const __m512 mf = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(mk + 16 * s))));
      __m512i w[8];
      _Pragma("GCC unroll 16")
      for (int k = 0; k < 4; k++) x512p__nibbles(v, 4 * s + k, &w[2 * k], &w[2 * k + 1]);
      _Pragma("GCC unroll 16")
      for (int j = 0; j < na; j++) {
        const __m512 f = _mm512_cvtepi32_ps(x512p__dot(w, y[j]->qs + 32 * s, 8, 0, false));
        t[j] = _mm512_fmadd_ps(f, scf, t[j]);
        mm[j] = _mm512_fmadd_ps(mf, _mm512_set1_ps(y[j]->bs[s]), mm[j]);
      }
    }
    const __m512 wd = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)pb));
    const __m512 wdm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(pb + CPU_PANEL_HEAD)));
    _Pragma("GCC unroll 16")
    for (int j = 0; j < na; j++) {
      acc[j] = _mm512_fmadd_ps(t[j], _mm512_mul_ps(wd, _mm512_set1_ps(y[j]->d)), acc[j]);
      acc[j] = _mm512_fnmadd_ps(mm[j], _mm512_mul_ps(wdm, _mm512_set1_ps(y[j]->d)), acc[j]);
    }
  }
  x512p__store(na, acc, out, ld, bias);
}

/* Q6_K: per sub-block s (16 elements, nibble vectors 2s, 2s + 1, bit
 * groups 4s..4s+3), t += (isum - 32 bsum) * sc; then acc = fma(t, d dy, acc). */
X512P_INLINE void x512p__gemm_q6_K_n(int na, int nb, const void *panel, const void *a, size_t a_stride, float *out,
                                     size_t ld, const float *bias, size_t pf) {
  const size_t pbb = cpu_panel_block_bytes(KERN_Q6_K);
  __m512 acc[CPU_PANEL_TILE];
  x512p__zero(na, acc);
  for (int b = 0; b < nb; b++) {
    const uint8_t *pb = (const uint8_t *)panel + (size_t)b * pbb, *sc = pb + CPU_PANEL_HEAD, *v = pb + CPU_PANEL_Q6K_V;
    const uint64_t *h4 = (const uint64_t *)(pb + CPU_PANEL_Q6K_H4), *h5 = (const uint64_t *)(pb + CPU_PANEL_Q6K_H5);
    x512p__prefetch(pb, pbb, pf);
    const cpu_block_q8_kp *y[CPU_PANEL_TILE];
    __m512 t[CPU_PANEL_TILE];
    _Pragma("GCC unroll 16")
    for (int j = 0; j < na; j++) {
      y[j] = (const cpu_block_q8_kp *)((const uint8_t *)a + (size_t)j * a_stride) + b;
      t[j] = _mm512_setzero_ps();
    }
    _Pragma("GCC unroll 16")
    for (int s = 0; s < 16; s++) {
      const __m512 scf = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(sc + 16 * s))));
      __m512i w[4];
      x512p__nibbles(v, 2 * s, &w[0], &w[1]);
      x512p__nibbles(v, 2 * s + 1, &w[2], &w[3]);
      _Pragma("GCC unroll 16")
      for (int g = 0; g < 4; g++) w[g] = x512p__hibit(x512p__hibit(w[g], h4 + 4 * s + g, 16), h5 + 4 * s + g, 32);
      _Pragma("GCC unroll 16")
      for (int j = 0; j < na; j++) {
        const __m512 f = _mm512_cvtepi32_ps(x512p__dot(w, y[j]->qs + 16 * s, 4, y[j]->c[s], na >= 4));
        t[j] = _mm512_fmadd_ps(f, scf, t[j]);
      }
    }
    const __m512 wd = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)pb));
    _Pragma("GCC unroll 16")
    for (int j = 0; j < na; j++) acc[j] = _mm512_fmadd_ps(t[j], _mm512_mul_ps(wd, _mm512_set1_ps(y[j]->d)), acc[j]);
  }
  x512p__store(na, acc, out, ld, bias);
}

/* One function per type, na a constant in each branch. */
#define X512P_GEMM(name, body) \
  static void name(int nb, const void *panel, const void *a, size_t a_stride, int na, float *out, size_t ld, \
                   const float *bias, size_t pf) { \
    switch (na) { \
    case 1: body(1); break; \
    case 2: body(2); break; \
    case 3: body(3); break; \
    case 4: body(4); break; \
    case 5: body(5); break; \
    case 6: body(6); break; \
    case 7: body(7); break; \
    default: body(8); break; \
    } \
  }
#define X512P_Q4_0(n) x512p__gemm32(KERN_Q4_0, n, nb, panel, a, a_stride, out, ld, bias, pf)
#define X512P_Q4_1(n) x512p__gemm32(KERN_Q4_1, n, nb, panel, a, a_stride, out, ld, bias, pf)
#define X512P_Q5_0(n) x512p__gemm32(KERN_Q5_0, n, nb, panel, a, a_stride, out, ld, bias, pf)
#define X512P_Q8_0(n) x512p__gemm32(KERN_Q8_0, n, nb, panel, a, a_stride, out, ld, bias, pf)
#define X512P_Q4_K(n) x512p__gemm_q4_K_n(n, nb, panel, a, a_stride, out, ld, bias, pf)
#define X512P_Q6_K(n) x512p__gemm_q6_K_n(n, nb, panel, a, a_stride, out, ld, bias, pf)
X512P_GEMM(x512p__gemm_q4_0, X512P_Q4_0)
X512P_GEMM(x512p__gemm_q4_1, X512P_Q4_1)
X512P_GEMM(x512p__gemm_q5_0, X512P_Q5_0)
X512P_GEMM(x512p__gemm_q8_0, X512P_Q8_0)
X512P_GEMM(x512p__gemm_q4_K, X512P_Q4_K)
X512P_GEMM(x512p__gemm_q6_K, X512P_Q6_K)

#define X512P_PANEL_TABLE \
  { \
    [KERN_Q4_0] = x512p__gemm_q4_0, [KERN_Q4_1] = x512p__gemm_q4_1, [KERN_Q5_0] = x512p__gemm_q5_0, \
    [KERN_Q8_0] = x512p__gemm_q8_0, [KERN_Q4_K] = x512p__gemm_q4_K, [KERN_Q6_K] = x512p__gemm_q6_K, \
  }
