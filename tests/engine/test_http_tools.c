/* test_http_tools.c - the tool call parsers (hermes, llama3_json, mistral)
 * on outputs in the formats their model families document (Qwen2.5's
 * function-calling guide, Meta's Llama 3.1 JSON tool calling, Mistral's
 * v3 and v11 tokenizers): whole answers, the same text streamed in pieces
 * of every size (same content and calls), malformed calls kept as text;
 * the request's tools / tool_choice rules (vLLM's); the SSE deltas. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "coordinator/http/http_internal.h"
#include "coordinator/http/http_tools.h"

typedef struct {
  char content[4096];
  size_t n_calls;
  char names[8][64];
  char args[8][512];
  char ids[8][64];
} parsed_t;

static void collect(parsed_t *p, const coord_tool_out_t *o) {
  ck_assert_uint_lt(strlen(p->content) + o->content_len, sizeof p->content);
  if (o->content_len) strcat(p->content, o->content);
  for (size_t i = 0; i < o->n_calls; i++) {
    ck_assert_uint_lt(p->n_calls, 8);
    snprintf(p->names[p->n_calls], 64, "%s", o->calls[i].name);
    snprintf(p->args[p->n_calls], 512, "%s", o->calls[i].args);
    snprintf(p->ids[p->n_calls], 64, "%s", o->calls[i].id);
    p->n_calls++;
  }
}

/* Feeds text in pieces of `piece` bytes (0: whole). */
static void run(coord_tool_parser_t kind, const char *text, size_t piece, parsed_t *p) {
  memset(p, 0, sizeof *p);
  coord_tool_stream_t st;
  coord_tool_out_t o;
  coord_tool_stream_init(&st, kind, 42);
  coord_tool_out_init(&o);
  size_t n = strlen(text), step = piece ? piece : n;
  if (n == 0) step = 1;
  for (size_t i = 0; i < n || i == 0; i += step) {
    size_t k = i + step < n ? step : n - i;
    bool last = i + step >= n;
    ck_assert_int_eq(coord_tool_stream_feed(&st, text + i, k, last, &o), 0);
    collect(p, &o);
    if (last) break;
  }
  coord_tool_out_free(&o);
  coord_tool_stream_free(&st);
}

/* The whole answer, then every piece size gives the same result. */
static void check(coord_tool_parser_t kind, const char *text, const char *content, size_t n_calls, const char *const *names,
                  const char *const *args) {
  parsed_t whole, part;
  run(kind, text, 0, &whole);
  ck_assert_msg(!strcmp(whole.content, content), "content [%s], want [%s]", whole.content, content);
  ck_assert_uint_eq(whole.n_calls, n_calls);
  for (size_t i = 0; i < n_calls; i++) {
    ck_assert_str_eq(whole.names[i], names[i]);
    ck_assert_str_eq(whole.args[i], args[i]);
    json_t *j = json_loads(whole.args[i], 0, NULL); /* arguments are a JSON text */
    ck_assert_ptr_nonnull(j);
    json_decref(j);
  }
  for (size_t piece = 1; piece <= strlen(text); piece++) {
    run(kind, text, piece, &part);
    ck_assert_msg(!strcmp(part.content, content), "piece %zu: content [%s], want [%s]", piece, part.content, content);
    ck_assert_uint_eq(part.n_calls, n_calls);
    for (size_t i = 0; i < n_calls; i++) {
      ck_assert_str_eq(part.names[i], names[i]);
      ck_assert_str_eq(part.args[i], args[i]);
    }
  }
}

START_TEST(test_hermes) {
  /* Qwen2.5's function-calling guide, two parallel calls */
  const char *qwen =
      "<tool_call>\n{\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"San Francisco, CA, USA\"}}\n"
      "</tool_call>\n<tool_call>\n{\"name\": \"get_temperature_date\", \"arguments\": {\"location\": \"San Francisco, "
      "CA, USA\", \"date\": \"2024-10-01\"}}\n</tool_call>";
  const char *names[] = {"get_current_temperature", "get_temperature_date"};
  const char *args[] = {"{\"location\": \"San Francisco, CA, USA\"}",
                        "{\"location\": \"San Francisco, CA, USA\", \"date\": \"2024-10-01\"}"};
  check(COORD_TOOL_PARSER_HERMES, qwen, "", 2, names, args);
  /* text before the call stays content; an unclosed last call at the end is a call (vLLM) */
  const char *n1[] = {"get_weather"}, *a1[] = {"{\"city\": \"Paris\", \"days\": [1, 2.5e1, -3]}"};
  check(COORD_TOOL_PARSER_HERMES,
        "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": [1, "
        "2.5e1, -3]}}",
        "Let me check.", 1, n1, a1);
  /* no arguments: {}; arguments as a JSON string: its value */
  const char *n2[] = {"now", "f"}, *a2[] = {"{}", "{\"x\": 1}"};
  check(COORD_TOOL_PARSER_HERMES,
        "<tool_call>{\"name\": \"now\"}</tool_call><tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1}\"}"
        "</tool_call>",
        "", 2, n2, a2);
  /* plain text, text that looks like the marker's start, UTF-8 */
  check(COORD_TOOL_PARSER_HERMES, "The answer is 4 < 5 and <tool no. 3 h\xc3\xa9 ", "The answer is 4 < 5 and <tool no. 3 h\xc3\xa9 ",
        0, NULL, NULL);
  check(COORD_TOOL_PARSER_HERMES, "", "", 0, NULL, NULL);
}
END_TEST

START_TEST(test_hermes_malformed) {
  /* bad JSON, no name, a name that is not a string: text, as written */
  const char *bad[] = {
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n</tool_call>",
      "<tool_call>{\"arguments\": {}}</tool_call>",
      "<tool_call>{\"name\": 3}</tool_call>",
      "<tool_call>[1, 2]</tool_call>",
      "<tool_call>{\"name\": \"f\"} trailing</tool_call>",
      "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1",
      "<tool_call>",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) check(COORD_TOOL_PARSER_HERMES, bad[i], bad[i], 0, NULL, NULL);
  /* a good call after a bad one is still a call */
  const char *n[] = {"g"}, *a[] = {"{\"b\": true}"};
  check(COORD_TOOL_PARSER_HERMES, "<tool_call>{oops}</tool_call>\n<tool_call>{\"name\": \"g\", \"arguments\": {\"b\": true}}</tool_call>",
        "<tool_call>{oops}</tool_call>", 1, n, a);
}
END_TEST

START_TEST(test_llama3_json) {
  /* Meta's Llama 3.1 model card: JSON based tool calling */
  const char *n1[] = {"get_current_conditions"}, *a1[] = {"{\"location\": \"San Francisco, CA\", \"unit\": \"Fahrenheit\"}"};
  check(COORD_TOOL_PARSER_LLAMA3_JSON,
        "{\"name\": \"get_current_conditions\", \"parameters\": {\"location\": \"San Francisco, CA\", \"unit\": "
        "\"Fahrenheit\"}}",
        "", 1, n1, a1);
  /* <|python_tag|> (kept when special tokens are printed), several separated by ';' */
  const char *n2[] = {"a", "b"}, *a2[] = {"{\"x\": 1}", "{\"y\": [null]}"};
  check(COORD_TOOL_PARSER_LLAMA3_JSON,
        "<|python_tag|>{\"name\": \"a\", \"arguments\": {\"x\": 1}}; {\"name\": \"b\", \"parameters\": {\"y\": [null]}}",
        "", 2, n2, a2);
  /* numbers cut by a piece's end inside the arguments wait for the rest (found by fuzz_http_tools) */
  const char *n3[] = {"f"}, *a3[] = {"{\"x\": 2.5e1, \"y\": [0.5, -10]}"};
  check(COORD_TOOL_PARSER_LLAMA3_JSON, "{\"name\": \"f\", \"parameters\": {\"x\": 2.5e1, \"y\": [0.5, -10]}}", "", 1, n3, a3);
  /* text, and JSON that is not a call (no parameters: a JSON answer), stay text */
  check(COORD_TOOL_PARSER_LLAMA3_JSON, "The weather is fine.", "The weather is fine.", 0, NULL, NULL);
  check(COORD_TOOL_PARSER_LLAMA3_JSON, "{\"name\": \"Bob\", \"age\": 3}", "{\"name\": \"Bob\", \"age\": 3}", 0, NULL, NULL);
  check(COORD_TOOL_PARSER_LLAMA3_JSON, "{\"name\": \"f\", \"parameters\": {", "{\"name\": \"f\", \"parameters\": {", 0,
        NULL, NULL);
}
END_TEST

START_TEST(test_mistral) {
  /* Mistral v3 tokenizer (Mistral-7B-Instruct-v0.3): a JSON list */
  const char *n1[] = {"get_current_weather"}, *a1[] = {"{\"location\": \"Paris, France\", \"format\": \"celsius\"}"};
  check(COORD_TOOL_PARSER_MISTRAL,
        "[TOOL_CALLS] [{\"name\": \"get_current_weather\", \"arguments\": {\"location\": \"Paris, France\", \"format\": "
        "\"celsius\"}}]",
        "", 1, n1, a1);
  /* v11 tokenizers: name[ARGS]{...}, one marker per call; text before */
  const char *n2[] = {"get_weather", "get_time"}, *a2[] = {"{\"city\": \"Paris\"}", "{\"tz\": \"CET\"}"};
  check(COORD_TOOL_PARSER_MISTRAL,
        "Sure.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_time[ARGS]{\"tz\": \"CET\"}", "Sure.", 2,
        n2, a2);
  /* malformed lists stay text, whole */
  check(COORD_TOOL_PARSER_MISTRAL, "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {}}, {\"nam\": 1}]",
        "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {}}, {\"nam\": 1}]", 0, NULL, NULL);
  check(COORD_TOOL_PARSER_MISTRAL, "[TOOL_CALLS] [{", "[TOOL_CALLS] [{", 0, NULL, NULL);
  /* a list that is not JSON gives its marker back as text and the rest is read again (found by fuzz_http_tools:
   * streamed in pieces it used to differ from the whole answer) */
  const char *n3[] = {"get_time"}, *a3[] = {"{\"tz\": \"CET\"}"};
  check(COORD_TOOL_PARSER_MISTRAL, "Sure.[TOOL_CALLS] [{\"name\": \"x{\"a\"}][TOOL_CALLS]get_time[ARGS]{\"tz\": \"CET\"}",
        "Sure.[TOOL_CALLS] [{\"name\": \"x{\"a\"}]", 1, n3, a3);
  /* mistral ids: 9 alphanumerics */
  parsed_t p;
  run(COORD_TOOL_PARSER_MISTRAL, "[TOOL_CALLS]f[ARGS]{}", 0, &p);
  ck_assert_uint_eq(p.n_calls, 1);
  ck_assert_uint_eq(strlen(p.ids[0]), 9);
  run(COORD_TOOL_PARSER_HERMES, "<tool_call>{\"name\": \"f\"}</tool_call>", 0, &p);
  ck_assert(!strncmp(p.ids[0], "chatcmpl-tool-", 14));
}
END_TEST

START_TEST(test_forced) {
  coord_tool_out_t o;
  coord_tool_out_init(&o);
  ck_assert_int_eq(coord_tool_forced_calls(COORD_TOOL_CHOICE_REQUIRED, NULL,
                                           "[{\"name\": \"a\", \"parameters\": {\"x\": 1}}, {\"name\": \"b\", "
                                           "\"parameters\": {}}]", 72, 1, &o),
                   0);
  ck_assert_uint_eq(o.n_calls, 2);
  ck_assert_str_eq(o.calls[0].name, "a");
  ck_assert_str_eq(o.calls[0].args, "{\"x\": 1}");
  const char *named = " {\"city\": \"Paris\"} ";
  ck_assert_int_eq(coord_tool_forced_calls(COORD_TOOL_CHOICE_NAMED, "get_weather", named, strlen(named), 1, &o), 0);
  ck_assert_uint_eq(o.n_calls, 1);
  ck_assert_str_eq(o.calls[0].args, "{\"city\": \"Paris\"}");
  ck_assert_uint_eq(o.content_len, 0);
  /* cut short: no call, the text */
  ck_assert_int_eq(coord_tool_forced_calls(COORD_TOOL_CHOICE_NAMED, "get_weather", "{\"city\": \"Pa", 12, 1, &o), 0);
  ck_assert_uint_eq(o.n_calls, 0);
  ck_assert_str_eq(o.content, "{\"city\": \"Pa");
  coord_tool_out_free(&o);
}
END_TEST

static int parse_chat(const char *body, coord_http_req_t *r, coord_http_err_t *e) {
  return coord_http_req_parse(r, COORD_HTTP_API_CHAT, body, strlen(body), "smol", 4096, e);
}

#define MSGS "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"
#define TOOL "{\"type\":\"function\",\"function\":{\"name\":\"w\",\"parameters\":{\"type\":\"object\"}}}"

START_TEST(test_request_rules) {
  coord_http_req_t r;
  coord_http_err_t e;
  static const struct {
    const char *body;
    int status;
    coord_tool_choice_t choice;
  } cases[] = {
      {"{" MSGS "}", 0, COORD_TOOL_CHOICE_NONE},
      {"{" MSGS ",\"tools\":[" TOOL "]}", 0, COORD_TOOL_CHOICE_AUTO}, /* tools without a choice: auto */
      {"{" MSGS ",\"tools\":[" TOOL "],\"tool_choice\":\"none\"}", 0, COORD_TOOL_CHOICE_NONE},
      {"{" MSGS ",\"tools\":[" TOOL "],\"tool_choice\":\"required\"}", 0, COORD_TOOL_CHOICE_REQUIRED},
      {"{" MSGS ",\"tools\":[],\"tool_choice\":\"required\"}", 0, COORD_TOOL_CHOICE_NONE},
      {"{" MSGS ",\"tools\":[" TOOL "],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"w\"}}}", 0,
       COORD_TOOL_CHOICE_NAMED},
      {"{" MSGS ",\"tool_choice\":\"none\"}", 0, COORD_TOOL_CHOICE_NONE},
      {"{" MSGS ",\"tool_choice\":\"auto\"}", 400, 0}, /* a choice needs tools */
      {"{" MSGS ",\"tools\":[" TOOL "],\"tool_choice\":\"always\"}", 400, 0},
      {"{" MSGS ",\"tools\":[" TOOL "],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"x\"}}}", 400, 0},
      {"{" MSGS ",\"tools\":[" TOOL "],\"tool_choice\":{\"type\":\"function\"}}", 400, 0},
      {"{" MSGS ",\"tools\":[{\"type\":\"code\"}]}", 400, 0},
      {"{" MSGS ",\"tools\":[{\"type\":\"function\",\"function\":{}}]}", 400, 0},
      {"{" MSGS ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":3}}]}", 400, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int rc = parse_chat(cases[i].body, &r, &e);
    if (cases[i].status) {
      ck_assert_msg(rc == -1 && e.status == 400, "case %zu", i);
      ck_assert_str_eq(e.param, e.param && !strcmp(e.param, "tools") ? "tools" : "tool_choice");
      continue;
    }
    ck_assert_msg(rc == 0, "case %zu: %s", i, e.message);
    ck_assert_int_eq(r.tool_choice, cases[i].choice);
    if (r.tool_choice == COORD_TOOL_CHOICE_NAMED) ck_assert_str_eq(r.tool_name, "w");
    /* auto needs the flag and a parser */
    coord_tool_cfg_t off = {0}, on = {.parser = COORD_TOOL_PARSER_HERMES, .auto_choice = true};
    int want = r.tool_choice == COORD_TOOL_CHOICE_AUTO ? -1 : 0; /* required / named need no flag */
    ck_assert_int_eq(coord_tool_req_check(&r, &off, &e), want);
    if (want) ck_assert(strstr(e.message, "--enable-auto-tool-choice"));
    ck_assert_int_eq(coord_tool_req_check(&r, &on, &e), 0);
    /* a forced choice constrains the output to the calls' JSON schema */
    bool forced = r.tool_choice == COORD_TOOL_CHOICE_REQUIRED || r.tool_choice == COORD_TOOL_CHOICE_NAMED;
    ck_assert_int_eq(r.sub.guide.kind, forced ? PROTO_GUIDE_JSON : PROTO_GUIDE_NONE);
    coord_http_req_free(&r);
  }
}
END_TEST

START_TEST(test_stream_deltas) {
  coord_http_meta_t m = {.api = COORD_HTTP_API_CHAT, .id = "chatcmpl-1", .logprobs = -1,
                         .tool_parser = COORD_TOOL_PARSER_HERMES};
  coord_tool_out_t o;
  coord_tool_out_init(&o);
  coord_tool_stream_t st;
  coord_tool_stream_init(&st, COORD_TOOL_PARSER_HERMES, 7);
  const char *t = "Hi <tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}</tool_call>";
  proto_event_t ev = {.text = (char *)t, .finish = PROTO_FINISH_STOP};
  ck_assert_int_eq(coord_tool_stream_feed(&st, t, strlen(t), true, &o), 0);
  char *s = coord_http_chunk_sse_tools(&m, &ev, true, &o, 0, false, 0, NULL);
  ck_assert_ptr_nonnull(s);
  /* content first (with the role), then the head of the call, its arguments, the finish */
  const char *c = strstr(s, "\"content\":\"Hi\""), *h = strstr(s, "\"name\":\"f\""), *a = strstr(s, "\"arguments\":\"{\\\"a\\\": 1}\"");
  const char *f = strstr(s, "\"finish_reason\":\"tool_calls\"");
  ck_assert(c && h && a && f && c < h && h < a && a < f);
  ck_assert(strstr(s, "\"role\":\"assistant\""));
  ck_assert(strstr(s, "\"index\":0,\"id\":\"chatcmpl-tool-") || strstr(s, "\"id\":\"chatcmpl-tool-"));
  free(s);
  coord_tool_stream_free(&st);
  coord_tool_out_free(&o);
}
END_TEST

/* The shared main (tests/common/test_main.c) runs this program's suites. */
#include "tests/common/test_main.h"

static Suite *tools_suite(void) {
  Suite *s = suite_create("http_tools");
  TCase *tc = tcase_create("tools");
  tcase_add_test(tc, test_hermes);
  tcase_add_test(tc, test_hermes_malformed);
  tcase_add_test(tc, test_llama3_json);
  tcase_add_test(tc, test_mistral);
  tcase_add_test(tc, test_forced);
  tcase_add_test(tc, test_request_rules);
  tcase_add_test(tc, test_stream_deltas);
  suite_add_tcase(s, tc);
  return s;
}

const test_prog_t test_prog = {.suites = {tools_suite}};
