/* read_bench.c - how fast the io_uring reader (common/fr_read.h) reads
 * files from the page cache into memory, the first half of weight loading.
 * usage: read_bench [--depth N] [--piece BYTES] [--chunk BYTES] [--ahead N] FILE...
 * Reads every file whole, chunk by chunk into a ring of `ahead` chunk
 * buffers, keeping `ahead` chunks in flight as the CUDA loader does, and
 * prints GB/s (1e9 bytes). Run it twice: the first run may fill the page cache. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fr_err.h"
#include "common/fr_read.h"
#include "common/fr_util.h"

typedef struct {
  unsigned depth;
  size_t piece, chunk;
  int ahead;
} read_opts_t;

/* Reads fd (size bytes) through r into the ring; returns 0 or an error. */
static int read_file(fr_reader_t *r, int fd, size_t size, const read_opts_t *o, uint8_t **ring,
                     fr_read_batch_t *batches) {
  int head = 0, n = 0, rc = 0;
  for (size_t off = 0; rc == 0 && (off < size || n > 0);) {
    if (off < size && n < o->ahead) {
      int i = (head + n++) % o->ahead;
      batches[i] = (fr_read_batch_t){0, 0};
      size_t len = FR_MIN(o->chunk, size - off);
      rc = fr_reader_read(r, fd, off, ring[i], len, &batches[i]);
      off += len;
      continue;
    }
    rc = fr_reader_wait(r, &batches[head]);
    head = (head + 1) % o->ahead, n--;
  }
  for (; n > 0; n--, head = (head + 1) % o->ahead) fr_reader_wait(r, &batches[head]);
  return rc;
}

int main(int argc, char **argv) {
  read_opts_t o = {.depth = 64, .piece = 2u << 20, .chunk = 16u << 20, .ahead = 6};
  int a = 1;
  for (; a + 1 < argc && !strncmp(argv[a], "--", 2); a += 2) {
    long long v = atoll(argv[a + 1]);
    if (!strcmp(argv[a], "--depth")) o.depth = (unsigned)v;
    else if (!strcmp(argv[a], "--piece")) o.piece = (size_t)v;
    else if (!strcmp(argv[a], "--chunk")) o.chunk = (size_t)v;
    else if (!strcmp(argv[a], "--ahead")) o.ahead = (int)v;
    else break;
  }
  if (a >= argc || o.depth == 0 || o.piece == 0 || o.chunk == 0 || o.ahead <= 0) {
    fprintf(stderr, "usage: read_bench [--depth N] [--piece BYTES] [--chunk BYTES] [--ahead N] FILE...\n");
    return 2;
  }
  uint8_t **ring = fr_calloc((size_t)o.ahead, sizeof *ring);
  fr_read_batch_t *batches = fr_calloc((size_t)o.ahead, sizeof *batches);
  for (int i = 0; i < o.ahead; i++) ring[i] = fr_malloc_aligned(o.chunk);
  fr_reader_t *r = fr_reader_create(o.depth, o.piece);
  uint64_t total = 0, t0 = fr_now_ns();
  int rc = 0;
  for (; a < argc && rc == 0; a++) {
    int fd = open(argv[a], O_RDONLY);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0) {
      perror(argv[a]);
      return 1;
    }
    rc = read_file(r, fd, (size_t)sb.st_size, &o, ring, batches);
    total += (uint64_t)sb.st_size;
    close(fd);
  }
  double s = (double)(fr_now_ns() - t0) / 1e9;
  if (rc) fprintf(stderr, "read_bench: %s\n", fr_strerror(rc));
  printf("%s: %.2f GB in %.3f s, %.2f GB/s (depth %u, piece %zu KiB, chunk %zu MiB, ahead %d)\n",
         fr_reader_async(r) ? "io_uring" : "pread", (double)total / 1e9, s, (double)total / 1e9 / s, o.depth,
         o.piece >> 10, o.chunk >> 20, o.ahead);
  fr_reader_destroy(r);
  for (int i = 0; i < o.ahead; i++) fr_free_aligned(ring[i]);
  free(ring);
  free(batches);
  return rc ? 1 : 0;
}
