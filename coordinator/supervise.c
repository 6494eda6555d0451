/* supervise.c - the worker processes: fork/exec, registration (hello), load,
 * heartbeats, death (SIGCHLD or silence) and restart, shutdown.
 *
 * A worker that dies is restarted; the step in flight is dropped (its
 * results, if any arrive, carry an old epoch) and every running job is
 * preempted, so it is recomputed from its tokens once the new worker has
 * loaded. Blocks committed to the prefix cache stay valid: they were
 * written by steps whose results arrived, in a KV pool segment that
 * outlives the worker.
 *
 * Restarts are limited by rate, not by count: the first few deaths within a
 * window restart at once, later ones wait twice as long each time (up to
 * restart_backoff_max_ms), and the server never gives up on a worker that
 * has loaded once; while one is down the server is not ready (/health 503)
 * and jobs wait. A worker that says nothing for longer than a step should
 * take (a multiple of the slowest recent time per token times the step's
 * tokens, at least a few seconds) is taken for hung, killed and restarted.
 *
 * Tensor parallel (several ranks): loads go out once every rank said hello,
 * with the group's rendezvous; a rank that dies or hangs takes its peers
 * down with it (they are killed, not counted as deaths) and the group
 * restarts together, the running jobs recomputed as with one worker.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "common/fr_err.h"
#include "common/fr_log.h"
#include "common/fr_util.h"
#include "coordinator/coord_impl.h"

#define COORD_HB_PERIOD_MS 1000
#define COORD_LOAD_TIMEOUT_MS 300000
#define COORD_RESTART_WINDOW_MS 60000ull /* deaths older than this do not slow restarts */
#define COORD_RESTARTS_AT_ONCE 3         /* deaths in the window restarted without waiting */
#define COORD_BACKOFF_FIRST_MS 500ull    /* the first wait; each later death doubles it */
#define COORD_STEP_SLACK 8               /* a step may take this many times the expected time */
#define COORD_STEP_MIN_TIMEOUT_MS 5000ull
#define COORD_STEP_TIMEOUT_MS 300000ull  /* the first step after a start (graph capture, warm-up) */

static void coord__remote_drop(coord_t *c, coord_worker_t *w, const char *why);
static void coord__remote_lost(coord_t *c, coord_worker_t *w, const char *why);

static int coord__spawn(coord_t *c, coord_worker_t *w) {
  char rank[16], world[16], ppid[16];
  snprintf(rank, sizeof rank, "%d", w->rank);
  snprintf(world, sizeof world, "%d", c->n_workers);
  snprintf(ppid, sizeof ppid, "%d", (int)getpid());
  bool curve = c->curve_on && proto_endpoint_tcp(c->worker_addr);
  char *argv[] = {c->worker_exe, "--connect", c->worker_addr, "--instance", c->instance, "--rank", rank,
                  "--world-size", world, "--device", c->device, "--coord-pid", ppid,
                  curve ? "--server-key" : NULL, c->curve.pub, NULL};
  pid_t pid = fork();
  if (pid < 0) return fr_errorf(-errno, "fork: %s", strerror(errno));
  if (pid == 0) {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    /* a worker of this host authenticates with the server's own pair (in its
     * environment, which only its user can read, rather than in argv) */
    if (curve) setenv(PROTO_CURVE_ENV, c->curve.sec, 1);
    execv(argv[0], argv);
    fprintf(stderr, "ferrumctl: exec %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  w->pid = pid;
  w->state = COORD_W_STARTING;
  w->spawn_ns = w->last_rx_ns = fr_now_ns();
  w->ident_len = 0;
  FR_LOGI("worker %d started (pid %d)", w->rank, (int)pid);
  return 0;
}

/* A remote rank waits for its hello (it is started elsewhere). */
static void coord__remote_wait(coord_t *c, coord_worker_t *w) {
  w->state = COORD_W_STARTING;
  w->ident_len = 0;
  w->last_rx_ns = fr_now_ns();
  FR_LOGI("worker %d is remote: waiting for it on %s", w->rank, c->worker_addr);
}

int coord__workers_start(coord_t *c) {
  for (int r = 0; r < c->n_workers; r++) {
    coord_worker_t *w = &c->workers[r];
    w->rank = r;
    if (w->remote) {
      coord__remote_wait(c, w);
      continue;
    }
    int rc = coord__spawn(c, w);
    if (rc) return rc;
  }
  return 0;
}

int coord__worker_send_buf(coord_t *c, coord_worker_t *w, const proto_buf_t *b) {
  if (w->ident_len == 0) return fr_errorf(FR_EDEAD, "worker %d is not registered", w->rank);
  if (zmq_send(c->wsock, w->ident, w->ident_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
      zmq_send(c->wsock, b->data, b->len, ZMQ_DONTWAIT) < 0)
    return fr_errorf(errno == EHOSTUNREACH ? FR_EDEAD : FR_EZMQ, "send to worker %d: %s", w->rank,
                     zmq_strerror(errno));
  return 0;
}

int coord__worker_send(coord_t *c, coord_worker_t *w, proto_type_t type, const void *body) {
  int rc = proto_encode(&c->wout, type, body);
  return rc ? rc : coord__worker_send_buf(c, w, &c->wout);
}

static int coord__send_load(coord_t *c, coord_worker_t *w) {
  char threads[16], mt[16], ms[16], dev[64];
  snprintf(threads, sizeof threads, "%d", c->cfg.threads);
  snprintf(mt, sizeof mt, "%d", c->cfg.max_num_batched_tokens);
  snprintf(ms, sizeof ms, "%d", c->cfg.max_num_seqs);
  int rc = kern_device_for_rank(c->device, w->rank, c->n_workers, dev, sizeof dev); /* checked at create */
  if (rc) return rc;
  char bs[16], mb[16];
  snprintf(bs, sizeof bs, "%d", c->cfg.block_size);
  int rows = c->kv ? c->kvi.max_blocks_per_seq : (c->cfg.max_model_len + c->cfg.block_size - 1) / c->cfg.block_size;
  snprintf(mb, sizeof mb, "%d", rows); /* sizing: at least the rows the control segment will have */
  proto_option_t opts[14] = {{"device", dev}, {"threads", threads}, {"max_tokens", mt}, {"max_seqs", ms},
                            {"fake_forward", c->cfg.fake_workers ? "1" : "0"}};
  uint32_t n_opts = 5;
  if (c->cfg.kv_cache_dtype && strcmp(c->cfg.kv_cache_dtype, "auto"))
    opts[n_opts++] = (proto_option_t){"kv_cache_dtype", (char *)c->cfg.kv_cache_dtype};
  if (c->cfg.quantization) opts[n_opts++] = (proto_option_t){"quantization", (char *)c->cfg.quantization};
  if (c->cfg.spec.num_speculative_tokens > 0 && c->cfg.spec.draft_model[0]) /* speculative decoding's draft */
    opts[n_opts++] = (proto_option_t){"draft", c->cfg.spec.draft_model};
  if (c->cfg.embed) opts[n_opts++] = (proto_option_t){"pooling", (char *)model_pooling_name(c->pooling)};
  if (c->n_workers > 1) opts[n_opts++] = (proto_option_t){"comm", c->comm_id};
  if (c->n_workers > 1 && c->n_remote) opts[n_opts++] = (proto_option_t){"multi_host", "1"};
  if (w->remote) { /* the control segment's geometry, which it cannot map */
    opts[n_opts++] = (proto_option_t){"remote", "1"};
    opts[n_opts++] = (proto_option_t){"block_size", bs};
    opts[n_opts++] = (proto_option_t){"max_blocks", mb};
  }
  proto_load_t l = {.path = c->model_path,
                    .format = (char *)(c->cfg.load_format ? c->cfg.load_format : "auto"),
                    .tp_size = (uint32_t)c->n_workers,
                    .n_options = n_opts,
                    .options = opts,
                    .kv_min_blocks = 1};
  if (c->kv) { /* fixed from the start, or sized before this worker restarted */
    l.kv_blocks = (uint32_t)c->kvi.n_blocks;
  } else {
    l.block_size = (uint32_t)c->cfg.block_size;
    l.kv_min_blocks = c->kv_min_blocks;
    l.kv_bytes = c->cfg.kv_cache_memory_bytes;
    l.kv_util = l.kv_bytes ? 0.0f : (float)c->cfg.gpu_memory_utilization;
  }
  return coord__worker_send(c, w, PROTO_T_LOAD, &l);
}

int coord__workers_ready_count(const coord_t *c) {
  int n = 0;
  for (int r = 0; r < c->n_workers; r++) n += c->workers[r].state == COORD_W_READY;
  return n;
}

bool coord__workers_ready(const coord_t *c) { return coord__workers_ready_count(c) == c->n_workers; }

/* Makes the coordinator the owner of a worker's segments, so that a stale
 * scan by another server never removes them while this one lives (a worker
 * that dies leaves them to its successor). */
static void coord__own_segments(coord_t *c, int rank) {
  if (c->workers[rank].remote) return;
  const char *kinds[2] = {"kvpool", "logits"};
  for (int k = 0; k < 2; k++) {
    char what[KV_WHAT_MAX];
    kv_segment_t seg;
    snprintf(what, sizeof what, "%s%d", kinds[k], rank);
    if (kv_segment_attach(&seg, c->instance, what, KV_SEG_RDWR) != 0) continue;
    if (kv_segment_header(&seg)->owner_pid != (int32_t)getpid()) kv_segment_adopt(&seg, c->epoch);
    kv_segment_detach(&seg);
  }
}

static void coord__set_ready(coord_t *c, bool ready) {
  if (c->ready == ready) return;
  c->ready = ready;
  if (ready && !c->logits_seg.base && !c->workers[0].remote) { /* a remote rank 0 returns no logits */
    char what[KV_WHAT_MAX];
    snprintf(what, sizeof what, "logits0");
    if (kv_segment_attach(&c->logits_seg, c->instance, what, KV_SEG_RDONLY))
      FR_LOGW("logits segment: %s", fr_last_error());
  }
  if (c->hook_ready) c->hook_ready(c->hook_arg, ready);
}

/* The group's rendezvous for the loads about to go out: rank 0's NCCL id
 * (GPUs), or a fresh shared memory name (CPUs; the last group's segment,
 * if a rank died before rank 0 unlinked it, goes). */
static void coord__comm_id(coord_t *c, const proto_hello_t *rank0) {
  if (rank0->comm_id && !strncmp(rank0->comm_id, "nccl:", 5)) {
    snprintf(c->comm_id, sizeof c->comm_id, "%s", rank0->comm_id);
    return;
  }
  if (c->comm_gen) shm_unlink(c->comm_id + 4);
  snprintf(c->comm_id, sizeof c->comm_id, "shm:/ferrum-%s-tp%u", c->instance, ++c->comm_gen);
}

/* Every rank registered: the loads go out together (the ranks join their
 * group inside the load, which waits for all of them). */
static void coord__group_load(coord_t *c) {
  for (int r = 0; r < c->n_workers; r++)
    if (c->workers[r].state != COORD_W_REGISTERED) return;
  if (c->n_remote) coord__remote_reset(c); /* fresh remote workers hold no tables */
  for (int r = 0; r < c->n_workers; r++) {
    coord_worker_t *w = &c->workers[r];
    w->state = COORD_W_LOADING;
    FR_LOGI("worker %d registered; loading %s", w->rank, c->model_path);
    if (coord__send_load(c, w)) FR_LOGE("%s", fr_last_error());
  }
}

/* A worker registers. What is checked: the rank and world size it was
 * started with, and its pid (when it sends one) against the one forked for
 * that rank. Its dev / kvb / bs / mb are not read: a worker learns its
 * device and KV pool from the load that follows (docs/PROTOCOL.md). */
static void coord__on_hello(coord_t *c, const uint8_t *ident, size_t len, const proto_hello_t *h) {
  if (h->rank < 0 || h->rank >= c->n_workers || h->world_size != c->n_workers) {
    FR_LOGW("hello from rank %d of %d ignored: this coordinator runs %d workers", h->rank, h->world_size,
            c->n_workers);
    return;
  }
  coord_worker_t *w = &c->workers[h->rank];
  if (w->remote && w->state != COORD_W_STARTING && w->state != COORD_W_DOWN)
    coord__remote_lost(c, w, "said hello again (restarted): the old one is gone");
  if (w->remote && w->state == COORD_W_DOWN) w->state = COORD_W_STARTING;
  if (w->state != COORD_W_STARTING || (!w->remote && h->pid && (pid_t)h->pid != w->pid)) {
    FR_LOGW("unexpected hello from rank %d (pid %u) ignored", h->rank, h->pid);
    return;
  }
  if (w->remote) FR_LOGI("remote worker %d joined", w->rank);
  w->last_rx_ns = fr_now_ns();
  memcpy(w->ident, ident, len);
  w->ident_len = (uint8_t)len;
  w->state = COORD_W_REGISTERED;
  if (h->rank == 0 && c->n_workers > 1) coord__comm_id(c, h);
  coord__group_load(c);
}

static void coord__worker_ready(coord_t *c, coord_worker_t *w) {
  w->state = COORD_W_READY;
  coord__own_segments(c, w->rank);
  FR_LOGI("worker %d ready", w->rank);
  if (coord__workers_ready(c)) coord__set_ready(c, true);
}

/* Every worker said how many blocks it can hold: the pool gets the fewest,
 * the control segment is made, and the workers are told to allocate. */
static void coord__kv_init(coord_t *c) {
  uint32_t n = UINT32_MAX;
  uint64_t bpb = 0;
  for (int r = 0; r < c->n_workers; r++) {
    n = FR_MIN(n, c->workers[r].kv_capacity);
    bpb = FR_MAX(bpb, c->workers[r].kv_block_bytes);
  }
  int rc = n > (uint32_t)INT32_MAX ? fr_errorf(FR_ETOOBIG, "%u KV blocks", n) : coord__kv_create(c, (int)n, bpb);
  if (rc) {
    c->load_error = fr_errorf(rc, "KV control segment: %s", fr_last_error());
    return;
  }
  proto_kv_init_t k = {.kv_blocks = n};
  for (int r = 0; r < c->n_workers && !c->load_error; r++) {
    coord_worker_t *w = &c->workers[r];
    w->state = COORD_W_KV_INIT;
    if (coord__worker_send(c, w, PROTO_T_KV_INIT, &k))
      c->load_error = fr_errorf(FR_EDEAD, "worker %d: %s", r, fr_last_error());
  }
}

static void coord__on_loaded(coord_t *c, coord_worker_t *w, const proto_loaded_t *l) {
  if (w->state != COORD_W_LOADING) return;
  if (l->error.code) {
    FR_LOGE("worker %d failed to load the model: %s", w->rank, l->error.message ? l->error.message : "?");
    c->load_error = fr_errorf(FR_EFORMAT, "worker %d: %s", w->rank, l->error.message ? l->error.message : "load failed");
    return;
  }
  if ((int)l->n_vocab != c->vocab || (c->kv && (int)l->kv_blocks != c->kvi.n_blocks) || l->kv_blocks == 0) {
    c->load_error = fr_errorf(FR_ESTATE, "worker %d loaded a vocabulary of %u and %u KV blocks, expected %d and %d",
                              w->rank, l->n_vocab, l->kv_blocks, c->vocab, c->kv ? c->kvi.n_blocks : -1);
    return;
  }
  if (c->cfg.embed && (int)l->n_embd != c->n_embd) {
    c->load_error = fr_errorf(FR_ESTATE, "worker %d loaded embeddings of %u floats, expected %d", w->rank, l->n_embd,
                              c->n_embd);
    return;
  }
  if (c->kv) {
    coord__worker_ready(c, w);
    return;
  }
  w->state = COORD_W_SIZED;
  w->kv_capacity = l->kv_blocks;
  w->kv_block_bytes = l->block_bytes;
  FR_LOGI("worker %d loaded: room for %u KV blocks", w->rank, l->kv_blocks);
  for (int r = 0; r < c->n_workers; r++)
    if (c->workers[r].state != COORD_W_SIZED) return;
  coord__kv_init(c);
}

static void coord__on_kv_ready(coord_t *c, coord_worker_t *w, const proto_kv_ready_t *k) {
  if (w->state != COORD_W_KV_INIT) return;
  if (k->error.code) {
    FR_LOGE("worker %d failed to allocate its KV pool: %s", w->rank, k->error.message ? k->error.message : "?");
    c->load_error =
        fr_errorf(FR_EDEVOOM, "worker %d: %s", w->rank, k->error.message ? k->error.message : "KV pool failed");
    return;
  }
  if ((int)k->kv_blocks != c->kvi.n_blocks) {
    c->load_error = fr_errorf(FR_ESTATE, "worker %d allocated %u KV blocks, expected %d", w->rank, k->kv_blocks,
                              c->kvi.n_blocks);
    return;
  }
  coord__worker_ready(c, w);
}

void coord__workers_on_message(coord_t *c, const uint8_t *ident, size_t len, const proto_msg_t *m) {
  if (m->type == PROTO_T_HELLO) {
    coord__on_hello(c, ident, len, &m->u.hello);
    return;
  }
  coord_worker_t *w = NULL;
  for (int r = 0; r < c->n_workers; r++)
    if (c->workers[r].ident_len == len && !memcmp(c->workers[r].ident, ident, len)) w = &c->workers[r];
  if (!w) return; /* a dead worker's late message */
  w->last_rx_ns = fr_now_ns();
  switch (m->type) {
  case PROTO_T_LOADED: coord__on_loaded(c, w, &m->u.loaded); break;
  case PROTO_T_KV_READY: coord__on_kv_ready(c, w, &m->u.kv_ready); break;
  case PROTO_T_RESULT: coord__step_on_result(c, &m->u.result, w->rank); break;
  case PROTO_T_ERROR: FR_LOGW("worker %d: error %d: %s", w->rank, m->u.error.code, m->u.error.message ? m->u.error.message : ""); break;
  default: break;
  }
}

/* Whether the KV pool outlives a worker: a CPU worker's lives in a shared
 * memory segment of this host; a GPU's or a remote worker's dies with it. */
static bool coord__pool_survives(const coord_t *c) { return !c->n_remote && !strncmp(c->device, "cpu", 3); }

/* Drops the step in flight and sends every running job back to the queue;
 * when the pool died with the worker, the prefix cache forgets its blocks
 * (their KV is gone: a hit would read garbage). */
static void coord__recompute_all(coord_t *c) {
  if (c->step_busy) coord__step_abort(c);
  else c->epoch++;
  coord_sched_requeue_all(&c->sched);
  if (c->kv && !coord__pool_survives(c)) {
    int n = kv_prefix_forget(c->kv);
    if (n) FR_LOGI("prefix cache: %d blocks forgotten with the worker's KV pool", n);
  }
}

/* Records a death and returns how long to wait before the restart: nothing
 * for the first deaths in the window, then doubling up to the maximum. */
static uint64_t coord__restart_delay_ms(coord_t *c, coord_worker_t *w, uint64_t now) {
  memmove(w->deaths_ns + 1, w->deaths_ns, (COORD_DEATHS_KEPT - 1) * sizeof w->deaths_ns[0]);
  w->deaths_ns[0] = now;
  int recent = 0;
  for (int i = 0; i < COORD_DEATHS_KEPT; i++)
    if (w->deaths_ns[i] && now - w->deaths_ns[i] < COORD_RESTART_WINDOW_MS * 1000000ull) recent++;
  if (recent <= COORD_RESTARTS_AT_ONCE) return 0;
  int doublings = FR_MIN(recent - COORD_RESTARTS_AT_ONCE - 1, 20);
  return FR_MIN(COORD_BACKOFF_FIRST_MS << doublings, (uint64_t)c->cfg.restart_backoff_max_ms);
}

/* Tensor parallel: one rank down takes its group down (its peers would
 * wait in their next all-reduce for good); they restart together. */
static void coord__group_kill(coord_t *c, const coord_worker_t *dead) {
  for (int r = 0; r < c->n_workers; r++) {
    coord_worker_t *p = &c->workers[r];
    if (p != dead && p->remote && p->ident_len) coord__remote_drop(c, p, "its group restarts");
    if (p == dead || !p->pid || p->group_kill) continue;
    FR_LOGW("worker %d: restarting with rank %d", p->rank, dead->rank);
    p->group_kill = true;
    kill(p->pid, SIGKILL);
  }
}

/* A remote rank leaves the group: told to exit (its supervisor, a pod or a
 * service manager, starts it again, and it says hello), forgotten here. */
static void coord__remote_drop(coord_t *c, coord_worker_t *w, const char *why) {
  proto_shutdown_t sd = {.reason = (char *)why};
  if (w->ident_len) coord__worker_send(c, w, PROTO_T_SHUTDOWN, &sd);
  w->state = COORD_W_STARTING;
  w->ident_len = 0;
  w->last_rx_ns = fr_now_ns();
}

/* A remote rank is gone (silent past its limit, or a new process said hello
 * for it): as a death, its jobs are recomputed once the group is back; its
 * peers restart with it. */
static void coord__remote_lost(coord_t *c, coord_worker_t *w, const char *why) {
  FR_LOGW("remote worker %d %s", w->rank, why);
  coord__remote_drop(c, w, why);
  w->restarts++;
  coord__set_ready(c, false);
  coord__recompute_all(c);
  c->step_ns_per_token = 0;
  if (c->n_workers > 1) coord__group_kill(c, w);
}

void coord__workers_remote_unreachable(coord_t *c, coord_worker_t *w) {
  coord__remote_lost(c, w, "cannot be reached: taken for gone");
}

/* A peer killed by coord__group_kill: no backoff of its own; it starts
 * again with the rank that died. */
static void coord__on_group_death(coord_t *c, coord_worker_t *w) {
  w->group_kill = false;
  w->pid = 0;
  w->state = COORD_W_DOWN;
  w->ident_len = 0;
  if (!c->stop_loop && !c->load_error) w->respawn_ns = FR_MAX(c->group_respawn_ns, 1);
}

static void coord__on_death(coord_t *c, coord_worker_t *w, int status) {
  if (w->group_kill) {
    coord__on_group_death(c, w);
    return;
  }
  if (WIFSIGNALED(status)) FR_LOGW("worker %d (pid %d) killed by signal %d", w->rank, (int)w->pid, WTERMSIG(status));
  else FR_LOGW("worker %d (pid %d) exited with status %d", w->rank, (int)w->pid, WEXITSTATUS(status));
  bool was_loaded = w->state == COORD_W_READY;
  w->pid = 0;
  w->state = COORD_W_DOWN;
  w->ident_len = 0;
  coord__set_ready(c, false);
  coord__recompute_all(c);
  c->step_ns_per_token = 0; /* the new worker's first step warms up again */
  if (c->n_workers > 1) coord__group_kill(c, w);
  if (c->stop_loop) return;
  if (!was_loaded && !c->n_steps && !w->restarts && c->load_error == 0)
    c->load_error = fr_errorf(FR_EDEAD, "worker %d died while loading the model", w->rank);
  if (c->load_error) return;
  w->restarts++;
  uint64_t now = fr_now_ns(), delay = coord__restart_delay_ms(c, w, now);
  if (delay) FR_LOGW("worker %d keeps dying: restarting it in %.1f s", w->rank, delay / 1e3);
  w->respawn_ns = c->group_respawn_ns = now + delay * 1000000ull;
  for (int r = 0; r < c->n_workers; r++) /* peers already down wait for it too */
    if (c->workers[r].respawn_ns) c->workers[r].respawn_ns = c->group_respawn_ns;
}

/* Starts the workers whose restart is due. A failed start (fork) is a
 * death too: it is tried again after the backoff. */
static void coord__workers_respawn(coord_t *c, uint64_t now) {
  for (int r = 0; r < c->n_workers; r++) {
    coord_worker_t *w = &c->workers[r];
    if (w->remote || w->pid || !w->respawn_ns || now < w->respawn_ns || c->stop_loop) continue;
    w->respawn_ns = 0;
    if (coord__spawn(c, w) == 0) continue;
    FR_LOGE("restarting worker %d: %s", w->rank, fr_last_error());
    w->respawn_ns = now + FR_MAX(coord__restart_delay_ms(c, w, now), COORD_BACKOFF_FIRST_MS) * 1000000ull;
  }
}

void coord__workers_on_sigchld(coord_t *c) {
  int status;
  pid_t pid;
  while ((pid = waitpid(-1, &status, WNOHANG)) > 0)
    for (int r = 0; r < c->n_workers; r++)
      if (c->workers[r].pid == pid) coord__on_death(c, &c->workers[r], status);
}

/* How long a loaded worker may stay silent: the heartbeat timeout, or
 * while a step is in flight (heartbeats wait for it) the time that step
 * should take with slack, at least COORD_STEP_MIN_TIMEOUT_MS. */
static uint64_t coord__silence_limit_ms(const coord_t *c) {
  uint64_t limit = (uint64_t)c->cfg.worker_hb_timeout_ms;
  if (!c->step_busy) return limit;
  if (c->step_ns_per_token <= 0) return FR_MAX(limit, COORD_STEP_TIMEOUT_MS);
  double expect_ms = c->step_ns_per_token * FR_MAX(c->step_tokens, 1) / 1e6;
  uint64_t step_ms = (uint64_t)FR_MIN(COORD_STEP_SLACK * expect_ms, (double)COORD_STEP_TIMEOUT_MS);
  return FR_MAX(step_ms, COORD_STEP_MIN_TIMEOUT_MS);
}

void coord__workers_tick(coord_t *c) {
  coord__workers_respawn(c, fr_now_ns());
  uint64_t now = fr_now_ns(); /* after the spawns, which stamp their workers' last_rx_ns */
  bool hb = now >= c->next_hb_ns;
  if (hb) c->next_hb_ns = now + COORD_HB_PERIOD_MS * 1000000ull;
  uint64_t limit = coord__silence_limit_ms(c);
  for (int r = 0; r < c->n_workers; r++) {
    coord_worker_t *w = &c->workers[r];
    if (w->remote ? w->ident_len == 0 : w->pid == 0) continue; /* not running, or not joined yet */
    uint64_t quiet_ms = now > w->last_rx_ns ? (now - w->last_rx_ns) / 1000000 : 0;
    /* loaded workers answer heartbeats, also while they wait for the others (SIZED) */
    bool live = w->state == COORD_W_READY || w->state == COORD_W_SIZED;
    bool stuck = (live && quiet_ms > limit) || (!live && quiet_ms > COORD_LOAD_TIMEOUT_MS);
    if (stuck && w->remote) {
      coord__remote_lost(c, w, "went silent: taken for gone");
      continue;
    }
    if (stuck) {
      FR_LOGW("worker %d silent for %llu ms (limit %llu ms): killing it", w->rank, (unsigned long long)quiet_ms,
              (unsigned long long)limit);
      kill(w->pid, SIGKILL);
      w->last_rx_ns = now; /* SIGCHLD follows */
      continue;
    }
    if (hb && live) {
      proto_heartbeat_t h = {.rank = -1, .seq = ++w->hb_seq, .ts_ns = now};
      coord__worker_send(c, w, PROTO_T_HEARTBEAT, &h);
    }
  }
}

void coord__workers_stop(coord_t *c) {
  proto_shutdown_t sd = {.reason = "coordinator exiting", .drain = true};
  for (int r = 0; r < c->n_workers; r++)
    if ((c->workers[r].pid || c->workers[r].remote) && c->workers[r].ident_len)
      coord__worker_send(c, &c->workers[r], PROTO_T_SHUTDOWN, &sd);
  uint64_t deadline = fr_now_ns() + 5000000000ull;
  for (int r = 0; r < c->n_workers; r++) {
    coord_worker_t *w = &c->workers[r];
    if (!w->pid) continue;
    int status;
    while (waitpid(w->pid, &status, WNOHANG) == 0) {
      if (fr_now_ns() > deadline) {
        kill(w->pid, SIGKILL);
        waitpid(w->pid, &status, 0);
        break;
      }
      usleep(10000);
    }
    w->pid = 0;
    w->state = COORD_W_DOWN;
  }
}
