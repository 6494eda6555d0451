/* load.c - the worker's load: backend, model, control segment, KV pool and
 * logits segments, per-step scratch. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_log.h"
#include "common/fr_util.h"
#include "model/dummy.h"
#include "worker/worker.h"

/* Load options ("k" = "v" strings) the coordinator sends. */
typedef struct {
  const char *device;
  const char *comm; /* tensor parallel: the group's rendezvous (kern_comm_t.id) */
  long threads, max_tokens, max_seqs;
  long block_size, max_blocks; /* remote: the control segment's geometry */
  bool fake_forward, remote;
  bool multi_host; /* the group has ranks on other hosts */
  int kv_dtype;    /* kern_kv_dtype_t */
  bool fp8;        /* "quantization" = fp8: FP8 weights (model_load_opts_t.fp8_weights) */
  const char *draft; /* speculative decoding's draft model (a GGUF file or HF folder), or NULL */
  model_pooling_t pooling; /* "pooling" = last|mean|cls: an embedding model (--task embed) */
} worker_load_opts_t;

static int worker__opt_long(const char *key, const char *v, long lo, long hi, long *out) {
  char *end;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno || end == v || *end || x < lo || x > hi)
    return fr_errorf(FR_EPROTO, "load option %s=%s: not a number in [%ld, %ld]", key, v, lo, hi);
  *out = x;
  return 0;
}

static int worker__parse_opts(const proto_load_t *l, worker_load_opts_t *o) {
  *o = (worker_load_opts_t){.device = "cpu", .max_tokens = 512, .max_seqs = 64};
  for (uint32_t i = 0; i < l->n_options; i++) {
    const char *k = l->options[i].key, *v = l->options[i].value;
    int rc = 0;
    if (!strcmp(k, "device")) o->device = v;
    else if (!strcmp(k, "threads")) rc = worker__opt_long(k, v, 0, 1024, &o->threads);
    else if (!strcmp(k, "max_tokens")) rc = worker__opt_long(k, v, 1, PROTO_MAX_TOKENS, &o->max_tokens);
    else if (!strcmp(k, "max_seqs")) rc = worker__opt_long(k, v, 1, PROTO_MAX_ITEMS, &o->max_seqs);
    else if (!strcmp(k, "fake_forward")) o->fake_forward = !strcmp(v, "1");
    else if (!strcmp(k, "comm")) o->comm = v;
    else if (!strcmp(k, "draft")) o->draft = v;
    else if (!strcmp(k, "remote")) o->remote = !strcmp(v, "1");
    else if (!strcmp(k, "multi_host")) o->multi_host = !strcmp(v, "1");
    else if (!strcmp(k, "block_size")) rc = worker__opt_long(k, v, 1, 4096, &o->block_size);
    else if (!strcmp(k, "max_blocks")) rc = worker__opt_long(k, v, 1, PROTO_MAX_TABLE, &o->max_blocks);
    else if (!strcmp(k, "pooling")) {
      int p = model_pooling_parse(v);
      if (p <= MODEL_POOL_NONE) rc = fr_errorf(FR_EPROTO, "load option pooling=%s: not last, mean or cls", v);
      o->pooling = (model_pooling_t)p;
    } else if (!strcmp(k, "kv_cache_dtype")) {
      if ((o->kv_dtype = kern_kv_dtype_parse(v)) < 0)
        rc = fr_errorf(FR_EPROTO, "load option kv_cache_dtype=%s: not auto, int8 or fp8", v);
    } else if (!strcmp(k, "quantization")) {
      if (!(o->fp8 = !strcmp(v, "fp8"))) rc = fr_errorf(FR_EPROTO, "load option quantization=%s: only fp8", v);
    } else {
      FR_LOGW("unknown load option %s ignored", k);
    }
    if (rc) return rc;
  }
  if (o->remote && (!o->block_size || !o->max_blocks))
    return fr_errorf(FR_EPROTO, "a remote load needs the options block_size and max_blocks");
  return 0;
}

/* The pool's config for this model: the backend's element type, or the
 * quantized cache the load asked for. */
static kern_kv_config_t worker__kv_config(const worker_t *w, int block_size, int n_blocks) {
  kern_kv_config_t kc = model_kv_config(w->m, block_size, n_blocks, w->be->kv_type);
  kc.dtype = w->kv_dtype;
  return kc;
}

/* Whether the backend keeps the asked KV cache dtype (a clear start-up error otherwise). */
static int worker__kv_dtype(worker_t *w, int dtype) {
  w->kv_dtype = (kern_kv_dtype_t)dtype;
  if (w->be->kv_dtypes & (1u << dtype)) return 0;
  return fr_errorf(FR_EUNSUPPORTED, "--kv-cache-dtype %s: the %s backend cannot keep it%s",
                   kern_kv_dtype_name(w->kv_dtype), w->be->ops->name,
                   dtype == KERN_KV_FP8 ? " (fp8 KV needs a CUDA device)" : "");
}

/* A device backend's pool lives in device memory (lost with the worker;
 * the coordinator recomputes). */
static int worker__device_pool(worker_t *w) {
  kern_kv_config_t kc = worker__kv_config(w, w->info.block_size, w->info.n_blocks);
  int rc = w->be->ops->kv_pool_init(w->be->ctx, &w->pool, &kc, NULL);
  if (rc) return fr_errorf(rc, "KV pool of %d blocks (%zu MiB): %s", w->info.n_blocks, kern_kv_pool_bytes(&kc) >> 20,
                           fr_last_error());
  if (!w->dm) return 0;
  kern_kv_config_t dkc = worker__draft_kv_config(w, w->info.block_size, w->info.n_blocks);
  rc = w->be->ops->kv_pool_init(w->be->ctx, &w->dpool, &dkc, NULL);
  if (rc) return fr_errorf(rc, "the draft model's KV pool of %d blocks (%zu MiB): %s", w->info.n_blocks,
                           kern_kv_pool_bytes(&dkc) >> 20, fr_last_error());
  return 0;
}

/* Bytes of the target's pool in the segment, rounded up so that the
 * draft's pool after it is aligned. */
static size_t worker__pool_head(size_t bytes) { return (bytes + 4095) & ~(size_t)4095; }

/* A backend whose memory is host memory keeps its pool in a shared memory
 * segment: maps (or creates) it and adopts it without zeroing, so
 * prefix-cached blocks written before a restart stay valid. */
static int worker__pool(worker_t *w) {
  if (!w->be->host_memory || w->remote) return worker__device_pool(w); /* remote: in this process */
  kern_kv_config_t kc = worker__kv_config(w, w->info.block_size, w->info.n_blocks), dkc = {0};
  size_t bytes = kern_kv_pool_bytes(&kc), head = worker__pool_head(bytes);
  if (w->dm) { /* the draft's pool follows the target's in the same segment (kept over a restart alike) */
    dkc = worker__draft_kv_config(w, w->info.block_size, w->info.n_blocks);
    size_t dbytes = kern_kv_pool_bytes(&dkc);
    bytes = bytes && dbytes ? head + dbytes : 0;
  }
  if (!bytes) return fr_errorf(FR_ETOOBIG, "KV pool of %d blocks is too big", w->info.n_blocks);
  char what[KV_WHAT_MAX];
  snprintf(what, sizeof what, "%s%d", WORKER_POOL_WHAT, w->args.rank);
  int rc = kv_segment_attach(&w->pool_seg, w->args.instance, what, KV_SEG_RDWR);
  if (rc == 0 && kv_segment_data_size(&w->pool_seg) < bytes) {
    FR_LOGW("KV pool segment too small for this geometry: recreating it");
    kv_segment_detach(&w->pool_seg);
    kv_segment_unlink(w->args.instance, what);
    rc = -ENOENT;
  }
  if (rc == 0) {
    /* the coordinator owns it while it lives (see coord supervise.c) */
    if (!kv_segment_owner_alive(kv_segment_header(&w->pool_seg)) && (rc = kv_segment_adopt(&w->pool_seg, w->info.epoch)))
      return rc;
    FR_LOGI("KV pool segment %s reused (%zu MiB)", w->pool_seg.name, bytes >> 20);
  } else if (rc == -ENOENT) {
    if ((rc = kv_segment_create(&w->pool_seg, w->args.instance, what, bytes, w->info.epoch))) return rc;
  } else {
    return rc;
  }
  /* the CPU backend's kv_pool_init would zero it: set the pool up as it does, without that */
  kern_kv_pool_layout(&w->pool, &kc, kv_segment_data(&w->pool_seg), true);
  if (w->dm)
    kern_kv_pool_layout(&w->dpool, &dkc, (char *)kv_segment_data(&w->pool_seg) + head, true);
  return 0;
}

static int worker__logits_seg(worker_t *w) {
  if (w->args.rank != 0 || w->remote) return 0; /* remote: no logits handles */
  char what[KV_WHAT_MAX];
  snprintf(what, sizeof what, "%s%d", WORKER_LOGITS_WHAT, w->args.rank);
  size_t bytes = (size_t)w->max_seqs * (size_t)w->vocab * sizeof(float);
  int rc = kv_segment_attach(&w->logits_seg, w->args.instance, what, KV_SEG_RDWR);
  if (rc == 0 && kv_segment_data_size(&w->logits_seg) < bytes) {
    kv_segment_detach(&w->logits_seg);
    kv_segment_unlink(w->args.instance, what);
    rc = -ENOENT;
  }
  if (rc == 0 && !kv_segment_owner_alive(kv_segment_header(&w->logits_seg)))
    rc = kv_segment_adopt(&w->logits_seg, w->info.epoch);
  else if (rc == -ENOENT) rc = kv_segment_create(&w->logits_seg, w->args.instance, what, bytes, w->info.epoch);
  w->logits_rows = w->max_seqs;
  return rc;
}

static void worker__scratch(worker_t *w) {
  size_t T = (size_t)w->max_tokens, S = (size_t)w->max_seqs;
  size_t V = (size_t)FR_MAX(w->vocab, model_out_width(w->m)); /* pooled rows are dim wide */
  w->tokens = fr_malloc(T * sizeof(int32_t));
  w->pos = fr_malloc(T * sizeof(int32_t));
  w->slots = fr_malloc(T * sizeof(int32_t));
  w->q_start = fr_malloc((S + 1) * sizeof(int32_t));
  w->ctx_len = fr_malloc(S * sizeof(int32_t));
  w->tables = fr_malloc(S * (size_t)w->info.max_blocks_per_seq * sizeof(int32_t));
  w->copy_pairs = fr_malloc(2 * (size_t)PROTO_MAX_COPIES * sizeof(int32_t));
  w->logits = fr_malloc(S * V * sizeof(float));
  w->raw = fr_malloc(V * sizeof(float));
  w->ritems = fr_calloc(S, sizeof(proto_result_item_t));
  w->ok_items = fr_calloc(S, sizeof(proto_step_item_t));
  w->rows = fr_malloc(S * sizeof(int32_t));
  w->xtok = fr_malloc(S * sizeof(int32_t));
  w->xlp = fr_malloc(S * sizeof(float));
  w->xtop = fr_calloc(S * PROTO_MAX_TOPN, sizeof(proto_toplp_t));
  w->tops = fr_calloc(S * PROTO_MAX_TOPN, sizeof(proto_toplp_t));
  w->top_ids = fr_malloc(S * PROTO_MAX_TOPN * sizeof(int32_t)); /* a row per item: the device sampler fills all */
  if (w->remote) {
    w->rtab = fr_malloc((size_t)w->info.max_seqs * (size_t)w->info.max_blocks_per_seq * sizeof(int32_t));
    w->rlen = fr_calloc((size_t)w->info.max_seqs, sizeof(int32_t));
  }
  w->top_lp = fr_malloc(S * PROTO_MAX_TOPN * sizeof(float));
  w->plp = fr_malloc(T * sizeof(float));
  w->plp_rank = fr_malloc(T * sizeof(uint32_t));
  w->plp_top = fr_calloc(T * PROTO_MAX_TOPN, sizeof(proto_toplp_t));
  w->hist = fr_calloc((size_t)w->info.max_seqs, sizeof(worker_hist_t));
  model_sampler_init(&w->smp, w->vocab);
}

/* ---- memory: what the load uses, and the KV pool that fits -------------------- */

static size_t worker__weight_bytes_one(const kern_weight_t *w) { return w->data ? (size_t)w->rows * w->row_bytes : 0; }

/* See worker.h. */
size_t worker__weight_bytes(const model_t *m) {
  size_t n = worker__weight_bytes_one(&m->tok_embd) + worker__weight_bytes_one(&m->output_norm) +
             worker__weight_bytes_one(&m->inv_freq);
  if (m->output.data != m->tok_embd.data) n += worker__weight_bytes_one(&m->output);
  for (int i = 0; m->layers && i < m->cfg.n_layers; i++) { /* a BERT encoder has none (CPU only: not sized) */
    const model_layer_t *L = &m->layers[i];
    const kern_weight_t *ws[] = {&L->attn_norm, &L->wqkv, &L->bqkv, &L->wq,     &L->wk,        &L->wv,
                                 &L->bq,        &L->bk,   &L->bv,   &L->q_norm, &L->k_norm,    &L->wo,
                                 &L->ffn_norm,  &L->w_gate_up, &L->w_gate, &L->w_up, &L->w_down};
    for (size_t k = 0; k < FR_ARRAY_SIZE(ws); k++) n += worker__weight_bytes_one(ws[k]);
  }
  return n;
}

/* Device memory in use (total - free) and the total; 0 and 0 when the
 * backend does not say (the CPU). */
static int worker__mem_used(worker_t *w, size_t *used, size_t *total) {
  size_t free_b = 0;
  *used = *total = 0;
  if (!w->be->ops->mem_info) return 0;
  int rc = w->be->ops->mem_info(w->be->ctx, &free_b, total);
  if (rc) return rc;
  *used = *total > free_b ? *total - free_b : 0;
  return 0;
}

/* One forward pass of max_tokens tokens over max_seqs sequences (the step
 * shape the scratch is sized for) against a throw-away pool, without graph
 * capture, so that what the backend allocates on first use (step metadata,
 * staging buffers, library workspaces, lazily loaded kernels) is in use
 * before the free memory is read. Costs one prefill of max_tokens tokens. */
static int worker__warmup(worker_t *w, int bs) {
  model_t *m = w->m;
  const int T = m->max_tokens, S = m->max_seqs, per = T / S, last = T - per * (S - 1);
  const int maxb = (last + bs - 1) / bs, nb = S * maxb; /* the last sequence is the longest */
  kern_kv_config_t kc = worker__kv_config(w, bs, nb);
  kern_kv_pool_t pool;
  int rc = w->be->ops->kv_pool_init(w->be->ctx, &pool, &kc, NULL);
  if (rc) return fr_errorf(rc, "warm-up KV pool of %d blocks: %s", nb, fr_last_error());
  int32_t *buf = fr_calloc(3 * (size_t)T + 2 * (size_t)S + 1 + (size_t)nb, sizeof(int32_t));
  int32_t *tok = buf, *pos = tok + T, *slot = pos + T, *qs = slot + T, *cl = qs + S + 1, *bt = cl + S;
  for (int s = 0; s < S; s++) {
    qs[s] = s * per;
    cl[s] = s == S - 1 ? last : per;
    for (int b = 0; b < maxb; b++) bt[s * maxb + b] = s * maxb + b;
    for (int i = 0; i < cl[s]; i++) {
      int t = qs[s] + i;
      tok[t] = t % m->cfg.vocab_size;
      pos[t] = i;
      slot[t] = (s * maxb + i / bs) * bs + i % bs;
    }
  }
  qs[S] = T;
  kern_step_t ks = {.n_tokens = T, .tokens = tok, .n_seqs = S, .positions = pos, .slots = slot, .q_start = qs,
                    .ctx_len = cl, .block_tables = bt, .max_blocks = maxb};
  bool no_graphs = m->no_graphs;
  m->no_graphs = true; /* a graph captured against this pool must not outlive it */
  const void *logits = NULL;
  rc = model_forward(m, &pool, &ks, &logits);
  m->no_graphs = no_graphs;
  float *host = rc ? NULL : fr_malloc((size_t)S * (size_t)m->cfg.vocab_size * sizeof(float));
  if (!rc) rc = model_logits_to_host(m, logits, S, host);
  if (!rc) rc = w->be->ops->sync(w->be->ctx);
  free(host);
  free(buf);
  w->be->ops->kv_pool_deinit(w->be->ctx, &pool);
  return rc ? fr_errorf(rc, "warm-up step: %s", fr_last_error()) : 0;
}

/* The KV budget of a fraction of the device's total memory: what is left of
 * total * util once weights and activations (after a warm-up step) are in
 * use. *act grows by what the warm-up allocated. */
static int worker__util_budget(worker_t *w, float util, size_t used_load, size_t *budget, size_t *act, char *why,
                               size_t why_cap) {
  if (!w->be->ops->mem_info)
    return fr_errorf(FR_EUNSUPPORTED,
                     "--gpu-memory-utilization needs a device that reports its memory; the %s backend does not "
                     "(give --kv-cache-memory-bytes or --num-kv-blocks)",
                     w->be->ops->name);
  size_t used, total;
  int rc = w->fake_forward ? 0 : worker__warmup(w, w->kv_block_size);
  if (rc || (rc = worker__mem_used(w, &used, &total))) return rc;
  if (used > used_load) *act += used - used_load;
  double limit = (double)total * util;
  *budget = limit > (double)used ? (size_t)(limit - (double)used) : 0;
  snprintf(why, why_cap, " (device: %.1f MiB free of %.1f MiB after loading; --gpu-memory-utilization %.2f allows %.1f MiB)",
           (total - used) / 1048576.0, total / 1048576.0, (double)util, limit / 1048576.0);
  FR_LOGI("KV budget %.1f MiB%s", *budget / 1048576.0, why);
  return 0;
}

/* Works out w->kv_capacity from the load's byte budget or memory fraction. */
static int worker__kv_size(worker_t *w, const proto_load_t *l, size_t used_load, size_t *act) {
  w->kv_block_size = (int)FR_MIN(l->block_size, (uint32_t)INT32_MAX);
  kern_kv_config_t kc = worker__kv_config(w, w->kv_block_size, 1);
  w->kv_block_bytes = kern_kv_block_bytes(&kc);
  if (w->kv_block_bytes) w->kv_block_bytes += worker__draft_block_bytes(w, w->kv_block_size); /* a block of each */
  if (!w->kv_block_bytes) return fr_errorf(FR_ETOOBIG, "a KV block of %u tokens: size overflows", l->block_size);
  size_t budget = l->kv_bytes > SIZE_MAX ? SIZE_MAX : (size_t)l->kv_bytes;
  char why[256] = "";
  int rc = l->kv_util > 0 ? worker__util_budget(w, l->kv_util, used_load, &budget, act, why, sizeof why) : 0;
  if (rc) return rc;
  size_t blocks = budget / w->kv_block_bytes, cap = (size_t)(INT32_MAX / w->kv_block_size);
  if (blocks > cap) FR_LOGI("KV budget holds %zu blocks; using the most the allocator takes, %zu", blocks, cap);
  blocks = FR_MIN(blocks, cap);
  uint32_t need = FR_MAX(l->kv_min_blocks, 1u);
  if (blocks < need)
    return fr_errorf(FR_EDEVOOM,
                     "the KV cache needs at least %u block(s) of %d tokens (%.1f MiB, %zu bytes each) but only %.1f MiB "
                     "(%zu blocks) are available%s%s",
                     need, w->kv_block_size, (double)need * w->kv_block_bytes / 1048576.0, w->kv_block_bytes,
                     budget / 1048576.0, blocks, why,
                     l->kv_util > 0 ? ": raise --gpu-memory-utilization or lower --max-model-len"
                                    : ": raise --kv-cache-memory-bytes or lower --max-model-len");
  w->kv_capacity = (uint32_t)blocks;
  w->kv_pending = true;
  return 0;
}

/* Logs what the worker holds: weights, activations, KV cache. */
static void worker__log_memory(const worker_t *w, int kv_blocks, int block_size, size_t block_bytes) {
  const char *dt = w->kv_dtype == KERN_KV_AUTO ? kern_type_traits(w->be->kv_type)->name : kern_kv_dtype_name(w->kv_dtype);
  FR_LOGI("memory: weights %.1f MiB, activations %.1f MiB, KV cache %.1f MiB (%d blocks of %d tokens: %lld tokens "
          "of %s K/V)",
          w->weight_bytes / 1048576.0, w->act_bytes / 1048576.0, (double)kv_blocks * block_bytes / 1048576.0,
          kv_blocks, block_size, (long long)kv_blocks * block_size, dt);
}

/* ---- load ------------------------------------------------------------------------ */

/* Maps the control segment of a fixed KV pool (kv_blocks: what it must hold, 0 = any). */
static int worker__attach_control(worker_t *w, uint32_t kv_blocks) {
  if (w->remote) { /* no segment to map: its geometry came with the load */
    w->info = (kv_info_t){.n_blocks = (int)kv_blocks, .block_size = w->remote_block_size, .max_seqs = w->remote_max_seqs,
                          .max_blocks_per_seq = w->remote_max_blocks};
    return kv_blocks ? 0 : fr_errorf(FR_EPROTO, "a remote load needs a block count");
  }
  if (!w->args.instance) return fr_errorf(FR_EPROTO, "a worker started without --instance can only load remote");
  int rc = kv_control_attach(&w->ctl, w->args.instance);
  if (rc) return rc;
  kv_control_info(w->ctl, &w->info);
  if (kv_blocks && (uint32_t)w->info.n_blocks != kv_blocks)
    return fr_errorf(FR_ESTATE, "the KV control segment holds %d blocks, expected %u", w->info.n_blocks, kv_blocks);
  return 0;
}

/* FERRUM_SPEC_FORCE_ACCEPT, a probability in [0, 1] (random weights accept
 * nothing, so speculation's benchmarks force it); -1 when unset or not one. */
static float worker__force_accept(void) {
  const char *v = getenv("FERRUM_SPEC_FORCE_ACCEPT");
  if (!v || !*v) return -1.0f;
  char *end;
  float p = strtof(v, &end);
  if (*end || !(p >= 0.0f && p <= 1.0f)) {
    FR_LOGW("FERRUM_SPEC_FORCE_ACCEPT=%s is not a probability in [0, 1]: ignored", v);
    return -1.0f;
  }
  FR_LOGW("FERRUM_SPEC_FORCE_ACCEPT=%g: proposals are accepted at random, outputs are not the model's", p);
  return p;
}

static int worker__model(worker_t *w, const proto_load_t *l, const worker_load_opts_t *o) {
  model_load_opts_t mo = {.max_tokens = (int)o->max_tokens, .max_seqs = (int)o->max_seqs,
                         .progress = w->args.rank == 0, /* one rank logs the weights' progress */
                         .tp_rank = w->args.rank, .tp_size = w->args.world_size, .pooling = o->pooling,
                         .fp8_weights = o->fp8};
  int rc;
  if (!strcmp(l->format, "dummy")) { /* random weights of the config's shapes */
    model_config_t cfg;
    if ((rc = model_dummy_config(l->path, &cfg)) || (rc = model_dummy_weights_of(&mo, l->path))) return rc;
    mo.seed = 1;
    rc = model_load_dummy(&w->m, &cfg, w->be, &mo);
  } else {
    rc = model_load(&w->m, l->path, w->be, &mo);
  }
  if (rc) return rc;
  w->fake_forward = o->fake_forward;
  w->force_accept = worker__force_accept();
  w->max_tokens = w->m->max_tokens;
  w->max_seqs = w->m->max_seqs;
  w->vocab = w->m->cfg.vocab_size;
  w->weight_bytes = worker__weight_bytes(w->m);
  w->act_bytes = w->m->scratch_bytes;
  return 0;
}

/* Tensor parallel: joins the group with the other ranks (they load at the
 * same time; the join waits for all of them). */
static int worker__comm(worker_t *w, const worker_load_opts_t *o) {
  if (w->args.world_size < 2 || o->fake_forward) return 0;
  if (!w->be->ops->comm_init || !w->be->ops->all_reduce)
    return fr_errorf(FR_EUNSUPPORTED, "the %s backend has no tensor parallelism", w->be->ops->name);
  if (!o->comm) return fr_errorf(FR_EPROTO, "tensor parallel size %d, but the load names no group (option comm)",
                                 w->args.world_size);
  const model_shard_t *s = &w->m->shard;
  if (s->split_vocab && !w->be->ops->gather_cols)
    return fr_errorf(FR_EUNSUPPORTED, "the %s backend cannot gather logits", w->be->ops->name);
  kern_comm_t cm = {.rank = w->args.rank, .size = w->args.world_size, .id = o->comm,
                    .max_elems = (size_t)w->m->max_tokens * (size_t)w->m->cfg.dim,
                    .max_gather = s->split_vocab ? (size_t)w->m->max_seqs * (size_t)s->n_vocab : 0,
                    .multi_host = o->multi_host};
  int rc = w->be->ops->comm_init(w->be->ctx, &cm);
  if (rc) return fr_errorf(rc, "tensor parallel rank %d of %d: %s", cm.rank, cm.size, fr_last_error());
  char experts[64] = "";
  if (w->m->full_cfg.n_experts)
    snprintf(experts, sizeof experts, ", each expert's FFN %d..%d", s->exp0, s->exp0 + s->exp_dim - 1);
  FR_LOGI("tensor parallel rank %d of %d: heads %d..%d, KV heads %d..%d, FFN %d..%d%s, vocabulary %d..%d", s->rank,
          s->size, s->head0, s->head0 + s->n_heads - 1, s->kv0, s->kv0 + s->n_kv_heads - 1, s->ffn0,
          s->ffn0 + s->ffn_dim - 1, experts, s->vocab0, s->vocab0 + s->n_vocab - 1);
  return 0;
}

/* With the control segment mapped: KV pool, logits segment, step scratch. */
static int worker__finish(worker_t *w) {
  int rc = worker__pool(w);
  if (!rc) rc = worker__logits_seg(w);
  if (rc) return rc;
  worker__scratch(w);
  worker__draft_scratch(w);
  w->loaded = true;
  kern_kv_config_t kc = worker__kv_config(w, w->info.block_size, 1);
  worker__log_memory(w, w->info.n_blocks, w->info.block_size,
                     kern_kv_block_bytes(&kc) + worker__draft_block_bytes(w, w->info.block_size));
  return 0;
}

int worker_load(worker_t *w, const proto_load_t *l) {
  worker_load_opts_t o;
  int rc = worker__parse_opts(l, &o);
  if (rc) return rc;
  if (w->loaded || w->m) return fr_errorf(FR_ESTATE, "a model is already loaded");
  bool sizing = proto_load_sizes_kv(l);
  w->remote = o.remote;
  if (o.remote && w->args.device) o.device = w->args.device; /* its host's device, not the coordinator's guess */
  w->remote_block_size = (int)o.block_size;
  w->remote_max_blocks = (int)o.max_blocks;
  w->remote_max_seqs = (int)o.max_seqs;
  if (!sizing && (rc = worker__attach_control(w, l->kv_blocks))) goto fail;
  if ((rc = kern_backend_create(&w->be, o.device, (int)o.threads))) goto fail;
  if ((rc = worker__kv_dtype(w, o.kv_dtype))) goto fail;
  size_t used_load, total;
  if ((rc = worker__model(w, l, &o))) goto fail;
  if (o.draft && (rc = worker__draft_load(w, o.draft, !strcmp(l->format, "dummy"), w->max_tokens, w->max_seqs))) goto fail;
  if ((rc = worker__comm(w, &o))) goto fail;
  if ((rc = worker__mem_used(w, &used_load, &total))) goto fail;
  if (sizing) rc = worker__kv_size(w, l, used_load, &w->act_bytes);
  else rc = worker__finish(w);
  if (rc) goto fail;
  return 0;
fail:;
  char msg[512]; /* unloading may record messages of its own */
  snprintf(msg, sizeof msg, "%s", fr_last_error());
  worker_unload(w);
  return fr_errorf(rc, "%s", msg);
}

int worker_kv_init(worker_t *w, uint32_t n_blocks) {
  if (!w->kv_pending) return fr_errorf(FR_ESTATE, "kv_init: no load that sizes the KV pool is waiting for it");
  int rc = 0;
  if (n_blocks < 1 || n_blocks > w->kv_capacity)
    rc = fr_errorf(FR_EPROTO, "kv_init: %u KV blocks, this worker holds 1 to %u", n_blocks, w->kv_capacity);
  if (!rc) rc = worker__attach_control(w, n_blocks);
  if (!rc && w->info.block_size != w->kv_block_size)
    rc = fr_errorf(FR_ESTATE, "the KV control segment has blocks of %d tokens, the load said %d", w->info.block_size,
                   w->kv_block_size);
  if (!rc) rc = worker__finish(w);
  if (rc) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", fr_last_error());
    worker_unload(w);
    return fr_errorf(rc, "%s", msg);
  }
  w->kv_pending = false;
  return 0;
}

void worker_unload(worker_t *w) {
  if (w->loaded) {
    model_sampler_deinit(&w->smp);
    for (int i = 0; i < w->info.max_seqs; i++) free(w->hist[i].tok), free(w->hist[i].bias), free(w->hist[i].ban);
  }
  free(w->tokens), free(w->pos), free(w->slots), free(w->q_start), free(w->ctx_len);
  free(w->tables), free(w->copy_pairs), free(w->logits), free(w->raw), free(w->ritems), free(w->ok_items);
  free(w->tops), free(w->top_ids), free(w->top_lp), free(w->hist), free(w->rtab), free(w->rlen);
  free(w->rows), free(w->xtok), free(w->xlp), free(w->xtop);
  free(w->plp), free(w->plp_rank), free(w->plp_top);
  w->rows = w->xtok = NULL, w->xlp = NULL, w->xtop = NULL;
  w->plp = NULL, w->plp_rank = NULL, w->plp_top = NULL;
  w->rtab = w->rlen = NULL;
  w->tokens = w->pos = w->slots = w->q_start = w->ctx_len = w->tables = w->copy_pairs = w->top_ids = NULL;
  w->logits = w->raw = w->top_lp = NULL;
  w->ritems = NULL;
  w->ok_items = NULL;
  w->tops = NULL;
  w->hist = NULL;
  if (w->be && w->pool.base && !w->pool.external) w->be->ops->kv_pool_deinit(w->be->ctx, &w->pool);
  worker__draft_free(w);
  model_destroy(w->m);
  w->m = NULL;
  kern_backend_destroy(w->be);
  w->be = NULL;
  kv_segment_detach(&w->pool_seg);
  kv_segment_detach(&w->logits_seg);
  memset(&w->pool, 0, sizeof w->pool);
  kv_control_destroy(w->ctl);
  w->ctl = NULL;
  w->loaded = false;
  w->kv_pending = false;
  w->kv_capacity = 0;
}
