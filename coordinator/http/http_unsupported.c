/* http_unsupported.c - the OpenAI request fields ferrum does not act on
 * yet. A client that sends one with a value that would change the answer
 * (legacy functions, guided_grammar, ...) gets a 400 naming it rather
 * than a 200 whose output ignored it; the value that means "off" (null, an
 * empty list or object, "none", {"type": "text"}) passes. Fields that
 * change nothing about the output (user, safety_identifier, metadata, store, service_tier,
 * parallel_tool_calls, prompt_cache_key and the other prompt cache hints)
 * are accepted, as vLLM accepts them. tests/engine/test_http_choices.py
 * checks every field of the openai client's request types against this.
 * `tools` and `tool_choice` are read in http_tools.c, the output
 * constraints (response_format, guided_json / regex / choice,
 * structured_outputs) in http_guide.c; the legacy `functions` and
 * `function_call` are refused. */
#include <string.h>

#include "coordinator/http/http_internal.h"

/* True when v is absent or an "off" value: null, false, 0, "", [] or {}. */
static bool unsupported_off(const json_t *v) {
  if (!v || json_is_null(v) || json_is_false(v)) return true;
  if (json_is_integer(v)) return json_integer_value(v) == 0;
  if (json_is_string(v)) return json_string_length(v) == 0;
  if (json_is_array(v)) return json_array_size(v) == 0;
  if (json_is_object(v)) return json_object_size(v) == 0;
  return false;
}

static bool unsupported_is_str(const json_t *v, const char *s) { return json_is_string(v) && !strcmp(json_string_value(v), s); }

int coord_http_req_unsupported(const json_t *root, coord_http_api_t api, coord_http_err_t *e) {
  static const struct {
    const char *field, *what;
    bool chat_only, completions_only, null_only; /* null_only: 0 or [] is a request too */
  } plain[] = {
      {"functions", "function calling", true, false, false},
      {"suffix", "suffixes (insertion)", false, true, false},
      {"audio", "audio output", true, false, false},
      {"prediction", "predicted outputs", true, false, false},
      {"reasoning_effort", "reasoning effort (no reasoning models' controls)", true, false, false},
      {"verbosity", "verbosity control", true, false, false},
      {"web_search_options", "web search", true, false, false},
      {"moderation", "moderation", true, false, false},
      {"guided_grammar", "guided decoding", false, false, false},
  };
  bool chat = api == COORD_HTTP_API_CHAT;
  for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++) {
    if ((plain[i].chat_only && !chat) || (plain[i].completions_only && chat)) continue;
    const json_t *v = json_object_get(root, plain[i].field);
    if (plain[i].null_only ? v && !json_is_null(v) : !unsupported_off(v))
      return coord_http_err(e, 400, plain[i].field, "'%s' is not supported: this server does not do %s yet",
                            plain[i].field, plain[i].what);
  }
  if (chat) {
    const json_t *fc = json_object_get(root, "function_call");
    if (!unsupported_off(fc) && !unsupported_is_str(fc, "none") && !unsupported_is_str(fc, "auto"))
      return coord_http_err(e, 400, "function_call", "'function_call' is not supported: this server does not do function calling yet");
    const json_t *mod = json_object_get(root, "modalities");
    if (!unsupported_off(mod) && !(json_is_array(mod) && json_array_size(mod) == 1 && unsupported_is_str(json_array_get(mod, 0), "text")))
      return coord_http_err(e, 400, "modalities", "'modalities' other than [\"text\"] are not supported");
  }
  return 0;
}
