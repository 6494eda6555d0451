/* kcu_backend.cu - the CUDA backend: creation, memory, KV pool, step
 * metadata, CUDA graphs and the ops table. Weight loading lives in
 * kcu_weights.cu, the sampler (device and host side) in kcu_sample.cu, the
 * other kernels in kcu_ops.cu, kcu_matmul.cu and kcu_attn.cu. */
#include <stdlib.h>
#include <string.h>

#include "common/fr_log.h"
#include "common/fr_util.h"
#include "kernels/cuda/kcu.cuh"

/* Smallest capacities of the step metadata (tokens, sequences, block table
 * entries), made at create so that small steps never grow it (growing
 * drops the captured graphs). */
#define KCU_META_MIN_TOKENS 256
#define KCU_META_MIN_SEQS 64
#define KCU_META_MIN_BT 4096

int kcu__alloc(kcu_ctx_t *c, size_t bytes, void **out, const char *what) {
  (void)c;
  *out = NULL;
  if (bytes == 0) bytes = 16;
  cudaError_t e = cudaMalloc(out, bytes);
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    return fr_errorf(FR_EDEVOOM, "cuda: out of device memory allocating %zu bytes for %s (%zu of %zu MiB free)",
                     bytes, what, free_b >> 20, total_b >> 20);
  }
  KCU_CHECK(e);
  return 0;
}

void kcu__free(void *p) {
  if (p) cudaFree(p);
}

int kcu__not_capturing(kcu_ctx_t *c, const char *what) {
  if (c->capturing) return fr_errorf(FR_ESTATE, "cuda: %s is not allowed inside graph capture", what);
  return 0;
}

/* ---- memory ---------------------------------------------------------------- */

static int kcu_alloc(void *ctx, size_t bytes, void **out) {
  kcu_ctx_t *c = (kcu_ctx_t *)ctx;
  int rc = kcu__not_capturing(c, "alloc");
  return rc ? rc : kcu__alloc(c, bytes, out, "alloc");
}

static void kcu_free(void *ctx, void *p) {
  (void)ctx;
  kcu__free(p);
}

static int kcu_upload(void *ctx, void *dst, const void *src_host, size_t bytes) {
  kcu_ctx_t *c = (kcu_ctx_t *)ctx;
  int rc = kcu__not_capturing(c, "upload");
  if (rc) return rc;
  kcu__x8_drop(c);
  KCU_CHECK(cudaMemcpyAsync(dst, src_host, bytes, cudaMemcpyHostToDevice, c->stream));
  KCU_CHECK(cudaStreamSynchronize(c->stream));
  return 0;
}

static int kcu_download(void *ctx, void *dst_host, const void *src, size_t bytes) {
  kcu_ctx_t *c = (kcu_ctx_t *)ctx;
  int rc = kcu__not_capturing(c, "download");
  if (rc) return rc;
  KCU_CHECK(cudaMemcpyAsync(dst_host, src, bytes, cudaMemcpyDeviceToHost, c->stream));
  KCU_CHECK(cudaStreamSynchronize(c->stream));
  return 0;
}

static int kcu_copy(void *ctx, void *dst, const void *src, size_t bytes) {
  kcu_ctx_t *c = (kcu_ctx_t *)ctx;
  kcu__x8_drop(c);
  KCU_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream));
  return 0;
}

static int kcu_sync(void *ctx) {
  kcu_ctx_t *c = (kcu_ctx_t *)ctx;
  int rc = kcu__not_capturing(c, "sync");
  if (rc) return rc;
  KCU_CHECK(cudaStreamSynchronize(c->stream));
  return 0;
}

static int kcu_mem_info(void *ctx, size_t *free_bytes, size_t *total_bytes) {
  (void)ctx; /* the context's device is current on this thread (kcu_ctx_init) */
  KCU_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
  return 0;
}

/* ---- weights (kcu_weights.cu) ------------------------------------------------ */

static bool kcu_supports_type(void *ctx, kern_type_t t) {
  (void)ctx;
  return kcu__supports_type(t);
}

static int kcu_weight_load(void *ctx, kern_weight_t *w, const void *host_data) {
  return kcu__weight_load((kcu_ctx_t *)ctx, w, host_data);
}

static int kcu_weight_load_file(void *ctx, kern_weight_t *w, const kern_file_span_t *spans, int n_spans) {
  return kcu__weight_load_file((kcu_ctx_t *)ctx, w, spans, n_spans);
}

static int kcu_load_end(void *ctx) { return kcu__load_end((kcu_ctx_t *)ctx); }

static void kcu_weight_release(void *ctx, kern_weight_t *w) {
  (void)ctx;
  kcu__weight_release(w);
}

/* ---- KV pool ---------------------------------------------------------------- */

static int kcu_kv_pool_init(void *ctx, kern_kv_pool_t *pool, const kern_kv_config_t *cfg, void *external) {
  kcu_ctx_t *c = (kcu_ctx_t *)ctx;
  int rc = kcu__not_capturing(c, "kv_pool_init");
  if (rc) return rc;
  memset(pool, 0, sizeof(*pool));
  const bool quant = cfg->dtype != KERN_KV_AUTO;
  if (!quant && cfg->type != c->act)
    return fr_errorf(FR_EUNSUPPORTED, "cuda: KV type %d must equal the activation type %d", (int)cfg->type,
                     (int)c->act);
  const int align = quant ? 16 : 8; /* whole 16-byte chunks a block row (kcu_kv_copy) */
  if (cfg->head_dim % align || cfg->n_layers <= 0 || cfg->n_kv_heads <= 0 || cfg->block_size <= 0 ||
      cfg->n_blocks <= 0)
    return fr_errorf(FR_EUNSUPPORTED, "cuda: KV config not supported (head_dim %d must be a multiple of %d)",
                     cfg->head_dim, align);
  size_t bytes = kern_kv_pool_bytes(cfg);
  if (bytes == 0) return fr_errorf(FR_ETOOBIG, "cuda: KV pool size overflows");
  void *base = external;
  if (!base && (rc = kcu__alloc(c, bytes, &base, "KV pool"))) return rc;
  kern_kv_pool_layout(pool, cfg, base, external != NULL);
  if (c->kv_tmap_base == base) c->kv_tmap_base = NULL; /* a new shape at an old address */
  KCU_CHECK(cudaMemsetAsync(pool->base, 0, bytes, c->stream));
  KCU_CHECK(cudaStreamSynchronize(c->stream));
  c->pool_block_size = cfg->block_size;
  c->pools_kv_min = c->pools_kv_min ? FR_MIN(c->pools_kv_min, cfg->n_kv_heads) : cfg->n_kv_heads;
  c->pools_kv_max = FR_MAX(c->pools_kv_max, cfg->n_kv_heads);
  c->pools_hd_max = FR_MAX(c->pools_hd_max, cfg->head_dim);
  c->pools_bs_max = FR_MAX(c->pools_bs_max, cfg->block_size);
  c->kvd_quant = c->kvd_quant || quant;
  c->kvd_row = FR_MAX(c->kvd_row, cfg->n_kv_heads * cfg->head_dim);
  return 0;
}

static void kcu_kv_pool_deinit(void *ctx, kern_kv_pool_t *pool) {
  kcu_ctx_t *c = (kcu_ctx_t *)ctx;
  if (c->kv_tmap_base == pool->base) c->kv_tmap_base = NULL;
  if (!pool->external) kcu__free(pool->base);
  pool->base = NULL;
}

static int kcu_kv_copy_blocks(void *ctx, kern_kv_pool_t *pool, const int32_t *pairs_host, int n_pairs) {
  kcu_ctx_t *c = (kcu_ctx_t *)ctx;
  int rc = kcu__not_capturing(c, "kv_copy_blocks");
  if (rc || n_pairs <= 0) return rc;
  for (int i = 0; i < 2 * n_pairs; i++)
    if (pairs_host[i] < 0 || pairs_host[i] >= pool->cfg.n_blocks)
      return fr_errorf(FR_EFORMAT, "cuda: kv_copy_blocks: block %d out of range", pairs_host[i]);
  if (n_pairs > c->pairs_cap) {
    kcu__free(c->pairs_dev);
    c->pairs_dev = NULL;
    c->pairs_cap = 0;
    if ((rc = kcu__alloc(c, (size_t)n_pairs * 8, (void **)&c->pairs_dev, "kv copy pairs"))) return rc;
    c->pairs_cap = n_pairs;
  }
  KCU_CHECK(cudaMemcpyAsync(c->pairs_dev, pairs_host, (size_t)n_pairs * 8, cudaMemcpyHostToDevice, c->stream));
  rc = kcu__kv_copy(c, pool, c->pairs_dev, n_pairs);
  if (rc) return rc;
  KCU_CHECK(cudaStreamSynchronize(c->stream)); /* pairs_host may be reused by the caller */
  return 0;
}

/* ---- step metadata ----------------------------------------------------------- */

void kcu__graphs_drop(kcu_ctx_t *c) {
  for (int i = 0; i < c->n_graphs; i++) cudaGraphExecDestroy(c->graphs[i].exec);
  c->n_graphs = 0;
}

/* The arrays of a step of n_tok tokens and n_seq sequences, one after the
 * other from base (the block tables last); returns the bytes up to the
 * block tables. Laid out by the step's own counts, so that a step uploads
 * the bytes it uses, not the buffers' capacity (which grows to the largest
 * step's: after a step of 256 sequences at --max-model-len 4096, every
 * later step uploaded their 256 KB of block tables); a captured graph
 * replays steps of its own shape, so its pointers stay right. */
static size_t kcu_meta_layout(kcu_meta_t *m, void *base, int n_tok, int n_seq) {
  int32_t *p = (int32_t *)base;
  m->hdr = p;
  p += 4;
  m->positions = p;
  p += n_tok;
  m->slots = p;
  p += n_tok;
  m->tokens = p;
  p += n_tok;
  m->q_start = p;
  p += n_seq + 1;
  m->ctx_len = p;
  p += n_seq;
  m->pf_seqs = p;
  p += n_seq;
  m->kvd_base = p;
  p += n_seq;
  m->block_tables = p;
  return (size_t)((char *)p - (char *)base);
}

/* Grows the metadata buffers for a step (drops captured graphs, which point
 * at the old buffers). */
static int kcu_meta_grow(kcu_ctx_t *c, int n_tok, int n_seq, size_t n_bt) {
  if (n_tok <= c->tok_cap && n_seq <= c->seq_cap && n_bt <= c->bt_cap) return 0;
  int rc = kcu__not_capturing(c, "step metadata growth");
  if (rc) return rc;
  int tok_cap = FR_MAX(FR_MAX(n_tok, c->tok_cap), KCU_META_MIN_TOKENS);
  int seq_cap = FR_MAX(FR_MAX(n_seq, c->seq_cap), KCU_META_MIN_SEQS);
  size_t bt_cap = FR_MAX(FR_MAX(n_bt, c->bt_cap), (size_t)KCU_META_MIN_BT);
  size_t bytes = (4 + 3 * (size_t)tok_cap + 4 * (size_t)seq_cap + 1 + bt_cap) * sizeof(int32_t);
  KCU_CHECK(cudaStreamSynchronize(c->stream));
  kcu__graphs_drop(c);
  /* steps have begun: the weights are in (callers without load_end) */
  if ((rc = kcu__load_end(c))) return rc;
  kcu__free(c->meta_dev);
  cudaFreeHost(c->meta_pin);
  c->meta_dev = c->meta_pin = NULL;
  c->tok_cap = c->seq_cap = 0;
  c->bt_cap = 0;
  if ((rc = kcu__alloc(c, bytes, &c->meta_dev, "step metadata"))) return rc;
  KCU_CHECK(cudaMallocHost(&c->meta_pin, bytes));
  c->h_tokens = (int32_t *)fr_realloc(c->h_tokens, (size_t)tok_cap * sizeof(int32_t));
  c->tok_cap = tok_cap;
  c->seq_cap = seq_cap;
  c->bt_cap = bt_cap;
  return 0;
}

static int kcu_step_check(const kern_step_t *s) {
  if (s->n_tokens < 0 || s->n_seqs < 0 || s->max_blocks < 0 || (s->n_seqs > 0 && !s->q_start) ||
      (s->n_tokens > 0 && (!s->positions || !s->slots)))
    return fr_errorf(FR_EFORMAT, "cuda: step_begin: bad step shape");
  if (s->n_seqs > 0 && (s->q_start[0] != 0 || s->q_start[s->n_seqs] != s->n_tokens))
    return fr_errorf(FR_EFORMAT, "cuda: step_begin: q_start must run from 0 to n_tokens");
  for (int i = 0; i < s->n_seqs; i++) {
    if (s->q_start[i + 1] < s->q_start[i]) return fr_errorf(FR_EFORMAT, "cuda: step_begin: q_start decreases");
    if (s->ctx_len && s->ctx_len[i] < 0) return fr_errorf(FR_EFORMAT, "cuda: step_begin: negative ctx_len");
  }
  return 0;
}

/* Host-side summary used for launch shapes; lists the sequences with more
 * than one query token into the pinned mirror (pf_seqs). */
static void kcu_step_summary(kcu_ctx_t *c, const kern_step_t *s) {
  c->max_q = 0;
  c->max_ctx = 0;
  c->n_single = c->n_pf = 0;
  for (int i = 0; i < s->n_seqs; i++) {
    int q = s->q_start[i + 1] - s->q_start[i];
    c->max_q = FR_MAX(c->max_q, q);
    if (q == 1) c->n_single++;
    else if (q > 1) c->pm.pf_seqs[c->n_pf++] = i;
    if (s->ctx_len) c->max_ctx = FR_MAX(c->max_ctx, s->ctx_len[i]);
  }
}

static int kcu_step_begin(void *ctx, const kern_step_t *s) {
  kcu_ctx_t *c = (kcu_ctx_t *)ctx;
  int rc = kcu__not_capturing(c, "step_begin");
  if (rc || (rc = kcu_step_check(s))) return rc;
  kcu__x8_drop(c);
  size_t n_bt = (size_t)s->n_seqs * (size_t)s->max_blocks;
  if ((rc = kcu_meta_grow(c, s->n_tokens, s->n_seqs, n_bt))) return rc;
  /* the previous upload must have finished reading the pinned mirror */
  KCU_CHECK(cudaEventSynchronize(c->meta_done));
  const size_t bytes = kcu_meta_layout(&c->pm, c->meta_pin, s->n_tokens, s->n_seqs) + n_bt * sizeof(int32_t);
  kcu_meta_layout(&c->dm, c->meta_dev, s->n_tokens, s->n_seqs);
  kcu_meta_t *p = &c->pm;
  size_t nt = (size_t)s->n_tokens * 4;
  p->hdr[0] = s->n_tokens;
  p->hdr[1] = s->n_seqs;
  p->hdr[2] = s->max_blocks;
  p->hdr[3] = 0;
  if (nt) memcpy(p->positions, s->positions, nt);
  if (nt) memcpy(p->slots, s->slots, nt);
  if (nt && s->tokens) memcpy(p->tokens, s->tokens, nt);
  else if (nt) memset(p->tokens, 0, nt);
  if (nt) memcpy(c->h_tokens, p->tokens, nt);
  memcpy(p->q_start, s->q_start ? s->q_start : p->hdr + 3, ((size_t)s->n_seqs + (s->q_start ? 1 : 0)) * 4);
  if (s->n_seqs && s->ctx_len) memcpy(p->ctx_len, s->ctx_len, (size_t)s->n_seqs * 4);
  else if (s->n_seqs) memset(p->ctx_len, 0, (size_t)s->n_seqs * 4);
  if (n_bt && s->block_tables) memcpy(p->block_tables, s->block_tables, n_bt * 4);
  else if (n_bt) memset(p->block_tables, 0, n_bt * 4);
  kcu_step_summary(c, s);
  if ((rc = kcu__kvd_plan(c, s))) return rc;
  KCU_CHECK(cudaMemcpyAsync(c->meta_dev, c->meta_pin, bytes, cudaMemcpyHostToDevice, c->stream));
  KCU_CHECK(cudaEventRecord(c->meta_done, c->stream));
  c->n_tokens = s->n_tokens;
  c->n_seqs = s->n_seqs;
  c->max_blocks = s->max_blocks;
  /* size the decode partials for this step shape on any pool made (never inside a capture): the most splits
   * come with the fewest KV heads and the longest blocks, the most floats a split with the most heads and the
   * widest head */
  if (c->pools_kv_max > 0 && s->n_seqs > 0) {
    int sp = kcu__attn_max_splits(c, s->n_seqs, c->pools_kv_min, (long long)s->max_blocks * c->pools_bs_max);
    const int groups = c->pools_kv_max * (KCU_MAX_GROUP / KCU_DEC_GROUP); /* the decode kernel's counters */
    if ((rc = kcu__attn_reserve(c, s->n_seqs, groups, c->pools_kv_max * KCU_MAX_GROUP, c->pools_hd_max, sp)))
      return rc;
  }
  return 0;
}

/* ---- ops that are thin wrappers --------------------------------------------- */

static int kcu_embed(void *ctx, void *out, const kern_weight_t *table) {
  kcu_ctx_t *c = (kcu_ctx_t *)ctx;
  if (!c->capturing)
    for (int i = 0; i < c->n_tokens; i++)
      if (c->h_tokens[i] < 0 || c->h_tokens[i] >= table->rows)
        return fr_errorf(FR_EFORMAT, "cuda: embed: token %d out of range (vocab %lld)", c->h_tokens[i],
                         (long long)table->rows);
  return kcu__embed(c, out, table);
}

static int kcu_matmul(void *ctx, void *out, const kern_weight_t *w, const kern_weight_t *bias, const void *x, int n) {
  return kcu__matmul((kcu_ctx_t *)ctx, out, w, bias, x, n);
}

static int kcu_rms_norm(void *ctx, void *out, const void *x, const kern_weight_t *w, int n, int dim, float eps) {
  return kcu__rms_norm((kcu_ctx_t *)ctx, out, NULL, x, (const float *)w->data, n, dim, eps);
}

static int kcu_add_rms_norm(void *ctx, void *out, void *residual, const void *x, const kern_weight_t *w, int n,
                            int dim, float eps) {
  return kcu__rms_norm((kcu_ctx_t *)ctx, out, residual, x, (const float *)w->data, n, dim, eps);
}

static int kcu_rope(void *ctx, void *x, int n_heads, int head_dim, int row_stride, const kern_rope_t *rope) {
  return kcu__rope((kcu_ctx_t *)ctx, x, n_heads, head_dim, row_stride, rope);
}

static int kcu_kv_append(void *ctx, kern_kv_pool_t *pool, int layer, const void *k, int k_stride, const void *v,
                         int v_stride) {
  if (layer < 0 || layer >= pool->cfg.n_layers) return fr_errorf(FR_EFORMAT, "cuda: kv_append: bad layer %d", layer);
  return kcu__kv_append((kcu_ctx_t *)ctx, pool, layer, k, k_stride, v, v_stride);
}

static int kcu_rope_kv_append(void *ctx, kern_kv_pool_t *pool, int layer, void *q, int q_stride, void *k, void *v,
                              int kv_stride, int n_heads, const kern_rope_t *rope) {
  if (layer < 0 || layer >= pool->cfg.n_layers)
    return fr_errorf(FR_EFORMAT, "cuda: rope_kv_append: bad layer %d", layer);
  return kcu__rope_kv_append((kcu_ctx_t *)ctx, pool, layer, q, q_stride, k, v, kv_stride, n_heads, rope);
}

static int kcu_matmul_rope_kv_append(void *ctx, void *qkv, const kern_weight_t *w, const kern_weight_t *bias,
                                     const void *x, int n, kern_kv_pool_t *pool, int layer, int n_heads,
                                     const kern_rope_t *rope) {
  if (layer < 0 || layer >= pool->cfg.n_layers)
    return fr_errorf(FR_EFORMAT, "cuda: matmul_rope_kv_append: bad layer %d", layer);
  return kcu__matmul_rope_kv_append((kcu_ctx_t *)ctx, qkv, w, bias, x, n, pool, layer, n_heads, rope);
}

static int kcu_matmul_silu_mul(void *ctx, void *out, const kern_weight_t *w, const void *x, int n, void *scratch) {
  return kcu__matmul_silu_mul((kcu_ctx_t *)ctx, out, w, x, n, scratch);
}

static int kcu_attention(void *ctx, void *out, const void *q, int q_stride, const kern_kv_pool_t *pool, int layer,
                         int n_heads, int head_dim, float scale, int window) {
  if (layer < 0 || layer >= pool->cfg.n_layers) return fr_errorf(FR_EFORMAT, "cuda: attention: bad layer %d", layer);
  return kcu__attention((kcu_ctx_t *)ctx, out, q, q_stride, pool, layer, n_heads, head_dim, scale, window);
}

static int kcu_silu_mul(void *ctx, void *out, const void *gate, const void *up, int n, int d, int stride) {
  return kcu__silu_mul((kcu_ctx_t *)ctx, out, gate, up, n, d, stride);
}

static int kcu_add(void *ctx, void *out, const void *a, const void *b, size_t n) {
  return kcu__add((kcu_ctx_t *)ctx, out, a, b, n);
}

static int kcu_last_rows(void *ctx, void *out, const void *x, int dim) {
  return kcu__last_rows((kcu_ctx_t *)ctx, out, x, dim);
}

static int kcu_pool_rows(void *ctx, void *out, const void *x, int dim, kern_pool_t mode) {
  return kcu__pool_rows((kcu_ctx_t *)ctx, out, x, dim, mode);
}

static int kcu_to_f32_host(void *ctx, float *dst_host, const void *src, size_t n) {
  kcu_ctx_t *c = (kcu_ctx_t *)ctx;
  int rc = kcu__not_capturing(c, "to_f32_host");
  if (rc || n == 0) return rc;
  if (n > c->f32_tmp_n) {
    kcu__free(c->f32_tmp);
    c->f32_tmp = NULL;
    c->f32_tmp_n = 0;
    if ((rc = kcu__alloc(c, n * 4, (void **)&c->f32_tmp, "f32 staging"))) return rc;
    c->f32_tmp_n = n;
  }
  if ((rc = kcu__convert(c, c->f32_tmp, KERN_F32, src, c->act, n))) return rc;
  KCU_CHECK(cudaMemcpyAsync(dst_host, c->f32_tmp, n * 4, cudaMemcpyDeviceToHost, c->stream));
  KCU_CHECK(cudaStreamSynchronize(c->stream));
  return 0;
}

static int kcu_sample(void *ctx, const void *logits, int n_rows, int vocab, const kern_sample_params_t *params_host,
                      int32_t *tokens_host, float *logprobs_host) {
  return kcu__sample((kcu_ctx_t *)ctx, logits, n_rows, vocab, params_host, tokens_host, logprobs_host);
}

/* ---- graphs ------------------------------------------------------------------- */

static int kcu_graph_begin(void *ctx, uint64_t key, bool *replayed) {
  kcu_ctx_t *c = (kcu_ctx_t *)ctx;
  *replayed = false;
  if (c->capturing) return fr_errorf(FR_ESTATE, "cuda: graph_begin inside a capture");
  kcu__x8_drop(c); /* a replay writes without kcu_launch; a capture starts with none */
  for (int i = 0; i < c->n_graphs; i++) {
    if (c->graphs[i].key == key) {
      KCU_CHECK(cudaGraphLaunch(c->graphs[i].exec, c->stream));
      *replayed = true;
      return 0;
    }
  }
  if (c->n_graphs == KCU_MAX_GRAPHS) {
    cudaGraphExecDestroy(c->graphs[0].exec);
    memmove(&c->graphs[0], &c->graphs[1], sizeof(c->graphs[0]) * (KCU_MAX_GRAPHS - 1));
    c->n_graphs--;
  }
  KCU_CHECK(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
  c->capturing = 1;
  c->capture_key = key;
  return 0;
}

static int kcu_graph_end(void *ctx, uint64_t key) {
  kcu_ctx_t *c = (kcu_ctx_t *)ctx;
  if (!c->capturing) return 0; /* replayed */
  cudaGraph_t g = NULL;
  cudaGraphExec_t exec = NULL;
  c->capturing = 0;
  if (key != c->capture_key) {
    cudaStreamEndCapture(c->stream, &g);
    if (g) cudaGraphDestroy(g);
    return fr_errorf(FR_ESTATE, "cuda: graph_end key differs from graph_begin's");
  }
  cudaError_t e = cudaStreamEndCapture(c->stream, &g);
  if (e != cudaSuccess || !g) {
    (void)cudaGetLastError();
    return fr_errorf(FR_ECUDA, "cuda: graph capture failed: %s (an op synchronized or allocated?)",
                     cudaGetErrorString(e));
  }
  e = cudaGraphInstantiate(&exec, g, 0);
  cudaGraphDestroy(g);
  KCU_CHECK(e);
  c->graphs[c->n_graphs].key = key;
  c->graphs[c->n_graphs].exec = exec;
  c->n_graphs++;
  kcu__x8_drop(c);
  KCU_CHECK(cudaGraphLaunch(exec, c->stream));
  return 0;
}

/* ---- create / destroy ---------------------------------------------------------- */

#ifdef KCU_TRACE
/* Each translation unit's trace records (kcu_trace.cuh), printed at destroy. */
static void (*kcu_tr_dumps[32])(void);
static int kcu_tr_n_dumps;
void kcu_tr_register(void (*dump)(void)) {
  if (kcu_tr_n_dumps < (int)FR_ARRAY_SIZE(kcu_tr_dumps)) kcu_tr_dumps[kcu_tr_n_dumps++] = dump;
}
#endif

static void kcu_destroy(void *ctx) {
  kcu_ctx_t *c = (kcu_ctx_t *)ctx;
  if (!c) return;
  cudaSetDevice(c->device);
  if (c->stream) cudaStreamSynchronize(c->stream);
#ifdef KCU_TRACE
  for (int i = 0; i < kcu_tr_n_dumps; i++) kcu_tr_dumps[i]();
#endif
  kcu__graphs_drop(c);
  kcu__comm_destroy(c);
  kcu__stage_free(c);
  kcu__free(c->meta_dev);
  if (c->meta_pin) cudaFreeHost(c->meta_pin);
  if (c->samp_pin) cudaFreeHost(c->samp_pin);
  kcu__free(c->samp_part);
  kcu__free(c->samp_cnt);
  kcu__free(c->deq);
  kcu__free(c->xq);
  kcu__free(c->xqd);
  kcu__free(c->attn_part);
  kcu__free(c->attn_cnt);
  kcu__free(c->kvd);
  kcu__free(c->kvd_bt);
  kcu__free(c->q4wg_cnt);
  kcu__free(c->pen_dev);
  cudaFreeHost(c->pen_pin);
  free(c->pen_sort);
  kcu__free(c->mask_dev);
  cudaFreeHost(c->mask_pin);
  kcu__free(c->f32_tmp);
  kcu__free(c->pairs_dev);
  kcu__free(c->moe_buf);
  kcu__f8_destroy(c);
  kcu__free(c->cublas_ws);
  if (c->meta_done) cudaEventDestroy(c->meta_done);
  if (c->side_fork) cudaEventDestroy(c->side_fork);
  if (c->side_join) cudaEventDestroy(c->side_join);
  if (c->side) cudaStreamDestroy(c->side);
  if (c->cublas) cublasDestroy(c->cublas);
  if (c->stream) cudaStreamDestroy(c->stream);
  free(c->h_tokens);
  free(c);
}

static const kern_ops_t kcu_ops = {
    .name = "cuda",
    .destroy = kcu_destroy,
    .alloc = kcu_alloc,
    .free = kcu_free,
    .upload = kcu_upload,
    .download = kcu_download,
    .copy = kcu_copy,
    .sync = kcu_sync,
    .mem_info = kcu_mem_info,
    .weight_load = kcu_weight_load,
    .weight_load_file = kcu_weight_load_file,
    .weight_release = kcu_weight_release,
    .load_end = kcu_load_end,
    .supports_type = kcu_supports_type,
    .kv_pool_init = kcu_kv_pool_init,
    .kv_pool_deinit = kcu_kv_pool_deinit,
    .kv_copy_blocks = kcu_kv_copy_blocks,
    .step_begin = kcu_step_begin,
    .embed = kcu_embed,
    .matmul = kcu_matmul,
    .rms_norm = kcu_rms_norm,
    .add_rms_norm = kcu_add_rms_norm,
    .rope = kcu_rope,
    .kv_append = kcu_kv_append,
    .rope_kv_append = kcu_rope_kv_append,
    .matmul_rope_kv_append = kcu_matmul_rope_kv_append,
    .attention = kcu_attention,
    .silu_mul = kcu_silu_mul,
    .matmul_silu_mul = kcu_matmul_silu_mul,
    .moe_ffn = kcu__moe_ffn,
    .add = kcu_add,
    .last_rows = kcu_last_rows,
    .pool_rows = kcu_pool_rows,
    .to_f32_host = kcu_to_f32_host,
    .sample = kcu_sample,
    .graph_begin = kcu_graph_begin,
    .graph_end = kcu_graph_end,
    .comm_init = kcu__comm_init,
    .all_reduce = kcu__all_reduce,
    .all_reduce_add_rms_norm = kcu__all_reduce_add_rms_norm,
    .gather_cols = kcu__gather_cols,
};

/* An integer tuning knob from the environment, clamped to [lo, hi]. */
static int kcu_env_int(const char *name, int def, int lo, int hi) {
  const char *v = getenv(name);
  if (!v || !*v) return def;
  int x = atoi(v);
  return x < lo ? lo : x > hi ? hi : x;
}

static int kcu_ctx_init(kcu_ctx_t *c, int device) {
  int n_dev = 0;
  cudaError_t e = cudaGetDeviceCount(&n_dev);
  if (e != cudaSuccess || n_dev == 0) {
    (void)cudaGetLastError();
    return fr_errorf(FR_ECUDA, "cuda: no usable device (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
  }
  if (device < 0 || device >= n_dev) return fr_errorf(FR_ECUDA, "cuda: device %d of %d", device, n_dev);
  c->device = device;
  KCU_CHECK(cudaSetDevice(device));
  cudaDeviceProp prop;
  KCU_CHECK(cudaGetDeviceProperties(&prop, device));
  c->n_sm = prop.multiProcessorCount;
  c->smem_optin = prop.sharedMemPerBlockOptin;
  if (!prop.unifiedAddressing) /* kernels read and write pinned host buffers at their host addresses (the sampler) */
    return fr_errorf(FR_EUNSUPPORTED, "cuda: device %d (%s) has no unified addressing", device, prop.name);
  const char *dt = getenv("FERRUM_CUDA_DTYPE");
  c->act = (dt && (!strcmp(dt, "f16") || !strcmp(dt, "F16"))) ? KERN_F16 : KERN_BF16;
  c->act_size = 2;
  c->simt_prefill = kcu_env_int("FERRUM_CUDA_SIMT_PREFILL", 0, 0, 1);
  c->pf_pack = kcu_env_int("FERRUM_CUDA_PF_PACK", 1, 0, 1);
  c->gemv_max_n = kcu_env_int("FERRUM_CUDA_GEMV_MAX_N", -1, -1, 8);
  c->qgemv_max_n = kcu_env_int("FERRUM_CUDA_QGEMV_MAX_N", KCU_QGEMV_MAX_N, 0, KCU_QGEMV_MAX_N);
  c->dec_chunk = kcu_env_int("FERRUM_CUDA_DEC_CHUNK", KCU_DEC_MIN_CHUNK, 16, 4096);
  c->dec_msplit = kcu_env_int("FERRUM_CUDA_DEC_MSPLIT", 1, 0, 2);
  c->dec_mchunk = kcu_env_int("FERRUM_CUDA_DEC_MCHUNK", KCU_DEC_MMA_CHUNK, 16, 4096) & ~15;
  c->dec_tma = kcu_env_int("FERRUM_CUDA_DEC_TMA", -1, -1, 4);
  c->dec_mma = kcu_env_int("FERRUM_CUDA_DEC_MMA", -1, -1, 1 << 30);
  c->dec_mma_q = kcu_env_int("FERRUM_CUDA_DEC_MMA_Q", 1, 0, 1);
  c->gemv_wpr = kcu_env_int("FERRUM_CUDA_GEMV_WPR", 0, 0, 4);
  c->fuse_gemv = kcu_env_int("FERRUM_CUDA_FUSE_GEMV", 1, 0, 1);
  if (c->gemv_wpr == 3) c->gemv_wpr = 2;
  c->pdl = prop.major >= 9 && kcu_env_int("FERRUM_PDL", 1, 0, 1);
  c->moe_gemv_pairs = kcu_env_int("FERRUM_CUDA_MOE_GEMV", KCU_MOE_GEMV_PAIRS, 0, 1 << 20);
  c->moe_small_per_exp = kcu_env_int("FERRUM_CUDA_MOE_SMALL", KCU_MOE_SMALL_PER_EXP, 0, 1 << 20);
#ifdef KCU_HAVE_WG
  if (prop.major == 9 && prop.minor == 0) { /* sm_90a code */
    c->gg_wg = kcu_env_int("FERRUM_CUDA_GG_WG", 1, 0, 1);
    c->q4f_wg = kcu_env_int("FERRUM_CUDA_Q4F_WG", KCU_Q4F_WG_MIN_N, 0, KCU_Q4F_WG_MAX_N + 1);
    c->q4f_wg_mt = kcu_env_int("FERRUM_CUDA_Q4F_WG_MT", 2, 1, 4);
    if (c->q4f_wg_mt == 3) c->q4f_wg_mt = 4;
    c->q4f_wg_ctas = kcu_env_int("FERRUM_CUDA_Q4F_WG_CTAS", -1, -1, 1 << 20);
    c->q4f_wg_split = kcu_env_int("FERRUM_CUDA_Q4F_WG_SPLIT", 1, 0, 1);
  }
#endif
  c->q4f = kcu_env_int("FERRUM_CUDA_Q4F", 1, 0, 1);
  c->q4f_max_n = kcu_env_int("FERRUM_CUDA_Q4F_MAX_N", KCU_Q4F_MAX_N, 0, 4096);
  c->q4f_warps = kcu_env_int("FERRUM_CUDA_Q4F_WARPS", 0, 0, 8);
  c->q4f_gemm = kcu_env_int("FERRUM_CUDA_Q4F_GEMM", 1, 0, 1);
  c->q4f_nt = kcu_env_int("FERRUM_CUDA_Q4F_NT", 4, 1, 8);
  c->q4f_nt = c->q4f_nt <= 1 ? 1 : c->q4f_nt <= 2 ? 2 : c->q4f_nt <= 4 ? 4 : 8;
  if (c->q4f_warps) c->q4f_warps = c->q4f_warps <= 4 ? 4 : 8;
  c->q4f_wide = kcu_env_int("FERRUM_CUDA_Q4F_WIDE", 17, 1, 1 << 30);
  c->q4f_ks = kcu_env_int("FERRUM_CUDA_Q4F_KS", 0, 0, 8);
  c->q4f_row = kcu_env_int("FERRUM_CUDA_Q4F_ROW", -1, -1, 8);
  c->q6f = kcu_env_int("FERRUM_CUDA_Q6F", 1, 0, 1);
  c->q4g = kcu_env_int("FERRUM_CUDA_Q4G", 1, 0, 1);
  c->q4g_raw = kcu_env_int("FERRUM_CUDA_Q4G_RAW", 1, 0, 1);
  c->samp_split = kcu_env_int("FERRUM_CUDA_SAMPLE_SPLIT", 0, 0, 64);
  c->f8_gemv_max_n = kcu_env_int("FERRUM_CUDA_F8_GEMV_MAX_N", KCU_F8_GEMV_N, 0, KCU_F8_GEMV_MAX_N);
  const char *f8s = getenv("FERRUM_CUDA_F8_SCALES");
  c->f8_tensor = f8s && !strcmp(f8s, "tensor"); /* else by what cuBLASLt offers (kcu_f8.cu) */
  c->x8_fuse = kcu_env_int("FERRUM_CUDA_F8_FUSE", 1, 0, 1);
  c->kvd_max_bytes = (size_t)kcu_env_int("FERRUM_CUDA_KVD_MB", KCU_KVD_MB, 0, 1 << 20) << 20;
  c->kvd_reuse = kcu_env_int("FERRUM_CUDA_KVD_REUSE", KCU_KVD_REUSE, 0, 1 << 20);
  c->f8_fast = kcu_env_int("FERRUM_CUDA_F8_FAST_ACCUM", 1, 0, 1);
  c->be.fp8_weights = prop.major * 10 + prop.minor >= 89; /* FP8 tensor cores: Ada, Hopper and later */
  c->pdl_late = kcu_env_int("FERRUM_CUDA_PDL_LATE", -1, 0, 15);
  c->pdl_early = kcu_env_int("FERRUM_CUDA_PDL_EARLY", -1, 0, 15);
  KCU_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
  KCU_CHECK(cudaEventCreateWithFlags(&c->meta_done, cudaEventDisableTiming));
  KCU_CHECK(cudaEventRecord(c->meta_done, c->stream));
  c->attn_side = kcu_env_int("FERRUM_CUDA_ATTN_SIDE", 1, 0, 1);
  int prio_low = 0, prio_high = 0; /* the side stream's prefill CTAs first: they are the longer ones */
  KCU_CHECK(cudaDeviceGetStreamPriorityRange(&prio_low, &prio_high));
  KCU_CHECK(cudaStreamCreateWithPriority(&c->side, cudaStreamNonBlocking, prio_high));
  KCU_CHECK(cudaEventCreateWithFlags(&c->side_fork, cudaEventDisableTiming));
  KCU_CHECK(cudaEventCreateWithFlags(&c->side_join, cudaEventDisableTiming));
  KCU_CUBLAS(cublasCreate(&c->cublas));
  KCU_CUBLAS(cublasSetStream(c->cublas, c->stream));
  int rc = kcu__alloc(c, KCU_CUBLAS_WS_BYTES, &c->cublas_ws, "cuBLAS workspace");
  if (rc || (rc = kcu__attn_init(c)) || (rc = kcu__gg_init(c)) || (rc = kcu__q4f_init(c))) return rc;
  KCU_CUBLAS(cublasSetWorkspace(c->cublas, c->cublas_ws, KCU_CUBLAS_WS_BYTES));
  FR_LOGD("cuda: device %d %s, %d SMs, act %s, PDL %s", device, prop.name, c->n_sm,
          c->act == KERN_BF16 ? "bf16" : "f16", c->pdl ? "on" : "off");
  return kcu_meta_grow(c, KCU_META_MIN_TOKENS, KCU_META_MIN_SEQS, KCU_META_MIN_BT);
}

extern "C" int kern_cuda_create(kern_backend_t **out, int device) {
  *out = NULL;
  kcu_ctx_t *c = (kcu_ctx_t *)fr_calloc(1, sizeof(*c));
  int rc = kcu_ctx_init(c, device);
  if (rc) {
    kcu_destroy(c);
    return rc;
  }
  c->be.ops = &kcu_ops;
  c->be.ctx = c;
  c->be.act_type = c->act;
  c->be.act_size = c->act_size;
  c->be.kv_type = c->act;
  c->be.kv_dtypes = 1u << KERN_KV_AUTO | 1u << KERN_KV_INT8 | 1u << KERN_KV_FP8;
  c->be.host_memory = false;
  c->be.padded_perm = c->q4f; /* the Q4F matmul and dequant skip padding columns */
  /* be.fp8_weights: set by kcu_ctx_init from the compute capability */
  *out = &c->be;
  return 0;
}

extern "C" uint64_t kern_cuda_f8_twin_hits(const kern_backend_t *b) {
  return b && b->ops == &kcu_ops ? ((const kcu_ctx_t *)b->ctx)->x8_hits : 0;
}

extern "C" uint64_t kern_cuda_kvd_runs(const kern_backend_t *b) {
  return b && b->ops == &kcu_ops ? ((const kcu_ctx_t *)b->ctx)->kvd_runs : 0;
}
