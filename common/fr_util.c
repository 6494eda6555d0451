/* fr_util.c - allocation, clocks, assertions. */
#include "fr_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

void fr__assert_fail(const char *expr, const char *file, int line) {
  fprintf(stderr, "ferrum: assertion failed: %s (%s:%d)\n", expr, file, line);
  abort();
}

static void fr__oom(size_t n) {
  fprintf(stderr, "ferrum: out of host memory allocating %zu bytes\n", n);
  abort();
}

void *fr_malloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) fr__oom(n);
  return p;
}

void *fr_calloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size ? size : 1);
  if (!p) fr__oom(n * size);
  return p;
}

void *fr_realloc(void *p, size_t n) {
  void *q = realloc(p, n ? n : 1);
  if (!q) fr__oom(n);
  return q;
}

char *fr_strndup(const char *s, size_t n) {
  char *d = fr_malloc(n + 1);
  memcpy(d, s, n);
  d[n] = '\0';
  return d;
}

char *fr_strdup(const char *s) { return fr_strndup(s, strlen(s)); }

void *fr_malloc_aligned(size_t n) {
  void *p = NULL;
  if (posix_memalign(&p, 64, n ? n : 64) != 0) fr__oom(n);
  return p;
}

void fr_free_aligned(void *p) { free(p); }

uint64_t fr_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

bool fr_busy_poll(bool gpu) {
  static int forced = -2; /* -1: not set; 0 off, 1 on (read once) */
  if (forced == -2) {
    const char *env = getenv("FERRUM_BUSY_POLL");
    forced = env && *env ? strcmp(env, "0") != 0 : -1;
  }
  return forced >= 0 ? forced == 1 : gpu;
}
