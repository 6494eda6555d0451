/* kern.h - the backend interface: tensor types and the ops vtable.
 *
 * The model code (model/) calls ops through a kern_backend_t and never
 * touches a device. A backend fills a `static const kern_ops_t` table with
 * designated initializers; optional slots are marked and may be NULL (the
 * caller checks before calling one). The CPU backend (kernels/cpu) is the reference
 * that other backends are tested against.
 *
 * Memory: activations, KV pools and weights live in backend memory ("device
 * pointers"): host memory for the CPU backend, GPU memory for CUDA. Pointers
 * passed to ops are device pointers unless the comment says "host".
 * Activations are of the backend's act_type (F32 on the CPU, BF16 or F16 on
 * CUDA); ops compute in f32.
 *
 * Threads: a backend is used by one thread at a time (its owner). The CPU
 * backend runs its ops on its own thread pool.
 *
 * A step: the model calls step_begin() with the step's metadata (positions,
 * per-sequence query ranges, block tables, KV slots), then the ops of the
 * layer stack. rope, kv_append and attention read that metadata; it stays
 * valid until the next step_begin().
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/kern_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A weight matrix, row-major: `rows` rows of `cols` elements each. Output
 * features are rows (HF [out,in] = GGUF ne=[in,out]). 1-D weights (norms,
 * biases) have rows = 1. */
typedef struct kern_weight {
  kern_type_t type;
  int64_t rows, cols;
  size_t row_bytes; /* kern_row_bytes(type, cols) */
  void *data;       /* backend memory (CPU: may point into a mmap'd file) */
  void *priv;       /* backend-private (repacked copy, device handle), or NULL */
  /* Host memory, or NULL (identity): the weight's columns are a permutation
   * of the input's, column k multiplying x[perm[k]] (GPTQ act-order weights,
   * stored with their groups contiguous). The CPU backend gathers x per
   * call; CUDA copies it to the device at weight_load (quantized weights
   * only). It must stay valid while the weight is loaded.
   * With x_cols set, perm[k] may also be -1: column k is padding and
   * multiplies 0, whatever its weights (a rank's part of an act-order
   * weight, model_quant_cols, where each group's run of columns is padded
   * to whole blocks); only backends with kern_backend_t.padded_perm take
   * such weights. */
  const int32_t *perm;
  int64_t x_cols; /* with perm: the input's width (x is (n, x_cols)), at most cols; 0: cols */
  /* Set by the model: something other than matmul reads the weight's rows
   * or blocks (an embedding table, a MoE router or expert), so the backend
   * keeps the type's own layout. When false the weight is only ever the W
   * of matmul, and a backend may store it in a layout of its own
   * (w->type then says which: CUDA's KERN_Q4F). */
  bool keep_layout;
  /* Set by the model (--quantization fp8, or an FP8 checkpoint): keep this
   * matmul weight (2-D, only matmul reads it) as FP8 E4M3. A dense one
   * (F32, F16, BF16) is quantized at load, a scale a row (w->type then
   * KERN_F8R); a KERN_F8R or KERN_F8B one (host data, an FP8 checkpoint's
   * bytes and scales) is kept as it is, or refused with FR_EUNSUPPORTED
   * where the backend cannot run that form (the model then hands it over
   * dense). Only backends with kern_backend_t.fp8_weights take it;
   * weight_load refuses it elsewhere. */
  bool fp8;
} kern_weight_t;

/* The width of the input a weight multiplies: x_cols, else cols. */
static inline int64_t kern_weight_x_cols(const kern_weight_t *w) { return w->x_cols ? w->x_cols : w->cols; }

/* Bytes [off, off + len) of an open file (weight_load_file). */
typedef struct {
  int fd;
  uint64_t off;
  size_t len;
} kern_file_span_t;

/* Rope: rotation of pairs within each head (kern_rope_mode_t in
 * kern_types.h). The model precomputes the per-pair inverse frequencies
 * (base, llama3 scaling and rope_freqs folded in); the backend uses
 * theta = pos * inv_freq[i]. */
typedef struct {
  kern_rope_mode_t mode;
  int n_rot;                     /* rotated dims per head (<= head_dim), even */
  const kern_weight_t *inv_freq; /* F32, (1, n_rot/2), backend memory */
  float attn_factor;             /* multiplies cos/sin (1 unless yarn) */
} kern_rope_t;

/* Step metadata (host memory; the backend copies what it needs in
 * step_begin). Tokens of one sequence are contiguous in the batch. */
typedef struct {
  int n_tokens;             /* tokens in this step */
  const int32_t *tokens;    /* (n_tokens) token ids (embed reads them) */
  int n_seqs;               /* sequences in this step */
  const int32_t *positions; /* (n_tokens) absolute position of each token */
  const int32_t *slots;     /* (n_tokens) KV slot to write: block * block_size + offset;
                             * < 0 marks a padding token whose K/V is not written */
  const int32_t *q_start;   /* (n_seqs + 1) first token of each sequence in the batch */
  const int32_t *ctx_len;   /* (n_seqs) tokens in the KV cache after this step (cached + new);
                             * 0 marks a padding sequence (attention writes zeros) */
  const int32_t *block_tables; /* (n_seqs, max_blocks) physical block ids */
  int max_blocks;           /* row stride of block_tables */
} kern_step_t;

typedef struct kern_kv_pool {
  kern_kv_config_t cfg;
  size_t layer_bytes; /* bytes of K (or V) elements for one layer (kern_kv_layer_bytes) */
  size_t scale_bytes; /* bytes of K (or V) scales for one layer; 0 unless cfg.dtype quantizes */
  void *base;         /* backend memory: layer l's K at base + 2*l*layer_bytes, V after it; scales after
                       * every layer's elements (kern_types.h) */
  bool external;      /* base is borrowed (e.g. shared memory), not freed by the pool */
} kern_kv_pool_t;

/* Sets a pool's geometry over base (kern_kv_pool_bytes(cfg) bytes): what
 * a backend's kv_pool_init does besides allocating and zeroing. */
static inline void kern_kv_pool_layout(kern_kv_pool_t *pool, const kern_kv_config_t *cfg, void *base, bool external) {
  pool->cfg = *cfg;
  pool->layer_bytes = kern_kv_layer_bytes(cfg);
  pool->scale_bytes = kern_kv_scale_bytes(cfg);
  pool->base = base;
  pool->external = external;
}

/* Layer l's K (is_v 0) or V (is_v 1) elements, and its scales (NULL when
 * not quantized). */
static inline void *kern_kv_pool_elems(const kern_kv_pool_t *pool, int layer, int is_v) {
  return (uint8_t *)pool->base + (2 * (size_t)layer + (size_t)is_v) * pool->layer_bytes;
}
static inline uint16_t *kern_kv_pool_scales(const kern_kv_pool_t *pool, int layer, int is_v) {
  if (!pool->scale_bytes) return NULL;
  return (uint16_t *)((uint8_t *)pool->base + 2 * (size_t)pool->cfg.n_layers * pool->layer_bytes +
                      (2 * (size_t)layer + (size_t)is_v) * pool->scale_bytes);
}

typedef struct kern_backend kern_backend_t;

/* How pool_rows reduces a sequence's rows to one. */
typedef enum {
  KERN_POOL_MEAN = 0,  /* the mean of its rows (sentence-transformers' mean pooling) */
  KERN_POOL_FIRST = 1, /* its first row (CLS pooling) */
} kern_pool_t;

/* A mixture-of-experts FFN layer (Qwen3-MoE) for the moe_ffn op. Weights
 * are borrowed for the call. Experts may be any matmul type, each its own. */
typedef struct {
  const kern_weight_t *router;    /* (n_experts, dim) */
  const kern_weight_t *gate, *up; /* (n_experts) weights of (ffn, dim) */
  const kern_weight_t *down;      /* (n_experts) weights of (dim, ffn) */
  int n_experts;                  /* >= 1 */
  int n_used;                     /* experts per token (top-k), 1..n_experts */
  bool norm_topk;                 /* renormalise the top-k weights to sum 1 */
} kern_moe_t;

/* A tensor-parallel group: `size` processes, one per device, each running
 * the same layer stack on its shard of the weights and summing partial
 * results with all_reduce. id names the rendezvous and its transport:
 * "shm:/<name>" (host memory: a POSIX shared memory segment of that name,
 * which the ranks create together and rank 0 unlinks once all are in) or
 * "nccl:<hex>" (an NCCL unique id from kern_nccl_new_id, made by rank 0). */
typedef struct {
  int rank, size;
  const char *id;
  size_t max_elems;  /* the largest all_reduce (activations) the group will run */
  size_t max_gather; /* the largest gather_cols part (n * cols elements), 0 = none */
  bool multi_host;   /* ranks may be on other hosts: no peer memory between processes (CUDA IPC) */
} kern_comm_t;

/* Makes an NCCL unique id as "nccl:<256 hex digits>" in out (cap >= 262).
 * The calling process hosts the rendezvous: it must be rank 0 and live
 * until every rank joined. FR_EUNSUPPORTED in a build without CUDA. */
int kern_nccl_new_id(char *out, size_t cap);

/* One logit bias of a row (model_bias_t's layout). */
typedef struct {
  int32_t token;
  float bias;
} kern_bias_t;

/* Sampling parameters for the optional on-device sampler. Penalties as
 * model/sampler.h: logit bias and min_tokens bans first, then repetition
 * over prompt and output tokens, presence and frequency over output tokens
 * (ids out of the vocabulary are skipped). */
typedef struct {
  float temperature; /* 0 = greedy */
  int top_k;         /* 0 = off */
  float top_p;       /* 1 = off */
  float min_p;       /* 0 = off */
  uint64_t seed;
  uint64_t counter; /* draw index for the counter-based RNG */
  float repetition_penalty;                  /* 1 (or 0) = off */
  float presence_penalty, frequency_penalty; /* 0 = off */
  const int32_t *prompt, *output;            /* host: the row's tokens so far, read during the call */
  int n_prompt, n_output;
  int top_n;                                 /* 0..KERN_SAMPLE_MAX_TOP: also the top_n most likely tokens */
  int32_t *top_ids;                          /* host, top_n entries: their ids, most likely first */
  float *top_lp;                             /* host, top_n entries: their logprobs (raw logits, as the token's) */
  const kern_bias_t *bias;                   /* host (n_bias), read during the call: distinct tokens */
  int n_bias;
  const int32_t *ban;                        /* host (n_ban): -inf while n_output < min_tokens */
  int n_ban, min_tokens;
  const uint32_t *allow; /* host (n_allow words), read during the call, or NULL: constrained decoding's mask,
                          * model_sampling_t's format (bit t % 32 of word t / 32 set: token t may be drawn; ids
                          * past the words may not); the others get -inf before bias, penalties, filters and the
                          * draw, not in the logprobs (raw, as the host's); bans that would leave no allowed
                          * token are skipped, as the host does */
  int n_allow;
} kern_sample_params_t;
#define KERN_SAMPLE_MAX_TOP 20

typedef struct {
  /* Name of the backend ("cpu", "cuda"). */
  const char *name;

  /* Releases everything the backend owns. */
  void (*destroy)(void *ctx);

  /* Memory. alloc returns 0 and a device pointer, or a negative error
   * (FR_EDEVOOM when out of device memory). */
  int (*alloc)(void *ctx, size_t bytes, void **out);
  void (*free)(void *ctx, void *p);
  /* host -> device, device -> host, device -> device. */
  int (*upload)(void *ctx, void *dst, const void *src_host, size_t bytes);
  int (*download)(void *ctx, void *dst_host, const void *src, size_t bytes);
  int (*copy)(void *ctx, void *dst, const void *src, size_t bytes);
  /* Waits for queued work. */
  int (*sync)(void *ctx);
  /* Optional (NULL: unknown, e.g. the CPU): the device's free and total
   * memory in bytes, as the driver reports them (free counts every
   * process's allocations). */
  int (*mem_info)(void *ctx, size_t *free_bytes, size_t *total_bytes);

  /* Makes a weight usable by the backend. host_data holds rows*row_bytes
   * bytes of w->type and stays valid (mmap) for the weight's lifetime; the
   * backend may borrow it (CPU) or copy it (CUDA), and may repack. Sets
   * w->data/w->priv. A copying backend (CUDA) is done reading host_data
   * when it returns; the device copy may still be in flight, and later ops
   * and downloads are ordered after it. */
  int (*weight_load)(void *ctx, kern_weight_t *w, const void *host_data);
  /* Optional (NULL: the caller hands mapped bytes to weight_load): as
   * weight_load, with the weight's bytes the concatenation of n_spans spans
   * of open files, which the backend reads itself (CUDA: io_uring into its
   * pinned ring, overlapped with the copies to the device). The weight is
   * usable, and a read error reported (here or by a later call), once
   * load_end has returned; the files stay open until then. */
  int (*weight_load_file)(void *ctx, kern_weight_t *w, const kern_file_span_t *spans, int n_spans);
  void (*weight_release)(void *ctx, kern_weight_t *w);
  /* Optional: the model's weights are loaded. Waits for the copies still in
   * flight (returns their error, if any) and frees load-time staging (CUDA:
   * pinned host buffers); a later weight_load makes it again. */
  int (*load_end)(void *ctx);

  /* Which weight types matmul/embed accept. */
  bool (*supports_type)(void *ctx, kern_type_t type);

  /* KV pool: allocates (or adopts `external` memory of kern_kv_pool_bytes)
   * and zeroes it. */
  int (*kv_pool_init)(void *ctx, kern_kv_pool_t *pool, const kern_kv_config_t *cfg, void *external);
  void (*kv_pool_deinit)(void *ctx, kern_kv_pool_t *pool);
  /* Optional: copies whole blocks (copy-on-write); pairs of (src, dst). */
  int (*kv_copy_blocks)(void *ctx, kern_kv_pool_t *pool, const int32_t *pairs_host, int n_pairs);

  /* Step metadata for rope / kv_append / attention, see kern_step_t. */
  int (*step_begin)(void *ctx, const kern_step_t *step);

  /* out(n_tokens, table->cols) = rows of the embedding table (any weight
   * type) for the step's tokens. */
  int (*embed)(void *ctx, void *out, const kern_weight_t *table);

  /* out(n, w->rows) = x(n, w->cols) @ w^T (+ bias, (1, w->rows) F32, optional);
   * with w->perm, column k of w multiplies x[perm[k]], and x is (n, w->x_cols)
   * when x_cols is set. out has room for n rounded up to a multiple of 4
   * rows: a backend may write the rows past n (CUDA's FP8 GEMM runs a
   * multiple of 4 tokens), which hold nothing after. The same holds for
   * matmul_rope_kv_append's qkv and matmul_silu_mul's scratch. */
  int (*matmul)(void *ctx, void *out, const kern_weight_t *w, const kern_weight_t *bias, const void *x, int n);

  /* out(n, dim) = x / rms(x) * w for each of n rows (w F32 (1, dim)). out may equal x. */
  int (*rms_norm)(void *ctx, void *out, const void *x, const kern_weight_t *w, int n, int dim, float eps);

  /* residual += x; out = rms_norm(residual) * w. Rows (n, dim). out may
   * equal x (each row of x is read before that row of out is written). */
  int (*add_rms_norm)(void *ctx, void *out, void *residual, const void *x, const kern_weight_t *w, int n, int dim,
                      float eps);

  /* In-place rope on x (n_tokens, row_stride elements per token; heads of
   * head_dim start at element h*head_dim) using the step's positions. */
  int (*rope)(void *ctx, void *x, int n_heads, int head_dim, int row_stride, const kern_rope_t *rope);

  /* Writes k, v (n_tokens, n_kv_heads * head_dim, row strides k_stride /
   * v_stride elements) into the pool at the step's slots. */
  int (*kv_append)(void *ctx, kern_kv_pool_t *pool, int layer, const void *k, int k_stride, const void *v,
                   int v_stride);

  /* Optional: rope(q), rope(k) and kv_append in one op, for the layout the
   * model keeps: q (n_tokens, n_heads heads, row stride q_stride), k and v
   * (n_tokens, n_kv_heads heads, row stride kv_stride). q and k are rotated
   * in place, then k and v are written at the step's slots, exactly as the
   * three ops would. NULL: the model calls the three. */
  int (*rope_kv_append)(void *ctx, kern_kv_pool_t *pool, int layer, void *q, int q_stride, void *k, void *v,
                        int kv_stride, int n_heads, const kern_rope_t *rope);

  /* Optional: matmul then rope_kv_append in one op, for a fused q/k/v
   * weight: qkv(n, w->rows) = x(n, w->cols) @ w^T (+ bias), the n_heads q
   * heads then the pool's n_kv_heads k and v heads of each token side by
   * side (w->rows = (n_heads + 2 n_kv_heads) * head_dim), then q and k
   * rotated in place and k, v written at the step's slots. n is the step's
   * token count. The same bits as the two ops, which a backend may run
   * where it has no fused form for the shapes. NULL: the model calls the two. */
  int (*matmul_rope_kv_append)(void *ctx, void *qkv, const kern_weight_t *w, const kern_weight_t *bias, const void *x,
                               int n, kern_kv_pool_t *pool, int layer, int n_heads, const kern_rope_t *rope);

  /* Causal attention of q (n_tokens, q_stride elements per token, n_heads of
   * head_dim) over each sequence's paged K/V (ctx_len tokens, the query
   * token at position p sees positions <= p, and with window > 0 only the
   * last `window` of them, p - window < position <= p: sliding-window
   * attention as Mistral and Hugging Face define it); GQA maps head h to KV
   * head h / (n_heads / n_kv_heads). out (n_tokens, n_heads * head_dim). */
  int (*attention)(void *ctx, void *out, const void *q, int q_stride, const kern_kv_pool_t *pool, int layer,
                   int n_heads, int head_dim, float scale, int window);

  /* out(n, d) = silu(gate) * up, where gate and up are (n, d) with row
   * stride `stride` elements (e.g. halves of one fused projection). */
  int (*silu_mul)(void *ctx, void *out, const void *gate, const void *up, int n, int d, int stride);

  /* Optional: matmul then silu_mul in one op, for a fused gate/up weight
   * (2d rows, the gate's first): out(n, d) = silu(x Wg^T) * (x Wu^T), the
   * same bits as the two ops. scratch holds (n, 2d) act-type values for
   * when the backend runs the two. NULL: the model calls the two. */
  int (*matmul_silu_mul)(void *ctx, void *out, const kern_weight_t *w, const void *x, int n, void *scratch);

  /* Optional: out(n, dim) = the mixture-of-experts FFN of x(n, dim):
   * per token, p = softmax(router x) over all experts, the n_used experts
   * of largest p (ties: lower index first) with weights p (divided by
   * their sum when norm_topk), and out = sum over them, in that order, of
   * weight * down_e(silu(gate_e x) * up_e x). Tokens are grouped by expert
   * so that each expert's weights are read once per call. out may equal x.
   * NULL: the backend cannot run MoE models (model_load refuses them). */
  int (*moe_ffn)(void *ctx, void *out, const void *x, int n, const kern_moe_t *moe);

  /* out(n) = a + b, elementwise. */
  int (*add)(void *ctx, void *out, const void *a, const void *b, size_t n);

  /* out(n_seqs, dim) = the row of each sequence's last token in x
   * (n_tokens, dim), per the step's q_start. */
  int (*last_rows)(void *ctx, void *out, const void *x, int dim);

  /* Optional: out(n_seqs, dim) = each sequence's rows of x (n_tokens, dim),
   * per the step's q_start, reduced to one by mode (sums in f32; a sequence
   * with no tokens this step gets zeros). NULL: the backend cannot pool
   * (model_load refuses mean and CLS pooling). */
  int (*pool_rows)(void *ctx, void *out, const void *x, int dim, kern_pool_t mode);

  /* Optional, for encoder models (BERT; NULL: model_load refuses them):
   * layer_norm: out(n, dim) = (x - mean) / sqrt(var + eps) * w + b per row
   * (w, b F32 (1, dim)); out may equal x. */
  int (*layer_norm)(void *ctx, void *out, const void *x, const kern_weight_t *w, const kern_weight_t *b, int n,
                    int dim, float eps);
  /* gelu: x(n) = gelu(x) in place; erf_form: 0.5 x (1 + erf(x / sqrt 2))
   * (transformers' "gelu"), else the tanh approximation (llama.cpp's). */
  int (*gelu)(void *ctx, void *x, size_t n, bool erf_form);
  /* attention_full: bidirectional attention of each token over every
   * token of its sequence in this step (per q_start; no KV cache): q, k, v
   * and out (n_tokens, n_heads * head_dim), head h of each at h * head_dim. */
  int (*attention_full)(void *ctx, void *out, const void *q, const void *k, const void *v, int n_heads, int head_dim,
                        float scale);

  /* Converts n activations to f32 host memory. */
  int (*to_f32_host)(void *ctx, float *dst_host, const void *src, size_t n);

  /* Optional: samples one token per row of logits (n_rows, vocab) on the
   * device with per-row params (n_rows entries, host); tokens_host and
   * logprobs_host (log-softmax of the chosen token) get n_rows entries. */
  int (*sample)(void *ctx, const void *logits, int n_rows, int vocab, const kern_sample_params_t *params_host,
                int32_t *tokens_host, float *logprobs_host);

  /* Optional: graph capture (CUDA graphs) of a decode forward. The caller
   * runs:  graph_begin(ctx, key, &replayed); if (!replayed) { ops } ;
   * graph_end(ctx, key).  graph_begin either launches the graph captured
   * earlier for key (replayed = true; graph_end is then a no-op) or starts
   * capturing the ops that follow (graph_end instantiates and launches).
   * Ops in a captured region must take every per-step input from the step
   * (step_begin runs before graph_begin), so the caller pads decode batches
   * to fixed sizes (padding tokens: slot < 0; padding sequences: ctx_len 0). */
  int (*graph_begin)(void *ctx, uint64_t key, bool *replayed);
  int (*graph_end)(void *ctx, uint64_t key);

  /* Optional: tensor parallelism (see kern_comm_t). comm_init joins the
   * group; it is collective (every rank calls it, and it returns once all
   * have). all_reduce sums n activations across the group in place, on the
   * backend's queue (captured in a graph like any op); every rank gets the
   * same values. */
  int (*comm_init)(void *ctx, const kern_comm_t *comm);
  int (*all_reduce)(void *ctx, void *buf, size_t n);
  /* Optional: all_reduce of part (n rows of dim) followed by add_rms_norm
   * (residual += part, out = its norm), with the bits of those two calls;
   * a backend offers it where one kernel does both. part may alias out. */
  int (*all_reduce_add_rms_norm)(void *ctx, void *out, void *residual, void *part, const kern_weight_t *w, int n,
                                 int dim, float eps);
  /* Optional: every rank holds part (n, cols) (row stride cols), its slice
   * of a row-wise concatenation; on rank 0, out (n, cols * size) gets rank
   * r's part as its columns [r * cols, (r + 1) * cols) (the LM head split
   * by vocabulary). Collective; out is unused on other ranks. n * cols <=
   * the group's max_gather. */
  int (*gather_cols)(void *ctx, void *out, const void *part, int n, int cols);
} kern_ops_t;

/* A backend and what it can do: callers decide by these fields, never by
 * the backend's name. */
struct kern_backend {
  const kern_ops_t *ops;
  void *ctx;
  kern_type_t act_type; /* activation element type */
  size_t act_size;      /* bytes per activation element */
  kern_type_t kv_type;  /* KV cache element type it keeps (--kv-cache-dtype auto) */
  uint32_t kv_dtypes;   /* bit (1 << kern_kv_dtype_t) for each KV cache dtype it can keep */
  bool host_memory;     /* its memory is host memory: a KV pool may be adopted from
                         * shared memory (kv_pool_init's external) and outlive the process */
  bool padded_perm;     /* its matmul takes weights with x_cols and -1 (padding) in perm
                         * (kern_weight_t.perm); model_load refuses them elsewhere */
  bool fp8_weights;     /* it keeps matmul weights as FP8 (kern_weight_t.fp8; CUDA on compute
                         * capability 8.9 or newer) */
};

/* Creates the backend for a device name (kern_device_parse: "cpu", "cuda",
 * "cuda:N"); n_threads is the CPU backend's (0 = all cores). Returns 0, or
 * -EINVAL for an unknown name, FR_EUNSUPPORTED when this build lacks the
 * backend, FR_ECUDA when no device is usable. */
int kern_backend_create(kern_backend_t **out, const char *device, int n_threads);

/* Creates the CPU backend with n_threads workers (0 = all cores). */
int kern_cpu_create(kern_backend_t **out, int n_threads);

/* Creates the CUDA backend on a device. FR_EUNSUPPORTED when built without
 * CUDA, FR_ECUDA when no device is usable. */
int kern_cuda_create(kern_backend_t **out, int device);

/* How many of a CUDA backend's FP8 GEMMs took their activations as the
 * kernel before wrote them (the FP8 twin, kcu_f8.cu) instead of quantizing
 * them; 0 for any other backend. For tests. */
uint64_t kern_cuda_f8_twin_hits(const kern_backend_t *b);

/* How many of a CUDA backend's prefill attention launches over an int8 or
 * FP8 pool read their K/V converted once for the step (kcu_attn.cu's kvd)
 * instead of converting each tile in the kernel; 0 for any other backend.
 * For tests. */
uint64_t kern_cuda_kvd_runs(const kern_backend_t *b);

/* Destroys a backend (NULL is fine). */
void kern_backend_destroy(kern_backend_t *b);

/* ---- CPU backend extras ----
 * Ownership note: a backend's ops->destroy(ctx) releases everything,
 * including the kern_backend_t it handed out (the CPU backend embeds it in
 * its context); kern_backend_destroy() only calls it. */

/* Name of the kernel path a CPU backend runs ("scalar", "avx2", "avx512", "avx512vnni"),
 * or NULL when b is not the CPU backend. FERRUM_CPU_ISA=<name> forces a path
 * at kern_cpu_create (FR_EUNSUPPORTED when this CPU cannot run it). */
const char *kern_cpu_isa(const kern_backend_t *b);

/* Whether this build and CPU can run the named path. */
bool kern_cpu_isa_supported(const char *name);

/* y[i] = expf((x[i] - m) / t) for i < n (y may be x), libm's bits, on the
 * kernel path kern_cpu_create would pick (the sampler's softmax). */
void kern_cpu_expf_shift(int n, const float *x, float m, float t, float *y);

#ifdef __cplusplus
}
#endif
