/* fr_client.h - C client library for ferrum's RPC protocol: submit jobs to
 * a coordinator, stream their events, cancel them, ask for status and the
 * model list. Messages are the msgpack schemas of proto.h
 * (docs/PROTOCOL.md); the transport is a ZeroMQ DEALER socket connected to
 * the coordinator's ROUTER, one frame per message.
 *
 *   fr_client_t *c;
 *   fr_client_connect(&c, "tcp://127.0.0.1:5555");
 *   proto_submit_t req = {.prompt = "Hello", .sp = proto_sampling_default(),
 *                         .max_tokens = 32, .stream = true};
 *   uint64_t id;
 *   fr_client_submit(c, &req, &id);
 *   proto_event_t ev;
 *   while (fr_client_next_event(c, 5000, &ev) == 0) {
 *     fwrite(ev.text, 1, ev.text_len, stdout);
 *     if (ev.finish) break;
 *   }
 *   fr_client_close(c);
 *
 * Errors: 0 or a negative FR_E* code with fr_last_error() set; ZeroMQ
 * failures are FR_EZMQ with zmq_strerror() in the message, a reply that
 * does not come is FR_ETIMEOUT, a coordinator that went away while jobs
 * were running is FR_EDEAD, a server that refused the connection's CURVE
 * handshake is FR_EAUTH.
 *
 * Threads: a client is used by one thread at a time.
 * Ownership: what the library hands out (event texts and arrays, status
 * and model strings) lives in the client and stays valid until the next
 * call on it.
 */
#pragma once

#include <stdint.h>

#include "proto/proto.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fr_client fr_client_t;

/* Connects to a coordinator at endpoint ("ipc:///tmp/ferrum.sock",
 * "tcp://127.0.0.1:5555"). ZeroMQ connects in the background: this
 * succeeds before the coordinator is up, and messages wait for it. */
int fr_client_connect(fr_client_t **out, const char *endpoint);

/* CURVE keys of a client (Z85 text, 40 characters each; proto/curve.h
 * reads them from files): the server's public key, this client's key pair
 * (public_key may be NULL: derived from secret_key). */
typedef struct {
  const char *server_key;
  const char *public_key;
  const char *secret_key;
} fr_client_keys_t;

/* Connects with CURVE to a server whose tcp:// socket requires it. A
 * server that refuses the key, or a handshake that fails, makes the calls
 * that wait for the coordinator return FR_EAUTH. */
int fr_client_connect_curve(fr_client_t **out, const char *endpoint, const fr_client_keys_t *keys);

/* The same over a ZeroMQ context the caller owns (zmq_ctx, borrowed; it
 * must outlive the client), for inproc:// endpoints in one process. */
int fr_client_connect_ctx(fr_client_t **out, void *zmq_ctx, const char *endpoint);

/* Closes the socket (pending messages are dropped) and frees the client. */
void fr_client_close(fr_client_t *c);

/* Timeout of calls that wait for a reply (status, list models); default
 * 5000 ms; < 0 waits forever. */
void fr_client_set_timeout(fr_client_t *c, int timeout_ms);

/* Sends a job. req->id 0 asks the library to pick a job id (unique in this
 * client); *job_id gets the id used. The request is checked first
 * (FR_EPROTO / FR_ETOOBIG, nothing sent). Its first event may be an error. */
int fr_client_submit(fr_client_t *c, const proto_submit_t *req, uint64_t *job_id);

/* Waits up to timeout_ms (< 0: forever, 0: poll) for the next event of any
 * job and fills *ev (borrowed until the next call on c). A job's last event
 * has ev->finish != PROTO_FINISH_NONE. An error the coordinator sent about
 * a job arrives as an event with finish PROTO_FINISH_ERROR and ev->error;
 * one about no job (id 0) as an event with id 0. Returns FR_ETIMEOUT when
 * nothing came, FR_EDEAD when the connection to the coordinator dropped
 * while jobs were running (those jobs are forgotten). */
int fr_client_next_event(fr_client_t *c, int timeout_ms, proto_event_t *ev);

/* Asks the coordinator to cancel a job; its last event (finish "cancel",
 * or how it ended if it was faster) follows through next_event. */
int fr_client_cancel(fr_client_t *c, uint64_t job_id);

/* Asks for the coordinator's status (model NULL = the default model) and
 * waits for the reply; events that arrive meanwhile are kept for
 * next_event. *st is borrowed until the next call on c. */
int fr_client_status(fr_client_t *c, const char *model, proto_status_reply_t *st);

/* Lists the models the coordinator serves; *out borrowed as above. */
int fr_client_list_models(fr_client_t *c, proto_models_reply_t *out);

/* Jobs submitted whose last event has not arrived yet. */
int fr_client_active_jobs(const fr_client_t *c);

#ifdef __cplusplus
}
#endif
