/* kcu_moe.cu - the mixture-of-experts FFN (moe_ffn, kern.h) on the GPU,
 * in kernels whose shapes do not depend on the routing, so that a decode
 * step's MoE layers are captured in its CUDA graph:
 *   router:  logits (n, E) in f32 = x router^T (cuBLAS)
 *   route:   per token (a warp), softmax over the experts, the top k (ties:
 *            the lower index, as the CPU backend), their weights,
 *            renormalised when norm_topk
 * then, for a few (token, expert) pairs (decode of a few sequences), two
 * GEMVs that stream whole weight rows:
 *   gate_up: h[pair] = silu(gate_e x_t) * up_e x_t, a warp per row
 *   down:    out[t] = sum over j, in top-k order, of w[t,j] * down_e h[pair]
 * and for more pairs, grouped GEMMs on the tensor cores:
 *   align:   the pairs grouped by expert (one CTA): each expert's rows
 *            padded to whole tiles of BM rows, a tile's expert, and each
 *            pair's row (vLLM's moe_align_block_size)
 *   gate_up: a CTA takes one tile of BM rows of one expert and BN columns of
 *            both its gate and up matrices, gathering the rows of x, and
 *            writes silu(gate) * up (f32 until then) in the activation type
 *   down:    the same GEMM over those rows and the expert's down matrix,
 *            f32 out
 *   combine: out[t] = sum over j, in top-k order, of w[t,j] * row(t,j)
 * The GEMM grids are sized for the most tiles any routing can need; CTAs
 * past the routing's count exit at once. A row's result does not depend on
 * the rows beside it. Experts are dense (the activation type) or of a
 * quantized type the backend reads (kcu_quant.cuh), dequantized in
 * registers (GEMVs) or into shared memory as the B tiles are loaded
 * (GEMMs). The experts' addresses travel as kernel parameters
 * (KCU_MOE_MAX_E of them), which a graph records. */
#include <math.h>

#include "kernels/cuda/kcu_mma.cuh"
#include "kernels/cuda/kcu_quant.cuh"

#define KCU_MOE_MAX_E 256 /* experts per layer the kernels take (their addresses are kernel parameters) */
#define KCU_MOE_WARPS 4
#define KCU_MOE_NT (KCU_MOE_WARPS * KCU_WARP)
#define KCU_MOE_BK 64     /* K per pipeline stage: one 128-byte row of 8 swizzled 16-byte chunks */
#define KCU_MOE_BM_SMALL 16 /* rows per tile while the pairs per expert are few (decode) */
#define KCU_MOE_BM_LARGE 64 /* rows per tile otherwise (prefill) */
#define KCU_MOE_ALIGN_NT 1024
#define KCU_MOE_GEMV_U 4     /* 16-byte weight loads each lane of the decode GEMVs keeps in flight */
#define KCU_MOE_MIN_TOKENS 256 /* tokens the scratch holds at the least, so small steps never grow it */
#define KCU_MOE_ROUTE_MAX (KCU_MOE_MAX_E / KCU_WARP) /* router logits per lane */

typedef struct {
  const uint8_t *p[KCU_MOE_MAX_E];
} kcu_moe_ptrs_t;

/* Rows of the sorted order a call can need: every pair, plus each used
 * expert's last tile padded. */
static long long kcu_moe_rows_cap(long long pairs, int n_exp, int bm) {
  return pairs + (long long)FR_MIN(n_exp, pairs) * (bm - 1);
}
static int kcu_moe_tiles_cap(long long pairs, int n_exp, int bm) {
  return (int)((pairs + bm - 1) / bm + FR_MIN(n_exp, pairs));
}

/* ---- route ------------------------------------------------------------------------- */

/* One warp per token: softmax of its E logits (f32), the top k and their
 * weights. Lane l holds experts l, l + 32, ... */
__global__ void kcu_moe_route_k(const float *logits, int n, int n_exp, int k, int norm, int32_t *sel, float *wt) {
  kcu_pdl_enter();
  const int t = blockIdx.x * (blockDim.x / KCU_WARP) + threadIdx.x / KCU_WARP, lane = threadIdx.x % KCU_WARP;
  if (t >= n) return;
  const float *l = logits + (size_t)t * n_exp;
  float p[KCU_MOE_ROUTE_MAX];
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < KCU_MOE_ROUTE_MAX; i++) {
    const int e = lane + KCU_WARP * i;
    p[i] = e < n_exp ? l[e] : -INFINITY;
    mx = fmaxf(mx, p[i]);
  }
  mx = kcu_warp_max(mx);
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < KCU_MOE_ROUTE_MAX; i++) {
    p[i] = lane + KCU_WARP * i < n_exp ? expf(p[i] - mx) : -1.f; /* -1: below every probability */
    sum += fmaxf(p[i], 0.f);
  }
  const float inv = 1.f / kcu_warp_sum(sum);
#pragma unroll
  for (int i = 0; i < KCU_MOE_ROUTE_MAX; i++)
    if (p[i] >= 0.f) p[i] *= inv;
  float wsum = 0.f, w_mine = 0.f;
  for (int j = 0; j < k; j++) {
    float best = -2.f;
    int bi = n_exp;
#pragma unroll
    for (int i = 0; i < KCU_MOE_ROUTE_MAX; i++) /* lane's own best: its lowest index wins a tie */
      if (p[i] > best) best = p[i], bi = lane + KCU_WARP * i;
#pragma unroll
    for (int o = KCU_WARP / 2; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ob > best || (ob == best && oi < bi)) best = ob, bi = oi;
    }
    if (bi % KCU_WARP == lane) {
#pragma unroll
      for (int i = 0; i < KCU_MOE_ROUTE_MAX; i++)
        if (i == bi / KCU_WARP) p[i] = -1.f; /* taken */
    }
    wsum += best;
    if (lane == j % KCU_WARP) w_mine = best; /* lane j keeps pair j (k <= 32 checked by the caller) */
    if (lane == 0) sel[(size_t)t * k + j] = bi;
  }
  if (lane < k) wt[(size_t)t * k + lane] = norm ? w_mine / wsum : w_mine;
}

/* ---- align ------------------------------------------------------------------------- */

/* One CTA: counts the pairs of each expert, lays the experts' rows out in
 * whole tiles of bm rows (sorted[r]: the pair at row r, -1 for padding),
 * names each tile's expert and the tiles in use (*n_tiles), and gives each
 * pair its row (slot). The experts' first tiles are a prefix sum (one warp
 * scanning 32 experts at a time). Within an expert the rows' order is the
 * atomics', which no result depends on. */
__global__ void __launch_bounds__(KCU_MOE_ALIGN_NT)
    kcu_moe_align_k(const int32_t *sel, int pairs, int n_exp, int bm, int rows_cap, int32_t *sorted,
                    int32_t *tile_exp, int32_t *n_tiles, int32_t *slot) {
  kcu_pdl_enter();
  __shared__ int cnt[KCU_MOE_MAX_E], first[KCU_MOE_MAX_E + 1], cur[KCU_MOE_MAX_E];
  const int lane = threadIdx.x % KCU_WARP;
  for (int e = threadIdx.x; e < n_exp; e += blockDim.x) cnt[e] = 0;
  for (int r = threadIdx.x; r < rows_cap; r += blockDim.x) sorted[r] = -1;
  __syncthreads();
  for (int i = threadIdx.x; i < pairs; i += blockDim.x) atomicAdd(&cnt[sel[i]], 1);
  __syncthreads();
  if (threadIdx.x < KCU_WARP) {
    int carry = 0;
    for (int e0 = 0; e0 < n_exp; e0 += KCU_WARP) {
      const int e = e0 + lane, tiles = e < n_exp ? (cnt[e] + bm - 1) / bm : 0;
      int incl = tiles;
#pragma unroll
      for (int o = 1; o < KCU_WARP; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
      }
      if (e < n_exp) first[e] = carry + incl - tiles;
      carry += __shfl_sync(0xffffffffu, incl, KCU_WARP - 1);
    }
    if (lane == 0) first[n_exp] = *n_tiles = carry;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < n_exp; e += blockDim.x) {
    for (int b = first[e]; b < first[e + 1]; b++) tile_exp[b] = e;
    cur[e] = first[e] * bm;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
    const int r = atomicAdd(&cur[sel[i]], 1);
    sorted[r] = i;
    slot[i] = r;
  }
}

/* ---- grouped GEMM -------------------------------------------------------------------- */

/* Byte offset of 16-byte chunk ch of row r in a swizzled (rows, BK) tile. */
__device__ __forceinline__ uint32_t kcu_moe_off(int r, int ch) {
  return (uint32_t)(r * (KCU_MOE_BK * 2) + ((ch ^ (r & 7)) << 4));
}

/* The A tile (bm rows of BK): row r of the tile is x row sorted[m0 + r] / k
 * (gather) or row m0 + r of a (the down GEMM's input, already in row
 * order); padding rows and columns past K read as zeros. */
template <typename T, int BM>
__device__ __forceinline__ void kcu_moe_load_a(uint32_t sa, const T *a, const int32_t *rows, int gather_k, int K,
                                               int k0) {
  constexpr int CH = KCU_MOE_BK / 8;
  for (int i = threadIdx.x; i < BM * CH; i += KCU_MOE_NT) {
    const int r = i / CH, ch = i % CH, col = k0 + ch * 8, src_row = rows[r];
    const bool ok = src_row >= 0 && col < K;
    const T *src = ok ? a + (size_t)(gather_k ? src_row / gather_k : src_row) * K + col : a;
    kcu_cp_async16(sa + kcu_moe_off(r, ch), src, ok);
  }
}

/* A tile's shape by its height BM: BN columns, the pipeline's depth, and
 * how the 4 warps share the tile (WARPS_M x WARPS_N, each warp WM x WN: MF
 * m16 by NF n8 fragments). Measured on an H200 (Qwen3-30B-A3B shapes,
 * decode at batch 1 to 64): narrower small tiles (32 columns, 6 stages,
 * the warps splitting K) were 3-17% slower than these. */
template <int BM> struct kcu_moe_cfg;
template <> struct kcu_moe_cfg<KCU_MOE_BM_LARGE> {
  enum { BN = 64, STAGES = 3, WARPS_M = 2, WARPS_N = 2 };
};
template <> struct kcu_moe_cfg<KCU_MOE_BM_SMALL> {
  enum { BN = 64, STAGES = 3, WARPS_M = 1, WARPS_N = 4 };
};
template <int BM> struct kcu_moe_tile : kcu_moe_cfg<BM> {
  typedef kcu_moe_cfg<BM> C;
  static_assert(C::WARPS_M * C::WARPS_N == KCU_MOE_WARPS, "4 warps");
  enum { WM = BM / C::WARPS_M, WN = C::BN / C::WARPS_N, MF = WM / 16, NF = WN / 8 };
  static_assert(NF % 2 == 0, "B fragments are loaded two n8 at a time");
};

/* Shared bytes of one stage (the A tile and NB B tiles) and of the pipeline. */
template <int BM, int NB> struct kcu_moe_smem {
  enum {
    A = BM * KCU_MOE_BK * 2,
    B = kcu_moe_cfg<BM>::BN * KCU_MOE_BK * 2,
    STAGE = A + NB * B,
    BYTES = kcu_moe_cfg<BM>::STAGES * STAGE
  };
};

/* A B tile (BN weight rows n0.., BK columns from k0) of one expert: dense
 * rows by cp.async, quantized ones dequantized (a 32-element sub-block per
 * thread) and stored. Rows past N and columns past K are zeros. */
template <typename T, int QT, int BN>
__device__ __forceinline__ void kcu_moe_load_b(uint32_t sb, const uint8_t *w, size_t row_bytes, int N, int K, int n0,
                                               int k0) {
  if constexpr (QT == 0) {
    constexpr int CH = KCU_MOE_BK / 8;
    for (int i = threadIdx.x; i < BN * CH; i += KCU_MOE_NT) {
      const int r = i / CH, ch = i % CH, n = n0 + r, col = k0 + ch * 8;
      const bool ok = n < N && col < K;
      const uint8_t *src = ok ? w + (size_t)n * row_bytes + (size_t)col * sizeof(T) : w;
      kcu_cp_async16(sb + kcu_moe_off(r, ch), src, ok);
    }
  } else {
    constexpr int SUBS = KCU_MOE_BK / KCU_QSUB;
    for (int i = threadIdx.x; i < BN * SUBS; i += KCU_MOE_NT) {
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
        kcu_st_shared16(sb + kcu_moe_off(r, s * (KCU_QSUB / 8) + c), kcu_pack8<T>(v + 8 * c));
    }
  }
}

/* acc[b] += A B[b]^T over one stage, for the warp's fragments. */
template <typename T, int BM, int NB>
__device__ __forceinline__ void kcu_moe_mma_stage(float (*acc)[kcu_moe_tile<BM>::MF][kcu_moe_tile<BM>::NF][4],
                                                  uint32_t sa, uint32_t sb, int wm, int wn, int lane) {
  typedef kcu_moe_tile<BM> S;
#pragma unroll
  for (int kk = 0; kk < KCU_MOE_BK / 16; kk++) {
    uint32_t af[S::MF][4];
#pragma unroll
    for (int mf = 0; mf < S::MF; mf++)
      kcu_ldsm4(af[mf], sa + kcu_moe_off(wm * S::WM + mf * 16 + (lane & 15), 2 * kk + (lane >> 4)));
#pragma unroll
    for (int b = 0; b < NB; b++) {
#pragma unroll
      for (int np = 0; np < S::NF / 2; np++) {
        uint32_t bf[4];
        const int n = wn * S::WN + np * 16 + (lane & 7) + ((lane >> 4) << 3);
        kcu_ldsm4(bf, sb + b * kcu_moe_smem<BM, NB>::B + kcu_moe_off(n, 2 * kk + ((lane >> 3) & 1)));
#pragma unroll
        for (int mf = 0; mf < S::MF; mf++) {
          kcu_mma16816<T>(acc[b][mf][2 * np], af[mf], bf);
          kcu_mma16816<T>(acc[b][mf][2 * np + 1], af[mf], bf + 2);
        }
      }
    }
  }
}

/* out rows of tile blockIdx.x, columns blockIdx.y * BN..: GATED (NB = 2, B
 * = gate and up of the tile's expert): out (T) = silu(A gate^T) * (A up^T),
 * A gathered from x by sorted / gather_k; else (NB = 1, B = down): out (f32)
 * = A down^T with A = a's rows in order. */
template <typename T, int QT, int BM, int GATED>
__global__ void __launch_bounds__(KCU_MOE_NT)
    kcu_moe_gemm_k(void *out, const T *a, int gather_k, const int32_t *sorted, const int32_t *tile_exp,
                   const int32_t *n_tiles, const __grid_constant__ kcu_moe_ptrs_t w0,
                   const __grid_constant__ kcu_moe_ptrs_t w1, size_t row_bytes, int N, int K) {
  constexpr int NB = GATED ? 2 : 1;
  typedef kcu_moe_tile<BM> S;
  typedef kcu_moe_smem<BM, NB> SM;
  extern __shared__ __align__(128) uint8_t kcu_moe_sh[];
  __shared__ int32_t rows[BM];
  kcu_pdl_enter();
  const int tile = blockIdx.x;
  if (tile >= *n_tiles) return;
  const int e = tile_exp[tile], m0 = tile * BM, n0 = blockIdx.y * S::BN;
  const int warp = threadIdx.x / KCU_WARP, lane = threadIdx.x % KCU_WARP;
  const int wm = warp / S::WARPS_N, wn = warp % S::WARPS_N;
  for (int r = threadIdx.x; r < BM; r += KCU_MOE_NT)
    rows[r] = gather_k ? sorted[m0 + r] : (sorted[m0 + r] >= 0 ? m0 + r : -1);
  __syncthreads();
  const uint8_t *wb[2] = {w0.p[e], GATED ? w1.p[e] : w0.p[e]};
  const uint32_t base = (uint32_t)__cvta_generic_to_shared(kcu_moe_sh);
  float acc[NB][S::MF][S::NF][4];
#pragma unroll
  for (int b = 0; b < NB; b++)
#pragma unroll
    for (int mf = 0; mf < S::MF; mf++)
#pragma unroll
      for (int nf = 0; nf < S::NF; nf++)
        acc[b][mf][nf][0] = acc[b][mf][nf][1] = acc[b][mf][nf][2] = acc[b][mf][nf][3] = 0.f;
  const int nk = (K + KCU_MOE_BK - 1) / KCU_MOE_BK;
  auto load = [&](int kt) {
    const uint32_t st = base + (kt % S::STAGES) * SM::STAGE;
    kcu_moe_load_a<T, BM>(st, a, rows, gather_k, K, kt * KCU_MOE_BK);
#pragma unroll
    for (int b = 0; b < NB; b++)
      kcu_moe_load_b<T, QT, S::BN>(st + SM::A + b * SM::B, wb[b], row_bytes, N, K, n0, kt * KCU_MOE_BK);
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
    kcu_moe_mma_stage<T, BM, NB>(acc, st, st + SM::A, wm, wn, lane);
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
        const float v0 = acc[0][mf][nf][2 * h], v1 = acc[0][mf][nf][2 * h + 1];
        if constexpr (GATED) {
          const float u0 = acc[NB - 1][mf][nf][2 * h], u1 = acc[NB - 1][mf][nf][2 * h + 1];
          *reinterpret_cast<uint32_t *>((T *)out + orow + n) =
              kcu_pack2<T>(v0 / (1.f + expf(-v0)) * u0, v1 / (1.f + expf(-v1)) * u1);
        } else {
          *reinterpret_cast<float2 *>((float *)out + orow + n) = make_float2(v0, v1);
        }
      }
    }
}

/* ---- combine ------------------------------------------------------------------------- */

/* out[t] = sum over j (top-k order) of wt[t, j] * y[slot[t, j]]: a CTA per
 * token and KCU_ELEM_NT * 4 columns, 4 per thread. dim % 4 == 0. */
template <typename T>
__global__ void kcu_moe_combine_k(T *out, const float *y, const float *wt, const int32_t *slot, int k, int dim) {
  kcu_pdl_enter();
  __shared__ float w_s[KCU_WARP];
  __shared__ int32_t s_s[KCU_WARP];
  const int t = blockIdx.x, d = (blockIdx.y * blockDim.x + threadIdx.x) * 4;
  if (threadIdx.x < k) {
    w_s[threadIdx.x] = wt[(size_t)t * k + threadIdx.x];
    s_s[threadIdx.x] = slot[(size_t)t * k + threadIdx.x];
  }
  __syncthreads();
  if (d >= dim) return;
  float a[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 8
  for (int j = 0; j < k; j++) {
    const float4 v = __ldg(reinterpret_cast<const float4 *>(y + (size_t)s_s[j] * dim + d));
    a[0] += w_s[j] * v.x, a[1] += w_s[j] * v.y, a[2] += w_s[j] * v.z, a[3] += w_s[j] * v.w;
  }
  T *o = out + (size_t)t * dim + d;
#pragma unroll
  for (int i = 0; i < 4; i++) o[i] = kcu_t<T>(a[i]);
}

/* ---- decode: GEMVs over the pairs ------------------------------------------------------
 * With a few pairs (a decode step of a few sequences) the tiles would be
 * mostly padding and their 128-byte row segments keep DRAM far below its
 * rate: a warp streams whole weight rows instead, as the dense GEMV does. */

/* A lane's part of dot(weight row w, x) over K elements: dense rows in
 * 16-byte loads, KCU_MOE_GEMV_U in flight; quantized rows a 32-element
 * sub-block per lane and step. */
template <typename T, int QT>
__device__ __forceinline__ float kcu_moe_row_dot(const uint8_t *w, const T *x, int K, int lane) {
  float acc = 0.f;
  if constexpr (QT == 0) {
    const uint4 *w4 = reinterpret_cast<const uint4 *>(w), *x4 = reinterpret_cast<const uint4 *>(x);
    const int n8 = K / 8;
    int i = lane;
    for (; i + (KCU_MOE_GEMV_U - 1) * KCU_WARP < n8; i += KCU_MOE_GEMV_U * KCU_WARP) {
      uint4 wv[KCU_MOE_GEMV_U];
#pragma unroll
      for (int u = 0; u < KCU_MOE_GEMV_U; u++) wv[u] = __ldcs(w4 + i + u * KCU_WARP);
#pragma unroll
      for (int u = 0; u < KCU_MOE_GEMV_U; u++) {
        float wf[8], xf[8];
        kcu_unpack8(wv[u], wf, (const T *)0);
        kcu_unpack8(__ldg(x4 + i + u * KCU_WARP), xf, (const T *)0);
#pragma unroll
        for (int j = 0; j < 8; j++) acc = fmaf(wf[j], xf[j], acc);
      }
    }
    for (; i < n8; i += KCU_WARP) {
      float wf[8], xf[8];
      kcu_unpack8(__ldcs(w4 + i), wf, (const T *)0);
      kcu_unpack8(__ldg(x4 + i), xf, (const T *)0);
#pragma unroll
      for (int j = 0; j < 8; j++) acc = fmaf(wf[j], xf[j], acc);
    }
  } else {
    const uint4 *x4 = reinterpret_cast<const uint4 *>(x);
    for (int u = lane; u < K / KCU_QSUB; u += KCU_WARP) {
      float wf[KCU_QSUB];
      int sub;
      kcu_deq32<QT>(kcu_sub_block<QT>(w, u, &sub), sub, wf);
#pragma unroll
      for (int c = 0; c < KCU_QSUB / 8; c++) {
        float xf[8];
        kcu_unpack8(__ldg(x4 + u * (KCU_QSUB / 8) + c), xf, (const T *)0);
#pragma unroll
        for (int j = 0; j < 8; j++) acc = fmaf(wf[8 * c + j], xf[j], acc);
      }
    }
  }
  return acc;
}

/* h[p, r] = silu(gate_e[r] . x_t) * (up_e[r] . x_t) for pair p (token
 * t = p / k, expert e = sel[p]): a warp per row r, grid (rows / warps, P). */
template <typename T, int QT>
__global__ void __launch_bounds__(KCU_ELEM_NT)
    kcu_moe_gemv_gu_k(T *h, const T *x, const int32_t *sel, int k, const __grid_constant__ kcu_moe_ptrs_t g,
                      const __grid_constant__ kcu_moe_ptrs_t u, size_t row_bytes, int ffn, int dim) {
  kcu_pdl_enter();
  const int warp = threadIdx.x / KCU_WARP, lane = threadIdx.x % KCU_WARP;
  const int r = blockIdx.x * (KCU_ELEM_NT / KCU_WARP) + warp, p = blockIdx.y;
  if (r >= ffn) return;
  const int e = sel[p];
  const T *xt = x + (size_t)(p / k) * dim;
  const float gv = kcu_warp_sum(kcu_moe_row_dot<T, QT>(g.p[e] + (size_t)r * row_bytes, xt, dim, lane));
  const float uv = kcu_warp_sum(kcu_moe_row_dot<T, QT>(u.p[e] + (size_t)r * row_bytes, xt, dim, lane));
  if (lane == 0) h[(size_t)p * ffn + r] = kcu_t<T>(gv / (1.f + expf(-gv)) * uv);
}

/* out[t, d] = sum over j (top-k order) of wt[t, j] * (down_e[d] . h[t k + j])
 * with e = sel[t k + j]: the down projection and the combine in one pass, a
 * warp per output column d, grid (dim / warps, n). */
template <typename T, int QT>
__global__ void __launch_bounds__(KCU_ELEM_NT)
    kcu_moe_gemv_down_k(T *out, const T *h, const int32_t *sel, const float *wt, int k,
                        const __grid_constant__ kcu_moe_ptrs_t dn, size_t row_bytes, int dim, int ffn) {
  kcu_pdl_enter();
  const int warp = threadIdx.x / KCU_WARP, lane = threadIdx.x % KCU_WARP;
  const int d = blockIdx.x * (KCU_ELEM_NT / KCU_WARP) + warp, t = blockIdx.y;
  if (d >= dim) return;
  float acc = 0.f;
  for (int j = 0; j < k; j++) {
    const int p = t * k + j;
    acc += wt[p] * kcu_warp_sum(kcu_moe_row_dot<T, QT>(dn.p[sel[p]] + (size_t)d * row_bytes, h + (size_t)p * ffn,
                                                       ffn, lane));
  }
  if (lane == 0) out[(size_t)t * dim + d] = kcu_t<T>(acc);
}

/* ---- the op ---------------------------------------------------------------------------- */

/* Views into the scratch for n tokens (carved at kcu_moe_carve). */
typedef struct {
  float *logits;  /* (n, E) */
  int32_t *sel;   /* (P) */
  float *wt;      /* (P) */
  int32_t *slot;  /* (P) */
  int32_t *sorted, *tile_exp, *n_tiles;
  void *h;        /* (rows_cap, ffn) act type */
  float *y;       /* (rows_cap, dim) */
} kcu_moe_buf_t;

static size_t kcu_moe_align_up(size_t b) { return (b + 255) & ~(size_t)255; }

/* Bytes of the scratch for n tokens (and the views when base is set). */
static size_t kcu_moe_carve(uint8_t *base, kcu_moe_buf_t *b, long long n, int k, int n_exp, int dim, int ffn,
                            size_t act) {
  const long long P = n * k, rows = kcu_moe_rows_cap(P, n_exp, KCU_MOE_BM_LARGE);
  const int tiles = FR_MAX(kcu_moe_tiles_cap(P, n_exp, KCU_MOE_BM_LARGE), kcu_moe_tiles_cap(P, n_exp, KCU_MOE_BM_SMALL));
  const size_t sz[9] = {(size_t)(n * n_exp) * 4, (size_t)P * 4, (size_t)P * 4, (size_t)P * 4, (size_t)rows * 4,
                        (size_t)tiles * 4, 4, (size_t)rows * ffn * act, (size_t)rows * dim * 4};
  size_t off = 0;
  void *v[9];
  for (int i = 0; i < 9; i++) {
    v[i] = base ? base + off : NULL;
    off += kcu_moe_align_up(sz[i]);
  }
  if (base)
    *b = (kcu_moe_buf_t){(float *)v[0], (int32_t *)v[1], (float *)v[2], (int32_t *)v[3], (int32_t *)v[4],
                         (int32_t *)v[5], (int32_t *)v[6], v[7], (float *)v[8]};
  return off;
}

/* Grows the scratch for n tokens of this layer's shape (never inside a
 * capture: the warm-up step, the largest, sizes it; growing drops graphs). */
static int kcu_moe_reserve(kcu_ctx_t *c, const kern_moe_t *m, int n, kcu_moe_buf_t *b) {
  const int dim = (int)m->router->cols, ffn = (int)m->gate[0].rows;
  const long long tok = FR_MAX((long long)n, (long long)KCU_MOE_MIN_TOKENS);
  const size_t need = kcu_moe_carve(NULL, b, tok, m->n_used, m->n_experts, dim, ffn, c->act_size);
  if (need > c->moe_bytes) {
    int rc = kcu__not_capturing(c, "growing the MoE scratch");
    if (rc) return rc;
    KCU_CHECK(cudaStreamSynchronize(c->stream));
    kcu__graphs_drop(c);
    kcu__free(c->moe_buf);
    c->moe_buf = NULL;
    c->moe_bytes = 0;
    if ((rc = kcu__alloc(c, need, &c->moe_buf, "MoE scratch"))) return rc;
    c->moe_bytes = need;
  }
  kcu_moe_carve((uint8_t *)c->moe_buf, b, tok, m->n_used, m->n_experts, dim, ffn, c->act_size);
  return 0;
}

static int kcu_moe_check(const kcu_ctx_t *c, const kern_moe_t *m, int n) {
  if (n < 0 || !m || !m->router || !m->gate || !m->up || !m->down || m->n_experts < 1 ||
      m->n_experts > KCU_MOE_MAX_E || m->n_used < 1 || m->n_used > m->n_experts || m->n_used > KCU_WARP ||
      m->router->rows != m->n_experts)
    return fr_errorf(FR_EUNSUPPORTED, "cuda: moe_ffn: %d of %d experts (at most %d experts, top-%d)",
                     m ? m->n_used : 0, m ? m->n_experts : 0, KCU_MOE_MAX_E, KCU_WARP);
  const int64_t dim = m->router->cols, ffn = m->gate[0].rows;
  const kern_type_t t = m->gate[0].type;
  if (dim % 8 || ffn % 8 || (t != c->act && (dim % KCU_QSUB || ffn % KCU_QSUB)))
    return fr_errorf(FR_EUNSUPPORTED, "cuda: moe_ffn: dim %lld and expert ffn %lld must be multiples of %d",
                     (long long)dim, (long long)ffn, t == c->act ? 8 : KCU_QSUB);
  for (int e = 0; e < m->n_experts; e++) {
    const kern_weight_t *w[3] = {&m->gate[e], &m->up[e], &m->down[e]};
    for (int i = 0; i < 3; i++)
      if (w[i]->type != t || w[i]->rows != (i < 2 ? ffn : dim) || w[i]->cols != (i < 2 ? dim : ffn) || w[i]->perm)
        return fr_errorf(FR_EUNSUPPORTED, "cuda: moe_ffn: expert %d differs from expert 0 in type or shape "
                                          "(or has a column permutation)", e);
  }
  if (t != c->act && !(kern_type_traits(t) && kern_type_traits(t)->quantized && kcu__supports_type(t)))
    return fr_errorf(FR_EUNSUPPORTED, "cuda: moe_ffn: experts of type %d", (int)t);
  return 0;
}

/* Router logits (n, E) in f32: straight from cuBLAS for a router of the
 * activation type; a quantized router goes through the ordinary matmul into
 * act-type staging (the start of y, which the down GEMM writes later) and
 * is widened. */
static int kcu_moe_router(kcu_ctx_t *c, const kcu_moe_buf_t *b, const kern_weight_t *r, const void *x, int n) {
  if (r->type != c->act) {
    int rc = kcu__matmul(c, b->y, r, NULL, x, n);
    return rc ? rc : kcu__convert(c, b->logits, KERN_F32, b->y, c->act, (size_t)n * r->rows);
  }
  const float alpha = 1.f, beta = 0.f;
  const cudaDataType_t dt = c->act == KERN_BF16 ? CUDA_R_16BF : CUDA_R_16F;
  KCU_CUBLAS(cublasGemmEx(c->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)r->rows, n, (int)r->cols, &alpha, r->data, dt,
                          (int)r->cols, x, dt, (int)r->cols, &beta, b->logits, CUDA_R_32F, (int)r->rows,
                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return 0;
}

static void kcu_moe_ptrs(kcu_moe_ptrs_t *p, const kern_weight_t *w, int n_exp) {
  for (int e = 0; e < n_exp; e++) p->p[e] = (const uint8_t *)w[e].data;
}

/* Both grouped GEMMs of one tile height. */
template <typename T, int QT, int BM>
static int kcu_moe_gemms(kcu_ctx_t *c, const kern_moe_t *m, const kcu_moe_buf_t *b, const T *x, int tiles) {
  const int dim = (int)m->router->cols, ffn = (int)m->gate[0].rows;
  kcu_moe_ptrs_t g, u, d;
  kcu_moe_ptrs(&g, m->gate, m->n_experts);
  kcu_moe_ptrs(&u, m->up, m->n_experts);
  kcu_moe_ptrs(&d, m->down, m->n_experts);
  const size_t s2 = kcu_moe_smem<BM, 2>::BYTES, s1 = kcu_moe_smem<BM, 1>::BYTES;
  constexpr int BN = kcu_moe_cfg<BM>::BN;
  KCU_LAUNCH(c, kcu_moe_gemm_k<T, QT, BM, 1>, dim3(tiles, kcu_div_up(ffn, BN)), KCU_MOE_NT, s2, b->h, x,
             m->n_used, b->sorted, b->tile_exp, b->n_tiles, g, u, m->gate[0].row_bytes, ffn, dim);
  KCU_LAUNCH(c, kcu_moe_gemm_k<T, QT, BM, 0>, dim3(tiles, kcu_div_up(dim, BN)), KCU_MOE_NT, s1, b->y,
             (const T *)b->h, 0, b->sorted, b->tile_exp, b->n_tiles, d, d, m->down[0].row_bytes, dim, ffn);
  return 0;
}

/* The decode path: both GEMVs, the down one with the combine. */
template <typename T, int QT>
static int kcu_moe_gemvs(kcu_ctx_t *c, const kern_moe_t *m, const kcu_moe_buf_t *b, T *out, const T *x, int n) {
  const int dim = (int)m->router->cols, ffn = (int)m->gate[0].rows, k = m->n_used, wpc = KCU_ELEM_NT / KCU_WARP;
  kcu_moe_ptrs_t g, u, d;
  kcu_moe_ptrs(&g, m->gate, m->n_experts);
  kcu_moe_ptrs(&u, m->up, m->n_experts);
  kcu_moe_ptrs(&d, m->down, m->n_experts);
  KCU_LAUNCH(c, kcu_moe_gemv_gu_k<T, QT>, dim3(kcu_div_up(ffn, wpc), n * k), KCU_ELEM_NT, 0, (T *)b->h, x,
             (const int32_t *)b->sel, k, g, u, m->gate[0].row_bytes, ffn, dim);
  KCU_LAUNCH(c, kcu_moe_gemv_down_k<T, QT>, dim3(kcu_div_up(dim, wpc), n), KCU_ELEM_NT, 0, out, (const T *)b->h,
             (const int32_t *)b->sel, (const float *)b->wt, k, d, m->down[0].row_bytes, dim, ffn);
  return 0;
}

template <typename T>
static int kcu_moe_gemvs_typed(kcu_ctx_t *c, const kern_moe_t *m, const kcu_moe_buf_t *b, T *out, const T *x, int n) {
  const kern_type_t t = m->gate[0].type;
  if (t == c->act) return kcu_moe_gemvs<T, 0>(c, m, b, out, x, n);
  KCU_QUANT_DISPATCH(t, return fr_errorf(FR_EUNSUPPORTED, "cuda: moe_ffn: experts of type %d", (int)t),
                     return kcu_moe_gemvs<T, QT>(c, m, b, out, x, n));
  return 0;
}

template <typename T, int BM>
static int kcu_moe_gemms_typed(kcu_ctx_t *c, const kern_moe_t *m, const kcu_moe_buf_t *b, const T *x, int tiles) {
  const kern_type_t t = m->gate[0].type;
  if (t == c->act) return kcu_moe_gemms<T, 0, BM>(c, m, b, x, tiles);
  KCU_QUANT_DISPATCH(t, return fr_errorf(FR_EUNSUPPORTED, "cuda: moe_ffn: experts of type %d", (int)t),
                     return kcu_moe_gemms<T, QT, BM>(c, m, b, x, tiles));
  return 0;
}

/* Raises the shared-memory limit of every grouped GEMM of the activation
 * type (at create: a kernel's first launch may be inside a capture). */
template <typename T, int QT> static int kcu_moe_attr_one(void) {
  const int l2 = kcu_moe_smem<KCU_MOE_BM_LARGE, 2>::BYTES, l1 = kcu_moe_smem<KCU_MOE_BM_LARGE, 1>::BYTES;
  const int s2 = kcu_moe_smem<KCU_MOE_BM_SMALL, 2>::BYTES, s1 = kcu_moe_smem<KCU_MOE_BM_SMALL, 1>::BYTES;
  const cudaFuncAttribute a = cudaFuncAttributeMaxDynamicSharedMemorySize;
  KCU_CHECK(cudaFuncSetAttribute(kcu_moe_gemm_k<T, QT, KCU_MOE_BM_LARGE, 1>, a, l2));
  KCU_CHECK(cudaFuncSetAttribute(kcu_moe_gemm_k<T, QT, KCU_MOE_BM_LARGE, 0>, a, l1));
  KCU_CHECK(cudaFuncSetAttribute(kcu_moe_gemm_k<T, QT, KCU_MOE_BM_SMALL, 1>, a, s2));
  KCU_CHECK(cudaFuncSetAttribute(kcu_moe_gemm_k<T, QT, KCU_MOE_BM_SMALL, 0>, a, s1));
  return 0;
}

int kcu__moe_init(kcu_ctx_t *c) {
  static const kern_type_t quant[] = {KERN_Q4_0, KERN_Q4_1, KERN_Q5_0, KERN_Q5_1, KERN_Q8_0,
                                      KERN_Q4_K, KERN_Q5_K, KERN_Q6_K, KERN_I4G};
  int rc = 0;
  KCU_ACT_DISPATCH(c, {
    rc = kcu_moe_attr_one<T, 0>();
    for (size_t i = 0; i < FR_ARRAY_SIZE(quant) && !rc; i++)
      KCU_QUANT_DISPATCH(quant[i], , rc = kcu_moe_attr_one<T, QT>());
  });
  return rc;
}

int kcu__moe_ffn(void *ctx, void *out, const void *x, int n, const kern_moe_t *m) {
  kcu_ctx_t *c = (kcu_ctx_t *)ctx;
  int rc = kcu_moe_check(c, m, n);
  if (rc || n == 0) return rc;
  kcu_moe_buf_t b;
  if ((rc = kcu_moe_reserve(c, m, n, &b))) return rc;
  const int k = m->n_used, E = m->n_experts, dim = (int)m->router->cols;
  const long long P = (long long)n * k;
  const int bm = P <= c->moe_small_pairs ? KCU_MOE_BM_SMALL : KCU_MOE_BM_LARGE;
  const int rows = (int)kcu_moe_rows_cap(P, E, bm), tiles = kcu_moe_tiles_cap(P, E, bm);
  if ((rc = kcu_moe_router(c, &b, m->router, x, n))) return rc;
  const int route_warps = KCU_ELEM_NT / KCU_WARP;
  KCU_LAUNCH(c, kcu_moe_route_k, kcu_div_up(n, route_warps), KCU_ELEM_NT, 0, (const float *)b.logits, n, E, k,
             (int)m->norm_topk, b.sel, b.wt);
  if (P <= c->moe_gemv_pairs) {
    KCU_ACT_DISPATCH(c, rc = kcu_moe_gemvs_typed<T>(c, m, &b, (T *)out, (const T *)x, n));
    return rc;
  }
  KCU_LAUNCH(c, kcu_moe_align_k, 1, KCU_MOE_ALIGN_NT, 0, (const int32_t *)b.sel, (int)P, E, bm, rows, b.sorted,
             b.tile_exp, b.n_tiles, b.slot);
  const dim3 cgrid(n, kcu_div_up(dim, KCU_ELEM_NT * 4));
  KCU_ACT_DISPATCH(c, {
    rc = bm == KCU_MOE_BM_SMALL ? kcu_moe_gemms_typed<T, KCU_MOE_BM_SMALL>(c, m, &b, (const T *)x, tiles)
                                : kcu_moe_gemms_typed<T, KCU_MOE_BM_LARGE>(c, m, &b, (const T *)x, tiles);
    if (rc) return rc;
    KCU_LAUNCH(c, kcu_moe_combine_k<T>, cgrid, KCU_ELEM_NT, 0, (T *)out, (const float *)b.y, (const float *)b.wt,
               (const int32_t *)b.slot, k, dim);
  });
  return 0;
}
