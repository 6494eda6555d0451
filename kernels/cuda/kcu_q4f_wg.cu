/* kcu_q4f_wg.cu - the 4-bit matmul (KERN_Q4F, KERN_Q4G) over many rows by
 * wgmma, built for sm_90a only (kernels/cuda.cmake); kcu__matmul sends it
 * the calls that kcu__q4f_wg_takes (65-256 rows whose grid, split over
 * the weight's columns where short, fills the GPU twice) on a compute
 * capability 9.0 device.
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
 * A grid of fewer CTAs than twice the SMs (a Llama-3-8B's o, down and
 * q/k/v projections: 64-192 CTAs) has its units split into as many parts
 * as fill the CTAs resident at once (kcu_q4wg_grid): each part's CTA puts
 * its f32 sums through shared memory into a partial tile of the scratch,
 * and the CTA that finishes its block last adds the parts' tiles in part
 * order (the same bits whichever it is) and writes the output. On an H200
 * (docs/bench/gpu.md, sessions 46 and 47), GPTQ decode steps ran 4-6%
 * faster at 80-256 rows with the gate/up projection alone on it, and
 * 4-10% faster again with the others split onto it; unsplit, those ran
 * 1.3-2.0x slower than the wide kernel's 64-token CTAs. A form that
 * dequantized the weights into shared memory for wgmma's B was slower,
 * and so was one that left a unit's wgmmas in flight over the next one's
 * dequantization (two sets of fragments), and one that spread every
 * call's units evenly over the resident CTAs (stream-K: gate/up 3%
 * faster, the split projections 10 us slower each; session 48).
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

/* The A fragments of a unit from this lane's nibbles q and (d, m) dm: k16
 * step kk is block kk / 2, step kk % 2. */
template <typename T> __device__ __forceinline__ void kcu_q4wg_frags(uint32_t (&a)[4][4], uint4 q, uint4 dm) {
  const uint32_t qw[4] = {q.x, q.y, q.z, q.w};
  const uint32_t d[2] = {dm.x, dm.z}, d8[2] = {dm.y, dm.w};
#pragma unroll
  for (int kk = 0; kk < 4; kk++) kcu_q4f_frag<T>(qw[kk], d[kk / 2], d8[kk / 2], a[kk]);
}

/* A split CTA's sums (64 rows x NT tokens, f32) in shared memory, token
 * after token, rows KCU_Q4WG_LD apart (4 more than 64: a warp's stores of
 * eight rows at four tokens hit 32 banks). */
#define KCU_Q4WG_LD 68

/* The end of split CTA blockIdx.z: its sums into its partial tile (tile
 * block * gridDim.z + split of part: NT x 64 f32, token after token); the
 * CTA that finishes its (token tile, row block) last adds the splits'
 * tiles in split order, so the sums do not depend on which CTA that is,
 * and writes them (+ bias) to out; it also resets the block's counter for
 * the next call. sh: the CTA's stage memory, free after its loop. */
template <typename T, int NT, int NB, int R>
__device__ __forceinline__ void kcu_q4wg_split_end(float (&acc)[NB][R], float *sh, T *out, const float *bias,
                                                   float *part, int *cnt, int rows, int n, int tok0, int row0) {
  constexpr int V = NT * 16 / KCU_GG_NT; /* float4s of the tile a thread */
  const int warp = threadIdx.x / KCU_WARP, lane = threadIdx.x % KCU_WARP, g = lane >> 2, q = lane & 3;
  __syncthreads(); /* every warp's wgmmas have read their stages */
#pragma unroll
  for (int b = 0; b < NB; b++)
#pragma unroll
    for (int e = 0; e < R; e++)
      sh[(b * 2 * R + 8 * (e >> 2) + 2 * q + (e & 1)) * KCU_Q4WG_LD + 16 * warp + g + 8 * ((e >> 1) & 1)] = acc[b][e];
  __syncthreads();
  const int blk = blockIdx.y * gridDim.x + blockIdx.x;
  float4 *mine = reinterpret_cast<float4 *>(part) + ((size_t)blk * gridDim.z + blockIdx.z) * (NT * 16);
#pragma unroll
  for (int v = 0; v < V; v++) {
    const int i = v * KCU_GG_NT + threadIdx.x; /* float4 i: token i / 16, rows 4 (i % 16) .. */
    __stcg(mine + i, *reinterpret_cast<const float4 *>(sh + (i / 16) * KCU_Q4WG_LD + 4 * (i % 16)));
  }
  __shared__ int last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(cnt + blk, 1) == (int)gridDim.z - 1;
    if (last) cnt[blk] = 0;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  const float4 *tiles = reinterpret_cast<const float4 *>(part) + (size_t)blk * gridDim.z * (NT * 16);
  float4 sum[V];
#pragma unroll
  for (int v = 0; v < V; v++) sum[v] = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int z = 0; z < (int)gridDim.z; z++) {
#pragma unroll
    for (int v = 0; v < V; v++) {
      const float4 p = __ldcg(tiles + (size_t)z * (NT * 16) + v * KCU_GG_NT + threadIdx.x);
      sum[v].x += p.x, sum[v].y += p.y, sum[v].z += p.z, sum[v].w += p.w;
    }
  }
#pragma unroll
  for (int v = 0; v < V; v++) {
    const int i = v * KCU_GG_NT + threadIdx.x, tok = tok0 + i / 16, r = row0 + 4 * (i % 16);
    if (tok >= n) continue;
    const float s4[4] = {sum[v].x, sum[v].y, sum[v].z, sum[v].w};
#pragma unroll
    for (int k = 0; k < 4; k++)
      if (r + k < rows) out[(size_t)tok * rows + r + k] = kcu_t<T>(s4[k] + (bias ? bias[r + k] : 0.f));
  }
}

/* The matmul: CTA (x, y, z) takes tokens NT x .., row tiles 4 y .. and the
 * units of split z (gridDim.z splits; partial sums through part and cnt
 * when more than one). */
template <typename T, int NT, int F, bool SPLIT>
__global__ void __launch_bounds__(KCU_GG_NT)
    kcu_q4wg_k(T *out, const uint4 *nib, const uint4 *dmv, const T *xp, const float *bias, float *part, int *cnt,
               int rows, int cols, int n) {
  typedef kcu_q4wg_cfg<NT> C;
  typedef kcu_gg_ld<NT> L;
  constexpr int S = C::S;
  extern __shared__ uint8_t kcu_q4wg_sh[];
  const int tok0 = blockIdx.x * NT, warp = threadIdx.x / KCU_WARP, lane = threadIdx.x % KCU_WARP;
  const int tile = blockIdx.y * C::TILES + warp, tiles = kcu_q4f_tiles(rows), units = kcu_q4f_units(cols);
  const int u0 = (int)((long long)units * blockIdx.z / gridDim.z);
  const int nu = (int)((long long)units * (blockIdx.z + 1) / gridDim.z) - u0;
  /* the first two units' weights before the wait: they are not written by the kernels before */
  uint4 q0, d0, q1 = make_uint4(0, 0, 0, 0), d1 = q1;
  kcu_q4wg_ldw<F>(q0, d0, nib, dmv, tile, tiles, units, u0, lane);
  if (nu > 1) kcu_q4wg_ldw<F>(q1, d1, nib, dmv, tile, tiles, units, u0 + 1, lane);
  kcu_pdl_enter();
  int src[L::J];
#pragma unroll
  for (int j = 0; j < L::J; j++) {
    const int tok = tok0 + L::r0() + j * L::RS;
    src[j] = tok < n ? tok : -1;
  }
  const uint32_t base = ((uint32_t)__cvta_generic_to_shared(kcu_q4wg_sh) + 1023u) & ~1023u;
  auto load = [&](int k) {
    kcu_gg_load_a<T, NT>(base + (k % S) * C::STAGE, xp, src, cols, (u0 + k) * KCU_Q4F_COLS);
  };
  float acc[C::NB][C::N / 2];
  kcu_wg_pipe_start<S>(nu, load);
  for (int k = 0; k < nu; k++) { /* the split's unit u0 + k */
    uint32_t a[4][4];
    kcu_q4wg_frags<T>(a, q0, d0);
    q0 = q1, d0 = d1;
    if (k + 2 < nu) kcu_q4wg_ldw<F>(q1, d1, nib, dmv, tile, tiles, units, u0 + k + 2, lane);
    kcu_wg_pipe_next<S>(k, nu, load);
    const uint32_t st = base + (k % S) * C::STAGE;
    kcu_wg_fence();
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
#pragma unroll
      for (int b = 0; b < C::NB; b++)
        kcu_wg_mma_rs<T, C::N>(acc[b], a[kk], kcu_wg_desc(st + b * C::N * 128 + kk * 32), k | kk);
    }
    kcu_wg_commit();
    kcu_wg_wait0();
#pragma unroll
    for (int b = 0; b < C::NB; b++) kcu_wg_hold(acc[b]);
  }
  if (SPLIT) {
    kcu_q4wg_split_end<T, NT>(acc, reinterpret_cast<float *>(kcu_q4wg_sh), out, bias, part, cnt, rows, n, tok0,
                              blockIdx.y * C::TILES * KCU_Q4F_ROWS);
    return;
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

/* A call's grid: token tiles, row blocks and splits. A grid short of
 * c->q4f_wg_ctas (or twice the SMs) is split into as many parts as fit
 * the CTAs resident at once (c->q4f_wg_slots), at most KCU_Q4F_WG_SPLITS
 * and at least KCU_Q4F_WG_MIN_UNITS units a part, where its partial tiles
 * fit the scratch past the activations and c->q4f_wg_split is on. */
typedef struct {
  int x, y, z;
} kcu_q4wg_grid_t;

static long long kcu_q4wg_target(const kcu_ctx_t *c) { return c->q4f_wg_ctas >= 0 ? c->q4f_wg_ctas : 2ll * c->n_sm; }

/* Bytes of the permuted activations of n rows, rounded to 256. */
static size_t kcu_q4wg_act_bytes(const kcu_ctx_t *c, const kern_weight_t *w, int n) {
  return ((size_t)n * w->cols * c->act_size + 255) & ~(size_t)255;
}

static kcu_q4wg_grid_t kcu_q4wg_grid(const kcu_ctx_t *c, const kern_weight_t *w, int n) {
  const int nt = 64 * c->q4f_wg_mt;
  kcu_q4wg_grid_t g = {kcu_div_up(n, nt), kcu_div_up(kcu_q4f_tiles(w->rows), KCU_GG_WARPS), 1};
  const long long base = (long long)g.x * g.y;
  if (!c->q4f_wg_split || base >= kcu_q4wg_target(c) || base > (long long)c->q4wg_cnt_n) return g;
  long long z = FR_MIN(c->q4f_wg_slots / base, (long long)KCU_Q4F_WG_SPLITS);
  z = FR_MIN(z, kcu_q4f_units(w->cols) / KCU_Q4F_WG_MIN_UNITS);
  const size_t tiles = (size_t)(base * z) * nt * 64 * sizeof(float);
  if (z > 1 && kcu_q4wg_act_bytes(c, w, n) + tiles <= c->deq_elems * c->act_size) g.z = (int)z;
  return g;
}

/* Whether the matmul of w over n rows runs by wgmma (kcu_q4f_wg.cu): from
 * c->q4f_wg to KCU_Q4F_WG_MAX_N rows where its grid, split or not, fills
 * the GPU twice over. Unsplit, a grid of fewer CTAs left SMs idle and ran
 * slower than the wide kernel or dequantize + cuBLAS (docs/bench/gpu.md,
 * session 46). */
bool kcu__q4f_wg_takes(const kcu_ctx_t *c, const kern_weight_t *w, int n) {
  if (!c->q4f_wg || n < c->q4f_wg || n > KCU_Q4F_WG_MAX_N || (w->type != KERN_Q4F && w->type != KERN_Q4G) ||
      w->cols % 8 || (size_t)n * w->cols > c->deq_elems) /* its permuted activations */
    return false;
  const kcu_q4wg_grid_t g = kcu_q4wg_grid(c, w, n);
  return (long long)g.x * g.y * g.z >= kcu_q4wg_target(c);
}

template <typename T>
using kcu_q4wg_fn = void (*)(T *, const uint4 *, const uint4 *, const T *, const float *, float *, int *, int, int, int);

/* The kernel of NT tokens a CTA for a weight of type t, split or not. */
template <typename T, int NT> static kcu_q4wg_fn<T> kcu_q4wg_pick(kern_type_t t, bool split) {
  if (t == KERN_Q4G) return split ? kcu_q4wg_k<T, NT, KCU_QF_Q4G, true> : kcu_q4wg_k<T, NT, KCU_QF_Q4G, false>;
  return split ? kcu_q4wg_k<T, NT, KCU_QF_Q4F, true> : kcu_q4wg_k<T, NT, KCU_QF_Q4F, false>;
}

template <typename T, int NT>
static int kcu_q4wg_launch(kcu_ctx_t *c, T *out, const kern_weight_t *w, const float *bias, const T *xp, int n) {
  const kcu_q4wg_grid_t g = kcu_q4wg_grid(c, w, n);
  const kcu_q4f_view_t v = kcu_q4f_view(w, w->data);
  float *part = (float *)((uint8_t *)c->deq + kcu_q4wg_act_bytes(c, w, n));
  KCU_LAUNCH(c, kcu_q4wg_pick<T, NT>(w->type, g.z > 1), dim3(g.x, g.y, g.z), KCU_GG_NT, kcu_q4wg_cfg<NT>::SMEM, out,
             (const uint4 *)v.nib, (const uint4 *)v.dm, xp, bias, part, c->q4wg_cnt, (int)w->rows, (int)w->cols, n);
  return 0;
}

/* The scratch (act-type elements) a call of it over w may use: its
 * permuted activations, and past them the partial tiles of its splits
 * (fewer than c->q4f_wg_slots CTAs, each NT x 64 f32). */
size_t kcu__q4f_wg_scratch(const kcu_ctx_t *c, const kern_weight_t *w) {
  const size_t act = (size_t)KCU_Q4F_WG_MAX_N * w->cols + 256 / c->act_size;
  const long long blocks = kcu_div_up(kcu_q4f_tiles(w->rows), KCU_GG_WARPS);
  if (!c->q4f_wg_split || blocks >= kcu_q4wg_target(c)) return act;
  return act + (size_t)c->q4f_wg_slots * 64 * c->q4f_wg_mt * 64 * sizeof(float) / c->act_size;
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
  case 1: return kcu_q4wg_launch<T, 64>(c, out, w, bias, xp, n);
  case 2: return kcu_q4wg_launch<T, 128>(c, out, w, bias, xp, n);
  default: return kcu_q4wg_launch<T, 256>(c, out, w, bias, xp, n);
  }
}

int kcu__q4f_wg(kcu_ctx_t *c, void *out, const kern_weight_t *w, const float *bias, const void *x, int n) {
  int rc = 0;
  KCU_ACT_DISPATCH(c, rc = kcu_q4wg_matmul<T>(c, (T *)out, w, bias, (const T *)x, n));
  return rc;
}

/* Its kernels' shared-memory limits, and (for NT tokens a CTA, the
 * configured size) the CTAs resident at once. */
template <typename T, int NT> static int kcu_q4wg_attr(kcu_ctx_t *c) {
  for (int i = 0; i < 4; i++)
    KCU_CHECK(cudaFuncSetAttribute(kcu_q4wg_pick<T, NT>(i & 1 ? KERN_Q4G : KERN_Q4F, i & 2),
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kcu_q4wg_cfg<NT>::SMEM));
  if (NT == 64 * c->q4f_wg_mt) {
    int per_sm = 0;
    KCU_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kcu_q4wg_pick<T, NT>(KERN_Q4F, true), KCU_GG_NT,
                                                            kcu_q4wg_cfg<NT>::SMEM));
    c->q4f_wg_slots = (long long)FR_MAX(per_sm, 1) * c->n_sm;
  }
  return 0;
}

int kcu__q4f_wg_init(kcu_ctx_t *c) {
  int rc = 0;
  if (!c->q4wg_cnt) { /* a split call's counters: one a CTA of a grid short of the target before its splits */
    const size_t cnt = (size_t)FR_MAX(kcu_q4wg_target(c), 1);
    if ((rc = kcu__alloc(c, cnt * sizeof(int), (void **)&c->q4wg_cnt, "wgmma matmul split counters"))) return rc;
    KCU_CHECK(cudaMemsetAsync(c->q4wg_cnt, 0, cnt * sizeof(int), c->stream));
    c->q4wg_cnt_n = cnt;
  }
  KCU_ACT_DISPATCH(c, {
    rc = kcu_q4wg_attr<T, 64>(c);
    if (!rc) rc = kcu_q4wg_attr<T, 128>(c);
    if (!rc) rc = kcu_q4wg_attr<T, 256>(c);
  });
  return rc;
}
