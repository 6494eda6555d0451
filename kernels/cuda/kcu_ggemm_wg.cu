/* kcu_ggemm_wg.cu - the grouped GEMM's large tiles (KCU_GG_ROWS_LARGE rows)
 * over dense weights by wgmma, built for sm_90a only (kernels/cuda.cmake);
 * kcu_ggemm.cu sends them here on a compute capability 9.0 device.
 *
 * A CTA is one warpgroup and one tile: 64 A rows (gathered as kcu_ggemm.cu
 * gathers them) times BN weight rows (gated: 64 of the gate and 64 of the
 * up matrix; else 128). The stages are kcu_ggemm.cuh's cp.async tiles, whose
 * XOR swizzle of 16-byte chunks over 128-byte rows is wgmma's 128-byte
 * swizzle, so both operands are read from shared memory by descriptors,
 * K-major. Each thread's copies are fenced to the async proxy before the
 * barrier that opens a stage; a stage's wgmmas finish before the barrier
 * after which its bytes are loaded again.
 *
 * Against kcu_ggemm.cu's mma.sync tiles (64 x 64, 4 warps of 32 x 32) on an
 * H200, Qwen3-30B-A3B shapes (docs/bench/gpu.md, session 45): a 2048-token
 * prefill's gate/up GEMM 384 -> 321 us, down 229 -> 176 us (ncu); the
 * prefill 50.1 -> 44.7 ms. The down GEMM is then at 90% of the L2's
 * throughput.
 *
 * Threads: the backend's stream. */
#include "kernels/cuda/kcu_ggemm.cuh"
#include "kernels/cuda/kcu_wg.cuh"

/* A tile: BM rows, NB B tiles of BN weight rows, S stages of A and the B
 * tiles (24 KB each, 3 CTAs a SM; 4 stages at 2 CTAs a SM ran a
 * Qwen3-30B-A3B prefill 8% slower: docs/bench/gpu.md, session 45); the
 * shared memory has 1 KB more for the alignment. */
template <int MODE> struct kcu_ggw_cfg {
  enum { NB = MODE == KCU_GG_GATED ? 2 : 1, BN = MODE == KCU_GG_GATED ? 64 : 128, BM = KCU_GG_ROWS_LARGE, S = 3 };
  enum { A = BM * KCU_GG_BK * 2, B = BN * KCU_GG_BK * 2, STAGE = A + NB * B };
  static constexpr size_t SMEM = (size_t)S * STAGE + 1024;
};

template <typename T, int MODE>
__global__ void __launch_bounds__(KCU_GG_NT)
    kcu_ggw_k(void *out, const T *a, const int32_t *sorted, int gather_k, const int32_t *tile_w,
              const int32_t *n_tiles, const __grid_constant__ kcu_gg_ptrs_t w0, const __grid_constant__ kcu_gg_ptrs_t w1,
              size_t row_bytes, int N, int K) {
  typedef kcu_ggw_cfg<MODE> C;
  constexpr int NB = C::NB, BN = C::BN, BM = C::BM, S = C::S;
  extern __shared__ uint8_t kcu_ggw_sh[];
  __shared__ int32_t rows[BM];
  kcu_pdl_enter();
  const int tile = blockIdx.x;
  if (tile >= *n_tiles) return;
  const int e = tile_w[tile], m0 = tile * BM, n0 = blockIdx.y * BN;
  const int warp = threadIdx.x / KCU_WARP, lane = threadIdx.x % KCU_WARP;
  int a_src[kcu_gg_ld<BM>::J];
  kcu_gg_tile_rows<BM>(rows, a_src, sorted, m0, gather_k);
  const uint8_t *wb[2] = {w0.p[e], NB == 2 ? w1.p[e] : w0.p[e]};
  const uint32_t base = ((uint32_t)__cvta_generic_to_shared(kcu_ggw_sh) + 1023u) & ~1023u;
  const int nk = (K + KCU_GG_BK - 1) / KCU_GG_BK;
  auto load = [&](int kt) {
    const uint32_t st = base + (kt % S) * C::STAGE;
    kcu_gg_load_a<T, BM>(st, a, a_src, K, kt * KCU_GG_BK);
#pragma unroll
    for (int b = 0; b < NB; b++)
      kcu_gg_load_b_dense<T, BN>(st + C::A + b * C::B, wb[b], row_bytes, N, K, n0, kt * KCU_GG_BK);
  };
  float acc[NB][BN / 2];
  kcu_wg_pipe_start<S>(nk, load);
  for (int kt = 0; kt < nk; kt++) {
    kcu_wg_pipe_next<S>(kt, nk, load);
    const uint32_t st = base + (kt % S) * C::STAGE;
    kcu_wg_fence();
#pragma unroll
    for (int kk = 0; kk < KCU_GG_BK / 16; kk++) {
      const uint64_t da = kcu_wg_desc(st + kk * 32);
#pragma unroll
      for (int b = 0; b < NB; b++) kcu_wg_mma<T, BN>(acc[b], da, kcu_wg_desc(st + C::A + b * C::B + kk * 32), kt | kk);
    }
    kcu_wg_commit();
    kcu_wg_wait0();
#pragma unroll
    for (int b = 0; b < NB; b++) kcu_wg_hold(acc[b]);
  }
  /* warp w holds rows 16 w + g and + 8; element 4 i + 2 h + j: row + 8 h, column 8 i + 2 q + j */
  const int g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int r = warp * 16 + g + 8 * h;
    if (rows[r] < 0) continue;
    const size_t orow = (size_t)(m0 + r) * N;
#pragma unroll
    for (int i = 0; i < BN / 8; i++) {
      const int n = n0 + 8 * i + 2 * q;
      if (n >= N) continue;
      const int j = 4 * i + 2 * h;
      kcu_gg_store2<T, MODE>(out, orow + n, acc[0][j], acc[0][j + 1], acc[NB - 1][j], acc[NB - 1][j + 1]);
    }
  }
}

template <typename T, int MODE>
static int kcu_ggw_launch(kcu_ctx_t *c, void *out, const void *a, const kcu_gg_rows_t *r, const kcu_gg_ptrs_t *w0,
                          const kcu_gg_ptrs_t *w1, size_t row_bytes, int N, int K) {
  KCU_LAUNCH(c, kcu_ggw_k<T, MODE>, dim3(r->tiles, kcu_div_up(N, kcu_ggw_cfg<MODE>::BN)), KCU_GG_NT,
             kcu_ggw_cfg<MODE>::SMEM, out, (const T *)a, r->sorted, r->gather_k, r->tile_w, r->n_tiles, *w0, *w1,
             row_bytes, N, K);
  return 0;
}

int kcu__gg_wg(kcu_ctx_t *c, int mode, void *out, const void *a, const kcu_gg_rows_t *r, const kcu_gg_ptrs_t *w0,
               const kcu_gg_ptrs_t *w1, size_t row_bytes, int N, int K) {
  int rc = 0;
  KCU_ACT_DISPATCH(c, rc = mode == KCU_GG_GATED
                               ? kcu_ggw_launch<T, KCU_GG_GATED>(c, out, a, r, w0, w1, row_bytes, N, K)
                               : kcu_ggw_launch<T, KCU_GG_F32>(c, out, a, r, w0, w0, row_bytes, N, K));
  return rc;
}

template <typename T, int MODE> static int kcu_ggw_attr(void) {
  KCU_CHECK(cudaFuncSetAttribute(kcu_ggw_k<T, MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)kcu_ggw_cfg<MODE>::SMEM));
  return 0;
}

int kcu__gg_wg_init(kcu_ctx_t *c) {
  int rc = 0;
  KCU_ACT_DISPATCH(c, {
    rc = kcu_ggw_attr<T, KCU_GG_GATED>();
    if (!rc) rc = kcu_ggw_attr<T, KCU_GG_F32>();
  });
  return rc;
}
