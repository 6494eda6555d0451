/* plp.c - prompt logprobs on the worker: after the step's forward pass the
 * final hidden states of every token are still there, so the rows an item
 * asks (proto_step_item_t.n_plp) get their logits max_seqs rows at a time
 * (model_logits_tokens), and rank 0 reduces each row to what is sent: the
 * log-softmax of the row's target token (the prompt token after it), its
 * rank and the top alternatives. A 4096-token prompt's logits never leave
 * the worker whole. */
#include <math.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "worker/worker.h"

/* The result item of the step's item for slot (a final item's), or a new
 * one with no token. */
static proto_result_item_t *worker__plp_result(worker_t *w, uint32_t slot, uint32_t *n_res) {
  for (uint32_t r = 0; r < *n_res; r++)
    if (w->ritems[r].slot == slot) return &w->ritems[r];
  proto_result_item_t *ri = &w->ritems[(*n_res)++];
  memset(ri, 0, sizeof *ri);
  ri->slot = slot;
  ri->token = -1;
  return ri;
}

/* One row: target's logprob and rank, top alternatives into top[0..k).
 * Returns false for non-finite logits. */
static bool worker__plp_row(worker_t *w, const float *row, int32_t target, int k, float *lp, uint32_t *rank,
                            proto_toplp_t *top) {
  float lse;
  model_logprobs(row, w->vocab, k, w->top_ids, w->top_lp, &lse);
  *lp = row[target] - lse;
  uint32_t above = 0;
  for (int v = 0; v < w->vocab; v++) above += row[v] > row[target];
  *rank = above + 1;
  for (int i = 0; i < k; i++) top[i] = (proto_toplp_t){.token = w->top_ids[i], .logprob = w->top_lp[i]};
  return isfinite(*lp);
}

/* Rows of item i (its tokens start at batch token q0) into the scratch from
 * *used on; fills its result item on rank 0. */
static int worker__plp_item(worker_t *w, const proto_step_item_t *it, int q0, uint32_t *n_res, uint32_t *used) {
  const int n = (int)it->n_plp, k = it->plp_top, chunk = w->max_seqs;
  float *lp = w->plp + *used;
  uint32_t *rank = w->plp_rank + *used;
  proto_toplp_t *top = w->plp_top + (size_t)*used * PROTO_MAX_TOPN;
  bool finite = true;
  for (int from = 0; from < n; from += chunk) {
    int cnt = FR_MIN(chunk, n - from);
    const void *lg;
    int rc = model_logits_tokens(w->m, q0 + from, cnt, &lg);
    if (rc) return rc;
    if (w->args.rank != 0) continue; /* it took part in the gather */
    if ((rc = model_logits_to_host(w->m, lg, cnt, w->logits))) return rc;
    for (int r = 0; r < cnt; r++) {
      int i = from + r;
      int32_t target = i + 1 < (int)it->n_tokens ? it->tokens[i + 1] : it->next;
      if (target < 0 || target >= w->vocab) return fr_errorf(FR_EPROTO, "slot %u: prompt token %d out of range", it->slot, target);
      finite &= worker__plp_row(w, w->logits + (size_t)r * (size_t)w->vocab, target, k, &lp[i], &rank[i],
                                top + (size_t)i * (size_t)k);
    }
  }
  if (w->args.rank != 0) return 0;
  proto_result_item_t *ri = worker__plp_result(w, it->slot, n_res);
  if (!finite) {
    worker__item_nonfinite(ri);
    return 0;
  }
  ri->plp = lp, ri->n_plp = ri->n_plp_rank = (uint32_t)n;
  ri->plp_rank = rank;
  ri->plp_top = top, ri->n_plp_top = (uint32_t)n * (uint32_t)k;
  *used += (uint32_t)n;
  return 0;
}

int worker__prompt_lp(worker_t *w, const proto_step_t *st, uint32_t *n_res) {
  if (w->fake_forward) return 0;
  uint32_t used = 0;
  for (uint32_t i = 0; i < st->n_items; i++) {
    const proto_step_item_t *it = &st->items[i];
    if (!it->n_plp) continue;
    int rc = worker__plp_item(w, it, w->q_start[i], n_res, &used);
    if (rc) return rc;
  }
  return 0;
}
