/* auth.c - CURVE on the coordinator's tcp:// sockets and the ZAP handler
 * that says who may connect.
 *
 * With a key pair (--curve-key FILE or FERRUM_CURVE_SECRET_KEY) every
 * tcp:// socket the coordinator binds (RPC, workers) is a CURVE server, and
 * a client is let in only when its public key is in --curve-clients or is
 * the coordinator's own (workers it starts use the coordinator's pair).
 * ZeroMQ asks through ZAP (RFC 27): a REP socket on
 * inproc://zeromq.zap.01 in the coordinator's context, answered from the
 * loop. Without a key pair, a tcp:// endpoint that other hosts can reach is
 * refused at start; loopback tcp:// and ipc:// need none (ipc:// sockets
 * live in the 0700 runtime folder).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/fr_err.h"
#include "common/fr_log.h"
#include "common/fr_util.h"
#include "coordinator/coord_impl.h"

#define ZAP_ENDPOINT "inproc://zeromq.zap.01"
#define ZAP_FRAMES 7 /* version, request id, domain, address, identity, mechanism, credentials */

/* The error for an endpoint that other hosts reach with no key pair. */
static int coord__auth_refuse(const char *what, const char *endpoint) {
  return fr_errorf(FR_EAUTH,
                   "%s %s can be reached from other hosts: give it a CURVE key pair (--curve-key FILE from "
                   "`ferrumctl keygen`, or %s) and list the clients' public keys in --curve-clients FILE",
                   what, endpoint, PROTO_CURVE_ENV);
}

int coord__auth_init(coord_t *c) {
  bool found;
  int rc = proto_curve_find(&c->curve, c->cfg.curve_key_path, &found);
  if (rc) return rc;
  c->curve_on = found;
  if (!found) {
    if (c->cfg.curve_clients_path) return fr_errorf(-EINVAL, "--curve-clients needs a key pair (--curve-key)");
    if (proto_endpoint_tcp(c->rpc_addr) && !proto_endpoint_loopback(c->rpc_addr))
      return coord__auth_refuse("the RPC endpoint", c->rpc_addr);
    if (proto_endpoint_tcp(c->worker_addr) && !proto_endpoint_loopback(c->worker_addr))
      return coord__auth_refuse("the worker endpoint", c->worker_addr);
    return 0;
  }
  if (c->cfg.curve_clients_path && (rc = proto_curve_read_list(c->cfg.curve_clients_path, &c->allowed, &c->n_allowed)))
    return rc;
  c->zap = zmq_socket(c->zctx, ZMQ_REP);
  int zero = 0;
  if (!c->zap || zmq_setsockopt(c->zap, ZMQ_LINGER, &zero, sizeof zero) || zmq_bind(c->zap, ZAP_ENDPOINT))
    return fr_errorf(FR_EZMQ, "ZAP handler: %s", zmq_strerror(errno));
  FR_LOGI("CURVE on tcp:// sockets: server key %s, %d client key%s allowed besides it", c->curve.pub, c->n_allowed,
          c->n_allowed == 1 ? "" : "s");
  return 0;
}

int coord__auth_socket(coord_t *c, void *sock, const char *endpoint) {
  if (!c->curve_on || !proto_endpoint_tcp(endpoint)) return 0;
  return proto_curve_server(sock, &c->curve);
}

/* Whether a client's 32-byte public key may connect. */
static bool coord__auth_allowed(const coord_t *c, const uint8_t *key) {
  uint8_t own[32];
  if (proto_curve_decode(own, c->curve.pub) == 0 && !memcmp(own, key, 32)) return true;
  for (int i = 0; i < c->n_allowed; i++)
    if (!memcmp(c->allowed + 32 * (size_t)i, key, 32)) return true;
  return false;
}

/* Sends one ZAP reply (the request id echoed; a REP socket must answer
 * every request, also a malformed one). */
static void coord__zap_reply(coord_t *c, zmq_msg_t *req_id, const char *code, const char *text) {
  zmq_send(c->zap, "1.0", 3, ZMQ_SNDMORE);
  zmq_send(c->zap, req_id ? zmq_msg_data(req_id) : "", req_id ? zmq_msg_size(req_id) : 0, ZMQ_SNDMORE);
  zmq_send(c->zap, code, strlen(code), ZMQ_SNDMORE);
  zmq_send(c->zap, text, strlen(text), ZMQ_SNDMORE);
  zmq_send(c->zap, "", 0, ZMQ_SNDMORE); /* user id */
  zmq_send(c->zap, "", 0, 0);           /* metadata */
}

void coord__auth_on_request(coord_t *c) {
  for (;;) {
    zmq_msg_t f[ZAP_FRAMES + 1];
    int n = 0, more = 1;
    for (; more; n++) {
      zmq_msg_init(&f[FR_MIN(n, ZAP_FRAMES)]);
      if (zmq_msg_recv(&f[FR_MIN(n, ZAP_FRAMES)], c->zap, n ? 0 : ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&f[FR_MIN(n, ZAP_FRAMES)]);
        if (n == 0) return;
        break;
      }
      more = zmq_msg_more(&f[FR_MIN(n, ZAP_FRAMES)]);
      if (n >= ZAP_FRAMES) zmq_msg_close(&f[ZAP_FRAMES]); /* extra frames: dropped */
    }
    int kept = FR_MIN(n, ZAP_FRAMES);
    bool curve = kept == ZAP_FRAMES && zmq_msg_size(&f[5]) == 5 && !memcmp(zmq_msg_data(&f[5]), "CURVE", 5);
    bool ok = curve && zmq_msg_size(&f[6]) == 32 && coord__auth_allowed(c, zmq_msg_data(&f[6]));
    if (!ok) {
      char addr[64] = "?";
      if (kept >= 4) snprintf(addr, sizeof addr, "%.*s", (int)FR_MIN(zmq_msg_size(&f[3]), 63), (char *)zmq_msg_data(&f[3]));
      FR_LOGW("refused a %s connection from %s: %s", curve ? "CURVE" : "non-CURVE", addr,
              curve ? "its public key is not in --curve-clients" : "no CURVE");
    }
    coord__zap_reply(c, kept >= 2 ? &f[1] : NULL, ok ? "200" : "400", ok ? "OK" : "key not allowed");
    for (int i = 0; i < kept; i++) zmq_msg_close(&f[i]);
  }
}

void coord__auth_deinit(coord_t *c) {
  if (c->zap) zmq_close(c->zap);
  c->zap = NULL;
  free(c->allowed);
  c->allowed = NULL;
  c->n_allowed = 0;
}
