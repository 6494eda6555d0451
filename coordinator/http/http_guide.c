/* http_guide.c - the request fields that constrain the output, turned
 * into the submit's guide (a JSON schema or a regex) and checked here by
 * compiling them, so that what the grammar cannot do is a 400 naming the
 * field: OpenAI's response_format (json_object; json_schema), vLLM's
 * guided_json / guided_regex / guided_choice and structured_outputs
 * {json, regex, choice}, and tool_choice "required" / a named function
 * (the calls' JSON schema, as vLLM builds it). One of them per request.
 * See http_internal.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/http/http_internal.h"
#include "model/grammar.h"

/* Compiles the guide to check it; 0 or a 400 naming param. */
static int guide_check(proto_guide_kind_t kind, const char *spec, const char *param, coord_http_err_t *e) {
  model_grammar_t *g = NULL;
  char why[400] = "";
  size_t n = spec ? strlen(spec) : 0;
  int rc = kind == PROTO_GUIDE_JSON ? model_grammar_json(&g, spec, n, why, sizeof why)
                                    : model_grammar_regex(&g, spec, n, why, sizeof why);
  model_grammar_destroy(g);
  if (rc) return coord_http_err(e, 400, param, "'%s': %s", param, why[0] ? why : "cannot be compiled");
  return 0;
}

/* Sets the guide (spec malloc'd, taken; NULL: any JSON object). */
static int guide_set(coord_http_req_t *r, proto_guide_kind_t kind, char *spec, const char *param, coord_http_err_t *e) {
  if (r->sub.guide.kind != PROTO_GUIDE_NONE) {
    free(spec);
    return coord_http_err(e, 400, param, "'%s' cannot be combined with '%s': one output constraint per request", param,
                          r->guide_param);
  }
  if (spec && strlen(spec) > PROTO_MAX_TEXT) {
    free(spec);
    return coord_http_err(e, 400, param, "'%s' is too long", param);
  }
  r->guide_spec = spec;
  r->guide_param = param;
  r->sub.guide = (proto_guide_t){.kind = kind, .spec = spec, .spec_len = spec ? (uint32_t)strlen(spec) : 0};
  return guide_check(kind, spec, param, e);
}

static int guide_schema(coord_http_req_t *r, json_t *schema, const char *param, coord_http_err_t *e) {
  if (json_is_string(schema)) { /* guided_json may be the schema's text */
    json_t *parsed = json_loads(json_string_value(schema), 0, NULL);
    if (!parsed) return coord_http_err(e, 400, param, "'%s' is not a JSON schema", param);
    int rc = guide_schema(r, parsed, param, e);
    json_decref(parsed);
    return rc;
  }
  if (!json_is_object(schema) && !json_is_boolean(schema))
    return coord_http_err(e, 400, param, "'%s' must be a JSON schema object", param);
  char *text = json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY | JSON_PRESERVE_ORDER);
  if (!text) return coord_http_err(e, 500, NULL, "out of memory");
  return guide_set(r, PROTO_GUIDE_JSON, text, param, e);
}

/* guided_choice: the output is one of the strings (a regex of them). */
static int guide_choice(coord_http_req_t *r, json_t *list, const char *param, coord_http_err_t *e) {
  size_t n = json_array_size(list), i, len = 1;
  json_t *v;
  if (!json_is_array(list) || n == 0) return coord_http_err(e, 400, param, "'%s' must be a non-empty list of strings", param);
  json_array_foreach(list, i, v) {
    if (!json_is_string(v) || json_string_length(v) == 0)
      return coord_http_err(e, 400, param, "'%s'[%zu] must be a non-empty string", param, i);
    len += 2 * json_string_length(v) + 1;
  }
  char *re = malloc(len), *w = re;
  if (!re) return coord_http_err(e, 500, NULL, "out of memory");
  json_array_foreach(list, i, v) {
    if (i) *w++ = '|';
    for (const char *c = json_string_value(v); *c; c++) {
      if (strchr("\\.^$|?*+()[]{}", *c)) *w++ = '\\';
      *w++ = *c;
    }
  }
  *w = 0;
  return guide_set(r, PROTO_GUIDE_REGEX, re, param, e);
}

static int guide_regex(coord_http_req_t *r, json_t *v, const char *param, coord_http_err_t *e) {
  if (!json_is_string(v) || json_string_length(v) == 0 || strlen(json_string_value(v)) != json_string_length(v))
    return coord_http_err(e, 400, param, "'%s' must be a regular expression string", param);
  char *re = strdup(json_string_value(v));
  if (!re) return coord_http_err(e, 500, NULL, "out of memory");
  return guide_set(r, PROTO_GUIDE_REGEX, re, param, e);
}

/* response_format: text, json_object, json_schema {name, schema, strict}. */
static int guide_response_format(coord_http_req_t *r, json_t *rf, coord_http_err_t *e) {
  static const char p[] = "response_format";
  json_t *type = json_object_get(rf, "type");
  if (!json_is_object(rf) || !json_is_string(type))
    return coord_http_err(e, 400, p, "'response_format' must be an object with a 'type'");
  const char *t = json_string_value(type);
  if (!strcmp(t, "text")) return 0;
  if (!strcmp(t, "json_object")) return guide_set(r, PROTO_GUIDE_JSON, NULL, p, e);
  if (strcmp(t, "json_schema"))
    return coord_http_err(e, 400, p, "'response_format' type '%.40s' is not supported (text, json_object, json_schema)", t);
  json_t *js = json_object_get(rf, "json_schema"), *schema = json_object_get(js, "schema");
  if (!json_is_object(js)) return coord_http_err(e, 400, p, "'response_format' json_schema needs a 'json_schema' object");
  if (!schema) schema = json_object_get(js, "json_schema"); /* vLLM takes both spellings */
  if (!schema) return coord_http_err(e, 400, p, "'response_format.json_schema' needs a 'schema'");
  return guide_schema(r, schema, p, e);
}

/* vLLM's structured_outputs {json | regex | choice | json_object}. */
static int guide_structured(coord_http_req_t *r, json_t *so, coord_http_err_t *e) {
  static const char p[] = "structured_outputs";
  if (!json_is_object(so)) return coord_http_err(e, 400, p, "'structured_outputs' must be an object");
  const char *k;
  json_t *v;
  json_object_foreach(so, k, v) {
    if (json_is_null(v) || json_is_false(v)) continue;
    int rc;
    if (!strcmp(k, "json")) rc = guide_schema(r, v, p, e);
    else if (!strcmp(k, "regex")) rc = guide_regex(r, v, p, e);
    else if (!strcmp(k, "choice")) rc = guide_choice(r, v, p, e);
    else if (!strcmp(k, "json_object")) rc = guide_set(r, PROTO_GUIDE_JSON, NULL, p, e);
    else if (!strcmp(k, "grammar") || !strcmp(k, "structural_tag"))
      rc = coord_http_err(e, 400, p, "'structured_outputs.%s' is not supported (json, regex, choice, json_object)", k);
    else continue; /* backend options and the like */
    if (rc) return rc;
  }
  return 0;
}

int coord_http_req_guide(coord_http_req_t *r, coord_http_err_t *e) {
  json_t *root = r->root, *v;
  if ((v = json_object_get(root, "response_format")) && !json_is_null(v) && guide_response_format(r, v, e)) return -1;
  if ((v = json_object_get(root, "guided_json")) && !json_is_null(v) && guide_schema(r, v, "guided_json", e)) return -1;
  if ((v = json_object_get(root, "guided_regex")) && !json_is_null(v) && guide_regex(r, v, "guided_regex", e)) return -1;
  if ((v = json_object_get(root, "guided_choice")) && !json_is_null(v) && guide_choice(r, v, "guided_choice", e))
    return -1;
  if ((v = json_object_get(root, "structured_outputs")) && !json_is_null(v) && guide_structured(r, v, e)) return -1;
  if (r->tool_choice == COORD_TOOL_CHOICE_REQUIRED || r->tool_choice == COORD_TOOL_CHOICE_NAMED) {
    json_t *schema = coord_tool_choice_schema(root, r->tool_choice, r->tool_name);
    if (!schema) return coord_http_err(e, 500, NULL, "out of memory");
    int rc = guide_schema(r, schema, "tool_choice", e);
    json_decref(schema);
    if (rc) return -1;
  }
  return 0;
}
