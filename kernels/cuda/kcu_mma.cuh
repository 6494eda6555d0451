/* kcu_mma.cuh - the tensor-core building blocks the CUDA kernels share
 * (sm_80+ PTX, run on sm_90): cp.async 16-byte copies into shared memory,
 * ldmatrix fragment loads, the m16n8k16 MMA with f32 accumulators, and
 * packing two floats into one register of the activation type; mbarriers
 * and the tensor-memory accelerator's bulk copies (sm_90). Used by the
 * attention kernels (kcu_attn.cu) and the grouped expert GEMM (kcu_moe.cu). */
#pragma once

#include "kernels/cuda/kcu.cuh"

/* A 16-byte global -> shared copy; !valid writes 16 zero bytes instead (src
 * must still be a valid address). */
__device__ __forceinline__ void kcu_cp_async16(uint32_t dst, const void *src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void kcu_cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void kcu_cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void kcu_ldsm4(uint32_t *r, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void kcu_ldsm4_t(uint32_t *r, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/* The tensor-memory accelerator (sm_90): an mbarrier that counts the bytes
 * of the bulk tensor copies issued against it, and those copies, each a box
 * of a tensor map (cuTensorMapEncodeTiled) into shared memory. */
__device__ __forceinline__ void kcu_mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
/* Makes initialized mbarriers visible to the async proxy; a barrier after it
 * makes them visible to the CTA. */
__device__ __forceinline__ void kcu_mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
/* One arrival that also expects `bytes` more bytes of copies this phase. */
__device__ __forceinline__ void kcu_mbar_expect(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
/* Waits until the phase of parity `parity` has completed. */
__device__ __forceinline__ void kcu_mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
/* Orders this thread's generic-proxy shared-memory accesses before later
 * async-proxy ones (a bulk copy into the same bytes). */
__device__ __forceinline__ void kcu_fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
/* The box at coordinates (c0..c3) of the 4-d tensor map at tm (a kernel
 * parameter's address) into shared memory at dst, counted on bar. */
__device__ __forceinline__ void kcu_tma_load4(uint32_t dst, const void *tm, uint32_t bar, int c0, int c1, int c2,
                                              int c3) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, "
               "%6}], [%2];\n" ::"r"(dst),
               "l"(tm), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}

/* `bytes` (a multiple of 16) from global memory at src (16-byte aligned)
 * into shared memory at dst, counted on bar. */
__device__ __forceinline__ void kcu_bulk_load(uint32_t dst, const void *src, int bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

/* d += a (16x16, row) * b (16x8, col); f32 accumulators. */
template <typename T> __device__ __forceinline__ void kcu_mma16816(float *d, const uint32_t *a, const uint32_t *b);
template <> __device__ __forceinline__ void kcu_mma16816<__nv_bfloat16>(float *d, const uint32_t *a, const uint32_t *b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <> __device__ __forceinline__ void kcu_mma16816<__half>(float *d, const uint32_t *a, const uint32_t *b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* Two floats as a pair of T in one register (the lower one first). */
template <typename T> __device__ __forceinline__ uint32_t kcu_pack2(float x, float y);
template <> __device__ __forceinline__ uint32_t kcu_pack2<__nv_bfloat16>(float x, float y) {
  __nv_bfloat162 v = __floats2bfloat162_rn(x, y);
  return *reinterpret_cast<uint32_t *>(&v);
}
template <> __device__ __forceinline__ uint32_t kcu_pack2<__half>(float x, float y) {
  __half2 v = __floats2half2_rn(x, y);
  return *reinterpret_cast<uint32_t *>(&v);
}

/* 8 bytes of shared memory at addr (8-byte aligned). */
__device__ __forceinline__ uint2 kcu_ld_shared8(uint32_t addr) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(addr));
  return v;
}
__device__ __forceinline__ void kcu_st_shared16(uint32_t addr, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}
