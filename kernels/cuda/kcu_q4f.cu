/* kcu_q4f.cu - 4-bit weights repacked for the tensor cores (KERN_Q4F):
 * the layout, the repacking at load, the matmul that reads it on mma.sync,
 * and its dequantization for the large-batch cuBLAS path.
 *
 * Which weights: Q4_0, Q4_1, Q4_K and I4G (GPTQ/AWQ) are all 4-bit
 * integers q with a (d, m) per 32 columns, w = d * q + m (Q4_0: m = -8 d;
 * Q4_K: d = super d * 6-bit scale, m = -dmin * 6-bit min). A matmul-only
 * weight (kern_weight_t.keep_layout false) of one of these types is
 * stored on the device as KERN_Q4F:
 *
 *   rows in tiles of 16 (the last one padded with zeros), columns in units
 *   of 64 (a last unit of 32 columns padded with zeros too). Per (tile,
 *   unit) 512 bytes of nibbles, lane L of a warp owning the tile reading
 *   bytes [16 L, 16 L + 16): the 16 x 64 weights as this lane's A
 *   fragments of four m16n8k16 MMAs. Then, after all nibbles, per (tile,
 *   unit) 128 bytes of (d, m) pairs in the activation type, 16 bytes per
 *   g = L / 4: rows g and g + 8 of the unit's two 32-column blocks.
 *
 * 640 bytes per 1024 weights: 5 bits a weight (I4G is 6, Q4_K 4.5).
 *
 * The matmul: up to 16 rows (and 17-64 before sm_90) kcu_q4f_mma_k, a
 * CTA per 16-row tile; from 17 rows on sm_90 kcu_q4f_wide_k, a CTA per
 * 128 rows with the activations staged in shared memory, its units split
 * over a cluster's CTAs where the rows are few.
 *
 * The fragment order. With g = L / 4, t = L % 4, word 2 b + s of the lane
 * (block b of the unit, k-step s) holds 8 nibbles: slot p (0..3) the
 * weight at row g + 8 (p & 1), column 32 b + 8 t + 4 s + 2 (p >> 1), and
 * slot p + 4 the one at the next column. Slots p and p + 4 are bits 4p and
 * 16 + 4p, so one mask turns them into the pair of register a[p]. The MMA
 * sums over k in any order as long as A and B agree: here the lane's four
 * k of a step are its columns 8 t + 4 s .. + 3, so its B fragments of a
 * whole block are 8 consecutive activations, one 16-byte load.
 *
 * Dequantizing in registers: (mask | 0x4300) is bf16 128 + q (f16: 0x6400,
 * 1024 + q), exact; subtracting 128 leaves q exactly, and one fma2 with
 * (d, d), (m, m) gives the pair. d and m are rounded to the activation
 * type at repacking (bf16: 8 bits of mantissa, the precision of a bf16
 * weight).
 *
 * Threads: the backend's stream. */
#include <cooperative_groups.h>

#include "kernels/cuda/kcu.cuh"
#include "kernels/cuda/kcu_mma.cuh"
#include "kernels/cuda/kcu_quant.cuh"

namespace cg = cooperative_groups;

#define KCU_Q4F_ROWS 16
#define KCU_Q4F_COLS 64
#define KCU_Q4F_NIB 512 /* nibble bytes per (tile, unit) */
#define KCU_Q4F_DM 128  /* (d, m) bytes per (tile, unit) */
#define KCU_Q4F_TOK 64  /* tokens per CTA: 8 MMA columns of 8 */

/* Row tiles and column units of a (rows, cols) weight. */
__host__ __device__ __forceinline__ int kcu_q4f_tiles(long long rows) {
  return (int)((rows + KCU_Q4F_ROWS - 1) / KCU_Q4F_ROWS);
}
__host__ __device__ __forceinline__ int kcu_q4f_units(long long cols) {
  return (int)((cols + KCU_Q4F_COLS - 1) / KCU_Q4F_COLS);
}

bool kcu__q4f_takes(const kern_weight_t *w) {
  switch (w->type) {
  case KERN_Q4_0: case KERN_Q4_1: case KERN_Q4_K: case KERN_I4G:
    return !w->keep_layout && w->rows > 1 && w->cols % 32 == 0;
  default:
    return false;
  }
}

size_t kcu__q4f_bytes(int64_t rows, int64_t cols) {
  return (size_t)kcu_q4f_tiles(rows) * (size_t)kcu_q4f_units(cols) * (KCU_Q4F_NIB + KCU_Q4F_DM);
}

/* A KERN_Q4F weight's two arrays in its device memory `data`: all the
 * nibbles, then all the (d, m) pairs. */
typedef struct {
  uint4 *nib, *dm;
  int tiles, units;
} kcu_q4f_view_t;

static kcu_q4f_view_t kcu_q4f_view(const kern_weight_t *w, void *data) {
  kcu_q4f_view_t v;
  v.tiles = kcu_q4f_tiles(w->rows), v.units = kcu_q4f_units(w->cols);
  v.nib = (uint4 *)data;
  v.dm = (uint4 *)((char *)data + (size_t)v.tiles * v.units * KCU_Q4F_NIB);
  return v;
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

/* One thread per (tile, unit, lane): its 16 bytes of nibbles and, for
 * t = 0, its row pair's 16 bytes of (d, m). Padding rows, and the second
 * block of a last unit past cols, are zero. */
template <typename T, int QT>
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
  if (t) return;
  uint32_t dm[4];
#pragma unroll
  for (int j = 0; j < 4; j++) { /* (row g, blk 0), (row g + 8, blk 0), (row g, blk 1), (row g + 8, blk 1) */
    int row = tile * KCU_Q4F_ROWS + g + 8 * (j & 1), blk = 2 * u + (j >> 1);
    float2 f = row < rows && 32 * blk < cols ? kcu_q4src<QT>::dm(W + (size_t)row * row_bytes, blk)
                                             : make_float2(0.f, 0.f);
    dm[j] = kcu_bits(kcu_t<T>(f.x)) | kcu_bits(kcu_t<T>(f.y)) << 16;
  }
  dmv[tu * 8 + g] = make_uint4(dm[0], dm[1], dm[2], dm[3]);
}

int kcu__q4f_repack(kcu_ctx_t *c, void *dst, const kern_weight_t *w, const void *src) {
  const kcu_q4f_view_t v = kcu_q4f_view(w, dst);
  const long long n = (long long)v.tiles * v.units * KCU_WARP;
  const uint8_t *W = (const uint8_t *)src;
#define KCU_Q4F_REPACK(QT)                                                                                          \
  KCU_ACT_DISPATCH(c, KCU_LAUNCH(c, kcu_q4f_repack_k<T, QT>, kcu_div_up(n, 256), 256, 0, v.nib, v.dm, W, w->row_bytes, \
                                 (int)w->rows, (int)w->cols, v.units, n))
  switch (w->type) {
  case KERN_Q4_0: KCU_Q4F_REPACK(KERN_Q4_0); break;
  case KERN_Q4_1: KCU_Q4F_REPACK(KERN_Q4_1); break;
  case KERN_Q4_K: KCU_Q4F_REPACK(KERN_Q4_K); break;
  case KERN_I4G: KCU_Q4F_REPACK(KERN_I4G); break;
  default: return fr_errorf(FR_EUNSUPPORTED, "cuda: no 4-bit repacking of type %d", (int)w->type);
  }
#undef KCU_Q4F_REPACK
  return 0;
}

/* ---- in registers: nibbles to A fragments ------------------------------------------- */

template <typename T> struct kcu_q4v;
template <> struct kcu_q4v<__nv_bfloat16> {
  typedef __nv_bfloat162 T2;
  static constexpr uint32_t MAGIC = 0x43004300u; /* 128, 128 */
};
template <> struct kcu_q4v<__half> {
  typedef __half2 T2;
  static constexpr uint32_t MAGIC = 0x64006400u; /* 1024, 1024 */
};

template <typename T2> __device__ __forceinline__ T2 kcu_as2(uint32_t v) { return *reinterpret_cast<T2 *>(&v); }
template <typename T2> __device__ __forceinline__ uint32_t kcu_from2(T2 v) { return *reinterpret_cast<uint32_t *>(&v); }

/* (a & b) | c in one LOP3: with two of the operands constants, the
 * compiler otherwise emits an AND and an OR (a LOP3 takes one immediate
 * operand). 16 of a unit's ~128 instructions at one MMA column; measured
 * in docs/bench/gpu.md (session 14). */
__device__ __forceinline__ uint32_t kcu_and_or(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}

/* The four A registers of one k-step from its nibble word; dm_g, dm_g8:
 * the (d, m) of rows g and g + 8 for this block. */
template <typename T>
__device__ __forceinline__ void kcu_q4f_frag(uint32_t word, uint32_t dm_g, uint32_t dm_g8, uint32_t *a) {
  typedef typename kcu_q4v<T>::T2 T2;
  const T2 base = kcu_as2<T2>(kcu_q4v<T>::MAGIC);
  /* (d, d) and (m, m): one byte permute each */
  const T2 dg = kcu_as2<T2>(__byte_perm(dm_g, 0, 0x1010)), mg = kcu_as2<T2>(__byte_perm(dm_g, 0, 0x3232));
  const T2 dg8 = kcu_as2<T2>(__byte_perm(dm_g8, 0, 0x1010)), mg8 = kcu_as2<T2>(__byte_perm(dm_g8, 0, 0x3232));
#pragma unroll
  for (int p = 0; p < 4; p++) {
    const uint32_t v = kcu_and_or(word >> (4 * p), 0x000f000fu, kcu_q4v<T>::MAGIC);
    T2 q = __hsub2(kcu_as2<T2>(v), base);
    a[p] = kcu_from2<T2>(p & 1 ? __hfma2(q, dg8, mg8) : __hfma2(q, dg, mg));
  }
}

/* ---- the matmul ------------------------------------------------------------------- */

/* What a warp reads for U units: per unit its nibbles, its (d, m) and,
 * per 32-column block and MMA column tile, the lane's 8 activations. */
template <int NT, int U> struct kcu_q4f_stage {
  uint4 q[U], d[U], x[U][2][NT];
};

/* The weights of units u0, u0 + WK, ... (np, dp: the warp's tile at this
 * lane). */
template <int NT, int U, int WK>
__device__ __forceinline__ void kcu_q4f_load_w(kcu_q4f_stage<NT, U> &st, const uint4 *np, const uint4 *dp, int u0,
                                               int units) {
#pragma unroll
  for (int h = 0; h < U; h++) {
    const int u = u0 + h * WK;
    if (u >= units) break;
    st.q[h] = __ldg(np + (size_t)u * KCU_WARP);
    st.d[h] = __ldg(dp + (size_t)u * 8);
  }
}

/* Their activations (xr: the lane's activation rows, NULL past n). */
template <typename T, int NT, int U, int WK>
__device__ __forceinline__ void kcu_q4f_load_x(kcu_q4f_stage<NT, U> &st, const T *const *xr, int u0, int units,
                                               int cols) {
#pragma unroll
  for (int h = 0; h < U; h++) {
    const int u = u0 + h * WK;
    if (u >= units) break;
#pragma unroll
    for (int b = 0; b < 2; b++) {
      const int c = u * KCU_Q4F_COLS + 32 * b;
#pragma unroll
      for (int j = 0; j < NT; j++)
        st.x[h][b][j] = xr[j] && c < cols ? __ldg(reinterpret_cast<const uint4 *>(xr[j] + c)) : make_uint4(0, 0, 0, 0);
    }
  }
}

template <typename T, int NT, int U, int WK>
__device__ __forceinline__ void kcu_q4f_load(kcu_q4f_stage<NT, U> &st, const uint4 *np, const uint4 *dp,
                                             const T *const *xr, int u0, int units, int cols) {
  kcu_q4f_load_w<NT, U, WK>(st, np, dp, u0, units);
  kcu_q4f_load_x<T, NT, U, WK>(st, xr, u0, units, cols);
}

/* A warp's results for its row tile: acc[j] holds (row g, tokens 2t,
 * 2t + 1), (row g + 8, the same) of MMA column tile j, tokens from tok0. */
template <typename T, int NT>
__device__ __forceinline__ void kcu_q4f_store(const float (&acc)[NT][4], T *out, const float *bias, int tile, int tok0,
                                              int rows, int n) {
  const int lane = threadIdx.x % KCU_WARP, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int e = 0; e < 4; e++) {
    const int row = tile * KCU_Q4F_ROWS + g + 8 * (e >> 1);
    if (row >= rows) continue;
    const float bv = bias ? bias[row] : 0.f;
#pragma unroll
    for (int j = 0; j < NT; j++) {
      const int tok = tok0 + 8 * j + 2 * t + (e & 1);
      if (tok < n) out[(size_t)tok * rows + row] = kcu_t<T>(acc[j][e] + bv);
    }
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
template <typename T, int NT, int WK>
__global__ void __launch_bounds__(WK *KCU_WARP)
    kcu_q4f_mma_k(T *out, const uint4 *nib, const uint4 *dmv, const T *x, const float *bias, int rows, int cols,
                  int n) {
  constexpr int U = NT == 1 ? 4 : NT <= 2 ? 2 : 1, DB = NT <= 4, PF = NT <= 2;
  __shared__ float red[WK > 1 ? (WK - 1) * KCU_WARP * NT * 4 : 1];
  const int wk = threadIdx.x / KCU_WARP, lane = threadIdx.x % KCU_WARP, g = lane / 4, t = lane % 4;
  const int tile = blockIdx.y, tok0 = blockIdx.x * 8 * NT;
  const int tiles = kcu_q4f_tiles(rows), units = kcu_q4f_units(cols);
  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  if (!PF) kcu_pdl_enter();
  const T *xr[NT]; /* this lane's token row of each MMA column tile, or NULL */
#pragma unroll
  for (int j = 0; j < NT; j++) {
    int tok = tok0 + 8 * j + g;
    xr[j] = tok < n ? x + (size_t)tok * cols + 8 * t : NULL;
  }
  /* up to 16 rows, the first batch's weights before the PDL wait (no
   * kernel writes them); at 64 rows that measured 2% slower */
  const uint4 *np = nib + (size_t)tile * units * KCU_WARP + lane, *dp = dmv + (size_t)tile * units * 8 + g;
  kcu_q4f_stage<NT, U> cur;
  if (PF) {
    kcu_pdl_launch_next();
    if (tile < tiles) kcu_q4f_load_w<NT, U, WK>(cur, np, dp, wk, units);
    kcu_pdl_wait();
  }
  if (tile < tiles) {
    if (PF) kcu_q4f_load_x<T, NT, U, WK>(cur, xr, wk, units, cols);
    else kcu_q4f_load<T, NT, U, WK>(cur, np, dp, xr, wk, units, cols);
    for (int u0 = wk; u0 < units; u0 += U * WK) {
      kcu_q4f_stage<NT, U> nxt;
      if (DB) kcu_q4f_load<T, NT, U, WK>(nxt, np, dp, xr, u0 + U * WK, units, cols);
#pragma unroll
      for (int h = 0; h < U; h++) {
        if (u0 + h * WK >= units) break;
        const uint32_t qw[4] = {cur.q[h].x, cur.q[h].y, cur.q[h].z, cur.q[h].w};
#pragma unroll
        for (int b = 0; b < 2; b++) { /* a missing last block has zero weights and activations */
          const uint32_t dg = b ? cur.d[h].z : cur.d[h].x, dg8 = b ? cur.d[h].w : cur.d[h].y;
#pragma unroll
          for (int s = 0; s < 2; s++) {
            uint32_t a[4];
            kcu_q4f_frag<T>(qw[2 * b + s], dg, dg8, a);
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
      else if (u0 + U * WK < units) kcu_q4f_load<T, NT, U, WK>(cur, np, dp, xr, u0 + U * WK, units, cols);
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

__device__ __forceinline__ int kcu_q4f_xoff(int r, int c) { return r * 8 + (c ^ ((r & 1) << 2)); }

template <typename T, int WK>
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
  const uint4 *dp = dmv + (size_t)(live ? tile : 0) * units * 8 + g;
  float acc[8][4];
#pragma unroll
  for (int j = 0; j < 8; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  uint4 qa = {}, da = {}, qb = {}, db = {}, qc = {}, dc = {};
  auto load_w = [&](int k, uint4 &q, uint4 &d) {
    const int u = k * WK + wk;
    if (live && u < units) q = __ldg(np + (size_t)u * KCU_WARP), d = __ldg(dp + (size_t)u * 8);
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
 * bits do not depend on which CTA finishes first. */
#define KCU_Q4W_WARPS 4
#define KCU_Q4W_TW 2
#define KCU_Q4W_TILES (KCU_Q4W_WARPS * KCU_Q4W_TW)
#define KCU_Q4W_MIN_UNITS 8 /* fewest units a split */
#define KCU_Q4W_MAX_SPLITS 8 /* a cluster of them: the portable most */
#define KCU_Q4W_FILL 2       /* CTAs a SM the splits aim at */
#define KCU_Q4W_RS (KCU_Q4W_TILES * KCU_Q4F_ROWS + 4) /* floats a token row of the split sums (no bank conflicts) */

/* A stage, in uint4: activations (SU units x 8 NT tokens x 8), then
 * nibbles (tiles x SU x 32 lanes), then (d, m) (tiles x SU x 8). */
template <int NT, int SU, int S> struct kcu_q4w_smem {
  static constexpr int X = SU * NT * 8 * 8, Q = KCU_Q4W_TILES * SU * KCU_WARP, D = KCU_Q4W_TILES * SU * 8,
                       STAGE = X + Q + D;
  static constexpr size_t BYTES = (size_t)S * STAGE * sizeof(uint4);
};

template <typename T, int NT, int SU, int S>
__global__ void __launch_bounds__(KCU_Q4W_WARPS *KCU_WARP)
    kcu_q4f_wide_k(T *out, const uint4 *nib, const uint4 *dmv, const T *x, const float *bias, int rows, int cols,
                   int n) {
  typedef kcu_q4w_smem<NT, SU, S> L;
  constexpr int TW = KCU_Q4W_TW, NTH = KCU_Q4W_WARPS * KCU_WARP, TOK = 8 * NT;
  extern __shared__ uint4 kcu_q4w_sm[];
  const int wr = threadIdx.x / KCU_WARP, lane = threadIdx.x % KCU_WARP, g = lane / 4, t = lane % 4;
  const int tok0 = blockIdx.x * TOK, tile0 = blockIdx.y * KCU_Q4W_TILES, ks = gridDim.z;
  const int tiles = kcu_q4f_tiles(rows), units = kcu_q4f_units(cols);
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
   * bytes tid % 8. Missing tiles, units and tokens are zeros. */
  constexpr int XT = NTH / 8, XR = TOK / XT, XI = SU * XR, WQ = NTH / KCU_WARP, QI = L::Q / NTH;
  static_assert(L::X == XI * NTH && L::Q == QI * NTH && L::D <= NTH && WQ % SU == 0, "whole rounds of copies");
  const int tid = threadIdx.x, xc = tid % 8, xr = tid / 8;
  const uint32_t sm0 = (uint32_t)__cvta_generic_to_shared(kcu_q4w_sm);
  const int x_off = (tok0 + xr) * cols + u_lo * KCU_Q4F_COLS + 8 * xc, x_row = XT * cols;
  const int q_tile = tile0 + wr / SU, q_off = ((q_tile * units) + u_lo + wr % SU) * KCU_WARP + lane;
  const int d_tile = tile0 + xr / SU, d_off = ((d_tile * units) + u_lo + xr % SU) * 8 + xc;
  auto load_w = [&](int k) {
    const uint32_t st = sm0 + (uint32_t)((k % S) * L::STAGE + L::X) * 16;
    const bool u_ok = u_lo + k * SU + wr % SU < u_hi;
#pragma unroll
    for (int it = 0; it < QI; it++) {
      const bool ok = u_ok && q_tile + it * (WQ / SU) < tiles;
      const int off = q_off + (it * (WQ / SU) * units + k * SU) * KCU_WARP;
      kcu_cp_async16(st + (it * NTH + tid) * 16, nib + (ok ? off : 0), ok);
    }
    const bool ok = d_tile < tiles && u_lo + k * SU + xr % SU < u_hi;
    if (L::D == NTH || tid < L::D) kcu_cp_async16(st + (L::Q + tid) * 16, dmv + (ok ? d_off + k * SU * 8 : 0), ok);
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
        d[e] = sd[(tl * SU + h) * 8 + g];
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
            kcu_q4f_frag<T>(qw[2 * b + s], b ? d[e].z : d[e].x, b ? d[e].w : d[e].y, a[e]);
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
#pragma unroll
    for (int e = 0; e < TW; e++)
      if (tile0 + wr * TW + e < tiles) kcu_q4f_store<T, NT>(acc[e], out, bias, tile0 + wr * TW + e, tok0, rows, n);
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
  const int row = tile0 * KCU_Q4F_ROWS + threadIdx.x, z = (int)cl.block_rank();
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
  cl.sync(); /* no CTA leaves while another reads its sums */
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

template <typename T, int NT, int WK>
static int kcu_q4f_launch_wk(kcu_ctx_t *c, T *out, const kern_weight_t *w, const float *bias, const T *x, int n) {
  const kcu_q4f_view_t v = kcu_q4f_view(w, w->data);
  if (v.tiles > 65535) /* the grid's y */
    return fr_errorf(FR_EUNSUPPORTED, "cuda: Q4F matmul of %lld rows, past 1048560", (long long)w->rows);
  KCU_LAUNCH(c, (kcu_q4f_mma_k<T, NT, WK>), dim3(kcu_div_up(n, 8 * NT), v.tiles), WK * KCU_WARP, 0, out,
             (const uint4 *)v.nib, (const uint4 *)v.dm, x, bias, (int)w->rows, (int)w->cols, n);
  return 0;
}

/* Warps per tile: c->q4f_warps, else measured on H200 (Llama-3-8B shapes,
 * I4G; docs/bench/gpu.md): 4 at n = 1 and n > 16, 8 at 9..16. */
template <typename T, int NT>
static int kcu_q4f_launch(kcu_ctx_t *c, T *out, const kern_weight_t *w, const float *bias, const T *x, int n) {
  if ((c->q4f_warps ? c->q4f_warps : NT == 2 ? 8 : 4) == 8) return kcu_q4f_launch_wk<T, NT, 8>(c, out, w, bias, x, n);
  return kcu_q4f_launch_wk<T, NT, 4>(c, out, w, bias, x, n);
}

/* More than 64 rows: kcu_q4f_gemm_k, its columns split in two where the
 * tiles alone would not give every SM a CTA. */
template <typename T>
static int kcu_q4f_gemm(kcu_ctx_t *c, T *out, const kern_weight_t *w, const float *bias, const T *x, int n) {
  const kcu_q4f_view_t v = kcu_q4f_view(w, w->data);
  const dim3 grid(kcu_div_up(v.tiles, KCU_Q4F_GT), kcu_div_up(n, KCU_Q4F_TOK));
  if ((long long)grid.x * grid.y >= c->n_sm)
    KCU_LAUNCH(c, (kcu_q4f_gemm_k<T, 1>), grid, KCU_Q4F_GT * KCU_WARP, 0, out, (const uint4 *)v.nib,
               (const uint4 *)v.dm, x, bias, (int)w->rows, (int)w->cols, n);
  else
    KCU_LAUNCH(c, (kcu_q4f_gemm_k<T, 2>), grid, 2 * KCU_Q4F_GT * KCU_WARP, 0, out, (const uint4 *)v.nib,
               (const uint4 *)v.dm, x, bias, (int)w->rows, (int)w->cols, n);
  return 0;
}

/* Splits of a kcu_q4f_wide_k call's units: c->q4f_ks, else enough CTAs for
 * KCU_Q4W_FILL a SM, each split at least KCU_Q4W_MIN_UNITS units.
 * (Measured on H200, docs/bench/gpu.md, session 24: aiming at 2 CTAs a SM
 * beats 1 and the 3 the 64-token kernel holds, and counting whole waves
 * with clusters of up to 16 splits was slower.) */
static int kcu_q4w_splits(const kcu_ctx_t *c, int tiles, int units, int n) {
  if (c->q4f_ks) return FR_MIN(c->q4f_ks, KCU_Q4W_MAX_SPLITS);
  const long long ctas = (long long)kcu_div_up(tiles, KCU_Q4W_TILES) * kcu_div_up(n, n <= 32 ? 32 : 64);
  const long long ks = kcu_div_up((long long)KCU_Q4W_FILL * c->n_sm, ctas);
  return (int)FR_MAX(FR_MIN(ks, (long long)FR_MIN(units / KCU_Q4W_MIN_UNITS, KCU_Q4W_MAX_SPLITS)), 1ll);
}

template <typename T, int NT, int SU, int S>
static int kcu_q4w_launch(kcu_ctx_t *c, T *out, const kern_weight_t *w, const float *bias, const T *x, int n) {
  const kcu_q4f_view_t v = kcu_q4f_view(w, w->data);
  const int ks = kcu_q4w_splits(c, v.tiles, v.units, n);
  const dim3 grid(kcu_div_up(n, 8 * NT), kcu_div_up(v.tiles, KCU_Q4W_TILES), ks);
  if (grid.y > 65535) return fr_errorf(FR_EUNSUPPORTED, "cuda: Q4F matmul of %lld rows", (long long)w->rows);
  KCU_CHECK(kcu_launch_cluster(c, kcu_q4f_wide_k<T, NT, SU, S>, grid, dim3(1, 1, ks), KCU_Q4W_WARPS * KCU_WARP,
                               kcu_q4w_smem<NT, SU, S>::BYTES, out, (const uint4 *)v.nib, (const uint4 *)v.dm, x,
                               bias, (int)w->rows, (int)w->cols, n));
  return 0;
}

/* Up to 32 tokens a CTA, 2 units a stage in 4 stages; up to 64, 1 unit a
 * stage in 5, which lets 3 CTAs share a SM (measured on H200, Llama-3-8B
 * shapes: docs/bench/gpu.md, session 24). */
#define KCU_Q4W_32 4, 2, 4
#define KCU_Q4W_64 8, 1, 5

template <typename T>
static int kcu_q4w_matmul(kcu_ctx_t *c, T *out, const kern_weight_t *w, const float *bias, const T *x, int n) {
  return n <= 32 ? kcu_q4w_launch<T, KCU_Q4W_32>(c, out, w, bias, x, n)
                 : kcu_q4w_launch<T, KCU_Q4W_64>(c, out, w, bias, x, n);
}

/* A wide kernel's shared memory past 48 KB (at create: a first launch may
 * be inside a capture). */
template <typename T, int NT, int SU, int S> static int kcu_q4w_attr(void) {
  KCU_CHECK(cudaFuncSetAttribute(kcu_q4f_wide_k<T, NT, SU, S>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)kcu_q4w_smem<NT, SU, S>::BYTES));
  return 0;
}

int kcu__q4f_init(kcu_ctx_t *c) {
  int major = 0;
  KCU_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c->device));
  if (major < 9 || kcu_q4w_smem<KCU_Q4W_64>::BYTES > c->smem_optin || kcu_q4w_smem<KCU_Q4W_32>::BYTES > c->smem_optin) {
    c->q4f_wide = 1 << 30; /* clusters are sm_90's */
    return 0;
  }
  int rc = 0;
  KCU_ACT_DISPATCH(c, {
    rc = kcu_q4w_attr<T, KCU_Q4W_32>();
    if (!rc) rc = kcu_q4w_attr<T, KCU_Q4W_64>();
  });
  return rc;
}

template <typename T>
static int kcu_q4f_matmul_t(kcu_ctx_t *c, T *out, const kern_weight_t *w, const float *bias, const T *x, int n) {
  const int32_t *perm = (const int32_t *)w->priv;
  if (w->perm) {
    long long total = (long long)n * w->cols;
    if ((size_t)total > c->deq_elems) return fr_errorf(FR_ESTATE, "cuda: matmul: permuted-input scratch too small");
    KCU_LAUNCH(c, kcu_q4f_gather_k<T>, kcu_div_up(total, KCU_ELEM_NT), KCU_ELEM_NT, 0, (T *)c->deq, x, perm,
               (int)w->cols, (int)kern_weight_x_cols(w), total);
    x = (const T *)c->deq;
  }
  /* From c->q4f_wide rows (17; sm_90 only) the wide kernel; below, and
   * where it does not run, the per-tile kernel, past 64 rows the GEMM form */
  if (n >= c->q4f_wide) return kcu_q4w_matmul<T>(c, out, w, bias, x, n);
  if (n > KCU_Q4F_TOK && c->q4f_gemm) return kcu_q4f_gemm(c, out, w, bias, x, n);
  /* MMA columns a CTA: past c->q4f_nt (4: 32 tokens), more CTAs of it
   * rather than one of 64 tokens (measured on H200, docs/bench/gpu.md: at
   * 33-64 rows the 64-token CTA's 149 registers allow 3 CTAs a SM, and the
   * o and down projections' 256 tiles fill two thirds of one wave) */
  const int nt = FR_MIN(n >= KCU_Q4F_TOK ? 8 : kcu_div_up(n, 8), c->q4f_nt);
  switch (nt) {
  case 1: return kcu_q4f_launch<T, 1>(c, out, w, bias, x, n);
  case 2: return kcu_q4f_launch<T, 2>(c, out, w, bias, x, n);
  case 3: case 4: return kcu_q4f_launch<T, 4>(c, out, w, bias, x, n);
  default: return kcu_q4f_launch<T, 8>(c, out, w, bias, x, n);
  }
}

int kcu__q4f_matmul(kcu_ctx_t *c, void *out, const kern_weight_t *w, const float *bias, const void *x, int n) {
  int rc = 0;
  KCU_ACT_DISPATCH(c, rc = kcu_q4f_matmul_t<T>(c, (T *)out, w, bias, (const T *)x, n));
  return rc;
}

/* ---- dequantization (the cuBLAS path for large batches) ----------------------------- */

/* One thread per (tile, unit, lane) of the tiles that rows [row0, row1)
 * touch: the lane's rows g and g + 8, 8 columns of each block, of those
 * rows into dst ((row1 - row0), x_cols), in the input's order where the
 * weight is permuted (padding columns dropped; every input column is some
 * column's perm, model_quant_cols). */
template <typename T>
__global__ void kcu_q4f_dequant_k(T *dst, const uint4 *nib, const uint4 *dmv, int cols, int row0, int row1,
                                  long long total, const int32_t *perm, int x_cols) {
  kcu_pdl_enter();
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= total) return;
  typedef typename kcu_q4v<T>::T2 T2;
  const int units = kcu_q4f_units(cols), lane = (int)(i % KCU_WARP), g = lane / 4, t = lane % 4;
  const long long tu = i / KCU_WARP;
  const int u = (int)(tu % units), tile = row0 / KCU_Q4F_ROWS + (int)(tu / units);
  const size_t at = (size_t)tile * units + u;
  const uint4 q = __ldg(nib + at * KCU_WARP + lane), d = __ldg(dmv + at * 8 + g);
  const uint32_t qw[4] = {q.x, q.y, q.z, q.w}, dm[2] = {d.x, d.z}, dm8[2] = {d.y, d.w};
#pragma unroll
  for (int b = 0; b < 2; b++) {
    const int c0 = u * KCU_Q4F_COLS + 32 * b + 8 * t;
    if (c0 >= cols) break;
    T2 v[2][4]; /* rows g, g + 8: 8 columns as 4 pairs */
#pragma unroll
    for (int s = 0; s < 2; s++) {
      uint32_t a[4];
      kcu_q4f_frag<T>(qw[2 * b + s], dm[b], dm8[b], a);
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
  KCU_ACT_DISPATCH(c, KCU_LAUNCH(c, kcu_q4f_dequant_k<T>, kcu_div_up(total, KCU_ELEM_NT), KCU_ELEM_NT, 0, (T *)dst,
                                 (const uint4 *)v.nib, (const uint4 *)v.dm, (int)w->cols, (int)row0,
                                 (int)(row0 + nrows), total, (const int32_t *)w->priv, (int)kern_weight_x_cols(w)));
  return 0;
}
