/* test_ops.c - every CPU backend op against a straightforward reference in
 * double precision written here, on every kernel path this CPU runs
 * (FERRUM_CPU_ISA=scalar|avx2|avx512|avx512vnni) with 1 and 2 threads. Outputs are
 * poisoned with NaN before each op to catch unwritten elements.
 *
 * Matmul references use the weights as kern_dequantize_row gives them
 * (checked against gguf in test_dequant) and unquantized f32 activations,
 * so quantized types are held to a normalized-error bound (activations are
 * quantized to int8 by the backend). */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "kernels/cpu/cpu.h"
#include "kernels/kern.h"

/* ---- configurations: (kernel path, threads) ---- */

static const struct {
  const char *isa;
  int threads;
} kCfg[] = {{"scalar", 1}, {"scalar", 2}, {"avx2", 1}, {"avx2", 2}, {"avx512", 1}, {"avx512", 2},
             {"avx512vnni", 1}, {"avx512vnni", 2}};
#define N_CFG ((int)(sizeof kCfg / sizeof kCfg[0]))

/* The backend for configuration i, or NULL when this CPU cannot run it. */
static kern_backend_t *backend_for(int i) {
  if (!kern_cpu_isa_supported(kCfg[i].isa)) {
    fprintf(stderr, "skip: %s not supported here\n", kCfg[i].isa);
    return NULL;
  }
  setenv("FERRUM_CPU_ISA", kCfg[i].isa, 1);
  kern_backend_t *b = NULL;
  ck_assert_int_eq(kern_cpu_create(&b, kCfg[i].threads), 0);
  ck_assert_str_eq(kern_cpu_isa(b), kCfg[i].isa);
  ck_assert_int_eq(b->act_type, KERN_F32);
  return b;
}

/* ---- deterministic random numbers ---- */

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint64_t rnd_u64(void) {
  uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static double rnd_unit(void) { return (double)(rnd_u64() >> 11) / 9007199254740992.0; } /* [0,1) */
static float rnd_f(void) { return (float)(2.0 * rnd_unit() - 1.0); }                     /* [-1,1) */
static float *rnd_vec(size_t n) {
  float *v = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) v[i] = rnd_f();
  return v;
}
static void poison(float *p, size_t n) {
  for (size_t i = 0; i < n; i++) p[i] = NAN;
}

static void set_f16(uint8_t *p, float v) {
  uint16_t h = fr_fp32_to_fp16(v);
  memcpy(p, &h, 2);
}

/* Random valid weight rows of a type: random payload bytes, sane scales. */
static uint8_t *random_weight(kern_type_t t, int rows, int cols) {
  const kern_type_traits_t *tr = kern_type_traits(t);
  size_t rb = kern_row_bytes(t, cols), nb = (size_t)rows * (size_t)cols / (size_t)tr->blck;
  uint8_t *w = malloc(rb * (size_t)rows);
  if (t == KERN_F32 || t == KERN_F16 || t == KERN_BF16) {
    for (size_t i = 0; i < (size_t)rows * (size_t)cols; i++) {
      float v = rnd_f();
      if (t == KERN_F32) memcpy(w + 4 * i, &v, 4);
      else {
        uint16_t h = t == KERN_F16 ? fr_fp32_to_fp16(v) : fr_fp32_to_bf16(v);
        memcpy(w + 2 * i, &h, 2);
      }
    }
    return w;
  }
  for (size_t i = 0; i < rb * (size_t)rows; i++) w[i] = (uint8_t)rnd_u64();
  for (size_t b = 0; b < nb; b++) {
    uint8_t *blk = w + b * (size_t)tr->size;
    float d = (float)(0.02 + 0.1 * rnd_unit()), m = (float)(0.05 * rnd_f());
    switch (t) {
    case KERN_Q4_1: case KERN_Q5_1: set_f16(blk, d); set_f16(blk + 2, m); break;
    case KERN_I4G: memcpy(blk, &d, 4); memcpy(blk + 4, &m, 4); break;
    case KERN_Q4_K: case KERN_Q5_K: set_f16(blk, d * 0.05f); set_f16(blk + 2, m * 0.05f); break;
    case KERN_Q6_K: set_f16(blk + 208, d * 0.05f); break;
    default: set_f16(blk, rnd_unit() < 0.5 ? d : -d); break; /* Q4_0 Q5_0 Q8_0 */
    }
  }
  return w;
}

/* ||a - b|| / ||b|| over n values; also fails on non-finite values. */
static double nerr(const float *a, const double *b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    ck_assert_msg(isfinite(a[i]), "element %zu not finite (%g)", i, a[i]);
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return sqrt(num / (den > 0 ? den : 1));
}

/* A matmul weight (the backend may repack it: CPU panels) or, with keep, a
 * weight whose rows something else reads (an embedding table, MoE experts);
 * b->ops->weight_release frees what the backend made of it. */
static void load_weight_as(kern_backend_t *b, kern_weight_t *w, kern_type_t t, int rows, int cols, const void *data,
                           bool keep) {
  memset(w, 0, sizeof *w);
  w->type = t;
  w->rows = rows;
  w->cols = cols;
  w->row_bytes = kern_row_bytes(t, cols);
  w->keep_layout = keep;
  ck_assert_int_eq(b->ops->weight_load(b->ctx, w, data), 0);
}

static void load_weight(kern_backend_t *b, kern_weight_t *w, kern_type_t t, int rows, int cols, const void *data) {
  load_weight_as(b, w, t, rows, cols, data, false);
}

/* ---- matmul ---- */

static const struct {
  kern_type_t type;
  double max_err; /* normalized error bound */
} kMm[] = {{KERN_F32, 1e-6},  {KERN_F16, 1e-6},  {KERN_BF16, 1e-6}, {KERN_Q4_0, 0.02}, {KERN_Q4_1, 0.02},
           {KERN_Q5_0, 0.02}, {KERN_Q5_1, 0.02}, {KERN_Q8_0, 0.02}, {KERN_Q4_K, 0.02}, {KERN_Q5_K, 0.02},
           {KERN_Q6_K, 0.02}, {KERN_I4G, 1e-5}}; /* I4G dots f32 activations: no rounding of x */

static void check_matmul(kern_backend_t *b, kern_type_t t, double max_err, int rows, int cols, int n, bool bias) {
  uint8_t *wd = random_weight(t, rows, cols);
  float *x = rnd_vec((size_t)n * (size_t)cols), *bv = rnd_vec((size_t)rows);
  float *out = malloc(sizeof(float) * (size_t)n * (size_t)rows), *wf = malloc(sizeof(float) * (size_t)cols);
  double *ref = calloc((size_t)n * (size_t)rows, sizeof(double));
  kern_weight_t w, wb;
  load_weight(b, &w, t, rows, cols, wd);
  load_weight(b, &wb, KERN_F32, 1, rows, bv);
  for (int r = 0; r < rows; r++) {
    kern_dequantize_row(t, wd + (size_t)r * w.row_bytes, wf, cols);
    for (int j = 0; j < n; j++) {
      double s = bias ? bv[r] : 0.0;
      for (int k = 0; k < cols; k++) s += (double)wf[k] * x[(size_t)j * (size_t)cols + (size_t)k];
      ref[(size_t)j * (size_t)rows + (size_t)r] = s;
    }
  }
  poison(out, (size_t)n * (size_t)rows);
  ck_assert_int_eq(b->ops->matmul(b->ctx, out, &w, bias ? &wb : NULL, x, n), 0);
  double e = nerr(out, ref, (size_t)n * (size_t)rows);
  ck_assert_msg(e < max_err, "matmul %s %dx%d n=%d: normalized error %g >= %g", kern_type_traits(t)->name, rows, cols,
                n, e, max_err);
  b->ops->weight_release(b->ctx, &w);
  free(wd), free(x), free(bv), free(out), free(wf), free(ref);
}

START_TEST(test_matmul) {
  kern_backend_t *b = backend_for(_i);
  if (!b) return;
  for (size_t k = 0; k < sizeof kMm / sizeof kMm[0]; k++) {
    kern_type_t t = kMm[k].type;
    int blck = kern_type_traits(t)->blck;
    int cols_list[2] = {blck == 256 ? 768 : 96, 512};
    for (int c = 0; c < 2; c++) {
      check_matmul(b, t, kMm[k].max_err, 70, cols_list[c], 1, false);
      check_matmul(b, t, kMm[k].max_err, 70, cols_list[c], 5, true);
      check_matmul(b, t, kMm[k].max_err, 33, cols_list[c], 19, false);
      check_matmul(b, t, kMm[k].max_err, 64, cols_list[c], 7, true); /* whole panels where the path has them */
    }
  }
  kern_backend_destroy(b);
}
END_TEST

/* The quantized paths must agree with each other closely (same integer
 * arithmetic, different float summation order): compare against scalar. */
START_TEST(test_matmul_paths_agree) {
  if (!kern_cpu_isa_supported(kCfg[_i].isa) || !strcmp(kCfg[_i].isa, "scalar")) return;
  kern_backend_t *s = backend_for(0), *b = backend_for(_i);
  const int rows = 64, cols = 1536, n = 3;
  for (size_t k = 0; k < sizeof kMm / sizeof kMm[0]; k++) {
    kern_type_t t = kMm[k].type;
    uint8_t *wd = random_weight(t, rows, cols);
    float *x = rnd_vec((size_t)n * cols), o1[64 * 3], o2[64 * 3];
    kern_weight_t w1, w2;
    load_weight(s, &w1, t, rows, cols, wd);
    load_weight(b, &w2, t, rows, cols, wd);
    ck_assert_int_eq(s->ops->matmul(s->ctx, o1, &w1, NULL, x, n), 0);
    ck_assert_int_eq(b->ops->matmul(b->ctx, o2, &w2, NULL, x, n), 0);
    double ref[64 * 3];
    for (int i = 0; i < rows * n; i++) ref[i] = o1[i];
    double e = nerr(o2, ref, (size_t)rows * n);
    ck_assert_msg(e < 1e-5, "%s: %s vs scalar differ by %g", kern_type_traits(t)->name, kCfg[_i].isa, e);
    s->ops->weight_release(s->ctx, &w1);
    b->ops->weight_release(b->ctx, &w2);
    free(wd), free(x);
  }
  kern_backend_destroy(s);
  kern_backend_destroy(b);
}
END_TEST

/* Batched rows must equal rows computed one at a time, bit for bit (the
 * engine promises batched == single decoding). */
START_TEST(test_matmul_batch_invariant) {
  kern_backend_t *b = backend_for(_i);
  if (!b) return;
  const int n = 11;
  static const int rows_list[] = {37, 48}; /* rows in rows; then whole panels where the path has them */
  for (size_t k = 0; k < sizeof kMm / sizeof kMm[0]; k++)
    for (size_t ri = 0; ri < FR_ARRAY_SIZE(rows_list); ri++) {
      kern_type_t t = kMm[k].type;
      const int rows = rows_list[ri];
      const int cols = kern_type_traits(t)->blck == 256 ? 512 : 544; /* 17 blocks of 32: an odd tail */
      uint8_t *wd = random_weight(t, rows, cols);
      float *x = rnd_vec((size_t)n * cols), batched[48 * 11], single[48];
      kern_weight_t w;
      load_weight(b, &w, t, rows, cols, wd);
      ck_assert_int_eq(b->ops->matmul(b->ctx, batched, &w, NULL, x, n), 0);
      for (int j = 0; j < n; j++) {
        ck_assert_int_eq(b->ops->matmul(b->ctx, single, &w, NULL, x + (size_t)j * cols, 1), 0);
        ck_assert_msg(!memcmp(single, batched + (size_t)j * rows, sizeof(float) * (size_t)rows),
                      "%s %d rows, row %d: batched != single", kern_type_traits(t)->name, rows, j);
        /* one weight row alone: the plain 1-row dot, whatever multi-row forms the path has (a panel's rows
         * compute otherwise: cpu.h) */
        for (int r = 0; w.priv == NULL && r < rows; r += 9) {
          kern_weight_t w1;
          float one;
          load_weight(b, &w1, t, 1, cols, wd + (size_t)r * w.row_bytes);
          ck_assert_int_eq(b->ops->matmul(b->ctx, &one, &w1, NULL, x + (size_t)j * cols, 1), 0);
          ck_assert_msg(!memcmp(&one, &single[r], sizeof one),
                        "%s weight row %d, activation row %d: 1-row dot != batched", kern_type_traits(t)->name, r, j);
          b->ops->weight_release(b->ctx, &w1);
        }
      }
      b->ops->weight_release(b->ctx, &w);
      free(wd), free(x);
    }
  kern_backend_destroy(b);
}
END_TEST

/* Worst case for the integer dots: every weight byte 0x80 (Q8_0's -128,
 * Q4's nibble pattern 8/0) or 0xFF (15/15, Q8_0's -1), every activation at
 * +-127 after quantization. */
static void extreme_inputs(uint8_t *wd, size_t wbytes, float *x, size_t nx, kern_type_t t, int rows, int cols) {
  const size_t bs = kern_type_traits(t)->size, rb = kern_row_bytes(t, cols);
  uint8_t *fresh = random_weight(t, rows, cols); /* keeps the scales sane */
  memcpy(wd, fresh, wbytes);
  free(fresh);
  for (size_t r = 0; r < (size_t)rows; r++)
    for (size_t b = 0; b < rb / bs; b++) {
      uint8_t *blk = wd + r * rb + b * bs;
      size_t head = t == KERN_Q4_1 ? 4 : 2; /* Q8_0 and Q4_0: one f16 scale */
      memset(blk + head, r % 2 ? 0xFF : 0x80, bs - head);
    }
  for (size_t i = 0; i < nx; i++) x[i] = (i / 3) % 2 ? 1.0f : -1.0f;
}

/* The VNNI table must give the plain AVX-512 table's bits: its dots are
 * vpdpbusd instead of maddubs + madd, the same integer sums. Random and
 * extreme inputs, 1 row (decode dots) and 11 (4-row prefill dots). */
START_TEST(test_matmul_vnni_exact) {
  if (!kern_cpu_isa_supported("avx512vnni")) {
    fprintf(stderr, "skip: avx512vnni not supported here\n");
    return;
  }
  kern_backend_t *p = backend_for(4), *v = backend_for(6);
  const int rows = 37, cols = 1024, n = 11;
  for (size_t k = 0; k < sizeof kMm / sizeof kMm[0]; k++)
    for (int extreme = 0; extreme < 2; extreme++) {
      kern_type_t t = kMm[k].type;
      if (extreme && t != KERN_Q4_0 && t != KERN_Q4_1 && t != KERN_Q8_0) continue;
      uint8_t *wd = random_weight(t, rows, cols);
      float *x = rnd_vec((size_t)n * cols), o1[37 * 11], o2[37 * 11];
      if (extreme) extreme_inputs(wd, kern_row_bytes(t, cols) * rows, x, (size_t)n * cols, t, rows, cols);
      kern_weight_t w1, w2;
      load_weight(p, &w1, t, rows, cols, wd);
      load_weight(v, &w2, t, rows, cols, wd);
      for (int m = 1; m <= n; m += n - 1) {
        ck_assert_int_eq(p->ops->matmul(p->ctx, o1, &w1, NULL, x, m), 0);
        ck_assert_int_eq(v->ops->matmul(v->ctx, o2, &w2, NULL, x, m), 0);
        ck_assert_msg(!memcmp(o1, o2, sizeof(float) * (size_t)(rows * m)), "%s%s n=%d: avx512vnni != avx512",
                      kern_type_traits(t)->name, extreme ? " (extreme)" : "", m);
      }
      p->ops->weight_release(p->ctx, &w1);
      v->ops->weight_release(v->ctx, &w2);
      free(wd), free(x);
    }
  kern_backend_destroy(p);
  kern_backend_destroy(v);
}
END_TEST

/* Every table's panel kernel gives cpu__panel_gemm_scalar's bits on the
 * same panels and activation blocks: random and extreme inputs, 1 to 11
 * activation rows (every tile width and leftover), with and without bias,
 * through matmul (which packs at load, quantizes and tiles). */
START_TEST(test_matmul_panels_exact) {
  static const kern_type_t types[] = {KERN_Q4_0, KERN_Q4_1, KERN_Q5_0, KERN_Q8_0, KERN_Q4_K, KERN_Q6_K};
  const int rows = 48, n = 11;
  int tested = 0;
  for (int c = 0; c < N_CFG; c++) {
    if (!kern_cpu_isa_supported(kCfg[c].isa)) continue;
    kern_backend_t *b = backend_for(c);
    const cpu_isa_t *isa = ((cpu_ctx_t *)b->ctx)->isa;
    for (size_t k = 0; k < FR_ARRAY_SIZE(types); k++) {
      const kern_type_t t = types[k];
      if (!isa->panel_gemm[t]) continue;
      const int blck = kern_type_traits(t)->blck, cols = blck == 256 ? 768 : 544, nb = cols / blck;
      for (int extreme = 0; extreme < 2; extreme++) {
        if (extreme && blck == 256) continue; /* extreme_inputs knows the 32-element layouts */
        uint8_t *wd = random_weight(t, rows, cols);
        float *x = rnd_vec((size_t)n * cols), *bias = rnd_vec(rows), out[48 * 11], ref[48 * 11];
        if (extreme) extreme_inputs(wd, kern_row_bytes(t, cols) * rows, x, (size_t)n * cols, t, rows, cols);
        kern_weight_t w, wb;
        load_weight(b, &w, t, rows, cols, wd);
        load_weight(b, &wb, KERN_F32, 1, rows, bias);
        ck_assert_ptr_nonnull(w.priv);
        const size_t arow = (size_t)nb * cpu__panel_act_bytes(t);
        uint8_t *a = malloc(arow * (size_t)n);
        for (int j = 0; j < n; j++)
          cpu__panel_quantize(isa->quantize[cpu_vec_dot_type(t)], t, x + (size_t)j * cols, a + (size_t)j * arow, cols);
        for (int m = 1; m <= n; m++)
          for (int with_bias = 0; with_bias < 2; with_bias++) {
            poison(out, (size_t)rows * (size_t)m);
            ck_assert_int_eq(b->ops->matmul(b->ctx, out, &w, with_bias ? &wb : NULL, x, m), 0);
            for (int p = 0; p < rows / CPU_PANEL_ROWS; p++)
              cpu__panel_gemm_scalar(t, nb, (const uint8_t *)w.priv + (size_t)p * nb * cpu_panel_block_bytes(t), a,
                                     arow, m, ref + p * CPU_PANEL_ROWS, rows,
                                     with_bias ? bias + p * CPU_PANEL_ROWS : NULL);
            ck_assert_msg(!memcmp(out, ref, sizeof(float) * (size_t)(rows * m)), "%s %s%s n=%d%s: panel kernel != scalar",
                          kCfg[c].isa, kern_type_traits(t)->name, extreme ? " (extreme)" : "", m,
                          with_bias ? " +bias" : "");
          }
        b->ops->weight_release(b->ctx, &w);
        free(wd), free(x), free(bias), free(a);
        tested++;
      }
    }
    kern_backend_destroy(b);
  }
  if (!tested) fprintf(stderr, "skip: no table with panel kernels runs here\n");
}
END_TEST

#if defined(__x86_64__)
/* f to bf16 and back, round to nearest even (what the AMX path's
 * conversions do). */
static double bf16_round(float f) { return fr_bf16_to_fp32(fr_fp32_to_bf16(f)); }

/* K-quant prefill matmuls on AMX tiles (cpu_amx.c) against the f64 dot of
 * the weights as the reference dequantizer gives them and the activations,
 * both rounded to bf16: only the order of the f32 sums and the last bit of
 * a dequantized weight (the reference multiplies, then subtracts; the
 * tiles' unpacking fuses the two) may differ, so the bound is 2^-9 of the
 * sum of |w x|, while a weight in a wrong place costs O(|w x|) each. Panels
 * in pairs and one alone (48 rows), 32-row blocks, 16-row blocks and a
 * partial last one (64, 80, 81 activation rows), with and without bias;
 * and the same rows below the threshold take the panel kernels. */
START_TEST(test_matmul_amx) {
  if (!kern_cpu_isa_supported("avx512vnni") || !cpu__amx_usable()) {
    fprintf(stderr, "skip: AMX-BF16 not usable here\n");
    return;
  }
  static const kern_type_t types[] = {KERN_Q4_K, KERN_Q6_K};
  static const int ns[] = {64, 80, 81};
  const int rows = 48, cols = 768, nmax = 81;
  setenv("FERRUM_CPU_AMX_ROWS", "64", 1);
  kern_backend_t *b = backend_for(N_CFG - 1);
  unsetenv("FERRUM_CPU_AMX_ROWS");
  ck_assert_int_eq(((cpu_ctx_t *)b->ctx)->amx_rows, 64);
  for (size_t k = 0; k < FR_ARRAY_SIZE(types); k++) {
    const kern_type_t t = types[k];
    uint8_t *wd = random_weight(t, rows, cols);
    float *x = rnd_vec((size_t)nmax * cols), *bias = rnd_vec(rows), *wf = malloc(sizeof(float) * rows * cols);
    float *out = malloc(sizeof(float) * rows * nmax), *low = malloc(sizeof(float) * rows * 63);
    for (int r = 0; r < rows; r++)
      kern_dequantize_row(t, wd + (size_t)r * kern_row_bytes(t, cols), wf + (size_t)r * cols, cols);
    kern_weight_t w, wb;
    load_weight(b, &w, t, rows, cols, wd);
    load_weight(b, &wb, KERN_F32, 1, rows, bias);
    ck_assert_ptr_nonnull(w.priv);
    for (size_t ni = 0; ni < FR_ARRAY_SIZE(ns); ni++)
      for (int with_bias = 0; with_bias < 2; with_bias++) {
        const int n = ns[ni];
        poison(out, (size_t)rows * n);
        ck_assert_int_eq(b->ops->matmul(b->ctx, out, &w, with_bias ? &wb : NULL, x, n), 0);
        for (int j = 0; j < n; j++)
          for (int r = 0; r < rows; r++) {
            double ref = with_bias ? bias[r] : 0.0, mag = 0.0;
            for (int c = 0; c < cols; c++) {
              const double p = bf16_round(wf[(size_t)r * cols + c]) * bf16_round(x[(size_t)j * cols + c]);
              ref += p, mag += fabs(p);
            }
            const double got = out[(size_t)j * rows + r];
            ck_assert_msg(fabs(got - ref) <= mag / 512.0 + 1e-6, "%s n=%d%s row %d col %d: %g against %g (sum |wx| %g)",
                          kern_type_traits(t)->name, n, with_bias ? " +bias" : "", j, r, got, ref, mag);
          }
      }
    /* 63 rows: the panel kernels, not the tiles (their bits: test_matmul_panels_exact) */
    ck_assert_int_eq(b->ops->matmul(b->ctx, low, &w, NULL, x, 63), 0);
    ck_assert_int_eq(b->ops->matmul(b->ctx, out, &w, NULL, x, 64), 0);
    int differ = 0;
    for (int i = 0; i < rows * 63; i++) differ += low[i] != out[i];
    ck_assert_msg(differ > 0, "%s: 63 and 64 rows gave the same bits: the tiles did not run",
                  kern_type_traits(t)->name);
    b->ops->weight_release(b->ctx, &w);
    b->ops->weight_release(b->ctx, &wb);
    free(wd), free(x), free(bias), free(wf), free(out), free(low);
  }
  kern_backend_destroy(b);
}
END_TEST

/* The x86 kernel tables, by name. */
static const struct {
  const char *name;
  const cpu_isa_t *isa;
} kX86Tables[] = {{"avx2", &cpu_isa_avx2}, {"avx512", &cpu_isa_avx512}, {"avx512vnni", &cpu_isa_avx512vnni}};

/* The attention block kernels (scores_f16, pv_f16) of every x86 table this
 * CPU runs give the bits of the per-row dot_f16 / axpy_f16 calls they
 * replace: head sizes on and off their fast paths, 1 to 16 rows. */
START_TEST(test_attention_block_kernels_exact) {
  static const int hds[] = {64, 128, 80, 96, 256, 40};
  enum { MAX_HD = 256, KV_HEADS = 3, ROWS = 16 };
  uint16_t *kv = malloc(sizeof(uint16_t) * ROWS * KV_HEADS * MAX_HD);
  float q[MAX_HD], w[ROWS], s1[ROWS], s2[ROWS], a1[MAX_HD], a2[MAX_HD];
  int tested = 0;
  for (size_t t = 0; t < FR_ARRAY_SIZE(kX86Tables); t++) {
    const cpu_isa_t *isa = kX86Tables[t].isa;
    if (!kern_cpu_isa_supported(kX86Tables[t].name) || !isa->scores_f16 || !isa->pv_f16) continue;
    for (size_t h = 0; h < FR_ARRAY_SIZE(hds); h++)
      for (int n = 1; n <= ROWS; n += 5) {
        const int hd = hds[h];
        const size_t stride = (size_t)KV_HEADS * (size_t)hd;
        for (size_t i = 0; i < (size_t)ROWS * stride; i++) kv[i] = fr_fp32_to_fp16(rnd_f());
        for (int d = 0; d < hd; d++) q[d] = rnd_f(), a1[d] = a2[d] = rnd_f();
        for (int o = 0; o < n; o++) w[o] = rnd_f();
        isa->scores_f16(hd, kv + hd, stride, n, q, 0.125f, s1);
        for (int o = 0; o < n; o++) s2[o] = 0.125f * isa->dot_f16(hd, kv + hd + (size_t)o * stride, q);
        ck_assert_msg(!memcmp(s1, s2, sizeof(float) * (size_t)n), "%s scores_f16 hd %d n %d", kX86Tables[t].name, hd,
                      n);
        isa->pv_f16(hd, w, 0.37f, kv + hd, stride, n, a1);
        for (int o = 0; o < n; o++)
          isa->axpy_f16(hd, fr_fp16_to_fp32(fr_fp32_to_fp16(w[o] * 0.37f)), kv + hd + (size_t)o * stride, a2);
        ck_assert_msg(!memcmp(a1, a2, sizeof(float) * (size_t)hd), "%s pv_f16 hd %d n %d", kX86Tables[t].name, hd,
                      n);
        tested++;
      }
  }
  free(kv);
  if (!tested) fprintf(stderr, "skip: no x86 table with attention block kernels runs here\n");
}
END_TEST

static uint32_t f32_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

static float f32_of(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

/* The first i < n where got and want differ in bits, or -1. */
static int first_bits_diff(const float *got, const float *want, int n) {
  for (int i = 0; i < n; i++)
    if (f32_bits(got[i]) != f32_bits(want[i])) return i;
  return -1;
}

/* Checks one table's exp_shift (shift m, divisor t; in place when t is 1)
 * and silu_mul against libm's expf on the n floats in x, bit for bit; u:
 * silu's up factors. (One assertion per call: Check reports every passing
 * one to its parent.) */
static void check_expf_bits(const char *name, const cpu_isa_t *isa, const float *x, int n, float m, float t,
                            const float *u, float *got, float *want) {
  memcpy(got, x, sizeof(float) * (size_t)n);
  if (t == 1.0f) isa->exp_shift(n, got, m, t, got);
  else isa->exp_shift(n, x, m, t, got);
  for (int i = 0; i < n; i++) want[i] = t == 1.0f ? expf(x[i] - m) : expf((x[i] - m) / t);
  int i = first_bits_diff(got, want, n);
  ck_assert_msg(i < 0, "%s exp_shift((%a - %a) / %a) = %a, expf %a", name, (double)x[i < 0 ? 0 : i], (double)m,
                (double)t, (double)got[i < 0 ? 0 : i], (double)want[i < 0 ? 0 : i]);
  isa->silu_mul(n, x, u, got);
  for (i = 0; i < n; i++) want[i] = x[i] / (1.0f + expf(-x[i])) * u[i];
  i = first_bits_diff(got, want, n);
  ck_assert_msg(i < 0, "%s silu_mul(%a, %a) = %a, want %a", name, (double)x[i < 0 ? 0 : i], (double)u[i < 0 ? 0 : i],
                (double)got[i < 0 ? 0 : i], (double)want[i < 0 ? 0 : i]);
}

/* Every x86 table's exp_shift and silu_mul give libm's expf bits (the
 * scalar table calls it): the float bit patterns i * 255 + 7 (2^24 of them,
 * every exponent and sign, NaNs and infinities) and 2^13 consecutive floats
 * around each bound of glibc's special cases and around 0; with shift 0 and
 * a shift that makes x - m round, and divided by a temperature (the
 * sampler's form, also through kern_cpu_expf_shift). Odd lengths reach
 * the vector tails. FERRUM_TEST_EXPF_ALL=1: all 2^32 floats. */
START_TEST(test_expf_libm_bits) {
  enum { CHUNK = 1 << 16, NEAR = 1 << 12 };
  static const float bounds[] = {0.0f, 88.0f, 0x1.62e42ep6f, -0x1.9fe368p6f, -0x1.9d1d9ep6f, -88.0f, 0x1p-126f};
  const bool all = getenv("FERRUM_TEST_EXPF_ALL") && !strcmp(getenv("FERRUM_TEST_EXPF_ALL"), "1");
  const uint64_t step = all ? 1 : 255;
  float *x = malloc(sizeof(float) * CHUNK * 4), *u = x + CHUNK, *got = u + CHUNK, *want = got + CHUNK;
  for (int i = 0; i < CHUNK; i++) u[i] = rnd_f() * 4.0f;
  int tested = 0;
  for (size_t t = 0; t < FR_ARRAY_SIZE(kX86Tables); t++) {
    const cpu_isa_t *isa = kX86Tables[t].isa;
    if (!kern_cpu_isa_supported(kX86Tables[t].name)) continue;
    for (uint64_t b = 7; b < (1ull << 32);) {
      int n = 0;
      for (; n < CHUNK - 3 && b < (1ull << 32); b += step) x[n++] = f32_of((uint32_t)b);
      check_expf_bits(kX86Tables[t].name, isa, x, n, 0.0f, 1.0f, u, got, want);
    }
    for (size_t k = 0; k < FR_ARRAY_SIZE(bounds); k++) {
      for (int s = 0; s < 2; s++) { /* each bound and its negative */
        const uint32_t c = f32_bits(s ? -bounds[k] : bounds[k]);
        for (int i = 0; i < 2 * NEAR + 1; i++) x[i] = f32_of(c - NEAR + (uint32_t)i);
        check_expf_bits(kX86Tables[t].name, isa, x, 2 * NEAR + 1, 0.0f, 1.0f, u, got, want);
      }
    }
    for (int i = 0; i < CHUNK - 5; i++) x[i] = rnd_f() * 40.0f;
    check_expf_bits(kX86Tables[t].name, isa, x, CHUNK - 5, 7.3f, 1.0f, u, got, want);
    check_expf_bits(kX86Tables[t].name, isa, x, CHUNK - 5, 7.3f, 0.7f, u, got, want);
    check_expf_bits(kX86Tables[t].name, isa, x, CHUNK - 5, -2.0f, 1.6f, u, got, want);
    tested++;
  }
  kern_cpu_expf_shift(CHUNK - 5, x, 7.3f, 0.7f, got);
  for (int i = 0; i < CHUNK - 5; i++) want[i] = expf((x[i] - 7.3f) / 0.7f);
  ck_assert_msg(first_bits_diff(got, want, CHUNK - 5) < 0, "kern_cpu_expf_shift != expf");
  free(x);
  if (!tested) fprintf(stderr, "skip: no x86 table runs here\n");
}
END_TEST
#endif

/* The AVX-512 K-quant dots compute the AVX2 ones' exact integer sums and the
 * same float expression per super-block: the same bits, 1 and 11 rows. */
START_TEST(test_matmul_kquant_avx512_exact) {
  if (!kern_cpu_isa_supported("avx512")) {
    fprintf(stderr, "skip: avx512 not supported here\n");
    return;
  }
  kern_backend_t *a = backend_for(2), *v = backend_for(4);
  static const kern_type_t types[] = {KERN_Q4_K, KERN_Q5_K, KERN_Q6_K};
  const int rows = 21, cols = 1024, n = 11;
  for (size_t k = 0; k < FR_ARRAY_SIZE(types); k++) {
    uint8_t *wd = random_weight(types[k], rows, cols);
    float *x = rnd_vec((size_t)n * cols), o1[21 * 11], o2[21 * 11];
    kern_weight_t w1, w2;
    load_weight(a, &w1, types[k], rows, cols, wd);
    load_weight(v, &w2, types[k], rows, cols, wd);
    for (int m = 1; m <= n; m += n - 1) {
      ck_assert_int_eq(a->ops->matmul(a->ctx, o1, &w1, NULL, x, m), 0);
      ck_assert_int_eq(v->ops->matmul(v->ctx, o2, &w2, NULL, x, m), 0);
      ck_assert_msg(!memcmp(o1, o2, sizeof(float) * (size_t)(rows * m)), "%s n=%d: avx512 != avx2",
                    kern_type_traits(types[k])->name, m);
    }
    a->ops->weight_release(a->ctx, &w1);
    v->ops->weight_release(v->ctx, &w2);
    free(wd), free(x);
  }
  kern_backend_destroy(a);
  kern_backend_destroy(v);
}
END_TEST

#if defined(__x86_64__)
/* Every x86 table's Q8_K activation quantizer gives cpu__quantize_q8_K's
 * bytes: random blocks, the largest magnitude repeated with both signs
 * (the first one sets the scale's sign), values on rounding ties, a block
 * of zeros, NaNs (ignored for the scale) and subnormals. */
START_TEST(test_quantize_q8_K_exact) {
  enum { NB = 8 };
  float x[NB * CPU_QK_K];
  cpu_block_q8_K ref[NB], got[NB];
  int tested = 0;
  for (size_t t = 0; t < FR_ARRAY_SIZE(kX86Tables); t++) {
    if (!kern_cpu_isa_supported(kX86Tables[t].name)) continue;
    for (int round = 0; round < 20; round++) {
      for (int i = 0; i < NB * CPU_QK_K; i++) x[i] = 4.0f * rnd_f();
      float *b = x + CPU_QK_K; /* block 1: the largest magnitude four times, first negative */
      b[17] = -7.5f, b[40] = 7.5f, b[200] = -7.5f, b[255] = 7.5f;
      b = x + 2 * CPU_QK_K; /* block 2: halves after scaling by -127 / -127 (ties) */
      for (int i = 0; i < CPU_QK_K; i++) b[i] = (float)((i % 200) - 100) + (i % 2 ? 0.5f : -0.5f);
      b[3] = -127.0f;
      memset(x + 3 * CPU_QK_K, 0, sizeof(float) * CPU_QK_K); /* block 3: zeros */
      b = x + 4 * CPU_QK_K; /* block 4: NaNs */
      b[0] = NAN, b[9] = NAN, b[100] = -NAN;
      b = x + 5 * CPU_QK_K; /* block 5: subnormals only */
      for (int i = 0; i < CPU_QK_K; i++) b[i] = rnd_f() * 1e-39f;
      x[6 * CPU_QK_K + round] = 9.0f; /* block 6: the maximum at a different place each round */
      memset(ref, 0x55, sizeof ref), memset(got, 0xAA, sizeof got);
      cpu__quantize_q8_K(x, ref, NB * CPU_QK_K);
      kX86Tables[t].isa->quantize[KERN_Q8_K](x, got, NB * CPU_QK_K);
      for (int i = 0; i < NB; i++)
        ck_assert_msg(!memcmp(&ref[i], &got[i], sizeof ref[i]), "%s quantize_q8_K block %d round %d",
                      kX86Tables[t].name, i, round);
    }
    tested++;
  }
  if (!tested) fprintf(stderr, "skip: no x86 table runs here\n");
}
END_TEST
#endif

/* A weight with an input permutation (GPTQ act-order): column k multiplies
 * x[perm[k]], as the reference computes it, on every path. */
START_TEST(test_matmul_perm) {
  kern_backend_t *b = backend_for(_i);
  if (!b) return;
  const int rows = 40, cols = 256, n = 6;
  int32_t perm[256];
  for (int k = 0; k < cols; k++) perm[k] = k;
  for (int k = cols - 1; k > 0; k--) { /* Fisher-Yates */
    int j = (int)(rnd_u64() % (uint64_t)(k + 1)), t = perm[k];
    perm[k] = perm[j], perm[j] = t;
  }
  uint8_t *wd = random_weight(KERN_I4G, rows, cols);
  float *x = rnd_vec((size_t)n * cols), out[40 * 6], wf[256];
  kern_weight_t w;
  load_weight(b, &w, KERN_I4G, rows, cols, wd);
  w.perm = perm;
  double ref[40 * 6];
  for (int r = 0; r < rows; r++) {
    kern_dequantize_row(KERN_I4G, wd + (size_t)r * w.row_bytes, wf, cols);
    for (int j = 0; j < n; j++) {
      double s = 0;
      for (int k = 0; k < cols; k++) s += (double)wf[k] * x[(size_t)j * cols + (size_t)perm[k]];
      ref[j * rows + r] = s;
    }
  }
  ck_assert_int_eq(b->ops->matmul(b->ctx, out, &w, NULL, x, n), 0);
  double e = nerr(out, ref, (size_t)rows * n);
  ck_assert_msg(e < 1e-5, "permuted I4G matmul: normalized error %g", e);
  w.perm = NULL;
  b->ops->weight_release(b->ctx, &w);
  free(wd), free(x);
  kern_backend_destroy(b);
}
END_TEST

/* A rank's part of an act-order weight (model_quant_cols): 256 columns
 * take 200 inputs in a random order, and the 56 padding columns (perm -1,
 * random nonzero weights here) must add nothing; x is (n, 200). */
START_TEST(test_matmul_perm_padded) {
  kern_backend_t *b = backend_for(_i);
  if (!b) return;
  ck_assert(b->padded_perm);
  enum { rows = 40, cols = 256, x_cols = 200, n = 6 };
  int32_t perm[cols];
  for (int k = 0; k < cols; k++) perm[k] = k < x_cols ? k : -1;
  for (int k = cols - 1; k > 0; k--) { /* Fisher-Yates: inputs and padding at random places */
    int j = (int)(rnd_u64() % (uint64_t)(k + 1)), t = perm[k];
    perm[k] = perm[j], perm[j] = t;
  }
  uint8_t *wd = random_weight(KERN_I4G, rows, cols);
  float *x = rnd_vec((size_t)n * x_cols), out[rows * n], wf[cols];
  kern_weight_t w;
  load_weight(b, &w, KERN_I4G, rows, cols, wd);
  w.perm = perm;
  w.x_cols = x_cols;
  double ref[rows * n];
  for (int r = 0; r < rows; r++) {
    kern_dequantize_row(KERN_I4G, wd + (size_t)r * w.row_bytes, wf, cols);
    for (int j = 0; j < n; j++) {
      double sum = 0;
      for (int k = 0; k < cols; k++)
        if (perm[k] >= 0) sum += (double)wf[k] * x[(size_t)j * x_cols + (size_t)perm[k]];
      ref[j * rows + r] = sum;
    }
  }
  ck_assert_int_eq(b->ops->matmul(b->ctx, out, &w, NULL, x, n), 0);
  double e = nerr(out, ref, (size_t)rows * n);
  ck_assert_msg(e < 1e-5, "padded permuted I4G matmul: normalized error %g", e);
  w.x_cols = cols + 1; /* wider than the weight */
  ck_assert_int_lt(b->ops->matmul(b->ctx, out, &w, NULL, x, n), 0);
  w.x_cols = x_cols;
  w.perm = NULL; /* x_cols without a permutation */
  ck_assert_int_lt(b->ops->matmul(b->ctx, out, &w, NULL, x, n), 0);
  b->ops->weight_release(b->ctx, &w);
  free(wd), free(x);
  kern_backend_destroy(b);
}
END_TEST

START_TEST(test_matmul_errors) {
  kern_backend_t *b = backend_for(0);
  float x[64] = {0}, out[64];
  kern_weight_t w = {.type = KERN_Q4_K, .rows = 2, .cols = 64, .row_bytes = 0, .data = x};
  ck_assert_int_lt(b->ops->matmul(b->ctx, out, &w, NULL, x, 1), 0); /* 64 not a multiple of 256 */
  w.type = KERN_Q8_K; /* activation-side type */
  ck_assert_int_lt(b->ops->matmul(b->ctx, out, &w, NULL, x, 1), 0);
  kern_weight_t bad = {.type = (kern_type_t)4, .rows = 1, .cols = 32, .row_bytes = 18};
  ck_assert_int_lt(b->ops->weight_load(b->ctx, &bad, x), 0);
  ck_assert(!b->ops->supports_type(b->ctx, KERN_Q8_1));
  ck_assert(b->ops->supports_type(b->ctx, KERN_Q6_K));
  kern_backend_destroy(b);
}
END_TEST

/* ---- step helpers ---- */

typedef struct {
  int32_t tokens[256], positions[256], slots[256], q_start[17], ctx_len[16], bt[16 * 8];
  int n_tokens, n_seqs, max_blocks;
} step_buf_t;

static kern_step_t step_of(const step_buf_t *s) {
  return (kern_step_t){.n_tokens = s->n_tokens, .tokens = s->tokens, .n_seqs = s->n_seqs, .positions = s->positions,
                       .slots = s->slots, .q_start = s->q_start, .ctx_len = s->ctx_len,
                       .block_tables = s->bt, .max_blocks = s->max_blocks};
}

/* One sequence of n tokens at positions 0..n-1 (no KV). */
static void begin_simple(kern_backend_t *b, step_buf_t *s, int n) {
  memset(s, 0, sizeof *s);
  s->n_tokens = n;
  s->n_seqs = 1;
  s->q_start[1] = n;
  for (int i = 0; i < n; i++) s->slots[i] = -1;
  kern_step_t st = step_of(s);
  ck_assert_int_eq(b->ops->step_begin(b->ctx, &st), 0);
}

/* ---- norms, silu, add, last_rows, embed ---- */

static void ref_norm(double *o, const float *x, const float *w, int dim, float eps) {
  double ss = 0;
  for (int i = 0; i < dim; i++) ss += (double)x[i] * x[i];
  double sc = 1.0 / sqrt(ss / dim + eps);
  for (int i = 0; i < dim; i++) o[i] = x[i] * sc * w[i];
}

START_TEST(test_norms) {
  kern_backend_t *b = backend_for(_i);
  if (!b) return;
  const int n = 64, dim = 576;
  const size_t nd = (size_t)n * dim;
  float *x = rnd_vec(nd), *res = rnd_vec(nd), *wv = rnd_vec(dim), *out = malloc(nd * 4), *res0 = malloc(nd * 4);
  double *ref = malloc(nd * sizeof(double));
  for (size_t i = 0; i < nd; i++) x[i] *= 3.0f;
  kern_weight_t w;
  load_weight(b, &w, KERN_F32, 1, dim, wv);
  for (int r = 0; r < n; r++) ref_norm(ref + (size_t)r * dim, x + (size_t)r * dim, wv, dim, 1e-5f);
  poison(out, nd);
  ck_assert_int_eq(b->ops->rms_norm(b->ctx, out, x, &w, n, dim, 1e-5f), 0);
  ck_assert(nerr(out, ref, nd) < 1e-6);
  /* in place */
  memcpy(out, x, nd * 4);
  ck_assert_int_eq(b->ops->rms_norm(b->ctx, out, out, &w, n, dim, 1e-5f), 0);
  ck_assert(nerr(out, ref, nd) < 1e-6);
  /* add_rms_norm with out == x, as the layer stack calls it */
  memcpy(res0, res, nd * 4);
  memcpy(out, x, nd * 4);
  for (size_t i = 0; i < nd; i++) res0[i] += x[i];
  for (int r = 0; r < n; r++) ref_norm(ref + (size_t)r * dim, res0 + (size_t)r * dim, wv, dim, 1e-5f);
  ck_assert_int_eq(b->ops->add_rms_norm(b->ctx, out, res, out, &w, n, dim, 1e-5f), 0);
  ck_assert(nerr(out, ref, nd) < 1e-6);
  for (size_t i = 0; i < nd; i++) ck_assert_float_eq(res[i], res0[i]);
  kern_weight_t bad = w;
  bad.cols = dim + 1;
  ck_assert_int_lt(b->ops->rms_norm(b->ctx, out, x, &bad, n, dim, 1e-5f), 0);
  free(x), free(res), free(wv), free(out), free(res0), free(ref);
  kern_backend_destroy(b);
}
END_TEST

START_TEST(test_elementwise) {
  kern_backend_t *b = backend_for(_i);
  if (!b) return;
  const int n = 40, d = 1000, stride = 2 * d;
  float *gu = rnd_vec((size_t)n * stride), *out = malloc(sizeof(float) * (size_t)n * d);
  double *ref = malloc(sizeof(double) * (size_t)n * d);
  for (size_t i = 0; i < (size_t)n * stride; i++) gu[i] *= 6.0f;
  for (int r = 0; r < n; r++)
    for (int k = 0; k < d; k++) {
      double g = gu[(size_t)r * stride + k], u = gu[(size_t)r * stride + d + k];
      ref[(size_t)r * d + k] = g / (1.0 + exp(-g)) * u;
    }
  poison(out, (size_t)n * d);
  ck_assert_int_eq(b->ops->silu_mul(b->ctx, out, gu, gu + d, n, d, stride), 0);
  ck_assert(nerr(out, ref, (size_t)n * d) < 1e-6);
  /* in place on the gate half of a packed (n, d) pair */
  float *g2 = rnd_vec((size_t)n * d), *u2 = rnd_vec((size_t)n * d);
  for (size_t i = 0; i < (size_t)n * d; i++) ref[i] = g2[i] / (1.0 + exp(-(double)g2[i])) * u2[i];
  ck_assert_int_eq(b->ops->silu_mul(b->ctx, g2, g2, u2, n, d, d), 0);
  ck_assert(nerr(g2, ref, (size_t)n * d) < 1e-6);
  /* add */
  float *a = rnd_vec(1001), *c = rnd_vec(1001), o[1001];
  double r2[1001];
  for (int i = 0; i < 1001; i++) r2[i] = (double)a[i] + c[i];
  poison(o, 1001);
  ck_assert_int_eq(b->ops->add(b->ctx, o, a, c, 1001), 0);
  ck_assert(nerr(o, r2, 1001) < 1e-7);
  free(gu), free(out), free(ref), free(g2), free(u2), free(a), free(c);
  kern_backend_destroy(b);
}
END_TEST

START_TEST(test_last_rows_embed) {
  kern_backend_t *b = backend_for(_i);
  if (!b) return;
  step_buf_t s;
  memset(&s, 0, sizeof s);
  s.n_tokens = 8;
  s.n_seqs = 3;
  int32_t qs[4] = {0, 3, 4, 8}, toks[8] = {5, 0, 63, 5, 17, 1, 2, 62};
  memcpy(s.q_start, qs, sizeof qs);
  memcpy(s.tokens, toks, sizeof toks);
  for (int i = 0; i < 3; i++) s.ctx_len[i] = qs[i + 1] - qs[i];
  s.max_blocks = 1;
  for (int i = 0; i < 8; i++) s.slots[i] = -1;
  kern_step_t st = step_of(&s);
  ck_assert_int_eq(b->ops->step_begin(b->ctx, &st), 0);
  const int dim = 64;
  float *x = rnd_vec(8 * dim), out[3 * 64];
  poison(out, 3 * 64);
  ck_assert_int_eq(b->ops->last_rows(b->ctx, out, x, dim), 0);
  ck_assert(!memcmp(out, x + 2 * dim, dim * 4) && !memcmp(out + dim, x + 3 * dim, dim * 4) &&
            !memcmp(out + 2 * dim, x + 7 * dim, dim * 4));
  kern_type_t types[] = {KERN_Q4_1, KERN_F16, KERN_Q8_0, KERN_Q6_K, KERN_F32};
  for (int k = 0; k < 5; k++) {
    int cols = types[k] == KERN_Q6_K ? 256 : dim;
    uint8_t *tab = random_weight(types[k], 64, cols);
    kern_weight_t w;
    load_weight_as(b, &w, types[k], 64, cols, tab, true); /* an embedding table */
    float *e = malloc(sizeof(float) * 8 * cols), *row = malloc(sizeof(float) * cols);
    poison(e, (size_t)8 * cols);
    ck_assert_int_eq(b->ops->embed(b->ctx, e, &w), 0);
    for (int t = 0; t < 8; t++) {
      kern_dequantize_row(types[k], tab + (size_t)toks[t] * w.row_bytes, row, cols);
      ck_assert(!memcmp(row, e + (size_t)t * cols, sizeof(float) * cols));
    }
    w.rows = 63; /* token 63 is now out of range */
    ck_assert_int_lt(b->ops->embed(b->ctx, e, &w), 0);
    b->ops->weight_release(b->ctx, &w);
    free(tab), free(e), free(row);
  }
  free(x);
  kern_backend_destroy(b);
}
END_TEST

/* ---- rope ---- */

/* llama3-style inverse frequencies (base 500000, factor 8, low 1, high 4, L 8192). */
static void llama3_inv_freq(float *inv, int n_rot) {
  const double base = 500000, factor = 8, lo = 1, hi = 4, L = 8192;
  for (int i = 0; i < n_rot / 2; i++) {
    double f = pow(base, -2.0 * i / n_rot), lambda = 2 * M_PI / f;
    if (lambda < L / hi) inv[i] = (float)f;
    else if (lambda > L / lo) inv[i] = (float)(f / factor);
    else {
      double s = (L / lambda - lo) / (hi - lo);
      inv[i] = (float)((1 - s) * f / factor + s * f);
    }
  }
}

static void check_rope(kern_backend_t *b, kern_rope_mode_t mode, int n_rot) {
  const int nt = 48, nh = 12, hd = 64, stride = nh * hd + 16;
  step_buf_t s;
  begin_simple(b, &s, nt);
  for (int t = 0; t < nt; t++) s.positions[t] = (int32_t)(rnd_u64() % 9000);
  kern_step_t st = step_of(&s);
  ck_assert_int_eq(b->ops->step_begin(b->ctx, &st), 0);
  float inv[64];
  llama3_inv_freq(inv, n_rot);
  kern_weight_t wf;
  load_weight(b, &wf, KERN_F32, 1, n_rot / 2, inv);
  kern_rope_t rope = {.mode = mode, .n_rot = n_rot, .inv_freq = &wf, .attn_factor = 1.0f};
  float *x = rnd_vec((size_t)nt * stride), *x0 = malloc(sizeof(float) * (size_t)nt * stride);
  double *ref = malloc(sizeof(double) * (size_t)nt * stride);
  memcpy(x0, x, sizeof(float) * (size_t)nt * stride);
  for (size_t i = 0; i < (size_t)nt * stride; i++) ref[i] = x0[i];
  for (int t = 0; t < nt; t++)
    for (int h = 0; h < nh; h++) {
      size_t base = (size_t)t * stride + (size_t)h * hd;
      for (int i = 0; i < n_rot / 2; i++) {
        size_t a = base + (mode == KERN_ROPE_NORM ? 2 * i : i), c = a + (mode == KERN_ROPE_NORM ? 1 : n_rot / 2);
        double th = (double)s.positions[t] * inv[i];
        ref[a] = x0[a] * cos(th) - x0[c] * sin(th);
        ref[c] = x0[a] * sin(th) + x0[c] * cos(th);
      }
    }
  ck_assert_int_eq(b->ops->rope(b->ctx, x, nh, hd, stride, &rope), 0);
  double e = nerr(x, ref, (size_t)nt * stride);
  /* theta may be formed in f32 as ggml does: ~1e-5 at positions near 9000 */
  ck_assert_msg(e < 1e-4, "rope mode %d n_rot %d: error %g", mode, n_rot, e);
  /* padding past the heads is untouched */
  for (int t = 0; t < nt; t++)
    ck_assert(!memcmp(x + (size_t)t * stride + nh * hd, x0 + (size_t)t * stride + nh * hd, 16 * 4));
  free(x), free(x0), free(ref);
}

START_TEST(test_rope) {
  kern_backend_t *b = backend_for(_i);
  if (!b) return;
  check_rope(b, KERN_ROPE_NORM, 64);
  check_rope(b, KERN_ROPE_NEOX, 64);
  check_rope(b, KERN_ROPE_NORM, 32); /* partial rotary */
  check_rope(b, KERN_ROPE_NEOX, 32);
  kern_backend_destroy(b);
}
END_TEST

/* ---- KV pool: append, copy, attention ---- */

static float kv_get(const kern_kv_pool_t *p, int layer, int is_v, long slot, int e) {
  size_t kvd = (size_t)p->cfg.n_kv_heads * p->cfg.head_dim;
  const uint8_t *base = (const uint8_t *)p->base + (2 * (size_t)layer + (size_t)is_v) * p->layer_bytes;
  size_t idx = (size_t)slot * kvd + (size_t)e;
  if (p->cfg.type == KERN_F32) return ((const float *)base)[idx];
  return fr_fp16_to_fp32(((const uint16_t *)base)[idx]);
}

static void kv_set(kern_kv_pool_t *p, int layer, int is_v, long slot, int e, float v) {
  size_t kvd = (size_t)p->cfg.n_kv_heads * p->cfg.head_dim;
  uint8_t *base = (uint8_t *)p->base + (2 * (size_t)layer + (size_t)is_v) * p->layer_bytes;
  size_t idx = (size_t)slot * kvd + (size_t)e;
  if (p->cfg.type == KERN_F32) ((float *)base)[idx] = v;
  else ((uint16_t *)base)[idx] = fr_fp32_to_fp16(v);
}

static float stored(kern_type_t t, float v) { return t == KERN_F16 ? fr_fp16_to_fp32(fr_fp32_to_fp16(v)) : v; }

START_TEST(test_kv_append_copy) {
  kern_backend_t *b = backend_for(_i);
  if (!b) return;
  for (int ty = 0; ty < 2; ty++) {
    kern_kv_config_t cfg = {.n_layers = 2, .n_kv_heads = 3, .head_dim = 40, .block_size = 8, .n_blocks = 10,
                            .type = ty ? KERN_F16 : KERN_F32};
    kern_kv_pool_t pool;
    ck_assert_int_eq(b->ops->kv_pool_init(b->ctx, &pool, &cfg, NULL), 0);
    ck_assert_uint_eq(pool.layer_bytes * 4, kern_kv_pool_bytes(&cfg));
    const int nt = 12, kvd = 120, ks = kvd + 5, vs = kvd + 3;
    step_buf_t s;
    begin_simple(b, &s, nt);
    int32_t slots[12] = {17, 3, -1, 79, 0, 42, 43, 44, -1, 8, 9, 65};
    memcpy(s.slots, slots, sizeof slots);
    kern_step_t st = step_of(&s);
    ck_assert_int_eq(b->ops->step_begin(b->ctx, &st), 0);
    float *k = rnd_vec((size_t)nt * ks), *v = rnd_vec((size_t)nt * vs);
    ck_assert_int_eq(b->ops->kv_append(b->ctx, &pool, 1, k, ks, v, vs), 0);
    for (long slot = 0; slot < 80; slot++) {
      int t = -1;
      for (int i = 0; i < nt; i++)
        if (slots[i] == slot) t = i;
      for (int e = 0; e < kvd; e++) {
        ck_assert_float_eq(kv_get(&pool, 0, 0, slot, e), 0.0f);
        ck_assert_float_eq(kv_get(&pool, 0, 1, slot, e), 0.0f);
        ck_assert_float_eq(kv_get(&pool, 1, 0, slot, e), t < 0 ? 0.0f : stored(cfg.type, k[t * ks + e]));
        ck_assert_float_eq(kv_get(&pool, 1, 1, slot, e), t < 0 ? 0.0f : stored(cfg.type, v[t * vs + e]));
      }
    }
    /* a slot past the pool is an error, and nothing is written */
    s.slots[4] = 80;
    st = step_of(&s);
    ck_assert_int_eq(b->ops->step_begin(b->ctx, &st), 0);
    float before = kv_get(&pool, 0, 0, 17, 0);
    ck_assert_int_lt(b->ops->kv_append(b->ctx, &pool, 0, k, ks, v, vs), 0);
    ck_assert_float_eq(kv_get(&pool, 0, 0, 17, 0), before);
    ck_assert_int_lt(b->ops->kv_append(b->ctx, &pool, 2, k, ks, v, vs), 0); /* bad layer */
    /* copy block 5 (slots 40..47) to block 1 (slots 8..15) */
    int32_t pairs[2] = {5, 1};
    ck_assert_int_eq(b->ops->kv_copy_blocks(b->ctx, &pool, pairs, 1), 0);
    for (int o = 0; o < 8; o++)
      for (int e = 0; e < kvd; e++)
        for (int isv = 0; isv < 2; isv++)
          ck_assert_float_eq(kv_get(&pool, 1, isv, 8 + o, e), kv_get(&pool, 1, isv, 40 + o, e));
    int32_t bad[2] = {5, 10};
    ck_assert_int_lt(b->ops->kv_copy_blocks(b->ctx, &pool, bad, 1), 0);
    b->ops->kv_pool_deinit(b->ctx, &pool);
    free(k), free(v);
  }
  /* external memory is adopted and zeroed, not freed */
  kern_kv_config_t cfg = {.n_layers = 1, .n_kv_heads = 1, .head_dim = 8, .block_size = 4, .n_blocks = 2,
                          .type = KERN_F32};
  size_t nb = kern_kv_pool_bytes(&cfg);
  uint8_t *ext = malloc(nb);
  memset(ext, 0xAB, nb);
  kern_kv_pool_t pool;
  ck_assert_int_eq(b->ops->kv_pool_init(b->ctx, &pool, &cfg, ext), 0);
  ck_assert_ptr_eq(pool.base, ext);
  ck_assert(pool.external);
  for (size_t i = 0; i < nb; i++) ck_assert_int_eq(ext[i], 0);
  b->ops->kv_pool_deinit(b->ctx, &pool);
  free(ext);
  kern_backend_destroy(b);
}
END_TEST

/* Sequences of one attention step: new tokens and context after the step. */
static const struct {
  int n_q, ctx;
} kSeqs[] = {{1, 37}, {7, 27}, {9, 9}, {1, 0}, {3, 48}, {2, 2}};
#define N_SEQS ((int)(sizeof kSeqs / sizeof kSeqs[0]))

/* window: keys a query sees (itself included), 0 all. */
static void check_attention(kern_backend_t *b, kern_type_t kv_type, int hd, int window) {
  const int nh = 6, nkv = 2, bs = 16, layer = 1, max_blocks = 4;
  kern_kv_config_t cfg = {.n_layers = 2, .n_kv_heads = nkv, .head_dim = hd, .block_size = bs, .n_blocks = 40,
                          .type = kv_type};
  kern_kv_pool_t pool;
  ck_assert_int_eq(b->ops->kv_pool_init(b->ctx, &pool, &cfg, NULL), 0);
  /* random distinct physical blocks */
  int perm[40];
  for (int i = 0; i < 40; i++) perm[i] = i;
  for (int i = 39; i > 0; i--) {
    int j = (int)(rnd_u64() % (uint64_t)(i + 1)), t = perm[i];
    perm[i] = perm[j], perm[j] = t;
  }
  step_buf_t s;
  memset(&s, 0, sizeof s);
  s.n_seqs = N_SEQS;
  s.max_blocks = max_blocks;
  int used = 0;
  for (int q = 0; q < N_SEQS; q++) {
    s.q_start[q + 1] = s.q_start[q] + kSeqs[q].n_q;
    s.ctx_len[q] = kSeqs[q].ctx;
    for (int k = 0; k < max_blocks; k++) s.bt[q * max_blocks + k] = k * bs < kSeqs[q].ctx ? perm[used++] : -1;
  }
  s.n_tokens = s.q_start[N_SEQS];
  for (int t = 0; t < s.n_tokens; t++) s.slots[t] = -1;
  kern_step_t st = step_of(&s);
  ck_assert_int_eq(b->ops->step_begin(b->ctx, &st), 0);
  /* K/V of every context position, as stored (rounded to the pool type); layer 0 gets other values */
  const int kvd = nkv * hd;
  double *K = malloc(sizeof(double) * N_SEQS * 64 * kvd), *V = malloc(sizeof(double) * N_SEQS * 64 * kvd);
  for (int q = 0; q < N_SEQS; q++)
    for (int p = 0; p < kSeqs[q].ctx; p++) {
      long slot = (long)s.bt[q * max_blocks + p / bs] * bs + p % bs;
      for (int e = 0; e < kvd; e++) {
        float kv = 2 * rnd_f(), vv = rnd_f();
        K[((size_t)q * 64 + p) * kvd + e] = stored(kv_type, kv);
        V[((size_t)q * 64 + p) * kvd + e] = stored(kv_type, vv);
        kv_set(&pool, layer, 0, slot, e, kv);
        kv_set(&pool, layer, 1, slot, e, vv);
        kv_set(&pool, 0, 0, slot, e, 100.0f);
        kv_set(&pool, 0, 1, slot, e, 100.0f);
      }
    }
  const int qstride = nh * hd + 8;
  float *qv = rnd_vec((size_t)s.n_tokens * qstride), *out = malloc(sizeof(float) * (size_t)s.n_tokens * nh * hd);
  double *ref = calloc((size_t)s.n_tokens * nh * hd, sizeof(double)), sc[64];
  const float scale = 1.0f / sqrtf((float)hd);
  for (int q = 0; q < N_SEQS; q++) {
    if (kSeqs[q].ctx == 0) continue; /* padding: zeros */
    for (int i = 0; i < kSeqs[q].n_q; i++) {
      int t = s.q_start[q] + i, pos = kSeqs[q].ctx - kSeqs[q].n_q + i;
      int lo = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
      for (int h = 0; h < nh; h++) {
        int kh = h / (nh / nkv);
        double mx = -INFINITY, sum = 0;
        for (int p = lo; p <= pos; p++) {
          double d = 0;
          for (int e = 0; e < hd; e++) d += (double)qv[(size_t)t * qstride + h * hd + e] * K[((size_t)q * 64 + p) * kvd + kh * hd + e];
          sc[p] = d * scale;
          mx = fmax(mx, sc[p]);
        }
        for (int p = lo; p <= pos; p++) sum += (sc[p] = exp(sc[p] - mx));
        for (int p = lo; p <= pos; p++)
          for (int e = 0; e < hd; e++)
            ref[((size_t)t * nh + h) * hd + e] += sc[p] / sum * V[((size_t)q * 64 + p) * kvd + kh * hd + e];
      }
    }
  }
  poison(out, (size_t)s.n_tokens * nh * hd);
  ck_assert_int_eq(b->ops->attention(b->ctx, out, qv, qstride, &pool, layer, nh, hd, scale, window), 0);
  /* With an f16 pool the backend may round q and the probabilities to f16
   * before the dots, as llama.cpp's non-flash attention does (~2e-4). */
  double e = nerr(out, ref, (size_t)s.n_tokens * nh * hd), tol = kv_type == KERN_F16 ? 5e-4 : 1e-5;
  ck_assert_msg(e < tol, "attention %s hd %d window %d: normalized error %g", kern_type_traits(kv_type)->name, hd,
                window, e);
  for (int h = 0; h < nh * hd; h++) ck_assert_float_eq(out[(size_t)s.q_start[3] * nh * hd + h], 0.0f);
  /* entries wholly before a window may be -1 (blocks the engine released):
   * sequence 4 (3 new tokens, 48 in the cache) reads from 45 - window + 1 */
  const int lo4 = window > 0 ? 45 - window + 1 : 0, held = s.bt[4 * max_blocks];
  if (lo4 >= bs) {
    float *again = malloc(sizeof(float) * (size_t)s.n_tokens * nh * hd);
    s.bt[4 * max_blocks] = -1;
    st = step_of(&s);
    ck_assert_int_eq(b->ops->step_begin(b->ctx, &st), 0);
    ck_assert_int_eq(b->ops->attention(b->ctx, again, qv, qstride, &pool, layer, nh, hd, scale, window), 0);
    ck_assert(!memcmp(again, out, sizeof(float) * (size_t)s.n_tokens * nh * hd));
    ck_assert_int_lt(b->ops->attention(b->ctx, again, qv, qstride, &pool, layer, nh, hd, scale, 0), 0); /* read */
    s.bt[4 * max_blocks] = held;
    free(again);
  }
  /* a block id outside the pool is an error */
  s.bt[1] = 40;
  st = step_of(&s);
  ck_assert_int_eq(b->ops->step_begin(b->ctx, &st), 0);
  ck_assert_int_lt(b->ops->attention(b->ctx, out, qv, qstride, &pool, layer, nh, hd, scale, window), 0);
  ck_assert_int_lt(b->ops->attention(b->ctx, out, qv, qstride, &pool, layer, 5, hd, scale, window), 0); /* 5 % 2 */
  b->ops->kv_pool_deinit(b->ctx, &pool);
  free(K), free(V), free(qv), free(out), free(ref);
}

START_TEST(test_attention) {
  kern_backend_t *b = backend_for(_i);
  if (!b) return;
  check_attention(b, KERN_F32, 64, 0);
  check_attention(b, KERN_F16, 64, 0);
  check_attention(b, KERN_F32, 40, 0);
  check_attention(b, KERN_F16, 40, 0);
  check_attention(b, KERN_F32, 64, 5); /* sliding windows: shorter than most contexts, and one block's width */
  check_attention(b, KERN_F16, 40, 16);
  kern_backend_destroy(b);
}
END_TEST

START_TEST(test_step_errors) {
  kern_backend_t *b = backend_for(0);
  step_buf_t s;
  memset(&s, 0, sizeof s);
  s.n_tokens = 4;
  s.n_seqs = 2;
  s.max_blocks = 1;
  int32_t qs[3] = {0, 3, 2}; /* not monotonic */
  memcpy(s.q_start, qs, sizeof qs);
  s.ctx_len[0] = 3, s.ctx_len[1] = 1;
  kern_step_t st = step_of(&s);
  ck_assert_int_lt(b->ops->step_begin(b->ctx, &st), 0);
  s.q_start[2] = 5; /* past n_tokens */
  ck_assert_int_lt(b->ops->step_begin(b->ctx, &st), 0);
  s.q_start[2] = 4;
  s.ctx_len[0] = 2; /* fewer than its 3 new tokens */
  ck_assert_int_lt(b->ops->step_begin(b->ctx, &st), 0);
  s.ctx_len[0] = 3;
  ck_assert_int_eq(b->ops->step_begin(b->ctx, &st), 0);
  kern_backend_destroy(b);
  /* unknown or unsupported forced paths fail cleanly */
  setenv("FERRUM_CPU_ISA", "bogus", 1);
  kern_backend_t *x = NULL;
  ck_assert_int_eq(kern_cpu_create(&x, 1), FR_EUNSUPPORTED);
  ck_assert_ptr_null(x);
  if (!kern_cpu_isa_supported("avx512")) {
    setenv("FERRUM_CPU_ISA", "avx512", 1);
    ck_assert_int_eq(kern_cpu_create(&x, 1), FR_EUNSUPPORTED);
  }
}
END_TEST

/* The shared main (tests/common/test_main.c) runs this program's suites. */
#include "tests/common/test_main.h"

/* ---- moe_ffn ---- */

#define MOE_E 6   /* experts */
#define MOE_D 64  /* dim */
#define MOE_F 32  /* expert FFN */

typedef struct {
  kern_weight_t router, gate[MOE_E], up[MOE_E], down[MOE_E];
  uint8_t *bytes[1 + 3 * MOE_E];
} moe_fx_t;

/* Router F32; experts Q8_0 gate, Q4_1 up, F16 down (any type per stack). */
static void moe_fx_init(kern_backend_t *b, moe_fx_t *f) {
  f->bytes[0] = random_weight(KERN_F32, MOE_E, MOE_D);
  load_weight_as(b, &f->router, KERN_F32, MOE_E, MOE_D, f->bytes[0], true); /* kept, as the model loads them */
  for (int e = 0; e < MOE_E; e++) {
    f->bytes[1 + 3 * e] = random_weight(KERN_Q8_0, MOE_F, MOE_D);
    f->bytes[2 + 3 * e] = random_weight(KERN_Q4_1, MOE_F, MOE_D);
    f->bytes[3 + 3 * e] = random_weight(KERN_F16, MOE_D, MOE_F);
    load_weight_as(b, &f->gate[e], KERN_Q8_0, MOE_F, MOE_D, f->bytes[1 + 3 * e], true);
    load_weight_as(b, &f->up[e], KERN_Q4_1, MOE_F, MOE_D, f->bytes[2 + 3 * e], true);
    load_weight_as(b, &f->down[e], KERN_F16, MOE_D, MOE_F, f->bytes[3 + 3 * e], true);
  }
}

static void moe_fx_free(kern_backend_t *b, moe_fx_t *f) {
  b->ops->weight_release(b->ctx, &f->router);
  for (int e = 0; e < MOE_E; e++) {
    b->ops->weight_release(b->ctx, &f->gate[e]);
    b->ops->weight_release(b->ctx, &f->up[e]);
    b->ops->weight_release(b->ctx, &f->down[e]);
  }
  for (size_t i = 0; i < sizeof f->bytes / sizeof f->bytes[0]; i++) free(f->bytes[i]);
}

/* y(rows) = W x in double from the dequantized weight. */
static void ref_matvec(const kern_weight_t *w, const double *x, double *y) {
  float *row = malloc(sizeof(float) * (size_t)w->cols);
  for (int64_t r = 0; r < w->rows; r++) {
    kern_dequantize_row(w->type, (const uint8_t *)w->data + (size_t)r * w->row_bytes, row, w->cols);
    double acc = 0;
    for (int64_t c = 0; c < w->cols; c++) acc += row[c] * x[c];
    y[r] = acc;
  }
  free(row);
}

/* The MoE FFN of one token in double, as kern.h states it. */
static void ref_moe(const moe_fx_t *f, int k, bool norm, const float *x, double *out) {
  double xd[MOE_D], p[MOE_E], g[MOE_F], u[MOE_F], y[MOE_D], max = -INFINITY, sum = 0, wsum = 0;
  int sel[MOE_E];
  for (int i = 0; i < MOE_D; i++) xd[i] = x[i], out[i] = 0;
  ref_matvec(&f->router, xd, p);
  for (int e = 0; e < MOE_E; e++) max = fmax(max, p[e]);
  for (int e = 0; e < MOE_E; e++) sum += p[e] = exp(p[e] - max);
  for (int j = 0; j < k; j++) {
    sel[j] = -1;
    for (int e = 0; e < MOE_E; e++) {
      bool taken = false;
      for (int i = 0; i < j; i++) taken |= sel[i] == e;
      if (!taken && (sel[j] < 0 || p[e] > p[sel[j]])) sel[j] = e;
    }
    wsum += p[sel[j]] / sum;
  }
  for (int j = 0; j < k; j++) {
    const int e = sel[j];
    double w = p[e] / sum / (norm ? wsum : 1.0);
    ref_matvec(&f->gate[e], xd, g);
    ref_matvec(&f->up[e], xd, u);
    for (int i = 0; i < MOE_F; i++) g[i] = g[i] / (1 + exp(-g[i])) * u[i];
    ref_matvec(&f->down[e], g, y);
    for (int i = 0; i < MOE_D; i++) out[i] += w * y[i];
  }
}

/* Against the double reference; the batch (tokens grouped by expert) gives
 * each token's single-token bits; out may alias x. */
START_TEST(test_moe_ffn) {
  kern_backend_t *b = backend_for(_i);
  if (!b) return;
  ck_assert_ptr_nonnull(b->ops->moe_ffn);
  moe_fx_t f;
  moe_fx_init(b, &f);
  const int n = 37;
  float *x = rnd_vec((size_t)n * MOE_D), *out = malloc(sizeof(float) * n * MOE_D), one[MOE_D];
  double *ref = malloc(sizeof(double) * n * MOE_D);
  for (int k = 1; k <= 3; k++)
    for (int norm = 0; norm < 2; norm++) {
      kern_moe_t moe = {.router = &f.router, .gate = f.gate, .up = f.up, .down = f.down, .n_experts = MOE_E,
                        .n_used = k, .norm_topk = norm};
      poison(out, (size_t)n * MOE_D);
      ck_assert_int_eq(b->ops->moe_ffn(b->ctx, out, x, n, &moe), 0);
      for (int t = 0; t < n; t++) ref_moe(&f, k, norm, x + (size_t)t * MOE_D, ref + (size_t)t * MOE_D);
      double e = nerr(out, ref, (size_t)n * MOE_D);
      ck_assert_msg(e < 2e-2, "moe k %d norm %d: error %g", k, norm, e);
      for (int t = 0; t < n; t += 5) {
        ck_assert_int_eq(b->ops->moe_ffn(b->ctx, one, x + (size_t)t * MOE_D, 1, &moe), 0);
        ck_assert_msg(!memcmp(one, out + (size_t)t * MOE_D, sizeof one), "token %d: batch != alone", t);
      }
      memcpy(one, x, sizeof one);
      ck_assert_int_eq(b->ops->moe_ffn(b->ctx, one, one, 1, &moe), 0);
      ck_assert(!memcmp(one, out, sizeof one));
    }
  kern_moe_t bad = {.router = &f.router, .gate = f.gate, .up = f.up, .down = f.down, .n_experts = MOE_E,
                    .n_used = MOE_E + 1};
  ck_assert_int_eq(b->ops->moe_ffn(b->ctx, out, x, n, &bad), -EINVAL);
  bad.n_used = 2, bad.gate = f.down; /* experts of the wrong shape */
  ck_assert_int_eq(b->ops->moe_ffn(b->ctx, out, x, n, &bad), -EINVAL);
  free(x), free(out), free(ref);
  moe_fx_free(b, &f);
  kern_backend_destroy(b);
}
END_TEST

static Suite *ops_suite(void) {
  Suite *s = suite_create("kernels_ops");
  TCase *tc = tcase_create("ops");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, test_matmul, 0, N_CFG);
  tcase_add_loop_test(tc, test_matmul_paths_agree, 0, N_CFG);
  tcase_add_loop_test(tc, test_matmul_batch_invariant, 0, N_CFG);
  tcase_add_test(tc, test_matmul_vnni_exact);
  tcase_add_test(tc, test_matmul_panels_exact);
#if defined(__x86_64__)
  tcase_add_test(tc, test_matmul_amx);
#endif
  tcase_add_test(tc, test_matmul_kquant_avx512_exact);
  tcase_add_loop_test(tc, test_matmul_perm, 0, N_CFG);
  tcase_add_loop_test(tc, test_matmul_perm_padded, 0, N_CFG);
  tcase_add_test(tc, test_matmul_errors);
  tcase_add_loop_test(tc, test_norms, 0, N_CFG);
  tcase_add_loop_test(tc, test_elementwise, 0, N_CFG);
  tcase_add_loop_test(tc, test_last_rows_embed, 0, N_CFG);
  tcase_add_loop_test(tc, test_rope, 0, N_CFG);
  tcase_add_loop_test(tc, test_kv_append_copy, 0, N_CFG);
  tcase_add_loop_test(tc, test_attention, 0, N_CFG);
#if defined(__x86_64__)
  tcase_add_test(tc, test_attention_block_kernels_exact);
  tcase_add_test(tc, test_expf_libm_bits);
  tcase_add_test(tc, test_quantize_q8_K_exact);
#endif
  tcase_add_loop_test(tc, test_moe_ffn, 0, N_CFG);
  tcase_add_test(tc, test_step_errors);
  suite_add_tcase(s, tc);
  return s;
}

const test_prog_t test_prog = {.suites = {ops_suite}};
