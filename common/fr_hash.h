/* fr_hash.h - a fast, portable, seedable 64-bit hash for byte strings (used
 * by the prefix cache and hash tables). Not cryptographic. Same result on
 * every little-endian machine. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

uint64_t fr_hash64(const void *data, size_t len, uint64_t seed);

/* Mixes one 64-bit value (splitmix64 finalizer). */
static inline uint64_t fr_mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

#ifdef __cplusplus
}
#endif
