/* worker.h - one ferrum worker process (one device, one TP rank).
 *
 * The worker connects a ZeroMQ DEALER to the coordinator's worker ROUTER,
 * registers (hello), loads the model it is told to (load), maps the
 * coordinator's control segment read-only, owns its KV pool (a shm segment
 * `/ferrum-<instance>-kvpool<rank>` on the CPU, so the pool outlives a
 * worker restart) and runs each step descriptor as one forward pass over
 * mixed prefill chunks and decodes. Rank 0 samples, writes the logits rows
 * asked for into `/ferrum-<instance>-logits<rank>` and replies with a
 * result. The worker keeps no request state the coordinator cannot resend:
 * only the token history of each slot (for penalties), dropped when the
 * coordinator frees the slot.
 *
 * Threads: one (the backend's pool threads run ops). Exits when its
 * coordinator dies (PR_SET_PDEATHSIG, parent check, heartbeat timeout) or on
 * a shutdown message.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "kernels/kern.h"
#include "kv/kv.h"
#include "model/model.h"
#include "model/sampler.h"
#include "proto/proto.h"
#include "proto/proto_mbox.h"

#ifdef __cplusplus
extern "C" {
#endif

#define WORKER_LOGITS_WHAT "logits" /* + rank: logits segment kind */
#define WORKER_POOL_WHAT "kvpool"   /* + rank: KV pool segment kind */

/* One sequence slot: every token fed so far, and its sampling params
 * (sent once per slot assignment, see proto_step_item_t.has_sp). */
typedef struct {
  int32_t *tok; /* (cap) */
  int len, cap;
  bool has_sp;
  proto_sampling_t sp;      /* sp.bias is not used: bias below holds the slot's copy */
  int prompt_len;           /* sent with sp */
  model_bias_t *bias;       /* (n_bias, cap bias_cap) logit bias, sent with sp */
  int32_t *ban;             /* (n_ban, cap ban_cap) banned before sp.min_tokens outputs, sent with sp */
  uint32_t n_bias, bias_cap, n_ban, ban_cap;
} worker_hist_t;

/* Command line of a worker process. */
typedef struct {
  const char *connect;  /* coordinator's worker endpoint (ipc:// or tcp://) */
  const char *instance; /* instance id (segment names); NULL for a remote worker */
  const char *curve_key;  /* --curve-key: this worker's key pair file (NULL: FERRUM_CURVE_SECRET_KEY) */
  const char *server_key; /* --server-key: the coordinator's public key, Z85 or a file (tcp:// with CURVE) */
  int rank, world_size;
  const char *device;   /* --device: what rank 0 of a GPU group makes its rendezvous for (NULL = cpu);
                         * a remote worker's device (local ones take the load's) */
  pid_t coord_pid;      /* the coordinator: exit when it is gone (0 = don't check) */
  int hb_timeout_ms;    /* exit after this long without a message (default 30000) */
} worker_args_t;

typedef struct {
  worker_args_t args;
  void *zctx, *sock;
  proto_msg_t in;
  proto_buf_t out;
  uint64_t last_rx_ns;
  /* after load */
  kern_backend_t *be;
  model_t *m;
  kv_ctl_t *ctl;       /* control segment, read-only */
  kv_info_t info;
  kv_segment_t pool_seg;
  kern_kv_pool_t pool;
  kv_segment_t logits_seg;
  /* the step mailboxes (proto/proto_mbox.h), when the coordinator runs on this host */
  kv_segment_t mbox_seg;
  proto_mbox_t *down, *up;
  bool via_mbox;       /* the message being handled came through the mailbox: so does its answer */
  int logits_rows;     /* rows the logits segment holds */
  model_sampler_t smp;
  int max_tokens, max_seqs, vocab;
  /* per-step scratch, sized at load */
  int32_t *tokens, *pos, *slots;   /* (max_tokens) */
  int32_t *q_start;                /* (max_seqs + 1) */
  int32_t *ctx_len;                /* (max_seqs) */
  int32_t *tables;                 /* (max_seqs, max_blocks_per_seq) */
  int32_t *copy_pairs;             /* (2 * PROTO_MAX_COPIES) */
  float *logits;                   /* (max_seqs, vocab) host; (max_seqs, dim) rows with pooling */
  float *raw;                      /* (vocab) one row before sampling */
  proto_result_item_t *ritems;     /* (max_seqs) */
  proto_step_item_t *ok_items;     /* (max_seqs) the step's items this worker accepted */
  proto_toplp_t *tops;             /* (max_seqs, PROTO_MAX_TOPN) */
  int32_t *top_ids;                /* (max_seqs, PROTO_MAX_TOPN) */
  float *top_lp;                   /* (max_seqs, PROTO_MAX_TOPN) */
  worker_hist_t *hist;             /* (info.max_seqs) */
  /* speculative decoding (spec.c): logits rows per accepted item, and the
   * result items' extra tokens (the step has at most max_seqs rows) */
  int32_t *rows;                   /* (max_seqs) */
  int32_t *xtok;                   /* (max_seqs) */
  float *xlp;                      /* (max_seqs) */
  proto_toplp_t *xtop;             /* (max_seqs, PROTO_MAX_TOPN) */
  bool spec;                       /* the step being run has proposals */
  /* prompt logprobs (plp.c): the rows the step's items asked, item after item */
  float *plp;                      /* (max_tokens) */
  uint32_t *plp_rank;              /* (max_tokens) */
  proto_toplp_t *plp_top;          /* (max_tokens, PROTO_MAX_TOPN) */
  /* the draft model (draft.c; load option draft): it shares the target's
   * block ids, its pool beside the target's (the same segment on the CPU) */
  model_t *dm;
  kern_kv_pool_t dpool;
  int32_t *dlen;                   /* (info.max_seqs) the draft's K/V holds each slot's tokens below this */
  int32_t *dtokens, *dpos, *dslots; /* (max_tokens) a draft pass's batch */
  int32_t *dq_start, *dctx, *dtables; /* (max_seqs + 1), (max_seqs), (max_seqs, max_blocks_per_seq) */
  int32_t *ditem;                  /* (max_seqs) the step item of each sequence of a draft pass */
  int32_t *dtok;                   /* (max_tokens) the items' tokens with the draft's proposals */
  int32_t *drow;                   /* (max_seqs) each item's first logits row (its q rows follow) */
  int32_t *dk;                     /* (max_seqs) proposals made for each item (-1: none asked; see draft.c) */
  float *dq;                       /* (max_seqs, vocab) q of each proposal (temperature > 0) */
  int32_t *dsamp;                  /* (max_seqs) a greedy draft pass's proposals, sampled on the device */
  bool loaded;
  bool fake_forward;               /* benchmarks: no forward pass, fixed logits */
  float force_accept;              /* benchmarks (FERRUM_SPEC_FORCE_ACCEPT): each proposal is accepted with
                                    * this probability whatever the logits say; < 0: off */
  /* a load that sizes the KV pool: loaded, no pool yet (see worker_kv_init) */
  bool kv_pending;
  uint32_t kv_capacity;            /* blocks this worker can hold (reported in loaded) */
  int kv_block_size;               /* tokens per block the load asked for */
  size_t kv_block_bytes;           /* bytes of one block of this model's pool */
  kern_kv_dtype_t kv_dtype;        /* --kv-cache-dtype (load option kv_cache_dtype) */
  size_t weight_bytes, act_bytes;  /* backend memory of the weights, of the activations (logged) */
  /* A remote worker (the load's option remote=1: another host, no shared
   * memory): the block tables come in the step descriptors, the KV pool
   * and the logits stay in this process. */
  bool remote;
  int remote_block_size, remote_max_blocks, remote_max_seqs; /* the control segment's geometry (load) */
  int32_t *rtab;                   /* (max_seqs, max_blocks_per_seq) the tables the steps sent */
  int32_t *rlen;                   /* (max_seqs) entries of each */
} worker_t;

/* Loads the model of a load message. With a fixed KV pool (no sizing
 * request) it also maps the control segment, allocates the pool, the logits
 * segment and the step scratch: the worker is ready. With a sizing request
 * (proto_load_sizes_kv) it works out w->kv_capacity, the blocks that fit the
 * byte budget or the memory fraction once weights and activations are
 * allocated, and allocates nothing more (w->kv_pending) until
 * worker_kv_init(). Returns 0, or an error with a message (the worker stays
 * unloaded); a budget that holds fewer than l->kv_min_blocks blocks is an
 * error that says how much memory was needed and how much there is. */
int worker_load(worker_t *w, const proto_load_t *load);

/* After a sizing load: maps the control segment the coordinator created
 * with n_blocks blocks (<= w->kv_capacity) and allocates the pool, the
 * logits segment and the step scratch. Returns 0, or an error (the worker
 * is then unloaded). */
int worker_kv_init(worker_t *w, uint32_t n_blocks);

/* ---- step.c / spec.c internals ---- */
/* The sampler's params of a slot's history. */
model_sampling_t worker__sampling(const worker_hist_t *h);
/* Marks a result item failed for non-finite logits. */
void worker__item_nonfinite(proto_result_item_t *ri);
/* Logits rows of each of the step's (accepted) items into w->rows: 1 +
 * its proposed tokens. Returns true when some item has proposals. */
bool worker__spec_rows(worker_t *w, const proto_step_t *st);
/* Verifies an item's proposed tokens against its 1 + n_spec logits rows
 * (host f32, (1 + n_spec, vocab), modified); the first n_q proposals were
 * drawn from the distributions q (n_q rows of vocab floats: a draft
 * model's), the others are deterministic. Fills result item r with
 * the accepted tokens and the one after them; *x_used counts the extra
 * token entries of w->xtok / xlp / xtop used by the step so far. */
void worker__spec_verify(worker_t *w, const proto_step_item_t *it, float *rows, const float *q, int n_q, int r,
                         int *x_used);
/* Records tokens fed to a slot at pos.. in its history (for penalties). */
void worker__hist_feed(worker_hist_t *h, int pos, const int32_t *tok, int n);

/* Bytes of a model's weights as the backend stores them (a tied output
 * counted once). */
size_t worker__weight_bytes(const model_t *m);

/* ---- draft.c: the draft model ---- */
/* Most sequences of a draft pass whose proposals the device samples (the
 * backend sampler's per-call params live on the stack). */
#define WORKER_DRAFT_DEVICE_ROWS 256
/* Loads the draft model at path (the load option draft) beside the target:
 * same backend and step shape; a vocabulary other than the target's, or
 * tensor parallelism, is an error. dummy: random weights of path's config
 * (the target's --load-format dummy). */
int worker__draft_load(worker_t *w, const char *path, bool dummy, int max_tokens, int max_seqs);
/* Bytes of one draft KV block of block_size tokens (0 without a draft). */
size_t worker__draft_block_bytes(const worker_t *w, int block_size);
/* The draft's KV config for n_blocks blocks. */
kern_kv_config_t worker__draft_kv_config(const worker_t *w, int block_size, int n_blocks);
/* Allocates the draft's scratch (after the pool). */
void worker__draft_scratch(worker_t *w);
void worker__draft_free(worker_t *w);
/* Before the target's forward pass over the accepted items of st (batch
 * already built in w->tokens etc., n_tok tokens): runs the draft over the
 * prompt chunks (it keeps their K/V), catches each item that asks for
 * draft proposals up on the tokens it has not seen and proposes its n_spec
 * tokens (k passes), written into the items' tokens (w->dtok) and the
 * target's batch; q rows into w->dq at w->drow. */
int worker__draft_run(worker_t *w, proto_step_t *st, int n_tok);
/* Proposals the draft made for item i of the last worker__draft_run (their
 * q rows are at w->dq + w->drow[i] * vocab). */
int worker__draft_made(const worker_t *w, int i);

/* Prompt logprobs (plp.c), after the step's sampling: for each item that
 * asks rows (n_plp), the log-softmax of each row's target token, its rank
 * and top alternatives, into its result item (a final item's, or a new one
 * with token -1 counted in *n_res). Every rank calls it (a vocabulary split
 * across ranks gathers the logits); only rank 0 fills results. */
int worker__prompt_lp(worker_t *w, const proto_step_t *st, uint32_t *n_res);

/* Releases everything worker_load() set up (segments are not unlinked:
 * the coordinator owns their names). */
void worker_unload(worker_t *w);

/* Runs one step descriptor and fills *res (items point into w's scratch,
 * valid until the next step). A bad descriptor (slot out of range, table
 * shorter than the tokens) is an error in res->error, never a crash. */
void worker_step_run(worker_t *w, const proto_step_t *st, proto_result_t *res);

#ifdef __cplusplus
}
#endif
