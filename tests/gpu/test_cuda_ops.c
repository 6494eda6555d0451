/* test_cuda_ops.c - every op of the CUDA backend against the CPU backend
 * (and, for matmul and sampling, against exact host references), on fresh
 * random inputs each run, by normalized error ||out - ref|| / ||ref||.
 * Outputs are poisoned with NaN before each op so unwritten elements fail.
 *
 * Exits 77 (skipped) when built without CUDA or when no CUDA device is
 * present. The device probe runs in a child process: a CUDA context must not
 * exist in the parent before Check forks the tests. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "kernels/kern.h"
#include "tests/gpu/gpu_main.h"
#include "model/sampler.h"
#include "tests/common/forward_rows.h"

#define TOL_ACT 1.5e-2 /* bf16 activations */
#define KCU_TEST_F8_GEMV_MAX_N 8 /* FERRUM_CUDA_F8_GEMV_MAX_N test_matmul_fp8 sets: n above it takes the FP8 GEMM */
#define TOL_QMM 2.5e-2 /* quantized weights: the decode GEMV also rounds activations to int8 per 32 */

static kern_backend_t *cpu, *gpu;
static uint64_t rng_state;

static void setup(void) {
  rng_state = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
  ck_assert_int_eq(kern_cpu_create(&cpu, 2), 0);
  int rc = kern_cuda_create(&gpu, 0);
  ck_assert_msg(rc == 0, "kern_cuda_create: %s", fr_last_error());
}

static void teardown(void) {
  kern_backend_destroy(gpu);
  kern_backend_destroy(cpu);
  gpu = cpu = NULL;
}

/* ---- helpers ---------------------------------------------------------------------- */

static uint64_t rnd64(void) {
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static float rndu(void) { return (float)((rnd64() >> 40) * (1.0 / 16777216.0)); }
static float rndn(void) { return (rndu() + rndu() + rndu() - 1.5f) * 2.f; }
static int rndi(int n) { return (int)(rnd64() % (uint64_t)n); }

/* Rounds to the GPU's activation type so both backends see the same values. */
static float round_act(float x) {
  return gpu->act_type == KERN_BF16 ? fr_bf16_to_fp32(fr_fp32_to_bf16(x)) : fr_fp16_to_fp32(fr_fp32_to_fp16(x));
}

static float *rand_vec(size_t n, float scale) {
  float *x = fr_malloc(n * sizeof(float) + 4);
  for (size_t i = 0; i < n; i++) x[i] = round_act(rndn() * scale);
  return x;
}

/* A tensor on both backends: CPU f32, GPU act type. */
typedef struct {
  void *c, *g;
  size_t n;
} pair_t;

static void *gpu_put(const float *x, size_t n) {
  uint16_t *h = fr_malloc(n * 2 + 2);
  for (size_t i = 0; i < n; i++)
    h[i] = gpu->act_type == KERN_BF16 ? fr_fp32_to_bf16(x[i]) : fr_fp32_to_fp16(x[i]);
  void *d = NULL;
  ck_assert_int_eq(gpu->ops->alloc(gpu->ctx, n * 2 + 16, &d), 0);
  ck_assert_int_eq(gpu->ops->upload(gpu->ctx, d, h, n * 2), 0);
  free(h);
  return d;
}

static pair_t pair_put(const float *x, size_t n) {
  pair_t p = {NULL, NULL, n};
  ck_assert_int_eq(cpu->ops->alloc(cpu->ctx, n * 4 + 16, &p.c), 0);
  ck_assert_int_eq(cpu->ops->upload(cpu->ctx, p.c, x, n * 4), 0);
  p.g = gpu_put(x, n);
  return p;
}

static pair_t pair_rand(size_t n, float scale) {
  float *x = rand_vec(n, scale);
  pair_t p = pair_put(x, n);
  free(x);
  return p;
}

static void pair_free(pair_t *p) {
  cpu->ops->free(cpu->ctx, p->c);
  gpu->ops->free(gpu->ctx, p->g);
}

/* NaN in every element of a GPU act buffer (0xFFFF is NaN in bf16 and f16). */
static void poison(void *g, size_t n) {
  uint16_t *h = fr_malloc(n * 2 + 2);
  memset(h, 0xff, n * 2);
  ck_assert_int_eq(gpu->ops->upload(gpu->ctx, g, h, n * 2), 0);
  free(h);
}

/* Two GPU buffers of `bytes` bytes, bit for bit. */
static void expect_same_bits(const void *a, const void *b, size_t bytes, const char *what) {
  uint8_t *ha = fr_malloc(bytes + 1), *hb = fr_malloc(bytes + 1);
  ck_assert_int_eq(gpu->ops->download(gpu->ctx, ha, a, bytes), 0);
  ck_assert_int_eq(gpu->ops->download(gpu->ctx, hb, b, bytes), 0);
  size_t i = 0;
  while (i < bytes && ha[i] == hb[i]) i++;
  ck_assert_msg(i == bytes, "%s: byte %zu of %zu differs", what, i, bytes);
  free(ha);
  free(hb);
}

static float *gpu_get(const void *g, size_t n) {
  float *o = fr_malloc(n * 4 + 4);
  int rc = gpu->ops->to_f32_host(gpu->ctx, o, g, n);
  ck_assert_msg(rc == 0, "to_f32_host: %s", fr_last_error());
  return o;
}

static float *cpu_get(const void *c, size_t n) {
  float *o = fr_malloc(n * 4 + 4);
  ck_assert_int_eq(cpu->ops->to_f32_host(cpu->ctx, o, c, n), 0);
  return o;
}

static double nerr_d(const float *out, const double *ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(out[i])) return INFINITY;
    num += (out[i] - ref[i]) * (out[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

static double nerr(const float *out, const float *ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(out[i])) return INFINITY;
    num += ((double)out[i] - ref[i]) * ((double)out[i] - ref[i]);
    den += (double)ref[i] * ref[i];
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Compares the GPU buffer with the CPU buffer (n elements). */
static double cmp_pair(const pair_t *p, size_t n, const char *what) {
  float *a = gpu_get(p->g, n), *b = cpu_get(p->c, n);
  double e = nerr(a, b, n);
  fprintf(stderr, "  %-40s err %.2e\n", what, e);
  free(a);
  free(b);
  return e;
}

/* A weight loaded on both backends from the same host bytes. */
typedef struct {
  kern_weight_t c, g;
  void *host;
} wpair_t;

/* keep_layout: kern_weight_t's (true for embedding tables and experts,
 * which ops other than matmul read); perm and x_cols: a permuted weight's
 * (NULL and 0: none). */
static void wpair_load_as(wpair_t *w, kern_type_t type, int64_t rows, int64_t cols, void *host, bool keep_layout,
                          const int32_t *perm, int64_t x_cols) {
  memset(w, 0, sizeof(*w));
  w->host = host;
  kern_weight_t base = {.type = type, .rows = rows, .cols = cols, .row_bytes = kern_row_bytes(type, cols),
                        .perm = perm, .x_cols = x_cols, .keep_layout = keep_layout};
  w->c = w->g = base;
  int rc = cpu->ops->weight_load(cpu->ctx, &w->c, host);
  ck_assert_msg(rc == 0, "cpu weight_load: %s", fr_last_error());
  rc = gpu->ops->weight_load(gpu->ctx, &w->g, host);
  ck_assert_msg(rc == 0, "cuda weight_load: %s", fr_last_error());
}

/* A matmul's weight (the backend may repack it). */
static void wpair_load(wpair_t *w, kern_type_t type, int64_t rows, int64_t cols, void *host) {
  wpair_load_as(w, type, rows, cols, host, false, NULL, 0);
}

/* A weight read by rows or blocks: an embedding table, an expert. */
static void wpair_load_kept(wpair_t *w, kern_type_t type, int64_t rows, int64_t cols, void *host) {
  wpair_load_as(w, type, rows, cols, host, true, NULL, 0);
}

static void wpair_free(wpair_t *w) {
  cpu->ops->weight_release(cpu->ctx, &w->c);
  gpu->ops->weight_release(gpu->ctx, &w->g);
  free(w->host);
}

/* Blocks of a row that share rand_weight's I4G (d, m): 1, or 4 (GPTQ's
 * group of 128 columns, which CUDA stores as KERN_Q4G). */
static int i4g_run = 1;

/* Random weight bytes of any type; quant blocks get sane f16 scales. */
static void *rand_weight(kern_type_t type, int64_t rows, int64_t cols) {
  size_t rb = kern_row_bytes(type, cols), nb = rb * (size_t)rows;
  uint8_t *h = fr_malloc(nb + 16);
  const kern_type_traits_t *tr = kern_type_traits(type);
  if (!tr->quantized) {
    for (int64_t i = 0; i < rows * cols; i++) {
      float v = rndn() * 0.5f;
      if (type == KERN_F32) memcpy(h + 4 * i, &v, 4);
      else {
        uint16_t u = type == KERN_F16 ? fr_fp32_to_fp16(v) : fr_fp32_to_bf16(v);
        memcpy(h + 2 * i, &u, 2);
      }
    }
    return h;
  }
  for (size_t i = 0; i < nb; i++) h[i] = (uint8_t)rnd64();
  int offs[2] = {-1, -1};
  switch (type) {
  case KERN_Q4_0: case KERN_Q5_0: case KERN_Q8_0: offs[0] = 0; break;
  case KERN_Q4_1: case KERN_Q5_1: case KERN_Q4_K: case KERN_Q5_K: offs[0] = 0; offs[1] = 2; break;
  case KERN_Q6_K: offs[0] = 208; break;
  case KERN_I4G: { /* f32 d and m = -d * zero, as GPTQ's repacking makes them */
    float dm[2] = {0.f, 0.f};
    for (size_t b = 0; b < nb / (size_t)tr->size; b++) {
      if (b % (size_t)(cols / 32) % (size_t)i4g_run == 0)
        dm[0] = (0.5f + rndu()) * 0.02f, dm[1] = -dm[0] * (float)rndi(16);
      memcpy(h + b * tr->size, dm, sizeof dm);
    }
    break;
  }
  default: break;
  }
  for (size_t b = 0; b < nb / (size_t)tr->size; b++) {
    for (int k = 0; k < 2; k++) {
      if (offs[k] < 0) continue;
      uint16_t u = fr_fp32_to_fp16((0.5f + rndu()) * 0.02f * (k ? 0.5f : 1.f));
      memcpy(h + b * tr->size + offs[k], &u, 2);
    }
  }
  return h;
}

/* A step on both backends. */
static void step_both(const kern_step_t *s) {
  int rc = cpu->ops->step_begin(cpu->ctx, s);
  ck_assert_msg(rc == 0, "cpu step_begin: %s", fr_last_error());
  rc = gpu->ops->step_begin(gpu->ctx, s);
  ck_assert_msg(rc == 0, "cuda step_begin: %s", fr_last_error());
}

/* One sequence of n tokens at positions 0..n-1 (for ops that need no KV). */
static void simple_step(int n, const int32_t *tokens) {
  int32_t *pos = fr_malloc(n * 4 + 4), *slots = fr_malloc(n * 4 + 4);
  for (int i = 0; i < n; i++) {
    pos[i] = rndi(8000);
    slots[i] = -1;
  }
  int32_t qs[2] = {0, n}, cl[1] = {n}, bt[1] = {0};
  kern_step_t s = {.n_tokens = n, .tokens = tokens, .n_seqs = 1, .positions = pos, .slots = slots,
                   .q_start = qs, .ctx_len = cl, .block_tables = bt, .max_blocks = 1};
  step_both(&s);
  free(pos);
  free(slots);
}

/* ---- matmul ------------------------------------------------------------------------- */

static const int k_ns[] = {1, 2, 4, 7, 16, 40, 64, 100, 300};

/* Exact reference: out[b][r] = sum_k deq(W)[r][k] * x[b][perm[k]] (+ bias)
 * in f64 (perm NULL: the identity; perm[k] -1: column k is padding), x
 * (n, x_cols) (x_cols 0: cols). */
static double *matmul_ref_x(kern_type_t type, const void *host, int64_t rows, int64_t cols, const float *x, int n,
                            const float *bias, const int32_t *perm, int64_t x_cols) {
  const int64_t xc = x_cols ? x_cols : cols;
  double *ref = fr_malloc(sizeof(double) * (size_t)n * rows);
  float *wr = fr_malloc(sizeof(float) * cols);
  size_t rb = kern_row_bytes(type, cols);
  for (int64_t r = 0; r < rows; r++) {
    const uint8_t *src = (const uint8_t *)host + rb * r;
    if (type == KERN_F32) memcpy(wr, src, cols * 4);
    else if (type == KERN_F16 || type == KERN_BF16)
      for (int64_t k = 0; k < cols; k++) {
        uint16_t u;
        memcpy(&u, src + 2 * k, 2);
        wr[k] = type == KERN_F16 ? fr_fp16_to_fp32(u) : fr_bf16_to_fp32(u);
      }
    else kern_dequantize_row(type, src, wr, cols);
    for (int b = 0; b < n; b++) {
      double acc = bias ? bias[r] : 0;
      for (int64_t k = 0; k < cols; k++)
        if (!perm || perm[k] >= 0) acc += (double)wr[k] * x[(size_t)b * xc + (perm ? perm[k] : k)];
      ref[(size_t)b * rows + r] = acc;
    }
  }
  free(wr);
  return ref;
}

static double *matmul_ref(kern_type_t type, const void *host, int64_t rows, int64_t cols, const float *x, int n,
                          const float *bias, const int32_t *perm) {
  return matmul_ref_x(type, host, rows, cols, x, n, bias, perm, 0);
}

/* matmul of a random (rows, cols) weight of type, its columns permuted by
 * perm (or NULL) over inputs of x_cols (0: cols), on both backends for
 * every n of k_ns up to max_n. */
static void check_matmul_px(kern_type_t type, int64_t rows, int64_t cols, bool with_bias, int max_n,
                            const int32_t *perm, int64_t x_cols) {
  const int64_t xc = x_cols ? x_cols : cols;
  wpair_t w;
  wpair_load_as(&w, type, rows, cols, rand_weight(type, rows, cols), false, perm, x_cols);
  float *bias_h = NULL;
  wpair_t bw;
  if (with_bias) {
    bias_h = rand_vec(rows, 1.f);
    float *bcopy = fr_malloc(rows * 4);
    memcpy(bcopy, bias_h, rows * 4);
    wpair_load(&bw, KERN_F32, 1, rows, bcopy);
  }
  for (size_t i = 0; i < FR_ARRAY_SIZE(k_ns); i++) {
    int n = k_ns[i];
    if (n > max_n) continue;
    float *x = rand_vec((size_t)n * xc, 1.f);
    pair_t px = pair_put(x, (size_t)n * xc);
    pair_t po = {NULL, NULL, 0};
    ck_assert_int_eq(cpu->ops->alloc(cpu->ctx, (size_t)n * rows * 4, &po.c), 0);
    ck_assert_int_eq(gpu->ops->alloc(gpu->ctx, (size_t)n * rows * 2, &po.g), 0);
    poison(po.g, (size_t)n * rows);
    int rc = gpu->ops->matmul(gpu->ctx, po.g, &w.g, with_bias ? &bw.g : NULL, px.g, n);
    ck_assert_msg(rc == 0, "cuda matmul: %s", fr_last_error());
    rc = cpu->ops->matmul(cpu->ctx, po.c, &w.c, with_bias ? &bw.c : NULL, px.c, n);
    ck_assert_msg(rc == 0, "cpu matmul: %s", fr_last_error());
    double *ref = matmul_ref_x(type, w.host, rows, cols, x, n, bias_h, perm, x_cols);
    float *g = gpu_get(po.g, (size_t)n * rows), *c = cpu_get(po.c, (size_t)n * rows);
    double eg = nerr_d(g, ref, (size_t)n * rows), ec = nerr(g, c, (size_t)n * rows);
    fprintf(stderr, "  matmul %-5s %4lldx%-5lld n=%-3d bias=%d perm=%d  err(exact) %.2e  err(cpu) %.2e\n",
            kern_type_traits(type)->name, (long long)rows, (long long)cols, n, with_bias, perm != NULL, eg, ec);
    double tol = kern_type_traits(type)->quantized ? TOL_QMM : TOL_ACT;
    ck_assert_msg(eg < tol, "matmul %s n=%d: error %.3e vs exact", kern_type_traits(type)->name, n, eg);
    ck_assert_msg(ec < 2 * tol, "matmul %s n=%d: error %.3e vs cpu", kern_type_traits(type)->name, n, ec);
    free(ref);
    free(g);
    free(c);
    free(x);
    pair_free(&px);
    pair_free(&po);
  }
  if (with_bias) {
    wpair_free(&bw);
    free(bias_h);
  }
  wpair_free(&w);
}

static void check_matmul_perm(kern_type_t type, int64_t rows, int64_t cols, bool with_bias, int max_n,
                              const int32_t *perm) {
  check_matmul_px(type, rows, cols, with_bias, max_n, perm, 0);
}

static void check_matmul_n(kern_type_t type, int64_t rows, int64_t cols, bool with_bias, int max_n) {
  check_matmul_perm(type, rows, cols, with_bias, max_n, NULL);
}

/* Recreates the CUDA backend with GEMV kernels for every n <= 8 (by
 * default larger n go to cuBLAS / cuBLASLt), so both paths are checked. */
static void gpu_all_gemv(void) {
  kern_backend_destroy(gpu);
  setenv("FERRUM_CUDA_GEMV_MAX_N", "8", 1);
  setenv("FERRUM_CUDA_QGEMV_MAX_N", "8", 1);
  setenv("FERRUM_CUDA_F8_GEMV_MAX_N", "8", 1);
  ck_assert_int_eq(kern_cuda_create(&gpu, 0), 0);
}

static void check_matmul(kern_type_t type, int64_t rows, int64_t cols, bool with_bias) {
  check_matmul_n(type, rows, cols, with_bias, 1 << 30);
}

START_TEST(test_matmul_dense) {
  check_matmul(KERN_BF16, 300, 512, false);
  check_matmul(KERN_F16, 257, 576, true);
  check_matmul(KERN_F32, 128, 264, false);
  gpu_all_gemv();
  check_matmul_n(KERN_BF16, 300, 512, true, 8);
  check_matmul_n(KERN_F16, 257, 576, false, 8);
}
END_TEST

static const kern_type_t k_quant[] = {KERN_Q4_0, KERN_Q4_1, KERN_Q5_0, KERN_Q5_1, KERN_Q8_0,
                                      KERN_Q4_K, KERN_Q5_K, KERN_Q6_K, KERN_I4G};

START_TEST(test_matmul_quant) {
  kern_type_t t = k_quant[_i];
  check_matmul(t, 200, 512, _i % 2 == 1);
  gpu_all_gemv();
  check_matmul_n(t, 200, 512, _i % 2 == 0, 8);
}
END_TEST

/* ---- FP8 weights (--quantization fp8) ------------------------------------------------ */

/* rows x cols f32 (host) as FP8 rows (kern_fp8_quantize_row) dequantized
 * into deq; scales into sc. tensor: one scale for them all (the backend's
 * per-tensor mode), in every row's slot. */
static void fp8_rows(const float *x, int64_t rows, int64_t cols, uint8_t *q, float *sc, double *deq, bool tensor) {
  const float s = tensor ? kern_fp8_quantize_row(x, rows * cols, q) : 0.f;
  for (int64_t r = 0; r < rows; r++) {
    sc[r] = tensor ? s : kern_fp8_quantize_row(x + r * cols, cols, q + r * cols);
    for (int64_t k = 0; k < cols; k++) deq[r * cols + k] = (double)kern_fp8_e4m3_to_f32(q[r * cols + k]) * sc[r];
  }
}

/* out[b][r] = sum_k w[r][k] x[b][k] (+ bias) in f64. */
static double *dot_ref(const double *w, const double *x, int64_t rows, int64_t cols, int n, const float *bias) {
  double *ref = fr_malloc(sizeof(double) * (size_t)n * rows);
  for (int b = 0; b < n; b++)
    for (int64_t r = 0; r < rows; r++) {
      double acc = bias ? bias[r] : 0;
      for (int64_t k = 0; k < cols; k++) acc += w[r * cols + k] * x[(size_t)b * cols + k];
      ref[(size_t)b * rows + r] = acc;
    }
  return ref;
}

/* The rows of an FP8 matmul over n rows of x that run as the GEMM (x
 * quantized): all of them past max_gemv, else none (the GEMV, x as it
 * is). The reference of each output row accordingly: ref_q's or ref_x's,
 * into want, the other one's into other. */
static int fp8_mixed_refs(int n, int max_gemv, int64_t rows, const double *ref_q, const double *ref_x, double *want,
                          double *other) {
  const int gemm_n = n <= max_gemv ? 0 : n;
  const size_t split = (size_t)gemm_n * rows;
  for (size_t j = 0; j < (size_t)n * rows; j++) {
    want[j] = j < split ? ref_q[j] : ref_x[j];
    other[j] = j < split ? ref_x[j] : ref_q[j];
  }
  return gemm_n;
}

/* How the FP8 GEMM quantizes x: a scale a token, one for the tensor (the
 * device's per-tensor mode), or a token's 128 columns (KERN_F8B). */
typedef enum { FP8_X_TOKEN, FP8_X_TENSOR, FP8_X_GROUPS } fp8_x_t;

/* x (n rows of cols) quantized as KERN_F8B's GEMM quantizes it, a scale per
 * token and 128 columns (kern_fp8_quantize_row on each), dequantized. */
static void fp8_groups(const float *x, int n, int64_t cols, double *deq) {
  uint8_t q[128];
  for (int64_t g = 0; g < (int64_t)n * cols / 128; g++) {
    const float s = kern_fp8_quantize_row(x + g * 128, 128, q);
    for (int k = 0; k < 128; k++) deq[g * 128 + k] = (double)kern_fp8_e4m3_to_f32(q[k]) * s;
  }
}

/* The matmuls of an FP8 weight w (wd: its exact values in f64) over each
 * n of ns rows of x: every output row within 1e-2 of its f64 reference
 * (fp8_mixed_refs: x as it is on the GEMV, quantized as xq says on the
 * GEMM), and nothing written past n rounded up to 4 rows (kern_ops_t.matmul's
 * room). Each output is also compared with the other reference (printed):
 * they differ by x's FP8 rounding, ~3%. what and scales name it on stderr. */
static void check_fp8_matmuls(const kern_weight_t *w, const double *wd, bool with_bias, int max_gemv, const int *ns,
                              int n_ns, fp8_x_t xq, const char *what, const char *scales) {
  const int64_t rows = w->rows, cols = w->cols;
  float *bias_h = with_bias ? rand_vec(rows, 1.f) : NULL;
  kern_weight_t bw = {.type = KERN_F32, .rows = 1, .cols = rows, .row_bytes = (size_t)rows * 4};
  if (with_bias) ck_assert_int_eq(gpu->ops->weight_load(gpu->ctx, &bw, bias_h), 0);
  for (int t = 0; t < n_ns; t++) {
    const int n = ns[t];
    const size_t nx = (size_t)n * cols, no = (size_t)n * rows;
    float *x = rand_vec(nx, 1.f);
    double *xd = fr_malloc(sizeof(double) * nx), *xqd = fr_malloc(sizeof(double) * nx);
    for (size_t j = 0; j < nx; j++) xd[j] = x[j];
    if (xq == FP8_X_GROUPS) {
      fp8_groups(x, n, cols, xqd);
    } else {
      uint8_t *q = fr_malloc(nx);
      float *qs = fr_malloc(n * sizeof(float));
      fp8_rows(x, n, cols, q, qs, xqd, xq == FP8_X_TENSOR);
      free(q), free(qs);
    }
    double *ref_x = dot_ref(wd, xd, rows, cols, n, bias_h), *ref_q = dot_ref(wd, xqd, rows, cols, n, bias_h);
    void *xg = gpu_put(x, nx), *og = NULL;
    const size_t room = (size_t)((n + 3) & ~3) * rows, guard = 4 * (size_t)rows;
    ck_assert_int_eq(gpu->ops->alloc(gpu->ctx, (room + guard) * 2, &og), 0);
    poison(og, room + guard);
    int rc = gpu->ops->matmul(gpu->ctx, og, w, with_bias ? &bw : NULL, xg, n);
    ck_assert_msg(rc == 0, "cuda matmul (%s) n=%d: %s", what, n, fr_last_error());
    float *g = gpu_get(og, room + guard);
    for (size_t j = room; j < room + guard; j++)
      ck_assert_msg(isnan(g[j]), "%s matmul n=%d wrote past its room, element %zu", what, n, j);
    double *want = fr_malloc(sizeof(double) * no), *other = fr_malloc(sizeof(double) * no);
    const int gemm_n = fp8_mixed_refs(n, max_gemv, rows, ref_q, ref_x, want, other);
    const char *path = gemm_n ? "gemm" : "gemv";
    const double e = nerr_d(g, want, no), o = nerr_d(g, other, no);
    fprintf(stderr, "  matmul %-8s %4lldx%-5lld n=%-3d bias=%d %s, scales a %s  err(exact) %.2e  err(other x) %.2e\n",
            what, (long long)rows, (long long)cols, n, with_bias, path, scales, e, o);
    ck_assert_msg(e < 1e-2, "%s matmul n=%d (%s): error %.3e", what, n, path, e);
    free(g), free(x), free(xd), free(xqd), free(ref_x), free(ref_q), free(want), free(other);
    gpu->ops->free(gpu->ctx, xg);
    gpu->ops->free(gpu->ctx, og);
  }
  if (with_bias) gpu->ops->weight_release(gpu->ctx, &bw);
  free(bias_h);
}

/* A bf16 weight loaded with fp8 set, its rows 2^-4..2^4 apart in size: it
 * becomes KERN_F8R, its bytes and scales those of kern_fp8_quantize_row
 * bit for bit, a scale a row or (the backend's per-tensor mode, told by
 * the scales all being equal) one for the whole weight. Its matmuls:
 * check_fp8_matmuls, x quantized a token a row or as one tensor. */
static void check_matmul_fp8(int64_t rows, int64_t cols, bool with_bias, int max_gemv, const int *ns, int n_ns) {
  const size_t wn = (size_t)rows * cols;
  float *wf = fr_malloc(wn * sizeof(float));
  uint16_t *wh = fr_malloc(wn * 2);
  for (int64_t r = 0; r < rows; r++)
    for (int64_t k = 0; k < cols; k++) {
      wh[r * cols + k] = fr_fp32_to_bf16(rndn() * ldexpf(0.5f, (int)(r % 9) - 4));
      wf[r * cols + k] = fr_bf16_to_fp32(wh[r * cols + k]);
    }
  kern_weight_t w = {.type = KERN_BF16, .rows = rows, .cols = cols, .row_bytes = (size_t)cols * 2, .fp8 = true};
  int rc = gpu->ops->weight_load(gpu->ctx, &w, wh);
  ck_assert_msg(rc == 0, "cuda weight_load (fp8): %s", fr_last_error());
  ck_assert_int_eq(w.type, KERN_F8R);
  ck_assert_int_eq(w.row_bytes, cols);
  uint8_t *got = fr_malloc(wn + rows * sizeof(float));
  ck_assert_int_eq(gpu->ops->download(gpu->ctx, got, w.data, wn + rows * sizeof(float)), 0);
  float s0, s1;
  memcpy(&s0, got + wn, 4), memcpy(&s1, got + wn + 4, 4);
  const bool tensor = s0 == s1; /* rows 0 and 1 differ in size by 2x */
  uint8_t *q = fr_malloc(wn + rows * sizeof(float));
  float *sc = fr_malloc(rows * sizeof(float));
  double *wd = fr_malloc(wn * sizeof(double));
  fp8_rows(wf, rows, cols, q, sc, wd, tensor);
  memcpy(q + wn, sc, rows * sizeof(float));
  size_t i = 0;
  while (i < wn + rows * sizeof(float) && got[i] == q[i]) i++;
  ck_assert_msg(i == wn + rows * sizeof(float), "fp8 weight: byte %zu of %zu differs from kern_fp8_quantize_row", i,
                wn + rows * sizeof(float));
  check_fp8_matmuls(&w, wd, with_bias, max_gemv, ns, n_ns, tensor ? FP8_X_TENSOR : FP8_X_TOKEN, "F8R",
                    tensor ? "tensor" : "row");
  gpu->ops->weight_release(gpu->ctx, &w);
  free(wf), free(wh), free(q), free(sc), free(wd), free(got);
}

START_TEST(test_matmul_fp8) {
  if (!gpu->fp8_weights) {
    fprintf(stderr, "  fp8 weights: not on this device (compute capability below 8.9)\n");
    return;
  }
  /* the GEMV up to 8 rows, the GEMM past them (the default takes the GEMM from 2) */
  kern_backend_destroy(gpu);
  char gm[16];
  snprintf(gm, sizeof gm, "%d", KCU_TEST_F8_GEMV_MAX_N);
  setenv("FERRUM_CUDA_F8_GEMV_MAX_N", gm, 1);
  ck_assert_int_eq(kern_cuda_create(&gpu, 0), 0);
  check_matmul_fp8(384, 1024, true, KCU_TEST_F8_GEMV_MAX_N, k_ns, (int)FR_ARRAY_SIZE(k_ns));
  check_matmul_fp8(256, 576, false, KCU_TEST_F8_GEMV_MAX_N, k_ns, 5);
  /* the GEMM from 4 rows (each last 1-3 on the GEMV) */
  kern_backend_destroy(gpu);
  setenv("FERRUM_CUDA_F8_GEMV_MAX_N", "0", 1);
  ck_assert_int_eq(kern_cuda_create(&gpu, 0), 0);
  const int small[] = {1, 3, 8, 9, 13};
  check_matmul_fp8(384, 1024, false, 0, small, 5);
  /* a down projection's k (Llama-3-8B's 14336): the GEMM with cuBLASLt's
   * fast accumulation (the default) and without */
  const int wide[] = {16, 64};
  for (int fast = 1; fast >= 0; fast--) {
    kern_backend_destroy(gpu);
    setenv("FERRUM_CUDA_F8_FAST_ACCUM", fast ? "1" : "0", 1);
    ck_assert_int_eq(kern_cuda_create(&gpu, 0), 0);
    fprintf(stderr, "  fast accumulation %s:\n", fast ? "on" : "off");
    check_matmul_fp8(128, 14336, false, 0, wide, 2);
  }
  unsetenv("FERRUM_CUDA_F8_FAST_ACCUM");
  /* scales per tensor, as where cuBLASLt has no outer-vector scaling */
  kern_backend_destroy(gpu);
  setenv("FERRUM_CUDA_F8_GEMV_MAX_N", gm, 1);
  setenv("FERRUM_CUDA_F8_SCALES", "tensor", 1);
  ck_assert_int_eq(kern_cuda_create(&gpu, 0), 0);
  const int some[] = {1, 7, 16, 100};
  check_matmul_fp8(384, 1024, true, KCU_TEST_F8_GEMV_MAX_N, some, 4);
}
END_TEST

/* w (rows x cols, multiples of 128) as an FP8 checkpoint's 128 x 128
 * blocks in KERN_F8B (kern_types.h): each block quantized as
 * kern_fp8_quantize_row does a row (scale max|w| / 448), the bytes then the
 * scales in one buffer; the dequantized weight into deq. */
static uint8_t *f8b_pack(const float *w, int64_t rows, int64_t cols, double *deq) {
  const int64_t sc = kern_f8b_scale_cols(cols);
  uint8_t *buf = fr_calloc(1, (size_t)(rows * cols) + kern_f8_scale_bytes(KERN_F8B, rows, cols));
  float *scales = (float *)(buf + rows * cols);
  for (int64_t i = 0; i < rows / 128; i++)
    for (int64_t j = 0; j < cols / 128; j++) {
      float m = 0.f;
      for (int64_t r = i * 128; r < (i + 1) * 128; r++)
        for (int64_t k = j * 128; k < (j + 1) * 128; k++) m = fmaxf(m, fabsf(w[r * cols + k]));
      const float inv = m > 0.f ? 448.f / m : 0.f, s = m / 448.f;
      scales[i * sc + j] = s;
      for (int64_t r = i * 128; r < (i + 1) * 128; r++)
        for (int64_t k = j * 128; k < (j + 1) * 128; k++) {
          buf[r * cols + k] = kern_fp8_e4m3_from_f32(w[r * cols + k] * inv);
          deq[r * cols + k] = (double)kern_fp8_e4m3_to_f32(buf[r * cols + k]) * s;
        }
    }
  return buf;
}

/* An FP8 checkpoint's weight handed over as it is in the file (form
 * KERN_F8R: a scale a row, or (tensor) one for the tensor in every row's
 * slot; KERN_F8B: 128 x 128 blocks): the device keeps its bytes and scales
 * bit for bit. Its matmuls: check_fp8_matmuls, x quantized as the GEMM
 * does (a scale a token, one for the tensor where the device scales by
 * tensor (x_tensor), or a token's 128 columns). */
static void check_matmul_fp8_file(kern_type_t form, bool tensor, bool x_tensor, int64_t rows, int64_t cols,
                                  bool with_bias, int max_gemv, const int *ns, int n_ns) {
  const size_t wn = (size_t)rows * cols, sbytes = kern_f8_scale_bytes(form, rows, cols);
  float *wf = fr_malloc(wn * sizeof(float));
  for (int64_t r = 0; r < rows; r++)
    for (int64_t k = 0; k < cols; k++) wf[r * cols + k] = rndn() * ldexpf(0.5f, (int)((r + k / 128) % 9) - 4);
  double *wd = fr_malloc(wn * sizeof(double));
  uint8_t *host;
  if (form == KERN_F8B) {
    host = f8b_pack(wf, rows, cols, wd);
  } else {
    host = fr_malloc(wn + sbytes);
    fp8_rows(wf, rows, cols, host, (float *)(host + wn), wd, tensor);
  }
  kern_weight_t w = {.type = form, .rows = rows, .cols = cols, .row_bytes = (size_t)cols, .fp8 = true};
  int rc = gpu->ops->weight_load(gpu->ctx, &w, host);
  ck_assert_msg(rc == 0, "cuda weight_load (%s): %s", kern_type_traits(form)->name, fr_last_error());
  ck_assert_int_eq(w.type, form);
  uint8_t *got = fr_malloc(wn + sbytes);
  ck_assert_int_eq(gpu->ops->download(gpu->ctx, got, w.data, wn + sbytes), 0);
  ck_assert_msg(!memcmp(got, host, wn + sbytes), "%s weight: the device's bytes or scales differ from the file's",
                kern_type_traits(form)->name);
  const fp8_x_t xq = form == KERN_F8B ? FP8_X_GROUPS : x_tensor ? FP8_X_TENSOR : FP8_X_TOKEN;
  check_fp8_matmuls(&w, wd, with_bias, max_gemv, ns, n_ns, xq, form == KERN_F8B ? "F8B file" : "F8R file",
                    form == KERN_F8B ? "block" : tensor ? "tensor" : "row");
  gpu->ops->weight_release(gpu->ctx, &w);
  free(wf), free(wd), free(host), free(got);
}

START_TEST(test_matmul_fp8_file) {
  if (!gpu->fp8_weights) return;
  kern_backend_destroy(gpu);
  char gm[16];
  snprintf(gm, sizeof gm, "%d", KCU_TEST_F8_GEMV_MAX_N);
  setenv("FERRUM_CUDA_F8_GEMV_MAX_N", gm, 1);
  ck_assert_int_eq(kern_cuda_create(&gpu, 0), 0);
  /* token counts on both sides of the GEMV, and not multiples of 4 past it */
  const int ns[] = {1, 2, 7, 9, 16, 33, 64, 301};
  check_matmul_fp8_file(KERN_F8R, false, false, 384, 1024, true, KCU_TEST_F8_GEMV_MAX_N, ns, (int)FR_ARRAY_SIZE(ns));
  check_matmul_fp8_file(KERN_F8R, true, false, 256, 576, false, KCU_TEST_F8_GEMV_MAX_N, ns, (int)FR_ARRAY_SIZE(ns));
  check_matmul_fp8_file(KERN_F8B, false, false, 384, 1024, true, KCU_TEST_F8_GEMV_MAX_N, ns, (int)FR_ARRAY_SIZE(ns));
  check_matmul_fp8_file(KERN_F8B, false, false, 256, 640, false, KCU_TEST_F8_GEMV_MAX_N, ns, (int)FR_ARRAY_SIZE(ns));
  /* a KERN_F8B weight that is not whole blocks is refused: the model decodes it instead */
  uint8_t *h = fr_calloc(1, 192 * 256 + kern_f8_scale_bytes(KERN_F8B, 192, 256));
  kern_weight_t w = {.type = KERN_F8B, .rows = 192, .cols = 256, .row_bytes = 256, .fp8 = true};
  ck_assert_int_eq(gpu->ops->weight_load(gpu->ctx, &w, h), FR_EUNSUPPORTED);
  ck_assert_msg(strstr(fr_last_error(), "128 x 128 blocks"), "%s", fr_last_error());
  /* scales per tensor (where cuBLASLt has no outer-vector scaling): a file's scale a row is refused, one for the
   * tensor taken */
  kern_backend_destroy(gpu);
  setenv("FERRUM_CUDA_F8_SCALES", "tensor", 1);
  ck_assert_int_eq(kern_cuda_create(&gpu, 0), 0);
  check_matmul_fp8_file(KERN_F8R, true, true, 256, 576, true, KCU_TEST_F8_GEMV_MAX_N, ns, (int)FR_ARRAY_SIZE(ns));
  float *sc = (float *)(h + 192 * 256);
  sc[0] = 1.f, sc[1] = 2.f;
  w = (kern_weight_t){.type = KERN_F8R, .rows = 192, .cols = 256, .row_bytes = 256, .fp8 = true};
  ck_assert_int_eq(gpu->ops->weight_load(gpu->ctx, &w, h), FR_EUNSUPPORTED);
  ck_assert_msg(strstr(fr_last_error(), "scales by tensor"), "%s", fr_last_error());
  free(h);
}
END_TEST

/* The CPU backend refuses an FP8 weight with a clear error. */
/* ---- the FP8 twin: the norms and silu_mul quantize for the FP8 GEMM after them ---- */

/* An F8R weight (rows x cols) from random bf16. */
static kern_weight_t fp8_weight(int64_t rows, int64_t cols) {
  uint16_t *h = fr_malloc((size_t)rows * cols * 2);
  for (size_t i = 0; i < (size_t)rows * cols; i++) h[i] = fr_fp32_to_bf16(rndn() * 0.05f);
  kern_weight_t w = {.type = KERN_BF16, .rows = rows, .cols = cols, .row_bytes = (size_t)cols * 2, .fp8 = true};
  int rc = gpu->ops->weight_load(gpu->ctx, &w, h);
  ck_assert_msg(rc == 0, "cuda weight_load (fp8): %s", fr_last_error());
  ck_assert_int_eq(w.type, KERN_F8R);
  free(h);
  return w;
}

/* A device copy of n act elements (a copy drops the twin). */
static void *gpu_dup(const void *g, size_t n) {
  void *d = NULL;
  ck_assert_int_eq(gpu->ops->alloc(gpu->ctx, n * 2 + 16, &d), 0);
  ck_assert_int_eq(gpu->ops->copy(gpu->ctx, d, g, n * 2), 0);
  return d;
}

/* w's matmul over n rows of x into a new buffer; the twin hits it made
 * (0 or 1) must be `hit`. */
static void *fp8_mm_hit(const kern_weight_t *w, const void *x, int n, int hit, const char *what) {
  void *o = NULL;
  ck_assert_int_eq(gpu->ops->alloc(gpu->ctx, (size_t)((n + 3) & ~3) * w->rows * 2, &o), 0);
  const uint64_t h0 = kern_cuda_f8_twin_hits(gpu);
  int rc = gpu->ops->matmul(gpu->ctx, o, w, NULL, x, n);
  ck_assert_msg(rc == 0, "%s: matmul: %s", what, fr_last_error());
  ck_assert_msg(kern_cuda_f8_twin_hits(gpu) - h0 == (uint64_t)hit, "%s n=%d: %llu twin hits, want %d", what, n,
                (unsigned long long)(kern_cuda_f8_twin_hits(gpu) - h0), hit);
  return o;
}

/* The matmul over the twin the op before left of x (o_twin) against the
 * same matmul over a copy of x, which the GEMM quantizes itself: the same
 * bits. */
static void expect_twin_bits(const kern_weight_t *w, void *o_twin, const void *x, int n, const char *what) {
  void *xc = gpu_dup(x, (size_t)n * w->cols);
  void *o = fp8_mm_hit(w, xc, n, 0, what);
  expect_same_bits(o_twin, o, (size_t)n * w->rows * 2, what);
  gpu->ops->free(gpu->ctx, xc);
  gpu->ops->free(gpu->ctx, o);
}

/* rms_norm (add_rms_norm with res) of n rows of dim, then an FP8 matmul
 * of the result: the GEMM takes the norm's twin, with the quantizer's
 * bits; the norm's output matches the CPU's. */
static void check_norm_twin(int n, int dim, bool res) {
  kern_weight_t wa = fp8_weight(320, dim);
  float *wh = rand_vec(dim, 1.f);
  wpair_t nw;
  wpair_load(&nw, KERN_F32, 1, dim, wh);
  pair_t x = pair_rand((size_t)n * dim, 1.f), r = pair_rand((size_t)n * dim, 3.f), o = pair_rand((size_t)n * dim, 1.f);
  if (res) {
    ck_assert_int_eq(cpu->ops->add_rms_norm(cpu->ctx, o.c, r.c, x.c, &nw.c, n, dim, 1e-5f), 0);
    ck_assert_int_eq(gpu->ops->add_rms_norm(gpu->ctx, o.g, r.g, x.g, &nw.g, n, dim, 1e-5f), 0);
  } else {
    ck_assert_int_eq(cpu->ops->rms_norm(cpu->ctx, o.c, x.c, &nw.c, n, dim, 1e-5f), 0);
    ck_assert_int_eq(gpu->ops->rms_norm(gpu->ctx, o.g, x.g, &nw.g, n, dim, 1e-5f), 0);
  }
  char what[64];
  snprintf(what, sizeof what, "%s %dx%d twin", res ? "add_rms_norm" : "rms_norm", n, dim);
  void *o1 = fp8_mm_hit(&wa, o.g, n, 1, what);
  void *o2 = fp8_mm_hit(&wa, o.g, n, 1, "the same x again"); /* the twin holds for a second weight */
  expect_same_bits(o1, o2, (size_t)n * wa.rows * 2, "a second matmul over the twin");
  expect_twin_bits(&wa, o1, o.g, n, what);
  ck_assert_double_lt(cmp_pair(&o, (size_t)n * dim, what), TOL_ACT);
  if (res) ck_assert_double_lt(cmp_pair(&r, (size_t)n * dim, "its residual"), TOL_ACT);
  gpu->ops->free(gpu->ctx, o1);
  gpu->ops->free(gpu->ctx, o2);
  pair_free(&x), pair_free(&r), pair_free(&o);
  wpair_free(&nw);
  gpu->ops->weight_release(gpu->ctx, &wa);
}

START_TEST(test_fp8_twin) {
  if (!gpu->fp8_weights) return;
  const int ns[] = {3, 9, 37, 256};
  for (size_t i = 0; i < FR_ARRAY_SIZE(ns); i++) {
    check_norm_twin(ns[i], 576, i % 2);  /* one warp a row */
    check_norm_twin(ns[i], 2048, !(i % 2)); /* 256 threads a row */
  }
  /* silu_mul then the down projection */
  const int n = 37, f = 1536;
  kern_weight_t wd = fp8_weight(576, f);
  float *guh = rand_vec((size_t)n * 2 * f, 2.f);
  void *gu = gpu_put(guh, (size_t)n * 2 * f), *up = NULL;
  free(guh);
  ck_assert_int_eq(gpu->ops->alloc(gpu->ctx, (size_t)n * f * 2 + 16, &up), 0);
  ck_assert_int_eq(gpu->ops->silu_mul(gpu->ctx, up, gu, (uint8_t *)gu + (size_t)f * 2, n, f, 2 * f), 0);
  void *o1 = fp8_mm_hit(&wd, up, n, 1, "silu_mul twin");
  expect_twin_bits(&wd, o1, up, n, "silu_mul twin");
  gpu->ops->free(gpu->ctx, o1);
  /* what ends a twin: a write by upload, a kernel, a cuBLAS GEMM */
  ck_assert_int_eq(gpu->ops->silu_mul(gpu->ctx, up, gu, (uint8_t *)gu + (size_t)f * 2, n, f, 2 * f), 0);
  float *nx = rand_vec((size_t)n * f, 1.f);
  uint16_t *nh = fr_malloc((size_t)n * f * 2);
  for (size_t i = 0; i < (size_t)n * f; i++) nh[i] = fr_fp32_to_bf16(nx[i]);
  ck_assert_int_eq(gpu->ops->upload(gpu->ctx, up, nh, (size_t)n * f * 2), 0);
  o1 = fp8_mm_hit(&wd, up, n, 0, "upload over the twin's x");
  expect_twin_bits(&wd, o1, up, n, "upload over the twin's x");
  gpu->ops->free(gpu->ctx, o1);
  ck_assert_int_eq(gpu->ops->silu_mul(gpu->ctx, up, gu, (uint8_t *)gu + (size_t)f * 2, n, f, 2 * f), 0);
  ck_assert_int_eq(gpu->ops->add(gpu->ctx, up, up, gu, (size_t)n * f), 0);
  o1 = fp8_mm_hit(&wd, up, n, 0, "a kernel over the twin's x");
  expect_twin_bits(&wd, o1, up, n, "a kernel over the twin's x");
  gpu->ops->free(gpu->ctx, o1);
  ck_assert_int_eq(gpu->ops->silu_mul(gpu->ctx, up, gu, (uint8_t *)gu + (size_t)f * 2, n, f, 2 * f), 0);
  kern_weight_t wb = {.type = KERN_BF16, .rows = f, .cols = f, .row_bytes = (size_t)f * 2};
  uint16_t *bh = fr_malloc((size_t)f * f * 2);
  for (size_t i = 0; i < (size_t)f * f; i++) bh[i] = fr_fp32_to_bf16(rndn() * 0.02f);
  ck_assert_int_eq(gpu->ops->weight_load(gpu->ctx, &wb, bh), 0);
  void *tmp = gpu_dup(up, (size_t)n * f);
  ck_assert_int_eq(gpu->ops->silu_mul(gpu->ctx, up, gu, (uint8_t *)gu + (size_t)f * 2, n, f, 2 * f), 0);
  ck_assert_int_eq(gpu->ops->matmul(gpu->ctx, up, &wb, NULL, tmp, n), 0); /* cuBLAS writes up */
  o1 = fp8_mm_hit(&wd, up, n, 0, "a cuBLAS GEMM over the twin's x");
  expect_twin_bits(&wd, o1, up, n, "a cuBLAS GEMM over the twin's x");
  gpu->ops->free(gpu->ctx, o1);
  gpu->ops->free(gpu->ctx, tmp);
  gpu->ops->weight_release(gpu->ctx, &wb);
  gpu->ops->weight_release(gpu->ctx, &wd);
  gpu->ops->free(gpu->ctx, gu);
  gpu->ops->free(gpu->ctx, up);
  free(nx), free(nh), free(bh);
}
END_TEST

START_TEST(test_fp8_cpu_refuses) {
  uint16_t wh[64 * 32] = {0};
  kern_weight_t w = {.type = KERN_BF16, .rows = 64, .cols = 32, .row_bytes = 64, .fp8 = true};
  ck_assert_int_ne(cpu->ops->weight_load(cpu->ctx, &w, wh), 0);
  ck_assert_msg(strstr(fr_last_error(), "CUDA"), "cpu fp8 refusal: %s", fr_last_error());
}
END_TEST

/* A random permutation of [0, n): a GPTQ act-order weight's column order
 * (kern_weight_t.perm). */
static int32_t *rand_perm(int n) {
  int32_t *p = fr_malloc((size_t)n * sizeof *p);
  for (int i = 0; i < n; i++) p[i] = i;
  for (int i = n - 1; i > 0; i--) {
    int j = rndi(i + 1), t = p[i];
    p[i] = p[j], p[j] = t;
  }
  return p;
}

/* GPTQ act-order (KERN_I4G with a column permutation): the decode GEMV
 * (activations gathered as they are quantized) and the prefill dequant +
 * cuBLAS path (the dequantized rows un-permuted) against the exact
 * reference and the CPU backend. By default n = 1..7 take the GEMV and 16
 * and up the GEMM; then with the GEMV for n <= 8. */
START_TEST(test_matmul_i4g_perm) {
  int32_t *p512 = rand_perm(512), *p1024 = rand_perm(1024);
  check_matmul_perm(KERN_I4G, 200, 512, false, 1 << 30, p512);
  check_matmul_perm(KERN_I4G, 96, 1024, true, 1 << 30, p1024);
  gpu_all_gemv();
  check_matmul_perm(KERN_I4G, 200, 512, true, 8, p512);
  check_matmul_perm(KERN_I4G, 96, 1024, false, 8, p1024);
  free(p512);
  free(p1024);
}
END_TEST

/* The 4-bit types that CUDA repacks for its tensor cores (KERN_Q4F,
 * kcu_q4f.cu): rows not a multiple of the 16-row tiles, a last unit of 32
 * columns (not for Q4_K, whose blocks are 256 wide), a large weight, both
 * CTA sizes on a weight whose last row tile is partial (past 64 rows: the
 * GEMM form with its columns split, and the per-tile kernel), and then the
 * file's blocks kept (FERRUM_CUDA_Q4F=0: the integer GEMV and dequantize +
 * cuBLAS) on the same weights. The last entry is I4G again with a (d, m)
 * per 128 columns (KERN_Q4G on the device; its last pair of units has one
 * unit or one block at 288 and 5152 columns). */
static const kern_type_t k_q4[] = {KERN_Q4_0, KERN_Q4_1, KERN_Q4_K, KERN_I4G, KERN_I4G};
#define K_Q4_GROUPED 4 /* k_q4's entry of I4G in groups of 128 columns */

/* Sets up k_q4's entry i: its type, and whether I4G is grouped (checked:
 * the device type it becomes). */
static kern_type_t q4_entry(int i) {
  i4g_run = i == K_Q4_GROUPED ? 4 : 1;
  if (k_q4[i] == KERN_I4G) {
    wpair_t w;
    wpair_load(&w, KERN_I4G, 40, 288, rand_weight(KERN_I4G, 40, 288));
    ck_assert_int_eq(w.g.type, i == K_Q4_GROUPED ? KERN_Q4G : KERN_Q4F);
    wpair_free(&w);
  }
  return k_q4[i];
}

START_TEST(test_matmul_q4f) {
  kern_type_t t = q4_entry(_i);
  check_matmul(t, 200, t == KERN_Q4_K ? 768 : 288, true);
  check_matmul_n(t, 16 * 532 - 11, 256, false, 128);
  /* the per-tile kernels (the wide one off): both CTA sizes at every n
   * (FERRUM_CUDA_Q4F_WARPS), past 64 rows the GEMM form or not, CTAs of 8
   * to 64 tokens (FERRUM_CUDA_Q4F_NT), one row by the one-row kernel (4
   * or 8 warps a tile, or by shape: 8 for these few tiles) or by the
   * per-tile one (FERRUM_CUDA_Q4F_ROW); then the wide kernel at every n
   * (FERRUM_CUDA_Q4F_WIDE), its units split over CTAs by the SMs or in 1
   * to 8 (FERRUM_CUDA_Q4F_KS; for 5 units at 2 a stage: 4 and 1, or 2,
   * 2 and 1; at 1 a stage 3 and 2, or 2, 2 and 1; 8: some empty), also
   * on more columns than its stages hold (24 units). KERN_Q4G's one-row
   * kernel takes the raw nibbles (configs 0 and 1: 8 and 4 warps), but in
   * config 4 it dequantizes as the other layouts' (FERRUM_CUDA_Q4G_RAW=0). */
  static const char *cfg[][6] = {{"4", "0", "4", "100000", "0", "-1"}, {"8", "1", "8", "100000", "0", "4"},
                                 {"4", "0", "1", "100000", "0", "0"},  {"8", "0", "2", "100000", "0", "0"},
                                 {"4", "1", "4", "1", "0", "8"},       {"4", "1", "4", "1", "1", "-1"},
                                 {"4", "1", "4", "1", "2", "-1"},      {"4", "1", "4", "1", "3", "-1"},
                                 {"4", "1", "4", "1", "4", "-1"},      {"4", "1", "4", "1", "5", "-1"},
                                 {"4", "1", "4", "1", "6", "-1"},      {"4", "1", "4", "1", "7", "-1"},
                                 {"4", "1", "4", "1", "8", "-1"}};
  for (int k = 0; k < (int)FR_ARRAY_SIZE(cfg); k++) {
    kern_backend_destroy(gpu);
    setenv("FERRUM_CUDA_Q4G_RAW", k == 4 ? "0" : "1", 1);
    setenv("FERRUM_CUDA_Q4F_WARPS", cfg[k][0], 1);
    setenv("FERRUM_CUDA_Q4F_GEMM", cfg[k][1], 1);
    setenv("FERRUM_CUDA_Q4F_NT", cfg[k][2], 1);
    setenv("FERRUM_CUDA_Q4F_WIDE", cfg[k][3], 1);
    setenv("FERRUM_CUDA_Q4F_KS", cfg[k][4], 1);
    setenv("FERRUM_CUDA_Q4F_ROW", cfg[k][5], 1);
    ck_assert_int_eq(kern_cuda_create(&gpu, 0), 0);
    const bool wide = k >= 4;
    /* config 1 up to 128 rows: the GEMM form past 64, which the wide kernel displaced on sm_90 */
    check_matmul_n(t, 16 * 9 + 3, t == KERN_Q4_K ? 768 : 288, k == 1 || k == 5, wide || k == 1 ? 128 : 64);
    if (wide) check_matmul_n(t, 16 * 9 + 3, 1536, k == 4, 128);
    /* the one-row kernel over whole batches of units (KCU_Q4F_ROW_U a warp
     * of 4 or 8 warps a tile) and then a part batch; for the 32-column
     * types a last unit of one block */
    if (k == 0 || k == 1 || k == 4) check_matmul_n(t, 16 * 9 + 3, t == KERN_Q4_K ? 5120 : 5152, k == 1, 1);
  }
  unsetenv("FERRUM_CUDA_Q4F_NT");
  unsetenv("FERRUM_CUDA_Q4F_WIDE");
  unsetenv("FERRUM_CUDA_Q4F_KS");
  unsetenv("FERRUM_CUDA_Q4F_ROW");
  unsetenv("FERRUM_CUDA_Q4G_RAW");
  kern_backend_destroy(gpu);
  setenv("FERRUM_CUDA_Q4F", "0", 1);
  ck_assert_int_eq(kern_cuda_create(&gpu, 0), 0);
  check_matmul(t, 200, 512, false);
}
END_TEST

/* Q6_K repacked for the tensor cores (KERN_Q6F): the one-row kernel at
 * n = 1 (8 warps a tile for these few tiles, then 4), the per-tile kernel
 * at 2..16 rows (MMA columns of 8 and 16 tokens, CTAs of 4 and 8 warps),
 * dequantize + cuBLAS past 16, on rows not a multiple of the 16-row tiles;
 * then the per-tile kernel at one row too (FERRUM_CUDA_Q4F_ROW=0), and the
 * file's blocks kept (FERRUM_CUDA_Q6F=0: the integer GEMV) on the same
 * shapes. */
START_TEST(test_matmul_q6f) {
  check_matmul(KERN_Q6_K, 16 * 9 + 3, 768, true);
  check_matmul_n(KERN_Q6_K, 16 * 40, 2048, false, 16);
  static const char *cfg[][3] = {{"8", "4", "1"}, {"4", "0", "1"}, {"4", "-1", "0"}};
  for (int k = 0; k < (int)FR_ARRAY_SIZE(cfg); k++) {
    kern_backend_destroy(gpu);
    setenv("FERRUM_CUDA_Q4F_WARPS", cfg[k][0], 1);
    setenv("FERRUM_CUDA_Q4F_ROW", cfg[k][1], 1);
    setenv("FERRUM_CUDA_Q6F", cfg[k][2], 1);
    ck_assert_int_eq(kern_cuda_create(&gpu, 0), 0);
    check_matmul_n(KERN_Q6_K, 16 * 9 + 3, 768, k == 1, 16);
  }
  unsetenv("FERRUM_CUDA_Q4F_WARPS");
  unsetenv("FERRUM_CUDA_Q4F_ROW");
  unsetenv("FERRUM_CUDA_Q6F");
}
END_TEST

/* matmul_silu_mul over a 4-bit [gate; up] weight where the wide Q4F kernel
 * takes it (17 to 64 rows on sm_90): silu(gate) * up in the kernel, bit
 * for bit against matmul then silu_mul. 13 gate tiles (the last CTA has
 * one of 4), a last unit of 32 columns (not Q4_K), an act-order
 * permutation (I4G), the units split by the SMs or in 1 to 8. */
START_TEST(test_q4f_silu_mul) {
  const kern_type_t t = q4_entry(_i);
  const int ffn = 16 * 13, cols = t == KERN_Q4_K ? 768 : 288;
  static const int ns[] = {17, 24, 32, 33, 64, 100}; /* 100: the two kernels, as the fused op runs up to 64 */
  static const char *ks[] = {"0", "1", "2", "3", "4", "5", "6", "7", "8"};
  int32_t *perm = t == KERN_I4G ? rand_perm(cols) : NULL;
  for (size_t k = 0; k < FR_ARRAY_SIZE(ks); k++) {
    kern_backend_destroy(gpu);
    setenv("FERRUM_CUDA_Q4F_KS", ks[k], 1);
    ck_assert_int_eq(kern_cuda_create(&gpu, 0), 0);
    wpair_t gu;
    wpair_load_as(&gu, t, 2 * ffn, cols, rand_weight(t, 2 * ffn, cols), false, perm, 0);
    for (size_t i = 0; i < FR_ARRAY_SIZE(ns); i++) {
      const int n = ns[i];
      pair_t x = pair_rand((size_t)n * cols, 1.f);
      void *scratch = NULL, *a = NULL, *out = NULL;
      ck_assert_int_eq(gpu->ops->alloc(gpu->ctx, (size_t)n * 2 * ffn * 2, &scratch), 0);
      ck_assert_int_eq(gpu->ops->alloc(gpu->ctx, (size_t)n * ffn * 2, &a), 0);
      ck_assert_int_eq(gpu->ops->alloc(gpu->ctx, (size_t)n * ffn * 2, &out), 0);
      ck_assert_int_eq(gpu->ops->matmul(gpu->ctx, scratch, &gu.g, NULL, x.g, n), 0);
      ck_assert_int_eq(gpu->ops->silu_mul(gpu->ctx, a, scratch, (uint16_t *)scratch + ffn, n, ffn, 2 * ffn), 0);
      poison(scratch, (size_t)n * 2 * ffn);
      poison(out, (size_t)n * ffn);
      int rc = gpu->ops->matmul_silu_mul(gpu->ctx, out, &gu.g, x.g, n, scratch);
      ck_assert_msg(rc == 0, "matmul_silu_mul: %s", fr_last_error());
      char what[96];
      snprintf(what, sizeof what, "%s matmul_silu_mul n=%d splits %s", kern_type_traits(t)->name, n, ks[k]);
      expect_same_bits(a, out, (size_t)n * ffn * 2, what);
      gpu->ops->free(gpu->ctx, scratch);
      gpu->ops->free(gpu->ctx, a);
      gpu->ops->free(gpu->ctx, out);
      pair_free(&x);
    }
    wpair_free(&gu);
  }
  unsetenv("FERRUM_CUDA_Q4F_KS");
  free(perm);
}
END_TEST

/* A rank's part of a GPTQ act-order weight's order (model_quant_cols):
 * 448 inputs in 512 columns, every other group's run padded to whole
 * blocks with -1 columns. */
static int32_t *padded_perm(void) {
  int32_t *order = rand_perm(448), *p = fr_malloc(512 * sizeof *p);
  for (int b = 0, k = 0, j = 0; b < 16; b++)
    for (int i = 0; i < 32; i++) p[k++] = i < (b % 2 ? 32 : 24) ? order[j++] : -1;
  free(order);
  return p;
}

/* Such a weight: only the Q4F layout takes it; with FERRUM_CUDA_Q4F=0 the
 * load is refused with an error. */
START_TEST(test_matmul_i4g_perm_padded) {
  int32_t *p = padded_perm();
  check_matmul_px(KERN_I4G, 200, 512, true, 1 << 30, p, 448);
  kern_backend_destroy(gpu);
  setenv("FERRUM_CUDA_Q4F", "0", 1);
  ck_assert_int_eq(kern_cuda_create(&gpu, 0), 0);
  ck_assert(!gpu->padded_perm);
  void *host = rand_weight(KERN_I4G, 200, 512);
  kern_weight_t w = {.type = KERN_I4G, .rows = 200, .cols = 512, .row_bytes = kern_row_bytes(KERN_I4G, 512),
                     .perm = p, .x_cols = 448};
  ck_assert_int_eq(gpu->ops->weight_load(gpu->ctx, &w, host), FR_EUNSUPPORTED);
  ck_assert_ptr_null(w.data);
  free(host);
  free(p);
}
END_TEST

/* The 4-bit matmul by wgmma (kcu_q4f_wg.cu; on a device or build without
 * sm_90a the variables change nothing), forced from 65 rows: on grids of
 * any size (FERRUM_CUDA_Q4F_WG_CTAS=0) with CTAs of 64, 128 and 256 tokens
 * (FERRUM_CUDA_Q4F_WG_MT), so n = 100 is two token tiles, part of one, or
 * part of one in two wgmma column blocks (n = 300, past its 256 rows,
 * takes dequantize + cuBLAS); and at each size with the columns split
 * where the grid is short of 13 CTAs (FERRUM_CUDA_Q4F_WG_SPLIT, _CTAS=13:
 * 26 units in 6 splits of 4 or 5, Q4_K's 24 and 12 in 6 and 3, I4G
 * act-order's 8 in 2; each CTA's sums go through a partial tile, added by
 * the last CTA of its block). 147 rows (a part of a 16-row tile and of a
 * CTA's four), a last unit of 32 columns (not Q4_K); I4G also with an
 * act-order permutation, whole and with padding columns. */
START_TEST(test_matmul_q4f_wg) {
  const kern_type_t t = q4_entry(_i);
  static const struct {
    const char *mt, *split, *ctas;
  } cfg[] = {{"1", "0", "0"}, {"2", "0", "0"}, {"4", "0", "0"}, {"1", "1", "13"}, {"2", "1", "13"}, {"4", "1", "13"}};
  int32_t *p512 = rand_perm(512), *pp = padded_perm();
  setenv("FERRUM_CUDA_Q4F_WG", "65", 1);
  for (size_t k = 0; k < FR_ARRAY_SIZE(cfg); k++) {
    kern_backend_destroy(gpu);
    setenv("FERRUM_CUDA_Q4F_WG_MT", cfg[k].mt, 1);
    setenv("FERRUM_CUDA_Q4F_WG_SPLIT", cfg[k].split, 1);
    setenv("FERRUM_CUDA_Q4F_WG_CTAS", cfg[k].ctas, 1);
    ck_assert_int_eq(kern_cuda_create(&gpu, 0), 0);
    check_matmul_n(t, 16 * 9 + 3, t == KERN_Q4_K ? 768 : 288, k % 2 == 1, 1 << 30);
    check_matmul_n(t, 16 * 9 + 3, t == KERN_Q4_K ? 1536 : 1664, k % 2 == 0, 128);
    if (t == KERN_I4G && _i != K_Q4_GROUPED) {
      check_matmul_perm(KERN_I4G, 200, 512, k == 0, 128, p512);
      check_matmul_px(KERN_I4G, 200, 512, k != 0, 128, pp, 448);
    }
  }
  free(p512);
  free(pp);
}
END_TEST

/* ---- mixture of experts ------------------------------------------------------------ */

/* A MoE layer on both backends: a router of the activation type and E
 * experts of `type`. */
typedef struct {
  int E, k, dim, ffn;
  bool norm;
  kern_type_t type;
  wpair_t router, *gate, *up, *down;
  kern_weight_t *cg, *cu, *cd, *gg, *gu, *gd; /* the kern_moe_t arrays of each backend */
} moe_env_t;

static void moe_setup(moe_env_t *m, kern_type_t type, int E, int k, bool norm, int dim, int ffn) {
  *m = (moe_env_t){.E = E, .k = k, .dim = dim, .ffn = ffn, .norm = norm, .type = type};
  wpair_load(&m->router, gpu->act_type, E, dim, rand_weight(gpu->act_type, E, dim));
  m->gate = fr_calloc((size_t)E, sizeof *m->gate);
  m->up = fr_calloc((size_t)E, sizeof *m->up);
  m->down = fr_calloc((size_t)E, sizeof *m->down);
  kern_weight_t **arr[6] = {&m->cg, &m->cu, &m->cd, &m->gg, &m->gu, &m->gd};
  for (int i = 0; i < 6; i++) *arr[i] = fr_calloc((size_t)E, sizeof(kern_weight_t));
  for (int e = 0; e < E; e++) {
    wpair_load_kept(&m->gate[e], type, ffn, dim, rand_weight(type, ffn, dim));
    wpair_load_kept(&m->up[e], type, ffn, dim, rand_weight(type, ffn, dim));
    wpair_load_kept(&m->down[e], type, dim, ffn, rand_weight(type, dim, ffn));
    m->cg[e] = m->gate[e].c, m->cu[e] = m->up[e].c, m->cd[e] = m->down[e].c;
    m->gg[e] = m->gate[e].g, m->gu[e] = m->up[e].g, m->gd[e] = m->down[e].g;
  }
}

static kern_moe_t moe_op(const moe_env_t *m, bool on_gpu) {
  return (kern_moe_t){.router = on_gpu ? &m->router.g : &m->router.c, .gate = on_gpu ? m->gg : m->cg,
                      .up = on_gpu ? m->gu : m->cu, .down = on_gpu ? m->gd : m->cd, .n_experts = m->E,
                      .n_used = m->k, .norm_topk = m->norm};
}

static void moe_free(moe_env_t *m) {
  for (int e = 0; e < m->E; e++) {
    wpair_free(&m->gate[e]);
    wpair_free(&m->up[e]);
    wpair_free(&m->down[e]);
  }
  wpair_free(&m->router);
  free(m->gate), free(m->up), free(m->down);
  free(m->cg), free(m->cu), free(m->cd), free(m->gg), free(m->gu), free(m->gd);
}

/* The exact MoE of one token (x: dim floats) into out (dim doubles), from
 * the weights' host bytes: f64 router logits and softmax, top k (ties: the
 * lower index), f64 expert FFNs (the hidden row rounded to f32 for the
 * down projection's reference). */
static void moe_ref_token(const moe_env_t *m, const float *x, double *out) {
  double *lg = matmul_ref(gpu->act_type, m->router.host, m->E, m->dim, x, 1, NULL, NULL);
  double mx = lg[0], sum = 0;
  for (int e = 1; e < m->E; e++) mx = fmax(mx, lg[e]);
  for (int e = 0; e < m->E; e++) sum += (lg[e] = exp(lg[e] - mx));
  int sel[64];
  double w[64], wsum = 0;
  for (int j = 0; j < m->k; j++) {
    int best = -1;
    for (int e = 0; e < m->E; e++) {
      bool taken = false;
      for (int i = 0; i < j; i++) taken |= sel[i] == e;
      if (!taken && (best < 0 || lg[e] > lg[best])) best = e;
    }
    sel[j] = best;
    wsum += (w[j] = lg[best] / sum);
  }
  for (int d = 0; d < m->dim; d++) out[d] = 0;
  float *h = fr_malloc((size_t)m->ffn * sizeof(float));
  for (int j = 0; j < m->k; j++) {
    double *g = matmul_ref(m->type, m->gate[sel[j]].host, m->ffn, m->dim, x, 1, NULL, NULL);
    double *u = matmul_ref(m->type, m->up[sel[j]].host, m->ffn, m->dim, x, 1, NULL, NULL);
    for (int f = 0; f < m->ffn; f++) h[f] = (float)(g[f] / (1 + exp(-g[f])) * u[f]);
    double *y = matmul_ref(m->type, m->down[sel[j]].host, m->dim, m->ffn, h, 1, NULL, NULL);
    const double wj = m->norm ? w[j] / wsum : w[j];
    for (int d = 0; d < m->dim; d++) out[d] += wj * y[d];
    free(g), free(u), free(y);
  }
  free(h);
  free(lg);
}

/* moe_ffn of n random tokens on both backends against the exact reference;
 * then (graph) the same call captured in a CUDA graph and replayed over new
 * tokens equals an eager call bit for bit. */
static void check_moe(moe_env_t *m, int n, bool graph) {
  const size_t N = (size_t)n * m->dim;
  float *x = rand_vec(N, 1.f);
  pair_t px = pair_put(x, N), po = {NULL, NULL, N};
  ck_assert_int_eq(cpu->ops->alloc(cpu->ctx, N * 4, &po.c), 0);
  ck_assert_int_eq(gpu->ops->alloc(gpu->ctx, N * 2, &po.g), 0);
  poison(po.g, N);
  const kern_moe_t mg = moe_op(m, true), mc = moe_op(m, false);
  int rc = gpu->ops->moe_ffn(gpu->ctx, po.g, px.g, n, &mg);
  ck_assert_msg(rc == 0, "cuda moe_ffn: %s", fr_last_error());
  rc = cpu->ops->moe_ffn(cpu->ctx, po.c, px.c, n, &mc);
  ck_assert_msg(rc == 0, "cpu moe_ffn: %s", fr_last_error());
  double *ref = fr_malloc(N * sizeof(double));
  for (int t = 0; t < n; t++) moe_ref_token(m, x + (size_t)t * m->dim, ref + (size_t)t * m->dim);
  float *g = gpu_get(po.g, N), *c = cpu_get(po.c, N);
  const double eg = nerr_d(g, ref, N), ec = nerr(g, c, N), ecx = nerr_d(c, ref, N);
  fprintf(stderr, "  moe %-5s E=%-3d k=%d norm=%d %dx%d n=%-3d err(exact) %.2e  err(cpu) %.2e  cpu err(exact) %.2e\n",
          kern_type_traits(m->type)->name, m->E, m->k, m->norm, m->dim, m->ffn, n, eg, ec, ecx);
  /* The exact reference decides. The CPU's own error (int8 activations,
   * heavy-tailed hidden rows) can reach several percent for one token whose
   * experts' outputs cancel, so the GPU is held to twice that or 2 tol. */
  const double tol = kern_type_traits(m->type)->quantized ? TOL_QMM : TOL_ACT;
  ck_assert_msg(eg < tol, "moe %s n=%d: error %.3e vs exact", kern_type_traits(m->type)->name, n, eg);
  ck_assert_msg(ec < fmax(2 * tol, 2 * ecx), "moe %s n=%d: error %.3e vs cpu", kern_type_traits(m->type)->name, n, ec);
  if (graph) {
    bool replayed = true;
    for (int round = 0; round < 2; round++) {
      float *x2 = rand_vec(N, 1.f);
      void *xg = gpu_put(x2, N);
      ck_assert_int_eq(gpu->ops->copy(gpu->ctx, px.g, xg, N * 2), 0);
      rc = gpu->ops->moe_ffn(gpu->ctx, po.g, px.g, n, &mg);
      ck_assert_msg(rc == 0, "cuda moe_ffn: %s", fr_last_error());
      float *eager = gpu_get(po.g, N);
      poison(po.g, N);
      const uint64_t key = 7000 + (uint64_t)n; /* one graph per batch size, as the model keys them */
      ck_assert_int_eq(gpu->ops->graph_begin(gpu->ctx, key, &replayed), 0);
      ck_assert_int_eq(replayed, round > 0);
      if (!replayed) ck_assert_int_eq(gpu->ops->moe_ffn(gpu->ctx, po.g, px.g, n, &mg), 0);
      rc = gpu->ops->graph_end(gpu->ctx, key);
      ck_assert_msg(rc == 0, "graph_end: %s", fr_last_error());
      float *gr = gpu_get(po.g, N);
      ck_assert_msg(!memcmp(gr, eager, N * sizeof(float)), "moe n=%d: graph %s differs from eager", n,
                    round ? "replay" : "capture");
      free(eager), free(gr), free(x2);
      gpu->ops->free(gpu->ctx, xg);
    }
  }
  free(ref), free(g), free(c), free(x);
  pair_free(&px);
  pair_free(&po);
}

/* Shapes: (E, k, norm, dim, ffn). ffn 96 leaves partial column tiles in the
 * gate/up GEMM and a partial K stage in the down GEMM (and dim 128 the
 * down GEMM's, in the 128-column wgmma tiles). Each shape's n run the
 * three paths: the decode GEMVs (at most 64 pairs), small tiles (at most
 * 16 pairs an expert on average) and large tiles; the loop's second half
 * takes the large tiles by mma.sync where they would be wgmma's
 * (FERRUM_CUDA_GG_WG=0). */
static const int k_moe_shapes[][5] = {{8, 2, 0, 256, 96}, {16, 4, 1, 128, 256}, {128, 8, 1, 256, 64}};
static const int k_moe_ns[] = {1, 3, 64, 200, 300};

START_TEST(test_moe_dense) {
  const int n_shapes = (int)FR_ARRAY_SIZE(k_moe_shapes), *sh = k_moe_shapes[_i % n_shapes];
  if (_i >= n_shapes) {
    kern_backend_destroy(gpu);
    setenv("FERRUM_CUDA_GG_WG", "0", 1);
    ck_assert_int_eq(kern_cuda_create(&gpu, 0), 0);
  }
  moe_env_t m;
  moe_setup(&m, gpu->act_type, sh[0], sh[1], sh[2], sh[3], sh[4]);
  for (size_t i = 0; i < FR_ARRAY_SIZE(k_moe_ns); i++) check_moe(&m, k_moe_ns[i], i == 0 || i == 2 || i == 4);
  moe_free(&m);
  unsetenv("FERRUM_CUDA_GG_WG");
}
END_TEST

/* A token whose row is NaN (the router's logits NaN: no expert wins) gets a
 * NaN row, not an expert index out of range; its neighbours are unharmed. */
START_TEST(test_moe_nan_token) {
  moe_env_t m;
  moe_setup(&m, gpu->act_type, 128, 8, true, 256, 64);
  const int n = 3;
  const size_t N = (size_t)n * m.dim;
  float *x = rand_vec(N, 1.f);
  for (int d = 0; d < m.dim; d++) x[m.dim + d] = NAN;
  void *xg = gpu_put(x, N), *og = NULL;
  ck_assert_int_eq(gpu->ops->alloc(gpu->ctx, N * 2, &og), 0);
  const kern_moe_t mg = moe_op(&m, true);
  ck_assert_int_eq(gpu->ops->moe_ffn(gpu->ctx, og, xg, n, &mg), 0);
  float *o = gpu_get(og, N);
  double *ref = fr_malloc((size_t)m.dim * sizeof(double));
  for (int t = 0; t < n; t += 2) {
    moe_ref_token(&m, x + (size_t)t * m.dim, ref);
    ck_assert_double_lt(nerr_d(o + (size_t)t * m.dim, ref, (size_t)m.dim), TOL_ACT);
  }
  for (int d = 0; d < m.dim; d++) ck_assert_msg(isnan(o[m.dim + d]), "element %d of the NaN token: %g", d, o[m.dim + d]);
  free(ref), free(o), free(x);
  gpu->ops->free(gpu->ctx, xg);
  gpu->ops->free(gpu->ctx, og);
  moe_free(&m);
}
END_TEST

/* Quantized experts: every type the backend reads, 256-wide rows (a
 * K-quant super-block), on the three paths. */
START_TEST(test_moe_quant) {
  moe_env_t m;
  moe_setup(&m, k_quant[_i], 16, 4, true, 512, 256);
  check_moe(&m, 1, false);
  check_moe(&m, 40, false);
  check_moe(&m, 200, false);
  moe_free(&m);
}
END_TEST

/* ---- embed ---------------------------------------------------------------------------- */

START_TEST(test_embed) {
  const kern_type_t types[] = {KERN_BF16, KERN_F16, KERN_Q4_0, KERN_Q8_0, KERN_Q4_K,
                               KERN_Q5_K, KERN_Q6_K, KERN_Q5_1, KERN_I4G};
  int vocab = 1000, dim = 512, n = 37;
  int32_t tok[37];
  for (int i = 0; i < n; i++) tok[i] = rndi(vocab);
  simple_step(n, tok);
  for (size_t k = 0; k < FR_ARRAY_SIZE(types); k++) {
    wpair_t w;
    wpair_load_kept(&w, types[k], vocab, dim, rand_weight(types[k], vocab, dim));
    pair_t o = {NULL, NULL, 0};
    ck_assert_int_eq(cpu->ops->alloc(cpu->ctx, (size_t)n * dim * 4, &o.c), 0);
    ck_assert_int_eq(gpu->ops->alloc(gpu->ctx, (size_t)n * dim * 2, &o.g), 0);
    poison(o.g, (size_t)n * dim);
    ck_assert_int_eq(cpu->ops->embed(cpu->ctx, o.c, &w.c), 0);
    int rc = gpu->ops->embed(gpu->ctx, o.g, &w.g);
    ck_assert_msg(rc == 0, "embed: %s", fr_last_error());
    char what[64];
    snprintf(what, sizeof what, "embed %s", kern_type_traits(types[k])->name);
    ck_assert_double_lt(cmp_pair(&o, (size_t)n * dim, what), 5e-3);
    pair_free(&o);
    wpair_free(&w);
  }
}
END_TEST

/* ---- norms, elementwise ------------------------------------------------------------------- */

/* rms_norm of n rows of dim, out of place and in place, against the CPU. */
static void check_rms_norm(int n, int dim) {
  float *wh = rand_vec(dim, 1.f);
  wpair_t w;
  wpair_load(&w, KERN_F32, 1, dim, wh);
  pair_t x = pair_rand((size_t)n * dim, 2.f), o = pair_rand((size_t)n * dim, 1.f);
  poison(o.g, (size_t)n * dim);
  ck_assert_int_eq(cpu->ops->rms_norm(cpu->ctx, o.c, x.c, &w.c, n, dim, 1e-5f), 0);
  ck_assert_int_eq(gpu->ops->rms_norm(gpu->ctx, o.g, x.g, &w.g, n, dim, 1e-5f), 0);
  ck_assert_double_lt(cmp_pair(&o, (size_t)n * dim, "rms_norm"), TOL_ACT);
  ck_assert_int_eq(cpu->ops->rms_norm(cpu->ctx, x.c, x.c, &w.c, n, dim, 1e-6f), 0);
  ck_assert_int_eq(gpu->ops->rms_norm(gpu->ctx, x.g, x.g, &w.g, n, dim, 1e-6f), 0);
  ck_assert_double_lt(cmp_pair(&x, (size_t)n * dim, "rms_norm in place"), TOL_ACT);
  pair_free(&x);
  pair_free(&o);
  wpair_free(&w);
}

START_TEST(test_rms_norm) {
  check_rms_norm(13, 576);
  check_rms_norm(4100, 128); /* many short rows (a prefill's per-head norms), the last CTA's partly there */
  check_rms_norm(4099, 64);
  /* fused residual add */
  int n = 13, dim = 576;
  float *wh = rand_vec(dim, 1.f);
  wpair_t w;
  wpair_load(&w, KERN_F32, 1, dim, wh);
  pair_t o = pair_rand((size_t)n * dim, 1.f), r = pair_rand((size_t)n * dim, 3.f), y = pair_rand((size_t)n * dim, 1.f);
  poison(o.g, (size_t)n * dim);
  ck_assert_int_eq(cpu->ops->add_rms_norm(cpu->ctx, o.c, r.c, y.c, &w.c, n, dim, 1e-5f), 0);
  ck_assert_int_eq(gpu->ops->add_rms_norm(gpu->ctx, o.g, r.g, y.g, &w.g, n, dim, 1e-5f), 0);
  ck_assert_double_lt(cmp_pair(&o, (size_t)n * dim, "add_rms_norm out"), TOL_ACT);
  ck_assert_double_lt(cmp_pair(&r, (size_t)n * dim, "add_rms_norm residual"), TOL_ACT);
  pair_free(&o);
  pair_free(&r);
  pair_free(&y);
  wpair_free(&w);
}
END_TEST

START_TEST(test_rope) {
  int n = 19, hd = 64, nh = 5, stride = nh * hd + 64;
  for (int mode = 0; mode < 2; mode++) {
    int n_rot = mode ? 64 : 48;
    float *inv = fr_malloc(n_rot / 2 * 4);
    for (int i = 0; i < n_rot / 2; i++) inv[i] = powf(10000.f, -2.f * i / n_rot);
    wpair_t f;
    wpair_load(&f, KERN_F32, 1, n_rot / 2, inv);
    kern_rope_t cr = {.mode = (kern_rope_mode_t)mode, .n_rot = n_rot, .inv_freq = &f.c, .attn_factor = 1.f};
    kern_rope_t gr = cr;
    gr.inv_freq = &f.g;
    simple_step(n, NULL);
    pair_t x = pair_rand((size_t)n * stride, 1.f);
    ck_assert_int_eq(cpu->ops->rope(cpu->ctx, x.c, nh, hd, stride, &cr), 0);
    int rc = gpu->ops->rope(gpu->ctx, x.g, nh, hd, stride, &gr);
    ck_assert_msg(rc == 0, "rope: %s", fr_last_error());
    ck_assert_double_lt(cmp_pair(&x, (size_t)n * stride, mode ? "rope neox" : "rope norm (n_rot < head_dim)"),
                        TOL_ACT);
    pair_free(&x);
    wpair_free(&f);
  }
}
END_TEST

START_TEST(test_elementwise) {
  int n = 11, d = 1536, stride = 2 * d;
  simple_step(n, NULL);
  pair_t gu = pair_rand((size_t)n * stride, 2.f), o = pair_rand((size_t)n * d, 1.f);
  poison(o.g, (size_t)n * d);
  ck_assert_int_eq(cpu->ops->silu_mul(cpu->ctx, o.c, gu.c, (float *)gu.c + d, n, d, stride), 0);
  ck_assert_int_eq(gpu->ops->silu_mul(gpu->ctx, o.g, gu.g, (uint16_t *)gu.g + d, n, d, stride), 0);
  ck_assert_double_lt(cmp_pair(&o, (size_t)n * d, "silu_mul"), TOL_ACT);
  { /* rows not in whole 16-byte vectors: the element-wise form */
    const int d1 = d - 3;
    pair_t o1 = pair_rand((size_t)n * d1, 1.f);
    poison(o1.g, (size_t)n * d1);
    ck_assert_int_eq(cpu->ops->silu_mul(cpu->ctx, o1.c, gu.c, (float *)gu.c + d1, n, d1, stride - 1), 0);
    ck_assert_int_eq(gpu->ops->silu_mul(gpu->ctx, o1.g, gu.g, (uint16_t *)gu.g + d1, n, d1, stride - 1), 0);
    ck_assert_double_lt(cmp_pair(&o1, (size_t)n * d1, "silu_mul, d % 8 = 5"), TOL_ACT);
    pair_free(&o1);
  }
  pair_t a = pair_rand((size_t)n * d, 1.f), b = pair_rand((size_t)n * d, 1.f);
  poison(o.g, (size_t)n * d);
  ck_assert_int_eq(cpu->ops->add(cpu->ctx, o.c, a.c, b.c, (size_t)n * d), 0);
  ck_assert_int_eq(gpu->ops->add(gpu->ctx, o.g, a.g, b.g, (size_t)n * d), 0);
  ck_assert_double_lt(cmp_pair(&o, (size_t)n * d, "add"), TOL_ACT);
  /* last_rows over 3 sequences of 4, 1, 6 tokens */
  int32_t qs[4] = {0, 4, 5, 11}, cl[3] = {4, 1, 6}, pos[11], slots[11], bt[3] = {0, 0, 0};
  for (int i = 0; i < 11; i++) pos[i] = i, slots[i] = -1;
  kern_step_t s = {.n_tokens = 11, .n_seqs = 3, .positions = pos, .slots = slots, .q_start = qs, .ctx_len = cl,
                   .block_tables = bt, .max_blocks = 1};
  step_both(&s);
  poison(o.g, (size_t)3 * d);
  ck_assert_int_eq(cpu->ops->last_rows(cpu->ctx, o.c, a.c, d), 0);
  ck_assert_int_eq(gpu->ops->last_rows(gpu->ctx, o.g, a.g, d), 0);
  ck_assert_double_lt(cmp_pair(&o, (size_t)3 * d, "last_rows"), 1e-6);
  /* pool_rows (mean and first row) over the same sequences */
  poison(o.g, (size_t)3 * d);
  ck_assert_int_eq(cpu->ops->pool_rows(cpu->ctx, o.c, a.c, d, KERN_POOL_MEAN), 0);
  ck_assert_int_eq(gpu->ops->pool_rows(gpu->ctx, o.g, a.g, d, KERN_POOL_MEAN), 0);
  ck_assert_double_lt(cmp_pair(&o, (size_t)3 * d, "pool_rows mean"), TOL_ACT);
  poison(o.g, (size_t)3 * d);
  ck_assert_int_eq(cpu->ops->pool_rows(cpu->ctx, o.c, a.c, d, KERN_POOL_FIRST), 0);
  ck_assert_int_eq(gpu->ops->pool_rows(gpu->ctx, o.g, a.g, d, KERN_POOL_FIRST), 0);
  ck_assert_double_lt(cmp_pair(&o, (size_t)3 * d, "pool_rows first"), 1e-6);
  pair_free(&gu);
  pair_free(&o);
  pair_free(&a);
  pair_free(&b);
}
END_TEST

/* ---- attention ----------------------------------------------------------------------------- */

typedef struct {
  kern_kv_pool_t pc, pg;
  kern_kv_config_t cfg;
  int n_seqs, max_blocks;
  int32_t *bt; /* (n_seqs, max_blocks), then the spare blocks */
} kvenv_t;

/* Pools of dtype dt on both backends (a quantized dtype: the same int8 /
 * E4M3 cache semantics on both, so they compare like the f32 / act pools). */
static void kv_setup_dt(kvenv_t *e, int n_layers, int n_kv, int hd, int bs, int n_seqs, int max_ctx,
                        kern_kv_dtype_t dt) {
  memset(e, 0, sizeof(*e));
  e->n_seqs = n_seqs;
  e->max_blocks = (max_ctx + bs - 1) / bs;
  int n_blocks = n_seqs * e->max_blocks + 7;
  e->cfg = (kern_kv_config_t){.n_layers = n_layers, .n_kv_heads = n_kv, .head_dim = hd, .block_size = bs,
                              .n_blocks = n_blocks, .type = KERN_F32, .dtype = dt};
  ck_assert_int_eq(cpu->ops->kv_pool_init(cpu->ctx, &e->pc, &e->cfg, NULL), 0);
  kern_kv_config_t gc = e->cfg;
  gc.type = gpu->act_type;
  int rc = gpu->ops->kv_pool_init(gpu->ctx, &e->pg, &gc, NULL);
  ck_assert_msg(rc == 0, "kv_pool_init: %s", fr_last_error());
  /* a random permutation of the blocks, dealt to the sequences */
  int32_t *perm = fr_malloc(n_blocks * 4);
  for (int i = 0; i < n_blocks; i++) perm[i] = i;
  for (int i = n_blocks - 1; i > 0; i--) {
    int j = rndi(i + 1), t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  e->bt = perm;
}

static void kv_setup(kvenv_t *e, int n_layers, int n_kv, int hd, int bs, int n_seqs, int max_ctx) {
  kv_setup_dt(e, n_layers, n_kv, hd, bs, n_seqs, max_ctx, KERN_KV_AUTO);
}

static void kv_teardown(kvenv_t *e) {
  cpu->ops->kv_pool_deinit(cpu->ctx, &e->pc);
  gpu->ops->kv_pool_deinit(gpu->ctx, &e->pg);
  free(e->bt);
}

/* A step where sequence s has cached[s] tokens and n_new[s] new ones. */
static int build_step(kvenv_t *e, const int *cached, const int *n_new, kern_step_t *s, int32_t **bufs) {
  int nt = 0;
  for (int i = 0; i < e->n_seqs; i++) nt += n_new[i];
  int32_t *pos = fr_malloc(nt * 4 + 4), *slots = fr_malloc(nt * 4 + 4);
  int32_t *qs = fr_malloc((e->n_seqs + 1) * 4), *cl = fr_malloc(e->n_seqs * 4);
  int t = 0;
  for (int i = 0; i < e->n_seqs; i++) {
    qs[i] = t;
    cl[i] = cached[i] + n_new[i];
    for (int j = 0; j < n_new[i]; j++, t++) {
      int p = cached[i] + j;
      pos[t] = p;
      slots[t] = e->bt[i * e->max_blocks + p / e->cfg.block_size] * e->cfg.block_size + p % e->cfg.block_size;
    }
  }
  qs[e->n_seqs] = nt;
  *s = (kern_step_t){.n_tokens = nt, .n_seqs = e->n_seqs, .positions = pos, .slots = slots, .q_start = qs,
                     .ctx_len = cl, .block_tables = e->bt, .max_blocks = e->max_blocks};
  bufs[0] = pos;
  bufs[1] = slots;
  bufs[2] = qs;
  bufs[3] = cl;
  return nt;
}

static void free_step(int32_t **bufs) {
  for (int i = 0; i < 4; i++) free(bufs[i]);
}

/* Appends random K/V for the step's tokens into layer `layer` of both pools. */
static void append_random(kvenv_t *e, int nt, int layer) {
  int row = e->cfg.n_kv_heads * e->cfg.head_dim;
  pair_t k = pair_rand((size_t)nt * row, 1.f), v = pair_rand((size_t)nt * row, 1.f);
  ck_assert_int_eq(cpu->ops->kv_append(cpu->ctx, &e->pc, layer, k.c, row, v.c, row), 0);
  int rc = gpu->ops->kv_append(gpu->ctx, &e->pg, layer, k.g, row, v.g, row);
  ck_assert_msg(rc == 0, "kv_append: %s", fr_last_error());
  pair_free(&k);
  pair_free(&v);
}

/* build_step, begun on both backends, with random K/V appended for its
 * tokens into layer `layer` of both pools; returns the step's tokens. */
static int step_append(kvenv_t *e, const int *cached, const int *n_new, int layer, kern_step_t *s, int32_t **bufs) {
  const int nt = build_step(e, cached, n_new, s, bufs);
  step_both(s);
  append_random(e, nt, layer);
  return nt;
}

/* Runs attention of the step's tokens in both backends (window: keys a
 * query sees, 0 all) and compares. */
static double attn_compare(kvenv_t *e, int nt, int layer, int n_heads, int window, const char *what) {
  int hd = e->cfg.head_dim, qs = n_heads * hd + 8 * (n_heads % 2); /* odd head counts get a padded stride */
  pair_t q = pair_rand((size_t)nt * qs, 1.f), o = pair_rand((size_t)nt * n_heads * hd, 1.f);
  poison(o.g, (size_t)nt * n_heads * hd);
  float scale = 1.f / sqrtf((float)hd);
  ck_assert_int_eq(cpu->ops->attention(cpu->ctx, o.c, q.c, qs, &e->pc, layer, n_heads, hd, scale, window), 0);
  int rc = gpu->ops->attention(gpu->ctx, o.g, q.g, qs, &e->pg, layer, n_heads, hd, scale, window);
  ck_assert_msg(rc == 0, "attention: %s", fr_last_error());
  double err = cmp_pair(&o, (size_t)nt * n_heads * hd, what);
  pair_free(&q);
  pair_free(&o);
  return err;
}

/* (n_kv, group, head_dim) per _i. */
static const int k_attn_shapes[][3] = {{2, 1, 64}, {2, 4, 128}, {1, 8, 128}, {3, 3, 64}, {2, 7, 64}};

/* attn_prefill_case's step 1: the new tokens of its 4 sequences (step 2's cached ones). */
static const int k_pf_step1[4] = {70, 1, 133, 17};

/* Step 1 of attn_prefill_case's sequences: plain prefills of
 * k_pf_step1 tokens (one of a single token), begun on both backends with
 * their K/V appended to layer 1; returns the step's tokens. */
static int prefill_step1(kvenv_t *e, kern_step_t *s, int32_t **bufs) {
  const int z[4] = {0, 0, 0, 0};
  return step_append(e, z, k_pf_step1, 1, s, bufs);
}

/* Which prefill kernel attn_prefill_case runs: the tensor-core one with
 * the defaults (over a quantized pool: on the K/V converted once a step,
 * kcu_attn.cu's kvd, where the loop would convert its blocks at least
 * twice), the SIMT one, the tensor-core one converting a quantized pool's
 * tiles in its loop (FERRUM_CUDA_KVD_MB=0), on kvd at every step
 * (FERRUM_CUDA_KVD_REUSE=0), the tensor-core one with a mixed step's
 * prefill after its decodes on one stream (FERRUM_CUDA_ATTN_SIDE=0; by
 * default it runs on a second stream beside them), or with a query head a
 * CTA (FERRUM_CUDA_PF_PACK=0; by default a CTA takes a query group's heads). */
typedef enum { PF_TC, PF_SIMT, PF_TC_LOOP, PF_TC_KVD, PF_TC_SERIAL, PF_TC_ONE_HEAD, PF_N } pf_kernel_t;
static const char *const k_pf_env[] = {NULL,
                                       "FERRUM_CUDA_SIMT_PREFILL=1",
                                       "FERRUM_CUDA_KVD_MB=0",
                                       "FERRUM_CUDA_KVD_REUSE=0",
                                       "FERRUM_CUDA_ATTN_SIDE=0",
                                       "FERRUM_CUDA_PF_PACK=0"};
static const char *const k_pf_label[] = {"", " simt", " (in the loop)", " (converted)", " (one stream)",
                                         " (a head a CTA)"};

/* Prefill, chunked prefill (with windows) and a mixed step of shape sh on
 * pools of dtype dt, with kernel k. */
static void attn_prefill_case(const int *sh, pf_kernel_t k, kern_kv_dtype_t dt) {
  if (k_pf_env[k]) {
    kern_backend_destroy(gpu);
    putenv((char *)k_pf_env[k]);
    ck_assert_int_eq(kern_cuda_create(&gpu, 0), 0);
  }
  const uint64_t runs0 = kern_cuda_kvd_runs(gpu);
  int n_kv = sh[0], n_heads = sh[0] * sh[1], hd = sh[2];
  char dn[48];
  snprintf(dn, sizeof dn, "%s%s", dt == KERN_KV_AUTO ? "" : dt == KERN_KV_INT8 ? " int8" : " fp8", k_pf_label[k]);
  kvenv_t e;
  kv_setup_dt(&e, 2, n_kv, hd, 16, 4, 400, dt);
  kern_step_t s;
  int32_t *bufs[4];
  int nt = prefill_step1(&e, &s, bufs);
  char what[96];
  snprintf(what, sizeof what, "prefill%s kv=%d g=%d hd=%d", dn, n_kv, sh[1], hd);
  ck_assert_double_lt(attn_compare(&e, nt, 1, n_heads, 0, what), TOL_ACT);
  free_step(bufs);
  /* step 2: chunked prefill over the cached prefix; the last sequence has
   * no new tokens this step */
  int n2[4] = {90, 5, 64, 0};
  nt = step_append(&e, k_pf_step1, n2, 1, &s, bufs);
  snprintf(what, sizeof what, "chunked prefill%s kv=%d g=%d hd=%d", dn, n_kv, sh[1], hd);
  ck_assert_double_lt(attn_compare(&e, nt, 1, n_heads, 0, what), TOL_ACT);
  for (int w = 40; w <= 100; w += 60) { /* sliding windows: tiles before the window skipped, edges masked */
    snprintf(what, sizeof what, "window %d%s kv=%d g=%d hd=%d", w, dn, n_kv, sh[1], hd);
    ck_assert_double_lt(attn_compare(&e, nt, 1, n_heads, w, what), TOL_ACT);
  }
  free_step(bufs);
  /* step 3: a mixed step, decodes beside one prefill chunk (the decode
   * kernel takes the one-token sequences, the prefill kernel the chunk) */
  int c3[4] = {160, 6, 197, 17}, n3[4] = {1, 30, 1, 1};
  nt = step_append(&e, c3, n3, 1, &s, bufs);
  snprintf(what, sizeof what, "mixed%s kv=%d g=%d hd=%d", dn, n_kv, sh[1], hd);
  ck_assert_double_lt(attn_compare(&e, nt, 1, n_heads, 0, what), TOL_ACT);
  snprintf(what, sizeof what, "mixed, window 50%s kv=%d g=%d hd=%d", dn, n_kv, sh[1], hd);
  ck_assert_double_lt(attn_compare(&e, nt, 1, n_heads, 50, what), TOL_ACT);
  free_step(bufs);
  kv_teardown(&e);
  /* each of the 6 attention calls had a prefill sequence: on a quantized pool the tensor-core kernel read the
   * converted K/V in all of them where forced, and by default where the loop would convert each context block
   * at least KCU_KVD_REUSE = 2 times on average, once a CTA that reads it: the CTAs of a KV head take 64 of its
   * rows of (query, head of the group) each (kcu_pf_group; or, FERRUM_CUDA_PF_PACK=0, of one head), so its
   * sequences of q > 1 tokens over nb blocks come to ceil(q G / 64) nb conversions. Step 1 (q of 70, 133, 17
   * over 5, 9, 2 blocks): 39 for G = 1, more for more; step 2 (90, 5, 64 over 10, 1, 13 blocks): 34 < 48 for
   * G = 1, 57 for 2; step 3 (30 over 3): 3, 3 for G = 2 (6 unpacked), 6 for 3. The shapes' groups are 1, 3, 4, 7
   * and 8: one call for G = 1, all 6 for the rest */
  const uint64_t by_default = sh[1] >= 3 ? 6 : 1;
  const bool tc = k == PF_TC || k == PF_TC_SERIAL || k == PF_TC_ONE_HEAD;
  const uint64_t want = dt == KERN_KV_AUTO ? 0 : k == PF_TC_KVD ? 6 : tc ? by_default : 0;
  ck_assert_msg(kern_cuda_kvd_runs(gpu) - runs0 == want, "%s: %llu prefills on the converted K/V, want %llu", what,
                (unsigned long long)(kern_cuda_kvd_runs(gpu) - runs0), (unsigned long long)want);
}

/* _i = (kernel, shape): the tensor-core prefill, the SIMT one, the
 * tensor-core one on one stream and with a head a CTA */
static const pf_kernel_t k_pf_bf16[] = {PF_TC, PF_SIMT, PF_TC_SERIAL, PF_TC_ONE_HEAD};
START_TEST(test_attention_prefill) {
  const int n_shapes = (int)FR_ARRAY_SIZE(k_attn_shapes);
  attn_prefill_case(k_attn_shapes[_i % n_shapes], k_pf_bf16[_i / n_shapes], KERN_KV_AUTO);
}
END_TEST

/* The same over quantized caches: _i = (dtype, kernel, shape), int8 then
 * fp8, each kernel of pf_kernel_t. */
START_TEST(test_attention_prefill_kvq) {
  const int n_shapes = (int)FR_ARRAY_SIZE(k_attn_shapes);
  const int shape = _i % n_shapes, k = _i / n_shapes % PF_N, fp8 = _i / (PF_N * n_shapes);
  attn_prefill_case(k_attn_shapes[shape], (pf_kernel_t)k, fp8 ? KERN_KV_FP8 : KERN_KV_INT8);
}
END_TEST

/* A speculative verify step: k + 1 = 5 new tokens a sequence over cached
 * contexts of 17 to 600 tokens, the whole window and the last 100, on
 * bf16 and fp8 pools; _i = (a head a CTA, fp8, shape): by default a
 * tensor-core prefill CTA takes the group's heads, 5 queries x G heads of
 * its 64 rows (kcu_pf_group), else one head, 5 live rows of 64. */
START_TEST(test_attention_verify) {
  const int n_shapes = (int)FR_ARRAY_SIZE(k_attn_shapes), *sh = k_attn_shapes[_i % n_shapes];
  const bool fp8 = _i / n_shapes % 2, one_head = _i / (2 * n_shapes);
  if (one_head) {
    kern_backend_destroy(gpu);
    putenv((char *)"FERRUM_CUDA_PF_PACK=0");
    ck_assert_int_eq(kern_cuda_create(&gpu, 0), 0);
  }
  kvenv_t e;
  kv_setup_dt(&e, 1, sh[0], sh[2], 16, 4, 640, fp8 ? KERN_KV_FP8 : KERN_KV_AUTO);
  const int cached[4] = {600, 45, 129, 17}, none[4] = {0, 0, 0, 0}, five[4] = {5, 5, 5, 5};
  kern_step_t s;
  int32_t *bufs[4];
  int nt = step_append(&e, none, cached, 0, &s, bufs);
  free_step(bufs);
  nt = step_append(&e, cached, five, 0, &s, bufs);
  for (int w = 0; w <= 100; w += 100) {
    char what[96];
    snprintf(what, sizeof what, "verify%s%s, window %d kv=%d g=%d hd=%d", fp8 ? " fp8" : "",
             one_head ? " (a head a CTA)" : "", w, sh[0], sh[1], sh[2]);
    ck_assert_double_lt(attn_compare(&e, nt, 0, sh[0] * sh[1], w, what), TOL_ACT);
  }
  free_step(bufs);
  kv_teardown(&e);
}
END_TEST

/* A draft model's pool, narrower than the target's and made after it (as
 * the worker makes them): the target's prefill on the converted K/V
 * (kcu_attn.cu's kvd) needs blocks sized by the wider rows. Sized by the
 * last pool's, kvd held a quarter of the target's blocks here and the rest
 * of K landed on V's. */
START_TEST(test_attention_prefill_kvq_draft_pool) {
  kern_backend_destroy(gpu); /* no wider pool made before this one */
  ck_assert_int_eq(kern_cuda_create(&gpu, 0), 0);
  kvenv_t e;
  kv_setup_dt(&e, 2, 2, 128, 16, 4, 400, KERN_KV_FP8);
  kern_kv_config_t dc = {.n_layers = 1, .n_kv_heads = 1, .head_dim = 64, .block_size = 16, .n_blocks = 64,
                         .type = gpu->act_type, .dtype = KERN_KV_FP8};
  kern_kv_pool_t draft;
  int rc = gpu->ops->kv_pool_init(gpu->ctx, &draft, &dc, NULL);
  ck_assert_msg(rc == 0, "kv_pool_init (draft): %s", fr_last_error());
  const uint64_t runs0 = kern_cuda_kvd_runs(gpu);
  kern_step_t s;
  int32_t *bufs[4];
  int nt = prefill_step1(&e, &s, bufs);
  ck_assert_double_lt(attn_compare(&e, nt, 1, 8, 0, "prefill fp8 beside a narrower draft pool kv=2 g=4 hd=128"),
                      TOL_ACT);
  ck_assert_int_eq(kern_cuda_kvd_runs(gpu) - runs0, 1);
  free_step(bufs);
  gpu->ops->kv_pool_deinit(gpu->ctx, &draft);
  kv_teardown(&e);
}
END_TEST

/* Fills the GPU pool with NaN bytes (every dtype reads 0xff..ff as NaN or
 * as a finite value under a NaN scale): a kernel that lets a row outside a
 * context into its output, even times zero, fails the comparison. */
static void kv_poison(kvenv_t *e) {
  const size_t bytes = kern_kv_pool_bytes(&e->pg.cfg);
  void *nan = fr_malloc(bytes);
  memset(nan, 0xff, bytes);
  ck_assert_int_eq(gpu->ops->upload(gpu->ctx, e->pg.base, nan, bytes), 0);
  free(nan);
}

/* A decode step of shape sh on pools of dtype dt with blocks of bs tokens,
 * NaN where nothing was written: n sequences with lens[s] cached tokens get
 * one new token each, the last sequence as padding (ctx_len 0); attention
 * compared over the whole context and over its last `window` tokens. */
static void attn_decode_run(const int *sh, kern_kv_dtype_t dt, int bs, int n, const int *lens, int max_ctx,
                            int window, const char *label) {
  int n_kv = sh[0], n_heads = sh[0] * sh[1], hd = sh[2];
  const char *dn = dt == KERN_KV_AUTO ? "" : dt == KERN_KV_INT8 ? " int8" : " fp8";
  kvenv_t e;
  kv_setup_dt(&e, 1, n_kv, hd, bs, n, max_ctx, dt);
  kv_poison(&e);
  int *z = fr_calloc(n, sizeof(int)), *one = fr_malloc(n * sizeof(int));
  for (int i = 0; i < n; i++) one[i] = 1;
  kern_step_t s;
  int32_t *bufs[4];
  int nt = step_append(&e, z, lens, 0, &s, bufs);
  free_step(bufs);
  nt = build_step(&e, lens, one, &s, bufs);
  bufs[3][n - 1] = 0;
  bufs[1][n - 1] = -1;
  step_both(&s);
  append_random(&e, nt, 0);
  char what[96];
  snprintf(what, sizeof what, "decode %s%s kv=%d g=%d hd=%d", label, dn, n_kv, sh[1], hd);
  ck_assert_double_lt(attn_compare(&e, nt, 0, n_heads, 0, what), TOL_ACT);
  snprintf(what, sizeof what, "decode %s, window %d%s kv=%d g=%d hd=%d", label, window, dn, n_kv, sh[1], hd);
  ck_assert_double_lt(attn_compare(&e, nt, 0, n_heads, window, what), TOL_ACT);
  free_step(bufs);
  kv_teardown(&e);
  free(z), free(one);
}

/* Decode steps of shape sh over a long context on pools of dtype dt. */
static void attn_decode_case(const int *sh, kern_kv_dtype_t dt) {
  const int lens[5] = {4500, 200, 37, 1, 0};
  attn_decode_run(sh, dt, 16, 5, lens, 4600, 1000, "4.5k");
}

/* These few sequences take the tensor-core kernel split along the context
 * (about 2 CTAs a SM: over 30 splits of the 4.5k tokens on an H200; the
 * short contexts, up to two chunks, all in one split that writes the output
 * while the 4.5k's splits merge); _i past the shapes: the same in splits of at
 * least 16 tokens (FERRUM_CUDA_DEC_MCHUNK: the 64 splits cap, tiles that
 * overhang both ends of a split), on the SIMT kernel
 * (FERRUM_CUDA_DEC_MSPLIT=0), and on the tensor-core kernel unsplit over
 * 4.5k tokens (and FERRUM_CUDA_DEC_MMA=0). */
static const char *const k_dec_env[][3] = {
    {"1", "128", "-1"}, {"1", "16", "-1"}, {"0", "128", "-1"}, {"0", "128", "0"}};
START_TEST(test_attention_decode) {
  const int n_shapes = (int)FR_ARRAY_SIZE(k_attn_shapes);
  const char *const *env = k_dec_env[_i / n_shapes];
  kern_backend_destroy(gpu);
  setenv("FERRUM_CUDA_DEC_MSPLIT", env[0], 1);
  setenv("FERRUM_CUDA_DEC_MCHUNK", env[1], 1);
  setenv("FERRUM_CUDA_DEC_MMA", env[2], 1);
  ck_assert_int_eq(kern_cuda_create(&gpu, 0), 0);
  attn_decode_case(k_attn_shapes[_i % n_shapes], KERN_KV_AUTO);
  unsetenv("FERRUM_CUDA_DEC_MSPLIT");
  unsetenv("FERRUM_CUDA_DEC_MCHUNK");
  unsetenv("FERRUM_CUDA_DEC_MMA");
}
END_TEST

/* Decode batches wide enough that the grid passes one wave of CTAs (the
 * shapes above fit one): the tensor-core decode kernel (head_dim <= 128,
 * groups <= 8) or the SIMT one without its register prefetch (head_dim
 * 256). Over 520 (sequence, KV head) pairs, contexts of 1 to 300 tokens, in
 * blocks of sh[3] tokens: multiples of 16 take the bulk tensor copies (48:
 * a 64-token tile across two blocks), 8 the cp.async loader. _i past the
 * shapes: the same with FERRUM_CUDA_DEC_TMA=0 (the cp.async loader for
 * all), then with 2 stages (these grids take 3 by default). */
static const int k_wide_shapes[][4] = {{8, 4, 128, 16}, {8, 1, 64, 16}, {8, 8, 128, 16},
                                       {4, 2, 256, 16}, {8, 4, 128, 48}, {8, 2, 64, 8}};
START_TEST(test_attention_decode_wide) {
  const int n_shapes = (int)FR_ARRAY_SIZE(k_wide_shapes), *sh = k_wide_shapes[_i % n_shapes];
  static const char *tma[] = {"-1", "0", "2"};
  if (_i >= n_shapes) {
    kern_backend_destroy(gpu);
    setenv("FERRUM_CUDA_DEC_TMA", tma[_i / n_shapes], 1);
    ck_assert_int_eq(kern_cuda_create(&gpu, 0), 0);
  }
  const int n = (520 + sh[0] - 1) / sh[0] + 1;
  int *lens = fr_malloc(n * sizeof(int));
  for (int i = 0; i < n; i++) lens[i] = i == n - 1 ? 0 : 1 + rndi(300);
  char label[48];
  snprintf(label, sizeof label, "%d seqs, blocks of %d, DEC_TMA %s", n, sh[3], tma[_i / n_shapes]);
  attn_decode_run(sh, KERN_KV_AUTO, sh[3], n, lens, 302 + sh[3], 100, label);
  free(lens);
}
END_TEST

/* The wide decode batches of test_attention_decode_wide on quantized pools
 * (NaN bytes and scales where nothing was written): _i = (case, shape), int8
 * then fp8 on the tensor-core kernel where the shape takes it (its bytes
 * copied by TMA), then int8 on the SIMT kernel (FERRUM_CUDA_DEC_MMA_Q=0). */
START_TEST(test_attention_decode_wide_kvq) {
  const int n_shapes = (int)FR_ARRAY_SIZE(k_wide_shapes), *sh = k_wide_shapes[_i % n_shapes], cs = _i / n_shapes;
  if (cs == 2) {
    kern_backend_destroy(gpu);
    setenv("FERRUM_CUDA_DEC_MMA_Q", "0", 1);
    ck_assert_int_eq(kern_cuda_create(&gpu, 0), 0);
  }
  const int n = (520 + sh[0] - 1) / sh[0] + 1;
  int *lens = fr_malloc(n * sizeof(int));
  for (int i = 0; i < n; i++) lens[i] = i == n - 1 ? 0 : 1 + rndi(300);
  char label[48];
  snprintf(label, sizeof label, "%d seqs, blocks of %d%s", n, sh[3], cs == 2 ? ", SIMT" : "");
  attn_decode_run(sh, cs == 1 ? KERN_KV_FP8 : KERN_KV_INT8, sh[3], n, lens, 302 + sh[3], 100, label);
  free(lens);
  if (cs == 2) {
    kern_backend_destroy(gpu);
    unsetenv("FERRUM_CUDA_DEC_MMA_Q");
    ck_assert_int_eq(kern_cuda_create(&gpu, 0), 0);
  }
}
END_TEST

/* _i = (dtype, shape): int8 then fp8. */
START_TEST(test_attention_decode_kvq) {
  const int n_shapes = (int)FR_ARRAY_SIZE(k_attn_shapes);
  attn_decode_case(k_attn_shapes[_i % n_shapes], _i / n_shapes ? KERN_KV_FP8 : KERN_KV_INT8);
}
END_TEST

/* Every value of a quantized pool's bytes (host), dequantized, layer by
 * layer, K then V: (2 * n_layers * slots * n_kv * head_dim) floats. */
static float *kvq_values(const kern_kv_config_t *cf, const uint8_t *bytes) {
  const size_t lb = kern_kv_layer_bytes(cf), sb = kern_kv_scale_bytes(cf), hd = (size_t)cf->head_dim;
  const size_t rows = lb / hd; /* (slot, KV head) rows of a plane */
  float *out = fr_malloc(2 * (size_t)cf->n_layers * lb * sizeof(float));
  for (size_t pl = 0; pl < 2 * (size_t)cf->n_layers; pl++) {
    const uint8_t *q = bytes + pl * lb;
    const uint16_t *sc = (const uint16_t *)(bytes + 2 * (size_t)cf->n_layers * lb + pl * sb);
    for (size_t r = 0; r < rows; r++)
      for (size_t e = 0; e < hd; e++)
        out[pl * lb + r * hd + e] = kern_kv_dequant(cf->dtype, q + r * hd, (int)e) * fr_fp16_to_fp32(sc[r]);
  }
  return out;
}

/* The quantizing append, the fused rope + append and the block copy on a
 * quantized pool: the GPU pool's dequantized values against the CPU's
 * (the same quantizer over the CPU's f32 and the GPU's bf16 inputs). */
START_TEST(test_kv_append_kvq) {
  for (int d = KERN_KV_INT8; d <= KERN_KV_FP8; d++) {
    const kern_kv_dtype_t dt = (kern_kv_dtype_t)d;
    kvenv_t e;
    const int n_kv = 2, hd = 64, nh = 6, stride = (nh + 2 * n_kv) * hd;
    kv_setup_dt(&e, 2, n_kv, hd, 16, 3, 64, dt);
    int cached[3] = {0, 5, 30}, n_new[3] = {9, 1, 4};
    kern_step_t s;
    int32_t *bufs[4];
    int nt = build_step(&e, cached, n_new, &s, bufs);
    bufs[1][9] = -1; /* padding: no K/V write */
    step_both(&s);
    append_random(&e, nt, 0); /* layer 0: kv_append */
    float *inv = fr_malloc(hd / 2 * 4); /* layer 1: rope + kv_append, fused on the GPU */
    for (int i = 0; i < hd / 2; i++) inv[i] = powf(10000.f, -2.f * i / hd);
    wpair_t f;
    wpair_load(&f, KERN_F32, 1, hd / 2, inv);
    kern_rope_t cr = {.mode = KERN_ROPE_NEOX, .n_rot = hd, .inv_freq = &f.c, .attn_factor = 1.f}, gr = cr;
    gr.inv_freq = &f.g;
    pair_t x = pair_rand((size_t)nt * stride, 1.f);
    size_t ko = (size_t)nh * hd, vo = ko + (size_t)n_kv * hd;
    ck_assert_int_eq(cpu->ops->rope(cpu->ctx, x.c, nh, hd, stride, &cr), 0);
    ck_assert_int_eq(cpu->ops->rope(cpu->ctx, (float *)x.c + ko, n_kv, hd, stride, &cr), 0);
    ck_assert_int_eq(cpu->ops->kv_append(cpu->ctx, &e.pc, 1, (float *)x.c + ko, stride, (float *)x.c + vo, stride), 0);
    uint16_t *g = x.g;
    int rc = gpu->ops->rope_kv_append(gpu->ctx, &e.pg, 1, g, stride, g + ko, g + vo, stride, nh, &gr);
    ck_assert_msg(rc == 0, "rope_kv_append: %s", fr_last_error());
    ck_assert_double_lt(cmp_pair(&x, (size_t)nt * stride, "rope_kv_append (quantized pool): q, k"), TOL_ACT);
    pair_free(&x);
    wpair_free(&f); /* frees inv too */
    free_step(bufs);
    const int32_t *spare = e.bt + 3 * e.max_blocks; /* copies carry the scales */
    int32_t pairs[4] = {e.bt[0], spare[0], e.bt[2 * e.max_blocks + 1], spare[1]};
    ck_assert_int_eq(cpu->ops->kv_copy_blocks(cpu->ctx, &e.pc, pairs, 2), 0);
    ck_assert_int_eq(gpu->ops->kv_copy_blocks(gpu->ctx, &e.pg, pairs, 2), 0);
    const size_t bytes = kern_kv_pool_bytes(&e.cfg);
    uint8_t *gb = fr_malloc(bytes);
    ck_assert_int_eq(gpu->ops->download(gpu->ctx, gb, e.pg.base, bytes), 0);
    float *cv = kvq_values(&e.cfg, e.pc.base), *gv = kvq_values(&e.cfg, gb);
    double num = 0, den = 0;
    for (size_t i = 0; i < 2 * (size_t)e.cfg.n_layers * kern_kv_layer_bytes(&e.cfg); i++) {
      num += ((double)gv[i] - cv[i]) * ((double)gv[i] - cv[i]);
      den += (double)cv[i] * cv[i];
    }
    fprintf(stderr, "  %s kv pool after append, rope_kv_append, copy_blocks  err %.2e\n", kern_kv_dtype_name(dt),
            sqrt(num / den));
    ck_assert_double_gt(den, 0);
    /* the GPU's inputs are bf16 (and its rope runs on them): a value whose rounding crosses a quantization
     * step lands one step away (H100: 2.6e-3 in all for int8, 5.7e-3 for fp8); a wrong scale or layout is O(1) */
    ck_assert_double_lt(sqrt(num / den), 2e-2);
    free(gb), free(cv), free(gv);
    kv_teardown(&e);
  }
}
END_TEST

START_TEST(test_kv_copy_blocks) {
  kvenv_t e;
  kv_setup(&e, 2, 2, 64, 16, 2, 64);
  int z[2] = {0, 0}, n[2] = {64, 40};
  kern_step_t s;
  int32_t *bufs[4];
  int nt = step_append(&e, z, n, 0, &s, bufs);
  append_random(&e, nt, 1);
  free_step(bufs);
  const int32_t *spare = e.bt + 2 * e.max_blocks;
  int32_t pairs[4] = {e.bt[0], spare[0], e.bt[e.max_blocks + 2], spare[1]};
  ck_assert_int_eq(cpu->ops->kv_copy_blocks(cpu->ctx, &e.pc, pairs, 2), 0);
  ck_assert_int_eq(gpu->ops->kv_copy_blocks(gpu->ctx, &e.pg, pairs, 2), 0);
  size_t n_el = kern_kv_pool_bytes(&e.cfg) / 4;
  uint16_t *g = fr_malloc(n_el * 2);
  ck_assert_int_eq(gpu->ops->download(gpu->ctx, g, e.pg.base, n_el * 2), 0);
  const float *c = e.pc.base;
  double num = 0, den = 0;
  for (size_t i = 0; i < n_el; i++) {
    float gv = gpu->act_type == KERN_BF16 ? fr_bf16_to_fp32(g[i]) : fr_fp16_to_fp32(g[i]);
    num += (gv - c[i]) * (gv - c[i]);
    den += c[i] * c[i];
  }
  fprintf(stderr, "  kv pool after append + copy_blocks      err %.2e\n", sqrt(num / den));
  ck_assert_double_lt(sqrt(num / den), 1e-6);
  free(g);
  kv_teardown(&e);
}
END_TEST

/* The fused rope + kv_append (GPU) against rope, rope, kv_append (CPU), on
 * the fused q/k/v layout; one token's slot is -1 (padding: no K/V write). */
START_TEST(test_rope_kv_append) {
  kvenv_t e;
  const int n_kv = 2, hd = 64, nh = 6, stride = (nh + 2 * n_kv) * hd;
  kv_setup(&e, 2, n_kv, hd, 16, 3, 64);
  int cached[3] = {0, 5, 30}, n_new[3] = {9, 1, 4};
  kern_step_t s;
  int32_t *bufs[4];
  int nt = build_step(&e, cached, n_new, &s, bufs);
  bufs[1][9] = -1;
  step_both(&s);
  for (int mode = 0; mode < 2; mode++) {
    int n_rot = mode ? hd : 48;
    float *inv = fr_malloc(n_rot / 2 * 4);
    for (int i = 0; i < n_rot / 2; i++) inv[i] = powf(10000.f, -2.f * i / n_rot);
    wpair_t f;
    wpair_load(&f, KERN_F32, 1, n_rot / 2, inv);
    kern_rope_t cr = {.mode = (kern_rope_mode_t)mode, .n_rot = n_rot, .inv_freq = &f.c, .attn_factor = 0.9f};
    kern_rope_t gr = cr;
    gr.inv_freq = &f.g;
    pair_t x = pair_rand((size_t)nt * stride, 1.f);
    size_t ko = (size_t)nh * hd, vo = ko + (size_t)n_kv * hd;
    ck_assert_int_eq(cpu->ops->rope(cpu->ctx, x.c, nh, hd, stride, &cr), 0);
    ck_assert_int_eq(cpu->ops->rope(cpu->ctx, (float *)x.c + ko, n_kv, hd, stride, &cr), 0);
    ck_assert_int_eq(cpu->ops->kv_append(cpu->ctx, &e.pc, mode, (float *)x.c + ko, stride, (float *)x.c + vo, stride),
                     0);
    uint16_t *g = x.g;
    int rc = gpu->ops->rope_kv_append(gpu->ctx, &e.pg, mode, g, stride, g + ko, g + vo, stride, nh, &gr);
    ck_assert_msg(rc == 0, "rope_kv_append: %s", fr_last_error());
    ck_assert_double_lt(cmp_pair(&x, (size_t)nt * stride, mode ? "rope_kv_append: q, k (neox)" : "rope_kv_append: q, k"),
                        TOL_ACT);
    pair_free(&x);
    wpair_free(&f);
  }
  /* both layers' K/V planes, the untouched padding slot included */
  size_t n_el = kern_kv_pool_bytes(&e.cfg) / 4;
  uint16_t *g = fr_malloc(n_el * 2);
  ck_assert_int_eq(gpu->ops->download(gpu->ctx, g, e.pg.base, n_el * 2), 0);
  const float *c = e.pc.base;
  double num = 0, den = 0;
  for (size_t i = 0; i < n_el; i++) {
    float gv = gpu->act_type == KERN_BF16 ? fr_bf16_to_fp32(g[i]) : fr_fp16_to_fp32(g[i]);
    num += (gv - c[i]) * (gv - c[i]);
    den += c[i] * c[i];
  }
  fprintf(stderr, "  rope_kv_append: kv pool                 err %.2e\n", sqrt(num / den));
  ck_assert_double_lt(sqrt(num / den), TOL_ACT);
  free(g);
  free_step(bufs);
  kv_teardown(&e);
}
END_TEST

/* ---- the fused matmul ops ---------------------------------------------------------------------- */

static void *pool_copy(const kern_kv_pool_t *p) {
  size_t bytes = kern_kv_pool_bytes(&p->cfg);
  void *d = NULL;
  ck_assert_int_eq(gpu->ops->alloc(gpu->ctx, bytes, &d), 0);
  ck_assert_int_eq(gpu->ops->copy(gpu->ctx, d, p->base, bytes), 0);
  return d;
}

static void pool_zero(const kern_kv_pool_t *p) {
  size_t bytes = kern_kv_pool_bytes(&p->cfg);
  void *z = calloc(1, bytes);
  ck_assert_int_eq(gpu->ops->upload(gpu->ctx, p->base, z, bytes), 0);
  free(z);
}

/* matmul_rope_kv_append against matmul then rope_kv_append, and
 * matmul_silu_mul against matmul then silu_mul: the same bits in the
 * outputs and in the whole KV pool, for steps of 1 to 6 tokens (the last
 * one padding, slot -1, but in the second step of one token) under the
 * backend's current GEMV settings. */
/* A weight of w's (dense) type loaded again on the GPU as FP8: quantized
 * at load (KERN_F8R), or (form KERN_F8B) as a checkpoint's 128 x 128
 * blocks made from it. */
static void gpu_reload_fp8(wpair_t *w, kern_type_t form) {
  gpu->ops->weight_release(gpu->ctx, &w->g);
  const int64_t rows = w->c.rows, cols = w->c.cols;
  w->g = (kern_weight_t){.type = w->c.type, .rows = rows, .cols = cols, .row_bytes = w->c.row_bytes, .fp8 = true};
  void *host = w->host;
  if (form == KERN_F8B) {
    float *f = fr_malloc((size_t)(rows * cols) * sizeof(float));
    kern_dequantize_row(w->c.type, w->host, f, rows * cols);
    double *deq = fr_malloc((size_t)(rows * cols) * sizeof(double));
    host = f8b_pack(f, rows, cols, deq);
    free(f), free(deq);
    w->g.type = KERN_F8B, w->g.row_bytes = (size_t)cols;
  }
  int rc = gpu->ops->weight_load(gpu->ctx, &w->g, host);
  if (host != w->host) free(host);
  ck_assert_msg(rc == 0 && w->g.type == (form == KERN_F8B ? KERN_F8B : KERN_F8R), "cuda weight_load (fp8): %s",
                fr_last_error());
}

/* fp8: KERN_BF16 (none: the act type), KERN_F8R or KERN_F8B weights. */
static void check_fused_matmuls(kern_type_t fp8) {
  const int dim = 256, nh = 6, n_kv = 2, hd = 64, rows = (nh + 2 * n_kv) * hd, ffn = 384;
  const int news[][4] = {{1, 0, 0, 0}, {1, 1, 0, 0}, {1, 1, 1, 0}, {1, 1, 1, 1},
                         {2, 1, 1, 1}, {3, 1, 1, 1}, {1, 0, 0, 0}};
  kvenv_t e;
  kv_setup(&e, 2, n_kv, hd, 16, 4, 64);
  wpair_t w, wb, gu, f;
  wpair_load(&w, gpu->act_type, rows, dim, rand_weight(gpu->act_type, rows, dim));
  wpair_load(&wb, KERN_F32, 1, rows, rand_weight(KERN_F32, 1, rows));
  wpair_load(&gu, gpu->act_type, 2 * ffn, dim, rand_weight(gpu->act_type, 2 * ffn, dim));
  if (fp8 != KERN_BF16) gpu_reload_fp8(&w, fp8), gpu_reload_fp8(&gu, fp8);
  float inv[32];
  for (int i = 0; i < hd / 2; i++) inv[i] = powf(10000.f, -2.f * i / hd);
  float *inv_h = fr_malloc(sizeof inv);
  memcpy(inv_h, inv, sizeof inv);
  wpair_load(&f, KERN_F32, 1, hd / 2, inv_h);
  void *a = NULL, *b = NULL; /* 6 tokens, rounded up to 8 (kern_ops_t.matmul's room) */
  ck_assert_int_eq(gpu->ops->alloc(gpu->ctx, (size_t)8 * 2 * ffn * 2, &a), 0);
  ck_assert_int_eq(gpu->ops->alloc(gpu->ctx, (size_t)8 * 2 * ffn * 2, &b), 0);
  for (size_t c = 0; c < FR_ARRAY_SIZE(news); c++) {
    int cached[4] = {0, 5, 30, 17};
    kern_step_t s;
    int32_t *bufs[4];
    int nt = build_step(&e, cached, news[c], &s, bufs);
    if (c + 1 < FR_ARRAY_SIZE(news)) bufs[1][nt - 1] = -1; /* padding: no K/V write */
    step_both(&s);
    pair_t x = pair_rand((size_t)nt * dim, 1.f);
    for (int mode = 0; mode < 2; mode++) {
      const kern_weight_t *bias = mode ? &wb.g : NULL;
      kern_rope_t r = {.mode = (kern_rope_mode_t)mode, .n_rot = hd, .inv_freq = &f.g, .attn_factor = 0.9f};
      char what[96];
      pool_zero(&e.pg);
      poison(a, (size_t)nt * rows);
      ck_assert_int_eq(gpu->ops->matmul(gpu->ctx, a, &w.g, bias, x.g, nt), 0);
      uint16_t *ag = a;
      int rc = gpu->ops->rope_kv_append(gpu->ctx, &e.pg, 1, ag, rows, ag + nh * hd, ag + (nh + n_kv) * hd, rows, nh, &r);
      ck_assert_msg(rc == 0, "rope_kv_append: %s", fr_last_error());
      void *pool_a = pool_copy(&e.pg);
      pool_zero(&e.pg);
      poison(b, (size_t)nt * rows);
      rc = gpu->ops->matmul_rope_kv_append(gpu->ctx, b, &w.g, bias, x.g, nt, &e.pg, 1, nh, &r);
      ck_assert_msg(rc == 0, "matmul_rope_kv_append: %s", fr_last_error());
      snprintf(what, sizeof what, "matmul_rope_kv_append n=%d mode %d: q, k, v", nt, mode);
      expect_same_bits(a, b, (size_t)nt * rows * 2, what);
      snprintf(what, sizeof what, "matmul_rope_kv_append n=%d mode %d: kv pool", nt, mode);
      expect_same_bits(pool_a, e.pg.base, kern_kv_pool_bytes(&e.pg.cfg), what);
      gpu->ops->free(gpu->ctx, pool_a);
    }
    /* gate/up: b is the two-op path's scratch, a its output; then the fused op's */
    ck_assert_int_eq(gpu->ops->matmul(gpu->ctx, b, &gu.g, NULL, x.g, nt), 0);
    poison(a, (size_t)nt * ffn);
    ck_assert_int_eq(gpu->ops->silu_mul(gpu->ctx, a, b, (uint16_t *)b + ffn, nt, ffn, 2 * ffn), 0);
    void *out = NULL;
    ck_assert_int_eq(gpu->ops->alloc(gpu->ctx, (size_t)nt * ffn * 2, &out), 0);
    poison(out, (size_t)nt * ffn);
    int rc = gpu->ops->matmul_silu_mul(gpu->ctx, out, &gu.g, x.g, nt, b);
    ck_assert_msg(rc == 0, "matmul_silu_mul: %s", fr_last_error());
    char what[64];
    snprintf(what, sizeof what, "matmul_silu_mul n=%d", nt);
    expect_same_bits(a, out, (size_t)nt * ffn * 2, what);
    gpu->ops->free(gpu->ctx, out);
    pair_free(&x);
    free_step(bufs);
  }
  fprintf(stderr, "  fused matmul ops%s, n = 1..6          same bits as the two ops\n",
          fp8 == KERN_F8R ? " (F8R)" : fp8 == KERN_F8B ? " (F8B)" : "");
  gpu->ops->free(gpu->ctx, a);
  gpu->ops->free(gpu->ctx, b);
  wpair_free(&w);
  wpair_free(&wb);
  wpair_free(&gu);
  wpair_free(&f);
  kv_teardown(&e);
}

/* _i bit 0: the GEMV for every n <= 8 (else the default); _i / 2: the act
 * type, FP8 weights quantized at load (--quantization fp8), or an FP8
 * checkpoint's 128 x 128 blocks, where the device keeps FP8. */
START_TEST(test_fused_matmuls) {
  static const kern_type_t forms[] = {KERN_BF16, KERN_F8R, KERN_F8B};
  if (_i & 1) gpu_all_gemv();
  if (_i / 2 && !gpu->fp8_weights) return;
  check_fused_matmuls(forms[_i / 2]);
}
END_TEST

/* ---- graph capture ---------------------------------------------------------------------------- */

/* A small decode layer: embed, norm, qkv matmul, rope, kv_append, attention,
 * o matmul, residual add. Returns the output (n_seqs, dim) on the host. */
typedef struct {
  int dim, n_heads, n_kv, hd;
  wpair_t emb, norm, wqkv, wo, freq;
  void *x, *h, *qkv, *att, *o; /* gpu buffers */
} mini_t;

static void mini_forward(mini_t *m, kvenv_t *e, int n) {
  void *c = gpu->ctx;
  const kern_ops_t *op = gpu->ops;
  int qkv_rows = (m->n_heads + 2 * m->n_kv) * m->hd;
  kern_rope_t r = {.mode = KERN_ROPE_NORM, .n_rot = m->hd, .inv_freq = &m->freq.g, .attn_factor = 1.f};
  ck_assert_int_eq(op->embed(c, m->x, &m->emb.g), 0);
  ck_assert_int_eq(op->rms_norm(c, m->h, m->x, &m->norm.g, n, m->dim, 1e-5f), 0);
  ck_assert_int_eq(op->matmul(c, m->qkv, &m->wqkv.g, NULL, m->h, n), 0);
  ck_assert_int_eq(op->rope(c, m->qkv, m->n_heads + m->n_kv, m->hd, qkv_rows, &r), 0);
  uint16_t *k = (uint16_t *)m->qkv + m->n_heads * m->hd, *v = k + m->n_kv * m->hd;
  ck_assert_int_eq(op->kv_append(c, &e->pg, 0, k, qkv_rows, v, qkv_rows), 0);
  ck_assert_int_eq(op->attention(c, m->att, m->qkv, qkv_rows, &e->pg, 0, m->n_heads, m->hd, 0.125f, 0), 0);
  ck_assert_int_eq(op->matmul(c, m->o, &m->wo.g, NULL, m->att, n), 0);
  ck_assert_int_eq(op->add_rms_norm(c, m->h, m->x, m->o, &m->norm.g, n, m->dim, 1e-5f), 0);
  ck_assert_int_eq(op->silu_mul(c, m->o, m->h, m->x, n, m->dim, m->dim), 0);
}

/* Weights and buffers of the mini layer, for up to n sequences. */
static void mini_setup(mini_t *m, int vocab, int n) {
  *m = (mini_t){.dim = 256, .n_heads = 8, .n_kv = 2, .hd = 64};
  int qkv_rows = (m->n_heads + 2 * m->n_kv) * m->hd;
  wpair_load_kept(&m->emb, KERN_Q8_0, vocab, m->dim, rand_weight(KERN_Q8_0, vocab, m->dim));
  wpair_load(&m->norm, KERN_F32, 1, m->dim, rand_weight(KERN_F32, 1, m->dim));
  wpair_load(&m->wqkv, KERN_BF16, qkv_rows, m->dim, rand_weight(KERN_BF16, qkv_rows, m->dim));
  wpair_load(&m->wo, KERN_Q4_K, m->dim, m->n_heads * m->hd, rand_weight(KERN_Q4_K, m->dim, m->n_heads * m->hd));
  float *inv = fr_malloc(m->hd / 2 * 4);
  for (int i = 0; i < m->hd / 2; i++) inv[i] = powf(10000.f, -2.f * i / m->hd);
  wpair_load(&m->freq, KERN_F32, 1, m->hd / 2, inv);
  void **bufs[5] = {&m->x, &m->h, &m->qkv, &m->att, &m->o};
  for (int i = 0; i < 5; i++) ck_assert_int_eq(gpu->ops->alloc(gpu->ctx, (size_t)n * 2048 * 2, bufs[i]), 0);
}

static void mini_free(mini_t *m) {
  void *bufs[5] = {m->x, m->h, m->qkv, m->att, m->o};
  for (int i = 0; i < 5; i++) gpu->ops->free(gpu->ctx, bufs[i]);
  wpair_free(&m->emb);
  wpair_free(&m->norm);
  wpair_free(&m->wqkv);
  wpair_free(&m->wo);
  wpair_free(&m->freq);
}

/* The mini layer's output over step s (n sequences), run eagerly (host). */
static float *eager_run(mini_t *m, kvenv_t *e, const kern_step_t *s, int n) {
  size_t out = (size_t)n * m->dim;
  ck_assert_int_eq(gpu->ops->step_begin(gpu->ctx, s), 0);
  poison(m->o, out);
  mini_forward(m, e, n);
  return gpu_get(m->o, out);
}

/* Runs the mini layer over step s (n sequences) eagerly, then through graph
 * `key` (replayed if captured before, else captured now), or the graph
 * first (graph_first: a capture then sees only what step_begin reserved);
 * returns the normalized difference of the outputs and says whether it
 * replayed. */
static double graph_vs_eager(mini_t *m, kvenv_t *e, const kern_step_t *s, int n, uint64_t key, bool *replayed,
                             bool graph_first) {
  size_t out = (size_t)n * m->dim;
  float *eager = graph_first ? NULL : eager_run(m, e, s, n);
  ck_assert_int_eq(gpu->ops->step_begin(gpu->ctx, s), 0);
  poison(m->o, out);
  int rc = gpu->ops->graph_begin(gpu->ctx, key, replayed);
  ck_assert_msg(rc == 0, "graph_begin: %s", fr_last_error());
  if (!*replayed) mini_forward(m, e, n);
  rc = gpu->ops->graph_end(gpu->ctx, key);
  ck_assert_msg(rc == 0, "graph_end: %s", fr_last_error());
  float *graph = gpu_get(m->o, out);
  if (graph_first) eager = eager_run(m, e, s, n);
  double err = nerr(graph, eager, out);
  free(eager);
  free(graph);
  return err;
}

START_TEST(test_graph_replay) {
  /* 6 sequences: the bf16 qkv matmul takes the cuBLAS path inside the
   * capture, the Q4_K one the int8 GEMV */
  mini_t m;
  int vocab = 500, n = 6;
  mini_setup(&m, vocab, n);
  kvenv_t e;
  kv_setup(&e, 1, m.n_kv, m.hd, 16, n, 3000);
  int lens[6] = {2700, 100, 7, 1500, 1, 33}, one[6] = {1, 1, 1, 1, 1, 1};
  kern_step_t s;
  int32_t *sb[4];
  int32_t tok[6];
  for (int step = 0; step < 4; step++) {
    for (int i = 0; i < n; i++) tok[i] = rndi(vocab);
    build_step(&e, lens, one, &s, sb);
    s.tokens = tok;
    bool replayed = true; /* graph 42: captured at step 0, replayed after */
    double err = graph_vs_eager(&m, &e, &s, n, 42, &replayed, false);
    ck_assert_int_eq(replayed, step > 0);
    fprintf(stderr, "  graph %s step %d vs eager               err %.2e\n", step ? "replay" : "capture", step, err);
    ck_assert_double_lt(err, 1e-6);
    free_step(sb);
    for (int i = 0; i < n; i++) lens[i] += 1 + 37 * step;
  }
  kv_teardown(&e);
  mini_free(&m);
}
END_TEST

/* A step with more sequences grows the decode split buffers that a graph
 * captured earlier uses: the graph must not read the freed ones (run under
 * compute-sanitizer to see a use after free); its next run equals eager.
 * _i = 1: the tensor-core decode kernel in splits of 16 tokens
 * (FERRUM_CUDA_DEC_MCHUNK), more splits than the SIMT kernel's, which the
 * step's reservation must cover: the first graph is captured before any
 * eager pass. */
START_TEST(test_graph_after_growth) {
  if (_i) {
    kern_backend_destroy(gpu);
    setenv("FERRUM_CUDA_DEC_MCHUNK", "16", 1);
    ck_assert_int_eq(kern_cuda_create(&gpu, 0), 0);
    unsetenv("FERRUM_CUDA_DEC_MCHUNK");
  }
  mini_t m;
  int vocab = 500, n = 6;
  mini_setup(&m, vocab, n);
  kvenv_t e;
  /* _i = 1: block tables of 512 tokens, where the tensor-core kernel takes
   * 32 splits and the SIMT kernel's count (8) reserved too little for them */
  kv_setup(&e, 1, m.n_kv, m.hd, 16, n, _i ? 500 : 3000);
  int lens[6] = {2000, 900, 7, 1500, 1, 33}, short_lens[6] = {400, 300, 7, 200, 1, 33}, one[6] = {1, 1, 1, 1, 1, 1};
  if (_i) memcpy(lens, short_lens, sizeof lens);
  kern_step_t s;
  int32_t *sb[4];
  int32_t tok[6];
  for (int round = 0; round < 3; round++) {
    /* round 1 runs all 6 sequences (eagerly) between the 1-sequence graph's runs */
    e.n_seqs = round == 1 ? n : 1;
    for (int i = 0; i < n; i++) tok[i] = rndi(vocab);
    build_step(&e, lens, one, &s, sb);
    s.tokens = tok;
    if (round == 1) {
      ck_assert_int_eq(gpu->ops->step_begin(gpu->ctx, &s), 0);
      mini_forward(&m, &e, n);
    } else {
      bool replayed = false;
      double err = graph_vs_eager(&m, &e, &s, 1, 43, &replayed, _i == 1 && round == 0);
      fprintf(stderr, "  1-seq graph, round %d (%s) vs eager      err %.2e\n", round, replayed ? "replay" : "capture",
              err);
      ck_assert_double_lt(err, 1e-6);
    }
    free_step(sb);
    for (int i = 0; i < n; i++) lens[i] += 1;
  }
  e.n_seqs = n;
  kv_teardown(&e);
  mini_free(&m);
}
END_TEST

/* A pool made after the one a graph runs on, narrower (a draft model's
 * follows the target's: 1 KV head of 32 beside 2 of 64), must not shrink
 * the decode partials that step_begin reserves, which are all that a
 * capture before any eager pass sees (sized by the last pool made, they
 * held half the target's splits and the capture failed growing them). */
START_TEST(test_graph_beside_narrow_pool) {
  kern_backend_destroy(gpu); /* no pool made before these */
  ck_assert_int_eq(kern_cuda_create(&gpu, 0), 0);
  mini_t m;
  const int vocab = 500;
  mini_setup(&m, vocab, 1);
  kvenv_t e;
  kv_setup(&e, 1, m.n_kv, m.hd, 16, 1, 1000);
  kern_kv_config_t dc = {.n_layers = 1, .n_kv_heads = 1, .head_dim = 32, .block_size = 16, .n_blocks = 64,
                         .type = gpu->act_type};
  kern_kv_pool_t draft;
  int rc = gpu->ops->kv_pool_init(gpu->ctx, &draft, &dc, NULL);
  ck_assert_msg(rc == 0, "kv_pool_init (draft): %s", fr_last_error());
  int lens[1] = {900}, one[1] = {1};
  int32_t tok[1] = {rndi(vocab)}, *sb[4];
  kern_step_t s;
  build_step(&e, lens, one, &s, sb);
  s.tokens = tok;
  bool replayed = true;
  double err = graph_vs_eager(&m, &e, &s, 1, 44, &replayed, true);
  fprintf(stderr, "  graph beside a narrower pool vs eager      err %.2e\n", err);
  ck_assert(!replayed);
  ck_assert_double_lt(err, 1e-6);
  free_step(sb);
  gpu->ops->kv_pool_deinit(gpu->ctx, &draft);
  kv_teardown(&e);
  mini_free(&m);
}
END_TEST

/* ---- sampling ----------------------------------------------------------------------------------- */

static void *upload_logits(const float *l, int rows, int vocab) { return gpu_put(l, (size_t)rows * vocab); }

/* Greedy rows against the host: argmax (the first on ties) and its
 * logprob. Few rows split a row's first pass over CTAs (kcu_sample.cu),
 * 300 rows do not; odd vocabularies take the scalar loads; a row that is
 * -inf but for a few logits late in the row, and a row of equal logits. */
START_TEST(test_sample_greedy) {
  static const struct {
    int rows, vocab;
  } shapes[] = {{5, 50000}, {1, 128256}, {3, 50001}, {40, 32000}, {300, 4096}, {2, 20000}};
  for (size_t si = 0; si < FR_ARRAY_SIZE(shapes); si++) {
    const int rows = shapes[si].rows, vocab = shapes[si].vocab;
    float *l = rand_vec((size_t)rows * vocab, 3.f);
    if (si == FR_ARRAY_SIZE(shapes) - 1) {
      for (int i = 0; i < vocab; i++) l[i] = i == vocab - 3 || i == vocab - 700 ? 1.f - (i == vocab - 3) : -INFINITY;
      for (int i = 0; i < vocab; i++) l[vocab + i] = 0.5f;
    }
    void *d = upload_logits(l, rows, vocab);
    kern_sample_params_t *p = fr_calloc((size_t)rows, sizeof *p);
    int32_t *tok = fr_malloc((size_t)rows * sizeof *tok);
    float *lp = fr_malloc((size_t)rows * sizeof *lp);
    int rc = gpu->ops->sample(gpu->ctx, d, rows, vocab, p, tok, lp);
    ck_assert_msg(rc == 0, "sample: %s", fr_last_error());
    for (int r = 0; r < rows; r++) {
      const float *x = l + (size_t)r * vocab;
      int best = 0;
      for (int i = 0; i < vocab; i++)
        if (x[i] > x[best]) best = i;
      double mx = x[best], se = 0;
      for (int i = 0; i < vocab; i++) se += exp((double)x[i] - mx);
      double ref_lp = x[best] - mx - log(se);
      ck_assert_msg(tok[r] == best, "%d x %d, row %d: token %d vs %d", rows, vocab, r, tok[r], best);
      ck_assert_msg(fabs(lp[r] - ref_lp) < 2e-3, "%d x %d, row %d: logprob %f vs %f", rows, vocab, r, lp[r], ref_lp);
    }
    gpu->ops->free(gpu->ctx, d);
    free(l), free(p), free(tok), free(lp);
  }
}
END_TEST

static int cmp_desc(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return x < y ? 1 : x > y ? -1 : 0;
}

/* Draws many rows of the same logits with distinct counters: every token
 * must lie in the set the filters allow, frequencies must follow the
 * renormalized probabilities, and equal (seed, counter) give equal draws. */
/* Top logprobs on the device against the host's (model_logprobs): 1, 5 and
 * 20 of them, and none. Equal logits may come in either order. */
START_TEST(test_sample_top_logprobs) {
  enum { ROWS = 4, VOCAB = 50000 };
  const int want_n[ROWS] = {1, 5, 20, 0};
  float *l = rand_vec((size_t)ROWS * VOCAB, 3.f);
  void *d = upload_logits(l, ROWS, VOCAB);
  kern_sample_params_t p[ROWS];
  int32_t ids[ROWS][KERN_SAMPLE_MAX_TOP], tok[ROWS];
  float lps[ROWS][KERN_SAMPLE_MAX_TOP], lp[ROWS];
  for (int r = 0; r < ROWS; r++)
    p[r] = (kern_sample_params_t){.temperature = 0.8f, .top_p = 1.f, .seed = 3, .counter = (uint64_t)r,
                                  .repetition_penalty = 1.f, .top_n = want_n[r], .top_ids = ids[r], .top_lp = lps[r]};
  int rc = gpu->ops->sample(gpu->ctx, d, ROWS, VOCAB, p, tok, lp);
  ck_assert_msg(rc == 0, "sample: %s", fr_last_error());
  int32_t hid[KERN_SAMPLE_MAX_TOP];
  float hlp[KERN_SAMPLE_MAX_TOP];
  for (int r = 0; r < ROWS; r++) {
    const float *x = l + (size_t)r * VOCAB;
    if (!want_n[r]) continue;
    model_logprobs(x, VOCAB, want_n[r], hid, hlp, NULL);
    for (int j = 0; j < want_n[r]; j++) {
      ck_assert_msg(x[ids[r][j]] == x[hid[j]], "row %d top %d: id %d (%f) vs host %d (%f)", r, j, ids[r][j],
                    x[ids[r][j]], hid[j], x[hid[j]]);
      ck_assert_msg(fabsf(lps[r][j] - hlp[j]) < 2e-3f, "row %d top %d: logprob %f vs %f", r, j, lps[r][j], hlp[j]);
    }
    fprintf(stderr, "  top %2d logprobs: ids and logprobs as the host's (first %d, %.4f)\n", want_n[r], ids[r][0],
            lps[r][0]);
  }
  gpu->ops->free(gpu->ctx, d);
  free(l);
}
END_TEST

/* Logit bias and min_tokens bans on the device against the host sampler:
 * rows mix a bias list, bans (a token both biased and banned, duplicates,
 * ids out of the vocabulary) and penalties on overlapping tokens; greedy
 * rows must pick the host's token with the host's (raw) logprob, sampled
 * rows never a banned token. */
START_TEST(test_sample_bias) {
  enum { ROWS = 32, VOCAB = 5000, A = 17, B = 4321, C = 999 };
  float *l = fr_malloc((size_t)ROWS * VOCAB * sizeof(float));
  for (size_t i = 0; i < (size_t)ROWS * VOCAB; i++) l[i] = round_act((rndu() - 0.5f) * 4.f);
  for (int r = 0; r < ROWS; r++) {
    float *x = l + (size_t)r * VOCAB;
    x[A] = 6.0f, x[C] = 5.5f, x[B] = 5.0f;
  }
  int32_t hist[30];
  for (int i = 0; i < 30; i++) hist[i] = 100 + rndi(20);
  hist[25] = C; /* output: C once */
  const kern_bias_t bias[] = {{A, -3.f}, {B, 2.f}, {C, 0.25f}, {VOCAB + 3, 100.f}};
  const int32_t ban[] = {B, A, B, -1, VOCAB};
  model_sampler_t smp;
  model_sampler_init(&smp, VOCAB);
  float *row = fr_malloc(VOCAB * sizeof(float));
  kern_sample_params_t p[ROWS];
  for (int r = 0; r < ROWS; r++) {
    bool g = r < ROWS / 2;
    p[r] = (kern_sample_params_t){.temperature = g ? 0.f : 0.9f, .top_p = 1.f, .seed = 11, .counter = (uint64_t)r,
                                  .repetition_penalty = r % 3 == 1 ? 1.3f : 1.f,
                                  .presence_penalty = r % 3 == 2 ? 0.5f : 0.f,
                                  .prompt = hist, .output = hist + 20, .n_prompt = 20, .n_output = 10,
                                  .bias = bias, .n_bias = r % 4 ? 4 : 0, .ban = ban, .n_ban = 5,
                                  .min_tokens = r % 2 ? 11 : 10}; /* odd rows: 10 outputs < 11, banned */
  }
  void *d = upload_logits(l, ROWS, VOCAB);
  int32_t tok[ROWS];
  float lp[ROWS];
  int rc = gpu->ops->sample(gpu->ctx, d, ROWS, VOCAB, p, tok, lp);
  ck_assert_msg(rc == 0, "sample: %s", fr_last_error());
  for (int r = 0; r < ROWS; r++) {
    if (r % 2) ck_assert_msg(tok[r] != A && tok[r] != B, "row %d drew banned %d", r, tok[r]);
    if (p[r].temperature > 0) continue;
    memcpy(row, l + (size_t)r * VOCAB, VOCAB * sizeof(float));
    model_sampling_t hp = model_sampling_default();
    hp.repetition_penalty = p[r].repetition_penalty;
    hp.presence_penalty = p[r].presence_penalty;
    hp.bias = (const model_bias_t *)bias, hp.n_bias = p[r].n_bias;
    hp.ban = ban, hp.n_ban = 5, hp.min_tokens = p[r].min_tokens;
    float host_lp = 0;
    int32_t host = model_sample(&smp, &hp, row, hist, 20, hist + 20, 10, 0, &host_lp);
    fprintf(stderr, "  bias row %d: device %d host %d, logprob %.4f vs %.4f\n", r, tok[r], host, lp[r], host_lp);
    ck_assert_int_eq(tok[r], host);
    ck_assert_msg(fabsf(lp[r] - host_lp) < 2e-3f, "logprob %f vs %f", lp[r], host_lp);
  }
  model_sampler_deinit(&smp);
  free(row);
  gpu->ops->free(gpu->ctx, d);
  free(l);
}
END_TEST

/* Penalties on the device against the host sampler (model/sampler.c): the
 * same rule, on logits where three planted tokens decide the winner: A (6.0,
 * three times in the output), C (5.5, in the prompt only) and B (5.0, in
 * neither), so that each penalty picks a different one. */
START_TEST(test_sample_penalties) {
  enum { ROWS = 64, VOCAB = 5000, A = 17, B = 4321, C = 999 };
  float *l = fr_malloc((size_t)ROWS * VOCAB * sizeof(float));
  for (size_t i = 0; i < (size_t)ROWS * VOCAB; i++) l[i] = round_act((rndu() - 0.5f) * 4.f);
  int32_t hist[60];
  for (int i = 0; i < 60; i++) hist[i] = 100 + rndi(40); /* repeats */
  hist[3] = C, hist[7] = -1, hist[9] = VOCAB + 5;      /* prompt: C, an unseen slot, a bad id */
  hist[41] = A, hist[50] = A, hist[58] = A;            /* output: A three times */
  for (int r = 0; r < ROWS; r++) {
    float *x = l + (size_t)r * VOCAB;
    x[A] = 6.0f, x[C] = 5.5f, x[B] = 5.0f;
    for (int i = 0; i < 60; i++) /* some history tokens negative, for the repetition rule's other branch */
      if (hist[i] >= 0 && hist[i] < VOCAB && hist[i] != A && hist[i] != C) x[hist[i]] = round_act(-1.f - 0.01f * i);
  }
  const struct {
    float rep, pres, freq, temp;
    int top_k;
    int want; /* greedy rows: the planted winner */
  } k_rows[] = {{1.3f, 0, 0, 0, 0, B}, {1, 1.5f, 0, 0, 0, C}, {1, 0, 0.8f, 0, 0, C},
                {1.2f, 0.5f, 0.3f, 0, 0, B}, {1, 0, 0, 0, 0, A}, {0.7f, 0, 0, 0, 0, A}};
  const int n_greedy = (int)FR_ARRAY_SIZE(k_rows);
  kern_sample_params_t p[ROWS];
  int32_t top_ids[ROWS][3];
  float top_lp[ROWS][3];
  for (int r = 0; r < ROWS; r++) {
    bool g = r < n_greedy; /* the rest: temperature 0.7, top-k 2 and a presence penalty: only C or B may come */
    p[r] = (kern_sample_params_t){.temperature = g ? k_rows[r].temp : 0.7f, .top_k = g ? k_rows[r].top_k : 2,
                                  .top_p = 1.f, .seed = 7, .counter = (uint64_t)r,
                                  .repetition_penalty = g ? k_rows[r].rep : 1.f,
                                  .presence_penalty = g ? k_rows[r].pres : 1.5f,
                                  .frequency_penalty = g ? k_rows[r].freq : 0.f,
                                  .prompt = hist, .output = hist + 40, .n_prompt = 40, .n_output = 20,
                                  .top_n = g ? 3 : 0, .top_ids = top_ids[r], .top_lp = top_lp[r]};
  }
  void *d = upload_logits(l, ROWS, VOCAB);
  int32_t tok[ROWS];
  float lp[ROWS];
  int rc = gpu->ops->sample(gpu->ctx, d, ROWS, VOCAB, p, tok, lp);
  ck_assert_msg(rc == 0, "sample: %s", fr_last_error());
  model_sampler_t smp;
  model_sampler_init(&smp, VOCAB);
  float *row = fr_malloc(VOCAB * sizeof(float));
  int seen_b = 0, seen_c = 0;
  for (int r = 0; r < ROWS; r++) {
    memcpy(row, l + (size_t)r * VOCAB, VOCAB * sizeof(float));
    if (r < n_greedy) {
      model_sampling_t hp = model_sampling_default();
      hp.repetition_penalty = p[r].repetition_penalty;
      hp.presence_penalty = p[r].presence_penalty;
      hp.frequency_penalty = p[r].frequency_penalty;
      float host_lp = 0;
      int32_t host = model_sample(&smp, &hp, row, hist, 40, hist + 40, 20, 0, &host_lp);
      fprintf(stderr, "  penalties rep %.1f pres %.1f freq %.1f: device %d host %d, logprob %.4f vs %.4f\n",
              p[r].repetition_penalty, p[r].presence_penalty, p[r].frequency_penalty, tok[r], host, lp[r], host_lp);
      ck_assert_int_eq(host, k_rows[r].want);
      ck_assert_int_eq(tok[r], host);
      ck_assert_msg(fabsf(lp[r] - host_lp) < 2e-3f, "logprob %f vs %f", lp[r], host_lp);
      /* top logprobs are of the raw logits, whatever the penalties: A, C, B */
      int32_t want[3] = {A, C, B}, hid[3];
      float hlp[3];
      model_logprobs(l + (size_t)r * VOCAB, VOCAB, 3, hid, hlp, NULL);
      for (int j = 0; j < 3; j++) {
        ck_assert_int_eq(hid[j], want[j]);
        ck_assert_int_eq(top_ids[r][j], want[j]);
        ck_assert_msg(fabsf(top_lp[r][j] - hlp[j]) < 2e-3f, "top %d logprob %f vs %f", j, top_lp[r][j], hlp[j]);
      }
    } else {
      ck_assert_msg(tok[r] == B || tok[r] == C, "row %d drew %d, outside {B, C}", r, tok[r]);
      seen_b += tok[r] == B, seen_c += tok[r] == C;
    }
  }
  fprintf(stderr, "  penalties, T 0.7 top-k 2: %d x C, %d x B (never A)\n", seen_c, seen_b);
  ck_assert(seen_b > 0 && seen_c > seen_b); /* exp((5.5 - 5) / 0.7) ~ 2 : 1 */
  model_sampler_deinit(&smp);
  free(row);
  gpu->ops->free(gpu->ctx, d);
  free(l);
}
END_TEST

START_TEST(test_sample_filters) {
  int vocab = _i ? 100000 : 200, rows = _i ? 64 : 20000;
  float *one = rand_vec(vocab, 2.f);
  float *l = fr_malloc((size_t)rows * vocab * 4);
  for (int r = 0; r < rows; r++) memcpy(l + (size_t)r * vocab, one, vocab * 4);
  void *d = upload_logits(l, rows, vocab);
  float *sorted = fr_malloc(vocab * 4);
  struct {
    float t, top_p, min_p;
    int top_k;
  } cases[] = {{1.f, 1.f, 0.f, 0}, {0.7f, 1.f, 0.f, 20}, {1.3f, 0.6f, 0.f, 0}, {1.f, 1.f, 0.3f, 0}, {0.9f, 0.8f, 0.05f, 50}};
  kern_sample_params_t *p = fr_calloc(rows, sizeof(*p));
  int32_t *tok = fr_malloc(rows * 4);
  float *lp = fr_malloc(rows * 4);
  double *prob = fr_malloc(vocab * sizeof(double));
  int *hits = fr_malloc(vocab * sizeof(int));
  for (size_t c = 0; c < FR_ARRAY_SIZE(cases); c++) {
    for (int r = 0; r < rows; r++)
      p[r] = (kern_sample_params_t){.temperature = cases[c].t, .top_k = cases[c].top_k, .top_p = cases[c].top_p,
                                    .min_p = cases[c].min_p, .seed = 1234, .counter = (uint64_t)(r / 2)};
    int rc = gpu->ops->sample(gpu->ctx, d, rows, vocab, p, tok, lp);
    ck_assert_msg(rc == 0, "sample: %s", fr_last_error());
    /* host reference of the allowed set and its probabilities */
    double zmax = -INFINITY;
    for (int i = 0; i < vocab; i++) zmax = fmax(zmax, one[i] / cases[c].t);
    double thr = -INFINITY;
    if (cases[c].min_p > 0) thr = zmax + log(cases[c].min_p);
    for (int i = 0; i < vocab; i++) sorted[i] = one[i] / cases[c].t;
    qsort(sorted, vocab, 4, cmp_desc);
    if (cases[c].top_k > 0) thr = fmax(thr, sorted[cases[c].top_k - 1]);
    if (cases[c].top_p < 1) {
      double tot = 0, cum = 0;
      for (int i = 0; i < vocab && sorted[i] >= thr; i++) tot += exp(sorted[i] - zmax);
      for (int i = 0; i < vocab && sorted[i] >= thr; i++) {
        cum += exp(sorted[i] - zmax);
        if (cum >= cases[c].top_p * tot) {
          thr = sorted[i];
          break;
        }
      }
    }
    double tot = 0;
    for (int i = 0; i < vocab; i++) {
      double z = one[i] / cases[c].t;
      prob[i] = z >= thr - 1e-6 ? exp(z - zmax) : 0;
      tot += prob[i];
      hits[i] = 0;
    }
    for (int r = 0; r < rows; r++) {
      ck_assert(tok[r] >= 0 && tok[r] < vocab);
      ck_assert_msg(prob[tok[r]] > 0, "case %zu: token %d (z %f) outside the allowed set (thr %f)", c, tok[r],
                    one[tok[r]] / cases[c].t, thr);
      if (r % 2) ck_assert_int_eq(tok[r], tok[r - 1]); /* same seed and counter */
      if (r % 2 == 0) hits[tok[r]]++;
    }
    /* total variation distance between the draw histogram and the target */
    double tv = 0;
    for (int i = 0; i < vocab; i++) tv += fabs(hits[i] / (rows / 2.0) - prob[i] / tot);
    tv /= 2;
    if (!_i) {
      fprintf(stderr, "  sample T=%.1f top_k=%d top_p=%.1f min_p=%.2f  TV distance %.3f\n", cases[c].t,
              cases[c].top_k, cases[c].top_p, cases[c].min_p, tv);
      ck_assert_double_lt(tv, 0.1);
    }
  }
  free(prob);
  free(hits);
  free(p);
  free(tok);
  free(lp);
  free(sorted);
  free(one);
  free(l);
  gpu->ops->free(gpu->ctx, d);
}
END_TEST

/* ---- misc ------------------------------------------------------------------------------------- */

START_TEST(test_oom_is_an_error) {
  void *p = NULL;
  int rc = gpu->ops->alloc(gpu->ctx, (size_t)1 << 50, &p);
  ck_assert_int_eq(rc, FR_EDEVOOM);
  ck_assert_ptr_null(p);
  fprintf(stderr, "  oom message: %s\n", fr_last_error());
  /* the backend still works */
  ck_assert_int_eq(gpu->ops->alloc(gpu->ctx, 1024, &p), 0);
  gpu->ops->free(gpu->ctx, p);
}
END_TEST

START_TEST(test_f16_mode) {
  kern_backend_destroy(gpu);
  setenv("FERRUM_CUDA_DTYPE", "f16", 1);
  ck_assert_int_eq(kern_cuda_create(&gpu, 0), 0);
  ck_assert_int_eq(gpu->act_type, KERN_F16);
  check_matmul(KERN_Q4_K, 128, 512, true);
  i4g_run = 4; /* KERN_Q4G: its one-row kernel too */
  check_matmul(KERN_I4G, 128, 512, true);
  i4g_run = 1;
  check_matmul(KERN_BF16, 128, 512, false);
  kvenv_t e;
  kv_setup(&e, 1, 2, 64, 16, 2, 600);
  int z[2] = {0, 0}, n[2] = {500, 3}, one[2] = {1, 1};
  kern_step_t s;
  int32_t *bufs[4];
  int nt = step_append(&e, z, n, 0, &s, bufs);
  ck_assert_double_lt(attn_compare(&e, nt, 0, 8, 0, "f16 prefill"), TOL_ACT);
  free_step(bufs);
  nt = step_append(&e, n, one, 0, &s, bufs);
  ck_assert_double_lt(attn_compare(&e, nt, 0, 8, 0, "f16 decode"), TOL_ACT);
  free_step(bufs);
  kv_teardown(&e);
}
END_TEST

/* Speculative decoding's verify pass (model_forward_rows): the last 1 + 4
 * positions' logits of one multi-token step on the GPU against the CPU's,
 * and against the GPU's own token-by-token decodes (CUDA is not batch
 * invariant: close, not equal). A tiny random llama, the same weights on
 * both backends. */
START_TEST(test_forward_rows) {
  enum { NV = 512, R = 5 };
  static const int32_t toks[12] = {5, 77, 301, 12, 9, 400, 401, 402, 33, 250, 7, 99};
  fwr_t c, g, d;
  ck_assert_msg(fwr_init(&c, cpu, 3) == 0, "%s", fr_last_error());
  ck_assert_msg(fwr_init(&g, gpu, 3) == 0, "%s", fr_last_error());
  ck_assert_msg(fwr_init(&d, gpu, 3) == 0, "%s", fr_last_error());
  static float rc[R * NV], rg[R * NV], rd[R * NV];
  ck_assert_int_eq(fwr_step(&c, toks, 0, 7, 0, rc), 0);
  ck_assert_int_eq(fwr_step(&c, toks + 7, 7, R, R, rc), 0);
  ck_assert_int_eq(fwr_step(&g, toks, 0, 7, 0, rg), 0);
  ck_assert_int_eq(fwr_step(&g, toks + 7, 7, R, R, rg), 0);
  ck_assert_int_eq(fwr_step(&d, toks, 0, 7, 0, rd), 0);
  for (int i = 0; i < R; i++) ck_assert_int_eq(fwr_step(&d, toks + 7 + i, 7 + i, 1, 0, rd + (size_t)i * NV), 0);
  for (int i = 0; i < R; i++) {
    double e_cpu = nerr(rg + (size_t)i * NV, rc + (size_t)i * NV, NV);
    double e_dec = nerr(rg + (size_t)i * NV, rd + (size_t)i * NV, NV);
    ck_assert_msg(e_cpu < 3 * TOL_ACT, "row %d: GPU vs CPU normalized error %g", i, e_cpu);
    ck_assert_msg(e_dec < 3 * TOL_ACT, "row %d: verify vs decode normalized error %g", i, e_dec);
  }
  fwr_deinit(&d), fwr_deinit(&g), fwr_deinit(&c);
}
END_TEST

/* ---- constrained decoding: allowed-token masks --------------------------------------------------- */

/* A random mask of (vocab + 31) / 32 words allowing about 1 in `one_in`
 * tokens of the vocabulary (none past it). */
static void rand_mask(uint32_t *m, int vocab, int one_in) {
  memset(m, 0, (size_t)(vocab + 31) / 32 * sizeof *m);
  for (int t = 0; t < vocab; t++)
    if (rndi(one_in) == 0) m[t / 32] |= 1u << (t % 32);
}

static void mask_set(uint32_t *m, int t) { m[t / 32] |= 1u << (t % 32); }

static bool mask_has(const uint32_t *m, int n_words, int t) { return t / 32 < n_words && (m[t / 32] >> (t % 32) & 1); }

/* Masked rows among unmasked ones, one launch, against the host sampler
 * (model_sample with the same bitmask): greedy rows with random masks,
 * with penalties, with a mask shorter than the vocabulary, with one
 * allowed token (greedy and with filters), with min_tokens bans that the
 * mask must override (only banned tokens allowed) or not (another allowed
 * one left): the host's token and (raw) logprob, top logprobs of the raw
 * logits. Loop: a vocabulary not a multiple of 32, then Qwen's. */
START_TEST(test_sample_mask) {
  enum { ROWS = 36, KINDS = 9 };
  const int vocab = _i ? 151936 : 50003, words = (vocab + 31) / 32;
  const int A = 17, B = vocab - 2, C = vocab / 3; /* A, B: "EOS" tokens, banned below min_tokens */
  const int P = 160, Q = 170; /* planted: P (7.875, in the output) wins unless penalized, then Q (6.5) does */
  float *l = fr_malloc((size_t)ROWS * vocab * sizeof(float));
  for (size_t i = 0; i < (size_t)ROWS * vocab; i++) l[i] = round_act((rndu() - 0.5f) * 8.f);
  for (int r = 0; r < ROWS; r++) l[(size_t)r * vocab + P] = 7.875f, l[(size_t)r * vocab + Q] = 6.5f;
  uint32_t *masks = fr_calloc((size_t)ROWS * words, sizeof(uint32_t));
  int32_t hist[30], one_tok[ROWS];
  for (int i = 0; i < 30; i++) hist[i] = 100 + rndi(50);
  hist[25] = P;
  const int32_t ban[] = {A, B, B};
  kern_sample_params_t p[ROWS];
  int32_t ids[ROWS][KERN_SAMPLE_MAX_TOP];
  float lps[ROWS][KERN_SAMPLE_MAX_TOP];
  for (int r = 0; r < ROWS; r++) {
    const int kind = r % KINDS;
    uint32_t *m = masks + (size_t)r * words;
    one_tok[r] = rndi(vocab);
    p[r] = (kern_sample_params_t){.temperature = 0.f, .top_p = 1.f, .seed = 5, .counter = (uint64_t)r,
                                  .repetition_penalty = 1.f, .prompt = hist, .output = hist + 20, .n_prompt = 20,
                                  .n_output = 10, .allow = m, .n_allow = words};
    switch (kind) {
    case 0: p[r].allow = NULL, p[r].n_allow = 0; break; /* unguided */
    case 1: rand_mask(m, vocab, 10), p[r].top_n = 5, p[r].top_ids = ids[r], p[r].top_lp = lps[r]; break;
    case 2: /* penalties: P falls below Q */
      rand_mask(m, vocab, 3), mask_set(m, P), mask_set(m, Q);
      p[r].repetition_penalty = 1.3f, p[r].presence_penalty = 0.4f;
      break;
    case 3: rand_mask(m, vocab, 2), p[r].n_allow = words / 2; break; /* ids past the words: not allowed */
    case 4: mask_set(m, one_tok[r]); break;                         /* one token, greedy */
    case 5: /* one token, sampled through every filter */
      mask_set(m, one_tok[r]);
      p[r].temperature = 0.9f, p[r].top_k = 40, p[r].top_p = 0.8f, p[r].min_p = 0.1f;
      break;
    case 6: mask_set(m, A), mask_set(m, B); /* only bans allowed: the mask wins over min_tokens */
      p[r].ban = ban, p[r].n_ban = 3, p[r].min_tokens = 20;
      break;
    case 7: mask_set(m, A), mask_set(m, B), mask_set(m, C); /* C is left: the bans hold */
      p[r].ban = ban, p[r].n_ban = 3, p[r].min_tokens = 20;
      break;
    default: rand_mask(m, vocab, 50), p[r].n_allow = 0; break; /* words given but 0 of them: no mask */
    }
  }
  void *d = upload_logits(l, ROWS, vocab);
  int32_t tok[ROWS];
  float lp[ROWS];
  int rc = gpu->ops->sample(gpu->ctx, d, ROWS, vocab, p, tok, lp);
  ck_assert_msg(rc == 0, "sample: %s", fr_last_error());
  model_sampler_t smp;
  model_sampler_init(&smp, vocab);
  float *row = fr_malloc((size_t)vocab * sizeof(float));
  int32_t hid[KERN_SAMPLE_MAX_TOP];
  float hlp[KERN_SAMPLE_MAX_TOP];
  for (int r = 0; r < ROWS; r++) {
    const int kind = r % KINDS;
    const float *x = l + (size_t)r * vocab;
    if (p[r].n_allow)
      ck_assert_msg(mask_has(p[r].allow, p[r].n_allow, tok[r]), "row %d (kind %d): token %d not allowed", r, kind,
                    tok[r]);
    if (kind == 4 || kind == 5) ck_assert_int_eq(tok[r], one_tok[r]);
    if (kind == 7) ck_assert_int_eq(tok[r], C);
    if (kind == 2) ck_assert_int_eq(tok[r], Q);
    memcpy(row, x, (size_t)vocab * sizeof(float));
    model_sampling_t hp = model_sampling_default();
    hp.temperature = p[r].temperature, hp.top_k = p[r].top_k, hp.top_p = p[r].top_p, hp.min_p = p[r].min_p;
    hp.repetition_penalty = p[r].repetition_penalty, hp.presence_penalty = p[r].presence_penalty;
    hp.ban = p[r].ban, hp.n_ban = p[r].n_ban, hp.min_tokens = p[r].min_tokens;
    hp.allow = p[r].n_allow ? p[r].allow : NULL, hp.n_allow = p[r].n_allow;
    hp.seed = 5;
    float host_lp = 0;
    int32_t host = model_sample(&smp, &hp, row, hist, 20, hist + 20, 10, (uint64_t)r, &host_lp);
    fprintf(stderr, "  mask row %2d kind %d: device %6d host %6d, logprob %.4f vs %.4f\n", r, kind, tok[r], host, lp[r],
            host_lp);
    ck_assert_int_eq(tok[r], host); /* greedy, or one allowed token */
    ck_assert_msg(fabsf(lp[r] - host_lp) < 2e-3f, "row %d: logprob %f vs %f", r, lp[r], host_lp);
    if (!p[r].top_n) continue;
    model_logprobs(x, vocab, p[r].top_n, hid, hlp, NULL); /* raw logits: the mask is not in the logprobs */
    for (int j = 0; j < p[r].top_n; j++) {
      ck_assert_msg(x[ids[r][j]] == x[hid[j]], "row %d top %d: id %d vs host %d", r, j, ids[r][j], hid[j]);
      ck_assert_msg(fabsf(lps[r][j] - hlp[j]) < 2e-3f, "row %d top %d: logprob %f vs %f", r, j, lps[r][j], hlp[j]);
    }
  }
  model_sampler_deinit(&smp);
  free(row);
  free(masks);
  gpu->ops->free(gpu->ctx, d);
  free(l);
}
END_TEST

/* Seeded sampling under a mask: even rows draw from the raw logits with a
 * mask, odd rows (same seed and counter) from logits with -inf where the
 * mask says no, unmasked: the same token each pair, always allowed; the
 * draws follow the host's distribution (softmax at T over the allowed
 * tokens, then top-p), within a total variation distance of 0.1. The
 * argmax of the raw logits is not allowed. */
START_TEST(test_sample_mask_seeded) {
  enum { VOCAB = 2000, PAIRS = 10000 };
  const int words = (VOCAB + 31) / 32, rows = 2 * PAIRS;
  float *one = rand_vec(VOCAB, 2.f);
  uint32_t *m = fr_malloc((size_t)words * sizeof *m);
  rand_mask(m, VOCAB, 12);
  int amax = 0;
  for (int i = 0; i < VOCAB; i++) amax = one[i] > one[amax] ? i : amax;
  m[amax / 32] &= ~(1u << (amax % 32));
  float *l = fr_malloc((size_t)rows * VOCAB * 4);
  for (int r = 0; r < rows; r++)
    for (int i = 0; i < VOCAB; i++) l[(size_t)r * VOCAB + i] = r % 2 && !mask_has(m, words, i) ? -INFINITY : one[i];
  void *d = upload_logits(l, rows, VOCAB);
  const struct { float t, top_p; int top_k; } cases[] = {{1.f, 1.f, 0}, {0.8f, 0.7f, 0}, {1.2f, 1.f, 30}};
  kern_sample_params_t *p = fr_calloc(rows, sizeof(*p));
  int32_t *tok = fr_malloc(rows * 4);
  float *lp = fr_malloc(rows * 4);
  double *prob = fr_malloc(VOCAB * sizeof(double));
  float *sorted = fr_malloc(VOCAB * 4);
  int *hits = fr_malloc(VOCAB * sizeof(int));
  for (size_t c = 0; c < FR_ARRAY_SIZE(cases); c++) {
    /* the logits are the sampler's scratch: a masked row is rewritten, so upload again */
    gpu->ops->free(gpu->ctx, d);
    d = upload_logits(l, rows, VOCAB);
    for (int r = 0; r < rows; r++)
      p[r] = (kern_sample_params_t){.temperature = cases[c].t, .top_p = cases[c].top_p, .top_k = cases[c].top_k,
                                    .seed = 99, .counter = (uint64_t)(r / 2), .allow = r % 2 ? NULL : m,
                                    .n_allow = r % 2 ? 0 : words};
    int rc = gpu->ops->sample(gpu->ctx, d, rows, VOCAB, p, tok, lp);
    ck_assert_msg(rc == 0, "sample: %s", fr_last_error());
    /* host reference: softmax at T over the allowed tokens, top-k, then top-p over what is left */
    int n = 0;
    double zmax = -INFINITY, thr = -INFINITY;
    for (int i = 0; i < VOCAB; i++)
      if (mask_has(m, words, i)) sorted[n++] = one[i] / cases[c].t, zmax = fmax(zmax, one[i] / cases[c].t);
    qsort(sorted, n, 4, cmp_desc);
    if (cases[c].top_k > 0 && cases[c].top_k < n) thr = sorted[cases[c].top_k - 1];
    if (cases[c].top_p < 1) {
      double tot = 0, cum = 0;
      for (int i = 0; i < n && sorted[i] >= thr; i++) tot += exp(sorted[i] - zmax);
      for (int i = 0; i < n && sorted[i] >= thr; i++)
        if ((cum += exp(sorted[i] - zmax)) >= cases[c].top_p * tot) {
          thr = sorted[i];
          break;
        }
    }
    double tot = 0;
    for (int i = 0; i < VOCAB; i++) {
      double z = one[i] / cases[c].t;
      prob[i] = mask_has(m, words, i) && z >= thr - 1e-6 ? exp(z - zmax) : 0;
      tot += prob[i];
      hits[i] = 0;
    }
    for (int r = 0; r < rows; r += 2) {
      ck_assert(tok[r] >= 0 && tok[r] < VOCAB);
      ck_assert_msg(prob[tok[r]] > 0, "case %zu: token %d outside the allowed set", c, tok[r]);
      ck_assert_msg(tok[r] == tok[r + 1], "case %zu pair %d: masked %d, -inf logits %d", c, r / 2, tok[r], tok[r + 1]);
      hits[tok[r]]++;
    }
    double tv = 0;
    for (int i = 0; i < VOCAB; i++) tv += fabs(hits[i] / (double)PAIRS - prob[i] / tot);
    tv /= 2;
    fprintf(stderr, "  masked sample T=%.1f top_p=%.1f top_k=%d: TV distance %.3f\n", cases[c].t, cases[c].top_p,
            cases[c].top_k, tv);
    ck_assert_double_lt(tv, 0.1);
  }
  free(prob), free(sorted), free(hits), free(p), free(tok), free(lp), free(m), free(one), free(l);
  gpu->ops->free(gpu->ctx, d);
}
END_TEST

/* A mask that allows no token (all words 0) fails nothing: the call
 * succeeds, the row gets a token id in the vocabulary (the worker reports
 * the item failed: worker/step.c), and the other rows of the batch are
 * sampled as without it. */
START_TEST(test_sample_mask_none) {
  enum { ROWS = 3, VOCAB = 3000 };
  float *l = rand_vec((size_t)ROWS * VOCAB, 3.f);
  void *d = upload_logits(l, ROWS, VOCAB);
  uint32_t none[(VOCAB + 31) / 32] = {0};
  kern_sample_params_t p[ROWS];
  for (int r = 0; r < ROWS; r++) /* row 0 greedy, row 1 sampled through top-k and top-p, row 2 unmasked */
    p[r] = (kern_sample_params_t){.temperature = r == 1 ? 0.8f : 0.f, .top_p = r == 1 ? 0.9f : 1.f,
                                  .top_k = r == 1 ? 10 : 0, .seed = 1, .allow = r < 2 ? none : NULL,
                                  .n_allow = r < 2 ? (int)FR_ARRAY_SIZE(none) : 0};
  int32_t tok[ROWS];
  float lp[ROWS];
  int rc = gpu->ops->sample(gpu->ctx, d, ROWS, VOCAB, p, tok, lp);
  ck_assert_msg(rc == 0, "sample: %s", fr_last_error());
  for (int r = 0; r < 2; r++) ck_assert_msg(tok[r] >= 0 && tok[r] < VOCAB, "row %d: token %d", r, tok[r]);
  const float *x = l + 2 * VOCAB;
  int best = 0;
  for (int i = 0; i < VOCAB; i++) best = x[i] > x[best] ? i : best;
  ck_assert_int_eq(tok[2], best);
  fprintf(stderr, "  mask allowing none: tokens %d %d, unmasked row %d\n", tok[0], tok[1], tok[2]);
  gpu->ops->free(gpu->ctx, d);
  free(l);
}
END_TEST

static Suite *cuda_suite(void) {
  Suite *s = suite_create("cuda_ops");
  TCase *tc = tcase_create("ops");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_matmul_dense);
  tcase_add_loop_test(tc, test_matmul_quant, 0, (int)FR_ARRAY_SIZE(k_quant));
  tcase_add_test(tc, test_matmul_i4g_perm);
  tcase_add_test(tc, test_matmul_fp8);
  tcase_add_test(tc, test_matmul_fp8_file);
  tcase_add_test(tc, test_fp8_cpu_refuses);
  tcase_add_test(tc, test_fp8_twin);
  tcase_add_loop_test(tc, test_matmul_q4f, 0, (int)FR_ARRAY_SIZE(k_q4));
  tcase_add_loop_test(tc, test_matmul_q4f_wg, 0, (int)FR_ARRAY_SIZE(k_q4));
  tcase_add_loop_test(tc, test_q4f_silu_mul, 0, (int)FR_ARRAY_SIZE(k_q4));
  tcase_add_test(tc, test_matmul_q6f);
  tcase_add_test(tc, test_matmul_i4g_perm_padded);
  tcase_add_loop_test(tc, test_moe_dense, 0, 2 * (int)FR_ARRAY_SIZE(k_moe_shapes));
  tcase_add_loop_test(tc, test_moe_quant, 0, (int)FR_ARRAY_SIZE(k_quant));
  tcase_add_test(tc, test_moe_nan_token);
  tcase_add_test(tc, test_embed);
  tcase_add_test(tc, test_rms_norm);
  tcase_add_test(tc, test_rope);
  tcase_add_test(tc, test_elementwise);
  tcase_add_loop_test(tc, test_attention_prefill, 0, (int)FR_ARRAY_SIZE(k_pf_bf16) * (int)FR_ARRAY_SIZE(k_attn_shapes));
  tcase_add_loop_test(tc, test_attention_decode, 0,
                      (int)(FR_ARRAY_SIZE(k_dec_env) * FR_ARRAY_SIZE(k_attn_shapes)));
  tcase_add_loop_test(tc, test_attention_decode_wide, 0, 3 * (int)FR_ARRAY_SIZE(k_wide_shapes));
  tcase_add_loop_test(tc, test_attention_decode_wide_kvq, 0, 3 * (int)FR_ARRAY_SIZE(k_wide_shapes));
  tcase_add_loop_test(tc, test_attention_prefill_kvq, 0, 2 * PF_N * (int)FR_ARRAY_SIZE(k_attn_shapes));
  tcase_add_test(tc, test_attention_prefill_kvq_draft_pool);
  tcase_add_loop_test(tc, test_attention_verify, 0, 4 * (int)FR_ARRAY_SIZE(k_attn_shapes));
  tcase_add_loop_test(tc, test_attention_decode_kvq, 0, 2 * (int)FR_ARRAY_SIZE(k_attn_shapes));
  tcase_add_test(tc, test_kv_append_kvq);
  tcase_add_test(tc, test_kv_copy_blocks);
  tcase_add_test(tc, test_rope_kv_append);
  tcase_add_loop_test(tc, test_fused_matmuls, 0, 6);
  tcase_add_test(tc, test_graph_replay);
  tcase_add_loop_test(tc, test_graph_after_growth, 0, 2);
  tcase_add_test(tc, test_graph_beside_narrow_pool);
  tcase_add_test(tc, test_sample_greedy);
  tcase_add_loop_test(tc, test_sample_filters, 0, 2);
  tcase_add_test(tc, test_sample_penalties);
  tcase_add_test(tc, test_sample_bias);
  tcase_add_test(tc, test_sample_top_logprobs);
  tcase_add_loop_test(tc, test_sample_mask, 0, 2);
  tcase_add_test(tc, test_sample_mask_seeded);
  tcase_add_test(tc, test_sample_mask_none);
  tcase_add_test(tc, test_oom_is_an_error);
  tcase_add_test(tc, test_f16_mode);
  tcase_add_test(tc, test_forward_rows);
  suite_add_tcase(s, tc);
  return s;
}

/* The shared main (tests/common/test_main.c) runs this program's suites. */
#include "tests/common/test_main.h"

const test_prog_t test_prog = {.suites = {cuda_suite}, .setup = gpu_test_setup};
