/* coord_impl.h - the coordinator's internal state, shared by its files:
 * loop.c (event loop, timers, signals), rpc.c (RPC frontend), jobs.c (job
 * intake: validation, tokenization, lifetime), step.c (step descriptors
 * out, results in), detok_stream.c (text, stop strings, events),
 * supervise.c (worker processes), runtime.c (paths). The scheduler
 * (sched.h) is a unit of its own, embedded here.
 *
 * Everything here belongs to the loop's thread. Not a public interface.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <pthread.h>
#include <sys/types.h>

#include "coordinator/coord.h"
#include "coordinator/sched.h"
#include "kernels/kern_types.h"
#include "kv/kv.h"
#include "model/chat.h"
#include "model/source.h"
#include "model/tokenizer.h"
#include "proto/curve.h"
#include "proto/proto.h"

#ifdef __cplusplus
extern "C" {
#endif

#define COORD_MAX_WORKERS 16
#define COORD_DEATHS_KEPT 8 /* a worker's most recent deaths, for the restart backoff */

/* STARTING -> (hello) REGISTERED, until every rank said hello -> (load
 * sent) LOADING -> (loaded) READY; when the workers size the KV pool:
 * LOADING -> (loaded) SIZED, waiting for the others -> (kv_init sent)
 * KV_INIT -> (kv_ready) READY. */
typedef enum {
  COORD_W_DOWN = 0,
  COORD_W_STARTING,
  COORD_W_REGISTERED,
  COORD_W_LOADING,
  COORD_W_SIZED,
  COORD_W_KV_INIT,
  COORD_W_READY
} coord_wstate_t;

typedef struct {
  int rank;
  pid_t pid;                 /* 0 when not running */
  coord_wstate_t state;
  uint8_t ident[COORD_IDENT_MAX];
  uint8_t ident_len;
  uint64_t spawn_ns, last_rx_ns, hb_seq;
  int restarts;              /* over the server's lifetime (status, metrics) */
  uint64_t deaths_ns[COORD_DEATHS_KEPT]; /* ring of the latest deaths' times */
  uint64_t respawn_ns;       /* DOWN: when to start it again (0 = not scheduled) */
  bool group_kill;           /* killed because a peer rank died: restarts with it, not counted */
  uint32_t n_vocab, max_ctx;
  uint32_t kv_capacity;      /* SIZED: blocks the worker can hold */
  uint64_t kv_block_bytes;   /* bytes of one of its blocks (0: not said) */
  bool remote;               /* started elsewhere, joins over tcp:// (pid 0): no shared memory, no signals */
} coord_worker_t;

/* The block tables sent to remote workers (remote.c): a mirror per slot. */
typedef struct {
  int mb;                 /* entries per row (the control segment's max_blocks_per_seq) */
  int32_t *blocks;        /* (max_seqs, mb) what the workers hold */
  int32_t *len;           /* (max_seqs) entries of each row */
  uint32_t *ver;          /* (max_seqs) the slot version last compared */
  int32_t *row;           /* (mb) scratch: one slot read from the control segment */
  proto_table_t *tables;  /* (max_seqs) one step's changes */
} coord_rtables_t;

/* The prompt pool (prompts.c): threads that tokenize submits' text. */
typedef struct coord_prompt_task coord_prompt_task_t;
typedef struct {
  pthread_t threads[4];
  int n_threads;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  coord_prompt_task_t *todo_head, *todo_tail; /* FIFO, under mu */
  coord_prompt_task_t *done_head;             /* LIFO, under mu */
  bool stop;
  int efd;                                    /* eventfd: tasks are done (-1 before init) */
  const model_tokenizer_t *tok;               /* immutable, shared (its chat template too) */
} coord_prompts_t;

/* Recorded coordinator time per step: (wall ns, CPU ns, ns to the next step's send, items). */
typedef struct {
  uint32_t *us;              /* (cap) */
  size_t n, cap;
} coord_stats_t;

struct coord {
  coord_config_t cfg;        /* strings copied below */
  char *model_path, *served_name, *device, *rpc_addr, *worker_exe, *step_stats_path;
  char instance[KV_INSTANCE_MAX];
  char run_dir[512];
  char worker_addr[600];
  char inproc_addr[64];
  char pidfile[600];
  /* model side */
  model_source_t *src;
  model_tokenizer_t *tok;
  int vocab, max_model_len, n_layers;
  int n_embd;                     /* --task embed: the embeddings' length (the model's dim); else 0 */
  model_pooling_t pooling;        /* --task embed: how the workers pool (coord__pooling); else NONE */
  bool whole_prompts;             /* embed jobs run their prompt in one step (coord_job_t.whole) */
  struct model_gvocab *gvocab;    /* every token's bytes, for constrained decoding's masks (made at first use) */
  struct model_gscratch *gscratch; /* the masks' work memory */
  /* sockets */
  void *zctx, *wsock, *rsock, *isock; /* worker ROUTER, RPC ROUTER, inproc ROUTER */
  void *msock;                        /* PAIR: the RPC ROUTER's accept and disconnect events */
  uint32_t *fd_conn;                  /* (fd_conn_cap) connections accepted so far on each fd */
  int fd_conn_cap;
  void *zap;                          /* REP: ZAP requests of CURVE sockets (auth.c), NULL without CURVE */
  int n_remote;                       /* remote ranks: the last n_remote of n_workers */
  coord_rtables_t rt;
  proto_curve_pair_t curve;           /* this server's key pair, when curve_on */
  bool curve_on;
  uint8_t *allowed;                   /* n_allowed * 32 bytes: client public keys besides our own */
  int n_allowed;
  int sigfd;
  proto_msg_t in;
  proto_buf_t out;
  /* KV: the control segment exists from create (a fixed block count) or
   * once every worker reported its room (kv_sizing) */
  kv_ctl_t *kv;              /* NULL until then */
  kv_info_t kvi;
  bool kv_sizing;            /* the workers size the pool (byte budget or memory fraction) */
  bool mml_explicit;         /* --max-model-len given: one such sequence must fit */
  uint32_t kv_min_blocks;    /* sizing: fewer is a start-up error */
  uint64_t epoch;
  kv_segment_t logits_seg;   /* rank 0's logits, read-only */
  kv_segment_t mbox_seg;     /* the step mailboxes of the local workers (mbox.c); base NULL: none */
  bool mbox_sleeping;        /* their `sleeping` flags are set: the loop is about to block */
  /* workers */
  coord_worker_t workers[COORD_MAX_WORKERS];
  int n_workers;
  bool ready;                /* all workers loaded */
  /* tensor parallel (n_workers > 1): the group's rendezvous for the next
   * loads ("shm:/..." made here, or rank 0's "nccl:..."); every death
   * restarts the whole group */
  char comm_id[KERN_COMM_ID_MAX];
  uint32_t comm_gen;         /* shm groups made so far (their names) */
  uint64_t group_respawn_ns; /* when the group's ranks start again */
  int load_error;            /* a worker's load failed: fatal */
  /* jobs */
  coord_sched_t sched;       /* waiting queue, running list, the step's batch */
  coord_prompts_t prompts;   /* tokenizes text prompts off this thread */
  int n_tokenizing;          /* jobs whose prompt is in the pool */
  coord_sched_counters_t reported; /* sched.counters already added to metrics */
  coord_job_t **hash;        /* (hash_cap) by id */
  size_t hash_cap;
  uint64_t serial;           /* arrival order */
  /* step in flight */
  bool step_busy;
  bool busy_poll;            /* GPU workers: the loop polls without sleeping while a step is out (fr_busy_poll) */
  uint64_t step_id, step_sent_ns;
  uint32_t step_results;     /* ranks that answered */
  int step_tokens;           /* tokens in the step in flight */
  double step_ns_per_token;  /* slowest recent step's time per token (decays); 0 = none timed since a start */
  proto_step_item_t *pitems; /* (max_num_seqs) wire items */
  proto_copy_t *copies;      /* (copies_cap) wire block copies */
  int copies_cap;
  coord_job_t **touched;     /* (max_num_seqs) jobs with new tokens to stream */
  const proto_result_item_t **res_by_slot; /* (max_num_seqs) the result being applied, by slot */
  int n_touched;
  /* counters */
  uint64_t n_steps;
  uint64_t t_rx_ns;          /* when the message being handled arrived */
  uint64_t t_rx_cpu_ns;      /* ... in the loop thread's CPU time (step stats) */
  proto_buf_t wout;          /* encoder buffer for worker control messages */
  coord_stats_t stats;
  /* drain / lifecycle */
  bool draining, stop_loop;
  uint64_t next_hb_ns;
  void (*hook_ready)(void *, bool);
  void (*hook_drain)(void *);
  void *hook_arg;
  struct coord_metrics *metrics;
  bool spec_gpu;             /* speculative decoding takes the GPU's defaults (spec_step.c) */
};

/* ---- loop.c ---- */
int coord__loop_once(coord_t *c, int timeout_ms);
/* Creates the control segment of n_blocks blocks, caps the context to what
 * the pool holds and logs the KV capacity (block_bytes: bytes of a block on
 * a worker, 0 = unknown). Returns 0 or an error (nothing created). */
int coord__kv_create(coord_t *c, int n_blocks, uint64_t block_bytes);

/* ---- rpc.c ---- */
int coord__rpc_bind(coord_t *c);
/* A tcp:// endpoint bound on port 0 or * gets the port the system chose. */
void coord__endpoint_resolve(void *sock, char *addr, size_t cap);
/* auth.c: the key pair and client list, the ZAP handler (or the refusal of
 * a tcp:// endpoint other hosts reach without keys); CURVE on one socket
 * about to bind endpoint (a no-op for ipc:// or without keys); the ZAP
 * requests waiting; teardown. */
/* supervise.c: a remote rank a send could not reach is gone (as a death:
 * its jobs are recomputed when it is back). */
void coord__workers_remote_unreachable(coord_t *c, coord_worker_t *w);
int coord__auth_init(coord_t *c);
/* remote.c: the step's block table changes into st->tables (none without
 * remote ranks); every mirror emptied (a remote rank joined); teardown. */
void coord__remote_tables(coord_t *c, const coord_sched_batch_t *b, proto_step_t *st);
void coord__remote_reset(coord_t *c);
void coord__remote_free(coord_t *c);
int coord__auth_socket(coord_t *c, void *sock, const char *endpoint);
void coord__auth_on_request(coord_t *c);
void coord__auth_deinit(coord_t *c);
void coord__rpc_on_readable(coord_t *c, void *sock, bool inproc);
/* Handles the RPC ROUTER's monitor events: a client connection that closed
 * cancels the jobs it submitted (streaming or not). Connections are told
 * apart by fd and by how many were accepted on that fd before (fds are
 * reused), so a closed connection's event, which may be read after the
 * next connection on its fd has sent a job, never cancels that job. */
void coord__rpc_on_monitor(coord_t *c);
/* Sends a message to a client; returns 0, or FR_EDEAD when the client is
 * gone (or too slow to take it). */
int coord__rpc_send(coord_t *c, const coord_peer_t *p, proto_type_t type, const void *body);
int coord__rpc_error(coord_t *c, const coord_peer_t *p, int32_t code, uint64_t id, const char *msg);

/* ---- mbox.c: steps to the workers on this host and their results through shared memory ---- */
/* Makes the mailboxes (a failure is logged: then ZeroMQ carries everything). */
void coord__mbox_init(coord_t *c);
void coord__mbox_deinit(coord_t *c);
/* Sends an encoded step to w: its mailbox when w is local and it is free,
 * else ZeroMQ (coord__worker_send_buf). */
int coord__mbox_send(coord_t *c, coord_worker_t *w, const proto_buf_t *b);
/* Handles the results waiting in the mailboxes; with will_block, first
 * marks them as watched by a sleeper. Returns how many it handled. */
int coord__mbox_take(coord_t *c, bool will_block);
/* After a blocking poll: the mailboxes need no doorbell again. */
void coord__mbox_awake(coord_t *c);

/* ---- runtime.c ---- */
/* Removes what killed servers left in the runtime folder: worker sockets
 * of instances whose coordinator is dead, pid files of dead servers and
 * their ipc:// RPC sockets. */
void coord__runtime_clean_stale(const char *dir);

/* ---- prompts.c ---- */
int coord__prompts_init(coord_t *c);
/* Stops and joins the threads; tasks still queued are dropped (their jobs
 * are freed by coord__jobs_destroy). */
void coord__prompts_deinit(coord_t *c);
/* Hands the text (or messages) of s to the pool; j is held until it is back. */
void coord__prompts_submit(coord_t *c, coord_job_t *j, const proto_submit_t *s);
/* The eventfd said tasks are done: finishes each one's intake. */
void coord__prompts_on_ready(coord_t *c);

/* ---- jobs.c ---- */
/* Validates and tokenizes a submit; on success the job is queued. On
 * failure it answers the client with an error itself. */
void coord__job_submit(coord_t *c, const coord_peer_t *p, const proto_submit_t *s);
/* Ends j with an error (PROTO_ERR_* code, a static message) that its last
 * event carries. */
void coord__job_fail(coord_t *c, coord_job_t *j, int32_t code, const char *msg);
/* The pool tokenized j's prompt (rc 0: ids, n; else err): the job is
 * queued, or rejected with err. Takes ownership of ids. */
void coord__job_prompt_ready(coord_t *c, coord_job_t *j, int rc, const char *err, int32_t *ids, size_t n);
void coord__job_cancel(coord_t *c, const coord_peer_t *p, uint64_t id);
coord_job_t *coord__job_find(coord_t *c, const coord_peer_t *p, uint64_t id);
/* Ends a job: sets finish (first reason wins), frees its slot unless a
 * step that reads it is in flight, and frees the job once it is neither in
 * the step nor waiting for its last event. */
void coord__job_finish(coord_t *c, coord_job_t *j, proto_finish_t why);
/* Frees what a finished job holds when it is safe; returns true if freed. */
bool coord__job_reap(coord_t *c, coord_job_t *j);
void coord__jobs_destroy(coord_t *c);
/* Cancels the unfinished jobs of RPC connection number conn on fd (it
 * closed). */
void coord__jobs_cancel_fd(coord_t *c, int fd, uint32_t conn);
/* Appends a sampled token to a running job and applies the token-level
 * stop rules (EOS, stop ids, max_tokens, context end). */
void coord__job_append(coord_t *c, coord_job_t *j, const proto_result_item_t *ri, const float *logits_row);
/* An embed job's result item: keeps its embedding and ends the job. */
void coord__job_embedding(coord_t *c, coord_job_t *j, const proto_result_item_t *ri);

/* ---- guide.c: constrained decoding ---- */
/* Compiles the submit's guide (a JSON schema or a regex) for j. Returns
 * 0, or a 400 with a static message in *msg. */
int coord__guide_init(coord_t *c, coord_job_t *j, const proto_submit_t *s, const char **msg);
/* Moves j's grammar state past output token t. */
void coord__guide_advance(coord_t *c, coord_job_t *j, int32_t t);
/* The allowed-token mask of j's next token, on a final step item. */
void coord__guide_item(coord_t *c, coord_job_t *j, proto_step_item_t *it);
void coord__guide_free(coord_job_t *j);

/* ---- step.c ---- */
/* Schedules and sends the next step if workers are ready and none is in
 * flight. */
void coord__step_kick(coord_t *c);
void coord__step_on_result(coord_t *c, const proto_result_t *r, int rank);
uint64_t coord__cpu_ns(void);
/* Forgets the step in flight (a worker died): its jobs are recomputed. */
void coord__step_abort(coord_t *c);

/* ---- spec_step.c (speculative decoding) ---- */
/* Before a plan: the proposer's tokens for each running decode (job->n_spec;
 * 0 when speculation is off for this step: too many jobs, or none found). */
void coord__spec_propose(coord_t *c);
/* A result arrived (res_by_slot set), before the scheduler's commit: tells
 * it how many proposals each item kept, and counts them in the metrics. */
void coord__spec_accepted(coord_t *c);
/* coord__job_append for a result item with several tokens: one at a time,
 * stop rules and stop strings after each; the ones after a stop are dropped. */
void coord__spec_append(coord_t *c, coord_job_t *j, const proto_result_item_t *it, const float *logits_row);

/* ---- detok_stream.c ---- */
/* Stop strings over a job's tokens so far, before more of one step's tokens
 * are appended (speculative decoding): detokenizes, and finishes the job at
 * a stop string as coord__stream_job would; sends nothing. */
void coord__stream_stop_check(coord_t *c, coord_job_t *j);
/* Detokenizes a job's new tokens, applies stop strings and sends what is
 * ready (every token batch when streaming, one event at the end if not). */
void coord__stream_job(coord_t *c, coord_job_t *j);

/* ---- supervise.c ---- */
int coord__workers_start(coord_t *c);
void coord__workers_on_sigchld(coord_t *c);
void coord__workers_on_message(coord_t *c, const uint8_t *ident, size_t ident_len, const proto_msg_t *m);
void coord__workers_tick(coord_t *c);
int coord__worker_send(coord_t *c, coord_worker_t *w, proto_type_t type, const void *body);
int coord__worker_send_buf(coord_t *c, coord_worker_t *w, const proto_buf_t *b);
void coord__workers_stop(coord_t *c);
bool coord__workers_ready(const coord_t *c);
int coord__workers_ready_count(const coord_t *c);

/* ---- runtime.c ---- */
void coord__instance_id(char *out, size_t cap);
int coord__pidfile_write(coord_t *c);

#ifdef __cplusplus
}
#endif
