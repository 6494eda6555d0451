/* http_resp.c - OpenAI / vLLM response shapes: errors, completions, chat
 * completions, SSE chunks, the model list. See http_internal.h. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/http/http_internal.h"
#include "model/tokenizer.h"

/* ---- errors ---- */

static const char *resp_err_type(int status) {
  switch (status) {
  case 401: return "authentication_error";
  case 429: return "rate_limit_error";
  default: return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

static const char *resp_err_code(const coord_http_err_t *e) {
  if (e->code) return e->code;
  switch (e->status) {
  case 401: return "invalid_api_key";
  case 413: return "request_too_large";
  case 429: return "rate_limit_exceeded";
  case 503: return "service_unavailable";
  default: return e->status >= 500 ? "internal_error" : NULL;
  }
}

static json_t *resp_error_obj(const coord_http_err_t *e) {
  const char *code = resp_err_code(e);
  return json_pack("{s:{s:s,s:s,s:o,s:o}}", "error", "message", e->message, "type", resp_err_type(e->status), "param",
                   e->param ? json_string(e->param) : json_null(), "code", code ? json_string(code) : json_null());
}

/* Dumps and frees a JSON value; NULL in, NULL out. */
static char *resp_dump(json_t *j) {
  if (!j) return NULL;
  char *s = json_dumps(j, JSON_COMPACT);
  json_decref(j);
  return s;
}

char *coord_http_error_json(const coord_http_err_t *e) {
  coord_http_err_t safe = *e;
  json_t *j = resp_error_obj(&safe);
  if (!j) { /* a message that is not UTF-8 (from the coordinator): drop it */
    snprintf(safe.message, sizeof safe.message, "error %d", e->status);
    j = resp_error_obj(&safe);
  }
  return resp_dump(j);
}

/* The coordinator's codes are HTTP-like; those that mean something else
 * over HTTP are mapped: TOO_BIG is a prompt longer than the context, a 400
 * as vLLM answers (HTTP's own 413 is for bodies). */
void coord_http_err_from_proto(coord_http_err_t *e, int32_t code, const char *message) {
  int status = code >= 400 && code <= 599 ? code : 500;
  if (code == PROTO_ERR_TOO_BIG || code == PROTO_ERR_CANCELED) status = 400;
  if (code == PROTO_ERR_TIMEOUT) status = 503;
  if (code == PROTO_ERR_VERSION) status = 500;
  coord_http_err(e, status, NULL, "%s", message && *message ? message : "the engine refused the request");
  if (code == PROTO_ERR_TOO_BIG) e->code = "context_length_exceeded";
  /* checks only the engine can make (against the vocabulary) name the field first: "logit_bias: ..." */
  static const char *const fields[] = {"logit_bias"};
  for (size_t i = 0; status == 400 && message && i < sizeof fields / sizeof fields[0]; i++)
    if (!strncmp(message, fields[i], strlen(fields[i])) && message[strlen(fields[i])] == ':') e->param = fields[i];
}

/* ---- token strings for logprobs ---- */

/* The token's text, and its bytes as a JSON array. Without a tokenizer (or
 * for an unknown id) the text is "token_id:N" as vLLM's
 * return_tokens_as_token_ids gives; bytes that are not UTF-8 read
 * "bytes:\xNN..." as vLLM writes them. */
static json_t *resp_token_str(const coord_http_meta_t *m, int32_t id, json_t **bytes_out) {
  const char *b = NULL;
  size_t n = 0;
  if (m->tok) b = model_token_bytes(m->tok, id, &n);
  char tmp[64];
  if (!b) {
    snprintf(tmp, sizeof tmp, "token_id:%d", id);
    b = tmp, n = strlen(tmp);
  }
  if (bytes_out) {
    *bytes_out = json_array();
    for (size_t i = 0; i < n && *bytes_out; i++) json_array_append_new(*bytes_out, json_integer((unsigned char)b[i]));
  }
  json_t *valid = json_stringn(b, n); /* NULL when not UTF-8 */
  if (valid) return valid;
  char *hex = malloc(6 + 4 * n + 1);
  if (!hex) return NULL;
  size_t w = (size_t)sprintf(hex, "bytes:");
  for (size_t i = 0; i < n; i++) w += (size_t)sprintf(hex + w, "\\x%02x", (unsigned char)b[i]);
  json_t *j = json_stringn(hex, w);
  free(hex);
  return j;
}

/* Chat: {"token", "logprob", "bytes"} (+ "top_logprobs" when top != NULL). */
static json_t *resp_chat_lp_entry(const coord_http_meta_t *m, int32_t id, float lp) {
  json_t *bytes = NULL, *tok = resp_token_str(m, id, &bytes);
  return json_pack("{s:o,s:f,s:o}", "token", tok ? tok : json_string("?"), "logprob", (double)lp, "bytes",
                   bytes ? bytes : json_array());
}

static int resp_chat_lp_append(json_t *content, const coord_http_meta_t *m, const proto_event_t *ev, uint32_t i) {
  json_t *entry = resp_chat_lp_entry(m, ev->tokens[i], i < ev->n_logprobs ? ev->logprobs[i] : 0.f);
  json_t *tops = json_array();
  if (!entry || !tops) goto fail;
  for (uint32_t k = 0; k < ev->top_n && (size_t)i * ev->top_n + k < ev->n_top; k++) {
    const proto_toplp_t *t = &ev->top[(size_t)i * ev->top_n + k];
    if (json_array_append_new(tops, resp_chat_lp_entry(m, t->token, t->logprob))) goto fail;
  }
  if (json_object_set_new(entry, "top_logprobs", tops)) {
    tops = NULL;
    goto fail;
  }
  return json_array_append_new(content, entry);
fail:
  json_decref(entry);
  json_decref(tops);
  return -1;
}

/* Completions: parallel arrays tokens / token_logprobs / top_logprobs
 * ({token: logprob}) / text_offset. */
static int resp_cmpl_lp_append(json_t *lp, const coord_http_meta_t *m, const proto_event_t *ev, uint32_t i,
                               size_t *offset) {
  json_t *tok = resp_token_str(m, ev->tokens[i], NULL), *top = json_object();
  if (!tok || !top) goto fail;
  for (uint32_t k = 0; k < ev->top_n && (size_t)i * ev->top_n + k < ev->n_top; k++) {
    const proto_toplp_t *t = &ev->top[(size_t)i * ev->top_n + k];
    json_t *ts = resp_token_str(m, t->token, NULL);
    if (!ts || json_object_set_new(top, json_string_value(ts), json_real(t->logprob))) {
      json_decref(ts);
      goto fail;
    }
    json_decref(ts);
  }
  size_t tl = json_string_length(tok);
  json_array_append_new(json_object_get(lp, "text_offset"), json_integer((json_int_t)*offset));
  json_array_append_new(json_object_get(lp, "token_logprobs"), json_real(i < ev->n_logprobs ? ev->logprobs[i] : 0.f));
  json_array_append_new(json_object_get(lp, "tokens"), tok);
  json_array_append_new(json_object_get(lp, "top_logprobs"), top);
  *offset += tl;
  return 0;
fail:
  json_decref(tok);
  json_decref(top);
  return -1;
}

static json_t *resp_lp_new(coord_http_api_t api) {
  if (api == COORD_HTTP_API_CHAT) return json_pack("{s:[]}", "content");
  return json_pack("{s:[],s:[],s:[],s:[]}", "text_offset", "token_logprobs", "tokens", "top_logprobs");
}

/* Appends the event's tokens to an API-shaped logprobs object. */
static int resp_lp_add(json_t *lp, const coord_http_meta_t *m, const proto_event_t *ev, size_t *offset) {
  for (uint32_t i = 0; i < ev->n_tokens; i++) {
    int rc = m->api == COORD_HTTP_API_CHAT ? resp_chat_lp_append(json_object_get(lp, "content"), m, ev, i)
                                           : resp_cmpl_lp_append(lp, m, ev, i, offset);
    if (rc) return -ENOMEM;
  }
  return 0;
}

/* ---- prompt logprobs ---- */

/* One vLLM prompt logprobs entry: {"<id>": {"logprob", "rank", "decoded_token"}} for the prompt token and
 * its alternatives (the token once when it is one of them). */
static json_t *resp_plp_entry(const coord_http_meta_t *m, const proto_prompt_lp_t *p, uint32_t i) {
  json_t *o = json_object();
  int32_t id = p->tokens[i + 1];
  char key[16];
  for (int32_t k = -1; o && k < (int32_t)p->top_n; k++) {
    const proto_toplp_t *t = k >= 0 ? &p->top[(size_t)i * p->top_n + (size_t)k] : NULL;
    int32_t tid = t ? t->token : id;
    if (t && tid == id) continue;
    json_t *s = resp_token_str(m, tid, NULL);
    snprintf(key, sizeof key, "%d", tid);
    json_t *v = json_pack("{s:f,s:I,s:o}", "logprob", (double)(t ? t->logprob : p->lp[i]), "rank",
                          (json_int_t)(t ? k + 1 : (int32_t)p->rank[i]), "decoded_token", s ? s : json_string("?"));
    if (!v || json_object_set_new(o, key, v)) json_decref(o), o = NULL;
  }
  return o;
}

/* vLLM's prompt_logprobs: null for the first token, then one entry each. */
static json_t *resp_plp_vllm(const coord_http_meta_t *m, const proto_prompt_lp_t *p) {
  json_t *a = json_array();
  if (a && p->n_tokens && json_array_append_new(a, json_null())) goto fail;
  for (uint32_t i = 0; a && i < p->n_lp; i++)
    if (json_array_append_new(a, resp_plp_entry(m, p, i))) goto fail;
  return a;
fail:
  json_decref(a);
  return NULL;
}

/* echo with logprobs (completions): the prompt's tokens first, the first with null logprobs; top_logprobs
 * hold m->logprobs alternatives and the token itself. */
static int resp_plp_echo(json_t *lp, const coord_http_meta_t *m, const proto_prompt_lp_t *p, size_t *offset) {
  for (uint32_t i = 0; i < p->n_tokens; i++) {
    json_t *tok = resp_token_str(m, p->tokens[i], NULL), *top = i ? json_object() : json_null();
    for (uint32_t k = 0; i && top && k < (uint32_t)m->logprobs && k < p->top_n; k++) {
      const proto_toplp_t *t = &p->top[(size_t)(i - 1) * p->top_n + k];
      json_t *ts = resp_token_str(m, t->token, NULL);
      if (ts) json_object_set_new(top, json_string_value(ts), json_real(t->logprob));
      json_decref(ts);
    }
    if (i && top && tok) json_object_set_new(top, json_string_value(tok), json_real(p->lp[i - 1]));
    if (!tok || !top) {
      json_decref(tok);
      json_decref(top);
      return -ENOMEM;
    }
    size_t tl = json_string_length(tok);
    json_array_append_new(json_object_get(lp, "text_offset"), json_integer((json_int_t)*offset));
    json_array_append_new(json_object_get(lp, "token_logprobs"), i ? json_real(p->lp[i - 1]) : json_null());
    json_array_append_new(json_object_get(lp, "tokens"), tok);
    json_array_append_new(json_object_get(lp, "top_logprobs"), top);
    *offset += tl;
  }
  return 0;
}

/* The prompt logprobs of a job's first event into a. */
static int resp_plp_add(coord_http_acc_t *a, const coord_http_meta_t *m, const proto_event_t *ev) {
  if (!ev->has_plp) return 0;
  if (m->prompt_logprobs >= 0 && !a->prompt_lp && !(a->prompt_lp = resp_plp_vllm(m, &ev->plp))) return -ENOMEM;
  if (!m->echo || m->logprobs < 0 || m->api == COORD_HTTP_API_CHAT) return 0;
  if (!a->logprobs && !(a->logprobs = resp_lp_new(m->api))) return -ENOMEM;
  return resp_plp_echo(a->logprobs, m, &ev->plp, &a->text_offset);
}

/* ---- accumulation ---- */

void coord_http_acc_init(coord_http_acc_t *a) {
  memset(a, 0, sizeof *a);
  a->stop_id = -1;
}

void coord_http_acc_free(coord_http_acc_t *a) {
  free(a->text);
  free(a->stop_str);
  json_decref(a->logprobs);
  json_decref(a->prompt_lp);
  memset(a, 0, sizeof *a);
}

static int resp_text_add(coord_http_acc_t *a, const char *s, size_t n) {
  if (a->text_len + n + 1 > a->text_cap) {
    size_t cap = (a->text_len + n + 1) * 2;
    char *p = realloc(a->text, cap);
    if (!p) return -ENOMEM;
    a->text = p, a->text_cap = cap;
  }
  memcpy(a->text + a->text_len, s, n);
  a->text_len += n;
  a->text[a->text_len] = 0;
  return 0;
}

int coord_http_acc_text(coord_http_acc_t *a, const char *s, size_t n) { return resp_text_add(a, s, n); }

static size_t resp_ev_text_len(const proto_event_t *ev) {
  return ev->text ? (ev->text_len ? ev->text_len : strlen(ev->text)) : 0;
}

int coord_http_acc_add(coord_http_acc_t *a, const coord_http_meta_t *m, const proto_event_t *ev) {
  if (resp_text_add(a, ev->text ? ev->text : "", resp_ev_text_len(ev))) return -ENOMEM;
  a->n_tokens += ev->n_tokens;
  if (resp_plp_add(a, m, ev)) return -ENOMEM;
  if (m->logprobs >= 0 && ev->n_tokens) {
    if (!a->logprobs && !(a->logprobs = resp_lp_new(m->api))) return -ENOMEM;
    if (resp_lp_add(a->logprobs, m, ev, &a->text_offset)) return -ENOMEM;
  }
  for (uint32_t i = 0; i < ev->n_logprobs; i++) a->cum_logprob += ev->logprobs[i];
  if (ev->finish != PROTO_FINISH_NONE) {
    a->finish = ev->finish;
    a->stop_id = ev->stop_id;
    free(a->stop_str);
    a->stop_str = ev->stop_str ? strdup(ev->stop_str) : NULL;
    if (ev->stop_str && !a->stop_str) return -ENOMEM;
  }
  if (ev->has_usage) a->has_usage = true, a->usage = ev->usage;
  return 0;
}

/* ---- answers ---- */

static json_t *resp_finish(proto_finish_t f) {
  switch (f) {
  case PROTO_FINISH_NONE: return json_null();
  case PROTO_FINISH_STOP: return json_string("stop");
  case PROTO_FINISH_LENGTH: return json_string("length");
  default: return json_string("abort");
  }
}

static json_t *resp_usage(const proto_usage_t *u) {
  json_t *j = json_pack("{s:i,s:i,s:i}", "prompt_tokens", (json_int_t)u->prompt_tokens, "completion_tokens",
                        (json_int_t)u->completion_tokens, "total_tokens",
                        (json_int_t)u->prompt_tokens + (json_int_t)u->completion_tokens);
  if (j && u->cached_tokens)
    json_object_set_new(j, "prompt_tokens_details", json_pack("{s:i}", "cached_tokens", (json_int_t)u->cached_tokens));
  return j;
}

static json_t *resp_envelope(const coord_http_meta_t *m, const char *object, json_t *choices) {
  return json_pack("{s:s,s:s,s:I,s:s,s:o}", "id", m->id, "object", object, "created", (json_int_t)m->created, "model",
                   m->model ? m->model : "", "choices", choices);
}

/* Text that may not be valid UTF-8 as a JSON string (never fails for that). */
static json_t *resp_text(const char *s, size_t n) {
  json_t *j = json_stringn(s ? s : "", s ? n : 0);
  return j ? j : json_string("\xEF\xBF\xBD");
}

/* vLLM's stop_reason: the stop string or stop token id that matched, null
 * at EOS or a length limit. */
static json_t *resp_stop_reason(const char *str, int32_t id) {
  if (str) return resp_text(str, strlen(str));
  return id >= 0 ? json_integer(id) : json_null();
}

/* [{"id", "type": "function", "function": {"name", "arguments"}}]. */
static json_t *resp_tool_calls(const coord_tool_out_t *o) {
  json_t *arr = json_array();
  for (size_t i = 0; arr && i < o->n_calls; i++) {
    const coord_tool_call_t *c = &o->calls[i];
    json_t *call = json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", c->id, "type", "function", "function", "name", c->name,
                             "arguments", c->args);
    if (!call || json_array_append_new(arr, call)) {
      json_decref(arr);
      return NULL;
    }
  }
  return arr;
}

/* The output (or its content after the think block) of a chat whose tool
 * calls are parsed (or forced) split into content and calls; 0 or -ENOMEM. */
static int resp_tools_split(const coord_http_meta_t *m, const char *text, size_t len, uint32_t index,
                            coord_tool_out_t *o) {
  uint64_t seed = m->tool_seed ^ ((uint64_t)index * 0x9e3779b97f4a7c15ull); /* each choice's call ids */
  if (m->tool_choice == COORD_TOOL_CHOICE_REQUIRED || m->tool_choice == COORD_TOOL_CHOICE_NAMED)
    return coord_tool_forced_calls(m->tool_choice, m->tool_name, text, len, seed, o);
  coord_tool_stream_t st;
  coord_tool_stream_init(&st, m->tool_parser, seed);
  int rc = coord_tool_stream_feed(&st, text, len, true, o);
  coord_tool_stream_free(&st);
  return rc;
}

static bool resp_tools_on(const coord_http_meta_t *m) {
  return m->api == COORD_HTTP_API_CHAT &&
         (m->tool_parser != COORD_TOOL_PARSER_NONE || m->tool_choice == COORD_TOOL_CHOICE_REQUIRED ||
          m->tool_choice == COORD_TOOL_CHOICE_NAMED);
}

/* The finish reason of a chat that made calls: "tool_calls" (vLLM: not
 * for a named function, which finishes as it stopped). */
static json_t *resp_tools_finish(const coord_http_meta_t *m, proto_finish_t f, bool called) {
  if (called && m->tool_choice != COORD_TOOL_CHOICE_NAMED && f != PROTO_FINISH_NONE && f != PROTO_FINISH_ERROR)
    return json_string("tool_calls");
  return resp_finish(f);
}

/* A chat answer's message from its content text: the text, or content and
 * tool_calls (*called: some); thought: a think block came before it (an
 * empty content is then null, as vLLM answers). */
static json_t *resp_chat_content(const coord_http_meta_t *m, const char *text, size_t len, bool thought,
                                 uint32_t index, bool *called) {
  *called = false;
  if (!resp_tools_on(m))
    return json_pack("{s:s,s:o}", "role", "assistant", "content",
                     thought && !len ? json_null() : resp_text(text, len));
  coord_tool_out_t o;
  coord_tool_out_init(&o);
  json_t *msg = NULL;
  if (!resp_tools_split(m, text, len, index, &o)) {
    *called = o.n_calls > 0;
    bool empty = o.content_len == 0 && (*called || thought || m->tool_choice == COORD_TOOL_CHOICE_NAMED);
    msg = json_pack("{s:s,s:o,s:o}", "role", "assistant", "content",
                    empty ? json_null() : resp_text(o.content, o.content_len), "tool_calls", resp_tool_calls(&o));
  }
  coord_tool_out_free(&o);
  return msg;
}

/* A chat answer's message; with a reasoning parser its think block is
 * reasoning_content (null when there is none) and the rest is read as
 * the content. */
static json_t *resp_chat_message(const coord_http_meta_t *m, const coord_http_acc_t *a, uint32_t index, bool *called) {
  if (m->reasoning == COORD_REASON_PARSER_NONE)
    return resp_chat_content(m, a->text ? a->text : "", a->text_len, false, index, called);
  coord_reason_stream_t st;
  coord_reason_out_t o;
  coord_reason_stream_init(&st, m->reasoning);
  coord_reason_out_init(&o);
  json_t *msg = NULL;
  if (!coord_reason_stream_feed(&st, a->text ? a->text : "", a->text_len, true, &o) &&
      (msg = resp_chat_content(m, o.content ? o.content : "", o.content_len, o.thought, index, called)))
    json_object_set_new(msg, "reasoning_content",
                        o.thought && !m->hide_reasoning ? resp_text(o.reasoning, o.reasoning_len) : json_null());
  coord_reason_out_free(&o);
  coord_reason_stream_free(&st);
  return msg;
}

static json_t *resp_choice(const coord_http_meta_t *m, const coord_http_acc_t *a, uint32_t index) {
  json_t *lp = a->logprobs ? json_incref(a->logprobs) : m->logprobs >= 0 ? resp_lp_new(m->api) : json_null();
  json_t *why = resp_stop_reason(a->stop_str, a->stop_id);
  if (m->api == COORD_HTTP_API_CHAT) {
    bool called;
    json_t *msg = resp_chat_message(m, a, index, &called);
    return json_pack("{s:i,s:o,s:o,s:o,s:o}", "index", (json_int_t)index, "message", msg, "logprobs", lp,
                     "finish_reason", resp_tools_finish(m, a->finish, called), "stop_reason", why);
  }
  json_t *c = json_pack("{s:i,s:o,s:o,s:o,s:o}", "index", (json_int_t)index, "text", resp_text(a->text, a->text_len),
                        "logprobs", lp, "finish_reason", resp_finish(a->finish), "stop_reason", why);
  if (c && m->prompt_logprobs >= 0)
    json_object_set_new(c, "prompt_logprobs", a->prompt_lp ? json_incref(a->prompt_lp) : json_null());
  return c;
}

char *coord_http_final_json(const coord_http_meta_t *m, const coord_http_acc_t *const *accs, size_t n,
                            const proto_usage_t *u) {
  json_t *choices = json_array();
  for (size_t i = 0; i < n && choices; i++)
    if (json_array_append_new(choices, resp_choice(m, accs[i], (uint32_t)i))) {
      json_decref(choices);
      choices = NULL;
    }
  if (!choices) return NULL;
  json_t *j = resp_envelope(m, m->api == COORD_HTTP_API_CHAT ? "chat.completion" : "text_completion", choices);
  if (j) json_object_set_new(j, "usage", resp_usage(u));
  if (j && m->api == COORD_HTTP_API_CHAT && m->prompt_logprobs >= 0) /* vLLM: the response's, not a choice's */
    json_object_set_new(j, "prompt_logprobs", n && accs[0]->prompt_lp ? json_incref(accs[0]->prompt_lp) : json_null());
  return resp_dump(j);
}

/* A chat chunk's delta: the content, and the reasoning when there is
 * some (then the content only when there is some too, as vLLM's deltas
 * carry only the fields they set). Takes text. */
static json_t *resp_delta(json_t *text, bool role, const coord_http_think_t *think) {
  json_t *delta = json_object();
  if (!delta || !text) {
    json_decref(text), json_decref(delta);
    return NULL;
  }
  if (think && think->r_len) {
    json_object_set_new(delta, "reasoning_content", resp_text(think->r, think->r_len));
    if (json_string_length(text)) json_object_set(delta, "content", text);
    json_decref(text);
  } else
    json_object_set_new(delta, "content", text);
  if (role) json_object_set_new(delta, "role", json_string("assistant"));
  return delta;
}

/* The choice of one streamed chunk: text (n bytes) as its content or
 * text, think's reasoning, the event's logprobs, finish (consumed; NULL:
 * the event's). */
static json_t *resp_chunk_choice(const coord_http_meta_t *m, const proto_event_t *ev, bool role, uint32_t index,
                                 const char *t, size_t n, json_t *finish, const coord_http_think_t *think) {
  json_t *lp = json_null();
  size_t off = 0;
  if (!finish) finish = resp_finish(ev->finish);
  bool echo_lp = ev->has_plp && m->echo && m->api != COORD_HTTP_API_CHAT; /* the prompt's tokens first */
  if (m->logprobs >= 0 && (ev->n_tokens || echo_lp) && (lp = resp_lp_new(m->api)) &&
      ((echo_lp && resp_plp_echo(lp, m, &ev->plp, &off)) || resp_lp_add(lp, m, ev, &off))) {
    json_decref(lp);
    json_decref(finish);
    return NULL;
  }
  json_t *text = resp_text(t, n);
  json_t *why = resp_stop_reason(ev->stop_str, ev->finish == PROTO_FINISH_NONE ? -1 : ev->stop_id);
  if (m->api == COORD_HTTP_API_CHAT) {
    json_t *delta = resp_delta(text, role, think);
    return json_pack("{s:i,s:o,s:o,s:o,s:o}", "index", (json_int_t)index, "delta", delta, "logprobs", lp,
                     "finish_reason", finish, "stop_reason", why);
  }
  json_t *c = json_pack("{s:i,s:o,s:o,s:o,s:o}", "index", (json_int_t)index, "text", text, "logprobs", lp,
                        "finish_reason", finish, "stop_reason", why);
  if (c && ev->has_plp && m->prompt_logprobs >= 0) /* vLLM: in the choice's first chunk */
    json_object_set_new(c, "prompt_logprobs", resp_plp_vllm(m, &ev->plp));
  return c;
}

/* Appends "data: <json>\n\n" of j (consumed) to *out. */
static int resp_sse_add(char **out, size_t *len, json_t *j) {
  char *s = resp_dump(j);
  if (!s) return -ENOMEM;
  size_t n = strlen(s);
  char *p = realloc(*out, *len + n + 9);
  if (!p) {
    free(s);
    return -ENOMEM;
  }
  *len += (size_t)sprintf(p + *len, "data: %s\n\n", s);
  *out = p;
  free(s);
  return 0;
}

/* Appends one chunk of choice (consumed) to *out. */
static int resp_chunk_add(const coord_http_meta_t *m, char **out, size_t *len, json_t *choice) {
  const char *object = m->api == COORD_HTTP_API_CHAT ? "chat.completion.chunk" : "text_completion";
  json_t *j = choice ? resp_envelope(m, object, json_pack("[o]", choice)) : NULL;
  if (j && m->include_usage) json_object_set_new(j, "usage", json_null());
  return resp_sse_add(out, len, j);
}

char *coord_http_chunk_sse(const coord_http_meta_t *m, const proto_event_t *ev, bool first, uint32_t index,
                           const coord_http_think_t *think) {
  char *out = NULL;
  size_t len = 0;
  bool held = resp_ev_text_len(ev) == 0 && !(think && think->r_len) && !(m->logprobs >= 0 && ev->n_tokens);
  if (m->reasoning != COORD_REASON_PARSER_NONE && held && !first && ev->finish == PROTO_FINISH_NONE)
    return calloc(1, 1); /* a tag held back: nothing to send yet */
  json_t *choice = resp_chunk_choice(m, ev, first && m->api == COORD_HTTP_API_CHAT, index, ev->text,
                                     resp_ev_text_len(ev), NULL, think);
  if (resp_chunk_add(m, &out, &len, choice)) {
    free(out);
    return NULL;
  }
  return out;
}

/* A chunk of one tool call delta of choice index: {"index", "id", "type",
 * "function": {"name", "arguments": ""}} (head) or {"index", "function":
 * {"arguments"}}. */
static json_t *resp_call_delta(const coord_tool_call_t *c, uint32_t call, bool head, uint32_t index) {
  json_t *d = head ? json_pack("{s:i,s:s,s:s,s:{s:s,s:s}}", "index", (json_int_t)call, "id", c->id, "type", "function",
                               "function", "name", c->name, "arguments", "")
                   : json_pack("{s:i,s:{s:s}}", "index", (json_int_t)call, "function", "arguments", c->args);
  return json_pack("{s:i,s:{s:[o]},s:n,s:n}", "index", (json_int_t)index, "delta", "tool_calls", d, "logprobs",
                   "finish_reason");
}

char *coord_http_chunk_sse_tools(const coord_http_meta_t *m, const proto_event_t *ev, bool first,
                                 const coord_tool_out_t *o, uint32_t call0, bool called, uint32_t index,
                                 const coord_http_think_t *think) {
  char *out = NULL;
  size_t len = 0;
  bool last = ev->finish != PROTO_FINISH_NONE, any = called || o->n_calls;
  int rc = 0;
  if (o->content_len || first || (last && !o->n_calls) || (m->logprobs >= 0 && ev->n_tokens) || (think && think->r_len))
    rc = resp_chunk_add(m, &out, &len,
                        resp_chunk_choice(m, ev, first, index, o->content ? o->content : "", o->content_len,
                                          o->n_calls ? json_null() : resp_tools_finish(m, ev->finish, any), think));
  for (size_t i = 0; !rc && i < o->n_calls; i++) {
    rc = resp_chunk_add(m, &out, &len, resp_call_delta(&o->calls[i], call0 + (uint32_t)i, true, index));
    if (!rc) rc = resp_chunk_add(m, &out, &len, resp_call_delta(&o->calls[i], call0 + (uint32_t)i, false, index));
  }
  if (!rc && last && o->n_calls)
    rc = resp_chunk_add(m, &out, &len, json_pack("{s:i,s:{},s:n,s:o}", "index", (json_int_t)index, "delta", "logprobs",
                                                 "finish_reason", resp_tools_finish(m, ev->finish, any)));
  if (rc) {
    free(out);
    return NULL;
  }
  return out ? out : calloc(1, 1); /* nothing decided yet: no chunk */
}

char *coord_http_usage_sse(const coord_http_meta_t *m, const proto_usage_t *u) {
  char *out = NULL;
  size_t len = 0;
  json_t *j = resp_envelope(m, m->api == COORD_HTTP_API_CHAT ? "chat.completion.chunk" : "text_completion", json_array());
  if (j) json_object_set_new(j, "usage", resp_usage(u));
  if (resp_sse_add(&out, &len, j)) {
    free(out);
    return NULL;
  }
  return out;
}

char *coord_http_error_sse(const coord_http_err_t *e) {
  char *s = coord_http_error_json(e);
  if (!s) return NULL;
  char *out = malloc(strlen(s) + 9);
  if (out) sprintf(out, "data: %s\n\n", s);
  free(s);
  return out;
}

char *coord_http_models_json(const char *name, uint32_t max_model_len, long long created) {
  json_t *model = json_pack("{s:s,s:s,s:I,s:s,s:s,s:n,s:I,s:[]}", "id", name, "object", "model", "created",
                            (json_int_t)created, "owned_by", "ferrum", "root", name, "parent", "max_model_len",
                            (json_int_t)max_model_len, "permission");
  return resp_dump(json_pack("{s:s,s:[o]}", "object", "list", "data", model));
}
