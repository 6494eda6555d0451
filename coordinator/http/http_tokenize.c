/* http_tokenize.c - vLLM's /tokenize and /detokenize with the served
 * model's tokenizer, in the frontend's loop (bodies are capped at 4 MiB).
 *
 *   POST /tokenize   {"prompt": "text", "add_special_tokens": true}
 *                    or {"messages": [...]} (the chat template, with the
 *                    generation prompt, as /v1/chat/completions renders it)
 *                    -> {"count", "max_model_len", "tokens", "token_strs"}
 *   POST /detokenize {"tokens": [ids]} -> {"prompt": "text"} (special
 *                    tokens written out, as Hugging Face's decode does)
 *   GET /tokenizer_info -> {"eos_token", "bos_token", "pad_token",
 *                    "add_bos_token", "chat_template", "model_max_length"}
 *                    (vLLM's; lm-evaluation-harness's remote tokenizer
 *                    reads it before it uses /tokenize and /detokenize)
 */
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "coordinator/http/http_internal.h"
#include "model/chat.h"
#include "model/tokenizer.h"

static int tok_send(struct coord_http *h, struct MHD_Connection *c, json_t *j) {
  char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
  json_decref(j);
  if (s) return coord_http__send_json(h, c, 200, s);
  coord_http_err_t e;
  coord_http_err(&e, 500, NULL, "the answer could not be encoded");
  return coord_http__send_error(h, c, &e);
}

/* The token strings of ids (bytes as text, invalid UTF-8 replaced). */
static json_t *tok_strs(const struct coord_http *h, const int32_t *ids, size_t n) {
  json_t *a = json_array();
  for (size_t i = 0; a && i < n; i++) {
    size_t len = 0;
    const char *b = model_token_bytes(h->tok, ids[i], &len);
    json_t *s = b ? json_stringn(b, len) : NULL;
    json_array_append_new(a, s ? s : json_string("\xef\xbf\xbd"));
  }
  return a;
}

/* The prompt's ids: a text prompt, or the chat of a messages list (parsed
 * and checked as /v1/chat/completions does). */
static int tok_ids(const struct coord_http *h, json_t *root, const char *body, size_t len, int32_t **ids, size_t *n,
                   coord_http_err_t *e) {
  json_t *p = json_object_get(root, "prompt"), *add = json_object_get(root, "add_special_tokens");
  json_t *gen = json_object_get(root, "add_generation_prompt");
  if (add && !json_is_boolean(add)) return coord_http_err(e, 400, "add_special_tokens", "'add_special_tokens' must be a boolean");
  if (json_is_string(p)) {
    if (json_object_get(root, "messages")) return coord_http_err(e, 400, NULL, "give 'prompt' or 'messages', not both");
    if (model_tokenize(h->tok, json_string_value(p), json_string_length(p), !add || json_is_true(add), true, ids, n))
      return coord_http_err(e, 400, "prompt", "%s", fr_last_error());
    return 0;
  }
  if (p) return coord_http_err(e, 400, "prompt", "'prompt' must be a string");
  if (gen && !json_is_true(gen))
    return coord_http_err(e, 400, "add_generation_prompt", "only add_generation_prompt = true is supported");
  coord_http_req_t r;
  if (coord_http_req_parse(&r, COORD_HTTP_API_CHAT, body, len, h->model, 0, e)) return -1;
  model_chat_msg_t *m = fr_calloc(r.sub.n_messages, sizeof *m);
  for (uint32_t i = 0; i < r.sub.n_messages; i++)
    m[i] = (model_chat_msg_t){r.sub.messages[i].role, r.sub.messages[i].content, r.sub.messages[i].json};
  model_chat_t chat = {.msgs = m, .n = r.sub.n_messages, .vars = r.sub.messages[0].vars};
  int rc = model_chat_tokenize(h->tok, &chat, ids, n);
  free(m);
  coord_http_req_free(&r);
  return rc ? coord_http_err(e, 400, "messages", "%s", fr_last_error()) : 0;
}

/* The body as a JSON object naming the served model (or none). */
static json_t *tok_body(const struct coord_http *h, const char *body, size_t len, coord_http_err_t *e) {
  json_error_t je;
  json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
  if (!root) return coord_http_err(e, 400, NULL, "malformed JSON: %s", je.text), NULL;
  json_t *model = json_object_get(root, "model");
  if (!json_is_object(root) || (model && !json_is_null(model) && !json_is_string(model))) {
    json_decref(root);
    return coord_http_err(e, 400, NULL, "the body must be a JSON object; 'model' a string"), NULL;
  }
  if (json_is_string(model) && strcmp(json_string_value(model), h->model)) {
    coord_http_err(e, 404, "model", "The model `%.200s` does not exist.", json_string_value(model));
    e->code = "model_not_found";
    json_decref(root);
    return NULL;
  }
  return root;
}

int coord_http__tokenize(struct coord_http *h, struct MHD_Connection *c, const char *body, size_t len) {
  coord_http_err_t e;
  if (!h->tok) return coord_http_err(&e, 501, NULL, "this server has no tokenizer to offer"), coord_http__send_error(h, c, &e);
  json_t *root = tok_body(h, body, len, &e);
  int32_t *ids = NULL;
  size_t n = 0;
  json_t *strs = root ? json_object_get(root, "return_token_strs") : NULL;
  if (!root || tok_ids(h, root, body, len, &ids, &n, &e)) {
    json_decref(root);
    return coord_http__send_error(h, c, &e);
  }
  json_t *tokens = json_array();
  for (size_t i = 0; tokens && i < n; i++) json_array_append_new(tokens, json_integer(ids[i]));
  json_t *out = json_pack("{s:I, s:I, s:o, s:o}", "count", (json_int_t)n, "max_model_len", (json_int_t)h->max_model_len,
                          "tokens", tokens, "token_strs", json_is_true(strs) ? tok_strs(h, ids, n) : json_null());
  free(ids);
  json_decref(root);
  return tok_send(h, c, out);
}

/* A special token's text, or null. */
static json_t *tok_special(const struct coord_http *h, int32_t id) {
  size_t n = 0;
  const char *b = id >= 0 ? model_token_bytes(h->tok, id, &n) : NULL;
  json_t *s = b ? json_stringn(b, n) : NULL;
  return s ? s : json_null();
}

int coord_http__tokenizer_info(struct coord_http *h, struct MHD_Connection *c) {
  coord_http_err_t e;
  if (!h->tok) return coord_http_err(&e, 501, NULL, "this server has no tokenizer to offer"), coord_http__send_error(h, c, &e);
  const char *tmpl = model_tokenizer_chat_template(h->tok);
  json_t *out = json_pack("{s:o, s:o, s:n, s:b, s:o, s:I}", "eos_token", tok_special(h, model_token_eos(h->tok)),
                          "bos_token", tok_special(h, model_token_bos(h->tok)), "pad_token",
                          "add_bos_token", model_tokenizer_adds_bos(h->tok), "chat_template",
                          tmpl ? json_string(tmpl) : json_null(), "model_max_length", (json_int_t)h->max_model_len);
  return tok_send(h, c, out);
}

int coord_http__detokenize(struct coord_http *h, struct MHD_Connection *c, const char *body, size_t len) {
  coord_http_err_t e;
  if (!h->tok) return coord_http_err(&e, 501, NULL, "this server has no tokenizer to offer"), coord_http__send_error(h, c, &e);
  json_t *root = tok_body(h, body, len, &e);
  json_t *t = root ? json_object_get(root, "tokens") : NULL;
  if (root && !json_is_array(t)) coord_http_err(&e, 400, "tokens", "'tokens' must be a list of token ids");
  int vocab = h->tok ? model_vocab_size(h->tok) : 0;
  size_t i;
  json_t *v;
  json_array_foreach(t, i, v) {
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= vocab) {
      coord_http_err(&e, 400, "tokens", "tokens[%zu] is not a token id of this model (0 to %d)", i, vocab - 1);
      t = NULL;
      break;
    }
  }
  if (!json_is_array(t)) {
    json_decref(root);
    return coord_http__send_error(h, c, &e);
  }
  size_t cap = 64, used = 0; /* each token's bytes, at most 3 bytes of U+FFFD per byte, and room for a NUL */
  json_array_foreach(t, i, v) {
    size_t b = 0;
    model_token_bytes(h->tok, (int32_t)json_integer_value(v), &b);
    cap += 4 * (b + 4);
  }
  char *text = fr_malloc(cap);
  model_detok_t d;
  model_detok_init(&d, h->tok, false);
  json_array_foreach(t, i, v) {
    int w = model_detok_feed(&d, (int32_t)json_integer_value(v), text + used, cap - used);
    if (w > 0) used += (size_t)w;
  }
  int w = model_detok_flush(&d, text + used, cap - used);
  if (w > 0) used += (size_t)w;
  json_t *out = json_pack("{s:s%}", "prompt", text, used);
  free(text);
  json_decref(root);
  return tok_send(h, c, out);
}
