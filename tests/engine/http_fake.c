/* http_fake.c - see http_fake.h. */
#include "tests/engine/http_fake.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

typedef struct {
  http_fake_t *f;
  void *sock;
  zmq_msg_t ident;
  const void *to; /* the routing id messages go to: the sender's, or a held job's */
  size_t to_len;
  proto_buf_t buf;
} fake_io_t;

static void fake_send(fake_io_t *io, proto_type_t t, const void *body) {
  if (proto_encode(&io->buf, t, body)) {
    fprintf(stderr, "fake: encode failed\n");
    abort();
  }
  zmq_send(io->sock, io->to, io->to_len, ZMQ_SNDMORE);
  zmq_send(io->sock, io->buf.data, io->buf.len, 0);
}

static void fake_error(fake_io_t *io, uint64_t id, int code, const char *msg) {
  proto_error_msg_t e = {.code = code, .message = (char *)msg, .id = id};
  fake_send(io, PROTO_T_ERROR, &e);
}

/* One event of i-th piece; n pieces in all when final. */
static void fake_event(fake_io_t *io, const proto_submit_t *s, const char *text, uint32_t text_len, int32_t *toks,
                       uint32_t n, proto_finish_t fin) {
  float lps[3] = {-0.5f, -1.0f, -1.5f};
  proto_toplp_t top[3 * 2] = {{100, -0.1f}, {101, -2.f}, {102, -0.2f}, {103, -3.f}, {104, -0.3f}, {105, -4.f}};
  proto_event_t ev = {.id = s->id, .text = (char *)text, .text_len = text_len, .n_tokens = n, .tokens = toks,
                      .finish = fin};
  if (s->sp.logprobs >= 0) {
    ev.n_logprobs = n, ev.logprobs = lps;
    uint32_t k = s->sp.logprobs > 2 ? 2 : (uint32_t)s->sp.logprobs;
    if (k) { /* pack (n, k) from the (3, 2) table */
      static proto_toplp_t packed[6];
      for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < k; j++) packed[i * k + j] = top[i * 2 + j];
      ev.top_n = k, ev.n_top = n * k, ev.top = packed;
    }
  }
  if (fin != PROTO_FINISH_NONE) ev.has_usage = true, ev.usage = (proto_usage_t){5, 3, 0};
  if (fin == PROTO_FINISH_ERROR) ev.error = (proto_error_t){500, "worker died"};
  fake_send(io, PROTO_T_EVENT, &ev);
}

static void fake_answer(fake_io_t *io, const proto_submit_t *s) {
  /* a streamed token-id prompt that ignores EOS (what `ferrumctl bench`
   * sends) gets a NUL byte in its text, as random weights can produce */
  const bool nul = !s->prompt && s->n_tokens && s->stop.ignore_eos && s->stream;
  const char *pieces[3] = {"Hel", nul ? "l\0o" : "lo", " world"};
  const uint32_t lens[3] = {3, nul ? 3 : 2, 6};
  int32_t toks[3] = {11, 12, 13};
  proto_finish_t fin = s->max_tokens == 3 ? PROTO_FINISH_LENGTH : PROTO_FINISH_STOP;
  if (!s->stream) {
    fake_event(io, s, "Hello world", 0, toks, 3, fin);
    return;
  }
  for (int i = 0; i < 3; i++) fake_event(io, s, pieces[i], lens[i], toks + i, 1, i == 2 ? fin : PROTO_FINISH_NONE);
}

static uint64_t fake_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t fake_quiet_ns(const http_fake_t *f) { return (uint64_t)(f->quiet_ms ? f->quiet_ms : 1500) * 1000000ull; }

/* Keeps a job to answer later from fake_held_tick. */
static void fake_hold(fake_io_t *io, const proto_submit_t *s, bool bulk) {
  for (int i = 0; i < 8; i++) {
    http_fake_held_t *h = &io->f->held[i];
    if (h->phase || io->to_len > sizeof h->ident) continue;
    memcpy(h->ident, io->to, io->to_len);
    h->ident_len = io->to_len;
    h->sub = (proto_submit_t){.id = s->id, .stream = s->stream, .max_tokens = s->max_tokens, .sp = s->sp};
    h->due_ns = fake_now_ns() + fake_quiet_ns(io->f);
    h->phase = 1;
    h->bulk = bulk;
    return;
  }
  fake_error(io, s->id, PROTO_ERR_BUSY, "the fake holds 8 jobs already");
}

/* "bulk": one big event now, the rest on release. */
static void fake_bulk(fake_io_t *io, const proto_submit_t *s) {
  char *text = malloc(HTTP_FAKE_BULK_BYTES);
  int32_t tok = 11;
  memset(text, 'a', HTTP_FAKE_BULK_BYTES);
  fake_event(io, s, text, HTTP_FAKE_BULK_BYTES, &tok, 1, PROTO_FINISH_NONE);
  free(text);
  fake_hold(io, s, true);
}

/* Sends the next piece of a held job when it is due. */
static void fake_held_step(fake_io_t *io, http_fake_held_t *h) {
  int32_t toks[3] = {11, 12, 13};
  const proto_submit_t *s = &h->sub;
  io->to = h->ident, io->to_len = h->ident_len;
  if (h->bulk) {
    if (!atomic_load(&io->f->release)) return;
    fake_event(io, s, " world", 6, toks + 2, 1, PROTO_FINISH_STOP);
    h->phase = 0;
    atomic_store(&io->f->released, 1);
    return;
  }
  if (fake_now_ns() < h->due_ns) return;
  if (h->phase == 1) { /* the first quiet period is over */
    if (s->stream) fake_event(io, s, "Hel", 3, toks, 1, PROTO_FINISH_NONE);
    h->due_ns += fake_quiet_ns(io->f);
    h->phase = 2;
    return;
  }
  if (s->stream) {
    fake_event(io, s, "lo", 2, toks + 1, 1, PROTO_FINISH_NONE);
    fake_event(io, s, " world", 6, toks + 2, 1, PROTO_FINISH_STOP);
  } else {
    fake_event(io, s, "Hello world", 11, toks, 3, PROTO_FINISH_STOP);
  }
  h->phase = 0;
}

static void fake_held_tick(fake_io_t *io) {
  for (int i = 0; i < 8; i++)
    if (io->f->held[i].phase) fake_held_step(io, &io->f->held[i]);
}

static const char *fake_text(const proto_submit_t *s) {
  if (s->prompt) return s->prompt;
  if (s->n_messages) return s->messages[s->n_messages - 1].content;
  return "";
}

static void fake_record(http_fake_t *f, const proto_submit_t *s) {
  pthread_mutex_lock(&f->mu);
  f->sp = s->sp;
  f->max_tokens = s->max_tokens, f->n_stop = s->stop.n_strs, f->n_stop_ids = s->stop.n_ids;
  f->n_tokens = s->n_tokens, f->n_messages = s->n_messages;
  f->sum_tokens += s->n_tokens, f->sum_max_tokens += s->max_tokens;
  snprintf(f->stop0, sizeof f->stop0, "%s", s->stop.n_strs ? s->stop.strs[0] : "");
  f->token0 = s->n_tokens ? s->tokens[0] : -1;
  f->ignore_eos = s->stop.ignore_eos, f->stream = s->stream;
  pthread_mutex_unlock(&f->mu);
  atomic_store(&f->last_job, s->id);
  atomic_fetch_add(&f->n_submits, 1);
}

static void fake_submit(fake_io_t *io, const proto_submit_t *s) {
  fake_record(io->f, s);
  const char *t = fake_text(s);
  int32_t tok = 11;
  if (!strcmp(t, "busy")) fake_error(io, s->id, PROTO_ERR_BUSY, "the queue is full");
  else if (!strcmp(t, "long")) fake_error(io, s->id, PROTO_ERR_BAD_REQUEST, "prompt is longer than the context");
  else if (!strcmp(t, "hang")) return;
  else if (!strcmp(t, "slow")) fake_event(io, s, "Hel", 0, &tok, 1, PROTO_FINISH_NONE);
  else if (!strcmp(t, "boom")) {
    fake_event(io, s, "Hel", 0, &tok, 1, PROTO_FINISH_NONE);
    fake_event(io, s, "", 0, NULL, 0, PROTO_FINISH_ERROR);
  } else if (!strcmp(t, "delay")) {
    usleep(1500 * 1000);
    fake_answer(io, s);
  } else if (!strcmp(t, "quiet")) {
    fake_hold(io, s, false);
  } else if (!strcmp(t, "bulk") && s->stream) {
    fake_bulk(io, s);
  } else
    fake_answer(io, s);
}

static void fake_handle(fake_io_t *io, proto_msg_t *m) {
  zmq_msg_t body;
  zmq_msg_init(&body);
  if (zmq_msg_recv(&body, io->sock, 0) < 0) return;
  int rc = proto_msg_decode(m, zmq_msg_data(&body), zmq_msg_size(&body), PROTO_ACCEPT_FROM_CLIENT);
  zmq_msg_close(&body);
  if (rc) {
    fake_error(io, 0, PROTO_ERR_BAD_REQUEST, "undecodable");
    return;
  }
  if (m->type == PROTO_T_SUBMIT) fake_submit(io, &m->u.submit);
  if (m->type == PROTO_T_CANCEL) {
    atomic_store(&io->f->last_cancel, m->u.cancel.id);
    atomic_fetch_add(&io->f->n_cancels, 1);
    for (int i = 0; i < 8; i++)
      if (io->f->held[i].phase && io->f->held[i].sub.id == m->u.cancel.id) io->f->held[i].phase = 0;
  }
  if (m->type == PROTO_T_HEARTBEAT && !atomic_load(&io->f->deaf)) {
    atomic_fetch_add(&io->f->n_beats, 1);
    proto_heartbeat_t hb = {.rank = -1, .seq = m->u.heartbeat.seq, .ts_ns = fake_now_ns()};
    fake_send(io, PROTO_T_HEARTBEAT, &hb);
  }
}

static void *fake_main(void *arg) {
  fake_io_t io = {.f = arg, .sock = ((http_fake_t *)arg)->ctx};
  proto_msg_t m;
  proto_msg_init(&m);
  proto_buf_init(&io.buf);
  io.sock = zmq_socket(io.f->ctx, ZMQ_ROUTER);
  int linger = 0;
  zmq_setsockopt(io.sock, ZMQ_LINGER, &linger, sizeof linger);
  zmq_bind(io.sock, io.f->endpoint);
  while (!atomic_load(&io.f->stop)) {
    fake_held_tick(&io);
    zmq_pollitem_t it = {.socket = io.sock, .events = ZMQ_POLLIN};
    if (zmq_poll(&it, 1, 20) <= 0) continue;
    zmq_msg_init(&io.ident);
    if (zmq_msg_recv(&io.ident, io.sock, 0) >= 0) {
      io.to = zmq_msg_data(&io.ident), io.to_len = zmq_msg_size(&io.ident);
      fake_handle(&io, &m);
    }
    zmq_msg_close(&io.ident);
  }
  zmq_close(io.sock);
  proto_msg_free(&m);
  proto_buf_free(&io.buf);
  return NULL;
}

int http_fake_start(http_fake_t *f, void *ctx, const char *endpoint) {
  memset(f, 0, sizeof *f);
  f->ctx = ctx;
  f->endpoint = endpoint;
  pthread_mutex_init(&f->mu, NULL);
  return pthread_create(&f->thread, NULL, fake_main, f);
}

void http_fake_stop(http_fake_t *f) {
  atomic_store(&f->stop, 1);
  pthread_join(f->thread, NULL);
}
