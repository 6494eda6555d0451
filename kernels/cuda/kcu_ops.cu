/* kcu_ops.cu - elementwise and row ops of the CUDA backend: type
 * conversion, embed, rms_norm (+ fused residual add), rope, KV append (also
 * fused with rope) and block copy, silu_mul, add, last_rows, pool_rows, bias. All math in f32. */
#include "kernels/cuda/kcu_quant.cuh"

#define KCU_GRID_PER_SM 32   /* most CTAs per SM of the grid-stride kernels (convert, add): fills every SM
                                several times over; the loop covers the rest */
#define KCU_EMBED_Q_NT 64    /* threads (a sub-block each) per CTA of the quantized embedding: a row has
                                only cols / KCU_QSUB sub-blocks (128 at dim 4096), spread over a few CTAs */

/* ---- conversion ---------------------------------------------------------------- */

template <typename S, typename D> __global__ void kcu_convert_k(D *dst, const S *src, size_t n) {
  kcu_pdl_enter();
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    dst[i] = kcu_t<D>(kcu_f(src[i]));
}

template <typename S> static int kcu_convert_from(kcu_ctx_t *c, void *dst, kern_type_t dt, const S *src, size_t n) {
  int grid = (int)FR_MIN((n + KCU_ELEM_NT - 1) / KCU_ELEM_NT, (size_t)c->n_sm * KCU_GRID_PER_SM);
  if (dt == KERN_F32) KCU_LAUNCH(c, kcu_convert_k<S, float>, grid, KCU_ELEM_NT, 0, (float *)dst, src, n);
  else if (dt == KERN_F16) KCU_LAUNCH(c, kcu_convert_k<S, __half>, grid, KCU_ELEM_NT, 0, (__half *)dst, src, n);
  else if (dt == KERN_BF16)
    KCU_LAUNCH(c, kcu_convert_k<S, __nv_bfloat16>, grid, KCU_ELEM_NT, 0, (__nv_bfloat16 *)dst, src, n);
  else return fr_errorf(FR_EUNSUPPORTED, "cuda: convert to type %d", (int)dt);
  return 0;
}

int kcu__convert(kcu_ctx_t *c, void *dst, kern_type_t dt, const void *src, kern_type_t st, size_t n) {
  if (n == 0) return 0;
  if (st == KERN_F32) return kcu_convert_from(c, dst, dt, (const float *)src, n);
  if (st == KERN_F16) return kcu_convert_from(c, dst, dt, (const __half *)src, n);
  if (st == KERN_BF16) return kcu_convert_from(c, dst, dt, (const __nv_bfloat16 *)src, n);
  return fr_errorf(FR_EUNSUPPORTED, "cuda: convert from type %d", (int)st);
}

/* ---- embed ----------------------------------------------------------------------- */

/* out(n_tokens, cols) = table rows; token ids from the step (device). */
template <typename T, typename S>
__global__ void kcu_embed_dense_k(T *out, const S *table, const int32_t *tokens, int64_t rows, int cols) {
  KCU_TRACE_SCOPE(KCU_TR_EMBED);
  kcu_pdl_enter();
  int t = blockIdx.y;
  int32_t id = tokens[t];
  bool ok = id >= 0 && id < rows;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < cols; i += gridDim.x * blockDim.x)
    out[(size_t)t * cols + i] = kcu_t<T>(ok ? kcu_f(table[(size_t)id * cols + i]) : 0.f);
}

template <typename T, int QT>
__global__ void kcu_embed_quant_k(T *out, const uint8_t *table, size_t row_bytes, const int32_t *tokens, int64_t rows,
                                  int cols) {
  kcu_pdl_enter();
  int t = blockIdx.y, u = blockIdx.x * blockDim.x + threadIdx.x;
  if (u >= cols / KCU_QSUB) return;
  int32_t id = tokens[t];
  float w[KCU_QSUB];
  if (id >= 0 && id < rows) {
    int sub;
    const uint8_t *b = kcu_sub_block<QT>(table + (size_t)id * row_bytes, u, &sub);
    kcu_deq32<QT>(b, sub, w);
  } else {
#pragma unroll
    for (int i = 0; i < KCU_QSUB; i++) w[i] = 0.f;
  }
  uint4 *o = reinterpret_cast<uint4 *>(out + (size_t)t * cols + KCU_QSUB * u);
#pragma unroll
  for (int i = 0; i < KCU_QSUB / 8; i++) o[i] = kcu_pack8<T>(w + 8 * i);
}

int kcu__embed(kcu_ctx_t *c, void *out, const kern_weight_t *tb) {
  int nt = c->n_tokens, cols = (int)tb->cols;
  if (nt == 0) return 0;
  if (nt > 65535) return fr_errorf(FR_EUNSUPPORTED, "cuda: embed of %d tokens", nt);
  KCU_ACT_DISPATCH(c, {
    T *o = (T *)out;
    if (tb->type == KERN_F32) {
      KCU_LAUNCH(c, kcu_embed_dense_k<T, float>, dim3(kcu_div_up(cols, KCU_ELEM_NT), nt), KCU_ELEM_NT, 0, o,
                 (const float *)tb->data, c->dm.tokens, tb->rows, cols);
    } else if (tb->type == c->act) {
      KCU_LAUNCH(c, kcu_embed_dense_k<T, T>, dim3(kcu_div_up(cols, KCU_ELEM_NT), nt), KCU_ELEM_NT, 0, o,
                 (const T *)tb->data, c->dm.tokens, tb->rows, cols);
    } else {
      dim3 grid(kcu_div_up(cols / KCU_QSUB, KCU_EMBED_Q_NT), nt);
      KCU_QUANT_DISPATCH(tb->type, return fr_errorf(FR_EUNSUPPORTED, "cuda: embed from type %d", (int)tb->type),
                         KCU_LAUNCH(c, kcu_embed_quant_k<T, QT>, grid, KCU_EMBED_Q_NT, 0, o, (const uint8_t *)tb->data,
                                    tb->row_bytes, c->dm.tokens, tb->rows, cols));
    }
  });
  return 0;
}

/* ---- rms_norm ----------------------------------------------------------------------- */

/* One CTA per row. With `res`: res += x (stored in T), then norm of res. */
template <typename T, int NT>
__global__ void kcu_rms_norm_k(T *out, T *res, const T *x, const float *w, int dim, float eps) {
  kcu_pdl_enter();
  __shared__ float red[KCU_MAX_WARPS];
  size_t row = (size_t)blockIdx.x * dim;
  float ss = 0.f;
  for (int i = threadIdx.x; i < dim; i += NT) {
    float v = kcu_f(x[row + i]);
    if (res) {
      T r = kcu_t<T>(kcu_f(res[row + i]) + v);
      res[row + i] = r;
      v = kcu_f(r);
    }
    ss += v * v;
  }
  ss = kcu_block_sum<NT>(ss, red);
  float inv = rsqrtf(ss / (float)dim + eps);
  const T *src = res ? res : x;
  for (int i = threadIdx.x; i < dim; i += NT) out[row + i] = kcu_t<T>(kcu_f(src[row + i]) * inv * w[i]);
}

/* The same with 16-byte accesses, the row kept in registers (V chunks of 8
 * per thread, dim <= 8 * NT * V), the weights loaded before the PDL wait and
 * every chunk of x and res loaded before the first residual store (one trip
 * to memory, not one a chunk: the compiler cannot move a load past a store
 * that might alias it). dim % 8 == 0, rows 16-byte aligned; out may alias x.
 * TWIN: out's FP8 twin into q8 / q8s as well (kcu_f8.cu), the grid
 * kcu__x8_rows(n) CTAs, those past n its padding. */
template <typename T, int NT, int V, bool TWIN = false>
__global__ void __launch_bounds__(NT) kcu_rms_norm_vec_k(T *out, T *res, const T *x, const float *w, int dim,
                                                         float eps, int next, int n, uint8_t *q8, float *q8s) {
  KCU_TRACE_SCOPE(KCU_TR_NORM);
  __shared__ float red[KCU_MAX_WARPS];
  const int n8 = dim / 8;
  float4 wv[V][2];
  kcu_norm_load_w<NT, V>(wv, w, n8);
  kcu_pdl_wait_launch(next);
  if (TWIN && (int)blockIdx.x >= n) {
    kcu_f8_pad_row<NT>(q8, q8s, n8, blockIdx.x);
    return;
  }
  const size_t row = (size_t)blockIdx.x * n8;
  const uint4 *x8 = reinterpret_cast<const uint4 *>(x) + row;
  uint4 *r8 = reinterpret_cast<uint4 *>(res) + row;
  uint4 xl[V], rl[V];
#pragma unroll
  for (int c = 0; c < V; c++) {
    const int j = threadIdx.x + c * NT;
    if (j >= n8) break;
    xl[c] = x8[j];
    if (res) rl[c] = r8[j];
  }
  float v[V][8], ss = 0.f;
#pragma unroll
  for (int c = 0; c < V; c++) {
    const int j = threadIdx.x + c * NT;
    if (j >= n8) break;
    kcu_unpack8(xl[c], v[c], (const T *)0);
    if (res) {
      float r[8];
      kcu_unpack8(rl[c], r, (const T *)0);
#pragma unroll
      for (int e = 0; e < 8; e++) v[c][e] = kcu_f(kcu_t<T>(r[e] + v[c][e]));
      r8[j] = kcu_pack8<T>(v[c]);
    }
#pragma unroll
    for (int e = 0; e < 8; e++) ss += v[c][e] * v[c][e];
  }
  kcu_norm_row_out<T, NT, V, TWIN>(v, ss, wv, reinterpret_cast<uint4 *>(out) + row, n8, dim, eps, red);
  if constexpr (TWIN) kcu_f8_twin_row<NT, V>(q8, q8s, v, n8, blockIdx.x, red);
  kcu_pdl_launch_late(next);
}

/* Many short rows without a residual (a prefill's per-head q/k norms):
 * KCU_NORM_TPR lanes a row, each with up to KCU_NORM_V 16-byte chunks
 * (rows of at most 8 * 8 * 4 = 256 elements), 16 rows a CTA. A CTA a row
 * made a 2048-token prefill of 32 query heads 65,536 one-warp CTAs: 81 us
 * a layer on an H200 (docs/bench/gpu.md, session 44), what the SMs take to
 * start that many CTAs, not to move 17 MB. out may alias x. */
template <typename T, int TPR, int V>
__global__ void __launch_bounds__(KCU_NORM_ROWS_NT)
    kcu_rms_norm_rows_k(T *out, const T *x, const float *w, long long n, int dim, float eps, int next) {
  const int n8 = dim / 8, l = threadIdx.x % TPR;
  const long long row = (long long)blockIdx.x * (KCU_NORM_ROWS_NT / TPR) + threadIdx.x / TPR;
  const bool live = row < n;
  float4 wv[V][2];
#pragma unroll
  for (int c = 0; c < V; c++) {
    const int j = l + c * TPR;
    if (j >= n8) break;
    wv[c][0] = __ldg(reinterpret_cast<const float4 *>(w) + 2 * j);
    wv[c][1] = __ldg(reinterpret_cast<const float4 *>(w) + 2 * j + 1);
  }
  kcu_pdl_wait_launch(next);
  const uint4 *x8 = reinterpret_cast<const uint4 *>(x) + row * n8;
  uint4 xl[V];
#pragma unroll
  for (int c = 0; c < V; c++) {
    const int j = l + c * TPR;
    if (live && j < n8) xl[c] = x8[j];
  }
  float v[V][8], ss = 0.f;
#pragma unroll
  for (int c = 0; c < V; c++) {
    const int j = l + c * TPR;
    if (!live || j >= n8) break;
    kcu_unpack8(xl[c], v[c], (const T *)0);
#pragma unroll
    for (int e = 0; e < 8; e++) ss += v[c][e] * v[c][e];
  }
#pragma unroll
  for (int o = TPR / 2; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o); /* within the row's lanes */
  const float inv = rsqrtf(ss / (float)dim + eps);
  uint4 *o8 = reinterpret_cast<uint4 *>(out) + row * n8;
#pragma unroll
  for (int c = 0; c < V; c++) {
    const int j = l + c * TPR;
    if (!live || j >= n8) break;
    const float *wf = reinterpret_cast<const float *>(wv[c]);
    float o[8];
#pragma unroll
    for (int e = 0; e < 8; e++) o[e] = v[c][e] * inv * wf[e];
    o8[j] = kcu_pack8<T>(o);
  }
  kcu_pdl_launch_late(next);
}

/* kcu_rms_norm_vec_k over n rows, with the FP8 twin or without. */
template <typename T, int NT>
static cudaError_t kcu_rms_norm_vec_launch(kcu_ctx_t *c, bool twin, T *out, T *res, const T *x, const float *w, int n,
                                           int dim, float eps, int next) {
  if (twin)
    return kcu_launch(c, kcu_rms_norm_vec_k<T, NT, KCU_NORM_V, true>, kcu__x8_rows(n), NT, 0, out, res, x, w, dim, eps,
                      next, n, c->x8, c->x8s);
  return kcu_launch(c, kcu_rms_norm_vec_k<T, NT, KCU_NORM_V>, n, NT, 0, out, res, x, w, dim, eps, next, n,
                    (uint8_t *)nullptr, (float *)nullptr);
}

int kcu__rms_norm(kcu_ctx_t *c, void *out, void *residual, const void *x, const float *w, int n, int dim, float eps) {
  if (n <= 0) return 0;
  const bool vec = dim % 8 == 0 && kcu_al16(out) && kcu_al16(x) && kcu_al16(w) && (!residual || kcu_al16(residual));
  if (vec && !residual && dim <= 8 * KCU_NORM_TPR * KCU_NORM_V && n >= KCU_NORM_ROWS_MIN) {
    KCU_ACT_DISPATCH(c, KCU_LAUNCH(c, kcu_rms_norm_rows_k<T, KCU_NORM_TPR, KCU_NORM_V>,
                                   kcu_div_up(n, KCU_NORM_ROWS_NT / KCU_NORM_TPR), KCU_NORM_ROWS_NT, 0, (T *)out,
                                   (const T *)x, w, (long long)n, dim, eps, kcu_pdl_next(c, KCU_PDL_NORM, n)));
    return 0;
  }
  if (vec && dim <= 8 * KCU_NORM_NT * KCU_NORM_V) {
    const int next = kcu_pdl_next(c, KCU_PDL_NORM, n);
    const bool twin = kcu__x8_want(c, n, dim);
    cudaError_t e;
    if (dim <= 8 * KCU_NORM_NT_SMALL * KCU_NORM_V)
      KCU_ACT_DISPATCH(c, e = kcu_rms_norm_vec_launch<T, KCU_NORM_NT_SMALL>(c, twin, (T *)out, (T *)residual,
                                                                            (const T *)x, w, n, dim, eps, next));
    else
      KCU_ACT_DISPATCH(c, e = kcu_rms_norm_vec_launch<T, KCU_NORM_NT>(c, twin, (T *)out, (T *)residual, (const T *)x,
                                                                      w, n, dim, eps, next));
    KCU_CHECK(e);
    if (twin) kcu__x8_made(c, out, n, dim);
    return 0;
  }
  KCU_ACT_DISPATCH(c, KCU_LAUNCH(c, kcu_rms_norm_k<T, KCU_NORM_NT>, n, KCU_NORM_NT, 0, (T *)out, (T *)residual,
                                 (const T *)x, w, dim, eps));
  return 0;
}

/* ---- rope ----------------------------------------------------------------------------- */

template <typename T>
__global__ void kcu_rope_k(T *x, const int32_t *positions, const float *inv_freq, int n_tokens, int n_heads,
                           int head_dim, int row_stride, int n_rot, int neox, float attn_factor) {
  int half = n_rot / 2;
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  const bool live = i < (long long)n_tokens * n_heads * half;
  int p = (int)(i % half), h = (int)((i / half) % n_heads), t = (int)(i / ((long long)half * n_heads));
  float s = 0.f, co = 0.f;
  /* the angle before the PDL wait: positions and inv_freq are written by no kernel */
  if (live) kcu_rope_sincos(positions[t], inv_freq[p], attn_factor, &s, &co);
  kcu_pdl_enter();
  if (!live) return;
  T *xh = x + (size_t)t * row_stride + (size_t)h * head_dim;
  int a = neox ? p : 2 * p, b = neox ? p + half : 2 * p + 1;
  kcu_rope_rotate<T>(kcu_f(xh[a]), kcu_f(xh[b]), s, co, xh + a, xh + b);
}

int kcu__rope(kcu_ctx_t *c, void *x, int n_heads, int head_dim, int row_stride, const kern_rope_t *r) {
  if (r->n_rot <= 0 || r->n_rot % 2 || r->n_rot > head_dim || !r->inv_freq || r->inv_freq->type != KERN_F32 ||
      r->inv_freq->cols < r->n_rot / 2)
    return fr_errorf(FR_EFORMAT, "cuda: rope: bad n_rot %d or inv_freq", r->n_rot);
  long long total = (long long)c->n_tokens * n_heads * (r->n_rot / 2);
  if (total == 0) return 0;
  KCU_ACT_DISPATCH(c, KCU_LAUNCH(c, kcu_rope_k<T>, kcu_div_up(total, KCU_ELEM_NT), KCU_ELEM_NT, 0, (T *)x,
                                 c->dm.positions, (const float *)r->inv_freq->data, c->n_tokens, n_heads, head_dim,
                                 row_stride, r->n_rot, r->mode == KERN_ROPE_NEOX, r->attn_factor));
  return 0;
}

/* ---- KV append / block copy ---------------------------------------------------------------- */

/* One thread per 8 elements of a token's K (and V) row. */
template <typename T>
__global__ void kcu_kv_append_k(T *kc, T *vc, const T *k, int k_stride, const T *v, int v_stride,
                                const int32_t *slots, int n_tokens, int row, long long n_slots, int vec) {
  kcu_pdl_enter();
  int per = row / vec;
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= (long long)n_tokens * per) return;
  int t = (int)(i / per), e = (int)(i % per) * vec;
  int32_t slot = slots[t];
  if (slot < 0 || slot >= n_slots) return;
  size_t d = (size_t)slot * row + e;
  if (vec == 8) {
    *reinterpret_cast<uint4 *>(kc + d) = *reinterpret_cast<const uint4 *>(k + (size_t)t * k_stride + e);
    *reinterpret_cast<uint4 *>(vc + d) = *reinterpret_cast<const uint4 *>(v + (size_t)t * v_stride + e);
  } else {
    kc[d] = k[(size_t)t * k_stride + e];
    vc[d] = v[(size_t)t * v_stride + e];
  }
}

/* A quantized pool: one warp per (token, KV head, K or V) row of head_dim
 * elements: its max |x| (warp reduction), the f16 scale, then the bytes, as
 * kern_kv_quantize_row computes them. Rows are (n_tokens * n_kv * 2) warps
 * of KCU_ELEM_NT / 32 per CTA. */
template <typename T, int Q>
__global__ void kcu_kv_append_q_k(uint8_t *kq, uint8_t *vq, uint16_t *ks, uint16_t *vs, const T *k, int k_stride,
                                  const T *v, int v_stride, const int32_t *slots, int n_tokens, int n_kv, int hd,
                                  long long n_slots) {
  kcu_pdl_enter();
  const long long w = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / KCU_WARP;
  const int lane = threadIdx.x % KCU_WARP;
  if (w >= (long long)n_tokens * n_kv * 2) return; /* whole warps leave together: blockDim is a multiple of 32 */
  const int isv = (int)(w % 2), h = (int)(w / 2 % n_kv), t = (int)(w / 2 / n_kv);
  const int32_t slot = slots[t];
  if (slot < 0 || slot >= n_slots) return;
  const T *x = isv ? v + (size_t)t * v_stride + (size_t)h * hd : k + (size_t)t * k_stride + (size_t)h * hd;
  float amax = 0.f;
  for (int e = lane; e < hd; e += KCU_WARP) amax = fmaxf(amax, fabsf(kcu_f(x[e])));
  amax = kcu_warp_max(amax);
  const float qmax = Q == KCU_KVQ_INT8 ? 127.f : 448.f;
  const __half hs = __float2half_rn(fminf(amax / qmax, 65504.f));
  const float sc = __half2float(hs), inv = sc > 0.f ? 1.f / sc : 0.f;
  uint8_t *dq = (isv ? vq : kq) + ((size_t)slot * n_kv + h) * hd;
  for (int e = lane; e < hd; e += KCU_WARP) dq[e] = kcu_kvq_byte<Q>(kcu_f(x[e]) * inv);
  if (lane == 0) (isv ? vs : ks)[(size_t)slot * n_kv + h] = __half_as_ushort(hs);
}

template <int Q>
static int kcu_kv_append_q(kcu_ctx_t *c, kern_kv_pool_t *pool, int layer, const void *k, int k_stride, const void *v,
                           int v_stride) {
  const kern_kv_config_t *cf = &pool->cfg;
  const long long threads = (long long)c->n_tokens * cf->n_kv_heads * 2 * KCU_WARP;
  uint8_t *kq = (uint8_t *)kern_kv_pool_elems(pool, layer, 0), *vq = (uint8_t *)kern_kv_pool_elems(pool, layer, 1);
  uint16_t *ks = kern_kv_pool_scales(pool, layer, 0), *vs = kern_kv_pool_scales(pool, layer, 1);
  KCU_ACT_DISPATCH(c, KCU_LAUNCH(c, kcu_kv_append_q_k<T, Q>, kcu_div_up(threads, KCU_ELEM_NT), KCU_ELEM_NT, 0, kq, vq,
                                 ks, vs, (const T *)k, k_stride, (const T *)v, v_stride, c->dm.slots, c->n_tokens,
                                 cf->n_kv_heads, cf->head_dim, (long long)cf->n_blocks * cf->block_size));
  return 0;
}

int kcu__kv_append(kcu_ctx_t *c, kern_kv_pool_t *pool, int layer, const void *k, int k_stride, const void *v,
                   int v_stride) {
  const kern_kv_config_t *cf = &pool->cfg;
  if (c->n_tokens == 0) return 0;
  if (cf->dtype == KERN_KV_INT8) return kcu_kv_append_q<KCU_KVQ_INT8>(c, pool, layer, k, k_stride, v, v_stride);
  if (cf->dtype == KERN_KV_FP8) return kcu_kv_append_q<KCU_KVQ_FP8>(c, pool, layer, k, k_stride, v, v_stride);
  int row = cf->n_kv_heads * cf->head_dim;
  int vec = (k_stride % 8 == 0 && v_stride % 8 == 0 && kcu_al16(k) && kcu_al16(v)) ? 8 : 1;
  long long total = (long long)c->n_tokens * (row / vec);
  if (total == 0) return 0;
  char *kb = (char *)pool->base + 2 * (size_t)layer * pool->layer_bytes;
  KCU_ACT_DISPATCH(c, KCU_LAUNCH(c, kcu_kv_append_k<T>, kcu_div_up(total, KCU_ELEM_NT), KCU_ELEM_NT, 0, (T *)kb,
                                 (T *)(kb + pool->layer_bytes), (const T *)k, k_stride, (const T *)v, v_stride,
                                 c->dm.slots, c->n_tokens, row, (long long)cf->n_blocks * cf->block_size, vec));
  return 0;
}

/* One thread per work item of a token, all independent: a q pair to rotate
 * in place; a k pair to rotate, written both in place and to the cache; a
 * k element past n_rot or a v element to copy. The item is blockIdx.x's,
 * the token blockIdx.y's (then every gridDim.y-th): no index division by
 * the items a token, which (64 bits, per item) was most of the kernel's
 * instructions. Rotation as kcu_rope_k; the angle comes from the step's
 * positions and inv_freq, which no kernel writes, so the first token's is
 * computed before the PDL wait. */
template <typename T>
__global__ void kcu_rope_kv_append_k(T *q, int q_stride, T *k, T *v, int kv_stride, T *kc, T *vc,
                                     const int32_t *positions, const int32_t *slots, const float *inv_freq,
                                     int n_tokens, int n_heads, int n_kv, int head_dim, int n_rot, int neox,
                                     float attn_factor, long long n_slots, int next) {
  KCU_TRACE_SCOPE(KCU_TR_ROPE);
  const int half = n_rot / 2, q_items = n_heads * half, k_items = n_kv * half;
  const int tail = head_dim - n_rot, row = n_kv * head_dim;
  const int per = q_items + k_items + n_kv * tail + row;
  const int item = blockIdx.x * blockDim.x + threadIdx.x;
  const bool rot = item < q_items + k_items, is_q = item < q_items;
  const int w = rot && !is_q ? item - q_items : item, p = rot ? w % half : 0;
  auto angle = [&](int t, float *s, float *co) { kcu_rope_sincos(positions[t], inv_freq[p], attn_factor, s, co); };
  float s = 0.f, co = 0.f;
  if (rot && (int)blockIdx.y < n_tokens) angle(blockIdx.y, &s, &co);
  kcu_pdl_wait_launch(next);
  if (item >= per) return;
  for (int t = blockIdx.y; t < n_tokens; t += gridDim.y) {
    if (t != (int)blockIdx.y && rot) angle(t, &s, &co);
    const int32_t slot = slots[t];
    const bool cache = slot >= 0 && slot < n_slots;
    if (rot) {
      const int h = w / half, a = neox ? p : 2 * p, b = neox ? p + half : 2 * p + 1;
      T *xh = is_q ? q + (size_t)t * q_stride + (size_t)h * head_dim : k + (size_t)t * kv_stride + (size_t)h * head_dim;
      T ya, yb;
      kcu_rope_rotate<T>(kcu_f(xh[a]), kcu_f(xh[b]), s, co, &ya, &yb);
      xh[a] = ya;
      xh[b] = yb;
      if (!is_q && cache) {
        kc[(size_t)slot * row + (size_t)h * head_dim + a] = ya;
        kc[(size_t)slot * row + (size_t)h * head_dim + b] = yb;
      }
      continue;
    }
    if (!cache) continue;
    const int e = item - q_items - k_items;
    if (e < n_kv * tail) { /* k past the rotated dims */
      const int ke = (e / tail) * head_dim + n_rot + e % tail;
      kc[(size_t)slot * row + ke] = k[(size_t)t * kv_stride + ke];
      continue;
    }
    vc[(size_t)slot * row + e - n_kv * tail] = v[(size_t)t * kv_stride + e - n_kv * tail];
  }
  kcu_pdl_launch_late(next);
}

int kcu__rope_kv_append(kcu_ctx_t *c, kern_kv_pool_t *pool, int layer, void *q, int q_stride, void *k, void *v,
                        int kv_stride, int n_heads, const kern_rope_t *r) {
  const kern_kv_config_t *cf = &pool->cfg;
  const int hd = cf->head_dim;
  if (r->n_rot <= 0 || r->n_rot % 2 || r->n_rot > hd || !r->inv_freq || r->inv_freq->type != KERN_F32 ||
      r->inv_freq->cols < r->n_rot / 2)
    return fr_errorf(FR_EFORMAT, "cuda: rope_kv_append: bad n_rot %d or inv_freq", r->n_rot);
  if (n_heads <= 0 || q_stride < n_heads * hd || kv_stride < cf->n_kv_heads * hd)
    return fr_errorf(FR_EFORMAT, "cuda: rope_kv_append: strides (%d, %d) too small for %d + %d heads of %d",
                     q_stride, kv_stride, n_heads, cf->n_kv_heads, hd);
  if (c->n_tokens == 0) return 0;
  if (cf->dtype != KERN_KV_AUTO) { /* a quantized pool: rope, rope, then the quantizing append */
    int rc = kcu__rope(c, q, n_heads, hd, q_stride, r);
    if (!rc) rc = kcu__rope(c, k, cf->n_kv_heads, hd, kv_stride, r);
    return rc ? rc : kcu__kv_append(c, pool, layer, k, kv_stride, v, kv_stride);
  }
  char *kb = (char *)pool->base + 2 * (size_t)layer * pool->layer_bytes;
  const int per = n_heads * (r->n_rot / 2) + cf->n_kv_heads * (r->n_rot / 2) + cf->n_kv_heads * (hd - r->n_rot) +
                  cf->n_kv_heads * hd;
  const dim3 grid(kcu_div_up(per, KCU_ELEM_NT), FR_MIN(c->n_tokens, 65535));
  KCU_ACT_DISPATCH(c, KCU_LAUNCH(c, kcu_rope_kv_append_k<T>, grid, KCU_ELEM_NT, 0, (T *)q,
                                 q_stride, (T *)k, (T *)v, kv_stride, (T *)kb, (T *)(kb + pool->layer_bytes),
                                 c->dm.positions, c->dm.slots, (const float *)r->inv_freq->data, c->n_tokens, n_heads,
                                 cf->n_kv_heads, hd, r->n_rot, r->mode == KERN_ROPE_NEOX, r->attn_factor,
                                 (long long)cf->n_blocks * cf->block_size,
                                 kcu_pdl_next(c, KCU_PDL_ROPE, c->n_tokens)));
  return 0;
}

/* grid (n_pairs, 2 * n_layers): copies one block of K or V of one layer. */
__global__ void kcu_kv_copy_k(char *base, size_t layer_bytes, size_t block_bytes, const int32_t *pairs) {
  kcu_pdl_enter();
  const int32_t src = pairs[2 * blockIdx.x], dst = pairs[2 * blockIdx.x + 1];
  char *plane = base + (size_t)blockIdx.y * layer_bytes;
  const uint4 *s = reinterpret_cast<const uint4 *>(plane + (size_t)src * block_bytes);
  uint4 *d = reinterpret_cast<uint4 *>(plane + (size_t)dst * block_bytes);
  for (size_t i = threadIdx.x; i < block_bytes / 16; i += blockDim.x) d[i] = s[i];
}

/* grid (n_pairs, 2 * n_layers): copies one block's scales of K or V of one
 * layer (n f16 values a block). */
__global__ void kcu_kv_copy_scales_k(uint16_t *base, size_t plane_elems, int n, const int32_t *pairs) {
  kcu_pdl_enter();
  const int32_t src = pairs[2 * blockIdx.x], dst = pairs[2 * blockIdx.x + 1];
  uint16_t *plane = base + (size_t)blockIdx.y * plane_elems;
  for (int i = threadIdx.x; i < n; i += blockDim.x) plane[(size_t)dst * n + i] = plane[(size_t)src * n + i];
}

int kcu__kv_copy(kcu_ctx_t *c, kern_kv_pool_t *pool, const int32_t *pairs_dev, int n_pairs) {
  const kern_kv_config_t *cf = &pool->cfg;
  /* elements: head_dim % 8 == 0 (16 when quantized), so a block is whole 16-byte chunks */
  size_t block_bytes = pool->layer_bytes / (size_t)cf->n_blocks;
  KCU_LAUNCH(c, kcu_kv_copy_k, dim3(n_pairs, 2 * cf->n_layers), KCU_ELEM_NT, 0, (char *)pool->base, pool->layer_bytes,
             block_bytes, pairs_dev);
  if (pool->scale_bytes)
    KCU_LAUNCH(c, kcu_kv_copy_scales_k, dim3(n_pairs, 2 * cf->n_layers), KCU_ELEM_NT, 0, kern_kv_pool_scales(pool, 0, 0),
               pool->scale_bytes / 2, cf->block_size * cf->n_kv_heads, pairs_dev);
  return 0;
}

/* ---- silu_mul, add, last_rows, bias ------------------------------------------------------------- */

/* out (n, d) = silu(gate) * up, gate and up rows `stride` apart. A thread
 * takes V elements of a row (V = 8: one 16-byte vector where rows and
 * pointers allow), the row from blockIdx.y: no index division, which (64
 * bits, per element) made the kernel bound by its instructions: 20 us a
 * Llama-3-8B layer at 256 tokens (docs/bench/gpu.md, session 27). */
template <typename T, int V>
__global__ void kcu_silu_mul_k(T *out, const T *gate, const T *up, int n, int d, int stride, int next) {
  KCU_TRACE_SCOPE(KCU_TR_SILU);
  kcu_pdl_wait_launch(next);
  const int j = (blockIdx.x * blockDim.x + threadIdx.x) * V;
  if (j >= d) return;
  for (int r = blockIdx.y; r < n; r += gridDim.y) {
    const size_t in = (size_t)r * stride + j, o = (size_t)r * d + j;
    if constexpr (V == 8) {
      float g[8], u[8];
      kcu_unpack8(*reinterpret_cast<const uint4 *>(gate + in), g, (const T *)nullptr);
      kcu_unpack8(*reinterpret_cast<const uint4 *>(up + in), u, (const T *)nullptr);
#pragma unroll
      for (int e = 0; e < 8; e++) g[e] = kcu_f(kcu_silu_mul1<T>(g[e], u[e]));
      *reinterpret_cast<uint4 *>(out + o) = kcu_pack8<T>(g);
    } else {
      out[o] = kcu_silu_mul1<T>(kcu_f(gate[in]), kcu_f(up[in]));
    }
  }
  kcu_pdl_launch_late(next);
}

template <typename T, int V>
static int kcu_silu_mul_launch(kcu_ctx_t *c, T *out, const T *gate, const T *up, int n, int d, int stride) {
  const dim3 grid(kcu_div_up(d / V, KCU_ELEM_NT), FR_MIN(n, 65535));
  KCU_LAUNCH(c, kcu_silu_mul_k<T, V>, grid, KCU_ELEM_NT, 0, out, gate, up, n, d, stride,
             kcu_pdl_next(c, KCU_PDL_SILU, n));
  return 0;
}

/* silu_mul of row blockIdx.x (d elements) and out's FP8 twin into q8 /
 * q8s (kcu_f8.cu); the grid kcu__x8_rows(n) CTAs, those past n its
 * padding. Two passes over the row: silu_mul as kcu_silu_mul_k makes it,
 * the row's max on the way; then each thread reads back the chunks it
 * wrote (from L2) and quantizes them. Holding the row in registers
 * instead (86 registers, 2 CTAs a SM) took 62 us a Llama-3-8B layer at
 * 2048 tokens against silu_mul's 40 and the quantizer's ~21 (H200,
 * docs/bench/gpu.md, session 56). */
template <typename T, int NT>
__global__ void __launch_bounds__(NT) kcu_silu_mul_twin_k(T *out, const T *gate, const T *up, int n, int d, int stride,
                                                          uint8_t *q8, float *q8s) {
  KCU_TRACE_SCOPE(KCU_TR_SILU);
  __shared__ float red[KCU_MAX_WARPS];
  kcu_pdl_enter();
  const int n8 = d / 8;
  const size_t r = blockIdx.x;
  if ((int)r >= n) {
    kcu_f8_pad_row<NT>(q8, q8s, n8, r);
    return;
  }
  const uint4 *g8 = reinterpret_cast<const uint4 *>(gate + r * stride), *u8 = reinterpret_cast<const uint4 *>(up + r * stride);
  uint4 *o8 = reinterpret_cast<uint4 *>(out + r * d);
  float m = 0.f;
#pragma unroll 2
  for (int j = threadIdx.x; j < n8; j += NT) {
    float g[8], u[8];
    kcu_unpack8(g8[j], g, (const T *)nullptr);
    kcu_unpack8(u8[j], u, (const T *)nullptr);
#pragma unroll
    for (int e = 0; e < 8; e++) {
      g[e] = kcu_f(kcu_silu_mul1<T>(g[e], u[e]));
      m = fmaxf(m, fabsf(g[e]));
    }
    o8[j] = kcu_pack8<T>(g);
  }
  m = kcu_block_max<NT>(m, red);
  const float inv = m > 0.f ? 448.f / m : 0.f;
  if (threadIdx.x == 0) q8s[r] = m / 448.f;
  uint2 *q = reinterpret_cast<uint2 *>(q8 + r * (size_t)d);
  for (int j = threadIdx.x; j < n8; j += NT) {
    float f[8];
    kcu_unpack8(o8[j], f, (const T *)nullptr);
    q[j] = kcu_f8_pack8(f, inv);
  }
}

int kcu__silu_mul(kcu_ctx_t *c, void *out, const void *gate, const void *up, int n, int d, int stride) {
  if (n <= 0 || d <= 0) return 0;
  const bool vec = d % 8 == 0 && stride % 8 == 0 && kcu_al16(out) && kcu_al16(gate) && kcu_al16(up);
  if (vec && kcu__x8_want(c, n, d)) {
    KCU_ACT_DISPATCH(c, KCU_LAUNCH(c, kcu_silu_mul_twin_k<T, KCU_ELEM_NT>, kcu__x8_rows(n), KCU_ELEM_NT, 0, (T *)out,
                                   (const T *)gate, (const T *)up, n, d, stride, c->x8, c->x8s));
    kcu__x8_made(c, out, n, d);
    return 0;
  }
  int rc = 0;
  KCU_ACT_DISPATCH(c, rc = vec ? kcu_silu_mul_launch<T, 8>(c, (T *)out, (const T *)gate, (const T *)up, n, d, stride)
                               : kcu_silu_mul_launch<T, 1>(c, (T *)out, (const T *)gate, (const T *)up, n, d, stride));
  return rc;
}

template <typename T> __global__ void kcu_add_k(T *out, const T *a, const T *b, size_t n) {
  kcu_pdl_enter();
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    out[i] = kcu_t<T>(kcu_f(a[i]) + kcu_f(b[i]));
}

int kcu__add(kcu_ctx_t *c, void *out, const void *a, const void *b, size_t n) {
  if (n == 0) return 0;
  int grid = (int)FR_MIN((n + KCU_ELEM_NT - 1) / KCU_ELEM_NT, (size_t)c->n_sm * KCU_GRID_PER_SM);
  KCU_ACT_DISPATCH(c, KCU_LAUNCH(c, kcu_add_k<T>, grid, KCU_ELEM_NT, 0, (T *)out, (const T *)a, (const T *)b, n));
  return 0;
}

template <typename T> __global__ void kcu_last_rows_k(T *out, const T *x, const int32_t *q_start, int dim) {
  kcu_pdl_enter();
  int s = blockIdx.y;
  int r = max(q_start[s + 1] - 1, 0);
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < dim; i += gridDim.x * blockDim.x)
    out[(size_t)s * dim + i] = x[(size_t)r * dim + i];
}

int kcu__last_rows(kcu_ctx_t *c, void *out, const void *x, int dim) {
  if (c->n_seqs == 0 || dim <= 0) return 0;
  if (c->n_seqs > 65535) return fr_errorf(FR_EUNSUPPORTED, "cuda: last_rows of %d sequences", c->n_seqs);
  dim3 grid(kcu_div_up(dim, KCU_ELEM_NT), c->n_seqs);
  KCU_ACT_DISPATCH(c,
                   KCU_LAUNCH(c, kcu_last_rows_k<T>, grid, KCU_ELEM_NT, 0, (T *)out, (const T *)x, c->dm.q_start, dim));
  return 0;
}

/* One thread per (sequence, column): its rows' mean (summed in f32) or first row; zeros without rows. */
template <typename T> __global__ void kcu_pool_rows_k(T *out, const T *x, const int32_t *q_start, int dim, int mean) {
  kcu_pdl_enter();
  int s = blockIdx.y, a = q_start[s], n = q_start[s + 1] - a;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < dim; i += gridDim.x * blockDim.x) {
    float v = 0.0f;
    if (n > 0 && !mean) v = kcu_f(x[(size_t)a * dim + i]);
    for (int r = 0; mean && r < n; r++) v += kcu_f(x[(size_t)(a + r) * dim + i]);
    out[(size_t)s * dim + i] = kcu_t<T>(mean && n > 0 ? v / (float)n : v);
  }
}

int kcu__pool_rows(kcu_ctx_t *c, void *out, const void *x, int dim, kern_pool_t mode) {
  if (c->n_seqs == 0 || dim <= 0) return 0;
  if (c->n_seqs > 65535) return fr_errorf(FR_EUNSUPPORTED, "cuda: pool_rows of %d sequences", c->n_seqs);
  if (mode != KERN_POOL_MEAN && mode != KERN_POOL_FIRST) return fr_errorf(FR_EUNSUPPORTED, "cuda: pool_rows mode %d", (int)mode);
  dim3 grid(kcu_div_up(dim, KCU_ELEM_NT), c->n_seqs);
  KCU_ACT_DISPATCH(c, KCU_LAUNCH(c, kcu_pool_rows_k<T>, grid, KCU_ELEM_NT, 0, (T *)out, (const T *)x, c->dm.q_start,
                                 dim, mode == KERN_POOL_MEAN ? 1 : 0));
  return 0;
}

template <typename T> __global__ void kcu_add_bias_k(T *out, const float *bias, int n, int rows) {
  kcu_pdl_enter();
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < (long long)n * rows) out[i] = kcu_t<T>(kcu_f(out[i]) + bias[i % rows]);
}

int kcu__add_bias(kcu_ctx_t *c, void *out, const float *bias, int n, int rows) {
  long long total = (long long)n * rows;
  if (total == 0) return 0;
  KCU_ACT_DISPATCH(
      c, KCU_LAUNCH(c, kcu_add_bias_k<T>, kcu_div_up(total, KCU_ELEM_NT), KCU_ELEM_NT, 0, (T *)out, bias, n, rows));
  return 0;
}
