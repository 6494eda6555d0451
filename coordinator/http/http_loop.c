/* http_loop.c - the HTTP frontend's one thread: libmicrohttpd without a
 * thread of its own (MHD_USE_EPOLL, run with MHD_run), the RPC DEALER that
 * carries every job, and a tick for timers. Nothing here blocks: a request
 * that waits for the engine has its connection suspended, so thousands of
 * idle or waiting connections cost a descriptor and a little memory each,
 * not a thread. See http_internal.h. */
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>
#include <zmq.h>

#include "common/fr_err.h"
#include "common/fr_log.h"
#include "common/fr_util.h"
#include "coordinator/http/http_internal.h"

#define LOOP_TICK_NS (100 * 1000000ull) /* jobs' timers and sockets, request deadlines */
#define LOOP_BATCH 1024                 /* coordinator messages read per turn (MHD runs between) */
#define LOOP_CLOSE_NS (5000 * 1000000ull) /* how long a stop lets the answers in progress finish */

/* Reads what the coordinator sent and hands it to the jobs: up to
 * LOOP_BATCH messages, or (all) every one queued. */
static void loop_read_rpc(struct coord_http *h, bool all) {
  for (int i = 0; all || i < LOOP_BATCH; i++) {
    const proto_msg_t *m;
    int rc = coord_http_rpc_recv(&h->rpc, &m);
    if (rc == 0) return;
    if (rc < 0) {
      FR_LOGW("HTTP: %s", fr_last_error());
      return;
    }
    if (rc == 1) coord_http__jobs_on_msg(h, m);
  }
}

/* How long the loop may sleep: until the next tick, or sooner when MHD
 * has work or a timeout due. */
static long loop_wait_ms(struct coord_http *h, uint64_t next_tick) {
  uint64_t now = fr_now_ns();
  long ms = next_tick > now ? (long)((next_tick - now) / 1000000ull) + 1 : 0;
  MHD_UNSIGNED_LONG_LONG t;
  if (MHD_get_timeout(h->daemon, &t) == MHD_YES && t < (MHD_UNSIGNED_LONG_LONG)ms) ms = (long)t;
  return ms;
}

static void loop_drain_wake(int fd) {
  uint64_t v;
  while (read(fd, &v, sizeof v) > 0) continue;
}

/* One turn after poll: the coordinator's messages, the stop, MHD, the
 * tick. Returns false once a stop is over. */
static bool loop_turn(struct coord_http *h, uint64_t *next_tick, uint64_t *stop_end) {
  bool stopping = atomic_load(&h->stopping);
  /* a stop reads every message the coordinator queued before it ends the jobs left */
  loop_read_rpc(h, stopping && !*stop_end);
  if (stopping && !*stop_end) {
    coord_http__jobs_stop(h);
    *stop_end = fr_now_ns() + LOOP_CLOSE_NS;
  }
  MHD_run(h->daemon);
  uint64_t now = fr_now_ns();
  if (now >= *next_tick) {
    coord_http__jobs_tick(h, now);
    coord_http__conns_tick(h, now);
    *next_tick = now + LOOP_TICK_NS;
  }
  if (!*stop_end) return true;
  if (!coord_http__conns_answering(h)) return false;
  if (now < *stop_end) return true;
  FR_LOGW("HTTP: closing connections whose answers were not sent within %llu ms", LOOP_CLOSE_NS / 1000000ull);
  return false;
}

static void *loop_main(void *arg) {
  struct coord_http *h = arg;
  const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_EPOLL_FD);
  zmq_pollitem_t it[3] = {{.socket = h->rpc.sock, .events = ZMQ_POLLIN},
                          {.fd = di ? di->epoll_fd : -1, .events = ZMQ_POLLIN},
                          {.fd = h->wake_fd, .events = ZMQ_POLLIN}};
  uint64_t next_tick = fr_now_ns() + LOOP_TICK_NS, stop_end = 0;
  do {
    if (zmq_poll(it, 3, loop_wait_ms(h, next_tick)) < 0 && zmq_errno() != EINTR) {
      FR_LOGE("HTTP: poll: %s", zmq_strerror(zmq_errno()));
      nanosleep(&(struct timespec){.tv_nsec = 10 * 1000000L}, NULL); /* no spin */
    }
    if (it[2].revents) loop_drain_wake(h->wake_fd);
  } while (loop_turn(h, &next_tick, &stop_end));
  return NULL;
}

int coord_http__loop_start(struct coord_http *h) {
  h->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (h->wake_fd < 0) return fr_errorf(-errno, "HTTP: eventfd: %s", strerror(errno));
  int rc = pthread_create(&h->loop, NULL, loop_main, h);
  if (rc) return fr_errorf(-rc, "HTTP: cannot start the loop thread: %s", strerror(rc));
  h->loop_running = true;
  return 0;
}

void coord_http__loop_join(struct coord_http *h) {
  if (h->loop_running) {
    uint64_t one = 1;
    if (write(h->wake_fd, &one, sizeof one) < 0) FR_LOGD("HTTP: wake: %s", strerror(errno)); /* it ticks anyway */
    pthread_join(h->loop, NULL);
    h->loop_running = false;
  }
  if (h->wake_fd >= 0) close(h->wake_fd);
  h->wake_fd = -1;
}
