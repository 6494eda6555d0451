/* kv_read_bw.cu - how fast plain loads read a decode step's K/V (not a test).
 *
 *   kv_read_bw_bench [CONTEXT] [SEQUENCES]
 *
 * The ceiling for decode attention's loads: one CTA of 128 threads per
 * (sequence, KV head), Llama-3-8B's 8 KV heads of 128 dimensions in bf16,
 * blocks of 16 tokens taken from a shuffled block table, each CTA reading
 * its head's K and V rows for CONTEXT tokens (default 640) of SEQUENCES
 * sequences (default 256) with 16-byte loads, UNROLL blocks in flight a
 * thread, and nothing else. Two layouts of a block: the pool's (NHD: a
 * slot's heads side by side, so one head's 16 rows are 256 bytes each at
 * 2 KiB strides) and head-major (HND: one head's 16 rows are 4 KiB in a
 * row). Prints us and TB/s a call, the mean of 20 calls after 3.
 * docs/bench/gpu.md, session 49, has the H200's numbers. */
#include <algorithm>
#include <cuda_runtime.h>
#include <random>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

#include "bench/bench_cuda.h"

enum { BS = 16, NKV = 8, HD = 128, ROW16 = HD * 2 / 16 /* uint4 a row */, NT = 128 };

/* The uint4 index of chunk ch of row i (of BS) of KV head h in block blk. */
template <bool HND> __device__ __forceinline__ size_t kv_off(size_t blk, int h, int i, int ch) {
  return HND ? ((blk * NKV + h) * BS + i) * ROW16 + ch : ((blk * BS + i) * NKV + h) * ROW16 + ch;
}

/* CTA (h, s): K and V of head h for sequence s's nb blocks; thread t takes
 * chunk t % 16 of rows t / 16 and t / 16 + 8 of each block. */
template <bool HND, int UNROLL>
__global__ void __launch_bounds__(NT) kv_read_k(const uint4 *k, const uint4 *v, const int *bt, int nb, uint32_t *sink) {
  const int h = blockIdx.x, s = blockIdx.y, row = threadIdx.x / ROW16, ch = threadIdx.x % ROW16;
  uint32_t acc = 0;
  for (int b0 = 0; b0 < nb; b0 += UNROLL) {
    uint4 r[UNROLL][4];
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
      const size_t blk = (size_t)bt[(size_t)s * nb + min(b0 + u, nb - 1)];
#pragma unroll
      for (int half = 0; half < 2; half++) {
        const size_t off = kv_off<HND>(blk, h, row + 8 * half, ch);
        r[u][2 * half] = __ldg(k + off);
        r[u][2 * half + 1] = __ldg(v + off);
      }
    }
#pragma unroll
    for (int u = 0; u < UNROLL; u++)
#pragma unroll
      for (int i = 0; i < 4; i++) acc ^= r[u][i].x ^ r[u][i].y ^ r[u][i].z ^ r[u][i].w;
  }
  if (acc == 0x9e3779b9u) *sink = acc; /* keeps the loads */
}

template <bool HND, int UNROLL>
static void run(const char *name, const uint4 *k, const uint4 *v, const int *bt, int nb, int seqs, uint32_t *sink,
                double bytes) {
  const dim3 grid(NKV, seqs);
  cudaEvent_t a, b;
  CU(cudaEventCreate(&a));
  CU(cudaEventCreate(&b));
  for (int i = 0; i < 3; i++) kv_read_k<HND, UNROLL><<<grid, NT>>>(k, v, bt, nb, sink);
  CU(cudaEventRecord(a));
  for (int i = 0; i < 20; i++) kv_read_k<HND, UNROLL><<<grid, NT>>>(k, v, bt, nb, sink);
  CU(cudaEventRecord(b));
  CU(cudaEventSynchronize(b));
  CU(cudaGetLastError());
  float ms = 0.f;
  CU(cudaEventElapsedTime(&ms, a, b));
  ms /= 20;
  printf("%s, blocks in flight a thread %d: %8.1f us  %.2f TB/s\n", name, UNROLL, ms * 1e3, bytes / ms / 1e9);
  CU(cudaEventDestroy(a));
  CU(cudaEventDestroy(b));
}

/* Both layouts at UNROLL blocks in flight. */
template <int UNROLL>
static void run_layouts(const uint4 *k, const uint4 *v, const int *bt, int nb, int seqs, uint32_t *sink,
                        double bytes) {
  run<false, UNROLL>("NHD", k, v, bt, nb, seqs, sink, bytes);
  run<true, UNROLL>("HND", k, v, bt, nb, seqs, sink, bytes);
}

int main(int argc, char **argv) {
  const int ctx = argc > 1 ? atoi(argv[1]) : 640, seqs = argc > 2 ? atoi(argv[2]) : 256;
  const int nb = ctx / BS, pool_blocks = std::max(60000, seqs * nb);
  if (nb < 1 || ctx > 131072 || seqs < 1 || seqs > 65535) { /* seqs x nb fits an int */
    fprintf(stderr, "usage: kv_read_bw_bench [CONTEXT %d..131072] [SEQUENCES 1..65535]\n", BS);
    return 2;
  }
  const size_t plane = (size_t)pool_blocks * BS * NKV * HD * 2;
  uint4 *k, *v;
  int *bt;
  uint32_t *sink;
  CU(cudaMalloc(&k, plane));
  CU(cudaMalloc(&v, plane));
  CU(cudaMalloc(&bt, (size_t)seqs * nb * sizeof(int)));
  CU(cudaMalloc(&sink, sizeof *sink));
  CU(cudaMemset(k, 1, plane));
  CU(cudaMemset(v, 2, plane));
  std::vector<int> ids(pool_blocks);
  for (int i = 0; i < pool_blocks; i++) ids[i] = i;
  std::mt19937 rng(1);
  std::shuffle(ids.begin(), ids.end(), rng);
  CU(cudaMemcpy(bt, ids.data(), (size_t)seqs * nb * sizeof(int), cudaMemcpyHostToDevice));
  const double bytes = 2.0 * seqs * nb * BS * NKV * HD * 2;
  printf("%d sequences x %d tokens x %d KV heads: %.0f MB of K and V a call\n", seqs, nb * BS, NKV, bytes / 1e6);
  run_layouts<1>(k, v, bt, nb, seqs, sink, bytes);
  run_layouts<2>(k, v, bt, nb, seqs, sink, bytes);
  run_layouts<4>(k, v, bt, nb, seqs, sink, bytes);
  run_layouts<8>(k, v, bt, nb, seqs, sink, bytes);
  CU(cudaFree(k));
  CU(cudaFree(v));
  CU(cudaFree(bt));
  CU(cudaFree(sink));
  return 0;
}
