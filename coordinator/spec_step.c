/* spec_step.c - speculative decoding in the coordinator's step cycle:
 * before each plan the n-gram proposer (spec.c) guesses the next tokens of
 * the running decodes, written after each job's last token (job->tok[n_tok
 * ..]), or, with a draft model, the job gets room for that many proposals
 * (placeholders there: copies of its last token) that the worker's draft
 * model fills in (worker/draft.c, the step item's dm); the scheduler sends
 * them with the decode when there is room; when
 * the result comes, the accepted count goes to the scheduler's commit
 * (which keeps their KV and truncates the slot past them) and the tokens
 * are appended one by one through the ordinary stop rules, so tokens after
 * a stop are dropped. */
#include <string.h>

#include "common/fr_util.h"
#include "coordinator/coord_impl.h"
#include "coordinator/metrics.h"

/* Proposals a job may get now: what its max_tokens, the context and the
 * rows left allow. */
static int coord__spec_room(const coord_t *c, const coord_job_t *j, int rows_left) {
  int k = FR_MIN(c->cfg.spec.num_speculative_tokens, (int)PROTO_MAX_SPEC);
  k = FR_MIN(k, j->max_tokens - (j->n_tok - j->n_prompt) - 1); /* the step's own token is the last one allowed */
  k = FR_MIN(k, c->max_model_len - j->n_tok - 1);
  return FR_MIN(k, rows_left);
}

/* How many proposals job j may get (of room): all while its recent
 * acceptance is at least min_acceptance_rate; else none (a proposal costs
 * compute), but one every 8th decode, a cheap probe that lets it come back
 * when its output starts repeating. */
static int coord__spec_worth(const coord_t *c, coord_job_t *j, int room) {
  float rate = c->cfg.spec.min_acceptance_rate;
  if (rate < 0) rate = !c->spec_gpu ? COORD_SPEC_RATE_CPU : c->cfg.spec.draft_model[0] ? COORD_SPEC_RATE_GPU_DRAFT
                                                                                      : COORD_SPEC_RATE_GPU;
  if (1.0f - j->spec_miss >= rate) return room;
  if (++j->spec_idle < 8) return 0;
  j->spec_idle = 0;
  return FR_MIN(room, 1);
}

/* A draft model's room: n placeholder tokens (the last token again, a
 * valid id) that the worker overwrites with its proposals. */
static int coord__spec_placeholders(coord_job_t *j, int n) {
  for (int i = 0; i < n; i++) j->tok[j->n_tok + i] = j->tok[j->n_tok - 1];
  return n;
}

void coord__spec_propose(coord_t *c) {
  coord_sched_t *s = &c->sched;
  const coord_spec_config_t *k = &c->cfg.spec;
  if (k->num_speculative_tokens <= 0) return;
  c->spec_gpu = strncmp(c->device, "cpu", 3) != 0;
  int active = s->n_running + s->n_waiting;
  int limit = k->disable_by_batch_size > 0 ? k->disable_by_batch_size
              : !c->spec_gpu                ? COORD_SPEC_BATCH_CPU
              : k->draft_model[0]           ? COORD_SPEC_BATCH_GPU_DRAFT
                                            : COORD_SPEC_BATCH_GPU;
  bool on = active <= limit;
  int rows_left = c->cfg.max_num_seqs - FR_MIN(active, c->cfg.max_num_seqs); /* a row for every job first */
  for (coord_job_t *j = s->running_head; j; j = j->next) {
    j->n_spec = 0;
    /* a guided job (constrained decoding) is not speculated: its mask holds for its next token only */
    if (!on || j->in_step || j->n_tok - j->n_computed != 1 || j->return_logits || j->guide) continue;
    int room = coord__spec_room(c, j, rows_left);
    if (room <= 0 || (room = coord__spec_worth(c, j, room)) <= 0) continue;
    j->n_spec = k->draft_model[0] ? coord__spec_placeholders(j, room)
                                  : coord_spec_propose(k, j->tok, j->n_tok, room, j->tok + j->n_tok);
    rows_left -= j->n_spec;
  }
}

/* Proposals of item s that the result accepted: the leading tokens it
 * returned that are the proposals (the last token returned is the model's
 * own); a draft model's proposals are the worker's, all of its tokens but
 * the last. */
static int coord__spec_count(const coord_t *c, const coord_job_t *j, const coord_sitem_t *s,
                             const proto_result_item_t *it) {
  if (!it || it->error) return 0;
  if (c->cfg.spec.draft_model[0]) return FR_MIN((int)it->n_extra, s->n_spec);
  const int32_t *prop = j->tok + s->pos + s->n - s->n_spec;
  int a = 0, n = FR_MIN((int)it->n_extra, s->n_spec);
  while (a < n && (a == 0 ? it->token : it->extra[a - 1]) == prop[a]) a++;
  return a;
}

void coord__spec_accepted(coord_t *c) {
  const coord_sched_batch_t *b = &c->sched.batch;
  for (int i = 0; i < b->n_items; i++) {
    const coord_sitem_t *s = &b->items[i];
    if (!s->n_spec) continue;
    int a = s->job->state == COORD_JOB_DONE ? 0 : coord__spec_count(c, s->job, s, c->res_by_slot[s->slot]);
    coord_sched_set_accepted(&c->sched, i, a);
    s->job->spec_miss = 0.7f * s->job->spec_miss + 0.3f * (float)(s->n_spec - a) / (float)s->n_spec;
    if (c->metrics) coord_metrics_spec(c->metrics, s->n_spec, a);
  }
}

void coord__spec_append(coord_t *c, coord_job_t *j, const proto_result_item_t *it, const float *logits_row) {
  coord__job_append(c, j, it, logits_row);
  for (uint32_t e = 0; e < it->n_extra && j->finish == PROTO_FINISH_NONE; e++) {
    coord__stream_stop_check(c, j); /* a stop string may end at the token before */
    if (j->finish != PROTO_FINISH_NONE) break;
    bool top = it->n_extra_top == it->n_extra * it->n_top;
    proto_result_item_t x = {.slot = it->slot,
                             .token = it->extra[e],
                             .logprob = it->n_extra_lp ? it->extra_lp[e] : 0.0f,
                             .n_top = top ? it->n_top : 0,
                             .top = top ? it->extra_top + (size_t)e * it->n_top : NULL};
    coord__job_append(c, j, &x, NULL);
  }
}
