/* fuzz_proto.c - libFuzzer target for one family of proto decoders
 * (FUZZ_ACCEPT: the type mask). Any input must decode or fail cleanly; a
 * decoded message must encode, and that encoding must decode and encode
 * again to the same bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/proto.h"

#ifndef FUZZ_ACCEPT
#define FUZZ_ACCEPT PROTO_ACCEPT_ANY
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static proto_msg_t m1, m2;
  static proto_buf_t b1, b2;
  if (proto_msg_decode(&m1, data, size, FUZZ_ACCEPT) != 0) return 0;
  if (!(FUZZ_ACCEPT & PROTO_MASK(m1.type))) abort();
  if (proto_msg_encode(&b1, &m1) != 0) abort(); /* what decodes, encodes */
  if (proto_msg_decode(&m2, b1.data, b1.len, FUZZ_ACCEPT) != 0) abort();
  if (m2.type != m1.type) abort();
  if (proto_msg_encode(&b2, &m2) != 0) abort();
  if (b1.len != b2.len || memcmp(b1.data, b2.data, b1.len)) abort();
  return 0;
}
