/* cli_inspect.c - `ferrumctl tokenize` and `ferrumctl inspect`: read a
 * model's files without loading weights onto a device. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "ctl/cli.h"
#include "model/chat.h"
#include "model/source.h"
#include "model/tokenizer.h"

static int cli_open_tokenizer(const model_source_t *src, model_tokenizer_t **tok) {
  if (src->gguf) return model_tokenizer_from_gguf(tok, src->gguf);
  if (src->tokenizer_json) return model_tokenizer_from_json_files(tok, src->tokenizer_json, src->tokenizer_config_json);
  return fr_errorf(FR_ENOTFOUND, "%s has no tokenizer", src->path);
}

int cli_cmd_tokenize(int argc, char **argv) {
  const char *model = NULL, *text = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--model") && i + 1 < argc) {
      model = argv[++i];
    } else if (!strcmp(argv[i], "--")) {
      if (i + 2 != argc) break;
      text = argv[i + 1];
      break;
    } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      printf("usage: ferrumctl tokenize [--model PATH] -- TEXT\n");
      return 0;
    } else {
      break;
    }
  }
  if (!text) {
    fprintf(stderr, "usage: ferrumctl tokenize [--model PATH] -- TEXT\n");
    return 2;
  }
  if (!model) model = cli_default_model();
  model_source_t *src = NULL;
  model_tokenizer_t *tok = NULL;
  int32_t *ids = NULL;
  size_t n = 0;
  int rc = model_source_open(&src, model);
  if (!rc) rc = cli_open_tokenizer(src, &tok);
  if (!rc) rc = model_tokenize(tok, text, strlen(text), true, true, &ids, &n);
  if (!rc) {
    putchar('[');
    for (size_t i = 0; i < n; i++) printf(i ? ", %d" : "%d", ids[i]);
    printf("]\n");
  } else {
    fprintf(stderr, "ferrumctl tokenize: %s\n", fr_last_error());
  }
  free(ids);
  model_tokenizer_destroy(tok);
  model_source_close(src);
  return rc ? 1 : 0;
}

static void inspect_config(const model_source_t *src) {
  const model_config_t *c = &src->config;
  static const char *scal[] = {"none", "linear", "llama3"};
  printf("model:        %s\n", src->path);
  printf("format:       %s\n", src->gguf ? "gguf" : "safetensors");
  if (src->quant.method == MODEL_QUANT_FP8 && src->quant.fp8_block[0]) /* docs/QUANTIZED.md */
    printf("quantization: fp8, E4M3 weights with a scale a %d x %d block, decoded into BF16 at load\n",
           src->quant.fp8_block[0], src->quant.fp8_block[1]);
  else if (src->quant.method == MODEL_QUANT_FP8)
    printf("quantization: fp8, E4M3 weights with a scale a tensor or a row, decoded into BF16 at load\n");
  else if (src->quant.method != MODEL_QUANT_NONE)
    printf("quantization: %s, %d bits, group size %d%s (I4G on the CPU)\n", model_quant_name(src->quant.method),
           src->quant.bits, src->quant.group_size,
           src->quant.method == MODEL_QUANT_GPTQ ? (src->quant.zeros_minus_1 ? ", v1 zeros" : ", v2 zeros") : "");
  if (c->name[0]) printf("name:         %s\n", c->name);
  printf("architecture: %s\n", c->arch_name);
  printf("layers:       %d\n", c->n_layers);
  printf("dim:          %d\n", c->dim);
  printf("ffn_dim:      %d\n", c->ffn_dim);
  if (c->n_experts)
    printf("experts:      %d (%d per token, FFN %d, weights %s)\n", c->n_experts, c->n_experts_used,
           c->expert_ffn_dim, c->norm_topk ? "renormalised" : "as routed");
  printf("heads:        %d (kv %d, head_dim %d)\n", c->n_heads, c->n_kv_heads, c->head_dim);
  printf("vocab:        %d\n", c->vocab_size);
  printf("context:      %d\n", c->max_ctx);
  printf("rms_eps:      %g\n", c->norm_eps);
  printf("rope:         theta %g, dims %d, %s, scaling %s", c->rope_theta, c->rope_dim,
         src->rope_mode == KERN_ROPE_NORM ? "interleaved (norm)" : "rotate-half (neox)",
         scal[c->rope_scaling <= MODEL_ROPE_SCALING_LLAMA3 ? c->rope_scaling : 0]);
  if (c->rope_scaling != MODEL_ROPE_SCALING_NONE) printf(" x%g", c->rope_factor);
  printf("\ntied output:  %s\nqkv bias:     %s\nqk norm:      %s\n", c->tied_embeddings ? "yes" : "no",
         c->attn_bias ? "yes" : "no", c->qk_norm ? "yes" : "no");
}

static void inspect_tokenizer(const model_tokenizer_t *tok) {
  printf("tokenizer:    %s (pre %s), %d tokens\n", model_tokenizer_kind(tok) == MODEL_TOK_BPE ? "bpe"
         : model_tokenizer_kind(tok) == MODEL_TOK_WPM ? "wordpiece" : "spm",
         model_tokenizer_pre(tok), model_vocab_size(tok));
  int32_t ids[2] = {model_token_bos(tok), model_token_eos(tok)};
  const char *names[2] = {"bos", "eos"};
  for (int i = 0; i < 2; i++) {
    size_t len = 0;
    const char *b = ids[i] >= 0 ? model_token_bytes(tok, ids[i], &len) : NULL;
    printf("%s:          %d %.*s\n", names[i], ids[i], (int)len, b ? b : "");
  }
  printf("adds bos:     %s\n", model_tokenizer_adds_bos(tok) ? "yes" : "no");
  const char *tmpl = model_tokenizer_chat_template(tok);
  if (!tmpl) printf("chat:         none (serve --chat-template gives one)\n");
  else printf("chat:         Jinja template, %zu bytes (family: %s)\n", strlen(tmpl), model_chat_kind_name(model_chat_detect(tmpl)));
}

static void inspect_tensors(const model_source_t *src) {
  size_t total = 0;
  printf("\n%-40s %-6s %12s %8s\n", "tensor", "type", "rows", "cols");
  for (size_t i = 0; i < src->n_tensors; i++) {
    const model_tensor_t *t = &src->tensors[i];
    const kern_type_traits_t *tr = kern_type_traits(t->type);
    printf("%-40s %-6s %12lld %8lld\n", t->name, tr ? tr->name : "?", (long long)t->rows, (long long)t->cols);
    total += (size_t)t->rows * kern_row_bytes(t->type, t->cols);
  }
  printf("%zu tensors, %.1f MiB\n", src->n_tensors, total / 1048576.0);
}

int cli_cmd_inspect(int argc, char **argv) {
  const char *path = argc >= 2 && argv[1][0] != '-' ? argv[1] : NULL;
  if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
    printf("usage: ferrumctl inspect [PATH]\n");
    return 0;
  }
  if (!path) path = cli_default_model();
  model_source_t *src = NULL;
  model_tokenizer_t *tok = NULL;
  int rc = model_source_open(&src, path);
  if (rc) {
    fprintf(stderr, "ferrumctl inspect: %s\n", fr_last_error());
    return 1;
  }
  inspect_config(src);
  if (cli_open_tokenizer(src, &tok) == 0) {
    inspect_tokenizer(tok);
  } else {
    printf("tokenizer:    none (%s)\n", fr_last_error());
  }
  inspect_tensors(src);
  model_tokenizer_destroy(tok);
  model_source_close(src);
  return 0;
}
