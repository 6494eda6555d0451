/* grammar_internal.h - what grammar.c (JSON) and grammar_regex.c share:
 * the compiled grammar. Not a public interface. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/grammar.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { MODEL_GRAMMAR_JSON = 1, MODEL_GRAMMAR_REGEX };

/* JSON schema nodes. */
enum { GN_ANY = 0, GN_OBJ_ANY, GN_OBJ, GN_ARR, GN_STR, GN_NUM, GN_INT, GN_LIT, GN_ANYOF };

typedef struct {
  uint8_t kind;
  uint32_t first, n; /* OBJ: properties strs[first..+n); LIT: literals strs[..]; ANYOF: alts[..] */
  int32_t items;     /* ARR: the items' node */
  uint32_t min, max; /* ARR: items; STR: characters */
  int32_t last_req;  /* OBJ: index of the last required property, -1 = none */
} gnode_t;

typedef struct {
  char *s;        /* a literal's JSON text, or a property's name */
  uint32_t len;
  int32_t node;   /* a property's schema */
  bool required;  /* a property */
} gstr_t;

/* One NFA state: on a byte in its class go to out; or (eps) to out and out2. */
typedef struct {
  uint64_t cls[4]; /* bytes it takes (none: an epsilon state) */
  int32_t out, out2;
  bool eps;
} gnfa_t;

struct model_grammar {
  int kind;
  /* JSON */
  gnode_t *nodes;
  uint32_t n_nodes, cap_nodes;
  gstr_t *strs;
  uint32_t n_strs, cap_strs;
  int32_t *alts;
  uint32_t n_alts, cap_alts;
  int32_t root;
  int32_t n_any, n_anyobj, n_emptyobj, n_anyarr, n_str, n_num, n_int, n_tfn, n_bool, n_null; /* base nodes */
  /* regex */
  gnfa_t *nfa;
  uint32_t n_nfa;
  int32_t nfa_start, nfa_accept;
  /* while compiling */
  char *err;
  size_t err_len;
};

/* grammar_regex.c: the state before any output, one byte, acceptance. */
void model__regex_init(const model_grammar_t *g, model_gstate_t *s);
bool model__regex_step(const model_grammar_t *g, model_gstate_t *s, unsigned c);
bool model__regex_accepting(const model_grammar_t *g, const model_gstate_t *s);

#ifdef __cplusplus
}
#endif
