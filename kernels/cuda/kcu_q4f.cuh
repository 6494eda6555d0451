/* kcu_q4f.cuh - the KERN_Q4F layout (4-bit weights repacked for the tensor
 * cores) and what its matmul kernels share: kcu_q4f.cu (repacking, the
 * per-tile matmul, dequantization) and kcu_q4f_wide.cu (17 rows and up).
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
 * KERN_Q4G, a weight whose (d, m) are the same over every aligned run of
 * 128 columns of each row (GPTQ and AWQ at group size 128; the upload
 * checks the values, kcu__q4f_grouped): the same nibbles, then per (tile,
 * pair of units) 64 bytes, 8 per g: the (d, m) of rows g and g + 8, for
 * both units and both blocks of each. 544 bytes per 1024 weights: 4.25
 * bits.
 *
 * KERN_Q6F, a Q6_K weight the same way (6-bit q, w = s * (q - 32) with a
 * scale s per 16 columns): the nibbles above hold q's low 4 bits; after
 * them, per (tile, unit) 256 bytes of high bits, lane L reading bytes
 * [8 L, 8 L + 8): word b (block b) holds, for the lane's nibble word
 * 2 b + s, slot p's two high bits at bit 8 s + 2 p and slot p + 4's at
 * 16 + 8 s + 2 p; then the 128 bytes a (tile, unit) of the (d, m) places,
 * each pair being the block's two scales instead (columns 0..15, 16..31;
 * lanes t < 2 take the first). 896 bytes per 1024 weights: 7 bits (Q6_K
 * is 6.56).
 *
 * The matmul: up to 16 rows (and 17-128 before sm_90) kcu_q4f_mma_k, a
 * CTA per 16-row tile (past 64 rows kcu_q4f_gemm_k); from 17 rows on
 * sm_90 kcu_q4f_wide_k, a CTA per 128 rows with the activations staged in
 * shared memory, its units split over a cluster's CTAs where the rows are
 * few.
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
 * weight). KERN_Q4G's one-row kernel skips the dequantization: its MMAs
 * take 128 + q as it is and apply (d, m) in fp32 after (kcu_q4f.cu). */
#pragma once

#include "kernels/cuda/kcu.cuh"

#define KCU_Q4F_ROWS 16
#define KCU_Q4F_COLS 64
#define KCU_Q4F_NIB 512 /* nibble bytes per (tile, unit) */
#define KCU_Q4F_DM 128  /* (d, m) bytes per (tile, unit) */
#define KCU_Q6F_HI 256  /* KERN_Q6F's high-bit bytes per (tile, unit) */
#define KCU_Q4F_TOK 64  /* tokens per CTA: 8 MMA columns of 8 */

/* A kernel's layout, template argument F: KERN_Q4F 4, KERN_Q4G 5,
 * KERN_Q6F 6. */
#define KCU_QF_Q4F 4
#define KCU_QF_Q4G 5
#define KCU_QF_Q6F 6

/* Row tiles and column units of a (rows, cols) weight. */
__host__ __device__ __forceinline__ int kcu_q4f_tiles(long long rows) {
  return (int)((rows + KCU_Q4F_ROWS - 1) / KCU_Q4F_ROWS);
}
__host__ __device__ __forceinline__ int kcu_q4f_units(long long cols) {
  return (int)((cols + KCU_Q4F_COLS - 1) / KCU_Q4F_COLS);
}
/* KERN_Q4G's pairs of units (the last one may have one). */
__host__ __device__ __forceinline__ int kcu_q4g_pairs(int units) { return (units + 1) / 2; }

/* A KERN_Q4F weight's two arrays in its device memory `data`: all the
 * nibbles, then all the (d, m) pairs; KERN_Q6F (six) has its high bits
 * between them. */
typedef struct {
  uint4 *nib, *dm;
  uint2 *hi; /* KERN_Q6F's, else NULL */
  int tiles, units;
} kcu_q4f_view_t;

static inline kcu_q4f_view_t kcu_q4f_view_as(const kern_weight_t *w, void *data, bool six) {
  kcu_q4f_view_t v;
  v.tiles = kcu_q4f_tiles(w->rows), v.units = kcu_q4f_units(w->cols);
  const size_t tu = (size_t)v.tiles * v.units;
  v.nib = (uint4 *)data;
  v.hi = six ? (uint2 *)((char *)data + tu * KCU_Q4F_NIB) : NULL;
  v.dm = (uint4 *)((char *)data + tu * (KCU_Q4F_NIB + (six ? KCU_Q6F_HI : 0)));
  return v;
}
static inline kcu_q4f_view_t kcu_q4f_view(const kern_weight_t *w, void *data) {
  return kcu_q4f_view_as(w, data, w->type == KERN_Q6F);
}

/* The (d, m) of unit u of a tile, as kcu_q4f_frag takes them: rows g and
 * g + 8 of block 0, then of block 1. dp: the tile's (d, m) at this lane's
 * g (kcu_qf_dm_at); KERN_Q4G's one pair serves both blocks. */
template <int F> __device__ __forceinline__ const uint32_t *kcu_qf_dm_at(const uint4 *dm, int tile, int units, int g) {
  const uint32_t *w = reinterpret_cast<const uint32_t *>(dm);
  return F == KCU_QF_Q4G ? w + ((size_t)tile * kcu_q4g_pairs(units) * 8 + g) * 2
                         : w + ((size_t)tile * units * 8 + g) * 4;
}
template <int F> __device__ __forceinline__ uint4 kcu_qf_dm(const uint32_t *dp, int u) {
  if (F == KCU_QF_Q4G) {
    const uint2 v = __ldg(reinterpret_cast<const uint2 *>(dp + (size_t)(u / 2) * 16));
    return make_uint4(v.x, v.y, v.x, v.y);
  }
  return __ldg(reinterpret_cast<const uint4 *>(dp + (size_t)u * 32));
}

template <typename T> struct kcu_q4v;
template <> struct kcu_q4v<__nv_bfloat16> {
  typedef __nv_bfloat162 T2;
  static constexpr uint32_t MAGIC = 0x43004300u; /* 128, 128 */
  static constexpr uint32_t ONE = 0x3f803f80u;   /* 1, 1 */
  static constexpr float BASE = 128.f;
  /* a (d, m) pair's two values: d the lower half */
  static __device__ __forceinline__ float2 pair(uint32_t v) {
    return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
  }
};
template <> struct kcu_q4v<__half> {
  typedef __half2 T2;
  static constexpr uint32_t MAGIC = 0x64006400u; /* 1024, 1024 */
  static constexpr uint32_t ONE = 0x3c003c00u;   /* 1, 1 */
  static constexpr float BASE = 1024.f;
  static __device__ __forceinline__ float2 pair(uint32_t v) { return __half22float2(*reinterpret_cast<__half2 *>(&v)); }
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

/* KERN_Q6F: the four A registers of k-step S (unrolled: a constant) of a
 * block from its nibble word, the block's high-bit word hw and the scale
 * pairs of rows g and g + 8 (this lane's half of the block: t / 2).
 * (v | 0x4300) is 128 + q (q < 64) exactly, 160 less is q - 32. */
template <typename T>
__device__ __forceinline__ void kcu_q6f_frag(uint32_t word, uint32_t hw, int S, uint32_t sc_g, uint32_t sc_g8, int t,
                                             uint32_t *a) {
  typedef typename kcu_q4v<T>::T2 T2;
  const T2 base = kcu_as2<T2>(kcu_q4v<T>::MAGIC + 0x00200020u);
  const uint32_t sel = t < 2 ? 0x1010u : 0x3232u;
  const T2 sg = kcu_as2<T2>(__byte_perm(sc_g, 0, sel)), sg8 = kcu_as2<T2>(__byte_perm(sc_g8, 0, sel));
#pragma unroll
  for (int p = 0; p < 4; p++) {
    const int sh = 8 * S + 2 * p - 4; /* slot p's high bits to bit 4, slot p + 4's to bit 20 */
    const uint32_t h = sh >= 0 ? hw >> sh : hw << -sh;
    const uint32_t v = kcu_and_or(h, 0x00300030u, kcu_and_or(word >> (4 * p), 0x000f000fu, kcu_q4v<T>::MAGIC));
    a[p] = kcu_from2<T2>(__hmul2(__hsub2(kcu_as2<T2>(v), base), p & 1 ? sg8 : sg));
  }
}

/* Any layout's A registers of k-step S of a block (F 6: KERN_Q6F, hw its
 * high-bit word of the block; else the 4-bit ones, hw and t unused). */
template <typename T, int F>
__device__ __forceinline__ void kcu_qf_frag(uint32_t word, uint32_t hw, int S, uint32_t dm_g, uint32_t dm_g8, int t,
                                            uint32_t *a) {
  if (F == KCU_QF_Q6F) kcu_q6f_frag<T>(word, hw, S, dm_g, dm_g8, t, a);
  else kcu_q4f_frag<T>(word, dm_g, dm_g8, a);
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

/* A staged activation row of 64 columns (8 uint4, 128 bytes): odd rows
 * swap its halves, so the fragment reads (rows g and g + 1 of a phase, the
 * same 64 bytes of each) hit all 32 banks. */
__device__ __forceinline__ int kcu_q4f_xoff(int r, int c) { return r * 8 + (c ^ ((r & 1) << 2)); }

/* The one-row KERN_Q4G kernel's shared memory past 48 KB (kcu__q4f_init). */
int kcu__q4g_row_init(kcu_ctx_t *c);

/* The wide kernel's matmul (kcu_q4f_wide.cu): n from c->q4f_wide up. */
int kcu__q4w_matmul(kcu_ctx_t *c, void *out, const kern_weight_t *w, const float *bias, const void *x, int n);
int kcu__q4w_matmul_silu(kcu_ctx_t *c, void *out, const kern_weight_t *w, const void *x, int n);
