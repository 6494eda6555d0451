/* fr_read.h - parallel file reads into memory with io_uring (liburing).
 *
 * Loading weights from the page cache is a memory copy the kernel does; one
 * thread copies at 5-10 GB/s. The reader splits each read into pieces and
 * queues them with IOSQE_ASYNC, so the kernel's io-wq workers copy pieces
 * in parallel while the caller goes on (e.g. queues DMA of earlier data).
 * Where io_uring is not available (an old kernel, a seccomp profile that
 * blocks it, as container runtimes' defaults may), reads fall back to
 * pread(2) done at once, in the caller's thread.
 *
 * Threads: one reader per thread. Ownership: buffers and fds are the
 * caller's; they must stay valid until the reads that use them are waited
 * for.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fr_reader fr_reader_t;

/* A group of reads waited for together; zero it before the first read. */
typedef struct {
  int pending; /* pieces queued and not yet done */
  int error;   /* first error of the group's pieces, 0 = none */
} fr_read_batch_t;

/* Makes a reader with at most `depth` pieces in flight, each at most
 * `piece` bytes (0: defaults, 64 pieces of 2 MiB). Never fails: without
 * io_uring it reads synchronously (fr_reader_async says which). */
fr_reader_t *fr_reader_create(unsigned depth, size_t piece);

/* Waits for the reads in flight and frees the reader (NULL is fine). */
void fr_reader_destroy(fr_reader_t *r);

/* Whether reads go through io_uring (else pread, synchronously). */
int fr_reader_async(const fr_reader_t *r);

/* Queues a read of len bytes at offset off of fd into dst, as part of
 * batch b (which must live until fr_reader_wait(r, b) returns). Returns 0,
 * or b's first error so far (the caller may stop queueing). */
int fr_reader_read(fr_reader_t *r, int fd, uint64_t off, void *dst, size_t len, fr_read_batch_t *b);

/* Waits until every read of b is done, completing the reads of other
 * batches that finish meanwhile. Returns 0, or b's first error: -errno of a
 * read, or FR_ETRUNCATED for one that hit the end of its file. */
int fr_reader_wait(fr_reader_t *r, fr_read_batch_t *b);

#ifdef __cplusplus
}
#endif
