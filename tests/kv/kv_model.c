/* kv_model.c - reference model of kv/ and the randomized comparison. */
#include "tests/kv/kv_model.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "kv/kv_impl.h"

typedef struct {
  int in_use, len, nb, n_committed;
  uint64_t salt;
  int32_t *tab;  /* (max_bps) */
  int32_t *toks; /* (max_bps * block_size) the sequence's tokens */
} kvm_slot_t;

typedef struct {
  int nb, bs, max_seqs, max_bps, prefix;
  int *ref, *hashed, *indexed;
  int32_t **key; /* per block: salt (2 words) + the prefix's tokens */
  int *key_len;
  int *queue, qn; /* free queue, [0] = head */
  kvm_slot_t *slots;
  int *sstack, ssn; /* free slots, top = last */
} kvm_t;

/* Check's ck_assert_* report every passing assertion to the parent in fork
 * mode; these only call Check on failure, so that millions are cheap. */
#define KVM_EQ(a, b)                                                                    \
  do {                                                                                  \
    long long kvm_a_ = (long long)(a), kvm_b_ = (long long)(b);                         \
    if (kvm_a_ != kvm_b_) ck_abort_msg("%s:%d: %s == %lld, %s == %lld", __FILE__, __LINE__, #a, kvm_a_, #b, kvm_b_); \
  } while (0)
#define KVM_TRUE(x, ...)                 \
  do {                                   \
    if (!(x)) ck_abort_msg(__VA_ARGS__); \
  } while (0)

static uint64_t kvm_rng(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static int kvm_rand(uint64_t *s, int n) { return n <= 0 ? 0 : (int)(kvm_rng(s) % (uint64_t)n); }

static void kvm_init(kvm_t *m, const kvm_params_t *p) {
  memset(m, 0, sizeof *m);
  m->nb = p->n_blocks;
  m->bs = p->block_size;
  m->max_seqs = p->max_seqs;
  m->max_bps = p->max_bps;
  m->prefix = p->prefix_cache;
  m->ref = calloc(m->nb, sizeof(int));
  m->hashed = calloc(m->nb, sizeof(int));
  m->indexed = calloc(m->nb, sizeof(int));
  m->key = calloc(m->nb, sizeof(int32_t *));
  m->key_len = calloc(m->nb, sizeof(int));
  m->queue = calloc(m->nb, sizeof(int));
  for (int b = 0; b < m->nb; b++) m->queue[m->qn++] = b;
  m->slots = calloc(m->max_seqs, sizeof(kvm_slot_t));
  m->sstack = calloc(m->max_seqs, sizeof(int));
  for (int s = m->max_seqs - 1; s >= 0; s--) m->sstack[m->ssn++] = s;
  for (int s = 0; s < m->max_seqs; s++) {
    m->slots[s].tab = calloc(m->max_bps, sizeof(int32_t));
    m->slots[s].toks = calloc((size_t)m->max_bps * m->bs, sizeof(int32_t));
  }
}

static void kvm_deinit(kvm_t *m) {
  for (int b = 0; b < m->nb; b++) free(m->key[b]);
  for (int s = 0; s < m->max_seqs; s++) {
    free(m->slots[s].tab);
    free(m->slots[s].toks);
  }
  free(m->ref), free(m->hashed), free(m->indexed), free(m->key), free(m->key_len);
  free(m->queue), free(m->slots), free(m->sstack);
}

/* ---- model operations --------------------------------------------------- */

static int32_t *kvm_make_key(const kvm_t *m, uint64_t salt, const int32_t *toks, int n_blk, int *len) {
  *len = 2 + n_blk * m->bs;
  int32_t *k = malloc(sizeof(int32_t) * *len);
  k[0] = (int32_t)(uint32_t)salt;
  k[1] = (int32_t)(uint32_t)(salt >> 32);
  memcpy(k + 2, toks, sizeof(int32_t) * n_blk * m->bs);
  return k;
}

static int kvm_find(const kvm_t *m, const int32_t *key, int len) {
  int found = -1;
  for (int b = 0; b < m->nb; b++)
    if (m->indexed[b] && m->key_len[b] == len && memcmp(m->key[b], key, sizeof(int32_t) * len) == 0) {
      KVM_TRUE(found < 0, "model: two cached blocks with one key");
      found = b;
    }
  return found;
}

static void kvm_uncache(kvm_t *m, int b) {
  free(m->key[b]);
  m->key[b] = NULL;
  m->key_len[b] = 0;
  m->hashed[b] = m->indexed[b] = 0;
}

static void kvm_q_remove(kvm_t *m, int b) {
  for (int i = 0; i < m->qn; i++)
    if (m->queue[i] == b) {
      memmove(m->queue + i, m->queue + i + 1, sizeof(int) * (m->qn - i - 1));
      m->qn--;
      return;
    }
  ck_abort_msg("model: block %d not in the queue", b);
}

static int kvm_block_alloc(kvm_t *m) {
  KVM_TRUE(m->qn > 0, "model: no free block");
  int b = m->queue[0];
  kvm_q_remove(m, b);
  kvm_uncache(m, b);
  m->ref[b] = 1;
  return b;
}

static void kvm_block_ref(kvm_t *m, int b) {
  if (m->ref[b]++ == 0) kvm_q_remove(m, b);
}

static void kvm_block_unref(kvm_t *m, int b) {
  KVM_TRUE(m->ref[b] > 0, "model: unref of a free block");
  if (--m->ref[b] > 0) return;
  if (m->indexed[b]) {
    m->queue[m->qn++] = b;
  } else {
    kvm_uncache(m, b);
    memmove(m->queue + 1, m->queue, sizeof(int) * m->qn);
    m->queue[0] = b;
    m->qn++;
  }
}

static int kvm_lookup(const kvm_t *m, const int32_t *toks, int n, uint64_t salt, int32_t *ids) {
  if (!m->prefix) return 0;
  int i;
  for (i = 0; i < n / m->bs; i++) {
    int len;
    int32_t *k = kvm_make_key(m, salt, toks, i + 1, &len);
    int b = kvm_find(m, k, len);
    free(k);
    if (b < 0) break;
    ids[i] = b;
  }
  return i;
}

static int kvm_alloc_slot(kvm_t *m, uint64_t salt) {
  if (m->ssn == 0) return -1;
  int s = m->sstack[--m->ssn];
  kvm_slot_t *sl = &m->slots[s];
  sl->in_use = 1;
  sl->len = sl->nb = sl->n_committed = 0;
  sl->salt = salt;
  return s;
}

static int kvm_attach_prefix(kvm_t *m, int s, int n) {
  kvm_slot_t *sl = &m->slots[s];
  int32_t *ids = calloc(m->max_bps + 1, sizeof(int32_t));
  int lim = n;
  if (lim / m->bs > m->max_bps) lim = m->max_bps * m->bs;
  int got = kvm_lookup(m, sl->toks, lim, sl->salt, ids);
  for (int i = 0; i < got; i++) {
    kvm_block_ref(m, ids[i]);
    sl->tab[i] = ids[i];
  }
  free(ids);
  sl->nb = sl->n_committed = got;
  sl->len = got * m->bs;
  return sl->len;
}

/* 0, or 1 busy, 2 context; *src and *dst a copy or -1. */
static int kvm_append(kvm_t *m, int s, int n, int *src, int *dst) {
  kvm_slot_t *sl = &m->slots[s];
  *src = *dst = -1;
  int new_len = sl->len + n, new_nb = (new_len + m->bs - 1) / m->bs;
  if (new_nb > m->max_bps) return 2;
  int partial = n > 0 && sl->len % m->bs != 0;
  int cow = partial && m->ref[sl->tab[sl->nb - 1]] > 1;
  if (new_nb - sl->nb + cow > m->qn) return 1;
  if (partial) {
    int last = sl->tab[sl->nb - 1];
    if (cow) {
      int nb = kvm_block_alloc(m);
      kvm_block_unref(m, last);
      sl->tab[sl->nb - 1] = nb;
      *src = last;
      *dst = nb;
    } else if (m->hashed[last]) {
      kvm_uncache(m, last);
    }
  }
  for (int i = sl->nb; i < new_nb; i++) sl->tab[i] = kvm_block_alloc(m);
  sl->nb = new_nb;
  sl->len = new_len;
  return 0;
}

static int kvm_fork(kvm_t *m, int p) {
  int c = kvm_alloc_slot(m, m->slots[p].salt);
  if (c < 0) return -1;
  kvm_slot_t *ps = &m->slots[p], *cs = &m->slots[c];
  for (int i = 0; i < ps->nb; i++) {
    kvm_block_ref(m, ps->tab[i]);
    cs->tab[i] = ps->tab[i];
  }
  cs->nb = ps->nb;
  cs->len = ps->len;
  cs->n_committed = ps->n_committed;
  memcpy(cs->toks, ps->toks, sizeof(int32_t) * m->max_bps * m->bs);
  return c;
}

static void kvm_truncate(kvm_t *m, int s, int new_len) {
  kvm_slot_t *sl = &m->slots[s];
  int keep = (new_len + m->bs - 1) / m->bs;
  for (int i = sl->nb - 1; i >= keep; i--) kvm_block_unref(m, sl->tab[i]);
  sl->nb = keep;
  sl->len = new_len;
  if (sl->n_committed > new_len / m->bs) sl->n_committed = new_len / m->bs;
}

static void kvm_free(kvm_t *m, int s) {
  kvm_truncate(m, s, 0);
  m->slots[s].in_use = 0;
  m->sstack[m->ssn++] = s;
}

static void kvm_commit(kvm_t *m, int s, int n) {
  kvm_slot_t *sl = &m->slots[s];
  if (!m->prefix) return;
  int lim = (n < sl->len ? n : sl->len) / m->bs;
  for (int i = sl->n_committed; i < lim; i++) {
    int len, b = sl->tab[i];
    int32_t *k = kvm_make_key(m, sl->salt, sl->toks, i + 1, &len);
    if (m->hashed[b]) {
      KVM_TRUE(m->key_len[b] == len && memcmp(m->key[b], k, sizeof(int32_t) * len) == 0,
                    "model: shared block %d with other tokens", b);
      free(k);
    } else {
      int other = kvm_find(m, k, len);
      m->hashed[b] = 1;
      m->key[b] = k;
      m->key_len[b] = len;
      m->indexed[b] = other < 0;
    }
    sl->n_committed = i + 1;
  }
}

/* ---- comparison --------------------------------------------------------- */

static void kvm_compare(const kvm_t *m, const kv_ctl_t *ctl) {
  int err = kv_control_verify(ctl);
  KVM_TRUE(err == 0, "verify: %s", fr_last_error());
  KVM_EQ(kv_blocks_free_count(ctl), m->qn);
  /* Free queue order, head first. */
  uint32_t sent = (uint32_t)ctl->n_blocks, b = ctl->blocks[sent].next;
  for (int i = 0; i < m->qn; i++, b = ctl->blocks[b].next) KVM_EQ((int)b, m->queue[i]);
  KVM_EQ(b, sent);
  int *count = calloc(m->nb, sizeof(int));
  int32_t *row = calloc(m->max_bps, sizeof(int32_t));
  for (int s = 0; s < m->max_seqs; s++) {
    kv_seq_view_t v;
    KVM_EQ(kv_seq_read(ctl, s, row, m->max_bps, &v), 0);
    KVM_EQ(v.in_use, m->slots[s].in_use);
    if (!v.in_use) continue;
    KVM_EQ(v.len, m->slots[s].len);
    KVM_EQ(v.n_blocks, m->slots[s].nb);
    for (int i = 0; i < v.n_blocks; i++) {
      KVM_EQ(row[i], m->slots[s].tab[i]);
      count[row[i]]++;
    }
  }
  int used = 0;
  for (int k = 0; k < m->nb; k++) {
    /* No block is held without being counted: ref = table entries. */
    KVM_EQ(kv_block_ref(ctl, k), count[k]);
    KVM_EQ(m->ref[k], count[k]);
    KVM_EQ(kv_block_cached(ctl, k), m->indexed[k]);
    used += count[k] > 0;
  }
  KVM_EQ(used + kv_blocks_free_count(ctl), m->nb); /* used + free = total */
  free(count);
  free(row);
}

/* ---- random driver ------------------------------------------------------ */

typedef struct {
  kvm_t m;
  kv_ctl_t *ctl;
  uint64_t rng;
  int32_t *tmpl[3]; /* prompt templates: shared prefixes come from these */
  int ctx;          /* max tokens per sequence */
  long hits;
} kvm_run_t;

static int32_t kvm_token(kvm_run_t *r, int s, int pos) {
  if (kvm_rand(&r->rng, 4)) return r->tmpl[s % 3][pos];
  return kvm_rand(&r->rng, 3);
}

static void kvm_op_new(kvm_run_t *r) {
  kvm_t *m = &r->m;
  uint64_t salt = (uint64_t)kvm_rand(&r->rng, 2) << 33;
  int ks, ms = kvm_alloc_slot(m, salt);
  int err = kv_seq_alloc_slot(r->ctl, salt, &ks);
  if (ms < 0) {
    KVM_EQ(err, FR_EBUSY);
    return;
  }
  KVM_EQ(err, 0);
  KVM_EQ(ks, ms);
  int n = 1 + kvm_rand(&r->rng, r->ctx / 2), t = kvm_rand(&r->rng, 3);
  memcpy(m->slots[ms].toks, r->tmpl[t], sizeof(int32_t) * r->ctx);
  if (kvm_rand(&r->rng, 3) == 0) m->slots[ms].toks[kvm_rand(&r->rng, n)] = 7 + kvm_rand(&r->rng, 3);
  int cached = 0, mc = kvm_attach_prefix(m, ms, n - 1);
  KVM_EQ(kv_seq_attach_prefix(r->ctl, ks, m->slots[ms].toks, n - 1, &cached), 0);
  KVM_EQ(cached, mc);
  r->hits += cached / m->bs;
  int src, dst;
  kv_copy_t cp;
  int mr = kvm_append(m, ms, n - cached, &src, &dst);
  err = kv_seq_append(r->ctl, ks, n - cached, &cp);
  KVM_EQ(err, mr == 0 ? 0 : mr == 1 ? FR_EBUSY : FR_ECONTEXT);
  if (err) { /* not admitted: give everything back */
    kvm_free(m, ms);
    KVM_EQ(kv_seq_free(r->ctl, ks), 0);
  }
}

static int kvm_pick(kvm_run_t *r) {
  int s = kvm_rand(&r->rng, r->m.max_seqs);
  for (int i = 0; i < r->m.max_seqs; i++, s = (s + 1) % r->m.max_seqs)
    if (r->m.slots[s].in_use) return s;
  return -1;
}

static void kvm_op_append(kvm_run_t *r, int s) {
  kvm_t *m = &r->m;
  int n = kvm_rand(&r->rng, 2 * m->bs), src, dst;
  for (int i = 0; i < n && m->slots[s].len + i < r->ctx; i++)
    m->slots[s].toks[m->slots[s].len + i] = kvm_token(r, s, m->slots[s].len + i);
  kv_copy_t cp;
  int mr = kvm_append(m, s, n, &src, &dst);
  int err = kv_seq_append(r->ctl, s, n, &cp);
  KVM_EQ(err, mr == 0 ? 0 : mr == 1 ? FR_EBUSY : FR_ECONTEXT);
  KVM_EQ(cp.src, src);
  KVM_EQ(cp.dst, dst);
}

static void kvm_op_lookup(kvm_run_t *r) {
  kvm_t *m = &r->m;
  int32_t *toks = malloc(sizeof(int32_t) * r->ctx), *ids = calloc(m->max_bps, sizeof(int32_t)),
          *kids = calloc(m->max_bps, sizeof(int32_t));
  int s = kvm_pick(r);
  memcpy(toks, s >= 0 && kvm_rand(&r->rng, 2) ? m->slots[s].toks : r->tmpl[kvm_rand(&r->rng, 3)],
         sizeof(int32_t) * r->ctx);
  uint64_t salt = (uint64_t)kvm_rand(&r->rng, 2) << 33;
  int n = kvm_rand(&r->rng, r->ctx + 1), got = 0, nfree = 0;
  int want = kvm_lookup(m, toks, n, salt, ids);
  KVM_EQ(kv_prefix_lookup(r->ctl, toks, n, salt, &got, kids, m->max_bps, &nfree), 0);
  KVM_EQ(got, want);
  for (int i = 0; i < got; i++) KVM_EQ(kids[i], ids[i]);
  free(toks), free(ids), free(kids);
}

static void kvm_step(kvm_run_t *r) {
  kvm_t *m = &r->m;
  int op = kvm_rand(&r->rng, 100), s = kvm_pick(r);
  if (s < 0 || op < 15) {
    kvm_op_new(r);
  } else if (op < 45) {
    kvm_op_append(r, s);
  } else if (op < 60) {
    int n = m->slots[s].len - kvm_rand(&r->rng, m->bs);
    kvm_commit(m, s, n);
    KVM_EQ(kv_prefix_commit(r->ctl, s, m->slots[s].toks, n < 0 ? 0 : n), 0);
  } else if (op < 68) {
    int c, mc = kvm_fork(m, s);
    int err = kv_seq_fork(r->ctl, s, &c);
    KVM_EQ(err, mc < 0 ? FR_EBUSY : 0);
    if (mc >= 0) KVM_EQ(c, mc);
  } else if (op < 78) {
    int nl = m->slots[s].len - kvm_rand(&r->rng, 2 * m->bs + 1);
    nl = nl < 0 ? 0 : nl;
    kvm_truncate(m, s, nl);
    KVM_EQ(kv_seq_truncate(r->ctl, s, nl), 0);
  } else if (op < 88) {
    kvm_free(m, s);
    KVM_EQ(kv_seq_free(r->ctl, s), 0);
  } else {
    kvm_op_lookup(r);
  }
}

long kvm_random_run(const kvm_params_t *p) {
  kvm_run_t r = {.rng = p->seed};
  kvm_init(&r.m, p);
  kv_config_t cfg = {.instance = p->instance, .n_blocks = p->n_blocks, .block_size = p->block_size,
                     .max_seqs = p->max_seqs, .max_blocks_per_seq = p->max_bps,
                     .enable_prefix_cache = p->prefix_cache};
  int err = kv_control_create(&r.ctl, &cfg);
  KVM_TRUE(err == 0, "create: %s", fr_last_error());
  r.ctx = p->max_bps * p->block_size;
  for (int t = 0; t < 3; t++) {
    r.tmpl[t] = malloc(sizeof(int32_t) * r.ctx);
    for (int i = 0; i < r.ctx; i++) r.tmpl[t][i] = (i < 2 * p->block_size) ? i % 5 : kvm_rand(&r.rng, 3) + 3 * t;
  }
  for (int i = 0; i < p->steps; i++) {
    kvm_step(&r);
    kvm_compare(&r.m, r.ctl);
  }
  for (int t = 0; t < 3; t++) free(r.tmpl[t]);
  kv_control_destroy(r.ctl);
  kvm_deinit(&r.m);
  return r.hits;
}
