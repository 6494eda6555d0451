/* detok_stream.c - a job's output: incremental detokenization (UTF-8 safe,
 * model_detok_t), stop strings (text that may be the start of a stop string
 * is held back until it is known not to be one), and the events sent to
 * the client (each token batch when streaming, one event at the end
 * otherwise). */
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_log.h"
#include "common/fr_util.h"
#include "coordinator/coord_impl.h"

static void coord__text_append(coord_job_t *j, const char *s, size_t n) {
  if (n == 0) return;
  if (j->text_len + n + 1 > j->text_cap) {
    j->text_cap = FR_MAX(j->text_cap * 2, j->text_len + n + 256);
    j->text = fr_realloc(j->text, j->text_cap);
  }
  memcpy(j->text + j->text_len, s, n);
  j->text_len += n;
  j->text[j->text_len] = 0;
}

/* Is token k of the output the one that stopped the job (EOS, stop id)?
 * Its text is not part of the output. */
static bool coord__is_stop_token(const coord_t *c, const coord_job_t *j, int k) {
  if (j->finish != PROTO_FINISH_STOP || k != j->n_tok - j->n_prompt - 1) return false;
  int32_t t = j->tok[j->n_prompt + k];
  if (!j->ignore_eos && model_token_is_eog(c->tok, t)) return true;
  for (uint32_t i = 0; i < j->n_stop_ids; i++)
    if (j->stop_ids[i] == t) return true;
  return false;
}

static void coord__detok_new(coord_t *c, coord_job_t *j) {
  static char buf[16384];
  int n_out = j->n_tok - j->n_prompt;
  for (; j->out_done < n_out; j->out_done++) {
    if (coord__is_stop_token(c, j, j->out_done)) continue;
    int w = model_detok_feed(&j->detok, j->tok[j->n_prompt + j->out_done], buf, sizeof buf);
    if (w > 0) coord__text_append(j, buf, (size_t)w);
  }
  if (j->finish != PROTO_FINISH_NONE) {
    int w = model_detok_flush(&j->detok, buf, sizeof buf);
    if (w > 0) coord__text_append(j, buf, (size_t)w);
  }
}

/* The first stop string in the unsent text that ends past j->stop_from
 * (text from before min_tokens outputs is not searched, as vLLM): its
 * offset in *at, its length in *len, the string in *stop; false when
 * there is none. */
static bool coord__stop_find(const coord_job_t *j, size_t *at, size_t *len, const char **stop) {
  size_t best = SIZE_MAX, best_len = 0;
  uint32_t which = 0;
  for (uint32_t i = 0; i < j->n_stop; i++) {
    size_t sl = strlen(j->stop[i]), from = j->stop_from >= sl ? j->stop_from - sl + 1 : 0;
    if (from >= j->text_len) continue;
    const char *p = memmem(j->text + from, j->text_len - from, j->stop[i], sl);
    if (p && (size_t)(p - j->text) < best) best = (size_t)(p - j->text), best_len = sl, which = i;
  }
  *at = best, *len = best_len;
  if (best != SIZE_MAX) *stop = j->stop[which];
  return best != SIZE_MAX;
}

/* Finds the first stop string in the unsent text: cuts the text there (or
 * after it, include_stop_str_in_output) and finishes the job. Returns the
 * bytes that may be sent now (the rest may be the start of a stop string). */
static size_t coord__stop_strings(coord_t *c, coord_job_t *j) {
  if (j->n_stop == 0 || j->text_len == 0) return j->text_len;
  if (j->n_tok - j->n_prompt < (int)j->sp.min_tokens) { /* not looked for yet */
    j->stop_from = j->text_len;
    return j->text_len;
  }
  size_t at, len;
  const char *which;
  if (coord__stop_find(j, &at, &len, &which)) {
    if (j->finish == PROTO_FINISH_NONE) j->stop_str = which;
    j->text_len = j->include_stop ? at + len : at;
    j->text[j->text_len] = 0;
    coord__job_finish(c, j, PROTO_FINISH_STOP);
    return j->text_len;
  }
  if (j->finish != PROTO_FINISH_NONE) return j->text_len;
  size_t hold = 0; /* longest suffix that is a proper prefix of a stop string */
  for (uint32_t i = 0; i < j->n_stop; i++) {
    size_t sl = strlen(j->stop[i]);
    for (size_t k = FR_MIN(sl - 1, j->text_len); k > hold; k--)
      if (!memcmp(j->text + j->text_len - k, j->stop[i], k)) {
        hold = k;
        break;
      }
  }
  return j->text_len - hold;
}

static void coord__event_fill(coord_t *c, coord_job_t *j, proto_event_t *e, size_t n_text) {
  int n_out = j->n_tok - j->n_prompt;
  int from = j->out_sent, n = n_out - from;
  proto_body_default(PROTO_T_EVENT, e);
  e->id = j->id;
  e->text = n_text ? j->text : NULL;
  e->text_len = (uint32_t)n_text;
  e->n_tokens = (uint32_t)n;
  e->tokens = j->tok + j->n_prompt + from;
  if (j->lp) {
    e->n_logprobs = (uint32_t)n;
    e->logprobs = j->lp + from;
    if (j->top_n > 0) {
      e->top_n = (uint32_t)j->top_n;
      e->n_top = (uint32_t)(n * j->top_n);
      e->top = j->top + (size_t)from * (size_t)j->top_n;
    }
  }
  if (j->return_logits && j->logits) {
    e->n_logits = (uint32_t)((size_t)n * (size_t)c->vocab);
    e->logits = j->logits; /* rows from out_sent on */
  }
  if (j->embd) {
    e->n_embd = j->n_embd;
    e->embd = j->embd;
  }
  if (j->finish != PROTO_FINISH_NONE) {
    e->finish = j->finish;
    e->has_usage = true;
    e->usage = (proto_usage_t){.prompt_tokens = (uint32_t)j->n_prompt,
                               .completion_tokens = (uint32_t)n_out,
                               .cached_tokens = j->n_cached};
    if (j->finish == PROTO_FINISH_STOP) {
      e->stop_str = (char *)j->stop_str;
      e->stop_id = j->stop_str ? -1 : j->stop_id;
    }
    if (j->finish == PROTO_FINISH_ERROR) {
      e->error.code = j->error_code ? j->error_code : PROTO_ERR_INTERNAL;
      e->error.message = (char *)(j->error_msg ? j->error_msg : "the step failed");
    }
  }
}

void coord__stream_stop_check(coord_t *c, coord_job_t *j) {
  if (j->finish_sent || j->n_stop == 0 || j->finish != PROTO_FINISH_NONE) return;
  coord__detok_new(c, j);
  coord__stop_strings(c, j);
  if (j->finish == PROTO_FINISH_NONE) return;
  char rest[64]; /* bytes the detokenizer holds come after the cut: dropped, as without speculation */
  while (model_detok_flush(&j->detok, rest, sizeof rest) > 0) {}
}

void coord__stream_job(coord_t *c, coord_job_t *j) {
  if (j->finish_sent) return;
  coord__detok_new(c, j);
  size_t ready = coord__stop_strings(c, j);
  bool done = j->finish != PROTO_FINISH_NONE;
  int n_new = j->n_tok - j->n_prompt - j->out_sent;
  if (!done && (!j->stream || (ready == 0 && n_new == 0))) return;
  proto_event_t e;
  coord__event_fill(c, j, &e, ready);
  int rc = coord__rpc_send(c, &j->peer, PROTO_T_EVENT, &e);
  if (rc == FR_EDEAD) {
    FR_LOGI("job %llu: client gone, canceling", (unsigned long long)j->id);
    coord__job_finish(c, j, PROTO_FINISH_CANCEL);
    j->finish_sent = true;
    return;
  }
  if (rc) FR_LOGE("job %llu: event: %s", (unsigned long long)j->id, fr_last_error());
  j->out_sent = j->n_tok - j->n_prompt;
  if (j->text) {
    memmove(j->text, j->text + ready, j->text_len - ready);
    j->text_len -= ready;
    j->stop_from = j->stop_from > ready ? j->stop_from - ready : 0;
    j->text[j->text_len] = 0;
  }
  if (done) j->finish_sent = true;
}
