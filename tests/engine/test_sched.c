/* test_sched.c - the scheduler (coordinator/sched.h) on its own: a kv
 * allocator in private memory, jobs made here, no processes. Each step is
 * driven as the coordinator drives it: plan, sent, commit, then one sampled
 * token appended to each job whose item was final. Covers admission under
 * the token budget and the sequence cap, prompt chunking, decodes before
 * prefill chunks, admission order, prefix-cache reuse, preemption of the
 * newest job, forks (n > 1) sharing a prompt's blocks, fairness under
 * load, cancel while in flight, commit of a dropped step and a job whose
 * context is full. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "coordinator/sched.h"
#include "kv/kv.h"
#include "tests/common/test_main.h"

#define BS 4        /* tokens per block: small, so block arithmetic shows */
#define MAX_JOBS 128

typedef struct {
  coord_sched_t s;
  kv_ctl_t *kv;
  int budget, max_seqs;
  coord_job_t *jobs[MAX_JOBS];
  int n_jobs;
  int n_done;       /* jobs that produced all their tokens */
} fx_t;

static void fx_init(fx_t *f, int max_seqs, int budget, int n_blocks, int max_bps, bool prefix) {
  memset(f, 0, sizeof *f);
  /* more slots than the scheduler may use: its own cap is what holds */
  kv_config_t kc = {.instance = NULL, .n_blocks = n_blocks, .block_size = BS, .max_seqs = max_seqs + 2,
                    .max_blocks_per_seq = max_bps, .enable_prefix_cache = prefix};
  int rc = kv_control_create(&f->kv, &kc);
  ck_assert_msg(rc == 0, "kv_control_create: %s", fr_last_error());
  coord_sched_config_t sc = {.max_num_seqs = max_seqs, .max_num_batched_tokens = budget};
  coord_sched_init(&f->s, &sc);
  coord_sched_set_kv(&f->s, f->kv);
  f->budget = budget;
  f->max_seqs = max_seqs;
}

static void fx_deinit(fx_t *f) {
  coord_sched_deinit(&f->s);
  kv_control_destroy(f->kv);
  for (int i = 0; i < f->n_jobs; i++) {
    free(f->jobs[i]->tok);
    free(f->jobs[i]);
  }
}

/* A job of n_prompt tokens (seed * 1000 + i, so prompts with different
 * seeds share no block) that wants max_out output tokens; not queued. */
static coord_job_t *job_make(fx_t *f, int n_prompt, int max_out, int seed, int priority) {
  ck_assert_int_lt(f->n_jobs, MAX_JOBS);
  coord_job_t *j = calloc(1, sizeof *j);
  j->id = (uint64_t)f->n_jobs;
  j->serial = (uint64_t)f->n_jobs + 1; /* arrival order, as coord__job_new sets it */
  j->cap = n_prompt + max_out + 1;
  j->tok = calloc((size_t)j->cap, sizeof *j->tok);
  for (int i = 0; i < n_prompt; i++) j->tok[i] = seed * 1000 + i;
  j->n_tok = j->n_prompt = n_prompt;
  j->max_tokens = max_out;
  j->priority = priority;
  j->slot = -1;
  j->sp.repetition_penalty = 1.0f;
  f->jobs[f->n_jobs++] = j;
  return j;
}

static coord_job_t *job_add(fx_t *f, int n_prompt, int max_out, int seed, int priority) {
  coord_job_t *j = job_make(f, n_prompt, max_out, seed, priority);
  coord_sched_enqueue(&f->s, j);
  return j;
}

static void verify_kv(const fx_t *f) {
  int rc = kv_control_verify(f->kv);
  ck_assert_msg(rc == 0, "kv_control_verify: %s", fr_last_error());
}

/* Plans a step and checks what every batch must satisfy. */
static const coord_sched_batch_t *plan(fx_t *f) {
  const coord_sched_batch_t *b = coord_sched_plan(&f->s);
  int tokens = 0;
  ck_assert_int_le(b->n_items, f->max_seqs);
  ck_assert_int_le(f->s.n_running, f->max_seqs);
  for (int i = 0; i < b->n_items; i++) {
    const coord_sitem_t *it = &b->items[i];
    coord_job_t *j = it->job;
    ck_assert_int_eq(j->state, COORD_JOB_RUNNING);
    ck_assert(j->in_step);
    ck_assert_int_eq(it->slot, j->slot);
    ck_assert_int_eq(it->pos, j->n_computed);
    ck_assert_int_gt(it->n, 0);
    ck_assert_int_eq(it->final, it->pos + it->n - it->n_spec == j->n_tok);
    ck_assert_int_eq(kv_seq_len(f->kv, j->slot), it->pos + it->n);
    for (int k = 0; k < i; k++) ck_assert_ptr_ne(b->items[k].job, j);
    tokens += it->n;
  }
  ck_assert_int_le(tokens, f->budget);
  ck_assert_int_le(b->n_rows, f->max_seqs);
  verify_kv(f);
  return b;
}

/* The step's result: commit, then a token for each final item; a job with
 * all its output is removed. */
static void finish(fx_t *f, const coord_sched_batch_t *b) {
  coord_sched_sent(&f->s);
  coord_sched_commit(&f->s, true);
  for (int i = 0; i < b->n_items; i++) {
    coord_job_t *j = b->items[i].job;
    ck_assert(!j->in_step);
    if (j->state == COORD_JOB_DONE || !b->items[i].final) continue;
    ck_assert_int_eq(j->n_computed, j->n_tok);
    ck_assert_int_lt(j->n_tok, j->cap);
    j->tok[j->n_tok] = 500000 + j->n_tok;
    j->n_tok++;
    if (j->n_tok - j->n_prompt == j->max_tokens) {
      coord_sched_remove(&f->s, j);
      f->n_done++;
    }
  }
  verify_kv(f);
}

static const coord_sched_batch_t *step(fx_t *f) {
  const coord_sched_batch_t *b = plan(f);
  finish(f, b);
  return b;
}

/* Steps until every job ended; at most max_steps. */
static void drain(fx_t *f, int max_steps) {
  for (int s = 0; s < max_steps && (f->s.n_waiting || f->s.n_running); s++) step(f);
  ck_assert_msg(!f->s.n_waiting && !f->s.n_running, "%d waiting, %d running after %d steps", f->s.n_waiting,
                f->s.n_running, max_steps);
}

static int item_of(const coord_sched_batch_t *b, const coord_job_t *j) {
  for (int i = 0; i < b->n_items; i++)
    if (b->items[i].job == j) return i;
  return -1;
}

START_TEST(test_admission_budget_and_seqs) {
  fx_t f;
  /* Token budget: 10 + 10 + a 5-token chunk, then nothing. */
  fx_init(&f, 8, 25, 64, 16, false);
  coord_job_t *a = job_add(&f, 10, 4, 1, 0), *b = job_add(&f, 10, 4, 2, 0);
  coord_job_t *c = job_add(&f, 10, 4, 3, 0), *d = job_add(&f, 10, 4, 4, 0);
  const coord_sched_batch_t *bt = plan(&f);
  ck_assert_int_eq(bt->n_items, 3);
  ck_assert_ptr_eq(bt->items[0].job, a);
  ck_assert_int_eq(bt->items[0].n, 10);
  ck_assert(bt->items[0].final);
  ck_assert_ptr_eq(bt->items[1].job, b);
  ck_assert_int_eq(bt->items[2].n, 5);
  ck_assert_ptr_eq(bt->items[2].job, c);
  ck_assert(!bt->items[2].final);
  ck_assert_int_eq(d->state, COORD_JOB_WAITING);
  ck_assert_int_eq(f.s.n_running, 3);
  ck_assert_int_eq(f.s.n_waiting, 1);
  finish(&f, bt);
  /* Next: two decodes, c's last 5 prompt tokens, then d (all 10: 8 of the budget are left over). */
  bt = plan(&f);
  ck_assert_int_eq(bt->n_items, 4);
  ck_assert_int_eq(bt->items[0].n + bt->items[1].n + bt->items[2].n + bt->items[3].n, 1 + 1 + 5 + 10);
  ck_assert_ptr_eq(bt->items[3].job, d);
  finish(&f, bt);
  fx_deinit(&f);

  /* Sequence cap: two run, the third waits until one ends. */
  fx_init(&f, 2, 64, 64, 16, false);
  a = job_add(&f, 6, 2, 1, 0), b = job_add(&f, 6, 3, 2, 0), c = job_add(&f, 6, 2, 3, 0);
  bt = step(&f);
  ck_assert_int_eq(bt->n_items, 2);
  ck_assert_int_eq(c->state, COORD_JOB_WAITING);
  bt = step(&f); /* a's second token: a ends */
  ck_assert_int_eq(bt->n_items, 2);
  ck_assert_int_eq(a->state, COORD_JOB_DONE);
  ck_assert_int_eq(c->state, COORD_JOB_WAITING);
  bt = plan(&f);
  ck_assert_int_eq(bt->n_items, 2);
  ck_assert_int_eq(item_of(bt, c), 1);
  ck_assert_int_eq(bt->items[1].n, 6);
  finish(&f, bt);
  fx_deinit(&f);
}
END_TEST

START_TEST(test_prompt_chunking) {
  fx_t f;
  fx_init(&f, 4, 8, 64, 16, false);
  coord_job_t *a = job_add(&f, 30, 2, 1, 0);
  int pos[] = {0, 8, 16, 24}, n[] = {8, 8, 8, 6};
  for (int s = 0; s < 4; s++) {
    const coord_sched_batch_t *b = plan(&f);
    ck_assert_int_eq(b->n_items, 1);
    ck_assert_ptr_eq(b->items[0].job, a);
    ck_assert_int_eq(b->items[0].pos, pos[s]);
    ck_assert_int_eq(b->items[0].n, n[s]);
    ck_assert_int_eq(b->items[0].final, s == 3);
    finish(&f, b);
    ck_assert_int_eq(a->n_tok, s == 3 ? 31 : 30);
  }
  const coord_sched_batch_t *b = step(&f); /* the decode */
  ck_assert_int_eq(b->items[0].n, 1);
  ck_assert_int_eq(a->state, COORD_JOB_DONE);
  fx_deinit(&f);
}
END_TEST

START_TEST(test_decodes_before_prefill_chunks) {
  fx_t f;
  fx_init(&f, 4, 8, 64, 16, false);
  coord_job_t *a = job_add(&f, 3, 20, 1, 0), *b = job_add(&f, 3, 20, 2, 0);
  step(&f); /* both prompts; both decode next */
  ck_assert_int_eq(a->n_tok, 4);
  /* a (older) now has 10 tokens to feed (draft tokens, say): b's decode
   * goes first, a gets what is left of the budget. */
  for (int i = 0; i < 9; i++) a->tok[a->n_tok++] = 7;
  const coord_sched_batch_t *bt = plan(&f);
  ck_assert_int_eq(bt->n_items, 2);
  ck_assert_ptr_eq(bt->items[0].job, b);
  ck_assert_int_eq(bt->items[0].n, 1);
  ck_assert_ptr_eq(bt->items[1].job, a);
  ck_assert_int_eq(bt->items[1].n, 7);
  ck_assert(!bt->items[1].final);
  finish(&f, bt);
  fx_deinit(&f);
}
END_TEST

START_TEST(test_admission_order) {
  fx_t f;
  fx_init(&f, 1, 64, 64, 16, false); /* one at a time: admission order shows */
  int prio[] = {0, 1, 0, 1, 2, 0};
  coord_job_t *j[6];
  for (int i = 0; i < 6; i++) j[i] = job_add(&f, 5, 1, i + 1, prio[i]);
  int want[] = {4, 1, 3, 0, 2, 5}; /* priority, then arrival */
  for (int s = 0; s < 6; s++) {
    const coord_sched_batch_t *b = step(&f);
    ck_assert_int_eq(b->n_items, 1);
    ck_assert_msg(b->items[0].job == j[want[s]], "step %d admitted job %llu, want %d", s,
                  (unsigned long long)b->items[0].job->id, want[s]);
  }
  ck_assert_int_eq(f.n_done, 6);
  fx_deinit(&f);
}
END_TEST

/* Jobs reach the queue when their prompt is tokenized, which need not be
 * the order they arrived in: the queue still follows arrival. */
START_TEST(test_admission_follows_arrival_not_enqueue) {
  fx_t f;
  fx_init(&f, 1, 64, 64, 16, false);
  coord_job_t *j[4];
  for (int i = 0; i < 4; i++) j[i] = job_make(&f, 5, 1, i + 1, 0);
  int enqueue[] = {2, 0, 3, 1};
  for (int i = 0; i < 4; i++) coord_sched_enqueue(&f.s, j[enqueue[i]]);
  for (int s = 0; s < 4; s++) {
    const coord_sched_batch_t *b = step(&f);
    ck_assert_int_eq(b->n_items, 1);
    ck_assert_msg(b->items[0].job == j[s], "step %d admitted job %llu, want %d", s,
                  (unsigned long long)b->items[0].job->id, s);
  }
  fx_deinit(&f);
}
END_TEST

START_TEST(test_prefix_cache_reuse) {
  fx_t f;
  fx_init(&f, 8, 64, 64, 16, true);
  coord_job_t *a = job_add(&f, 14, 4, 1, 0);  /* 3 full blocks and 2 tokens */
  coord_job_t *early = job_make(&f, 14, 4, 1, 0);
  coord_sched_enqueue(&f.s, early);           /* same prompt, same step as a: nothing cached yet */
  const coord_sched_batch_t *b = plan(&f);
  ck_assert_int_eq(b->n_items, 2);
  ck_assert_int_eq(b->items[1].pos, 0);
  ck_assert_int_eq(early->n_cached, 0);
  finish(&f, b);
  /* a's blocks are committed: b2 shares the first 12 tokens, then differs. */
  coord_job_t *b2 = job_make(&f, 16, 4, 1, 0);
  for (int i = 12; i < 16; i++) b2->tok[i] = 77000 + i;
  coord_sched_enqueue(&f.s, b2);
  coord_job_t *pen = job_make(&f, 14, 4, 1, 0); /* a repetition penalty: no cached prefix */
  pen->sp.repetition_penalty = 1.2f;
  coord_sched_enqueue(&f.s, pen);
  b = plan(&f);
  int k = item_of(b, b2);
  ck_assert_int_ge(k, 0);
  ck_assert_int_eq(b->items[k].pos, 12);
  ck_assert_int_eq(b->items[k].n, 4);
  ck_assert_uint_eq(b2->n_cached, 12);
  k = item_of(b, pen);
  ck_assert_int_eq(b->items[k].pos, 0);
  ck_assert_uint_eq(pen->n_cached, 0);
  /* the same physical blocks */
  int32_t ra[16], rb[16];
  kv_seq_view_t va, vb;
  ck_assert_int_eq(kv_seq_read(f.kv, a->slot, ra, 16, &va), 0);
  ck_assert_int_eq(kv_seq_read(f.kv, b2->slot, rb, 16, &vb), 0);
  for (int i = 0; i < 3; i++) ck_assert_int_eq(ra[i], rb[i]);
  ck_assert_int_ne(ra[3], rb[3]);
  ck_assert_uint_eq(f.s.counters.prefix_queries, 14 + 14 + 16 + 14);
  ck_assert_uint_eq(f.s.counters.prefix_hits, 12);
  finish(&f, b);
  fx_deinit(&f);
}
END_TEST

/* n > 1: jobs linked to a first one (fork) wait for its prefill, then
 * share its full prompt blocks, copy the partial one on write and compute
 * only their last prompt token; a fork whose first job ended is admitted
 * as any job. The prefix cache is off: the sharing is the fork's. */
START_TEST(test_fork_shares_prompt_blocks) {
  fx_t f;
  fx_init(&f, 8, 8, 64, 16, false);
  coord_job_t *a = job_add(&f, 14, 4, 1, 0); /* 3 full blocks and 2 tokens; prefilled in chunks of 8 and 6 */
  coord_job_t *c[2];
  for (int i = 0; i < 2; i++) {
    c[i] = job_make(&f, 14, 4, 1, 0);
    c[i]->fork = a, a->fork_waiters++;
    coord_sched_enqueue(&f.s, c[i]);
  }
  for (int s = 0; s < 2; s++) { /* a's two chunks: the forks wait */
    const coord_sched_batch_t *b = step(&f);
    ck_assert_int_eq(b->n_items, 1);
    ck_assert_ptr_eq(b->items[0].job, a);
  }
  const coord_sched_batch_t *b = plan(&f);
  ck_assert_int_eq(b->n_items, 3); /* a's decode, then each fork's last prompt token */
  ck_assert_int_eq(a->fork_waiters, 0);
  ck_assert_int_eq(b->n_copies, 2);
  for (int i = 0; i < 2; i++) {
    int k = item_of(b, c[i]);
    ck_assert_int_ge(k, 0);
    ck_assert_int_eq(b->items[k].pos, 13);
    ck_assert_int_eq(b->items[k].n, 1);
    ck_assert(b->items[k].final);
    ck_assert_ptr_null(c[i]->fork);
    int32_t ra[16], rc[16];
    kv_seq_view_t va, vc;
    ck_assert_int_eq(kv_seq_read(f.kv, a->slot, ra, 16, &va), 0);
    ck_assert_int_eq(kv_seq_read(f.kv, c[i]->slot, rc, 16, &vc), 0);
    for (int blk = 0; blk < 3; blk++) ck_assert_int_eq(ra[blk], rc[blk]);
    ck_assert_int_ne(ra[3], rc[3]); /* the partial block was copied */
    ck_assert_int_eq(b->copies[i].src, ra[3]);
    ck_assert_int_eq(b->copies[i].dst, rc[3]);
    ck_assert_int_eq(kv_block_ref(f.kv, ra[0]), 3);
  }
  ck_assert_uint_eq(f.s.counters.n_forks, 2);
  ck_assert_uint_eq(f.s.counters.fork_shared, 6);
  ck_assert_uint_eq(f.s.counters.fork_copied, 2);
  finish(&f, b);
  /* a repetition penalty is admitted as any job (the worker needs the whole prompt fed) */
  coord_job_t *pen = job_make(&f, 14, 2, 1, 0);
  pen->fork = a, a->fork_waiters++;
  pen->sp.repetition_penalty = 1.3f;
  coord_sched_enqueue(&f.s, pen);
  b = plan(&f);
  ck_assert_int_eq(b->items[item_of(b, pen)].pos, 0);
  ck_assert_int_eq(a->fork_waiters, 0);
  finish(&f, b);
  drain(&f, 64);
  /* a fork whose first job ended before its prefill is admitted as any job */
  coord_job_t *d = job_add(&f, 6, 2, 2, 0), *e = job_make(&f, 6, 2, 2, 0);
  e->fork = d, d->fork_waiters++;
  coord_sched_enqueue(&f.s, e);
  coord_sched_remove(&f.s, d);
  b = plan(&f);
  int k = item_of(b, e);
  ck_assert_int_ge(k, 0);
  ck_assert_int_eq(b->items[k].pos, 0);
  ck_assert_ptr_null(e->fork);
  finish(&f, b);
  drain(&f, 64);
  ck_assert_int_eq(kv_blocks_free_count(f.kv), 64);
  fx_deinit(&f);
}
END_TEST

START_TEST(test_preemption_newest_first) {
  fx_t f;
  /* 6 blocks; three jobs of 7 prompt tokens take 2 blocks each. */
  fx_init(&f, 4, 64, 6, 16, true);
  coord_job_t *a = job_add(&f, 7, 4, 1, 0), *b = job_add(&f, 7, 4, 2, 0), *c = job_add(&f, 7, 4, 3, 0);
  coord_job_t *d = job_add(&f, 3, 1, 4, 0); /* waits: no block left */
  ck_assert_int_eq(step(&f)->n_items, 3); /* 8 tokens each after */
  ck_assert_int_eq(d->state, COORD_JOB_WAITING);
  ck_assert_int_eq(step(&f)->n_items, 3); /* 9 tokens each: the 9th needs a third block */
  ck_assert_int_eq(kv_blocks_free_count(f.kv), 0);
  const coord_sched_batch_t *bt = plan(&f);
  ck_assert_int_eq(bt->n_preempted, 1);
  ck_assert_ptr_eq(bt->preempted[0], c); /* the newest admission */
  ck_assert_uint_eq(f.s.counters.n_preemptions, 1);
  ck_assert_int_eq(bt->n_items, 2);
  ck_assert_int_ge(item_of(bt, a), 0);
  ck_assert_int_ge(item_of(bt, b), 0);
  /* c keeps its tokens, loses its blocks, waits first in line */
  ck_assert_int_eq(c->state, COORD_JOB_WAITING);
  ck_assert_int_eq(c->slot, -1);
  ck_assert_int_eq(c->n_computed, 0);
  ck_assert_int_eq(c->n_tok, 9);
  ck_assert_ptr_eq(f.s.waiting_head, c);
  ck_assert_ptr_eq(c->next, d);
  finish(&f, bt);
  /* a and b finish (4 tokens), then c is readmitted with all 9 tokens
   * (a and b took its freed cached blocks) and completes. */
  int readmitted = -1;
  for (int s = 0; s < 10 && c->state != COORD_JOB_DONE; s++) {
    bt = plan(&f);
    int k = item_of(bt, c);
    if (k >= 0 && readmitted < 0) {
      readmitted = s;
      ck_assert_int_eq(bt->items[k].pos + bt->items[k].n, 9);
      ck_assert(bt->items[k].final);
    }
    finish(&f, bt);
  }
  ck_assert_int_ge(readmitted, 0);
  ck_assert_int_eq(c->state, COORD_JOB_DONE);
  ck_assert_int_eq(c->n_tok, 7 + 4);
  ck_assert_int_eq(a->state, COORD_JOB_DONE);
  ck_assert_int_eq(b->state, COORD_JOB_DONE);
  drain(&f, 10);
  ck_assert_int_eq(f.n_done, 4);
  ck_assert_int_eq(kv_blocks_free_count(f.kv), 6);
  fx_deinit(&f);
}
END_TEST

/* A job that needs most of the pool arrives while small jobs keep coming
 * (one per step, each holding 2 blocks for 3 steps): it is admitted as soon
 * as the blocks it needs are free, before any job that arrived after it. */
START_TEST(test_fairness_under_load) {
  fx_t f;
  fx_init(&f, 8, 64, 8, 16, false);
  coord_job_t *big = NULL;
  int seed = 1, big_at = -1;
  for (int s = 0; s < 40; s++) {
    if (s == 3) big = job_add(&f, 22, 2, 1000, 0); /* 6 of the 8 blocks */
    if (s < 30) job_add(&f, 5, 3, seed++, 0);
    bool head_fits = big && f.s.waiting_head == big && kv_blocks_free_count(f.kv) >= 6;
    const coord_sched_batch_t *b = plan(&f);
    if (head_fits) ck_assert_msg(item_of(b, big) >= 0, "step %d: the blocks are free but the big job waits", s);
    if (big_at < 0 && item_of(b, big) >= 0) big_at = s;
    finish(&f, b);
  }
  ck_assert_msg(big_at >= 0 && big_at <= 3 + 4, "the big job was admitted at step %d", big_at);
  for (int i = 0; i < f.n_jobs; i++) {
    coord_job_t *j = f.jobs[i];
    if (j->id > big->id) ck_assert_uint_gt(j->admit_serial, big->admit_serial);
  }
  drain(&f, 20);
  ck_assert_int_eq(f.n_done, f.n_jobs);
  fx_deinit(&f);
}
END_TEST

START_TEST(test_cancel_in_flight_frees_at_commit) {
  fx_t f;
  fx_init(&f, 4, 64, 16, 16, false);
  coord_job_t *a = job_add(&f, 9, 4, 1, 0), *w = NULL;
  const coord_sched_batch_t *b = plan(&f);
  coord_sched_sent(&f.s);
  int slot = a->slot, free_before = kv_blocks_free_count(f.kv);
  ck_assert_int_eq(free_before, 16 - 3);
  coord_sched_remove(&f.s, a); /* canceled while its step is in flight */
  ck_assert_int_eq(a->state, COORD_JOB_DONE);
  ck_assert_int_eq(f.s.n_running, 0);
  ck_assert_int_eq(a->slot, slot);
  ck_assert_int_eq(kv_blocks_free_count(f.kv), free_before);
  ck_assert_int_eq(kv_seq_len(f.kv, slot), 9);
  ck_assert_int_eq(b->n_freed, 0);
  coord_sched_remove(&f.s, a); /* twice is harmless */
  coord_sched_commit(&f.s, true);
  ck_assert_int_eq(a->slot, -1);
  ck_assert_int_eq(kv_blocks_free_count(f.kv), 16);
  ck_assert_int_eq(b->n_freed, 1);
  ck_assert_uint_eq(b->freed[0], (uint32_t)slot);
  verify_kv(&f);
  /* the next step tells the workers; then the list is empty */
  w = job_add(&f, 3, 1, 2, 0);
  b = plan(&f);
  ck_assert_int_eq(b->n_freed, 1);
  int w_slot = w->slot;
  coord_sched_sent(&f.s);
  ck_assert_int_eq(b->n_freed, 0);
  finish(&f, b); /* w ends: its slot is listed for the next step */
  ck_assert_int_eq(w->state, COORD_JOB_DONE);
  ck_assert_int_eq(b->n_freed, 1);
  ck_assert_uint_eq(b->freed[0], (uint32_t)w_slot);
  /* a waiting job and a running one between steps go at once */
  coord_job_t *x = job_add(&f, 3, 5, 3, 0), *y = job_add(&f, 3, 5, 4, 0);
  step(&f);
  coord_job_t *z = job_add(&f, 3, 5, 5, 0);
  coord_sched_remove(&f.s, z);
  ck_assert_int_eq(f.s.n_waiting, 0);
  coord_sched_remove(&f.s, x);
  ck_assert_int_eq(x->slot, -1);
  ck_assert_int_eq(kv_blocks_free_count(f.kv), 16 - 1);
  b = step(&f);
  ck_assert_int_eq(b->n_items, 1);
  ck_assert_ptr_eq(b->items[0].job, y);
  fx_deinit(&f);
}
END_TEST

START_TEST(test_dropped_step_shrinks_back) {
  fx_t f;
  fx_init(&f, 4, 64, 16, 16, false);
  coord_job_t *a = job_add(&f, 9, 2, 1, 0);
  coord_job_t *gone = job_add(&f, 5, 2, 2, 0);
  const coord_sched_batch_t *b = plan(&f);
  ck_assert_int_eq(b->n_items, 2);
  coord_sched_remove(&f.s, gone);
  coord_sched_commit(&f.s, false); /* the send failed, or a worker died */
  ck_assert(!a->in_step);
  ck_assert_int_eq(a->n_computed, 0);
  ck_assert_int_eq(kv_seq_len(f.kv, a->slot), 0);
  ck_assert_int_eq(gone->slot, -1);
  ck_assert_int_eq(kv_blocks_free_count(f.kv), 16);
  b = plan(&f); /* the same work again */
  ck_assert_int_eq(b->n_items, 1);
  ck_assert_int_eq(b->items[0].pos, 0);
  ck_assert_int_eq(b->items[0].n, 9);
  finish(&f, b);
  /* a worker restart: every running job back to the queue, uncounted */
  coord_sched_requeue_all(&f.s);
  ck_assert_int_eq(a->state, COORD_JOB_WAITING);
  ck_assert_int_eq(a->slot, -1);
  ck_assert_uint_eq(f.s.counters.n_preemptions, 0);
  b = step(&f);
  ck_assert_int_eq(b->items[0].n, 10);
  ck_assert_int_eq(a->state, COORD_JOB_DONE);
  fx_deinit(&f);
}
END_TEST

START_TEST(test_context_full_fails_the_job) {
  fx_t f;
  fx_init(&f, 4, 64, 16, 2, false); /* 8 tokens a sequence at most */
  coord_job_t *a = job_add(&f, 8, 4, 1, 0), *b = job_add(&f, 3, 2, 2, 0);
  step(&f); /* a: 9 tokens, one more than its table holds */
  const coord_sched_batch_t *bt = plan(&f);
  ck_assert_int_eq(bt->n_failed, 1);
  ck_assert_ptr_eq(bt->failed[0], a);
  ck_assert_int_eq(bt->failed_rc[0], FR_ECONTEXT);
  ck_assert_int_eq(a->state, COORD_JOB_DONE);
  ck_assert_int_eq(a->slot, -1);
  ck_assert_int_eq(bt->n_items, 1);
  ck_assert_ptr_eq(bt->items[0].job, b);
  finish(&f, bt);
  fx_deinit(&f);
}
END_TEST


/* Speculative decoding: a decode carries its job's proposals (written
 * after its last token) when budget, rows and blocks allow; the commit
 * keeps the accepted ones' KV, truncates the slot past them (freeing whole
 * blocks) and the prefix cache never covers a rejected token. */
START_TEST(test_spec_decode_truncates_rejected) {
  fx_t f;
  fx_init(&f, 4, 16, 64, 16, true);
  coord_job_t *a = job_add(&f, 6, 20, 1, 0);
  step(&f); /* prefill: n_tok 7, n_computed 6 */
  kv_stats_t st0;
  kv_stats_get(f.kv, &st0);
  a->n_spec = 3;
  for (int i = 0; i < 3; i++) a->tok[a->n_tok + i] = 900 + i;
  const coord_sched_batch_t *b = plan(&f);
  ck_assert_int_eq(b->n_items, 1);
  ck_assert_int_eq(b->items[0].n, 4);
  ck_assert_int_eq(b->items[0].n_spec, 3);
  ck_assert(b->items[0].final);
  ck_assert_int_eq(b->n_rows, 4);
  ck_assert_int_eq(kv_seq_len(f.kv, a->slot), 10); /* positions 6..9: blocks 1 and 2 */
  coord_sched_sent(&f.s);
  coord_sched_set_accepted(&f.s, 0, 0); /* none accepted: back to 7 tokens, block 2 freed */
  coord_sched_commit(&f.s, true);
  ck_assert_int_eq(a->n_computed, 7);
  ck_assert_int_eq(kv_seq_len(f.kv, a->slot), 7);
  kv_stats_t st1;
  kv_stats_get(f.kv, &st1);
  ck_assert_int_eq(st1.n_free, st0.n_free);
  ck_assert_int_eq(st1.n_cached, 1); /* block 0 only: block 1 (4..7) is not full of accepted tokens */
  a->tok[a->n_tok++] = 777; /* the model's own token */
  verify_kv(&f);
  /* two accepted of three: 8 + 2 computed, the prefix cache takes block 1 (4..7) and not block 2 */
  a->n_spec = 3;
  for (int i = 0; i < 3; i++) a->tok[a->n_tok + i] = 800 + i;
  b = plan(&f);
  ck_assert_int_eq(b->items[0].n_spec, 3);
  coord_sched_sent(&f.s);
  coord_sched_set_accepted(&f.s, 0, 2);
  coord_sched_commit(&f.s, true);
  ck_assert_int_eq(a->n_computed, 10);
  ck_assert_int_eq(kv_seq_len(f.kv, a->slot), 10);
  kv_stats_get(f.kv, &st1);
  ck_assert_int_eq(st1.n_cached, 2);
  a->tok[a->n_tok++] = 800, a->tok[a->n_tok++] = 801, a->tok[a->n_tok++] = 555;
  verify_kv(&f);
  /* a dropped step (worker restart): back to n_computed */
  a->n_spec = 2;
  b = plan(&f);
  ck_assert_int_eq(kv_seq_len(f.kv, a->slot), 13);
  coord_sched_sent(&f.s);
  coord_sched_commit(&f.s, false);
  ck_assert_int_eq(kv_seq_len(f.kv, a->slot), 10);
  ck_assert_int_eq(a->n_computed, 10);
  verify_kv(&f);
  fx_deinit(&f);
}
END_TEST

/* Proposals never take the rows (max_num_seqs) or the budget of other
 * running jobs: each keeps its decode. */
START_TEST(test_spec_leaves_rows_for_others) {
  fx_t f;
  fx_init(&f, 4, 64, 64, 16, false);
  coord_job_t *a = job_add(&f, 3, 20, 1, 0), *c = job_add(&f, 3, 20, 2, 0);
  step(&f);
  a->n_spec = 3, c->n_spec = 3;
  const coord_sched_batch_t *b = plan(&f);
  ck_assert_int_eq(b->n_items, 2);
  ck_assert_int_eq(b->items[0].n_spec, 0); /* 1 + 3 + the other's row > 4 rows */
  ck_assert_int_eq(b->items[1].n_spec, 0);
  finish(&f, b);
  a->n_spec = 2, c->n_spec = 0;
  b = plan(&f);
  ck_assert_int_eq(b->items[0].n_spec, 2); /* 1 + 2 + 1 = 4 rows */
  ck_assert_int_eq(b->n_rows, 4);
  coord_sched_sent(&f.s);
  coord_sched_set_accepted(&f.s, 0, 2);
  coord_sched_commit(&f.s, true);
  fx_deinit(&f);
}
END_TEST


static Suite *suite(void) {
  Suite *s = suite_create("sched");
  TCase *tc = tcase_create("sched");
  tcase_add_test(tc, test_admission_budget_and_seqs);
  tcase_add_test(tc, test_prompt_chunking);
  tcase_add_test(tc, test_decodes_before_prefill_chunks);
  tcase_add_test(tc, test_admission_order);
  tcase_add_test(tc, test_admission_follows_arrival_not_enqueue);
  tcase_add_test(tc, test_prefix_cache_reuse);
  tcase_add_test(tc, test_fork_shares_prompt_blocks);
  tcase_add_test(tc, test_preemption_newest_first);
  tcase_add_test(tc, test_fairness_under_load);
  tcase_add_test(tc, test_cancel_in_flight_frees_at_commit);
  tcase_add_test(tc, test_dropped_step_shrinks_back);
  tcase_add_test(tc, test_context_full_fails_the_job);
  tcase_add_test(tc, test_spec_decode_truncates_rejected);
  tcase_add_test(tc, test_spec_leaves_rows_for_others);
  suite_add_tcase(s, tc);
  return s;
}

const test_prog_t test_prog = {.suites = {suite}};
