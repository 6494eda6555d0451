/* tok_test_util.h - helpers shared by the tokenizer test suites. */
#pragma once

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "model/gguf.h"
#include "model/tokenizer.h"

/* Reads a whole file into a NUL-terminated malloc'd buffer; NULL on error. */
static inline char *tt_read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    fclose(f);
    return NULL;
  }
  buf[n] = '\0';
  fclose(f);
  if (len) *len = (size_t)n;
  return buf;
}

static inline json_t *tt_load_json(const char *path) {
  json_error_t err;
  json_t *j = json_load_file(path, JSON_ALLOW_NUL, &err);
  if (!j) fprintf(stderr, "%s: %s (line %d)\n", path, err.text, err.line);
  return j;
}

/* Opens a tokenizer from a GGUF file (the gguf object stays open in *g). */
static inline model_tokenizer_t *tt_open_gguf(const char *path, model_gguf_t **g) {
  model_tokenizer_t *t = NULL;
  if (model_gguf_open(g, path)) {
    fprintf(stderr, "%s: %s\n", path, fr_last_error());
    return NULL;
  }
  if (model_tokenizer_from_gguf(&t, *g)) fprintf(stderr, "%s: %s\n", path, fr_last_error());
  return t;
}

static inline model_tokenizer_t *tt_open_json(const char *path) {
  char *text = tt_read_file(path, NULL);
  model_tokenizer_t *t = NULL;
  if (!text) return NULL;
  if (model_tokenizer_from_json(&t, text, NULL)) fprintf(stderr, "%s: %s\n", path, fr_last_error());
  free(text);
  return t;
}

/* The golden folder written by gen_tok_golden.py. */
static inline const char *tt_golden_dir(void) {
  static char dir[4096];
  const char *b = getenv("FERRUM_BUILD_DIR");
  snprintf(dir, sizeof(dir), "%s/tests/tok-golden", b ? b : "build");
  return dir;
}
