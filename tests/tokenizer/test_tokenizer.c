/* test_tokenizer.c - tokenizers against llama.cpp and HF tokenizers goldens
 * (gen_tok_golden.py), round trips, the streaming detokenizer, and
 * tokenizer.json error handling. */
#include <check.h>
#include <stdint.h>
#include <unistd.h>

#include "common/fr_util.h"
#include "tok_test_util.h"

static json_t *g_golden;
static json_t *g_corpus;

static void load_goldens(void) {
  if (g_golden) return;
  char path[4200];
  snprintf(path, sizeof(path), "%s/golden.json", tt_golden_dir());
  g_golden = tt_load_json(path);
  ck_assert_msg(g_golden != NULL, "no goldens at %s (run gen_tok_golden.py)", path);
  const char *cp = json_string_value(json_object_get(g_golden, "corpus"));
  g_corpus = tt_load_json(cp);
  ck_assert_ptr_nonnull(g_corpus);
}

static bool ids_equal(const int32_t *ids, size_t n, json_t *want) {
  if (json_array_size(want) != n) return false;
  for (size_t i = 0; i < n; i++)
    if (json_integer_value(json_array_get(want, i)) != ids[i]) return false;
  return true;
}

static void print_mismatch(const char *variant, const char *ref, size_t k, const char *s, const int32_t *ids,
                           size_t n, json_t *want) {
  fprintf(stderr, "[%s vs %s] string %zu \"%.60s\":\n  got ", variant, ref, k, s);
  for (size_t i = 0; i < n && i < 40; i++) fprintf(stderr, "%d ", ids[i]);
  fprintf(stderr, "\n  want ");
  for (size_t i = 0; i < json_array_size(want) && i < 40; i++)
    fprintf(stderr, "%lld ", (long long)json_integer_value(json_array_get(want, i)));
  fprintf(stderr, "\n");
}

/* Compares every corpus string, both parse_special modes; returns mismatches. */
static int compare_ref(const model_tokenizer_t *t, const char *variant, const char *ref, json_t *r) {
  int bad = 0;
  static const char *const keys[2] = {"plain", "special"};
  for (int mode = 0; mode < 2; mode++) {
    json_t *want_all = json_object_get(r, keys[mode]);
    ck_assert_uint_eq(json_array_size(want_all), json_array_size(g_corpus));
    for (size_t k = 0; k < json_array_size(g_corpus); k++) {
      json_t *js = json_array_get(g_corpus, k);
      const char *s = json_string_value(js);
      int32_t *ids;
      size_t n;
      ck_assert_int_eq(model_tokenize(t, s, json_string_length(js), false, mode == 1, &ids, &n), 0);
      if (!ids_equal(ids, n, json_array_get(want_all, k))) {
        if (bad++ < 5) print_mismatch(variant, ref, k, s, ids, n, json_array_get(want_all, k));
      }
      free(ids);
    }
  }
  return bad;
}

static int roundtrip(const model_tokenizer_t *t, json_t *v) {
  json_t *l = json_object_get(v, "llama"), *h = json_object_get(v, "hf");
  json_t *lr = json_is_object(l) ? json_object_get(l, "roundtrip") : NULL;
  json_t *hr = json_is_object(h) ? json_object_get(h, "roundtrip") : NULL;
  int bad = 0, checked = 0;
  for (size_t k = 0; k < json_array_size(g_corpus); k++) {
    if ((lr && !json_is_true(json_array_get(lr, k))) || (hr && !json_is_true(json_array_get(hr, k)))) continue;
    json_t *js = json_array_get(g_corpus, k);
    const char *s = json_string_value(js);
    size_t len = json_string_length(js), n;
    int32_t *ids;
    ck_assert_int_eq(model_tokenize(t, s, len, false, false, &ids, &n), 0);
    char *back = model_detokenize(t, ids, n, false);
    if (memchr(s, 0, len)) { /* embedded NUL: the C string result cannot show it */
      free(back);
      free(ids);
      continue;
    }
    if (strlen(back) != len || memcmp(back, s, len)) {
      if (bad++ < 5) fprintf(stderr, "round trip %zu: \"%.60s\" -> \"%.60s\"\n", k, s, back);
    }
    checked++;
    free(back);
    free(ids);
  }
  ck_assert_int_gt(checked, 300);
  return bad;
}

static void check_variant(const char *name) {
  load_goldens();
  json_t *v = json_object_get(json_object_get(g_golden, "variants"), name);
  ck_assert_ptr_nonnull(v);
  const char *gp = json_string_value(json_object_get(v, "gguf"));
  const char *jp = json_string_value(json_object_get(v, "json"));
  int bad = 0;
  /* WordPiece lowercases and drops accents: no round trip; its GGUF is
   * compared with HF's ids of the same vocabulary */
  bool rt = !json_is_false(json_object_get(v, "roundtrip"));
  json_t *gref = json_object_get(v, "llama");
  if (gp) {
    model_gguf_t *g = NULL;
    model_tokenizer_t *t = tt_open_gguf(gp, &g);
    ck_assert_ptr_nonnull(t);
    bad += json_is_object(gref) ? compare_ref(t, name, "llama.cpp", gref)
                                : compare_ref(t, name, "HF tokenizers", json_object_get(v, "hf"));
    if (rt) bad += roundtrip(t, v);
    model_tokenizer_destroy(t);
    model_gguf_close(g);
  }
  if (jp) {
    model_tokenizer_t *t = tt_open_json(jp);
    ck_assert_ptr_nonnull(t);
    bad += compare_ref(t, name, "HF tokenizers", json_object_get(v, "hf"));
    if (rt) bad += roundtrip(t, v);
    model_tokenizer_destroy(t);
  }
  ck_assert_msg(bad == 0, "%s: %d mismatches", name, bad);
}

START_TEST(golden_smollm) { check_variant("smollm"); }
END_TEST
START_TEST(golden_gpt2) { check_variant("gpt2"); }
END_TEST
START_TEST(golden_llama3) { check_variant("llama3"); }
END_TEST
START_TEST(golden_qwen2) { check_variant("qwen2"); }
END_TEST
START_TEST(golden_spm) { check_variant("spm"); }
END_TEST
START_TEST(golden_spm_json) { check_variant("spm-json"); }
END_TEST

START_TEST(golden_bert) { check_variant("bert"); }
END_TEST

START_TEST(golden_bert_cased) { check_variant("bert-cased"); }
END_TEST

/* GGUFs whose tokenizer arrays have the wrong type or count. */
START_TEST(gguf_broken) {
  load_goldens();
  json_t *broken = json_object_get(g_golden, "broken"), *err;
  const char *path;
  int n = 0, by_reader = 0;
  json_object_foreach(broken, path, err) {
    model_gguf_t *g = NULL;
    if (model_gguf_open(&g, path) != 0) { /* the GGUF reader may check tokenizer keys itself */
      by_reader++;
      continue;
    }
    model_tokenizer_t *t = (model_tokenizer_t *)1;
    int rc = model_tokenizer_from_gguf(&t, g);
    ck_assert_msg(!strcmp(fr_errname(rc), json_string_value(err)), "%s: %s, want %s (%s)", path, fr_errname(rc),
                  json_string_value(err), fr_last_error());
    ck_assert_ptr_null(t);
    ck_assert(strstr(fr_last_error(), "tokenizer") != NULL);
    model_gguf_close(g);
    n++;
  }
  fprintf(stderr, "broken GGUFs: %d refused by the tokenizer, %d by the reader\n", n, by_reader);
  ck_assert_int_ge(n, 5);
}
END_TEST

/* ---------- properties of the real SmolLM2 tokenizer ---------- */

static model_tokenizer_t *open_variant(const char *name, model_gguf_t **g) {
  char path[4200];
  snprintf(path, sizeof(path), "%s/tok-%s.gguf", tt_golden_dir(), name);
  model_tokenizer_t *t = tt_open_gguf(path, g);
  ck_assert_msg(t != NULL, "cannot open %s", path);
  return t;
}

START_TEST(smollm_properties) {
  model_gguf_t *g;
  model_tokenizer_t *t = open_variant("smollm", &g);
  ck_assert_int_eq(model_vocab_size(t), 49152);
  ck_assert_int_eq(model_tokenizer_kind(t), MODEL_TOK_BPE);
  ck_assert_str_eq(model_tokenizer_pre(t), "smollm");
  ck_assert_int_eq(model_token_bos(t), 1);
  ck_assert_int_eq(model_token_eos(t), 2);
  ck_assert(!model_tokenizer_adds_bos(t));
  ck_assert(model_token_is_eog(t, 2));
  ck_assert(model_token_is_eog(t, 0)); /* <|endoftext|> */
  ck_assert(!model_token_is_eog(t, 1));
  ck_assert(!model_token_is_eog(t, 19556));
  ck_assert(!model_token_is_eog(t, -1) && !model_token_is_eog(t, 49152));
  ck_assert(model_token_is_control(t, 1));
  ck_assert(!model_token_is_control(t, 19556));
  ck_assert_int_eq(model_token_lookup(t, "<|im_end|>", 10), 2);
  ck_assert_int_eq(model_token_lookup(t, "no such token", 13), -1);
  size_t len;
  const char *b = model_token_bytes(t, 905, &len); /* "Ġworld" */
  ck_assert_uint_eq(len, 6);
  ck_assert(!memcmp(b, " world", 6));
  ck_assert_ptr_null(model_token_bytes(t, 49152, &len));
  ck_assert_ptr_nonnull(model_tokenizer_chat_template(t));
  /* add_special adds nothing for SmolLM2 (add_bos false) */
  int32_t *ids;
  size_t n;
  ck_assert_int_eq(model_tokenize(t, "Hello", 5, true, true, &ids, &n), 0);
  ck_assert_uint_eq(n, 1);
  free(ids);
  /* skip_special drops control tokens */
  int32_t chat[] = {1, 19556, 2};
  char *s = model_detokenize(t, chat, 3, true);
  ck_assert_str_eq(s, "Hello");
  free(s);
  s = model_detokenize(t, chat, 3, false);
  ck_assert_str_eq(s, "<|im_start|>Hello<|im_end|>");
  free(s);
  model_tokenizer_destroy(t);
  model_gguf_close(g);
}
END_TEST

START_TEST(spm_properties) {
  model_gguf_t *g;
  model_tokenizer_t *t = open_variant("spm", &g);
  ck_assert_int_eq(model_tokenizer_kind(t), MODEL_TOK_SPM);
  ck_assert(model_tokenizer_adds_bos(t));
  int32_t *ids;
  size_t n;
  ck_assert_int_eq(model_tokenize(t, "Hi", 2, true, false, &ids, &n), 0);
  ck_assert_uint_ge(n, 2);
  ck_assert_int_eq(ids[0], 1);
  char *s = model_detokenize(t, ids, n, true);
  ck_assert_str_eq(s, "Hi"); /* BOS dropped, prefix space stripped */
  free(s);
  free(ids);
  /* a byte-fallback character: U+10FFFF is no piece */
  ck_assert_int_eq(model_tokenize(t, "\xF4\x8F\xBF\xBF", 4, false, false, &ids, &n), 0);
  ck_assert_uint_ge(n, 4);
  s = model_detokenize(t, ids, n, false);
  ck_assert_str_eq(s, "\xF4\x8F\xBF\xBF");
  free(s);
  free(ids);
  model_tokenizer_destroy(t);
  model_gguf_close(g);
}
END_TEST

/* ---------- streaming detokenizer ---------- */

/* Feeds ids one at a time; returns the concatenated output. */
static char *stream_all(const model_tokenizer_t *t, const int32_t *ids, size_t n, bool skip, int *max_pending) {
  model_detok_t d;
  model_detok_init(&d, t, skip);
  size_t cap = 64, o = 0;
  char *all = malloc(cap);
  char piece[256];
  for (size_t i = 0; i <= n; i++) {
    int w = i < n ? model_detok_feed(&d, ids[i], piece, sizeof(piece)) : model_detok_flush(&d, piece, sizeof(piece));
    ck_assert_int_ge(w, 0);
    ck_assert_int_eq(piece[w], '\0');
    if (max_pending && d.n_pending > *max_pending) *max_pending = d.n_pending;
    while (o + (size_t)w + 1 > cap) all = realloc(all, cap *= 2);
    memcpy(all + o, piece, (size_t)w);
    o += (size_t)w;
  }
  all[o] = '\0';
  return all;
}

START_TEST(detok_split_emoji) {
  model_gguf_t *g;
  model_tokenizer_t *t = open_variant("smollm", &g);
  const char *s = "A 👨‍👩‍👧‍👦 family 👍🏽 ok";
  int32_t *ids;
  size_t n;
  ck_assert_int_eq(model_tokenize(t, s, strlen(s), false, false, &ids, &n), 0);
  /* the emoji are spread over several byte tokens: some feeds must hold back */
  model_detok_t d;
  model_detok_init(&d, t, false);
  char piece[64];
  int held = 0;
  for (size_t i = 0; i < n; i++) {
    int w = model_detok_feed(&d, ids[i], piece, sizeof(piece));
    ck_assert_int_ge(w, 0);
    /* every piece is valid UTF-8 on its own */
    for (int k = 0; k < w;) {
      int l = (unsigned char)piece[k] < 0x80 ? 1 : (unsigned char)piece[k] < 0xE0 ? 2 : (unsigned char)piece[k] < 0xF0 ? 3 : 4;
      ck_assert_int_le(k + l, w);
      for (int c = 1; c < l; c++) ck_assert_int_eq((unsigned char)piece[k + c] & 0xC0, 0x80);
      k += l;
    }
    held += d.n_pending > 0;
  }
  ck_assert_int_gt(held, 0);
  char *all = stream_all(t, ids, n, false, NULL);
  ck_assert_str_eq(all, s);
  free(all);
  free(ids);
  model_tokenizer_destroy(t);
  model_gguf_close(g);
}
END_TEST

START_TEST(detok_matches_batch_on_corpus) {
  load_goldens();
  model_gguf_t *g;
  model_tokenizer_t *t = open_variant("smollm", &g);
  for (size_t k = 0; k < json_array_size(g_corpus); k++) {
    json_t *js = json_array_get(g_corpus, k);
    int32_t *ids;
    size_t n;
    ck_assert_int_eq(model_tokenize(t, json_string_value(js), json_string_length(js), false, true, &ids, &n), 0);
    for (int skip = 0; skip < 2; skip++) {
      int maxp = 0;
      char *a = stream_all(t, ids, n, skip, &maxp);
      char *b = model_detokenize(t, ids, n, skip);
      ck_assert_str_eq(a, b);
      ck_assert_int_le(maxp, 3);
      free(a);
      free(b);
    }
    free(ids);
  }
  model_tokenizer_destroy(t);
  model_gguf_close(g);
}
END_TEST

START_TEST(detok_invalid_bytes) {
  model_gguf_t *g;
  model_tokenizer_t *t = open_variant("smollm", &g);
  /* byte-level tokens of bytes 0xF0 0x9F (start of an emoji), then 'a' */
  int32_t f0 = -1, x9f = -1, a = model_token_lookup(t, "a", 1);
  char buf[8];
  int l = snprintf(buf, sizeof(buf), "%s", "\xC3\xB0"); /* U+00F0 maps byte 0xF0 */
  f0 = model_token_lookup(t, buf, (size_t)l);
  x9f = model_token_lookup(t, "\xC5\x81", 2); /* byte 0x9F maps to U+0141 */
  ck_assert_int_ge(f0, 0);
  ck_assert_int_ge(x9f, 0);
  ck_assert_int_ge(a, 0);
  int32_t ids[] = {f0, x9f, a};
  char *s = stream_all(t, ids, 3, false, NULL);
  ck_assert_str_eq(s, "\xEF\xBF\xBD" "a"); /* truncated sequence -> one U+FFFD */
  free(s);
  s = model_detokenize(t, ids, 3, false);
  ck_assert_str_eq(s, "\xEF\xBF\xBD" "a");
  free(s);
  int32_t tail[] = {a, f0};
  s = stream_all(t, tail, 2, false, NULL); /* flush turns the pending tail into U+FFFD */
  ck_assert_str_eq(s, "a\xEF\xBF\xBD");
  free(s);
  /* an output buffer that is too small is an error, state unchanged */
  model_detok_t d;
  model_detok_init(&d, t, false);
  char tiny[2];
  int32_t big = model_token_lookup(t, "Hello", 5);
  ck_assert_int_ge(big, 0);
  ck_assert_int_eq(model_detok_feed(&d, big, tiny, sizeof(tiny)), FR_ETOOBIG);
  ck_assert_int_lt(model_detok_feed(&d, 1 << 30, tiny, sizeof(tiny)), 0);
  model_tokenizer_destroy(t);
  model_gguf_close(g);
}
END_TEST

/* ---------- tokenizer.json errors ---------- */

static void expect_json_error(const char *json, int want, const char *needle) {
  model_tokenizer_t *t = (model_tokenizer_t *)1;
  int rc = model_tokenizer_from_json(&t, json, NULL);
  ck_assert_msg(rc == want, "rc %s for %.80s (%s)", fr_errname(rc), json, fr_last_error());
  ck_assert_ptr_null(t);
  ck_assert_msg(strstr(fr_last_error(), needle), "message '%s' lacks '%s'", fr_last_error(), needle);
}

#define MINI_VOCAB "\"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}"

START_TEST(json_errors) {
  expect_json_error("{", FR_EFORMAT, "tokenizer.json");
  expect_json_error("[]", FR_EFORMAT, "tokenizer.json");
  expect_json_error("{\"model\": 3}", FR_EFORMAT, "no model");
  expect_json_error("{\"model\": {\"type\": \"BPE\"}}", FR_EFORMAT, "vocab");
  expect_json_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {}}}", FR_EFORMAT, "empty vocabulary");
  expect_json_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}}}", FR_EFORMAT, "invalid id");
  expect_json_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": \"x\"}}}", FR_EFORMAT, "invalid id");
  expect_json_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 99999999}}}", FR_EFORMAT, "invalid id");
  expect_json_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 4000000}}}", FR_EFORMAT, "ids up to");
  expect_json_error("{\"model\": {\"type\": \"BPE\", " MINI_VOCAB ", \"merges\": [\"a c\"]}}", FR_EFORMAT,
                    "merges[0]");
  expect_json_error("{\"model\": {\"type\": \"BPE\", " MINI_VOCAB ", \"merges\": [\"ab\"]}}", FR_EFORMAT, "merges[0]");
  expect_json_error("{\"model\": {\"type\": \"BPE\", " MINI_VOCAB ", \"merges\": [[\"a\"]]}}", FR_EFORMAT,
                    "merges[0]");
  expect_json_error("{\"model\": {\"type\": \"BPE\", " MINI_VOCAB ", \"merges\": {}}}", FR_EFORMAT, "merges");
  expect_json_error("{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", FR_EUNSUPPORTED, "Unigram");
  expect_json_error("{\"model\": {\"type\": \"BPE\", " MINI_VOCAB "}, \"pre_tokenizer\": {\"type\": \"Split\", "
                    "\"pattern\": {\"Regex\": \"\\\\w+\"}, \"behavior\": \"Isolated\"}}",
                    FR_EUNSUPPORTED, "not a known pre-tokenizer");
  expect_json_error("{\"model\": {\"type\": \"BPE\", " MINI_VOCAB "}, \"pre_tokenizer\": {\"type\": \"Whitespace\"}}",
                    FR_EUNSUPPORTED, "Whitespace");
  expect_json_error("{\"model\": {\"type\": \"BPE\", " MINI_VOCAB "}, \"normalizer\": {\"type\": \"NFKC\"}}",
                    FR_EUNSUPPORTED, "NFKC");
  expect_json_error("{\"model\": {\"type\": \"BPE\", " MINI_VOCAB "}, \"added_tokens\": [{\"id\": 5}]}", FR_EFORMAT,
                    "added_tokens[0]");
  expect_json_error("{\"model\": {\"type\": \"BPE\", " MINI_VOCAB "}, \"added_tokens\": 7}", FR_EFORMAT,
                    "added_tokens");
}
END_TEST

/* A hand-made tokenizer.json: merges in both spellings, added tokens,
 * post_processor BOS, tokenizer_config overrides. */
START_TEST(json_minimal) {
  const char *js =
      "{\"added_tokens\": [{\"id\": 5, \"content\": \"<s>\", \"special\": true},"
      "                    {\"id\": 6, \"content\": \"<u>\", \"special\": false}],"
      " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2, \"c\": 3, \"abc\": 4},"
      "            \"merges\": [\"a b\", [\"ab\", \"c\"]]},"
      " \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\"}},"
      "                      {\"Sequence\": {\"id\": \"A\"}}]}}";
  model_tokenizer_t *t;
  ck_assert_int_eq(model_tokenizer_from_json(&t, js, NULL), 0);
  ck_assert_int_eq(model_vocab_size(t), 7);
  ck_assert(model_tokenizer_adds_bos(t));
  ck_assert_int_eq(model_token_bos(t), 5);
  int32_t *ids;
  size_t n;
  ck_assert_int_eq(model_tokenize(t, "abcab<s>c<u>", 12, true, true, &ids, &n), 0);
  int32_t want[] = {5, 4, 2, 5, 3, 6};
  ck_assert_uint_eq(n, 6);
  ck_assert(!memcmp(ids, want, sizeof(want)));
  free(ids);
  /* parse_special false: <s> is text (here: unknown characters, dropped), <u> still matches */
  ck_assert_int_eq(model_tokenize(t, "ab<u>", 5, false, false, &ids, &n), 0);
  ck_assert_uint_eq(n, 2);
  ck_assert_int_eq(ids[1], 6);
  free(ids);
  model_tokenizer_destroy(t);
  /* model_max_length 1e30 as an integer: what transformers writes when a
   * model sets none (past int64, which the JSON parser refuses as such) */
  const char *cfg = "{\"add_bos_token\": false, \"eos_token\": {\"content\": \"<u>\"}, \"chat_template\": \"{{x}}\","
                    " \"model_max_length\": 1000000000000000019884624838656}";
  ck_assert_int_eq(model_tokenizer_from_json(&t, js, cfg), 0);
  ck_assert(!model_tokenizer_adds_bos(t));
  ck_assert_int_eq(model_token_eos(t), 6);
  ck_assert_str_eq(model_tokenizer_chat_template(t), "{{x}}");
  model_tokenizer_destroy(t);
  ck_assert_int_eq(model_tokenizer_from_json(&t, js, "nope"), FR_EFORMAT);
  ck_assert_ptr_null(t);
  /* NFC (Qwen) is accepted */
  const char *nfc = "{\"normalizer\": {\"type\": \"NFC\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}}";
  ck_assert_int_eq(model_tokenizer_from_json(&t, nfc, NULL), 0);
  model_tokenizer_destroy(t);
}
END_TEST

/* ---------- speed (printed, not asserted) ---------- */

START_TEST(speed) {
  load_goldens();
  model_gguf_t *g;
  model_tokenizer_t *t = open_variant("smollm", &g);
  size_t total = 0, tokens = 0;
  uint64_t t0 = fr_now_ns();
  for (int rep = 0; rep < 100; rep++) {
    for (size_t k = 0; k < json_array_size(g_corpus); k++) {
      json_t *js = json_array_get(g_corpus, k);
      int32_t *ids;
      size_t n;
      model_tokenize(t, json_string_value(js), json_string_length(js), false, true, &ids, &n);
      total += json_string_length(js);
      tokens += n;
      free(ids);
    }
  }
  double s = (double)(fr_now_ns() - t0) / 1e9;
  fprintf(stderr, "speed: corpus x100 = %zu bytes, %zu tokens in %.3f s (%.1f MB/s)\n", total, tokens, s,
          (double)total / s / 1e6);
  /* one 100 KB text */
  size_t big_n = 100 * 1024, o = 0;
  char *big = malloc(big_n + 1);
  for (size_t k = 0; o < big_n; k = (k + 1) % json_array_size(g_corpus)) {
    json_t *js = json_array_get(g_corpus, k);
    size_t l = FR_MIN(json_string_length(js), big_n - o);
    memcpy(big + o, json_string_value(js), l);
    o += l;
  }
  t0 = fr_now_ns();
  int32_t *ids;
  size_t n;
  ck_assert_int_eq(model_tokenize(t, big, big_n, false, true, &ids, &n), 0);
  s = (double)(fr_now_ns() - t0) / 1e9;
  fprintf(stderr, "speed: 100 KB in one call -> %zu tokens in %.3f s\n", n, s);
  ck_assert(s < 5.0); /* sanity only: "well under a second" on a quiet machine */
  free(ids);
  free(big);
  model_tokenizer_destroy(t);
  model_gguf_close(g);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("tokenizer");
  TCase *tc = tcase_create("golden");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, golden_smollm);
  tcase_add_test(tc, golden_gpt2);
  tcase_add_test(tc, golden_llama3);
  tcase_add_test(tc, golden_qwen2);
  tcase_add_test(tc, golden_spm);
  tcase_add_test(tc, golden_spm_json);
  tcase_add_test(tc, golden_bert);
  tcase_add_test(tc, golden_bert_cased);
  tcase_add_test(tc, smollm_properties);
  tcase_add_test(tc, gguf_broken);
  tcase_add_test(tc, spm_properties);
  suite_add_tcase(s, tc);
  tc = tcase_create("detok");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, detok_split_emoji);
  tcase_add_test(tc, detok_matches_batch_on_corpus);
  tcase_add_test(tc, detok_invalid_bytes);
  suite_add_tcase(s, tc);
  tc = tcase_create("json");
  tcase_add_test(tc, json_errors);
  tcase_add_test(tc, json_minimal);
  suite_add_tcase(s, tc);
  tc = tcase_create("speed");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, speed);
  suite_add_tcase(s, tc);
  return s;
}

/* The shared main (tests/common/test_main.c) runs this program's suites. */
#include "tests/common/test_main.h"

static int tok_setup(int argc, char **argv) {
  char path[4200];
  snprintf(path, sizeof(path), "%s/golden.json", tt_golden_dir());
  if (access(path, R_OK) != 0) {
    fprintf(stderr, "skip: %s missing (no model?)\n", path);
    return TEST_SKIP;
  }
  return 0;
}

const test_prog_t test_prog = {.suites = {suite}, .setup = tok_setup};
