/* cuda_ops.cu - op benchmark of the CUDA backend (not a test).
 *
 *   cuda_ops_bench [gemv|gemv1|attn|attn1|all] [ROWSxCOLS,...]
 *
 * Prints, on the current device:
 *  - the device-to-device copy bandwidth (bytes read + written), the ceiling;
 *  - matmul time and weight-streaming bandwidth for the Llama-3-8B shapes at
 *    batch 1, 8 and 64 for bf16, Q8_0 and Q4_K weights (and cuBLAS at batch
 *    1 for comparison), rotating over enough weight copies to defeat L2;
 *  - decode attention time (32 heads, 8 KV heads, head_dim 128) at several
 *    batch and context sizes, with its KV-read bandwidth; attn1: batch 1 at
 *    short contexts for the whole model's heads and TP shards'.
 * Ops are captured in a CUDA graph (through the backend's graph slots) and
 * timed with events on the backend's stream; the median of 7 runs. */
#include <algorithm>
#include <array>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "common/fr_util.h"
#include "kernels/cuda/kcu.cuh"

#define CK(x)                                                                            \
  do {                                                                                   \
    int rc_ = (x);                                                                       \
    if (rc_) {                                                                           \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, fr_last_error());       \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)
#define CU(x) CK((x) == cudaSuccess ? 0 : fr_errorf(FR_ECUDA, "%s", cudaGetErrorString(x)))

static kern_backend_t *B;
static kcu_ctx_t *C;
static uint64_t rs = 88172645463325252ull;
static uint64_t rnd(void) {
  rs ^= rs << 13;
  rs ^= rs >> 7;
  rs ^= rs << 17;
  return rs;
}

/* Times `fn` (which queues `reps` ops) captured in a graph: median ms per op. */
template <typename F> static double time_graph(uint64_t key, int reps, F fn) {
  bool replayed;
  CK(B->ops->graph_begin(B->ctx, key, &replayed));
  if (!replayed) fn();
  CK(B->ops->graph_end(B->ctx, key));
  CK(B->ops->sync(B->ctx));
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> ms;
  for (int i = 0; i < 7; i++) {
    cudaEventRecord(a, C->stream);
    CK(B->ops->graph_begin(B->ctx, key, &replayed));
    CK(B->ops->graph_end(B->ctx, key));
    cudaEventRecord(b, C->stream);
    cudaEventSynchronize(b);
    float t;
    cudaEventElapsedTime(&t, a, b);
    ms.push_back(t / reps);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[3];
}

__global__ void copy_k(uint4 *d, const uint4 *s, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    d[i] = s[i];
}

/* Device-to-device copy bandwidth (read + write), GB/s: a 16-byte-per-thread
 * copy kernel (the ceiling) and, into *memcpy_gbs, cudaMemcpyAsync. */
static double copy_bw(double *memcpy_gbs) {
  size_t n = (size_t)2 << 30;
  void *a, *b;
  CK(B->ops->alloc(B->ctx, n, &a));
  CK(B->ops->alloc(B->ctx, n, &b));
  cudaMemsetAsync(a, 1, n, C->stream);
  double ms = time_graph(1, 6, [&] {
    for (int i = 0; i < 6; i++)
      copy_k<<<C->n_sm * 8, 256, 0, C->stream>>>((uint4 *)(i % 2 ? a : b), (const uint4 *)(i % 2 ? b : a), n / 16);
  });
  double mc = time_graph(2, 6, [&] {
    for (int i = 0; i < 6; i++) CK(B->ops->copy(B->ctx, i % 2 ? a : b, i % 2 ? b : a, n));
  });
  *memcpy_gbs = 2.0 * n / (mc * 1e-3) / 1e9;
  B->ops->free(B->ctx, a);
  B->ops->free(B->ctx, b);
  return 2.0 * n / (ms * 1e-3) / 1e9;
}

static void *rand_weight_bytes(kern_type_t t, int64_t rows, int64_t cols, size_t *bytes) {
  size_t rb = kern_row_bytes(t, cols);
  *bytes = rb * rows;
  uint8_t *h = (uint8_t *)malloc(*bytes);
  uint64_t *w = (uint64_t *)h;
  for (size_t i = 0; i < *bytes / 8; i++) w[i] = rnd();
  const kern_type_traits_t *tr = kern_type_traits(t);
  if (t == KERN_BF16) {
    uint16_t *u = (uint16_t *)h;
    for (size_t i = 0; i < *bytes / 2; i++) u[i] = (u[i] & 0x807f) | 0x3c00;
  } else if (t == KERN_I4G) { /* f32 d and m */
    const float dm[2] = {0.01f, -0.08f};
    for (size_t b = 0; b < *bytes / tr->size; b++) memcpy(h + b * tr->size, dm, sizeof dm);
  } else if (tr->quantized) {
    int off = t == KERN_Q6_K ? 208 : 0;
    for (size_t b = 0; b < *bytes / tr->size; b++) {
      uint16_t d = fr_fp32_to_fp16(0.01f);
      memcpy(h + b * tr->size + off, &d, 2);
      if (t == KERN_Q4_K || t == KERN_Q5_K) memcpy(h + b * tr->size + 2, &d, 2);
    }
  }
  return h;
}

/* Batch-1 bf16 GEMV over Llama-3-8B's fused shapes (or the n_user shapes
 * given), with 1, 2 and 4 warps per row (how kcu_gemv_dense_launch picks)
 * and cuBLAS beside it. */
static void bench_gemv1(double ceil_gbs, const int64_t (*user)[2], int n_user) {
  static const int64_t l8b[][2] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}, {1024, 4096}, {128256, 4096}};
  std::vector<std::array<int64_t, 2>> shapes;
  if (n_user)
    for (int i = 0; i < n_user; i++) shapes.push_back({user[i][0], user[i][1]});
  else
    for (auto &sh : l8b) shapes.push_back({sh[0], sh[1]});
  int64_t max_cols = 0, max_rows = 0;
  for (auto &sh : shapes) max_rows = std::max(max_rows, sh[0]), max_cols = std::max(max_cols, sh[1]);
  printf("\nbf16 GEMV, n = 1: us (%%copy) by warps per row; cuBLAS\n");
  void *x, *o;
  CK(B->ops->alloc(B->ctx, (size_t)max_cols * 2, &x));
  CK(B->ops->alloc(B->ctx, (size_t)max_rows * 2, &o));
  std::vector<uint16_t> xh((size_t)max_cols);
  for (auto &v : xh) v = (uint16_t)((rnd() & 0x807f) | 0x3c00);
  CK(B->ops->upload(B->ctx, x, xh.data(), xh.size() * 2));
  uint64_t key = 50000;
  for (auto &sh : shapes) {
    size_t bytes;
    void *host = rand_weight_bytes(KERN_BF16, sh[0], sh[1], &bytes);
    int copies = (int)std::min<size_t>(std::max<size_t>(1, ((size_t)400 << 20) / bytes), 16), reps = std::max(copies, 8);
    std::vector<kern_weight_t> w(copies);
    for (auto &wi : w) {
      wi = kern_weight_t{KERN_BF16, sh[0], sh[1], kern_row_bytes(KERN_BF16, sh[1]), NULL, NULL};
      CK(B->ops->weight_load(B->ctx, &wi, host));
    }
    free(host);
    printf("%6lldx%-6lld", (long long)sh[0], (long long)sh[1]);
    C->gemv_max_n = 1;
    for (int wpr : {1, 2, 4}) {
      C->gemv_wpr = wpr;
      double ms = time_graph(key++, reps, [&] {
        for (int r = 0; r < reps; r++) CK(B->ops->matmul(B->ctx, o, &w[r % copies], NULL, x, 1));
      });
      printf("  wpr %d %7.1f (%5.1f%%)", wpr, ms * 1e3, 100.0 * bytes / (ms * 1e-3) / 1e9 / ceil_gbs);
    }
    C->gemv_wpr = 0;
    C->gemv_max_n = 0;
    double mb = time_graph(key++, reps, [&] {
      for (int r = 0; r < reps; r++) CK(B->ops->matmul(B->ctx, o, &w[r % copies], NULL, x, 1));
    });
    printf("  cuBLAS %7.1f (%5.1f%%)\n", mb * 1e3, 100.0 * bytes / (mb * 1e-3) / 1e9 / ceil_gbs);
    C->gemv_max_n = -1;
    fflush(stdout);
    for (auto &wi : w) B->ops->weight_release(B->ctx, &wi);
  }
  B->ops->free(B->ctx, x);
  B->ops->free(B->ctx, o);
}

static void bench_gemv(double ceil_gbs) {
  const int64_t shapes[][2] = {{4096, 4096}, {1024, 4096}, {14336, 4096}, {4096, 14336}, {128256, 4096}};
  const kern_type_t types[] = {KERN_BF16, KERN_Q8_0, KERN_Q4_K, KERN_I4G};
  const int ns[] = {1, 2, 4, 8, 16, 64};
  printf("\nmatmul: us with the GEMV kernel / with the cuBLAS path (quant: dequant + cuBLAS); GB/s and %%copy of\n"
         "the faster; cuBLAS alone at n=1 for bf16\n");
  printf("%-6s %-13s %3s %9s %9s %8s %7s %10s\n", "type", "rows x cols", "n", "gemv us", "blas us", "GB/s", "%copy",
         "cuBLAS n=1");
  void *x, *o;
  CK(B->ops->alloc(B->ctx, (size_t)64 * 14336 * 2, &x));
  CK(B->ops->alloc(B->ctx, (size_t)64 * 128256 * 2, &o));
  std::vector<uint16_t> xh((size_t)64 * 14336);
  for (auto &v : xh) v = (uint16_t)((rnd() & 0x807f) | 0x3c00);
  CK(B->ops->upload(B->ctx, x, xh.data(), xh.size() * 2));
  uint64_t key = 100;
  for (auto t : types) {
    for (auto &sh : shapes) {
      size_t bytes;
      void *host = rand_weight_bytes(t, sh[0], sh[1], &bytes);
      int copies = (int)std::min<size_t>(std::max<size_t>(1, ((size_t)400 << 20) / bytes), 16);
      std::vector<kern_weight_t> w(copies);
      for (auto &wi : w) {
        wi = kern_weight_t{t, sh[0], sh[1], kern_row_bytes(t, sh[1]), NULL, NULL};
        CK(B->ops->weight_load(B->ctx, &wi, host));
      }
      free(host);
      for (int n : ns) {
        int reps = std::max(copies, 8);
        auto run = [&](int max_n) {
          C->gemv_max_n = C->qgemv_max_n = max_n;
          return time_graph(key++, reps, [&] {
            for (int r = 0; r < reps; r++) CK(B->ops->matmul(B->ctx, o, &w[r % copies], NULL, x, n));
          });
        };
        double mg = n <= 8 ? run(8) : NAN, mb = run(0);
        double ms = n <= 8 ? std::min(mg, mb) : mb;
        double gbs = bytes / (ms * 1e-3) / 1e9;
        char cub[32] = "";
        if (t == KERN_BF16 && n == 1) {
          const float al = 1.f, be = 0.f;
          double cms = time_graph(key++, reps, [&] {
            for (int r = 0; r < reps; r++)
              cublasGemmEx(C->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)sh[0], 1, (int)sh[1], &al, w[r % copies].data,
                           CUDA_R_16BF, (int)sh[1], x, CUDA_R_16BF, (int)sh[1], &be, o, CUDA_R_16BF, (int)sh[0],
                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
          });
          snprintf(cub, sizeof cub, "%.1f us", cms * 1e3);
        }
        printf("%-6s %6lldx%-6lld %3d %9.1f %9.1f %8.0f %6.1f%% %10s\n", kern_type_traits(t)->name, (long long)sh[0],
               (long long)sh[1], n, mg * 1e3, mb * 1e3, gbs, 100.0 * gbs / ceil_gbs, cub);
        fflush(stdout);
      }
      for (auto &wi : w) B->ops->weight_release(B->ctx, &wi);
    }
  }
  B->ops->free(B->ctx, x);
  B->ops->free(B->ctx, o);
}

/* Decode attention over nb sequences of ctx tokens each, in a block table
 * of cap tokens a sequence (cap > ctx: the width a captured decode graph
 * pads to); prints one row. */
static void attn_case(double ceil_gbs, int n_heads, int n_kv, int nb, int ctx, int cap, uint64_t key) {
  const int hd = 128, bs = 16, mb = cap / bs;
  kern_kv_config_t cfg = {1, n_kv, hd, bs, nb * mb, C->act};
  kern_kv_pool_t pool;
  CK(B->ops->kv_pool_init(B->ctx, &pool, &cfg, NULL));
  /* random KV (only its bytes matter for time; avoid zeros) */
  {
    std::vector<uint16_t> h((size_t)1 << 24);
    for (auto &v : h) v = (uint16_t)((rnd() & 0x807f) | 0x3c00);
    for (size_t off = 0; off < 2 * pool.layer_bytes; off += h.size() * 2)
      CK(B->ops->upload(B->ctx, (char *)pool.base + off, h.data(), std::min(h.size() * 2, 2 * pool.layer_bytes - off)));
  }
  std::vector<int32_t> bt((size_t)nb * mb), pos(nb), slots(nb), qs(nb + 1), cl(nb), tok(nb, 1);
  for (size_t i = 0; i < bt.size(); i++) bt[i] = (int32_t)i;
  for (int s = 0; s < nb; s++) {
    pos[s] = ctx - 1;
    slots[s] = -1;
    qs[s] = s;
    cl[s] = ctx;
  }
  qs[nb] = nb;
  kern_step_t st = {nb, tok.data(), nb, pos.data(), slots.data(), qs.data(), cl.data(), bt.data(), mb};
  CK(B->ops->step_begin(B->ctx, &st));
  void *q, *o;
  CK(B->ops->alloc(B->ctx, (size_t)nb * n_heads * hd * 2, &q));
  CK(B->ops->alloc(B->ctx, (size_t)nb * n_heads * hd * 2, &o));
  CK(B->ops->upload(B->ctx, q, bt.data(), std::min(bt.size() * 4, (size_t)nb * n_heads * hd * 2)));
  int reps = 10;
  double ms = time_graph(key, reps, [&] {
    for (int r = 0; r < reps; r++) CK(B->ops->attention(B->ctx, o, q, n_heads * hd, &pool, 0, n_heads, hd, 0.088f, 0));
  });
  double bytes = 2.0 * nb * ctx * n_kv * hd * 2;
  double gbs = bytes / (ms * 1e-3) / 1e9;
  printf("%-6d %-6d %-7d %-7d %10.2f %10.0f %7.1f%% %6d\n", n_heads, n_kv, nb, ctx, ms * 1e3, gbs,
         100.0 * gbs / ceil_gbs, kcu__attn_max_splits(C, nb, n_kv, (long long)cap));
  fflush(stdout);
  B->ops->free(B->ctx, q);
  B->ops->free(B->ctx, o);
  B->ops->kv_pool_deinit(B->ctx, &pool);
}

static const char *attn_head = "\n%-6s %-6s %-7s %-7s %10s %10s %8s %6s\n";

/* Llama-3-8B's heads (32, 8 KV) from 1 to 64 sequences at long contexts. */
static void bench_attn(double ceil_gbs) {
  const int batches[] = {1, 8, 32, 64}, ctxs[] = {1024, 4096, 16384, 32768};
  printf(attn_head, "heads", "kv", "batch", "ctx", "us", "GB/s", "%copy", "max sp");
  uint64_t key = 10000;
  for (int nb : batches)
    for (int ctx : ctxs)
      if ((long long)nb * ctx <= 512 * 1024) attn_case(ceil_gbs, 32, 8, nb, ctx, ctx, key++);
}

/* Batch-1 decode at short contexts, in a 1024-token block table (a decode
 * graph's width): Llama-3-8B's heads, one TP=2 shard's, one TP=4 shard's
 * of Llama-3-70B. */
static void bench_attn1(double ceil_gbs) {
  const int heads[][2] = {{32, 8}, {16, 4}, {16, 2}}, ctxs[] = {64, 200, 500, 1000};
  printf(attn_head, "heads", "kv", "batch", "ctx", "us", "GB/s", "%copy", "max sp");
  uint64_t key = 11000;
  for (auto &h : heads)
    for (int ctx : ctxs) attn_case(ceil_gbs, h[0], h[1], 1, ctx, 1024, key++);
}

/* Prefill attention: n_seqs sequences of len tokens each, all new (causal). */
static void bench_prefill(void) {
  const int n_heads = 32, n_kv = 8, hd = 128, bs = 16;
  const int cases[][2] = {{1, 512}, {1, 2048}, {4, 2048}, {1, 8192}};
  printf("\nprefill attention (32 heads, 8 KV heads, head_dim 128, causal): tensor cores (WMMA) | SIMT\n"
         "%-6s %-7s %10s %10s %10s %10s\n", "seqs", "len", "wmma us", "TFLOP/s", "simt us", "TFLOP/s");
  uint64_t key = 20000;
  for (auto &cs : cases) {
    int ns = cs[0], len = cs[1], mb = len / bs, nt = ns * len;
    kern_kv_config_t cfg = {1, n_kv, hd, bs, ns * mb, C->act};
    kern_kv_pool_t pool;
    CK(B->ops->kv_pool_init(B->ctx, &pool, &cfg, NULL));
    std::vector<int32_t> bt((size_t)ns * mb), pos(nt), slots(nt, -1), qs(ns + 1), cl(ns), tok(nt, 1);
    for (size_t i = 0; i < bt.size(); i++) bt[i] = (int32_t)i;
    for (int s = 0; s <= ns; s++) qs[s] = s * len;
    for (int s = 0; s < ns; s++) cl[s] = len;
    for (int t = 0; t < nt; t++) pos[t] = t % len;
    kern_step_t st = {nt, tok.data(), ns, pos.data(), slots.data(), qs.data(), cl.data(), bt.data(), mb};
    CK(B->ops->step_begin(B->ctx, &st));
    void *q, *o;
    size_t qb = (size_t)nt * n_heads * hd * 2;
    CK(B->ops->alloc(B->ctx, qb, &q));
    CK(B->ops->alloc(B->ctx, qb, &o));
    std::vector<uint16_t> h(qb / 2);
    for (auto &v : h) v = (uint16_t)((rnd() & 0x807f) | 0x3c00);
    CK(B->ops->upload(B->ctx, q, h.data(), qb));
    CK(B->ops->upload(B->ctx, pool.base, h.data(), std::min(qb, 2 * pool.layer_bytes)));
    int reps = 3;
    double ms[2];
    for (int simt = 0; simt < 2; simt++) {
      C->simt_prefill = simt;
      ms[simt] = time_graph(key++, reps, [&] {
        for (int r = 0; r < reps; r++)
          CK(B->ops->attention(B->ctx, o, q, n_heads * hd, &pool, 0, n_heads, hd, 0.088f, 0));
      });
    }
    C->simt_prefill = 0;
    double flops = 4.0 * ns * (double)len * len / 2 * hd * n_heads; /* QK^T and PV, causal half */
    printf("%-6d %-7d %10.1f %10.1f %10.1f %10.1f\n", ns, len, ms[0] * 1e3, flops / (ms[0] * 1e-3) / 1e12,
           ms[1] * 1e3, flops / (ms[1] * 1e-3) / 1e12);
    fflush(stdout);
    B->ops->free(B->ctx, q);
    B->ops->free(B->ctx, o);
    B->ops->kv_pool_deinit(B->ctx, &pool);
  }
}

int main(int argc, char **argv) {
  const char *what = argc > 1 ? argv[1] : "all";
  int rc = kern_cuda_create(&B, 0);
  if (rc) {
    fprintf(stderr, "cuda_ops_bench: %s\n", fr_last_error());
    return 77;
  }
  C = (kcu_ctx_t *)B->ctx;
  cudaDeviceProp p;
  cudaGetDeviceProperties(&p, 0);
  double mc_gbs;
  double ceil_gbs = copy_bw(&mc_gbs);
  printf("device: %s, %d SMs, L2 %d MB; device-to-device copy %.0f GB/s (copy kernel, read + write; the ceiling), "
         "cudaMemcpyAsync %.0f GB/s\n", p.name, p.multiProcessorCount, p.l2CacheSize >> 20, ceil_gbs, mc_gbs);
  if (!strcmp(what, "all") || !strcmp(what, "gemv")) bench_gemv(ceil_gbs);
  int64_t user[32][2];
  int n_user = 0;
  for (const char *sh = argc > 2 ? argv[2] : ""; *sh && n_user < 32; n_user++) {
    long long r, c;
    int used;
    if (sscanf(sh, "%lldx%lld%n", &r, &c, &used) != 2 || r <= 0 || c <= 0 || c % 8) {
      fprintf(stderr, "cuda_ops_bench: shapes are ROWSxCOLS,... with COLS a multiple of 8\n");
      return 2;
    }
    user[n_user][0] = r, user[n_user][1] = c;
    sh += used + (sh[used] == ',');
  }
  if (!strcmp(what, "all") || !strcmp(what, "gemv1")) bench_gemv1(ceil_gbs, user, n_user);
  if (!strcmp(what, "all") || !strcmp(what, "attn")) bench_attn(ceil_gbs);
  if (!strcmp(what, "all") || !strcmp(what, "attn1")) bench_attn1(ceil_gbs);
  if (!strcmp(what, "all") || !strcmp(what, "attn")) bench_prefill();
  kern_backend_destroy(B);
  return 0;
}
