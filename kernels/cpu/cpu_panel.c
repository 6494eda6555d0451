/* cpu_panel.c - the panel layout of quantized weights (cpu.h,
 * CPU_PANEL_ROWS): packing rows into panels at load, the activation blocks
 * panels dot with, and the panel numerics in plain C, the reference for the
 * vector kernels (cpu_x512_panel.h). */
#include <math.h>
#include <string.h>

#include "common/fr_util.h"
#include "kernels/cpu/cpu.h"

size_t cpu__panel_act_bytes(kern_type_t t) {
  return t == KERN_Q4_K || t == KERN_Q6_K ? sizeof(cpu_block_q8_kp) : sizeof(cpu_block_q8_p);
}

/* The offset a panel's unsigned values carry: value = d (u - off). */
static int cpu__panel_off(kern_type_t t) {
  switch (t) {
  case KERN_Q8_0: return 128;
  case KERN_Q4_0: return 8;
  case KERN_Q5_0: return 16;
  default: return 0;
  }
}

/* The parts of a panel block, in the order cpu.h gives. */
typedef struct {
  uint16_t *d, *m;   /* m: Q4_1's m, Q4_K's dmin */
  uint8_t *sc, *mk;  /* Q4_K: sc[8][16], m[8][16]; Q6_K: sc[16][16] (int8) */
  uint64_t *h4, *h5; /* the fifth (Q5_0, Q6_K) and sixth (Q6_K) bits */
  uint8_t *v;
} cpu_panel_parts_t;

static cpu_panel_parts_t cpu__panel_parts(kern_type_t t, const void *block) {
  uint8_t *b = (uint8_t *)block;
  cpu_panel_parts_t p = {.d = (uint16_t *)b};
  switch (t) {
  case KERN_Q4_1: p.m = (uint16_t *)(b + CPU_PANEL_HEAD); break;
  case KERN_Q5_0: p.h4 = (uint64_t *)(b + CPU_PANEL_HEAD); break;
  case KERN_Q4_K:
    p.m = (uint16_t *)(b + CPU_PANEL_HEAD);
    p.sc = b + CPU_PANEL_Q4K_SC, p.mk = b + CPU_PANEL_Q4K_M, p.v = b + CPU_PANEL_Q4K_V;
    return p;
  case KERN_Q6_K:
    p.sc = b + CPU_PANEL_HEAD;
    p.h4 = (uint64_t *)(b + CPU_PANEL_Q6K_H4), p.h5 = (uint64_t *)(b + CPU_PANEL_Q6K_H5), p.v = b + CPU_PANEL_Q6K_V;
    return p;
  default: break;
  }
  p.v = b + cpu_panel_values32(t);
  return p;
}

/* ---- one row's block, unpacked ---- */

/* A block's unsigned values (q[e] < 256) and, for the K-quants, its
 * sub-blocks' scales and mins. */
typedef struct {
  uint16_t d, m;
  uint8_t q[256];
  int sc[16], mn[8];
} cpu_panel_row_t;

/* Element e's low four bits in a Q4_0/Q4_1/Q5_0 block's qs (ggml: element
 * e < 16 in the low nibble of qs[e], e >= 16 in the high one of qs[e - 16]). */
static inline uint8_t cpu__nibble(const uint8_t *qs, int e) { return e < 16 ? qs[e] & 0x0F : qs[e - 16] >> 4; }

/* 6-bit scale and min of sub-block j of a Q4_K super-block (ggml's
 * get_scale_min_k4). */
static void cpu__scale_min_k4(int j, const uint8_t *s, int *sc, int *m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

static void cpu__panel_unpack_q4_K(const cpu_block_q4_K *x, cpu_panel_row_t *u) {
  u->d = x->d, u->m = x->dmin;
  for (int j = 0; j < 8; j++) cpu__scale_min_k4(j, x->scales, &u->sc[j], &u->mn[j]);
  for (int c = 0; c < 4; c++)
    for (int l = 0; l < 32; l++) {
      u->q[64 * c + l] = x->qs[32 * c + l] & 15;
      u->q[64 * c + 32 + l] = x->qs[32 * c + l] >> 4;
    }
}

static void cpu__panel_unpack_q6_K(const cpu_block_q6_K *x, cpu_panel_row_t *u) {
  u->d = x->d;
  for (int j = 0; j < 16; j++) u->sc[j] = x->scales[j];
  for (int h = 0; h < 2; h++) {
    const uint8_t *ql = x->ql + 64 * h, *qh = x->qh + 32 * h;
    uint8_t *q = u->q + 128 * h;
    for (int l = 0; l < 32; l++) {
      q[l] = (uint8_t)((ql[l] & 15) | ((qh[l] >> 0) & 3) << 4);
      q[l + 32] = (uint8_t)((ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4);
      q[l + 64] = (uint8_t)((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4);
      q[l + 96] = (uint8_t)((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4);
    }
  }
}

static void cpu__panel_unpack(kern_type_t t, const uint8_t *blk, cpu_panel_row_t *u) {
  switch (t) {
  case KERN_Q8_0: {
    const cpu_block_q8_0 *x = (const cpu_block_q8_0 *)blk;
    u->d = x->d;
    for (int e = 0; e < CPU_QK; e++) u->q[e] = (uint8_t)x->qs[e] ^ 0x80;
    return;
  }
  case KERN_Q4_0: {
    const cpu_block_q4_0 *x = (const cpu_block_q4_0 *)blk;
    u->d = x->d;
    for (int e = 0; e < CPU_QK; e++) u->q[e] = cpu__nibble(x->qs, e);
    return;
  }
  case KERN_Q4_1: {
    const cpu_block_q4_1 *x = (const cpu_block_q4_1 *)blk;
    u->d = x->d, u->m = x->m;
    for (int e = 0; e < CPU_QK; e++) u->q[e] = cpu__nibble(x->qs, e);
    return;
  }
  case KERN_Q5_0: {
    const cpu_block_q5_0 *x = (const cpu_block_q5_0 *)blk;
    uint32_t qh;
    memcpy(&qh, x->qh, sizeof qh);
    u->d = x->d;
    for (int e = 0; e < CPU_QK; e++) u->q[e] = (uint8_t)(cpu__nibble(x->qs, e) | (qh >> e & 1) << 4);
    return;
  }
  case KERN_Q4_K: cpu__panel_unpack_q4_K((const cpu_block_q4_K *)blk, u); return;
  case KERN_Q6_K: cpu__panel_unpack_q6_K((const cpu_block_q6_K *)blk, u); return;
  default: return;
  }
}

/* Row r's unpacked block into its place in the panel block. */
static void cpu__panel_put(kern_type_t t, int blck, const cpu_panel_row_t *u, int r, const cpu_panel_parts_t *p) {
  p->d[r] = u->d;
  if (p->m) p->m[r] = u->m;
  if (t == KERN_Q4_K)
    for (int j = 0; j < 8; j++) p->sc[16 * j + r] = (uint8_t)u->sc[j], p->mk[16 * j + r] = (uint8_t)u->mn[j];
  if (t == KERN_Q6_K)
    for (int j = 0; j < 16; j++) p->sc[16 * j + r] = (uint8_t)(int8_t)u->sc[j];
  if (t == KERN_Q8_0) {
    for (int g = 0; g < blck / 4; g++) memcpy(p->v + g * 64 + r * 4, u->q + 4 * g, 4);
    return;
  }
  /* byte i of row r in nibble vector k: elements 8k + i (low) and 8k + 4 + i (high) */
  for (int k = 0; k < blck / 8; k++)
    for (int i = 0; i < 4; i++)
      p->v[k * 64 + r * 4 + i] = (uint8_t)((u->q[8 * k + i] & 15) | (u->q[8 * k + 4 + i] & 15) << 4);
  /* bits 4 and 5 of group g's 4 elements, at bits 4r..4r+3 of h4[g] and h5[g] */
  for (int g = 0; p->h4 && g < blck / 4; g++) {
    uint64_t b4 = 0, b5 = 0;
    for (int i = 0; i < 4; i++) {
      b4 |= (uint64_t)(u->q[4 * g + i] >> 4 & 1) << i;
      b5 |= (uint64_t)(u->q[4 * g + i] >> 5 & 1) << i;
    }
    p->h4[g] |= b4 << (4 * r);
    if (p->h5) p->h5[g] |= b5 << (4 * r);
  }
}

void cpu__panel_pack(const kern_weight_t *w, const void *src, long p, void *dst) {
  const int blck = kern_type_traits(w->type)->blck, nb = (int)(w->cols / blck);
  const size_t bs = kern_type_traits(w->type)->size, pbb = cpu_panel_block_bytes(w->type);
  uint8_t *out = (uint8_t *)dst + (size_t)p * (size_t)nb * pbb;
  memset(out, 0, (size_t)nb * pbb);
  cpu_panel_row_t u = {0};
  for (int b = 0; b < nb; b++) {
    const cpu_panel_parts_t parts = cpu__panel_parts(w->type, out + (size_t)b * pbb);
    for (int r = 0; r < CPU_PANEL_ROWS; r++) {
      const uint8_t *row = (const uint8_t *)src + (size_t)(p * CPU_PANEL_ROWS + r) * w->row_bytes;
      cpu__panel_unpack(w->type, row + (size_t)b * bs, &u);
      cpu__panel_put(w->type, blck, &u, r, &parts);
    }
  }
}

/* ---- activations ---- */

static void cpu__panel_quantize_k(cpu_quantize_fn quant, const float *x, cpu_block_q8_kp *y, int n) {
  for (int i = 0; i < n / CPU_QK_K; i++) {
    cpu_block_q8_K q;
    quant(x + (size_t)i * CPU_QK_K, &q, CPU_QK_K);
    y[i].d = q.d;
    for (int j = 0; j < 16; j++) y[i].c[j] = -32 * q.bsums[j];
    for (int j = 0; j < 8; j++) y[i].bs[j] = (float)(q.bsums[2 * j] + q.bsums[2 * j + 1]);
    memcpy(y[i].qs, q.qs, sizeof q.qs);
  }
}

void cpu__panel_quantize(cpu_quantize_fn quant, kern_type_t t, const float *x, void *vy, int n) {
  if (t == KERN_Q4_K || t == KERN_Q6_K) {
    cpu__panel_quantize_k(quant, x, vy, n);
    return;
  }
  cpu_block_q8_p *y = vy;
  const int off = cpu__panel_off(t);
  for (int i = 0; i < n / CPU_QK; i++) {
    const int8_t *qs;
    cpu_block_q8_0 q0;
    cpu_block_q8_1 q1;
    if (t == KERN_Q4_1) {
      quant(x + (size_t)i * CPU_QK, &q1, CPU_QK);
      y[i].d = fr_fp16_to_fp32(q1.d);
      y[i].s = fr_fp16_to_fp32(q1.s);
      qs = q1.qs;
    } else {
      quant(x + (size_t)i * CPU_QK, &q0, CPU_QK);
      y[i].d = fr_fp16_to_fp32(q0.d);
      qs = q0.qs;
    }
    int sum = 0;
    for (int e = 0; e < CPU_QK; e++) sum += qs[e];
    if (t != KERN_Q4_1) y[i].s = y[i].d * (float)sum;
    y[i].c = -off * sum;
    y[i].pad = 0;
    memcpy(y[i].qs, qs, CPU_QK);
  }
}

/* ---- the reference numerics ---- */

/* Row r's unsigned value of element e in a panel block. */
static int cpu__panel_u(kern_type_t t, const cpu_panel_parts_t *p, int r, int e) {
  if (t == KERN_Q8_0) return p->v[(e / 4) * 64 + r * 4 + e % 4];
  const uint8_t byte = p->v[(e / 8) * 64 + r * 4 + e % 4];
  int u = e % 8 < 4 ? byte & 0x0F : byte >> 4;
  const uint64_t bit = 1ull << (4 * r + e % 4);
  if (p->h4 && (p->h4[e / 4] & bit)) u += 16;
  if (p->h5 && (p->h5[e / 4] & bit)) u += 32;
  return u;
}

/* sum(u y) over elements [e0, e0 + n) of row r, plus c. */
static int32_t cpu__panel_isum(kern_type_t t, const cpu_panel_parts_t *p, int r, const int8_t *qs, int e0, int n,
                               int32_t c) {
  for (int e = e0; e < e0 + n; e++) c += cpu__panel_u(t, p, r, e) * qs[e];
  return c;
}

/* Row r's dot with activation row a over nb blocks, as cpu.h says. */
static float cpu__panel_dot(kern_type_t t, int nb, const void *panel, const void *a, int r) {
  const size_t pbb = cpu_panel_block_bytes(t);
  float acc = 0.0f;
  for (int b = 0; b < nb; b++) {
    const cpu_panel_parts_t p = cpu__panel_parts(t, (const uint8_t *)panel + (size_t)b * pbb);
    const float dw = fr_fp16_to_fp32(p.d[r]);
    if (t == KERN_Q4_K || t == KERN_Q6_K) {
      const cpu_block_q8_kp *y = (const cpu_block_q8_kp *)a + b;
      float tsum = 0.0f, mm = 0.0f;
      if (t == KERN_Q4_K)
        for (int s = 0; s < 8; s++) {
          tsum = fmaf((float)cpu__panel_isum(t, &p, r, y->qs, 32 * s, 32, 0), (float)p.sc[16 * s + r], tsum);
          mm = fmaf((float)p.mk[16 * s + r], y->bs[s], mm);
        }
      else
        for (int s = 0; s < 16; s++)
          tsum = fmaf((float)cpu__panel_isum(t, &p, r, y->qs, 16 * s, 16, y->c[s]), (float)(int8_t)p.sc[16 * s + r],
                      tsum);
      acc = fmaf(tsum, dw * y->d, acc);
      if (t == KERN_Q4_K) acc = fmaf(-mm, fr_fp16_to_fp32(p.m[r]) * y->d, acc);
    } else {
      const cpu_block_q8_p *y = (const cpu_block_q8_p *)a + b;
      acc = fmaf((float)cpu__panel_isum(t, &p, r, y->qs, 0, CPU_QK, y->c), dw * y->d, acc);
      if (t == KERN_Q4_1) acc = fmaf(fr_fp16_to_fp32(p.m[r]), y->s, acc);
    }
  }
  return acc;
}

void cpu__panel_gemm_scalar(kern_type_t t, int nb, const void *panel, const void *a, size_t a_stride, int na,
                            float *out, size_t ld, const float *bias) {
  for (int j = 0; j < na; j++)
    for (int r = 0; r < CPU_PANEL_ROWS; r++) {
      const float acc = cpu__panel_dot(t, nb, panel, (const uint8_t *)a + (size_t)j * a_stride, r);
      out[(size_t)j * ld + (size_t)r] = bias ? acc + bias[r] : acc;
    }
}
