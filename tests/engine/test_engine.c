/* test_engine.c - the engine end to end: real `ferrumctl serve` processes
 * (coordinator + ferrum-worker) with the real SmolLM2 model, driven over
 * RPC (fr_client, and raw ZeroMQ for malformed input).
 *
 * Reference for the tokens: the in-process single-sequence generator
 * (model/generate.h), itself checked against llama.cpp by test_generate. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
#include "tests/engine/engine_fx.h"

#define N_OUT 16

static const char *const prompts[] = {
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
    "The three primary colors are",
    "Water boils at a temperature of",
    "In 1492, Christopher Columbus",
    "The quick brown fox",
    "My favourite programming language is",
    "The largest planet in the solar system is",
    "To make a cup of tea, first",
    "The sum of two and two is",
    "Photosynthesis is the process by which",
    "A haiku about the sea:",
    "The best way to learn a language is",
    "Mount Everest is located in",
    "Listing prime numbers: 2, 3, 5,",
};
#define N_PROMPTS 16

static int32_t refs[N_PROMPTS][N_OUT];
static bool refs_done;

static void need_model(void) {
  if (access(efx_model(), R_OK) != 0) {
    fprintf(stderr, "skip: no model at %s\n", efx_model());
    exit(77);
  }
}

static void load_refs(int n) {
  if (refs_done) return;
  for (int i = 0; i < n; i++) ck_assert_int_eq(efx_reference(prompts[i], N_OUT, refs[i]), N_OUT);
  refs_done = true;
}

static void check_ref(const efx_job_t *j, int i) {
  ck_assert_int_eq(j->finish, PROTO_FINISH_LENGTH);
  ck_assert_int_eq(j->n_tokens, N_OUT);
  for (int t = 0; t < N_OUT; t++)
    ck_assert_msg(j->tokens[t] == refs[i][t], "prompt %d token %d: %d, reference %d", i, t, j->tokens[t], refs[i][t]);
}

/* Submits prompts[0..n) at once on one client and collects them. */
static void run_batch(efx_server_t *s, int n, efx_job_t *jobs) {
  fr_client_t *c = NULL;
  ck_assert_int_eq(fr_client_connect(&c, s->rpc), 0);
  memset(jobs, 0, (size_t)n * sizeof *jobs);
  for (int i = 0; i < n; i++) {
    proto_submit_t r = efx_greedy(prompts[i], N_OUT);
    ck_assert_int_eq(fr_client_submit(c, &r, &jobs[i].id), 0);
  }
  ck_assert_int_eq(efx_collect(c, jobs, n, 180000), 0);
  fr_client_close(c);
}

static void stop_clean(efx_server_t *s, bool cli) {
  ck_assert_int_eq(efx_stop(s, cli), 0);
  ck_assert_int_eq(efx_shm_count(s), 0);
}

/* ---- batching -------------------------------------------------------------------- */

START_TEST(test_concurrent_same_as_alone) {
  need_model();
  load_refs(N_PROMPTS);
  efx_server_t s;
  ck_assert_int_eq(efx_start(&s, NULL), 0);
  efx_job_t alone;
  proto_submit_t r = efx_greedy(prompts[0], N_OUT);
  ck_assert_int_eq(efx_run_one(&s, &r, &alone), 0);
  check_ref(&alone, 0);
  static efx_job_t jobs[N_PROMPTS];
  run_batch(&s, N_PROMPTS, jobs);
  for (int i = 0; i < N_PROMPTS; i++) check_ref(&jobs[i], i);
  stop_clean(&s, false);
}
END_TEST

START_TEST(test_preemption_same_outputs) {
  need_model();
  load_refs(8);
  efx_server_t s;
  /* 6 blocks of 16 tokens (block size as the reference: attention's
   * online softmax goes block by block): 8 jobs of ~10 + 16 tokens need 2
   * blocks each */
  const char *extra[] = {"--num-kv-blocks", "6", "--max-num-batched-tokens", "64", "--no-enable-prefix-caching",
                         NULL};
  ck_assert_int_eq(efx_start(&s, extra), 0);
  static efx_job_t jobs[8];
  run_batch(&s, 8, jobs);
  for (int i = 0; i < 8; i++) check_ref(&jobs[i], i);
  proto_status_reply_t st;
  ck_assert_int_eq(efx_status(&s, &st), 0);
  ck_assert_msg(st.preemptions > 0, "no preemption happened");
  ck_assert_int_eq(st.kv_used_blocks, 0);
  stop_clean(&s, false);
}
END_TEST

static void wait_events(fr_client_t *c, uint64_t id, int n);

/* A prompt longer than the step budget is prefilled in chunks while other
 * jobs decode; every job still gets the generator's tokens. */
START_TEST(test_chunked_prefill_with_decodes) {
  need_model();
  load_refs(3);
  char long_prompt[2048] = "A list of fruits and their colors: ";
  for (int i = 0; i < 8; i++) strcat(long_prompt, "banana is yellow, cherry is red, grape is purple, lime is green, ");
  strcat(long_prompt, "and orange is");
  int32_t ref_long[N_OUT];
  ck_assert_int_eq(efx_reference(long_prompt, N_OUT, ref_long), N_OUT);
  efx_server_t s;
  const char *extra[] = {"--max-num-batched-tokens", "32", NULL};
  ck_assert_int_eq(efx_start(&s, extra), 0);
  fr_client_t *c = NULL;
  ck_assert_int_eq(fr_client_connect(&c, s.rpc), 0);
  efx_job_t jobs[4];
  memset(jobs, 0, sizeof jobs);
  for (int i = 0; i < 3; i++) {
    proto_submit_t r = efx_greedy(prompts[i], N_OUT);
    ck_assert_int_eq(fr_client_submit(c, &r, &jobs[i].id), 0);
  }
  wait_events(c, jobs[0].id, 1); /* decodes are running when the long prompt arrives */
  jobs[0].n_tokens = 0;
  proto_submit_t r = efx_greedy(long_prompt, N_OUT);
  ck_assert_int_eq(fr_client_submit(c, &r, &jobs[3].id), 0);
  ck_assert_int_eq(efx_collect(c, jobs, 4, 120000), 0);
  for (int i = 1; i < 3; i++) check_ref(&jobs[i], i);
  ck_assert_int_ge(jobs[3].usage.prompt_tokens, 100); /* > 3 chunks of 32 */
  ck_assert_int_eq(jobs[3].n_tokens, N_OUT);
  ck_assert_mem_eq(jobs[3].tokens, ref_long, sizeof ref_long);
  fr_client_close(c);
  stop_clean(&s, false);
}
END_TEST

/* One sequence at a time: waiting jobs start by priority, then in order of
 * arrival. */
START_TEST(test_priority_then_fifo) {
  need_model();
  efx_server_t s;
  const char *extra[] = {"--max-num-seqs", "1", NULL};
  ck_assert_int_eq(efx_start(&s, extra), 0);
  fr_client_t *c = NULL;
  ck_assert_int_eq(fr_client_connect(&c, s.rpc), 0);
  efx_job_t jobs[4];
  memset(jobs, 0, sizeof jobs);
  int32_t prio[4] = {0, 0, 5, 0}; /* job 0 runs first; then 2 (priority), 1, 3 */
  proto_submit_t r = efx_greedy(prompts[0], 6);
  ck_assert_int_eq(fr_client_submit(c, &r, &jobs[0].id), 0);
  wait_events(c, jobs[0].id, 1);
  for (int i = 1; i < 4; i++) {
    r.priority = prio[i];
    ck_assert_int_eq(fr_client_submit(c, &r, &jobs[i].id), 0);
  }
  int order[4], n_done = 0;
  while (n_done < 4) {
    proto_event_t ev;
    ck_assert_int_eq(fr_client_next_event(c, 60000, &ev), 0);
    for (int i = 0; i < 4; i++)
      if (ev.id == jobs[i].id && ev.finish != PROTO_FINISH_NONE) order[n_done++] = i;
  }
  ck_assert_int_eq(order[0], 0);
  ck_assert_int_eq(order[1], 2);
  ck_assert_int_eq(order[2], 1);
  ck_assert_int_eq(order[3], 3);
  fr_client_close(c);
  stop_clean(&s, false);
}
END_TEST

/* ---- prefix cache ----------------------------------------------------------------- */

START_TEST(test_prefix_cache_hit) {
  need_model();
  char prompt[4096] = "Here is a long story about a robot who learns to paint. ";
  for (int i = 0; i < 12; i++)
    strcat(prompt, "Every morning the robot walked to the hill, looked at the sky and mixed new colors. ");
  strcat(prompt, "In the end, the robot");
  efx_server_t s;
  ck_assert_int_eq(efx_start(&s, NULL), 0);
  efx_job_t a, b;
  proto_submit_t r = efx_greedy(prompt, 12);
  ck_assert_int_eq(efx_run_one(&s, &r, &a), 0);
  ck_assert_int_eq(a.usage.cached_tokens, 0);
  ck_assert_int_ge(a.usage.prompt_tokens, 200);
  ck_assert_int_eq(efx_run_one(&s, &r, &b), 0);
  ck_assert_int_ge(b.usage.cached_tokens, a.usage.prompt_tokens - 16);
  ck_assert_int_lt(b.usage.cached_tokens, a.usage.prompt_tokens);
  ck_assert_int_eq(a.n_tokens, 12);
  ck_assert_int_eq(b.n_tokens, 12);
  ck_assert_mem_eq(a.tokens, b.tokens, 12 * sizeof(int32_t));
  proto_status_reply_t st;
  ck_assert_int_eq(efx_status(&s, &st), 0);
  ck_assert_uint_eq(st.prefix_hits, b.usage.cached_tokens);
  ck_assert_uint_eq(st.prefix_queries, 2 * (uint64_t)a.usage.prompt_tokens);
  stop_clean(&s, true);
}
END_TEST

/* ---- cancel and disconnect ----------------------------------------------------------- */

static void wait_idle(const efx_server_t *s, uint32_t used) {
  proto_status_reply_t st = {0};
  for (int i = 0; i < 500; i++) {
    ck_assert_int_eq(efx_status(s, &st), 0);
    if (st.running == 0 && st.queued == 0 && st.kv_used_blocks == used) return;
    usleep(20000);
  }
  ck_abort_msg("not idle: running %u queued %u kv used %u (want %u)", st.running, st.queued, st.kv_used_blocks, used);
}

/* Waits until job id has produced at least n events on c. */
static void wait_events(fr_client_t *c, uint64_t id, int n) {
  for (int got = 0; got < n;) {
    proto_event_t ev;
    ck_assert_int_eq(fr_client_next_event(c, 60000, &ev), 0);
    if (ev.id == id) got++;
    ck_assert_msg(ev.finish == PROTO_FINISH_NONE, "job %llu (waiting for %llu) ended: %d %s", (unsigned long long)ev.id,
                  (unsigned long long)id, ev.finish, ev.error.message ? ev.error.message : "");
  }
}

START_TEST(test_cancel_and_disconnect_free_blocks) {
  need_model();
  efx_server_t s;
  ck_assert_int_eq(efx_start(&s, NULL), 0);
  proto_status_reply_t st;
  ck_assert_int_eq(efx_status(&s, &st), 0);
  uint32_t base = st.kv_used_blocks;
  ck_assert_int_eq(base, 0);
  /* cancel mid-stream: the last event says "cancel" */
  fr_client_t *c = NULL;
  ck_assert_int_eq(fr_client_connect(&c, s.rpc), 0);
  proto_submit_t r = efx_greedy(prompts[1], 400);
  uint64_t id;
  ck_assert_int_eq(fr_client_submit(c, &r, &id), 0);
  wait_events(c, id, 3);
  ck_assert_int_eq(efx_status(&s, &st), 0);
  ck_assert_int_gt(st.kv_used_blocks, 0);
  ck_assert_int_eq(fr_client_cancel(c, id), 0);
  efx_job_t j = {.id = id};
  ck_assert_int_eq(efx_collect(c, &j, 1, 30000), 0);
  ck_assert_int_eq(j.finish, PROTO_FINISH_CANCEL);
  wait_idle(&s, base);
  /* cancels racing steps: sent right after submit, after 1 event, ... */
  for (int k = 0; k < 6; k++) {
    ck_assert_int_eq(fr_client_submit(c, &r, &id), 0);
    if (k) wait_events(c, id, k);
    ck_assert_int_eq(fr_client_cancel(c, id), 0);
    efx_job_t jj = {.id = id};
    ck_assert_int_eq(efx_collect(c, &jj, 1, 30000), 0);
    ck_assert(jj.finish == PROTO_FINISH_CANCEL || jj.finish == PROTO_FINISH_LENGTH);
  }
  wait_idle(&s, base);
  /* disconnect mid-stream: two clients close with jobs running */
  for (int k = 0; k < 2; k++) {
    fr_client_t *d = NULL;
    ck_assert_int_eq(fr_client_connect(&d, s.rpc), 0);
    ck_assert_int_eq(fr_client_submit(d, &r, &id), 0);
    wait_events(d, id, 2);
    fr_client_close(d);
  }
  wait_idle(&s, base);
  /* a client that disconnects while its job is not streaming: noticed at
   * once (the connection closed), not when the job would have ended */
  {
    fr_client_t *d = NULL;
    ck_assert_int_eq(fr_client_connect(&d, s.rpc), 0);
    proto_submit_t quiet = efx_greedy(prompts[1], 4000);
    quiet.stream = false;
    ck_assert_int_eq(fr_client_submit(d, &quiet, &id), 0);
    for (int i = 0; i < 500; i++) {
      ck_assert_int_eq(efx_status(&s, &st), 0);
      if (st.running == 1 && st.kv_used_blocks > 0) break;
      usleep(10000);
    }
    ck_assert_int_eq(st.running, 1);
    uint64_t t0 = fr_now_ns();
    fr_client_close(d);
    wait_idle(&s, base);
    ck_assert_msg(fr_now_ns() - t0 < 3000000000ull, "disconnect noticed late");
  }
  /* the allocator's invariants hold, read from the control segment */
  kv_ctl_t *ctl = NULL;
  ck_assert_int_eq(kv_control_attach(&ctl, s.instance), 0);
  ck_assert_int_eq(kv_control_verify(ctl), 0);
  ck_assert_int_eq(kv_blocks_free_count(ctl), (int)st.kv_total_blocks);
  kv_control_destroy(ctl);
  fr_client_close(c);
  stop_clean(&s, false);
}
END_TEST

/* ---- worker crash ----------------------------------------------------------------------- */

START_TEST(test_worker_killed_restarts_and_recomputes) {
  need_model();
  load_refs(4);
  efx_server_t s;
  ck_assert_int_eq(efx_start(&s, NULL), 0);
  char cached[2048] = "Notes: ";
  for (int i = 0; i < 6; i++) strcat(cached, "the cache keeps blocks of sixteen tokens each, in shared memory. ");
  efx_job_t before, after;
  proto_submit_t cr = efx_greedy(cached, 8);
  ck_assert_int_eq(efx_run_one(&s, &cr, &before), 0);
  fr_client_t *c = NULL;
  ck_assert_int_eq(fr_client_connect(&c, s.rpc), 0);
  efx_job_t jobs[4];
  memset(jobs, 0, sizeof jobs);
  for (int i = 0; i < 4; i++) {
    proto_submit_t r = efx_greedy(prompts[i], N_OUT);
    ck_assert_int_eq(fr_client_submit(c, &r, &jobs[i].id), 0);
  }
  /* wait for a few tokens, then kill the worker */
  proto_event_t ev;
  for (int got = 0; got < 6;) {
    ck_assert_int_eq(fr_client_next_event(c, 60000, &ev), 0);
    for (int i = 0; i < 4; i++)
      if (jobs[i].id == ev.id) {
        for (uint32_t t = 0; t < ev.n_tokens; t++) jobs[i].tokens[jobs[i].n_tokens++] = ev.tokens[t];
        got++;
      }
    ck_assert_int_eq(ev.finish, PROTO_FINISH_NONE);
  }
  pid_t w[4];
  ck_assert_int_eq(efx_worker_pids(&s, w, 4), 1);
  uint64_t t0 = fr_now_ns();
  ck_assert_int_eq(kill(w[0], SIGKILL), 0);
  proto_status_reply_t st = {0};
  while (st.worker_restarts == 0) {
    ck_assert_msg(fr_now_ns() - t0 < 2000000000ull, "worker death not detected within 2 s");
    ck_assert_int_eq(efx_status(&s, &st), 0);
    usleep(10000);
  }
  ck_assert_int_eq(efx_collect(c, jobs, 4, 120000), 0);
  for (int i = 0; i < 4; i++) check_ref(&jobs[i], i);
  pid_t w2[4];
  ck_assert_int_eq(efx_worker_pids(&s, w2, 4), 1);
  ck_assert_int_ne(w2[0], w[0]);
  /* the KV pool outlived the worker: cached blocks are still right */
  ck_assert_int_eq(efx_run_one(&s, &cr, &after), 0);
  ck_assert_int_ge(after.usage.cached_tokens, 64);
  ck_assert_int_eq(after.n_tokens, 8);
  ck_assert_mem_eq(after.tokens, before.tokens, 8 * sizeof(int32_t));
  fr_client_close(c);
  stop_clean(&s, false);
}
END_TEST

/* ---- drain ------------------------------------------------------------------------------- */

static void drain_case(bool cli) {
  need_model();
  efx_server_t s;
  ck_assert_int_eq(efx_start(&s, NULL), 0);
  fr_client_t *c = NULL;
  ck_assert_int_eq(fr_client_connect(&c, s.rpc), 0);
  efx_job_t j = {0};
  proto_submit_t r = efx_greedy(prompts[2], 48);
  ck_assert_int_eq(fr_client_submit(c, &r, &j.id), 0);
  wait_events(c, j.id, 2);
  j.n_tokens = 0;
  pid_t stopper = 0;
  if (cli) {
    stopper = fork();
    if (stopper == 0) {
      setenv("XDG_RUNTIME_DIR", s.dir, 1);
      execl(efx_bin("ferrumctl"), "ferrumctl", "stop", "--rpc", s.rpc, (char *)NULL);
      _exit(127);
    }
  } else {
    kill(s.pid, SIGTERM);
  }
  /* new jobs are refused while the running one finishes */
  proto_status_reply_t st = {0};
  for (int i = 0; i < 200 && !st.draining; i++) efx_status(&s, &st), usleep(10000);
  ck_assert(st.draining);
  fr_client_t *c2 = NULL;
  ck_assert_int_eq(fr_client_connect(&c2, s.rpc), 0);
  efx_job_t k = {0};
  ck_assert_int_eq(fr_client_submit(c2, &r, &k.id), 0);
  ck_assert_int_eq(efx_collect(c2, &k, 1, 10000), 0);
  ck_assert_int_eq(k.finish, PROTO_FINISH_ERROR);
  ck_assert_int_eq(k.error, PROTO_ERR_UNAVAILABLE);
  fr_client_close(c2);
  ck_assert_int_eq(efx_collect(c, &j, 1, 60000), 0);
  ck_assert_int_eq(j.finish, PROTO_FINISH_LENGTH);
  fr_client_close(c);
  int status = 0;
  if (cli) {
    waitpid(stopper, &status, 0);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  stop_clean(&s, false); /* reaps the server: exit status 0 */
}

START_TEST(test_sigterm_drains) { drain_case(false); }
END_TEST

START_TEST(test_ferrumctl_stop_drains) { drain_case(true); }
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

START_TEST(test_bad_rpc_input) {
  need_model();
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
  static const uint8_t bad_sp[] = {0x85, 0xa1, 'v', 0x01, 0xa1, 't', 0xa6, 's', 'u', 'b', 'm', 'i', 't',
                                   0xa2, 'i', 'd', 0x05, 0xa1, 'p', 0xa2, 'h', 'i',
                                   0xa2, 's', 'p', 0x81, 0xa1, 't', 0xff};
  uint8_t msg[64];
  memcpy(msg, bad_sp, sizeof bad_sp);
  ck_assert_int_eq(raw_call(sock, msg, sizeof bad_sp, false, &m), PROTO_T_ERROR);
  ck_assert_int_eq(m.u.error.code, PROTO_ERR_BAD_REQUEST);
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
  proto_submit_t lr = efx_greedy(prompts[1], 64);
  ck_assert_int_eq(fr_client_submit(c, &lr, &q[0].id), 0);
  wait_events(c, q[0].id, 1); /* running */
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
  /* still healthy: a normal job runs */
  efx_job_t j;
  proto_submit_t ok = efx_greedy(prompts[0], 4);
  ck_assert_int_eq(efx_run_one(&s, &ok, &j), 0);
  ck_assert_int_eq(j.finish, PROTO_FINISH_LENGTH);
  ck_assert_int_eq(j.n_tokens, 4);
  stop_clean(&s, false);
}
END_TEST

/* ---- sampling and stop rules ---------------------------------------------------------------- */

START_TEST(test_seed_and_stop_strings) {
  need_model();
  efx_server_t s;
  ck_assert_int_eq(efx_start(&s, NULL), 0);
  /* same seed -> same tokens, alone or in a batch with other jobs */
  proto_submit_t r = efx_greedy(prompts[1], 12);
  r.sp.temperature = 1.0f, r.sp.top_k = 40, r.sp.seed = 1234, r.sp.has_seed = true;
  efx_job_t a, b[3];
  ck_assert_int_eq(efx_run_one(&s, &r, &a), 0);
  fr_client_t *c = NULL;
  ck_assert_int_eq(fr_client_connect(&c, s.rpc), 0);
  memset(b, 0, sizeof b);
  proto_submit_t o1 = efx_greedy(prompts[3], 12), o2 = efx_greedy(prompts[4], 12);
  ck_assert_int_eq(fr_client_submit(c, &o1, &b[0].id), 0);
  ck_assert_int_eq(fr_client_submit(c, &r, &b[1].id), 0);
  ck_assert_int_eq(fr_client_submit(c, &o2, &b[2].id), 0);
  ck_assert_int_eq(efx_collect(c, b, 3, 60000), 0);
  ck_assert_int_eq(b[1].n_tokens, 12);
  ck_assert_mem_eq(a.tokens, b[1].tokens, 12 * sizeof(int32_t));
  fr_client_close(c);
  /* stop string: the text ends before it, finish "stop" */
  proto_submit_t g = efx_greedy(prompts[15], 40);
  efx_job_t full, cut;
  ck_assert_int_eq(efx_run_one(&s, &g, &full), 0);
  ck_assert_int_gt(full.text_len, 6);
  char stop[8] = {0};
  memcpy(stop, full.text + 3, 3); /* a stop string that starts at byte 3 */
  char *stops[] = {stop};
  g.stop = stops, g.n_stop = 1;
  ck_assert_int_eq(efx_run_one(&s, &g, &cut), 0);
  ck_assert_int_eq(cut.finish, PROTO_FINISH_STOP);
  const char *at = strstr(full.text, stop);
  ck_assert_ptr_nonnull(at);
  ck_assert_int_eq(cut.text_len, (size_t)(at - full.text));
  ck_assert_mem_eq(cut.text, full.text, cut.text_len);
  /* stop token id: the generation ends at its first occurrence */
  g.n_stop = 0;
  int32_t sid = full.tokens[5];
  g.stop_ids = &sid, g.n_stop_ids = 1;
  ck_assert_int_eq(efx_run_one(&s, &g, &cut), 0);
  ck_assert_int_eq(cut.finish, PROTO_FINISH_STOP);
  int first = 0;
  while (full.tokens[first] != sid) first++;
  ck_assert_int_eq(cut.n_tokens, first + 1);
  stop_clean(&s, false);
}
END_TEST

/* ---- chat messages ------------------------------------------------------------------------ */

START_TEST(test_chat_messages_match_generator) {
  need_model();
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
    model_chat_msg_t msgs[2] = {{"system", "You answer in one short sentence."}, {"user", q}};
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
  stop_clean(&s, false);
}
END_TEST

/* ---- logprobs and logits ------------------------------------------------------------------- */

START_TEST(test_logprobs_and_logits) {
  need_model();
  load_refs(1);
  efx_server_t s;
  ck_assert_int_eq(efx_start(&s, NULL), 0);
  fr_client_t *c = NULL;
  ck_assert_int_eq(fr_client_connect(&c, s.rpc), 0);
  proto_submit_t r = efx_greedy(prompts[0], 4);
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
      ck_assert_int_eq(ev.tokens[t], refs[0][n]);
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
    ck_assert_int_eq(best, refs[0][t]);
  }
  fr_client_close(c);
  stop_clean(&s, false);
}
END_TEST

/* ---- KV pool sized from a memory budget ---------------------------------------------------- */

/* Bytes of one KV block of the model: K and V of every layer, f16 (the CPU
 * worker's pool), worked out from the file's config, not the engine's code. */
static uint64_t kv_block_bytes(int block_size) {
  model_source_t *src = NULL;
  ck_assert_int_eq(model_source_open(&src, efx_model()), 0);
  uint64_t b = 2ull * (uint64_t)src->config.n_layers * (uint64_t)src->config.n_kv_heads *
               (uint64_t)src->config.head_dim * (uint64_t)block_size * 2;
  model_source_close(src);
  return b;
}

/* Kills every worker of s and waits until they are all back (restarted
 * with the block count fixed at start-up). */
static void kill_workers_and_wait(efx_server_t *s, int n) {
  pid_t w[8];
  ck_assert_int_eq(efx_worker_pids(s, w, 8), n);
  for (int i = 0; i < n; i++) ck_assert_int_eq(kill(w[i], SIGKILL), 0);
  uint64_t t0 = fr_now_ns();
  proto_status_reply_t st = {0};
  while (st.worker_restarts == 0 || st.n_workers != (uint32_t)n) {
    ck_assert_msg(fr_now_ns() - t0 < 60000000000ull, "workers not back within 60 s");
    usleep(20000);
    ck_assert_int_eq(efx_status(s, &st), 0);
  }
}

/* --kv-cache-memory-bytes on the CPU, two workers: each reports the blocks
 * that fit the budget, the pool gets that many; requests give the reference
 * tokens, also after the workers were restarted with the fixed count. */
START_TEST(test_kv_cache_memory_bytes) {
  need_model();
  load_refs(3);
  const uint64_t budget = 48ull << 20, bpb = kv_block_bytes(16);
  efx_server_t s;
  const char *extra[] = {"--kv-cache-memory-bytes", "48M", "--tensor-parallel-size", "2",
                         "--max-num-batched-tokens", "64", NULL};
  ck_assert_int_eq(efx_start(&s, extra), 0);
  proto_status_reply_t st;
  ck_assert_int_eq(efx_status(&s, &st), 0);
  ck_assert_uint_eq(st.kv_total_blocks, budget / bpb);
  ck_assert_uint_eq(st.n_workers, 2);
  static efx_job_t jobs[3];
  run_batch(&s, 2, jobs);
  for (int i = 0; i < 2; i++) check_ref(&jobs[i], i);
  kill_workers_and_wait(&s, 2);
  ck_assert_int_eq(efx_status(&s, &st), 0);
  ck_assert_uint_eq(st.kv_total_blocks, budget / bpb);
  efx_job_t one;
  proto_submit_t r = efx_greedy(prompts[2], N_OUT);
  ck_assert_int_eq(efx_run_one(&s, &r, &one), 0);
  check_ref(&one, 2);
  stop_clean(&s, false);
}
END_TEST

/* Starts a server that must fail to start; returns its log (static). */
static const char *start_fails(const char *const *extra) {
  static char log[16384];
  efx_server_t s;
  ck_assert_int_eq(efx_start(&s, extra), -1);
  ck_assert_int_eq(s.exit_status, 1); /* an error, not a crash (signal) or a usage error (2) */
  FILE *f = fopen(s.err_path, "r");
  ck_assert_ptr_nonnull(f);
  size_t n = fread(log, 1, sizeof log - 1, f);
  fclose(f);
  log[n] = 0;
  /* nothing left in shared memory: the instance is in the log */
  const char *p = strstr(log, "instance ");
  char inst[64] = "";
  ck_assert_ptr_nonnull(p);
  ck_assert_int_eq(sscanf(p, "instance %63[^:]", inst), 1);
  snprintf(s.instance, sizeof s.instance, "%s", inst);
  ck_assert_int_eq(efx_shm_count(&s), 0);
  efx_cleanup(&s);
  return log;
}

/* Exit code of `ferrumctl serve --no-http OPT VALUE` on a model that does
 * not exist (2: usage error; a value that is taken fails later, with 1). */
static int serve_exit(const char *opt, const char *value) {
  pid_t p = fork();
  if (p == 0) {
    int fd = open("/dev/null", O_WRONLY);
    if (fd >= 0) dup2(fd, 2), dup2(fd, 1);
    execl(efx_bin("ferrumctl"), "ferrumctl", "serve", "--no-http", "--model", "/nonexistent/m.gguf", opt, value,
          (char *)NULL);
    _exit(127);
  }
  int st = 0;
  waitpid(p, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Budgets that cannot hold the minimum fail the start with a message that
 * says what was needed and what there is; values that are no budget are
 * usage errors. */
START_TEST(test_kv_budget_too_small) {
  need_model();
  const char *bad_bytes[] = {"12x", "1.5", "0", "-1G", "4GiB", "G", "", "1e30"};
  for (size_t i = 0; i < sizeof bad_bytes / sizeof bad_bytes[0]; i++)
    ck_assert_msg(serve_exit("--kv-cache-memory-bytes", bad_bytes[i]) == 2, "'%s' taken", bad_bytes[i]);
  const char *bad_util[] = {"0", "1.01", "-0.5", "nan", "x"};
  for (size_t i = 0; i < sizeof bad_util / sizeof bad_util[0]; i++)
    ck_assert_msg(serve_exit("--gpu-memory-utilization", bad_util[i]) == 2, "'%s' taken", bad_util[i]);
  ck_assert_int_eq(serve_exit("--kv-cache-memory-bytes", "1.5g"), 1); /* taken: fails on the model */
  ck_assert_int_eq(serve_exit("--gpu-memory-utilization", "1"), 1);
  const uint64_t bpb = kv_block_bytes(16);
  char need[128], mib[64];
  /* one sequence of an explicit --max-model-len (4096 tokens: 256 blocks) must fit */
  const char *a[] = {"--kv-cache-memory-bytes", "16M", "--max-model-len", "4096", NULL};
  const char *log = start_fails(a);
  snprintf(need, sizeof need, "needs at least 256 block(s) of 16 tokens (%.1f MiB", 256.0 * bpb / 1048576.0);
  ck_assert_msg(strstr(log, need), "no '%s' in:\n%s", need, log);
  snprintf(mib, sizeof mib, "only 16.0 MiB (%llu blocks)", (unsigned long long)((16ull << 20) / bpb));
  ck_assert_msg(strstr(log, mib), "no '%s' in:\n%s", mib, log);
  ck_assert_ptr_nonnull(strstr(log, "ferrumctl serve: worker 0:"));
  /* less than one block */
  char tiny[32];
  snprintf(tiny, sizeof tiny, "%llu", (unsigned long long)bpb - 1);
  const char *b[] = {"--kv-cache-memory-bytes", tiny, NULL};
  log = start_fails(b);
  ck_assert_msg(strstr(log, "needs at least 1 block(s)") && strstr(log, "(0 blocks) are available"), "%s", log);
  /* the CPU reports no memory size: a fraction of it is refused, clearly */
  const char *c[] = {"--gpu-memory-utilization", "0.5", NULL};
  log = start_fails(c);
  ck_assert_msg(strstr(log, "--gpu-memory-utilization needs a device that reports its memory"), "%s", log);
}
END_TEST

/* ENGINE_TEST=<name> runs one test (for debugging). */
#define ADD(t, fn)                                                                 \
  do {                                                                             \
    const char *only = getenv("ENGINE_TEST");                                      \
    if (!only || !strcmp(only, #fn)) tcase_add_test(t, fn);                        \
  } while (0)

static Suite *engine_suite(void) {
  Suite *s = suite_create("engine");
  TCase *t = tcase_create("e2e");
  tcase_set_timeout(t, 240);
  ADD(t, test_concurrent_same_as_alone);
  ADD(t, test_preemption_same_outputs);
  ADD(t, test_chunked_prefill_with_decodes);
  ADD(t, test_priority_then_fifo);
  ADD(t, test_prefix_cache_hit);
  ADD(t, test_cancel_and_disconnect_free_blocks);
  ADD(t, test_worker_killed_restarts_and_recomputes);
  ADD(t, test_sigterm_drains);
  ADD(t, test_ferrumctl_stop_drains);
  ADD(t, test_bad_rpc_input);
  ADD(t, test_seed_and_stop_strings);
  ADD(t, test_logprobs_and_logits);
  ADD(t, test_chat_messages_match_generator);
  ADD(t, test_kv_cache_memory_bytes);
  ADD(t, test_kv_budget_too_small);
  suite_add_tcase(s, t);
  return s;
}

/* The shared main (tests/common/test_main.c) runs this program's suites. */
#include "tests/common/test_main.h"

static int engine_setup(int argc, char **argv) {
  if (access(efx_model(), R_OK) != 0) {
    fprintf(stderr, "skip: no model at %s\n", efx_model());
    return TEST_SKIP;
  }
  return 0;
}

const test_prog_t test_prog = {.suites = {engine_suite}, .setup = engine_setup};
