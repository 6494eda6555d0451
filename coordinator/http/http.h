/* http.h - the OpenAI-compatible HTTP frontend (libmicrohttpd): the routes
 * /v1/completions, /v1/chat/completions (JSON or SSE streams), /v1/models,
 * /health, /metrics (Prometheus text from coordinator/metrics.h), and
 * vLLM's /tokenize and /detokenize (answered in the frontend's loop with
 * the borrowed tokenizer).
 *
 * How it reaches the scheduler: the frontend opens one ZMQ_DEALER socket
 * on the coordinator's zmq context, connects it to cfg->rpc_endpoint (an
 * inproc:// ROUTER of the coordinator loop) and speaks proto/proto.h there,
 * exactly as an RPC client does: one frame per message (an empty delimiter
 * frame, if the ROUTER sends one, is skipped); each request is a "submit"
 * with a job id unique within this frontend, then "event"s for that id
 * until finish != NONE, or one "error" {c: PROTO_ERR_*, id} that maps 1:1
 * to the HTTP status. A client that disconnects makes the frontend send
 * "cancel" {id} at once. While nothing comes for a request for a keep-alive
 * period, the frontend sends a "heartbeat" (the loop answers it) and an SSE
 * stream gets a comment line, so no client, proxy or idle timeout cuts a
 * request that waits (queued, a worker restarting); a stream that waits for
 * its first event that long starts (200) without it, and a later error
 * comes as an error chunk. A coordinator silent for engine_timeout_ms ends
 * the request with an error. Every stream ends with [DONE] unless its
 * client left: after the last event, or after an error chunk when it ends
 * early.
 *
 * Threads: coord_http_start starts one thread, the frontend's event loop:
 * libmicrohttpd runs in it (epoll, no thread of its own) beside the DEALER,
 * and a request that waits for the coordinator has its connection
 * suspended, so idle and waiting connections cost a descriptor and a
 * little memory each, not a thread. The coord_http_* calls below may be
 * made from any one thread (the coordinator loop). Ownership: cfg strings
 * are copied; the zmq context, the metrics registry and the tokenizer are
 * borrowed and must outlive coord_http_stop(), which joins the loop thread
 * and closes the sockets (so call it before zmq_ctx_term).
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
  unsigned max_connections;     /* 0 = 4096; fewer when RLIMIT_NOFILE leaves less room
                                   (coord_http_start raises its soft limit to the hard one) */
  unsigned max_connections_per_ip; /* connections one client address may hold (loopback too;
                                      more are closed at once); 0 = half of
                                      max_connections, at least 128 (2048 of 4096) */
  unsigned timeout_s;           /* idle connection timeout (a client that reads or sends
                                   nothing this long, not a request that waits for its
                                   answer); 0 = 30 */
  unsigned request_timeout_s;   /* a request's headers and body must arrive within this,
                                   however steadily they trickle in (on a kept-alive
                                   connection: timeout_s more); else the connection is
                                   closed unanswered; 0 = 30 */
  unsigned keepalive_ms;        /* an SSE stream that waits (queued, or between tokens) gets
                                   a comment line ": keep-alive" this often; 0 = 5000 */
  unsigned engine_timeout_ms;   /* a waiting request whose coordinator answers nothing (no
                                   event, no reply to the heartbeat sent each keep-alive
                                   period) this long ends with an error; 0 = 30000; at
                                   least twice keepalive_ms */
  coord_metrics_t *metrics;     /* borrowed; NULL = /metrics answers 404 */
  const struct model_tokenizer *tokenizer; /* borrowed, optional: token strings in logprobs
                                              (without it they read "token_id:N") */
  const char *tool_call_parser; /* vLLM's --tool-call-parser: hermes, llama3_json, mistral; NULL = none
                                   (coord_http_start fails with -EINVAL for another name) */
  bool enable_auto_tool_choice; /* vLLM's --enable-auto-tool-choice: tool_choice "auto" (the default
                                   with tools) parses the output for calls; without it such a request
                                   is a 400 naming the flag, as in vLLM */
  const char *reasoning_parser; /* vLLM's --reasoning-parser: qwen3, deepseek_r1; NULL = none (chat
                                   answers split the think block into reasoning_content; -EINVAL for
                                   another name) */
} coord_http_config_t;

/* Starts listening, and raises the process's RLIMIT_NOFILE soft limit to
 * its hard limit (each connection is a descriptor). Returns 0 and *out, or
 * a negative error (bind failed: -EADDRINUSE, ...) with nothing left
 * running. The frontend starts "not ready": /health answers 503 and jobs
 * are refused until coord_http_set_ready. */
int coord_http_start(coord_http_t **out, const coord_http_config_t *cfg);

/* The port it listens on (the real one when cfg->port was 0). */
int coord_http_port(const coord_http_t *h);

/* Marks the workers ready (true: /health 200, jobs accepted) or not
 * (/health 503; jobs are refused with 503 only until the workers have been
 * ready once: while a worker restarts they wait in the queue). */
void coord_http_set_ready(coord_http_t *h, bool ready);

/* Draining: new jobs get 503, running streams finish. Not reversible. */
void coord_http_set_draining(coord_http_t *h);

/* Stops: first every answer in progress gets what the coordinator queued
 * for it (a stream its last chunks and [DONE]); one whose job has not
 * finished ends with an error (a stream: an error chunk, then [DONE]);
 * once they are sent, or after 5 s, it stops listening, closes the
 * connections, joins the loop thread and frees h. Call it once the
 * coordinator loop sends nothing more (after coord_run). NULL is fine. */
void coord_http_stop(coord_http_t *h);

#ifdef __cplusplus
}
#endif
