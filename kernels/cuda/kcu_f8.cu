/* kcu_f8.cu - FP8 E4M3 matmul weights (--quantization fp8, vLLM's dynamic
 * FP8 on a bf16 checkpoint).
 *
 * A dense weight that only matmul reads (kern_weight_t.fp8) is quantized
 * once at load, a scale a row (KERN_F8R: max|w| / 448, kern_types.h's
 * reference). Its matmul up to f8_gemv_max_n rows of x is kcu_matmul.cu's
 * GEMV over the bytes (x as it is); past that, x is quantized the same way,
 * a scale a token, and cuBLASLt's FP8 GEMM runs on the tensor cores with
 * both vectors of scales (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F):
 * out[t][r] = sx[t] sw[r] sum_k qx[t][k] qw[r][k], summed in f32, then the
 * bias. The tokens go in chunks that fit the activation scratch.
 *
 * The GEMM takes cuBLASLt's FP8 fast accumulation, as vLLM's CUTLASS FP8
 * kernels do: the MMAs' accumulators carry the whole sum over k at the
 * tensor cores' reduced internal precision, instead of being added into
 * separate f32 registers every few k steps. Up to 13% faster a GEMM on an
 * H200 at 512-2048 tokens; FERRUM_CUDA_F8_FAST_ACCUM=0 turns it off
 * (docs/bench/gpu.md, session 57). KERN_F8B's GEMM has none (cuBLASLt
 * offers no such algorithm with block scales).
 *
 * Where cuBLASLt has no outer-vector scaling (before 12.9, or not sm_90:
 * Ada) or FERRUM_CUDA_F8_SCALES=tensor, the scales are per tensor instead
 * (f8_tensor; vLLM's default): one for a weight (every row's slot holds
 * it, so the GEMV reads them alike) and one for a matmul's activations,
 * from the absmax over all of them, and the GEMM scales by scalars.
 *
 * cuBLASLt's FP8 GEMMs run a multiple of 4 tokens here: its KERN_F8R GEMM
 * with outer-vector scales was 3% off at 9 tokens (cuBLAS 13.1, H200), and
 * it has no KERN_F8B GEMM at 5. A chunk of other counts is padded: its last
 * 1-3 rows of quantized x are zeros, and the GEMM writes as many rows of
 * out past n (kern_ops_t.matmul: callers leave that room).
 *
 * An FP8 checkpoint's layers come as they are in the file (kcu__f8_upload):
 * KERN_F8R where its scales cover whole rows (per tensor: the one scale in
 * every row's slot), KERN_F8B where they are 128 x 128 blocks. KERN_F8B's
 * GEMM quantizes x a scale per token and 128 columns, as vLLM does for such
 * files, and cuBLASLt scales by both blocks
 * (CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F for the weight,
 * VEC128_32F for x: sm_90, cuBLAS 12.9 and newer); the GEMV multiplies
 * each 16 weights' sum by their block's scale. */
#include <errno.h>

#include "common/fr_log.h"
#include "common/fr_util.h"
#include "kernels/cuda/kcu.cuh"

#define KCU_F8Q_NT 256             /* threads a row of the quantizer */
#define KCU_F8_X_BYTES (32u << 20) /* the GEMM's quantized activations: tokens x cols bytes a chunk */
#define KCU_F8_X_TOKENS 8192       /* most tokens a chunk */
#define KCU_F8_X_SCALES (KCU_F8_X_BYTES / 128) /* x8s's floats: a token's 128 columns each (> KCU_F8_X_TOKENS + 1) */
#define KCU_F8_BLOCK 128           /* KERN_F8B's block, and its activations' groups */
#define KCU_F8_PLANS 256           /* cuBLASLt plans kept, by shape (direct-mapped) */

/* A GEMM shape's layouts and the algorithm cuBLASLt's heuristic gave it. */
typedef struct kcu_f8_plan {
  int m, n, k; /* m < 0: empty */
  bool blk;    /* KERN_F8B's (lt_desc_b) */
  cublasLtMatrixLayout_t a, b, d;
  cublasLtMatmulAlgo_t algo;
} kcu_f8_plan_t;

/* Zeros into row blockIdx.x of q (cols bytes, 16-byte aligned): a row of
 * padding past x's rows. */
__device__ __forceinline__ void kcu_f8_zero_bytes(uint8_t *q, int cols) {
  uint4 *q16 = reinterpret_cast<uint4 *>(q + (size_t)blockIdx.x * cols);
  for (int i = threadIdx.x; i < cols / 16; i += blockDim.x) q16[i] = make_uint4(0, 0, 0, 0);
}

/* Row blockIdx.x of x (cols elements, cols % 16 == 0, 16-byte aligned) as
 * FP8 E4M3 bytes into q and its scale, as kern_fp8_quantize_row makes them
 * (the same operations, so the same bits); rows from x_rows on are
 * padding: zeros, scale 0. */
template <typename T>
__global__ void __launch_bounds__(KCU_F8Q_NT) kcu_f8_quant_k(uint8_t *q, float *scale, const T *x, int cols,
                                                            int x_rows, const float *tensor_max) {
  __shared__ float red[KCU_F8Q_NT / KCU_WARP];
  kcu_pdl_enter();
  const size_t row = blockIdx.x;
  if ((int)row >= x_rows) {
    kcu_f8_pad_row<KCU_F8Q_NT>(q, scale, cols / 8, row);
    return;
  }
  const uint4 *x4 = reinterpret_cast<const uint4 *>(x + row * cols);
  const int n8 = cols / 8;
  float m = 0.f, f[8];
  if (tensor_max) {
    m = *tensor_max;
  } else {
    for (int i = threadIdx.x; i < n8; i += KCU_F8Q_NT) {
      kcu_unpack8(x4[i], f, (const T *)0);
#pragma unroll
      for (int j = 0; j < 8; j++) m = fmaxf(m, fabsf(f[j]));
    }
    m = kcu_block_max<KCU_F8Q_NT>(m, red);
  }
  const float inv = m > 0.f ? 448.f / m : 0.f;
  if (threadIdx.x == 0) scale[row] = m / 448.f;
  uint2 *q8 = reinterpret_cast<uint2 *>(q + row * cols);
  for (int i = threadIdx.x; i < n8; i += KCU_F8Q_NT) {
    kcu_unpack8(x4[i], f, (const T *)0);
    q8[i] = kcu_f8_pack8(f, inv);
  }
}

/* Row blockIdx.x of x (cols elements, cols % 128 == 0, 16-byte aligned)
 * as FP8 E4M3 bytes into q, a scale per 128 columns: group g's at
 * scale[g * ld + row] (cuBLASLt's VEC128_32F layout), each group as
 * kern_fp8_quantize_row makes a row; rows from x_rows on are padding
 * (zeros, scales 0). Half a warp a group, 8 elements a lane; a warp's two
 * halves take groups side by side. */
template <typename T>
__global__ void __launch_bounds__(KCU_F8Q_NT) kcu_f8_quant_groups_k(uint8_t *q, float *scale, const T *x, int cols,
                                                                   int x_rows, int ld) {
  kcu_pdl_enter();
  const size_t row = blockIdx.x;
  const int warp = threadIdx.x / KCU_WARP, half = threadIdx.x / 16 % 2, lane = threadIdx.x % 16;
  const int groups = cols / KCU_F8_BLOCK;
  if ((int)row >= x_rows) {
    for (int g = threadIdx.x; g < groups; g += KCU_F8Q_NT) scale[(size_t)g * ld + row] = 0.f;
    kcu_f8_zero_bytes(q, cols);
    return;
  }
  for (int g0 = 2 * warp; g0 < groups; g0 += 2 * (KCU_F8Q_NT / KCU_WARP)) {
    const int g = g0 + half;
    const bool on = g < groups;
    const size_t off = row * cols + (size_t)g * KCU_F8_BLOCK + lane * 8;
    float f[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f}, m = 0.f;
    if (on) kcu_unpack8(*reinterpret_cast<const uint4 *>(x + off), f, (const T *)0);
#pragma unroll
    for (int j = 0; j < 8; j++) m = fmaxf(m, fabsf(f[j]));
#pragma unroll
    for (int o = 8; o; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (!on) continue;
    const float inv = m > 0.f ? 448.f / m : 0.f;
    if (lane == 0) scale[(size_t)g * ld + row] = m / 448.f;
    *reinterpret_cast<uint2 *>(q + off) = kcu_f8_pack8(f, inv);
  }
}

/* max|x| over n8 chunks of 8 elements into *max_bits (zeroed before; f32
 * bits: non-negative floats order as their bits). */
template <typename T>
__global__ void __launch_bounds__(KCU_F8Q_NT) kcu_f8_absmax_k(unsigned *max_bits, const T *x, long long n8) {
  __shared__ float red[KCU_F8Q_NT / KCU_WARP];
  kcu_pdl_enter();
  const uint4 *x4 = reinterpret_cast<const uint4 *>(x);
  float m = 0.f, f[8];
  for (long long i = blockIdx.x * (long long)KCU_F8Q_NT + threadIdx.x; i < n8; i += (long long)gridDim.x * KCU_F8Q_NT) {
    kcu_unpack8(x4[i], f, (const T *)0);
#pragma unroll
    for (int j = 0; j < 8; j++) m = fmaxf(m, fabsf(f[j]));
  }
  m = kcu_block_max<KCU_F8Q_NT>(m, red);
  if (threadIdx.x == 0) atomicMax(max_bits, __float_as_uint(m));
}

/* Queues the quantization of rows (cols each) of src into q and scale: a
 * scale a row, or (f8_tensor) one for them all, every row's slot; then
 * pad rows of zeros. */
static int kcu_f8_quant_rows(kcu_ctx_t *c, uint8_t *q, float *scale, const void *src, int rows, int cols, int pad) {
  float *tmax = c->f8_tensor ? c->x8s + KCU_F8_X_TOKENS : NULL;
  if (tmax) {
    const long long n8 = (long long)rows * cols / 8;
    const int grid = (int)FR_MIN((long long)c->n_sm * 4, kcu_div_up(n8, KCU_F8Q_NT));
    KCU_CHECK(cudaMemsetAsync(tmax, 0, sizeof(float), c->stream));
    KCU_ACT_DISPATCH(c, KCU_LAUNCH(c, kcu_f8_absmax_k<T>, grid, KCU_F8Q_NT, 0, (unsigned *)tmax, (const T *)src, n8));
  }
  KCU_ACT_DISPATCH(c, KCU_LAUNCH(c, kcu_f8_quant_k<T>, rows + pad, KCU_F8Q_NT, 0, q, scale, (const T *)src, cols,
                                 rows, (const float *)tmax));
  return 0;
}

static int kcu_f8_plan(kcu_ctx_t *c, bool blk, int m, int n, int k, kcu_f8_plan_t **out);

/* Tokens a chunk of the GEMM over k columns (a multiple of 4). */
static int kcu_f8_chunk(int k) { return (int)FR_MIN((size_t)KCU_F8_X_TOKENS, KCU_F8_X_BYTES / (size_t)k) & ~3; }

/* ---- the FP8 twin ----
 * A KERN_F8R GEMM over more than f8_gemv_max_n tokens quantizes its
 * activations first: a kernel that reads them and writes x8 / x8s, 4 of
 * the 7 kernels of a Llama layer's decode step at batch 256 that are not
 * GEMMs or attention. Where the GEMM's input is the output of an RMS norm
 * (q/k/v, gate/up) or of silu_mul (down), that kernel writes the twin as
 * well, from the values it holds, and the GEMM takes it as it is. The
 * twin is the quantizer's bits (kcu_f8_twin_row), so the GEMM's result is
 * the same either way. It holds while nothing else is written: it is
 * for the x it was made from, its rows and columns, and no kernel launched
 * since (a cuBLAS GEMM, a copy or NCCL call drops it, kcu__x8_drop). A GEMM
 * that quantizes x itself leaves the twin of x too, for a second weight
 * over the same x. */

bool kcu__x8_want(const kcu_ctx_t *c, int n, int cols) {
  return c->x8_fuse && c->f8r && !c->f8_tensor && n > c->f8_gemv_max_n && cols % 16 == 0 &&
         kcu__x8_rows(n) <= kcu_f8_chunk(cols);
}

void kcu__x8_made(kcu_ctx_t *c, const void *src, int n, int cols) {
  c->x8_twin.src = src, c->x8_twin.rows = n, c->x8_twin.cols = cols, c->x8_twin.at = c->launches;
}

static bool kcu_x8_twin_of(const kcu_ctx_t *c, const void *x, int n, int cols) {
  return c->x8_twin.src == x && c->x8_twin.rows == n && c->x8_twin.cols == cols && c->x8_twin.at == c->launches;
}

/* The descriptor's scale modes: vectors, or scalars (f8_tensor). */
static int kcu_f8_scale_modes(kcu_ctx_t *c) {
  const int32_t mode = c->f8_tensor ? CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F : CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
  KCU_CUBLAS(cublasLtMatmulDescSetAttribute(c->lt_desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode));
  KCU_CUBLAS(cublasLtMatmulDescSetAttribute(c->lt_desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode));
  return 0;
}

/* The cuBLASLt handle, the GEMM's descriptor (A transposed: the weight's
 * rows; scale vectors, or scalars where cuBLASLt refuses vectors), its
 * activation scratch and plans. */
static int kcu_f8_make(kcu_ctx_t *c) {
  KCU_CUBLAS(cublasLtCreate(&c->lt));
  KCU_CUBLAS(cublasLtMatmulDescCreate(&c->lt_desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  KCU_CUBLAS(cublasLtMatmulDescSetAttribute(c->lt_desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  KCU_CUBLAS(cublasLtMatmulDescSetAttribute(c->lt_desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  const int8_t fast = (int8_t)c->f8_fast; /* the file's head comment */
  KCU_CUBLAS(cublasLtMatmulDescSetAttribute(c->lt_desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
  c->f8_plans = (kcu_f8_plan_t *)fr_calloc(KCU_F8_PLANS, sizeof *c->f8_plans);
  for (int i = 0; i < KCU_F8_PLANS; i++) c->f8_plans[i].m = -1;
  int rc = kcu__alloc(c, KCU_F8_X_BYTES, (void **)&c->x8, "the FP8 GEMM's activations");
  if (!rc) rc = kcu__alloc(c, KCU_F8_X_SCALES * sizeof(float), (void **)&c->x8s, "the FP8 GEMM's scales");
  if (rc) return rc;
  /* scale pointers are never NULL (the heuristic checks them); each GEMM sets its own */
  KCU_CUBLAS(cublasLtMatmulDescSetAttribute(c->lt_desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &c->x8s, sizeof c->x8s));
  KCU_CUBLAS(cublasLtMatmulDescSetAttribute(c->lt_desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &c->x8s, sizeof c->x8s));
  if ((rc = kcu_f8_scale_modes(c))) return rc;
  kcu_f8_plan_t *p;
  if (c->f8_tensor || kcu_f8_plan(c, false, 4096, 64, 4096, &p) == 0) return 0;
  FR_LOGI("cuda: cuBLASLt has no FP8 GEMM with a scale per row and per token here (%s): FP8 scales per tensor",
          fr_last_error());
  c->f8_tensor = 1;
  return kcu_f8_scale_modes(c);
}

/* Made with the first FP8 weight; on failure nothing is left. */
static int kcu_f8_init(kcu_ctx_t *c) {
  if (c->lt) return 0;
  int rc = kcu_f8_make(c);
  if (rc) kcu__f8_destroy(c);
  return rc;
}

/* KERN_F8B's descriptor, made with the first such weight: A (the weight,
 * transposed) by 128 x 128 blocks, B (x) by 128 columns of a token. */
static int kcu_f8b_init(kcu_ctx_t *c) {
  if (c->lt_desc_b) return 0;
  cublasLtMatmulDesc_t d = NULL;
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  const int32_t am = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, bm = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  cublasStatus_t st = cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &am, sizeof am);
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bm, sizeof bm);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &c->x8s, sizeof c->x8s);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &c->x8s, sizeof c->x8s);
  if (st != CUBLAS_STATUS_SUCCESS) {
    if (d) cublasLtMatmulDescDestroy(d);
    return fr_errorf(FR_EUNSUPPORTED, "cuda: cuBLASLt has no FP8 GEMM by 128 x 128 blocks here (%s)",
                     cublasGetStatusString(st));
  }
  c->lt_desc_b = d;
  return 0;
}

static void kcu_f8_plan_clear(kcu_f8_plan_t *p) {
  if (p->a) cublasLtMatrixLayoutDestroy(p->a);
  if (p->b) cublasLtMatrixLayoutDestroy(p->b);
  if (p->d) cublasLtMatrixLayoutDestroy(p->d);
  *p = (kcu_f8_plan_t){.m = -1};
}

void kcu__f8_destroy(kcu_ctx_t *c) {
  for (int i = 0; c->f8_plans && i < KCU_F8_PLANS; i++) kcu_f8_plan_clear(&c->f8_plans[i]);
  free(c->f8_plans);
  if (c->lt_desc) cublasLtMatmulDescDestroy(c->lt_desc);
  if (c->lt_desc_b) cublasLtMatmulDescDestroy(c->lt_desc_b);
  if (c->lt) cublasLtDestroy(c->lt);
  kcu__free(c->x8);
  kcu__free(c->x8s);
  c->f8_plans = NULL;
  c->lt_desc = NULL;
  c->lt_desc_b = NULL;
  c->lt = NULL;
  c->x8 = NULL;
  c->x8s = NULL;
}

/* The plan of an (m weight rows, n tokens, k columns) GEMM (blk: KERN_F8B's),
 * made by cuBLASLt's heuristic the first time the shape is seen (a host
 * call, so also inside a graph capture). */
static int kcu_f8_plan(kcu_ctx_t *c, bool blk, int m, int n, int k, kcu_f8_plan_t **out) {
  const unsigned h =
      ((unsigned)m * 73856093u ^ (unsigned)n * 19349663u ^ (unsigned)k * 83492791u ^ (unsigned)blk * 2654435761u) %
      KCU_F8_PLANS;
  kcu_f8_plan_t *p = &c->f8_plans[h];
  *out = p;
  if (p->m == m && p->n == n && p->k == k && p->blk == blk) return 0;
  kcu_f8_plan_clear(p);
  const cudaDataType_t dt = c->act == KERN_BF16 ? CUDA_R_16BF : CUDA_R_16F;
  KCU_CUBLAS(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_8F_E4M3, k, m, k));
  KCU_CUBLAS(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_8F_E4M3, k, n, k));
  KCU_CUBLAS(cublasLtMatrixLayoutCreate(&p->d, dt, m, n, m));
  cublasLtMatmulPreference_t pref;
  KCU_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = KCU_CUBLAS_WS_BYTES;
  cublasLtMatmulHeuristicResult_t res;
  int got = 0;
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                           sizeof ws);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoGetHeuristic(c->lt, blk ? c->lt_desc_b : c->lt_desc, p->a, p->b, p->d, p->d, pref, 1, &res,
                                        &got);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || got == 0) {
    kcu_f8_plan_clear(p);
    return fr_errorf(FR_EUNSUPPORTED, "cuda: cuBLASLt has no FP8 GEMM with %s for %d x %d x %d (%s)",
                     blk ? "128 x 128 weight blocks" : c->f8_tensor ? "tensor scales" : "a scale a row and a token", m,
                     n, k, st != CUBLAS_STATUS_SUCCESS ? cublasGetStatusString(st) : "no algorithm");
  }
  p->algo = res.algo;
  p->m = m, p->n = n, p->k = k, p->blk = blk;
  return 0;
}

int kcu__f8_quantize(kcu_ctx_t *c, kern_weight_t *w, const void *src, const char *what) {
  if (w->cols % 16 || w->cols > INT32_MAX || w->rows > INT32_MAX)
    return fr_errorf(FR_EUNSUPPORTED, "cuda: an FP8 weight needs a multiple of 16 columns (%s)", what);
  int rc = kcu_f8_init(c);
  if (rc) return rc;
  /* the GEMM must exist for this weight's shape: a clear error at load, not at the first prompt */
  kcu_f8_plan_t *p;
  if ((rc = kcu_f8_plan(c, false, (int)w->rows, 64, (int)w->cols, &p))) return rc;
  const size_t bytes = (size_t)w->rows * (size_t)w->cols + (size_t)w->rows * sizeof(float);
  if ((rc = kcu__alloc(c, bytes, &w->data, what))) return rc;
  rc = kcu_f8_quant_rows(c, (uint8_t *)w->data, (float *)kcu_f8_scales(w), src, (int)w->rows, (int)w->cols, 0);
  if (!rc) KCU_CHECK(cudaStreamSynchronize(c->stream)); /* src is freed next */
  c->f8r = c->f8r || !rc;
  return rc;
}

/* Whether this device runs a KERN_F8R weight's scales (host, one a row)
 * as they are: always, but where its GEMM scales by tensor (f8_tensor) and
 * they differ. */
static bool kcu_f8r_fits(const kcu_ctx_t *c, const kern_weight_t *w, const float *scales) {
  for (int64_t r = 1; c->f8_tensor && r < w->rows; r++)
    if (scales[r] != scales[0]) return false;
  return true;
}

int kcu__f8_upload(kcu_ctx_t *c, kern_weight_t *w, const void *host, const char *what) {
  const bool blk = w->type == KERN_F8B;
  if (!host) return fr_errorf(FR_EUNSUPPORTED, "cuda: an FP8 checkpoint's weight must come from host memory");
  if (w->cols % 16 || w->cols > INT32_MAX || w->rows > INT32_MAX || w->row_bytes != (size_t)w->cols ||
      (blk && (w->rows % KCU_F8_BLOCK || w->cols % KCU_F8_BLOCK)))
    return fr_errorf(FR_EUNSUPPORTED, "cuda: an FP8 weight of %lld x %lld (%s) needs %s", (long long)w->rows,
                     (long long)w->cols, what, blk ? "rows and columns in whole 128 x 128 blocks" : "a multiple of 16 "
                     "columns");
  int rc = kcu_f8_init(c);
  if (!rc && blk) rc = kcu_f8b_init(c);
  if (rc) return rc;
  const size_t nbytes = (size_t)w->rows * (size_t)w->cols, sbytes = kern_f8_scale_bytes(w->type, w->rows, w->cols);
  if (!blk && !kcu_f8r_fits(c, w, (const float *)((const uint8_t *)host + nbytes)))
    return fr_errorf(FR_EUNSUPPORTED, "cuda: this device's FP8 GEMM scales by tensor, and %s has a scale a row", what);
  kcu_f8_plan_t *p; /* the GEMM must exist for this weight's shape: a clear error at load */
  if ((rc = kcu_f8_plan(c, blk, (int)w->rows, 64, (int)w->cols, &p))) return rc;
  if ((rc = kcu__alloc(c, nbytes + sbytes, &w->data, what))) return rc;
  cudaError_t e = cudaMemcpyAsync(w->data, host, nbytes + sbytes, cudaMemcpyHostToDevice, c->stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream); /* host is freed next */
  if (e != cudaSuccess) {
    kcu__free(w->data);
    w->data = NULL;
    return fr_errorf(FR_ECUDA, "cuda: copying %s: %s", what, cudaGetErrorString(e));
  }
  c->f8r = c->f8r || !blk;
  return 0;
}

int kcu__f8_gemm(kcu_ctx_t *c, void *out, const kern_weight_t *w, const float *bias, const void *x, int n) {
  const int m = (int)w->rows, k = (int)w->cols;
  const bool blk = w->type == KERN_F8B;
  if (!c->lt || (blk && !c->lt_desc_b)) return fr_errorf(FR_ESTATE, "cuda: an FP8 matmul with no FP8 weight loaded");
  if ((uintptr_t)x & 15) return fr_errorf(-EINVAL, "cuda: an FP8 matmul's input is not 16-byte aligned");
  cublasLtMatmulDesc_t desc = blk ? c->lt_desc_b : c->lt_desc;
  const float *sw = kcu_f8_scales(w);
  KCU_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sw, sizeof sw));
  KCU_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &c->x8s, sizeof c->x8s));
  const int chunk = kcu_f8_chunk(k);
  const float one = 1.f, zero = 0.f;
  for (int t0 = 0; t0 < n; t0 += chunk) {
    const int nt = FR_MIN(chunk, n - t0), np = kcu__x8_rows(nt); /* np - nt rows of padding (the header) */
    const void *xt = (const char *)x + (size_t)t0 * k * c->act_size;
    kcu_f8_plan_t *p;
    int rc = 0;
    if (blk) {
      KCU_ACT_DISPATCH(c, KCU_LAUNCH(c, kcu_f8_quant_groups_k<T>, np, KCU_F8Q_NT, 0, c->x8, c->x8s, (const T *)xt, k,
                                     nt, np));
    } else if (kcu_x8_twin_of(c, xt, nt, k)) {
      c->x8_hits++;
    } else {
      rc = kcu_f8_quant_rows(c, c->x8, c->x8s, xt, nt, k, np - nt);
      if (!rc) kcu__x8_made(c, xt, nt, k);
    }
    if (rc || (rc = kcu_f8_plan(c, blk, m, np, k, &p))) return rc;
    char *o = (char *)out + (size_t)t0 * m * c->act_size;
    KCU_CUBLAS(cublasLtMatmul(c->lt, desc, &one, w->data, p->a, c->x8, p->b, &zero, o, p->d, o, p->d, &p->algo,
                              c->cublas_ws, KCU_CUBLAS_WS_BYTES, c->stream));
    const char *ts = (const char *)c->x8_twin.src;
    if (ts && ts < o + (size_t)np * m * c->act_size && o < ts + (size_t)c->x8_twin.rows * c->x8_twin.cols * c->act_size)
      kcu__x8_drop(c); /* this GEMM wrote over the twin's x */
  }
  return bias ? kcu__add_bias(c, out, bias, n, m) : 0;
}
