/* step.c - one step descriptor: block copies, one forward pass over all
 * items (mixed prefill chunks and decodes), sampling on rank 0. */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_log.h"
#include "common/fr_util.h"
#include "worker/worker.h"

/* See worker.h. */
void worker__hist_feed(worker_hist_t *h, int pos, const int32_t *tok, int n) {
  size_t need = (size_t)pos + (size_t)n;
  if (need > (size_t)h->cap) {
    size_t cap = FR_MAX(need, (size_t)h->cap * 2);
    cap = FR_MAX(cap, 64);
    h->tok = fr_realloc(h->tok, cap * sizeof(int32_t));
    h->cap = (int)cap;
  }
  for (int i = h->len; i < pos; i++) h->tok[i] = -1; /* unseen (prefix-cache hit) */
  memcpy(h->tok + pos, tok, (size_t)n * sizeof(int32_t));
  h->len = (int)need;
}

/* A remote worker's tables: the step's changes, checked whole before any
 * is applied (a bad one fails the step and changes nothing). */
static int worker__tables(worker_t *w, const proto_step_t *st) {
  const int mb = w->info.max_blocks_per_seq;
  for (uint32_t i = 0; i < st->n_tables; i++) {
    const proto_table_t *t = &st->tables[i];
    if (t->slot >= (uint32_t)w->info.max_seqs) return fr_errorf(FR_EPROTO, "block table %u: slot %u out of range", i, t->slot);
    if (t->first > (uint32_t)w->rlen[t->slot] || t->first + t->n_blocks > (uint32_t)mb)
      return fr_errorf(FR_EPROTO, "block table of slot %u: entries %u..%u, the slot holds %d of at most %d", t->slot,
                       t->first, t->first + t->n_blocks, w->rlen[t->slot], mb);
    for (uint32_t b = 0; b < t->n_blocks; b++) /* KV_HOLE: released before a sliding window (kv.h) */
      if ((t->blocks[b] < 0 && t->blocks[b] != KV_HOLE) || t->blocks[b] >= w->info.n_blocks)
        return fr_errorf(FR_EPROTO, "block table of slot %u: block %d out of range", t->slot, t->blocks[b]);
  }
  for (uint32_t i = 0; i < st->n_tables; i++) {
    const proto_table_t *t = &st->tables[i];
    memcpy(w->rtab + (size_t)t->slot * (size_t)mb + t->first, t->blocks, t->n_blocks * sizeof(int32_t));
    w->rlen[t->slot] = (int32_t)(t->first + t->n_blocks);
  }
  return 0;
}

/* The slot's table into row: from the control segment, or (remote) from
 * what the steps sent, the sequence as long as the item needs. */
static int worker__read_table(worker_t *w, uint32_t slot, int32_t *row, uint64_t end, kv_seq_view_t *v) {
  const int mb = w->info.max_blocks_per_seq;
  if (!w->remote) return kv_seq_read(w->ctl, (int)slot, row, mb, v);
  int n = w->rlen[slot];
  memcpy(row, w->rtab + (size_t)slot * (size_t)mb, (size_t)n * sizeof(int32_t));
  *v = (kv_seq_view_t){.len = (int32_t)FR_MIN(end, (uint64_t)n * (uint64_t)w->info.block_size), .n_blocks = n,
                       .in_use = n > 0};
  return 0;
}

/* Validates an item against the slot's block table and appends it to the
 * batch: positions, KV slots, query range, context length, table row. */
static int worker__add_item(worker_t *w, const proto_step_item_t *it, int s, int *n_tok) {
  const int bs = w->info.block_size, mb = w->info.max_blocks_per_seq;
  if (it->slot >= (uint32_t)w->info.max_seqs) return fr_errorf(FR_EPROTO, "item %d: slot %u out of range", s, it->slot);
  if (it->draft && !w->dm && !w->fake_forward)
    return fr_errorf(FR_EPROTO, "item %d: draft proposals asked, but no draft model is loaded", s);
  if ((size_t)*n_tok + it->n_tokens > (size_t)w->max_tokens)
    return fr_errorf(FR_ETOOBIG, "step has more than %d tokens", w->max_tokens);
  int32_t *row = w->tables + (size_t)s * (size_t)mb;
  kv_seq_view_t v;
  int rc = worker__read_table(w, it->slot, row, (uint64_t)it->pos + it->n_tokens, &v);
  if (rc) return fr_errorf(rc, "item %d: slot %u: %s", s, it->slot, fr_last_error());
  uint64_t end = (uint64_t)it->pos + it->n_tokens;
  if (!v.in_use || end > (uint64_t)v.len || end > (uint64_t)v.n_blocks * (uint64_t)bs)
    return fr_errorf(FR_EPROTO, "item %d: slot %u holds %d tokens, step needs %llu", s, it->slot, v.len,
                     (unsigned long long)end);
  w->q_start[s] = *n_tok;
  for (uint32_t i = 0; i < it->n_tokens; i++) {
    int p = (int)it->pos + (int)i, t = *n_tok + (int)i;
    int32_t blk = row[p / bs];
    if (blk < 0 || blk >= w->info.n_blocks) return fr_errorf(FR_EPROTO, "item %d: block %d out of range", s, blk);
    if (it->tokens[i] < 0 || it->tokens[i] >= w->vocab)
      return fr_errorf(FR_EPROTO, "item %d: token %d outside the vocabulary", s, it->tokens[i]);
    w->tokens[t] = it->tokens[i];
    w->pos[t] = p;
    w->slots[t] = blk * bs + p % bs;
  }
  w->ctx_len[s] = (int32_t)end;
  *n_tok += (int)it->n_tokens;
  return 0;
}

static int worker__copies(worker_t *w, const proto_step_t *st) {
  if (st->n_copies == 0) return 0;
  for (uint32_t i = 0; i < st->n_copies; i++) {
    if (st->copies[i].src >= (uint32_t)w->info.n_blocks || st->copies[i].dst >= (uint32_t)w->info.n_blocks)
      return fr_errorf(FR_EPROTO, "block copy %u out of range", i);
    w->copy_pairs[2 * i] = (int32_t)st->copies[i].src;
    w->copy_pairs[2 * i + 1] = (int32_t)st->copies[i].dst;
  }
  if (!w->be->ops->kv_copy_blocks) return fr_errorf(FR_EUNSUPPORTED, "backend cannot copy KV blocks");
  int rc = w->be->ops->kv_copy_blocks(w->be->ctx, &w->pool, w->copy_pairs, (int)st->n_copies);
  if (!rc && w->dm) /* the draft's pool has the same blocks */
    rc = w->be->ops->kv_copy_blocks(w->be->ctx, &w->dpool, w->copy_pairs, (int)st->n_copies);
  return rc;
}

model_sampling_t worker__sampling(const worker_hist_t *h) {
  const proto_sampling_t *sp = &h->sp;
  model_sampling_t p = model_sampling_default();
  p.bias = h->bias, p.n_bias = (int)h->n_bias;
  p.ban = h->ban, p.n_ban = (int)h->n_ban;
  p.min_tokens = (int)FR_MIN(sp->min_tokens, (uint32_t)INT32_MAX);
  p.temperature = sp->temperature;
  p.top_k = sp->top_k;
  p.top_p = sp->top_p;
  p.min_p = sp->min_p;
  p.repetition_penalty = sp->repetition_penalty;
  p.presence_penalty = sp->presence_penalty;
  p.frequency_penalty = sp->frequency_penalty;
  p.seed = sp->has_seed ? sp->seed : 0;
  return p;
}

_Static_assert(sizeof(model_bias_t) == sizeof(proto_bias_t) && offsetof(model_bias_t, bias) == offsetof(proto_bias_t, bias),
               "a wire logit bias is a sampler one");

/* Keeps the slot's copy of an item's sampling params (the message's
 * memory is reused by the next decode). */
static void worker__slot_keep(worker_hist_t *h, const proto_step_item_t *it) {
  h->sp = it->sp, h->prompt_len = (int)it->prompt_len, h->has_sp = true;
  h->sp.bias = NULL;
  if (it->sp.n_bias > h->bias_cap)
    h->bias_cap = it->sp.n_bias, h->bias = fr_realloc(h->bias, h->bias_cap * sizeof *h->bias);
  if (it->n_ban > h->ban_cap) h->ban_cap = it->n_ban, h->ban = fr_realloc(h->ban, h->ban_cap * sizeof *h->ban);
  h->n_bias = it->sp.n_bias, h->n_ban = it->n_ban;
  if (h->n_bias) memcpy(h->bias, it->sp.bias, h->n_bias * sizeof *h->bias);
  if (h->n_ban) memcpy(h->ban, it->ban, h->n_ban * sizeof *h->ban);
}

/* Takes the sampling params an item carries into its slot; a final item
 * of a slot that never got any is an error. */
static int worker__slot_params(worker_t *w, const proto_step_t *st) {
  for (uint32_t i = 0; i < st->n_items; i++) {
    const proto_step_item_t *it = &st->items[i];
    if (it->slot >= (uint32_t)w->info.max_seqs) continue; /* worker__add_item rejects it */
    worker_hist_t *h = &w->hist[it->slot];
    if (it->has_sp) worker__slot_keep(h, it);
    if (it->final && !h->has_sp)
      return fr_errorf(FR_EPROTO, "step item for slot %u: no sampling params were sent for the slot", it->slot);
  }
  return 0;
}

/* Non-finite logits (a numerical fault in the model or the weights): this
 * item fails alone. */
void worker__item_nonfinite(proto_result_item_t *ri) {
  FR_LOGE("slot %u: non-finite logits", ri->slot);
  ri->token = -1;
  ri->error = PROTO_ERR_INTERNAL;
  ri->n_top = 0;
  ri->has_logits = false;
}

/* An item this worker refused (rc, message in fr_last_error): it is left
 * out of the forward pass and reported failed; the others go on. */
static void worker__item_refused(worker_t *w, const proto_step_item_t *it, int r) {
  FR_LOGE("slot %u left out of the step: %s", it->slot, fr_last_error());
  proto_result_item_t *ri = &w->ritems[r];
  memset(ri, 0, sizeof *ri);
  ri->slot = it->slot;
  ri->token = -1;
  ri->error = PROTO_ERR_BAD_REQUEST;
}

/* True when an item carries a mask that allows no token of the
 * vocabulary (a broken guide): the item fails instead of drawing a token
 * the mask does not allow. Stops at the first allowed token. */
static bool worker__mask_none(const proto_step_item_t *it, int vocab) {
  if (!it->n_mask || !it->mask) return false;
  const uint32_t words = FR_MIN(it->n_mask, ((uint32_t)vocab + 31) / 32);
  for (uint32_t i = 0; i < words; i++) {
    uint32_t m = it->mask[i];
    if (32 * i + 32 > (uint32_t)vocab) m &= (1u << ((uint32_t)vocab - 32 * i)) - 1u; /* ids past the vocabulary */
    if (m) return false;
  }
  return true;
}

/* The result of an item whose mask allows nothing: failed, no token. */
static void worker__item_mask_none(proto_result_item_t *ri) {
  FR_LOGE("slot %u: its allowed-token mask allows no token", ri->slot);
  ri->token = -1;
  ri->error = PROTO_ERR_BAD_REQUEST;
  ri->n_top = 0;
}

/* Samples the item's next token from its logits row; fills the result
 * item (top logprobs, logits handle). */
static void worker__sample_item(worker_t *w, const proto_step_item_t *it, float *row, int r) {
  proto_result_item_t *ri = &w->ritems[r];
  const proto_sampling_t *sp = &w->hist[it->slot].sp;
  memset(ri, 0, sizeof *ri);
  ri->slot = it->slot;
  if (sp->want_logits && w->logits_seg.base && r < w->logits_rows) {
    float *dst = (float *)kv_segment_data(&w->logits_seg) + (size_t)r * (size_t)w->vocab;
    memcpy(dst, row, (size_t)w->vocab * sizeof(float));
    ri->has_logits = true;
    ri->logits = (proto_logits_handle_t){.segment = (uint32_t)w->args.rank, .slot = it->slot, .row = (uint32_t)r};
  }
  if (sp->logprobs > 0) {
    int n = FR_MIN(sp->logprobs, (int)PROTO_MAX_TOPN);
    model_logprobs(row, w->vocab, n, w->top_ids, w->top_lp, NULL);
    ri->top = w->tops + (size_t)r * PROTO_MAX_TOPN;
    ri->n_top = (uint32_t)n;
    for (int i = 0; i < n; i++) ri->top[i] = (proto_toplp_t){.token = w->top_ids[i], .logprob = w->top_lp[i]};
  }
  worker_hist_t *h = &w->hist[it->slot];
  int pl = FR_MIN(h->prompt_len, h->len); /* output tokens follow the prompt */
  model_sampling_t p = worker__sampling(h);
  p.allow = it->mask, p.n_allow = (int)it->n_mask; /* the message's, valid for this step */
  uint64_t draw = (uint64_t)(h->len - pl);
  ri->token = model_sample(&w->smp, &p, row, h->tok, (size_t)pl, h->tok + pl, (size_t)(h->len - pl), draw,
                           &ri->logprob);
  if (!isfinite(ri->logprob)) worker__item_nonfinite(ri); /* a NaN or +Inf logit makes the log-softmax NaN */
  else if (worker__mask_none(it, w->vocab)) worker__item_mask_none(ri);
}

/* An embedding model's result: the pooled row itself (borrowed from
 * w->logits until the reply is encoded), no token. */
static void worker__embd_item(worker_t *w, const proto_step_item_t *it, float *row, int r) {
  proto_result_item_t *ri = &w->ritems[r];
  memset(ri, 0, sizeof *ri);
  ri->slot = it->slot;
  ri->token = -1;
  ri->n_embd = (uint32_t)w->m->cfg.dim;
  ri->embd = row;
  for (int i = 0; i < w->m->cfg.dim; i++)
    if (!isfinite(row[i])) {
      worker__item_nonfinite(ri);
      ri->n_embd = 0;
      return;
    }
}

/* --fake-workers (benchmarks of the coordinator): no logits, a token that
 * depends only on the position, so the worker's share stays tiny. */
static void worker__fake_sample(worker_t *w, const proto_step_item_t *it, int s, int r) {
  proto_result_item_t *ri = &w->ritems[r];
  memset(ri, 0, sizeof *ri);
  ri->slot = it->slot;
  ri->token = (int32_t)((1000 + w->ctx_len[s] % 1000) % w->vocab);
  ri->logprob = -0.5f;
}

/* True when every final item can be sampled on the device: no logits rows
 * (those go to the host's logits segment). Constrained decoding's masks
 * go to the device sampler with the rest of the row's params. */
static bool worker__device_sampling(const worker_t *w, const proto_step_t *st) {
  if (!w->be->ops->sample || st->n_items > 256 || w->spec) return false; /* proposals: verified on the host */
  if (w->m && w->m->pooling) return false; /* embeddings: nothing to sample */
  for (uint32_t i = 0; i < st->n_items; i++) /* logits rows: the host */
    if (st->items[i].final && w->hist[st->items[i].slot].sp.want_logits) return false;
  return true;
}

_Static_assert(PROTO_MAX_TOPN <= KERN_SAMPLE_MAX_TOP, "the device sampler returns up to KERN_SAMPLE_MAX_TOP");

/* Samples every row on the device; results for final items only. */
static int worker__sample_device(worker_t *w, const proto_step_t *st, const void *logits, uint32_t *n_res) {
  kern_sample_params_t sp[256];
  int32_t tok[256];
  float lp[256];
  for (uint32_t i = 0; i < st->n_items; i++) {
    const proto_step_item_t *it = &st->items[i];
    const worker_hist_t *h = &w->hist[it->slot];
    const proto_sampling_t *p = &h->sp; /* non-final rows: sampled, not reported */
    int pl = FR_MIN(h->prompt_len, h->len);
    sp[i] = (kern_sample_params_t){.temperature = p->temperature, .top_k = p->top_k, .top_p = p->top_p,
                                   .min_p = p->min_p, .seed = p->has_seed ? p->seed : 0,
                                   .counter = (uint64_t)(h->len - pl),
                                   .repetition_penalty = p->repetition_penalty,
                                   .presence_penalty = p->presence_penalty,
                                   .frequency_penalty = p->frequency_penalty,
                                   /* penalty lists and top logprobs only for rows that are reported */
                                   .prompt = it->final ? h->tok : NULL, .output = it->final ? h->tok + pl : NULL,
                                   .n_prompt = pl, .n_output = h->len - pl,
                                   .top_n = it->final ? FR_MIN(p->logprobs, (int)PROTO_MAX_TOPN) : 0,
                                   .top_ids = w->top_ids + (size_t)i * PROTO_MAX_TOPN,
                                   .top_lp = w->top_lp + (size_t)i * PROTO_MAX_TOPN,
                                   .bias = (const kern_bias_t *)h->bias, .n_bias = it->final ? (int)h->n_bias : 0,
                                   .ban = h->ban, .n_ban = it->final ? (int)h->n_ban : 0,
                                   .min_tokens = (int)FR_MIN(p->min_tokens, (uint32_t)INT32_MAX),
                                   /* the message's, valid for this step; final items only carry one */
                                   .allow = it->final && it->n_mask ? it->mask : NULL,
                                   .n_allow = it->final ? (int)it->n_mask : 0};
  }
  int rc = w->be->ops->sample(w->be->ctx, logits, (int)st->n_items, w->vocab, sp, tok, lp);
  if (rc) return rc;
  for (uint32_t i = 0; i < st->n_items; i++) {
    if (!st->items[i].final) continue;
    proto_result_item_t *ri = &w->ritems[(*n_res)++];
    memset(ri, 0, sizeof *ri);
    ri->slot = st->items[i].slot;
    ri->token = tok[i];
    ri->logprob = lp[i];
    if (!isfinite(lp[i])) { /* NaN or infinite logits give a NaN log-softmax */
      worker__item_nonfinite(ri);
      continue;
    }
    if (worker__mask_none(&st->items[i], w->vocab)) {
      worker__item_mask_none(ri);
      continue;
    }
    if (sp[i].top_n > 0) {
      ri->top = w->tops + (size_t)(*n_res - 1) * PROTO_MAX_TOPN;
      ri->n_top = (uint32_t)sp[i].top_n;
      for (int j = 0; j < sp[i].top_n; j++)
        ri->top[j] = (proto_toplp_t){.token = sp[i].top_ids[j], .logprob = sp[i].top_lp[j]};
    }
  }
  return 0;
}

static int worker__forward(worker_t *w, const proto_step_t *st, int n_tok, const void **logits) {
  kern_step_t ks = {
      .n_tokens = n_tok,
      .tokens = w->tokens,
      .n_seqs = (int)st->n_items,
      .positions = w->pos,
      .slots = w->slots,
      .q_start = w->q_start,
      .ctx_len = w->ctx_len,
      .block_tables = w->tables,
      .max_blocks = w->info.max_blocks_per_seq,
  };
  w->q_start[st->n_items] = n_tok;
  *logits = NULL;
  if (w->fake_forward) return 0; /* worker__fake_sample picks the tokens */
  return model_forward_rows(w->m, &w->pool, &ks, w->spec ? w->rows : NULL, logits);
}

/* The step's items this worker accepts, in *ok (items in w->ok_items),
 * with the batch built for them; each refused item gets a failed result
 * (counted in *n_res). */
static void worker__accept_items(worker_t *w, const proto_step_t *st, proto_step_t *ok, int *n_tok, uint32_t *n_res) {
  *ok = *st;
  ok->items = w->ok_items;
  ok->n_items = 0;
  *n_tok = 0;
  for (uint32_t i = 0; i < st->n_items; i++) {
    if (worker__add_item(w, &st->items[i], (int)ok->n_items, n_tok) == 0) w->ok_items[ok->n_items++] = st->items[i];
    else if (w->args.rank == 0) worker__item_refused(w, &st->items[i], (int)(*n_res)++);
  }
}

static int worker__run(worker_t *w, const proto_step_t *st_in, proto_result_t *res) {
  if (!w->loaded) return fr_errorf(FR_ESTATE, "no model loaded");
  if (st_in->n_items > (uint32_t)w->max_seqs)
    return fr_errorf(FR_ETOOBIG, "step has %u items, more than %d", st_in->n_items, w->max_seqs);
  for (uint32_t i = 0; i < st_in->n_freed; i++)
    if (st_in->freed[i] < (uint32_t)w->info.max_seqs) {
      w->hist[st_in->freed[i]].len = 0, w->hist[st_in->freed[i]].has_sp = false;
      if (w->dlen) w->dlen[st_in->freed[i]] = 0;
      if (w->remote) w->rlen[st_in->freed[i]] = 0;
    }
  int rc = w->remote ? worker__tables(w, st_in) : 0;
  if (!rc) rc = worker__slot_params(w, st_in);
  if (!rc) rc = worker__copies(w, st_in);
  if (rc) return rc;
  res->items = w->ritems;
  res->n_items = 0;
  proto_step_t okst, *st = &okst;
  int n_tok = 0;
  uint32_t n_res = 0;
  worker__accept_items(w, st_in, st, &n_tok, &n_res);
  res->n_items = n_res;
  w->spec = worker__spec_rows(w, st);
  if (st->n_items == 0) return 0;
  uint64_t t0 = fr_now_ns(), comm0 = w->m ? w->m->comm_ns : 0;
  if (!w->fake_forward && (rc = worker__draft_run(w, st, n_tok))) return rc;
  const void *logits;
  if ((rc = worker__forward(w, st, n_tok, &logits))) return rc;
  if (w->be->host_memory && w->m) res->timings.comm_us = (w->m->comm_ns - comm0) / 1000;
  uint64_t t1 = fr_now_ns();
  for (uint32_t i = 0; i < st->n_items; i++) {
    const proto_step_item_t *it = &st->items[i];
    if (it->pos == 0) w->hist[it->slot].len = 0;
    worker__hist_feed(&w->hist[it->slot], (int)it->pos, it->tokens, (int)it->n_tokens);
  }
  bool on_device = w->args.rank == 0 && !w->fake_forward && worker__device_sampling(w, st);
  if (on_device && (rc = worker__sample_device(w, st, logits, &n_res))) return rc;
  int n_rows = 0, x_used = 0;
  for (uint32_t i = 0; i < st->n_items; i++) n_rows += w->spec ? w->rows[i] : 1;
  if (w->args.rank == 0 && !on_device && !w->fake_forward &&
      (rc = model_logits_to_host(w->m, logits, n_rows, w->logits)))
    return rc;
  if (w->args.rank == 0 && !on_device)
    for (uint32_t i = 0, row = 0; i < st->n_items; row += w->spec ? (uint32_t)w->rows[i] : 1, i++) {
      const proto_step_item_t *it = &st->items[i];
      float *lg = w->logits + (size_t)row * (size_t)(w->m ? model_out_width(w->m) : w->vocab);
      if (!it->final) continue;
      if (w->fake_forward) worker__fake_sample(w, it, (int)i, (int)n_res++);
      else if (w->m->pooling) worker__embd_item(w, it, lg, (int)n_res++);
      else if (it->n_spec && it->draft && w->dm)
        worker__spec_verify(w, it, lg, w->dq + (size_t)w->drow[i] * (size_t)w->vocab, worker__draft_made(w, (int)i),
                            (int)n_res++, &x_used);
      else if (it->n_spec) worker__spec_verify(w, it, lg, NULL, 0, (int)n_res++, &x_used);
      else worker__sample_item(w, it, lg, (int)n_res++);
    }
  if ((rc = worker__prompt_lp(w, st, &n_res))) return rc;
  res->n_items = n_res;
  res->timings.forward_us = (t1 - t0) / 1000;
  res->timings.sample_us = (fr_now_ns() - t1) / 1000;
  return 0;
}

void worker_step_run(worker_t *w, const proto_step_t *st, proto_result_t *res) {
  uint64_t t0 = fr_now_ns();
  proto_body_default(PROTO_T_RESULT, res);
  res->step_id = st->step_id;
  res->epoch = st->epoch;
  res->rank = w->args.rank;
  int rc = worker__run(w, st, res);
  if (rc) {
    FR_LOGE("step %llu: %s", (unsigned long long)st->step_id, fr_last_error());
    res->n_items = 0;
    res->error.code = proto_err_from_fr(rc);
    res->error.message = (char *)fr_last_error();
  }
  res->timings.total_us = (fr_now_ns() - t0) / 1000;
}
