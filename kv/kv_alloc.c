/* kv_alloc.c - block allocator: reference counts and an LRU free queue.
 *
 * The free queue is a doubly linked list through blocks[].prev/next with a
 * sentinel at index n_blocks. Allocation pops the head; a block that drops to
 * reference 0 goes to the tail when it holds a cached prefix (kept as long
 * as possible, least recently freed evicted first) and to the head when it
 * holds nothing worth keeping. Every operation is O(1). */
#include "kv/kv_impl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_util.h"

static void kv__q_unlink(kv__block_t *blk, uint32_t b) {
  blk[blk[b].prev].next = blk[b].next;
  blk[blk[b].next].prev = blk[b].prev;
  blk[b].prev = blk[b].next = KV_NIL;
}

static void kv__q_insert_after(kv__block_t *blk, uint32_t at, uint32_t b) {
  blk[b].prev = at;
  blk[b].next = blk[at].next;
  blk[blk[at].next].prev = b;
  blk[at].next = b;
}

void kv__alloc_init(kv_ctl_t *ctl) {
  kv__block_t *blk = ctl->blocks;
  uint32_t s = (uint32_t)ctl->n_blocks;
  blk[s].prev = blk[s].next = s;
  blk[s].ref = -1;
  for (uint32_t b = 0; b < s; b++) {
    blk[b] = (kv__block_t){.hnext = KV_NIL};
    kv__q_insert_after(blk, blk[s].prev, b); /* ascending ids from the head */
  }
  ctl->hdr->n_free = ctl->n_blocks;
}

uint32_t kv__block_alloc(kv_ctl_t *ctl) {
  kv__block_t *blk = ctl->blocks;
  uint32_t b = blk[ctl->n_blocks].next;
  FR_ASSERT(b != (uint32_t)ctl->n_blocks && blk[b].ref == 0);
  kv__q_unlink(blk, b);
  if (blk[b].flags & KV__BLK_INDEXED) {
    ctl->hdr->n_evictions++;
    ctl->hdr->n_cached_free--;
  }
  kv__block_uncache(ctl, b);
  blk[b].ref = 1;
  ctl->hdr->n_free--;
  return b;
}

void kv__block_ref(kv_ctl_t *ctl, uint32_t b) {
  kv__block_t *blk = ctl->blocks;
  if (blk[b].ref++ > 0) return;
  kv__q_unlink(blk, b); /* revive a free block */
  ctl->hdr->n_free--;
  if (blk[b].flags & KV__BLK_INDEXED) ctl->hdr->n_cached_free--;
}

void kv__block_unref(kv_ctl_t *ctl, uint32_t b) {
  kv__block_t *blk = ctl->blocks;
  FR_ASSERT(blk[b].ref > 0);
  if (--blk[b].ref > 0) return;
  uint32_t s = (uint32_t)ctl->n_blocks;
  ctl->hdr->n_free++;
  if (blk[b].flags & KV__BLK_INDEXED) {
    ctl->hdr->n_cached_free++;
    kv__q_insert_after(blk, blk[s].prev, b); /* tail: evicted last */
  } else {
    blk[b].flags = 0; /* a hash without an index entry is worthless once free */
    kv__q_insert_after(blk, s, b);            /* head: reused first */
  }
}

int kv_blocks_free_count(const kv_ctl_t *ctl) { return ctl->hdr->n_free; }

int kv_blocks_uncached_free_count(const kv_ctl_t *ctl) { return ctl->hdr->n_free - ctl->hdr->n_cached_free; }

int kv_block_ref(const kv_ctl_t *ctl, int block) {
  if (block < 0 || block >= ctl->n_blocks) return fr_errorf(-EINVAL, "kv: block %d out of range", block);
  return ctl->blocks[block].ref;
}

int kv_block_cached(const kv_ctl_t *ctl, int block) {
  if (block < 0 || block >= ctl->n_blocks) return fr_errorf(-EINVAL, "kv: block %d out of range", block);
  return (ctl->blocks[block].flags & KV__BLK_INDEXED) ? 1 : 0;
}

/* Walks the free queue: links, count, all refs 0, cached ones after the
 * uncached ones is not required (revives and truncates reorder), but every
 * block with ref 0 must be in it exactly once. */
static int kv__queue_verify(const kv_ctl_t *ctl, int *n_in_queue, int *n_cached_in_queue) {
  const kv__block_t *blk = ctl->blocks;
  uint32_t s = (uint32_t)ctl->n_blocks;
  int n = 0, nc = 0;
  for (uint32_t b = blk[s].next, prev = s; b != s; prev = b, b = blk[b].next) {
    if (b >= s) return fr_errorf(FR_ESTATE, "kv: free queue link %u out of range", b);
    if (blk[b].prev != prev) return fr_errorf(FR_ESTATE, "kv: free queue: block %u prev %u != %u", b, blk[b].prev, prev);
    if (blk[b].ref != 0) return fr_errorf(FR_ESTATE, "kv: block %u in the free queue has ref %d", b, blk[b].ref);
    if (++n > ctl->n_blocks) return fr_errorf(FR_ESTATE, "kv: free queue has a cycle");
    if (blk[b].flags & KV__BLK_INDEXED) nc++;
  }
  *n_in_queue = n;
  *n_cached_in_queue = nc;
  return 0;
}

int kv__alloc_verify(const kv_ctl_t *ctl) {
  int n_q = 0, nc_q = 0, err = kv__queue_verify(ctl, &n_q, &nc_q);
  if (err) return err;
  int n_zero = 0;
  for (int b = 0; b < ctl->n_blocks; b++) {
    if (ctl->blocks[b].ref < 0) return fr_errorf(FR_ESTATE, "kv: block %d has ref %d", b, ctl->blocks[b].ref);
    n_zero += ctl->blocks[b].ref == 0;
  }
  const kv__ctl_hdr_t *h = ctl->hdr;
  if (n_zero != n_q || h->n_free != n_q || h->n_cached_free != nc_q)
    return fr_errorf(FR_ESTATE, "kv: free counts: ref0 %d queue %d n_free %d cached_free %d/%d", n_zero, n_q,
                     h->n_free, h->n_cached_free, nc_q);
  /* Reference counts equal the table entries that hold each block. */
  int32_t *cnt = fr_calloc((size_t)ctl->n_blocks, sizeof *cnt);
  err = 0;
  for (int s = 0; s < ctl->max_seqs && !err; s++) {
    const kv__slot_t *sl = &ctl->slots[s];
    if (!sl->in_use) continue;
    const int32_t *t = kv__table(ctl, s);
    for (int i = 0; i < sl->n_blocks; i++) {
      if (i < sl->n_released && t[i] == KV_HOLE) continue;
      if (t[i] < 0 || t[i] >= ctl->n_blocks) {
        err = fr_errorf(FR_ESTATE, "kv: slot %d entry %d = %d out of range", s, i, t[i]);
        break;
      }
      cnt[t[i]]++;
    }
  }
  for (int b = 0; b < ctl->n_blocks && !err; b++)
    if (cnt[b] != ctl->blocks[b].ref)
      err = fr_errorf(FR_ESTATE, "kv: block %d ref %d but %d table entries", b, ctl->blocks[b].ref, cnt[b]);
  free(cnt);
  return err;
}
