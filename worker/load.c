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
  long threads, max_tokens, max_seqs;
  bool fake_forward;
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
    else FR_LOGW("unknown load option %s ignored", k);
    if (rc) return rc;
  }
  return 0;
}

static int worker__backend(worker_t *w, const worker_load_opts_t *o) {
  if (!strcmp(o->device, "cpu")) return kern_cpu_create(&w->be, (int)o->threads);
  if (!strncmp(o->device, "cuda", 4)) {
    int dev = o->device[4] == ':' ? atoi(o->device + 5) : 0;
    return kern_cuda_create(&w->be, dev);
  }
  return fr_errorf(-EINVAL, "unknown device '%s' (cpu or cuda[:N])", o->device);
}

/* A device backend's pool lives in device memory (lost with the worker;
 * the coordinator recomputes). */
static int worker__device_pool(worker_t *w) {
  kern_kv_config_t kc = model_kv_config(w->m, w->info.block_size, w->info.n_blocks, w->be->act_type);
  return w->be->ops->kv_pool_init(w->be->ctx, &w->pool, &kc, NULL);
}

/* Maps (or creates) the KV pool segment and adopts it without zeroing, so
 * prefix-cached blocks written before a restart stay valid. */
static int worker__pool(worker_t *w) {
  if (strcmp(w->be->ops->name, "cpu") != 0) return worker__device_pool(w);
  kern_kv_config_t kc = model_kv_config(w->m, w->info.block_size, w->info.n_blocks, KERN_F16);
  size_t bytes = kern_kv_pool_bytes(&kc);
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
  w->pool.cfg = kc;
  w->pool.layer_bytes = bytes / (2 * (size_t)kc.n_layers);
  w->pool.base = kv_segment_data(&w->pool_seg);
  w->pool.external = true;
  return 0;
}

static int worker__logits_seg(worker_t *w) {
  if (w->args.rank != 0) return 0;
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
  size_t T = (size_t)w->max_tokens, S = (size_t)w->max_seqs, V = (size_t)w->vocab;
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
  w->tops = fr_calloc(S * PROTO_MAX_TOPN, sizeof(proto_toplp_t));
  w->top_ids = fr_malloc(PROTO_MAX_TOPN * sizeof(int32_t));
  w->top_lp = fr_malloc(PROTO_MAX_TOPN * sizeof(float));
  w->hist = fr_calloc((size_t)w->info.max_seqs, sizeof(worker_hist_t));
  model_sampler_init(&w->smp, w->vocab);
}

int worker_load(worker_t *w, const proto_load_t *l) {
  worker_load_opts_t o;
  int rc = worker__parse_opts(l, &o);
  if (rc) return rc;
  if (w->loaded) return fr_errorf(FR_ESTATE, "a model is already loaded");
  if ((rc = kv_control_attach(&w->ctl, w->args.instance))) goto fail;
  kv_control_info(w->ctl, &w->info);
  if ((rc = worker__backend(w, &o))) goto fail;
  model_load_opts_t mo = {.max_tokens = (int)o.max_tokens, .max_seqs = (int)o.max_seqs,
                         .progress = w->args.rank == 0}; /* one rank logs the weights' progress */
  if (!strcmp(l->format, "dummy")) { /* random weights of the config's shapes */
    model_config_t cfg;
    if ((rc = model_dummy_config(l->path, &cfg))) goto fail;
    mo.seed = 1;
    if ((rc = model_load_dummy(&w->m, &cfg, w->be, &mo))) goto fail;
  } else if ((rc = model_load(&w->m, l->path, w->be, &mo))) {
    goto fail;
  }
  w->fake_forward = o.fake_forward;
  w->max_tokens = w->m->max_tokens;
  w->max_seqs = w->m->max_seqs;
  w->vocab = w->m->cfg.vocab_size;
  if ((rc = worker__pool(w))) goto fail;
  if ((rc = worker__logits_seg(w))) goto fail;
  worker__scratch(w);
  w->loaded = true;
  return 0;
fail:
  rc = fr_errorf(rc, "%s", fr_last_error());
  worker_unload(w);
  return rc;
}

void worker_unload(worker_t *w) {
  if (w->loaded) {
    model_sampler_deinit(&w->smp);
    for (int i = 0; i < w->info.max_seqs; i++) free(w->hist[i].tok);
  }
  free(w->tokens), free(w->pos), free(w->slots), free(w->q_start), free(w->ctx_len);
  free(w->tables), free(w->copy_pairs), free(w->logits), free(w->raw), free(w->ritems);
  free(w->tops), free(w->top_ids), free(w->top_lp), free(w->hist);
  w->tokens = w->pos = w->slots = w->q_start = w->ctx_len = w->tables = w->copy_pairs = w->top_ids = NULL;
  w->logits = w->raw = w->top_lp = NULL;
  w->ritems = NULL;
  w->tops = NULL;
  w->hist = NULL;
  if (w->be && w->pool.base && !w->pool.external) w->be->ops->kv_pool_deinit(w->be->ctx, &w->pool);
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
}
