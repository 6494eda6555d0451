/* cpu_panel.c - the panel layout of 32-element block weights (cpu.h,
 * CPU_PANEL_ROWS): packing rows into panels at load, the activation blocks
 * panels dot with, and the panel numerics in plain C, the reference for the
 * vector kernels (cpu_x512_panel.h). */
#include <math.h>
#include <string.h>

#include "common/fr_util.h"
#include "kernels/cpu/cpu.h"

bool cpu__panel_type(kern_type_t t) { return t == KERN_Q4_0 || t == KERN_Q4_1 || t == KERN_Q5_0 || t == KERN_Q8_0; }

size_t cpu__panel_block_bytes(kern_type_t t) { return CPU_PANEL_ROWS * kern_type_traits(t)->size; }

/* The offset a panel's unsigned values carry: value = d (u - off). */
static int cpu__panel_off(kern_type_t t) {
  switch (t) {
  case KERN_Q8_0: return 128;
  case KERN_Q4_0: return 8;
  case KERN_Q5_0: return 16;
  default: return 0;
  }
}

/* Element e's low four bits in a Q4_0/Q4_1/Q5_0 block's qs (ggml: element
 * e < 16 in the low nibble of qs[e], e >= 16 in the high one of qs[e - 16]). */
static inline uint8_t cpu__nibble(const uint8_t *qs, int e) { return e < 16 ? qs[e] & 0x0F : qs[e - 16] >> 4; }

/* The parts of a panel block (its header first: d, then m or hi). */
typedef struct {
  uint16_t *d, *m;
  uint64_t *hi;
  uint8_t *v;
} cpu_panel_parts_t;

static cpu_panel_parts_t cpu__panel_parts(kern_type_t t, uint8_t *pb) {
  cpu_panel_parts_t p = {.d = (uint16_t *)pb};
  uint8_t *next = pb + CPU_PANEL_ROWS * sizeof(uint16_t);
  if (t == KERN_Q4_1) {
    p.m = (uint16_t *)next;
    next += CPU_PANEL_ROWS * sizeof(uint16_t);
  } else if (t == KERN_Q5_0) {
    p.hi = (uint64_t *)next;
    next += 8 * sizeof(uint64_t);
  }
  p.v = next;
  return p;
}

/* Row r's block (row layout) into its place in the panel block. */
static void cpu__panel_put(kern_type_t t, const uint8_t *blk, int r, const cpu_panel_parts_t *p) {
  if (t == KERN_Q8_0) {
    const cpu_block_q8_0 *x = (const cpu_block_q8_0 *)blk;
    p->d[r] = x->d;
    for (int e = 0; e < CPU_QK; e++) p->v[(e / 4) * 64 + r * 4 + e % 4] = (uint8_t)x->qs[e] ^ 0x80;
    return;
  }
  const uint8_t *qs;
  if (t == KERN_Q4_0) {
    const cpu_block_q4_0 *x = (const cpu_block_q4_0 *)blk;
    p->d[r] = x->d, qs = x->qs;
  } else if (t == KERN_Q4_1) {
    const cpu_block_q4_1 *x = (const cpu_block_q4_1 *)blk;
    p->d[r] = x->d, p->m[r] = x->m, qs = x->qs;
  } else {
    const cpu_block_q5_0 *x = (const cpu_block_q5_0 *)blk;
    uint32_t qh;
    memcpy(&qh, x->qh, sizeof qh);
    p->d[r] = x->d, qs = x->qs;
    for (int e = 0; e < CPU_QK; e++)
      if (qh >> e & 1) p->hi[e / 4] |= 1ull << (4 * r + e % 4);
  }
  for (int k = 0; k < 4; k++)
    for (int i = 0; i < 4; i++)
      p->v[k * 64 + r * 4 + i] = (uint8_t)(cpu__nibble(qs, 8 * k + i) | cpu__nibble(qs, 8 * k + 4 + i) << 4);
}

void cpu__panel_pack(const kern_weight_t *w, const void *src, long p, void *dst) {
  const int nb = (int)(w->cols / CPU_QK);
  const size_t bs = kern_type_traits(w->type)->size, pbb = cpu__panel_block_bytes(w->type);
  uint8_t *out = (uint8_t *)dst + (size_t)p * (size_t)nb * pbb;
  memset(out, 0, (size_t)nb * pbb);
  for (int b = 0; b < nb; b++) {
    const cpu_panel_parts_t parts = cpu__panel_parts(w->type, out + (size_t)b * pbb);
    for (int r = 0; r < CPU_PANEL_ROWS; r++) {
      const uint8_t *row = (const uint8_t *)src + (size_t)(p * CPU_PANEL_ROWS + r) * w->row_bytes;
      cpu__panel_put(w->type, row + (size_t)b * bs, r, &parts);
    }
  }
}

void cpu__panel_quantize(cpu_quantize_fn quant, kern_type_t t, const float *x, cpu_block_q8_p *y, int n) {
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

/* Row r's unsigned value of element e in a panel block. */
static int cpu__panel_u(kern_type_t t, const cpu_panel_parts_t *p, int r, int e) {
  if (t == KERN_Q8_0) return p->v[(e / 4) * 64 + r * 4 + e % 4];
  const int k = e / 8, i = e % 8;
  const uint8_t byte = p->v[k * 64 + r * 4 + i % 4];
  int u = i < 4 ? byte & 0x0F : byte >> 4;
  if (t == KERN_Q5_0 && (p->hi[e / 4] >> (4 * r + e % 4) & 1)) u += 16;
  return u;
}

void cpu__panel_gemm_scalar(kern_type_t t, int nb, const void *panel, const cpu_block_q8_p *a, size_t a_stride,
                            int na, float *out, size_t ld, const float *bias) {
  const size_t pbb = cpu__panel_block_bytes(t);
  for (int j = 0; j < na; j++)
    for (int r = 0; r < CPU_PANEL_ROWS; r++) {
      float acc = 0.0f;
      for (int b = 0; b < nb; b++) {
        const cpu_panel_parts_t p = cpu__panel_parts(t, (uint8_t *)panel + (size_t)b * pbb);
        const cpu_block_q8_p *y = a + (size_t)j * a_stride + (size_t)b;
        int32_t isum = y->c;
        for (int e = 0; e < CPU_QK; e++) isum += cpu__panel_u(t, &p, r, e) * y->qs[e];
        acc = fmaf((float)isum, fr_fp16_to_fp32(p.d[r]) * y->d, acc);
        if (t == KERN_Q4_1) acc = fmaf(fr_fp16_to_fp32(p.m[r]), y->s, acc);
      }
      out[(size_t)j * ld + (size_t)r] = bias ? acc + bias[r] : acc;
    }
}
