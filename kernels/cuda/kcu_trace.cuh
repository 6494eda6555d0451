/* kcu_trace.cuh - when the traced kernels of a step run (a build option).
 *
 * nsys makes no reports on the machines we measure on, and ncu runs one
 * kernel at a time, without the overlap that programmatic dependent launch
 * gives inside a graph. Built with FERRUM_CUDA_TRACE (KCU_TRACE), CTA 0 of
 * each traced kernel records the global timer at its entry, after its PDL
 * wait (kcu_pdl_wait) and at its exit; the backend's destroy prints the
 * records to stderr as "TR name entry wait exit ctas" (ns), and
 * bench/cuda_trace.py turns them into each kernel's cost on a decode
 * step's critical path (from its wait to its successor's). A kernel may
 * also mark points of its body (KCU_TRACE_MARK(i), i < KCU_TR_MARKS): CTA
 * 0's time there, printed as "TRM name entry m0 m1 ..." (0: not reached).
 * What the trace adds to a kernel is an atomic at entry, before the wait,
 * and a few stores at exit: batch-1 decode 7% slower (docs/bench/gpu.md,
 * session 37). Without KCU_TRACE, KCU_TRACE_SCOPE and KCU_TRACE_MARK are
 * nothing. */
#ifndef KCU_TRACE_CUH
#define KCU_TRACE_CUH

/* The traced kernels, named in kcu_tr_dump. */
enum kcu_trace_kernel {
  KCU_TR_Q4G_ROW,
  KCU_TR_Q4F_ROW,
  KCU_TR_ROPE,
  KCU_TR_NORM,
  KCU_TR_SILU,
  KCU_TR_EMBED,
  KCU_TR_ATTN,
  KCU_TR_GEMV,
  KCU_TR_GEMV_PAIR,
  KCU_TR_SAMPLE,
};

#ifdef KCU_TRACE
#include <cstdio>

#define KCU_TR_CAP 65536 /* records a translation unit keeps; later ones are dropped */

#define KCU_TR_MARKS 8 /* points a kernel may mark in its body */

struct kcu_tr_rec {
  unsigned long long entry, wait, exit;
  unsigned kernel, ctas;
  unsigned long long mark[KCU_TR_MARKS];
};

/* Each translation unit has its own records, registered at start-up with
 * kcu_backend.cu, which prints them all at destroy. */
static __device__ kcu_tr_rec kcu_tr_recs[KCU_TR_CAP];
static __device__ unsigned kcu_tr_count;
static __device__ unsigned long long kcu_tr_wait; /* CTA 0's last PDL wait: one kernel at a time is past it */

void kcu_tr_register(void (*dump)(void));

static void kcu_tr_dump(void) {
  static const char *const names[] = {"q4g_row", "q4f_row", "rope", "norm",     "silu",
                                      "embed",   "attn",    "gemv", "gemv_pair", "sample"};
  static kcu_tr_rec h[KCU_TR_CAP];
  unsigned n = 0;
  if (cudaMemcpyFromSymbol(&n, kcu_tr_count, sizeof n) != cudaSuccess ||
      cudaMemcpyFromSymbol(h, kcu_tr_recs, sizeof h) != cudaSuccess)
    return;
  for (unsigned i = 0; i < n && i < KCU_TR_CAP; i++) {
    fprintf(stderr, "TR %s %llu %llu %llu %u\n", names[h[i].kernel], h[i].entry, h[i].wait, h[i].exit, h[i].ctas);
    bool any = false;
    for (int k = 0; k < KCU_TR_MARKS; k++) any |= h[i].mark[k] != 0;
    if (!any) continue;
    fprintf(stderr, "TRM %s %llu", names[h[i].kernel], h[i].entry);
    for (int k = 0; k < KCU_TR_MARKS; k++) fprintf(stderr, " %llu", h[i].mark[k]);
    fprintf(stderr, "\n");
  }
}

static struct kcu_tr_registrar {
  kcu_tr_registrar() { kcu_tr_register(kcu_tr_dump); }
} kcu_tr_registrar_here;

__device__ __forceinline__ unsigned long long kcu_tr_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ bool kcu_tr_cta0() {
  return threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0;
}

/* Lives for the kernel's body: entry at construction, exit at destruction
 * (thread 0 of CTA 0 stays to the end of every traced kernel). */
struct kcu_trace_scope {
  unsigned kernel, slot;
  unsigned long long entry, mark[KCU_TR_MARKS];
  __device__ explicit kcu_trace_scope(unsigned k) : kernel(k), slot(KCU_TR_CAP), entry(kcu_tr_now()), mark{} {
    if (kcu_tr_cta0()) slot = atomicAdd(&kcu_tr_count, 1u);
  }
  __device__ ~kcu_trace_scope() {
    if (kcu_tr_cta0() && slot < KCU_TR_CAP) {
      const unsigned long long t_exit = kcu_tr_now(); /* first: nothing waits on a load before it */
      kcu_tr_rec &r = kcu_tr_recs[slot];
      r.entry = entry, r.wait = kcu_tr_wait, r.exit = t_exit, r.kernel = kernel;
      r.ctas = gridDim.x * gridDim.y * gridDim.z;
      for (int k = 0; k < KCU_TR_MARKS; k++) r.mark[k] = mark[k];
    }
  }
};
#define KCU_TRACE_SCOPE(k) kcu_trace_scope kcu_trace_scope_here(k)
/* CTA 0's time at point i of the traced kernel's body (the scope's). */
#define KCU_TRACE_MARK(i)                                                                                             \
  do {                                                                                                                \
    if (kcu_tr_cta0() && (i) < KCU_TR_MARKS) kcu_trace_scope_here.mark[(i)] = kcu_tr_now();                          \
  } while (0)
__device__ __forceinline__ void kcu_trace_waited() {
  if (kcu_tr_cta0()) kcu_tr_wait = kcu_tr_now();
}
#else
#define KCU_TRACE_SCOPE(k) ((void)0)
#define KCU_TRACE_MARK(i) ((void)0)
__device__ __forceinline__ void kcu_trace_waited() {}
#endif

#endif
