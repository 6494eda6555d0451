/* grammar.c - JSON schemas compiled into a pushdown machine over bytes,
 * the machine, and token masks. The regex kind is grammar_regex.c. See
 * grammar.h. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/fr_err.h"
#include "model/grammar.h"
#include "model/grammar_internal.h"
#include "model/tokenizer.h"

#define G_MAX_DIGITS 16   /* digits of a number's integer or fraction part */
#define G_MAX_LITS 64     /* enum values, properties of one object */
#define G_MAX_NEST 32     /* schema nesting ($ref chains included) */
#define G_MAX_NODES 65536

/* ---- building ---- */

static int g_err(model_grammar_t *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int g_err(model_grammar_t *g, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g->err, g->err_len, fmt, ap);
  va_end(ap);
  return FR_EFORMAT;
}

static int32_t g_node(model_grammar_t *g, uint8_t kind) {
  if (g->n_nodes == G_MAX_NODES) return -1;
  if (g->n_nodes == g->cap_nodes) {
    g->cap_nodes = g->cap_nodes ? 2 * g->cap_nodes : 16;
    gnode_t *p = realloc(g->nodes, g->cap_nodes * sizeof *p);
    if (!p) return -1;
    g->nodes = p;
  }
  g->nodes[g->n_nodes] = (gnode_t){.kind = kind, .items = -1, .max = UINT32_MAX, .last_req = -1};
  return (int32_t)g->n_nodes++;
}

/* Appends a string to the pool of literals / property names; its index. */
static int32_t g_str(model_grammar_t *g, const char *s, size_t n) {
  if (g->n_strs == g->cap_strs) {
    g->cap_strs = g->cap_strs ? 2 * g->cap_strs : 16;
    gstr_t *p = realloc(g->strs, g->cap_strs * sizeof *p);
    if (!p) return -1;
    g->strs = p;
  }
  char *c = malloc(n + 1);
  if (!c) return -1;
  memcpy(c, s, n);
  c[n] = 0;
  g->strs[g->n_strs] = (gstr_t){.s = c, .len = (uint32_t)n, .node = -1};
  return (int32_t)g->n_strs++;
}

static int32_t g_alt(model_grammar_t *g, int32_t node) {
  if (g->n_alts == g->cap_alts) {
    g->cap_alts = g->cap_alts ? 2 * g->cap_alts : 16;
    int32_t *p = realloc(g->alts, g->cap_alts * sizeof *p);
    if (!p) return -1;
    g->alts = p;
  }
  g->alts[g->n_alts] = node;
  return (int32_t)g->n_alts++;
}

static int32_t g_lits(model_grammar_t *g, const char *const *lits, size_t n) {
  int32_t id = g_node(g, GN_LIT);
  if (id < 0) return -1;
  g->nodes[id].first = g->n_strs;
  g->nodes[id].n = (uint32_t)n;
  for (size_t i = 0; i < n; i++)
    if (g_str(g, lits[i], strlen(lits[i])) < 0) return -1;
  return id;
}

static int g_compile(model_grammar_t *g, json_t *root, json_t *s, int depth, int32_t *out);

static bool g_key_known(const char *k) {
  static const char *const ok[] = {"type", "properties", "required", "additionalProperties", "items", "minItems",
                                   "maxItems", "minLength", "maxLength", "enum", "const", "anyOf", "oneOf", "$ref",
                                   "$defs", "definitions", "title", "description", "default", "examples", "$schema",
                                   "$id", "strict", "$comment"};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
    if (!strcmp(k, ok[i])) return true;
  return false;
}

/* enum / const: the values' compact JSON texts. */
static int g_compile_enum(model_grammar_t *g, json_t *vals, int32_t *out) {
  size_t n = json_array_size(vals), i;
  json_t *v;
  if (n == 0 || n > G_MAX_LITS) return g_err(g, "'enum' must have 1 to %d values", G_MAX_LITS);
  int32_t id = g_node(g, GN_LIT);
  if (id < 0) return -ENOMEM;
  g->nodes[id].first = g->n_strs;
  g->nodes[id].n = (uint32_t)n;
  json_array_foreach(vals, i, v) {
    char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_PRESERVE_ORDER);
    int32_t k = t ? g_str(g, t, strlen(t)) : -1;
    free(t);
    if (k < 0) return -ENOMEM;
  }
  *out = id;
  return 0;
}

static int g_uint(model_grammar_t *g, json_t *s, const char *key, uint32_t *v) {
  json_t *x = json_object_get(s, key);
  if (!x) return 0;
  if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > UINT32_MAX - 1)
    return g_err(g, "'%s' must be a non-negative integer", key);
  *v = (uint32_t)json_integer_value(x);
  return 0;
}

static int g_compile_object(model_grammar_t *g, json_t *root, json_t *s, int depth, int32_t *out) {
  json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
  json_t *ap = json_object_get(s, "additionalProperties");
  if (props && !json_is_object(props)) return g_err(g, "'properties' must be an object");
  if (req && !json_is_array(req)) return g_err(g, "'required' must be a list");
  if (!props || json_object_size(props) == 0) {
    if (json_is_object(ap) && json_object_size(ap)) return g_err(g, "'additionalProperties' as a schema is not supported");
    if (req && json_array_size(req)) return g_err(g, "'required' names properties the schema does not define");
    *out = json_is_false(ap) ? g->n_emptyobj : g->n_anyobj;
    return 0;
  }
  if (ap && !json_is_false(ap) && !json_is_true(ap) && !(json_is_object(ap) && json_object_size(ap) == 0))
    return g_err(g, "'additionalProperties' as a schema is not supported");
  if (json_is_true(ap) || (json_is_object(ap)))
    return g_err(g, "'additionalProperties': true with 'properties' is not supported (use false)");
  size_t n = json_object_size(props);
  if (n > G_MAX_LITS) return g_err(g, "more than %d properties in one object", G_MAX_LITS);
  int32_t id = g_node(g, GN_OBJ);
  if (id < 0) return -ENOMEM;
  uint32_t first = g->n_strs;
  const char *k;
  json_t *v;
  json_object_foreach(props, k, v) {
    for (const char *c = k; *c; c++)
      if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20)
        return g_err(g, "property name '%.64s' needs escapes, which are not supported", k);
    if (g_str(g, k, strlen(k)) < 0) return -ENOMEM;
  }
  uint32_t i = 0;
  json_object_foreach(props, k, v) {
    int32_t child;
    int rc = g_compile(g, root, v, depth + 1, &child);
    if (rc) return rc;
    g->strs[first + i].node = child;
    i++;
  }
  size_t r;
  json_t *name;
  int32_t last_req = -1;
  json_array_foreach(req, r, name) {
    if (!json_is_string(name)) return g_err(g, "'required' must list strings");
    bool found = false;
    for (i = 0; i < n; i++)
      if (!strcmp(g->strs[first + i].s, json_string_value(name))) {
        g->strs[first + i].required = true;
        found = true;
        if ((int32_t)i > last_req) last_req = (int32_t)i;
      }
    if (!found) return g_err(g, "'required' names '%.64s', which is not in 'properties'", json_string_value(name));
  }
  g->nodes[id].first = first;
  g->nodes[id].n = (uint32_t)n;
  g->nodes[id].last_req = last_req;
  *out = id;
  return 0;
}

static int g_compile_array(model_grammar_t *g, json_t *root, json_t *s, int depth, int32_t *out) {
  json_t *items = json_object_get(s, "items");
  int32_t child = g->n_any;
  if (items && !json_is_object(items) && !json_is_boolean(items)) return g_err(g, "'items' must be a schema");
  if (json_is_object(items)) {
    int rc = g_compile(g, root, items, depth + 1, &child);
    if (rc) return rc;
  }
  int32_t id = g_node(g, GN_ARR);
  if (id < 0) return -ENOMEM;
  uint32_t mn = 0, mx = UINT32_MAX;
  if (g_uint(g, s, "minItems", &mn) || g_uint(g, s, "maxItems", &mx)) return FR_EFORMAT;
  if (mn > mx) return g_err(g, "'minItems' is more than 'maxItems'");
  g->nodes[id].items = child;
  g->nodes[id].min = mn;
  g->nodes[id].max = mx;
  *out = id;
  return 0;
}

/* One type name of s. */
static int g_compile_type(model_grammar_t *g, json_t *root, json_t *s, const char *t, int depth, int32_t *out) {
  if (!strcmp(t, "object")) return g_compile_object(g, root, s, depth, out);
  if (!strcmp(t, "array")) return g_compile_array(g, root, s, depth, out);
  if (!strcmp(t, "boolean")) return *out = g->n_bool, 0;
  if (!strcmp(t, "null")) return *out = g->n_null, 0;
  if (!strcmp(t, "number")) return *out = g->n_num, 0;
  if (!strcmp(t, "integer")) return *out = g->n_int, 0;
  if (strcmp(t, "string")) return g_err(g, "type '%.32s' is not supported", t);
  uint32_t mn = 0, mx = UINT32_MAX;
  if (g_uint(g, s, "minLength", &mn) || g_uint(g, s, "maxLength", &mx)) return FR_EFORMAT;
  if (mn == 0 && mx == UINT32_MAX) return *out = g->n_str, 0;
  if (mn > mx) return g_err(g, "'minLength' is more than 'maxLength'");
  int32_t id = g_node(g, GN_STR);
  if (id < 0) return -ENOMEM;
  g->nodes[id].min = mn;
  g->nodes[id].max = mx;
  *out = id;
  return 0;
}

/* anyOf / oneOf, or a list of types: an ANYOF node over the alternatives. */
static int g_compile_alts(model_grammar_t *g, json_t *root, json_t *s, json_t *list, bool types, int depth, int32_t *out) {
  size_t n = json_array_size(list), i;
  json_t *v;
  if (n == 0 || n > G_MAX_LITS) return g_err(g, "'%s' must have 1 to %d entries", types ? "type" : "anyOf", G_MAX_LITS);
  int32_t kids[G_MAX_LITS];
  json_array_foreach(list, i, v) {
    int rc = types ? (json_is_string(v) ? g_compile_type(g, root, s, json_string_value(v), depth, &kids[i])
                                        : g_err(g, "'type' must list strings"))
                   : g_compile(g, root, v, depth + 1, &kids[i]);
    if (rc) return rc;
  }
  if (n == 1) return *out = kids[0], 0;
  int32_t id = g_node(g, GN_ANYOF);
  if (id < 0) return -ENOMEM;
  g->nodes[id].first = g->n_alts;
  g->nodes[id].n = (uint32_t)n;
  for (i = 0; i < n; i++)
    if (g_alt(g, kids[i]) < 0) return -ENOMEM;
  *out = id;
  return 0;
}

/* "#/$defs/Name" or "#/definitions/Name" in root. */
static json_t *g_ref(json_t *root, const char *ref) {
  const char *name = NULL;
  json_t *defs = NULL;
  if (!strncmp(ref, "#/$defs/", 8)) defs = json_object_get(root, "$defs"), name = ref + 8;
  else if (!strncmp(ref, "#/definitions/", 14)) defs = json_object_get(root, "definitions"), name = ref + 14;
  return name ? json_object_get(defs, name) : NULL;
}

static int g_compile(model_grammar_t *g, json_t *root, json_t *s, int depth, int32_t *out) {
  if (depth > G_MAX_NEST) return g_err(g, "the schema nests deeper than %d (recursive $ref is not supported)", G_MAX_NEST);
  if (json_is_true(s)) return *out = g->n_any, 0;
  if (!json_is_object(s)) return g_err(g, "a schema must be an object");
  const char *k;
  json_t *v;
  json_object_foreach(s, k, v) if (!g_key_known(k)) return g_err(g, "the JSON schema keyword '%.64s' is not supported", k);
  json_t *ref = json_object_get(s, "$ref"), *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
  json_t *any = json_object_get(s, "anyOf"), *one = json_object_get(s, "oneOf"), *type = json_object_get(s, "type");
  if (ref) {
    json_t *target = json_is_string(ref) ? g_ref(root, json_string_value(ref)) : NULL;
    if (!target) return g_err(g, "'$ref' must point into #/$defs or #/definitions");
    return g_compile(g, root, target, depth + 1, out);
  }
  if (cn) {
    json_t *arr = json_pack("[O]", cn);
    int rc = arr ? g_compile_enum(g, arr, out) : -ENOMEM;
    json_decref(arr);
    return rc;
  }
  if (en) return json_is_array(en) ? g_compile_enum(g, en, out) : g_err(g, "'enum' must be a list");
  if (any || one) {
    json_t *list = any ? any : one;
    if (!json_is_array(list)) return g_err(g, "'%s' must be a list", any ? "anyOf" : "oneOf");
    return g_compile_alts(g, root, s, list, false, depth, out);
  }
  if (json_is_array(type)) return g_compile_alts(g, root, s, type, true, depth, out);
  if (json_is_string(type)) return g_compile_type(g, root, s, json_string_value(type), depth, out);
  if (type) return g_err(g, "'type' must be a string or a list of strings");
  if (json_object_get(s, "properties")) return g_compile_object(g, root, s, depth, out);
  if (json_object_get(s, "items")) return g_compile_array(g, root, s, depth, out);
  *out = g->n_any;
  return 0;
}

/* The nodes every JSON grammar has. */
static int g_base(model_grammar_t *g) {
  static const char *const tfn[] = {"true", "false", "null"}, *const tf[] = {"true", "false"}, *const nul[] = {"null"};
  g->kind = MODEL_GRAMMAR_JSON;
  g->n_any = g_node(g, GN_ANY);
  g->n_anyobj = g_node(g, GN_OBJ_ANY);
  g->n_emptyobj = g_node(g, GN_OBJ);
  g->n_anyarr = g_node(g, GN_ARR);
  g->n_str = g_node(g, GN_STR);
  g->n_num = g_node(g, GN_NUM);
  g->n_int = g_node(g, GN_INT);
  g->n_tfn = g_lits(g, tfn, 3);
  g->n_bool = g_lits(g, tf, 2);
  g->n_null = g_lits(g, nul, 1);
  if (g->n_null < 0) return -ENOMEM;
  g->nodes[g->n_anyarr].items = g->n_any;
  return 0;
}

int model_grammar_json(model_grammar_t **out, const char *schema, size_t schema_len, char *err, size_t err_len) {
  model_grammar_t *g = calloc(1, sizeof *g);
  if (!g) return -ENOMEM;
  char dummy[8];
  g->err = err ? err : dummy, g->err_len = err ? err_len : sizeof dummy;
  int rc = g_base(g);
  if (!rc && (!schema || schema_len == 0)) g->root = g->n_anyobj;
  else if (!rc) {
    json_error_t je;
    json_t *s = json_loadb(schema, schema_len, 0, &je);
    rc = s ? g_compile(g, s, s, 0, &g->root) : g_err(g, "the schema is not JSON: %s", je.text);
    json_decref(s);
  }
  if (rc) {
    model_grammar_destroy(g);
    return rc;
  }
  g->err = NULL;
  *out = g;
  return 0;
}

void model_grammar_destroy(model_grammar_t *g) {
  if (!g) return;
  for (uint32_t i = 0; i < g->n_strs; i++) free(g->strs[i].s);
  free(g->strs);
  free(g->nodes);
  free(g->alts);
  free(g->nfa);
  free(g);
}

/* ---- the machine ---- */

enum { F_VAL = 0, F_OBJ, F_ARR, F_STR, F_NUM, F_LIT };
enum { O_OPEN = 0, O_KEY, O_SKEY, O_COLON, O_VALUE, O_AFTER, O_COMMA };
enum { A_OPEN = 0, A_VALUE, A_AFTER, A_COMMA };
enum { S_N = 0, S_E, S_U1 };
enum { N_MINUS = 0, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };

static bool g_ws(unsigned c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }
static bool g_digit(unsigned c) { return c >= '0' && c <= '9'; }

static model_gframe_t *g_top(model_gstack_t *s) { return &s->f[s->depth - 1]; }

static bool g_push(model_gstack_t *s, uint8_t kind, int32_t node) {
  if (s->depth == MODEL_GRAMMAR_MAX_DEPTH) return false;
  s->f[s->depth++] = (model_gframe_t){.kind = kind, .node = node};
  return true;
}

/* The top frame finished its value: pop it, tell the parent. */
static void g_done(model_gstack_t *s) {
  s->depth--;
  if (s->depth == 0) return;
  model_gframe_t *p = g_top(s);
  if (p->kind == F_OBJ) p->st = p->st == O_KEY ? O_COLON : O_AFTER;
  else if (p->kind == F_ARR) p->a++, p->st = A_AFTER;
  p->ws = 0;
}

/* Whitespace in a frame that allows it. */
static bool g_take_ws(model_gframe_t *f) { return ++f->ws <= MODEL_GRAMMAR_MAX_WS; }

static bool g_num_accepting(const model_gframe_t *f) {
  return f->st == N_ZERO || f->st == N_INT || f->st == N_FRAC || f->st == N_EXP;
}

static bool g_lit_complete(const model_grammar_t *g, const model_gframe_t *f) {
  const gnode_t *n = &g->nodes[f->node];
  for (uint32_t i = 0; i < n->n; i++)
    if ((f->set >> i & 1) && g->strs[n->first + i].len == f->a) return true;
  return false;
}

typedef enum { G_DEAD = 0, G_OK, G_REFEED } g_res_t;

/* A value starts with c in the F_VAL top frame (node not ANYOF). */
static g_res_t g_val_start(const model_grammar_t *g, model_gstack_t *s, unsigned c) {
  model_gframe_t *f = g_top(s);
  const gnode_t *n = &g->nodes[f->node];
  int32_t node = f->node;
  uint8_t k = n->kind;
  if (k == GN_ANY) {
    if (c == '{') node = g->n_anyobj, k = GN_OBJ_ANY;
    else if (c == '[') node = g->n_anyarr, k = GN_ARR;
    else if (c == '"') node = g->n_str, k = GN_STR;
    else if (c == '-' || g_digit(c)) node = g->n_num, k = GN_NUM;
    else node = g->n_tfn, k = GN_LIT;
    n = &g->nodes[node];
  }
  *f = (model_gframe_t){.node = node};
  switch (k) {
  case GN_OBJ: case GN_OBJ_ANY: f->kind = F_OBJ; return c == '{' ? G_OK : G_DEAD;
  case GN_ARR: f->kind = F_ARR; return c == '[' ? G_OK : G_DEAD;
  case GN_STR: f->kind = F_STR; return c == '"' ? G_OK : G_DEAD;
  case GN_NUM: case GN_INT:
    f->kind = F_NUM;
    f->st = c == '-' ? N_MINUS : c == '0' ? N_ZERO : N_INT;
    f->a = c == '-' || c == '0' ? 0 : 1;
    return c == '-' || g_digit(c) ? G_OK : G_DEAD;
  case GN_LIT:
    f->kind = F_LIT;
    for (uint32_t i = 0; i < n->n; i++)
      if (g->strs[n->first + i].len > 0 && (unsigned char)g->strs[n->first + i].s[0] == c) f->set |= 1ull << i;
    f->a = 1;
    return f->set ? G_OK : G_DEAD;
  default: return G_DEAD;
  }
}

static g_res_t g_obj(const model_grammar_t *g, model_gstack_t *s, unsigned c) {
  model_gframe_t *f = g_top(s);
  const gnode_t *n = &g->nodes[f->node];
  bool any = n->kind == GN_OBJ_ANY;
  if (f->st == O_SKEY) {
    if (c == '"') {
      for (uint32_t i = 0; i < n->n; i++)
        if ((f->set >> i & 1) && g->strs[n->first + i].len == f->b) {
          f->a = i + 1, f->st = O_COLON, f->ws = 0;
          f->b = (uint32_t)g->strs[n->first + i].node; /* the value's schema */
          return G_OK;
        }
      return G_DEAD;
    }
    uint64_t set = 0;
    for (uint32_t i = 0; i < n->n; i++)
      if ((f->set >> i & 1) && g->strs[n->first + i].len > f->b && (unsigned char)g->strs[n->first + i].s[f->b] == c)
        set |= 1ull << i;
    f->set = set, f->b++;
    return set ? G_OK : G_DEAD;
  }
  if (g_ws(c)) return f->st == O_KEY || f->st == O_VALUE ? G_DEAD : g_take_ws(f) ? G_OK : G_DEAD;
  f->ws = 0;
  switch (f->st) {
  case O_OPEN: case O_COMMA:
    if (c == '"') {
      if (any) return f->st = O_KEY, g_push(s, F_STR, -1) ? G_OK : G_DEAD;
      f->set = 0;
      for (uint32_t i = f->a; i < n->n; i++) {
        f->set |= 1ull << i;
        if (g->strs[n->first + i].required) break;
      }
      f->st = O_SKEY, f->b = 0;
      return f->set ? G_OK : G_DEAD;
    }
    if (c == '}' && f->st == O_OPEN && (any || (int32_t)f->a > n->last_req)) return g_done(s), G_OK;
    return G_DEAD;
  case O_COLON:
    if (c != ':') return G_DEAD;
    f->st = O_VALUE;
    return g_push(s, F_VAL, any ? g->n_any : (int32_t)f->b) ? G_OK : G_DEAD;
  case O_AFTER:
    if (c == ',' && (any || f->a < n->n)) return f->st = O_COMMA, G_OK;
    if (c == '}' && (any || (int32_t)f->a > n->last_req)) return g_done(s), G_OK;
    return G_DEAD;
  default: return G_DEAD;
  }
}

static g_res_t g_arr(const model_grammar_t *g, model_gstack_t *s, unsigned c) {
  model_gframe_t *f = g_top(s);
  const gnode_t *n = &g->nodes[f->node];
  if (g_ws(c) && f->st != A_VALUE) return g_take_ws(f) ? G_OK : G_DEAD;
  f->ws = 0;
  if ((f->st == A_OPEN || f->st == A_AFTER) && c == ']') return f->a >= n->min ? (g_done(s), G_OK) : G_DEAD;
  if (f->st == A_AFTER) return c == ',' && f->a < n->max ? (f->st = A_COMMA, G_OK) : G_DEAD;
  if (f->st == A_OPEN && n->max == 0) return G_DEAD;
  f->st = A_VALUE;
  return g_push(s, F_VAL, n->items) ? G_REFEED : G_DEAD;
}

static bool g_hex(unsigned c) { return g_digit(c) || ((c | 32) >= 'a' && (c | 32) <= 'f'); }

/* The second byte of a UTF-8 sequence after its lead: a continuation
 * byte, narrower after E0 (no overlong forms), ED (no surrogates), F0 (no
 * overlong forms) and F4 (nothing past U+10FFFF), as RFC 3629 has it. */
static bool g_utf8_second(unsigned lead, unsigned c) {
  unsigned lo = lead == 0xE0 ? 0xA0 : lead == 0xF0 ? 0x90 : 0x80, hi = lead == 0xED ? 0x9F : lead == 0xF4 ? 0x8F : 0xBF;
  return c >= lo && c <= hi;
}

/* Continuation bytes a UTF-8 lead byte c wants (0 for ASCII). */
static uint32_t g_utf8_more(unsigned c) { return c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0; }

static g_res_t g_string(const model_grammar_t *g, model_gstack_t *s, unsigned c) {
  model_gframe_t *f = g_top(s);
  uint32_t mn = f->node >= 0 ? g->nodes[f->node].min : 0, mx = f->node >= 0 ? g->nodes[f->node].max : UINT32_MAX;
  if (f->st == S_E) {
    if (c == 'u') return f->st = S_U1, G_OK;
    return strchr("\"\\/bfnrt", (int)c) && c ? (f->st = S_N, G_OK) : G_DEAD;
  }
  if (f->st >= S_U1) {
    if (!g_hex(c)) return G_DEAD;
    f->st = f->st == S_U1 + 3 ? S_N : f->st + 1;
    return G_OK;
  }
  if (f->b > 0) { /* inside a UTF-8 sequence (b: the lead byte << 8 until the second byte, | bytes still due) */
    const unsigned lead = f->b >> 8;
    if (lead ? !g_utf8_second(lead, c) : c < 0x80 || c >= 0xC0) return G_DEAD;
    f->b = (f->b & 0xFF) - 1;
    return G_OK;
  }
  if (c == '"') return f->a >= mn ? (g_done(s), G_OK) : G_DEAD;
  if (c < 0x20 || (c >= 0x80 && c < 0xC2) || c > 0xF4) return G_DEAD; /* control, stray continuation, invalid lead */
  if (f->a >= mx) return G_DEAD;
  f->a++;
  f->b = g_utf8_more(c) ? c << 8 | g_utf8_more(c) : 0;
  if (c == '\\') f->st = S_E;
  return G_OK;
}

static g_res_t g_num(const model_grammar_t *g, model_gstack_t *s, unsigned c) {
  model_gframe_t *f = g_top(s);
  bool integer = g->nodes[f->node].kind == GN_INT, d = g_digit(c);
  switch (f->st) {
  case N_MINUS: if (!d) return G_DEAD; f->st = c == '0' ? N_ZERO : N_INT; f->a = c != '0'; return G_OK;
  case N_DOT: if (!d) return G_DEAD; f->st = N_FRAC; f->b = 1; return G_OK;
  case N_E: if (c == '+' || c == '-') return f->st = N_ESIGN, G_OK; /* fall through */
  case N_ESIGN: if (!d) return G_DEAD; f->st = N_EXP; f->b = 1; return G_OK;
  default: break;
  }
  if (d && f->st == N_INT && f->a < G_MAX_DIGITS) return f->a++, G_OK;
  if (d && (f->st == N_FRAC || f->st == N_EXP) && f->b < (f->st == N_EXP ? 3u : G_MAX_DIGITS)) return f->b++, G_OK;
  if (!integer && c == '.' && (f->st == N_ZERO || f->st == N_INT)) return f->st = N_DOT, G_OK;
  if (!integer && (c == 'e' || c == 'E') && f->st != N_EXP) return f->st = N_E, G_OK;
  if (d) return G_DEAD; /* too many digits, or a digit after a leading 0 */
  return g_num_accepting(f) ? (g_done(s), G_REFEED) : G_DEAD;
}

static g_res_t g_lit(const model_grammar_t *g, model_gstack_t *s, unsigned c) {
  model_gframe_t *f = g_top(s);
  const gnode_t *n = &g->nodes[f->node];
  uint64_t set = 0;
  for (uint32_t i = 0; i < n->n; i++) {
    const gstr_t *l = &g->strs[n->first + i];
    if ((f->set >> i & 1) && l->len > f->a && (unsigned char)l->s[f->a] == c) set |= 1ull << i;
  }
  if (set) return f->set = set, f->a++, G_OK;
  return g_lit_complete(g, f) ? (g_done(s), G_REFEED) : G_DEAD;
}

static bool g_step(const model_grammar_t *g, model_gstack_t *s, unsigned c, model_gstate_t *forks);

/* F_VAL of an ANYOF node: each alternative is a stack of its own. */
static bool g_fork(const model_grammar_t *g, model_gstack_t *s, unsigned c, model_gstate_t *forks) {
  const gnode_t *n = &g->nodes[g_top(s)->node];
  model_gstack_t base;
  memcpy(&base, s, offsetof(model_gstack_t, f) + s->depth * sizeof s->f[0]);
  bool alive = false;
  for (uint32_t i = 0; i < n->n; i++) {
    model_gstack_t t;
    memcpy(&t, &base, offsetof(model_gstack_t, f) + base.depth * sizeof base.f[0]);
    g_top(&t)->node = g->alts[n->first + i];
    if (!g_step(g, &t, c, forks)) continue;
    if (!alive) memcpy(s, &t, offsetof(model_gstack_t, f) + t.depth * sizeof t.f[0]), alive = true;
    else if (forks && forks->n < MODEL_GRAMMAR_MAX_FORKS)
      memcpy(&forks->s[forks->n++], &t, offsetof(model_gstack_t, f) + t.depth * sizeof t.f[0]);
  }
  return alive;
}

/* Feeds c to one stack; false when it dies. Forks go to forks. */
static bool g_step(const model_grammar_t *g, model_gstack_t *s, unsigned c, model_gstate_t *forks) {
  for (int guard = 0; guard < 2 * MODEL_GRAMMAR_MAX_DEPTH + 4; guard++) {
    if (s->depth == 0) return false; /* the value is whole: nothing may follow */
    model_gframe_t *f = g_top(s);
    g_res_t r;
    switch (f->kind) {
    case F_VAL:
      if (g_ws(c)) return g_take_ws(f);
      if (g->nodes[f->node].kind == GN_ANYOF) return g_fork(g, s, c, forks);
      r = g_val_start(g, s, c);
      break;
    case F_OBJ: r = g_obj(g, s, c); break;
    case F_ARR: r = g_arr(g, s, c); break;
    case F_STR: r = g_string(g, s, c); break;
    case F_NUM: r = g_num(g, s, c); break;
    default: r = g_lit(g, s, c); break;
    }
    if (r != G_REFEED) return r == G_OK;
  }
  return false;
}

/* ---- states ---- */

static size_t g_stack_bytes(const model_gstack_t *s) { return offsetof(model_gstack_t, f) + s->depth * sizeof s->f[0]; }

/* Copies the live part of a state. */
static void g_copy(const model_grammar_t *g, model_gstate_t *dst, const model_gstate_t *src) {
  if (g->kind == MODEL_GRAMMAR_REGEX) {
    memcpy(dst->nfa, src->nfa, ((g->n_nfa + 63) / 64) * sizeof(uint64_t));
    dst->n = src->n;
    return;
  }
  dst->n = src->n;
  for (int i = 0; i < src->n; i++) memcpy(&dst->s[i], &src->s[i], g_stack_bytes(&src->s[i]));
}

void model_gstate_init(const model_grammar_t *g, model_gstate_t *s) {
  if (g->kind == MODEL_GRAMMAR_REGEX) {
    model__regex_init(g, s);
    return;
  }
  s->n = 1;
  s->s[0].depth = 0;
  g_push(&s->s[0], F_VAL, g->root);
}

static bool g_feed_byte(const model_grammar_t *g, model_gstate_t *s, unsigned c) {
  if (g->kind == MODEL_GRAMMAR_REGEX) return model__regex_step(g, s, c);
  int n = s->n, w = 0;
  for (int i = 0; i < n; i++) { /* forks land at the end; they already took c */
    int before = s->n;
    bool ok = g_step(g, &s->s[i], c, s);
    (void)before;
    if (ok) {
      if (w != i) memcpy(&s->s[w], &s->s[i], g_stack_bytes(&s->s[i]));
      w++;
    }
  }
  for (int i = n; i < s->n; i++, w++)
    if (w != i) memcpy(&s->s[w], &s->s[i], g_stack_bytes(&s->s[i]));
  s->n = w;
  return w > 0;
}

bool model_gstate_feed(const model_grammar_t *g, model_gstate_t *s, const char *bytes, size_t n) {
  for (size_t i = 0; i < n && s->n > 0; i++)
    if (!g_feed_byte(g, s, (unsigned char)bytes[i])) return false;
  return s->n > 0;
}

static bool g_stack_can_end(const model_grammar_t *g, const model_gstack_t *s) {
  if (s->depth == 0) return true;
  if (s->depth != 1) return false;
  const model_gframe_t *f = &s->f[0];
  return (f->kind == F_NUM && g_num_accepting(f)) || (f->kind == F_LIT && g_lit_complete(g, f));
}

bool model_gstate_can_end(const model_grammar_t *g, const model_gstate_t *s) {
  if (g->kind == MODEL_GRAMMAR_REGEX) return model__regex_accepting(g, s);
  for (int i = 0; i < s->n; i++)
    if (g_stack_can_end(g, &s->s[i])) return true;
  return false;
}

bool model_gstate_must_end(const model_grammar_t *g, const model_gstate_t *s) {
  if (g->kind == MODEL_GRAMMAR_REGEX) return false;
  for (int i = 0; i < s->n; i++)
    if (s->s[i].depth != 0) return false;
  return s->n > 0;
}

/* ---- masks ---- */

/* Tokens in byte order with the prefix each shares with the one before,
 * so a walk reuses the state of the shared prefix (a trie walk without
 * the trie) and skips every token under a prefix that died. The records
 * and the bytes are laid out in that order, so a walk reads them
 * front to back. */
typedef struct {
  int32_t id;
  uint32_t off;      /* its bytes: bytes[off .. + len] */
  uint16_t len, lcp; /* lcp: bytes shared with the previous one */
  uint32_t up;       /* the first k' > k with lcp < this one's (n: none): every token in between shares lcp
                      * bytes with this one, so a walk that skips a dead prefix jumps over them */
} gtok_t;

typedef struct {
  gtok_t *tok; /* (n) */
  char *bytes;
  uint32_t n;
} gorder_t;

struct model_gvocab {
  int n_vocab;
  uint32_t *off, *len; /* (n_vocab) bytes of token t: bytes[off[t] .. + len[t]]; len 0 = never allowed */
  char *bytes;
  uint8_t *eog;        /* (n_vocab) end-of-generation tokens */
  uint32_t *plain;     /* (words) tokens that are plain string content: no '"', '\\' or control byte, whole UTF-8 */
  size_t n_plain;
  gorder_t all, other; /* every token; those not plain */
  /* Inside a free string a token that is plain up to a '"' or '\\' (at a
   * character boundary) is allowed when what follows from there is: the
   * plain part leaves the state as it was (but for the character count).
   * Those ends, each once, sorted; and the tokens of each. The other
   * tokens that are not plain (a control byte, broken UTF-8) never are. */
  gorder_t tails;      /* tok[k].id: the tail's index */
  uint32_t *tail_first, *tail_ids; /* tokens of tail i: tail_ids[tail_first[i] .. tail_first[i + 1]) */
  uint32_t n_tails;
  int32_t *eog_ids;    /* (n_eog) */
  uint32_t n_eog;
  uint32_t max_len;
};

struct model_gscratch {
  model_gstate_t *st;  /* (max_len + 1): the state after each prefix length of the token walked */
  uint32_t *tail_mask; /* (n_tails + 31) / 32 words: the tails allowed */
};

/* A token's bytes, for sorting (qsort takes no context). */
typedef struct {
  const char *b;
  uint32_t len;
  int32_t id;
} gkey_t;

static int g_key_cmp(const void *a, const void *b) {
  const gkey_t *x = a, *y = b;
  int c = memcmp(x->b, y->b, x->len < y->len ? x->len : y->len);
  return c ? c : (x->len > y->len) - (x->len < y->len);
}

/* Plain string content: printable, no quote or backslash, UTF-8 from a
 * character boundary (the last character may be cut: the string takes
 * its first bytes and waits for the rest, as g_string does). */
static bool g_plain(const unsigned char *b, uint32_t n) {
  for (uint32_t i = 0; i < n;) {
    unsigned c = b[i];
    if (c < 0x20 || c == '"' || c == '\\' || (c >= 0x80 && c < 0xC2) || c > 0xF4) return false;
    uint32_t k = g_utf8_more(c);
    if (i + k >= n) k = n - 1 - i; /* a sequence cut at the end */
    for (uint32_t j = 1; j <= k; j++)
      if (j == 1 ? !g_utf8_second(c, b[i + j]) : b[i + j] < 0x80 || b[i + j] >= 0xC0) return false;
    i += k + 1;
  }
  return true;
}

/* The up links by a stack of the records still waiting for a smaller lcp. */
static int g_order_up(gorder_t *o) {
  uint32_t *stack = malloc(((size_t)o->n + 1) * sizeof *stack), top = 0;
  if (!stack) return -ENOMEM;
  for (uint32_t k = 0; k < o->n; k++) {
    while (top && o->tok[stack[top - 1]].lcp > o->tok[k].lcp) o->tok[stack[--top]].up = k;
    stack[top++] = k;
  }
  while (top) o->tok[stack[--top]].up = o->n;
  free(stack);
  return 0;
}

/* The records of the sorted keys, their bytes copied in that order. */
static int g_order_fill(gorder_t *o, const gkey_t *keys, size_t total) {
  if (!(o->tok = malloc(((size_t)o->n + 1) * sizeof *o->tok)) || !(o->bytes = malloc(total + 1))) return -ENOMEM;
  size_t at = 0;
  for (uint32_t k = 0; k < o->n; k++) {
    const gkey_t *x = &keys[k];
    uint32_t l = 0;
    while (k && l < x->len && l < keys[k - 1].len && x->b[l] == keys[k - 1].b[l]) l++;
    o->tok[k] = (gtok_t){.id = x->id, .off = (uint32_t)at, .len = (uint16_t)x->len, .lcp = (uint16_t)l};
    memcpy(o->bytes + at, x->b, x->len);
    at += x->len;
  }
  return g_order_up(o);
}

static int g_order(model_gvocab_t *v, gorder_t *o, bool other) {
  gkey_t *keys = malloc((size_t)v->n_vocab * sizeof *keys);
  if (!keys) return -ENOMEM;
  size_t total = 0;
  o->n = 0;
  for (int t = 0; t < v->n_vocab; t++)
    if (v->len[t] && (!other || !(v->plain[t / 32] >> (t % 32) & 1))) {
      keys[o->n++] = (gkey_t){.b = v->bytes + v->off[t], .len = v->len[t], .id = t};
      total += v->len[t];
    }
  qsort(keys, o->n, sizeof *keys, g_key_cmp);
  int rc = g_order_fill(o, keys, total);
  free(keys);
  return rc;
}

static int g_vocab_tokens(model_gvocab_t *v, const model_tokenizer_t *tok) {
  size_t total = 0, cap = (size_t)v->n_vocab * 8 + 16;
  v->bytes = malloc(cap);
  if (!v->bytes) return -ENOMEM;
  for (int t = 0; t < v->n_vocab; t++) {
    size_t n = 0;
    const char *b = model_token_bytes(tok, t, &n);
    v->eog[t] = model_token_is_eog(tok, t);
    if (!b || n == 0 || n > 1024 || model_token_is_control(tok, t) || v->eog[t]) continue;
    if (total + n > cap) {
      char *p = realloc(v->bytes, cap = 2 * (total + n));
      if (!p) return -ENOMEM;
      v->bytes = p;
    }
    memcpy(v->bytes + total, b, n);
    v->off[t] = (uint32_t)total, v->len[t] = (uint32_t)n;
    total += n;
    if (n > v->max_len) v->max_len = (uint32_t)n;
    if (g_plain((const unsigned char *)b, (uint32_t)n)) v->plain[t / 32] |= 1u << (t % 32);
  }
  return 0;
}

/* Where a token stops being plain string content: the offset of its
 * first '"' or '\\' at a character boundary, or -1 when it has a byte a
 * string never takes there first (a control byte, broken UTF-8). */
static long g_plain_end(const unsigned char *b, uint32_t n) {
  for (uint32_t i = 0; i < n;) {
    unsigned c = b[i];
    if (c == '"' || c == '\\') return (long)i;
    if (c < 0x20 || (c >= 0x80 && c < 0xC2) || c > 0xF4) return -1;
    uint32_t k = g_utf8_more(c);
    if (i + k >= n) k = n - 1 - i;
    for (uint32_t j = 1; j <= k; j++)
      if (j == 1 ? !g_utf8_second(c, b[i + j]) : b[i + j] < 0x80 || b[i + j] >= 0xC0) return -1;
    i += k + 1;
  }
  return (long)n;
}

/* Distinct tails in order, each with its tokens (keys sorted). */
static int g_tails_index(model_gvocab_t *v, gkey_t *keys, uint32_t n) {
  uint32_t u = 0;
  v->tail_first = malloc(((size_t)n + 1) * sizeof *v->tail_first);
  v->tail_ids = malloc(((size_t)n + 1) * sizeof *v->tail_ids);
  gkey_t *uniq = malloc(((size_t)n + 1) * sizeof *uniq);
  if (!v->tail_first || !v->tail_ids || !uniq) {
    free(uniq);
    return -ENOMEM;
  }
  size_t total = 0;
  for (uint32_t k = 0; k < n; k++) {
    if (!k || g_key_cmp(&keys[k - 1], &keys[k])) {
      v->tail_first[u] = k;
      uniq[u] = (gkey_t){.b = keys[k].b, .len = keys[k].len, .id = (int32_t)u};
      total += keys[k].len, u++;
    }
    v->tail_ids[k] = (uint32_t)keys[k].id;
  }
  v->tail_first[u] = n;
  v->n_tails = v->tails.n = u;
  int rc = g_order_fill(&v->tails, uniq, total);
  free(uniq);
  return rc;
}

static int g_tails(model_gvocab_t *v) {
  gkey_t *keys = malloc(((size_t)v->other.n + 1) * sizeof *keys);
  if (!keys) return -ENOMEM;
  uint32_t n = 0;
  for (uint32_t k = 0; k < v->other.n; k++) {
    const gtok_t *t = &v->other.tok[k];
    const char *b = v->other.bytes + t->off;
    long at = g_plain_end((const unsigned char *)b, t->len);
    if (at >= 0 && at < t->len) keys[n++] = (gkey_t){.b = b + at, .len = t->len - (uint32_t)at, .id = t->id};
  }
  qsort(keys, n, sizeof *keys, g_key_cmp);
  int rc = g_tails_index(v, keys, n);
  free(keys);
  return rc;
}

/* The end-of-generation ids and the count of plain tokens. */
static int g_vocab_counts(model_gvocab_t *v) {
  if (!(v->eog_ids = malloc(((size_t)v->n_vocab + 1) * sizeof *v->eog_ids))) return -ENOMEM;
  for (int t = 0; t < v->n_vocab; t++)
    if (v->eog[t]) v->eog_ids[v->n_eog++] = t;
  for (uint32_t w = 0; w < model_gvocab_words(v); w++) v->n_plain += (size_t)__builtin_popcount(v->plain[w]);
  return 0;
}

int model_gvocab_create(model_gvocab_t **out, const model_tokenizer_t *tok, int n_vocab) {
  model_gvocab_t *v = calloc(1, sizeof *v);
  if (!v) return -ENOMEM;
  v->n_vocab = n_vocab;
  v->off = calloc((size_t)n_vocab, sizeof *v->off);
  v->len = calloc((size_t)n_vocab, sizeof *v->len);
  v->eog = calloc((size_t)n_vocab, 1);
  v->plain = calloc(model_gvocab_words(v), sizeof *v->plain);
  if (!v->off || !v->len || !v->eog || !v->plain || g_vocab_tokens(v, tok) || g_order(v, &v->all, false) ||
      g_order(v, &v->other, true) || g_tails(v) || g_vocab_counts(v)) {
    model_gvocab_destroy(v);
    return -ENOMEM;
  }
  *out = v;
  return 0;
}

void model_gvocab_destroy(model_gvocab_t *v) {
  if (!v) return;
  free(v->off), free(v->len), free(v->bytes), free(v->eog), free(v->plain);
  free(v->all.tok), free(v->all.bytes), free(v->other.tok), free(v->other.bytes);
  free(v->tails.tok), free(v->tails.bytes), free(v->tail_first), free(v->tail_ids), free(v->eog_ids);
  free(v);
}

uint32_t model_gvocab_words(const model_gvocab_t *v) { return (uint32_t)((v->n_vocab + 31) / 32); }

int model_gscratch_create(model_gscratch_t **out, const model_gvocab_t *v) {
  model_gscratch_t *s = calloc(1, sizeof *s);
  if (!s || !(s->st = malloc((v->max_len + 1) * sizeof *s->st)) ||
      !(s->tail_mask = malloc(((v->n_tails + 31) / 32 + 1) * sizeof *s->tail_mask))) {
    model_gscratch_destroy(s);
    return -ENOMEM;
  }
  *out = s;
  return 0;
}

void model_gscratch_destroy(model_gscratch_t *s) {
  if (!s) return;
  free(s->st);
  free(s->tail_mask);
  free(s);
}

/* Inside a string whose length is not bounded, at a character boundary:
 * every plain token keeps the output valid whatever the stack holds; when
 * its minimum length is reached too (*min_met), a token's plain part
 * changes nothing that matters. */
static bool g_in_free_string(const model_grammar_t *g, const model_gstate_t *s, bool *min_met) {
  if (g->kind != MODEL_GRAMMAR_JSON || s->n != 1 || s->s[0].depth == 0) return false;
  const model_gframe_t *f = &s->s[0].f[s->s[0].depth - 1];
  *min_met = f->node < 0 || f->a >= g->nodes[f->node].min;
  return f->kind == F_STR && f->st == S_N && f->b == 0 && (f->node < 0 || g->nodes[f->node].max == UINT32_MAX);
}


/* The first token after k that does not begin with token k's first d
 * bytes: the tokens that do follow k in order, so jumping up the lcp
 * chain passes over each level of them at once. */
static uint32_t g_skip(const gorder_t *o, uint32_t k, uint32_t d) {
  uint32_t j = k + 1;
  while (j < o->n && o->tok[j].lcp >= d) j = o->tok[j].up;
  return j;
}

/* Walks the tokens of o from state s; sets the bits of those it may take.
 * A prefix that dies skips every token under it. */
static size_t g_walk(const model_grammar_t *g, const model_gstate_t *s, const gorder_t *o, uint32_t *mask,
                     model_gstate_t *st) {
  size_t n = 0;
  uint32_t have = 0; /* st[0..have] hold the walked prefix */
  g_copy(g, &st[0], s);
  for (uint32_t k = 0; k < o->n;) {
    const gtok_t *t = &o->tok[k];
    if (t->lcp < have) have = t->lcp;
    const char *b = o->bytes + t->off;
    bool alive = true;
    for (; have < t->len; have++) {
      g_copy(g, &st[have + 1], &st[have]);
      if (!g_feed_byte(g, &st[have + 1], (unsigned char)b[have])) {
        alive = false;
        break;
      }
    }
    if (alive) {
      mask[t->id / 32] |= 1u << (t->id % 32), n++;
      k++;
    } else
      k = g_skip(o, k, have + 1); /* every token that shares the prefix that died */
  }
  return n;
}

/* In a free string whose minimum is met: the tokens whose tail (from
 * their first '"' or '\\') is allowed from s. */
static size_t g_walk_tails(const model_grammar_t *g, const model_gstate_t *s, const model_gvocab_t *v, uint32_t *mask,
                           model_gscratch_t *scratch) {
  memset(scratch->tail_mask, 0, (v->n_tails + 31) / 32 * sizeof *scratch->tail_mask);
  g_walk(g, s, &v->tails, scratch->tail_mask, scratch->st);
  size_t n = 0;
  for (uint32_t i = 0; i < v->n_tails; i++) {
    if (!(scratch->tail_mask[i / 32] >> (i % 32) & 1)) continue;
    for (uint32_t k = v->tail_first[i]; k < v->tail_first[i + 1]; k++, n++)
      mask[v->tail_ids[k] / 32] |= 1u << (v->tail_ids[k] % 32);
  }
  return n;
}

size_t model_grammar_mask(const model_grammar_t *g, const model_gstate_t *s, const model_gvocab_t *v, uint32_t *mask,
                          model_gscratch_t *scratch) {
  uint32_t words = model_gvocab_words(v);
  memset(mask, 0, words * sizeof *mask);
  size_t n = 0;
  bool min_met = false;
  if (s->n > 0 && !model_gstate_must_end(g, s)) {
    if (g_in_free_string(g, s, &min_met)) {
      memcpy(mask, v->plain, words * sizeof *mask);
      n = v->n_plain + (min_met ? g_walk_tails(g, s, v, mask, scratch) : g_walk(g, s, &v->other, mask, scratch->st));
    } else
      n = g_walk(g, s, &v->all, mask, scratch->st);
  }
  if (n == 0 || model_gstate_can_end(g, s))
    for (uint32_t i = 0; i < v->n_eog; i++) mask[v->eog_ids[i] / 32] |= 1u << (v->eog_ids[i] % 32), n++;
  return n;
}
