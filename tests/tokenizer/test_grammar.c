/* test_grammar.c - constrained decoding's grammars: JSON (any object, and
 * schemas) and regexes accept exactly their sentences, byte by byte;
 * unsupported schema keywords are refused by name; and on the test
 * model's vocabulary the masks only let through tokens that keep the
 * output valid: a walk that always takes the first allowed token (and one
 * that takes pseudo-random ones) ends in a document jansson parses. */
#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "model/grammar.h"
#include "model/tokenizer.h"
#include "tests/tokenizer/tok_test_util.h"

static model_gstate_t st; /* large: not on the stack */

static bool accepts(const model_grammar_t *g, const char *text) {
  model_gstate_init(g, &st);
  return model_gstate_feed(g, &st, text, strlen(text)) && model_gstate_can_end(g, &st);
}

static model_grammar_t *json_g(const char *schema) {
  model_grammar_t *g = NULL;
  char err[256];
  ck_assert_msg(model_grammar_json(&g, schema, schema ? strlen(schema) : 0, err, sizeof err) == 0, "%s", err);
  return g;
}

START_TEST(json_object_any) {
  model_grammar_t *g = json_g(NULL);
  const char *good[] = {"{}", "{\"a\": [1, -2.5e3, \"x\\n\\u00e9\", true, false, null, {\"b\": {}}]}", " {\"k\":0}",
                        "{\"a\":\"h\xc3\xa9\"}", "{\"a\":\"\xf0\x9f\x98\x80\xf4\x8f\xbf\xbf\xe0\xa0\x80\xed\x9f\xbf\"}"};
  const char *bad[] = {"[1]", "{\"a\" 1}", "{\"a\": 01}", "{\"a\": 1,}", "{} x", "{\"a\": tru}", "\"s\"",
                       "{\"a\":\"\x01\"}", "{\"a\": 1.}", "{         \"a\": 1}",
                       /* UTF-8 that is not (RFC 3629): past U+10FFFF (a random model's), overlong, a surrogate */
                       "{\"a\":\"\xf4\xad\xa1\x8c\"}", "{\"a\":\"\xf4\x90\x80\x80\"}", "{\"a\":\"\xe0\x80\xaf\"}",
                       "{\"a\":\"\xf0\x80\x80\x80\"}", "{\"a\":\"\xed\xa0\x80\"}"};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) ck_assert_msg(accepts(g, good[i]), "%s", good[i]);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) ck_assert_msg(!accepts(g, bad[i]), "%s", bad[i]);
  model_gstate_init(g, &st);
  ck_assert(model_gstate_feed(g, &st, "{\"a\": 1", 7) && !model_gstate_can_end(g, &st)); /* a prefix */
  model_grammar_destroy(g);
}
END_TEST

START_TEST(json_schema_subset) {
  model_grammar_t *g = json_g(
      "{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\", \"maxLength\": 5}, \"age\": {\"type\": "
      "\"integer\"}, \"tags\": {\"type\": \"array\", \"items\": {\"enum\": [\"a\", \"b\", 3]}, \"minItems\": 1, "
      "\"maxItems\": 2}, \"pet\": {\"anyOf\": [{\"type\": \"null\"}, {\"$ref\": \"#/$defs/Pet\"}]}, \"ok\": {\"type\": "
      "\"boolean\"}}, \"required\": [\"name\", \"tags\"], \"additionalProperties\": false, \"$defs\": {\"Pet\": "
      "{\"type\": \"object\", \"properties\": {\"kind\": {\"const\": \"cat\"}}, \"required\": [\"kind\"]}}}");
  const char *good[] = {"{\"name\": \"Bob\", \"tags\": [\"a\"]}", "{\"name\": \"\", \"age\": -3, \"tags\": [3, \"b\"]}",
                        "{\"name\":\"x\",\"tags\":[\"a\"],\"pet\":null,\"ok\":true}",
                        "{\"name\":\"x\",\"tags\":[\"a\"],\"pet\":{\"kind\":\"cat\"}}"};
  const char *bad[] = {"{\"tags\": [\"a\"]}",                       /* name is required */
                       "{\"name\": \"Bobby6\", \"tags\": [\"a\"]}",  /* maxLength */
                       "{\"name\": \"B\", \"age\": 1.5, \"tags\": [\"a\"]}", "{\"name\": \"B\", \"tags\": []}",
                       "{\"name\": \"B\", \"tags\": [\"a\", \"a\", \"a\"]}", "{\"name\": \"B\", \"tags\": [\"c\"]}",
                       "{\"tags\": [\"a\"], \"name\": \"B\"}", /* properties in the schema's order */
                       "{\"name\": \"B\", \"tags\": [\"a\"], \"x\": 1}", "{\"name\":\"x\",\"tags\":[\"a\"],\"pet\":{\"kind\":\"dog\"}}"};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) ck_assert_msg(accepts(g, good[i]), "%s", good[i]);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) ck_assert_msg(!accepts(g, bad[i]), "%s", bad[i]);
  model_grammar_destroy(g);
  /* scalars at the root, type lists */
  g = json_g("{\"type\": [\"number\", \"null\"]}");
  ck_assert(accepts(g, "12.5") && accepts(g, "null") && accepts(g, "-0") && !accepts(g, "\"1\""));
  model_grammar_destroy(g);
}
END_TEST

START_TEST(json_schema_refused) {
  const char *schemas[][2] = {{"{\"type\": \"string\", \"pattern\": \"a+\"}", "pattern"},
                              {"{\"type\": \"integer\", \"minimum\": 0}", "minimum"},
                              {"{\"allOf\": [{}]}", "allOf"},
                              {"{\"type\": \"date\"}", "date"},
                              {"{\"$ref\": \"#/$defs/A\", \"$defs\": {\"A\": {\"$ref\": \"#/$defs/A\"}}}", "recursive"},
                              {"{\"type\": \"object\", \"properties\": {\"a\": {}}, \"additionalProperties\": true}",
                               "additionalProperties"},
                              {"not json", "not JSON"}};
  for (size_t i = 0; i < sizeof schemas / sizeof schemas[0]; i++) {
    model_grammar_t *g = NULL;
    char err[256] = "";
    ck_assert_int_ne(model_grammar_json(&g, schemas[i][0], strlen(schemas[i][0]), err, sizeof err), 0);
    ck_assert_msg(strstr(err, schemas[i][1]), "%s: %s", schemas[i][0], err);
  }
}
END_TEST

START_TEST(regex) {
  static const struct {
    const char *re, *yes[3], *no[3];
  } cases[] = {
      {"^(yes|no)$", {"yes", "no"}, {"ye", "yesno", "maybe"}},
      {"\\d{3}-\\d{4}", {"555-1234"}, {"55-1234", "555-12345", "5a5-1234"}},
      {"[A-Z][a-z]+( [A-Z][a-z]+)?", {"Paris", "New York"}, {"paris", "New york", "P"}},
      {"a{2,}b*c?", {"aa", "aaabbbc"}, {"a", "aac c"}},
      {"[^\\s,]+(, [^\\s,]+)*", {"a, b, c", "x"}, {"a,b", ""}},
      {"\\{\"x\": \\d+\\}", {"{\"x\": 12}"}, {"{\"x\": }"}},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    model_grammar_t *g = NULL;
    char err[256];
    ck_assert_msg(model_grammar_regex(&g, cases[i].re, strlen(cases[i].re), err, sizeof err) == 0, "%s", err);
    for (int k = 0; k < 3 && cases[i].yes[k]; k++) ck_assert_msg(accepts(g, cases[i].yes[k]), "%s ~ %s", cases[i].re, cases[i].yes[k]);
    for (int k = 0; k < 3 && cases[i].no[k]; k++) ck_assert_msg(!accepts(g, cases[i].no[k]), "%s !~ %s", cases[i].re, cases[i].no[k]);
    model_grammar_destroy(g);
  }
  const char *bad[] = {"(a", "a)", "[a", "a{3,1}", "a**", "(?=a)", "a^b"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    model_grammar_t *g = NULL;
    char err[256];
    ck_assert_msg(model_grammar_regex(&g, bad[i], strlen(bad[i]), err, sizeof err) != 0, "%s", bad[i]);
  }
}
END_TEST

/* Walks the mask: at each step takes the allowed token that pick chooses
 * (never EOS while another is allowed), up to 400 tokens; returns the text. */
static char *walk(const model_grammar_t *g, const model_tokenizer_t *tok, int n_vocab, unsigned seed, bool *ended) {
  model_gvocab_t *v = NULL;
  ck_assert_int_eq(model_gvocab_create(&v, tok, n_vocab), 0);
  uint32_t *mask = calloc(model_gvocab_words(v), sizeof *mask);
  model_gscratch_t *scratch = NULL;
  ck_assert_int_eq(model_gscratch_create(&scratch, v), 0);
  size_t cap = 1 << 16, len = 0;
  char *out = calloc(cap, 1);
  model_gstate_init(g, &st);
  *ended = false;
  for (int step = 0; step < 400 && !*ended; step++) {
    size_t n = model_grammar_mask(g, &st, v, mask, scratch);
    ck_assert_uint_gt(n, 0);
    int32_t pick = -1, eos = -1;
    size_t k = seed ? (seed = seed * 1103515245u + 12345u) % n : 0, seen = 0;
    for (int32_t t = 0; t < n_vocab; t++) {
      if (!(mask[t / 32] >> (t % 32) & 1)) continue;
      if (model_token_is_eog(tok, t)) {
        eos = t;
        continue;
      }
      if (pick < 0 || seen <= k) pick = t;
      seen++;
    }
    if (pick < 0 || (seed && eos >= 0 && step > 40)) { /* only EOS, or a random walk long enough: end */
      ck_assert_int_ge(eos, 0);
      *ended = true;
      break;
    }
    size_t bl;
    const char *b = model_token_bytes(tok, pick, &bl);
    ck_assert(model_gstate_feed(g, &st, b, bl));
    ck_assert_uint_lt(len + bl, cap);
    memcpy(out + len, b, bl), len += bl;
  }
  free(mask);
  model_gscratch_destroy(scratch);
  model_gvocab_destroy(v);
  return out;
}

static model_gstate_t tmp;

/* The mask of a state equals feeding every token's bytes to a copy of it. */
static void check_mask_exact(const model_grammar_t *g, const char *prefix, const model_tokenizer_t *tok, int n_vocab) {
  model_gvocab_t *v = NULL;
  model_gscratch_t *scratch = NULL;
  ck_assert_int_eq(model_gvocab_create(&v, tok, n_vocab), 0);
  ck_assert_int_eq(model_gscratch_create(&scratch, v), 0);
  uint32_t *mask = calloc(model_gvocab_words(v), sizeof *mask);
  model_gstate_init(g, &st);
  ck_assert(model_gstate_feed(g, &st, prefix, strlen(prefix)));
  model_grammar_mask(g, &st, v, mask, scratch);
  for (int32_t t = 0; t < n_vocab; t++) {
    size_t n;
    const char *b = model_token_bytes(tok, t, &n);
    if (model_token_is_eog(tok, t) || model_token_is_control(tok, t) || !b || !n) continue;
    tmp = st;
    bool want = model_gstate_feed(g, &tmp, b, n);
    ck_assert_msg(want == (bool)(mask[t / 32] >> (t % 32) & 1), "prefix [%s] token %d [%.*s]: want %d", prefix, t,
                  (int)n, b, want);
  }
  free(mask);
  model_gscratch_destroy(scratch);
  model_gvocab_destroy(v);
}

START_TEST(masks_on_the_model_vocabulary) {
  const char *path = getenv("FERRUM_MODEL");
  model_gguf_t *gg = NULL;
  model_tokenizer_t *tok = path && access(path, R_OK) == 0 ? tt_open_gguf(path, &gg) : NULL;
  if (!tok) return;
  int n_vocab = model_vocab_size(tok);
  const char *schema = "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"maxLength\": 12}, "
                       "\"days\": {\"type\": \"integer\"}, \"hot\": {\"type\": \"boolean\"}}, \"required\": [\"city\", "
                       "\"days\", \"hot\"]}";
  model_grammar_t *g = json_g(schema);
  const char *prefixes[] = {"", "{\"ci", "{\"city\": \"Pa", "{\"city\": \"Paris\", \"days\": 1", "{\"city\": \"\xc3",
                            "{\"city\": \"a\\u00"};
  for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) check_mask_exact(g, prefixes[i], tok, n_vocab);
  model_grammar_t *any = json_g(NULL);
  check_mask_exact(any, "{\"k\": [1, {\"x\": \"y", tok, n_vocab);
  check_mask_exact(any, "{\"k\": -1", tok, n_vocab);
  check_mask_exact(any, "{\"k\": \"ab", tok, n_vocab); /* a free string: plain tokens and tails */
  model_grammar_destroy(any);
  model_grammar_t *min3 = json_g("{\"type\": \"array\", \"items\": {\"type\": \"string\", \"minLength\": 3}}");
  check_mask_exact(min3, "[\"a", tok, n_vocab);    /* below the minimum: a closing quote depends on the count */
  check_mask_exact(min3, "[\"abcd", tok, n_vocab); /* the minimum met */
  model_grammar_destroy(min3);
  for (unsigned seed = 0; seed < 4; seed++) {
    bool ended;
    char *text = walk(g, tok, n_vocab, seed * 7919u, &ended);
    if (ended) {
      json_t *j = json_loads(text, 0, NULL);
      ck_assert_msg(j && json_is_object(j) && json_is_string(json_object_get(j, "city")) &&
                        json_is_integer(json_object_get(j, "days")) && json_is_boolean(json_object_get(j, "hot")),
                    "%s", text);
      json_decref(j);
    }
    free(text);
  }
  model_grammar_destroy(g);
  model_grammar_t *r = NULL;
  ck_assert_int_eq(model_grammar_regex(&r, "(red|green|blue)!", 17, NULL, 0), 0);
  bool ended;
  char *text = walk(r, tok, n_vocab, 0, &ended);
  ck_assert(ended && (!strcmp(text, "red!") || !strcmp(text, "green!") || !strcmp(text, "blue!")));
  free(text);
  model_grammar_destroy(r);
  model_tokenizer_destroy(tok);
  model_gguf_close(gg);
}
END_TEST

/* The straightforward mask of state s: each token's bytes fed to a copy
 * of it; the end-of-generation tokens where the output may end or
 * nothing else may follow. Returns how many are allowed. */
static size_t reference_mask(const model_grammar_t *g, const model_gstate_t *s, const model_tokenizer_t *tok,
                             int n_vocab, uint32_t *mask) {
  size_t n = 0;
  memset(mask, 0, ((size_t)n_vocab + 31) / 32 * sizeof *mask);
  bool open = s->n > 0 && !model_gstate_must_end(g, s);
  for (int32_t t = 0; t < n_vocab && open; t++) {
    size_t bl;
    const char *b = model_token_bytes(tok, t, &bl);
    if (model_token_is_eog(tok, t) || model_token_is_control(tok, t) || !b || !bl || bl > 1024) continue;
    tmp = *s;
    if (model_gstate_feed(g, &tmp, b, bl)) mask[t / 32] |= 1u << (t % 32), n++;
  }
  bool eos = n == 0 || model_gstate_can_end(g, s);
  for (int32_t t = 0; t < n_vocab && eos; t++)
    if (model_token_is_eog(tok, t)) mask[t / 32] |= 1u << (t % 32), n++;
  return n;
}

/* Random walks through each grammar (a pseudo-random allowed token each
 * step): in every state passed the fast mask (the sorted walk with its
 * skips, the plain-string shortcut and the tails of the tokens that leave
 * a string, strings below their minimum length) is the reference mask,
 * bit for bit. */
static void check_random_states(const model_grammar_t *g, const model_tokenizer_t *tok, int n_vocab, unsigned seed,
                                 int steps) {
  model_gvocab_t *v = NULL;
  model_gscratch_t *scratch = NULL;
  ck_assert_int_eq(model_gvocab_create(&v, tok, n_vocab), 0);
  ck_assert_int_eq(model_gscratch_create(&scratch, v), 0);
  uint32_t words = model_gvocab_words(v), *fast = calloc(words, 4), *ref = calloc(words, 4);
  model_gstate_init(g, &st);
  for (int step = 0; step < steps; step++) {
    size_t nf = model_grammar_mask(g, &st, v, fast, scratch), nr = reference_mask(g, &st, tok, n_vocab, ref);
    ck_assert_uint_eq(nf, nr);
    for (uint32_t w = 0; w < words; w++)
      ck_assert_msg(fast[w] == ref[w], "seed %u step %d: word %u: fast %08x reference %08x", seed, step, w, fast[w],
                    ref[w]);
    int32_t pick = -1;
    size_t k = (seed = seed * 1103515245u + 12345u) % nr, seen = 0;
    for (int32_t t = 0; t < n_vocab && pick < 0; t++)
      if ((ref[t / 32] >> (t % 32) & 1) && seen++ == k) pick = t;
    if (model_token_is_eog(tok, pick)) break;
    size_t bl;
    const char *b = model_token_bytes(tok, pick, &bl);
    ck_assert(model_gstate_feed(g, &st, b, bl));
  }
  free(fast), free(ref);
  model_gscratch_destroy(scratch);
  model_gvocab_destroy(v);
}

START_TEST(fast_mask_is_the_reference_mask) {
  const char *path = getenv("FERRUM_MODEL");
  model_gguf_t *gg = NULL;
  model_tokenizer_t *tok = path && access(path, R_OK) == 0 ? tt_open_gguf(path, &gg) : NULL;
  if (!tok) return;
  int n_vocab = model_vocab_size(tok);
  const char *schema = "{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"}, \"n\": "
                       "{\"type\": \"number\"}, \"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\", "
                       "\"maxLength\": 5}}, \"ok\": {\"anyOf\": [{\"type\": \"boolean\"}, {\"type\": \"null\"}]}}, "
                       "\"required\": [\"name\", \"n\"]}";
  const char *strings = "{\"type\": \"array\", \"items\": {\"type\": \"string\", \"minLength\": 3}}";
  model_grammar_t *gs[4] = {json_g(schema), json_g(NULL), json_g(strings), NULL};
  const char *re = "<think>[a-z ]{3,40}</think>[A-Za-z ,.]{3,60}";
  ck_assert_int_eq(model_grammar_regex(&gs[3], re, strlen(re), NULL, 0), 0);
  for (int i = 0; i < 4; i++) {
    for (unsigned seed = 1; seed <= 2; seed++) check_random_states(gs[i], tok, n_vocab, seed * 2654435761u + i, 12);
    model_grammar_destroy(gs[i]);
  }
  model_tokenizer_destroy(tok);
  model_gguf_close(gg);
}
END_TEST

#include "tests/common/test_main.h"

static Suite *grammar_suite(void) {
  Suite *s = suite_create("grammar");
  TCase *tc = tcase_create("grammar");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, json_object_any);
  tcase_add_test(tc, json_schema_subset);
  tcase_add_test(tc, json_schema_refused);
  tcase_add_test(tc, regex);
  tcase_add_test(tc, masks_on_the_model_vocabulary);
  tcase_add_test(tc, fast_mask_is_the_reference_mask);
  suite_add_tcase(s, tc);
  return s;
}

const test_prog_t test_prog = {.suites = {grammar_suite}};
