/* test_engine.c - the engine end to end: real `ferrumctl serve` processes
 * (coordinator + ferrum-worker) with the real SmolLM2 model, driven over
 * RPC (fr_client, and raw ZeroMQ for malformed input).
 *
 * Reference for the tokens: the in-process single-sequence generator
 * (model/generate.h), itself checked against llama.cpp by test_generate. */
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

/* Waits until the server has restarted its worker `restarts` times in all
 * and is ready again (a worker registered and loaded). */
static void wait_restarted(const efx_server_t *s, uint32_t restarts, uint64_t limit_ns) {
  uint64_t t0 = fr_now_ns();
  proto_status_reply_t st = {0};
  for (;;) {
    ck_assert_int_eq(efx_status(s, &st), 0);
    if (st.worker_restarts >= restarts && st.n_workers == 1) return;
    ck_assert_msg(fr_now_ns() - t0 < limit_ns, "restart %u not done in %.0f s (at %u)", restarts, limit_ns / 1e9,
                  st.worker_restarts);
    usleep(20000);
  }
}

/* Restarts are limited by rate, not by count: 25 deaths (more than the old
 * lifetime cap of 20) leave the server up, and a job that was running all
 * along still finishes with the reference tokens. */
START_TEST(test_worker_deaths_never_stop_the_server) {
  need_model();
  load_refs(1);
  efx_server_t s;
  const char *extra[] = {"--restart-backoff-max", "300", NULL};
  ck_assert_int_eq(efx_start(&s, extra), 0);
  fr_client_t *c = NULL;
  ck_assert_int_eq(fr_client_connect(&c, s.rpc), 0);
  efx_job_t j = {0};
  proto_submit_t r = efx_greedy(prompts[0], N_OUT);
  ck_assert_int_eq(fr_client_submit(c, &r, &j.id), 0);
  for (uint32_t k = 1; k <= 25; k++) {
    pid_t w[4];
    ck_assert_int_eq(efx_worker_pids(&s, w, 4), 1);
    ck_assert_int_eq(kill(w[0], SIGKILL), 0);
    wait_restarted(&s, k, 30000000000ull);
  }
  ck_assert_int_eq(waitpid(s.pid, NULL, WNOHANG), 0); /* serve is still running */
  ck_assert_int_eq(efx_collect(c, &j, 1, 120000), 0);
  check_ref(&j, 0);
  fr_client_close(c);
  stop_clean(&s, false);
}
END_TEST

/* A worker that stops answering in the middle of a step (SIGSTOP) is taken
 * for hung after a few seconds, not minutes: it is killed and restarted, and
 * the streams go on to the reference tokens. */
START_TEST(test_hung_worker_is_restarted) {
  need_model();
  load_refs(2);
  efx_server_t s;
  ck_assert_int_eq(efx_start(&s, NULL), 0);
  fr_client_t *c = NULL;
  ck_assert_int_eq(fr_client_connect(&c, s.rpc), 0);
  efx_job_t jobs[2];
  memset(jobs, 0, sizeof jobs);
  for (int i = 0; i < 2; i++) {
    proto_submit_t r = efx_greedy(prompts[i], N_OUT);
    ck_assert_int_eq(fr_client_submit(c, &r, &jobs[i].id), 0);
  }
  proto_event_t ev;
  for (int got = 0; got < 2;) { /* both are decoding */
    ck_assert_int_eq(fr_client_next_event(c, 60000, &ev), 0);
    for (int i = 0; i < 2; i++)
      if (jobs[i].id == ev.id) {
        for (uint32_t t = 0; t < ev.n_tokens; t++) jobs[i].tokens[jobs[i].n_tokens++] = ev.tokens[t];
        got++;
      }
  }
  pid_t w[4];
  ck_assert_int_eq(efx_worker_pids(&s, w, 4), 1);
  uint64_t t0 = fr_now_ns();
  ck_assert_int_eq(kill(w[0], SIGSTOP), 0);
  wait_restarted(&s, 1, 20000000000ull);
  double noticed_s = (fr_now_ns() - t0) / 1e9;
  fprintf(stderr, "hung worker replaced after %.1f s\n", noticed_s);
  ck_assert_msg(noticed_s < 15, "hung worker noticed after %.1f s", noticed_s);
  ck_assert_int_eq(efx_collect(c, jobs, 2, 120000), 0);
  for (int i = 0; i < 2; i++) check_ref(&jobs[i], i);
  fr_client_close(c);
  stop_clean(&s, false);
}
END_TEST

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
  need_model();
  efx_server_t s;
  ck_assert_int_eq(efx_start(&s, NULL), 0);
  fr_client_t *c = NULL;
  ck_assert_int_eq(fr_client_connect(&c, s.rpc), 0);
  efx_job_t j = {0};
  proto_submit_t r = efx_greedy(prompts[1], 400);
  ck_assert_int_eq(fr_client_submit(c, &r, &j.id), 0);
  wait_events(c, j.id, 2);
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
  for (int i = 1; i < n_at; i++)
    if (at[i] > big.t_sent_ns && at[i - 1] < big.t_done_ns) max_gap = FR_MAX(max_gap, at[i] - at[i - 1]);
  double tok_s = (big.t_done_ns - big.t_sent_ns) / 1e9, gap_s = max_gap / 1e9;
  fprintf(stderr, "500 kB prompt answered after %.2f s; longest stream gap meanwhile %.3f s\n", tok_s, gap_s);
  ck_assert_int_eq(big.job.error, PROTO_ERR_TOO_BIG); /* more tokens than the context */
  ck_assert_msg(tok_s > 0.1, "tokenizing took %.2f s: too short to tell", tok_s);
  ck_assert_msg(gap_s < tok_s / 2, "a stream stalled %.3f s while a prompt was tokenized for %.2f s", gap_s, tok_s);
  /* 4 MB: refused before tokenizing */
  big_prompt_t huge = {.s = &s, .bytes = 4000000};
  big_prompt_thread(&huge);
  ck_assert_int_eq(huge.job.error, PROTO_ERR_TOO_BIG);
  ck_assert_msg((huge.t_done_ns - huge.t_sent_ns) / 1e9 < tok_s, "4 MB prompt not refused fast");
  fr_client_close(c);
  stop_clean(&s, false);
}
END_TEST

/* ---- non-finite logits -------------------------------------------------------------------- */

#define NAN_TOKEN 500

/* A copy of the tiny llama (F32, untied output; tests/golden) whose
 * embedding row NAN_TOKEN is NaN: a sequence holding that token gets NaN
 * logits, the others are untouched. Returns the copy's path (static). */
static const char *nan_model(void) {
  static char dst[512];
  char src[512];
  snprintf(src, sizeof src, "%s/golden/tiny-llama.gguf", getenv("FERRUM_BUILD_DIR"));
  snprintf(dst, sizeof dst, "/tmp/ferrum-nan-%d.gguf", (int)getpid());
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "cp '%s' '%s'", src, dst);
  ck_assert_msg(system(cmd) == 0, "no %s (the golden_models fixture makes it)", src);
  model_gguf_t *g = NULL;
  ck_assert_int_eq(model_gguf_open(&g, dst), 0);
  uint64_t at = 0, row_bytes = 0;
  for (uint64_t i = 0; i < g->n_tensors; i++) {
    const gguf_tensor_t *t = &g->tensors[i];
    if (t->name.len != 17 || memcmp(t->name.ptr, "token_embd.weight", 17)) continue;
    ck_assert_int_eq(t->type, KERN_F32);
    row_bytes = (uint64_t)t->ne[0] * sizeof(float);
    at = g->data_offset + t->offset + NAN_TOKEN * row_bytes;
  }
  model_gguf_close(g);
  ck_assert_uint_gt(row_bytes, 0);
  float *nan_row = malloc(row_bytes);
  for (uint64_t i = 0; i < row_bytes / sizeof(float); i++) nan_row[i] = NAN;
  int fd = open(dst, O_WRONLY);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(pwrite(fd, nan_row, row_bytes, (off_t)at), (ssize_t)row_bytes);
  close(fd);
  free(nan_row);
  return dst;
}

static proto_submit_t ids_request(const int32_t *ids, uint32_t n, uint32_t max_tokens) {
  proto_submit_t r = efx_greedy(NULL, max_tokens);
  r.prompt = NULL;
  r.tokens = (int32_t *)ids;
  r.n_tokens = n;
  return r;
}

/* NaN logits end that request alone, with an error; a request in the same
 * steps gets the tokens it gets alone. */
START_TEST(test_nonfinite_logits_fail_one_request) {
  need_model();
  const char *model = nan_model();
  efx_server_t s;
  efx_opts_t o = {.model = model};
  ck_assert_int_eq(efx_start_opts(&s, &o, NULL), 0);
  static const int32_t poisoned[] = {1, 9690, NAN_TOKEN, 2683, 253};
  static const int32_t clean[] = {1, 504, 3458, 282, 4649, 314};
  efx_job_t alone = {0}, jobs[2];
  memset(jobs, 0, sizeof jobs);
  proto_submit_t rb = ids_request(clean, 6, 12);
  ck_assert_int_eq(efx_run_one(&s, &rb, &alone), 0);
  ck_assert_int_eq(alone.finish, PROTO_FINISH_LENGTH);
  fr_client_t *c = NULL;
  ck_assert_int_eq(fr_client_connect(&c, s.rpc), 0);
  proto_submit_t ra = ids_request(poisoned, 5, 12);
  ck_assert_int_eq(fr_client_submit(c, &ra, &jobs[0].id), 0);
  ck_assert_int_eq(fr_client_submit(c, &rb, &jobs[1].id), 0);
  ck_assert_int_eq(efx_collect(c, jobs, 2, 60000), 0);
  ck_assert_int_eq(jobs[0].finish, PROTO_FINISH_ERROR);
  ck_assert_int_eq(jobs[0].error, PROTO_ERR_INTERNAL);
  ck_assert_int_eq(jobs[1].finish, PROTO_FINISH_LENGTH);
  ck_assert_int_eq(jobs[1].n_tokens, alone.n_tokens);
  ck_assert_mem_eq(jobs[1].tokens, alone.tokens, (size_t)alone.n_tokens * sizeof(int32_t));
  fr_client_close(c);
  stop_clean(&s, false);
  unlink(model);
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

/* Waits (up to 10 s) until the server's log holds text. */
static bool log_has(const efx_server_t *s, const char *text) {
  static char log[65536];
  for (int i = 0; i < 200; i++) {
    FILE *f = fopen(s->err_path, "r");
    size_t n = f ? fread(log, 1, sizeof log - 1, f) : 0;
    if (f) fclose(f);
    log[n] = 0;
    if (strstr(log, text)) return true;
    usleep(50000);
  }
  return false;
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
  ck_assert_msg(log_has(s, "hello from rank 0 of 2 ignored"), "no world-size refusal in %s", s->err_path);
  h.world_size = 1;
  ck_assert_int_eq(proto_encode(&b, PROTO_T_HELLO, &h), 0);
  ck_assert_int_eq(zmq_send(sock, b.data, b.len, 0), (int)b.len);
  ck_assert_msg(log_has(s, "unexpected hello from rank 0"), "no refusal in %s", s->err_path);
  proto_buf_free(&b);
  zmq_close(sock);
  zmq_ctx_term(ctx);
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
  stray_hellos(&s);
  /* still healthy: a normal job runs */
  efx_job_t j;
  proto_submit_t ok = efx_greedy(prompts[0], 4);
  ck_assert_int_eq(efx_run_one(&s, &ok, &j), 0);
  ck_assert_int_eq(j.finish, PROTO_FINISH_LENGTH);
  ck_assert_int_eq(j.n_tokens, 4);
  stop_clean(&s, false);
}
END_TEST

/* ---- paths and finding the server ------------------------------------------------------------ */

/* The HTTP line of the server's pid file ("" when none). */
static void pidfile_http(const efx_server_t *s, char *url, size_t cap) {
  char path[600], line[600];
  snprintf(path, sizeof path, "%s/ferrum", s->dir);
  DIR *d = opendir(path);
  ck_assert_ptr_nonnull(d);
  url[0] = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (!strncmp(e->d_name, "server-", 7) && strstr(e->d_name, ".pid")) {
      snprintf(path, sizeof path, "%s/ferrum/%s", s->dir, e->d_name);
      FILE *f = fopen(path, "r");
      for (int i = 0; f && i < 4 && fgets(line, sizeof line, f); i++)
        if (i == 3) snprintf(url, cap, "%.*s", (int)strcspn(line, "\n"), line);
      if (f) fclose(f);
    }
  closedir(d);
}

/* Runs `ferrumctl chat ARGS...` from / with the server's runtime folder and
 * one user line on stdin; returns its exit code (-1: killed after 120 s),
 * its stdout in out. */
static int run_chat(const efx_server_t *s, const char *const *args, char *out, size_t cap) {
  char in_path[400], out_path[400], exe[4096];
  snprintf(in_path, sizeof in_path, "%s/chat.in", s->dir);
  snprintf(out_path, sizeof out_path, "%s/chat.out", s->dir);
  FILE *f = fopen(in_path, "w");
  ck_assert_ptr_nonnull(f);
  fputs("Say hello.\n", f);
  fclose(f);
  ck_assert_ptr_nonnull(realpath(efx_bin("ferrumctl"), exe));
  pid_t pid = fork();
  if (pid == 0) {
    const char *argv[16] = {exe, "chat"};
    int n = 2;
    for (int i = 0; args[i] && n < 15; i++) argv[n++] = args[i];
    argv[n] = NULL;
    int in = open(in_path, O_RDONLY), o = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (in < 0 || o < 0 || dup2(in, 0) < 0 || dup2(o, 1) < 0 || chdir("/") != 0) _exit(126);
    setenv("XDG_RUNTIME_DIR", s->dir, 1);
    execv(exe, (char *const *)argv);
    _exit(127);
  }
  int st = 0;
  uint64_t deadline = fr_now_ns() + 120ull * 1000000000ull;
  while (waitpid(pid, &st, WNOHANG) == 0) {
    if (fr_now_ns() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      return -1;
    }
    usleep(20000);
  }
  f = fopen(out_path, "r");
  size_t len = f ? fread(out, 1, cap - 1, f) : 0;
  if (f) fclose(f);
  out[len] = 0;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A Hugging Face folder for --load-format dummy: a one-layer llama
 * config.json and a byte-level BPE tokenizer.json (the 256 byte tokens and
 * one special, the EOS). */
static void write_dummy_folder(const char *dir) {
  char path[512];
  ck_assert_int_eq(mkdir(dir, 0700), 0);
  snprintf(path, sizeof path, "%s/config.json", dir);
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fputs("{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 64, "
        "\"intermediate_size\": 128, \"num_hidden_layers\": 1, \"num_attention_heads\": 2, "
        "\"num_key_value_heads\": 1, \"head_dim\": 32, \"vocab_size\": 257, \"max_position_embeddings\": 256, "
        "\"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0, \"tie_word_embeddings\": true, \"hidden_act\": \"silu\", "
        "\"bos_token_id\": 256, \"eos_token_id\": 256}\n", f);
  ck_assert_int_eq(fclose(f), 0);
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fputs("{\"model\": {\"type\": \"BPE\", \"merges\": [], \"vocab\": {", f);
  for (int b = 0; b < 256; b++) {
    char u[8] = {0};
    tok__utf8_put(tok__byte_to_cp((uint8_t)b), u);
    fprintf(f, "%s\"%s%s\": %d", b ? ", " : "", b == '"' || b == '\\' ? "\\" : "", u, b);
  }
  fputs("}}, \"added_tokens\": [{\"id\": 256, \"content\": \"<|endoftext|>\", \"special\": true}], "
        "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false}}\n", f);
  ck_assert_int_eq(fclose(f), 0);
}

static void rm_dummy_folder(const char *dir) {
  char path[512];
  snprintf(path, sizeof path, "%s/config.json", dir);
  ck_assert_int_eq(unlink(path), 0);
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  ck_assert_int_eq(unlink(path), 0);
  ck_assert_int_eq(rmdir(dir), 0);
}

/* `ferrumctl serve --model ../models/<file>` from another working folder
 * (through a symlinked folder) serves the model; `ferrumctl chat` with no
 * address finds the server's HTTP port (ephemeral, not 8000) through its
 * pid file; a bare folder name serves (dummy weights: the worker once took
 * it for a built-in config's name); a relative path that does not exist
 * fails naming the path as given. */
START_TEST(test_relative_model_and_chat_finds_server) {
  need_model();
  char model_abs[4096], tmp[] = "/tmp/ferrum-relpath-XXXXXX", cwd[128], link[128], rel[4200], name[64];
  ck_assert_ptr_nonnull(realpath(efx_model(), model_abs));
  ck_assert_ptr_nonnull(mkdtemp(tmp));
  snprintf(cwd, sizeof cwd, "%s/cwd", tmp);
  snprintf(link, sizeof link, "%s/models", tmp);
  ck_assert_int_eq(mkdir(cwd, 0700), 0);
  char *slash = strrchr(model_abs, '/');
  *slash = 0;
  ck_assert_int_eq(symlink(model_abs, link), 0);
  snprintf(rel, sizeof rel, "../models/%s", slash + 1);
  snprintf(name, sizeof name, "relpath-%d", (int)getpid()); /* no other server on 8000 serves this */
  efx_server_t s;
  efx_opts_t o = {.cwd = cwd, .model = rel, .http = true};
  const char *extra[] = {"--served-model-name", name, "--max-model-len", "256", "--max-num-seqs", "2", NULL};
  ck_assert_int_eq(efx_start_opts(&s, &o, extra), 0);
  efx_job_t j;
  proto_submit_t r = efx_greedy(prompts[0], 4);
  ck_assert_int_eq(efx_run_one(&s, &r, &j), 0);
  ck_assert_int_eq(j.finish, PROTO_FINISH_LENGTH);
  ck_assert_int_eq(j.n_tokens, 4);
  /* the pid file says where HTTP listens */
  char url[320];
  int port = 0;
  pidfile_http(&s, url, sizeof url);
  ck_assert_msg(sscanf(url, "http://127.0.0.1:%d", &port) == 1 && port > 0 && port != 8000, "HTTP line '%s'", url);
  char out[4096];
  const char *found[] = {"--model", name, "--max-tokens", "4", "--temperature", "0", NULL};
  ck_assert_int_eq(run_chat(&s, found, out, sizeof out), 0);
  ck_assert_msg(strlen(out) > 1 && out[strlen(out) - 1] == '\n', "chat printed '%s'", out);
  const char *by_rpc[] = {"--rpc", s.rpc, "--model", name, "--max-tokens", "2", NULL};
  ck_assert_int_eq(run_chat(&s, by_rpc, out, sizeof out), 0);
  ck_assert(strlen(out) > 1);
  const char *nowhere[] = {"--rpc", "ipc:///nonexistent/rpc.sock", NULL};
  ck_assert_int_eq(run_chat(&s, nowhere, out, sizeof out), 2);
  stop_clean(&s, false);
  /* a bare folder name, from the folder above it */
  char tiny[160];
  snprintf(tiny, sizeof tiny, "%s/tiny", cwd);
  write_dummy_folder(tiny);
  efx_opts_t d = {.cwd = cwd, .model = "tiny"};
  const char *dummy[] = {"--load-format", "dummy", "--max-model-len", "64", NULL};
  ck_assert_int_eq(efx_start_opts(&s, &d, dummy), 0);
  r = efx_greedy("hi", 3);
  ck_assert_int_eq(efx_run_one(&s, &r, &j), 0);
  ck_assert_int_eq(j.finish, PROTO_FINISH_LENGTH);
  ck_assert_int_eq(j.n_tokens, 3);
  proto_status_reply_t st;
  ck_assert_int_eq(efx_status(&s, &st), 0);
  ck_assert_str_eq(st.model, "tiny"); /* the served name is still the one given */
  stop_clean(&s, false);
  rm_dummy_folder(tiny);
  /* a relative path that is not there: the error names it as typed */
  efx_opts_t bad = {.cwd = cwd, .model = "./no-such-model.gguf"};
  ck_assert_int_eq(efx_start_opts(&s, &bad, NULL), -1);
  ck_assert_int_eq(s.exit_status, 1);
  ck_assert_msg(log_has(&s, "./no-such-model.gguf"), "the error does not name the path (%s)", s.err_path);
  efx_cleanup(&s);
  ck_assert_int_eq(unlink(link), 0);
  ck_assert_int_eq(rmdir(cwd), 0);
  ck_assert_int_eq(rmdir(tmp), 0);
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
  ADD(t, test_worker_deaths_never_stop_the_server);
  ADD(t, test_hung_worker_is_restarted);
  ADD(t, test_big_prompt_does_not_stall_streams);
  ADD(t, test_nonfinite_logits_fail_one_request);
  ADD(t, test_sigterm_drains);
  ADD(t, test_ferrumctl_stop_drains);
  ADD(t, test_bad_rpc_input);
  ADD(t, test_relative_model_and_chat_finds_server);
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
