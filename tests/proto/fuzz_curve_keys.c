/* fuzz_curve_keys.c - libFuzzer target over the CURVE key file and key
 * list parsers (proto/curve.c): any bytes; what they accept must be real
 * keys. The first byte picks the parser. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_util.h"
#include "proto/curve.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const char *text = (const char *)data + 1;
  uint8_t raw[32];
  if (data[0] & 1) {
    uint8_t *keys;
    int n;
    if (proto_curve_parse_list("fuzz", text, size - 1, &keys, &n) == 0) {
      FR_ASSERT(n >= 0 && (n == 0 || keys));
      FR_ASSERT((size_t)n * 41 <= size + 40);
      free(keys);
    }
    return 0;
  }
  char pub[PROTO_CURVE_Z85], sec[PROTO_CURVE_Z85];
  if (proto_curve_parse("fuzz", text, size - 1, pub, sec) == 0) {
    FR_ASSERT(!pub[0] || (strlen(pub) == 40 && proto_curve_decode(raw, pub) == 0));
    FR_ASSERT(!sec[0] || (strlen(sec) == 40 && proto_curve_decode(raw, sec) == 0));
  }
  return 0;
}
