/* test_proto_client.c - the RPC client library against a fake coordinator:
 * a thread with a ZeroMQ ROUTER that decodes requests with proto's
 * decoders and answers from a script (stream tokens, wait for a cancel,
 * answer nothing, fail, close the socket). Over ipc:// in a temp dir and
 * tcp://127.0.0.1 on an ephemeral port. */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "proto/fr_client.h"
#include "proto/proto.h"

/* ------------------------------------------------------- fake server */

typedef struct {
  void *ctx, *router;
  char endpoint[256];
  char dir[64];
  pthread_t thread;
  atomic_int stop;
  atomic_int submits, cancels;
  int mute; /* answer nothing at all */
} server_t;

static server_t srv;

static void send_to(server_t *s, const zmq_msg_t *ident, proto_type_t type, const void *body) {
  proto_buf_t b;
  proto_buf_init(&b);
  ck_assert_int_eq(proto_encode(&b, type, body), 0);
  zmq_send(s->router, zmq_msg_data((zmq_msg_t *)ident), zmq_msg_size((zmq_msg_t *)ident), ZMQ_SNDMORE);
  zmq_send(s->router, b.data, b.len, 0);
  proto_buf_free(&b);
}

static void send_event(server_t *s, const zmq_msg_t *ident, uint64_t id, const char *text, int32_t tok,
                       proto_finish_t fin) {
  proto_event_t e;
  proto_body_default(PROTO_T_EVENT, &e);
  e.id = id;
  e.text = (char *)text;
  if (tok >= 0) {
    e.n_tokens = 1;
    e.tokens = &tok;
  }
  e.finish = fin;
  if (fin) {
    e.has_usage = true;
    e.usage.prompt_tokens = 2;
    e.usage.completion_tokens = (uint32_t)(tok + 1);
  }
  send_to(s, ident, PROTO_T_EVENT, &e);
}

/* Streams max_tokens events (the last one finishing), or fails / waits /
 * dies, by the prompt's text. Returns 1 when the server should die. */
static int on_submit(server_t *s, const zmq_msg_t *ident, const proto_submit_t *r) {
  atomic_fetch_add(&s->submits, 1);
  const char *p = r->prompt ? r->prompt : "";
  if (!strcmp(p, "die")) return 1;
  if (!strcmp(p, "silent")) return 0;
  if (!strcmp(p, "err")) {
    proto_error_msg_t e = {.code = PROTO_ERR_BAD_REQUEST, .message = "bad prompt", .id = r->id};
    send_to(s, ident, PROTO_T_ERROR, &e);
    return 0;
  }
  if (!strcmp(p, "wait")) { /* one token, then nothing until the cancel */
    send_event(s, ident, r->id, "w", 0, PROTO_FINISH_NONE);
    return 0;
  }
  uint32_t n = r->max_tokens ? r->max_tokens : 3;
  char text[32];
  for (uint32_t i = 0; i < n; i++) {
    snprintf(text, sizeof text, "t%u ", i);
    send_event(s, ident, r->id, text, (int32_t)i, i + 1 == n ? PROTO_FINISH_LENGTH : PROTO_FINISH_NONE);
  }
  return 0;
}

static int serve_one(server_t *s, zmq_msg_t *ident, zmq_msg_t *body) {
  proto_msg_t m;
  proto_msg_init(&m);
  int die = 0;
  int rc = proto_msg_decode(&m, zmq_msg_data(body), zmq_msg_size(body), PROTO_ACCEPT_FROM_CLIENT);
  if (rc) {
    proto_error_msg_t e = {.code = PROTO_ERR_BAD_REQUEST, .message = (char *)fr_last_error()};
    send_to(s, ident, PROTO_T_ERROR, &e);
  } else if (s->mute) {
  } else if (m.type == PROTO_T_SUBMIT) {
    die = on_submit(s, ident, &m.u.submit);
  } else if (m.type == PROTO_T_CANCEL) {
    atomic_fetch_add(&s->cancels, 1);
    send_event(s, ident, m.u.cancel.id, NULL, -1, PROTO_FINISH_CANCEL);
  } else if (m.type == PROTO_T_STATUS) {
    if (m.u.status.model && !strcmp(m.u.status.model, "nope")) {
      proto_error_msg_t e = {.code = PROTO_ERR_NOT_FOUND, .message = "no such model", .rid = m.u.status.rid};
      send_to(s, ident, PROTO_T_ERROR, &e);
    } else {
      proto_status_reply_t st = {.rid = m.u.status.rid, .model = "fake", .queued = (uint32_t)s->submits,
                                 .running = 1, .kv_used_blocks = 10, .kv_total_blocks = 100, .n_workers = 2};
      send_to(s, ident, PROTO_T_STATUS_R, &st);
    }
  } else if (m.type == PROTO_T_MODELS) {
    proto_model_info_t models[2] = {{"fake", 2048}, {"other", 0}};
    proto_models_reply_t mr = {.rid = m.u.models.rid, .n_models = 2, .models = models};
    send_to(s, ident, PROTO_T_MODELS_R, &mr);
  }
  proto_msg_free(&m);
  return die;
}

static void *server_main(void *arg) {
  server_t *s = arg;
  while (!atomic_load(&s->stop)) {
    zmq_pollitem_t it = {s->router, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, 20) <= 0) continue;
    zmq_msg_t ident, body;
    zmq_msg_init(&ident);
    zmq_msg_init(&body);
    if (zmq_msg_recv(&ident, s->router, 0) < 0 || !zmq_msg_more(&ident) || zmq_msg_recv(&body, s->router, 0) < 0) {
      zmq_msg_close(&ident);
      zmq_msg_close(&body);
      continue;
    }
    int die = serve_one(s, &ident, &body);
    zmq_msg_close(&ident);
    zmq_msg_close(&body);
    if (die) break;
  }
  zmq_close(s->router); /* the connection drops: "server gone" */
  s->router = NULL;
  return NULL;
}

/* Starts the fake server on ipc (tcp = 0) or tcp with an ephemeral port. */
static void server_start(int tcp, int mute) {
  memset(&srv, 0, sizeof srv);
  srv.mute = mute;
  srv.ctx = zmq_ctx_new();
  srv.router = zmq_socket(srv.ctx, ZMQ_ROUTER);
  int zero = 0;
  zmq_setsockopt(srv.router, ZMQ_LINGER, &zero, sizeof zero);
  if (tcp) {
    ck_assert_int_eq(zmq_bind(srv.router, "tcp://127.0.0.1:*"), 0);
  } else {
    strcpy(srv.dir, "/tmp/fr_client_testXXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(srv.dir));
    char ep[256];
    snprintf(ep, sizeof ep, "ipc://%s/coord.sock", srv.dir);
    ck_assert_int_eq(zmq_bind(srv.router, ep), 0);
  }
  size_t len = sizeof srv.endpoint;
  ck_assert_int_eq(zmq_getsockopt(srv.router, ZMQ_LAST_ENDPOINT, srv.endpoint, &len), 0);
  ck_assert_int_eq(pthread_create(&srv.thread, NULL, server_main, &srv), 0);
}

static void server_stop(void) {
  atomic_store(&srv.stop, 1);
  pthread_join(srv.thread, NULL);
  zmq_ctx_term(srv.ctx);
  if (srv.dir[0]) {
    char path[128];
    snprintf(path, sizeof path, "%s/coord.sock", srv.dir);
    unlink(path);
    rmdir(srv.dir);
  }
}

/* ------------------------------------------------------------- tests */

static proto_submit_t prompt_req(const char *prompt, uint32_t max_tokens) {
  proto_submit_t r = {.prompt = (char *)prompt, .sp = proto_sampling_default(), .max_tokens = max_tokens,
                      .stream = true};
  return r;
}

/* Submits and streams one job: texts in order, the last event finishes. */
static void stream_one(int tcp) {
  server_start(tcp, 0);
  fr_client_t *c;
  ck_assert_int_eq(fr_client_connect(&c, srv.endpoint), 0);
  proto_submit_t r = prompt_req("hello", 5);
  uint64_t id = 0;
  ck_assert_int_eq(fr_client_submit(c, &r, &id), 0);
  ck_assert_uint_ne(id, 0);
  ck_assert_int_eq(fr_client_active_jobs(c), 1);
  char text[128] = "";
  proto_event_t ev;
  int n = 0;
  for (;;) {
    int rc = fr_client_next_event(c, 5000, &ev);
    ck_assert_msg(rc == 0, "next_event: %s", fr_last_error());
    ck_assert_uint_eq(ev.id, id);
    ck_assert_uint_eq(ev.n_tokens, 1);
    ck_assert_int_eq(ev.tokens[0], n);
    strncat(text, ev.text, ev.text_len);
    n++;
    if (ev.finish) break;
  }
  ck_assert_int_eq(n, 5);
  ck_assert_str_eq(text, "t0 t1 t2 t3 t4 ");
  ck_assert_int_eq(ev.finish, PROTO_FINISH_LENGTH);
  ck_assert(ev.has_usage);
  ck_assert_uint_eq(ev.usage.completion_tokens, 5);
  ck_assert_int_eq(fr_client_active_jobs(c), 0);
  /* nothing more: a short timeout */
  uint64_t t0 = fr_now_ns();
  ck_assert_int_eq(fr_client_next_event(c, 100, &ev), FR_ETIMEOUT);
  uint64_t ms = (fr_now_ns() - t0) / 1000000;
  ck_assert_uint_ge(ms, 90);
  ck_assert_uint_lt(ms, 2000);
  fr_client_close(c);
  server_stop();
}

START_TEST(stream_ipc) { stream_one(0); }
END_TEST

START_TEST(stream_tcp) { stream_one(1); }
END_TEST

/* Several jobs at once: every event reaches its job, all finish. */
START_TEST(interleaved_jobs) {
  server_start(1, 0);
  fr_client_t *c;
  ck_assert_int_eq(fr_client_connect(&c, srv.endpoint), 0);
  uint64_t ids[4];
  int counts[4] = {0}, done = 0;
  for (int i = 0; i < 4; i++) {
    proto_submit_t r = prompt_req("x", (uint32_t)(i + 2));
    if (i == 3) r.id = 1000; /* a caller-chosen id */
    ck_assert_int_eq(fr_client_submit(c, &r, &ids[i]), 0);
  }
  ck_assert_uint_eq(ids[3], 1000);
  ck_assert_uint_ne(ids[0], ids[1]);
  while (done < 4) {
    proto_event_t ev;
    ck_assert_int_eq(fr_client_next_event(c, 5000, &ev), 0);
    int j = 0;
    while (j < 4 && ids[j] != ev.id) j++;
    ck_assert_int_lt(j, 4);
    counts[j]++;
    if (ev.finish) done++;
  }
  for (int i = 0; i < 4; i++) ck_assert_int_eq(counts[i], i + 2);
  ck_assert_int_eq(fr_client_active_jobs(c), 0);
  fr_client_close(c);
  server_stop();
}
END_TEST

START_TEST(cancel_job) {
  server_start(0, 0);
  fr_client_t *c;
  ck_assert_int_eq(fr_client_connect(&c, srv.endpoint), 0);
  proto_submit_t r = prompt_req("wait", 100);
  uint64_t id;
  ck_assert_int_eq(fr_client_submit(c, &r, &id), 0);
  proto_event_t ev;
  ck_assert_int_eq(fr_client_next_event(c, 5000, &ev), 0);
  ck_assert_int_eq(ev.finish, PROTO_FINISH_NONE);
  ck_assert_int_eq(fr_client_next_event(c, 100, &ev), FR_ETIMEOUT); /* it waits */
  ck_assert_int_eq(fr_client_cancel(c, id), 0);
  ck_assert_int_eq(fr_client_next_event(c, 5000, &ev), 0);
  ck_assert_uint_eq(ev.id, id);
  ck_assert_int_eq(ev.finish, PROTO_FINISH_CANCEL);
  ck_assert_int_eq(atomic_load(&srv.cancels), 1);
  ck_assert_int_eq(fr_client_active_jobs(c), 0);
  fr_client_close(c);
  server_stop();
}
END_TEST

/* Status and model list while a job streams: the job's events are kept
 * for next_event. */
START_TEST(status_and_models) {
  server_start(1, 0);
  fr_client_t *c;
  ck_assert_int_eq(fr_client_connect(&c, srv.endpoint), 0);
  proto_submit_t r = prompt_req("hello", 4);
  uint64_t id;
  ck_assert_int_eq(fr_client_submit(c, &r, &id), 0);
  proto_status_reply_t st;
  ck_assert_msg(fr_client_status(c, NULL, &st) == 0, "%s", fr_last_error());
  ck_assert_str_eq(st.model, "fake");
  ck_assert_uint_eq(st.queued, 1);
  ck_assert_uint_eq(st.kv_total_blocks, 100);
  ck_assert_uint_eq(st.n_workers, 2);
  proto_models_reply_t mr;
  ck_assert_int_eq(fr_client_list_models(c, &mr), 0);
  ck_assert_uint_eq(mr.n_models, 2);
  ck_assert_str_eq(mr.models[0].name, "fake");
  ck_assert_uint_eq(mr.models[0].max_ctx, 2048);
  ck_assert_str_eq(mr.models[1].name, "other");
  /* an error reply to a request */
  ck_assert_int_eq(fr_client_status(c, "nope", &st), FR_ENOTFOUND);
  ck_assert_ptr_nonnull(strstr(fr_last_error(), "no such model"));
  int n = 0;
  proto_event_t ev;
  do {
    ck_assert_int_eq(fr_client_next_event(c, 5000, &ev), 0);
    ck_assert_uint_eq(ev.id, id);
    ck_assert_int_eq(ev.tokens[0], n);
    n++;
  } while (!ev.finish);
  ck_assert_int_eq(n, 4);
  fr_client_close(c);
  server_stop();
}
END_TEST

START_TEST(job_error) {
  server_start(0, 0);
  fr_client_t *c;
  ck_assert_int_eq(fr_client_connect(&c, srv.endpoint), 0);
  proto_submit_t r = prompt_req("err", 4);
  uint64_t id;
  ck_assert_int_eq(fr_client_submit(c, &r, &id), 0);
  proto_event_t ev;
  ck_assert_int_eq(fr_client_next_event(c, 5000, &ev), 0);
  ck_assert_uint_eq(ev.id, id);
  ck_assert_int_eq(ev.finish, PROTO_FINISH_ERROR);
  ck_assert_int_eq(ev.error.code, PROTO_ERR_BAD_REQUEST);
  ck_assert_str_eq(ev.error.message, "bad prompt");
  ck_assert_int_eq(fr_client_active_jobs(c), 0);
  /* the client refuses a bad request before sending it */
  r.n_tokens = 1;
  r.tokens = (int32_t[]){5};
  ck_assert_int_eq(fr_client_submit(c, &r, &id), FR_EPROTO);
  r.n_tokens = 0;
  r.sp.temperature = -1;
  ck_assert_int_eq(fr_client_submit(c, &r, &id), FR_EPROTO);
  ck_assert_int_eq(fr_client_active_jobs(c), 0);
  ck_assert_int_eq(atomic_load(&srv.submits), 1);
  fr_client_close(c);
  server_stop();
}
END_TEST

/* A coordinator that answers nothing, and one that is not there. */
START_TEST(timeouts) {
  server_start(1, 1);
  fr_client_t *c;
  ck_assert_int_eq(fr_client_connect(&c, srv.endpoint), 0);
  fr_client_set_timeout(c, 200);
  proto_status_reply_t st;
  uint64_t t0 = fr_now_ns();
  ck_assert_int_eq(fr_client_status(c, NULL, &st), FR_ETIMEOUT);
  uint64_t ms = (fr_now_ns() - t0) / 1000000;
  ck_assert_uint_ge(ms, 190);
  ck_assert_uint_lt(ms, 3000);
  proto_models_reply_t mr;
  ck_assert_int_eq(fr_client_list_models(c, &mr), FR_ETIMEOUT);
  proto_event_t ev;
  ck_assert_int_eq(fr_client_next_event(c, 0, &ev), FR_ETIMEOUT);
  fr_client_close(c);
  server_stop();

  char dir[] = "/tmp/fr_client_noneXXXXXX", ep[128];
  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(ep, sizeof ep, "ipc://%s/nobody.sock", dir);
  ck_assert_int_eq(fr_client_connect(&c, ep), 0); /* connects in the background */
  fr_client_set_timeout(c, 150);
  ck_assert_int_eq(fr_client_status(c, NULL, &st), FR_ETIMEOUT);
  proto_submit_t r = prompt_req("hello", 2);
  uint64_t id;
  ck_assert_int_eq(fr_client_submit(c, &r, &id), 0); /* queued for when it comes */
  ck_assert_int_eq(fr_client_next_event(c, 100, &ev), FR_ETIMEOUT);
  fr_client_close(c);
  rmdir(dir);
}
END_TEST

/* The coordinator goes away while a job runs. */
static void server_gone(int tcp) {
  server_start(tcp, 0);
  fr_client_t *c;
  ck_assert_int_eq(fr_client_connect(&c, srv.endpoint), 0);
  proto_submit_t r = prompt_req("hello", 2);
  uint64_t id;
  proto_event_t ev;
  ck_assert_int_eq(fr_client_submit(c, &r, &id), 0);
  do ck_assert_int_eq(fr_client_next_event(c, 5000, &ev), 0);
  while (!ev.finish);
  r = prompt_req("die", 2);
  ck_assert_int_eq(fr_client_submit(c, &r, &id), 0);
  uint64_t t0 = fr_now_ns();
  int rc = fr_client_next_event(c, 10000, &ev);
  ck_assert_msg(rc == FR_EDEAD, "rc %d: %s", rc, fr_last_error());
  ck_assert_uint_lt((fr_now_ns() - t0) / 1000000, 5000);
  ck_assert_int_eq(fr_client_active_jobs(c), 0);
  /* afterwards: plain timeouts, no second FR_EDEAD */
  ck_assert_int_eq(fr_client_next_event(c, 50, &ev), FR_ETIMEOUT);
  fr_client_close(c);
  server_stop();
}

START_TEST(gone_ipc) { server_gone(0); }
END_TEST

START_TEST(gone_tcp) { server_gone(1); }
END_TEST

START_TEST(bad_endpoint) {
  fr_client_t *c = (fr_client_t *)1;
  ck_assert_int_eq(fr_client_connect(&c, "nonsense://x"), FR_EZMQ);
  ck_assert_ptr_null(c);
  ck_assert_ptr_nonnull(strstr(fr_last_error(), "nonsense://x"));
  ck_assert_int_eq(fr_client_connect(&c, NULL), -EINVAL);
  void *ctx = zmq_ctx_new();
  ck_assert_int_eq(fr_client_connect_ctx(&c, ctx, "inproc://fr-test"), 0);
  fr_client_close(c);
  zmq_ctx_term(ctx);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("proto_client");
  TCase *tc = tcase_create("client");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, stream_ipc);
  tcase_add_test(tc, stream_tcp);
  tcase_add_test(tc, interleaved_jobs);
  tcase_add_test(tc, cancel_job);
  tcase_add_test(tc, status_and_models);
  tcase_add_test(tc, job_error);
  tcase_add_test(tc, timeouts);
  tcase_add_test(tc, gone_ipc);
  tcase_add_test(tc, gone_tcp);
  tcase_add_test(tc, bad_endpoint);
  suite_add_tcase(s, tc);
  return s;
}

/* The shared main (tests/common/test_main.c) runs this program's suites. */
#include "tests/common/test_main.h"

const test_prog_t test_prog = {.suites = {suite}};
