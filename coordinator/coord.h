/* coord.h - the coordinator: one event loop (zmq_poll over the worker
 * ROUTER, the RPC ROUTER and a signalfd, plus timers) that takes jobs from
 * RPC clients (and the HTTP frontend, through an inproc:// endpoint of the
 * same protocol), tokenizes them, schedules them in steps over the workers
 * it supervises, detokenizes and streams the results.
 *
 * Threads: every coord_* call runs on the loop's thread; the scheduler and
 * the KV allocator take no locks. Other threads reach the loop only through
 * the RPC protocol (inproc:// on coord_zmq_ctx()).
 * Signals: coord_create() blocks SIGCHLD, SIGTERM, SIGINT and SIGHUP in the
 * calling thread (threads created afterwards inherit the mask) and reads
 * them from a signalfd: SIGTERM/SIGINT drain, SIGCHLD reaps workers.
 * Shared memory: the coordinator creates `/ferrum-<instance>-kvctl`; its
 * workers create their KV pool and logits segments; coord_destroy() unlinks
 * every segment of the instance.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include "coordinator/spec.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct coord coord_t;

typedef struct {
  const char *model_path;         /* GGUF file or HF folder (required) */
  const char *served_model_name;  /* NULL = the model file's base name */
  const char *chat_template;      /* NULL, or a Jinja file (or a built-in name: chatml, llama3, ...)
                                   * that replaces the model's chat template */
  const char *device;             /* "cpu" (default) or "cuda[:N]" */
  const char *load_format;        /* NULL/"auto", or "dummy": random weights of model_path's config.json
                                   * (the folder's tokenizer.json serves the text side) */
  int threads;                    /* worker CPU threads (0 = all cores) */
  int tp_size;                    /* workers (tensor-parallel ranks), default 1 */
  const char *rpc_addr;           /* RPC ROUTER endpoint; NULL = coord_default_rpc_addr() */
  int max_model_len;              /* 0 = the model's context (capped by the KV pool) */
  int max_num_seqs;               /* 0 = 64 on the CPU, 256 on a GPU */
  int max_num_batched_tokens;     /* 0 = 512 on the CPU, 2048 on a GPU */
  int block_size;                 /* 0 = 16 */
  /* KV pool size, first given wins: num_kv_blocks; kv_cache_memory_bytes;
   * gpu_memory_utilization. None given: on the CPU, enough blocks for 4 *
   * max_model_len tokens (at most 4096); on a device, utilization 0.9. With
   * a byte budget or a fraction the workers size their pools after loading
   * and the coordinator takes the smallest (docs/ARCHITECTURE.md). */
  int num_kv_blocks;              /* > 0: exactly this many blocks */
  uint64_t kv_cache_memory_bytes; /* > 0: each worker's pool gets this many bytes */
  double gpu_memory_utilization;  /* (0, 1]: fraction of the device's total memory a worker may use for
                                   * weights, activations and KV (vLLM's); 0 = not given */
  const char *kv_cache_dtype;     /* NULL/"auto" (the backend's element type), "int8" or "fp8": a quantized
                                   * KV cache (kern_kv_dtype_t), sent to the workers as load option
                                   * kv_cache_dtype */
  const char *quantization;       /* NULL or "fp8" (--quantization): the workers keep the layers' dense weights
                                   * as FP8 (load option quantization) */
  bool no_prefix_caching;         /* prefix caching is on unless this is set */
  bool embed;                     /* --task embed: the model returns embeddings (pooled as the load option
                                   * pooling says); jobs must be embed jobs */
  const char *pooling;            /* --pooling last|mean|cls: overrides the model's pooling (GGUF
                                   * pooling_type, sentence-transformers' Pooling); NULL: the model's, else last */
  int max_waiting;                /* queued jobs before 429; 0 = 1024 */
  const char *worker_exe;         /* NULL = ferrum-worker next to /proc/self/exe */
  bool fake_workers;              /* workers skip the forward pass (benchmarks) */
  const char *step_stats_path;    /* NULL, or a file that gets the coordinator's time per step */
  int worker_hb_timeout_ms;       /* 0 = 10000: a silent worker is killed and restarted */
  int restart_backoff_max_ms;     /* 0 = 30000: longest wait before restarting a worker that keeps dying */
  /* CURVE on tcp:// sockets (coordinator/auth.c): this server's key pair
   * (NULL: FERRUM_CURVE_SECRET_KEY, else none) and the public keys of the
   * clients and remote workers allowed to connect (NULL: only the pair's own). */
  const char *curve_key_path;
  const char *curve_clients_path;
  /* Where workers connect (NULL: ipc:// in the runtime folder), and how many
   * of the last ranks are remote: started elsewhere (ferrum-worker --connect
   * on another host), joining over worker_endpoint, never spawned here. */
  const char *worker_endpoint;
  int remote_workers;
  /* Speculative decoding (--speculative-config, coordinator/spec.h):
   * num_speculative_tokens 0 = off. */
  coord_spec_config_t spec;
} coord_config_t;

/* Opens the tokenizer, creates the control segment, binds the sockets and
 * starts the workers. Returns 0 and *out, or an error with a message;
 * nothing is left running on failure. */
int coord_create(coord_t **out, const coord_config_t *cfg);

/* Runs the loop until every worker has loaded the model (progress on
 * stderr). Returns 0, FR_ETIMEOUT, or the load error. */
int coord_wait_ready(coord_t *c, int timeout_ms);

/* Runs the loop until a drain (SIGTERM, SIGINT, coord_drain) has finished
 * the jobs in flight. Returns 0 after a clean drain. */
int coord_run(coord_t *c);

/* Starts draining: new jobs get 503, running ones finish, then coord_run
 * returns. */
void coord_drain(coord_t *c);

/* Stops the workers, closes the sockets, unlinks the instance's segments and
 * frees c. NULL is fine. */
void coord_destroy(coord_t *c);

/* The zmq context and the inproc:// RPC endpoint (for the HTTP frontend). */
void *coord_zmq_ctx(const coord_t *c);
const char *coord_inproc_endpoint(const coord_t *c);
/* The RPC endpoint bound (ipc:// or tcp://), the instance id, the context
 * length jobs get, the tokenizer (borrowed, model/tokenizer.h). */
const char *coord_rpc_endpoint(const coord_t *c);
const char *coord_instance(const coord_t *c);
int coord_max_model_len(const coord_t *c);
/* Whether the KV pool has its size (and coord_max_model_len() its final
 * value): at once with a fixed block count, else once the workers loaded. */
bool coord_kv_sized(const coord_t *c);
const struct model_tokenizer *coord_tokenizer(const coord_t *c);
const char *coord_served_model_name(const coord_t *c);

/* Hooks for the HTTP frontend (set before coord_run; NULL to clear): the
 * loop calls ready(arg, true) when workers become ready (at once if they
 * are) and ready(arg, false) while one restarts, drain(arg) when draining
 * starts. */
void coord_set_hooks(coord_t *c, void (*ready)(void *arg, bool ready), void (*drain)(void *arg), void *arg);
/* Metrics registry to update (coordinator/metrics.h), borrowed; NULL = none. */
struct coord_metrics;
void coord_set_metrics(coord_t *c, struct coord_metrics *m);

/* ---- runtime files (runtime.c) ---- */

/* The runtime folder: $XDG_RUNTIME_DIR/ferrum, else /tmp/ferrum-<uid>;
 * created 0700. Returns 0 and writes the path into out. */
int coord_runtime_dir(char *out, size_t cap);

/* The default RPC endpoint: ipc://<runtime dir>/rpc.sock. */
int coord_default_rpc_addr(char *out, size_t cap);

/* The pid file of the server bound to an RPC endpoint:
 * <runtime dir>/server-<hash of the endpoint>.pid. Its lines: the pid, the
 * instance id, the RPC endpoint and, once coord_set_http_addr() was
 * called, the HTTP address as http://host:port ([host] for IPv6). */
int coord_pidfile_path(const char *rpc_addr, char *out, size_t cap);

/* Adds the HTTP frontend's address (host as bound, port as listening) to
 * the pid file, where `ferrumctl chat` and `bench` find it. Returns 0, or
 * an error (the pid file is left as it was). */
int coord_set_http_addr(coord_t *c, const char *host, int port);

#ifdef __cplusplus
}
#endif
