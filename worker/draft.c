/* draft.c - speculative decoding's draft model on the worker (vLLM's
 * {"model": PATH} proposer). The worker loads a smaller model with the
 * target's vocabulary beside it, on the same backend; its KV pool has as
 * many blocks as the target's and is indexed by the same block tables, so
 * truncation after a rejection and freeing need nothing of their own.
 *
 * Each step, before the target's forward pass:
 * - pass 1 runs the draft over every prompt chunk of the step (items of
 *   several tokens: the draft's K/V then covers every computed prompt,
 *   prefix-cached blocks included, since those were computed by a step
 *   that ran it too) and over each item that asks for draft proposals
 *   (dm): the tokens of its slot it has not seen yet (w->dlen: after a
 *   fully accepted step, after decodes it was not asked about), taken from
 *   the slot's history, then the item's own token; its last logits give
 *   proposal 0;
 * - passes 2..k feed proposal j - 1 and give proposal j.
 * A proposal is the draft's argmax (greedy) or a sample from its
 * distribution q under the request's sampling params (recorded in w->dq
 * for the rejection test). The proposals overwrite the item's placeholder
 * tokens and the target verifies them (spec.c). A draft's K/V that is
 * stale (a rejected proposal's, a block whose tokens it never saw) only
 * lowers the acceptance: the target's verification decides every token. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_log.h"
#include "common/fr_util.h"
#include "model/dummy.h"
#include "worker/worker.h"

int worker__draft_load(worker_t *w, const char *path, bool dummy, int max_tokens, int max_seqs) {
  if (w->args.world_size > 1)
    return fr_errorf(FR_EUNSUPPORTED, "a draft model with tensor parallelism (%d ranks) is not built",
                     w->args.world_size);
  if (w->m->pooling) return fr_errorf(FR_EUNSUPPORTED, "a draft model speeds up generation, not embeddings");
  /* --load-format dummy holds for the draft too, as in vLLM, with the
   * target's seed: a draft of the target's own config is the target */
  model_load_opts_t mo = {.max_tokens = max_tokens, .max_seqs = max_seqs, .tp_rank = 0, .tp_size = 1, .seed = 1};
  model_config_t cfg;
  int rc = dummy ? model_dummy_config(path, &cfg) : 0;
  if (!rc && dummy) rc = model_dummy_weights_of(&mo, path);
  if (!rc) rc = dummy ? model_load_dummy(&w->dm, &cfg, w->be, &mo) : model_load(&w->dm, path, w->be, &mo);
  if (rc) return fr_errorf(rc, "draft model %s: %s", path, fr_last_error());
  const model_config_t *t = &w->m->cfg, *d = &w->dm->cfg;
  if (d->vocab_size != t->vocab_size)
    return fr_errorf(-EINVAL,
                     "draft model %s has a vocabulary of %d tokens, the target's has %d: a draft model must use the "
                     "target's tokenizer",
                     path, d->vocab_size, t->vocab_size);
  if (t->sliding_window && (d->sliding_window != t->sliding_window || d->swa_first_layer != t->swa_first_layer))
    return fr_errorf(FR_EUNSUPPORTED, "draft model %s: the target has a sliding window (%d) the draft does not share",
                     path, t->sliding_window);
  w->weight_bytes += worker__weight_bytes(w->dm);
  w->act_bytes += w->dm->scratch_bytes;
  FR_LOGI("draft model %s: %d layers, dim %d, vocabulary %d", path, d->n_layers, d->dim, d->vocab_size);
  return 0;
}

kern_kv_config_t worker__draft_kv_config(const worker_t *w, int block_size, int n_blocks) {
  kern_kv_config_t kc = model_kv_config(w->dm, block_size, n_blocks, w->be->kv_type);
  kc.dtype = w->kv_dtype;
  return kc;
}

size_t worker__draft_block_bytes(const worker_t *w, int block_size) {
  if (!w->dm) return 0;
  kern_kv_config_t kc = worker__draft_kv_config(w, block_size, 1);
  return kern_kv_block_bytes(&kc);
}

void worker__draft_scratch(worker_t *w) {
  if (!w->dm) return;
  size_t T = (size_t)w->max_tokens, S = (size_t)w->max_seqs;
  w->dlen = fr_calloc((size_t)w->info.max_seqs, sizeof(int32_t));
  w->dtokens = fr_malloc(T * sizeof(int32_t));
  w->dpos = fr_malloc(T * sizeof(int32_t));
  w->dslots = fr_malloc(T * sizeof(int32_t));
  w->dtok = fr_malloc(T * sizeof(int32_t));
  w->dq_start = fr_malloc((S + 1) * sizeof(int32_t));
  w->dctx = fr_malloc(S * sizeof(int32_t));
  w->ditem = fr_malloc(S * sizeof(int32_t));
  w->drow = fr_malloc(S * sizeof(int32_t));
  w->dk = fr_malloc(S * sizeof(int32_t));
  w->dtables = fr_malloc(S * (size_t)w->info.max_blocks_per_seq * sizeof(int32_t));
  w->dq = fr_malloc(S * (size_t)w->vocab * sizeof(float));
  w->dsamp = fr_malloc(S * sizeof(int32_t));
}

void worker__draft_free(worker_t *w) {
  if (w->be && w->dpool.base && !w->dpool.external) w->be->ops->kv_pool_deinit(w->be->ctx, &w->dpool);
  memset(&w->dpool, 0, sizeof w->dpool);
  free(w->dlen), free(w->dtokens), free(w->dpos), free(w->dslots), free(w->dtok), free(w->dq_start);
  free(w->dctx), free(w->ditem), free(w->drow), free(w->dk), free(w->dtables), free(w->dq), free(w->dsamp);
  w->dlen = w->dtokens = w->dpos = w->dslots = w->dtok = w->dq_start = NULL;
  w->dctx = w->ditem = w->drow = w->dk = w->dtables = w->dsamp = NULL;
  w->dq = NULL;
  model_destroy(w->dm);
  w->dm = NULL;
}

/* A draft pass's batch under construction. */
typedef struct {
  int n_seqs, n_tokens;
} worker_dbatch_t;

/* Opens sequence s of the batch for step item i (its table row). */
static void worker__dseq_open(worker_t *w, worker_dbatch_t *b, int i) {
  const size_t mb = (size_t)w->info.max_blocks_per_seq;
  w->dq_start[b->n_seqs] = b->n_tokens;
  w->ditem[b->n_seqs] = i;
  memcpy(w->dtables + (size_t)b->n_seqs * mb, w->tables + (size_t)i * mb, mb * sizeof(int32_t));
}

/* Appends a token at position p to the open sequence (its block was
 * checked: by worker__add_item, or as a catch-up position). */
static void worker__dseq_tok(worker_t *w, worker_dbatch_t *b, int32_t tok, int p) {
  const int bs = w->info.block_size;
  const int32_t *row = w->dtables + (size_t)b->n_seqs * (size_t)w->info.max_blocks_per_seq;
  w->dtokens[b->n_tokens] = tok;
  w->dpos[b->n_tokens] = p;
  w->dslots[b->n_tokens] = row[p / bs] * bs + p % bs;
  b->n_tokens++;
}

static void worker__dseq_close(worker_t *w, worker_dbatch_t *b, int end) { w->dctx[b->n_seqs++] = end; }

/* Whether position p of item i's slot can be caught up on: its token is in
 * the history (not a prefix-cache hit's hole) and its block is real (not
 * released before a sliding window). */
static bool worker__dseen(const worker_t *w, int i, const worker_hist_t *h, int p) {
  int32_t blk = w->tables[(size_t)i * (size_t)w->info.max_blocks_per_seq + (size_t)(p / w->info.block_size)];
  return p < h->len && h->tok[p] >= 0 && blk >= 0 && blk < w->info.n_blocks;
}

/* Pass 1's sequence of an item that asks for proposals: the slot's tokens
 * the draft has not seen, then the item's tokens before the proposals.
 * When those do not fit in the tokens left (*spare beyond the item's own),
 * only a first part is fed and the item gets no draft proposals this step
 * (w->dk[i] stays -1: its placeholders are verified as they are). */
static void worker__dseq_draft(worker_t *w, worker_dbatch_t *b, const proto_step_item_t *it, int i, int *spare) {
  worker_hist_t *h = &w->hist[it->slot];
  const int pos = (int)it->pos, base = (int)(it->n_tokens - it->n_spec);
  int from = FR_MIN(w->dlen[it->slot], pos);
  for (int p = pos - 1; p >= from; p--)
    if (!worker__dseen(w, i, h, p)) { /* assumed seen below a hole: the draft ran with the prompt's chunks */
      from = p + 1;
      break;
    }
  int lag = pos - from, extra = FR_MAX(0, lag - (int)it->n_spec); /* the item's own share covers n_spec */
  worker__dseq_open(w, b, i);
  if (extra > *spare) { /* a long lag: catch up on part of it, propose nothing */
    int n = (int)it->n_spec + *spare;
    for (int p = from; p < from + n; p++) worker__dseq_tok(w, b, h->tok[p], p);
    *spare = 0;
    w->dlen[it->slot] = from + n;
    worker__dseq_close(w, b, from + n);
    return;
  }
  *spare -= extra;
  for (int p = from; p < pos; p++) worker__dseq_tok(w, b, h->tok[p], p);
  for (int j = 0; j < base; j++) worker__dseq_tok(w, b, it->tokens[j], pos + j);
  w->dk[i] = 0; /* proposals follow */
  worker__dseq_close(w, b, pos + base);
}

/* Whether the pass's proposals can be the device sampler's: every
 * sequence's request is greedy (its proposal is the argmax after bias,
 * bans and penalties, which the device sampler applies as the host's does),
 * so no q and no logits row on the host is needed. */
static bool worker__dgreedy(const worker_t *w, const proto_step_t *st, const worker_dbatch_t *b) {
  if (!w->be->ops->sample || b->n_seqs > WORKER_DRAFT_DEVICE_ROWS) return false;
  for (int s = 0; s < b->n_seqs; s++)
    if (w->hist[st->items[w->ditem[s]].slot].sp.temperature > 0) return false;
  return true;
}

/* The device sampler's params for sequence s of a greedy pass: proposal j
 * of its item (the slot's history fed up to it), or a plain argmax for a
 * sequence that makes no proposal (a prompt chunk). */
static kern_sample_params_t worker__dparams(worker_t *w, proto_step_item_t *it, int i, int j) {
  if (w->dk[i] != j || j >= (int)it->n_spec || !it->draft) return (kern_sample_params_t){0};
  worker_hist_t *h = &w->hist[it->slot];
  const int base = (int)(it->n_tokens - it->n_spec);
  worker__hist_feed(h, (int)it->pos, it->tokens, base + j);
  const proto_sampling_t *p = &h->sp;
  const int pl = FR_MIN(h->prompt_len, h->len), ctx = (int)it->pos + base + j;
  return (kern_sample_params_t){.repetition_penalty = p->repetition_penalty,
                                .presence_penalty = p->presence_penalty,
                                .frequency_penalty = p->frequency_penalty,
                                .prompt = h->tok, .output = h->tok + pl, .n_prompt = pl, .n_output = ctx - pl,
                                .bias = (const kern_bias_t *)h->bias, .n_bias = (int)h->n_bias,
                                .ban = h->ban, .n_ban = (int)h->n_ban,
                                .min_tokens = (int)FR_MIN(p->min_tokens, (uint32_t)INT32_MAX)};
}

/* Runs one draft pass over the batch for proposal j. Greedy passes leave
 * each sequence's proposal in w->dsamp (sampled on the device; -1 for a
 * row that is not finite); others
 * leave the logits (a row per sequence) on the host in w->logits. */
static int worker__dpass(worker_t *w, proto_step_t *st, worker_dbatch_t *b, int j, bool *greedy) {
  w->dq_start[b->n_seqs] = b->n_tokens;
  kern_step_t ks = {.n_tokens = b->n_tokens, .tokens = w->dtokens, .n_seqs = b->n_seqs, .positions = w->dpos,
                    .slots = w->dslots, .q_start = w->dq_start, .ctx_len = w->dctx, .block_tables = w->dtables,
                    .max_blocks = w->info.max_blocks_per_seq};
  const void *logits;
  int rc = model_forward(w->dm, &w->dpool, &ks, &logits);
  *greedy = !rc && worker__dgreedy(w, st, b);
  if (*greedy) {
    kern_sample_params_t sp[WORKER_DRAFT_DEVICE_ROWS];
    float lp[WORKER_DRAFT_DEVICE_ROWS];
    for (int s = 0; s < b->n_seqs; s++) sp[s] = worker__dparams(w, &st->items[w->ditem[s]], w->ditem[s], j);
    rc = w->be->ops->sample(w->be->ctx, logits, b->n_seqs, w->vocab, sp, w->dsamp, lp);
    for (int s = 0; !rc && s < b->n_seqs; s++)
      if (!isfinite(lp[s])) w->dsamp[s] = -1; /* NaN logits: the item's proposals stop (worker__dtake) */
  } else if (!rc) {
    rc = model_logits_to_host(w->dm, logits, b->n_seqs, w->logits);
  }
  return rc ? fr_errorf(rc, "draft model: %s", fr_last_error()) : 0;
}

/* Takes d as proposal j of item i (ok false: its draft row was not finite,
 * which ends the item's proposals; the rest stay placeholders). */
static void worker__dtake(worker_t *w, proto_step_item_t *it, int i, int j, int32_t d, bool ok) {
  const int base = (int)(it->n_tokens - it->n_spec), ctx = (int)it->pos + base + j;
  if (!ok || d < 0 || d >= w->vocab) {
    w->dk[i] = -w->dk[i] - 2; /* stopped: -(made + 2) */
    return;
  }
  it->tokens[base + j] = d;
  w->tokens[w->q_start[i] + base + j] = d;
  w->dk[i] = j + 1;
  w->dlen[it->slot] = ctx;
}

/* Proposal j of item i from its draft logits row on the host; the slot's
 * history gets the item's tokens before it (penalties, as the target's
 * verification sees them). */
static void worker__dpropose(worker_t *w, proto_step_item_t *it, int i, int j, float *row) {
  worker_hist_t *h = &w->hist[it->slot];
  const int base = (int)(it->n_tokens - it->n_spec), ctx = (int)it->pos + base + j, V = w->vocab;
  worker__hist_feed(h, (int)it->pos, it->tokens, base + j);
  const int pl = FR_MIN(h->prompt_len, h->len);
  model_sampling_t p = worker__sampling(h);
  float *q = w->dq + (size_t)(w->drow[i] + j) * (size_t)V;
  int32_t d = model_sample_draft(&w->smp, &p, row, h->tok, (size_t)pl, h->tok + pl, (size_t)(ctx - pl),
                                 (uint64_t)(ctx - pl), q);
  worker__dtake(w, it, i, j, d, d >= 0 && d < V && (p.temperature <= 0 || q[d] > 0)); /* else NaN logits */
}

/* Proposal j of each sequence of pass b that makes one. */
static void worker__dproposals(worker_t *w, proto_step_t *st, const worker_dbatch_t *b, int j, bool greedy) {
  for (int s = 0; s < b->n_seqs; s++) {
    int i = w->ditem[s];
    proto_step_item_t *it = &st->items[i];
    if (w->dk[i] != j || j >= (int)it->n_spec || !it->draft) continue;
    if (greedy) worker__dtake(w, it, i, j, w->dsamp[s], true);
    else worker__dpropose(w, it, i, j, w->logits + (size_t)s * (size_t)w->vocab);
  }
}

/* Pass 1: prompt chunks and catch-ups; proposal 0. */
static int worker__dpass_first(worker_t *w, proto_step_t *st, int n_tok) {
  worker_dbatch_t b = {0};
  int spare = w->max_tokens - n_tok;
  for (uint32_t i = 0; i < st->n_items; i++) {
    proto_step_item_t *it = &st->items[i];
    w->dk[i] = -1;
    if (it->pos == 0) w->dlen[it->slot] = 0;
    if (it->draft) {
      memcpy(w->dtok + w->q_start[i], it->tokens, it->n_tokens * sizeof(int32_t));
      it->tokens = w->dtok + w->q_start[i]; /* the proposals replace the placeholders here */
      worker__dseq_draft(w, &b, it, (int)i, &spare);
    } else if (it->n_tokens - it->n_spec > 1) { /* a prompt chunk: the draft keeps its K/V */
      worker__dseq_open(w, &b, (int)i);
      for (uint32_t j = 0; j < it->n_tokens - it->n_spec; j++) worker__dseq_tok(w, &b, it->tokens[j], (int)(it->pos + j));
      worker__dseq_close(w, &b, (int)(it->pos + it->n_tokens - it->n_spec));
      w->dlen[it->slot] = (int32_t)(it->pos + it->n_tokens - it->n_spec);
    }
  }
  if (b.n_seqs == 0) return 0;
  bool greedy;
  int rc = worker__dpass(w, st, &b, 0, &greedy);
  if (!rc) worker__dproposals(w, st, &b, 0, greedy);
  return rc;
}

int worker__draft_run(worker_t *w, proto_step_t *st, int n_tok) {
  if (!w->dm) return 0;
  int rows = 0, k_max = 0;
  for (uint32_t i = 0; i < st->n_items; i++) {
    w->drow[i] = rows;
    rows += 1 + (int)st->items[i].n_spec;
    if (st->items[i].draft) k_max = FR_MAX(k_max, (int)st->items[i].n_spec);
  }
  if (rows > w->max_seqs) return fr_errorf(FR_ETOOBIG, "%d logits rows, more than %d", rows, w->max_seqs);
  int rc = worker__dpass_first(w, st, n_tok);
  for (int j = 1; !rc && j < k_max; j++) { /* pass j + 1: feed proposal j - 1 */
    worker_dbatch_t b = {0};
    for (uint32_t i = 0; i < st->n_items; i++) {
      const proto_step_item_t *it = &st->items[i];
      if (!it->draft || w->dk[i] != j || j >= (int)it->n_spec) continue;
      int p = (int)(it->pos + it->n_tokens - it->n_spec) + j - 1;
      worker__dseq_open(w, &b, (int)i);
      worker__dseq_tok(w, &b, it->tokens[p - (int)it->pos], p);
      worker__dseq_close(w, &b, p + 1);
    }
    if (b.n_seqs == 0) break;
    bool greedy;
    rc = worker__dpass(w, st, &b, j, &greedy);
    if (!rc) worker__dproposals(w, st, &b, j, greedy);
  }
  return rc;
}

int worker__draft_made(const worker_t *w, int i) {
  int k = w->dk[i];
  return k >= 0 ? k : k == -1 ? 0 : -k - 2;
}
