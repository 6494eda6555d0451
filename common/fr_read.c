/* fr_read.c - parallel file reads with io_uring, pread as the fallback.
 * See fr_read.h. Each piece is one IORING_OP_READ with IOSQE_ASYNC: a read
 * of cached pages would otherwise complete inline, in this thread, one
 * piece after another; punted to io-wq, the pieces are copied by several
 * kernel workers at once. */
#include "common/fr_read.h"

#include <errno.h>
#include <liburing.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/fr_err.h"
#include "common/fr_util.h"

#define FR_READ_DEPTH 64u
#define FR_READ_PIECE ((size_t)2 << 20)

typedef struct {
  fr_read_batch_t *b;
  int fd;
  uint64_t off;
  uint8_t *dst;
  size_t len;
} fr_read_req_t;

struct fr_reader {
  struct io_uring ring;
  bool async;              /* the ring exists */
  unsigned depth, inflight;
  size_t piece;
  fr_read_req_t *reqs;     /* (depth) */
  unsigned *free_ids;      /* (depth) stack of unused reqs */
  unsigned n_free;
};

fr_reader_t *fr_reader_create(unsigned depth, size_t piece) {
  fr_reader_t *r = fr_calloc(1, sizeof *r);
  r->depth = depth ? depth : FR_READ_DEPTH;
  r->piece = piece ? piece : FR_READ_PIECE;
  r->reqs = fr_calloc(r->depth, sizeof *r->reqs);
  r->free_ids = fr_calloc(r->depth, sizeof *r->free_ids);
  for (unsigned i = 0; i < r->depth; i++) r->free_ids[i] = r->depth - 1 - i;
  r->n_free = r->depth;
  r->async = io_uring_queue_init(r->depth, &r->ring, 0) == 0;
  return r;
}

int fr_reader_async(const fr_reader_t *r) { return r->async; }

static void fr__read_fail(fr_read_batch_t *b, int err) {
  if (!b->error) b->error = err;
}

/* Reads a piece with pread, at once (the fallback). */
static void fr__read_sync(int fd, uint64_t off, uint8_t *dst, size_t len, fr_read_batch_t *b) {
  while (len > 0 && !b->error) {
    ssize_t n = pread(fd, dst, len, (off_t)off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fr__read_fail(b, -errno);
    else if (n == 0) fr__read_fail(b, FR_ETRUNCATED);
    else off += (uint64_t)n, dst += n, len -= (size_t)n;
  }
}

/* Queues req id's read; the ring has room (inflight < depth). */
static void fr__read_queue(fr_reader_t *r, unsigned id) {
  fr_read_req_t *q = &r->reqs[id];
  struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
  if (!sqe) { /* the SQ ring is full of unsubmitted entries */
    io_uring_submit(&r->ring);
    sqe = io_uring_get_sqe(&r->ring);
  }
  FR_ASSERT(sqe != NULL);
  io_uring_prep_read(sqe, q->fd, q->dst, (unsigned)q->len, q->off);
  io_uring_sqe_set_flags(sqe, IOSQE_ASYNC);
  io_uring_sqe_set_data64(sqe, id);
  r->inflight++;
}

/* Handles one completion: done, failed, or the rest of a short read queued again. */
static void fr__read_complete(fr_reader_t *r, const struct io_uring_cqe *cqe) {
  unsigned id = (unsigned)io_uring_cqe_get_data64(cqe);
  fr_read_req_t *q = &r->reqs[id];
  int res = cqe->res;
  r->inflight--;
  if (res == -EINTR || res == -EAGAIN) {
    fr__read_queue(r, id);
    return;
  }
  if (res > 0 && (size_t)res < q->len) {
    q->off += (uint64_t)res, q->dst += res, q->len -= (size_t)res;
    fr__read_queue(r, id);
    return;
  }
  if (res < 0) fr__read_fail(q->b, res);
  else if (res == 0) fr__read_fail(q->b, FR_ETRUNCATED);
  q->b->pending--;
  r->free_ids[r->n_free++] = id;
}

/* Submits what is queued and completes at least `min` reads (0: those
 * already done). Returns 0 or -errno of the ring itself. */
static int fr__read_reap(fr_reader_t *r, unsigned min) {
  int rc = min ? io_uring_submit_and_wait(&r->ring, min) : io_uring_submit(&r->ring);
  if (rc < 0 && rc != -EINTR) return rc;
  struct io_uring_cqe *cqe;
  unsigned head, n = 0;
  io_uring_for_each_cqe(&r->ring, head, cqe) {
    fr__read_complete(r, cqe);
    n++;
  }
  io_uring_cq_advance(&r->ring, n);
  return 0;
}

int fr_reader_read(fr_reader_t *r, int fd, uint64_t off, void *dst, size_t len, fr_read_batch_t *b) {
  uint8_t *p = dst;
  while (len > 0 && !b->error) {
    size_t n = FR_MIN(len, r->piece);
    if (!r->async) {
      fr__read_sync(fd, off, p, n, b);
    } else {
      while (r->n_free == 0) {
        int rc = fr__read_reap(r, 1);
        if (rc) return fr_errorf(rc, "io_uring: %s", fr_strerror(rc));
      }
      unsigned id = r->free_ids[--r->n_free];
      r->reqs[id] = (fr_read_req_t){.b = b, .fd = fd, .off = off, .dst = p, .len = n};
      b->pending++;
      fr__read_queue(r, id);
    }
    off += n, p += n, len -= n;
  }
  if (r->async && r->inflight) {
    int rc = fr__read_reap(r, 0); /* start what was queued */
    if (rc) return fr_errorf(rc, "io_uring: %s", fr_strerror(rc));
  }
  return b->error;
}

int fr_reader_wait(fr_reader_t *r, fr_read_batch_t *b) {
  while (b->pending > 0) {
    int rc = fr__read_reap(r, 1);
    if (rc) return fr_errorf(rc, "io_uring: %s", fr_strerror(rc));
  }
  return b->error;
}

void fr_reader_destroy(fr_reader_t *r) {
  if (!r) return;
  if (r->async) {
    while (r->inflight > 0 && fr__read_reap(r, 1) == 0) {
    }
    io_uring_queue_exit(&r->ring);
  }
  free(r->reqs);
  free(r->free_ids);
  free(r);
}
