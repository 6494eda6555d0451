/* cpu_x86_panel.h - the panel kernels (cpu.h, CPU_PANEL_ROWS) with AVX2:
 * included by cpu_avx2.c and cpu_avx512.c (tables without VNNI).
 *
 * A panel's 64-byte vectors are two 256-bit halves of 8 rows each, done one
 * after the other. Without vpdpbusd the products are vpmaddubsw's (u8 x s8
 * -> s16 pairs) summed in 16 bits over as many column groups as cannot
 * overflow (the weights' unsigned values are at most 15, 31 or 63, the
 * activations within +-127: a pair at most 3810, 7874 or 16002, so 8, 4 or
 * 2 groups), then vpmaddwd by ones into 32-bit lanes: each row's exact
 * block sum, as the VNNI kernels get it. What follows is
 * cpu__panel_gemm_scalar's float arithmetic in its order: the same bits.
 * Q8_0's unsigned values reach 255, which vpmaddubsw would saturate: its
 * weights stay in rows on these tables. */
#pragma once

#include <immintrin.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

#define X86P_INLINE static inline __attribute__((always_inline))

/* Column groups that may be summed in 16 bits (see above). */
X86P_INLINE int x86p__chunk(kern_type_t t) { return t == KERN_Q6_K ? 2 : t == KERN_Q5_0 ? 4 : 8; }

X86P_INLINE void x86p__prefetch(const uint8_t *pb, size_t bytes, size_t pf) {
  if (pf)
    for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(pb + pf + o);
}

/* Half h (rows 8h..8h+7) of nibble vector k: column groups 2k and 2k + 1. */
X86P_INLINE void x86p__nibbles(const uint8_t *v, int k, int h, __m256i *lo, __m256i *hi) {
  const __m256i m = _mm256_set1_epi8(0x0F), b = _mm256_loadu_si256((const __m256i *)(v + 64 * k + 32 * h));
  *lo = _mm256_and_si256(b, m);
  *hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), m);
}

/* `add` in the bytes whose bit (of half h of the 64-bit mask at p) is set. */
X86P_INLINE __m256i x86p__hibit(__m256i w, const uint64_t *p, int h, int add) {
  uint32_t bits;
  memcpy(&bits, (const uint8_t *)p + 4 * h, sizeof bits);
  const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
  __m256i x = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), shuf);
  x = _mm256_or_si256(x, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)); /* all ones where the byte's bit is set */
  const __m256i on = _mm256_cmpeq_epi8(x, _mm256_set1_epi64x(-1));
  return _mm256_or_si256(w, _mm256_and_si256(on, _mm256_set1_epi8((char)add)));
}

typedef int32_t x86p__i32_alias __attribute__((may_alias, aligned(1)));

/* c + the 8 rows' exact sums of n groups w[g] . the activation's bytes
 * q[4g..4g+3], summed in 16 bits chunk groups at a time. */
X86P_INLINE __m256i x86p__dot(const __m256i *w, const int8_t *q, int n, int chunk, int32_t c) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i s = _mm256_set1_epi32(c);
  for (int g0 = 0; g0 < n; g0 += chunk) {
    __m256i p = _mm256_maddubs_epi16(w[g0], _mm256_set1_epi32(*(const x86p__i32_alias *)(q + 4 * g0)));
    for (int g = g0 + 1; g < g0 + chunk && g < n; g++)
      p = _mm256_add_epi16(p, _mm256_maddubs_epi16(w[g], _mm256_set1_epi32(*(const x86p__i32_alias *)(q + 4 * g))));
    s = _mm256_add_epi32(s, _mm256_madd_epi16(p, ones));
  }
  return s;
}

X86P_INLINE __m256 x86p__f16x8(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

/* ---- 32-element types (Q4_0, Q4_1, Q5_0) ---- */

/* Half h, activation rows [j0, j0 + na) (na <= 2): acc[j] over all blocks. */
X86P_INLINE void x86p__gemm32(kern_type_t t, int na, int h, int nb, const uint8_t *panel, const uint8_t *a,
                              size_t a_stride, __m256 *acc, size_t pf) {
  const size_t pbb = cpu_panel_block_bytes(t);
  for (int b = 0; b < nb; b++) {
    const uint8_t *pb = panel + (size_t)b * pbb;
    x86p__prefetch(pb, pbb, pf);
    const uint64_t *hi = (const uint64_t *)(pb + CPU_PANEL_HEAD);
    const uint8_t *v = pb + cpu_panel_values32(t);
    __m256i w[8];
    _Pragma("GCC unroll 8")
    for (int k = 0; k < 4; k++) x86p__nibbles(v, k, h, &w[2 * k], &w[2 * k + 1]);
    if (t == KERN_Q5_0) {
      _Pragma("GCC unroll 8")
      for (int g = 0; g < 8; g++) w[g] = x86p__hibit(w[g], hi + g, h, 16);
    }
    const __m256 wd = x86p__f16x8(pb + 16 * h);
    _Pragma("GCC unroll 2")
    for (int j = 0; j < na; j++) {
      const cpu_block_q8_p *y = (const cpu_block_q8_p *)(a + (size_t)j * a_stride) + b;
      const __m256 f = _mm256_cvtepi32_ps(x86p__dot(w, y->qs, 8, x86p__chunk(t), y->c));
      acc[j] = _mm256_fmadd_ps(f, _mm256_mul_ps(wd, _mm256_set1_ps(y->d)), acc[j]);
      if (t == KERN_Q4_1) acc[j] = _mm256_fmadd_ps(x86p__f16x8(pb + CPU_PANEL_HEAD + 16 * h), _mm256_set1_ps(y->s), acc[j]);
    }
  }
}

/* ---- K-quants ---- */

X86P_INLINE void x86p__gemm_q4_K_half(int na, int h, int nb, const uint8_t *panel, const uint8_t *a, size_t a_stride,
                                      __m256 *acc, size_t pf) {
  const size_t pbb = cpu_panel_block_bytes(KERN_Q4_K);
  for (int b = 0; b < nb; b++) {
    const uint8_t *pb = panel + (size_t)b * pbb, *sc = pb + CPU_PANEL_Q4K_SC, *mk = pb + CPU_PANEL_Q4K_M,
                  *v = pb + CPU_PANEL_Q4K_V;
    x86p__prefetch(pb, pbb, pf);
    const cpu_block_q8_kp *y[2];
    __m256 t[2], mm[2];
    for (int j = 0; j < na; j++) {
      y[j] = (const cpu_block_q8_kp *)(a + (size_t)j * a_stride) + b;
      t[j] = _mm256_setzero_ps(), mm[j] = _mm256_setzero_ps();
    }
    _Pragma("GCC unroll 8")
    for (int s = 0; s < 8; s++) {
      const __m256 scf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(sc + 16 * s + 8 * h))));
      const __m256 mf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(mk + 16 * s + 8 * h))));
      __m256i w[8];
      _Pragma("GCC unroll 8")
      for (int k = 0; k < 4; k++) x86p__nibbles(v, 4 * s + k, h, &w[2 * k], &w[2 * k + 1]);
      _Pragma("GCC unroll 2")
      for (int j = 0; j < na; j++) {
        const __m256 f = _mm256_cvtepi32_ps(x86p__dot(w, y[j]->qs + 32 * s, 8, 8, 0));
        t[j] = _mm256_fmadd_ps(f, scf, t[j]);
        mm[j] = _mm256_fmadd_ps(mf, _mm256_set1_ps(y[j]->bs[s]), mm[j]);
      }
    }
    const __m256 wd = x86p__f16x8(pb + 16 * h), wdm = x86p__f16x8(pb + CPU_PANEL_HEAD + 16 * h);
    for (int j = 0; j < na; j++) {
      acc[j] = _mm256_fmadd_ps(t[j], _mm256_mul_ps(wd, _mm256_set1_ps(y[j]->d)), acc[j]);
      acc[j] = _mm256_fnmadd_ps(mm[j], _mm256_mul_ps(wdm, _mm256_set1_ps(y[j]->d)), acc[j]);
    }
  }
}

X86P_INLINE void x86p__gemm_q6_K_half(int na, int h, int nb, const uint8_t *panel, const uint8_t *a, size_t a_stride,
                                      __m256 *acc, size_t pf) {
  const size_t pbb = cpu_panel_block_bytes(KERN_Q6_K);
  for (int b = 0; b < nb; b++) {
    const uint8_t *pb = panel + (size_t)b * pbb, *sc = pb + CPU_PANEL_HEAD, *v = pb + CPU_PANEL_Q6K_V;
    x86p__prefetch(pb, pbb, pf);
    const uint64_t *h4 = (const uint64_t *)(pb + CPU_PANEL_Q6K_H4), *h5 = (const uint64_t *)(pb + CPU_PANEL_Q6K_H5);
    const cpu_block_q8_kp *y[2];
    __m256 t[2];
    for (int j = 0; j < na; j++) {
      y[j] = (const cpu_block_q8_kp *)(a + (size_t)j * a_stride) + b;
      t[j] = _mm256_setzero_ps();
    }
    _Pragma("GCC unroll 16")
    for (int s = 0; s < 16; s++) {
      const __m256 scf = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(sc + 16 * s + 8 * h))));
      __m256i w[4];
      x86p__nibbles(v, 2 * s, h, &w[0], &w[1]);
      x86p__nibbles(v, 2 * s + 1, h, &w[2], &w[3]);
      _Pragma("GCC unroll 4")
      for (int g = 0; g < 4; g++) w[g] = x86p__hibit(x86p__hibit(w[g], h4 + 4 * s + g, h, 16), h5 + 4 * s + g, h, 32);
      _Pragma("GCC unroll 2")
      for (int j = 0; j < na; j++) {
        const __m256 f = _mm256_cvtepi32_ps(x86p__dot(w, y[j]->qs + 16 * s, 4, 2, y[j]->c[s]));
        t[j] = _mm256_fmadd_ps(f, scf, t[j]);
      }
    }
    const __m256 wd = x86p__f16x8(pb + 16 * h);
    for (int j = 0; j < na; j++) acc[j] = _mm256_fmadd_ps(t[j], _mm256_mul_ps(wd, _mm256_set1_ps(y[j]->d)), acc[j]);
  }
}

/* ---- the table's entries: both halves, activation rows 2 at a time ---- */

X86P_INLINE void x86p__half(kern_type_t t, int na, int h, int nb, const uint8_t *panel, const uint8_t *a,
                            size_t a_stride, __m256 *acc, size_t pf) {
  switch (t) {
  case KERN_Q4_K: x86p__gemm_q4_K_half(na, h, nb, panel, a, a_stride, acc, pf); break;
  case KERN_Q6_K: x86p__gemm_q6_K_half(na, h, nb, panel, a, a_stride, acc, pf); break;
  default: x86p__gemm32(t, na, h, nb, panel, a, a_stride, acc, pf); break;
  }
}

X86P_INLINE void x86p__gemm(kern_type_t t, int nb, const void *panel, const void *a, size_t a_stride, int na,
                            float *out, size_t ld, const float *bias, size_t pf) {
  for (int j0 = 0; j0 < na; j0 += 2) {
    const int n2 = na - j0 < 2 ? 1 : 2;
    const uint8_t *aj = (const uint8_t *)a + (size_t)j0 * a_stride;
    for (int h = 0; h < 2; h++) {
      __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
      const size_t first = j0 == 0 && h == 0 ? pf : 0; /* the pass that brings the panel into cache */
      if (n2 == 1) x86p__half(t, 1, h, nb, panel, aj, a_stride, acc, first);
      else x86p__half(t, 2, h, nb, panel, aj, a_stride, acc, first);
      const __m256 bv = bias ? _mm256_loadu_ps(bias + 8 * h) : _mm256_setzero_ps();
      for (int j = 0; j < n2; j++)
        _mm256_storeu_ps(out + (size_t)(j0 + j) * ld + 8 * h, bias ? _mm256_add_ps(acc[j], bv) : acc[j]);
    }
  }
}

#define X86P_GEMM(name, type) \
  static void name(int nb, const void *panel, const void *a, size_t a_stride, int na, float *out, size_t ld, \
                   const float *bias, size_t pf) { \
    x86p__gemm(type, nb, panel, a, a_stride, na, out, ld, bias, pf); \
  }
X86P_GEMM(x86p__gemm_q4_0, KERN_Q4_0)
X86P_GEMM(x86p__gemm_q4_1, KERN_Q4_1)
X86P_GEMM(x86p__gemm_q5_0, KERN_Q5_0)
X86P_GEMM(x86p__gemm_q4_K, KERN_Q4_K)
X86P_GEMM(x86p__gemm_q6_K, KERN_Q6_K)

#define X86P_PANEL_TABLE \
  { \
    [KERN_Q4_0] = x86p__gemm_q4_0, [KERN_Q4_1] = x86p__gemm_q4_1, [KERN_Q5_0] = x86p__gemm_q5_0, \
    [KERN_Q4_K] = x86p__gemm_q4_K, [KERN_Q6_K] = x86p__gemm_q6_K, \
  }
