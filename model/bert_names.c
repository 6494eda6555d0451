/* bert_names.c - a BERT encoder's tensors in a model source: the GGUF
 * names of transformers' BertModel tensors and the shape checks
 * (model/bert.h has the encoder). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "model/source.h"

typedef struct {
  const char *hf, *gguf;
} bert_name_t;

static const bert_name_t bert_globals[] = {
    {"embeddings.word_embeddings.weight", "token_embd.weight"},
    {"embeddings.position_embeddings.weight", "position_embd.weight"},
    {"embeddings.token_type_embeddings.weight", "token_types.weight"},
    {"embeddings.LayerNorm.weight", "token_embd_norm.weight"},
    {"embeddings.LayerNorm.bias", "token_embd_norm.bias"},
    {"embeddings.LayerNorm.gamma", "token_embd_norm.weight"},
    {"embeddings.LayerNorm.beta", "token_embd_norm.bias"},
};

static const bert_name_t bert_layer[] = {
    {"attention.self.query", "attn_q"},          {"attention.self.key", "attn_k"},
    {"attention.self.value", "attn_v"},          {"attention.output.dense", "attn_output"},
    {"attention.output.LayerNorm", "attn_output_norm"}, {"intermediate.dense", "ffn_up"},
    {"output.dense", "ffn_down"},                {"output.LayerNorm", "layer_output_norm"},
};

/* "weight"/"bias" (or the old "gamma"/"beta" of LayerNorms) as GGUF's. */
static const char *bert_suffix(const char *s) {
  if (!strcmp(s, "weight") || !strcmp(s, "gamma")) return "weight";
  if (!strcmp(s, "bias") || !strcmp(s, "beta")) return "bias";
  return NULL;
}

char *model__bert_hf_name(const char *hf) {
  static const char layer[] = "encoder.layer.";
  char buf[96];
  if (!strncmp(hf, "bert.", 5)) hf += 5;
  for (size_t i = 0; i < FR_ARRAY_SIZE(bert_globals); i++)
    if (!strcmp(hf, bert_globals[i].hf)) return fr_strdup(bert_globals[i].gguf);
  if (strncmp(hf, layer, sizeof layer - 1)) return NULL;
  char *end;
  long il = strtol(hf + sizeof layer - 1, &end, 10);
  if (end == hf + sizeof layer - 1 || *end != '.' || il < 0 || il > 100000) return NULL;
  for (size_t i = 0; i < FR_ARRAY_SIZE(bert_layer); i++) {
    size_t n = strlen(bert_layer[i].hf);
    const char *suf = NULL;
    if (!strncmp(end + 1, bert_layer[i].hf, n) && end[1 + n] == '.' && (suf = bert_suffix(end + 2 + n))) {
      snprintf(buf, sizeof buf, "blk.%ld.%s.%s", il, bert_layer[i].gguf, suf);
      return fr_strdup(buf);
    }
  }
  return NULL;
}

static int bert_expect(const model_source_t *s, const char *name, int64_t rows, int64_t cols) {
  const model_tensor_t *t = model_source_tensor(s, name);
  if (!t) return fr_errorf(FR_EFORMAT, "model: tensor %s is missing", name);
  if (t->rows * t->cols != rows * cols || (rows > 1 && t->rows != rows))
    return fr_errorf(FR_EFORMAT, "model: tensor %s has shape %lld x %lld, expected %lld x %lld", name,
                     (long long)t->rows, (long long)t->cols, (long long)rows, (long long)cols);
  return 0;
}

/* A matrix and its bias (a vector of rows). */
static int bert_expect_lin(const model_source_t *s, int il, const char *what, int64_t rows, int64_t cols) {
  char name[96];
  snprintf(name, sizeof name, "blk.%d.%s.weight", il, what);
  int rc = bert_expect(s, name, rows, cols);
  snprintf(name, sizeof name, "blk.%d.%s.bias", il, what);
  return rc ? rc : bert_expect(s, name, 1, rows == 1 ? cols : rows);
}

int model__bert_check_tensors(const model_source_t *s) {
  const model_config_t *c = &s->config;
  const int64_t d = c->dim, q = (int64_t)c->n_heads * c->head_dim;
  if (q != d || c->n_kv_heads != c->n_heads)
    return fr_errorf(FR_EFORMAT, "model: BERT with %d heads of %d in a width of %d", c->n_heads, c->head_dim, c->dim);
  int rc = bert_expect(s, "token_embd.weight", c->vocab_size, d);
  if (!rc) rc = bert_expect(s, "position_embd.weight", c->max_ctx, d);
  if (!rc) rc = bert_expect(s, "token_embd_norm.weight", 1, d);
  if (!rc) rc = bert_expect(s, "token_embd_norm.bias", 1, d);
  const model_tensor_t *tt = model_source_tensor(s, "token_types.weight");
  if (!rc && tt && tt->cols != d) rc = fr_errorf(FR_EFORMAT, "model: token_types.weight is not %lld wide", (long long)d);
  static const char *const sq[] = {"attn_q", "attn_k", "attn_v", "attn_output"};
  static const char *const norms[] = {"attn_output_norm", "layer_output_norm"};
  for (int il = 0; il < c->n_layers && !rc; il++) {
    for (size_t i = 0; i < FR_ARRAY_SIZE(sq) && !rc; i++) rc = bert_expect_lin(s, il, sq[i], d, d);
    for (size_t i = 0; i < FR_ARRAY_SIZE(norms) && !rc; i++) rc = bert_expect_lin(s, il, norms[i], 1, d);
    if (!rc) rc = bert_expect_lin(s, il, "ffn_up", c->ffn_dim, d);
    if (!rc) rc = bert_expect_lin(s, il, "ffn_down", d, c->ffn_dim);
  }
  return rc;
}
