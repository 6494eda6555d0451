/* http_fake.h - a fake coordinator for the HTTP tests: a thread with a
 * ROUTER on an inproc endpoint that answers submits with scripted events,
 * chosen by the prompt text (or the last chat message):
 *   "busy"  -> error 429        "long" -> error 400 (prompt too long)
 *   "hang"  -> nothing (until canceled)
 *   "slow"  -> one event, then nothing (until canceled)
 *   "boom"  -> one event, then finish "error" (500)
 *   "delay" -> the normal answer after 1.5 s
 *   else    -> "Hel" "lo" " world" (3 tokens, ids 11 12 13), finish
 *              "length" when max_tokens == 3 else "stop", usage p=5 c=3;
 *              streamed token-id prompts with ignore_eos (the bench's)
 *              get "l\0o" for the second piece
 * Events carry logprobs (and top alternatives) when the submit asks. */
#pragma once

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "proto/proto.h"

typedef struct {
  void *ctx;
  const char *endpoint;
  pthread_t thread;
  atomic_int stop;
  atomic_int n_submits, n_cancels;
  atomic_uint_least64_t last_cancel, last_job;
  /* the last submit (copied fields) */
  pthread_mutex_t mu;
  proto_sampling_t sp;
  uint32_t max_tokens, n_stop, n_stop_ids, n_tokens, n_messages;
  char stop0[64];
  int32_t token0;
  int ignore_eos, stream;
} http_fake_t;

int http_fake_start(http_fake_t *f, void *ctx, const char *endpoint);
void http_fake_stop(http_fake_t *f);
