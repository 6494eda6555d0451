/* spec.c - speculative decoding on the worker: an item may end with
 * n_spec proposed tokens (the coordinator's n-gram proposer guessed them,
 * or the worker's draft model (draft.c) made them); the forward pass gives
 * logits for its last 1 + n_spec positions and rank 0
 * verifies the proposals in order (model_sample_verify: greedy = the
 * argmax, temperature > 0 = rejection sampling against the draft's q, or
 * a one-hot q for the n-gram's), emitting the accepted
 * ones and then the model's own token: 1..n_spec + 1 tokens per item.
 * Position j sees the bias, bans and penalties with the proposals before
 * it counted as output, exactly as without speculation once they are
 * accepted. Rejected positions leave K/V behind that the next step
 * overwrites (the coordinator truncates the slot). */
#include <math.h>
#include <string.h>

#include "common/fr_hash.h"
#include "common/fr_util.h"
#include "worker/worker.h"

bool worker__spec_rows(worker_t *w, const proto_step_t *st) {
  bool any = false;
  for (uint32_t i = 0; i < st->n_items; i++) {
    w->rows[i] = 1 + (int32_t)st->items[i].n_spec;
    any |= st->items[i].n_spec > 0;
  }
  return any;
}

/* The top logprobs of one row into top[0..n). */
static void worker__spec_top(worker_t *w, const float *row, int n, proto_toplp_t *top) {
  model_logprobs(row, w->vocab, n, w->top_ids, w->top_lp, NULL);
  for (int i = 0; i < n; i++) top[i] = (proto_toplp_t){.token = w->top_ids[i], .logprob = w->top_lp[i]};
}

/* Emits token e of the item (0: the result item's own fields, then extras). */
static void worker__spec_emit(worker_t *w, proto_result_item_t *ri, int e, int32_t tok, float lp, int *x_used) {
  if (e == 0) {
    ri->token = tok, ri->logprob = lp;
    return;
  }
  if (e == 1) { /* the item's extras start here */
    ri->extra = w->xtok + *x_used, ri->extra_lp = w->xlp + *x_used;
    if (ri->n_top) ri->extra_top = w->xtop + (size_t)*x_used * PROTO_MAX_TOPN;
  }
  ri->extra[e - 1] = tok, ri->extra_lp[e - 1] = lp;
  ri->n_extra = ri->n_extra_lp = (uint32_t)e;
  ri->n_extra_top = ri->n_top * (uint32_t)e;
}

/* FERRUM_SPEC_FORCE_ACCEPT: whether the proposal at context ctx of a slot
 * is taken regardless of the logits (a reproducible draw per position). */
static bool worker__spec_forced(const worker_t *w, uint32_t slot, int ctx) {
  if (w->force_accept < 0) return false;
  uint64_t h = fr_mix64(((uint64_t)slot << 32) ^ (uint64_t)(uint32_t)ctx ^ 0x5eedULL);
  return (double)(h >> 11) * 0x1.0p-53 < (double)w->force_accept;
}

void worker__spec_verify(worker_t *w, const proto_step_item_t *it, float *rows, const float *q, int n_q, int r,
                         int *x_used) {
  proto_result_item_t *ri = &w->ritems[r];
  worker_hist_t *h = &w->hist[it->slot];
  memset(ri, 0, sizeof *ri);
  ri->slot = it->slot;
  const int k = (int)it->n_spec, V = w->vocab, base = (int)(it->n_tokens - it->n_spec); /* proposals: tokens[base..] */
  const int n_top = h->sp.logprobs > 0 ? FR_MIN(h->sp.logprobs, (int)PROTO_MAX_TOPN) : 0;
  const int pl = FR_MIN(h->prompt_len, h->len);
  model_sampling_t p = worker__sampling(h);
  ri->n_top = (uint32_t)n_top;
  ri->top = w->tops + (size_t)r * PROTO_MAX_TOPN;
  int e = 0;
  for (int j = 0; j <= k; j++) {
    float *row = rows + (size_t)j * (size_t)V, lp;
    int ctx = (int)it->pos + base + j; /* tokens before this prediction: the proposals before j count */
    /* extras' tops: n_top per token, token after token, from the item's share of xtop */
    proto_toplp_t *top = e == 0 ? ri->top : w->xtop + (size_t)*x_used * PROTO_MAX_TOPN + (size_t)(e - 1) * n_top;
    if (n_top) worker__spec_top(w, row, n_top, top);
    uint64_t draw = (uint64_t)(ctx - pl);
    const int32_t *out = h->tok + pl;
    int32_t tok;
    if (j < k && worker__spec_forced(w, it->slot, ctx))
      tok = it->tokens[base + j], lp = 0.0f;
    else if (j < k)
      tok = model_sample_verify(&w->smp, &p, row, h->tok, (size_t)pl, out, (size_t)(ctx - pl), draw,
                                it->tokens[base + j], j < n_q ? q + (size_t)j * (size_t)V : NULL, &lp);
    else
      tok = model_sample(&w->smp, &p, row, h->tok, (size_t)pl, out, (size_t)(ctx - pl), draw, &lp);
    if (!isfinite(lp)) {
      worker__item_nonfinite(ri);
      ri->n_extra = ri->n_extra_lp = ri->n_extra_top = 0;
      return;
    }
    worker__spec_emit(w, ri, e++, tok, lp, x_used);
    if (j == k || tok != it->tokens[base + j]) break; /* rejected: tok came from the residual */
  }
  *x_used += e - 1;
}
