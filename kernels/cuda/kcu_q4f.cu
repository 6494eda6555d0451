/* kcu_q4f.cu - 4-bit weights repacked for the tensor cores (KERN_Q4F,
 * kcu_q4f.cuh says the layout): the repacking at load, the matmul up to 16
 * rows (and before sm_90 up to 128; from 17 rows on sm_90 the wide kernel
 * of kcu_q4f_wide.cu), and the dequantization for the large-batch cuBLAS
 * path.
 *
 * Threads: the backend's stream. */
#include "kernels/cuda/kcu_q4f.cuh"
#include "kernels/cuda/kcu_mma.cuh"
#include "kernels/cuda/kcu_quant.cuh"

bool kcu__q4f_takes(const kcu_ctx_t *c, const kern_weight_t *w) {
  if (!c->q4f || w->keep_layout || w->rows <= 1 || w->cols % 32) return false;
  switch (w->type) {
  case KERN_Q4_0: case KERN_Q4_1: case KERN_Q4_K: case KERN_I4G:
    return true;
  case KERN_Q6_K:
    return c->q6f;
  default:
    return false;
  }
}

kern_type_t kcu__q4f_type(const kern_weight_t *w, bool grouped) {
  return w->type == KERN_Q6_K ? KERN_Q6F : grouped ? KERN_Q4G : KERN_Q4F;
}

size_t kcu__q4f_bytes(const kern_weight_t *w, kern_type_t type) {
  const size_t tiles = (size_t)kcu_q4f_tiles(w->rows), units = (size_t)kcu_q4f_units(w->cols);
  if (type == KERN_Q4G) return tiles * (units * KCU_Q4F_NIB + (size_t)kcu_q4g_pairs((int)units) * KCU_Q4F_DM / 2);
  return tiles * units * (KCU_Q4F_NIB + KCU_Q4F_DM + (type == KERN_Q6F ? KCU_Q6F_HI : 0));
}

/* ---- repacking ------------------------------------------------------------------------ */

/* The 4-bit value of weight (row, col) and the (d, m) of its 32-column
 * block, from the file's block layout. */
template <int QT> struct kcu_q4src;
template <> struct kcu_q4src<KERN_Q4_0> {
  static __device__ int q(const uint8_t *r, int c) {
    int b = r[18 * (c / 32) + 2 + c % 16];
    return c % 32 < 16 ? b & 15 : b >> 4;
  }
  static __device__ float2 dm(const uint8_t *r, int blk) {
    float d = kcu_h2f(r + 18 * blk);
    return make_float2(d, -8.f * d);
  }
};
template <> struct kcu_q4src<KERN_Q4_1> {
  static __device__ int q(const uint8_t *r, int c) {
    int b = r[20 * (c / 32) + 4 + c % 16];
    return c % 32 < 16 ? b & 15 : b >> 4;
  }
  static __device__ float2 dm(const uint8_t *r, int blk) {
    return make_float2(kcu_h2f(r + 20 * blk), kcu_h2f(r + 20 * blk + 2));
  }
};
template <> struct kcu_q4src<KERN_I4G> {
  static __device__ int q(const uint8_t *r, int c) {
    int b = r[24 * (c / 32) + 8 + c % 16];
    return c % 32 < 16 ? b & 15 : b >> 4;
  }
  static __device__ float2 dm(const uint8_t *r, int blk) {
    const float *f = reinterpret_cast<const float *>(r + 24 * blk);
    return make_float2(f[0], f[1]);
  }
};
template <> struct kcu_q4src<KERN_Q4_K> {
  /* super-block c / 256: d, dmin, 12 bytes of scales, 128 bytes of
   * nibbles; sub-block j's element l is byte 32 (j / 2) + l, the high
   * nibble for odd j */
  static __device__ int q(const uint8_t *r, int c) {
    const uint8_t *sb = r + 144 * (c / 256);
    int j = c % 256 / 32, b = sb[16 + 32 * (j / 2) + c % 32];
    return j % 2 ? b >> 4 : b & 15;
  }
  static __device__ float2 dm(const uint8_t *r, int blk) {
    const uint8_t *sb = r + 144 * (blk / 8);
    int sc, mn;
    kcu_scale_min_k4(blk % 8, sb + 4, &sc, &mn);
    return make_float2(kcu_h2f(sb) * (float)sc, -kcu_h2f(sb + 2) * (float)mn);
  }
};

template <typename T> __device__ __forceinline__ uint32_t kcu_bits(T v) {
  return (uint32_t)*reinterpret_cast<const uint16_t *>(&v);
}

/* One thread per (row, block) but a run's first of 4: whether its (d, m),
 * rounded to T as the layout keeps them, differ from the run's first
 * block's; if so *differ = 1. */
template <typename T, int QT>
__global__ void kcu_q4g_check_k(int *differ, const uint8_t *W, size_t row_bytes, int blocks, long long n_threads) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= n_threads) return;
  const int blk = (int)(i % blocks);
  if (blk % 4 == 0) return;
  const uint8_t *r = W + (size_t)(i / blocks) * row_bytes;
  const float2 a = kcu_q4src<QT>::dm(r, blk), b = kcu_q4src<QT>::dm(r, blk & ~3);
  if (kcu_bits(kcu_t<T>(a.x)) != kcu_bits(kcu_t<T>(b.x)) || kcu_bits(kcu_t<T>(a.y)) != kcu_bits(kcu_t<T>(b.y)))
    *differ = 1;
}

/* One thread per (tile, unit, lane): its 16 bytes of nibbles and, for
 * t = 0, its row pair's 16 bytes of (d, m); KERN_Q4G (G), only for even
 * units, the 8 bytes of the pair of units. Padding rows, and the second
 * block of a last unit past cols, are zero. */
template <typename T, int QT, bool G>
__global__ void kcu_q4f_repack_k(uint4 *nib, uint4 *dmv, const uint8_t *W, size_t row_bytes, int rows, int cols,
                                 int units, long long n_threads) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= n_threads) return;
  const int lane = (int)(i % KCU_WARP), g = lane / 4, t = lane % 4;
  const long long tu = i / KCU_WARP;
  const int u = (int)(tu % units), tile = (int)(tu / units);
  uint32_t word[4];
#pragma unroll
  for (int b = 0; b < 2; b++) {
#pragma unroll
    for (int s = 0; s < 2; s++) {
      uint32_t v = 0;
#pragma unroll
      for (int p = 0; p < 4; p++) {
        int row = tile * KCU_Q4F_ROWS + g + 8 * (p & 1);
        int col = u * KCU_Q4F_COLS + 32 * b + 8 * t + 4 * s + 2 * (p >> 1);
        if (row >= rows || col >= cols) continue;
        const uint8_t *r = W + (size_t)row * row_bytes;
        v |= (uint32_t)kcu_q4src<QT>::q(r, col) << (4 * p);
        v |= (uint32_t)kcu_q4src<QT>::q(r, col + 1) << (16 + 4 * p);
      }
      word[2 * b + s] = v;
    }
  }
  nib[i] = make_uint4(word[0], word[1], word[2], word[3]);
  if (t || (G && u % 2)) return;
  uint32_t dm[4];
#pragma unroll
  for (int j = 0; j < 4; j++) { /* (row g, blk 0), (row g + 8, blk 0), (row g, blk 1), (row g + 8, blk 1) */
    int row = tile * KCU_Q4F_ROWS + g + 8 * (j & 1), blk = 2 * u + (j >> 1);
    float2 f = row < rows && 32 * blk < cols ? kcu_q4src<QT>::dm(W + (size_t)row * row_bytes, blk)
                                             : make_float2(0.f, 0.f);
    dm[j] = kcu_bits(kcu_t<T>(f.x)) | kcu_bits(kcu_t<T>(f.y)) << 16;
  }
  if (G)
    reinterpret_cast<uint2 *>(dmv)[((size_t)tile * kcu_q4g_pairs(units) + u / 2) * 8 + g] = make_uint2(dm[0], dm[1]);
  else
    dmv[tu * 8 + g] = make_uint4(dm[0], dm[1], dm[2], dm[3]);
}

/* Q6_K's 6-bit q of (row r, col c) and the scale of its 16 columns:
 * super-block c / 256 holds ql[128], qh[64], 16 int8 scales and d; within
 * it sub-block j = c % 256 / 32, element l: ql byte 64 (j / 4) + 32 (j % 2)
 * + l (the high nibble for j % 4 >= 2), qh byte 128 + 32 (j / 4) + l, bits
 * 2 (j % 4) and up (kcu_deq32<KERN_Q6_K>). */
__device__ __forceinline__ int kcu_q6k_q(const uint8_t *r, int c) {
  const uint8_t *sb = r + 210 * (c / 256);
  const int j = c % 256 / 32, l = c % 32, h = j / 4, qq = j % 4;
  const int lo = (sb[64 * h + 32 * (qq & 1) + l] >> (4 * (qq >> 1))) & 15;
  return lo | ((sb[128 + 32 * h + l] >> (2 * qq)) & 3) << 4;
}
__device__ __forceinline__ float kcu_q6k_scale(const uint8_t *r, int c) {
  const uint8_t *sb = r + 210 * (c / 256);
  return kcu_h2f(sb + 208) * (float)reinterpret_cast<const int8_t *>(sb + 192)[c % 256 / 16];
}

/* kcu_q4f_repack_k for Q6_K into KERN_Q6F: the nibbles, the lane's 8 bytes
 * of high bits and, for t = 0, its row pair's scale pairs. Padding rows
 * are zero. */
template <typename T>
__global__ void kcu_q6f_repack_k(uint4 *nib, uint2 *hiv, uint4 *dmv, const uint8_t *W, size_t row_bytes, int rows,
                                 int units, long long n_threads) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= n_threads) return;
  const int lane = (int)(i % KCU_WARP), g = lane / 4, t = lane % 4;
  const long long tu = i / KCU_WARP;
  const int u = (int)(tu % units), tile = (int)(tu / units);
  uint32_t word[4], hw[2] = {0, 0};
#pragma unroll
  for (int b = 0; b < 2; b++) {
#pragma unroll
    for (int s = 0; s < 2; s++) {
      uint32_t v = 0;
#pragma unroll
      for (int p = 0; p < 4; p++) {
        int row = tile * KCU_Q4F_ROWS + g + 8 * (p & 1);
        int col = u * KCU_Q4F_COLS + 32 * b + 8 * t + 4 * s + 2 * (p >> 1);
        if (row >= rows) continue;
        const uint8_t *r = W + (size_t)row * row_bytes;
        const uint32_t qa = (uint32_t)kcu_q6k_q(r, col), qb = (uint32_t)kcu_q6k_q(r, col + 1);
        v |= (qa & 15) << (4 * p) | (qb & 15) << (16 + 4 * p);
        hw[b] |= (qa >> 4) << (8 * s + 2 * p) | (qb >> 4) << (16 + 8 * s + 2 * p);
      }
      word[2 * b + s] = v;
    }
  }
  nib[i] = make_uint4(word[0], word[1], word[2], word[3]);
  hiv[i] = make_uint2(hw[0], hw[1]);
  if (t) return;
  uint32_t sc[4];
#pragma unroll
  for (int j = 0; j < 4; j++) { /* (row g, blk 0), (row g + 8, blk 0), (row g, blk 1), (row g + 8, blk 1) */
    int row = tile * KCU_Q4F_ROWS + g + 8 * (j & 1), c0 = u * KCU_Q4F_COLS + 32 * (j >> 1);
    float2 f = make_float2(0.f, 0.f);
    if (row < rows) {
      const uint8_t *r = W + (size_t)row * row_bytes;
      f = make_float2(kcu_q6k_scale(r, c0), kcu_q6k_scale(r, c0 + 16));
    }
    sc[j] = kcu_bits(kcu_t<T>(f.x)) | kcu_bits(kcu_t<T>(f.y)) << 16;
  }
  dmv[tu * 8 + g] = make_uint4(sc[0], sc[1], sc[2], sc[3]);
}

/* kcu__q4f_grouped's check into *differ (device), and its answer. */
static int kcu_q4g_check(kcu_ctx_t *c, const kern_weight_t *w, const void *src, int *differ, bool *grouped) {
  const int blocks = (int)(w->cols / 32);
  const long long n = w->rows * (long long)blocks;
  const uint8_t *W = (const uint8_t *)src;
  int h_differ = 1;
  KCU_CHECK(cudaMemsetAsync(differ, 0, sizeof(int), c->stream));
#define KCU_Q4G_CHECK(QT)                                                                                         \
  KCU_ACT_DISPATCH(c, KCU_LAUNCH(c, (kcu_q4g_check_k<T, QT>), kcu_div_up(n, 256), 256, 0, differ, W, w->row_bytes, \
                                 blocks, n))
  switch (w->type) {
  case KERN_Q4_0: KCU_Q4G_CHECK(KERN_Q4_0); break;
  case KERN_Q4_1: KCU_Q4G_CHECK(KERN_Q4_1); break;
  case KERN_Q4_K: KCU_Q4G_CHECK(KERN_Q4_K); break;
  case KERN_I4G: KCU_Q4G_CHECK(KERN_I4G); break;
  default: return 0;
  }
#undef KCU_Q4G_CHECK
  KCU_CHECK(cudaMemcpyAsync(&h_differ, differ, sizeof(int), cudaMemcpyDeviceToHost, c->stream));
  KCU_CHECK(cudaStreamSynchronize(c->stream));
  *grouped = !h_differ;
  return 0;
}

int kcu__q4f_grouped(kcu_ctx_t *c, const kern_weight_t *w, const void *src, bool *grouped) {
  *grouped = false;
  if (w->type == KERN_Q6_K || !c->q4g) return 0;
  int *differ = NULL;
  int rc = kcu__alloc(c, sizeof(int), (void **)&differ, "the 4-bit layout's check");
  if (!rc) rc = kcu_q4g_check(c, w, src, differ, grouped);
  kcu__free(differ);
  return rc;
}

int kcu__q4f_repack(kcu_ctx_t *c, void *dst, const kern_weight_t *w, const void *src, kern_type_t type) {
  const kcu_q4f_view_t v = kcu_q4f_view_as(w, dst, type == KERN_Q6F);
  const long long n = (long long)v.tiles * v.units * KCU_WARP;
  const uint8_t *W = (const uint8_t *)src;
#define KCU_Q4F_REPACK_G(QT, G)                                                                                  \
  KCU_ACT_DISPATCH(c, KCU_LAUNCH(c, (kcu_q4f_repack_k<T, QT, G>), kcu_div_up(n, 256), 256, 0, v.nib, v.dm, W,     \
                                 w->row_bytes, (int)w->rows, (int)w->cols, v.units, n))
#define KCU_Q4F_REPACK(QT)                                                                                       \
  do {                                                                                                           \
    if (type == KERN_Q4G) KCU_Q4F_REPACK_G(QT, true);                                                            \
    else KCU_Q4F_REPACK_G(QT, false);                                                                            \
  } while (0)
  switch (w->type) {
  case KERN_Q4_0: KCU_Q4F_REPACK(KERN_Q4_0); break;
  case KERN_Q4_1: KCU_Q4F_REPACK(KERN_Q4_1); break;
  case KERN_Q4_K: KCU_Q4F_REPACK(KERN_Q4_K); break;
  case KERN_I4G: KCU_Q4F_REPACK(KERN_I4G); break;
  case KERN_Q6_K:
    KCU_ACT_DISPATCH(c, KCU_LAUNCH(c, kcu_q6f_repack_k<T>, kcu_div_up(n, 256), 256, 0, v.nib, v.hi, v.dm, W,
                                   w->row_bytes, (int)w->rows, v.units, n));
    break;
  default: return fr_errorf(FR_EUNSUPPORTED, "cuda: no 4-bit repacking of type %d", (int)w->type);
  }
#undef KCU_Q4F_REPACK
#undef KCU_Q4F_REPACK_G
  return 0;
}

/* ---- the matmul ------------------------------------------------------------------- */

/* What a warp reads for U units: per unit its nibbles, (KERN_Q6F, F 6)
 * its high bits, its (d, m) and, per 32-column block and MMA column tile,
 * the lane's 8 activations. */
template <int NT, int U, int F> struct kcu_q4f_stage {
  uint4 q[U], d[U];
  uint2 h[F == KCU_QF_Q6F ? U : 1];
  uint4 x[U][2][NT];
};

/* The weights of units u0, u0 + WK, ... (np, hp, dp: the warp's tile at
 * this lane); CHK: stop at the last unit. */
template <int NT, int U, int WK, int F, bool CHK = true>
__device__ __forceinline__ void kcu_q4f_load_w(kcu_q4f_stage<NT, U, F> &st, const uint4 *np, const uint2 *hp,
                                               const uint32_t *dp, int u0, int units) {
#pragma unroll
  for (int h = 0; h < U; h++) {
    const int u = u0 + h * WK;
    if (CHK && u >= units) break;
    st.q[h] = __ldg(np + (size_t)u * KCU_WARP);
    if (F == KCU_QF_Q6F) st.h[h] = __ldg(hp + (size_t)u * KCU_WARP);
    st.d[h] = kcu_qf_dm<F>(dp, u);
  }
}

/* Their activations (xr: the lane's activation rows); CHK: also 0 past
 * cols. */
template <typename T, int NT, int U, int WK, int F, bool CHK = true>
__device__ __forceinline__ void kcu_q4f_load_x(kcu_q4f_stage<NT, U, F> &st, const T *const *xr, int u0, int units,
                                               int cols) {
#pragma unroll
  for (int h = 0; h < U; h++) {
    const int u = u0 + h * WK;
    if (CHK && u >= units) break;
#pragma unroll
    for (int b = 0; b < 2; b++) {
      const int c = u * KCU_Q4F_COLS + 32 * b;
#pragma unroll
      for (int j = 0; j < NT; j++)
        st.x[h][b][j] = !CHK || c < cols ? __ldg(reinterpret_cast<const uint4 *>(xr[j] + c)) : make_uint4(0, 0, 0, 0);
    }
  }
}

/* Both; at one MMA column tile (2-8 rows) without checks where all U
 * units have 64 columns: 2-5% faster a step there, and 1% slower at 9-16
 * rows (docs/bench/gpu.md, session 32). */
template <typename T, int NT, int U, int WK, int F>
__device__ __forceinline__ void kcu_q4f_load(kcu_q4f_stage<NT, U, F> &st, const uint4 *np, const uint2 *hp,
                                             const uint32_t *dp, const T *const *xr, int u0, int units, int cols) {
  if (NT == 1 && u0 + (U - 1) * WK < cols / KCU_Q4F_COLS) {
    kcu_q4f_load_w<NT, U, WK, F, false>(st, np, hp, dp, u0, units);
    kcu_q4f_load_x<T, NT, U, WK, F, false>(st, xr, u0, units, cols);
  } else {
    kcu_q4f_load_w<NT, U, WK, F>(st, np, hp, dp, u0, units);
    kcu_q4f_load_x<T, NT, U, WK, F>(st, xr, u0, units, cols);
  }
}

/* out (n, rows) = x (n, cols) @ W^T (cols a multiple of 32: a last unit
 * may have one block). A CTA is WK warps on one row tile of 16, each warp
 * a WK-th of its units (summed through shared memory at the end), for up
 * to 8 NT tokens from blockIdx.x * 8 NT (blockIdx.y is the tile: a tile's
 * CTAs start together and read its weights once from memory, then L2).
 * Each warp streams its weights and activations into registers, U units a
 * batch, the next batch loaded before the current one is used where
 * registers allow (DB): at small batches the loads, not the MMAs, are the
 * time, and nothing may wait on a load just issued. */
template <typename T, int NT, int WK, int F>
__global__ void __launch_bounds__(WK *KCU_WARP)
    kcu_q4f_mma_k(T *out, const uint4 *nib, const uint2 *hiv, const uint4 *dmv, const T *x, const float *bias,
                  int rows, int cols, int n) {
  constexpr int U = NT == 1 ? 4 : NT <= 2 ? 2 : 1, DB = NT <= 4, PF = NT <= 2;
  __shared__ float red[WK > 1 ? (WK - 1) * KCU_WARP * NT * 4 : 1];
  const int wk = threadIdx.x / KCU_WARP, lane = threadIdx.x % KCU_WARP, g = lane / 4, t = lane % 4;
  const int tile = blockIdx.y, tok0 = blockIdx.x * 8 * NT;
  const int tiles = kcu_q4f_tiles(rows), units = kcu_q4f_units(cols);
  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  if (!PF) kcu_pdl_enter();
  const T *xr[NT]; /* this lane's token row of each MMA column tile (past n the last: never stored) */
#pragma unroll
  for (int j = 0; j < NT; j++) xr[j] = x + (size_t)min(tok0 + 8 * j + g, n - 1) * cols + 8 * t;
  /* up to 16 rows, the first batch's weights before the PDL wait (no
   * kernel writes them); at 64 rows that measured 2% slower */
  const uint4 *np = nib + (size_t)tile * units * KCU_WARP + lane;
  const uint32_t *dp = kcu_qf_dm_at<F>(dmv, tile, units, g);
  const uint2 *hp = F == KCU_QF_Q6F ? hiv + (size_t)tile * units * KCU_WARP + lane : nullptr;
  kcu_q4f_stage<NT, U, F> cur;
  if (PF) {
    kcu_pdl_launch_next();
    if (tile < tiles) kcu_q4f_load_w<NT, U, WK, F>(cur, np, hp, dp, wk, units);
    kcu_pdl_wait();
  }
  if (tile < tiles) {
    if (PF) kcu_q4f_load_x<T, NT, U, WK, F>(cur, xr, wk, units, cols);
    else kcu_q4f_load<T, NT, U, WK, F>(cur, np, hp, dp, xr, wk, units, cols);
    for (int u0 = wk; u0 < units; u0 += U * WK) {
      kcu_q4f_stage<NT, U, F> nxt;
      if (DB) kcu_q4f_load<T, NT, U, WK, F>(nxt, np, hp, dp, xr, u0 + U * WK, units, cols);
#pragma unroll
      for (int h = 0; h < U; h++) {
        if (u0 + h * WK >= units) break;
        const uint32_t qw[4] = {cur.q[h].x, cur.q[h].y, cur.q[h].z, cur.q[h].w};
#pragma unroll
        for (int b = 0; b < 2; b++) { /* a missing last block has zero weights and activations */
          const uint32_t dg = b ? cur.d[h].z : cur.d[h].x, dg8 = b ? cur.d[h].w : cur.d[h].y;
          const uint32_t hw = F == KCU_QF_Q6F ? (b ? cur.h[h].y : cur.h[h].x) : 0u;
#pragma unroll
          for (int s = 0; s < 2; s++) {
            uint32_t a[4];
            kcu_qf_frag<T, F>(qw[2 * b + s], hw, s, dg, dg8, t, a);
#pragma unroll
            for (int j = 0; j < NT; j++) {
              const uint4 xv = cur.x[h][b][j];
              const uint32_t bf[2] = {s ? xv.z : xv.x, s ? xv.w : xv.y};
              kcu_mma16816<T>(acc[j], a, bf);
            }
          }
        }
      }
      if (DB) cur = nxt;
      else if (u0 + U * WK < units) kcu_q4f_load<T, NT, U, WK, F>(cur, np, hp, dp, xr, u0 + U * WK, units, cols);
    }
  }
  if (WK > 1) {
    if (wk > 0) {
      float *r = red + ((size_t)(wk - 1) * KCU_WARP + lane) * NT * 4;
#pragma unroll
      for (int j = 0; j < NT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) r[j * 4 + e] = acc[j][e];
    }
    __syncthreads();
    if (wk > 0) return;
    for (int o = 0; o < WK - 1; o++) {
      const float *r = red + ((size_t)o * KCU_WARP + lane) * NT * 4;
#pragma unroll
      for (int j = 0; j < NT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[j][e] += r[j * 4 + e];
    }
  }
  if (tile < tiles) kcu_q4f_store<T, NT>(acc, out, bias, tile, tok0, rows, n);
}

/* One row of x (batch-1 decode): the MMAs of kcu_q4f_mma_k at one column
 * tile, with a unit's registers cut from 16 words a lane to 6 (8 for
 * KERN_Q6F), so that more CTAs fit a SM. A lane holds its 16 bytes of
 * nibbles (and 8 of high bits), word `lane` of the unit's 128 bytes of
 * (d, m) (KERN_Q4G: word lane % 16 of its pair's 64) and word `lane` of
 * the unit's 64 activations; the fragments take the (d, m) of their rows
 * and the activations of their k from the lanes holding them (shuffles).
 * Lanes of MMA columns g > 0 get token 0's activations too: their sums
 * are never stored. A CTA is WK warps on one row tile, warp wk on units
 * wk, wk + WK, ..., U units a batch, the next batch loaded before the
 * current one is used, the first one's weights before the PDL wait. A
 * batch whose units all have 64 columns is loaded and used without bounds
 * checks, from pointers stepped a batch at a time (a check and a 64-bit
 * address a load were ~80 of a 4-unit batch's ~460 instructions).
 * Measured on H200 (docs/bench/gpu.md, sessions 29, 32 and 34): U = 3 (80
 * registers, 6 CTAs of 4 warps a SM) beats 4 by 1% for GPTQ and 5 and 8
 * by more (111 and 149-159 registers), and for KERN_Q4G (72 registers) 2
 * by 1%; two register batches used in turn, or a ring of stages in shared
 * memory fed by cp.async, with more bytes in flight, were 6-25% slower; 8 warps a tile for weights of
 * few tiles (each warp's chain of units half as long) made a step 3-5%
 * faster, 16 warps slower again; a lane loading its rows' 16 bytes of
 * (d, m) instead of shuffling them, and the MMAs on the raw magic-number
 * values with the (d, m) applied in fp32 after each block, were both
 * slower. */
#define KCU_Q4F_ROW_U 3
template <int U, int F> struct kcu_q4f_row_stage {
  uint4 q[U];
  uint2 h[F == KCU_QF_Q6F ? U : 1];
  uint32_t d[U], x[U];
};

/* A warp's place in its walk over the tile's units. */
struct kcu_q4f_row_ptrs {
  const uint4 *np;    /* nibbles */
  const uint2 *hp;    /* KERN_Q6F's high bits */
  const uint32_t *dp; /* (d, m) words */
  const uint32_t *xp; /* activation pairs */
};

/* (d, m) words a unit further: a unit's 32 (a lane's word `lane`), or
 * KERN_Q4G's 8 (a pair's 16, a lane's word lane % 16; a warp's units
 * WK apart, WK even, so a unit further is always a whole pair of them). */
template <int F> struct kcu_q4f_row_dm {
  static constexpr int W = F == KCU_QF_Q4G ? 8 : KCU_WARP;
};

/* The weights of units u0, u0 + WK, ... (the pointers at u0); CHK: stop
 * at the last unit. */
template <int U, int WK, int F, bool CHK>
__device__ __forceinline__ void kcu_q4f_row_ldw(kcu_q4f_row_stage<U, F> &st, const kcu_q4f_row_ptrs &p, int u0,
                                                int units) {
#pragma unroll
  for (int h = 0; h < U; h++) {
    if (CHK && u0 + h * WK >= units) break;
    st.q[h] = __ldg(p.np + h * WK * KCU_WARP);
    if (F == KCU_QF_Q6F) st.h[h] = __ldg(p.hp + h * WK * KCU_WARP);
    st.d[h] = __ldg(p.dp + h * WK * kcu_q4f_row_dm<F>::W);
  }
}

/* Their activations; CHK: also 0 past cols (a last unit of one block:
 * lanes 16.. read 0). */
template <int U, int WK, int F, bool CHK>
__device__ __forceinline__ void kcu_q4f_row_ldx(kcu_q4f_row_stage<U, F> &st, const kcu_q4f_row_ptrs &p, int u0,
                                                int units, int cols, int lane) {
#pragma unroll
  for (int h = 0; h < U; h++) {
    const int u = u0 + h * WK;
    if (CHK && u >= units) break;
    st.x[h] = !CHK || u * KCU_Q4F_COLS + 2 * lane < cols ? __ldg(p.xp + h * WK * (KCU_Q4F_COLS / 2)) : 0u;
  }
}

/* The pointers stepped to the batch at unit un, and that batch loaded
 * (unchecked where all its units have 64 columns; nothing past the end). */
template <int U, int WK, int F>
__device__ __forceinline__ void kcu_q4f_row_next(kcu_q4f_row_stage<U, F> &st, kcu_q4f_row_ptrs &p, int un, int units,
                                                 int cols, int lane) {
  constexpr int STEP = U * WK;
  p.np += STEP * KCU_WARP, p.dp += STEP * kcu_q4f_row_dm<F>::W, p.xp += STEP * (KCU_Q4F_COLS / 2);
  if (F == KCU_QF_Q6F) p.hp += STEP * KCU_WARP;
  if (un + (U - 1) * WK < cols / KCU_Q4F_COLS) {
    kcu_q4f_row_ldw<U, WK, F, false>(st, p, un, units);
    kcu_q4f_row_ldx<U, WK, F, false>(st, p, un, units, cols, lane);
  } else if (un < units) {
    kcu_q4f_row_ldw<U, WK, F, true>(st, p, un, units);
    kcu_q4f_row_ldx<U, WK, F, true>(st, p, un, units, cols, lane);
  }
}

/* The MMAs of the batch at unit u0; CHK: stop at the last unit. */
template <typename T, int U, int WK, int F, bool CHK>
__device__ __forceinline__ void kcu_q4f_row_mma(float (&acc)[1][4], const kcu_q4f_row_stage<U, F> &st, int u0,
                                                int units, int lane) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int h = 0; h < U; h++) {
    if (CHK && u0 + h * WK >= units) break;
    const uint32_t qw[4] = {st.q[h].x, st.q[h].y, st.q[h].z, st.q[h].w};
    uint32_t dm[4]; /* rows g, g + 8 of block 0, then of block 1 (KERN_Q4G: the pair's, for both) */
#pragma unroll
    for (int k = 0; k < 4; k++)
      dm[k] = F == KCU_QF_Q4G ? (k < 2 ? __shfl_sync(0xffffffffu, st.d[h], 2 * g + k) : dm[k - 2])
                              : __shfl_sync(0xffffffffu, st.d[h], 4 * g + k);
#pragma unroll
    for (int b = 0; b < 2; b++) {
      const uint32_t hw = F == KCU_QF_Q6F ? (b ? st.h[h].y : st.h[h].x) : 0u;
#pragma unroll
      for (int s = 0; s < 2; s++) {
        uint32_t a[4], bf[2];
        kcu_qf_frag<T, F>(qw[2 * b + s], hw, s, dm[2 * b], dm[2 * b + 1], t, a);
        bf[0] = __shfl_sync(0xffffffffu, st.x[h], 16 * b + 4 * t + 2 * s);
        bf[1] = __shfl_sync(0xffffffffu, st.x[h], 16 * b + 4 * t + 2 * s + 1);
        kcu_mma16816<T>(acc[0], a, bf);
      }
    }
  }
}

template <typename T, int U, int WK, int F>
__global__ void __launch_bounds__(WK *KCU_WARP)
    kcu_q4f_row_k(T *out, const uint4 *nib, const uint2 *hiv, const uint32_t *dmw, const T *x, const float *bias,
                  int rows, int cols) {
  KCU_TRACE_SCOPE(KCU_TR_Q4F_ROW);
  static_assert(F != KCU_QF_Q4G || WK % 2 == 0, "a warp's units all at the same place in their pairs");
  __shared__ float red[WK > 1 ? (WK - 1) * KCU_WARP * 4 : 1];
  const int wk = threadIdx.x / KCU_WARP, lane = threadIdx.x % KCU_WARP;
  const int tile = blockIdx.x, units = kcu_q4f_units(cols);
  const size_t w0 = ((size_t)tile * units + wk) * KCU_WARP + lane;
  kcu_q4f_row_ptrs p;
  p.np = nib + w0;
  p.dp = F == KCU_QF_Q4G ? dmw + ((size_t)tile * kcu_q4g_pairs(units) + wk / 2) * 16 + lane % 16 : dmw + w0;
  p.hp = F == KCU_QF_Q6F ? hiv + w0 : nullptr;
  p.xp = reinterpret_cast<const uint32_t *>(x) + (size_t)wk * (KCU_Q4F_COLS / 2) + lane; /* 2 activations a word */
  float acc[1][4] = {{0.f, 0.f, 0.f, 0.f}};
  kcu_q4f_row_stage<U, F> cur;
  kcu_pdl_launch_next();
  kcu_q4f_row_ldw<U, WK, F, true>(cur, p, wk, units);
  kcu_pdl_wait();
  kcu_q4f_row_ldx<U, WK, F, true>(cur, p, wk, units, cols, lane);
  for (int u0 = wk; u0 < units; u0 += U * WK) {
    kcu_q4f_row_stage<U, F> nxt;
    kcu_q4f_row_next<U, WK, F>(nxt, p, u0 + U * WK, units, cols, lane);
    if (u0 + (U - 1) * WK < units) kcu_q4f_row_mma<T, U, WK, F, false>(acc, cur, u0, units, lane);
    else kcu_q4f_row_mma<T, U, WK, F, true>(acc, cur, u0, units, lane);
    cur = nxt;
  }
  if (WK > 1) {
    if (wk > 0) {
      float *r = red + ((size_t)(wk - 1) * KCU_WARP + lane) * 4;
#pragma unroll
      for (int e = 0; e < 4; e++) r[e] = acc[0][e];
    }
    __syncthreads();
    if (wk > 0) return;
    for (int o = 0; o < WK - 1; o++) {
      const float *r = red + ((size_t)o * KCU_WARP + lane) * 4;
#pragma unroll
      for (int e = 0; e < 4; e++) acc[0][e] += r[e];
    }
  }
  kcu_q4f_store<T, 1>(acc, out, bias, tile, 0, rows, 1);
}

/* KERN_Q4G at one row of x: kcu_q4f_row_k's walk over a tile's units,
 * with the MMAs on the raw magic-number values (v = 128 + q; f16 1024 + q)
 * and each unit's (d, m) applied in fp32 after its MMAs, for rows g and
 * g + 8 (the lane's sums of token 0, the only ones stored):
 *
 *   sum_k (d q_k + m) x_k = d S + (m - 128 d) X,  S = sum_k v_k x_k,  X = sum_k x_k
 *
 * S from the unit's four MMAs, X from four more whose A is all ones (the
 * same B). Dequantizing each register instead (a subtract and an fma2,
 * 32 a unit, and the (d, m) permutes) costs more than the 4 MMAs and 6
 * fp32 ops this takes. The activations are staged in shared memory once
 * per CTA (cp.async after the PDL wait, zeros past cols), so that a lane's
 * B fragments of a block are one 16-byte read instead of 4 shuffles of one
 * word a lane; a lane loads its own two rows' (d, m) words. A unit's math
 * is ~51 instructions against ~88 (66 registers against 72): batch 1 7%
 * faster on H200 (docs/bench/gpu.md, session 36). The fp32 sums differ
 * from the dequantizing kernel's in their last bits (d and m are applied
 * once a unit, not rounded into each bf16 weight). */
#define KCU_Q4G_ROW_U 3 /* units a batch: 2 and 4 were 0.3-4% slower at batch 1 */
#define KCU_Q4G_ROW_SMEM (96 << 10) /* the most shared memory asked for: 49,152 columns */

template <int U> struct kcu_q4g_row_stage {
  uint4 q[U];
  uint2 d[U]; /* (d, m) of rows g and g + 8 */
};

/* The weights of units u0, u0 + WK, ... (np, dp: at u0); CHK: stop at the
 * last unit. A unit WK further is WK / 2 pairs, 4 WK uint2 of (d, m). */
template <int U, int WK, bool CHK>
__device__ __forceinline__ void kcu_q4g_row_ldw(kcu_q4g_row_stage<U> &st, const uint4 *np, const uint2 *dp, int u0,
                                                int units) {
#pragma unroll
  for (int h = 0; h < U; h++) {
    if (CHK && u0 + h * WK >= units) break;
    st.q[h] = __ldg(np + h * WK * KCU_WARP);
    st.d[h] = __ldg(dp + h * WK * 4);
  }
}

/* The batch at unit u0 into acc0 (row g) and acc2 (row g + 8); xs: the
 * staged activations, 8 uint4 a unit. */
template <typename T, int U, int WK, bool CHK>
__device__ __forceinline__ void kcu_q4g_row_mma(float &acc0, float &acc2, const kcu_q4g_row_stage<U> &st,
                                                const uint4 *xs, int u0, int units, int t) {
  typedef kcu_q4v<T> V;
  const uint32_t ones[4] = {V::ONE, V::ONE, V::ONE, V::ONE};
#pragma unroll
  for (int h = 0; h < U; h++) {
    const int u = u0 + h * WK;
    if (CHK && u >= units) break;
    const uint32_t qw[4] = {st.q[h].x, st.q[h].y, st.q[h].z, st.q[h].w};
    float sv[4] = {0.f, 0.f, 0.f, 0.f}, sx[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int b = 0; b < 2; b++) {
      const uint4 xv = xs[u * 8 + 4 * b + t]; /* columns 32 b + 8 t .. + 7 */
#pragma unroll
      for (int ks = 0; ks < 2; ks++) {
        uint32_t a[4];
#pragma unroll
        for (int p = 0; p < 4; p++) a[p] = kcu_and_or(qw[2 * b + ks] >> (4 * p), 0x000f000fu, V::MAGIC);
        const uint32_t bf[2] = {ks ? xv.z : xv.x, ks ? xv.w : xv.y};
        kcu_mma16816<T>(sv, a, bf);
        kcu_mma16816<T>(sx, ones, bf);
      }
    }
    const float2 dg = V::pair(st.d[h].x), dg8 = V::pair(st.d[h].y);
    acc0 = fmaf(dg.x, sv[0], fmaf(fmaf(-V::BASE, dg.x, dg.y), sx[0], acc0));
    acc2 = fmaf(dg8.x, sv[2], fmaf(fmaf(-V::BASE, dg8.x, dg8.y), sx[0], acc2));
  }
}

/* U units a batch, the next batch loaded before the current one is used,
 * the first one before the PDL wait. */
template <typename T, int U, int WK>
__global__ void __launch_bounds__(WK *KCU_WARP)
    kcu_q4g_row_k(T *out, const uint4 *nib, const uint32_t *dmw, const T *x, const float *bias, int rows, int cols) {
  KCU_TRACE_SCOPE(KCU_TR_Q4G_ROW);
  static_assert(WK % 2 == 0, "a warp's units all at the same place in their pairs");
  extern __shared__ uint4 kcu_q4g_xs[]; /* the activations: 8 uint4 a unit, 0 past cols */
  __shared__ float red[WK - 1][KCU_WARP][2];
  const int wk = threadIdx.x / KCU_WARP, lane = threadIdx.x % KCU_WARP, g = lane / 4, t = lane % 4;
  const int tile = blockIdx.x, units = kcu_q4f_units(cols);
  const uint4 *np = nib + ((size_t)tile * units + wk) * KCU_WARP + lane;
  const uint2 *dp = reinterpret_cast<const uint2 *>(dmw) + ((size_t)tile * kcu_q4g_pairs(units) + wk / 2) * 8 + g;
  kcu_q4g_row_stage<U> cur;
  kcu_pdl_launch_next();
  kcu_q4g_row_ldw<U, WK, true>(cur, np, dp, wk, units);
  kcu_pdl_wait();
  for (int i = threadIdx.x; i < units * 8; i += WK * KCU_WARP) {
    const bool ok = 8 * i < cols; /* cols: a multiple of 32 */
    kcu_cp_async16((uint32_t)__cvta_generic_to_shared(kcu_q4g_xs + i), ok ? x + 8 * (size_t)i : x, ok);
  }
  kcu_cp_commit();
  kcu_cp_wait<0>();
  __syncthreads();
  KCU_TRACE_MARK(0); /* the activations staged */
  float acc0 = 0.f, acc2 = 0.f;
  constexpr int STEP = U * WK;
  for (int u0 = wk; u0 < units; u0 += STEP) {
    kcu_q4g_row_stage<U> nxt;
    np += STEP * KCU_WARP, dp += STEP * 4;
    if (u0 + STEP + (U - 1) * WK < units) kcu_q4g_row_ldw<U, WK, false>(nxt, np, dp, u0 + STEP, units);
    else if (u0 + STEP < units) kcu_q4g_row_ldw<U, WK, true>(nxt, np, dp, u0 + STEP, units);
    if (u0 + (U - 1) * WK < units) kcu_q4g_row_mma<T, U, WK, false>(acc0, acc2, cur, kcu_q4g_xs, u0, units, t);
    else kcu_q4g_row_mma<T, U, WK, true>(acc0, acc2, cur, kcu_q4g_xs, u0, units, t);
    cur = nxt;
  }
  KCU_TRACE_MARK(1); /* the warp's units done */
  if (wk > 0) red[wk - 1][lane][0] = acc0, red[wk - 1][lane][1] = acc2;
  __syncthreads();
  if (wk > 0) return;
  for (int o = 0; o < WK - 1; o++) acc0 += red[o][lane][0], acc2 += red[o][lane][1];
  const float acc[1][4] = {{acc0, 0.f, acc2, 0.f}};
  kcu_q4f_store<T, 1>(acc, out, bias, tile, 0, rows, 1);
}

/* Past 64 rows where the wide kernel below does not run (before sm_90):
 * a CTA of KCU_Q4F_GT row tiles shares each unit's 64
 * tokens of activations through shared memory (cp.async, KCU_Q4F_GS
 * stages), where kcu_q4f_mma_k has every tile read them from L2 (for a
 * 28672-row weight, 0.9 GB per 64 tokens against 73 MB of weights).
 * Measured on H200 (Llama-3-8B shapes, I4G, docs/bench/gpu.md): 16% faster
 * at 128 rows, 23% slower at 48-64, where its lockstep over units (two
 * units of weights in registers, three of activations staged) leaves
 * fewer loads in flight than kcu_q4f_mma_k's many small CTAs. Warp
 * (tr, wk) takes tile tr's units wk, wk + WK, ...; WK > 1 splits the
 * columns when the tiles alone make too few CTAs, and the slices' sums
 * meet in shared memory. Each warp's weights run two units ahead in
 * registers, the first two loaded before the PDL wait. A staged row is 128
 * bytes whose halves odd rows swap, so the fragment reads (rows g and
 * g + 1 of a phase, the same 64 bytes of each) hit all 32 banks. */
#define KCU_Q4F_GT 4 /* row tiles per CTA of kcu_q4f_gemm_k */
#define KCU_Q4F_GS 3 /* activation stages in flight */

template <typename T, int WK, int F>
__global__ void __launch_bounds__(KCU_Q4F_GT *WK *KCU_WARP)
    kcu_q4f_gemm_k(T *out, const uint4 *nib, const uint4 *dmv, const T *x, const float *bias, int rows, int cols,
                   int n) {
  constexpr int TR = KCU_Q4F_GT, S = KCU_Q4F_GS, NTH = TR * WK * KCU_WARP, ROW8 = KCU_Q4F_TOK * 8;
  __shared__ uint4 xs[S][WK][ROW8];
  const int warp = threadIdx.x / KCU_WARP, lane = threadIdx.x % KCU_WARP, g = lane / 4, t = lane % 4;
  const int tr = warp % TR, wk = warp / TR, tile = blockIdx.x * TR + tr, tok0 = blockIdx.y * KCU_Q4F_TOK;
  const int tiles = kcu_q4f_tiles(rows), units = kcu_q4f_units(cols), steps = (units + WK - 1) / WK;
  const bool live = tile < tiles;
  const uint4 *np = nib + (size_t)(live ? tile : 0) * units * KCU_WARP + lane;
  const uint32_t *dp = kcu_qf_dm_at<F>(dmv, live ? tile : 0, units, g);
  float acc[8][4];
#pragma unroll
  for (int j = 0; j < 8; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  uint4 qa = {}, da = {}, qb = {}, db = {}, qc = {}, dc = {};
  auto load_w = [&](int k, uint4 &q, uint4 &d) {
    const int u = k * WK + wk;
    if (live && u < units) q = __ldg(np + (size_t)u * KCU_WARP), d = kcu_qf_dm<F>(dp, u);
  };
  auto load_x = [&](int k) { /* step k's WK units into stage k % S */
    const int st = k % S;
    for (int i = threadIdx.x; i < WK * ROW8; i += NTH) {
      const int w = i / ROW8, r = (i / 8) % KCU_Q4F_TOK, c = i % 8;
      const int u = k * WK + w, tok = tok0 + r, col = u * KCU_Q4F_COLS + 8 * c;
      const bool ok = u < units && tok < n && col < cols;
      kcu_cp_async16((uint32_t)__cvta_generic_to_shared(&xs[st][w][kcu_q4f_xoff(r, c)]),
                     ok ? x + (size_t)tok * cols + col : x, ok);
    }
  };
  kcu_pdl_launch_next();
  load_w(0, qa, da);
  load_w(1, qb, db);
  kcu_pdl_wait();
  for (int k = 0; k < S - 1; k++) {
    if (k < steps) load_x(k);
    kcu_cp_commit();
  }
  for (int k = 0; k < steps; k++) {
    if (k + S - 1 < steps) load_x(k + S - 1);
    kcu_cp_commit();
    load_w(k + 2, qc, dc);
    kcu_cp_wait<S - 1>();
    __syncthreads();
    if (live && k * WK + wk < units) {
      const uint4 *xb = xs[k % S][wk];
      const uint32_t qw[4] = {qa.x, qa.y, qa.z, qa.w};
#pragma unroll
      for (int b = 0; b < 2; b++) { /* a missing last block has zero weights and activations */
        const uint32_t dg = b ? da.z : da.x, dg8 = b ? da.w : da.y;
        uint4 xv[8];
#pragma unroll
        for (int j = 0; j < 8; j++) xv[j] = xb[kcu_q4f_xoff(8 * j + g, 4 * b + t)];
#pragma unroll
        for (int s = 0; s < 2; s++) {
          uint32_t a[4];
          kcu_q4f_frag<T>(qw[2 * b + s], dg, dg8, a);
#pragma unroll
          for (int j = 0; j < 8; j++) {
            const uint32_t bf[2] = {s ? xv[j].z : xv[j].x, s ? xv[j].w : xv[j].y};
            kcu_mma16816<T>(acc[j], a, bf);
          }
        }
      }
    }
    __syncthreads(); /* stage k % S is loaded again in step k + 1 */
    qa = qb, da = db, qb = qc, db = dc;
  }
  if (WK > 1) { /* the column slices' sums, through the (now idle) stages */
    kcu_cp_wait<0>();
    float *red = reinterpret_cast<float *>(&xs[0][0][0]);
    static_assert(sizeof xs >= (WK - 1) * TR * KCU_WARP * 32 * sizeof(float), "the slices' sums fit the stages");
    if (wk > 0) {
      float *r = red + ((size_t)((wk - 1) * TR + tr) * KCU_WARP + lane) * 32;
#pragma unroll
      for (int j = 0; j < 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) r[j * 4 + e] = acc[j][e];
    }
    __syncthreads();
    if (wk > 0) return;
    for (int o = 1; o < WK; o++) {
      const float *r = red + ((size_t)((o - 1) * TR + tr) * KCU_WARP + lane) * 32;
#pragma unroll
      for (int j = 0; j < 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[j][e] += r[j * 4 + e];
    }
  }
  if (live) kcu_q4f_store<T, 8>(acc, out, bias, tile, tok0, rows, n);
}

/* x with its columns permuted for an act-order weight: xp[b][k] =
 * x[b][perm[k]], 0 where perm[k] is -1 (padding). */
template <typename T>
__global__ void kcu_q4f_gather_k(T *xp, const T *x, const int32_t *perm, int cols, int x_cols, long long total) {
  kcu_pdl_enter();
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= total) return;
  long long b = i / cols;
  int p = __ldg(perm + i % cols);
  xp[i] = p >= 0 ? x[b * x_cols + p] : kcu_t<T>(0.f);
}

template <typename T, int NT, int WK, int F>
static int kcu_q4f_launch_wk(kcu_ctx_t *c, T *out, const kern_weight_t *w, const float *bias, const T *x, int n) {
  const kcu_q4f_view_t v = kcu_q4f_view(w, w->data);
  if (v.tiles > 65535) /* the grid's y */
    return fr_errorf(FR_EUNSUPPORTED, "cuda: %s matmul of %lld rows, past 1048560", kern_type_traits(w->type)->name,
                     (long long)w->rows);
  KCU_LAUNCH(c, (kcu_q4f_mma_k<T, NT, WK, F>), dim3(kcu_div_up(n, 8 * NT), v.tiles), WK * KCU_WARP, 0, out,
             (const uint4 *)v.nib, (const uint2 *)v.hi, (const uint4 *)v.dm, x, bias, (int)w->rows, (int)w->cols, n);
  return 0;
}

/* Whether KERN_Q4G's one-row kernel on the raw values takes w: bf16
 * activations (its f16 form has not run on a device yet: f16 keeps the
 * dequantizing kernel) that fit the shared memory it may ask for. */
static bool kcu_q4g_row_fits(const kcu_ctx_t *c, const kern_weight_t *w) {
  return w->type == KERN_Q4G && c->q4g_raw && c->act == KERN_BF16 &&
         (size_t)kcu_q4f_units(w->cols) * KCU_Q4F_COLS * c->act_size <= c->q4g_row_smem;
}

template <typename T, int F>
static int kcu_q4f_row_launch(kcu_ctx_t *c, T *out, const kern_weight_t *w, const float *bias, const T *x) {
  const kcu_q4f_view_t v = kcu_q4f_view(w, w->data);
  /* 8 warps a tile where the tiles are few (o, down, q, k, v of an 8B),
   * else 4 (c->q4f_row 4 or 8: always that); measured in docs/bench/gpu.md,
   * session 29 */
  const bool wide = c->q4f_row == 8 || (c->q4f_row != 4 && v.tiles < 4 * c->n_sm);
  if (F == KCU_QF_Q4G && kcu_q4g_row_fits(c, w)) {
    const size_t xs = (size_t)v.units * KCU_Q4F_COLS * sizeof(T);
    if (wide)
      KCU_LAUNCH(c, (kcu_q4g_row_k<T, KCU_Q4G_ROW_U, 8>), v.tiles, 8 * KCU_WARP, xs, out, (const uint4 *)v.nib,
                 (const uint32_t *)v.dm, x, bias, (int)w->rows, (int)w->cols);
    else
      KCU_LAUNCH(c, (kcu_q4g_row_k<T, KCU_Q4G_ROW_U, 4>), v.tiles, 4 * KCU_WARP, xs, out, (const uint4 *)v.nib,
                 (const uint32_t *)v.dm, x, bias, (int)w->rows, (int)w->cols);
    return 0;
  }
  if (wide)
    KCU_LAUNCH(c, (kcu_q4f_row_k<T, KCU_Q4F_ROW_U, 8, F>), v.tiles, 8 * KCU_WARP, 0, out, (const uint4 *)v.nib,
               (const uint2 *)v.hi, (const uint32_t *)v.dm, x, bias, (int)w->rows, (int)w->cols);
  else
    KCU_LAUNCH(c, (kcu_q4f_row_k<T, KCU_Q4F_ROW_U, 4, F>), v.tiles, 4 * KCU_WARP, 0, out, (const uint4 *)v.nib,
               (const uint2 *)v.hi, (const uint32_t *)v.dm, x, bias, (int)w->rows, (int)w->cols);
  return 0;
}

/* Warps per tile: c->q4f_warps, else measured on H200 (Llama-3-8B shapes,
 * I4G; docs/bench/gpu.md): 4 at n = 1 and n > 16, 8 at 9..16. */
template <typename T, int NT, int F>
static int kcu_q4f_launch(kcu_ctx_t *c, T *out, const kern_weight_t *w, const float *bias, const T *x, int n) {
  if ((c->q4f_warps ? c->q4f_warps : NT == 2 ? 8 : 4) == 8)
    return kcu_q4f_launch_wk<T, NT, 8, F>(c, out, w, bias, x, n);
  return kcu_q4f_launch_wk<T, NT, 4, F>(c, out, w, bias, x, n);
}

/* More than 64 rows: kcu_q4f_gemm_k, its columns split in two where the
 * tiles alone would not give every SM a CTA. */
template <typename T, int F>
static int kcu_q4f_gemm(kcu_ctx_t *c, T *out, const kern_weight_t *w, const float *bias, const T *x, int n) {
  const kcu_q4f_view_t v = kcu_q4f_view(w, w->data);
  const dim3 grid(kcu_div_up(v.tiles, KCU_Q4F_GT), kcu_div_up(n, KCU_Q4F_TOK));
  if ((long long)grid.x * grid.y >= c->n_sm)
    KCU_LAUNCH(c, (kcu_q4f_gemm_k<T, 1, F>), grid, KCU_Q4F_GT * KCU_WARP, 0, out, (const uint4 *)v.nib,
               (const uint4 *)v.dm, x, bias, (int)w->rows, (int)w->cols, n);
  else
    KCU_LAUNCH(c, (kcu_q4f_gemm_k<T, 2, F>), grid, 2 * KCU_Q4F_GT * KCU_WARP, 0, out, (const uint4 *)v.nib,
               (const uint4 *)v.dm, x, bias, (int)w->rows, (int)w->cols, n);
  return 0;
}

/* The matmul's input: x, or for a permuted weight (GPTQ act-order) x's
 * columns gathered into the weight's order in c->deq. */
template <typename T> static int kcu_q4f_input(kcu_ctx_t *c, const kern_weight_t *w, const T **x, int n) {
  if (!w->perm) return 0;
  const int32_t *perm = (const int32_t *)w->priv;
  long long total = (long long)n * w->cols;
  if ((size_t)total > c->deq_elems) return fr_errorf(FR_ESTATE, "cuda: matmul: permuted-input scratch too small");
  KCU_LAUNCH(c, kcu_q4f_gather_k<T>, kcu_div_up(total, KCU_ELEM_NT), KCU_ELEM_NT, 0, (T *)c->deq, *x, perm,
             (int)w->cols, (int)kern_weight_x_cols(w), total);
  *x = (const T *)c->deq;
  return 0;
}

/* A 4-bit layout's matmul (F: KERN_Q4F's or KERN_Q4G's). */
template <typename T, int F>
static int kcu_q4f_matmul_f(kcu_ctx_t *c, T *out, const kern_weight_t *w, const float *bias, const T *x, int n) {
  if (n == 1 && c->q4f_row) return kcu_q4f_row_launch<T, F>(c, out, w, bias, x);
  /* From c->q4f_wide rows (17; sm_90 only) the wide kernel; below, and
   * where it does not run, the per-tile kernel, past 64 rows the GEMM form */
  if (n >= c->q4f_wide) return kcu__q4w_matmul(c, out, w, bias, x, n);
  if (n > KCU_Q4F_TOK && c->q4f_gemm) return kcu_q4f_gemm<T, F>(c, out, w, bias, x, n);
  /* MMA columns a CTA: past c->q4f_nt (4: 32 tokens), more CTAs of it
   * rather than one of 64 tokens (measured on H200, docs/bench/gpu.md: at
   * 33-64 rows the 64-token CTA's 149 registers allow 3 CTAs a SM, and the
   * o and down projections' 256 tiles fill two thirds of one wave) */
  const int nt = FR_MIN(n >= KCU_Q4F_TOK ? 8 : kcu_div_up(n, 8), c->q4f_nt);
  switch (nt) {
  case 1: return kcu_q4f_launch<T, 1, F>(c, out, w, bias, x, n);
  case 2: return kcu_q4f_launch<T, 2, F>(c, out, w, bias, x, n);
  case 3: case 4: return kcu_q4f_launch<T, 4, F>(c, out, w, bias, x, n);
  default: return kcu_q4f_launch<T, 8, F>(c, out, w, bias, x, n);
  }
}

template <typename T>
static int kcu_q4f_matmul_t(kcu_ctx_t *c, T *out, const kern_weight_t *w, const float *bias, const T *x, int n) {
  int rc = kcu_q4f_input(c, w, &x, n);
  if (rc) return rc;
  if (w->type == KERN_Q4G) return kcu_q4f_matmul_f<T, KCU_QF_Q4G>(c, out, w, bias, x, n);
  if (w->type == KERN_Q4F) return kcu_q4f_matmul_f<T, KCU_QF_Q4F>(c, out, w, bias, x, n);
  if (n == 1 && c->q4f_row) return kcu_q4f_row_launch<T, KCU_QF_Q6F>(c, out, w, bias, x);
  /* up to KCU_Q6F_MAX_N rows: kcu__matmul dequantizes for more */
  return n <= 8 ? kcu_q4f_launch<T, 1, KCU_QF_Q6F>(c, out, w, bias, x, n)
                : kcu_q4f_launch<T, 2, KCU_QF_Q6F>(c, out, w, bias, x, n);
}

int kcu__q4f_matmul(kcu_ctx_t *c, void *out, const kern_weight_t *w, const float *bias, const void *x, int n) {
  int rc = 0;
  KCU_ACT_DISPATCH(c, rc = kcu_q4f_matmul_t<T>(c, (T *)out, w, bias, (const T *)x, n));
  return rc;
}

/* Up to one CTA of tokens (64): measured on H200, Llama-3-8B shapes as
 * I4G (docs/bench/gpu.md, session 27), the fused kernel's decode steps
 * run 2-4% faster at 17-64 rows and 1-2% slower at 96. */
bool kcu__q4f_silu_fits(const kcu_ctx_t *c, const kern_weight_t *w, const void *x, int n) {
  return (w->type == KERN_Q4F || w->type == KERN_Q4G) && (!w->perm || w->priv) && c->fuse_gemv &&
         n >= c->q4f_wide && n <= KCU_Q4F_TOK && n <= c->q4f_max_n && kcu_al16(x) && w->cols % 8 == 0 &&
         w->rows % (2 * KCU_Q4F_ROWS) == 0;
}

int kcu__q4f_matmul_silu(kcu_ctx_t *c, void *out, const kern_weight_t *w, const void *x, int n) {
  int rc = 0;
  KCU_ACT_DISPATCH(c, {
    const T *xt = (const T *)x;
    rc = kcu_q4f_input(c, w, &xt, n);
    if (!rc) rc = kcu__q4w_matmul_silu(c, out, w, xt, n);
  });
  return rc;
}

/* ---- dequantization (the cuBLAS path for large batches) ----------------------------- */

/* One thread per (tile, unit, lane) of the tiles that rows [row0, row1)
 * touch: the lane's rows g and g + 8, 8 columns of each block, of those
 * rows into dst ((row1 - row0), x_cols), in the input's order where the
 * weight is permuted (padding columns dropped; every input column is some
 * column's perm, model_quant_cols). */
template <typename T, int F>
__global__ void kcu_q4f_dequant_k(T *dst, const uint4 *nib, const uint2 *hiv, const uint4 *dmv, int cols, int row0,
                                  int row1, long long total, const int32_t *perm, int x_cols) {
  kcu_pdl_enter();
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= total) return;
  typedef typename kcu_q4v<T>::T2 T2;
  const int units = kcu_q4f_units(cols), lane = (int)(i % KCU_WARP), g = lane / 4, t = lane % 4;
  const long long tu = i / KCU_WARP;
  const int u = (int)(tu % units), tile = row0 / KCU_Q4F_ROWS + (int)(tu / units);
  const size_t at = (size_t)tile * units + u;
  const uint4 q = __ldg(nib + at * KCU_WARP + lane), d = kcu_qf_dm<F>(kcu_qf_dm_at<F>(dmv, tile, units, g), u);
  const uint2 hq = F == KCU_QF_Q6F ? __ldg(hiv + at * KCU_WARP + lane) : make_uint2(0, 0);
  const uint32_t qw[4] = {q.x, q.y, q.z, q.w}, dm[2] = {d.x, d.z}, dm8[2] = {d.y, d.w}, hw[2] = {hq.x, hq.y};
#pragma unroll
  for (int b = 0; b < 2; b++) {
    const int c0 = u * KCU_Q4F_COLS + 32 * b + 8 * t;
    if (c0 >= cols) break;
    T2 v[2][4]; /* rows g, g + 8: 8 columns as 4 pairs */
#pragma unroll
    for (int s = 0; s < 2; s++) {
      uint32_t a[4];
      kcu_qf_frag<T, F>(qw[2 * b + s], hw[b], s, dm[b], dm8[b], t, a);
      /* a[0], a[2]: row g, columns 4 s + (0, 1), (2, 3); a[1], a[3]: row g + 8 */
      v[0][2 * s] = kcu_as2<T2>(a[0]), v[0][2 * s + 1] = kcu_as2<T2>(a[2]);
      v[1][2 * s] = kcu_as2<T2>(a[1]), v[1][2 * s + 1] = kcu_as2<T2>(a[3]);
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int row = tile * KCU_Q4F_ROWS + g + 8 * h;
      if (row < row0 || row >= row1) continue;
      T *o = dst + (size_t)(row - row0) * x_cols;
      if (perm) {
        const T *e = reinterpret_cast<const T *>(v[h]);
#pragma unroll
        for (int k = 0; k < 8; k++) {
          int p = __ldg(perm + c0 + k);
          if (p >= 0) o[p] = e[k];
        }
      } else {
        *reinterpret_cast<uint4 *>(o + c0) = *reinterpret_cast<const uint4 *>(v[h]);
      }
    }
  }
}

int kcu__q4f_dequant_rows(kcu_ctx_t *c, void *dst, const kern_weight_t *w, int64_t row0, int64_t nrows) {
  if (nrows <= 0) return 0;
  const kcu_q4f_view_t v = kcu_q4f_view(w, w->data);
  const int t0 = (int)(row0 / KCU_Q4F_ROWS), t1 = kcu_q4f_tiles(row0 + nrows);
  const long long total = (long long)(t1 - t0) * v.units * KCU_WARP;
#define KCU_Q4F_DEQUANT(F)                                                                                    \
  KCU_ACT_DISPATCH(c, KCU_LAUNCH(c, (kcu_q4f_dequant_k<T, F>), kcu_div_up(total, KCU_ELEM_NT), KCU_ELEM_NT, 0,     \
                                 (T *)dst, (const uint4 *)v.nib, (const uint2 *)v.hi, (const uint4 *)v.dm,          \
                                 (int)w->cols, (int)row0, (int)(row0 + nrows), total, (const int32_t *)w->priv,      \
                                 (int)kern_weight_x_cols(w)))
  if (w->type == KERN_Q6F) KCU_Q4F_DEQUANT(KCU_QF_Q6F);
  else if (w->type == KERN_Q4G) KCU_Q4F_DEQUANT(KCU_QF_Q4G);
  else KCU_Q4F_DEQUANT(KCU_QF_Q4F);
#undef KCU_Q4F_DEQUANT
  return 0;
}

int kcu__q4g_row_init(kcu_ctx_t *c) {
  c->q4g_row_smem = 44 << 10; /* without the attribute: 48 KB with the static reduction buffer */
  if (c->smem_optin < KCU_Q4G_ROW_SMEM + (8 << 10)) return 0;
  KCU_ACT_DISPATCH(c, {
    KCU_CHECK(cudaFuncSetAttribute(kcu_q4g_row_k<T, KCU_Q4G_ROW_U, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   KCU_Q4G_ROW_SMEM));
    KCU_CHECK(cudaFuncSetAttribute(kcu_q4g_row_k<T, KCU_Q4G_ROW_U, 8>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   KCU_Q4G_ROW_SMEM));
  });
  c->q4g_row_smem = KCU_Q4G_ROW_SMEM;
  return 0;
}
