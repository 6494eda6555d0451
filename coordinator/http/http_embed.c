/* http_embed.c - the body of a /v1/embeddings answer (OpenAI's layout, as
 * vLLM serves it): each vector L2-normalized, as a list of floats or as
 * base64 of its little-endian float32 bytes. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_util.h"
#include "coordinator/http/http_internal.h"

/* Normalizes v (n floats) to unit L2 length in place (a zero vector stays). */
static void embed_normalize(float *v, uint32_t n) {
  double ss = 0;
  for (uint32_t i = 0; i < n; i++) ss += (double)v[i] * v[i];
  if (ss <= 0) return;
  float inv = (float)(1.0 / sqrt(ss));
  for (uint32_t i = 0; i < n; i++) v[i] *= inv;
}

/* base64 (RFC 4648, padded) of n bytes; the caller frees it. */
static char *embed_base64(const uint8_t *p, size_t n) {
  static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  char *out = fr_malloc(4 * ((n + 2) / 3) + 1), *o = out;
  for (size_t i = 0; i < n; i += 3) {
    uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
    *o++ = tab[v >> 18 & 63];
    *o++ = tab[v >> 12 & 63];
    *o++ = i + 1 < n ? tab[v >> 6 & 63] : '=';
    *o++ = i + 2 < n ? tab[v & 63] : '=';
  }
  *o = '\0';
  return out;
}

/* The vector as JSON: a list of numbers, or a base64 string of float32 LE. */
static json_t *embed_value(const float *v, uint32_t n, bool base64) {
  if (base64) {
    uint8_t *bytes = fr_malloc((size_t)n * 4 + 1);
    for (uint32_t i = 0; i < n; i++) {
      uint32_t u;
      memcpy(&u, &v[i], 4);
      for (int k = 0; k < 4; k++) bytes[4 * i + (uint32_t)k] = (uint8_t)(u >> (8 * k));
    }
    char *s = embed_base64(bytes, (size_t)n * 4);
    json_t *j = json_string(s);
    free(s);
    free(bytes);
    return j;
  }
  json_t *a = json_array();
  for (uint32_t i = 0; i < n; i++) json_array_append_new(a, json_real(v[i]));
  return a;
}

char *coord_http_embed_json(const char *model, float *const *vecs, const uint32_t *n, size_t count, bool base64,
                            uint32_t prompt_tokens) {
  json_t *data = json_array();
  for (size_t i = 0; i < count; i++) {
    embed_normalize(vecs[i], n[i]);
    json_array_append_new(data, json_pack("{s:s,s:I,s:o}", "object", "embedding", "index", (json_int_t)i,
                                          "embedding", embed_value(vecs[i], n[i], base64)));
  }
  json_t *root = json_pack("{s:s,s:o,s:s,s:{s:I,s:I}}", "object", "list", "data", data, "model", model, "usage",
                           "prompt_tokens", (json_int_t)prompt_tokens, "total_tokens", (json_int_t)prompt_tokens);
  char *s = root ? json_dumps(root, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
  json_decref(root);
  return s;
}
