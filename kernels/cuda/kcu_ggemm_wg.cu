/* kcu_ggemm_wg.cu - the grouped GEMM's large tiles (KCU_GG_ROWS_LARGE rows)
 * over dense weights by wgmma, built for sm_90a only (kernels/cuda.cmake);
 * kcu_ggemm.cu sends them here on a compute capability 9.0 device.
 *
 * A CTA is one warpgroup and one tile: 64 A rows (gathered as kcu_ggemm.cu
 * gathers them) times BN weight rows (gated: 64 of the gate and 64 of the
 * up matrix; else 128). The stages are kcu_ggemm.cuh's cp.async tiles, whose
 * XOR swizzle of 16-byte chunks over 128-byte rows is wgmma's 128-byte
 * swizzle, so both operands are read from shared memory by descriptors,
 * K-major. Each thread's copies are fenced to the async proxy before the
 * barrier that opens a stage; a stage's wgmmas finish before the barrier
 * after which its bytes are loaded again.
 *
 * Against kcu_ggemm.cu's mma.sync tiles (64 x 64, 4 warps of 32 x 32) on an
 * H200, Qwen3-30B-A3B shapes (docs/bench/gpu.md, session 45): a 2048-token
 * prefill's gate/up GEMM 384 -> 321 us, down 229 -> 176 us (ncu); the
 * prefill 50.1 -> 44.7 ms. The down GEMM is then at 90% of the L2's
 * throughput.
 *
 * Threads: the backend's stream. */
#include "kernels/cuda/kcu_ggemm.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "kcu_ggemm_wg.cu is built for sm_90a"
#endif

/* A shared-memory matrix descriptor: K-major rows of 128 bytes in the
 * 128-byte swizzle, 8-row atoms 1024 bytes apart (the tile 1024-aligned;
 * a k16 step within it adds 32 bytes to the start). */
__device__ __forceinline__ uint64_t kcu_wg_desc(uint32_t addr) {
  return (uint64_t)((addr & 0x3ffffu) >> 4) | (uint64_t)1 << 16 | (uint64_t)(1024 >> 4) << 32 | (uint64_t)1 << 62;
}

/* d (64 x N of f32, this thread's N / 2) += A (64 x 16) B (N x 16)^T; acc 0
 * starts the sums instead. */
template <typename T, int N> __device__ __forceinline__ void kcu_wg_mma(float *d, uint64_t da, uint64_t db, int acc);
/* The asm of one wgmma of N columns (R = N / 2 accumulators a thread, at
 * operands 0..R-1; the descriptors R and R + 1, acc R + 2) on PT inputs. */
#define KCU_WG_D32(o) \
  "+f"(d[o + 0]), "+f"(d[o + 1]), "+f"(d[o + 2]), "+f"(d[o + 3]), "+f"(d[o + 4]), "+f"(d[o + 5]), \
      "+f"(d[o + 6]), "+f"(d[o + 7]), "+f"(d[o + 8]), "+f"(d[o + 9]), "+f"(d[o + 10]), "+f"(d[o + 11]), \
      "+f"(d[o + 12]), "+f"(d[o + 13]), "+f"(d[o + 14]), "+f"(d[o + 15]), "+f"(d[o + 16]), "+f"(d[o + 17]), \
      "+f"(d[o + 18]), "+f"(d[o + 19]), "+f"(d[o + 20]), "+f"(d[o + 21]), "+f"(d[o + 22]), "+f"(d[o + 23]), \
      "+f"(d[o + 24]), "+f"(d[o + 25]), "+f"(d[o + 26]), "+f"(d[o + 27]), "+f"(d[o + 28]), "+f"(d[o + 29]), \
      "+f"(d[o + 30]), "+f"(d[o + 31])
#define KCU_WG_ASM(N, PT, REGS, DA, DB, ACC, ...)                                                                   \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #ACC ", 0;\n"                                                \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PT "." PT " " REGS ", %" #DA ", %" #DB            \
               ", p, 1, 1, 0, 0;\n}\n"                                                                             \
               : __VA_ARGS__                                                                                      \
               : "l"(da), "l"(db), "r"(acc))
#define KCU_WG_REGS32 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define KCU_WG_REGS64 KCU_WG_REGS32 ", " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define KCU_WG_MMA64(PT) KCU_WG_ASM(64, PT, "{" KCU_WG_REGS32 "}", 32, 33, 34, KCU_WG_D32(0))
#define KCU_WG_MMA128(PT) KCU_WG_ASM(128, PT, "{" KCU_WG_REGS64 "}", 64, 65, 66, KCU_WG_D32(0), KCU_WG_D32(32))
template <> __device__ __forceinline__ void kcu_wg_mma<__nv_bfloat16, 64>(float *d, uint64_t da, uint64_t db, int acc) {
  KCU_WG_MMA64("bf16");
}
template <> __device__ __forceinline__ void kcu_wg_mma<__half, 64>(float *d, uint64_t da, uint64_t db, int acc) {
  KCU_WG_MMA64("f16");
}
template <> __device__ __forceinline__ void kcu_wg_mma<__nv_bfloat16, 128>(float *d, uint64_t da, uint64_t db, int acc) {
  KCU_WG_MMA128("bf16");
}
template <> __device__ __forceinline__ void kcu_wg_mma<__half, 128>(float *d, uint64_t da, uint64_t db, int acc) {
  KCU_WG_MMA128("f16");
}

__device__ __forceinline__ void kcu_wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void kcu_wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void kcu_wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
/* Keeps the compiler from reading an accumulator before the wait. */
template <int R> __device__ __forceinline__ void kcu_wg_hold(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; i++) asm volatile("" : "+f"(d[i])::"memory");
}

/* A tile: BM rows, NB B tiles of BN weight rows, S stages of A and the B
 * tiles (24 KB each, 3 CTAs a SM; 4 stages at 2 CTAs a SM ran a
 * Qwen3-30B-A3B prefill 8% slower: docs/bench/gpu.md, session 45); the
 * shared memory has 1 KB more for the alignment. */
template <int MODE> struct kcu_ggw_cfg {
  enum { NB = MODE == KCU_GG_GATED ? 2 : 1, BN = MODE == KCU_GG_GATED ? 64 : 128, BM = KCU_GG_ROWS_LARGE, S = 3 };
  enum { A = BM * KCU_GG_BK * 2, B = BN * KCU_GG_BK * 2, STAGE = A + NB * B };
  static constexpr size_t SMEM = (size_t)S * STAGE + 1024;
};

template <typename T, int MODE>
__global__ void __launch_bounds__(KCU_GG_NT)
    kcu_ggw_k(void *out, const T *a, const int32_t *sorted, int gather_k, const int32_t *tile_w,
              const int32_t *n_tiles, const __grid_constant__ kcu_gg_ptrs_t w0, const __grid_constant__ kcu_gg_ptrs_t w1,
              size_t row_bytes, int N, int K) {
  typedef kcu_ggw_cfg<MODE> C;
  constexpr int NB = C::NB, BN = C::BN, BM = C::BM, S = C::S;
  extern __shared__ uint8_t kcu_ggw_sh[];
  __shared__ int32_t rows[BM];
  kcu_pdl_enter();
  const int tile = blockIdx.x;
  if (tile >= *n_tiles) return;
  const int e = tile_w[tile], m0 = tile * BM, n0 = blockIdx.y * BN;
  const int warp = threadIdx.x / KCU_WARP, lane = threadIdx.x % KCU_WARP;
  int a_src[kcu_gg_ld<BM>::J];
  kcu_gg_tile_rows<BM>(rows, a_src, sorted, m0, gather_k);
  const uint8_t *wb[2] = {w0.p[e], NB == 2 ? w1.p[e] : w0.p[e]};
  const uint32_t base = ((uint32_t)__cvta_generic_to_shared(kcu_ggw_sh) + 1023u) & ~1023u;
  const int nk = (K + KCU_GG_BK - 1) / KCU_GG_BK;
  auto load = [&](int kt) {
    const uint32_t st = base + (kt % S) * C::STAGE;
    kcu_gg_load_a<T, BM>(st, a, a_src, K, kt * KCU_GG_BK);
#pragma unroll
    for (int b = 0; b < NB; b++)
      kcu_gg_load_b_dense<T, BN>(st + C::A + b * C::B, wb[b], row_bytes, N, K, n0, kt * KCU_GG_BK);
  };
  float acc[NB][BN / 2];
#pragma unroll
  for (int s = 0; s < S - 1; s++) {
    if (s < nk) load(s);
    kcu_cp_commit();
  }
  for (int kt = 0; kt < nk; kt++) {
    kcu_cp_wait<S - 2>();
    kcu_fence_proxy_async(); /* this thread's copies of stage kt, to the wgmmas */
    __syncthreads();         /* stage kt is in; stage kt - 1's wgmmas are done (each warp waited) */
    if (kt + S - 1 < nk) load(kt + S - 1);
    kcu_cp_commit();
    const uint32_t st = base + (kt % S) * C::STAGE;
    kcu_wg_fence();
#pragma unroll
    for (int kk = 0; kk < KCU_GG_BK / 16; kk++) {
      const uint64_t da = kcu_wg_desc(st + kk * 32);
#pragma unroll
      for (int b = 0; b < NB; b++) kcu_wg_mma<T, BN>(acc[b], da, kcu_wg_desc(st + C::A + b * C::B + kk * 32), kt | kk);
    }
    kcu_wg_commit();
    kcu_wg_wait0();
#pragma unroll
    for (int b = 0; b < NB; b++) kcu_wg_hold(acc[b]);
  }
  /* warp w holds rows 16 w + g and + 8; element 4 i + 2 h + j: row + 8 h, column 8 i + 2 q + j */
  const int g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int r = warp * 16 + g + 8 * h;
    if (rows[r] < 0) continue;
    const size_t orow = (size_t)(m0 + r) * N;
#pragma unroll
    for (int i = 0; i < BN / 8; i++) {
      const int n = n0 + 8 * i + 2 * q;
      if (n >= N) continue;
      const int j = 4 * i + 2 * h;
      kcu_gg_store2<T, MODE>(out, orow + n, acc[0][j], acc[0][j + 1], acc[NB - 1][j], acc[NB - 1][j + 1]);
    }
  }
}

template <typename T, int MODE>
static int kcu_ggw_launch(kcu_ctx_t *c, void *out, const void *a, const kcu_gg_rows_t *r, const kcu_gg_ptrs_t *w0,
                          const kcu_gg_ptrs_t *w1, size_t row_bytes, int N, int K) {
  KCU_LAUNCH(c, kcu_ggw_k<T, MODE>, dim3(r->tiles, kcu_div_up(N, kcu_ggw_cfg<MODE>::BN)), KCU_GG_NT,
             kcu_ggw_cfg<MODE>::SMEM, out, (const T *)a, r->sorted, r->gather_k, r->tile_w, r->n_tiles, *w0, *w1,
             row_bytes, N, K);
  return 0;
}

int kcu__gg_wg(kcu_ctx_t *c, int mode, void *out, const void *a, const kcu_gg_rows_t *r, const kcu_gg_ptrs_t *w0,
               const kcu_gg_ptrs_t *w1, size_t row_bytes, int N, int K) {
  int rc = 0;
  KCU_ACT_DISPATCH(c, rc = mode == KCU_GG_GATED
                               ? kcu_ggw_launch<T, KCU_GG_GATED>(c, out, a, r, w0, w1, row_bytes, N, K)
                               : kcu_ggw_launch<T, KCU_GG_F32>(c, out, a, r, w0, w0, row_bytes, N, K));
  return rc;
}

template <typename T, int MODE> static int kcu_ggw_attr(void) {
  KCU_CHECK(cudaFuncSetAttribute(kcu_ggw_k<T, MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)kcu_ggw_cfg<MODE>::SMEM));
  return 0;
}

int kcu__gg_wg_init(kcu_ctx_t *c) {
  int rc = 0;
  KCU_ACT_DISPATCH(c, {
    rc = kcu_ggw_attr<T, KCU_GG_GATED>();
    if (!rc) rc = kcu_ggw_attr<T, KCU_GG_F32>();
  });
  return rc;
}
