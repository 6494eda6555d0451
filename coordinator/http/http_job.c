/* http_job.c - /v1/completions and /v1/chat/completions: validate the body,
 * submit it over the frontend's RPC connection (one job of the coordinator
 * per choice: prompts x best_of, sequence k of a prompt with seed + k and
 * forking sequence 0's prompt KV) and suspend the request's connection;
 * the loop hands each job the coordinator's messages for its choices, and
 * a job resumes its connection when it has something to send: one JSON
 * object, an error, or SSE chunks as events arrive, with a comment line
 * each keep-alive period that passes without one. A client that hangs up
 * cancels its job (the tick watches the sockets of suspended connections);
 * every other end of a stream is a chunk (the last event's, or an error)
 * and [DONE]. Loop thread only. See http_internal.h. */
#include <errno.h>
#include <poll.h>
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
#include "model/tokenizer.h"

/* SSE text a client has not taken yet, past which its job is canceled and
 * its connection closed (a client that stopped reading a long stream). */
#define JOB_PEND_MAX (64u << 20)

static const char job_done_sse[] = "data: [DONE]\n\n";
static const char job_keepalive_sse[] = ": keep-alive\n\n";

/* One sequence of a request: a job of the coordinator. Prompt p's
 * sequences are choices p * best_of .. p * best_of + best_of - 1. */
struct coord_http_choice {
  coord_http_job_t *job;
  coord_http_choice_t *hnext;  /* in h's table by id while !finished */
  uint64_t id;                 /* the coordinator's job id */
  uint32_t prompt, seq;        /* which prompt; which of its best_of sequences */
  coord_http_acc_t acc;        /* its events folded together (JSON answer; a stream's usage, and the text of
                                * a forced tool choice) */
  uint32_t n_events;           /* events turned into chunks */
  coord_tool_stream_t tools;   /* a stream parsed for tool calls (meta.tool_parser) */
  coord_tool_out_t tool_out;   /* what its last feed decided */
  uint32_t n_calls;            /* tool calls streamed so far */
  float *embd;                 /* (n_embd) an embeddings request: the vector its job returned (owned) */
  uint32_t n_embd;
  coord_reason_stream_t reason; /* a stream's think block split off (meta.reasoning) */
  coord_reason_out_t reason_out; /* what its last feed decided */
  bool finished, in_table;
};

struct coord_http_job {
  struct coord_http *h;
  struct MHD_Connection *conn; /* the request's connection, until job_free */
  int fd;                      /* its socket, watched while it is suspended */
  coord_http_job_t *prev, *next; /* in h's list while !finished */
  coord_http_req_t req;
  coord_http_meta_t meta;
  coord_http_choice_t *choices; /* (n_choices) n_prompts * best_of */
  uint32_t n_choices, n_open;  /* choices; those not finished */
  coord_http_err_t err;        /* the error to answer with (failed) */
  char *pend;                  /* SSE text not yet handed to MHD */
  size_t pend_len, pend_off, pend_cap;
  char **echo;                 /* (n_prompts) echo: each prompt's text, in front of its answers (owned) */
  size_t *echo_len;
  uint64_t t_submit_ns, next_beat_ns;
  bool http11;     /* the request is HTTP/1.1: an interim 1xx answer may be sent */
  bool in_table;   /* submitted, not finished: messages and ticks reach it */
  bool finished;   /* no message will come (last event, error, cancel) */
  bool suspended;  /* its connection is suspended (by us) */
  bool ready;      /* the answer can be queued (JSON in, failed, or the stream starts) */
  bool failed;     /* answer err instead (nothing streamed yet) */
  bool streaming;  /* the SSE answer has started (pend goes out) */
  bool answered;   /* a response is queued */
  bool done;       /* the last chunk and [DONE] are in pend */
  bool gone;       /* the client left: the connection is closed */
  bool client_eof; /* the client's end of stream was seen (and probed) */
};

/* ---- the table of unfinished jobs (a list) and their choices (by id) ---- */

static size_t job_bucket(uint64_t id) { return (size_t)(id % COORD_HTTP_JOB_BUCKETS); }

static void choice_table_remove(struct coord_http *h, coord_http_choice_t *ch) {
  if (!ch->in_table) return;
  for (coord_http_choice_t **pp = &h->job_hash[job_bucket(ch->id)]; *pp; pp = &(*pp)->hnext)
    if (*pp == ch) {
      *pp = ch->hnext;
      break;
    }
  ch->hnext = NULL;
  ch->in_table = false;
}

static void job_table_add(struct coord_http *h, coord_http_job_t *j) {
  j->next = h->jobs;
  if (h->jobs) h->jobs->prev = j;
  h->jobs = j;
  for (uint32_t i = 0; i < j->n_choices; i++) {
    coord_http_choice_t *ch = &j->choices[i], **b = &h->job_hash[job_bucket(ch->id)];
    ch->hnext = *b;
    *b = ch;
    ch->in_table = true;
  }
  h->n_jobs++;
  j->in_table = true;
}

static void job_table_remove(struct coord_http *h, coord_http_job_t *j) {
  if (!j->in_table) return;
  if (j->prev) j->prev->next = j->next;
  else h->jobs = j->next;
  if (j->next) j->next->prev = j->prev;
  for (uint32_t i = 0; i < j->n_choices; i++) choice_table_remove(h, &j->choices[i]);
  j->prev = j->next = NULL;
  h->n_jobs--;
  j->in_table = false;
}

static coord_http_choice_t *choice_find(struct coord_http *h, uint64_t id) {
  for (coord_http_choice_t *ch = h->job_hash[job_bucket(id)]; ch; ch = ch->hnext)
    if (ch->id == id) return ch;
  return NULL;
}

/* No message will come for j: out of the table. */
static void job_finished(coord_http_job_t *j) {
  j->finished = true;
  job_table_remove(j->h, j);
}

/* No message will come for ch; the last one of its job ends the job. */
static void choice_finished(coord_http_choice_t *ch) {
  if (ch->finished) return;
  ch->finished = true;
  choice_table_remove(ch->job->h, ch);
  if (--ch->job->n_open == 0) job_finished(ch->job);
}

/* Sends "cancel" for every unfinished choice of j. */
static void job_cancel(coord_http_job_t *j) {
  if (j->finished) return;
  for (uint32_t i = 0; i < j->n_choices; i++) {
    coord_http_choice_t *ch = &j->choices[i];
    if (ch->finished || !ch->id) continue;
    proto_cancel_t cancel = {.id = ch->id};
    if (coord_http_rpc_send(&j->h->rpc, PROTO_T_CANCEL, &cancel))
      FR_LOGW("HTTP: cannot cancel job %llu: %s", (unsigned long long)ch->id, fr_last_error());
  }
  job_finished(j);
}

/* Lets MHD go on with j's connection (it calls the access handler or the
 * content reader again). */
static void job_wake(coord_http_job_t *j) {
  if (!j->suspended) return;
  j->suspended = false;
  MHD_resume_connection(j->conn);
}

static void job_suspend(coord_http_job_t *j) {
  MHD_suspend_connection(j->conn);
  j->suspended = true;
}

/* The client left: its job is canceled and its connection closed. */
static void job_gone(coord_http_job_t *j) {
  job_cancel(j);
  j->gone = true;
  job_wake(j);
}

void coord_http__job_free(coord_http_job_t *j) {
  if (!j) return;
  if (j->in_table) job_cancel(j);
  for (uint32_t i = 0; i < j->n_choices; i++) {
    coord_http_acc_free(&j->choices[i].acc);
    coord_tool_stream_free(&j->choices[i].tools);
    coord_tool_out_free(&j->choices[i].tool_out);
    free(j->choices[i].embd);
    coord_reason_stream_free(&j->choices[i].reason);
    coord_reason_out_free(&j->choices[i].reason_out);
  }
  for (uint32_t i = 0; j->echo && i < j->req.n_prompts; i++) free(j->echo[i]);
  free(j->echo);
  free(j->echo_len);
  free(j->choices);
  coord_http_req_free(&j->req);
  free(j->pend);
  free(j);
}

/* ---- SSE text ---- */

/* Appends s (n bytes) to pend. Returns 0, or -ENOMEM when the client has
 * let more than JOB_PEND_MAX pile up. */
static int job_pend_add(coord_http_job_t *j, const char *s, size_t n) {
  if (j->pend_off == j->pend_len) j->pend_off = j->pend_len = 0;
  if (j->pend_len - j->pend_off + n > JOB_PEND_MAX)
    return fr_errorf(-ENOMEM, "the client of stream %s does not read", j->meta.id);
  if (j->pend_len + n > j->pend_cap) {
    if (j->pend_off) { /* move the unsent rest to the front first */
      memmove(j->pend, j->pend + j->pend_off, j->pend_len - j->pend_off);
      j->pend_len -= j->pend_off;
      j->pend_off = 0;
    }
    size_t cap = j->pend_cap ? j->pend_cap : 1024;
    while (cap < j->pend_len + n) cap *= 2;
    if (cap != j->pend_cap) j->pend = fr_realloc(j->pend, cap);
    j->pend_cap = cap;
  }
  memcpy(j->pend + j->pend_len, s, n);
  j->pend_len += n;
  return 0;
}

/* Appends a malloc'd string (taken) to pend. */
static int job_pend_take(coord_http_job_t *j, char *s) {
  if (!s) return -ENOMEM;
  int rc = job_pend_add(j, s, strlen(s));
  free(s);
  return rc;
}

/* Appends [DONE]: the stream ends after it. */
static int job_pend_done(coord_http_job_t *j) {
  j->done = true;
  return job_pend_add(j, job_done_sse, sizeof job_done_sse - 1);
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

/* The usage of the answer: each prompt's tokens once (its first
 * sequence's count), the completion tokens of the choices returned
 * (sel[0..n)). */
static proto_usage_t job_usage(const coord_http_job_t *j, coord_http_choice_t *const *sel, size_t n) {
  proto_usage_t u = {0};
  for (uint32_t p = 0; p < j->req.n_prompts; p++) {
    const coord_http_acc_t *a = &j->choices[(size_t)p * j->req.best_of].acc;
    u.prompt_tokens += a->usage.prompt_tokens;
    u.cached_tokens += a->usage.cached_tokens;
  }
  for (size_t i = 0; i < n; i++) {
    const coord_http_acc_t *a = &sel[i]->acc;
    u.completion_tokens += a->has_usage ? a->usage.completion_tokens : a->n_tokens;
  }
  return u;
}

/* The event's text with the parser's marker put back where a control
 * token the detokenizer dropped stood (mistral's [TOOL_CALLS]): after the
 * bytes of the tokens before it. NULL when the event has none (or out of
 * memory: the text as it is). */
static char *job_tool_marked(const coord_http_job_t *j, const proto_event_t *ev, size_t n, size_t *out_n) {
  int32_t marker = j->h->tools.marker;
  uint32_t count = 0;
  for (uint32_t i = 0; marker >= 0 && i < ev->n_tokens; i++) count += ev->tokens[i] == marker;
  if (!count) return NULL;
  static const char mk[] = "[TOOL_CALLS]";
  const char *text = ev->text ? ev->text : "";
  char *t = malloc(n + count * (sizeof mk - 1) + 1);
  if (!t) return NULL;
  size_t at = 0, w = 0, off = 0;
  for (uint32_t i = 0; i < ev->n_tokens; i++) {
    size_t bl = 0;
    if (ev->tokens[i] != marker) {
      if (!model_token_is_control(j->h->tok, ev->tokens[i])) model_token_bytes(j->h->tok, ev->tokens[i], &bl);
      off = off + bl < n ? off + bl : n;
      continue;
    }
    memcpy(t + w, text + at, off - at), w += off - at, at = off;
    memcpy(t + w, mk, sizeof mk - 1), w += sizeof mk - 1;
  }
  memcpy(t + w, text + at, n - at), w += n - at;
  *out_n = w;
  return t;
}

static bool job_tools_on(const coord_http_meta_t *m) {
  return m->tool_parser != COORD_TOOL_PARSER_NONE || m->tool_choice == COORD_TOOL_CHOICE_REQUIRED ||
         m->tool_choice == COORD_TOOL_CHOICE_NAMED;
}

/* The chunks of choice ch's event of a stream whose output becomes tool
 * calls (the event's text: with the parser's marker put back, and the
 * content only when there is a think block): a parsed one feeds the
 * parser; a forced one (required, named) gathers the text and turns it
 * into the calls at the end. */
static char *job_tool_chunks(coord_http_job_t *j, coord_http_choice_t *ch, const proto_event_t *ev, bool first,
                             uint32_t index, const coord_http_think_t *think) {
  const coord_http_meta_t *m = &j->meta;
  size_t n = ev->text ? (ev->text_len ? ev->text_len : strlen(ev->text)) : 0;
  bool last = ev->finish != PROTO_FINISH_NONE;
  int rc;
  if (m->tool_parser != COORD_TOOL_PARSER_NONE) {
    rc = coord_tool_stream_feed(&ch->tools, ev->text ? ev->text : "", n, last, &ch->tool_out);
  } else {
    rc = coord_http_acc_text(&ch->acc, ev->text ? ev->text : "", n);
    coord_tool_out_free(&ch->tool_out);
    if (!rc && last)
      rc = coord_tool_forced_calls(m->tool_choice, m->tool_name, ch->acc.text ? ch->acc.text : "", ch->acc.text_len,
                                   m->tool_seed ^ ch->id, &ch->tool_out);
  }
  if (rc) return NULL;
  char *s = coord_http_chunk_sse_tools(m, ev, first, &ch->tool_out, ch->n_calls, ch->n_calls > 0, index, think);
  ch->n_calls += (uint32_t)ch->tool_out.n_calls;
  return s;
}

/* OpenAI's index of a streamed choice: prompt * n + sequence (a stream has
 * best_of == n). */
static uint32_t choice_index(const coord_http_choice_t *ch) { return ch->prompt * ch->job->req.n + ch->seq; }

/* The event's text split by the reasoning parser: e's text becomes the
 * content, *think the reasoning (both borrowed from ch until its next
 * feed; none when hidden). Returns 0 or -ENOMEM. */
static int job_think(coord_http_choice_t *ch, proto_event_t *e, coord_http_think_t *think, bool hide) {
  size_t n = e->text ? (e->text_len ? e->text_len : strlen(e->text)) : 0;
  coord_reason_out_t *o = &ch->reason_out;
  if (coord_reason_stream_feed(&ch->reason, e->text ? e->text : "", n, e->finish != PROTO_FINISH_NONE, o))
    return fr_errorf(-ENOMEM, "out of memory");
  e->text = o->content ? o->content : "", e->text_len = (uint32_t)o->content_len;
  think->r = o->reasoning, think->r_len = hide ? 0 : o->reasoning_len;
  return 0;
}

/* Appends the SSE chunk of choice ch's event ev (echo: the prompt's text in
 * front of its first; the tool parser's marker put back; the think block
 * split off). */
static int job_chunk_event(coord_http_job_t *j, coord_http_choice_t *ch, const proto_event_t *ev) {
  bool first = ch->n_events++ == 0;
  proto_event_t e = *ev;
  char *joined = NULL, *marked = NULL;
  size_t n = ev->text ? (ev->text_len ? ev->text_len : strlen(ev->text)) : 0, mn = 0;
  if (first && j->echo) {
    size_t el = j->echo_len[ch->prompt];
    joined = fr_malloc(el + n + 1);
    memcpy(joined, j->echo[ch->prompt], el);
    if (n) memcpy(joined + el, ev->text, n);
    e.text = joined, e.text_len = (uint32_t)(el + n);
  }
  if (j->meta.tool_parser != COORD_TOOL_PARSER_NONE &&
      (marked = job_tool_marked(j, &e, e.text ? (e.text_len ? e.text_len : strlen(e.text)) : 0, &mn)))
    e.text = marked, e.text_len = (uint32_t)mn;
  coord_http_think_t think = {0}, *tp = NULL;
  int rc = 0;
  if (j->meta.reasoning != COORD_REASON_PARSER_NONE) rc = job_think(ch, &e, &think, j->meta.hide_reasoning), tp = &think;
  if (!rc)
    rc = job_pend_take(j, job_tools_on(&j->meta) ? job_tool_chunks(j, ch, &e, first, choice_index(ch), tp)
                                                 : coord_http_chunk_sse(&j->meta, &e, first, choice_index(ch), tp));
  free(joined);
  free(marked);
  return rc;
}

/* The stream's end once every choice finished: the usage chunk (when
 * asked) and [DONE]. */
static int job_stream_end(coord_http_job_t *j) {
  if (j->meta.include_usage) {
    coord_http_choice_t **sel = fr_malloc(j->n_choices * sizeof *sel);
    for (uint32_t i = 0; i < j->n_choices; i++) sel[i] = &j->choices[i];
    proto_usage_t u = job_usage(j, sel, j->n_choices);
    free(sel);
    int rc = job_pend_take(j, coord_http_usage_sse(&j->meta, &u));
    if (rc) return rc;
  }
  return job_pend_done(j);
}

/* Ends j before its last event, as vLLM does: a stream with an error chunk
 * and [DONE], an answer not started yet with e's status. */
static void job_fail(coord_http_job_t *j, const coord_http_err_t *e) {
  job_cancel(j);
  if (j->streaming) {
    FR_LOGW("HTTP: stream %s ends early: %s", j->meta.id, e->message);
    if (job_pend_take(j, coord_http_error_sse(e)) || job_pend_done(j)) j->gone = true; /* cannot end it: close */
  } else {
    j->err = *e;
    j->failed = true;
  }
  j->ready = true;
  job_wake(j);
}

/* ---- messages ---- */

/* A stream's message for choice ch. An error ends the whole request: with
 * its status before the stream started, else with an error chunk. */
static void job_on_stream_msg(coord_http_job_t *j, coord_http_choice_t *ch, const proto_msg_t *m) {
  coord_http_err_t e;
  if (job_msg_error(m, &e)) {
    job_fail(j, &e);
    return;
  }
  j->streaming = true;
  const proto_event_t *ev = &m->u.event;
  if (ev->has_usage) ch->acc.has_usage = true, ch->acc.usage = ev->usage;
  int rc = job_chunk_event(j, ch, ev);
  if (!rc && j->finished) rc = job_stream_end(j);
  if (rc) {
    FR_LOGW("HTTP: %s", fr_last_error());
    job_gone(j);
    return;
  }
  j->ready = true;
  job_wake(j);
}

/* Folds an event into choice ch's JSON answer (with the tool parser's
 * marker put back). */
static int job_acc_add(coord_http_job_t *j, coord_http_choice_t *ch, const proto_event_t *ev) {
  size_t n = ev->text ? (ev->text_len ? ev->text_len : strlen(ev->text)) : 0, mn = 0;
  char *marked = j->meta.tool_parser != COORD_TOOL_PARSER_NONE ? job_tool_marked(j, ev, n, &mn) : NULL;
  proto_event_t e = *ev;
  if (marked) e.text = marked, e.text_len = (uint32_t)mn;
  if (j->meta.no_output) { /* max_tokens 0: the one token generated is not part of the answer */
    e.text = NULL, e.text_len = 0, e.n_tokens = e.n_logprobs = e.n_top = 0;
    e.usage.completion_tokens = 0;
  }
  int rc = coord_http_acc_add(&ch->acc, &j->meta, &e);
  free(marked);
  return rc;
}

static void job_on_json_msg(coord_http_job_t *j, coord_http_choice_t *ch, const proto_msg_t *m) {
  coord_http_err_t e;
  if (job_msg_error(m, &e)) {
    job_fail(j, &e);
    return;
  }
  const proto_event_t *ev = &m->u.event;
  if (j->meta.api == COORD_HTTP_API_EMBEDDINGS && ev->n_logits && !ch->embd) { /* its vector, in the logits field */
    ch->embd = fr_malloc((size_t)ev->n_logits * sizeof(float));
    memcpy(ch->embd, ev->logits, (size_t)ev->n_logits * sizeof(float));
    ch->n_embd = ev->n_logits;
  }
  if (job_acc_add(j, ch, ev)) {
    coord_http_err(&e, 500, NULL, "out of memory");
    job_fail(j, &e);
    return;
  }
  if (j->finished) {
    j->ready = true;
    job_wake(j);
  }
}

void coord_http__jobs_on_msg(struct coord_http *h, const proto_msg_t *m) {
  uint64_t id;
  if (m->type == PROTO_T_EVENT) id = m->u.event.id;
  else if (m->type == PROTO_T_ERROR) id = m->u.error.id;
  else return; /* a heartbeat's answer (it refreshed last_rx_ns) */
  coord_http_choice_t *ch = id ? choice_find(h, id) : NULL;
  if (!ch) {
    if (m->type == PROTO_T_ERROR && id == 0) /* submits are encoded as the decoder wants them: not ours */
      FR_LOGW("HTTP: the coordinator answered an error about no job: %s", m->u.error.message);
    return;
  }
  coord_http_job_t *j = ch->job;
  j->next_beat_ns = fr_now_ns() + h->keepalive_ns;
  if (m->type == PROTO_T_ERROR || m->u.event.finish != PROTO_FINISH_NONE) choice_finished(ch);
  if (j->req.stream) job_on_stream_msg(j, ch, m);
  else job_on_json_msg(j, ch, m);
}

/* ---- the tick ---- */

/* The client sent its end of stream: it half-closed and reads on, or it
 * left. Only a write tells them apart (a closed socket answers it with a
 * reset, seen on a later tick as a hang-up), so j writes what the client
 * must ignore: before the answer an interim "100 Continue" (RFC 9110
 * section 15.2: an HTTP/1.1 client parses 1xx answers before the final
 * one; none may go to HTTP/1.0 clients, whose end of stream cancels the
 * job), in an SSE stream a comment line. MHD writes nothing meanwhile: the
 * connection is suspended. */
static void job_probe(coord_http_job_t *j) {
  static const char interim[] = "HTTP/1.1 100 Continue\r\n\r\n";
  j->client_eof = true;
  if (j->streaming) {
    if (job_pend_add(j, ":\n\n", 3)) job_gone(j);
    else job_wake(j);
    return;
  }
  if (j->http11 &&
      send(j->fd, interim, sizeof interim - 1, MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)(sizeof interim - 1))
    return;
  job_gone(j);
}

/* Looks at the sockets of the suspended connections (one poll for all):
 * a hang-up cancels, an end of stream is probed. */
static void jobs_watch(struct coord_http *h) {
  size_t n = 0;
  if (h->watch_cap < h->n_jobs) {
    h->watch_cap = h->n_jobs * 2;
    h->watch = fr_realloc(h->watch, h->watch_cap * sizeof *h->watch);
  }
  for (coord_http_job_t *j = h->jobs; j; j = j->next)
    if (j->suspended && j->fd >= 0) h->watch[n++] = (struct pollfd){.fd = j->fd, .events = POLLRDHUP};
  if (n == 0 || poll(h->watch, n, 0) <= 0) return;
  size_t i = 0;
  for (coord_http_job_t *j = h->jobs, *next; j && i < n; j = next) {
    next = j->next; /* j may leave the table */
    if (!j->suspended || j->fd < 0) continue;
    coord_http_peer_t p = coord_http_peer_of(h->watch[i++].revents);
    if (p == COORD_HTTP_PEER_GONE) job_gone(j);
    else if (p == COORD_HTTP_PEER_EOF && !j->client_eof) job_probe(j);
  }
}

/* A keep-alive period passed without a message for j: a coordinator
 * silent too long ends it; else a waiting stream starts (200) or gets a
 * comment line. Returns true when the coordinator should be pinged. */
static bool job_idle(coord_http_job_t *j, uint64_t now) {
  const struct coord_http *h = j->h;
  uint64_t since = h->rpc.last_rx_ns > j->t_submit_ns ? h->rpc.last_rx_ns : j->t_submit_ns;
  uint64_t silent = now > since ? now - since : 0;
  j->next_beat_ns = now + h->keepalive_ns;
  if (silent > h->engine_timeout_ns) {
    coord_http_err_t e;
    coord_http_err(&e, 503, NULL, "the engine did not answer for %llu s", (unsigned long long)(silent / 1000000000ull));
    job_fail(j, &e);
    return false;
  }
  if (j->req.stream && j->suspended && (j->streaming || !j->ready)) {
    j->streaming = j->ready = true;
    if (job_pend_add(j, job_keepalive_sse, sizeof job_keepalive_sse - 1)) job_gone(j);
    else job_wake(j);
  }
  return true;
}

void coord_http__jobs_tick(struct coord_http *h, uint64_t now) {
  jobs_watch(h);
  bool ping = false;
  for (coord_http_job_t *j = h->jobs, *next; j; j = next) {
    next = j->next;
    if (now >= j->next_beat_ns) ping |= job_idle(j, now);
  }
  /* one heartbeat serves every job: the coordinator's answer is all it asks */
  if (ping && now - h->rpc.last_ping_ns >= h->keepalive_ns / 2 && coord_http_rpc_ping(&h->rpc))
    FR_LOGW("HTTP: heartbeat: %s", fr_last_error());
}

void coord_http__jobs_stop(struct coord_http *h) {
  coord_http_err_t e;
  coord_http_err(&e, 503, NULL, "the server is shutting down");
  while (h->jobs) job_fail(h->jobs, &e); /* job_fail takes it out of the table */
}

/* ---- answers ---- */

/* MHD's content reader: hands out pend; with none, suspends the
 * connection until the loop has more. */
static ssize_t job_read(void *cls, uint64_t pos, char *buf, size_t max) {
  coord_http_job_t *j = cls;
  (void)pos;
  if (j->gone) return MHD_CONTENT_READER_END_WITH_ERROR; /* the client left */
  if (j->pend_off < j->pend_len) {
    size_t n = j->pend_len - j->pend_off < max ? j->pend_len - j->pend_off : max;
    memcpy(buf, j->pend + j->pend_off, n);
    j->pend_off += n;
    return (ssize_t)n;
  }
  if (j->done) return MHD_CONTENT_READER_END_OF_STREAM;
  job_suspend(j);
  return 0;
}

static int job_answer_stream(struct coord_http *h, struct MHD_Connection *c, coord_http_job_t *j) {
  struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, job_read, j, NULL);
  if (!r) return MHD_NO;
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
  MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
  return coord_http__queue(h, c, 200, r);
}

static int choice_by_logprob(const void *a, const void *b) {
  const coord_http_choice_t *x = *(coord_http_choice_t *const *)a, *y = *(coord_http_choice_t *const *)b;
  if (x->acc.cum_logprob != y->acc.cum_logprob) return x->acc.cum_logprob > y->acc.cum_logprob ? -1 : 1;
  return (x->seq > y->seq) - (x->seq < y->seq);
}

/* The JSON body: per prompt its n choices (best_of > n: the n with the
 * highest cumulative logprob, best first, as vLLM returns them). */
static char *job_final_json(coord_http_job_t *j) {
  uint32_t n = j->req.n, bo = j->req.best_of;
  coord_http_choice_t **sel = fr_malloc((size_t)j->req.n_prompts * bo * sizeof *sel);
  for (uint32_t i = 0; i < j->n_choices; i++) sel[i] = &j->choices[i];
  for (uint32_t p = 0; p < j->req.n_prompts && bo > n; p++) {
    qsort(sel + (size_t)p * bo, bo, sizeof *sel, choice_by_logprob);
    memmove(sel + (size_t)p * n, sel + (size_t)p * bo, n * sizeof *sel);
  }
  size_t total = (size_t)j->req.n_prompts * n;
  const coord_http_acc_t **accs = fr_malloc(total * sizeof *accs);
  for (size_t i = 0; i < total; i++) accs[i] = &sel[i]->acc;
  proto_usage_t u = job_usage(j, sel, total);
  char *body = coord_http_final_json(&j->meta, accs, total, &u);
  free(accs);
  free(sel);
  return body;
}

/* An embeddings request's body: every input's vector, or e's error. */
static char *job_embed_json(coord_http_job_t *j, coord_http_err_t *e) {
  float **vecs = fr_malloc(j->n_choices * sizeof *vecs);
  uint32_t *n = fr_malloc(j->n_choices * sizeof *n), tokens = 0;
  char *body = NULL;
  for (uint32_t i = 0; i < j->n_choices; i++) {
    vecs[i] = j->choices[i].embd, n[i] = j->choices[i].n_embd;
    tokens += j->choices[i].acc.usage.prompt_tokens;
    if (!vecs[i]) coord_http_err(e, 500, NULL, "input %u: the engine returned no embedding", i);
    else if (j->req.dimensions && j->req.dimensions != n[i])
      coord_http_err(e, 400, "dimensions", "this model's embeddings have %u dimensions and cannot be shortened "
                                           "(it is not a Matryoshka model); 'dimensions' must be %u or absent", n[i], n[i]);
    else continue;
    goto out;
  }
  body = coord_http_embed_json(j->meta.model, vecs, n, j->n_choices, j->req.base64, tokens);
  if (!body) coord_http_err(e, 500, NULL, "out of memory");
out:
  free(vecs);
  free(n);
  return body;
}

static int job_answer_json(struct coord_http *h, struct MHD_Connection *c, coord_http_job_t *j) {
  coord_http_err_t e;
  char *body = j->meta.api == COORD_HTTP_API_EMBEDDINGS ? job_embed_json(j, &e) : job_final_json(j);
  if (!body && j->meta.api == COORD_HTTP_API_EMBEDDINGS) return coord_http__send_error(h, c, &e);
  struct MHD_Response *r = body ? MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE) : NULL;
  if (!r) {
    free(body);
    return MHD_NO;
  }
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
  return coord_http__queue(h, c, 200, r);
}

int coord_http__job_answer(struct coord_http *h, struct MHD_Connection *c, coord_http_job_t *j) {
  j->suspended = false; /* MHD resumed it */
  if (j->gone) return MHD_NO; /* the client left; MHD closes the connection */
  if (j->answered) return MHD_YES;
  if (!j->ready) {
    job_suspend(j);
    return MHD_YES;
  }
  j->answered = true;
  if (j->failed) return coord_http__send_error(h, c, &j->err);
  return j->req.stream ? job_answer_stream(h, c, j) : job_answer_json(h, c, j);
}

/* ---- intake ---- */

static void job_meta_init(coord_http_job_t *j, coord_http_api_t api) {
  coord_http_meta_t *m = &j->meta;
  m->api = api;
  snprintf(m->id, sizeof m->id, "%s-%016llx%08x",
           api == COORD_HTTP_API_CHAT ? "chatcmpl" : api == COORD_HTTP_API_EMBEDDINGS ? "embd" : "cmpl",
           (unsigned long long)j->req.sub.id, (unsigned)(fr_now_ns() & 0xffffffffu));
  m->created = (long long)time(NULL);
  m->model = j->h->model;
  m->logprobs = j->req.logprobs;
  m->prompt_logprobs = j->req.prompt_logprobs;
  m->echo = j->req.echo;
  m->no_output = j->req.no_output;
  m->include_usage = j->req.include_usage;
  m->tok = j->h->tok;
  m->tool_choice = j->req.tool_choice;
  m->tool_name = j->req.tool_name;
  m->tool_parser = j->req.tool_choice == COORD_TOOL_CHOICE_AUTO ? j->h->tools.parser : COORD_TOOL_PARSER_NONE;
  m->tool_seed = j->req.sub.id ^ fr_now_ns() ^ ((uint64_t)(uintptr_t)j << 17);
  for (uint32_t i = 0; m->tool_parser != COORD_TOOL_PARSER_NONE && i < j->n_choices; i++)
    coord_tool_stream_init(&j->choices[i].tools, m->tool_parser, m->tool_seed ^ j->choices[i].id);
  m->reasoning = api == COORD_HTTP_API_CHAT && !j->req.thinking_off ? j->h->reasoning : COORD_REASON_PARSER_NONE;
  m->hide_reasoning = j->req.hide_reasoning;
  for (uint32_t i = 0; m->reasoning != COORD_REASON_PARSER_NONE && i < j->n_choices; i++)
    coord_reason_stream_init(&j->choices[i].reason, m->reasoning);
}

/* With a reasoning parser the output's constraint (response_format,
 * guided_*, a forced tool choice) holds for the answer after the think
 * block, as vLLM starts the grammar when the reasoning ends: the guide
 * starts after "</think>" (not when enable_thinking is false, whose
 * prompt closed the think block). */
static void job_guide_after_think(const struct coord_http *h, coord_http_req_t *r) {
  static char close_tag[] = "</think>";
  if (r->api != COORD_HTTP_API_CHAT || h->reasoning == COORD_REASON_PARSER_NONE || r->thinking_off ||
      r->sub.guide.kind == PROTO_GUIDE_NONE)
    return;
  r->sub.guide.after = close_tag;
  r->sub.guide.after_len = sizeof close_tag - 1;
}

/* Why no job is taken now (503), or NULL. While a worker restarts, jobs
 * wait in the coordinator's queue, as RPC submits do (coord__precheck):
 * only a server whose workers have never been ready refuses them. */
static const char *job_refusal(const struct coord_http *h) {
  if (atomic_load(&h->stopping)) return "the server is shutting down";
  if (atomic_load(&h->draining)) return "the server is draining";
  if (!atomic_load(&h->was_ready)) return "the workers are not ready";
  return NULL;
}

/* The text of prompt p (a token prompt detokenized) into j->echo[p]. */
static int job_echo_one(coord_http_job_t *j, uint32_t p, coord_http_err_t *e) {
  const coord_http_prompt_t *pr = &j->req.prompts[p];
  if (pr->text) {
    j->echo[p] = fr_malloc(pr->text_len + 1);
    memcpy(j->echo[p], pr->text, pr->text_len);
    j->echo_len[p] = pr->text_len;
    return 0;
  }
  if (!j->h->tok) return coord_http_err(e, 400, "echo", "'echo' of a token prompt needs the server's tokenizer");
  model_detok_t d;
  model_detok_init(&d, j->h->tok, false);
  size_t cap = 4096 + (size_t)pr->n_ids * 8, len = 0;
  char *out = fr_malloc(cap);
  for (uint32_t i = 0; i < pr->n_ids; i++) {
    if (cap - len < 2048) out = fr_realloc(out, cap *= 2); /* > 4 * (longest token + 4) */
    int w = model_detok_feed(&d, pr->ids[i], out + len, cap - len);
    if (w > 0) len += (size_t)w;
  }
  int w = model_detok_flush(&d, out + len, cap - len);
  if (w > 0) len += (size_t)w;
  j->echo[p] = out;
  j->echo_len[p] = len;
  return 0;
}

/* echo: each prompt's text goes in front of its answers: into the JSON
 * answer now, into the first chunk of each choice of a stream. */
static int job_echo_init(coord_http_job_t *j, coord_http_err_t *e) {
  j->echo = fr_calloc(j->req.n_prompts, sizeof *j->echo);
  j->echo_len = fr_calloc(j->req.n_prompts, sizeof *j->echo_len);
  for (uint32_t p = 0; p < j->req.n_prompts; p++)
    if (job_echo_one(j, p, e)) return -1;
  for (uint32_t i = 0; i < j->n_choices && !j->req.stream; i++) {
    coord_http_choice_t *ch = &j->choices[i];
    if (coord_http_acc_text(&ch->acc, j->echo[ch->prompt], j->echo_len[ch->prompt]))
      return coord_http_err(e, 500, NULL, "out of memory");
  }
  return 0;
}

/* The request's sequences: best_of per prompt, each its own job with its
 * own id. Sequence k of a prompt draws with seed + k (vLLM's rule for n > 1,
 * so seeded n = 4 answers as 4 requests seeded seed .. seed + 3) and forks
 * sequence 0's prompt KV. */
static void job_choices_init(coord_http_job_t *j) {
  j->n_choices = j->n_open = j->req.n_prompts * j->req.best_of;
  j->choices = fr_calloc(j->n_choices, sizeof *j->choices);
  for (uint32_t i = 0; i < j->n_choices; i++) {
    coord_http_choice_t *ch = &j->choices[i];
    ch->job = j;
    ch->prompt = i / j->req.best_of;
    ch->seq = i % j->req.best_of;
    coord_http_acc_init(&ch->acc);
    if (++j->h->next_job == 0) ++j->h->next_job;
    ch->id = j->h->next_job;
  }
}

/* Submits every sequence; on a failure those sent are canceled. */
static int job_submit_all(coord_http_job_t *j) {
  proto_submit_t *sub = &j->req.sub;
  uint64_t seed = sub->sp.seed;
  for (uint32_t i = 0; i < j->n_choices; i++) {
    coord_http_choice_t *ch = &j->choices[i];
    coord_http_req_prompt(&j->req, ch->prompt);
    sub->id = ch->id;
    sub->sp.seed = seed + ch->seq;
    sub->ph.fork_of = ch->seq ? j->choices[i - ch->seq].id : 0;
    if (coord_http_rpc_send(&j->h->rpc, PROTO_T_SUBMIT, sub)) {
      for (uint32_t k = i; k < j->n_choices; k++) j->choices[k].id = 0; /* never sent: no cancel */
      job_cancel(j);
      return -1;
    }
  }
  sub->id = j->choices[0].id;
  sub->sp.seed = seed;
  return 0;
}

int coord_http__job(struct coord_http *h, struct MHD_Connection *c, coord_http_api_t api, const char *body,
                    size_t len, bool http11, coord_http_job_t **job) {
  coord_http_err_t e;
  coord_http_job_t *j = fr_calloc(1, sizeof *j);
  j->h = h;
  j->conn = c;
  j->http11 = http11;
  *job = NULL;
  int rc;
  const char *no;
  if (coord_http_req_parse(&j->req, api, body, len, h->model, h->max_model_len, &e)) {
    rc = coord_http__send_error(h, c, &e);
    goto out;
  }
  if (api == COORD_HTTP_API_CHAT && coord_tool_req_check(&j->req, &h->tools, &e)) {
    rc = coord_http__send_error(h, c, &e);
    goto out;
  }
  job_guide_after_think(h, &j->req);
  if ((no = job_refusal(h))) {
    coord_http_err(&e, 503, NULL, "%s", no);
    rc = coord_http__send_error(h, c, &e);
    goto out;
  }
  job_choices_init(j);
  if (j->req.echo && job_echo_init(j, &e)) {
    rc = coord_http__send_error(h, c, &e);
    goto out;
  }
  j->req.sub.id = j->choices[0].id;
  job_meta_init(j, api);
  job_table_add(h, j); /* before the submits: a failed one cancels the others (job_cancel) */
  if (job_submit_all(j)) {
    coord_http_err(&e, 500, NULL, "engine connection failed: %s", fr_last_error());
    rc = coord_http__send_error(h, c, &e);
    goto out;
  }
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
  j->fd = ci ? ci->connect_fd : -1;
  j->t_submit_ns = fr_now_ns();
  j->next_beat_ns = j->t_submit_ns + h->keepalive_ns;
  job_suspend(j);
  *job = j;
  return MHD_YES;
out:
  coord_http__job_free(j);
  return rc;
}
