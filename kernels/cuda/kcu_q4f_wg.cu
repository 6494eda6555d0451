/* kcu_q4f_wg.cu - the 4-bit matmul (KERN_Q4F, KERN_Q4G) over many rows by
 * wgmma, built for sm_90a only (kernels/cuda.cmake); kcu__matmul sends it
 * the calls that kcu__q4f_wg_takes (65-256 rows, grids that fill the GPU
 * twice) on a compute capability 9.0 device.
 *
 * The weights are wgmma's A, from registers: a CTA is one warpgroup and 64
 * weight rows, warp w one of the layout's 16-row tiles, whose lane L reads
 * its 16 bytes of nibbles a 64-column unit and dequantizes them in
 * registers as every 4-bit kernel does (kcu_q4f_frag): they are the A
 * fragments of the unit's four k16 steps, so the weights never pass
 * through shared memory. The tokens are wgmma's N (NT of them a CTA), B:
 * K-major tiles in kcu_ggemm.cuh's swizzle, by cp.async, S stages.
 *
 * The nibbles' k order is not the columns' (kcu_q4f.cuh: lane t's four k
 * of a step are its columns 8 t + 4 s .. + 3), and wgmma reads B in its own
 * order, so the activations are first copied into the nibbles' order
 * (kcu_q4wg_xperm_k, into c->deq): in each 32-column block the 4-byte
 * column pair 4 t + 2 s + h goes to place 8 s + 4 h + t. An act-order
 * weight's column permutation is applied in the same pass.
 *
 * No weight's columns are split over CTAs, so it takes only grids that
 * fill the GPU (a Llama-3-8B gate/up projection: 448 CTAs). There, on an
 * H200 (docs/bench/gpu.md, session 46), GPTQ decode steps run 4-6% faster
 * at 80-256 rows than with the wide kernel's 64-token CTAs (up to 128) or
 * dequantize + cuBLAS; sent every matmul from 65 rows, the steps were
 * 1.3-2.0x slower. A form that dequantized the weights into shared memory
 * for wgmma's B was slower still.
 *
 * Threads: the backend's stream. */
#include "kernels/cuda/kcu_ggemm.cuh"
#include "kernels/cuda/kcu_q4f.cuh"
#include "kernels/cuda/kcu_wg.cuh"

/* A CTA: NT tokens (NB wgmmas of N columns each k16 step), 4 row tiles, S
 * stages of the activations (NT rows of 64 columns), 1 KB more for the
 * alignment. */
template <int NT> struct kcu_q4wg_cfg {
  enum { N = NT < 128 ? NT : 128, NB = NT / N, S = 4, TILES = KCU_GG_WARPS };
  enum { STAGE = NT * KCU_GG_BK * 2 };
  static constexpr size_t SMEM = (size_t)S * STAGE + 1024;
};

/* One thread a 16-byte chunk of the permuted activations: chunk c (0..3)
 * of 32-column block b of token row r holds the column pairs c, 4 + c,
 * 8 + c and 12 + c of the block (of x's columns perm[...] where perm). */
template <typename T>
__global__ void kcu_q4wg_xperm_k(T *dst, const T *x, const int32_t *perm, int cols, int x_cols, long long total) {
  kcu_pdl_enter();
  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int chunks = cols / 8, r = (int)(i / chunks), k = (int)(i % chunks), b = k / 4, c = k % 4;
  const T *xr = x + (size_t)r * x_cols;
  uint32_t v[4];
#pragma unroll
  for (int t = 0; t < 4; t++) {
    const int col = 32 * b + 2 * (4 * t + c);
    if (perm) { /* -1: a padding column */
      const int p0 = __ldg(perm + col), p1 = __ldg(perm + col + 1);
      T e[2] = {p0 >= 0 ? xr[p0] : kcu_t<T>(0.f), p1 >= 0 ? xr[p1] : kcu_t<T>(0.f)};
      v[t] = *reinterpret_cast<const uint32_t *>(e);
    } else {
      v[t] = *reinterpret_cast<const uint32_t *>(xr + col);
    }
  }
  *reinterpret_cast<uint4 *>(dst + (size_t)r * cols + 8 * k) = make_uint4(v[0], v[1], v[2], v[3]);
}

/* This lane's nibbles and (d, m) of unit u of row tile `tile` (zeros past
 * the last tile). */
template <int F>
__device__ __forceinline__ void kcu_q4wg_ldw(uint4 &q, uint4 &d, const uint4 *nib, const uint4 *dmv, int tile,
                                            int tiles, int units, int u, int lane) {
  if (tile >= tiles) {
    q = d = make_uint4(0, 0, 0, 0);
    return;
  }
  q = __ldg(nib + ((size_t)tile * units + u) * KCU_WARP + lane);
  d = kcu_qf_dm<F>(kcu_qf_dm_at<F>(dmv, tile, units, lane / 4), u);
}

template <typename T, int NT, int F>
__global__ void __launch_bounds__(KCU_GG_NT)
    kcu_q4wg_k(T *out, const uint4 *nib, const uint4 *dmv, const T *xp, const float *bias, int rows, int cols, int n) {
  typedef kcu_q4wg_cfg<NT> C;
  typedef kcu_gg_ld<NT> L;
  constexpr int S = C::S;
  extern __shared__ uint8_t kcu_q4wg_sh[];
  const int tok0 = blockIdx.x * NT, warp = threadIdx.x / KCU_WARP, lane = threadIdx.x % KCU_WARP;
  const int tile = blockIdx.y * C::TILES + warp, tiles = kcu_q4f_tiles(rows), units = kcu_q4f_units(cols);
  /* the first two units' weights before the wait: they are not written by the kernels before */
  uint4 q0, d0, q1 = make_uint4(0, 0, 0, 0), d1 = q1;
  kcu_q4wg_ldw<F>(q0, d0, nib, dmv, tile, tiles, units, 0, lane);
  if (units > 1) kcu_q4wg_ldw<F>(q1, d1, nib, dmv, tile, tiles, units, 1, lane);
  kcu_pdl_enter();
  int src[L::J];
#pragma unroll
  for (int j = 0; j < L::J; j++) {
    const int tok = tok0 + L::r0() + j * L::RS;
    src[j] = tok < n ? tok : -1;
  }
  const uint32_t base = ((uint32_t)__cvta_generic_to_shared(kcu_q4wg_sh) + 1023u) & ~1023u;
  auto load = [&](int u) { kcu_gg_load_a<T, NT>(base + (u % S) * C::STAGE, xp, src, cols, u * KCU_Q4F_COLS); };
  float acc[C::NB][C::N / 2];
  kcu_wg_pipe_start<S>(units, load);
  for (int u = 0; u < units; u++) {
    /* the unit's A fragments: k16 step kk is block kk / 2, step kk % 2 */
    uint32_t a[4][4];
    {
      const uint32_t qw[4] = {q0.x, q0.y, q0.z, q0.w};
      const uint32_t dm[2] = {d0.x, d0.z}, dm8[2] = {d0.y, d0.w};
#pragma unroll
      for (int kk = 0; kk < 4; kk++) kcu_q4f_frag<T>(qw[kk], dm[kk / 2], dm8[kk / 2], a[kk]);
    }
    q0 = q1, d0 = d1;
    if (u + 2 < units) kcu_q4wg_ldw<F>(q1, d1, nib, dmv, tile, tiles, units, u + 2, lane);
    kcu_wg_pipe_next<S>(u, units, load);
    const uint32_t st = base + (u % S) * C::STAGE;
    kcu_wg_fence();
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
#pragma unroll
      for (int b = 0; b < C::NB; b++)
        kcu_wg_mma_rs<T, C::N>(acc[b], a[kk], kcu_wg_desc(st + b * C::N * 128 + kk * 32), u | kk);
    }
    kcu_wg_commit();
    kcu_wg_wait0();
#pragma unroll
    for (int b = 0; b < C::NB; b++) kcu_wg_hold(acc[b]);
  }
  /* warp w holds weight rows 16 w + g and + 8 of the CTA's; element 4 i + 2 h + j of block b: row + 8 h, token
   * b N + 8 i + 2 q + j */
  const int g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int r = tile * KCU_Q4F_ROWS + g + 8 * h;
    if (r >= rows) continue;
    const float bv = bias ? bias[r] : 0.f;
#pragma unroll
    for (int b = 0; b < C::NB; b++) {
#pragma unroll
      for (int i = 0; i < C::N / 8; i++) {
#pragma unroll
        for (int j = 0; j < 2; j++) {
          const int tok = tok0 + b * C::N + 8 * i + 2 * q + j;
          if (tok < n) out[(size_t)tok * rows + r] = kcu_t<T>(acc[b][4 * i + 2 * h + j] + bv);
        }
      }
    }
  }
}

template <typename T, int NT, int F>
static int kcu_q4wg_launch(kcu_ctx_t *c, T *out, const kern_weight_t *w, const float *bias, const T *xp, int n) {
  typedef kcu_q4wg_cfg<NT> C;
  const kcu_q4f_view_t v = kcu_q4f_view(w, w->data);
  KCU_LAUNCH(c, (kcu_q4wg_k<T, NT, F>), dim3(kcu_div_up(n, NT), kcu_div_up(v.tiles, C::TILES)), KCU_GG_NT, C::SMEM,
             out, (const uint4 *)v.nib, (const uint4 *)v.dm, xp, bias, (int)w->rows, (int)w->cols, n);
  return 0;
}

template <typename T, int NT>
static int kcu_q4wg_launch_f(kcu_ctx_t *c, T *out, const kern_weight_t *w, const float *bias, const T *xp, int n) {
  return w->type == KERN_Q4G ? kcu_q4wg_launch<T, NT, KCU_QF_Q4G>(c, out, w, bias, xp, n)
                             : kcu_q4wg_launch<T, NT, KCU_QF_Q4F>(c, out, w, bias, xp, n);
}

/* Whether the matmul of w over n rows runs by wgmma (kcu_q4f_wg.cu): from
 * c->q4f_wg to KCU_Q4F_WG_MAX_N rows where its grid fills the GPU twice
 * over, for it splits no weight's columns over CTAs. On an H200, GPTQ
 * Llama-3-8B shapes (docs/bench/gpu.md, session 46): the gate/up
 * projection's 448 CTAs at 65-256 rows, decode steps 4-6% faster; q/k/v's
 * 192 at 129-256 rows were slower than dequantize + cuBLAS. */
bool kcu__q4f_wg_takes(const kcu_ctx_t *c, const kern_weight_t *w, int n) {
  if (!c->q4f_wg || n < c->q4f_wg || n > KCU_Q4F_WG_MAX_N || (w->type != KERN_Q4F && w->type != KERN_Q4G) ||
      w->cols % 8 || (size_t)n * w->cols > c->deq_elems) /* its permuted activations */
    return false;
  const long long ctas =
      (long long)kcu_div_up(n, 64 * c->q4f_wg_mt) * kcu_div_up(kcu_q4f_tiles(w->rows), kcu_q4wg_cfg<64>::TILES);
  return ctas >= (c->q4f_wg_ctas >= 0 ? c->q4f_wg_ctas : 2ll * c->n_sm);
}

template <typename T>
static int kcu_q4wg_matmul(kcu_ctx_t *c, T *out, const kern_weight_t *w, const float *bias, const T *x, int n) {
  const long long total = (long long)n * (w->cols / 8);
  if ((size_t)n * w->cols > c->deq_elems) return fr_errorf(FR_ESTATE, "cuda: matmul: activation scratch too small");
  KCU_LAUNCH(c, kcu_q4wg_xperm_k<T>, kcu_div_up(total, KCU_ELEM_NT), KCU_ELEM_NT, 0, (T *)c->deq, x,
             w->perm ? (const int32_t *)w->priv : (const int32_t *)NULL, (int)w->cols, (int)kern_weight_x_cols(w),
             total);
  const T *xp = (const T *)c->deq;
  switch (c->q4f_wg_mt) {
  case 1: return kcu_q4wg_launch_f<T, 64>(c, out, w, bias, xp, n);
  case 2: return kcu_q4wg_launch_f<T, 128>(c, out, w, bias, xp, n);
  default: return kcu_q4wg_launch_f<T, 256>(c, out, w, bias, xp, n);
  }
}

int kcu__q4f_wg(kcu_ctx_t *c, void *out, const kern_weight_t *w, const float *bias, const void *x, int n) {
  int rc = 0;
  KCU_ACT_DISPATCH(c, rc = kcu_q4wg_matmul<T>(c, (T *)out, w, bias, (const T *)x, n));
  return rc;
}

template <typename T, int NT> static int kcu_q4wg_attr(void) {
  KCU_CHECK(cudaFuncSetAttribute(kcu_q4wg_k<T, NT, KCU_QF_Q4F>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)kcu_q4wg_cfg<NT>::SMEM));
  KCU_CHECK(cudaFuncSetAttribute(kcu_q4wg_k<T, NT, KCU_QF_Q4G>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)kcu_q4wg_cfg<NT>::SMEM));
  return 0;
}

int kcu__q4f_wg_init(kcu_ctx_t *c) {
  int rc = 0;
  KCU_ACT_DISPATCH(c, {
    rc = kcu_q4wg_attr<T, 64>();
    if (!rc) rc = kcu_q4wg_attr<T, 128>();
    if (!rc) rc = kcu_q4wg_attr<T, 256>();
  });
  return rc;
}
