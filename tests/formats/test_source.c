/* test_source.c - model sources (GGUF files, HF folders) and the configs
 * read from GGUF metadata and config.json; the real SmolLM2 file when
 * FERRUM_MODEL names it (run as `test_source smollm2`, 77 when absent). */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "model/source.h"
#include "tests/formats/fx.h"

static model_source_t *open_ok(const char *path) {
  model_source_t *s = NULL;
  int rc = model_source_open(&s, path);
  ck_assert_msg(rc == 0, "%s: %s", path, fr_last_error());
  return s;
}

static void expect_tensor(const model_source_t *s, const char *name, kern_type_t type, int64_t rows, int64_t cols) {
  const model_tensor_t *t = model_source_tensor(s, name);
  ck_assert_msg(t != NULL, "%s missing", name);
  ck_assert_int_eq(t->type, type);
  ck_assert_int_eq(t->rows, rows);
  ck_assert_int_eq(t->cols, cols);
  ck_assert_ptr_nonnull(t->data);
}

/* The shape every tiny fixture shares (make_fixtures.py TINY). */
static void expect_tiny(const model_config_t *c, int head_dim) {
  ck_assert_int_eq(c->n_layers, 2);
  ck_assert_int_eq(c->dim, 64);
  ck_assert_int_eq(c->ffn_dim, 96);
  ck_assert_int_eq(c->n_heads, 4);
  ck_assert_int_eq(c->n_kv_heads, 2);
  ck_assert_int_eq(c->head_dim, head_dim);
  ck_assert_int_eq(c->rope_dim, head_dim);
  ck_assert_int_eq(c->vocab_size, 100);
}

/* ---- GGUF sources ----------------------------------------------------- */

START_TEST(gguf_llama) {
  model_source_t *s = open_ok(fx_path("tiny_llama.gguf"));
  const model_config_t *c = &s->config;
  expect_tiny(c, 16);
  ck_assert_int_eq(c->arch, MODEL_ARCH_LLAMA);
  ck_assert_str_eq(c->arch_name, "llama");
  ck_assert_str_eq(c->name, "tiny-llama");
  ck_assert_int_eq(c->max_ctx, 4096);
  ck_assert_float_eq(c->rope_theta, 500000.0f);
  ck_assert_float_eq(c->norm_eps, 1e-6f);
  ck_assert_int_eq(c->rope_scaling, MODEL_ROPE_SCALING_LINEAR);
  ck_assert_float_eq(c->rope_factor, 4.0f);
  ck_assert(c->tied_embeddings && !c->attn_bias && !c->qk_norm);
  ck_assert_int_eq(c->sliding_window, 0);
  ck_assert_int_eq(c->bos_id, 1);
  ck_assert_int_eq(c->n_eos, 1);
  ck_assert_int_eq(c->eos_ids[0], 2);
  ck_assert_int_eq(s->rope_mode, KERN_ROPE_NORM);
  ck_assert_ptr_nonnull(s->gguf);
  ck_assert_ptr_null(s->st);
  ck_assert_uint_eq(s->n_tensors, 2 + 2 * 9);
  expect_tensor(s, "token_embd.weight", KERN_Q8_0, 100, 64);
  expect_tensor(s, "output_norm.weight", KERN_F32, 1, 64);
  expect_tensor(s, "blk.1.attn_q.weight", KERN_Q4_0, 64, 64);
  expect_tensor(s, "blk.1.attn_k.weight", KERN_Q4_1, 32, 64);
  expect_tensor(s, "blk.0.attn_v.weight", KERN_Q5_0, 32, 64);
  expect_tensor(s, "blk.0.attn_output.weight", KERN_Q5_1, 64, 64);
  expect_tensor(s, "blk.0.ffn_gate.weight", KERN_F16, 96, 64);
  expect_tensor(s, "blk.0.ffn_up.weight", KERN_BF16, 96, 64);
  expect_tensor(s, "blk.1.ffn_down.weight", KERN_Q8_0, 64, 96);
  ck_assert_ptr_null(model_source_tensor(s, "output.weight"));
  /* same bytes as the GGUF reader's */
  ck_assert_ptr_eq(model_source_tensor(s, "blk.1.ffn_down.weight")->data,
                   model_gguf_tensor(s->gguf, "blk.1.ffn_down.weight")->data);
  model_source_close(s);
}
END_TEST

START_TEST(gguf_qwen2_qwen3_llama3) {
  model_source_t *s = open_ok(fx_path("tiny_qwen2.gguf"));
  expect_tiny(&s->config, 16);
  ck_assert_int_eq(s->config.arch, MODEL_ARCH_QWEN2);
  ck_assert(!s->config.tied_embeddings && s->config.attn_bias && !s->config.qk_norm);
  ck_assert_int_eq(s->config.rope_scaling, MODEL_ROPE_SCALING_NONE);
  ck_assert_int_eq(s->rope_mode, KERN_ROPE_NEOX);
  expect_tensor(s, "output.weight", KERN_F16, 100, 64);
  expect_tensor(s, "blk.0.attn_k.bias", KERN_F32, 1, 32);
  model_source_close(s);

  s = open_ok(fx_path("tiny_qwen3.gguf"));
  expect_tiny(&s->config, 32); /* key_length 32 != 64 / 4 */
  ck_assert_int_eq(s->config.arch, MODEL_ARCH_QWEN3);
  ck_assert(s->config.tied_embeddings && !s->config.attn_bias && s->config.qk_norm);
  ck_assert_int_eq(s->rope_mode, KERN_ROPE_NEOX);
  expect_tensor(s, "blk.1.attn_q.weight", KERN_Q4_0, 128, 64);
  expect_tensor(s, "blk.1.attn_output.weight", KERN_Q5_1, 64, 128);
  expect_tensor(s, "blk.1.attn_q_norm.weight", KERN_F32, 1, 32);
  model_source_close(s);

  s = open_ok(fx_path("tiny_llama3.gguf")); /* rope_freqs.weight: scaling stays NONE */
  ck_assert_int_eq(s->config.rope_scaling, MODEL_ROPE_SCALING_NONE);
  ck_assert(!s->config.tied_embeddings);
  expect_tensor(s, "rope_freqs.weight", KERN_F32, 1, 8);
  model_source_close(s);
}
END_TEST

/* Writes bytes to a fresh temp file and returns its path (static buffer). */
static const char *temp_file(const void *p, size_t n, const char *suffix) {
  static char path[256];
  snprintf(path, sizeof path, "/tmp/ferrum-src-XXXXXX%s", suffix);
  int fd = mkstemps(path, (int)strlen(suffix));
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(write(fd, p, n), (ssize_t)n);
  close(fd);
  return path;
}

/* Replaces the first occurrence of m bytes `from` by `to`. */
static void patch(uint8_t *img, size_t n, const char *from, const char *to, size_t m) {
  for (size_t i = 0; i + m <= n; i++) {
    if (memcmp(img + i, from, m) == 0) {
      memcpy(img + i, to, m);
      return;
    }
  }
  ck_abort_msg("'%s' not found", from);
}

static int open_patched_n(const char *fixture, const char *from, const char *to, size_t m) {
  size_t n;
  uint8_t *img = fx_slurp(fx_path(fixture), &n);
  patch(img, n, from, to, m);
  const char *path = temp_file(img, n, ".gguf");
  model_source_t *s = NULL;
  fr_error_clear();
  int rc = model_source_open(&s, path);
  if (rc) ck_assert_ptr_null(s);
  model_source_close(s);
  unlink(path);
  free(img);
  return rc;
}

static int open_patched(const char *fixture, const char *from, const char *to) {
  ck_assert_uint_eq(strlen(from), strlen(to));
  return open_patched_n(fixture, from, to, strlen(from));
}

START_TEST(gguf_missing_or_unsupported) {
  ck_assert_int_eq(open_patched("tiny_llama.gguf", "blk.1.ffn_up.weight", "blk.1.ffn_uq.weight"), FR_EFORMAT);
  ck_assert_ptr_nonnull(strstr(fr_last_error(), "blk.1.ffn_up.weight"));
  ck_assert_int_eq(open_patched("tiny_llama.gguf", "output_norm.weight", "output_norx.weight"), FR_EFORMAT);
  ck_assert_ptr_nonnull(strstr(fr_last_error(), "output_norm.weight is missing"));
  /* qwen2 without one bias: the first missing one is named */
  ck_assert_int_eq(open_patched("tiny_qwen2.gguf", "blk.1.attn_v.bias", "blk.1.attn_v.bia_"), FR_EFORMAT);
  ck_assert_ptr_nonnull(strstr(fr_last_error(), "blk.1.attn_v.bias"));
  ck_assert_int_eq(open_patched_n("tiny_llama.gguf", "\x05\0\0\0\0\0\0\0llama", "\x05\0\0\0\0\0\0\0gemma", 13),
                   FR_EUNSUPPORTED);
  ck_assert_ptr_nonnull(strstr(fr_last_error(), "gemma"));
  ck_assert_int_eq(open_patched("tiny_llama.gguf", "llama.block_count", "llama.block_coun_"), FR_EFORMAT);
  ck_assert_ptr_nonnull(strstr(fr_last_error(), "llama.block_count"));
  /* token_embd renamed: vocab falls back to the (absent) list and fails clearly */
  ck_assert_int_ne(open_patched("tiny_llama.gguf", "token_embd.weight", "token_embx.weight"), 0);
}
END_TEST

/* qwen3moe: config from the expert keys, 3-D expert stacks seen as n_mats
 * stacked matrices. */
START_TEST(gguf_qwen3moe) {
  model_source_t *s = open_ok(fx_path("tiny_qwen3moe.gguf"));
  const model_config_t *c = &s->config;
  expect_tiny(c, 32);
  ck_assert_int_eq(c->arch, MODEL_ARCH_QWEN3MOE);
  ck_assert_str_eq(c->arch_name, "qwen3moe");
  ck_assert(c->qk_norm && c->norm_topk);
  ck_assert_int_eq(c->n_experts, 4);
  ck_assert_int_eq(c->n_experts_used, 2);
  ck_assert_int_eq(c->expert_ffn_dim, 32);
  ck_assert(model_config_layer_moe(c, 0) && model_config_layer_moe(c, 1));
  ck_assert_int_eq(s->rope_mode, KERN_ROPE_NEOX);
  expect_tensor(s, "blk.1.ffn_gate_inp.weight", KERN_F32, 4, 64);
  expect_tensor(s, "blk.1.ffn_gate_exps.weight", KERN_Q8_0, 4 * 32, 64);
  expect_tensor(s, "blk.0.ffn_up_exps.weight", KERN_Q4_0, 4 * 32, 64);
  expect_tensor(s, "blk.0.ffn_down_exps.weight", KERN_F16, 4 * 64, 32);
  ck_assert_int_eq(model_source_tensor(s, "blk.0.ffn_down_exps.weight")->n_mats, 4);
  ck_assert_int_eq(model_source_tensor(s, "blk.0.attn_q.weight")->n_mats, 1);
  ck_assert_ptr_null(model_source_tensor(s, "blk.0.ffn_gate.weight"));
  model_source_close(s);
}
END_TEST

/* Broken MoE files are refused with the key or tensor named. */
START_TEST(gguf_qwen3moe_broken) {
  model_source_t *s = NULL;
  fr_error_clear();
  ck_assert_int_eq(model_source_open(&s, fx_path("tiny_qwen3moe_bad_experts.gguf")), FR_EFORMAT);
  ck_assert_ptr_null(s);
  ck_assert_msg(strstr(fr_last_error(), "blk.1.ffn_up_exps.weight has shape 3 x 32 x 64, expected 4 x 32 x 64"),
                "%s", fr_last_error());
  /* expert_used_count (u32, type 4) 2 -> 9 of 4 experts */
  ck_assert_int_eq(open_patched_n("tiny_qwen3moe.gguf", "expert_used_count\x04\0\0\0\x02\0\0\0",
                                  "expert_used_count\x04\0\0\0\x09\0\0\0", 25),
                   FR_EFORMAT);
  ck_assert_msg(strstr(fr_last_error(), "9 experts used per token is out of range [1, 4 experts]"), "%s",
                fr_last_error());
  ck_assert_int_eq(open_patched("tiny_qwen3moe.gguf", "qwen3moe.expert_count", "qwen3moe.expert_coun_"), FR_EFORMAT);
  ck_assert_ptr_nonnull(strstr(fr_last_error(), "qwen3moe.expert_count is missing"));
  ck_assert_int_eq(open_patched("tiny_qwen3moe.gguf", "blk.1.ffn_gate_inp.weight", "blk.1.ffn_gate_inx.weight"),
                   FR_EFORMAT);
  ck_assert_ptr_nonnull(strstr(fr_last_error(), "blk.1.ffn_gate_inp.weight is missing"));
  ck_assert_int_eq(open_patched("tiny_qwen3moe.gguf", "blk.0.ffn_down_exps.weight", "blk.0.ffn_down_exps.weighx"),
                   FR_EFORMAT);
  ck_assert_ptr_nonnull(strstr(fr_last_error(), "blk.0.ffn_down_exps.weight is missing"));
}
END_TEST

START_TEST(not_a_model) {
  model_source_t *s;
  const char *p = temp_file("hello world", 11, ".txt");
  ck_assert_int_eq(model_source_open(&s, p), FR_EFORMAT);
  ck_assert_ptr_null(s);
  unlink(p);
  ck_assert_int_eq(model_source_open(&s, "/nonexistent/model"), -ENOENT);
  ck_assert_int_eq(model_source_open(&s, "/"), FR_ENOTFOUND); /* a folder without config.json */
}
END_TEST

/* ---- HF sources ------------------------------------------------------- */

START_TEST(hf_llama_folder) {
  model_source_t *s = open_ok(fx_path("hf_llama"));
  const model_config_t *c = &s->config;
  expect_tiny(c, 16);
  ck_assert_int_eq(c->arch, MODEL_ARCH_LLAMA);
  ck_assert_str_eq(c->name, "hf_llama");
  ck_assert_int_eq(c->max_ctx, 2048);
  ck_assert_float_eq(c->norm_eps, 1e-5f);
  ck_assert_float_eq(c->rope_theta, 10000.0f);
  ck_assert_int_eq(c->rope_scaling, MODEL_ROPE_SCALING_LLAMA3);
  ck_assert_float_eq(c->rope_factor, 8.0f);
  ck_assert_float_eq(c->rope_low_freq_factor, 1.0f);
  ck_assert_float_eq(c->rope_high_freq_factor, 4.0f);
  ck_assert_int_eq(c->rope_orig_ctx, 8192);
  ck_assert(!c->tied_embeddings && !c->attn_bias && !c->qk_norm);
  ck_assert_int_eq(s->rope_mode, KERN_ROPE_NEOX);
  ck_assert_ptr_nonnull(s->tokenizer_json);
  ck_assert_ptr_nonnull(strstr(s->tokenizer_json, "hf_llama/tokenizer.json"));
  ck_assert_ptr_null(s->tokenizer_config_json);
  ck_assert_uint_eq(s->n_tensors, 3 + 2 * 9); /* rotary inv_freq skipped */
  expect_tensor(s, "token_embd.weight", KERN_BF16, 100, 64);
  expect_tensor(s, "output.weight", KERN_BF16, 100, 64);
  expect_tensor(s, "output_norm.weight", KERN_BF16, 1, 64);
  expect_tensor(s, "blk.1.attn_k.weight", KERN_F16, 32, 64);
  expect_tensor(s, "blk.1.attn_v.weight", KERN_F32, 32, 64);
  expect_tensor(s, "blk.0.ffn_down.weight", KERN_BF16, 64, 96);
  ck_assert_ptr_eq(model_source_tensor(s, "blk.0.attn_q.weight")->data,
                   model_st_tensor(s->st, "model.layers.0.self_attn.q_proj.weight")->data);
  model_source_close(s);

  /* the same weights through the .safetensors path */
  s = open_ok(fx_path("hf_llama/model.safetensors"));
  ck_assert_uint_eq(s->n_tensors, 3 + 2 * 9);
  model_source_close(s);
}
END_TEST

START_TEST(hf_qwen_folders) {
  model_source_t *s = open_ok(fx_path("hf_qwen2")); /* sharded */
  expect_tiny(&s->config, 16);
  ck_assert_int_eq(s->config.arch, MODEL_ARCH_QWEN2);
  ck_assert(s->config.tied_embeddings && s->config.attn_bias && !s->config.qk_norm);
  ck_assert_int_eq(s->config.sliding_window, 0); /* use_sliding_window false */
  ck_assert_int_eq(s->config.n_eos, 2);
  ck_assert_int_eq(s->config.eos_ids[1], 3);
  expect_tensor(s, "blk.1.attn_q.bias", KERN_BF16, 1, 64);
  ck_assert_ptr_null(model_source_tensor(s, "output.weight"));
  model_source_close(s);

  s = open_ok(fx_path("hf_qwen3"));
  expect_tiny(&s->config, 32);
  ck_assert_int_eq(s->config.arch, MODEL_ARCH_QWEN3);
  ck_assert(s->config.qk_norm && !s->config.attn_bias);
  expect_tensor(s, "blk.0.attn_q.weight", KERN_BF16, 128, 64);
  expect_tensor(s, "blk.0.attn_k_norm.weight", KERN_BF16, 1, 32);
  model_source_close(s);
}
END_TEST

/* HF Qwen3-MoE: one tensor per expert, layer 0 dense (mlp_only_layers). */
START_TEST(hf_qwen3moe_folder) {
  model_source_t *s = open_ok(fx_path("hf_qwen3moe"));
  const model_config_t *c = &s->config;
  ck_assert_int_eq(c->arch, MODEL_ARCH_QWEN3MOE);
  ck_assert(c->norm_topk && c->qk_norm);
  ck_assert(!model_config_layer_moe(c, 0) && model_config_layer_moe(c, 1));
  expect_tensor(s, "blk.0.ffn_gate.weight", KERN_BF16, 96, 64);
  expect_tensor(s, "blk.1.ffn_gate_inp.weight", KERN_BF16, 4, 64);
  expect_tensor(s, "blk.1.ffn_up_exps.3.weight", KERN_BF16, 32, 64);
  expect_tensor(s, "blk.1.ffn_down_exps.0.weight", KERN_BF16, 64, 32);
  ck_assert_int_eq(model_source_tensor(s, "blk.1.ffn_down_exps.0.weight")->n_mats, 1);
  ck_assert_ptr_null(model_source_tensor(s, "blk.1.ffn_gate.weight"));
  model_source_close(s);
}
END_TEST

/* A folder with a given config.json and the weights of fixture folder `weights`. */
static int open_with_config_of(const char *weights, const char *config) {
  char dir[] = "/tmp/ferrum-hf-XXXXXX", p[64], w[64];
  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(p, sizeof p, "%s/config.json", dir);
  FILE *f = fopen(p, "w");
  fputs(config, f);
  fclose(f);
  snprintf(w, sizeof w, "%s/model.safetensors", dir);
  char src[256];
  snprintf(src, sizeof src, "%s/model.safetensors", weights);
  ck_assert_int_eq(symlink(fx_path(src), w), 0);
  model_source_t *s = NULL;
  fr_error_clear();
  int rc = model_source_open(&s, dir);
  model_source_close(s);
  unlink(w);
  unlink(p);
  rmdir(dir);
  return rc;
}

/* A folder with a given config.json and hf_llama's weights. */
static int open_with_config(const char *config) { return open_with_config_of("hf_llama", config); }

#define HF_BASE                                                                                          \
  "\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"num_hidden_layers\":2,"                 \
  "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"vocab_size\":100"

START_TEST(hf_misshaped) {
  ck_assert_int_eq(open_with_config("{" HF_BASE ",\"intermediate_size\":96}"), 0);
  ck_assert_int_eq(open_with_config("{" HF_BASE ",\"intermediate_size\":128}"), FR_EFORMAT);
  ck_assert_ptr_nonnull(strstr(fr_last_error(), "blk.0.ffn_gate.weight has shape 96 x 64, expected 128 x 64"));
  ck_assert_int_eq(open_with_config("{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,"
                                    "\"num_hidden_layers\":3,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
                                    "\"vocab_size\":100,\"intermediate_size\":96}"),
                   FR_EFORMAT);
  ck_assert_msg(strstr(fr_last_error(), "blk.2.attn_norm.weight is missing"), "%s", fr_last_error());
  ck_assert_int_eq(open_with_config("{" HF_BASE ",\"intermediate_size\":96,\"attention_bias\":true}"), FR_EFORMAT);
  ck_assert_ptr_nonnull(strstr(fr_last_error(), "blk.0.attn_q.bias"));
  ck_assert_int_eq(open_with_config("{\"architectures\":[\"GemmaForCausalLM\"]}"), FR_EUNSUPPORTED);
}
END_TEST

/* hf_qwen3moe's weights under configs they do not fit: what is missing or
 * misshaped is named. */
START_TEST(hf_qwen3moe_misshaped) {
  /* the config asks for a 5th expert, or a sparse layer 0: what is missing is named */
  static const char cfg[] = "{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":96,"
                            "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
                            "\"head_dim\":32,\"vocab_size\":100,\"tie_word_embeddings\":true,\"num_experts_per_tok\":2,"
                            "\"moe_intermediate_size\":32,";
  char json[1024];
  snprintf(json, sizeof json, "%s\"num_experts\":5,\"mlp_only_layers\":[0]}", cfg);
  ck_assert_int_eq(open_with_config_of("hf_qwen3moe", json), FR_EFORMAT);
  ck_assert_msg(strstr(fr_last_error(), "blk.1.ffn_gate_inp.weight has shape 4 x 64, expected 5 x 64"), "%s",
                fr_last_error());
  snprintf(json, sizeof json, "%s\"num_experts\":4}", cfg);
  ck_assert_int_eq(open_with_config_of("hf_qwen3moe", json), FR_EFORMAT);
  ck_assert_msg(strstr(fr_last_error(), "blk.0.ffn_gate_inp.weight is missing"), "%s", fr_last_error());
}
END_TEST

/* ---- config.json parsing ---------------------------------------------- */

static int hf_cfg(model_config_t *c, const char *json) {
  fr_error_clear();
  return model_config_from_hf_json_buf(c, json, strlen(json));
}

#define HF_Q2 "{\"architectures\":[\"Qwen2ForCausalLM\"],\"hidden_size\":896,\"intermediate_size\":4864," \
  "\"num_hidden_layers\":24,\"num_attention_heads\":14,\"num_key_value_heads\":2,\"vocab_size\":151936," \
  "\"max_position_embeddings\":32768,\"rms_norm_eps\":1e-06,\"rope_theta\":1000000.0,"

START_TEST(hf_config_fields) {
  model_config_t c;
  ck_assert_int_eq(hf_cfg(&c, HF_Q2 "\"tie_word_embeddings\":true,\"eos_token_id\":151645,\"bos_token_id\":null,"
                                    "\"use_sliding_window\":false,\"sliding_window\":32768}"), 0);
  ck_assert_int_eq(c.arch, MODEL_ARCH_QWEN2);
  ck_assert_int_eq(c.head_dim, 64);
  ck_assert_int_eq(c.max_ctx, 32768);
  ck_assert_float_eq(c.rope_theta, 1e6f);
  ck_assert_float_eq(c.norm_eps, 1e-6f);
  ck_assert(c.tied_embeddings && c.attn_bias);
  ck_assert_int_eq(c.sliding_window, 0);
  ck_assert_int_eq(c.n_eos, 1);
  ck_assert_int_eq(c.eos_ids[0], 151645);
  ck_assert_int_eq(c.bos_id, -1);
  ck_assert_int_eq(hf_cfg(&c, HF_Q2 "\"use_sliding_window\":true,\"sliding_window\":4096}"), 0);
  ck_assert_int_eq(c.sliding_window, 4096);
  ck_assert_int_eq(c.swa_first_layer, 28); /* Qwen2's max_window_layers default: layers 28.. use the window */
  ck_assert(!c.tied_embeddings); /* transformers' default */
  ck_assert_int_eq(hf_cfg(&c, HF_Q2 "\"use_sliding_window\":true,\"sliding_window\":4096,"
                                    "\"max_window_layers\":1}"), 0);
  ck_assert_int_eq(c.swa_first_layer, 1);
  /* Qwen3: explicit head_dim, q/k norms, attention_bias false */
  ck_assert_int_eq(hf_cfg(&c, "{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":1024,"
                              "\"intermediate_size\":3072,\"num_hidden_layers\":28,\"num_attention_heads\":16,"
                              "\"num_key_value_heads\":8,\"head_dim\":128,\"vocab_size\":151936,"
                              "\"attention_bias\":false,\"tie_word_embeddings\":true,\"eos_token_id\":[1,2,3]}"), 0);
  ck_assert_int_eq(c.arch, MODEL_ARCH_QWEN3);
  ck_assert_int_eq(c.head_dim, 128);
  ck_assert(c.qk_norm && !c.attn_bias && c.tied_embeddings);
  ck_assert_int_eq(c.n_eos, 3);
  /* Mistral's window has no flag; Llama ignores a stray one; model_type fallback */
  ck_assert_int_eq(hf_cfg(&c, "{\"architectures\":[\"MistralForCausalLM\"],\"hidden_size\":64,"
                              "\"intermediate_size\":96,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
                              "\"vocab_size\":100,\"sliding_window\":4096}"), 0);
  ck_assert_int_eq(c.arch, MODEL_ARCH_LLAMA);
  ck_assert_int_eq(c.sliding_window, 4096);
  ck_assert_int_eq(c.swa_first_layer, 0); /* every layer */
  ck_assert_int_eq(c.n_kv_heads, 4);
  ck_assert_int_eq(hf_cfg(&c, "{" HF_BASE ",\"intermediate_size\":96,\"sliding_window\":4096,\"head_dim\":null}"), 0);
  ck_assert_int_eq(c.sliding_window, 0);
  ck_assert_int_eq(c.head_dim, 16);
  ck_assert(!c.tied_embeddings);
  ck_assert_float_eq(c.norm_eps, 1e-6f);
  ck_assert_float_eq(c.rope_theta, 10000.0f);
  /* ids outside the vocabulary are ignored */
  ck_assert_int_eq(hf_cfg(&c, "{" HF_BASE ",\"intermediate_size\":96,\"eos_token_id\":[100,5,-1],\"bos_token_id\":100}"), 0);
  ck_assert_int_eq(c.n_eos, 1);
  ck_assert_int_eq(c.eos_ids[0], 5);
  ck_assert_int_eq(c.bos_id, -1);
  ck_assert_int_eq(hf_cfg(&c, "{\"model_type\":\"qwen3\",\"hidden_size\":64,\"intermediate_size\":96,"
                              "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"vocab_size\":100}"), 0);
  ck_assert_int_eq(c.arch, MODEL_ARCH_QWEN3);
}
END_TEST

START_TEST(hf_config_rope) {
  model_config_t c;
  ck_assert_int_eq(hf_cfg(&c, "{" HF_BASE ",\"intermediate_size\":96,\"rope_scaling\":{\"type\":\"linear\",\"factor\":2}}"), 0);
  ck_assert_int_eq(c.rope_scaling, MODEL_ROPE_SCALING_LINEAR);
  ck_assert_float_eq(c.rope_factor, 2.0f);
  ck_assert_int_eq(hf_cfg(&c, "{" HF_BASE ",\"intermediate_size\":96,\"rope_scaling\":null}"), 0);
  ck_assert_int_eq(c.rope_scaling, MODEL_ROPE_SCALING_NONE);
  /* newer transformers: rope_parameters carries theta and the scaling */
  ck_assert_int_eq(hf_cfg(&c, "{" HF_BASE ",\"intermediate_size\":96,\"rope_parameters\":{\"rope_type\":\"llama3\","
                              "\"rope_theta\":500000.0,\"factor\":32.0,\"low_freq_factor\":1.0,"
                              "\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192}}"), 0);
  ck_assert_int_eq(c.rope_scaling, MODEL_ROPE_SCALING_LLAMA3);
  ck_assert_float_eq(c.rope_factor, 32.0f);
  ck_assert_float_eq(c.rope_theta, 500000.0f);
  ck_assert_int_eq(hf_cfg(&c, "{" HF_BASE ",\"intermediate_size\":96,\"rope_parameters\":{\"rope_type\":\"default\","
                              "\"rope_theta\":1000.0}}"), 0);
  ck_assert_int_eq(c.rope_scaling, MODEL_ROPE_SCALING_NONE);
  ck_assert_float_eq(c.rope_theta, 1000.0f);
  ck_assert_int_eq(hf_cfg(&c, "{" HF_BASE ",\"intermediate_size\":96,\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4}}"),
                   FR_EUNSUPPORTED);
  ck_assert_ptr_nonnull(strstr(fr_last_error(), "yarn"));
  ck_assert_int_eq(hf_cfg(&c, "{" HF_BASE ",\"intermediate_size\":96,\"rope_scaling\":{\"type\":\"dynamic\",\"factor\":4}}"),
                   FR_EUNSUPPORTED);
  ck_assert_int_eq(hf_cfg(&c, "{" HF_BASE ",\"intermediate_size\":96,\"rope_scaling\":{\"type\":\"linear\"}}"), FR_EFORMAT);
  ck_assert_int_eq(hf_cfg(&c, "{" HF_BASE ",\"intermediate_size\":96,\"rope_scaling\":{\"type\":\"linear\",\"factor\":-1}}"),
                   FR_EFORMAT);
  ck_assert_int_eq(hf_cfg(&c, "{" HF_BASE ",\"intermediate_size\":96,\"rope_scaling\":7}"), FR_EFORMAT);
}
END_TEST

/* Qwen3MoeForCausalLM with 4 layers; the expert keys follow. */
#define HF_MOE "{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":96," \
  "\"num_hidden_layers\":4,\"num_attention_heads\":4,\"num_key_value_heads\":2,\"vocab_size\":100,"

START_TEST(hf_config_moe) {
  model_config_t c;
  ck_assert_int_eq(hf_cfg(&c, HF_MOE "\"num_experts\":8,\"num_experts_per_tok\":2,\"moe_intermediate_size\":32}"), 0);
  ck_assert_int_eq(c.arch, MODEL_ARCH_QWEN3MOE);
  ck_assert(c.qk_norm && !c.norm_topk); /* transformers' default */
  ck_assert_int_eq(c.n_experts, 8);
  ck_assert_int_eq(c.n_experts_used, 2);
  ck_assert_int_eq(c.expert_ffn_dim, 32);
  ck_assert_int_eq(c.ffn_dim, 96);
  for (int il = 0; il < 4; il++) ck_assert(model_config_layer_moe(&c, il));
  /* sparse every 2nd layer (1 and 3), layer 3 kept dense: only layer 1 */
  ck_assert_int_eq(hf_cfg(&c, HF_MOE "\"num_experts\":8,\"num_experts_per_tok\":2,\"moe_intermediate_size\":32,"
                              "\"norm_topk_prob\":true,\"decoder_sparse_step\":2,\"mlp_only_layers\":[3]}"), 0);
  ck_assert(c.norm_topk);
  ck_assert(!model_config_layer_moe(&c, 0) && model_config_layer_moe(&c, 1));
  ck_assert(!model_config_layer_moe(&c, 2) && !model_config_layer_moe(&c, 3));
  /* dense archs have no experts */
  ck_assert_int_eq(hf_cfg(&c, HF_Q2 "\"num_experts\":8}"), 0);
  ck_assert_int_eq(c.n_experts, 0);
  ck_assert(!model_config_layer_moe(&c, 0));
}
END_TEST

START_TEST(hf_config_errors) {
  model_config_t c;
  static const struct {
    const char *json;
    int rc;
    const char *in_msg;
  } cases[] = {
      {"{\"architectures\":[\"GemmaForCausalLM\"]}", FR_EUNSUPPORTED, "GemmaForCausalLM"},
      {"{}", FR_EUNSUPPORTED, "(none)"},
      {"[]", FR_EFORMAT, "config.json"},
      {"{\"architectures\":", FR_EFORMAT, "config.json"},
      {"{\"architectures\":[\"LlamaForCausalLM\"]}", FR_EFORMAT, "num_hidden_layers"},
      {"{" HF_BASE ",\"intermediate_size\":\"96\"}", FR_EFORMAT, "intermediate_size"},
      {"{" HF_BASE ",\"intermediate_size\":96.5}", FR_EFORMAT, "intermediate_size"},
      {"{" HF_BASE ",\"intermediate_size\":-96}", FR_EFORMAT, "intermediate_size"},
      {"{" HF_BASE ",\"intermediate_size\":99999999999}", FR_EFORMAT, "intermediate_size"},
      {"{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"num_hidden_layers\":2,\"vocab_size\":100,"
       "\"num_attention_heads\":4,\"num_key_value_heads\":3,\"intermediate_size\":96}", FR_EFORMAT, "kv heads"},
      {"{" HF_BASE ",\"intermediate_size\":96,\"eos_token_id\":\"2\"}", FR_EFORMAT, "eos_token_id"},
      {"{" HF_BASE ",\"intermediate_size\":96,\"eos_token_id\":[1,\"x\"]}", FR_EFORMAT, "eos_token_id"},
      {"{" HF_BASE ",\"intermediate_size\":96,\"tie_word_embeddings\":1}", FR_EFORMAT, "tie_word_embeddings"},
      {"{" HF_BASE ",\"intermediate_size\":96,\"hidden_act\":\"gelu\"}", FR_EUNSUPPORTED, "hidden_act"},
      {"{" HF_BASE ",\"intermediate_size\":96,\"mlp_bias\":true}", FR_EUNSUPPORTED, "mlp_bias"},
      {"{" HF_BASE ",\"intermediate_size\":96,\"rms_norm_eps\":0}", FR_EFORMAT, "epsilon"},
      {"{" HF_BASE ",\"intermediate_size\":96,\"rope_theta\":\"x\"}", FR_EFORMAT, "rope_theta"},
      {"{" HF_BASE ",\"intermediate_size\":96,\"head_dim\":15}", FR_EFORMAT, "even"},
      {"{" HF_BASE ",\"intermediate_size\":96,\"a\":1,\"a\":2}", FR_EFORMAT, "duplicate"},
      {HF_MOE "\"num_experts\":8,\"num_experts_per_tok\":9,\"moe_intermediate_size\":32}", FR_EFORMAT,
       "9 experts used per token is out of range [1, 8 experts]"},
      {HF_MOE "\"num_experts\":8,\"num_experts_per_tok\":2}", FR_EFORMAT, "moe_intermediate_size"},
      {HF_MOE "\"num_experts\":8,\"num_experts_per_tok\":2,\"moe_intermediate_size\":32,\"mlp_only_layers\":[4]}",
       FR_EFORMAT, "mlp_only_layers[0]"},
      {HF_MOE "\"num_experts\":8,\"num_experts_per_tok\":2,\"moe_intermediate_size\":32,\"mlp_only_layers\":1}",
       FR_EFORMAT, "mlp_only_layers"},
      {HF_MOE "\"num_experts\":4096,\"num_experts_per_tok\":2,\"moe_intermediate_size\":32}", FR_EFORMAT,
       "num_experts"},
  };
  for (size_t i = 0; i < FR_ARRAY_SIZE(cases); i++) {
    int rc = hf_cfg(&c, cases[i].json);
    ck_assert_msg(rc == cases[i].rc, "case %zu: rc %d (%s)", i, rc, fr_last_error());
    ck_assert_msg(strstr(fr_last_error(), cases[i].in_msg), "case %zu: '%s' lacks '%s'", i, fr_last_error(),
                  cases[i].in_msg);
  }
}
END_TEST

/* FP8 quantization configs (docs/QUANTIZED.md, "FP8 checkpoints"): the
 * layouts vLLM, llm-compressor and transformers write, and what is refused. */
#define CT_W(w) "{\"quant_method\":\"compressed-tensors\",\"format\":\"float-quantized\",\"config_groups\":" \
                "{\"group_0\":{\"targets\":[\"Linear\"],\"weights\":{" w "}}}}"

START_TEST(quant_fp8_configs) {
  static const struct {
    const char *json;
    int block_rows, block_cols;
  } good[] = {
      {"{\"quant_method\":\"fp8\",\"activation_scheme\":\"static\"}", 0, 0},
      {"{\"quant_method\":\"fp8\",\"activation_scheme\":\"dynamic\",\"fmt\":\"e4m3\","
       "\"weight_block_size\":[128,128]}", 128, 128},
      {"{\"quant_method\":\"FP8\",\"weight_block_size\":null,\"ignored_layers\":[\"lm_head\"]}", 0, 0},
      {CT_W("\"num_bits\":8,\"type\":\"float\",\"strategy\":\"channel\",\"symmetric\":true"), 0, 0},
      {CT_W("\"num_bits\":8,\"type\":\"float\",\"strategy\":\"tensor\""), 0, 0},
      {CT_W("\"num_bits\":8,\"type\":\"float\",\"strategy\":\"block\",\"block_structure\":[64,32]"), 64, 32},
  };
  for (size_t i = 0; i < FR_ARRAY_SIZE(good); i++) {
    model_quant_t q;
    int rc = model_quant_parse(&q, good[i].json, strlen(good[i].json));
    ck_assert_msg(rc == 0, "good %zu: %s", i, fr_last_error());
    ck_assert_int_eq(q.method, MODEL_QUANT_FP8);
    ck_assert_int_eq(q.bits, 8);
    ck_assert_int_eq(q.fp8_block[0], good[i].block_rows);
    ck_assert_int_eq(q.fp8_block[1], good[i].block_cols);
  }
  static const struct {
    const char *json;
    int rc;
    const char *in_msg;
  } bad[] = {
      {"{\"quant_method\":\"fp8\",\"fmt\":\"e5m2\"}", FR_EUNSUPPORTED, "fmt e5m2"},
      {"{\"quant_method\":\"fp8\",\"activation_scheme\":\"smooth\"}", FR_EUNSUPPORTED, "activation_scheme smooth"},
      {"{\"quant_method\":\"fp8\",\"weight_block_size\":[128]}", FR_EFORMAT, "weight_block_size"},
      {"{\"quant_method\":\"fp8\",\"weight_block_size\":[0,128]}", FR_EFORMAT, "weight_block_size"},
      {"{\"quant_method\":\"fp8\",\"weight_block_size\":[128,\"x\"]}", FR_EFORMAT, "weight_block_size"},
      {CT_W("\"num_bits\":4,\"type\":\"int\",\"strategy\":\"group\",\"group_size\":128"), FR_EUNSUPPORTED,
       "4-bit int"},
      {CT_W("\"num_bits\":8,\"type\":\"int\",\"strategy\":\"channel\""), FR_EUNSUPPORTED, "8-bit int"},
      {CT_W("\"num_bits\":8,\"type\":\"float\",\"strategy\":\"channel\",\"symmetric\":false"),
       FR_EUNSUPPORTED, "asymmetric"},
      {CT_W("\"num_bits\":8,\"type\":\"float\",\"strategy\":\"group\""), FR_EUNSUPPORTED, "strategy group"},
      {CT_W("\"num_bits\":8,\"type\":\"float\",\"strategy\":\"block\""), FR_EFORMAT, "block_structure"},
      {CT_W("\"num_bits\":\"8\",\"type\":\"float\""), FR_EFORMAT, "num_bits"},
      {"{\"quant_method\":\"compressed-tensors\",\"format\":\"pack-quantized\",\"config_groups\":{}}",
       FR_EUNSUPPORTED, "format pack-quantized"},
      {"{\"quant_method\":\"compressed-tensors\",\"config_groups\":{}}", FR_EFORMAT, "without config_groups"},
      {"{\"quant_method\":\"compressed-tensors\",\"config_groups\":{\"g\":{\"weights\":null}}}", FR_EFORMAT,
       "config_groups.g has no weights"},
      {"{\"quant_method\":\"compressed-tensors\",\"config_groups\":{"
       "\"a\":{\"weights\":{\"num_bits\":8,\"type\":\"float\",\"strategy\":\"block\",\"block_structure\":[128,128]}},"
       "\"b\":{\"weights\":{\"num_bits\":8,\"type\":\"float\",\"strategy\":\"block\",\"block_structure\":[64,64]}}}}",
       FR_EUNSUPPORTED, "different block structures"},
      {"{\"quant_method\":\"bitsandbytes\"}", FR_EUNSUPPORTED, "compressed-tensors FP8 are"},
  };
  for (size_t i = 0; i < FR_ARRAY_SIZE(bad); i++) {
    model_quant_t q;
    int rc = model_quant_parse(&q, bad[i].json, strlen(bad[i].json));
    ck_assert_msg(rc == bad[i].rc, "bad %zu: rc %d (%s)", i, rc, fr_last_error());
    ck_assert_msg(strstr(fr_last_error(), bad[i].in_msg), "bad %zu: '%s' lacks '%s'", i, fr_last_error(),
                  bad[i].in_msg);
  }
}
END_TEST

/* An FP8 layer of rows x cols made by hand: byte (r, k) = (r * 7 + k) %
 * 126 (no NaN), scale (i, j) = 1 + i + j / 8, blocks of (br, bc). */
static model_fp8_layer_t fp8_layer(int64_t rows, int64_t cols, int64_t br, int64_t bc) {
  model_fp8_layer_t l = {.base = "t", .rows = rows, .cols = cols, .block_rows = br, .block_cols = bc,
                         .scale_cols = (cols + bc - 1) / bc};
  uint8_t *b = fr_malloc((size_t)(rows * cols));
  for (int64_t r = 0; r < rows; r++)
    for (int64_t k = 0; k < cols; k++) b[r * cols + k] = (uint8_t)((r * 7 + k) % 126);
  l.bytes = b;
  const int64_t sr = (rows + br - 1) / br;
  l.scales = fr_malloc((size_t)(sr * l.scale_cols) * sizeof(float));
  for (int64_t i = 0; i < sr; i++)
    for (int64_t j = 0; j < l.scale_cols; j++) l.scales[i * l.scale_cols + j] = 1.f + (float)i + (float)j / 8;
  return l;
}

/* Packs a part of l in form and checks its bytes against the layer's. */
static float *fp8_pack_ok(const model_fp8_layer_t *l, kern_type_t form, int64_t r0, int64_t nr, int64_t c0,
                          int64_t nc) {
  ck_assert_int_eq(model_quant_fp8_form(l, r0, nr, c0, nc), form);
  uint8_t *q = fr_malloc((size_t)(nr * nc));
  float *s = fr_malloc(kern_f8_scale_bytes(form, nr, nc));
  int rc = model_quant_fp8_pack(l, form, r0, nr, c0, nc, NULL, q, s);
  ck_assert_msg(rc == 0, "%s", fr_last_error());
  for (int64_t r = 0; r < nr; r++)
    ck_assert(!memcmp(q + r * nc, l->bytes + (r0 + r) * l->cols + c0, (size_t)nc));
  free(q);
  return s;
}

static void fp8_layer_free(model_fp8_layer_t *l) {
  free((void *)l->bytes);
  free(l->scales);
}

/* An FP8 checkpoint's parts as a backend that keeps FP8 takes them
 * (model_quant_fp8_form / _pack, KERN_F8R and KERN_F8B in kern_types.h). */
START_TEST(quant_fp8_pack) {
  /* a scale a row, and one for the tensor: KERN_F8R for any part, a row's scale in its slot */
  model_fp8_layer_t row = fp8_layer(6, 48, 1, 48), ten = fp8_layer(6, 48, 6, 48);
  float *s = fp8_pack_ok(&row, KERN_F8R, 1, 3, 16, 32);
  for (int r = 0; r < 3; r++) ck_assert_float_eq(s[r], row.scales[1 + r]);
  free(s);
  s = fp8_pack_ok(&ten, KERN_F8R, 2, 4, 0, 48);
  for (int r = 0; r < 4; r++) ck_assert_float_eq(s[r], ten.scales[0]);
  free(s);
  /* 128 x 128 blocks: KERN_F8B for whole blocks, their scales in rows of kern_f8b_scale_cols (4 here) */
  model_fp8_layer_t blk = fp8_layer(256, 640, 128, 128);
  s = fp8_pack_ok(&blk, KERN_F8B, 128, 128, 128, 384);
  ck_assert_int_eq(kern_f8b_scale_cols(384), 4);
  const float want[4] = {blk.scales[5 + 1], blk.scales[5 + 2], blk.scales[5 + 3], 0.f};
  ck_assert(!memcmp(s, want, sizeof want));
  free(s);
  s = fp8_pack_ok(&blk, KERN_F8B, 0, 256, 0, 640);
  ck_assert_float_eq(s[8 + 4], blk.scales[5 + 4]);
  ck_assert_float_eq(s[8 + 5], 0.f);
  free(s);
  /* parts that cut blocks, and other blocks, are decoded instead */
  ck_assert_int_eq(model_quant_fp8_form(&blk, 64, 128, 0, 640), KERN_BF16);
  ck_assert_int_eq(model_quant_fp8_form(&blk, 0, 256, 0, 320), KERN_BF16);
  model_fp8_layer_t odd = fp8_layer(96, 160, 48, 80);
  ck_assert_int_eq(model_quant_fp8_form(&odd, 0, 96, 0, 160), KERN_BF16);
  uint8_t q[96 * 160];
  float sc[96];
  ck_assert_int_eq(model_quant_fp8_pack(&odd, KERN_F8R, 0, 96, 0, 160, NULL, q, sc), -EINVAL);
  /* a NaN byte in the part is an error; outside it, not */
  ((uint8_t *)row.bytes)[4 * 48 + 40] = 0xff;
  ck_assert_int_eq(model_quant_fp8_pack(&row, KERN_F8R, 1, 3, 16, 24, NULL, q, sc), 0);
  ck_assert_int_eq(model_quant_fp8_pack(&row, KERN_F8R, 1, 4, 16, 32, NULL, q, sc), FR_EFORMAT);
  ck_assert_msg(strstr(fr_last_error(), "t.weight[4, 40] is NaN"), "%s", fr_last_error());
  fp8_layer_free(&row), fp8_layer_free(&ten), fp8_layer_free(&blk), fp8_layer_free(&odd);
}
END_TEST

/* A GPTQ/AWQ layer's rows as the loader reads a rank's part
 * (model_quant_rows: repacked on demand, from any row, AWQ's 8-column words
 * cut too) are the rows of the whole layer's repacking, bit for bit. */
START_TEST(quant_rows_parts) {
  model_st_t *st;
  ck_assert_msg(model_st_open(&st, fx_path("st_gptq.safetensors")) == 0, "%s", fr_last_error());
  const struct {
    const char *base;
    model_quant_t q;
  } layers[] = {{"gptq", {.method = MODEL_QUANT_GPTQ, .bits = 4, .group_size = 32}},
                {"awq", {.method = MODEL_QUANT_AWQ, .bits = 4, .group_size = 32}}};
  const int64_t parts[][2] = {{0, 16}, {3, 5}, {8, 8}, {15, 1}, {1, 14}};
  for (size_t i = 0; i < FR_ARRAY_SIZE(layers); i++) {
    model_quant_weight_t whole;
    ck_assert_msg(model_quant_repack(&layers[i].q, st, layers[i].base, &whole) == 0, "%s", fr_last_error());
    model_quant_layer_t l;
    ck_assert_int_eq(model_quant_open(&layers[i].q, st, layers[i].base, &l), 0);
    ck_assert(l.out == whole.rows && l.in == whole.cols && !l.perm == !whole.perm);
    if (l.perm) ck_assert(!memcmp(l.perm, whole.perm, (size_t)l.in * sizeof *l.perm));
    const size_t rb = kern_row_bytes(KERN_I4G, l.in);
    for (size_t p = 0; p < FR_ARRAY_SIZE(parts); p++) {
      uint8_t *got = fr_malloc(rb * (size_t)parts[p][1]);
      ck_assert_int_eq(model_quant_rows(&l, parts[p][0], parts[p][1], NULL, got), 0);
      ck_assert_msg(!memcmp(got, whole.data + (size_t)parts[p][0] * rb, rb * (size_t)parts[p][1]),
                    "%s rows [%lld, +%lld)", layers[i].base, (long long)parts[p][0], (long long)parts[p][1]);
      free(got);
    }
    uint8_t row[64];
    ck_assert_int_eq(model_quant_rows(&l, 15, 2, NULL, row), -EINVAL); /* past the last output */
    model_quant_close(&l);
    fr_free_aligned(whole.data);
    free(whole.perm);
  }
  model_st_close(st);
}
END_TEST

/* The same rows repacked over 2, 3 and 5 threads (ranges that start and end
 * inside AWQ's 8-column words, and past the threshold of 128 rows) are the
 * single thread's, bit for bit. */
START_TEST(quant_rows_threads) {
  model_st_t *st;
  ck_assert_msg(model_st_open(&st, fx_path("st_gptq_wide.safetensors")) == 0, "%s", fr_last_error());
  const model_quant_t qs[] = {{.method = MODEL_QUANT_GPTQ, .bits = 4, .group_size = 32},
                              {.method = MODEL_QUANT_AWQ, .bits = 4, .group_size = 32}};
  const char *bases[] = {"gptq", "awq"};
  const int64_t parts[][2] = {{0, 392}, {3, 386}, {130, 131}, {8, 384}};
  const int threads[] = {2, 3, 5};
  for (size_t i = 0; i < FR_ARRAY_SIZE(qs); i++) {
    model_quant_layer_t l;
    ck_assert_msg(model_quant_open(&qs[i], st, bases[i], &l) == 0, "%s", fr_last_error());
    ck_assert_int_eq(l.out, 392);
    const size_t rb = kern_row_bytes(KERN_I4G, l.in);
    uint8_t *whole = fr_malloc(rb * 392), *got = fr_malloc(rb * 392);
    ck_assert_int_eq(model_quant_rows(&l, 0, 392, NULL, whole), 0);
    for (size_t t = 0; t < FR_ARRAY_SIZE(threads); t++) {
      fr_pool_t *pool;
      ck_assert_int_eq(fr_pool_create(&pool, threads[t]), 0);
      for (size_t p = 0; p < FR_ARRAY_SIZE(parts); p++) {
        memset(got, 0xa5, rb * 392);
        ck_assert_int_eq(model_quant_rows(&l, parts[p][0], parts[p][1], pool, got), 0);
        ck_assert_msg(!memcmp(got, whole + (size_t)parts[p][0] * rb, rb * (size_t)parts[p][1]),
                      "%s, %d threads, rows [%lld, +%lld)", bases[i], threads[t], (long long)parts[p][0],
                      (long long)parts[p][1]);
      }
      ck_assert_int_eq(model_quant_rows(&l, 300, 93, pool, got), -EINVAL);
      fr_pool_destroy(pool);
    }
    free(whole), free(got);
    model_quant_close(&l);
  }
  model_st_close(st);
}
END_TEST

/* ---- GGUF metadata parsing -------------------------------------------- */

static int gguf_cfg(model_config_t *c, const fx_buf_t *b) {
  model_gguf_t *g;
  int rc = model_gguf_open_memory(&g, b->p, b->n);
  ck_assert_msg(rc == 0, "%s", fr_last_error());
  fr_error_clear();
  rc = model_config_from_gguf(c, g);
  model_gguf_close(g);
  return rc;
}

/* Metadata for a qwen2 model with `extra` more keys appended by the caller. */
static void qwen2_meta(fx_buf_t *b, uint64_t extra) {
  fx_gguf_header(b, 3, 0, 6 + extra);
  fx_gguf_kv_str(b, "general.architecture", "qwen2");
  fx_gguf_kv_u32(b, "qwen2.block_count", 24);
  fx_gguf_kv_u32(b, "qwen2.embedding_length", 896);
  fx_gguf_kv_u32(b, "qwen2.feed_forward_length", 4864);
  fx_gguf_kv_u32(b, "qwen2.attention.head_count", 14);
  fx_gguf_kv_u32(b, "qwen2.vocab_size", 151936);
}

START_TEST(gguf_config_keys) {
  model_config_t c;
  fx_buf_t b = {0};
  qwen2_meta(&b, 0);
  ck_assert_int_eq(gguf_cfg(&c, &b), 0);
  ck_assert_int_eq(c.n_kv_heads, 14); /* defaults */
  ck_assert_int_eq(c.head_dim, 64);
  ck_assert_float_eq(c.rope_theta, 10000.0f);
  ck_assert_int_eq(c.vocab_size, 151936);
  ck_assert_int_eq(c.rope_scaling, MODEL_ROPE_SCALING_NONE);
  free(b.p);
  b = (fx_buf_t){0};
  qwen2_meta(&b, 1);
  fx_gguf_kv_f32(&b, "qwen2.rope.scale_linear", 2.0f); /* legacy key */
  ck_assert_int_eq(gguf_cfg(&c, &b), 0);
  ck_assert_int_eq(c.rope_scaling, MODEL_ROPE_SCALING_LINEAR);
  ck_assert_float_eq(c.rope_factor, 2.0f);
  free(b.p);
  b = (fx_buf_t){0};
  qwen2_meta(&b, 2);
  fx_gguf_kv_str(&b, "qwen2.rope.scaling.type", "none");
  fx_gguf_kv_f32(&b, "qwen2.rope.scaling.factor", 8.0f);
  ck_assert_int_eq(gguf_cfg(&c, &b), 0);
  ck_assert_int_eq(c.rope_scaling, MODEL_ROPE_SCALING_NONE);
  free(b.p);
  b = (fx_buf_t){0};
  qwen2_meta(&b, 1);
  fx_gguf_kv_str(&b, "qwen2.rope.scaling.type", "yarn");
  ck_assert_int_eq(gguf_cfg(&c, &b), FR_EUNSUPPORTED);
  ck_assert_ptr_nonnull(strstr(fr_last_error(), "yarn"));
  free(b.p);
  b = (fx_buf_t){0};
  qwen2_meta(&b, 1);
  fx_gguf_kv_str(&b, "qwen2.attention.head_count_kv", "2"); /* wrong type */
  ck_assert_int_eq(gguf_cfg(&c, &b), FR_EFORMAT);
  ck_assert_ptr_nonnull(strstr(fr_last_error(), "head_count_kv"));
  free(b.p);
  b = (fx_buf_t){0};
  qwen2_meta(&b, 1);
  fx_gguf_kv_u32(&b, "qwen2.attention.head_count_kv", 4); /* 14 % 4 */
  ck_assert_int_eq(gguf_cfg(&c, &b), FR_EFORMAT);
  free(b.p);
  b = (fx_buf_t){0};
  qwen2_meta(&b, 1);
  fx_gguf_kv_u32(&b, "qwen2.context_length", 0);
  ck_assert_int_eq(gguf_cfg(&c, &b), FR_EFORMAT);
  free(b.p);
  b = (fx_buf_t){0}; /* llama: rope.dimension_count must equal head_dim */
  fx_gguf_header(&b, 3, 0, 7);
  fx_gguf_kv_str(&b, "general.architecture", "llama");
  fx_gguf_kv_u32(&b, "llama.block_count", 2);
  fx_gguf_kv_u32(&b, "llama.embedding_length", 64);
  fx_gguf_kv_u32(&b, "llama.feed_forward_length", 96);
  fx_gguf_kv_u32(&b, "llama.attention.head_count", 4);
  fx_gguf_kv_u32(&b, "llama.vocab_size", 100);
  fx_gguf_kv_u32(&b, "llama.rope.dimension_count", 8);
  ck_assert_int_eq(gguf_cfg(&c, &b), FR_EFORMAT);
  free(b.p);
  b = (fx_buf_t){0};
  fx_gguf_header(&b, 3, 0, 1);
  fx_gguf_kv_str(&b, "general.architecture", "gpt2");
  ck_assert_int_eq(gguf_cfg(&c, &b), FR_EUNSUPPORTED);
  free(b.p);
  b = (fx_buf_t){0};
  fx_gguf_header(&b, 3, 0, 0);
  ck_assert_int_eq(gguf_cfg(&c, &b), FR_EFORMAT);
  free(b.p);
  ck_assert_str_eq(model_arch_name(MODEL_ARCH_QWEN3), "qwen3");
  ck_assert_str_eq(model_arch_name((model_arch_t)42), "unknown");
}
END_TEST

/* ---- the real model --------------------------------------------------- */

START_TEST(smollm2_gguf) {
  model_source_t *s = open_ok(getenv("FERRUM_MODEL"));
  const model_config_t *c = &s->config;
  ck_assert_int_eq(c->arch, MODEL_ARCH_LLAMA);
  ck_assert_int_eq(c->n_layers, 30);
  ck_assert_int_eq(c->dim, 576);
  ck_assert_int_eq(c->ffn_dim, 1536);
  ck_assert_int_eq(c->n_heads, 9);
  ck_assert_int_eq(c->n_kv_heads, 3);
  ck_assert_int_eq(c->head_dim, 64);
  ck_assert_int_eq(c->vocab_size, 49152);
  ck_assert_float_eq(c->rope_theta, 100000.0f);
  ck_assert_float_eq_tol(c->norm_eps, 1e-5f, 1e-9f);
  ck_assert(c->tied_embeddings && !c->attn_bias && !c->qk_norm);
  ck_assert_int_eq(s->rope_mode, KERN_ROPE_NORM);
  ck_assert_uint_eq(s->n_tensors, 2 + 30 * 9);
  const model_tensor_t *t = model_source_tensor(s, "blk.29.attn_k.weight");
  ck_assert_int_eq(t->rows, 192);
  ck_assert_int_eq(t->cols, 576);
  const gguf_kv_t *tok = model_gguf_find(s->gguf, "tokenizer.ggml.tokens");
  ck_assert_uint_eq(tok->arr_count, 49152);
  gguf_str_t str;
  ck_assert_int_eq(model_gguf_arr_str(tok, 1, &str), 0);
  ck_assert_int_eq((int)str.len, 12);
  ck_assert(memcmp(str.ptr, "<|im_start|>", 12) == 0);
  model_source_close(s);
}
END_TEST

/* The shared main (tests/common/test_main.c) runs this program's suites. */
#include "tests/common/test_main.h"

static bool g_smollm2; /* argv[1] "smollm2": the real model's test only */

static int source_setup(int argc, char **argv) {
  g_smollm2 = argc > 1 && strcmp(argv[1], "smollm2") == 0;
  if (g_smollm2) {
    struct stat sb;
    const char *m = getenv("FERRUM_MODEL");
    if (!m || stat(m, &sb) != 0) {
      fprintf(stderr, "FERRUM_MODEL not set or missing: skipped\n");
      return TEST_SKIP;
    }
  }
  return 0;
}

static Suite *source_suite(void) {
  Suite *su = suite_create("source");
  TCase *tc = tcase_create("source");
  tcase_set_timeout(tc, 60);
  if (g_smollm2) {
    tcase_add_test(tc, smollm2_gguf);
  } else {
    tcase_add_test(tc, gguf_llama);
    tcase_add_test(tc, gguf_qwen2_qwen3_llama3);
    tcase_add_test(tc, gguf_qwen3moe);
    tcase_add_test(tc, gguf_qwen3moe_broken);
    tcase_add_test(tc, gguf_missing_or_unsupported);
    tcase_add_test(tc, not_a_model);
    tcase_add_test(tc, hf_llama_folder);
    tcase_add_test(tc, hf_qwen_folders);
    tcase_add_test(tc, hf_qwen3moe_folder);
    tcase_add_test(tc, hf_qwen3moe_misshaped);
    tcase_add_test(tc, hf_misshaped);
    tcase_add_test(tc, hf_config_fields);
    tcase_add_test(tc, hf_config_rope);
    tcase_add_test(tc, hf_config_errors);
    tcase_add_test(tc, hf_config_moe);
    tcase_add_test(tc, quant_fp8_configs);
    tcase_add_test(tc, quant_fp8_pack);
    tcase_add_test(tc, quant_rows_parts);
    tcase_add_test(tc, quant_rows_threads);
    tcase_add_test(tc, gguf_config_keys);
  }
  suite_add_tcase(su, tc);
  return su;
}

const test_prog_t test_prog = {.suites = {source_suite}, .setup = source_setup};
