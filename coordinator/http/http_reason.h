/* http_reason.h - reasoning models in chat completions: the model's
 * thinking split from its answer, into OpenAI-style `reasoning_content`
 * and `content`, by the format --reasoning-parser names (vLLM's names):
 *   qwen3        <think>...</think>answer, the opening tag the first thing
 *                in the output; an output that does not open with <think>
 *                is all content (Qwen3 with enable_thinking false, whose
 *                template puts the empty think block in the prompt)
 *   deepseek_r1  ...</think>answer: the opening <think> is in the prompt
 *                (DeepSeek-R1's template), so the output is reasoning from
 *                its first byte to </think>; an opening <think> the model
 *                writes anyway is dropped
 * A think block never closed is all reasoning (vLLM's streaming answer;
 * a stream cannot take back what it sent, so the JSON answer agrees).
 * The tags are matched as text, so a model whose tokenizer has no <think>
 * token is parsed the same; a tag cut across two feeds is held back until
 * it is decided.
 *
 * One parser serves both answers, as the tool parser does: a stream feeds
 * each event's text; a JSON answer feeds the whole text once, final.
 * Tool calls are parsed in the content only (what follows </think>).
 *
 * Threads: none of its own; a parser belongs to one choice. No globals.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  COORD_REASON_PARSER_NONE = 0,
  COORD_REASON_PARSER_QWEN3,
  COORD_REASON_PARSER_DEEPSEEK_R1,
} coord_reason_parser_t;

/* The parser --reasoning-parser NAME means. Returns 0, or -1 for an
 * unknown name. */
int coord_reason_parser_from_name(const char *name, coord_reason_parser_t *out);
/* Its name ("qwen3", ...); "none" for NONE. */
const char *coord_reason_parser_name(coord_reason_parser_t p);

/* What one feed decided (NUL-terminated, malloc'd, owned here). */
typedef struct {
  char *reasoning;
  size_t reasoning_len, reasoning_cap;
  char *content;
  size_t content_len, content_cap;
  bool thought; /* the output has a think block (seen so far) */
} coord_reason_out_t;

/* The incremental parser of one answer. */
typedef struct {
  coord_reason_parser_t kind;
  int state;    /* parser-internal: before the output opens, thinking, answering */
  char *held;   /* bytes that may begin a tag, not decided yet */
  size_t held_len, held_cap;
  bool thought; /* a think block was opened */
} coord_reason_stream_t;

/* Starts a parser of kind (not NONE). */
void coord_reason_stream_init(coord_reason_stream_t *s, coord_reason_parser_t kind);
void coord_reason_stream_free(coord_reason_stream_t *s);
/* Feeds n bytes of output (final: the output ends with them). out (reset
 * here) gets the reasoning and content this feed decides. Returns 0 or
 * -ENOMEM. */
int coord_reason_stream_feed(coord_reason_stream_t *s, const char *text, size_t n, bool final, coord_reason_out_t *out);
void coord_reason_out_init(coord_reason_out_t *o);
void coord_reason_out_free(coord_reason_out_t *o);

#ifdef __cplusplus
}
#endif
