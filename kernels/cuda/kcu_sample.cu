/* kcu_sample.cu - on-device sampling, one CTA per row of logits.
 *
 * Penalties first (repetition over the prompt and output tokens, presence
 * and frequency over the output tokens; the host lists each row's tokens
 * with their output counts), rewriting those logits in place. Then greedy
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
 */
#include <math.h>

#include "kernels/cuda/kcu.cuh"

#define KCU_SAMP_NT 1024
#define KCU_MASS_ONE 1099511627776.0 /* 2^40 */

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

template <typename T> struct kcu_red_t {
  T v[32];
};

__device__ float kcu_bsum(float v, float *red) {
  v = kcu_warp_sum(v);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  v = threadIdx.x < KCU_SAMP_NT / 32 ? red[threadIdx.x] : 0.f;
  if (threadIdx.x < 32) v = kcu_warp_sum(v);
  if (threadIdx.x == 0) red[0] = v;
  __syncthreads();
  v = red[0];
  __syncthreads();
  return v;
}

/* Max of packed (key << 32 | ~index): largest value, smallest index on ties. */
__device__ uint64_t kcu_bmax64(uint64_t v, uint64_t *red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    uint64_t w = __shfl_xor_sync(0xffffffffu, v, o);
    v = w > v ? w : v;
  }
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < KCU_SAMP_NT / 32 ? red[threadIdx.x] : 0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
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

/* Radix selection of a threshold key among keys >= lo: the largest t with
 * weight(key >= t) >= target, where weight is a count (MASS false) or the
 * fixed-point probability mass. Returns lo when the total is below target. */
template <typename T, bool MASS>
__device__ uint32_t kcu_select(const T *x, int vocab, float inv_t, float zmax, float inv_z, uint32_t lo,
                               unsigned long long target, unsigned long long *hist, uint32_t *bc) {
  uint32_t prefix = 0, pmask = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
      float z = kcu_f(x[i]) * inv_t;
      uint32_t k = kcu_fkey(z);
      if (k < lo || (k & pmask) != prefix) continue;
      unsigned long long w = MASS ? (unsigned long long)((double)__expf(z - zmax) * inv_z * KCU_MASS_ONE) : 1ull;
      atomicAdd(&hist[(k >> shift) & 255], w);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      unsigned long long cum = 0;
      int sel = -1;
      for (int b = 255; b >= 0; b--) {
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
    pmask |= 255u << shift;
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

/* Penalties (as model/sampler.c) on the row's listed tokens, in place: the
 * penalized logit is rounded to T like every logit; the raw one is kept in
 * the list for the logprob. Ends with a barrier. */
template <typename T> __device__ void kcu_apply_penalties(T *x, const kcu_sparams_t &p, kcu_pen_t *pe) {
  const bool rep = p.rep > 0.f && p.rep != 1.f;
  for (int k = threadIdx.x; k < p.n_pen; k += blockDim.x) {
    const int t = pe[k].token;
    float v = kcu_f(x[t]);
    pe[k].raw = v;
    if (rep) v = v > 0.f ? v / p.rep : v * p.rep;
    if (pe[k].count) v -= p.pres + p.freq * (float)pe[k].count;
    x[t] = kcu_t<T>(v);
  }
  __syncthreads();
}

template <typename T>
__global__ void __launch_bounds__(KCU_SAMP_NT)
    kcu_sample_k(T *logits, int vocab, const kcu_sparams_t *params, kcu_pen_t *pen, int32_t *res) {
  kcu_pdl_enter();
  __shared__ unsigned long long hist[256];
  __shared__ uint64_t red64[32];
  __shared__ float red[32];
  __shared__ uint32_t bc[4];
  __shared__ float raw_tok;
  const int row = blockIdx.x;
  T *x = logits + (size_t)row * vocab;
  const kcu_sparams_t p = params[row];

  /* one pass: argmax and the log-sum-exp (online: the sum is rescaled when
   * the running max grows) */
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
    for (int j = threadIdx.x; j < vocab / 8; j += blockDim.x) {
      float f[8];
      kcu_unpack8(x8[j], f, (const T *)0); /* not __ldg: penalties write x below */
#pragma unroll
      for (int e = 0; e < 8; e++) see(f[e], 8 * j + e);
    }
  } else {
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) see(kcu_f(x[i]), i);
  }
  best = kcu_bmax64(best, red64);
  int amax = (int)(0xffffffffu - (uint32_t)best);
  float xmax = kcu_f(x[amax]);
  const float lse = xmax + __logf(kcu_bsum(m == -INFINITY ? 0.f : se * __expf(m - xmax), red));
  if (p.top_n > 0) kcu_top_logprobs(x, vocab, min(p.top_n, KERN_SAMPLE_MAX_TOP), xmax, lse,
                                    res + 2 * gridDim.x + (size_t)row * 2 * KERN_SAMPLE_MAX_TOP, hist, bc);
  if (p.n_pen > 0) { /* the logprob stays that of the raw logits (as vLLM); the rest sees the penalized ones */
    kcu_apply_penalties(x, p, pen + p.pen_off);
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
      if (kcu_fkey(z) < lo) continue;
      uint64_t h = kcu_splitmix(p.seed ^ kcu_splitmix(p.counter ^ kcu_splitmix((uint64_t)i)));
      float u = ((float)(h >> 40) + 0.5f) * (1.f / 16777216.f);
      uint64_t a = kcu_pack_arg(z - __logf(-__logf(u)), i);
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

int kcu__sample(kcu_ctx_t *c, const void *logits, int n_rows, int vocab, const void *params_dev, void *pen_dev,
                void *result_dev) {
  /* the logits are the step's scratch: rows with penalties are rewritten */
  KCU_ACT_DISPATCH(c, KCU_LAUNCH(c, kcu_sample_k<T>, n_rows, KCU_SAMP_NT, 0, (T *)logits, vocab,
                                 (const kcu_sparams_t *)params_dev, (kcu_pen_t *)pen_dev, (int32_t *)result_dev));
  return 0;
}
