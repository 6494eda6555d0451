/* test_requests.c - what requests carry, end to end (real `ferrumctl serve`
 * + ferrum-worker, the real SmolLM2): prompts of hundreds of kilobytes
 * beside a stream, malformed RPC input, seeds and stop rules, chat
 * messages, logprobs and logits rows. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "kv/kv.h"
#include "model/generate.h"
#include "model/model.h"
#include "model/prompt.h"
#include "model/source.h"
#include "model/tok_internal.h"
#include "model/gguf.h"
#include "tests/engine/engine_fx.h"
#include "tests/engine/engine_refs.h"

/* ---- big prompts ------------------------------------------------------------------------ */

typedef struct {
  const efx_server_t *s;
  size_t bytes;
  efx_job_t job;
  uint64_t t_sent_ns, t_done_ns;
} big_prompt_t;

/* Submits a prompt of b->bytes of random letters on a connection of its own
 * and waits for its answer. */
static void *big_prompt_thread(void *arg) {
  big_prompt_t *b = arg;
  char *text = malloc(b->bytes + 1);
  uint64_t x = 88172645463325252ull; /* letters without spaces: the slowest text for BPE */
  for (size_t i = 0; i < b->bytes; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    text[i] = (char)('a' + x % 26);
  }
  text[b->bytes] = 0;
  fr_client_t *c = NULL;
  proto_submit_t r = efx_greedy(text, 1);
  b->t_sent_ns = fr_now_ns();
  if (fr_client_connect(&c, b->s->rpc) == 0 && fr_client_submit(c, &r, &b->job.id) == 0)
    efx_collect(c, &b->job, 1, 120000);
  b->t_done_ns = fr_now_ns();
  fr_client_close(c);
  free(text);
  return NULL;
}

/* A prompt of hundreds of kilobytes is tokenized off the coordinator's
 * loop: a stream that runs meanwhile gets its tokens at the usual pace
 * (before, every stream stalled for the whole tokenization). A prompt past
 * what the context could hold is refused at once, without tokenizing it. */
START_TEST(test_big_prompt_does_not_stall_streams) {
  efx_need_model();
  efx_server_t s;
  ck_assert_int_eq(efx_start(&s, NULL), 0);
  fr_client_t *c = NULL;
  ck_assert_int_eq(fr_client_connect(&c, s.rpc), 0);
  efx_job_t j = {0};
  proto_submit_t r = efx_greedy(efx_prompts[1], 400);
  ck_assert_int_eq(fr_client_submit(c, &r, &j.id), 0);
  efx_wait_events(c, j.id, 2);
  big_prompt_t big = {.s = &s, .bytes = 500000};
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, big_prompt_thread, &big), 0);
  static uint64_t at[1024]; /* when each event of the stream came */
  int n_at = 0;
  at[n_at++] = fr_now_ns();
  proto_event_t ev;
  bool done = false;
  while (!done && n_at < 1024 && fr_client_next_event(c, 60000, &ev) == 0) {
    at[n_at++] = fr_now_ns();
    done = ev.finish != PROTO_FINISH_NONE;
  }
  pthread_join(th, NULL);
  ck_assert(done);
  uint64_t max_gap = 0; /* the longest wait for an event while the big prompt was in */
  int inside = 0;        /* the stream's events while it was */
  for (int i = 1; i < n_at; i++) {
    if (at[i] > big.t_sent_ns && at[i - 1] < big.t_done_ns) max_gap = FR_MAX(max_gap, at[i] - at[i - 1]);
    inside += at[i] > big.t_sent_ns && at[i] < big.t_done_ns;
  }
  double tok_s = (big.t_done_ns - big.t_sent_ns) / 1e9, gap_s = max_gap / 1e9;
  fprintf(stderr, "500 kB prompt answered after %.3f s; %d stream events meanwhile, the longest gap %.3f s\n", tok_s,
          inside, gap_s);
  ck_assert_int_eq(big.job.error, PROTO_ERR_TOO_BIG); /* more tokens than the context */
  ck_assert_msg(gap_s < tok_s / 2, "a stream stalled %.3f s while a prompt was tokenized for %.2f s", gap_s, tok_s);
  /* Enough of the stream inside the tokenization to tell a stall from the
   * stream's own pace (a fast machine tokenizes 500 kB in under 0.1 s, and
   * the prompt cannot grow: past 64 bytes a token of the context it is
   * refused untokenized). A stall fails the gap check first: one gap spans
   * the whole tokenization. */
  ck_assert_msg(inside >= 4, "%d stream events during %.3f s of tokenizing: too few to tell", inside, tok_s);
  /* 4 MB: refused before tokenizing */
  big_prompt_t huge = {.s = &s, .bytes = 4000000};
  big_prompt_thread(&huge);
  ck_assert_int_eq(huge.job.error, PROTO_ERR_TOO_BIG);
  ck_assert_msg((huge.t_done_ns - huge.t_sent_ns) / 1e9 < tok_s, "4 MB prompt not refused fast");
  fr_client_close(c);
  efx_stop_clean(&s, false);
}
END_TEST

/* ---- bad input ----------------------------------------------------------------------------- */

/* Sends frames on a raw DEALER and returns the decoded reply type (or -1). */
static int raw_call(void *sock, const void *data, size_t len, bool extra_frame, proto_msg_t *m) {
  if (extra_frame) zmq_send(sock, "x", 1, ZMQ_SNDMORE);
  if (zmq_send(sock, data, len, 0) < 0) return -1;
  zmq_pollitem_t pi = {.socket = sock, .events = ZMQ_POLLIN};
  if (zmq_poll(&pi, 1, 5000) != 1) return -1;
  zmq_msg_t msg;
  zmq_msg_init(&msg);
  zmq_msg_recv(&msg, sock, 0);
  int rc = proto_msg_decode(m, zmq_msg_data(&msg), zmq_msg_size(&msg), PROTO_ACCEPT_CLIENT);
  zmq_msg_close(&msg);
  return rc ? -1 : (int)m->type;
}


/* Stray hellos on the worker endpoint: a world size this coordinator does
 * not run, and a registered rank again. Both are ignored (and logged). */
static void stray_hellos(const efx_server_t *s) {
  char ep[512];
  snprintf(ep, sizeof ep, "ipc://%s/ferrum/%s.workers", s->dir, s->instance);
  void *ctx = zmq_ctx_new(), *sock = zmq_socket(ctx, ZMQ_DEALER);
  int zero = 0;
  zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
  ck_assert_int_eq(zmq_connect(sock, ep), 0);
  proto_buf_t b;
  proto_buf_init(&b);
  proto_hello_t h = {.rank = 0, .world_size = 2, .device = "cpu", .block_size = 16, .max_batch = 1,
                     .pid = (uint32_t)getpid()};
  ck_assert_int_eq(proto_encode(&b, PROTO_T_HELLO, &h), 0);
  ck_assert_int_eq(zmq_send(sock, b.data, b.len, 0), (int)b.len);
  ck_assert_msg(efx_log_has(s, "hello from rank 0 of 2 ignored"), "no world-size refusal in %s", s->err_path);
  h.world_size = 1;
  ck_assert_int_eq(proto_encode(&b, PROTO_T_HELLO, &h), 0);
  ck_assert_int_eq(zmq_send(sock, b.data, b.len, 0), (int)b.len);
  ck_assert_msg(efx_log_has(s, "unexpected hello from rank 0"), "no refusal in %s", s->err_path);
  proto_buf_free(&b);
  zmq_close(sock);
  zmq_ctx_term(ctx);
}

START_TEST(test_bad_rpc_input) {
  efx_need_model();
  efx_server_t s;
  const char *extra[] = {"--max-model-len", "256", "--max-num-seqs", "1", "--max-queue", "1", NULL};
  ck_assert_int_eq(efx_start(&s, extra), 0);
  void *ctx = zmq_ctx_new(), *sock = zmq_socket(ctx, ZMQ_DEALER);
  int zero = 0;
  zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
  ck_assert_int_eq(zmq_connect(sock, s.rpc), 0);
  proto_msg_t m;
  proto_msg_init(&m);
  /* garbage */
  ck_assert_int_eq(raw_call(sock, "\xc1\xff garbage", 10, false, &m), PROTO_T_ERROR);
  ck_assert_int_eq(m.u.error.code, PROTO_ERR_BAD_REQUEST);
  /* a worker's message type from a client */
  proto_buf_t b;
  proto_buf_init(&b);
  proto_heartbeat_t hb = {.rank = 0, .seq = 1};
  proto_result_t res = {.step_id = 1, .epoch = 1};
  ck_assert_int_eq(proto_encode(&b, PROTO_T_RESULT, &res), 0);
  ck_assert_int_eq(raw_call(sock, b.data, b.len, false, &m), PROTO_T_ERROR);
  /* two frames */
  ck_assert_int_eq(proto_encode(&b, PROTO_T_HEARTBEAT, &hb), 0);
  ck_assert_int_eq(raw_call(sock, b.data, b.len, true, &m), PROTO_T_ERROR);
  /* a heartbeat is answered */
  ck_assert_int_eq(raw_call(sock, b.data, b.len, false, &m), PROTO_T_HEARTBEAT);
  /* prompt longer than the context: 413 */
  static int32_t toks[300];
  for (int i = 0; i < 300; i++) toks[i] = 100 + i;
  proto_submit_t r = efx_greedy(NULL, 4);
  r.id = 7, r.tokens = toks, r.n_tokens = 300;
  ck_assert_int_eq(proto_encode(&b, PROTO_T_SUBMIT, &r), 0);
  ck_assert_int_eq(raw_call(sock, b.data, b.len, false, &m), PROTO_T_ERROR);
  ck_assert_int_eq(m.u.error.code, PROTO_ERR_TOO_BIG);
  ck_assert_int_eq(m.u.error.id, 7);
  /* prompt + max_tokens past the context, token id outside the vocabulary, unknown model: 400 / 404 */
  r.n_tokens = 200, r.max_tokens = 100;
  ck_assert_int_eq(proto_encode(&b, PROTO_T_SUBMIT, &r), 0);
  ck_assert_int_eq(raw_call(sock, b.data, b.len, false, &m), PROTO_T_ERROR);
  ck_assert_int_eq(m.u.error.code, PROTO_ERR_BAD_REQUEST);
  r.n_tokens = 3, r.max_tokens = 4, toks[1] = 1 << 30;
  ck_assert_int_eq(proto_encode(&b, PROTO_T_SUBMIT, &r), 0);
  ck_assert_int_eq(raw_call(sock, b.data, b.len, false, &m), PROTO_T_ERROR);
  ck_assert_int_eq(m.u.error.code, PROTO_ERR_BAD_REQUEST);
  toks[1] = 101;
  r.model = "no-such-model";
  ck_assert_int_eq(proto_encode(&b, PROTO_T_SUBMIT, &r), 0);
  ck_assert_int_eq(raw_call(sock, b.data, b.len, false, &m), PROTO_T_ERROR);
  ck_assert_int_eq(m.u.error.code, PROTO_ERR_NOT_FOUND);
  /* bad sampling params: a hand-made submit with temperature -1 */
  static const uint8_t bad_sp[] = {0x85, 0xa1, 'v', 0x05, 0xa1, 't', 0xa6, 's', 'u', 'b', 'm', 'i', 't',
                                   0xa2, 'i', 'd', 0x05, 0xa1, 'p', 0xa2, 'h', 'i',
                                   0xa2, 's', 'p', 0x81, 0xa1, 't', 0xff};
  uint8_t msg[64];
  memcpy(msg, bad_sp, sizeof bad_sp);
  ck_assert_int_eq(raw_call(sock, msg, sizeof bad_sp, false, &m), PROTO_T_ERROR);
  ck_assert_int_eq(m.u.error.code, PROTO_ERR_BAD_REQUEST);
  msg[3] = 0x04; /* an older client's submit (no prompt logprobs, no kept special tokens): refused by version,
                  * not misread */
  ck_assert_int_eq(raw_call(sock, msg, sizeof bad_sp, false, &m), PROTO_T_ERROR);
  ck_assert_int_eq(m.u.error.code, PROTO_ERR_VERSION);
  ck_assert_ptr_nonnull(strstr(m.u.error.message, "version"));
  /* logit bias: a value out of range (the decoder), a token past the vocabulary (the coordinator) */
  static const uint8_t bad_lb[] = {0x85, 0xa1, 'v', 0x05, 0xa1, 't', 0xa6, 's', 'u', 'b', 'm', 'i', 't',
                                   0xa2, 'i', 'd', 0x05, 0xa1, 'p', 0xa2, 'h', 'i',
                                   0xa2, 's', 'p', 0x81, 0xa2, 'l', 'b', 0x91, 0x82, 0xa1, 't', 0x05, 0xa1, 'b', 0xcc, 200};
  memcpy(msg, bad_lb, sizeof bad_lb);
  ck_assert_int_eq(raw_call(sock, msg, sizeof bad_lb, false, &m), PROTO_T_ERROR);
  ck_assert_int_eq(m.u.error.code, PROTO_ERR_BAD_REQUEST);
  ck_assert_ptr_nonnull(strstr(m.u.error.message, "logit bias"));
  proto_bias_t lb = {.token = 1 << 30, .bias = 1};
  r.model = NULL, r.sp.bias = &lb, r.sp.n_bias = 1;
  ck_assert_int_eq(proto_encode(&b, PROTO_T_SUBMIT, &r), 0);
  ck_assert_int_eq(raw_call(sock, b.data, b.len, false, &m), PROTO_T_ERROR);
  ck_assert_int_eq(m.u.error.code, PROTO_ERR_BAD_REQUEST);
  ck_assert_ptr_nonnull(strstr(m.u.error.message, "logit_bias"));
  /* a guide the coordinator cannot compile (an RPC client's: the HTTP layer checks its own): 400 naming it */
  r.sp.bias = NULL, r.sp.n_bias = 0;
  r.guide = (proto_guide_t){.kind = PROTO_GUIDE_JSON, .spec = "{\"type\": \"string\", \"pattern\": \"a+\"}"};
  ck_assert_int_eq(proto_encode(&b, PROTO_T_SUBMIT, &r), 0);
  ck_assert_int_eq(raw_call(sock, b.data, b.len, false, &m), PROTO_T_ERROR);
  ck_assert_int_eq(m.u.error.code, PROTO_ERR_BAD_REQUEST);
  ck_assert_ptr_nonnull(strstr(m.u.error.message, "pattern"));
  r.guide = (proto_guide_t){.kind = PROTO_GUIDE_REGEX, .spec = "(a"};
  ck_assert_int_eq(proto_encode(&b, PROTO_T_SUBMIT, &r), 0);
  ck_assert_int_eq(raw_call(sock, b.data, b.len, false, &m), PROTO_T_ERROR);
  ck_assert_int_eq(m.u.error.code, PROTO_ERR_BAD_REQUEST);
  ck_assert_ptr_nonnull(strstr(m.u.error.message, "unbalanced"));
  r.guide = (proto_guide_t){0};
  /* cancel of an unknown job: 404 */
  proto_cancel_t cn = {.id = 999};
  ck_assert_int_eq(proto_encode(&b, PROTO_T_CANCEL, &cn), 0);
  ck_assert_int_eq(raw_call(sock, b.data, b.len, false, &m), PROTO_T_ERROR);
  ck_assert_int_eq(m.u.error.code, PROTO_ERR_NOT_FOUND);
  proto_buf_free(&b);
  proto_msg_free(&m);
  zmq_close(sock);
  zmq_ctx_term(ctx);
  /* queue full: one job runs (one sequence at most), one waits, the next gets 429 */
  fr_client_t *c = NULL;
  ck_assert_int_eq(fr_client_connect(&c, s.rpc), 0);
  efx_job_t q[3];
  memset(q, 0, sizeof q);
  proto_submit_t lr = efx_greedy(efx_prompts[1], 64);
  ck_assert_int_eq(fr_client_submit(c, &lr, &q[0].id), 0);
  efx_wait_events(c, q[0].id, 1); /* running */
  for (int i = 1; i < 3; i++) ck_assert_int_eq(fr_client_submit(c, &lr, &q[i].id), 0);
  ck_assert_int_eq(efx_collect(c, &q[2], 1, 30000), 0);
  ck_assert_int_eq(q[2].finish, PROTO_FINISH_ERROR);
  ck_assert_int_eq(q[2].error, PROTO_ERR_BUSY);
  ck_assert_int_eq(fr_client_cancel(c, q[0].id), 0);
  ck_assert_int_eq(fr_client_cancel(c, q[1].id), 0);
  ck_assert_int_eq(efx_collect(c, q, 2, 30000), 0);
  ck_assert_int_eq(q[0].finish, PROTO_FINISH_CANCEL);
  ck_assert_int_eq(q[1].finish, PROTO_FINISH_CANCEL);
  fr_client_close(c);
  stray_hellos(&s);
  /* still healthy: a normal job runs */
  efx_job_t j;
  proto_submit_t ok = efx_greedy(efx_prompts[0], 4);
  ck_assert_int_eq(efx_run_one(&s, &ok, &j), 0);
  ck_assert_int_eq(j.finish, PROTO_FINISH_LENGTH);
  ck_assert_int_eq(j.n_tokens, 4);
  efx_stop_clean(&s, false);
}
END_TEST

/* ---- connections that come and go ---------------------------------------------------------- */

/* A job from a connection that reuses the file descriptor of one that just
 * closed is that new client's: the old connection's disconnect (which the
 * coordinator learns of asynchronously, from the socket monitor) must not
 * cancel it. Status clients open and close right before each job, as a
 * load balancer's health checks do; every job gets its answer. */
START_TEST(test_job_after_closed_connection) {
  efx_need_model();
  efx_server_t s;
  ck_assert_int_eq(efx_start(&s, NULL), 0);
  int lost = 0;
  for (int i = 0; i < 150; i++) {
    proto_status_reply_t st;
    ck_assert_int_eq(efx_status(&s, &st), 0);
    fr_client_t *c = NULL;
    ck_assert_int_eq(fr_client_connect(&c, s.rpc), 0);
    efx_job_t j = {0};
    proto_submit_t r = efx_greedy(efx_prompts[i % 4], 1);
    ck_assert_int_eq(fr_client_submit(c, &r, &j.id), 0);
    bool ok = efx_collect(c, &j, 1, 15000) == 0 && j.finish == PROTO_FINISH_LENGTH;
    fr_client_close(c);
    if (!ok && ++lost) break; /* one is enough: each costs the timeout */
  }
  ck_assert_msg(lost == 0, "%d of 150 jobs got no answer", lost);
  efx_stop_clean(&s, false);
}
END_TEST

/* ---- sampling and stop rules ---------------------------------------------------------------- */

START_TEST(test_seed_and_stop_strings) {
  efx_need_model();
  efx_server_t s;
  ck_assert_int_eq(efx_start(&s, NULL), 0);
  /* same seed -> same tokens, alone or in a batch with other jobs */
  proto_submit_t r = efx_greedy(efx_prompts[1], 12);
  r.sp.temperature = 1.0f, r.sp.top_k = 40, r.sp.seed = 1234, r.sp.has_seed = true;
  efx_job_t a, b[3];
  ck_assert_int_eq(efx_run_one(&s, &r, &a), 0);
  fr_client_t *c = NULL;
  ck_assert_int_eq(fr_client_connect(&c, s.rpc), 0);
  memset(b, 0, sizeof b);
  proto_submit_t o1 = efx_greedy(efx_prompts[3], 12), o2 = efx_greedy(efx_prompts[4], 12);
  ck_assert_int_eq(fr_client_submit(c, &o1, &b[0].id), 0);
  ck_assert_int_eq(fr_client_submit(c, &r, &b[1].id), 0);
  ck_assert_int_eq(fr_client_submit(c, &o2, &b[2].id), 0);
  ck_assert_int_eq(efx_collect(c, b, 3, 60000), 0);
  ck_assert_int_eq(b[1].n_tokens, 12);
  ck_assert_mem_eq(a.tokens, b[1].tokens, 12 * sizeof(int32_t));
  fr_client_close(c);
  /* stop string: the text ends before it, finish "stop" */
  proto_submit_t g = efx_greedy(efx_prompts[15], 40);
  efx_job_t full, cut;
  ck_assert_int_eq(efx_run_one(&s, &g, &full), 0);
  ck_assert_int_gt(full.text_len, 6);
  char stop[8] = {0};
  memcpy(stop, full.text + 3, 3); /* a stop string that starts at byte 3 */
  char *stops[] = {stop};
  g.stop.strs = stops, g.stop.n_strs = 1;
  ck_assert_int_eq(efx_run_one(&s, &g, &cut), 0);
  ck_assert_int_eq(cut.finish, PROTO_FINISH_STOP);
  const char *at = strstr(full.text, stop);
  ck_assert_ptr_nonnull(at);
  ck_assert_int_eq(cut.text_len, (size_t)(at - full.text));
  ck_assert_mem_eq(cut.text, full.text, cut.text_len);
  /* stop token id: the generation ends at its first occurrence */
  g.stop.n_strs = 0;
  int32_t sid = full.tokens[5];
  g.stop.ids = &sid, g.stop.n_ids = 1;
  ck_assert_int_eq(efx_run_one(&s, &g, &cut), 0);
  ck_assert_int_eq(cut.finish, PROTO_FINISH_STOP);
  int first = 0;
  while (full.tokens[first] != sid) first++;
  ck_assert_int_eq(cut.n_tokens, first + 1);
  efx_stop_clean(&s, false);
}
END_TEST

/* ---- chat messages ------------------------------------------------------------------------ */

START_TEST(test_chat_messages_match_generator) {
  efx_need_model();
  const char *q = "What is the capital of France?";
  int32_t ref[12];
  {
    kern_backend_t *be = NULL;
    model_t *m = NULL;
    model_gen_t *g = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    model_load_opts_t lo = {0};
    ck_assert_int_eq(kern_cpu_create(&be, 2), 0);
    ck_assert_int_eq(model_load(&m, efx_model(), be, &lo), 0);
    model_chat_msg_t msgs[2] = {{"system", "You answer in one short sentence.", NULL}, {"user", q, NULL}};
    ck_assert_int_eq(model_prompt_chat(m, msgs, 2, &ids, &n_ids), 0);
    ck_assert_int_eq(model_gen_create(&g, m, 0), 0);
    ck_assert_int_eq(model_gen_feed(g, ids, (int)n_ids), 0);
    for (int k = 0; k < 12; k++) {
      int32_t best = 0;
      for (int v = 1; v < m->cfg.vocab_size; v++)
        if (g->logits[v] > g->logits[best]) best = v;
      ref[k] = best;
      ck_assert_int_eq(model_gen_feed(g, &best, 1), 0);
    }
    free(ids);
    model_gen_destroy(g);
    model_destroy(m);
    kern_backend_destroy(be);
  }
  efx_server_t s;
  ck_assert_int_eq(efx_start(&s, NULL), 0);
  proto_chat_msg_t msgs[2] = {{.role = "system", .content = "You answer in one short sentence."},
                              {.role = "user", .content = (char *)q}};
  proto_submit_t r = efx_greedy(NULL, 12);
  r.messages = msgs, r.n_messages = 2;
  efx_job_t j;
  ck_assert_int_eq(efx_run_one(&s, &r, &j), 0);
  ck_assert_int_eq(j.n_tokens, 12);
  ck_assert_mem_eq(j.tokens, ref, sizeof ref);
  ck_assert_ptr_nonnull(strstr(j.text, "Paris"));
  efx_stop_clean(&s, false);
}
END_TEST

/* ---- logprobs and logits ------------------------------------------------------------------- */

START_TEST(test_logprobs_and_logits) {
  efx_need_model();
  efx_load_refs(1);
  efx_server_t s;
  ck_assert_int_eq(efx_start(&s, NULL), 0);
  fr_client_t *c = NULL;
  ck_assert_int_eq(fr_client_connect(&c, s.rpc), 0);
  proto_submit_t r = efx_greedy(efx_prompts[0], 4);
  r.sp.logprobs = 3;
  r.return_logits = true;
  uint64_t id;
  ck_assert_int_eq(fr_client_submit(c, &r, &id), 0);
  int n = 0;
  for (bool done = false; !done;) {
    proto_event_t ev;
    ck_assert_int_eq(fr_client_next_event(c, 60000, &ev), 0);
    ck_assert_uint_eq(ev.id, id);
    ck_assert_uint_eq(ev.n_logprobs, ev.n_tokens);
    ck_assert_uint_eq(ev.n_top, 3 * ev.n_tokens);
    ck_assert_uint_eq(ev.n_logits % 49152, 0);
    ck_assert_uint_eq(ev.n_logits / 49152, ev.n_tokens);
    for (uint32_t t = 0; t < ev.n_tokens; t++, n++) {
      const float *row = ev.logits + (size_t)t * 49152;
      int best = 0;
      double mx = row[0], sum = 0;
      for (int v = 1; v < 49152; v++)
        if (row[v] > row[best]) best = v, mx = row[v];
      for (int v = 0; v < 49152; v++) sum += exp(row[v] - mx);
      ck_assert_int_eq(ev.tokens[t], efx_refs[0][n]);
      ck_assert_int_eq(best, ev.tokens[t]);
      ck_assert_int_eq(ev.top[3 * t].token, ev.tokens[t]);
      ck_assert_float_eq_tol(ev.top[3 * t].logprob, ev.logprobs[t], 1e-5);
      ck_assert_float_eq_tol(ev.logprobs[t], row[best] - mx - log(sum), 1e-3);
      ck_assert(ev.top[3 * t + 1].logprob <= ev.top[3 * t].logprob);
    }
    done = ev.finish != PROTO_FINISH_NONE;
  }
  ck_assert_int_eq(n, 4);
  /* not streamed: one event with every token's logits row */
  r.stream = false;
  ck_assert_int_eq(fr_client_submit(c, &r, &id), 0);
  proto_event_t ev;
  ck_assert_int_eq(fr_client_next_event(c, 60000, &ev), 0);
  ck_assert_int_eq(ev.finish, PROTO_FINISH_LENGTH);
  ck_assert_uint_eq(ev.n_tokens, 4);
  ck_assert_uint_eq(ev.n_logits, 4 * 49152);
  for (int t = 0; t < 4; t++) {
    const float *row = ev.logits + (size_t)t * 49152;
    int best = 0;
    for (int v = 1; v < 49152; v++)
      if (row[v] > row[best]) best = v;
    ck_assert_int_eq(best, efx_refs[0][t]);
  }
  fr_client_close(c);
  efx_stop_clean(&s, false);
}
END_TEST

static Suite *requests_suite(void) {
  Suite *s = suite_create("requests");
  TCase *t = tcase_create("e2e");
  tcase_set_timeout(t, 240);
  EFX_ADD(t, test_big_prompt_does_not_stall_streams);
  EFX_ADD(t, test_bad_rpc_input);
  EFX_ADD(t, test_seed_and_stop_strings);
  EFX_ADD(t, test_job_after_closed_connection);
  EFX_ADD(t, test_logprobs_and_logits);
  EFX_ADD(t, test_chat_messages_match_generator);
  suite_add_tcase(s, t);
  return s;
}

#include "tests/common/test_main.h"

const test_prog_t test_prog = {.suites = {requests_suite}, .setup = efx_setup};
