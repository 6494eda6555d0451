/* allreduce_bench.c - the tensor-parallel all-reduce of the backends
 * (kern_ops_t all_reduce), timed per message size: one process per rank, as
 * the workers run it; eager calls, and calls captured in a graph and
 * replayed (decode runs them so) where the backend has graphs.
 *
 * usage: allreduce_bench [--device cuda|cpu] [--ranks N] [--iters K] [--max-bytes B]
 * Rank 0 prints a markdown table: bytes, microseconds per call eager and in
 * a graph, and the bus bandwidth (nccl-tests' busbw: bytes * 2(n-1)/n / t).
 * Results: docs/bench/tensor-parallel.md.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "kernels/kern.h"

#define GRAPH_CALLS 16 /* all-reduces captured per graph */

typedef struct {
  const char *device;
  int ranks, iters;
  size_t max_bytes;
} bench_args_t;

/* Per-call microseconds of `iters` eager all-reduces of n elements. */
static double bench_eager(kern_backend_t *be, void *buf, size_t n, int iters) {
  const kern_ops_t *op = be->ops;
  for (int i = 0; i < 3; i++) op->all_reduce(be->ctx, buf, n);
  op->sync(be->ctx);
  uint64_t t0 = fr_now_ns();
  for (int i = 0; i < iters; i++)
    if (op->all_reduce(be->ctx, buf, n)) return -1;
  op->sync(be->ctx);
  return (double)(fr_now_ns() - t0) / 1e3 / iters;
}

/* Per-call microseconds with GRAPH_CALLS all-reduces in one graph, replayed. */
static double bench_graph(kern_backend_t *be, void *buf, size_t n, int iters) {
  const kern_ops_t *op = be->ops;
  if (!op->graph_begin) return -1;
  bool replayed = false;
  uint64_t key = 0x9e3779b97f4a7c15ull ^ n;
  if (op->graph_begin(be->ctx, key, &replayed)) return -1;
  for (int i = 0; i < GRAPH_CALLS && !replayed; i++)
    if (op->all_reduce(be->ctx, buf, n)) return -1;
  if (op->graph_end(be->ctx, key)) return -1;
  op->sync(be->ctx);
  int reps = FR_MAX(iters / GRAPH_CALLS, 4);
  uint64_t t0 = fr_now_ns();
  for (int r = 0; r < reps; r++) {
    if (op->graph_begin(be->ctx, key, &replayed) || !replayed) return -1;
    op->graph_end(be->ctx, key);
  }
  op->sync(be->ctx);
  return (double)(fr_now_ns() - t0) / 1e3 / (reps * GRAPH_CALLS);
}

static int bench_rank(const bench_args_t *a, int rank, const char *id) {
  char dev[64];
  kern_backend_t *be = NULL;
  int rc = kern_device_for_rank(a->device, rank, a->ranks, dev, sizeof dev);
  if (!rc) rc = kern_backend_create(&be, dev, 1);
  if (rc) goto out;
  size_t max_n = a->max_bytes / be->act_size;
  kern_comm_t cm = {.rank = rank, .size = a->ranks, .id = id, .max_elems = max_n};
  void *buf = NULL;
  if ((rc = be->ops->comm_init(be->ctx, &cm)) || (rc = be->ops->alloc(be->ctx, a->max_bytes, &buf))) goto out;
  if (rank == 0) {
    printf("| bytes | eager us | graph us | busbw GB/s (best) |\n|---:|---:|---:|---:|\n");
  }
  for (size_t bytes = 8192; bytes <= a->max_bytes; bytes *= 2) {
    size_t n = bytes / be->act_size;
    int iters = bytes <= (1u << 20) ? a->iters : FR_MAX(a->iters / 10, 10);
    double e = bench_eager(be, buf, n, iters), g = bench_graph(be, buf, n, iters);
    double best = g > 0 && g < e ? g : e;
    double busbw = (double)bytes * 2.0 * (a->ranks - 1) / a->ranks / (best * 1e-6) / 1e9;
    if (rank == 0) {
      char gs[32] = "-";
      if (g > 0) snprintf(gs, sizeof gs, "%.1f", g);
      printf("| %zu | %.1f | %s | %.1f |\n", bytes, e, gs, busbw);
      fflush(stdout);
    }
  }
  be->ops->free(be->ctx, buf);
out:
  if (rc) fprintf(stderr, "rank %d: %s\n", rank, fr_last_error());
  kern_backend_destroy(be);
  return rc ? 1 : 0;
}

static int bench_parse(int argc, char **argv, bench_args_t *a) {
  *a = (bench_args_t){.device = "cuda", .ranks = 2, .iters = 200, .max_bytes = 64u << 20};
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--device")) a->device = argv[i + 1];
    else if (!strcmp(argv[i], "--ranks")) a->ranks = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--iters")) a->iters = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--max-bytes")) a->max_bytes = strtoull(argv[i + 1], NULL, 10);
    else return -1;
  }
  return argc % 2 == 1 && a->ranks >= 2 && a->ranks <= 16 && a->iters > 0 && a->max_bytes >= 8192 ? 0 : -1;
}

int main(int argc, char **argv) {
  bench_args_t a;
  if (bench_parse(argc, argv, &a)) {
    fprintf(stderr, "usage: allreduce_bench [--device cuda|cpu] [--ranks N] [--iters K] [--max-bytes B]\n");
    return 2;
  }
  /* rank 0 makes the rendezvous and hands it to the others through a pipe,
   * as the coordinator hands rank 0's hello on to the other loads */
  int fds[2];
  if (pipe(fds)) return 1;
  pid_t pids[16];
  for (int r = 0; r < a.ranks; r++) {
    if ((pids[r] = fork()) != 0) continue;
    char id[KERN_COMM_ID_MAX] = "";
    if (r == 0) {
      if (!strncmp(a.device, "cuda", 4) && kern_nccl_new_id(id, sizeof id)) {
        fprintf(stderr, "%s\n", fr_last_error());
        _exit(1);
      }
      if (!id[0]) snprintf(id, sizeof id, "shm:/ferrum-allreduce-bench-%d", (int)getppid());
      for (int k = 1; k < a.ranks; k++)
        if (write(fds[1], id, sizeof id) != (ssize_t)sizeof id) _exit(1);
    } else if (read(fds[0], id, sizeof id) != (ssize_t)sizeof id) {
      _exit(1);
    }
    _exit(bench_rank(&a, r, id));
  }
  int failed = 0;
  for (int r = 0; r < a.ranks; r++) {
    int st;
    waitpid(pids[r], &st, 0);
    failed |= !WIFEXITED(st) || WEXITSTATUS(st);
  }
  return failed;
}
