/* test_http.c - the HTTP frontend against a fake coordinator (http_fake.h):
 * OpenAI response shapes (JSON and SSE), field parsing into the submit,
 * error statuses and bodies, disconnect -> cancel, body limits, slow
 * clients, /health, /models, /metrics. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <jansson.h>
#include <netinet/in.h>
#include <zmq.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "coordinator/http/http.h"
#include "ctl/http_client.h"
#include "coordinator/metrics.h"
#include "tests/engine/http_fake.h"

#define EP "inproc://fake-coord"

static void *ctx;
static http_fake_t fake;
static coord_metrics_t *metrics;
static coord_http_t *srv;
static int port;
static unsigned request_timeout_s; /* 0: the server's default */
static unsigned keepalive_ms, engine_timeout_ms, per_ip; /* 0: the server's defaults */
static bool start_not_ready; /* start_server leaves the workers "not ready" (as serve starts) */

static void start_server(const char *api_key, unsigned max_conn, unsigned timeout_s) {
  ctx = zmq_ctx_new();
  ck_assert_int_eq(http_fake_start(&fake, ctx, EP), 0);
  ck_assert_int_eq(coord_metrics_create(&metrics, "smol"), 0);
  coord_http_config_t cfg = {.zmq_ctx = ctx, .rpc_endpoint = EP, .host = "127.0.0.1", .port = 0, .api_key = api_key,
                             .served_model_name = "smol", .max_model_len = 100, .metrics = metrics,
                             .max_connections = max_conn, .timeout_s = timeout_s,
                             .request_timeout_s = request_timeout_s, .keepalive_ms = keepalive_ms,
                             .engine_timeout_ms = engine_timeout_ms, .max_connections_per_ip = per_ip};
  ck_assert_int_eq(coord_http_start(&srv, &cfg), 0);
  port = coord_http_port(srv);
  ck_assert_int_gt(port, 0);
  if (!start_not_ready) coord_http_set_ready(srv, true);
}

static void setup(void) { start_server(NULL, 0, 0); }

/* Stops the server; the next one starts with the default knobs unless the
 * test sets them after this (CK_FORK=no runs every test in one process). */
static void teardown(void) {
  coord_http_stop(srv);
  http_fake_stop(&fake);
  coord_metrics_destroy(metrics);
  zmq_ctx_term(ctx);
  request_timeout_s = keepalive_ms = engine_timeout_ms = per_ip = 0;
  start_not_ready = false;
}

/* One request; returns the status and the body (malloc'd). */
static int http(const char *method, const char *path, const char *extra, const char *body, char **out) {
  cli_http_t c;
  ck_assert_int_eq(cli_http_connect(&c, "127.0.0.1", port, 5000), 0);
  ck_assert_int_eq(cli_http_send(&c, method, path, extra, body, body ? strlen(body) : 0), 0);
  char *b;
  ck_assert_int_eq(cli_http_read_all(&c, 1 << 20, &b, NULL), 0);
  int st = c.status;
  cli_http_close(&c);
  if (out) *out = b;
  else free(b);
  return st;
}

static json_t *post(const char *path, const char *body, int *status) {
  char *b;
  *status = http("POST", path, NULL, body, &b);
  json_error_t je;
  json_t *j = json_loads(b, 0, &je);
  ck_assert_msg(j != NULL, "not JSON: %s", b);
  free(b);
  return j;
}

static const char *jstr(json_t *j, const char *path) {
  json_t *v = json_object_get(j, path);
  return json_is_string(v) ? json_string_value(v) : "";
}

/* Checks OpenAI's error shape and returns error.param (or ""). */
static void check_error(const char *path, const char *body, int want, const char *param) {
  int st;
  json_t *j = post(path, body, &st);
  ck_assert_msg(st == want, "%s -> %d, want %d", body, st, want);
  json_t *e = json_object_get(j, "error");
  ck_assert(json_is_object(e));
  ck_assert(json_is_string(json_object_get(e, "message")) && json_string_length(json_object_get(e, "message")) > 0);
  ck_assert(json_is_string(json_object_get(e, "type")));
  ck_assert(json_object_get(e, "param") && json_object_get(e, "code"));
  if (param) ck_assert_str_eq(jstr(e, "param"), param);
  json_decref(j);
}

START_TEST(test_models_and_health) {
  char *b;
  ck_assert_int_eq(http("GET", "/v1/models", NULL, NULL, &b), 200);
  json_t *j = json_loads(b, 0, NULL);
  free(b);
  ck_assert_str_eq(jstr(j, "object"), "list");
  json_t *m = json_array_get(json_object_get(j, "data"), 0);
  ck_assert_str_eq(jstr(m, "id"), "smol");
  ck_assert_str_eq(jstr(m, "object"), "model");
  ck_assert_int_eq(json_integer_value(json_object_get(m, "max_model_len")), 100);
  json_decref(j);
  ck_assert_int_eq(http("GET", "/health", NULL, NULL, NULL), 200);
  /* not ready again (a worker restarts): /health says so, jobs still go to the queue */
  coord_http_set_ready(srv, false);
  ck_assert_int_eq(http("GET", "/health", NULL, NULL, NULL), 503);
  int st;
  json_t *c = post("/v1/completions", "{\"prompt\":\"hi\"}", &st);
  ck_assert_int_eq(st, 200);
  ck_assert_str_eq(jstr(c, "object"), "text_completion");
  json_decref(c);
  coord_http_set_ready(srv, true);
  coord_http_set_draining(srv);
  ck_assert_int_eq(http("GET", "/health", NULL, NULL, NULL), 503);
  check_error("/v1/completions", "{\"prompt\":\"hi\"}", 503, NULL);
}
END_TEST

/* Before the workers have been ready once, jobs are refused (503), not queued. */
START_TEST(test_refused_until_first_ready) {
  teardown();
  start_not_ready = true;
  start_server(NULL, 0, 0);
  ck_assert_int_eq(http("GET", "/health", NULL, NULL, NULL), 503);
  check_error("/v1/completions", "{\"prompt\":\"hi\"}", 503, NULL);
  ck_assert_int_eq(atomic_load(&fake.n_submits), 0);
  coord_http_set_ready(srv, true);
  int st;
  json_t *c = post("/v1/completions", "{\"prompt\":\"hi\"}", &st);
  ck_assert_int_eq(st, 200);
  json_decref(c);
}
END_TEST

START_TEST(test_completion_json) {
  int st;
  json_t *j = post("/v1/completions",
                   "{\"model\":\"smol\",\"prompt\":\"hi\",\"max_tokens\":3,\"temperature\":0.5,\"top_p\":0.9,"
                   "\"top_k\":7,\"min_p\":0.1,\"seed\":42,\"stop\":\"\\n\",\"ignore_eos\":true,"
                   "\"repetition_penalty\":1.1,\"presence_penalty\":0.5,\"frequency_penalty\":-0.5,\"user\":\"x\"}",
                   &st);
  ck_assert_int_eq(st, 200);
  ck_assert_str_eq(jstr(j, "object"), "text_completion");
  ck_assert(!strncmp(jstr(j, "id"), "cmpl-", 5));
  ck_assert_str_eq(jstr(j, "model"), "smol");
  ck_assert(json_is_integer(json_object_get(j, "created")));
  json_t *c = json_array_get(json_object_get(j, "choices"), 0);
  ck_assert_str_eq(jstr(c, "text"), "Hello world");
  ck_assert_str_eq(jstr(c, "finish_reason"), "length");
  ck_assert_int_eq(json_integer_value(json_object_get(c, "index")), 0);
  ck_assert(json_is_null(json_object_get(c, "logprobs")));
  json_t *u = json_object_get(j, "usage");
  ck_assert_int_eq(json_integer_value(json_object_get(u, "prompt_tokens")), 5);
  ck_assert_int_eq(json_integer_value(json_object_get(u, "completion_tokens")), 3);
  ck_assert_int_eq(json_integer_value(json_object_get(u, "total_tokens")), 8);
  json_decref(j);
  /* what reached the coordinator */
  pthread_mutex_lock(&fake.mu);
  ck_assert_float_eq_tol(fake.sp.temperature, 0.5f, 1e-6);
  ck_assert_float_eq_tol(fake.sp.top_p, 0.9f, 1e-6);
  ck_assert_int_eq(fake.sp.top_k, 7);
  ck_assert_float_eq_tol(fake.sp.min_p, 0.1f, 1e-6);
  ck_assert(fake.sp.has_seed && fake.sp.seed == 42);
  ck_assert_float_eq_tol(fake.sp.repetition_penalty, 1.1f, 1e-6);
  ck_assert_float_eq_tol(fake.sp.presence_penalty, 0.5f, 1e-6);
  ck_assert_float_eq_tol(fake.sp.frequency_penalty, -0.5f, 1e-6);
  ck_assert_int_eq(fake.sp.logprobs, -1);
  ck_assert_uint_eq(fake.max_tokens, 3);
  ck_assert_uint_eq(fake.n_stop, 1);
  ck_assert_str_eq(fake.stop0, "\n");
  ck_assert(fake.ignore_eos && !fake.stream);
  pthread_mutex_unlock(&fake.mu);
}
END_TEST

START_TEST(test_completion_tokens_defaults) {
  int st;
  json_t *j = post("/v1/completions", "{\"prompt\":[[5,6,7]],\"stop\":[\"a\",\"\",\"b\"],\"stop_token_ids\":[2,3]}", &st);
  ck_assert_int_eq(st, 200);
  ck_assert_str_eq(jstr(json_array_get(json_object_get(j, "choices"), 0), "finish_reason"), "stop");
  json_decref(j);
  pthread_mutex_lock(&fake.mu);
  ck_assert_uint_eq(fake.n_tokens, 3);
  ck_assert_int_eq(fake.token0, 5);
  ck_assert_uint_eq(fake.max_tokens, 16); /* OpenAI's completions default */
  ck_assert_uint_eq(fake.n_stop, 2);      /* "" stops nothing */
  ck_assert_uint_eq(fake.n_stop_ids, 2);
  ck_assert_float_eq(fake.sp.temperature, 1.0f);
  pthread_mutex_unlock(&fake.mu);
  j = post("/v1/chat/completions",
           "{\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":"
           "[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]}],\"max_tokens\":50,"
           "\"max_completion_tokens\":9}",
           &st);
  ck_assert_int_eq(st, 200);
  ck_assert_str_eq(jstr(j, "object"), "chat.completion");
  ck_assert(!strncmp(jstr(j, "id"), "chatcmpl-", 9));
  json_t *msg = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
  ck_assert_str_eq(jstr(msg, "role"), "assistant");
  ck_assert_str_eq(jstr(msg, "content"), "Hello world");
  json_decref(j);
  pthread_mutex_lock(&fake.mu);
  ck_assert_uint_eq(fake.n_messages, 2);
  ck_assert_uint_eq(fake.max_tokens, 9); /* max_completion_tokens wins */
  pthread_mutex_unlock(&fake.mu);
}
END_TEST

/* Reads a whole SSE stream: the data payloads, in order. */
static int sse(const char *path, const char *body, json_t **chunks, int max, int *status) {
  cli_http_t c;
  ck_assert_int_eq(cli_http_connect(&c, "127.0.0.1", port, 5000), 0);
  ck_assert_int_eq(cli_http_send(&c, "POST", path, NULL, body, strlen(body)), 0);
  *status = c.status;
  int n = 0;
  const char *d;
  bool done = false;
  while (cli_http_next_sse(&c, &d) == 1) {
    ck_assert_msg(!done, "data after [DONE]");
    if (!strcmp(d, "[DONE]")) {
      done = true;
      continue;
    }
    ck_assert_int_lt(n, max);
    chunks[n] = json_loads(d, 0, NULL);
    ck_assert_msg(chunks[n] != NULL, "chunk not JSON: %s", d);
    n++;
  }
  ck_assert(done);
  cli_http_close(&c);
  return n;
}

START_TEST(test_chat_stream_usage) {
  json_t *ch[16];
  int st;
  int n = sse("/v1/chat/completions",
              "{\"model\":\"smol\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stream\":true,"
              "\"stream_options\":{\"include_usage\":true}}",
              ch, 16, &st);
  ck_assert_int_eq(st, 200);
  ck_assert_int_eq(n, 4); /* 3 token chunks + the usage chunk */
  char text[64] = "";
  for (int i = 0; i < 3; i++) {
    ck_assert_str_eq(jstr(ch[i], "object"), "chat.completion.chunk");
    ck_assert_str_eq(jstr(ch[i], "id"), jstr(ch[0], "id"));
    ck_assert(json_is_null(json_object_get(ch[i], "usage")));
    json_t *c = json_array_get(json_object_get(ch[i], "choices"), 0);
    json_t *delta = json_object_get(c, "delta");
    if (i == 0) ck_assert_str_eq(jstr(delta, "role"), "assistant");
    else ck_assert_ptr_null(json_object_get(delta, "role"));
    strcat(text, jstr(delta, "content"));
    if (i < 2) ck_assert(json_is_null(json_object_get(c, "finish_reason")));
    else ck_assert_str_eq(jstr(c, "finish_reason"), "stop");
  }
  ck_assert_str_eq(text, "Hello world");
  ck_assert_int_eq(json_array_size(json_object_get(ch[3], "choices")), 0);
  json_t *u = json_object_get(ch[3], "usage");
  ck_assert_int_eq(json_integer_value(json_object_get(u, "total_tokens")), 8);
  for (int i = 0; i < n; i++) json_decref(ch[i]);
  /* completions, no include_usage: no usage key at all */
  n = sse("/v1/completions", "{\"prompt\":\"hi\",\"stream\":true,\"max_tokens\":3}", ch, 16, &st);
  ck_assert_int_eq(n, 3);
  ck_assert_str_eq(jstr(json_array_get(json_object_get(ch[2], "choices"), 0), "finish_reason"), "length");
  ck_assert_str_eq(jstr(json_array_get(json_object_get(ch[1], "choices"), 0), "text"), "lo");
  for (int i = 0; i < n; i++) {
    ck_assert_ptr_null(json_object_get(ch[i], "usage"));
    ck_assert_str_eq(jstr(ch[i], "object"), "text_completion");
    json_decref(ch[i]);
  }
}
END_TEST

START_TEST(test_logprobs_shapes) {
  int st;
  json_t *j = post("/v1/chat/completions",
                   "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"logprobs\":true,\"top_logprobs\":2}", &st);
  ck_assert_int_eq(st, 200);
  json_t *content = json_object_get(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs"), "content");
  ck_assert_int_eq(json_array_size(content), 3);
  json_t *e0 = json_array_get(content, 0);
  ck_assert_str_eq(jstr(e0, "token"), "token_id:11");
  ck_assert_float_eq_tol(json_real_value(json_object_get(e0, "logprob")), -0.5, 1e-6);
  ck_assert_int_eq(json_array_size(json_object_get(e0, "bytes")), 11);
  json_t *tops = json_object_get(e0, "top_logprobs");
  ck_assert_int_eq(json_array_size(tops), 2);
  ck_assert_str_eq(jstr(json_array_get(tops, 1), "token"), "token_id:101");
  json_decref(j);
  pthread_mutex_lock(&fake.mu);
  ck_assert_int_eq(fake.sp.logprobs, 2);
  pthread_mutex_unlock(&fake.mu);
  j = post("/v1/completions", "{\"prompt\":\"hi\",\"logprobs\":1}", &st);
  ck_assert_int_eq(st, 200);
  json_t *lp = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
  ck_assert_int_eq(json_array_size(json_object_get(lp, "tokens")), 3);
  ck_assert_int_eq(json_array_size(json_object_get(lp, "token_logprobs")), 3);
  ck_assert_int_eq(json_array_size(json_object_get(lp, "text_offset")), 3);
  json_t *top0 = json_array_get(json_object_get(lp, "top_logprobs"), 0);
  ck_assert_float_eq_tol(json_real_value(json_object_get(top0, "token_id:100")), -0.1, 1e-6);
  json_decref(j);
}
END_TEST

START_TEST(test_errors) {
  const char *C = "/v1/completions", *H = "/v1/chat/completions";
  check_error(C, "{\"prompt\": \"hi\"", 400, NULL);
  check_error(C, "[1,2]", 400, NULL);
  check_error(C, "", 400, NULL);
  check_error(C, "{}", 400, "prompt");
  check_error(C, "{\"prompt\":\"hi\",\"n\":2,\"best_of\":1}", 400, "best_of");
  check_error(C, "{\"prompt\":\"hi\",\"temperature\":\"hot\"}", 400, "temperature");
  check_error(C, "{\"prompt\":\"hi\",\"temperature\":-1}", 400, "temperature");
  check_error(C, "{\"prompt\":\"hi\",\"top_p\":0}", 400, "top_p");
  check_error(C, "{\"prompt\":\"hi\",\"max_tokens\":0}", 400, "max_tokens");
  check_error(C, "{\"prompt\":\"hi\",\"max_tokens\":1.5}", 400, "max_tokens");
  check_error(C, "{\"prompt\":\"hi\",\"logprobs\":21}", 400, "logprobs");
  check_error(C, "{\"prompt\":\"hi\",\"stop\":[1]}", 400, "stop");
  check_error(C, "{\"prompt\":\"hi\",\"stream_options\":{\"include_usage\":true}}", 400, "stream_options");
  check_error(C, "{\"prompt\":[-1]}", 400, "prompt");
  check_error(C, "{\"prompt\":[\"a\",7]}", 400, "prompt");
  check_error(C, "{\"prompt\":\"hi\",\"prompt\":\"again\"}", 400, NULL);
  check_error(C, "{\"prompt\":\"hi\",\"model\":\"gpt-9\"}", 404, "model");
  check_error(H, "{\"messages\":[]}", 400, "messages");
  check_error(H, "{\"messages\":[{\"content\":\"x\"}]}", 400, "messages");
  check_error(H, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}", 400, "top_logprobs");
  check_error(H, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":3}", 400, "logprobs");
  /* too long for the 100-token context */
  char big[1024] = "{\"prompt\":[";
  for (int i = 0; i < 100; i++) strcat(big, i ? ",1" : "1");
  strcat(big, "]}");
  check_error(C, big, 400, "prompt");
  check_error(C, "{\"prompt\":[1,2],\"max_tokens\":99}", 400, "max_tokens");
  /* from the coordinator */
  check_error(C, "{\"prompt\":\"busy\"}", 429, NULL);
  check_error(C, "{\"prompt\":\"long\"}", 400, NULL);
  check_error(C, "{\"prompt\":\"boom\"}", 500, NULL);
  check_error("/v1/nothing", "{}", 404, NULL);
  char *b;
  ck_assert_int_eq(http("GET", "/v1/completions", NULL, NULL, &b), 405);
  free(b);
  ck_assert_int_eq(http("GET", "/nope", NULL, NULL, &b), 404);
  ck_assert(strstr(b, "\"error\""));
  free(b);
  /* still healthy */
  ck_assert_int_eq(http("GET", "/health", NULL, NULL, NULL), 200);
  int st;
  json_t *j = post(C, "{\"prompt\":\"hi\"}", &st);
  ck_assert_int_eq(st, 200);
  json_decref(j);
}
END_TEST

START_TEST(test_stream_error_after_start) {
  json_t *ch[8];
  int st;
  int n = sse("/v1/completions", "{\"prompt\":\"boom\",\"stream\":true}", ch, 8, &st);
  ck_assert_int_eq(st, 200);
  ck_assert_int_eq(n, 2);
  ck_assert(json_is_object(json_object_get(ch[1], "error")));
  json_decref(ch[0]);
  json_decref(ch[1]);
}
END_TEST

START_TEST(test_api_key) {
  teardown();
  start_server("sekret", 0, 0);
  char *b;
  ck_assert_int_eq(http("GET", "/v1/models", NULL, NULL, &b), 401);
  ck_assert(strstr(b, "invalid_api_key"));
  free(b);
  ck_assert_int_eq(http("GET", "/v1/models", "Authorization: Bearer wrong\r\n", NULL, NULL), 401);
  ck_assert_int_eq(http("GET", "/v1/models", "Authorization: Bearer sekre\r\n", NULL, NULL), 401);
  ck_assert_int_eq(http("POST", "/v1/completions", NULL, "{\"prompt\":\"hi\"}", NULL), 401);
  ck_assert_int_eq(http("GET", "/v1/models", "Authorization: Bearer sekret\r\n", NULL, NULL), 200);
  ck_assert_int_eq(http("POST", "/v1/completions", "Authorization: Bearer sekret\r\n", "{\"prompt\":\"hi\"}", NULL), 200);
  ck_assert_int_eq(http("GET", "/health", NULL, NULL, NULL), 200); /* as vLLM: no key needed */
}
END_TEST

/* Starts a stream of the fake's slow job on c and reads its first chunk. */
static void open_slow_stream(cli_http_t *c) {
  const char *body = "{\"prompt\":\"slow\",\"stream\":true}";
  ck_assert_int_eq(cli_http_connect(c, "127.0.0.1", port, 5000), 0);
  ck_assert_int_eq(cli_http_send(c, "POST", "/v1/completions", NULL, body, strlen(body)), 0);
  const char *d;
  ck_assert_int_eq(cli_http_next_sse(c, &d), 1);
  ck_assert(strstr(d, "Hel"));
}

/* Waits until the fake saw a cancel for its last job. */
static bool wait_cancel(int ms) {
  for (int i = 0; i < ms / 10; i++) {
    if (atomic_load(&fake.n_cancels) > 0 && atomic_load(&fake.last_cancel) == atomic_load(&fake.last_job)) return true;
    usleep(10000);
  }
  return false;
}

START_TEST(test_disconnect_cancels) {
  /* mid-stream: read the first chunk, then hang up */
  cli_http_t c;
  open_slow_stream(&c);
  cli_http_close(&c);
  ck_assert_msg(wait_cancel(2000), "no cancel after a mid-stream disconnect");
  /* before the first token, non-streamed */
  atomic_store(&fake.n_cancels, 0);
  const char *body = "{\"prompt\":\"hang\"}";
  ck_assert_int_eq(cli_http_connect(&c, "127.0.0.1", port, 5000), 0);
  char head[256];
  int n = snprintf(head, sizeof head, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n%s",
                   strlen(body), body);
  ck_assert_int_eq(write(c.fd, head, (size_t)n), n);
  for (int i = 0; i < 200 && atomic_load(&fake.n_submits) < 2; i++) usleep(10000);
  cli_http_close(&c);
  ck_assert_msg(wait_cancel(2000), "no cancel after a disconnect while waiting");
  ck_assert_int_eq(http("GET", "/health", NULL, NULL, NULL), 200);
}
END_TEST

START_TEST(test_body_limits) {
  /* declared too big: answered without reading the body */
  cli_http_t c;
  ck_assert_int_eq(cli_http_connect(&c, "127.0.0.1", port, 5000), 0);
  const char *head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n{\"prompt\":";
  ck_assert_int_eq(write(c.fd, head, strlen(head)), (ssize_t)strlen(head));
  char buf[512] = "";
  struct pollfd p = {.fd = c.fd, .events = POLLIN};
  ck_assert_int_eq(poll(&p, 1, 3000), 1);
  ck_assert_int_gt(read(c.fd, buf, sizeof buf - 1), 0);
  ck_assert_msg(strstr(buf, " 413 "), "got %s", buf);
  cli_http_close(&c);
  /* declared too big but under the drain cap, sent in full: read, dropped, 413 */
  size_t n = (4u << 20) + 100;
  char *big = malloc(n + 1);
  memset(big, ' ', n);
  big[n] = 0;
  memcpy(big, "{\"prompt\":\"", 11);
  ck_assert_int_eq(http("POST", "/v1/completions", NULL, big, NULL), 413);
  /* sent chunked (no length up front): read, dropped past 4 MiB, then 413 */
  ck_assert_int_eq(cli_http_connect(&c, "127.0.0.1", port, 5000), 0);
  fcntl(c.fd, F_SETFL, 0); /* blocking writes */
  head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
  ck_assert_int_eq(write(c.fd, head, strlen(head)), (ssize_t)strlen(head));
  for (size_t off = 0; off < n; off += 65536) {
    size_t k = n - off < 65536 ? n - off : 65536;
    char sz[32];
    int m = snprintf(sz, sizeof sz, "%zx\r\n", k);
    ck_assert_int_eq(write(c.fd, sz, (size_t)m), m);
    for (size_t w = 0; w < k;) {
      ssize_t r = write(c.fd, big + off + w, k - w);
      ck_assert_msg(r > 0, "write at %zu: %s", off + w, strerror(errno));
      w += (size_t)r;
    }
    ck_assert_int_eq(write(c.fd, "\r\n", 2), 2);
  }
  ck_assert_int_eq(write(c.fd, "0\r\n\r\n", 5), 5);
  memset(buf, 0, sizeof buf);
  p.fd = c.fd;
  ck_assert_int_eq(poll(&p, 1, 3000), 1);
  ck_assert_int_gt(read(c.fd, buf, sizeof buf - 1), 0);
  ck_assert_msg(strstr(buf, " 413 "), "got %s", buf);
  cli_http_close(&c);
  free(big);
  ck_assert_int_eq(http("GET", "/health", NULL, NULL, NULL), 200);
}
END_TEST

START_TEST(test_slow_clients) {
  teardown();
  start_server(NULL, 8, 1);
  int fds[6];
  for (int i = 0; i < 6; i++) { /* half a request each, then silence */
    fds[i] = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(0x7f000001)};
    ck_assert_int_eq(connect(fds[i], (struct sockaddr *)&a, sizeof a), 0);
    const char *half = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le";
    ck_assert_int_eq(write(fds[i], half, strlen(half)), (ssize_t)strlen(half));
  }
  ck_assert_int_eq(http("GET", "/health", NULL, NULL, NULL), 200); /* served beside them */
  usleep(2500 * 1000);                                            /* the 1 s idle timeout closes them */
  for (int i = 0; i < 6; i++) {
    char b;
    struct pollfd p = {.fd = fds[i], .events = POLLIN};
    ck_assert_int_eq(poll(&p, 1, 1000), 1);
    ck_assert_int_le(read(fds[i], &b, 1), 0);
    close(fds[i]);
  }
  /* a job that waits longer than the idle timeout is still answered */
  int st;
  json_t *j = post("/v1/completions", "{\"prompt\":\"delay\"}", &st);
  ck_assert_int_eq(st, 200);
  json_decref(j);
  /* more concurrent connections than the limit: the extra ones are refused, later ones work */
  for (int i = 0; i < 3; i++) ck_assert_int_eq(http("GET", "/health", NULL, NULL, NULL), 200);
}
END_TEST

START_TEST(test_metrics_endpoint) {
  coord_metrics_request_start(metrics);
  coord_metrics_set_running(metrics, 3);
  coord_metrics_ttft(metrics, 0.03);
  char *b;
  ck_assert_int_eq(http("GET", "/metrics", NULL, NULL, &b), 200);
  ck_assert(strstr(b, "ferrum:num_requests_running{model_name=\"smol\"} 3\n"));
  ck_assert(strstr(b, "ferrum:request_received_total{model_name=\"smol\"} 1\n"));
  ck_assert(strstr(b, "ferrum:time_to_first_token_seconds_bucket{le=\"0.04\",model_name=\"smol\"} 1\n"));
  ck_assert(strstr(b, "ferrum:time_to_first_token_seconds_bucket{le=\"0.02\",model_name=\"smol\"} 0\n"));
  free(b);
  int st;
  json_t *j = post("/v1/completions", "{\"prompt\":\"hi\"}", &st);
  json_decref(j);
  j = post("/v1/completions", "{}", &st);
  json_decref(j);
  ck_assert_int_eq(http("GET", "/metrics", NULL, NULL, &b), 200);
  ck_assert(strstr(b, "ferrum:http_requests_total{code=\"2xx\",model_name=\"smol\"} 2\n")); /* /metrics + the job */
  ck_assert(strstr(b, "ferrum:http_requests_total{code=\"4xx\",model_name=\"smol\"} 1\n"));
  free(b);
}
END_TEST

/* ---- raw requests: framing, half-close, slow senders ---- */

static int raw_connect(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(0x7f000001)};
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
  return fd;
}

static void raw_write(int fd, const char *s) {
  size_t n = strlen(s);
  ck_assert_int_eq(write(fd, s, n), (ssize_t)n);
}

/* Reads until the server closes the connection or ms pass; returns the
 * bytes (malloc'd, NUL-terminated) and sets *closed. */
static char *raw_read_all(int fd, int ms, bool *closed) {
  size_t n = 0, cap = 1 << 16;
  char *b = malloc(cap);
  uint64_t end = fr_now_ns() + (uint64_t)ms * 1000000u;
  *closed = false;
  for (int i = 0; i < 10000 && n + 1 < cap; i++) {
    uint64_t now = fr_now_ns();
    if (now >= end) break;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, (int)((end - now) / 1000000u) + 1) <= 0) continue;
    ssize_t r = read(fd, b + n, cap - 1 - n);
    if (r <= 0) {
      *closed = true;
      break;
    }
    n += (size_t)r;
  }
  b[n] = 0;
  return b;
}

/* The final response of raw bytes: 1xx interim responses are skipped.
 * Returns its status; *body points at its body inside resp. */
static int raw_final(const char *resp, const char **body) {
  int st = 0;
  for (int i = 0; i < 4; i++) {
    ck_assert_msg(sscanf(resp, "HTTP/1.1 %d", &st) == 1, "not a response: '%.200s'", resp);
    const char *e = strstr(resp, "\r\n\r\n");
    ck_assert_ptr_nonnull(e);
    resp = e + 4;
    if (st >= 200) break;
  }
  *body = resp;
  return st;
}

/* Counts status lines in resp (interim ones too). */
static int raw_count_responses(const char *resp) {
  int k = 0;
  for (const char *p = resp; (p = strstr(p, "HTTP/1.1 ")) != NULL; p++) k++;
  return k;
}

/* Sends req, then reads until the server closes (at most 5 s): the
 * request must be refused with want and OpenAI's error shape, the
 * connection closed, and no job submitted. */
static void raw_refused(const char *req, int want, const char *says) {
  int before = atomic_load(&fake.n_submits);
  int fd = raw_connect();
  raw_write(fd, req);
  bool closed;
  char *resp = raw_read_all(fd, 5000, &closed), *bodycopy;
  const char *body;
  close(fd);
  ck_assert_msg(raw_final(resp, &body) == want, "want %d for '%s', got '%s'", want, req, resp);
  ck_assert_msg(closed, "the connection stays open after '%s'", req);
  ck_assert_msg(raw_count_responses(resp) == 1, "more than one answer to '%s': '%s'", req, resp);
  const char *cl = strcasestr(resp, "\r\nContent-Length: ");
  ck_assert_ptr_nonnull(cl);
  bodycopy = strndup(body, (size_t)atoi(cl + 18));
  json_t *j = json_loads(bodycopy, 0, NULL);
  ck_assert_msg(j != NULL, "not JSON: %s", bodycopy);
  json_t *e = json_object_get(j, "error");
  ck_assert_str_eq(jstr(e, "type"), want >= 500 ? "server_error" : "invalid_request_error");
  ck_assert_msg(strstr(jstr(e, "message"), says) != NULL, "message '%s' does not say '%s'", jstr(e, "message"), says);
  json_decref(j);
  free(bodycopy);
  free(resp);
  ck_assert_int_eq(atomic_load(&fake.n_submits), before);
}

#define RAW_POST "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
#define RAW_BODY "{\"prompt\":\"hi\"}" /* 15 bytes */
#define RAW_CHUNKED "f\r\n" RAW_BODY "\r\n0\r\n\r\n"

START_TEST(test_framing_refused) {
  /* two lengths: a proxy in front may have used the other one */
  raw_refused(RAW_POST "Content-Length: 15\r\nContent-Length: 16\r\n\r\n" RAW_BODY " ", 400, "Content-Length");
  raw_refused(RAW_POST "Content-Length: 15\r\ncontent-length: 15\r\n\r\n" RAW_BODY, 400, "Content-Length");
  /* a length and a chunked body, in either order; a smuggled request behind it is never answered */
  raw_refused(RAW_POST "Content-Length: 15\r\nTransfer-Encoding: chunked\r\n\r\n" RAW_CHUNKED, 400, "Transfer-Encoding");
  raw_refused(RAW_POST "Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n" RAW_CHUNKED
              "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n", 400, "Transfer-Encoding");
  /* codings other than one chunked */
  raw_refused(RAW_POST "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n" RAW_CHUNKED, 400,
              "Transfer-Encoding");
  raw_refused(RAW_POST "Transfer-Encoding: gzip, chunked\r\n\r\n" RAW_CHUNKED, 501, "Transfer-Encoding");
  raw_refused("POST /v1/completions HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n" RAW_CHUNKED, 400,
              "Transfer-Encoding");
  /* well-framed requests still work: by length and chunked */
  const char *ok[] = {RAW_POST "Content-Length: 15\r\nConnection: close\r\n\r\n" RAW_BODY,
                      RAW_POST "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n" RAW_CHUNKED};
  for (int i = 0; i < 2; i++) {
    int fd = raw_connect();
    raw_write(fd, ok[i]);
    bool closed;
    char *resp = raw_read_all(fd, 5000, &closed);
    const char *body;
    close(fd);
    ck_assert_msg(raw_final(resp, &body) == 200, "got '%s'", resp);
    ck_assert_ptr_nonnull(strstr(body, "Hello world"));
    free(resp);
  }
}
END_TEST

/* A client that half-closes (shutdown SHUT_WR) after its whole request
 * still gets the answer, while its job runs ("delay": 1.5 s). */
START_TEST(test_half_close_answered) {
  const char *reqs[] = {RAW_POST "Content-Length: 18\r\n\r\n{\"prompt\":\"delay\"}",
                        RAW_POST "Content-Length: 32\r\n\r\n{\"prompt\":\"delay\",\"stream\":true}",
                        RAW_POST "Transfer-Encoding: chunked\r\n\r\n12\r\n{\"prompt\":\"delay\"}\r\n0\r\n\r\n"};
  for (int i = 0; i < 3; i++) {
    int fd = raw_connect();
    raw_write(fd, reqs[i]);
    ck_assert_int_eq(shutdown(fd, SHUT_WR), 0);
    bool closed;
    char *resp = raw_read_all(fd, 5000, &closed);
    const char *body;
    close(fd);
    ck_assert_msg(raw_final(resp, &body) == 200, "request %d: got '%s'", i, resp);
    if (i == 1) {
      ck_assert_msg(strstr(body, "data: [DONE]"), "request %d: got '%s'", i, resp);
      ck_assert_ptr_nonnull(strstr(body, "\"Hel\""));
    } else {
      ck_assert_msg(strstr(body, "Hello world"), "request %d: got '%s'", i, resp);
    }
    /* the probe that told it from a client that left */
    static const char probed[] = "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 ";
    ck_assert_msg(!strncmp(resp, probed, sizeof probed - 1), "got '%s'", resp);
    ck_assert(closed);
    free(resp);
  }
  ck_assert_int_eq(atomic_load(&fake.n_cancels), 0);
  /* HTTP/1.0 allows no interim answer: its end of stream is taken as a hang-up */
  int fd = raw_connect();
  raw_write(fd, "POST /v1/completions HTTP/1.0\r\nContent-Length: 17\r\n\r\n{\"prompt\":\"hang\"}");
  ck_assert_int_eq(shutdown(fd, SHUT_WR), 0);
  ck_assert_msg(wait_cancel(2000), "no cancel after an HTTP/1.0 end of stream");
  close(fd);
}
END_TEST

/* Reads an SSE answer until its first token chunk. */
static void raw_first_chunk(int fd) {
  char buf[4096];
  size_t n = 0;
  for (int i = 0; i < 50 && !strstr(buf, "\"Hel\""); i++) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    ck_assert_int_eq(poll(&p, 1, 2000), 1);
    ssize_t r = read(fd, buf + n, sizeof buf - 1 - n);
    ck_assert_int_gt(r, 0);
    n += (size_t)r;
    buf[n] = 0;
  }
  ck_assert_ptr_nonnull(strstr(buf, "\"Hel\""));
}

/* Mid-stream, an end of stream is probed with an SSE comment: a
 * half-closed client reads it and its job goes on; a client that closed
 * answers it with a reset and its job is canceled. */
START_TEST(test_half_close_mid_stream) {
  const char *req = RAW_POST "Content-Length: 31\r\n\r\n{\"prompt\":\"slow\",\"stream\":true}";
  int fd = raw_connect();
  raw_write(fd, req);
  raw_first_chunk(fd);
  ck_assert_int_eq(shutdown(fd, SHUT_WR), 0);
  bool closed;
  char *more = raw_read_all(fd, 1000, &closed);
  ck_assert_msg(strstr(more, "\r\n:\n\n\r\n") != NULL, "no probe: '%s'", more); /* one chunk: ":\n\n" */
  ck_assert(!closed);
  ck_assert_int_eq(atomic_load(&fake.n_cancels), 0);
  free(more);
  close(fd); /* the probe was read: this close sends nothing the server can see */
  fd = raw_connect();
  raw_write(fd, req);
  raw_first_chunk(fd);
  ck_assert_int_eq(shutdown(fd, SHUT_WR), 0);
  usleep(400 * 1000); /* the probe arrives unread, so close() resets */
  close(fd);
  ck_assert_msg(wait_cancel(2000), "no cancel after a close mid-stream");
}
END_TEST

/* Reads one answer with a Content-Length body from a keep-alive
 * connection; returns its status. */
static int raw_read_response(int fd) {
  char buf[8192];
  size_t n = 0;
  for (int i = 0; i < 100; i++) {
    buf[n] = 0;
    const char *e = strstr(buf, "\r\n\r\n"), *cl = strcasestr(buf, "\r\nContent-Length: ");
    if (e && cl && n >= (size_t)(e + 4 - buf) + (size_t)atoi(cl + 18)) break;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    ck_assert_int_eq(poll(&p, 1, 3000), 1);
    ssize_t r = read(fd, buf + n, sizeof buf - 1 - n);
    ck_assert_msg(r > 0, "closed after '%s'", buf);
    n += (size_t)r;
  }
  int st = 0;
  ck_assert_msg(sscanf(buf, "HTTP/1.1 %d", &st) == 1, "got '%s'", buf);
  return st;
}

/* Sends req one byte every 200 ms until the server closes the connection;
 * returns the seconds that took (it must answer nothing). */
static double raw_trickle(int fd, const char *req) {
  uint64_t t0 = fr_now_ns();
  for (size_t i = 0; i < strlen(req); i++) {
    if (send(fd, req + i, 1, MSG_NOSIGNAL) != 1) break;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 200) != 1) continue;
    char b[512];
    ssize_t r = read(fd, b, sizeof b - 1);
    if (r > 0) b[r] = 0;
    ck_assert_msg(r <= 0, "answered a request that never arrived: '%s'", b);
    return (double)(fr_now_ns() - t0) / 1e9;
  }
  ck_abort_msg("the trickled request was never cut off");
  return 0;
}

/* A client that keeps sending a byte now and then (the 2 s idle timeout
 * never fires) is cut off when its request misses the deadline: 2 s on a
 * fresh connection, 2 + 2 s after an answer on a kept-alive one. Requests
 * that arrive in time and answers that take longer are not. */
START_TEST(test_request_deadline) {
  const char *req = RAW_POST "Content-Length: 15\r\n\r\n" RAW_BODY;
  teardown();
  request_timeout_s = 2;
  start_server(NULL, 0, 2);
  int fd = raw_connect();
  double s = raw_trickle(fd, req);
  ck_assert_msg(s > 1.8 && s < 5, "cut off after %.2f s", s);
  close(fd);
  ck_assert_int_eq(atomic_load(&fake.n_submits), 0);
  /* kept alive: the clock starts again after each answer, not at the connection's start */
  fd = raw_connect();
  uint64_t t0 = fr_now_ns();
  for (int i = 0; i < 6; i++) {
    if (i) usleep(1000 * 1000);
    raw_write(fd, req);
    ck_assert_int_eq(raw_read_response(fd), 200);
  }
  ck_assert_uint_gt(fr_now_ns() - t0, 4500000000u); /* past 2 + 2 s since the connection's start */
  s = raw_trickle(fd, req);
  ck_assert_msg(s > 3.8 && s < 7, "kept-alive connection cut off after %.2f s", s);
  close(fd);
  /* slow but in time */
  fd = raw_connect();
  raw_write(fd, RAW_POST "Content-Length: 15\r\n\r\n");
  usleep(1000 * 1000);
  raw_write(fd, RAW_BODY);
  ck_assert_int_eq(raw_read_response(fd), 200);
  close(fd);
  /* an answer that takes longer than the deadline goes on */
  fd = raw_connect();
  raw_write(fd, RAW_POST "Content-Length: 31\r\n\r\n{\"prompt\":\"slow\",\"stream\":true}");
  raw_first_chunk(fd);
  struct pollfd p = {.fd = fd, .events = POLLIN};
  ck_assert_int_eq(poll(&p, 1, 2600), 0);
  ck_assert_int_eq(atomic_load(&fake.n_cancels), 0);
  close(fd);
  ck_assert_msg(wait_cancel(2000), "no cancel after the long answer's client left");
}
END_TEST

/* ---- streams that wait, streams that end early, per-address limits ---- */

/* A whole SSE answer as text (de-chunked). Fails the test when the
 * connection ends before the body did (a stream that was cut). */
static char *stream_text(const char *path, const char *body, int *status) {
  cli_http_t c;
  ck_assert_int_eq(cli_http_connect(&c, "127.0.0.1", port, 5000), 0);
  ck_assert_int_eq(cli_http_send(&c, "POST", path, NULL, body, strlen(body)), 0);
  *status = c.status;
  char *b = NULL;
  int rc = cli_http_read_all(&c, 8u << 20, &b, NULL);
  ck_assert_msg(rc == 0, "the stream was cut: %s", fr_strerror(rc));
  cli_http_close(&c);
  return b;
}

/* Occurrences of needle in [from, to). */
static int count_in(const char *from, const char *to, const char *needle) {
  int n = 0;
  for (const char *p = from; (p = strstr(p, needle)) != NULL && p < to; p += strlen(needle)) n++;
  return n;
}

/* The text ends with a chunk whose finish_reason is want, then [DONE]. */
static void check_finished(const char *t, const char *want) {
  static const char done[] = "data: [DONE]\n\n";
  size_t n = strlen(t);
  ck_assert_msg(n >= sizeof done - 1 && !strcmp(t + n - (sizeof done - 1), done), "no [DONE] at the end: '%s'", t);
  const char *last = t + n - (sizeof done - 1);
  while (last > t && strncmp(last, "data: {", 7)) last--;
  char reason[64];
  snprintf(reason, sizeof reason, "\"finish_reason\":\"%s\"", want);
  ck_assert_msg(strstr(last, reason) != NULL, "last chunk '%.300s' has no %s", last, reason);
}

/* A job that sends nothing for a while, before its first token and between
 * tokens (1.5 s each, longer than the 1 s idle timeout), gets keep-alive
 * comments meanwhile and then every token, its finish_reason and [DONE];
 * the handler's heartbeats reach the coordinator. */
START_TEST(test_keepalive_while_waiting) {
  teardown();
  keepalive_ms = 300;
  start_server(NULL, 0, 1);
  int st;
  char *t = stream_text("/v1/completions", "{\"prompt\":\"quiet\",\"stream\":true}", &st);
  ck_assert_int_eq(st, 200);
  const char *hel = strstr(t, "\"Hel\""), *lo = strstr(t, "\"lo\"");
  ck_assert_msg(hel && lo && strstr(t, "\" world\""), "tokens missing: '%s'", t);
  ck_assert_msg(count_in(t, hel, ": keep-alive\n\n") >= 2, "no keep-alives while queued: '%s'", t);
  ck_assert_msg(count_in(hel, lo, ": keep-alive\n\n") >= 2, "no keep-alives between tokens: '%s'", t);
  check_finished(t, "stop");
  free(t);
  ck_assert_int_gt(atomic_load(&fake.n_beats), 4);
  /* not streamed: the answer after 3 s of silence, past the idle timeout */
  json_t *j = post("/v1/completions", "{\"prompt\":\"quiet\"}", &st);
  ck_assert_int_eq(st, 200);
  ck_assert_str_eq(jstr(json_array_get(json_object_get(j, "choices"), 0), "text"), "Hello world");
  json_decref(j);
  ck_assert_int_eq(atomic_load(&fake.n_cancels), 0);
}
END_TEST

/* With a keep-alive period longer than the idle timeout, a gap between
 * tokens longer than the idle timeout still does not cut the stream. */
START_TEST(test_wait_longer_than_idle_timeout) {
  teardown();
  keepalive_ms = 3000;
  start_server(NULL, 0, 1);
  int st;
  char *t = stream_text("/v1/chat/completions",
                        "{\"messages\":[{\"role\":\"user\",\"content\":\"quiet\"}],\"stream\":true}", &st);
  ck_assert_int_eq(st, 200);
  ck_assert_msg(strstr(t, "\"Hel\"") && strstr(t, "\"lo\""), "tokens missing: '%s'", t);
  ck_assert_msg(strstr(t, "\"role\":\"assistant\""), "no role in the first chunk: '%s'", t);
  check_finished(t, "stop");
  free(t);
}
END_TEST

/* A coordinator that answers nothing, heartbeats included, ends a waiting
 * stream with an error chunk and [DONE] (and a waiting JSON request with
 * 503) after engine_timeout_ms; one that answers its heartbeats keeps a
 * waiting stream open however long its job takes. */
START_TEST(test_silent_engine_ends_stream) {
  teardown();
  keepalive_ms = 300;
  engine_timeout_ms = 1500;
  start_server(NULL, 0, 0);
  /* alive: 2.5 s of keep-alives, no end */
  cli_http_t c;
  const char *hang = "{\"prompt\":\"hang\",\"stream\":true}";
  ck_assert_int_eq(cli_http_connect(&c, "127.0.0.1", port, 5000), 0);
  ck_assert_int_eq(cli_http_send(&c, "POST", "/v1/completions", NULL, hang, strlen(hang)), 0);
  ck_assert_int_eq(c.status, 200);
  char buf[4096];
  size_t n = 0;
  uint64_t t0 = fr_now_ns();
  while (fr_now_ns() - t0 < 2500000000ull && n < sizeof buf - 1) {
    long r = cli_http_read(&c, buf + n, sizeof buf - 1 - n);
    ck_assert_msg(r > 0, "the stream of a live job ended: %ld", r);
    n += (size_t)r;
  }
  buf[n] = 0;
  ck_assert_msg(!strstr(buf, "data:"), "got '%s'", buf);
  ck_assert_int_ge(count_in(buf, buf + n, ": keep-alive\n\n"), 5);
  cli_http_close(&c);
  ck_assert_msg(wait_cancel(2000), "no cancel after the client left");
  /* deaf */
  atomic_store(&fake.deaf, 1);
  int st;
  t0 = fr_now_ns();
  char *t = stream_text("/v1/completions", hang, &st);
  double s = (double)(fr_now_ns() - t0) / 1e9;
  ck_assert_int_eq(st, 200);
  ck_assert_msg(s > 1.4 && s < 4, "ended after %.2f s", s);
  ck_assert_msg(strstr(t, ": keep-alive\n\n"), "got '%s'", t);
  ck_assert_msg(strstr(t, "data: {\"error\"") && strstr(t, "did not answer"), "no error chunk: '%s'", t);
  ck_assert_msg(strstr(t, "data: [DONE]\n\n"), "no [DONE]: '%s'", t);
  free(t);
  ck_assert_msg(wait_cancel(2000), "the silent job was not canceled");
  check_error("/v1/completions", "{\"prompt\":\"hang\"}", 503, NULL);
}
END_TEST

static void *stop_thread(void *arg) {
  coord_http_stop(arg);
  return NULL;
}

/* coord_http_stop while a stream waits for a job that will never finish:
 * the stream ends with an error chunk and [DONE], not a cut. */
START_TEST(test_stop_mid_stream) {
  cli_http_t c;
  open_slow_stream(&c);
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, stop_thread, srv), 0);
  char *rest = NULL;
  int rc = cli_http_read_all(&c, 1 << 20, &rest, NULL);
  pthread_join(th, NULL);
  srv = NULL;
  ck_assert_msg(rc == 0, "the stream was cut: %s", fr_strerror(rc));
  ck_assert_msg(strstr(rest, "data: {\"error\"") && strstr(rest, "shutting down"), "no error chunk: '%s'", rest);
  ck_assert_msg(strstr(rest, "data: [DONE]\n\n"), "no [DONE]: '%s'", rest);
  free(rest);
  cli_http_close(&c);
}
END_TEST

/* The drain race: the job's last event is queued for a handler that is
 * still sending the earlier bytes (its client reads slowly) when
 * coord_http_stop begins. The stream still gets that last chunk, its
 * finish_reason and [DONE]. */
START_TEST(test_stop_sends_queued_events) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), small = 4096;
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small), 0); /* before connect: a small window */
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(0x7f000001)};
  ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
  cli_http_t c;
  memset(&c, 0, sizeof c);
  c.fd = fd;
  c.timeout_ms = 5000;
  const char *body = "{\"prompt\":\"bulk\",\"stream\":true}";
  ck_assert_int_eq(cli_http_send(&c, "POST", "/v1/completions", NULL, body, strlen(body)), 0);
  ck_assert_int_eq(c.status, 200);
  usleep(300 * 1000); /* the server fills the socket and waits to write the rest */
  atomic_store(&fake.release, 1);
  for (int i = 0; i < 200 && !atomic_load(&fake.released); i++) usleep(10000);
  ck_assert(atomic_load(&fake.released)); /* the last event is queued for the handler */
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, stop_thread, srv), 0);
  usleep(300 * 1000); /* stopping */
  char *t = NULL;
  size_t n = 0;
  int rc = cli_http_read_all(&c, 8u << 20, &t, &n);
  pthread_join(th, NULL);
  srv = NULL;
  ck_assert_msg(rc == 0, "the stream was cut: %s", fr_strerror(rc));
  ck_assert_uint_gt(n, HTTP_FAKE_BULK_BYTES);
  ck_assert_msg(!strstr(t, "\"error\""), "an error chunk: '%.300s'", strstr(t, "\"error\""));
  ck_assert_msg(strstr(t, "\" world\""), "no last token: '%s'", t + n - 400);
  check_finished(t + n - 1000, "stop");
  free(t);
  cli_http_close(&c);
}
END_TEST

/* A connection from src (host order) to the server; -1 when connect fails. */
static int connect_from(uint32_t src) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ck_assert_int_ge(fd, 0);
  struct sockaddr_in me = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(src)};
  ck_assert_int_eq(bind(fd, (struct sockaddr *)&me, sizeof me), 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(0x7f000001)};
  ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
  return fd;
}

/* Asks /health on fd (kept alive); the status, or 0 when the server
 * closed the connection without an answer. */
static int health_on(int fd) {
  static const char req[] = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  if (send(fd, req, sizeof req - 1, MSG_NOSIGNAL) != (ssize_t)(sizeof req - 1)) return 0;
  bool closed;
  char *resp = raw_read_all(fd, 300, &closed);
  int st = 0;
  if (sscanf(resp, "HTTP/1.1 %d", &st) != 1) st = 0;
  free(resp);
  return st;
}

/* One address holds at most max_connections_per_ip connections (loopback
 * too): the next one is closed unanswered, while another address is served,
 * and a slot freed is taken again. */
START_TEST(test_per_ip_limit) {
  teardown();
  per_ip = 3;
  start_server(NULL, 0, 0);
  int fds[3];
  for (int i = 0; i < 3; i++) {
    fds[i] = connect_from(0x7f000001);
    ck_assert_int_eq(health_on(fds[i]), 200);
  }
  int extra = connect_from(0x7f000001);
  ck_assert_int_eq(health_on(extra), 0);
  close(extra);
  int other = connect_from(0x7f000002);
  ck_assert_int_eq(health_on(other), 200);
  close(other);
  for (int i = 0; i < 3; i++) ck_assert_int_eq(health_on(fds[i]), 200); /* the first three still work */
  close(fds[0]);
  int st = 0;
  for (int i = 0; i < 50 && st != 200; i++) { /* once MHD has seen the close */
    usleep(20000);
    extra = connect_from(0x7f000001);
    st = health_on(extra);
    close(extra);
  }
  ck_assert_int_eq(st, 200);
  close(fds[1]);
  close(fds[2]);
}
END_TEST

/* This process's threads (the frontend runs in it). */
static long own_threads(void) {
  char line[256];
  long v = -1;
  FILE *f = fopen("/proc/self/status", "r");
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "Threads:", 8)) v = atol(line + 8);
  if (f) fclose(f);
  return v;
}

#define WAITING 500 /* streams that wait for a job that never answers */

/* 500 streams wait at once for jobs that never answer ("hang"): none holds
 * a thread (the process keeps fewer than 32), each one gets its 200 and
 * keep-alive comments, /health answers meanwhile, and when the clients
 * leave every job is canceled within 2 s. */
START_TEST(test_many_waiting_streams) {
  teardown();
  keepalive_ms = 300;
  start_server(NULL, 0, 0);
  static int fds[WAITING];
  const char *req = RAW_POST "Content-Length: 31\r\n\r\n{\"prompt\":\"hang\",\"stream\":true}";
  for (int i = 0; i < WAITING; i++) {
    fds[i] = connect_from(0x7f000001 + (uint32_t)(i % 4)); /* each address under its cap */
    raw_write(fds[i], req);
  }
  for (int i = 0; i < 500 && atomic_load(&fake.n_submits) < WAITING; i++) usleep(10000);
  ck_assert_int_eq(atomic_load(&fake.n_submits), WAITING);
  long threads = own_threads();
  fprintf(stderr, "waiting: %d streams, %ld threads in the process\n", WAITING, threads);
  ck_assert_msg(threads > 0 && threads < 32, "%ld threads for %d waiting streams", threads, WAITING);
  ck_assert_int_eq(http("GET", "/health", NULL, NULL, NULL), 200);
  for (int i = 0; i < WAITING; i++) { /* each has started (200) with a keep-alive */
    char buf[1024];
    size_t n = 0;
    buf[0] = 0;
    for (int k = 0; k < 30 && !strstr(buf, ": keep-alive"); k++) {
      struct pollfd p = {.fd = fds[i], .events = POLLIN};
      if (poll(&p, 1, 100) != 1) continue;
      ssize_t r = read(fds[i], buf + n, sizeof buf - 1 - n);
      ck_assert_msg(r > 0, "stream %d closed: '%s'", i, buf);
      n += (size_t)r;
      buf[n] = 0;
    }
    ck_assert_msg(!strncmp(buf, "HTTP/1.1 200 ", 13) && strstr(buf, ": keep-alive"), "stream %d: '%s'", i, buf);
  }
  ck_assert_int_eq(atomic_load(&fake.n_cancels), 0);
  for (int i = 0; i < WAITING; i++) close(fds[i]);
  for (int i = 0; i < 200 && atomic_load(&fake.n_cancels) < WAITING; i++) usleep(10000);
  ck_assert_int_eq(atomic_load(&fake.n_cancels), WAITING);
  ck_assert_int_eq(http("GET", "/health", NULL, NULL, NULL), 200);
}
END_TEST

static Suite *http_suite(void) {
  Suite *s = suite_create("http");
  TCase *tc = tcase_create("server");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_models_and_health);
  tcase_add_test(tc, test_refused_until_first_ready);
  tcase_add_test(tc, test_completion_json);
  tcase_add_test(tc, test_completion_tokens_defaults);
  tcase_add_test(tc, test_chat_stream_usage);
  tcase_add_test(tc, test_logprobs_shapes);
  tcase_add_test(tc, test_errors);
  tcase_add_test(tc, test_stream_error_after_start);
  tcase_add_test(tc, test_api_key);
  tcase_add_test(tc, test_disconnect_cancels);
  tcase_add_test(tc, test_body_limits);
  tcase_add_test(tc, test_slow_clients);
  tcase_add_test(tc, test_metrics_endpoint);
  tcase_add_test(tc, test_framing_refused);
  tcase_add_test(tc, test_half_close_answered);
  tcase_add_test(tc, test_half_close_mid_stream);
  tcase_add_test(tc, test_request_deadline);
  tcase_add_test(tc, test_keepalive_while_waiting);
  tcase_add_test(tc, test_wait_longer_than_idle_timeout);
  tcase_add_test(tc, test_silent_engine_ends_stream);
  tcase_add_test(tc, test_stop_mid_stream);
  tcase_add_test(tc, test_stop_sends_queued_events);
  tcase_add_test(tc, test_per_ip_limit);
  tcase_add_test(tc, test_many_waiting_streams);
  suite_add_tcase(s, tc);
  return s;
}

/* The shared main (tests/common/test_main.c) runs this program's suites. */
#include "tests/common/test_main.h"

const test_prog_t test_prog = {.suites = {http_suite}};
