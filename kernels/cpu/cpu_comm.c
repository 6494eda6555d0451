/* cpu_comm.c - the CPU backend's tensor-parallel all-reduce over POSIX
 * shared memory ("shm:<name>" groups, kern.h).
 *
 * The segment holds a barrier and two banks of one slot per rank, each slot
 * the larger of max_elems and max_gather floats. An all-reduce copies the rank's buffer into its slot of
 * the current bank, waits at the barrier, then sums every rank's slot in
 * rank order into the buffer: every rank adds the same numbers in the same
 * order, so all get bit-identical results. Banks alternate, so one barrier
 * per all-reduce is enough: a rank can only write a bank again after the
 * next barrier, which every rank reaches only once it has read that bank.
 *
 * gather_cols (the LM head's logits, split by vocabulary) uses the same
 * banks: each rank writes its part, and after the barrier rank 0 copies
 * them into place.
 *
 * The barrier spins briefly, then sleeps on a futex (FUTEX_WAIT on the
 * shared word, not the private form). A peer that stops arriving (dead or
 * hung) turns into an error after CPU_COMM_TIMEOUT_MS; the coordinator
 * restarts the whole group.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common/fr_err.h"
#include "common/fr_log.h"
#include "common/fr_util.h"
#include "kernels/cpu/cpu.h"

#define CPU_COMM_TIMEOUT_MS 60000 /* a barrier waits this long for its peers */
#define CPU_COMM_SPINS 4000       /* polls before sleeping on the futex */
#define CPU_COMM_MAGIC 0x66727470u /* "frtp" */

typedef struct {
  _Atomic uint32_t arrived; /* ranks at the barrier of generation gen */
  _Atomic uint32_t gen;     /* bumped by the last rank to arrive (the futex word) */
  _Atomic uint32_t joined;  /* ranks that mapped the segment */
  uint32_t magic, size;
  uint64_t max_elems;
} cpu_comm_hdr_t;

struct cpu_comm {
  cpu_comm_hdr_t *hdr;
  float *slots; /* (2 banks, size ranks, max_elems) */
  size_t map_bytes;
  int rank, size;
  size_t max_elems;
  unsigned bank;
};

static size_t cpu_comm_hdr_bytes(void) { return 64; }

static long cpu_futex(_Atomic uint32_t *word, int op, uint32_t val, const struct timespec *ts) {
  return syscall(SYS_futex, (uint32_t *)word, op, val, ts, NULL, 0);
}

/* Waits until every rank arrived. Returns 0, or FR_ETIMEOUT. */
static int cpu_comm_barrier(cpu_comm_t *c) {
  cpu_comm_hdr_t *h = c->hdr;
  uint32_t gen = atomic_load_explicit(&h->gen, memory_order_acquire);
  if (atomic_fetch_add_explicit(&h->arrived, 1, memory_order_acq_rel) + 1 == (uint32_t)c->size) {
    atomic_store_explicit(&h->arrived, 0, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->gen, 1, memory_order_release);
    cpu_futex(&h->gen, FUTEX_WAKE, INT32_MAX, NULL);
    return 0;
  }
  for (int i = 0; i < CPU_COMM_SPINS; i++) {
    if (atomic_load_explicit(&h->gen, memory_order_acquire) != gen) return 0;
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
  uint64_t deadline = fr_now_ns() + (uint64_t)CPU_COMM_TIMEOUT_MS * 1000000ull;
  while (atomic_load_explicit(&h->gen, memory_order_acquire) == gen) {
    struct timespec ts = {.tv_sec = 0, .tv_nsec = 100 * 1000000}; /* re-check the deadline 10 times a second */
    cpu_futex(&h->gen, FUTEX_WAIT, gen, &ts);
    if (fr_now_ns() > deadline)
      return fr_errorf(FR_ETIMEOUT, "tensor-parallel barrier: a peer rank has not arrived in %d s",
                       CPU_COMM_TIMEOUT_MS / 1000);
  }
  return 0;
}

/* Opens (creating if first) the segment and checks its geometry. */
static int cpu_comm_map(cpu_comm_t *c, const char *name) {
  size_t slot_bytes = c->max_elems * sizeof(float);
  c->map_bytes = cpu_comm_hdr_bytes() + 2 * (size_t)c->size * slot_bytes;
  int fd = shm_open(name, O_RDWR | O_CREAT | O_NOFOLLOW, 0600);
  if (fd < 0) return fr_errorf(-errno, "tensor-parallel segment %s: %s", name, strerror(errno));
  struct stat st;
  int rc = 0;
  if (fstat(fd, &st) != 0) rc = fr_errorf(-errno, "tensor-parallel segment %s: %s", name, strerror(errno));
  else if (st.st_uid != geteuid()) rc = fr_errorf(-EPERM, "tensor-parallel segment %s belongs to another user", name);
  /* every rank sizes it alike; growing a segment zero-fills it */
  else if ((size_t)st.st_size < c->map_bytes && ftruncate(fd, (off_t)c->map_bytes) != 0)
    rc = fr_errorf(-errno, "tensor-parallel segment %s: %s", name, strerror(errno));
  void *p = rc ? MAP_FAILED : mmap(NULL, c->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (!rc && p == MAP_FAILED) rc = fr_errorf(-errno, "tensor-parallel segment %s: mmap: %s", name, strerror(errno));
  close(fd);
  if (rc) return rc;
  c->hdr = p;
  c->slots = (float *)((uint8_t *)p + cpu_comm_hdr_bytes());
  return 0;
}

/* A slot holds the largest all-reduce or gather part. */
static size_t cpu_comm_slot_elems(const kern_comm_t *cm) { return FR_MAX(cm->max_elems, cm->max_gather); }

int cpu__comm_init(void *vctx, const kern_comm_t *cm) {
  cpu_ctx_t *ctx = vctx;
  if (ctx->comm) return fr_errorf(FR_ESTATE, "tensor parallel: this backend is in a group already");
  if (!cm->id || strncmp(cm->id, "shm:/", 5) || strlen(cm->id) > 5 + NAME_MAX || strchr(cm->id + 5, '/'))
    return fr_errorf(-EINVAL, "tensor parallel on the CPU needs a shm:/<name> group id, not '%s'",
                     cm->id ? cm->id : "");
  if (cm->size < 1 || cm->rank < 0 || cm->rank >= cm->size || cm->max_elems == 0)
    return fr_errorf(-EINVAL, "tensor parallel: rank %d of %d, %zu elements", cm->rank, cm->size, cm->max_elems);
  cpu_comm_t *c = fr_calloc(1, sizeof *c);
  *c = (cpu_comm_t){.rank = cm->rank, .size = cm->size, .max_elems = cpu_comm_slot_elems(cm)};
  const char *name = cm->id + 4;
  int rc = cpu_comm_map(c, name);
  if (rc) {
    free(c);
    return rc;
  }
  /* the first rank in writes the geometry; every rank checks it after the
   * barrier, which the writer reaches only once it has written it */
  if (atomic_fetch_add(&c->hdr->joined, 1) == 0) {
    c->hdr->magic = CPU_COMM_MAGIC;
    c->hdr->size = (uint32_t)cm->size;
    c->hdr->max_elems = c->max_elems;
  }
  ctx->comm = c;
  rc = cpu_comm_barrier(c); /* everyone mapped it: the name can go */
  if (!rc && (c->hdr->magic != CPU_COMM_MAGIC || c->hdr->size != (uint32_t)cm->size ||
              c->hdr->max_elems != c->max_elems))
    rc = fr_errorf(FR_ESTATE, "tensor-parallel segment %s: the ranks disagree on the group's geometry", name);
  if (cm->rank == 0) shm_unlink(name);
  if (rc) {
    cpu__comm_destroy(ctx);
    return rc;
  }
  FR_LOGD("tensor parallel: rank %d of %d over %s (%zu MiB)", cm->rank, cm->size, name, c->map_bytes >> 20);
  return 0;
}

int cpu__all_reduce(void *vctx, void *buf, size_t n) {
  cpu_ctx_t *ctx = vctx;
  cpu_comm_t *c = ctx->comm;
  if (!c) return fr_errorf(FR_ESTATE, "all_reduce: the backend is in no tensor-parallel group");
  if (n > c->max_elems) return fr_errorf(FR_ETOOBIG, "all_reduce of %zu elements, the group holds %zu", n, c->max_elems);
  if (c->size == 1 || n == 0) return 0;
  float *bank = c->slots + (size_t)c->bank * (size_t)c->size * c->max_elems, *x = buf;
  c->bank ^= 1u;
  memcpy(bank + (size_t)c->rank * c->max_elems, x, n * sizeof(float));
  int rc = cpu_comm_barrier(c);
  if (rc) return rc;
  memcpy(x, bank, n * sizeof(float));
  for (int r = 1; r < c->size; r++) {
    const float *y = bank + (size_t)r * c->max_elems;
    for (size_t i = 0; i < n; i++) x[i] += y[i];
  }
  return 0;
}

/* This rank's part goes into its slot of the current bank; after the
 * barrier rank 0 copies every rank's into its columns of out. */
int cpu__gather_cols(void *vctx, void *out, const void *part, int n, int cols) {
  cpu_ctx_t *ctx = vctx;
  cpu_comm_t *c = ctx->comm;
  if (!c) return fr_errorf(FR_ESTATE, "gather_cols: the backend is in no tensor-parallel group");
  size_t per = (size_t)n * (size_t)cols;
  if (n < 0 || cols < 0 || per > c->max_elems)
    return fr_errorf(FR_ETOOBIG, "gather_cols of %d x %d, the group holds %zu", n, cols, c->max_elems);
  float *bank = c->slots + (size_t)c->bank * (size_t)c->size * c->max_elems;
  c->bank ^= 1u;
  memcpy(bank + (size_t)c->rank * c->max_elems, part, per * sizeof(float));
  int rc = cpu_comm_barrier(c);
  if (rc || c->rank != 0) return rc;
  float *o = out;
  const size_t total = (size_t)cols * (size_t)c->size;
  for (int r = 0; r < c->size; r++)
    for (int i = 0; i < n; i++)
      memcpy(o + (size_t)i * total + (size_t)r * cols, bank + (size_t)r * c->max_elems + (size_t)i * cols,
             (size_t)cols * sizeof(float));
  return 0;
}

void cpu__comm_destroy(cpu_ctx_t *ctx) {
  cpu_comm_t *c = ctx->comm;
  if (!c) return;
  munmap(c->hdr, c->map_bytes);
  free(c);
  ctx->comm = NULL;
}
