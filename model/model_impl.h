/* model_impl.h - internal helpers shared by model_load.c and dummy.c. */
#pragma once

#include "model/model.h"

model_t *model__new(kern_backend_t *be, const model_load_opts_t *opts);
int model__check_config(const model_config_t *c);
/* FR_EUNSUPPORTED with a message when the backend lacks an op the config
 * needs (moe_ffn for mixture-of-experts models). */
int model__check_backend(const model_t *m);
/* Loads the whole tensor name (rows, cols) as w, in its own layout
 * (kern_weight_t.keep_layout: embedding tables, routers); absent: an error
 * when required, else w stays empty. */
int model__load_weight(model_t *m, kern_weight_t *w, const char *name, bool required, int64_t rows, int64_t cols);
/* Loads the vector name of n elements as F32 (converted from F16/BF16). */
int model__load_f32_vector(model_t *m, kern_weight_t *w, const char *name, bool required, int64_t n);
/* Hands w back to the backend and empties it (an empty w is fine). */
void model__release_weight(model_t *m, kern_weight_t *w);
/* Keeps a host buffer (malloc'd) alive until model_destroy. */
void model__keep(model_t *m, void *p);
int model__init_rope(model_t *m);
int model__alloc_scratch(model_t *m);
/* Tensor parallel: keeps the file's config in m->full_cfg and plans this
 * rank's shard (opts' tp_rank / tp_size) in m->shard. */
int model__plan_shard(model_t *m, const model_load_opts_t *opts, int ffn_unit);
/* Makes m->cfg the shard's shapes (heads, KV heads, FFN). */
void model__use_shard(model_t *m);

/* Weight-load progress: bytes handed to the backend against the total the
 * loader expects. m->progress points at it between model__load_begin and
 * model__load_end. */
typedef struct model_progress {
  uint64_t total, done; /* bytes */
  uint64_t t0, t_last;  /* fr_now_ns() at the start and at the last line logged */
  int pct_last;         /* percentage on the last line logged */
  bool log;             /* log lines (info level); counting happens anyway */
  int fp8_kept;         /* an FP8 checkpoint's weights handed over as they are (KERN_F8R, KERN_F8B) */
  int fp8_decoded;      /* and those decoded into BF16 */
} model_progress_t;

/* Starts counting towards total bytes (0: unknown) into p (borrowed until
 * model__load_end). */
void model__load_begin(model_t *m, model_progress_t *p, uint64_t total, bool log);
/* Hands a weight to the backend (ops->weight_load), counts its bytes and
 * logs progress when due. On failure the error names the weight. */
int model__weight_load(model_t *m, kern_weight_t *w, const void *host_data, const char *name);
/* The same from spans of the source's files (ops->weight_load_file), for
 * backends that read the files themselves (model__file_reads). */
int model__weight_load_file(model_t *m, kern_weight_t *w, const kern_file_span_t *spans, int n_spans,
                            const char *name);
/* Ends the load: the backend's load_end (copies finished, staging freed)
 * and a final line with bytes, seconds and GiB/s. Returns load_end's error. */
int model__load_end(model_t *m);
