/* chat.c - a chat as prompt tokens: the model's Jinja template rendered by
 * model/jinja.h with the variables transformers passes (model_chat_apply).
 * The hand-written renderers here are only the fallback for a model with no
 * template at all, chosen by a built-in name ("chatml", "llama3", ...);
 * they are byte-equal to the upstream templates rendered the way
 * transformers' apply_chat_template(add_generation_prompt=True,
 * enable_thinking=False) does (see tests/tokenizer/templates/). */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "model/chat.h"
#include "model/file.h"
#include "model/jinja.h"
#include "model/tok_internal.h"

#define SMOLLM2_SYSTEM "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
#define QWEN25_SYSTEM "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

typedef struct {
  char *p;
  size_t n, cap;
} sbuf_t;

static void sb_putn(sbuf_t *b, const char *s, size_t n) {
  if (b->n + n + 1 > b->cap) {
    while (b->n + n + 1 > b->cap) b->cap = b->cap ? b->cap * 2 : 256;
    b->p = fr_realloc(b->p, b->cap);
  }
  if (n) memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = '\0';
}

static void sb_put(sbuf_t *b, const char *s) { sb_putn(b, s ? s : "", s ? strlen(s) : 0); }

/* ---------- Python string helpers ---------- */

/* Bounds of s after Python's str.strip() (Unicode whitespace). */
static void py_strip(const char *s, size_t *b, size_t *e) {
  const unsigned char *u = (const unsigned char *)s;
  size_t n = strlen(s), i = 0, j = n;
  while (i < n) {
    int l = tok__utf8_len(u + i, n - i);
    if (!l || !tok__is_py_space(tok__utf8_cp(u + i, l))) break;
    i += (size_t)l;
  }
  while (j > i) {
    size_t k = j - 1;
    while (k > i && (u[k] & 0xC0) == 0x80 && j - k < 4) k--;
    int l = tok__utf8_len(u + k, j - k);
    if (!l || (size_t)l != j - k || !tok__is_py_space(tok__utf8_cp(u + k, l))) break;
    j = k;
  }
  *b = i, *e = j;
}

static void sb_put_stripped(sbuf_t *b, const char *s) {
  size_t i, j;
  py_strip(s ? s : "", &i, &j);
  sb_putn(b, s + i, j - i);
}

static bool role_is(const model_chat_msg_t *m, const char *r) { return m->role && !strcmp(m->role, r); }

/* ---------- detection ---------- */

static const char *const k_names[] = {"unknown", "chatml", "smollm2", "qwen2.5", "qwen3", "llama3", "llama2", "mistral"};

const char *model_chat_kind_name(model_chat_kind_t k) {
  return (unsigned)k < FR_ARRAY_SIZE(k_names) ? k_names[k] : "unknown";
}

model_chat_kind_t model_chat_detect(const char *t) {
  if (!t) return MODEL_CHAT_UNKNOWN;
  for (size_t i = 1; i < FR_ARRAY_SIZE(k_names); i++)
    if (!strcmp(t, k_names[i])) return (model_chat_kind_t)i;
  if (strstr(t, "<|im_start|>")) {
    if (strstr(t, "You are a helpful AI assistant named SmolLM")) return MODEL_CHAT_SMOLLM2;
    if (strstr(t, "enable_thinking") || strstr(t, "<think>")) return MODEL_CHAT_QWEN3;
    if (strstr(t, "You are Qwen, created by Alibaba Cloud")) return MODEL_CHAT_QWEN25;
    return MODEL_CHAT_CHATML;
  }
  if (strstr(t, "<|start_header_id|>") && strstr(t, "<|end_header_id|>")) return MODEL_CHAT_LLAMA3;
  if (strstr(t, "[INST]")) return strstr(t, "<<SYS>>") ? MODEL_CHAT_LLAMA2 : MODEL_CHAT_MISTRAL;
  return MODEL_CHAT_UNKNOWN;
}

/* ---------- renderers ---------- */

static void im_turn(sbuf_t *b, const char *role, const char *content) {
  sb_put(b, "<|im_start|>");
  sb_put(b, role);
  sb_put(b, "\n");
  sb_put(b, content);
  sb_put(b, "<|im_end|>\n");
}

static int render_chatml(const model_chat_msg_t *m, size_t n, const char *default_system, sbuf_t *b) {
  for (size_t i = 0; i < n; i++) {
    if (i == 0 && default_system && !role_is(&m[0], "system")) im_turn(b, "system", default_system);
    im_turn(b, m[i].role, m[i].content);
  }
  sb_put(b, "<|im_start|>assistant\n");
  return 0;
}

/* Qwen2.5-Instruct without tools. */
static int render_qwen25(const model_chat_msg_t *m, size_t n, sbuf_t *b) {
  im_turn(b, "system", role_is(&m[0], "system") ? m[0].content : QWEN25_SYSTEM);
  for (size_t i = 0; i < n; i++) {
    if (role_is(&m[i], "tool")) return fr_errorf(FR_EUNSUPPORTED, "chat: qwen2.5 tool messages are not supported");
    if (role_is(&m[i], "user") || (role_is(&m[i], "system") && i > 0) || role_is(&m[i], "assistant"))
      im_turn(b, m[i].role, m[i].content);
  }
  sb_put(b, "<|im_start|>assistant\n");
  return 0;
}

static bool has_prefix(const char *s, const char *p) { return !strncmp(s, p, strlen(p)); }
static bool has_suffix(const char *s, const char *p) {
  size_t n = strlen(s), k = strlen(p);
  return n >= k && !memcmp(s + n - k, p, k);
}

/* [b, e) with the given characters stripped from the left/right. */
static void strip_nl(const char *s, size_t *b, size_t *e, bool left, bool right) {
  while (left && *b < *e && s[*b] == '\n') (*b)++;
  while (right && *e > *b && s[*e - 1] == '\n') (*e)--;
}

static const char *last_strstr(const char *s, size_t n, const char *p) {
  const char *last = NULL;
  size_t k = strlen(p);
  for (const char *q = s; (q = memmem(q, n - (size_t)(q - s), p, k)); q++) last = q;
  return last;
}

/* Qwen3's assistant turn: the content after the last </think>, and the
 * reasoning between the last <think> before the first </think> and it. A
 * think block is written after the last user query when the turn is the
 * last one or has reasoning. */
static void qwen3_assistant(sbuf_t *b, const model_chat_msg_t *msg, bool after_query, bool is_last) {
  const char *c = msg->content ? msg->content : "";
  size_t n = strlen(c);
  size_t cb = 0, ce = n, rb = 0, re = 0;
  const char *first_end = strstr(c, "</think>");
  if (first_end) {
    cb = (size_t)(last_strstr(c, n, "</think>") - c) + 8;
    strip_nl(c, &cb, &ce, true, false);
    re = (size_t)(first_end - c);
    strip_nl(c, &rb, &re, false, true);
    const char *open = last_strstr(c, re, "<think>");
    if (open) rb = (size_t)(open - c) + 7;
    strip_nl(c, &rb, &re, true, false);
  }
  sb_put(b, "<|im_start|>");
  sb_put(b, msg->role);
  sb_put(b, "\n");
  if (after_query && (is_last || re > rb)) {
    sb_put(b, "<think>\n");
    strip_nl(c, &rb, &re, true, true);
    sb_putn(b, c + rb, re - rb);
    sb_put(b, "\n</think>\n\n");
    strip_nl(c, &cb, &ce, true, false);
  }
  sb_putn(b, c + cb, ce - cb);
  sb_put(b, "<|im_end|>\n");
}

static int render_qwen3(const model_chat_msg_t *m, size_t n, sbuf_t *b) {
  if (role_is(&m[0], "system")) im_turn(b, "system", m[0].content);
  size_t last_query = n - 1;
  for (size_t k = n; k-- > 0;) {
    const char *c = m[k].content ? m[k].content : "";
    if (role_is(&m[k], "user") && !(has_prefix(c, "<tool_response>") && has_suffix(c, "</tool_response>"))) {
      last_query = k;
      break;
    }
  }
  for (size_t i = 0; i < n; i++) {
    if (role_is(&m[i], "tool")) return fr_errorf(FR_EUNSUPPORTED, "chat: qwen3 tool messages are not supported");
    if (role_is(&m[i], "user") || (role_is(&m[i], "system") && i > 0))
      im_turn(b, m[i].role, m[i].content);
    else if (role_is(&m[i], "assistant"))
      qwen3_assistant(b, &m[i], i > last_query, i == n - 1);
  }
  sb_put(b, "<|im_start|>assistant\n<think>\n\n</think>\n\n");
  return 0;
}

static int render_llama3(const model_chat_msg_t *m, size_t n, const char *bos, sbuf_t *b) {
  for (size_t i = 0; i < n; i++) {
    if (i == 0) sb_put(b, bos);
    sb_put(b, "<|start_header_id|>");
    sb_put(b, m[i].role);
    sb_put(b, "<|end_header_id|>\n\n");
    sb_put_stripped(b, m[i].content);
    sb_put(b, "<|eot_id|>");
  }
  sb_put(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
  return 0;
}

static int alternation_error(void) {
  return fr_errorf(FR_EUNSUPPORTED, "chat: conversation roles must alternate user/assistant/user/assistant/...");
}

/* meta-llama/Llama-2-*-chat-hf: <<SYS>> folded into the first user turn. */
static int render_llama2(const model_chat_msg_t *m, size_t n, const char *bos, sbuf_t *b) {
  const char *sys = role_is(&m[0], "system") ? (m[0].content ? m[0].content : "") : NULL;
  const model_chat_msg_t *loop = sys ? m + 1 : m;
  size_t nl = sys ? n - 1 : n;
  for (size_t k = 0; k < nl; k++) {
    if (role_is(&loop[k], "user") != (k % 2 == 0)) return alternation_error();
    sbuf_t content = {0};
    if (k == 0 && sys) {
      sb_put(&content, "<<SYS>>\n");
      sb_put(&content, sys);
      sb_put(&content, "\n<</SYS>>\n\n");
    }
    sb_put(&content, loop[k].content);
    if (role_is(&loop[k], "user")) {
      sb_put(b, bos);
      sb_put(b, "[INST] ");
      sb_put_stripped(b, content.p);
      sb_put(b, " [/INST]");
    } else if (role_is(&loop[k], "assistant")) {
      sb_put(b, " ");
      sb_put_stripped(b, content.p);
      sb_put(b, " </s>");
    }
    free(content.p);
  }
  return 0;
}

/* mistralai/Mistral-7B-Instruct-v0.1/v0.2. */
static int render_mistral(const model_chat_msg_t *m, size_t n, const char *bos, sbuf_t *b) {
  sb_put(b, bos);
  for (size_t k = 0; k < n; k++) {
    if (role_is(&m[k], "user") != (k % 2 == 0)) return alternation_error();
    if (role_is(&m[k], "user")) {
      sb_put(b, "[INST] ");
      sb_put(b, m[k].content);
      sb_put(b, " [/INST]");
    } else if (role_is(&m[k], "assistant")) {
      sb_put(b, m[k].content);
      sb_put(b, "</s>");
    } else {
      return fr_errorf(FR_EUNSUPPORTED, "chat: mistral supports only user and assistant roles");
    }
  }
  return 0;
}

int model_chat_render(model_chat_kind_t k, const model_chat_msg_t *msgs, size_t n, const char *bos_text, char **out) {
  *out = NULL;
  if (n == 0 || !msgs) return fr_errorf(-EINVAL, "chat: no messages");
  for (size_t i = 0; i < n; i++)
    if (!msgs[i].role) return fr_errorf(-EINVAL, "chat: message %zu has no role", i);
  sbuf_t b = {0};
  const char *bos = bos_text ? bos_text : "";
  int rc;
  switch (k) {
  case MODEL_CHAT_CHATML: rc = render_chatml(msgs, n, NULL, &b); break;
  case MODEL_CHAT_SMOLLM2: rc = render_chatml(msgs, n, SMOLLM2_SYSTEM, &b); break;
  case MODEL_CHAT_QWEN25: rc = render_qwen25(msgs, n, &b); break;
  case MODEL_CHAT_QWEN3: rc = render_qwen3(msgs, n, &b); break;
  case MODEL_CHAT_LLAMA3: rc = render_llama3(msgs, n, bos, &b); break;
  case MODEL_CHAT_LLAMA2: rc = render_llama2(msgs, n, bos, &b); break;
  case MODEL_CHAT_MISTRAL: rc = render_mistral(msgs, n, bos, &b); break;
  default: rc = fr_errorf(FR_EUNSUPPORTED, "chat: unknown chat template");
  }
  if (rc) {
    free(b.p);
    return rc;
  }
  if (!b.p) sb_put(&b, "");
  *out = b.p;
  return 0;
}

/* The token's text as a C string ("" when none). */
static char *token_text(const model_tokenizer_t *tok, int32_t id) {
  size_t len = 0;
  const char *bytes = id >= 0 ? model_token_bytes(tok, id, &len) : NULL;
  return bytes ? fr_strndup(bytes, len) : fr_strdup("");
}

/* One message as the template sees it: the request's object, or {role,
 * content}. Content given as a list of parts stays a list for a template
 * that loops over content, else it is the parts' text joined (vLLM's
 * "openai" and "string" content formats). */
static json_t *msg_json(const model_chat_msg_t *m, size_t i, bool parts) {
  if (m->json) {
    json_error_t je;
    json_t *j = json_loads(m->json, JSON_DECODE_ANY, &je);
    if (json_is_array(json_object_get(j, "content")) && !parts)
      json_object_set_new(j, "content", json_string(m->content ? m->content : ""));
    if (json_is_object(j)) return j;
    json_decref(j);
    fr_errorf(-EINVAL, "chat: message %zu is not a JSON object", i);
    return NULL;
  }
  return json_pack("{s:s, s:s}", "role", m->role ? m->role : "", "content", m->content ? m->content : "");
}

/* The variables transformers passes: chat->vars (chat_template_kwargs and
 * tools) first, so that they cannot replace the chat's own (messages,
 * bos_token, ...). */
static int chat_vars(const model_tokenizer_t *tok, const model_chat_t *chat, bool parts, json_t **out) {
  json_error_t je;
  json_t *v = chat->vars ? json_loads(chat->vars, 0, &je) : json_object();
  if (!json_is_object(v)) {
    json_decref(v);
    return fr_errorf(-EINVAL, "chat_template_kwargs must be a JSON object");
  }
  json_t *tools = json_object_get(v, "tools");
  if (tools && !json_is_array(tools)) return json_decref(v), fr_errorf(-EINVAL, "tools must be a JSON list");
  json_t *msgs = json_array();
  json_object_set_new(v, "messages", msgs);
  for (size_t i = 0; i < chat->n; i++) {
    json_t *m = msg_json(&chat->msgs[i], i, parts);
    if (!m) return json_decref(v), -EINVAL;
    json_array_append_new(msgs, m);
  }
  char *bos = token_text(tok, model_token_bos(tok)), *eos = token_text(tok, model_token_eos(tok));
  json_object_set_new(v, "bos_token", json_string(bos));
  json_object_set_new(v, "eos_token", json_string(eos));
  json_object_set_new(v, "add_generation_prompt", json_true());
  if (!json_object_get(v, "tools")) json_object_set_new(v, "tools", json_null()); /* as transformers: tools=None */
  if (!json_object_get(v, "documents")) json_object_set_new(v, "documents", json_null());
  free(bos);
  free(eos);
  *out = v;
  return 0;
}

static int apply_jinja(const model_tokenizer_t *tok, const char *tmpl, const model_chat_t *chat, char **out) {
  model_jinja_t *t = NULL;
  json_t *vars = NULL;
  int rc = model_jinja_parse(&t, tmpl, strlen(tmpl));
  if (!rc) rc = chat_vars(tok, chat, model_jinja_loops_over(t, "content"), &vars);
  if (!rc) rc = model_jinja_render(t, vars, NULL, out, NULL);
  if (rc == FR_EFORMAT || rc == FR_ETOOBIG) {
    char msg[600];
    snprintf(msg, sizeof msg, "%s", fr_last_error());
    rc = fr_errorf(rc, "%s%s", strncmp(msg, "chat template", 13) ? "chat template: " : "", msg);
  }
  json_decref(vars);
  model_jinja_destroy(t);
  return rc;
}

int model_chat_template_load(const char *arg, char **out) {
  *out = NULL;
  if (model_chat_detect(arg) != MODEL_CHAT_UNKNOWN && access(arg, F_OK) != 0) {
    *out = fr_strdup(arg);
    return 0;
  }
  char *text = NULL;
  int rc = model__file_read("chat template", arg, 1u << 24, &text, NULL);
  if (rc) return rc;
  model_jinja_t *t = NULL;
  if ((rc = model_jinja_parse(&t, text, strlen(text)))) {
    free(text);
    return fr_errorf(rc, "--chat-template %s: %s", arg, fr_last_error());
  }
  model_jinja_destroy(t);
  *out = text;
  return 0;
}

int model_chat_apply(const model_tokenizer_t *tok, const model_chat_t *chat, char **out) {
  *out = NULL;
  const char *tmpl = model_tokenizer_chat_template(tok);
  if (!tmpl) return fr_errorf(FR_EUNSUPPORTED, "the model has no chat template (give serve --chat-template FILE)");
  if (chat->n == 0 || !chat->msgs) return fr_errorf(-EINVAL, "chat: no messages");
  for (size_t i = 1; i < FR_ARRAY_SIZE(k_names); i++) /* a built-in name: the hand-written fallback */
    if (!strcmp(tmpl, k_names[i])) {
      char *bos = token_text(tok, model_token_bos(tok));
      int rc = model_chat_render((model_chat_kind_t)i, chat->msgs, chat->n, bos, out);
      free(bos);
      return rc;
    }
  return apply_jinja(tok, tmpl, chat, out);
}

int model_chat_tokenize(const model_tokenizer_t *tok, const model_chat_t *chat, int32_t **ids, size_t *n_ids) {
  char *text = NULL;
  int rc = model_chat_apply(tok, chat, &text);
  if (rc == 0) rc = model_tokenize(tok, text, strlen(text), false, true, ids, n_ids);
  free(text);
  return rc;
}
