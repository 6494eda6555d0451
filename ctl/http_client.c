/* http_client.c - see http_client.h. */
#include "ctl/http_client.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/fr_err.h"
#include "common/fr_util.h"

static int hc_wait(int fd, short ev, int timeout_ms) {
  struct pollfd p = {.fd = fd, .events = ev};
  for (;;) {
    int n = poll(&p, 1, timeout_ms);
    if (n > 0) return 0;
    if (n == 0) return fr_errorf(-ETIMEDOUT, "HTTP: no answer within %d ms", timeout_ms);
    if (errno != EINTR) return -errno;
  }
}

static int hc_connect_ai(cli_http_t *c, const struct addrinfo *ai) {
  int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
  if (fd < 0) return -errno;
  if (connect(fd, ai->ai_addr, ai->ai_addrlen) && errno != EINPROGRESS) goto fail;
  int err = hc_wait(fd, POLLOUT, c->timeout_ms);
  if (err) {
    close(fd);
    return err;
  }
  socklen_t el = sizeof err;
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) || err) {
    errno = err ? err : errno;
    goto fail;
  }
  c->fd = fd;
  return 0;
fail:
  err = -errno;
  close(fd);
  return err;
}

int cli_http_connect(cli_http_t *c, const char *host, int port, int timeout_ms) {
  memset(c, 0, sizeof *c);
  c->fd = -1;
  c->timeout_ms = timeout_ms > 0 ? timeout_ms : 30000;
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res;
  char ps[16];
  snprintf(ps, sizeof ps, "%d", port);
  int rc = getaddrinfo(host, ps, &hints, &res);
  if (rc) return fr_errorf(-EHOSTUNREACH, "HTTP: %s: %s", host, gai_strerror(rc));
  rc = -ECONNREFUSED;
  for (struct addrinfo *ai = res; ai && c->fd < 0; ai = ai->ai_next) rc = hc_connect_ai(c, ai);
  freeaddrinfo(res);
  if (rc) return fr_errorf(rc, "HTTP: connect %s:%d: %s", host, port, fr_strerror(rc));
  return 0;
}

static int hc_write_all(cli_http_t *c, const char *p, size_t n) {
  while (n) {
    ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL);
    if (w > 0) {
      p += w, n -= (size_t)w;
      continue;
    }
    if (w < 0 && errno != EAGAIN && errno != EINTR) return -errno;
    int rc = hc_wait(c->fd, POLLOUT, c->timeout_ms);
    if (rc) return rc;
  }
  return 0;
}

/* Reads more bytes into buf. Returns the count, 0 at EOF, or an error. */
static long hc_fill(cli_http_t *c) {
  if (c->rpos == c->wpos) c->rpos = c->wpos = 0;
  if (c->wpos == sizeof c->buf) {
    memmove(c->buf, c->buf + c->rpos, c->wpos - c->rpos);
    c->wpos -= c->rpos, c->rpos = 0;
  }
  for (;;) {
    ssize_t r = recv(c->fd, c->buf + c->wpos, sizeof c->buf - c->wpos, 0);
    if (r >= 0) {
      c->wpos += (size_t)r;
      return r;
    }
    if (errno != EAGAIN && errno != EINTR) return -errno;
    int rc = hc_wait(c->fd, POLLIN, c->timeout_ms);
    if (rc) return rc;
  }
}

/* Reads one CRLF- (or LF-) terminated line of the raw stream into c->line. */
static int hc_raw_line(cli_http_t *c, size_t max) {
  size_t n = 0;
  for (;;) {
    while (c->rpos < c->wpos) {
      char ch = c->buf[c->rpos++];
      if (ch == '\n') {
        if (n && c->line[n - 1] == '\r') n--;
        c->line[n] = 0;
        return 0;
      }
      if (n + 2 > c->line_cap) {
        if (n + 2 > max) return fr_errorf(FR_ETOOBIG, "HTTP: line longer than %zu bytes", max);
        c->line_cap = c->line_cap ? c->line_cap * 2 : 256;
        c->line = fr_realloc(c->line, c->line_cap);
      }
      c->line[n++] = ch;
    }
    long r = hc_fill(c);
    if (r <= 0) return r ? (int)r : fr_errorf(FR_ETRUNCATED, "HTTP: connection closed mid-line");
  }
}

static int hc_headers(cli_http_t *c) {
  int rc = hc_raw_line(c, 8192);
  if (rc) return rc;
  if (sscanf(c->line, "HTTP/%*d.%*d %d", &c->status) != 1) return fr_errorf(FR_EPROTO, "HTTP: bad status line");
  c->remaining = -1;
  for (;;) {
    if ((rc = hc_raw_line(c, 16384))) return rc;
    if (!c->line[0]) break;
    if (!strncasecmp(c->line, "content-length:", 15)) c->remaining = strtoll(c->line + 15, NULL, 10);
    if (!strncasecmp(c->line, "transfer-encoding:", 18) && strcasestr(c->line, "chunked")) c->chunked = true;
  }
  if (c->chunked) c->remaining = 0; /* the first chunk header comes next */
  c->body_done = !c->chunked && c->remaining == 0;
  return 0;
}

int cli_http_send(cli_http_t *c, const char *method, const char *path, const char *extra, const char *body,
                  size_t len) {
  char head[1024];
  int n = snprintf(head, sizeof head,
                   "%s %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nAccept: */*\r\n%s"
                   "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                   method, path, extra ? extra : "", body ? len : 0);
  if (n < 0 || (size_t)n >= sizeof head) return fr_errorf(FR_ETOOBIG, "HTTP: request head too long");
  int rc = hc_write_all(c, head, (size_t)n);
  if (!rc && body && len) rc = hc_write_all(c, body, len);
  /* a server may answer (413) and close before it read the whole body */
  if (rc && rc != -EPIPE && rc != -ECONNRESET) return rc;
  int hr = hc_headers(c);
  return hr && rc ? rc : hr;
}

/* Moves to the next chunk: reads its size line. */
static int hc_next_chunk(cli_http_t *c) {
  int rc = hc_raw_line(c, 256);
  if (rc == 0 && !c->line[0]) rc = hc_raw_line(c, 256); /* CRLF after the previous chunk */
  if (rc) return rc;
  char *end;
  long long n = strtoll(c->line, &end, 16);
  if (end == c->line || n < 0) return fr_errorf(FR_EPROTO, "HTTP: bad chunk size '%.32s'", c->line);
  c->remaining = n;
  if (n == 0) c->body_done = true; /* trailers are not read: one request per connection */
  return 0;
}

long cli_http_read(cli_http_t *c, char *out, size_t cap) {
  while (!c->body_done) {
    if (c->chunked && c->remaining == 0) {
      int rc = hc_next_chunk(c);
      if (rc) return rc;
      continue;
    }
    if (c->rpos == c->wpos) {
      long r = hc_fill(c);
      if (r < 0) return r;
      if (r == 0) {
        c->body_done = true;
        if (c->remaining > 0 || c->chunked) return fr_errorf(FR_ETRUNCATED, "HTTP: body cut short");
        return 0;
      }
    }
    size_t n = c->wpos - c->rpos;
    if (n > cap) n = cap;
    if (c->remaining >= 0 && (long long)n > c->remaining) n = (size_t)c->remaining;
    memcpy(out, c->buf + c->rpos, n);
    c->rpos += n;
    if (c->remaining >= 0) {
      c->remaining -= (long long)n;
      if (!c->chunked && c->remaining == 0) c->body_done = true;
    }
    return (long)n;
  }
  return 0;
}

int cli_http_read_all(cli_http_t *c, size_t max, char **out, size_t *len) {
  size_t n = 0, cap = 4096;
  char *p = fr_malloc(cap);
  for (;;) {
    if (cap - n < 2048) p = fr_realloc(p, cap *= 2);
    long r = cli_http_read(c, p + n, cap - n - 1);
    if (r < 0) {
      free(p);
      return (int)r;
    }
    if (r == 0) break;
    n += (size_t)r;
    if (n > max) {
      free(p);
      return fr_errorf(FR_ETOOBIG, "HTTP: body larger than %zu bytes", max);
    }
  }
  p[n] = 0;
  *out = p;
  if (len) *len = n;
  return 0;
}

/* One line of the (de-chunked) body into c->line; 0, 1 at end, or error. */
static int hc_body_line(cli_http_t *c, size_t *n_out) {
  size_t n = 0;
  for (;;) {
    char ch;
    long r = cli_http_read(c, &ch, 1);
    if (r < 0) return (int)r;
    if (r == 0 && n == 0) return 1;
    if (r == 0 || ch == '\n') break;
    if (n + 2 > c->line_cap) {
      if (n + 2 > (8u << 20)) return fr_errorf(FR_ETOOBIG, "SSE: line too long");
      c->line_cap = c->line_cap ? c->line_cap * 2 : 256;
      c->line = fr_realloc(c->line, c->line_cap);
    }
    c->line[n++] = ch;
  }
  if (n && c->line[n - 1] == '\r') n--;
  c->line[n] = 0;
  *n_out = n;
  return 0;
}

int cli_http_next_sse(cli_http_t *c, const char **data) {
  for (;;) {
    size_t n = 0;
    int rc = hc_body_line(c, &n);
    if (rc) return rc == 1 ? 0 : rc;
    if (n >= 5 && !strncmp(c->line, "data:", 5)) {
      *data = c->line + 5 + (c->line[5] == ' ');
      return 1;
    }
  }
}

void cli_http_close(cli_http_t *c) {
  if (c->fd >= 0) close(c->fd);
  c->fd = -1;
  free(c->line);
  c->line = NULL;
  c->line_cap = 0;
}
