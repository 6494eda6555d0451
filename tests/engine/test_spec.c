/* test_spec.c - speculative decoding's pure parts (coordinator/spec.h):
 * the n-gram proposer against vLLM's prompt-lookup rule (longest n-gram
 * first, most recent earlier occurrence, proposals only from tokens that
 * exist) and --speculative-config parsing (vLLM's spelling; every bad
 * field is an error that names it). */
#include <check.h>
#include <errno.h>
#include <string.h>

#include "common/fr_err.h"
#include "coordinator/spec.h"
#include "tests/common/test_main.h"

static coord_spec_config_t cfg(int k, int mx, int mn) {
  return (coord_spec_config_t){.num_speculative_tokens = k, .prompt_lookup_max = mx, .prompt_lookup_min = mn,
                               .disable_by_batch_size = 4};
}

START_TEST(test_propose_most_recent_longest) {
  coord_spec_config_t c = cfg(4, 3, 1);
  int32_t out[8];
  /* ... 1 2 3 [7 8] ... 2 3 [9 5 6] ... 1 2 3: the 3-gram "1 2 3" occurs at 0 only -> 7 8 ... */
  const int32_t a[] = {1, 2, 3, 7, 8, 4, 2, 3, 9, 5, 6, 1, 2, 3};
  int n = coord_spec_propose(&c, a, 14, 4, out);
  ck_assert_int_eq(n, 4);
  const int32_t want_a[] = {7, 8, 4, 2};
  ck_assert_mem_eq(out, want_a, sizeof want_a);
  /* with prompt_lookup_max 2 the most recent "2 3" wins (at 6): 9 5 6 1 */
  c = cfg(4, 2, 1);
  ck_assert_int_eq(coord_spec_propose(&c, a, 14, 4, out), 4);
  const int32_t want_b[] = {9, 5, 6, 1};
  ck_assert_mem_eq(out, want_b, sizeof want_b);
  /* k_max caps; proposals stop at the end of the tokens */
  ck_assert_int_eq(coord_spec_propose(&c, a, 14, 2, out), 2);
  const int32_t b[] = {5, 6, 7, 5, 6};
  ck_assert_int_eq(coord_spec_propose(&c, b, 5, 4, out), 3); /* "5 6" at 0 -> 7 5 6 */
  const int32_t want_c[] = {7, 5, 6};
  ck_assert_mem_eq(out, want_c, sizeof want_c);
  const int32_t r[] = {4, 4, 4, 4};
  ck_assert_int_eq(coord_spec_propose(&c, r, 4, 4, out), 1); /* "4 4" most recent at 1 -> the one token after it */
  ck_assert_int_eq(out[0], 4);
}
END_TEST

START_TEST(test_propose_no_match) {
  coord_spec_config_t c = cfg(4, 4, 2);
  int32_t out[4];
  const int32_t a[] = {1, 2, 3, 4, 5, 3};
  ck_assert_int_eq(coord_spec_propose(&c, a, 6, 4, out), 0); /* "5 3" never before; 1-grams below the minimum */
  c = cfg(4, 4, 1);
  ck_assert_int_eq(coord_spec_propose(&c, a, 6, 4, out), 3); /* "3" at 2 -> 4 5 3 */
  ck_assert_int_eq(coord_spec_propose(&c, a, 1, 4, out), 0);
  ck_assert_int_eq(coord_spec_propose(&c, a, 6, 0, out), 0);
}
END_TEST

START_TEST(test_parse_vllm_spelling) {
  coord_spec_config_t c;
  ck_assert_int_eq(coord_spec_parse("{\"method\": \"ngram\", \"num_speculative_tokens\": 4, \"prompt_lookup_max\": 4,"
                                    " \"prompt_lookup_min\": 1}", &c), 0);
  ck_assert_int_eq(c.num_speculative_tokens, 4);
  ck_assert_int_eq(c.prompt_lookup_max, 4);
  ck_assert_int_eq(c.prompt_lookup_min, 1);
  ck_assert_int_eq(c.disable_by_batch_size, 0); /* the device's default */
  ck_assert(c.min_acceptance_rate < 0);
  /* vLLM: one bound given sets both; none: 5 and 5 */
  ck_assert_int_eq(coord_spec_parse("{\"method\": \"ngram\", \"num_speculative_tokens\": 2, \"prompt_lookup_max\": 3}", &c), 0);
  ck_assert_int_eq(c.prompt_lookup_min, 3);
  ck_assert_int_eq(coord_spec_parse("{\"method\": \"ngram\", \"num_speculative_tokens\": 2, \"prompt_lookup_min\": 2,"
                                    " \"disable_by_batch_size\": 16}", &c), 0);
  ck_assert_int_eq(c.prompt_lookup_max, 2);
  ck_assert_int_eq(c.disable_by_batch_size, 16);
  ck_assert_int_eq(coord_spec_parse("{\"method\": \"ngram\", \"num_speculative_tokens\": 2, \"min_acceptance_rate\": 0}",
                                    &c), 0);
  ck_assert(c.min_acceptance_rate == 0.0f);
  ck_assert_int_eq(coord_spec_parse("{\"method\": \"ngram\", \"num_speculative_tokens\": 1}", &c), 0);
  ck_assert_int_eq(c.prompt_lookup_max, 5);
  ck_assert_int_eq(c.prompt_lookup_min, 5);
  ck_assert_str_eq(c.draft_model, ""); /* the n-gram proposer */
}
END_TEST

/* A draft model as vLLM spells it: "model" alone, or with "method": "draft_model". */
START_TEST(test_parse_draft_model) {
  coord_spec_config_t c;
  ck_assert_int_eq(coord_spec_parse("{\"model\": \"/m/draft.gguf\", \"num_speculative_tokens\": 4}", &c), 0);
  ck_assert_str_eq(c.draft_model, "/m/draft.gguf");
  ck_assert_int_eq(c.num_speculative_tokens, 4);
  ck_assert_int_eq(coord_spec_parse("{\"method\": \"draft_model\", \"model\": \"d\", \"num_speculative_tokens\": 2,"
                                    " \"disable_by_batch_size\": 8, \"min_acceptance_rate\": 0.5}", &c), 0);
  ck_assert_str_eq(c.draft_model, "d");
  ck_assert_int_eq(c.disable_by_batch_size, 8);
  ck_assert(c.min_acceptance_rate == 0.5f);
}
END_TEST

START_TEST(test_parse_errors_name_the_field) {
  static const struct {
    const char *json, *needle;
  } bad[] = {
      {"{\"method\": \"ngram\"", "not JSON"},
      {"[1]", "JSON object"},
      {"{\"num_speculative_tokens\": 4}", "method"},
      {"{\"method\": \"eagle\", \"num_speculative_tokens\": 4}", "method"},
      {"{\"method\": \"ngram\"}", "num_speculative_tokens"},
      {"{\"method\": \"ngram\", \"num_speculative_tokens\": 0}", "num_speculative_tokens"},
      {"{\"method\": \"ngram\", \"num_speculative_tokens\": 33}", "num_speculative_tokens"},
      {"{\"method\": \"ngram\", \"num_speculative_tokens\": \"4\"}", "num_speculative_tokens"},
      {"{\"method\": \"ngram\", \"num_speculative_tokens\": 4, \"prompt_lookup_max\": 0}", "prompt_lookup_max"},
      {"{\"method\": \"ngram\", \"num_speculative_tokens\": 4, \"prompt_lookup_max\": 2, \"prompt_lookup_min\": 3}",
       "prompt_lookup_min"},
      {"{\"method\": \"ngram\", \"num_speculative_tokens\": 4, \"disable_by_batch_size\": 0}", "disable_by_batch_size"},
      {"{\"method\": \"ngram\", \"num_speculative_tokens\": 4, \"foo\": 1}", "foo"},
      {"{\"method\": \"ngram\", \"num_speculative_tokens\": 4, \"min_acceptance_rate\": 1.5}", "min_acceptance_rate"},
      {"{\"method\": \"ngram\", \"num_speculative_tokens\": 4, \"min_acceptance_rate\": \"x\"}", "min_acceptance_rate"},
      {"{\"method\": \"draft_model\", \"num_speculative_tokens\": 4}", "model"},
      {"{\"method\": \"ngram\", \"model\": \"/m/d.gguf\", \"num_speculative_tokens\": 4}", "model"},
      {"{\"model\": 3, \"num_speculative_tokens\": 4}", "model"},
      {"{\"model\": \"\", \"num_speculative_tokens\": 4}", "model"},
      {"{\"model\": \"/m/d.gguf\"}", "num_speculative_tokens"},
      {"{\"model\": \"/m/d.gguf\", \"num_speculative_tokens\": 4, \"prompt_lookup_min\": 1}", "prompt_lookup_min"},
      {"{\"method\": \"ngram\", \"num_speculative_tokens\": 4, \"num_speculative_tokens\": 2}", "not JSON"},
  };
  coord_spec_config_t c = cfg(7, 7, 7);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ck_assert_int_eq(coord_spec_parse(bad[i].json, &c), -EINVAL);
    ck_assert_msg(strstr(fr_last_error(), bad[i].needle), "%s: %s", bad[i].json, fr_last_error());
    ck_assert_int_eq(c.num_speculative_tokens, 7); /* unchanged on failure */
  }
}
END_TEST

static Suite *spec_suite(void) {
  Suite *s = suite_create("spec");
  TCase *tc = tcase_create("spec");
  tcase_add_test(tc, test_propose_most_recent_longest);
  tcase_add_test(tc, test_propose_no_match);
  tcase_add_test(tc, test_parse_vllm_spelling);
  tcase_add_test(tc, test_parse_errors_name_the_field);
  tcase_add_test(tc, test_parse_draft_model);
  suite_add_tcase(s, tc);
  return s;
}

const test_prog_t test_prog = {.suites = {spec_suite}};
