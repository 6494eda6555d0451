/* kcu_attn.cu - causal attention over the paged KV pool.
 *
 * Decode (every sequence has one query token): one CTA per (split, KV head,
 * sequence) serves the query heads that share the KV head (GQA), up to
 * KCU_DEC_GROUP of them (more: a CTA per KCU_DEC_GROUP); the context is
 * split along the sequence (flash-decoding) so that long contexts fill the
 * GPU; the last CTA of each (sequence, head group) to finish merges the
 * splits by their log-sum-exp. At batch 1 and a short context the kernel is
 * latency-bound, so its K/V loads start before the PDL wait and its merges
 * cost one barrier and one round of loads each.
 * The split count depends only on the step's shape (n_seqs, KV heads, block
 * table capacity), never on ctx_len, so a captured graph replays correctly
 * for any context length: each CTA finds its range from ctx_len on the
 * device. A cache with head_dim <= 128 and groups <= 8 runs on the tensor
 * cores instead (a quantized one where its bytes can come by TMA;
 * kcu_attn_decode_mma_k: the group's query
 * heads are the rows of an MMA tile, or a quantized pool's its columns
 * (the products transposed, kcu_dq_*), K/V staged in shared memory by the
 * tensor-memory accelerator's bulk copies through one tensor map of the
 * pool, or like the prefill kernel's where those do not apply): split the
 * same way while the (sequence, KV head) pairs are at most half the SMs,
 * unsplit past that, except where the prefetching SIMT kernel takes the
 * step in one wave unsplit.
 *
 * Prefill (the sequences of a step with more than one query token):
 * FlashAttention-2 style on the tensor cores (mma.sync) for head_dim up to
 * 128, one CTA per (query tile of 64 tokens, head, sequence), K/V tiles
 * staged in shared memory through the block table, online softmax, causal
 * by position; a SIMT kernel of the same shape for larger heads. Both read
 * cached prefix blocks the same way as new ones (chunked prefill, prefix
 * hits). A mixed step runs the decode kernel for its one-token sequences
 * and the prefill kernel for the others.
 *
 * A quantized cache (int8 / FP8 E4M3 bytes, an f16 scale per token and KV
 * head; template argument Q) is read as it is: the tensor-core decode
 * kernel copies the bytes and scales to shared memory and makes f16 MMA
 * fragments from them (kcu_dq_*); the SIMT decode kernel loads 8 bytes and
 * the row's scale where it loads 8 elements, and converts them in
 * registers; the prefill kernels convert each 8-element chunk after the
 * load and store it to the same T tile in shared memory that cp.async fills
 * for an unquantized cache (cp.async cannot convert), so their tensor-core
 * and SIMT loops are unchanged.
 */
#include <cudaTypedefs.h>
#include <math.h>
#include <string.h>

#include "common/fr_log.h"
#include "kernels/cuda/kcu_mma.cuh"

/* Decode geometry. */
#define KCU_DEC_WARPS 4      /* warps per CTA, each on its own tokens of the split, merged in shared memory */
#define KCU_DEC_NT (KCU_DEC_WARPS * KCU_WARP)
#define KCU_DEC_CTAS 4       /* CTAs per SM the kernel is built for (__launch_bounds__): at most 128 registers */
#define KCU_DEC_PIPE_CTAS 3  /* the same for the prefetching kernel, which needs more registers; measured on
                                H200, prefetching pays while the grid fits one wave of that many CTAs per SM,
                                so that is when it is launched */
#define KCU_DEC_SPLIT_CTAS 2 /* the split count aims at this many CTAs per SM (kcu_attn_splits) */
#define KCU_DEC_MMA_CTAS 2   /* the same for the tensor-core kernel where it splits (kcu_attn_msplits) */
#define KCU_DEC_UNROLL 4     /* tokens per lane whose K/V loads are in flight together */
/* KCU_DEC_MIN_CHUNK (kcu.cuh, FERRUM_CUDA_DEC_CHUNK), the fewest context
 * tokens per split: two passes of a CTA's warps (4 warps x 2 tokens x unroll
 * 4 at head_dim 128). Measured on H100, Llama-3-8B, batch 1 (model_bench):
 * 32 is 0.6% faster with a 128-token prompt, 64 is 1.1% faster with 1024. */

/* SIMT prefill geometry. */
#define KCU_PF_BM 64  /* queries per CTA (a query tile) */
#define KCU_PF_BN 32  /* K/V tokens per shared-memory tile: K and V tiles take 32 KiB at head_dim 256,
                         under the 48 KiB of static shared memory */
#define KCU_PF_TPQ 4  /* threads per query: each owns every 4th 8-element chunk of the head, so the 4
                         read 64 contiguous bytes */
#define KCU_PF_NT (KCU_PF_BM * KCU_PF_TPQ)

/* A block-table entry as a pool block: a bad entry reads block 0, so a
 * load stays inside the pool. */
__device__ __forceinline__ int kcu_kv_block(int blk, int n_blocks) {
  return (unsigned)blk < (unsigned)n_blocks ? blk : 0;
}

__device__ __forceinline__ const uint4 *kcu_kv_row(const void *plane, const int32_t *bt, int j, int bs, int n_blocks,
                                                   int row_elems, int head_off) {
  const int blk = kcu_kv_block(bt[j / bs], n_blocks);
  const __nv_bfloat16 *p = (const __nv_bfloat16 *)plane; /* 2-byte elements; type only for the arithmetic */
  return reinterpret_cast<const uint4 *>(p + ((size_t)blk * bs + j % bs) * row_elems + head_off);
}

/* Quantized cache: the 8 bytes at head_off of cache row j (through the
 * block table) and their row's scale (KV head kvh of n_kv), as
 * {bytes 0-3, bytes 4-7, scale as f32 bits, 0}: one register set that
 * kcu_kv_unpack turns into 8 floats. */
__device__ __forceinline__ uint4 kcu_kvq_row8(const void *plane, const uint16_t *sc, const int32_t *bt, int j, int bs,
                                              int n_blocks, int row_elems, int head_off, int n_kv, int kvh) {
  const size_t slot = (size_t)kcu_kv_block(bt[j / bs], n_blocks) * bs + j % bs;
  const uint2 b = *reinterpret_cast<const uint2 *>((const uint8_t *)plane + slot * row_elems + head_off);
  const float s = __half2float(__ushort_as_half(sc[slot * n_kv + kvh]));
  return make_uint4(b.x, b.y, __float_as_uint(s), 0u);
}

/* 8 elements of cache row j: 16 bytes of T, or (Q) 8 bytes and a scale. */
template <int Q>
__device__ __forceinline__ uint4 kcu_kv_fetch(const void *plane, const uint16_t *sc, const int32_t *bt, int j, int bs,
                                              int n_blocks, int row_elems, int head_off, int n_kv, int kvh) {
  if constexpr (Q == KCU_KVQ_NONE) return *kcu_kv_row(plane, bt, j, bs, n_blocks, row_elems, head_off);
  else return kcu_kvq_row8(plane, sc, bt, j, bs, n_blocks, row_elems, head_off, n_kv, kvh);
}

/* What kcu_kv_fetch loaded, as 8 floats. */
template <typename T, int Q> __device__ __forceinline__ void kcu_kv_unpack(uint4 r, float *f) {
  if constexpr (Q == KCU_KVQ_NONE) kcu_unpack8(r, f, (const T *)0);
  else kcu_kvq_unpack8<Q>(r.x, r.y, __uint_as_float(r.z), f);
}

/* What kcu_kv_fetch loaded, as 8 elements of T (a 16-byte chunk of a tile). */
template <typename T, int Q> __device__ __forceinline__ uint4 kcu_kv_to_t(uint4 r) {
  if constexpr (Q == KCU_KVQ_NONE) {
    return r;
  } else {
    float f[8];
    kcu_kvq_unpack8<Q>(r.x, r.y, __uint_as_float(r.z), f);
    return kcu_pack8<T>(f);
  }
}

/* Stages K/V rows [kb, kb + BN) of one KV head (head_off elements into a
 * row of row_elems) into sk and sv, (BN, HD) each, through the block table,
 * zeros past kv_end: NT threads, a 16-byte chunk of K and of V a step. The
 * prefill kernels share it; the caller synchronizes around it. */
template <typename T, int HD, int BN, int NT, int Q>
__device__ __forceinline__ void kcu_kv_tile_load(uint4 *sk, uint4 *sv, const void *kc, const void *vc,
                                                 const uint16_t *ksc, const uint16_t *vsc, const int32_t *bt, int kb,
                                                 int kv_end, int bs, int n_blocks, int n_kv, int kvh) {
  constexpr int CH = HD / 8; /* chunks a row */
  const int row_elems = n_kv * HD;
  for (int i = threadIdx.x; i < BN * CH; i += NT) {
    const int r = i / CH, ch = i % CH, j = kb + r;
    uint4 kz = make_uint4(0, 0, 0, 0), vz = kz;
    if (j < kv_end) {
      kz = kcu_kv_to_t<T, Q>(kcu_kv_fetch<Q>(kc, ksc, bt, j, bs, n_blocks, row_elems, kvh * HD + ch * 8, n_kv, kvh));
      vz = kcu_kv_to_t<T, Q>(kcu_kv_fetch<Q>(vc, vsc, bt, j, bs, n_blocks, row_elems, kvh * HD + ch * 8, n_kv, kvh));
    }
    sk[i] = kz;
    sv[i] = vz;
  }
}

/* ---- decode ---------------------------------------------------------------------------- */

/* Splits i0 .. i0 + N - 1 of the partials at base (this thread's E
 * elements of the O rows of G heads), 0 past n_used: all in flight. */
template <int HD, int E, int N>
__device__ __forceinline__ void kcu_merge_load(float (&v)[E][N], const float *base, int i0, int G, int n_used,
                                               int n_splits) {
#pragma unroll
  for (int k = 0; k < E; k++) {
    const int e = threadIdx.x + k * KCU_DEC_NT;
    const float *p = base + (size_t)(e / HD) * n_splits * (HD + 2) + e % HD;
#pragma unroll
    for (int i = 0; i < N; i++)
      v[k][i] = e < G * HD && i0 + i < n_used ? __ldcg(p + (size_t)(i0 + i) * (HD + 2)) : 0.f;
  }
}

/* num += those splits' O weighted by their heads' split weights wt. */
template <int HD, int E, int N>
__device__ __forceinline__ void kcu_merge_add(float (&num)[E], const float (&v)[E][N],
                                              const float (*wt)[KCU_MAX_SPLITS], int i0, int G, int n_used) {
#pragma unroll
  for (int k = 0; k < E; k++) {
    const int e = threadIdx.x + k * KCU_DEC_NT;
    if (e < G * HD)
#pragma unroll
      for (int i = 0; i < N; i++)
        if (i0 + i < n_used) num[k] += wt[e / HD][i0 + i] * v[k][i];
  }
}

/* Split-K merge without a second kernel: every CTA of (sequence, head
 * group) publishes its partials, then counts itself done; the last one to
 * finish merges its G heads (from h0) by their log-sum-exp and resets the
 * counter for the next step (graphs replay the same counters). The split
 * weights go through shared memory (a warp a head turns the log-sum-exps
 * into them); the first C splits' partials load beside them, so a short
 * context's merge waits for one round of loads, and the rest come R splits
 * a round with all of a thread's elements' loads in flight together. */
template <typename T, int HD, int GM>
__device__ void kcu_attn_merge_last(T *out, const float *part, int32_t *cnt, int t, int s, int h0, int G, int n_heads,
                                    int n_splits, int n_used) {
  constexpr int NT = KCU_DEC_NT, E = (GM * HD + NT - 1) / NT, C = E >= 16 ? 1 : 16 / E;
  __shared__ int last;
  __shared__ float wt[GM][KCU_MAX_SPLITS];
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(cnt, 1) == n_splits - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  const float *base = part + ((size_t)s * n_heads + (size_t)h0) * n_splits * (HD + 2);
  float pre[E][C];
  kcu_merge_load<HD, E, C>(pre, base, 0, G, n_used, n_splits);
  for (int e = threadIdx.x; e < G * n_used; e += NT)
    wt[e / n_used][e % n_used] = __ldcg(base + (size_t)(e / n_used * n_splits + e % n_used) * (HD + 2) + HD);
  __syncthreads();
  /* lse -> normalized weight: a warp a head, a lane two splits */
  static_assert(KCU_MAX_SPLITS <= 2 * KCU_WARP, "a lane weighs at most two splits");
  for (int g = threadIdx.x / KCU_WARP; g < G; g += NT / KCU_WARP) {
    const int i = threadIdx.x % KCU_WARP, i2 = i + KCU_WARP;
    const float a = i < n_used ? wt[g][i] : -INFINITY, b = i2 < n_used ? wt[g][i2] : -INFINITY;
    const float M = kcu_warp_max(fmaxf(a, b));
    const float ea = M == -INFINITY || a == -INFINITY ? 0.f : __expf(a - M);
    const float eb = M == -INFINITY || b == -INFINITY ? 0.f : __expf(b - M);
    const float den = kcu_warp_sum(ea + eb);
    if (i < n_used) wt[g][i] = den > 0.f ? ea / den : 0.f;
    if (i2 < n_used) wt[g][i2] = den > 0.f ? eb / den : 0.f;
  }
  __syncthreads();
  /* the rest of the splits' partials, R a round, every element's in flight together */
  constexpr int R = 4;
  float num[E] = {};
  kcu_merge_add<HD, E, C>(num, pre, wt, 0, G, n_used);
  for (int i0 = C; i0 < n_used; i0 += R) {
    float v[E][R];
    kcu_merge_load<HD, E, R>(v, base, i0, G, n_used, n_splits);
    kcu_merge_add<HD, E, R>(num, v, wt, i0, G, n_used);
  }
#pragma unroll
  for (int k = 0; k < E; k++) {
    const int e = threadIdx.x + k * NT, g = e / HD, d = e % HD;
    if (e < G * HD) out[(size_t)t * n_heads * HD + (size_t)(h0 + g) * HD + d] = kcu_t<T>(num[k]);
  }
  if (threadIdx.x == 0) *cnt = 0;
}

/* U cache rows' K and V (8 elements each, as kcu_kv_fetch loads them) into
 * the running softmax of the GM query heads whose 8 dimensions this lane
 * holds. The L lanes of a row sum its scores by shuffles (all of the warp's
 * lanes take part, valid or not); the U rows then rescale the state once,
 * so the dependent chain per head is one exp and one rescale a group. */
template <typename T, int GM, int L, int Q, int U>
__device__ __forceinline__ void kcu_dec_rows(const uint4 (&kr)[U], const uint4 (&vr)[U], const bool (&valid)[U], int G,
                                             const float (&qr)[GM][8], float (&acc)[GM][8], float (&m)[GM],
                                             float (&l)[GM]) {
  float sc[U][GM];
#pragma unroll
  for (int u = 0; u < U; u++) {
    float kf[8];
    kcu_kv_unpack<T, Q>(kr[u], kf);
#pragma unroll
    for (int g = 0; g < GM; g++) {
      float d = 0.f;
#pragma unroll
      for (int i = 0; i < 8; i++) d = fmaf(qr[g][i], kf[i], d);
      sc[u][g] = d;
    }
  }
#pragma unroll
  for (int o = L / 2; o > 0; o >>= 1)
#pragma unroll
    for (int u = 0; u < U; u++)
#pragma unroll
      for (int g = 0; g < GM; g++) sc[u][g] += __shfl_xor_sync(0xffffffffu, sc[u][g], o);
#pragma unroll
  for (int g = 0; g < GM; g++) { /* the new maximum; the state rescaled to it */
    if (g >= G) break;
    float mx = m[g];
#pragma unroll
    for (int u = 0; u < U; u++)
      if (valid[u]) mx = fmaxf(mx, sc[u][g]);
    const float corr = mx == -INFINITY ? 1.f : __expf(m[g] - mx);
    l[g] *= corr;
#pragma unroll
    for (int i = 0; i < 8; i++) acc[g][i] *= corr;
    m[g] = mx;
  }
#pragma unroll
  for (int u = 0; u < U; u++) {
    float vf[8];
    kcu_kv_unpack<T, Q>(vr[u], vf);
#pragma unroll
    for (int g = 0; g < GM; g++) {
      if (g >= G) break;
      const float p = valid[u] ? __expf(sc[u][g] - m[g]) : 0.f;
      l[g] += p;
#pragma unroll
      for (int i = 0; i < 8; i++) acc[g][i] = fmaf(p, vf[i], acc[g][i]);
    }
  }
}

/* The decode kernels' shared parts. A CTA of KCU_DEC_WARPS warps serves G
 * (<= GM) query heads from h0, all of KV head kvh, of sequence s over one
 * split of its context; lane `sub` of each L-lane row group holds 8
 * dimensions of the head, and the warp's TPW row groups (`slot`) take
 * different tokens. A KV head with more query heads than KCU_DEC_GROUP has
 * a CTA per KCU_DEC_GROUP of them (their state would not fit in
 * registers). */
template <typename T, int HD, int GM> struct kcu_dec_state {
  float qr[GM][8], acc[GM][8], m[GM], l[GM];
};

/* The split's context range [start, stop) and how many splits have any
 * (n_used): the query sits at cache index ctx_len - 1 and sees the whole
 * context, or its last `window` tokens; at least min_chunk tokens a split,
 * so short contexts use few of the splits and the merge reads only those,
 * and none past the first up to `whole` tokens (the split with them all
 * writes the output: no merge). */
struct kcu_dec_range {
  int start, stop, n_used;
};
__device__ __forceinline__ kcu_dec_range kcu_dec_split(int ctx_len, int cap, int window, int split, int n_splits,
                                                       int min_chunk, int whole = 0) {
  const int end = max(min(ctx_len, cap), 0), lo = window > 0 ? max(end - window, 0) : 0;
  int chunk = end - lo <= whole ? whole : max((end - lo + n_splits - 1) / n_splits, min_chunk);
  chunk = (chunk + 15) & ~15;
  const int start = lo + split * chunk;
  return {start, min(end, start + chunk), (end - lo + chunk - 1) / chunk};
}

/* The G query heads' 8 dimensions at `sub`, scaled; an empty softmax. */
template <typename T, int HD, int GM>
__device__ __forceinline__ void kcu_dec_begin(kcu_dec_state<T, HD, GM> &st, const T *qrow, int G, float scale,
                                              int sub) {
#pragma unroll
  for (int g = 0; g < GM; g++) {
    st.m[g] = -INFINITY;
    st.l[g] = 0.f;
#pragma unroll
    for (int i = 0; i < 8; i++) st.acc[g][i] = 0.f;
    if (g < G) {
      kcu_unpack8(*reinterpret_cast<const uint4 *>(qrow + (size_t)g * HD + sub * 8), st.qr[g], (const T *)0);
#pragma unroll
      for (int i = 0; i < 8; i++) st.qr[g][i] *= scale;
    } else {
#pragma unroll
      for (int i = 0; i < 8; i++) st.qr[g][i] = 0.f;
    }
  }
}

/* Merges the CTA's row groups (NW warps x TPW slots) through shared memory
 * behind one barrier, each thread on its own output dimensions, and writes
 * the split's result: the output rows when there is one split, else its
 * partials for kcu_attn_merge_last. Every thread calls it. */
template <typename T, int HD, int GM>
__device__ void kcu_dec_end(kcu_dec_state<T, HD, GM> &st, T *out, float *part, int32_t *cnt, int t, int s, int h0,
                            int n_heads, int G, int split, int n_splits, int n_used) {
  constexpr int L = HD / 8, TPW = KCU_WARP / L, NS = KCU_DEC_WARPS * TPW, NT = KCU_DEC_NT;
  __shared__ __align__(16) float sm_a[NS][GM][HD];
  __shared__ float sm_m[NS][GM], sm_l[NS][GM];
  const int lane = threadIdx.x % KCU_WARP, sub = lane % L, row = threadIdx.x / KCU_WARP * TPW + lane / L;
#pragma unroll
  for (int g = 0; g < GM; g++) {
    if (g >= G) break;
    float4 *a4 = reinterpret_cast<float4 *>(&sm_a[row][g][sub * 8]);
    a4[0] = make_float4(st.acc[g][0], st.acc[g][1], st.acc[g][2], st.acc[g][3]);
    a4[1] = make_float4(st.acc[g][4], st.acc[g][5], st.acc[g][6], st.acc[g][7]);
    if (sub == 0) {
      sm_m[row][g] = st.m[g];
      sm_l[row][g] = st.l[g];
    }
  }
  __syncthreads();
  const bool alone = n_used <= 1; /* one split has the context: its result is the output */
  if (alone ? split == 0 : split < n_used) {
    for (int e = threadIdx.x; e < G * HD; e += NT) {
      const int g = e / HD, d = e % HD;
      float mx = -INFINITY, den = 0.f, num = 0.f;
#pragma unroll
      for (int i = 0; i < NS; i++) mx = fmaxf(mx, sm_m[i][g]);
      if (mx != -INFINITY) {
#pragma unroll
        for (int i = 0; i < NS; i++) {
          const float w = __expf(sm_m[i][g] - mx);
          den = fmaf(w, sm_l[i][g], den);
          num = fmaf(w, sm_a[i][g][d], num);
        }
      }
      const float o = den > 0.f ? num / den : 0.f;
      const int h = h0 + g;
      if (alone) {
        out[(size_t)t * n_heads * HD + (size_t)h * HD + d] = kcu_t<T>(o);
      } else {
        float *p = part + (((size_t)s * n_heads + h) * n_splits + split) * (HD + 2);
        p[d] = o;
        if (d == 0) p[HD] = den > 0.f ? mx + __logf(den) : -INFINITY;
      }
    }
  }
  if (!alone) kcu_attn_merge_last<T, HD, GM>(out, part, cnt, t, s, h0, G, n_heads, n_splits, n_used);
}

/* Each lane loads its rows' K/V into registers, KCU_DEC_UNROLL rows at a
 * time. PIPE: prefetch the next rows while computing (more registers, so
 * fewer CTAs per SM: worth it only when the grid does not fill the GPU).
 * Any cache dtype.
 * Before the PDL wait a CTA reads the step's metadata (uploaded before the
 * step's first kernel) and its first rows of K/V except row ctx_len - 1:
 * the kernel before (rope + KV append, or the q/k/v GEMV with them in its
 * epilogue) writes q and that row and nothing else a one-token sequence
 * reads, and every earlier row was written by an earlier step. So at short contexts a split's whole K/V streams in while
 * that kernel drains. */
template <typename T, int HD, int GM, bool PIPE, int Q>
__global__ void __launch_bounds__(KCU_DEC_NT, PIPE ? KCU_DEC_PIPE_CTAS : KCU_DEC_CTAS)
    kcu_attn_decode_k(T *out, const T *q, int q_stride, const void *kc, const void *vc, const uint16_t *ksc,
                      const uint16_t *vsc, const int32_t *hdr,
                      const int32_t *q_start, const int32_t *ctx_len, const int32_t *bts, int bs, int n_blocks,
                      int n_kv, int G, float scale, int window, int min_chunk, float *part, int32_t *cnt) {
  constexpr int L = HD / 8, TPW = KCU_WARP / L, NW = KCU_DEC_WARPS;
  const int split = blockIdx.x, s = blockIdx.z, n_splits = gridDim.x;
  const int n_groups = gridDim.y / n_kv, kvh = blockIdx.y / n_groups, g0 = blockIdx.y % n_groups * GM;
  const int h0 = kvh * G + g0, n_heads = n_kv * G;
  const int warp = threadIdx.x / KCU_WARP, lane = threadIdx.x % KCU_WARP, sub = lane % L, slot = lane / L;
  const int max_blocks = hdr[2];
  const int t = q_start[s];
  const bool decode = q_start[s + 1] - t == 1;
  const int fresh = ctx_len[s] - 1; /* the row the kernel before appends */
  const kcu_dec_range r = kcu_dec_split(fresh + 1, max_blocks * bs, window, split, n_splits, min_chunk);
  const int start = r.start, stop = decode ? r.stop : start;
  const int row_elems = n_kv * HD, head_off = kvh * HD + sub * 8;
  const int32_t *bt = bts + (size_t)s * max_blocks;
  constexpr int U = KCU_DEC_UNROLL, STEP = NW * TPW * U;
  auto fetch = [&](int j, uint4 &kd, uint4 &vd) {
    kd = kcu_kv_fetch<Q>(kc, ksc, bt, j, bs, n_blocks, row_elems, head_off, n_kv, kvh);
    vd = kcu_kv_fetch<Q>(vc, vsc, bt, j, bs, n_blocks, row_elems, head_off, n_kv, kvh);
  };
  /* rows jj + u * NW * TPW + slot below `below` */
  auto load = [&](int jj, uint4 *kd, uint4 *vd, int below) {
#pragma unroll
    for (int u = 0; u < U; u++) {
      int j = jj + u * NW * TPW + slot;
      kd[u] = vd[u] = make_uint4(0, 0, 0, 0);
      if (j < below) fetch(j, kd[u], vd[u]);
    }
  };
  const int first = start + warp * TPW;
  uint4 kr[U], vr[U];
  load(first, kr, vr, min(stop, fresh));
  kcu_pdl_enter();
  if (!decode) return;
#pragma unroll
  for (int u = 0; u < U; u++)
    if (first + u * NW * TPW + slot == fresh && fresh < stop) fetch(fresh, kr[u], vr[u]);
  kcu_dec_state<T, HD, GM> st;
  const int gn = min(G - g0, GM); /* this CTA's heads */
  kcu_dec_begin(st, q + (size_t)t * q_stride + (size_t)h0 * HD, gn, scale, sub);
  for (int jj = first; jj < stop; jj += STEP) {
    uint4 kn[U], vn[U];
    if (PIPE) load(jj + STEP, kn, vn, stop);
    else if (jj != first) load(jj, kr, vr, stop);
    bool valid[U];
#pragma unroll
    for (int u = 0; u < U; u++) valid[u] = jj + u * NW * TPW + slot < stop;
    kcu_dec_rows<T, GM, L, Q, U>(kr, vr, valid, gn, st.qr, st.acc, st.m, st.l);
    if (PIPE) {
#pragma unroll
      for (int u = 0; u < U; u++) {
        kr[u] = kn[u];
        vr[u] = vn[u];
      }
    }
  }
  kcu_dec_end(st, out, part, cnt + (size_t)s * gridDim.y + blockIdx.y, t, s, h0, n_heads, gn, split, n_splits,
              r.n_used);
}

/* Splits of a decode step over `pairs` (sequence, KV head) pairs: about
 * `ctas` CTAs a SM, at least `chunk` tokens of the block table's capacity
 * each, at most KCU_MAX_SPLITS. The step's shape alone decides. */
static int kcu_attn_split_count(const kcu_ctx_t *c, long long pairs, long long capacity, int ctas, int chunk) {
  if (pairs <= 0) return 1;
  long long sp = ((long long)ctas * c->n_sm + pairs - 1) / pairs;
  sp = FR_MIN(sp, capacity / chunk);
  sp = FR_MIN(sp, (long long)KCU_MAX_SPLITS);
  return (int)FR_MAX(sp, 1ll);
}

/* The SIMT decode kernel's splits. */
static int kcu_attn_splits(const kcu_ctx_t *c, long long pairs, long long capacity) {
  return kcu_attn_split_count(c, pairs, capacity, KCU_DEC_SPLIT_CTAS, c->dec_chunk);
}

/* The tensor-core decode kernel's splits where it splits. */
static int kcu_attn_msplits(const kcu_ctx_t *c, long long pairs, long long capacity) {
  return kcu_attn_split_count(c, pairs, capacity, KCU_DEC_MMA_CTAS, c->dec_mchunk);
}

int kcu__attn_max_splits(const kcu_ctx_t *c, int n_seqs, int n_kv_heads, long long capacity) {
  const long long pairs = (long long)n_seqs * n_kv_heads;
  return FR_MAX(kcu_attn_splits(c, pairs, capacity), kcu_attn_msplits(c, pairs, capacity));
}

/* Room for the decode partials of n_heads heads in `splits` splits and a
 * merge counter per (sequence, head group) of the decode grid, n_groups a
 * sequence. Captured graphs hold the buffers' addresses: growing them drops
 * the graphs (they are captured again), and they grow at least twofold. */
int kcu__attn_reserve(kcu_ctx_t *c, int n_seqs, int n_groups, int n_heads, int head_dim, int splits) {
  if (splits <= 1) return 0;
  size_t floats = (size_t)n_seqs * n_heads * splits * (head_dim + 2), counters = (size_t)n_seqs * n_groups;
  if (floats <= c->attn_part_floats && counters <= c->attn_cnt_n) return 0;
  int rc = kcu__not_capturing(c, "growing the attention partials");
  if (rc) return rc;
  KCU_CHECK(cudaStreamSynchronize(c->stream));
  kcu__graphs_drop(c);
  if (floats > c->attn_part_floats) {
    floats = FR_MAX(floats, 2 * c->attn_part_floats);
    kcu__free(c->attn_part);
    c->attn_part = NULL;
    c->attn_part_floats = 0;
    if ((rc = kcu__alloc(c, floats * 4, (void **)&c->attn_part, "attention partials"))) return rc;
    c->attn_part_floats = floats;
  }
  if (counters > c->attn_cnt_n) {
    counters = FR_MAX(counters, 2 * c->attn_cnt_n);
    kcu__free(c->attn_cnt);
    c->attn_cnt = NULL;
    c->attn_cnt_n = 0;
    if ((rc = kcu__alloc(c, counters * 4, (void **)&c->attn_cnt, "attention split counters"))) return rc;
    KCU_CHECK(cudaMemsetAsync(c->attn_cnt, 0, counters * 4, c->stream));
    c->attn_cnt_n = counters;
  }
  return 0;
}

/* The K/V planes of one layer: elements (T, or bytes when quantized) and
 * the scales of a quantized pool (NULL otherwise). */
typedef struct {
  const void *kc, *vc;
  const uint16_t *ks, *vs;
  const kern_kv_pool_t *pool; /* the pool they are in, and the layer */
  int layer;
} kcu_kv_layer_t;

/* ---- prefill -------------------------------------------------------------------------------- */

/* KCU_PF_BM queries x KCU_PF_TPQ threads; thread `part` owns 8-element
 * chunks part, part + KCU_PF_TPQ, ... of the head. */
template <typename T, int HD, int Q>
__global__ void __launch_bounds__(KCU_PF_NT)
    kcu_attn_prefill_k(T *out, const T *q, int q_stride, const void *kc, const void *vc, const uint16_t *ksc,
                       const uint16_t *vsc, const int32_t *hdr,
                       const int32_t *q_start, const int32_t *ctx_len, const int32_t *bts, const int32_t *seq_map,
                       int bs, int n_blocks, int n_kv, int G, float scale, int window) {
  kcu_pdl_enter();
  constexpr int NC = HD / (8 * KCU_PF_TPQ); /* chunks of 8 per thread */
  __shared__ uint4 sk[KCU_PF_BN][HD / 8], sv[KCU_PF_BN][HD / 8];
  __shared__ int s_maxpos;
  const int s = seq_map ? seq_map[blockIdx.z] : blockIdx.z, h = blockIdx.y, kvh = h / G;
  const int q0 = q_start[s], qn = q_start[s + 1] - q0, tile = blockIdx.x * KCU_PF_BM;
  if (tile >= qn) return;
  const int max_blocks = hdr[2];
  const int ctx = max(min(ctx_len[s], max_blocks * bs), 0);
  const int qi = threadIdx.x / KCU_PF_TPQ, part = threadIdx.x % KCU_PF_TPQ;
  const bool active = tile + qi < qn;
  const int t = q0 + tile + qi;
  /* cache index of the query: the new tokens are the last qn of the context */
  const int pos = active ? ctx_len[s] - qn + tile + qi : -1;
  if (threadIdx.x == 0) s_maxpos = -1;
  __syncthreads();
  if (active && part == 0) atomicMax(&s_maxpos, pos);
  __syncthreads();
  const int kv_end = min(ctx, s_maxpos + 1);
  const int32_t *bt = bts + (size_t)s * max_blocks;

  float qr[NC][8], acc[NC][8], m = -INFINITY, l = 0.f;
#pragma unroll
  for (int c = 0; c < NC; c++) {
#pragma unroll
    for (int i = 0; i < 8; i++) acc[c][i] = qr[c][i] = 0.f;
    if (active) {
      kcu_unpack8(
          *reinterpret_cast<const uint4 *>(q + (size_t)t * q_stride + (size_t)h * HD + (part + KCU_PF_TPQ * c) * 8),
          qr[c], (const T *)0);
#pragma unroll
      for (int i = 0; i < 8; i++) qr[c][i] *= scale;
    }
  }
  /* with a window, the tile's first query sees nothing before kb0 */
  const int kb0 = window > 0 ? max(ctx_len[s] - qn + tile - window + 1, 0) / KCU_PF_BN * KCU_PF_BN : 0;
  for (int kb = kb0; kb < kv_end; kb += KCU_PF_BN) {
    __syncthreads();
    kcu_kv_tile_load<T, HD, KCU_PF_BN, KCU_PF_NT, Q>(&sk[0][0], &sv[0][0], kc, vc, ksc, vsc, bt, kb, kv_end, bs,
                                                     n_blocks, n_kv, kvh);
    __syncthreads();
    int nr = min(KCU_PF_BN, kv_end - kb);
    for (int r = 0; r < nr; r++) {
      float sc = 0.f;
#pragma unroll
      for (int c = 0; c < NC; c++) {
        float kf[8];
        kcu_unpack8(sk[r][part + KCU_PF_TPQ * c], kf, (const T *)0);
#pragma unroll
        for (int i = 0; i < 8; i++) sc = fmaf(qr[c][i], kf[i], sc);
      }
#pragma unroll
      for (int o = 1; o < KCU_PF_TPQ; o <<= 1) sc += __shfl_xor_sync(0xffffffffu, sc, o);
      if (kb + r <= pos && (window <= 0 || kb + r > pos - window)) {
        if (sc > m) {
          float corr = __expf(m - sc);
          l *= corr;
#pragma unroll
          for (int c = 0; c < NC; c++)
#pragma unroll
            for (int i = 0; i < 8; i++) acc[c][i] *= corr;
          m = sc;
        }
        float p = __expf(sc - m);
        l += p;
#pragma unroll
        for (int c = 0; c < NC; c++) {
          float vf[8];
          kcu_unpack8(sv[r][part + KCU_PF_TPQ * c], vf, (const T *)0);
#pragma unroll
          for (int i = 0; i < 8; i++) acc[c][i] = fmaf(p, vf[i], acc[c][i]);
        }
      }
    }
  }
  if (!active) return;
  float inv = l > 0.f ? 1.f / l : 0.f;
  const int n_heads = n_kv * G;
#pragma unroll
  for (int c = 0; c < NC; c++) {
    float o[8];
#pragma unroll
    for (int i = 0; i < 8; i++) o[i] = acc[c][i] * inv;
    *reinterpret_cast<uint4 *>(out + (size_t)t * n_heads * HD + (size_t)h * HD + (part + KCU_PF_TPQ * c) * 8) =
        kcu_pack8<T>(o);
  }
}

/* ---- prefill on tensor cores (mma.sync, FlashAttention-2 style) -----------------------------
 *
 * One CTA per (tile of 64 queries, head, sequence): 4 warps, 16 query rows
 * each. K/V tiles of 64 tokens come through the block table into shared
 * memory with cp.async, double-buffered (the next tile loads while this one
 * computes); rows are 16-byte chunks XOR-swizzled by row so that ldmatrix
 * reads them without bank conflicts. Per tile each warp computes
 * S = Q K^T (16 x 64) with m16n8k16 MMAs into registers, applies the causal
 * mask and the online softmax there (a row lives in the 4 lanes of a quad),
 * turns P into the A operand of P V without leaving registers, and keeps O
 * (16 x HD, f32) in registers across the whole context. */
#define KCU_FA_WARPS 4
#define KCU_FA_NT (KCU_FA_WARPS * KCU_WARP)
#define KCU_FA_BM (KCU_FA_WARPS * 16) /* queries per CTA */
#define KCU_FA_BN 64                  /* K/V tokens per tile */
#define KCU_FA_MAX_HD 128             /* larger heads take the SIMT kernel */
#define KCU_DQ_MAX_KV 16              /* a quantized pool with more KV heads decodes on the SIMT kernel */
/* CTAs a SM a quantized pool's decode kernel is built for (__launch_bounds__: at most 128 registers); 5 (96,
 * spilling) was 1-5% slower (H200, docs/bench/gpu.md, session 55) */
#define KCU_DQ_CTAS 4

template <int HD> struct kcu_fa_smem {
  enum { TILE = KCU_FA_BN * HD * 2, BYTES = KCU_FA_BM * HD * 2 + 2 * 2 * TILE }; /* Q, then K and V twice */
};

/* Byte offset of 16-byte chunk ch of row r in a swizzled (rows, HD) tile. */
template <int HD> __device__ __forceinline__ uint32_t kcu_fa_off(int r, int ch) {
  return (uint32_t)(r * (HD * 2) + ((ch ^ (r & 7)) << 4));
}

/* The same for a decode K/V tile as the tensor-memory accelerator writes it
 * (TM; 128-byte swizzle): HD / 64 column blocks of BN rows x 128 bytes, in
 * each the 16-byte chunk c of row r at (c ^ (r & 7)), the hardware's
 * pattern for a box at a 1024-byte-aligned address. */
template <int HD, bool TM> __device__ __forceinline__ uint32_t kcu_fa_offl(int r, int ch) {
  if constexpr (TM) return (uint32_t)((ch >> 3) * (KCU_FA_BN * 128) + r * 128 + (((ch & 7) ^ (r & 7)) << 4));
  else return kcu_fa_off<HD>(r, ch);
}

/* Issues the cp.async loads of K/V rows [kb, kb + BN) of one KV head into
 * the swizzled tiles at sk / sv (shared addresses); zeros past kv_end. A
 * quantized cache (Q) is loaded to registers, converted to T and stored
 * instead (at the same swizzled offsets), which the caller's barrier
 * orders like the cp.async groups. */
template <typename T, int HD, int Q>
__device__ __forceinline__ void kcu_fa_load_kv(uint32_t sk, uint32_t sv, const void *kc, const void *vc,
                                               const uint16_t *ksc, const uint16_t *vsc, const int32_t *bt, int kb,
                                               int kv_end, int bs, int n_blocks, int n_kv, int kvh) {
  constexpr int CH = HD / 8;
  const int row_elems = n_kv * HD, head_off = kvh * HD;
  if constexpr (Q != KCU_KVQ_NONE) {
    for (int i = threadIdx.x; i < KCU_FA_BN * CH; i += KCU_FA_NT) {
      const int r = i / CH, ch = i % CH, j = kb + r;
      uint4 kz = make_uint4(0, 0, 0, 0), vz = kz;
      if (j < kv_end) {
        kz = kcu_kv_to_t<T, Q>(kcu_kvq_row8(kc, ksc, bt, j, bs, n_blocks, row_elems, head_off + ch * 8, n_kv, kvh));
        vz = kcu_kv_to_t<T, Q>(kcu_kvq_row8(vc, vsc, bt, j, bs, n_blocks, row_elems, head_off + ch * 8, n_kv, kvh));
      }
      kcu_st_shared16(sk + kcu_fa_off<HD>(r, ch), kz);
      kcu_st_shared16(sv + kcu_fa_off<HD>(r, ch), vz);
    }
  } else {
    /* A thread keeps its chunk column and takes every RS-th row: one
     * division for the tile, then the block and the row in it advance by
     * adding, and K and V share each row's offset (a division and a table
     * read per chunk and plane were most of the decode kernel's
     * instructions). Rows past kv_end copy nothing, from pool block 0. */
    static_assert(KCU_FA_NT % CH == 0, "a thread's chunk column is fixed");
    constexpr int RS = KCU_FA_NT / CH;
    const int ch = threadIdx.x % CH, r0 = threadIdx.x / CH;
    const __nv_bfloat16 *kp = (const __nv_bfloat16 *)kc, *vp = (const __nv_bfloat16 *)vc; /* 2-byte elements */
    int j = kb + r0, bi = j / bs, off = j - bi * bs;
#pragma unroll
    for (int r = r0; r < KCU_FA_BN; r += RS, j += RS) {
      const bool ok = j < kv_end;
      const int blk = kcu_kv_block(ok ? bt[bi] : 0, n_blocks);
      const size_t e = ((size_t)blk * bs + off) * row_elems + head_off + ch * 8;
      kcu_cp_async16(sk + kcu_fa_off<HD>(r, ch), kp + e, ok);
      kcu_cp_async16(sv + kcu_fa_off<HD>(r, ch), vp + e, ok);
      for (off += RS; off >= bs; off -= bs) bi++;
    }
  }
}

/* A quantized cache's K/V rows [kb, kb + BN) of one KV head as the
 * thread fetches them (kcu_kvq_row8: bytes and the row's scale; zeros past
 * kv_end), held in registers while the CTA works on the other tile, then
 * converted and stored by kcu_fa_kvq_store. kcu_fa_load_kv's form for such
 * a cache waits on its loads before the tile's work (session 54, H200: a
 * 2048-token FP8 prefill on an fp8 pool 1-2% faster this way; the pool's
 * prefill stays about 16% slower than bf16's, in the conversions). */
template <int HD> struct kcu_fa_kvq_t {
  enum { N = (KCU_FA_BN * (HD / 8) + KCU_FA_NT - 1) / KCU_FA_NT };
  uint4 k[N], v[N];
};

template <int HD, int Q>
__device__ __forceinline__ void kcu_fa_kvq_fetch(kcu_fa_kvq_t<HD> &t, const void *kc, const void *vc,
                                                 const uint16_t *ksc, const uint16_t *vsc, const int32_t *bt, int kb,
                                                 int kv_end, int bs, int n_blocks, int n_kv, int kvh) {
  constexpr int CH = HD / 8;
  const int row_elems = n_kv * HD;
#pragma unroll
  for (int u = 0; u < kcu_fa_kvq_t<HD>::N; u++) {
    const int i = threadIdx.x + u * KCU_FA_NT, j = kb + i / CH, off = kvh * HD + i % CH * 8;
    t.k[u] = t.v[u] = make_uint4(0, 0, 0, 0); /* zero bytes and scale: zeros */
    if (i < KCU_FA_BN * CH && j < kv_end) {
      t.k[u] = kcu_kvq_row8(kc, ksc, bt, j, bs, n_blocks, row_elems, off, n_kv, kvh);
      t.v[u] = kcu_kvq_row8(vc, vsc, bt, j, bs, n_blocks, row_elems, off, n_kv, kvh);
    }
  }
}

template <typename T, int HD, int Q>
__device__ __forceinline__ void kcu_fa_kvq_store(uint32_t sk, uint32_t sv, const kcu_fa_kvq_t<HD> &t) {
  constexpr int CH = HD / 8;
#pragma unroll
  for (int u = 0; u < kcu_fa_kvq_t<HD>::N; u++) {
    const int i = threadIdx.x + u * KCU_FA_NT;
    if (i >= KCU_FA_BN * CH) break;
    kcu_st_shared16(sk + kcu_fa_off<HD>(i / CH, i % CH), kcu_kv_to_t<T, Q>(t.k[u]));
    kcu_st_shared16(sv + kcu_fa_off<HD>(i / CH, i % CH), kcu_kv_to_t<T, Q>(t.v[u]));
  }
}

/* S (16 x BN, BN / 8 n-tiles of 4) = Q K^T for the warp's rows, keys k0..
 * k0 + BN of the tile (its layout: kcu_fa_offl). */
template <typename T, int HD, int BN, bool TM = false>
__device__ __forceinline__ void kcu_fa_qk(float (*sc)[4], const uint32_t (*qf)[4], uint32_t sk, int k0, int lane) {
#pragma unroll
  for (int n = 0; n < BN / 8; n++) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.f;
#pragma unroll
  for (int np = 0; np < BN / 16; np++) {
    const int key = k0 + np * 16 + (lane & 7) + ((lane >> 4) << 3);
#pragma unroll
    for (int k = 0; k < HD / 16; k++) {
      uint32_t b[4];
      kcu_ldsm4(b, sk + kcu_fa_offl<HD, TM>(key, 2 * k + ((lane >> 3) & 1)));
      kcu_mma16816<T>(sc[2 * np], qf[k], b);
      kcu_mma16816<T>(sc[2 * np + 1], qf[k], b + 2);
    }
  }
}

/* O (16 x HD, HD/8 n-tiles of 4) += P V, P from the score registers (keys
 * k0..k0 + BN of the tile). */
template <typename T, int HD, int BN, bool TM = false>
__device__ __forceinline__ void kcu_fa_pv(float (*o)[4], const float (*p)[4], uint32_t sv, int k0, int lane) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; kk++) {
    uint32_t a[4] = {kcu_pack2<T>(p[2 * kk][0], p[2 * kk][1]), kcu_pack2<T>(p[2 * kk][2], p[2 * kk][3]),
                     kcu_pack2<T>(p[2 * kk + 1][0], p[2 * kk + 1][1]), kcu_pack2<T>(p[2 * kk + 1][2], p[2 * kk + 1][3])};
    const int key = k0 + kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
#pragma unroll
    for (int dp = 0; dp < HD / 16; dp++) {
      uint32_t b[4];
      kcu_ldsm4_t(b, sv + kcu_fa_offl<HD, TM>(key, 2 * dp + (lane >> 4)));
      kcu_mma16816<T>(o[2 * dp], a, b);
      kcu_mma16816<T>(o[2 * dp + 1], a, b + 2);
    }
  }
}

/* The causal mask and the online softmax of BN keys: rows g and g + 8 of
 * the warp see keys qlo[r]..qpos[r] (their window; qpos: their cache
 * indices), keys kb + column. Rescales o and l by the change of the running
 * max; leaves P (unnormalized) in sc. R = 1: only row g is real (the
 * decode kernel's query heads fill at most 8 rows), so row g + 8 gets
 * P = 0 and no softmax or rescaling. */
template <int HD, int BN, int R = 2>
__device__ __forceinline__ void kcu_fa_softmax(float (*sc)[4], float (*o)[4], float *m, float *l, int kb, int kv_end,
                                               const int *qpos, const int *qlo, float scale_log2, bool mask,
                                               int lane) {
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < BN / 8; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int r = e >> 1, j = kb + n * 8 + 2 * (lane & 3) + (e & 1);
      if (r >= R) {
        sc[n][e] = 0.f;
        continue;
      }
      float v = sc[n][e] * scale_log2;
      if (mask && (j > qpos[r] || j < qlo[r] || j >= kv_end)) v = -INFINITY;
      sc[n][e] = v;
      mx[r] = fmaxf(mx[r], v);
    }
#pragma unroll
  for (int r = 0; r < R; r++) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    const float mn = fmaxf(m[r], mx[r]);
    const float base = mn == -INFINITY ? 0.f : mn;
    const float corr = exp2f(m[r] - base);
    m[r] = mn;
    l[r] *= corr;
#pragma unroll
    for (int d = 0; d < HD / 8; d++) o[d][2 * r] *= corr, o[d][2 * r + 1] *= corr;
#pragma unroll
    for (int n = 0; n < BN / 8; n++) {
      sc[n][2 * r] = exp2f(sc[n][2 * r] - base);
      sc[n][2 * r + 1] = exp2f(sc[n][2 * r + 1] - base);
      l[r] += sc[n][2 * r] + sc[n][2 * r + 1];
    }
  }
}

template <typename T, int HD, int Q>
__global__ void __launch_bounds__(KCU_FA_NT)
    kcu_attn_prefill_mma_k(T *out, const T *q, int q_stride, const void *kc, const void *vc, const uint16_t *ksc,
                           const uint16_t *vsc, const int32_t *hdr,
                           const int32_t *q_start, const int32_t *ctx_len, const int32_t *bts,
                           const int32_t *seq_map, int bs, int n_blocks, int n_kv, int G, int gp, float scale,
                           int window) {
  kcu_pdl_enter();
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sq = (uint32_t)__cvta_generic_to_shared(smem);
  const uint32_t skv = sq + KCU_FA_BM * HD * 2; /* buffer b: K at skv + 2b TILE, V after it */
  constexpr uint32_t TILE = kcu_fa_smem<HD>::TILE;
  const int warp = threadIdx.x / KCU_WARP, lane = threadIdx.x % KCU_WARP;
  /* heads (gp of a group a CTA) on x so that the block scheduler, which
   * hands out x fastest in practice (not a promise), starts every head's
   * last (heaviest) query tile before any lighter one. Row R of the
   * sequence's qn x gp is query R / gp of head h0 + R % gp. */
  const int s = seq_map ? seq_map[blockIdx.z] : blockIdx.z, h0 = blockIdx.x * gp, kvh = h0 / G;
  const int q0 = q_start[s], qn = q_start[s + 1] - q0, rows = qn * gp;
  const int tile = (gridDim.y - 1 - blockIdx.y) * KCU_FA_BM;
  if (tile >= rows) return;
  const int max_blocks = hdr[2];
  const int ctx = max(min(ctx_len[s], max_blocks * bs), 0);
  const int32_t *bt = bts + (size_t)s * max_blocks;
  /* the last query of the tile sees the most keys; with a window the first
   * sees nothing before kb0 */
  const int kv_end = min(ctx, ctx - qn + (min(tile + KCU_FA_BM, rows) - 1) / gp + 1);
  const int kb0 = window > 0 ? max(ctx - qn + tile / gp - window + 1, 0) / KCU_FA_BN * KCU_FA_BN : 0;

  /* Q tile (zeros past the sequence), then the first K/V tile */
  for (int i = threadIdx.x; i < KCU_FA_BM * (HD / 8); i += KCU_FA_NT) {
    const int r = i / (HD / 8), ch = i % (HD / 8), R = tile + r;
    const bool ok = R < rows;
    const T *src = q + (size_t)(q0 + (ok ? R / gp : 0)) * q_stride + (size_t)(h0 + (ok ? R % gp : 0)) * HD + ch * 8;
    kcu_cp_async16(sq + kcu_fa_off<HD>(r, ch), src, ok);
  }
  if (kb0 < kv_end)
    kcu_fa_load_kv<T, HD, Q>(skv, skv + TILE, kc, vc, ksc, vsc, bt, kb0, kv_end, bs, n_blocks, n_kv, kvh);
  kcu_cp_commit();

  const int g = lane >> 2, row0 = warp * 16;
  /* cache indices of the lane's two rows: the new tokens are the last qn of the context */
  const int qpos[2] = {ctx - qn + (tile + row0 + g) / gp, ctx - qn + (tile + row0 + g + 8) / gp};
  const int qlo[2] = {window > 0 ? qpos[0] - window + 1 : 0, window > 0 ? qpos[1] - window + 1 : 0};
  const int qpos_min = ctx - qn + tile / gp; /* the CTA's first query */
  const float scale_log2 = scale * 1.4426950408889634f;
  float o[HD / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
#pragma unroll
  for (int d = 0; d < HD / 8; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
  uint32_t qf[HD / 16][4];

  for (int kb = kb0, b = 0; kb < kv_end; kb += KCU_FA_BN, b ^= 1) {
    const bool more = kb + KCU_FA_BN < kv_end;
    [[maybe_unused]] kcu_fa_kvq_t<HD> next; /* a quantized cache's next tile, stored after this one's work */
    if constexpr (Q != KCU_KVQ_NONE) {
      if (more) kcu_fa_kvq_fetch<HD, Q>(next, kc, vc, ksc, vsc, bt, kb + KCU_FA_BN, kv_end, bs, n_blocks, n_kv, kvh);
    } else if (more) { /* the next tile into the other buffer */
      kcu_fa_load_kv<T, HD, Q>(skv + 2 * (b ^ 1) * TILE, skv + (2 * (b ^ 1) + 1) * TILE, kc, vc, ksc, vsc, bt,
                               kb + KCU_FA_BN, kv_end, bs, n_blocks, n_kv, kvh);
    }
    kcu_cp_commit();
    kcu_cp_wait<1>();
    __syncthreads();
    if (kb == kb0)
#pragma unroll
      for (int k = 0; k < HD / 16; k++)
        kcu_ldsm4(qf[k], sq + kcu_fa_off<HD>(row0 + (lane & 15), 2 * k + (lane >> 4)));
    float sc[KCU_FA_BN / 8][4];
    kcu_fa_qk<T, HD, KCU_FA_BN>(sc, qf, skv + 2 * b * TILE, 0, lane);
    const bool mask = window > 0 || kb + KCU_FA_BN > qpos_min + 1 || kb + KCU_FA_BN > kv_end;
    kcu_fa_softmax<HD, KCU_FA_BN>(sc, o, m, l, kb, kv_end, qpos, qlo, scale_log2, mask, lane);
    kcu_fa_pv<T, HD, KCU_FA_BN>(o, sc, skv + (2 * b + 1) * TILE, 0, lane);
    if constexpr (Q != KCU_KVQ_NONE) /* the other buffer's last reader was the previous tile, before its barrier */
      if (more) kcu_fa_kvq_store<T, HD, Q>(skv + 2 * (b ^ 1) * TILE, skv + (2 * (b ^ 1) + 1) * TILE, next);
    __syncthreads(); /* the buffer is loaded again two tiles on */
  }
  const int n_heads = n_kv * G;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const int R = tile + row0 + g + 8 * r;
    if (R >= rows) continue;
    const float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
    T *dst = out + (size_t)(q0 + R / gp) * n_heads * HD + (size_t)(h0 + R % gp) * HD + 2 * (lane & 3);
#pragma unroll
    for (int d = 0; d < HD / 8; d++)
      *reinterpret_cast<uint32_t *>(dst + d * 8) = kcu_pack2<T>(o[d][2 * r] * inv, o[d][2 * r + 1] * inv);
  }
}

/* ---- decode on the tensor cores ------------------------------------------------------ */

/* A cache of head_dim up to 128 (quantized: KQ below), groups of up to 8
 * query heads (kcu_decode_launch): one CTA per (split, KV head, sequence), unsplit
 * past half the SMs' worth of pairs, puts the group's query heads in the 16
 * rows of an m16n8k16 tile (zeros below G), stages the context through
 * 64-token K/V tiles, and gives each warp 16 tokens of every tile: S = QK^T,
 * the online softmax and PV stay in its registers (kcu_fa_qk, _softmax,
 * _pv). The four warps' states merge through shared memory at the end. The
 * SIMT kernel spends a shuffle reduction and a softmax update per row and
 * head, and waits on its loads; this one does the scores of 16 tokens in
 * a few MMAs while the next tile is in flight.
 * ST > 0 (head_dim 64 or 128, blocks of a multiple of 16 tokens): the
 * tiles come in ST stages by the tensor-memory accelerator instead of
 * cp.async (TM below), a bulk copy a (16-token group, 64-column half) of K
 * and of V that lane g of warp 0 issues, counted on the stage's mbarrier.
 * The cp.async loader's address arithmetic (a block-table read, a product
 * and two copies a row and chunk column) was most of the kernel's
 * instructions; the bulk copies take a few a group. A tile then starts at
 * a multiple of 16 tokens; rows outside the range are masked in the scores
 * and zeroed in V (a stale row of a reused block may hold anything, and
 * 0 * NaN is NaN). */
template <int HD, int ST, int KQ = KCU_KVQ_NONE> struct kcu_dm_smem {
  enum {
    Q = KQ ? 0 : 16 * HD * 2, /* the query tile (KQ: the threads load it), then (ST) the stages' mbarriers in a
                                 1 KiB slot */
    BAR = ST ? 1024 : 0,      /* so that the tiles after it stay 1 KiB-aligned */
    TILE = KCU_FA_BN * HD * (KQ ? 1 : 2),
    SCALES = KQ ? KCU_FA_BN * KCU_DQ_MAX_KV * 2 : 0, /* KQ: a tile's rows' f16 scales of every KV head */
    STAGE = 2 * TILE + 2 * SCALES,                   /* K, V, K's scales, V's */
    BYTES = Q + BAR + (ST ? ST : 2) * STAGE + BAR    /* ST: 1 KiB to align the base */
  };
};

/* Which of a tile's 16-token groups kcu_dm_tma_tile copies: all; those
 * wholly before `fresh` (rows earlier steps wrote, copied before the PDL
 * wait), counting the whole tile's bytes on its barrier; the rest. */
enum { KCU_DM_ALL, KCU_DM_OLD, KCU_DM_NEW };

/* Warp 0 of the TM decode kernel: the bulk copies of tile rows [kb, kb +
 * BN) of KV head kvh (K at `plane` of the pool's tensor map, V at the next)
 * into the stage at sk (kcu_dm_smem: K, V, then KQ's scales), counted on
 * bar. Lane g takes rows kb + 16 g .. + 15, where they meet [start, stop):
 * one copy a 64-column half of K and of V; KQ: one copy of the group's
 * bytes of K and of V (HD bytes a row) and one of its rows' scales of every
 * KV head in each of ks and vs (16 x n_kv f16, contiguous in the pool).
 * Rows outside are not loaded (their scores are masked, their V rows
 * zeroed). The block table row bt's first KCU_WARP entries are in bt_lane
 * (lane l holds entry l). part: KCU_DM_ALL, or the groups before / from row
 * `fresh`. */
template <int HD, int KQ>
__device__ __forceinline__ void kcu_dm_tma_tile(uint32_t sk, uint32_t bar, const CUtensorMap *tm, int plane,
                                                const uint16_t *ks, const uint16_t *vs, const int32_t *bt,
                                                int bt_lane, int kb, int start, int stop, int bs, int n_blocks,
                                                int n_kv, int kvh, int lane, int part = KCU_DM_ALL, int fresh = 0) {
  using SM = kcu_dm_smem<HD, 2, KQ>;
  constexpr int HALVES = KQ ? 1 : HD / 64, BOX = KQ ? 16 * HD : 16 * 128; /* bytes of a group's box */
  const int j = kb + 16 * lane, scale_bytes = KQ ? 16 * n_kv * 2 : 0;
  const bool live = lane < KCU_FA_BN / 16 && j < stop && j + 16 > start;
  const unsigned m = __ballot_sync(0xffffffffu, live);
  if (part != KCU_DM_NEW && lane == 0)
    kcu_mbar_expect(bar, (uint32_t)(__popc(m) * 2 * (HALVES * BOX + scale_bytes)));
  __syncwarp();
  const bool old = j + 16 <= fresh;
  const int bi = j / bs, held = __shfl_sync(0xffffffffu, bt_lane, bi % KCU_WARP);
  if (!live || (part == KCU_DM_OLD && !old) || (part == KCU_DM_NEW && old)) return;
  const int row = kcu_kv_block(bi < KCU_WARP ? held : bt[bi], n_blocks) * bs + (j - bi * bs);
  kcu_fence_proxy_async(); /* V rows zeroed a round of stages ago, before the copies overwrite them */
  const uint32_t sv = sk + SM::TILE;
#pragma unroll
  for (int h = 0; h < HALVES; h++) {
    const uint32_t off = (uint32_t)(h * (KCU_FA_BN * 128) + lane * BOX);
    kcu_tma_load4(sk + off, tm, bar, h * 64, kvh, row, plane);
    kcu_tma_load4(sv + off, tm, bar, h * 64, kvh, row, plane + 1);
  }
  if constexpr (KQ != KCU_KVQ_NONE) {
    const uint32_t ssk = sv + SM::TILE, off = (uint32_t)(lane * scale_bytes);
    kcu_bulk_load(ssk + off, ks + (size_t)row * n_kv, scale_bytes, bar);
    kcu_bulk_load(ssk + SM::SCALES + off, vs + (size_t)row * n_kv, scale_bytes, bar);
  }
}

/* Zeroes the V rows of the stage at sk (TM layout; KQ: the rows' bytes and
 * their scales) whose cache index kb + r is outside [start, stop). */
template <int HD, int KQ>
__device__ __forceinline__ void kcu_dm_zero_v(uint32_t sk, int kb, int start, int stop, int n_kv, int kvh) {
  using SM = kcu_dm_smem<HD, 2, KQ>;
  constexpr int CH = SM::TILE / KCU_FA_BN / 16; /* 16-byte chunks a row */
  const uint32_t sv = sk + SM::TILE;
  for (int i = threadIdx.x; i < KCU_FA_BN * CH; i += KCU_FA_NT) {
    const int r = i / CH, j = kb + r;
    if (j >= start && j < stop) continue;
    if constexpr (KQ != KCU_KVQ_NONE) { /* a row's chunks, wherever the swizzle put them */
      kcu_st_shared16(sv + r * HD + (i % CH) * 16, make_uint4(0, 0, 0, 0));
      if (i % CH == 0)
        asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(sv + SM::TILE + SM::SCALES + 2 * (r * n_kv + kvh)),
                     "h"((unsigned short)0)
                     : "memory");
    } else {
      kcu_st_shared16(sv + kcu_fa_offl<HD, true>(r, i % CH), make_uint4(0, 0, 0, 0));
    }
  }
  kcu_fence_proxy_async();
}

/* A quantized pool's tiles (KQ: int8 or FP8 E4M3 bytes, an f16 scale a
 * token and KV head) in the TM kernel: the bytes come by the tensor-memory
 * accelerator as bf16's do, half of them, and stay bytes in shared memory;
 * the threads make the MMA fragments from them, f16 (both kinds convert
 * exactly), and no element is scaled: K's scale multiplies a score, V's
 * P's. The products run transposed (S^T = K Q^T, O^T = V^T P^T): the
 * keys and the head's dimensions are the MMA's 16 rows, the group's query
 * heads its 8 columns, so no MMA row is padding (the group is at most 8
 * heads; as Q's rows, 8 of 16 rows were zero and each product took twice
 * the MMAs and accumulators). Each lane reads 8 contiguous bytes of a row
 * instead of an ldmatrix, which takes the head's dimensions in an order of
 * their own, the same on both sides of each product:
 * - K Q^T: k-step s of the 32-dimension chunk ch holds, in quad lane c's
 *   registers, dimensions 32 ch + 8 c + 4 s + {0, 1} and + {2, 3};
 * - V^T P^T: row g of m-tile 4 h + q is dimension 64 h + 8 g + 2 q, row
 *   g + 8 the next one, so one 8-byte load of a V row serves a lane's rows
 *   in the half's 4 m-tiles (kcu_dm_end puts O's rows back).
 * Byte b of tile row r, as the copies' swizzle (128 bytes at HD 128, 64 at
 * HD 64; a 16-byte chunk moves within its row) puts it: */
template <int HD> __device__ __forceinline__ uint32_t kcu_dq_off(int r, int b) {
  static_assert(HD == 64 || HD == 128, "rows of 64 or 128 bytes");
  const uint32_t o = (uint32_t)(r * HD + b);
  return o ^ (((o >> 7) & (HD == 128 ? 7u : 3u)) << 4);
}

/* The stored bytes 0 and 1 of x (0 the lower) as an f16 pair. */
template <int KQ> __device__ __forceinline__ uint32_t kcu_dq_h2(uint32_t x) {
  if constexpr (KQ == KCU_KVQ_FP8) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(x & 0xffffu), __NV_E4M3);
    return (uint32_t)h.x | ((uint32_t)h.y << 16);
  } else { /* 0x64 above b ^ 0x80 is the f16 1024 + (b + 128); less 1152 (0x6480) it is b */
    const uint32_t t = __byte_perm(x ^ 0x8080u, 0x64646464u, 0x4140);
    const __half2 h = __hsub2(*reinterpret_cast<const __half2 *>(&t), __half2half2(__ushort_as_half(0x6480)));
    return *reinterpret_cast<const uint32_t *>(&h);
  }
}

/* The 8 x 8 matrix of 16-bit pairs whose row lane / 4, columns 2 (lane % 4)
 * + {0, 1} the lane holds in x, transposed: the lane gets the same place of
 * the transpose. */
__device__ __forceinline__ uint32_t kcu_movmatrix_t(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

/* Query head g's B fragments of K Q^T (qrow; NULL: zeros) times mul:
 * qf[2 ch + s] = {dims 32 ch + 8 c + 4 s + {0, 1}, + {2, 3}}. */
template <typename T, int HD>
__device__ __forceinline__ void kcu_dq_qfrag(uint32_t (*qf)[2], const T *qrow, float mul, int lane) {
#pragma unroll
  for (int ch = 0; ch < HD / 32; ch++) {
    float f[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (qrow) kcu_unpack8(*reinterpret_cast<const uint4 *>(qrow + 32 * ch + 8 * (lane & 3)), f, (const T *)0);
#pragma unroll
    for (int s = 0; s < 2; s++) {
      qf[2 * ch + s][0] = kcu_pack2<__half>(f[4 * s] * mul, f[4 * s + 1] * mul);
      qf[2 * ch + s][1] = kcu_pack2<__half>(f[4 * s + 2] * mul, f[4 * s + 3] * mul);
    }
  }
}

/* S^T (16 keys x 8 heads) = K Q^T over keys k0 .. k0 + 16 of the byte tile
 * sk: sc = {key g: heads 2 c, 2 c + 1; key g + 8: the same}. */
template <int HD, int KQ>
__device__ __forceinline__ void kcu_dq_qk(float *sc, const uint32_t (*qf)[2], uint32_t sk, int k0, int lane) {
  const int r = k0 + (lane >> 2), b = 8 * (lane & 3);
  sc[0] = sc[1] = sc[2] = sc[3] = 0.f;
#pragma unroll
  for (int ch = 0; ch < HD / 32; ch++) {
    const uint2 w = kcu_ld_shared8(sk + kcu_dq_off<HD>(r, 32 * ch + b)),
                w8 = kcu_ld_shared8(sk + kcu_dq_off<HD>(r + 8, 32 * ch + b));
    const uint32_t a0[4] = {kcu_dq_h2<KQ>(w.x), kcu_dq_h2<KQ>(w8.x), kcu_dq_h2<KQ>(w.x >> 16),
                            kcu_dq_h2<KQ>(w8.x >> 16)};
    const uint32_t a1[4] = {kcu_dq_h2<KQ>(w.y), kcu_dq_h2<KQ>(w8.y), kcu_dq_h2<KQ>(w.y >> 16),
                            kcu_dq_h2<KQ>(w8.y >> 16)};
    kcu_mma16816<__half>(sc, a0, qf[2 * ch]);
    kcu_mma16816<__half>(sc, a1, qf[2 * ch + 1]);
  }
}

/* The scales (ss: a tile's rows of n_kv f16) of KV head kvh at the keys
 * whose scores a lane holds: k0 + g and k0 + g + 8. */
__device__ __forceinline__ void kcu_dq_scales(float *f, uint32_t ss, int k0, int n_kv, int kvh, int lane) {
  const int r = k0 + (lane >> 2);
#pragma unroll
  for (int i = 0; i < 2; i++) {
    unsigned short h;
    asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(h) : "r"(ss + 2 * ((r + 8 * i) * n_kv + kvh)));
    f[i] = __half2float(__ushort_as_half(h));
  }
}

/* The online softmax of S^T (kcu_dq_qk; already in log2 units): m[i], l[i]
 * and O^T's columns are query head 2 c + i's; keys outside [lo, hi) masked
 * where mask. Leaves P (unnormalized) in sc; l is the lane's part of the
 * sum. */
template <int HD>
__device__ __forceinline__ void kcu_dq_softmax(float *sc, float (*o)[4], float *m, float *l, int key, int lo, int hi,
                                               bool mask, int lane) {
  if (mask) {
    const int j = key + (lane >> 2);
    if (j < lo || j >= hi) sc[0] = sc[1] = -INFINITY;
    if (j + 8 < lo || j + 8 >= hi) sc[2] = sc[3] = -INFINITY;
  }
#pragma unroll
  for (int i = 0; i < 2; i++) {
    float mx = fmaxf(sc[i], sc[i + 2]);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
    const float mn = fmaxf(m[i], mx);
    const float base = mn == -INFINITY ? 0.f : mn;
    const float corr = exp2f(m[i] - base);
    m[i] = mn;
    l[i] *= corr;
#pragma unroll
    for (int d = 0; d < HD / 16; d++) o[d][i] *= corr, o[d][i + 2] *= corr;
    sc[i] = exp2f(sc[i] - base);
    sc[i + 2] = exp2f(sc[i + 2] - base);
    l[i] += sc[i] + sc[i + 2];
  }
}

/* O^T (HD x 8 heads) += V^T P^T over keys k0 .. k0 + 16 of the byte tile
 * sv, P's keys times their V scales (vsc, kcu_dq_scales). P^T's fragments
 * are the lane's P transposed by movmatrix, two 8-key halves. */
template <int HD, int KQ>
__device__ __forceinline__ void kcu_dq_pv(float (*o)[4], const float *p, const float *vsc, uint32_t sv, int k0,
                                          int lane) {
  const uint32_t bp[2] = {kcu_movmatrix_t(kcu_pack2<__half>(p[0] * vsc[0], p[1] * vsc[0])),
                          kcu_movmatrix_t(kcu_pack2<__half>(p[2] * vsc[1], p[3] * vsc[1]))};
  const int r = k0 + 2 * (lane & 3);
#pragma unroll
  for (int h = 0; h < HD / 64; h++) {
    const int b = 64 * h + 8 * (lane >> 2);
    const uint2 v0 = kcu_ld_shared8(sv + kcu_dq_off<HD>(r, b)), v1 = kcu_ld_shared8(sv + kcu_dq_off<HD>(r + 1, b));
    const uint2 v8 = kcu_ld_shared8(sv + kcu_dq_off<HD>(r + 8, b)), v9 = kcu_ld_shared8(sv + kcu_dq_off<HD>(r + 9, b));
    const uint32_t lo0[2] = {v0.x, v0.y}, lo1[2] = {v1.x, v1.y}, hi0[2] = {v8.x, v8.y}, hi1[2] = {v9.x, v9.y};
#pragma unroll
    for (int wd = 0; wd < 2; wd++)
#pragma unroll
      for (int pr = 0; pr < 2; pr++) { /* m-tile 4 h + 2 wd + pr: bytes 2 pr and 2 pr + 1 of the words */
        const uint32_t sel = pr ? 0x7362u : 0x5140u;
        const uint32_t x = __byte_perm(lo0[wd], lo1[wd], sel), y = __byte_perm(hi0[wd], hi1[wd], sel);
        const uint32_t a[4] = {kcu_dq_h2<KQ>(x), kcu_dq_h2<KQ>(x >> 16), kcu_dq_h2<KQ>(y), kcu_dq_h2<KQ>(y >> 16)};
        kcu_mma16816<__half>(o[4 * h + 2 * wd + pr], a, bp);
      }
  }
}

/* The four warps' (m, l, O) (m in log2 units, l the lane's part of the
 * row's sum) of query heads g and g + 8 (bf16: O's rows; lanes c hold a
 * row's parts), or 2 c and 2 c + 1 (KQ: O^T's columns, kcu_dq_pv; lanes g
 * hold a column's parts), merged through shared memory (sm: 4 x (16 x
 * (HD + 8) + 32) floats, free once the K/V loop is done) into the G rows
 * of dst, (G, HD); or, with part (one split of several), into the G rows
 * of part (row stride part_stride floats) as kcu_attn_merge_last reads
 * them: O normalized, then its log-sum-exp (natural units). The warps swap
 * their rows' (m, l) first, so that each lane scales its own O by its
 * warp's weight exp2(m - M) / den before storing it, and an output pair is
 * four loads and adds (it was four exponentials, dependent shared-memory
 * loads and a division an output: batch 1 1.2% slower, docs/bench/gpu.md,
 * session 41). O rows are HD + 8 floats apart, so that the 4 rows of a
 * bf16-layout store fall in different banks (KQ's stores, 8 rows of 4
 * lanes, conflict; they run once a CTA). */
template <typename T, int HD, int KQ>
__device__ void kcu_dm_end(T *dst, float *part, int part_stride, float *sm, const float (*o)[4], const float *m,
                           float *l, int G, int warp, int lane) {
  constexpr int RS = HD + 8, W = 16 * RS + 32; /* a warp's floats: O rows, then m, then l */
  constexpr bool TR = KQ != KCU_KVQ_NONE;      /* O^T */
  float *w = sm + warp * W;
  const int g = lane >> 2, c = 2 * (lane & 3);
  const bool writer = TR ? g == 0 : c == 0; /* one lane of those holding a row's parts */
#pragma unroll
  for (int r = 0; r < 2; r++) {
#pragma unroll
    for (int x = TR ? 4 : 1; x < (TR ? 32 : 4); x *= 2) l[r] += __shfl_xor_sync(0xffffffffu, l[r], x);
    const int row = TR ? c + r : g + 8 * r;
    if (row < G && writer) w[16 * RS + row] = m[r], w[16 * RS + 16 + row] = l[r];
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int row = TR ? c + r : g + 8 * r;
    if (row >= G) continue;
    float M = -INFINITY, den = 0.f;
#pragma unroll
    for (int k = 0; k < KCU_FA_WARPS; k++) M = fmaxf(M, sm[k * W + 16 * RS + row]);
    if (M != -INFINITY)
#pragma unroll
      for (int k = 0; k < KCU_FA_WARPS; k++)
        den += exp2f(sm[k * W + 16 * RS + row] - M) * sm[k * W + 16 * RS + 16 + row];
    const float f = den > 0.f ? exp2f(m[r] - M) / den : 0.f;
    if constexpr (TR) { /* m-tile d's rows g and g + 8 are dimensions 64 (d / 4) + 8 g + 2 (d % 4) + {0, 1} */
#pragma unroll
      for (int d = 0; d < HD / 16; d++)
        *reinterpret_cast<float2 *>(w + row * RS + 64 * (d >> 2) + 8 * g + 2 * (d & 3)) =
            make_float2(o[d][r] * f, o[d][r + 2] * f);
    } else {
#pragma unroll
      for (int d = 0; d < HD / 8; d++)
        *reinterpret_cast<float2 *>(w + row * RS + d * 8 + c) = make_float2(o[d][2 * r] * f, o[d][2 * r + 1] * f);
    }
    if (part && writer && warp == 0) /* the row's log-sum-exp, stored past O's HD + 8 */
      w[row * RS + HD] = den > 0.f ? (M + __log2f(den)) * 0.6931471805599453f : -INFINITY;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < G * HD / 2; e += KCU_FA_NT) {
    const int row = e / (HD / 2), d = 2 * (e % (HD / 2));
    float2 v = make_float2(0.f, 0.f);
#pragma unroll
    for (int k = 0; k < KCU_FA_WARPS; k++) {
      const float2 x = *reinterpret_cast<const float2 *>(sm + k * W + row * RS + d);
      v.x += x.x, v.y += x.y;
    }
    if (!part) {
      *reinterpret_cast<uint32_t *>(dst + (size_t)row * HD + d) = kcu_pack2<T>(v.x, v.y);
      continue;
    }
    float *p = part + (size_t)row * part_stride;
    p[d] = v.x, p[d + 1] = v.y;
    if (d == 0) p[HD] = sm[row * RS + HD];
  }
}

template <typename T, int HD, int ST, int KQ>
__global__ void __launch_bounds__(KCU_FA_NT, KQ ? KCU_DQ_CTAS : 1)
    kcu_attn_decode_mma_k(T *out, const T *q, int q_stride, const void *kc, const void *vc, const uint16_t *ks,
                          const uint16_t *vs, const __grid_constant__ CUtensorMap tm, int plane, int max_blocks,
                          const int32_t *q_start, const int32_t *ctx_len, const int32_t *bts, int bs, int n_blocks,
                          int n_kv, int G, float scale, int window, int min_chunk, float *part, int32_t *cnt,
                          int next) {
  KCU_TRACE_SCOPE(KCU_TR_ATTN);
  static_assert(KCU_FA_NT == KCU_DEC_NT, "kcu_attn_merge_last works with the SIMT decode kernel's CTA size");
  constexpr bool TM = ST > 0;
  static_assert(TM || KQ == KCU_KVQ_NONE, "a quantized pool's tiles come by the tensor-memory accelerator");
  static_assert((TM ? ST : 2) * kcu_dm_smem<HD, ST, KQ>::STAGE >= KCU_FA_WARPS * (16 * (HD + 8) + 32) * 4,
                "kcu_dm_end's merge fits in the stages");
  if constexpr (!TM) kcu_pdl_enter();
  using SM = kcu_dm_smem<HD, ST, KQ>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  uint32_t sq = (uint32_t)__cvta_generic_to_shared(smem_raw);
  unsigned char *smem = smem_raw;
  if constexpr (TM) {
    const uint32_t pad = (1024u - (sq & 1023u)) & 1023u; /* the swizzle's alignment */
    sq += pad, smem += pad;
  }
  const uint32_t bar = sq + SM::Q, skv = bar + SM::BAR, TILE = SM::TILE, STAGE = SM::STAGE;
  const int kvh = blockIdx.y, s = blockIdx.z, warp = threadIdx.x / KCU_WARP, lane = threadIdx.x % KCU_WARP;
  const int split = blockIdx.x, n_splits = gridDim.x;
  /* What the copies before the PDL wait depend on, in one trip to memory:
   * the sequence's query range and context, and (warp 0 of a TM CTA) its
   * block table's first KCU_WARP entries, lane l entry l, which hold the
   * rows of a context of up to KCU_WARP blocks (later ones are read where
   * needed). One load after the other they were three trips, on the
   * critical path at batch 1 (docs/bench/gpu.md, session 41). */
  const int32_t *bt = bts + (size_t)s * max_blocks;
  const int t = q_start[s], t_end = q_start[s + 1], ctx = ctx_len[s];
  const int bt_lane = TM && warp == 0 && lane < max_blocks ? bt[lane] : 0;
  if (t_end - t != 1) {
    if (TM) kcu_pdl_wait(); /* every CTA waits (kcu_pdl_wait) */
    return;
  }
  /* up to 2 chunks, one split: measured on H200 (Llama-3-8B shapes, docs/bench/gpu.md, session 35), the merge
   * costs about what a split's two chunks do (a step at batch 1 and 161 tokens 3% faster, batch 8 4.5%) */
  const kcu_dec_range r = kcu_dec_split(ctx, max_blocks * bs, window, split, n_splits, min_chunk, 2 * min_chunk);
  /* TM: tiles from the 16-token group of start, in the copies' layout */
  const int kb0 = TM ? r.start & ~15 : r.start;
  if constexpr (TM) {
    /* The first stages' rows that earlier steps wrote are copied before the
     * PDL wait (kcu_pdl_wait says why they may be), this step's one after it
     * with the query: the copies overlap the rope + K/V append kernel. */
    const int fresh = min(ctx, max_blocks * bs) - 1;
    if (threadIdx.x == 0) {
      for (int b = 0; b < ST; b++) kcu_mbar_init(bar + 8 * b, 1);
      kcu_mbar_init_fence();
    }
    __syncthreads();
    if (warp == 0)
      for (int b = 0; b < ST - 1 && kb0 + b * KCU_FA_BN < r.stop; b++)
        kcu_dm_tma_tile<HD, KQ>(skv + b * STAGE, bar + 8 * b, &tm, plane, ks, vs, bt, bt_lane, kb0 + b * KCU_FA_BN,
                                r.start, r.stop, bs, n_blocks, n_kv, kvh, lane, KCU_DM_OLD, fresh);
    kcu_pdl_wait_launch(next); /* at the end: when the CTAs exit */
    if (warp == 0)
      for (int b = 0; b < ST - 1 && kb0 + b * KCU_FA_BN < r.stop; b++)
        kcu_dm_tma_tile<HD, KQ>(skv + b * STAGE, bar + 8 * b, &tm, plane, ks, vs, bt, bt_lane, kb0 + b * KCU_FA_BN,
                                r.start, r.stop, bs, n_blocks, n_kv, kvh, lane, KCU_DM_NEW, fresh);
  }
  const float scale_log2 = scale * 1.4426950408889634f;
  uint32_t qf[HD / 16][KQ ? 2 : 4];
  if constexpr (KQ != KCU_KVQ_NONE) { /* f16 fragments, already scaled, straight from the query rows */
    const int g = lane >> 2;
    kcu_dq_qfrag<T, HD>(qf, g < G ? q + (size_t)t * q_stride + (size_t)(kvh * G + g) * HD : NULL, scale_log2, lane);
  } else {
    for (int i = threadIdx.x; i < 16 * (HD / 8); i += KCU_FA_NT) {
      const int row = i / (HD / 8), ch = i % (HD / 8);
      const T *src = q + (size_t)t * q_stride + (size_t)(kvh * G + (row < G ? row : 0)) * HD + ch * 8;
      kcu_cp_async16(sq + kcu_fa_off<HD>(row, ch), src, row < G);
    }
  }
  if constexpr (TM) {
    kcu_cp_commit();
  } else {
    if (r.start < r.stop)
      kcu_fa_load_kv<T, HD, KCU_KVQ_NONE>(skv, skv + TILE, kc, vc, NULL, NULL, bt, r.start, r.stop, bs, n_blocks,
                                           n_kv, kvh);
    kcu_cp_commit();
  }
  KCU_TRACE_MARK(0); /* trace marks: 0 the loads issued, 1 the first tile in, 2.. each tile done, 7 the merge */
  /* every row is the one query at cache index stop - 1: mask outside [start, stop) */
  const int qpos[2] = {r.stop - 1, r.stop - 1}, qlo[2] = {r.start, r.start}, k0 = warp * 16;
  constexpr int NO = KQ ? HD / 16 : HD / 8; /* O's accumulators: KQ O^T's m-tiles, else O's n-tiles */
  float o[NO][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
#pragma unroll
  for (int d = 0; d < NO; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
  constexpr int NB = TM ? ST : 2; /* buffers */
  for (int kb = kb0, i = 0; kb < r.stop; kb += KCU_FA_BN, i++) {
    const int b = i % NB, nb = (i + NB - 1) % NB; /* this tile's buffer; the one loaded now */
    const uint32_t sk = skv + b * STAGE, sv = sk + TILE, nk = skv + nb * STAGE;
    if constexpr (TM) {
      const int kn = kb + (ST - 1) * KCU_FA_BN;
      if (warp == 0 && kn < r.stop)
        kcu_dm_tma_tile<HD, KQ>(nk, bar + 8 * nb, &tm, plane, ks, vs, bt, bt_lane, kn, r.start, r.stop, bs, n_blocks,
                                n_kv, kvh, lane);
      if (kb == kb0) kcu_cp_wait<0>();
      kcu_mbar_wait(bar + 8 * b, (uint32_t)(i / ST) & 1u);
      if (kb < r.start || kb + KCU_FA_BN > r.stop) kcu_dm_zero_v<HD, KQ>(sk, kb, r.start, r.stop, n_kv, kvh);
    } else {
      if (kb + KCU_FA_BN < r.stop)
        kcu_fa_load_kv<T, HD, KCU_KVQ_NONE>(nk, nk + TILE, kc, vc, NULL, NULL, bt, kb + KCU_FA_BN, r.stop, bs,
                                             n_blocks, n_kv, kvh);
      kcu_cp_commit();
      kcu_cp_wait<1>();
    }
    __syncthreads();
    const bool mask = kb + k0 < r.start || kb + k0 + 16 > r.stop;
    if constexpr (KQ != KCU_KVQ_NONE) {
      if (kb == kb0) KCU_TRACE_MARK(1);
      float st[4], ksc[2], vsc[2];
      kcu_dq_scales(ksc, sv + TILE, k0, n_kv, kvh, lane);
      kcu_dq_scales(vsc, sv + TILE + SM::SCALES, k0, n_kv, kvh, lane);
      kcu_dq_qk<HD, KQ>(st, qf, sk, k0, lane);
      st[0] *= ksc[0], st[1] *= ksc[0], st[2] *= ksc[1], st[3] *= ksc[1];
      kcu_dq_softmax<HD>(st, o, m, l, kb + k0, r.start, r.stop, mask, lane);
      kcu_dq_pv<HD, KQ>(o, st, vsc, sv, k0, lane);
    } else {
      float sc[2][4];
      if (kb == kb0) {
        KCU_TRACE_MARK(1);
#pragma unroll
        for (int k = 0; k < HD / 16; k++) kcu_ldsm4(qf[k], sq + kcu_fa_off<HD>(lane & 15, 2 * k + (lane >> 4)));
      }
      kcu_fa_qk<T, HD, 16, TM>(sc, qf, sk, k0, lane);
      kcu_fa_softmax<HD, 16, 1>(sc, o, m, l, kb + k0, r.stop, qpos, qlo, scale_log2, mask, lane);
      kcu_fa_pv<T, HD, 16, TM>(o, sc, sv, k0, lane);
    }
    __syncthreads(); /* the buffer is loaded again NB - 1 tiles on */
    KCU_TRACE_MARK(2 + (i < 4 ? i : 4));
  }
  kcu_cp_wait<0>(); /* the Q load when the range was empty */
  __syncthreads();
  KCU_TRACE_MARK(7);
  float *sm = reinterpret_cast<float *>(smem + SM::Q + SM::BAR);
  if (r.n_used <= 1) { /* one split has the context (kcu_dec_end) */
    if (split == 0) kcu_dm_end<T, HD, KQ>(out + ((size_t)t * n_kv + kvh) * G * HD, NULL, 0, sm, o, m, l, G, warp, lane);
    return;
  }
  const int n_heads = n_kv * G, h0 = kvh * G;
  if (split < r.n_used)
    kcu_dm_end<T, HD, KQ>(NULL, part + (((size_t)s * n_heads + h0) * n_splits + split) * (HD + 2), n_splits * (HD + 2),
                      sm, o, m, l, G, warp, lane);
  kcu_attn_merge_last<T, HD, KCU_MAX_GROUP>(out, part, cnt + (size_t)s * gridDim.y + kvh, t, s, h0, G, n_heads,
                                            n_splits, r.n_used);
}

/* The driver's cuTensorMapEncodeTiled (the runtime does not wrap it), or NULL. */
static PFN_cuTensorMapEncodeTiled_v12000 kcu_tmap_encoder(void) {
  void *fn = NULL;
  cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return NULL;
  }
  return (PFN_cuTensorMapEncodeTiled_v12000)fn;
}

/* The pool's K/V as the TM decode kernel's 4-d tensor map: (head_dim, KV
 * heads, slots, 2 x layers), K of layer l at plane 2l, V at 2l + 1. 2-byte
 * elements in boxes of 64 x 1 x 16 x 1 with the 128-byte swizzle; a
 * quantized pool's bytes in boxes of head_dim x 1 x 16 x 1 swizzled by
 * head_dim bytes (64 or 128). Encoded once a pool (kcu_kv_pool_init and
 * _deinit forget it); false where the driver cannot, and the caller loads
 * by cp.async (a quantized pool: on the SIMT kernel). */
static bool kcu_kv_tmap(kcu_ctx_t *c, const kern_kv_pool_t *pool, CUtensorMap *tm) {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = kcu_tmap_encoder(); /* once, thread-safe */
  if (c->kv_tmap_base != pool->base) {
    const kern_kv_config_t *cf = &pool->cfg;
    const bool quant = pool->scale_bytes != 0;
    const cuuint64_t esz = quant ? 1 : 2;
    const cuuint64_t dims[4] = {(cuuint64_t)cf->head_dim, (cuuint64_t)cf->n_kv_heads,
                                (cuuint64_t)cf->n_blocks * (cuuint64_t)cf->block_size, 2 * (cuuint64_t)cf->n_layers};
    const cuuint64_t strides[3] = {(cuuint64_t)cf->head_dim * esz, (cuuint64_t)cf->n_kv_heads * cf->head_dim * esz,
                                   (cuuint64_t)pool->layer_bytes};
    const cuuint32_t box[4] = {quant ? (cuuint32_t)cf->head_dim : 64u, 1, 16, 1}, estr[4] = {1, 1, 1, 1};
    if (quant && cf->head_dim != 64 && cf->head_dim != 128) return false;
    const CUtensorMapSwizzle swz = quant && cf->head_dim == 64 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B;
    CUtensorMap m;
    if (!encode || encode(&m, quant ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_UINT16, 4, pool->base,
                          dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, swz,
                          CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
      return false;
    memcpy(c->kv_tmap, &m, sizeof m);
    c->kv_tmap_base = pool->base;
  }
  memcpy(tm, c->kv_tmap, sizeof *tm);
  return true;
}

template <typename T, int HD, int GM, int Q>
static int kcu_decode_launch(kcu_ctx_t *c, T *out, const T *q, int q_stride, const kcu_kv_layer_t &kv,
                             const kern_kv_config_t *cf, int G, float scale, int window) {
  int n_seqs = c->n_seqs, n_heads = cf->n_kv_heads * G, n_groups = (G + GM - 1) / GM;
  const long long capacity = (long long)c->max_blocks * cf->block_size, pairs = (long long)n_seqs * cf->n_kv_heads;
  int sp = kcu_attn_splits(c, pairs, capacity);
  /* the tensor cores split too where the pairs are few (c->dec_msplit); a
   * quantized pool takes them where its tiles can come by TMA (kcu_dq_off) */
  const bool tma_ok = HD % 64 == 0 && cf->block_size % 16 == 0 && c->dec_tma;
  const bool q_ok = Q == KCU_KVQ_NONE || (c->dec_mma_q && tma_ok && (HD == 64 || HD == 128) &&
                                          cf->n_kv_heads <= KCU_DQ_MAX_KV && ((uintptr_t)kv.ks & 15) == 0 &&
                                          ((uintptr_t)kv.vs & 15) == 0);
  const bool tc_ok = q_ok && HD <= KCU_FA_MAX_HD && G <= KCU_MAX_GROUP && !c->simt_prefill;
  const bool msplit = tc_ok && (c->dec_msplit == 2 ? pairs < (long long)KCU_DEC_MMA_CTAS * c->n_sm
                                                   : c->dec_msplit == 1 && 2 * pairs <= c->n_sm);
  const int msp = msplit ? kcu_attn_msplits(c, pairs, capacity) : 1;
  int rc = kcu__attn_reserve(c, n_seqs, cf->n_kv_heads * n_groups, n_heads, HD, FR_MAX(sp, msp));
  if (rc) return rc;
  dim3 grid(sp, cf->n_kv_heads, n_seqs), dgrid(sp, cf->n_kv_heads * n_groups, n_seqs);
  /* Where they apply, the tensor cores: split while the (sequence, KV
   * head) pairs are at most half the SMs, unsplit past that unless the
   * prefetching SIMT kernel needs no split; else the SIMT kernel, split,
   * prefetching while its grid fits one wave (KCU_DEC_PIPE_CTAS). H200,
   * Llama-3-8B shapes (docs/bench/gpu.md, sessions 30 and 31), a step
   * against the SIMT kernel: split, 0.5-3% faster at 1-8 sequences and
   * 512 tokens, 3-7% at 2048, 10-16% at 8192 (splitting more pairs was
   * 1-6% slower below 8192); unsplit, 3-4% faster at 16 sequences, 14-29%
   * at 24-32 (2 splits), 0-4% slower at 48 (one wave, no split). */
  const bool one_wave = (long long)sp * dgrid.y * n_seqs <= (long long)KCU_DEC_PIPE_CTAS * c->n_sm;
  if constexpr (HD <= KCU_FA_MAX_HD) {
    const bool mma = c->dec_mma < 0 ? 2 * pairs > c->n_sm && !(one_wave && sp == 1) : pairs >= c->dec_mma;
    const bool tc = (mma || msplit) && tc_ok;
    CUtensorMap tm = {};
    const bool tmap = tc && tma_ok && kcu_kv_tmap(c, kv.pool, &tm);
    if (tc && (tmap || Q == KCU_KVQ_NONE)) {
      grid.x = msplit ? msp : 1;
      /* stages: 3 (2 CTAs a SM) while the grid is at most two waves of them, else 2 (3 a SM); a quantized
       * pool's (a stage is 18-20 KiB): 4 (2 a SM) while the grid is one wave of them, else 2 (4 a SM, as its
       * registers allow). H200, Llama-3-8B shapes, fp8 (docs/bench/gpu.md, session 55): at 32 sequences of
       * 4096 tokens (split, one wave) 4 stages 9% faster than 2; at 64 of 4096 (512 CTAs) 2 stages 17% faster
       * than 4, at 64 of 512 5%; 3 (3 a SM) slower than the better of the two everywhere. */
      int st = 0;
      if (tmap) {
        const long long ctas = (long long)grid.x * pairs;
        if (c->dec_tma > 0)
          st = c->dec_tma;
        else if (Q != KCU_KVQ_NONE)
          st = ctas <= 2LL * c->n_sm ? 4 : 2;
        else
          st = ctas <= 4LL * c->n_sm ? 3 : 2;
      }
      decltype(&kcu_attn_decode_mma_k<T, HD, 2, Q>) k;
      size_t smem;
      if constexpr (Q != KCU_KVQ_NONE) {
        k = st == 4   ? kcu_attn_decode_mma_k<T, HD, 4, Q>
            : st == 3 ? kcu_attn_decode_mma_k<T, HD, 3, Q>
                      : kcu_attn_decode_mma_k<T, HD, 2, Q>;
        smem = st == 4   ? (size_t)kcu_dm_smem<HD, 4, Q>::BYTES
               : st == 3 ? (size_t)kcu_dm_smem<HD, 3, Q>::BYTES
                         : (size_t)kcu_dm_smem<HD, 2, Q>::BYTES;
      } else {
        k = st >= 3 ? kcu_attn_decode_mma_k<T, HD, 3, Q> : st ? kcu_attn_decode_mma_k<T, HD, 2, Q>
                                                              : kcu_attn_decode_mma_k<T, HD, 0, Q>;
        smem = st >= 3 ? (size_t)kcu_dm_smem<HD, 3>::BYTES
               : st    ? (size_t)kcu_dm_smem<HD, 2>::BYTES
                       : (size_t)kcu_dm_smem<HD, 0>::BYTES;
      }
      KCU_LAUNCH(c, k, grid, KCU_FA_NT, smem, out, q, q_stride, kv.kc, kv.vc, kv.ks, kv.vs, tm, 2 * kv.layer,
                 c->max_blocks, c->dm.q_start, c->dm.ctx_len, c->dm.block_tables, cf->block_size, cf->n_blocks,
                 cf->n_kv_heads, G, scale, window, c->dec_mchunk, c->attn_part, c->attn_cnt,
                 kcu_pdl_next(c, KCU_PDL_ATTN, n_seqs));
      return 0;
    }
  }
  if (one_wave)
    KCU_LAUNCH(c, kcu_attn_decode_k<T, HD, GM, true, Q>, dgrid, KCU_DEC_NT, 0, out, q, q_stride, kv.kc, kv.vc, kv.ks,
               kv.vs, c->dm.hdr,
               c->dm.q_start, c->dm.ctx_len, c->dm.block_tables, cf->block_size, cf->n_blocks, cf->n_kv_heads, G, scale,
               window, c->dec_chunk, c->attn_part, c->attn_cnt);
  else
    KCU_LAUNCH(c, kcu_attn_decode_k<T, HD, GM, false, Q>, dgrid, KCU_DEC_NT, 0, out, q, q_stride, kv.kc, kv.vc, kv.ks,
               kv.vs, c->dm.hdr,
               c->dm.q_start, c->dm.ctx_len, c->dm.block_tables, cf->block_size, cf->n_blocks, cf->n_kv_heads, G, scale,
               window, c->dec_chunk, c->attn_part, c->attn_cnt);
  return 0;
}

template <typename T, int HD, int Q>
static int kcu_decode_g(kcu_ctx_t *c, T *out, const T *q, int q_stride, const kcu_kv_layer_t &kv,
                        const kern_kv_config_t *cf, int G, float scale, int window) {
  if (G <= 1) return kcu_decode_launch<T, HD, 1, Q>(c, out, q, q_stride, kv, cf, G, scale, window);
  if (G <= 2) return kcu_decode_launch<T, HD, 2, Q>(c, out, q, q_stride, kv, cf, G, scale, window);
  return kcu_decode_launch<T, HD, KCU_DEC_GROUP, Q>(c, out, q, q_stride, kv, cf, G, scale, window);
}

/* ---- a quantized pool's prefill K/V, converted once a step ------------------------------ */

/* The tensor-core prefill kernel over an int8 or FP8 pool converted each
 * K/V tile it read, so a prompt's context was converted once for each of
 * its query tiles and each query head of a KV head (a 512-token prompt of
 * Llama-3-8B: 32 times), and those conversions, not the MMAs, held the
 * kernel (H200, docs/bench/gpu.md, session 57: 54 us a layer against 27 on
 * a bf16 pool). Now, where the step's prefill contexts fit kvd (at most
 * kvd_max_bytes, FERRUM_CUDA_KVD_MB), kcu_kvd_k first converts each of
 * their blocks once into kvd, in the act type and the pool's layout (K's
 * blocks, then V's), and writes the block's entry in kvd's own block
 * tables (kvd_bt, n_seqs x max_blocks like the step's); the bf16 kernel
 * then runs on kvd as on a pool of that type. Past the limit the kernel
 * converts in its loop as before, and also where the loop would convert
 * a block fewer than kvd_reuse (2, FERRUM_CUDA_KVD_REUSE) times on average:
 * once for each CTA that reads it (kcu_kvd_pays). Where a CTA took one
 * query head, a speculative verify step (5 queries a sequence) converted
 * each block once for each of a KV head's 4 query heads, and kvd was the
 * faster (H200, session 58, FP8 pool, 16 x 512 tokens: 8.22 ms a verify
 * step in the loop, 6.74 on kvd); with the group's heads in one CTA
 * (kcu_pf_group) such a step converts each block once, in the loop. */
#define KCU_KVD_NT 256

/* Block blockIdx.x of sequence seq_map[blockIdx.y] (or blockIdx.y): K and
 * V of every KV head, converted into kvd's block base[s] + blockIdx.x;
 * gridDim.z CTAs a block, each 8 elements of K and of V a thread and
 * step. */
template <typename T, int Q>
__global__ void __launch_bounds__(KCU_KVD_NT)
    kcu_kvd_k(T *kd, T *vd, int32_t *dbt, const void *kc, const void *vc, const uint16_t *ksc, const uint16_t *vsc,
              const int32_t *hdr, const int32_t *ctx_len, const int32_t *bts, const int32_t *base,
              const int32_t *seq_map, int bs, int n_blocks, int n_kv, int hd) {
  kcu_pdl_enter();
  const int s = seq_map ? seq_map[blockIdx.y] : blockIdx.y, i = blockIdx.x, max_blocks = hdr[2];
  const int ctx = max(min(ctx_len[s], max_blocks * bs), 0);
  if (base[s] < 0 || i * bs >= ctx) return;
  const int32_t *bt = bts + (size_t)s * max_blocks;
  const int dst = base[s] + i;
  if (blockIdx.z == 0 && threadIdx.x == 0) dbt[(size_t)s * max_blocks + i] = dst;
  const int row = n_kv * hd;
  for (int e = (blockIdx.z * KCU_KVD_NT + threadIdx.x) * 8; e < bs * row; e += gridDim.z * KCU_KVD_NT * 8) {
    const int r = e / row, off = e - r * row, j = i * bs + r; /* cache row j, element off of it */
    const size_t o = (size_t)dst * bs * row + e;
    *reinterpret_cast<uint4 *>(kd + o) =
        kcu_kv_to_t<T, Q>(kcu_kvq_row8(kc, ksc, bt, j, bs, n_blocks, row, off, n_kv, off / hd));
    *reinterpret_cast<uint4 *>(vd + o) =
        kcu_kv_to_t<T, Q>(kcu_kvq_row8(vc, vsc, bt, j, bs, n_blocks, row, off, n_kv, off / hd));
  }
}

/* Bytes of a block of bs tokens' K and V rows of row elements in the act type. */
static size_t kcu_kvd_block_bytes(const kcu_ctx_t *c, int bs, int row) {
  return 2 * (size_t)bs * row * c->act_size;
}

/* The blocks of kvd a sequence of q new tokens and a context of ctx_len
 * takes (0: none, a decode, or no quantized pool). */
static int kcu_kvd_blocks(const kcu_ctx_t *c, int q, int ctx_len, int max_blocks) {
  const int bs = c->pool_block_size;
  if (!c->kvd_quant || bs <= 0 || q <= 1) return 0;
  const long long ctx = FR_MIN((long long)FR_MAX(ctx_len, 0), (long long)max_blocks * bs);
  return (int)((ctx + bs - 1) / bs);
}

int kcu__kvd_plan(kcu_ctx_t *c, const kern_step_t *s) {
  const int bs = c->pool_block_size;
  c->kvd_need = 0;
  c->kvd_max_nb = 0;
  c->kvd_tiles_gp = 0; /* kcu_kvd_pays counts them for the group of the first call */
  for (int i = 0; i < s->n_seqs; i++) {
    const int nb = s->ctx_len ? kcu_kvd_blocks(c, s->q_start[i + 1] - s->q_start[i], s->ctx_len[i], s->max_blocks) : 0;
    c->pm.kvd_base[i] = nb ? (int)c->kvd_need : -1;
    c->kvd_need += nb;
    c->kvd_max_nb = FR_MAX(c->kvd_max_nb, nb);
  }
  const size_t bb = kcu_kvd_block_bytes(c, bs, c->kvd_row), n_bt = (size_t)s->n_seqs * s->max_blocks;
  /* whether the loop would convert its blocks often enough is for each attention call (kcu_kvd_pays) */
  if (c->kvd_need == 0 || (size_t)c->kvd_need * bb > c->kvd_max_bytes) {
    c->kvd_need = 0;
    return 0;
  }
  if ((size_t)c->kvd_need * bb <= c->kvd_bytes && n_bt <= c->kvd_bt_n) return 0;
  KCU_CHECK(cudaStreamSynchronize(c->stream));
  kcu__graphs_drop(c); /* none reads kvd (graphs replay decode steps), but none may hold a freed pointer */
  if ((size_t)c->kvd_need * bb > c->kvd_bytes) {
    const size_t bytes = FR_MIN(FR_MAX((size_t)c->kvd_need * bb, 2 * c->kvd_bytes), c->kvd_max_bytes);
    kcu__free(c->kvd);
    c->kvd = NULL;
    c->kvd_bytes = 0;
    if (kcu__alloc(c, bytes, &c->kvd, "the prefill's converted K/V")) {
      FR_LOGW("%s: the prefill attention converts the pool's K/V in its loop instead", fr_last_error());
      c->kvd_need = 0;
      return 0;
    }
    c->kvd_bytes = bytes;
  }
  if (n_bt > c->kvd_bt_n) {
    const size_t n = FR_MAX(n_bt, 2 * c->kvd_bt_n);
    kcu__free(c->kvd_bt);
    c->kvd_bt = NULL;
    c->kvd_bt_n = 0;
    int rc = kcu__alloc(c, n * sizeof(int32_t), (void **)&c->kvd_bt, "the prefill's converted K/V's block tables");
    if (rc) return rc;
    c->kvd_bt_n = n;
  }
  return 0;
}

/* The query heads of a KV head that share a tensor-core prefill CTA's 64
 * rows (kcu_attn_prefill_mma_k's gp): the whole group, so that K/V is read
 * and (a quantized pool in the loop) converted once for them, and a few
 * queries (a speculative verify step's k + 1) fill the rows with the
 * group's heads instead of padding; 1 (a head a CTA) with
 * FERRUM_CUDA_PF_PACK=0 or where the rows would pass the grid's 65535 tiles. */
static int kcu_pf_group(const kcu_ctx_t *c, int G) {
  return c->pf_pack && (long long)c->max_q * G <= 65535ll * KCU_FA_BM ? G : 1;
}

/* The tensor-core prefill's grid for n sequences of this step with gp
 * heads a CTA: (head groups, tiles of 64 rows, sequences). */
static dim3 kcu_pf_grid(const kcu_ctx_t *c, int n_heads, int gp, int n) {
  return dim3(n_heads / gp, kcu_div_up(c->max_q * gp, KCU_FA_BM), n);
}

/* Whether an attention call of G query heads a KV head takes this step's
 * kvd: the loop would convert each of its blocks at least kvd_reuse times
 * on average, once for each CTA that reads it: its sequence's tiles of 64
 * rows of queries x the gp heads a CTA takes, times the G / gp CTAs of a
 * KV head (kcu__kvd_plan's note). Counted from the step's host metadata at
 * the first call for that gp. */
static bool kcu_kvd_pays(kcu_ctx_t *c, int G) {
  if (c->kvd_need <= 0) return false;
  const int gp = kcu_pf_group(c, G);
  if (c->kvd_tiles_gp != gp) {
    long long t = 0;
    for (int i = 0; i < c->n_seqs; i++) {
      const int q = c->pm.q_start[i + 1] - c->pm.q_start[i];
      t += (long long)kcu_div_up(q * gp, KCU_FA_BM) * kcu_kvd_blocks(c, q, c->pm.ctx_len[i], c->max_blocks);
    }
    c->kvd_tiles = t;
    c->kvd_tiles_gp = gp;
  }
  return c->kvd_tiles * (G / gp) >= (long long)c->kvd_reuse * c->kvd_need;
}

/* The tensor-core prefill kernel on this step's kvd (kcu__kvd_plan made
 * it fit, for blocks of the pool's size and rows up to kvd_row), after
 * kcu_kvd_k has filled it from the layer's quantized K/V. */
template <typename T, int HD, int Q>
static int kcu_prefill_kvd(kcu_ctx_t *c, T *out, const T *q, int q_stride, const kcu_kv_layer_t &kv,
                           const kern_kv_config_t *cf, int n_heads, int G, float scale, int window,
                           const int32_t *seq_map, int n) {
  const int row = cf->n_kv_heads * HD, bs = cf->block_size;
  const long long cap = (long long)(c->kvd_bytes / kcu_kvd_block_bytes(c, bs, row)); /* blocks of K (and of V) */
  T *kd = (T *)c->kvd, *vd = kd + (size_t)cap * bs * row;
  /* a CTA per block took 11 us a layer for a 512-token prompt of Llama-3-8B (32 CTAs; H200, session 57): now
   * enough CTAs a block for one step each */
  const int parts = FR_MIN(kcu_div_up(bs * row / 8, KCU_KVD_NT), 64);
  KCU_LAUNCH(c, kcu_kvd_k<T, Q>, dim3(c->kvd_max_nb, n, parts), KCU_KVD_NT, 0, kd, vd, c->kvd_bt, kv.kc, kv.vc, kv.ks,
             kv.vs, c->dm.hdr, c->dm.ctx_len, c->dm.block_tables, c->dm.kvd_base, seq_map, bs, cf->n_blocks,
             cf->n_kv_heads, HD);
  const int gp = kcu_pf_group(c, G);
  const dim3 grid = kcu_pf_grid(c, n_heads, gp, n);
  KCU_LAUNCH(c, kcu_attn_prefill_mma_k<T, HD, KCU_KVQ_NONE>, grid, KCU_FA_NT, kcu_fa_smem<HD>::BYTES, out, q,
             q_stride, (const void *)kd, (const void *)vd, (const uint16_t *)NULL, (const uint16_t *)NULL, c->dm.hdr,
             c->dm.q_start, c->dm.ctx_len, (const int32_t *)c->kvd_bt, seq_map, bs, (int)cap, cf->n_kv_heads, G, gp,
             scale, window);
  c->kvd_runs++;
  return 0;
}

/* Prefill over n sequences: those of seq_map (device), or all of the step
 * when seq_map is NULL (then kvd holds them where the step has no one-token
 * sequence: kcu__kvd_plan converts only those of more than one token). */
template <typename T, int HD, int Q>
static int kcu_prefill(kcu_ctx_t *c, T *out, const T *q, int q_stride, const kcu_kv_layer_t &kv,
                       const kern_kv_config_t *cf, int n_heads, int G, float scale, int window,
                       const int32_t *seq_map, int n) {
  if (HD <= KCU_FA_MAX_HD && !c->simt_prefill) {
    if constexpr (Q != KCU_KVQ_NONE)
      if (kcu_kvd_pays(c, G) && (seq_map || c->n_single == 0) && cf->block_size == c->pool_block_size)
        return kcu_prefill_kvd<T, HD, Q>(c, out, q, q_stride, kv, cf, n_heads, G, scale, window, seq_map, n);
    constexpr int bytes = kcu_fa_smem<HD>::BYTES;
    const int gp = kcu_pf_group(c, G);
    const dim3 grid = kcu_pf_grid(c, n_heads, gp, n);
    KCU_LAUNCH(c, kcu_attn_prefill_mma_k<T, HD, Q>, grid, KCU_FA_NT, bytes, out, q, q_stride, kv.kc, kv.vc, kv.ks,
               kv.vs, c->dm.hdr, c->dm.q_start, c->dm.ctx_len, c->dm.block_tables, seq_map, cf->block_size,
               cf->n_blocks, cf->n_kv_heads, G, gp, scale, window);
    return 0;
  }
  dim3 grid(kcu_div_up(c->max_q, KCU_PF_BM), n_heads, n);
  KCU_LAUNCH(c, kcu_attn_prefill_k<T, HD, Q>, grid, KCU_PF_NT, 0, out, q, q_stride, kv.kc, kv.vc, kv.ks, kv.vs,
             c->dm.hdr, c->dm.q_start,
             c->dm.ctx_len, c->dm.block_tables, seq_map, cf->block_size, cf->n_blocks, cf->n_kv_heads, G, scale,
             window);
  return 0;
}

/* Decode-only steps take the decode kernel. Mixed steps (chunked prefill
 * beside decodes) take it too for their one-token sequences, which then
 * read each KV head once for its whole query group and split long contexts,
 * and the prefill kernel only for the sequences with more tokens: a
 * one-token sequence in a prefill grid would read K/V once per query head
 * into a 64-query tile with one live row. */
template <typename T, int HD, int Q>
static int kcu_attn_hdq(kcu_ctx_t *c, T *out, const T *q, int q_stride, const kcu_kv_layer_t &kv,
                        const kern_kv_config_t *cf, int n_heads, float scale, int window) {
  int G = n_heads / cf->n_kv_heads;
  if (G > KCU_MAX_GROUP || c->n_single == 0) {
    if (c->max_q == 0) return 0;
    return kcu_prefill<T, HD, Q>(c, out, q, q_stride, kv, cf, n_heads, G, scale, window, NULL, c->n_seqs);
  }
  if (c->n_pf == 0 || !c->attn_side) {
    int rc = kcu_decode_g<T, HD, Q>(c, out, q, q_stride, kv, cf, G, scale, window);
    if (rc || c->n_pf == 0) return rc;
    return kcu_prefill<T, HD, Q>(c, out, q, q_stride, kv, cf, n_heads, G, scale, window, c->dm.pf_seqs, c->n_pf);
  }
  /* The prefill kernel (compute-bound) on the side stream, beside the decode kernel (bound by its K/V loads), both
   * after what `stream` has queued; `stream` goes on when both are done. They write other rows of out and other
   * scratch (kvd; the decode partials). */
  KCU_CHECK(cudaEventRecord(c->side_fork, c->stream));
  KCU_CHECK(cudaStreamWaitEvent(c->side, c->side_fork, 0));
  const cudaStream_t main_stream = c->stream;
  c->stream = c->side;
  int rc = kcu_prefill<T, HD, Q>(c, out, q, q_stride, kv, cf, n_heads, G, scale, window, c->dm.pf_seqs, c->n_pf);
  c->stream = main_stream;
  const cudaError_t joined = cudaEventRecord(c->side_join, c->side); /* joined whatever rc says: a capture must end */
  if (!rc) rc = kcu_decode_g<T, HD, Q>(c, out, q, q_stride, kv, cf, G, scale, window);
  const cudaError_t waited = joined == cudaSuccess ? cudaStreamWaitEvent(c->stream, c->side_join, 0) : joined;
  if (rc) return rc;
  KCU_CHECK(waited);
  return 0;
}

template <typename T, int HD>
static int kcu_attn_hd(kcu_ctx_t *c, T *out, const T *q, int q_stride, const kern_kv_pool_t *pool, int layer,
                       int n_heads, float scale, int window) {
  const kern_kv_config_t *cf = &pool->cfg;
  const kcu_kv_layer_t kv = {kern_kv_pool_elems(pool, layer, 0), kern_kv_pool_elems(pool, layer, 1),
                             kern_kv_pool_scales(pool, layer, 0), kern_kv_pool_scales(pool, layer, 1), pool, layer};
  if (cf->dtype == KERN_KV_INT8)
    return kcu_attn_hdq<T, HD, KCU_KVQ_INT8>(c, out, q, q_stride, kv, cf, n_heads, scale, window);
  if (cf->dtype == KERN_KV_FP8)
    return kcu_attn_hdq<T, HD, KCU_KVQ_FP8>(c, out, q, q_stride, kv, cf, n_heads, scale, window);
  return kcu_attn_hdq<T, HD, KCU_KVQ_NONE>(c, out, q, q_stride, kv, cf, n_heads, scale, window);
}

template <typename T, int HD, int Q> static int kcu_dm_attr(void) {
  if constexpr (Q == KCU_KVQ_NONE)
    KCU_CHECK(cudaFuncSetAttribute(kcu_attn_decode_mma_k<T, HD, 0, Q>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)kcu_dm_smem<HD, 0, Q>::BYTES));
  KCU_CHECK(cudaFuncSetAttribute(kcu_attn_decode_mma_k<T, HD, 2, Q>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)kcu_dm_smem<HD, 2, Q>::BYTES));
  KCU_CHECK(cudaFuncSetAttribute(kcu_attn_decode_mma_k<T, HD, 3, Q>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)kcu_dm_smem<HD, 3, Q>::BYTES));
  if constexpr (Q != KCU_KVQ_NONE)
    KCU_CHECK(cudaFuncSetAttribute(kcu_attn_decode_mma_k<T, HD, 4, Q>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)kcu_dm_smem<HD, 4, Q>::BYTES));
  return 0;
}

template <typename T, int HD> static int kcu_fa_attr(void) {
  int rc = kcu_dm_attr<T, HD, KCU_KVQ_NONE>();
  if (!rc) rc = kcu_dm_attr<T, HD, KCU_KVQ_INT8>();
  if (!rc) rc = kcu_dm_attr<T, HD, KCU_KVQ_FP8>();
  if (rc) return rc;
  KCU_CHECK(cudaFuncSetAttribute(kcu_attn_prefill_mma_k<T, HD, KCU_KVQ_NONE>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kcu_fa_smem<HD>::BYTES));
  KCU_CHECK(cudaFuncSetAttribute(kcu_attn_prefill_mma_k<T, HD, KCU_KVQ_INT8>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kcu_fa_smem<HD>::BYTES));
  KCU_CHECK(cudaFuncSetAttribute(kcu_attn_prefill_mma_k<T, HD, KCU_KVQ_FP8>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kcu_fa_smem<HD>::BYTES));
  return 0;
}

int kcu__attn_init(kcu_ctx_t *c) {
  if ((size_t)kcu_fa_smem<KCU_FA_MAX_HD>::BYTES > c->smem_optin) {
    c->simt_prefill = 1;
    return 0;
  }
  int rc = kcu_fa_attr<__nv_bfloat16, 64>();
  if (!rc) rc = kcu_fa_attr<__nv_bfloat16, 128>();
  if (!rc) rc = kcu_fa_attr<__half, 64>();
  if (!rc) rc = kcu_fa_attr<__half, 128>();
  return rc;
}

int kcu__attention(kcu_ctx_t *c, void *out, const void *q, int q_stride, const kern_kv_pool_t *pool, int layer,
                   int n_heads, int head_dim, float scale, int window) {
  const kern_kv_config_t *cf = &pool->cfg;
  if (head_dim != cf->head_dim || n_heads <= 0 || n_heads % cf->n_kv_heads)
    return fr_errorf(FR_EFORMAT, "cuda: attention: %d heads of %d over %d KV heads of %d", n_heads, head_dim,
                     cf->n_kv_heads, cf->head_dim);
  if (q_stride % 8 || ((uintptr_t)q & 15) || ((uintptr_t)out & 15))
    return fr_errorf(FR_EUNSUPPORTED, "cuda: attention: q/out must be 16-byte aligned rows");
  if (c->n_seqs == 0 || c->n_tokens == 0) return 0;
  if (c->n_seqs > 65535 || n_heads > 65535) return fr_errorf(FR_EUNSUPPORTED, "cuda: attention: grid too large");
  int rc = FR_EUNSUPPORTED;
  window = window > 0 ? window : 0;
  KCU_ACT_DISPATCH(c, {
    T *o = (T *)out;
    const T *qt = (const T *)q;
    if (head_dim == 64) rc = kcu_attn_hd<T, 64>(c, o, qt, q_stride, pool, layer, n_heads, scale, window);
    else if (head_dim == 128) rc = kcu_attn_hd<T, 128>(c, o, qt, q_stride, pool, layer, n_heads, scale, window);
    else if (head_dim == 256) rc = kcu_attn_hd<T, 256>(c, o, qt, q_stride, pool, layer, n_heads, scale, window);
    else rc = fr_errorf(FR_EUNSUPPORTED, "cuda: attention: head_dim %d (supported: 64, 128, 256)", head_dim);
  });
  return rc;
}
