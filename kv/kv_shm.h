/* kv_shm.h - named POSIX shared-memory segments with a self-describing header.
 *
 * Every segment ferrum shares between processes is named
 * `/ferrum-<instance>-<what>` and starts with a kv_seg_header_t (magic, layout
 * version, instance id, owner pid and start time, epoch). The payload starts
 * at KV_SEG_DATA_OFFSET (4096) from the mapping, so it is page aligned for
 * 4 KiB pages and 64-byte aligned everywhere; the segment's size is rounded up
 * to the page size. Segments are created with mode 0600 and O_EXCL.
 *
 * Ownership: the creating process is the owner (kv_segment_adopt() moves
 * ownership, e.g. to a restarted worker). kv_segment_scan_stale() removes
 * segments whose owner is dead (or whose pid was reused by another process:
 * the owner's start time is compared too); live ones are left alone, and so
 * are `/ferrum-*` names whose header it does not recognise.
 *
 * Threads: a kv_segment_t is a plain handle, used by one thread at a time.
 * Concurrency on the payload is the payload's business (see kv.h).
 *
 * Also here: the size of a CPU worker's KV pool segment (kv_pool_bytes()).
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KV_SEG_MAGIC 0x4745534d55524546ull /* "FERUMSEG" little-endian */
#define KV_SEG_VERSION 1u
#define KV_SEG_DATA_OFFSET 4096u /* payload offset from the start of the mapping */
#define KV_INSTANCE_MAX 32       /* bytes incl. NUL: instance ids are 1..31 chars */
#define KV_WHAT_MAX 32           /* bytes incl. NUL */
#define KV_SEG_NAME_MAX 80       /* "/ferrum-" + instance + "-" + what + NUL fits */

/* The header at offset 0 of every segment. Written once by the creator
 * (magic last, with release order), then read-only except for the owner
 * fields that kv_segment_adopt() rewrites. */
typedef struct {
  uint64_t magic;          /* KV_SEG_MAGIC; 0 while the creator writes the header */
  uint32_t version;        /* KV_SEG_VERSION */
  uint32_t data_offset;    /* KV_SEG_DATA_OFFSET */
  uint64_t total_bytes;    /* size of the whole segment (page multiple) */
  uint64_t data_bytes;     /* payload bytes asked for at creation */
  uint64_t epoch;          /* the creator's epoch (coordinator generation) */
  int32_t owner_pid;       /* process that owns the segment */
  uint32_t reserved0;      /* 0 */
  uint64_t owner_start;    /* owner's start time (clock ticks since boot), 0 if unknown */
  char instance[KV_INSTANCE_MAX]; /* NUL-terminated */
  char what[KV_WHAT_MAX];         /* NUL-terminated */
} kv_seg_header_t;

/* A mapped segment (process-local handle; the mapping is not shared state). */
typedef struct {
  char name[KV_SEG_NAME_MAX]; /* "/ferrum-<instance>-<what>" */
  void *base;                 /* start of the mapping (the header) */
  size_t size;                /* bytes mapped */
  int fd;                     /* shm file descriptor, -1 once closed */
  int writable;               /* 1 when mapped read-write */
} kv_segment_t;

/* Access modes for kv_segment_attach(). */
enum { KV_SEG_RDONLY = 0, KV_SEG_RDWR = 1 };

/* Writes "/ferrum-<instance>-<what>" into out. instance: 1..31 chars of
 * [A-Za-z0-9_.]; what: 1..31 chars of [A-Za-z0-9_.-]. Returns 0, or -EINVAL
 * (bad characters or length) with a message. */
int kv_segment_name(char *out, size_t cap, const char *instance, const char *what);

/* Creates a new segment with `data_bytes` of zeroed payload, maps it
 * read-write and writes the header (owner = this process). Fails with
 * -EEXIST when the name exists (run kv_segment_scan_stale() first), -EINVAL
 * for a bad name, FR_ETOOBIG when the size overflows, or another -errno.
 * On failure nothing is left behind (the name is unlinked). */
int kv_segment_create(kv_segment_t *seg, const char *instance, const char *what, size_t data_bytes,
                      uint64_t epoch);

/* Maps an existing segment, KV_SEG_RDONLY (PROT_READ: writes fault) or
 * KV_SEG_RDWR, and validates its header: magic, version, data offset, that
 * total_bytes equals the file size, and that instance and what match the
 * name. Returns 0; -ENOENT when it does not exist; FR_ETRUNCATED when it is
 * smaller than its header (still being created); FR_EFORMAT / FR_EVERSION
 * for a bad header. On failure seg holds nothing to release. */
int kv_segment_attach(kv_segment_t *seg, const char *instance, const char *what, int mode);

/* Unmaps and closes (does not unlink). NULL or an unmapped seg is a no-op. */
void kv_segment_detach(kv_segment_t *seg);

/* Removes the name (mapped handles stay valid until detached). Returns 0 or
 * -errno (-ENOENT when it does not exist). */
int kv_segment_unlink(const char *instance, const char *what);

/* Header and payload of a mapped segment. */
static inline const kv_seg_header_t *kv_segment_header(const kv_segment_t *seg) {
  return (const kv_seg_header_t *)seg->base;
}
static inline void *kv_segment_data(const kv_segment_t *seg) {
  return (char *)seg->base + KV_SEG_DATA_OFFSET;
}
/* Payload bytes usable in this mapping (>= data_bytes asked at creation). */
static inline size_t kv_segment_data_size(const kv_segment_t *seg) {
  return seg->size - KV_SEG_DATA_OFFSET;
}

/* Makes the calling process the owner (and sets the epoch) of a segment
 * mapped read-write, so the stale scan keeps it while this process lives.
 * Returns 0 or -EPERM for a read-only mapping. */
int kv_segment_adopt(kv_segment_t *seg, uint64_t epoch);

/* Returns 1 when the owner recorded in hdr is alive (same pid, same start
 * time when both are known, not a zombie), else 0. */
int kv_segment_owner_alive(const kv_seg_header_t *hdr);

/* Scans /dev/shm for `ferrum-*` segments and unlinks those with a valid
 * header whose owner is dead. Live segments and names whose header is not
 * recognised (another layout, truncated, still being created) are left
 * alone. n_removed / n_live (either may be NULL) receive the counts of
 * removed and live recognised segments. Returns 0 or -errno (from opendir). */
int kv_segment_scan_stale(int *n_removed, int *n_live);

/* Geometry of a paged KV pool (one worker's KV cache). */
typedef struct {
  int n_layers;   /* model layers on this worker */
  int n_kv_heads; /* KV heads on this worker (after the TP split) */
  int head_dim;   /* elements per head */
  int elem_bytes; /* bytes per element: 4 (f32), 2 (f16/bf16) */
  int block_size; /* tokens per block (default 16) */
  int n_blocks;   /* blocks in the pool */
} kv_pool_geom_t;

/* Payload bytes of a KV pool:
 *   n_layers * 2 (K and V) * n_blocks * block_size * n_kv_heads * head_dim * elem_bytes
 * in kern_kv_pool_t's order (layer l's K, then its V). The layout matches
 * kern_kv_pool_bytes() for the same config. Returns 0 and *out, -EINVAL for
 * a non-positive field, FR_ETOOBIG on overflow. */
int kv_pool_data_bytes(const kv_pool_geom_t *g, size_t *out);

/* Bytes of a whole KV pool segment: the payload plus the header, rounded up
 * to the page size. Returns 0 and *out, or as kv_pool_data_bytes(). */
int kv_pool_bytes(const kv_pool_geom_t *g, size_t *out);

#ifdef __cplusplus
}
#endif
