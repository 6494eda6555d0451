/* fr_util.h - small helpers: assertions, clocks, overflow-checked sizes,
 * fp16/bf16 conversion, allocation that aborts on host OOM (zmalloc's rule). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Invariant check that stays on in release builds. Never for bad input. */
#define FR_ASSERT(x)                                                           \
  do {                                                                         \
    if (!(x)) fr__assert_fail(#x, __FILE__, __LINE__);                         \
  } while (0)
void fr__assert_fail(const char *expr, const char *file, int line) __attribute__((noreturn));

#define FR_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define FR_MIN(a, b) ((a) < (b) ? (a) : (b))
#define FR_MAX(a, b) ((a) > (b) ? (a) : (b))

/* Host allocation: aborts with a message when the host is out of memory. */
void *fr_malloc(size_t n);
void *fr_calloc(size_t n, size_t size);
void *fr_realloc(void *p, size_t n);
char *fr_strdup(const char *s);
char *fr_strndup(const char *s, size_t n);
/* 64-byte aligned; free with fr_free_aligned. */
void *fr_malloc_aligned(size_t n);
void fr_free_aligned(void *p);

/* Monotonic clock in nanoseconds. */
uint64_t fr_now_ns(void);

/* Whether a loop that waits on a step polls without sleeping (the
 * coordinator while a step is out, a worker after each message): a thread's
 * wake-up costs tens of microseconds on a virtual machine, against a
 * batch-1 GPU step of 3-5 ms, for one core kept busy. FERRUM_BUSY_POLL=0
 * off, another value on; unset: `gpu` (CPU workers need every core). */
bool fr_busy_poll(bool gpu);

/* a*b and a+b with overflow detection: return 0 and store, or -1. */
static inline int fr_mul_size(size_t a, size_t b, size_t *out) {
  return __builtin_mul_overflow(a, b, out) ? -1 : 0;
}
static inline int fr_add_size(size_t a, size_t b, size_t *out) {
  return __builtin_add_overflow(a, b, out) ? -1 : 0;
}

/* IEEE half <-> float, bf16 <-> float (round to nearest even). */
static inline float fr_fp16_to_fp32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else { /* subnormal: normalize */
      int e = -1;
      do { e++; man <<= 1; } while (!(man & 0x400));
      bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

static inline uint16_t fr_fp32_to_fp16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* overflow to inf */
  if (ax < 0x38800000u) {                                   /* subnormal or zero */
    if (ax < 0x33000000u) return (uint16_t)sign;
    uint32_t e = ax >> 23, m = (ax & 0x7fffff) | 0x800000;
    uint32_t shift = 126 - e;
    uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) r++;
    return (uint16_t)(sign | r);
  }
  uint32_t r = ax + 0xc8000fffu + ((ax >> 13) & 1); /* rebias and round to even */
  return (uint16_t)(sign | (r >> 13));
}

static inline float fr_bf16_to_fp32(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

static inline uint16_t fr_fp32_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40); /* quiet NaN */
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

#ifdef __cplusplus
}
#endif
