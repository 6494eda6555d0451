/* kcu_matmul.cu - out(n, rows) = x(n, cols) @ W^T (+ bias).
 *
 * Small n (decode): hand-written GEMV kernels that stream each weight row
 * once with 16-byte loads and keep the n activation rows in the read-only
 * cache; dense (act type) weights and quantized weights (dequantized to f32
 * in registers, one 32-element sub-block per lane). Larger n: cuBLAS
 * (bf16/f16 in, f32 accumulate); quantized weights are first dequantized
 * into the act-type scratch, in row chunks that fit it. The dense GEMV's
 * pair form (kcu_gemv_pair_k) hands two rows' sums to an epilogue: rope +
 * KV append for a fused q/k/v weight, silu_mul for a fused gate/up one
 * (kcu__matmul_rope_kv_append, kcu__matmul_silu_mul). FP8 weights
 * (KERN_F8R): the GEMV over their bytes for small n, else kcu_f8.cu's
 * cuBLASLt FP8 GEMM. */
#include "kernels/cuda/kcu_quant.cuh"

#define KCU_GEMV_WARPS 8 /* warps per CTA of the GEMV kernels: a row takes 1, 2 or 4 of them (dense) or one
                            (quantized), so a CTA serves 8 / that many rows */
#define KCU_GEMV_NT (KCU_GEMV_WARPS * KCU_WARP)
#define KCU_GEMV_WPR 4   /* default warps per row of the dense GEMV (FERRUM_CUDA_GEMV_WPR), see
                            kcu_gemv_dense_launch */
#define KCU_GEMV_U 4     /* 16-byte weight loads each lane of the dense GEMV keeps in flight */
#define KCU_QGEMV_U 2    /* sub-blocks each lane of the quantized GEMV keeps in flight */
#define KCU_QX_WARPS (KCU_ELEM_NT / KCU_WARP) /* sub-blocks (a warp each) per CTA of the activation
                                                quantizer: CTAs of the elementwise kernels' size */
#define KCU_DEQ_NT 128   /* threads (a sub-block each, 32 floats in registers) per CTA of the prefill
                            dequantization (not tuned) */

/* Streaming 16-byte load: the weights are read once per matmul. */
__device__ __forceinline__ uint4 kcu_ld_stream(const uint4 *p) { return __ldcs(p); }

__device__ __forceinline__ float kcu_dot8(const float *a, const float *b) {
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 8; i++) s = fmaf(a[i], b[i], s);
  return s;
}

/* 16 FP8 E4M3 weights (a 16-byte load of a KERN_F8R row) as f32. */
__device__ __forceinline__ void kcu_e4m3x16(uint4 v, float *f) {
  kcu_kvq_unpack8<KCU_KVQ_FP8>(v.x, v.y, 1.f, f);
  kcu_kvq_unpack8<KCU_KVQ_FP8>(v.z, v.w, 1.f, f + 8);
}

/* The dot products of weight row `row` (cols elements; none when row < 0)
 * with nb activation rows: acc[b] is this lane's share. Lets the next
 * kernel launch and issues the row's first U loads before the PDL wait (no
 * kernel writes weights). WPR warps per row: each lane takes every STEP-th
 * 16-byte chunk, U at a time with their loads in flight together (the last
 * group predicated, so a short row or a row's tail still issues its loads
 * at once). WT is the weights' element type: T (8 a chunk), or uint8_t for
 * KERN_F8R's FP8 bytes (16 a chunk, without the row's scale). cols % 8 ==
 * 0 (16 for FP8), W and x 16-byte aligned. BLK: KERN_F8B's bytes, each
 * chunk's sums times its 128 x 128 block's scale, bs[chunk / 8] (the row's
 * block row of scales). */
template <typename T, int NBM, int WPR, typename WT = T, bool BLK = false>
__device__ __forceinline__ void kcu_gemv_dots(float *acc, const WT *W, int row, int cols, const T *x, int nb,
                                              const float *bs) {
  constexpr int STEP = KCU_WARP * WPR, U = KCU_GEMV_U;
  constexpr bool F8 = sizeof(WT) == 1;
  constexpr int PER = F8 ? 16 : 8; /* weights a chunk */
  const int warp = threadIdx.x / KCU_WARP, lane = threadIdx.x % KCU_WARP;
  const uint4 *w4 = reinterpret_cast<const uint4 *>(W + (size_t)(row < 0 ? 0 : row) * cols);
  const int n8 = row >= 0 ? cols / PER : 0;
  int i = (warp % WPR) * KCU_WARP + lane;
  uint4 wv[U];
  float sc[U]; /* BLK: each chunk's block scale, loaded with its bytes */
  kcu_pdl_launch_next();
#pragma unroll
  for (int u = 0; u < U; u++) {
    if (i + u * STEP < n8) wv[u] = kcu_ld_stream(w4 + i + u * STEP);
    if (BLK && i + u * STEP < n8) sc[u] = __ldg(bs + (i + u * STEP) / (128 / PER));
  }
  kcu_pdl_wait();
#pragma unroll
  for (int b = 0; b < NBM; b++) acc[b] = 0.f;
  const uint4 *x4 = reinterpret_cast<const uint4 *>(x);
  const int xs = cols / 8;
  for (bool first = true; i < n8; i += U * STEP, first = false) {
    if (!first)
#pragma unroll
      for (int u = 0; u < U; u++) {
        if (i + u * STEP < n8) wv[u] = kcu_ld_stream(w4 + i + u * STEP);
        if (BLK && i + u * STEP < n8) sc[u] = __ldg(bs + (i + u * STEP) / (128 / PER));
      }
#pragma unroll
    for (int u = 0; u < U; u++) {
      if (i + u * STEP >= n8) break;
      float wf[PER], xf[8];
      if constexpr (F8) kcu_e4m3x16(wv[u], wf);
      else kcu_unpack8(wv[u], wf, (const T *)0);
#pragma unroll
      for (int b = 0; b < NBM; b++) {
        if (b < nb) {
          float d = 0.f;
#pragma unroll
          for (int h = 0; h < PER / 8; h++) {
            kcu_unpack8(__ldg(x4 + (size_t)b * xs + (i + u * STEP) * (PER / 8) + h), xf, (const T *)0);
            if constexpr (BLK) d += kcu_dot8(wf + 8 * h, xf);
            else acc[b] += kcu_dot8(wf + 8 * h, xf);
          }
          if constexpr (BLK) acc[b] = fmaf(d, sc[u], acc[b]);
        }
      }
    }
  }
}

/* Sums acc over the lanes and the WPR warps of a row: the row's totals end
 * in lane 0 of its first warp (warp % WPR == 0). Every thread calls it. */
template <int NBM, int WPR>
__device__ __forceinline__ void kcu_gemv_reduce(float *acc, float (*red)[NBM]) {
  const int warp = threadIdx.x / KCU_WARP, lane = threadIdx.x % KCU_WARP;
#pragma unroll
  for (int b = 0; b < NBM; b++) acc[b] = kcu_warp_sum(acc[b]);
  if (WPR == 1) return;
  if (lane == 0)
#pragma unroll
    for (int b = 0; b < NBM; b++) red[warp][b] = acc[b];
  __syncthreads();
  if (warp % WPR == 0 && lane == 0)
#pragma unroll
    for (int b = 0; b < NBM; b++)
#pragma unroll
      for (int p = 1; p < WPR; p++) acc[b] += red[warp + p][b];
}

/* The block row of a KERN_F8B weight's scales (wscale, bcols a block row)
 * that row's chunks read. */
__device__ __forceinline__ const float *kcu_f8b_row(const float *wscale, int row, int bcols) {
  return wscale + (size_t)(row < 0 ? 0 : row / 128) * bcols;
}

/* KCU_GEMV_WARPS warps; WPR warps per row, KCU_GEMV_WARPS / WPR rows per
 * CTA. WT uint8_t: a KERN_F8R weight (16 weights a load), each row's sums
 * times its scale in wscale; BLK: a KERN_F8B one, its block scales in
 * wscale (bcols a block row). */
template <typename T, int NBM, int WPR, typename WT = T, bool BLK = false>
__global__ void __launch_bounds__(KCU_GEMV_NT) kcu_gemv_dense_k(T *out, const WT *W, const float *wscale, const T *x,
                                                                 const float *bias, int rows, int cols, int nb,
                                                                 int bcols) {
  KCU_TRACE_SCOPE(KCU_TR_GEMV);
  __shared__ float red[KCU_GEMV_WARPS][NBM];
  constexpr int RPC = KCU_GEMV_WARPS / WPR;
  const int warp = threadIdx.x / KCU_WARP, lane = threadIdx.x % KCU_WARP;
  const int row = blockIdx.x * RPC + warp / WPR;
  float acc[NBM];
  kcu_gemv_dots<T, NBM, WPR, WT, BLK>(acc, W, row < rows ? row : -1, cols, x, nb,
                                      BLK ? kcu_f8b_row(wscale, row, bcols) : NULL);
  kcu_gemv_reduce<NBM, WPR>(acc, red);
  if (warp % WPR == 0 && lane == 0 && row < rows) {
    float bv = bias ? bias[row] : 0.f;
    if constexpr (sizeof(WT) == 1 && !BLK) {
      const float sc = __ldg(wscale + row);
#pragma unroll
      for (int b = 0; b < NBM; b++)
        if (b < nb) out[(size_t)b * rows + row] = kcu_t<T>(fmaf(acc[b], sc, bv));
    } else {
#pragma unroll
      for (int b = 0; b < NBM; b++)
        if (b < nb) out[(size_t)b * rows + row] = kcu_t<T>(acc[b] + bv);
    }
  }
}

/* The dense GEMV over pairs of weight rows whose outputs one epilogue
 * combines: each CTA computes KCU_GEMV_WARPS / WPR / 2 pairs, rows
 * E::row(pair, 0) and E::row(pair, 1) (-1: no such pair), and hands each
 * pair's two sums (bias added) to E::store. WT uint8_t: a KERN_F8R
 * weight, its sums times wscale's row scales; BLK: a KERN_F8B one, as
 * kcu_gemv_dense_k. */
template <typename T, int NBM, int WPR, typename E, typename WT = T, bool BLK = false>
__global__ void __launch_bounds__(KCU_GEMV_NT) kcu_gemv_pair_k(E epi, const WT *W, const float *wscale, const T *x,
                                                                const float *bias, int cols, int nb, int bcols) {
  KCU_TRACE_SCOPE(KCU_TR_GEMV_PAIR);
  constexpr int PPC = KCU_GEMV_WARPS / WPR / 2;
  static_assert(PPC >= 1, "a CTA holds whole pairs");
  __shared__ float red[KCU_GEMV_WARPS][NBM];
  __shared__ float second[PPC][NBM];
  const int warp = threadIdx.x / KCU_WARP, lane = threadIdx.x % KCU_WARP, slot = warp / WPR;
  const int pair = blockIdx.x * PPC + slot / 2, side = slot % 2;
  const int row = epi.row(pair, side);
  float acc[NBM];
  kcu_gemv_dots<T, NBM, WPR, WT, BLK>(acc, W, row, cols, x, nb, BLK ? kcu_f8b_row(wscale, row, bcols) : NULL);
  kcu_gemv_reduce<NBM, WPR>(acc, red);
  const bool lead = warp % WPR == 0 && lane == 0 && row >= 0;
  const float bv = lead && bias ? bias[row] : 0.f;
  if constexpr (sizeof(WT) == 1 && !BLK) { /* KERN_F8R: times the row's scale, as kcu_gemv_dense_k */
    const float sc = lead ? __ldg(wscale + row) : 0.f;
#pragma unroll
    for (int b = 0; b < NBM; b++) acc[b] = fmaf(acc[b], sc, bv);
  } else {
#pragma unroll
    for (int b = 0; b < NBM; b++) acc[b] += bv;
  }
  if (lead && side == 1)
#pragma unroll
    for (int b = 0; b < NBM; b++) second[slot / 2][b] = acc[b];
  __syncthreads();
  if (lead && side == 0) epi.template store<NBM>(pair, acc, second[slot / 2], nb);
}

/* Pair epilogue: out(n, d) = silu(gate) * up, W = [gate; up] (2d rows):
 * pair j is rows j and d + j. Each sum is rounded to T first, as the
 * matmul's output would be before silu_mul reads it. */
template <typename T> struct kcu_epi_silu {
  T *out;
  int d;
  __device__ int row(int pair, int side) const { return pair < d ? pair + side * d : -1; }
  template <int NBM> __device__ void store(int j, const float *g, const float *u, int nb) const {
#pragma unroll
    for (int b = 0; b < NBM; b++) {
      if (b >= nb) break;
      const float gv = kcu_f(kcu_t<T>(g[b])), uv = kcu_f(kcu_t<T>(u[b]));
      out[(size_t)b * d + j] = kcu_silu_mul1<T>(gv, uv);
    }
  }
};

/* Pair epilogue: q, k, v of each token side by side (n_heads, n_kv, n_kv
 * heads of hd, all dims rotated) as the qkv matmul writes them, then rope
 * and the K/V append as kcu_rope_kv_append_k does them. A pair is the two
 * rows one rotation mixes (q and k heads), or two neighbouring v rows. */
template <typename T> struct kcu_epi_rope_kv {
  T *qkv, *kc, *vc;
  const int32_t *positions, *slots;
  const float *inv_freq;
  int n_heads, n_kv, hd, neox;
  float attn_factor;
  long long n_slots;
  __device__ int rot_pairs() const { return (n_heads + n_kv) * (hd / 2); }
  /* a rotated pair's two dims within its head */
  __device__ int dim(int p, int side) const { return neox ? p + side * (hd / 2) : 2 * p + side; }
  __device__ int row(int pair, int side) const {
    const int half = hd / 2;
    if (pair < rot_pairs()) return (pair / half) * hd + dim(pair % half, side);
    return pair < rot_pairs() + n_kv * half ? (n_heads + n_kv) * hd + 2 * (pair - rot_pairs()) + side : -1;
  }
  template <int NBM> __device__ void store(int pair, const float *a, const float *b, int nb) const {
    const int half = hd / 2, rows = (n_heads + 2 * n_kv) * hd, kvrow = n_kv * hd;
    const bool rot = pair < rot_pairs();
    const int h = pair / half, p = pair % half, ra = row(pair, 0), rb = row(pair, 1);
#pragma unroll
    for (int t = 0; t < NBM; t++) {
      if (t >= nb) break;
      T ya = kcu_t<T>(a[t]), yb = kcu_t<T>(b[t]);
      if (rot) {
        float s, co;
        kcu_rope_sincos(positions[t], inv_freq[p], attn_factor, &s, &co);
        kcu_rope_rotate<T>(kcu_f(ya), kcu_f(yb), s, co, &ya, &yb);
      }
      qkv[(size_t)t * rows + ra] = ya;
      qkv[(size_t)t * rows + rb] = yb;
      const int32_t slot = slots[t];
      if (slot < 0 || slot >= n_slots || (rot && h < n_heads)) continue;
      if (rot) {
        T *k = kc + (size_t)slot * kvrow + (size_t)(h - n_heads) * hd;
        k[dim(p, 0)] = ya;
        k[dim(p, 1)] = yb;
      } else {
        T *v = vc + (size_t)slot * kvrow + (ra - (n_heads + n_kv) * hd);
        v[0] = ya;
        v[1] = yb;
      }
    }
  }
};

/* Activations to int8 per KCU_QSUB elements: one warp per sub-block.
 * xq (n, cols) int8; xd (n, cols / KCU_QSUB) (scale, scale * sum of q).
 * With perm (a permuted weight, device memory), element k of a row of xq
 * is x[perm[k]] of that row: the gather costs nothing beyond the read. */
static_assert(KCU_QSUB == KCU_WARP, "the activation quantizer gives each lane one element of a sub-block");
template <typename T>
__global__ void kcu_quant_q8_1_k(const T *x, int8_t *xq, float2 *xd, long long n_blocks, const int32_t *perm,
                                 int nsub) {
  kcu_pdl_enter();
  long long blk = blockIdx.x * (long long)KCU_QX_WARPS + threadIdx.x / KCU_WARP;
  if (blk >= n_blocks) return;
  int lane = threadIdx.x % KCU_WARP;
  long long src = blk * KCU_QSUB + lane;
  if (perm) {
    long long row = blk / nsub;
    src = row * nsub * KCU_QSUB + __ldg(perm + (blk - row * nsub) * KCU_QSUB + lane);
  }
  float v = kcu_f(x[src]);
  float amax = kcu_warp_max(fabsf(v)), d = amax / 127.f;
  int q = amax > 0.f ? __float2int_rn(v / d) : 0;
  xq[blk * KCU_QSUB + lane] = (int8_t)q;
  float sum = kcu_warp_sum((float)q);
  if (lane == 0) xd[blk] = make_float2(d, d * sum);
}

/* Sub-blocks u0, u0 + 32, ... of a row's weights, KCU_QGEMV_U of them. */
template <int QT>
__device__ __forceinline__ void kcu_gemv_q_load(kcu_qv_t *w, const uint8_t *wr, int u0, int nsub) {
  int sub;
#pragma unroll
  for (int h = 0; h < KCU_QGEMV_U; h++)
    if (u0 + KCU_WARP * h < nsub) kcu_qv<QT>(kcu_sub_block<QT>(wr, u0 + KCU_WARP * h, &sub), sub, &w[h]);
}

/* Quantized GEMV (int8 dot products): one warp per row, one sub-block per
 * lane and step, KCU_QGEMV_U sub-blocks in flight, the first ones read
 * before the PDL wait (no kernel writes weights). */
template <int QT, int NBM>
__global__ void __launch_bounds__(KCU_GEMV_NT)
    kcu_gemv_q_k(void *out_v, int out_bf16, const uint8_t *W, size_t row_bytes, const int8_t *xq, const float2 *xd,
                 const float *bias, int rows, int cols, int nb) {
  int warp = threadIdx.x / KCU_WARP, lane = threadIdx.x % KCU_WARP;
  int row = blockIdx.x * KCU_GEMV_WARPS + warp;
  const uint8_t *wr = W + (size_t)row * row_bytes;
  const int nsub = cols / KCU_QSUB;
  kcu_qv_t w[KCU_QGEMV_U];
  bool loaded = row < rows;
  kcu_pdl_launch_next();
  if (loaded) kcu_gemv_q_load<QT>(w, wr, lane, nsub);
  kcu_pdl_wait();
  float acc[NBM];
#pragma unroll
  for (int b = 0; b < NBM; b++) acc[b] = 0.f;
  if (row < rows) {
    for (int u0 = lane; u0 < nsub; u0 += KCU_QGEMV_U * KCU_WARP) {
      if (!loaded) kcu_gemv_q_load<QT>(w, wr, u0, nsub);
      loaded = false;
#pragma unroll
      for (int h = 0; h < KCU_QGEMV_U; h++) {
        const int u = u0 + KCU_WARP * h;
        if (u >= nsub) break;
#pragma unroll
        for (int b = 0; b < NBM; b++) {
          if (b < nb) {
            const uint4 *xp = reinterpret_cast<const uint4 *>(xq + (size_t)b * cols + KCU_QSUB * u);
            uint4 x0 = __ldg(xp), x1 = __ldg(xp + 1);
            int xi[8] = {(int)x0.x, (int)x0.y, (int)x0.z, (int)x0.w, (int)x1.x, (int)x1.y, (int)x1.z, (int)x1.w};
            acc[b] += kcu_qv_dot(&w[h], xi, __ldg(xd + (size_t)b * nsub + u));
          }
        }
      }
    }
  }
#pragma unroll
  for (int b = 0; b < NBM; b++) acc[b] = kcu_warp_sum(acc[b]);
  if (lane == 0 && row < rows) {
    float bv = bias ? bias[row] : 0.f;
#pragma unroll
    for (int b = 0; b < NBM; b++) {
      if (b < nb) {
        size_t i = (size_t)b * rows + row;
        if (out_bf16) ((__nv_bfloat16 *)out_v)[i] = __float2bfloat16(acc[b] + bv);
        else ((__half *)out_v)[i] = __float2half(acc[b] + bv);
      }
    }
  }
}

/* Dequantizes rows [row0, row0 + nrows) of w into dst (nrows, cols) of T.
 * With perm (a permuted weight, device memory), column k goes to column
 * perm[k]: dst is the weight in the input's order, so the GEMM reads x as
 * it is. */
template <typename T, int QT>
__global__ void kcu_dequant_k(T *dst, const uint8_t *W, size_t row_bytes, int64_t row0, long long n_units, int cols,
                              const int32_t *perm) {
  kcu_pdl_enter();
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= n_units) return;
  int per = cols / KCU_QSUB;
  long long r = i / per;
  int u = (int)(i % per), sub;
  float w[KCU_QSUB];
  kcu_deq32<QT>(kcu_sub_block<QT>(W + (size_t)(row0 + r) * row_bytes, u, &sub), sub, w);
  T *row = dst + (size_t)r * cols;
  if (perm) {
    const int4 *p4 = reinterpret_cast<const int4 *>(perm + KCU_QSUB * u);
#pragma unroll
    for (int k = 0; k < KCU_QSUB / 4; k++) {
      int4 p = __ldg(p4 + k);
      row[p.x] = kcu_t<T>(w[4 * k]);
      row[p.y] = kcu_t<T>(w[4 * k + 1]);
      row[p.z] = kcu_t<T>(w[4 * k + 2]);
      row[p.w] = kcu_t<T>(w[4 * k + 3]);
    }
    return;
  }
  uint4 *o = reinterpret_cast<uint4 *>(row + KCU_QSUB * u);
#pragma unroll
  for (int k = 0; k < KCU_QSUB / 8; k++) o[k] = kcu_pack8<T>(w + 8 * k);
}

/* The device copy of a weight's column permutation (kcu_perm_upload), or
 * NULL. */
static const int32_t *kcu_perm(const kern_weight_t *w) { return w->perm ? (const int32_t *)w->priv : NULL; }

int kcu__dequant_rows(kcu_ctx_t *c, void *dst, const kern_weight_t *w, int64_t row0, int64_t nrows) {
  if (kcu_is_q4f(w->type)) return kcu__q4f_dequant_rows(c, dst, w, row0, nrows);
  long long units = nrows * (w->cols / KCU_QSUB);
  if (units == 0) return 0;
  KCU_ACT_DISPATCH(
      c, KCU_QUANT_DISPATCH(w->type, return fr_errorf(FR_EUNSUPPORTED, "cuda: dequant of type %d", (int)w->type),
                            KCU_LAUNCH(c, kcu_dequant_k<T, QT>, kcu_div_up(units, KCU_DEQ_NT), KCU_DEQ_NT, 0, (T *)dst,
                                       (const uint8_t *)w->data, w->row_bytes, row0, units, (int)w->cols,
                                       kcu_perm(w))));
  return 0;
}

/* ---- launchers ----------------------------------------------------------------------- */

template <typename T, int NBM, bool BLK, typename WT>
static int kcu_gemv_dense_launch(kcu_ctx_t *c, T *out, const WT *W, const float *wscale, const T *x, const float *bias,
                                 int rows, int cols, int nb, int wpr, int bcols) {
  if (wpr == 4)
    KCU_LAUNCH(c, kcu_gemv_dense_k<T, NBM, 4, WT, BLK>, kcu_div_up(rows, KCU_GEMV_WARPS / 4), KCU_GEMV_NT, 0, out, W,
               wscale, x, bias, rows, cols, nb, bcols);
  else if (wpr == 2)
    KCU_LAUNCH(c, kcu_gemv_dense_k<T, NBM, 2, WT, BLK>, kcu_div_up(rows, KCU_GEMV_WARPS / 2), KCU_GEMV_NT, 0, out, W,
               wscale, x, bias, rows, cols, nb, bcols);
  else
    KCU_LAUNCH(c, kcu_gemv_dense_k<T, NBM, 1, WT, BLK>, kcu_div_up(rows, KCU_GEMV_WARPS), KCU_GEMV_NT, 0, out, W,
               wscale, x, bias, rows, cols, nb, bcols);
  return 0;
}

template <typename T, bool BLK = false, typename WT>
static int kcu_gemv_dense_of(kcu_ctx_t *c, T *out, const WT *W, const float *wscale, const T *x, const float *bias,
                             int rows, int cols, int n, int wpr, int bcols = 0) {
  if (n == 1) return kcu_gemv_dense_launch<T, 1, BLK>(c, out, W, wscale, x, bias, rows, cols, n, wpr, bcols);
  if (n == 2) return kcu_gemv_dense_launch<T, 2, BLK>(c, out, W, wscale, x, bias, rows, cols, n, wpr, bcols);
  if (n <= 4) return kcu_gemv_dense_launch<T, 4, BLK>(c, out, W, wscale, x, bias, rows, cols, n, wpr, bcols);
  return kcu_gemv_dense_launch<T, 8, BLK>(c, out, W, wscale, x, bias, rows, cols, n, wpr, bcols);
}

/* The GEMV of w over n <= 8 rows of x: the act type, or KERN_F8R or
 * KERN_F8B (x as it is, no activation quantization). 4 warps a row of the act type: more
 * CTAs, so the last wave is shorter. Measured on H100 (cuda_ops_bench
 * gemv1), n = 1: as fast or faster than 1 or 2 for every Llama-3-8B shape,
 * 4096x4096 13.2 us against 14.8 with one warp a row. An FP8 row is half
 * the bytes: KCU_F8_GEMV_WPR. */
template <typename T>
static int kcu_gemv_dense(kcu_ctx_t *c, T *out, const kern_weight_t *w, const float *bias, const T *x, int n) {
  const int rows = (int)w->rows, cols = (int)w->cols, f8_wpr = c->gemv_wpr ? c->gemv_wpr : KCU_F8_GEMV_WPR;
  if (w->type == KERN_F8R)
    return kcu_gemv_dense_of<T>(c, out, (const uint8_t *)w->data, kcu_f8_scales(w), x, bias, rows, cols, n, f8_wpr);
  if (w->type == KERN_F8B)
    return kcu_gemv_dense_of<T, true>(c, out, (const uint8_t *)w->data, kcu_f8_scales(w), x, bias, rows, cols, n,
                                      f8_wpr, (int)kern_f8b_scale_cols(cols));
  return kcu_gemv_dense_of<T>(c, out, (const T *)w->data, (const float *)NULL, x, bias, rows, cols, n,
                              c->gemv_wpr ? c->gemv_wpr : KCU_GEMV_WPR);
}

/* Pairs at the default 4 warps a row (an FP8 weight: KCU_F8_GEMV_WPR, as
 * its plain GEMV), one pair a CTA (the other widths are tuning knobs of the
 * plain GEMV: kcu_takes_pair_gemv leaves them to it). */
template <typename T, int NBM, bool BLK, typename E, typename WT>
static int kcu_gemv_pair_launch(kcu_ctx_t *c, const E &epi, int n_pairs, const WT *W, const float *wscale,
                                const T *x, const float *bias, int cols, int nb, int bcols) {
  constexpr int WPR = sizeof(WT) == 1 ? KCU_F8_GEMV_WPR : KCU_GEMV_WPR;
  KCU_LAUNCH(c, kcu_gemv_pair_k<T, NBM, WPR, E, WT, BLK>, kcu_div_up(n_pairs, KCU_GEMV_WARPS / WPR / 2), KCU_GEMV_NT,
             0, epi, W, wscale, x, bias, cols, nb, bcols);
  return 0;
}

template <typename T, bool BLK = false, typename E, typename WT>
static int kcu_gemv_pairs_of(kcu_ctx_t *c, const E &epi, int n_pairs, const WT *W, const float *wscale, int cols,
                             const float *bias, const T *x, int n, int bcols = 0) {
  if (n == 1) return kcu_gemv_pair_launch<T, 1, BLK>(c, epi, n_pairs, W, wscale, x, bias, cols, n, bcols);
  if (n == 2) return kcu_gemv_pair_launch<T, 2, BLK>(c, epi, n_pairs, W, wscale, x, bias, cols, n, bcols);
  if (n <= 4) return kcu_gemv_pair_launch<T, 4, BLK>(c, epi, n_pairs, W, wscale, x, bias, cols, n, bcols);
  return kcu_gemv_pair_launch<T, 8, BLK>(c, epi, n_pairs, W, wscale, x, bias, cols, n, bcols);
}

/* The pair GEMV over w: the act type, or KERN_F8R or KERN_F8B. */
template <typename T, typename E>
static int kcu_gemv_pairs(kcu_ctx_t *c, const E &epi, int n_pairs, const kern_weight_t *w, const float *bias,
                          const T *x, int n) {
  const int cols = (int)w->cols;
  if (w->type == KERN_F8R)
    return kcu_gemv_pairs_of<T>(c, epi, n_pairs, (const uint8_t *)w->data, kcu_f8_scales(w), cols, bias, x, n);
  if (w->type == KERN_F8B)
    return kcu_gemv_pairs_of<T, true>(c, epi, n_pairs, (const uint8_t *)w->data, kcu_f8_scales(w), cols, bias, x, n,
                                      (int)kern_f8b_scale_cols(cols));
  return kcu_gemv_pairs_of<T>(c, epi, n_pairs, (const T *)w->data, (const float *)NULL, cols, bias, x, n);
}

template <int QT>
static int kcu_gemv_q_launch(kcu_ctx_t *c, void *out, const kern_weight_t *w, const float *bias, int n) {
  const uint8_t *W = (const uint8_t *)w->data;
  int rows = (int)w->rows, cols = (int)w->cols, g = kcu_div_up(rows, KCU_GEMV_WARPS), bf = c->act == KERN_BF16;
  size_t rb = w->row_bytes;
  const int8_t *xq = c->xq;
  const float2 *xd = (const float2 *)c->xqd;
  if (n == 1) KCU_LAUNCH(c, kcu_gemv_q_k<QT, 1>, g, KCU_GEMV_NT, 0, out, bf, W, rb, xq, xd, bias, rows, cols, n);
  else if (n == 2) KCU_LAUNCH(c, kcu_gemv_q_k<QT, 2>, g, KCU_GEMV_NT, 0, out, bf, W, rb, xq, xd, bias, rows, cols, n);
  else if (n <= 4) KCU_LAUNCH(c, kcu_gemv_q_k<QT, 4>, g, KCU_GEMV_NT, 0, out, bf, W, rb, xq, xd, bias, rows, cols, n);
  else KCU_LAUNCH(c, kcu_gemv_q_k<QT, 8>, g, KCU_GEMV_NT, 0, out, bf, W, rb, xq, xd, bias, rows, cols, n);
  return 0;
}

/* Quantizes x (n, cols) into c->xq / c->xqd, then runs the integer GEMV. */
static int kcu_gemv_quant(kcu_ctx_t *c, void *out, const kern_weight_t *w, const float *bias, const void *x, int n) {
  long long nblk = (long long)n * (w->cols / KCU_QSUB);
  if ((size_t)nblk * KCU_QSUB > c->xq_cap) return fr_errorf(FR_ESTATE, "cuda: matmul: activation scratch too small");
  KCU_ACT_DISPATCH(c, KCU_LAUNCH(c, kcu_quant_q8_1_k<T>, kcu_div_up(nblk, KCU_QX_WARPS), KCU_QX_WARPS * KCU_WARP, 0,
                                 (const T *)x, c->xq, (float2 *)c->xqd, nblk, kcu_perm(w), (int)(w->cols / KCU_QSUB)));
  KCU_QUANT_DISPATCH(w->type, return fr_errorf(FR_EUNSUPPORTED, "cuda: matmul type %d", (int)w->type),
                     return kcu_gemv_q_launch<QT>(c, out, w, bias, n));
  return 0;
}

/* C(rows, n) column-major = W(rows, cols) row-major @ x(n, cols)^T. */
static int kcu_gemm(kcu_ctx_t *c, void *out, int ldo, const void *W, const void *x, int rows, int n, int cols) {
  const float alpha = 1.f, beta = 0.f;
  cudaDataType_t dt = c->act == KERN_BF16 ? CUDA_R_16BF : CUDA_R_16F;
  kcu__x8_drop(c);
  KCU_CUBLAS(cublasGemmEx(c->cublas, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, cols, &alpha, W, dt, cols, x, dt, cols, &beta,
                          out, dt, ldo, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return 0;
}

/* Dequantizes w into the act type, a chunk of rows at a time, each chunk
 * then a cuBLAS GEMM over x (n, x_cols): the rows come out in the input's
 * order. */
static int kcu_matmul_quant_gemm(kcu_ctx_t *c, void *out, const kern_weight_t *w, const void *x, int n) {
  int64_t chunk = (int64_t)(c->deq_elems / (size_t)w->cols);
  if (chunk <= 0) return fr_errorf(FR_ESTATE, "cuda: matmul: dequant scratch missing (weight not loaded here?)");
  for (int64_t r0 = 0; r0 < w->rows; r0 += chunk) {
    int64_t nr = FR_MIN(chunk, w->rows - r0);
    int rc = kcu__dequant_rows(c, c->deq, w, r0, nr);
    if (rc) return rc;
    rc = kcu_gemm(c, (char *)out + (size_t)r0 * c->act_size, (int)w->rows, c->deq, x, (int)nr, n,
                  (int)kern_weight_x_cols(w));
    if (rc) return rc;
  }
  return 0;
}

/* Whether a matmul of w over n rows of x runs as the dense GEMV: measured
 * on H200, it beats cuBLAS at n = 1, and up to n = 4 on small weights. */
static bool kcu_takes_gemv(const kcu_ctx_t *c, const kern_weight_t *w, const void *x, int n) {
  if (w->type != c->act || ((uintptr_t)x & 15) || w->cols % 8) return false;
  int max_n = c->gemv_max_n >= 0 ? c->gemv_max_n : (w->rows * w->cols <= (8ll << 20) ? 4 : 1);
  return n <= max_n;
}

int kcu__matmul(kcu_ctx_t *c, void *out, const kern_weight_t *w, const kern_weight_t *bias, const void *x, int n) {
  if (n <= 0) return 0;
  if (w->rows > INT32_MAX || w->cols > INT32_MAX) return fr_errorf(FR_EUNSUPPORTED, "cuda: matmul: weight too large");
  if (bias && (bias->type != KERN_F32 || bias->cols != w->rows))
    return fr_errorf(FR_EFORMAT, "cuda: matmul: bias must be F32 (1, %lld)", (long long)w->rows);
  if (w->perm && !w->priv)
    return fr_errorf(FR_ESTATE, "cuda: matmul: a permuted weight without its device permutation (not loaded here?)");
  const float *bp = bias ? (const float *)bias->data : NULL;
  bool aligned = ((uintptr_t)x & 15) == 0 && w->cols % 8 == 0;
  int rc = 0;
  if (w->type == c->act) {
    if (kcu_takes_gemv(c, w, x, n)) {
      KCU_ACT_DISPATCH(c, rc = kcu_gemv_dense<T>(c, (T *)out, w, bp, (const T *)x, n));
      return rc;
    }
    rc = kcu_gemm(c, out, (int)w->rows, w->data, x, (int)w->rows, n, (int)w->cols);
  } else if (kcu_is_f8(w->type)) {
    /* past f8_gemv_max_n rows the GEMM, padded to a multiple of 4 tokens (kcu_f8.cu) */
    if (n > c->f8_gemv_max_n || !aligned) return kcu__f8_gemm(c, out, w, bp, x, n);
    KCU_ACT_DISPATCH(c, rc = kcu_gemv_dense<T>(c, (T *)out, w, bp, (const T *)x, n));
    return rc;
  } else if (kcu_is_q4f(w->type)) {
    const int max_n = w->type == KERN_Q6F ? FR_MIN(c->q4f_max_n, KCU_Q6F_MAX_N) : c->q4f_max_n;
#ifdef KCU_HAVE_WG
    if (aligned && kcu__q4f_wg_takes(c, w, n)) return kcu__q4f_wg(c, out, w, bp, x, n);
#endif
    if (n <= max_n && aligned) return kcu__q4f_matmul(c, out, w, bp, x, n);
    rc = kcu_matmul_quant_gemm(c, out, w, x, n);
  } else if (kern_type_traits(w->type) && kern_type_traits(w->type)->quantized) {
    if (n <= c->qgemv_max_n && aligned) return kcu_gemv_quant(c, out, w, bp, x, n);
    rc = kcu_matmul_quant_gemm(c, out, w, x, n);
  } else {
    return fr_errorf(FR_EUNSUPPORTED, "cuda: matmul with weight type %d (load it through weight_load)", (int)w->type);
  }
  if (rc == 0 && bp) rc = kcu__add_bias(c, out, bp, n, (int)w->rows);
  return rc;
}

/* Whether a fused op over w runs as the pair GEMV. */
static bool kcu_takes_pair_gemv(const kcu_ctx_t *c, const kern_weight_t *w, const void *x, int n) {
  if (!c->fuse_gemv) return false;
  if (kcu_is_f8(w->type))
    return (c->gemv_wpr == 0 || c->gemv_wpr == KCU_F8_GEMV_WPR) && n <= c->f8_gemv_max_n && !((uintptr_t)x & 15) &&
           w->cols % 16 == 0;
  return (c->gemv_wpr == 0 || c->gemv_wpr == KCU_GEMV_WPR) && kcu_takes_gemv(c, w, x, n);
}

int kcu__matmul_silu_mul(kcu_ctx_t *c, void *out, const kern_weight_t *w, const void *x, int n, void *scratch) {
  if (n <= 0) return 0;
  if (w->rows % 2 || w->rows > INT32_MAX)
    return fr_errorf(FR_EFORMAT, "cuda: matmul_silu_mul: %lld rows, not gate and up halves", (long long)w->rows);
  const int d = (int)(w->rows / 2);
  if (kcu_takes_pair_gemv(c, w, x, n)) {
    int rc = 0;
    KCU_ACT_DISPATCH(c, rc = kcu_gemv_pairs<T>(c, kcu_epi_silu<T>{(T *)out, d}, d, w, NULL, (const T *)x, n));
    return rc;
  }
  if (kcu__q4f_silu_fits(c, w, x, n)) return kcu__q4f_matmul_silu(c, out, w, x, n);
  int rc = kcu__matmul(c, scratch, w, NULL, x, n);
  return rc ? rc : kcu__silu_mul(c, out, scratch, (char *)scratch + (size_t)d * c->act_size, n, d, 2 * d);
}

int kcu__matmul_rope_kv_append(kcu_ctx_t *c, void *qkv, const kern_weight_t *w, const kern_weight_t *bias,
                               const void *x, int n, kern_kv_pool_t *pool, int layer, int n_heads,
                               const kern_rope_t *r) {
  const kern_kv_config_t *cf = &pool->cfg;
  const int hd = cf->head_dim, n_kv = cf->n_kv_heads, rows = (n_heads + 2 * n_kv) * hd;
  if (n <= 0) return 0;
  if (w->rows != rows)
    return fr_errorf(FR_EFORMAT, "cuda: matmul_rope_kv_append: %lld rows for %d + 2 x %d heads of %d",
                     (long long)w->rows, n_heads, n_kv, hd);
  /* fused where the GEMV runs and rope_kv_append would be its one kernel over all dims */
  const bool fused = kcu_takes_pair_gemv(c, w, x, n) && n == c->n_tokens && cf->dtype == KERN_KV_AUTO && r->n_rot == hd &&
                     hd % 2 == 0 && r->inv_freq && r->inv_freq->type == KERN_F32 && r->inv_freq->cols >= hd / 2 &&
                     (!bias || (bias->type == KERN_F32 && bias->cols == rows));
  if (!fused) {
    const size_t es = c->act_size;
    int rc = kcu__matmul(c, qkv, w, bias, x, n);
    return rc ? rc
              : kcu__rope_kv_append(c, pool, layer, qkv, rows, (char *)qkv + (size_t)n_heads * hd * es,
                                    (char *)qkv + (size_t)(n_heads + n_kv) * hd * es, rows, n_heads, r);
  }
  char *kb = (char *)pool->base + 2 * (size_t)layer * pool->layer_bytes;
  const float *bp = bias ? (const float *)bias->data : NULL;
  const int n_pairs = rows / 2;
  int rc = 0;
  KCU_ACT_DISPATCH(c, {
    kcu_epi_rope_kv<T> e = {(T *)qkv, (T *)kb, (T *)(kb + pool->layer_bytes), c->dm.positions, c->dm.slots,
                            (const float *)r->inv_freq->data, n_heads, n_kv, hd, r->mode == KERN_ROPE_NEOX,
                            r->attn_factor, (long long)cf->n_blocks * cf->block_size};
    rc = kcu_gemv_pairs<T>(c, e, n_pairs, w, bp, (const T *)x, n);
  });
  return rc;
}
