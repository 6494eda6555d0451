/* main.c - ferrum-worker: registration, the message loop, exit rules.
 *
 * usage: ferrum-worker --connect (or --coordinator) ENDPOINT [--instance ID] [--rank R]
 *                      [--world-size N] [--device DEV] [--coord-pid PID]
 *                      [--hb-timeout-ms MS] [--curve-key FILE --server-key KEY]
 *
 * The coordinator starts its local workers with --instance (they map its
 * shared memory). A remote worker, on another host, is started by hand or
 * by its pod with --connect tcp://COORDINATOR:PORT and no --instance; a
 * tcp:// endpoint other hosts reach needs CURVE: this worker's key pair
 * (--curve-key, or FERRUM_CURVE_SECRET_KEY) and the coordinator's public
 * key (--server-key, Z85 or a file, or FERRUM_SERVER_KEY).
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>
#include <zmq.h>

#include "common/fr_err.h"
#include "common/fr_log.h"
#include "common/fr_util.h"
#include "proto/curve.h"
#include "worker/worker.h"

static volatile sig_atomic_t worker_stop;

static void worker__on_signal(int sig) { worker_stop = sig; }

static int worker__parse(int argc, char **argv, worker_args_t *a) {
  static const struct option lo[] = {{"connect", required_argument, 0, 'c'},
                                     {"coordinator", required_argument, 0, 'c'}, /* another name for --connect */
                                     {"instance", required_argument, 0, 'i'},
                                     {"rank", required_argument, 0, 'r'},
                                     {"world-size", required_argument, 0, 'w'},
                                     {"coord-pid", required_argument, 0, 'p'},
                                     {"hb-timeout-ms", required_argument, 0, 't'},
                                     {"device", required_argument, 0, 'd'},
                                     {"curve-key", required_argument, 0, 'k'},
                                     {"server-key", required_argument, 0, 's'},
                                     {0, 0, 0, 0}};
  *a = (worker_args_t){.world_size = 1, .hb_timeout_ms = 30000};
  int c;
  while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
    switch (c) {
    case 'c': a->connect = optarg; break;
    case 'i': a->instance = optarg; break;
    case 'r': a->rank = atoi(optarg); break;
    case 'w': a->world_size = atoi(optarg); break;
    case 'p': a->coord_pid = (pid_t)atol(optarg); break;
    case 't': a->hb_timeout_ms = atoi(optarg); break;
    case 'd': a->device = optarg; break;
    case 'k': a->curve_key = optarg; break;
    case 's': a->server_key = optarg; break;
    default: return -1;
    }
  }
  if (!a->connect || a->rank < 0 || a->world_size < 1 || a->rank >= a->world_size) return -1;
  if (!a->server_key) a->server_key = getenv(PROTO_CURVE_SERVER_ENV);
  return 0;
}

/* CURVE on the connection to the coordinator: where a server key is given,
 * or required where the endpoint is tcp:// beyond this host. */
static int worker__curve(worker_t *w) {
  const worker_args_t *a = &w->args;
  bool wide = proto_endpoint_tcp(a->connect) && !proto_endpoint_loopback(a->connect);
  if (!a->server_key || !*a->server_key)
    return wide ? fr_errorf(FR_EAUTH, "%s reaches beyond this host: give --server-key (the coordinator's public key) "
                                      "and --curve-key (this worker's key pair)", a->connect)
                : 0;
  char server[PROTO_CURVE_Z85];
  proto_curve_pair_t kp;
  bool found;
  int rc = proto_curve_public(server, a->server_key);
  if (!rc) rc = proto_curve_find(&kp, a->curve_key, &found);
  if (!rc && !found) rc = fr_errorf(FR_EAUTH, "--server-key needs this worker's key pair (--curve-key or %s)", PROTO_CURVE_ENV);
  if (!rc) rc = proto_curve_client(w->sock, &kp, server);
  return rc;
}

/* Sends a message; a step's result goes back through the mailbox when the
 * step came through it (and it is free: else over ZeroMQ), with a doorbell
 * when the coordinator sleeps. */
static int worker__send(worker_t *w, proto_type_t type, const void *body) {
  int rc = proto_encode(&w->out, type, body);
  if (rc) return rc;
  int r = w->via_mbox && type == PROTO_T_RESULT ? proto_mbox_post(w->up, w->out.data, w->out.len) : PROTO_MBOX_BUSY;
  if (r == PROTO_MBOX_POSTED) return 0;
  if (r == PROTO_MBOX_RING ? zmq_send(w->sock, NULL, 0, 0) < 0 : zmq_send(w->sock, w->out.data, w->out.len, 0) < 0)
    return fr_errorf(FR_EZMQ, "send %s: %s", proto_type_name(type), zmq_strerror(errno));
  return 0;
}

/* Rank 0 of a group on GPUs makes the NCCL rendezvous the others join
 * (the coordinator passes it on in their loads). */
static void worker__comm_id(const worker_t *w, char *id, size_t cap) {
  id[0] = 0;
  if (w->args.rank != 0 || w->args.world_size < 2 || !w->args.device || strncmp(w->args.device, "cuda", 4)) return;
  if (kern_nccl_new_id(id, cap)) FR_LOGE("tensor parallel: %s", fr_last_error()); /* the load then fails */
}

static int worker__hello(worker_t *w) {
  char id[KERN_COMM_ID_MAX];
  worker__comm_id(w, id, sizeof id);
  proto_hello_t h = {.rank = w->args.rank,
                     .world_size = w->args.world_size,
                     .device = "cpu",
                     .kv_blocks = 0,
                     .block_size = KV_BLOCK_SIZE_DEFAULT,
                     .max_batch = 1,
                     .pid = (uint32_t)getpid(),
                     .comm_id = id[0] ? id : NULL};
  return worker__send(w, PROTO_T_HELLO, &h);
}

static int worker__on_load(worker_t *w, const proto_load_t *l) {
  proto_loaded_t r = {.rank = w->args.rank};
  uint64_t t0 = fr_now_ns();
  int rc = worker_load(w, l);
  if (rc) {
    FR_LOGE("load %s: %s", l->path, fr_last_error());
    r.error.code = proto_err_from_fr(rc);
    r.error.message = (char *)fr_last_error();
  } else if (w->kv_pending) {
    r.kv_blocks = w->kv_capacity;
    r.block_bytes = w->kv_block_bytes;
    r.n_vocab = (uint32_t)w->vocab;
    r.max_ctx = (uint32_t)w->m->cfg.max_ctx;
    r.n_embd = w->m->pooling ? (uint32_t)w->m->cfg.dim : 0;
    FR_LOGI("loaded %s in %.2f s: room for %u KV blocks of %d tokens (%.1f MiB), %d tokens / %d seqs per step",
            l->path, (fr_now_ns() - t0) / 1e9, w->kv_capacity, w->kv_block_size,
            (double)w->kv_capacity * w->kv_block_bytes / 1048576.0, w->max_tokens, w->max_seqs);
  } else {
    r.kv_blocks = (uint32_t)w->info.n_blocks;
    r.n_vocab = (uint32_t)w->vocab;
    r.max_ctx = (uint32_t)w->m->cfg.max_ctx;
    r.n_embd = w->m->pooling ? (uint32_t)w->m->cfg.dim : 0;
    FR_LOGI("loaded %s in %.2f s: %d KV blocks of %d tokens, %d tokens / %d seqs per step", l->path,
            (fr_now_ns() - t0) / 1e9, w->info.n_blocks, w->info.block_size, w->max_tokens, w->max_seqs);
  }
  return worker__send(w, PROTO_T_LOADED, &r);
}

static int worker__on_kv_init(worker_t *w, const proto_kv_init_t *k) {
  proto_kv_ready_t r = {.rank = w->args.rank};
  int rc = worker_kv_init(w, k->kv_blocks);
  if (rc) {
    FR_LOGE("KV pool: %s", fr_last_error());
    r.error.code = proto_err_from_fr(rc);
    r.error.message = (char *)fr_last_error();
  } else {
    r.kv_blocks = (uint32_t)w->info.n_blocks;
  }
  return worker__send(w, PROTO_T_KV_READY, &r);
}

/* Handles one message; returns 1 to exit, 0 to go on, < 0 on a send error. */
static int worker__dispatch(worker_t *w) {
  proto_msg_t *m = &w->in;
  switch (m->type) {
  case PROTO_T_LOAD: return worker__on_load(w, &m->u.load);
  case PROTO_T_KV_INIT: return worker__on_kv_init(w, &m->u.kv_init);
  case PROTO_T_STEP: {
    proto_result_t res;
    worker_step_run(w, &m->u.step, &res);
    return worker__send(w, PROTO_T_RESULT, &res);
  }
  case PROTO_T_HEARTBEAT: {
    proto_heartbeat_t hb = {.rank = w->args.rank, .seq = m->u.heartbeat.seq, .ts_ns = fr_now_ns()};
    return worker__send(w, PROTO_T_HEARTBEAT, &hb);
  }
  case PROTO_T_SHUTDOWN: FR_LOGI("shutdown: %s", m->u.shutdown.reason ? m->u.shutdown.reason : "asked"); return 1;
  case PROTO_T_ERROR: FR_LOGW("coordinator error %d: %s", m->u.error.code, m->u.error.message ? m->u.error.message : ""); return 0;
  default: return 0;
  }
}

/* True when the coordinator is gone: parent changed or silent too long. */
static bool worker__orphaned(const worker_t *w) {
  if (w->args.coord_pid > 0 && getppid() != w->args.coord_pid) return true;
  return w->args.hb_timeout_ms > 0 && (fr_now_ns() - w->last_rx_ns) / 1000000 > (uint64_t)w->args.hb_timeout_ms;
}

/* How long after a message a worker on a GPU polls without sleeping
 * (fr_busy_poll). Longer than a step: rank 0 gets the next step within
 * microseconds of its result, but the other ranks of a group answer once
 * their step is queued on the GPU and wait the whole step for the next
 * one; with 2 ms a TP=2 rank 1 slept through every 3 ms step of
 * Llama-3-8B and woke through ZeroMQ, late. Idle for this long, it sleeps. */
#define WORKER_BUSY_POLL_NS 50000000ull
/* Within that, the mailbox alone is polled this long between passes over
 * the socket (which cost a system call each). */
#define WORKER_MBOX_SPIN_NS 50000ull

static uint64_t worker__busy_poll_ns(const worker_t *w) {
  return fr_busy_poll(w->be && !w->be->host_memory) ? WORKER_BUSY_POLL_NS : 0;
}

/* ---- the step mailboxes (proto/proto_mbox.h) ---- */

/* Maps the coordinator's mailboxes when it made them for this rank (a
 * local worker; a remote one has no --instance) and drops what is in
 * this rank's: it was meant for a predecessor. */
static void worker__mbox_attach(worker_t *w) {
  if (!w->args.instance || kv_segment_attach(&w->mbox_seg, w->args.instance, "steps", KV_SEG_RDWR)) return;
  /* the exact size: a coordinator built with other mailboxes lays them out otherwise */
  if (w->args.rank < 0 || w->args.rank >= w->args.world_size ||
      kv_segment_header(&w->mbox_seg)->data_bytes != proto_mbox_bytes(w->args.world_size)) {
    kv_segment_detach(&w->mbox_seg);
    return;
  }
  w->down = proto_mbox_at(kv_segment_data(&w->mbox_seg), w->args.rank, PROTO_MBOX_DOWN);
  w->up = proto_mbox_at(kv_segment_data(&w->mbox_seg), w->args.rank, PROTO_MBOX_UP);
  proto_mbox_skip(w->down);
}

/* Decodes the message waiting in the mailbox into w->in: 1, 0 when none,
 * -1 when it does not decode (dropped). */
static int worker__mbox_take(worker_t *w) {
  size_t len = 0;
  const void *data = w->down ? proto_mbox_peek(w->down, &len) : NULL;
  if (!data) return 0;
  int rc = proto_msg_decode(&w->in, data, len, PROTO_ACCEPT_WORKER);
  proto_mbox_done(w->down);
  if (!rc) return 1;
  FR_LOGW("bad message in the mailbox: %s", fr_last_error());
  return -1;
}

/* Polls the mailbox alone (memory loads) for up to ns: whether a message came. */
static bool worker__mbox_spin(worker_t *w, uint64_t ns) {
  size_t len;
  uint64_t t0 = fr_now_ns();
  do {
    if (proto_mbox_peek(w->down, &len)) return true;
  } while (fr_now_ns() - t0 < ns);
  return false;
}

/* Waits for the next message, from the mailbox or over ZeroMQ, and decodes
 * it into w->in: 1 with one (*via_mbox says which), 0 with none yet,
 * 2 to exit, < 0 on a poll error. */
static int worker__next(worker_t *w, zmq_msg_t *msg, bool *via_mbox) {
  *via_mbox = false;
  int t = worker__mbox_take(w);
  if (t) return (*via_mbox = t > 0) ? 1 : 0;
  zmq_pollitem_t pi = {.socket = w->sock, .events = ZMQ_POLLIN};
  bool spin = fr_now_ns() - w->last_rx_ns < worker__busy_poll_ns(w);
  if (w->down && spin && worker__mbox_spin(w, WORKER_MBOX_SPIN_NS)) return 0;
  if (w->down && !spin) {
    proto_mbox_sleeping(w->down, true);
    size_t len;
    if (proto_mbox_peek(w->down, &len)) {
      proto_mbox_sleeping(w->down, false);
      return 0;
    }
  }
  int n = zmq_poll(&pi, 1, spin ? 0 : 500);
  if (w->down && !spin) proto_mbox_sleeping(w->down, false);
  if (n < 0 && errno != EINTR) return fr_errorf(FR_EZMQ, "poll: %s", zmq_strerror(errno));
  if (n <= 0) return !spin && worker__orphaned(w) ? 2 : 0;
  if (zmq_msg_recv(msg, w->sock, ZMQ_DONTWAIT) < 0) return 0;
  w->last_rx_ns = fr_now_ns();
  if (zmq_msg_size(msg) == 0) return 0; /* a doorbell: the mailbox has a message */
  if (proto_msg_decode(&w->in, zmq_msg_data(msg), zmq_msg_size(msg), PROTO_ACCEPT_WORKER) == 0) return 1;
  FR_LOGW("bad message from the coordinator: %s", fr_last_error());
  return 0;
}

static int worker__loop(worker_t *w) {
  zmq_msg_t msg;
  zmq_msg_init(&msg);
  int rc = 0;
  while (!worker_stop) {
    bool via_mbox;
    int got = worker__next(w, &msg, &via_mbox);
    if (got == 2) { FR_LOGW("coordinator gone: exiting"); break; }
    if (got < 0) { rc = got; break; }
    if (got == 0) continue;
    w->last_rx_ns = fr_now_ns();
    w->via_mbox = via_mbox;
    int d = worker__dispatch(w);
    w->via_mbox = false;
    w->last_rx_ns = fr_now_ns(); /* a long load or step is not silence */
    if (d == 1) break;
    if (d < 0) FR_LOGE("%s", fr_last_error());
  }
  zmq_msg_close(&msg);
  return rc;
}

int main(int argc, char **argv) {
  worker_t w;
  memset(&w, 0, sizeof w);
  w.pool_seg.fd = w.logits_seg.fd = w.mbox_seg.fd = -1;
  if (worker__parse(argc, argv, &w.args)) {
    fprintf(stderr, "usage: ferrum-worker --connect|--coordinator ENDPOINT [--instance ID] [--rank R] [--world-size N] "
                    "[--device DEV] [--coord-pid PID] [--hb-timeout-ms MS] [--curve-key FILE --server-key KEY]\n");
    return 2;
  }
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (w.args.coord_pid > 0 && getppid() != w.args.coord_pid) return 1; /* died before prctl */
  char tag[32];
  snprintf(tag, sizeof tag, "worker%d", w.args.rank);
  fr_log_set_tag(tag);
  signal(SIGTERM, worker__on_signal);
  signal(SIGINT, worker__on_signal);
  signal(SIGPIPE, SIG_IGN);
  proto_msg_init(&w.in);
  proto_buf_init(&w.out);
  w.last_rx_ns = fr_now_ns();
  int rc = FR_EZMQ, linger = 0;
  w.zctx = zmq_ctx_new();
  w.sock = w.zctx ? zmq_socket(w.zctx, ZMQ_DEALER) : NULL;
  if (!w.sock) goto done;
  zmq_setsockopt(w.sock, ZMQ_LINGER, &linger, sizeof linger);
  if ((rc = worker__curve(&w))) goto done;
  rc = FR_EZMQ;
  if (zmq_connect(w.sock, w.args.connect) != 0) {
    fr_errorf(FR_EZMQ, "connect %s: %s", w.args.connect, zmq_strerror(errno));
    goto done;
  }
  worker__mbox_attach(&w);
  if ((rc = worker__hello(&w))) goto done;
  rc = worker__loop(&w);
done:
  if (rc) FR_LOGE("%s", fr_last_error());
  worker_unload(&w);
  kv_segment_detach(&w.mbox_seg);
  if (w.sock) zmq_close(w.sock);
  if (w.zctx) zmq_ctx_term(w.zctx);
  proto_msg_free(&w.in);
  proto_buf_free(&w.out);
  return rc ? 1 : 0;
}
