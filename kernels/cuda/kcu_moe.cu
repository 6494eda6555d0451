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
 * and for more pairs, grouped GEMMs on the tensor cores (kcu_ggemm.cu):
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

#include "kernels/cuda/kcu_quant.cuh"

#define KCU_MOE_MAX_E KCU_GG_MAX_W /* experts per layer (their addresses are kernel parameters) */
#define KCU_MOE_ALIGN_NT 1024
#define KCU_MOE_GEMV_U 4     /* 16-byte weight loads each lane of the decode GEMVs keeps in flight */
#define KCU_MOE_MIN_TOKENS 256 /* tokens the scratch holds at the least, so small steps never grow it */
#define KCU_MOE_ROUTE_MAX (KCU_MOE_MAX_E / KCU_WARP) /* router logits per lane */

/* A layer's expert addresses, one table per matrix. */
typedef struct {
  kcu_gg_ptrs_t gate, up, down;
} kcu_moe_w_t;

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
    if (bi >= n_exp) bi = j, best = NAN; /* NaN logits pick nothing: any valid expert, a NaN weight */
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
    kcu_moe_gemv_gu_k(T *h, const T *x, const int32_t *sel, int k, const __grid_constant__ kcu_gg_ptrs_t g,
                      const __grid_constant__ kcu_gg_ptrs_t u, size_t row_bytes, int ffn, int dim) {
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
                        const __grid_constant__ kcu_gg_ptrs_t dn, size_t row_bytes, int dim, int ffn) {
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
  const long long P = n * k, rows = kcu_moe_rows_cap(P, n_exp, KCU_GG_ROWS_LARGE);
  const int tiles = FR_MAX(kcu_moe_tiles_cap(P, n_exp, KCU_GG_ROWS_LARGE), kcu_moe_tiles_cap(P, n_exp, KCU_GG_ROWS_SMALL));
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
  kcu__x8_drop(c);
  KCU_CUBLAS(cublasGemmEx(c->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)r->rows, n, (int)r->cols, &alpha, r->data, dt,
                          (int)r->cols, x, dt, (int)r->cols, &beta, b->logits, CUDA_R_32F, (int)r->rows,
                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return 0;
}

static void kcu_moe_addresses(kcu_moe_w_t *w, const kern_moe_t *m) {
  for (int e = 0; e < m->n_experts; e++) {
    w->gate.p[e] = (const uint8_t *)m->gate[e].data;
    w->up.p[e] = (const uint8_t *)m->up[e].data;
    w->down.p[e] = (const uint8_t *)m->down[e].data;
  }
}

/* The tensor-core path: gate/up over the tiles of x's gathered rows, then
 * down over the hidden rows in the same tiles (kcu_ggemm.cu). */
static int kcu_moe_gemms(kcu_ctx_t *c, const kern_moe_t *m, const kcu_moe_w_t *w, const kcu_moe_buf_t *b,
                         const void *x, int tiles, bool small) {
  const int dim = (int)m->router->cols, ffn = (int)m->gate[0].rows;
  const kcu_gg_rows_t gu_rows = {.sorted = b->sorted, .gather_k = m->n_used, .tile_w = b->tile_exp,
                                 .n_tiles = b->n_tiles, .tiles = tiles, .small = small};
  kcu_gg_rows_t d_rows = gu_rows;
  d_rows.gather_k = 0;
  int rc = kcu__gg(c, KCU_GG_GATED, b->h, x, &gu_rows, &w->gate, &w->up, m->gate[0].type, m->gate[0].row_bytes, ffn,
                   dim);
  return rc ? rc
            : kcu__gg(c, KCU_GG_F32, b->y, b->h, &d_rows, &w->down, &w->down, m->down[0].type, m->down[0].row_bytes,
                      dim, ffn);
}

/* The decode path: both GEMVs, the down one with the combine. */
template <typename T, int QT>
static int kcu_moe_gemvs(kcu_ctx_t *c, const kern_moe_t *m, const kcu_moe_w_t *w, const kcu_moe_buf_t *b, T *out,
                         const T *x, int n) {
  const int dim = (int)m->router->cols, ffn = (int)m->gate[0].rows, k = m->n_used, wpc = KCU_ELEM_NT / KCU_WARP;
  KCU_LAUNCH(c, kcu_moe_gemv_gu_k<T, QT>, dim3(kcu_div_up(ffn, wpc), n * k), KCU_ELEM_NT, 0, (T *)b->h, x,
             (const int32_t *)b->sel, k, w->gate, w->up, m->gate[0].row_bytes, ffn, dim);
  KCU_LAUNCH(c, kcu_moe_gemv_down_k<T, QT>, dim3(kcu_div_up(dim, wpc), n), KCU_ELEM_NT, 0, out, (const T *)b->h,
             (const int32_t *)b->sel, (const float *)b->wt, k, w->down, m->down[0].row_bytes, dim, ffn);
  return 0;
}

template <typename T>
static int kcu_moe_gemvs_typed(kcu_ctx_t *c, const kern_moe_t *m, const kcu_moe_w_t *w, const kcu_moe_buf_t *b,
                               T *out, const T *x, int n) {
  const kern_type_t t = m->gate[0].type;
  if (t == c->act) return kcu_moe_gemvs<T, 0>(c, m, w, b, out, x, n);
  KCU_QUANT_DISPATCH(t, return fr_errorf(FR_EUNSUPPORTED, "cuda: moe_ffn: experts of type %d", (int)t),
                     return kcu_moe_gemvs<T, QT>(c, m, w, b, out, x, n));
  return 0;
}

int kcu__moe_ffn(void *ctx, void *out, const void *x, int n, const kern_moe_t *m) {
  kcu_ctx_t *c = (kcu_ctx_t *)ctx;
  int rc = kcu_moe_check(c, m, n);
  if (rc || n == 0) return rc;
  kcu_moe_buf_t b = {};
  if ((rc = kcu_moe_reserve(c, m, n, &b))) return rc;
  const int k = m->n_used, E = m->n_experts, dim = (int)m->router->cols;
  const long long P = (long long)n * k;
  /* 16-row tiles while the experts get few rows each on average: a decode
   * step of up to 256 sequences at top-8 of 128 experts, 11-17% faster at
   * 96-256 than on 64-row tiles. A prefill of one sequence's 256 tokens (the
   * same 16 an expert on average) was 9% faster on 64-row ones: its tokens
   * crowd fewer experts. Measured on H200, docs/bench/gpu.md, session 44. */
  const int bm = P <= (long long)c->moe_small_per_exp * E ? KCU_GG_ROWS_SMALL : KCU_GG_ROWS_LARGE;
  const int rows = (int)kcu_moe_rows_cap(P, E, bm), tiles = kcu_moe_tiles_cap(P, E, bm);
  if ((rc = kcu_moe_router(c, &b, m->router, x, n))) return rc;
  kcu_moe_w_t w;
  kcu_moe_addresses(&w, m);
  const int route_warps = KCU_ELEM_NT / KCU_WARP;
  KCU_LAUNCH(c, kcu_moe_route_k, kcu_div_up(n, route_warps), KCU_ELEM_NT, 0, (const float *)b.logits, n, E, k,
             (int)m->norm_topk, b.sel, b.wt);
  if (P <= c->moe_gemv_pairs) {
    KCU_ACT_DISPATCH(c, rc = kcu_moe_gemvs_typed<T>(c, m, &w, &b, (T *)out, (const T *)x, n));
    return rc;
  }
  KCU_LAUNCH(c, kcu_moe_align_k, 1, KCU_MOE_ALIGN_NT, 0, (const int32_t *)b.sel, (int)P, E, bm, rows, b.sorted,
             b.tile_exp, b.n_tiles, b.slot);
  const dim3 cgrid(n, kcu_div_up(dim, KCU_ELEM_NT * 4));
  if ((rc = kcu_moe_gemms(c, m, &w, &b, x, tiles, bm == KCU_GG_ROWS_SMALL))) return rc;
  KCU_ACT_DISPATCH(c, {
    KCU_LAUNCH(c, kcu_moe_combine_k<T>, cgrid, KCU_ELEM_NT, 0, (T *)out, (const float *)b.y, (const float *)b.wt,
               (const int32_t *)b.slot, k, dim);
  });
  return 0;
}
