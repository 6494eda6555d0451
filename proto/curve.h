/* curve.h - CURVE keys (ZeroMQ's CurveZMQ: encryption and authentication of
 * tcp:// connections, through libsodium in Debian's libzmq) for the RPC
 * socket, the workers' socket and their clients.
 *
 * Keys are Z85 text, 40 characters for 32 bytes. A key pair file (written
 * by `ferrumctl keygen --out PREFIX` as PREFIX.key, mode 0600) holds
 *     public-key = "…"
 *     secret-key = "…"
 * and PREFIX.pub the public line alone; a line starting with '#' is a
 * comment unless it is a bare key ('#' is also a Z85 digit: comments never
 * follow a key on its line), quotes are optional. Instead of a file, the environment variable
 * FERRUM_CURVE_SECRET_KEY may hold a secret key (its public key is derived).
 * A list of public keys (who may connect) is a file of such public-key
 * lines or bare keys, one per line, so `cat a.pub b.pub > clients` makes
 * one.
 *
 * Who uses what: a server socket gets its key pair and the ZAP domain
 * "ferrum" (the coordinator answers ZAP requests with its list, see
 * coordinator/auth.c); a client socket gets its own key pair and the
 * server's public key.
 *
 * Threads: no state; every function is safe to call from any thread.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PROTO_CURVE_Z85 41 /* a Z85 key and its NUL */
#define PROTO_CURVE_ENV "FERRUM_CURVE_SECRET_KEY"
#define PROTO_CURVE_SERVER_ENV "FERRUM_SERVER_KEY"
#define PROTO_CURVE_ZAP_DOMAIN "ferrum"

typedef struct {
  char pub[PROTO_CURVE_Z85]; /* Z85 public key */
  char sec[PROTO_CURVE_Z85]; /* Z85 secret key */
} proto_curve_pair_t;

/* Whether libzmq was built with CURVE (false: the functions below that
 * touch sockets fail with FR_EUNSUPPORTED). */
bool proto_curve_available(void);

/* A fresh key pair. Returns 0 or FR_EUNSUPPORTED. */
int proto_curve_generate(proto_curve_pair_t *kp);

/* The key pair of a Z85 secret key (its public key derived). Returns 0 or
 * FR_EFORMAT (not a 40-character Z85 key). */
int proto_curve_from_secret(proto_curve_pair_t *kp, const char *secret);

/* Reads a key pair file; the public key, when the file has one, must match
 * the secret. Returns 0, -errno (cannot read) or FR_EFORMAT, with the path
 * in the message. */
int proto_curve_load(proto_curve_pair_t *kp, const char *path);

/* This process's key pair: the file at path, else FERRUM_CURVE_SECRET_KEY,
 * else none (*found false, returns 0). Errors as proto_curve_load. */
int proto_curve_find(proto_curve_pair_t *kp, const char *path, bool *found);

/* Writes PREFIX.key (the pair, mode 0600, refused if it exists) and
 * PREFIX.pub (the public key, 0644). Returns 0 or -errno. */
int proto_curve_write(const proto_curve_pair_t *kp, const char *prefix);

/* A public key given as Z85 text or as a file holding one (a .pub file or
 * a key pair file), into out. Returns 0, -errno or FR_EFORMAT. */
int proto_curve_public(char out[PROTO_CURVE_Z85], const char *key_or_file);

/* Reads a list of public keys into *keys (n_keys * 32 bytes, malloc'd, the
 * caller frees). An empty list is allowed. Returns 0, -errno or
 * FR_EFORMAT naming the line. */
int proto_curve_read_list(const char *path, uint8_t **keys, int *n_keys);

/* The parsers under the file readers, on text in memory (name for the
 * messages; a NUL ends the text): the public and secret keys a key file
 * names (either may come back ""), and a list of public keys (as
 * proto_curve_read_list). Returns 0, FR_EFORMAT or FR_ETOOBIG (over 64 KiB). */
int proto_curve_parse(const char *name, const char *text, size_t len, char pub[PROTO_CURVE_Z85],
                      char sec[PROTO_CURVE_Z85]);
int proto_curve_parse_list(const char *name, const char *text, size_t len, uint8_t **keys, int *n_keys);

/* The 32 bytes of a Z85 key. Returns 0 or FR_EFORMAT. */
int proto_curve_decode(uint8_t out[32], const char *z85);

/* Makes sock a CURVE server with the pair (ZAP domain "ferrum"); before
 * its bind. Returns 0 or FR_EZMQ / FR_EUNSUPPORTED. */
int proto_curve_server(void *sock, const proto_curve_pair_t *kp);

/* Makes sock a CURVE client of the server with public key server_pub,
 * authenticating with kp; before its connect. Returns 0 or FR_EZMQ /
 * FR_EUNSUPPORTED. */
int proto_curve_client(void *sock, const proto_curve_pair_t *kp, const char *server_pub);

/* Whether an endpoint is tcp://, and whether it names only this host
 * (127.0.0.0/8, ::1, localhost): such a socket needs no CURVE, as ipc://
 * needs none. */
bool proto_endpoint_tcp(const char *endpoint);
bool proto_endpoint_loopback(const char *endpoint);

#ifdef __cplusplus
}
#endif
