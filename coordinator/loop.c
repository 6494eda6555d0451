/* loop.c - the coordinator's life: create (tokenizer, control segment,
 * sockets, workers), the event loop (zmq_poll over the worker ROUTER, the
 * RPC ROUTERs and a signalfd; heartbeat timers), drain and destroy. */
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/signalfd.h>
#include <unistd.h>
#include <zmq.h>

#include "common/fr_err.h"
#include "common/fr_log.h"
#include "common/fr_util.h"
#include "coordinator/coord_impl.h"
#include "model/grammar.h"
#include "coordinator/metrics.h"

/* ---- create ----------------------------------------------------------------- */

/* Steps on a GPU are bigger than on the CPU: 256 sequences and 2048 tokens
 * (vLLM's online defaults; on an H100 with Llama-3-8B shapes a budget of
 * 2048 gave 1.8x the output rate of 512 under 200 clients, as measured for
 * the GPU serving issue; larger budgets are not measured yet), against 64
 * and 512 on the CPU, where a 2048-token step takes seconds. */
static void coord__defaults(coord_config_t *k) {
  const bool gpu = k->device && strncmp(k->device, "cpu", 3) != 0;
  if (k->tp_size <= 0) k->tp_size = 1;
  if (k->max_num_seqs <= 0) k->max_num_seqs = gpu ? 256 : 64;
  if (k->max_num_batched_tokens <= 0) k->max_num_batched_tokens = gpu ? 2048 : 512;
  if (k->block_size <= 0) k->block_size = KV_BLOCK_SIZE_DEFAULT;
  if (k->max_waiting <= 0) k->max_waiting = 1024;
  if (k->worker_hb_timeout_ms <= 0) k->worker_hb_timeout_ms = 10000;
  if (k->restart_backoff_max_ms <= 0) k->restart_backoff_max_ms = 30000;
}

static int coord__worker_exe(coord_t *c) {
  if (c->cfg.worker_exe) {
    c->worker_exe = fr_strdup(c->cfg.worker_exe);
    return 0;
  }
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return fr_errorf(-errno, "readlink /proc/self/exe: %s", strerror(errno));
  self[n] = 0;
  char path[PATH_MAX + 32];
  snprintf(path, sizeof path, "%s/ferrum-worker", dirname(self));
  if (access(path, X_OK) != 0) return fr_errorf(-ENOENT, "%s not found (build it next to ferrumctl)", path);
  c->worker_exe = fr_strdup(path);
  return 0;
}

/* --chat-template: a file's text, or a built-in renderer's name, replaces
 * the model's template; a template that does not parse fails the start. */
static int coord__chat_template(coord_t *c) {
  const char *arg = c->cfg.chat_template;
  char *text = NULL;
  int rc = model_chat_template_load(arg, &text);
  if (rc) return rc;
  model_tokenizer_set_chat_template(c->tok, text);
  free(text);
  FR_LOGI("chat template from %s", arg);
  return 0;
}

/* --task embed: --pooling, else the pooling the model's files name, else
 * the last token's (decoder embedding models) or CLS (BERT encoders, as
 * vLLM pools them). Encoders and mean / CLS pooling embed whole prompts. */
static int coord__pooling(coord_t *c) {
  const bool encoder = c->src->config.arch == MODEL_ARCH_BERT;
  int p = c->cfg.pooling ? model_pooling_parse(c->cfg.pooling) : (int)c->src->config.pooling;
  if (p < 0 || (c->cfg.pooling && p == MODEL_POOL_NONE))
    return fr_errorf(-EINVAL, "--pooling %s: not last, mean or cls", c->cfg.pooling);
  c->pooling = p != MODEL_POOL_NONE ? (model_pooling_t)p : encoder ? MODEL_POOL_CLS : MODEL_POOL_LAST;
  c->whole_prompts = encoder || c->pooling == MODEL_POOL_MEAN || c->pooling == MODEL_POOL_CLS;
  FR_LOGI("embeddings: %s pooling%s", model_pooling_name(c->pooling), c->cfg.pooling ? " (--pooling)" : "");
  return 0;
}

/* Opens the model's tokenizer (not its weights) and works out the context. */
static int coord__tokenizer(coord_t *c) {
  int rc = c->cfg.load_format && !strcmp(c->cfg.load_format, "dummy")
               ? model_source_open_config(&c->src, c->model_path)
               : model_source_open(&c->src, c->model_path);
  if (rc) return rc;
  if (c->src->gguf) rc = model_tokenizer_from_gguf(&c->tok, c->src->gguf);
  else if (c->src->tokenizer_json)
    rc = model_tokenizer_from_json_files(&c->tok, c->src->tokenizer_json, c->src->tokenizer_config_json);
  else rc = fr_errorf(FR_EUNSUPPORTED, "%s has no tokenizer", c->model_path);
  if (rc) return rc;
  if (c->cfg.chat_template && (rc = coord__chat_template(c))) return rc;
  c->vocab = c->src->config.vocab_size;
  c->n_embd = c->cfg.embed ? c->src->config.dim : 0;
  if (c->cfg.embed && (rc = coord__pooling(c))) return rc;
  c->n_layers = c->src->config.n_layers;
  return 0;
}

/* The window every layer's attention keeps (config.json sliding_window
 * with no full-attention layer), else 0: the scheduler releases the KV
 * blocks before it. FERRUM_KV_WINDOW_FREE=0 keeps them (tests compare). */
static int coord__kv_window(const coord_t *c) {
  const model_config_t *m = &c->src->config;
  if (m->sliding_window <= 0 || m->swa_first_layer > 0) return 0;
  const char *e = getenv("FERRUM_KV_WINDOW_FREE");
  if (e && !strcmp(e, "0")) return 0;
  FR_LOGI("sliding window of %d tokens on every layer: KV blocks before it are released", m->sliding_window);
  return m->sliding_window;
}

int coord__kv_create(coord_t *c, int n_blocks, uint64_t block_bytes) {
  coord_config_t *k = &c->cfg;
  int bs = k->block_size, mbps = (k->max_model_len + bs - 1) / bs;
  /* a sliding window on every layer: a sequence holds about window / bs
   * blocks whatever its length (kv_seq_release_before), so the context is
   * not capped by the pool (a prompt chunk still needs its blocks at once) */
  if (mbps > n_blocks && c->sched.cfg.kv_window == 0) {
    mbps = n_blocks;
    k->max_model_len = mbps * bs;
    FR_LOGI("context capped at %d tokens: the KV pool holds %d blocks", k->max_model_len, n_blocks);
  }
  kv_config_t kc = {.instance = c->instance,
                    .epoch = c->epoch,
                    .n_blocks = n_blocks,
                    .block_size = bs,
                    .max_seqs = k->max_num_seqs,
                    .max_blocks_per_seq = mbps,
                    .enable_prefix_cache = !k->no_prefix_caching};
  int rc = kv_control_create(&c->kv, &kc);
  if (rc) return rc;
  kv_control_info(c->kv, &c->kvi);
  coord_sched_set_kv(&c->sched, c->kv);
  c->max_model_len = k->max_model_len;
  long long tokens = (long long)n_blocks * bs;
  char size[64] = "";
  if (block_bytes) snprintf(size, sizeof size, " (%.1f MiB per worker)", (double)n_blocks * block_bytes / 1048576.0);
  const char *dt = k->kv_cache_dtype && strcmp(k->kv_cache_dtype, "auto") ? k->kv_cache_dtype : NULL;
  FR_LOGI("KV cache: %d blocks of %d tokens, %lld tokens%s%s%s; maximum concurrency for %d tokens per request: %.2fx",
          n_blocks, bs, tokens, dt ? " of " : "", dt ? dt : "", size, c->max_model_len, (double)tokens / c->max_model_len);
  return 0;
}

/* Whether the workers size the KV pool (a byte budget or a memory fraction)
 * rather than taking a block count made here. */
static bool coord__kv_sized_by_workers(const coord_config_t *k, const char *device) {
  if (k->num_kv_blocks > 0) {
    if (k->kv_cache_memory_bytes || k->gpu_memory_utilization > 0)
      FR_LOGW("--num-kv-blocks %d overrides --kv-cache-memory-bytes / --gpu-memory-utilization", k->num_kv_blocks);
    return false;
  }
  if (k->kv_cache_memory_bytes && k->gpu_memory_utilization > 0)
    FR_LOGW("--kv-cache-memory-bytes overrides --gpu-memory-utilization");
  return k->kv_cache_memory_bytes || k->gpu_memory_utilization > 0 || strcmp(device, "cpu") != 0;
}

/* Works out the context and the KV pool: a fixed block count makes the
 * control segment now; a byte budget or a memory fraction waits for the
 * workers (supervise.c: loaded, then kv_init). */
static int coord__kv(coord_t *c) {
  coord_config_t *k = &c->cfg;
  int model_ctx = c->src->config.max_ctx > 0 ? c->src->config.max_ctx : 4096;
  int bs = k->block_size;
  c->mml_explicit = k->max_model_len > 0;
  if (k->max_model_len <= 0) k->max_model_len = model_ctx;
  if (k->max_model_len > model_ctx) FR_LOGW("--max-model-len %d exceeds the model's context %d", k->max_model_len, model_ctx);
  c->max_model_len = k->max_model_len;
  c->epoch = (uint64_t)fr_now_ns();
  if (coord__kv_sized_by_workers(k, c->device)) {
    c->kv_sizing = true;
    if (!k->kv_cache_memory_bytes && k->gpu_memory_utilization <= 0) k->gpu_memory_utilization = 0.9;
    /* an explicit --max-model-len must fit once; else the context shrinks to the pool */
    c->kv_min_blocks = c->mml_explicit ? (uint32_t)((k->max_model_len + bs - 1) / bs) : 1;
    if (k->kv_cache_memory_bytes)
      FR_LOGI("KV cache: %.1f MiB per worker", (double)k->kv_cache_memory_bytes / 1048576.0);
    else
      FR_LOGI("KV cache: what %.2f of the device's memory leaves after weights and activations",
              k->gpu_memory_utilization);
    return 0;
  }
  if (k->num_kv_blocks <= 0) k->num_kv_blocks = FR_MIN(4096, FR_MAX(256, 4 * ((k->max_model_len + bs - 1) / bs)));
  return coord__kv_create(c, k->num_kv_blocks, 0);
}

static int coord__sockets(coord_t *c) {
  if (!(c->zctx = zmq_ctx_new())) return fr_errorf(FR_EZMQ, "zmq_ctx_new: %s", zmq_strerror(errno));
  if (c->cfg.worker_endpoint) snprintf(c->worker_addr, sizeof c->worker_addr, "%s", c->cfg.worker_endpoint);
  else snprintf(c->worker_addr, sizeof c->worker_addr, "ipc://%s/%s.workers", c->run_dir, c->instance);
  int rc = coord__auth_init(c); /* before any CURVE socket binds */
  if (rc) return rc;
  c->wsock = zmq_socket(c->zctx, ZMQ_ROUTER);
  int one = 1, zero = 0;
  zmq_setsockopt(c->wsock, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
  zmq_setsockopt(c->wsock, ZMQ_LINGER, &zero, sizeof zero);
  if ((rc = coord__auth_socket(c, c->wsock, c->worker_addr))) return rc;
  if (zmq_bind(c->wsock, c->worker_addr) != 0)
    return fr_errorf(FR_EZMQ, "bind %s: %s", c->worker_addr, zmq_strerror(errno));
  coord__endpoint_resolve(c->wsock, c->worker_addr, sizeof c->worker_addr);
  return coord__rpc_bind(c);
}

static int coord__signals(coord_t *c) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD), sigaddset(&set, SIGTERM), sigaddset(&set, SIGINT), sigaddset(&set, SIGHUP);
  if (pthread_sigmask(SIG_BLOCK, &set, NULL) != 0) return fr_errorf(-errno, "sigmask");
  c->sigfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
  if (c->sigfd < 0) return fr_errorf(-errno, "signalfd: %s", strerror(errno));
  signal(SIGPIPE, SIG_IGN);
  return 0;
}

/* Refuses to start over a live server bound to the same RPC endpoint. */
static int coord__check_running(coord_t *c) {
  char pf[600];
  if (coord_pidfile_path(c->rpc_addr, pf, sizeof pf)) return 0;
  FILE *f = fopen(pf, "r");
  if (!f) return 0;
  int pid = 0;
  int ok = fscanf(f, "%d", &pid);
  fclose(f);
  if (ok == 1 && pid > 0 && pid != getpid() && kill(pid, 0) == 0)
    return fr_errorf(-EADDRINUSE,
                     "a server (pid %d) already serves %s: stop it (ferrumctl stop) or give this one another "
                     "endpoint with --rpc ADDR",
                     pid, c->rpc_addr);
  return 0;
}

static void coord__copy_cfg(coord_t *c, const coord_config_t *cfg) {
  c->cfg = *cfg;
  coord__defaults(&c->cfg);
  c->model_path = fr_strdup(cfg->model_path);
  c->device = fr_strdup(cfg->device ? cfg->device : "cpu");
  c->step_stats_path = cfg->step_stats_path ? fr_strdup(cfg->step_stats_path) : NULL;
  if (cfg->served_model_name) {
    c->served_name = fr_strdup(cfg->served_model_name);
  } else {
    char *tmp = fr_strdup(cfg->model_path);
    c->served_name = fr_strdup(basename(tmp));
    free(tmp);
  }
  c->cfg.model_path = c->model_path;
  c->cfg.device = c->device;
  c->cfg.served_model_name = c->served_name;
  c->busy_poll = fr_busy_poll(strncmp(c->device, "cuda", 4) == 0); /* GPU workers */
}

static void coord__alloc_scratch(coord_t *c) {
  size_t S = (size_t)c->cfg.max_num_seqs;
  coord_sched_config_t sc = {.max_num_seqs = c->cfg.max_num_seqs,
                             .max_num_batched_tokens = c->cfg.max_num_batched_tokens};
  coord_sched_init(&c->sched, &sc);
  c->pitems = fr_calloc(S, sizeof *c->pitems);
  c->touched = fr_calloc(S, sizeof *c->touched);
  c->res_by_slot = fr_calloc(S, sizeof *c->res_by_slot);
  c->hash_cap = 4096;
  c->hash = fr_calloc(c->hash_cap, sizeof *c->hash);
}

int coord_create(coord_t **out, const coord_config_t *cfg) {
  *out = NULL;
  if (!cfg->model_path) return fr_errorf(-EINVAL, "no model given");
  if (cfg->tp_size > COORD_MAX_WORKERS) return fr_errorf(-EINVAL, "at most %d workers", COORD_MAX_WORKERS);
  int tp = cfg->tp_size > 0 ? cfg->tp_size : 1;
  if (cfg->remote_workers < 0 || cfg->remote_workers > tp)
    return fr_errorf(-EINVAL, "--remote-workers %d: the tensor-parallel size is %d", cfg->remote_workers, tp);
  if (cfg->remote_workers && tp > 1 && (!cfg->device || !strncmp(cfg->device, "cpu", 3)))
    return fr_errorf(FR_EUNSUPPORTED, "CPU ranks all-reduce through shared memory: a CPU group cannot have remote ranks");
  if (cfg->remote_workers && !proto_endpoint_tcp(cfg->worker_endpoint))
    return fr_errorf(-EINVAL, "remote workers join over tcp://: give --worker-endpoint tcp://ADDRESS:PORT");
  coord_t *c = fr_calloc(1, sizeof *c);
  c->sigfd = -1;
  c->prompts.efd = -1;
  c->logits_seg.fd = -1;
  proto_msg_init(&c->in);
  proto_buf_init(&c->out);
  proto_buf_init(&c->wout);
  coord__copy_cfg(c, cfg);
  c->n_workers = c->cfg.tp_size;
  c->n_remote = c->cfg.remote_workers;
  for (int r = 0; r < c->n_workers; r++) c->workers[r].remote = r >= c->n_workers - c->n_remote;
  coord__alloc_scratch(c);
  char dev[64];
  int rc;
  for (int r = 0; r < c->n_workers; r++) /* a device list that does not fit the ranks fails here */
    if ((rc = kern_device_for_rank(c->device, r, c->n_workers, dev, sizeof dev))) goto fail;
  coord__instance_id(c->instance, sizeof c->instance);
  rc = coord_runtime_dir(c->run_dir, sizeof c->run_dir);
  if (rc) goto fail;
  char addr[600];
  if (!cfg->rpc_addr && (rc = coord_default_rpc_addr(addr, sizeof addr))) goto fail;
  c->rpc_addr = fr_strdup(cfg->rpc_addr ? cfg->rpc_addr : addr);
  if ((rc = coord__check_running(c))) goto fail;
  coord__runtime_clean_stale(c->run_dir);
  if ((rc = coord__worker_exe(c))) goto fail;
  int n_removed = 0;
  kv_segment_scan_stale(&n_removed, NULL);
  if (n_removed) FR_LOGI("removed %d stale shared-memory segments", n_removed);
  if ((rc = coord__tokenizer(c))) goto fail;
  coord_sched_set_window(&c->sched, coord__kv_window(c));
  if ((rc = coord__kv(c))) goto fail;
  coord__mbox_init(c);
  if ((rc = coord__signals(c))) goto fail;
  if ((rc = coord__prompts_init(c))) goto fail; /* after the signal mask, which its threads inherit */
  if ((rc = coord__sockets(c))) goto fail;
  if ((rc = coord__pidfile_write(c))) goto fail;
  if ((rc = coord__workers_start(c))) goto fail;
  if (c->kv)
    FR_LOGI("instance %s: %d KV blocks of %d tokens, context %d, RPC %s", c->instance, c->kvi.n_blocks,
            c->kvi.block_size, c->max_model_len, c->rpc_addr);
  else
    FR_LOGI("instance %s: KV pool sized once the workers loaded, context up to %d, RPC %s", c->instance,
            c->max_model_len, c->rpc_addr);
  *out = c;
  return 0;
fail:;
  char msg[512];
  snprintf(msg, sizeof msg, "%s", fr_last_error());
  coord_destroy(c); /* may record messages of its own */
  return fr_errorf(rc, "%s", msg);
}

/* ---- loop --------------------------------------------------------------------- */

static void coord__on_signals(coord_t *c) {
  struct signalfd_siginfo si;
  while (read(c->sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
    if (si.ssi_signo == SIGCHLD) {
      coord__workers_on_sigchld(c);
    } else if (c->draining && si.ssi_signo == SIGINT) {
      FR_LOGW("second interrupt: stopping now");
      c->stop_loop = true;
    } else {
      FR_LOGI("signal %d: draining", (int)si.ssi_signo);
      coord_drain(c);
    }
  }
}

static void coord__on_workers(coord_t *c) {
  zmq_msg_t id, body;
  zmq_msg_init(&id);
  zmq_msg_init(&body);
  for (int i = 0; i < 64; i++) {
    if (zmq_msg_recv(&id, c->wsock, ZMQ_DONTWAIT) < 0) break;
    if (!zmq_msg_more(&id) || zmq_msg_recv(&body, c->wsock, 0) < 0) continue;
    while (zmq_msg_more(&body)) zmq_msg_recv(&body, c->wsock, 0); /* extra frames: keep the last */
    if (zmq_msg_size(&body) == 0) continue; /* a doorbell: the mailboxes are read every loop (mbox.c) */
    c->t_rx_ns = fr_now_ns();
    if (c->step_stats_path) c->t_rx_cpu_ns = coord__cpu_ns();
    if (proto_msg_decode(&c->in, zmq_msg_data(&body), zmq_msg_size(&body), PROTO_ACCEPT_FROM_WORKER) == 0)
      coord__workers_on_message(c, zmq_msg_data(&id), zmq_msg_size(&id), &c->in);
    else
      FR_LOGW("bad message from a worker: %s", fr_last_error());
    c->t_rx_ns = 0;
  }
  zmq_msg_close(&id);
  zmq_msg_close(&body);
}

static bool coord__drained(const coord_t *c) {
  return c->draining && !c->sched.waiting_head && !c->sched.running_head && !c->step_busy && !c->n_tokenizing;
}

/* Sets the metrics gauges (running, waiting, KV blocks used). */
static void coord__gauges(coord_t *c) {
  coord_metrics_set_running(c->metrics, (uint32_t)c->sched.n_running);
  coord_metrics_set_waiting(c->metrics, (uint32_t)c->sched.n_waiting);
  if (c->kv)
    coord_metrics_set_kv(c->metrics, (uint32_t)(c->kvi.n_blocks - kv_blocks_free_count(c->kv)),
                         (uint32_t)c->kvi.n_blocks);
  coord_metrics_set_workers(c->metrics, (uint32_t)c->n_workers, (uint32_t)coord__workers_ready_count(c));
}

/* While a step is out and the loop busy-polls: the mailboxes alone for up
 * to COORD_MBOX_SPIN_NS (memory loads, no system call), then one pass over
 * the sockets. */
#define COORD_MBOX_SPIN_NS 50000ull

static void coord__mbox_spin(coord_t *c) {
  uint64_t t0 = fr_now_ns();
  while (!coord__mbox_take(c, false) && c->step_busy && fr_now_ns() - t0 < COORD_MBOX_SPIN_NS) {
  }
}

int coord__loop_once(coord_t *c, int timeout_ms) {
  zmq_pollitem_t pi[7] = {{.socket = c->wsock, .events = ZMQ_POLLIN},
                          {.socket = c->rsock, .events = ZMQ_POLLIN},
                          {.socket = c->isock, .events = ZMQ_POLLIN},
                          {.fd = c->sigfd, .events = ZMQ_POLLIN},
                          {.socket = c->msock, .events = ZMQ_POLLIN},
                          {.fd = c->prompts.efd, .events = ZMQ_POLLIN},
                          {.socket = c->zap, .events = ZMQ_POLLIN}};
  int timeout = c->busy_poll && c->step_busy ? 0 : FR_MIN(timeout_ms, 200);
  if (timeout == 0) coord__mbox_spin(c);
  else if (coord__mbox_take(c, true)) timeout = 0;
  int n = zmq_poll(pi, c->zap ? 7 : 6, timeout);
  coord__mbox_awake(c);
  if (n < 0 && errno != EINTR) return fr_errorf(FR_EZMQ, "zmq_poll: %s", zmq_strerror(errno));
  if (n > 0) {
    if (pi[3].revents & ZMQ_POLLIN) coord__on_signals(c);
    if (pi[0].revents & ZMQ_POLLIN) coord__on_workers(c);
    /* disconnects before new messages: a closed connection's fd may be reused */
    if (pi[4].revents & ZMQ_POLLIN) coord__rpc_on_monitor(c);
    if (pi[1].revents & ZMQ_POLLIN) coord__rpc_on_readable(c, c->rsock, false);
    if (pi[2].revents & ZMQ_POLLIN) coord__rpc_on_readable(c, c->isock, true);
    if (pi[5].revents & ZMQ_POLLIN) coord__prompts_on_ready(c);
    if (c->zap && (pi[6].revents & ZMQ_POLLIN)) coord__auth_on_request(c);
  }
  coord__workers_tick(c);
  coord__step_kick(c);
  if (c->metrics) coord__gauges(c);
  if (coord__drained(c)) c->stop_loop = true;
  return 0;
}

int coord_wait_ready(coord_t *c, int timeout_ms) {
  uint64_t deadline = fr_now_ns() + (uint64_t)timeout_ms * 1000000ull;
  while (!c->ready && !c->load_error && !c->stop_loop) {
    if (fr_now_ns() > deadline) return fr_errorf(FR_ETIMEOUT, "workers not ready after %d ms", timeout_ms);
    int rc = coord__loop_once(c, 200);
    if (rc) return rc;
  }
  if (c->load_error) return c->load_error;
  if (!c->ready) return fr_errorf(FR_ECANCELED, "stopped before the workers were ready");
  return 0;
}

static void coord__stats_dump(coord_t *c) {
  if (!c->step_stats_path || !c->stats.n) return;
  FILE *f = fopen(c->step_stats_path, "w");
  if (!f) {
    FR_LOGW("%s: %s", c->step_stats_path, strerror(errno));
    return;
  }
  fprintf(f, "# coordinator time per step: wall_ns cpu_ns to_next_step_ns items\n");
  const uint32_t *u = c->stats.us;
  for (size_t i = 0; i + 4 <= c->stats.n; i += 4) fprintf(f, "%u %u %u %u\n", u[i], u[i + 1], u[i + 2], u[i + 3]);
  fclose(f);
}

int coord_run(coord_t *c) {
  int rc = 0;
  while (!c->stop_loop && rc == 0) {
    rc = coord__loop_once(c, 200);
    if (c->load_error) {
      rc = c->load_error;
      FR_LOGE("%s", fr_last_error());
    }
  }
  coord__stats_dump(c);
  return rc;
}

void coord_drain(coord_t *c) {
  if (c->draining) return;
  c->draining = true;
  if (c->hook_drain) c->hook_drain(c->hook_arg);
  /* jobs still waiting for workers that never came would never finish */
  if (!c->ready && c->n_steps == 0) c->stop_loop = true;
}

/* ---- destroy ------------------------------------------------------------------- */

static void coord__unlink_segments(coord_t *c) {
  char what[KV_WHAT_MAX];
  if (c->comm_gen) shm_unlink(c->comm_id + 4); /* a CPU group's, if rank 0 did not get to it */
  for (int r = 0; r < COORD_MAX_WORKERS; r++) {
    snprintf(what, sizeof what, "kvpool%d", r);
    kv_segment_unlink(c->instance, what);
    snprintf(what, sizeof what, "logits%d", r);
    kv_segment_unlink(c->instance, what);
  }
}

void coord_destroy(coord_t *c) {
  if (!c) return;
  coord__workers_stop(c);
  coord__prompts_deinit(c);
  coord__jobs_destroy(c);
  if (c->wsock) zmq_close(c->wsock);
  if (c->rsock) zmq_close(c->rsock);
  if (c->isock) zmq_close(c->isock);
  if (c->msock) zmq_close(c->msock);
  free(c->fd_conn);
  coord__auth_deinit(c);
  coord__remote_free(c);
  if (c->zctx) zmq_ctx_term(c->zctx);
  if (c->rpc_addr && !strncmp(c->rpc_addr, "ipc://", 6) && c->pidfile[0]) unlink(c->rpc_addr + 6);
  if (!strncmp(c->worker_addr, "ipc://", 6)) unlink(c->worker_addr + 6);
  if (c->pidfile[0]) unlink(c->pidfile);
  kv_segment_detach(&c->logits_seg);
  coord__mbox_deinit(c);
  kv_control_destroy(c->kv);
  if (c->instance[0]) coord__unlink_segments(c);
  if (c->sigfd >= 0) close(c->sigfd);
  model_tokenizer_destroy(c->tok);
  model_gscratch_destroy(c->gscratch);
  model_gvocab_destroy(c->gvocab);
  model_source_close(c->src);
  proto_msg_free(&c->in);
  proto_buf_free(&c->out);
  proto_buf_free(&c->wout);
  coord_sched_deinit(&c->sched);
  free(c->pitems), free(c->touched), free(c->res_by_slot), free(c->hash), free(c->copies);
  free(c->stats.us);
  free(c->model_path), free(c->served_name), free(c->device), free(c->rpc_addr), free(c->worker_exe);
  free(c->step_stats_path);
  free(c);
}

/* ---- accessors ------------------------------------------------------------------ */

void *coord_zmq_ctx(const coord_t *c) { return c->zctx; }
const char *coord_inproc_endpoint(const coord_t *c) { return c->inproc_addr; }
const char *coord_rpc_endpoint(const coord_t *c) { return c->rpc_addr; }
const char *coord_instance(const coord_t *c) { return c->instance; }
int coord_max_model_len(const coord_t *c) { return c->max_model_len; }
bool coord_kv_sized(const coord_t *c) { return c->kv != NULL; }
const struct model_tokenizer *coord_tokenizer(const coord_t *c) { return c->tok; }
const char *coord_served_model_name(const coord_t *c) { return c->served_name; }

void coord_set_hooks(coord_t *c, void (*ready)(void *, bool), void (*drain)(void *), void *arg) {
  c->hook_ready = ready;
  c->hook_drain = drain;
  c->hook_arg = arg;
  if (ready && c->ready) ready(arg, true);
}

void coord_set_metrics(coord_t *c, struct coord_metrics *m) { c->metrics = m; }
