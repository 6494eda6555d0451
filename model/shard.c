/* shard.c - the sharding plan (shard.h). */
#include "model/shard.h"

#include <errno.h>

#include "common/fr_err.h"

model_shard_t model_shard_whole(const model_config_t *c) {
  return (model_shard_t){.rank = 0, .size = 1, .n_heads = c->n_heads, .n_kv_heads = c->n_kv_heads,
                         .ffn_dim = c->ffn_dim, .exp_dim = c->expert_ffn_dim, .n_vocab = c->vocab_size};
}

/* [lo, hi) of units 0..n-1 that rank r of size takes (later ranks get the rest). */
static void shard__range(int n, int r, int size, int *lo, int *hi) {
  *lo = (int)((long long)n * r / size);
  *hi = (int)((long long)n * (r + 1) / size);
}

/* Rank's [*lo, *lo + *n) of an FFN of dim, cut at multiples of unit. */
static int shard__ffn(const char *what, int dim, int unit, int rank, int size, int *lo, int *n) {
  int a, b;
  if (dim % unit || dim / unit < size)
    return fr_errorf(FR_EUNSUPPORTED, "tensor parallel size %d: %s of %d cannot be cut in blocks of %d", size, what,
                     dim, unit);
  shard__range(dim / unit, rank, size, &a, &b);
  *lo = a * unit, *n = (b - a) * unit;
  return 0;
}

/* Whether any layer of c runs a dense FFN. */
static bool shard__has_dense(const model_config_t *c) {
  for (int il = 0; il < c->n_layers; il++)
    if (!model_config_layer_moe(c, il)) return true;
  return false;
}

int model_shard_plan(const model_config_t *c, int rank, int size, int ffn_unit, model_shard_t *out) {
  if (size < 1 || rank < 0 || rank >= size) return fr_errorf(-EINVAL, "tensor parallel: rank %d of %d", rank, size);
  if (size == 1) {
    *out = model_shard_whole(c);
    return 0;
  }
  model_shard_t s = {.rank = rank, .size = size};
  const int group = c->n_heads / c->n_kv_heads; /* query heads per KV head */
  int lo, hi;
  if (c->n_kv_heads >= size) { /* whole KV groups per rank */
    shard__range(c->n_kv_heads, rank, size, &lo, &hi);
    s.kv0 = lo, s.n_kv_heads = hi - lo;
    s.head0 = lo * group, s.n_heads = (hi - lo) * group;
  } else { /* fewer KV heads than ranks: split query heads, copy the KV head they read */
    if (size % c->n_kv_heads || c->n_heads % size)
      return fr_errorf(FR_EUNSUPPORTED,
                       "tensor parallel size %d does not fit %d attention heads over %d KV heads: with fewer KV "
                       "heads than ranks, the ranks must be a multiple of the KV heads and divide the heads",
                       size, c->n_heads, c->n_kv_heads);
    s.n_heads = c->n_heads / size, s.head0 = rank * s.n_heads;
    s.kv0 = s.head0 / group, s.n_kv_heads = 1;
  }
  if (ffn_unit < 1) ffn_unit = 1;
  int rc = 0;
  if (shard__has_dense(c)) rc = shard__ffn("an FFN", c->ffn_dim, ffn_unit, rank, size, &s.ffn0, &s.ffn_dim);
  else s.ffn0 = 0, s.ffn_dim = c->ffn_dim; /* no dense layer: the size only sizes scratch */
  if (!rc && c->n_experts) rc = shard__ffn("an expert FFN", c->expert_ffn_dim, ffn_unit, rank, size, &s.exp0, &s.exp_dim);
  if (rc) return rc;
  s.split_vocab = c->vocab_size % size == 0;
  s.n_vocab = s.split_vocab ? c->vocab_size / size : c->vocab_size;
  s.vocab0 = s.split_vocab ? rank * s.n_vocab : 0;
  *out = s;
  return 0;
}
