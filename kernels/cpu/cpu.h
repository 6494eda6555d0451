/* cpu.h - internals of the CPU backend: block layouts, the per-ISA kernel
 * table and the backend context.
 *
 * Matmul follows ggml: activations are quantized once per matmul into the
 * weight type's "vec_dot type" (Q8_0, Q8_1 or Q8_K; f32 for float weights),
 * then each output element is one vec_dot of a weight row with an
 * activation row. Every ISA table (scalar, avx2, avx512, avx512vnni) fills the same
 * slots; the integer arithmetic is identical across them, only the order of
 * float accumulation differs.
 *
 * Threads: ops run on the backend's fr_pool; the kernels in the tables are
 * pure functions of their arguments.
 */
#pragma once

#include <stdint.h>

#include "common/fr_pool.h"
#include "kernels/kern.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CPU_QK 32   /* elements per block of the 32-element types */
#define CPU_QK_K 256 /* elements per K-quant super-block */
/* Default of cpu_ctx_t.prefetch (FERRUM_CPU_PREFETCH): measured in
 * docs/bench/cpu-model.md (session 20), flat from 2 to 6 KiB. */
#define CPU_PREFETCH 4096

/* Weight blocks (ggml's layouts, ggml-common.h); f16 fields as raw uint16_t. */
typedef struct { uint16_t d; uint8_t qs[16]; } cpu_block_q4_0;
typedef struct { uint16_t d, m; uint8_t qs[16]; } cpu_block_q4_1;
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; } cpu_block_q5_0;
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[16]; } cpu_block_q5_1;
typedef struct { uint16_t d; int8_t qs[32]; } cpu_block_q8_0;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; } cpu_block_q4_K;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; } cpu_block_q5_K;
typedef struct { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; } cpu_block_q6_K;
/* I4G (GPTQ/AWQ int4 in memory, kern_types.h): f32 d and m, Q4_1's nibbles.
 * Its vec_dot type is f32: activations are not rounded, so a model of I4G
 * weights computes what its dequantized f32 twin computes, up to the order
 * of float sums. */
typedef struct { float d, m; uint8_t qs[16]; } cpu_block_i4g;
/* Activation blocks. Q8_1: s = d * sum(qs). Q8_K: bsums = sums of 16 qs. */
typedef struct { uint16_t d, s; int8_t qs[32]; } cpu_block_q8_1;
typedef struct { float d; int8_t qs[256]; int16_t bsums[16]; } cpu_block_q8_K;

_Static_assert(sizeof(cpu_block_q4_0) == 18, "q4_0");
_Static_assert(sizeof(cpu_block_q4_1) == 20, "q4_1");
_Static_assert(sizeof(cpu_block_q5_0) == 22, "q5_0");
_Static_assert(sizeof(cpu_block_q5_1) == 24, "q5_1");
_Static_assert(sizeof(cpu_block_i4g) == 24, "i4g");
_Static_assert(sizeof(cpu_block_q8_0) == 34, "q8_0");
_Static_assert(sizeof(cpu_block_q8_1) == 36, "q8_1");
_Static_assert(sizeof(cpu_block_q4_K) == 144, "q4_K");
_Static_assert(sizeof(cpu_block_q5_K) == 176, "q5_K");
_Static_assert(sizeof(cpu_block_q6_K) == 210, "q6_K");
_Static_assert(sizeof(cpu_block_q8_K) == 292, "q8_K");

/* *s = dot(weight row w, activation row a) over n elements; a is of the
 * weight type's vec_dot type (cpu_vec_dot_type). */
typedef void (*cpu_vec_dot_fn)(int n, float *s, const void *w, const void *a);
/* Prefill form: s[k] = dot(w, a + k * a_stride) for k < 4, each exactly as
 * the single-row vec_dot computes it. */
typedef void (*cpu_vec_dot_x4_fn)(int n, float *s, const void *w, const void *a, size_t a_stride);
/* Batched form: s[k * 4 + j] = dot(w + k * w_stride, a + j * a_stride) for
 * k < 2, j < 4, each exactly as the single-row vec_dot computes it. */
typedef void (*cpu_vec_dot_2x4_fn)(int n, float *s, const void *w, size_t w_stride, const void *a, size_t a_stride);
/* Quantizes n floats (a multiple of the block size) into activation blocks. */
typedef void (*cpu_quantize_fn)(const float *x, void *y, int n);

/* Panels (cpu_panel.c): a weight of Q4_0, Q4_1, Q5_0, Q8_0, Q4_K or Q6_K
 * blocks whose rows are a multiple of CPU_PANEL_ROWS may be stored
 * (where the table has a kernel for its type: cpu_x512_panel.h with VNNI,
 * cpu_x86_panel.h without) interleaved at load, 16 rows at a time, so that one 512-bit vector holds
 * 4 columns of all 16 rows as unsigned bytes: vpdpbusd against the
 * activation's 4 bytes broadcast gives the 16 rows' integer sums in lanes,
 * each (sub-)block's exact sum lands in one lane and is scaled there, and
 * no horizontal sum is left (the layout llama.cpp's repacked CPU GEMMs use).
 * A panel block holds its 16 rows' blocks:
 *   32-element types, in the bytes the rows had: f16 d[16] (Q4_1: then f16
 *     m[16]; Q5_0: then u64 hi[8], bit 4r + i of hi[g] the fifth bit of row
 *     r's element 4g + i), then the values;
 *   Q4_K: f16 d[16], f16 dmin[16], u8 sc[8][16], u8 m[8][16], values;
 *   Q6_K: f16 d[16], i8 sc[16][16], u64 h4[64], u64 h5[64] (bits 4 and 5
 *     of the elements, as Q5_0's hi), values.
 * Values: Q8_0: u8 v[8][16][4], v[g][r][i] = row r's element 4g + i plus
 * 128; the others: u8 v[blck / 8][16][4], low nibble element 8k + i, high
 * nibble element 8k + 4 + i (the low four bits, for Q5_0 and Q6_K).
 * Each row's value is then d (u - off), off 128 (Q8_0), 8 (Q4_0), 16
 * (Q5_0), 32 (Q6_K, times its sub-block's scale); Q4_1: d u + m; Q4_K:
 * d sc u - dmin m.
 * The numerics differ from the row dots': per (sub-)block the exact integer
 * sum(u y) - off sum(y); 32-element types: converted to f32, times d_w d_y
 * (an f32 product), fma'd into the row's f32 sum block after block (Q4_1:
 * then fma(m, s_y)); K-quants: converted, fma'd with the sub-block's scale
 * into a super-block sum t (Q4_K: mins into mm alike), then acc = fma(t,
 * d_w d_y, acc) (Q4_K: then acc -= mm dmin_w d_y, one rounding).
 * Every panel kernel computes that, so a row's result does not depend on
 * the batch (test_matmul_panels_exact); but a matmul of CPU_AMX_ROWS or
 * more over Q4_K / Q6_K panels goes to the AMX tiles in bf16 where the CPU
 * has them (cpu_amx.c), a prefill's rows computed otherwise. */
#define CPU_PANEL_ROWS 16
#define CPU_PANEL_TILE 8 /* activation rows a panel kernel call takes at most */

/* Byte offsets of a panel block's parts and, for the K-quants, its size
 * (the layout above; 32-element types: cpu_panel_values32). */
enum {
  CPU_PANEL_HEAD = 32, /* after d[16]: Q4_1's m, Q4_K's dmin, Q5_0's hi, Q6_K's sc */
  CPU_PANEL_Q4K_SC = 64,
  CPU_PANEL_Q4K_M = 192,
  CPU_PANEL_Q4K_V = 320,
  CPU_PANEL_Q4K_BYTES = CPU_PANEL_Q4K_V + 2048,
  CPU_PANEL_Q6K_H4 = 288,
  CPU_PANEL_Q6K_H5 = CPU_PANEL_Q6K_H4 + 512,
  CPU_PANEL_Q6K_V = CPU_PANEL_Q6K_H5 + 512,
  CPU_PANEL_Q6K_BYTES = CPU_PANEL_Q6K_V + 2048,
};

/* Bytes of a panel block: 16 rows of one block (a constant where t is). */
static inline size_t cpu_panel_block_bytes(kern_type_t t) {
  switch (t) {
  case KERN_Q4_0: return CPU_PANEL_ROWS * sizeof(cpu_block_q4_0);
  case KERN_Q4_1: return CPU_PANEL_ROWS * sizeof(cpu_block_q4_1);
  case KERN_Q5_0: return CPU_PANEL_ROWS * sizeof(cpu_block_q5_0);
  case KERN_Q8_0: return CPU_PANEL_ROWS * sizeof(cpu_block_q8_0);
  case KERN_Q4_K: return CPU_PANEL_Q4K_BYTES;
  case KERN_Q6_K: return CPU_PANEL_Q6K_BYTES;
  default: return 0;
  }
}

/* Offset of a 32-element type's values in its panel block. */
static inline size_t cpu_panel_values32(kern_type_t t) {
  return CPU_PANEL_HEAD + (t == KERN_Q4_1 ? 32 : t == KERN_Q5_0 ? 64 : 0);
}

/* An activation block for panels of 32-element types: the values and d of
 * the weight type's vec_dot quantization (d f16-rounded, as the row dots
 * use it); s: Q8_1's (f16) for Q4_1, else d * sum(qs); and the weight
 * type's offset correction c = -off * sum(qs). */
typedef struct {
  float d, s;
  int32_t c, pad;
  int8_t qs[32];
} cpu_block_q8_p;

/* An activation block for K-quant panels: Q8_K's d and values, c[i] = -32 *
 * the sum of values 16i..16i+15 (Q6_K's offset), bs[i] = the sum of values
 * 32i..32i+31 as f32 (Q4_K's mins). */
typedef struct {
  float d;
  int32_t c[16];
  float bs[8];
  int8_t qs[256];
} cpu_block_q8_kp;

/* out[j * ld + r] = dot(panel row r, activation row j) + (bias ? bias[r] :
 * 0), r < 16, j < na (1..CPU_PANEL_TILE); nb blocks of the weight type; a: na rows of
 * activation blocks (cpu_block_q8_p or cpu_block_q8_kp), a_stride bytes
 * apart. pf: bytes ahead of each panel block to prefetch (0: none). */
typedef void (*cpu_panel_gemm_fn)(int nb, const void *panel, const void *a, size_t a_stride, int na, float *out,
                                  size_t ld, const float *bias, size_t pf);

typedef struct {
  const char *name;                          /* "scalar", "avx2", "avx512", "avx512vnni" */
  cpu_vec_dot_fn vec_dot[KERN_TYPE_MAX];     /* by weight type; NULL = unsupported */
  cpu_vec_dot_x4_fn vec_dot_x4[KERN_TYPE_MAX]; /* optional 4-activation-row form (prefill) */
  cpu_vec_dot_2x4_fn vec_dot_2x4[KERN_TYPE_MAX]; /* optional 2-weight-row x 4-activation-row form */
  cpu_quantize_fn quantize[KERN_TYPE_MAX];   /* by vec_dot type (Q8_0, Q8_1, Q8_K) */
  cpu_panel_gemm_fn panel_gemm[KERN_TYPE_MAX]; /* by weight type; NULL: that type's weights stay in rows */
  float (*dot_f32)(int n, const float *a, const float *b);
  float (*dot_f16)(int n, const uint16_t *a, const float *b);
  void (*axpy_f32)(int n, float a, const float *x, float *y);    /* y += a * x */
  void (*axpy_f16)(int n, float a, const uint16_t *x, float *y); /* y += a * x */
  /* Quantized KV rows (kern_kv_dtype_t), without their scale: int8 and FP8 E4M3 bytes. */
  float (*dot_i8)(int n, const int8_t *a, const float *b);
  void (*axpy_i8)(int n, float a, const int8_t *x, float *y);    /* y += a * x */
  float (*dot_e4m3)(int n, const uint8_t *a, const float *b);
  void (*axpy_e4m3)(int n, float a, const uint8_t *x, float *y); /* y += a * x */
  /* Attention over n consecutive rows of an f16 KV cache (row o at k + o *
   * stride elements), optional (NULL: a dot_f16 / axpy_f16 call per row).
   * scores_f16: s[o] = scale * dot_f16(hd, k + o * stride, q), each as
   * dot_f16 computes it. pv_f16: acc += f16(w[o] * inv) * (v + o * stride)
   * for o = 0..n-1 in order, the weight rounded to f16 first: as n
   * axpy_f16 calls. */
  void (*scores_f16)(int hd, const uint16_t *k, size_t stride, int n, const float *q, float scale, float *s);
  void (*pv_f16)(int hd, const float *w, float inv, const uint16_t *v, size_t stride, int n, float *acc);
  /* libm's expf, elementwise, its bits on every table (cpu_x86_exp.h):
   * silu_mul: o[k] = g[k] / (1 + expf(-g[k])) * u[k], k < d;
   * exp_shift: y[i] = expf((x[i] - m) / t), i < n (t = 1: no division; y may be x). */
  void (*silu_mul)(int d, const float *g, const float *u, float *o);
  void (*exp_shift)(int n, const float *x, float m, float t, float *y);
} cpu_isa_t;

extern const cpu_isa_t cpu_isa_scalar;
#if defined(__x86_64__)
extern const cpu_isa_t cpu_isa_avx2;
extern const cpu_isa_t cpu_isa_avx512;
extern const cpu_isa_t cpu_isa_avx512vnni;
#endif

/* The activation type a weight type dots with (KERN_F32 for float weights). */
static inline kern_type_t cpu_vec_dot_type(kern_type_t t) {
  switch (t) {
  case KERN_Q4_0: case KERN_Q5_0: case KERN_Q8_0: return KERN_Q8_0;
  case KERN_Q4_1: case KERN_Q5_1: return KERN_Q8_1;
  case KERN_Q4_K: case KERN_Q5_K: case KERN_Q6_K: return KERN_Q8_K;
  default: return KERN_F32;
  }
}

/* Scalar kernels shared by every table (Q8_K quantization has one form). */
void cpu__quantize_q8_0_scalar(const float *x, void *y, int n);
void cpu__quantize_q8_1_scalar(const float *x, void *y, int n);
void cpu__quantize_q8_K(const float *x, void *y, int n);
float cpu__dot_bf16_scalar(int n, const uint16_t *a, const float *b);
float cpu__dot_e4m3_scalar(int n, const uint8_t *a, const float *b);
void cpu__axpy_e4m3_scalar(int n, float a, const uint8_t *x, float *y);

/* An FP8 E4M3 byte as f32 by bits: the 7 magnitude bits shifted into an f32
 * (exponent and mantissa line up, subnormals included) times 2^120 (the
 * difference of the biases, 127 - 7), and the sign. NaN (0x7F) is never
 * stored (appends saturate). */
static inline float cpu_e4m3_to_f32(uint8_t x) {
  union { uint32_t u; float f; } v = {.u = (uint32_t)(x & 0x7F) << 20};
  const float m = v.f * 0x1p120f;
  return x & 0x80 ? -m : m;
}

/* Panels (cpu_panel.c). */
size_t cpu__panel_act_bytes(kern_type_t t);   /* an activation block: sizeof cpu_block_q8_p or _q8_kp */
/* Packs rows [16 p, 16 p + 16) of w (its row layout at src) into panel p at
 * dst + p * blocks per row * cpu_panel_block_bytes(type). */
void cpu__panel_pack(const kern_weight_t *w, const void *src, long p, void *dst);
/* Quantizes n floats (whole blocks of t) into panel activation blocks for
 * weights of type t, through quant (the table's quantizer of t's vec_dot
 * type: Q8_0, Q8_1 for Q4_1, Q8_K for the K-quants). */
void cpu__panel_quantize(cpu_quantize_fn quant, kern_type_t t, const float *x, void *y, int n);
/* The panel numerics in plain C: the reference every table's kernel matches. */
void cpu__panel_gemm_scalar(kern_type_t t, int nb, const void *panel, const void *a, size_t a_stride, int na,
                            float *out, size_t ld, const float *bias);

/* AMX (cpu_amx.c): prefill matmuls of Q4_K / Q6_K panels on bf16 tiles,
 * from CPU_AMX_ROWS activation rows (FERRUM_CPU_AMX_ROWS). */
#define CPU_AMX_ROWS 64
struct cpu_ctx;
bool cpu__amx_usable(void);                 /* the CPU has the tiles and Linux granted them */
bool cpu__amx_takes(kern_type_t t);         /* the weight types cpu__amx_matmul reads from panels */
/* out (n, rows) = x (n, cols) @ w^T + bias, w in panels of a type it takes. */
int cpu__amx_matmul(struct cpu_ctx *ctx, float *out, const kern_weight_t *w, const float *bias, const float *x, int n);

/* Grows a 64-byte aligned scratch buffer to at least `bytes` (keeps it when
 * large enough: no allocation once warm). */
void cpu__scratch_reserve(void **buf, size_t *cap, size_t bytes);

typedef struct cpu_ctx {
  kern_backend_t be; /* first: the kern_backend_t handed out */
  fr_pool_t *pool;
  int n_threads;
  const cpu_isa_t *isa;
  bool panels;     /* quantized weights stored as panels where the table has a kernel (FERRUM_CPU_PANELS) */
  int amx_rows;    /* fewest activation rows a K-quant panel matmul takes to the AMX tiles (cpu_amx.c); 0: never */
  size_t prefetch; /* bytes ahead of the weight row being dotted that matmul prefetches; attention then
                      prefetches each next KV block too (0: neither) */

  /* Step metadata, copied by step_begin into buffers grown as needed. */
  int n_tokens, n_seqs, max_blocks;
  int32_t *tokens, *positions, *slots; /* (n_tokens) */
  int32_t *tok_seq;                    /* (n_tokens) sequence of each token, -1 if none */
  int32_t *q_start;                    /* (n_seqs + 1) */
  int32_t *ctx_len;                    /* (n_seqs) */
  int32_t *block_tables;               /* (n_seqs, max_blocks) */
  size_t cap_tokens, cap_seqs, cap_bt;

  void *qbuf; /* quantized activations for matmul */
  size_t qbuf_cap;
  void *pbuf; /* matmul's activations in a weight's column order (kern_weight_t.perm) */
  size_t pbuf_cap;
  void *amx_buf; /* cpu_amx.c: activations in bf16, then each thread's unpacked panels */
  size_t amx_cap;
  uint64_t step_id; /* bumped by step_begin */
  float *rope_cs;   /* (n_tokens, n_rot) cos/sin table of rope */
  size_t rope_cap;
  uint64_t rope_step; /* the table is valid for this step and key */
  const void *rope_inv;
  int rope_n_rot;
  float rope_attn_factor;
  float *att_scratch; /* per thread: scores (block_size) + acc (head_dim) */
  size_t att_cap;
  void *moe_buf; /* moe_ffn's routing and expert rows (cpu_moe.c) */
  size_t moe_cap;
  struct cpu_comm *comm; /* the tensor-parallel group (cpu_comm.c), or NULL */
} cpu_ctx_t;

typedef struct cpu_comm cpu_comm_t;
int cpu__comm_init(void *vctx, const kern_comm_t *comm);
int cpu__all_reduce(void *vctx, void *buf, size_t n);
int cpu__gather_cols(void *vctx, void *out, const void *part, int n, int cols);
void cpu__comm_destroy(cpu_ctx_t *ctx);

int cpu__embed(void *vctx, void *out, const kern_weight_t *table);
int cpu__matmul(void *vctx, void *out, const kern_weight_t *w, const kern_weight_t *bias, const void *x, int n);
int cpu__rms_norm(void *vctx, void *out, const void *x, const kern_weight_t *w, int n, int dim, float eps);
int cpu__add_rms_norm(void *vctx, void *out, void *residual, const void *x, const kern_weight_t *w, int n, int dim,
                      float eps);
int cpu__rope(void *vctx, void *x, int n_heads, int head_dim, int row_stride, const kern_rope_t *rope);
int cpu__kv_append(void *vctx, kern_kv_pool_t *pool, int layer, const void *k, int k_stride, const void *v,
                   int v_stride);
int cpu__attention(void *vctx, void *out, const void *q, int q_stride, const kern_kv_pool_t *pool, int layer,
                   int n_heads, int head_dim, float scale, int window);
int cpu__silu_mul(void *vctx, void *out, const void *gate, const void *up, int n, int d, int stride);
int cpu__moe_ffn(void *vctx, void *out, const void *x, int n, const kern_moe_t *moe);
int cpu__add(void *vctx, void *out, const void *a, const void *b, size_t n);
int cpu__last_rows(void *vctx, void *out, const void *x, int dim);
int cpu__pool_rows(void *vctx, void *out, const void *x, int dim, kern_pool_t mode);
int cpu__layer_norm(void *vctx, void *out, const void *x, const kern_weight_t *w, const kern_weight_t *b, int n,
                    int dim, float eps);
int cpu__gelu(void *vctx, void *x, size_t n, bool erf_form);
int cpu__attention_full(void *vctx, void *out, const void *q, const void *k, const void *v, int n_heads, int head_dim,
                        float scale);

#ifdef __cplusplus
}
#endif
