/* http_fake.h - a fake coordinator for the HTTP tests: a thread with a
 * ROUTER on an inproc endpoint that answers submits with scripted events,
 * chosen by the prompt text (or the last chat message):
 *   "busy"  -> error 429        "long" -> error 400 (prompt too long)
 *   "hang"  -> nothing (until canceled)
 *   "slow"  -> one event, then nothing (until canceled)
 *   "boom"  -> one event, then finish "error" (500)
 *   "delay" -> the normal answer after 1.5 s (the fake blocks meanwhile)
 *   "quiet" -> nothing for quiet_ms, "Hel", nothing for quiet_ms, the rest
 *              (not streamed: the whole answer after 2 * quiet_ms)
 *   "bulk"  -> streamed: one event of BULK_BYTES 'a's at once, then
 *              " world" (finish "stop") once release is set
 *   else    -> "Hel" "lo" " world" (3 tokens, ids 11 12 13), finish
 *              "length" when max_tokens == 3 else "stop", usage p=5 c=3;
 *              streamed token-id prompts with ignore_eos (the bench's)
 *              get "l\0o" for the second piece
 * Events carry logprobs (and top alternatives) when the submit asks.
 * Heartbeats are answered (counted in n_beats) unless deaf is set. */
#pragma once

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/proto.h"

#define HTTP_FAKE_BULK_BYTES (2u << 20)

/* A job the fake answers later ("quiet", "bulk"). */
typedef struct {
  unsigned char ident[256]; /* the client's routing id */
  size_t ident_len;
  proto_submit_t sub;       /* scalar fields only (no strings) */
  uint64_t due_ns;          /* next piece at (quiet) */
  int phase;                /* pieces sent so far; 0 = free slot */
  bool bulk;
} http_fake_held_t;

typedef struct {
  void *ctx;
  const char *endpoint;
  pthread_t thread;
  atomic_int stop;
  atomic_int deaf, release, released; /* released: bulk's rest was sent */
  atomic_int n_beats;
  unsigned quiet_ms;                  /* set before the test's requests; 0 = 1500 */
  http_fake_held_t held[8];           /* the fake thread's own */
  atomic_int n_submits, n_cancels;
  atomic_uint_least64_t last_cancel, last_job;
  /* the last submit (copied fields) */
  pthread_mutex_t mu;
  proto_sampling_t sp;
  uint32_t max_tokens, n_stop, n_stop_ids, n_tokens, n_messages;
  char stop0[64];
  int32_t token0;
  int ignore_eos, stream;
  uint64_t sum_tokens, sum_max_tokens; /* over every submit: prompt tokens, max_tokens */
} http_fake_t;

int http_fake_start(http_fake_t *f, void *ctx, const char *endpoint);
void http_fake_stop(http_fake_t *f);
