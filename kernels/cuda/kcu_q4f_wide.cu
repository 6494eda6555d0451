/* kcu_q4f_wide.cu - the KERN_Q4F matmul from 17 rows on sm_90
 * (kcu_q4f.cuh says the layout; kcu_q4f.cu takes fewer rows).
 *
 * Threads: the backend's stream. */
#include <cooperative_groups.h>

#include "kernels/cuda/kcu_q4f.cuh"
#include "kernels/cuda/kcu_mma.cuh"

namespace cg = cooperative_groups;

/* The wide kernel (17 rows and up, sm_90): CTAs of 128 weight rows
 * (KCU_Q4W_WARPS warps of KCU_Q4W_TW row tiles each) and 8 NT tokens.
 * Where kcu_q4f_mma_k's every 16-row tile reads its tokens' activations
 * from L2 (8 bytes a weight at 64 rows: 1.7 GB a Llama-3-8B layer against
 * 136 MB of weights), here each activation staged in shared memory serves
 * 128 rows, and each fragment read from it two tiles' MMAs. Weights and
 * activations stream through S stages of SU units by cp.async, one
 * barrier a stage. A weight of few rows has its units split over the
 * gridDim.z CTAs of one cluster (enough CTAs for the SMs): their sums
 * meet in distributed shared memory and are added in split order, so the
 * bits do not depend on which CTA finishes first.
 *
 * PAIR: a gate/up weight [gate; up] (2d rows, d a multiple of 16) whose
 * output is silu(gate) * up (matmul_silu_mul). A CTA takes 4 gate tiles
 * and their 4 up tiles, each warp a gate tile and its up tile, so a
 * lane's sums of the two rows of a pair sit side by side in its
 * registers. Each sum is rounded to T first, as the matmul would store it
 * before kcu_silu_mul_k reads it: the same bits as the two kernels. */
#define KCU_Q4W_WARPS 4
#define KCU_Q4W_TW 2
#define KCU_Q4W_TILES (KCU_Q4W_WARPS * KCU_Q4W_TW)
#define KCU_Q4W_MIN_UNITS 8 /* fewest units a split */
#define KCU_Q4W_MAX_SPLITS 8 /* a cluster of them: the portable most */
#define KCU_Q4W_FILL 2       /* CTAs a SM the splits aim at */
#define KCU_Q4W_RS (KCU_Q4W_TILES * KCU_Q4F_ROWS + 4) /* floats a token row of the split sums (no bank conflicts) */

/* A stage, in uint4: activations (SU units x 8 NT tokens x 8), then
 * nibbles (tiles x SU x 32 lanes), then (d, m) (tiles x SU x 8; KERN_Q4G
 * has its unit's pair's 64 bytes in the first 4 of each 8, and again in
 * the last 4). */
template <int NT, int SU, int S> struct kcu_q4w_smem {
  static constexpr int X = SU * NT * 8 * 8, Q = KCU_Q4W_TILES * SU * KCU_WARP, D = KCU_Q4W_TILES * SU * 8,
                       STAGE = X + Q + D;
  static constexpr size_t BYTES = (size_t)S * STAGE * sizeof(uint4);
};

/* silu(gate) * up of two sums, each rounded to T as a stored matmul output
 * (+ 0.f: the matmul adds its zero bias) and read back. */
template <typename T> __device__ __forceinline__ T kcu_q4w_silu(float gate, float up) {
  const float gv = kcu_f(kcu_t<T>(gate + 0.f)), uv = kcu_f(kcu_t<T>(up + 0.f));
  return kcu_silu_mul1<T>(gv, uv);
}

/* A warp's PAIR results: ga / ua the sums of gate tile `tile` and its up
 * tile (kcu_q4f_store's register order); out is (n, d). */
template <typename T, int NT>
__device__ __forceinline__ void kcu_q4w_store_silu(const float (&ga)[NT][4], const float (&ua)[NT][4], T *out,
                                                   int tile, int tok0, int d, int n) {
  const int lane = threadIdx.x % KCU_WARP, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int e = 0; e < 4; e++) {
    const int row = tile * KCU_Q4F_ROWS + g + 8 * (e >> 1);
#pragma unroll
    for (int j = 0; j < NT; j++) {
      const int tok = tok0 + 8 * j + 2 * t + (e & 1);
      if (tok < n) out[(size_t)tok * d + row] = kcu_q4w_silu<T>(ga[j][e], ua[j][e]);
    }
  }
}

template <typename T, int NT, int SU, int S, bool PAIR, int F>
__global__ void __launch_bounds__(KCU_Q4W_WARPS *KCU_WARP)
    kcu_q4f_wide_k(T *out, const uint4 *nib, const uint4 *dmv, const T *x, const float *bias, int rows, int cols,
                   int n) {
  typedef kcu_q4w_smem<NT, SU, S> L;
  constexpr int TW = KCU_Q4W_TW, NTH = KCU_Q4W_WARPS * KCU_WARP, TOK = 8 * NT;
  static_assert(!PAIR || TW == 2, "a warp's two tiles are a gate tile and its up tile");
  extern __shared__ uint4 kcu_q4w_sm[];
  const int wr = threadIdx.x / KCU_WARP, lane = threadIdx.x % KCU_WARP, g = lane / 4, t = lane % 4;
  const int tok0 = blockIdx.x * TOK, tile0 = blockIdx.y * KCU_Q4W_TILES, ks = gridDim.z;
  const int tiles = kcu_q4f_tiles(rows), units = kcu_q4f_units(cols);
  /* The CTA's tile tl: tile0 + tl, or (PAIR) gate tile gate0 + tl / 2 and,
   * odd tl, its up tile dt further; it exists while lead(tl) < lim. */
  const int dt = tiles / 2, gate0 = blockIdx.y * (KCU_Q4W_TILES / 2), lim = PAIR ? dt : tiles;
  auto lead = [&](int tl) { return PAIR ? gate0 + tl / 2 : tile0 + tl; };
  auto tile_of = [&](int tl) { return PAIR ? lead(tl) + (tl & 1) * dt : tile0 + tl; };
  /* this CTA's units [u_lo, u_hi), whole stages but the last */
  const int per = ((units + ks - 1) / ks + SU - 1) / SU * SU;
  const int u_lo = FR_MIN(units, (int)blockIdx.z * per), u_hi = FR_MIN(units, u_lo + per);
  const int steps = (u_hi - u_lo + SU - 1) / SU;
  float acc[TW][NT][4];
#pragma unroll
  for (int e = 0; e < TW; e++)
#pragma unroll
    for (int j = 0; j < NT; j++) acc[e][j][0] = acc[e][j][1] = acc[e][j][2] = acc[e][j][3] = 0.f;
  auto stage = [&](int k) { return kcu_q4w_sm + (size_t)(k % S) * L::STAGE; };
  /* The copies of a stage, NTH threads at a time, at 32-bit offsets from
   * their first (what does not change from stage to stage is worked out
   * once). Activations: copy it is token row (it % XR) * XT + tid / 8 of
   * unit it / XR, its 16 bytes tid % 8. Nibbles: copy it is the (tile,
   * unit) pair it * WQ + warp (unit warp % SU, tile it * WQ / SU + warp /
   * SU), the lane's 16 bytes; the (d, m) are one copy, pair tid / 8, 16
   * bytes tid % 8 (KERN_Q4G: 16 bytes tid % 4 of its unit's pair of units,
   * twice: the same copies as KERN_Q4F's, measured faster than half as
   * many). Missing tiles, units and tokens are zeros. */
  constexpr int XT = NTH / 8, XR = TOK / XT, XI = SU * XR, WQ = NTH / KCU_WARP, QI = L::Q / NTH;
  static_assert(L::X == XI * NTH && L::Q == QI * NTH && L::D <= NTH && WQ % SU == 0, "whole rounds of copies");
  /* copy it's tile is tl = it * WA + wr / SU: lead and tile advance by QA a round (WA even, so tl's parity is fixed) */
  constexpr int WA = WQ / SU, QA = PAIR ? WA / 2 : WA;
  static_assert(!PAIR || WA % 2 == 0, "a copy keeps its gate or up side");
  const int tid = threadIdx.x, xc = tid % 8, xr = tid / 8;
  const uint32_t sm0 = (uint32_t)__cvta_generic_to_shared(kcu_q4w_sm);
  const int x_off = (tok0 + xr) * cols + u_lo * KCU_Q4F_COLS + 8 * xc, x_row = XT * cols;
  const int q_lead = lead(wr / SU), q_off = ((tile_of(wr / SU) * units) + u_lo + wr % SU) * KCU_WARP + lane;
  const int d_lead = lead(xr / SU), d_off = ((tile_of(xr / SU) * units) + u_lo + xr % SU) * 8 + xc;
  const int g_off = tile_of(xr / SU) * kcu_q4g_pairs(units) * 4 + xc % 4; /* KERN_Q4G's */
  auto load_w = [&](int k) {
    const uint32_t st = sm0 + (uint32_t)((k % S) * L::STAGE + L::X) * 16;
    const bool u_ok = u_lo + k * SU + wr % SU < u_hi;
#pragma unroll
    for (int it = 0; it < QI; it++) {
      const bool ok = u_ok && q_lead + it * QA < lim;
      const int off = q_off + (it * QA * units + k * SU) * KCU_WARP;
      kcu_cp_async16(st + (it * NTH + tid) * 16, nib + (ok ? off : 0), ok);
    }
    const int u = u_lo + k * SU + xr % SU;
    const bool ok = d_lead < lim && u < u_hi;
    const int off = F == KCU_QF_Q4G ? g_off + (int)((unsigned)u >> 1) * 4 : d_off + k * SU * 8;
    if (L::D == NTH || tid < L::D) kcu_cp_async16(st + (L::Q + tid) * 16, dmv + (ok ? off : 0), ok);
  };
  auto load_x = [&](int k) {
    const uint32_t st = sm0 + (uint32_t)((k % S) * L::STAGE) * 16;
#pragma unroll
    for (int it = 0; it < XI; it++) {
      const int h = it / XR, r = (it % XR) * XT + xr, u = u_lo + k * SU + h;
      const bool ok = tok0 + r < n && u < u_hi && u * KCU_Q4F_COLS + 8 * xc < cols;
      const int off = x_off + (it % XR) * x_row + (k * SU + h) * KCU_Q4F_COLS;
      kcu_cp_async16(st + (h * TOK * 8 + kcu_q4f_xoff(r, xc)) * 16, x + (ok ? off : 0), ok);
    }
  };
  /* the first stages' weights before the PDL wait (no kernel writes them) */
  kcu_pdl_launch_next();
  for (int k = 0; k < S - 1 && k < steps; k++) load_w(k);
  kcu_pdl_wait();
  for (int k = 0; k < S - 1; k++) {
    if (k < steps) load_x(k);
    kcu_cp_commit();
  }
  for (int k = 0; k < steps; k++) {
    kcu_cp_wait<S - 2>();
    __syncthreads(); /* step k is in; every warp is done with step k - 1's stage */
    if (k + S - 1 < steps) load_w(k + S - 1), load_x(k + S - 1);
    kcu_cp_commit();
    const uint4 *sx = stage(k), *sq = sx + L::X, *sd = sq + L::Q;
#pragma unroll
    for (int h = 0; h < SU; h++) {
      uint4 q[TW], d[TW];
#pragma unroll
      for (int e = 0; e < TW; e++) {
        const int tl = wr * TW + e;
        q[e] = sq[(tl * SU + h) * KCU_WARP + lane];
        if (F == KCU_QF_Q4G) { /* one pair for both blocks: .x, .y */
          const uint2 v = reinterpret_cast<const uint2 *>(sd + (tl * SU + h) * 8)[g];
          d[e] = make_uint4(v.x, v.y, 0u, 0u);
        } else {
          d[e] = sd[(tl * SU + h) * 8 + g];
        }
      }
#pragma unroll
      for (int b = 0; b < 2; b++) { /* a missing block has zero weights and activations */
        uint4 xv[NT];
#pragma unroll
        for (int j = 0; j < NT; j++) xv[j] = sx[h * TOK * 8 + kcu_q4f_xoff(8 * j + g, 4 * b + t)];
#pragma unroll
        for (int s = 0; s < 2; s++) {
          uint32_t a[TW][4];
#pragma unroll
          for (int e = 0; e < TW; e++) {
            const uint32_t qw[4] = {q[e].x, q[e].y, q[e].z, q[e].w};
            const bool b1 = b && F != KCU_QF_Q4G;
            kcu_q4f_frag<T>(qw[2 * b + s], b1 ? d[e].z : d[e].x, b1 ? d[e].w : d[e].y, a[e]);
          }
#pragma unroll
          for (int j = 0; j < NT; j++) {
            const uint32_t bf[2] = {s ? xv[j].z : xv[j].x, s ? xv[j].w : xv[j].y};
#pragma unroll
            for (int e = 0; e < TW; e++) kcu_mma16816<T>(acc[e][j], a[e], bf);
          }
        }
      }
    }
  }
  kcu_cp_wait<0>();
  if (ks == 1) {
    if constexpr (PAIR) {
      if (lead(wr * TW) < lim)
        kcu_q4w_store_silu<T, NT>(acc[0], acc[1], out, lead(wr * TW), tok0, dt * KCU_Q4F_ROWS, n);
    } else {
#pragma unroll
      for (int e = 0; e < TW; e++)
        if (tile0 + wr * TW + e < tiles) kcu_q4f_store<T, NT>(acc[e], out, bias, tile0 + wr * TW + e, tok0, rows, n);
    }
    return;
  }
  /* split: the cluster's ks CTAs (one a split) leave their sums in their
   * shared memory; CTA z then adds up token rows z, z + ks, ... of all
   * of them, in split order, a thread a weight row */
  float *red = reinterpret_cast<float *>(kcu_q4w_sm);
  static_assert(TOK * KCU_Q4W_RS * sizeof(float) <= L::BYTES, "the sums fit the stages");
  static_assert(NTH == KCU_Q4W_TILES * KCU_Q4F_ROWS, "a thread a row");
  __syncthreads(); /* every warp is done with the stages */
#pragma unroll
  for (int e = 0; e < TW; e++)
#pragma unroll
    for (int f = 0; f < 4; f++)
#pragma unroll
      for (int j = 0; j < NT; j++)
        red[(8 * j + 2 * t + (f & 1)) * KCU_Q4W_RS + (wr * TW + e) * KCU_Q4F_ROWS + g + 8 * (f >> 1)] = acc[e][j][f];
  cg::cluster_group cl = cg::this_cluster();
  cl.sync();
  const int z = (int)cl.block_rank();
  if constexpr (PAIR) {
    /* the CTA's 64 gate rows, each with two threads taking every other of
     * the token rows: gate row i's sums at local row 32 (i / 16) + i % 16
     * (tile 2 p), its up row's 16 further (tile 2 p + 1) */
    constexpr int GR = KCU_Q4W_TILES / 2 * KCU_Q4F_ROWS;
    const int i = threadIdx.x % GR, half = threadIdx.x / GR, d = dt * KCU_Q4F_ROWS;
    const int lr = 2 * KCU_Q4F_ROWS * (i / KCU_Q4F_ROWS) + i % KCU_Q4F_ROWS, row = gate0 * KCU_Q4F_ROWS + i;
    if (gate0 + i / KCU_Q4F_ROWS < dt)
      for (int r = z + half * ks; r < TOK && tok0 + r < n; r += 2 * ks) {
        float gv = 0.f, uv = 0.f;
#pragma unroll
        for (int y = 0; y < KCU_Q4W_MAX_SPLITS; y++)
          if (y < ks) {
            const float *sums = cl.map_shared_rank(red, y) + r * KCU_Q4W_RS + lr;
            gv += sums[0];
            uv += sums[KCU_Q4F_ROWS];
          }
        out[(size_t)(tok0 + r) * d + row] = kcu_q4w_silu<T>(gv, uv);
      }
  } else {
    const int row = tile0 * KCU_Q4F_ROWS + threadIdx.x;
    if (row < rows) {
      const float bv = bias ? bias[row] : 0.f;
      for (int r = z; r < TOK && tok0 + r < n; r += ks) {
        float v = 0.f;
#pragma unroll
        for (int y = 0; y < KCU_Q4W_MAX_SPLITS; y++)
          if (y < ks) v += cl.map_shared_rank(red, y)[r * KCU_Q4W_RS + threadIdx.x];
        out[(size_t)(tok0 + r) * rows + row] = kcu_t<T>(v + bv);
      }
    }
  }
  cl.sync(); /* no CTA leaves while another reads its sums */
}

/* Splits of the units of a kcu_q4f_wide_k call of grid (x, y), tok
 * tokens a CTA: c->q4f_ks; none for CTAs of 32 tokens where the grid has
 * one for every SM already; else enough CTAs for KCU_Q4W_FILL a SM, each
 * split at least KCU_Q4W_MIN_UNITS units.
 * (Measured on H200, docs/bench/gpu.md, sessions 24, 25 and 33: aiming
 * at 2 CTAs a SM beats 1, 3 and 4, and counting whole waves with
 * clusters of up to 16 splits was slower. Llama-3-8B's
 * gate/up at 17-32 rows, a grid of 1.7 CTAs a SM, runs its decode steps
 * 2-3% faster whole than split in two; at 33-64 rows, 64-token CTAs, 8%
 * slower, though ncu times the kernel alone 12% faster whole.) */
static int kcu_q4w_splits(const kcu_ctx_t *c, dim3 grid, int tok, int units) {
  if (c->q4f_ks) return FR_MIN(c->q4f_ks, KCU_Q4W_MAX_SPLITS);
  const long long ctas = (long long)grid.x * grid.y;
  if (tok <= 32 && ctas >= c->n_sm) return 1;
  const long long ks = kcu_div_up((long long)KCU_Q4W_FILL * c->n_sm, ctas);
  return (int)FR_MAX(FR_MIN(ks, (long long)FR_MIN(units / KCU_Q4W_MIN_UNITS, KCU_Q4W_MAX_SPLITS)), 1ll);
}

template <typename T, int NT, int SU, int S, bool PAIR, int F>
static int kcu_q4w_launch(kcu_ctx_t *c, T *out, const kern_weight_t *w, const float *bias, const T *x, int n) {
  const kcu_q4f_view_t v = kcu_q4f_view(w, w->data);
  const int row_ctas = PAIR ? kcu_div_up(v.tiles / 2, KCU_Q4W_TILES / 2) : kcu_div_up(v.tiles, KCU_Q4W_TILES);
  dim3 grid(kcu_div_up(n, 8 * NT), row_ctas, 1);
  const int ks = kcu_q4w_splits(c, grid, 8 * NT, v.units);
  grid.z = ks;
  if (grid.y > 65535) return fr_errorf(FR_EUNSUPPORTED, "cuda: Q4F matmul of %lld rows", (long long)w->rows);
  KCU_CHECK(kcu_launch_cluster(c, kcu_q4f_wide_k<T, NT, SU, S, PAIR, F>, grid, dim3(1, 1, ks), KCU_Q4W_WARPS * KCU_WARP,
                               kcu_q4w_smem<NT, SU, S>::BYTES, out, (const uint4 *)v.nib, (const uint4 *)v.dm, x,
                               bias, (int)w->rows, (int)w->cols, n));
  return 0;
}

/* Up to 32 tokens a CTA, 2 units a stage in 4 stages; up to 64, 1 unit a
 * stage in 5, which lets 3 CTAs share a SM (measured on H200, Llama-3-8B
 * shapes: docs/bench/gpu.md, session 24; 4 CTAs a SM, at 128 registers
 * and 4 or 3 stages, was 17% slower at 64 rows: session 33). */
#define KCU_Q4W_32 4, 2, 4
#define KCU_Q4W_64 8, 1, 5

/* The launch for n tokens and w's layout. */
template <typename T, bool PAIR>
static int kcu_q4w_launch_n(kcu_ctx_t *c, T *out, const kern_weight_t *w, const float *bias, const T *x, int n) {
  if (w->type == KERN_Q4G)
    return n <= 32 ? kcu_q4w_launch<T, KCU_Q4W_32, PAIR, KCU_QF_Q4G>(c, out, w, bias, x, n)
                   : kcu_q4w_launch<T, KCU_Q4W_64, PAIR, KCU_QF_Q4G>(c, out, w, bias, x, n);
  return n <= 32 ? kcu_q4w_launch<T, KCU_Q4W_32, PAIR, KCU_QF_Q4F>(c, out, w, bias, x, n)
                 : kcu_q4w_launch<T, KCU_Q4W_64, PAIR, KCU_QF_Q4F>(c, out, w, bias, x, n);
}

int kcu__q4w_matmul(kcu_ctx_t *c, void *out, const kern_weight_t *w, const float *bias, const void *x, int n) {
  int rc = 0;
  KCU_ACT_DISPATCH(c, rc = kcu_q4w_launch_n<T, false>(c, (T *)out, w, bias, (const T *)x, n));
  return rc;
}

int kcu__q4w_matmul_silu(kcu_ctx_t *c, void *out, const kern_weight_t *w, const void *x, int n) {
  if (w->rows % (2 * KCU_Q4F_ROWS))
    return fr_errorf(FR_EFORMAT, "cuda: Q4F matmul_silu_mul: %lld rows, not two halves of whole tiles",
                     (long long)w->rows);
  int rc = 0;
  KCU_ACT_DISPATCH(c, rc = kcu_q4w_launch_n<T, true>(c, (T *)out, w, NULL, (const T *)x, n));
  return rc;
}

/* A wide kernel's shared memory past 48 KB (at create: a first launch may
 * be inside a capture). */
template <typename T, int NT, int SU, int S, int F> static int kcu_q4w_attr_f(void) {
  KCU_CHECK(cudaFuncSetAttribute(kcu_q4f_wide_k<T, NT, SU, S, false, F>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)kcu_q4w_smem<NT, SU, S>::BYTES));
  KCU_CHECK(cudaFuncSetAttribute(kcu_q4f_wide_k<T, NT, SU, S, true, F>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)kcu_q4w_smem<NT, SU, S>::BYTES));
  return 0;
}
template <typename T, int NT, int SU, int S> static int kcu_q4w_attr(void) {
  int rc = kcu_q4w_attr_f<T, NT, SU, S, KCU_QF_Q4F>();
  return rc ? rc : kcu_q4w_attr_f<T, NT, SU, S, KCU_QF_Q4G>();
}

int kcu__q4f_init(kcu_ctx_t *c) {
  int major = 0;
  int rc = kcu__q4g_row_init(c);
  if (rc) return rc;
#ifdef KCU_HAVE_WG
  if (c->q4f_wg && (rc = kcu__q4f_wg_init(c))) return rc;
#endif
  KCU_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c->device));
  if (major < 9 || kcu_q4w_smem<KCU_Q4W_64>::BYTES > c->smem_optin || kcu_q4w_smem<KCU_Q4W_32>::BYTES > c->smem_optin) {
    c->q4f_wide = 1 << 30; /* clusters are sm_90's */
    return 0;
  }
  KCU_ACT_DISPATCH(c, {
    rc = kcu_q4w_attr<T, KCU_Q4W_32>();
    if (!rc) rc = kcu_q4w_attr<T, KCU_Q4W_64>();
  });
  return rc;
}
