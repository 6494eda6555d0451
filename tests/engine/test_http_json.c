/* test_http_json.c - request parsing and validation (coord_http_req_parse),
 * response shapes built from events, error bodies, and the metrics
 * registry's Prometheus text. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "coordinator/http/http_internal.h"
#include "coordinator/metrics.h"

static int parse(coord_http_api_t api, const char *body, coord_http_req_t *r, coord_http_err_t *e) {
  return coord_http_req_parse(r, api, body, strlen(body), "smol", 64, e);
}

START_TEST(test_parse_completion) {
  coord_http_req_t r;
  coord_http_err_t e;
  ck_assert_int_eq(parse(COORD_HTTP_API_COMPLETIONS,
                         "{\"prompt\":[\"hello\"],\"max_tokens\":5,\"top_k\":-1,\"seed\":-3,\"stream\":true,"
                         "\"stream_options\":{\"include_usage\":true},\"logprobs\":0,\"stop\":[\"x\",\"y\"]}",
                         &r, &e),
                   0);
  ck_assert_str_eq(r.sub.prompt, "hello");
  ck_assert_uint_eq(r.sub.prompt_len, 5);
  ck_assert_uint_eq(r.sub.max_tokens, 5);
  ck_assert_int_eq(r.sub.sp.top_k, 0);
  ck_assert(r.sub.sp.has_seed && r.sub.sp.seed == (uint64_t)-3);
  ck_assert(r.stream && r.include_usage && r.sub.stream);
  ck_assert_int_eq(r.logprobs, 0);
  ck_assert_int_eq(r.sub.sp.logprobs, 0);
  ck_assert_uint_eq(r.sub.stop.n_strs, 2);
  ck_assert_str_eq(r.sub.stop.strs[1], "y");
  ck_assert_uint_eq(r.sub.n_messages + r.sub.n_tokens, 0);
  /* a submit built from it passes the protocol's own checks */
  r.sub.id = 7;
  proto_buf_t b;
  proto_buf_init(&b);
  ck_assert_int_eq(proto_submit_encode(&b, &r.sub), 0);
  proto_buf_free(&b);
  coord_http_req_free(&r);
}
END_TEST

START_TEST(test_parse_chat) {
  coord_http_req_t r;
  coord_http_err_t e;
  ck_assert_int_eq(parse(COORD_HTTP_API_CHAT,
                         "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":null},"
                         "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\\u00e9\"},{\"type\":\"text\","
                         "\"text\":\"b\"}]}],\"logprobs\":true}",
                         &r, &e),
                   0);
  ck_assert_uint_eq(r.sub.n_messages, 3);
  ck_assert_str_eq(r.sub.messages[1].content, "");
  ck_assert_str_eq(r.sub.messages[2].content, "a\xc3\xa9" "b");
  ck_assert_uint_eq(r.sub.messages[2].content_len, 4);
  ck_assert_uint_eq(r.sub.max_tokens, 0); /* chat: until the context ends */
  ck_assert_int_eq(r.logprobs, 0);
  r.sub.id = 1;
  proto_buf_t b;
  proto_buf_init(&b);
  ck_assert_int_eq(proto_submit_encode(&b, &r.sub), 0);
  proto_buf_free(&b);
  coord_http_req_free(&r);
  /* the "off" values of fields ferrum does not act on, and fields that change no output, pass */
  ck_assert_int_eq(parse(COORD_HTTP_API_CHAT,
                         "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[],\"tool_choice\":\"none\","
                         "\"response_format\":{\"type\":\"text\"},\"logit_bias\":{},\"modalities\":[\"text\"],"
                         "\"functions\":null,\"parallel_tool_calls\":true,\"user\":\"u\",\"store\":false,"
                         "\"metadata\":{\"k\":\"v\"},\"min_tokens\":0,\"prompt_logprobs\":null,\"skip_special_tokens\":true,"
                         "\"include_stop_str_in_output\":false,\"truncate_prompt_tokens\":null}",
                         &r, &e),
                   0);
  coord_http_req_free(&r);
}
END_TEST

/* prompt_logprobs, echo with logprobs (the most alternatives of the two), max_tokens 0 with echo,
 * skip_special_tokens false */
START_TEST(test_parse_prompt_logprobs) {
  coord_http_req_t r;
  coord_http_err_t e;
  ck_assert_int_eq(parse(COORD_HTTP_API_COMPLETIONS, "{\"prompt\":\"a\",\"prompt_logprobs\":3}", &r, &e), 0);
  ck_assert(r.sub.ph.logprobs);
  ck_assert_uint_eq(r.sub.ph.logprobs_top, 3);
  ck_assert_int_eq(r.prompt_logprobs, 3);
  ck_assert(!r.sub.stop.keep_special);
  coord_http_req_free(&r);
  ck_assert_int_eq(parse(COORD_HTTP_API_COMPLETIONS,
                         "{\"prompt\":\"a\",\"echo\":true,\"logprobs\":5,\"prompt_logprobs\":2,\"max_tokens\":0,"
                         "\"skip_special_tokens\":false}",
                         &r, &e),
                   0);
  ck_assert(r.sub.ph.logprobs);
  ck_assert_uint_eq(r.sub.ph.logprobs_top, 5);
  ck_assert(r.no_output);
  ck_assert_uint_eq(r.sub.max_tokens, 1); /* one token generated, then dropped */
  ck_assert(r.sub.stop.keep_special);
  coord_http_req_free(&r);
  ck_assert_int_eq(parse(COORD_HTTP_API_COMPLETIONS, "{\"prompt\":\"a\",\"echo\":true}", &r, &e), 0);
  ck_assert(!r.sub.ph.logprobs); /* echo alone needs no prompt logprobs */
  coord_http_req_free(&r);
}
END_TEST

/* logit_bias (sorted by token for the wire), min_tokens, include_stop_str_in_output */
START_TEST(test_parse_sampling_fields) {
  coord_http_req_t r;
  coord_http_err_t e;
  ck_assert_int_eq(parse(COORD_HTTP_API_COMPLETIONS,
                         "{\"prompt\":\"a\",\"max_tokens\":9,\"logit_bias\":{\"300\":-100,\"12\":2.5,\"0\":100},"
                         "\"min_tokens\":4,\"stop\":\"x\",\"include_stop_str_in_output\":true}",
                         &r, &e),
                   0);
  ck_assert_uint_eq(r.sub.sp.n_bias, 3);
  ck_assert_int_eq(r.sub.sp.bias[0].token, 0);
  ck_assert_float_eq(r.sub.sp.bias[0].bias, 100);
  ck_assert_int_eq(r.sub.sp.bias[1].token, 12);
  ck_assert_float_eq(r.sub.sp.bias[1].bias, 2.5f);
  ck_assert_int_eq(r.sub.sp.bias[2].token, 300);
  ck_assert_uint_eq(r.sub.sp.min_tokens, 4);
  ck_assert(r.sub.stop.include);
  r.sub.id = 3;
  proto_buf_t b;
  proto_buf_init(&b);
  ck_assert_int_eq(proto_submit_encode(&b, &r.sub), 0); /* the wire takes it */
  proto_buf_free(&b);
  coord_http_req_free(&r);
  /* a top_p or temperature too small for a float (fuzz_http_json's find):
   * the top token alone, greedy; the wire takes them */
  ck_assert_int_eq(parse(COORD_HTTP_API_COMPLETIONS, "{\"prompt\":\"a\",\"top_p\":1e-300,\"temperature\":1e-300}",
                         &r, &e),
                   0);
  ck_assert(r.sub.sp.top_p > 0 && r.sub.sp.top_p < 1e-30f);
  ck_assert_float_eq(r.sub.sp.temperature, 0);
  r.sub.id = 4;
  proto_buf_init(&b);
  ck_assert_int_eq(proto_submit_encode(&b, &r.sub), 0);
  proto_buf_free(&b);
  coord_http_req_free(&r);
}
END_TEST

/* several prompts (text and token ids), n and best_of, truncate_prompt_tokens */
START_TEST(test_parse_prompts_and_choices) {
  coord_http_req_t r;
  coord_http_err_t e;
  ck_assert_int_eq(parse(COORD_HTTP_API_COMPLETIONS,
                         "{\"prompt\":[\"ab\",[5,6,7],\"c\"],\"n\":2,\"best_of\":3,\"max_tokens\":4,"
                         "\"truncate_prompt_tokens\":2,\"user\":\"u\"}",
                         &r, &e),
                   0);
  ck_assert_uint_eq(r.n_prompts, 3);
  ck_assert_uint_eq(r.n, 2);
  ck_assert_uint_eq(r.best_of, 3);
  ck_assert_int_eq(r.sub.sp.logprobs, 0); /* best_of ranks by cumulative logprob */
  ck_assert_int_eq(r.logprobs, -1);       /* ... which the answer does not show */
  ck_assert_uint_eq(r.sub.ph.truncate, 2);
  ck_assert_str_eq(r.sub.prompt, "ab");
  proto_buf_t b;
  proto_buf_init(&b);
  r.sub.id = 9;
  for (uint32_t i = 0; i < r.n_prompts; i++) {
    coord_http_req_prompt(&r, i);
    ck_assert_int_eq(proto_submit_encode(&b, &r.sub), 0);
  }
  coord_http_req_prompt(&r, 1);
  ck_assert_uint_eq(r.sub.n_tokens, 3);
  ck_assert_int_eq(r.sub.tokens[2], 7);
  ck_assert_ptr_null(r.sub.prompt);
  proto_buf_free(&b);
  coord_http_req_free(&r);
  /* truncation lets a token prompt longer than the context (64) in */
  char body[1024] = "{\"prompt\":[";
  for (int i = 0; i < 100; i++) strcat(body, i ? ",1" : "1");
  strcat(body, "],\"truncate_prompt_tokens\":10,\"max_tokens\":5}");
  ck_assert_int_eq(parse(COORD_HTTP_API_COMPLETIONS, body, &r, &e), 0);
  ck_assert_uint_eq(r.sub.n_tokens, 100);
  coord_http_req_free(&r);
  body[strlen(body) - strlen(",\"truncate_prompt_tokens\":10,\"max_tokens\":5}")] = 0;
  strcat(body, "}");
  ck_assert_int_eq(parse(COORD_HTTP_API_COMPLETIONS, body, &r, &e), -1);
  ck_assert_str_eq(e.param, "prompt");
  /* chat: n */
  ck_assert_int_eq(parse(COORD_HTTP_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":4}", &r, &e), 0);
  ck_assert_uint_eq(r.n, 4);
  ck_assert_uint_eq(r.best_of, 4);
  ck_assert_uint_eq(r.n_prompts, 1);
  coord_http_req_free(&r);
}
END_TEST

START_TEST(test_parse_errors) {
  static const struct {
    coord_http_api_t api;
    const char *body;
    int status;
    const char *param;
  } cases[] = {
      {COORD_HTTP_API_COMPLETIONS, "nul", 400, NULL},
      {COORD_HTTP_API_COMPLETIONS, "{\"prompt\":\"a\\u0000b\"}", 400, NULL},
      {COORD_HTTP_API_COMPLETIONS, "{\"prompt\":\"a\",\"n\":3,\"best_of\":2}", 400, "best_of"},
      {COORD_HTTP_API_COMPLETIONS, "{\"prompt\":\"a\",\"best_of\":2,\"stream\":true}", 400, "best_of"},
      {COORD_HTTP_API_COMPLETIONS, "{\"prompt\":\"a\",\"n\":0}", 400, "n"},
      {COORD_HTTP_API_COMPLETIONS, "{\"prompt\":[\"a\",\"b\"],\"n\":200}", 400, "n"},
      {COORD_HTTP_API_COMPLETIONS, "{\"prompt\":[\"a\",[]]}", 400, "prompt"},
      {COORD_HTTP_API_COMPLETIONS, "{\"prompt\":[\"a\",[1,\"x\"]]}", 400, "prompt"},
      {COORD_HTTP_API_COMPLETIONS, "{\"prompt\":\"a\",\"truncate_prompt_tokens\":0}", 400, "truncate_prompt_tokens"},
      {COORD_HTTP_API_COMPLETIONS, "{\"prompt\":[1,2,3],\"truncate_prompt_tokens\":\"2\"}", 400, "truncate_prompt_tokens"},
      {COORD_HTTP_API_COMPLETIONS, "{\"prompt\":\"a\",\"max_tokens\":0}", 400, "max_tokens"}, /* 0 only with echo */
      {COORD_HTTP_API_COMPLETIONS, "{\"prompt\":\"a\",\"max_tokens\":0,\"echo\":true,\"stream\":true}", 400,
       "max_tokens"},
      {COORD_HTTP_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"echo\":true}", 400, "echo"},
      {COORD_HTTP_API_COMPLETIONS, "{\"prompt\":\"a\",\"seed\":1e400}", 400, NULL},
      {COORD_HTTP_API_COMPLETIONS, "{\"prompt\":\"a\",\"stream\":1}", 400, "stream"},
      {COORD_HTTP_API_COMPLETIONS, "{\"prompt\":\"a\",\"min_p\":2}", 400, "min_p"},
      {COORD_HTTP_API_COMPLETIONS, "{\"prompt\":\"a\",\"repetition_penalty\":0}", 400, "repetition_penalty"},
      {COORD_HTTP_API_COMPLETIONS, "{\"prompt\":\"a\",\"presence_penalty\":2.5}", 400, "presence_penalty"},
      {COORD_HTTP_API_COMPLETIONS, "{\"prompt\":\"a\",\"stop_token_ids\":[\"x\"]}", 400, "stop_token_ids"},
      {COORD_HTTP_API_COMPLETIONS, "{\"prompt\":[1,2147483648]}", 400, "prompt"},
      {COORD_HTTP_API_COMPLETIONS, "{\"prompt\":\"\"}", 400, "prompt"},
      {COORD_HTTP_API_COMPLETIONS, "{\"prompt\":\"a\",\"model\":7}", 400, "model"},
      {COORD_HTTP_API_COMPLETIONS, "{\"prompt\":\"a\",\"model\":\"other\"}", 404, "model"},
      {COORD_HTTP_API_CHAT, "{\"messages\":{}}", 400, "messages"},
      {COORD_HTTP_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400, "messages"},
      {COORD_HTTP_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", 400, "messages"},
      {COORD_HTTP_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_completion_tokens\":0}", 400,
       "max_completion_tokens"},
      /* fields ferrum does not act on yet: a 400 naming them, not a 200 that ignored them */
      /* tools go to the chat template, but must be a list; chat_template_kwargs an object */
      {COORD_HTTP_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":{\"type\":\"function\"}}", 400,
       "tools"},
      {COORD_HTTP_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"chat_template_kwargs\":[1]}", 400,
       "chat_template_kwargs"},
      {COORD_HTTP_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"required\"}", 400,
       "tool_choice"},
      /* output constraints the grammar cannot do, or two at once */
      {COORD_HTTP_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"yaml\"}}",
       400, "response_format"},
      {COORD_HTTP_API_CHAT,
       "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
       "{\"name\":\"n\",\"schema\":{\"type\":\"string\",\"format\":\"email\"}}}}",
       400, "response_format"},
      {COORD_HTTP_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_object\"},"
       "\"guided_regex\":\"a+\"}", 400, "guided_regex"},
      {COORD_HTTP_API_COMPLETIONS, "{\"prompt\":\"a\",\"guided_regex\":\"(a\"}", 400, "guided_regex"},
      {COORD_HTTP_API_COMPLETIONS, "{\"prompt\":\"a\",\"guided_choice\":[]}", 400, "guided_choice"},
      {COORD_HTTP_API_COMPLETIONS, "{\"prompt\":\"a\",\"structured_outputs\":{\"grammar\":\"root ::= x\"}}", 400,
       "structured_outputs"},
      {COORD_HTTP_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"modalities\":[\"audio\"]}", 400,
       "modalities"},
      /* bad values of the sampling fields ferrum acts on */
      {COORD_HTTP_API_COMPLETIONS, "{\"prompt\":\"a\",\"logit_bias\":{\"50256\":-100.5}}", 400, "logit_bias"},
      {COORD_HTTP_API_COMPLETIONS, "{\"prompt\":\"a\",\"logit_bias\":{\"50256\":\"1\"}}", 400, "logit_bias"},
      {COORD_HTTP_API_COMPLETIONS, "{\"prompt\":\"a\",\"logit_bias\":{\"x\":1}}", 400, "logit_bias"},
      {COORD_HTTP_API_COMPLETIONS, "{\"prompt\":\"a\",\"logit_bias\":{\"-1\":1}}", 400, "logit_bias"},
      {COORD_HTTP_API_COMPLETIONS, "{\"prompt\":\"a\",\"logit_bias\":{\"7\":1,\"07\":2}}", 400, "logit_bias"},
      {COORD_HTTP_API_COMPLETIONS, "{\"prompt\":\"a\",\"logit_bias\":[1]}", 400, "logit_bias"},
      {COORD_HTTP_API_COMPLETIONS, "{\"prompt\":\"a\",\"min_tokens\":-1}", 400, "min_tokens"},
      {COORD_HTTP_API_COMPLETIONS, "{\"prompt\":\"a\",\"min_tokens\":1.5}", 400, "min_tokens"},
      {COORD_HTTP_API_COMPLETIONS, "{\"prompt\":\"a\",\"max_tokens\":4,\"min_tokens\":5}", 400, "min_tokens"},
      {COORD_HTTP_API_COMPLETIONS, "{\"prompt\":\"a\",\"include_stop_str_in_output\":1}", 400,
       "include_stop_str_in_output"},
      {COORD_HTTP_API_COMPLETIONS, "{\"prompt\":\"a\",\"suffix\":\"b\"}", 400, "suffix"},
      {COORD_HTTP_API_COMPLETIONS, "{\"prompt\":\"a\",\"prompt_logprobs\":21}", 400, "prompt_logprobs"},
      {COORD_HTTP_API_COMPLETIONS, "{\"prompt\":\"a\",\"prompt_logprobs\":-1}", 400, "prompt_logprobs"},
      {COORD_HTTP_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"prompt_logprobs\":1,\"stream\":true}", 400,
       "prompt_logprobs"}, /* not streamed for chat yet */
      {COORD_HTTP_API_COMPLETIONS, "{\"prompt\":\"a\",\"guided_json\":{\"type\":\"object\",\"minProperties\":1}}", 400,
       "guided_json"},
      {COORD_HTTP_API_COMPLETIONS, "{\"prompt\":\"a\",\"skip_special_tokens\":0}", 400, "skip_special_tokens"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    coord_http_req_t r;
    coord_http_err_t e;
    ck_assert_msg(parse(cases[i].api, cases[i].body, &r, &e) == -1, "accepted %s", cases[i].body);
    ck_assert_msg(e.status == cases[i].status, "%s: status %d", cases[i].body, e.status);
    if (cases[i].param) ck_assert_msg(e.param && !strcmp(e.param, cases[i].param), "%s: param %s", cases[i].body, e.param);
    ck_assert(e.message[0]);
    ck_assert_ptr_null(r.root); /* freed on failure */
  }
}
END_TEST

START_TEST(test_error_json) {
  coord_http_err_t e;
  coord_http_err(&e, 429, NULL, "full \"queue\"");
  char *s = coord_http_error_json(&e);
  json_t *j = json_loads(s, 0, NULL), *o = json_object_get(j, "error");
  ck_assert_str_eq(json_string_value(json_object_get(o, "message")), "full \"queue\"");
  ck_assert_str_eq(json_string_value(json_object_get(o, "type")), "rate_limit_error");
  ck_assert(json_is_null(json_object_get(o, "param")));
  ck_assert_str_eq(json_string_value(json_object_get(o, "code")), "rate_limit_exceeded");
  json_decref(j);
  free(s);
  coord_http_err(&e, 400, "x", "bad \xff bytes"); /* not UTF-8: still valid JSON */
  s = coord_http_error_json(&e);
  ck_assert_ptr_nonnull(s);
  j = json_loads(s, 0, NULL);
  ck_assert_ptr_nonnull(j);
  json_decref(j);
  free(s);
  coord_http_err_from_proto(&e, PROTO_ERR_UNAVAILABLE, "draining");
  ck_assert_int_eq(e.status, 503);
  coord_http_err_from_proto(&e, PROTO_ERR_TOO_BIG, "prompt too long");
  ck_assert_int_eq(e.status, 400);
  ck_assert_str_eq(e.code, "context_length_exceeded");
  coord_http_err_from_proto(&e, PROTO_ERR_BUSY, "full");
  ck_assert_int_eq(e.status, 429);
  coord_http_err_from_proto(&e, 7, NULL);
  ck_assert_int_eq(e.status, 500);
}
END_TEST

START_TEST(test_final_json_utf8) {
  coord_http_meta_t m = {.api = COORD_HTTP_API_COMPLETIONS, .id = "cmpl-1", .created = 5, .model = "smol", .logprobs = -1};
  coord_http_acc_t a;
  coord_http_acc_init(&a);
  int32_t t[2] = {1, 2};
  proto_event_t ev = {.id = 1, .text = "caf\xc3\xa9", .n_tokens = 2, .tokens = t};
  ck_assert_int_eq(coord_http_acc_add(&a, &m, &ev), 0);
  proto_event_t fin = {.id = 1, .finish = PROTO_FINISH_STOP, .has_usage = true, .usage = {4, 2, 3}, .stop_id = -1};
  ck_assert_int_eq(coord_http_acc_add(&a, &m, &fin), 0);
  const coord_http_acc_t *accs[2] = {&a, &a};
  char *s = coord_http_final_json(&m, accs, 2, &a.usage);
  json_t *j = json_loads(s, 0, NULL);
  json_t *c = json_array_get(json_object_get(j, "choices"), 0);
  ck_assert_str_eq(json_string_value(json_object_get(c, "text")), "caf\xc3\xa9");
  ck_assert_str_eq(json_string_value(json_object_get(c, "finish_reason")), "stop");
  ck_assert(json_is_null(json_object_get(c, "stop_reason"))); /* EOS: null, as vLLM */
  ck_assert_int_eq(json_integer_value(json_object_get(json_array_get(json_object_get(j, "choices"), 1), "index")), 1);
  json_t *u = json_object_get(j, "usage");
  ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens")), 3);
  json_decref(j);
  free(s);
  coord_http_acc_free(&a);
}
END_TEST

START_TEST(test_metrics_text) {
  coord_metrics_t *m;
  ck_assert_int_eq(coord_metrics_create(&m, "a\"b\\c\nd"), 0);
  coord_metrics_ttft(m, 0.005); /* on a bound: counts in le="0.005" */
  coord_metrics_ttft(m, 0.3);
  coord_metrics_ttft(m, 1e9);   /* +Inf only */
  coord_metrics_ttft(m, NAN);   /* as 0 */
  coord_metrics_tokens(m, 10, 3);
  coord_metrics_tokens(m, 5, 1);
  coord_metrics_prefix(m, 32, 16);
  coord_metrics_preemption(m, 2);
  coord_metrics_set_kv(m, 25, 100);
  coord_metrics_set_waiting(m, 4);
  coord_metrics_request_finish(m, COORD_METRICS_FINISH_LENGTH);
  coord_metrics_request_finish(m, (coord_metrics_finish_t)99); /* out of range: abort */
  coord_rank_times_t rt = {.forward_us = 1500, .comm_us = 250, .sample_us = 500, .total_us = 2100};
  coord_metrics_rank_step(m, 1, &rt);
  coord_metrics_rank_step(m, 1, &rt);
  coord_metrics_rank_step(m, COORD_METRICS_MAX_RANKS, &rt); /* past the table: not counted */
  coord_metrics_step(m, 2500000);
  coord_metrics_step(m, 2000000);
  char *t;
  size_t len;
  ck_assert_int_eq(coord_metrics_render(m, &t, &len), 0);
  ck_assert_uint_eq(strlen(t), len);
#define L "model_name=\"a\\\"b\\\\c\\nd\""
  ck_assert(strstr(t, "ferrum:time_to_first_token_seconds_bucket{le=\"0.001\"," L "} 1\n"));
  ck_assert(strstr(t, "ferrum:time_to_first_token_seconds_bucket{le=\"0.005\"," L "} 2\n"));
  ck_assert(strstr(t, "ferrum:time_to_first_token_seconds_bucket{le=\"0.25\"," L "} 2\n"));
  ck_assert(strstr(t, "ferrum:time_to_first_token_seconds_bucket{le=\"0.5\"," L "} 3\n"));
  ck_assert(strstr(t, "ferrum:time_to_first_token_seconds_bucket{le=\"2560\"," L "} 3\n"));
  ck_assert(strstr(t, "ferrum:time_to_first_token_seconds_bucket{le=\"+Inf\"," L "} 4\n"));
  ck_assert(strstr(t, "ferrum:time_to_first_token_seconds_count{" L "} 4\n"));
  ck_assert(strstr(t, "# TYPE ferrum:time_to_first_token_seconds histogram\n"));
  ck_assert(strstr(t, "ferrum:prompt_tokens_total{" L "} 15\n"));
  ck_assert(strstr(t, "ferrum:generation_tokens_total{" L "} 4\n"));
  ck_assert(strstr(t, "ferrum:prefix_cache_queries_total{" L "} 32\n"));
  ck_assert(strstr(t, "ferrum:prefix_cache_hits_total{" L "} 16\n"));
  ck_assert(strstr(t, "ferrum:num_preemptions_total{" L "} 2\n"));
  ck_assert(strstr(t, "ferrum:kv_cache_usage_perc{" L "} 0.25\n"));
  ck_assert(strstr(t, "ferrum:num_requests_waiting{" L "} 4\n"));
  ck_assert(strstr(t, "ferrum:request_success_total{finished_reason=\"length\"," L "} 1\n"));
  ck_assert(strstr(t, "ferrum:request_success_total{finished_reason=\"abort\"," L "} 1\n"));
  ck_assert(strstr(t, "# TYPE ferrum:prompt_tokens_total counter\n"));
  ck_assert(strstr(t, "ferrum:worker_steps_total{" L ",rank=\"1\"} 2\n"));
  ck_assert(strstr(t, "ferrum:worker_forward_seconds_total{" L ",rank=\"1\"} 0.003000\n"));
  ck_assert(strstr(t, "ferrum:worker_sample_seconds_total{" L ",rank=\"1\"} 0.001000\n"));
  ck_assert(strstr(t, "ferrum:worker_step_seconds_total{" L ",rank=\"1\"} 0.004200\n"));
  ck_assert(!strstr(t, "rank=\"0\"")); /* a rank with no steps has no samples */
  ck_assert(strstr(t, "ferrum:steps_total{" L "} 2\n"));
  ck_assert(strstr(t, "ferrum:step_round_trip_seconds_total{" L "} 0.004500\n"));
  /* the sum: 0.005 + 0.3 + 1e9 + 0 */
  const char *sum = strstr(t, "ferrum:time_to_first_token_seconds_sum{" L "} ");
  ck_assert_ptr_nonnull(sum);
  ck_assert_double_eq_tol(strtod(strchr(sum, '}') + 2, NULL), 1e9 + 0.305, 1e-3);
  /* every line is a comment or "name{labels} value" */
  for (char *line = t; *line;) {
    char *nl = strchr(line, '\n');
    ck_assert_ptr_nonnull(nl);
    ck_assert(line[0] == '#' || (!strncmp(line, "ferrum:", 7) && strchr(line, '}') && strchr(line, '}') < nl));
    line = nl + 1;
  }
  free(t);
  coord_metrics_destroy(m);
}
END_TEST

/* The shared main (tests/common/test_main.c) runs this program's suites. */
#include "tests/common/test_main.h"

static Suite *json_suite(void) {
  Suite *s = suite_create("http_json");
  TCase *tc = tcase_create("json");
  tcase_add_test(tc, test_parse_completion);
  tcase_add_test(tc, test_parse_chat);
  tcase_add_test(tc, test_parse_sampling_fields);
  tcase_add_test(tc, test_parse_prompt_logprobs);
  tcase_add_test(tc, test_parse_prompts_and_choices);
  tcase_add_test(tc, test_parse_errors);
  tcase_add_test(tc, test_error_json);
  tcase_add_test(tc, test_final_json_utf8);
  tcase_add_test(tc, test_metrics_text);
  suite_add_tcase(s, tc);
  return s;
}

const test_prog_t test_prog = {.suites = {json_suite}};
