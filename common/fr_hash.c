/* fr_hash.c - 64-bit hash: 8-byte lanes folded with multiply-xorshift and a
 * splitmix finalizer. */
#include "fr_hash.h"

#include <string.h>

static inline uint64_t fr__rd64(const unsigned char *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

uint64_t fr_hash64(const void *data, size_t len, uint64_t seed) {
  const unsigned char *p = data;
  uint64_t h = seed ^ (0x9e3779b97f4a7c15ull * (len + 1));
  while (len >= 8) {
    h = (h ^ fr_mix64(fr__rd64(p))) * 0xff51afd7ed558ccdull;
    h ^= h >> 32;
    p += 8;
    len -= 8;
  }
  uint64_t tail = 0;
  memcpy(&tail, p, len);
  h = (h ^ fr_mix64(tail ^ ((uint64_t)len << 56))) * 0xc4ceb9fe1a85ec53ull;
  return fr_mix64(h);
}
