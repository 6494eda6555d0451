/* fx.h - helpers shared by the formats tests: fixture paths, whole-file
 * reads, and a little byte builder for hand-made (corrupt) GGUF and
 * safetensors images. Test-only code. */
#pragma once

#include <check.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fr_err.h"

/* Path of a fixture written by make_fixtures.py. */
static inline const char *fx_path(const char *name) {
  static char buf[4096], cwd[2048];
  const char *b = getenv("FERRUM_BUILD_DIR"); /* set by ctest; else run from the build folder */
  if (!b) b = getcwd(cwd, sizeof cwd) ? cwd : ".";
  snprintf(buf, sizeof buf, "%s/tests/formats-fixtures/%s", b, name);
  return buf;
}

/* Reads a whole file (malloc'd); aborts the test when it cannot. */
static inline uint8_t *fx_slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "cannot open fixture %s (run the formats_fixtures test first)", path);
  fseek(f, 0, SEEK_END);
  long sz = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *p = malloc(sz > 0 ? (size_t)sz : 1);
  ck_assert(fread(p, 1, (size_t)sz, f) == (size_t)sz);
  fclose(f);
  *n = (size_t)sz;
  return p;
}

static inline json_t *fx_json(const char *name) {
  json_error_t e;
  json_t *j = json_load_file(fx_path(name), 0, &e);
  ck_assert_msg(j != NULL, "%s: %s", name, e.text);
  return j;
}

/* A growable byte buffer. */
typedef struct {
  uint8_t *p;
  size_t n, cap;
} fx_buf_t;

static inline void fx_put(fx_buf_t *b, const void *d, size_t n) {
  if (!n) return;
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2 + 64;
    b->p = realloc(b->p, b->cap);
  }
  memcpy(b->p + b->n, d, n);
  b->n += n;
}
static inline void fx_u8(fx_buf_t *b, uint8_t v) { fx_put(b, &v, 1); }
static inline void fx_u32(fx_buf_t *b, uint32_t v) { fx_put(b, &v, 4); }
static inline void fx_u64(fx_buf_t *b, uint64_t v) { fx_put(b, &v, 8); }
static inline void fx_str(fx_buf_t *b, const char *s) {
  fx_u64(b, strlen(s));
  fx_put(b, s, strlen(s));
}
static inline void fx_zeros(fx_buf_t *b, size_t n) {
  for (size_t i = 0; i < n; i++) fx_u8(b, 0);
}
static inline void fx_pad(fx_buf_t *b, size_t align) {
  while (b->n % align) fx_u8(b, 0);
}

/* GGUF pieces: header, scalar keys (value type ids as in gguf.h). */
static inline void fx_gguf_header(fx_buf_t *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
  fx_put(b, "GGUF", 4);
  fx_u32(b, version);
  fx_u64(b, n_tensors);
  fx_u64(b, n_kv);
}
static inline void fx_gguf_kv_u32(fx_buf_t *b, const char *key, uint32_t v) {
  fx_str(b, key);
  fx_u32(b, 4 /* GGUF_T_UINT32 */);
  fx_u32(b, v);
}
static inline void fx_gguf_kv_f32(fx_buf_t *b, const char *key, float v) {
  fx_str(b, key);
  fx_u32(b, 6 /* GGUF_T_FLOAT32 */);
  fx_put(b, &v, 4);
}
static inline void fx_gguf_kv_str(fx_buf_t *b, const char *key, const char *v) {
  fx_str(b, key);
  fx_u32(b, 8 /* GGUF_T_STRING */);
  fx_str(b, v);
}

/* Copies n bytes into an exact-size allocation so that ASan sees any read
 * past the end. */
static inline uint8_t *fx_exact(const void *p, size_t n) {
  uint8_t *q = malloc(n ? n : 1);
  if (n) memcpy(q, p, n);
  return q;
}

/* The error detail must be ours (prefix), not the generic fallback. */
#define FX_ASSERT_MSG(prefix)                                                     \
  ck_assert_msg(strncmp(fr_last_error(), prefix, strlen(prefix)) == 0,              \
                "expected a '%s' message, got '%s'", prefix, fr_last_error())
