/* tok_spm.c - SentencePiece BPE as llama.cpp's llm_tokenizer_spm does it:
 * ' ' -> U+2581 (with a leading one at the start of the text and after a
 * special token when add_space_prefix), split into UTF-8 characters, merge
 * the adjacent pair whose concatenation is the vocabulary piece with the
 * highest score (leftmost on ties), then emit every final symbol as its
 * token or, when it is not one, as <0xXX> byte tokens. */
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "model/tok_internal.h"

typedef struct {
  float score;
  int32_t left, right;
  uint32_t size;
} spm_bigram_t;

typedef struct {
  uint32_t off, n; /* n == 0: merged away */
  int32_t prev, next;
} spm_sym_t;

typedef struct {
  const model_tokenizer_t *t;
  const char *text;
  spm_sym_t *sym;
  spm_bigram_t *heap;
  size_t nheap, heap_cap;
} spm_ctx_t;

static bool sb_first(const spm_bigram_t *x, const spm_bigram_t *y) { /* x pops first */
  return x->score > y->score || (x->score == y->score && x->left < y->left);
}

static void sb_push(spm_ctx_t *c, spm_bigram_t g) {
  if (c->nheap == c->heap_cap) {
    c->heap_cap = c->heap_cap ? c->heap_cap * 2 : 64;
    c->heap = fr_realloc(c->heap, c->heap_cap * sizeof(*c->heap));
  }
  size_t i = c->nheap++;
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (!sb_first(&g, &c->heap[p])) break;
    c->heap[i] = c->heap[p];
    i = p;
  }
  c->heap[i] = g;
}

static spm_bigram_t sb_pop(spm_ctx_t *c) {
  spm_bigram_t top = c->heap[0], last = c->heap[--c->nheap];
  size_t i = 0, n = c->nheap;
  for (;;) {
    size_t k = 2 * i + 1;
    if (k >= n) break;
    if (k + 1 < n && sb_first(&c->heap[k + 1], &c->heap[k])) k++;
    if (!sb_first(&c->heap[k], &last)) break;
    c->heap[i] = c->heap[k];
    i = k;
  }
  if (n > 0) c->heap[i] = last;
  return top;
}

static void spm_try(spm_ctx_t *c, int32_t l, int32_t r) {
  if (l < 0 || r < 0) return;
  const spm_sym_t *a = &c->sym[l], *b = &c->sym[r];
  int32_t id = tok__lookup(c->t, c->text + a->off, (size_t)a->n + b->n);
  if (id < 0) return;
  sb_push(c, (spm_bigram_t){c->t->tok[id].score, l, r, a->n + b->n});
}

static void spm_emit(const model_tokenizer_t *t, const char *s, size_t n, tok_ids_t *out) {
  int32_t id = tok__lookup(t, s, n);
  if (id >= 0) {
    tok__ids_push(out, id);
    return;
  }
  for (size_t i = 0; i < n; i++) {
    int32_t b = t->byte_tok[(unsigned char)s[i]];
    if (b < 0) b = t->unk;
    if (b >= 0) tok__ids_push(out, b);
  }
}

/* llama.cpp's unicode_len_utf8: the length announced by the lead byte. */
static uint32_t lead_len(unsigned char c) {
  static const uint8_t k[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return k[c >> 4];
}

static char *spm_escape(const model_tokenizer_t *t, const char *s, size_t n, bool prefix, size_t *outn) {
  char *o = fr_malloc(n * 3 + 4);
  size_t k = 0;
  if (prefix && t->add_space_prefix) memcpy(o, "\xE2\x96\x81", 3), k = 3;
  for (size_t i = 0; i < n; i++) {
    if (s[i] == ' ') memcpy(o + k, "\xE2\x96\x81", 3), k += 3;
    else o[k++] = s[i];
  }
  *outn = k;
  return o;
}

int tok__spm_fragment(const model_tokenizer_t *t, const char *s, size_t n, bool first, bool at_start,
                      tok_ids_t *out) {
  if (n > UINT32_MAX / 4) return fr_errorf(FR_ETOOBIG, "tokenize: text fragment of %zu bytes", n);
  size_t len;
  char *text = spm_escape(t, s, n, first, &len);
  spm_ctx_t c = {.t = t, .text = text};
  c.sym = fr_malloc((len + 1) * sizeof(spm_sym_t));
  int32_t ns = 0;
  for (size_t off = 0; off < len; ns++) {
    uint32_t l = (uint32_t)FR_MIN((size_t)lead_len((unsigned char)text[off]), len - off);
    c.sym[ns] = (spm_sym_t){(uint32_t)off, l, ns - 1, -1};
    if (ns > 0) c.sym[ns - 1].next = ns;
    off += l;
  }
  for (int32_t i = 1; i < ns; i++) spm_try(&c, i - 1, i);
  while (c.nheap > 0) {
    spm_bigram_t g = sb_pop(&c);
    spm_sym_t *l = &c.sym[g.left], *r = &c.sym[g.right];
    if (l->n == 0 || r->n == 0 || l->n + r->n != g.size) continue; /* stale */
    l->n += r->n;
    r->n = 0;
    l->next = r->next;
    if (r->next >= 0) c.sym[r->next].prev = g.left;
    spm_try(&c, l->prev, g.left);
    spm_try(&c, g.left, l->next);
  }
  for (int32_t i = ns > 0 ? 0 : -1; i >= 0; i = c.sym[i].next) spm_emit(t, text + c.sym[i].off, c.sym[i].n, out);
  (void)at_start;
  free(c.heap);
  free(c.sym);
  free(text);
  return 0;
}
