/* jinja_lex.c - splits a template into tokens as jinja2's lexer does with
 * trim_blocks=True and lstrip_blocks=True: newlines are normalized and one
 * trailing newline dropped; `{%-`/`-%}` (and the {{ }} and {# #} forms)
 * strip the whitespace beside them; a block or comment tag alone on its line
 * takes the line's leading whitespace (unless `{%+`) and its own newline
 * (unless `+%}`); comments are dropped. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "model/jinja_internal.h"
#include "model/tok_internal.h"

typedef struct {
  jinja_arena_t *a;
  const char *s;
  size_t n, pos;
  int line;
  jinja_tok_t *toks;
  size_t n_toks, cap;
  bool line_starting; /* the last thing consumed ended a line (jinja2's line_starting) */
} lexer_t;

static jinja_tok_t *emit(lexer_t *L, int type, const char *s, size_t n) {
  if (L->n_toks == L->cap) {
    size_t cap = L->cap ? L->cap * 2 : 256;
    jinja_tok_t *t = jinja_alloc(L->a, cap * sizeof *t);
    if (L->n_toks) memcpy(t, L->toks, L->n_toks * sizeof *t);
    L->toks = t, L->cap = cap;
  }
  jinja_tok_t *t = &L->toks[L->n_toks++];
  *t = (jinja_tok_t){.type = (uint8_t)type, .line = L->line};
  if (s) {
    char *c = jinja_alloc(L->a, n + 1);
    memcpy(c, s, n);
    t->s = c, t->n = n;
  }
  return t;
}

static void count_lines(lexer_t *L, size_t from, size_t to) {
  for (size_t i = from; i < to; i++) L->line += L->s[i] == '\n';
}

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

/* The text before a tag at `at`, with `{%-` / lstrip_blocks applied. */
static void emit_text(lexer_t *L, size_t at, char kind, char sign) {
  const char *t = L->s + L->pos;
  size_t n = at - L->pos;
  if (sign == '-') {
    while (n && is_ws(t[n - 1])) n--;
  } else if (sign != '+' && kind != '{') {
    size_t l = n;
    while (l && t[l - 1] != '\n') l--;
    bool all_ws = l < n;
    for (size_t i = l; i < n; i++) all_ws &= is_ws(t[i]);
    if ((l > 0 || L->line_starting) && all_ws) n = l;
  }
  if (n) emit(L, JT_TEXT, t, n);
}

/* Skips what follows a tag's end: everything with '-', one newline for
 * block and comment tags (trim_blocks) unless '+'. */
static void after_end(lexer_t *L, char sign, bool block) {
  size_t p = L->pos;
  if (sign == '-')
    while (p < L->n && is_ws(L->s[p])) p++;
  else if (sign != '+' && block && p < L->n && L->s[p] == '\n') p++;
  L->line_starting = p > L->pos ? L->s[p - 1] == '\n' : false;
  count_lines(L, L->pos, p);
  L->pos = p;
}

static void lex_comment(lexer_t *L) {
  const char *end = NULL;
  for (size_t p = L->pos; p + 1 < L->n; p++)
    if (L->s[p] == '#' && L->s[p + 1] == '}') {
      end = L->s + p;
      break;
    }
  if (!end) jinja_fail(L->a->err, FR_EFORMAT, "line %d: unclosed comment", L->line);
  char sign = end > L->s + L->pos && (end[-1] == '-' || end[-1] == '+') ? end[-1] : 0;
  size_t stop = (size_t)(end - L->s) + 2;
  count_lines(L, L->pos, stop);
  L->pos = stop;
  after_end(L, sign, true);
}

static int hexval(char c) {
  return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* A quoted string with Python's escapes, from L->pos (the quote). */
static void lex_string(lexer_t *L) {
  char q = L->s[L->pos];
  size_t p = L->pos + 1;
  jinja_buf_t b = {0};
  for (;;) {
    if (p >= L->n) jinja_fail(L->a->err, FR_EFORMAT, "line %d: unclosed string", L->line);
    char c = L->s[p];
    if (c == q) break;
    if (c != '\\' || p + 1 >= L->n) {
      jinja_buf_put(L->a, &b, &c, 1);
      p++;
      continue;
    }
    char e = L->s[p + 1], out[8];
    const char *rep = NULL;
    size_t skip = 2, nrep = 1;
    switch (e) {
    case 'n': rep = "\n"; break;
    case 't': rep = "\t"; break;
    case 'r': rep = "\r"; break;
    case 'b': rep = "\b"; break;
    case 'f': rep = "\f"; break;
    case 'v': rep = "\v"; break;
    case 'a': rep = "\a"; break;
    case '0': rep = "", nrep = 1; break;
    case '\\': case '\'': case '"': rep = &L->s[p + 1]; break;
    case '\n': rep = "", nrep = 0; break;
    case 'x': case 'u': case 'U': {
      size_t nd = e == 'x' ? 2 : e == 'u' ? 4 : 8;
      uint32_t cp = 0;
      for (size_t k = 0; k < nd; k++) {
        int h = p + 2 + k < L->n ? hexval(L->s[p + 2 + k]) : -1;
        if (h < 0) jinja_fail(L->a->err, FR_EFORMAT, "line %d: bad \\%c escape", L->line, e);
        cp = cp * 16 + (uint32_t)h;
      }
      if (cp > 0x10FFFF) jinja_fail(L->a->err, FR_EFORMAT, "line %d: bad \\%c escape", L->line, e);
      nrep = (size_t)tok__utf8_put(cp, out);
      rep = out, skip = 2 + nd;
      break;
    }
    default: rep = &L->s[p], nrep = 2; break; /* unknown escapes stay */
    }
    jinja_buf_put(L->a, &b, rep, nrep);
    p += skip;
  }
  emit(L, JT_STRING, b.p ? b.p : "", b.n);
  count_lines(L, L->pos, p);
  L->pos = p + 1;
}

static void lex_number(lexer_t *L) {
  size_t p = L->pos;
  bool is_float = false;
  char buf[64];
  size_t k = 0;
  while (p < L->n && (isdigit((unsigned char)L->s[p]) || L->s[p] == '_')) {
    if (L->s[p] != '_' && k < sizeof buf - 1) buf[k++] = L->s[p];
    p++;
  }
  if (p + 1 < L->n && L->s[p] == '.' && isdigit((unsigned char)L->s[p + 1])) {
    is_float = true;
    if (k < sizeof buf - 1) buf[k++] = '.';
    for (p++; p < L->n && (isdigit((unsigned char)L->s[p]) || L->s[p] == '_'); p++)
      if (L->s[p] != '_' && k < sizeof buf - 1) buf[k++] = L->s[p];
  }
  if (p < L->n && (L->s[p] == 'e' || L->s[p] == 'E')) {
    size_t q = p + 1;
    if (q < L->n && (L->s[q] == '+' || L->s[q] == '-')) q++;
    if (q < L->n && isdigit((unsigned char)L->s[q])) {
      is_float = true;
      for (; p < q; p++)
        if (k < sizeof buf - 1) buf[k++] = L->s[p];
      for (; p < L->n && isdigit((unsigned char)L->s[p]); p++)
        if (k < sizeof buf - 1) buf[k++] = L->s[p];
    }
  }
  buf[k] = 0;
  jinja_tok_t *t = emit(L, is_float ? JT_FLOAT : JT_INT, buf, k);
  if (is_float) t->f = strtod(buf, NULL);
  else t->i = strtoll(buf, NULL, 10);
  L->pos = p;
}

static const char *const k_ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                    ">",  "=",  "(",  ")",  "[",  "]",  "{", "}", ",", ".", ":", "|"};

/* The end of the tag at L->pos ("}}" or "%}", maybe after '-' or '+'):
 * returns its length and sets *sign, or 0. */
static size_t tag_end(const lexer_t *L, char close, char *sign) {
  const char *s = L->s + L->pos;
  size_t left = L->n - L->pos;
  *sign = 0;
  if ((s[0] == '-' || s[0] == '+') && left >= 3 && s[1] == close && s[2] == '}') {
    *sign = s[0];
    return 3;
  }
  return left >= 2 && s[0] == close && s[1] == '}' ? 2 : 0;
}

/* Tokens inside {{ }} or {% %} up to and including the end. */
static void lex_tag(lexer_t *L, char close) {
  int depth = 0;
  for (;;) {
    while (L->pos < L->n && is_ws(L->s[L->pos])) L->line += L->s[L->pos++] == '\n';
    if (L->pos >= L->n) jinja_fail(L->a->err, FR_EFORMAT, "line %d: unclosed tag", L->line);
    char sign, c = L->s[L->pos];
    size_t end = depth == 0 ? tag_end(L, close, &sign) : 0;
    if (end) {
      emit(L, close == '}' ? JT_VAR_END : JT_BLOCK_END, NULL, 0);
      L->pos += end;
      after_end(L, sign, close == '%');
      return;
    }
    if (c == '\'' || c == '"') {
      lex_string(L);
    } else if (isdigit((unsigned char)c)) {
      lex_number(L);
    } else if (isalpha((unsigned char)c) || c == '_') {
      size_t p = L->pos;
      while (p < L->n && (isalnum((unsigned char)L->s[p]) || L->s[p] == '_')) p++;
      emit(L, JT_NAME, L->s + L->pos, p - L->pos);
      L->pos = p;
    } else {
      size_t k = 0;
      for (; k < FR_ARRAY_SIZE(k_ops); k++)
        if (!strncmp(L->s + L->pos, k_ops[k], strlen(k_ops[k]))) break;
      if (k == FR_ARRAY_SIZE(k_ops)) jinja_fail(L->a->err, FR_EFORMAT, "line %d: unexpected character '%c'", L->line, c);
      size_t len = strlen(k_ops[k]);
      if (strchr("([{", c)) depth++;
      if (strchr(")]}", c) && depth > 0) depth--;
      emit(L, JT_OP, k_ops[k], len);
      L->pos += len;
    }
  }
}

/* Newlines normalized (\r\n and \r to \n), one trailing newline dropped. */
static char *normalize(jinja_arena_t *a, const char *src, size_t len, size_t *n) {
  char *s = jinja_alloc(a, len + 1);
  size_t k = 0;
  for (size_t i = 0; i < len; i++) {
    if (src[i] == '\r') {
      s[k++] = '\n';
      if (i + 1 < len && src[i + 1] == '\n') i++;
    } else {
      s[k++] = src[i];
    }
  }
  if (k && s[k - 1] == '\n') k--;
  s[k] = 0;
  *n = k;
  return s;
}

void jinja_lex(jinja_arena_t *a, const char *src, size_t len, jinja_tok_t **toks, size_t *n_toks) {
  lexer_t L = {.a = a, .line = 1, .line_starting = true};
  L.s = normalize(a, src, len, &L.n);
  while (L.pos < L.n) {
    size_t at = L.pos;
    while (at + 1 < L.n && !(L.s[at] == '{' && strchr("{%#", L.s[at + 1]))) at++;
    if (at + 1 >= L.n) at = L.n;
    char kind = at < L.n ? L.s[at + 1] : 0;
    char sign = at + 2 < L.n && (L.s[at + 2] == '-' || L.s[at + 2] == '+') ? L.s[at + 2] : 0;
    emit_text(&L, at, kind, sign);
    count_lines(&L, L.pos, at);
    if (at >= L.n) break;
    L.pos = at + 2 + (sign != 0);
    if (kind == '#') {
      lex_comment(&L);
      continue;
    }
    emit(&L, kind == '{' ? JT_VAR_BEGIN : JT_BLOCK_BEGIN, NULL, 0);
    lex_tag(&L, kind == '{' ? '}' : '%');
  }
  emit(&L, JT_EOF, NULL, 0);
  *toks = L.toks;
  *n_toks = L.n_toks;
}
