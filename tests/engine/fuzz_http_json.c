/* fuzz_http_json.c - libFuzzer target over the HTTP request-body parser:
 * any bytes, the three APIs (the first byte: 0 completions, 1 chat, 2
 * embeddings, mod 4); each prompt of a parsed request is also encoded as a
 * submit (the encoder must accept everything the parser lets through), and
 * an embeddings answer is built from random vectors. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/fr_util.h"
#include "coordinator/http/http_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  coord_http_api_t api = data[0] % 4 == 2 ? COORD_HTTP_API_EMBEDDINGS
                         : data[0] & 1  ? COORD_HTTP_API_CHAT
                                        : COORD_HTTP_API_COMPLETIONS;
  coord_http_req_t r;
  coord_http_err_t e;
  if (coord_http_req_parse(&r, api, (const char *)data + 1, size - 1, "smol", 2048, &e) == 0) {
    r.sub.id = 1;
    proto_buf_t b;
    proto_buf_init(&b);
    FR_ASSERT(r.n_prompts >= 1 && r.n >= 1 && r.best_of >= r.n);
    FR_ASSERT((uint64_t)r.n_prompts * r.best_of <= COORD_HTTP_MAX_SEQS);
    for (uint32_t i = 0; i < r.n_prompts; i++) {
      coord_http_req_prompt(&r, i);
      FR_ASSERT(proto_submit_encode(&b, &r.sub) == 0);
    }
    proto_buf_free(&b);
    if (api == COORD_HTTP_API_EMBEDDINGS) {
      float v[5] = {(float)size, -1.5f, 0.0f, 3.25e-7f, data[0]}, *vecs[2] = {v, v};
      uint32_t n[2] = {5, (uint32_t)(size % 6)};
      char *s = coord_http_embed_json("smol", vecs, n, 2, r.base64, r.n_prompts);
      FR_ASSERT(s != NULL);
      free(s);
    }
    coord_http_req_free(&r);
  } else {
    FR_ASSERT(e.status >= 400 && e.status < 600);
    char *s = coord_http_error_json(&e);
    FR_ASSERT(s != NULL);
    free(s);
  }
  return 0;
}
