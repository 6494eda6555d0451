/* grammar_regex.c - regular expressions as Thompson NFAs over bytes, and
 * their simulation (a set of states) for constrained decoding. The
 * pattern must match the whole output. See grammar.h for the syntax. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "model/grammar.h"
#include "model/grammar_internal.h"

#define RX_MAX_REPEAT 256 /* {m,n} bounds */
#define RX_MAX_NEST 64

typedef struct {
  model_grammar_t *g;
  const char *p;
  size_t n, i;
  int depth;
  int rc;
} rx_t;

typedef struct {
  int32_t start, end; /* end: an epsilon state whose out is still open */
} rx_frag_t;

static int rx_err(rx_t *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int rx_err(rx_t *x, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(x->g->err, x->g->err_len, fmt, ap);
  va_end(ap);
  x->rc = FR_EFORMAT;
  return -1;
}

static int32_t rx_state(rx_t *x, bool eps) {
  model_grammar_t *g = x->g;
  if (g->n_nfa >= MODEL_GRAMMAR_MAX_NFA) return rx_err(x, "the regex needs more than %d NFA states", MODEL_GRAMMAR_MAX_NFA);
  g->nfa[g->n_nfa] = (gnfa_t){.out = -1, .out2 = -1, .eps = eps};
  return (int32_t)g->n_nfa++;
}

static void rx_set(uint64_t *cls, unsigned c) { cls[c >> 6] |= 1ull << (c & 63); }

static void rx_range(uint64_t *cls, unsigned lo, unsigned hi) {
  for (unsigned c = lo; c <= hi; c++) rx_set(cls, c);
}

/* \d \w \s and their negations into cls; false for another letter. */
static bool rx_class_escape(uint64_t *cls, char e) {
  uint64_t t[4] = {0};
  char l = (char)(e | 32);
  if (l == 'd') rx_range(t, '0', '9');
  else if (l == 'w') rx_range(t, '0', '9'), rx_range(t, 'a', 'z'), rx_range(t, 'A', 'Z'), rx_set(t, '_');
  else if (l == 's') rx_set(t, ' '), rx_set(t, '\t'), rx_set(t, '\n'), rx_set(t, '\r'), rx_set(t, '\f'), rx_set(t, '\v');
  else return false;
  for (int k = 0; k < 4; k++) cls[k] |= e >= 'a' ? t[k] : ~t[k];
  return true;
}

/* The byte an escape stands for (\n, \t, \xHH, \. ...), or -1. */
static int rx_escape_byte(rx_t *x) {
  char e = x->p[x->i++];
  switch (e) {
  case 'n': return '\n';
  case 't': return '\t';
  case 'r': return '\r';
  case 'f': return '\f';
  case 'v': return '\v';
  case '0': return 0;
  case 'x': {
    if (x->i + 2 > x->n) return -1;
    char h[3] = {x->p[x->i], x->p[x->i + 1], 0}, *end;
    long v = strtol(h, &end, 16);
    if (*end) return -1;
    x->i += 2;
    return (int)v;
  }
  default: return (e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9') ? -1 : (unsigned char)e;
  }
}

/* [...] after the '['. */
static int rx_bracket(rx_t *x, uint64_t *cls) {
  bool neg = x->i < x->n && x->p[x->i] == '^';
  if (neg) x->i++;
  bool first = true;
  while (x->i < x->n && (x->p[x->i] != ']' || first)) {
    first = false;
    int lo;
    if (x->p[x->i] == '\\') {
      x->i++;
      if (x->i >= x->n) return rx_err(x, "the regex ends inside a class");
      if (rx_class_escape(cls, x->p[x->i])) {
        x->i++;
        continue;
      }
      if ((lo = rx_escape_byte(x)) < 0) return rx_err(x, "unsupported escape in a regex class");
    } else
      lo = (unsigned char)x->p[x->i++];
    int hi = lo;
    if (x->i + 1 < x->n && x->p[x->i] == '-' && x->p[x->i + 1] != ']') {
      x->i++;
      if (x->p[x->i] == '\\') {
        x->i++;
        if (x->i >= x->n || (hi = rx_escape_byte(x)) < 0) return rx_err(x, "unsupported escape in a regex class");
      } else
        hi = (unsigned char)x->p[x->i++];
      if (hi < lo) return rx_err(x, "a regex class range is reversed");
      if (hi >= 0x80) return rx_err(x, "non-ASCII ranges in regex classes are not supported");
    }
    rx_range(cls, (unsigned)lo, (unsigned)hi);
  }
  if (x->i >= x->n) return rx_err(x, "unterminated [ in the regex");
  x->i++;
  if (neg)
    for (int k = 0; k < 4; k++) cls[k] = ~cls[k];
  return 0;
}

static rx_frag_t rx_alt(rx_t *x);

/* One state taking the bytes of cls. */
static rx_frag_t rx_class_frag(rx_t *x, const uint64_t *cls) {
  int32_t s = rx_state(x, false), e = rx_state(x, true);
  if (s < 0 || e < 0) return (rx_frag_t){-1, -1};
  memcpy(x->g->nfa[s].cls, cls, sizeof x->g->nfa[s].cls);
  x->g->nfa[s].out = e;
  return (rx_frag_t){s, e};
}

static rx_frag_t rx_atom(rx_t *x) {
  uint64_t cls[4] = {0};
  char c = x->p[x->i];
  if (c == '(') {
    x->i++;
    if (x->i + 1 < x->n && x->p[x->i] == '?') {
      if (x->p[x->i + 1] != ':') return rx_err(x, "only (?:...) groups are supported in a regex"), (rx_frag_t){-1, -1};
      x->i += 2;
    }
    if (++x->depth > RX_MAX_NEST) return rx_err(x, "the regex nests too deep"), (rx_frag_t){-1, -1};
    rx_frag_t f = rx_alt(x);
    x->depth--;
    if (f.start < 0) return f;
    if (x->i >= x->n || x->p[x->i] != ')') return rx_err(x, "unbalanced ( in the regex"), (rx_frag_t){-1, -1};
    x->i++;
    return f;
  }
  x->i++;
  if (c == '[') {
    if (rx_bracket(x, cls)) return (rx_frag_t){-1, -1};
  } else if (c == '.') {
    rx_range(cls, 0, 255);
    cls['\n' >> 6] &= ~(1ull << ('\n' & 63));
  } else if (c == '\\') {
    if (x->i >= x->n) return rx_err(x, "the regex ends with \\"), (rx_frag_t){-1, -1};
    if (rx_class_escape(cls, x->p[x->i])) x->i++;
    else {
      int b = rx_escape_byte(x);
      if (b < 0) return rx_err(x, "unsupported escape \\%c in the regex", x->p[x->i - 1]), (rx_frag_t){-1, -1};
      rx_set(cls, (unsigned)b);
    }
  } else if (c == '^' || c == '$') {
    return rx_err(x, "anchors are only supported at the ends of the regex"), (rx_frag_t){-1, -1};
  } else if (c == '*' || c == '+' || c == '?' || c == '{' || c == ')' || c == '|') {
    return rx_err(x, "unexpected '%c' in the regex", c), (rx_frag_t){-1, -1};
  } else
    rx_set(cls, (unsigned char)c);
  return rx_class_frag(x, cls);
}

/* e (an open epsilon end) -> to. */
static void rx_patch(rx_t *x, int32_t e, int32_t to) { x->g->nfa[e].out = to; }

static rx_frag_t rx_eps(rx_t *x) {
  int32_t s = rx_state(x, true);
  return (rx_frag_t){s, s};
}

/* f? (lazy or not: the same set of outputs). */
static rx_frag_t rx_opt(rx_t *x, rx_frag_t f) {
  int32_t s = rx_state(x, true), e = rx_state(x, true);
  if (s < 0 || e < 0) return (rx_frag_t){-1, -1};
  x->g->nfa[s].out = f.start, x->g->nfa[s].out2 = e;
  rx_patch(x, f.end, e);
  return (rx_frag_t){s, e};
}

/* f+ */
static rx_frag_t rx_plus(rx_t *x, rx_frag_t f) {
  int32_t l = rx_state(x, true), e = rx_state(x, true);
  if (l < 0 || e < 0) return (rx_frag_t){-1, -1};
  rx_patch(x, f.end, l);
  x->g->nfa[l].out = f.start, x->g->nfa[l].out2 = e;
  return (rx_frag_t){f.start, e};
}

static bool rx_num(rx_t *x, long *v) {
  size_t i0 = x->i;
  *v = 0;
  while (x->i < x->n && x->p[x->i] >= '0' && x->p[x->i] <= '9' && *v <= RX_MAX_REPEAT) *v = *v * 10 + (x->p[x->i++] - '0');
  return x->i > i0;
}

/* {m}, {m,}, {m,n} after the '{': bounds, or false when it is not one. */
static bool rx_bounds(rx_t *x, long *mn, long *mx) {
  size_t i0 = x->i;
  if (!rx_num(x, mn)) return x->i = i0, false;
  *mx = *mn;
  if (x->i < x->n && x->p[x->i] == ',') {
    x->i++;
    if (!rx_num(x, mx)) *mx = -1;
  }
  if (x->i >= x->n || x->p[x->i] != '}') return x->i = i0, false;
  x->i++;
  return true;
}

/* The atom at a0 repeated mn..mx times (mx -1: no bound): re-parsed per copy. */
static rx_frag_t rx_repeat(rx_t *x, size_t a0, long mn, long mx) {
  if (mn > RX_MAX_REPEAT || mx > RX_MAX_REPEAT || (mx >= 0 && mx < mn))
    return rx_err(x, "regex repeat bounds must be at most %d and in order", RX_MAX_REPEAT), (rx_frag_t){-1, -1};
  size_t after = x->i;
  rx_frag_t all = rx_eps(x);
  if (all.start < 0) return all;
  long copies = mx < 0 ? (mn > 0 ? mn : 1) : mx;
  for (long k = 0; k < copies; k++) {
    x->i = a0;
    rx_frag_t f = rx_atom(x);
    if (f.start < 0) return f;
    if (mx < 0 && k == copies - 1) f = mn > 0 ? rx_plus(x, f) : rx_opt(x, rx_plus(x, f));
    else if (k >= mn) f = rx_opt(x, f);
    if (f.start < 0) return f;
    rx_patch(x, all.end, f.start);
    all.end = f.end;
  }
  x->i = after;
  return all;
}

static rx_frag_t rx_piece(rx_t *x) {
  size_t a0 = x->i;
  rx_frag_t f = rx_atom(x);
  while (f.start >= 0 && x->i < x->n) {
    char q = x->p[x->i];
    long mn, mx;
    if (q == '*') x->i++, f = rx_opt(x, rx_plus(x, f));
    else if (q == '+') x->i++, f = rx_plus(x, f);
    else if (q == '?') x->i++, f = rx_opt(x, f);
    else if (q == '{') {
      x->i++;
      if (!rx_bounds(x, &mn, &mx)) return rx_err(x, "bad {m,n} in the regex"), (rx_frag_t){-1, -1};
      size_t end = x->i;
      if (a0 == (size_t)-1) return rx_err(x, "nested quantifiers in the regex"), (rx_frag_t){-1, -1};
      f = rx_repeat(x, a0, mn, mx); /* the atom parsed first stays unreachable */
      if (f.start >= 0) x->i = end;
    } else
      break;
    if (x->i < x->n && x->p[x->i] == '?') x->i++; /* lazy: the same language */
    a0 = (size_t)-1;
    if (x->i < x->n && strchr("*+?{", x->p[x->i])) return rx_err(x, "nested quantifiers in the regex"), (rx_frag_t){-1, -1};
  }
  return f;
}

static rx_frag_t rx_concat(rx_t *x) {
  rx_frag_t all = rx_eps(x);
  while (all.start >= 0 && x->i < x->n && x->p[x->i] != '|' && x->p[x->i] != ')') {
    if (x->p[x->i] == '$' && x->i + 1 == x->n && x->depth == 0) {
      x->i++;
      break;
    }
    rx_frag_t f = rx_piece(x);
    if (f.start < 0) return f;
    rx_patch(x, all.end, f.start);
    all.end = f.end;
  }
  return all;
}

static rx_frag_t rx_alt(rx_t *x) {
  rx_frag_t f = rx_concat(x);
  while (f.start >= 0 && x->i < x->n && x->p[x->i] == '|') {
    x->i++;
    rx_frag_t r = rx_concat(x);
    if (r.start < 0) return r;
    int32_t s = rx_state(x, true), e = rx_state(x, true);
    if (s < 0 || e < 0) return (rx_frag_t){-1, -1};
    x->g->nfa[s].out = f.start, x->g->nfa[s].out2 = r.start;
    rx_patch(x, f.end, e);
    rx_patch(x, r.end, e);
    f = (rx_frag_t){s, e};
  }
  return f;
}

int model_grammar_regex(model_grammar_t **out, const char *pattern, size_t len, char *err, size_t err_len) {
  model_grammar_t *g = calloc(1, sizeof *g);
  char dummy[8];
  if (!g || !(g->nfa = calloc(MODEL_GRAMMAR_MAX_NFA, sizeof *g->nfa))) {
    free(g);
    return -ENOMEM;
  }
  g->kind = MODEL_GRAMMAR_REGEX;
  g->err = err ? err : dummy, g->err_len = err ? err_len : sizeof dummy;
  rx_t x = {.g = g, .p = pattern, .n = len};
  if (x.n > 0 && pattern[0] == '^') x.i = 1;
  rx_frag_t f = rx_alt(&x);
  if (f.start >= 0 && x.i < x.n) rx_err(&x, "unbalanced ) in the regex");
  if (x.rc || f.start < 0) {
    int rc = x.rc ? x.rc : FR_EFORMAT;
    model_grammar_destroy(g);
    return rc;
  }
  g->nfa_start = f.start, g->nfa_accept = f.end;
  g->err = NULL;
  *out = g;
  return 0;
}

/* ---- simulation ---- */

static bool rx_has(const uint64_t *set, int32_t s) { return set[s >> 6] >> (s & 63) & 1; }

/* Adds s and what epsilon moves reach from it. */
static void rx_close(const model_grammar_t *g, uint64_t *set, int32_t s0) {
  int32_t stack[MODEL_GRAMMAR_MAX_NFA];
  int sp = 0;
  if (s0 < 0 || rx_has(set, s0)) return;
  set[s0 >> 6] |= 1ull << (s0 & 63);
  stack[sp++] = s0;
  while (sp > 0) {
    const gnfa_t *st = &g->nfa[stack[--sp]];
    if (!st->eps) continue;
    int32_t outs[2] = {st->out, st->out2};
    for (int k = 0; k < 2; k++)
      if (outs[k] >= 0 && !rx_has(set, outs[k]) && sp < MODEL_GRAMMAR_MAX_NFA) {
        set[outs[k] >> 6] |= 1ull << (outs[k] & 63);
        stack[sp++] = outs[k];
      }
  }
}

void model__regex_init(const model_grammar_t *g, model_gstate_t *s) {
  memset(s->nfa, 0, sizeof s->nfa);
  rx_close(g, s->nfa, g->nfa_start);
  s->n = 1;
}

bool model__regex_step(const model_grammar_t *g, model_gstate_t *s, unsigned c) {
  uint64_t next[MODEL_GRAMMAR_MAX_NFA / 64] = {0};
  uint32_t words = (g->n_nfa + 63) / 64;
  bool any = false;
  for (uint32_t w = 0; w < words; w++)
    for (uint64_t bits = s->nfa[w]; bits; bits &= bits - 1) {
      int32_t i = (int32_t)(w * 64 + (uint32_t)__builtin_ctzll(bits));
      const gnfa_t *st = &g->nfa[i];
      if (!st->eps && (st->cls[c >> 6] >> (c & 63) & 1)) rx_close(g, next, st->out), any = true;
    }
  memcpy(s->nfa, next, words * sizeof *next);
  s->n = any;
  return any;
}

bool model__regex_accepting(const model_grammar_t *g, const model_gstate_t *s) {
  return s->n > 0 && rx_has(s->nfa, g->nfa_accept);
}
