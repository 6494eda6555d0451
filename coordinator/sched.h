/* sched.h - the scheduler: which jobs feed how many tokens to the next step,
 * under a token budget and a sequence cap, with the KV blocks planned
 * through the block allocator (kv/kv.h). Continuous batching, vLLM v1
 * style; sched.c has the policy.
 *
 * The scheduler keeps a waiting queue (priority, then arrival) and a
 * running list (admission order). A step goes: coord_sched_plan() builds
 * the batch and grows the jobs' KV slots; the caller sends it; then
 * coord_sched_sent(); when the step's result arrives, coord_sched_commit()
 * advances the jobs and commits their computed blocks to the prefix cache;
 * the caller then appends the sampled tokens to the jobs (job->tok). One
 * step is planned at a time: plan again only after the commit.
 *
 * It knows nothing of sockets, workers, tokenizers or metrics: it counts
 * what it did in coord_sched_t.counters and the caller reports them.
 *
 * Threads: the coordinator's loop thread only; no locks.
 * Ownership: jobs are the caller's. The scheduler links them into its lists
 * (job->prev/next) from coord_sched_enqueue() until coord_sched_remove(); the
 * caller frees a job only once it is removed and not in a step (!in_step).
 * The allocator is borrowed (coord_sched_set_kv) and must outlive the
 * scheduler's use of it.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "kv/kv.h"
#include "model/tokenizer.h"
#include "proto/proto.h"

#ifdef __cplusplus
extern "C" {
#endif

#define COORD_IDENT_MAX 256 /* zmq routing ids are at most 255 bytes */

/* NEW: not handed to the scheduler yet (its prompt is being tokenized). */
typedef enum { COORD_JOB_WAITING = 0, COORD_JOB_RUNNING, COORD_JOB_DONE, COORD_JOB_NEW } coord_job_state_t;

/* A client's routing envelope: the identity frame and whether it sent an
 * empty delimiter frame (REQ-style) that replies must repeat. */
typedef struct {
  uint8_t id[COORD_IDENT_MAX];
  uint8_t len;
  bool delim;
  bool inproc; /* arrived on the inproc socket (HTTP frontend) */
  int fd;      /* the connection's file descriptor (ZMQ_SRCFD), -1 unknown */
  uint32_t conn; /* which connection on fd: coord_t's fd_conn[fd] when it arrived */
} coord_peer_t;

/* One job (request), shared by the coordinator's files. The scheduler reads
 * tok, n_tok, n_prompt, priority, serial and sp.repetition_penalty, and owns the
 * fields of its first group; the caller sets slot = -1 before enqueueing. */
typedef struct coord_job coord_job_t;
struct coord_job {
  /* the scheduler's */
  coord_job_t *prev, *next;  /* waiting queue or running list */
  coord_job_state_t state;   /* which list; DONE once removed */
  uint64_t admit_serial;     /* order of (re)admission: preemption victim = largest */
  int n_computed;            /* tokens with KV (advanced at commit) */
  bool in_step;              /* part of the step planned (until its commit) */
  bool sp_sent;              /* the workers have this slot's sampling params (false on admission) */
  int n_spec;                /* proposed tokens for its next decode, in tok[n_tok, n_tok + n_spec) (the
                              * caller's proposer sets it before each plan; the plan may drop them) */
  int slot;                  /* KV slot, -1 while waiting */
  uint32_t n_cached;         /* prompt tokens found in the prefix cache (first admission) */
  bool admitted_once;
  coord_job_t *fork;         /* an earlier job with the same prompt whose prompt KV this one shares once
                              * that job's prefill is done (n > 1), or NULL; see coord_sched_unfork */
  int fork_waiters;          /* jobs whose fork is this one */
  /* the rest of the coordinator's */
  coord_job_t *hnext;        /* id hash chain */
  uint64_t id;               /* the client's job id */
  uint64_t serial;           /* arrival order */
  coord_peer_t peer;
  bool tokenizing;           /* a prompt task (prompts.c) holds it: not freed until the task is back */
  int32_t priority;          /* higher first */
  /* tokens: prompt then output */
  int32_t *tok;              /* (cap) */
  int n_tok, cap, n_prompt;
  /* parameters */
  proto_sampling_t sp;
  int max_tokens;            /* output tokens at most */
  char **stop;               /* (n_stop) owned */
  uint32_t n_stop;
  size_t stop_max;           /* longest stop string */
  int32_t *stop_ids;         /* (n_stop_ids) owned */
  uint32_t n_stop_ids;
  bool ignore_eos, stream, return_logits;
  bool embed;                /* an embedding job: its final prefill result is the answer (embd) */
  bool whole;                /* its prompt runs in one step, all of it computed: no chunks, no cached
                              * prefix, no fork (mean and CLS pooling; the scheduler reads it) */
  float *embd;               /* (n_embd) owned, once the embedding came back */
  uint32_t n_embd;
  bool include_stop;         /* a matched stop string stays in the text */
  uint32_t truncate;         /* keep only the last this many prompt tokens (0: all) */
  int32_t stop_id;           /* the stop token id that ended it, or -1 */
  const char *stop_str;      /* the stop string that ended it (one of stop[]), or NULL */
  proto_bias_t *bias;        /* (sp.n_bias) owned: sp.bias points here */
  int32_t *ban;              /* (n_ban) owned: EOS and stop ids banned before sp.min_tokens outputs */
  uint32_t n_ban;
  struct coord_guide *guide; /* owned: constrained decoding (coordinator/guide.c), or NULL */
  /* results not yet streamed: tokens from out_sent on; text held back */
  int out_done;              /* output tokens detokenized */
  int out_sent;              /* output tokens sent in events */
  float *lp;                 /* (max_tokens) logprobs of output tokens */
  proto_toplp_t *top;        /* (max_tokens, top_n) */
  int top_n;
  float *logits;             /* (logits_cap, vocab): rows of output tokens out_sent.. (return_logits) */
  size_t logits_cap;
  model_detok_t detok;
  char *text;                /* unsent text (held back for stop strings) */
  size_t text_len, text_cap;
  size_t stop_from;          /* stop strings must end past this byte of text (min_tokens) */
  proto_finish_t finish;     /* set when the job ended */
  int32_t error_code;        /* finish ERROR: PROTO_ERR_*, 0 = the step failed */
  const char *error_msg;     /* static: what went wrong, for the client */
  bool finish_sent;
  uint64_t t_arrival_ns, t_first_ns, t_last_ns;
  /* speculative decoding (spec_step.c) */
  /* prompt logprobs (ph.lp): with plp_want the scheduler attaches no cached prefix */
  bool plp_want;             /* asked */
  int32_t plp_k;             /* alternatives per prompt token */
  float *plp;                /* (n_prompt) owned: logprob of prompt token i given the ones before (i >= 1) */
  uint32_t *plp_rank;        /* (n_prompt) owned: its rank */
  proto_toplp_t *plp_top;    /* (n_prompt, plp_k) owned */
  bool plp_sent;             /* went out in the job's first event: not asked again (recompute) */
  float spec_miss;           /* recent share of its proposals rejected (moving average; 0 at first) */
  int spec_idle;             /* decodes without proposals since its acceptance fell too low */
};

/* One item of a step: tokens tok[pos, pos + n) of a job. */
typedef struct {
  coord_job_t *job;
  int slot;                  /* the job's slot when planned (freed by the commit if it was removed) */
  int pos;                   /* the job's n_computed when planned */
  int n;                     /* tokens fed */
  bool final;                /* reaches the job's last token: the step samples the next one */
  int n_spec;                /* of the n tokens, the last n_spec are proposals (speculative decoding) */
  int n_accepted;            /* of them, accepted by the step (the caller sets it before the commit) */
} coord_sitem_t;

/* What coord_sched_plan() built; valid until the next plan. */
typedef struct {
  coord_sitem_t *items;      /* (n_items): running jobs, then admissions */
  int n_items;
  int n_rows;                /* logits rows: an item's 1 + n_spec each (<= max_num_seqs) */
  kv_copy_t *copies;         /* (n_copies) block copies the workers do before the step */
  int n_copies, copies_cap;
  uint32_t *freed;           /* (n_freed) slots freed since the last step went out */
  int n_freed;
  coord_job_t **preempted;   /* (n_preempted) jobs this plan sent back to the queue */
  int n_preempted;
  coord_job_t **failed;      /* (n_failed) jobs this plan removed: their slot could not grow */
  int *failed_rc;            /* (n_failed) the reason: FR_ECONTEXT (context full) or an error */
  int n_failed;
} coord_sched_batch_t;

/* Monotonic counts for status and metrics. */
typedef struct {
  uint64_t n_preemptions;    /* jobs preempted for lack of blocks */
  uint64_t prefix_queries;   /* prompt tokens of jobs admitted for the first time */
  uint64_t prefix_hits;      /* ... of them found in the prefix cache */
  uint64_t n_forks;          /* jobs admitted by forking another's slot */
  uint64_t fork_shared;      /* full prompt blocks they shared */
  uint64_t fork_copied;      /* partial last blocks they copied on write */
  uint64_t window_released;  /* KV blocks released before every layer's sliding window */
} coord_sched_counters_t;

typedef struct {
  int max_num_seqs;           /* jobs running at once, items per step (> 0) */
  int max_num_batched_tokens; /* tokens per step (> 0) */
  int kv_window;              /* > 0: every layer attends to at most this many tokens, so a running
                               * job's blocks before its next query's window are released
                               * (kv_seq_release_before); 0: none are */
} coord_sched_config_t;

/* Embedded in the coordinator. Fields are read-only outside sched.c. */
typedef struct {
  coord_sched_config_t cfg;
  kv_ctl_t *kv;              /* borrowed; NULL until set */
  int block_size;            /* the allocator's */
  bool prefix_cache;         /* the allocator caches prefixes */
  coord_job_t *waiting_head, *waiting_tail;
  coord_job_t *running_head, *running_tail;
  int n_waiting, n_running;
  uint64_t admit_serial;
  bool busy;                 /* a planned step is not committed yet */
  coord_sched_batch_t batch;
  coord_sched_counters_t counters;
} coord_sched_t;

/* Sets up an empty scheduler (no allocator yet). Allocates its per-step
 * arrays once (aborts on host OOM). */
void coord_sched_init(coord_sched_t *s, const coord_sched_config_t *cfg);

/* Sets cfg.kv_window (the model's sliding window when every layer has one, else 0). */
void coord_sched_set_window(coord_sched_t *s, int window);

/* Frees the scheduler's arrays; the jobs and the allocator are the caller's. */
void coord_sched_deinit(coord_sched_t *s);

/* Gives the scheduler the allocator it plans with (borrowed). Call before
 * the first plan; the allocator's slots must number at least max_num_seqs. */
void coord_sched_set_kv(coord_sched_t *s, kv_ctl_t *kv);

/* Queues a new job (slot -1, n_tok > 0) behind the jobs of its priority
 * and above. */
void coord_sched_enqueue(coord_sched_t *s, coord_job_t *j);

/* Takes a job out of the scheduler (it finished or was canceled): unlinks
 * it, marks it DONE and frees its slot, unless a planned step holds it:
 * then the slot is freed by that step's coord_sched_commit(). Idempotent. */
void coord_sched_remove(coord_sched_t *s, coord_job_t *j);

/* Plans the next step: running jobs' decodes, then their prefill chunks,
 * then admissions from the queue while slots, blocks and the token budget
 * last, preempting the newest running jobs when blocks run out. Grows the
 * jobs' slots in the allocator. Returns the batch (n_items may be 0: then
 * no step is planned). The failed jobs are DONE: the caller ends them. */
const coord_sched_batch_t *coord_sched_plan(coord_sched_t *s);

/* Speculative decoding: item i of the planned batch had n proposals
 * accepted (0..its n_spec); the commit keeps their KV and truncates the
 * slot past them. Call before coord_sched_commit(). */
void coord_sched_set_accepted(coord_sched_t *s, int i, int n);

/* The planned step went out: the freed slots it listed are forgotten. */
void coord_sched_sent(coord_sched_t *s);

/* Ends the planned step. computed: its result arrived, so each job's
 * n_computed advances by its item's n and full blocks enter the prefix
 * cache. !computed: the step failed or was dropped, and the jobs' slots
 * shrink back to n_computed. Either way the jobs leave the step and the
 * slots of jobs removed meanwhile are freed. No-op when none is planned. */
void coord_sched_commit(coord_sched_t *s, bool computed);

/* Forks: a waiting job j with j->fork set (the caller links it: j->fork =
 * p, p->fork_waiters++) is admitted, once p has computed j's prompt but
 * its last token, by forking p's slot (kv_seq_fork): the full prompt
 * blocks are shared, the partially filled last one is copied on write,
 * and j computes its last prompt token itself (a step item of one token,
 * which samples j's first token with j's own parameters). Until then j
 * waits at its place in the queue (admissions behind it wait too: p is
 * ahead of it, and its prefill goes on). When p cannot be forked (it
 * finished, was never tokenized, or its prompt differs) or j has a
 * repetition penalty (the workers build its token history from the tokens
 * fed), j is admitted as any job, the prefix cache still finding p's full
 * blocks (penalty aside).
 * coord_sched_unfork drops j's link (j admitted or finished); a p that
 * finishes calls it for every job that waits on it. */
void coord_sched_unfork(coord_job_t *j);

/* Sends every running job back to the front of the queue (slots freed,
 * tokens kept) to be recomputed, e.g. after a worker restart; not counted as
 * preemptions. No step may be planned. */
void coord_sched_requeue_all(coord_sched_t *s);

#ifdef __cplusplus
}
#endif
