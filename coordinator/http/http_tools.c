/* http_tools.c - tool calls: the output parsers (hermes, llama3_json,
 * mistral), one incremental machine for streams and whole answers, and
 * the request's tools / tool_choice. See http_tools.h. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/http/http_internal.h"
#include "coordinator/http/http_tools.h"

#define TOOLS_MAX_DEPTH 128 /* JSON nesting a call may have */

enum { TS_TEXT = 0, TS_CALL, TS_PLAIN, TS_START };

static const char hermes_open[] = "<tool_call>", hermes_close[] = "</tool_call>";
static const char mistral_open[] = "[TOOL_CALLS]", mistral_args[] = "[ARGS]";
static const char python_tag[] = "<|python_tag|>";

int coord_tool_parser_from_name(const char *name, coord_tool_parser_t *out) {
  static const struct { const char *name; coord_tool_parser_t p; } names[] = {
      {"hermes", COORD_TOOL_PARSER_HERMES}, {"llama3_json", COORD_TOOL_PARSER_LLAMA3_JSON},
      {"mistral", COORD_TOOL_PARSER_MISTRAL}};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (!strcmp(name, names[i].name)) return *out = names[i].p, 0;
  return -1;
}

const char *coord_tool_parser_name(coord_tool_parser_t p) {
  switch (p) {
  case COORD_TOOL_PARSER_HERMES: return "hermes";
  case COORD_TOOL_PARSER_LLAMA3_JSON: return "llama3_json";
  case COORD_TOOL_PARSER_MISTRAL: return "mistral";
  default: return "none";
  }
}

/* ---- a JSON scanner that knows where values end ---- */

static bool tools_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static size_t tools_skip_ws(const char *s, size_t n, size_t i) {
  while (i < n && tools_ws(s[i])) i++;
  return i;
}

/* A string from s[i] == '"'. Returns 1 (*end past it), 0 incomplete, -1 invalid. */
static int tools_scan_str(const char *s, size_t n, size_t i, size_t *end) {
  for (i++; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '"') return *end = i + 1, 1;
    if (c < 0x20) return -1;
    if (c != '\\') continue;
    if (++i >= n) return 0;
    if (s[i] == 'u') {
      for (int k = 1; k <= 4; k++) {
        if (i + (size_t)k >= n) return 0;
        if (!strchr("0123456789abcdefABCDEF", s[i + (size_t)k]) || !s[i + (size_t)k]) return -1;
      }
      i += 4;
    } else if (!strchr("\"\\/bfnrt", s[i]) || !s[i])
      return -1;
  }
  return 0;
}

/* A number, true, false or null from s[i]. At the end of the text a
 * number may go on, so it is incomplete unless final. */
static int tools_scan_atom(const char *s, size_t n, size_t i, bool final, size_t *end) {
  static const char *const lit[] = {"true", "false", "null"};
  for (size_t k = 0; k < 3; k++) {
    size_t l = strlen(lit[k]);
    if (s[i] != lit[k][0]) continue;
    if (n - i < l) return strncmp(s + i, lit[k], n - i) ? -1 : 0;
    return strncmp(s + i, lit[k], l) ? -1 : (*end = i + l, 1);
  }
  size_t j = i;
  if (j < n && s[j] == '-') j++;
  if (j >= n) return final ? -1 : 0;
  if (s[j] == '0') j++;
  else if (s[j] >= '1' && s[j] <= '9') while (j < n && s[j] >= '0' && s[j] <= '9') j++;
  else return -1;
  if (j < n && s[j] == '.') {
    size_t d = ++j;
    while (j < n && s[j] >= '0' && s[j] <= '9') j++;
    if (j == d) return j >= n && !final ? 0 : -1;
  }
  if (j < n && (s[j] == 'e' || s[j] == 'E')) {
    j++;
    if (j < n && (s[j] == '+' || s[j] == '-')) j++;
    size_t d = j;
    while (j < n && s[j] >= '0' && s[j] <= '9') j++;
    if (j == d) return j >= n && !final ? 0 : -1;
  }
  if (j >= n && !final) return 0;
  return *end = j, 1;
}

/* One JSON value from s[i] (after whitespace). Returns 1 with *end past
 * it, 0 when the text ends inside it, -1 when it is not JSON. */
static int tools_scan(const char *s, size_t n, size_t i, bool final, size_t *end) {
  char stack[TOOLS_MAX_DEPTH];
  int depth = 0;
  bool want_value = true; /* else: after a value, want ',' or a closer */
  for (;;) {
    i = tools_skip_ws(s, n, i);
    if (i >= n) return 0;
    char c = s[i];
    if (!want_value) {
      if (depth == 0) return *end = i, 1;
      if (c == ',') {
        i++;
        want_value = true;
        if (stack[depth - 1] == '{') {
          i = tools_skip_ws(s, n, i);
          if (i >= n) return 0;
          if (s[i] != '"') return -1;
          goto key;
        }
        continue;
      }
      if ((c == '}' && stack[depth - 1] == '{') || (c == ']' && stack[depth - 1] == '[')) {
        i++;
        if (--depth == 0) return *end = i, 1;
        continue;
      }
      return -1;
    }
    if (c == '{' || c == '[') {
      if (depth == TOOLS_MAX_DEPTH) return -1;
      stack[depth++] = c;
      i = tools_skip_ws(s, n, i + 1);
      if (i >= n) return 0;
      if (s[i] == (c == '{' ? '}' : ']')) {
        i++;
        want_value = false;
        if (--depth == 0) return *end = i, 1;
        continue;
      }
      if (c == '[') continue;
      if (s[i] != '"') return -1;
    key:;
      size_t e;
      int rc = tools_scan_str(s, n, i, &e);
      if (rc <= 0) return rc;
      i = tools_skip_ws(s, n, e);
      if (i >= n) return 0;
      if (s[i++] != ':') return -1;
      continue;
    }
    size_t e;
    int rc = c == '"' ? tools_scan_str(s, n, i, &e) : tools_scan_atom(s, n, i, final, &e);
    if (rc <= 0) return rc;
    i = e;
    want_value = false;
    if (depth == 0) return *end = i, 1;
  }
}

/* ---- output ---- */

void coord_tool_out_init(coord_tool_out_t *o) { memset(o, 0, sizeof *o); }

static void tools_out_reset(coord_tool_out_t *o) {
  for (size_t i = 0; i < o->n_calls; i++) {
    free(o->calls[i].id);
    free(o->calls[i].name);
    free(o->calls[i].args);
  }
  o->n_calls = 0;
  o->content_len = 0;
  if (o->content) o->content[0] = 0;
}

void coord_tool_out_free(coord_tool_out_t *o) {
  tools_out_reset(o);
  free(o->calls);
  free(o->content);
  memset(o, 0, sizeof *o);
}

static int tools_content(coord_tool_out_t *o, const char *s, size_t n) {
  if (!n) return 0;
  if (o->content_len + n + 1 > o->content_cap) {
    size_t cap = (o->content_len + n + 1) * 2;
    char *p = realloc(o->content, cap);
    if (!p) return -ENOMEM;
    o->content = p, o->content_cap = cap;
  }
  memcpy(o->content + o->content_len, s, n);
  o->content_len += n;
  o->content[o->content_len] = 0;
  return 0;
}

static uint64_t tools_rand(uint64_t *x) { /* splitmix64 */
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static char *tools_id(coord_tool_parser_t kind, uint64_t *rng) {
  char *id = malloc(48);
  if (!id) return NULL;
  if (kind == COORD_TOOL_PARSER_MISTRAL) { /* vLLM: 9 alphanumerics */
    static const char an[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    uint64_t r = tools_rand(rng);
    for (int i = 0; i < 9; i++, r /= 62) id[i] = an[r % 62];
    id[9] = 0;
  } else {
    snprintf(id, 48, "chatcmpl-tool-%016llx%016llx", (unsigned long long)tools_rand(rng),
             (unsigned long long)tools_rand(rng));
  }
  return id;
}

static int tools_call(coord_tool_out_t *o, coord_tool_parser_t kind, uint64_t *rng, const char *name, size_t name_len,
                      const char *args, size_t args_len) {
  if (o->n_calls == o->calls_cap) {
    size_t cap = o->calls_cap ? o->calls_cap * 2 : 4;
    coord_tool_call_t *p = realloc(o->calls, cap * sizeof *p);
    if (!p) return -ENOMEM;
    o->calls = p, o->calls_cap = cap;
  }
  coord_tool_call_t *c = &o->calls[o->n_calls];
  c->id = tools_id(kind, rng);
  c->name = strndup(name, name_len);
  c->args = args ? strndup(args, args_len) : strdup("{}");
  if (!c->id || !c->name || !c->args) {
    free(c->id), free(c->name), free(c->args);
    return -ENOMEM;
  }
  o->n_calls++;
  return 0;
}

/* ---- one call's JSON ---- */

/* A call object {"name": "...", "arguments"|"parameters": {...}} at
 * s[0..n): its name (decoded, malloc'd) and the raw text of its arguments.
 * need_args: a call without arguments is not a call (llama3_json, where a
 * plain JSON answer must stay text). Returns 1, or 0 when it is not a call. */
static int tools_call_obj(const char *s, size_t n, bool need_args, char **name, const char **args, size_t *args_len,
                          bool *args_str) {
  json_error_t je;
  json_t *obj = json_loadb(s, n, 0, &je), *nm = json_object_get(obj, "name");
  *name = NULL, *args = NULL, *args_len = 0;
  int ok = json_is_object(obj) && json_is_string(nm) && json_string_length(nm) > 0 &&
           strlen(json_string_value(nm)) == json_string_length(nm);
  json_t *a = json_object_get(obj, "arguments");
  if (!a) a = json_object_get(obj, "parameters");
  if (ok && !a && need_args) ok = 0;
  if (ok && a && !json_is_object(a) && !json_is_string(a)) ok = 0;
  if (ok) *name = strdup(json_string_value(nm));
  *args_str = ok && json_is_string(a);
  json_decref(obj);
  if (!ok) return 0;
  if (!*name) return -ENOMEM;
  if (!a) return 1;
  /* the raw text of the value: walk the top-level members */
  size_t i = tools_skip_ws(s, n, 0) + 1, e;
  for (;;) {
    i = tools_skip_ws(s, n, i);
    size_t k0 = i;
    if (tools_scan_str(s, n, i, &e) != 1) break;
    bool is_args = (e - k0 == 11 && !memcmp(s + k0, "\"arguments\"", 11)) ||
                   (e - k0 == 12 && !memcmp(s + k0, "\"parameters\"", 12));
    i = tools_skip_ws(s, n, e) + 1; /* past ':' */
    i = tools_skip_ws(s, n, i);
    size_t v0 = i;
    if (tools_scan(s, n, i, true, &e) != 1) break;
    if (is_args) {
      *args = s + v0, *args_len = e - v0;
      break;
    }
    i = tools_skip_ws(s, n, e);
    if (i >= n || s[i] != ',') break;
    i++;
  }
  return 1;
}

/* Adds the call s[0..n) to o; 1 done, 0 not a call. Arguments given as
 * a JSON string are that string's value. */
static int tools_add_obj(coord_tool_stream_t *st, coord_tool_out_t *o, const char *s, size_t n, bool need_args) {
  char *name, *decoded = NULL;
  const char *args;
  size_t args_len;
  bool args_str;
  int rc = tools_call_obj(s, n, need_args, &name, &args, &args_len, &args_str);
  if (rc <= 0) return rc;
  if (args && args_str) {
    json_t *v = json_loadb(args, args_len, JSON_DECODE_ANY, NULL);
    if (json_is_string(v)) decoded = strndup(json_string_value(v), json_string_length(v));
    json_decref(v);
    args = decoded, args_len = decoded ? strlen(decoded) : 0;
  }
  rc = tools_call(o, st->kind, &st->rng, name, strlen(name), args, args_len);
  free(name);
  free(decoded);
  if (rc) return rc;
  st->n_calls++;
  return 1;
}

/* The calls of a JSON list s[0..n) (already scanned whole), each from its
 * own text; 1 when every element is a call (added to o), 0 when one is
 * not (nothing added), or -ENOMEM. */
static int tools_list(coord_tool_stream_t *st, coord_tool_out_t *o, const char *s, size_t n) {
  coord_tool_out_t tmp;
  coord_tool_out_init(&tmp);
  uint32_t n0 = st->n_calls;
  size_t i = tools_skip_ws(s, n, 1), e;
  int ok = i < n && s[i] != ']';
  while (ok > 0) {
    if (tools_scan(s, n, i, true, &e) != 1) ok = 0;
    if (ok > 0) ok = tools_add_obj(st, &tmp, s + i, e - i, false);
    if (ok <= 0) break;
    i = tools_skip_ws(s, n, e);
    if (i < n && s[i] == ']') break;
    if (i >= n || s[i] != ',') ok = 0;
    i = tools_skip_ws(s, n, i + 1);
  }
  for (size_t k = 0; ok > 0 && k < tmp.n_calls; k++)
    if (tools_call(o, st->kind, &st->rng, tmp.calls[k].name, strlen(tmp.calls[k].name), tmp.calls[k].args,
                   strlen(tmp.calls[k].args)))
      ok = -ENOMEM;
  if (ok <= 0) st->n_calls = n0;
  coord_tool_out_free(&tmp);
  return ok;
}

/* ---- the machine ---- */

void coord_tool_stream_init(coord_tool_stream_t *s, coord_tool_parser_t kind, uint64_t seed) {
  memset(s, 0, sizeof *s);
  s->kind = kind;
  s->rng = seed;
  s->state = kind == COORD_TOOL_PARSER_LLAMA3_JSON ? TS_START : TS_TEXT;
}

void coord_tool_stream_free(coord_tool_stream_t *s) {
  free(s->buf);
  memset(s, 0, sizeof *s);
}

static const char *tools_find(const char *s, size_t n, const char *pat) {
  size_t m = strlen(pat);
  for (size_t i = 0; i + m <= n; i++)
    if (s[i] == pat[0] && !memcmp(s + i, pat, m)) return s + i;
  return NULL;
}

/* The longest end of s[0..n) that begins pat (but is not all of it). */
static size_t tools_partial(const char *s, size_t n, const char *pat) {
  size_t m = strlen(pat);
  for (size_t k = m - 1 < n ? m - 1 : n; k > 0; k--)
    if (!memcmp(s + n - k, pat, k)) return k;
  return 0;
}

/* Text that is content for sure: whitespace at its end waits (it is
 * dropped before a call and at the end of an answer with calls). */
static size_t tools_emit_text(coord_tool_stream_t *st, coord_tool_out_t *o, const char *s, size_t n, bool drop_ws,
                              int *rc) {
  size_t k = n;
  while (k > 0 && tools_ws(s[k - 1])) k--;
  (void)st;
  *rc = tools_content(o, s, k);
  return drop_ws ? n : k;
}

/* TS_TEXT: content until the open marker. Returns bytes consumed (0:
 * wait for more). */
static size_t tools_text(coord_tool_stream_t *st, coord_tool_out_t *o, const char *s, size_t n, bool final, int *rc) {
  const char *open = st->kind == COORD_TOOL_PARSER_MISTRAL ? mistral_open : hermes_open;
  const char *m = tools_find(s, n, open);
  *rc = 0;
  if (m) {
    tools_emit_text(st, o, s, (size_t)(m - s), true, rc);
    st->state = TS_CALL;
    return (size_t)(m - s) + strlen(open);
  }
  if (final) {
    if (st->n_calls) return tools_emit_text(st, o, s, n, true, rc);
    *rc = tools_content(o, s, n);
    return n;
  }
  return tools_emit_text(st, o, s, n - tools_partial(s, n, open), false, rc);
}

/* A call's text that is not a call goes back to content as written. */
static int tools_not_call(coord_tool_out_t *o, const char *open, const char *s, size_t n, const char *close) {
  int rc = tools_content(o, open, strlen(open));
  if (!rc) rc = tools_content(o, s, n);
  if (!rc && close) rc = tools_content(o, close, strlen(close));
  return rc;
}

/* hermes TS_CALL: the JSON up to </tool_call> (or the end). */
static size_t tools_hermes_call(coord_tool_stream_t *st, coord_tool_out_t *o, const char *s, size_t n, bool final,
                                int *rc) {
  const char *m = tools_find(s, n, hermes_close);
  *rc = 0;
  if (!m && !final) return 0;
  size_t body = m ? (size_t)(m - s) : n, end, j0 = tools_skip_ws(s, body, 0);
  int ok = tools_scan(s, body, j0, true, &end) == 1 && tools_skip_ws(s, body, end) == body;
  if (ok) ok = tools_add_obj(st, o, s + j0, end - j0, false);
  if (ok < 0) return *rc = ok, 0;
  if (!ok) *rc = tools_not_call(o, hermes_open, s, body, m ? hermes_close : NULL);
  st->state = TS_TEXT;
  return m ? body + strlen(hermes_close) : n;
}

/* llama3_json TS_START: a call only when the output begins with '{' (or
 * <|python_tag|>); anything else is plain text. */
static size_t tools_llama_start(coord_tool_stream_t *st, const char *s, size_t n, bool final) {
  size_t i = tools_skip_ws(s, n, 0);
  if (i == n && !final) return 0;
  if (n - i >= strlen(python_tag) && !memcmp(s + i, python_tag, strlen(python_tag))) {
    st->state = TS_CALL;
    return i + strlen(python_tag);
  }
  if (i < n && !final && !strncmp(s + i, python_tag, n - i)) return 0;
  st->state = i < n && s[i] == '{' ? TS_CALL : TS_PLAIN;
  return st->state == TS_CALL ? i : 0;
}

/* llama3_json TS_CALL: objects separated by ';'. */
static size_t tools_llama_call(coord_tool_stream_t *st, coord_tool_out_t *o, const char *s, size_t n, bool final,
                               int *rc) {
  size_t i = tools_skip_ws(s, n, 0), end;
  *rc = 0;
  if (st->n_calls && i < n && s[i] == ';') i = tools_skip_ws(s, n, i + 1);
  if (i == n) return final ? n : 0;
  int sc = s[i] == '{' ? tools_scan(s, n, i, final, &end) : -1;
  if (sc == 0 && !final) return 0;
  int ok = sc == 1 ? tools_add_obj(st, o, s + i, end - i, true) : 0;
  if (ok < 0) return *rc = ok, 0;
  if (ok) return end;
  st->state = TS_PLAIN; /* the rest is text */
  return st->n_calls ? i : 0;
}

/* mistral TS_CALL: a JSON list of calls, or name[ARGS]{...}. */
static size_t tools_mistral_call(coord_tool_stream_t *st, coord_tool_out_t *o, const char *s, size_t n, bool final,
                                 int *rc) {
  size_t i = tools_skip_ws(s, n, 0), end;
  *rc = 0;
  if (i == n && !final) return 0;
  if (i < n && s[i] == '[') {
    int sc = tools_scan(s, n, i, final, &end);
    if (sc == 0 && !final) return 0;
    int ok = sc == 1 ? tools_list(st, o, s + i, end - i) : 0;
    if (ok < 0) return *rc = ok, 0;
    st->state = TS_TEXT;
    if (sc < 0) return *rc = tools_content(o, mistral_open, strlen(mistral_open)), 0; /* the rest is text again */
    if (!ok) *rc = tools_not_call(o, mistral_open, s, sc == 1 ? end : n, NULL);
    return sc == 1 ? end : n;
  }
  /* name[ARGS]{...} */
  size_t j = i;
  while (j < n && (s[j] == '_' || s[j] == '-' || s[j] == '.' || (s[j] >= '0' && s[j] <= '9') ||
                   ((s[j] | 32) >= 'a' && (s[j] | 32) <= 'z')))
    j++;
  size_t name_end = j;
  if (j < n && s[j] == '[') {
    if (n - j < strlen(mistral_args) && !final && !strncmp(s + j, mistral_args, n - j)) return 0;
    if (n - j >= strlen(mistral_args) && !memcmp(s + j, mistral_args, strlen(mistral_args))) j += strlen(mistral_args);
  }
  j = tools_skip_ws(s, n, j);
  if (j == n && !final) return 0;
  int sc = j < n && s[j] == '{' && name_end > i ? tools_scan(s, n, j, final, &end) : -1;
  if (sc == 0 && !final) return 0;
  st->state = TS_TEXT;
  if (sc == 1) {
    *rc = tools_call(o, st->kind, &st->rng, s + i, name_end - i, s + j, end - j);
    if (!*rc) st->n_calls++;
    return end;
  }
  if (sc < 0) return *rc = tools_content(o, mistral_open, strlen(mistral_open)), 0; /* the rest is text again */
  *rc = tools_not_call(o, mistral_open, s, n, NULL);
  return n;
}

/* One move of the machine over buf; returns bytes consumed (0: wait). */
static size_t tools_step(coord_tool_stream_t *st, coord_tool_out_t *o, bool final, int *rc) {
  const char *s = st->buf;
  size_t n = st->len;
  *rc = 0;
  switch (st->state) {
  case TS_PLAIN: *rc = tools_content(o, s, n); return n;
  case TS_START: return tools_llama_start(st, s, n, final);
  case TS_TEXT: return tools_text(st, o, s, n, final, rc);
  default:
    if (st->kind == COORD_TOOL_PARSER_HERMES) return tools_hermes_call(st, o, s, n, final, rc);
    if (st->kind == COORD_TOOL_PARSER_MISTRAL) return tools_mistral_call(st, o, s, n, final, rc);
    return tools_llama_call(st, o, s, n, final, rc);
  }
}

int coord_tool_stream_feed(coord_tool_stream_t *st, const char *text, size_t n, bool final, coord_tool_out_t *o) {
  tools_out_reset(o);
  if (st->len + n + 1 > st->cap) {
    size_t cap = (st->len + n + 1) * 2;
    char *p = realloc(st->buf, cap);
    if (!p) return -ENOMEM;
    st->buf = p, st->cap = cap;
  }
  memcpy(st->buf + st->len, text, n);
  st->len += n;
  st->buf[st->len] = 0;
  for (int guard = 0; (st->len > 0 || (final && st->state == TS_CALL)) && guard < 1 << 20; guard++) {
    int state = st->state, rc;
    size_t used = tools_step(st, o, final, &rc);
    if (rc) return rc;
    memmove(st->buf, st->buf + used, st->len - used);
    st->len -= used;
    if (used == 0 && state == st->state) break; /* waits for more text */
  }
  if (final) st->len = 0;
  return 0;
}

/* ---- forced calls (tool_choice required / named) ---- */

int coord_tool_forced_calls(coord_tool_choice_t choice, const char *name, const char *text, size_t len, uint64_t seed,
                            coord_tool_out_t *out) {
  coord_tool_stream_t st;
  coord_tool_stream_init(&st, COORD_TOOL_PARSER_HERMES, seed);
  tools_out_reset(out);
  size_t i = tools_skip_ws(text, len, 0), end;
  int rc = 0;
  if (choice == COORD_TOOL_CHOICE_NAMED) {
    if (tools_scan(text, len, i, true, &end) == 1 && text[i] == '{' && tools_skip_ws(text, len, end) == len)
      rc = tools_call(out, st.kind, &st.rng, name, strlen(name), text + i, end - i);
  } else if (choice == COORD_TOOL_CHOICE_REQUIRED && tools_scan(text, len, i, true, &end) == 1 && text[i] == '[' &&
             tools_skip_ws(text, len, end) == len) {
    rc = tools_list(&st, out, text + i, end - i);
    if (rc > 0) rc = 0;
  }
  coord_tool_stream_free(&st);
  if (!rc && out->n_calls == 0) rc = tools_content(out, text, len); /* not calls (cut short): the text */
  return rc;
}

/* ---- the request ---- */

static int tools_check_list(json_t *tools, coord_http_err_t *e) {
  size_t i;
  json_t *t;
  if (!json_is_array(tools)) return coord_http_err(e, 400, "tools", "'tools' must be a list");
  json_array_foreach(tools, i, t) {
    json_t *type = json_object_get(t, "type"), *f = json_object_get(t, "function");
    json_t *nm = json_object_get(f, "name"), *params = json_object_get(f, "parameters");
    if (!json_is_object(t) || !json_is_string(type) || strcmp(json_string_value(type), "function"))
      return coord_http_err(e, 400, "tools", "tools[%zu]: 'type' must be \"function\"", i);
    if (!json_is_object(f) || !json_is_string(nm) || json_string_length(nm) == 0 || json_string_length(nm) > 256)
      return coord_http_err(e, 400, "tools", "tools[%zu]: 'function' needs a 'name' string", i);
    if (params && !json_is_null(params) && !json_is_object(params))
      return coord_http_err(e, 400, "tools", "tools[%zu]: 'function.parameters' must be an object", i);
  }
  return 0;
}

static bool tools_has(json_t *tools, const char *name) {
  size_t i;
  json_t *t;
  json_array_foreach(tools, i, t) {
    json_t *nm = json_object_get(json_object_get(t, "function"), "name");
    if (json_is_string(nm) && !strcmp(json_string_value(nm), name)) return true;
  }
  return false;
}

static int tools_named(json_t *tc, json_t *tools, const char **name, coord_http_err_t *e) {
  static const char usage[] = "Correct usage: `{\"type\": \"function\", \"function\": {\"name\": \"my_function\"}}`";
  json_t *f = json_object_get(tc, "function"), *nm = json_object_get(f, "name");
  if (!json_is_object(f))
    return coord_http_err(e, 400, "tool_choice", "Invalid value for `function` in `tool_choice`! %s", usage);
  if (!json_is_string(nm) || json_string_length(nm) == 0)
    return coord_http_err(e, 400, "tool_choice", "Invalid `name` in `function` in `tool_choice`! %s", usage);
  if (!tools_has(tools, json_string_value(nm)))
    return coord_http_err(e, 400, "tool_choice",
                          "The tool specified in `tool_choice` does not match any of the specified `tools`");
  *name = json_string_value(nm);
  return 0;
}

int coord_tool_req_parse(json_t *root, coord_tool_choice_t *choice, const char **name, coord_http_err_t *e) {
  json_t *tools = json_object_get(root, "tools"), *tc = json_object_get(root, "tool_choice");
  *choice = COORD_TOOL_CHOICE_NONE, *name = NULL;
  if (json_is_null(tools)) tools = NULL;
  if (json_is_null(tc)) tc = NULL;
  if (tools && tools_check_list(tools, e)) return -1;
  if (!tc) {
    *choice = tools && json_array_size(tools) ? COORD_TOOL_CHOICE_AUTO : COORD_TOOL_CHOICE_NONE;
    return 0;
  }
  if (json_is_string(tc) && !strcmp(json_string_value(tc), "none")) return 0;
  if (!tools) return coord_http_err(e, 400, "tool_choice", "When using `tool_choice`, `tools` must be set.");
  if (json_is_string(tc) && !strcmp(json_string_value(tc), "auto")) *choice = COORD_TOOL_CHOICE_AUTO;
  else if (json_is_string(tc) && !strcmp(json_string_value(tc), "required"))
    *choice = json_array_size(tools) ? COORD_TOOL_CHOICE_REQUIRED : COORD_TOOL_CHOICE_NONE;
  else if (json_is_object(tc)) {
    if (tools_named(tc, tools, name, e)) return -1;
    *choice = COORD_TOOL_CHOICE_NAMED;
  } else
    return coord_http_err(e, 400, "tool_choice",
                          "Invalid value for `tool_choice`! Only named tools, \"none\", \"auto\" or \"required\" are "
                          "supported.");
  if (*choice == COORD_TOOL_CHOICE_AUTO && !json_array_size(tools)) *choice = COORD_TOOL_CHOICE_NONE;
  return 0;
}

/* A function's parameters schema ({"type": "object"} when it has none). */
static json_t *tools_params(json_t *tool) {
  json_t *p = json_object_get(json_object_get(tool, "function"), "parameters");
  return json_is_object(p) ? json_incref(p) : json_pack("{s:s}", "type", "object");
}

json_t *coord_tool_choice_schema(json_t *root, coord_tool_choice_t choice, const char *name) {
  json_t *tools = json_object_get(root, "tools"), *t;
  size_t i;
  if (choice == COORD_TOOL_CHOICE_NAMED) {
    json_array_foreach(tools, i, t) {
      json_t *nm = json_object_get(json_object_get(t, "function"), "name");
      if (json_is_string(nm) && !strcmp(json_string_value(nm), name)) return tools_params(t);
    }
    return NULL;
  }
  if (choice != COORD_TOOL_CHOICE_REQUIRED) return NULL;
  json_t *any = json_array();
  json_array_foreach(tools, i, t) {
    json_t *nm = json_object_get(json_object_get(t, "function"), "name");
    json_array_append_new(any, json_pack("{s:s,s:{s:{s:s,s:[O]},s:o},s:[s,s]}", "type", "object", "properties", "name",
                                         "type", "string", "enum", nm, "parameters", tools_params(t), "required",
                                         "name", "parameters"));
  }
  return json_pack("{s:s,s:i,s:{s:o}}", "type", "array", "minItems", 1, "items", "anyOf", any);
}

int coord_tool_req_check(const coord_http_req_t *r, const coord_tool_cfg_t *cfg, coord_http_err_t *e) {
  if (r->tool_choice == COORD_TOOL_CHOICE_AUTO && !(cfg->auto_choice && cfg->parser != COORD_TOOL_PARSER_NONE))
    return coord_http_err(e, 400, "tool_choice",
                          "\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set");
  return 0;
}
