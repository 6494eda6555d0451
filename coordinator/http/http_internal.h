/* http_internal.h - pieces of the HTTP frontend shared by its files (not a
 * public interface): the parsed request, OpenAI error values, response
 * builders and the per-request RPC connection.
 *
 * Threads: everything here is used by one handler thread at a time.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdint.h>

#include <jansson.h>
#include <pthread.h>

#include "proto/proto.h"

#ifdef __cplusplus
extern "C" {
#endif

struct model_tokenizer;

#define COORD_HTTP_MAX_BODY (4u << 20) /* request bodies larger get 413 */

typedef enum { COORD_HTTP_API_COMPLETIONS = 0, COORD_HTTP_API_CHAT } coord_http_api_t;

/* An error answer: HTTP status and OpenAI's {"error": {...}} fields. */
typedef struct {
  int status;        /* 400, 401, 404, 413, 429, 500, 503 */
  const char *param; /* offending field or NULL; static */
  const char *code;  /* OpenAI code string or NULL; static */
  char message[512];
} coord_http_err_t;

/* Fills e and returns -1 (so `return coord_http_err(e, ...)` reads well). */
int coord_http_err(coord_http_err_t *e, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* A parsed, validated request body. sub's pointers point into root (the
 * parsed JSON) or into arrays owned here; valid until coord_http_req_free. */
typedef struct {
  coord_http_api_t api;
  json_t *root;
  proto_submit_t sub;   /* id left 0: the caller assigns it */
  const char *model;    /* as requested, or NULL */
  bool stream;
  bool include_usage;   /* stream_options.include_usage */
  int logprobs;         /* -1 none; else alternatives per token (0..PROTO_MAX_TOPN) */
  bool echo;            /* completions: prompt text in front of the answer */
  /* owned arrays behind sub */
  char **stop;
  int32_t *tokens, *stop_ids;
  proto_chat_msg_t *messages;
} coord_http_req_t;

/* Parses and validates a request body for api against the OpenAI / vLLM
 * rules (types, ranges, n == 1, stream_options only with stream, ...).
 * served_model / max_model_len: model names other than served_model give
 * 404; a token prompt of max_model_len tokens or more gives 400. Returns 0,
 * or -1 with e filled (r freed). Never crashes on any bytes. */
int coord_http_req_parse(coord_http_req_t *r, coord_http_api_t api, const char *body, size_t len,
                         const char *served_model, uint32_t max_model_len, coord_http_err_t *e);
void coord_http_req_free(coord_http_req_t *r);

/* ---- responses (http_resp.c); each returns a malloc'd JSON string or NULL
 * on out of memory ---- */

/* {"error": {"message", "type", "param", "code"}} */
char *coord_http_error_json(const coord_http_err_t *e);

/* What a job produced so far (the events folded together). */
typedef struct {
  char *text;
  size_t text_len, text_cap;
  json_t *logprobs;      /* API-shaped logprobs object being built, or NULL */
  size_t text_offset;    /* completions logprobs text_offset of the next token */
  proto_finish_t finish;
  bool has_usage;
  proto_usage_t usage;
  uint32_t n_tokens;     /* completion tokens seen */
} coord_http_acc_t;

/* Response identity shared by all chunks of one answer. */
typedef struct {
  coord_http_api_t api;
  char id[48];          /* "cmpl-<hex>" / "chatcmpl-<hex>" */
  long long created;    /* unix seconds */
  const char *model;
  int logprobs;         /* -1 none */
  bool include_usage;
  const struct model_tokenizer *tok; /* optional, for token strings */
} coord_http_meta_t;

void coord_http_acc_init(coord_http_acc_t *a);
void coord_http_acc_free(coord_http_acc_t *a);
/* Folds one event into a; returns 0 or -ENOMEM. */
int coord_http_acc_add(coord_http_acc_t *a, const coord_http_meta_t *m, const proto_event_t *ev);

/* The full non-streamed answer (text_completion / chat.completion). */
char *coord_http_final_json(const coord_http_meta_t *m, const coord_http_acc_t *a);
/* One SSE chunk for an event ("data: {...}\n\n", possibly several: the
 * first chat chunk with the role, the usage chunk), appended to out as a
 * malloc'd string. first: this is the job's first event. */
char *coord_http_chunk_sse(const coord_http_meta_t *m, const proto_event_t *ev, bool first);
/* data: {"error": ...}\n\n for a stream that fails after it started. */
char *coord_http_error_sse(const coord_http_err_t *e);
/* {"object": "list", "data": [{"id", "object": "model", ...}]} */
char *coord_http_models_json(const char *name, uint32_t max_model_len, long long created);

/* Maps a PROTO_ERR_* code (and message) from the coordinator to e. */
void coord_http_err_from_proto(coord_http_err_t *e, int32_t code, const char *message);

/* ---- the server (http.c) and its job handlers (http_job.c) ---- */

struct MHD_Connection;
struct MHD_Response;
typedef struct coord_metrics coord_metrics_t;

/* One open connection (http_conn.c), from MHD's "started" notification to
 * its "closed" one, which comes before MHD closes the socket; MHD's
 * socket_context points at it. Fields under coord_http.conn_mu. */
typedef struct coord_http_conn {
  struct coord_http_conn *prev, *next;
  int fd;               /* the client's socket (MHD's; only shut down here) */
  bool receiving;       /* a request (or the next one) is being received */
  bool expired;         /* shut down for missing its deadline */
  uint64_t deadline_ns; /* fr_now_ns() by which the request must be in */
} coord_http_conn_t;

struct coord_http {
  struct MHD_Daemon *daemon;
  void *zmq_ctx;
  char *rpc_endpoint, *api_key, *model;
  uint32_t max_model_len;
  coord_metrics_t *metrics;
  const struct model_tokenizer *tok;
  int port;
  unsigned timeout_s;          /* MHD's idle timeout, restored after each wait (coord_http__conn_touch) */
  uint64_t keepalive_ns;       /* a waiting request's heartbeat (and SSE comment) period */
  uint64_t engine_timeout_ns;  /* a coordinator silent this long ends the request */
  /* stopping: coord_http_stop began; handlers take what the coordinator
   * queued and end (it sends nothing more) */
  _Atomic int ready, draining, stopping;
  _Atomic uint64_t next_job; /* job ids; starts at a random value */
  long long started;         /* unix seconds, for /v1/models */
  /* connections and their deadline (http_conn.c) */
  uint64_t request_timeout_ns; /* a request's headers and body must arrive within this */
  uint64_t idle_timeout_ns;    /* MHD's idle timeout: a kept-alive connection's wait first */
  pthread_mutex_t conn_mu;
  pthread_cond_t conn_cv;      /* wakes the watchdog to stop */
  pthread_t watchdog;
  bool conn_init, watchdog_running, watchdog_stop;
  coord_http_conn_t *conns;    /* the open connections, under conn_mu */
};

/* Queues a response with status (counted in the metrics) and destroys it.
 * Returns MHD's result as an int. */
int coord_http__queue(struct coord_http *h, struct MHD_Connection *c, int status, struct MHD_Response *r);
/* Queues OpenAI's error body for e. */
int coord_http__send_error(struct coord_http *h, struct MHD_Connection *c, const coord_http_err_t *e);
/* Runs a /v1/completions or /v1/chat/completions request whose body is
 * complete: validates, submits, answers (JSON, or an SSE stream). http11:
 * the request is HTTP/1.1 (an interim 1xx answer may be sent). */
int coord_http__job(struct coord_http *h, struct MHD_Connection *c, coord_http_api_t api, const char *body, size_t len,
                    bool http11);

/* ---- connections (http_conn.c) ----
 *
 * libmicrohttpd's connection timeout is an idle timeout, reset by every
 * byte, so a client that sends a byte every few seconds would hold a
 * connection (and its thread) forever. Each connection gets a deadline for
 * its request as well: from its start, a request's headers and body must
 * be in within request_timeout_ns; from the end of each answer, the next
 * one's within idle_timeout_ns + request_timeout_ns (a kept-alive
 * connection may first wait, as long as the idle timeout lets it). No
 * deadline runs while a request is answered. A watchdog thread shuts down
 * (shutdown(2), not close: MHD owns the descriptor) the sockets that miss
 * theirs; MHD then reads the end of the stream and closes the connection.
 * Nothing is answered: a 408 written on a connection the client may be
 * reusing could be taken as the answer to its next request (nginx closes
 * silently too). libmicrohttpd 0.9.75 offers no hook for this: the access
 * handler first runs once all headers are in, and no option bounds a
 * request's total time. */

/* Sets up the table and starts the watchdog. Returns 0 or -errno. */
int coord_http__conns_start(struct coord_http *h, unsigned request_timeout_s, unsigned idle_timeout_s);
/* Stops the watchdog (before MHD_stop_daemon). */
void coord_http__watchdog_stop(struct coord_http *h);
/* Frees the table (after MHD_stop_daemon closed every connection). */
void coord_http__conns_free(struct coord_http *h);
#ifdef MHD_VERSION /* in files that include <microhttpd.h> */
/* MHD_OPTION_NOTIFY_CONNECTION's callback (cls: the coord_http). */
void coord_http__conn_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                             enum MHD_ConnectionNotificationCode toe);
#endif
/* The request on c is in (or answered before its body): its clock stops. */
void coord_http__conn_received(struct coord_http *h, struct MHD_Connection *c);
/* The answer on c is done: the clock starts for the next request. */
void coord_http__conn_rearm(struct coord_http *h, struct MHD_Connection *c);
/* Restarts MHD's idle timer of c, from c's own thread, after a wait for the
 * coordinator: MHD checks its idle timeout after the content reader
 * returns, so a reader that waited longer than the timeout would have its
 * connection closed before its bytes go out. */
void coord_http__conn_touch(struct coord_http *h, struct MHD_Connection *c);
/* Waits until no connection is answering a request (each answer sent in
 * full, or its connection gone), at most timeout_ms. Returns true when none
 * is. */
bool coord_http__conns_idle_wait(struct coord_http *h, unsigned timeout_ms);

/* ---- the RPC connection of one request (http_rpc.c) ---- */

typedef struct {
  void *sock;        /* ZMQ_DEALER */
  int client_fd;     /* the HTTP client's socket, watched for hang-ups; -1 = none */
  uint64_t job;      /* submitted job id, 0 = none */
  bool finished;     /* the job's last event (or error) was received */
  bool client_eof;   /* the client's end of stream was reported (COORD_HTTP_RPC_EOF) */
  uint64_t last_rx_ns; /* fr_now_ns() when the coordinator last sent anything (or the open) */
  uint64_t beats;    /* heartbeats sent */
  proto_buf_t buf;
  proto_msg_t msg;
} coord_http_rpc_t;

/* Opens a DEALER on ctx connected to endpoint. Returns 0 or FR_EZMQ. */
int coord_http_rpc_open(coord_http_rpc_t *c, void *ctx, const char *endpoint, int client_fd);
/* Sends the submit (its id must be set). Returns 0 or a negative error. */
int coord_http_rpc_submit(coord_http_rpc_t *c, const proto_submit_t *s);
#define COORD_HTTP_RPC_EOF 2

/* Waits up to timeout_ms for the job's next message. Returns 1 with *msg
 * (an "event" or "error"; valid until the next call), 0 on timeout, -EPIPE
 * when the HTTP client's socket is reset or failed (the job is canceled
 * then), COORD_HTTP_RPC_EOF once when the client has sent its end of
 * stream, or another negative error.
 *
 * An end of stream alone cannot tell a client that half-closed after its
 * request (shutdown(SHUT_WR); it still reads the answer) from one that
 * closed and left: both send FIN. Only a write tells them apart (a closed
 * socket answers it with a reset, seen here as -EPIPE on a later call), so
 * the caller writes something harmless then, or cancels. */
int coord_http_rpc_next(coord_http_rpc_t *c, int timeout_ms, const proto_msg_t **msg);
/* Sends a "heartbeat"; the coordinator's answer (skipped by
 * coord_http_rpc_next) refreshes last_rx_ns. Returns 0 or FR_EZMQ. */
int coord_http_rpc_ping(coord_http_rpc_t *c);
/* Sends "cancel" for the job unless it finished. */
void coord_http_rpc_cancel(coord_http_rpc_t *c);
/* Cancels an unfinished job and closes the socket. */
void coord_http_rpc_close(coord_http_rpc_t *c);
/* What the peer of a socket did, seen without reading it. */
typedef enum {
  COORD_HTTP_PEER_OPEN = 0, /* nothing (or only data) */
  COORD_HTTP_PEER_EOF,      /* it sent FIN: a half-close, or a close */
  COORD_HTTP_PEER_GONE,     /* reset, or the socket failed */
} coord_http_peer_t;
coord_http_peer_t coord_http_peer(int fd);

#ifdef __cplusplus
}
#endif
