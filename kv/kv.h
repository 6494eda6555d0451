/* kv.h - paged-KV bookkeeping: block allocator, prefix cache and
 * per-sequence block tables, all living in one shared-memory control segment
 * (`/ferrum-<instance>-kvctl`, see kv_shm.h).
 *
 * Roles and threads:
 * - One writer: the coordinator's event loop creates the control segment with
 *   kv_control_create() and is the only caller of the mutating functions. They
 *   take no locks and must not be called from two threads at once.
 * - Readers: workers (other processes) map the segment read-only with
 *   kv_control_attach() and call kv_seq_read(), which never blocks the writer:
 *   each slot is published with a seqlock, so a reader gets either the table
 *   before or after an update, never a mix. Readers use only kv_seq_read(),
 *   kv_control_info() and kv_seq_version().
 * - Ordering with messages: the writer updates tables, then sends the ZeroMQ
 *   step that refers to them; a worker reads a slot after receiving the step.
 *   The writer must not free or truncate a slot's blocks while a step that
 *   reads them is in flight (kv_seq_version() lets a worker check that the
 *   table is the one the step was built against).
 *
 * Blocks: n_blocks physical blocks of block_size tokens each; ids are int32 in
 * [0, n_blocks), the same ids the backends use (kern_step_t.block_tables,
 * kern slot = block * block_size + offset). Each block has a reference count:
 * the number of sequence-table entries that hold it. Blocks with no reference
 * sit in a free queue; allocation takes the queue's head in O(1), freeing puts
 * a block back in O(1). A freed block that holds a cached prefix keeps its
 * contents and stays findable by the prefix cache until it is handed out
 * again: those go to the queue's tail (evicted last, least recently freed
 * first), blocks with nothing cached go to the head (reused first). A prefix
 * hit on a free cached block takes it off the queue ("revives" it).
 *
 * Prefix cache (vLLM's design, exact): a full block's hash chains the parent
 * block's hash, the block's token ids and the sequence's salt (128 bits, from
 * fr_hash64 with two seeds). A cached block also stores its token ids, and a
 * lookup compares them, so a hit needs both the 128-bit chain hash of the
 * whole prefix and the block's own tokens to match. Blocks enter the cache
 * when the writer commits them (kv_prefix_commit(): the block is full and its
 * KV is or will be written by a step already sent); a block leaves it when it
 * is reused, or when its owner truncates into it and then writes over it.
 * Two identical blocks are never both cached: the second is kept uncached.
 * The cache is deterministic: its state depends only on the call sequence.
 *
 * Admission: kv_admit_plan() tells the scheduler, without changing anything,
 * how many prompt blocks are cached, how many new blocks the rest needs, and
 * whether they fit now. Then: kv_seq_alloc_slot(), kv_seq_attach_prefix()
 * (takes the cached blocks), kv_seq_append() (allocates the rest).
 *
 * Memory: every piece of allocator state is a plain struct array in the
 * segment, linked by indices, never pointers (kv_impl.h has the layout), so
 * another process can inspect it. kv_ctl_t itself is a process-local handle.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv/kv_shm.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KV_BLOCK_SIZE_DEFAULT 16
#define KV_HOLE (-1) /* a table entry whose block was released (kv_seq_release_before) */
#define KV_CTL_WHAT "kvctl" /* segment kind of the control segment */

typedef struct kv_ctl kv_ctl_t;

typedef struct {
  const char *instance;    /* instance id for the segment name; NULL = private
                            * anonymous memory (tests, single process) */
  uint64_t epoch;          /* written to the segment header */
  int n_blocks;            /* physical KV blocks (n_blocks * block_size < 2^31) */
  int block_size;          /* tokens per block; 0 = KV_BLOCK_SIZE_DEFAULT */
  int max_seqs;            /* sequence slots */
  int max_blocks_per_seq;  /* table row length: max context = this * block_size */
  bool enable_prefix_cache;
} kv_config_t;

/* What a reader needs to know about a control segment. */
typedef struct {
  int n_blocks, block_size, max_seqs, max_blocks_per_seq;
  bool prefix_cache;
  uint64_t epoch;
} kv_info_t;

/* A block copy the workers must do before the step's attention:
 * copy block src to block dst (all layers, K and V). src < 0: none. */
typedef struct {
  int32_t src, dst;
} kv_copy_t;

/* A consistent snapshot of one slot read by kv_seq_read(). */
typedef struct {
  int32_t len;      /* tokens in the sequence (0 for a free slot) */
  int32_t n_blocks; /* table entries = ceil(len / block_size) */
  uint32_t version; /* bumps on every change of this slot */
  bool in_use;
} kv_seq_view_t;

/* Admission plan for a prompt (see kv_admit_plan). */
typedef struct {
  int n_cached_blocks; /* leading prompt blocks found in the prefix cache */
  int n_cached_tokens; /* n_cached_blocks * block_size */
  int n_revive;        /* of those, blocks now free (taking them uses free blocks) */
  int n_new_blocks;    /* blocks to allocate for the uncached rest */
  int n_free;          /* free blocks now (kv_blocks_free_count) */
  bool fits;           /* n_revive + n_new_blocks <= n_free and the table is long enough */
} kv_admit_t;

/* Allocator counters (writer side). */
typedef struct {
  int n_blocks, n_free, n_cached, n_cached_free, n_slots_used;
  uint64_t n_evictions;    /* cached blocks dropped because they were reused */
  uint64_t n_lookup_blocks; /* blocks looked up by kv_seq_attach_prefix */
  uint64_t n_hit_blocks;   /* ... of which found */
} kv_stats_t;

/* ---- control segment ---------------------------------------------------- */

/* Creates the control segment (or private memory when cfg->instance is NULL),
 * all blocks free, all slots free. Returns 0 and *out; -EINVAL for a bad
 * config, FR_ETOOBIG when sizes overflow, -EEXIST or -errno from shm. Nothing
 * is left behind on failure. */
int kv_control_create(kv_ctl_t **out, const kv_config_t *cfg);

/* Maps an instance's control segment read-only (a worker). Validates the
 * segment header and the layout against the segment size. Returns 0 and
 * *out, or an error from kv_segment_attach(), FR_EFORMAT / FR_EVERSION. */
int kv_control_attach(kv_ctl_t **out, const char *instance);

/* Unmaps and frees the handle; the writer's handle, in the process that
 * created the segment, also unlinks it (clean exit). NULL is a no-op. */
void kv_control_destroy(kv_ctl_t *ctl);

/* Geometry of the segment (any side). */
void kv_control_info(const kv_ctl_t *ctl, kv_info_t *info);

/* The mapped segment (name, header), NULL for private memory. */
const kv_segment_t *kv_control_segment(const kv_ctl_t *ctl);

/* Checks every allocator invariant (free queue, reference counts against the
 * tables, hash index, counters, slots). Returns 0 or FR_ESTATE with a
 * message. O(n_blocks + max_seqs * max_blocks_per_seq): for tests/debugging. */
int kv_control_verify(const kv_ctl_t *ctl);

/* ---- blocks ------------------------------------------------------------- */

/* Free blocks (reference count 0), including cached ones that can be evicted. */
int kv_blocks_free_count(const kv_ctl_t *ctl);

/* Blocks allocation could hand out without evicting a cached prefix. */
int kv_blocks_uncached_free_count(const kv_ctl_t *ctl);

/* Reference count of a block, or -EINVAL for a bad id. */
int kv_block_ref(const kv_ctl_t *ctl, int block);

/* 1 when a block is in the prefix cache index, 0 when not, -EINVAL. */
int kv_block_cached(const kv_ctl_t *ctl, int block);

void kv_stats_get(const kv_ctl_t *ctl, kv_stats_t *st);

/* ---- sequences (writer) ------------------------------------------------- */

/* Takes a free slot: length 0, no blocks; salt keys its prefix-cache entries
 * (0 = none; e.g. a hash of the LoRA or tenant). Returns 0 and *slot, or
 * FR_EBUSY when all max_seqs slots are in use. */
int kv_seq_alloc_slot(kv_ctl_t *ctl, uint64_t salt, int *slot);

/* For an empty slot: finds the longest cached prefix of tokens[0..n) in whole
 * blocks, puts those blocks in the slot's table (reference +1, reviving free
 * ones) and sets the length to the cached token count, which it stores in
 * *n_cached_tokens. Never allocates, so it cannot run out of blocks. Pass
 * n = prompt length - 1 when the last prompt token must be computed (to get
 * its logits). Returns 0; -EINVAL for a bad slot, FR_ESTATE when the slot is
 * not empty. With the cache disabled it finds nothing. */
int kv_seq_attach_prefix(kv_ctl_t *ctl, int slot, const int32_t *tokens, int n, int *n_cached_tokens);

/* Grows a slot by n tokens (n >= 0), allocating the blocks they need. If the
 * last block is partially filled and shared with another slot (after a fork
 * or a truncate), it is copied first: a new block replaces it in this table,
 * and *copy = {src, dst} tells the workers to copy the KV; otherwise
 * copy->src = -1. copy must not be NULL. All or nothing: FR_EBUSY when there are not enough
 * free blocks, FR_ECONTEXT past max_blocks_per_seq, -EINVAL for a bad slot;
 * the state is unchanged then. */
int kv_seq_append(kv_ctl_t *ctl, int slot, int n, kv_copy_t *copy);

/* Shares all of parent's blocks with a new slot (reference +1 each), same
 * length and salt. A later append by either side into a shared partially
 * filled last block copies it (see kv_seq_append). Returns 0 and *child,
 * FR_EBUSY when no slot is free, -EINVAL for a bad parent. */
int kv_seq_fork(kv_ctl_t *ctl, int parent, int *child);

/* Shrinks a slot to new_len tokens (0 <= new_len <= len), freeing blocks no
 * longer needed (speculative decoding rejects draft tokens this way).
 * Returns 0, -EINVAL for a bad slot or length (also a length inside the
 * released blocks of kv_seq_release_before). */
int kv_seq_truncate(kv_ctl_t *ctl, int slot, int new_len);

/* Sliding-window attention: releases the slot's blocks that hold only
 * tokens before position pos (blocks [0, pos / block_size)), which no
 * query at pos or later reads when every layer's window is at most
 * (next query position - pos + 1). Their table entries become KV_HOLE
 * (the table keeps its length and positions); the blocks lose this
 * reference (a cached prefix block stays findable until reused). With the
 * prefix cache on, only committed blocks are released (the chain hash of
 * the last one stays in the slot, so later commits continue). Call it
 * only when no step in flight reads those blocks (the scheduler does so
 * before building the slot's next step). Returns how many blocks it
 * released, or -EINVAL for a bad slot. */
int kv_seq_release_before(kv_ctl_t *ctl, int slot, int pos);

/* Leading table entries of a slot released by kv_seq_release_before, or -EINVAL. */
int kv_seq_released(const kv_ctl_t *ctl, int slot);

/* Frees a slot: drops all its blocks (last block first, so a prefix's tail is
 * evicted before its head) and returns the slot. -EINVAL for a bad slot. */
int kv_seq_free(kv_ctl_t *ctl, int slot);

/* Length in tokens of a slot in use (writer side), or -EINVAL. */
int kv_seq_len(const kv_ctl_t *ctl, int slot);

/* ---- prefix cache (writer) ---------------------------------------------- */

/* Inserts the slot's full blocks that are not yet committed into the prefix
 * cache. tokens[0..n) are the sequence's tokens from position 0 (n may be
 * less than the length: only blocks whose tokens are final, e.g. accepted
 * ones, should be committed; blocks past min(n, len) are left alone). A block
 * whose prefix is already cached in another block stays uncached. Returns 0;
 * -EINVAL for a bad slot; FR_ESTATE when tokens contradict blocks the slot
 * took from the cache. No-op with the cache disabled. */
int kv_prefix_commit(kv_ctl_t *ctl, int slot, const int32_t *tokens, int n);

/* Forgets the cached blocks that are free: the KV pool they lived in is
 * gone (a worker whose pool is in its own memory, a GPU or a remote host,
 * restarted). Free the sequences that used that pool first (blocks in use
 * keep their entries). Forgotten blocks are reused like any free block.
 * Returns how many were forgotten. */
int kv_prefix_forget(kv_ctl_t *ctl);

/* Finds the longest cached prefix of tokens[0..n) with this salt, in whole
 * blocks: *n_blocks receives the count and blocks[0..min(count, cap)) the
 * block ids (blocks may be NULL with cap 0); *n_free (may be NULL) the count
 * of them that are free now. Changes nothing. Returns 0 or -EINVAL. */
int kv_prefix_lookup(const kv_ctl_t *ctl, const int32_t *tokens, int n, uint64_t salt, int *n_blocks,
                     int32_t *blocks, int cap, int *n_free);

/* Can a prompt of n tokens be admitted now, with room for extra_tokens more
 * (e.g. the first decode step)? Looks up tokens[0..n-1) (the last prompt
 * token is always computed) and fills *plan. Changes nothing; cost is one
 * prefix lookup. Returns 0 or -EINVAL. */
int kv_admit_plan(const kv_ctl_t *ctl, const int32_t *tokens, int n, uint64_t salt, int extra_tokens,
                  kv_admit_t *plan);

/* ---- block tables (readers and writer) ---------------------------------- */

/* Reads a consistent snapshot of a slot: its length, table length, version,
 * and up to cap table entries into blocks (KV_HOLE for released ones) (cap >= view->n_blocks, or
 * FR_ETOOBIG and blocks holds a prefix). Lock-free: retries while the writer
 * updates the slot; FR_EBUSY if the slot stays mid-update (a writer that died
 * mid-write). Returns 0, -EINVAL for a bad slot. */
int kv_seq_read(const kv_ctl_t *ctl, int slot, int32_t *blocks, int cap, kv_seq_view_t *view);

/* The slot's current version (see kv_seq_view_t), an acquire load. */
uint32_t kv_seq_version(const kv_ctl_t *ctl, int slot);

#ifdef __cplusplus
}
#endif
