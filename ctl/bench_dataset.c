/* bench_dataset.c - ShareGPT prompts for `ferrumctl bench` (bench_dataset.h). */
#include "ctl/bench_dataset.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "model/source.h"
#include "model/tokenizer.h"

/* vLLM's is_valid_sequence limits. */
#define SHAREGPT_MIN_LEN 4
#define SHAREGPT_MAX_PROMPT 1024
#define SHAREGPT_MAX_TOTAL 2048

static uint64_t ds_rand(uint64_t *s) { /* splitmix64, as the random dataset */
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Fisher-Yates over idx[0..n). */
static void ds_shuffle(size_t *idx, size_t n, uint64_t seed) {
  uint64_t s = seed * 2654435761u + 7;
  for (size_t i = n; i > 1; i--) {
    size_t j = (size_t)(ds_rand(&s) % i), t = idx[i - 1];
    idx[i - 1] = idx[j], idx[j] = t;
  }
}

static int ds_tokenizer(const char *model, model_source_t **src, model_tokenizer_t **tok) {
  int rc = model_source_open(src, model);
  if (rc) return rc;
  if ((*src)->gguf) return model_tokenizer_from_gguf(tok, (*src)->gguf);
  if ((*src)->tokenizer_json)
    return model_tokenizer_from_json_files(tok, (*src)->tokenizer_json, (*src)->tokenizer_config_json);
  return fr_errorf(FR_ENOTFOUND, "%s has no tokenizer (give --tokenizer)", model);
}

/* The "value" text of turn k of a ShareGPT entry, or NULL. */
static const char *ds_turn(json_t *entry, size_t k, size_t *len) {
  json_t *conv = json_object_get(entry, "conversations");
  json_t *v = json_object_get(json_array_get(conv, k), "value");
  *len = json_string_length(v);
  return json_string_value(v);
}

/* Tokenizes one entry's prompt and answer into *s; false when the entry is
 * malformed or outside vLLM's limits. */
static bool ds_sample(const model_tokenizer_t *tok, json_t *entry, long out_len, bench_sample_t *s) {
  size_t plen, alen;
  const char *p = ds_turn(entry, 0, &plen), *a = ds_turn(entry, 1, &alen);
  if (!p || !a) return false;
  int32_t *ids = NULL, *aids = NULL;
  size_t n = 0, na = 0;
  if (model_tokenize(tok, p, plen, true, false, &ids, &n)) return false;
  if (out_len <= 0 && model_tokenize(tok, a, alen, true, false, &aids, &na)) {
    free(ids);
    return false;
  }
  free(aids);
  long o = out_len > 0 ? out_len : (long)na;
  bool ok = n >= SHAREGPT_MIN_LEN && (out_len > 0 || o >= SHAREGPT_MIN_LEN) && n <= SHAREGPT_MAX_PROMPT &&
            (long)n + o <= SHAREGPT_MAX_TOTAL;
  if (!ok) {
    free(ids);
    return false;
  }
  *s = (bench_sample_t){.ids = ids, .in_len = (long)n, .out_len = o};
  return true;
}

/* Copies sample k (ids duplicated). */
static bench_sample_t ds_copy(const bench_sample_t *k) {
  bench_sample_t c = *k;
  c.ids = fr_malloc((size_t)k->in_len * sizeof *c.ids);
  memcpy(c.ids, k->ids, (size_t)k->in_len * sizeof *c.ids);
  return c;
}

int bench_sharegpt_load(const char *path, const char *tokenizer_model, long n, uint64_t seed, long out_len,
                        bench_sample_t **out) {
  *out = NULL;
  json_error_t jerr;
  json_t *root = json_load_file(path, JSON_ALLOW_NUL, &jerr);
  if (!root) return fr_errorf(FR_EFORMAT, "%s: line %d: %s", path, jerr.line, jerr.text);
  if (!json_is_array(root)) {
    json_decref(root);
    return fr_errorf(FR_EFORMAT, "%s: not a ShareGPT file (a JSON array of {\"conversations\": [...]})", path);
  }
  model_source_t *src = NULL;
  model_tokenizer_t *tok = NULL;
  int rc = ds_tokenizer(tokenizer_model, &src, &tok);
  size_t total = json_array_size(root), *idx = fr_malloc((total + 1) * sizeof *idx), m = 0;
  for (size_t i = 0; i < total; i++)
    if (json_array_size(json_object_get(json_array_get(root, i), "conversations")) >= 2) idx[m++] = i;
  ds_shuffle(idx, m, seed);
  bench_sample_t *s = fr_calloc((size_t)n, sizeof *s);
  long got = 0;
  for (size_t i = 0; !rc && i < m && got < n; i++) got += ds_sample(tok, json_array_get(root, idx[i]), out_len, &s[got]);
  if (!rc && got == 0) rc = fr_errorf(FR_EFORMAT, "%s: no conversation fits (prompt 4..1024 tokens, total <= 2048)", path);
  for (long i = got; !rc && i < n; i++) s[i] = ds_copy(&s[i % got]); /* oversample */
  free(idx);
  model_tokenizer_destroy(tok);
  model_source_close(src);
  json_decref(root);
  if (rc) {
    bench_samples_free(s, got);
    return rc;
  }
  *out = s;
  return 0;
}

void bench_samples_free(bench_sample_t *s, long n) {
  if (!s) return;
  for (long i = 0; i < n; i++) free(s[i].ids);
  free(s);
}
