/* test_read.c - reading weight bytes from files: the io_uring reader
 * (common/fr_read.h) against the file's bytes, its errors, and the file
 * spans (fd, file_off) that model sources give for every tensor, read back
 * and compared with the mapped bytes. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fr_err.h"
#include "common/fr_read.h"
#include "common/fr_util.h"
#include "model/source.h"
#include "tests/common/test_main.h"
#include "tests/formats/fx.h"

#define FILE_BYTES ((size_t)3 << 20)

/* A temporary file of FILE_BYTES pseudo-random bytes (also in *bytes, owned). */
static int make_file(uint8_t **bytes) {
  char path[] = "/tmp/ferrum-read-XXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  unlink(path);
  uint8_t *b = fr_malloc(FILE_BYTES);
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < FILE_BYTES; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    b[i] = (uint8_t)x;
  }
  ck_assert_int_eq(write(fd, b, FILE_BYTES), (ssize_t)FILE_BYTES);
  *bytes = b;
  return fd;
}

/* Reads in many pieces (4 KiB, 8 in flight), at odd offsets and lengths,
 * in two batches interleaved; every byte lands where it should. */
START_TEST(reads_match_the_file) {
  uint8_t *want, *got = fr_calloc(1, FILE_BYTES);
  int fd = make_file(&want);
  fr_reader_t *r = fr_reader_create(8, 4096);
  fr_read_batch_t a = {0, 0}, b = {0, 0};
  const size_t cut = 1234567, tail = 77;
  ck_assert_int_eq(fr_reader_read(r, fd, 0, got, cut, &a), 0);
  ck_assert_int_eq(fr_reader_read(r, fd, cut, got + cut, FILE_BYTES - cut - tail, &b), 0);
  ck_assert_int_eq(fr_reader_read(r, fd, FILE_BYTES - tail, got + FILE_BYTES - tail, tail, &a), 0);
  ck_assert_int_eq(fr_reader_wait(r, &b), 0);
  ck_assert_int_eq(fr_reader_wait(r, &a), 0);
  ck_assert_int_eq(a.pending + b.pending, 0);
  ck_assert(memcmp(got, want, FILE_BYTES) == 0);
  /* the defaults (2 MiB pieces) and a zero-length read */
  fr_reader_destroy(r);
  r = fr_reader_create(0, 0);
  memset(got, 0, FILE_BYTES);
  fr_read_batch_t c = {0, 0};
  ck_assert_int_eq(fr_reader_read(r, fd, 5, got, FILE_BYTES - 5, &c), 0);
  ck_assert_int_eq(fr_reader_read(r, fd, 0, got, 0, &c), 0);
  ck_assert_int_eq(fr_reader_wait(r, &c), 0);
  ck_assert(memcmp(got, want + 5, FILE_BYTES - 5) == 0);
  if (!fr_reader_async(r)) fprintf(stderr, "test_read: no io_uring here, the pread fallback was tested\n");
  fr_reader_destroy(r);
  close(fd);
  free(want);
  free(got);
}
END_TEST

/* Past the end of the file: FR_ETRUNCATED; a closed descriptor: -EBADF.
 * An error stays with its batch; the reader goes on. */
START_TEST(read_errors) {
  uint8_t *want, *got = fr_malloc(FILE_BYTES);
  int fd = make_file(&want);
  fr_reader_t *r = fr_reader_create(4, 65536);
  fr_read_batch_t past = {0, 0}, bad = {0, 0}, good = {0, 0};
  fr_reader_read(r, fd, FILE_BYTES - 100, got, 200, &past);
  ck_assert_int_eq(fr_reader_wait(r, &past), FR_ETRUNCATED);
  int closed = dup(fd);
  close(closed);
  fr_reader_read(r, closed, 0, got, 4096, &bad);
  ck_assert_int_eq(fr_reader_wait(r, &bad), -EBADF);
  ck_assert_int_eq(fr_reader_read(r, fd, 0, got, FILE_BYTES, &good), 0);
  ck_assert_int_eq(fr_reader_wait(r, &good), 0);
  ck_assert(memcmp(got, want, FILE_BYTES) == 0);
  fr_reader_destroy(r);
  close(fd);
  free(want);
  free(got);
}
END_TEST

/* Every tensor of a source, read from (fd, file_off) through the reader,
 * equals its mapped bytes. */
static void expect_spans(const char *path) {
  model_source_t *s = NULL;
  ck_assert_msg(model_source_open(&s, path) == 0, "%s: %s", path, fr_last_error());
  fr_reader_t *r = fr_reader_create(0, 4096);
  for (size_t i = 0; i < s->n_tensors; i++) {
    const model_tensor_t *t = &s->tensors[i];
    size_t bytes = (size_t)t->rows * kern_row_bytes(t->type, t->cols);
    ck_assert_msg(t->fd >= 0, "%s: %s has no file", path, t->name);
    uint8_t *got = fr_malloc(bytes);
    fr_read_batch_t b = {0, 0};
    fr_reader_read(r, t->fd, t->file_off, got, bytes, &b);
    ck_assert_int_eq(fr_reader_wait(r, &b), 0);
    ck_assert_msg(memcmp(got, t->data, bytes) == 0, "%s: %s differs at its file offset", path, t->name);
    free(got);
  }
  fr_reader_destroy(r);
  model_source_close(s);
}

START_TEST(source_spans) {
  expect_spans(fx_path("tiny_llama.gguf"));
  expect_spans(fx_path("hf_llama"));
  expect_spans(fx_path("hf_qwen2")); /* sharded: tensors of two files */
}
END_TEST

static Suite *read_suite(void) {
  Suite *su = suite_create("read");
  TCase *tc = tcase_create("read");
  tcase_add_test(tc, reads_match_the_file);
  tcase_add_test(tc, read_errors);
  tcase_add_test(tc, source_spans);
  suite_add_tcase(su, tc);
  return su;
}

const test_prog_t test_prog = {.suites = {read_suite}};
