/* bert.h - BERT-family encoders (arch bert; internal to model/): their
 * weights, the Hugging Face names of them, the shape checks and the
 * forward pass.
 *
 * The encoder, as transformers' BertModel and llama.cpp's bert graph:
 *   x = LayerNorm(tok_embd[token] + pos_embd[position] + type_embd[0])
 *   per layer: a = softmax(q k^T / sqrt(head_dim)) v over every token of
 *              the sequence (bidirectional), q/k/v = x W + b;
 *              x = LayerNorm(x + a Wo + bo);
 *              x = LayerNorm(x + gelu(x Wup + bup) Wdown + bdown)
 *   pooled = mean, first (CLS) or last row of x per sequence.
 * A sequence runs whole in one step (positions from 0, no KV cache): the
 * coordinator schedules its jobs whole (coord_job_t.whole). CPU backend
 * only (the layer_norm, gelu and attention_full ops).
 */
#pragma once

#include "model/model.h"

typedef struct {
  kern_weight_t wq, wk, wv;             /* (dim, dim) */
  kern_weight_t bq, bk, bv;             /* F32 (1, dim) */
  kern_weight_t wo, bo;                 /* (dim, dim), F32 (1, dim) */
  kern_weight_t attn_norm, attn_norm_b; /* F32 (1, dim): LayerNorm after attention */
  kern_weight_t w_up, b_up;             /* (ffn_dim, dim), F32 (1, ffn_dim) */
  kern_weight_t w_down, b_down;         /* (dim, ffn_dim), F32 (1, dim) */
  kern_weight_t out_norm, out_norm_b;   /* F32 (1, dim): LayerNorm after the FFN */
} model_bert_layer_t;

typedef struct model_bert {
  kern_weight_t pos_type;               /* F32 (max_ctx, dim): position rows plus token type 0's row */
  kern_weight_t embd_norm, embd_norm_b; /* F32 (1, dim) */
  model_bert_layer_t *layers;           /* (n_layers) */
} model_bert_t;

/* model__bert_hf_name and model__bert_check_tensors (bert_names.c) are
 * declared in source.h: the source reader uses them. */

/* Loads the encoder's weights into m->bert (and m->tok_embd); FR_EUNSUPPORTED
 * on a backend without the encoder ops or for a load without pooling. */
int model__bert_load(model_t *m);

/* Releases m->bert's weights. */
void model__bert_release(model_t *m);

/* The encoder over a step whose sequences start at position 0; leaves
 * the pooled rows in m->last. */
int model__bert_forward(model_t *m, const kern_step_t *st);
