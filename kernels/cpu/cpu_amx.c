/* cpu_amx.c - prefill matmuls of K-quant panel weights (Q4_K, Q6_K) on AMX
 * tiles in bf16.
 *
 * The VNNI panel kernels multiply int8 activations by the weights' integer
 * values and scale every (sub-)block's sum in vector registers; AMX-INT8
 * would leave that scaling, a third of the work, on the vector units (tried
 * in session 22: +6%). Here each thread dequantizes two panels (32 weight
 * rows) once per matmul into bf16 tiles, the scales folded in, and the
 * tile unit multiplies them by every activation row in bf16 with f32 sums
 * (tdpbf16ps, 16 x 16 x 32 a call), so the dequantization is paid once for
 * all of a prefill chunk's rows. A weight's bf16 tile (B, 16 K pairs x 16
 * rows): dword [kp][r] = row r's elements 2 kp and 2 kp + 1, rounded to
 * bf16 (the pair order tdpbf16ps takes); activations (A) are the rows
 * rounded to bf16, 16 tokens x 32 columns a tile.
 *
 * Numerics: a row's value is its weights rounded to bf16 (8 significant
 * bits; the int8 path keeps them exact) times its activations rounded to
 * bf16 (the int8 path: 8 bits against the block's largest), summed in f32
 * by the tile unit in its own order. So prefill on AMX is not bit-equal to
 * decode on the panel kernels; test_matmul_amx bounds it against the
 * dequantized weights in f64. */
#include <cpuid.h>
#include <immintrin.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/fr_util.h"
#include "kernels/cpu/cpu.h"

#define CPU_AMX_PAIR_BYTES 64 /* a K pair of 16 rows in bf16: one tile row */

/* AMX-TILE, AMX-BF16 and AVX512-BF16 (CPUID 7.0 EDX 24 and 22, 7.1 EAX
 * 5), and the tile state from Linux, which a process must ask for
 * (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA): asked once, for
 * every thread. */
bool cpu__amx_usable(void) {
  static _Atomic int usable = -1; /* a race asks Linux twice, harmlessly */
  if (usable < 0) {
    unsigned a, b, c, d, a1, b1, c1, d1;
    const bool cpu = __builtin_cpu_supports("avx512bw") && __get_cpuid_count(7, 0, &a, &b, &c, &d) &&
                     (d & (1u << 24)) && (d & (1u << 22)) && __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1) &&
                     (a1 & (1u << 5));
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    usable = cpu && syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
  }
  return usable;
}

bool cpu__amx_takes(kern_type_t t) { return t == KERN_Q4_K || t == KERN_Q6_K; }

typedef struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} cpu_amx_cfg_t;

/* Every tile 16 rows of 64 bytes: C 0-3 (f32 16 x 16), A 4-5 (bf16 16 x
 * 32), B 6-7 (bf16 pairs 16 x 16). */
static void cpu__amx_config(void) {
  cpu_amx_cfg_t cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int i = 0; i < 8; i++) cfg.rows[i] = 16, cfg.colsb[i] = 64;
  _tile_loadconfig(&cfg);
}

/* 16 floats to bf16, round to nearest even. */
static inline __m256i cpu__amx_bf16(__m512 v) { return (__m256i)_mm512_cvtneps_pbh(v); }

/* The K pair (e, e + 1) of 16 rows, e and e + 1's values in va and vb,
 * as one tile row. */
static inline void cpu__amx_put_pair(uint8_t *dst, __m512 va, __m512 vb) {
  const __m512i lo = _mm512_cvtepu16_epi32(cpu__amx_bf16(va)), hi = _mm512_cvtepu16_epi32(cpu__amx_bf16(vb));
  _mm512_store_si512((void *)dst, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
}

/* Element i (0..3) of each lane's 4 bytes, as 16 floats. */
static inline __m512 cpu__amx_byte(__m512i v, int i) {
  return _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(v, 8 * i), _mm512_set1_epi32(0xFF)));
}

/* Lane r: bits 4r .. 4r + 3 of h (a panel's h4 / h5 word), at bit 0. */
static inline __m512i cpu__amx_bits4(uint64_t h) {
  const __m512i w = _mm512_inserti64x4(_mm512_set1_epi32((int)(uint32_t)h), _mm256_set1_epi32((int)(h >> 32)), 1);
  const __m512i sh = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
  return _mm512_and_si512(_mm512_srlv_epi32(w, sh), _mm512_set1_epi32(0xF));
}

/* Q6_K: bits 4 and 5 of elements 4 g .. 4 g + 3 (bits 4 r .. 4 r + 3 of
 * the panel's h4[g] and h5[g]) into bits 4 and 5 of lane r's bytes 0..3. */
static inline __m512i cpu__amx_q6_high(__m512i u, uint64_t h4, uint64_t h5) {
  const __m512i b4 = cpu__amx_bits4(h4), b5 = cpu__amx_bits4(h5);
  for (int i = 0; i < 4; i++) { /* bit i to bit 8 i (of the byte), then up to 4 or 5 */
    const __m512i bit = _mm512_set1_epi32(1 << (8 * i));
    u = _mm512_or_si512(u, _mm512_slli_epi32(_mm512_and_si512(_mm512_slli_epi32(b4, 7 * i), bit), 4));
    u = _mm512_or_si512(u, _mm512_slli_epi32(_mm512_and_si512(_mm512_slli_epi32(b5, 7 * i), bit), 5));
  }
  return u;
}

/* 16 bytes of a panel block (one per row) as 16 floats. */
static inline __m512 cpu__amx_u8(const uint8_t *p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
static inline __m512 cpu__amx_i8(const uint8_t *p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

/* One panel block (256 elements of 16 rows) of type t into tile rows: K
 * pair kp of the block at dst + kp * 64. Row r's element e is a u + b with
 * u its unsigned value and (a, b) its sub-block's: Q4_K a = d sc, b = -dmin
 * m (32 elements a sub-block); Q6_K a = d sc, b = -32 a (16). The values
 * of 8 elements of 16 rows (elements 8 k + i in the low nibbles of the
 * 64 bytes at v + 64 k, 8 k + 4 + i in the high ones, byte i of lane r)
 * make 4 tile rows. */
static void cpu__amx_unpack_block(kern_type_t t, const uint8_t *blk, uint8_t *dst) {
  const bool q4 = t == KERN_Q4_K;
  const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
  const __m512 ndmin = q4 ? _mm512_sub_ps(_mm512_setzero_ps(), _mm512_cvtph_ps(_mm256_loadu_si256(
                                                                   (const __m256i *)(blk + CPU_PANEL_HEAD))))
                          : d;
  const uint8_t *v = blk + (q4 ? CPU_PANEL_Q4K_V : CPU_PANEL_Q6K_V);
  const uint64_t *h4 = (const uint64_t *)(blk + CPU_PANEL_Q6K_H4), *h5 = (const uint64_t *)(blk + CPU_PANEL_Q6K_H5);
  __m512 a = d, b = d;
  for (int k = 0; k < 32; k++) {
    if (q4 && k % 4 == 0) {
      a = _mm512_mul_ps(d, cpu__amx_u8(blk + CPU_PANEL_Q4K_SC + 16 * (k / 4)));
      b = _mm512_mul_ps(ndmin, cpu__amx_u8(blk + CPU_PANEL_Q4K_M + 16 * (k / 4)));
    } else if (!q4 && k % 2 == 0) {
      a = _mm512_mul_ps(d, cpu__amx_i8(blk + CPU_PANEL_HEAD + 16 * (k / 2)));
      b = _mm512_mul_ps(_mm512_set1_ps(-32.0f), a);
    }
    const __m512i q = _mm512_loadu_si512((const void *)(v + 64 * k)), low = _mm512_set1_epi8(0x0F);
    __m512i lo = _mm512_and_si512(q, low), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), low);
    if (!q4) {
      lo = cpu__amx_q6_high(lo, h4[2 * k], h5[2 * k]);
      hi = cpu__amx_q6_high(hi, h4[2 * k + 1], h5[2 * k + 1]);
    }
    __m512 w[8];
    for (int i = 0; i < 4; i++) {
      w[i] = _mm512_fmadd_ps(a, cpu__amx_byte(lo, i), b);
      w[4 + i] = _mm512_fmadd_ps(a, cpu__amx_byte(hi, i), b);
    }
    for (int p = 0; p < 4; p++)
      cpu__amx_put_pair(dst + (size_t)(4 * k + p) * CPU_AMX_PAIR_BYTES, w[2 * p], w[2 * p + 1]);
  }
}

/* Panel p of w (nb blocks) into tile rows at dst: cols / 2 rows of 64 bytes. */
static void cpu__amx_unpack_panel(const kern_weight_t *w, long p, int nb, uint8_t *dst) {
  const size_t pbb = cpu_panel_block_bytes(w->type);
  const uint8_t *panel = (const uint8_t *)w->priv + (size_t)p * (size_t)nb * pbb;
  for (int b = 0; b < nb; b++)
    cpu__amx_unpack_block(w->type, panel + (size_t)b * pbb, dst + (size_t)b * 128 * CPU_AMX_PAIR_BYTES);
}

typedef struct {
  const kern_weight_t *w;
  const float *x, *bias; /* x (n, cols) f32 */
  uint16_t *xb;          /* (n16, cols) bf16, rows past n zero */
  uint8_t *wb;           /* per thread: two panels' tile rows */
  size_t wb_bytes;
  float *out; /* (n, rows) */
  int n, n16, nb;
  long n_pairs; /* panel pairs (the last one may be a single panel) */
  atomic_long next;
} cpu_amx_job_t;

static void cpu__amx_convert_part(void *arg, int ith, int nth) {
  cpu_amx_job_t *job = arg;
  const long cols = job->w->cols;
  long lo, hi;
  fr_pool_split(job->n16, ith, nth, &lo, &hi);
  for (long j = lo; j < hi; j++) {
    uint16_t *o = job->xb + (size_t)j * cols;
    if (j >= job->n) {
      memset(o, 0, (size_t)cols * sizeof *o);
      continue;
    }
    const float *x = job->x + (size_t)j * cols;
    for (long k = 0; k < cols; k += 16) _mm256_storeu_si256((__m256i *)(o + k), cpu__amx_bf16(_mm512_loadu_ps(x + k)));
  }
}

/* Output columns [r0, r0 + 16 np) (np panels, 1 or 2; their tile rows at
 * wb) for activation rows [j, j + 16 nt) (nt 1 or 2), into dst rows of
 * ld floats (dst: row j's first column r0). */
static void cpu__amx_block(const cpu_amx_job_t *job, const uint8_t *wb, long r0, int np, int j, int nt, float *dst,
                           size_t ld) {
  const long cols = job->w->cols;
  const size_t pbytes = (size_t)cols / 2 * CPU_AMX_PAIR_BYTES, xs = (size_t)cols * sizeof(uint16_t);
  const float *bias = job->bias ? job->bias + r0 : NULL;
  /* C: tile 2 t + q is tokens 16 t.., rows 16 q.. ; a bias row loaded with stride 0 */
  if (bias) {
    _tile_loadd(0, bias, 0);
    _tile_loadd(2, bias, 0);
    if (np == 2) {
      _tile_loadd(1, bias + 16, 0);
      _tile_loadd(3, bias + 16, 0);
    }
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  const uint16_t *x0 = job->xb + (size_t)j * cols, *x1 = x0 + 16 * (size_t)cols;
  for (long k = 0; k < cols; k += 32) {
    const uint8_t *b0 = wb + (size_t)(k / 2) * CPU_AMX_PAIR_BYTES;
    _tile_loadd(4, x0 + k, xs);
    _tile_loadd(6, b0, CPU_AMX_PAIR_BYTES);
    _tile_dpbf16ps(0, 4, 6);
    if (np == 2) {
      _tile_loadd(7, b0 + pbytes, CPU_AMX_PAIR_BYTES);
      _tile_dpbf16ps(1, 4, 7);
    }
    if (nt == 2) {
      _tile_loadd(5, x1 + k, xs);
      _tile_dpbf16ps(2, 5, 6);
      if (np == 2) _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, dst, ld * sizeof(float));
  if (np == 2) _tile_stored(1, dst + 16, ld * sizeof(float));
  if (nt == 2) {
    _tile_stored(2, dst + 16 * ld, ld * sizeof(float));
    if (np == 2) _tile_stored(3, dst + 16 * ld + 16, ld * sizeof(float));
  }
}

/* A panel pair for every activation row: 32 at a time, the last 16 (past
 * n) through a scratch block. */
static void cpu__amx_pair(const cpu_amx_job_t *job, long pair, uint8_t *wb) {
  const kern_weight_t *w = job->w;
  const long panels = w->rows / CPU_PANEL_ROWS, p0 = 2 * pair;
  const int np = p0 + 1 < panels ? 2 : 1;
  const size_t pbytes = (size_t)w->cols / 2 * CPU_AMX_PAIR_BYTES, ld = (size_t)w->rows;
  for (int q = 0; q < np; q++) cpu__amx_unpack_panel(w, p0 + q, job->nb, wb + q * pbytes);
  const long r0 = p0 * CPU_PANEL_ROWS;
  int j = 0;
  for (; j + 32 <= job->n; j += 32) cpu__amx_block(job, wb, r0, np, j, 2, job->out + (size_t)j * ld + r0, ld);
  for (; j < job->n; j += 16) {
    if (j + 16 <= job->n) {
      cpu__amx_block(job, wb, r0, np, j, 1, job->out + (size_t)j * ld + r0, ld);
      continue;
    }
    float tail[16 * 32];
    cpu__amx_block(job, wb, r0, np, j, 1, tail, 32);
    for (int t = 0; t < job->n - j; t++)
      memcpy(job->out + (size_t)(j + t) * ld + r0, tail + 32 * t, (size_t)np * 16 * sizeof(float));
  }
}

static void cpu__amx_part(void *arg, int ith, int nth) {
  cpu_amx_job_t *job = arg;
  (void)nth;
  uint8_t *wb = job->wb + (size_t)ith * job->wb_bytes;
  cpu__amx_config();
  for (long c = ith; c < job->n_pairs; c = atomic_fetch_add_explicit(&job->next, 1, memory_order_relaxed))
    cpu__amx_pair(job, c, wb);
  _tile_release();
}

int cpu__amx_matmul(cpu_ctx_t *ctx, float *out, const kern_weight_t *w, const float *bias, const float *x, int n) {
  cpu_amx_job_t job = {.w = w, .x = x, .bias = bias, .out = out, .n = n, .n16 = (n + 15) / 16 * 16};
  job.nb = (int)(w->cols / kern_type_traits(w->type)->blck);
  job.wb_bytes = 2 * (size_t)w->cols / 2 * CPU_AMX_PAIR_BYTES;
  job.n_pairs = (w->rows / CPU_PANEL_ROWS + 1) / 2;
  const size_t xb_bytes = (size_t)job.n16 * (size_t)w->cols * sizeof(uint16_t);
  cpu__scratch_reserve(&ctx->amx_buf, &ctx->amx_cap, xb_bytes + 64 + (size_t)ctx->n_threads * job.wb_bytes);
  job.xb = ctx->amx_buf;
  job.wb = (uint8_t *)ctx->amx_buf + (xb_bytes + 63) / 64 * 64;
  if (ctx->n_threads == 1) cpu__amx_convert_part(&job, 0, 1);
  else fr_pool_run(ctx->pool, cpu__amx_convert_part, &job);
  atomic_init(&job.next, ctx->n_threads);
  if (ctx->n_threads == 1 || job.n_pairs == 1) cpu__amx_part(&job, 0, 1);
  else fr_pool_run(ctx->pool, cpu__amx_part, &job);
  return 0;
}
