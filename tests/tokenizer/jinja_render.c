/* jinja_render - renders a chat template with ferrum's interpreter, for
 * check_jinja.py (which renders the same with jinja2 and compares).
 *   jinja_render TEMPLATE.jinja CASES.json OUT.json
 * CASES.json is a list of variable objects; OUT.json gets, per case,
 * {"out": text} or {"error": message}. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "model/jinja.h"

static char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc((size_t)len + 1);
  *n = fread(s, 1, (size_t)len, f);
  s[*n] = 0;
  fclose(f);
  return s;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: jinja_render TEMPLATE CASES.json OUT.json\n");
    return 2;
  }
  size_t n;
  char *src = slurp(argv[1], &n);
  json_error_t je;
  json_t *cases = json_load_file(argv[2], 0, &je);
  if (!src || !json_is_array(cases)) {
    fprintf(stderr, "jinja_render: cannot read %s or %s\n", argv[1], argv[2]);
    return 2;
  }
  json_t *outs = json_array();
  model_jinja_t *t = NULL;
  int prc = model_jinja_parse(&t, src, n);
  char perr[600];
  snprintf(perr, sizeof perr, "%s", prc ? fr_last_error() : "");
  size_t i;
  json_t *vars;
  json_array_foreach(cases, i, vars) {
    char *out = NULL;
    size_t len = 0;
    int rc = prc ? prc : model_jinja_render(t, vars, NULL, &out, &len);
    if (rc) json_array_append_new(outs, json_pack("{s:s}", "error", prc ? perr : fr_last_error()));
    else json_array_append_new(outs, json_pack("{s:s%}", "out", out, len));
    free(out);
  }
  model_jinja_destroy(t);
  int rc = json_dump_file(outs, argv[3], JSON_INDENT(1));
  json_decref(outs);
  json_decref(cases);
  free(src);
  return rc ? 1 : 0;
}
