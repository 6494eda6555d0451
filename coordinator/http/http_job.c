/* http_job.c - /v1/completions and /v1/chat/completions: validate the body,
 * submit it over the RPC connection, then answer with one JSON object or
 * stream SSE chunks as events arrive, with a comment line each keep-alive
 * period that passes without one. A client that hangs up cancels its job
 * (http_rpc.c watches its socket); every other end of a stream is a chunk
 * (the last event's, or an error) and [DONE]. See http_internal.h. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <microhttpd.h>

#include "common/fr_err.h"
#include "common/fr_log.h"
#include "common/fr_util.h"
#include "coordinator/http/http_internal.h"

#define JOB_TICK_MS 100

static const char job_done_sse[] = "data: [DONE]\n\n";
static const char job_keepalive_sse[] = ": keep-alive\n\n";

typedef struct {
  struct coord_http *h;
  struct MHD_Connection *conn; /* the request's connection (its thread runs the job) */
  coord_http_req_t req;
  coord_http_rpc_t rpc;
  coord_http_meta_t meta;
  char *pend; /* SSE bytes not yet handed to MHD */
  size_t pend_len, pend_off;
  uint32_t n_events; /* events turned into chunks */
  bool done;      /* the last chunk is in pend */
  bool http11;    /* the request is HTTP/1.1: an interim 1xx answer may be sent */
  bool streaming; /* the SSE answer has started (MHD sends pend) */
} job_t;

#define JOB_PEND 2 /* job_wait: pend holds bytes to send (a probe, a keep-alive), no message */
#define JOB_IDLE 3 /* job_wait: no message for a keep-alive period (not streaming yet) */

static void job_free(job_t *j) {
  if (!j) return;
  if (j->rpc.sock) coord_http_rpc_close(&j->rpc); /* cancels an unfinished job */
  coord_http_req_free(&j->req);
  free(j->pend);
  free(j);
}

static void job_set_pend(job_t *j, char *s) {
  free(j->pend);
  j->pend = s;
  j->pend_len = strlen(s);
  j->pend_off = 0;
}

/* The client sent its end of stream: it half-closed and reads on, or it
 * left (see coord_http_rpc_next). Writes what it must ignore, so that a
 * closed socket answers with a reset (-EPIPE on a later wait): before the
 * answer an interim "100 Continue" (RFC 9110 section 15.2: an HTTP/1.1
 * client parses 1xx answers before the final one; none may go to HTTP/1.0
 * clients, whose end of stream cancels the job), in an SSE stream a
 * comment line (queued in pend). Returns 0 or JOB_PROBE to go on, -EPIPE
 * when nothing could be written (the job canceled). */
static int job_probe(job_t *j) {
  static const char interim[] = "HTTP/1.1 100 Continue\r\n\r\n";
  if (j->streaming) {
    job_set_pend(j, fr_strdup(":\n\n"));
    return JOB_PEND;
  }
  /* MHD writes nothing while its connection thread waits here for the job */
  if (j->http11 && send(j->rpc.client_fd, interim, sizeof interim - 1, MSG_NOSIGNAL | MSG_DONTWAIT) ==
                       (ssize_t)(sizeof interim - 1))
    return 0;
  coord_http_rpc_cancel(&j->rpc);
  return -EPIPE;
}

/* A keep-alive period passed without a message: checks that the
 * coordinator still answers (it answers each heartbeat; FR_ETIMEOUT, the
 * job canceled, when it has been silent too long) and queues an SSE
 * comment in a stream (JOB_PEND), else returns JOB_IDLE. */
static int job_idle(job_t *j) {
  const struct coord_http *h = j->h;
  uint64_t silent = fr_now_ns() - j->rpc.last_rx_ns;
  int rc = 0;
  if (silent > h->engine_timeout_ns)
    rc = fr_errorf(FR_ETIMEOUT, "the engine did not answer for %llu s", (unsigned long long)(silent / 1000000000ull));
  else rc = coord_http_rpc_ping(&j->rpc);
  if (rc) {
    coord_http_rpc_cancel(&j->rpc);
    return rc;
  }
  if (!j->streaming) return JOB_IDLE;
  job_set_pend(j, fr_strdup(job_keepalive_sse));
  return JOB_PEND;
}

/* Waits for the job's next message. Returns 1 (*m set), JOB_PEND (pend
 * holds a probe of a half-closed client or a keep-alive), JOB_IDLE, -EPIPE
 * when the client hung up, FR_ECANCELED when the frontend stops and
 * nothing is queued for the job (the coordinator sends nothing more then:
 * what it sent before is read first), other errors. */
static int job_wait(job_t *j, const proto_msg_t **m) {
  uint64_t idle_end = fr_now_ns() + j->h->keepalive_ns;
  for (;;) {
    bool stopping = atomic_load(&j->h->stopping);
    int rc = coord_http_rpc_next(&j->rpc, stopping ? 0 : JOB_TICK_MS, m);
    if (rc == COORD_HTTP_RPC_EOF) rc = job_probe(j);
    if (rc) return rc;
    if (stopping) {
      coord_http_rpc_cancel(&j->rpc);
      return fr_errorf(FR_ECANCELED, "the HTTP frontend is stopping");
    }
    if (fr_now_ns() >= idle_end) return job_idle(j);
  }
}

/* job_wait through idle periods: a message, or an error. */
static int job_wait_msg(job_t *j, const proto_msg_t **m) {
  int rc;
  while ((rc = job_wait(j, m)) == JOB_IDLE) continue;
  return rc;
}

/* The error a finished message means (an "error", or an event that
 * finished with ERROR); false when it is not an error. */
static bool job_msg_error(const proto_msg_t *m, coord_http_err_t *e) {
  if (m->type == PROTO_T_ERROR) {
    coord_http_err_from_proto(e, m->u.error.code, m->u.error.message);
    return true;
  }
  if (m->u.event.finish == PROTO_FINISH_ERROR) {
    coord_http_err_from_proto(e, m->u.event.error.code ? m->u.event.error.code : PROTO_ERR_INTERNAL,
                              m->u.event.error.message);
    return true;
  }
  return false;
}

/* The answer to a wait failure other than a gone client's. */
static void job_fail_err(int rc, coord_http_err_t *e) {
  if (rc == FR_ECANCELED) coord_http_err(e, 503, NULL, "the server is shutting down");
  else if (rc == FR_ETIMEOUT) coord_http_err(e, 503, NULL, "%s", fr_last_error());
  else coord_http_err(e, 500, NULL, "engine connection failed: %s", fr_last_error());
}

/* Maps a wait failure to the answer: nothing for a gone client. */
static int job_fail(job_t *j, struct MHD_Connection *c, int rc) {
  coord_http_err_t e;
  if (rc == -EPIPE) return MHD_NO; /* the client left; MHD closes the connection */
  job_fail_err(rc, &e);
  return coord_http__send_error(j->h, c, &e);
}

static int job_answer_json(job_t *j, struct MHD_Connection *c, const proto_msg_t *m) {
  coord_http_acc_t acc;
  coord_http_err_t e;
  int rc = 0;
  coord_http_acc_init(&acc);
  for (;;) {
    if (job_msg_error(m, &e)) {
      rc = coord_http__send_error(j->h, c, &e);
      goto out;
    }
    if (coord_http_acc_add(&acc, &j->meta, &m->u.event)) {
      rc = MHD_NO;
      goto out;
    }
    if (j->rpc.finished) break;
    int w = job_wait_msg(j, &m);
    if (w < 0) {
      rc = job_fail(j, c, w);
      goto out;
    }
  }
  char *body = coord_http_final_json(&j->meta, &acc);
  struct MHD_Response *r = body ? MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE) : NULL;
  if (!r) free(body);
  if (r) MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
  rc = coord_http__queue(j->h, c, 200, r); /* restarts MHD's idle timer */
out:
  coord_http_acc_free(&acc);
  return rc;
}

/* Appends [DONE] to pend: the stream ends after it. */
static void job_pend_done(job_t *j) {
  j->pend = fr_realloc(j->pend, j->pend_len + sizeof job_done_sse);
  memcpy(j->pend + j->pend_len, job_done_sse, sizeof job_done_sse);
  j->pend_len += sizeof job_done_sse - 1;
  j->done = true;
}

/* Replaces pend with the SSE text of message m (plus [DONE] at the end). */
static int job_chunk(job_t *j, const proto_msg_t *m) {
  coord_http_err_t e;
  bool first = j->n_events++ == 0;
  char *s = job_msg_error(m, &e) ? coord_http_error_sse(&e) : coord_http_chunk_sse(&j->meta, &m->u.event, first);
  if (!s) return -ENOMEM;
  job_set_pend(j, s);
  if (j->rpc.finished) job_pend_done(j);
  return 0;
}

/* A stream that ends before its job's last event (the frontend stops, the
 * engine went silent or its connection failed) ends with an error chunk
 * and [DONE], as vLLM's do. */
static int job_chunk_fail(job_t *j, int rc) {
  coord_http_err_t e;
  job_fail_err(rc, &e);
  char *s = coord_http_error_sse(&e);
  if (!s) return -ENOMEM;
  FR_LOGW("HTTP: stream %s ends early: %s", j->meta.id, e.message);
  job_set_pend(j, s);
  job_pend_done(j);
  return 0;
}

/* MHD's content reader: hands out pend, waiting for the next event when it
 * is empty. Runs in the connection's thread. */
static ssize_t job_read(void *cls, uint64_t pos, char *buf, size_t max) {
  job_t *j = cls;
  (void)pos;
  while (j->pend_off == j->pend_len) {
    if (j->done) return MHD_CONTENT_READER_END_OF_STREAM;
    const proto_msg_t *m;
    int w = job_wait(j, &m);
    if (w == -EPIPE) return MHD_CONTENT_READER_END_WITH_ERROR; /* the client left */
    int rc = w < 0 ? job_chunk_fail(j, w) : w == 1 ? job_chunk(j, m) : 0; /* else pend holds a comment */
    if (rc) return MHD_CONTENT_READER_END_WITH_ERROR;
    coord_http__conn_touch(j->h, j->conn); /* waiting for the engine is not the client's idleness */
  }
  size_t n = j->pend_len - j->pend_off < max ? j->pend_len - j->pend_off : max;
  memcpy(buf, j->pend + j->pend_off, n);
  j->pend_off += n;
  return (ssize_t)n;
}

static void job_read_free(void *cls) { job_free(cls); }

/* Starts the SSE answer with the first message m, or with nothing (NULL:
 * none came within a keep-alive period); j belongs to the response from
 * here on (or is freed here when no stream starts). */
static int job_answer_stream(job_t *j, struct MHD_Connection *c, const proto_msg_t *m) {
  coord_http_err_t e;
  int rc = MHD_NO;
  struct MHD_Response *r = NULL;
  if (m && job_msg_error(m, &e)) rc = coord_http__send_error(j->h, c, &e); /* nothing streamed yet: a real status */
  else if (!m || !job_chunk(j, m))
    r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, job_read, j, job_read_free);
  if (!r) {
    job_free(j);
    return rc;
  }
  j->streaming = true;
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
  MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
  return coord_http__queue(j->h, c, 200, r);
}

static void job_meta_init(job_t *j, coord_http_api_t api) {
  coord_http_meta_t *m = &j->meta;
  m->api = api;
  snprintf(m->id, sizeof m->id, "%s-%016llx%08x", api == COORD_HTTP_API_CHAT ? "chatcmpl" : "cmpl",
           (unsigned long long)j->req.sub.id, (unsigned)(fr_now_ns() & 0xffffffffu));
  m->created = (long long)time(NULL);
  m->model = j->h->model;
  m->logprobs = j->req.logprobs;
  m->include_usage = j->req.include_usage;
  m->tok = j->h->tok;
}

/* Opens the RPC connection, submits and waits for the first message.
 * Returns 0 with *first, or NULL for a stream whose first message did not
 * come within a keep-alive period (it starts without); or an error. */
static int job_submit(job_t *j, struct MHD_Connection *c, const proto_msg_t **first) {
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
  int rc = coord_http_rpc_open(&j->rpc, j->h->zmq_ctx, j->h->rpc_endpoint, ci ? ci->connect_fd : -1);
  if (rc) return rc;
  j->req.sub.id = atomic_fetch_add(&j->h->next_job, 1);
  if (j->req.sub.id == 0) j->req.sub.id = atomic_fetch_add(&j->h->next_job, 1);
  if ((rc = coord_http_rpc_submit(&j->rpc, &j->req.sub))) return rc;
  *first = NULL;
  rc = j->req.stream ? job_wait(j, first) : job_wait_msg(j, first);
  return rc < 0 ? rc : 0;
}

int coord_http__job(struct coord_http *h, struct MHD_Connection *c, coord_http_api_t api, const char *body,
                    size_t len, bool http11) {
  coord_http_err_t e;
  job_t *j = fr_calloc(1, sizeof *j);
  j->h = h;
  j->conn = c;
  j->http11 = http11;
  j->rpc.client_fd = -1;
  int rc;
  if (coord_http_req_parse(&j->req, api, body, len, h->model, h->max_model_len, &e)) {
    rc = coord_http__send_error(h, c, &e);
    goto out;
  }
  if (atomic_load(&h->draining) || !atomic_load(&h->ready)) {
    coord_http_err(&e, 503, NULL, atomic_load(&h->draining) ? "the server is draining" : "the workers are not ready");
    rc = coord_http__send_error(h, c, &e);
    goto out;
  }
  const proto_msg_t *m;
  int w = job_submit(j, c, &m);
  job_meta_init(j, api);
  if (w < 0) {
    rc = job_fail(j, c, w);
    goto out;
  }
  if (j->req.stream) return job_answer_stream(j, c, m); /* takes j */
  rc = job_answer_json(j, c, m);
out:
  job_free(j);
  return rc;
}
