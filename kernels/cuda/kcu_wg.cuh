/* kcu_wg.cuh - wgmma (sm_90a) building blocks of the kernels built for
 * sm_90a (kcu_ggemm_wg.cu, kcu_q4f_wg.cu): shared-memory descriptors of
 * K-major tiles in the 128-byte swizzle (kcu_ggemm.cuh's kcu_gg_off), the
 * m64nNk16 MMA with f32 accumulators, and its fence, commit and wait. */
#pragma once

#include <type_traits>

#include "kernels/cuda/kcu_mma.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "kcu_wg.cuh is for files built for sm_90a"
#endif

/* A shared-memory matrix descriptor: K-major rows of 128 bytes in the
 * 128-byte swizzle, 8-row atoms 1024 bytes apart (the tile 1024-aligned;
 * a k16 step within it adds 32 bytes to the start). */
__device__ __forceinline__ uint64_t kcu_wg_desc(uint32_t addr) {
  return (uint64_t)((addr & 0x3ffffu) >> 4) | (uint64_t)1 << 16 | (uint64_t)(1024 >> 4) << 32 | (uint64_t)1 << 62;
}

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
/* d (64 x N of f32, this thread's N / 2) += A (64 x 16) B (N x 16)^T; acc 0
 * starts the sums instead. */
template <typename T, int N> __device__ __forceinline__ void kcu_wg_mma(float *d, uint64_t da, uint64_t db, int acc) {
  static_assert(N == 64 || N == 128, "wgmma of 64 or 128 columns");
  constexpr bool bf = std::is_same<T, __nv_bfloat16>::value;
  if constexpr (N == 64 && bf) KCU_WG_MMA64("bf16");
  else if constexpr (N == 64) KCU_WG_MMA64("f16");
  else if constexpr (bf) KCU_WG_MMA128("bf16");
  else KCU_WG_MMA128("f16");
}

#define KCU_WG_ASM_RS(N, PT, REGS, AREGS, DB, ACC, ...)                                                           \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #ACC ", 0;\n"                                                \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PT "." PT " " REGS ", " AREGS ", %" #DB           \
               ", p, 1, 1, 0;\n}\n"                                                                              \
               : __VA_ARGS__                                                                                      \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc))
#define KCU_WG_MMA64_RS(PT) KCU_WG_ASM_RS(64, PT, "{" KCU_WG_REGS32 "}", "{%32, %33, %34, %35}", 36, 37, KCU_WG_D32(0))
#define KCU_WG_MMA128_RS(PT) \
  KCU_WG_ASM_RS(128, PT, "{" KCU_WG_REGS64 "}", "{%64, %65, %66, %67}", 68, 69, KCU_WG_D32(0), KCU_WG_D32(32))
/* The same with A from registers (a: this thread's four registers of A's
 * 64 x 16, in mma.sync's m16n8k16 A fragment order, warp w rows 16 w ..
 * 16 w + 15); B K-major from shared memory. */
template <typename T, int N>
__device__ __forceinline__ void kcu_wg_mma_rs(float *d, const uint32_t (&a)[4], uint64_t db, int acc) {
  static_assert(N == 64 || N == 128, "wgmma of 64 or 128 columns");
  constexpr bool bf = std::is_same<T, __nv_bfloat16>::value;
  if constexpr (N == 64 && bf) KCU_WG_MMA64_RS("bf16");
  else if constexpr (N == 64) KCU_WG_MMA64_RS("f16");
  else if constexpr (bf) KCU_WG_MMA128_RS("bf16");
  else KCU_WG_MMA128_RS("f16");
}

__device__ __forceinline__ void kcu_wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void kcu_wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void kcu_wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
/* Keeps the compiler from reading an accumulator before the wait. */
template <int R> __device__ __forceinline__ void kcu_wg_hold(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; i++) asm volatile("" : "+f"(d[i])::"memory");
}

/* A cp.async pipeline of S stages feeding wgmmas, one commit group a
 * stage (load(k) issues stage k's copies): the first S - 1 stages; then,
 * before stage k's wgmmas, its copies waited for and fenced to the async
 * proxy, the barrier after which every warp's wgmmas of stage k - 1 are
 * done (each waited), and stage k + S - 1 loaded into their slot. */
template <int S, typename Load> __device__ __forceinline__ void kcu_wg_pipe_start(int nk, Load &load) {
#pragma unroll
  for (int s = 0; s < S - 1; s++) {
    if (s < nk) load(s);
    kcu_cp_commit();
  }
}
template <int S, typename Load> __device__ __forceinline__ void kcu_wg_pipe_next(int k, int nk, Load &load) {
  kcu_cp_wait<S - 2>();
  kcu_fence_proxy_async();
  __syncthreads();
  if (k + S - 1 < nk) load(k + S - 1);
  kcu_cp_commit();
}
