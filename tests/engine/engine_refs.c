/* engine_refs.c - see engine_refs.h. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/common/test_main.h"
#include "tests/engine/engine_refs.h"

const char *const efx_prompts[EFX_N_PROMPTS] = {
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

int32_t efx_refs[EFX_N_PROMPTS][EFX_N_OUT];
static bool refs_done;

void efx_need_model(void) {
  if (access(efx_model(), R_OK) != 0) {
    fprintf(stderr, "skip: no model at %s\n", efx_model());
    exit(77);
  }
}

void efx_load_refs(int n) {
  if (refs_done) return;
  for (int i = 0; i < n; i++) ck_assert_int_eq(efx_reference(efx_prompts[i], EFX_N_OUT, efx_refs[i]), EFX_N_OUT);
  refs_done = true;
}

void efx_check_ref(const efx_job_t *j, int i) {
  ck_assert_int_eq(j->finish, PROTO_FINISH_LENGTH);
  ck_assert_int_eq(j->n_tokens, EFX_N_OUT);
  for (int t = 0; t < EFX_N_OUT; t++)
    ck_assert_msg(j->tokens[t] == efx_refs[i][t], "prompt %d token %d: %d, reference %d", i, t, j->tokens[t],
                  efx_refs[i][t]);
}

void efx_run_batch(efx_server_t *s, int n, efx_job_t *jobs) {
  fr_client_t *c = NULL;
  ck_assert_int_eq(fr_client_connect(&c, s->rpc), 0);
  memset(jobs, 0, (size_t)n * sizeof *jobs);
  for (int i = 0; i < n; i++) {
    proto_submit_t r = efx_greedy(efx_prompts[i], EFX_N_OUT);
    ck_assert_int_eq(fr_client_submit(c, &r, &jobs[i].id), 0);
  }
  ck_assert_int_eq(efx_collect(c, jobs, n, 180000), 0);
  fr_client_close(c);
}

void efx_stop_clean(efx_server_t *s, bool cli) {
  ck_assert_int_eq(efx_stop(s, cli), 0);
  ck_assert_int_eq(efx_shm_count(s), 0);
}

void efx_wait_idle(const efx_server_t *s, uint32_t used) {
  proto_status_reply_t st = {0};
  for (int i = 0; i < 500; i++) {
    ck_assert_int_eq(efx_status(s, &st), 0);
    if (st.running == 0 && st.queued == 0 && st.kv_used_blocks == used) return;
    usleep(20000);
  }
  ck_abort_msg("not idle: running %u queued %u kv used %u (want %u)", st.running, st.queued, st.kv_used_blocks, used);
}

void efx_wait_events(fr_client_t *c, uint64_t id, int n) {
  for (int got = 0; got < n;) {
    proto_event_t ev;
    ck_assert_int_eq(fr_client_next_event(c, 60000, &ev), 0);
    if (ev.id == id) got++;
    ck_assert_msg(ev.finish == PROTO_FINISH_NONE, "job %llu (waiting for %llu) ended: %d %s", (unsigned long long)ev.id,
                  (unsigned long long)id, ev.finish, ev.error.message ? ev.error.message : "");
  }
}

bool efx_log_has(const efx_server_t *s, const char *text) {
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

int efx_setup(int argc, char **argv) {
  if (access(efx_model(), R_OK) != 0) {
    fprintf(stderr, "skip: no model at %s\n", efx_model());
    return TEST_SKIP;
  }
  return 0;
}
