/* test_safetensors.c - the safetensors reader against files written by
 * make_fixtures.py (single file, HF folders, a sharded index) and against
 * hand-made corrupt headers. */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "model/safetensors.h"
#include "tests/formats/fx.h"

static st_dtype_t dtype_of(const char *name) {
  if (!strcmp(name, "F32")) return ST_F32;
  if (!strcmp(name, "F16")) return ST_F16;
  if (!strcmp(name, "BF16")) return ST_BF16;
  return ST_OTHER;
}

static void check_st_all(const model_st_t *st) {
  size_t bin_n, at = 0;
  json_t *m = fx_json("st_all.json");
  uint8_t *bin = fx_slurp(fx_path("st_all.bin"), &bin_n);
  ck_assert_uint_eq(st->n_tensors, json_array_size(m));
  for (size_t i = 0; i < json_array_size(m); i++) {
    json_t *e = json_array_get(m, i), *shape = json_object_get(e, "shape");
    const char *name = json_string_value(json_object_get(e, "name"));
    const char *dt = json_string_value(json_object_get(e, "dtype"));
    const st_tensor_t *t = model_st_tensor(st, name);
    ck_assert_msg(t != NULL, "tensor %s missing", name);
    ck_assert_ptr_eq(t, &st->tensors[i]); /* sorted by name, as the manifest */
    ck_assert_str_eq(t->dtype_name, dt);
    ck_assert_int_eq(t->dtype, dtype_of(dt));
    ck_assert_int_eq(t->n_dims, (int)json_array_size(shape));
    for (int d = 0; d < t->n_dims; d++) ck_assert_int_eq(t->shape[d], json_integer_value(json_array_get(shape, d)));
    ck_assert_uint_eq(t->bytes, json_integer_value(json_object_get(e, "nbytes")));
    ck_assert(at + t->bytes <= bin_n);
    ck_assert_msg(t->bytes == 0 || memcmp(t->data, bin + at, t->bytes) == 0, "tensor %s bytes differ", name);
    at += t->bytes;
  }
  ck_assert_ptr_null(model_st_tensor(st, "w.none"));
  ck_assert_ptr_null(model_st_tensor(st, ""));
  free(bin);
  json_decref(m);
}

START_TEST(single_file_matches_writer) {
  model_st_t *st;
  ck_assert_msg(model_st_open(&st, fx_path("st_all.safetensors")) == 0, "%s", fr_last_error());
  check_st_all(st);
  model_st_close(st);
  size_t n;
  uint8_t *img = fx_slurp(fx_path("st_all.safetensors"), &n);
  ck_assert_int_eq(model_st_open_memory(&st, img, n), 0);
  check_st_all(st);
  model_st_close(st);
  free(img);
}
END_TEST

START_TEST(hf_folder_single) {
  model_st_t *st;
  ck_assert_msg(model_st_open(&st, fx_path("hf_llama")) == 0, "%s", fr_last_error());
  const st_tensor_t *t = model_st_tensor(st, "model.layers.1.self_attn.q_proj.weight");
  ck_assert_ptr_nonnull(t);
  ck_assert_int_eq(t->dtype, ST_BF16);
  ck_assert_int_eq(t->n_dims, 2);
  ck_assert_int_eq(t->shape[0], 64);
  ck_assert_int_eq(t->shape[1], 64);
  ck_assert_uint_eq(t->bytes, 64 * 64 * 2);
  ck_assert_ptr_nonnull(model_st_tensor(st, "model.layers.0.self_attn.rotary_emb.inv_freq"));
  ck_assert_ptr_nonnull(model_st_tensor(st, "lm_head.weight"));
  model_st_close(st);
}
END_TEST

START_TEST(hf_folder_sharded) {
  model_st_t *st;
  json_t *idx = fx_json("hf_qwen2/model.safetensors.index.json");
  json_t *wm = json_object_get(idx, "weight_map");
  ck_assert_msg(model_st_open(&st, fx_path("hf_qwen2")) == 0, "%s", fr_last_error());
  ck_assert_uint_eq(st->n_tensors, json_object_size(wm));
  const char *k;
  json_t *v;
  json_object_foreach(wm, k, v) ck_assert_msg(model_st_tensor(st, k) != NULL, "%s missing", k);
  for (size_t i = 1; i < st->n_tensors; i++) ck_assert(strcmp(st->tensors[i - 1].name, st->tensors[i].name) < 0);
  model_st_close(st);
  json_decref(idx);
}
END_TEST

START_TEST(missing_paths) {
  model_st_t *st;
  ck_assert_int_eq(model_st_open(&st, "/nonexistent/model.safetensors"), -ENOENT);
  ck_assert_ptr_null(st);
  FX_ASSERT_MSG("safetensors:");
  ck_assert_int_eq(model_st_open(&st, "/"), FR_ENOTFOUND); /* a folder without weights */
  FX_ASSERT_MSG("safetensors:");
}
END_TEST

START_TEST(every_truncation_fails) {
  size_t n;
  uint8_t *img = fx_slurp(fx_path("st_all.safetensors"), &n);
  for (size_t len = 0; len < n; len++) {
    uint8_t *cut = fx_exact(img, len);
    model_st_t *st = (model_st_t *)1;
    fr_error_clear();
    int rc = model_st_open_memory(&st, cut, len);
    ck_assert_msg(rc == FR_ETRUNCATED || rc == FR_EFORMAT, "len %zu: rc %d", len, rc);
    ck_assert_ptr_null(st);
    FX_ASSERT_MSG("safetensors:");
    free(cut);
  }
  free(img);
}
END_TEST

/* ---- hand-made headers ------------------------------------------------ */

/* Opens [u64 len][header][buf_len zero bytes]; checks the message on error. */
static int open_hdr(const char *header, size_t buf_len) {
  fx_buf_t b = {0};
  fx_u64(&b, strlen(header));
  fx_put(&b, header, strlen(header));
  fx_zeros(&b, buf_len);
  uint8_t *p = fx_exact(b.p, b.n);
  model_st_t *st = NULL;
  fr_error_clear();
  int rc = model_st_open_memory(&st, p, b.n);
  if (rc) {
    ck_assert_ptr_null(st);
    FX_ASSERT_MSG("safetensors:");
  }
  model_st_close(st);
  free(p);
  free(b.p);
  return rc;
}

#define E(name, dt, shape, b, e) "\"" name "\":{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":[" #b "," #e "]}"

START_TEST(valid_headers) {
  ck_assert_int_eq(open_hdr("{}", 0), 0);
  ck_assert_int_eq(open_hdr("{" E("a", "F32", "[2,2]", 0, 16) "}", 16), 0);
  ck_assert_int_eq(open_hdr("{\"__metadata__\":{\"x\":\"y\"}," E("a", "F16", "[3]", 0, 6) "," E("b", "I64", "[]", 6, 14)
                            "," E("c", "U8", "[0,5]", 14, 14) "}", 14), 0);
  ck_assert_int_eq(open_hdr("{" E("b", "F32", "[1]", 4, 8) "," E("a", "F32", "[1]", 0, 4) "}   ", 8), 0);
}
END_TEST

START_TEST(bad_lengths) {
  fx_buf_t b = {0};
  model_st_t *st;
  fx_u64(&b, 1000); /* header length past EOF */
  fx_put(&b, "{}", 2);
  ck_assert_int_eq(model_st_open_memory(&st, b.p, b.n), FR_ETRUNCATED);
  FX_ASSERT_MSG("safetensors:");
  b.n = 0;
  fx_u64(&b, UINT64_MAX);
  fx_put(&b, "{}", 2);
  ck_assert_int_eq(model_st_open_memory(&st, b.p, b.n), FR_ETOOBIG);
  b.n = 0;
  fx_u64(&b, 100000001ull); /* just over 100 MB */
  ck_assert_int_eq(model_st_open_memory(&st, b.p, b.n), FR_ETOOBIG);
  ck_assert_int_eq(model_st_open_memory(&st, b.p, 5), FR_ETRUNCATED);
  ck_assert_int_eq(model_st_open_memory(&st, NULL, 0), FR_ETRUNCATED);
  free(b.p);
}
END_TEST

START_TEST(bad_json) {
  ck_assert_int_eq(open_hdr("", 0), FR_EFORMAT);
  ck_assert_int_eq(open_hdr("{", 0), FR_EFORMAT);
  ck_assert_int_eq(open_hdr("[1,2]", 0), FR_EFORMAT);
  ck_assert_int_eq(open_hdr("{\"a\":}", 0), FR_EFORMAT);
  ck_assert_int_eq(open_hdr("{\"a\":1}", 0), FR_EFORMAT);
  ck_assert_int_eq(open_hdr("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4), FR_EFORMAT);
  ck_assert_int_eq(open_hdr("{\"a\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", 4), FR_EFORMAT);
  ck_assert_int_eq(open_hdr("{\"__metadata__\":{\"x\":1}}", 0), FR_EFORMAT);
  ck_assert_int_eq(open_hdr("{\"__metadata__\":[]}", 0), FR_EFORMAT);
  ck_assert_int_eq(open_hdr("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}\xff", 4), FR_EFORMAT);
}
END_TEST

START_TEST(bad_entries) {
  ck_assert_int_eq(open_hdr("{" E("a", "F32", "[2,4]", 0, 32) "}", 16), FR_ETRUNCATED);   /* past the buffer */
  ck_assert_int_eq(open_hdr("{" E("a", "F32", "[2,2]", 0, 12) "}", 12), FR_EFORMAT);      /* shape x dtype != span */
  ck_assert_int_eq(open_hdr("{" E("a", "F32", "[-2,2]", 0, 16) "}", 16), FR_EFORMAT);     /* negative dim */
  ck_assert_int_eq(open_hdr("{" E("a", "F32", "[2.5]", 0, 10) "}", 16), FR_EFORMAT);      /* non-integer dim */
  ck_assert_int_eq(open_hdr("{" E("a", "F32", "{}", 0, 16) "}", 16), FR_EFORMAT);         /* shape not a list */
  ck_assert_int_eq(open_hdr("{" E("a", "F32", "[1,1,1,1,1,1,1,1,1]", 0, 4) "}", 4), FR_EUNSUPPORTED);
  ck_assert_int_eq(open_hdr("{" E("a", "F32", "[4294967296,4294967296]", 0, 16) "}", 16), FR_EFORMAT);
  ck_assert_int_eq(open_hdr("{" E("a", "F32", "[4611686018427387904]", 0, 16) "}", 16), FR_EFORMAT);
  ck_assert_int_eq(open_hdr("{" E("a", "F32", "[1]", 8, 4) "}", 8), FR_EFORMAT);          /* begin > end */
  ck_assert_int_eq(open_hdr("{" E("a", "F32", "[1]", -4, 0) "}", 8), FR_EFORMAT);
  ck_assert_int_eq(open_hdr("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4), FR_EFORMAT);
  ck_assert_int_eq(open_hdr("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 4), FR_EFORMAT);
  ck_assert_int_eq(open_hdr("{" E("a", "Q4", "[1]", 0, 4) "}", 4), FR_EUNSUPPORTED);      /* unknown dtype */
  ck_assert_ptr_nonnull(strstr(fr_last_error(), "Q4"));
  ck_assert_int_eq(open_hdr("{" E("a", "F32", "[1]", 0, 4) "," E("a", "F32", "[1]", 4, 8) "}", 8), FR_EFORMAT);
}
END_TEST

START_TEST(bad_coverage) {
  /* overlap */
  ck_assert_int_eq(open_hdr("{" E("a", "F32", "[2]", 0, 8) "," E("b", "F32", "[2]", 4, 12) "}", 12), FR_EFORMAT);
  ck_assert_ptr_nonnull(strstr(fr_last_error(), "overlap"));
  /* the same span twice */
  ck_assert_int_eq(open_hdr("{" E("a", "F32", "[2]", 0, 8) "," E("b", "F32", "[2]", 0, 8) "}", 8), FR_EFORMAT);
  /* a gap before a tensor */
  ck_assert_int_eq(open_hdr("{" E("a", "F32", "[1]", 4, 8) "}", 8), FR_EFORMAT);
  /* bytes left after the last tensor */
  ck_assert_int_eq(open_hdr("{" E("a", "F32", "[1]", 0, 4) "}", 8), FR_EFORMAT);
}
END_TEST

/* ---- sharded folders built here --------------------------------------- */

static char tmpdir[256];

static void write_file(const char *name, const void *p, size_t n) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", tmpdir, name);
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(p, 1, n, f), n);
  fclose(f);
}

static void write_shard(const char *name, const char *header, size_t buf_len) {
  fx_buf_t b = {0};
  fx_u64(&b, strlen(header));
  fx_put(&b, header, strlen(header));
  fx_zeros(&b, buf_len);
  write_file(name, b.p, b.n);
  free(b.p);
}

static int open_dir_index(const char *index) {
  model_st_t *st = NULL;
  write_file("model.safetensors.index.json", index, strlen(index));
  fr_error_clear();
  int rc = model_st_open(&st, tmpdir);
  if (rc) {
    ck_assert_ptr_null(st);
    FX_ASSERT_MSG("safetensors:");
  }
  model_st_close(st);
  return rc;
}

START_TEST(sharded_errors) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/ferrum-st-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(tmpdir));
  write_shard("s1.safetensors", "{" E("a", "F32", "[1]", 0, 4) "}", 4);
  write_shard("s2.safetensors", "{" E("b", "F32", "[1]", 0, 4) "}", 4);
  write_shard("s3.safetensors", "{" E("a", "F32", "[1]", 0, 4) "}", 4);
  ck_assert_int_eq(open_dir_index("{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\"}}"), 0);
  /* a name listed in the wrong shard */
  ck_assert_int_eq(open_dir_index("{\"weight_map\":{\"a\":\"s2.safetensors\",\"b\":\"s1.safetensors\"}}"), FR_EFORMAT);
  /* the same tensor in two shards */
  ck_assert_int_eq(open_dir_index("{\"weight_map\":{\"a\":\"s1.safetensors\",\"x\":\"s3.safetensors\"}}"), FR_EFORMAT);
  /* a missing shard, a path outside the folder, a non-string, no weight_map */
  ck_assert_int_eq(open_dir_index("{\"weight_map\":{\"a\":\"nope.safetensors\"}}"), -ENOENT);
  ck_assert_int_eq(open_dir_index("{\"weight_map\":{\"a\":\"../s1.safetensors\"}}"), FR_EFORMAT);
  ck_assert_int_eq(open_dir_index("{\"weight_map\":{\"a\":\"sub/s1.safetensors\"}}"), FR_EFORMAT);
  ck_assert_int_eq(open_dir_index("{\"weight_map\":{\"a\":1}}"), FR_EFORMAT);
  ck_assert_int_eq(open_dir_index("{\"metadata\":{}}"), FR_EFORMAT);
  ck_assert_int_eq(open_dir_index("{\"weight_map\":"), FR_EFORMAT);
  /* a corrupt shard names its file */
  write_shard("s4.safetensors", "{" E("c", "F32", "[1]", 0, 8) "}", 8);
  ck_assert_int_eq(open_dir_index("{\"weight_map\":{\"c\":\"s4.safetensors\"}}"), FR_EFORMAT);
  ck_assert_ptr_nonnull(strstr(fr_last_error(), "s4.safetensors"));
  const char *names[] = {"s1.safetensors", "s2.safetensors", "s3.safetensors", "s4.safetensors",
                         "model.safetensors.index.json"};
  char path[512];
  for (size_t i = 0; i < FR_ARRAY_SIZE(names); i++) {
    snprintf(path, sizeof path, "%s/%s", tmpdir, names[i]);
    unlink(path);
  }
  rmdir(tmpdir);
}
END_TEST

static Suite *st_suite(void) {
  Suite *s = suite_create("safetensors");
  TCase *tc = tcase_create("safetensors");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, single_file_matches_writer);
  tcase_add_test(tc, hf_folder_single);
  tcase_add_test(tc, hf_folder_sharded);
  tcase_add_test(tc, missing_paths);
  tcase_add_test(tc, every_truncation_fails);
  tcase_add_test(tc, valid_headers);
  tcase_add_test(tc, bad_lengths);
  tcase_add_test(tc, bad_json);
  tcase_add_test(tc, bad_entries);
  tcase_add_test(tc, bad_coverage);
  tcase_add_test(tc, sharded_errors);
  suite_add_tcase(s, tc);
  return s;
}

/* The shared main (tests/common/test_main.c) runs this program's suites. */
#include "tests/common/test_main.h"

const test_prog_t test_prog = {.suites = {st_suite}};
