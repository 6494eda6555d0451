/* shard.c - the sharding plan (shard.h). */
#include "model/shard.h"

#include <errno.h>

#include "common/fr_err.h"

model_shard_t model_shard_whole(const model_config_t *c) {
  return (model_shard_t){.rank = 0, .size = 1, .n_heads = c->n_heads, .n_kv_heads = c->n_kv_heads,
                         .ffn_dim = c->ffn_dim, .n_vocab = c->vocab_size};
}

/* [lo, hi) of units 0..n-1 that rank r of size takes (later ranks get the rest). */
static void shard__range(int n, int r, int size, int *lo, int *hi) {
  *lo = (int)((long long)n * r / size);
  *hi = (int)((long long)n * (r + 1) / size);
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
  if (c->ffn_dim % ffn_unit || c->ffn_dim / ffn_unit < size)
    return fr_errorf(FR_EUNSUPPORTED, "tensor parallel size %d: an FFN of %d cannot be cut in blocks of %d", size,
                     c->ffn_dim, ffn_unit);
  shard__range(c->ffn_dim / ffn_unit, rank, size, &lo, &hi);
  s.ffn0 = lo * ffn_unit, s.ffn_dim = (hi - lo) * ffn_unit;
  s.split_vocab = c->vocab_size % size == 0;
  s.n_vocab = s.split_vocab ? c->vocab_size / size : c->vocab_size;
  s.vocab0 = s.split_vocab ? rank * s.n_vocab : 0;
  *out = s;
  return 0;
}
