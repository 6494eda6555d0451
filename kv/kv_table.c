/* kv_table.c - sequence slots and their block tables.
 *
 * Publishing: every change to a slot (length, table entries, in_use) happens
 * between kv__wbegin() and kv__wend(), a seqlock: the slot's seq is odd
 * while it changes. Fields readers look at are written with relaxed atomic
 * stores inside it; kv_seq_read() retries until it sees the same even seq
 * before and after its reads (Boehm's seqlock recipe for C11). */
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "kv/kv_impl.h"

#define KV__ST(lv, v) __atomic_store_n(&(lv), (v), __ATOMIC_RELAXED)
#define KV__LD(lv) __atomic_load_n(&(lv), __ATOMIC_RELAXED)

static void kv__wbegin(kv__slot_t *s) {
  __atomic_store_n(&s->seq, s->seq + 1, __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_RELEASE);
}

static void kv__wend(kv__slot_t *s) { __atomic_store_n(&s->seq, s->seq + 1, __ATOMIC_RELEASE); }

static int kv__slot_check(const kv_ctl_t *ctl, int slot, const char *what) {
  if (!ctl->writer) return fr_errorf(-EPERM, "kv: %s is for the writer", what);
  if (slot < 0 || slot >= ctl->max_seqs || !ctl->slots[slot].in_use)
    return fr_errorf(-EINVAL, "kv: %s: slot %d is not in use", what, slot);
  return 0;
}

void kv__slots_init(kv_ctl_t *ctl) {
  for (int s = 0; s < ctl->max_seqs; s++) {
    memset(&ctl->slots[s], 0, sizeof ctl->slots[s]);
    ctl->slots[s].next_free = s + 1 < ctl->max_seqs ? (uint32_t)s + 1 : KV_NIL;
  }
  ctl->hdr->slot_free = 0;
}

int kv_seq_alloc_slot(kv_ctl_t *ctl, uint64_t salt, int *slot) {
  if (!ctl->writer) return fr_errorf(-EPERM, "kv: slot allocation is for the writer");
  uint32_t s = ctl->hdr->slot_free;
  if (s == KV_NIL) return fr_errorf(FR_EBUSY, "kv: all %d sequence slots are in use", ctl->max_seqs);
  kv__slot_t *sl = &ctl->slots[s];
  ctl->hdr->slot_free = sl->next_free;
  ctl->hdr->n_slots_used++;
  kv__wbegin(sl);
  KV__ST(sl->len, 0);
  KV__ST(sl->n_blocks, 0);
  KV__ST(sl->in_use, 1);
  kv__wend(sl);
  sl->n_committed = 0;
  sl->n_released = 0;
  sl->next_free = KV_NIL;
  sl->salt = salt;
  *slot = (int)s;
  return 0;
}

int kv_seq_attach_prefix(kv_ctl_t *ctl, int slot, const int32_t *tokens, int n, int *n_cached_tokens) {
  int err = kv__slot_check(ctl, slot, "attach prefix");
  if (err) return err;
  kv__slot_t *sl = &ctl->slots[slot];
  if (n < 0 || (n > 0 && !tokens) || !n_cached_tokens) return fr_errorf(-EINVAL, "kv: attach prefix: bad arguments");
  if (sl->len != 0 || sl->n_blocks != 0) return fr_errorf(FR_ESTATE, "kv: attach prefix: slot %d is not empty", slot);
  int n_blk = ctl->prefix_cache ? FR_MIN(n / ctl->block_size, ctl->max_bps) : 0;
  int32_t *t = kv__table(ctl, slot);
  int32_t hits[64];
  int got = 0;
  kv__wbegin(sl);
  /* Hits go to a buffer first: the table is written with atomic stores. */
  if (n_blk > 0) {
    int32_t *tmp = n_blk <= (int)FR_ARRAY_SIZE(hits) ? hits : fr_malloc((size_t)n_blk * sizeof *tmp);
    err = kv_prefix_lookup(ctl, tokens, n_blk * ctl->block_size, sl->salt, &got, tmp, n_blk, NULL);
    got = err ? 0 : FR_MIN(got, n_blk);
    for (int i = 0; i < got; i++) {
      kv__block_ref(ctl, (uint32_t)tmp[i]);
      KV__ST(t[i], tmp[i]);
    }
    if (tmp != hits) free(tmp);
  }
  KV__ST(sl->n_blocks, got);
  KV__ST(sl->len, got * ctl->block_size);
  kv__wend(sl);
  sl->n_committed = got;
  if (got > 0) memcpy(sl->last_h, ctl->blocks[t[got - 1]].h, sizeof sl->last_h);
  ctl->hdr->n_lookup_blocks += (uint64_t)n_blk;
  ctl->hdr->n_hit_blocks += (uint64_t)got;
  *n_cached_tokens = got * ctl->block_size;
  return err;
}

/* Before writing past len into the partially filled last block: a shared
 * block is copied (returns the copy), a private one leaves the cache. */
static void kv__prepare_last(kv_ctl_t *ctl, kv__slot_t *sl, int32_t *t, kv_copy_t *copy) {
  uint32_t last = (uint32_t)t[sl->n_blocks - 1];
  if (ctl->blocks[last].ref > 1) {
    uint32_t nb = kv__block_alloc(ctl);
    kv__block_unref(ctl, last);
    KV__ST(t[sl->n_blocks - 1], (int32_t)nb);
    copy->src = (int32_t)last;
    copy->dst = (int32_t)nb;
  } else if (ctl->blocks[last].flags) {
    kv__block_uncache(ctl, last);
  }
}

int kv_seq_append(kv_ctl_t *ctl, int slot, int n, kv_copy_t *copy) {
  int err = kv__slot_check(ctl, slot, "append");
  if (err) return err;
  if (n < 0 || !copy) return fr_errorf(-EINVAL, "kv: append: bad arguments");
  copy->src = copy->dst = -1;
  kv__slot_t *sl = &ctl->slots[slot];
  int bs = ctl->block_size;
  int64_t new_len = (int64_t)sl->len + n;
  int64_t new_nb = (new_len + bs - 1) / bs;
  if (new_nb > ctl->max_bps)
    return fr_errorf(FR_ECONTEXT, "kv: slot %d: %lld tokens exceed %d blocks of %d", slot, (long long)new_len,
                     ctl->max_bps, bs);
  int32_t *t = kv__table(ctl, slot);
  int partial = n > 0 && sl->len % bs != 0;
  int cow = partial && ctl->blocks[t[sl->n_blocks - 1]].ref > 1;
  int64_t need = new_nb - sl->n_blocks + cow;
  if (need > ctl->hdr->n_free)
    return fr_errorf(FR_EBUSY, "kv: slot %d needs %lld blocks, %d free", slot, (long long)need, ctl->hdr->n_free);
  kv__wbegin(sl);
  if (partial) kv__prepare_last(ctl, sl, t, copy);
  for (int i = sl->n_blocks; i < new_nb; i++) KV__ST(t[i], (int32_t)kv__block_alloc(ctl));
  KV__ST(sl->n_blocks, (int32_t)new_nb);
  KV__ST(sl->len, (int32_t)new_len);
  kv__wend(sl);
  return 0;
}

int kv_seq_fork(kv_ctl_t *ctl, int parent, int *child) {
  int err = kv__slot_check(ctl, parent, "fork");
  if (err) return err;
  kv__slot_t *p = &ctl->slots[parent];
  int c;
  err = kv_seq_alloc_slot(ctl, p->salt, &c);
  if (err) return err;
  kv__slot_t *sl = &ctl->slots[c];
  const int32_t *pt = kv__table(ctl, parent);
  int32_t *t = kv__table(ctl, c);
  kv__wbegin(sl);
  for (int i = 0; i < p->n_blocks; i++) {
    if (i >= p->n_released) kv__block_ref(ctl, (uint32_t)pt[i]);
    KV__ST(t[i], pt[i]);
  }
  KV__ST(sl->n_blocks, p->n_blocks);
  KV__ST(sl->len, p->len);
  kv__wend(sl);
  sl->n_committed = p->n_committed;
  sl->n_released = p->n_released;
  memcpy(sl->last_h, p->last_h, sizeof sl->last_h);
  *child = c;
  return 0;
}

/* Drops table entries [keep, n_blocks), last first. Inside a write section. */
static void kv__drop_tail(kv_ctl_t *ctl, kv__slot_t *sl, const int32_t *t, int keep) {
  for (int i = sl->n_blocks - 1; i >= keep && i >= sl->n_released; i--) kv__block_unref(ctl, (uint32_t)t[i]);
  KV__ST(sl->n_blocks, keep);
}

int kv_seq_truncate(kv_ctl_t *ctl, int slot, int new_len) {
  int err = kv__slot_check(ctl, slot, "truncate");
  if (err) return err;
  kv__slot_t *sl = &ctl->slots[slot];
  int bs = ctl->block_size;
  if (new_len < 0 || new_len > sl->len || (sl->n_released > 0 && new_len <= sl->n_released * bs))
    return fr_errorf(-EINVAL, "kv: truncate slot %d to %d tokens (has %d, the first %d released)", slot, new_len,
                     sl->len, sl->n_released * bs);
  const int32_t *t = kv__table(ctl, slot);
  kv__wbegin(sl);
  kv__drop_tail(ctl, sl, t, (new_len + bs - 1) / bs);
  KV__ST(sl->len, new_len);
  kv__wend(sl);
  if (new_len / bs < sl->n_committed) {
    sl->n_committed = new_len / bs;
    if (sl->n_committed > 0) memcpy(sl->last_h, ctl->blocks[t[sl->n_committed - 1]].h, sizeof sl->last_h);
  }
  return 0;
}

int kv_seq_release_before(kv_ctl_t *ctl, int slot, int pos) {
  int err = kv__slot_check(ctl, slot, "release");
  if (err) return err;
  kv__slot_t *sl = &ctl->slots[slot];
  int end = FR_MIN(pos, sl->len) / ctl->block_size;
  end = FR_MIN(end, sl->n_blocks - 1); /* the last block holds the next token's neighbours: always kept */
  if (ctl->prefix_cache) end = FR_MIN(end, sl->n_committed);
  if (end <= sl->n_released) return 0;
  int32_t *t = kv__table(ctl, slot);
  const int first = sl->n_released;
  kv__wbegin(sl);
  for (int i = end - 1; i >= first; i--) { /* last first, like kv_seq_free: a prefix's tail is evicted first */
    kv__block_unref(ctl, (uint32_t)t[i]);
    KV__ST(t[i], KV_HOLE);
  }
  kv__wend(sl);
  sl->n_released = end;
  return end - first;
}

int kv_seq_released(const kv_ctl_t *ctl, int slot) {
  if (slot < 0 || slot >= ctl->max_seqs || !ctl->slots[slot].in_use)
    return fr_errorf(-EINVAL, "kv: slot %d is not in use", slot);
  return ctl->slots[slot].n_released;
}

int kv_seq_free(kv_ctl_t *ctl, int slot) {
  int err = kv__slot_check(ctl, slot, "free");
  if (err) return err;
  kv__slot_t *sl = &ctl->slots[slot];
  kv__wbegin(sl);
  kv__drop_tail(ctl, sl, kv__table(ctl, slot), 0);
  KV__ST(sl->len, 0);
  KV__ST(sl->in_use, 0);
  kv__wend(sl);
  sl->n_committed = 0;
  sl->n_released = 0;
  sl->salt = 0;
  sl->next_free = ctl->hdr->slot_free;
  ctl->hdr->slot_free = (uint32_t)slot;
  ctl->hdr->n_slots_used--;
  return 0;
}

int kv_seq_len(const kv_ctl_t *ctl, int slot) {
  if (slot < 0 || slot >= ctl->max_seqs || !ctl->slots[slot].in_use)
    return fr_errorf(-EINVAL, "kv: slot %d is not in use", slot);
  return ctl->slots[slot].len;
}

uint32_t kv_seq_version(const kv_ctl_t *ctl, int slot) {
  if (slot < 0 || slot >= ctl->max_seqs) return 0;
  return __atomic_load_n(&ctl->slots[slot].seq, __ATOMIC_ACQUIRE) >> 1;
}

static inline void kv__cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/* One attempt; returns 1 when the snapshot is consistent. */
static int kv__read_once(const kv_ctl_t *ctl, int slot, int32_t *blocks, int cap, kv_seq_view_t *v, int *n_copied) {
  const kv__slot_t *sl = &ctl->slots[slot];
  uint32_t s1 = __atomic_load_n(&sl->seq, __ATOMIC_ACQUIRE);
  if (s1 & 1) return 0;
  int32_t len = KV__LD(sl->len), nb = KV__LD(sl->n_blocks);
  uint32_t in_use = KV__LD(sl->in_use);
  const int32_t *t = kv__table(ctl, slot);
  int m = nb < 0 ? 0 : FR_MIN(FR_MIN(nb, cap), ctl->max_bps);
  for (int i = 0; i < m; i++) blocks[i] = KV__LD(t[i]);
  __atomic_thread_fence(__ATOMIC_ACQUIRE);
  if (__atomic_load_n(&sl->seq, __ATOMIC_RELAXED) != s1) return 0;
  v->len = len;
  v->n_blocks = nb;
  v->version = s1 >> 1;
  v->in_use = in_use != 0;
  *n_copied = m;
  return 1;
}

int kv_seq_read(const kv_ctl_t *ctl, int slot, int32_t *blocks, int cap, kv_seq_view_t *view) {
  if (slot < 0 || slot >= ctl->max_seqs) return fr_errorf(-EINVAL, "kv: read: slot %d out of range", slot);
  if (cap < 0 || (cap > 0 && !blocks)) return fr_errorf(-EINVAL, "kv: read: bad buffer");
  int m = 0, ok = 0;
  for (long tries = 0; !ok && tries < 1000000; tries++) {
    ok = kv__read_once(ctl, slot, blocks, cap, view, &m);
    if (!ok && tries >= 64) sched_yield();
    else if (!ok) kv__cpu_relax();
  }
  if (!ok) return fr_errorf(FR_EBUSY, "kv: slot %d stays mid-update", slot);
  int bs = ctl->block_size;
  if (view->n_blocks < 0 || view->n_blocks > ctl->max_bps || view->len < 0 ||
      (int64_t)view->n_blocks != ((int64_t)view->len + bs - 1) / bs)
    return fr_errorf(FR_EFORMAT, "kv: slot %d: inconsistent length %d / %d blocks", slot, view->len, view->n_blocks);
  for (int i = 0; i < m; i++)
    if ((blocks[i] < 0 && blocks[i] != KV_HOLE) || blocks[i] >= ctl->n_blocks)
      return fr_errorf(FR_EFORMAT, "kv: slot %d entry %d = %d out of range", slot, i, blocks[i]);
  if (view->n_blocks > cap) return fr_errorf(FR_ETOOBIG, "kv: slot %d has %d blocks, buffer %d", slot, view->n_blocks, cap);
  return 0;
}
