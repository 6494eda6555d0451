/* engine_refs.h - what the end-to-end engine suites (test_engine.c,
 * test_faults.c, test_requests.c) share on top of engine_fx.h: the
 * reference prompts and their greedy tokens from the in-process generator,
 * and Check-asserting helpers. Check programs only (engine_fx.c is also
 * linked by bench_coord, which is not one). */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tests/engine/engine_fx.h"

/* Adds a test to a case, or only the one named by ENGINE_TEST (debugging). */
#define EFX_ADD(t, fn)                                                             \
  do {                                                                             \
    const char *only = getenv("ENGINE_TEST");                                      \
    if (!only || !strcmp(only, #fn)) tcase_add_test(t, fn);                        \
  } while (0)

#define EFX_N_OUT 16
#define EFX_N_PROMPTS 16

extern const char *const efx_prompts[EFX_N_PROMPTS];
/* Greedy continuations of efx_prompts (efx_load_refs fills them). */
extern int32_t efx_refs[EFX_N_PROMPTS][EFX_N_OUT];

/* The test program's set-up: skips (77) when the model is missing. */
int efx_setup(int argc, char **argv);
/* Exits 77 when the model is missing (inside a test). */
void efx_need_model(void);
/* Computes the references of the first n prompts (once per process). */
void efx_load_refs(int n);
/* j finished by length with prompt i's reference tokens. */
void efx_check_ref(const efx_job_t *j, int i);
/* Submits efx_prompts[0..n) at once on one client and collects them. */
void efx_run_batch(efx_server_t *s, int n, efx_job_t *jobs);
/* Stops s (SIGTERM, or `ferrumctl stop` when cli): exit 0, no shm left. */
void efx_stop_clean(efx_server_t *s, bool cli);
/* Waits until no job runs or waits and `used` KV blocks are in use. */
void efx_wait_idle(const efx_server_t *s, uint32_t used);
/* Waits until job id has produced at least n events on c (none final). */
void efx_wait_events(fr_client_t *c, uint64_t id, int n);
/* True once the server's log holds text (polled for up to 10 s). */
bool efx_log_has(const efx_server_t *s, const char *text);
