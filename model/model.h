/* model.h - a loaded model: weights on a backend, the tokenizer, the chat
 * template, and the layer stack (llama, qwen2, qwen3, qwen3moe) written once over the
 * backend ops of kernels/kern.h.
 *
 * Threads: a model is driven by one thread (its backend's owner).
 * Memory: weights and activation scratch live on the backend; scratch is
 * sized at load for opts.max_tokens tokens and opts.max_seqs sequences per
 * step and reused (no allocation per step).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/kern.h"
#include "model/chat.h"
#include "model/config.h"
#include "model/shard.h"
#include "model/source.h"
#include "model/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A layer's projections. When the source tensors allow (same type, no
 * per-head q/k norm), q/k/v are loaded as one fused weight wqkv whose rows
 * are wq's, then wk's, then wv's (one matmul, one activation quantization),
 * and gate/up as one w_gate_up; the separate fields are then empty. */
typedef struct {
  kern_weight_t attn_norm;            /* F32 (1, dim) */
  kern_weight_t wqkv;                 /* (qd + 2*kvd, dim) fused, or empty */
  kern_weight_t bqkv;                 /* F32 (1, qd + 2*kvd) fused bias (qwen2), or empty */
  kern_weight_t wq, wk, wv;           /* (n_heads*head_dim, dim), (n_kv_heads*head_dim, dim) x2 */
  kern_weight_t bq, bk, bv;           /* F32 biases (qwen2), type 0 rows 0 when absent */
  kern_weight_t q_norm, k_norm;       /* F32 (1, head_dim) (qwen3) */
  kern_weight_t wo;                   /* (dim, n_heads*head_dim) */
  kern_weight_t ffn_norm;             /* F32 (1, dim) */
  kern_weight_t w_gate_up;            /* (2*ffn_dim, dim) fused, or empty */
  kern_weight_t w_gate, w_up;         /* (ffn_dim, dim) */
  kern_weight_t w_down;               /* (dim, ffn_dim) */
  /* Mixture-of-experts layers (model_config_layer_moe) instead of the dense
   * FFN above; expert_ffn is the rank's shard (cfg.expert_ffn_dim). */
  kern_weight_t router;               /* (n_experts, dim) ffn_gate_inp */
  kern_weight_t *exp_gate, *exp_up;   /* (n_experts) of (expert_ffn, dim), NULL on dense layers */
  kern_weight_t *exp_down;            /* (n_experts) of (dim, expert_ffn) */
} model_layer_t;

typedef enum { MODEL_LOAD_AUTO = 0, MODEL_LOAD_DUMMY = 1 } model_load_format_t;

typedef struct {
  int max_tokens;             /* tokens per step the scratch holds (default 512) */
  int max_seqs;               /* sequences per step (default 64) */
  model_load_format_t format; /* DUMMY: random weights of the config's shapes */
  kern_type_t dummy_type;     /* weight type for dummy weights (default act type) */
  bool dummy_q4_k_m;          /* with dummy_type Q4_K: llama.cpp's Q4_K_M mix, some tensors in Q6_K (dummy.c) */
  kern_type_t dummy_head_type; /* the embedding's and output's type (0: dummy_type; the gptq mix: F16) */
  int dummy_group;            /* I4G dummies: columns per (d, m) group, a multiple of 32 or -1 (a row; 0: 128) */
  kern_type_t dummy_fp8;      /* KERN_F8R or KERN_F8B: the layers' dense matmul dummies as an FP8 checkpoint's
                               * (a scale a row; 128 x 128 blocks) where the backend keeps FP8; 0: none */
  uint64_t seed;              /* dummy weights' seed */
  bool progress;              /* log load progress on stderr */
  int tp_rank, tp_size;       /* tensor parallel: load this rank's shard (model/shard.h); 0, 0 = whole */
  model_pooling_t pooling;    /* NONE: logits; else steps return pooled hidden states (model_out_width) */
  bool fp8_weights;           /* --quantization fp8: the layers' dense matmul weights kept as FP8 E4M3, a
                               * scale a row, quantized at load (kern_weight_t.fp8; backends with fp8_weights) */
} model_load_opts_t;

/* Host scratch for padding decode steps to graph shapes (forward.c). */
typedef struct {
  int cap_seqs;
  size_t cap_bt;
  int32_t *tokens, *positions, *slots, *q_start, *ctx_len, *block_tables;
} model_pad_t;

typedef struct model {
  /* The rank's shapes: n_heads, n_kv_heads and ffn_dim are its shard's
   * (the whole model's without tensor parallelism); full_cfg is the file's. */
  model_config_t cfg;
  model_config_t full_cfg;
  model_shard_t shard;
  model_source_t *src;        /* NULL for dummy configs */
  kern_backend_t *be;         /* borrowed */
  model_tokenizer_t *tok;     /* NULL when the model has no tokenizer (dummy); holds the chat template */
  kern_rope_t rope;
  kern_weight_t inv_freq;     /* F32 (1, rope_dim/2) */
  kern_weight_t tok_embd;     /* (vocab, dim) */
  kern_weight_t output_norm;  /* F32 (1, dim) */
  kern_weight_t output;       /* (vocab, dim), or this rank's (shard.n_vocab, dim) rows; aliases
                               * tok_embd when tied and whole */
  model_layer_t *layers;      /* (n_layers) */
  int max_tokens, max_seqs;
  size_t scratch_bytes; /* backend memory of the activation scratch below */
  /* activation scratch, backend memory, act_type elements */
  void *x;      /* (max_tokens, dim) residual stream */
  void *xn;     /* (max_tokens, dim) normed input */
  void *qkv;    /* (max_tokens, qd + 2*kvd): q, k, v of each token side by side */
  void *att;    /* (max_tokens, n_heads*head_dim) */
  void *gate;   /* (max_tokens, 2*ffn_dim): gate, up of each token side by side */
  void *up;     /* (max_tokens, ffn_dim): silu(gate) * up */
  void *last;   /* (max_seqs, dim) */
  void *logits; /* (max_seqs, vocab) */
  void *logits_part; /* tensor parallel, vocabulary split: (max_seqs, shard.n_vocab) this rank's slice */
  void **host_bufs; /* host copies that weights may borrow (converted vectors, dummy weights) */
  model_pad_t pad;  /* graph padding scratch */
  bool no_graphs;   /* FERRUM_NO_GRAPHS=1: run decode steps eagerly */
  bool fp8;         /* model_load_opts_t.fp8_weights */
  kern_type_t dummy_fp8; /* model_load_opts_t.dummy_fp8 */
  model_pooling_t pooling; /* NONE: steps return logits; else pooled hidden states (cfg.dim wide) */
  struct model_bert *bert; /* a BERT encoder's weights (model/bert.h), else NULL */
  bool file_reads;  /* the backend reads weights from the files itself (weight_load_file; FERRUM_LOAD_MMAP=1: no) */
  uint64_t comm_ns; /* tensor parallel: time in all_reduce calls so far, as the host saw it (the
                     * whole call on a host-memory backend; only the launch on a device) */
  int n_host_bufs;
  struct model_progress *progress; /* while weights load (model_impl.h), else NULL; borrowed */
} model_t;

/* Loads a GGUF file or HF folder onto a backend. On failure *out is NULL
 * and fr_last_error() says why. */
int model_load(model_t **out, const char *path, kern_backend_t *be, const model_load_opts_t *opts);

/* Builds a model of a config with random weights on the backend (vLLM's
 * --load-format dummy). */
int model_load_dummy(model_t **out, const model_config_t *cfg, kern_backend_t *be, const model_load_opts_t *opts);

/* Sets opts' dummy weights from a --type name: a weight type ("q4_k",
 * "bf16"), "q4_k_m" (llama.cpp's Q4_K / Q6_K mix), "gptq" (I4G layers,
 * F16 embedding and output), or "fp8" / "fp8-block" (an FP8 checkpoint's
 * layers, a scale a row / 128 x 128 blocks: dummy_fp8); NULL or "" leaves
 * the act type. Another name is FR_ENOTFOUND, with a message. */
int model_dummy_weights(model_load_opts_t *opts, const char *name);

/* --load-format dummy on a Hugging Face folder (or its config.json) whose
 * config is GPTQ or AWQ (quantization_config, or quantize_config.json):
 * the gptq mix at the config's group size, as vLLM's dummy load keeps a
 * checkpoint's quantization; FP8: "fp8-block" for weight_block_size
 * [128, 128], else "fp8". A built-in name or an unquantized folder
 * leaves opts as they are; a quantization config ferrum cannot run is an
 * error, as it is for the real load. */
int model_dummy_weights_of(model_load_opts_t *opts, const char *name_or_path);

void model_destroy(model_t *m);

/* The KV pool config this model needs for n_blocks of block_size tokens. */
kern_kv_config_t model_kv_config(const model_t *m, int block_size, int n_blocks, kern_type_t kv_type);

/* Runs the layer stack for one step (step->n_tokens <= max_tokens,
 * step->n_seqs <= max_seqs) and leaves the logits of each sequence's last
 * token in *logits: (n_seqs, vocab) act_type elements in backend memory,
 * valid until the next call; with pooling, (n_seqs, dim) pooled states. */
int model_forward(model_t *m, kern_kv_pool_t *pool, const kern_step_t *step, const void **logits);

/* model_forward with several logits rows per sequence (speculative
 * decoding verifies proposals): the last rows[s] tokens of sequence s
 * (1 <= rows[s] <= its tokens; at most max_seqs rows in all), in order, in
 * *logits. rows NULL: model_forward. Such a step never runs as a graph. */
int model_forward_rows(model_t *m, kern_kv_pool_t *pool, const kern_step_t *step, const int32_t *rows,
                       const void **logits);

/* After a forward pass (and before the next): the logits of the step's
 * tokens first..first + n (1 <= n <= max_seqs), any position, from the
 * final hidden states the pass left, into *logits as model_forward does
 * (overwriting its rows). Every tensor-parallel rank calls it (ranks with a
 * vocabulary slice gather on rank 0). Prompt logprobs use it. */
int model_logits_tokens(model_t *m, int first, int n, const void **logits);

/* Copies (n_seqs, model_out_width) logits (or pooled states) to host f32. */
int model_logits_to_host(model_t *m, const void *logits, int n_seqs, float *out);

/* The width of what a step returns per row: the vocabulary, or cfg.dim
 * for a model loaded with pooling. */
int model_out_width(const model_t *m);

#ifdef __cplusplus
}
#endif
