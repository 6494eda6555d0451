/* fr_err.h - error codes and error messages shared by every module.
 *
 * Functions that can fail return int: 0 on success, a negative value on
 * error. Negative errno values pass through unchanged; ferrum's own codes
 * live in a reserved range below FR__ERR_BASE. One X-macro table generates
 * the enum, fr_strerror() and fr_errname() (as libuv's UV_ERRNO_MAP does).
 *
 * A failing function may also leave a detailed, human-readable message in a
 * thread-local buffer with fr_errorf(); callers that report the error print
 * fr_last_error(). The detail is advisory: the return code is the contract.
 */
#pragma once

#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FR__ERR_BASE (-10000)

/* XX(name, offset, message) */
#define FR_ERRNO_MAP(XX)                                                   \
  XX(FORMAT, 1, "malformed input")                                         \
  XX(TRUNCATED, 2, "input truncated")                                      \
  XX(UNSUPPORTED, 3, "unsupported feature")                                \
  XX(NOTFOUND, 4, "not found")                                             \
  XX(TOOBIG, 5, "size limit exceeded")                                     \
  XX(VERSION, 6, "unsupported version")                                    \
  XX(PROTO, 7, "protocol error")                                           \
  XX(CUDA, 8, "CUDA error")                                                \
  XX(CUBLAS, 9, "cuBLAS error")                                            \
  XX(NCCL, 10, "NCCL error")                                               \
  XX(DEVOOM, 11, "device out of memory")                                   \
  XX(CANCELED, 12, "canceled")                                             \
  XX(STATE, 13, "invalid state")                                           \
  XX(CONTEXT, 14, "context length exceeded")                               \
  XX(BUSY, 15, "resource exhausted")                                       \
  XX(TIMEOUT, 16, "timed out")                                             \
  XX(ZMQ, 17, "ZeroMQ error")                                              \
  XX(DEAD, 18, "peer died")                                                \
  XX(AUTH, 19, "not authorized")

typedef enum {
#define FR__ERR_ENUM(name, off, msg) FR_E##name = FR__ERR_BASE - (off),
  FR_ERRNO_MAP(FR__ERR_ENUM)
#undef FR__ERR_ENUM
} fr_errcode_t;

/* Returns a static message for an error code (ferrum's or -errno). */
const char *fr_strerror(int err);

/* Returns the symbolic name of an error code ("FR_EFORMAT", "ENOMEM", ...). */
const char *fr_errname(int err);

/* Records a detailed message for the calling thread and returns err, so that
 * `return fr_errorf(FR_EFORMAT, "tensor %s: bad offset", name);` reads well. */
int fr_errorf(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The calling thread's last detailed message; falls back to fr_strerror()
 * of the last code when no detail was recorded. Never NULL. */
const char *fr_last_error(void);

/* Clears the calling thread's detail. */
void fr_error_clear(void);

#ifdef __cplusplus
}
#endif
