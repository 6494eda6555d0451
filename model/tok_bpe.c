/* tok_bpe.c - pre-tokenizer regexes (PCRE2) and the BPE merge loop.
 *
 * A raw-text fragment is split by each regex of the pre-tokenizer in turn
 * (matches and the gaps between them both become pieces, as HF's "Isolated"
 * split and llama.cpp's unicode_regex_split do), each piece is byte-level
 * mapped (GPT-2) and merged: the adjacent pair of lowest merge rank first,
 * leftmost on ties. */
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_hash.h"
#include "common/fr_util.h"
#include "model/tok_internal.h"

/* ---------- regexes ---------- */

#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define RE_LLAMA3_HEAD                                                                                      \
  "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
#define RE_LLAMA3_TAIL " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_LLAMA3 RE_LLAMA3_HEAD "\\p{N}{1,3}|" RE_LLAMA3_TAIL
#define RE_QWEN2 RE_LLAMA3_HEAD "\\p{N}|" RE_LLAMA3_TAIL

int tok__compile_one(model_tokenizer_t *t, const char *pattern) {
  if (t->n_re >= TOK_MAX_RE) return fr_errorf(FR_EUNSUPPORTED, "tokenizer: too many pre-tokenizer regexes");
  int err;
  PCRE2_SIZE erroff;
  uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF;
  pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, opts, &err, &erroff, NULL);
  if (!re) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    return fr_errorf(FR_EFORMAT, "tokenizer: regex error at %zu: %s", (size_t)erroff, (const char *)msg);
  }
  (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* optional: falls back to the interpreter */
  t->re[t->n_re++] = re;
  return 0;
}

int tok__compile_pre(model_tokenizer_t *t) {
  if (t->n_re > 0) return 0; /* set by the loader (tokenizer.json) */
  switch (t->pre) {
  case TOK_PRE_GPT2: return tok__compile_one(t, RE_GPT2);
  case TOK_PRE_LLAMA3: return tok__compile_one(t, RE_LLAMA3);
  case TOK_PRE_QWEN2: return tok__compile_one(t, RE_QWEN2);
  case TOK_PRE_SMOLLM: {
    int rc = tok__compile_one(t, "\\p{N}");
    return rc ? rc : tok__compile_one(t, RE_GPT2);
  }
  case TOK_PRE_DEFAULT: {
    static const char *const k[] = {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"};
    for (size_t i = 0; i < FR_ARRAY_SIZE(k); i++) {
      int rc = tok__compile_one(t, k[i]);
      if (rc) return rc;
    }
    return 0;
  }
  case TOK_PRE_NONE: return 0;
  }
  return 0;
}

/* Known patterns as they appear in tokenizer.json Split pre-tokenizers. */
const char *tok__known_regex(tok_pre_t pre);
const char *tok__known_regex(tok_pre_t pre) {
  switch (pre) {
  case TOK_PRE_GPT2: return RE_GPT2;
  case TOK_PRE_LLAMA3: return RE_LLAMA3;
  case TOK_PRE_QWEN2: return RE_QWEN2;
  default: return NULL;
  }
}

/* ---------- splitting ---------- */

typedef struct {
  uint32_t off, len;
} span_t;

typedef struct {
  span_t *v;
  size_t n, cap;
} span_vec_t;

static void span_push(span_vec_t *s, size_t off, size_t len) {
  if (len == 0) return;
  if (s->n == s->cap) {
    s->cap = s->cap ? s->cap * 2 : 64;
    s->v = fr_realloc(s->v, s->cap * sizeof(*s->v));
  }
  s->v[s->n++] = (span_t){(uint32_t)off, (uint32_t)len};
}

typedef struct {
  pcre2_match_data *md;
  pcre2_match_context *mc; /* created with a big JIT stack on first need */
  pcre2_jit_stack *js;
} re_ctx_t;

static int match(pcre2_code *re, re_ctx_t *c, PCRE2_SPTR s, size_t len, size_t pos) {
  int rc = pcre2_match(re, s, len, pos, 0, c->md, c->mc);
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !c->js) {
    c->mc = pcre2_match_context_create(NULL);
    c->js = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, NULL);
    if (!c->mc || !c->js) FR_ASSERT(!"pcre2 allocation failed");
    pcre2_jit_stack_assign(c->mc, NULL, c->js);
    rc = pcre2_match(re, s, len, pos, 0, c->md, c->mc);
  }
  return rc;
}

/* Splits [off, off+len) of text by re: matches and gaps become pieces. The
 * regex sees only this piece (lookaheads stop at its end). */
static void split_piece(pcre2_code *re, re_ctx_t *c, const char *text, size_t off, size_t len, span_vec_t *out) {
  const PCRE2_SPTR s = (PCRE2_SPTR)(text + off);
  pcre2_match_data *md = c->md;
  size_t pos = 0, gap = 0;
  while (pos < len) {
    int rc = match(re, c, s, len, pos);
    if (rc < 0) break; /* no match (or a resource limit): the rest is one gap */
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    size_t ms = ov[0], me = ov[1];
    if (me <= ms) { /* empty match: step over one character */
      int full, l = tok__utf8_prefix((const unsigned char *)s + ms, len - ms, &full);
      pos = ms + (size_t)(l > 0 ? l : 1);
      continue;
    }
    if (ms > gap) span_push(out, off + gap, ms - gap);
    span_push(out, off + ms, me - ms);
    pos = gap = me;
  }
  if (len > gap) span_push(out, off + gap, len - gap);
}

static int pretokenize(const model_tokenizer_t *t, const char *text, size_t n, span_vec_t *pieces) {
  pieces->n = 0;
  span_push(pieces, 0, n);
  if (t->n_re == 0) return 0;
  re_ctx_t c = {pcre2_match_data_create(1, NULL), NULL, NULL};
  if (!c.md) FR_ASSERT(!"pcre2 allocation failed");
  span_vec_t next = {0};
  for (int r = 0; r < t->n_re; r++) {
    next.n = 0;
    for (size_t i = 0; i < pieces->n; i++)
      split_piece(t->re[r], &c, text, pieces->v[i].off, pieces->v[i].len, &next);
    span_vec_t tmp = *pieces;
    *pieces = next;
    next = tmp;
  }
  free(next.v);
  if (c.js) pcre2_jit_stack_free(c.js);
  if (c.mc) pcre2_match_context_free(c.mc);
  pcre2_match_data_free(c.md);
  return 0;
}

/* ---------- BPE merge loop ---------- */

typedef struct {
  int32_t rank, left, right, a, b;
} bigram_t;

typedef struct {
  int32_t *id, *prev, *next;
  bigram_t *heap;
  size_t nheap, cap, heap_cap;
  char *buf; /* mapped word text */
  size_t buf_cap;
} bpe_scratch_t;

static bool bigram_less(const bigram_t *x, const bigram_t *y) { /* x pops first */
  return x->rank < y->rank || (x->rank == y->rank && x->left < y->left);
}

static void heap_push(bpe_scratch_t *s, bigram_t g) {
  if (s->nheap == s->heap_cap) {
    s->heap_cap = s->heap_cap ? s->heap_cap * 2 : 64;
    s->heap = fr_realloc(s->heap, s->heap_cap * sizeof(bigram_t));
  }
  size_t i = s->nheap++;
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (!bigram_less(&g, &s->heap[p])) break;
    s->heap[i] = s->heap[p];
    i = p;
  }
  s->heap[i] = g;
}

static bigram_t heap_pop(bpe_scratch_t *s) {
  bigram_t top = s->heap[0], last = s->heap[--s->nheap];
  size_t i = 0, n = s->nheap;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= n) break;
    if (c + 1 < n && bigram_less(&s->heap[c + 1], &s->heap[c])) c++;
    if (!bigram_less(&s->heap[c], &last)) break;
    s->heap[i] = s->heap[c];
    i = c;
  }
  if (n > 0) s->heap[i] = last;
  return top;
}

static void try_pair(const model_tokenizer_t *t, bpe_scratch_t *s, int32_t l, int32_t r) {
  if (l < 0 || r < 0 || s->id[l] < 0 || s->id[r] < 0 || t->mmap_cap == 0) return;
  uint64_t key = ((uint64_t)(uint32_t)s->id[l] << 32) | (uint32_t)s->id[r];
  size_t mask = t->mmap_cap - 1;
  size_t h = fr_mix64(key) & mask;
  for (;; h = (h + 1) & mask) {
    const tok_merge_slot_t *m = &t->mmap[h];
    if (m->key == UINT64_MAX) return;
    if (m->key == key) {
      heap_push(s, (bigram_t){m->rank, l, r, s->id[l], s->id[r]});
      return;
    }
  }
}

static void scratch_reserve(bpe_scratch_t *s, size_t n) {
  if (n <= s->cap) return;
  s->cap = n;
  s->id = fr_realloc(s->id, n * sizeof(int32_t));
  s->prev = fr_realloc(s->prev, n * sizeof(int32_t));
  s->next = fr_realloc(s->next, n * sizeof(int32_t));
}

/* Merges the symbols s->id[0..n) in place and appends the result. */
static void bpe_merge(const model_tokenizer_t *t, bpe_scratch_t *s, int32_t n, tok_ids_t *out) {
  for (int32_t i = 0; i < n; i++) {
    s->prev[i] = i - 1;
    s->next[i] = i + 1 < n ? i + 1 : -1;
  }
  s->nheap = 0;
  for (int32_t i = 0; i + 1 < n; i++) try_pair(t, s, i, i + 1);
  while (s->nheap > 0) {
    bigram_t g = heap_pop(s);
    if (s->id[g.left] != g.a || s->next[g.left] != g.right || s->id[g.right] != g.b) continue; /* stale */
    const tok_merge_slot_t *m = NULL;
    uint64_t key = ((uint64_t)(uint32_t)g.a << 32) | (uint32_t)g.b;
    size_t mask = t->mmap_cap - 1;
    for (size_t h = fr_mix64(key) & mask;; h = (h + 1) & mask)
      if (t->mmap[h].key == key) { m = &t->mmap[h]; break; }
    s->id[g.left] = m->id;
    s->id[g.right] = -2; /* merged away */
    s->next[g.left] = s->next[g.right];
    if (s->next[g.right] >= 0) s->prev[s->next[g.right]] = g.left;
    try_pair(t, s, s->prev[g.left], g.left);
    try_pair(t, s, g.left, s->next[g.left]);
  }
  for (int32_t i = 0; i >= 0 && i < n; i = s->next[i]) {
    if (s->id[i] >= 0) tok__ids_push(out, s->id[i]);
    else if (s->id[i] == -1 && t->unk >= 0) tok__ids_push(out, t->unk);
  }
}

/* Byte-level word: one initial symbol per byte. */
static void bpe_word_bytes(const model_tokenizer_t *t, bpe_scratch_t *s, const unsigned char *w, size_t n,
                           tok_ids_t *out) {
  if (t->ignore_merges) {
    size_t need = n * 2;
    if (need > s->buf_cap) {
      s->buf_cap = need;
      s->buf = fr_realloc(s->buf, need);
    }
    size_t o = 0;
    for (size_t i = 0; i < n; i++) o += (size_t)tok__utf8_put(tok__byte_to_cp(w[i]), s->buf + o);
    int32_t id = tok__lookup(t, s->buf, o);
    if (id >= 0) {
      tok__ids_push(out, id);
      return;
    }
  }
  scratch_reserve(s, n);
  for (size_t i = 0; i < n; i++) s->id[i] = t->byte_tok[w[i]];
  bpe_merge(t, s, (int32_t)n, out);
}

/* Character word (HF BPE without byte-level mapping, e.g. SPM-style
 * tokenizer.json): one symbol per UTF-8 character, byte fallback for
 * characters not in the vocabulary. */
static void bpe_word_chars(const model_tokenizer_t *t, bpe_scratch_t *s, const unsigned char *w, size_t n,
                           tok_ids_t *out) {
  if (t->ignore_merges) {
    int32_t id = tok__lookup(t, (const char *)w, n);
    if (id >= 0) {
      tok__ids_push(out, id);
      return;
    }
  }
  scratch_reserve(s, n);
  int32_t k = 0;
  for (size_t i = 0; i < n;) {
    int full, l = tok__utf8_prefix(w + i, n - i, &full);
    if (full != 1) l = 1;
    int32_t id = tok__lookup(t, (const char *)w + i, (size_t)l);
    if (id < 0 && t->byte_fallback) {
      bool all = true;
      for (int b = 0; b < l; b++) all = all && t->byte_tok[w[i + b]] >= 0;
      if (all) {
        for (int b = 0; b < l; b++) s->id[k++] = t->byte_tok[w[i + b]];
        i += (size_t)l;
        continue;
      }
    }
    s->id[k++] = id; /* -1 becomes unk (or nothing) */
    i += (size_t)l;
  }
  bpe_merge(t, s, k, out);
}

/* SPM-style text for tokenizer.json models: ' ' -> U+2581, with the prefix. */
static char *spm_escape(const model_tokenizer_t *t, const char *s, size_t n, bool first, bool at_start, size_t *outn) {
  bool prefix = t->add_space_prefix &&
                (t->prepend_scheme == 0 ? first : t->prepend_scheme == 1 ? at_start : false);
  char *o = fr_malloc(n * 3 + 4);
  size_t k = 0;
  if (prefix) memcpy(o, "\xE2\x96\x81", 3), k = 3;
  for (size_t i = 0; i < n; i++) {
    if (s[i] == ' ') memcpy(o + k, "\xE2\x96\x81", 3), k += 3;
    else o[k++] = s[i];
  }
  *outn = k;
  return o;
}

int tok__bpe_fragment(const model_tokenizer_t *t, const char *text, size_t n, bool first, bool at_start,
                      tok_ids_t *out) {
  char *esc = NULL;
  if (t->spm_merges) {
    esc = spm_escape(t, text, n, first, at_start, &n);
    text = esc;
  }
  if (n > UINT32_MAX / 2) {
    free(esc);
    return fr_errorf(FR_ETOOBIG, "tokenize: text fragment of %zu bytes", n);
  }
  span_vec_t pieces = {0};
  bpe_scratch_t s = {0};
  int rc = pretokenize(t, text, n, &pieces);
  for (size_t i = 0; rc == 0 && i < pieces.n; i++) {
    const unsigned char *w = (const unsigned char *)text + pieces.v[i].off;
    if (t->byte_level) bpe_word_bytes(t, &s, w, pieces.v[i].len, out);
    else bpe_word_chars(t, &s, w, pieces.v[i].len, out);
  }
  free(pieces.v);
  free(s.id), free(s.prev), free(s.next), free(s.heap), free(s.buf);
  free(esc);
  return rc;
}
