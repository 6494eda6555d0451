/* kv_ctl.c - the control segment: layout, create, attach, verify. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "kv/kv_impl.h"

#define KV__MAX_BLOCK_SIZE (1 << 16)
#define KV__MAX_SEQS (1 << 20)
#define KV__MAX_BPS (1 << 24)

/* off += a * b, then round up to 64; -1 on overflow. */
static int kv__region(uint64_t *off, size_t a, size_t b) {
  size_t n, o;
  if (fr_mul_size(a, b, &n) || fr_add_size((size_t)*off, n, &o) || fr_add_size(o, 63, &o)) return -1;
  *off = o & ~(size_t)63;
  return 0;
}

int kv__layout(kv__ctl_hdr_t *h) {
  uint32_t buckets = 16;
  while (h->prefix_cache && buckets < 2u * (uint32_t)h->n_blocks && buckets < (1u << 31)) buckets <<= 1;
  h->hash_mask = buckets - 1;
  uint64_t off = (sizeof *h + 63) & ~(uint64_t)63;
  int bad = 0;
  h->off_blocks = off;
  bad |= kv__region(&off, (size_t)h->n_blocks + 1, sizeof(kv__block_t));
  h->off_buckets = off;
  bad |= kv__region(&off, buckets, sizeof(uint32_t));
  h->off_tokens = off;
  if (h->prefix_cache) bad |= kv__region(&off, (size_t)h->n_blocks * (size_t)h->block_size, sizeof(int32_t));
  h->off_slots = off;
  bad |= kv__region(&off, (size_t)h->max_seqs, sizeof(kv__slot_t));
  h->off_tables = off;
  bad |= kv__region(&off, (size_t)h->max_seqs * (size_t)h->max_blocks_per_seq, sizeof(int32_t));
  h->layout_bytes = off;
  return bad ? fr_errorf(FR_ETOOBIG, "kv: control segment size overflows") : 0;
}

/* Limits shared by create (config) and attach (untrusted header). */
static int kv__geometry_check(int n_blocks, int bs, int max_seqs, int max_bps) {
  if (bs < 1 || bs > KV__MAX_BLOCK_SIZE) return fr_errorf(-EINVAL, "kv: block size %d not in [1, %d]", bs, KV__MAX_BLOCK_SIZE);
  if (n_blocks < 1 || (int64_t)n_blocks * bs > INT32_MAX)
    return fr_errorf(-EINVAL, "kv: %d blocks of %d tokens: need 1 <= n_blocks, n_blocks * block_size < 2^31", n_blocks, bs);
  if (max_seqs < 1 || max_seqs > KV__MAX_SEQS) return fr_errorf(-EINVAL, "kv: max_seqs %d not in [1, %d]", max_seqs, KV__MAX_SEQS);
  if (max_bps < 1 || max_bps > KV__MAX_BPS || (int64_t)max_bps * bs > INT32_MAX)
    return fr_errorf(-EINVAL, "kv: max_blocks_per_seq %d not in [1, %d] or context >= 2^31", max_bps, KV__MAX_BPS);
  return 0;
}

static void kv__bind(kv_ctl_t *ctl, void *payload, const kv__ctl_hdr_t *h) {
  char *p = payload;
  ctl->hdr = payload;
  ctl->n_blocks = h->n_blocks;
  ctl->block_size = h->block_size;
  ctl->max_seqs = h->max_seqs;
  ctl->max_bps = h->max_blocks_per_seq;
  ctl->prefix_cache = h->prefix_cache != 0;
  ctl->hash_mask = h->hash_mask;
  ctl->blocks = (kv__block_t *)(p + h->off_blocks);
  ctl->buckets = (uint32_t *)(p + h->off_buckets);
  ctl->tokens = h->prefix_cache ? (int32_t *)(p + h->off_tokens) : NULL;
  ctl->slots = (kv__slot_t *)(p + h->off_slots);
  ctl->tables = (int32_t *)(p + h->off_tables);
}

static int kv__map(kv_ctl_t *ctl, const kv_config_t *cfg, size_t bytes, void **payload) {
  if (cfg->instance) {
    int err = kv_segment_create(&ctl->seg, cfg->instance, KV_CTL_WHAT, bytes, cfg->epoch);
    if (err) return err;
    *payload = kv_segment_data(&ctl->seg);
    return 0;
  }
  /* Shared so that fork()ed children see the writer's updates. */
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return fr_errorf(-errno, "kv: mmap %zu bytes: %s", bytes, strerror(errno));
  ctl->anon = p;
  ctl->anon_bytes = bytes;
  *payload = p;
  return 0;
}

int kv_control_create(kv_ctl_t **out, const kv_config_t *cfg) {
  *out = NULL;
  kv__ctl_hdr_t h = {.magic = KV__CTL_MAGIC, .version = KV__CTL_VERSION};
  h.n_blocks = cfg->n_blocks;
  h.block_size = cfg->block_size ? cfg->block_size : KV_BLOCK_SIZE_DEFAULT;
  h.max_seqs = cfg->max_seqs;
  h.max_blocks_per_seq = cfg->max_blocks_per_seq;
  h.prefix_cache = cfg->enable_prefix_cache;
  int err = kv__geometry_check(h.n_blocks, h.block_size, h.max_seqs, h.max_blocks_per_seq);
  if (!err) err = kv__layout(&h);
  if (err) return err;
  kv_ctl_t *ctl = fr_calloc(1, sizeof *ctl);
  ctl->seg.fd = -1;
  void *payload = NULL;
  err = kv__map(ctl, cfg, h.layout_bytes, &payload);
  if (err) goto fail_free;
  h.magic = 0;
  memcpy(payload, &h, sizeof h);
  kv__bind(ctl, payload, &h);
  ctl->writer = 1;
  ctl->epoch = cfg->epoch;
  memset(ctl->buckets, 0xff, ((size_t)h.hash_mask + 1) * sizeof *ctl->buckets);
  kv__alloc_init(ctl);
  kv__slots_init(ctl);
  __atomic_store_n(&ctl->hdr->magic, KV__CTL_MAGIC, __ATOMIC_RELEASE);
  *out = ctl;
  return 0;

fail_free:
  free(ctl);
  return err;
}

/* Validates an attached segment's control header against its size. */
static int kv__attach_check(const kv__ctl_hdr_t *h, size_t data_size, const char *name) {
  if (data_size < sizeof *h) return fr_errorf(FR_ETRUNCATED, "kv: %s: too small for a control header", name);
  if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != KV__CTL_MAGIC)
    return fr_errorf(FR_EFORMAT, "kv: %s: not a control segment (or not initialised yet)", name);
  if (h->version != KV__CTL_VERSION)
    return fr_errorf(FR_EVERSION, "kv: %s: control layout %u, expected %u", name, h->version, KV__CTL_VERSION);
  int err = kv__geometry_check(h->n_blocks, h->block_size, h->max_seqs, h->max_blocks_per_seq);
  if (err) return fr_errorf(FR_EFORMAT, "kv: %s: bad geometry: %s", name, fr_last_error());
  kv__ctl_hdr_t want = *h;
  err = kv__layout(&want);
  if (err || want.hash_mask != h->hash_mask || want.off_blocks != h->off_blocks ||
      want.off_buckets != h->off_buckets || want.off_tokens != h->off_tokens || want.off_slots != h->off_slots ||
      want.off_tables != h->off_tables || want.layout_bytes != h->layout_bytes || want.layout_bytes > data_size)
    return fr_errorf(FR_EFORMAT, "kv: %s: layout does not match its geometry or size", name);
  return 0;
}

int kv_control_attach(kv_ctl_t **out, const char *instance) {
  *out = NULL;
  kv_ctl_t *ctl = fr_calloc(1, sizeof *ctl);
  int err = kv_segment_attach(&ctl->seg, instance, KV_CTL_WHAT, KV_SEG_RDONLY);
  if (err) goto fail_free;
  /* Copy the header once: geometry is validated and used from the copy. */
  kv__ctl_hdr_t h;
  memcpy(&h, kv_segment_data(&ctl->seg), sizeof h);
  err = kv__attach_check(&h, kv_segment_data_size(&ctl->seg), ctl->seg.name);
  if (err) goto fail_detach;
  kv__bind(ctl, kv_segment_data(&ctl->seg), &h);
  ctl->epoch = kv_segment_header(&ctl->seg)->epoch;
  *out = ctl;
  return 0;

fail_detach:
  kv_segment_detach(&ctl->seg);
fail_free:
  free(ctl);
  return err;
}

void kv_control_destroy(kv_ctl_t *ctl) {
  if (!ctl) return;
  if (ctl->seg.base) {
    /* Only the owner unlinks: a fork()ed child's destroy leaves it alone. */
    if (ctl->writer && kv_segment_header(&ctl->seg)->owner_pid == (int32_t)getpid()) shm_unlink(ctl->seg.name);
    kv_segment_detach(&ctl->seg);
  }
  if (ctl->anon) munmap(ctl->anon, ctl->anon_bytes);
  free(ctl);
}

void kv_control_info(const kv_ctl_t *ctl, kv_info_t *info) {
  info->n_blocks = ctl->n_blocks;
  info->block_size = ctl->block_size;
  info->max_seqs = ctl->max_seqs;
  info->max_blocks_per_seq = ctl->max_bps;
  info->prefix_cache = ctl->prefix_cache;
  info->epoch = ctl->epoch;
}

const kv_segment_t *kv_control_segment(const kv_ctl_t *ctl) { return ctl->seg.base ? &ctl->seg : NULL; }

void kv_stats_get(const kv_ctl_t *ctl, kv_stats_t *st) {
  const kv__ctl_hdr_t *h = ctl->hdr;
  st->n_blocks = ctl->n_blocks;
  st->n_free = h->n_free;
  st->n_cached = h->n_cached;
  st->n_cached_free = h->n_cached_free;
  st->n_slots_used = h->n_slots_used;
  st->n_evictions = h->n_evictions;
  st->n_lookup_blocks = h->n_lookup_blocks;
  st->n_hit_blocks = h->n_hit_blocks;
}

/* Slots: lengths match tables, committed blocks are hashed, free list and
 * count agree. */
static int kv__slots_verify(const kv_ctl_t *ctl) {
  int used = 0, on_list = 0, bs = ctl->block_size;
  for (int s = 0; s < ctl->max_seqs; s++) {
    const kv__slot_t *sl = &ctl->slots[s];
    if (sl->seq & 1) return fr_errorf(FR_ESTATE, "kv: slot %d left mid-update", s);
    if (!sl->in_use) {
      if (sl->len || sl->n_blocks) return fr_errorf(FR_ESTATE, "kv: free slot %d has %d tokens", s, sl->len);
      continue;
    }
    used++;
    if (sl->len < 0 || sl->n_blocks != (sl->len + bs - 1) / bs || sl->n_blocks > ctl->max_bps)
      return fr_errorf(FR_ESTATE, "kv: slot %d: %d tokens in %d blocks", s, sl->len, sl->n_blocks);
    if (sl->n_committed < 0 || sl->n_committed > sl->len / bs)
      return fr_errorf(FR_ESTATE, "kv: slot %d: %d committed of %d tokens", s, sl->n_committed, sl->len);
    const int32_t *t = kv__table(ctl, s);
    if (sl->n_released < 0 || sl->n_released >= FR_MAX(sl->n_blocks, 1) || (ctl->prefix_cache && sl->n_released > sl->n_committed))
      return fr_errorf(FR_ESTATE, "kv: slot %d: %d released of %d blocks", s, sl->n_released, sl->n_blocks);
    for (int i = 0; i < sl->n_blocks; i++)
      if ((i < sl->n_released) != (t[i] == KV_HOLE))
        return fr_errorf(FR_ESTATE, "kv: slot %d: entry %d is %d with %d released", s, i, t[i], sl->n_released);
    for (int i = sl->n_released; i < sl->n_committed; i++)
      if (!(ctl->blocks[t[i]].flags & KV__BLK_HASHED))
        return fr_errorf(FR_ESTATE, "kv: slot %d: committed block %d (%d) not hashed", s, i, t[i]);
  }
  for (uint32_t s = ctl->hdr->slot_free; s != KV_NIL; s = ctl->slots[s].next_free) {
    if (s >= (uint32_t)ctl->max_seqs || ctl->slots[s].in_use || ++on_list > ctl->max_seqs)
      return fr_errorf(FR_ESTATE, "kv: slot free list is broken at %u", s);
  }
  if (used != ctl->hdr->n_slots_used || used + on_list != ctl->max_seqs)
    return fr_errorf(FR_ESTATE, "kv: %d slots used, %d free listed, counter %d", used, on_list, ctl->hdr->n_slots_used);
  return 0;
}

int kv_control_verify(const kv_ctl_t *ctl) {
  int err = kv__slots_verify(ctl); /* first: the others trust table lengths */
  if (!err) err = kv__alloc_verify(ctl);
  if (!err && ctl->prefix_cache) err = kv__index_verify(ctl);
  return err;
}
