/* quant.h - GPTQ and AWQ int4 checkpoints (Hugging Face safetensors).
 *
 * A quantized linear layer X is stored as X.qweight, X.qzeros, X.scales
 * (and, for GPTQ, X.g_idx) instead of X.weight; config.json's
 * quantization_config (or a quantize_config.json beside it) says how. The
 * source (source.c) turns each layer into one KERN_I4G tensor in memory:
 * the file is read as it is, and no converted copy is written. Bit layouts,
 * and where they were checked: docs/QUANTIZED.md.
 *
 * Every size and value of the file is checked: a hostile file is an error
 * (FR_EFORMAT, or FR_EUNSUPPORTED for a valid layout ferrum does not run),
 * never a read out of bounds.
 *
 * Threads: pure functions of their arguments; any thread.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { MODEL_QUANT_NONE = 0, MODEL_QUANT_GPTQ = 1, MODEL_QUANT_AWQ = 2 } model_quant_method_t;

typedef struct {
  model_quant_method_t method;
  int bits;           /* 4 */
  int group_size;     /* input columns per group: a multiple of 32, or -1 (one group per column) */
  bool zeros_minus_1; /* GPTQ checkpoint_format "gptq" (v1): qzeros hold zero - 1 */
} model_quant_t;

/* Reads the quantization config of a Hugging Face folder: config.json's
 * quantization_config, else dir/quantize_config.json. q->method is
 * MODEL_QUANT_NONE when the model has neither. */
int model_quant_read(model_quant_t *q, const char *dir);

/* Parses one quantization config object (JSON text): the value of
 * quantization_config, or a quantize_config.json. */
int model_quant_parse(model_quant_t *q, const void *json, size_t len);

/* A GPTQ/AWQ layer as KERN_I4G rows: out rows (output features) of in
 * columns. data (out * in / 32 blocks of 24 bytes) and perm are malloc'd
 * and owned by the caller. perm is NULL, or (in) input columns: column k of
 * data multiplies x[perm[k]] (GPTQ act-order: the columns sorted by group,
 * so that every 32-column block has one scale and zero). */
typedef struct {
  int64_t rows, cols;
  uint8_t *data;
  int32_t *perm;
} model_quant_weight_t;

/* Repacks layer `base` (the name before ".qweight") of st. */
int model_quant_repack(const model_quant_t *q, const model_st_t *st, const char *base, model_quant_weight_t *out);

/* "gptq", "awq" or "none". */
const char *model_quant_name(model_quant_method_t m);

#ifdef __cplusplus
}
#endif
