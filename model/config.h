/* config.h - a model's hyperparameters, read from GGUF metadata or a
 * Hugging Face config.json, in one struct the layer stack uses. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  MODEL_ARCH_LLAMA = 0, /* LlamaForCausalLM, MistralForCausalLM, GGUF llama */
  MODEL_ARCH_QWEN2,     /* Qwen2ForCausalLM: q/k/v bias */
  MODEL_ARCH_QWEN3,     /* Qwen3ForCausalLM: per-head q/k RMSNorm */
  MODEL_ARCH_QWEN3MOE,  /* Qwen3MoeForCausalLM: qwen3 attention, mixture-of-experts FFN */
  MODEL_ARCH_BERT,      /* BertModel, GGUF bert: an encoder (model/bert.c), embeddings only */
} model_arch_t;

#define MODEL_MAX_EXPERTS 1024       /* experts per layer a config may name */
#define MODEL_MAX_MLP_ONLY 64        /* HF mlp_only_layers entries kept */

/* Embedding models (--task embed): what a step returns per sequence
 * instead of logits, from the final norm's output: LAST its last token's
 * row (decoder embedding models such as Qwen3-Embedding), MEAN the mean of
 * its rows, CLS its first row. MEAN and CLS need the whole prompt in one
 * step. */
typedef enum { MODEL_POOL_NONE = 0, MODEL_POOL_LAST = 1, MODEL_POOL_MEAN = 2, MODEL_POOL_CLS = 3 } model_pooling_t;

typedef enum {
  MODEL_ROPE_SCALING_NONE = 0,
  MODEL_ROPE_SCALING_LINEAR,
  MODEL_ROPE_SCALING_LLAMA3,
} model_rope_scaling_t;

typedef struct {
  model_arch_t arch;
  char arch_name[32];  /* "llama", "qwen2", "qwen3", "qwen3moe", "bert" */
  char name[128];      /* general.name or the folder name, may be empty */
  int n_layers;        /* block_count / num_hidden_layers */
  int dim;             /* embedding_length / hidden_size */
  int ffn_dim;         /* feed_forward_length / intermediate_size (dense layers) */
  int n_heads;         /* attention.head_count */
  int n_kv_heads;      /* attention.head_count_kv */
  int head_dim;        /* key_length, or dim / n_heads */
  int vocab_size;      /* rows of the embedding table */
  int max_ctx;         /* context_length / max_position_embeddings */
  float norm_eps;      /* layer_norm_rms_epsilon / rms_norm_eps */
  float rope_theta;    /* rope.freq_base / rope_theta */
  int rope_dim;        /* rope.dimension_count (= head_dim normally) */
  model_rope_scaling_t rope_scaling;
  float rope_factor;               /* linear / llama3 factor */
  float rope_low_freq_factor;      /* llama3 */
  float rope_high_freq_factor;     /* llama3 */
  int rope_orig_ctx;               /* llama3 original_max_position_embeddings */
  bool tied_embeddings;            /* no output.weight / lm_head.weight */
  bool attn_bias;                  /* q/k/v biases present (qwen2, llama attention_bias) */
  bool qk_norm;                    /* qwen3 per-head q/k norms */
  int sliding_window;              /* keys a query sees, itself included; 0 = off */
  int swa_first_layer;             /* the window applies to layers >= this (Qwen2's max_window_layers) */
  int bos_id;                      /* -1 when the file names none */
  int n_eos;                       /* eos ids from the model file (0..8) */
  int eos_ids[8];                  /* config.json eos_token_id (int or list) / GGUF eos_token_id */
  /* Mixture of experts (qwen3moe); n_experts 0 = every layer dense. */
  int n_experts;                   /* expert_count / num_experts */
  int n_experts_used;              /* expert_used_count / num_experts_per_tok (top-k) */
  int expert_ffn_dim;              /* expert_feed_forward_length / moe_intermediate_size */
  bool norm_topk;                  /* renormalise the top-k weights to sum 1 (norm_topk_prob) */
  int moe_step;                    /* decoder_sparse_step: layer il is sparse when (il+1) % step == 0 */
  int n_mlp_only;                  /* HF mlp_only_layers: layers kept dense */
  int16_t mlp_only[MODEL_MAX_MLP_ONLY];
  /* The pooling the model's files name: GGUF <arch>.pooling_type, or a
   * sentence-transformers Pooling module beside config.json; NONE when
   * they name none. */
  model_pooling_t pooling;
  /* BERT encoders: GELU's exact erf form (transformers' hidden_act "gelu")
   * or the tanh approximation (gelu_new, and llama.cpp's for GGUF). */
  bool gelu_erf;
} model_config_t;

/* The name of a pooling ("none", "last", "mean", "cls"), and the pooling
 * of a name in any case (vLLM's MEAN too; -1 when unknown). */
const char *model_pooling_name(model_pooling_t p);
int model_pooling_parse(const char *name);

/* Human-readable name of an architecture. */
const char *model_arch_name(model_arch_t arch);

/* Whether layer il runs a mixture-of-experts FFN (else a dense one of
 * ffn_dim): the config has experts, il is not in mlp_only_layers and
 * (il + 1) is a multiple of moe_step. */
bool model_config_layer_moe(const model_config_t *c, int il);

#ifdef __cplusplus
}
#endif
