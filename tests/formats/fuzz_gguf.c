/* fuzz_gguf.c - libFuzzer target: model_gguf_open_memory on arbitrary bytes,
 * then every key, array element and tensor byte is touched, and the config
 * reader runs over whatever opened. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "model/gguf.h"
#include "model/source.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint64_t sink;

static void touch_kv(const gguf_kv_t *kv) {
  gguf_str_t s;
  int64_t i;
  float f;
  sink += kv->key.len ? (uint8_t)kv->key.ptr[kv->key.len - 1] : 0;
  if (kv->type != GGUF_T_ARRAY) return;
  for (uint64_t e = 0; e < kv->arr_count; e++) {
    if (model_gguf_arr_str(kv, e, &s) == 0 && s.len) sink += (uint8_t)s.ptr[s.len - 1];
    if (model_gguf_arr_i64(kv, e, &i) == 0) sink += (uint64_t)i;
    if (model_gguf_arr_f32(kv, e, &f) == 0) sink += (uint64_t)(f == f);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  model_gguf_t *g;
  if (model_gguf_open_memory(&g, data, size) != 0) return 0;
  for (uint64_t k = 0; k < g->n_kv; k++) {
    const gguf_kv_t *kv = &g->kv[k];
    char key[128];
    size_t n = kv->key.len < sizeof key - 1 ? kv->key.len : sizeof key - 1;
    memcpy(key, kv->key.ptr, n);
    key[n] = 0;
    int64_t i;
    float f;
    bool b;
    gguf_str_t s;
    (void)model_gguf_get_i64(g, key, &i);
    (void)model_gguf_get_f32(g, key, &f);
    (void)model_gguf_get_bool(g, key, &b);
    if (model_gguf_get_str(g, key, &s) == 0 && s.len) sink += (uint8_t)s.ptr[s.len - 1];
    touch_kv(kv);
  }
  for (uint64_t t = 0; t < g->n_tensors; t++) {
    const uint8_t *p = g->tensors[t].data;
    sink += p[0] + p[g->tensors[t].bytes - 1];
  }
  model_config_t cfg;
  (void)model_config_from_gguf(&cfg, g);
  model_gguf_close(g);
  return 0;
}
