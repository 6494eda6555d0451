/* test_http_reason.c - the reasoning parsers (qwen3, deepseek_r1) on
 * outputs shaped as vLLM's reasoning parsers read them (Qwen3's
 * <think>...</think>answer; DeepSeek-R1's ...</think>answer with the
 * opening tag in the prompt): the whole text at once, and the same text
 * cut at every position (tags split across feeds) and in pieces of every
 * size, which must give the same reasoning and content; the names; the
 * answers' shapes (vLLM's): message.reasoning_content (null without a
 * think block) and content (null when the block is all there is), stream
 * deltas with reasoning_content alone, no chunk while a tag is held. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "coordinator/http/http_internal.h"
#include "coordinator/http/http_reason.h"

typedef struct {
  char reasoning[1024], content[1024];
  bool thought;
} split_t;

static void collect(split_t *p, const coord_reason_out_t *o) {
  ck_assert_uint_lt(strlen(p->reasoning) + o->reasoning_len, sizeof p->reasoning);
  ck_assert_uint_lt(strlen(p->content) + o->content_len, sizeof p->content);
  if (o->reasoning_len) strncat(p->reasoning, o->reasoning, o->reasoning_len);
  if (o->content_len) strncat(p->content, o->content, o->content_len);
  p->thought = o->thought;
}

/* Feeds text in the pieces that end at cuts[0..n_cuts) (increasing), then
 * the rest as the final feed. */
static void run_cuts(coord_reason_parser_t kind, const char *text, const size_t *cuts, size_t n_cuts, split_t *p) {
  memset(p, 0, sizeof *p);
  coord_reason_stream_t s;
  coord_reason_out_t o;
  coord_reason_stream_init(&s, kind);
  coord_reason_out_init(&o);
  size_t at = 0, len = strlen(text);
  for (size_t i = 0; i < n_cuts; i++) {
    ck_assert_int_eq(coord_reason_stream_feed(&s, text + at, cuts[i] - at, false, &o), 0);
    collect(p, &o);
    at = cuts[i];
  }
  ck_assert_int_eq(coord_reason_stream_feed(&s, text + at, len - at, true, &o), 0);
  collect(p, &o);
  coord_reason_out_free(&o);
  coord_reason_stream_free(&s);
}

/* The text whole, cut once at every position, twice at every pair of
 * positions, and in pieces of every size: always reasoning and content. */
static void expect(coord_reason_parser_t kind, const char *text, const char *reasoning, const char *content,
                   bool thought) {
  split_t p;
  size_t len = strlen(text), cuts[256];
  ck_assert_uint_lt(len, 256);
  run_cuts(kind, text, NULL, 0, &p);
  ck_assert_str_eq(p.reasoning, reasoning);
  ck_assert_str_eq(p.content, content);
  ck_assert_int_eq(p.thought, thought);
  for (size_t a = 0; a <= len; a++)
    for (size_t b = a; b <= len; b++) {
      cuts[0] = a, cuts[1] = b;
      run_cuts(kind, text, cuts, 2, &p);
      ck_assert_msg(!strcmp(p.reasoning, reasoning) && !strcmp(p.content, content) && p.thought == thought,
                    "[%s] cut at %zu and %zu: reasoning [%s] content [%s]", text, a, b, p.reasoning, p.content);
    }
  for (size_t piece = 1; piece <= len; piece++) {
    size_t n = 0;
    for (size_t at = piece; at < len; at += piece) cuts[n++] = at;
    run_cuts(kind, text, cuts, n, &p);
    ck_assert_msg(!strcmp(p.reasoning, reasoning) && !strcmp(p.content, content), "[%s] pieces of %zu", text, piece);
  }
}

START_TEST(qwen3_think_blocks) {
  coord_reason_parser_t q = COORD_REASON_PARSER_QWEN3;
  expect(q, "<think>\nThe user greets me.\n</think>\n\nHello!", "\nThe user greets me.\n", "\n\nHello!", true);
  expect(q, "<think></think>Paris.", "", "Paris.", true);
  expect(q, "<think>a </thinking> b < /think></think>c</think>", "a </thinking> b < /think>", "c</think>", true);
  expect(q, "<think>cut short by max_tokens </thi", "cut short by max_tokens </thi", "", true);
}
END_TEST

START_TEST(qwen3_without_thinking) {
  coord_reason_parser_t q = COORD_REASON_PARSER_QWEN3;
  /* enable_thinking false: the empty block is in the prompt, the output is all answer */
  expect(q, "\n\nHello there.", "", "\n\nHello there.", false);
  expect(q, "Hi <think>x</think>", "", "Hi <think>x</think>", false);
  expect(q, "<thin", "", "<thin", false);
  expect(q, "<thinker>", "", "<thinker>", false);
  expect(q, "", "", "", false);
}
END_TEST

START_TEST(deepseek_r1_think_blocks) {
  coord_reason_parser_t r = COORD_REASON_PARSER_DEEPSEEK_R1;
  expect(r, "Okay, 2 + 2 is 4.\n</think>\n\nThe answer is 4.", "Okay, 2 + 2 is 4.\n", "\n\nThe answer is 4.", true);
  expect(r, "<think>opened anyway</think>ok", "opened anyway", "ok", true);
  expect(r, "still thinking when it stopped", "still thinking when it stopped", "", true);
  expect(r, "a </think", "a </think", "", true);
  expect(r, "</think>", "", "", true);
  expect(r, "<thi", "<thi", "", true);
}
END_TEST

START_TEST(names) {
  coord_reason_parser_t p = COORD_REASON_PARSER_NONE;
  ck_assert_int_eq(coord_reason_parser_from_name("qwen3", &p), 0);
  ck_assert_int_eq(p, COORD_REASON_PARSER_QWEN3);
  ck_assert_int_eq(coord_reason_parser_from_name("deepseek_r1", &p), 0);
  ck_assert_int_eq(p, COORD_REASON_PARSER_DEEPSEEK_R1);
  ck_assert_int_eq(coord_reason_parser_from_name("deepseek-r1", &p), -1);
  ck_assert_int_eq(coord_reason_parser_from_name("", &p), -1);
  ck_assert_int_eq(coord_reason_parser_from_name(NULL, &p), -1);
  ck_assert_str_eq(coord_reason_parser_name(COORD_REASON_PARSER_DEEPSEEK_R1), "deepseek_r1");
  ck_assert_str_eq(coord_reason_parser_name(COORD_REASON_PARSER_NONE), "none");
}
END_TEST

/* The message of a chat answer whose output is text, parsed by kind. */
static json_t *final_message(coord_reason_parser_t kind, const char *text) {
  coord_http_meta_t m = {.api = COORD_HTTP_API_CHAT, .id = "chatcmpl-1", .logprobs = -1, .reasoning = kind};
  coord_http_acc_t a;
  coord_http_acc_init(&a);
  ck_assert_int_eq(coord_http_acc_text(&a, text, strlen(text)), 0);
  a.finish = PROTO_FINISH_STOP;
  const coord_http_acc_t *accs[1] = {&a};
  proto_usage_t u = {0};
  char *body = coord_http_final_json(&m, accs, 1, &u);
  ck_assert_ptr_nonnull(body);
  json_t *root = json_loads(body, 0, NULL);
  ck_assert_ptr_nonnull(root);
  json_t *msg = json_incref(json_object_get(json_array_get(json_object_get(root, "choices"), 0), "message"));
  json_decref(root);
  free(body);
  coord_http_acc_free(&a);
  return msg;
}

static void expect_message(json_t *msg, const char *reasoning, const char *content) {
  json_t *r = json_object_get(msg, "reasoning_content"), *c = json_object_get(msg, "content");
  ck_assert_ptr_nonnull(r); /* the field is there with a parser, null or not */
  if (reasoning) ck_assert_str_eq(json_string_value(r), reasoning);
  else ck_assert(json_is_null(r));
  if (content) ck_assert_str_eq(json_string_value(c), content);
  else ck_assert(json_is_null(c));
  json_decref(msg);
}

START_TEST(answers) {
  expect_message(final_message(COORD_REASON_PARSER_QWEN3, "<think>abc</think>Hi"), "abc", "Hi");
  expect_message(final_message(COORD_REASON_PARSER_QWEN3, "Hello"), NULL, "Hello");
  expect_message(final_message(COORD_REASON_PARSER_QWEN3, "<think>abc</think>"), "abc", NULL);
  expect_message(final_message(COORD_REASON_PARSER_DEEPSEEK_R1, "abc"), "abc", NULL);
  expect_message(final_message(COORD_REASON_PARSER_DEEPSEEK_R1, "abc</think>d"), "abc", "d");
  /* no parser: no field */
  json_t *msg = final_message(COORD_REASON_PARSER_NONE, "<think>abc</think>Hi");
  ck_assert_ptr_null(json_object_get(msg, "reasoning_content"));
  ck_assert_str_eq(json_string_value(json_object_get(msg, "content")), "<think>abc</think>Hi");
  json_decref(msg);
}
END_TEST

/* The delta of one chunk (NULL: no chunk). */
static json_t *chunk_delta(const char *content, const char *reasoning, bool first, bool last) {
  coord_http_meta_t m = {.api = COORD_HTTP_API_CHAT, .id = "chatcmpl-1", .logprobs = -1,
                         .reasoning = COORD_REASON_PARSER_QWEN3};
  proto_event_t ev = {.text = (char *)content, .text_len = (uint32_t)strlen(content),
                      .finish = last ? PROTO_FINISH_STOP : PROTO_FINISH_NONE, .stop_id = -1};
  coord_http_think_t think = {.r = reasoning, .r_len = reasoning ? strlen(reasoning) : 0};
  char *s = coord_http_chunk_sse(&m, &ev, first, 0, &think);
  ck_assert_ptr_nonnull(s);
  json_t *delta = NULL;
  if (*s) {
    ck_assert(!strncmp(s, "data: ", 6));
    json_t *root = json_loads(s + 6, 0, NULL);
    ck_assert_ptr_nonnull(root);
    delta = json_incref(json_object_get(json_array_get(json_object_get(root, "choices"), 0), "delta"));
    json_decref(root);
  }
  free(s);
  return delta;
}

START_TEST(stream_deltas) {
  json_t *d = chunk_delta("", "two plus", false, false);
  ck_assert_str_eq(json_string_value(json_object_get(d, "reasoning_content")), "two plus");
  ck_assert_ptr_null(json_object_get(d, "content"));
  json_decref(d);
  d = chunk_delta("The", " four", false, false); /* </think> inside the event: both */
  ck_assert_str_eq(json_string_value(json_object_get(d, "reasoning_content")), " four");
  ck_assert_str_eq(json_string_value(json_object_get(d, "content")), "The");
  json_decref(d);
  d = chunk_delta(" answer", NULL, false, false);
  ck_assert_str_eq(json_string_value(json_object_get(d, "content")), " answer");
  ck_assert_ptr_null(json_object_get(d, "reasoning_content"));
  json_decref(d);
  ck_assert_ptr_null(chunk_delta("", NULL, false, false)); /* a tag held back: no chunk */
  d = chunk_delta("", NULL, true, false); /* the first chunk carries the role */
  ck_assert_str_eq(json_string_value(json_object_get(d, "role")), "assistant");
  json_decref(d);
  d = chunk_delta("", NULL, false, true); /* the last one carries the finish */
  ck_assert_ptr_nonnull(d);
  json_decref(d);
}
END_TEST

#include "tests/common/test_main.h"

static Suite *reason_suite(void) {
  Suite *s = suite_create("http_reason");
  TCase *tc = tcase_create("parsers");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, qwen3_think_blocks);
  tcase_add_test(tc, qwen3_without_thinking);
  tcase_add_test(tc, deepseek_r1_think_blocks);
  tcase_add_test(tc, names);
  tcase_add_test(tc, answers);
  tcase_add_test(tc, stream_deltas);
  suite_add_tcase(s, tc);
  return s;
}

const test_prog_t test_prog = {.suites = {reason_suite}};
