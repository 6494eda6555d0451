/* cublas_algos.cu - cuBLAS GEMM algorithms for the layer stack's shapes (not a test).
 *
 *   cublas_algos_bench [ROWSxCOLS,...] [N,...]
 *
 * For each weight shape (rows x cols, row-major, as kcu_gemm multiplies it)
 * and each activation row count n, times C(rows, n) = W @ x^T in bf16 with
 * f32 accumulation: cublasGemmEx with CUBLAS_GEMM_DEFAULT (what kcu_gemm
 * calls), then every algorithm cublasLt's heuristic offers for the same
 * operation (up to 32, 32 MiB of workspace, kcu's size). Weights rotate
 * over enough copies to keep them out of L2. Prints ms and TFLOP/s a call,
 * the median of 9 timings of 10 calls each, and the fastest candidate's
 * tile. ALGOS_ALL=1 also lists every candidate's time, marking split-K ones
 * ("sk") and those whose output differs from the default's bits ("DIFF").
 * Defaults: Llama-3-8B's qkv, o, gate/up, down and LM head; n = 256, 512,
 * 768, 1024, 2048.
 *
 *   cublas_algos_bench --fp8 [ROWSxCOLS,...] [N,...]
 *
 * The FP8 GEMM of --quantization fp8 instead (kcu_f8.cu's: E4M3 weight and
 * activations, a scale per weight row and per token, bf16 out): the
 * heuristic's first algorithm and the fastest candidate, each with
 * cuBLASLt's FP8 fast accumulation off (what the backend ran) and on, and
 * the largest difference of fast's output from the other's, relative to
 * the output's largest magnitude. */
#include <algorithm>
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "bench/bench_cuda.h"

#define CB(x)                                                                                                   \
  do {                                                                                                          \
    int s_ = (int)(x);                                                                                          \
    if (s_) {                                                                                                   \
      fprintf(stderr, "%s:%d: %s: status %d\n", __FILE__, __LINE__, #x, s_);                                    \
      exit(1);                                                                                                  \
    }                                                                                                           \
  } while (0)

enum { WS_BYTES = 32 << 20, MAX_ALGOS = 32, REPS = 10, ROUNDS = 9 };

struct shape {
  int rows, cols;
};

static cudaStream_t st;
static cudaEvent_t ev0, ev1;

/* Median ms a call of fn(i) over ROUNDS timings of REPS calls. */
template <typename F> static double time_calls(F fn) {
  for (int i = 0; i < 3; i++) fn(i);
  std::vector<float> ms;
  for (int r = 0; r < ROUNDS; r++) {
    CU(cudaEventRecord(ev0, st));
    for (int i = 0; i < REPS; i++) fn(r * REPS + i);
    CU(cudaEventRecord(ev1, st));
    CU(cudaEventSynchronize(ev1));
    float t;
    CU(cudaEventElapsedTime(&t, ev0, ev1));
    ms.push_back(t / REPS);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ROUNDS / 2];
}

static void fill(__nv_bfloat16 *p, size_t n) {
  std::vector<__nv_bfloat16> h(1 << 20);
  for (size_t i = 0; i < h.size(); i++) h[i] = __float2bfloat16((float)((i * 2654435761u) % 2001) / 1000.f - 1.f);
  for (size_t o = 0; o < n; o += h.size())
    CU(cudaMemcpy(p + o, h.data(), std::min(h.size(), n - o) * sizeof *p, cudaMemcpyHostToDevice));
}

static std::vector<int> parse_ints(const char *s) {
  std::vector<int> v;
  for (const char *p = s; *p;) {
    v.push_back(atoi(p));
    p = strchr(p, ',');
    if (!p) break;
    p++;
  }
  return v;
}

/* The algorithms cuBLASLt's heuristic offers for op (up to MAX_ALGOS, WS_BYTES of workspace) into res. */
static int candidates(cublasLtHandle_t lt, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t la,
                      cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc, cublasLtMatmulHeuristicResult_t *res) {
  cublasLtMatmulPreference_t pref;
  size_t wsb = WS_BYTES;
  int got = 0;
  CB(cublasLtMatmulPreferenceCreate(&pref));
  CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
  CB(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, MAX_ALGOS, res, &got));
  cublasLtMatmulPreferenceDestroy(pref);
  return got;
}

/* Bytes of E4M3 values in [-448, 448], none NaN (the 0x7f/0xff codes). */
static void fill_e4m3(uint8_t *p, size_t n) {
  std::vector<uint8_t> h(1 << 20);
  for (size_t i = 0; i < h.size(); i++) h[i] = (uint8_t)((i * 2654435761u >> 7) % 0x7e | (i * 40503u >> 9 & 0x80));
  for (size_t o = 0; o < n; o += h.size()) CU(cudaMemcpy(p + o, h.data(), std::min(h.size(), n - o), cudaMemcpyHostToDevice));
}

static float bf16_at(const std::vector<__nv_bfloat16> &v, size_t i) { return __bfloat162float(v[i]); }

/* One FP8 GEMM shape at n tokens: heuristic-first and fastest candidate,
 * fast accumulation off and on. */
static void fp8_shape(cublasLtHandle_t lt, void *ws, const shape &s, int n, uint8_t *W, int copies, uint8_t *X,
                      float *sw, float *sx, __nv_bfloat16 *C) {
  const size_t welems = (size_t)s.rows * s.cols;
  const float alpha = 1.f, beta = 0.f;
  const double flop = 2.0 * s.rows * s.cols * n;
  cublasLtMatrixLayout_t la, lb, lc;
  CB(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, s.cols, s.rows, s.cols));
  CB(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, s.cols, n, s.cols));
  CB(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, s.rows, n, s.rows));
  const size_t cn = (size_t)n * s.rows;
  std::vector<__nv_bfloat16> out[2] = {std::vector<__nv_bfloat16>(cn), std::vector<__nv_bfloat16>(cn)};
  printf("%6dx%-6d n=%5d", s.rows, s.cols, n);
  for (int fast = 0; fast < 2; fast++) {
    cublasLtMatmulDesc_t op;
    const cublasOperation_t tA = CUBLAS_OP_T, tB = CUBLAS_OP_N;
    const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    const int8_t fa = (int8_t)fast;
    CB(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &tA, sizeof tA));
    CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tB, sizeof tB));
    CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode));
    CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode));
    CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sw, sizeof sw));
    CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sx, sizeof sx));
    CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fa, sizeof fa));
    cublasLtMatmulHeuristicResult_t res[MAX_ALGOS];
    const int got = candidates(lt, op, la, lb, lc, res);
    double best = 1e30, first = 0;
    int best_i = -1;
    for (int a = 0; a < got; a++) {
      if (res[a].state) continue;
      double t = time_calls([&](int i) {
        CB(cublasLtMatmul(lt, op, &alpha, W + (size_t)(i % copies) * welems, la, X, lb, &beta, C, lc, C, lc,
                          &res[a].algo, ws, WS_BYTES, st));
      });
      if (a == 0) {
        first = t;
        CB(cublasLtMatmul(lt, op, &alpha, W, la, X, lb, &beta, C, lc, C, lc, &res[a].algo, ws, WS_BYTES, st));
        CU(cudaMemcpy(out[fast].data(), C, cn * sizeof *C, cudaMemcpyDeviceToHost));
      }
      if (t < best) best = t, best_i = a;
    }
    printf(" | %s lt[0] %7.4f ms %6.1f TF, best lt[%2d/%2d] %7.4f ms %6.1f TF", fast ? "fast" : "slow", first,
           flop / first / 1e9, best_i, got, best, flop / best / 1e9);
    cublasLtMatmulDescDestroy(op);
  }
  double dmax = 0, omax = 0;
  for (size_t i = 0; i < cn; i++) {
    dmax = std::max(dmax, (double)fabsf(bf16_at(out[1], i) - bf16_at(out[0], i)));
    omax = std::max(omax, (double)fabsf(bf16_at(out[0], i)));
  }
  printf(" | fast-slow %.2e of max\n", omax > 0 ? dmax / omax : 0.0);
  fflush(stdout);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
}

static void run_fp8(const std::vector<shape> &shapes, const std::vector<int> &ns, cublasLtHandle_t lt, void *ws) {
  const int nmax = *std::max_element(ns.begin(), ns.end());
  for (const shape &s : shapes) {
    const size_t welems = (size_t)s.rows * s.cols;
    const int copies = std::min<int>(8, (int)((512u << 20) / welems + 1)); /* > 512 MiB in all, past L2 */
    uint8_t *W, *X;
    float *sw, *sx;
    __nv_bfloat16 *C;
    CU(cudaMalloc(&W, welems * copies));
    CU(cudaMalloc(&X, (size_t)nmax * s.cols));
    CU(cudaMalloc(&sw, (size_t)s.rows * sizeof *sw));
    CU(cudaMalloc(&sx, (size_t)nmax * sizeof *sx));
    CU(cudaMalloc(&C, (size_t)nmax * s.rows * sizeof *C));
    fill_e4m3(W, welems * copies);
    fill_e4m3(X, (size_t)nmax * s.cols);
    std::vector<float> h((size_t)std::max(s.rows, nmax));
    for (size_t i = 0; i < h.size(); i++) h[i] = (1.f + (float)(i % 7) / 8.f) / 448.f;
    CU(cudaMemcpy(sw, h.data(), (size_t)s.rows * sizeof *sw, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(sx, h.data(), (size_t)nmax * sizeof *sx, cudaMemcpyHostToDevice));
    for (int n : ns) fp8_shape(lt, ws, s, n, W, copies, X, sw, sx, C);
    CU(cudaFree(W));
    CU(cudaFree(X));
    CU(cudaFree(sw));
    CU(cudaFree(sx));
    CU(cudaFree(C));
  }
}

int main(int argc, char **argv) {
  std::vector<shape> shapes = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}, {128256, 4096}};
  std::vector<int> ns = {256, 512, 768, 1024, 2048};
  const bool fp8 = argc > 1 && !strcmp(argv[1], "--fp8");
  if (fp8) argc--, argv++;
  if (argc > 1) {
    shapes.clear();
    for (const char *p = argv[1]; p && *p;) {
      shape s;
      if (sscanf(p, "%dx%d", &s.rows, &s.cols) != 2 || s.rows <= 0 || s.cols <= 0)
        return fprintf(stderr, "bad shape list %s (ROWSxCOLS,...)\n", argv[1]), 2;
      shapes.push_back(s);
      p = strchr(p, ',');
      if (p) p++;
    }
  }
  if (argc > 2) ns = parse_ints(argv[2]);
  if (shapes.empty() || ns.empty() || *std::min_element(ns.begin(), ns.end()) <= 0)
    return fprintf(stderr, "usage: cublas_algos_bench [--fp8] [ROWSxCOLS,...] [N,...] (positive sizes)\n"), 2;

  CU(cudaStreamCreate(&st));
  CU(cudaEventCreate(&ev0));
  CU(cudaEventCreate(&ev1));
  cublasHandle_t h;
  cublasLtHandle_t lt;
  CB(cublasCreate(&h));
  CB(cublasLtCreate(&lt));
  CB(cublasSetStream(h, st));
  void *ws;
  CU(cudaMalloc(&ws, WS_BYTES));
  CB(cublasSetWorkspace(h, ws, WS_BYTES));
  if (fp8) {
    run_fp8(shapes, ns, lt, ws);
    return 0;
  }
  int nmax = *std::max_element(ns.begin(), ns.end());

  for (const shape &s : shapes) {
    size_t welems = (size_t)s.rows * s.cols;
    int copies = (int)std::max<size_t>(1, (512u << 20) / (welems * 2) + 1); /* > 512 MiB in all, past L2 */
    copies = std::min(copies, 8);
    __nv_bfloat16 *W, *X, *C;
    CU(cudaMalloc(&W, welems * copies * 2));
    CU(cudaMalloc(&X, (size_t)nmax * s.cols * 2));
    CU(cudaMalloc(&C, (size_t)nmax * s.rows * 2));
    fill(W, welems * copies);
    fill(X, (size_t)nmax * s.cols);
    for (int n : ns) {
      const float alpha = 1.f, beta = 0.f;
      double flop = 2.0 * s.rows * s.cols * n;
      double t_def = time_calls([&](int i) {
        CB(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, s.rows, n, s.cols, &alpha, W + (size_t)(i % copies) * welems,
                        CUDA_R_16BF, s.cols, X, CUDA_R_16BF, s.cols, &beta, C, CUDA_R_16BF, s.rows, CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT));
      });

      cublasLtMatmulDesc_t op;
      cublasLtMatrixLayout_t la, lb, lc;
      cublasOperation_t tA = CUBLAS_OP_T, tB = CUBLAS_OP_N;
      CB(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &tA, sizeof tA));
      CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tB, sizeof tB));
      CB(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, s.cols, s.rows, s.cols));
      CB(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, s.cols, n, s.cols));
      CB(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, s.rows, n, s.rows));
      cublasLtMatmulHeuristicResult_t res[MAX_ALGOS];
      const int got = candidates(lt, op, la, lb, lc, res);
      double best = 1e30, first = 0;
      int best_i = -1;
      size_t cb = (size_t)n * s.rows * 2;
      std::vector<char> ref(cb), out(cb);
      CB(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, s.rows, n, s.cols, &alpha, W, CUDA_R_16BF, s.cols, X, CUDA_R_16BF,
                      s.cols, &beta, C, CUDA_R_16BF, s.rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      CU(cudaMemcpy(ref.data(), C, cb, cudaMemcpyDeviceToHost));
      char line[2048] = "";
      int len = 0;
      for (int a = 0; a < got; a++) {
        if (res[a].state) continue;
        double t = time_calls([&](int i) {
          CB(cublasLtMatmul(lt, op, &alpha, W + (size_t)(i % copies) * welems, la, X, lb, &beta, C, lc, C, lc,
                            &res[a].algo, ws, WS_BYTES, st));
        });
        CB(cublasLtMatmul(lt, op, &alpha, W, la, X, lb, &beta, C, lc, C, lc, &res[a].algo, ws, WS_BYTES, st));
        CU(cudaMemcpy(out.data(), C, cb, cudaMemcpyDeviceToHost));
        int sk = -1;
        cublasLtMatmulAlgoConfigGetAttribute(&res[a].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &sk, sizeof sk, NULL);
        if (len < (int)sizeof line - 64)
          len += snprintf(line + len, sizeof line - len, " [%d %.4f%s%s]", a, t, sk > 1 ? " sk" : "",
                          memcmp(out.data(), ref.data(), cb) ? " DIFF" : "");
        if (a == 0) first = t;
        if (t < best) best = t, best_i = a;
      }
      if (getenv("ALGOS_ALL")) printf("   all:%s\n", line);
      int tile = -1, stages = -1, splitk = -1, swz = -1, red = -1;
      if (best_i >= 0) {
        const cublasLtMatmulAlgo_t *al = &res[best_i].algo;
        cublasLtMatmulAlgoConfigGetAttribute(al, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, NULL);
        cublasLtMatmulAlgoConfigGetAttribute(al, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, NULL);
        cublasLtMatmulAlgoConfigGetAttribute(al, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, NULL);
        cublasLtMatmulAlgoConfigGetAttribute(al, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swz, sizeof swz, NULL);
        cublasLtMatmulAlgoConfigGetAttribute(al, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, sizeof red, NULL);
      }
      printf("%6dx%-6d n=%5d  default %8.4f ms %6.1f TF | lt[0] %8.4f ms %6.1f TF | best lt[%2d/%2d] %8.4f ms "
             "%6.1f TF (%.3fx; tile %d stages %d splitk %d swizzle %d red %d)\n",
             s.rows, s.cols, n, t_def, flop / t_def / 1e9, first, flop / first / 1e9, best_i, got, best,
             flop / best / 1e9, t_def / best, tile, stages, splitk, swz, red);
      fflush(stdout);
      cublasLtMatrixLayoutDestroy(la);
      cublasLtMatrixLayoutDestroy(lb);
      cublasLtMatrixLayoutDestroy(lc);
      cublasLtMatmulDescDestroy(op);
    }
    CU(cudaFree(W));
    CU(cudaFree(X));
    CU(cudaFree(C));
  }
  return 0;
}
