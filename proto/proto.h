/* proto.h - the wire protocol: every message between the coordinator, its
 * workers and RPC clients, as a versioned msgpack map with short string
 * keys, with its encoder and its strict decoder. docs/PROTOCOL.md is the
 * schema each message follows; this header is its C form.
 *
 * Envelope: every message is one msgpack map {"v": PROTO_VERSION, "t":
 * "<type>", ...fields}. Fields that equal their default are left out by
 * the encoder and filled in by the decoder; unknown keys are skipped (any
 * value, nested or not) so that newer peers can add fields.
 *
 * Decoding is strict: wrong types, missing required fields, duplicate
 * keys, values out of range, arrays or strings over the PROTO_MAX_* limits,
 * trailing bytes, an unknown version or type are errors (FR_EPROTO,
 * FR_ETOOBIG, FR_EVERSION, FR_ETRUNCATED) with a message naming the field
 * (fr_last_error()). Nothing is allocated from a length before the length
 * is checked against its limit and against the bytes that are left.
 *
 * Ownership: a decoded message lives in its proto_msg_t. Every pointer in
 * it (strings, arrays, nested items) points into the message's arena and
 * stays valid until the next proto_msg_decode() on the same proto_msg_t or
 * proto_msg_free(). Decoded strings are NUL-terminated. The encoder only
 * reads what it is given (borrowed for the call).
 *
 * Threads: no shared state; a proto_msg_t or proto_buf_t is used by one
 * thread at a time.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Protocol versions. Each message type has the version that last changed
 * its schema (proto_type_version); the encoder writes that, so messages that
 * did not change since version 1 stay readable by version-1 peers. Decoders
 * take versions PROTO_VERSION_MIN..PROTO_VERSION and refuse a message
 * written with a version older than its type's (FR_EVERSION). */
#define PROTO_VERSION 5 /* newest: prompt logprobs (submit's ph.lp / lk, step items' pp / pk / nx, result items'
                         * pl / pr / ptp, the event's pl, which older clients skip), special tokens kept in the
                         * text (submit's stop.ks), a guide that starts after a text (submit's gd.a), embeddings
                         * (submit's ph.em, result items' em, loaded's ne), step items whose proposals
                         * the worker's draft model makes (dm); v4: submit's fork, truncation and
                         * guide, speculative tokens (ns), allowed-token masks (am), several tokens per result
                         * item (xt) */
#define PROTO_VERSION_MIN 1

/* Limits the decoder enforces (and the encoder, so that nothing is sent
 * that the peer would refuse). */
#define PROTO_MAX_MSG_BYTES (64u << 20) /* one message */
#define PROTO_MAX_ITEMS 4096u           /* items in a step / result */
#define PROTO_MAX_TOKENS 131072u        /* token ids in an item, a prompt, an event */
#define PROTO_MAX_STR 4096u             /* short strings: names, paths, messages, stops */
#define PROTO_MAX_TEXT (4u << 20)       /* prompt text, chat content, event text */
#define PROTO_MAX_STOP 16u              /* stop strings */
#define PROTO_MAX_STOP_IDS 256u         /* stop token ids */
#define PROTO_MAX_BIAS 1024u            /* logit bias entries */
#define PROTO_MAX_BAN 1024u             /* token ids a step item bans before min_tokens */
#define PROTO_MAX_SPEC 32u              /* proposed (speculative) tokens per step item */
#define PROTO_MAX_MASK_WORDS 16384u     /* 32-bit words of a step item's allowed-token mask (524288 tokens) */
#define PROTO_MAX_MESSAGES 1024u        /* chat messages in a submit */
#define PROTO_MAX_TOPN 20u              /* top logprobs per token */
#define PROTO_MAX_FREED 4096u           /* freed slots in a step */
#define PROTO_MAX_COPIES 65536u         /* block copies in a step */
#define PROTO_MAX_TABLE 65536u          /* block table entries in one table update */
#define PROTO_MAX_OPTIONS 64u           /* model load options */
#define PROTO_MAX_RANKS 16u             /* tensor-parallel ranks a status lists */
#define PROTO_MAX_MODELS 256u           /* models in a list reply */
#define PROTO_MAX_LOGITS (1u << 20)     /* logits floats in an event */
#define PROTO_MAX_EMBD 65536u           /* floats in one embedding */
#define PROTO_MAX_PROMPT_TOP (PROTO_MAX_TOKENS * 4u) /* prompt top logprobs in a result item or an event */

/* Message types; the wire carries the name ("step", ...). */
typedef enum {
  PROTO_T_NONE = 0,
  /* coordinator <-> worker */
  PROTO_T_HELLO,    /* "hello"    worker -> coord: registration */
  PROTO_T_LOAD,     /* "load"     coord -> worker: load a model */
  PROTO_T_LOADED,   /* "loaded"   worker -> coord: load done (or its error) */
  PROTO_T_STEP,     /* "step"     coord -> worker: step descriptor */
  PROTO_T_RESULT,   /* "result"   worker -> coord: step result */
  PROTO_T_HEARTBEAT,/* "hb"       either way */
  PROTO_T_SHUTDOWN, /* "shutdown" coord -> worker */
  PROTO_T_KV_INIT,  /* "kv_init"  coord -> worker: allocate the KV pool (v2) */
  PROTO_T_KV_READY, /* "kv_ready" worker -> coord: pool allocated (or its error) (v2) */
  /* RPC client <-> coordinator */
  PROTO_T_SUBMIT,   /* "submit"   client -> coord */
  PROTO_T_EVENT,    /* "event"    coord -> client: token deltas, finish */
  PROTO_T_CANCEL,   /* "cancel"   client -> coord */
  PROTO_T_STATUS,   /* "status"   client -> coord */
  PROTO_T_STATUS_R, /* "status_r" coord -> client */
  PROTO_T_MODELS,   /* "models"   client -> coord: list models */
  PROTO_T_MODELS_R, /* "models_r" coord -> client */
  PROTO_T_ERROR,    /* "error"    either way: code + message */
  PROTO_T_COUNT
} proto_type_t;

/* Masks for proto_msg_decode's accept argument. */
#define PROTO_MASK(t) (1u << (t))
#define PROTO_ACCEPT_ANY (~0u)
#define PROTO_ACCEPT_WORKER /* what a worker receives */                                          \
  (PROTO_MASK(PROTO_T_LOAD) | PROTO_MASK(PROTO_T_STEP) | PROTO_MASK(PROTO_T_HEARTBEAT) |             \
   PROTO_MASK(PROTO_T_SHUTDOWN) | PROTO_MASK(PROTO_T_KV_INIT) | PROTO_MASK(PROTO_T_ERROR))
#define PROTO_ACCEPT_FROM_WORKER /* what the coordinator receives from workers */                  \
  (PROTO_MASK(PROTO_T_HELLO) | PROTO_MASK(PROTO_T_LOADED) | PROTO_MASK(PROTO_T_RESULT) |             \
   PROTO_MASK(PROTO_T_KV_READY) | PROTO_MASK(PROTO_T_HEARTBEAT) | PROTO_MASK(PROTO_T_ERROR))
#define PROTO_ACCEPT_FROM_CLIENT /* what the coordinator receives from RPC clients */              \
  (PROTO_MASK(PROTO_T_SUBMIT) | PROTO_MASK(PROTO_T_CANCEL) | PROTO_MASK(PROTO_T_STATUS) |            \
   PROTO_MASK(PROTO_T_MODELS) | PROTO_MASK(PROTO_T_HEARTBEAT))
#define PROTO_ACCEPT_CLIENT /* what an RPC client receives */                                      \
  (PROTO_MASK(PROTO_T_EVENT) | PROTO_MASK(PROTO_T_STATUS_R) | PROTO_MASK(PROTO_T_MODELS_R) |         \
   PROTO_MASK(PROTO_T_ERROR) | PROTO_MASK(PROTO_T_HEARTBEAT))

/* Error codes on the wire (HTTP-like, so the HTTP frontend maps them 1:1).
 * Decoders accept any int32: unknown codes pass through. */
enum {
  PROTO_ERR_BAD_REQUEST = 400,
  PROTO_ERR_NOT_FOUND = 404, /* unknown model or job */
  PROTO_ERR_TIMEOUT = 408,
  PROTO_ERR_TOO_BIG = 413,
  PROTO_ERR_BUSY = 429,
  PROTO_ERR_CANCELED = 499,
  PROTO_ERR_INTERNAL = 500,
  PROTO_ERR_UNAVAILABLE = 503,
  PROTO_ERR_VERSION = 505,
};

/* The wire code for a ferrum error code (FR_E* or -errno). */
int32_t proto_err_from_fr(int err);

/* "err" object: code 0 (and no message) means no error. */
typedef struct {
  int32_t code;  /* "c" (required when the object is present) PROTO_ERR_* */
  char *message; /* "m" <= PROTO_MAX_STR bytes, or NULL */
} proto_error_t;

/* One logit bias: added to the token's logit before sampling. */
typedef struct {
  int32_t token; /* "t" required, >= 0 (the coordinator checks it against the vocabulary) */
  float bias;    /* "b" required, [-100, 100] */
} proto_bias_t;

/* Sampling parameters ("sp"), shared by step items and submits. The
 * defaults are the values a missing key means (proto_sampling_default). */
typedef struct {
  float temperature;        /* "t"  default 1; 0 = greedy; >= 0 */
  int32_t top_k;            /* "k"  default 0 = off; >= 0 */
  float top_p;              /* "p"  default 1 = off; (0, 1] */
  float min_p;              /* "mp" default 0 = off; [0, 1] */
  float repetition_penalty; /* "rp" default 1 = off; > 0 */
  float presence_penalty;   /* "pp" default 0; [-2, 2] */
  float frequency_penalty;  /* "fp" default 0; [-2, 2] */
  bool has_seed;            /* "sd" present */
  uint64_t seed;            /* "sd" */
  int32_t logprobs;         /* "lp" default -1 = none; 0 = sampled token's; n = plus top n (<= PROTO_MAX_TOPN) */
  bool want_logits;         /* "wl" default false: keep the logits row (logits handle / event logits) */
  uint32_t n_bias;          /* "lb" logit bias, <= PROTO_MAX_BIAS, by strictly increasing token */
  proto_bias_t *bias;       /* (n_bias) */
  uint32_t min_tokens;      /* "mn" default 0: EOS and stop token ids are banned (and stop strings not
                             * looked for) until this many tokens were generated */
} proto_sampling_t;

proto_sampling_t proto_sampling_default(void);

/* ---- coordinator <-> worker ---- */

/* Registration. The coordinator checks rank, world size (its worker count)
 * and pid (the one it forked, when not 0); dev, kvb, bs and mb are
 * required on the wire but not read: a worker learns its device and KV
 * pool from load (docs/PROTOCOL.md). */
typedef struct {
  int32_t rank;        /* "r"   required, [0, world_size) */
  int32_t world_size;  /* "w"   required, >= 1 */
  char *device;        /* "dev" required, not read (workers send "cpu") */
  uint32_t kv_blocks;  /* "kvb" required, not read (workers send 0) */
  uint32_t block_size; /* "bs"  required, >= 1, not read */
  uint32_t max_batch;  /* "mb"  required, >= 1, not read */
  uint32_t pid;        /* "pid" default 0 */
  char *comm_id;       /* "cid" rank 0 of a tensor-parallel group on a device: the group's rendezvous
                        * (kern_nccl_new_id), which the coordinator hands to every rank in the load
                        * (option "comm"); NULL otherwise */
} proto_hello_t;

typedef struct {
  char *key;   /* "k" required */
  char *value; /* "v" required */
} proto_option_t;

/* The KV pool: either fixed (the control segment exists: the worker maps
 * it and allocates its pool during the load) or sized by the worker (exactly
 * one of kv_bytes, kv_util given: the worker loads, reports in loaded how
 * many blocks it can hold and allocates nothing until kv_init). */
typedef struct {
  char *path;               /* "path" required: GGUF file or safetensors folder */
  char *format;             /* "fmt"  required: "auto" (a GGUF file or safetensors folder, by the path) or "dummy" */
  char *dtype;              /* "dt"   NULL = the file's / backend's choice (not read by our workers) */
  uint32_t tp_size;         /* "tp"   default 1 (our workers take --world-size) */
  uint32_t n_options;       /* "opt"  <= PROTO_MAX_OPTIONS */
  proto_option_t *options;  /* (n_options) */
  uint32_t kv_blocks;       /* "kvb"  fixed: blocks the control segment holds; 0 = as it says */
  uint64_t kv_bytes;        /* "kvm"  sizing: bytes of KV pool per worker */
  float kv_util;            /* "kvu"  sizing: fraction of the device's total memory for weights,
                             * activations and KV, (0, 1]; 0 = not given */
  uint32_t block_size;      /* "bs"   sizing: tokens per KV block, >= 1 (required when sizing) */
  uint32_t kv_min_blocks;   /* "kvn"  sizing: fewer blocks than this is a load error; default 1 */
} proto_load_t;

/* True when a load asks the worker to size its KV pool. */
static inline bool proto_load_sizes_kv(const proto_load_t *l) { return l->kv_bytes > 0 || l->kv_util > 0; }

typedef struct {
  int32_t rank;        /* "r"   required */
  uint32_t kv_blocks;  /* "kvb" KV blocks allocated (fixed), or that the worker can hold (sizing) */
  uint32_t n_vocab;    /* "nv" */
  uint32_t max_ctx;    /* "ctx" */
  proto_error_t error; /* "err" code != 0: the load failed */
  uint64_t block_bytes;/* "bpb" bytes of one KV block on this worker (0 = not said) */
  uint32_t n_embd;     /* "ne"  loaded for embeddings (the load option pooling): their length; 0 = generation */
} proto_loaded_t;

/* The KV pool's final size, after every worker reported (sizing loads):
 * the control segment now exists with kv_blocks blocks. */
typedef struct {
  uint32_t kv_blocks; /* "kvb" required, >= 1, <= what the worker reported */
} proto_kv_init_t;

typedef struct {
  int32_t rank;        /* "r"   required */
  uint32_t kv_blocks;  /* "kvb" blocks allocated */
  proto_error_t error; /* "err" code != 0: allocating the pool failed */
} proto_kv_ready_t;

typedef struct {
  uint32_t slot;       /* "s"  required: sequence slot (block table row) */
  uint32_t pos;        /* "p"  position of tokens[0] */
  uint32_t n_tokens;   /* "tk" required, 1..PROTO_MAX_TOKENS */
  int32_t *tokens;     /* (n_tokens) */
  bool final;          /* "f"  default true: last chunk of the prompt or a decode (sample
                        * after it); false for earlier prefill chunks */
  bool has_sp;         /* "sp" present. A sequence's per-sequence data (sp and prompt_len)
                        * travels once, with the first item after its slot was assigned;
                        * workers keep it per slot (until the slot is freed) */
  proto_sampling_t sp; /* "sp" */
  uint32_t prompt_len; /* "pl" default 0, sent with sp: the sequence's prompt tokens; the
                        * ones fed after them are output (penalties, the draw index) */
  uint32_t n_ban;      /* "ban" sent with sp: token ids the sampler bans while fewer than
                        * sp.min_tokens output tokens exist (EOS ids, stop ids), <= PROTO_MAX_BAN */
  int32_t *ban;        /* (n_ban) */
  uint32_t n_spec;     /* "ns" default 0 (v4): the last n_spec of tokens are proposed (speculative
                        * decoding): the worker verifies them and returns 1..n_spec + 1 tokens;
                        * < n_tokens, <= PROTO_MAX_SPEC, only on a final item */
  bool draft;          /* "dm" default false (v5): the worker's draft model makes the n_spec proposals
                        * (the last n_spec of tokens are placeholders, valid ids, that it overwrites);
                        * only with n_spec > 0 */
  uint32_t n_mask;     /* "am" (v4) constrained decoding: bit t of word t / 32 set = token t may be
                        * sampled (every step, final items only); 0 words = no mask */
  uint32_t *mask;      /* (n_mask) */
  /* prompt logprobs (v5): row i < n_plp gives the log-softmax of the token after tokens[i] (tokens[i + 1],
   * or next for the last one) and its rank, plus the top plp_top alternatives */
  uint32_t n_plp;      /* "pp" default 0, <= n_tokens */
  int32_t plp_top;     /* "pk" default 0, <= PROTO_MAX_TOPN */
  int32_t next;        /* "nx" default 0: with n_plp == n_tokens, the prompt token after this chunk (>= 0) */
} proto_step_item_t;

typedef struct {
  uint32_t src; /* "s" required: block id */
  uint32_t dst; /* "d" required */
} proto_copy_t;

/* A block table change for workers that cannot read the control segment
 * (remote workers): the slot's table becomes its entries below first, then
 * blocks; its length is first + n_blocks (n_blocks 0 truncates). */
typedef struct {
  uint32_t slot;     /* "s" required */
  uint32_t first;    /* "f" */
  uint32_t n_blocks; /* "b" <= PROTO_MAX_TABLE */
  int32_t *blocks;   /* (n_blocks) block ids */
} proto_table_t;

typedef struct {
  uint64_t step_id;          /* "id" required */
  uint64_t epoch;            /* "ep" required: coordinator epoch (restarts) */
  uint32_t n_items;          /* "it" <= PROTO_MAX_ITEMS */
  proto_step_item_t *items;  /* (n_items) */
  uint32_t n_freed;          /* "fr" <= PROTO_MAX_FREED */
  uint32_t *freed;           /* (n_freed) slots whose sequences ended */
  uint32_t n_copies;         /* "cp" <= PROTO_MAX_COPIES */
  proto_copy_t *copies;      /* (n_copies) block copies, before the forward pass */
  uint32_t n_tables;         /* "tb" <= PROTO_MAX_ITEMS */
  proto_table_t *tables;     /* (n_tables) table changes since the last step, for remote workers
                              * (workers that map the control segment ignore them) */
} proto_step_t;

typedef struct {
  int32_t token;  /* "t" required */
  float logprob;  /* "l" required */
} proto_toplp_t;

typedef struct {
  uint32_t segment; /* "g" logits segment id */
  uint32_t slot;    /* "s" */
  uint32_t row;     /* "r" */
} proto_logits_handle_t;

typedef struct {
  uint32_t slot;                /* "s"   required */
  int32_t token;                /* "tok" required: sampled token, -1 = none (not final, or failed) */
  int32_t error;                /* "err" default 0: this item alone failed (PROTO_ERR_*): its request ends,
                                 * the step's other items stand */
  float logprob;                /* "lp"  default 0 */
  uint32_t n_top;               /* "top" <= PROTO_MAX_TOPN */
  proto_toplp_t *top;           /* (n_top) by descending logprob */
  bool has_logits;              /* "lh"  present */
  proto_logits_handle_t logits; /* valid until the coordinator releases it */
  /* speculative decoding (v4): the tokens after `token`, in order (the
   * proposals the worker accepted, then its own token), their logprobs and
   * n_top top logprobs each, token after token */
  uint32_t n_extra;             /* "xt"  <= PROTO_MAX_SPEC */
  int32_t *extra;               /* (n_extra) */
  uint32_t n_extra_lp;          /* "xl"  0 or n_extra */
  float *extra_lp;              /* (n_extra_lp) */
  uint32_t n_extra_top;         /* "xtp" n_extra * n_top entries (or 0) */
  proto_toplp_t *extra_top;     /* (n_extra_top) */
  uint32_t n_embd;              /* "em"  a worker loaded for embeddings (pooling): the sequence's pooled
                                 * final hidden state (token -1), <= PROTO_MAX_EMBD */
  float *embd;                  /* (n_embd) */
  /* prompt logprobs (v5), one per row the step item asked (n_plp), in order; a non-final item with
   * prompt logprobs has a result item too (token -1) */
  uint32_t n_plp;               /* "pl"  <= PROTO_MAX_TOKENS */
  float *plp;                   /* (n_plp) log-softmax of each row's target token */
  uint32_t n_plp_rank;          /* "pr"  0 or n_plp */
  uint32_t *plp_rank;           /* (n_plp_rank) 1 + tokens with a larger logit */
  uint32_t n_plp_top;           /* "ptp" n_plp * the item's plp_top, <= PROTO_MAX_PROMPT_TOP */
  proto_toplp_t *plp_top;       /* (n_plp, plp_top) by descending logprob */
} proto_result_item_t;

typedef struct {
  uint64_t forward_us; /* "fw" */
  uint64_t sample_us;  /* "sa" */
  uint64_t total_us;   /* "to" */
  uint64_t comm_us;    /* "cm" tensor parallel: in all-reduces, as the host saw it (host-memory
                        * backends; 0 where they run asynchronously on a device) */
} proto_timings_t;

typedef struct {
  uint64_t step_id;            /* "id"  required */
  uint64_t epoch;              /* "ep"  required */
  int32_t rank;                /* "r"   default 0 */
  uint32_t n_items;            /* "it"  <= PROTO_MAX_ITEMS */
  proto_result_item_t *items;  /* (n_items) */
  proto_timings_t timings;     /* "tm" */
  proto_error_t error;         /* "err" code != 0: the step failed */
} proto_result_t;

typedef struct {
  int32_t rank;   /* "r"   default -1 (the coordinator) */
  uint64_t seq;   /* "seq" */
  uint64_t ts_ns; /* "ts"  sender's monotonic clock */
} proto_heartbeat_t;

typedef struct {
  char *reason; /* "why" or NULL */
  bool drain;   /* "dr"  finish the current step first */
} proto_shutdown_t;

/* ---- RPC client <-> coordinator ---- */

typedef struct {
  char *role;           /* "r" required: "system", "user", "assistant", ... */
  char *content;        /* "c" required, <= PROTO_MAX_TEXT, may hold NULs */
  uint32_t content_len; /* encode: 0 means strlen(content) */
  char *json;           /* "j" or NULL: the message object as the client gave it (content parts,
                         * tool_calls, ...), what the chat template sees */
  uint32_t json_len;    /* encode: 0 means strlen(json) */
  char *vars;           /* "v" first message only, or NULL: a JSON object of more chat template
                         * variables (chat_template_kwargs, and "tools"); here because a
                         * submit map is full */
  uint32_t vars_len;    /* encode: 0 means strlen(vars) */
} proto_chat_msg_t;

/* When a job stops ("stop", a nested map since version 3). */
typedef struct {
  uint32_t n_strs;   /* "s"   <= PROTO_MAX_STOP */
  char **strs;       /* (n_strs) non-empty stop strings */
  uint32_t n_ids;    /* "i"   <= PROTO_MAX_STOP_IDS */
  int32_t *ids;      /* (n_ids) stop token ids */
  bool ignore_eos;   /* "ie"  EOS does not stop the job */
  bool include;      /* "inc" the matched stop string stays in the text */
  bool keep_special; /* "ks"  v5: special (control) tokens stay in the text (skip_special_tokens false) */
} proto_stop_t;

/* What is done with a job's prompt ("ph", a nested map since version 4). */
typedef struct {
  uint32_t truncate;  /* "tr" 0 = none: keep only the last this many prompt tokens (after tokenizing) */
  uint64_t fork_of;   /* "fk" 0 = none: the id of an earlier job of this client with the same prompt; this job
                       * shares that job's prompt KV blocks once its prefill is done (n > 1) */
  bool embed;         /* "em" the prompt's embedding instead of generated tokens (a server started with
                       * --task embed); the job's one event carries it */
  bool logprobs;      /* "lp" v5: prompt logprobs (each prompt token's given the ones before); the job then
                       * takes nothing from the prefix cache */
  uint32_t logprobs_top; /* "lk" v5: with them, this many top alternatives, <= PROTO_MAX_TOPN */
} proto_prompt_opts_t;

/* Constrained decoding ("gd", v4): the output must be a sentence of this. */
typedef enum {
  PROTO_GUIDE_NONE = 0,  /* (absent) */
  PROTO_GUIDE_JSON,      /* "json": spec is a JSON schema; empty: any JSON object */
  PROTO_GUIDE_REGEX,     /* "regex": spec is a regular expression the whole output matches */
  PROTO_GUIDE_COUNT
} proto_guide_kind_t;

typedef struct {
  proto_guide_kind_t kind; /* "k" required */
  char *spec;              /* "s" <= PROTO_MAX_TEXT */
  uint32_t spec_len;
  char *after;             /* "a" (v5) <= PROTO_MAX_STR; NULL = none: the grammar holds from the first byte of
                            * the output after this text (a reasoning model's "</think>"); until then the
                            * output is free */
  uint32_t after_len;
} proto_guide_t;

/* A job's prompt logprobs ("pl" of its first event, v5): the prompt's
 * tokens, and for tokens[1..] (the first has none) its logprob, rank and
 * top alternatives. */
typedef struct {
  uint32_t n_tokens;  /* "tk"  <= PROTO_MAX_TOKENS */
  int32_t *tokens;    /* (n_tokens) */
  uint32_t n_lp;      /* "lp"  n_tokens - 1 (or 0 with no tokens) */
  float *lp;          /* (n_lp) */
  uint32_t n_rank;    /* "rk"  n_lp */
  uint32_t *rank;     /* (n_rank) */
  uint32_t top_n;     /* "k"   alternatives per token, <= PROTO_MAX_TOPN */
  uint32_t n_top;     /* "top" n_lp * top_n, <= PROTO_MAX_PROMPT_TOP */
  proto_toplp_t *top; /* (n_lp, top_n) */
} proto_prompt_lp_t;

/* A job. Exactly one of prompt, tokens, messages is given. */
typedef struct {
  uint64_t id;                /* "id"   required, != 0: client job id (fr_client fills it) */
  char *model;                /* "m"    NULL = the default model */
  char *prompt;               /* "p"    text, <= PROTO_MAX_TEXT, may hold NULs */
  uint32_t prompt_len;        /* encode: 0 means strlen(prompt) */
  uint32_t n_tokens;          /* "tk"   token ids */
  int32_t *tokens;            /* (n_tokens) */
  uint32_t n_messages;        /* "msgs" chat messages (the model's chat template applies) */
  proto_chat_msg_t *messages; /* (n_messages) */
  proto_sampling_t sp;        /* "sp" */
  uint32_t max_tokens;        /* "mt"   default 0 = until the context ends */
  proto_stop_t stop;          /* "stop" */
  bool stream;                /* "str"  events per token batch (else one final event) */
  bool return_logits;         /* "rl"   events carry the logits rows */
  int32_t priority;           /* "pr"   default 0; higher first */
  proto_prompt_opts_t ph;     /* "ph"   prompt handling (v4) */
  proto_guide_t guide;        /* "gd"   constrained decoding (v4); kind NONE = none */
} proto_submit_t;

typedef enum {
  PROTO_FINISH_NONE = 0, /* not finished (key absent) */
  PROTO_FINISH_STOP,     /* "stop": EOS, stop string or stop token */
  PROTO_FINISH_LENGTH,   /* "length": max_tokens or context */
  PROTO_FINISH_CANCEL,   /* "cancel" */
  PROTO_FINISH_ERROR,    /* "error": see error */
  PROTO_FINISH_COUNT
} proto_finish_t;

typedef struct {
  uint32_t prompt_tokens;     /* "p" */
  uint32_t completion_tokens; /* "c" */
  uint32_t cached_tokens;     /* "k" prompt tokens found in the prefix cache */
} proto_usage_t;

typedef struct {
  uint64_t id;           /* "id"  required: the job */
  char *text;            /* "tx"  text delta (UTF-8 complete), or NULL */
  uint32_t text_len;     /* encode: 0 means strlen(text) */
  uint32_t n_tokens;     /* "tk"  token ids of this delta */
  int32_t *tokens;       /* (n_tokens) */
  uint32_t n_logprobs;   /* "lp"  0 or n_tokens */
  float *logprobs;       /* (n_logprobs) */
  uint32_t top_n;        /* "k"   alternatives per token */
  uint32_t n_top;        /* "top" n_tokens * top_n */
  proto_toplp_t *top;    /* (n_tokens, top_n) */
  proto_finish_t finish; /* "fin" the last event of a job has finish != NONE */
  bool has_usage;        /* "u"   present (on the last event) */
  proto_usage_t usage;
  uint32_t n_logits;     /* "lg"  bin of little-endian f32, <= PROTO_MAX_LOGITS */
  float *logits;         /* (n_tokens, vocab) when the job asked for logits; an embed job's last event:
                          * its embedding (pooled, not normalized: the model's dim floats) */
  proto_error_t error;   /* "err" with finish == ERROR */
  char *stop_str;        /* "ss"  v4, with finish == STOP: the stop string that matched, or NULL */
  int32_t stop_id;       /* "si"  v4, default -1; with finish == STOP: the stop token id that ended the job
                          * (not EOS) */
  bool has_plp;          /* "pl"  v5 (older clients skip it): on the first event of a job that asked */
  proto_prompt_lp_t plp;
} proto_event_t;

typedef struct {
  uint64_t id; /* "id" required */
} proto_cancel_t;

typedef struct {
  uint64_t rid; /* "rid" request id, echoed in the reply; 0 = none */
  char *model;  /* "m"   NULL = the default model */
} proto_status_t;

/* The workers of a status reply. */
typedef struct {
  uint32_t size;           /* "n"  tensor-parallel ranks (workers) */
  uint32_t n_devices;      /* "dv" <= PROTO_MAX_RANKS */
  char **devices;          /* (n_devices) each rank's device, by rank ("cuda:1") */
} proto_tp_info_t;

typedef struct {
  uint64_t rid;            /* "rid" the request's */
  char *model;             /* "m" */
  uint32_t queued;         /* "q" jobs waiting */
  uint32_t running;        /* "run" */
  uint32_t kv_used_blocks; /* "kvu" */
  uint32_t kv_total_blocks;/* "kvt" */
  uint32_t n_workers;      /* "nw" workers ready */
  uint64_t prefix_queries; /* "pcq" prompt tokens looked up in the prefix cache */
  uint64_t prefix_hits;    /* "pch" ... of which found */
  uint64_t preemptions;    /* "pre" sequences preempted (recomputed later) */
  uint32_t worker_restarts;/* "wr"  workers restarted after a crash */
  bool draining;           /* "dr"  refusing new jobs, finishing running ones */
  proto_tp_info_t tp;      /* "tp" */
} proto_status_reply_t;

typedef struct {
  uint64_t rid; /* "rid" request id, echoed in the reply */
} proto_models_t;

typedef struct {
  char *name;       /* "n"   required */
  uint32_t max_ctx; /* "ctx" */
} proto_model_info_t;

typedef struct {
  uint64_t rid;                /* "rid" the request's */
  uint32_t n_models;           /* "ms" <= PROTO_MAX_MODELS */
  proto_model_info_t *models;  /* (n_models) */
} proto_models_reply_t;

typedef struct {
  int32_t code;  /* "c"  required: PROTO_ERR_* */
  char *message; /* "m" */
  uint64_t id;   /* "id" the job it is about, 0 = none */
  uint64_t rid;  /* "rid" the request it answers (status, models), 0 = none */
} proto_error_msg_t;

/* ---- buffers ---- */

/* A growable output buffer; encoders replace its contents. */
typedef struct {
  uint8_t *data;
  size_t len, cap;
} proto_buf_t;

void proto_buf_init(proto_buf_t *b);
void proto_buf_free(proto_buf_t *b);

/* Arena that owns a decoded message's memory; reused across decodes. */
typedef struct proto_arena_chunk proto_arena_chunk_t;
typedef struct {
  proto_arena_chunk_t *head; /* current chunk; older ones follow */
} proto_arena_t;

/* A decoded message: type plus the body of that type, in its arena. */
typedef struct {
  proto_type_t type;
  union {
    proto_hello_t hello;
    proto_load_t load;
    proto_loaded_t loaded;
    proto_step_t step;
    proto_result_t result;
    proto_heartbeat_t heartbeat;
    proto_shutdown_t shutdown;
    proto_kv_init_t kv_init;
    proto_kv_ready_t kv_ready;
    proto_submit_t submit;
    proto_event_t event;
    proto_cancel_t cancel;
    proto_status_t status;
    proto_status_reply_t status_r;
    proto_models_t models;
    proto_models_reply_t models_r;
    proto_error_msg_t error;
  } u;
  proto_arena_t arena;
} proto_msg_t;

void proto_msg_init(proto_msg_t *m);
/* Frees the arena; m can be decoded into again after proto_msg_init. */
void proto_msg_free(proto_msg_t *m);

/* Decodes one message of a type in the accept mask (PROTO_MASK bits,
 * PROTO_ACCEPT_*). Memory of the previous decode into m is reused. On
 * failure m->type is PROTO_T_NONE and the error says why and where. */
int proto_msg_decode(proto_msg_t *m, const void *data, size_t len, uint32_t accept);

/* Encodes a message of the given type; body points to the struct of that
 * type (proto_step_t for PROTO_T_STEP, ...). Replaces b's contents. Fails
 * (b->len = 0) with FR_EPROTO / FR_ETOOBIG for what the decoder would
 * refuse: a missing required field, a value out of range, a limit. */
int proto_encode(proto_buf_t *b, proto_type_t type, const void *body);

/* Encodes a decoded message (m->type, m->u). */
int proto_msg_encode(proto_buf_t *b, const proto_msg_t *m);

/* Typed shorthands for proto_encode. */
static inline int proto_step_encode(proto_buf_t *b, const proto_step_t *s) { return proto_encode(b, PROTO_T_STEP, s); }
static inline int proto_result_encode(proto_buf_t *b, const proto_result_t *r) { return proto_encode(b, PROTO_T_RESULT, r); }
static inline int proto_submit_encode(proto_buf_t *b, const proto_submit_t *s) { return proto_encode(b, PROTO_T_SUBMIT, s); }
static inline int proto_event_encode(proto_buf_t *b, const proto_event_t *e) { return proto_encode(b, PROTO_T_EVENT, e); }

/* Wire name of a type ("step") and back (PROTO_T_NONE if unknown). */
const char *proto_type_name(proto_type_t t);
proto_type_t proto_type_from_name(const char *name, size_t len);
/* The protocol version a type is written with (the one that last changed
 * its schema); 0 for an unknown type. */
uint32_t proto_type_version(proto_type_t t);
/* Wire name of a finish reason ("stop"), NULL for NONE. */
const char *proto_finish_name(proto_finish_t f);

/* Fills body with the defaults of a type (what an empty message means). */
void proto_body_default(proto_type_t type, void *body);

#ifdef __cplusplus
}
#endif
