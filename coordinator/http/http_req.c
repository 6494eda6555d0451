/* http_req.c - OpenAI request bodies -> validated proto_submit_t. Every
 * field is type- and range-checked; unknown fields are ignored (clients send
 * "user", "metadata", ...). See http_internal.h. */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/http/http_internal.h"

int coord_http_err(coord_http_err_t *e, int status, const char *param, const char *fmt, ...) {
  e->status = status;
  e->param = param;
  e->code = NULL;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->message, sizeof e->message, fmt, ap);
  va_end(ap);
  return -1;
}

/* A field that is absent or JSON null counts as not given. */
static json_t *req_get(json_t *root, const char *key) {
  json_t *v = json_object_get(root, key);
  return json_is_null(v) ? NULL : v;
}

/* Reads an optional number in [lo, hi] into *out. */
static int req_num(json_t *root, const char *key, double lo, double hi, double *out, coord_http_err_t *e) {
  json_t *v = req_get(root, key);
  if (!v) return 0;
  if (!json_is_number(v)) return coord_http_err(e, 400, key, "'%s' must be a number", key);
  double x = json_number_value(v);
  if (!isfinite(x) || x < lo || x > hi)
    return coord_http_err(e, 400, key, "'%s' must be in [%g, %g], got %g", key, lo, hi, x);
  *out = x;
  return 0;
}

/* Reads an optional integer in [lo, hi] into *out. */
static int req_int(json_t *root, const char *key, long long lo, long long hi, long long *out, coord_http_err_t *e) {
  json_t *v = req_get(root, key);
  if (!v) return 0;
  if (!json_is_integer(v)) return coord_http_err(e, 400, key, "'%s' must be an integer", key);
  long long x = json_integer_value(v);
  if (x < lo || x > hi) return coord_http_err(e, 400, key, "'%s' must be in [%lld, %lld], got %lld", key, lo, hi, x);
  *out = x;
  return 0;
}

static int req_bool(json_t *root, const char *key, bool *out, coord_http_err_t *e) {
  json_t *v = req_get(root, key);
  if (!v) return 0;
  if (!json_is_boolean(v)) return coord_http_err(e, 400, key, "'%s' must be a boolean", key);
  *out = json_is_true(v);
  return 0;
}

/* Token ids: a JSON array of integers in [0, INT32_MAX]. */
static int req_ids(json_t *arr, const char *param, uint32_t max, int32_t **out, uint32_t *n, coord_http_err_t *e) {
  size_t len = json_array_size(arr);
  if (len > max) return coord_http_err(e, 400, param, "'%s' has %zu entries, at most %u allowed", param, len, max);
  int32_t *ids = malloc((len ? len : 1) * sizeof *ids);
  if (!ids) return coord_http_err(e, 500, NULL, "out of memory");
  for (size_t i = 0; i < len; i++) {
    json_t *t = json_array_get(arr, i);
    long long x = json_is_integer(t) ? json_integer_value(t) : -1;
    if (x < 0 || x > INT32_MAX) {
      free(ids);
      return coord_http_err(e, 400, param, "'%s'[%zu] must be a non-negative token id", param, i);
    }
    ids[i] = (int32_t)x;
  }
  *out = ids;
  *n = (uint32_t)len;
  return 0;
}

/* ---- sampling and limits, common to both APIs ---- */

static int req_sampling(coord_http_req_t *r, coord_http_err_t *e) {
  proto_sampling_t *sp = &r->sub.sp;
  double t = sp->temperature, p = sp->top_p, mp = sp->min_p, rp = sp->repetition_penalty;
  double pp = sp->presence_penalty, fp = sp->frequency_penalty;
  long long k = -1, seed = 0;
  json_t *root = r->root;
  if (req_num(root, "temperature", 0, 1e6, &t, e) || req_num(root, "top_p", 0, 1, &p, e) ||
      req_num(root, "min_p", 0, 1, &mp, e) || req_num(root, "repetition_penalty", 1e-6, 1e6, &rp, e) ||
      req_num(root, "presence_penalty", -2, 2, &pp, e) || req_num(root, "frequency_penalty", -2, 2, &fp, e) ||
      req_int(root, "top_k", -1, INT32_MAX, &k, e))
    return -1;
  if (p <= 0) return coord_http_err(e, 400, "top_p", "'top_p' must be in (0, 1], got %g", p);
  if (req_get(root, "seed")) {
    if (req_int(root, "seed", INT64_MIN, INT64_MAX, &seed, e)) return -1;
    sp->has_seed = true;
    sp->seed = (uint64_t)seed;
  }
  /* a top_p below float's range (1e-300) keeps the top token alone, as the
   * smallest float does; as 0 the submit would not pass the protocol */
  sp->temperature = (float)t, sp->top_p = fmaxf((float)p, FLT_MIN), sp->min_p = (float)mp;
  sp->repetition_penalty = (float)rp;
  sp->presence_penalty = (float)pp, sp->frequency_penalty = (float)fp;
  sp->top_k = k < 0 ? 0 : (int32_t)k;
  long long mn = 0;
  if (req_int(root, "min_tokens", 0, UINT32_MAX, &mn, e)) return -1;
  sp->min_tokens = (uint32_t)mn;
  return 0;
}

static int req_max_tokens(coord_http_req_t *r, coord_http_err_t *e) {
  long long mt = -1, mct = -1;
  if (req_int(r->root, "max_tokens", 0, UINT32_MAX, &mt, e)) return -1;
  if (mt == 0) r->no_output = true, mt = 1; /* echo only (checked with echo): one token, dropped */
  if (r->api == COORD_HTTP_API_CHAT && req_int(r->root, "max_completion_tokens", 1, UINT32_MAX, &mct, e)) return -1;
  if (mct > 0) mt = mct;
  /* OpenAI's defaults: 16 for completions, until the context ends for chat. */
  r->sub.max_tokens = mt > 0 ? (uint32_t)mt : (r->api == COORD_HTTP_API_COMPLETIONS ? 16u : 0u);
  return 0;
}

static int req_stop(coord_http_req_t *r, coord_http_err_t *e) {
  json_t *v = req_get(r->root, "stop");
  if (v) {
    size_t n = json_is_string(v) ? 1 : json_array_size(v);
    if (!json_is_string(v) && !json_is_array(v))
      return coord_http_err(e, 400, "stop", "'stop' must be a string or a list of strings");
    if (n > PROTO_MAX_STOP) return coord_http_err(e, 400, "stop", "'stop' has more than %u strings", PROTO_MAX_STOP);
    r->stop = calloc(n ? n : 1, sizeof *r->stop);
    if (!r->stop) return coord_http_err(e, 500, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
      json_t *s = json_is_string(v) ? v : json_array_get(v, i);
      if (!json_is_string(s)) return coord_http_err(e, 400, "stop", "'stop'[%zu] must be a string", i);
      if (json_string_length(s) > PROTO_MAX_STR || strlen(json_string_value(s)) != json_string_length(s))
        return coord_http_err(e, 400, "stop", "'stop'[%zu] is too long or holds NUL", i);
      if (json_string_length(s) > 0) r->stop[r->sub.stop.n_strs++] = (char *)json_string_value(s); /* "" stops nothing */
    }
    r->sub.stop.strs = r->stop;
  }
  if (req_bool(r->root, "include_stop_str_in_output", &r->sub.stop.include, e)) return -1;
  json_t *ids = req_get(r->root, "stop_token_ids");
  if (!ids) return 0;
  if (!json_is_array(ids)) return coord_http_err(e, 400, "stop_token_ids", "'stop_token_ids' must be a list of integers");
  if (req_ids(ids, "stop_token_ids", PROTO_MAX_STOP_IDS, &r->stop_ids, &r->sub.stop.n_ids, e)) return -1;
  r->sub.stop.ids = r->stop_ids;
  return 0;
}

static int req_bias_cmp(const void *a, const void *b) {
  const proto_bias_t *x = a, *y = b;
  return (x->token > y->token) - (x->token < y->token);
}

/* One logit_bias entry: a token id as a decimal string -> a number in
 * [-100, 100]. */
static int req_bias_entry(const char *key, json_t *v, proto_bias_t *out, coord_http_err_t *e) {
  char *end;
  errno = 0;
  long long t = strtoll(key, &end, 10);
  if (!*key || *end || errno || t < 0 || t > INT32_MAX || key[0] == '-' || key[0] == '+' || key[0] == ' ')
    return coord_http_err(e, 400, "logit_bias", "'logit_bias' keys must be token ids, got '%.40s'", key);
  double b = json_is_number(v) ? json_number_value(v) : NAN;
  if (!isfinite(b) || b < -100 || b > 100)
    return coord_http_err(e, 400, "logit_bias", "'logit_bias'[%s] must be a number in [-100, 100]", key);
  *out = (proto_bias_t){.token = (int32_t)t, .bias = (float)b};
  return 0;
}

/* logit_bias: {"token id": bias, ...}, sorted by token for the wire (the
 * coordinator checks the ids against the vocabulary). */
static int req_logit_bias(coord_http_req_t *r, coord_http_err_t *e) {
  json_t *lb = req_get(r->root, "logit_bias"), *v;
  if (!lb) return 0;
  if (!json_is_object(lb)) return coord_http_err(e, 400, "logit_bias", "'logit_bias' must be an object of token id -> bias");
  size_t n = json_object_size(lb), i = 0;
  if (n > PROTO_MAX_BIAS)
    return coord_http_err(e, 400, "logit_bias", "'logit_bias' has %zu entries, at most %u allowed", n, PROTO_MAX_BIAS);
  r->bias = malloc((n ? n : 1) * sizeof *r->bias);
  if (!r->bias) return coord_http_err(e, 500, NULL, "out of memory");
  const char *key;
  json_object_foreach(lb, key, v) if (req_bias_entry(key, v, &r->bias[i++], e)) return -1;
  qsort(r->bias, n, sizeof *r->bias, req_bias_cmp);
  for (i = 1; i < n; i++)
    if (r->bias[i].token == r->bias[i - 1].token)
      return coord_http_err(e, 400, "logit_bias", "'logit_bias' names token %d twice", r->bias[i].token);
  r->sub.sp.bias = r->bias;
  r->sub.sp.n_bias = (uint32_t)n;
  return 0;
}

/* n and best_of (vLLM's rules: best_of >= n, no stream unless equal). */
static int req_choices(coord_http_req_t *r, coord_http_err_t *e) {
  long long n = 1, best_of = 0;
  if (req_int(r->root, "n", 1, COORD_HTTP_MAX_SEQS, &n, e) ||
      req_int(r->root, "best_of", 1, COORD_HTTP_MAX_SEQS, &best_of, e))
    return -1;
  if (best_of == 0) best_of = n;
  if (best_of < n) return coord_http_err(e, 400, "best_of", "best_of must be greater than or equal to n, got n=%lld and "
                                                         "best_of=%lld", n, best_of);
  if (r->stream && best_of > n)
    return coord_http_err(e, 400, "best_of", "best_of (%lld) greater than n (%lld) cannot be streamed", best_of, n);
  uint32_t prompts = r->n_prompts ? r->n_prompts : 1;
  if ((uint64_t)prompts * (uint64_t)best_of > COORD_HTTP_MAX_SEQS)
    return coord_http_err(e, 400, best_of > n ? "best_of" : "n", "%u prompts of %lld sequences each: at most %u "
                          "sequences in one request", prompts, best_of, COORD_HTTP_MAX_SEQS);
  r->n = (uint32_t)n;
  r->best_of = (uint32_t)best_of;
  /* best_of ranks by cumulative logprob: each sequence reports its tokens' logprobs */
  if (best_of > n && r->sub.sp.logprobs < 0) r->sub.sp.logprobs = 0;
  return 0;
}

/* stream, stream_options, echo, ignore_eos. */
static int req_options(coord_http_req_t *r, coord_http_err_t *e) {
  if (req_bool(r->root, "stream", &r->stream, e) || req_bool(r->root, "ignore_eos", &r->sub.stop.ignore_eos, e) ||
      req_bool(r->root, "echo", &r->echo, e))
    return -1;
  bool skip_special = true;
  if (req_bool(r->root, "skip_special_tokens", &skip_special, e)) return -1;
  r->sub.stop.keep_special = !skip_special;
  if (r->echo && r->api == COORD_HTTP_API_CHAT)
    return coord_http_err(e, 400, "echo", "'echo' is only supported for /v1/completions");
  json_t *so = req_get(r->root, "stream_options");
  if (so) {
    if (!r->stream) return coord_http_err(e, 400, "stream_options", "Stream options can only be defined when `stream=True`.");
    if (!json_is_object(so)) return coord_http_err(e, 400, "stream_options", "'stream_options' must be an object");
    if (req_bool(so, "include_usage", &r->include_usage, e)) return -1;
  }
  r->sub.stream = r->stream;
  return 0;
}

static int req_logprobs(coord_http_req_t *r, coord_http_err_t *e) {
  long long top = 0;
  r->logprobs = -1;
  if (r->api == COORD_HTTP_API_COMPLETIONS) {
    if (req_int(r->root, "logprobs", 0, PROTO_MAX_TOPN, &top, e)) return -1;
    if (req_get(r->root, "logprobs")) r->logprobs = (int)top;
  } else {
    bool on = false;
    if (req_bool(r->root, "logprobs", &on, e) || req_int(r->root, "top_logprobs", 0, PROTO_MAX_TOPN, &top, e)) return -1;
    if (!on && top > 0) return coord_http_err(e, 400, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
    if (on) r->logprobs = (int)top;
  }
  r->sub.sp.logprobs = r->logprobs;
  long long plp = -1;
  if (req_int(r->root, "prompt_logprobs", 0, PROTO_MAX_TOPN, &plp, e)) return -1;
  r->prompt_logprobs = (int)plp;
  return 0;
}

/* What the prompt logprobs asked (prompt_logprobs, echo with logprobs)
 * need: the most alternatives of the two (streamed for completions, beyond
 * vLLM; a chat stream refuses them with vLLM's words, since its chunks
 * have no place for them). max_tokens 0 only with echo. */
static int req_prompt_lp(coord_http_req_t *r, coord_http_err_t *e) {
  if (r->no_output && !r->echo)
    return coord_http_err(e, 400, "max_tokens", "'max_tokens' must be at least 1 (0 only with 'echo')");
  if (r->no_output && r->stream)
    return coord_http_err(e, 400, "max_tokens", "'max_tokens' 0 (echo only) is not supported with 'stream'");
  int k = r->echo && r->logprobs >= 0 ? r->logprobs : -1;
  k = k > r->prompt_logprobs ? k : r->prompt_logprobs;
  if (k >= 0 && r->stream && r->api == COORD_HTTP_API_CHAT)
    return coord_http_err(e, 400, "prompt_logprobs", "`prompt_logprobs` are not available when `stream=True`.");
  r->sub.ph.logprobs = k >= 0;
  r->sub.ph.logprobs_top = k >= 0 ? (uint32_t)k : 0;
  return 0;
}

/* ---- inputs ---- */

/* A prompt's tokens after truncate_prompt_tokens (sub.ph.truncate). */
static uint32_t req_prompt_tokens(const coord_http_req_t *r, uint32_t n) {
  return r->sub.ph.truncate && n > r->sub.ph.truncate ? r->sub.ph.truncate : n;
}

/* One prompt: a non-empty string or a non-empty list of token ids. */
static int req_prompt_one(coord_http_req_t *r, json_t *p, size_t i, uint32_t max_model_len, coord_http_err_t *e) {
  const char *key = r->api == COORD_HTTP_API_EMBEDDINGS ? "input" : "prompt";
  coord_http_prompt_t *out = &r->prompts[i];
  if (json_is_string(p)) {
    if (json_string_length(p) > PROTO_MAX_TEXT)
      return coord_http_err(e, 400, key, "'%s' is longer than %u bytes", key, PROTO_MAX_TEXT);
    out->text = json_string_value(p);
    out->text_len = (uint32_t)json_string_length(p);
    if (out->text_len == 0) return coord_http_err(e, 400, key, "'%s' must not be empty", key);
    return 0;
  }
  if (!json_is_array(p) || json_array_size(p) == 0)
    return coord_http_err(e, 400, key, "'%s' must be a string, a list of token ids, or a list of those", key);
  if (req_ids(p, key, PROTO_MAX_TOKENS, &out->ids, &out->n_ids, e)) return -1;
  uint32_t n = req_prompt_tokens(r, out->n_ids);
  if (max_model_len && n >= max_model_len)
    return coord_http_err(e, 400, key,
                          "This model's maximum context length is %u tokens. However, you requested %u tokens in the "
                          "prompt. Please reduce the length of the prompt.",
                          max_model_len, n);
  return 0;
}

/* prompt: a string, a list of token ids, or a list of either (several
 * prompts, OpenAI's batch). */
static int req_prompt(coord_http_req_t *r, uint32_t max_model_len, coord_http_err_t *e) {
  const char *key = r->api == COORD_HTTP_API_EMBEDDINGS ? "input" : "prompt";
  json_t *p = req_get(r->root, key);
  if (!p) return coord_http_err(e, 400, key, "'%s' is required", key);
  bool batch = json_is_array(p) && json_array_size(p) > 0 && !json_is_integer(json_array_get(p, 0));
  size_t n = batch ? json_array_size(p) : 1;
  if (n > COORD_HTTP_MAX_SEQS)
    return coord_http_err(e, 400, key, "'%s' has %zu prompts, at most %u allowed", key, n, COORD_HTTP_MAX_SEQS);
  r->prompts = calloc(n, sizeof *r->prompts);
  if (!r->prompts) return coord_http_err(e, 500, NULL, "out of memory");
  r->n_prompts = (uint32_t)n;
  for (size_t i = 0; i < n; i++)
    if (req_prompt_one(r, batch ? json_array_get(p, i) : p, i, max_model_len, e)) return -1;
  coord_http_req_prompt(r, 0);
  return 0;
}

void coord_http_req_prompt(coord_http_req_t *r, uint32_t i) {
  if (r->api == COORD_HTTP_API_CHAT || i >= r->n_prompts) return;
  const coord_http_prompt_t *p = &r->prompts[i];
  r->sub.prompt = (char *)p->text;
  r->sub.prompt_len = p->text_len;
  r->sub.tokens = p->ids;
  r->sub.n_tokens = p->n_ids;
}

/* Chat content: a string, null (assistant turns), or a list of parts of
 * which the "text" ones are joined. A joined string is stored back into the
 * message object so that root owns it. */
static int req_content(json_t *msg, size_t i, const char **out, size_t *len, coord_http_err_t *e) {
  json_t *c = json_object_get(msg, "content");
  if (!c || json_is_null(c)) c = json_string("");
  else if (json_is_array(c)) {
    size_t total = 0, idx;
    json_t *part;
    json_array_foreach(c, idx, part) {
      json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
      if (!json_is_string(type) || strcmp(json_string_value(type), "text") || !json_is_string(text))
        return coord_http_err(e, 400, "messages", "messages[%zu]: only text content parts are supported", i);
      total += json_string_length(text);
      if (total > PROTO_MAX_TEXT) return coord_http_err(e, 400, "messages", "messages[%zu] content is too long", i);
    }
    char *joined = malloc(total + 1), *w = joined;
    if (!joined) return coord_http_err(e, 500, NULL, "out of memory");
    json_array_foreach(c, idx, part) {
      json_t *text = json_object_get(part, "text");
      memcpy(w, json_string_value(text), json_string_length(text));
      w += json_string_length(text);
    }
    c = json_stringn_nocheck(joined, total); /* parts were valid UTF-8, so is their join */
    free(joined);
  } else if (!json_is_string(c))
    return coord_http_err(e, 400, "messages", "messages[%zu].content must be a string or a list of parts", i);
  else
    json_incref(c);
  if (!c || json_object_set_new(msg, "content", c)) return coord_http_err(e, 500, NULL, "out of memory");
  if (json_string_length(c) > PROTO_MAX_TEXT) return coord_http_err(e, 400, "messages", "messages[%zu] content is too long", i);
  *out = json_string_value(c);
  *len = json_string_length(c);
  return 0;
}

/* A message with more than role and string content (tool_calls,
 * tool_call_id, name, content parts or null, ...) goes to the chat template
 * whole, as JSON, with its content as given (orig; NULL: absent). */
static int req_msg_json(coord_http_req_t *r, json_t *m, json_t *orig, size_t i, size_t n, coord_http_err_t *e) {
  if (!r->msg_json) {
    if (!(r->msg_json = calloc(n, sizeof *r->msg_json))) return coord_http_err(e, 500, NULL, "out of memory");
    r->n_msg_json = n; /* freed by coord_http_req_free, also when a later message fails */
  }
  json_t *copy = json_copy(m);
  if (copy && orig) json_object_set(copy, "content", orig);
  else if (copy) json_object_del(copy, "content");
  r->msg_json[i] = copy ? json_dumps(copy, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
  json_decref(copy);
  if (!r->msg_json[i]) return coord_http_err(e, 500, NULL, "out of memory");
  if (strlen(r->msg_json[i]) > PROTO_MAX_TEXT) return coord_http_err(e, 400, "messages", "messages[%zu] is too long", i);
  r->messages[i].json = r->msg_json[i];
  return 0;
}

/* A reasoning model's switches: chat_template_kwargs.enable_thinking false
 * (Qwen3's: no think block to parse) and vLLM's include_reasoning. */
static int req_reasoning(coord_http_req_t *r, coord_http_err_t *e) {
  json_t *kw = req_get(r->root, "chat_template_kwargs");
  r->thinking_off = json_is_object(kw) && json_is_false(json_object_get(kw, "enable_thinking"));
  bool include = true;
  if (req_bool(r->root, "include_reasoning", &include, e)) return -1;
  r->hide_reasoning = !include;
  return 0;
}

/* tools (a list) and chat_template_kwargs (an object) for the chat template. */
static int req_template_vars(coord_http_req_t *r, coord_http_err_t *e) {
  json_t *tools = req_get(r->root, "tools"), *kw = req_get(r->root, "chat_template_kwargs");
  if (tools && !json_is_null(tools) && !json_is_array(tools)) return coord_http_err(e, 400, "tools", "'tools' must be a list");
  if (kw && !json_is_null(kw) && !json_is_object(kw))
    return coord_http_err(e, 400, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
  bool has_tools = json_is_array(tools) && json_array_size(tools);
  if (!has_tools && !(json_is_object(kw) && json_object_size(kw))) return 0;
  json_t *vars = json_is_object(kw) ? json_deep_copy(kw) : json_object();
  if (vars && has_tools) json_object_set(vars, "tools", tools);
  r->chat_vars = vars ? json_dumps(vars, JSON_COMPACT) : NULL;
  json_decref(vars);
  if (!r->chat_vars) return coord_http_err(e, 500, NULL, "out of memory");
  if (strlen(r->chat_vars) > PROTO_MAX_TEXT) return coord_http_err(e, 400, "tools", "'tools' and 'chat_template_kwargs' are too long");
  r->messages[0].vars = r->chat_vars;
  return 0;
}

static int req_messages(coord_http_req_t *r, coord_http_err_t *e) {
  json_t *ms = req_get(r->root, "messages");
  if (!json_is_array(ms) || json_array_size(ms) == 0)
    return coord_http_err(e, 400, "messages", "'messages' must be a non-empty list");
  size_t n = json_array_size(ms);
  if (n > PROTO_MAX_MESSAGES) return coord_http_err(e, 400, "messages", "more than %u messages", PROTO_MAX_MESSAGES);
  r->messages = calloc(n, sizeof *r->messages);
  if (!r->messages) return coord_http_err(e, 500, NULL, "out of memory");
  for (size_t i = 0; i < n; i++) {
    json_t *m = json_array_get(ms, i), *role = json_object_get(m, "role");
    if (!json_is_object(m) || !json_is_string(role) || json_string_length(role) == 0 ||
        json_string_length(role) > 64 || strlen(json_string_value(role)) != json_string_length(role))
      return coord_http_err(e, 400, "messages", "messages[%zu] needs a 'role' string", i);
    const char *text = NULL;
    size_t len = 0;
    json_t *orig = json_incref(json_object_get(m, "content"));
    if (req_content(m, i, &text, &len, e)) return json_decref(orig), -1;
    r->messages[i].role = (char *)json_string_value(role);
    r->messages[i].content = (char *)text;
    r->messages[i].content_len = (uint32_t)len;
    int rc = json_object_size(m) > 2 || !json_is_string(orig) ? req_msg_json(r, m, orig, i, n, e) : 0;
    json_decref(orig);
    if (rc) return -1;
  }
  r->sub.messages = r->messages;
  r->sub.n_messages = (uint32_t)n;
  if (coord_tool_req_parse(r->root, &r->tool_choice, &r->tool_name, e)) return -1;
  return req_template_vars(r, e) || req_reasoning(r, e) ? -1 : 0;
}

static int req_model(coord_http_req_t *r, const char *served, coord_http_err_t *e) {
  json_t *m = req_get(r->root, "model");
  if (!m) return 0;
  if (!json_is_string(m)) return coord_http_err(e, 400, "model", "'model' must be a string");
  r->model = json_string_value(m);
  if (served && strcmp(r->model, served)) {
    coord_http_err(e, 404, "model", "The model `%.200s` does not exist.", r->model);
    e->code = "model_not_found";
    return -1;
  }
  return 0;
}

/* truncate_prompt_tokens (vLLM's): keep the last k prompt tokens; -1 is
 * the model's context. */
static int req_truncate(coord_http_req_t *r, uint32_t max_model_len, coord_http_err_t *e) {
  long long k = 0;
  if (req_int(r->root, "truncate_prompt_tokens", -1, UINT32_MAX, &k, e)) return -1;
  if (k == 0 && req_get(r->root, "truncate_prompt_tokens"))
    return coord_http_err(e, 400, "truncate_prompt_tokens", "'truncate_prompt_tokens' must be -1 or at least 1");
  if (k == -1) k = max_model_len ? max_model_len : UINT32_MAX;
  r->sub.ph.truncate = (uint32_t)k;
  return 0;
}

/* /v1/embeddings: input (as completions' prompt), encoding_format,
 * dimensions (only the model's own length: no Matryoshka truncation),
 * user, truncate_prompt_tokens (vLLM's); one sequence per input. */
static int req_embed_fields(coord_http_req_t *r, const char *served, uint32_t max_model_len, coord_http_err_t *e) {
  if (req_model(r, served, e) || req_truncate(r, max_model_len, e) || req_prompt(r, max_model_len, e)) return -1;
  json_t *fmt = req_get(r->root, "encoding_format");
  if (fmt && !(json_is_string(fmt) && (!strcmp(json_string_value(fmt), "float") ||
                                      (r->base64 = !strcmp(json_string_value(fmt), "base64")))))
    return coord_http_err(e, 400, "encoding_format", "'encoding_format' must be \"float\" or \"base64\"");
  json_t *user = req_get(r->root, "user");
  if (user && !json_is_string(user)) return coord_http_err(e, 400, "user", "'user' must be a string");
  long long dims = 0;
  if (req_int(r->root, "dimensions", 1, PROTO_MAX_EMBD, &dims, e)) return -1;
  r->dimensions = (uint32_t)dims;
  r->n = r->best_of = 1;
  r->sub.ph.embed = true;
  return 0;
}

static int req_fields(coord_http_req_t *r, const char *served, uint32_t max_model_len, coord_http_err_t *e) {
  if (r->api == COORD_HTTP_API_EMBEDDINGS) return req_embed_fields(r, served, max_model_len, e);
  if (req_model(r, served, e) || coord_http_req_unsupported(r->root, r->api, e) || req_truncate(r, max_model_len, e))
    return -1;
  if (r->api == COORD_HTTP_API_CHAT ? req_messages(r, e) : req_prompt(r, max_model_len, e)) return -1;
  if (!r->prompts && !(r->prompts = calloc(1, sizeof *r->prompts))) return coord_http_err(e, 500, NULL, "out of memory");
  if (!r->n_prompts) r->n_prompts = 1; /* chat: the messages */
  if (req_sampling(r, e) || req_max_tokens(r, e) || req_stop(r, e) || req_logit_bias(r, e) ||
      req_options(r, e) || req_logprobs(r, e) || req_choices(r, e) || coord_http_req_guide(r, e))
    return -1;
  if (req_prompt_lp(r, e)) return -1;
  if (r->sub.max_tokens && r->sub.sp.min_tokens > r->sub.max_tokens)
    return coord_http_err(e, 400, "min_tokens", "'min_tokens' (%u) must not exceed 'max_tokens' (%u)",
                          r->sub.sp.min_tokens, r->sub.max_tokens);
  for (uint32_t i = 0; i < r->n_prompts; i++) {
    uint32_t n = req_prompt_tokens(r, r->prompts[i].n_ids);
    if (max_model_len && (uint64_t)n + r->sub.max_tokens > max_model_len)
      return coord_http_err(e, 400, "max_tokens",
                            "This model's maximum context length is %u tokens. However, you requested %llu tokens (%u "
                            "in the prompt, %u in the completion). Please reduce the length of the prompt or "
                            "completion.",
                            max_model_len, (unsigned long long)n + r->sub.max_tokens, n, r->sub.max_tokens);
  }
  return 0;
}

int coord_http_req_parse(coord_http_req_t *r, coord_http_api_t api, const char *body, size_t len,
                         const char *served_model, uint32_t max_model_len, coord_http_err_t *e) {
  memset(r, 0, sizeof *r);
  r->api = api;
  r->logprobs = -1;
  r->prompt_logprobs = -1;
  r->sub.sp = proto_sampling_default();
  json_error_t je;
  r->root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
  if (!r->root) return coord_http_err(e, 400, NULL, "malformed JSON: %s (line %d, column %d)", je.text, je.line, je.column);
  if (!json_is_object(r->root)) {
    coord_http_req_free(r);
    return coord_http_err(e, 400, NULL, "the request body must be a JSON object");
  }
  if (req_fields(r, served_model, max_model_len, e)) {
    coord_http_req_free(r);
    return -1;
  }
  return 0;
}

void coord_http_req_free(coord_http_req_t *r) {
  json_decref(r->root);
  free(r->stop);
  free(r->stop_ids);
  for (size_t i = 0; i < r->n_msg_json; i++) free(r->msg_json[i]);
  free(r->msg_json);
  free(r->chat_vars);
  free(r->messages);
  free(r->bias);
  for (uint32_t i = 0; i < r->n_prompts; i++) free(r->prompts[i].ids);
  free(r->prompts);
  free(r->guide_spec);
  memset(r, 0, sizeof *r);
}
