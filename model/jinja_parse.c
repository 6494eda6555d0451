/* jinja_parse.c - the tokens of a template into a syntax tree, with
 * jinja2's grammar and precedence: ternary, or, and, not, comparisons
 * (in, not in), + -, ~, * / // %, **, unary - +, then primaries with .attr,
 * [index], [a:b:c], (call), | filter and `is` test. Statements: if/elif/
 * else, for (else, if filter), set (names, ns.attr, tuples, blocks), macro,
 * call, filter, break/continue, generation (HF's marker, rendered as is).
 * Nesting deeper than MAX_NEST fails, so the parser's recursion is bounded. */
#include <string.h>

#include "common/fr_err.h"
#include "model/jinja_internal.h"

#define MAX_NEST 256

typedef struct {
  jinja_arena_t *a;
  const jinja_tok_t *t;
  size_t n, i;
  int nest;
} parser_t;

static jinja_node_t *parse_expr(parser_t *P);
static jinja_node_t *parse_body(parser_t *P, const char *const *stops, const char **stopped);

static const jinja_tok_t *peek(parser_t *P) { return &P->t[P->i < P->n ? P->i : P->n - 1]; }
static const jinja_tok_t *next(parser_t *P) {
  const jinja_tok_t *t = peek(P);
  if (P->i < P->n - 1) P->i++;
  return t;
}

_Noreturn static void syntax(parser_t *P, const char *what) {
  const jinja_tok_t *t = peek(P);
  jinja_fail(P->a->err, FR_EFORMAT, "line %d: syntax error: %s (at '%s')", t->line, what,
             t->s ? t->s : t->type == JT_BLOCK_END ? "%}" : t->type == JT_VAR_END ? "}}" : t->type == JT_EOF ? "end" : "?");
}

static bool is_op(const jinja_tok_t *t, const char *op) { return t->type == JT_OP && !strcmp(t->s, op); }
static bool is_name(const jinja_tok_t *t, const char *n) { return t->type == JT_NAME && !strcmp(t->s, n); }
static bool accept_op(parser_t *P, const char *op) { return is_op(peek(P), op) ? (next(P), true) : false; }
static bool accept_name(parser_t *P, const char *n) { return is_name(peek(P), n) ? (next(P), true) : false; }

static void expect_op(parser_t *P, const char *op) {
  if (!accept_op(P, op)) {
    char m[32];
    snprintf(m, sizeof m, "expected '%s'", op);
    syntax(P, m);
  }
}

static const char *expect_name(parser_t *P) {
  if (peek(P)->type != JT_NAME) syntax(P, "expected a name");
  return next(P)->s;
}

static void expect_block_end(parser_t *P) {
  if (next(P)->type != JT_BLOCK_END) {
    P->i--;
    syntax(P, "expected '%}'");
  }
}

static jinja_node_t *node(parser_t *P, int type) {
  jinja_node_t *n = jinja_alloc(P->a, sizeof *n);
  n->type = (uint8_t)type;
  n->line = peek(P)->line;
  return n;
}

static void add_kid(parser_t *P, jinja_node_t *parent, jinja_node_t *kid, size_t *cap) {
  if (parent->n_kids == *cap) {
    *cap = *cap ? *cap * 2 : 4;
    jinja_node_t **k = jinja_alloc(P->a, *cap * sizeof *k);
    if (parent->n_kids) memcpy(k, parent->kids, parent->n_kids * sizeof *k);
    parent->kids = k;
  }
  parent->kids[parent->n_kids++] = kid;
}

static void enter(parser_t *P) {
  if (++P->nest > MAX_NEST) syntax(P, "nesting too deep");
}

/* ---- expressions ---- */

/* ( args ) after the '(' : positional then name=value. */
static void parse_args(parser_t *P, jinja_node_t *call) {
  size_t cap = 0;
  while (!accept_op(P, ")")) {
    if (call->n_kids && !accept_op(P, ",")) syntax(P, "expected ',' or ')'");
    if (accept_op(P, ")")) break;
    if (peek(P)->type == JT_NAME && P->i + 1 < P->n && is_op(&P->t[P->i + 1], "=")) {
      jinja_node_t *kw = node(P, JN_KWARG);
      kw->s = next(P)->s;
      next(P);
      kw->a = parse_expr(P);
      add_kid(P, call, kw, &cap);
    } else {
      add_kid(P, call, parse_expr(P), &cap);
    }
  }
}

static jinja_node_t *literal(parser_t *P, jinja_value_t *v) {
  jinja_node_t *n = node(P, JN_LIT);
  n->v = v;
  return n;
}

/* [ ... ] , ( ... ) or { k: v, ... } after the opening bracket. */
static jinja_node_t *parse_seq(parser_t *P, int type, const char *close) {
  jinja_node_t *n = node(P, type);
  size_t cap = 0;
  bool comma = false;
  while (!accept_op(P, close)) {
    if (n->n_kids && !(comma = accept_op(P, ","))) syntax(P, "expected ','");
    if (accept_op(P, close)) break;
    add_kid(P, n, parse_expr(P), &cap);
    if (type == JN_DICT) {
      expect_op(P, ":");
      add_kid(P, n, parse_expr(P), &cap);
    }
  }
  if (type == JN_TUPLE && n->n_kids == 1 && !comma) return n->kids[0]; /* (x) is x */
  return n;
}

static jinja_node_t *parse_primary(parser_t *P) {
  const jinja_tok_t *t = next(P);
  switch (t->type) {
  case JT_NAME:
    if (!strcmp(t->s, "true") || !strcmp(t->s, "True")) return literal(P, &jinja_true);
    if (!strcmp(t->s, "false") || !strcmp(t->s, "False")) return literal(P, &jinja_false);
    if (!strcmp(t->s, "none") || !strcmp(t->s, "None")) return literal(P, &jinja_none);
    jinja_node_t *n = node(P, JN_NAME);
    n->s = t->s, n->n = t->n;
    return n;
  case JT_STRING: {
    jinja_buf_t b = {0};
    jinja_buf_put(P->a, &b, t->s, t->n);
    while (peek(P)->type == JT_STRING) { /* 'a' 'b' */
      const jinja_tok_t *u = next(P);
      jinja_buf_put(P->a, &b, u->s, u->n);
    }
    return literal(P, jinja_str(P->a, b.p ? b.p : "", b.n));
  }
  case JT_INT: return literal(P, jinja_int(P->a, t->i));
  case JT_FLOAT: return literal(P, jinja_float(P->a, t->f));
  case JT_OP:
    if (!strcmp(t->s, "(")) return parse_seq(P, JN_TUPLE, ")");
    if (!strcmp(t->s, "[")) return parse_seq(P, JN_LIST, "]");
    if (!strcmp(t->s, "{")) return parse_seq(P, JN_DICT, "}");
    /* fallthrough */
  default: P->i--; syntax(P, "unexpected token");
  }
}

/* [a], [a:b], [a:b:c] after '['. */
static jinja_node_t *parse_subscript(parser_t *P, jinja_node_t *target) {
  jinja_node_t *parts[3] = {0};
  int k = 0;
  bool slice = false;
  for (;;) {
    if (!is_op(peek(P), ":") && !is_op(peek(P), "]")) parts[k] = parse_expr(P);
    if (accept_op(P, "]")) break;
    expect_op(P, ":");
    slice = true;
    if (++k > 2) syntax(P, "bad slice");
  }
  jinja_node_t *n = node(P, slice ? JN_SLICE : JN_INDEX);
  n->a = target;
  if (!slice) {
    if (!parts[0]) syntax(P, "empty subscript");
    n->b = parts[0];
    return n;
  }
  n->kids = jinja_alloc(P->a, 3 * sizeof *n->kids);
  n->n_kids = 3;
  memcpy(n->kids, parts, sizeof parts);
  return n;
}

static jinja_node_t *parse_postfix(parser_t *P, jinja_node_t *n) {
  for (;;) {
    if (accept_op(P, ".")) {
      jinja_node_t *a = node(P, JN_ATTR);
      const jinja_tok_t *t = next(P);
      if (t->type != JT_NAME && t->type != JT_INT) syntax(P, "expected an attribute name");
      a->a = n, a->s = t->s, a->n = t->n;
      n = a;
    } else if (accept_op(P, "[")) {
      n = parse_subscript(P, n);
    } else if (accept_op(P, "(")) {
      jinja_node_t *c = node(P, JN_CALL);
      c->a = n;
      parse_args(P, c);
      n = c;
    } else {
      return n;
    }
  }
}

/* | name(args) ... and `is [not] name(args)` after a unary expression. */
static jinja_node_t *parse_filters(parser_t *P, jinja_node_t *n) {
  for (;;) {
    if (accept_op(P, "|")) {
      jinja_node_t *f = node(P, JN_FILTER);
      f->a = n, f->s = expect_name(P);
      while (accept_op(P, ".")) f->s = expect_name(P); /* dotted filter names: the last part */
      if (accept_op(P, "(")) parse_args(P, f);
      n = f;
    } else if (accept_name(P, "is")) {
      jinja_node_t *t = node(P, JN_TEST);
      t->op = accept_name(P, "not");
      t->a = n;
      if (accept_name(P, "none")) t->s = "none";
      else if (accept_name(P, "true")) t->s = "true";
      else if (accept_name(P, "false")) t->s = "false";
      else t->s = expect_name(P);
      const jinja_tok_t *u = peek(P);
      bool bare_arg = u->type == JT_STRING || u->type == JT_INT || u->type == JT_FLOAT || is_op(u, "[") || is_op(u, "{") ||
                      (u->type == JT_NAME && !is_name(u, "else") && !is_name(u, "or") && !is_name(u, "and"));
      if (accept_op(P, "(")) {
        parse_args(P, t);
      } else if (bare_arg) { /* `x is divisibleby 3`, `x is sameas none`: one argument, as jinja2 reads it */
        if (is_name(u, "is")) syntax(P, "tests cannot be chained with is");
        t->kids = jinja_alloc(P->a, sizeof *t->kids);
        t->kids[0] = parse_postfix(P, parse_primary(P));
        t->n_kids = 1;
      }
      n = t;
    } else {
      return n;
    }
  }
}

static jinja_node_t *parse_unary(parser_t *P, bool with_filter) {
  enter(P);
  jinja_node_t *n;
  if (is_op(peek(P), "-") || is_op(peek(P), "+")) {
    n = node(P, is_op(next(P), "-") ? JN_NEG : JN_POS);
    n->a = parse_unary(P, false);
  } else {
    n = parse_postfix(P, parse_primary(P));
  }
  if (with_filter) n = parse_filters(P, n);
  P->nest--;
  return n;
}

static jinja_node_t *binop(parser_t *P, int op, jinja_node_t *l, jinja_node_t *r) {
  jinja_node_t *n = node(P, JN_BINOP);
  n->op = (uint8_t)op, n->a = l, n->b = r;
  return n;
}

static jinja_node_t *parse_pow(parser_t *P) {
  jinja_node_t *n = parse_unary(P, true);
  while (accept_op(P, "**")) n = binop(P, JOP_POW, n, parse_unary(P, true));
  return n;
}

static jinja_node_t *parse_math2(parser_t *P) {
  jinja_node_t *n = parse_pow(P);
  for (;;) {
    int op = accept_op(P, "*") ? JOP_MUL : accept_op(P, "/") ? JOP_DIV : accept_op(P, "//") ? JOP_FLOORDIV
           : accept_op(P, "%") ? JOP_MOD : 0;
    if (!op) return n;
    n = binop(P, op, n, parse_pow(P));
  }
}

static jinja_node_t *parse_concat(parser_t *P) {
  jinja_node_t *n = parse_math2(P);
  while (accept_op(P, "~")) n = binop(P, JOP_CONCAT, n, parse_math2(P));
  return n;
}

static jinja_node_t *parse_math1(parser_t *P) {
  jinja_node_t *n = parse_concat(P);
  for (;;) {
    int op = accept_op(P, "+") ? JOP_ADD : accept_op(P, "-") ? JOP_SUB : 0;
    if (!op) return n;
    n = binop(P, op, n, parse_concat(P));
  }
}

static jinja_node_t *parse_compare(parser_t *P) {
  jinja_node_t *n = parse_math1(P);
  for (;;) {
    int op = accept_op(P, "==") ? JOP_EQ : accept_op(P, "!=") ? JOP_NE : accept_op(P, "<=") ? JOP_LE
           : accept_op(P, ">=") ? JOP_GE : accept_op(P, "<") ? JOP_LT : accept_op(P, ">") ? JOP_GT
           : accept_name(P, "in") ? JOP_IN : 0;
    if (!op && is_name(peek(P), "not") && P->i + 1 < P->n && is_name(&P->t[P->i + 1], "in")) {
      P->i += 2;
      op = JOP_NOTIN;
    }
    if (!op) return n;
    n = binop(P, op, n, parse_math1(P)); /* a < b < c chains are rare in templates: (a < b) < c */
  }
}

static jinja_node_t *parse_not(parser_t *P) {
  if (accept_name(P, "not")) {
    enter(P);
    jinja_node_t *n = node(P, JN_NOT);
    n->a = parse_not(P);
    P->nest--;
    return n;
  }
  return parse_compare(P);
}

static jinja_node_t *parse_and(parser_t *P) {
  jinja_node_t *n = parse_not(P);
  while (accept_name(P, "and")) {
    jinja_node_t *a = node(P, JN_AND);
    a->a = n, a->b = parse_not(P);
    n = a;
  }
  return n;
}

static jinja_node_t *parse_or(parser_t *P) {
  jinja_node_t *n = parse_and(P);
  while (accept_name(P, "or")) {
    jinja_node_t *o = node(P, JN_OR);
    o->a = n, o->b = parse_and(P);
    n = o;
  }
  return n;
}

static jinja_node_t *parse_expr(parser_t *P) {
  enter(P);
  jinja_node_t *n = parse_or(P);
  while (accept_name(P, "if")) {
    jinja_node_t *c = node(P, JN_COND);
    c->b = n, c->a = parse_or(P);
    if (accept_name(P, "else")) c->c = parse_expr(P);
    n = c;
  }
  P->nest--;
  return n;
}

/* An expression, or a tuple without parentheses (a, b). */
static jinja_node_t *parse_tuple(parser_t *P, bool names_only) {
  jinja_node_t *first = names_only ? parse_primary(P) : parse_expr(P);
  if (!is_op(peek(P), ",")) return first;
  jinja_node_t *t = node(P, JN_TUPLE);
  size_t cap = 0;
  add_kid(P, t, first, &cap);
  while (accept_op(P, ",")) add_kid(P, t, names_only ? parse_primary(P) : parse_expr(P), &cap);
  return t;
}

/* ---- statements ---- */

static jinja_node_t *parse_if(parser_t *P) {
  jinja_node_t *n = node(P, JN_IF);
  n->a = parse_expr(P);
  expect_block_end(P);
  static const char *const stops[] = {"elif", "else", "endif", NULL};
  const char *stop;
  n->body = parse_body(P, stops, &stop);
  if (!strcmp(stop, "elif")) {
    jinja_node_t *b = node(P, JN_BODY);
    b->kids = jinja_alloc(P->a, sizeof *b->kids);
    b->kids[0] = parse_if(P);
    b->n_kids = 1;
    n->orelse = b;
  } else if (!strcmp(stop, "else")) {
    expect_block_end(P);
    static const char *const end[] = {"endif", NULL};
    n->orelse = parse_body(P, end, &stop);
    expect_block_end(P);
  } else {
    expect_block_end(P);
  }
  return n;
}

static jinja_node_t *parse_for(parser_t *P) {
  jinja_node_t *n = node(P, JN_FOR);
  n->a = parse_tuple(P, true);
  if (!accept_name(P, "in")) syntax(P, "expected 'in'");
  P->nest++;
  n->b = parse_or(P); /* not parse_expr: `if` here filters */
  P->nest--;
  if (accept_name(P, "if")) n->c = parse_expr(P);
  if (accept_name(P, "recursive")) syntax(P, "recursive loops are not supported");
  expect_block_end(P);
  static const char *const stops[] = {"else", "endfor", NULL};
  const char *stop;
  n->body = parse_body(P, stops, &stop);
  if (!strcmp(stop, "else")) {
    expect_block_end(P);
    static const char *const end[] = {"endfor", NULL};
    n->orelse = parse_body(P, end, &stop);
  }
  expect_block_end(P);
  return n;
}

static jinja_node_t *parse_set(parser_t *P) {
  jinja_node_t *target = parse_tuple(P, true);
  if (target->type == JN_NAME && accept_op(P, ".")) {
    jinja_node_t *attr = node(P, JN_ATTR);
    attr->a = target, attr->s = expect_name(P);
    target = attr;
  }
  if (accept_op(P, "=")) {
    jinja_node_t *n = node(P, JN_SET);
    n->a = target;
    n->b = parse_tuple(P, false);
    expect_block_end(P);
    return n;
  }
  jinja_node_t *n = node(P, JN_SETBLOCK);
  n->a = target;
  if (accept_op(P, "|")) { /* {% set x | filter %} */
    P->i--;
    jinja_node_t *f = parse_filters(P, NULL);
    n->c = f;
  }
  expect_block_end(P);
  static const char *const end[] = {"endset", NULL};
  const char *stop;
  n->body = parse_body(P, end, &stop);
  expect_block_end(P);
  return n;
}

static jinja_node_t *parse_macro(parser_t *P) {
  jinja_node_t *n = node(P, JN_MACRO);
  n->s = expect_name(P);
  expect_op(P, "(");
  parse_args(P, n);
  for (size_t i = 0; i < n->n_kids; i++)
    if (n->kids[i]->type != JN_NAME && n->kids[i]->type != JN_KWARG) syntax(P, "bad macro parameter");
  expect_block_end(P);
  static const char *const end[] = {"endmacro", NULL};
  const char *stop;
  n->body = parse_body(P, end, &stop);
  if (peek(P)->type == JT_NAME) next(P); /* {% endmacro name %} */
  expect_block_end(P);
  return n;
}

/* {% call m(args) %}, {% filter f %}, {% generation %}: a body with an end. */
static jinja_node_t *parse_wrapped(parser_t *P, const char *kw) {
  jinja_node_t *n;
  static const char *const call_end[] = {"endcall", NULL}, *const filter_end[] = {"endfilter", NULL},
                           *const gen_end[] = {"endgeneration", NULL};
  const char *const *end = gen_end;
  if (!strcmp(kw, "call")) {
    n = node(P, JN_CALLBLOCK);
    n->a = parse_expr(P);
    if (n->a->type != JN_CALL) syntax(P, "expected a macro call");
    end = call_end;
  } else if (!strcmp(kw, "filter")) {
    n = node(P, JN_FILTERBLOCK);
    jinja_node_t *f = node(P, JN_FILTER);
    f->s = expect_name(P);
    if (accept_op(P, "(")) parse_args(P, f);
    n->a = parse_filters(P, f);
    end = filter_end;
  } else {
    n = node(P, JN_BODY);
  }
  expect_block_end(P);
  const char *stop;
  jinja_node_t *body = parse_body(P, end, &stop);
  expect_block_end(P);
  if (n->type == JN_BODY) return body;
  n->body = body;
  return n;
}

static jinja_node_t *parse_statement(parser_t *P) {
  const char *kw = expect_name(P);
  if (!strcmp(kw, "if")) return parse_if(P);
  if (!strcmp(kw, "for")) return parse_for(P);
  if (!strcmp(kw, "set")) return parse_set(P);
  if (!strcmp(kw, "macro")) return parse_macro(P);
  if (!strcmp(kw, "call") || !strcmp(kw, "filter") || !strcmp(kw, "generation")) return parse_wrapped(P, kw);
  if (!strcmp(kw, "break") || !strcmp(kw, "continue")) {
    jinja_node_t *n = node(P, kw[0] == 'b' ? JN_BREAK : JN_CONTINUE);
    expect_block_end(P);
    return n;
  }
  P->i--;
  syntax(P, "unknown statement");
}

/* Nodes up to a {% stop %} tag (its name consumed, *stopped set) or, with
 * stops NULL, to the end. */
static jinja_node_t *parse_body(parser_t *P, const char *const *stops, const char **stopped) {
  enter(P);
  jinja_node_t *body = node(P, JN_BODY);
  size_t cap = 0;
  for (;;) {
    const jinja_tok_t *t = next(P);
    if (t->type == JT_EOF) {
      if (stops) syntax(P, "unexpected end of template (missing an end tag)");
      break;
    }
    if (t->type == JT_TEXT) {
      jinja_node_t *n = node(P, JN_TEXT);
      n->s = t->s, n->n = t->n;
      add_kid(P, body, n, &cap);
    } else if (t->type == JT_VAR_BEGIN) {
      jinja_node_t *n = node(P, JN_OUTPUT);
      n->a = parse_tuple(P, false);
      if (next(P)->type != JT_VAR_END) {
        P->i--;
        syntax(P, "expected '}}'");
      }
      add_kid(P, body, n, &cap);
    } else if (t->type == JT_BLOCK_BEGIN) {
      for (size_t k = 0; stops && stops[k]; k++)
        if (is_name(peek(P), stops[k])) {
          *stopped = next(P)->s;
          P->nest--;
          return body;
        }
      add_kid(P, body, parse_statement(P), &cap);
    } else {
      P->i--;
      syntax(P, "unexpected token");
    }
  }
  P->nest--;
  return body;
}

static bool names(const jinja_node_t *n, const char *name) {
  if (!n) return false;
  if (n->type == JN_NAME || n->type == JN_ATTR) return n->s && !strcmp(n->s, name);
  if (n->type == JN_INDEX) return n->b->type == JN_LIT && jinja_is_str(n->b->v, name);
  if (n->type == JN_FILTER) return names(n->a, name); /* for p in content | list */
  return false;
}

static bool loops_over(const jinja_node_t *n, const char *name, int depth) {
  if (!n || depth > MAX_NEST * 2) return false;
  if (n->type == JN_FOR && names(n->b, name)) return true;
  if (loops_over(n->body, name, depth + 1) || loops_over(n->orelse, name, depth + 1)) return true;
  for (size_t i = 0; i < n->n_kids; i++)
    if (loops_over(n->kids[i], name, depth + 1)) return true;
  return false;
}

bool model_jinja_loops_over(const model_jinja_t *t, const char *name) { return loops_over(t->root, name, 0); }

jinja_node_t *jinja_parse_tokens(jinja_arena_t *a, const jinja_tok_t *toks, size_t n_toks) {
  parser_t P = {.a = a, .t = toks, .n = n_toks};
  return parse_body(&P, NULL, NULL);
}
