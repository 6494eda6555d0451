/* kcu_quant.cuh - device-side dequantization of GGUF quant blocks.
 *
 * Every supported type is read in units of 32 consecutive elements (a
 * "sub-block"): block-32 types have one per block, K-quants eight per
 * 256-element super-block. kcu_deq32<TYPE>(block, sub, w) writes the 32
 * values of sub-block `sub` to w. Layouts: shared/reference/FORMATS.md §3.
 * Blocks are only 2-byte aligned in general (18, 22, 34, 210 bytes), so
 * loads are 16-bit unless the layout guarantees more. KERN_I4G (GPTQ/AWQ
 * int4, docs/QUANTIZED.md: f32 d, f32 m, 16 bytes of nibbles in Q4_1's
 * order) has 24-byte blocks, so on a cudaMalloc'd weight each block is
 * 8-byte aligned.
 */
#pragma once

#include "kernels/cuda/kcu.cuh"

template <int TYPE> struct kcu_qt;
template <> struct kcu_qt<KERN_Q4_0> { enum { QK = 32, BYTES = 18 }; };
template <> struct kcu_qt<KERN_Q4_1> { enum { QK = 32, BYTES = 20 }; };
template <> struct kcu_qt<KERN_Q5_0> { enum { QK = 32, BYTES = 22 }; };
template <> struct kcu_qt<KERN_Q5_1> { enum { QK = 32, BYTES = 24 }; };
template <> struct kcu_qt<KERN_Q8_0> { enum { QK = 32, BYTES = 34 }; };
template <> struct kcu_qt<KERN_Q4_K> { enum { QK = 256, BYTES = 144 }; };
template <> struct kcu_qt<KERN_Q5_K> { enum { QK = 256, BYTES = 176 }; };
template <> struct kcu_qt<KERN_Q6_K> { enum { QK = 256, BYTES = 210 }; };
template <> struct kcu_qt<KERN_I4G> { enum { QK = 32, BYTES = 24 }; };

__device__ __forceinline__ float kcu_h2f(const uint8_t *p) {
  return __half2float(__ushort_as_half(*reinterpret_cast<const uint16_t *>(p)));
}
/* n32 words from a 2-byte aligned address. */
__device__ __forceinline__ void kcu_ld_a2(const uint8_t *p, uint32_t *w, int n32) {
  const uint16_t *h = reinterpret_cast<const uint16_t *>(p);
#pragma unroll
  for (int i = 0; i < n32; i++) w[i] = (uint32_t)h[2 * i] | ((uint32_t)h[2 * i + 1] << 16);
}
__device__ __forceinline__ void kcu_ld_a16(const uint8_t *p, uint32_t *w, int n32) {
  const uint4 *v = reinterpret_cast<const uint4 *>(p);
#pragma unroll
  for (int i = 0; i < n32 / 4; i++) {
    uint4 t = v[i];
    w[4 * i] = t.x;
    w[4 * i + 1] = t.y;
    w[4 * i + 2] = t.z;
    w[4 * i + 3] = t.w;
  }
}
/* An I4G block's (d, m) and its 16 bytes of nibbles: 8-byte aligned loads. */
__device__ __forceinline__ float2 kcu_ld_i4g(const uint8_t *p, uint32_t *q) {
  const uint2 *v = reinterpret_cast<const uint2 *>(p);
  uint2 dm = v[0], a = v[1], b = v[2];
  q[0] = a.x, q[1] = a.y, q[2] = b.x, q[3] = b.y;
  return make_float2(__uint_as_float(dm.x), __uint_as_float(dm.y));
}
__device__ __forceinline__ int kcu_byte(const uint32_t *w, int i) { return (w[i >> 2] >> (8 * (i & 3))) & 0xff; }

/* 4-bit nibbles of 16 bytes: lo[j] = byte j & 15, hi[j] = byte j >> 4. */
__device__ __forceinline__ void kcu_nib(const uint32_t *q, float a, float b, float *w) {
#pragma unroll
  for (int j = 0; j < 16; j++) {
    int x = kcu_byte(q, j);
    w[j] = a * (float)(x & 15) + b;
    w[j + 16] = a * (float)(x >> 4) + b;
  }
}

template <int TYPE> __device__ __forceinline__ void kcu_deq32(const uint8_t *blk, int sub, float *w);

template <> __device__ __forceinline__ void kcu_deq32<KERN_Q4_0>(const uint8_t *b, int, float *w) {
  uint32_t q[4];
  kcu_ld_a2(b + 2, q, 4);
  float d = kcu_h2f(b);
  kcu_nib(q, d, -8.f * d, w);
}
template <> __device__ __forceinline__ void kcu_deq32<KERN_Q4_1>(const uint8_t *b, int, float *w) {
  uint32_t q[4];
  kcu_ld_a2(b + 4, q, 4);
  kcu_nib(q, kcu_h2f(b), kcu_h2f(b + 2), w);
}
template <> __device__ __forceinline__ void kcu_deq32<KERN_I4G>(const uint8_t *b, int, float *w) {
  uint32_t q[4];
  float2 dm = kcu_ld_i4g(b, q);
  kcu_nib(q, dm.x, dm.y, w);
}
__device__ __forceinline__ void kcu_q5(const uint32_t *q, uint32_t qh, float d, float m, float *w) {
#pragma unroll
  for (int j = 0; j < 16; j++) {
    int x = kcu_byte(q, j);
    w[j] = d * (float)((x & 15) | (((qh >> j) & 1) << 4)) + m;
    w[j + 16] = d * (float)((x >> 4) | (((qh >> (j + 16)) & 1) << 4)) + m;
  }
}
template <> __device__ __forceinline__ void kcu_deq32<KERN_Q5_0>(const uint8_t *b, int, float *w) {
  uint32_t q[4], qh;
  kcu_ld_a2(b + 2, &qh, 1);
  kcu_ld_a2(b + 6, q, 4);
  float d = kcu_h2f(b);
  kcu_q5(q, qh, d, -16.f * d, w);
}
template <> __device__ __forceinline__ void kcu_deq32<KERN_Q5_1>(const uint8_t *b, int, float *w) {
  uint32_t q[4], qh;
  kcu_ld_a2(b + 4, &qh, 1);
  kcu_ld_a2(b + 8, q, 4);
  kcu_q5(q, qh, kcu_h2f(b), kcu_h2f(b + 2), w);
}
template <> __device__ __forceinline__ void kcu_deq32<KERN_Q8_0>(const uint8_t *b, int, float *w) {
  uint32_t q[8];
  kcu_ld_a2(b + 2, q, 8);
  float d = kcu_h2f(b);
#pragma unroll
  for (int j = 0; j < 32; j++) w[j] = d * (float)(int8_t)kcu_byte(q, j);
}

/* Q4_K / Q5_K 6-bit scale and min of sub-block j (get_scale_min_k4). */
__device__ __forceinline__ void kcu_scale_min_k4(int j, const uint8_t *s, int *sc, int *m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}
template <> __device__ __forceinline__ void kcu_deq32<KERN_Q4_K>(const uint8_t *b, int j, float *w) {
  uint32_t q[8];
  kcu_ld_a16(b + 16 + 32 * (j >> 1), q, 8);
  int sc, m;
  kcu_scale_min_k4(j, b + 4, &sc, &m);
  float d = kcu_h2f(b) * (float)sc, mn = -kcu_h2f(b + 2) * (float)m;
  int sh = (j & 1) * 4;
#pragma unroll
  for (int l = 0; l < 32; l++) w[l] = d * (float)((kcu_byte(q, l) >> sh) & 15) + mn;
}
template <> __device__ __forceinline__ void kcu_deq32<KERN_Q5_K>(const uint8_t *b, int j, float *w) {
  uint32_t q[8], qh[8];
  kcu_ld_a16(b + 16, qh, 8);
  kcu_ld_a16(b + 48 + 32 * (j >> 1), q, 8);
  int sc, m;
  kcu_scale_min_k4(j, b + 4, &sc, &m);
  float d = kcu_h2f(b) * (float)sc, mn = -kcu_h2f(b + 2) * (float)m;
  int sh = (j & 1) * 4;
#pragma unroll
  for (int l = 0; l < 32; l++) {
    int v = ((kcu_byte(q, l) >> sh) & 15) | (((kcu_byte(qh, l) >> j) & 1) << 4);
    w[l] = d * (float)v + mn;
  }
}
template <> __device__ __forceinline__ void kcu_deq32<KERN_Q6_K>(const uint8_t *b, int j, float *w) {
  int h = j >> 2, qq = j & 3;
  uint32_t ql[8], qh[8];
  kcu_ld_a2(b + 64 * h + 32 * (qq & 1), ql, 8);
  kcu_ld_a2(b + 128 + 32 * h, qh, 8);
  const int8_t *sc = reinterpret_cast<const int8_t *>(b + 192 + 8 * h + 2 * qq);
  float d = kcu_h2f(b + 208);
  float d0 = d * (float)sc[0], d1 = d * (float)sc[1];
  int shl = (qq >> 1) * 4, shh = 2 * qq;
#pragma unroll
  for (int l = 0; l < 32; l++) {
    int v = ((kcu_byte(ql, l) >> shl) & 15) | (((kcu_byte(qh, l) >> shh) & 3) << 4);
    w[l] = (l < 16 ? d0 : d1) * (float)(v - 32);
  }
}

/* Dispatches `body` with QT bound to a kern_type_t constant for every
 * supported quantized type; evaluates `otherwise` for the rest. */
#define KCU_QUANT_DISPATCH(type, otherwise, ...)                        \
  switch (type) {                                                        \
  case KERN_Q4_0: { constexpr int QT = KERN_Q4_0; __VA_ARGS__; } break;  \
  case KERN_Q4_1: { constexpr int QT = KERN_Q4_1; __VA_ARGS__; } break;  \
  case KERN_Q5_0: { constexpr int QT = KERN_Q5_0; __VA_ARGS__; } break;  \
  case KERN_Q5_1: { constexpr int QT = KERN_Q5_1; __VA_ARGS__; } break;  \
  case KERN_Q8_0: { constexpr int QT = KERN_Q8_0; __VA_ARGS__; } break;  \
  case KERN_Q4_K: { constexpr int QT = KERN_Q4_K; __VA_ARGS__; } break;  \
  case KERN_Q5_K: { constexpr int QT = KERN_Q5_K; __VA_ARGS__; } break;  \
  case KERN_Q6_K: { constexpr int QT = KERN_Q6_K; __VA_ARGS__; } break;  \
  case KERN_I4G: { constexpr int QT = KERN_I4G; __VA_ARGS__; } break;    \
  default: otherwise; break;                                             \
  }

/* Element (row, 32*u .. 32*u+31) sub-block address helpers. */
template <int QT>
__device__ __forceinline__ const uint8_t *kcu_sub_block(const uint8_t *row, int u, int *sub) {
  constexpr int SUBS = kcu_qt<QT>::QK / KCU_QSUB;
  *sub = u % SUBS;
  return row + (size_t)(u / SUBS) * kcu_qt<QT>::BYTES;
}

/* ---- integer dot products (decode GEMV) ------------------------------------------
 *
 * Activations are quantized per 32 elements to int8 q with scale xd and
 * xs = xd * sum(q) (llama.cpp's q8_1). A weight sub-block becomes 8 packed
 * int32 of signed bytes v (elements 0..15 in v[0..3], 16..31 in v[4..7]) and
 * coefficients so that
 *   sum_i w_i x_i = xd * (d0 * dot(v[0..3], q[0..15]) + d1 * dot(v[4..7], q[16..31])) + mc * xs.
 */
typedef struct {
  int v[8];
  float d0, d1, mc;
} kcu_qv_t;

template <int TYPE> __device__ __forceinline__ void kcu_qv(const uint8_t *blk, int sub, kcu_qv_t *o);

/* 4 bits b0..b3 -> bit 0 of bytes 0..3, shifted to bit 4 */
__device__ __forceinline__ int kcu_spread4(uint32_t b) {
  return (int)(((b & 1u) | ((b & 2u) << 7) | ((b & 4u) << 14) | ((b & 8u) << 21)) << 4);
}
__device__ __forceinline__ void kcu_qv_nib(const uint32_t *q, kcu_qv_t *o) {
#pragma unroll
  for (int k = 0; k < 4; k++) {
    o->v[k] = (int)(q[k] & 0x0F0F0F0Fu);
    o->v[k + 4] = (int)((q[k] >> 4) & 0x0F0F0F0Fu);
  }
}
template <> __device__ __forceinline__ void kcu_qv<KERN_Q4_0>(const uint8_t *b, int, kcu_qv_t *o) {
  uint32_t q[4];
  kcu_ld_a2(b + 2, q, 4);
  kcu_qv_nib(q, o);
#pragma unroll
  for (int k = 0; k < 8; k++) o->v[k] = __vsubss4(o->v[k], 0x08080808);
  o->d0 = o->d1 = kcu_h2f(b);
  o->mc = 0.f;
}
template <> __device__ __forceinline__ void kcu_qv<KERN_Q4_1>(const uint8_t *b, int, kcu_qv_t *o) {
  uint32_t q[4];
  kcu_ld_a2(b + 4, q, 4);
  kcu_qv_nib(q, o);
  o->d0 = o->d1 = kcu_h2f(b);
  o->mc = kcu_h2f(b + 2);
}
template <> __device__ __forceinline__ void kcu_qv<KERN_I4G>(const uint8_t *b, int, kcu_qv_t *o) {
  uint32_t q[4];
  float2 dm = kcu_ld_i4g(b, q);
  kcu_qv_nib(q, o);
  o->d0 = o->d1 = dm.x;
  o->mc = dm.y;
}
__device__ __forceinline__ void kcu_qv_q5(const uint32_t *q, uint32_t qh, kcu_qv_t *o) {
  kcu_qv_nib(q, o);
#pragma unroll
  for (int k = 0; k < 4; k++) {
    o->v[k] |= kcu_spread4((qh >> (4 * k)) & 15u);
    o->v[k + 4] |= kcu_spread4((qh >> (16 + 4 * k)) & 15u);
  }
}
template <> __device__ __forceinline__ void kcu_qv<KERN_Q5_0>(const uint8_t *b, int, kcu_qv_t *o) {
  uint32_t q[4], qh;
  kcu_ld_a2(b + 2, &qh, 1);
  kcu_ld_a2(b + 6, q, 4);
  kcu_qv_q5(q, qh, o);
#pragma unroll
  for (int k = 0; k < 8; k++) o->v[k] = __vsubss4(o->v[k], 0x10101010);
  o->d0 = o->d1 = kcu_h2f(b);
  o->mc = 0.f;
}
template <> __device__ __forceinline__ void kcu_qv<KERN_Q5_1>(const uint8_t *b, int, kcu_qv_t *o) {
  uint32_t q[4], qh;
  kcu_ld_a2(b + 4, &qh, 1);
  kcu_ld_a2(b + 8, q, 4);
  kcu_qv_q5(q, qh, o);
  o->d0 = o->d1 = kcu_h2f(b);
  o->mc = kcu_h2f(b + 2);
}
template <> __device__ __forceinline__ void kcu_qv<KERN_Q8_0>(const uint8_t *b, int, kcu_qv_t *o) {
  kcu_ld_a2(b + 2, (uint32_t *)o->v, 8);
  o->d0 = o->d1 = kcu_h2f(b);
  o->mc = 0.f;
}
template <> __device__ __forceinline__ void kcu_qv<KERN_Q4_K>(const uint8_t *b, int j, kcu_qv_t *o) {
  uint32_t q[8];
  kcu_ld_a16(b + 16 + 32 * (j >> 1), q, 8);
  int sh = (j & 1) * 4, sc, m;
#pragma unroll
  for (int k = 0; k < 8; k++) o->v[k] = (int)((q[k] >> sh) & 0x0F0F0F0Fu);
  kcu_scale_min_k4(j, b + 4, &sc, &m);
  o->d0 = o->d1 = kcu_h2f(b) * (float)sc;
  o->mc = -kcu_h2f(b + 2) * (float)m;
}
template <> __device__ __forceinline__ void kcu_qv<KERN_Q5_K>(const uint8_t *b, int j, kcu_qv_t *o) {
  uint32_t q[8], qh[8];
  kcu_ld_a16(b + 16, qh, 8);
  kcu_ld_a16(b + 48 + 32 * (j >> 1), q, 8);
  int sh = (j & 1) * 4, sc, m;
#pragma unroll
  for (int k = 0; k < 8; k++) o->v[k] = (int)(((q[k] >> sh) & 0x0F0F0F0Fu) | (((qh[k] >> j) & 0x01010101u) << 4));
  kcu_scale_min_k4(j, b + 4, &sc, &m);
  o->d0 = o->d1 = kcu_h2f(b) * (float)sc;
  o->mc = -kcu_h2f(b + 2) * (float)m;
}
template <> __device__ __forceinline__ void kcu_qv<KERN_Q6_K>(const uint8_t *b, int j, kcu_qv_t *o) {
  int h = j >> 2, qq = j & 3;
  uint32_t ql[8], qh[8];
  kcu_ld_a2(b + 64 * h + 32 * (qq & 1), ql, 8);
  kcu_ld_a2(b + 128 + 32 * h, qh, 8);
  int shl = (qq >> 1) * 4, shh = 2 * qq;
#pragma unroll
  for (int k = 0; k < 8; k++) {
    int v = (int)(((ql[k] >> shl) & 0x0F0F0F0Fu) | (((qh[k] >> shh) & 0x03030303u) << 4));
    o->v[k] = __vsubss4(v, 0x20202020);
  }
  const int8_t *sc = reinterpret_cast<const int8_t *>(b + 192 + 8 * h + 2 * qq);
  float d = kcu_h2f(b + 208);
  o->d0 = d * (float)sc[0];
  o->d1 = d * (float)sc[1];
  o->mc = 0.f;
}

/* sum_i w_i x_i of one sub-block against 32 quantized activations. */
__device__ __forceinline__ float kcu_qv_dot(const kcu_qv_t *w, const int *xq, float2 xds) {
  int s0 = 0, s1 = 0;
#pragma unroll
  for (int k = 0; k < 4; k++) {
    s0 = __dp4a(w->v[k], xq[k], s0);
    s1 = __dp4a(w->v[k + 4], xq[k + 4], s1);
  }
  return xds.x * (w->d0 * (float)s0 + w->d1 * (float)s1) + w->mc * xds.y;
}
