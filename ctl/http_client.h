/* http_client.h - a small blocking HTTP/1.1 client over sockets for
 * ferrumctl's chat and bench commands (and the HTTP tests): one request
 * per connection ("Connection: close"), Content-Length or chunked bodies,
 * Server-Sent Events line by line, a timeout on every wait.
 *
 * Threads: a cli_http_t is used by one thread at a time. Ownership: the
 * strings it returns live in the cli_http_t until the next call.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int fd;
  int timeout_ms;     /* per wait (connect, each read) */
  int status;         /* response status after cli_http_send */
  bool chunked;       /* Transfer-Encoding: chunked */
  long long remaining;/* bytes left of the body or of the current chunk; -1 = until close */
  bool body_done;
  char buf[16384];    /* received bytes not consumed yet: buf[rpos, wpos) */
  size_t rpos, wpos;
  char *line;         /* last line / SSE data (owned) */
  size_t line_cap;
} cli_http_t;

/* Connects to host:port (numeric or a name). Returns 0 or a negative error. */
int cli_http_connect(cli_http_t *c, const char *host, int port, int timeout_ms);
/* Sends a request (body may be NULL) with optional extra header lines
 * ("Authorization: Bearer x\r\n") and reads the status line and headers.
 * Returns 0 (c->status set) or a negative error (-ETIMEDOUT, FR_EPROTO). */
int cli_http_send(cli_http_t *c, const char *method, const char *path, const char *extra_headers, const char *body,
                  size_t len);
/* Reads up to cap body bytes (de-chunked). Returns the count, 0 at the end
 * of the body, or a negative error. */
long cli_http_read(cli_http_t *c, char *out, size_t cap);
/* Reads the whole body into a malloc'd NUL-terminated string (at most
 * max bytes, else FR_ETOOBIG). */
int cli_http_read_all(cli_http_t *c, size_t max, char **out, size_t *len);
/* The next SSE event's data (lines after "data: ", joined): returns 1 with
 * *data (valid until the next call), 0 at the end of the stream. */
int cli_http_next_sse(cli_http_t *c, const char **data);
void cli_http_close(cli_http_t *c);

#ifdef __cplusplus
}
#endif
