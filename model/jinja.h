/* jinja.h - an interpreter for the Jinja subset that chat templates use,
 * rendering as transformers' apply_chat_template does (jinja2's
 * ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, HF's
 * tojson, raise_exception and strftime_now; loopcontrols).
 *
 * A template is parsed once (model_jinja_parse) and is immutable after:
 * any number of threads may render it at once. Rendering is bounded (output
 * bytes, evaluation steps, call depth, memory), so a hostile template ends
 * with an error, never a hang or a crash. Errors (syntax, undefined calls,
 * raise_exception, limits) are negative codes with the message in
 * fr_last_error().
 */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct model_jinja model_jinja_t;

typedef struct {
  size_t max_output;   /* bytes of output (0: 16 MiB) */
  size_t max_steps;    /* evaluated nodes and loop iterations (0: 10 million) */
  size_t max_depth;    /* nested macro calls and expressions (0: 64 calls) */
  size_t max_memory;   /* bytes of values made while rendering (0: 256 MiB) */
} model_jinja_limits_t;

/* Parses template text (len bytes). *out is the template, to free with
 * model_jinja_destroy. Returns 0 or FR_EFORMAT (the message names the line);
 * *out is NULL on failure. */
int model_jinja_parse(model_jinja_t **out, const char *src, size_t len);

/* True when a for loop of t iterates over a variable, attribute or item
 * named name (`for p in message['content']`): how vLLM tells a template
 * that takes content as a list of parts from one that takes a string. */
bool model_jinja_loops_over(const model_jinja_t *t, const char *name);

/* Frees a template (NULL is fine). */
void model_jinja_destroy(model_jinja_t *t);

/* Renders t with the variables of the JSON object vars (borrowed; may be
 * NULL) into *out, fr_malloc'd and NUL-terminated, *out_len bytes. lim may
 * be NULL (the defaults). Returns 0, FR_EFORMAT for a template error
 * (undefined call, type error, raise_exception: the message is the
 * template's) or FR_ETOOBIG for a limit; *out is NULL on failure. */
int model_jinja_render(const model_jinja_t *t, const json_t *vars, const model_jinja_limits_t *lim, char **out,
                       size_t *out_len);

#ifdef __cplusplus
}
#endif
