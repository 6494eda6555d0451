/* kcu_ggemm.cuh - what the grouped GEMM's kernels share (kcu_ggemm.cu:
 * mma.sync, any weight type; kcu_ggemm_wg.cu: wgmma, sm_90a, dense
 * weights): the CTA's threads, the K stage, the swizzled shared tiles and
 * their cp.async loads. */
#pragma once

#include "kernels/cuda/kcu_mma.cuh"

#define KCU_GG_WARPS 4
#define KCU_GG_NT (KCU_GG_WARPS * KCU_WARP)
#define KCU_GG_BK 64 /* K per pipeline stage: one 128-byte row of 8 swizzled 16-byte chunks */

/* Byte offset of 16-byte chunk ch of row r in a swizzled (rows, BK) tile. */
__device__ __forceinline__ uint32_t kcu_gg_off(int r, int ch) {
  return (uint32_t)(r * (KCU_GG_BK * 2) + ((ch ^ (r & 7)) << 4));
}

/* The loads of a tile of rows x BK, KCU_GG_NT threads at a time: a thread
 * copies chunk ch (16 bytes) of rows r0, r0 + RS, ... (J of them), the same
 * rows every stage, in a loop the compiler unrolls, and A's source rows are
 * worked out once. Copy loops strided by the thread count, with a division
 * and a gathered row's division by k every copy of every stage, kept the
 * issue slots 47-55% busy for a tensor pipe 25-27% busy: a 2048-token
 * Qwen3-30B-A3B prefill 70.5 -> 50.4 ms on an H200 (docs/bench/gpu.md,
 * session 44). */
template <int ROWS> struct kcu_gg_ld {
  static constexpr int CH = KCU_GG_BK / 8, RS = KCU_GG_NT / CH, J = ROWS * CH / KCU_GG_NT;
  static_assert(ROWS * CH % KCU_GG_NT == 0, "whole rounds of copies");
  static __device__ __forceinline__ int ch() { return threadIdx.x % CH; }
  static __device__ __forceinline__ int r0() { return threadIdx.x / CH; }
};

/* The A rows this thread copies: a's row rows[r] / gather_k (gather) or
 * rows[r] for its tile rows r, -1 for padding. */
template <int BM>
__device__ __forceinline__ void kcu_gg_a_rows(int (&src)[kcu_gg_ld<BM>::J], const int32_t *rows, int gather_k) {
  typedef kcu_gg_ld<BM> L;
#pragma unroll
  for (int j = 0; j < L::J; j++) {
    const int s = rows[L::r0() + j * L::RS];
    src[j] = s < 0 ? -1 : gather_k ? s / gather_k : s;
  }
}

/* The A tile (BM rows of BK from k0) by the rows of kcu_gg_a_rows; padding
 * rows and columns past K read as zeros. */
template <typename T, int BM>
__device__ __forceinline__ void kcu_gg_load_a(uint32_t sa, const T *a, const int (&src)[kcu_gg_ld<BM>::J], int K,
                                              int k0) {
  typedef kcu_gg_ld<BM> L;
  const int ch = L::ch(), col = k0 + ch * 8;
#pragma unroll
  for (int j = 0; j < L::J; j++) {
    const bool ok = src[j] >= 0 && col < K;
    kcu_cp_async16(sa + kcu_gg_off(L::r0() + j * L::RS, ch), ok ? a + (size_t)src[j] * K + col : a, ok);
  }
}

/* A dense B tile (BN weight rows n0.., BK columns from k0) by cp.async;
 * rows past N and columns past K are zeros. */
template <typename T, int BN>
__device__ __forceinline__ void kcu_gg_load_b_dense(uint32_t sb, const uint8_t *w, size_t row_bytes, int N, int K,
                                                    int n0, int k0) {
  typedef kcu_gg_ld<BN> L;
  const int ch = L::ch(), r0 = L::r0(), col = k0 + ch * 8;
  const uint8_t *src = w + (size_t)(n0 + r0) * row_bytes + (size_t)col * sizeof(T);
#pragma unroll
  for (int j = 0; j < L::J; j++) {
    const bool ok = n0 + r0 + j * L::RS < N && col < K;
    kcu_cp_async16(sb + kcu_gg_off(r0 + j * L::RS, ch), ok ? src + (size_t)j * L::RS * row_bytes : w, ok);
  }
}

/* The CTA's tile of BM rows from m0: rows[r] is the sorted source (which
 * kcu_gg_a_rows divides by gather_k) or, without a gather, the row itself;
 * -1 for padding. Then this thread's A source rows. */
template <int BM>
__device__ __forceinline__ void kcu_gg_tile_rows(int32_t (&rows)[BM], int (&src)[kcu_gg_ld<BM>::J],
                                                 const int32_t *sorted, int m0, int gather_k) {
  for (int r = threadIdx.x; r < BM; r += KCU_GG_NT) {
    const int s = sorted[m0 + r];
    rows[r] = gather_k || s < 0 ? s : m0 + r;
  }
  __syncthreads();
  kcu_gg_a_rows<BM>(src, rows, gather_k);
}

/* Two adjacent outputs at element i of out: the gated form's
 * silu(v) * u in the activation type, else v in f32. */
template <typename T, int MODE>
__device__ __forceinline__ void kcu_gg_store2(void *out, size_t i, float v0, float v1, float u0, float u1) {
  if constexpr (MODE == KCU_GG_GATED)
    *reinterpret_cast<uint32_t *>((T *)out + i) = kcu_pack2<T>(v0 / (1.f + expf(-v0)) * u0, v1 / (1.f + expf(-v1)) * u1);
  else
    *reinterpret_cast<float2 *>((float *)out + i) = make_float2(v0, v1);
}
