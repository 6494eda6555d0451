/* tokenizer.c - the tokenizer object: building, lookups, special-token
 * splitting, encode/decode entry points and the streaming detokenizer.
 * Loaders live in tokenizer_gguf.c / tokenizer_json.c, encoders in
 * tok_bpe.c / tok_spm.c. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_hash.h"
#include "common/fr_log.h"
#include "common/fr_util.h"
#include "model/tok_internal.h"

#define TOK_MAX_VOCAB (1 << 22)
#define TOK_HASH_SEED 0x746f6b656e697a65ull

/* ---------- building ---------- */

int tok__create(model_tokenizer_t **out, int64_t n_vocab) {
  *out = NULL;
  if (n_vocab <= 0 || n_vocab > TOK_MAX_VOCAB)
    return fr_errorf(FR_EFORMAT, "tokenizer: vocabulary size %lld out of range (1..%d)", (long long)n_vocab,
                     TOK_MAX_VOCAB);
  model_tokenizer_t *t = fr_calloc(1, sizeof(*t));
  t->n_vocab = (int32_t)n_vocab;
  t->tok = fr_calloc((size_t)n_vocab, sizeof(*t->tok));
  t->arena_cap = 1 << 16;
  t->arena = fr_malloc(t->arena_cap);
  t->bos = t->eos = t->eot = t->eom = t->unk = t->pad = -1;
  t->pre = TOK_PRE_DEFAULT;
  snprintf(t->pre_name, sizeof(t->pre_name), "default");
  for (int i = 0; i < 256; i++) t->byte_tok[i] = -1;
  *out = t;
  return 0;
}

static uint32_t arena_put(model_tokenizer_t *t, const char *s, size_t len) {
  while (t->arena_len + len + 1 > t->arena_cap) {
    t->arena_cap *= 2;
    t->arena = fr_realloc(t->arena, t->arena_cap);
  }
  uint32_t off = (uint32_t)t->arena_len;
  if (len) memcpy(t->arena + off, s, len);
  t->arena[off + len] = '\0';
  t->arena_len += len + 1;
  return off;
}

int tok__set_token(model_tokenizer_t *t, int32_t id, const char *text, size_t len, float score, int type) {
  if (id < 0 || id >= t->n_vocab) return fr_errorf(FR_EFORMAT, "tokenizer: token id %d out of range", id);
  if (len > TOK_MAX_TOKEN_LEN) return fr_errorf(FR_ETOOBIG, "tokenizer: token %d is %zu bytes long", id, len);
  if (t->arena_len + len + 1 > UINT32_MAX / 4) return fr_errorf(FR_ETOOBIG, "tokenizer: vocabulary text too large");
  tok_entry_t *e = &t->tok[id];
  e->off = arena_put(t, text, len);
  e->len = (uint32_t)len;
  e->score = score;
  e->type = (uint8_t)(type >= 0 && type <= TOK_T_BYTE ? type : TOK_T_NORMAL);
  return 0;
}

/* ---------- text -> id map ---------- */

static size_t pow2_at_least(size_t n) {
  size_t c = 16;
  while (c < n) c <<= 1;
  return c;
}

int tok__index(model_tokenizer_t *t) {
  free(t->vmap);
  t->vmap_cap = pow2_at_least((size_t)t->n_vocab * 2);
  t->vmap = fr_malloc(t->vmap_cap * sizeof(int32_t));
  memset(t->vmap, 0xff, t->vmap_cap * sizeof(int32_t));
  size_t mask = t->vmap_cap - 1;
  for (int32_t id = 0; id < t->n_vocab; id++) {
    const tok_entry_t *e = &t->tok[id];
    if (e->len == 0) continue;
    size_t h = fr_hash64(t->arena + e->off, e->len, TOK_HASH_SEED) & mask;
    for (;; h = (h + 1) & mask) {
      int32_t o = t->vmap[h];
      if (o < 0) { t->vmap[h] = id; break; }
      if (t->tok[o].len == e->len && !memcmp(t->arena + t->tok[o].off, t->arena + e->off, e->len)) {
        t->vmap[h] = id; /* duplicate text: the last id wins, as in llama.cpp */
        break;
      }
    }
  }
  return 0;
}

int32_t tok__lookup(const model_tokenizer_t *t, const char *s, size_t len) {
  if (!t->vmap || len == 0) return -1;
  size_t mask = t->vmap_cap - 1;
  size_t h = fr_hash64(s, len, TOK_HASH_SEED) & mask;
  for (;; h = (h + 1) & mask) {
    int32_t id = t->vmap[h];
    if (id < 0) return -1;
    if (t->tok[id].len == len && !memcmp(t->arena + t->tok[id].off, s, len)) return id;
  }
}

/* ---------- merges ---------- */

static tok_merge_slot_t *merge_slot(tok_merge_slot_t *m, size_t cap, uint64_t key) {
  size_t mask = cap - 1;
  size_t h = fr_mix64(key) & mask;
  while (m[h].key != UINT64_MAX && m[h].key != key) h = (h + 1) & mask;
  return &m[h];
}

static void merge_grow(model_tokenizer_t *t) {
  size_t ncap = t->mmap_cap ? t->mmap_cap * 2 : 1024;
  tok_merge_slot_t *n = fr_malloc(ncap * sizeof(*n));
  for (size_t i = 0; i < ncap; i++) n[i].key = UINT64_MAX;
  for (size_t i = 0; i < t->mmap_cap; i++) {
    if (t->mmap[i].key != UINT64_MAX) *merge_slot(n, ncap, t->mmap[i].key) = t->mmap[i];
  }
  free(t->mmap);
  t->mmap = n;
  t->mmap_cap = ncap;
}

int tok__add_merge(model_tokenizer_t *t, const char *a, size_t alen, const char *b, size_t blen, int32_t rank) {
  if (!t->vmap) tok__index(t);
  int32_t ia = tok__lookup(t, a, alen), ib = tok__lookup(t, b, blen);
  if (ia < 0 || ib < 0 || alen + blen > 2 * TOK_MAX_TOKEN_LEN) return 1;
  char buf[2 * TOK_MAX_TOKEN_LEN];
  memcpy(buf, a, alen);
  memcpy(buf + alen, b, blen);
  int32_t iab = tok__lookup(t, buf, alen + blen);
  if (iab < 0) return 1;
  if ((t->n_merges + 1) * 2 > t->mmap_cap) merge_grow(t);
  uint64_t key = ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib;
  tok_merge_slot_t *s = merge_slot(t->mmap, t->mmap_cap, key);
  if (s->key == key) return 0; /* duplicate pair: the first rank wins */
  s->key = key;
  s->rank = rank;
  s->id = iab;
  t->n_merges++;
  return 0;
}

/* ---------- pre-tokenizer names ---------- */

static const struct {
  const char *name;
  tok_pre_t pre;
  const char *canon;
} k_pre_names[] = {
    {"llama3", TOK_PRE_LLAMA3, "llama3"},   {"llama-v3", TOK_PRE_LLAMA3, "llama3"},
    {"llama-bpe", TOK_PRE_LLAMA3, "llama3"}, {"falcon3", TOK_PRE_LLAMA3, "llama3"},
    {"qwen2", TOK_PRE_QWEN2, "qwen2"},      {"deepseek-r1-qwen", TOK_PRE_QWEN2, "qwen2"},
    {"megrez", TOK_PRE_QWEN2, "qwen2"},     {"smollm", TOK_PRE_SMOLLM, "smollm"},
    {"starcoder", TOK_PRE_SMOLLM, "smollm"}, {"refact", TOK_PRE_SMOLLM, "smollm"},
    {"gpt-2", TOK_PRE_GPT2, "gpt2"},        {"gpt2", TOK_PRE_GPT2, "gpt2"},
    {"phi-2", TOK_PRE_GPT2, "gpt2"},        {"default", TOK_PRE_DEFAULT, "default"},
};

int tok__set_pre(model_tokenizer_t *t, const char *name, size_t len) {
  for (size_t i = 0; i < FR_ARRAY_SIZE(k_pre_names); i++) {
    if (strlen(k_pre_names[i].name) == len && !memcmp(k_pre_names[i].name, name, len)) {
      t->pre = k_pre_names[i].pre;
      snprintf(t->pre_name, sizeof(t->pre_name), "%s", k_pre_names[i].canon);
      if (t->pre == TOK_PRE_LLAMA3) t->ignore_merges = true;
      return 0;
    }
  }
  FR_LOGW("tokenizer: unknown pre-tokenizer '%.*s', using the default regexes", (int)FR_MIN(len, 64), name);
  t->pre = TOK_PRE_DEFAULT;
  snprintf(t->pre_name, sizeof(t->pre_name), "default");
  return 0;
}

/* ---------- finishing ---------- */

/* The bytes a token decodes to (before UTF-8 cleanup). */
static void decode_entry(model_tokenizer_t *t, int32_t id, char *buf) {
  tok_entry_t *e = &t->tok[id];
  const unsigned char *s = (const unsigned char *)t->arena + e->off;
  size_t n = 0, len = e->len;
  bool plain = e->type == TOK_T_NORMAL || e->type == TOK_T_UNDEFINED || e->type == TOK_T_UNUSED;
  bool spm = t->kind == MODEL_TOK_SPM || t->spm_merges;
  if (e->type == TOK_T_BYTE && len == 6 && !memcmp(s, "<0x", 3) && s[5] == '>') {
    buf[n++] = (char)strtol((const char *)s + 3, NULL, 16);
  } else if (plain && t->byte_level) {
    for (size_t i = 0; i < len;) {
      int l = tok__utf8_len(s + i, len - i);
      int b = l ? tok__cp_to_byte(tok__utf8_cp(s + i, l)) : -1;
      if (l == 0) l = 1;
      if (b >= 0) buf[n++] = (char)b;
      else for (int k = 0; k < l; k++) buf[n++] = (char)s[i + k];
      i += (size_t)l;
    }
  } else if (plain && t->kind == MODEL_TOK_WPM) { /* words joined by spaces, continuations glued */
    size_t pl = strlen(t->wpm_prefix);
    if (t->wpm_phantom && len >= 3 && !memcmp(s, "\xE2\x96\x81", 3)) buf[n++] = ' ', s += 3, len -= 3;
    else if (!t->wpm_phantom && !(pl && len >= pl && !memcmp(s, t->wpm_prefix, pl))) buf[n++] = ' ';
    else if (!t->wpm_phantom) s += pl, len -= pl;
    memcpy(buf + n, s, len);
    n += len;
  } else if (plain && spm) {
    for (size_t i = 0; i < len;) {
      if (i + 3 <= len && s[i] == 0xE2 && s[i + 1] == 0x96 && s[i + 2] == 0x81) {
        buf[n++] = ' ';
        i += 3;
      } else {
        buf[n++] = (char)s[i++];
      }
    }
  } else {
    memcpy(buf, s, len);
    n = len;
  }
  uint32_t off = arena_put(t, buf, n);
  t->tok[id].doff = off;
  t->tok[id].dlen = (uint32_t)n;
}

static int cmp_special(const void *a, const void *b, void *arg) {
  const model_tokenizer_t *t = arg;
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  if (t->tok[x].len != t->tok[y].len) return t->tok[x].len > t->tok[y].len ? -1 : 1;
  return x < y ? -1 : x > y;
}

static void build_specials(model_tokenizer_t *t) {
  t->special = fr_malloc((size_t)t->n_vocab * sizeof(int32_t));
  t->n_special = 0;
  for (int32_t id = 0; id < t->n_vocab; id++) {
    int ty = t->tok[id].type;
    if ((ty == TOK_T_CONTROL || ty == TOK_T_USER || ty == TOK_T_UNKNOWN) && t->tok[id].len > 0)
      t->special[t->n_special++] = id;
  }
  qsort_r(t->special, t->n_special, sizeof(int32_t), cmp_special, t);
}

static void build_eog(model_tokenizer_t *t) {
  static const char *const k_eog[] = {"<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<|end_of_text|>", "</s>",
                                      "<|end|>",    "<end_of_turn>", "<|return|>", "<|eom_id|>"};
  t->eog = fr_calloc((size_t)t->n_vocab, 1);
  if (t->eos >= 0) t->eog[t->eos] = 1;
  if (t->eot >= 0) t->eog[t->eot] = 1;
  if (t->eom >= 0) t->eog[t->eom] = 1;
  for (size_t i = 0; i < FR_ARRAY_SIZE(k_eog); i++) { /* by text, whatever their type (llama.cpp) */
    int32_t id = tok__lookup(t, k_eog[i], strlen(k_eog[i]));
    if (id >= 0) t->eog[id] = 1;
  }
}

static void build_byte_tokens(model_tokenizer_t *t) {
  for (int b = 0; b < 256; b++) {
    char buf[8];
    int32_t id = -1;
    if (t->byte_level) {
      int l = tok__utf8_put(tok__byte_to_cp((uint8_t)b), buf);
      id = tok__lookup(t, buf, (size_t)l);
    } else {
      snprintf(buf, sizeof(buf), "<0x%02X>", b);
      id = tok__lookup(t, buf, 6);
      if (id < 0 && b < 0x80) {
        buf[0] = (char)b;
        id = tok__lookup(t, buf, 1);
      }
    }
    t->byte_tok[b] = id;
  }
}

static int32_t valid_id(const model_tokenizer_t *t, int32_t id) { return id >= 0 && id < t->n_vocab ? id : -1; }

int tok__finish(model_tokenizer_t *t) {
  tok__index(t);
  t->bos = valid_id(t, t->bos), t->eos = valid_id(t, t->eos), t->eot = valid_id(t, t->eot);
  t->eom = valid_id(t, t->eom), t->unk = valid_id(t, t->unk), t->pad = valid_id(t, t->pad);
  char *buf = fr_malloc(TOK_MAX_TOKEN_LEN + 1);
  for (int32_t id = 0; id < t->n_vocab; id++) decode_entry(t, id, buf);
  free(buf);
  build_byte_tokens(t);
  build_specials(t);
  build_eog(t);
  return tok__compile_pre(t);
}

void model_tokenizer_destroy(model_tokenizer_t *t) {
  if (!t) return;
  for (int i = 0; i < t->n_re; i++) pcre2_code_free(t->re[i]);
  free(t->tok);
  free(t->arena);
  free(t->vmap);
  free(t->mmap);
  free(t->special);
  free(t->eog);
  free(t->chat_template);
  free(t);
}

/* ---------- special-token partition ---------- */

typedef struct {
  int32_t id; /* -1: raw text */
  size_t off, len;
} tok_frag_t;

typedef struct {
  tok_frag_t *v;
  size_t n, cap;
} frag_vec_t;

static void frag_push(frag_vec_t *f, int32_t id, size_t off, size_t len) {
  if (f->n == f->cap) {
    f->cap = f->cap ? f->cap * 2 : 16;
    f->v = fr_realloc(f->v, f->cap * sizeof(*f->v));
  }
  f->v[f->n++] = (tok_frag_t){id, off, len};
}

/* Splits every raw fragment of `in` on occurrences of special token id. */
static void split_on(const model_tokenizer_t *t, const char *text, const frag_vec_t *in, int32_t id, frag_vec_t *out) {
  const char *st = tok__text(t, id);
  size_t sl = t->tok[id].len;
  out->n = 0;
  for (size_t i = 0; i < in->n; i++) {
    tok_frag_t f = in->v[i];
    if (f.id >= 0) { frag_push(out, f.id, f.off, f.len); continue; }
    size_t pos = f.off, end = f.off + f.len;
    for (;;) {
      const char *hit = memmem(text + pos, end - pos, st, sl);
      if (!hit) break;
      size_t h = (size_t)(hit - text);
      if (h > pos) frag_push(out, -1, pos, h - pos);
      frag_push(out, id, h, sl);
      pos = h + sl;
    }
    if (end > pos) frag_push(out, -1, pos, end - pos);
  }
}

/* llama.cpp's tokenizer_st_partition: special tokens longest first; with
 * parse_special false only USER_DEFINED tokens are matched. */
static void partition(const model_tokenizer_t *t, const char *text, size_t len, bool parse_special, frag_vec_t *a) {
  frag_vec_t b = {0};
  a->n = 0;
  if (len == 0) return;
  frag_push(a, -1, 0, len);
  for (size_t k = 0; k < t->n_special; k++) {
    int32_t id = t->special[k];
    int ty = t->tok[id].type;
    if (!parse_special && ty != TOK_T_USER) continue;
    if (!memmem(text, len, tok__text(t, id), t->tok[id].len)) continue;
    split_on(t, text, a, id, &b);
    frag_vec_t tmp = *a;
    *a = b;
    b = tmp;
  }
  free(b.v);
}

/* ---------- public API ---------- */

void tok__ids_push(tok_ids_t *ids, int32_t id) {
  if (ids->n == ids->cap) {
    ids->cap = ids->cap ? ids->cap * 2 : 64;
    ids->v = fr_realloc(ids->v, ids->cap * sizeof(int32_t));
  }
  ids->v[ids->n++] = id;
}

int model_tokenize(const model_tokenizer_t *t, const char *text, size_t len, bool add_special, bool parse_special,
                   int32_t **out, size_t *n_out) {
  tok_ids_t ids = {0};
  frag_vec_t frags = {0};
  int rc = 0;
  *out = NULL;
  *n_out = 0;
  if (!text && len) return fr_errorf(-EINVAL, "tokenize: NULL text");
  if (add_special && t->add_bos && t->bos >= 0) tok__ids_push(&ids, t->bos);
  partition(t, text, len, parse_special, &frags);
  bool prev_special = true;
  for (size_t i = 0; i < frags.n && rc == 0; i++) {
    const tok_frag_t *f = &frags.v[i];
    if (f->id >= 0) {
      tok__ids_push(&ids, f->id);
      prev_special = true;
      continue;
    }
    if (t->kind == MODEL_TOK_WPM)
      rc = tok__wpm_fragment(t, text + f->off, f->len, &ids);
    else if (t->kind == MODEL_TOK_SPM && !t->spm_merges)
      rc = tok__spm_fragment(t, text + f->off, f->len, prev_special, f->off == 0, &ids);
    else
      rc = tok__bpe_fragment(t, text + f->off, f->len, prev_special, f->off == 0, &ids);
    prev_special = false;
  }
  free(frags.v);
  if (rc) {
    free(ids.v);
    return rc;
  }
  if (add_special && t->add_eos && t->eos >= 0) tok__ids_push(&ids, t->eos);
  if (!ids.v) ids.v = fr_malloc(sizeof(int32_t));
  *out = ids.v;
  *n_out = ids.n;
  return 0;
}

const char *model_token_bytes(const model_tokenizer_t *t, int32_t id, size_t *len) {
  if (id < 0 || id >= t->n_vocab) {
    if (len) *len = 0;
    return NULL;
  }
  if (len) *len = t->tok[id].dlen;
  return t->arena + t->tok[id].doff;
}

static bool skip_token(const model_tokenizer_t *t, int32_t id) {
  int ty = t->tok[id].type;
  return ty == TOK_T_CONTROL || ty == TOK_T_UNKNOWN || ty == TOK_T_UNUSED;
}

static bool strips_space(const model_tokenizer_t *t) {
  return ((t->kind == MODEL_TOK_SPM || t->spm_merges) && t->add_space_prefix) || t->kind == MODEL_TOK_WPM;
}

char *model_detokenize(const model_tokenizer_t *t, const int32_t *ids, size_t n, bool skip_special) {
  size_t total = 0;
  for (size_t i = 0; i < n; i++)
    if (ids[i] >= 0 && ids[i] < t->n_vocab) total += t->tok[ids[i]].dlen;
  char *raw = fr_malloc(total + 1);
  size_t o = 0;
  bool strip = strips_space(t);
  for (size_t i = 0; i < n; i++) {
    int32_t id = ids[i];
    if (id < 0 || id >= t->n_vocab || (skip_special && skip_token(t, id))) continue;
    const char *p = t->arena + t->tok[id].doff;
    size_t l = t->tok[id].dlen;
    if (strip && l > 0 && p[0] == ' ') p++, l--;
    strip = false;
    memcpy(raw + o, p, l);
    o += l;
  }
  size_t cap;
  if (fr_mul_size(o, 3, &cap) || fr_add_size(cap, 1, &cap)) FR_ASSERT(!"detokenize size overflow");
  char *s = fr_malloc(cap);
  size_t m = tok__utf8_lossy((const unsigned char *)raw, o, s);
  s[m] = '\0';
  free(raw);
  return s;
}

int model_vocab_size(const model_tokenizer_t *t) { return t->n_vocab; }
model_tok_kind_t model_tokenizer_kind(const model_tokenizer_t *t) { return t->kind; }
const char *model_tokenizer_pre(const model_tokenizer_t *t) { return t->pre_name; }
int32_t model_token_bos(const model_tokenizer_t *t) { return t->bos; }
int32_t model_token_eos(const model_tokenizer_t *t) { return t->eos; }
bool model_tokenizer_adds_bos(const model_tokenizer_t *t) { return t->add_bos && t->bos >= 0; }
bool model_token_is_eog(const model_tokenizer_t *t, int32_t id) {
  return id >= 0 && id < t->n_vocab && t->eog[id];
}
bool model_token_is_control(const model_tokenizer_t *t, int32_t id) {
  return id >= 0 && id < t->n_vocab && t->tok[id].type == TOK_T_CONTROL;
}
int32_t model_token_lookup(const model_tokenizer_t *t, const char *text, size_t len) {
  return tok__lookup(t, text, len);
}
const char *model_tokenizer_chat_template(const model_tokenizer_t *t) { return t->chat_template; }

void model_tokenizer_set_chat_template(model_tokenizer_t *t, const char *text) {
  free(t->chat_template);
  t->chat_template = text ? fr_strdup(text) : NULL;
}

/* ---------- streaming detokenizer ---------- */

void model_detok_init(model_detok_t *d, const model_tokenizer_t *t, bool skip_special) {
  memset(d, 0, sizeof(*d));
  d->tok = t;
  d->skip_special = skip_special;
  d->strip_space = strips_space(t);
}

/* Runs bytes through the pending UTF-8 state; writes to out when non-NULL.
 * Complete characters go out, invalid sequences become U+FFFD, a valid but
 * incomplete tail stays pending. Returns the number of output bytes. */
static size_t detok_run(char *pending, int *n_pending, const unsigned char *p, size_t n, char *out) {
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    if (*n_pending == 0 && p[i] < 0x80) { /* fast path: ASCII */
      if (out) out[o] = (char)p[i];
      o++;
      continue;
    }
    pending[(*n_pending)++] = (char)p[i];
    while (*n_pending > 0) {
      int full, l = tok__utf8_prefix((const unsigned char *)pending, (size_t)*n_pending, &full);
      if (full == 2) break; /* wait for more bytes */
      if (full == 1) {
        if (out) memcpy(out + o, pending, (size_t)l);
        o += (size_t)l;
      } else {
        if (out) tok__utf8_put(0xFFFD, out + o);
        o += 3;
      }
      memmove(pending, pending + l, (size_t)(*n_pending - l));
      *n_pending -= l;
    }
  }
  return o;
}

int model_detok_feed(model_detok_t *d, int32_t id, char *out, size_t cap) {
  const model_tokenizer_t *t = d->tok;
  if (!out || cap == 0) return fr_errorf(-EINVAL, "detok: no output buffer");
  out[0] = '\0';
  if (id < 0 || id >= t->n_vocab) return fr_errorf(-EINVAL, "detok: token id %d out of range", id);
  if (d->skip_special && skip_token(t, id)) return 0;
  const unsigned char *p = (const unsigned char *)t->arena + t->tok[id].doff;
  size_t n = t->tok[id].dlen;
  bool strip = d->strip_space && n > 0 && p[0] == ' ';
  if (strip) p++, n--;
  char pend[8];
  int np = d->n_pending;
  memcpy(pend, d->pending, sizeof(pend));
  size_t need = detok_run(pend, &np, p, n, NULL);
  if (need + 1 > cap) return fr_errorf(FR_ETOOBIG, "detok: output needs %zu bytes, have %zu", need + 1, cap);
  size_t w = detok_run(d->pending, &d->n_pending, p, n, out);
  out[w] = '\0';
  d->strip_space = false;
  return (int)w;
}

int model_detok_flush(model_detok_t *d, char *out, size_t cap) {
  if (!out || cap == 0) return fr_errorf(-EINVAL, "detok: no output buffer");
  size_t need = d->n_pending ? 3 : 0;
  if (need + 1 > cap) return fr_errorf(FR_ETOOBIG, "detok: output needs %zu bytes, have %zu", need + 1, cap);
  if (need) tok__utf8_put(0xFFFD, out);
  out[need] = '\0';
  d->n_pending = 0;
  return (int)need;
}
