/* sched.c - the scheduler: continuous batching under a token budget and a
 * sequence cap, vLLM v1 style. See sched.h for the interface.
 *
 * Each step: running jobs first, oldest admission first, each gets the
 * tokens it still needs (one for a decode, a chunk for a prefill that did
 * not fit earlier, all of them after a preemption) while the budget lasts;
 * then waiting jobs are admitted in queue order (priority, then FIFO) while
 * blocks and slots last, taking their cached prefix from the prefix cache.
 * When a running job cannot grow, the newest running job is preempted (its
 * blocks freed, its tokens kept, requeued at the front) and later
 * recomputed. The queue head is never skipped, so nothing starves behind
 * later arrivals of the same priority. A job that forks an earlier one's
 * prompt (n > 1; sched.h, coord_sched_unfork) waits there for that job's
 * prefill, then takes a copy of its block table. A decode may carry
 * proposed tokens (speculative decoding, job->n_spec) when the budget, the
 * logits rows and free blocks allow them without preempting anything; the
 * commit keeps the accepted ones and truncates the slot past them.
 *
 * Plans only while no step is planned, so every slot it touches is idle.
 */
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_log.h"
#include "common/fr_util.h"
#include "coordinator/sched.h"

/* ---- lists ---------------------------------------------------------------- */

static void coord__sched_unlink(coord_sched_t *s, coord_job_t *j) {
  coord_job_t **head, **tail;
  int *n;
  if (j->state == COORD_JOB_WAITING) head = &s->waiting_head, tail = &s->waiting_tail, n = &s->n_waiting;
  else if (j->state == COORD_JOB_RUNNING) head = &s->running_head, tail = &s->running_tail, n = &s->n_running;
  else return;
  if (j->prev) j->prev->next = j->next;
  else *head = j->next;
  if (j->next) j->next->prev = j->prev;
  else *tail = j->prev;
  j->prev = j->next = NULL;
  (*n)--;
}

/* Whether a new job j goes after `at` in the waiting queue: a higher
 * priority, a preempted job of its priority, or one that arrived earlier
 * (jobs reach the queue when their prompt is tokenized, not always in the
 * order they arrived). */
static bool coord__sched_after(const coord_job_t *at, const coord_job_t *j) {
  if (at->priority != j->priority) return at->priority > j->priority;
  return at->admitted_once || at->serial < j->serial;
}

/* Waiting queue order: priority (higher first), then arrival (FIFO). A
 * preempted job goes in front of its priority class. */
static void coord__sched_push_waiting(coord_sched_t *s, coord_job_t *j, bool front) {
  j->state = COORD_JOB_WAITING;
  coord_job_t *at = s->waiting_head; /* insert before `at` */
  while (at && (front ? at->priority > j->priority : coord__sched_after(at, j))) at = at->next;
  j->next = at;
  j->prev = at ? at->prev : s->waiting_tail;
  if (j->prev) j->prev->next = j;
  else s->waiting_head = j;
  if (at) at->prev = j;
  else s->waiting_tail = j;
  s->n_waiting++;
}

static void coord__sched_push_running(coord_sched_t *s, coord_job_t *j) {
  j->state = COORD_JOB_RUNNING;
  j->admit_serial = ++s->admit_serial;
  j->next = NULL;
  j->prev = s->running_tail;
  if (s->running_tail) s->running_tail->next = j;
  else s->running_head = j;
  s->running_tail = j;
  s->n_running++;
}

/* ---- slots ----------------------------------------------------------------- */

/* Frees j's slot and lists it for the workers, who drop the slot's history
 * before the next step. */
static void coord__sched_free_slot(coord_sched_t *s, coord_job_t *j) {
  if (j->slot < 0) return;
  FR_ASSERT(!j->in_step);
  coord_sched_batch_t *b = &s->batch;
  int rc = kv_seq_free(s->kv, j->slot);
  if (rc) FR_LOGE("kv_seq_free(%d): %s", j->slot, fr_last_error());
  bool listed = false;
  for (int i = 0; i < b->n_freed && !listed; i++) listed = b->freed[i] == (uint32_t)j->slot;
  if (!listed && b->n_freed < s->cfg.max_num_seqs) b->freed[b->n_freed++] = (uint32_t)j->slot;
  j->slot = -1;
  j->n_computed = 0;
}

static void coord__sched_add_copy(coord_sched_t *s, const kv_copy_t *cp) {
  coord_sched_batch_t *b = &s->batch;
  if (cp->src < 0) return;
  if (b->n_copies == b->copies_cap) {
    b->copies_cap = b->copies_cap ? 2 * b->copies_cap : 64;
    b->copies = fr_realloc(b->copies, (size_t)b->copies_cap * sizeof *b->copies);
  }
  b->copies[b->n_copies++] = *cp;
}

/* Puts n tokens of j (from n_computed on), the last n_spec of them
 * proposals, in the step. */
static void coord__sched_add_item(coord_sched_t *s, coord_job_t *j, int n, int n_spec) {
  coord_sched_batch_t *b = &s->batch;
  bool final = j->n_computed + n - n_spec == j->n_tok;
  b->items[b->n_items++] =
      (coord_sitem_t){.job = j, .slot = j->slot, .pos = j->n_computed, .n = n, .final = final, .n_spec = n_spec};
  b->n_rows += 1 + n_spec;
  j->in_step = true;
}

/* Frees j's blocks, keeps its tokens and requeues it at the front of its
 * priority class; count: a preemption for lack of blocks (listed in the
 * batch and counted). */
static void coord__sched_preempt(coord_sched_t *s, coord_job_t *j, bool count) {
  FR_LOGD("preempting job %llu (%d tokens)", (unsigned long long)j->id, j->n_tok);
  coord__sched_unlink(s, j);
  coord__sched_free_slot(s, j);
  coord__sched_push_waiting(s, j, true);
  if (!count) return;
  s->counters.n_preemptions++;
  FR_ASSERT(s->batch.n_preempted < s->cfg.max_num_seqs);
  s->batch.preempted[s->batch.n_preempted++] = j;
}

/* ---- planning -------------------------------------------------------------- */

/* Sliding window on every layer: j's blocks wholly before the window of
 * its next query (at n_computed) are never read again; they go back to
 * the allocator before the slot grows. j is in no step in flight. */
static void coord__sched_release(coord_sched_t *s, coord_job_t *j) {
  int n = kv_seq_release_before(s->kv, j->slot, j->n_computed - s->cfg.kv_window + 1);
  if (n > 0) s->counters.window_released += (uint64_t)n;
}

/* Grows j's slot by n tokens, preempting newer jobs when blocks run out.
 * Returns 0, 1 when j itself was preempted, or an error. */
static int coord__sched_grow(coord_sched_t *s, coord_job_t *j, int n) {
  if (s->cfg.kv_window > 0) coord__sched_release(s, j);
  for (;;) {
    kv_copy_t cp;
    int rc = kv_seq_append(s->kv, j->slot, n, &cp);
    if (rc == 0) {
      coord__sched_add_copy(s, &cp);
      return 0;
    }
    if (rc != FR_EBUSY) return rc;
    coord_job_t *victim = s->running_tail;
    while (victim && victim->in_step) victim = victim->prev;
    if (!victim || victim == j) {
      coord__sched_preempt(s, j, true);
      return 1;
    }
    coord__sched_preempt(s, victim, true);
  }
}

/* Schedules one running job's next tokens; returns false when the job
 * itself had to be preempted (stop: nothing newer is left to preempt). A
 * job whose slot cannot grow for another reason is removed and listed as
 * failed. */
static bool coord__sched_one(coord_sched_t *s, coord_job_t *j, int n, int *budget) {
  int rc = coord__sched_grow(s, j, n);
  if (rc == 1) return false;
  if (rc < 0) {
    FR_LOGE("job %llu: %s", (unsigned long long)j->id, fr_last_error());
    coord_sched_remove(s, j);
    coord_sched_batch_t *b = &s->batch;
    FR_ASSERT(b->n_failed < s->cfg.max_num_seqs);
    b->failed[b->n_failed] = j;
    b->failed_rc[b->n_failed++] = rc;
    return true;
  }
  coord__sched_add_item(s, j, n, 0);
  *budget -= n;
  return true;
}

/* A decode with its proposals (job->n_spec), when the budget, the logits
 * rows and free blocks allow them without preempting anything; false:
 * schedule it without (n_spec dropped). */
static bool coord__sched_spec_one(coord_sched_t *s, coord_job_t *j, int *budget) {
  int k = j->n_spec;
  j->n_spec = 0;
  kv_copy_t cp;
  int others = s->n_running - s->batch.n_items - 1; /* running jobs not planned yet keep a row each */
  if (k <= 0 || *budget < 1 + k || s->batch.n_rows + 1 + k + others > s->cfg.max_num_seqs) return false;
  if (kv_seq_append(s->kv, j->slot, 1 + k, &cp)) return false;
  coord__sched_add_copy(s, &cp);
  coord__sched_add_item(s, j, 1 + k, k);
  *budget -= 1 + k;
  return true;
}

/* Running jobs, oldest admission first: decodes in a first pass, then the
 * chunks of prefills (prompts that did not fit one step, recomputations),
 * so a long prefill never holds back the decodes of newer jobs. */
static void coord__sched_running(coord_sched_t *s, int *budget, bool *preempted) {
  for (int pass = 0; pass < 2 && !*preempted; pass++) {
    coord_job_t *j = s->running_head;
    while (j && *budget > 0 && s->batch.n_rows < s->cfg.max_num_seqs) {
      int need = j->n_tok - j->n_computed;
      if (j->in_step || need <= 0 || (pass == 0) != (need == 1)) {
        j = j->next;
        continue;
      }
      coord_job_t *prev = j->prev;
      if (pass == 0 && coord__sched_spec_one(s, j, budget)) {
        j = j->next;
        continue;
      }
      if (!coord__sched_one(s, j, FR_MIN(need, *budget), budget)) {
        *preempted = true;
        break;
      }
      /* j may have failed (and left the list); newer jobs may have been preempted */
      j = j->state == COORD_JOB_RUNNING ? j->next : prev ? prev->next : s->running_head;
    }
  }
}

/* Jobs with a repetition penalty do not attach cached prefixes, nor jobs
 * asking prompt logprobs (every prompt position must be computed; vLLM
 * does the same), nor whole-prompt jobs (mean and CLS pooling read every
 * token's hidden state). */
static bool coord__sched_uses_cache(const coord_sched_t *s, const coord_job_t *j) {
  return s->prefix_cache && j->sp.repetition_penalty == 1.0f && !j->plp_want && !j->whole;
}

/* Blocks a waiting job needs to start with a chunk of n tokens after its
 * cached prefix, per the admission plan. */
static int coord__sched_admit_blocks(const coord_sched_t *s, const kv_admit_t *p, int n) {
  int bs = s->block_size;
  int total = (p->n_cached_tokens + n + bs - 1) / bs;
  return p->n_revive + (total - p->n_cached_blocks);
}

/* Whether a waiting job can fork now: 1 yes, 0 not yet (its fork's
 * prefill is not done), -1 never (admit it as any job). A repetition
 * penalty needs the whole prompt fed to the worker (its token history), as
 * with cached prefixes. */
static int coord__sched_fork_ready(const coord_job_t *j) {
  const coord_job_t *p = j->fork;
  if (!p || p->state == COORD_JOB_DONE || j->sp.repetition_penalty != 1.0f || j->plp_want || j->whole) return -1;
  if (p->state == COORD_JOB_NEW) return 0;
  if (j->admitted_once || p->n_prompt != j->n_prompt || j->n_tok != j->n_prompt ||
      memcmp(p->tok, j->tok, (size_t)j->n_prompt * sizeof *j->tok))
    return -1;
  return p->state == COORD_JOB_RUNNING && p->slot >= 0 && p->n_computed >= j->n_prompt - 1 ? 1 : 0;
}

/* Admits j by forking its fork's slot down to j's prompt but its last
 * token, which j computes (see coord_sched_unfork). Returns false when the
 * blocks or slots are not there now. */
static bool coord__sched_admit_fork(coord_sched_t *s, coord_job_t *j, int *budget) {
  int slot, shared = j->n_prompt - 1;
  kv_copy_t cp;
  if (kv_seq_fork(s->kv, j->fork->slot, &slot)) return false;
  if (kv_seq_truncate(s->kv, slot, shared) || kv_seq_append(s->kv, slot, 1, &cp)) {
    kv_seq_free(s->kv, slot);
    return false;
  }
  coord__sched_add_copy(s, &cp);
  s->counters.n_forks++;
  s->counters.fork_shared += (uint64_t)(shared / s->block_size);
  s->counters.fork_copied += cp.src >= 0;
  coord__sched_unlink(s, j);
  j->n_cached = j->fork->n_cached;
  coord_sched_unfork(j);
  j->slot = slot;
  j->sp_sent = false;
  j->n_computed = shared;
  j->admitted_once = true;
  coord__sched_push_running(s, j);
  coord__sched_add_item(s, j, 1, 0);
  *budget -= 1;
  return true;
}

/* Admits the queue head; returns false when it does not fit now. */
static bool coord__sched_admit_one(coord_sched_t *s, coord_job_t *j, int *budget) {
  int fork = coord__sched_fork_ready(j);
  if (fork >= 0) return fork && coord__sched_admit_fork(s, j, budget);
  coord_sched_unfork(j);
  if (j->whole && j->n_tok > *budget) return false; /* waits for a step with room for all of it */
  bool cache = coord__sched_uses_cache(s, j);
  kv_admit_t plan = {0};
  if (cache) kv_admit_plan(s->kv, j->tok, j->n_tok, 0, 0, &plan);
  else plan.n_free = kv_blocks_free_count(s->kv);
  int n = FR_MIN(j->n_tok - plan.n_cached_tokens, *budget);
  if (coord__sched_admit_blocks(s, &plan, n) > kv_blocks_free_count(s->kv)) return false;
  int slot, cached = 0;
  if (kv_seq_alloc_slot(s->kv, 0, &slot)) return false;
  if (cache) kv_seq_attach_prefix(s->kv, slot, j->tok, j->n_tok - 1, &cached);
  kv_copy_t cp;
  n = FR_MIN(j->n_tok - cached, *budget);
  if (kv_seq_append(s->kv, slot, n, &cp)) {
    kv_seq_free(s->kv, slot);
    return false;
  }
  coord__sched_add_copy(s, &cp);
  coord__sched_unlink(s, j);
  j->slot = slot;
  j->sp_sent = false;
  j->n_computed = cached;
  if (!j->admitted_once) {
    j->admitted_once = true;
    j->n_cached = (uint32_t)FR_MIN(cached, j->n_prompt);
    s->counters.prefix_queries += (uint64_t)j->n_prompt;
    s->counters.prefix_hits += j->n_cached;
  }
  coord__sched_push_running(s, j);
  coord__sched_add_item(s, j, n, 0);
  *budget -= n;
  return true;
}

/* ---- interface --------------------------------------------------------------- */

void coord_sched_init(coord_sched_t *s, const coord_sched_config_t *cfg) {
  FR_ASSERT(cfg->max_num_seqs > 0 && cfg->max_num_batched_tokens > 0);
  memset(s, 0, sizeof *s);
  s->cfg = *cfg;
  size_t S = (size_t)cfg->max_num_seqs;
  coord_sched_batch_t *b = &s->batch;
  b->items = fr_calloc(S, sizeof *b->items);
  b->freed = fr_calloc(S, sizeof *b->freed);
  b->preempted = fr_calloc(S, sizeof *b->preempted);
  b->failed = fr_calloc(S, sizeof *b->failed);
  b->failed_rc = fr_calloc(S, sizeof *b->failed_rc);
}

void coord_sched_set_window(coord_sched_t *s, int window) { s->cfg.kv_window = window > 0 ? window : 0; }

void coord_sched_deinit(coord_sched_t *s) {
  coord_sched_batch_t *b = &s->batch;
  free(b->items), free(b->copies), free(b->freed), free(b->preempted), free(b->failed), free(b->failed_rc);
  memset(s, 0, sizeof *s);
}

void coord_sched_set_kv(coord_sched_t *s, kv_ctl_t *kv) {
  kv_info_t info;
  kv_control_info(kv, &info);
  s->kv = kv;
  s->block_size = info.block_size;
  s->prefix_cache = info.prefix_cache;
}

void coord_sched_enqueue(coord_sched_t *s, coord_job_t *j) {
  FR_ASSERT(j->slot < 0 && j->n_tok > 0);
  coord__sched_push_waiting(s, j, false);
}

void coord_sched_remove(coord_sched_t *s, coord_job_t *j) {
  coord__sched_unlink(s, j);
  j->state = COORD_JOB_DONE;
  if (!j->in_step) coord__sched_free_slot(s, j);
}

const coord_sched_batch_t *coord_sched_plan(coord_sched_t *s) {
  FR_ASSERT(s->kv && !s->busy);
  coord_sched_batch_t *b = &s->batch;
  b->n_items = b->n_copies = b->n_preempted = b->n_failed = b->n_rows = 0;
  int budget = s->cfg.max_num_batched_tokens;
  bool preempted = false;
  coord__sched_running(s, &budget, &preempted);
  while (!preempted && s->waiting_head && budget > 0 && s->n_running < s->cfg.max_num_seqs &&
         b->n_rows < s->cfg.max_num_seqs)
    if (!coord__sched_admit_one(s, s->waiting_head, &budget)) break;
  s->busy = b->n_items > 0;
  return b;
}

void coord_sched_set_accepted(coord_sched_t *s, int i, int n) {
  FR_ASSERT(s->busy && i >= 0 && i < s->batch.n_items);
  s->batch.items[i].n_accepted = FR_MAX(0, FR_MIN(n, s->batch.items[i].n_spec));
}

void coord_sched_sent(coord_sched_t *s) { s->batch.n_freed = 0; }

void coord_sched_commit(coord_sched_t *s, bool computed) {
  if (!s->busy) return;
  s->busy = false;
  const coord_sched_batch_t *b = &s->batch;
  for (int i = 0; i < b->n_items; i++) {
    coord_job_t *j = b->items[i].job;
    j->in_step = false;
    if (j->state == COORD_JOB_DONE) { /* removed while in the step */
      coord__sched_free_slot(s, j);
      continue;
    }
    if (!computed) {
      if (kv_seq_truncate(s->kv, j->slot, j->n_computed))
        FR_LOGE("kv_seq_truncate(%d): %s", j->slot, fr_last_error());
      continue;
    }
    const coord_sitem_t *it = &b->items[i];
    j->n_computed += it->n - it->n_spec + it->n_accepted;
    if (it->n_spec > it->n_accepted && kv_seq_truncate(s->kv, j->slot, j->n_computed)) /* rejected proposals */
      FR_LOGE("kv_seq_truncate(%d): %s", j->slot, fr_last_error());
    if (s->prefix_cache) kv_prefix_commit(s->kv, j->slot, j->tok, j->n_computed);
  }
}

void coord_sched_unfork(coord_job_t *j) {
  if (!j->fork) return;
  j->fork->fork_waiters--;
  j->fork = NULL;
}

void coord_sched_requeue_all(coord_sched_t *s) {
  FR_ASSERT(!s->busy);
  while (s->running_tail) coord__sched_preempt(s, s->running_tail, false);
}
