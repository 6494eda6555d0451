/* fr_log.c - leveled logging to stderr. */
#include "fr_log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int fr__level = -1;
static char fr__tag[32] = "ferrum";

static int fr__level_from_env(void) {
  const char *s = getenv("FERRUM_LOG");
  if (!s) return FR_LOG_INFO;
  if (!strcmp(s, "error")) return FR_LOG_ERROR;
  if (!strcmp(s, "warn")) return FR_LOG_WARN;
  if (!strcmp(s, "debug")) return FR_LOG_DEBUG;
  return FR_LOG_INFO;
}

int fr_log_enabled(fr_log_level_t level) {
  if (fr__level < 0) fr__level = fr__level_from_env();
  return (int)level <= fr__level;
}

void fr_log_set_level(fr_log_level_t level) { fr__level = (int)level; }

void fr_log_set_tag(const char *tag) { snprintf(fr__tag, sizeof fr__tag, "%s", tag); }

void fr_log(fr_log_level_t level, const char *fmt, ...) {
  static const char *names[] = {"error", "warn", "info", "debug"};
  if (!fr_log_enabled(level)) return;
  char buf[1024];
  int n = snprintf(buf, sizeof buf, "[%s] %s: ", fr__tag, names[level]);
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
  va_end(ap);
  if (m < 0) m = 0;
  size_t len = (size_t)n + (size_t)m;
  if (len > sizeof buf - 2) len = sizeof buf - 2;
  buf[len++] = '\n';
  ssize_t w = write(2, buf, len);
  (void)w;
}
