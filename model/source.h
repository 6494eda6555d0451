/* source.h - one view over a model on disk: a GGUF file or a Hugging Face
 * folder (config.json + safetensors + tokenizer.json).
 *
 * Tensors are named with GGUF names ("blk.3.attn_q.weight") whatever the
 * format; HF names are mapped (embed_tokens -> token_embd, ...). Experts:
 * GGUF stacks a layer's experts in one 3-D tensor (blk.N.ffn_gate_exps.weight,
 * n_mats experts); HF keeps one tensor per expert, named here
 * blk.N.ffn_gate_exps.E.weight (E the expert), and mlp.gate (the router)
 * is blk.N.ffn_gate_inp.weight. Shapes are
 * given as (rows, cols) of a row-major matrix: HF [out, in] and GGUF
 * ne=[in, out] are the same bytes. 1-D tensors have rows = 1.
 *
 * Rope convention: GGUF llama files store q/k permuted for interleaved
 * (NORM) rope; HF weights and GGUF qwen2/qwen3 use rotate-half (NEOX).
 * source->rope_mode says which one the weights need, so no weights are
 * permuted at load.
 *
 * GPTQ/AWQ folders: each quantized layer X (X.qweight, X.qzeros, X.scales,
 * X.g_idx) is one KERN_I4G tensor under X.weight's GGUF name, checked at
 * open and without data, the rows model_source_read reads repacked then
 * (quant.h); perm carries GPTQ act-order. FP8 folders: each
 * F8_E4M3 X.weight (with X.weight_scale or X.weight_scale_inv) is a BF16
 * tensor without data, its fp8 layer decoded when model_source_read reads
 * a part of it.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/kern_types.h"
#include "model/config.h"
#include "model/gguf.h"
#include "model/quant.h"
#include "model/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  const char *name;  /* GGUF name, borrowed */
  kern_type_t type;  /* F32, F16, BF16 or a quantized type */
  int64_t rows, cols;
  int64_t n_mats;    /* GGUF ne[2] * ne[3]: a stack of n_mats matrices of rows / n_mats rows
                      * (the experts of ffn_*_exps); 1 for matrices and HF tensors */
  const void *data;  /* mapped bytes, rows * kern_row_bytes(type, cols); NULL for a GPTQ/AWQ or FP8 layer */
  int fd;            /* the same bytes at file_off of this open file (the source's); -1: none */
  uint64_t file_off;
  const int32_t *perm; /* KERN_I4G from GPTQ act-order: input column of each column (kern_weight_t.perm), or NULL */
  model_quant_layer_t *quant; /* a GPTQ/AWQ layer of the checkpoint, read as KERN_I4G (owned; perm is its), or NULL */
  model_fp8_layer_t *fp8; /* an FP8 E4M3 layer of the checkpoint, read as BF16 (owned), or NULL */
} model_tensor_t;

typedef struct model_source {
  char *path;               /* as given, owned */
  model_config_t config;
  kern_rope_mode_t rope_mode;
  model_gguf_t *gguf;       /* set for GGUF files */
  model_st_t *st;           /* set for HF folders */
  model_quant_t quant;      /* HF: GPTQ/AWQ config (quant.h); method NONE for plain weights */
  char *tokenizer_json;     /* HF: path of tokenizer.json (owned), NULL if none */
  char *tokenizer_config_json; /* HF: path of tokenizer_config.json, NULL if none */
  size_t n_tensors;
  model_tensor_t *tensors;  /* (n_tensors), owned */
  fr_pool_t *pool;          /* threads decoding FP8 and repacking GPTQ/AWQ layers (made with the first), or NULL */
} model_source_t;

/* Opens a .gguf file or a HF folder and reads its config. */
int model_source_open(model_source_t **out, const char *path);
/* Opens only the config and tokenizer of a HF folder (config.json,
 * tokenizer.json): no weights, no tensor checks. For --load-format dummy. */
int model_source_open_config(model_source_t **out, const char *dir);
void model_source_close(model_source_t *s);

/* Tensor by GGUF name, NULL when absent. */
const model_tensor_t *model_source_tensor(const model_source_t *s, const char *name);

/* Rows [r0, r0 + nr) and columns [c0, c0 + nc) of t (c0 and nc whole
 * blocks of its type) into dst, nr rows of kern_row_bytes(t->type, nc):
 * copied from the mapping, repacked (a GPTQ/AWQ layer: its columns in
 * t->perm's order) or decoded (an FP8 layer). */
int model_source_read(const model_source_t *s, const model_tensor_t *t, int64_t r0, int64_t nr, int64_t c0, int64_t nc,
                      void *dst);

/* The pooling a sentence-transformers folder names (modules.json and its
 * Pooling module's config.json) into *out; no modules.json: *out is left
 * as it was. FR_EUNSUPPORTED for a mode ferrum does not run. */
int model_st_pooling(const char *dir, model_pooling_t *out);

/* BERT (bert_names.c): the GGUF name of a transformers BertModel tensor
 * (fr_malloc'd; an optional "bert." prefix is dropped), or NULL for one the
 * encoder does not use (the pooler); and the check that every tensor the
 * encoder needs exists with its shape. */
char *model__bert_hf_name(const char *hf);
int model__bert_check_tensors(const model_source_t *s);

/* Reads model_config_t from GGUF metadata / a config.json file. */
int model_config_from_gguf(model_config_t *cfg, const model_gguf_t *g);
int model_config_from_hf_json(model_config_t *cfg, const char *config_json_path);

/* Same as model_config_from_hf_json over a JSON text in memory (fuzzing,
 * tests); cfg->name is left empty. */
int model_config_from_hf_json_buf(model_config_t *cfg, const void *json, size_t len);

#ifdef __cplusplus
}
#endif
