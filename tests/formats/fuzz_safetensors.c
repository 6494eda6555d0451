/* fuzz_safetensors.c - libFuzzer target: model_st_open_memory on arbitrary
 * bytes, then every tensor's first and last byte is read. */
#include <stddef.h>
#include <stdint.h>

#include "model/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint64_t sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  model_st_t *st;
  if (model_st_open_memory(&st, data, size) != 0) return 0;
  for (size_t i = 0; i < st->n_tensors; i++) {
    const st_tensor_t *t = &st->tensors[i];
    const uint8_t *p = t->data;
    if (t->bytes) sink += p[0] + p[t->bytes - 1];
    sink += (uint64_t)t->n_dims + (model_st_tensor(st, t->name) == t);
  }
  model_st_close(st);
  return 0;
}
