/* fuzz_http_tools.c - libFuzzer target over the tool call parsers: any
 * model output, for each parser, fed whole and in pieces whose sizes the
 * input's first byte picks; the pieces must give what the whole gives. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_util.h"
#include "coordinator/http/http_tools.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Content and calls of text fed in pieces of `piece` bytes, folded into one
 * string: the content, then the calls (a whole answer decides its content
 * in one feed, so the two interleave differently in a stream). */
static char *tools_run(coord_tool_parser_t kind, const char *text, size_t n, size_t piece) {
  coord_tool_stream_t st;
  coord_tool_out_t o;
  coord_tool_stream_init(&st, kind, 1);
  coord_tool_out_init(&o);
  size_t cap = 64, len = 0, calls_len = 0;
  static char calls[1 << 16];
  calls[0] = 0;
  char *acc = malloc(cap);
  FR_ASSERT(acc);
  acc[0] = 0;
  for (size_t i = 0;; i += piece) {
    size_t k = i + piece < n ? piece : n - i;
    bool last = i + piece >= n;
    FR_ASSERT(coord_tool_stream_feed(&st, text + i, k, last, &o) == 0);
    size_t need = len + o.content_len + 8;
    if (need > cap) {
      cap = need * 2;
      acc = realloc(acc, cap);
      FR_ASSERT(acc);
    }
    memcpy(acc + len, o.content ? o.content : "", o.content_len);
    len += o.content_len;
    for (size_t c = 0; c < o.n_calls; c++) {
      int w = snprintf(calls + calls_len, sizeof calls - calls_len, "\x01%s\x02%s\x03", o.calls[c].name, o.calls[c].args);
      calls_len = FR_MIN(calls_len + (size_t)w, sizeof calls - 1);
    }
    acc[len] = 0;
    if (last) break;
  }
  coord_tool_out_free(&o);
  coord_tool_stream_free(&st);
  acc = realloc(acc, len + calls_len + 2);
  FR_ASSERT(acc);
  acc[len] = '\x04';
  memcpy(acc + len + 1, calls, calls_len + 1);
  return acc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  size_t piece = (data[0] % 7) + 1;
  const char *text = (const char *)data + 1;
  size_t n = size - 1;
  for (int k = COORD_TOOL_PARSER_HERMES; k <= COORD_TOOL_PARSER_MISTRAL; k++) {
    char *whole = tools_run((coord_tool_parser_t)k, text, n, n ? n : 1);
    char *parts = tools_run((coord_tool_parser_t)k, text, n, piece);
    FR_ASSERT(strcmp(whole, parts) == 0);
    free(whole);
    free(parts);
  }
  coord_tool_out_t o;
  coord_tool_out_init(&o);
  FR_ASSERT(coord_tool_forced_calls(COORD_TOOL_CHOICE_REQUIRED, NULL, text, n, 1, &o) == 0);
  FR_ASSERT(coord_tool_forced_calls(COORD_TOOL_CHOICE_NAMED, "f", text, n, 1, &o) == 0);
  coord_tool_out_free(&o);
  return 0;
}
