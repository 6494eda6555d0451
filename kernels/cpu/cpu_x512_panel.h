/* cpu_x512_panel.h - the panel kernels (cpu.h, CPU_PANEL_ROWS) with
 * AVX-512 VNNI: included by cpu_avx512_vnni.c only.
 *
 * Per panel block, the 8 vectors of 4 columns x 16 rows (unsigned bytes)
 * are made once, then each activation row adds its 8 vpdpbusd against its
 * 4-byte groups broadcast, starting from its offset correction c: every
 * lane ends at its row's exact block sum. One conversion, one multiply by
 * d_w d_y and one fma per 16 rows and block follow, in the order
 * cpu__panel_gemm_scalar computes them: the same bits. */
#pragma once

#if !defined(__AVX512VNNI__)
#error "cpu_x512_panel.h needs AVX-512 VNNI"
#endif

#include <immintrin.h>

#include "kernels/cpu/cpu.h"

/* Bytes of a panel block (cpu__panel_block_bytes, as a constant). */
static inline __attribute__((always_inline)) size_t x512p__pbb(kern_type_t t) {
  return CPU_PANEL_ROWS * (t == KERN_Q8_0 ? sizeof(cpu_block_q8_0)
                           : t == KERN_Q5_0 ? sizeof(cpu_block_q5_0)
                           : t == KERN_Q4_1 ? sizeof(cpu_block_q4_1)
                                            : sizeof(cpu_block_q4_0));
}

/* The 8 column groups of one panel block as unsigned bytes, and its 16 d
 * (and m) as f32. */
typedef struct {
  __m512i v[8];
  __m512 d, m;
} x512p__block_t;

static inline __attribute__((always_inline)) void x512p__load(kern_type_t t, const uint8_t *pb, x512p__block_t *w) {
  w->d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)pb));
  const uint8_t *v = pb + 32;
  if (t == KERN_Q4_1) {
    w->m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)v));
    v += 32;
  }
  const uint8_t *hi = v;
  if (t == KERN_Q5_0) v += 64;
  if (t == KERN_Q8_0) {
    for (int g = 0; g < 8; g++) w->v[g] = _mm512_loadu_si512(v + 64 * g);
    return;
  }
  const __m512i lo4 = _mm512_set1_epi8(0x0F);
  for (int k = 0; k < 4; k++) {
    const __m512i b = _mm512_loadu_si512(v + 64 * k);
    w->v[2 * k] = _mm512_and_si512(b, lo4);
    w->v[2 * k + 1] = _mm512_and_si512(_mm512_srli_epi16(b, 4), lo4);
  }
  if (t == KERN_Q5_0) {
    const __m512i sixteen = _mm512_set1_epi8(16);
    for (int g = 0; g < 8; g++)
      w->v[g] = _mm512_mask_add_epi8(w->v[g], _load_mask64((__mmask64 *)(hi + 8 * g)), w->v[g], sixteen);
  }
}

/* The exact block sums of one activation block against the panel block:
 * two chains of four vpdpbusd, added. */
static inline __attribute__((always_inline)) __m512i x512p__isum(const x512p__block_t *w, const cpu_block_q8_p *y) {
  const int32_t *q = (const int32_t *)y->qs;
  __m512i s0 = _mm512_set1_epi32(y->c), s1 = _mm512_setzero_si512();
  for (int g = 0; g < 8; g += 2) {
    s0 = _mm512_dpbusd_epi32(s0, w->v[g], _mm512_set1_epi32(q[g]));
    s1 = _mm512_dpbusd_epi32(s1, w->v[g + 1], _mm512_set1_epi32(q[g + 1]));
  }
  return _mm512_add_epi32(s0, s1);
}

static inline __attribute__((always_inline)) void x512p__gemm(kern_type_t t, int na, int nb, const void *panel,
                                                              const cpu_block_q8_p *a, size_t a_stride, float *out,
                                                              size_t ld, const float *bias, size_t pf) {
  const size_t pbb = x512p__pbb(t);
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  for (int b = 0; b < nb; b++) {
    const uint8_t *pb = (const uint8_t *)panel + (size_t)b * pbb;
    if (pf)
      for (size_t o = 0; o < pbb; o += 64) __builtin_prefetch(pb + pf + o);
    x512p__block_t w;
    x512p__load(t, pb, &w);
    for (int j = 0; j < na; j++) {
      const cpu_block_q8_p *y = a + (size_t)j * a_stride + (size_t)b;
      const __m512 f = _mm512_cvtepi32_ps(x512p__isum(&w, y));
      acc[j] = _mm512_fmadd_ps(f, _mm512_mul_ps(w.d, _mm512_set1_ps(y->d)), acc[j]);
      if (t == KERN_Q4_1) acc[j] = _mm512_fmadd_ps(w.m, _mm512_set1_ps(y->s), acc[j]);
    }
  }
  const __m512 bv = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
  for (int j = 0; j < na; j++) _mm512_storeu_ps(out + (size_t)j * ld, bias ? _mm512_add_ps(acc[j], bv) : acc[j]);
}

/* One function per type; na a constant in each branch. */
#define X512P_GEMM(name, type) \
  static void name(int nb, const void *panel, const cpu_block_q8_p *a, size_t a_stride, int na, float *out, \
                   size_t ld, const float *bias, size_t pf) { \
    switch (na) { \
    case 1: x512p__gemm(type, 1, nb, panel, a, a_stride, out, ld, bias, pf); break; \
    case 2: x512p__gemm(type, 2, nb, panel, a, a_stride, out, ld, bias, pf); break; \
    case 3: x512p__gemm(type, 3, nb, panel, a, a_stride, out, ld, bias, pf); break; \
    default: x512p__gemm(type, 4, nb, panel, a, a_stride, out, ld, bias, pf); break; \
    } \
  }

X512P_GEMM(x512p__gemm_q4_0, KERN_Q4_0)
X512P_GEMM(x512p__gemm_q4_1, KERN_Q4_1)
X512P_GEMM(x512p__gemm_q5_0, KERN_Q5_0)
X512P_GEMM(x512p__gemm_q8_0, KERN_Q8_0)

#define X512P_PANEL_TABLE \
  { \
    [KERN_Q4_0] = x512p__gemm_q4_0, [KERN_Q4_1] = x512p__gemm_q4_1, [KERN_Q5_0] = x512p__gemm_q5_0, \
    [KERN_Q8_0] = x512p__gemm_q8_0, \
  }
