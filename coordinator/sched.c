/* sched.c - the scheduler: continuous batching under a token budget and a
 * sequence cap, vLLM v1 style.
 *
 * Each step: running jobs first, oldest admission first, each gets the
 * tokens it still needs (one for a decode, a chunk for a prefill that did
 * not fit earlier, all of them after a preemption) while the budget lasts;
 * then waiting jobs are admitted in queue order (priority, then FIFO) while
 * blocks and slots last, taking their cached prefix from the prefix cache.
 * When a running job cannot grow, the newest running job is preempted (its
 * blocks freed, its tokens kept, requeued at the front) and later
 * recomputed. The queue head is never skipped, so nothing starves behind
 * later arrivals of the same priority.
 *
 * Runs only while no step is in flight, so every slot it touches is idle.
 */
#include <errno.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_log.h"
#include "common/fr_util.h"
#include "coordinator/coord_impl.h"
#ifdef FERRUM_HAVE_METRICS
#include "coordinator/metrics.h"
#endif

static void coord__add_copy(coord_t *c, const kv_copy_t *cp) {
  if (cp->src < 0) return;
  if (c->n_copies == c->copies_cap) {
    c->copies_cap = c->copies_cap ? 2 * c->copies_cap : 64;
    c->copies = fr_realloc(c->copies, (size_t)c->copies_cap * sizeof *c->copies);
  }
  c->copies[c->n_copies++] = (proto_copy_t){.src = (uint32_t)cp->src, .dst = (uint32_t)cp->dst};
}

/* Puts n tokens of j (from n_computed on) in the step. */
static void coord__add_item(coord_t *c, coord_job_t *j, int n) {
  int k = c->n_sitems++;
  bool final = j->n_computed + n == j->n_tok;
  c->sitems[k] = (coord_sitem_t){.job = j, .n = n, .final = final};
  proto_step_item_t *it = &c->pitems[k];
  it->slot = (uint32_t)j->slot;
  it->pos = (uint32_t)j->n_computed;
  it->n_tokens = (uint32_t)n;
  it->tokens = j->tok + j->n_computed;
  it->final = final;
  it->has_sp = !j->sp_sent; /* once per slot assignment: workers keep them */
  if (it->has_sp) it->sp = j->sp;
  j->sp_sent = true;
  it->prompt_len = it->has_sp ? (uint32_t)j->n_prompt : 0;
  j->in_step = true;
  j->n_sched = n;
}

void coord__sched_preempt(coord_t *c, coord_job_t *j, bool count) {
  FR_LOGD("preempting job %llu (%d tokens)", (unsigned long long)j->id, j->n_tok);
  coord__list_remove(c, j);
  coord__job_free_slot(c, j);
  coord__waiting_push(c, j, true);
  if (!count) return;
  c->n_preemptions++;
#ifdef FERRUM_HAVE_METRICS
  if (c->metrics) coord_metrics_preemption(c->metrics, 1);
#endif
}

/* Grows j's slot by n tokens, preempting newer jobs when blocks run out.
 * Returns 0, 1 when j itself was preempted, or an error. */
static int coord__grow(coord_t *c, coord_job_t *j, int n) {
  for (;;) {
    kv_copy_t cp;
    int rc = kv_seq_append(c->kv, j->slot, n, &cp);
    if (rc == 0) {
      coord__add_copy(c, &cp);
      return 0;
    }
    if (rc != FR_EBUSY) return rc;
    coord_job_t *victim = c->running_tail;
    while (victim && victim->in_step) victim = victim->prev;
    if (!victim || victim == j) {
      coord__sched_preempt(c, j, true);
      return 1;
    }
    coord__sched_preempt(c, victim, true);
  }
}

/* Schedules one running job's next tokens; returns false when the job
 * itself had to be preempted (stop: nothing newer is left to preempt). */
static bool coord__sched_one(coord_t *c, coord_job_t *j, int n, int *budget) {
  int rc = coord__grow(c, j, n);
  if (rc == 1) return false;
  if (rc < 0) {
    FR_LOGE("job %llu: %s", (unsigned long long)j->id, fr_last_error());
    coord__job_finish(c, j, rc == FR_ECONTEXT ? PROTO_FINISH_LENGTH : PROTO_FINISH_ERROR);
    coord__stream_job(c, j);
    coord__job_reap(c, j);
    return true;
  }
  coord__add_item(c, j, n);
  *budget -= n;
  return true;
}

/* Running jobs, oldest admission first: decodes in a first pass, then the
 * chunks of prefills (prompts that did not fit one step, recomputations),
 * so a long prefill never holds back the decodes of newer jobs. */
static void coord__sched_running(coord_t *c, int *budget, bool *preempted) {
  for (int pass = 0; pass < 2 && !*preempted; pass++) {
    coord_job_t *j = c->running_head;
    while (j && *budget > 0 && c->n_sitems < c->cfg.max_num_seqs) {
      int need = j->n_tok - j->n_computed;
      if (j->in_step || need <= 0 || (pass == 0) != (need == 1)) {
        j = j->next;
        continue;
      }
      coord_job_t *prev = j->prev;
      if (!coord__sched_one(c, j, FR_MIN(need, *budget), budget)) {
        *preempted = true;
        break;
      }
      /* j may have finished (and left the list); newer jobs may have been preempted */
      j = j->state == COORD_JOB_RUNNING ? j->next : prev ? prev->next : c->running_head;
    }
  }
}

/* Blocks a waiting job needs to start with a chunk of n tokens after its
 * cached prefix, per the admission plan. */
static int coord__admit_blocks(const coord_t *c, const kv_admit_t *p, int n) {
  int bs = c->kvi.block_size;
  int total = (p->n_cached_tokens + n + bs - 1) / bs;
  return p->n_revive + (total - p->n_cached_blocks);
}

/* Admits the queue head; returns false when it does not fit now. */
static bool coord__admit_one(coord_t *c, coord_job_t *j, int *budget) {
  bool cache = coord__job_uses_cache(c, j);
  kv_admit_t plan = {0};
  if (cache) kv_admit_plan(c->kv, j->tok, j->n_tok, 0, 0, &plan);
  else plan.n_free = kv_blocks_free_count(c->kv);
  int n = FR_MIN(j->n_tok - plan.n_cached_tokens, *budget);
  if (coord__admit_blocks(c, &plan, n) > kv_blocks_free_count(c->kv)) return false;
  int slot, cached = 0;
  if (kv_seq_alloc_slot(c->kv, 0, &slot)) return false;
  if (cache) kv_seq_attach_prefix(c->kv, slot, j->tok, j->n_tok - 1, &cached);
  kv_copy_t cp;
  n = FR_MIN(j->n_tok - cached, *budget);
  if (kv_seq_append(c->kv, slot, n, &cp)) {
    kv_seq_free(c->kv, slot);
    return false;
  }
  coord__add_copy(c, &cp);
  coord__list_remove(c, j);
  j->slot = slot;
  j->sp_sent = false;
  j->n_computed = cached;
  if (!j->admitted_once) {
    j->admitted_once = true;
    j->n_cached = (uint32_t)FR_MIN(cached, j->n_prompt);
    c->prefix_queries += (uint64_t)j->n_prompt;
    c->prefix_hits += j->n_cached;
#ifdef FERRUM_HAVE_METRICS
    if (c->metrics) {
      coord_metrics_prefix(c->metrics, (uint64_t)j->n_prompt, j->n_cached);
      coord_metrics_tokens(c->metrics, (uint64_t)j->n_prompt, 0);
    }
#endif
  }
  coord__running_push(c, j);
  coord__add_item(c, j, n);
  *budget -= n;
  return true;
}

void coord__sched_gauges(coord_t *c) {
#ifdef FERRUM_HAVE_METRICS
  if (!c->metrics) return;
  coord_metrics_set_running(c->metrics, (uint32_t)c->n_running);
  coord_metrics_set_waiting(c->metrics, (uint32_t)c->n_waiting);
  if (c->kv)
    coord_metrics_set_kv(c->metrics, (uint32_t)(c->kvi.n_blocks - kv_blocks_free_count(c->kv)),
                         (uint32_t)c->kvi.n_blocks);
#else
  (void)c;
#endif
}

int coord__sched_build(coord_t *c) {
  c->n_sitems = 0;
  c->n_copies = 0;
  int budget = c->cfg.max_num_batched_tokens;
  bool preempted = false;
  coord__sched_running(c, &budget, &preempted);
  while (!preempted && c->waiting_head && budget > 0 && c->n_running < c->cfg.max_num_seqs &&
         c->n_sitems < c->cfg.max_num_seqs)
    if (!coord__admit_one(c, c->waiting_head, &budget)) break;
  return c->n_sitems;
}
