/* test_faults.c - the engine under faults (real `ferrumctl serve` +
 * ferrum-worker, the real SmolLM2): a worker killed mid-stream, killed 25
 * times, stopped (hung); a model whose logits turn NaN for one request;
 * drains on SIGTERM and `ferrumctl stop`. No request is lost: each ends
 * with the reference tokens or a clear error. */
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

/* ---- worker crash ----------------------------------------------------------------------- */

START_TEST(test_worker_killed_restarts_and_recomputes) {
  efx_need_model();
  efx_load_refs(4);
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
    proto_submit_t r = efx_greedy(efx_prompts[i], EFX_N_OUT);
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
  for (int i = 0; i < 4; i++) efx_check_ref(&jobs[i], i);
  pid_t w2[4];
  ck_assert_int_eq(efx_worker_pids(&s, w2, 4), 1);
  ck_assert_int_ne(w2[0], w[0]);
  /* the KV pool outlived the worker: cached blocks are still right */
  ck_assert_int_eq(efx_run_one(&s, &cr, &after), 0);
  ck_assert_int_ge(after.usage.cached_tokens, 64);
  ck_assert_int_eq(after.n_tokens, 8);
  ck_assert_mem_eq(after.tokens, before.tokens, 8 * sizeof(int32_t));
  fr_client_close(c);
  efx_stop_clean(&s, false);
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
  efx_need_model();
  efx_load_refs(1);
  efx_server_t s;
  const char *extra[] = {"--restart-backoff-max", "300", NULL};
  ck_assert_int_eq(efx_start(&s, extra), 0);
  fr_client_t *c = NULL;
  ck_assert_int_eq(fr_client_connect(&c, s.rpc), 0);
  efx_job_t j = {0};
  proto_submit_t r = efx_greedy(efx_prompts[0], EFX_N_OUT);
  ck_assert_int_eq(fr_client_submit(c, &r, &j.id), 0);
  for (uint32_t k = 1; k <= 25; k++) {
    pid_t w[4];
    ck_assert_int_eq(efx_worker_pids(&s, w, 4), 1);
    ck_assert_int_eq(kill(w[0], SIGKILL), 0);
    wait_restarted(&s, k, 30000000000ull);
  }
  ck_assert_int_eq(waitpid(s.pid, NULL, WNOHANG), 0); /* serve is still running */
  ck_assert_int_eq(efx_collect(c, &j, 1, 120000), 0);
  efx_check_ref(&j, 0);
  fr_client_close(c);
  efx_stop_clean(&s, false);
}
END_TEST

/* A worker that stops answering in the middle of a step (SIGSTOP) is taken
 * for hung after a few seconds, not minutes: it is killed and restarted, and
 * the streams go on to the reference tokens. */
START_TEST(test_hung_worker_is_restarted) {
  efx_need_model();
  efx_load_refs(2);
  efx_server_t s;
  ck_assert_int_eq(efx_start(&s, NULL), 0);
  fr_client_t *c = NULL;
  ck_assert_int_eq(fr_client_connect(&c, s.rpc), 0);
  efx_job_t jobs[2];
  memset(jobs, 0, sizeof jobs);
  for (int i = 0; i < 2; i++) {
    proto_submit_t r = efx_greedy(efx_prompts[i], EFX_N_OUT);
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
  for (int i = 0; i < 2; i++) efx_check_ref(&jobs[i], i);
  fr_client_close(c);
  efx_stop_clean(&s, false);
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
  efx_need_model();
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
  efx_stop_clean(&s, false);
  unlink(model);
}
END_TEST

/* ---- drain ------------------------------------------------------------------------------- */

static void drain_case(bool cli) {
  efx_need_model();
  efx_server_t s;
  ck_assert_int_eq(efx_start(&s, NULL), 0);
  fr_client_t *c = NULL;
  ck_assert_int_eq(fr_client_connect(&c, s.rpc), 0);
  efx_job_t j = {0};
  proto_submit_t r = efx_greedy(efx_prompts[2], 48);
  ck_assert_int_eq(fr_client_submit(c, &r, &j.id), 0);
  efx_wait_events(c, j.id, 2);
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
  efx_stop_clean(&s, false); /* reaps the server: exit status 0 */
}

START_TEST(test_sigterm_drains) { drain_case(false); }
END_TEST

START_TEST(test_ferrumctl_stop_drains) { drain_case(true); }
END_TEST

static Suite *faults_suite(void) {
  Suite *s = suite_create("faults");
  TCase *t = tcase_create("e2e");
  tcase_set_timeout(t, 240);
  EFX_ADD(t, test_worker_killed_restarts_and_recomputes);
  EFX_ADD(t, test_worker_deaths_never_stop_the_server);
  EFX_ADD(t, test_hung_worker_is_restarted);
  EFX_ADD(t, test_nonfinite_logits_fail_one_request);
  EFX_ADD(t, test_sigterm_drains);
  EFX_ADD(t, test_ferrumctl_stop_drains);
  suite_add_tcase(s, t);
  return s;
}

#include "tests/common/test_main.h"

const test_prog_t test_prog = {.suites = {faults_suite}, .setup = efx_setup};
