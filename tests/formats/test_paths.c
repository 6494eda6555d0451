/* test_paths.c - what the model readers do with paths that are not what
 * they expect: a FIFO (whose plain open() would block until a writer
 * comes), a character device, a folder where a file belongs, a file where
 * a folder belongs. Each reader answers at once with "... is not a regular
 * file" (or "... is not a folder"); an alarm turns a reader that blocks
 * into a failure instead of a hang. Symlinks to real files still work. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "model/config.h"
#include "model/gguf.h"
#include "model/safetensors.h"
#include "model/source.h"
#include "model/tokenizer.h"
#include "tests/common/test_main.h"
#include "tests/formats/fx.h"

#define GUARD_S 5 /* a reader that blocks this long fails the test (SIGALRM) */

static char dir[64];

static const char *in_dir(const char *name) {
  static char p[4][128];
  static int k;
  k = (k + 1) % 4;
  snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
  return p[k];
}

static void setup(void) {
  snprintf(dir, sizeof dir, "/tmp/ferrum-paths-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(dir));
  signal(SIGALRM, SIG_DFL); /* not Check's handler: the test dies of the alarm */
  alarm(GUARD_S);
}

/* Removes what the tests put in dir (files, FIFOs, links, empty folders). */
static void teardown(void) {
  static const char *names[] = {"m.gguf", "m.safetensors", "model.safetensors", "model.safetensors.index.json",
                                "config.json", "tokenizer.json", "tokenizer_config.json", "link.gguf"};
  alarm(0);
  for (size_t i = 0; i < FR_ARRAY_SIZE(names); i++) {
    const char *p = in_dir(names[i]);
    if (unlink(p) != 0) rmdir(p);
  }
  rmdir(dir);
}

static void fifo(const char *name) { ck_assert_int_eq(mkfifo(in_dir(name), 0600), 0); }
static void folder(const char *name) { ck_assert_int_eq(mkdir(in_dir(name), 0700), 0); }
static void link_to(const char *name, const char *target) { ck_assert_int_eq(symlink(target, in_dir(name)), 0); }

/* rc must be FR_EFORMAT with a message that says what path is not. */
static void expect_not(int rc, const char *path, const char *what) {
  char want[256];
  snprintf(want, sizeof want, "%s is not %s", path, what);
  ck_assert_msg(rc == FR_EFORMAT, "rc %d (%s), want FR_EFORMAT", rc, fr_last_error());
  ck_assert_msg(strstr(fr_last_error(), want) != NULL, "got '%s', want '%s'", fr_last_error(), want);
}

START_TEST(fifo_is_refused_by_every_reader) {
  model_gguf_t *g = NULL;
  model_st_t *st = NULL;
  model_source_t *s = NULL;
  model_tokenizer_t *t = NULL;
  model_config_t c;
  fifo("m.gguf");
  expect_not(model_gguf_open(&g, in_dir("m.gguf")), in_dir("m.gguf"), "a regular file");
  ck_assert_ptr_null(g);
  FX_ASSERT_MSG("gguf: ");
  expect_not(model_source_open(&s, in_dir("m.gguf")), in_dir("m.gguf"), "a regular file or a folder");
  ck_assert_ptr_null(s);
  fifo("m.safetensors");
  expect_not(model_st_open(&st, in_dir("m.safetensors")), in_dir("m.safetensors"), "a regular file or a folder");
  ck_assert_ptr_null(st);
  FX_ASSERT_MSG("safetensors: ");
  fifo("config.json");
  expect_not(model_config_from_hf_json(&c, in_dir("config.json")), in_dir("config.json"), "a regular file");
  fifo("tokenizer.json");
  expect_not(model_tokenizer_from_json_files(&t, in_dir("tokenizer.json"), NULL), in_dir("tokenizer.json"),
             "a regular file");
  ck_assert_ptr_null(t);
  expect_not(model_tokenizer_from_json_files(&t, fx_path("hf_llama/tokenizer.json"), in_dir("config.json")),
             in_dir("config.json"), "a regular file");
  ck_assert_ptr_null(t);
}
END_TEST

START_TEST(char_device_is_refused) {
  model_gguf_t *g = NULL;
  model_source_t *s = NULL;
  model_st_t *st = NULL;
  expect_not(model_gguf_open(&g, "/dev/null"), "/dev/null", "a regular file");
  expect_not(model_source_open(&s, "/dev/zero"), "/dev/zero", "a regular file or a folder");
  expect_not(model_st_open(&st, "/dev/zero"), "/dev/zero", "a regular file or a folder");
  ck_assert(g == NULL && s == NULL && st == NULL);
}
END_TEST

START_TEST(folder_where_a_file_belongs) {
  model_gguf_t *g = NULL;
  model_config_t c;
  model_tokenizer_t *t = NULL;
  expect_not(model_gguf_open(&g, dir), dir, "a regular file");
  folder("config.json");
  expect_not(model_config_from_hf_json(&c, in_dir("config.json")), in_dir("config.json"), "a regular file");
  expect_not(model_tokenizer_from_json_files(&t, dir, NULL), dir, "a regular file");
  ck_assert(g == NULL && t == NULL);
}
END_TEST

/* An HF folder of links to hf_llama's files, with one entry replaced by a
 * FIFO or a folder: the source refuses it by name. */
static void hf_folder(const char *odd, bool as_fifo) {
  static const char *files[] = {"config.json", "model.safetensors", "tokenizer.json"};
  for (size_t i = 0; i < FR_ARRAY_SIZE(files); i++) {
    char target[4200];
    snprintf(target, sizeof target, "%s/%s", fx_path("hf_llama"), files[i]);
    if (strcmp(files[i], odd) != 0) link_to(files[i], target);
  }
  if (as_fifo) fifo(odd);
  else folder(odd);
}

START_TEST(hf_folder_with_a_fifo) {
  static const char *odd[] = {"config.json", "model.safetensors", "tokenizer.json"};
  const char *name = odd[_i / 2];
  model_source_t *s = NULL;
  hf_folder(name, _i % 2 == 0);
  expect_not(model_source_open(&s, dir), in_dir(name), "a regular file");
  ck_assert_ptr_null(s);
}
END_TEST

START_TEST(hf_folder_entries_that_are_not_files) {
  model_source_t *s = NULL;
  model_st_t *st = NULL;
  hf_folder("tokenizer_config.json", true); /* optional, but present: must be a file */
  expect_not(model_source_open(&s, dir), in_dir("tokenizer_config.json"), "a regular file");
  expect_not(model_source_open_config(&s, dir), in_dir("tokenizer_config.json"), "a regular file");
  ck_assert_int_eq(unlink(in_dir("model.safetensors")), 0);
  fifo("model.safetensors.index.json");
  expect_not(model_st_open(&st, dir), in_dir("model.safetensors.index.json"), "a regular file");
  ck_assert(s == NULL && st == NULL);
}
END_TEST

START_TEST(file_where_a_folder_belongs) {
  model_source_t *s = NULL;
  expect_not(model_source_open_config(&s, fx_path("hf_llama/config.json")), fx_path("hf_llama/config.json"),
             "a folder");
  fifo("m.gguf");
  expect_not(model_source_open_config(&s, in_dir("m.gguf")), in_dir("m.gguf"), "a folder");
  ck_assert_ptr_null(s);
}
END_TEST

START_TEST(symlinks_are_followed) {
  model_source_t *s = NULL;
  link_to("link.gguf", fx_path("tiny_llama.gguf"));
  ck_assert_msg(model_source_open(&s, in_dir("link.gguf")) == 0, "%s", fr_last_error());
  ck_assert_int_eq(s->config.arch, MODEL_ARCH_LLAMA);
  model_source_close(s);
  hf_folder("tokenizer_config.json", false);
  ck_assert_int_eq(rmdir(in_dir("tokenizer_config.json")), 0); /* a folder of links, nothing odd */
  ck_assert_msg(model_source_open(&s, dir) == 0, "%s", fr_last_error());
  ck_assert_ptr_nonnull(s->tokenizer_json);
  model_tokenizer_t *t = NULL; /* the fixture's tokenizer.json has no model: read, then refused */
  ck_assert_int_eq(model_tokenizer_from_json_files(&t, s->tokenizer_json, NULL), FR_EFORMAT);
  ck_assert_str_eq(fr_last_error(), "tokenizer.json: no model object");
  model_source_close(s);
}
END_TEST

static Suite *paths_suite(void) {
  Suite *su = suite_create("paths");
  TCase *tc = tcase_create("paths");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, fifo_is_refused_by_every_reader);
  tcase_add_test(tc, char_device_is_refused);
  tcase_add_test(tc, folder_where_a_file_belongs);
  tcase_add_loop_test(tc, hf_folder_with_a_fifo, 0, 6);
  tcase_add_test(tc, hf_folder_entries_that_are_not_files);
  tcase_add_test(tc, file_where_a_folder_belongs);
  tcase_add_test(tc, symlinks_are_followed);
  suite_add_tcase(su, tc);
  return su;
}

const test_prog_t test_prog = {.suites = {paths_suite}};
