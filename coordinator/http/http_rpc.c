/* http_rpc.c - the HTTP frontend's RPC connection to the coordinator loop:
 * one DEALER on the coordinator's zmq context, as an outside RPC client
 * has, that carries the submits, cancels and heartbeats of every request
 * (the loop thread's alone). See http_internal.h. */
#include <errno.h>
#include <poll.h>
#include <string.h>

#include <zmq.h>

#include "common/fr_err.h"
#include "common/fr_log.h"
#include "common/fr_util.h"
#include "coordinator/http/http_internal.h"

int coord_http_rpc_open(coord_http_rpc_t *r, void *ctx, const char *endpoint) {
  memset(r, 0, sizeof *r);
  r->last_rx_ns = fr_now_ns();
  proto_buf_init(&r->buf);
  proto_msg_init(&r->msg);
  /* linger: cancels sent just before close still go out; the high-water
   * marks match the coordinator's ROUTER: events are read as they come and
   * kept by their jobs, so the queue holds only what one loop turn has not
   * read yet */
  int linger = 200, hwm = 100000;
  r->sock = zmq_socket(ctx, ZMQ_DEALER);
  if (!r->sock) return fr_errorf(FR_EZMQ, "zmq_socket: %s", zmq_strerror(zmq_errno()));
  zmq_setsockopt(r->sock, ZMQ_LINGER, &linger, sizeof linger);
  zmq_setsockopt(r->sock, ZMQ_SNDHWM, &hwm, sizeof hwm);
  zmq_setsockopt(r->sock, ZMQ_RCVHWM, &hwm, sizeof hwm);
  if (zmq_connect(r->sock, endpoint)) {
    int rc = fr_errorf(FR_EZMQ, "connect %s: %s", endpoint, zmq_strerror(zmq_errno()));
    coord_http_rpc_close(r);
    return rc;
  }
  return 0;
}

int coord_http_rpc_send(coord_http_rpc_t *r, proto_type_t type, const void *body) {
  int rc = proto_encode(&r->buf, type, body);
  if (rc) return rc;
  if (zmq_send(r->sock, r->buf.data, r->buf.len, ZMQ_DONTWAIT) < 0)
    return fr_errorf(FR_EZMQ, "send %s: %s", proto_type_name(type), zmq_strerror(zmq_errno()));
  return 0;
}

int coord_http_rpc_ping(coord_http_rpc_t *r) {
  proto_heartbeat_t hb = {.rank = -1, .seq = ++r->beats, .ts_ns = fr_now_ns()};
  r->last_ping_ns = fr_now_ns();
  return coord_http_rpc_send(r, PROTO_T_HEARTBEAT, &hb);
}

int coord_http_rpc_recv(coord_http_rpc_t *r, const proto_msg_t **msg) {
  zmq_msg_t f;
  zmq_msg_init(&f);
  if (zmq_msg_recv(&f, r->sock, ZMQ_DONTWAIT) < 0) {
    int err = zmq_errno();
    zmq_msg_close(&f);
    return err == EAGAIN || err == EINTR ? 0 : fr_errorf(FR_EZMQ, "recv: %s", zmq_strerror(err));
  }
  r->last_rx_ns = fr_now_ns(); /* the coordinator is alive, whatever it sent */
  int rc = 1;
  if (zmq_msg_size(&f) == 0) rc = 2; /* a ROUTER's empty delimiter frame */
  else if (proto_msg_decode(&r->msg, zmq_msg_data(&f), zmq_msg_size(&f), PROTO_ACCEPT_CLIENT)) {
    FR_LOGW("HTTP: a message from the coordinator does not decode: %s", fr_last_error());
    rc = 2;
  }
  zmq_msg_close(&f);
  if (rc == 1) *msg = &r->msg;
  return rc;
}

void coord_http_rpc_close(coord_http_rpc_t *r) {
  if (r->sock) zmq_close(r->sock);
  r->sock = NULL;
  proto_buf_free(&r->buf);
  proto_msg_free(&r->msg);
}

coord_http_peer_t coord_http_peer_of(short revents) {
  if (revents & (POLLHUP | POLLERR | POLLNVAL)) return COORD_HTTP_PEER_GONE;
  return revents & POLLRDHUP ? COORD_HTTP_PEER_EOF : COORD_HTTP_PEER_OPEN;
}
