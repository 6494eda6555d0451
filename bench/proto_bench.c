/* proto_bench.c - encode + decode time of a step descriptor (the message
 * the coordinator sends every step) and of the matching step result.
 *
 *   proto_bench [iterations]
 *
 * Shapes: 256 sequences, mostly decodes of one token plus a few prefill
 * chunks. Sampling parameters (temperature, top_p, seed, as a chat server
 * sends them) travel with a sequence's first chunk only, as the
 * coordinator sends them (proto_step_item_t.has_sp); the last shape is
 * the worst case, 256 new sequences that all carry them. Prints the median
 * and p90 over the iterations, in us; "tree" is msgpack-c's generic
 * decoder on the same bytes for reference (msgpack_unpack_next into a
 * msgpack_unpacked whose zone is reused: an object tree, no checks, no
 * structs), which proto/ does not use.
 * Results: docs/bench/proto.md. */
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "proto/proto.h"

typedef struct {
  const char *name;
  int n_items;   /* sequences in the step */
  int n_prefill; /* of them, prefill chunks */
  int chunk;     /* tokens per prefill chunk */
  int all_sp;    /* every item carries its sampling params */
} shape_t;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (uint32_t)rng_state;
}

static void make_step(proto_step_t *s, const shape_t *sh, int32_t *tokens) {
  memset(s, 0, sizeof *s);
  s->step_id = 123456;
  s->epoch = 3;
  s->n_items = (uint32_t)sh->n_items;
  s->items = fr_calloc((size_t)sh->n_items, sizeof *s->items);
  for (int i = 0; i < sh->n_items; i++) {
    proto_step_item_t *it = &s->items[i];
    int prefill = i < sh->n_prefill;
    it->slot = (uint32_t)i;
    it->n_tokens = prefill ? (uint32_t)sh->chunk : 1;
    it->tokens = tokens;
    it->pos = prefill ? (uint32_t)(rnd() % 4) * (uint32_t)sh->chunk : 100 + rnd() % 2000;
    it->final = !prefill || (i % 2 == 0);
    it->has_sp = sh->all_sp || (prefill && it->pos == 0);
    it->sp = proto_sampling_default();
    it->sp.temperature = 0.7f;
    it->sp.top_p = 0.9f;
    it->sp.has_seed = true;
    it->sp.seed = rnd();
  }
  static uint32_t freed[4] = {300, 301, 302, 303};
  s->n_freed = 4;
  s->freed = freed;
}

static void make_result(proto_result_t *r, int n_items) {
  memset(r, 0, sizeof *r);
  r->step_id = 123456;
  r->epoch = 3;
  r->n_items = (uint32_t)n_items;
  r->items = fr_calloc((size_t)n_items, sizeof *r->items);
  for (int i = 0; i < n_items; i++) {
    r->items[i].slot = (uint32_t)i;
    r->items[i].token = (int32_t)(rnd() % 49152);
    r->items[i].logprob = -(float)(rnd() % 1000) / 100.0f;
  }
  r->timings.forward_us = 8000;
  r->timings.sample_us = 300;
  r->timings.total_us = 8400;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* Median time of msgpack-c's object-tree decode of b, iters times. */
static double tree_us(const proto_buf_t *b, int iters, uint64_t *t) {
  msgpack_unpacked up;
  msgpack_unpacked_init(&up);
  for (int i = -iters / 10; i < iters; i++) {
    size_t off = 0;
    uint64_t t0 = fr_now_ns();
    int rc = msgpack_unpack_next(&up, (const char *)b->data, b->len, &off);
    uint64_t t1 = fr_now_ns();
    if (rc != MSGPACK_UNPACK_SUCCESS) return -1;
    if (i >= 0) t[i] = t1 - t0;
  }
  msgpack_unpacked_destroy(&up);
  qsort(t, (size_t)iters, sizeof *t, cmp_u64);
  return t[iters / 2] / 1e3;
}

/* Times encode + decode of one message, iters times; prints median / p90. */
static int bench(const char *name, proto_type_t type, const void *body, int iters) {
  proto_buf_t b;
  proto_msg_t m;
  proto_buf_init(&b);
  proto_msg_init(&m);
  uint64_t *enc = fr_malloc(sizeof(uint64_t) * (size_t)iters), *dec = fr_malloc(sizeof(uint64_t) * (size_t)iters);
  uint64_t *tot = fr_malloc(sizeof(uint64_t) * (size_t)iters);
  int rc = 0;
  for (int i = -iters / 10; i < iters && !rc; i++) { /* the first tenth warms up */
    uint64_t t0 = fr_now_ns();
    rc = proto_encode(&b, type, body);
    uint64_t t1 = fr_now_ns();
    if (!rc) rc = proto_msg_decode(&m, b.data, b.len, PROTO_ACCEPT_ANY);
    uint64_t t2 = fr_now_ns();
    if (i >= 0) {
      enc[i] = t1 - t0;
      dec[i] = t2 - t1;
      tot[i] = t2 - t0;
    }
  }
  if (rc) {
    fprintf(stderr, "%s: %s\n", name, fr_last_error());
  } else {
    qsort(enc, (size_t)iters, sizeof *enc, cmp_u64);
    qsort(dec, (size_t)iters, sizeof *dec, cmp_u64);
    qsort(tot, (size_t)iters, sizeof *tot, cmp_u64);
    double e = enc[iters / 2] / 1e3, tree = tree_us(&b, iters, enc);
    printf("%-34s %7zu B  encode %6.2f us  decode %6.2f us  total %6.2f us (p90 %6.2f)  tree %6.2f us\n", name,
           b.len, e, dec[iters / 2] / 1e3, tot[iters / 2] / 1e3, tot[iters * 9 / 10] / 1e3, tree);
  }
  free(enc);
  free(dec);
  free(tot);
  proto_msg_free(&m);
  proto_buf_free(&b);
  return rc;
}

int main(int argc, char **argv) {
  int iters = argc > 1 ? atoi(argv[1]) : 20000;
  if (iters < 10) iters = 10;
  static const shape_t shapes[] = {
      {"step 256 decodes", 256, 0, 0, 0},
      {"step 248 decodes + 8 x 64 prefill", 256, 8, 64, 0},
      {"step 240 decodes + 16 x 128 prefill", 256, 16, 128, 0},
      {"step 1 x 2048 prefill", 1, 1, 2048, 0},
      {"step 256 new sequences (all with sp)", 256, 0, 0, 1},
  };
  int32_t *tokens = fr_malloc(2048 * sizeof *tokens);
  for (int i = 0; i < 2048; i++) tokens[i] = (int32_t)(rnd() % 49152);
  int rc = 0;
  for (size_t i = 0; i < FR_ARRAY_SIZE(shapes) && !rc; i++) {
    proto_step_t s;
    make_step(&s, &shapes[i], tokens);
    rc = bench(shapes[i].name, PROTO_T_STEP, &s, iters);
    free(s.items);
  }
  proto_result_t r;
  make_result(&r, 256);
  if (!rc) rc = bench("result 256 items", PROTO_T_RESULT, &r, iters);
  free(r.items);
  free(tokens);
  return rc ? 1 : 0;
}
