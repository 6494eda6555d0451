/* test_gguf.c - the GGUF reader against files written by the gguf package
 * (make_fixtures.py) and against hand-made corrupt images. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "model/gguf.h"
#include "tests/formats/fx.h"

/* ---- valid files vs the manifest ------------------------------------- */

static void check_scalar(const model_gguf_t *g, json_t *e) {
  const char *key = json_string_value(json_object_get(e, "key"));
  const char *type = json_string_value(json_object_get(e, "type"));
  json_t *v = json_object_get(e, "value");
  const gguf_kv_t *kv = model_gguf_find(g, key);
  ck_assert_msg(kv != NULL, "key %s missing", key);
  ck_assert_str_eq(model_gguf_type_name(kv->type), type);
  if (json_is_string(v)) {
    gguf_str_t s;
    ck_assert_int_eq(model_gguf_get_str(g, key, &s), 0);
    ck_assert_uint_eq(s.len, json_string_length(v));
    ck_assert(memcmp(s.ptr, json_string_value(v), s.len) == 0);
    int64_t i;
    ck_assert_int_eq(model_gguf_get_i64(g, key, &i), FR_EFORMAT);
  } else if (json_is_boolean(v)) {
    bool b;
    ck_assert_int_eq(model_gguf_get_bool(g, key, &b), 0);
    ck_assert_int_eq(b, json_is_true(v));
  } else if (json_is_real(v)) {
    float f;
    ck_assert_int_eq(model_gguf_get_f32(g, key, &f), 0);
    ck_assert_float_eq(f, (float)json_real_value(v));
  } else if (json_is_object(v)) { /* a u64 past INT64_MAX: refused, bytes intact */
    int64_t i;
    uint64_t raw;
    ck_assert_int_eq(model_gguf_get_i64(g, key, &i), FR_EFORMAT);
    memcpy(&raw, kv->value, 8);
    ck_assert_uint_eq(raw, strtoull(json_string_value(json_object_get(v, "u64")), NULL, 10));
  } else {
    int64_t i;
    float f;
    ck_assert_int_eq(model_gguf_get_i64(g, key, &i), 0);
    ck_assert_int_eq(i, json_integer_value(v));
    ck_assert_int_eq(model_gguf_get_f32(g, key, &f), FR_EFORMAT);
  }
}

static void check_array(const model_gguf_t *g, json_t *e) {
  const char *key = json_string_value(json_object_get(e, "key"));
  const char *at = json_string_value(json_object_get(e, "arr_type"));
  json_t *vals = json_object_get(e, "values");
  const gguf_kv_t *kv = model_gguf_find(g, key);
  ck_assert_msg(kv != NULL, "key %s missing", key);
  ck_assert_int_eq(kv->type, GGUF_T_ARRAY);
  ck_assert_str_eq(model_gguf_type_name(kv->arr_type), at);
  ck_assert_uint_eq(kv->arr_count, json_array_size(vals));
  for (size_t i = 0; i < json_array_size(vals); i++) {
    json_t *v = json_array_get(vals, i);
    if (kv->arr_type == GGUF_T_STRING) {
      gguf_str_t s;
      ck_assert_int_eq(model_gguf_arr_str(kv, i, &s), 0);
      ck_assert_uint_eq(s.len, json_string_length(v));
      ck_assert(memcmp(s.ptr, json_string_value(v), s.len) == 0);
    } else if (kv->arr_type == GGUF_T_BOOL) {
      ck_assert_int_eq(kv->value[i], json_is_true(v));
    } else if (kv->arr_type == GGUF_T_FLOAT32 || kv->arr_type == GGUF_T_FLOAT64) {
      float f;
      ck_assert_int_eq(model_gguf_arr_f32(kv, i, &f), 0);
      ck_assert_float_eq(f, (float)json_number_value(v));
    } else {
      int64_t x;
      ck_assert_int_eq(model_gguf_arr_i64(kv, i, &x), 0);
      ck_assert_int_eq(x, json_integer_value(v));
    }
  }
  /* one past the end is refused, as is a wrong element type */
  gguf_str_t s;
  int64_t x;
  ck_assert_int_eq(model_gguf_arr_str(kv, kv->arr_count, &s), FR_EFORMAT);
  ck_assert_int_eq(model_gguf_arr_i64(kv, kv->arr_count, &x), FR_EFORMAT);
}

static void check_tensors(const model_gguf_t *g, json_t *tensors, const uint8_t *bin, size_t bin_n) {
  size_t at = 0;
  ck_assert_uint_eq(g->n_tensors, json_array_size(tensors));
  for (size_t i = 0; i < json_array_size(tensors); i++) {
    json_t *e = json_array_get(tensors, i), *ne = json_object_get(e, "ne");
    const char *name = json_string_value(json_object_get(e, "name"));
    const gguf_tensor_t *t = model_gguf_tensor(g, name);
    ck_assert_msg(t != NULL, "tensor %s missing", name);
    ck_assert_int_eq(t->type, json_integer_value(json_object_get(e, "type")));
    ck_assert_int_eq(t->n_dims, (int)json_array_size(ne));
    for (int d = 0; d < 4; d++)
      ck_assert_int_eq(t->ne[d], d < t->n_dims ? json_integer_value(json_array_get(ne, d)) : 1);
    ck_assert_uint_eq(t->bytes, json_integer_value(json_object_get(e, "nbytes")));
    /* where gguf.GGUFReader found the data */
    ck_assert_uint_eq(g->data_offset + t->offset, json_integer_value(json_object_get(e, "file_offset")));
    ck_assert_ptr_eq(t->data, g->map + g->data_offset + t->offset);
    ck_assert_uint_eq(t->offset % g->alignment, 0);
    ck_assert(at + t->bytes <= bin_n);
    ck_assert_msg(memcmp(t->data, bin + at, t->bytes) == 0, "tensor %s bytes differ", name);
    at += t->bytes;
  }
  ck_assert_uint_eq(at, bin_n);
  ck_assert_ptr_null(model_gguf_tensor(g, "t.nope"));
}

static void check_fixture(const char *stem) {
  char p[256];
  size_t bin_n;
  model_gguf_t *g;
  snprintf(p, sizeof p, "%s.json", stem);
  json_t *m = fx_json(p);
  snprintf(p, sizeof p, "%s.bin", stem);
  uint8_t *bin = fx_slurp(fx_path(p), &bin_n);
  snprintf(p, sizeof p, "%s.gguf", stem);
  int rc = model_gguf_open(&g, fx_path(p));
  ck_assert_msg(rc == 0, "open: %s", fr_last_error());
  ck_assert_uint_eq(g->version, 3);
  ck_assert_uint_eq(g->alignment, json_integer_value(json_object_get(m, "alignment")));
  json_t *kvs = json_object_get(m, "kv");
  ck_assert_uint_eq(g->n_kv, json_array_size(kvs));
  for (size_t i = 0; i < json_array_size(kvs); i++) {
    json_t *e = json_array_get(kvs, i);
    if (json_object_get(e, "values")) check_array(g, e);
    else check_scalar(g, e);
  }
  check_tensors(g, json_object_get(m, "tensors"), bin, bin_n);
  model_gguf_close(g);
  free(bin);
  json_decref(m);
}

START_TEST(all_types_match_writer) { check_fixture("all_types"); }
END_TEST

START_TEST(alignment_64) { check_fixture("align64"); }
END_TEST

START_TEST(getters_report_absent_and_mismatched) {
  model_gguf_t *g;
  ck_assert_int_eq(model_gguf_open(&g, fx_path("all_types.gguf")), 0);
  int64_t i;
  float f;
  bool b;
  gguf_str_t s;
  ck_assert_int_eq(model_gguf_get_i64(g, "no.such.key", &i), FR_ENOTFOUND);
  ck_assert_int_eq(model_gguf_get_f32(g, "no.such.key", &f), FR_ENOTFOUND);
  ck_assert_int_eq(model_gguf_get_bool(g, "no.such.key", &b), FR_ENOTFOUND);
  ck_assert_int_eq(model_gguf_get_str(g, "no.such.key", &s), FR_ENOTFOUND);
  ck_assert_int_eq(model_gguf_get_bool(g, "test.u8", &b), FR_EFORMAT);
  ck_assert_int_eq(model_gguf_get_str(g, "test.arr.str", &s), FR_EFORMAT);
  ck_assert_int_eq(model_gguf_get_f32(g, "test.arr.f32", &f), FR_EFORMAT);
  ck_assert_int_eq(model_gguf_get_i64(g, "test.u64_small", &i), 0);
  ck_assert_int_eq(i, 123456789012LL);
  const gguf_kv_t *kv = model_gguf_find(g, "test.arr.i32");
  ck_assert_int_eq(model_gguf_arr_str(kv, 0, &s), FR_EFORMAT);
  ck_assert_int_eq(model_gguf_arr_f32(kv, 0, &f), FR_EFORMAT);
  kv = model_gguf_find(g, "test.u32"); /* a scalar is not an array */
  ck_assert_int_eq(model_gguf_arr_i64(kv, 0, &i), FR_EFORMAT);
  ck_assert_str_eq(model_gguf_type_name(GGUF_T_FLOAT64), "float64");
  ck_assert_str_eq(model_gguf_type_name((gguf_vtype_t)99), "unknown");
  model_gguf_close(g);
}
END_TEST

START_TEST(version_2_accepted) {
  size_t n;
  uint8_t *img = fx_slurp(fx_path("all_types.gguf"), &n);
  model_gguf_t *g;
  img[4] = 2;
  ck_assert_int_eq(model_gguf_open_memory(&g, img, n), 0);
  ck_assert_uint_eq(g->version, 2);
  model_gguf_close(g);
  free(img);
}
END_TEST

/* Every prefix of a valid file is an error with a message, never a crash. */
START_TEST(every_truncation_fails) {
  size_t n;
  const char *name = _i ? "tiny_qwen2.gguf" : "all_types.gguf";
  uint8_t *img = fx_slurp(fx_path(name), &n);
  size_t step = _i ? 7 : 1, end = 0; /* the larger file: every 7th length */
  model_gguf_t *full;
  ck_assert_int_eq(model_gguf_open(&full, fx_path(name)), 0);
  for (uint64_t i = 0; i < full->n_tensors; i++) /* the file may end in padding */
    end = FR_MAX(end, full->data_offset + full->tensors[i].offset + full->tensors[i].bytes);
  model_gguf_close(full);
  ck_assert(end > 0 && end <= n);
  for (size_t len = 0; len < end; len += step) {
    uint8_t *cut = fx_exact(img, len);
    model_gguf_t *g = (model_gguf_t *)1;
    fr_error_clear();
    int rc = model_gguf_open_memory(&g, cut, len);
    ck_assert_msg(rc == FR_ETRUNCATED || rc == FR_EFORMAT, "len %zu: rc %d", len, rc);
    ck_assert_ptr_null(g);
    FX_ASSERT_MSG("gguf:");
    free(cut);
  }
  free(img);
}
END_TEST

START_TEST(missing_file) {
  model_gguf_t *g;
  ck_assert_int_eq(model_gguf_open(&g, "/nonexistent/x.gguf"), -ENOENT);
  ck_assert_ptr_null(g);
  FX_ASSERT_MSG("gguf:");
}
END_TEST

/* ---- hand-made images ------------------------------------------------- */

static void tinfo(fx_buf_t *b, const char *name, uint32_t nd, const int64_t *ne, uint32_t type, uint64_t off) {
  fx_str(b, name);
  fx_u32(b, nd);
  for (uint32_t d = 0; d < nd; d++) fx_u64(b, (uint64_t)ne[d]);
  fx_u32(b, type);
  fx_u64(b, off);
}

/* Opens b's bytes (exact-size copy), then empties b; returns rc and checks
 * the message. */
static int open_img(fx_buf_t *b) {
  uint8_t *p = fx_exact(b->p, b->n);
  model_gguf_t *g = NULL;
  fr_error_clear();
  int rc = model_gguf_open_memory(&g, p, b->n);
  if (rc) {
    ck_assert_ptr_null(g);
    FX_ASSERT_MSG("gguf:");
  }
  model_gguf_close(g);
  free(p);
  free(b->p);
  memset(b, 0, sizeof *b);
  return rc;
}

/* A valid image: 2 keys and tensors a (F32 8x2) at 0 and b (Q4_0 32) at 64. */
static void valid_image(fx_buf_t *b) {
  static const int64_t ne_a[] = {8, 2}, ne_b[] = {32};
  fx_gguf_header(b, 3, 2, 2);
  fx_gguf_kv_str(b, "general.architecture", "llama");
  fx_gguf_kv_u32(b, "general.alignment", 32);
  tinfo(b, "a", 2, ne_a, KERN_F32, 0);
  tinfo(b, "b", 1, ne_b, KERN_Q4_0, 64);
  fx_pad(b, 32);
  fx_zeros(b, 64 + 18);
}

START_TEST(handmade_valid) {
  fx_buf_t b = {0};
  valid_image(&b);
  ck_assert_int_eq(open_img(&b), 0);
  /* no keys, no tensors, no data section: valid too */
  fx_buf_t e = {0};
  fx_gguf_header(&e, 3, 0, 0);
  ck_assert_int_eq(open_img(&e), 0);
}
END_TEST

START_TEST(bad_magic_and_versions) {
  fx_buf_t b = {0};
  valid_image(&b);
  b.p[0] = 'X';
  ck_assert_int_eq(open_img(&b), FR_EFORMAT);
  static const uint32_t bad[] = {0, 1, 4, 0x03000000u /* big-endian 3 */};
  static const int want[] = {FR_EUNSUPPORTED, FR_EVERSION, FR_EVERSION, FR_EUNSUPPORTED};
  for (size_t i = 0; i < 4; i++) {
    fx_buf_t c = {0};
    valid_image(&c);
    memcpy(c.p + 4, &bad[i], 4);
    ck_assert_int_eq(open_img(&c), want[i]);
  }
}
END_TEST

START_TEST(huge_counts) {
  const uint64_t huge = 1ull << 60;
  fx_buf_t b = {0};
  fx_gguf_header(&b, 3, 0, huge); /* n_kv */
  ck_assert_int_eq(open_img(&b), FR_EFORMAT);
  fx_gguf_header(&b, 3, huge, 0); /* n_tensors */
  ck_assert_int_eq(open_img(&b), FR_EFORMAT);
  fx_gguf_header(&b, 3, UINT64_MAX, UINT64_MAX);
  ck_assert_int_eq(open_img(&b), FR_EFORMAT);
  fx_gguf_header(&b, 3, 0, 1); /* key length 2^60 */
  fx_u64(&b, huge);
  fx_zeros(&b, 16);
  ck_assert_int_eq(open_img(&b), FR_EFORMAT);
  fx_gguf_header(&b, 3, 0, 1); /* string value length 2^60 */
  fx_str(&b, "k");
  fx_u32(&b, GGUF_T_STRING);
  fx_u64(&b, huge);
  fx_zeros(&b, 16);
  ck_assert_int_eq(open_img(&b), FR_ETRUNCATED);
  static const uint32_t elem[] = {GGUF_T_UINT8, GGUF_T_UINT64, GGUF_T_STRING, GGUF_T_BOOL};
  for (size_t i = 0; i < 4; i++) { /* array count 2^60 (and 2^64-1) */
    for (int k = 0; k < 2; k++) {
      fx_gguf_header(&b, 3, 0, 1);
      fx_str(&b, "arr");
      fx_u32(&b, GGUF_T_ARRAY);
      fx_u32(&b, elem[i]);
      fx_u64(&b, k ? UINT64_MAX : huge);
      fx_zeros(&b, 64);
      int rc = open_img(&b);
      ck_assert(rc == FR_ETRUNCATED || rc == FR_EFORMAT);
    }
  }
  fx_gguf_header(&b, 3, 0, 1); /* string array whose element length is huge */
  fx_str(&b, "arr");
  fx_u32(&b, GGUF_T_ARRAY);
  fx_u32(&b, GGUF_T_STRING);
  fx_u64(&b, 2);
  fx_str(&b, "ok");
  fx_u64(&b, huge);
  ck_assert_int_eq(open_img(&b), FR_ETRUNCATED);
}
END_TEST

START_TEST(bad_values) {
  fx_buf_t b = {0};
  fx_gguf_header(&b, 3, 0, 1); /* unknown value type */
  fx_str(&b, "k");
  fx_u32(&b, 13);
  fx_u64(&b, 0);
  ck_assert_int_eq(open_img(&b), FR_EFORMAT);
  fx_gguf_header(&b, 3, 0, 1); /* nested array */
  fx_str(&b, "k");
  fx_u32(&b, GGUF_T_ARRAY);
  fx_u32(&b, GGUF_T_ARRAY);
  fx_u64(&b, 0);
  ck_assert_int_eq(open_img(&b), FR_EUNSUPPORTED);
  fx_gguf_header(&b, 3, 0, 1); /* unknown element type */
  fx_str(&b, "k");
  fx_u32(&b, GGUF_T_ARRAY);
  fx_u32(&b, 77);
  fx_u64(&b, 0);
  ck_assert_int_eq(open_img(&b), FR_EFORMAT);
  fx_gguf_header(&b, 3, 0, 1); /* bool 2 */
  fx_str(&b, "k");
  fx_u32(&b, GGUF_T_BOOL);
  fx_u8(&b, 2);
  ck_assert_int_eq(open_img(&b), FR_EFORMAT);
  fx_gguf_header(&b, 3, 0, 1); /* bool array with a 7 */
  fx_str(&b, "k");
  fx_u32(&b, GGUF_T_ARRAY);
  fx_u32(&b, GGUF_T_BOOL);
  fx_u64(&b, 3);
  fx_u8(&b, 1);
  fx_u8(&b, 7);
  fx_u8(&b, 0);
  ck_assert_int_eq(open_img(&b), FR_EFORMAT);
  fx_gguf_header(&b, 3, 0, 1); /* empty key */
  fx_str(&b, "");
  fx_u32(&b, GGUF_T_UINT8);
  fx_u8(&b, 1);
  ck_assert_int_eq(open_img(&b), FR_EFORMAT);
  fx_gguf_header(&b, 3, 0, 2); /* duplicate key */
  fx_gguf_kv_u32(&b, "dup.key", 1);
  fx_gguf_kv_u32(&b, "dup.key", 2);
  ck_assert_int_eq(open_img(&b), FR_EFORMAT);
  ck_assert_ptr_nonnull(strstr(fr_last_error(), "dup.key"));
}
END_TEST

START_TEST(empty_arrays_are_valid) {
  fx_buf_t b = {0};
  model_gguf_t *g;
  fx_gguf_header(&b, 3, 0, 2);
  fx_str(&b, "e.str");
  fx_u32(&b, GGUF_T_ARRAY);
  fx_u32(&b, GGUF_T_STRING);
  fx_u64(&b, 0);
  fx_str(&b, "e.f32");
  fx_u32(&b, GGUF_T_ARRAY);
  fx_u32(&b, GGUF_T_FLOAT32);
  fx_u64(&b, 0);
  ck_assert_int_eq(model_gguf_open_memory(&g, b.p, b.n), 0);
  const gguf_kv_t *kv = model_gguf_find(g, "e.str");
  gguf_str_t s;
  ck_assert_uint_eq(kv->arr_count, 0);
  ck_assert_int_eq(model_gguf_arr_str(kv, 0, &s), FR_EFORMAT);
  model_gguf_close(g);
  free(b.p);
}
END_TEST

START_TEST(known_keys_have_known_types) {
  fx_buf_t b = {0};
  fx_gguf_header(&b, 3, 0, 1);
  fx_gguf_kv_u32(&b, "general.architecture", 5);
  ck_assert_int_eq(open_img(&b), FR_EFORMAT);
  ck_assert_ptr_nonnull(strstr(fr_last_error(), "general.architecture"));
  fx_gguf_header(&b, 3, 0, 1);
  fx_str(&b, "general.alignment");
  fx_u32(&b, GGUF_T_UINT64);
  fx_u64(&b, 32);
  ck_assert_int_eq(open_img(&b), FR_EFORMAT);
  fx_gguf_header(&b, 3, 0, 1); /* scores as a string array */
  fx_str(&b, "tokenizer.ggml.scores");
  fx_u32(&b, GGUF_T_ARRAY);
  fx_u32(&b, GGUF_T_STRING);
  fx_u64(&b, 1);
  fx_str(&b, "x");
  ck_assert_int_eq(open_img(&b), FR_EFORMAT);
  fx_gguf_header(&b, 3, 0, 1); /* token list as i32 */
  fx_str(&b, "tokenizer.ggml.tokens");
  fx_u32(&b, GGUF_T_ARRAY);
  fx_u32(&b, GGUF_T_INT32);
  fx_u64(&b, 1);
  fx_u32(&b, 1);
  ck_assert_int_eq(open_img(&b), FR_EFORMAT);
  static const uint32_t bad_align[] = {0, 1, 4, 48, 1u << 31};
  for (size_t i = 0; i < FR_ARRAY_SIZE(bad_align); i++) {
    fx_gguf_header(&b, 3, 0, 1);
    fx_gguf_kv_u32(&b, "general.alignment", bad_align[i]);
    ck_assert_int_eq(open_img(&b), FR_EFORMAT);
  }
}
END_TEST

/* One tensor info followed by data; returns open_img's rc. */
static int one_tensor(const char *name, uint32_t nd, const int64_t *ne, uint32_t type, uint64_t off,
                      size_t data) {
  fx_buf_t b = {0};
  fx_gguf_header(&b, 3, 1, 0);
  tinfo(&b, name, nd, ne, type, off);
  fx_pad(&b, 32);
  fx_zeros(&b, data);
  return open_img(&b);
}

START_TEST(bad_tensor_infos) {
  static const int64_t ne5[] = {1, 1, 1, 1, 1}, ne32[] = {32, 2}, ne0[] = {32, 0}, neneg[] = {32, -3};
  static const int64_t big[] = {1ll << 32, 1ll << 32}, big2[] = {1ll << 40, 1ll << 20}, ne33[] = {33};
  static const int64_t big3[] = {1ll << 62, 1};
  ck_assert_int_eq(one_tensor("t", 2, ne32, KERN_F32, 0, 256), 0); /* the valid base */
  ck_assert_int_eq(one_tensor("t", 5, ne5, KERN_F32, 0, 64), FR_EFORMAT);
  ck_assert_int_eq(one_tensor("t", 0, ne5, KERN_F32, 0, 64), FR_EFORMAT);
  ck_assert_int_eq(one_tensor("t", 2, ne0, KERN_F32, 0, 256), FR_EFORMAT);
  ck_assert_int_eq(one_tensor("t", 2, neneg, KERN_F32, 0, 256), FR_EFORMAT);
  ck_assert_int_eq(one_tensor("t", 2, big, KERN_F32, 0, 256), FR_EFORMAT);    /* element count overflow */
  ck_assert_int_eq(one_tensor("t", 2, big2, KERN_Q6_K, 0, 256), FR_ETRUNCATED); /* ~2^60 bytes: past EOF */
  ck_assert_int_eq(one_tensor("t", 2, big3, KERN_F32, 0, 256), FR_EFORMAT);     /* 2^64 bytes: overflow */
  ck_assert_int_eq(one_tensor("t", 1, ne33, KERN_Q4_0, 0, 256), FR_EFORMAT);  /* ne[0] % 32 */
  ck_assert_int_eq(one_tensor("t", 2, ne32, KERN_F32, 8, 512), FR_EFORMAT);   /* misaligned */
  ck_assert_int_eq(one_tensor("t", 2, ne32, KERN_F32, 32, 256), FR_ETRUNCATED); /* data past EOF */
  ck_assert_int_eq(one_tensor("t", 2, ne32, KERN_F32, 1ull << 63, 256), FR_ETRUNCATED);
  ck_assert_int_eq(one_tensor("t", 2, ne32, KERN_F32, UINT64_MAX - 31, 256), FR_ETRUNCATED);
  ck_assert_int_eq(one_tensor("", 2, ne32, KERN_F32, 0, 256), FR_EFORMAT);
  char longname[65];
  memset(longname, 'n', 64);
  longname[64] = 0;
  ck_assert_int_eq(one_tensor(longname, 2, ne32, KERN_F32, 0, 256), FR_EFORMAT);
}
END_TEST

START_TEST(unsupported_tensor_types) {
  static const int64_t ne[] = {256};
  static const uint32_t types[] = {4, 5, 9 /* Q8_1 */, 10 /* Q2_K */, 15 /* Q8_K */, 16, 20, 28, 31, 39, 1000};
  for (size_t i = 0; i < FR_ARRAY_SIZE(types); i++) {
    char id[16];
    ck_assert_int_eq(one_tensor("t", 1, ne, types[i], 0, 4096), FR_EUNSUPPORTED);
    snprintf(id, sizeof id, "type %u", types[i]);
    ck_assert_msg(strstr(fr_last_error(), id), "message '%s' lacks '%s'", fr_last_error(), id);
  }
  static const uint32_t ok[] = {KERN_F32, KERN_F16, KERN_BF16, KERN_Q8_0, KERN_Q4_0, KERN_Q4_1,
                                KERN_Q5_0, KERN_Q5_1, KERN_Q4_K, KERN_Q5_K, KERN_Q6_K};
  for (size_t i = 0; i < FR_ARRAY_SIZE(ok); i++) ck_assert_int_eq(one_tensor("t", 1, ne, ok[i], 0, 1024), 0);
}
END_TEST

START_TEST(overlapping_and_duplicate_tensors) {
  static const int64_t ne[] = {16};
  fx_buf_t b = {0};
  fx_gguf_header(&b, 3, 2, 0); /* a: [0,64), b: [32,96) */
  tinfo(&b, "a", 1, ne, KERN_F32, 0);
  tinfo(&b, "b", 1, ne, KERN_F32, 32);
  fx_pad(&b, 32);
  fx_zeros(&b, 128);
  ck_assert_int_eq(open_img(&b), FR_EFORMAT);
  ck_assert_ptr_nonnull(strstr(fr_last_error(), "overlap"));
  fx_gguf_header(&b, 3, 2, 0); /* same offset */
  tinfo(&b, "a", 1, ne, KERN_F32, 64);
  tinfo(&b, "b", 1, ne, KERN_F32, 64);
  fx_pad(&b, 32);
  fx_zeros(&b, 128);
  ck_assert_int_eq(open_img(&b), FR_EFORMAT);
  fx_gguf_header(&b, 3, 2, 0); /* duplicate name */
  tinfo(&b, "a", 1, ne, KERN_F32, 0);
  tinfo(&b, "a", 1, ne, KERN_F32, 64);
  fx_pad(&b, 32);
  fx_zeros(&b, 128);
  ck_assert_int_eq(open_img(&b), FR_EFORMAT);
  ck_assert_ptr_nonnull(strstr(fr_last_error(), "duplicate"));
  fx_gguf_header(&b, 3, 2, 0); /* adjacent, out of order: fine */
  tinfo(&b, "a", 1, ne, KERN_F32, 64);
  tinfo(&b, "b", 1, ne, KERN_F32, 0);
  fx_pad(&b, 32);
  fx_zeros(&b, 128);
  ck_assert_int_eq(open_img(&b), 0);
}
END_TEST

/* Truncating the hand-made image anywhere, header included, fails cleanly. */
START_TEST(handmade_truncations) {
  fx_buf_t b = {0};
  valid_image(&b);
  for (size_t len = 0; len < b.n; len++) {
    fx_buf_t c = {0};
    fx_put(&c, b.p, len);
    int rc = open_img(&c);
    ck_assert_msg(rc == FR_ETRUNCATED || rc == FR_EFORMAT, "len %zu: %d", len, rc);
  }
  free(b.p);
}
END_TEST

static Suite *gguf_suite(void) {
  Suite *s = suite_create("gguf");
  TCase *tc = tcase_create("gguf");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, all_types_match_writer);
  tcase_add_test(tc, alignment_64);
  tcase_add_test(tc, getters_report_absent_and_mismatched);
  tcase_add_test(tc, version_2_accepted);
  tcase_add_loop_test(tc, every_truncation_fails, 0, 2);
  tcase_add_test(tc, missing_file);
  tcase_add_test(tc, handmade_valid);
  tcase_add_test(tc, bad_magic_and_versions);
  tcase_add_test(tc, huge_counts);
  tcase_add_test(tc, bad_values);
  tcase_add_test(tc, empty_arrays_are_valid);
  tcase_add_test(tc, known_keys_have_known_types);
  tcase_add_test(tc, bad_tensor_infos);
  tcase_add_test(tc, unsupported_tensor_types);
  tcase_add_test(tc, overlapping_and_duplicate_tensors);
  tcase_add_test(tc, handmade_truncations);
  suite_add_tcase(s, tc);
  return s;
}

/* The shared main (tests/common/test_main.c) runs this program's suites. */
#include "tests/common/test_main.h"

const test_prog_t test_prog = {.suites = {gguf_suite}};
