/* test_dequant.c - kern_dequantize_row against the gguf package's
 * dequantizer (golden data written by gen_quant_golden.py into
 * $FERRUM_BUILD_DIR/kernels_golden), plus type traits and size helpers. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kern.h"

static char *golden_path(const char *name, const char *ext) {
  static char buf[4096];
  const char *dir = getenv("FERRUM_BUILD_DIR");
  snprintf(buf, sizeof buf, "%s/kernels_golden/%s%s", dir ? dir : ".", name, ext);
  return buf;
}

static void *read_file(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "cannot open %s (run gen_quant_golden.py)", path);
  fseek(f, 0, SEEK_END);
  long sz = ftell(f);
  fseek(f, 0, SEEK_SET);
  void *p = malloc((size_t)sz + 1);
  ck_assert_int_eq(fread(p, 1, (size_t)sz, f), (size_t)sz);
  fclose(f);
  *n = (size_t)sz;
  return p;
}

/* Distance in units in the last place between two finite floats. */
static long ulp_diff(float a, float b) {
  int32_t ia, ib;
  memcpy(&ia, &a, 4);
  memcpy(&ib, &b, 4);
  if (ia < 0) ia = (int32_t)(0x80000000u - (uint32_t)ia);
  if (ib < 0) ib = (int32_t)(0x80000000u - (uint32_t)ib);
  return labs((long)ia - (long)ib);
}

static const struct {
  const char *name;
  kern_type_t type;
} kTypes[] = {{"F16", KERN_F16},   {"BF16", KERN_BF16}, {"Q4_0", KERN_Q4_0}, {"Q4_1", KERN_Q4_1},
              {"Q5_0", KERN_Q5_0}, {"Q5_1", KERN_Q5_1}, {"Q8_0", KERN_Q8_0}, {"Q4_K", KERN_Q4_K},
              {"Q5_K", KERN_Q5_K}, {"Q6_K", KERN_Q6_K}};

START_TEST(test_dequant_vs_gguf) {
  const char *name = kTypes[_i].name;
  const kern_type_t type = kTypes[_i].type;
  size_t nm, nraw, nref;
  char *manifest = read_file(golden_path("MANIFEST", ""), &nm);
  manifest[nm] = 0;
  int rows = 0, cols = 0;
  ck_assert_int_eq(sscanf(manifest, "%d %d", &rows, &cols), 2);
  free(manifest);
  uint8_t *raw = read_file(golden_path(name, ".bin"), &nraw);
  float *ref = read_file(golden_path(name, ".f32"), &nref);
  const size_t rb = kern_row_bytes(type, cols);
  ck_assert_uint_eq(nraw, rb * (size_t)rows);
  ck_assert_uint_eq(nref, sizeof(float) * (size_t)rows * (size_t)cols);
  float *out = malloc(sizeof(float) * (size_t)cols);
  long worst = 0, n_exact = 0;
  for (int r = 0; r < rows; r++) {
    for (int i = 0; i < cols; i++) out[i] = NAN;
    kern_dequantize_row(type, raw + (size_t)r * rb, out, cols);
    for (int i = 0; i < cols; i++) {
      float want = ref[(size_t)r * (size_t)cols + (size_t)i];
      ck_assert_msg(isfinite(out[i]), "%s row %d elem %d: not finite (%g)", name, r, i, out[i]);
      long d = ulp_diff(out[i], want);
      ck_assert_msg(d <= 1, "%s row %d elem %d: got %.9g want %.9g (%ld ulp)", name, r, i, out[i], want, d);
      worst = d > worst ? d : worst;
      n_exact += d == 0;
    }
  }
  /* 1 ulp is tolerated for FMA contraction; nearly all must be exact. */
  ck_assert_msg(n_exact >= (long)rows * cols * 99 / 100, "%s: only %ld of %d exact", name, n_exact, rows * cols);
  free(out);
  free(raw);
  free(ref);
}
END_TEST

START_TEST(test_traits_and_sizes) {
  ck_assert_ptr_nonnull(kern_type_traits(KERN_Q4_K));
  ck_assert_str_eq(kern_type_traits(KERN_Q4_K)->name, "Q4_K");
  ck_assert_int_eq(kern_type_traits(KERN_Q6_K)->size, 210);
  ck_assert_ptr_null(kern_type_traits(4));
  ck_assert_ptr_null(kern_type_traits(-1));
  ck_assert_ptr_null(kern_type_traits(KERN_TYPE_MAX));
  ck_assert_uint_eq(kern_row_bytes(KERN_Q4_1, 576), 18 * 20);
  ck_assert_uint_eq(kern_row_bytes(KERN_Q4_K, 576), 0); /* not a multiple of 256 */
  ck_assert_uint_eq(kern_row_bytes(KERN_F16, 7), 14);
  ck_assert_uint_eq(kern_row_bytes(KERN_Q8_0, -32), 0);
  ck_assert_uint_eq(kern_row_bytes(KERN_F32, INT64_MAX), 0); /* overflow */
  kern_kv_config_t c = {.n_layers = 30, .n_kv_heads = 3, .head_dim = 64, .block_size = 16, .n_blocks = 100,
                        .type = KERN_F16};
  ck_assert_uint_eq(kern_kv_pool_bytes(&c), 2ull * 30 * 100 * 16 * 3 * 64 * 2);
  c.n_blocks = 0x7fffffff;
  c.block_size = 0x7fffffff;
  c.head_dim = 0x7fffffff;
  ck_assert_uint_eq(kern_kv_pool_bytes(&c), 0);
  c.n_blocks = -1;
  ck_assert_uint_eq(kern_kv_pool_bytes(&c), 0);
  kern_backend_destroy(NULL);
}
END_TEST

/* The shared main (tests/common/test_main.c) runs this program's suites. */
#include "tests/common/test_main.h"

static Suite *dequant_suite(void) {
  Suite *s = suite_create("kernels_dequant");
  TCase *tc = tcase_create("dequant");
  tcase_add_loop_test(tc, test_dequant_vs_gguf, 0, (int)(sizeof kTypes / sizeof kTypes[0]));
  tcase_add_test(tc, test_traits_and_sizes);
  suite_add_tcase(s, tc);
  return s;
}

const test_prog_t test_prog = {.suites = {dequant_suite}};
