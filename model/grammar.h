/* grammar.h - constrained decoding: what text a job may produce, as a
 * byte-level automaton, and per step the tokens whose bytes keep the
 * output inside it (a bitmap over the vocabulary).
 *
 * Two kinds of grammar:
 *   - JSON (response_format json_object / json_schema, tool_choice
 *     required / named): a pushdown machine over a compiled schema. The
 *     schema subset: type (object, array, string, number, integer,
 *     boolean, null, or a list of them), properties (written in the
 *     schema's order; every required one present, optional ones may be
 *     left out, no others), required, additionalProperties false, items,
 *     minItems / maxItems, minLength / maxLength, enum, const, anyOf /
 *     oneOf, $ref to #/$defs or #/definitions (no recursion), title /
 *     description / default / examples / $schema / strict (ignored). Any
 *     other keyword is refused, naming it. No schema = any JSON object.
 *     Whitespace between tokens is limited to runs of MODEL_GRAMMAR_MAX_WS
 *     bytes, numbers to 16 digits a part, so a model cannot loop on them.
 *   - regex: a Thompson NFA of the pattern (literals, ., classes [...]
 *     with ranges and negation, \d \w \s \D \W \S and escapes, groups
 *     (...) and (?:...), |, * + ? {m} {m,} {m,n}; anchors ^ $ only at the
 *     ends), matched against the whole output.
 *
 * A state (model_gstate_t) is plain data, copied by value; the machine
 * forks on ambiguity (anyOf, an optional key vs. the next one) into at
 * most MODEL_GRAMMAR_MAX_FORKS deterministic stacks.
 *
 * The mask: model_gvocab_t holds every token's bytes once per tokenizer
 * (sorted, with shared prefix lengths and a link past each subtree, which
 * tokens are plain string content, and the distinct tails of those that
 * leave a string); model_grammar_mask walks them from the state and
 * allows the end-of-generation tokens only where the output may end.
 *
 * Threads: grammars and vocabularies are immutable once built (share
 * them); a state belongs to one job.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct model_tokenizer;

#define MODEL_GRAMMAR_MAX_DEPTH 24 /* JSON nesting of an output */
#define MODEL_GRAMMAR_MAX_FORKS 8  /* stacks a state holds at once */
#define MODEL_GRAMMAR_MAX_WS 8     /* whitespace bytes in a row */
#define MODEL_GRAMMAR_MAX_NFA 1024 /* states of a regex's NFA */

typedef struct model_grammar model_grammar_t;

/* One frame of a JSON stack (grammar.c). */
typedef struct {
  uint8_t kind, st, ws, pad;
  int32_t node;
  uint32_t a, b;
  uint64_t set;
} model_gframe_t;

typedef struct {
  uint8_t depth;
  model_gframe_t f[MODEL_GRAMMAR_MAX_DEPTH];
} model_gstack_t;

/* Where an output is in its grammar. */
typedef struct {
  int n;                                      /* live stacks (JSON); 0 = dead */
  model_gstack_t s[MODEL_GRAMMAR_MAX_FORKS];
  uint64_t nfa[MODEL_GRAMMAR_MAX_NFA / 64];   /* regex: the NFA states the output may be in */
} model_gstate_t;

/* Compiles a JSON schema (schema_len bytes of JSON text; NULL or "" = any
 * JSON object). Returns 0 and *out, or FR_EFORMAT / -EINVAL with a message
 * naming what is unsupported or wrong in err. */
int model_grammar_json(model_grammar_t **out, const char *schema, size_t schema_len, char *err, size_t err_len);
/* Compiles a regular expression (len bytes). Same returns. */
int model_grammar_regex(model_grammar_t **out, const char *pattern, size_t len, char *err, size_t err_len);
/* NULL is fine. */
void model_grammar_destroy(model_grammar_t *g);

/* The state before any output. */
void model_gstate_init(const model_grammar_t *g, model_gstate_t *s);
/* Feeds n bytes; false when no output that begins so is in the grammar
 * (s is then dead). */
bool model_gstate_feed(const model_grammar_t *g, model_gstate_t *s, const char *bytes, size_t n);
/* True when the output so far is a whole sentence of the grammar. */
bool model_gstate_can_end(const model_grammar_t *g, const model_gstate_t *s);
/* True when the output is whole and nothing may follow (EOS only). */
bool model_gstate_must_end(const model_grammar_t *g, const model_gstate_t *s);

/* Every token's bytes, for masks. */
typedef struct model_gvocab model_gvocab_t;

/* Reads the n_vocab tokens of tok (control and unknown tokens are never
 * allowed but the end-of-generation ones, at the end). Returns 0 or -ENOMEM. */
int model_gvocab_create(model_gvocab_t **out, const struct model_tokenizer *tok, int n_vocab);
void model_gvocab_destroy(model_gvocab_t *v);
/* Words of a mask: (n_vocab + 31) / 32. */
uint32_t model_gvocab_words(const model_gvocab_t *v);

/* Work memory of model_grammar_mask for a vocabulary: one per thread
 * that builds masks (a state per byte of the longest token). */
typedef struct model_gscratch model_gscratch_t;
int model_gscratch_create(model_gscratch_t **out, const model_gvocab_t *v);
void model_gscratch_destroy(model_gscratch_t *s);

/* Sets bit t of mask (model_gvocab_words words) for each token t allowed
 * in state s: exactly the tokens whose bytes model_gstate_feed takes.
 * Never allows nothing: a dead state (or one no token can continue)
 * allows the end-of-generation tokens. Tokens are walked in byte order,
 * each from the state of the prefix it shares with the one before (a
 * prefix that dies jumps past every token under it); inside a JSON string
 * with no length bound, the tokens that are plain string content are
 * allowed at once, and once the string's minimum length is met the others
 * are decided by their tail from the first '"' or '\\' (each distinct
 * tail walked once). Returns how many are allowed. */
size_t model_grammar_mask(const model_grammar_t *g, const model_gstate_t *s, const model_gvocab_t *v, uint32_t *mask,
                          model_gscratch_t *scratch);

#ifdef __cplusplus
}
#endif
