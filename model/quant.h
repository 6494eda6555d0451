/* quant.h - GPTQ and AWQ int4 and FP8 checkpoints (Hugging Face
 * safetensors).
 *
 * A quantized linear layer X is stored as X.qweight, X.qzeros, X.scales
 * (and, for GPTQ, X.g_idx) instead of X.weight; config.json's
 * quantization_config (or a quantize_config.json beside it) says how. The
 * source (source.c) turns each layer into one KERN_I4G tensor in memory:
 * the file is read as it is, and no converted copy is written. An FP8
 * layer (X.weight in F8_E4M3 with X.weight_scale or X.weight_scale_inv)
 * is checked at open and decoded into BF16 when it is read (quant_fp8.c),
 * only the part a rank loads. Bit layouts, and where they were checked:
 * docs/QUANTIZED.md.
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

#include "common/fr_pool.h"
#include "kernels/kern_types.h"
#include "model/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  MODEL_QUANT_NONE = 0,
  MODEL_QUANT_GPTQ = 1,
  MODEL_QUANT_AWQ = 2,
  MODEL_QUANT_FP8 = 3, /* quant_method "fp8", or "compressed-tensors" with 8-bit float weights */
} model_quant_method_t;

typedef struct {
  model_quant_method_t method;
  int bits;           /* 4 (GPTQ, AWQ) or 8 (FP8) */
  int group_size;     /* GPTQ/AWQ: input columns per group: a multiple of 32, or -1 (one group per column) */
  bool zeros_minus_1; /* GPTQ checkpoint_format "gptq" (v1): qzeros hold zero - 1 */
  int fp8_block[2];   /* FP8: (rows, columns) of a weight scale's block (weight_block_size, block_structure);
                       * 0, 0 when the scales are per tensor or per row */
} model_quant_t;

/* Reads the quantization config of a Hugging Face folder: config.json's
 * quantization_config, else dir/quantize_config.json. q->method is
 * MODEL_QUANT_NONE when the model has neither. */
int model_quant_read(model_quant_t *q, const char *dir);

/* Parses one quantization config object (JSON text): the value of
 * quantization_config, or a quantize_config.json. */
int model_quant_parse(model_quant_t *q, const void *json, size_t len);

/* A GPTQ/AWQ layer as KERN_I4G rows: `rows` rows (output features) of
 * `cols` columns. data (rows * cols / 32 blocks of 24 bytes) and perm are
 * malloc'd and owned by the caller. perm is NULL, or (cols) input columns:
 * column k of data multiplies x[perm[k]] (GPTQ act-order: the columns sorted
 * by group, so that every 32-column block has one scale and zero), or 0 where
 * perm[k] is -1 (padding, model_quant_cols). x_cols is the number of inputs:
 * cols, or fewer where there is padding. */
typedef struct {
  int64_t rows, cols, x_cols;
  uint8_t *data;
  int32_t *perm;
} model_quant_weight_t;

/* A GPTQ or AWQ layer of a checkpoint, checked (model_quant_open): its
 * packed tensors in the file's mapping and the order of its inputs,
 * repacked into KERN_I4G rows on demand (model_quant_rows). rows = out,
 * cols = in. */
typedef struct {
  model_quant_t q;                                 /* the config */
  const st_tensor_t *qweight, *qzeros, *scales, *g_idx; /* g_idx: GPTQ's, or NULL */
  int64_t in, out, groups;
  int32_t *perm; /* (in) model_quant_weight_t.perm of the whole layer, owned; NULL: the identity */
} model_quant_layer_t;

/* Opens layer `base` (the name before ".qweight") of st: every shape
 * checked against the packing, and the inputs sorted by group. */
int model_quant_open(const model_quant_t *q, const model_st_t *st, const char *base, model_quant_layer_t *out);
void model_quant_close(model_quant_layer_t *l);

/* Rows (outputs) [r0, r0 + nr) of l repacked into dst: nr rows of
 * kern_row_bytes(KERN_I4G, l->in), every input, in l->perm's order; over
 * pool's threads where pool is not NULL (the same bytes either way). */
int model_quant_rows(const model_quant_layer_t *l, int64_t r0, int64_t nr, fr_pool_t *pool, uint8_t *dst);

/* Repacks the whole layer `base` of st (model_quant_open, then every row). */
int model_quant_repack(const model_quant_t *q, const model_st_t *st, const char *base, model_quant_weight_t *out);

/* The part of layer w (as model_quant_repack makes it, perm or not) that
 * takes inputs [c0, c0 + nc): a rank's share of a row-parallel layer (o_proj,
 * down_proj) under tensor parallelism. Its x_cols is nc, and its perm (NULL
 * when the identity) is in the part's own input indices. Columns keep w's
 * order, and a new block starts wherever w's next block has another scale or
 * min (d, m) in some row, so each block still has one (d, m) per row and
 * decodes exactly as w does; a block a run leaves short is filled with
 * padding columns (perm -1, nibbles 0). Without a permutation, and with c0
 * and nc on block boundaries, that is the plain column slice. On failure
 * (a range outside w) *out is zeroed. */
int model_quant_cols(const model_quant_weight_t *w, int64_t c0, int64_t nc, model_quant_weight_t *out);

/* An FP8 E4M3 layer of a checkpoint, checked (model_quant_fp8_open): its
 * bytes in the file's mapping and its scales, decoded on demand. Scale
 * (i, j) covers rows [i * block_rows, ...) and columns [j * block_cols, ...):
 * one block of (rows, cols) for a scale per tensor, (1, cols) for a scale
 * per row, the config's fp8_block otherwise (edge blocks partial). */
typedef struct {
  char *base;           /* the layer's HF name (before ".weight"), owned */
  const uint8_t *bytes; /* rows x cols E4M3, row-major */
  int64_t rows, cols;
  float *scales;        /* (rows / block_rows rounded up) x scale_cols, owned */
  int64_t block_rows, block_cols, scale_cols;
} model_fp8_layer_t;

/* Opens layer `base` of st: base.weight (F8_E4M3, a matrix of 2 or more
 * rows) and base.weight_scale or base.weight_scale_inv (F32, BF16 or F16,
 * finite: one value, one a row, or one a fp8_block block). */
int model_quant_fp8_open(const model_quant_t *q, const model_st_t *st, const char *base, model_fp8_layer_t *out);
void model_quant_fp8_close(model_fp8_layer_t *l);

/* Rows [r0, r0 + nr) and columns [c0, c0 + nc) of l as BF16 into dst (nr
 * rows of nc): element (n, k) is bf16(e4m3(n, k) * scale), the product
 * rounded once to f32 and then to nearest even. The rows are shared out over
 * pool's threads (NULL: the caller's alone). A NaN byte (0x7f, 0xff) in the
 * range is an error. */
int model_quant_fp8_read(const model_fp8_layer_t *l, int64_t r0, int64_t nr, int64_t c0, int64_t nc, fr_pool_t *pool,
                         uint16_t *dst);

/* How rows [r0, r0 + nr) and columns [c0, c0 + nc) of l go to a backend
 * that keeps FP8 weights as they are in the file: KERN_F8R where a scale
 * covers whole rows (per tensor, per row), KERN_F8B where the scales are
 * 128 x 128 blocks and the part is whole blocks, else KERN_BF16 (decoded,
 * model_quant_fp8_read). */
kern_type_t model_quant_fp8_form(const model_fp8_layer_t *l, int64_t r0, int64_t nr, int64_t c0, int64_t nc);

/* That part in form (KERN_F8R or KERN_F8B, as model_quant_fp8_form gives
 * it): its bytes as they are into q (nr rows of nc), its scales into
 * scales (kern_types.h's layouts: KERN_F8R one a row; KERN_F8B nr / 128
 * block rows of kern_f8b_scale_cols(nc)). A NaN byte in the part is an
 * error, as for model_quant_fp8_read. */
int model_quant_fp8_pack(const model_fp8_layer_t *l, kern_type_t form, int64_t r0, int64_t nr, int64_t c0, int64_t nc,
                         fr_pool_t *pool, uint8_t *q, float *scales);

/* "gptq", "awq", "fp8" or "none". */
const char *model_quant_name(model_quant_method_t m);

#ifdef __cplusplus
}
#endif
