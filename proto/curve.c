/* curve.c - CURVE key pairs, key files and socket options (curve.h). */
#include "proto/curve.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "common/fr_err.h"
#include "common/fr_util.h"

#define CURVE_FILE_MAX 65536 /* key files and lists are small */

bool proto_curve_available(void) { return zmq_has("curve") != 0; }

static int curve_need(void) {
  return proto_curve_available() ? 0 : fr_errorf(FR_EUNSUPPORTED, "this libzmq was built without CURVE");
}

int proto_curve_decode(uint8_t out[32], const char *z85) {
  if (!z85 || strlen(z85) != 40 || !zmq_z85_decode(out, z85))
    return fr_errorf(FR_EFORMAT, "not a CURVE key (40 characters of Z85)");
  return 0;
}

int proto_curve_generate(proto_curve_pair_t *kp) {
  int rc = curve_need();
  if (rc) return rc;
  if (zmq_curve_keypair(kp->pub, kp->sec) != 0) return fr_errorf(FR_EZMQ, "zmq_curve_keypair: %s", zmq_strerror(errno));
  return 0;
}

int proto_curve_from_secret(proto_curve_pair_t *kp, const char *secret) {
  uint8_t raw[32];
  int rc = curve_need();
  if (!rc) rc = proto_curve_decode(raw, secret);
  if (rc) return rc;
  memcpy(kp->sec, secret, PROTO_CURVE_Z85);
  if (zmq_curve_public(kp->pub, kp->sec) != 0) return fr_errorf(FR_EFORMAT, "not a CURVE secret key");
  return 0;
}

/* Reads a small text file into a NUL-terminated malloc'd buffer. */
static int curve_slurp(const char *path, char **out) {
  FILE *f = fopen(path, "r");
  if (!f) return fr_errorf(-errno, "%s: %s", path, strerror(errno));
  char *buf = fr_malloc(CURVE_FILE_MAX + 1);
  size_t n = fread(buf, 1, CURVE_FILE_MAX + 1, f);
  int bad = ferror(f);
  fclose(f);
  if (bad || n > CURVE_FILE_MAX) {
    free(buf);
    return fr_errorf(bad ? -EIO : FR_ETOOBIG, "%s: %s", path, bad ? "read error" : "too large for a key file");
  }
  buf[n] = 0;
  *out = buf;
  return 0;
}

/* One line of a key file: "name = value" (value optionally quoted) or a
 * bare value; *name is "" for a bare value. Trims in place. Returns false
 * for a blank or comment line. */
static bool curve_line(char *line, const char **name, char **value) {
  while (isspace((unsigned char)*line)) line++;
  char *end = line + strlen(line);
  while (end > line && isspace((unsigned char)end[-1])) *--end = 0;
  if (!*line) return false;
  uint8_t raw[32];
  *name = "";
  if (end - line == 40 && zmq_z85_decode(raw, line)) { /* a bare key: '#' and '=' are Z85 digits too */
    *value = line;
    return true;
  }
  if (*line == '#') return false; /* comments are whole lines */
  char *eq = strchr(line, '=');
  if (eq) {
    char *ne = eq;
    while (ne > line && isspace((unsigned char)ne[-1])) ne--;
    *ne = 0;
    *name = line;
    line = eq + 1;
    while (isspace((unsigned char)*line)) line++;
  }
  size_t n = strlen(line);
  if (n >= 2 && line[0] == '"' && line[n - 1] == '"') line[n - 1] = 0, line++;
  *value = line;
  return true;
}

/* The next line of text at *cur that holds a key (blanks and comments
 * skipped), split by curve_line; *lineno counts every line. False at the end. */
static bool curve_next(char **cur, int *lineno, const char **field, char **value) {
  while (*cur) {
    char *line = *cur, *next = strchr(line, '\n');
    if (next) *next++ = 0;
    *cur = next;
    ++*lineno;
    if (curve_line(line, field, value)) return true;
  }
  return false;
}

/* A NUL-terminated copy of len bytes (a key file's text may hold NULs: they end it). */
static char *curve_copy(const char *text, size_t len) {
  char *buf = fr_malloc(len + 1);
  memcpy(buf, text, len);
  buf[len] = 0;
  return buf;
}

int proto_curve_parse(const char *name, const char *text_in, size_t len, char pub[PROTO_CURVE_Z85],
                      char sec[PROTO_CURVE_Z85]) {
  if (len > CURVE_FILE_MAX) return fr_errorf(FR_ETOOBIG, "%s: too large for a key file", name);
  char *text = curve_copy(text_in, len);
  int rc = 0, lineno = 0;
  pub[0] = sec[0] = 0;
  const char *field;
  char *value;
  for (char *cur = text; curve_next(&cur, &lineno, &field, &value);) {
    bool is_sec = !strcmp(field, "secret-key"), is_pub = !strcmp(field, "public-key") || !*field;
    uint8_t raw[32];
    if ((!is_sec && !is_pub) || proto_curve_decode(raw, value)) {
      rc = fr_errorf(FR_EFORMAT, "%s: line %d: expected public-key = KEY or secret-key = KEY (40 characters of Z85)",
                     name, lineno);
      break;
    }
    memcpy(is_sec ? sec : pub, value, PROTO_CURVE_Z85);
  }
  free(text);
  if (rc) pub[0] = sec[0] = 0;
  return rc;
}

int proto_curve_load(proto_curve_pair_t *kp, const char *path) {
  char *text, pub[PROTO_CURVE_Z85], sec[PROTO_CURVE_Z85];
  int rc = curve_slurp(path, &text);
  if (rc) return rc;
  rc = proto_curve_parse(path, text, strlen(text), pub, sec);
  free(text);
  if (rc) return rc;
  if (!sec[0]) return fr_errorf(FR_EFORMAT, "%s: no secret-key line (a .pub file is not a key pair)", path);
  if ((rc = proto_curve_from_secret(kp, sec))) return rc;
  if (pub[0] && strcmp(pub, kp->pub)) return fr_errorf(FR_EFORMAT, "%s: the public key does not match the secret key", path);
  return 0;
}

int proto_curve_find(proto_curve_pair_t *kp, const char *path, bool *found) {
  *found = false;
  const char *env = getenv(PROTO_CURVE_ENV);
  int rc = 0;
  if (path) rc = proto_curve_load(kp, path);
  else if (env && *env) rc = proto_curve_from_secret(kp, env);
  else return 0;
  if (rc && !path) return fr_errorf(rc, "%s: %s", PROTO_CURVE_ENV, fr_last_error());
  *found = rc == 0;
  return rc;
}

/* Writes text to path with mode, refusing an existing file. */
static int curve_write_file(const char *path, const char *text, mode_t mode) {
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) return fr_errorf(-errno, "%s: %s", path, strerror(errno));
  size_t n = strlen(text);
  ssize_t w = write(fd, text, n);
  int e = errno;
  if (close(fd) != 0 && w == (ssize_t)n) w = -1, e = errno;
  if (w != (ssize_t)n) {
    unlink(path);
    return fr_errorf(-e, "%s: %s", path, strerror(e));
  }
  return 0;
}

int proto_curve_write(const proto_curve_pair_t *kp, const char *prefix) {
  char path[4096], text[512];
  snprintf(path, sizeof path, "%s.key", prefix);
  snprintf(text, sizeof text,
           "# ferrum CURVE key pair (ferrumctl keygen): do not share this file\npublic-key = \"%s\"\nsecret-key = \"%s\"\n",
           kp->pub, kp->sec);
  int rc = curve_write_file(path, text, 0600);
  if (rc) return rc;
  snprintf(path, sizeof path, "%s.pub", prefix);
  snprintf(text, sizeof text, "# ferrum CURVE public key (ferrumctl keygen)\npublic-key = \"%s\"\n", kp->pub);
  rc = curve_write_file(path, text, 0644);
  if (rc) {
    snprintf(path, sizeof path, "%s.key", prefix);
    unlink(path);
  }
  return rc;
}

int proto_curve_public(char out[PROTO_CURVE_Z85], const char *key_or_file) {
  uint8_t raw[32];
  if (!key_or_file) return fr_errorf(-EINVAL, "no server key");
  if (strlen(key_or_file) == 40 && zmq_z85_decode(raw, key_or_file)) {
    memcpy(out, key_or_file, PROTO_CURVE_Z85);
    return 0;
  }
  char *text, sec[PROTO_CURVE_Z85];
  int rc = curve_slurp(key_or_file, &text);
  if (rc) return fr_errorf(rc, "server key '%s': neither a key (40 characters of Z85) nor a readable file", key_or_file);
  rc = proto_curve_parse(key_or_file, text, strlen(text), out, sec);
  free(text);
  if (rc) return rc;
  if (!out[0] && sec[0]) {
    proto_curve_pair_t kp;
    if ((rc = proto_curve_from_secret(&kp, sec))) return rc;
    memcpy(out, kp.pub, PROTO_CURVE_Z85);
  }
  if (!out[0]) return fr_errorf(FR_EFORMAT, "%s: no public key in it", key_or_file);
  return 0;
}

int proto_curve_read_list(const char *path, uint8_t **keys, int *n_keys) {
  *keys = NULL;
  *n_keys = 0;
  char *text;
  int rc = curve_slurp(path, &text);
  if (rc) return rc;
  rc = proto_curve_parse_list(path, text, strlen(text), keys, n_keys);
  free(text);
  return rc;
}

int proto_curve_parse_list(const char *name, const char *text_in, size_t len, uint8_t **keys, int *n_keys) {
  *keys = NULL;
  *n_keys = 0;
  if (len > CURVE_FILE_MAX) return fr_errorf(FR_ETOOBIG, "%s: too large for a key list", name);
  char *text = curve_copy(text_in, len);
  int rc = 0, lineno = 0, n = 0;
  uint8_t *k = fr_malloc(32 * (CURVE_FILE_MAX / 41 + 1));
  const char *field;
  char *value;
  for (char *cur = text; curve_next(&cur, &lineno, &field, &value);) {
    if ((*field && strcmp(field, "public-key")) || proto_curve_decode(k + 32 * n, value)) {
      rc = fr_errorf(FR_EFORMAT, "%s: line %d: expected a public key (40 characters of Z85)", name, lineno);
      break;
    }
    n++;
  }
  free(text);
  if (rc) {
    free(k);
    return rc;
  }
  *keys = k;
  *n_keys = n;
  return 0;
}

static int curve_opt(void *sock, int opt, const void *v, size_t n, const char *what) {
  if (zmq_setsockopt(sock, opt, v, n) != 0) return fr_errorf(FR_EZMQ, "CURVE %s: %s", what, zmq_strerror(errno));
  return 0;
}

int proto_curve_server(void *sock, const proto_curve_pair_t *kp) {
  int one = 1, rc = curve_need();
  if (!rc) rc = curve_opt(sock, ZMQ_CURVE_SERVER, &one, sizeof one, "server");
  if (!rc) rc = curve_opt(sock, ZMQ_CURVE_SECRETKEY, kp->sec, 40, "secret key");
  if (!rc) rc = curve_opt(sock, ZMQ_ZAP_DOMAIN, PROTO_CURVE_ZAP_DOMAIN, strlen(PROTO_CURVE_ZAP_DOMAIN), "ZAP domain");
  return rc;
}

int proto_curve_client(void *sock, const proto_curve_pair_t *kp, const char *server_pub) {
  uint8_t raw[32];
  int rc = curve_need();
  if (!rc) rc = proto_curve_decode(raw, server_pub);
  if (!rc) rc = curve_opt(sock, ZMQ_CURVE_SERVERKEY, server_pub, 40, "server key");
  if (!rc) rc = curve_opt(sock, ZMQ_CURVE_PUBLICKEY, kp->pub, 40, "public key");
  if (!rc) rc = curve_opt(sock, ZMQ_CURVE_SECRETKEY, kp->sec, 40, "secret key");
  return rc;
}

bool proto_endpoint_tcp(const char *endpoint) { return endpoint && !strncmp(endpoint, "tcp://", 6); }

bool proto_endpoint_loopback(const char *endpoint) {
  if (!proto_endpoint_tcp(endpoint)) return false;
  const char *host = endpoint + 6;
  if (!strncmp(host, "[::1]:", 6) || !strncmp(host, "localhost:", 10)) return true;
  /* 127.a.b.c: digits and dots up to the port */
  if (strncmp(host, "127.", 4)) return false;
  const char *p = host + 4;
  while (isdigit((unsigned char)*p) || *p == '.') p++;
  return *p == ':';
}
