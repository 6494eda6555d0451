/* spec.c - --speculative-config and the n-gram proposer. See spec.h. */
#include "coordinator/spec.h"

#include <errno.h>
#include <jansson.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_util.h"

/* An integer field of the object: *v keeps its value when absent. */
static int coord__spec_int(json_t *o, const char *key, int lo, int hi, int *v, bool *given) {
  json_t *x = json_object_get(o, key);
  *given = x != NULL;
  if (!x) return 0;
  if (!json_is_integer(x)) return fr_errorf(-EINVAL, "--speculative-config: %s must be an integer", key);
  json_int_t n = json_integer_value(x);
  if (n < lo || n > hi) return fr_errorf(-EINVAL, "--speculative-config: %s must be in [%d, %d]", key, lo, hi);
  *v = (int)n;
  return 0;
}

/* Every key must be one we read. */
static int coord__spec_keys(json_t *o) {
  static const char *known[] = {"method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min",
                                "disable_by_batch_size", "min_acceptance_rate", "model"};
  const char *key;
  json_t *v;
  json_object_foreach(o, key, v) {
    bool ok = false;
    for (size_t i = 0; i < FR_ARRAY_SIZE(known) && !ok; i++) ok = !strcmp(key, known[i]);
    if (!ok) return fr_errorf(-EINVAL, "--speculative-config: unknown field \"%s\"", key);
  }
  return 0;
}

/* "method" and "model": the n-gram proposer, or a draft model's path. */
static int coord__spec_method(json_t *o, coord_spec_config_t *c) {
  json_t *m = json_object_get(o, "method"), *d = json_object_get(o, "model");
  if (m && !json_is_string(m))
    return fr_errorf(-EINVAL, "--speculative-config: method must be \"ngram\" or \"draft_model\"");
  const char *method = m ? json_string_value(m) : d ? "draft_model" : NULL;
  if (!method)
    return fr_errorf(-EINVAL, "--speculative-config: \"method\" (\"ngram\") or \"model\" (a draft model) is required");
  if (!strcmp(method, "ngram")) {
    if (d) return fr_errorf(-EINVAL, "--speculative-config: method \"ngram\" takes no \"model\"");
    return 0;
  }
  if (strcmp(method, "draft_model"))
    return fr_errorf(-EINVAL, "--speculative-config: method must be \"ngram\" or \"draft_model\" (the ones built)");
  if (!d) return fr_errorf(-EINVAL, "--speculative-config: method \"draft_model\" needs \"model\" (its path)");
  if (!json_is_string(d) || json_string_length(d) == 0 || json_string_length(d) >= COORD_SPEC_PATH_MAX ||
      strlen(json_string_value(d)) != json_string_length(d))
    return fr_errorf(-EINVAL, "--speculative-config: model must be a path (a string of 1 to %d bytes)",
                     COORD_SPEC_PATH_MAX - 1);
  memcpy(c->draft_model, json_string_value(d), json_string_length(d) + 1);
  return 0;
}

static int coord__spec_fields(json_t *o, coord_spec_config_t *c) {
  int rc = coord__spec_keys(o);
  if (rc) return rc;
  if ((rc = coord__spec_method(o, c))) return rc;
  bool given, g_max, g_min;
  if ((rc = coord__spec_int(o, "num_speculative_tokens", 1, COORD_SPEC_MAX_TOKENS, &c->num_speculative_tokens,
                            &given)))
    return rc;
  if (!given) return fr_errorf(-EINVAL, "--speculative-config: \"num_speculative_tokens\" is required");
  if ((rc = coord__spec_int(o, "prompt_lookup_max", 1, 1024, &c->prompt_lookup_max, &g_max))) return rc;
  if ((rc = coord__spec_int(o, "prompt_lookup_min", 1, 1024, &c->prompt_lookup_min, &g_min))) return rc;
  if (c->draft_model[0] && (g_max || g_min))
    return fr_errorf(-EINVAL, "--speculative-config: prompt_lookup_%s is for the n-gram method, not a draft model",
                     g_max ? "max" : "min");
  if ((rc = coord__spec_int(o, "disable_by_batch_size", 1, 1 << 20, &c->disable_by_batch_size, &given))) return rc;
  json_t *r = json_object_get(o, "min_acceptance_rate");
  if (r && (!json_is_number(r) || json_number_value(r) < 0 || json_number_value(r) > 1))
    return fr_errorf(-EINVAL, "--speculative-config: min_acceptance_rate must be a number in [0, 1]");
  if (r) c->min_acceptance_rate = (float)json_number_value(r);
  if (g_min && !g_max) c->prompt_lookup_max = c->prompt_lookup_min; /* vLLM: one given sets both */
  if (g_max && !g_min) c->prompt_lookup_min = c->prompt_lookup_max;
  if (c->prompt_lookup_min > c->prompt_lookup_max)
    return fr_errorf(-EINVAL, "--speculative-config: prompt_lookup_min %d exceeds prompt_lookup_max %d",
                     c->prompt_lookup_min, c->prompt_lookup_max);
  return 0;
}

int coord_spec_parse(const char *json, coord_spec_config_t *out) {
  coord_spec_config_t c = {.prompt_lookup_max = 5, .prompt_lookup_min = 5, /* vLLM's defaults */
                           .disable_by_batch_size = 0, .min_acceptance_rate = -1}; /* 0, -1: the device's */
  json_error_t err;
  json_t *o = json_loads(json, JSON_REJECT_DUPLICATES, &err);
  if (!o) return fr_errorf(-EINVAL, "--speculative-config is not JSON: %s (column %d)", err.text, err.column);
  int rc = json_is_object(o) ? coord__spec_fields(o, &c)
                             : fr_errorf(-EINVAL, "--speculative-config must be a JSON object");
  json_decref(o);
  if (!rc) *out = c;
  return rc;
}

/* Whether tok[i..i+n) equals the last n tokens. */
static bool coord__spec_match(const int32_t *tok, int n_tok, int i, int n) {
  for (int j = n - 1; j >= 0; j--) /* the last token first: most candidates fail there */
    if (tok[i + j] != tok[n_tok - n + j]) return false;
  return true;
}

int coord_spec_propose(const coord_spec_config_t *cfg, const int32_t *tok, int n_tok, int k_max, int32_t *out) {
  if (k_max <= 0) return 0;
  for (int n = FR_MIN(cfg->prompt_lookup_max, n_tok - 1); n >= cfg->prompt_lookup_min; n--)
    for (int i = n_tok - n - 1; i >= 0; i--) { /* most recent earlier occurrence first */
      if (!coord__spec_match(tok, n_tok, i, n)) continue;
      int from = i + n, k = FR_MIN(k_max, n_tok - from);
      memcpy(out, tok + from, (size_t)k * sizeof(int32_t));
      return k;
    }
  return 0;
}
