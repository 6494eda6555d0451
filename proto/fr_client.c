/* fr_client.c - the RPC client: a ZeroMQ DEALER socket plus a socket
 * monitor (to notice a coordinator that went away), a queue of events that
 * arrived while a call waited for its reply, and the set of running jobs. */
#include "proto/fr_client.h"
#include "proto/curve.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/fr_err.h"
#include "common/fr_util.h"

typedef struct {
  uint8_t *data;
  size_t len;
} raw_msg_t;

struct fr_client {
  void *ctx;
  int own_ctx;
  void *sock; /* DEALER to the coordinator */
  void *mon;  /* PAIR receiving the socket's connect / disconnect events */
  int timeout_ms;
  int lost;   /* the connection dropped while jobs ran: next_event says so */
  int refused; /* the monitor event of a failed security handshake, 0 if none */
  uint64_t next_id, next_rid;
  proto_buf_t out;
  proto_msg_t in;
  raw_msg_t *queue; /* (queue_cap) ring of events kept during a reply wait */
  size_t queue_head, queue_len, queue_cap;
  uint64_t *jobs;   /* (jobs_cap) running job ids */
  size_t n_jobs, jobs_cap;
};

static int zmq_fail(const char *what) {
  int e = zmq_errno();
  return fr_errorf(FR_EZMQ, "fr_client: %s: %s", what, zmq_strerror(e));
}

/* ------------------------------------------------------------ job set */

static void jobs_add(fr_client_t *c, uint64_t id) {
  for (size_t i = 0; i < c->n_jobs; i++)
    if (c->jobs[i] == id) return;
  if (c->n_jobs == c->jobs_cap) {
    c->jobs_cap = c->jobs_cap ? 2 * c->jobs_cap : 16;
    c->jobs = fr_realloc(c->jobs, c->jobs_cap * sizeof *c->jobs);
  }
  c->jobs[c->n_jobs++] = id;
}

static void jobs_remove(fr_client_t *c, uint64_t id) {
  for (size_t i = 0; i < c->n_jobs; i++)
    if (c->jobs[i] == id) {
      c->jobs[i] = c->jobs[--c->n_jobs];
      return;
    }
}

int fr_client_active_jobs(const fr_client_t *c) { return (int)c->n_jobs; }

/* -------------------------------------------------------------- queue */

static void queue_push(fr_client_t *c, const void *data, size_t len) {
  if (c->queue_len == c->queue_cap) {
    size_t cap = c->queue_cap ? 2 * c->queue_cap : 16;
    raw_msg_t *q = fr_malloc(cap * sizeof *q);
    for (size_t i = 0; i < c->queue_len; i++) q[i] = c->queue[(c->queue_head + i) % c->queue_cap];
    free(c->queue);
    c->queue = q;
    c->queue_cap = cap;
    c->queue_head = 0;
  }
  raw_msg_t *m = &c->queue[(c->queue_head + c->queue_len++) % c->queue_cap];
  m->data = fr_malloc(len ? len : 1);
  memcpy(m->data, data, len);
  m->len = len;
}

static int queue_pop(fr_client_t *c, raw_msg_t *out) {
  if (!c->queue_len) return 0;
  *out = c->queue[c->queue_head];
  c->queue_head = (c->queue_head + 1) % c->queue_cap;
  c->queue_len--;
  return 1;
}

/* ------------------------------------------------------------ connect */

static int set_int(void *sock, int opt, int v, const char *name) {
  if (zmq_setsockopt(sock, opt, &v, sizeof v) != 0) return zmq_fail(name);
  return 0;
}

/* CURVE client options from keys (Z85 strings). */
static int set_curve(fr_client_t *c, const fr_client_keys_t *keys) {
  proto_curve_pair_t kp;
  if (!keys->server_key || !keys->secret_key)
    return fr_errorf(-EINVAL, "fr_client: CURVE needs the server's public key and this client's secret key");
  int rc = proto_curve_from_secret(&kp, keys->secret_key);
  if (rc) return fr_errorf(rc, "fr_client: this client's secret key: %s", fr_last_error());
  if (keys->public_key && strcmp(keys->public_key, kp.pub))
    return fr_errorf(FR_EFORMAT, "fr_client: the public key does not match the secret key");
  rc = proto_curve_client(c->sock, &kp, keys->server_key);
  return rc ? fr_errorf(rc, "fr_client: %s", fr_last_error()) : 0;
}

static int open_sockets(fr_client_t *c, const char *endpoint, const fr_client_keys_t *keys) {
  int rc;
  c->sock = zmq_socket(c->ctx, ZMQ_DEALER);
  if (!c->sock) return zmq_fail("socket");
  if ((rc = set_int(c->sock, ZMQ_LINGER, 0, "linger")) || (rc = set_int(c->sock, ZMQ_RECONNECT_IVL, 100, "reconnect")) ||
      (rc = set_int(c->sock, ZMQ_HEARTBEAT_IVL, 1000, "heartbeat")) ||
      (rc = set_int(c->sock, ZMQ_HEARTBEAT_TIMEOUT, 5000, "heartbeat timeout")))
    return rc;
  if (keys && (rc = set_curve(c, keys))) return rc;
  /* The monitor endpoint is unique per client, also in a shared context. */
  static _Atomic unsigned long counter;
  char mon_ep[96];
  snprintf(mon_ep, sizeof mon_ep, "inproc://fr-client-monitor-%p-%lu", (void *)c, ++counter);
  int events = ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
               ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
  if (zmq_socket_monitor(c->sock, mon_ep, events) != 0)
    return zmq_fail("socket_monitor");
  c->mon = zmq_socket(c->ctx, ZMQ_PAIR);
  if (!c->mon) return zmq_fail("socket");
  if ((rc = set_int(c->mon, ZMQ_LINGER, 0, "linger"))) return rc;
  if (zmq_connect(c->mon, mon_ep) != 0) return zmq_fail("connect monitor");
  if (zmq_connect(c->sock, endpoint) != 0) {
    int e = zmq_errno();
    return fr_errorf(FR_EZMQ, "fr_client: connect %s: %s", endpoint, zmq_strerror(e));
  }
  return 0;
}

static int client_open(fr_client_t **out, void *ctx, const char *endpoint, const fr_client_keys_t *keys) {
  *out = NULL;
  if (!endpoint) return fr_errorf(-EINVAL, "fr_client: no endpoint");
  fr_client_t *c = fr_calloc(1, sizeof *c);
  c->timeout_ms = 5000;
  c->next_id = 1;
  c->next_rid = 1;
  proto_buf_init(&c->out);
  proto_msg_init(&c->in);
  c->own_ctx = ctx == NULL;
  c->ctx = ctx ? ctx : zmq_ctx_new();
  int rc = c->ctx ? open_sockets(c, endpoint, keys) : zmq_fail("ctx_new");
  if (rc) {
    fr_client_close(c);
    return rc;
  }
  *out = c;
  return 0;
}

int fr_client_connect(fr_client_t **out, const char *endpoint) { return client_open(out, NULL, endpoint, NULL); }

int fr_client_connect_curve(fr_client_t **out, const char *endpoint, const fr_client_keys_t *keys) {
  return client_open(out, NULL, endpoint, keys);
}

int fr_client_connect_ctx(fr_client_t **out, void *zmq_ctx, const char *endpoint) {
  if (!zmq_ctx) return fr_errorf(-EINVAL, "fr_client: no ZeroMQ context");
  return client_open(out, zmq_ctx, endpoint, NULL);
}

void fr_client_close(fr_client_t *c) {
  if (!c) return;
  if (c->sock) {
    zmq_socket_monitor(c->sock, NULL, 0);
    zmq_close(c->sock);
  }
  if (c->mon) zmq_close(c->mon);
  if (c->own_ctx && c->ctx) zmq_ctx_term(c->ctx);
  raw_msg_t m;
  while (queue_pop(c, &m)) free(m.data);
  free(c->queue);
  free(c->jobs);
  proto_buf_free(&c->out);
  proto_msg_free(&c->in);
  free(c);
}

void fr_client_set_timeout(fr_client_t *c, int timeout_ms) { c->timeout_ms = timeout_ms; }

/* ---------------------------------------------------------- transport */


/* Reads monitor events: a drop while jobs run marks the client lost.
 * Returns 1 when the connection dropped. */
static int read_monitor(fr_client_t *c) {
  int dropped = 0;
  for (;;) {
    zmq_msg_t frame;
    zmq_msg_init(&frame);
    if (zmq_msg_recv(&frame, c->mon, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&frame);
      break;
    }
    uint16_t event = 0;
    if (zmq_msg_size(&frame) >= 2) memcpy(&event, zmq_msg_data(&frame), 2);
    int more = zmq_msg_more(&frame);
    zmq_msg_close(&frame);
    while (more) { /* the endpoint frame */
      zmq_msg_init(&frame);
      if (zmq_msg_recv(&frame, c->mon, 0) < 0) more = 0;
      else more = zmq_msg_more(&frame);
      zmq_msg_close(&frame);
    }
    if (event == ZMQ_EVENT_DISCONNECTED) dropped = 1;
    if (event == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL || event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL ||
        event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
      c->refused = event;
  }
  if (dropped && c->n_jobs) c->lost = 1;
  return dropped;
}

/* The error for a connection the server's CURVE handshake refused. */
static int refused_error(const fr_client_t *c) {
  if (c->refused == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
    return fr_errorf(FR_EAUTH, "fr_client: the server refused this client's key (not in its --curve-clients)");
  return fr_errorf(FR_EAUTH, "fr_client: the security handshake with the server failed (CURVE on one side only, "
                             "or the wrong server key)");
}

/* Sends one encoded message. A send that times out because every
 * connection attempt failed the security handshake says so (the monitor
 * saw it), not that the coordinator is unreachable. */
static int send_encoded(fr_client_t *c, proto_type_t type, const void *body) {
  int rc = proto_encode(&c->out, type, body);
  if (rc) return rc;
  if (set_int(c->sock, ZMQ_SNDTIMEO, c->timeout_ms, "sndtimeo")) return FR_EZMQ;
  while (zmq_send(c->sock, c->out.data, c->out.len, 0) < 0) {
    if (zmq_errno() == EINTR) continue;
    if (zmq_errno() != EAGAIN) return zmq_fail("send");
    read_monitor(c);
    if (c->refused) return refused_error(c);
    return fr_errorf(FR_ETIMEOUT, "fr_client: send timed out (coordinator not reachable)");
  }
  return 0;
}

static int remaining_ms(int timeout_ms, uint64_t start_ns) {
  if (timeout_ms < 0) return -1;
  uint64_t spent = (fr_now_ns() - start_ns) / 1000000u;
  return spent >= (uint64_t)timeout_ms ? 0 : timeout_ms - (int)spent;
}

/* Waits for one message from the coordinator into *msg (zmq_msg_t the
 * caller closes). FR_ETIMEOUT when none came; FR_EDEAD when the connection
 * dropped and dead_on_drop is set. */
static int recv_msg(fr_client_t *c, int timeout_ms, int dead_on_drop, zmq_msg_t *msg) {
  uint64_t start = fr_now_ns();
  for (;;) {
    zmq_pollitem_t items[2] = {{c->sock, 0, ZMQ_POLLIN, 0}, {c->mon, 0, ZMQ_POLLIN, 0}};
    int n = zmq_poll(items, 2, remaining_ms(timeout_ms, start));
    if (n < 0) {
      if (zmq_errno() == EINTR) continue;
      return zmq_fail("poll");
    }
    if (items[0].revents & ZMQ_POLLIN) {
      zmq_msg_init(msg);
      if (zmq_msg_recv(msg, c->sock, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(msg);
        if (zmq_errno() == EAGAIN || zmq_errno() == EINTR) continue;
        return zmq_fail("recv");
      }
      if (!zmq_msg_more(msg)) return 0;
      /* one frame per message: drain and refuse a multi-part one */
      do {
        zmq_msg_close(msg);
        zmq_msg_init(msg);
        if (zmq_msg_recv(msg, c->sock, 0) < 0) break;
      } while (zmq_msg_more(msg));
      zmq_msg_close(msg);
      return fr_errorf(FR_EPROTO, "fr_client: multi-part message from the coordinator");
    }
    /* messages first: a job's last events may precede the drop */
    if (items[1].revents & ZMQ_POLLIN) {
      int dropped = read_monitor(c);
      if (c->refused) return refused_error(c);
      if ((dropped && dead_on_drop) || c->lost) return FR_EDEAD;
    }
    if (n == 0 && remaining_ms(timeout_ms, start) == 0) return fr_errorf(FR_ETIMEOUT, "fr_client: no reply");
  }
}

/* ------------------------------------------------------------- events */

/* Turns a decoded client-side message into an event; returns 1 when it is
 * one (events, errors), 0 for anything else. */
static int as_event(fr_client_t *c, proto_event_t *ev) {
  if (c->in.type == PROTO_T_EVENT) {
    *ev = c->in.u.event;
    if (ev->finish != PROTO_FINISH_NONE) jobs_remove(c, ev->id);
    return 1;
  }
  if (c->in.type == PROTO_T_ERROR && c->in.u.error.rid == 0) {
    const proto_error_msg_t *e = &c->in.u.error;
    proto_body_default(PROTO_T_EVENT, ev);
    ev->id = e->id;
    ev->finish = e->id ? PROTO_FINISH_ERROR : PROTO_FINISH_NONE;
    ev->error.code = e->code;
    ev->error.message = e->message;
    if (e->id) jobs_remove(c, e->id);
    return 1;
  }
  return 0;
}

int fr_client_next_event(fr_client_t *c, int timeout_ms, proto_event_t *ev) {
  raw_msg_t raw;
  while (queue_pop(c, &raw)) {
    int rc = proto_msg_decode(&c->in, raw.data, raw.len, PROTO_ACCEPT_CLIENT);
    free(raw.data);
    if (rc) return rc;
    if (as_event(c, ev)) return 0;
  }
  uint64_t start = fr_now_ns();
  for (;;) {
    if (c->lost) {
      size_t n = c->n_jobs;
      c->lost = 0;
      c->n_jobs = 0;
      return fr_errorf(FR_EDEAD, "fr_client: connection to the coordinator dropped; %zu jobs lost", n);
    }
    zmq_msg_t msg;
    int rc = recv_msg(c, remaining_ms(timeout_ms, start), 0, &msg);
    if (rc == FR_EDEAD) continue;
    if (rc) return rc;
    rc = proto_msg_decode(&c->in, zmq_msg_data(&msg), zmq_msg_size(&msg), PROTO_ACCEPT_CLIENT);
    zmq_msg_close(&msg);
    if (rc) return rc;
    if (as_event(c, ev)) return 0;
    /* heartbeats and late replies of timed-out calls: keep waiting */
  }
}

/* ------------------------------------------------------------ requests */

int fr_client_submit(fr_client_t *c, const proto_submit_t *req, uint64_t *job_id) {
  proto_submit_t r = *req;
  if (r.id == 0) r.id = c->next_id++;
  int rc = send_encoded(c, PROTO_T_SUBMIT, &r);
  if (rc) return rc;
  jobs_add(c, r.id);
  if (job_id) *job_id = r.id;
  return 0;
}

int fr_client_cancel(fr_client_t *c, uint64_t job_id) {
  proto_cancel_t m = {.id = job_id};
  return send_encoded(c, PROTO_T_CANCEL, &m);
}

/* The ferrum code for an error the coordinator answered with. */
static int error_reply(const proto_error_msg_t *e) {
  int err;
  switch (e->code) {
  case PROTO_ERR_NOT_FOUND: err = FR_ENOTFOUND; break;
  case PROTO_ERR_TIMEOUT: err = FR_ETIMEOUT; break;
  case PROTO_ERR_TOO_BIG: err = FR_ETOOBIG; break;
  case PROTO_ERR_BUSY: err = FR_EBUSY; break;
  case PROTO_ERR_VERSION: err = FR_EVERSION; break;
  case PROTO_ERR_UNAVAILABLE: err = FR_EDEAD; break;
  default: err = FR_EPROTO; break;
  }
  return fr_errorf(err, "coordinator: error %d: %s", e->code, e->message ? e->message : "(no message)");
}

/* Sends a request and waits for its reply (type want with rid); events that
 * come first are queued for next_event. */
static int call(fr_client_t *c, proto_type_t type, const void *body, uint64_t rid, proto_type_t want) {
  int rc = send_encoded(c, type, body);
  if (rc) return rc;
  uint64_t start = fr_now_ns();
  for (;;) {
    zmq_msg_t msg;
    rc = recv_msg(c, remaining_ms(c->timeout_ms, start), 1, &msg);
    if (rc == FR_EDEAD) return fr_errorf(FR_EDEAD, "fr_client: connection to the coordinator dropped");
    if (rc) return rc;
    const void *data = zmq_msg_data(&msg);
    size_t len = zmq_msg_size(&msg);
    rc = proto_msg_decode(&c->in, data, len, PROTO_ACCEPT_CLIENT);
    if (!rc && (c->in.type == PROTO_T_EVENT || (c->in.type == PROTO_T_ERROR && c->in.u.error.rid == 0)))
      queue_push(c, data, len);
    zmq_msg_close(&msg);
    if (rc) return rc;
    if (c->in.type == PROTO_T_ERROR && c->in.u.error.rid == rid) return error_reply(&c->in.u.error);
    if (c->in.type == want && (want == PROTO_T_STATUS_R ? c->in.u.status_r.rid : c->in.u.models_r.rid) == rid)
      return 0;
  }
}

int fr_client_status(fr_client_t *c, const char *model, proto_status_reply_t *st) {
  proto_status_t req = {.rid = c->next_rid++, .model = (char *)model};
  int rc = call(c, PROTO_T_STATUS, &req, req.rid, PROTO_T_STATUS_R);
  if (rc) return rc;
  *st = c->in.u.status_r;
  return 0;
}

int fr_client_list_models(fr_client_t *c, proto_models_reply_t *out) {
  proto_models_t req = {.rid = c->next_rid++};
  int rc = call(c, PROTO_T_MODELS, &req, req.rid, PROTO_T_MODELS_R);
  if (rc) return rc;
  *out = c->in.u.models_r;
  return 0;
}
