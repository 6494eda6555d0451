/* proto_msgs.c - the schema of every message: field tables (wire key,
 * type, limit, required), defaults and cross-field checks. docs/PROTOCOL.md
 * documents the same tables; change both together. */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "proto/proto.h"
#include "proto/proto_schema.h"

#define FLD(k, ty, fl, T, m, n, mx, sb, nm) \
  { PROTO_KPACK(k), k, sizeof(k) - 1, ty, fl, offsetof(T, m), n, mx, sb, nm }
/* scalar */
#define FS(k, ty, fl, T, m) FLD(k, ty, fl, T, m, 0, 0, NULL, NULL)
/* string with a byte limit */
#define FSTR(k, fl, T, m, mx) FLD(k, PF_STR, fl, T, m, 0, mx, NULL, NULL)
/* pointer + count (or text + length) */
#define FARR(k, ty, fl, T, m, cnt, mx) FLD(k, ty, fl, T, m, offsetof(T, cnt), mx, NULL, NULL)
/* nested object(s) */
#define FOBJ(k, fl, T, m, sb) FLD(k, PF_OBJ, fl, T, m, 0, 0, &sb, NULL)
#define FOBJH(k, T, m, has, sb) FLD(k, PF_OBJ, PF_HAS, T, m, offsetof(T, has), 0, &sb, NULL)
#define FOBJS(k, fl, T, m, cnt, mx, sb) FLD(k, PF_OBJS, fl, T, m, offsetof(T, cnt), mx, &sb, NULL)

#define SCHEMA(var, nm, T, flds, defs, chk) \
  static const proto_schema_t var = {nm, sizeof(T), FR_ARRAY_SIZE(flds), flds, &defs, chk}; \
  _Static_assert(FR_ARRAY_SIZE(flds) <= 13, "a map of at most 15 keys with the envelope")

/* ------------------------------------------------------------ checks */

static int finite_in(float x, float lo, float hi) { return isfinite(x) && x >= lo && x <= hi; }

static int check_sampling(const void *body) {
  const proto_sampling_t *s = body;
  if (!finite_in(s->temperature, 0, 1e6f)) return fr_errorf(FR_EPROTO, "temperature %g out of range", s->temperature);
  if (s->top_k < 0) return fr_errorf(FR_EPROTO, "top_k %d is negative", s->top_k);
  if (!finite_in(s->top_p, 0, 1) || s->top_p == 0) return fr_errorf(FR_EPROTO, "top_p %g not in (0, 1]", s->top_p);
  if (!finite_in(s->min_p, 0, 1)) return fr_errorf(FR_EPROTO, "min_p %g not in [0, 1]", s->min_p);
  if (!finite_in(s->repetition_penalty, 0, 1e6f) || s->repetition_penalty == 0)
    return fr_errorf(FR_EPROTO, "repetition_penalty %g must be > 0", s->repetition_penalty);
  if (!finite_in(s->presence_penalty, -2, 2) || !finite_in(s->frequency_penalty, -2, 2))
    return fr_errorf(FR_EPROTO, "presence / frequency penalty not in [-2, 2]");
  if (s->logprobs < -1 || s->logprobs > (int32_t)PROTO_MAX_TOPN)
    return fr_errorf(FR_EPROTO, "logprobs %d not in [-1, %u]", s->logprobs, PROTO_MAX_TOPN);
  for (uint32_t i = 0; s->bias && i < s->n_bias; i++) {
    if (s->bias[i].token < 0 || (i > 0 && s->bias[i].token <= s->bias[i - 1].token))
      return fr_errorf(FR_EPROTO, "logit bias %u: token %d negative or not above the one before", i, s->bias[i].token);
    if (!finite_in(s->bias[i].bias, -100, 100))
      return fr_errorf(FR_EPROTO, "logit bias %u: %g not in [-100, 100]", i, s->bias[i].bias);
  }
  return 0;
}

static int check_hello(const void *body) {
  const proto_hello_t *h = body;
  if (h->world_size < 1 || h->rank < 0 || h->rank >= h->world_size)
    return fr_errorf(FR_EPROTO, "rank %d / world size %d invalid", h->rank, h->world_size);
  if (h->block_size < 1 || h->max_batch < 1) return fr_errorf(FR_EPROTO, "block size and max batch must be >= 1");
  return 0;
}

static int check_load(const void *body) {
  const proto_load_t *l = body;
  if (l->tp_size < 1) return fr_errorf(FR_EPROTO, "tensor-parallel size must be >= 1");
  if (!finite_in(l->kv_util, 0, 1)) return fr_errorf(FR_EPROTO, "KV memory fraction %g not in (0, 1]", l->kv_util);
  if (l->kv_bytes > 0 && l->kv_util > 0) return fr_errorf(FR_EPROTO, "give a KV byte budget or a memory fraction, not both");
  if (!proto_load_sizes_kv(l)) return 0;
  if (l->kv_blocks > 0) return fr_errorf(FR_EPROTO, "a fixed KV block count and a KV size to work out");
  if (l->block_size < 1) return fr_errorf(FR_EPROTO, "sizing the KV pool needs a block size >= 1");
  return 0;
}

static int check_kv_init(const void *body) {
  const proto_kv_init_t *k = body;
  if (k->kv_blocks < 1) return fr_errorf(FR_EPROTO, "a KV pool of 0 blocks");
  return 0;
}

static int check_step_item(const void *body) {
  const proto_step_item_t *it = body;
  if (it->n_tokens < 1) return fr_errorf(FR_EPROTO, "an item needs at least one token");
  if (it->n_spec > PROTO_MAX_SPEC || it->n_spec >= it->n_tokens || (it->n_spec && !it->final))
    return fr_errorf(FR_EPROTO, "%u proposed tokens in a %s item of %u tokens (at most %u, fewer than the item's)",
                     it->n_spec, it->final ? "final" : "non-final", it->n_tokens, PROTO_MAX_SPEC);
  if (it->draft && !it->n_spec) return fr_errorf(FR_EPROTO, "a step item asks for draft proposals but has no room (ns 0)");
  if (it->n_plp > it->n_tokens || (it->n_plp == it->n_tokens && it->next < 0))
    return fr_errorf(FR_EPROTO, "%u prompt logprob rows in an item of %u tokens (next token %d)", it->n_plp,
                     it->n_tokens, it->next);
  if (it->plp_top < 0 || it->plp_top > (int32_t)PROTO_MAX_TOPN || (it->plp_top && !it->n_plp))
    return fr_errorf(FR_EPROTO, "prompt top logprobs %d not in [0, %u] or without rows", it->plp_top, PROTO_MAX_TOPN);
  if (it->n_plp && it->n_spec)
    return fr_errorf(FR_EPROTO, "prompt logprobs in an item with proposed tokens");
  return 0;
}

static int check_prompt_opts(const void *body) {
  const proto_prompt_opts_t *p = body;
  if (p->logprobs_top > PROTO_MAX_TOPN || (p->logprobs_top && !p->logprobs))
    return fr_errorf(FR_EPROTO, "prompt top logprobs %u: more than %u or without prompt logprobs", p->logprobs_top,
                     PROTO_MAX_TOPN);
  return 0;
}

static int check_prompt_lp(const void *body) {
  const proto_prompt_lp_t *p = body;
  uint32_t n = p->n_tokens ? p->n_tokens - 1 : 0;
  if (p->n_lp != n || p->n_rank != n)
    return fr_errorf(FR_EPROTO, "prompt logprobs: %u logprobs and %u ranks for %u tokens", p->n_lp, p->n_rank,
                     p->n_tokens);
  if (p->top_n > PROTO_MAX_TOPN || (uint64_t)p->n_top != (uint64_t)n * p->top_n)
    return fr_errorf(FR_EPROTO, "prompt logprobs: %u top entries for %u tokens of %u", p->n_top, n, p->top_n);
  return 0;
}

static int check_submit(const void *body) {
  const proto_submit_t *s = body;
  if (s->id == 0) return fr_errorf(FR_EPROTO, "job id 0 is reserved");
  int inputs = (s->prompt != NULL) + (s->n_tokens > 0) + (s->n_messages > 0);
  if (inputs != 1) return fr_errorf(FR_EPROTO, "give exactly one of prompt, tokens, messages (got %d)", inputs);
  for (uint32_t i = 0; i < s->stop.n_strs; i++)
    if (s->stop.strs && s->stop.strs[i] && !s->stop.strs[i][0])
      return fr_errorf(FR_EPROTO, "stop string %u is empty", i);
  return 0;
}

static int check_event(const void *body) {
  const proto_event_t *e = body;
  if (e->id == 0) return fr_errorf(FR_EPROTO, "job id 0 is reserved");
  if (e->n_logprobs != 0 && e->n_logprobs != e->n_tokens)
    return fr_errorf(FR_EPROTO, "%u logprobs for %u tokens", e->n_logprobs, e->n_tokens);
  if (e->top_n > PROTO_MAX_TOPN) return fr_errorf(FR_EPROTO, "top_n %u exceeds %u", e->top_n, PROTO_MAX_TOPN);
  if ((uint64_t)e->n_top != (uint64_t)e->n_tokens * e->top_n)
    return fr_errorf(FR_EPROTO, "%u top logprobs for %u tokens of %u", e->n_top, e->n_tokens, e->top_n);
  return 0;
}

static int check_id(const void *body) {
  const proto_cancel_t *c = body;
  if (c->id == 0) return fr_errorf(FR_EPROTO, "job id 0 is reserved");
  return 0;
}

/* ---------------------------------------------------------- defaults */

#define SAMPLING_DEFAULTS                                                                                  \
  {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .repetition_penalty = 1.0f, .logprobs = -1}

static const proto_sampling_t def_sampling = SAMPLING_DEFAULTS;
static const proto_bias_t def_bias;
static const proto_stop_t def_stop;
static const proto_prompt_opts_t def_prompt_opts;
static const proto_prompt_lp_t def_prompt_lp;
static const proto_guide_t def_guide;
static const proto_error_t def_error;
static const proto_hello_t def_hello;
static const proto_option_t def_option;
static const proto_load_t def_load = {.tp_size = 1, .kv_min_blocks = 1};
static const proto_loaded_t def_loaded;
static const proto_kv_init_t def_kv_init;
static const proto_kv_ready_t def_kv_ready;
static const proto_step_item_t def_step_item = {.final = true, .sp = SAMPLING_DEFAULTS};
static const proto_copy_t def_copy;
static const proto_table_t def_table;
static const proto_step_t def_step;
static const proto_toplp_t def_toplp;
static const proto_logits_handle_t def_handle;
static const proto_result_item_t def_result_item = {.token = -1};
static const proto_timings_t def_timings;
static const proto_result_t def_result;
static const proto_heartbeat_t def_heartbeat = {.rank = -1};
static const proto_shutdown_t def_shutdown;
static const proto_chat_msg_t def_chat_msg;
static const proto_submit_t def_submit = {.sp = SAMPLING_DEFAULTS};
static const proto_usage_t def_usage;
static const proto_event_t def_event = {.stop_id = -1};
static const proto_cancel_t def_cancel;
static const proto_status_t def_status;
static const proto_status_reply_t def_status_r;
static const proto_models_t def_models;
static const proto_model_info_t def_model_info;
static const proto_models_reply_t def_models_r;
static const proto_error_msg_t def_error_msg;

proto_sampling_t proto_sampling_default(void) { return def_sampling; }

/* ----------------------------------------------------------- schemas */

static const proto_field_t f_bias[] = {
    FS("t", PF_I32, PF_REQ, proto_bias_t, token),
    FS("b", PF_F32, PF_REQ, proto_bias_t, bias),
};
SCHEMA(s_bias, "logit bias", proto_bias_t, f_bias, def_bias, NULL);

static const proto_field_t f_sampling[] = {
    FS("t", PF_F32, 0, proto_sampling_t, temperature),
    FS("k", PF_I32, 0, proto_sampling_t, top_k),
    FS("p", PF_F32, 0, proto_sampling_t, top_p),
    FS("mp", PF_F32, 0, proto_sampling_t, min_p),
    FS("rp", PF_F32, 0, proto_sampling_t, repetition_penalty),
    FS("pp", PF_F32, 0, proto_sampling_t, presence_penalty),
    FS("fp", PF_F32, 0, proto_sampling_t, frequency_penalty),
    FLD("sd", PF_U64, PF_HAS, proto_sampling_t, seed, offsetof(proto_sampling_t, has_seed), 0, NULL, NULL),
    FS("lp", PF_I32, 0, proto_sampling_t, logprobs),
    FS("wl", PF_BOOL, 0, proto_sampling_t, want_logits),
    FOBJS("lb", 0, proto_sampling_t, bias, n_bias, PROTO_MAX_BIAS, s_bias),
    FS("mn", PF_U32, 0, proto_sampling_t, min_tokens),
};
SCHEMA(s_sampling, "sampling", proto_sampling_t, f_sampling, def_sampling, check_sampling);

static const proto_field_t f_error[] = {
    FS("c", PF_I32, PF_REQ, proto_error_t, code),
    FSTR("m", 0, proto_error_t, message, PROTO_MAX_STR),
};
SCHEMA(s_error, "error", proto_error_t, f_error, def_error, NULL);

static const proto_field_t f_hello[] = {
    FS("r", PF_I32, PF_REQ, proto_hello_t, rank),
    FS("w", PF_I32, PF_REQ, proto_hello_t, world_size),
    FSTR("dev", PF_REQ, proto_hello_t, device, PROTO_MAX_STR),
    FS("kvb", PF_U32, PF_REQ, proto_hello_t, kv_blocks),
    FS("bs", PF_U32, PF_REQ, proto_hello_t, block_size),
    FS("mb", PF_U32, PF_REQ, proto_hello_t, max_batch),
    FS("pid", PF_U32, 0, proto_hello_t, pid),
    FSTR("cid", 0, proto_hello_t, comm_id, PROTO_MAX_STR),
};
SCHEMA(s_hello, "hello", proto_hello_t, f_hello, def_hello, check_hello);

static const proto_field_t f_option[] = {
    FSTR("k", PF_REQ, proto_option_t, key, PROTO_MAX_STR),
    FSTR("v", PF_REQ, proto_option_t, value, PROTO_MAX_STR),
};
SCHEMA(s_option, "option", proto_option_t, f_option, def_option, NULL);

static const proto_field_t f_load[] = {
    FSTR("path", PF_REQ, proto_load_t, path, PROTO_MAX_STR),
    FSTR("fmt", PF_REQ, proto_load_t, format, PROTO_MAX_STR),
    FSTR("dt", 0, proto_load_t, dtype, PROTO_MAX_STR),
    FS("tp", PF_U32, 0, proto_load_t, tp_size),
    FOBJS("opt", 0, proto_load_t, options, n_options, PROTO_MAX_OPTIONS, s_option),
    FS("kvb", PF_U32, 0, proto_load_t, kv_blocks),
    FS("kvm", PF_U64, 0, proto_load_t, kv_bytes),
    FS("kvu", PF_F32, 0, proto_load_t, kv_util),
    FS("bs", PF_U32, 0, proto_load_t, block_size),
    FS("kvn", PF_U32, 0, proto_load_t, kv_min_blocks),
};
SCHEMA(s_load, "load", proto_load_t, f_load, def_load, check_load);

static const proto_field_t f_loaded[] = {
    FS("r", PF_I32, PF_REQ, proto_loaded_t, rank),
    FS("kvb", PF_U32, 0, proto_loaded_t, kv_blocks),
    FS("nv", PF_U32, 0, proto_loaded_t, n_vocab),
    FS("ne", PF_U32, 0, proto_loaded_t, n_embd),
    FS("ctx", PF_U32, 0, proto_loaded_t, max_ctx),
    FOBJ("err", 0, proto_loaded_t, error, s_error),
    FS("bpb", PF_U64, 0, proto_loaded_t, block_bytes),
};
SCHEMA(s_loaded, "loaded", proto_loaded_t, f_loaded, def_loaded, NULL);

static const proto_field_t f_kv_init[] = {
    FS("kvb", PF_U32, PF_REQ, proto_kv_init_t, kv_blocks),
};
SCHEMA(s_kv_init, "kv_init", proto_kv_init_t, f_kv_init, def_kv_init, check_kv_init);

static const proto_field_t f_kv_ready[] = {
    FS("r", PF_I32, PF_REQ, proto_kv_ready_t, rank),
    FS("kvb", PF_U32, 0, proto_kv_ready_t, kv_blocks),
    FOBJ("err", 0, proto_kv_ready_t, error, s_error),
};
SCHEMA(s_kv_ready, "kv_ready", proto_kv_ready_t, f_kv_ready, def_kv_ready, NULL);

static const proto_field_t f_step_item[] = {
    FS("s", PF_U32, PF_REQ, proto_step_item_t, slot),
    FS("p", PF_U32, 0, proto_step_item_t, pos),
    FARR("tk", PF_I32S, PF_REQ, proto_step_item_t, tokens, n_tokens, PROTO_MAX_TOKENS),
    FS("f", PF_BOOL, 0, proto_step_item_t, final),
    FOBJH("sp", proto_step_item_t, sp, has_sp, s_sampling),
    FS("pl", PF_U32, 0, proto_step_item_t, prompt_len),
    FARR("ban", PF_I32S, 0, proto_step_item_t, ban, n_ban, PROTO_MAX_BAN),
    FS("ns", PF_U32, 0, proto_step_item_t, n_spec),
    FS("dm", PF_BOOL, 0, proto_step_item_t, draft),
    FARR("am", PF_U32S, 0, proto_step_item_t, mask, n_mask, PROTO_MAX_MASK_WORDS),
    FS("pp", PF_U32, 0, proto_step_item_t, n_plp),
    FS("pk", PF_I32, 0, proto_step_item_t, plp_top),
    FS("nx", PF_I32, 0, proto_step_item_t, next),
};
SCHEMA(s_step_item, "step item", proto_step_item_t, f_step_item, def_step_item, check_step_item);

static const proto_field_t f_copy[] = {
    FS("s", PF_U32, PF_REQ, proto_copy_t, src),
    FS("d", PF_U32, PF_REQ, proto_copy_t, dst),
};
SCHEMA(s_copy, "block copy", proto_copy_t, f_copy, def_copy, NULL);

static const proto_field_t f_table[] = {
    FS("s", PF_U32, PF_REQ, proto_table_t, slot),
    FS("f", PF_U32, 0, proto_table_t, first),
    FARR("b", PF_I32S, 0, proto_table_t, blocks, n_blocks, PROTO_MAX_TABLE),
};

static int check_table(const void *body) {
  const proto_table_t *t = body;
  if ((uint64_t)t->first + t->n_blocks > PROTO_MAX_TABLE)
    return fr_errorf(FR_EPROTO, "block table of slot %u: %u + %u entries, more than %u", t->slot, t->first,
                     t->n_blocks, PROTO_MAX_TABLE);
  return 0;
}
SCHEMA(s_table, "block table", proto_table_t, f_table, def_table, check_table);

static const proto_field_t f_step[] = {
    FS("id", PF_U64, PF_REQ, proto_step_t, step_id),
    FS("ep", PF_U64, PF_REQ, proto_step_t, epoch),
    FOBJS("it", 0, proto_step_t, items, n_items, PROTO_MAX_ITEMS, s_step_item),
    FARR("fr", PF_U32S, 0, proto_step_t, freed, n_freed, PROTO_MAX_FREED),
    FOBJS("cp", 0, proto_step_t, copies, n_copies, PROTO_MAX_COPIES, s_copy),
    FOBJS("tb", 0, proto_step_t, tables, n_tables, PROTO_MAX_ITEMS, s_table),
};
SCHEMA(s_step, "step", proto_step_t, f_step, def_step, NULL);

static const proto_field_t f_toplp[] = {
    FS("t", PF_I32, PF_REQ, proto_toplp_t, token),
    FS("l", PF_F32, PF_REQ, proto_toplp_t, logprob),
};
SCHEMA(s_toplp, "top logprob", proto_toplp_t, f_toplp, def_toplp, NULL);

static const proto_field_t f_handle[] = {
    FS("g", PF_U32, 0, proto_logits_handle_t, segment),
    FS("s", PF_U32, 0, proto_logits_handle_t, slot),
    FS("r", PF_U32, 0, proto_logits_handle_t, row),
};
SCHEMA(s_handle, "logits handle", proto_logits_handle_t, f_handle, def_handle, NULL);

static const proto_field_t f_result_item[] = {
    FS("s", PF_U32, PF_REQ, proto_result_item_t, slot),
    FS("tok", PF_I32, PF_REQ, proto_result_item_t, token),
    FS("err", PF_I32, 0, proto_result_item_t, error),
    FS("lp", PF_F32, 0, proto_result_item_t, logprob),
    FOBJS("top", 0, proto_result_item_t, top, n_top, PROTO_MAX_TOPN, s_toplp),
    FOBJH("lh", proto_result_item_t, logits, has_logits, s_handle),
    FARR("xt", PF_I32S, 0, proto_result_item_t, extra, n_extra, PROTO_MAX_SPEC),
    FARR("xl", PF_F32S, 0, proto_result_item_t, extra_lp, n_extra_lp, PROTO_MAX_SPEC),
    FOBJS("xtp", 0, proto_result_item_t, extra_top, n_extra_top, PROTO_MAX_SPEC * PROTO_MAX_TOPN, s_toplp),
    FARR("em", PF_F32S, 0, proto_result_item_t, embd, n_embd, PROTO_MAX_EMBD),
    FARR("pl", PF_F32S, 0, proto_result_item_t, plp, n_plp, PROTO_MAX_TOKENS),
    FARR("pr", PF_U32S, 0, proto_result_item_t, plp_rank, n_plp_rank, PROTO_MAX_TOKENS),
    FOBJS("ptp", 0, proto_result_item_t, plp_top, n_plp_top, PROTO_MAX_PROMPT_TOP, s_toplp),
};

static int check_result_item(const void *body) {
  const proto_result_item_t *it = body;
  if (it->n_extra_lp != 0 && it->n_extra_lp != it->n_extra)
    return fr_errorf(FR_EPROTO, "%u extra logprobs for %u extra tokens", it->n_extra_lp, it->n_extra);
  if (it->n_extra_top != 0 && it->n_extra_top != it->n_extra * it->n_top)
    return fr_errorf(FR_EPROTO, "%u extra top logprobs for %u extra tokens of %u each", it->n_extra_top, it->n_extra,
                     it->n_top);
  if (it->n_plp_rank != 0 && it->n_plp_rank != it->n_plp)
    return fr_errorf(FR_EPROTO, "%u prompt logprob ranks for %u prompt logprobs", it->n_plp_rank, it->n_plp);
  if (it->n_plp_top && (!it->n_plp || it->n_plp_top % it->n_plp || it->n_plp_top / it->n_plp > PROTO_MAX_TOPN))
    return fr_errorf(FR_EPROTO, "%u prompt top logprobs for %u prompt logprobs", it->n_plp_top, it->n_plp);
  return 0;
}
SCHEMA(s_result_item, "result item", proto_result_item_t, f_result_item, def_result_item, check_result_item);

static const proto_field_t f_timings[] = {
    FS("fw", PF_U64, 0, proto_timings_t, forward_us),
    FS("sa", PF_U64, 0, proto_timings_t, sample_us),
    FS("to", PF_U64, 0, proto_timings_t, total_us),
    FS("cm", PF_U64, 0, proto_timings_t, comm_us),
};
SCHEMA(s_timings, "timings", proto_timings_t, f_timings, def_timings, NULL);

static const proto_field_t f_result[] = {
    FS("id", PF_U64, PF_REQ, proto_result_t, step_id),
    FS("ep", PF_U64, PF_REQ, proto_result_t, epoch),
    FS("r", PF_I32, 0, proto_result_t, rank),
    FOBJS("it", 0, proto_result_t, items, n_items, PROTO_MAX_ITEMS, s_result_item),
    FOBJ("tm", 0, proto_result_t, timings, s_timings),
    FOBJ("err", 0, proto_result_t, error, s_error),
};
SCHEMA(s_result, "result", proto_result_t, f_result, def_result, NULL);

static const proto_field_t f_heartbeat[] = {
    FS("r", PF_I32, 0, proto_heartbeat_t, rank),
    FS("seq", PF_U64, 0, proto_heartbeat_t, seq),
    FS("ts", PF_U64, 0, proto_heartbeat_t, ts_ns),
};
SCHEMA(s_heartbeat, "hb", proto_heartbeat_t, f_heartbeat, def_heartbeat, NULL);

static const proto_field_t f_shutdown[] = {
    FSTR("why", 0, proto_shutdown_t, reason, PROTO_MAX_STR),
    FS("dr", PF_BOOL, 0, proto_shutdown_t, drain),
};
SCHEMA(s_shutdown, "shutdown", proto_shutdown_t, f_shutdown, def_shutdown, NULL);

static const proto_field_t f_chat_msg[] = {
    FSTR("r", PF_REQ, proto_chat_msg_t, role, PROTO_MAX_STR),
    FARR("c", PF_TEXT, PF_REQ, proto_chat_msg_t, content, content_len, PROTO_MAX_TEXT),
    FARR("j", PF_TEXT, 0, proto_chat_msg_t, json, json_len, PROTO_MAX_TEXT),
    FARR("v", PF_TEXT, 0, proto_chat_msg_t, vars, vars_len, PROTO_MAX_TEXT),
};
SCHEMA(s_chat_msg, "chat message", proto_chat_msg_t, f_chat_msg, def_chat_msg, NULL);

static const proto_field_t f_stop[] = {
    FARR("s", PF_STRS, 0, proto_stop_t, strs, n_strs, PROTO_MAX_STOP),
    FARR("i", PF_I32S, 0, proto_stop_t, ids, n_ids, PROTO_MAX_STOP_IDS),
    FS("ie", PF_BOOL, 0, proto_stop_t, ignore_eos),
    FS("inc", PF_BOOL, 0, proto_stop_t, include),
    FS("ks", PF_BOOL, 0, proto_stop_t, keep_special),
};
SCHEMA(s_stop, "stop", proto_stop_t, f_stop, def_stop, NULL);

static const proto_field_t f_prompt_opts[] = {
    FS("tr", PF_U32, 0, proto_prompt_opts_t, truncate),
    FS("fk", PF_U64, 0, proto_prompt_opts_t, fork_of),
    FS("em", PF_BOOL, 0, proto_prompt_opts_t, embed),
    FS("lp", PF_BOOL, 0, proto_prompt_opts_t, logprobs),
    FS("lk", PF_U32, 0, proto_prompt_opts_t, logprobs_top),
};
SCHEMA(s_prompt_opts, "prompt handling", proto_prompt_opts_t, f_prompt_opts, def_prompt_opts, check_prompt_opts);
static const char *const guide_names[] = {NULL, "json", "regex"};

static const proto_field_t f_guide[] = {
    FLD("k", PF_ENUM, PF_REQ, proto_guide_t, kind, 0, PROTO_GUIDE_COUNT, NULL, guide_names),
    FARR("s", PF_TEXT, 0, proto_guide_t, spec, spec_len, PROTO_MAX_TEXT),
    FARR("a", PF_TEXT, 0, proto_guide_t, after, after_len, PROTO_MAX_STR),
};
SCHEMA(s_guide, "guide", proto_guide_t, f_guide, def_guide, NULL);

static const proto_field_t f_submit[] = {
    FS("id", PF_U64, PF_REQ, proto_submit_t, id),
    FSTR("m", 0, proto_submit_t, model, PROTO_MAX_STR),
    FARR("p", PF_TEXT, 0, proto_submit_t, prompt, prompt_len, PROTO_MAX_TEXT),
    FARR("tk", PF_I32S, 0, proto_submit_t, tokens, n_tokens, PROTO_MAX_TOKENS),
    FOBJS("msgs", 0, proto_submit_t, messages, n_messages, PROTO_MAX_MESSAGES, s_chat_msg),
    FOBJ("sp", 0, proto_submit_t, sp, s_sampling),
    FS("mt", PF_U32, 0, proto_submit_t, max_tokens),
    FOBJ("stop", 0, proto_submit_t, stop, s_stop),
    FS("str", PF_BOOL, 0, proto_submit_t, stream),
    FS("rl", PF_BOOL, 0, proto_submit_t, return_logits),
    FS("pr", PF_I32, 0, proto_submit_t, priority),
    FOBJ("ph", 0, proto_submit_t, ph, s_prompt_opts),
    FOBJ("gd", 0, proto_submit_t, guide, s_guide),
};
SCHEMA(s_submit, "submit", proto_submit_t, f_submit, def_submit, check_submit);

static const char *const finish_names[] = {NULL, "stop", "length", "cancel", "error"};

static const proto_field_t f_usage[] = {
    FS("p", PF_U32, 0, proto_usage_t, prompt_tokens),
    FS("c", PF_U32, 0, proto_usage_t, completion_tokens),
    FS("k", PF_U32, 0, proto_usage_t, cached_tokens),
};
SCHEMA(s_usage, "usage", proto_usage_t, f_usage, def_usage, NULL);

static const proto_field_t f_prompt_lp[] = {
    FARR("tk", PF_I32S, 0, proto_prompt_lp_t, tokens, n_tokens, PROTO_MAX_TOKENS),
    FARR("lp", PF_F32S, 0, proto_prompt_lp_t, lp, n_lp, PROTO_MAX_TOKENS),
    FARR("rk", PF_U32S, 0, proto_prompt_lp_t, rank, n_rank, PROTO_MAX_TOKENS),
    FS("k", PF_U32, 0, proto_prompt_lp_t, top_n),
    FOBJS("top", 0, proto_prompt_lp_t, top, n_top, PROTO_MAX_PROMPT_TOP, s_toplp),
};
SCHEMA(s_prompt_lp, "prompt logprobs", proto_prompt_lp_t, f_prompt_lp, def_prompt_lp, check_prompt_lp);

static const proto_field_t f_event[] = {
    FS("id", PF_U64, PF_REQ, proto_event_t, id),
    FARR("tx", PF_TEXT, 0, proto_event_t, text, text_len, PROTO_MAX_TEXT),
    FARR("tk", PF_I32S, 0, proto_event_t, tokens, n_tokens, PROTO_MAX_TOKENS),
    FARR("lp", PF_F32S, 0, proto_event_t, logprobs, n_logprobs, PROTO_MAX_TOKENS),
    FS("k", PF_U32, 0, proto_event_t, top_n),
    FOBJS("top", 0, proto_event_t, top, n_top, PROTO_MAX_TOKENS, s_toplp),
    FLD("fin", PF_ENUM, 0, proto_event_t, finish, 0, PROTO_FINISH_COUNT, NULL, finish_names),
    FOBJH("u", proto_event_t, usage, has_usage, s_usage),
    FARR("lg", PF_F32BIN, 0, proto_event_t, logits, n_logits, PROTO_MAX_LOGITS),
    FOBJ("err", 0, proto_event_t, error, s_error),
    FSTR("ss", 0, proto_event_t, stop_str, PROTO_MAX_STR),
    FS("si", PF_I32, 0, proto_event_t, stop_id),
    FOBJH("pl", proto_event_t, plp, has_plp, s_prompt_lp),
};
SCHEMA(s_event, "event", proto_event_t, f_event, def_event, check_event);

static const proto_field_t f_cancel[] = {
    FS("id", PF_U64, PF_REQ, proto_cancel_t, id),
};
SCHEMA(s_cancel, "cancel", proto_cancel_t, f_cancel, def_cancel, check_id);

static const proto_field_t f_status[] = {
    FS("rid", PF_U64, 0, proto_status_t, rid),
    FSTR("m", 0, proto_status_t, model, PROTO_MAX_STR),
};
SCHEMA(s_status, "status", proto_status_t, f_status, def_status, NULL);

static const proto_tp_info_t def_tp_info;
static const proto_field_t f_tp_info[] = {
    FS("n", PF_U32, 0, proto_tp_info_t, size),
    FARR("dv", PF_STRS, 0, proto_tp_info_t, devices, n_devices, PROTO_MAX_RANKS),
};
SCHEMA(s_tp_info, "tp info", proto_tp_info_t, f_tp_info, def_tp_info, NULL);

static const proto_field_t f_status_r[] = {
    FS("rid", PF_U64, 0, proto_status_reply_t, rid),
    FSTR("m", 0, proto_status_reply_t, model, PROTO_MAX_STR),
    FS("q", PF_U32, 0, proto_status_reply_t, queued),
    FS("run", PF_U32, 0, proto_status_reply_t, running),
    FS("kvu", PF_U32, 0, proto_status_reply_t, kv_used_blocks),
    FS("kvt", PF_U32, 0, proto_status_reply_t, kv_total_blocks),
    FS("nw", PF_U32, 0, proto_status_reply_t, n_workers),
    FS("pcq", PF_U64, 0, proto_status_reply_t, prefix_queries),
    FS("pch", PF_U64, 0, proto_status_reply_t, prefix_hits),
    FS("pre", PF_U64, 0, proto_status_reply_t, preemptions),
    FS("wr", PF_U32, 0, proto_status_reply_t, worker_restarts),
    FS("dr", PF_BOOL, 0, proto_status_reply_t, draining),
    FOBJ("tp", 0, proto_status_reply_t, tp, s_tp_info),
};
SCHEMA(s_status_r, "status_r", proto_status_reply_t, f_status_r, def_status_r, NULL);

static const proto_field_t f_models[] = {
    FS("rid", PF_U64, 0, proto_models_t, rid),
};
SCHEMA(s_models, "models", proto_models_t, f_models, def_models, NULL);

static const proto_field_t f_model_info[] = {
    FSTR("n", PF_REQ, proto_model_info_t, name, PROTO_MAX_STR),
    FS("ctx", PF_U32, 0, proto_model_info_t, max_ctx),
};
SCHEMA(s_model_info, "model", proto_model_info_t, f_model_info, def_model_info, NULL);

static const proto_field_t f_models_r[] = {
    FS("rid", PF_U64, 0, proto_models_reply_t, rid),
    FOBJS("ms", 0, proto_models_reply_t, models, n_models, PROTO_MAX_MODELS, s_model_info),
};
SCHEMA(s_models_r, "models_r", proto_models_reply_t, f_models_r, def_models_r, NULL);

static const proto_field_t f_error_msg[] = {
    FS("c", PF_I32, PF_REQ, proto_error_msg_t, code),
    FSTR("m", 0, proto_error_msg_t, message, PROTO_MAX_STR),
    FS("id", PF_U64, 0, proto_error_msg_t, id),
    FS("rid", PF_U64, 0, proto_error_msg_t, rid),
};
SCHEMA(s_error_msg, "error", proto_error_msg_t, f_error_msg, def_error_msg, NULL);

/* ------------------------------------------------------------ types */

/* version: the protocol version that last changed the type's schema. */
static const struct {
  const char *name;
  const proto_schema_t *schema;
  uint32_t version;
} types[PROTO_T_COUNT] = {
    [PROTO_T_HELLO] = {"hello", &s_hello, 1},
    [PROTO_T_LOAD] = {"load", &s_load, 2},
    [PROTO_T_LOADED] = {"loaded", &s_loaded, 2},
    [PROTO_T_STEP] = {"step", &s_step, 5},
    [PROTO_T_RESULT] = {"result", &s_result, 5},
    [PROTO_T_HEARTBEAT] = {"hb", &s_heartbeat, 1},
    [PROTO_T_SHUTDOWN] = {"shutdown", &s_shutdown, 1},
    [PROTO_T_KV_INIT] = {"kv_init", &s_kv_init, 2},
    [PROTO_T_KV_READY] = {"kv_ready", &s_kv_ready, 2},
    [PROTO_T_SUBMIT] = {"submit", &s_submit, 5},
    [PROTO_T_EVENT] = {"event", &s_event, 1},
    [PROTO_T_CANCEL] = {"cancel", &s_cancel, 1},
    [PROTO_T_STATUS] = {"status", &s_status, 1},
    [PROTO_T_STATUS_R] = {"status_r", &s_status_r, 1},
    [PROTO_T_MODELS] = {"models", &s_models, 1},
    [PROTO_T_MODELS_R] = {"models_r", &s_models_r, 1},
    [PROTO_T_ERROR] = {"error", &s_error_msg, 1},
};

const proto_schema_t *proto__schema(proto_type_t t) {
  if ((unsigned)t >= PROTO_T_COUNT) return NULL;
  return types[t].schema;
}

const char *proto_type_name(proto_type_t t) {
  if ((unsigned)t >= PROTO_T_COUNT || !types[t].name) return "none";
  return types[t].name;
}

uint32_t proto_type_version(proto_type_t t) {
  if ((unsigned)t >= PROTO_T_COUNT) return 0;
  return types[t].version;
}

proto_type_t proto_type_from_name(const char *name, size_t len) {
  for (int t = 1; t < PROTO_T_COUNT; t++)
    if (strlen(types[t].name) == len && memcmp(types[t].name, name, len) == 0) return (proto_type_t)t;
  return PROTO_T_NONE;
}

const char *proto_finish_name(proto_finish_t f) {
  if ((unsigned)f >= PROTO_FINISH_COUNT) return NULL;
  return finish_names[f];
}

void proto_body_default(proto_type_t type, void *body) {
  const proto_schema_t *s = proto__schema(type);
  if (s) memcpy(body, s->defaults, s->size);
}

int32_t proto_err_from_fr(int err) {
  switch (err) {
  case 0: return 0;
  case FR_EFORMAT: case FR_EPROTO: case FR_ETRUNCATED: case FR_ECONTEXT: case -EINVAL:
    return PROTO_ERR_BAD_REQUEST;
  case FR_ENOTFOUND: case -ENOENT: return PROTO_ERR_NOT_FOUND;
  case FR_ETIMEOUT: return PROTO_ERR_TIMEOUT;
  case FR_ETOOBIG: return PROTO_ERR_TOO_BIG;
  case FR_EBUSY: case FR_EDEVOOM: case -ENOMEM: case -EAGAIN: return PROTO_ERR_BUSY;
  case FR_ECANCELED: return PROTO_ERR_CANCELED;
  case FR_EVERSION: return PROTO_ERR_VERSION;
  case FR_EDEAD: case FR_EZMQ: return PROTO_ERR_UNAVAILABLE;
  default: return PROTO_ERR_INTERNAL;
  }
}
