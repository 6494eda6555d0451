/* mbox.c - the step mailboxes of the workers on this host.
 *
 * One shared-memory segment ("steps", proto/proto_mbox.h) holds two
 * mailboxes per rank. A step goes to a local worker through its down
 * mailbox when the worker has decoded the last one, else (and to remote
 * workers) over ZeroMQ; a worker answers a step through the channel it
 * came on. A side that sleeps in zmq_poll gets a doorbell: an empty
 * ZeroMQ frame, which the receive paths skip. Everything else (load,
 * heartbeats, shutdown, hello) stays on ZeroMQ.
 */
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_log.h"
#include "common/fr_util.h"
#include "coordinator/coord_impl.h"
#include "coordinator/metrics.h"
#include "proto/proto_mbox.h"

void coord__mbox_init(coord_t *c) {
  if (c->n_remote == c->n_workers) return; /* no worker on this host */
  if (kv_segment_create(&c->mbox_seg, c->instance, "steps", proto_mbox_bytes(c->n_workers), c->epoch))
    FR_LOGW("step mailboxes: %s; steps go over ZeroMQ", fr_last_error()); /* slower, not wrong */
}

void coord__mbox_deinit(coord_t *c) {
  if (!c->mbox_seg.base) return;
  kv_segment_detach(&c->mbox_seg);
  kv_segment_unlink(c->instance, "steps");
}

static proto_mbox_t *coord__mbox(const coord_t *c, const coord_worker_t *w, int dir) {
  return c->mbox_seg.base && !w->remote ? proto_mbox_at(kv_segment_data(&c->mbox_seg), w->rank, dir) : NULL;
}

int coord__mbox_send(coord_t *c, coord_worker_t *w, const proto_buf_t *b) {
  proto_mbox_t *m = coord__mbox(c, w, PROTO_MBOX_DOWN);
  if (!m || w->ident_len == 0) return coord__worker_send_buf(c, w, b);
  int r = proto_mbox_post(m, b->data, b->len);
  if (r == PROTO_MBOX_BUSY) return coord__worker_send_buf(c, w, b);
  if (r == PROTO_MBOX_RING) {
    proto_buf_t bell = {0};
    return coord__worker_send_buf(c, w, &bell);
  }
  return 0;
}

/* Rank r's result, if one is waiting: decoded and handled as if it had
 * come over ZeroMQ. */
static int coord__mbox_take_one(coord_t *c, coord_worker_t *w) {
  proto_mbox_t *m = coord__mbox(c, w, PROTO_MBOX_UP);
  size_t len = 0;
  const void *data = m ? proto_mbox_peek(m, &len) : NULL;
  if (!data) return 0;
  c->t_rx_ns = fr_now_ns();
  int rc = proto_msg_decode(&c->in, data, len, PROTO_ACCEPT_FROM_WORKER);
  proto_mbox_done(m);
  if (rc) FR_LOGW("bad message from worker %d's mailbox: %s", w->rank, fr_last_error());
  else if (w->ident_len) {
    if (c->in.type == PROTO_T_RESULT) coord_metrics_rank_mailbox(c->metrics, w->rank);
    coord__workers_on_message(c, w->ident, w->ident_len, &c->in);
  }
  c->t_rx_ns = 0;
  return 1;
}

int coord__mbox_take(coord_t *c, bool will_block) {
  if (!c->mbox_seg.base) return 0;
  if (will_block && !c->mbox_sleeping) {
    for (int r = 0; r < c->n_workers; r++)
      if (!c->workers[r].remote) proto_mbox_sleeping(coord__mbox(c, &c->workers[r], PROTO_MBOX_UP), true);
    c->mbox_sleeping = true;
  }
  int n = 0;
  for (int r = 0; r < c->n_workers; r++) n += coord__mbox_take_one(c, &c->workers[r]);
  if (n) coord__mbox_awake(c);
  return n;
}

void coord__mbox_awake(coord_t *c) {
  if (!c->mbox_sleeping) return;
  for (int r = 0; r < c->n_workers; r++)
    if (!c->workers[r].remote) proto_mbox_sleeping(coord__mbox(c, &c->workers[r], PROTO_MBOX_UP), false);
  c->mbox_sleeping = false;
}
