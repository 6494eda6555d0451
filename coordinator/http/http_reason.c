/* http_reason.c - the reasoning parsers (qwen3, deepseek_r1): an output
 * split into its think block and its answer as it streams. See
 * http_reason.h. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/http/http_reason.h"

enum { R_START = 0, R_THINK, R_ANSWER };

static const char open_tag[] = "<think>", close_tag[] = "</think>";
#define OPEN_LEN (sizeof open_tag - 1)
#define CLOSE_LEN (sizeof close_tag - 1)

int coord_reason_parser_from_name(const char *name, coord_reason_parser_t *out) {
  if (!name) return -1;
  if (!strcmp(name, "qwen3")) *out = COORD_REASON_PARSER_QWEN3;
  else if (!strcmp(name, "deepseek_r1")) *out = COORD_REASON_PARSER_DEEPSEEK_R1;
  else return -1;
  return 0;
}

const char *coord_reason_parser_name(coord_reason_parser_t p) {
  switch (p) {
  case COORD_REASON_PARSER_QWEN3: return "qwen3";
  case COORD_REASON_PARSER_DEEPSEEK_R1: return "deepseek_r1";
  default: return "none";
  }
}

void coord_reason_stream_init(coord_reason_stream_t *s, coord_reason_parser_t kind) {
  memset(s, 0, sizeof *s);
  s->kind = kind;
}

void coord_reason_stream_free(coord_reason_stream_t *s) {
  free(s->held);
  memset(s, 0, sizeof *s);
}

void coord_reason_out_init(coord_reason_out_t *o) { memset(o, 0, sizeof *o); }

void coord_reason_out_free(coord_reason_out_t *o) {
  free(o->reasoning);
  free(o->content);
  memset(o, 0, sizeof *o);
}

/* Appends n bytes to a NUL-terminated growing buffer. */
static int reason_append(char **buf, size_t *len, size_t *cap, const char *s, size_t n) {
  if (*len + n + 1 > *cap) {
    size_t c = (*len + n + 1) * 2;
    char *p = realloc(*buf, c);
    if (!p) return -ENOMEM;
    *buf = p, *cap = c;
  }
  if (n) memcpy(*buf + *len, s, n);
  *len += n;
  (*buf)[*len] = 0;
  return 0;
}

/* The longest end of b[0..n) that begins tag (shorter than it): what may
 * be a tag cut by the end of the feed. */
static size_t reason_tag_tail(const char *b, size_t n, const char *tag, size_t tag_len) {
  for (size_t k = n < tag_len - 1 ? n : tag_len - 1; k > 0; k--)
    if (!memcmp(b + n - k, tag, k)) return k;
  return 0;
}

static const char *reason_find(const char *b, size_t n, const char *tag, size_t tag_len) {
  for (size_t i = 0; i + tag_len <= n; i++)
    if (b[i] == tag[0] && !memcmp(b + i, tag, tag_len)) return b + i;
  return NULL;
}

/* Before the output is known to open with <think> or not: how many bytes
 * of b the opening tag took (0), or -1 while they may still begin it. */
static long reason_start(coord_reason_stream_t *s, const char *b, size_t n, bool final) {
  if (n < OPEN_LEN && !memcmp(b, open_tag, n) && !final) return -1;
  if (n >= OPEN_LEN && !memcmp(b, open_tag, OPEN_LEN)) {
    s->state = R_THINK, s->thought = true;
    return (long)OPEN_LEN;
  }
  bool r1 = s->kind == COORD_REASON_PARSER_DEEPSEEK_R1; /* its think block opened in the prompt */
  s->state = r1 ? R_THINK : R_ANSWER;
  s->thought = r1;
  return 0;
}

/* Thinking: the reasoning up to </think> (or all but a tag's possible
 * beginning); returns the bytes of b taken, *keep those to hold. */
static int reason_think(coord_reason_stream_t *s, const char *b, size_t n, bool final, coord_reason_out_t *o,
                        size_t *taken, size_t *keep) {
  const char *end = reason_find(b, n, close_tag, CLOSE_LEN);
  if (end) {
    s->state = R_ANSWER;
    *taken = (size_t)(end - b) + CLOSE_LEN, *keep = 0;
    return reason_append(&o->reasoning, &o->reasoning_len, &o->reasoning_cap, b, (size_t)(end - b));
  }
  *keep = final ? 0 : reason_tag_tail(b, n, close_tag, CLOSE_LEN);
  *taken = n - *keep;
  return reason_append(&o->reasoning, &o->reasoning_len, &o->reasoning_cap, b, n - *keep);
}

/* Decides what it can of b[0..n) (the held bytes and the new ones). */
static int reason_decide(coord_reason_stream_t *s, const char *b, size_t n, bool final, coord_reason_out_t *o,
                         size_t *keep) {
  size_t at = 0, taken = 0;
  *keep = 0;
  if (s->state == R_START) {
    long k = reason_start(s, b, n, final);
    if (k < 0) return *keep = n, 0;
    at = (size_t)k;
  }
  if (s->state == R_THINK) {
    int rc = reason_think(s, b + at, n - at, final, o, &taken, keep);
    if (rc || *keep || s->state == R_THINK) return rc;
    at += taken;
  }
  return reason_append(&o->content, &o->content_len, &o->content_cap, b + at, n - at);
}

int coord_reason_stream_feed(coord_reason_stream_t *s, const char *text, size_t n, bool final, coord_reason_out_t *out) {
  out->reasoning_len = out->content_len = 0;
  if (out->reasoning) out->reasoning[0] = 0;
  if (out->content) out->content[0] = 0;
  const char *b = text;
  size_t len = n, keep = 0;
  if (s->held_len) { /* the held bytes come first */
    if (reason_append(&s->held, &s->held_len, &s->held_cap, text, n)) return -ENOMEM;
    b = s->held, len = s->held_len;
  }
  int rc = reason_decide(s, b, len, final, out, &keep);
  out->thought = s->thought;
  if (rc) return rc;
  if (b == s->held) {
    memmove(s->held, s->held + len - keep, keep);
    s->held_len = keep;
    return 0;
  }
  s->held_len = 0;
  return reason_append(&s->held, &s->held_len, &s->held_cap, b + len - keep, keep);
}
