/* http.c - the libmicrohttpd daemon: connection limits and timeouts, body
 * collection with the 4 MiB cap, routing, API-key auth, /health, /metrics,
 * /v1/models. Completion routes go to http_job.c; the loop that runs MHD
 * is http_loop.c. See http.h. */
#include "coordinator/http/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>

#include <microhttpd.h>

#include "common/fr_err.h"
#include "common/fr_log.h"
#include "common/fr_util.h"
#include "coordinator/http/http_internal.h"
#include "model/chat.h"
#include "model/tokenizer.h"
#include "coordinator/metrics.h"

/* What a connection collects while its request body arrives. */
typedef struct {
  char *body;
  size_t len, cap;
  bool too_big;
  bool http11; /* HTTP/1.1 (not 1.0) */
  coord_http_job_t *job; /* the completion it waits for, or NULL */
} http_upload_t;

int coord_http__queue(struct coord_http *h, struct MHD_Connection *c, int status, struct MHD_Response *r) {
  if (!r) return MHD_NO;
  coord_metrics_http(h->metrics, status);
  enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, r);
  MHD_destroy_response(r);
  return rc;
}

/* Queues a malloc'd body (taken over) with a content type. */
static int http_send(struct coord_http *h, struct MHD_Connection *c, int status, char *body, const char *type) {
  if (!body) return MHD_NO;
  struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
  if (!r) {
    free(body);
    return MHD_NO;
  }
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
  return coord_http__queue(h, c, status, r);
}

int coord_http__send_json(struct coord_http *h, struct MHD_Connection *c, int status, char *json) {
  return http_send(h, c, status, json, "application/json");
}

int coord_http__send_error(struct coord_http *h, struct MHD_Connection *c, const coord_http_err_t *e) {
  return http_send(h, c, e->status, coord_http_error_json(e), "application/json");
}

static int http_error(struct coord_http *h, struct MHD_Connection *c, int status, const char *param, const char *msg) {
  coord_http_err_t e;
  coord_http_err(&e, status, param, "%s", msg);
  return coord_http__send_error(h, c, &e);
}

/* Authorization: Bearer <key>, compared in constant time. */
static bool http_authorized(const struct coord_http *h, struct MHD_Connection *c) {
  if (!h->api_key) return true;
  const char *v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
  if (!v || strncasecmp(v, "Bearer ", 7)) return false;
  v += 7;
  size_t n = strlen(h->api_key), m = strlen(v);
  unsigned char diff = n != m;
  for (size_t i = 0; i < n; i++) diff |= (unsigned char)(h->api_key[i] ^ (i < m ? v[i] : 0));
  return diff == 0;
}

static int http_health(struct coord_http *h, struct MHD_Connection *c) {
  if (atomic_load(&h->draining)) return http_error(h, c, 503, NULL, "the server is draining");
  if (!atomic_load(&h->ready)) return http_error(h, c, 503, NULL, "the workers are not ready");
  return http_send(h, c, 200, fr_strdup(""), "text/plain");
}

static int http_metrics(struct coord_http *h, struct MHD_Connection *c) {
  char *text;
  size_t len;
  if (!h->metrics) return http_error(h, c, 404, NULL, "metrics are off");
  if (coord_metrics_render(h->metrics, &text, &len)) return http_error(h, c, 500, NULL, "out of memory");
  return http_send(h, c, 200, text, "text/plain; version=0.0.4; charset=utf-8");
}

static int http_models(struct coord_http *h, struct MHD_Connection *c) {
  return http_send(h, c, 200, coord_http_models_json(h->model, h->max_model_len, h->started), "application/json");
}

/* The route table: path, method, handler kind. */
static int http_route(struct coord_http *h, struct MHD_Connection *c, const char *url, const char *method,
                      http_upload_t *up) {
  bool get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
  if (!strcmp(url, "/health")) return get ? http_health(h, c) : http_error(h, c, 405, NULL, "use GET");
  if (!strcmp(url, "/metrics")) return get ? http_metrics(h, c) : http_error(h, c, 405, NULL, "use GET");
  bool cmpl = !strcmp(url, "/v1/completions"), chat = !strcmp(url, "/v1/chat/completions");
  bool models = !strcmp(url, "/v1/models");
  bool tokenize = !strcmp(url, "/tokenize"), detokenize = !strcmp(url, "/detokenize");
  bool embed = !strcmp(url, "/v1/embeddings"), tok_info = !strcmp(url, "/tokenizer_info");
  if (!cmpl && !chat && !models && !tokenize && !detokenize && !embed && !tok_info) {
    coord_http_err_t e;
    coord_http_err(&e, 404, NULL, "Invalid URL (%s %.200s)", method, url);
    return coord_http__send_error(h, c, &e);
  }
  if (!http_authorized(h, c)) return http_error(h, c, 401, NULL, "Incorrect API key provided.");
  if (models) return get ? http_models(h, c) : http_error(h, c, 405, NULL, "use GET");
  if (tok_info) return get ? coord_http__tokenizer_info(h, c) : http_error(h, c, 405, NULL, "use GET");
  if (!post) return http_error(h, c, 405, NULL, "use POST");
  if (up->too_big) return http_error(h, c, 413, NULL, "the request body is larger than 4 MiB");
  if (tokenize || detokenize)
    return (tokenize ? coord_http__tokenize : coord_http__detokenize)(h, c, up->body ? up->body : "", up->len);
  coord_http_api_t api = chat ? COORD_HTTP_API_CHAT : embed ? COORD_HTTP_API_EMBEDDINGS : COORD_HTTP_API_COMPLETIONS;
  return coord_http__job(h, c, api, up->body ? up->body : "",
                         up->len, up->http11, &up->job);
}

/* Appends upload bytes; past the cap the rest is read and dropped. */
static void http_upload_add(http_upload_t *up, const char *data, size_t n) {
  if (up->too_big) return;
  if (up->len + n > COORD_HTTP_MAX_BODY) {
    up->too_big = true;
    return;
  }
  if (up->len + n + 1 > up->cap) {
    size_t cap = up->cap ? up->cap : 4096;
    while (cap < up->len + n + 1) cap *= 2;
    up->body = fr_realloc(up->body, cap);
    up->cap = cap;
  }
  memcpy(up->body + up->len, data, n);
  up->len += n;
  up->body[up->len] = 0;
}

/* Bodies up to this size are read (and dropped past COORD_HTTP_MAX_BODY)
 * so that a client that sends before it reads gets its 413; larger ones
 * are answered at once and the connection is closed. */
#define HTTP_DRAIN_MAX (64u << 20)

static bool http_declared_huge(struct MHD_Connection *c) {
  const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
  return cl && strtoull(cl, NULL, 10) > HTTP_DRAIN_MAX;
}

/* The framing headers of a request, counted by name. */
typedef struct {
  unsigned n_length, n_coding;
  const char *coding; /* the first Transfer-Encoding value */
} http_framing_t;

static enum MHD_Result http_count_framing(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
  http_framing_t *f = cls;
  (void)kind;
  if (!strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH)) f->n_length++;
  if (!strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING) && f->n_coding++ == 0) f->coding = value;
  return MHD_YES;
}

/* A request whose body two parsers could delimit differently (a proxy in
 * front and this server: request smuggling) is refused before its body is
 * read, as RFC 9112 section 6 asks: Content-Length twice (even with equal
 * values, which RFC 9112 lets a server refuse) or beside Transfer-Encoding,
 * Transfer-Encoding twice or in an HTTP/1.0 request (400), or a coding
 * other than chunked (501). libmicrohttpd would use the first length, or
 * the coding and ignore the length. Returns 0, or -1 with e filled. */
static int http_check_framing(struct MHD_Connection *c, bool http11, coord_http_err_t *e) {
  http_framing_t f = {0};
  MHD_get_connection_values(c, MHD_HEADER_KIND, http_count_framing, &f);
  if (f.n_length > 1) return coord_http_err(e, 400, NULL, "the request has more than one Content-Length header");
  if (f.n_length && f.n_coding)
    return coord_http_err(e, 400, NULL, "the request has both Content-Length and Transfer-Encoding");
  if (f.n_coding > 1) return coord_http_err(e, 400, NULL, "the request has more than one Transfer-Encoding header");
  if (f.n_coding && !http11) return coord_http_err(e, 400, NULL, "Transfer-Encoding in an HTTP/1.0 request");
  if (f.n_coding && strcasecmp(f.coding, "chunked"))
    return coord_http_err(e, 501, NULL, "Transfer-Encoding '%.100s' is not supported (only chunked)", f.coding);
  return 0;
}

/* The first call: headers are in, the body (if any) follows. A request
 * answered here is not read further; MHD closes the connection after the
 * answer. */
static enum MHD_Result http_headers_in(struct coord_http *h, struct MHD_Connection *c, const char *version,
                                       http_upload_t *up) {
  coord_http_err_t e;
  up->http11 = strcmp(version, MHD_HTTP_VERSION_1_0) != 0; /* 1.1, or 1.x that MHD reads as 1.1 */
  if (http_check_framing(c, up->http11, &e)) {
    coord_http__conn_received(h, c);
    return (enum MHD_Result)coord_http__send_error(h, c, &e);
  }
  if (http_declared_huge(c)) {
    up->too_big = true;
    coord_http__conn_received(h, c);
    return (enum MHD_Result)http_error(h, c, 413, NULL, "the request body is larger than 4 MiB");
  }
  return MHD_YES;
}

static enum MHD_Result http_access(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                   const char *version, const char *data, size_t *data_size, void **con_cls) {
  struct coord_http *h = cls;
  http_upload_t *up = *con_cls;
  if (!up) {
    *con_cls = up = fr_calloc(1, sizeof *up);
    return http_headers_in(h, c, version, up);
  }
  if (*data_size) {
    http_upload_add(up, data, *data_size);
    *data_size = 0;
    return MHD_YES;
  }
  if (up->job) return (enum MHD_Result)coord_http__job_answer(h, c, up->job); /* resumed */
  coord_http__conn_received(h, c); /* the whole request is in: no deadline while it runs */
  return (enum MHD_Result)http_route(h, c, url, method, up);
}

static void http_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
  http_upload_t *up = *con_cls;
  coord_http__conn_rearm(cls, c); /* keep-alive: the next request's clock */
  if (!up) return;
  coord_http__job_free(up->job); /* cancels a job whose client left */
  free(up->body);
  free(up);
  *con_cls = NULL;
}

/* Resolves host:port into a socket address MHD binds. */
static int http_addr(const char *host, int port, struct sockaddr_storage *ss) {
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai;
  char ps[16];
  snprintf(ps, sizeof ps, "%d", port);
  int rc = getaddrinfo(host, ps, &hints, &ai);
  if (rc) return fr_errorf(-EINVAL, "HTTP host '%s': %s", host, gai_strerror(rc));
  memcpy(ss, ai->ai_addr, ai->ai_addrlen);
  freeaddrinfo(ai);
  return 0;
}

/* Descriptors kept for everything but connections (zmq, model files,
 * workers' sockets). */
#define HTTP_FD_RESERVE 256u

/* Raises RLIMIT_NOFILE's soft limit to the hard one (each connection is a
 * descriptor) and returns the soft limit in force. */
static unsigned long http_raise_nofile(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl)) return 1024;
  if (rl.rlim_cur != rl.rlim_max) {
    struct rlimit want = {.rlim_cur = rl.rlim_max, .rlim_max = rl.rlim_max};
    if (setrlimit(RLIMIT_NOFILE, &want) == 0) rl = want;
    else FR_LOGW("HTTP: cannot raise the descriptor limit to %llu: %s", (unsigned long long)rl.rlim_max, strerror(errno));
  }
  return rl.rlim_cur == RLIM_INFINITY ? 1ul << 20 : (unsigned long)rl.rlim_cur;
}

/* The connection limit: as asked (default COORD_HTTP_MAX_CONN), within
 * the descriptors the process may open. */
static unsigned http_max_conn(const coord_http_config_t *cfg) {
  unsigned want = cfg->max_connections ? cfg->max_connections : COORD_HTTP_MAX_CONN;
  unsigned long nofile = http_raise_nofile();
  unsigned long room = nofile > 2 * HTTP_FD_RESERVE ? nofile - HTTP_FD_RESERVE : nofile / 2;
  if (want <= room) return want;
  FR_LOGW("HTTP: %u connections asked, %lu allowed by the descriptor limit (ulimit -n %lu)", want, room, nofile);
  return (unsigned)(room ? room : 1);
}

static int http_daemon_start(struct coord_http *h, const coord_http_config_t *cfg) {
  struct sockaddr_storage ss;
  int rc = http_addr(cfg->host ? cfg->host : "127.0.0.1", cfg->port, &ss);
  if (rc) return rc;
  /* no thread of MHD's own: the loop thread polls MHD's epoll descriptor
   * and runs it; a request that waits for the engine is suspended */
  unsigned flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME;
  if (ss.ss_family == AF_INET6) flags |= MHD_USE_IPv6;
  unsigned max_conn = http_max_conn(cfg);
  /* one address cannot take every slot (half of them, at least 128): a
   * benchmark of 1000 clients from one host is not refused (their requests
   * wait in the queue; 429 past --max-queue), and MHD counts closed
   * connections for a moment */
  unsigned per_ip = cfg->max_connections_per_ip ? cfg->max_connections_per_ip : FR_MAX(128u, max_conn / 2);
  h->daemon = MHD_start_daemon(
      flags, 0, NULL, NULL, http_access, h, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss, MHD_OPTION_CONNECTION_LIMIT,
      max_conn, MHD_OPTION_PER_IP_CONNECTION_LIMIT, per_ip, MHD_OPTION_CONNECTION_TIMEOUT, h->timeout_s,
      MHD_OPTION_NOTIFY_COMPLETED, http_completed, h, MHD_OPTION_NOTIFY_CONNECTION, coord_http__conn_notify, h,
      MHD_OPTION_LISTEN_BACKLOG_SIZE, 1024u, MHD_OPTION_END);
  if (!h->daemon) return fr_errorf(-EADDRINUSE, "HTTP: cannot listen on %s:%d", cfg->host ? cfg->host : "127.0.0.1", cfg->port);
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
  h->port = info ? info->port : cfg->port;
  FR_LOGD("HTTP: at most %u connections, %u per address", max_conn, per_ip);
  return 0;
}

int coord_http_start(coord_http_t **out, const coord_http_config_t *cfg) {
  if (!cfg || !cfg->zmq_ctx || !cfg->rpc_endpoint) return fr_errorf(-EINVAL, "HTTP: zmq context and RPC endpoint needed");
  coord_tool_cfg_t tools = {.auto_choice = cfg->enable_auto_tool_choice, .marker = -1};
  if (cfg->tool_call_parser && coord_tool_parser_from_name(cfg->tool_call_parser, &tools.parser))
    return fr_errorf(-EINVAL, "HTTP: unknown tool call parser '%s' (hermes, llama3_json, mistral)", cfg->tool_call_parser);
  if (tools.parser == COORD_TOOL_PARSER_MISTRAL && cfg->tokenizer) { /* a control token: skip_special drops it */
    int32_t id = model_token_lookup(cfg->tokenizer, "[TOOL_CALLS]", 12);
    if (id >= 0 && model_token_is_control(cfg->tokenizer, id)) tools.marker = id;
  }
  coord_reason_parser_t reasoning = COORD_REASON_PARSER_NONE;
  if (cfg->reasoning_parser && coord_reason_parser_from_name(cfg->reasoning_parser, &reasoning))
    return fr_errorf(-EINVAL, "HTTP: unknown reasoning parser '%s' (qwen3, deepseek_r1)", cfg->reasoning_parser);
  coord_http_t *h = fr_calloc(1, sizeof *h);
  h->tools = tools;
  h->reasoning = reasoning;
  h->wake_fd = -1;
  h->zmq_ctx = cfg->zmq_ctx;
  h->rpc_endpoint = fr_strdup(cfg->rpc_endpoint);
  h->api_key = cfg->api_key && *cfg->api_key ? fr_strdup(cfg->api_key) : NULL;
  h->model = fr_strdup(cfg->served_model_name ? cfg->served_model_name : "default");
  h->max_model_len = cfg->max_model_len;
  h->metrics = cfg->metrics;
  h->tok = cfg->tokenizer;
  h->started = (long long)time(NULL);
  h->timeout_s = cfg->timeout_s ? cfg->timeout_s : 30u;
  h->keepalive_ns = (uint64_t)(cfg->keepalive_ms ? cfg->keepalive_ms : 5000u) * 1000000ull;
  h->engine_timeout_ns = (uint64_t)(cfg->engine_timeout_ms ? cfg->engine_timeout_ms : 30000u) * 1000000ull;
  if (h->engine_timeout_ns < 2 * h->keepalive_ns) h->engine_timeout_ns = 2 * h->keepalive_ns; /* a heartbeat's time */
  uint64_t seed = 0;
  if (getrandom(&seed, sizeof seed, 0) != sizeof seed) seed = fr_now_ns();
  h->next_job = seed >> 16; /* far from 0 and from wrapping */
  coord_http__conns_init(h, cfg->request_timeout_s ? cfg->request_timeout_s : 30u, h->timeout_s);
  int rc = coord_http_rpc_open(&h->rpc, h->zmq_ctx, h->rpc_endpoint);
  if (!rc) rc = http_daemon_start(h, cfg);
  if (!rc) rc = coord_http__loop_start(h);
  if (rc) {
    coord_http_stop(h);
    return rc;
  }
  FR_LOGI("HTTP: listening on %s:%d", cfg->host ? cfg->host : "127.0.0.1", h->port);
  *out = h;
  return 0;
}

int coord_http_port(const coord_http_t *h) { return h->port; }

void coord_http_set_ready(coord_http_t *h, bool ready) {
  atomic_store(&h->ready, ready);
  if (ready) atomic_store(&h->was_ready, 1);
}

void coord_http_set_draining(coord_http_t *h) { atomic_store(&h->draining, 1); }

void coord_http_stop(coord_http_t *h) {
  if (!h) return;
  atomic_store(&h->stopping, 1); /* the loop ends every job and sends what is queued */
  coord_http__loop_join(h);      /* then no connection is suspended: MHD may stop */
  if (h->daemon) MHD_stop_daemon(h->daemon); /* closes the connections: their jobs are freed */
  coord_http__conns_free(h);
  coord_http_rpc_close(&h->rpc);
  free(h->watch);
  free(h->rpc_endpoint);
  free(h->api_key);
  free(h->model);
  free(h);
}
