/* cpu_attn.c - paged causal attention with GQA over the step's sequences.
 *
 * Work items are (token, head) pairs, taken from an atomic counter. A query
 * of sequence s at index i of its n_q new tokens sits at position
 * p = ctx_len - n_q + i and attends to keys lo..p (lo = 0, or p - window + 1
 * with a sliding window), walked block by block through the block table.
 *
 * Numerics follow llama.cpp's CPU attention (without flash attention), so
 * that greedy decoding agrees with it: scores in f32 over all keys, softmax
 * normalized in f32, then P @ V. With an f16 KV cache, llama.cpp's matmuls
 * convert the other operand to f16 first: the query before Q.K and the
 * probabilities before P.V; so do we.
 *
 * A quantized cache (int8 or FP8 E4M3 bytes, an f16 scale per token and KV
 * head) is read as it is: each dot converts the bytes to f32 in registers
 * (cpu_isa_t's dot_i8 / dot_e4m3) and multiplies by the row's scale; P.V
 * adds p * scale times the row (axpy_i8 / axpy_e4m3). The query and the
 * probabilities stay f32. */
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "kernels/cpu/cpu.h"

/* A sequence with more new queries than this in a step skips the KV
 * prefetch (cpu__attn_prefetch): decode (1) and speculative verification
 * (a few) read K/V from memory, a prefill chunk from cache. */
#define CPU_ATTN_PREFETCH_MAX_Q 8

typedef struct {
  const cpu_ctx_t *ctx;
  float *out;             /* (n_tokens, n_heads * head_dim) */
  const float *q;         /* (n_tokens, q_stride) */
  int q_stride, n_heads, head_dim, group;
  const uint8_t *kb, *vb; /* this layer's K and V */
  const uint16_t *ks, *vs; /* their f16 scales, (slots, n_kv_heads); quantized pools only */
  int block_size, n_kv_heads;
  bool f16;
  kern_kv_dtype_t dtype;
  size_t es;              /* bytes per element */
  float scale;
  int window;             /* 0, or the keys a query sees (itself included) */
  bool prefetch;          /* the next block's rows asked for while one block is read (cpu_ctx_t.prefetch) */
  size_t scratch_stride; /* floats per thread */
  long n_items;
  atomic_long next;
} cpu_attn_job_t;

/* Scores of one block's keys for query qv: s[o] = scale * q.k, keys at
 * element (row0 + o) * kvd of kh (this head's K). */
static void cpu__attn_scores(const cpu_attn_job_t *j, const uint8_t *kh, const float *qv, size_t row0, int n,
                             float *s) {
  const cpu_isa_t *isa = j->ctx->isa;
  const size_t kvd = (size_t)j->n_kv_heads * (size_t)j->head_dim;
  if (j->f16 && isa->scores_f16) {
    isa->scores_f16(j->head_dim, (const uint16_t *)kh + row0 * kvd, kvd, n, qv, j->scale, s);
    return;
  }
  for (int o = 0; o < n; o++) {
    size_t e = (row0 + (size_t)o) * kvd;
    s[o] = j->scale * (j->f16 ? isa->dot_f16(j->head_dim, (const uint16_t *)kh + e, qv)
                              : isa->dot_f32(j->head_dim, (const float *)kh + e, qv));
  }
}

/* The same over a quantized cache: kh is this head's bytes, ksc its scales
 * (stride n_kv_heads). */
static void cpu__attn_scores_q(const cpu_attn_job_t *j, const uint8_t *kh, const uint16_t *ksc, const float *qv,
                               size_t row0, int n, float *s) {
  const cpu_isa_t *isa = j->ctx->isa;
  const size_t kvd = (size_t)j->n_kv_heads * (size_t)j->head_dim;
  for (int o = 0; o < n; o++) {
    const size_t r = row0 + (size_t)o;
    const float d = j->dtype == KERN_KV_INT8 ? isa->dot_i8(j->head_dim, (const int8_t *)kh + r * kvd, qv)
                                             : isa->dot_e4m3(j->head_dim, kh + r * kvd, qv);
    s[o] = j->scale * fr_fp16_to_fp32(ksc[r * (size_t)j->n_kv_heads]) * d;
  }
}

/* acc += p * V row i (element offset e, scale index si). */
static inline void cpu__attn_pv(const cpu_attn_job_t *j, float p, size_t e, size_t si, float *acc) {
  const cpu_isa_t *isa = j->ctx->isa;
  const int hd = j->head_dim;
  switch (j->dtype) {
  case KERN_KV_INT8: isa->axpy_i8(hd, p * fr_fp16_to_fp32(j->vs[si]), (const int8_t *)j->vb + e, acc); return;
  case KERN_KV_FP8: isa->axpy_e4m3(hd, p * fr_fp16_to_fp32(j->vs[si]), j->vb + e, acc); return;
  default:
    if (j->f16) isa->axpy_f16(hd, p, (const uint16_t *)j->vb + e, acc);
    else isa->axpy_f32(hd, p, (const float *)j->vb + e, acc);
  }
}

/* Rounds x to the nearest f16 value (what ggml's f16 vec_dot sees). */
static inline float cpu__round_f16(float x) { return fr_fp16_to_fp32(fr_fp32_to_fp16(x)); }

/* acc += p(i) * V row i for the keys i0..i0+n-1 of one block (slots row0
 * onwards), p(i) = e[i] * inv (rounded to f16 over an f16 cache). */
static void cpu__attn_pv_block(const cpu_attn_job_t *j, const float *e, float inv, size_t row0, int n, size_t kvh,
                               float *acc) {
  const size_t kvd = (size_t)j->n_kv_heads * (size_t)j->head_dim;
  const cpu_isa_t *isa = j->ctx->isa;
  if (j->f16 && isa->pv_f16) {
    isa->pv_f16(j->head_dim, e, inv, (const uint16_t *)j->vb + row0 * kvd + kvh * (size_t)j->head_dim, kvd, n, acc);
    return;
  }
  for (int o = 0; o < n; o++) {
    const float p = j->f16 ? cpu__round_f16(e[o] * inv) : e[o] * inv;
    const size_t slot = row0 + (size_t)o;
    cpu__attn_pv(j, p, slot * kvd + kvh * (size_t)j->head_dim, slot * (size_t)j->n_kv_heads + kvh, acc);
  }
}

/* Asks for the cache lines of one head's rows (head_dim elements at
 * kvd-element strides) in the block of slots starting at row0: a decode
 * step streams every sequence's K and V from memory, block by block in the
 * block table's order, which the hardware prefetchers cannot follow from
 * one block to the next (Llama-style SmolLM2 at batch 16 and contexts near
 * 450: 68-72 -> 62-63 ms a step on a 2-core AVX-512 Xeon, session 20). */
static inline __attribute__((always_inline)) void cpu__attn_prefetch(const cpu_attn_job_t *j, const uint8_t *head,
                                                                     size_t row0) {
  const size_t row_bytes = (size_t)j->n_kv_heads * (size_t)j->head_dim * j->es, hb = (size_t)j->head_dim * j->es;
  const uint8_t *p = head + row0 * row_bytes;
  for (int o = 0; o < j->block_size; o++, p += row_bytes)
    for (size_t c = 0; c < hb; c += 64) __builtin_prefetch(p + c);
}

static void cpu__attn_item(const cpu_attn_job_t *j, long item, float *scratch) {
  const cpu_ctx_t *ctx = j->ctx;
  const int t = (int)(item / j->n_heads), h = (int)(item % j->n_heads), hd = j->head_dim;
  float *o = j->out + (size_t)t * (size_t)j->n_heads * (size_t)hd + (size_t)h * (size_t)hd;
  const int s = ctx->tok_seq[t];
  if (s < 0 || ctx->ctx_len[s] == 0) {
    memset(o, 0, (size_t)hd * sizeof(float));
    return;
  }
  const int n_q = ctx->q_start[s + 1] - ctx->q_start[s];
  const int pos = ctx->ctx_len[s] - n_q + (t - ctx->q_start[s]);
  const int32_t *bt = ctx->block_tables + (size_t)s * (size_t)ctx->max_blocks;
  const size_t kvh = (size_t)(h / j->group);
  const uint8_t *kh = j->kb + kvh * (size_t)hd * j->es;
  /* Only a sequence's few new queries stream its K/V from memory: a
   * prefill's many read rows they (or their neighbours) just wrote. */
  const bool prefetch = j->prefetch && n_q <= CPU_ATTN_PREFETCH_MAX_Q;
  float *qv = scratch, *acc = scratch + hd, *sc = scratch + 2 * (size_t)hd; /* sc: (pos + 1) scores */
  const float *q = j->q + (size_t)t * (size_t)j->q_stride + (size_t)h * (size_t)hd;
  for (int d = 0; d < hd; d++) qv[d] = j->f16 ? cpu__round_f16(q[d]) : q[d];
  const int lo = j->window > 0 ? FR_MAX(pos - j->window + 1, 0) : 0;
  for (int b = lo / j->block_size; b * j->block_size <= pos; b++) {
    const int n = FR_MIN(j->block_size, pos + 1 - b * j->block_size);
    const size_t row0 = (size_t)bt[b] * (size_t)j->block_size;
    if (prefetch && (b + 1) * j->block_size <= pos)
      cpu__attn_prefetch(j, kh, (size_t)bt[b + 1] * (size_t)j->block_size);
    if (j->ks) cpu__attn_scores_q(j, kh, j->ks + kvh, qv, row0, n, sc + b * j->block_size);
    else cpu__attn_scores(j, kh, qv, row0, n, sc + b * j->block_size);
  }
  float m = -INFINITY;
  for (int i = lo; i <= pos; i++) m = sc[i] > m ? sc[i] : m; /* fmaxf (a NaN score is skipped), inline */
  ctx->isa->exp_shift(pos + 1 - lo, sc + lo, m, 1.0f, sc + lo);
  double sum = 0;
  for (int i = lo; i <= pos; i++) sum += sc[i];
  const float inv = (float)(1.0 / sum);
  memset(acc, 0, (size_t)hd * sizeof(float));
  for (int i = lo; i <= pos;) { /* block by block, from lo (which may sit inside a block) */
    const int b = i / j->block_size, off = i % j->block_size;
    const int n = FR_MIN(j->block_size - off, pos + 1 - i);
    if (prefetch && (b + 1) * j->block_size <= pos)
      cpu__attn_prefetch(j, j->vb + kvh * (size_t)hd * j->es, (size_t)bt[b + 1] * (size_t)j->block_size);
    cpu__attn_pv_block(j, sc + i, inv, (size_t)bt[b] * (size_t)j->block_size + (size_t)off, n, kvh, acc);
    i += n;
  }
  memcpy(o, acc, (size_t)hd * sizeof(float));
}

static void cpu__attn_part(void *arg, int ith, int nth) {
  cpu_attn_job_t *j = arg;
  float *scratch = j->ctx->att_scratch + (size_t)ith * j->scratch_stride;
  for (long it = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed); it < j->n_items;
       it = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed))
    cpu__attn_item(j, it, scratch);
}

/* Every block a query may touch must be a real block of the pool; with a
 * window, the entries wholly before the first query's window are never
 * read and may also be -1 (released by the engine: kv_seq_release_before). */
static int cpu__attn_check_tables(const cpu_ctx_t *ctx, const kern_kv_config_t *c, int window) {
  for (int s = 0; s < ctx->n_seqs; s++) {
    const int len = ctx->ctx_len[s];
    if (len == 0) continue;
    const long nb = ((long)len + c->block_size - 1) / c->block_size;
    if (nb > ctx->max_blocks)
      return fr_errorf(-EINVAL, "attention: sequence %d needs %ld blocks, table has %d", s, nb, ctx->max_blocks);
    const int32_t *bt = ctx->block_tables + (size_t)s * (size_t)ctx->max_blocks;
    const int first = len - (ctx->q_start[s + 1] - ctx->q_start[s]); /* the first query's position */
    const long lo = window > 0 ? FR_MAX(first - window + 1, 0) : 0;
    for (long b = 0; b < nb; b++)
      if ((bt[b] < 0 || bt[b] >= c->n_blocks) && !(bt[b] == -1 && b < lo / c->block_size))
        return fr_errorf(-EINVAL, "attention: sequence %d block %ld is %d (pool has %d)", s, b, bt[b], c->n_blocks);
  }
  return 0;
}

int cpu__attention(void *vctx, void *out, const void *q, int q_stride, const kern_kv_pool_t *pool, int layer,
                   int n_heads, int head_dim, float scale, int window) {
  cpu_ctx_t *ctx = vctx;
  const kern_kv_config_t *c = &pool->cfg;
  if (layer < 0 || layer >= c->n_layers || head_dim != c->head_dim || n_heads <= 0 || n_heads % c->n_kv_heads ||
      q_stride < n_heads * head_dim || !pool->base)
    return fr_errorf(-EINVAL, "attention: bad shape (layer %d, heads %d/%d, head_dim %d/%d, q_stride %d)", layer,
                     n_heads, c->n_kv_heads, head_dim, c->head_dim, q_stride);
  int rc = cpu__attn_check_tables(ctx, c, window);
  if (rc) return rc;
  cpu_attn_job_t j = {.ctx = ctx, .out = out, .q = q, .q_stride = q_stride, .n_heads = n_heads,
                      .head_dim = head_dim, .group = n_heads / c->n_kv_heads, .block_size = c->block_size,
                      .n_kv_heads = c->n_kv_heads, .dtype = c->dtype, .scale = scale,
                      .window = FR_MAX(window, 0), .prefetch = ctx->prefetch != 0};
  j.f16 = c->dtype == KERN_KV_AUTO && c->type == KERN_F16;
  j.es = c->dtype != KERN_KV_AUTO ? 1 : j.f16 ? 2 : 4;
  j.kb = kern_kv_pool_elems(pool, layer, 0);
  j.vb = kern_kv_pool_elems(pool, layer, 1);
  j.ks = kern_kv_pool_scales(pool, layer, 0);
  j.vs = kern_kv_pool_scales(pool, layer, 1);
  int max_ctx = 0;
  for (int i = 0; i < ctx->n_seqs; i++) max_ctx = FR_MAX(max_ctx, ctx->ctx_len[i]);
  const size_t n_sc = ((size_t)max_ctx + (size_t)c->block_size - 1) / (size_t)c->block_size * (size_t)c->block_size;
  j.scratch_stride = (n_sc + 2 * (size_t)head_dim + 15) & ~(size_t)15;
  cpu__scratch_reserve((void **)&ctx->att_scratch, &ctx->att_cap,
                       j.scratch_stride * (size_t)ctx->n_threads * sizeof(float));
  j.n_items = (long)ctx->n_tokens * n_heads;
  atomic_init(&j.next, 0);
  if (ctx->n_threads == 1 || j.n_items < 2) cpu__attn_part(&j, 0, 1);
  else fr_pool_run(ctx->pool, cpu__attn_part, &j);
  return 0;
}
