/* fuzz_safetensors.c - libFuzzer target: model_st_open_memory on arbitrary
 * bytes, then every tensor's first and last byte is read, and every
 * "X.qweight" is repacked as a GPTQ (v1 and v2) and an AWQ layer of group
 * size 32 (model/quant.h), whose output is read whole, as is its part for
 * the upper half of its inputs (model_quant_cols, a TP=2 rank's); every
 * F8_E4M3 "X.weight" is opened as an FP8 layer, with scales per tensor or
 * row and with blocks of 2 x 3 and 128 x 128 (model_quant_fp8_open), decoded
 * whole and without its first row and first two columns
 * (model_quant_fp8_read), and packed whole where a backend that keeps FP8
 * would take it so (model_quant_fp8_pack). */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_util.h"
#include "kernels/kern_types.h"
#include "model/quant.h"
#include "model/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint64_t sink;

static void read_whole(const model_quant_weight_t *w) {
  const size_t bytes = kern_row_bytes(KERN_I4G, w->cols) * (size_t)w->rows;
  for (size_t i = 0; i < bytes; i++) sink += w->data[i];
  for (int64_t k = 0; w->perm && k < w->cols; k++) sink += (uint64_t)w->perm[k];
}

static void cut_upper_half(const model_quant_weight_t *w) {
  const int64_t c0 = w->x_cols / 64 * 32;
  model_quant_weight_t part;
  if (model_quant_cols(w, c0, w->x_cols - c0, &part) != 0) return;
  read_whole(&part);
  free(part.data);
  free(part.perm);
}

/* name without its last sfx_len characters into base (256 bytes); false when too long. */
static bool base_of(const char *name, size_t sfx_len, char *base) {
  const size_t n = strlen(name) - sfx_len;
  if (n >= 256) return false;
  memcpy(base, name, n);
  base[n] = 0;
  return true;
}

static void repack(const model_st_t *st, const char *qweight) {
  static const model_quant_t cfgs[] = {
      {.method = MODEL_QUANT_GPTQ, .bits = 4, .group_size = 32, .zeros_minus_1 = true},
      {.method = MODEL_QUANT_GPTQ, .bits = 4, .group_size = -1},
      {.method = MODEL_QUANT_AWQ, .bits = 4, .group_size = 32}};
  char base[256];
  if (!base_of(qweight, strlen(".qweight"), base)) return;
  for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
    model_quant_weight_t w;
    if (model_quant_repack(&cfgs[c], st, base, &w) != 0) continue;
    read_whole(&w);
    cut_upper_half(&w);
    fr_free_aligned(w.data);
    free(w.perm);
  }
}

static void decode_fp8(const model_st_t *st, const char *weight) {
  static const model_quant_t cfgs[] = {{.method = MODEL_QUANT_FP8, .bits = 8},
                                       {.method = MODEL_QUANT_FP8, .bits = 8, .fp8_block = {2, 3}},
                                       {.method = MODEL_QUANT_FP8, .bits = 8, .fp8_block = {128, 128}}};
  char base[256];
  if (!base_of(weight, strlen(".weight"), base)) return;
  for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
    model_fp8_layer_t l;
    if (model_quant_fp8_open(&cfgs[c], st, base, &l) != 0) continue;
    uint16_t *w = fr_malloc((size_t)(l.rows * l.cols) * sizeof *w);
    if (model_quant_fp8_read(&l, 0, l.rows, 0, l.cols, NULL, w) == 0)
      for (int64_t i = 0; i < l.rows * l.cols; i++) sink += w[i];
    if (l.rows > 1 && l.cols > 2 && model_quant_fp8_read(&l, 1, l.rows - 1, 2, l.cols - 2, NULL, w) == 0)
      sink += w[0];
    free(w);
    const kern_type_t form = model_quant_fp8_form(&l, 0, l.rows, 0, l.cols);
    if (form != KERN_BF16) { /* as a backend that keeps FP8 takes it */
      uint8_t *q = fr_malloc((size_t)(l.rows * l.cols));
      float *s = fr_malloc(kern_f8_scale_bytes(form, l.rows, l.cols));
      if (model_quant_fp8_pack(&l, form, 0, l.rows, 0, l.cols, NULL, q, s) == 0) sink += q[0] + (s[0] > 0.f);
      free(q), free(s);
    }
    model_quant_fp8_close(&l);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  model_st_t *st;
  if (model_st_open_memory(&st, data, size) != 0) return 0;
  for (size_t i = 0; i < st->n_tensors; i++) {
    const st_tensor_t *t = &st->tensors[i];
    const uint8_t *p = t->data;
    if (t->bytes) sink += p[0] + p[t->bytes - 1];
    sink += (uint64_t)t->n_dims + (model_st_tensor(st, t->name) == t);
    size_t len = strlen(t->name);
    if (len > 8 && !strcmp(t->name + len - 8, ".qweight")) repack(st, t->name);
    if (len > 7 && !strcmp(t->name + len - 7, ".weight") && !strcmp(t->dtype_name, "F8_E4M3")) decode_fp8(st, t->name);
  }
  model_st_close(st);
  return 0;
}
