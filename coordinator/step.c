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

static int coord__step_send(coord_t *c) {
  proto_step_t st = {
      .step_id = ++c->step_id,
      .epoch = c->epoch,
      .n_items = (uint32_t)c->n_sitems,
      .items = c->pitems,
      .n_freed = (uint32_t)c->n_freed,
      .freed = c->freed,
      .n_copies = (uint32_t)c->n_copies,
      .copies = c->copies,
  };
  int rc = proto_encode(&c->out, PROTO_T_STEP, &st);
  if (rc) return rc;
  for (int r = 0; r < c->n_workers; r++) {
    if ((rc = coord__worker_send_buf(c, &c->workers[r], &c->out))) return rc;
  }
  c->n_freed = 0;
  c->step_busy = true;
  c->step_results = 0;
  c->step_sent_ns = fr_now_ns();
  c->n_steps++;
  return 0;
}

void coord__step_kick(coord_t *c) {
  if (!c->ready || c->step_busy) return;
  if (!c->running_head && !c->waiting_head) return;
  if (coord__sched_build(c) == 0) return;
  int rc = coord__step_send(c);
  if (rc) {
    FR_LOGE("sending step %llu: %s", (unsigned long long)c->step_id, fr_last_error());
    coord__step_abort(c);
  }
}

/* Phase 1: the result's tokens go to their jobs. */
static void coord__apply(coord_t *c, const proto_result_t *r) {
  uint32_t ri = 0;
  const float *lbase = c->logits_seg.base ? (const float *)kv_segment_data(&c->logits_seg) : NULL;
  size_t lrows = lbase ? kv_segment_data_size(&c->logits_seg) / ((size_t)c->vocab * sizeof(float)) : 0;
  c->n_touched = 0;
  for (int i = 0; i < c->n_sitems; i++) {
    coord_sitem_t *s = &c->sitems[i];
    coord_job_t *j = s->job;
    const proto_result_item_t *it = NULL;
    if (s->final) {
      if (ri < r->n_items && r->items[ri].slot == (uint32_t)j->slot) it = &r->items[ri++];
      else FR_LOGE("step %llu: no result for slot %d", (unsigned long long)r->step_id, j->slot);
    }
    j->in_step = false;
    if (j->state == COORD_JOB_DONE) { /* canceled or stopped while in flight */
      coord__job_free_slot(c, j);
      if (!coord__job_reap(c, j)) c->touched[c->n_touched++] = j;
      continue;
    }
    j->n_computed += s->n;
    if (!c->cfg.no_prefix_caching) kv_prefix_commit(c->kv, j->slot, j->tok, j->n_computed);
    if (s->final) {
      const float *row = NULL;
      if (it && it->has_logits && lbase && it->logits.row < lrows) row = lbase + (size_t)it->logits.row * (size_t)c->vocab;
      if (it) coord__job_append(c, j, it, row);
      else coord__job_finish(c, j, PROTO_FINISH_ERROR);
      c->touched[c->n_touched++] = j;
    }
  }
}

static void coord__step_fail(coord_t *c, const proto_result_t *r) {
  FR_LOGE("step %llu failed on the worker: %s", (unsigned long long)r->step_id,
          r->error.message ? r->error.message : "?");
  c->n_touched = 0;
  for (int i = 0; i < c->n_sitems; i++) {
    coord_job_t *j = c->sitems[i].job;
    j->in_step = false;
    coord__job_finish(c, j, PROTO_FINISH_ERROR);
    coord__job_free_slot(c, j);
    c->touched[c->n_touched++] = j;
  }
}

void coord__step_on_result(coord_t *c, const proto_result_t *r, int rank) {
  if (!c->step_busy || r->step_id != c->step_id || r->epoch != c->epoch) {
    FR_LOGD("stale result %llu from rank %d ignored", (unsigned long long)r->step_id, rank);
    return;
  }
  uint64_t t0 = c->t_rx_ns ? c->t_rx_ns : fr_now_ns();
  int n_items = c->n_sitems;
  if (rank == 0) {
    if (r->error.code) coord__step_fail(c, r);
    else coord__apply(c, r);
  }
  c->step_results |= 1u << rank;
  if (c->step_results != (1u << c->n_workers) - 1) return;
  c->step_busy = false;
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
  for (int i = 0; i < c->n_sitems && c->step_busy; i++) {
    coord_job_t *j = c->sitems[i].job;
    j->in_step = false;
    if (j->state == COORD_JOB_DONE) {
      coord__job_free_slot(c, j);
      coord__job_reap(c, j);
    }
  }
  c->n_sitems = 0;
  c->step_busy = false;
  c->epoch++;
}
