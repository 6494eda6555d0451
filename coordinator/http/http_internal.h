/* http_internal.h - pieces of the HTTP frontend shared by its files (not a
 * public interface): the parsed request, OpenAI error values, response
 * builders, the event loop, its connections, jobs and RPC connection.
 *
 * Threads: everything here runs on the frontend's one loop thread
 * (http_loop.c), except the request parsing and response builders, which
 * hold no state.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdint.h>

#include <jansson.h>
#include <pthread.h>

#include "coordinator/http/http_reason.h"
#include "coordinator/http/http_tools.h"
#include "proto/proto.h"

#ifdef __cplusplus
extern "C" {
#endif

struct model_tokenizer;
struct pollfd;

#define COORD_HTTP_MAX_BODY (4u << 20) /* request bodies larger get 413 */
#define COORD_HTTP_MAX_CONN 4096u      /* connections by default (within RLIMIT_NOFILE) */

typedef enum { COORD_HTTP_API_COMPLETIONS = 0, COORD_HTTP_API_CHAT, COORD_HTTP_API_EMBEDDINGS } coord_http_api_t;

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

#define COORD_HTTP_MAX_SEQS 256u /* sequences one request may ask for: prompts * best_of */

/* One prompt of a completions request: text or token ids (pointers into
 * the request's JSON or its arrays). A chat request has one, empty: its
 * messages are in sub. */
typedef struct {
  const char *text;
  uint32_t text_len;
  int32_t *ids;         /* owned by the request */
  uint32_t n_ids;
} coord_http_prompt_t;

/* A parsed, validated request body. sub's pointers point into root (the
 * parsed JSON) or into arrays owned here; valid until coord_http_req_free.
 * sub holds the first prompt; coord_http_req_prompt sets another. */
typedef struct {
  coord_http_api_t api;
  json_t *root;
  proto_submit_t sub;   /* id left 0: the caller assigns it */
  const char *model;    /* as requested, or NULL */
  bool stream;
  bool include_usage;   /* stream_options.include_usage */
  int logprobs;         /* -1 none; else alternatives per token (0..PROTO_MAX_TOPN) */
  bool echo;            /* completions: prompt text in front of the answer */
  bool base64;          /* embeddings: encoding_format "base64" */
  uint32_t dimensions;  /* embeddings: asked length (0: the model's); only the model's is served */
  int prompt_logprobs;  /* vLLM's prompt_logprobs: -1 none; else alternatives per prompt token */
  bool no_output;       /* completions max_tokens 0 with echo: one token is generated and dropped */
  uint32_t n;           /* choices per prompt */
  uint32_t best_of;     /* sequences per prompt (>= n): the n with the highest cumulative logprob are returned */
  uint32_t n_prompts;   /* >= 1 */
  coord_http_prompt_t *prompts; /* (n_prompts) owned */
  /* owned arrays behind sub */
  char **stop;
  int32_t *stop_ids;
  proto_chat_msg_t *messages;
  char **msg_json;           /* (n_msg_json) a message's JSON when it has more than role and string content */
  size_t n_msg_json;
  char *chat_vars;           /* JSON text behind sub.messages[0].vars */
  proto_bias_t *bias;
  coord_tool_choice_t tool_choice; /* chat: what tool_choice (and tools) ask */
  const char *tool_name;           /* COORD_TOOL_CHOICE_NAMED: the function (in root) */
  char *guide_spec;                /* owned: the text behind sub.guide */
  const char *guide_param;         /* the field the guide came from (static) */
  bool thinking_off;               /* chat_template_kwargs.enable_thinking is false: no reasoning to parse */
  bool hide_reasoning;             /* include_reasoning false (vLLM's): the think block is parsed, not sent */
} coord_http_req_t;

/* Parses and validates a request body for api against the OpenAI / vLLM
 * rules (types, ranges, best_of >= n, stream_options only with stream, ...).
 * served_model / max_model_len: model names other than served_model give
 * 404; a token prompt of max_model_len tokens or more gives 400. Returns 0,
 * or -1 with e filled (r freed). Never crashes on any bytes. */
int coord_http_req_parse(coord_http_req_t *r, coord_http_api_t api, const char *body, size_t len,
                         const char *served_model, uint32_t max_model_len, coord_http_err_t *e);
void coord_http_req_free(coord_http_req_t *r);
/* Points r->sub at prompt i (< n_prompts) of a completions request. */
void coord_http_req_prompt(coord_http_req_t *r, uint32_t i);

/* http_unsupported.c: a field of OpenAI's schema ferrum does not act on
 * yet, sent with a value that would change the answer (tools, a response
 * format, guided decoding, ...), is a 400 naming it (returns -1, e filled);
 * 0 when there is none. */
int coord_http_req_unsupported(const json_t *root, coord_http_api_t api, coord_http_err_t *e);

/* http_tools.c: reads `tools` and `tool_choice` of a chat request (root)
 * as vLLM does: each tool {"type": "function", "function": {"name",
 * "parameters"?, ...}}; tool_choice "none" / "auto" / "required" /
 * {"type": "function", "function": {"name"}} naming one of them; with
 * tools and no tool_choice it is "auto"; a tool_choice other than "none"
 * needs tools; "required" or "auto" with an empty list is "none". *name:
 * the named function (borrowed from root). Returns 0, or -1 with a 400 in
 * e. */
int coord_tool_req_parse(json_t *root, coord_tool_choice_t *choice, const char **name, coord_http_err_t *e);
/* http_guide.c: the fields that constrain the output (response_format,
 * guided_json / guided_regex / guided_choice, structured_outputs, and
 * tool_choice required / named, after coord_tool_req_parse) into
 * r->sub.guide, compiled once to check them. Returns 0, or -1 with a 400
 * naming the field (what the grammar does not support, two constraints
 * at once). */
int coord_http_req_guide(coord_http_req_t *r, coord_http_err_t *e);

/* What the server's tool settings make of a parsed request's choice: a
 * 400 (-1, e filled) for "auto" without --enable-auto-tool-choice and a
 * parser (vLLM's message), else 0. */
int coord_tool_req_check(const coord_http_req_t *r, const coord_tool_cfg_t *cfg, coord_http_err_t *e);

/* ---- responses (http_resp.c); each returns a malloc'd JSON string or NULL
 * on out of memory ---- */

/* {"error": {"message", "type", "param", "code"}} */
char *coord_http_error_json(const coord_http_err_t *e);

/* What a job produced so far (the events folded together). */
typedef struct {
  char *text;
  size_t text_len, text_cap;
  json_t *logprobs;      /* API-shaped logprobs object being built, or NULL */
  json_t *prompt_lp;     /* vLLM prompt_logprobs array ([null, {id: {logprob, rank, decoded_token}}, ...]), or NULL */
  size_t text_offset;    /* completions logprobs text_offset of the next token */
  proto_finish_t finish;
  bool has_usage;
  proto_usage_t usage;
  uint32_t n_tokens;     /* completion tokens seen */
  double cum_logprob;    /* sum of the tokens' logprobs (best_of ranks by it) */
  char *stop_str;        /* the stop string that ended it (owned), or NULL */
  int32_t stop_id;       /* the stop token id that ended it, or -1 */
} coord_http_acc_t;

/* Response identity shared by all chunks of one answer. */
typedef struct {
  coord_http_api_t api;
  char id[48];          /* "cmpl-<hex>" / "chatcmpl-<hex>" */
  long long created;    /* unix seconds */
  const char *model;
  int logprobs;         /* -1 none */
  int prompt_logprobs;  /* -1 none: vLLM's prompt_logprobs with this many alternatives */
  bool echo;            /* completions echo: with logprobs, the prompt's tokens come first in them */
  bool no_output;       /* max_tokens 0 with echo: the generated token is dropped */
  bool include_usage;
  const struct model_tokenizer *tok; /* optional, for token strings */
  coord_tool_parser_t tool_parser;   /* chat with tool_choice auto: the output is parsed for calls (else NONE) */
  coord_tool_choice_t tool_choice;   /* REQUIRED / NAMED: the (constrained) output is the calls */
  const char *tool_name;             /* NAMED: the function */
  uint64_t tool_seed;                /* call ids */
  coord_reason_parser_t reasoning;   /* chat: the think block is split off as reasoning_content (else NONE) */
  bool hide_reasoning;               /* ... and dropped (include_reasoning false) */
} coord_http_meta_t;

void coord_http_acc_init(coord_http_acc_t *a);
void coord_http_acc_free(coord_http_acc_t *a);
/* Folds one event into a; returns 0 or -ENOMEM. */
int coord_http_acc_add(coord_http_acc_t *a, const coord_http_meta_t *m, const proto_event_t *ev);
/* Appends n bytes of text (echo: the prompt, before the first event). */
int coord_http_acc_text(coord_http_acc_t *a, const char *s, size_t n);

/* The full non-streamed answer (text_completion / chat.completion): the
 * choices accs[0..n) with indexes 0..n-1, and usage u. */
char *coord_http_final_json(const coord_http_meta_t *m, const coord_http_acc_t *const *accs, size_t n,
                            const proto_usage_t *u);
/* The part of one event that is reasoning (m->reasoning): r_len bytes
 * at r, sent as the delta's reasoning_content. */
typedef struct {
  const char *r;
  size_t r_len;
} coord_http_think_t;

/* One SSE chunk for an event of choice index ("data: {...}\n\n"), as a
 * malloc'd string. first: this is the choice's first event (a chat chunk
 * then carries the role). think: the event's reasoning (NULL: none); with
 * m->reasoning the event's text is the content only, and an event with
 * neither (a tag held back) that is not the first or last makes no chunk
 * (an empty string). */
char *coord_http_chunk_sse(const coord_http_meta_t *m, const proto_event_t *ev, bool first, uint32_t index,
                           const coord_http_think_t *think);
/* The last chunk of a stream with include_usage: no choices, usage u. */
char *coord_http_usage_sse(const coord_http_meta_t *m, const proto_usage_t *u);
/* The SSE chunks of one event of choice index of a stream whose output is
 * parsed for tool calls (m->tool_parser or a forced tool_choice): out is
 * what the parser decided with this event: a chunk with its content (and
 * the role when first, the event's logprobs), for each call a chunk with
 * its call index (from call0), id, type and name, then one with its
 * arguments, and the finish (tool_calls when any call was made, called:
 * before this event) on the last. */
char *coord_http_chunk_sse_tools(const coord_http_meta_t *m, const proto_event_t *ev, bool first,
                                 const coord_tool_out_t *out, uint32_t call0, bool called, uint32_t index,
                                 const coord_http_think_t *think);
/* data: {"error": ...}\n\n for a stream that fails after it started. */
char *coord_http_error_sse(const coord_http_err_t *e);
/* /v1/embeddings' answer: {"object": "list", "data": [{"object":
 * "embedding", "index", "embedding"}], "model", "usage"}; each vector L2
 * normalized (as vLLM and OpenAI return them), as floats or, base64, as the
 * bytes of little-endian float32s. vecs[i] has n[i] floats. */
char *coord_http_embed_json(const char *model, float *const *vecs, const uint32_t *n, size_t count, bool base64,
                            uint32_t prompt_tokens);
/* {"object": "list", "data": [{"id", "object": "model", ...}]} */
char *coord_http_models_json(const char *name, uint32_t max_model_len, long long created);

/* Maps a PROTO_ERR_* code (and message) from the coordinator to e. */
void coord_http_err_from_proto(coord_http_err_t *e, int32_t code, const char *message);

/* ---- the server (http.c, http_loop.c) ---- */

struct MHD_Connection;
struct MHD_Response;
typedef struct coord_metrics coord_metrics_t;
typedef struct coord_http_job coord_http_job_t; /* http_job.c */
typedef struct coord_http_choice coord_http_choice_t; /* http_job.c: one sequence of a job */

/* One open connection (http_conn.c), from MHD's "started" notification to
 * its "closed" one, which comes before MHD closes the socket; MHD's
 * socket_context points at it. */
typedef struct coord_http_conn {
  struct coord_http_conn *prev, *next;
  int fd;               /* the client's socket (MHD's; only shut down here) */
  bool receiving;       /* a request (or the next one) is being received */
  bool expired;         /* shut down for missing its deadline */
  uint64_t deadline_ns; /* fr_now_ns() by which the request must be in */
} coord_http_conn_t;

/* The frontend's one connection to the coordinator loop (http_rpc.c): a
 * DEALER on the coordinator's zmq context, as an outside RPC client has,
 * that carries every request's job; events come back by job id. */
typedef struct {
  void *sock;          /* ZMQ_DEALER */
  uint64_t last_rx_ns; /* fr_now_ns() when the coordinator last sent anything (or the open) */
  uint64_t last_ping_ns;
  uint64_t beats;      /* heartbeats sent */
  proto_buf_t buf;
  proto_msg_t msg;
} coord_http_rpc_t;

#define COORD_HTTP_JOB_BUCKETS 1024u /* choice ids are consecutive: id % buckets spreads them */

struct coord_http {
  struct MHD_Daemon *daemon;
  void *zmq_ctx;
  char *rpc_endpoint, *api_key, *model;
  uint32_t max_model_len;
  coord_metrics_t *metrics;
  const struct model_tokenizer *tok;
  coord_tool_cfg_t tools;      /* --tool-call-parser, --enable-auto-tool-choice */
  coord_reason_parser_t reasoning; /* --reasoning-parser */
  int port;
  unsigned timeout_s;          /* MHD's idle timeout (not counted while a request waits: suspended) */
  uint64_t keepalive_ns;       /* a waiting request's heartbeat (and SSE comment) period */
  uint64_t engine_timeout_ns;  /* a coordinator silent this long ends the request */
  /* stopping: coord_http_stop began; the loop reads what the coordinator
   * queued, ends every job that is left and waits for the answers to go out;
   * was_ready: the workers have been ready once (a restart's jobs then wait) */
  _Atomic int ready, was_ready, draining, stopping;
  uint64_t next_job;           /* job ids; starts at a random value (loop thread) */
  long long started;           /* unix seconds, for /v1/models */
  /* the loop (http_loop.c) */
  pthread_t loop;
  bool loop_running;
  int wake_fd;                 /* eventfd: coord_http_stop wakes the loop */
  coord_http_rpc_t rpc;
  /* unfinished jobs: a list and a table by id (http_job.c) */
  coord_http_job_t *jobs;
  coord_http_choice_t *job_hash[COORD_HTTP_JOB_BUCKETS]; /* the jobs' choices by id */
  size_t n_jobs;
  struct pollfd *watch;        /* scratch for the client sockets the tick looks at */
  size_t watch_cap;
  /* connections and their deadline (http_conn.c) */
  uint64_t request_timeout_ns; /* a request's headers and body must arrive within this */
  uint64_t idle_timeout_ns;    /* MHD's idle timeout: a kept-alive connection's wait first */
  coord_http_conn_t *conns;    /* the open connections */
  size_t n_conns;
};

/* Queues a response with status (counted in the metrics) and destroys it.
 * Returns MHD's result as an int. */
int coord_http__queue(struct coord_http *h, struct MHD_Connection *c, int status, struct MHD_Response *r);
/* Queues OpenAI's error body for e. */
int coord_http__send_error(struct coord_http *h, struct MHD_Connection *c, const coord_http_err_t *e);
/* Queues a malloc'd JSON body (taken over). */
int coord_http__send_json(struct coord_http *h, struct MHD_Connection *c, int status, char *json);
/* http_tokenize.c: POST /tokenize and /detokenize (vLLM's). */
int coord_http__tokenize(struct coord_http *h, struct MHD_Connection *c, const char *body, size_t len);
int coord_http__detokenize(struct coord_http *h, struct MHD_Connection *c, const char *body, size_t len);
/* GET /tokenizer_info: the special tokens, the chat template, the context. */
int coord_http__tokenizer_info(struct coord_http *h, struct MHD_Connection *c);

/* Runs the loop thread: zmq_poll over the RPC DEALER, MHD's epoll
 * descriptor and the wake eventfd; MHD_run; every tick (100 ms) the jobs'
 * timers and client sockets and the connections' deadlines. Returns 0 or
 * -errno (the thread not started). */
int coord_http__loop_start(struct coord_http *h);
/* Wakes the loop (stopping was set) and joins it: it returns once every
 * answer is sent (or 5 s passed) with no connection suspended. */
void coord_http__loop_join(struct coord_http *h);

/* ---- jobs (http_job.c) ----
 *
 * A completion request whose body is in becomes a job: validated, given an
 * id, submitted over the RPC connection, and its connection suspended
 * (MHD_suspend_connection: no thread waits for it, MHD's idle timeout does
 * not run). The loop routes the coordinator's messages to their jobs by
 * id; a job that has its answer (a JSON body, an error, or a stream that
 * can start) resumes its connection, and MHD calls the access handler
 * again, which queues the answer (coord_http__job_answer). A stream's
 * content reader hands out the SSE text queued for it and suspends the
 * connection again when there is none. */

/* Runs a /v1/completions or /v1/chat/completions request whose body is
 * complete: validates and submits, then suspends c (*job set: the request
 * owns it, coord_http__job_free frees it); or answers at once (an invalid
 * body, not ready, *job NULL). http11: the request is HTTP/1.1 (an interim
 * 1xx answer may be sent). Returns MHD's result as an int. */
int coord_http__job(struct coord_http *h, struct MHD_Connection *c, coord_http_api_t api, const char *body, size_t len,
                    bool http11, coord_http_job_t **job);
/* The access handler's call on a resumed connection: queues the job's
 * answer, or suspends again. Returns MHD's result (MHD_NO: close, the
 * client left). */
int coord_http__job_answer(struct coord_http *h, struct MHD_Connection *c, coord_http_job_t *j);
/* Frees a job when its request ends (MHD's "completed"); an unfinished one
 * is canceled. NULL is fine. */
void coord_http__job_free(coord_http_job_t *j);
/* Hands a message from the coordinator (an "event" or "error") to its job;
 * messages for no job (finished, canceled) are dropped. */
void coord_http__jobs_on_msg(struct coord_http *h, const proto_msg_t *m);
/* The tick: client sockets of waiting jobs (hang-up: cancel; end of
 * stream: a probe), keep-alives, heartbeats, the engine timeout. */
void coord_http__jobs_tick(struct coord_http *h, uint64_t now);
/* Ends every unfinished job (the frontend stops; what the coordinator
 * queued was read first): a stream with an error chunk and [DONE], a
 * request not answered yet with 503. */
void coord_http__jobs_stop(struct coord_http *h);

/* ---- connections (http_conn.c) ----
 *
 * libmicrohttpd's connection timeout is an idle timeout, reset by every
 * byte, so a client that sends a byte every few seconds would hold a
 * connection forever. Each connection gets a deadline for its request as
 * well: from its start, a request's headers and body must be in within
 * request_timeout_ns; from the end of each answer, the next one's within
 * idle_timeout_ns + request_timeout_ns (a kept-alive connection may first
 * wait, as long as the idle timeout lets it). No deadline runs while a
 * request is answered. The loop's tick shuts down (shutdown(2), not close:
 * MHD owns the descriptor) the sockets that miss theirs; MHD then reads
 * the end of the stream and closes the connection. Nothing is answered: a
 * 408 written on a connection the client may be reusing could be taken as
 * the answer to its next request (nginx closes silently too).
 * libmicrohttpd 0.9.75 offers no hook for this: the access handler first
 * runs once all headers are in, and no option bounds a request's total
 * time. */

/* Sets the deadlines (seconds). */
void coord_http__conns_init(struct coord_http *h, unsigned request_timeout_s, unsigned idle_timeout_s);
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
/* Shuts down the sockets whose request is late. */
void coord_http__conns_tick(struct coord_http *h, uint64_t now);
/* True when a connection is answering a request. */
bool coord_http__conns_answering(const struct coord_http *h);

/* ---- the RPC connection (http_rpc.c) ---- */

/* Opens the DEALER on ctx connected to endpoint. Returns 0 or FR_EZMQ. */
int coord_http_rpc_open(coord_http_rpc_t *r, void *ctx, const char *endpoint);
/* Sends a message without waiting. Returns 0 or a negative error. */
int coord_http_rpc_send(coord_http_rpc_t *r, proto_type_t type, const void *body);
/* Receives one message without waiting. Returns 1 with *msg (valid until
 * the next call), 2 when a frame was skipped (an empty delimiter, or a
 * message that does not decode: logged), 0 when none is queued, or a
 * negative error. Anything received refreshes last_rx_ns. */
int coord_http_rpc_recv(coord_http_rpc_t *r, const proto_msg_t **msg);
/* Sends a "heartbeat"; the coordinator's answer refreshes last_rx_ns.
 * Returns 0 or a negative error. */
int coord_http_rpc_ping(coord_http_rpc_t *r);
/* Closes the socket (a cancel sent just before still goes out). */
void coord_http_rpc_close(coord_http_rpc_t *r);

/* What the peer of a socket did, seen without reading it. */
typedef enum {
  COORD_HTTP_PEER_OPEN = 0, /* nothing (or only data) */
  COORD_HTTP_PEER_EOF,      /* it sent FIN: a half-close, or a close */
  COORD_HTTP_PEER_GONE,     /* reset, or the socket failed */
} coord_http_peer_t;
/* The same from poll's revents (POLLRDHUP asked). */
coord_http_peer_t coord_http_peer_of(short revents);

#ifdef __cplusplus
}
#endif
