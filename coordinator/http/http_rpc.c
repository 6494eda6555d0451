/* http_rpc.c - one HTTP request's RPC connection to the coordinator loop: a
 * DEALER on the coordinator's zmq context, as an outside RPC client has.
 * See http_internal.h. */
#include <errno.h>
#include <poll.h>
#include <string.h>

#include <zmq.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "coordinator/http/http_internal.h"

#define RPC_WATCH_MS 100 /* how often a waiting handler looks at its client */

int coord_http_rpc_open(coord_http_rpc_t *c, void *ctx, const char *endpoint, int client_fd) {
  memset(c, 0, sizeof *c);
  c->client_fd = client_fd;
  c->last_rx_ns = fr_now_ns();
  proto_buf_init(&c->buf);
  proto_msg_init(&c->msg);
  int linger = 200; /* a cancel sent just before close still goes out */
  c->sock = zmq_socket(ctx, ZMQ_DEALER);
  if (!c->sock) return fr_errorf(FR_EZMQ, "zmq_socket: %s", zmq_strerror(zmq_errno()));
  zmq_setsockopt(c->sock, ZMQ_LINGER, &linger, sizeof linger);
  if (zmq_connect(c->sock, endpoint)) {
    int rc = fr_errorf(FR_EZMQ, "connect %s: %s", endpoint, zmq_strerror(zmq_errno()));
    coord_http_rpc_close(c);
    return rc;
  }
  return 0;
}

static int rpc_send(coord_http_rpc_t *c, proto_type_t type, const void *body) {
  int rc = proto_encode(&c->buf, type, body);
  if (rc) return rc;
  if (zmq_send(c->sock, c->buf.data, c->buf.len, 0) < 0)
    return fr_errorf(FR_EZMQ, "send %s: %s", proto_type_name(type), zmq_strerror(zmq_errno()));
  return 0;
}

int coord_http_rpc_submit(coord_http_rpc_t *c, const proto_submit_t *s) {
  int rc = rpc_send(c, PROTO_T_SUBMIT, s);
  if (!rc) c->job = s->id;
  return rc;
}

int coord_http_rpc_ping(coord_http_rpc_t *c) {
  proto_heartbeat_t hb = {.rank = -1, .seq = ++c->beats, .ts_ns = fr_now_ns()};
  return rpc_send(c, PROTO_T_HEARTBEAT, &hb);
}

coord_http_peer_t coord_http_peer(int fd) {
  if (fd < 0) return COORD_HTTP_PEER_OPEN;
  struct pollfd p = {.fd = fd, .events = POLLRDHUP};
  if (poll(&p, 1, 0) <= 0) return COORD_HTTP_PEER_OPEN;
  if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) return COORD_HTTP_PEER_GONE;
  return p.revents & POLLRDHUP ? COORD_HTTP_PEER_EOF : COORD_HTTP_PEER_OPEN;
}

/* 0, -EPIPE (the job canceled) or COORD_HTTP_RPC_EOF (once). */
static int rpc_watch_client(coord_http_rpc_t *c) {
  coord_http_peer_t p = coord_http_peer(c->client_fd);
  if (p == COORD_HTTP_PEER_GONE) {
    coord_http_rpc_cancel(c);
    return -EPIPE;
  }
  if (p == COORD_HTTP_PEER_EOF && !c->client_eof) {
    c->client_eof = true;
    return COORD_HTTP_RPC_EOF;
  }
  return 0;
}

/* Receives one frame and decodes it. Returns 1 when it is about our job, 0
 * when it is something else (skipped), negative on errors. */
static int rpc_recv_one(coord_http_rpc_t *c) {
  zmq_msg_t f;
  zmq_msg_init(&f);
  if (zmq_msg_recv(&f, c->sock, ZMQ_DONTWAIT) < 0) {
    int err = zmq_errno();
    zmq_msg_close(&f);
    return err == EAGAIN ? 0 : fr_errorf(FR_EZMQ, "recv: %s", zmq_strerror(err));
  }
  int rc = 0;
  c->last_rx_ns = fr_now_ns(); /* the coordinator is alive, whatever it sent */
  if (zmq_msg_size(&f) > 0) /* skip a ROUTER's empty delimiter frame */
    rc = proto_msg_decode(&c->msg, zmq_msg_data(&f), zmq_msg_size(&f), PROTO_ACCEPT_CLIENT);
  zmq_msg_close(&f);
  if (rc) return rc;
  const proto_msg_t *m = &c->msg;
  if (m->type == PROTO_T_EVENT && m->u.event.id == c->job) {
    if (m->u.event.finish != PROTO_FINISH_NONE) c->finished = true;
    return 1;
  }
  if (m->type == PROTO_T_ERROR && (m->u.error.id == c->job || m->u.error.id == 0)) {
    c->finished = true;
    return 1;
  }
  return 0;
}

int coord_http_rpc_next(coord_http_rpc_t *c, int timeout_ms, const proto_msg_t **msg) {
  uint64_t deadline = fr_now_ns() + (uint64_t)(timeout_ms < 0 ? 0 : timeout_ms) * 1000000ull;
  for (;;) {
    int rc = rpc_recv_one(c);
    if (rc == 1) {
      *msg = &c->msg;
      return 1;
    }
    if (rc < 0) return rc;
    if ((rc = rpc_watch_client(c))) return rc;
    uint64_t now = fr_now_ns();
    if (timeout_ms >= 0 && now >= deadline) return 0;
    long wait = RPC_WATCH_MS;
    if (timeout_ms >= 0 && (deadline - now) / 1000000ull < (uint64_t)wait) wait = (long)((deadline - now) / 1000000ull) + 1;
    zmq_pollitem_t it = {.socket = c->sock, .events = ZMQ_POLLIN};
    if (zmq_poll(&it, 1, wait) < 0 && zmq_errno() != EINTR)
      return fr_errorf(FR_EZMQ, "poll: %s", zmq_strerror(zmq_errno()));
  }
}

void coord_http_rpc_cancel(coord_http_rpc_t *c) {
  if (!c->sock || !c->job || c->finished) return;
  proto_cancel_t cancel = {.id = c->job};
  rpc_send(c, PROTO_T_CANCEL, &cancel);
  c->finished = true; /* nothing more is read for it */
}

void coord_http_rpc_close(coord_http_rpc_t *c) {
  coord_http_rpc_cancel(c);
  if (c->sock) zmq_close(c->sock);
  c->sock = NULL;
  proto_buf_free(&c->buf);
  proto_msg_free(&c->msg);
}
