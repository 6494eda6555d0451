/* cpu_backend.c - the CPU backend: creation and ISA choice, memory, weights,
 * the KV pool, step metadata and the ops table. Ops live in cpu_matmul.c,
 * cpu_ops.c, cpu_attn.c and cpu_moe.c. */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "common/fr_err.h"
#include "common/fr_log.h"
#include "common/fr_util.h"
#include "kernels/cpu/cpu.h"

void cpu__scratch_reserve(void **buf, size_t *cap, size_t bytes) {
  if (bytes <= *cap) return;
  size_t n = bytes + bytes / 4 + 256;
  fr_free_aligned(*buf);
  *buf = fr_malloc_aligned(n);
  *cap = n;
}

/* ---- ISA choice ---- */

#if defined(__x86_64__)
/* F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does
 * not know "f16c". */
static bool cpu__has_f16c(void) {
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}
#endif

static bool cpu__isa_ok(const char *name) {
  if (!strcmp(name, "scalar")) return true;
#if defined(__x86_64__)
  __builtin_cpu_init();
  bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu__has_f16c();
  if (!strcmp(name, "avx2")) return avx2;
  bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  if (!strcmp(name, "avx512")) return avx512;
  if (!strcmp(name, "avx512vnni")) return avx512 && __builtin_cpu_supports("avx512vnni");
#endif
  return false;
}

static const cpu_isa_t *cpu__isa_by_name(const char *name) {
  if (!strcmp(name, "scalar")) return &cpu_isa_scalar;
#if defined(__x86_64__)
  if (!strcmp(name, "avx2")) return &cpu_isa_avx2;
  if (!strcmp(name, "avx512")) return &cpu_isa_avx512;
  if (!strcmp(name, "avx512vnni")) return &cpu_isa_avx512vnni;
#endif
  return NULL;
}

bool kern_cpu_isa_supported(const char *name) { return name && cpu__isa_by_name(name) && cpu__isa_ok(name); }

/* FERRUM_CPU_ISA forces a path; otherwise the best one this CPU runs. */
static int cpu__choose_isa(const cpu_isa_t **out) {
  const char *env = getenv("FERRUM_CPU_ISA");
  if (env && *env && strcmp(env, "auto") != 0) {
    if (!cpu__isa_by_name(env))
      return fr_errorf(FR_EUNSUPPORTED, "FERRUM_CPU_ISA=%s: unknown path (scalar, avx2, avx512, avx512vnni)", env);
    if (!cpu__isa_ok(env)) return fr_errorf(FR_EUNSUPPORTED, "FERRUM_CPU_ISA=%s: this CPU does not support it", env);
    *out = cpu__isa_by_name(env);
    return 0;
  }
  static const char *const order[] = {"avx512vnni", "avx512", "avx2", "scalar"};
  for (size_t i = 0; i < FR_ARRAY_SIZE(order); i++)
    if (kern_cpu_isa_supported(order[i])) {
      *out = cpu__isa_by_name(order[i]);
      return 0;
    }
  return fr_errorf(FR_EUNSUPPORTED, "no CPU kernel path");
}

void kern_cpu_expf_shift(int n, const float *x, float m, float t, float *y) {
  static _Atomic(const cpu_isa_t *) table; /* chosen once; a race picks the same table twice */
  const cpu_isa_t *isa = atomic_load_explicit(&table, memory_order_acquire);
  if (!isa) {
    if (cpu__choose_isa(&isa)) isa = &cpu_isa_scalar; /* a bad FERRUM_CPU_ISA: kern_cpu_create reports it */
    atomic_store_explicit(&table, isa, memory_order_release);
  }
  isa->exp_shift(n, x, m, t, y);
}

static const kern_ops_t cpu__ops; /* below: the vtable of the functions in between */

const char *kern_cpu_isa(const kern_backend_t *b) {
  if (!b || b->ops != &cpu__ops) return NULL;
  return ((const cpu_ctx_t *)b->ctx)->isa->name;
}

/* ---- memory ---- */

static int cpu__alloc(void *vctx, size_t bytes, void **out) {
  void *p = NULL;
  if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0)
    return fr_errorf(FR_EDEVOOM, "cpu backend: cannot allocate %zu bytes", bytes);
  *out = p;
  return 0;
}

static void cpu__free(void *vctx, void *p) { free(p); }

static int cpu__memcpy(void *vctx, void *dst, const void *src, size_t bytes) {
  if (bytes) memmove(dst, src, bytes);
  return 0;
}

static int cpu__sync(void *vctx) { return 0; }

/* ---- weights ---- */

typedef struct {
  const kern_weight_t *w;
  void *dst;
  long panels;
} cpu_pack_job_t;

static void cpu__pack_part(void *arg, int ith, int nth) {
  const cpu_pack_job_t *job = arg;
  long lo, hi;
  fr_pool_split(job->panels, ith, nth, &lo, &hi);
  for (long i = lo; i < hi; i++) cpu__panel_pack(job->w, job->w->data, i, job->dst);
}

/* A weight only matmul reads, of a type the table has a panel kernel for and
 * whole panels of rows, is packed into panels (w->priv) by the pool's
 * threads; w->data still points at its rows. */
static int cpu__weight_pack(cpu_ctx_t *ctx, kern_weight_t *w) {
  if (!ctx->panels || w->keep_layout || !ctx->isa->panel_gemm[w->type] || w->rows % CPU_PANEL_ROWS) return 0;
  cpu_pack_job_t job = {.w = w, .panels = (long)(w->rows / CPU_PANEL_ROWS)};
  const size_t nb = (size_t)(w->cols / kern_type_traits(w->type)->blck);
  const size_t bytes = (size_t)job.panels * nb * cpu_panel_block_bytes(w->type);
  if (posix_memalign(&job.dst, 64, bytes))
    return fr_errorf(-ENOMEM, "cpu backend: no memory for the panels of a %lld x %lld weight (%zu bytes; "
                     "FERRUM_CPU_PANELS=0 keeps weights in the file's rows)", (long long)w->rows, (long long)w->cols,
                     bytes);
  if (ctx->n_threads == 1 || job.panels < 2) cpu__pack_part(&job, 0, 1);
  else fr_pool_run(ctx->pool, cpu__pack_part, &job);
  w->priv = job.dst;
  return 0;
}

static int cpu__weight_load(void *vctx, kern_weight_t *w, const void *host_data) {
  cpu_ctx_t *ctx = vctx;
  if (w->rows <= 0 || w->cols <= 0 || !kern_type_traits(w->type))
    return fr_errorf(-EINVAL, "cpu backend: bad weight (type %d, %lld x %lld)", (int)w->type, (long long)w->rows,
                     (long long)w->cols);
  size_t rb = kern_row_bytes(w->type, w->cols);
  if (rb == 0 || rb != w->row_bytes)
    return fr_errorf(FR_EFORMAT, "cpu backend: weight row of %lld %s elements is not %zu bytes", (long long)w->cols,
                     kern_type_traits(w->type)->name, w->row_bytes);
  if (kern_type_traits(w->type)->quantized && !ctx->isa->vec_dot[w->type])
    return fr_errorf(FR_EUNSUPPORTED, "cpu backend: weight type %s", kern_type_traits(w->type)->name);
  if (w->fp8) return fr_errorf(FR_EUNSUPPORTED, "cpu backend: FP8 weights (--quantization fp8 needs a CUDA device)");
  w->data = (void *)host_data; /* borrowed: the caller keeps it mapped */
  w->priv = NULL;
  return cpu__weight_pack(ctx, w);
}

static void cpu__weight_release(void *vctx, kern_weight_t *w) {
  free(w->priv); /* panels (posix_memalign), or NULL */
  w->data = NULL;
  w->priv = NULL;
}

static bool cpu__supports_type(void *vctx, kern_type_t type) {
  cpu_ctx_t *ctx = vctx;
  return type >= 0 && type < KERN_TYPE_MAX && ctx->isa->vec_dot[type] != NULL;
}

/* ---- KV pool ---- */

static int cpu__kv_pool_init(void *vctx, kern_kv_pool_t *pool, const kern_kv_config_t *cfg, void *external) {
  memset(pool, 0, sizeof *pool);
  if (cfg->dtype == KERN_KV_AUTO && cfg->type != KERN_F32 && cfg->type != KERN_F16)
    return fr_errorf(FR_EUNSUPPORTED, "cpu backend: KV type must be F32 or F16 (or an int8 / fp8 cache)");
  size_t bytes = kern_kv_pool_bytes(cfg);
  if (bytes == 0) return fr_errorf(-EINVAL, "cpu backend: bad or oversized KV pool config");
  void *base = external;
  if (!base) {
    int rc = cpu__alloc(vctx, bytes, &base);
    if (rc) return rc;
  }
  kern_kv_pool_layout(pool, cfg, base, external != NULL);
  memset(pool->base, 0, bytes);
  return 0;
}

static void cpu__kv_pool_deinit(void *vctx, kern_kv_pool_t *pool) {
  if (pool->base && !pool->external) free(pool->base);
  memset(pool, 0, sizeof *pool);
}

static int cpu__kv_copy_blocks(void *vctx, kern_kv_pool_t *pool, const int32_t *pairs, int n_pairs) {
  const kern_kv_config_t *c = &pool->cfg;
  const size_t block_bytes = pool->layer_bytes / (size_t)c->n_blocks, scale_block = pool->scale_bytes / (size_t)c->n_blocks;
  for (int i = 0; i < n_pairs; i++) {
    int32_t src = pairs[2 * i], dst = pairs[2 * i + 1];
    if (src < 0 || src >= c->n_blocks || dst < 0 || dst >= c->n_blocks)
      return fr_errorf(-EINVAL, "kv_copy_blocks: pair (%d, %d) outside %d blocks", src, dst, c->n_blocks);
    if (src == dst) continue;
    for (int l = 0; l < 2 * c->n_layers; l++) {
      uint8_t *base = kern_kv_pool_elems(pool, l / 2, l % 2);
      memcpy(base + (size_t)dst * block_bytes, base + (size_t)src * block_bytes, block_bytes);
      uint8_t *sc = (uint8_t *)kern_kv_pool_scales(pool, l / 2, l % 2);
      if (sc) memcpy(sc + (size_t)dst * scale_block, sc + (size_t)src * scale_block, scale_block);
    }
  }
  return 0;
}

/* ---- step metadata ---- */

/* Grows each of the arrays to hold n int32 (all share *cap). */
static void cpu__grow_i32(int32_t **arrays[], int n_arrays, size_t *cap, size_t n) {
  if (n <= *cap) return;
  size_t c = n + n / 2 + 16;
  for (int i = 0; i < n_arrays; i++) *arrays[i] = fr_realloc(*arrays[i], c * sizeof(int32_t));
  *cap = c;
}

static int cpu__step_check(const kern_step_t *s) {
  if (s->n_tokens < 0 || s->n_seqs < 0 || (s->n_seqs > 0 && s->max_blocks < 0))
    return fr_errorf(-EINVAL, "step_begin: bad counts (%d tokens, %d seqs)", s->n_tokens, s->n_seqs);
  if (s->n_seqs > 0 && (s->q_start[0] < 0 || s->q_start[s->n_seqs] > s->n_tokens))
    return fr_errorf(-EINVAL, "step_begin: q_start outside [0, %d]", s->n_tokens);
  for (int i = 0; i < s->n_seqs; i++) {
    int nq = s->q_start[i + 1] - s->q_start[i];
    if (nq < 0) return fr_errorf(-EINVAL, "step_begin: q_start is not monotonic at sequence %d", i);
    if (s->ctx_len[i] < 0 || (s->ctx_len[i] > 0 && s->ctx_len[i] < nq))
      return fr_errorf(-EINVAL, "step_begin: sequence %d has ctx_len %d < %d new tokens", i, s->ctx_len[i], nq);
    if (s->ctx_len[i] > 0 && s->max_blocks <= 0)
      return fr_errorf(-EINVAL, "step_begin: sequence %d has context but no block table", i);
  }
  return 0;
}

static int cpu__step_begin(void *vctx, const kern_step_t *s) {
  cpu_ctx_t *ctx = vctx;
  int rc = cpu__step_check(s);
  if (rc) return rc;
  size_t nt = (size_t)s->n_tokens, ns = (size_t)s->n_seqs;
  size_t nbt = ns * (size_t)(s->max_blocks > 0 ? s->max_blocks : 0);
  int32_t **tok_arrays[] = {&ctx->tokens, &ctx->positions, &ctx->slots, &ctx->tok_seq};
  int32_t **seq_arrays[] = {&ctx->q_start, &ctx->ctx_len};
  int32_t **bt_arrays[] = {&ctx->block_tables};
  cpu__grow_i32(tok_arrays, 4, &ctx->cap_tokens, nt);
  cpu__grow_i32(seq_arrays, 2, &ctx->cap_seqs, ns + 1);
  cpu__grow_i32(bt_arrays, 1, &ctx->cap_bt, nbt);
  ctx->step_id++;
  ctx->n_tokens = s->n_tokens;
  ctx->n_seqs = s->n_seqs;
  ctx->max_blocks = s->max_blocks;
  if (nt) {
    if (s->tokens) memcpy(ctx->tokens, s->tokens, nt * sizeof(int32_t));
    else for (size_t i = 0; i < nt; i++) ctx->tokens[i] = -1; /* embed rejects them */
    memcpy(ctx->positions, s->positions, nt * sizeof(int32_t));
    if (s->slots) memcpy(ctx->slots, s->slots, nt * sizeof(int32_t));
    else for (size_t i = 0; i < nt; i++) ctx->slots[i] = -1;
  }
  if (ns) {
    memcpy(ctx->q_start, s->q_start, (ns + 1) * sizeof(int32_t));
    memcpy(ctx->ctx_len, s->ctx_len, ns * sizeof(int32_t));
    if (nbt) memcpy(ctx->block_tables, s->block_tables, nbt * sizeof(int32_t));
  }
  for (size_t i = 0; i < nt; i++) ctx->tok_seq[i] = -1;
  for (int q = 0; q < s->n_seqs; q++)
    for (int t = s->q_start[q]; t < s->q_start[q + 1]; t++) ctx->tok_seq[t] = q;
  return 0;
}

static int cpu__to_f32_host(void *vctx, float *dst, const void *src, size_t n) {
  if (n) memmove(dst, src, n * sizeof(float));
  return 0;
}

static void cpu__destroy(void *vctx) {
  cpu_ctx_t *ctx = vctx;
  if (!ctx) return;
  cpu__comm_destroy(ctx);
  fr_pool_destroy(ctx->pool);
  free(ctx->tokens);
  free(ctx->positions);
  free(ctx->slots);
  free(ctx->tok_seq);
  free(ctx->q_start);
  free(ctx->ctx_len);
  free(ctx->block_tables);
  fr_free_aligned(ctx->qbuf);
  fr_free_aligned(ctx->pbuf);
  fr_free_aligned(ctx->amx_buf);
  fr_free_aligned(ctx->rope_cs);
  fr_free_aligned(ctx->att_scratch);
  fr_free_aligned(ctx->moe_buf);
  free(ctx);
}

static const kern_ops_t cpu__ops = {
    .name = "cpu",
    .destroy = cpu__destroy,
    .alloc = cpu__alloc,
    .free = cpu__free,
    .upload = cpu__memcpy,
    .download = cpu__memcpy,
    .copy = cpu__memcpy,
    .sync = cpu__sync,
    .weight_load = cpu__weight_load,
    .weight_release = cpu__weight_release,
    .supports_type = cpu__supports_type,
    .kv_pool_init = cpu__kv_pool_init,
    .kv_pool_deinit = cpu__kv_pool_deinit,
    .kv_copy_blocks = cpu__kv_copy_blocks,
    .step_begin = cpu__step_begin,
    .embed = cpu__embed,
    .matmul = cpu__matmul,
    .rms_norm = cpu__rms_norm,
    .add_rms_norm = cpu__add_rms_norm,
    .rope = cpu__rope,
    .kv_append = cpu__kv_append,
    .attention = cpu__attention,
    .silu_mul = cpu__silu_mul,
    .moe_ffn = cpu__moe_ffn,
    .add = cpu__add,
    .last_rows = cpu__last_rows,
    .pool_rows = cpu__pool_rows,
    .layer_norm = cpu__layer_norm,
    .gelu = cpu__gelu,
    .attention_full = cpu__attention_full,
    .to_f32_host = cpu__to_f32_host,
    .sample = NULL,
    .graph_begin = NULL,
    .graph_end = NULL,
    .comm_init = cpu__comm_init,
    .all_reduce = cpu__all_reduce,
    .gather_cols = cpu__gather_cols,
};

/* AMX rides on the best x86 path only, so that FERRUM_CPU_ISA picks what
 * every matmul runs. */
static bool cpu__amx_available(const cpu_isa_t *isa) {
#if defined(__x86_64__)
  return isa == &cpu_isa_avx512vnni && cpu__amx_usable();
#else
  (void)isa;
  return false;
#endif
}

int kern_cpu_create(kern_backend_t **out, int n_threads) {
  *out = NULL;
  const cpu_isa_t *isa = NULL;
  int rc = cpu__choose_isa(&isa);
  if (rc) return rc;
  cpu_ctx_t *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return -ENOMEM;
  if ((rc = fr_pool_create(&ctx->pool, n_threads)) != 0) {
    free(ctx);
    return rc;
  }
  ctx->n_threads = fr_pool_size(ctx->pool);
  ctx->isa = isa;
  const char *pf = getenv("FERRUM_CPU_PREFETCH"); /* bytes, clamped to [0, 1 MiB] as the CUDA knobs are */
  ctx->prefetch = pf && *pf ? (size_t)FR_MAX(FR_MIN(atol(pf), 1L << 20), 0L) : CPU_PREFETCH;
  const char *pn = getenv("FERRUM_CPU_PANELS"); /* 0: every weight stays in rows */
  ctx->panels = !(pn && !strcmp(pn, "0"));
  const char *am = getenv("FERRUM_CPU_AMX_ROWS"); /* fewest activation rows a matmul takes AMX for; 0: never */
  ctx->amx_rows = am && *am ? (int)FR_MAX(FR_MIN(atol(am), 1L << 20), 0L) : CPU_AMX_ROWS;
  if (!cpu__amx_available(isa)) ctx->amx_rows = 0;
  ctx->be.ops = &cpu__ops;
  ctx->be.ctx = ctx;
  ctx->be.act_type = KERN_F32;
  ctx->be.act_size = sizeof(float);
  ctx->be.kv_type = KERN_F16;
  ctx->be.kv_dtypes = 1u << KERN_KV_AUTO | 1u << KERN_KV_INT8 | 1u << KERN_KV_FP8;
  ctx->be.host_memory = true;
  ctx->be.padded_perm = true;
  FR_LOGD("cpu backend: %d threads, %s kernels, AMX %s", ctx->n_threads, isa->name,
          ctx->amx_rows ? "on" : "off");
  *out = &ctx->be;
  return 0;
}
