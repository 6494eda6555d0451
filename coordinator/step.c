/* step.c - step descriptors out, results in.
 *
 * One step is in flight at a time. When its result arrives the loop (1)
 * applies the sampled tokens and the token-level stop rules, frees what
 * finished and commits computed blocks to the prefix cache, (2) schedules
 * and sends the next step at once, and only then (3) detokenizes, checks
 * stop strings and streams, so (3) overlaps the workers' next forward pass.
 * A job that (3) finishes is in the step just sent: its blocks are freed
 * when that step's result arrives, never while a worker may write them.
 */
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_log.h"
#include "common/fr_util.h"
#include "coordinator/coord_impl.h"
#include "coordinator/metrics.h"

/* The calling thread's CPU time in ns. */
uint64_t coord__cpu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Records the loop's own time for one step (4 entries): wall ns from the
 * result's arrival to the end of streaming, the loop thread's CPU ns over
 * the same span, wall ns to the next step's send (the critical path: the
 * workers wait for it), items. */
static void coord__stats_add(coord_t *c, uint64_t ns, uint64_t cpu_ns, uint64_t crit_ns, int n_items) {
  coord_stats_t *s = &c->stats;
  if (s->n + 4 > s->cap) {
    s->cap = s->cap ? 2 * s->cap : 16384;
    s->us = fr_realloc(s->us, s->cap * sizeof *s->us);
  }
  s->us[s->n++] = (uint32_t)FR_MIN(ns, UINT32_MAX);
  s->us[s->n++] = (uint32_t)FR_MIN(cpu_ns, UINT32_MAX);
  s->us[s->n++] = (uint32_t)FR_MIN(crit_ns, UINT32_MAX);
  s->us[s->n++] = (uint32_t)n_items;
}

/* The wire form of a planned item; the sampling params travel once per
 * slot assignment (workers keep them). */
static void coord__step_item(proto_step_item_t *it, const coord_sitem_t *s, bool draft) {
  coord_job_t *j = s->job;
  it->slot = (uint32_t)s->slot;
  it->pos = (uint32_t)s->pos;
  it->n_tokens = (uint32_t)s->n;
  it->tokens = j->tok + s->pos;
  it->final = s->final;
  it->n_spec = (uint32_t)s->n_spec;
  it->draft = s->n_spec > 0 && draft; /* the worker's draft model fills the placeholders in */
  it->has_sp = !j->sp_sent;
  if (it->has_sp) it->sp = j->sp;
  j->sp_sent = true;
  it->prompt_len = it->has_sp ? (uint32_t)j->n_prompt : 0;
  it->n_ban = it->has_sp ? j->n_ban : 0;
  it->ban = it->has_sp ? j->ban : NULL;
  /* prompt logprobs: the rows whose target (the next token) is a prompt token */
  int rows = j->plp_want && !j->plp_sent && s->n_spec == 0 ? FR_MIN(s->n, j->n_prompt - 1 - s->pos) : 0;
  it->n_plp = (uint32_t)FR_MAX(rows, 0);
  it->plp_top = it->n_plp ? j->plp_k : 0;
  it->next = rows == s->n ? j->tok[s->pos + s->n] : 0;
}

/* A result item's prompt logprob rows into the job, by target position. */
static void coord__plp_store(coord_job_t *j, const coord_sitem_t *s, const proto_result_item_t *it) {
  if (!j->plp || !it->n_plp) return;
  uint32_t k = it->n_plp_top / it->n_plp;
  for (uint32_t i = 0; i < it->n_plp; i++) {
    int t = s->pos + (int)i + 1;
    if (t >= j->n_prompt) break;
    j->plp[t] = it->plp[i];
    j->plp_rank[t] = it->n_plp_rank ? it->plp_rank[i] : 0;
    for (uint32_t e = 0; e < (uint32_t)j->plp_k; e++)
      j->plp_top[(size_t)t * (size_t)j->plp_k + e] = e < k ? it->plp_top[(size_t)i * k + e] : (proto_toplp_t){-1, 0};
  }
}

/* Encodes the planned batch and sends it to every rank; *bad gets the rank
 * a send failed to (or -1). */
static int coord__step_send(coord_t *c, const coord_sched_batch_t *b, int *bad) {
  *bad = -1;
  for (int i = 0; i < b->n_items; i++) {
    coord__step_item(&c->pitems[i], &b->items[i], c->cfg.spec.draft_model[0] != 0);
    coord__guide_item(c, b->items[i].job, &c->pitems[i]); /* constrained decoding's mask, or none */
  }
  if (b->n_copies > c->copies_cap) {
    c->copies_cap = FR_MAX(b->n_copies, 2 * c->copies_cap);
    c->copies = fr_realloc(c->copies, (size_t)c->copies_cap * sizeof *c->copies);
  }
  for (int i = 0; i < b->n_copies; i++)
    c->copies[i] = (proto_copy_t){.src = (uint32_t)b->copies[i].src, .dst = (uint32_t)b->copies[i].dst};
  proto_step_t st = {
      .step_id = ++c->step_id,
      .epoch = c->epoch,
      .n_items = (uint32_t)b->n_items,
      .items = c->pitems,
      .n_freed = (uint32_t)b->n_freed,
      .freed = b->freed,
      .n_copies = (uint32_t)b->n_copies,
      .copies = c->copies,
  };
  coord__remote_tables(c, b, &st);
  int rc = proto_encode(&c->out, PROTO_T_STEP, &st);
  if (rc) return rc;
  for (int r = 0; r < c->n_workers; r++) {
    if ((rc = coord__mbox_send(c, &c->workers[r], &c->out))) {
      *bad = r;
      return rc;
    }
  }
  coord_sched_sent(&c->sched);
  c->step_tokens = 0;
  for (int i = 0; i < b->n_items; i++) c->step_tokens += b->items[i].n;
  c->step_busy = true;
  c->step_results = 0;
  c->step_sent_ns = fr_now_ns();
  c->n_steps++;
  return 0;
}

/* Adds what the scheduler counted since the last call to the metrics. */
static void coord__step_report(coord_t *c) {
  const coord_sched_counters_t *n = &c->sched.counters, *o = &c->reported;
  if (c->metrics && n->n_preemptions != o->n_preemptions)
    coord_metrics_preemption(c->metrics, n->n_preemptions - o->n_preemptions);
  if (c->metrics && n->prefix_queries != o->prefix_queries) {
    coord_metrics_prefix(c->metrics, n->prefix_queries - o->prefix_queries, n->prefix_hits - o->prefix_hits);
    coord_metrics_tokens(c->metrics, n->prefix_queries - o->prefix_queries, 0); /* prompt tokens admitted */
  }
  if (c->metrics && n->n_forks != o->n_forks)
    coord_metrics_fork(c->metrics, n->n_forks - o->n_forks, n->fork_shared - o->fork_shared,
                       n->fork_copied - o->fork_copied);
  c->reported = *n;
}

/* Ends the jobs the plan removed because their slot could not grow. */
static void coord__step_end_failed(coord_t *c, const coord_sched_batch_t *b) {
  for (int i = 0; i < b->n_failed; i++) {
    coord_job_t *j = b->failed[i];
    coord__job_finish(c, j, b->failed_rc[i] == FR_ECONTEXT ? PROTO_FINISH_LENGTH : PROTO_FINISH_ERROR);
    coord__stream_job(c, j);
    coord__job_reap(c, j);
  }
}

/* Keeps the slowest recent time per token (decaying by 1% a step), which
 * scales the deadline of the next steps (coord__step_deadline_ms). */
static void coord__step_timed(coord_t *c, uint64_t ns) {
  double per_token = (double)ns / FR_MAX(c->step_tokens, 1);
  c->step_ns_per_token = FR_MAX(per_token, 0.99 * c->step_ns_per_token);
}

void coord__step_kick(coord_t *c) {
  if (!c->ready || c->step_busy) return;
  if (!c->sched.running_head && !c->sched.waiting_head) return;
  coord__spec_propose(c);
  const coord_sched_batch_t *b = coord_sched_plan(&c->sched);
  coord__step_report(c);
  coord__step_end_failed(c, b);
  if (b->n_items == 0) return;
  int bad, rc = coord__step_send(c, b, &bad);
  if (rc) {
    FR_LOGE("sending step %llu: %s", (unsigned long long)c->step_id, fr_last_error());
    coord__step_abort(c);
    /* a remote rank whose connection is gone is not waited for until its silence says so */
    if (bad >= 0 && c->workers[bad].remote) coord__workers_remote_unreachable(c, &c->workers[bad]);
  }
}

/* The result item for each slot of the step (NULL: none), from a result
 * whose items may come in any order. */
static void coord__results_by_slot(coord_t *c, const proto_result_t *r) {
  const coord_sched_batch_t *b = &c->sched.batch;
  for (int i = 0; i < b->n_items; i++) c->res_by_slot[b->items[i].slot] = NULL;
  for (uint32_t k = 0; k < r->n_items; k++)
    if (r->items[k].slot < (uint32_t)c->cfg.max_num_seqs) c->res_by_slot[r->items[k].slot] = &r->items[k];
}

/* A result item that failed alone: its job ends with the error, the
 * step's others stand. */
static void coord__item_failed(coord_t *c, coord_job_t *j, const proto_result_item_t *it) {
  bool nonfinite = it->error == PROTO_ERR_INTERNAL;
  FR_LOGE("job %llu: %s", (unsigned long long)j->id,
          nonfinite ? "the model produced non-finite logits" : "the worker refused its tokens");
  if (nonfinite && c->metrics) coord_metrics_nonfinite(c->metrics);
  coord__job_fail(c, j, it->error, nonfinite ? "the model produced non-finite logits (NaN or infinity)"
                                             : "the worker refused this request's tokens");
}

/* Phase 1: the scheduler advances the jobs, then the result's tokens go to
 * them. */
static void coord__apply(coord_t *c, const proto_result_t *r) {
  const coord_sched_batch_t *b = &c->sched.batch;
  const float *lbase = c->logits_seg.base ? (const float *)kv_segment_data(&c->logits_seg) : NULL;
  size_t lrows = lbase ? kv_segment_data_size(&c->logits_seg) / ((size_t)c->vocab * sizeof(float)) : 0;
  c->n_touched = 0;
  coord__results_by_slot(c, r);
  coord__spec_accepted(c);
  coord_sched_commit(&c->sched, true);
  for (int i = 0; i < b->n_items; i++) {
    const coord_sitem_t *s = &b->items[i];
    coord_job_t *j = s->job;
    const proto_result_item_t *it = c->res_by_slot[s->slot];
    if (j->state == COORD_JOB_DONE) { /* canceled or stopped while in flight: its slot is free now */
      if (!coord__job_reap(c, j)) c->touched[c->n_touched++] = j;
      continue;
    }
    if (it && !it->error) coord__plp_store(j, s, it);
    if (it && it->error) {
      coord__item_failed(c, j, it);
      c->touched[c->n_touched++] = j;
    } else if (s->final) {
      const float *row = NULL;
      if (!it) FR_LOGE("step %llu: no result for slot %d", (unsigned long long)r->step_id, s->slot);
      if (it && it->has_logits && lbase && it->logits.row < lrows) row = lbase + (size_t)it->logits.row * (size_t)c->vocab;
      if (it && j->embed) coord__job_embedding(c, j, it);
      else if (it) coord__spec_append(c, j, it, row);
      else coord__job_finish(c, j, PROTO_FINISH_ERROR);
      c->touched[c->n_touched++] = j;
    }
  }
}

static void coord__step_fail(coord_t *c, const proto_result_t *r) {
  FR_LOGE("step %llu failed on the worker: %s", (unsigned long long)r->step_id,
          r->error.message ? r->error.message : "?");
  const coord_sched_batch_t *b = &c->sched.batch;
  c->n_touched = 0;
  coord_sched_commit(&c->sched, false);
  for (int i = 0; i < b->n_items; i++) {
    coord_job_t *j = b->items[i].job;
    coord__job_finish(c, j, PROTO_FINISH_ERROR);
    c->touched[c->n_touched++] = j;
  }
}

void coord__step_on_result(coord_t *c, const proto_result_t *r, int rank) {
  if (!c->step_busy || r->step_id != c->step_id || r->epoch != c->epoch) {
    FR_LOGD("stale result %llu from rank %d ignored", (unsigned long long)r->step_id, rank);
    return;
  }
  uint64_t t0 = c->t_rx_ns ? c->t_rx_ns : fr_now_ns();
  int n_items = c->sched.batch.n_items;
  coord_rank_times_t times = {.forward_us = r->timings.forward_us, .comm_us = r->timings.comm_us,
                              .sample_us = r->timings.sample_us, .total_us = r->timings.total_us};
  coord_metrics_rank_step(c->metrics, rank, &times);
  if (rank == 0) {
    if (r->error.code) coord__step_fail(c, r);
    else coord__apply(c, r);
  }
  c->step_results |= 1u << rank;
  if (c->step_results != (1u << c->n_workers) - 1) return;
  c->step_busy = false;
  coord__step_timed(c, t0 - c->step_sent_ns);
  coord_metrics_step(c->metrics, t0 - c->step_sent_ns);
  coord__step_kick(c); /* (2): next step out before (3) */
  uint64_t t_sent = fr_now_ns();
  for (int i = 0; i < c->n_touched; i++) {
    coord_job_t *j = c->touched[i];
    coord__stream_job(c, j);
    coord__job_reap(c, j);
  }
  c->n_touched = 0;
  if (c->step_stats_path) coord__stats_add(c, fr_now_ns() - t0, coord__cpu_ns() - c->t_rx_cpu_ns, t_sent - t0, n_items);
}

void coord__step_abort(coord_t *c) {
  const coord_sched_batch_t *b = &c->sched.batch;
  if (c->sched.busy) { /* planned, its result not applied */
    coord_sched_commit(&c->sched, false);
    for (int i = 0; i < b->n_items; i++)
      if (b->items[i].job->state == COORD_JOB_DONE) coord__job_reap(c, b->items[i].job);
  }
  c->step_busy = false;
  c->epoch++;
}
