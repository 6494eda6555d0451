/* dummy.c - random weights of a config's shapes (vLLM's --load-format
 * dummy), for benchmarks of models too large to ship, and the built-in
 * configs of well-known models. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "common/fr_err.h"
#include "common/fr_hash.h"
#include "common/fr_log.h"
#include "common/fr_util.h"
#include "model/dummy.h"
#include "model/model_impl.h"
#include "model/quant.h"
#include "model/rope.h"

static const struct {
  const char *name;
  model_config_t cfg;
} model__builtin[] = {
    {"llama-3-8b",
     {.arch = MODEL_ARCH_LLAMA, .arch_name = "llama", .name = "llama-3-8b", .n_layers = 32, .dim = 4096,
      .ffn_dim = 14336, .n_heads = 32, .n_kv_heads = 8, .head_dim = 128, .vocab_size = 128256, .max_ctx = 8192,
      .norm_eps = 1e-5f, .rope_theta = 500000.0f, .rope_dim = 128, .rope_scaling = MODEL_ROPE_SCALING_LLAMA3,
      .rope_factor = 8.0f, .rope_low_freq_factor = 1.0f, .rope_high_freq_factor = 4.0f, .rope_orig_ctx = 8192}},
    {"llama-3-70b",
     {.arch = MODEL_ARCH_LLAMA, .arch_name = "llama", .name = "llama-3-70b", .n_layers = 80, .dim = 8192,
      .ffn_dim = 28672, .n_heads = 64, .n_kv_heads = 8, .head_dim = 128, .vocab_size = 128256, .max_ctx = 8192,
      .norm_eps = 1e-5f, .rope_theta = 500000.0f, .rope_dim = 128, .rope_scaling = MODEL_ROPE_SCALING_LLAMA3,
      .rope_factor = 8.0f, .rope_low_freq_factor = 1.0f, .rope_high_freq_factor = 4.0f, .rope_orig_ctx = 8192}},
    {"qwen2.5-7b",
     {.arch = MODEL_ARCH_QWEN2, .arch_name = "qwen2", .name = "qwen2.5-7b", .n_layers = 28, .dim = 3584,
      .ffn_dim = 18944, .n_heads = 28, .n_kv_heads = 4, .head_dim = 128, .vocab_size = 152064, .max_ctx = 32768,
      .norm_eps = 1e-6f, .rope_theta = 1000000.0f, .rope_dim = 128, .attn_bias = true}},
    {"qwen3-8b",
     {.arch = MODEL_ARCH_QWEN3, .arch_name = "qwen3", .name = "qwen3-8b", .n_layers = 36, .dim = 4096,
      .ffn_dim = 12288, .n_heads = 32, .n_kv_heads = 8, .head_dim = 128, .vocab_size = 151936, .max_ctx = 40960,
      .norm_eps = 1e-6f, .rope_theta = 1000000.0f, .rope_dim = 128, .qk_norm = true}},
    {"qwen3-0.6b",
     {.arch = MODEL_ARCH_QWEN3, .arch_name = "qwen3", .name = "qwen3-0.6b", .n_layers = 28, .dim = 1024,
      .ffn_dim = 3072, .n_heads = 16, .n_kv_heads = 8, .head_dim = 128, .vocab_size = 151936, .max_ctx = 40960,
      .norm_eps = 1e-6f, .rope_theta = 1000000.0f, .rope_dim = 128, .qk_norm = true, .tied_embeddings = true}},
    {"qwen3-30b-a3b",
     {.arch = MODEL_ARCH_QWEN3MOE, .arch_name = "qwen3moe", .name = "qwen3-30b-a3b", .n_layers = 48, .dim = 2048,
      .ffn_dim = 6144, .n_heads = 32, .n_kv_heads = 4, .head_dim = 128, .vocab_size = 151936, .max_ctx = 40960,
      .norm_eps = 1e-6f, .rope_theta = 1000000.0f, .rope_dim = 128, .qk_norm = true, .n_experts = 128,
      .n_experts_used = 8, .expert_ffn_dim = 768, .norm_topk = true, .moe_step = 1}},
    {"smollm2-135m",
     {.arch = MODEL_ARCH_LLAMA, .arch_name = "llama", .name = "smollm2-135m", .n_layers = 30, .dim = 576,
      .ffn_dim = 1536, .n_heads = 9, .n_kv_heads = 3, .head_dim = 64, .vocab_size = 49152, .max_ctx = 8192,
      .norm_eps = 1e-5f, .rope_theta = 100000.0f, .rope_dim = 64, .tied_embeddings = true}},
};

int model_dummy_config(const char *name_or_path, model_config_t *cfg) {
  for (size_t i = 0; i < FR_ARRAY_SIZE(model__builtin); i++)
    if (!strcmp(name_or_path, model__builtin[i].name)) {
      *cfg = model__builtin[i].cfg;
      return 0;
    }
  if (strstr(name_or_path, ".json") || strchr(name_or_path, '/')) {
    char path[4096];
    const char *p = name_or_path;
    if (!strstr(name_or_path, ".json")) {
      snprintf(path, sizeof path, "%s/config.json", name_or_path);
      p = path;
    }
    return model_config_from_hf_json(cfg, p);
  }
  return fr_errorf(FR_ENOTFOUND,
                   "no built-in config '%s' (llama-3-8b, llama-3-70b, qwen2.5-7b, qwen3-8b, qwen3-0.6b, "
                   "qwen3-30b-a3b, smollm2-135m) and not a config.json path",
                   name_or_path);
}

/* One random buffer all weights of a type borrow from (distinct offsets):
 * enough for the largest tensor. Values: bf16/f16/f32 ~ U(-a, a); quantized
 * blocks with random payloads and small sane scales. */
typedef struct {
  uint8_t *bytes;
  size_t size;
  float target;  /* the values' spread */
  uint64_t seed; /* fill's */
} model__pool_t;

static void model__fill_random(uint8_t *p, size_t n, uint64_t seed) {
  uint64_t s = seed;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v = fr_mix64(s += 0x9e3779b97f4a7c15ull);
    memcpy(p + i, &v, 8);
  }
  for (; i < n; i++) p[i] = (uint8_t)fr_mix64(s += 0x9e3779b97f4a7c15ull);
}

/* A scale's factor in [0.75, 1.25) for run r of blocks: files' 32-column
 * blocks differ in scale, and a CUDA backend stores a weight whose (d, m)
 * repeat over 128 columns in a smaller layout (KERN_Q4G), so a dummy's
 * scales vary as a real file's do. */
static float model__jitter(size_t r) { return 0.75f + 0.5f * (float)(fr_mix64(r) >> 40) / (float)(1 << 24); }

/* Makes random bytes valid blocks of type t whose values have mean ~0 and
 * standard deviation ~target (so activations neither vanish nor blow up).
 * The 32-column types' scales vary by block, I4G's by group of `group`
 * columns (0: 128, GPTQ and AWQ's usual group size; -1: never, one group a
 * row; a dummy weight starts at a multiple of 8 blocks of the pool, so
 * groups of up to 256 columns stay whole). */
static void model__sanitize(uint8_t *p, size_t n, kern_type_t t, float target, int group) {
  const kern_type_traits_t *tr = kern_type_traits(t);
  size_t nb = n / (size_t)tr->size;
  /* per type: d from the spread of the quantized integers */
  float d = 0, dmin = 0;
  switch (t) {
  case KERN_Q4_0: case KERN_Q4_1: case KERN_I4G: d = target / 4.6f, dmin = -8 * d; break;
  case KERN_Q5_0: case KERN_Q5_1: d = target / 9.2f, dmin = -16 * d; break;
  case KERN_Q8_0: d = target / 73.9f; break;
  case KERN_Q4_K: d = target / (32 * 4.6f), dmin = 7.5f * d; break;
  case KERN_Q5_K: d = target / (32 * 9.2f), dmin = 15.5f * d; break;
  case KERN_Q6_K: d = target / (16 * 18.5f); break;
  default: break;
  }
  const float d0 = d, dmin0 = dmin;
  const bool vary = tr->blck == 32 && tr->quantized && !(t == KERN_I4G && group < 0);
  const size_t run = t == KERN_I4G ? (size_t)(group > 0 ? group : 128) / 32 : 1; /* blocks of one (d, m) */
  uint16_t hd = fr_fp32_to_fp16(d), hm = fr_fp32_to_fp16(dmin);
  for (size_t b = 0; b < nb; b++) {
    uint8_t *blk = p + b * (size_t)tr->size;
    if (vary) {
      const float f = model__jitter(b / run);
      d = d0 * f, dmin = dmin0 * f;
      hd = fr_fp32_to_fp16(d), hm = fr_fp32_to_fp16(dmin);
    }
    float v = (float)(int8_t)blk[0] / 74.0f * target; /* float types: one value per "block" */
    uint16_t h;
    switch (t) {
    case KERN_F32: memcpy(blk, &v, 4); break;
    case KERN_F16: h = fr_fp32_to_fp16(v), memcpy(blk, &h, 2); break;
    case KERN_BF16: h = fr_fp32_to_bf16(v), memcpy(blk, &h, 2); break;
    case KERN_Q4_1: case KERN_Q5_1: memcpy(blk, &hd, 2), memcpy(blk + 2, &hm, 2); break;
    case KERN_I4G: memcpy(blk, &d, 4), memcpy(blk + 4, &dmin, 4); break;
    case KERN_Q4_K: case KERN_Q5_K: memcpy(blk, &hd, 2), memcpy(blk + 2, &hm, 2); break;
    case KERN_Q6_K:
      memcpy(blk + 208, &hd, 2);
      for (int i = 0; i < 16; i++) blk[192 + i] = (uint8_t)(int8_t)(16 + (blk[192 + i] & 15)); /* 16..31 */
      break;
    default: memcpy(blk, &hd, 2); break; /* Q4_0, Q5_0, Q8_0: d first */
    }
  }
}

static void model__pool_make(model__pool_t *p, size_t size, kern_type_t t, float target, uint64_t seed, int group) {
  p->size = size;
  p->target = target;
  p->seed = seed;
  p->bytes = fr_malloc_aligned(size);
  model__fill_random(p->bytes, size, seed);
  model__sanitize(p->bytes, size, t, target, group);
}

/* A matmul weight as an FP8 checkpoint's (m->dummy_fp8: KERN_F8R, a scale
 * a row; KERN_F8B, 128 x 128 blocks) where the backend keeps one: random
 * E4M3 bytes of magnitude 0.5 to 3.75 (rms about 1.7), their scales
 * target / 1.7 with model__jitter's spread. Returns 1 when loaded; 0 when
 * the weight is not one (the caller makes it as usual); or an error. */
static int model__dummy_fp8(model_t *m, kern_weight_t *w, float target, int64_t rows, int64_t cols, uint64_t seed) {
  const kern_type_t f = m->dummy_fp8;
  if (!f || !m->be->fp8_weights || w == &m->output || cols % 16 || (f == KERN_F8B && (rows % 128 || cols % 128)))
    return 0;
  const size_t nb = (size_t)rows * (size_t)cols, ns = kern_f8_scale_bytes(f, rows, cols) / sizeof(float);
  uint8_t *buf = fr_malloc(nb + ns * sizeof(float));
  model__fill_random(buf, nb, seed);
  for (size_t i = 0; i < nb; i++) /* sign, exponent 6..8 (2^-1..2^1), mantissa */
    buf[i] = (uint8_t)((buf[i] & 0x87) | (6 + (buf[i] >> 3 & 15) % 3) << 3);
  float *s = (float *)(buf + nb);
  for (size_t i = 0; i < ns; i++) s[i] = target / 1.7f * model__jitter(seed + i);
  *w = (kern_weight_t){.type = f, .rows = rows, .cols = cols, .row_bytes = (size_t)cols, .fp8 = true};
  int rc = model__weight_load(m, w, buf, "a dummy FP8 weight");
  free(buf);
  if (rc == FR_EUNSUPPORTED) {
    FR_LOGD("%s; made as %s instead", fr_last_error(), kern_type_traits(m->be->act_type)->name);
    return 0;
  }
  return rc ? rc : 1;
}

static int model__dummy_weight(model_t *m, const model__pool_t *pool, kern_weight_t *w, bool keep_layout,
                               kern_type_t t, int64_t rows, int64_t cols, size_t *off) {
  memset(w, 0, sizeof *w);
  if (m->dummy_fp8 && !keep_layout && (t == KERN_F32 || t == KERN_F16 || t == KERN_BF16)) {
    *off += 4096; /* each weight's bytes and scales differ */
    int rc = model__dummy_fp8(m, w, pool->target, rows, cols, pool->seed + *off);
    if (rc) return rc < 0 ? rc : 0;
    memset(w, 0, sizeof *w);
  }
  w->type = t;
  w->rows = rows;
  w->cols = cols;
  w->row_bytes = kern_row_bytes(t, cols);
  w->keep_layout = keep_layout;
  if (!w->row_bytes) return fr_errorf(-EINVAL, "dummy weight: %lld columns do not fit type %s", (long long)cols,
                                      kern_type_traits(t)->name);
  size_t bytes = w->row_bytes * (size_t)rows;
  /* Start at a block boundary of the pool (blocks were made valid in place)
   * that is also 64-byte aligned: a multiple of lcm(block bytes, 64). */
  size_t bs = (size_t)kern_type_traits(t)->size, step = bs;
  while (step % 64) step += bs;
  if (bytes > pool->size) return fr_errorf(FR_ETOOBIG, "dummy weight of %zu bytes exceeds its pool", bytes);
  if (*off + bytes > pool->size) *off = 0;
  const uint8_t *src = pool->bytes + *off;
  *off = (*off + bytes / 3) / step * step; /* vary the data between weights */
  if (*off + bytes > pool->size) *off = 0;
  return model__weight_load(m, w, src, "a dummy weight");
}

static int model__dummy_vector(model_t *m, kern_weight_t *w, int64_t n, float base) {
  float *v = fr_malloc((size_t)n * sizeof(float));
  for (int64_t i = 0; i < n; i++) v[i] = base + 0.01f * (float)((int)(fr_mix64((uint64_t)i) & 255) - 128) / 128.0f;
  model__keep(m, v);
  *w = (kern_weight_t){.type = KERN_F32, .rows = 1, .cols = n, .row_bytes = (size_t)n * sizeof(float)};
  return model__weight_load(m, w, v, "a dummy vector");
}

/* A MoE layer: the router and every expert's gate, up and down. */
static int model__dummy_moe(model_t *m, const model__pool_t *pool, kern_type_t t, int il, size_t *off) {
  const model_config_t *c = &m->cfg;
  model_layer_t *L = &m->layers[il];
  const int64_t f = c->expert_ffn_dim;
  int rc = model__dummy_weight(m, pool, &L->router, true, t, c->n_experts, c->dim, off);
  L->exp_gate = fr_calloc((size_t)c->n_experts, sizeof *L->exp_gate);
  L->exp_up = fr_calloc((size_t)c->n_experts, sizeof *L->exp_up);
  L->exp_down = fr_calloc((size_t)c->n_experts, sizeof *L->exp_down);
  for (int e = 0; e < c->n_experts && !rc; e++) {
    rc = model__dummy_weight(m, pool, &L->exp_gate[e], true, t, f, c->dim, off);
    if (!rc) rc = model__dummy_weight(m, pool, &L->exp_up[e], true, t, f, c->dim, off);
    if (!rc) rc = model__dummy_weight(m, pool, &L->exp_down[e], true, t, c->dim, f, off);
  }
  return rc;
}

int model_dummy_weights(model_load_opts_t *opts, const char *name) {
  opts->dummy_q4_k_m = false, opts->dummy_head_type = (kern_type_t)0, opts->dummy_group = 0;
  opts->dummy_fp8 = (kern_type_t)0;
  if (!name || !*name) return 0;
  if (!strcasecmp(name, "q4_k_m")) { /* a mix, not a type */
    opts->dummy_type = KERN_Q4_K, opts->dummy_q4_k_m = true;
    return 0;
  }
  if (!strcasecmp(name, "gptq")) { /* I4G layers; GPTQ and AWQ checkpoints keep embed_tokens and lm_head in F16 */
    opts->dummy_type = KERN_I4G, opts->dummy_head_type = KERN_F16;
    return 0;
  }
  if (!strcasecmp(name, "fp8") || !strcasecmp(name, "fp8-block")) { /* the act type where FP8 is not kept */
    opts->dummy_fp8 = strcasecmp(name, "fp8") ? KERN_F8B : KERN_F8R;
    return 0;
  }
  const int t = kern_type_from_name(name);
  if (t < 0) return fr_errorf(FR_ENOTFOUND, "no weight type %s (q4_k, q4_k_m, gptq, q6_k, q8_0, bf16, ...)", name);
  opts->dummy_type = (kern_type_t)t;
  return 0;
}

int model_dummy_weights_of(model_load_opts_t *opts, const char *name_or_path) {
  for (size_t i = 0; i < FR_ARRAY_SIZE(model__builtin); i++) /* model_dummy_config's order: names first */
    if (!strcmp(name_or_path, model__builtin[i].name)) return 0;
  struct stat sb;
  if (stat(name_or_path, &sb)) return 0; /* nothing there: model_dummy_config says why */
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", name_or_path);
  if (!S_ISDIR(sb.st_mode)) { /* a config.json: its folder */
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    else snprintf(dir, sizeof dir, ".");
  }
  model_quant_t q;
  int rc = model_quant_read(&q, dir);
  if (rc || q.method == MODEL_QUANT_NONE) return rc;
  if (q.method == MODEL_QUANT_FP8) { /* the checkpoint's form where the backend keeps FP8, else the act type */
    const bool blk = q.fp8_block[0] == 128 && q.fp8_block[1] == 128;
    FR_LOGI("%s: an FP8 quantization config: dummy layer weights are FP8 (%s) where the backend keeps FP8", dir,
            blk ? "128 x 128 blocks" : "a scale a row");
    return model_dummy_weights(opts, blk ? "fp8-block" : "fp8");
  }
  rc = model_dummy_weights(opts, "gptq");
  opts->dummy_group = q.group_size;
  return rc;
}

/* llama.cpp's Q4_K_M (llama-quant.cpp, use_more_bits): attn_v and ffn_down
 * of these layers, and the output, are Q6_K; the rest Q4_K. */
static bool model__q4_k_m_layer(int il, int n) { return il < n / 8 || il >= 7 * n / 8 || (il - n / 8) % 3 == 2; }

/* The pools of a dummy load: pool for type t; q6 (Q4_K_M only) for Q6_K. */
typedef struct {
  model__pool_t pool, q6;
  size_t off, off6;
} model__pools_t;

static int model__dummy_layer(model_t *m, model__pools_t *p, kern_type_t t, int il) {
  const model_config_t *c = &m->cfg;
  model_layer_t *L = &m->layers[il];
  const int64_t qd = (int64_t)c->n_heads * c->head_dim, kvd = (int64_t)c->n_kv_heads * c->head_dim;
  const bool six = p->q6.bytes && model__q4_k_m_layer(il, c->n_layers);
  const model__pool_t *pool = &p->pool, *pool6 = six ? &p->q6 : &p->pool;
  size_t *off = &p->off, *off6 = six ? &p->off6 : &p->off;
  const kern_type_t t6 = six ? KERN_Q6_K : t;
  int rc = 0;
  if ((rc = model__dummy_vector(m, &L->attn_norm, c->dim, 1.0f))) return rc;
  if (c->qk_norm || t6 != t) { /* per-head norms need q and k apart (model.h); so do types that differ */
    if ((rc = model__dummy_weight(m, pool, &L->wq, false, t, qd, c->dim, off))) return rc;
    if ((rc = model__dummy_weight(m, pool, &L->wk, false, t, kvd, c->dim, off))) return rc;
    if ((rc = model__dummy_weight(m, pool6, &L->wv, false, t6, kvd, c->dim, off6))) return rc;
    if (c->qk_norm && (rc = model__dummy_vector(m, &L->q_norm, c->head_dim, 1.0f))) return rc;
    if (c->qk_norm && (rc = model__dummy_vector(m, &L->k_norm, c->head_dim, 1.0f))) return rc;
    if (c->attn_bias) {
      if ((rc = model__dummy_vector(m, &L->bq, qd, 0.0f))) return rc;
      if ((rc = model__dummy_vector(m, &L->bk, kvd, 0.0f))) return rc;
      if ((rc = model__dummy_vector(m, &L->bv, kvd, 0.0f))) return rc;
    }
  } else {
    if ((rc = model__dummy_weight(m, pool, &L->wqkv, false, t, qd + 2 * kvd, c->dim, off))) return rc;
    if (c->attn_bias && (rc = model__dummy_vector(m, &L->bqkv, qd + 2 * kvd, 0.0f))) return rc;
  }
  if ((rc = model__dummy_weight(m, pool, &L->wo, false, t, c->dim, qd, off))) return rc;
  if ((rc = model__dummy_vector(m, &L->ffn_norm, c->dim, 1.0f))) return rc;
  if (model_config_layer_moe(c, il)) return model__dummy_moe(m, pool, t, il, off);
  if ((rc = model__dummy_weight(m, pool, &L->w_gate_up, false, t, 2 * (int64_t)c->ffn_dim, c->dim, off))) return rc;
  return model__dummy_weight(m, pool6, &L->w_down, false, t6, c->dim, c->ffn_dim, off6);
}

/* Bytes model_load_dummy hands to the backend (the shapes of
 * model__dummy_layer and model_load_dummy), for its progress. */
static uint64_t model__dummy_bytes(const model_config_t *c, kern_type_t t, kern_type_t th) {
  const uint64_t qd = (uint64_t)c->n_heads * c->head_dim, kvd = (uint64_t)c->n_kv_heads * c->head_dim;
  uint64_t vec = 2 * (uint64_t)c->dim + (c->qk_norm ? 2 * (uint64_t)c->head_dim : 0) + (c->attn_bias ? qd + 2 * kvd : 0);
  uint64_t layer = (qd + 2 * kvd) * kern_row_bytes(t, c->dim) + (uint64_t)c->dim * kern_row_bytes(t, (int64_t)qd) +
                   2 * (uint64_t)c->ffn_dim * kern_row_bytes(t, c->dim) +
                   (uint64_t)c->dim * kern_row_bytes(t, c->ffn_dim) + vec * sizeof(float);
  uint64_t global = (c->tied_embeddings ? 1 : 2) * (uint64_t)c->vocab_size * kern_row_bytes(th, c->dim) +
                    (uint64_t)c->dim * sizeof(float) + (uint64_t)(c->rope_dim / 2) * sizeof(float);
  const uint64_t dense = 2 * (uint64_t)c->ffn_dim * kern_row_bytes(t, c->dim) + (uint64_t)c->dim * kern_row_bytes(t, c->ffn_dim);
  const uint64_t moe = (uint64_t)c->n_experts * (2 * (uint64_t)c->expert_ffn_dim * kern_row_bytes(t, c->dim) +
                                                 (uint64_t)c->dim * kern_row_bytes(t, c->expert_ffn_dim)) +
                       (uint64_t)c->n_experts * kern_row_bytes(t, c->dim);
  uint64_t total = global;
  for (int il = 0; il < c->n_layers; il++) total += layer - dense + (model_config_layer_moe(c, il) ? moe : dense);
  return total;
}

int model_load_dummy(model_t **out, const model_config_t *cfg, kern_backend_t *be, const model_load_opts_t *opts) {
  *out = NULL;
  model_t *m = model__new(be, opts);
  m->cfg = *cfg;
  if (m->cfg.rope_dim == 0) m->cfg.rope_dim = m->cfg.head_dim;
  m->rope.mode = KERN_ROPE_NEOX;
  kern_type_t t = opts && opts->dummy_type ? opts->dummy_type : be->act_type;
  int rc = model__check_config(&m->cfg);
  if (!rc && m->cfg.arch == MODEL_ARCH_BERT)
    rc = fr_errorf(FR_EUNSUPPORTED, "--load-format dummy makes decoder models; a BERT encoder needs its weights");
  if (!rc && opts && opts->dummy_q4_k_m && (t != KERN_Q4_K || m->cfg.n_experts))
    rc = fr_errorf(FR_EUNSUPPORTED, "the Q4_K_M dummy mix takes Q4_K weights and a dense (not MoE) config");
  if (!rc) rc = model__check_backend(m);
  if (!rc) rc = model__plan_shard(m, opts, kern_type_traits(t) ? kern_type_traits(t)->blck : 1);
  if (rc) goto fail;
  model__use_shard(m); /* random weights of this rank's shapes */
  /* Two pools: layer weights with spread 1/sqrt(dim), and the embedding /
   * output table with 4x that, so that logits have clear winners (greedy
   * comparisons between backends are then meaningful); the Q4_K_M mix has
   * a Q6_K pool of each kind too. */
  model__pools_t pools = {0};
  model__pool_t emb = {0}, emb6 = {0};
  const bool q4km = opts && opts->dummy_q4_k_m;
  /* the largest layer weight: fused gate/up (2*ffn, dim), fused qkv, or down */
  const int64_t qkv_rows = FR_MAX((int64_t)(m->cfg.n_heads + 2 * m->cfg.n_kv_heads) * m->cfg.head_dim,
                                  FR_MAX(m->cfg.n_experts, m->cfg.expert_ffn_dim)); /* and router / experts */
  size_t ffn = FR_MAX(kern_row_bytes(t, m->cfg.dim) * (size_t)FR_MAX(2 * (int64_t)m->cfg.ffn_dim, qkv_rows),
                      kern_row_bytes(t, FR_MAX(m->cfg.ffn_dim, qkv_rows)) * (size_t)m->cfg.dim);
  const kern_type_t th = opts && opts->dummy_head_type ? opts->dummy_head_type : t; /* embedding and output */
  size_t big = kern_row_bytes(th, m->cfg.dim) * (size_t)m->cfg.vocab_size;
  float target = 1.0f / sqrtf((float)m->cfg.dim);
  const uint64_t seed = opts ? opts->seed : 0;
  const int group = opts ? opts->dummy_group : 0;
  model__pool_make(&pools.pool, ffn + (1u << 20), t, target, seed, group);
  model__pool_make(&emb, big + (1u << 20), th, 4 * target, seed + 1, group);
  model__keep(m, pools.pool.bytes); /* the CPU backend borrows host bytes */
  model__keep(m, emb.bytes);
  if (q4km) { /* Q6_K: v and down of some layers (at most down's size), the output */
    model__pool_make(&pools.q6, kern_row_bytes(KERN_Q6_K, m->cfg.ffn_dim) * (size_t)m->cfg.dim + (1u << 20),
                     KERN_Q6_K, target, seed + 2, 0);
    model__pool_make(&emb6, kern_row_bytes(KERN_Q6_K, m->cfg.dim) * (size_t)m->cfg.vocab_size + (1u << 20),
                     KERN_Q6_K, 4 * target, seed + 3, 0);
    model__keep(m, pools.q6.bytes);
    model__keep(m, emb6.bytes);
  }
  size_t eoff = 0, eoff6 = 0;
  model_progress_t prog;
  model__load_begin(m, &prog, model__dummy_bytes(&m->cfg, t, th), opts && opts->progress);
  rc = model__dummy_weight(m, &emb, &m->tok_embd, true, th, m->cfg.vocab_size, m->cfg.dim, &eoff);
  if (!rc) rc = model__dummy_vector(m, &m->output_norm, m->cfg.dim, 1.0f);
  if (!rc && m->cfg.tied_embeddings && !m->shard.split_vocab) m->output = m->tok_embd;
  else if (!rc && q4km)
    rc = model__dummy_weight(m, &emb6, &m->output, false, KERN_Q6_K, m->shard.n_vocab, m->cfg.dim, &eoff6);
  else if (!rc) rc = model__dummy_weight(m, &emb, &m->output, false, th, m->shard.n_vocab, m->cfg.dim, &eoff);
  if (!rc) m->layers = fr_calloc((size_t)m->cfg.n_layers, sizeof *m->layers);
  for (int il = 0; !rc && il < m->cfg.n_layers; il++) rc = model__dummy_layer(m, &pools, t, il);
  if (!rc) rc = model__init_rope(m);
  if (!rc) rc = model__load_end(m);
  if (!rc) rc = model__alloc_scratch(m);
  if (rc) goto fail;
  if (opts && opts->progress)
    FR_LOGI("dummy %s: %d layers, dim %d, %s weights%s%s on %s", m->cfg.name, m->cfg.n_layers, m->cfg.dim,
            q4km ? "Q4_K_M (Q4_K and Q6_K)" : kern_type_traits(t)->name, th != t ? ", embedding and output " : "",
            th != t ? kern_type_traits(th)->name : "", be->ops->name);
  *out = m;
  return 0;
fail: /* a backend's load staging is freed with the backend */
  m->progress = NULL;
  model_destroy(m);
  return rc;
}
