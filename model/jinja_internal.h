/* jinja_internal.h - the pieces of the Jinja interpreter (model/jinja.h):
 * arenas (jinja_value.c), values (jinja_value.c), the lexer
 * (jinja_lex.c), the syntax tree (jinja_parse.c), the evaluator
 * (jinja_eval.c) and the filters, tests, methods and globals
 * (jinja_builtin.c).
 *
 * Memory: everything a parse or a render makes lives in one arena, freed
 * at once; values are never freed one by one and, but for namespace()
 * objects, never change once made.
 *
 * Errors inside the interpreter longjmp to the parse or render entry point
 * (jinja_fail), which returns them as values: a template's evaluation is
 * deep recursion over a tree, and unwinding it by hand at every call would
 * hide what the code does (Lua does the same).
 */
#pragma once

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/jinja.h"

/* ---- arena ---- */

typedef struct jinja_chunk jinja_chunk_t;

typedef struct jinja_err jinja_err_t;

typedef struct {
  jinja_chunk_t *head;
  size_t total, max; /* bytes taken from the heap, and the cap (0: none) */
  jinja_err_t *err;  /* where an allocation past max fails to */
} jinja_arena_t;

/* An error: the code and message, and where to jump. */
struct jinja_err {
  jmp_buf jb;
  int code;
  char msg[512];
};

/* Records the message and longjmps to err->jb. */
_Noreturn void jinja_fail(jinja_err_t *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

void *jinja_alloc(jinja_arena_t *a, size_t n); /* zeroed, 16-aligned */
void jinja_arena_free(jinja_arena_t *a);

/* ---- values ---- */

typedef enum {
  JV_UNDEF = 0,
  JV_NONE,
  JV_BOOL,
  JV_INT,
  JV_FLOAT,
  JV_STR,
  JV_LIST,  /* also tuples (is_tuple: repr with parentheses) */
  JV_DICT,
  JV_NS,    /* namespace(): a dict whose attributes `set` may change */
  JV_MACRO,
  JV_FUNC,  /* a global function or a bound method (name, self) */
} jinja_type_t;

typedef struct jinja_node jinja_node_t;
typedef struct jinja_value jinja_value_t;
typedef struct jinja_scope jinja_scope_t;

struct jinja_value {
  uint8_t type;
  bool is_tuple;
  bool is_gen;
  bool is_safe; /* a str marked |safe (jinja2's Markup): + escapes a plain str beside it */  /* a list that stands for a generator (map, select, ...): no len(), no JSON, no index */
  union {
    bool b;
    int64_t i;
    double f;
    struct {
      const char *p; /* NUL-terminated */
      size_t n;
    } s;
    struct {
      jinja_value_t **items;
      size_t n;
    } l;
    struct {
      jinja_value_t **keys, **vals;
      size_t n, cap;
    } d;
    struct {
      const jinja_node_t *node;   /* the macro statement */
      const jinja_node_t *caller; /* a call block's body, or NULL */
      jinja_scope_t *caller_scope;
    } m;
    struct {
      const char *name;
      jinja_value_t *self; /* NULL for globals */
    } fn;
    const char *undef_name; /* JV_UNDEF: what was missing, for messages */
  };
};

extern jinja_value_t jinja_undef, jinja_none, jinja_true, jinja_false;

jinja_value_t *jinja_str(jinja_arena_t *a, const char *p, size_t n);
jinja_value_t *jinja_cstr(jinja_arena_t *a, const char *p);
jinja_value_t *jinja_int(jinja_arena_t *a, int64_t i);
jinja_value_t *jinja_float(jinja_arena_t *a, double f);
jinja_value_t *jinja_bool(bool b);
jinja_value_t *jinja_list(jinja_arena_t *a, size_t n); /* n items, NULL until set */
jinja_value_t *jinja_dict(jinja_arena_t *a);
void jinja_dict_set(jinja_arena_t *a, jinja_value_t *d, jinja_value_t *k, jinja_value_t *v);
jinja_value_t *jinja_dict_get(const jinja_value_t *d, const char *key, size_t n); /* NULL when absent */
jinja_value_t *jinja_dict_find(const jinja_value_t *d, const jinja_value_t *key);
jinja_value_t *jinja_from_json(jinja_arena_t *a, const json_t *j, int depth);

bool jinja_truthy(const jinja_value_t *v);
bool jinja_equal(const jinja_value_t *a, const jinja_value_t *b);
/* <0, 0, >0; fails on kinds Python cannot order. */
int jinja_compare(jinja_err_t *e, const jinja_value_t *a, const jinja_value_t *b);
const char *jinja_type_name(const jinja_value_t *v);
bool jinja_is_str(const jinja_value_t *v, const char *s);

/* A growing byte buffer in the arena (or on the heap for output). */
typedef struct {
  char *p;
  size_t n, cap;
} jinja_buf_t;

void jinja_buf_put(jinja_arena_t *a, jinja_buf_t *b, const char *s, size_t n);
void jinja_buf_puts(jinja_arena_t *a, jinja_buf_t *b, const char *s);

/* Python's str(v) and repr(v), and HF's tojson (indent < 0: none). */
void jinja_to_str(jinja_arena_t *a, jinja_buf_t *b, const jinja_value_t *v);
void jinja_repr(jinja_arena_t *a, jinja_buf_t *b, const jinja_value_t *v);
void jinja_tojson(jinja_arena_t *a, jinja_buf_t *b, const jinja_value_t *v, int indent, int level);
jinja_value_t *jinja_str_of(jinja_arena_t *a, const jinja_value_t *v);

/* ---- lexer ---- */

typedef enum {
  JT_EOF = 0,
  JT_TEXT,
  JT_VAR_BEGIN,   /* {{ */
  JT_VAR_END,     /* }} */
  JT_BLOCK_BEGIN, /* {% */
  JT_BLOCK_END,   /* %} */
  JT_NAME,
  JT_STRING,      /* s: the value, escapes done */
  JT_INT,
  JT_FLOAT,
  JT_OP,          /* s: the operator ("==", "(", ...) */
} jinja_tok_type_t;

typedef struct {
  uint8_t type;
  int line;
  const char *s; /* arena copy, NUL-terminated */
  size_t n;
  int64_t i;
  double f;
} jinja_tok_t;

/* Splits the template into tokens (whitespace control and trim_blocks /
 * lstrip_blocks applied to the text; comments dropped), in the arena. */
void jinja_lex(jinja_arena_t *a, const char *src, size_t len, jinja_tok_t **toks, size_t *n_toks);

/* ---- syntax tree ---- */

typedef enum {
  /* statements */
  JN_BODY,     /* kids */
  JN_TEXT,     /* s, n */
  JN_OUTPUT,   /* a */
  JN_IF,       /* a cond, body, orelse */
  JN_FOR,      /* a target (NAME or TUPLE), b iterable, c filter or NULL, body, orelse */
  JN_SET,      /* a target (NAME, ATTR, TUPLE), b value */
  JN_SETBLOCK, /* a target, body */
  JN_MACRO,    /* s name, kids params (NAME or KWARG with default), body */
  JN_CALLBLOCK,/* a call, body */
  JN_FILTERBLOCK, /* a filter chain over a NULL input, body */
  JN_BREAK,
  JN_CONTINUE,
  /* expressions */
  JN_LIT,      /* v */
  JN_NAME,     /* s */
  JN_ATTR,     /* a . s */
  JN_INDEX,    /* a [ b ] */
  JN_SLICE,    /* a [ kids[0] : kids[1] : kids[2] ] (NULL parts) */
  JN_CALL,     /* a ( kids ): positional, then KWARG */
  JN_KWARG,    /* s = a */
  JN_FILTER,   /* a | s ( kids ) ; a NULL inside a filter block */
  JN_TEST,     /* a is [not] s ( kids ); op: 1 for not */
  JN_BINOP,    /* a op b: op is a jinja_op_t */
  JN_NEG,      /* - a */
  JN_POS,      /* + a */
  JN_NOT,      /* not a */
  JN_AND,
  JN_OR,
  JN_COND,     /* b if a else c (c NULL: undefined) */
  JN_LIST,     /* kids */
  JN_TUPLE,    /* kids */
  JN_DICT,     /* kids: key, value, key, value ... */
} jinja_node_type_t;

typedef enum {
  JOP_ADD = 1, JOP_SUB, JOP_MUL, JOP_DIV, JOP_FLOORDIV, JOP_MOD, JOP_POW, JOP_CONCAT,
  JOP_EQ, JOP_NE, JOP_LT, JOP_LE, JOP_GT, JOP_GE, JOP_IN, JOP_NOTIN,
} jinja_op_t;

struct jinja_node {
  uint8_t type;
  uint8_t op;
  int line;
  const char *s;
  size_t n;
  jinja_value_t *v;
  jinja_node_t *a, *b, *c;
  jinja_node_t *body, *orelse;
  jinja_node_t **kids;
  size_t n_kids;
};

/* Parses the tokens into a JN_BODY, in the arena. */
jinja_node_t *jinja_parse_tokens(jinja_arena_t *a, const jinja_tok_t *toks, size_t n_toks);

struct model_jinja {
  jinja_arena_t arena;
  jinja_node_t *root;
};

/* ---- evaluation ---- */

struct jinja_scope {
  jinja_scope_t *parent;
  jinja_value_t *vars; /* JV_DICT */
};

typedef struct {
  jinja_arena_t ar;
  jinja_err_t err;
  jinja_buf_t *out;           /* where output goes now (a set or call block redirects it) */
  size_t max_output;
  size_t steps, max_steps;
  size_t depth, max_depth;   /* macro calls */
  int nest;                   /* evaluation frames */
  jinja_scope_t *root;
  int line;                   /* of the node being evaluated, for messages */
} jinja_ctx_t;

jinja_value_t *jinja_eval(jinja_ctx_t *c, jinja_scope_t *sc, const jinja_node_t *n);
/* Calls a macro or a function with evaluated arguments (kwargs: names and values). */
jinja_value_t *jinja_call_value(jinja_ctx_t *c, jinja_value_t *fn, jinja_value_t **args, size_t n_args,
                                const char **kw_names, jinja_value_t **kw_vals, size_t n_kw);
jinja_value_t *jinja_getattr(jinja_ctx_t *c, jinja_value_t *v, const char *name, size_t n);
jinja_value_t *jinja_getitem(jinja_ctx_t *c, jinja_value_t *v, jinja_value_t *key);
/* The items a for loop or a filter walks (a list), or fails. */
jinja_value_t *jinja_iterate(jinja_ctx_t *c, jinja_value_t *v);
void jinja_step(jinja_ctx_t *c);

/* Builtins (jinja_builtin.c). Each fails with a message on bad input. */
typedef struct {
  jinja_value_t **args;
  size_t n_args;
  const char **kw_names;
  jinja_value_t **kw_vals;
  size_t n_kw;
} jinja_args_t;

jinja_value_t *jinja_filter(jinja_ctx_t *c, const char *name, jinja_value_t *v, const jinja_args_t *a);
bool jinja_test(jinja_ctx_t *c, const char *name, jinja_value_t *v, const jinja_args_t *a);
bool jinja_has_method(const jinja_value_t *v, const char *name);
jinja_value_t *jinja_call_builtin(jinja_ctx_t *c, const char *name, jinja_value_t *self, const jinja_args_t *a);
bool jinja_is_global(const char *name);
