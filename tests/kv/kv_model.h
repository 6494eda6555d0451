/* kv_model.h - a plain reference model of kv/'s allocator, prefix cache and
 * tables for the randomized tests: arrays and linear scans, no hashing (a
 * cached block's key is the whole token prefix it ends, with the salt), no
 * shared memory. The policy it models is the one kv.h documents: free queue
 * head = next to allocate, cached blocks freed to the tail, others to the
 * head, copy-on-write of a shared partial last block, duplicates uncached.
 *
 * kvm_random_run() drives kv and the model with the same random operations
 * and compares them after every step (Check assertions). */
#pragma once

#include <stdint.h>

#include "kv/kv.h"

typedef struct {
  int n_blocks, block_size, max_seqs, max_bps;
  int prefix_cache;
  int steps;
  uint64_t seed;
  const char *instance; /* NULL: private memory */
} kvm_params_t;

/* Runs params->steps random steps; returns the number of prefix hits seen
 * (blocks) so callers can check that the run exercised the cache. */
long kvm_random_run(const kvm_params_t *params);
