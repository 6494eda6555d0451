/* jinja_builtin.c - what chat templates call: jinja2's filters and tests,
 * Python's str and dict methods, and the globals transformers gives
 * (range, namespace, dict, raise_exception, strftime_now). Case mapping is
 * ASCII only. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "model/jinja_internal.h"
#include "model/tok_internal.h"

#define fail(c, ...) jinja_fail(&(c)->err, FR_EFORMAT, __VA_ARGS__)

/* Positional argument i, or the keyword argument name, or NULL. */
static jinja_value_t *arg(const jinja_args_t *a, size_t i, const char *name) {
  for (size_t k = 0; k < a->n_kw; k++)
    if (name && !strcmp(a->kw_names[k], name)) return a->kw_vals[k];
  return i < a->n_args ? a->args[i] : NULL;
}

static jinja_value_t *need_str(jinja_ctx_t *c, jinja_value_t *v, const char *what) {
  if (!v || v->type != JV_STR) fail(c, "%s needs a string", what);
  return v;
}

static jinja_value_t *S(jinja_ctx_t *c, jinja_buf_t *b) { return jinja_str(&c->ar, b->p ? b->p : "", b->n); }

/* ---- str helpers ---- */

/* The code point at s[i] (l: its length). */
static uint32_t cp_at(const char *s, size_t n, size_t i, int *l) {
  *l = tok__utf8_len((const unsigned char *)s + i, n - i);
  if (*l <= 0) return *l = 1, (unsigned char)s[i];
  return tok__utf8_cp((const unsigned char *)s + i, *l);
}

static bool in_chars(uint32_t cp, const jinja_value_t *chars) {
  if (!chars) return tok__is_py_space(cp);
  for (size_t i = 0; i < chars->s.n;) {
    int l;
    if (cp_at(chars->s.p, chars->s.n, i, &l) == cp) return true;
    i += (size_t)l;
  }
  return false;
}

/* str.strip/lstrip/rstrip([chars]). */
static jinja_value_t *strip(jinja_ctx_t *c, const jinja_value_t *s, const jinja_value_t *chars, bool left, bool right) {
  if (chars && chars->type == JV_NONE) chars = NULL;
  size_t b = 0, e = s->s.n;
  while (left && b < e) {
    int l;
    if (!in_chars(cp_at(s->s.p, e, b, &l), chars)) break;
    b += (size_t)l;
  }
  while (right && e > b) {
    size_t k = e - 1;
    while (k > b && ((unsigned char)s->s.p[k] & 0xC0) == 0x80) k--;
    int l;
    if (!in_chars(cp_at(s->s.p, e, k, &l), chars)) break;
    e = k;
  }
  return jinja_str(&c->ar, s->s.p + b, e - b);
}

static jinja_value_t *map_case(jinja_ctx_t *c, const jinja_value_t *s, int mode) {
  jinja_value_t *r = jinja_str(&c->ar, s->s.p, s->s.n);
  char *p = (char *)r->s.p;
  bool word = false;
  for (size_t i = 0; i < r->s.n; i++) {
    unsigned char ch = (unsigned char)p[i];
    bool alpha = isalpha(ch) || ch >= 0x80;
    if (mode == 0) p[i] = (char)toupper(ch);
    else if (mode == 1) p[i] = (char)tolower(ch);
    else if (mode == 2) p[i] = (char)(i == 0 ? toupper(ch) : tolower(ch)); /* capitalize */
    else p[i] = (char)(word ? tolower(ch) : toupper(ch));                  /* title */
    word = alpha;
  }
  return r;
}

static jinja_value_t *replace(jinja_ctx_t *c, const jinja_value_t *s, const jinja_value_t *old, const jinja_value_t *new,
                              int64_t count) {
  jinja_buf_t b = {0};
  size_t i = 0;
  int64_t done = 0;
  if (!old->s.n) { /* Python inserts `new` between every character */
    for (; i <= s->s.n && (count < 0 || done < count); done++) {
      jinja_buf_put(&c->ar, &b, new->s.p, new->s.n);
      if (i == s->s.n) return S(c, &b);
      int l;
      cp_at(s->s.p, s->s.n, i, &l);
      jinja_buf_put(&c->ar, &b, s->s.p + i, (size_t)l);
      i += (size_t)l;
    }
  } else {
    const char *hit;
    while ((count < 0 || done < count) && (hit = memmem(s->s.p + i, s->s.n - i, old->s.p, old->s.n))) {
      jinja_buf_put(&c->ar, &b, s->s.p + i, (size_t)(hit - s->s.p) - i);
      jinja_buf_put(&c->ar, &b, new->s.p, new->s.n);
      i = (size_t)(hit - s->s.p) + old->s.n;
      done++;
    }
  }
  jinja_buf_put(&c->ar, &b, s->s.p + i, s->s.n - i);
  return S(c, &b);
}

/* str.split(sep=None, maxsplit=-1). */
static jinja_value_t *split(jinja_ctx_t *c, const jinja_value_t *s, const jinja_value_t *sep, int64_t max) {
  jinja_value_t *l = jinja_list(&c->ar, 0);
  size_t cap = 0, i = 0;
  if (sep && sep->type == JV_STR && !sep->s.n) fail(c, "%s", "empty separator");
  for (;;) {
    size_t b = i, e;
    if (!sep || sep->type != JV_STR) {
      int w;
      while (b < s->s.n && tok__is_py_space(cp_at(s->s.p, s->s.n, b, &w))) b += (size_t)w;
      if (b >= s->s.n) break;
      e = b;
      if (max >= 0 && (int64_t)l->l.n >= max) e = s->s.n;
      while (e < s->s.n && !tok__is_py_space(cp_at(s->s.p, s->s.n, e, &w))) e += (size_t)w;
      i = e;
    } else {
      const char *hit = max >= 0 && (int64_t)l->l.n >= max ? NULL : memmem(s->s.p + b, s->s.n - b, sep->s.p, sep->s.n);
      e = hit ? (size_t)(hit - s->s.p) : s->s.n;
      i = e + sep->s.n;
    }
    if (l->l.n == cap) {
      cap = cap ? cap * 2 : 8;
      jinja_value_t **items = jinja_alloc(&c->ar, cap * sizeof *items);
      if (l->l.n) memcpy(items, l->l.items, l->l.n * sizeof *items);
      l->l.items = items;
    }
    l->l.items[l->l.n++] = jinja_str(&c->ar, s->s.p + b, e - b);
    if (e >= s->s.n) break;
  }
  return l;
}

static bool affix(const jinja_value_t *s, const jinja_value_t *p, bool start) {
  if (p->type == JV_LIST) {
    for (size_t i = 0; i < p->l.n; i++)
      if (affix(s, p->l.items[i], start)) return true;
    return false;
  }
  if (p->type != JV_STR || p->s.n > s->s.n) return false;
  return !memcmp(s->s.p + (start ? 0 : s->s.n - p->s.n), p->s.p, p->s.n);
}

/* ---- methods ---- */

static const char *const k_str_methods[] = {"strip", "lstrip", "rstrip", "split", "startswith", "endswith", "upper",
                                            "lower", "replace", "title", "capitalize", "join", "find", "count",
                                            "format", NULL};
static const char *const k_dict_methods[] = {"items", "keys", "values", "get", NULL};

static bool in_list(const char *const *l, const char *s) {
  for (; *l; l++)
    if (!strcmp(*l, s)) return true;
  return false;
}

bool jinja_has_method(const jinja_value_t *v, const char *name) {
  if (v->type == JV_STR) return in_list(k_str_methods, name);
  if (v->type == JV_DICT) return in_list(k_dict_methods, name);
  return false;
}

static jinja_value_t *dict_items(jinja_ctx_t *c, jinja_value_t *d) {
  jinja_value_t *l = jinja_list(&c->ar, d->d.n);
  for (size_t i = 0; i < d->d.n; i++) {
    jinja_value_t *t = jinja_list(&c->ar, 2);
    t->is_tuple = true;
    t->l.items[0] = d->d.keys[i], t->l.items[1] = d->d.vals[i];
    l->l.items[i] = t;
  }
  return l;
}

static jinja_value_t *join(jinja_ctx_t *c, jinja_value_t *seq, const jinja_value_t *sep, const jinja_value_t *attr) {
  jinja_value_t *l = jinja_iterate(c, seq);
  jinja_buf_t b = {0};
  for (size_t i = 0; i < l->l.n; i++) {
    if (i && sep) jinja_to_str(&c->ar, &b, sep);
    jinja_value_t *v = l->l.items[i];
    if (attr) v = jinja_getitem(c, v, (jinja_value_t *)attr);
    jinja_to_str(&c->ar, &b, v);
  }
  return S(c, &b);
}

/* str.format with {}, {0} and {name} fields ({{ and }} escape braces). */
static jinja_value_t *format(jinja_ctx_t *c, const jinja_value_t *s, const jinja_args_t *a) {
  jinja_buf_t b = {0};
  size_t auto_i = 0;
  for (size_t i = 0; i < s->s.n; i++) {
    char ch = s->s.p[i];
    if ((ch == '{' || ch == '}') && i + 1 < s->s.n && s->s.p[i + 1] == ch) {
      jinja_buf_put(&c->ar, &b, &ch, 1);
      i++;
      continue;
    }
    if (ch != '{') {
      jinja_buf_put(&c->ar, &b, &ch, 1);
      continue;
    }
    const char *end = memchr(s->s.p + i, '}', s->s.n - i);
    if (!end) fail(c, "%s", "format: single '{' encountered in format string");
    size_t nlen = (size_t)(end - s->s.p) - i - 1;
    char name[64];
    if (nlen >= sizeof name || memchr(s->s.p + i + 1, ':', nlen) || memchr(s->s.p + i + 1, '!', nlen))
      fail(c, "%s", "format: only {}, {N} and {name} fields are supported");
    memcpy(name, s->s.p + i + 1, nlen);
    name[nlen] = 0;
    jinja_value_t *v = NULL;
    if (!nlen) v = arg(a, auto_i++, NULL);
    else if (isdigit((unsigned char)name[0])) v = arg(a, (size_t)strtoul(name, NULL, 10), NULL);
    else v = arg(a, SIZE_MAX, name);
    if (!v) fail(c, "format: no argument for {%s}", name);
    jinja_to_str(&c->ar, &b, v);
    i = (size_t)(end - s->s.p);
  }
  return S(c, &b);
}

static jinja_value_t *str_method(jinja_ctx_t *c, const char *m, jinja_value_t *s, const jinja_args_t *a) {
  if (!strcmp(m, "format")) return format(c, s, a);
  jinja_value_t *a0 = arg(a, 0, NULL), *a1 = arg(a, 1, NULL);
  if (!strcmp(m, "strip")) return strip(c, s, a0, true, true);
  if (!strcmp(m, "lstrip")) return strip(c, s, a0, true, false);
  if (!strcmp(m, "rstrip")) return strip(c, s, a0, false, true);
  if (!strcmp(m, "upper")) return map_case(c, s, 0);
  if (!strcmp(m, "lower")) return map_case(c, s, 1);
  if (!strcmp(m, "capitalize")) return map_case(c, s, 2);
  if (!strcmp(m, "title")) return map_case(c, s, 3);
  if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
    if (!a0) fail(c, "%s needs an argument", m);
    return jinja_bool(affix(s, a0, m[0] == 's'));
  }
  if (!strcmp(m, "split")) {
    jinja_value_t *mx = arg(a, 1, "maxsplit");
    return split(c, s, arg(a, 0, "sep"), mx && mx->type == JV_INT ? mx->i : -1);
  }
  if (!strcmp(m, "replace")) {
    jinja_value_t *n = arg(a, 2, "count");
    return replace(c, s, need_str(c, a0, "replace"), need_str(c, a1, "replace"), n && n->type == JV_INT ? n->i : -1);
  }
  if (!strcmp(m, "join")) return join(c, a0 ? a0 : &jinja_undef, s, NULL);
  need_str(c, a0, m);
  const char *hit = a0->s.n ? memmem(s->s.p, s->s.n, a0->s.p, a0->s.n) : s->s.p;
  if (!strcmp(m, "find")) return jinja_int(&c->ar, hit ? (int64_t)(hit - s->s.p) : -1);
  int64_t k = 0; /* count */
  for (size_t i = 0; a0->s.n && (hit = memmem(s->s.p + i, s->s.n - i, a0->s.p, a0->s.n)); k++)
    i = (size_t)(hit - s->s.p) + a0->s.n;
  return jinja_int(&c->ar, k);
}

static jinja_value_t *dict_method(jinja_ctx_t *c, const char *m, jinja_value_t *d, const jinja_args_t *a) {
  if (!strcmp(m, "items")) return dict_items(c, d);
  if (!strcmp(m, "get")) {
    jinja_value_t *k = arg(a, 0, NULL), *def = arg(a, 1, NULL);
    jinja_value_t *v = k ? jinja_dict_find(d, k) : NULL;
    return v ? v : def ? def : &jinja_none;
  }
  jinja_value_t *l = jinja_list(&c->ar, d->d.n);
  memcpy(l->l.items, m[0] == 'k' ? d->d.keys : d->d.vals, d->d.n * sizeof *l->l.items);
  return l;
}

/* ---- globals ---- */

static const char *const k_globals[] = {"range", "namespace", "dict", "raise_exception", "strftime_now", NULL};

bool jinja_is_global(const char *name) { return in_list(k_globals, name); }

static jinja_value_t *range(jinja_ctx_t *c, const jinja_args_t *a) {
  int64_t v[3] = {0, 0, 1};
  if (a->n_args < 1 || a->n_args > 3) fail(c, "%s", "range takes 1 to 3 arguments");
  for (size_t i = 0; i < a->n_args; i++) {
    if (a->args[i]->type != JV_INT) fail(c, "%s", "range needs integers");
    v[a->n_args == 1 ? 1 : i] = a->args[i]->i;
  }
  if (v[2] == 0) fail(c, "%s", "range step must not be zero");
  int64_t n = v[2] > 0 ? (v[1] - v[0] + v[2] - 1) / v[2] : (v[0] - v[1] - v[2] - 1) / -v[2];
  if (n < 0) n = 0;
  if ((uint64_t)n > c->max_steps) jinja_fail(&c->err, FR_ETOOBIG, "%s", "range is too large");
  jinja_value_t *l = jinja_list(&c->ar, (size_t)n);
  for (int64_t i = 0; i < n; i++) l->l.items[i] = jinja_int(&c->ar, v[0] + i * v[2]);
  return l;
}

static jinja_value_t *global(jinja_ctx_t *c, const char *name, const jinja_args_t *a) {
  if (!strcmp(name, "range")) return range(c, a);
  if (!strcmp(name, "namespace") || !strcmp(name, "dict")) {
    jinja_value_t *d = jinja_dict(&c->ar);
    d->type = name[0] == 'n' ? JV_NS : JV_DICT;
    for (size_t i = 0; i < a->n_args; i++) /* namespace(a_dict) */
      if (a->args[i]->type == JV_DICT)
        for (size_t k = 0; k < a->args[i]->d.n; k++)
          jinja_dict_set(&c->ar, d, a->args[i]->d.keys[k], a->args[i]->d.vals[k]);
    for (size_t k = 0; k < a->n_kw; k++) jinja_dict_set(&c->ar, d, jinja_cstr(&c->ar, a->kw_names[k]), a->kw_vals[k]);
    return d;
  }
  if (!strcmp(name, "raise_exception")) {
    jinja_value_t *m = arg(a, 0, NULL);
    jinja_value_t *s = m ? jinja_str_of(&c->ar, m) : jinja_cstr(&c->ar, "raise_exception");
    fail(c, "%s", s->s.p);
  }
  /* strftime_now(fmt): the local time, as datetime.now().strftime does */
  jinja_value_t *f = need_str(c, arg(a, 0, NULL), "strftime_now");
  char out[512];
  time_t now = time(NULL);
  struct tm tm;
  localtime_r(&now, &tm);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
  size_t n = strftime(out, sizeof out, f->s.p, &tm); /* the template's format */
#pragma GCC diagnostic pop
  return jinja_str(&c->ar, out, n);
}

jinja_value_t *jinja_call_builtin(jinja_ctx_t *c, const char *name, jinja_value_t *self, const jinja_args_t *a) {
  if (!self) return global(c, name, a);
  if (self->type == JV_STR) return str_method(c, name, self, a);
  return dict_method(c, name, self, a);
}

/* ---- tests ---- */

bool jinja_test(jinja_ctx_t *c, const char *t, jinja_value_t *v, const jinja_args_t *a) {
  jinja_value_t *x = arg(a, 0, NULL);
  int ty = v->type;
  if (!strcmp(t, "defined")) return ty != JV_UNDEF;
  if (!strcmp(t, "undefined")) return ty == JV_UNDEF;
  if (!strcmp(t, "none")) return ty == JV_NONE;
  if (!strcmp(t, "string")) return ty == JV_STR;
  if (!strcmp(t, "mapping")) return ty == JV_DICT;
  if (!strcmp(t, "iterable")) return ty == JV_STR || ty == JV_LIST || ty == JV_DICT || ty == JV_UNDEF;
  if (!strcmp(t, "sequence")) return ty == JV_STR || ty == JV_LIST || ty == JV_DICT;
  if (!strcmp(t, "number")) return ty == JV_INT || ty == JV_FLOAT || ty == JV_BOOL;
  if (!strcmp(t, "integer")) return ty == JV_INT;
  if (!strcmp(t, "float")) return ty == JV_FLOAT;
  if (!strcmp(t, "boolean")) return ty == JV_BOOL;
  if (!strcmp(t, "true")) return ty == JV_BOOL && v->b;
  if (!strcmp(t, "false")) return ty == JV_BOOL && !v->b;
  if (!strcmp(t, "callable")) return ty == JV_MACRO || ty == JV_FUNC;
  if (!strcmp(t, "even") || !strcmp(t, "odd")) {
    if (ty != JV_INT) fail(c, "test '%s' needs an integer", t);
    return (v->i % 2 == 0) == (t[0] == 'e');
  }
  if (!strcmp(t, "lower") || !strcmp(t, "upper")) {
    if (ty != JV_STR) return false;
    jinja_value_t *m = map_case(c, v, t[0] == 'l');
    return !memcmp(m->s.p, v->s.p, v->s.n);
  }
  if (!x) fail(c, "test '%s' is unknown or needs an argument", t);
  if (!strcmp(t, "eq") || !strcmp(t, "equalto") || !strcmp(t, "==")) return jinja_equal(v, x);
  if (!strcmp(t, "ne") || !strcmp(t, "!=")) return !jinja_equal(v, x);
  if (!strcmp(t, "sameas")) return v == x || (v->type == x->type && (ty == JV_NONE || (ty == JV_BOOL && v->b == x->b)));
  if (!strcmp(t, "lt")) return jinja_compare(&c->err, v, x) < 0;
  if (!strcmp(t, "gt")) return jinja_compare(&c->err, v, x) > 0;
  if (!strcmp(t, "in")) {
    jinja_value_t *l = jinja_iterate(c, x);
    if (x->type == JV_STR) return v->type == JV_STR && memmem(x->s.p, x->s.n, v->s.p, v->s.n);
    for (size_t i = 0; i < l->l.n; i++)
      if (jinja_equal(l->l.items[i], v)) return true;
    return false;
  }
  if (!strcmp(t, "divisibleby")) return ty == JV_INT && x->type == JV_INT && x->i && v->i % x->i == 0;
  fail(c, "no test named '%s'", t);
}

/* ---- filters ---- */

static jinja_value_t *attr_path(jinja_ctx_t *c, jinja_value_t *v, const jinja_value_t *path) {
  if (path->type != JV_STR) return jinja_getitem(c, v, (jinja_value_t *)path);
  const char *p = path->s.p;
  for (;;) {
    const char *dot = strchr(p, '.');
    size_t n = dot ? (size_t)(dot - p) : strlen(p);
    bool digits = n > 0;
    for (size_t i = 0; i < n; i++) digits &= isdigit((unsigned char)p[i]) != 0;
    jinja_value_t *k = digits ? jinja_int(&c->ar, strtoll(p, NULL, 10)) : jinja_str(&c->ar, p, n);
    v = v->type == JV_UNDEF ? v : jinja_getitem(c, v, k);
    if (!dot) return v;
    p = dot + 1;
  }
}

/* selectattr / rejectattr / select / reject. */
static jinja_value_t *select_items(jinja_ctx_t *c, jinja_value_t *seq, const jinja_args_t *a, bool attr, bool keep) {
  if (!jinja_truthy(seq)) seq = jinja_list(&c->ar, 0); /* jinja2: `if value: for item in value` */
  jinja_value_t *l = jinja_iterate(c, seq), *out = jinja_list(&c->ar, l->l.n);
  out->is_gen = true;
  size_t first = attr ? 1 : 0;
  jinja_value_t *test = arg(a, first, NULL);
  bool more = a->n_args > first + 1; /* the test's own arguments */
  jinja_args_t targs = {more ? a->args + first + 1 : NULL, more ? a->n_args - first - 1 : 0, NULL, NULL, 0};
  out->l.n = 0;
  for (size_t i = 0; i < l->l.n; i++) {
    jinja_step(c);
    jinja_value_t *v = attr ? attr_path(c, l->l.items[i], need_str(c, arg(a, 0, NULL), "selectattr")) : l->l.items[i];
    bool ok = test ? jinja_test(c, need_str(c, test, "select")->s.p, v, &targs) : jinja_truthy(v);
    if (ok == keep) out->l.items[out->l.n++] = l->l.items[i];
  }
  return out;
}

static jinja_value_t *map(jinja_ctx_t *c, jinja_value_t *seq, const jinja_args_t *a) {
  if (!jinja_truthy(seq)) seq = jinja_list(&c->ar, 0);
  jinja_value_t *l = jinja_iterate(c, seq), *out = jinja_list(&c->ar, l->l.n);
  out->is_gen = true;
  jinja_value_t *at = arg(a, SIZE_MAX, "attribute"), *def = arg(a, SIZE_MAX, "default");
  jinja_value_t *fname = at ? NULL : need_str(c, arg(a, 0, NULL), "map");
  jinja_args_t fargs = {a->n_args > 1 ? a->args + 1 : NULL, a->n_args > 1 ? a->n_args - 1 : 0, NULL, NULL, 0};
  for (size_t i = 0; i < l->l.n; i++) {
    jinja_step(c);
    jinja_value_t *v = l->l.items[i];
    if (at) {
      v = attr_path(c, v, at);
      if (v->type == JV_UNDEF && def) v = def;
    } else {
      v = jinja_filter(c, fname->s.p, v, &fargs);
    }
    out->l.items[i] = v;
  }
  return out;
}

/* jinja2's indent(width=4, first=False, blank=False). */
static jinja_value_t *indent(jinja_ctx_t *c, jinja_value_t *s, const jinja_args_t *a) {
  jinja_value_t *w = arg(a, 0, "width"), *first = arg(a, 1, "first"), *blank = arg(a, 2, "blank");
  jinja_buf_t ind = {0}, b = {0};
  if (w && w->type == JV_STR) jinja_buf_put(&c->ar, &ind, w->s.p, w->s.n);
  else
    for (int64_t i = 0; i < (w && w->type == JV_INT ? w->i : 4) && i < 256; i++) jinja_buf_puts(&c->ar, &ind, " ");
  jinja_value_t *l = split(c, s, jinja_cstr(&c->ar, "\n"), -1);
  size_t n = l->l.n;
  if (n && !l->l.items[n - 1]->s.n) n--; /* s += "\n"; s.splitlines() */
  if (first && jinja_truthy(first)) jinja_buf_put(&c->ar, &b, ind.p, ind.n);
  for (size_t i = 0; i < n; i++) {
    const jinja_value_t *line = l->l.items[i];
    if (i) jinja_buf_puts(&c->ar, &b, "\n");
    if (i && (line->s.n || (blank && jinja_truthy(blank)))) jinja_buf_put(&c->ar, &b, ind.p, ind.n);
    jinja_buf_put(&c->ar, &b, line->s.p, line->s.n);
  }
  return S(c, &b);
}

static int64_t length(jinja_ctx_t *c, jinja_value_t *v) {
  if (v->is_gen) fail(c, "%s", "object of type 'generator' has no len()");
  if (v->type == JV_STR) return (int64_t)jinja_iterate(c, v)->l.n;
  if (v->type == JV_LIST) return (int64_t)v->l.n;
  if (v->type == JV_DICT || v->type == JV_NS) return (int64_t)v->d.n;
  if (v->type == JV_UNDEF) return 0;
  fail(c, "object of type '%s' has no len()", jinja_type_name(v));
}

static jinja_value_t *to_int(jinja_ctx_t *c, jinja_value_t *v, jinja_value_t *def) {
  if (v->type == JV_INT) return v;
  if (v->type == JV_BOOL) return jinja_int(&c->ar, v->b);
  if (v->type == JV_FLOAT) return jinja_int(&c->ar, (int64_t)v->f);
  if (v->type == JV_STR) {
    char *end;
    jinja_value_t *t = strip(c, v, NULL, true, true);
    long long i = strtoll(t->s.p, &end, 10);
    if (t->s.n && !*end) return jinja_int(&c->ar, i);
    double f = strtod(t->s.p, &end);
    if (t->s.n && !*end) return jinja_int(&c->ar, (int64_t)f);
  }
  return def ? def : jinja_int(&c->ar, 0);
}

/* The sort key of v: an attribute path, lowercased for strings unless case sensitive. */
static jinja_value_t *sort_key(jinja_ctx_t *c, jinja_value_t *v, const jinja_value_t *attr, bool cs) {
  if (attr) v = attr_path(c, v, attr);
  return v->type == JV_STR && !cs ? map_case(c, v, 1) : v;
}

/* A stable merge sort of items[0..n) by keys (Python's sorted). */
static void merge_sort(jinja_ctx_t *c, jinja_value_t **items, jinja_value_t **keys, size_t n, bool rev) {
  if (n < 2) return;
  size_t h = n / 2;
  merge_sort(c, items, keys, h, rev);
  merge_sort(c, items + h, keys + h, n - h, rev);
  jinja_value_t **ti = jinja_alloc(&c->ar, n * sizeof *ti), **tk = jinja_alloc(&c->ar, n * sizeof *tk);
  size_t i = 0, j = h, k = 0;
  while (i < h || j < n) {
    bool left = j >= n || (i < h && (rev ? jinja_compare(&c->err, keys[j], keys[i]) <= 0
                                          : jinja_compare(&c->err, keys[i], keys[j]) <= 0));
    size_t from = left ? i++ : j++;
    ti[k] = items[from], tk[k++] = keys[from];
  }
  memcpy(items, ti, n * sizeof *ti);
  memcpy(keys, tk, n * sizeof *tk);
  c->steps += n / 8;
  jinja_step(c);
}

static jinja_value_t *sorted(jinja_ctx_t *c, jinja_value_t *l, const jinja_value_t *attr, bool cs, bool rev) {
  jinja_value_t *out = jinja_list(&c->ar, l->l.n);
  jinja_value_t **keys = jinja_alloc(&c->ar, (l->l.n + 1) * sizeof *keys);
  for (size_t i = 0; i < l->l.n; i++) out->l.items[i] = l->l.items[i], keys[i] = sort_key(c, l->l.items[i], attr, cs);
  merge_sort(c, out->l.items, keys, out->l.n, rev);
  return out;
}

static bool flag(const jinja_args_t *a, size_t i, const char *name) {
  jinja_value_t *v = arg(a, i, name);
  return v && jinja_truthy(v);
}

static jinja_value_t *filter_sort(jinja_ctx_t *c, const char *f, jinja_value_t *v, const jinja_args_t *a) {
  if (!strcmp(f, "dictsort")) { /* dictsort(case_sensitive=False, by='key', reverse=False) */
    if (v->type != JV_DICT) fail(c, "%s", "dictsort needs a mapping");
    jinja_value_t *by = arg(a, 1, "by"), *items = dict_items(c, v);
    jinja_value_t *path = jinja_int(&c->ar, by && jinja_is_str(by, "value") ? 1 : 0);
    return sorted(c, items, path, flag(a, 0, "case_sensitive"), flag(a, 2, "reverse"));
  }
  jinja_value_t *l = jinja_iterate(c, v);
  if (!strcmp(f, "sort")) /* sort(reverse=False, case_sensitive=False, attribute=None) */
    return sorted(c, l, arg(a, 2, "attribute"), flag(a, 1, "case_sensitive"), flag(a, 0, "reverse"));
  /* min / max (case_sensitive=False, attribute=None) */
  if (!l->l.n) return &jinja_undef;
  jinja_value_t *best = l->l.items[0], *attr = arg(a, 1, "attribute");
  bool cs = flag(a, 0, "case_sensitive");
  for (size_t i = 1; i < l->l.n; i++) {
    jinja_step(c);
    int r = jinja_compare(&c->err, sort_key(c, l->l.items[i], attr, cs), sort_key(c, best, attr, cs));
    if (f[1] == 'i' ? r < 0 : r > 0) best = l->l.items[i];
  }
  return best;
}

static jinja_value_t *filter_seq(jinja_ctx_t *c, const char *f, jinja_value_t *v, const jinja_args_t *a) {
  if (!strcmp(f, "dictsort") || !strcmp(f, "sort") || !strcmp(f, "min") || !strcmp(f, "max"))
    return filter_sort(c, f, v, a);
  if (!strcmp(f, "join")) return join(c, v, arg(a, 0, "d"), arg(a, 1, "attribute"));
  if (!strcmp(f, "selectattr") || !strcmp(f, "rejectattr")) return select_items(c, v, a, true, f[0] == 's');
  if (!strcmp(f, "select") || !strcmp(f, "reject")) return select_items(c, v, a, false, f[0] == 's');
  if (!strcmp(f, "map")) return map(c, v, a);
  if (!strcmp(f, "items")) {
    if (v->type == JV_UNDEF) return jinja_list(&c->ar, 0);
    if (v->type != JV_DICT) fail(c, "%s", "items needs a mapping");
    return dict_items(c, v);
  }
  jinja_value_t *l = jinja_iterate(c, v);
  if (!strcmp(f, "list")) {
    if (!l->is_gen) return l;
    jinja_value_t *copy = jinja_list(&c->ar, l->l.n);
    if (l->l.n) memcpy(copy->l.items, l->l.items, l->l.n * sizeof *copy->l.items);
    return copy;
  }
  if (!strcmp(f, "first")) return l->l.n ? l->l.items[0] : &jinja_undef;
  if (!strcmp(f, "last")) return l->l.n ? l->l.items[l->l.n - 1] : &jinja_undef;
  if (!strcmp(f, "reverse")) {
    if (v->type == JV_STR) {
      jinja_buf_t b = {0};
      for (size_t i = l->l.n; i-- > 0;) jinja_buf_put(&c->ar, &b, l->l.items[i]->s.p, l->l.items[i]->s.n);
      return S(c, &b);
    }
    jinja_value_t *r = jinja_list(&c->ar, l->l.n);
    for (size_t i = 0; i < l->l.n; i++) r->l.items[i] = l->l.items[l->l.n - 1 - i];
    return r;
  }
  if (!strcmp(f, "unique")) {
    jinja_value_t *r = jinja_list(&c->ar, l->l.n);
    r->l.n = 0;
    for (size_t i = 0; i < l->l.n; i++) {
      bool seen = false;
      for (size_t k = 0; k < r->l.n && !seen; k++) seen = jinja_equal(r->l.items[k], l->l.items[i]);
      if (!seen) r->l.items[r->l.n++] = l->l.items[i];
      c->steps += r->l.n / 32;
      jinja_step(c);
    }
    return r;
  }
  return NULL;
}

jinja_value_t *jinja_filter(jinja_ctx_t *c, const char *f, jinja_value_t *v, const jinja_args_t *a) {
  if (!strcmp(f, "default") || !strcmp(f, "d")) {
    jinja_value_t *def = arg(a, 0, "default_value"), *boolean = arg(a, 1, "boolean");
    bool use = v->type == JV_UNDEF || (boolean && jinja_truthy(boolean) && !jinja_truthy(v));
    return use ? (def ? def : jinja_str(&c->ar, "", 0)) : v;
  }
  if (!strcmp(f, "tojson")) {
    jinja_value_t *ind = arg(a, 0, "indent");
    jinja_buf_t b = {0};
    jinja_tojson(&c->ar, &b, v, ind && ind->type == JV_INT ? (int)(ind->i < 0 ? 0 : ind->i > 64 ? 64 : ind->i) : -1, 0);
    return S(c, &b);
  }
  if (!strcmp(f, "length") || !strcmp(f, "count")) return jinja_int(&c->ar, length(c, v));
  if (!strcmp(f, "safe")) {
    jinja_value_t *s = jinja_str_of(&c->ar, v);
    s = jinja_str(&c->ar, s->s.p, s->s.n);
    s->is_safe = true;
    return s;
  }
  if (!strcmp(f, "string")) return jinja_str_of(&c->ar, v);
  if (!strcmp(f, "int")) return to_int(c, v, arg(a, 0, "default"));
  if (!strcmp(f, "float")) {
    if (v->type == JV_FLOAT) return v;
    if (v->type == JV_INT) return jinja_float(&c->ar, (double)v->i);
    return jinja_float(&c->ar, v->type == JV_STR ? strtod(v->s.p, NULL) : 0.0);
  }
  if (!strcmp(f, "attr")) { /* Python's getattr: a dict's keys are not attributes */
    jinja_value_t *name = need_str(c, arg(a, 0, "name"), "attr");
    if (v->type == JV_DICT && !jinja_has_method(v, name->s.p)) return &jinja_undef;
    return jinja_getattr(c, v, name->s.p, name->s.n);
  }
  if (!strcmp(f, "round")) { /* round(precision=0, method='common') */
    jinja_value_t *p = arg(a, 0, "precision"), *m = arg(a, 1, "method");
    if (v->type != JV_INT && v->type != JV_FLOAT) fail(c, "%s", "round needs a number");
    double x = v->type == JV_INT ? (double)v->i : v->f, scale = 1;
    for (int64_t i = 0; p && p->type == JV_INT && i < p->i && i < 15; i++) scale *= 10;
    double y = x * scale;
    y = m && jinja_is_str(m, "floor") ? __builtin_floor(y) : m && jinja_is_str(m, "ceil") ? __builtin_ceil(y)
                                                                                     : __builtin_rint(y); /* halves to even, as Python */
    return jinja_float(&c->ar, y / scale);
  }
  if (!strcmp(f, "sum")) { /* sum(attribute=None, start=0) */
    jinja_value_t *l = jinja_iterate(c, v), *at = arg(a, 0, "attribute"), *acc = arg(a, 1, "start");
    if (!acc) acc = jinja_int(&c->ar, 0);
    for (size_t i = 0; i < l->l.n; i++) {
      jinja_step(c);
      jinja_value_t *x = at ? attr_path(c, l->l.items[i], at) : l->l.items[i];
      if ((acc->type != JV_INT && acc->type != JV_FLOAT) || (x->type != JV_INT && x->type != JV_FLOAT))
        fail(c, "%s", "sum needs numbers");
      acc = acc->type == JV_INT && x->type == JV_INT ? jinja_int(&c->ar, (int64_t)((uint64_t)acc->i + (uint64_t)x->i))
          : jinja_float(&c->ar, (acc->type == JV_INT ? (double)acc->i : acc->f) + (x->type == JV_INT ? (double)x->i : x->f));
    }
    return acc;
  }
  if (!strcmp(f, "abs")) {
    if (v->type == JV_INT) return jinja_int(&c->ar, v->i < 0 ? -v->i : v->i);
    if (v->type == JV_FLOAT) return jinja_float(&c->ar, v->f < 0 ? -v->f : v->f);
    fail(c, "%s", "abs needs a number");
  }
  jinja_value_t *r = filter_seq(c, f, v, a);
  if (r) return r;
  /* string filters */
  jinja_value_t *s = jinja_str_of(&c->ar, v);
  if (!strcmp(f, "trim")) return strip(c, s, arg(a, 0, "chars"), true, true);
  if (!strcmp(f, "upper")) return map_case(c, s, 0);
  if (!strcmp(f, "lower")) return map_case(c, s, 1);
  if (!strcmp(f, "capitalize")) return map_case(c, s, 2);
  if (!strcmp(f, "title")) return map_case(c, s, 3);
  if (!strcmp(f, "indent")) return indent(c, s, a);
  if (!strcmp(f, "replace")) {
    jinja_value_t *n = arg(a, 2, "count");
    return replace(c, s, need_str(c, arg(a, 0, "old"), "replace"), jinja_str_of(&c->ar, need_str(c, arg(a, 1, "new"), "replace")),
                   n && n->type == JV_INT ? n->i : -1);
  }
  fail(c, "no filter named '%s'", f);
}
