/* jinja_eval.c - renders a parsed template: statements write into the
 * output buffer, expressions evaluate to values (jinja_internal.h), with
 * jinja2's semantics for undefined values, scopes (for and macro bodies
 * are scopes, if is not) and attribute/item lookup. Every node and loop
 * iteration is a step; steps, output bytes, call depth and memory are
 * capped. Also the entry points of model/jinja.h. */
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "model/jinja_internal.h"

#define MAX_NEST 2000 /* evaluation frames on the C stack, macro calls included */
#define EXEC_BREAK 1
#define EXEC_CONTINUE 2

static int exec(jinja_ctx_t *c, jinja_scope_t *sc, const jinja_node_t *n);

#define fail(c, ...) jinja_fail(&(c)->err, FR_EFORMAT, __VA_ARGS__)

void jinja_step(jinja_ctx_t *c) {
  if (++c->steps > c->max_steps) jinja_fail(&c->err, FR_ETOOBIG, "template rendering takes more than %zu steps", c->max_steps);
}

/* A scan of n entries costs n/32 steps, so big dicts cannot make small
 * templates slow. */
static void charge(jinja_ctx_t *c, size_t n) {
  c->steps += n / 32;
  jinja_step(c);
}

static jinja_value_t *dict_get(jinja_ctx_t *c, const jinja_value_t *d, const char *name, size_t n) {
  charge(c, d->d.n);
  return jinja_dict_get(d, name, n);
}

static jinja_value_t *dict_find(jinja_ctx_t *c, const jinja_value_t *d, const jinja_value_t *key) {
  charge(c, d->d.n);
  return jinja_dict_find(d, key);
}

static void out_put(jinja_ctx_t *c, const char *s, size_t n) {
  if (c->out->n + n > c->max_output)
    jinja_fail(&c->err, FR_ETOOBIG, "template output is larger than %zu bytes", c->max_output);
  jinja_buf_put(&c->ar, c->out, s, n);
}

static jinja_scope_t *scope_new(jinja_ctx_t *c, jinja_scope_t *parent) {
  jinja_scope_t *s = jinja_alloc(&c->ar, sizeof *s);
  s->parent = parent;
  s->vars = jinja_dict(&c->ar);
  return s;
}

static void scope_set(jinja_ctx_t *c, jinja_scope_t *sc, const char *name, jinja_value_t *v) {
  jinja_dict_set(&c->ar, sc->vars, jinja_cstr(&c->ar, name), v);
}

static jinja_value_t *undef_named(jinja_ctx_t *c, const char *name) {
  jinja_value_t *u = jinja_alloc(&c->ar, sizeof *u);
  u->type = JV_UNDEF;
  u->undef_name = name;
  return u;
}

static jinja_value_t *lookup(jinja_ctx_t *c, jinja_scope_t *sc, const char *name, size_t n) {
  for (; sc; sc = sc->parent) {
    jinja_value_t *v = dict_get(c, sc->vars, name, n);
    if (v) return v;
  }
  if (jinja_is_global(name)) {
    jinja_value_t *f = jinja_alloc(&c->ar, sizeof *f);
    f->type = JV_FUNC, f->fn.name = name;
    return f;
  }
  return undef_named(c, name);
}

/* ---- lookups ---- */

static jinja_value_t *method(jinja_ctx_t *c, jinja_value_t *self, const char *name) {
  jinja_value_t *f = jinja_alloc(&c->ar, sizeof *f);
  f->type = JV_FUNC, f->fn.name = name, f->fn.self = self;
  return f;
}

_Noreturn static void undefined_error(jinja_ctx_t *c, const jinja_value_t *v) {
  fail(c, "'%s' is undefined", v->undef_name ? v->undef_name : "value");
}

jinja_value_t *jinja_getattr(jinja_ctx_t *c, jinja_value_t *v, const char *name, size_t n) {
  if (v->type == JV_UNDEF) undefined_error(c, v);
  if (v->type == JV_NS) {
    jinja_value_t *r = dict_get(c, v, name, n);
    return r ? r : undef_named(c, name);
  }
  if ((v->type == JV_DICT || v->type == JV_STR) && jinja_has_method(v, name)) return method(c, v, name);
  if (v->type == JV_DICT) {
    jinja_value_t *r = dict_get(c, v, name, n);
    if (r) return r;
  }
  return undef_named(c, name);
}

/* Byte offset of code point i of s (i <= the count), for indexing. */
static size_t cp_offset(const jinja_value_t *s, size_t i) {
  size_t o = 0;
  for (; o < s->s.n && i; o++)
    if ((s->s.p[o + 1 < s->s.n ? o + 1 : o] & 0xC0) != 0x80 || o + 1 == s->s.n) i--;
  while (o < s->s.n && (s->s.p[o] & 0xC0) == 0x80) o++;
  return o;
}

static size_t cp_count(const jinja_value_t *s) {
  size_t k = 0;
  for (size_t i = 0; i < s->s.n; i++) k += (s->s.p[i] & 0xC0) != 0x80;
  return k;
}

jinja_value_t *jinja_getitem(jinja_ctx_t *c, jinja_value_t *v, jinja_value_t *key) {
  if (v->type == JV_UNDEF) undefined_error(c, v);
  if (v->type == JV_DICT || v->type == JV_NS) {
    jinja_value_t *r = dict_find(c, v, key);
    if (r) return r;
    if (key->type == JV_STR) return jinja_getattr(c, v, key->s.p, key->s.n);
    return &jinja_undef;
  }
  if (v->is_gen) fail(c, "%s", "'generator' object is not subscriptable");
  if ((v->type == JV_LIST || v->type == JV_STR) && key->type == JV_INT) {
    int64_t len = v->type == JV_LIST ? (int64_t)v->l.n : (int64_t)cp_count(v), i = key->i;
    if (i < 0) i += len;
    if (i < 0 || i >= len) return &jinja_undef;
    if (v->type == JV_LIST) return v->l.items[i];
    size_t b = cp_offset(v, (size_t)i), e = cp_offset(v, (size_t)i + 1);
    return jinja_str(&c->ar, v->s.p + b, e - b);
  }
  if (key->type == JV_STR) return jinja_getattr(c, v, key->s.p, key->s.n);
  return &jinja_undef;
}

jinja_value_t *jinja_iterate(jinja_ctx_t *c, jinja_value_t *v) {
  switch (v->type) {
  case JV_LIST: return v;
  case JV_UNDEF: return jinja_list(&c->ar, 0);
  case JV_DICT: case JV_NS: {
    jinja_value_t *l = jinja_list(&c->ar, v->d.n);
    memcpy(l->l.items, v->d.keys, v->d.n * sizeof *l->l.items);
    return l;
  }
  case JV_STR: {
    jinja_value_t *l = jinja_list(&c->ar, cp_count(v));
    for (size_t i = 0, o = 0; i < l->l.n; i++) {
      size_t e = o + 1;
      while (e < v->s.n && (v->s.p[e] & 0xC0) == 0x80) e++;
      l->l.items[i] = jinja_str(&c->ar, v->s.p + o, e - o);
      o = e;
    }
    return l;
  }
  default: fail(c, "'%s' object is not iterable", jinja_type_name(v));
  }
}

/* Python slicing of a list or str, [lo:hi:step] with None parts. */
static jinja_value_t *slice(jinja_ctx_t *c, jinja_value_t *v, jinja_value_t **p) {
  if (v->type == JV_UNDEF) undefined_error(c, v);
  if (v->type != JV_LIST && v->type != JV_STR) fail(c, "'%s' object is not subscriptable", jinja_type_name(v));
  int64_t len = v->type == JV_LIST ? (int64_t)v->l.n : (int64_t)cp_count(v);
  int64_t step = p[2] && p[2]->type == JV_INT ? p[2]->i : 1;
  if (step == 0) fail(c, "%s", "slice step cannot be zero");
  int64_t lo = step > 0 ? 0 : len - 1, hi = step > 0 ? len : -1;
  for (int k = 0; k < 2; k++) {
    if (!p[k] || p[k]->type == JV_NONE) continue;
    if (p[k]->type != JV_INT) fail(c, "%s", "slice indices must be integers");
    int64_t x = p[k]->i;
    if (x < 0) x += len;
    if (step > 0) x = x < 0 ? 0 : x > len ? len : x;
    else x = x < -1 ? -1 : x > len - 1 ? len - 1 : x;
    if (k == 0) lo = x;
    else hi = x;
  }
  jinja_value_t *src = v->type == JV_LIST ? v : jinja_iterate(c, v);
  size_t n = 0;
  for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step) n++;
  jinja_value_t *l = jinja_list(&c->ar, n);
  n = 0;
  for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step) l->l.items[n++] = src->l.items[i];
  if (v->type == JV_LIST) return l;
  jinja_buf_t b = {0};
  for (size_t i = 0; i < l->l.n; i++) jinja_buf_put(&c->ar, &b, l->l.items[i]->s.p, l->l.items[i]->s.n);
  return jinja_str(&c->ar, b.p ? b.p : "", b.n);
}

/* ---- operators ---- */

static bool is_num(const jinja_value_t *v) { return v->type == JV_INT || v->type == JV_FLOAT || v->type == JV_BOOL; }
static double fnum(const jinja_value_t *v) { return v->type == JV_FLOAT ? v->f : v->type == JV_INT ? (double)v->i : v->b; }
static int64_t inum(const jinja_value_t *v) { return v->type == JV_INT ? v->i : v->type == JV_BOOL ? v->b : 0; }

static jinja_value_t *concat_lists(jinja_ctx_t *c, const jinja_value_t *a, const jinja_value_t *b) {
  jinja_value_t *l = jinja_list(&c->ar, a->l.n + b->l.n);
  if (a->l.n) memcpy(l->l.items, a->l.items, a->l.n * sizeof *l->l.items);
  if (b->l.n) memcpy(l->l.items + a->l.n, b->l.items, b->l.n * sizeof *l->l.items);
  return l;
}

static jinja_value_t *repeat(jinja_ctx_t *c, const jinja_value_t *s, int64_t k) {
  if (k <= 0) return s->type == JV_STR ? jinja_str(&c->ar, "", 0) : jinja_list(&c->ar, 0);
  size_t unit = s->type == JV_STR ? s->s.n : s->l.n;
  if (unit && (uint64_t)k > c->max_output / unit) jinja_fail(&c->err, FR_ETOOBIG, "%s", "repetition is too large");
  if (s->type == JV_STR) {
    jinja_buf_t b = {0};
    for (int64_t i = 0; i < k; i++) jinja_buf_put(&c->ar, &b, s->s.p, s->s.n);
    return jinja_str(&c->ar, b.p ? b.p : "", b.n);
  }
  jinja_value_t *l = jinja_list(&c->ar, unit * (size_t)k);
  for (int64_t i = 0; i < k; i++) memcpy(l->l.items + (size_t)i * unit, s->l.items, unit * sizeof *l->l.items);
  return l;
}

static bool contains(jinja_ctx_t *c, jinja_value_t *hay, jinja_value_t *needle) {
  if (hay->type == JV_STR) {
    if (needle->type != JV_STR) fail(c, "'in <string>' requires string as left operand, not %s", jinja_type_name(needle));
    return needle->s.n == 0 || memmem(hay->s.p, hay->s.n, needle->s.p, needle->s.n);
  }
  if (hay->type == JV_DICT || hay->type == JV_NS) return dict_find(c, hay, needle) != NULL;
  if (hay->type == JV_LIST) {
    charge(c, hay->l.n);
    for (size_t i = 0; i < hay->l.n; i++)
      if (jinja_equal(hay->l.items[i], needle)) return true;
    return false;
  }
  if (hay->type == JV_UNDEF) return false; /* jinja2's Undefined iterates as empty */
  fail(c, "argument of type '%s' is not iterable", jinja_type_name(hay));
}

/* Markup + str (or str + Markup): the plain one is HTML-escaped as
 * markupsafe does, and the sum is Markup. */
static jinja_value_t *markup_add(jinja_ctx_t *c, const jinja_value_t *a, const jinja_value_t *b) {
  jinja_buf_t s = {0};
  for (int k = 0; k < 2; k++) {
    const jinja_value_t *v = k ? b : a;
    size_t run = 0;
    for (size_t i = 0; i < v->s.n && !v->is_safe; i++) {
      char ch = v->s.p[i];
      const char *esc = ch == '&' ? "&amp;" : ch == '<' ? "&lt;" : ch == '>' ? "&gt;" : ch == '"' ? "&#34;"
                      : ch == '\'' ? "&#39;" : NULL;
      if (!esc) continue;
      jinja_buf_put(&c->ar, &s, v->s.p + run, i - run);
      jinja_buf_puts(&c->ar, &s, esc);
      run = i + 1;
    }
    jinja_buf_put(&c->ar, &s, v->s.p + (v->is_safe ? 0 : run), v->s.n - (v->is_safe ? 0 : run));
  }
  jinja_value_t *r = jinja_str(&c->ar, s.p ? s.p : "", s.n);
  r->is_safe = true;
  return r;
}

static jinja_value_t *arith(jinja_ctx_t *c, int op, jinja_value_t *a, jinja_value_t *b) {
  if (a->type == JV_UNDEF) undefined_error(c, a);
  if (b->type == JV_UNDEF) undefined_error(c, b);
  if (op == JOP_ADD && a->type == JV_STR && b->type == JV_STR && a->is_safe != b->is_safe) return markup_add(c, a, b);
  if (op == JOP_ADD && a->type == JV_STR && b->type == JV_STR) {
    jinja_buf_t s = {0};
    jinja_buf_put(&c->ar, &s, a->s.p, a->s.n);
    jinja_buf_put(&c->ar, &s, b->s.p, b->s.n);
    jinja_value_t *r = jinja_str(&c->ar, s.p ? s.p : "", s.n);
    r->is_safe = a->is_safe; /* Markup + Markup is Markup */
    return r;
  }
  if (op == JOP_ADD && a->type == JV_LIST && b->type == JV_LIST) return concat_lists(c, a, b);
  if (op == JOP_MUL && (a->type == JV_STR || a->type == JV_LIST) && b->type == JV_INT) return repeat(c, a, b->i);
  if (op == JOP_MUL && (b->type == JV_STR || b->type == JV_LIST) && a->type == JV_INT) return repeat(c, b, a->i);
  if (!is_num(a) || !is_num(b)) fail(c, "unsupported operand types for an arithmetic operator: '%s'", jinja_type_name(a));
  bool ints = a->type != JV_FLOAT && b->type != JV_FLOAT;
  int64_t x = inum(a), y = inum(b);
  double fx = fnum(a), fy = fnum(b);
  switch (op) {
  case JOP_ADD: return ints ? jinja_int(&c->ar, (int64_t)((uint64_t)x + (uint64_t)y)) : jinja_float(&c->ar, fx + fy);
  case JOP_SUB: return ints ? jinja_int(&c->ar, (int64_t)((uint64_t)x - (uint64_t)y)) : jinja_float(&c->ar, fx - fy);
  case JOP_MUL: return ints ? jinja_int(&c->ar, (int64_t)((uint64_t)x * (uint64_t)y)) : jinja_float(&c->ar, fx * fy);
  case JOP_DIV:
    if (fy == 0) fail(c, "%s", "division by zero");
    return jinja_float(&c->ar, fx / fy);
  case JOP_FLOORDIV: case JOP_MOD:
    if (ints ? y == 0 : fy == 0) fail(c, "%s", "integer division or modulo by zero");
    if (ints) {
      if (y == -1) return jinja_int(&c->ar, op == JOP_MOD ? 0 : (int64_t)(0 - (uint64_t)x));
      int64_t q = x / y, r = x % y;
      if (r && ((r < 0) != (y < 0))) q--, r += y;
      return jinja_int(&c->ar, op == JOP_MOD ? r : q);
    } else {
      double q = __builtin_floor(fx / fy), r = fx - q * fy;
      return jinja_float(&c->ar, op == JOP_MOD ? r : q);
    }
  default: { /* JOP_POW */
    if (ints && y >= 0) {
      int64_t r = 1;
      for (int64_t i = 0; i < y && i < 64; i++) r = (int64_t)((uint64_t)r * (uint64_t)x);
      return jinja_int(&c->ar, r);
    }
    return jinja_float(&c->ar, __builtin_pow(fx, fy));
  }
  }
}

static jinja_value_t *binop(jinja_ctx_t *c, int op, jinja_value_t *a, jinja_value_t *b) {
  switch (op) {
  case JOP_CONCAT: {
    jinja_buf_t s = {0};
    jinja_to_str(&c->ar, &s, a);
    jinja_to_str(&c->ar, &s, b);
    return jinja_str(&c->ar, s.p ? s.p : "", s.n);
  }
  case JOP_EQ: return jinja_bool(jinja_equal(a, b));
  case JOP_NE: return jinja_bool(!jinja_equal(a, b));
  case JOP_LT: return jinja_bool(jinja_compare(&c->err, a, b) < 0);
  case JOP_LE: return jinja_bool(jinja_compare(&c->err, a, b) <= 0);
  case JOP_GT: return jinja_bool(jinja_compare(&c->err, a, b) > 0);
  case JOP_GE: return jinja_bool(jinja_compare(&c->err, a, b) >= 0);
  case JOP_IN: return jinja_bool(contains(c, b, a));
  case JOP_NOTIN: return jinja_bool(!contains(c, b, a));
  default: return arith(c, op, a, b);
  }
}

/* ---- calls ---- */

static void eval_args(jinja_ctx_t *c, jinja_scope_t *sc, const jinja_node_t *call, jinja_args_t *a) {
  *a = (jinja_args_t){0};
  if (!call->n_kids) return;
  a->args = jinja_alloc(&c->ar, call->n_kids * sizeof *a->args);
  a->kw_names = jinja_alloc(&c->ar, call->n_kids * sizeof *a->kw_names);
  a->kw_vals = jinja_alloc(&c->ar, call->n_kids * sizeof *a->kw_vals);
  for (size_t i = 0; i < call->n_kids; i++) {
    const jinja_node_t *k = call->kids[i];
    if (k->type == JN_KWARG) {
      a->kw_names[a->n_kw] = k->s;
      a->kw_vals[a->n_kw++] = jinja_eval(c, sc, k->a);
    } else {
      a->args[a->n_args++] = jinja_eval(c, sc, k);
    }
  }
}

static jinja_value_t *call_macro(jinja_ctx_t *c, jinja_value_t *m, const jinja_args_t *a) {
  const jinja_node_t *def = m->m.node;
  if (++c->depth > c->max_depth) jinja_fail(&c->err, FR_ETOOBIG, "macro calls nest deeper than %zu", c->max_depth);
  jinja_scope_t *sc = scope_new(c, c->root);
  if (a->n_args > def->n_kids) fail(c, "macro '%s' takes fewer arguments", def->s);
  for (size_t i = 0; i < def->n_kids; i++) {
    const jinja_node_t *p = def->kids[i];
    const char *name = p->s; /* a NAME or a KWARG with its default */
    jinja_value_t *v = i < a->n_args ? a->args[i] : NULL;
    for (size_t k = 0; k < a->n_kw; k++)
      if (!strcmp(a->kw_names[k], name)) v = a->kw_vals[k];
    if (!v) v = p->type == JN_KWARG ? jinja_eval(c, sc, p->a) : undef_named(c, name);
    scope_set(c, sc, name, v);
  }
  if (m->m.caller) {
    jinja_value_t *caller = jinja_alloc(&c->ar, sizeof *caller);
    *caller = (jinja_value_t){.type = JV_MACRO, .m = {.node = m->m.caller, .caller_scope = m->m.caller_scope}};
    scope_set(c, sc, "caller", caller);
  }
  jinja_buf_t buf = {0}, *saved = c->out;
  c->out = &buf;
  exec(c, sc, def->body);
  c->out = saved;
  c->depth--;
  return jinja_str(&c->ar, buf.p ? buf.p : "", buf.n);
}

/* caller(): a call block's body, in the scope of the call. */
static jinja_value_t *call_caller(jinja_ctx_t *c, jinja_value_t *m) {
  if (++c->depth > c->max_depth) jinja_fail(&c->err, FR_ETOOBIG, "macro calls nest deeper than %zu", c->max_depth);
  jinja_buf_t buf = {0}, *saved = c->out;
  c->out = &buf;
  exec(c, scope_new(c, m->m.caller_scope), m->m.node);
  c->out = saved;
  c->depth--;
  return jinja_str(&c->ar, buf.p ? buf.p : "", buf.n);
}

static jinja_value_t *call(jinja_ctx_t *c, jinja_value_t *fn, const jinja_args_t *a) {
  if (fn->type == JV_MACRO) return fn->m.node->type == JN_MACRO ? call_macro(c, fn, a) : call_caller(c, fn);
  if (fn->type == JV_FUNC) return jinja_call_builtin(c, fn->fn.name, fn->fn.self, a);
  if (fn->type == JV_UNDEF) undefined_error(c, fn);
  fail(c, "'%s' object is not callable", jinja_type_name(fn));
}

jinja_value_t *jinja_call_value(jinja_ctx_t *c, jinja_value_t *fn, jinja_value_t **args, size_t n_args,
                                const char **kw_names, jinja_value_t **kw_vals, size_t n_kw) {
  jinja_args_t a = {args, n_args, kw_names, kw_vals, n_kw};
  return call(c, fn, &a);
}

/* A filter chain node over input v (a filter block's chain has a NULL innermost input). */
static jinja_value_t *apply_filter(jinja_ctx_t *c, jinja_scope_t *sc, const jinja_node_t *n, jinja_value_t *input) {
  jinja_value_t *v = n->a ? (n->a->type == JN_FILTER ? apply_filter(c, sc, n->a, input) : jinja_eval(c, sc, n->a)) : input;
  jinja_args_t a;
  eval_args(c, sc, n, &a);
  c->line = n->line;
  return jinja_filter(c, n->s, v, &a);
}

/* ---- expressions ---- */

static jinja_value_t *eval_seq(jinja_ctx_t *c, jinja_scope_t *sc, const jinja_node_t *n) {
  if (n->type == JN_DICT) {
    jinja_value_t *d = jinja_dict(&c->ar);
    for (size_t i = 0; i + 1 < n->n_kids; i += 2)
      jinja_dict_set(&c->ar, d, jinja_eval(c, sc, n->kids[i]), jinja_eval(c, sc, n->kids[i + 1]));
    return d;
  }
  jinja_value_t *l = jinja_list(&c->ar, n->n_kids);
  l->is_tuple = n->type == JN_TUPLE;
  for (size_t i = 0; i < n->n_kids; i++) l->l.items[i] = jinja_eval(c, sc, n->kids[i]);
  return l;
}

static jinja_value_t *eval_node(jinja_ctx_t *c, jinja_scope_t *sc, const jinja_node_t *n) {
  c->line = n->line;
  switch (n->type) {
  case JN_LIT: return n->v;
  case JN_NAME: return lookup(c, sc, n->s, n->n);
  case JN_ATTR: return jinja_getattr(c, jinja_eval(c, sc, n->a), n->s, strlen(n->s));
  case JN_INDEX: {
    jinja_value_t *v = jinja_eval(c, sc, n->a);
    return jinja_getitem(c, v, jinja_eval(c, sc, n->b));
  }
  case JN_SLICE: {
    jinja_value_t *v = jinja_eval(c, sc, n->a), *p[3];
    for (int k = 0; k < 3; k++) p[k] = n->kids[k] ? jinja_eval(c, sc, n->kids[k]) : NULL;
    return slice(c, v, p);
  }
  case JN_CALL: {
    jinja_value_t *fn = jinja_eval(c, sc, n->a);
    jinja_args_t a;
    eval_args(c, sc, n, &a);
    c->line = n->line;
    return call(c, fn, &a);
  }
  case JN_FILTER: return apply_filter(c, sc, n, NULL);
  case JN_TEST: {
    jinja_value_t *v = jinja_eval(c, sc, n->a);
    jinja_args_t a;
    eval_args(c, sc, n, &a);
    return jinja_bool(jinja_test(c, n->s, v, &a) != (n->op != 0));
  }
  case JN_BINOP: {
    jinja_value_t *a = jinja_eval(c, sc, n->a);
    return binop(c, n->op, a, jinja_eval(c, sc, n->b));
  }
  case JN_NEG: case JN_POS: {
    jinja_value_t *v = jinja_eval(c, sc, n->a);
    if (n->type == JN_POS && is_num(v)) return v;
    if (v->type == JV_FLOAT) return jinja_float(&c->ar, -v->f);
    if (v->type == JV_INT || v->type == JV_BOOL) return jinja_int(&c->ar, (int64_t)(0 - (uint64_t)inum(v)));
    fail(c, "bad operand type for unary -: '%s'", jinja_type_name(v));
  }
  case JN_NOT: return jinja_bool(!jinja_truthy(jinja_eval(c, sc, n->a)));
  case JN_AND: {
    jinja_value_t *a = jinja_eval(c, sc, n->a);
    return jinja_truthy(a) ? jinja_eval(c, sc, n->b) : a;
  }
  case JN_OR: {
    jinja_value_t *a = jinja_eval(c, sc, n->a);
    return jinja_truthy(a) ? a : jinja_eval(c, sc, n->b);
  }
  case JN_COND:
    if (jinja_truthy(jinja_eval(c, sc, n->a))) return jinja_eval(c, sc, n->b);
    return n->c ? jinja_eval(c, sc, n->c) : &jinja_undef;
  case JN_LIST: case JN_TUPLE: case JN_DICT: return eval_seq(c, sc, n);
  default: fail(c, "%s", "bad expression");
  }
}

jinja_value_t *jinja_eval(jinja_ctx_t *c, jinja_scope_t *sc, const jinja_node_t *n) {
  jinja_step(c);
  if (++c->nest > MAX_NEST) jinja_fail(&c->err, FR_ETOOBIG, "template evaluation nests deeper than %d", MAX_NEST);
  jinja_value_t *v = eval_node(c, sc, n);
  c->nest--;
  return v;
}

/* ---- statements ---- */

static void assign(jinja_ctx_t *c, jinja_scope_t *sc, const jinja_node_t *target, jinja_value_t *v) {
  if (target->type == JN_NAME) return scope_set(c, sc, target->s, v);
  if (target->type == JN_ATTR) {
    jinja_value_t *ns = jinja_eval(c, sc, target->a);
    if (ns->type != JV_NS) fail(c, "%s", "cannot assign attribute on non-namespace object");
    return jinja_dict_set(&c->ar, ns, jinja_cstr(&c->ar, target->s), v);
  }
  if (target->type != JN_TUPLE) fail(c, "%s", "cannot assign to this expression");
  jinja_value_t *l = jinja_iterate(c, v);
  if (l->l.n != target->n_kids) fail(c, "%s", "wrong number of values to unpack");
  for (size_t i = 0; i < target->n_kids; i++) assign(c, sc, target->kids[i], l->l.items[i]);
}

static void set_loop(jinja_ctx_t *c, jinja_value_t *loop, jinja_value_t *items, size_t i) {
  size_t n = items->l.n;
  jinja_arena_t *a = &c->ar;
  jinja_dict_set(a, loop, jinja_cstr(a, "index"), jinja_int(a, (int64_t)i + 1));
  jinja_dict_set(a, loop, jinja_cstr(a, "index0"), jinja_int(a, (int64_t)i));
  jinja_dict_set(a, loop, jinja_cstr(a, "revindex"), jinja_int(a, (int64_t)(n - i)));
  jinja_dict_set(a, loop, jinja_cstr(a, "revindex0"), jinja_int(a, (int64_t)(n - i - 1)));
  jinja_dict_set(a, loop, jinja_cstr(a, "first"), jinja_bool(i == 0));
  jinja_dict_set(a, loop, jinja_cstr(a, "last"), jinja_bool(i + 1 == n));
  jinja_dict_set(a, loop, jinja_cstr(a, "length"), jinja_int(a, (int64_t)n));
  jinja_dict_set(a, loop, jinja_cstr(a, "previtem"), i ? items->l.items[i - 1] : &jinja_undef);
  jinja_dict_set(a, loop, jinja_cstr(a, "nextitem"), i + 1 < n ? items->l.items[i + 1] : &jinja_undef);
}

static int exec_for(jinja_ctx_t *c, jinja_scope_t *outer, const jinja_node_t *n) {
  jinja_value_t *all = jinja_iterate(c, jinja_eval(c, outer, n->b));
  jinja_scope_t *sc = scope_new(c, outer);
  jinja_value_t *items = all;
  if (n->c) { /* for x in xs if cond: the loop sees only the kept items */
    items = jinja_list(&c->ar, all->l.n);
    items->l.n = 0;
    for (size_t i = 0; i < all->l.n; i++) {
      jinja_step(c);
      assign(c, sc, n->a, all->l.items[i]);
      if (jinja_truthy(jinja_eval(c, sc, n->c))) items->l.items[items->l.n++] = all->l.items[i];
    }
  }
  jinja_value_t *loop = jinja_dict(&c->ar);
  for (size_t i = 0; i < items->l.n; i++) {
    jinja_step(c);
    assign(c, sc, n->a, items->l.items[i]);
    set_loop(c, loop, items, i);
    scope_set(c, sc, "loop", loop);
    if (exec(c, sc, n->body) == EXEC_BREAK) break;
  }
  if (!items->l.n && n->orelse) return exec(c, outer, n->orelse);
  return 0;
}

static jinja_value_t *render_block(jinja_ctx_t *c, jinja_scope_t *sc, const jinja_node_t *body) {
  jinja_buf_t buf = {0}, *saved = c->out;
  c->out = &buf;
  exec(c, sc, body);
  c->out = saved;
  return jinja_str(&c->ar, buf.p ? buf.p : "", buf.n);
}

static int exec_stmt(jinja_ctx_t *c, jinja_scope_t *sc, const jinja_node_t *n) {
  switch (n->type) {
  case JN_TEXT: out_put(c, n->s, n->n); return 0;
  case JN_OUTPUT: {
    jinja_value_t *v = jinja_eval(c, sc, n->a);
    if (v->type == JV_STR) out_put(c, v->s.p, v->s.n);
    else {
      jinja_buf_t b = {0};
      jinja_to_str(&c->ar, &b, v);
      out_put(c, b.p, b.n);
    }
    return 0;
  }
  case JN_IF:
    if (jinja_truthy(jinja_eval(c, sc, n->a))) return exec(c, sc, n->body);
    return n->orelse ? exec(c, sc, n->orelse) : 0;
  case JN_FOR: return exec_for(c, sc, n);
  case JN_SET: assign(c, sc, n->a, jinja_eval(c, sc, n->b)); return 0;
  case JN_SETBLOCK: {
    jinja_value_t *v = render_block(c, sc, n->body);
    assign(c, sc, n->a, n->c ? apply_filter(c, sc, n->c, v) : v);
    return 0;
  }
  case JN_MACRO: {
    jinja_value_t *m = jinja_alloc(&c->ar, sizeof *m);
    m->type = JV_MACRO, m->m.node = n;
    scope_set(c, sc, n->s, m);
    return 0;
  }
  case JN_CALLBLOCK: {
    jinja_value_t *fn = jinja_eval(c, sc, n->a->a);
    if (fn->type != JV_MACRO) fail(c, "%s", "call blocks need a macro");
    jinja_value_t *m = jinja_alloc(&c->ar, sizeof *m);
    *m = *fn;
    m->m.caller = n->body, m->m.caller_scope = sc;
    jinja_args_t a;
    eval_args(c, sc, n->a, &a);
    jinja_value_t *v = call(c, m, &a);
    out_put(c, v->s.p, v->s.n);
    return 0;
  }
  case JN_FILTERBLOCK: {
    jinja_value_t *v = apply_filter(c, sc, n->a, render_block(c, sc, n->body));
    jinja_value_t *s = jinja_str_of(&c->ar, v);
    out_put(c, s->s.p, s->s.n);
    return 0;
  }
  case JN_BODY: return exec(c, sc, n); /* {% generation %}'s body */
  case JN_BREAK: return EXEC_BREAK;
  case JN_CONTINUE: return EXEC_CONTINUE;
  default: fail(c, "%s", "bad statement");
  }
}

static int exec(jinja_ctx_t *c, jinja_scope_t *sc, const jinja_node_t *n) {
  if (n->type != JN_BODY) return exec_stmt(c, sc, n);
  if (++c->nest > MAX_NEST) jinja_fail(&c->err, FR_ETOOBIG, "template evaluation nests deeper than %d", MAX_NEST);
  int r = 0;
  for (size_t i = 0; i < n->n_kids && !r; i++) {
    jinja_step(c);
    c->line = n->kids[i]->line;
    r = exec_stmt(c, sc, n->kids[i]);
  }
  c->nest--;
  return r;
}

/* ---- entry points ---- */

int model_jinja_parse(model_jinja_t **out, const char *src, size_t len) {
  *out = NULL;
  model_jinja_t *t = fr_calloc(1, sizeof *t);
  jinja_err_t err = {0};
  t->arena.err = &err;
  if (setjmp(err.jb)) {
    jinja_arena_free(&t->arena);
    free(t);
    return fr_errorf(err.code, "chat template: %s", err.msg);
  }
  jinja_tok_t *toks;
  size_t n;
  jinja_lex(&t->arena, src, len, &toks, &n);
  t->root = jinja_parse_tokens(&t->arena, toks, n);
  t->arena.err = NULL;
  *out = t;
  return 0;
}

void model_jinja_destroy(model_jinja_t *t) {
  if (!t) return;
  jinja_arena_free(&t->arena);
  free(t);
}

int model_jinja_render(const model_jinja_t *t, const json_t *vars, const model_jinja_limits_t *lim, char **out,
                       size_t *out_len) {
  *out = NULL;
  model_jinja_limits_t L = lim ? *lim : (model_jinja_limits_t){0};
  jinja_ctx_t *c = fr_calloc(1, sizeof *c);
  c->max_output = L.max_output ? L.max_output : 16u << 20;
  c->max_steps = L.max_steps ? L.max_steps : 10000000u;
  c->max_depth = L.max_depth ? L.max_depth : 64u;
  c->ar.max = L.max_memory ? L.max_memory : 256u << 20;
  c->ar.err = &c->err;
  int rc = 0;
  if (setjmp(c->err.jb)) {
    rc = fr_errorf(c->err.code, "%s", c->err.msg);
  } else {
    jinja_buf_t buf = {0};
    c->out = &buf;
    c->root = scope_new(c, NULL);
    if (vars && json_is_object(vars)) c->root->vars = jinja_from_json(&c->ar, vars, 0);
    exec(c, c->root, t->root);
    *out = fr_malloc(buf.n + 1);
    memcpy(*out, buf.p ? buf.p : "", buf.n);
    (*out)[buf.n] = 0;
    if (out_len) *out_len = buf.n;
  }
  jinja_arena_free(&c->ar);
  free(c);
  return rc;
}
