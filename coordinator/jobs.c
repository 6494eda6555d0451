/* jobs.c - job intake (validation, tokenization), lookup, lifetime. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_log.h"
#include "common/fr_util.h"
#include "coordinator/coord_impl.h"
#include "coordinator/metrics.h"

/* Text longer than this many bytes per token of context is refused before
 * it is tokenized: no tokenizer packs more than a few dozen bytes in a
 * token, so it could not fit. */
#define COORD_MAX_PROMPT_BYTES_PER_TOKEN 64

/* ---- lookup ---------------------------------------------------------------- */

static size_t coord__hash_idx(const coord_t *c, uint64_t id) {
  return (size_t)((id * 0x9e3779b97f4a7c15ull) >> 20) & (c->hash_cap - 1);
}

static void coord__hash_insert(coord_t *c, coord_job_t *j) {
  size_t h = coord__hash_idx(c, j->id);
  j->hnext = c->hash[h];
  c->hash[h] = j;
}

static void coord__hash_remove(coord_t *c, coord_job_t *j) {
  for (coord_job_t **pp = &c->hash[coord__hash_idx(c, j->id)]; *pp; pp = &(*pp)->hnext)
    if (*pp == j) {
      *pp = j->hnext;
      return;
    }
}

static bool coord__same_peer(const coord_peer_t *a, const coord_peer_t *b) {
  return a->inproc == b->inproc && a->len == b->len && !memcmp(a->id, b->id, a->len);
}

/* The unfinished job with this id from peer p; with p NULL, the only
 * unfinished job with the id from anyone (ferrumctl cancel runs on another
 * connection), or NULL when there is none or more than one. */
coord_job_t *coord__job_find(coord_t *c, const coord_peer_t *p, uint64_t id) {
  coord_job_t *any = NULL;
  int n_any = 0;
  for (coord_job_t *j = c->hash[coord__hash_idx(c, id)]; j; j = j->hnext) {
    if (j->id != id || j->finish != PROTO_FINISH_NONE) continue;
    if (p && coord__same_peer(&j->peer, p)) return j;
    any = j, n_any++;
  }
  return !p && n_any == 1 ? any : NULL;
}

/* ---- lifetime --------------------------------------------------------------- */

static void coord__job_destroy(coord_job_t *j) {
  coord__guide_free(j);
  for (uint32_t i = 0; i < j->n_stop; i++) free(j->stop[i]);
  free(j->stop);
  free(j->stop_ids);
  free(j->bias);
  free(j->ban);
  free(j->tok);
  free(j->lp);
  free(j->top);
  free(j->logits);
  free(j->embd);
  free(j->text);
  free(j->plp), free(j->plp_rank), free(j->plp_top);
  free(j);
}

bool coord__job_reap(coord_t *c, coord_job_t *j) {
  if (j->state != COORD_JOB_DONE || j->in_step || j->tokenizing || !j->finish_sent) return false;
  coord_sched_remove(&c->sched, j);
  coord__hash_remove(c, j);
  coord__job_destroy(j);
  return true;
}

static void coord__metrics_finish(coord_t *c, coord_job_t *j, proto_finish_t why) {
  if (!c->metrics) return;
  coord_metrics_finish_t f = why == PROTO_FINISH_STOP     ? COORD_METRICS_FINISH_STOP
                             : why == PROTO_FINISH_LENGTH ? COORD_METRICS_FINISH_LENGTH
                                                          : COORD_METRICS_FINISH_ABORT;
  coord_metrics_request_finish(c->metrics, f);
  coord_metrics_e2e(c->metrics, (fr_now_ns() - j->t_arrival_ns) / 1e9);
}

/* j ended: it waits on no fork, and the jobs that wait on it are admitted
 * as any job (a scan of the table, only when some wait). */
static void coord__job_unfork_all(coord_t *c, coord_job_t *j) {
  coord_sched_unfork(j);
  for (size_t h = 0; h < c->hash_cap && j->fork_waiters > 0; h++)
    for (coord_job_t *w = c->hash[h]; w; w = w->hnext)
      if (w->fork == j) coord_sched_unfork(w);
}

void coord__job_finish(coord_t *c, coord_job_t *j, proto_finish_t why) {
  if (j->finish != PROTO_FINISH_NONE) return;
  j->finish = why;
  coord__job_unfork_all(c, j);
  coord_sched_remove(&c->sched, j); /* the slot stays until a step that holds it returns */
  coord__metrics_finish(c, j, why);
}

void coord__job_fail(coord_t *c, coord_job_t *j, int32_t code, const char *msg) {
  if (j->finish != PROTO_FINISH_NONE) return;
  j->error_code = code;
  j->error_msg = msg;
  coord__job_finish(c, j, PROTO_FINISH_ERROR);
}

void coord__jobs_cancel_fd(coord_t *c, int fd, uint32_t conn) {
  if (fd < 0) return;
  for (size_t h = 0; h < c->hash_cap; h++)
    for (coord_job_t *j = c->hash[h], *next; j; j = next) {
      next = j->hnext;
      if (j->peer.inproc || j->peer.fd != fd || j->peer.conn != conn || j->finish != PROTO_FINISH_NONE) continue;
      FR_LOGI("job %llu: client disconnected, canceling", (unsigned long long)j->id);
      coord__job_finish(c, j, PROTO_FINISH_CANCEL);
      j->finish_sent = true; /* nobody to tell */
      coord__job_reap(c, j);
    }
}

void coord__jobs_destroy(coord_t *c) {
  for (size_t h = 0; h < c->hash_cap; h++)
    while (c->hash[h]) {
      coord_job_t *j = c->hash[h];
      c->hash[h] = j->hnext;
      coord__job_destroy(j);
    }
}

/* ---- tokens ------------------------------------------------------------------ */

/* Keeps the logits row of output token k until its event is sent: rows
 * from out_sent on, so a stream holds one or two rows, not max_tokens. */
static void coord__job_logits_row(coord_t *c, coord_job_t *j, int k, const float *row) {
  size_t V = (size_t)c->vocab, r = (size_t)(k - j->out_sent);
  if (r >= j->logits_cap) {
    j->logits_cap = FR_MAX(r + 1, 2 * j->logits_cap);
    j->logits = fr_realloc(j->logits, j->logits_cap * V * sizeof(float));
  }
  if (row) memcpy(j->logits + r * V, row, V * sizeof(float));
  else memset(j->logits + r * V, 0, V * sizeof(float)); /* the worker kept none */
}

void coord__job_append(coord_t *c, coord_job_t *j, const proto_result_item_t *ri, const float *logits_row) {
  int32_t t = ri->token;
  int k = j->n_tok - j->n_prompt; /* output index of this token */
  if (t < 0 || t >= c->vocab || k >= j->max_tokens || j->n_tok >= j->cap) {
    FR_LOGE("job %llu: bad token %d from the worker", (unsigned long long)j->id, t);
    coord__job_finish(c, j, PROTO_FINISH_ERROR);
    return;
  }
  j->tok[j->n_tok++] = t;
  coord__guide_advance(c, j, t);
  if (j->lp) j->lp[k] = ri->logprob;
  if (j->top && j->top_n > 0)
    for (int i = 0; i < j->top_n; i++)
      j->top[(size_t)k * (size_t)j->top_n + (size_t)i] =
          i < (int)ri->n_top ? ri->top[i] : (proto_toplp_t){.token = -1, .logprob = -INFINITY};
  if (j->return_logits) coord__job_logits_row(c, j, k, logits_row);
  uint64_t now = fr_now_ns();
  if (c->metrics) {
    if (k == 0) coord_metrics_ttft(c->metrics, (now - j->t_arrival_ns) / 1e9);
    else coord_metrics_itl(c->metrics, (now - j->t_last_ns) / 1e9);
    coord_metrics_tokens(c->metrics, 0, 1);
  }
  if (k == 0) j->t_first_ns = now;
  j->t_last_ns = now;
  bool stop = !j->ignore_eos && model_token_is_eog(c->tok, t);
  for (uint32_t i = 0; i < j->n_stop_ids && !stop; i++)
    if (j->stop_ids[i] == t) stop = true, j->stop_id = t; /* EOS is no stop reason (vLLM: null) */
  if (stop) coord__job_finish(c, j, PROTO_FINISH_STOP);
  else if (k + 1 >= j->max_tokens || j->n_tok >= c->max_model_len) coord__job_finish(c, j, PROTO_FINISH_LENGTH);
}

/* An embedding job's answer: the pooled state of its prompt's last token
 * (from the step that fed it); the job ends with it. */
void coord__job_embedding(coord_t *c, coord_job_t *j, const proto_result_item_t *ri) {
  if ((int)ri->n_embd != c->n_embd || j->embd) {
    FR_LOGE("job %llu: an embedding of %u floats from the worker, expected %d", (unsigned long long)j->id,
            ri->n_embd, c->n_embd);
    coord__job_fail(c, j, PROTO_ERR_INTERNAL, "the worker returned no embedding");
    return;
  }
  j->embd = fr_malloc((size_t)ri->n_embd * sizeof(float));
  memcpy(j->embd, ri->embd, (size_t)ri->n_embd * sizeof(float));
  j->n_embd = ri->n_embd;
  j->t_first_ns = j->t_last_ns = fr_now_ns();
  if (c->metrics) coord_metrics_ttft(c->metrics, (j->t_first_ns - j->t_arrival_ns) / 1e9);
  coord__job_finish(c, j, PROTO_FINISH_STOP);
}

/* ---- intake -------------------------------------------------------------------- */

typedef struct {
  int32_t code;
  const char *msg;
} coord_reject_t;

/* Bytes of prompt text a submit carries (its prompt or its messages). */
static size_t coord__prompt_bytes(const proto_submit_t *s) {
  size_t n = s->prompt_len;
  for (uint32_t i = 0; i < s->n_messages; i++) n += s->messages[i].content_len;
  return n;
}

/* What is cheap to check before a prompt is tokenized: token ids against
 * the vocabulary, and text too long for the context whatever it tokenizes
 * to (fails fast, without tokenizing megabytes). */
static coord_reject_t coord__prompt_precheck(coord_t *c, const proto_submit_t *s) {
  static char msg[160];
  for (uint32_t i = 0; i < s->n_tokens; i++)
    if (s->tokens[i] < 0 || s->tokens[i] >= c->vocab)
      return (coord_reject_t){PROTO_ERR_BAD_REQUEST, "token id out of the vocabulary"};
  for (uint32_t i = 0; i < s->sp.n_bias; i++)
    if (s->sp.bias[i].token >= c->vocab) {
      snprintf(msg, sizeof msg, "logit_bias: token %d is not in the vocabulary of %d tokens", s->sp.bias[i].token,
               c->vocab);
      return (coord_reject_t){PROTO_ERR_BAD_REQUEST, msg};
    }
  if (s->n_tokens == 0 && s->n_messages == 0 && s->prompt_len == 0)
    return (coord_reject_t){PROTO_ERR_BAD_REQUEST, "the prompt is empty"};
  size_t bytes = coord__prompt_bytes(s), most = (size_t)c->max_model_len * COORD_MAX_PROMPT_BYTES_PER_TOKEN;
  if (bytes > most && !s->ph.truncate) { /* truncated after tokenizing: 4 MiB at most (PROTO_MAX_TEXT) */
    snprintf(msg, sizeof msg, "the prompt has %zu bytes, more than this model's context of %d tokens can hold",
             bytes, c->max_model_len);
    return (coord_reject_t){PROTO_ERR_TOO_BIG, msg};
  }
  return (coord_reject_t){0, NULL};
}

static coord_reject_t coord__precheck(coord_t *c, const coord_peer_t *p, const proto_submit_t *s) {
  if (c->draining) return (coord_reject_t){PROTO_ERR_UNAVAILABLE, "the server is draining"};
  if (!c->ready && c->n_steps == 0 && c->workers[0].restarts == 0)
    return (coord_reject_t){PROTO_ERR_UNAVAILABLE, "the workers are not ready yet"};
  if (s->model && *s->model && strcmp(s->model, c->served_name) != 0)
    return (coord_reject_t){PROTO_ERR_NOT_FOUND, "unknown model"};
  if (c->sched.n_waiting + c->n_tokenizing >= c->cfg.max_waiting)
    return (coord_reject_t){PROTO_ERR_BUSY, "the queue is full"};
  if (coord__job_find(c, p, s->id)) return (coord_reject_t){PROTO_ERR_BAD_REQUEST, "a job with this id is running"};
  if (s->ph.embed && !c->cfg.embed)
    return (coord_reject_t){PROTO_ERR_BAD_REQUEST, "this server generates text: embeddings need a server started "
                                                   "with --task embed"};
  if (s->ph.embed && (s->ph.logprobs || s->return_logits || s->guide.kind != PROTO_GUIDE_NONE))
    return (coord_reject_t){PROTO_ERR_BAD_REQUEST, "an embedding job takes no logprobs, logits or guide"};
  if (!s->ph.embed && c->cfg.embed)
    return (coord_reject_t){PROTO_ERR_BAD_REQUEST, "this server was started with --task embed: it serves embeddings "
                                                   "only"};
  return (coord_reject_t){0, NULL};
}

/* Checks the prompt's length against the context and j's request, and
 * works out its max_tokens (0 asked: the room left). */
static coord_reject_t coord__lencheck(coord_t *c, const coord_job_t *j, size_t n_prompt, int *max_tokens) {
  static char msg[256];
  if (n_prompt == 0) return (coord_reject_t){PROTO_ERR_BAD_REQUEST, "the prompt is empty"};
  if (n_prompt >= (size_t)c->max_model_len) {
    snprintf(msg, sizeof msg, "the prompt has %zu tokens; this model's context is %d tokens", n_prompt,
             c->max_model_len);
    return (coord_reject_t){PROTO_ERR_TOO_BIG, msg};
  }
  if (j->whole && n_prompt > (size_t)c->cfg.max_num_batched_tokens) {
    snprintf(msg, sizeof msg, "the prompt has %zu tokens; %s embeds a prompt in one step of at most %d "
             "tokens (--max-num-batched-tokens)", n_prompt,
             c->src->config.arch == MODEL_ARCH_BERT ? "this encoder"
             : c->pooling == MODEL_POOL_MEAN       ? "mean pooling" : "cls pooling",
             c->cfg.max_num_batched_tokens);
    return (coord_reject_t){PROTO_ERR_TOO_BIG, msg};
  }
  int room = c->max_model_len - (int)n_prompt;
  if (j->max_tokens > room) {
    snprintf(msg, sizeof msg, "prompt (%zu tokens) + max_tokens (%d) exceed the context of %d tokens", n_prompt,
             j->max_tokens, c->max_model_len);
    return (coord_reject_t){PROTO_ERR_BAD_REQUEST, msg};
  }
  *max_tokens = j->max_tokens ? j->max_tokens : room;
  if (j->return_logits && (uint64_t)(j->stream ? 1 : *max_tokens) * (uint64_t)c->vocab > PROTO_MAX_LOGITS)
    return (coord_reject_t){PROTO_ERR_BAD_REQUEST, "return_logits needs stream (or fewer max_tokens)"};
  return (coord_reject_t){0, NULL};
}

/* The ids min_tokens bans: the model's end-of-generation tokens (unless
 * EOS is ignored) and the job's stop ids, at most PROTO_MAX_BAN. */
static void coord__job_ban(coord_t *c, coord_job_t *j) {
  j->ban = fr_malloc(PROTO_MAX_BAN * sizeof(int32_t));
  for (int32_t t = 0; t < c->vocab && !j->ignore_eos && j->n_ban < PROTO_MAX_BAN; t++)
    if (model_token_is_eog(c->tok, t)) j->ban[j->n_ban++] = t;
  for (uint32_t i = 0; i < j->n_stop_ids && j->n_ban < PROTO_MAX_BAN; i++) j->ban[j->n_ban++] = j->stop_ids[i];
}

/* A job for submit s, without its prompt yet (state NEW, max_tokens as
 * asked; coord__job_set_prompt completes it). */
static coord_job_t *coord__job_new(coord_t *c, const coord_peer_t *p, const proto_submit_t *s) {
  coord_job_t *j = fr_calloc(1, sizeof *j);
  j->state = COORD_JOB_NEW;
  j->id = s->id;
  j->serial = ++c->serial;
  j->peer = *p;
  j->priority = s->priority;
  j->slot = -1;
  j->stop_id = -1;
  j->truncate = s->ph.truncate;
  j->plp_want = s->ph.logprobs;
  j->plp_k = (int32_t)s->ph.logprobs_top;
  j->sp = s->sp;
  if (!s->sp.has_seed) j->sp.seed = fr_now_ns() ^ (j->serial * 0x9e3779b97f4a7c15ull), j->sp.has_seed = true;
  j->max_tokens = (int)FR_MIN(s->max_tokens, (uint32_t)INT32_MAX);
  j->embed = s->ph.embed;
  if (j->embed) j->max_tokens = 1; /* no output: room for the step that pools the prompt */
  j->whole = j->embed && c->whole_prompts;
  j->ignore_eos = s->stop.ignore_eos;
  j->include_stop = s->stop.include;
  j->stream = s->stream;
  j->return_logits = s->return_logits;
  j->sp.want_logits = s->return_logits;
  j->n_stop = s->stop.n_strs;
  j->stop = fr_calloc(j->n_stop ? j->n_stop : 1, sizeof(char *));
  for (uint32_t i = 0; i < j->n_stop; i++) {
    j->stop[i] = fr_strdup(s->stop.strs[i]);
    j->stop_max = FR_MAX(j->stop_max, strlen(s->stop.strs[i]));
  }
  j->n_stop_ids = s->stop.n_ids;
  j->stop_ids = fr_malloc((j->n_stop_ids ? j->n_stop_ids : 1) * sizeof(int32_t));
  if (j->n_stop_ids) memcpy(j->stop_ids, s->stop.ids, j->n_stop_ids * sizeof(int32_t));
  j->bias = fr_malloc((s->sp.n_bias ? s->sp.n_bias : 1) * sizeof(proto_bias_t));
  if (s->sp.n_bias) memcpy(j->bias, s->sp.bias, s->sp.n_bias * sizeof(proto_bias_t));
  j->sp.bias = j->bias;
  if (j->sp.min_tokens > 0) coord__job_ban(c, j);
  model_detok_init(&j->detok, c->tok, !s->stop.keep_special);
  j->t_arrival_ns = fr_now_ns();
  return j;
}

/* Every id must have a row in the model's embedding, which can be smaller
 * than the tokenizer's vocabulary (added tokens past the model's rows). */
static coord_reject_t coord__ids_check(coord_t *c, const int32_t *ids, size_t n) {
  static char msg[160];
  for (size_t i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= c->vocab) {
      snprintf(msg, sizeof msg, "the prompt has token %d, past the model's %d embedding rows", ids[i], c->vocab);
      return (coord_reject_t){PROTO_ERR_BAD_REQUEST, msg};
    }
  return (coord_reject_t){0, NULL};
}

/* Gives j its prompt (takes ids) once its length is checked, and sizes
 * what depends on max_tokens. On a rejection ids are freed and j is
 * unchanged. */
static coord_reject_t coord__job_set_prompt(coord_t *c, coord_job_t *j, int32_t *ids, size_t n) {
  int max_tokens = 0;
  if (j->truncate && n > j->truncate) { /* truncate_prompt_tokens: the last ones stay */
    memmove(ids, ids + (n - j->truncate), j->truncate * sizeof *ids);
    n = j->truncate;
  }
  coord_reject_t rj = coord__lencheck(c, j, n, &max_tokens);
  if (!rj.code && j->plp_want && (uint64_t)n * (uint64_t)j->plp_k > PROTO_MAX_PROMPT_TOP)
    rj = (coord_reject_t){PROTO_ERR_BAD_REQUEST, "prompt logprobs: prompt tokens x alternatives exceed 524288"};
  if (rj.code) {
    free(ids);
    return rj;
  }
  j->max_tokens = max_tokens;
  j->cap = (int)n + max_tokens + 1;
  j->tok = fr_realloc(ids, (size_t)j->cap * sizeof(int32_t));
  j->n_tok = j->n_prompt = (int)n;
  if (j->sp.logprobs >= 0) {
    j->lp = fr_malloc((size_t)max_tokens * sizeof(float));
    j->top_n = j->sp.logprobs;
    if (j->top_n > 0) j->top = fr_malloc((size_t)max_tokens * (size_t)j->top_n * sizeof(proto_toplp_t));
  }
  if (j->plp_want) {
    j->plp = fr_calloc(n, sizeof(float));
    j->plp_rank = fr_calloc(n, sizeof(uint32_t));
    j->plp_top = fr_calloc(n * (size_t)FR_MAX(j->plp_k, 1), sizeof(proto_toplp_t));
  }
  return rj;
}

/* The job has its prompt: the scheduler takes it. */
static void coord__job_queue(coord_t *c, coord_job_t *j) {
  j->state = COORD_JOB_WAITING;
  coord_sched_enqueue(&c->sched, j);
  FR_LOGD("job %llu: %d prompt tokens, max %d", (unsigned long long)j->id, j->n_prompt, j->max_tokens);
}

/* Ends a job whose intake failed: the client gets the error reply (no
 * event), and the job is gone. */
static void coord__job_reject(coord_t *c, coord_job_t *j, coord_reject_t rj) {
  coord__rpc_error(c, &j->peer, rj.code, j->id, rj.msg);
  coord__job_finish(c, j, PROTO_FINISH_ERROR);
  j->finish_sent = true;
  coord__job_reap(c, j);
}

/* Intake: checks, then the job exists at once (cancel, duplicate ids and
 * disconnects see it); a text prompt is tokenized by the pool, token ids
 * are taken as they are. */
void coord__job_submit(coord_t *c, const coord_peer_t *p, const proto_submit_t *s) {
  coord_reject_t rj = coord__precheck(c, p, s);
  if (!rj.code) rj = coord__prompt_precheck(c, s);
  if (rj.code) {
    coord__rpc_error(c, p, rj.code, s->id, rj.msg);
    return;
  }
  coord_job_t *j = coord__job_new(c, p, s);
  coord_job_t *parent = s->ph.fork_of ? coord__job_find(c, p, s->ph.fork_of) : NULL;
  if (parent) j->fork = parent, parent->fork_waiters++;
  coord__hash_insert(c, j);
  if (c->metrics) coord_metrics_request_start(c->metrics);
  const char *why = NULL;
  if (coord__guide_init(c, j, s, &why)) {
    coord__job_reject(c, j, (coord_reject_t){PROTO_ERR_BAD_REQUEST, why});
    return;
  }
  if (s->n_tokens == 0) {
    coord__prompts_submit(c, j, s);
    return;
  }
  int32_t *ids = fr_malloc((size_t)s->n_tokens * sizeof(int32_t));
  memcpy(ids, s->tokens, (size_t)s->n_tokens * sizeof(int32_t));
  coord__job_prompt_ready(c, j, 0, NULL, ids, s->n_tokens);
}

void coord__job_prompt_ready(coord_t *c, coord_job_t *j, int rc, const char *err, int32_t *ids, size_t n) {
  if (j->finish != PROTO_FINISH_NONE) { /* canceled (or the client left) while it was tokenized */
    free(ids);
    coord__job_reap(c, j);
    return;
  }
  coord_reject_t rj = {PROTO_ERR_BAD_REQUEST, err};
  if (rc == 0) rj = coord__ids_check(c, ids, n);
  if (rc == 0 && !rj.code) rj = coord__job_set_prompt(c, j, ids, n);
  else free(ids);
  if (rj.code) coord__job_reject(c, j, rj);
  else coord__job_queue(c, j);
}

void coord__job_cancel(coord_t *c, const coord_peer_t *p, uint64_t id) {
  coord_job_t *j = coord__job_find(c, p, id);
  if (!j) j = coord__job_find(c, NULL, id);
  if (!j) {
    coord__rpc_error(c, p, PROTO_ERR_NOT_FOUND, id, "no running job with this id");
    return;
  }
  coord__job_finish(c, j, PROTO_FINISH_CANCEL);
  coord__stream_job(c, j);
  coord__job_reap(c, j);
}
