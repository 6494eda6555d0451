/* allreduce_bench.c - the tensor-parallel all-reduce of the backends
 * (kern_ops_t all_reduce), timed per message size: one process per rank, as
 * the workers run it; eager calls, and calls captured in a graph and
 * replayed (decode runs them so) where the backend has graphs.
 *
 * usage: allreduce_bench [--device cuda|cpu] [--ranks N] [--iters K] [--max-bytes B] [--check 1]
 * Rank 0 prints a markdown table: bytes, microseconds per call eager and in
 * a graph, and the bus bandwidth (nccl-tests' busbw: bytes * 2(n-1)/n / t).
 * Results: docs/bench/tensor-parallel.md.
 *
 * --check 1 times nothing: it checks the all-reduce against the sum in rank
 * order computed here, and the all-reduce fused with add_rms_norm (where the
 * backend has it) against the two ops, bit for bit, over a sequence of calls
 * of mixed sizes (so that a one-shot buffer's slots rotate through every
 * shape) run eagerly and replayed from a graph, with new inputs each round.
 * Rank 0 prints a line per round; the exit status is 1 on any mismatch.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fr_err.h"
#include "common/fr_hash.h"
#include "common/fr_util.h"
#include "kernels/kern.h"

#define GRAPH_CALLS 16 /* all-reduces captured per graph */

typedef struct {
  const char *device;
  int ranks, iters, check;
  size_t max_bytes;
} bench_args_t;

/* ---- --check ---------------------------------------------------------------- */

#define CHECK_ROUNDS 6

typedef struct {
  int rows, dim; /* fused: rows of dim; plain: rows * dim elements */
  bool fused;
  void *part, *res, *ref_part, *ref_res; /* device: inputs of the op and of its reference */
} check_case_t;

/* Sizes around the one-shot path's limits (512 KiB, rows of <= 8192, 16-byte
 * vectors), for Llama-3-8B's dim 4096 and a small model's 512. */
static const int check_shapes[][3] = {
    {1, 4096, 1}, {4096, 1, 0}, {3, 4096, 1}, {1, 4096 * 3 + 40, 0}, {64, 4096, 1}, {5, 512, 1},
    {128, 4096, 1}, {1, 1 << 19, 0}, {2, 1004, 1}, {1, 4096, 0},
};
#define CHECK_CASES (int)(sizeof check_shapes / sizeof check_shapes[0])

/* Element i of a host copy of activations (f32, bf16 or f16). */
static void check_put(const kern_backend_t *be, uint8_t *h, size_t i, float f) {
  if (be->act_type == KERN_F32) memcpy(h + 4 * i, &f, 4);
  else ((uint16_t *)h)[i] = be->act_type == KERN_BF16 ? fr_fp32_to_bf16(f) : fr_fp32_to_fp16(f);
}
static float check_get(const kern_backend_t *be, const uint8_t *h, size_t i) {
  float f;
  if (be->act_type == KERN_F32) memcpy(&f, h + 4 * i, 4);
  else f = be->act_type == KERN_BF16 ? fr_bf16_to_fp32(((const uint16_t *)h)[i]) : fr_fp16_to_fp32(((const uint16_t *)h)[i]);
  return f;
}
/* f as an activation holds it. */
static float check_round(const kern_backend_t *be, float f) {
  uint8_t h[4];
  check_put(be, h, 0, f);
  return check_get(be, h, 0);
}

/* Rank r's input element i in round k: small values, exact zeros and
 * negative zeros among them. */
static float check_value(int r, int k, int cs, size_t i) {
  uint64_t h = fr_mix64(((uint64_t)r << 48) ^ ((uint64_t)k << 40) ^ ((uint64_t)cs << 32) ^ i);
  if (h % 61 == 0) return -0.0f;
  if (h % 67 == 0) return 0.0f;
  return (float)((int64_t)(h >> 40) % 4001 - 2000) / 1000.0f;
}

static size_t check_n(const check_case_t *c) { return (size_t)c->rows * (size_t)c->dim; }

/* The round's inputs of every case on this rank (the same in the op's and
 * the reference's buffers). */
static int check_upload(kern_backend_t *be, check_case_t *cs, int rank, int k, uint8_t *h) {
  for (int c = 0; c < CHECK_CASES; c++) {
    size_t n = check_n(&cs[c]), bytes = n * be->act_size;
    for (size_t i = 0; i < n; i++) check_put(be, h, i, check_value(rank, k, c, i));
    int rc = be->ops->upload(be->ctx, cs[c].part, h, bytes);
    if (!rc) rc = be->ops->upload(be->ctx, cs[c].ref_part, h, bytes);
    if (rc) return rc;
    if (!cs[c].fused) continue;
    for (size_t i = 0; i < n; i++) check_put(be, h, i, check_value(1000, k, c, i)); /* the residual: shared */
    if ((rc = be->ops->upload(be->ctx, cs[c].res, h, bytes)) || (rc = be->ops->upload(be->ctx, cs[c].ref_res, h, bytes)))
      return rc;
  }
  return 0;
}

/* Every case's op, in order (a fused case with no fused op: skipped). */
static int check_ops(kern_backend_t *be, check_case_t *cs, const kern_weight_t *w, bool reference) {
  const kern_ops_t *op = be->ops;
  for (int c = 0; c < CHECK_CASES; c++) {
    check_case_t *x = &cs[c];
    int rc = 0;
    if (!x->fused) rc = reference ? 0 : op->all_reduce(be->ctx, x->part, check_n(x));
    else if (!op->all_reduce_add_rms_norm) rc = 0;
    else if (!reference) rc = op->all_reduce_add_rms_norm(be->ctx, x->part, x->res, x->part, w, x->rows, x->dim, 1e-5f);
    else if (!(rc = op->all_reduce(be->ctx, x->ref_part, check_n(x))))
      rc = op->add_rms_norm(be->ctx, x->ref_part, x->ref_res, x->ref_part, w, x->rows, x->dim, 1e-5f);
    if (rc) return rc;
  }
  return 0;
}

/* The activation type's unit roundoff. */
static float check_unit(const kern_backend_t *be) {
  return be->act_type == KERN_F32 ? 0x1p-24f : be->act_type == KERN_BF16 ? 0x1p-8f : 0x1p-11f;
}

/* Mismatches of the round's results: plain cases against the sum in rank
 * order, fused ones (output and residual) against the two ops. */
static long check_compare(kern_backend_t *be, check_case_t *cs, int ranks, int k, uint8_t *a, uint8_t *b) {
  long bad = 0;
  for (int c = 0; c < CHECK_CASES; c++) {
    const check_case_t *x = &cs[c];
    size_t n = check_n(x), bytes = n * be->act_size;
    if (x->fused && !be->ops->all_reduce_add_rms_norm) continue;
    for (int pass = 0; pass < (x->fused ? 2 : 1); pass++) {
      if (be->ops->download(be->ctx, a, pass ? x->res : x->part, bytes)) return -1;
      if (x->fused && be->ops->download(be->ctx, b, pass ? x->ref_res : x->ref_part, bytes)) return -1;
      for (size_t i = 0; i < n; i++) {
        float want, mag = 0.0f;
        if (x->fused) {
          want = check_get(be, b, i);
        } else {
          float acc = 0.0f;
          for (int r = 0; r < ranks; r++) {
            const float v = check_round(be, check_value(r, k, c, i));
            acc += v;
            mag += fabsf(v);
          }
          want = check_round(be, acc);
        }
        float got = check_get(be, a, i);
        /* beyond two ranks NCCL's ring adds in an order of its own, rounding
         * each partial sum to the activation type: at most a unit roundoff
         * of the terms' magnitude per addition, and one for want's own */
        float tol = ranks > 2 && !x->fused ? (float)ranks * mag * check_unit(be) + 1e-6f : 0.0f;
        if (!(fabsf(got - want) <= tol)) {
          if (bad < 5) fprintf(stderr, "check: round %d case %d (%d x %d%s) %s[%zu] = %g, want %g\n", k, c, x->rows,
                               x->dim, x->fused ? ", fused" : "", pass ? "residual" : "out", i, got, want);
          bad++;
        }
      }
    }
  }
  return bad;
}

/* The device buffers of the cases and the norm weight. */
static void check_free(kern_backend_t *be, check_case_t *cs, kern_weight_t *w) {
  for (int c = 0; c < CHECK_CASES; c++) {
    void *bufs[4] = {cs[c].part, cs[c].res, cs[c].ref_part, cs[c].ref_res};
    for (int k = 0; k < 4; k++)
      if (bufs[k]) be->ops->free(be->ctx, bufs[k]);
  }
  if (w->data) be->ops->free(be->ctx, w->data);
}

static int check_rank(kern_backend_t *be, int rank, int ranks) {
  const kern_ops_t *op = be->ops;
  check_case_t cs[CHECK_CASES] = {0};
  size_t max_n = 0;
  int rc = 0, max_dim = 0;
  for (int c = 0; c < CHECK_CASES && !rc; c++) {
    cs[c] = (check_case_t){.rows = check_shapes[c][0], .dim = check_shapes[c][1], .fused = check_shapes[c][2]};
    size_t bytes = check_n(&cs[c]) * be->act_size;
    max_n = FR_MAX(max_n, check_n(&cs[c]));
    max_dim = cs[c].fused ? FR_MAX(max_dim, cs[c].dim) : max_dim;
    void **bufs[4] = {&cs[c].part, &cs[c].res, &cs[c].ref_part, &cs[c].ref_res};
    for (int b = 0; b < 4 && !rc; b++) rc = op->alloc(be->ctx, bytes, bufs[b]);
  }
  float *wh = fr_malloc((size_t)max_dim * sizeof(float));
  for (int i = 0; i < max_dim; i++) wh[i] = 0.5f + (float)(i % 13) / 8.0f;
  kern_weight_t w = {.type = KERN_F32, .rows = 1, .cols = max_dim, .row_bytes = (size_t)max_dim * sizeof(float)};
  if (!rc) rc = op->alloc(be->ctx, w.row_bytes, &w.data);
  if (!rc) rc = op->upload(be->ctx, w.data, wh, w.row_bytes);
  free(wh);
  uint8_t *a = fr_malloc(max_n * be->act_size), *b = fr_malloc(max_n * be->act_size);
  long total = 0;
  for (int k = 0; k < CHECK_ROUNDS && !rc; k++) {
    bool graph = op->graph_begin && k >= CHECK_ROUNDS / 2, replayed = false;
    if ((rc = check_upload(be, cs, rank, k, a))) break;
    if ((rc = check_ops(be, cs, &w, true))) break;
    if (graph && (rc = op->graph_begin(be->ctx, 0x5eedull, &replayed))) break;
    if (!replayed && (rc = check_ops(be, cs, &w, false))) break;
    if ((graph && (rc = op->graph_end(be->ctx, 0x5eedull))) || (rc = op->sync(be->ctx))) break;
    long bad = check_compare(be, cs, ranks, k, a, b);
    if (bad < 0) rc = -EIO;
    total += bad > 0 ? bad : 0;
    if (rank == 0) printf("check round %d (%s): %ld mismatches\n", k, graph ? (replayed ? "graph replay" : "graph capture") : "eager", bad);
    fflush(stdout);
  }
  free(a);
  free(b);
  check_free(be, cs, &w);
  if (rc) return rc;
  if (total) return fr_errorf(-EIO, "%ld mismatches", total);
  return 0;
}

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
  if ((rc = be->ops->comm_init(be->ctx, &cm))) goto out;
  if (a->check) {
    rc = check_rank(be, rank, a->ranks);
    goto out;
  }
  if ((rc = be->ops->alloc(be->ctx, a->max_bytes, &buf))) goto out;
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
    else if (!strcmp(argv[i], "--check")) a->check = atoi(argv[i + 1]);
    else return -1;
  }
  return argc % 2 == 1 && a->ranks >= 2 && a->ranks <= 16 && a->iters > 0 && a->max_bytes >= 8192 ? 0 : -1;
}

int main(int argc, char **argv) {
  bench_args_t a;
  if (bench_parse(argc, argv, &a)) {
    fprintf(stderr, "usage: allreduce_bench [--device cuda|cpu] [--ranks N] [--iters K] [--max-bytes B] [--check 1]\n");
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
