/* http_conn.c - the open connections of the HTTP frontend and the deadline
 * for receiving each request: a table filled from MHD's connection
 * notifications and a watchdog thread that shuts down the sockets of
 * requests that do not arrive in time. See http_internal.h. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <microhttpd.h>

#include "common/fr_err.h"
#include "common/fr_log.h"
#include "common/fr_util.h"
#include "coordinator/http/http_internal.h"

#define WATCHDOG_TICK_MS 100 /* how late past its deadline a request may be shut down */

static coord_http_conn_t *conn_of(struct MHD_Connection *c) {
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return ci ? ci->socket_context : NULL;
}

/* Starts the clock of x (under conn_mu); idle_ns more for a request that
 * may wait for the client first. */
static void conn_arm(struct coord_http *h, coord_http_conn_t *x, uint64_t idle_ns) {
  x->receiving = true;
  x->deadline_ns = fr_now_ns() + idle_ns + h->request_timeout_ns;
}

static void conn_add(struct coord_http *h, struct MHD_Connection *c, void **socket_context) {
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
  coord_http_conn_t *x = fr_calloc(1, sizeof *x);
  x->fd = ci ? ci->connect_fd : -1;
  pthread_mutex_lock(&h->conn_mu);
  conn_arm(h, x, 0);
  x->next = h->conns;
  if (h->conns) h->conns->prev = x;
  h->conns = x;
  pthread_mutex_unlock(&h->conn_mu);
  *socket_context = x;
}

/* Called before MHD closes the socket: once x is out of the table, the
 * watchdog cannot touch a descriptor number that may be reused. */
static void conn_remove(struct coord_http *h, void **socket_context) {
  coord_http_conn_t *x = *socket_context;
  if (!x) return;
  pthread_mutex_lock(&h->conn_mu);
  if (x->prev) x->prev->next = x->next;
  else h->conns = x->next;
  if (x->next) x->next->prev = x->prev;
  pthread_mutex_unlock(&h->conn_mu);
  free(x);
  *socket_context = NULL;
}

void coord_http__conn_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                             enum MHD_ConnectionNotificationCode toe) {
  if (toe == MHD_CONNECTION_NOTIFY_STARTED) conn_add(cls, c, socket_context);
  else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) conn_remove(cls, socket_context);
}

void coord_http__conn_received(struct coord_http *h, struct MHD_Connection *c) {
  coord_http_conn_t *x = conn_of(c);
  if (!x) return;
  pthread_mutex_lock(&h->conn_mu);
  x->receiving = false;
  pthread_mutex_unlock(&h->conn_mu);
}

void coord_http__conn_rearm(struct coord_http *h, struct MHD_Connection *c) {
  coord_http_conn_t *x = conn_of(c);
  if (!x) return;
  pthread_mutex_lock(&h->conn_mu);
  conn_arm(h, x, h->idle_timeout_ns);
  pthread_mutex_unlock(&h->conn_mu);
}

void coord_http__conn_touch(struct coord_http *h, struct MHD_Connection *c) {
  if (!c) return;
  /* MHD restarts the timer only when a connection's timeout goes from 0 to another value */
  MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
  MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, h->timeout_s);
}

/* True when a connection is answering a request (under conn_mu). */
static bool conns_answering(const struct coord_http *h) {
  for (const coord_http_conn_t *x = h->conns; x; x = x->next)
    if (!x->receiving) return true;
  return false;
}

bool coord_http__conns_idle_wait(struct coord_http *h, unsigned timeout_ms) {
  if (!h->conn_init) return true;
  uint64_t end = fr_now_ns() + (uint64_t)timeout_ms * 1000000ull;
  for (;;) {
    pthread_mutex_lock(&h->conn_mu);
    bool busy = conns_answering(h);
    pthread_mutex_unlock(&h->conn_mu);
    if (!busy) return true;
    if (fr_now_ns() >= end) return false;
    nanosleep(&(struct timespec){.tv_nsec = 10 * 1000000L}, NULL);
  }
}

/* Shuts down the sockets whose request is late (under conn_mu). */
static void watchdog_scan(struct coord_http *h, uint64_t now) {
  for (coord_http_conn_t *x = h->conns; x; x = x->next) {
    if (!x->receiving || x->expired || now < x->deadline_ns || x->fd < 0) continue;
    x->expired = true;
    FR_LOGD("HTTP: closing a connection whose request did not arrive in time");
    shutdown(x->fd, SHUT_RDWR); /* MHD reads the end of the stream and closes */
  }
}

static void *watchdog_main(void *arg) {
  struct coord_http *h = arg;
  pthread_mutex_lock(&h->conn_mu);
  while (!h->watchdog_stop) {
    watchdog_scan(h, fr_now_ns());
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += WATCHDOG_TICK_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&h->conn_cv, &h->conn_mu, &ts);
  }
  pthread_mutex_unlock(&h->conn_mu);
  return NULL;
}

int coord_http__conns_start(struct coord_http *h, unsigned request_timeout_s, unsigned idle_timeout_s) {
  pthread_condattr_t ca;
  h->request_timeout_ns = (uint64_t)request_timeout_s * 1000000000ull;
  h->idle_timeout_ns = (uint64_t)idle_timeout_s * 1000000000ull;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_mutex_init(&h->conn_mu, NULL);
  pthread_cond_init(&h->conn_cv, &ca);
  pthread_condattr_destroy(&ca);
  h->conn_init = true;
  int rc = pthread_create(&h->watchdog, NULL, watchdog_main, h);
  if (rc) return fr_errorf(-rc, "HTTP: cannot start the connection watchdog: %s", strerror(rc));
  h->watchdog_running = true;
  return 0;
}

void coord_http__watchdog_stop(struct coord_http *h) {
  if (!h->watchdog_running) return;
  pthread_mutex_lock(&h->conn_mu);
  h->watchdog_stop = true;
  pthread_cond_signal(&h->conn_cv);
  pthread_mutex_unlock(&h->conn_mu);
  pthread_join(h->watchdog, NULL);
  h->watchdog_running = false;
}

void coord_http__conns_free(struct coord_http *h) {
  if (!h->conn_init) return;
  while (h->conns) { /* MHD closed them all (none left unless it failed to start) */
    coord_http_conn_t *x = h->conns;
    h->conns = x->next;
    free(x);
  }
  pthread_cond_destroy(&h->conn_cv);
  pthread_mutex_destroy(&h->conn_mu);
  h->conn_init = false;
}
