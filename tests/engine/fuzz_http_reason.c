/* fuzz_http_reason.c - libFuzzer target over the reasoning parsers: any
 * model output, for each parser, fed whole and in pieces whose size the
 * input's first byte picks; the pieces must give the reasoning and the
 * content that the whole gives. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_util.h"
#include "coordinator/http/http_reason.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct {
  char *r, *c;
  size_t r_len, c_len;
  bool thought;
} split_t;

static void add(char **buf, size_t *len, const char *s, size_t n) {
  *buf = realloc(*buf, *len + n + 1);
  FR_ASSERT(*buf);
  if (n) memcpy(*buf + *len, s, n);
  *len += n;
}

/* The text fed in pieces of `piece` bytes (the whole: piece >= n). */
static split_t reason_run(coord_reason_parser_t kind, const char *text, size_t n, size_t piece) {
  split_t out = {0};
  coord_reason_stream_t st;
  coord_reason_out_t o;
  coord_reason_stream_init(&st, kind);
  coord_reason_out_init(&o);
  for (size_t i = 0;; i += piece) {
    size_t k = i + piece < n ? piece : n - i;
    bool last = i + piece >= n;
    FR_ASSERT(coord_reason_stream_feed(&st, text + i, k, last, &o) == 0);
    FR_ASSERT(o.reasoning_len == 0 || o.reasoning[o.reasoning_len] == 0);
    add(&out.r, &out.r_len, o.reasoning, o.reasoning_len);
    add(&out.c, &out.c_len, o.content, o.content_len);
    out.thought = o.thought;
    if (last) break;
  }
  coord_reason_out_free(&o);
  coord_reason_stream_free(&st);
  /* nothing is lost or made up: the parts are the text less the tags */
  FR_ASSERT(out.r_len + out.c_len <= n);
  return out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  size_t piece = (size_t)(data[0] % 16) + 1;
  const char *text = (const char *)data + 1;
  size_t n = size - 1;
  for (int kind = COORD_REASON_PARSER_QWEN3; kind <= COORD_REASON_PARSER_DEEPSEEK_R1; kind++) {
    split_t whole = reason_run((coord_reason_parser_t)kind, text, n, n + 1);
    split_t parts = reason_run((coord_reason_parser_t)kind, text, n, piece);
    FR_ASSERT(whole.r_len == parts.r_len && !memcmp(whole.r, parts.r, whole.r_len));
    FR_ASSERT(whole.c_len == parts.c_len && !memcmp(whole.c, parts.c, whole.c_len));
    FR_ASSERT(whole.thought == parts.thought);
    free(whole.r), free(whole.c), free(parts.r), free(parts.c);
  }
  return 0;
}
