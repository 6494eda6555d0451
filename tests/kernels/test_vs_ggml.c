/* test_vs_ggml.c - the CPU backend's quantized matvec against llama.cpp's own
 * CPU kernels (libggml-cpu from the llama-cpp-python package in the test
 * venv, loaded with dlopen): ggml quantizes the activations into its
 * vec_dot type and runs its vec_dot; we run our matmul on the same weight
 * bytes. On the AVX2 path the 32-element types' row dots must match bit
 * for bit (same integer sums, same float operations in the same order); the
 * other paths, the K-quants (different float summation order) and the
 * panels (kernels/cpu/cpu.h) must agree to a small normalized error. Skips
 * (77) when the library is not there. */
#include <check.h>
#include <dlfcn.h>
#include <glob.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_util.h"
#include "kernels/kern.h"

/* ggml-cpu.h: struct ggml_type_traits_cpu (stable since 2024). */
typedef void (*ggml_from_float_t)(const float *x, void *y, int64_t k);
typedef void (*ggml_vec_dot_t)(int n, float *s, size_t bs, const void *x, size_t bx, const void *y, size_t by, int nrc);
typedef struct {
  ggml_from_float_t from_float;
  ggml_vec_dot_t vec_dot;
  int vec_dot_type;
  int64_t nrows;
} ggml_traits_cpu_t;

static const ggml_traits_cpu_t *(*g_traits)(int type);

/* <venv>/lib/python3.X/site-packages/llama_cpp/lib/libggml-cpu.so next to FERRUM_PYTHON. */
static void *open_ggml(void) {
  const char *py = getenv("FERRUM_PYTHON");
  if (!py) return NULL;
  char buf[4096], pattern[4200];
  snprintf(buf, sizeof buf, "%s", py);
  char *venv = dirname(dirname(buf));
  snprintf(pattern, sizeof pattern, "%s/lib/python3*/site-packages/llama_cpp/lib/libggml-cpu.so", venv);
  glob_t g;
  void *h = NULL;
  if (glob(pattern, 0, NULL, &g) == 0 && g.gl_pathc > 0) h = dlopen(g.gl_pathv[0], RTLD_NOW | RTLD_LOCAL);
  globfree(&g);
  if (!h) return NULL;
  void (*init)(void) = (void (*)(void))dlsym(h, "ggml_cpu_init");
  g_traits = (const ggml_traits_cpu_t *(*)(int))dlsym(h, "ggml_get_type_traits_cpu");
  if (!init || !g_traits) return NULL;
  init();
  return h;
}

static uint64_t g_rng = 7;
static uint32_t rnd32(void) {
  g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(g_rng >> 33);
}
static float rnd_f(void) { return (float)rnd32() / 2147483648.0f - 1.0f; }

static void set_f16(uint8_t *p, float v) {
  uint16_t h = fr_fp32_to_fp16(v);
  memcpy(p, &h, 2);
}

static uint8_t *random_weight(kern_type_t t, int rows, int cols) {
  const kern_type_traits_t *tr = kern_type_traits(t);
  size_t bytes = kern_row_bytes(t, cols) * (size_t)rows;
  uint8_t *w = malloc(bytes);
  for (size_t i = 0; i < bytes; i++) w[i] = (uint8_t)rnd32();
  for (size_t b = 0; b < bytes; b += (size_t)tr->size) {
    float d = 0.02f + 0.05f * (rnd_f() + 1.0f), m = 0.05f * rnd_f();
    if (t == KERN_Q6_K) set_f16(w + b + 208, d * 0.05f);
    else if (t == KERN_Q4_K || t == KERN_Q5_K) set_f16(w + b, d * 0.05f), set_f16(w + b + 2, m * 0.05f);
    else if (t == KERN_Q4_1 || t == KERN_Q5_1) set_f16(w + b, d), set_f16(w + b + 2, m);
    else set_f16(w + b, rnd_f() < 0 ? -d : d);
  }
  return w;
}

static const kern_type_t kTypes[] = {KERN_Q4_0, KERN_Q4_1, KERN_Q5_0, KERN_Q5_1, KERN_Q8_0,
                                     KERN_Q4_K, KERN_Q5_K, KERN_Q6_K};
static const char *const kIsa[] = {"scalar", "avx2", "avx512", "avx512vnni"};

START_TEST(test_matvec_vs_ggml) {
  const char *isa = kIsa[_i];
  if (!kern_cpu_isa_supported(isa)) return;
  setenv("FERRUM_CPU_ISA", isa, 1);
  kern_backend_t *b = NULL;
  ck_assert_int_eq(kern_cpu_create(&b, 2), 0);
  const int rows = 96, cols = 1536;
  for (size_t k = 0; k < sizeof kTypes / sizeof kTypes[0]; k++) {
    const kern_type_t t = kTypes[k];
    const ggml_traits_cpu_t *gt = g_traits(t);
    ck_assert_ptr_nonnull(gt);
    ck_assert_ptr_nonnull(gt->vec_dot);
    uint8_t *w = random_weight(t, rows, cols), *q = malloc(4 * (size_t)cols);
    float x[1536], ours[96], ref[96];
    for (int i = 0; i < cols; i++) x[i] = rnd_f() * 3.0f;
    g_traits(gt->vec_dot_type)->from_float(x, q, cols);
    const size_t rb = kern_row_bytes(t, cols);
    for (int r = 0; r < rows; r++) gt->vec_dot(cols, &ref[r], 0, w + (size_t)r * rb, 0, q, 0, 1);
    for (int panels = 0; panels < 2; panels++) { /* the rows (keep_layout), then panels where the path has them */
      kern_weight_t wt = {.type = t, .rows = rows, .cols = cols, .row_bytes = rb, .keep_layout = !panels};
      ck_assert_int_eq(b->ops->weight_load(b->ctx, &wt, w), 0);
      if (panels && !wt.priv) continue;
      ck_assert_int_eq(b->ops->matmul(b->ctx, ours, &wt, NULL, x, 1), 0);
      b->ops->weight_release(b->ctx, &wt);
      double num = 0, den = 0;
      int exact = 0;
      for (int r = 0; r < rows; r++) {
        num += (ours[r] - ref[r]) * (double)(ours[r] - ref[r]);
        den += (double)ref[r] * ref[r];
        exact += ours[r] == ref[r];
      }
      double e = sqrt(num / den);
      fprintf(stderr, "%s %s%s: normalized error vs ggml %.3g, %d/%d bit-exact\n", isa, kern_type_traits(t)->name,
              panels ? " (panels)" : "", e, exact, rows);
      ck_assert_msg(e < 2e-6, "%s %s%s: normalized error vs ggml %g", isa, kern_type_traits(t)->name,
                    panels ? " (panels)" : "", e);
      if (!panels && !strcmp(isa, "avx2") && kern_type_traits(t)->blck == 32)
        ck_assert_msg(exact == rows, "%s %s: only %d of %d rows bit-exact with ggml", isa, kern_type_traits(t)->name,
                      exact, rows);
    }
    free(w), free(q);
  }
  kern_backend_destroy(b);
}
END_TEST

/* The shared main (tests/common/test_main.c) runs this program's suites. */
#include "tests/common/test_main.h"

static int ggml_setup(int argc, char **argv) {
  if (!open_ggml()) { /* loaded once here; the forked tests inherit it */
    fprintf(stderr, "skip: libggml-cpu (llama-cpp-python) not found next to FERRUM_PYTHON\n");
    return TEST_SKIP;
  }
  return 0;
}

static Suite *ggml_suite(void) {
  Suite *s = suite_create("kernels_vs_ggml");
  TCase *tc = tcase_create("ggml");
  tcase_add_loop_test(tc, test_matvec_vs_ggml, 0, (int)(sizeof kIsa / sizeof kIsa[0]));
  suite_add_tcase(s, tc);
  return s;
}

const test_prog_t test_prog = {.suites = {ggml_suite}, .setup = ggml_setup};
