/* fuzz_grammar.c - libFuzzer target over constrained decoding's compilers
 * and machine: the input's first byte picks a JSON schema or a regex, the
 * rest up to a NUL is the schema / pattern, what follows is an output fed
 * byte by byte. Nothing may crash, loop or leak; a refused schema has a
 * message. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_util.h"
#include "model/grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static model_gstate_t st;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const char *p = (const char *)data + 1;
  size_t n = size - 1, plen = strnlen(p, n);
  model_grammar_t *g = NULL;
  char err[256] = "";
  int rc = data[0] & 1 ? model_grammar_regex(&g, p, plen, err, sizeof err) : model_grammar_json(&g, p, plen, err, sizeof err);
  if (rc) {
    FR_ASSERT(err[0] != 0 || rc == -12);
    return 0;
  }
  model_gstate_init(g, &st);
  const char *out = plen < n ? p + plen + 1 : "";
  size_t olen = plen < n ? n - plen - 1 : 0;
  for (size_t i = 0; i < olen; i++) {
    if (!model_gstate_feed(g, &st, out + i, 1)) break;
    (void)model_gstate_can_end(g, &st);
    (void)model_gstate_must_end(g, &st);
  }
  model_grammar_destroy(g);
  return 0;
}
