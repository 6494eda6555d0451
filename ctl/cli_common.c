/* cli_common.c - helpers shared by ferrumctl's subcommands. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

int cli_model_path_abs(const char *path, char *out, size_t cap) {
  struct stat st;
  size_t n = strlen(path);
  if (path[0] == '/' || stat(path, &st) != 0) /* absolute already, or not there: the opener names it */
    return snprintf(out, cap, "%s", path) < (int)cap ? 0 : fr_errorf(FR_ETOOBIG, "model path too long");
  while (n > 1 && path[n - 1] == '/') n--; /* "models/tiny-hf/" */
  const char *slash = memrchr(path, '/', n);
  const char *name = slash ? slash + 1 : path;
  size_t name_len = n - (size_t)(name - path);
  char dir[PATH_MAX], real[PATH_MAX];
  bool dots = (name_len == 1 && name[0] == '.') || (name_len == 2 && !strncmp(name, "..", 2));
  if (dots) snprintf(dir, sizeof dir, "%.*s", (int)n, path); /* the whole path is a folder */
  else snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
  if (!realpath(dir, real)) return fr_errorf(-errno, "%s: %s", path, strerror(errno));
  int w = dots ? snprintf(out, cap, "%s", real)
               : snprintf(out, cap, "%s%s%.*s", real, strcmp(real, "/") ? "/" : "", (int)name_len, name);
  return w >= 0 && (size_t)w < cap ? 0 : fr_errorf(FR_ETOOBIG, "%s: path too long", path);
}

int cli_http_target(const char *cmd, const char *rpc, const char **host, int *port) {
  static char found[256];
  if (rpc && (*host || *port)) {
    fprintf(stderr, "ferrumctl %s: give --rpc or --host/--port/--base-url, not both\n", cmd);
    return -1;
  }
  if (*host || *port) {
    if (!*host) *host = "127.0.0.1";
    if (!*port) *port = 8000;
    return 0;
  }
  int rc = cli_server_http(rpc, found, sizeof found, port);
  if (rc == 0) {
    *host = found;
    return 0;
  }
  if (rc != FR_ENOTFOUND || rpc) {
    fprintf(stderr, "ferrumctl %s: %s\n", cmd, fr_last_error());
    return -1;
  }
  *host = "127.0.0.1", *port = 8000; /* a server started some other way, as vLLM's clients assume */
  return 0;
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
