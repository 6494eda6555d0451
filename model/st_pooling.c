/* st_pooling.c - the pooling a sentence-transformers model names: its
 * modules.json lists a sentence_transformers.models.Pooling module whose
 * folder (1_Pooling) holds a config.json with pooling_mode_* flags (or,
 * in newer releases, a pooling_mode string). A module ferrum does not
 * run (Dense, ...) is refused. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "model/file.h"
#include "model/source.h"

#define ST_MAX_JSON (1u << 20) /* these files are a few hundred bytes */

/* dir/name parsed into *root, or *root NULL when there is no such file;
 * a file that cannot be read or is not JSON is an error naming it. */
static int st_load(const char *dir, const char *name, json_t **root) {
  char path[4096];
  char *text = NULL;
  size_t len = 0;
  struct stat sb;
  json_error_t je;
  *root = NULL;
  snprintf(path, sizeof path, "%s/%s", dir, name);
  if (stat(path, &sb) != 0) return 0;
  int rc = model__file_read("sentence-transformers", path, ST_MAX_JSON, &text, &len);
  if (rc) return rc;
  /* numbers as reals: only strings and booleans are read */
  *root = json_loadb(text, len, JSON_DECODE_INT_AS_REAL, &je);
  free(text);
  return *root ? 0 : fr_errorf(FR_EFORMAT, "sentence-transformers: %s: %s (line %d)", path, je.text, je.line);
}

/* A module that changes the vectors after pooling (Dense, LayerNorm, ...)
 * would make ferrum's embeddings differ from sentence-transformers':
 * refused. Transformer, Pooling and Normalize are what ferrum runs. */
static int st_check_modules(json_t *modules) {
  static const char *const ok[] = {".Transformer", ".Pooling", ".Normalize"};
  size_t i;
  json_t *m;
  json_array_foreach(modules, i, m) {
    const char *type = json_string_value(json_object_get(m, "type"));
    const char *dot = type ? strrchr(type, '.') : NULL;
    bool known = false;
    for (size_t k = 0; dot && k < FR_ARRAY_SIZE(ok); k++) known |= !strcmp(dot, ok[k]);
    if (!known)
      return fr_errorf(FR_EUNSUPPORTED, "sentence-transformers module %.64s is not supported (Transformer, Pooling, "
                       "Normalize)", type ? type : "(no type)");
  }
  return 0;
}

/* The Pooling module's folder in modules.json (borrowed from root), or NULL. */
static const char *st_pooling_dir(json_t *modules) {
  size_t i;
  json_t *m;
  json_array_foreach(modules, i, m) {
    const char *type = json_string_value(json_object_get(m, "type"));
    const char *path = json_string_value(json_object_get(m, "path"));
    size_t n = type ? strlen(type) : 0;
    if (path && n >= 8 && !strcmp(type + n - 8, ".Pooling") && !strstr(path, "..")) return path;
  }
  return NULL;
}

static bool st_flag(json_t *cfg, const char *key) { return json_is_true(json_object_get(cfg, key)); }

/* The mode of a Pooling config.json; FR_EUNSUPPORTED for max, weighted
 * mean and the other modes ferrum does not run. */
static int st_mode(json_t *cfg, model_pooling_t *out) {
  const char *mode = json_string_value(json_object_get(cfg, "pooling_mode"));
  if (mode) {
    if (!strcmp(mode, "mean")) *out = MODEL_POOL_MEAN;
    else if (!strcmp(mode, "cls")) *out = MODEL_POOL_CLS;
    else if (!strcmp(mode, "lasttoken")) *out = MODEL_POOL_LAST;
    else return fr_errorf(FR_EUNSUPPORTED, "sentence-transformers pooling_mode '%.32s' is not supported "
                                           "(mean, cls, lasttoken)", mode);
    return 0;
  }
  int n = st_flag(cfg, "pooling_mode_mean_tokens") + st_flag(cfg, "pooling_mode_cls_token") +
          st_flag(cfg, "pooling_mode_lasttoken");
  bool other = st_flag(cfg, "pooling_mode_max_tokens") || st_flag(cfg, "pooling_mode_mean_sqrt_len_tokens") ||
               st_flag(cfg, "pooling_mode_weightedmean_tokens");
  if (n != 1 || other)
    return fr_errorf(FR_EUNSUPPORTED, "sentence-transformers pooling: only one of mean, cls or lasttoken is supported");
  *out = st_flag(cfg, "pooling_mode_mean_tokens") ? MODEL_POOL_MEAN
         : st_flag(cfg, "pooling_mode_cls_token") ? MODEL_POOL_CLS : MODEL_POOL_LAST;
  return 0;
}

int model_st_pooling(const char *dir, model_pooling_t *out) {
  json_t *modules;
  int rc = st_load(dir, "modules.json", &modules);
  if (rc || !modules) return rc; /* none: not a sentence-transformers model, the pooling stays as it was */
  rc = json_is_array(modules) ? st_check_modules(modules)
                              : fr_errorf(FR_EFORMAT, "sentence-transformers: %s/modules.json is not a list", dir);
  const char *sub = !rc ? st_pooling_dir(modules) : NULL;
  if (sub) {
    char name[1024];
    snprintf(name, sizeof name, "%s/config.json", sub);
    json_t *cfg;
    rc = st_load(dir, name, &cfg);
    if (!rc)
      rc = json_is_object(cfg) ? st_mode(cfg, out)
                               : fr_errorf(FR_EFORMAT, "sentence-transformers: %s/%s is missing or not an object",
                                           dir, name);
    json_decref(cfg);
  }
  json_decref(modules);
  return rc;
}
