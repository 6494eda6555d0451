/* kcu_ggemm.cu - a grouped GEMM on the tensor cores over weights of any
 * type the backend reads: out rows = A rows times a weight's rows, where the
 * rows come in tiles of BM (16 or 64) and each tile names its weight (an
 * expert of a MoE layer, kcu_moe.cu).
 * A CTA takes one tile and BN weight rows: A rows (gathered through a row
 * list, or in order) and the weight's rows stream through a cp.async
 * pipeline into XOR-swizzled shared memory, dense weights as they are and
 * quantized ones dequantized (kcu_quant.cuh) to the activation type as they
 * are stored; ldmatrix and mma.sync m16n8k16 (kcu_mma.cuh) with f32
 * accumulators. The gated form reads a gate and an up matrix at once and
 * writes silu(gate) * up. A row's result does not depend on the rows beside
 * it. The weights' addresses (at most KCU_GG_MAX_W) are __grid_constant__
 * kernel parameters, which a graph records. The large tiles of dense
 * weights go to kcu_ggemm_wg.cu's wgmma kernel where the device has it
 * (c->gg_wg). */
#include "kernels/cuda/kcu_ggemm.cuh"
#include "kernels/cuda/kcu_quant.cuh"

/* A tile's shape by its height BM: BN columns, the pipeline's depth, and
 * how the 4 warps share the tile (WARPS_M x WARPS_N, each warp WM x WN: MF
 * m16 by NF n8 fragments). Measured on an H200 (Qwen3-30B-A3B shapes,
 * decode at batch 1 to 64): narrower small tiles (32 columns, 6 stages,
 * the warps splitting K) were 3-17% slower than these. */
template <int BM> struct kcu_gg_cfg;
template <> struct kcu_gg_cfg<KCU_GG_ROWS_LARGE> {
  enum { BN = 64, STAGES = 3, WARPS_M = 2, WARPS_N = 2 };
};
template <> struct kcu_gg_cfg<KCU_GG_ROWS_SMALL> {
  enum { BN = 64, STAGES = 3, WARPS_M = 1, WARPS_N = 4 };
};
template <int BM> struct kcu_gg_tile : kcu_gg_cfg<BM> {
  typedef kcu_gg_cfg<BM> C;
  static_assert(C::WARPS_M * C::WARPS_N == KCU_GG_WARPS, "4 warps");
  enum { WM = BM / C::WARPS_M, WN = C::BN / C::WARPS_N, MF = WM / 16, NF = WN / 8 };
  static_assert(NF % 2 == 0, "B fragments are loaded two n8 at a time");
};

/* Shared bytes of one stage (the A tile and NB B tiles) and of the pipeline. */
template <int BM, int NB> struct kcu_gg_smem {
  enum {
    A = BM * KCU_GG_BK * 2,
    B = kcu_gg_cfg<BM>::BN * KCU_GG_BK * 2,
    STAGE = A + NB * B,
    BYTES = kcu_gg_cfg<BM>::STAGES * STAGE
  };
};

/* A B tile (BN weight rows n0.., BK columns from k0) of one expert: dense
 * rows by cp.async, quantized ones dequantized (a 32-element sub-block per
 * thread) and stored. Rows past N and columns past K are zeros. */
template <typename T, int QT, int BN>
__device__ __forceinline__ void kcu_gg_load_b(uint32_t sb, const uint8_t *w, size_t row_bytes, int N, int K, int n0,
                                               int k0) {
  if constexpr (QT == 0) {
    kcu_gg_load_b_dense<T, BN>(sb, w, row_bytes, N, K, n0, k0);
  } else {
    constexpr int SUBS = KCU_GG_BK / KCU_QSUB;
    for (int i = threadIdx.x; i < BN * SUBS; i += KCU_GG_NT) {
      const int r = i / SUBS, s = i % SUBS, n = n0 + r, col = k0 + s * KCU_QSUB;
      float v[KCU_QSUB];
      if (n < N && col < K) {
        int sub;
        kcu_deq32<QT>(kcu_sub_block<QT>(w + (size_t)n * row_bytes, col / KCU_QSUB, &sub), sub, v);
      } else {
#pragma unroll
        for (int j = 0; j < KCU_QSUB; j++) v[j] = 0.f;
      }
#pragma unroll
      for (int c = 0; c < KCU_QSUB / 8; c++)
        kcu_st_shared16(sb + kcu_gg_off(r, s * (KCU_QSUB / 8) + c), kcu_pack8<T>(v + 8 * c));
    }
  }
}

/* acc[b] += A B[b]^T over one stage, for the warp's fragments. */
template <typename T, int BM, int NB>
__device__ __forceinline__ void kcu_gg_mma_stage(float (*acc)[kcu_gg_tile<BM>::MF][kcu_gg_tile<BM>::NF][4],
                                                  uint32_t sa, uint32_t sb, int wm, int wn, int lane) {
  typedef kcu_gg_tile<BM> S;
#pragma unroll
  for (int kk = 0; kk < KCU_GG_BK / 16; kk++) {
    uint32_t af[S::MF][4];
#pragma unroll
    for (int mf = 0; mf < S::MF; mf++)
      kcu_ldsm4(af[mf], sa + kcu_gg_off(wm * S::WM + mf * 16 + (lane & 15), 2 * kk + (lane >> 4)));
#pragma unroll
    for (int b = 0; b < NB; b++) {
#pragma unroll
      for (int np = 0; np < S::NF / 2; np++) {
        uint32_t bf[4];
        const int n = wn * S::WN + np * 16 + (lane & 7) + ((lane >> 4) << 3);
        kcu_ldsm4(bf, sb + b * kcu_gg_smem<BM, NB>::B + kcu_gg_off(n, 2 * kk + ((lane >> 3) & 1)));
#pragma unroll
        for (int mf = 0; mf < S::MF; mf++) {
          kcu_mma16816<T>(acc[b][mf][2 * np], af[mf], bf);
          kcu_mma16816<T>(acc[b][mf][2 * np + 1], af[mf], bf + 2);
        }
      }
    }
  }
}

/* Rows [m0, m0 + BM) of tile blockIdx.x times BN weight rows from
 * blockIdx.y * BN, of weight tile_w[tile]: KCU_GG_GATED (NB = 2, B = a
 * gate and an up matrix): out (T) = silu(A gate^T) * (A up^T); KCU_GG_F32:
 * out (f32) = A w^T. A tile row's source (kcu_gg_rows_t) is a's row
 * sorted / gather_k with gather_k, else its own row where sorted is not -1;
 * out row r is tile row r. */
template <typename T, int QT, int BM, int MODE>
__global__ void __launch_bounds__(KCU_GG_NT)
    kcu_gg_gemm_k(void *out, const T *a, const int32_t *sorted, int gather_k, const int32_t *tile_w,
                  const int32_t *n_tiles, const __grid_constant__ kcu_gg_ptrs_t w0,
                  const __grid_constant__ kcu_gg_ptrs_t w1, size_t row_bytes, int N, int K) {
  constexpr int NB = MODE == KCU_GG_GATED ? 2 : 1;
  typedef kcu_gg_tile<BM> S;
  typedef kcu_gg_smem<BM, NB> SM;
  extern __shared__ __align__(128) uint8_t kcu_gg_sh[];
  __shared__ int32_t rows[BM];
  kcu_pdl_enter();
  const int tile = blockIdx.x;
  if (tile >= *n_tiles) return;
  const int e = tile_w[tile], m0 = tile * BM, n0 = blockIdx.y * S::BN;
  const int warp = threadIdx.x / KCU_WARP, lane = threadIdx.x % KCU_WARP;
  const int wm = warp / S::WARPS_N, wn = warp % S::WARPS_N;
  int a_src[kcu_gg_ld<BM>::J];
  kcu_gg_tile_rows<BM>(rows, a_src, sorted, m0, gather_k);
  const uint8_t *wb[2] = {w0.p[e], NB == 2 ? w1.p[e] : w0.p[e]};
  const uint32_t base = (uint32_t)__cvta_generic_to_shared(kcu_gg_sh);
  float acc[NB][S::MF][S::NF][4];
#pragma unroll
  for (int b = 0; b < NB; b++)
#pragma unroll
    for (int mf = 0; mf < S::MF; mf++)
#pragma unroll
      for (int nf = 0; nf < S::NF; nf++)
        acc[b][mf][nf][0] = acc[b][mf][nf][1] = acc[b][mf][nf][2] = acc[b][mf][nf][3] = 0.f;
  const int nk = (K + KCU_GG_BK - 1) / KCU_GG_BK;
  auto load = [&](int kt) {
    const uint32_t st = base + (kt % S::STAGES) * SM::STAGE;
    kcu_gg_load_a<T, BM>(st, a, a_src, K, kt * KCU_GG_BK);
#pragma unroll
    for (int b = 0; b < NB; b++)
      kcu_gg_load_b<T, QT, S::BN>(st + SM::A + b * SM::B, wb[b], row_bytes, N, K, n0, kt * KCU_GG_BK);
  };
#pragma unroll
  for (int s = 0; s < S::STAGES - 1; s++) {
    if (s < nk) load(s);
    kcu_cp_commit();
  }
  for (int kt = 0; kt < nk; kt++) {
    kcu_cp_wait<S::STAGES - 2>();
    __syncthreads(); /* stage kt is in; every warp is done with stage kt - 1, which the next load overwrites */
    if (kt + S::STAGES - 1 < nk) load(kt + S::STAGES - 1);
    kcu_cp_commit();
    const uint32_t st = base + (kt % S::STAGES) * SM::STAGE;
    kcu_gg_mma_stage<T, BM, NB>(acc, st, st + SM::A, wm, wn, lane);
  }
  /* fragment element i: row g (+8 for i >= 2), columns 2q, 2q + 1 */
  const int g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int mf = 0; mf < S::MF; mf++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int r = wm * S::WM + mf * 16 + g + 8 * h;
      if (rows[r] < 0) continue;
      const size_t orow = (size_t)(m0 + r) * N;
#pragma unroll
      for (int nf = 0; nf < S::NF; nf++) {
        const int n = n0 + wn * S::WN + nf * 8 + 2 * q;
        if (n >= N) continue;
        const float(&v)[4] = acc[0][mf][nf], (&u)[4] = acc[NB - 1][mf][nf];
        kcu_gg_store2<T, MODE>(out, orow + n, v[2 * h], v[2 * h + 1], u[2 * h], u[2 * h + 1]);
      }
    }
}

/* ---- launchers --------------------------------------------------------------------------- */

template <typename T, int QT, int BM, int MODE>
static int kcu_gg_launch(kcu_ctx_t *c, void *out, const void *a, const kcu_gg_rows_t *r, const kcu_gg_ptrs_t *w0,
                         const kcu_gg_ptrs_t *w1, size_t row_bytes, int N, int K) {
  constexpr int NB = MODE == KCU_GG_GATED ? 2 : 1;
  KCU_LAUNCH(c, kcu_gg_gemm_k<T, QT, BM, MODE>, dim3(r->tiles, kcu_div_up(N, kcu_gg_cfg<BM>::BN)), KCU_GG_NT,
             (size_t)kcu_gg_smem<BM, NB>::BYTES, out, (const T *)a, r->sorted, r->gather_k, r->tile_w,
             r->n_tiles, *w0, *w1, row_bytes, N, K);
  return 0;
}

template <typename T, int MODE>
static int kcu_gg_typed(kcu_ctx_t *c, void *out, const void *a, const kcu_gg_rows_t *r, const kcu_gg_ptrs_t *w0,
                        const kcu_gg_ptrs_t *w1, kern_type_t t, size_t row_bytes, int N, int K) {
#define KCU_GG_BOTH(QT_)                                                                                          \
  return r->small ? kcu_gg_launch<T, QT_, KCU_GG_ROWS_SMALL, MODE>(c, out, a, r, w0, w1, row_bytes, N, K)          \
                  : kcu_gg_launch<T, QT_, KCU_GG_ROWS_LARGE, MODE>(c, out, a, r, w0, w1, row_bytes, N, K)
  if (t == c->act) KCU_GG_BOTH(0);
  KCU_QUANT_DISPATCH(t, return fr_errorf(FR_EUNSUPPORTED, "cuda: grouped GEMM over weights of type %d", (int)t),
                     KCU_GG_BOTH(QT));
#undef KCU_GG_BOTH
  return 0;
}

int kcu__gg(kcu_ctx_t *c, int mode, void *out, const void *a, const kcu_gg_rows_t *r, const kcu_gg_ptrs_t *w0,
            const kcu_gg_ptrs_t *w1, kern_type_t t, size_t row_bytes, int N, int K) {
  if (r->tiles <= 0) return 0;
  if (K % 8 || N % 2) return fr_errorf(FR_EUNSUPPORTED, "cuda: grouped GEMM of %d x %d", N, K);
  if (c->gg_wg && !r->small && t == c->act) return kcu__gg_wg(c, mode, out, a, r, w0, w1, row_bytes, N, K);
  int rc = 0;
  KCU_ACT_DISPATCH(c, {
    if (mode == KCU_GG_GATED) rc = kcu_gg_typed<T, KCU_GG_GATED>(c, out, a, r, w0, w1, t, row_bytes, N, K);
    else rc = kcu_gg_typed<T, KCU_GG_F32>(c, out, a, r, w0, w0, t, row_bytes, N, K);
  });
  return rc;
}

/* Raises the shared-memory limit of every GEMM of the activation type (at
 * create: a kernel's first launch may be inside a capture). */
template <typename T, int QT, int MODE> static int kcu_gg_attr(void) {
  constexpr int NB = MODE == KCU_GG_GATED ? 2 : 1;
  const cudaFuncAttribute a = cudaFuncAttributeMaxDynamicSharedMemorySize;
  KCU_CHECK(cudaFuncSetAttribute(kcu_gg_gemm_k<T, QT, KCU_GG_ROWS_LARGE, MODE>, a, kcu_gg_smem<KCU_GG_ROWS_LARGE, NB>::BYTES));
  KCU_CHECK(cudaFuncSetAttribute(kcu_gg_gemm_k<T, QT, KCU_GG_ROWS_SMALL, MODE>, a, kcu_gg_smem<KCU_GG_ROWS_SMALL, NB>::BYTES));
  return 0;
}
template <typename T, int QT> static int kcu_gg_attr_modes(void) {
  int rc = kcu_gg_attr<T, QT, KCU_GG_GATED>();
  return rc ? rc : kcu_gg_attr<T, QT, KCU_GG_F32>();
}

int kcu__gg_init(kcu_ctx_t *c) {
  static const kern_type_t quant[] = {KERN_Q4_0, KERN_Q4_1, KERN_Q5_0, KERN_Q5_1, KERN_Q8_0,
                                      KERN_Q4_K, KERN_Q5_K, KERN_Q6_K, KERN_I4G};
  int rc = 0;
#ifdef KCU_HAVE_WG
  if (c->gg_wg && (rc = kcu__gg_wg_init(c))) return rc;
#endif
  KCU_ACT_DISPATCH(c, {
    rc = kcu_gg_attr_modes<T, 0>();
    for (size_t i = 0; i < FR_ARRAY_SIZE(quant) && !rc; i++)
      KCU_QUANT_DISPATCH(quant[i], , rc = kcu_gg_attr_modes<T, QT>());
  });
  return rc;
}
