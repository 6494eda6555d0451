/* tok_wpm.c - the WordPiece tokenizer of BERT models, as Hugging Face
 * tokenizers runs it:
 *   BertNormalizer: clean text (drop NUL, U+FFFD and control characters,
 *     whitespace to a space), a space on each side of every CJK ideograph,
 *     strip accents (NFD, nonspacing marks dropped), lowercase;
 *   BertPreTokenizer: words split at whitespace, every punctuation
 *     character a word of its own;
 *   WordPiece: per word, the longest vocabulary entry from its start, then
 *     the longest continuation ("##" + piece), ...; a word that does not
 *     split so, or has more than max_input_chars_per_word characters, is
 *     [UNK].
 * A GGUF vocabulary (llama.cpp's "bert" tokenizer model) stores word-
 * initial pieces with a U+2581 prefix and continuations bare
 * (wpm_phantom); the same search runs over those spellings.
 * The Unicode tables are generated (tok_wpm_tables.c). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "model/tok_internal.h"
#include "model/tok_wpm.h"

typedef struct {
  uint32_t *v;
  size_t n, cap;
} wpm_cps_t;

static void wpm_push(wpm_cps_t *c, uint32_t cp) {
  if (c->n == c->cap) {
    c->cap = c->cap ? c->cap * 2 : 256;
    c->v = fr_realloc(c->v, c->cap * sizeof *c->v);
  }
  c->v[c->n++] = cp;
}

static bool wpm_in(const uint32_t (*r)[2], size_t n, uint32_t cp) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (cp < r[mid][0]) hi = mid;
    else if (cp > r[mid][1]) lo = mid + 1;
    else return true;
  }
  return false;
}

/* Rust's char::is_whitespace (the White_Space property). */
static bool wpm_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

static bool wpm_control(uint32_t cp) {
  return cp != '\t' && cp != '\n' && cp != '\r' && wpm_in(tok__wpm_other, tok__wpm_other_n, cp);
}

static bool wpm_chinese(uint32_t cp) {
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x20000 && cp <= 0x2A6DF) ||
         (cp >= 0x2A700 && cp <= 0x2B73F) || (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B920 && cp <= 0x2CEAF) ||
         (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

static bool wpm_punct(uint32_t cp) {
  if (cp < 0x80) return (cp >= 33 && cp <= 47) || (cp >= 58 && cp <= 64) || (cp >= 91 && cp <= 96) ||
                        (cp >= 123 && cp <= 126);
  return wpm_in(tok__wpm_punct, tok__wpm_punct_n, cp);
}

static uint32_t wpm_lower1(uint32_t cp) {
  size_t lo = 0, hi = tok__wpm_lower_n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (tok__wpm_lower[mid][0] == cp) return tok__wpm_lower[mid][1];
    if (tok__wpm_lower[mid][0] < cp) lo = mid + 1;
    else hi = mid;
  }
  return cp;
}

/* Appends cp lowercased when asked (U+0130 lowercases to two). */
static void wpm_put_lower(const model_tokenizer_t *t, wpm_cps_t *o, uint32_t cp) {
  if (t->wpm_lower && cp == 0x130) {
    wpm_push(o, 'i');
    wpm_push(o, 0x307);
  } else {
    wpm_push(o, t->wpm_lower ? wpm_lower1(cp) : cp);
  }
}

/* strip_accents: cp's canonical decomposition without its nonspacing
 * marks (Hangul syllables by rule), then lowercase. */
static void wpm_put_stripped(const model_tokenizer_t *t, wpm_cps_t *o, uint32_t cp) {
  if (cp >= 0xAC00 && cp <= 0xD7A3) { /* Hangul: L V (T) */
    uint32_t s = cp - 0xAC00;
    wpm_put_lower(t, o, 0x1100 + s / 588);
    wpm_put_lower(t, o, 0x1161 + (s % 588) / 28);
    if (s % 28) wpm_put_lower(t, o, 0x11A7 + s % 28);
    return;
  }
  size_t lo = 0, hi = tok__wpm_nfd_n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (tok__wpm_nfd[mid][0] == cp) {
      for (uint32_t k = 0; k < tok__wpm_nfd[mid][2]; k++) wpm_put_lower(t, o, tok__wpm_nfd_pool[tok__wpm_nfd[mid][1] + k]);
      return;
    }
    if (tok__wpm_nfd[mid][0] < cp) lo = mid + 1;
    else hi = mid;
  }
  if (!wpm_in(tok__wpm_mn, tok__wpm_mn_n, cp)) wpm_put_lower(t, o, cp);
}

/* BertNormalizer over the UTF-8 of s (invalid bytes as U+FFFD). */
static void wpm_normalize(const model_tokenizer_t *t, const char *s, size_t n, wpm_cps_t *o) {
  const unsigned char *p = (const unsigned char *)s;
  for (size_t i = 0; i < n;) {
    int l = tok__utf8_len(p + i, n - i);
    uint32_t cp = l ? tok__utf8_cp(p + i, l) : 0xFFFD;
    i += l ? (size_t)l : 1;
    if (t->wpm_clean) {
      if (cp == 0 || cp == 0xFFFD || wpm_control(cp)) continue;
      if (wpm_space(cp)) cp = ' ';
    }
    bool cjk = t->wpm_chinese && wpm_chinese(cp);
    if (cjk) wpm_push(o, ' ');
    if (t->wpm_strip_accents) wpm_put_stripped(t, o, cp);
    else wpm_put_lower(t, o, cp);
    if (cjk) wpm_push(o, ' ');
  }
}

/* The vocabulary id of a piece: the word's chars [a, b) as UTF-8 with the
 * prefix a piece at that place takes; -1 when absent. buf holds 4 * (b -
 * a) + 16 bytes. */
static int32_t wpm_piece(const model_tokenizer_t *t, const uint32_t *w, size_t a, size_t b, bool first, char *buf) {
  size_t n = 0;
  if (first && t->wpm_phantom) memcpy(buf, "\xE2\x96\x81", 3), n = 3;
  if (!first && !t->wpm_phantom) {
    size_t pl = strlen(t->wpm_prefix);
    memcpy(buf, t->wpm_prefix, pl);
    n = pl;
  }
  for (size_t i = a; i < b; i++) n += (size_t)tok__utf8_put(w[i], buf + n);
  return tok__lookup(t, buf, n);
}

/* WordPiece of one word (len chars). */
static void wpm_word(const model_tokenizer_t *t, const uint32_t *w, size_t len, char *buf, tok_ids_t *out) {
  size_t mark = out->n;
  if ((int)len <= t->wpm_max_chars) {
    for (size_t start = 0; start < len;) {
      size_t end = len;
      int32_t id = -1;
      for (; end > start && (id = wpm_piece(t, w, start, end, start == 0, buf)) < 0; end--) {}
      if (id < 0) {
        out->n = mark;
        break;
      }
      tok__ids_push(out, id);
      start = end;
    }
    if (out->n > mark) return;
  }
  if (t->unk >= 0) tok__ids_push(out, t->unk);
}

int tok__wpm_fragment(const model_tokenizer_t *t, const char *s, size_t n, tok_ids_t *out) {
  wpm_cps_t c = {0};
  wpm_normalize(t, s, n, &c);
  char *buf = fr_malloc(c.n * 4 + 16);
  size_t w = 0; /* BertPreTokenizer: words between spaces, punctuation alone */
  for (size_t i = 0; i <= c.n; i++) {
    bool end = i == c.n, sp = !end && wpm_space(c.v[i]), pu = !end && !sp && wpm_punct(c.v[i]);
    if (!end && !sp && !pu) continue;
    if (i > w) wpm_word(t, c.v + w, i - w, buf, out);
    if (pu) wpm_word(t, c.v + i, 1, buf, out);
    w = i + 1;
  }
  free(buf);
  free(c.v);
  return 0;
}

void tok__wpm_defaults(model_tokenizer_t *t) {
  t->kind = MODEL_TOK_WPM;
  t->pre = TOK_PRE_NONE;
  snprintf(t->pre_name, sizeof t->pre_name, "bert");
  t->wpm_clean = t->wpm_chinese = t->wpm_strip_accents = t->wpm_lower = true;
  snprintf(t->wpm_prefix, sizeof t->wpm_prefix, "##");
  t->wpm_max_chars = 100;
  t->add_bos = t->add_eos = true; /* [CLS] ... [SEP] */
}
