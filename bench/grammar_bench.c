/* grammar_bench.c - constrained decoding's cost: the time to build one
 * token mask (model_grammar_mask) over a model's vocabulary, in the
 * states a JSON answer passes through (before the object, in a key, in a
 * free string, in a number, after a value) and for a regex, and the
 * schema compile time. Results: docs/bench/structured-output.md.
 *   grammar_bench MODEL.gguf|tokenizer.json [ROUNDS]
 * (a ~150k vocabulary: bench/qwen_vocab.py writes Qwen's as a tokenizer.json)
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "model/gguf.h"
#include "model/grammar.h"
#include "model/tokenizer.h"

static const char schema[] =
    "{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"}, \"age\": {\"type\": \"integer\"}, "
    "\"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}}, \"address\": {\"type\": \"object\", "
    "\"properties\": {\"city\": {\"type\": \"string\"}, \"zip\": {\"enum\": [\"10001\", \"94105\"]}}, \"required\": "
    "[\"city\", \"zip\"]}}, \"required\": [\"name\", \"age\", \"tags\", \"address\"]}";

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

/* One state: the mask over v after the prefix, each of rounds timed; the
 * median and the 90th percentile (the machine may be shared: a mean would
 * carry every preemption). */
static void bench_state(const char *what, const model_grammar_t *g, const char *prefix, const model_gvocab_t *v,
                        int rounds, model_gstate_t *s, model_gscratch_t *scratch, uint32_t *mask) {
  model_gstate_init(g, s);
  if (!model_gstate_feed(g, s, prefix, strlen(prefix))) {
    printf("%-34s  (prefix refused)\n", what);
    return;
  }
  size_t n = 0;
  uint64_t *ns = fr_malloc((size_t)rounds * sizeof *ns);
  for (int r = 0; r < rounds; r++) {
    uint64_t t0 = fr_now_ns();
    n = model_grammar_mask(g, s, v, mask, scratch);
    ns[r] = fr_now_ns() - t0;
  }
  qsort(ns, (size_t)rounds, sizeof *ns, cmp_u64);
  printf("%-34s %9.1f us  %9.1f us  %7zu tokens allowed\n", what, (double)ns[rounds / 2] / 1e3,
         (double)ns[rounds * 9 / 10] / 1e3, n);
  free(ns);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s MODEL.gguf|tokenizer.json [ROUNDS]\n", argv[0]);
    return 2;
  }
  int rounds = argc > 2 ? atoi(argv[2]) : 50;
  if (rounds < 1) rounds = 1;
  model_gguf_t *gg = NULL;
  model_tokenizer_t *tok = NULL;
  size_t pl = strlen(argv[1]);
  bool json = pl > 5 && !strcmp(argv[1] + pl - 5, ".json");
  if (json ? model_tokenizer_from_json_files(&tok, argv[1], NULL)
           : model_gguf_open(&gg, argv[1]) || model_tokenizer_from_gguf(&tok, gg)) {
    fprintf(stderr, "%s: %s\n", argv[1], fr_last_error());
    return 1;
  }
  int n_vocab = model_vocab_size(tok);
  model_gvocab_t *v = NULL;
  uint64_t t0 = fr_now_ns();
  if (model_gvocab_create(&v, tok, n_vocab)) return 1;
  printf("vocabulary: %d tokens, token table built in %.1f ms\n", n_vocab, (double)(fr_now_ns() - t0) / 1e6);
  model_grammar_t *js = NULL, *any = NULL, *re = NULL;
  t0 = fr_now_ns();
  for (int i = 0; i < 100; i++) {
    model_grammar_destroy(js);
    if (model_grammar_json(&js, schema, strlen(schema), NULL, 0)) return 1;
  }
  printf("schema compile: %.1f us\n", (double)(fr_now_ns() - t0) / 1e3 / 100);
  static const char phone[] = "\\(\\d{3}\\) \\d{3}-\\d{4}";
  if (model_grammar_json(&any, NULL, 0, NULL, 0) || model_grammar_regex(&re, phone, strlen(phone), NULL, 0)) return 1;
  model_gstate_t *s = fr_malloc(sizeof *s);
  model_gscratch_t *sc = NULL;
  if (model_gscratch_create(&sc, v)) return 1;
  uint32_t *mask = fr_malloc(model_gvocab_words(v) * sizeof *mask);
  printf("mask per token (%d rounds):            median         p90\n", rounds);
  bench_state("json_object: start", any, "", v, rounds, s, sc, mask);
  bench_state("json_object: in a string value", any, "{\"note\": \"a", v, rounds, s, sc, mask);
  bench_state("schema: start", js, "", v, rounds, s, sc, mask);
  bench_state("schema: in a key", js, "{\"na", v, rounds, s, sc, mask);
  bench_state("schema: in a free string", js, "{\"name\": \"Jo", v, rounds, s, sc, mask);
  bench_state("schema: in an integer", js, "{\"name\": \"Jo\", \"age\": 4", v, rounds, s, sc, mask);
  bench_state("schema: after a value", js, "{\"name\": \"Jo\", \"age\": 41", v, rounds, s, sc, mask);
  bench_state("schema: in an enum", js, "{\"name\": \"Jo\", \"age\": 41, \"tags\": [], \"address\": {\"city\": "
              "\"X\", \"zip\": \"1", v, rounds, s, sc, mask);
  bench_state("regex: phone, after 3 bytes", re, "(55", v, rounds, s, sc, mask);
  free(mask), free(s);
  model_gscratch_destroy(sc);
  model_grammar_destroy(js), model_grammar_destroy(any), model_grammar_destroy(re);
  model_gvocab_destroy(v);
  model_tokenizer_destroy(tok);
  model_gguf_close(gg);
  return 0;
}
