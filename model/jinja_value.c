/* jinja_value.c - the interpreter's arena and values: making them,
 * comparing them, and writing them as Python's str()/repr() and HF's tojson
 * (json.dumps with ensure_ascii=False) do. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "model/jinja_internal.h"

#define CHUNK_MIN (64u * 1024u)

struct jinja_chunk {
  jinja_chunk_t *next;
  size_t used, cap;
  _Alignas(16) unsigned char data[];
};

_Noreturn void jinja_fail(jinja_err_t *err, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err->msg, sizeof err->msg, fmt, ap);
  va_end(ap);
  err->code = code;
  longjmp(err->jb, 1);
}

void *jinja_alloc(jinja_arena_t *a, size_t n) {
  n = (n + 15) & ~(size_t)15;
  jinja_chunk_t *c = a->head;
  if (!c || c->cap - c->used < n) {
    size_t cap = n > CHUNK_MIN ? n : CHUNK_MIN;
    if (a->max && a->total + cap > a->max)
      jinja_fail(a->err, FR_ETOOBIG, "template rendering uses more than %zu bytes of memory", a->max);
    c = fr_malloc(sizeof *c + cap);
    c->cap = cap, c->used = 0;
    c->next = a->head;
    a->head = c;
    a->total += cap;
  }
  void *p = c->data + c->used;
  c->used += n;
  memset(p, 0, n);
  return p;
}

void jinja_arena_free(jinja_arena_t *a) {
  while (a->head) {
    jinja_chunk_t *c = a->head;
    a->head = c->next;
    free(c);
  }
  a->total = 0;
}

/* ---- making values ---- */

jinja_value_t jinja_undef = {.type = JV_UNDEF}, jinja_none = {.type = JV_NONE};
jinja_value_t jinja_true = {.type = JV_BOOL, .b = true}, jinja_false = {.type = JV_BOOL, .b = false};

jinja_value_t *jinja_str(jinja_arena_t *a, const char *p, size_t n) {
  jinja_value_t *v = jinja_alloc(a, sizeof *v + n + 1);
  char *s = (char *)(v + 1);
  if (n) memcpy(s, p, n);
  v->type = JV_STR;
  v->s.p = s, v->s.n = n;
  return v;
}

jinja_value_t *jinja_cstr(jinja_arena_t *a, const char *p) { return jinja_str(a, p, strlen(p)); }

jinja_value_t *jinja_int(jinja_arena_t *a, int64_t i) {
  jinja_value_t *v = jinja_alloc(a, sizeof *v);
  v->type = JV_INT, v->i = i;
  return v;
}

jinja_value_t *jinja_float(jinja_arena_t *a, double f) {
  jinja_value_t *v = jinja_alloc(a, sizeof *v);
  v->type = JV_FLOAT, v->f = f;
  return v;
}

jinja_value_t *jinja_bool(bool b) { return b ? &jinja_true : &jinja_false; }

jinja_value_t *jinja_list(jinja_arena_t *a, size_t n) {
  jinja_value_t *v = jinja_alloc(a, sizeof *v);
  v->type = JV_LIST;
  v->l.n = n;
  v->l.items = n ? jinja_alloc(a, n * sizeof *v->l.items) : NULL;
  return v;
}

jinja_value_t *jinja_dict(jinja_arena_t *a) {
  jinja_value_t *v = jinja_alloc(a, sizeof *v);
  v->type = JV_DICT;
  return v;
}

jinja_value_t *jinja_dict_find(const jinja_value_t *d, const jinja_value_t *key) {
  for (size_t i = 0; i < d->d.n; i++)
    if (jinja_equal(d->d.keys[i], key)) return d->d.vals[i];
  return NULL;
}

jinja_value_t *jinja_dict_get(const jinja_value_t *d, const char *key, size_t n) {
  for (size_t i = 0; i < d->d.n; i++) {
    const jinja_value_t *k = d->d.keys[i];
    if (k->type == JV_STR && k->s.n == n && !memcmp(k->s.p, key, n)) return d->d.vals[i];
  }
  return NULL;
}

static void dict_append(jinja_arena_t *a, jinja_value_t *d, jinja_value_t *k, jinja_value_t *v) {
  if (d->d.n == d->d.cap) {
    size_t cap = d->d.cap ? d->d.cap * 2 : 8;
    jinja_value_t **keys = jinja_alloc(a, cap * sizeof *keys), **vals = jinja_alloc(a, cap * sizeof *vals);
    if (d->d.n) {
      memcpy(keys, d->d.keys, d->d.n * sizeof *keys);
      memcpy(vals, d->d.vals, d->d.n * sizeof *vals);
    }
    d->d.keys = keys, d->d.vals = vals, d->d.cap = cap;
  }
  d->d.keys[d->d.n] = k;
  d->d.vals[d->d.n++] = v;
}

void jinja_dict_set(jinja_arena_t *a, jinja_value_t *d, jinja_value_t *k, jinja_value_t *v) {
  for (size_t i = 0; i < d->d.n; i++)
    if (jinja_equal(d->d.keys[i], k)) {
      d->d.vals[i] = v;
      return;
    }
  dict_append(a, d, k, v);
}

jinja_value_t *jinja_from_json(jinja_arena_t *a, const json_t *j, int depth) {
  if (depth > 64) jinja_fail(a->err, FR_ETOOBIG, "template variables nest deeper than 64");
  switch (json_typeof(j)) {
  case JSON_OBJECT: {
    jinja_value_t *d = jinja_dict(a);
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)j, k, v) dict_append(a, d, jinja_cstr(a, k), jinja_from_json(a, v, depth + 1));
    return d; /* a JSON object's keys are unique: no search */
  }
  case JSON_ARRAY: {
    jinja_value_t *l = jinja_list(a, json_array_size(j));
    for (size_t i = 0; i < l->l.n; i++) l->l.items[i] = jinja_from_json(a, json_array_get(j, i), depth + 1);
    return l;
  }
  case JSON_STRING: return jinja_str(a, json_string_value(j), json_string_length(j));
  case JSON_INTEGER: return jinja_int(a, json_integer_value(j));
  case JSON_REAL: return jinja_float(a, json_real_value(j));
  case JSON_TRUE: return &jinja_true;
  case JSON_FALSE: return &jinja_false;
  default: return &jinja_none;
  }
}

/* ---- truth, equality, order ---- */

bool jinja_truthy(const jinja_value_t *v) {
  switch (v->type) {
  case JV_BOOL: return v->b;
  case JV_INT: return v->i != 0;
  case JV_FLOAT: return v->f != 0.0;
  case JV_STR: return v->s.n > 0;
  case JV_LIST: return v->is_gen || v->l.n > 0; /* a generator is always true */
  case JV_DICT: return v->d.n > 0;
  case JV_NS: case JV_MACRO: case JV_FUNC: return true;
  default: return false;
  }
}

static bool is_num(const jinja_value_t *v) { return v->type == JV_INT || v->type == JV_FLOAT || v->type == JV_BOOL; }
static double num(const jinja_value_t *v) {
  return v->type == JV_FLOAT ? v->f : v->type == JV_INT ? (double)v->i : (double)v->b;
}

/* Values nest at most this deep where they are walked recursively (a
 * template can build deeper lists in a loop): equality compares identity
 * past it, repr and tojson fail. */
#define MAX_WALK 128

static bool equal_at(const jinja_value_t *a, const jinja_value_t *b, int depth);

bool jinja_equal(const jinja_value_t *a, const jinja_value_t *b) { return equal_at(a, b, 0); }

static bool equal_at(const jinja_value_t *a, const jinja_value_t *b, int depth) {
  if (depth > MAX_WALK) return a == b;
  if (is_num(a) && is_num(b)) {
    if (a->type != JV_FLOAT && b->type != JV_FLOAT)
      return (a->type == JV_INT ? a->i : a->b) == (b->type == JV_INT ? b->i : b->b);
    return num(a) == num(b);
  }
  if (a->type != b->type) return false;
  switch (a->type) {
  case JV_UNDEF: case JV_NONE: return true;
  case JV_STR: return a->s.n == b->s.n && !memcmp(a->s.p, b->s.p, a->s.n);
  case JV_LIST:
    if (a->l.n != b->l.n) return false;
    for (size_t i = 0; i < a->l.n; i++)
      if (!equal_at(a->l.items[i], b->l.items[i], depth + 1)) return false;
    return true;
  case JV_DICT:
    if (a->d.n != b->d.n) return false;
    for (size_t i = 0; i < a->d.n; i++) {
      const jinja_value_t *o = jinja_dict_find(b, a->d.keys[i]);
      if (!o || !equal_at(a->d.vals[i], o, depth + 1)) return false;
    }
    return true;
  default: return a == b;
  }
}

static int compare_at(jinja_err_t *e, const jinja_value_t *a, const jinja_value_t *b, int depth);

int jinja_compare(jinja_err_t *e, const jinja_value_t *a, const jinja_value_t *b) { return compare_at(e, a, b, 0); }

static int compare_at(jinja_err_t *e, const jinja_value_t *a, const jinja_value_t *b, int depth) {
  if (depth > MAX_WALK) jinja_fail(e, FR_ETOOBIG, "a value nests deeper than %d", MAX_WALK);
  if (is_num(a) && is_num(b)) {
    double x = num(a), y = num(b);
    return x < y ? -1 : x > y;
  }
  if (a->type == JV_STR && b->type == JV_STR) {
    size_t n = a->s.n < b->s.n ? a->s.n : b->s.n;
    int r = memcmp(a->s.p, b->s.p, n); /* UTF-8 byte order is code point order */
    return r ? r : (a->s.n > b->s.n) - (a->s.n < b->s.n);
  }
  if (a->type == JV_LIST && b->type == JV_LIST) {
    for (size_t i = 0; i < a->l.n && i < b->l.n; i++)
      if (!jinja_equal(a->l.items[i], b->l.items[i])) return compare_at(e, a->l.items[i], b->l.items[i], depth + 1);
    return (a->l.n > b->l.n) - (a->l.n < b->l.n);
  }
  jinja_fail(e, FR_EFORMAT, "cannot order %s and %s", jinja_type_name(a), jinja_type_name(b));
}

const char *jinja_type_name(const jinja_value_t *v) {
  static const char *const names[] = {"undefined", "NoneType", "bool", "int", "float", "str",
                                      "list", "dict", "Namespace", "Macro", "function"};
  if (v->type == JV_LIST && v->is_tuple) return "tuple";
  return v->type < FR_ARRAY_SIZE(names) ? names[v->type] : "?";
}

bool jinja_is_str(const jinja_value_t *v, const char *s) {
  return v->type == JV_STR && v->s.n == strlen(s) && !memcmp(v->s.p, s, v->s.n);
}

/* ---- writing ---- */

void jinja_buf_put(jinja_arena_t *a, jinja_buf_t *b, const char *s, size_t n) {
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 64;
    while (b->n + n + 1 > cap) cap *= 2;
    char *p = a ? jinja_alloc(a, cap) : fr_realloc(b->p, cap);
    if (a && b->n) memcpy(p, b->p, b->n);
    b->p = p, b->cap = cap;
  }
  if (n) memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
}

void jinja_buf_puts(jinja_arena_t *a, jinja_buf_t *b, const char *s) { jinja_buf_put(a, b, s, strlen(s)); }

/* Python's repr(float): the shortest digits that read back, in fixed
 * notation for exponents -4..15, else d.ddde+XX. */
static void put_float(jinja_arena_t *a, jinja_buf_t *b, double f) {
  if (isnan(f)) return jinja_buf_puts(a, b, "nan");
  if (isinf(f)) return jinja_buf_puts(a, b, f < 0 ? "-inf" : "inf");
  char e[64], digits[32], out[96];
  int prec = 1;
  for (; prec <= 17; prec++) {
    snprintf(e, sizeof e, "%.*e", prec - 1, f);
    if (strtod(e, NULL) == f) break;
  }
  char *ep = strchr(e, 'e');
  int exp = atoi(ep + 1), nd = 0;
  for (char *p = e; p < ep; p++)
    if (*p >= '0' && *p <= '9') digits[nd++] = *p;
  while (nd > 1 && digits[nd - 1] == '0') nd--;
  digits[nd] = 0;
  const char *sign = f < 0 || (f == 0 && signbit(f)) ? "-" : "";
  size_t o = (size_t)snprintf(out, sizeof out, "%s", sign);
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      o += (size_t)snprintf(out + o, sizeof out - o, "0.");
      for (int z = 0; z < -exp - 1; z++) out[o++] = '0';
      snprintf(out + o, sizeof out - o, "%s", digits);
    } else if (exp >= nd - 1) {
      o += (size_t)snprintf(out + o, sizeof out - o, "%s", digits);
      for (int z = 0; z < exp - nd + 1; z++) out[o++] = '0';
      snprintf(out + o, sizeof out - o, ".0");
    } else {
      snprintf(out + o, sizeof out - o, "%.*s.%s", exp + 1, digits, digits + exp + 1);
    }
  } else {
    snprintf(out + o, sizeof out - o, "%c%s%se%c%02d", digits[0], nd > 1 ? "." : "", digits + 1, exp < 0 ? '-' : '+',
             exp < 0 ? -exp : exp);
  }
  jinja_buf_puts(a, b, out);
}

static void put_int(jinja_arena_t *a, jinja_buf_t *b, int64_t i) {
  char t[32];
  snprintf(t, sizeof t, "%lld", (long long)i);
  jinja_buf_puts(a, b, t);
}

/* Python's repr of a str: single quotes unless the text has ' and no ". */
static void put_str_repr(jinja_arena_t *a, jinja_buf_t *b, const char *s, size_t n) {
  char q = memchr(s, '\'', n) && !memchr(s, '"', n) ? '"' : '\'';
  jinja_buf_put(a, b, &q, 1);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    char t[8];
    if (c == (unsigned char)q || c == '\\') snprintf(t, sizeof t, "\\%c", c);
    else if (c == '\n') snprintf(t, sizeof t, "\\n");
    else if (c == '\r') snprintf(t, sizeof t, "\\r");
    else if (c == '\t') snprintf(t, sizeof t, "\\t");
    else if (c < 0x20 || c == 0x7f) snprintf(t, sizeof t, "\\x%02x", c);
    else t[0] = (char)c, t[1] = 0;
    jinja_buf_puts(a, b, t);
  }
  jinja_buf_put(a, b, &q, 1);
}

static void repr_at(jinja_arena_t *a, jinja_buf_t *b, const jinja_value_t *v, int depth);

void jinja_repr(jinja_arena_t *a, jinja_buf_t *b, const jinja_value_t *v) { repr_at(a, b, v, 0); }

static void repr_at(jinja_arena_t *a, jinja_buf_t *b, const jinja_value_t *v, int depth) {
  if (depth > MAX_WALK) jinja_fail(a->err, FR_ETOOBIG, "a value nests deeper than %d", MAX_WALK);
  switch (v->type) {
  case JV_STR: return put_str_repr(a, b, v->s.p, v->s.n);
  case JV_LIST:
    if (v->is_gen) return jinja_buf_puts(a, b, "<generator object>");
    jinja_buf_puts(a, b, v->is_tuple ? "(" : "[");
    for (size_t i = 0; i < v->l.n; i++) {
      if (i) jinja_buf_puts(a, b, ", ");
      repr_at(a, b, v->l.items[i], depth + 1);
    }
    if (v->is_tuple && v->l.n == 1) jinja_buf_puts(a, b, ",");
    return jinja_buf_puts(a, b, v->is_tuple ? ")" : "]");
  case JV_DICT:
    jinja_buf_puts(a, b, "{");
    for (size_t i = 0; i < v->d.n; i++) {
      if (i) jinja_buf_puts(a, b, ", ");
      repr_at(a, b, v->d.keys[i], depth + 1);
      jinja_buf_puts(a, b, ": ");
      repr_at(a, b, v->d.vals[i], depth + 1);
    }
    return jinja_buf_puts(a, b, "}");
  default: return jinja_to_str(a, b, v);
  }
}

void jinja_to_str(jinja_arena_t *a, jinja_buf_t *b, const jinja_value_t *v) {
  switch (v->type) {
  case JV_UNDEF: return;
  case JV_NONE: return jinja_buf_puts(a, b, "None");
  case JV_BOOL: return jinja_buf_puts(a, b, v->b ? "True" : "False");
  case JV_INT: return put_int(a, b, v->i);
  case JV_FLOAT: return put_float(a, b, v->f);
  case JV_STR: return jinja_buf_put(a, b, v->s.p, v->s.n);
  case JV_LIST: case JV_DICT: return jinja_repr(a, b, v);
  case JV_NS: {
    jinja_value_t d = *v;
    d.type = JV_DICT;
    jinja_buf_puts(a, b, "<Namespace ");
    jinja_repr(a, b, &d);
    return jinja_buf_puts(a, b, ">");
  }
  case JV_MACRO: return jinja_buf_puts(a, b, "<Macro>");
  default: return jinja_buf_puts(a, b, "<function>");
  }
}

jinja_value_t *jinja_str_of(jinja_arena_t *a, const jinja_value_t *v) {
  if (v->type == JV_STR) return (jinja_value_t *)v;
  jinja_buf_t b = {0};
  jinja_to_str(a, &b, v);
  return jinja_str(a, b.p ? b.p : "", b.n);
}

static void put_json_str(jinja_arena_t *a, jinja_buf_t *b, const char *s, size_t n) {
  jinja_buf_puts(a, b, "\"");
  size_t run = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    const char *esc = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\r' ? "\\r"
                    : c == '\t' ? "\\t" : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
    char t[8];
    if (!esc && c < 0x20) snprintf(t, sizeof t, "\\u%04x", c), esc = t;
    if (!esc) continue;
    jinja_buf_put(a, b, s + run, i - run);
    jinja_buf_puts(a, b, esc);
    run = i + 1;
  }
  jinja_buf_put(a, b, s + run, n - run);
  jinja_buf_puts(a, b, "\"");
}

static void json_newline(jinja_arena_t *a, jinja_buf_t *b, int indent, int level) {
  jinja_buf_puts(a, b, "\n");
  for (int i = 0; i < indent * level; i++) jinja_buf_puts(a, b, " ");
}

/* json.dumps(v, ensure_ascii=False, indent=indent or None). */
void jinja_tojson(jinja_arena_t *a, jinja_buf_t *b, const jinja_value_t *v, int indent, int level) {
  if (level > MAX_WALK) jinja_fail(a->err, FR_ETOOBIG, "tojson: a value nests deeper than %d", MAX_WALK);
  const char *sep = indent >= 0 ? "," : ", ";
  switch (v->type) {
  case JV_NONE: case JV_UNDEF: return jinja_buf_puts(a, b, "null");
  case JV_BOOL: return jinja_buf_puts(a, b, v->b ? "true" : "false");
  case JV_FLOAT:
    if (isnan(v->f)) return jinja_buf_puts(a, b, "NaN");
    if (isinf(v->f)) return jinja_buf_puts(a, b, v->f < 0 ? "-Infinity" : "Infinity");
    return put_float(a, b, v->f);
  case JV_STR: return put_json_str(a, b, v->s.p, v->s.n);
  case JV_LIST:
    if (v->is_gen) jinja_fail(a->err, FR_EFORMAT, "Object of type generator is not JSON serializable");
    if (!v->l.n) return jinja_buf_puts(a, b, "[]");
    jinja_buf_puts(a, b, "[");
    for (size_t i = 0; i < v->l.n; i++) {
      if (i) jinja_buf_puts(a, b, sep);
      if (indent >= 0) json_newline(a, b, indent, level + 1);
      jinja_tojson(a, b, v->l.items[i], indent, level + 1);
    }
    if (indent >= 0) json_newline(a, b, indent, level);
    return jinja_buf_puts(a, b, "]");
  case JV_DICT: case JV_NS:
    if (!v->d.n) return jinja_buf_puts(a, b, "{}");
    jinja_buf_puts(a, b, "{");
    for (size_t i = 0; i < v->d.n; i++) {
      if (i) jinja_buf_puts(a, b, sep);
      if (indent >= 0) json_newline(a, b, indent, level + 1);
      const jinja_value_t *k = v->d.keys[i];
      if (k->type == JV_STR) put_json_str(a, b, k->s.p, k->s.n);
      else {
        jinja_buf_t t = {0};
        if (k->type == JV_BOOL || k->type == JV_NONE) jinja_tojson(a, &t, k, -1, 0);
        else jinja_to_str(a, &t, k);
        put_json_str(a, b, t.p ? t.p : "", t.n);
      }
      jinja_buf_puts(a, b, ": ");
      jinja_tojson(a, b, v->d.vals[i], indent, level + 1);
    }
    if (indent >= 0) json_newline(a, b, indent, level);
    return jinja_buf_puts(a, b, "}");
  case JV_INT: return put_int(a, b, v->i);
  default: jinja_fail(a->err, FR_EFORMAT, "Object of type %s is not JSON serializable", jinja_type_name(v));
  }
}
