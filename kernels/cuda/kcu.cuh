/* kcu.cuh - internals of the CUDA backend shared by its .cu files.
 *
 * The backend context (kcu_ctx_t), the one error-check macro for CUDA and
 * cuBLAS calls, element load/store helpers for the activation types (bf16 or
 * f16, chosen at create time) and what each .cu file exports to the others
 * (weight loading, sampling and the kernel launchers, which the ops table in
 * kcu_backend.cu calls). Not a public header: only kernels/cuda (and
 * bench/cuda_ops.cu) include it.
 *
 * Threads: one owner thread per backend (kern.h). Every op runs on the
 * backend's one stream; ops called between graph_begin and graph_end are
 * captured, so they must not synchronize, allocate or read host memory.
 */
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "common/fr_err.h"
#include "common/fr_read.h"
#include "common/fr_util.h"
#include "kernels/cuda/kcu_trace.cuh"
#include "kernels/kern.h"

/* One check for CUDA, cuBLAS (and later NCCL) calls, like ggml-cuda's
 * CUDA_CHECK_GEN: reports the call, file and line, returns the code. */
#define KCU_CHECK_GEN(call, type_t, ok, code, strfn)                                       \
  do {                                                                                      \
    type_t kcu_e_ = (call);                                                                 \
    if (kcu_e_ != (ok))                                                                     \
      return fr_errorf((code), "%s failed: %s (%s:%d)", #call, strfn(kcu_e_), __FILE__, __LINE__); \
  } while (0)
#define KCU_CHECK(call) KCU_CHECK_GEN(call, cudaError_t, cudaSuccess, FR_ECUDA, cudaGetErrorString)
#define KCU_CUBLAS(call) KCU_CHECK_GEN(call, cublasStatus_t, CUBLAS_STATUS_SUCCESS, FR_ECUBLAS, cublasGetStatusString)

#define KCU_MAX_GRAPHS 64
#define KCU_QGEMV_MAX_N 8 /* most rows the quantized GEMV takes */
#define KCU_Q4F_MAX_N 128 /* default of q4f_max_n */
#define KCU_CUBLAS_WS_BYTES (32u << 20) /* cuBLAS's workspace, which cuBLASLt's FP8 GEMM shares (one stream) */
#define KCU_F8_GEMV_MAX_N 8 /* most rows of x a KERN_F8R matmul may run as the GEMV (f8_gemv_max_n's limit) */
#define KCU_F8_GEMV_N 2     /* f8_gemv_max_n's default; more rows: quantized, and cuBLASLt's FP8 GEMM. Measured on
                               H200 (docs/bench/gpu.md, session 51), Llama-3-8B decode, ms a step, GEMV / GEMM: 2.88 /
                               4.60 at 1 row, 4.16 / 4.65 at 2, 6.51 / 4.62 at 4, 13.4 / 5.0 at 8 (it reads x from L1
                               twice per 16 weights for every row) */
#define KCU_F8_GEMV_WPR 2   /* warps a row of that GEMV (FERRUM_CUDA_GEMV_WPR overrides): half the bytes of a
                               bf16 row, which takes 4 */
#define KCU_Q4F_WG_MIN_N 65  /* default of q4f_wg */
#define KCU_Q4F_WG_SPLITS 8     /* most splits of its weights' columns */
#define KCU_Q4F_WG_MIN_UNITS 4  /* fewest 64-column units a split */
#define KCU_Q4F_WG_MAX_N 256 /* most rows the wgmma 4-bit matmul takes (measured to 256: gpu.md, session 46) */
#define KCU_Q6F_MAX_N 16  /* most rows a KERN_Q6F matmul reads the 6-bit weights for (no wide kernel) */
#define KCU_MOE_GEMV_PAIRS 64   /* default of moe_gemv_pairs: 8 tokens of top-8 (kcu_moe.cu) */
#define KCU_MOE_SMALL_PER_EXP 16 /* default of moe_small_per_exp (kcu_moe.cu) */
#define KCU_MAX_SPLITS 64   /* decode attention split-K limit */
#define KCU_DEC_MIN_CHUNK 64 /* default fewest context tokens per split (see kcu_attn.cu) */
#define KCU_KVD_MB 256       /* kvd's default limit, MiB (FERRUM_CUDA_KVD_MB; kcu_attn.cu): Llama-3-8B's 64k tokens
                                of prefill context a step in bf16 */
#define KCU_KVD_REUSE 2      /* kvd_reuse's default (FERRUM_CUDA_KVD_REUSE; kcu_attn.cu) */
#define KCU_DEC_MMA_CHUNK 128 /* the same for the tensor-core decode kernel where it splits */
#define KCU_MAX_GROUP 8     /* query heads per KV head in the decode kernel (more: prefill kernel) */
#define KCU_DEC_GROUP 4     /* query heads per CTA of the decode kernel: a KV head with more has several CTAs */
#define KCU_STAGE_N 16               /* pinned chunks in the weight-loading ring */
#define KCU_STAGE_AHEAD (KCU_STAGE_N - 2) /* of them being read (weight_load_file); the others' DMA runs */
#define KCU_STAGE_BYTES (16u << 20)  /* bytes per chunk */

/* Launch geometry shared by the kernel files (each file names its own
 * kernels' block and tile sizes at its top). */
#define KCU_WARP 32      /* threads per warp on every NVIDIA GPU; lane math and the shuffles below rely on it */
#define KCU_MAX_WARPS (1024 / KCU_WARP) /* warps in the largest CTA: the size of per-warp reduction scratch */
#define KCU_ELEM_NT 256  /* threads per CTA of the elementwise kernels: 8 warps, the usual size for
                            memory-bound kernels (not tuned here) */
#define KCU_QSUB 32      /* elements of a quantization sub-block: the quantized kernels' unit of work
                            (one a thread or a lane) and the int8 activations' scale group */

/* Device copy of the step metadata: one allocation, fixed offsets while the
 * capacities hold (graphs captured against it stay valid). */
typedef struct {
  int32_t *hdr;          /* [0]=n_tokens [1]=n_seqs [2]=max_blocks */
  int32_t *positions;    /* (tok_cap) */
  int32_t *slots;        /* (tok_cap) */
  int32_t *tokens;       /* (tok_cap) */
  int32_t *q_start;      /* (seq_cap + 1) */
  int32_t *ctx_len;      /* (seq_cap) */
  int32_t *pf_seqs;      /* (seq_cap) the sequences with more than one query token, in order */
  int32_t *kvd_base;     /* (seq_cap) a sequence's first block in kcu_ctx_t.kvd (-1: none; kcu_attn.cu) */
  int32_t *block_tables; /* (bt_cap) */
} kcu_meta_t;

typedef struct {
  uint64_t key;
  cudaGraphExec_t exec;
} kcu_graph_t;

/* One penalized or biased token of a row: its id, its count among the
 * output tokens (0: only in the prompt; -1: in neither, a logit bias or a
 * min_tokens ban alone), its raw logit, kept by the sampler, and the bias
 * added to it first (-inf: banned). A row lists each token once. */
typedef struct {
  int32_t token, count;
  float raw;
  float bias;
} kcu_pen_t;

/* A chunk of the weight-loading ring being filled (kcu_weights.cu): bytes
 * [off, off + len) of a weight of src_t whose device copy (dst_t) is at
 * dst. */
typedef struct {
  int slot;
  size_t off, len;
  void *dst;
  kern_type_t dst_t, src_t;
  fr_read_batch_t reads;
} kcu_fill_t;

typedef struct {
  kern_backend_t be; /* what kern_cuda_create hands out; be.ctx points here */
  int device;
  int n_sm;
  size_t smem_optin;
  cudaStream_t stream;
  cudaStream_t side;       /* a mixed step's prefill attention, beside the decode kernel on `stream` (attn_side) */
  cudaEvent_t side_fork, side_join;
  int attn_side;           /* that overlap (FERRUM_CUDA_ATTN_SIDE=0: both on `stream`, one after the other) */
  cublasHandle_t cublas;
  void *cublas_ws;
  kern_type_t act;
  size_t act_size;
  int simt_prefill; /* FERRUM_CUDA_SIMT_PREFILL=1: the SIMT prefill attention instead of the tensor-core one */
  int pf_pack;      /* the tensor-core prefill's CTAs take a query group's heads (FERRUM_CUDA_PF_PACK=0: a head each;
                       kcu_attn.cu's kcu_pf_group) */
  int gemv_max_n, qgemv_max_n; /* largest n served by the GEMV kernels (dense, quantized); dense -1: auto */
  int dec_chunk;    /* fewest context tokens per decode attention split (FERRUM_CUDA_DEC_CHUNK) */
  int dec_msplit;   /* the tensor-core decode kernel, split, where the (sequence, KV head) pairs are at most half
                       the SMs (FERRUM_CUDA_DEC_MSPLIT=0: the SIMT kernel there; 2: split wherever the pairs are
                       fewer than KCU_DEC_MMA_CTAS a SM) */
  int dec_mchunk;   /* its fewest context tokens a split (FERRUM_CUDA_DEC_MCHUNK, a multiple of 16) */
  int dec_mma;      /* fewest (sequence, KV head) pairs the tensor-core decode attention takes (FERRUM_CUDA_DEC_MMA;
                       -1: more than half the SMs, unless the SIMT kernel fits one wave unsplit) */
  int dec_tma;      /* stages of the tensor-core decode attention's bulk tensor copies (FERRUM_CUDA_DEC_TMA 2,
                       3 or 4, 4 for quantized pools only; -1: by the grid; 0: cp.async, as before) */
  int dec_mma_q;    /* a quantized pool's decode attention on the tensor cores where it applies (FERRUM_CUDA_DEC_MMA_Q;
                       0: the SIMT kernel) */
  int gemv_wpr;     /* warps per row of the dense GEMV (FERRUM_CUDA_GEMV_WPR 1, 2, 4; 0: by shape) */
  int fuse_gemv;    /* matmul_silu_mul and matmul_rope_kv_append as one GEMV kernel where it runs, and
                       matmul_silu_mul as one wide Q4F kernel where that runs
                       (FERRUM_CUDA_FUSE_GEMV=0: always the two ops, for comparisons) */
  int pdl;          /* launch with programmatic dependent launch (FERRUM_PDL=0 turns it off) */
  int moe_gemv_pairs;  /* most (token, expert) pairs a moe_ffn call runs as GEMVs (FERRUM_CUDA_MOE_GEMV) */
  int moe_small_per_exp; /* most pairs an expert on average it runs on small tiles (FERRUM_CUDA_MOE_SMALL); more: large */
  int gg_wg;             /* the grouped GEMM's large dense tiles by wgmma (sm_90a; FERRUM_CUDA_GG_WG), else mma.sync */
  int q4f;             /* repack 4-bit matmul weights as KERN_Q4F (FERRUM_CUDA_Q4F=0: keep the file's blocks) */
  int q4f_max_n;       /* most rows a Q4F matmul reads the 4-bit weights for; more: dequantize + cuBLAS */
  int q4f_warps;       /* warps per tile of the Q4F matmul (FERRUM_CUDA_Q4F_WARPS 4 or 8); 0: by batch */
  int q4f_gemm;        /* past 64 rows without the wide kernel, tiles share activations (kcu_q4f_gemm_k);
                          FERRUM_CUDA_Q4F_GEMM=0: not */
  int q4f_nt;          /* most MMA columns (8 tokens each) a CTA of the Q4F matmul takes (FERRUM_CUDA_Q4F_NT 1-8; 4) */
  int q4f_wg;          /* fewest rows the 4-bit matmul runs by wgmma (kcu_q4f_wg.cu, sm_90a; FERRUM_CUDA_Q4F_WG),
                          0: never */
  int q4f_wg_mt;       /* its CTAs' tokens in 64s (FERRUM_CUDA_Q4F_WG_MT 1, 2 or 4) */
  int q4f_wg_ctas;     /* the fewest CTAs a call of it must fill (FERRUM_CUDA_Q4F_WG_CTAS); -1: twice the SMs */
  int q4f_wg_split;    /* a grid short of q4f_wg_ctas split over its weights' columns (FERRUM_CUDA_Q4F_WG_SPLIT=0: not) */
  long long q4f_wg_slots; /* its CTAs resident at once on the device (kcu__q4f_wg_init) */
  int *q4wg_cnt;       /* its split calls' counters (kcu_q4f_wg.cu), q4wg_cnt_n of them, zero between calls */
  size_t q4wg_cnt_n;
  int q4f_wide;        /* fewest rows the 128-row CTAs of the Q4F matmul take (FERRUM_CUDA_Q4F_WIDE) */
  int q4f_ks;          /* their column splits (FERRUM_CUDA_Q4F_KS; 0: by the SMs) */
  int q4f_row;         /* one row: the one-row Q4F kernel, its warps a tile by shape (FERRUM_CUDA_Q4F_ROW 4 or 8:
                          always that; 0: the per-tile kernel) */
  int q6f;             /* repack Q6_K matmul weights as KERN_Q6F too (FERRUM_CUDA_Q6F=0: keep the file's blocks) */
  int q4g;             /* KERN_Q4G where a weight's (d, m) allow (FERRUM_CUDA_Q4G=0: always KERN_Q4F) */
  int q4g_raw;         /* KERN_Q4G's one-row kernel on the raw nibbles (FERRUM_CUDA_Q4G_RAW=0: the dequantizing one) */
  int pdl_late, pdl_early; /* FERRUM_CUDA_PDL_LATE / _EARLY (kcu_pdl_next), -1 unset */
  size_t q4g_row_smem; /* the most shared memory that kernel may ask for (its activations) */

  /* step metadata: device buffer, pinned host mirror, host copies */
  void *meta_dev, *meta_pin;
  int tok_cap, seq_cap;
  size_t bt_cap;
  kcu_meta_t dm, pm;       /* pointers into meta_dev / meta_pin */
  cudaEvent_t meta_done;   /* the last metadata upload finished reading meta_pin */
  int n_tokens, n_seqs, max_blocks;
  int max_q, max_ctx;      /* longest query run and context in this step */
  int n_single, n_pf;      /* sequences with one query token; with more (listed in dm.pf_seqs) */
  int32_t *h_tokens;       /* host copy (tok_cap) for embed's bounds check */

  /* scratch */
  void *deq;               /* act-type dequantized weight rows for prefill GEMMs */
  size_t deq_elems;
  int8_t *xq;              /* decode GEMV activations as int8 (KCU_QGEMV_MAX_N * max cols) */
  void *xqd;               /* their per-KCU_QSUB (scale, scale * sum) float2 */
  size_t xq_cap;           /* elements of xq */
  float *attn_part;        /* decode split-K partials */
  size_t attn_part_floats;
  int32_t *attn_cnt;       /* per (sequence, KV head): splits done; the last one merges and resets it to 0 */
  size_t attn_cnt_n;
  void *kvd;               /* a quantized pool's prefill K/V in the act type (kcu_attn.cu): K's blocks, then V's */
  size_t kvd_bytes;
  int32_t *kvd_bt;         /* (kvd_bt_n) block tables into kvd, n_seqs x max_blocks as the step's */
  size_t kvd_bt_n;
  long long kvd_need;      /* this step's blocks in kvd (0: none or too many: the kernel converts the pool's) */
  long long kvd_tiles;     /* the sum over them of their sequence's prefill CTAs a KV head (kcu_kvd_pays) */
  int kvd_tiles_gp;        /* the heads a CTA that kvd_tiles counted for (0: not counted this step) */
  int kvd_max_nb;          /* the most blocks of one sequence among them */
  size_t kvd_max_bytes;    /* kvd's limit (FERRUM_CUDA_KVD_MB) */
  int kvd_reuse;           /* the fewest conversions of a context block on average in the loop that take kvd
                              (FERRUM_CUDA_KVD_REUSE) */
  unsigned long long kvd_runs; /* prefill launches that read kvd (kern_cuda_kvd_runs) */
  float *f32_tmp;          /* to_f32_host staging */
  size_t f32_tmp_n;
  void *samp_pin;            /* sample params in, (token, logprob) out: pinned, the sampler's own reads and writes */
  size_t samp_cap; /* rows */
  void *samp_part;           /* the split first pass's partials (kcu_sample.cu) */
  size_t samp_part_n;
  int32_t *samp_cnt;         /* per row: its CTAs done; the last one merges and resets it to 0 */
  size_t samp_cnt_n;
  int samp_split;            /* FERRUM_CUDA_SAMPLE_SPLIT: at most this many CTAs a row (0: the default) */
  kcu_pen_t *pen_dev, *pen_pin; /* the step's penalized tokens (kcu_sample) */
  size_t pen_cap;
  int32_t *pen_sort;         /* host scratch for building them */
  size_t pen_sort_cap;
  uint32_t *mask_dev, *mask_pin; /* the step's allowed-token masks, packed row after row (kcu_sample) */
  size_t mask_cap;               /* words */
  void *moe_buf;           /* moe_ffn scratch (kcu_moe.cu) */
  size_t moe_bytes;
  int f8_gemv_max_n;       /* FERRUM_CUDA_F8_GEMV_MAX_N (kcu_f8.cu) */
  int f8_tensor;           /* FP8 scales per tensor (a weight; a matmul's activations) instead of per row and per
                              token: this cuBLASLt has no outer-vector scaling (before 12.9, or not sm_90), or
                              FERRUM_CUDA_F8_SCALES=tensor */
  cublasLtHandle_t lt;     /* the FP8 GEMM's (kcu_f8.cu), made with the first FP8 weight */
  cublasLtMatmulDesc_t lt_desc;   /* KERN_F8R's: scale vectors (or scalars: f8_tensor) */
  cublasLtMatmulDesc_t lt_desc_b; /* KERN_F8B's: 128 x 128 weight blocks, 128-column activation groups; made with
                                     the first KERN_F8B weight */
  struct kcu_f8_plan *f8_plans; /* their algorithms by shape */
  uint8_t *x8;             /* its activations as FP8 E4M3 (KCU_F8_X_BYTES) */
  float *x8s;              /* their scales (KCU_F8_X_SCALES): a token each then an absmax slot (f8_tensor), or a
                              token's 128-column group each (KERN_F8B) */
  struct {                 /* x8 / x8s as the FP8 twin of an activation (kcu_f8.cu): src's rows x cols a scale a */
    const void *src;       /*   row, zero rows to a multiple of 4, as of launch `at`; a kernel launched since */
    int rows, cols;        /*   (kcu_launch) or another write (kcu__x8_drop) ends it */
    unsigned long long at;
  } x8_twin;
  mutable unsigned long long launches; /* kernels kcu_launch has queued */
  unsigned long long x8_hits; /* FP8 GEMMs that took their activations from the twin (kern_cuda_f8_twin_hits) */
  int x8_fuse;             /* the norms and silu_mul write the twin for the FP8 GEMM after them (FERRUM_CUDA_F8_FUSE=0:
                              not) */
  bool f8r;                /* a KERN_F8R weight is loaded */
  int f8_fast;             /* KERN_F8R's GEMM with cuBLASLt's fast accumulation (FERRUM_CUDA_F8_FAST_ACCUM=0: not) */
  int32_t *pairs_dev;      /* kv_copy_blocks */
  int pairs_cap;
  int pool_block_size;     /* the last pool's block size (kvd plans for it) */
  int pools_kv_min, pools_kv_max, pools_hd_max, pools_bs_max; /* over the pools made: the decode partials that
                              step_begin reserves cover each (a draft model's pool, made after the target's, may
                              be narrower) */
  bool kvd_quant;          /* some pool made holds int8 or FP8 (kcu_attn.cu's kvd) */
  int kvd_row;             /* the widest K/V row (KV heads x head_dim) of the pools made: kvd's blocks are sized by
                              it (a draft model's pool, made after the target's, may be narrower) */
  const void *kv_tmap_base;  /* the pool whose tensor map kv_tmap holds (kcu_attn.cu), NULL: none */
  unsigned char kv_tmap[128]; /* a CUtensorMap's bytes (copied to an aligned one to launch) */

  /* graphs */
  kcu_graph_t graphs[KCU_MAX_GRAPHS];
  int n_graphs;
  int capturing;
  uint64_t capture_key;

  /* weight loading (kcu_weights.cu): a ring of pinned host chunks feeding a
   * copy stream, made by the first weight_load and freed by load_end */
  cudaStream_t load_stream;
  void *stage_pin[KCU_STAGE_N];          /* pinned host chunks, KCU_STAGE_BYTES each */
  void *stage_dev;                       /* (KCU_STAGE_N, KCU_STAGE_BYTES) device chunks that conversions read */
  cudaEvent_t stage_copied[KCU_STAGE_N]; /* chunk i reached stage_dev (conversions wait on it) */
  cudaEvent_t stage_free[KCU_STAGE_N];   /* chunk i's copy (and conversion) finished reading it */
  cudaEvent_t load_tail;                 /* the last copy queued on load_stream */
  int stage_next;                        /* the ring's next chunk */
  fr_reader_t *reader;                   /* io_uring reads of weight_load_file (common/fr_read.h) */
  kcu_fill_t fills[KCU_STAGE_AHEAD];     /* chunks being read, oldest first from fill_head: each one's DMA */
  int fill_head, n_fills;                /*   goes out once read, in a later weight_load_file or load_end */
  uint64_t load_ns[3];                   /* since the ring was made: waiting for reads, for free chunks, in cudaMalloc */

  /* tensor parallelism (kcu_comm.cu, kcu_car.cu) */
  void *nccl;                            /* ncclComm_t, or NULL */
  int comm_rank, comm_size;
  struct kcu_car *car;                   /* the one-shot all-reduce, or NULL (NCCL only) */
  void *gather_stage;                    /* rank 0: (size, gather_max) parts of gather_cols */
  size_t gather_max;                     /* elements of the largest gather_cols part */
} kcu_ctx_t;

/* The one-shot all-reduce over peer memory (kcu_car.cu). */
#define KCU_CAR_MAX_RANKS 8
#define KCU_CAR_MAX_BYTES (512u << 10) /* largest call it takes; NCCL's ring does better above */
typedef struct kcu_car {
  void *buf;                     /* this rank's IPC buffer: two slots of a region per rank */
  void *peer[KCU_CAR_MAX_RANKS]; /* every rank's buffer mapped here (this rank's is buf) */
  uint32_t *count;               /* calls made, and the CTAs of the current call that finished */
  size_t max_bytes;              /* calls up to this many bytes go here (FERRUM_CUSTOM_AR_MAX) */
} kcu_car_t;

/* Whether p is 16-byte aligned (one uint4 access). */
static inline bool kcu_al16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* Element helpers: T is __nv_bfloat16 or __half. */
__device__ __forceinline__ float kcu_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float kcu_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float kcu_f(float x) { return x; }
template <typename T> __device__ __forceinline__ T kcu_t(float x);
template <> __device__ __forceinline__ __nv_bfloat16 kcu_t<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <> __device__ __forceinline__ __half kcu_t<__half>(float x) { return __float2half(x); }
template <> __device__ __forceinline__ float kcu_t<float>(float x) { return x; }

/* silu(g) * u in T: the silu_mul op and the fused GEMV and Q4F epilogues
 * compute it this one way, so fused and unfused give the same bits. */
template <typename T> __device__ __forceinline__ T kcu_silu_mul1(float g, float u) {
  return kcu_t<T>(g / (1.f + __expf(-g)) * u);
}

/* Rope: the sine and cosine of pos * inv_freq (pair p's frequency) times
 * attn_factor, and a pair (x0, x1) rotated by them, each rounded to T. The
 * rope kernels and the GEMV's fused epilogue all compute it this one way,
 * so fused and unfused give the same bits. */
__device__ __forceinline__ void kcu_rope_sincos(int pos, float inv_freq, float attn_factor, float *s, float *co) {
  sincosf((float)pos * inv_freq, s, co);
  *s *= attn_factor;
  *co *= attn_factor;
}
template <typename T>
__device__ __forceinline__ void kcu_rope_rotate(float x0, float x1, float s, float co, T *ya, T *yb) {
  *ya = kcu_t<T>(x0 * co - x1 * s);
  *yb = kcu_t<T>(x0 * s + x1 * co);
}

/* 8 packed elements (one 16-byte load) to f32. */
__device__ __forceinline__ void kcu_unpack8(uint4 v, float *f, const __nv_bfloat16 *) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; i++) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}
__device__ __forceinline__ void kcu_unpack8(uint4 v, float *f, const __half *) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; i++) {
    __half2 h = *reinterpret_cast<const __half2 *>(&w[i]);
    float2 p = __half22float2(h);
    f[2 * i] = p.x;
    f[2 * i + 1] = p.y;
  }
}
template <typename T> __device__ __forceinline__ uint4 kcu_pack8(const float *f) {
  uint4 v;
  T *t = reinterpret_cast<T *>(&v);
#pragma unroll
  for (int i = 0; i < 8; i++) t[i] = kcu_t<T>(f[i]);
  return v;
}

/* ---- quantized KV cache (kern_kv_dtype_t, kern_types.h) ----
 * A quantized pool keeps one byte per element (int8, or FP8 E4M3) and an
 * f16 scale per (token, KV head); the kernels take the kind as a template
 * argument Q. Appends quantize as kern_kv_quantize_row does; attention
 * converts the bytes to f32 after the load (registers or shared memory). */
enum { KCU_KVQ_NONE = 0, KCU_KVQ_INT8 = 1, KCU_KVQ_FP8 = 2 };

/* One stored byte of v (an element already divided by its row's scale):
 * int8 rounded to nearest even and clamped to +-127; E4M3 rounded to
 * nearest even and saturated to +-448. */
template <int Q> __device__ __forceinline__ uint8_t kcu_kvq_byte(float v) {
  if constexpr (Q == KCU_KVQ_INT8) {
    const int i = min(127, max(-127, __float2int_rn(v)));
    return (uint8_t)(int8_t)i;
  } else {
    return (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
  }
}

/* 8 stored bytes (lo: elements 0-3, hi: 4-7, little-endian) times scale. */
template <int Q> __device__ __forceinline__ void kcu_kvq_unpack8(uint32_t lo, uint32_t hi, float scale, float *f) {
  const uint32_t w[2] = {lo, hi};
#pragma unroll
  for (int k = 0; k < 2; k++) {
    if constexpr (Q == KCU_KVQ_INT8) {
#pragma unroll
      for (int i = 0; i < 4; i++) f[4 * k + i] = (float)(int8_t)((w[k] >> (8 * i)) & 0xffu) * scale;
    } else {
#pragma unroll
      for (int i = 0; i < 2; i++) {
        const __half2 h(__nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)((w[k] >> (16 * i)) & 0xffffu), __NV_E4M3));
        const float2 p = __half22float2(h);
        f[4 * k + 2 * i] = p.x * scale;
        f[4 * k + 2 * i + 1] = p.y * scale;
      }
    }
  }
}

__device__ __forceinline__ float kcu_warp_sum(float v) {
#pragma unroll
  for (int o = KCU_WARP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float kcu_warp_max(float v) {
#pragma unroll
  for (int o = KCU_WARP / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/* A CTA's sum of v (every thread gets it); red: KCU_MAX_WARPS floats of shared memory. */
template <int NT> __device__ float kcu_block_sum(float v, float *red) {
  v = kcu_warp_sum(v);
  int warp = threadIdx.x / KCU_WARP, lane = threadIdx.x % KCU_WARP;
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = lane < NT / KCU_WARP ? red[lane] : 0.f;
  v = kcu_warp_sum(v);
  __syncthreads();
  return v;
}

/* A CTA's max of v (every thread gets it); red as kcu_block_sum's. */
template <int NT> __device__ float kcu_block_max(float v, float *red) {
  v = kcu_warp_max(v);
  const int warp = threadIdx.x / KCU_WARP, lane = threadIdx.x % KCU_WARP;
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = lane < NT / KCU_WARP ? red[lane] : 0.f;
  v = kcu_warp_max(v);
  __syncthreads();
  return v;
}

/* ---- FP8 activations (kcu_f8.cu) ----
 * A row as E4M3 bytes and a scale max|x| / 448, kern_fp8_quantize_row's
 * operations: the quantizer and the kernels that write the FP8 twin of
 * their output (the norms, silu_mul) give the same bits. */

/* 8 elements times inv as E4M3 bytes. */
__device__ __forceinline__ uint2 kcu_f8_pack8(const float *f, float inv) {
  uint32_t p[4];
#pragma unroll
  for (int j = 0; j < 4; j++)
    p[j] = __nv_cvt_float2_to_fp8x2(make_float2(f[2 * j] * inv, f[2 * j + 1] * inv), __NV_SATFINITE, __NV_E4M3);
  return make_uint2(p[0] | p[1] << 16, p[2] | p[3] << 16);
}

/* Row `row` of q (n8 * 8 bytes) and its scale as padding: zeros. */
template <int NT> __device__ __forceinline__ void kcu_f8_pad_row(uint8_t *q, float *scale, int n8, size_t row) {
  uint2 *q8 = reinterpret_cast<uint2 *>(q + row * (size_t)n8 * 8);
  for (int i = threadIdx.x; i < n8; i += NT) q8[i] = make_uint2(0, 0);
  if (threadIdx.x == 0) scale[row] = 0.f;
}

/* The twin of a row a CTA holds in registers: v[c] is its 16-byte chunk
 * threadIdx.x + c * NT (of n8), values already in the act type; writes
 * row `row` of q and its scale. red as kcu_block_sum's. */
template <int NT, int V>
__device__ __forceinline__ void kcu_f8_twin_row(uint8_t *q, float *scale, const float (&v)[V][8], int n8, size_t row,
                                                float *red) {
  float m = 0.f;
#pragma unroll
  for (int c = 0; c < V; c++) {
    if (threadIdx.x + c * NT >= n8) break;
#pragma unroll
    for (int e = 0; e < 8; e++) m = fmaxf(m, fabsf(v[c][e]));
  }
  m = kcu_block_max<NT>(m, red);
  const float inv = m > 0.f ? 448.f / m : 0.f;
  if (threadIdx.x == 0) scale[row] = m / 448.f;
  uint2 *q8 = reinterpret_cast<uint2 *>(q + row * (size_t)n8 * 8);
#pragma unroll
  for (int c = 0; c < V; c++) {
    const int j = threadIdx.x + c * NT;
    if (j >= n8) break;
    q8[j] = kcu_f8_pack8(v[c], inv);
  }
}

/* RMS norm of a row held in registers, a CTA per row (kcu_rms_norm_vec_k,
 * and the all-reduce fused with it in kcu_car.cu: one sequence of
 * operations, so both give the same bits). */
#define KCU_NORM_V 4         /* 16-byte chunks of the row a thread keeps in registers */
#define KCU_NORM_NT_SMALL 32 /* one warp for rows of at most 8 * 32 * KCU_NORM_V = 1024 elements: a short
                                row (the per-head q/k norms) would leave most of a larger CTA idle */
#define KCU_NORM_NT 256      /* and 256 threads for longer rows (8 warps, as the elementwise kernels) */
#define KCU_NORM_TPR 8       /* lanes a row of kcu_rms_norm_rows_k (many rows of at most 8 * 8 * KCU_NORM_V) */
#define KCU_NORM_ROWS_NT 128 /* its threads a CTA: 16 rows */
#define KCU_NORM_ROWS_MIN 4096 /* rows from which it runs: fewer, a CTA a row fits the SMs in a wave or two */

/* This thread's norm weights: those of 16-byte index threadIdx.x + c * NT
 * (of n8) in wv[c]. No kernel writes weights, so the norm kernels load them
 * before their PDL wait, off the path that waits on the kernel before. */
template <int NT, int V>
__device__ __forceinline__ void kcu_norm_load_w(float4 (&wv)[V][2], const float *w, int n8) {
#pragma unroll
  for (int c = 0; c < V; c++) {
    const int j = threadIdx.x + c * NT;
    if (j >= n8) break;
    wv[c][0] = __ldg(reinterpret_cast<const float4 *>(w) + 2 * j);
    wv[c][1] = __ldg(reinterpret_cast<const float4 *>(w) + 2 * j + 1);
  }
}

/* v[c] holds the row's elements at 16-byte index threadIdx.x + c * NT (of
 * n8), ss this thread's sum of their squares, wv the weights
 * (kcu_norm_load_w): o8 = v * rsqrt(mean + eps) * w. With TWIN, v becomes
 * o8's values (f32 of the act type) for the FP8 twin. */
template <typename T, int NT, int V, bool TWIN = false>
__device__ __forceinline__ void kcu_norm_row_out(float (&v)[V][8], float ss, const float4 (&wv)[V][2], uint4 *o8,
                                                 int n8, int dim, float eps, float *red) {
  ss = kcu_block_sum<NT>(ss, red);
  const float inv = rsqrtf(ss / (float)dim + eps);
#pragma unroll
  for (int c = 0; c < V; c++) {
    const int j = threadIdx.x + c * NT;
    if (j >= n8) break;
    const float *wf = reinterpret_cast<const float *>(wv[c]);
    float o[8];
#pragma unroll
    for (int e = 0; e < 8; e++) o[e] = v[c][e] * inv * wf[e];
    o8[j] = kcu_pack8<T>(o);
    if constexpr (TWIN)
#pragma unroll
      for (int e = 0; e < 8; e++) v[c][e] = kcu_f(kcu_t<T>(o[e]));
  }
}

/* Runs `body` with T bound to the activation type of ctx. */
#define KCU_ACT_DISPATCH(ctx, ...)                  \
  do {                                              \
    if ((ctx)->act == KERN_BF16) {                  \
      typedef __nv_bfloat16 T;                      \
      __VA_ARGS__;                                  \
    } else {                                        \
      typedef __half T;                             \
      __VA_ARGS__;                                  \
    }                                               \
  } while (0)

static inline int kcu_div_up(long long a, long long b) { return (int)((a + b - 1) / b); }

/* Programmatic dependent launch (sm_90). Every kernel is launched through
 * kcu_launch, which lets it start while the previous kernel on the stream
 * drains, so its launch and prologue overlap that kernel's tail. The rule
 * that keeps this correct: each kernel calls kcu_pdl_wait() before it reads
 * or writes any memory that another kernel writes (or reads), in every CTA,
 * also one that has nothing to do. Only reads of data no kernel writes
 * (weights, the step's metadata, which step_begin copies in before the
 * step's first kernel) may come before it. The wait returns once the
 * previous kernel has finished and its writes are visible, so the order is
 * transitive; and a kernel that lets the next launch only after its own
 * wait (kcu_pdl_enter) has every kernel before it finished by then, so the
 * next may also read early whatever only those wrote: the decode attention
 * reads the K/V of earlier steps before its wait. In a layer only the K/V
 * append writes the cache (rope + KV append, or the q/k/v GEMV with them in
 * its epilogue), and only the step's new rows, which attention reads after
 * its wait; the norm before the q/k/v GEMV lets it launch only after its
 * own wait (never early, kcu_pdl_next), and the GEMV and the rope kernel
 * between (which may let the attention launch before their waits) write no
 * old row, so any earlier writer of the cache (a block copy) has finished
 * before the attention starts.
 * Measured on H100 (Llama-3-8B shapes, batch 1): 1% faster decode; letting
 * the next kernel launch early (kcu_pdl_launch_next at entry) or only at
 * exit made no difference. Both together, with the first weights read
 * between them (the GEMVs, the KERN_Q4F matmul up to 16 rows), made
 * batch-1 decode 5-6% faster on H200 (docs/bench/gpu.md, session 15): the
 * weight stream starts while the kernel before drains. */
__device__ __forceinline__ void kcu_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  kcu_trace_waited();
}
/* Lets the next kernel launch once every CTA of this one has called it. */
__device__ __forceinline__ void kcu_pdl_launch_next() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
/* Both, at the top of a kernel with no weight prologue. */
__device__ __forceinline__ void kcu_pdl_enter() {
  kcu_pdl_wait();
  kcu_pdl_launch_next();
}

/* When a small kernel lets the next one launch, over n rows: right after
 * its PDL wait (KCU_NEXT_AT_WAIT); at its end (KCU_NEXT_AT_END: the next
 * kernel's CTAs then stop issuing their first weight loads while this
 * one's loads are on the critical path); or before its wait
 * (KCU_NEXT_EARLY: the next kernel's prologue overlaps the kernel before
 * this one). FERRUM_CUDA_PDL_EARLY and FERRUM_CUDA_PDL_LATE, masks of the
 * kernels below, each set its choice for every n in place of its default
 * (early first; never early for the norms, which the decode attention's
 * early K/V reads rely on, see kcu_pdl_wait). Unset: rope + K/V append
 * early from 16 rows, silu_mul at the end from 2 rows, the rest right
 * after the wait. Measured on H200 (Llama-3-8B shapes, I4G,
 * docs/bench/gpu.md): silu late batch 8 4.8%
 * faster, batch 1 1% slower, late norms, rope or attention slower at batch
 * 1 (session 37); rope early (the attention's CTAs start their K/V copies
 * during the q/k/v GEMV) batch 32 5% faster, batch 1-8 within 1%, early
 * silu 6% slower at batch 1, early attention no change (session 39). */
enum { KCU_PDL_NORM = 1, KCU_PDL_SILU = 2, KCU_PDL_ROPE = 4, KCU_PDL_ATTN = 8 };
enum { KCU_NEXT_AT_WAIT, KCU_NEXT_AT_END, KCU_NEXT_EARLY };
static inline int kcu_pdl_next(const kcu_ctx_t *c, int kernel, int n) {
  const bool early = c->pdl_early >= 0 ? (c->pdl_early & kernel & ~KCU_PDL_NORM) != 0
                                       : kernel == KCU_PDL_ROPE && n >= 16;
  if (early) return KCU_NEXT_EARLY;
  const bool late = c->pdl_late >= 0 ? (c->pdl_late & kernel) != 0 : kernel == KCU_PDL_SILU && n >= 2;
  return late ? KCU_NEXT_AT_END : KCU_NEXT_AT_WAIT;
}
/* Such a kernel's PDL wait, with the next launch where `next` says
 * (kcu_pdl_next); at the end, it calls kcu_pdl_launch_late there (or lets
 * its exit do it). */
__device__ __forceinline__ void kcu_pdl_wait_launch(int next) {
  if (next == KCU_NEXT_EARLY) kcu_pdl_launch_next();
  kcu_pdl_wait();
  if (next == KCU_NEXT_AT_WAIT) kcu_pdl_launch_next();
}
__device__ __forceinline__ void kcu_pdl_launch_late(int next) {
  if (next == KCU_NEXT_AT_END) kcu_pdl_launch_next();
}

/* Launches kernel k on c->stream (PDL when c->pdl), its grid in clusters
 * of `cluster` CTAs where that is more than one; returns the launch error. */
template <typename... KArgs, typename... Args>
static inline cudaError_t kcu_launch_cluster(const kcu_ctx_t *c, void (*k)(KArgs...), dim3 grid, dim3 cluster,
                                             dim3 block, size_t smem, Args &&...args) {
  cudaLaunchAttribute at[2];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = c->pdl;
  at[1].id = cudaLaunchAttributeClusterDimension;
  at[1].val.clusterDim.x = cluster.x, at[1].val.clusterDim.y = cluster.y, at[1].val.clusterDim.z = cluster.z;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = c->stream;
  cfg.attrs = at;
  cfg.numAttrs = cluster.x * cluster.y * cluster.z > 1 ? 2 : 1;
  c->launches++;
  return cudaLaunchKernelEx(&cfg, k, static_cast<KArgs>(args)...);
}
/* The same without clusters. */
template <typename... KArgs, typename... Args>
static inline cudaError_t kcu_launch(const kcu_ctx_t *c, void (*k)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                     Args &&...args) {
  return kcu_launch_cluster(c, k, grid, dim3(1, 1, 1), block, smem, static_cast<Args &&>(args)...);
}
/* Launch and check: returns from the calling function on a launch error. */
#define KCU_LAUNCH(...) KCU_CHECK(kcu_launch(__VA_ARGS__))

/* Device allocation: FR_EDEVOOM with a clear message when out of memory. */
int kcu__alloc(kcu_ctx_t *c, size_t bytes, void **out, const char *what);
/* Destroys the captured graphs: call before freeing a buffer they use. */
void kcu__graphs_drop(kcu_ctx_t *c);
/* Frees a device allocation (NULL is fine). */
void kcu__free(void *p);
/* Fails with FR_ESTATE when called during graph capture (for ops that would
 * allocate or synchronize). */
int kcu__not_capturing(kcu_ctx_t *c, const char *what);

/* Weights (kcu_weights.cu), behind the ops table's weight slots (kern.h
 * says what each does). */
bool kcu__supports_type(kern_type_t t);
int kcu__weight_load(kcu_ctx_t *c, kern_weight_t *w, const void *host_data);
int kcu__weight_load_file(kcu_ctx_t *c, kern_weight_t *w, const kern_file_span_t *spans, int n_spans);
int kcu__load_end(kcu_ctx_t *c);
void kcu__weight_release(kern_weight_t *w);
/* Waits for the weight staging ring's copies and frees it, if there is one
 * (cleanup: errors ignored). */
void kcu__stage_free(kcu_ctx_t *c);

/* The sample op (kcu_sample.cu): lists the rows' penalized tokens, uploads
 * the parameters, samples on the device and waits for the tokens. */
int kcu__sample(kcu_ctx_t *c, const void *logits, int n_rows, int vocab, const kern_sample_params_t *params_host,
                int32_t *tokens_host, float *logprobs_host);

/* Launchers (kcu_ops.cu, kcu_matmul.cu, kcu_attn.cu). All return 0 or a
 * negative error; they queue work on c->stream. */
int kcu__convert(kcu_ctx_t *c, void *dst, kern_type_t dst_type, const void *src, kern_type_t src_type, size_t n);
int kcu__embed(kcu_ctx_t *c, void *out, const kern_weight_t *table);
int kcu__rms_norm(kcu_ctx_t *c, void *out, void *residual, const void *x, const float *w, int n, int dim, float eps);
int kcu__rope(kcu_ctx_t *c, void *x, int n_heads, int head_dim, int row_stride, const kern_rope_t *rope);
int kcu__kv_append(kcu_ctx_t *c, kern_kv_pool_t *pool, int layer, const void *k, int k_stride, const void *v,
                   int v_stride);
int kcu__rope_kv_append(kcu_ctx_t *c, kern_kv_pool_t *pool, int layer, void *q, int q_stride, void *k, void *v,
                        int kv_stride, int n_heads, const kern_rope_t *rope);
int kcu__kv_copy(kcu_ctx_t *c, kern_kv_pool_t *pool, const int32_t *pairs_dev, int n_pairs);
int kcu__silu_mul(kcu_ctx_t *c, void *out, const void *gate, const void *up, int n, int d, int stride);
int kcu__add(kcu_ctx_t *c, void *out, const void *a, const void *b, size_t n);
int kcu__last_rows(kcu_ctx_t *c, void *out, const void *x, int dim);
int kcu__pool_rows(kcu_ctx_t *c, void *out, const void *x, int dim, kern_pool_t mode);
int kcu__add_bias(kcu_ctx_t *c, void *out, const float *bias, int n, int rows);
int kcu__matmul(kcu_ctx_t *c, void *out, const kern_weight_t *w, const kern_weight_t *bias, const void *x, int n);
int kcu__dequant_rows(kcu_ctx_t *c, void *dst, const kern_weight_t *w, int64_t row0, int64_t nrows);
/* The fused ops over the dense GEMV (kcu_matmul.cu), see kern_ops_t. */
int kcu__matmul_silu_mul(kcu_ctx_t *c, void *out, const kern_weight_t *w, const void *x, int n, void *scratch);
int kcu__matmul_rope_kv_append(kcu_ctx_t *c, void *qkv, const kern_weight_t *w, const kern_weight_t *bias,
                               const void *x, int n, kern_kv_pool_t *pool, int layer, int n_heads,
                               const kern_rope_t *rope);
/* FP8 weights (kcu_f8.cu). A KERN_F8R or KERN_F8B weight's scales follow
 * its bytes (kern_types.h). kcu__f8_quantize: w's rows in the act type
 * (src, device) become w->data's KERN_F8R (allocated here). kcu__f8_upload:
 * a KERN_F8R or KERN_F8B weight in host memory (an FP8 checkpoint's) copied
 * as it is, or FR_EUNSUPPORTED where this device's GEMM cannot run it.
 * kcu__f8_gemm: the matmul over n rows of x quantized likewise (a scale a
 * token, or a token's 128 columns), by cuBLASLt over n rounded up to a
 * multiple of 4: it writes up to 3 rows of out past n.
 * kcu__f8_destroy frees what they made. */
static inline const float *kcu_f8_scales(const kern_weight_t *w) {
  return (const float *)((const uint8_t *)w->data + (size_t)w->rows * (size_t)w->cols);
}
static inline bool kcu_is_f8(kern_type_t t) { return t == KERN_F8R || t == KERN_F8B; }
int kcu__f8_quantize(kcu_ctx_t *c, kern_weight_t *w, const void *src, const char *what);
int kcu__f8_upload(kcu_ctx_t *c, kern_weight_t *w, const void *host, const char *what);
int kcu__f8_gemm(kcu_ctx_t *c, void *out, const kern_weight_t *w, const float *bias, const void *x, int n);
void kcu__f8_destroy(kcu_ctx_t *c);
/* The FP8 twin (c->x8_twin): kcu__x8_want says whether a kernel about to
 * write n rows x cols of the act type also writes their twin into x8 / x8s
 * (kcu__x8_rows(n) rows, zeros past n) for an FP8 GEMM that may read them
 * next; kcu__x8_made records it after its launch; kcu__x8_drop ends it
 * where something other than a kernel launch writes device memory. */
bool kcu__x8_want(const kcu_ctx_t *c, int n, int cols);
void kcu__x8_made(kcu_ctx_t *c, const void *src, int n, int cols);
static inline int kcu__x8_rows(int n) { return (n + 3) & ~3; }
static inline void kcu__x8_drop(kcu_ctx_t *c) { c->x8_twin.src = NULL; }
/* KERN_Q4F, KERN_Q4G and KERN_Q6F (kcu_q4f.cu): whether a device type is
 * one of them; whether w (before upload) becomes one; whether its file
 * blocks (src, device) have one (d, m) per aligned 128 columns of a row,
 * as the act type rounds them (c->q4g off: never); which type that makes;
 * the device bytes of w as `type`; the repacking of src into dst as
 * `type`; the matmul on the tensor cores; rows dequantized to the act
 * type. */
static inline bool kcu_is_q4f(kern_type_t t) { return t == KERN_Q4F || t == KERN_Q4G || t == KERN_Q6F; }
bool kcu__q4f_takes(const kcu_ctx_t *c, const kern_weight_t *w);
int kcu__q4f_grouped(kcu_ctx_t *c, const kern_weight_t *w, const void *src, bool *grouped);
kern_type_t kcu__q4f_type(const kern_weight_t *w, bool grouped);
size_t kcu__q4f_bytes(const kern_weight_t *w, kern_type_t type);
int kcu__q4f_repack(kcu_ctx_t *c, void *dst, const kern_weight_t *w, const void *src, kern_type_t type);
int kcu__q4f_matmul(kcu_ctx_t *c, void *out, const kern_weight_t *w, const float *bias, const void *x, int n);
/* out (n, d) = silu(x Wg) * (x Wu) for a KERN_Q4F [gate; up] weight of 2d
 * rows in one wide kernel, where kcu__q4f_silu_fits says so (17-64 rows
 * on sm_90): the bits of kcu__q4f_matmul then kcu__silu_mul. */
bool kcu__q4f_silu_fits(const kcu_ctx_t *c, const kern_weight_t *w, const void *x, int n);
int kcu__q4f_matmul_silu(kcu_ctx_t *c, void *out, const kern_weight_t *w, const void *x, int n);
int kcu__q4f_dequant_rows(kcu_ctx_t *c, void *dst, const kern_weight_t *w, int64_t row0, int64_t nrows);
/* The wide Q4F kernels' shared memory (at create). */
int kcu__q4f_init(kcu_ctx_t *c);
int kcu__attention(kcu_ctx_t *c, void *out, const void *q, int q_stride, const kern_kv_pool_t *pool, int layer,
                   int n_heads, int head_dim, float scale, int window);
/* Raises the shared-memory limit of the tensor-core prefill kernels (at create). */
int kcu__attn_init(kcu_ctx_t *c);
/* The most decode splits either decode kernel takes at a step shape; the partials buffer is sized from it. */
int kcu__attn_max_splits(const kcu_ctx_t *c, int n_seqs, int n_kv_heads, long long capacity);
/* Grows the split-K partials and counters for that many splits (not inside a capture). */
int kcu__attn_reserve(kcu_ctx_t *c, int n_seqs, int n_groups, int n_heads, int head_dim, int splits);
/* A step's prefill over a quantized pool: each sequence's first block in kvd into the pinned metadata, and
 * kvd and its block tables grown for them (kcu_attn.cu; at step_begin, before the upload). */
int kcu__kvd_plan(kcu_ctx_t *c, const kern_step_t *s);

/* kcu_moe.cu: the moe_ffn op (kern.h). */
int kcu__moe_ffn(void *ctx, void *out, const void *x, int n, const kern_moe_t *m);

/* kcu_ggemm.cu: the grouped GEMM on the tensor cores. Rows come in tiles of
 * KCU_GG_ROWS_SMALL or _LARGE, each tile of one weight of a table of
 * device addresses (at most KCU_GG_MAX_W, all of one type and row size). As
 * the matmul of one dense quantized weight (prefill, batches above 8 rows)
 * it ran 2-4.5x slower than dequantizing into bf16 for cuBLAS (H200,
 * Llama-3-8B Q4_K/Q8_0 shapes, docs/bench/gpu.md): its B tiles dequantize
 * synchronously, with nothing overlapping the loads. */
#define KCU_GG_MAX_W 256
#define KCU_GG_ROWS_SMALL 16
#define KCU_GG_ROWS_LARGE 64
typedef struct {
  const uint8_t *p[KCU_GG_MAX_W];
} kcu_gg_ptrs_t;
typedef struct {
  const int32_t *sorted;  /* (tiles * rows) the source of each row, -1 padding */
  int gather_k;           /* a row reads a's row sorted / gather_k (0: its own row) */
  const int32_t *tile_w;  /* (tiles) each tile's weight */
  const int32_t *n_tiles; /* device count of the tiles in use (the rest exit at once) */
  int tiles;              /* tiles launched */
  bool small;             /* KCU_GG_ROWS_SMALL rows a tile, else _LARGE */
} kcu_gg_rows_t;
enum { KCU_GG_F32 = 0, KCU_GG_GATED = 1 }; /* out = A w^T in f32; silu(A w0^T) * (A w1^T) in the act type */
int kcu__gg(kcu_ctx_t *c, int mode, void *out, const void *a, const kcu_gg_rows_t *rows, const kcu_gg_ptrs_t *w0,
            const kcu_gg_ptrs_t *w1, kern_type_t t, size_t row_bytes, int N, int K);
/* Raises the GEMM kernels' shared-memory limits (at create). */
int kcu__gg_init(kcu_ctx_t *c);
/* kcu_ggemm_wg.cu (built for sm_90a where the build targets sm_90:
 * KCU_HAVE_WG): kcu__gg's large tiles over dense weights by wgmma, when
 * c->gg_wg (a compute capability 9.0 device); its kernels' limits. */
int kcu__gg_wg(kcu_ctx_t *c, int mode, void *out, const void *a, const kcu_gg_rows_t *rows, const kcu_gg_ptrs_t *w0,
               const kcu_gg_ptrs_t *w1, size_t row_bytes, int N, int K);
int kcu__gg_wg_init(kcu_ctx_t *c);
/* kcu_q4f_wg.cu (sm_90a, KCU_HAVE_WG): whether a 4-bit matmul runs by
 * wgmma, that matmul, and its kernels' limits. */
bool kcu__q4f_wg_takes(const kcu_ctx_t *c, const kern_weight_t *w, int n);
int kcu__q4f_wg(kcu_ctx_t *c, void *out, const kern_weight_t *w, const float *bias, const void *x, int n);
int kcu__q4f_wg_init(kcu_ctx_t *c);
size_t kcu__q4f_wg_scratch(const kcu_ctx_t *c, const kern_weight_t *w);

/* kcu_comm.cu: the tensor-parallel group (kern_ops_t comm_init / all_reduce). */
int kcu__comm_init(void *ctx, const kern_comm_t *comm);
int kcu__all_reduce(void *ctx, void *buf, size_t n);
int kcu__all_reduce_add_rms_norm(void *ctx, void *out, void *residual, void *part, const kern_weight_t *w, int n,
                                 int dim, float eps);
int kcu__gather_cols(void *ctx, void *out, const void *part, int n, int cols);
void kcu__comm_destroy(kcu_ctx_t *c);
/* kcu_car.cu: sets c->car up after NCCL joined (collective; leaves it NULL
 * when FERRUM_CUSTOM_AR=0 or the GPUs lack peer access); whether a call of
 * n elements goes to it; the call; the call fused with add_rms_norm (n
 * rows of dim: residual += the sum, out = its norm), when it fits the
 * buffer and the row kernel; teardown. */
int kcu__car_init(kcu_ctx_t *c);
bool kcu__car_fits(const kcu_ctx_t *c, size_t n);
int kcu__car_all_reduce(kcu_ctx_t *c, void *buf, size_t n);
bool kcu__car_norm_fits(const kcu_ctx_t *c, const void *out, const void *residual, const void *x, const float *w, int n,
                        int dim);
int kcu__car_add_rms_norm(kcu_ctx_t *c, void *out, void *residual, const void *x, const float *w, int n, int dim,
                          float eps);
void kcu__car_destroy(kcu_ctx_t *c, kcu_car_t *car);
