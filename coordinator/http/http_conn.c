/* http_conn.c - the open connections of the HTTP frontend and the deadline
 * for receiving each request: a table filled from MHD's connection
 * notifications, which the loop's tick scans for requests that do not
 * arrive in time. Loop thread only (and the thread that stops MHD, once
 * the loop is gone). See http_internal.h. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <microhttpd.h>

#include "common/fr_err.h"
#include "common/fr_log.h"
#include "common/fr_util.h"
#include "coordinator/http/http_internal.h"

static coord_http_conn_t *conn_of(struct MHD_Connection *c) {
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return ci ? ci->socket_context : NULL;
}

/* Starts the clock of x; idle_ns more for a request that may wait for the
 * client first. */
static void conn_arm(struct coord_http *h, coord_http_conn_t *x, uint64_t idle_ns) {
  x->receiving = true;
  x->deadline_ns = fr_now_ns() + idle_ns + h->request_timeout_ns;
}

static void conn_add(struct coord_http *h, struct MHD_Connection *c, void **socket_context) {
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
  coord_http_conn_t *x = fr_calloc(1, sizeof *x);
  x->fd = ci ? ci->connect_fd : -1;
  conn_arm(h, x, 0);
  x->next = h->conns;
  if (h->conns) h->conns->prev = x;
  h->conns = x;
  h->n_conns++;
  *socket_context = x;
}

/* Called before MHD closes the socket: once x is out of the table, the
 * tick cannot touch a descriptor number that may be reused. */
static void conn_remove(struct coord_http *h, void **socket_context) {
  coord_http_conn_t *x = *socket_context;
  if (!x) return;
  if (x->prev) x->prev->next = x->next;
  else h->conns = x->next;
  if (x->next) x->next->prev = x->prev;
  h->n_conns--;
  free(x);
  *socket_context = NULL;
}

void coord_http__conn_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                             enum MHD_ConnectionNotificationCode toe) {
  if (toe == MHD_CONNECTION_NOTIFY_STARTED) conn_add(cls, c, socket_context);
  else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) conn_remove(cls, socket_context);
}

void coord_http__conn_received(struct coord_http *h, struct MHD_Connection *c) {
  (void)h;
  coord_http_conn_t *x = conn_of(c);
  if (x) x->receiving = false;
}

void coord_http__conn_rearm(struct coord_http *h, struct MHD_Connection *c) {
  coord_http_conn_t *x = conn_of(c);
  if (x) conn_arm(h, x, h->idle_timeout_ns);
}

bool coord_http__conns_answering(const struct coord_http *h) {
  for (const coord_http_conn_t *x = h->conns; x; x = x->next)
    if (!x->receiving) return true;
  return false;
}

void coord_http__conns_tick(struct coord_http *h, uint64_t now) {
  for (coord_http_conn_t *x = h->conns; x; x = x->next) {
    if (!x->receiving || x->expired || now < x->deadline_ns || x->fd < 0) continue;
    x->expired = true;
    FR_LOGD("HTTP: closing a connection whose request did not arrive in time");
    shutdown(x->fd, SHUT_RDWR); /* MHD reads the end of the stream and closes */
  }
}

void coord_http__conns_init(struct coord_http *h, unsigned request_timeout_s, unsigned idle_timeout_s) {
  h->request_timeout_ns = (uint64_t)request_timeout_s * 1000000000ull;
  h->idle_timeout_ns = (uint64_t)idle_timeout_s * 1000000000ull;
}

void coord_http__conns_free(struct coord_http *h) {
  while (h->conns) { /* MHD closed them all (none left unless it failed to start) */
    coord_http_conn_t *x = h->conns;
    h->conns = x->next;
    free(x);
  }
  h->n_conns = 0;
}
