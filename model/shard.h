/* shard.h - the tensor-parallel sharding plan (Megatron-style) of one rank.
 *
 * Attention is split by whole KV groups (a KV head and the query heads that
 * read it): q/k/v rows and their biases by heads, attn_output by the
 * matching columns, so each rank attends over its own heads and its
 * attn_output gives a partial sum of the full projection. When there are
 * fewer KV heads than ranks, query heads are split evenly and each rank
 * keeps a copy of the one KV head its heads read (vLLM replicates the same
 * way). The FFN is split by gate/up rows and the matching ffn_down columns,
 * in units of the weights' quantization block so that no block is cut;
 * so is each expert of a mixture-of-experts layer, whose router is whole
 * on every rank (every rank routes each token to the same experts).
 * Groups and units that do not divide evenly go to the later ranks (9
 * heads in 3 groups over 2 ranks: 3 and 6). The two partial sums of a layer
 * are added across ranks with one all-reduce each. Norms and the embedding
 * are whole on every rank. The LM head is split by vocabulary rows when
 * they divide by the ranks, its logits gathered on rank 0 (which samples);
 * otherwise rank 0 alone holds and runs it.
 */
#pragma once

#include <stdbool.h>

#include "model/config.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int rank, size;
  int head0, n_heads;  /* this rank's query heads: [head0, head0 + n_heads) */
  int kv0, n_kv_heads; /* its KV heads */
  int ffn0, ffn_dim;   /* its rows of gate/up (columns of ffn_down) */
  int exp0, exp_dim;   /* its rows of every expert's gate/up (columns of its down) */
  bool split_vocab;    /* the LM head is split by vocabulary (when it divides by the ranks): each
                        * rank computes its slice of the logits, gathered on rank 0; else rank 0
                        * holds it whole and alone computes logits */
  int vocab0, n_vocab; /* its rows of the LM head */
} model_shard_t;

/* The whole model on one rank. */
model_shard_t model_shard_whole(const model_config_t *c);

/* Plans rank's shard of c over size ranks; ffn_unit: the FFN (and each
 * expert) is cut only at multiples of it (the ffn_down weight's block size,
 * 1 for float weights).
 * Returns 0, or FR_EUNSUPPORTED with a message naming what does not divide. */
int model_shard_plan(const model_config_t *c, int rank, int size, int ffn_unit, model_shard_t *out);

#ifdef __cplusplus
}
#endif
