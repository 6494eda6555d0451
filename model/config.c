/* config.c - model_config_t from GGUF metadata or a Hugging Face config.json.
 * Both paths end in config_check(), which bounds every field so that the
 * layer stack can size buffers from them without overflow. */
#include <jansson.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "model/config.h"
#include "model/file.h"
#include "model/source.h"

#define CFG_MAX_LAYERS 4096
#define CFG_MAX_DIM (1 << 20)
#define CFG_MAX_HEADS 4096
#define CFG_MAX_HEAD_DIM 4096
#define CFG_MAX_VOCAB (1 << 24)
#define CFG_MAX_CTX (1 << 24)
#define CFG_MAX_JSON (16u << 20) /* config.json files are a few KiB */

const char *model_arch_name(model_arch_t arch) {
  switch (arch) {
  case MODEL_ARCH_LLAMA: return "llama";
  case MODEL_ARCH_QWEN2: return "qwen2";
  case MODEL_ARCH_QWEN3: return "qwen3";
  case MODEL_ARCH_QWEN3MOE: return "qwen3moe";
  case MODEL_ARCH_BERT: return "bert";
  }
  return "unknown";
}

const char *model_pooling_name(model_pooling_t p) {
  switch (p) {
  case MODEL_POOL_NONE: return "none";
  case MODEL_POOL_LAST: return "last";
  case MODEL_POOL_MEAN: return "mean";
  case MODEL_POOL_CLS: return "cls";
  }
  return "unknown";
}

int model_pooling_parse(const char *name) {
  for (int p = MODEL_POOL_NONE; p <= MODEL_POOL_CLS; p++)
    if (!strcasecmp(name, model_pooling_name((model_pooling_t)p))) return p;
  return -1;
}

static void config_defaults(model_config_t *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->norm_eps = 1e-5f;
  cfg->rope_theta = 10000.0f;
  cfg->rope_factor = 1.0f;
  cfg->rope_low_freq_factor = 1.0f;
  cfg->rope_high_freq_factor = 4.0f;
  cfg->rope_orig_ctx = 8192;
  cfg->bos_id = -1;
}

static bool pos_finite(float f) { return isfinite(f) && f > 0.0f; }

bool model_config_layer_moe(const model_config_t *c, int il) {
  if (c->n_experts <= 0 || c->moe_step <= 0 || (il + 1) % c->moe_step) return false;
  for (int i = 0; i < c->n_mlp_only; i++)
    if (c->mlp_only[i] == il) return false;
  return true;
}

/* Mixture-of-experts fields: present exactly for qwen3moe, top-k within the experts. */
static int config_check_moe(const model_config_t *c, const char *src) {
  if (c->arch != MODEL_ARCH_QWEN3MOE)
    return c->n_experts ? fr_errorf(FR_EFORMAT, "%s: %s has no experts", src, c->arch_name) : 0;
  if (c->n_experts < 1 || c->n_experts > MODEL_MAX_EXPERTS)
    return fr_errorf(FR_EFORMAT, "%s: %d experts is out of range [1, %d]", src, c->n_experts, MODEL_MAX_EXPERTS);
  if (c->n_experts_used < 1 || c->n_experts_used > c->n_experts)
    return fr_errorf(FR_EFORMAT, "%s: %d experts used per token is out of range [1, %d experts]", src,
                     c->n_experts_used, c->n_experts);
  if (c->expert_ffn_dim < 1 || c->expert_ffn_dim > CFG_MAX_DIM * 4)
    return fr_errorf(FR_EFORMAT, "%s: expert FFN size %d is out of range", src, c->expert_ffn_dim);
  if (c->moe_step < 1 || c->moe_step > CFG_MAX_LAYERS)
    return fr_errorf(FR_EFORMAT, "%s: decoder_sparse_step %d is out of range", src, c->moe_step);
  return 0;
}

/* Cross-field checks shared by both readers; `src` names the file kind. */
static int config_check(const model_config_t *c, const char *src) {
  if (c->n_kv_heads > c->n_heads || c->n_heads % c->n_kv_heads)
    return fr_errorf(FR_EFORMAT, "%s: %d heads is not a multiple of %d kv heads", src, c->n_heads, c->n_kv_heads);
  if (c->head_dim % 2 || c->rope_dim % 2 || c->rope_dim > c->head_dim || c->rope_dim < 2)
    return fr_errorf(FR_EFORMAT, "%s: head_dim %d / rope dims %d must be even with rope dims <= head_dim", src,
                     c->head_dim, c->rope_dim);
  if ((int64_t)c->n_heads * c->head_dim > CFG_MAX_DIM * 4LL)
    return fr_errorf(FR_EFORMAT, "%s: %d heads x head_dim %d is too large", src, c->n_heads, c->head_dim);
  if (!pos_finite(c->norm_eps) || c->norm_eps >= 1.0f)
    return fr_errorf(FR_EFORMAT, "%s: rms norm epsilon %g is out of range", src, c->norm_eps);
  if (!pos_finite(c->rope_theta))
    return fr_errorf(FR_EFORMAT, "%s: rope theta %g is out of range", src, c->rope_theta);
  if (!pos_finite(c->rope_factor) || !pos_finite(c->rope_low_freq_factor) ||
      !pos_finite(c->rope_high_freq_factor) || c->rope_orig_ctx <= 0)
    return fr_errorf(FR_EFORMAT, "%s: rope scaling parameters out of range", src);
  if (c->rope_scaling == MODEL_ROPE_SCALING_LLAMA3 && c->rope_high_freq_factor <= c->rope_low_freq_factor)
    return fr_errorf(FR_EFORMAT, "%s: llama3 rope high_freq_factor must exceed low_freq_factor", src);
  if (c->sliding_window < 0) return fr_errorf(FR_EFORMAT, "%s: negative sliding window", src);
  return config_check_moe(c, src);
}

/* ---- GGUF ------------------------------------------------------------- */

/* Reads `<arch>.<suffix>` as an int in [1, max]; absent -> def, or an error
 * when def < 0 (required). */
static int gg_int(const model_gguf_t *g, const char *arch, const char *suffix, int64_t def, int64_t max,
                  int *out) {
  char key[160];
  int64_t v;
  snprintf(key, sizeof key, "%s.%s", arch, suffix);
  int rc = model_gguf_get_i64(g, key, &v);
  if (rc == FR_ENOTFOUND) {
    if (def < 0) return fr_errorf(FR_EFORMAT, "gguf: required key %s is missing", key);
    v = def;
  } else if (rc) {
    return rc;
  } else if (v < 1 || v > max) {
    return fr_errorf(FR_EFORMAT, "gguf: %s = %lld is out of range [1, %lld]", key, (long long)v, (long long)max);
  }
  *out = (int)v;
  return 0;
}

static int gg_float(const model_gguf_t *g, const char *arch, const char *suffix, float *out) {
  char key[160];
  snprintf(key, sizeof key, "%s.%s", arch, suffix);
  int rc = model_gguf_get_f32(g, key, out);
  return rc == FR_ENOTFOUND ? 0 : rc; /* absent: keep the default */
}

static int gg_arch(model_config_t *c, const model_gguf_t *g) {
  gguf_str_t s;
  int rc = model_gguf_get_str(g, "general.architecture", &s);
  if (rc == FR_ENOTFOUND) return fr_errorf(FR_EFORMAT, "gguf: general.architecture is missing");
  if (rc) return rc;
  static const struct { const char *name; model_arch_t arch; } known[] = {
      {"llama", MODEL_ARCH_LLAMA}, {"qwen2", MODEL_ARCH_QWEN2}, {"qwen3", MODEL_ARCH_QWEN3},
      {"qwen3moe", MODEL_ARCH_QWEN3MOE}, {"bert", MODEL_ARCH_BERT}};
  for (size_t i = 0; i < FR_ARRAY_SIZE(known); i++) {
    if (s.len == strlen(known[i].name) && memcmp(s.ptr, known[i].name, s.len) == 0) {
      c->arch = known[i].arch;
      snprintf(c->arch_name, sizeof c->arch_name, "%s", known[i].name);
      return 0;
    }
  }
  return fr_errorf(FR_EUNSUPPORTED, "gguf: architecture '%.*s' is not supported (llama, qwen2, qwen3, qwen3moe, bert)",
                   (int)FR_MIN(s.len, 64), s.ptr);
}

static int gg_shape(model_config_t *c, const model_gguf_t *g) {
  const char *a = c->arch_name;
  int rc = gg_int(g, a, "block_count", -1, CFG_MAX_LAYERS, &c->n_layers);
  if (!rc) rc = gg_int(g, a, "embedding_length", -1, CFG_MAX_DIM, &c->dim);
  /* qwen3moe has no dense layers: feed_forward_length may be absent (gg_moe) */
  if (!rc) rc = gg_int(g, a, "feed_forward_length", c->arch == MODEL_ARCH_QWEN3MOE ? 0 : -1, CFG_MAX_DIM * 4LL,
                       &c->ffn_dim);
  if (!rc) rc = gg_int(g, a, "attention.head_count", -1, CFG_MAX_HEADS, &c->n_heads);
  if (!rc) rc = gg_int(g, a, "attention.head_count_kv", c->n_heads, CFG_MAX_HEADS, &c->n_kv_heads);
  if (rc) return rc;
  if ((rc = gg_int(g, a, "attention.key_length", c->dim % c->n_heads ? -1 : c->dim / c->n_heads,
                   CFG_MAX_HEAD_DIM, &c->head_dim)))
    return rc;
  int vlen = 0;
  if ((rc = gg_int(g, a, "attention.value_length", c->head_dim, CFG_MAX_HEAD_DIM, &vlen))) return rc;
  if (vlen != c->head_dim)
    return fr_errorf(FR_EUNSUPPORTED, "gguf: value_length %d != key_length %d is not supported", vlen, c->head_dim);
  if ((rc = gg_int(g, a, "rope.dimension_count", c->head_dim, CFG_MAX_HEAD_DIM, &c->rope_dim))) return rc;
  if (c->arch == MODEL_ARCH_LLAMA && c->rope_dim != c->head_dim)
    return fr_errorf(FR_EFORMAT, "gguf: llama rope.dimension_count %d != head_dim %d", c->rope_dim, c->head_dim);
  if ((rc = gg_int(g, a, "context_length", 2048, CFG_MAX_CTX, &c->max_ctx))) return rc;
  if ((rc = gg_float(g, a, "attention.layer_norm_rms_epsilon", &c->norm_eps))) return rc;
  if (c->arch == MODEL_ARCH_BERT && (rc = gg_float(g, a, "attention.layer_norm_epsilon", &c->norm_eps))) return rc;
  return gg_float(g, a, "rope.freq_base", &c->rope_theta);
}

/* qwen3moe: expert_count, expert_used_count, expert_feed_forward_length
 * (required). Every layer is sparse and the top-k weights are renormalised,
 * as llama.cpp runs it. */
static int gg_moe(model_config_t *c, const model_gguf_t *g) {
  if (c->arch != MODEL_ARCH_QWEN3MOE) return 0;
  const char *a = c->arch_name;
  int rc = gg_int(g, a, "expert_count", -1, MODEL_MAX_EXPERTS, &c->n_experts);
  if (!rc) rc = gg_int(g, a, "expert_used_count", -1, MODEL_MAX_EXPERTS, &c->n_experts_used);
  if (!rc) rc = gg_int(g, a, "expert_feed_forward_length", -1, CFG_MAX_DIM * 4LL, &c->expert_ffn_dim);
  if (rc) return rc;
  c->norm_topk = true;
  c->moe_step = 1;
  if (!c->ffn_dim) c->ffn_dim = c->expert_ffn_dim;
  return 0;
}

/* rope.scaling.type (none|linear; yarn/longrope unsupported), factor, and
 * the legacy rope.scale_linear. Llama-3 files carry rope_freqs.weight and
 * no scaling type: that stays NONE (the layer stack folds rope_freqs in). */
static int gg_rope_scaling(model_config_t *c, const model_gguf_t *g) {
  char key[96];
  gguf_str_t t = {"", 0};
  float f = 1.0f;
  snprintf(key, sizeof key, "%s.rope.scaling.type", c->arch_name);
  int rc = model_gguf_get_str(g, key, &t);
  if (rc && rc != FR_ENOTFOUND) return rc;
  if ((rc = gg_float(g, c->arch_name, "rope.scale_linear", &f))) return rc;
  if ((rc = gg_float(g, c->arch_name, "rope.scaling.factor", &f))) return rc;
  bool none = t.len == 4 && memcmp(t.ptr, "none", 4) == 0;
  bool linear = t.len == 6 && memcmp(t.ptr, "linear", 6) == 0;
  if (t.len && !none && !linear)
    return fr_errorf(FR_EUNSUPPORTED, "gguf: rope scaling type '%.*s' is not supported (none, linear)",
                     (int)FR_MIN(t.len, 32), t.ptr);
  if (!pos_finite(f)) return fr_errorf(FR_EFORMAT, "gguf: rope scaling factor %g is out of range", f);
  if (!none && f != 1.0f) {
    c->rope_scaling = MODEL_ROPE_SCALING_LINEAR;
    c->rope_factor = f;
  }
  return 0;
}

/* Special token ids; ids that do not fit are ignored, as llama.cpp does. */
static void gg_special_ids(model_config_t *c, const model_gguf_t *g) {
  int64_t v;
  if (model_gguf_get_i64(g, "tokenizer.ggml.bos_token_id", &v) == 0 && v >= 0 && v < c->vocab_size)
    c->bos_id = (int)v;
  if (model_gguf_get_i64(g, "tokenizer.ggml.eos_token_id", &v) == 0 && v >= 0 && v < c->vocab_size)
    c->eos_ids[c->n_eos++] = (int)v;
  fr_error_clear();
}

/* Vocabulary size: rows of token_embd.weight, else <arch>.vocab_size, else
 * the length of the token list. */
static int gg_vocab(model_config_t *c, const model_gguf_t *g) {
  const gguf_tensor_t *t = model_gguf_tensor(g, "token_embd.weight");
  const gguf_kv_t *tok = model_gguf_find(g, "tokenizer.ggml.tokens");
  char key[96];
  int64_t n = 0;
  snprintf(key, sizeof key, "%s.vocab_size", c->arch_name);
  if (t) n = t->ne[1];
  else if (model_gguf_get_i64(g, key, &n) != 0 && tok) n = (int64_t)tok->arr_count;
  if (n < 1 || n > CFG_MAX_VOCAB)
    return fr_errorf(FR_EFORMAT, "gguf: vocabulary size %lld is out of range", (long long)n);
  c->vocab_size = (int)n;
  return 0;
}

/* <arch>.pooling_type in llama.cpp's numbering (0 none, 1 mean, 2 cls,
 * 3 last); absent or another kind (rank): none. */
static void gg_pooling(model_config_t *c, const model_gguf_t *g) {
  static const model_pooling_t kinds[] = {MODEL_POOL_NONE, MODEL_POOL_MEAN, MODEL_POOL_CLS, MODEL_POOL_LAST};
  char key[160];
  int64_t v;
  snprintf(key, sizeof key, "%s.pooling_type", c->arch_name);
  if (model_gguf_get_i64(g, key, &v) == 0 && v >= 0 && v < (int64_t)FR_ARRAY_SIZE(kinds)) c->pooling = kinds[v];
}

int model_config_from_gguf(model_config_t *cfg, const model_gguf_t *g) {
  model_config_t c;
  gguf_str_t name;
  config_defaults(&c);
  int rc = gg_arch(&c, g);
  if (!rc) rc = gg_shape(&c, g);
  if (!rc) rc = gg_moe(&c, g);
  if (!rc) rc = gg_rope_scaling(&c, g);
  if (!rc) rc = gg_vocab(&c, g);
  if (rc) return rc;
  if (model_gguf_get_str(g, "general.name", &name) == 0)
    snprintf(c.name, sizeof c.name, "%.*s", (int)FR_MIN(name.len, sizeof c.name - 1), name.ptr);
  c.tied_embeddings = model_gguf_tensor(g, "output.weight") == NULL;
  c.attn_bias = model_gguf_tensor(g, "blk.0.attn_q.bias") != NULL;
  c.qk_norm = model_gguf_tensor(g, "blk.0.attn_q_norm.weight") != NULL;
  gg_special_ids(&c, g);
  gg_pooling(&c, g);
  if ((rc = config_check(&c, "gguf"))) return rc;
  *cfg = c;
  return 0;
}

/* ---- Hugging Face config.json ----------------------------------------- */

/* A JSON value, NULL when absent or null. */
static json_t *hf_get(json_t *o, const char *key) {
  json_t *v = json_object_get(o, key);
  return json_is_null(v) ? NULL : v;
}

/* An integer in [1, max]; absent -> def, or an error when def < 0. */
static int hf_int(json_t *o, const char *key, int64_t def, int64_t max, int *out) {
  json_t *v = hf_get(o, key);
  if (!v) {
    if (def < 0) return fr_errorf(FR_EFORMAT, "config.json: required key %s is missing", key);
    *out = (int)def;
    return 0;
  }
  if (!json_is_integer(v)) return fr_errorf(FR_EFORMAT, "config.json: %s is not an integer", key);
  json_int_t x = json_integer_value(v);
  if (x < 1 || x > max)
    return fr_errorf(FR_EFORMAT, "config.json: %s = %lld is out of range [1, %lld]", key, (long long)x,
                     (long long)max);
  *out = (int)x;
  return 0;
}

/* A number (integer or real); absent keeps *out. */
static int hf_float(json_t *o, const char *key, float *out) {
  json_t *v = hf_get(o, key);
  if (!v) return 0;
  if (!json_is_number(v)) return fr_errorf(FR_EFORMAT, "config.json: %s is not a number", key);
  *out = (float)json_number_value(v);
  return 0;
}

static int hf_bool(json_t *o, const char *key, bool *out) {
  json_t *v = hf_get(o, key);
  if (!v) return 0;
  if (!json_is_boolean(v)) return fr_errorf(FR_EFORMAT, "config.json: %s is not a boolean", key);
  *out = json_is_true(v);
  return 0;
}

typedef struct {
  const char *hf_arch;    /* architectures[0] */
  const char *model_type; /* fallback when architectures is absent */
  model_arch_t arch;
  bool tied_default;      /* transformers' default for tie_word_embeddings */
} hf_arch_t;

/* Every one of these defaults tie_word_embeddings to false in transformers;
 * small Qwen models write true explicitly. */
static const hf_arch_t hf_archs[] = {
    {"LlamaForCausalLM", "llama", MODEL_ARCH_LLAMA, false},
    {"MistralForCausalLM", "mistral", MODEL_ARCH_LLAMA, false},
    {"Qwen2ForCausalLM", "qwen2", MODEL_ARCH_QWEN2, false},
    {"Qwen3ForCausalLM", "qwen3", MODEL_ARCH_QWEN3, false},
    {"Qwen3MoeForCausalLM", "qwen3_moe", MODEL_ARCH_QWEN3MOE, false},
    {"BertModel", "bert", MODEL_ARCH_BERT, false},
};

static int hf_arch(json_t *root, const hf_arch_t **out) {
  json_t *archs = hf_get(root, "architectures"), *mt = hf_get(root, "model_type");
  const char *name = NULL;
  if (json_is_array(archs) && json_is_string(json_array_get(archs, 0)))
    name = json_string_value(json_array_get(archs, 0));
  for (size_t i = 0; i < FR_ARRAY_SIZE(hf_archs); i++) {
    bool hit = name ? strcmp(name, hf_archs[i].hf_arch) == 0
                    : json_is_string(mt) && strcmp(json_string_value(mt), hf_archs[i].model_type) == 0;
    if (hit) {
      *out = &hf_archs[i];
      return 0;
    }
  }
  return fr_errorf(FR_EUNSUPPORTED,
                   "config.json: architecture '%.64s' is not supported (LlamaForCausalLM, MistralForCausalLM, "
                   "Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, BertModel)",
                   name ? name : json_is_string(mt) ? json_string_value(mt) : "(none)");
}

static int hf_shape(model_config_t *c, json_t *root) {
  int rc = hf_int(root, "num_hidden_layers", -1, CFG_MAX_LAYERS, &c->n_layers);
  if (!rc) rc = hf_int(root, "hidden_size", -1, CFG_MAX_DIM, &c->dim);
  if (!rc) rc = hf_int(root, "intermediate_size", -1, CFG_MAX_DIM * 4LL, &c->ffn_dim);
  if (!rc) rc = hf_int(root, "num_attention_heads", -1, CFG_MAX_HEADS, &c->n_heads);
  if (!rc) rc = hf_int(root, "num_key_value_heads", c->n_heads, CFG_MAX_HEADS, &c->n_kv_heads);
  if (!rc) rc = hf_int(root, "head_dim", c->dim % c->n_heads ? -1 : c->dim / c->n_heads, CFG_MAX_HEAD_DIM,
                       &c->head_dim);
  if (!rc) rc = hf_int(root, "vocab_size", -1, CFG_MAX_VOCAB, &c->vocab_size);
  if (!rc) rc = hf_int(root, "max_position_embeddings", 2048, CFG_MAX_CTX, &c->max_ctx);
  if (rc) return rc;
  c->rope_dim = c->head_dim;
  c->norm_eps = 1e-6f; /* transformers' LlamaConfig/Qwen2Config default */
  return hf_float(root, "rms_norm_eps", &c->norm_eps);
}

/* rope_scaling (or the newer rope_parameters): default, linear, llama3. */
static int hf_rope(model_config_t *c, json_t *root) {
  json_t *rp = hf_get(root, "rope_parameters"), *rs = hf_get(root, "rope_scaling");
  int rc = hf_float(root, "rope_theta", &c->rope_theta);
  if (!rc && json_is_object(rp) && !hf_get(root, "rope_theta")) rc = hf_float(rp, "rope_theta", &c->rope_theta);
  if (rc) return rc;
  if (!rs) rs = rp;
  if (!rs) return 0;
  if (!json_is_object(rs)) return fr_errorf(FR_EFORMAT, "config.json: rope_scaling is not an object");
  json_t *t = hf_get(rs, "rope_type");
  if (!t) t = hf_get(rs, "type");
  const char *type = json_is_string(t) ? json_string_value(t) : t ? NULL : "default";
  if (!type) return fr_errorf(FR_EFORMAT, "config.json: rope_scaling type is not a string");
  if (strcmp(type, "default") == 0) return 0;
  if (strcmp(type, "linear") == 0) c->rope_scaling = MODEL_ROPE_SCALING_LINEAR;
  else if (strcmp(type, "llama3") == 0) c->rope_scaling = MODEL_ROPE_SCALING_LLAMA3;
  else return fr_errorf(FR_EUNSUPPORTED, "config.json: rope scaling '%.32s' is not supported (linear, llama3)", type);
  if (!json_is_number(hf_get(rs, "factor")))
    return fr_errorf(FR_EFORMAT, "config.json: rope_scaling %s needs a numeric factor", type);
  rc = hf_float(rs, "factor", &c->rope_factor);
  if (!rc && c->rope_scaling == MODEL_ROPE_SCALING_LLAMA3) {
    rc = hf_float(rs, "low_freq_factor", &c->rope_low_freq_factor);
    if (!rc) rc = hf_float(rs, "high_freq_factor", &c->rope_high_freq_factor);
    if (!rc) rc = hf_int(rs, "original_max_position_embeddings", 8192, CFG_MAX_CTX, &c->rope_orig_ctx);
  }
  return rc;
}

/* bos_token_id (int) and eos_token_id (int or list of ints). A wrong type
 * is an error; ids outside the vocabulary are ignored, as for GGUF. */
static int hf_special_ids(model_config_t *c, json_t *root) {
  json_t *bos = hf_get(root, "bos_token_id"), *eos = hf_get(root, "eos_token_id");
  if (bos && !json_is_integer(bos)) return fr_errorf(FR_EFORMAT, "config.json: bos_token_id is not an integer");
  if (bos && json_integer_value(bos) >= 0 && json_integer_value(bos) < c->vocab_size)
    c->bos_id = (int)json_integer_value(bos);
  if (!eos) return 0;
  size_t n = json_is_array(eos) ? json_array_size(eos) : 1;
  for (size_t i = 0; i < n; i++) {
    json_t *v = json_is_array(eos) ? json_array_get(eos, i) : eos;
    if (!json_is_integer(v))
      return fr_errorf(FR_EFORMAT, "config.json: eos_token_id must be an integer or a list of integers");
    json_int_t id = json_integer_value(v);
    if (id >= 0 && id < c->vocab_size && c->n_eos < (int)FR_ARRAY_SIZE(c->eos_ids)) c->eos_ids[c->n_eos++] = (int)id;
  }
  return 0;
}

/* BERT: layer_norm_eps, hidden_act gelu (erf) or gelu_new / gelu_pytorch_tanh
 * (tanh), absolute positions; the other features do not apply. */
static int hf_bert(model_config_t *c, json_t *root) {
  json_t *act = hf_get(root, "hidden_act"), *pet = hf_get(root, "position_embedding_type");
  const char *a = json_is_string(act) ? json_string_value(act) : act ? "?" : "gelu";
  c->norm_eps = 1e-12f; /* BertConfig's default */
  int rc = hf_float(root, "layer_norm_eps", &c->norm_eps);
  if (rc) return rc;
  if (pet && (!json_is_string(pet) || strcmp(json_string_value(pet), "absolute")))
    return fr_errorf(FR_EUNSUPPORTED, "config.json: BERT position_embedding_type must be absolute");
  c->gelu_erf = !strcmp(a, "gelu");
  if (!c->gelu_erf && strcmp(a, "gelu_new") && strcmp(a, "gelu_pytorch_tanh"))
    return fr_errorf(FR_EUNSUPPORTED, "config.json: BERT hidden_act %.32s (gelu, gelu_new)", a);
  c->tied_embeddings = true; /* no LM head */
  c->attn_bias = true;
  return 0;
}

/* Bias, norms, activation, tied embeddings and sliding window. */
static int hf_features(model_config_t *c, json_t *root, const hf_arch_t *a) {
  if (c->arch == MODEL_ARCH_BERT) return hf_bert(c, root);
  json_t *act = hf_get(root, "hidden_act");
  bool mlp_bias = false, use_sw = false;
  if (act && (!json_is_string(act) || strcmp(json_string_value(act), "silu") != 0))
    return fr_errorf(FR_EUNSUPPORTED, "config.json: hidden_act must be silu");
  c->tied_embeddings = a->tied_default;
  c->attn_bias = c->arch == MODEL_ARCH_QWEN2; /* qwen2 always has q/k/v bias */
  c->qk_norm = c->arch == MODEL_ARCH_QWEN3 || c->arch == MODEL_ARCH_QWEN3MOE;
  int rc = hf_bool(root, "tie_word_embeddings", &c->tied_embeddings);
  if (!rc && c->arch != MODEL_ARCH_QWEN2) rc = hf_bool(root, "attention_bias", &c->attn_bias);
  if (!rc) rc = hf_bool(root, "mlp_bias", &mlp_bias);
  if (!rc) rc = hf_bool(root, "use_sliding_window", &use_sw);
  if (rc) return rc;
  if (mlp_bias) return fr_errorf(FR_EUNSUPPORTED, "config.json: mlp_bias is not supported");
  /* Qwen gates the window with use_sliding_window; Mistral has no flag. */
  bool mistral = strcmp(a->hf_arch, "MistralForCausalLM") == 0;
  if (!use_sw && !(mistral && !json_object_get(root, "use_sliding_window"))) return 0;
  rc = hf_int(root, "sliding_window", 0, CFG_MAX_CTX, &c->sliding_window);
  /* Qwen2: layers below max_window_layers (default 28) attend to everything */
  if (!rc && c->arch == MODEL_ARCH_QWEN2) rc = hf_int(root, "max_window_layers", 28, CFG_MAX_LAYERS, &c->swa_first_layer);
  return rc;
}

/* mlp_only_layers: a list of layer indices in [0, n_layers). */
static int hf_mlp_only(model_config_t *c, json_t *root) {
  json_t *l = hf_get(root, "mlp_only_layers");
  if (!l) return 0;
  if (!json_is_array(l)) return fr_errorf(FR_EFORMAT, "config.json: mlp_only_layers is not a list");
  if (json_array_size(l) > MODEL_MAX_MLP_ONLY)
    return fr_errorf(FR_EUNSUPPORTED, "config.json: more than %d mlp_only_layers", MODEL_MAX_MLP_ONLY);
  for (size_t i = 0; i < json_array_size(l); i++) {
    json_t *v = json_array_get(l, i);
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= c->n_layers)
      return fr_errorf(FR_EFORMAT, "config.json: mlp_only_layers[%zu] is not a layer index", i);
    c->mlp_only[c->n_mlp_only++] = (int16_t)json_integer_value(v);
  }
  return 0;
}

/* Qwen3MoeForCausalLM: num_experts (which transformers 5 writes as
 * num_local_experts), num_experts_per_tok, moe_intermediate_size
 * (required), norm_topk_prob (transformers' default false),
 * decoder_sparse_step (default 1) and mlp_only_layers. */
static int hf_moe(model_config_t *c, json_t *root) {
  if (c->arch != MODEL_ARCH_QWEN3MOE) return 0;
  const char *experts = hf_get(root, "num_experts") || !hf_get(root, "num_local_experts") ? "num_experts"
                                                                                          : "num_local_experts";
  int rc = hf_int(root, experts, -1, MODEL_MAX_EXPERTS, &c->n_experts);
  if (!rc) rc = hf_int(root, "num_experts_per_tok", -1, MODEL_MAX_EXPERTS, &c->n_experts_used);
  if (!rc) rc = hf_int(root, "moe_intermediate_size", -1, CFG_MAX_DIM * 4LL, &c->expert_ffn_dim);
  if (!rc) rc = hf_int(root, "decoder_sparse_step", 1, CFG_MAX_LAYERS, &c->moe_step);
  if (!rc) rc = hf_bool(root, "norm_topk_prob", &c->norm_topk);
  return rc ? rc : hf_mlp_only(c, root);
}

static int hf_parse(model_config_t *cfg, json_t *root) {
  const hf_arch_t *a = NULL;
  model_config_t c;
  config_defaults(&c);
  if (!json_is_object(root)) return fr_errorf(FR_EFORMAT, "config.json: not a JSON object");
  int rc = hf_arch(root, &a);
  if (rc) return rc;
  c.arch = a->arch;
  snprintf(c.arch_name, sizeof c.arch_name, "%s", model_arch_name(a->arch));
  if (!rc) rc = hf_shape(&c, root);
  if (!rc) rc = hf_rope(&c, root);
  if (!rc) rc = hf_special_ids(&c, root);
  if (!rc) rc = hf_features(&c, root, a);
  if (!rc) rc = hf_moe(&c, root);
  if (!rc) rc = config_check(&c, "config.json");
  if (!rc) *cfg = c;
  return rc;
}

int model_config_from_hf_json_buf(model_config_t *cfg, const void *json, size_t len) {
  json_error_t jerr;
  json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
  if (!root) return fr_errorf(FR_EFORMAT, "config.json: %s (line %d)", jerr.text, jerr.line);
  int rc = hf_parse(cfg, root);
  json_decref(root);
  return rc;
}

int model_config_from_hf_json(model_config_t *cfg, const char *config_json_path) {
  json_error_t jerr;
  char *text;
  size_t len;
  int rc = model__file_read("config.json", config_json_path, CFG_MAX_JSON, &text, &len);
  if (rc) return rc;
  json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
  free(text);
  if (!root) return fr_errorf(FR_EFORMAT, "%s: %s (line %d)", config_json_path, jerr.text, jerr.line);
  rc = hf_parse(cfg, root);
  json_decref(root);
  if (rc) return rc;
  char *dup = fr_strdup(config_json_path); /* name: the folder holding config.json */
  const char *base = basename(dirname(dup));
  snprintf(cfg->name, sizeof cfg->name, "%s", strcmp(base, ".") && strcmp(base, "/") ? base : "");
  free(dup);
  return 0;
}
