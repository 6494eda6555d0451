/* kv_prefix.c - prefix cache: 128-bit chain hashes, the block index,
 * lookup, commit and the admission plan.
 *
 * A full block's chain hash: h_i = H(h_{i-1}, tokens of block i, salt) with
 * h_{-1} = root(salt). Each half of H is fr_hash64 over the block's token ids
 * seeded from both halves of the parent hash and the salt; for fixed tokens
 * fr_hash64 is a bijection of its seed, so two different parents never give
 * the same half for the same tokens. The index is a hash table of buckets
 * chained through blocks[].hnext; an indexed block also stores its tokens,
 * and a lookup hit needs the chain hash and the tokens to match. */
#include <errno.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_hash.h"
#include "common/fr_util.h"
#include "kv/kv_impl.h"

#define KV__K0 0x243f6a8885a308d3ull /* pi */
#define KV__K1 0x13198a2e03707344ull

void kv__hash_root(uint64_t salt, uint64_t h[2]) {
  h[0] = fr_mix64(salt ^ KV__K0);
  h[1] = fr_mix64(fr_mix64(salt) ^ KV__K1);
}

void kv__hash_block(const uint64_t parent[2], const int32_t *tokens, int bs, uint64_t salt, uint64_t out[2]) {
  uint64_t s0 = parent[0] ^ fr_mix64(parent[1] ^ salt ^ KV__K0);
  uint64_t s1 = parent[1] ^ fr_mix64(parent[0] ^ salt ^ KV__K1);
  size_t len = (size_t)bs * sizeof *tokens;
  out[0] = fr_hash64(tokens, len, s0);
  out[1] = fr_hash64(tokens, len, s1);
}

static inline const int32_t *kv__btokens(const kv_ctl_t *ctl, uint32_t b) {
  return ctl->tokens + (size_t)b * (size_t)ctl->block_size;
}

uint32_t kv__index_find(const kv_ctl_t *ctl, const uint64_t h[2], const int32_t *tokens) {
  const kv__block_t *blk = ctl->blocks;
  size_t len = (size_t)ctl->block_size * sizeof *tokens;
  for (uint32_t b = ctl->buckets[h[0] & ctl->hash_mask]; b != KV_NIL; b = blk[b].hnext)
    if (blk[b].h[0] == h[0] && blk[b].h[1] == h[1] && memcmp(kv__btokens(ctl, b), tokens, len) == 0) return b;
  return KV_NIL;
}

void kv__index_insert(kv_ctl_t *ctl, uint32_t b, const int32_t *tokens) {
  kv__block_t *blk = &ctl->blocks[b];
  FR_ASSERT((blk->flags & (KV__BLK_HASHED | KV__BLK_INDEXED)) == KV__BLK_HASHED);
  memcpy(ctl->tokens + (size_t)b * (size_t)ctl->block_size, tokens, (size_t)ctl->block_size * sizeof *tokens);
  uint32_t *head = &ctl->buckets[blk->h[0] & ctl->hash_mask];
  blk->hnext = *head;
  *head = b;
  blk->flags |= KV__BLK_INDEXED;
  ctl->hdr->n_cached++;
  if (blk->ref == 0) ctl->hdr->n_cached_free++;
}

void kv__index_remove(kv_ctl_t *ctl, uint32_t b) {
  kv__block_t *blk = ctl->blocks;
  uint32_t *link = &ctl->buckets[blk[b].h[0] & ctl->hash_mask];
  while (*link != b) {
    FR_ASSERT(*link != KV_NIL);
    link = &blk[*link].hnext;
  }
  *link = blk[b].hnext;
  blk[b].hnext = KV_NIL;
  blk[b].flags &= ~KV__BLK_INDEXED;
  ctl->hdr->n_cached--;
}

void kv__block_uncache(kv_ctl_t *ctl, uint32_t b) {
  if (ctl->blocks[b].flags & KV__BLK_INDEXED) kv__index_remove(ctl, b);
  ctl->blocks[b].flags = 0;
  ctl->blocks[b].h[0] = ctl->blocks[b].h[1] = 0;
}

int kv_prefix_forget(kv_ctl_t *ctl) {
  int n = 0;
  for (uint32_t b = 0; b < (uint32_t)ctl->n_blocks; b++) {
    kv__block_t *blk = &ctl->blocks[b];
    if (!blk->flags || blk->ref > 0) continue; /* in use: its sequence's slot says it is committed */
    if (blk->flags & KV__BLK_INDEXED) ctl->hdr->n_cached_free--, n++;
    kv__block_uncache(ctl, b); /* it stays in the free queue, where it is */
  }
  return n;
}

/* Walks the chain of tokens[0..n_blk * bs): stores hit block ids (up to cap)
 * and returns the hit count; *n_free counts hits with ref 0. */
static int kv__lookup(const kv_ctl_t *ctl, const int32_t *tokens, int n_blk, uint64_t salt, int32_t *blocks,
                      int cap, int *n_free) {
  uint64_t h[2];
  int bs = ctl->block_size, i, nf = 0;
  kv__hash_root(salt, h);
  for (i = 0; i < n_blk; i++) {
    kv__hash_block(h, tokens + (size_t)i * bs, bs, salt, h);
    uint32_t b = kv__index_find(ctl, h, tokens + (size_t)i * bs);
    if (b == KV_NIL) break;
    if (i < cap) blocks[i] = (int32_t)b;
    nf += ctl->blocks[b].ref == 0;
  }
  if (n_free) *n_free = nf;
  return i;
}

int kv_prefix_lookup(const kv_ctl_t *ctl, const int32_t *tokens, int n, uint64_t salt, int *n_blocks,
                     int32_t *blocks, int cap, int *n_free) {
  if (!ctl->writer) return fr_errorf(-EPERM, "kv: prefix lookup is for the writer");
  if (n < 0 || (n > 0 && !tokens) || cap < 0 || (cap > 0 && !blocks))
    return fr_errorf(-EINVAL, "kv: prefix lookup: bad arguments");
  int n_blk = ctl->prefix_cache ? n / ctl->block_size : 0;
  *n_blocks = kv__lookup(ctl, tokens, n_blk, salt, blocks, cap, n_free);
  if (!ctl->prefix_cache && n_free) *n_free = 0;
  return 0;
}

int kv_admit_plan(const kv_ctl_t *ctl, const int32_t *tokens, int n, uint64_t salt, int extra_tokens,
                  kv_admit_t *plan) {
  memset(plan, 0, sizeof *plan);
  if (!ctl->writer) return fr_errorf(-EPERM, "kv: admit plan is for the writer");
  if (n <= 0 || !tokens || extra_tokens < 0) return fr_errorf(-EINVAL, "kv: admit plan: bad arguments");
  int bs = ctl->block_size;
  int n_blk = ctl->prefix_cache ? FR_MIN((n - 1) / bs, ctl->max_bps) : 0;
  plan->n_cached_blocks = kv__lookup(ctl, tokens, n_blk, salt, NULL, 0, &plan->n_revive);
  plan->n_cached_tokens = plan->n_cached_blocks * bs;
  int64_t total = ((int64_t)n + extra_tokens + bs - 1) / bs;
  plan->n_new_blocks = (int)FR_MIN(total - plan->n_cached_blocks, (int64_t)INT32_MAX);
  plan->n_free = ctl->hdr->n_free;
  plan->fits = total <= ctl->max_bps && (int64_t)plan->n_revive + plan->n_new_blocks <= plan->n_free;
  return 0;
}

int kv__index_verify(const kv_ctl_t *ctl) {
  const kv__block_t *blk = ctl->blocks;
  int n_idx = 0, n_chain = 0;
  for (int b = 0; b < ctl->n_blocks; b++) {
    uint32_t f = blk[b].flags;
    if ((f & KV__BLK_INDEXED) && !(f & KV__BLK_HASHED)) return fr_errorf(FR_ESTATE, "kv: block %d indexed, not hashed", b);
    if (!(f & KV__BLK_INDEXED)) continue;
    n_idx++;
    if (kv__index_find(ctl, blk[b].h, kv__btokens(ctl, (uint32_t)b)) != (uint32_t)b)
      return fr_errorf(FR_ESTATE, "kv: indexed block %d not found first under its key", b);
  }
  for (uint32_t k = 0; k <= ctl->hash_mask; k++)
    for (uint32_t b = ctl->buckets[k]; b != KV_NIL; b = blk[b].hnext) {
      if (b >= (uint32_t)ctl->n_blocks || !(blk[b].flags & KV__BLK_INDEXED) || (blk[b].h[0] & ctl->hash_mask) != k)
        return fr_errorf(FR_ESTATE, "kv: bucket %u holds a bad block %u", k, b);
      if (++n_chain > ctl->n_blocks) return fr_errorf(FR_ESTATE, "kv: hash chains have a cycle");
    }
  if (n_idx != n_chain || n_idx != ctl->hdr->n_cached)
    return fr_errorf(FR_ESTATE, "kv: %d indexed blocks, %d in chains, n_cached %d", n_idx, n_chain, ctl->hdr->n_cached);
  return 0;
}

/* Commits block i of a slot whose blocks before i are hashed. */
static int kv__commit_one(kv_ctl_t *ctl, int slot, const int32_t *t, int i, const int32_t *tokens) {
  kv__slot_t *sl = &ctl->slots[slot];
  int bs = ctl->block_size;
  uint64_t parent[2], h[2];
  if (i == 0)
    kv__hash_root(sl->salt, parent);
  else /* block i - 1 is the last committed one: its hash, kept in the slot (the block may be released) */
    memcpy(parent, sl->last_h, sizeof parent);
  const int32_t *bt = tokens + (size_t)i * bs;
  kv__hash_block(parent, bt, bs, sl->salt, h);
  kv__block_t *blk = &ctl->blocks[t[i]];
  if (blk->flags & KV__BLK_HASHED) {
    if (blk->h[0] != h[0] || blk->h[1] != h[1])
      return fr_errorf(FR_ESTATE, "kv: slot %d block %d: tokens differ from the cached block's", slot, i);
    memcpy(sl->last_h, h, sizeof h);
    return 0;
  }
  memcpy(sl->last_h, h, sizeof h);
  blk->h[0] = h[0];
  blk->h[1] = h[1];
  blk->flags |= KV__BLK_HASHED;
  if (kv__index_find(ctl, h, bt) == KV_NIL) kv__index_insert(ctl, (uint32_t)t[i], bt);
  return 0;
}

int kv_prefix_commit(kv_ctl_t *ctl, int slot, const int32_t *tokens, int n) {
  if (!ctl->writer) return fr_errorf(-EPERM, "kv: commit is for the writer");
  if (slot < 0 || slot >= ctl->max_seqs || !ctl->slots[slot].in_use)
    return fr_errorf(-EINVAL, "kv: commit: slot %d not in use", slot);
  if (n < 0 || (n > 0 && !tokens)) return fr_errorf(-EINVAL, "kv: commit: bad tokens");
  if (!ctl->prefix_cache) return 0;
  kv__slot_t *sl = &ctl->slots[slot];
  const int32_t *t = kv__table(ctl, slot);
  int lim = FR_MIN(n, sl->len) / ctl->block_size;
  for (int i = sl->n_committed; i < lim; i++) {
    int err = kv__commit_one(ctl, slot, t, i, tokens);
    if (err) return err;
    sl->n_committed = i + 1;
  }
  return 0;
}
