/* engine_fx.h - fixtures for the engine's end-to-end tests: start a real
 * `ferrumctl serve` (coordinator + ferrum-worker processes) with a private
 * runtime folder and RPC endpoint, talk to it with fr_client, stop it and
 * check that no shared-memory segment of its instance is left.
 *
 * Every wait is bounded in time. Paths come from the environment CTest
 * sets (FERRUM_BUILD_DIR, FERRUM_MODEL). */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "proto/fr_client.h"
#include "proto/proto.h"

typedef struct {
  char dir[256];      /* private runtime folder (XDG_RUNTIME_DIR) */
  char rpc[320];      /* ipc://<dir>/rpc.sock */
  char instance[64];  /* from the server's pid file */
  char err_path[320]; /* the server's stderr */
  pid_t pid;          /* ferrumctl serve */
  int exit_status;    /* when efx_start failed because the server exited: its exit code (-1: a signal) */
} efx_server_t;

/* One job's collected output. */
typedef struct {
  uint64_t id;
  int32_t tokens[4096];
  int n_tokens;
  char text[16384];
  size_t text_len;
  proto_finish_t finish;
  proto_usage_t usage;
  int32_t error;
  int n_events;
} efx_job_t;

const char *efx_model(void);
/* Path of a built program (bin/ferrumctl, bin/ferrum-worker). */
const char *efx_bin(const char *name);

/* Starts a server with extra flags (NULL-terminated list) and waits until
 * its workers are ready (up to 120 s). Returns 0 or -1 (message on stderr). */
int efx_start(efx_server_t *s, const char *const *extra);

/* How efx_start_opts starts the server; zeroes are efx_start's choices. */
typedef struct {
  const char *cwd;   /* its working folder (NULL: the test's) */
  const char *model; /* --model as given (NULL: efx_model()) */
  bool http;         /* the HTTP frontend on 127.0.0.1, an ephemeral port (else --no-http) */
} efx_opts_t;
int efx_start_opts(efx_server_t *s, const efx_opts_t *o, const char *const *extra);
/* SIGTERM (or `ferrumctl stop` when use_cli) and waits for the exit (60 s);
 * returns the exit status (0 ok), or -1 when it had to be killed. */
int efx_stop(efx_server_t *s, bool use_cli);
/* Number of /dev/shm/ferrum-<instance>* entries. */
int efx_shm_count(const efx_server_t *s);
/* Removes the server's runtime folder (its log included). */
void efx_cleanup(const efx_server_t *s);

/* A greedy request for a raw prompt with a fixed output length. */
proto_submit_t efx_greedy(const char *prompt, uint32_t max_tokens);

/* Waits for events on c until every job in jobs has finished (timeout_ms
 * overall). Returns 0, or -1 on timeout / connection loss. */
int efx_collect(fr_client_t *c, efx_job_t *jobs, int n, int timeout_ms);

/* As efx_collect, but returns as soon as jobs[k] has n_events events (k < 0:
 * when every job has finished); events of the other jobs are kept too. */
int efx_collect_until(fr_client_t *c, efx_job_t *jobs, int n, int k, int n_events, int timeout_ms);

/* Submits one request alone and collects it. */
int efx_run_one(const efx_server_t *s, const proto_submit_t *req, efx_job_t *out);

/* Status with a 5 s timeout. st->model points at a static copy (valid
 * until the next call); the reply's other strings are not kept. */
int efx_status(const efx_server_t *s, proto_status_reply_t *st);

/* Greedy continuation of a raw prompt by the in-process generator
 * (model/generate.h), the reference; ignores EOS. Returns the count. */
int efx_reference(const char *prompt, int n_out, int32_t *out);

/* pids of the server's ferrum-worker children (up to cap). */
int efx_worker_pids(const efx_server_t *s, pid_t *pids, int cap);
