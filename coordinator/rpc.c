/* rpc.c - the RPC frontend: a ROUTER on the RPC endpoint (ipc:// by
 * default, tcp:// on request) and one on inproc:// for the HTTP frontend.
 * Frames: [routing id][optional empty delimiter][one proto message]. Bad
 * input (garbage, wrong types, extra frames, oversized) gets an error reply;
 * nothing a client sends can stop the loop. A client that went away (the
 * ROUTER cannot route to it: ZMQ_ROUTER_MANDATORY) or cannot keep up (its
 * queue is full) has its jobs canceled. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "common/fr_err.h"
#include "common/fr_log.h"
#include "common/fr_util.h"
#include "coordinator/coord_impl.h"

#define COORD_RPC_BATCH 64 /* messages handled per readable event */

static void *coord__router(coord_t *c, const char *addr) {
  void *s = zmq_socket(c->zctx, ZMQ_ROUTER);
  if (!s) return NULL;
  int one = 1, zero = 0, hwm = 100000;
  int64_t maxmsg = (int64_t)PROTO_MAX_MSG_BYTES + 4096;
  zmq_setsockopt(s, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
  zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
  zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm);
  zmq_setsockopt(s, ZMQ_RCVHWM, &hwm, sizeof hwm);
  zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
  if (coord__auth_socket(c, s, addr)) {
    zmq_close(s);
    return NULL;
  }
  if (zmq_bind(s, addr) != 0) {
    fr_errorf(FR_EZMQ, "bind %s: %s", addr, zmq_strerror(errno));
    zmq_close(s);
    return NULL;
  }
  return s;
}

int coord__rpc_bind(coord_t *c) {
  if (!strncmp(c->rpc_addr, "ipc://", 6)) unlink(c->rpc_addr + 6); /* a stale socket file (pid file checked) */
  if (!(c->rsock = coord__router(c, c->rpc_addr))) return FR_EZMQ;
  snprintf(c->inproc_addr, sizeof c->inproc_addr, "inproc://ferrum-rpc");
  if (!(c->isock = coord__router(c, c->inproc_addr))) return FR_EZMQ;
  int ivl = 1000, tmo = 5000; /* notice peers that vanish without closing */
  zmq_setsockopt(c->rsock, ZMQ_HEARTBEAT_IVL, &ivl, sizeof ivl);
  zmq_setsockopt(c->rsock, ZMQ_HEARTBEAT_TIMEOUT, &tmo, sizeof tmo);
  if (zmq_socket_monitor(c->rsock, "inproc://ferrum-rpc-monitor", ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED) != 0 ||
      !(c->msock = zmq_socket(c->zctx, ZMQ_PAIR)))
    return fr_errorf(FR_EZMQ, "RPC socket monitor: %s", zmq_strerror(errno));
  int zero = 0;
  zmq_setsockopt(c->msock, ZMQ_LINGER, &zero, sizeof zero);
  if (zmq_connect(c->msock, "inproc://ferrum-rpc-monitor") != 0)
    return fr_errorf(FR_EZMQ, "RPC socket monitor: %s", zmq_strerror(errno));
  char bound[600];
  snprintf(bound, sizeof bound, "%s", c->rpc_addr);
  coord__endpoint_resolve(c->rsock, bound, sizeof bound);
  free(c->rpc_addr);
  c->rpc_addr = fr_strdup(bound);
  return 0;
}

void coord__endpoint_resolve(void *sock, char *addr, size_t cap) {
  if (strncmp(addr, "tcp://", 6) || (!strstr(addr, ":0") && !strstr(addr, ":*"))) return;
  char buf[256];
  size_t n = sizeof buf;
  if (zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, buf, &n) == 0) snprintf(addr, cap, "%s", buf);
}

int coord__rpc_send(coord_t *c, const coord_peer_t *p, proto_type_t type, const void *body) {
  proto_buf_t *b = &c->out;
  int rc = proto_encode(b, type, body);
  if (rc) return rc;
  void *s = p->inproc ? c->isock : c->rsock;
  if (zmq_send(s, p->id, p->len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) goto gone;
  if (p->delim && zmq_send(s, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) goto gone;
  if (zmq_send(s, b->data, b->len, ZMQ_DONTWAIT) < 0) goto gone;
  return 0;
gone:
  if (errno == EHOSTUNREACH || errno == EAGAIN) return fr_errorf(FR_EDEAD, "client gone or not reading");
  return fr_errorf(FR_EZMQ, "send: %s", zmq_strerror(errno));
}

int coord__rpc_error(coord_t *c, const coord_peer_t *p, int32_t code, uint64_t id, const char *msg) {
  char m[PROTO_MAX_STR];
  snprintf(m, sizeof m, "%s", msg ? msg : "");
  proto_error_msg_t e = {.code = code, .message = m, .id = id};
  FR_LOGD("rpc error %d for job %llu: %s", code, (unsigned long long)id, m);
  return coord__rpc_send(c, p, PROTO_T_ERROR, &e);
}

static void coord__rpc_status(coord_t *c, const coord_peer_t *p, uint64_t rid) {
  int ready = coord__workers_ready_count(c), restarts = 0;
  char devs[COORD_MAX_WORKERS][64], *dv[COORD_MAX_WORKERS];
  for (int r = 0; r < c->n_workers; r++) {
    restarts += c->workers[r].restarts;
    if (kern_device_for_rank(c->device, r, c->n_workers, devs[r], sizeof devs[r])) snprintf(devs[r], sizeof devs[r], "?");
    dv[r] = devs[r];
  }
  proto_status_reply_t st = {
      .rid = rid,
      .model = c->served_name,
      .queued = (uint32_t)c->sched.n_waiting,
      .running = (uint32_t)c->sched.n_running,
      .kv_used_blocks = c->kv ? (uint32_t)(c->kvi.n_blocks - kv_blocks_free_count(c->kv)) : 0,
      .kv_total_blocks = (uint32_t)c->kvi.n_blocks,
      .n_workers = (uint32_t)ready,
      .prefix_queries = c->sched.counters.prefix_queries,
      .prefix_hits = c->sched.counters.prefix_hits,
      .preemptions = c->sched.counters.n_preemptions,
      .worker_restarts = (uint32_t)restarts,
      .draining = c->draining,
      .tp = {.size = (uint32_t)c->n_workers, .n_devices = (uint32_t)c->n_workers, .devices = dv},
  };
  coord__rpc_send(c, p, PROTO_T_STATUS_R, &st);
}

static void coord__rpc_models(coord_t *c, const coord_peer_t *p, uint64_t rid) {
  proto_model_info_t mi = {.name = c->served_name, .max_ctx = (uint32_t)c->max_model_len};
  proto_models_reply_t r = {.rid = rid, .n_models = 1, .models = &mi};
  coord__rpc_send(c, p, PROTO_T_MODELS_R, &r);
}

static void coord__rpc_dispatch(coord_t *c, const coord_peer_t *p, const void *data, size_t len) {
  int rc = proto_msg_decode(&c->in, data, len, PROTO_ACCEPT_FROM_CLIENT);
  if (rc) {
    int32_t code = rc == FR_ETOOBIG ? PROTO_ERR_TOO_BIG : rc == FR_EVERSION ? PROTO_ERR_VERSION : PROTO_ERR_BAD_REQUEST;
    coord__rpc_error(c, p, code, 0, fr_last_error());
    return;
  }
  const proto_msg_t *m = &c->in;
  switch (m->type) {
  case PROTO_T_SUBMIT: coord__job_submit(c, p, &m->u.submit); break;
  case PROTO_T_CANCEL: coord__job_cancel(c, p, m->u.cancel.id); break;
  case PROTO_T_STATUS: coord__rpc_status(c, p, m->u.status.rid); break;
  case PROTO_T_MODELS: coord__rpc_models(c, p, m->u.models.rid); break;
  case PROTO_T_HEARTBEAT: {
    proto_heartbeat_t hb = {.rank = -1, .seq = m->u.heartbeat.seq, .ts_ns = fr_now_ns()};
    coord__rpc_send(c, p, PROTO_T_HEARTBEAT, &hb);
    break;
  }
  default: coord__rpc_error(c, p, PROTO_ERR_BAD_REQUEST, 0, "unexpected message type"); break;
  }
}

/* The connection count of fd (0 before its first accept). */
static uint32_t *coord__fd_conn(coord_t *c, int fd) {
  if (fd >= c->fd_conn_cap) {
    int cap = FR_MAX(fd + 1, 2 * c->fd_conn_cap);
    c->fd_conn = fr_realloc(c->fd_conn, (size_t)cap * sizeof *c->fd_conn);
    memset(c->fd_conn + c->fd_conn_cap, 0, (size_t)(cap - c->fd_conn_cap) * sizeof *c->fd_conn);
    c->fd_conn_cap = cap;
  }
  return &c->fd_conn[fd];
}

/* Stamps p with its connection: fd and which connection on it. The events
 * queued so far are read first: the accept of the connection a message came
 * on (and the close of the fd's previous connection) precede the message. */
static void coord__rpc_peer_conn(coord_t *c, coord_peer_t *p, int fd) {
  p->fd = fd;
  if (fd < 0) return;
  coord__rpc_on_monitor(c);
  p->conn = *coord__fd_conn(c, fd);
}

/* Reads one multipart message: [id][""]?[payload]; more frames are an
 * error. Returns 1 when a message was handled, 0 when none was waiting. */
static int coord__rpc_recv_one(coord_t *c, void *sock, bool inproc, zmq_msg_t *f) {
  coord_peer_t p = {.inproc = inproc, .fd = -1};
  int n = zmq_msg_recv(f, sock, ZMQ_DONTWAIT);
  if (n < 0) return 0;

  p.len = (uint8_t)FR_MIN(zmq_msg_size(f), COORD_IDENT_MAX - 1);
  memcpy(p.id, zmq_msg_data(f), p.len);
  int frames = 0;
  bool bad = false;
  while (zmq_msg_more(f)) {
    if (zmq_msg_recv(f, sock, 0) < 0) return 1;
    frames++;
    if (frames == 1 && zmq_msg_size(f) == 0 && zmq_msg_more(f)) {
      p.delim = true;
      continue;
    }
    if (zmq_msg_more(f)) bad = true;
    if (!inproc) coord__rpc_peer_conn(c, &p, zmq_msg_get(f, ZMQ_SRCFD)); /* a wire frame's, not the routing id's */
    if (!bad) {
      c->t_rx_ns = fr_now_ns();
      coord__rpc_dispatch(c, &p, zmq_msg_data(f), zmq_msg_size(f));
      c->t_rx_ns = 0;
    }
  }
  if (bad || frames == 0) coord__rpc_error(c, &p, PROTO_ERR_BAD_REQUEST, 0, "one message per frame expected");
  return 1;
}

void coord__rpc_on_readable(coord_t *c, void *sock, bool inproc) {
  zmq_msg_t f;
  zmq_msg_init(&f);
  for (int i = 0; i < COORD_RPC_BATCH; i++)
    if (!coord__rpc_recv_one(c, sock, inproc, &f)) break;
  zmq_msg_close(&f);
}

void coord__rpc_on_monitor(coord_t *c) {
  zmq_msg_t ev, addr;
  zmq_msg_init(&ev), zmq_msg_init(&addr);
  for (int i = 0; i < 64; i++) {
    if (zmq_msg_recv(&ev, c->msock, ZMQ_DONTWAIT) < 0) break;
    if (zmq_msg_more(&ev)) zmq_msg_recv(&addr, c->msock, 0);
    if (zmq_msg_size(&ev) < 6) continue;
    uint16_t event;
    int32_t fd;
    memcpy(&event, zmq_msg_data(&ev), 2);
    memcpy(&fd, (const uint8_t *)zmq_msg_data(&ev) + 2, 4);
    FR_LOGD("RPC monitor event %u fd %d", event, fd);
    if (fd < 0) continue;
    if (event == ZMQ_EVENT_ACCEPTED) ++*coord__fd_conn(c, fd);
    if (event == ZMQ_EVENT_DISCONNECTED) coord__jobs_cancel_fd(c, fd, *coord__fd_conn(c, fd));
  }
  zmq_msg_close(&ev), zmq_msg_close(&addr);
}
