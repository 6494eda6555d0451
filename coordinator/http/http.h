/* http.h - the OpenAI-compatible HTTP frontend (libmicrohttpd): the routes
 * /v1/completions, /v1/chat/completions (JSON or SSE streams), /v1/models,
 * /health and /metrics (Prometheus text from coordinator/metrics.h).
 *
 * How it reaches the scheduler: each request's handler thread opens its own
 * ZMQ_DEALER socket on the coordinator's zmq context, connects it to
 * cfg->rpc_endpoint (an inproc:// ROUTER of the coordinator loop) and
 * speaks proto/proto.h there, exactly as an RPC client does: one frame per
 * message (an empty delimiter frame, if the ROUTER sends one, is skipped);
 * "submit" with a job id unique within this frontend, then "event"s for
 * that id until finish != NONE, or one "error" {c: PROTO_ERR_*, id} that
 * maps 1:1 to the HTTP status. A client that disconnects makes the handler
 * send "cancel" {id} at once.
 *
 * Threads: coord_http_start spawns libmicrohttpd's threads (one per
 * connection, bounded); the coord_http_* calls below may be made from any
 * one thread (the coordinator loop). Ownership: cfg strings are copied; the
 * zmq context, the metrics registry and the tokenizer are borrowed and must
 * outlive coord_http_stop(), which joins every handler thread and closes
 * their sockets (so call it before zmq_ctx_term).
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct coord_http coord_http_t;
typedef struct coord_metrics coord_metrics_t; /* coordinator/metrics.h */
struct model_tokenizer;                       /* model/tokenizer.h */

typedef struct {
  void *zmq_ctx;                /* borrowed: the coordinator's zmq context */
  const char *rpc_endpoint;     /* "inproc://ferrum-rpc": the coordinator's ROUTER */
  const char *host;             /* bind address; NULL = "127.0.0.1" */
  int port;                     /* 0 = any free port (coord_http_port tells) */
  const char *api_key;          /* NULL or "" = no auth; else "Authorization: Bearer KEY" */
  const char *served_model_name;/* the name /v1/models lists and requests must use */
  uint32_t max_model_len;       /* context length; token prompts longer are a 400 */
  unsigned max_connections;     /* 0 = 256 */
  unsigned timeout_s;           /* idle connection timeout; 0 = 30 */
  unsigned request_timeout_s;   /* a request's headers and body must arrive within this,
                                   however steadily they trickle in (on a kept-alive
                                   connection: timeout_s more); else the connection is
                                   closed unanswered; 0 = 30 */
  coord_metrics_t *metrics;     /* borrowed; NULL = /metrics answers 404 */
  const struct model_tokenizer *tokenizer; /* borrowed, optional: token strings in logprobs
                                              (without it they read "token_id:N") */
} coord_http_config_t;

/* Starts listening. Returns 0 and *out, or a negative error (bind failed:
 * -EADDRINUSE, ...) with nothing left running. The frontend starts "not
 * ready": /health answers 503 and jobs are refused until coord_http_set_ready. */
int coord_http_start(coord_http_t **out, const coord_http_config_t *cfg);

/* The port it listens on (the real one when cfg->port was 0). */
int coord_http_port(const coord_http_t *h);

/* Marks the workers ready (true: /health 200, jobs accepted) or not. */
void coord_http_set_ready(coord_http_t *h, bool ready);

/* Draining: new jobs get 503, running streams finish. Not reversible. */
void coord_http_set_draining(coord_http_t *h);

/* Stops listening, cancels the jobs of open connections, joins the
 * threads and frees h. NULL is fine. */
void coord_http_stop(coord_http_t *h);

#ifdef __cplusplus
}
#endif
