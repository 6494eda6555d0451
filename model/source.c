/* source.c - a GGUF file or a Hugging Face folder seen as one table of
 * GGUF-named (rows, cols) tensors plus a model_config_t. */
#include "model/source.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fr_err.h"
#include "common/fr_log.h"
#include "common/fr_pool.h"
#include "common/fr_util.h"
#include "model/file.h"

/* ---- HF -> GGUF tensor names ------------------------------------------ */

typedef struct {
  const char *hf, *gguf;
} name_map_t;

static const name_map_t hf_global_names[] = {
    {"model.embed_tokens.weight", "token_embd.weight"},
    {"model.norm.weight", "output_norm.weight"},
    {"lm_head.weight", "output.weight"},
};

/* Suffixes after "model.layers.N." */
static const name_map_t hf_layer_names[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"self_attn.q_proj.bias", "attn_q.bias"},
    {"self_attn.k_proj.bias", "attn_k.bias"},
    {"self_attn.v_proj.bias", "attn_v.bias"},
    {"self_attn.o_proj.bias", "attn_output.bias"},
    {"self_attn.q_norm.weight", "attn_q_norm.weight"},
    {"self_attn.k_norm.weight", "attn_k_norm.weight"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
    {"mlp.gate.weight", "ffn_gate_inp.weight"},
};

/* Per-expert suffixes after "model.layers.N.mlp.experts.E." */
static const name_map_t hf_expert_names[] = {
    {"gate_proj.weight", "ffn_gate_exps"},
    {"up_proj.weight", "ffn_up_exps"},
    {"down_proj.weight", "ffn_down_exps"},
};

/* Parses a decimal index of 1..6 digits without leading zeros at p; the end in *end. */
static bool parse_index(const char *p, const char **end) {
  const char *q = p;
  while (*q >= '0' && *q <= '9') q++;
  *end = q;
  return q > p && q - p <= 6 && !(*p == '0' && q - p > 1);
}

/* "mlp.experts.E.gate_proj.weight" (after the layer) -> blk.L.ffn_gate_exps.E.weight. */
static char *map_hf_expert(const char *layer, int layer_len, const char *rest) {
  static const char prefix[] = "mlp.experts.";
  const char *e = rest + sizeof prefix - 1, *q;
  char buf[128];
  if (strncmp(rest, prefix, sizeof prefix - 1) != 0 || !parse_index(e, &q) || *q != '.') return NULL;
  for (size_t i = 0; i < FR_ARRAY_SIZE(hf_expert_names); i++)
    if (strcmp(q + 1, hf_expert_names[i].hf) == 0) {
      snprintf(buf, sizeof buf, "blk.%.*s.%s.%.*s.weight", layer_len, layer, hf_expert_names[i].gguf, (int)(q - e), e);
      return fr_strdup(buf);
    }
  return NULL;
}

/* Maps a HF tensor name to its GGUF name (malloc'd), NULL when unknown. */
static char *map_hf_name(const char *hf) {
  static const char prefix[] = "model.layers.";
  char buf[96];
  for (size_t i = 0; i < FR_ARRAY_SIZE(hf_global_names); i++)
    if (strcmp(hf, hf_global_names[i].hf) == 0) return fr_strdup(hf_global_names[i].gguf);
  if (strncmp(hf, prefix, sizeof prefix - 1) != 0) return NULL;
  const char *p = hf + sizeof prefix - 1, *q;
  if (!parse_index(p, &q) || *q != '.') return NULL;
  for (size_t i = 0; i < FR_ARRAY_SIZE(hf_layer_names); i++) {
    if (strcmp(q + 1, hf_layer_names[i].hf) == 0) {
      snprintf(buf, sizeof buf, "blk.%.*s.%s", (int)(q - p), p, hf_layer_names[i].gguf);
      return fr_strdup(buf);
    }
  }
  return map_hf_expert(p, (int)(q - p), q + 1);
}

/* ---- tensor tables ---------------------------------------------------- */

static bool has_suffix(const char *s, const char *suf);

static int cmp_tensor(const void *a, const void *b) {
  return strcmp(((const model_tensor_t *)a)->name, ((const model_tensor_t *)b)->name);
}

static int sort_tensors(model_source_t *s) {
  qsort(s->tensors, s->n_tensors, sizeof *s->tensors, cmp_tensor);
  for (size_t i = 1; i < s->n_tensors; i++)
    if (strcmp(s->tensors[i - 1].name, s->tensors[i].name) == 0)
      return fr_errorf(FR_EFORMAT, "model: tensor %s appears twice", s->tensors[i].name);
  return 0;
}

static void tensors_from_gguf(model_source_t *s) {
  const model_gguf_t *g = s->gguf;
  s->tensors = fr_calloc(FR_MAX(g->n_tensors, 1), sizeof *s->tensors);
  for (uint64_t i = 0; i < g->n_tensors; i++) {
    const gguf_tensor_t *t = &g->tensors[i];
    model_tensor_t *m = &s->tensors[s->n_tensors++];
    m->name = fr_strndup(t->name.ptr, t->name.len);
    m->type = t->type;
    m->rows = t->ne[1] * t->ne[2] * t->ne[3]; /* fits: the element count was checked */
    m->cols = t->ne[0];
    m->n_mats = t->ne[2] * t->ne[3];
    m->data = t->data;
    m->fd = g->fd;
    m->file_off = (uint64_t)((const uint8_t *)t->data - g->map);
  }
}

/* (rows, cols) of a row-major HF tensor: the last dim is cols. */
static int hf_rows_cols(const st_tensor_t *t, int64_t *rows, int64_t *cols) {
  *rows = 1;
  *cols = t->n_dims ? t->shape[t->n_dims - 1] : 1;
  for (int d = 0; d + 1 < t->n_dims; d++)
    if (__builtin_mul_overflow(*rows, t->shape[d], rows))
      return fr_errorf(FR_EFORMAT, "model: tensor %s: shape overflows", t->name);
  return 0;
}

static int tensor_from_st(model_tensor_t *m, const st_tensor_t *t, char *gguf_name) {
  static const kern_type_t kt[] = {[ST_F32] = KERN_F32, [ST_F16] = KERN_F16, [ST_BF16] = KERN_BF16};
  m->name = gguf_name;
  if (t->dtype == ST_OTHER)
    return fr_errorf(FR_EUNSUPPORTED, "model: tensor %s has dtype %s (F32, F16, BF16 are supported, and F8_E4M3 "
                     "weights with their scales)", t->name, t->dtype_name);
  m->type = kt[t->dtype];
  m->data = t->data;
  m->fd = t->fd;
  m->file_off = t->file_off;
  m->n_mats = 1;
  return hf_rows_cols(t, &m->rows, &m->cols);
}

#define SOURCE_THREADS 16 /* at most, decoding FP8 layers and repacking GPTQ/AWQ ones */

/* s->pool, made for the first layer that is decoded or repacked when read. */
static int source_pool(model_source_t *s) {
  if (s->pool) return 0;
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  return fr_pool_create(&s->pool, (int)FR_MIN(FR_MAX(cores, 1), SOURCE_THREADS));
}

/* A GPTQ/AWQ layer, hf the name of its qweight: one KERN_I4G tensor under
 * the GGUF name of its ".weight", checked now and repacked when it is read
 * (model_source_read). *used is false when the layer is not one the model
 * runs. */
static int tensor_from_quant(model_source_t *s, model_tensor_t *m, const char *hf, bool *used) {
  size_t n = strlen(hf) - strlen(".qweight");
  char base[512], wname[520];
  *used = false;
  if (n >= sizeof base) return 0;
  snprintf(base, sizeof base, "%.*s", (int)n, hf);
  snprintf(wname, sizeof wname, "%s.weight", base);
  char *name = map_hf_name(wname);
  if (!name) return 0;
  model_quant_layer_t *l = fr_calloc(1, sizeof *l);
  int rc = model_quant_open(&s->quant, s->st, base, l);
  if (!rc && (rc = source_pool(s))) model_quant_close(l);
  if (rc) {
    free(l);
    free(name);
    return rc;
  }
  *used = true;
  *m = (model_tensor_t){.name = name, .type = KERN_I4G, .rows = l->out, .cols = l->in, .n_mats = 1, .fd = -1,
                        .perm = l->perm, .quant = l};
  return 0;
}

/* An FP8 layer, t its F8_E4M3 weight: one BF16 tensor under its GGUF name,
 * checked now and decoded when it is read (model_source_read). *used is
 * false when the layer is not one the model runs. */
static int tensor_from_fp8(model_source_t *s, model_tensor_t *m, const st_tensor_t *t, bool *used) {
  *used = false;
  char *name = map_hf_name(t->name);
  if (!name) return 0;
  if (!has_suffix(t->name, ".weight")) {
    free(name);
    return fr_errorf(FR_EUNSUPPORTED, "model: tensor %s has dtype F8_E4M3 (only weights may)", t->name);
  }
  char base[512];
  snprintf(base, sizeof base, "%.*s", (int)FR_MIN(strlen(t->name) - strlen(".weight"), sizeof base - 1), t->name);
  model_fp8_layer_t *l = fr_calloc(1, sizeof *l);
  int rc = model_quant_fp8_open(&s->quant, s->st, base, l);
  if (!rc) rc = source_pool(s);
  if (rc) {
    model_quant_fp8_close(l);
    free(l);
    free(name);
    return rc;
  }
  *used = true;
  *m = (model_tensor_t){.name = name, .type = KERN_BF16, .rows = l->rows, .cols = l->cols, .n_mats = 1, .fd = -1,
                        .fp8 = l};
  return 0;
}

static int tensors_from_st(model_source_t *s) {
  const model_st_t *st = s->st;
  int rc = 0;
  s->tensors = fr_calloc(FR_MAX(st->n_tensors, 1), sizeof *s->tensors);
  for (size_t i = 0; i < st->n_tensors && !rc; i++) {
    const bool qweight = has_suffix(st->tensors[i].name, ".qweight");
    const bool fp8 = s->config.arch != MODEL_ARCH_BERT && !strcmp(st->tensors[i].dtype_name, "F8_E4M3");
    if (qweight || fp8) {
      bool used;
      model_tensor_t *m = &s->tensors[s->n_tensors];
      rc = qweight ? tensor_from_quant(s, m, st->tensors[i].name, &used)
                   : tensor_from_fp8(s, m, &st->tensors[i], &used);
      s->n_tensors += !rc && used;
      continue;
    }
    char *name = s->config.arch == MODEL_ARCH_BERT ? model__bert_hf_name(st->tensors[i].name)
                                                   : map_hf_name(st->tensors[i].name);
    if (!name) {
      FR_LOGD("model: skipping tensor %s (not used)", st->tensors[i].name);
      continue;
    }
    rc = tensor_from_st(&s->tensors[s->n_tensors++], &st->tensors[i], name);
  }
  return rc;
}

/* ---- shape checks ----------------------------------------------------- */

static bool is_float_type(kern_type_t t) { return t == KERN_F32 || t == KERN_F16 || t == KERN_BF16; }

/* name must exist as n_mats stacked matrices of (rows / n_mats, cols);
 * vectors (norms, biases) must be float. */
static int expect_mats(const model_source_t *s, const char *name, int64_t n_mats, int64_t rows, int64_t cols) {
  const model_tensor_t *t = model_source_tensor(s, name);
  if (!t) return fr_errorf(FR_EFORMAT, "model: tensor %s is missing", name);
  if ((t->rows != rows || t->cols != cols) && t->n_mats == 1 && n_mats == 1)
    return fr_errorf(FR_EFORMAT, "model: tensor %s has shape %lld x %lld, expected %lld x %lld", name,
                     (long long)t->rows, (long long)t->cols, (long long)rows, (long long)cols);
  if (t->rows != rows || t->cols != cols || t->n_mats != n_mats) /* a stack of n_mats matrices */
    return fr_errorf(FR_EFORMAT, "model: tensor %s has shape %lld x %lld x %lld, expected %lld x %lld x %lld", name,
                     (long long)t->n_mats, (long long)(t->rows / FR_MAX(t->n_mats, 1)), (long long)t->cols,
                     (long long)n_mats, (long long)(rows / n_mats), (long long)cols);
  if (rows == 1 && !is_float_type(t->type))
    return fr_errorf(FR_EUNSUPPORTED, "model: vector tensor %s has quantized type %d", name, t->type);
  return 0;
}

static int expect(const model_source_t *s, const char *name, int64_t rows, int64_t cols) {
  return expect_mats(s, name, 1, rows, cols);
}

static int expect_layer(const model_source_t *s, int l, const char *what, int64_t rows, int64_t cols) {
  char name[96];
  snprintf(name, sizeof name, "blk.%d.%s", l, what);
  return expect(s, name, rows, cols);
}

/* One expert stack (ffn_gate_exps, ...) of (rows, cols) experts: a GGUF 3-D
 * tensor of n_experts matrices, or one HF tensor per expert. */
static int expect_experts(const model_source_t *s, int l, const char *what, int64_t rows, int64_t cols) {
  const model_config_t *c = &s->config;
  char name[96];
  snprintf(name, sizeof name, "blk.%d.%s.weight", l, what);
  if (model_source_tensor(s, name) || s->gguf) return expect_mats(s, name, c->n_experts, rows * c->n_experts, cols);
  int rc = 0;
  for (int e = 0; e < c->n_experts && !rc; e++) {
    snprintf(name, sizeof name, "blk.%d.%s.%d.weight", l, what, e);
    rc = expect(s, name, rows, cols);
  }
  return rc;
}

/* The FFN of layer l: dense, or the router and experts of a MoE layer. */
static int check_ffn(const model_source_t *s, int l) {
  const model_config_t *c = &s->config;
  if (!model_config_layer_moe(c, l)) {
    int rc = expect_layer(s, l, "ffn_gate.weight", c->ffn_dim, c->dim);
    if (!rc) rc = expect_layer(s, l, "ffn_up.weight", c->ffn_dim, c->dim);
    if (!rc) rc = expect_layer(s, l, "ffn_down.weight", c->dim, c->ffn_dim);
    return rc;
  }
  int rc = expect_layer(s, l, "ffn_gate_inp.weight", c->n_experts, c->dim);
  if (!rc) rc = expect_experts(s, l, "ffn_gate_exps", c->expert_ffn_dim, c->dim);
  if (!rc) rc = expect_experts(s, l, "ffn_up_exps", c->expert_ffn_dim, c->dim);
  if (!rc) rc = expect_experts(s, l, "ffn_down_exps", c->dim, c->expert_ffn_dim);
  return rc;
}

static int check_layer(const model_source_t *s, int l) {
  const model_config_t *c = &s->config;
  int64_t q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
  int rc = expect_layer(s, l, "attn_norm.weight", 1, c->dim);
  if (!rc) rc = expect_layer(s, l, "attn_q.weight", q, c->dim);
  if (!rc) rc = expect_layer(s, l, "attn_k.weight", kv, c->dim);
  if (!rc) rc = expect_layer(s, l, "attn_v.weight", kv, c->dim);
  if (!rc) rc = expect_layer(s, l, "attn_output.weight", c->dim, q);
  if (!rc && c->attn_bias) rc = expect_layer(s, l, "attn_q.bias", 1, q);
  if (!rc && c->attn_bias) rc = expect_layer(s, l, "attn_k.bias", 1, kv);
  if (!rc && c->attn_bias) rc = expect_layer(s, l, "attn_v.bias", 1, kv);
  if (!rc && c->qk_norm) rc = expect_layer(s, l, "attn_q_norm.weight", 1, c->head_dim);
  if (!rc && c->qk_norm) rc = expect_layer(s, l, "attn_k_norm.weight", 1, c->head_dim);
  if (!rc) rc = expect_layer(s, l, "ffn_norm.weight", 1, c->dim);
  return rc ? rc : check_ffn(s, l);
}

/* Every tensor the config needs exists with its shape; the first missing or
 * misshaped one is reported by name. */
static int check_tensors(const model_source_t *s) {
  const model_config_t *c = &s->config;
  if (c->arch == MODEL_ARCH_BERT) return model__bert_check_tensors(s);
  int rc = expect(s, "token_embd.weight", c->vocab_size, c->dim);
  if (!rc) rc = expect(s, "output_norm.weight", 1, c->dim);
  if (!rc && !c->tied_embeddings) rc = expect(s, "output.weight", c->vocab_size, c->dim);
  if (!rc && model_source_tensor(s, "rope_freqs.weight")) rc = expect(s, "rope_freqs.weight", 1, c->rope_dim / 2);
  for (int l = 0; l < c->n_layers && !rc; l++) rc = check_layer(s, l);
  return rc;
}

/* ---- opening paths (file.h) ------------------------------------------- */

static const char *kind_names(unsigned kinds) {
  if (kinds == MODEL_PATH_DIR) return "a folder";
  return kinds & MODEL_PATH_DIR ? "a regular file or a folder" : "a regular file";
}

static bool kind_ok(mode_t mode, unsigned kinds) {
  return ((kinds & MODEL_PATH_FILE) && S_ISREG(mode)) || ((kinds & MODEL_PATH_DIR) && S_ISDIR(mode));
}

int model__path_open(const char *what, const char *path, unsigned kinds, int *fd, struct stat *st) {
  struct stat sb;
  *fd = -1;
  if (stat(path, &sb) != 0) return fr_errorf(-errno, "%s: cannot open %s: %s", what, path, strerror(errno));
  if (!kind_ok(sb.st_mode, kinds)) /* a FIFO or a device is never opened */
    return fr_errorf(FR_EFORMAT, "%s: %s is not %s", what, path, kind_names(kinds));
  int f = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC), fl;
  if (f < 0) return fr_errorf(-errno, "%s: cannot open %s: %s", what, path, strerror(errno));
  int rc = 0;
  if (fstat(f, &sb) != 0) rc = fr_errorf(-errno, "%s: cannot stat %s: %s", what, path, strerror(errno));
  else if (!kind_ok(sb.st_mode, kinds)) rc = fr_errorf(FR_EFORMAT, "%s: %s is not %s", what, path, kind_names(kinds));
  else if ((fl = fcntl(f, F_GETFL)) < 0 || fcntl(f, F_SETFL, fl & ~O_NONBLOCK) != 0)
    rc = fr_errorf(-errno, "%s: %s: %s", what, path, strerror(errno));
  if (rc) {
    close(f);
    return rc;
  }
  *fd = f;
  if (st) *st = sb;
  return 0;
}

/* Reads fd to its end, at most max bytes, into a NUL-terminated buffer. */
static int read_all(const char *what, const char *path, int fd, size_t max, char **out, size_t *len) {
  size_t n = 0, cap = FR_MIN((size_t)65536, max + 2); /* room for max + 1 bytes and the NUL */
  char *buf = fr_malloc(cap);
  int rc = 0;
  for (;;) {
    if (n == cap - 1) { /* full: past max, or grow */
      if (n > max) {
        rc = fr_errorf(FR_ETOOBIG, "%s: %s is larger than %zu bytes", what, path, max);
        break;
      }
      cap = FR_MIN(cap * 2, max + 2);
      buf = fr_realloc(buf, cap);
    }
    ssize_t r = read(fd, buf + n, cap - 1 - n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) rc = fr_errorf(-errno, "%s: cannot read %s: %s", what, path, strerror(errno));
    if (r <= 0) break;
    n += (size_t)r;
  }
  if (rc) {
    free(buf);
    return rc;
  }
  buf[n] = '\0';
  *out = buf;
  if (len) *len = n;
  return 0;
}

int model__file_read(const char *what, const char *path, size_t max, char **out, size_t *len) {
  int fd;
  *out = NULL;
  int rc = model__path_open(what, path, MODEL_PATH_FILE, &fd, NULL);
  if (rc) return rc;
  rc = read_all(what, path, fd, max, out, len);
  close(fd);
  return rc;
}

/* ---- open ------------------------------------------------------------- */

static char *join_path(const char *dir, const char *name) {
  size_t n = strlen(dir) + strlen(name) + 2;
  char *p = fr_malloc(n);
  snprintf(p, n, "%s/%s", dir, name);
  return p;
}

/* True when something is at p (not ENOENT): what it is, the open checks. */
static bool path_exists(const char *p) {
  struct stat sb;
  return stat(p, &sb) == 0 || errno != ENOENT;
}

/* *out = the path of dir/name when something is there (it must be a
 * regular file), NULL when nothing is. */
static int optional_file(const char *dir, const char *name, char **out) {
  char *p = join_path(dir, name);
  int fd, rc = 0;
  *out = NULL;
  if (!path_exists(p)) {
    free(p);
    return 0;
  }
  if ((rc = model__path_open("model", p, MODEL_PATH_FILE, &fd, NULL))) {
    free(p);
    return rc;
  }
  close(fd);
  *out = p;
  return 0;
}

static bool has_suffix(const char *s, const char *suf) {
  size_t n = strlen(s), m = strlen(suf);
  return n >= m && strcmp(s + n - m, suf) == 0;
}

static int open_gguf(model_source_t *s) {
  int rc = model_gguf_open(&s->gguf, s->path);
  if (!rc) rc = model_config_from_gguf(&s->config, s->gguf);
  if (rc) return rc;
  if (!s->config.name[0]) { /* no general.name: the file name without .gguf */
    const char *base = strrchr(s->path, '/') ? strrchr(s->path, '/') + 1 : s->path;
    size_t n = strlen(base);
    if (has_suffix(base, ".gguf")) n -= 5;
    snprintf(s->config.name, sizeof s->config.name, "%.*s", (int)FR_MIN(n, sizeof s->config.name - 1), base);
  }
  s->rope_mode = s->config.arch == MODEL_ARCH_LLAMA ? KERN_ROPE_NORM : KERN_ROPE_NEOX;
  tensors_from_gguf(s);
  return 0;
}

/* A HF model: config.json in dir, weights at st_path (file or folder;
 * NULL: no weights, for --load-format dummy). */
static int open_hf(model_source_t *s, const char *dir, const char *st_path) {
  char *cfg_path = join_path(dir, "config.json");
  int rc = path_exists(cfg_path) ? model_config_from_hf_json(&s->config, cfg_path)
                                 : fr_errorf(FR_ENOTFOUND, "model: %s not found", cfg_path);
  free(cfg_path);
  if (!rc) rc = model_st_pooling(dir, &s->config.pooling);
  if (!rc && st_path) rc = model_quant_read(&s->quant, dir);
  if (!rc && st_path) rc = model_st_open(&s->st, st_path);
  if (!rc) rc = optional_file(dir, "tokenizer.json", &s->tokenizer_json);
  if (!rc) rc = optional_file(dir, "tokenizer_config.json", &s->tokenizer_config_json);
  if (rc) return rc;
  s->rope_mode = KERN_ROPE_NEOX; /* HF weights are rotate-half for every arch */
  return st_path ? tensors_from_st(s) : 0;
}

/* A file (fd, open on s->path): GGUF by its magic, or a .safetensors with
 * config.json beside it. */
static int open_file(model_source_t *s, int fd) {
  char magic[4] = {0};
  ssize_t n = read(fd, magic, sizeof magic);
  if (n == 4 && memcmp(magic, "GGUF", 4) == 0) return open_gguf(s);
  if (!has_suffix(s->path, ".safetensors"))
    return fr_errorf(FR_EFORMAT, "model: %s is neither a GGUF file nor a .safetensors file", s->path);
  char *dir = fr_strdup(s->path), *slash = strrchr(dir, '/');
  if (slash) *slash = 0;
  int rc = open_hf(s, slash ? (dir[0] ? dir : "/") : ".", s->path);
  free(dir);
  return rc;
}

int model_source_open(model_source_t **out, const char *path) {
  struct stat sb;
  int fd;
  *out = NULL;
  int rc = model__path_open("model", path, MODEL_PATH_FILE | MODEL_PATH_DIR, &fd, &sb);
  if (rc) return rc;
  model_source_t *s = fr_calloc(1, sizeof *s);
  s->path = fr_strdup(path);
  rc = S_ISDIR(sb.st_mode) ? open_hf(s, path, path) : open_file(s, fd);
  close(fd);
  if (!rc) rc = sort_tensors(s);
  if (!rc) rc = check_tensors(s);
  if (rc) {
    model_source_close(s);
    return rc;
  }
  *out = s;
  return 0;
}

int model_source_open_config(model_source_t **out, const char *dir) {
  int fd;
  *out = NULL;
  int rc = model__path_open("model", dir, MODEL_PATH_DIR, &fd, NULL);
  if (rc) return rc;
  close(fd);
  model_source_t *s = fr_calloc(1, sizeof *s);
  s->path = fr_strdup(dir);
  rc = open_hf(s, dir, NULL);
  if (rc) {
    model_source_close(s);
    return rc;
  }
  const char *base = strrchr(dir, '/') && strrchr(dir, '/')[1] ? strrchr(dir, '/') + 1 : dir;
  if (!s->config.name[0]) snprintf(s->config.name, sizeof s->config.name, "%s", base);
  *out = s;
  return 0;
}

void model_source_close(model_source_t *s) {
  if (!s) return;
  for (size_t i = 0; i < s->n_tensors; i++) {
    free((char *)s->tensors[i].name);
    if (s->tensors[i].quant) model_quant_close(s->tensors[i].quant); /* perm with it */
    free(s->tensors[i].quant);
    if (s->tensors[i].fp8) model_quant_fp8_close(s->tensors[i].fp8);
    free(s->tensors[i].fp8);
  }
  fr_pool_destroy(s->pool);
  free(s->tensors);
  model_gguf_close(s->gguf);
  model_st_close(s->st);
  free(s->tokenizer_json);
  free(s->tokenizer_config_json);
  free(s->path);
  free(s);
}

const model_tensor_t *model_source_tensor(const model_source_t *s, const char *name) {
  size_t lo = 0, hi = s->n_tensors;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(s->tensors[mid].name, name);
    if (c == 0) return &s->tensors[mid];
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  return NULL;
}

int model_source_read(const model_source_t *s, const model_tensor_t *t, int64_t r0, int64_t nr, int64_t c0, int64_t nc,
                      void *dst) {
  if (t->fp8) return model_quant_fp8_read(t->fp8, r0, nr, c0, nc, s->pool, dst);
  const size_t full = kern_row_bytes(t->type, t->cols), rb = kern_row_bytes(t->type, nc);
  if (t->quant && nc == t->cols) return model_quant_rows(t->quant, r0, nr, s->pool, dst);
  if (t->quant) { /* whole rows, then their column range */
    uint8_t *rows = fr_malloc(full * (size_t)nr);
    int rc = model_quant_rows(t->quant, r0, nr, s->pool, rows);
    for (int64_t r = 0; r < nr && !rc; r++)
      memcpy((uint8_t *)dst + (size_t)r * rb, rows + (size_t)r * full + kern_row_bytes(t->type, c0), rb);
    free(rows);
    return rc;
  }
  const uint8_t *src = (const uint8_t *)t->data + (size_t)r0 * full + kern_row_bytes(t->type, c0);
  for (int64_t r = 0; r < nr; r++) memcpy((uint8_t *)dst + (size_t)r * rb, src + (size_t)r * full, rb);
  return 0;
}
