/* kcu_quant.cuh - device-side dequantization of GGUF quant blocks.
 *
 * Every supported type is read in units of 32 consecutive elements (a
 * "sub-block"): block-32 types have one per block, K-quants eight per
 * 256-element super-block. kcu_deq32<TYPE>(block, sub, w) writes the 32
 * values of sub-block `sub` to w. Layouts: shared/reference/FORMATS.md §3.
 * Blocks are only 2-byte aligned in general (18, 22, 34, 210 bytes), so
 * loads are 16-bit unless the layout guarantees more.
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
  default: otherwise; break;                                             \
  }

/* Element (row, 32*u .. 32*u+31) sub-block address helpers. */
template <int QT>
__device__ __forceinline__ const uint8_t *kcu_sub_block(const uint8_t *row, int u, int *sub) {
  constexpr int SUBS = kcu_qt<QT>::QK / 32;
  *sub = u % SUBS;
  return row + (size_t)(u / SUBS) * kcu_qt<QT>::BYTES;
}
