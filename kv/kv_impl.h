/* kv_impl.h - layout of the control segment and kv/'s internal helpers.
 *
 * The control segment's payload (after the kv_seg_header_t page) holds, each
 * region 64-byte aligned, at offsets recorded in kv__ctl_hdr_t:
 *   kv__ctl_hdr_t                          config, offsets, writer counters
 *   kv__block_t  blocks[n_blocks + 1]      per block; [n_blocks] is the free-queue sentinel
 *   uint32_t     buckets[hash_mask + 1]    prefix index: first block of each hash chain
 *   int32_t      tokens[n_blocks][block_size]  token ids of cached blocks (prefix cache only)
 *   kv__slot_t   slots[max_seqs]           per sequence slot
 *   int32_t      tables[max_seqs][max_blocks_per_seq]  block tables
 * Links are block or slot indices; KV_NIL marks none. Only the writer
 * (coordinator) changes anything; readers use the slots' seqlocks.
 *
 * Internal to kv/ (and its tests and benchmark); not a public interface.
 */
#pragma once

#include <stdint.h>

#include "kv/kv.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KV__CTL_MAGIC 0x4c54435655524546ull /* "FERUVCTL" */
#define KV__CTL_VERSION 1u
#define KV_NIL UINT32_MAX

enum {
  KV__BLK_HASHED = 1u,  /* full and final: h holds its prefix chain hash */
  KV__BLK_INDEXED = 2u, /* in the prefix index (implies HASHED; tokens[] valid) */
};

typedef struct {
  int32_t ref;       /* table entries holding the block; 0 = in the free queue */
  uint32_t flags;    /* KV__BLK_* */
  uint32_t prev;     /* free queue links (ref == 0 only) */
  uint32_t next;
  uint32_t hnext;    /* next block in the same hash bucket (indexed only) */
  uint32_t pad;
  uint64_t h[2];     /* 128-bit chain hash of the prefix ending with this block */
} kv__block_t;

typedef struct {
  uint32_t seq;         /* seqlock: odd while the writer updates the slot */
  int32_t len;          /* tokens (read under the seqlock) */
  int32_t n_blocks;     /* table entries in use (read under the seqlock) */
  uint32_t in_use;      /* 1 while allocated (read under the seqlock) */
  /* writer-only */
  int32_t n_committed;  /* leading blocks whose chain hash is set (HASHED) */
  uint32_t next_free;   /* slot free list */
  uint64_t salt;
  uint64_t last_h[2];   /* chain hash of block n_committed - 1 (the next commit's parent) */
  int32_t n_released;   /* leading table entries released (KV_HOLE): kv_seq_release_before */
  uint8_t pad[12];      /* one cache line per slot */
} kv__slot_t;
_Static_assert(sizeof(kv__slot_t) == 64, "one cache line per slot");

typedef struct {
  uint64_t magic;       /* KV__CTL_MAGIC */
  uint32_t version;     /* KV__CTL_VERSION */
  uint32_t prefix_cache;
  int32_t n_blocks, block_size, max_seqs, max_blocks_per_seq;
  uint32_t hash_mask;   /* buckets - 1 (buckets: power of two >= 2 * n_blocks) */
  uint32_t pad0;
  uint64_t off_blocks, off_buckets, off_tokens, off_slots, off_tables, layout_bytes;
  /* writer state */
  int32_t n_free;       /* blocks with ref 0 */
  int32_t n_cached;     /* indexed blocks */
  int32_t n_cached_free;/* indexed blocks with ref 0 */
  int32_t n_slots_used;
  uint32_t slot_free;   /* head of the slot free list */
  uint32_t pad1;
  uint64_t n_evictions, n_lookup_blocks, n_hit_blocks;
} kv__ctl_hdr_t;

struct kv_ctl {
  kv_segment_t seg;     /* the mapping (seg.base NULL for private memory) */
  void *anon;           /* private memory (instance NULL) */
  size_t anon_bytes;
  int writer;           /* 1 for the creator */
  /* validated geometry, copied so readers never trust shm twice */
  int n_blocks, block_size, max_seqs, max_bps;
  int prefix_cache;
  uint32_t hash_mask;
  uint64_t epoch;
  kv__ctl_hdr_t *hdr;
  kv__block_t *blocks;  /* (n_blocks + 1) */
  uint32_t *buckets;    /* (hash_mask + 1) */
  int32_t *tokens;      /* (n_blocks, block_size) or NULL */
  kv__slot_t *slots;    /* (max_seqs) */
  int32_t *tables;      /* (max_seqs, max_bps) */
};

/* Region offsets for a geometry: fills the offset fields and hash_mask of
 * hdr. Returns 0 or FR_ETOOBIG. */
int kv__layout(kv__ctl_hdr_t *hdr);

/* Block allocator (kv_alloc.c). */
void kv__alloc_init(kv_ctl_t *ctl);
/* Takes the free queue's head (evicting its cache entry): ref 1. The caller
 * has checked n_free > 0. */
uint32_t kv__block_alloc(kv_ctl_t *ctl);
/* Reference +1; a free block leaves the queue (revive). */
void kv__block_ref(kv_ctl_t *ctl, uint32_t b);
/* Reference -1; at 0 the block joins the free queue (tail if cached). */
void kv__block_unref(kv_ctl_t *ctl, uint32_t b);
int kv__alloc_verify(const kv_ctl_t *ctl);

/* Prefix index (kv_prefix.c). */
void kv__hash_root(uint64_t salt, uint64_t h[2]);
void kv__hash_block(const uint64_t parent[2], const int32_t *tokens, int bs, uint64_t salt, uint64_t out[2]);
/* Indexed block with this chain hash and tokens, or KV_NIL. */
uint32_t kv__index_find(const kv_ctl_t *ctl, const uint64_t h[2], const int32_t *tokens);
void kv__index_insert(kv_ctl_t *ctl, uint32_t b, const int32_t *tokens);
void kv__index_remove(kv_ctl_t *ctl, uint32_t b);
/* Clears HASHED/INDEXED before a block's contents change. */
void kv__block_uncache(kv_ctl_t *ctl, uint32_t b);
int kv__index_verify(const kv_ctl_t *ctl);

/* Slots (kv_table.c): all free, in ascending order. */
void kv__slots_init(kv_ctl_t *ctl);

static inline int32_t *kv__table(const kv_ctl_t *ctl, int slot) {
  return ctl->tables + (size_t)slot * (size_t)ctl->max_bps;
}

#ifdef __cplusplus
}
#endif
