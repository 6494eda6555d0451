/* fr_err.c - error code table and thread-local error detail. */
#include "fr_err.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char fr__detail[512];
static _Thread_local int fr__last_code;

const char *fr_strerror(int err) {
  switch (err) {
#define FR__ERR_MSG(name, off, msg) \
  case FR_E##name:                  \
    return msg;
    FR_ERRNO_MAP(FR__ERR_MSG)
#undef FR__ERR_MSG
  default:
    break;
  }
  if (err == 0) return "success";
  if (err < 0 && err > FR__ERR_BASE) return strerror(-err);
  return "unknown error";
}

const char *fr_errname(int err) {
  switch (err) {
#define FR__ERR_NAME(name, off, msg) \
  case FR_E##name:                   \
    return "FR_E" #name;
    FR_ERRNO_MAP(FR__ERR_NAME)
#undef FR__ERR_NAME
  case 0: return "OK";
  case -ENOMEM: return "ENOMEM";
  case -EINVAL: return "EINVAL";
  case -ENOENT: return "ENOENT";
  case -EIO: return "EIO";
  case -EEXIST: return "EEXIST";
  case -EACCES: return "EACCES";
  case -EAGAIN: return "EAGAIN";
  case -ERANGE: return "ERANGE";
  default: return "UNKNOWN";
  }
}

int fr_errorf(int err, const char *fmt, ...) {
  char buf[sizeof fr__detail]; /* callers pass fr_last_error() to add context: never format in place */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  memcpy(fr__detail, buf, sizeof buf);
  fr__last_code = err;
  return err;
}

const char *fr_last_error(void) {
  if (fr__detail[0]) return fr__detail;
  return fr_strerror(fr__last_code);
}

void fr_error_clear(void) {
  fr__detail[0] = '\0';
  fr__last_code = 0;
}
