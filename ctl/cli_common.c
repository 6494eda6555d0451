/* cli_common.c - helpers shared by ferrumctl's subcommands. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fr_err.h"
#include "ctl/cli.h"

#define CLI_DEFAULT_MODEL_FILE "models/SmolLM2-135M-Instruct.Q4_1.gguf"

const char *cli_default_model(void) {
  const char *env = getenv("FERRUM_MODEL");
  if (env && *env) return env;
  if (access(CLI_DEFAULT_MODEL_FILE, R_OK) == 0) return CLI_DEFAULT_MODEL_FILE;
  static char path[4096];
  snprintf(path, sizeof path, "%s/%s", FERRUM_SOURCE_DIR, CLI_DEFAULT_MODEL_FILE);
  if (access(path, R_OK) == 0) return path;
  return CLI_DEFAULT_MODEL_FILE;
}

int cli_parse_int(const char *opt, const char *s, long lo, long hi, long *out) {
  char *end;
  errno = 0;
  long v = s ? strtol(s, &end, 10) : 0;
  if (!s || errno || end == s || *end || v < lo || v > hi) {
    fprintf(stderr, "ferrumctl: %s expects an integer in [%ld, %ld], got '%s'\n", opt, lo, hi, s ? s : "");
    return -1;
  }
  *out = v;
  return 0;
}

int cli_parse_float(const char *opt, const char *s, double lo, double hi, double *out) {
  char *end;
  errno = 0;
  double v = s ? strtod(s, &end) : 0;
  if (!s || errno || end == s || *end || !(v >= lo && v <= hi)) {
    fprintf(stderr, "ferrumctl: %s expects a number in [%g, %g], got '%s'\n", opt, lo, hi, s ? s : "");
    return -1;
  }
  *out = v;
  return 0;
}

/* The multiplier of a size suffix (0: not one). */
static double cli_size_unit(char c) {
  const char *dec = "kmgt", *bin = "KMGT";
  const char *p = c ? strchr(dec, c) : NULL;
  if (p) return pow(1000.0, (double)(p - dec + 1));
  p = c ? strchr(bin, c) : NULL;
  return p ? pow(1024.0, (double)(p - bin + 1)) : 0;
}

int cli_parse_size(const char *opt, const char *s, uint64_t *out) {
  char *end = NULL;
  errno = 0;
  double v = s && *s && *s != '-' && *s != '+' ? strtod(s, &end) : -1;
  double unit = end && end != s && *end ? cli_size_unit(*end) : 1;
  bool ok = !errno && end && end != s && unit > 0 && (!*end || !end[1]) && isfinite(v);
  double bytes = ok ? floor(v * unit) : -1;
  if (!ok || bytes < 1 || bytes >= 9.2e18 || (unit == 1 && bytes != v)) {
    fprintf(stderr, "ferrumctl: %s expects a byte count such as 4G, 512M or 1073741824, got '%s'\n", opt,
            s ? s : "");
    return -1;
  }
  *out = (uint64_t)bytes;
  return 0;
}

int cli_sibling_exe(const char *name, char *out, size_t cap) {
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return fr_errorf(-errno, "readlink /proc/self/exe: %s", strerror(errno));
  self[n] = 0;
  char *slash = strrchr(self, '/');
  if (slash) *slash = 0;
  if ((size_t)snprintf(out, cap, "%s/%s", slash ? self : ".", name) >= cap)
    return fr_errorf(FR_ETOOBIG, "path of %s is too long", name);
  if (access(out, X_OK) != 0) return fr_errorf(-ENOENT, "%s not found (build it next to ferrumctl)", out);
  return 0;
}
