/* http_tools.h - tool calls in chat completions: the request's `tools` and
 * `tool_choice` (checked as vLLM checks them), and the model's output
 * parsed into OpenAI `tool_calls` by the format --tool-call-parser names
 * (vLLM's names):
 *   hermes       <tool_call>{"name": ..., "arguments": {...}}</tool_call>
 *                (Hermes 2/3, Qwen2.5, Qwen3; several in a row; the last
 *                may be unclosed at the end of the output)
 *   llama3_json  the output is {"name": ..., "parameters"|"arguments": {...}}
 *                (optionally after <|python_tag|>), several separated by ';'
 *   mistral      [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...], or
 *                the newer [TOOL_CALLS]name[ARGS]{...}
 * Text before a call stays content; a call that does not parse (bad JSON,
 * no name) stays content too, never an error. A call's `arguments` is the
 * exact JSON text the model wrote for them (a JSON string the client
 * json.loads), "{}" when it wrote none.
 *
 * One parser serves both answers: a stream feeds each event's text and
 * sends what each feed decided (content and whole calls); a JSON answer
 * feeds the whole text once, final. So a stream's calls and content are
 * the JSON answer's, byte for byte.
 *
 * Threads: none of its own; a parser belongs to one job. No globals.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  COORD_TOOL_PARSER_NONE = 0,
  COORD_TOOL_PARSER_HERMES,
  COORD_TOOL_PARSER_LLAMA3_JSON,
  COORD_TOOL_PARSER_MISTRAL,
} coord_tool_parser_t;

/* The parser --tool-call-parser NAME means. Returns 0, or -1 for an
 * unknown name. */
int coord_tool_parser_from_name(const char *name, coord_tool_parser_t *out);
/* Its name ("hermes", ...); "none" for NONE. */
const char *coord_tool_parser_name(coord_tool_parser_t p);

/* What the request's tool_choice asks. */
typedef enum {
  COORD_TOOL_CHOICE_NONE = 0, /* no tools, or "none": the output is text */
  COORD_TOOL_CHOICE_AUTO,     /* the model may call: its output is parsed */
  COORD_TOOL_CHOICE_REQUIRED, /* at least one call: the output is constrained to a JSON list of calls */
  COORD_TOOL_CHOICE_NAMED,    /* that function: the output is constrained to its arguments */
} coord_tool_choice_t;

/* The server's tool settings (serve flags). */
typedef struct {
  coord_tool_parser_t parser; /* --tool-call-parser */
  bool auto_choice;           /* --enable-auto-tool-choice */
  int32_t marker;             /* the parser's marker when it is a control token the detokenizer drops
                               * (mistral's [TOOL_CALLS]): put back into the text by token id; -1 none */
} coord_tool_cfg_t;

/* One parsed call. Strings are malloc'd, owned by the coord_tool_out_t. */
typedef struct {
  char *id;   /* "chatcmpl-tool-<32 hex>" (mistral: 9 alphanumerics, as vLLM) */
  char *name;
  char *args; /* JSON text */
} coord_tool_call_t;

/* What one feed decided. */
typedef struct {
  char *content; /* text that is content (NUL-terminated), content_len bytes */
  size_t content_len, content_cap;
  coord_tool_call_t *calls;
  size_t n_calls, calls_cap;
} coord_tool_out_t;

/* The incremental parser of one answer. */
typedef struct {
  coord_tool_parser_t kind;
  int state;       /* parser-internal */
  char *buf;       /* text not decided yet */
  size_t len, cap;
  uint32_t n_calls;/* calls decided so far (the next one's index) */
  uint64_t rng;    /* for call ids */
} coord_tool_stream_t;

/* Starts a parser of kind (not NONE); seed makes the call ids. */
void coord_tool_stream_init(coord_tool_stream_t *s, coord_tool_parser_t kind, uint64_t seed);
void coord_tool_stream_free(coord_tool_stream_t *s);
/* Feeds n bytes of output (final: the output ends with them). out (reset
 * here) gets the content and calls this feed decides; text that may still
 * begin a call is held back until it is decided. Returns 0 or -ENOMEM. */
int coord_tool_stream_feed(coord_tool_stream_t *s, const char *text, size_t n, bool final, coord_tool_out_t *out);
void coord_tool_out_init(coord_tool_out_t *o);
void coord_tool_out_free(coord_tool_out_t *o);

/* The JSON schema the output must follow for a tool choice (REQUIRED: a
 * non-empty list of {"name": one of the tools, "parameters": its
 * parameters}; NAMED: that function's parameters), as vLLM builds it; a
 * new reference, or NULL for the other choices or out of memory. */
json_t *coord_tool_choice_schema(json_t *root, coord_tool_choice_t choice, const char *name);

/* A JSON answer of a REQUIRED / NAMED choice (the constrained output)
 * turned into calls: REQUIRED parses the list, NAMED wraps the text as
 * name's arguments. Returns 0 (out holds the calls; when the text is not
 * what was asked, e.g. cut by max_tokens, no calls and the text as
 * content) or -ENOMEM. */
int coord_tool_forced_calls(coord_tool_choice_t choice, const char *name, const char *text, size_t len,
                            uint64_t seed, coord_tool_out_t *out);

#ifdef __cplusplus
}
#endif
