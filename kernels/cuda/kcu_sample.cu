/* kcu_sample.cu - on-device sampling, one CTA per row of logits.
 *
 * Penalties first (repetition over the prompt and output tokens, presence
 * and frequency over the output tokens; the host lists each row's tokens
 * with their output counts), rewriting those logits in place, and
 * constrained decoding's allowed-token mask (a bitmask per row, -inf for
 * the tokens it does not allow). Then greedy
 * (temperature 0) or: z = logits / T; min-p keeps z >= z_max +
 * log(min_p); top-k keeps the k largest (ties at the k-th value kept);
 * top-p keeps the smallest top set whose probability (renormalized over what
 * is left) reaches p. The thresholds are found exactly by radix selection
 * over the order-preserving integer keys of z (8 bits a pass, histograms in
 * shared memory; top-p masses in 40-bit fixed point so the sums are
 * deterministic). The draw is an exponential race: argmax z_i - log(E_i),
 * E_i = -log(u_i), u_i from splitmix64 of (seed, counter, token id), so the
 * result does not depend on the row's place in the batch. The logprob is the
 * log-softmax of the raw logits at temperature 1 (what vLLM returns).
 *
 * The first pass over a row (its argmax and log-sum-exp) is split over
 * up to KCU_SAMP_SPLIT CTAs where the rows are at most half the SMs: each
 * CTA reduces a chunk of the row and leaves its partial, and the last CTA
 * of the row to finish (a counter) merges them and goes on alone with the
 * rest. One CTA going through a whole 128k vocabulary took
 * 22 us, a step's largest kernel after the matmuls at batch 1.
 *
 * The sample op (kcu__sample, at the end) is the host side: it lists each
 * row's penalized tokens, uploads them with the parameters and the masks,
 * launches the kernel (one for the whole batch, guided rows or not) and
 * waits for the tokens.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_util.h"
#include "kernels/cuda/kcu.cuh"

#define KCU_SAMP_NT 1024 /* threads per CTA: the most a CTA can have, as one CTA goes through a
                            whole row of the vocabulary (several times) alone */
#define KCU_SAMP_SPLIT 16 /* CTAs a row's first pass is split over at most */
#define KCU_RADIX_BITS 8 /* key bits a radix-selection pass: 4 passes, histograms of 256 bins */
#define KCU_RADIX (1 << KCU_RADIX_BITS)
#define KCU_MASS_ONE 1099511627776.0 /* 2^40 */

/* Sample params as the device reads them (16-byte aligned rows). The
 * row's penalized tokens are entries [pen_off, pen_off + n_pen) of the
 * step's penalty list. */
typedef struct {
  float temperature, top_p, min_p;
  int32_t top_k;
  uint64_t seed, counter;
  float rep, pres, freq;
  int32_t pen_off, n_pen;
  int32_t top_n;   /* top logprobs wanted (<= KERN_SAMPLE_MAX_TOP) */
  int32_t mask_off; /* the row's allowed-token mask: words [mask_off, mask_off + n_mask) of the step's masks; */
  int32_t n_mask;   /* n_mask 0: no mask */
} kcu_sparams_t;

__device__ __forceinline__ uint32_t kcu_fkey(float f) {
  uint32_t b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ uint64_t kcu_splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static_assert(KCU_SAMP_NT / KCU_WARP <= KCU_WARP, "one warp reduces the per-warp partials");

__device__ float kcu_bsum(float v, float *red) {
  v = kcu_warp_sum(v);
  if (threadIdx.x % KCU_WARP == 0) red[threadIdx.x / KCU_WARP] = v;
  __syncthreads();
  v = threadIdx.x < KCU_SAMP_NT / KCU_WARP ? red[threadIdx.x] : 0.f;
  if (threadIdx.x < KCU_WARP) v = kcu_warp_sum(v);
  if (threadIdx.x == 0) red[0] = v;
  __syncthreads();
  v = red[0];
  __syncthreads();
  return v;
}

/* Max of packed (key << 32 | ~index): largest value, smallest index on ties. */
__device__ uint64_t kcu_bmax64(uint64_t v, uint64_t *red) {
#pragma unroll
  for (int o = KCU_WARP / 2; o > 0; o >>= 1) {
    uint64_t w = __shfl_xor_sync(0xffffffffu, v, o);
    v = w > v ? w : v;
  }
  if (threadIdx.x % KCU_WARP == 0) red[threadIdx.x / KCU_WARP] = v;
  __syncthreads();
  if (threadIdx.x < KCU_WARP) {
    v = threadIdx.x < KCU_SAMP_NT / KCU_WARP ? red[threadIdx.x] : 0;
#pragma unroll
    for (int o = KCU_WARP / 2; o > 0; o >>= 1) {
      uint64_t w = __shfl_xor_sync(0xffffffffu, v, o);
      v = w > v ? w : v;
    }
    if (threadIdx.x == 0) red[0] = v;
  }
  __syncthreads();
  v = red[0];
  __syncthreads();
  return v;
}

__device__ __forceinline__ uint64_t kcu_pack_arg(float v, int i) {
  return ((uint64_t)kcu_fkey(v) << 32) | (uint64_t)(0xffffffffu - (uint32_t)i);
}

/* A chunk's first pass: its packed argmax and sum of exp(x - xmax) over
 * the chunk, xmax its own largest logit. */
typedef struct {
  unsigned long long best;
  float xmax, se;
} kcu_samp_part_t;

/* Radix selection of a threshold key among keys >= lo: the largest t with
 * weight(key >= t) >= target, where weight is a count (MASS false) or the
 * fixed-point probability mass. Returns lo when the total is below target. */
template <typename T, bool MASS>
__device__ uint32_t kcu_select(const T *x, int vocab, float inv_t, float zmax, float inv_z, uint32_t lo,
                               unsigned long long target, unsigned long long *hist, uint32_t *bc) {
  uint32_t prefix = 0, pmask = 0;
  for (int shift = 32 - KCU_RADIX_BITS; shift >= 0; shift -= KCU_RADIX_BITS) {
    for (int b = threadIdx.x; b < KCU_RADIX; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
      float z = kcu_f(x[i]) * inv_t;
      uint32_t k = kcu_fkey(z);
      if (k < lo || (k & pmask) != prefix) continue;
      unsigned long long w = MASS ? (unsigned long long)((double)__expf(z - zmax) * inv_z * KCU_MASS_ONE) : 1ull;
      atomicAdd(&hist[(k >> shift) & (KCU_RADIX - 1)], w);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      unsigned long long cum = 0;
      int sel = -1;
      for (int b = KCU_RADIX - 1; b >= 0; b--) {
        if (cum + hist[b] >= target) {
          sel = b;
          break;
        }
        cum += hist[b];
      }
      bc[0] = sel < 0 ? 0xffffffffu : (uint32_t)sel;
      if (sel >= 0) target -= cum;
      bc[1] = (uint32_t)(target >> 32);
      bc[2] = (uint32_t)target;
    }
    __syncthreads();
    uint32_t sel = bc[0];
    target = ((unsigned long long)bc[1] << 32) | bc[2];
    __syncthreads();
    if (sel == 0xffffffffu) return lo;
    prefix |= sel << shift;
    pmask |= (uint32_t)(KCU_RADIX - 1) << shift;
  }
  return prefix > lo ? prefix : lo;
}

#define KCU_TOP_CAND 128 /* candidates at the top-n threshold kept (ties beyond are dropped) */

/* The n most likely tokens of the raw logits and their logprobs, into
 * out[2 * j] (id) and out[2 * j + 1] (logprob bits), most likely first, ties
 * by the smaller id: a radix selection of the n-th largest key, the tokens
 * at or above it gathered in shared memory, then sorted by one thread. */
template <typename T>
__device__ void kcu_top_logprobs(const T *x, int vocab, int n, float xmax, float lse, int32_t *out,
                                 unsigned long long *hist, uint32_t *bc) {
  __shared__ uint64_t cand[KCU_TOP_CAND];
  __shared__ int n_cand;
  const uint32_t lo = kcu_select<T, false>(x, vocab, 1.f, xmax, 0.f, 0u, (unsigned long long)n, hist, bc);
  if (threadIdx.x == 0) n_cand = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float v = kcu_f(x[i]);
    if (kcu_fkey(v) < lo) continue;
    const int k = atomicAdd(&n_cand, 1);
    if (k < KCU_TOP_CAND) cand[k] = kcu_pack_arg(v, i);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const int m = min(n_cand, KCU_TOP_CAND);
    for (int j = 0; j < n && j < m; j++) {
      int b = j;
      for (int k = j + 1; k < m; k++)
        if (cand[k] > cand[b]) b = k;
      const uint64_t t = cand[b];
      cand[b] = cand[j];
      cand[j] = t;
      const int id = (int)(0xffffffffu - (uint32_t)t);
      out[2 * j] = id;
      out[2 * j + 1] = __float_as_int(kcu_f(x[id]) - lse);
    }
    for (int j = m; j < n; j++) out[2 * j] = -1, out[2 * j + 1] = __float_as_int(-INFINITY);
  }
  __syncthreads();
}

/* Bias and penalties (as model/sampler.c) on the row's listed tokens, in place: the
 * penalized logit is rounded to T like every logit; the raw one is kept in
 * the list for the logprob. Ends with a barrier. */
template <typename T> __device__ void kcu_apply_penalties(T *x, const kcu_sparams_t &p, kcu_pen_t *pe) {
  const bool rep = p.rep > 0.f && p.rep != 1.f;
  for (int k = threadIdx.x; k < p.n_pen; k += blockDim.x) {
    const int t = pe[k].token;
    float v = kcu_f(x[t]);
    pe[k].raw = v;
    v += pe[k].bias; /* logit bias and min_tokens bans first, as vLLM */
    if (rep && pe[k].count >= 0) v = v > 0.f ? v / p.rep : v * p.rep;
    if (pe[k].count > 0) v -= p.pres + p.freq * (float)pe[k].count;
    x[t] = kcu_t<T>(v);
  }
  __syncthreads();
}

/* Constrained decoding: -inf for every token the row's mask (n words)
 * does not allow, ids past the words included, in place. A warp's 32
 * threads read one word. Ends with a barrier. */
template <typename T> __device__ void kcu_apply_mask(T *x, int vocab, const uint32_t *mask, int n) {
  for (int i = threadIdx.x; i < vocab; i += blockDim.x)
    if (i / 32 >= n || !(__ldg(&mask[i / 32]) >> (i % 32) & 1u)) x[i] = kcu_t<T>(-INFINITY);
  __syncthreads();
}

/* The first pass over x[c0, c1): the packed argmax, its logit, and the
 * sum of exp(x - that logit) (online: the sum is rescaled when the running
 * max grows). c0 % 8 == 0. */
template <typename T>
__device__ kcu_samp_part_t kcu_samp_pass(const T *x, int vocab, int c0, int c1, uint64_t *red64, float *red) {
  uint64_t best = 0;
  float m = -INFINITY, se = 0.f;
  auto see = [&](float v, int i) {
    uint64_t a = kcu_pack_arg(v, i);
    best = a > best ? a : best;
    if (v > m) {
      se = se * __expf(m - v) + 1.f;
      m = v;
    } else if (v > -INFINITY) {
      se += __expf(v - m);
    }
  };
  if (vocab % 8 == 0 && ((uintptr_t)x & 15) == 0) {
    const uint4 *x8 = reinterpret_cast<const uint4 *>(x);
    for (int j = c0 / 8 + threadIdx.x; j < c1 / 8; j += blockDim.x) {
      float f[8];
      kcu_unpack8(x8[j], f, (const T *)0); /* not __ldg: penalties write x later */
#pragma unroll
      for (int e = 0; e < 8; e++) see(f[e], 8 * j + e);
    }
  } else {
    for (int i = c0 + threadIdx.x; i < c1; i += blockDim.x) see(kcu_f(x[i]), i);
  }
  kcu_samp_part_t r;
  r.best = kcu_bmax64(best, red64);
  r.xmax = r.best ? kcu_f(x[(int)(0xffffffffu - (uint32_t)r.best)]) : -INFINITY;
  r.se = kcu_bsum(m == -INFINITY ? 0.f : se * __expf(m - r.xmax), red);
  return r;
}

/* The row's n partials merged by its last CTA: the argmax of them all, its
 * logit, and the sum of exp(x - that logit) over the row. */
__device__ kcu_samp_part_t kcu_samp_merge(const kcu_samp_part_t *part, int n, uint64_t *red64, float *red) {
  kcu_samp_part_t q = {0ull, -INFINITY, 0.f};
  if ((int)threadIdx.x < n) q.best = __ldcg(&part[threadIdx.x].best), q.xmax = __ldcg(&part[threadIdx.x].xmax),
                            q.se = __ldcg(&part[threadIdx.x].se);
  kcu_samp_part_t r;
  r.best = kcu_bmax64(q.best, red64);
  float xmax = -INFINITY;
  for (int k = 0; k < n; k++) /* the winner's logit: a partial whose best is the row's */
    if (__ldcg(&part[k].best) == r.best) xmax = __ldcg(&part[k].xmax);
  r.xmax = xmax;
  r.se = kcu_bsum(q.se > 0.f ? q.se * __expf(q.xmax - xmax) : 0.f, red);
  return r;
}

/* Grid (rows, splits): CTA (row, k) takes chunk k of the row's first pass;
 * with one split it is the whole row. part / cnt: the rows' partials
 * (splits a row) and counters (0 between launches). */
template <typename T>
__global__ void __launch_bounds__(KCU_SAMP_NT)
    kcu_sample_k(T *logits, int vocab, const kcu_sparams_t *params, kcu_pen_t *pen, const uint32_t *masks,
                 int32_t *res, kcu_samp_part_t *part, int32_t *cnt) {
  KCU_TRACE_SCOPE(KCU_TR_SAMPLE);
  kcu_sparams_t pr = {}; /* thread 0: the row's params, read from host memory while the first pass runs */
  if (threadIdx.x == 0) pr = params[(int)blockIdx.x];
  kcu_pdl_enter();
  __shared__ kcu_sparams_t ps;
  __shared__ unsigned long long hist[KCU_RADIX];
  __shared__ uint64_t red64[KCU_SAMP_NT / KCU_WARP];
  __shared__ float red[KCU_SAMP_NT / KCU_WARP];
  __shared__ uint32_t bc[4];
  __shared__ float raw_tok;
  __shared__ int last;
  const int row = blockIdx.x, n_split = gridDim.y, k = blockIdx.y;
  T *x = logits + (size_t)row * vocab;
  const kcu_samp_part_t *rp = part + (size_t)row * n_split;

  /* the first pass, over chunk k (a multiple of 8 long) */
  const int chunk = (vocab / n_split + 8) & ~7;
  kcu_samp_part_t f = kcu_samp_pass(x, vocab, min(k * chunk, vocab), min((k + 1) * chunk, vocab), red64, red);
  if (n_split > 1) {
    if (threadIdx.x == 0) {
      part[(size_t)row * n_split + k] = f;
      __threadfence();
      last = atomicAdd(&cnt[row], 1) == n_split - 1;
      if (last) cnt[row] = 0; /* every CTA of the row has counted: ready for the next launch */
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    f = kcu_samp_merge(rp, n_split, red64, red);
  }
  if (threadIdx.x == 0) ps = pr;
  __syncthreads();
  const kcu_sparams_t p = ps;
  uint64_t best = f.best;
  int amax = (int)(0xffffffffu - (uint32_t)best);
  float xmax = f.xmax;
  const float lse = xmax + __logf(f.se);
  if (p.top_n > 0) kcu_top_logprobs(x, vocab, min(p.top_n, KERN_SAMPLE_MAX_TOP), xmax, lse,
                                    res + 2 * gridDim.x + (size_t)row * 2 * KERN_SAMPLE_MAX_TOP, hist, bc);
  if (p.n_pen > 0 || p.n_mask > 0) { /* the logprob stays that of the raw logits (as vLLM); the rest sees the
                                        penalized and masked ones */
    if (p.n_pen > 0) kcu_apply_penalties(x, p, pen + p.pen_off); /* first: it keeps the raw logits */
    if (p.n_mask > 0) kcu_apply_mask(x, vocab, masks + p.mask_off, p.n_mask);
    best = 0;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
      uint64_t a = kcu_pack_arg(kcu_f(x[i]), i);
      best = a > best ? a : best;
    }
    best = kcu_bmax64(best, red64);
    amax = (int)(0xffffffffu - (uint32_t)best);
    xmax = kcu_f(x[amax]);
  }

  int tok = amax;
  if (p.temperature > 0.f && p.top_k != 1) {
    const float inv_t = 1.f / p.temperature, zmax = xmax * inv_t;
    uint32_t lo = 0;
    if (p.min_p > 0.f) lo = kcu_fkey(zmax + __logf(fminf(p.min_p, 1.f)));
    if (p.top_k > 1 && p.top_k < vocab)
      lo = kcu_select<T, false>(x, vocab, inv_t, zmax, 0.f, lo, (unsigned long long)p.top_k, hist, bc);
    if (p.top_p > 0.f && p.top_p < 1.f) {
      float z_sum = 0.f;
      for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        float z = kcu_f(x[i]) * inv_t;
        if (kcu_fkey(z) >= lo) z_sum += __expf(z - zmax);
      }
      z_sum = kcu_bsum(z_sum, red);
      lo = kcu_select<T, true>(x, vocab, inv_t, zmax, 1.f / z_sum, lo,
                               (unsigned long long)((double)p.top_p * KCU_MASS_ONE), hist, bc);
    }
    uint64_t pick = 0;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
      float z = kcu_f(x[i]) * inv_t;
      if (kcu_fkey(z) < lo || z == -INFINITY) continue; /* masked or banned: never drawn */
      uint64_t h = kcu_splitmix(p.seed ^ kcu_splitmix(p.counter ^ kcu_splitmix((uint64_t)i)));
      /* u in (0, 1) exactly: 23 bits, so u < 1 in float; the inner log is
       * the accurate one, since the fast __logf of u near 1 can be 0, whose
       * Gumbel noise (+inf) would make any token, even a -inf one, win */
      float u = ((float)(h >> 41) + 0.5f) * (1.f / 8388608.f);
      uint64_t a = kcu_pack_arg(z - __logf(-logf(u)), i);
      pick = a > pick ? a : pick;
    }
    pick = kcu_bmax64(pick, red64);
    if (pick) tok = (int)(0xffffffffu - (uint32_t)pick);
  }
  if (threadIdx.x == 0) raw_tok = kcu_f(x[tok]);
  __syncthreads();
  for (int k = threadIdx.x; k < p.n_pen; k += blockDim.x) /* a penalized token's raw logit was kept */
    if (pen[p.pen_off + k].token == tok) raw_tok = pen[p.pen_off + k].raw;
  __syncthreads();
  if (threadIdx.x == 0) {
    res[2 * row] = tok;
    res[2 * row + 1] = __float_as_int(raw_tok - lse);
  }
}

/* CTAs a row's first pass takes: up to KCU_SAMP_SPLIT (c->samp_split when
 * set) while all of them fit one a SM, chunks of at least 2048 logits.
 * Splitting 128 and 256 rows (3 and 2 CTAs a row, a second wave) was no
 * faster on H200: a bf16 step 0.3-1% slower in one call, within the
 * card's spread in the next (docs/bench/gpu.md, session 40). */
static int kcu_samp_splits(const kcu_ctx_t *c, int n_rows, int vocab) {
  int sp = c->n_sm / n_rows;
  sp = FR_MIN(sp, c->samp_split > 0 ? c->samp_split : KCU_SAMP_SPLIT);
  return FR_MAX(FR_MIN(sp, vocab / 2048), 1);
}

/* Grows a device buffer of *cap elements of elem bytes to hold n, at least
 * twofold (its contents are lost); *grew says whether it did. */
static int kcu_dev_grow(kcu_ctx_t *c, size_t n, size_t elem, void **dev, size_t *cap, const char *what, bool *grew) {
  *grew = n > *cap;
  if (!*grew) return 0;
  const size_t want = FR_MAX(n, 2 * *cap);
  kcu__free(*dev);
  *dev = NULL;
  *cap = 0;
  int rc = kcu__alloc(c, want * elem, dev, what);
  if (!rc) *cap = want;
  return rc;
}

/* Room for the split first pass of n_rows rows in sp CTAs each: partials
 * and per-row counters (zeroed; the kernel leaves them at 0). */
static int kcu_samp_part_reserve(kcu_ctx_t *c, int n_rows, int sp) {
  if (sp <= 1) return 0;
  bool grew;
  int rc = kcu_dev_grow(c, (size_t)n_rows * sp, sizeof(kcu_samp_part_t), &c->samp_part, &c->samp_part_n,
                        "sampling partials", &grew);
  if (!rc) rc = kcu_dev_grow(c, (size_t)n_rows, sizeof(int32_t), (void **)&c->samp_cnt, &c->samp_cnt_n,
                             "sampling counters", &grew);
  if (!rc && grew) KCU_CHECK(cudaMemsetAsync(c->samp_cnt, 0, c->samp_cnt_n * sizeof(int32_t), c->stream));
  return rc;
}

/* result_dev: (token, logprob) per row, then KERN_SAMPLE_MAX_TOP (id,
 * logprob) per row for the rows that want top logprobs. */
static int kcu_sample_launch(kcu_ctx_t *c, const void *logits, int n_rows, int vocab, const void *params_dev,
                             void *pen_dev, const uint32_t *mask_dev, void *result_dev) {
  const int sp = kcu_samp_splits(c, n_rows, vocab);
  int rc = kcu_samp_part_reserve(c, n_rows, sp);
  if (rc) return rc;
  /* the logits are the step's scratch: rows with penalties or masks are rewritten */
  KCU_ACT_DISPATCH(c, KCU_LAUNCH(c, kcu_sample_k<T>, dim3(n_rows, sp), KCU_SAMP_NT, 0, (T *)logits, vocab,
                                 (const kcu_sparams_t *)params_dev, (kcu_pen_t *)pen_dev, mask_dev,
                                 (int32_t *)result_dev, (kcu_samp_part_t *)c->samp_part, c->samp_cnt));
  return 0;
}

/* ---- host side: penalty lists, parameters in, tokens out ---------------------------- */

static int kcu_cmp_i32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

/* The valid ids (0 <= id < vocab) of tok[0..n) into c->pen_sort + at, sorted. */
static size_t kcu_pen_sorted(kcu_ctx_t *c, size_t at, const int32_t *tok, int n, int vocab) {
  size_t m = 0;
  for (int i = 0; i < n; i++)
    if (tok[i] >= 0 && tok[i] < vocab) c->pen_sort[at + m++] = tok[i];
  qsort(c->pen_sort + at, m, sizeof(int32_t), kcu_cmp_i32);
  return m;
}

/* Grows a device buffer (dev NULL: none) and its pinned host twin (*cap
 * elements of elem bytes) to hold n elements, at least twofold; their
 * contents are lost. The sampler is never captured in a graph, so the
 * addresses may change. */
static int kcu_samp_grow(kcu_ctx_t *c, size_t n, size_t elem, void **dev, void **pin, size_t *cap, const char *what) {
  if (n <= *cap) return 0;
  size_t want = FR_MAX(n, 2 * *cap);
  if (dev) kcu__free(*dev), *dev = NULL;
  cudaFreeHost(*pin);
  *pin = NULL;
  *cap = 0;
  int rc = dev ? kcu__alloc(c, want * elem, dev, what) : 0;
  if (rc) return rc;
  KCU_CHECK(cudaMallocHost(pin, want * elem));
  *cap = want;
  return 0;
}

/* Grows the host and device penalty lists to hold n entries. */
static int kcu_pen_reserve(kcu_ctx_t *c, size_t n) {
  return kcu_samp_grow(c, n, sizeof(kcu_pen_t), (void **)&c->pen_dev, (void **)&c->pen_pin, &c->pen_cap,
                       "sampling penalty lists");
}

/* The min_tokens bans a row applies now (0 once it has enough output). */
static int kcu_pen_bans(const kern_sample_params_t *h) {
  return h->ban && h->n_output < h->min_tokens ? FR_MAX(h->n_ban, 0) : 0;
}

/* How many of a row's output and prompt tokens its penalties read; the
 * return value also counts its bias and ban entries. */
static size_t kcu_pen_inputs(const kern_sample_params_t *h, int *n_out, int *n_pr) {
  const bool rep = h->repetition_penalty > 0.f && h->repetition_penalty != 1.f;
  const bool pf = h->presence_penalty != 0.f || h->frequency_penalty != 0.f;
  *n_out = (rep || pf) && h->output ? FR_MAX(h->n_output, 0) : 0;
  *n_pr = rep && h->prompt ? FR_MAX(h->n_prompt, 0) : 0;
  const size_t n_bias = h->bias ? (size_t)FR_MAX(h->n_bias, 0) : 0;
  return (size_t)*n_out + (size_t)*n_pr + n_bias + (size_t)kcu_pen_bans(h);
}

static int kcu_cmp_pen(const void *a, const void *b) {
  const kcu_pen_t *x = (const kcu_pen_t *)a, *y = (const kcu_pen_t *)b;
  return (x->token > y->token) - (x->token < y->token);
}

/* Whether a row's bans leave a token its mask allows (true without a
 * mask): a grammar that must end now allows only EOS, and the mask wins
 * over min_tokens, as on the host (model/sampler.c). */
static bool kcu_bans_leave_some(const kern_sample_params_t *h, int vocab) {
  if (!h->allow || h->n_allow <= 0) return true;
  const int words = FR_MIN(h->n_allow, (vocab + 31) / 32);
  long allowed = 0, banned = 0;
  for (int w = 0; w < words; w++) {
    uint32_t m = h->allow[w];
    if (32 * w + 32 > vocab) m &= (1u << (vocab - 32 * w)) - 1u; /* the last word's ids past the vocabulary */
    allowed += __builtin_popcount(m);
  }
  for (int i = 0; h->ban && i < h->n_ban; i++) { /* distinct allowed ids among the bans */
    const int32_t t = h->ban[i];
    if (t < 0 || t >= vocab || t / 32 >= words || !(h->allow[t / 32] >> (t % 32) & 1u)) continue;
    bool dup = false;
    for (int j = 0; j < i && !dup; j++) dup = h->ban[j] == t;
    banned += !dup;
  }
  return allowed > banned;
}

/* Adds a row's logit biases and min_tokens bans to its k listed tokens at
 * e, then sorts the list by token and merges a token's entries into one
 * (the kernel writes each token from one thread). Returns the new count. */
static size_t kcu_pen_bias(const kern_sample_params_t *h, int vocab, kcu_pen_t *e, size_t k) {
  const int n_bias = h->bias ? h->n_bias : 0, n_ban = kcu_bans_leave_some(h, vocab) ? kcu_pen_bans(h) : 0;
  if (n_bias <= 0 && n_ban <= 0) return k;
  for (int i = 0; i < n_bias; i++)
    if (h->bias[i].token >= 0 && h->bias[i].token < vocab)
      e[k++] = (kcu_pen_t){.token = h->bias[i].token, .count = -1, .raw = 0.f, .bias = h->bias[i].bias};
  for (int i = 0; i < n_ban; i++)
    if (h->ban[i] >= 0 && h->ban[i] < vocab) e[k++] = (kcu_pen_t){.token = h->ban[i], .count = -1, .raw = 0.f, .bias = -INFINITY};
  qsort(e, k, sizeof *e, kcu_cmp_pen);
  size_t m = 0;
  for (size_t i = 0; i < k; i++) {
    if (m > 0 && e[m - 1].token == e[i].token) {
      e[m - 1].count = FR_MAX(e[m - 1].count, e[i].count);
      e[m - 1].bias += e[i].bias;
    } else {
      e[m++] = e[i];
    }
  }
  return m;
}

/* Lists a row's penalized tokens at c->pen_pin[*n_pen..] (room reserved for
 * its kcu_pen_inputs): each output token once with its count (capped at
 * 65535, as the host sampler), then, with a repetition penalty, each prompt
 * token that is not an output token with count 0; then its biases merged
 * in (kcu_pen_bias). */
static void kcu_pen_row(kcu_ctx_t *c, const kern_sample_params_t *h, int vocab, size_t *n_pen) {
  int n_out, n_pr;
  size_t need = kcu_pen_inputs(h, &n_out, &n_pr);
  if (!need) return;
  need = (size_t)n_out + (size_t)n_pr;
  if (need > c->pen_sort_cap) {
    c->pen_sort_cap = FR_MAX(need, 2 * c->pen_sort_cap);
    c->pen_sort = (int32_t *)fr_realloc(c->pen_sort, c->pen_sort_cap * sizeof(int32_t));
  }
  size_t no = kcu_pen_sorted(c, 0, h->output, n_out, vocab), np = kcu_pen_sorted(c, no, h->prompt, n_pr, vocab);
  const int32_t *o = c->pen_sort, *pr = c->pen_sort + no;
  kcu_pen_t *e = c->pen_pin + *n_pen;
  size_t k = 0;
  for (size_t i = 0; i < no;) { /* run lengths of the sorted output ids */
    size_t j = i;
    while (j < no && o[j] == o[i]) j++;
    e[k++] = (kcu_pen_t){.token = o[i], .count = (int32_t)FR_MIN(j - i, (size_t)UINT16_MAX), .raw = 0.f, .bias = 0.f};
    i = j;
  }
  for (size_t i = 0, j = 0; i < np; i++) { /* prompt ids not among the outputs (both sorted) */
    if (i > 0 && pr[i] == pr[i - 1]) continue;
    while (j < no && o[j] < pr[i]) j++;
    if (j < no && o[j] == pr[i]) continue;
    e[k++] = (kcu_pen_t){.token = pr[i], .count = 0, .raw = 0.f, .bias = 0.f};
  }
  *n_pen += kcu_pen_bias(h, vocab, e, k);
}

/* A row's mask words the kernel reads (those past the vocabulary are not). */
static int kcu_mask_words(const kern_sample_params_t *h, int vocab) {
  return h->allow && h->n_allow > 0 ? FR_MIN(h->n_allow, (vocab + 31) / 32) : 0;
}

/* Packs the rows' masks into c->mask_pin, row after row, and uploads them
 * to c->mask_dev (both grown to fit); sp[i].mask_off/n_mask say where a
 * row's are. */
static int kcu_mask_upload(kcu_ctx_t *c, const kern_sample_params_t *params_host, int n_rows, int vocab,
                           kcu_sparams_t *sp) {
  size_t n = 0;
  for (int i = 0; i < n_rows; i++) n += (size_t)kcu_mask_words(&params_host[i], vocab);
  if (n > INT32_MAX) return fr_errorf(FR_ETOOBIG, "cuda: sample: %zu mask words", n);
  int rc = kcu_samp_grow(c, n, sizeof(uint32_t), (void **)&c->mask_dev, (void **)&c->mask_pin, &c->mask_cap,
                         "sampling masks");
  if (rc) return rc;
  size_t at = 0;
  for (int i = 0; i < n_rows; i++) {
    const int w = kcu_mask_words(&params_host[i], vocab);
    sp[i].mask_off = (int32_t)at, sp[i].n_mask = w;
    if (w) memcpy(c->mask_pin + at, params_host[i].allow, (size_t)w * sizeof(uint32_t));
    at += (size_t)w;
  }
  if (n) KCU_CHECK(cudaMemcpyAsync(c->mask_dev, c->mask_pin, n * sizeof(uint32_t), cudaMemcpyHostToDevice, c->stream));
  return 0;
}

int kcu__sample(kcu_ctx_t *c, const void *logits, int n_rows, int vocab, const kern_sample_params_t *params_host,
                int32_t *tokens_host, float *logprobs_host) {
  int rc = kcu__not_capturing(c, "sample");
  if (rc || n_rows <= 0) return rc;
  if (vocab <= 0) return fr_errorf(FR_EFORMAT, "cuda: sample: vocab %d", vocab);
  /* params in; (token, logprob) out, then the top (id, logprob) pairs */
  const size_t top_b = 8 * KERN_SAMPLE_MAX_TOP, row_b = sizeof(kcu_sparams_t) + 8 + top_b;
  if ((rc = kcu_samp_grow(c, (size_t)n_rows, row_b, NULL, &c->samp_pin, &c->samp_cap, "sample buffers"))) return rc;
  /* the previous sample's uploads have finished: it synchronized */
  size_t bound = 0; /* penalty list entries at most */
  for (int i = 0; i < n_rows; i++) {
    int n_out, n_pr;
    bound += kcu_pen_inputs(&params_host[i], &n_out, &n_pr);
  }
  if (bound > INT32_MAX) return fr_errorf(FR_ETOOBIG, "cuda: sample: %zu penalized tokens", bound);
  if ((rc = kcu_pen_reserve(c, bound))) return rc;
  kcu_sparams_t *sp = (kcu_sparams_t *)c->samp_pin;
  size_t n_pen = 0;
  for (int i = 0; i < n_rows; i++) {
    const kern_sample_params_t *h = &params_host[i];
    size_t at = n_pen;
    kcu_pen_row(c, h, vocab, &n_pen);
    sp[i] = (kcu_sparams_t){.temperature = h->temperature, .top_p = h->top_p, .min_p = h->min_p, .top_k = h->top_k,
                            .seed = h->seed, .counter = h->counter, .rep = h->repetition_penalty,
                            .pres = h->presence_penalty, .freq = h->frequency_penalty, .pen_off = (int32_t)at,
                            .n_pen = (int32_t)(n_pen - at),
                            .top_n = h->top_ids && h->top_lp ? FR_MAX(FR_MIN(h->top_n, KERN_SAMPLE_MAX_TOP), 0) : 0};
  }
  if ((rc = kcu_mask_upload(c, params_host, n_rows, vocab, sp))) return rc;
  /* The kernel reads the params from the pinned buffer and writes the
   * results there itself, over the bus: two copies fewer between a step's
   * logits and its tokens on the host (docs/bench/gpu.md, session 41). With
   * unified addressing (kcu_ctx_init requires it) the buffer's host address
   * is its device address. */
  size_t pb = sizeof(kcu_sparams_t) * n_rows;
  char *res_pin = (char *)c->samp_pin + pb;
  if (n_pen)
    KCU_CHECK(cudaMemcpyAsync(c->pen_dev, c->pen_pin, n_pen * sizeof(kcu_pen_t), cudaMemcpyHostToDevice, c->stream));
  if ((rc = kcu_sample_launch(c, logits, n_rows, vocab, c->samp_pin, c->pen_dev, c->mask_dev, res_pin))) return rc;
  KCU_CHECK(cudaStreamSynchronize(c->stream));
  const int32_t *r = (const int32_t *)res_pin, *top = r + 2 * (size_t)n_rows;
  for (int i = 0; i < n_rows; i++) {
    tokens_host[i] = r[2 * i];
    if (logprobs_host) memcpy(&logprobs_host[i], &r[2 * i + 1], 4);
    const int32_t *t = top + (size_t)i * 2 * KERN_SAMPLE_MAX_TOP;
    for (int j = 0; j < sp[i].top_n; j++) {
      params_host[i].top_ids[j] = t[2 * j];
      memcpy(&params_host[i].top_lp[j], &t[2 * j + 1], 4);
    }
  }
  return 0;
}
