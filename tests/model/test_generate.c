/* test_generate.c - whole-model checks against llama.cpp goldens
 * (tests/golden/gen_llama_golden.py): last-token logits of every prompt and
 * greedy continuations, for the real SmolLM2 GGUF, tiny random llama /
 * qwen2 / qwen3 / qwen3moe GGUF files, and the safetensors copies of the
 * tiny llama and qwen3moe.
 * Also: our chat template + tokenizer give llama.cpp's prompt ids. */
#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "model/dummy.h"
#include "model/generate.h"
#include "model/model.h"
#include "model/prompt.h"

typedef struct {
  json_t *root;
  float *logits; /* (n_cases, vocab) */
  int vocab;
  size_t n_cases;
} golden_t;

static const char *golden_dir(void) {
  const char *b = getenv("FERRUM_BUILD_DIR");
  static char p[4096];
  snprintf(p, sizeof p, "%s/golden", b ? b : ".");
  return p;
}

static int golden_load(golden_t *g, const char *name) {
  char path[4200];
  snprintf(path, sizeof path, "%s/%s.json", golden_dir(), name);
  json_error_t err;
  g->root = json_load_file(path, 0, &err);
  if (!g->root) return -1;
  g->vocab = (int)json_integer_value(json_object_get(g->root, "vocab"));
  g->n_cases = json_array_size(json_object_get(g->root, "cases"));
  snprintf(path, sizeof path, "%s/%s.logits", golden_dir(), name);
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  g->logits = fr_malloc(g->n_cases * (size_t)g->vocab * sizeof(float));
  size_t got = fread(g->logits, sizeof(float), g->n_cases * (size_t)g->vocab, f);
  fclose(f);
  return got == g->n_cases * (size_t)g->vocab ? 0 : -1;
}

static void golden_free(golden_t *g) {
  json_decref(g->root);
  free(g->logits);
}

static int32_t *json_ids(json_t *arr, size_t *n) {
  *n = json_array_size(arr);
  int32_t *ids = fr_malloc((*n + 1) * sizeof(int32_t));
  for (size_t i = 0; i < *n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(arr, i));
  return ids;
}

static int32_t argmax(const float *x, int n) {
  int32_t b = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[b]) b = i;
  return b;
}

static bool in_top5(json_t *top5, int32_t tok) {
  for (size_t i = 0; i < json_array_size(top5); i++)
    if (json_integer_value(json_array_get(top5, i)) == tok) return true;
  return false;
}

typedef struct {
  double max_diff, sum_diff, max_rel; /* logits */
  size_t n_logits;
  int exact_cases, top5_cases, cases;
  int fa_exact_cases; /* llama.cpp flash-attention vs llama.cpp: its own noise floor */
} score_t;

/* Compares one case; returns false when greedy tokens fail even the
 * top-5 rule at the first divergence (vLLM's check). */
static bool check_case(model_gen_t *gen, const golden_t *g, size_t ci, score_t *s) {
  json_t *c = json_array_get(json_object_get(g->root, "cases"), ci);
  size_t n_ids, n_greedy;
  int32_t *ids = json_ids(json_object_get(c, "ids"), &n_ids);
  int32_t *greedy = json_ids(json_object_get(c, "greedy"), &n_greedy);
  json_t *top5 = json_object_get(c, "top5");
  model_gen_reset(gen);
  ck_assert_int_eq(model_gen_feed(gen, ids, (int)n_ids), 0);
  const float *ref = g->logits + ci * (size_t)g->vocab;
  double ref_max = 0;
  for (int i = 0; i < g->vocab; i++) ref_max = fmax(ref_max, fabs(ref[i]));
  for (int i = 0; i < g->vocab; i++) {
    double d = fabs((double)gen->logits[i] - ref[i]);
    s->max_diff = fmax(s->max_diff, d);
    s->sum_diff += d;
  }
  s->max_rel = fmax(s->max_rel, s->max_diff / (ref_max > 0 ? ref_max : 1));
  s->n_logits += (size_t)g->vocab;
  bool ok = true, exact = true;
  for (size_t t = 0; t < n_greedy; t++) {
    int32_t mine = argmax(gen->logits, g->vocab);
    if (mine != greedy[t]) {
      exact = false;
      /* first divergence: each side's token must be in the other's top 5 */
      int32_t top[5];
      float lp[5];
      model_logprobs(gen->logits, g->vocab, 5, top, lp, NULL);
      bool theirs_in_mine = false;
      for (int k = 0; k < 5; k++) theirs_in_mine |= top[k] == greedy[t];
      ok = theirs_in_mine && in_top5(json_array_get(top5, t), mine);
      fprintf(stderr, "  case %zu diverges at token %zu: ours %d, llama.cpp %d (%s)\n", ci, t, mine, greedy[t],
              ok ? "within top-5" : "NOT within top-5");
      break;
    }
    if (t + 1 < n_greedy) ck_assert_int_eq(model_gen_feed(gen, &mine, 1), 0);
  }
  size_t n_fa;
  int32_t *fa = json_object_get(c, "greedy_fa") ? json_ids(json_object_get(c, "greedy_fa"), &n_fa) : NULL;
  if (fa) s->fa_exact_cases += n_fa == n_greedy && !memcmp(fa, greedy, n_fa * sizeof(int32_t));
  free(fa);
  s->cases++;
  s->exact_cases += exact;
  s->top5_cases += ok;
  free(ids);
  free(greedy);
  return ok;
}

/* Runs every case of golden `name` on model `path`. */
static score_t run_golden(const char *name, const char *path) {
  golden_t g = {0};
  ck_assert_msg(golden_load(&g, name) == 0, "golden %s missing in %s", name, golden_dir());
  kern_backend_t *be;
  ck_assert_int_eq(kern_cpu_create(&be, 0), 0);
  model_t *m;
  model_load_opts_t lo = {.max_tokens = 64}; /* small chunks: exercises chunked prefill */
  int rc = model_load(&m, path, be, &lo);
  ck_assert_msg(rc == 0, "load %s: %s", path, fr_last_error());
  ck_assert_int_eq(m->cfg.vocab_size, g.vocab);
  model_gen_t *gen;
  ck_assert_int_eq(model_gen_create(&gen, m, 1024), 0);
  score_t s = {0};
  for (size_t i = 0; i < g.n_cases; i++) check_case(gen, &g, i, &s);
  fprintf(stderr, "%s (%s): logits max |diff| %.4f (%.4f of max |logit|), mean |diff| %.5f; greedy exact %d/%d, "
                  "within top-5 at first divergence %d/%d (llama.cpp flash-attn vs llama.cpp: exact %d/%d)\n",
          name, path, s.max_diff, s.max_rel, s.sum_diff / (double)s.n_logits, s.exact_cases, s.cases, s.top5_cases,
          s.cases, s.fa_exact_cases, s.cases);
  model_gen_destroy(gen);
  model_destroy(m);
  kern_backend_destroy(be);
  golden_free(&g);
  return s;
}

static const char *tiny(const char *file) {
  static char p[8192];
  snprintf(p, sizeof p, "%s/%s", golden_dir(), file);
  return p;
}

/* SmolLM2 Q4_1 with int8 activations is chaotic at the rounding level: a
 * change of float summation order flips activation quantization steps, and
 * llama.cpp's own flash-attention path agrees exactly with its default path
 * on about a third of these 32-token continuations. So exact equality is
 * asserted where it is meaningful (the float tiny models below), and here
 * vLLM's rule on every prompt, logits within 8% of the largest logit, and
 * at least half as many exact continuations as llama.cpp's own noise floor. */
START_TEST(smollm2_matches_llama_cpp) {
  const char *path = getenv("FERRUM_MODEL");
  score_t s = run_golden("smollm2", path);
  ck_assert_int_eq(s.top5_cases, s.cases);
  ck_assert_double_lt(s.max_rel, 0.08);
  ck_assert_double_lt(s.sum_diff / (double)s.n_logits, 0.3);
  ck_assert_int_ge(2 * s.exact_cases, s.fa_exact_cases);
}
END_TEST

START_TEST(tiny_llama_gguf_matches_llama_cpp) {
  score_t s = run_golden("tiny-llama", tiny("tiny-llama.gguf"));
  ck_assert_int_eq(s.exact_cases, s.cases); /* float weights: exact greedy */
  ck_assert_double_lt(s.max_rel, 1e-3);
}
END_TEST

START_TEST(tiny_llama_safetensors_matches_gguf) {
  /* The HF folder holds the same (bf16-rounded) weights, un-permuted, with
   * llama3 rope scaling in config.json instead of rope_freqs.weight. */
  score_t s = run_golden("tiny-llama", tiny("tiny-llama-hf"));
  ck_assert_int_eq(s.exact_cases, s.cases);
  ck_assert_double_lt(s.max_rel, 1e-3);
}
END_TEST

START_TEST(tiny_qwen2_matches_llama_cpp) {
  score_t s = run_golden("tiny-qwen2", tiny("tiny-qwen2.gguf"));
  ck_assert_int_eq(s.top5_cases, s.cases);
  ck_assert_double_lt(s.max_rel, 0.05);
}
END_TEST

START_TEST(tiny_qwen3_matches_llama_cpp) {
  score_t s = run_golden("tiny-qwen3", tiny("tiny-qwen3.gguf"));
  ck_assert_int_eq(s.top5_cases, s.cases);
  ck_assert_double_lt(s.max_rel, 0.05);
}
END_TEST

/* Qwen3-MoE, float (bf16-rounded) weights: routing, top-k and the experts
 * must match llama.cpp's to the greedy token. */
START_TEST(tiny_qwen3moe_gguf_matches_llama_cpp) {
  score_t s = run_golden("tiny-qwen3moe", tiny("tiny-qwen3moe.gguf"));
  ck_assert_int_eq(s.exact_cases, s.cases);
  ck_assert_double_lt(s.max_rel, 1e-3);
}
END_TEST

/* The HF folder: the same weights, one safetensors tensor per expert. */
START_TEST(tiny_qwen3moe_safetensors_matches_gguf) {
  score_t s = run_golden("tiny-qwen3moe", tiny("tiny-qwen3moe-hf"));
  ck_assert_int_eq(s.exact_cases, s.cases);
  ck_assert_double_lt(s.max_rel, 1e-3);
}
END_TEST

/* Quantized experts (Q8_0 / Q5_0 / Q4_1 stacks): activations quantized per
 * expert as llama.cpp's mul_mat_id does. */
START_TEST(tiny_qwen3moe_quantized_matches_llama_cpp) {
  score_t s = run_golden("tiny-qwen3moe-q", tiny("tiny-qwen3moe-q.gguf"));
  ck_assert_int_eq(s.top5_cases, s.cases);
  ck_assert_double_lt(s.max_rel, 0.05);
}
END_TEST

/* A backend without the moe_ffn op refuses MoE models at load, before any
 * weight is read, for files and dummy configs alike. */
START_TEST(moe_needs_the_backend_op) {
  kern_backend_t *be;
  ck_assert_int_eq(kern_cpu_create(&be, 1), 0);
  kern_ops_t ops = *be->ops;
  ops.name = "no-moe";
  ops.moe_ffn = NULL;
  kern_backend_t no_moe = *be;
  no_moe.ops = &ops;
  model_t *m = NULL;
  fr_error_clear();
  ck_assert_int_eq(model_load(&m, tiny("tiny-qwen3moe.gguf"), &no_moe, NULL), FR_EUNSUPPORTED);
  ck_assert_ptr_null(m);
  ck_assert_msg(strstr(fr_last_error(), "the no-moe backend has no mixture-of-experts op"), "%s", fr_last_error());
  model_config_t cfg;
  ck_assert_int_eq(model_dummy_config(tiny("tiny-qwen3moe-hf"), &cfg), 0);
  ck_assert_int_eq(model_load_dummy(&m, &cfg, &no_moe, NULL), FR_EUNSUPPORTED);
  ck_assert_ptr_null(m);
  kern_backend_destroy(be);
}
END_TEST

/* --quantization fp8 on a backend without FP8 weights (the CPU): a clear
 * error before any weight loads, for a file and for dummy weights. */
START_TEST(fp8_needs_a_backend_that_keeps_it) {
  kern_backend_t *be;
  ck_assert_int_eq(kern_cpu_create(&be, 1), 0);
  ck_assert(!be->fp8_weights);
  model_load_opts_t lo = {.max_tokens = 64, .fp8_weights = true};
  model_t *m = NULL;
  ck_assert_int_eq(model_load(&m, tiny("tiny-llama.gguf"), be, &lo), FR_EUNSUPPORTED);
  ck_assert_ptr_null(m);
  ck_assert_msg(strstr(fr_last_error(), "--quantization fp8: the cpu backend cannot keep FP8 weights"), "%s",
                fr_last_error());
  model_config_t cfg;
  ck_assert_int_eq(model_dummy_config(tiny("tiny-qwen3moe-hf"), &cfg), 0);
  ck_assert_int_eq(model_load_dummy(&m, &cfg, be, &lo), FR_EUNSUPPORTED);
  ck_assert_ptr_null(m);
  kern_backend_destroy(be);
}
END_TEST

/* Feeds m five tokens: every logit finite. */
static void expect_finite_logits(model_t *m) {
  model_gen_t *gen;
  ck_assert_int_eq(model_gen_create(&gen, m, 256), 0);
  int32_t ids[5] = {1, 2, 3, 4, 5};
  ck_assert_int_eq(model_gen_feed(gen, ids, 5), 0);
  for (int i = 0; i < m->cfg.vocab_size; i++) ck_assert(isfinite(gen->logits[i]));
  model_gen_destroy(gen);
}

/* --load-format dummy of a MoE config: random experts that run; with
 * decoder_sparse_step 2 (HF), layers 0 and 2 keep a dense FFN. */
START_TEST(moe_dummy_runs) {
  kern_backend_t *be;
  ck_assert_int_eq(kern_cpu_create(&be, 0), 0);
  model_config_t cfg;
  ck_assert_int_eq(model_dummy_config(tiny("tiny-qwen3moe-hf"), &cfg), 0);
  for (int step = 1; step <= 2; step++) {
    cfg.moe_step = step;
    model_t *m;
    model_load_opts_t lo = {.max_tokens = 64, .dummy_type = KERN_Q8_0};
    ck_assert_msg(model_load_dummy(&m, &cfg, be, &lo) == 0, "%s", fr_last_error());
    ck_assert_ptr_nonnull(m->layers[1].exp_down);
    ck_assert_int_eq(m->layers[1].exp_down[7].cols, 64);
    ck_assert(step == 1 ? m->layers[2].exp_gate != NULL : m->layers[2].exp_gate == NULL);
    ck_assert(step == 1 ? m->layers[2].w_gate_up.data == NULL : m->layers[2].w_gate_up.rows == 2 * cfg.ffn_dim);
    expect_finite_logits(m);
    model_destroy(m);
  }
  kern_backend_destroy(be);
}
END_TEST

/* Llama-3-8B's config at small sizes (the dummy mixes' tests). */
static model_config_t small_llama(int n_layers) {
  model_config_t cfg;
  ck_assert_int_eq(model_dummy_config("llama-3-8b", &cfg), 0);
  cfg.n_layers = n_layers, cfg.dim = 256, cfg.ffn_dim = 512, cfg.n_heads = 4, cfg.n_kv_heads = 2;
  cfg.head_dim = 64, cfg.rope_dim = 64, cfg.vocab_size = 1000;
  return cfg;
}

/* The Q4_K_M dummy mix (model_bench --type q4_k_m): llama.cpp's
 * use_more_bits layers keep attn_v and ffn_down in Q6_K (q, k and v then
 * apart, as the GGUF loader keeps tensors of different types), the output
 * is Q6_K, the rest Q4_K; and the model runs. */
START_TEST(q4_k_m_dummy_mix) {
  kern_backend_t *be;
  ck_assert_int_eq(kern_cpu_create(&be, 0), 0);
  const model_config_t cfg = small_llama(16);
  model_load_opts_t lo = {.max_tokens = 64};
  ck_assert_int_eq(model_dummy_weights(&lo, "q4km"), FR_ENOTFOUND); /* a typo is an error, not the act type */
  ck_assert_int_eq(model_dummy_weights(&lo, "Q4_K_M"), 0);
  ck_assert(lo.dummy_type == KERN_Q4_K && lo.dummy_q4_k_m);
  model_t *m;
  ck_assert_msg(model_load_dummy(&m, &cfg, be, &lo) == 0, "%s", fr_last_error());
  /* 16 layers: 0 and 1 (before n / 8), 14 and 15 (from 7 n / 8), and every
   * third from 4 (il - n / 8 = 2 mod 3) */
  const bool six[16] = {1, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 1, 1};
  for (int il = 0; il < 16; il++) {
    const model_layer_t *L = &m->layers[il];
    ck_assert_int_eq(L->w_down.type, six[il] ? KERN_Q6_K : KERN_Q4_K);
    if (six[il]) {
      ck_assert_ptr_null(L->wqkv.data);
      ck_assert_int_eq(L->wq.type, KERN_Q4_K);
      ck_assert_int_eq(L->wv.type, KERN_Q6_K);
    } else {
      ck_assert_int_eq(L->wqkv.type, KERN_Q4_K);
    }
  }
  ck_assert_int_eq(m->output.type, KERN_Q6_K);
  ck_assert_int_eq(m->tok_embd.type, KERN_Q4_K);
  expect_finite_logits(m);
  model_destroy(m);
  lo.dummy_type = KERN_Q8_0; /* the mix is of Q4_K weights: anything else is refused, not ignored */
  ck_assert_int_eq(model_load_dummy(&m, &cfg, be, &lo), FR_EUNSUPPORTED);
  ck_assert_ptr_null(m);
  kern_backend_destroy(be);
}
END_TEST

/* The gptq dummy mix (model_bench --type gptq): I4G layers, the embedding
 * and the output in F16, as GPTQ and AWQ checkpoints keep embed_tokens and
 * lm_head; a later plain type clears the mix. */
START_TEST(gptq_dummy_mix) {
  kern_backend_t *be;
  ck_assert_int_eq(kern_cpu_create(&be, 0), 0);
  const model_config_t cfg = small_llama(2);
  model_load_opts_t lo = {.max_tokens = 64};
  ck_assert_int_eq(model_dummy_weights(&lo, "GPTQ"), 0);
  ck_assert(lo.dummy_type == KERN_I4G && lo.dummy_head_type == KERN_F16 && !lo.dummy_q4_k_m);
  model_t *m;
  ck_assert_msg(model_load_dummy(&m, &cfg, be, &lo) == 0, "%s", fr_last_error());
  for (int il = 0; il < 2; il++) {
    ck_assert_int_eq(m->layers[il].wqkv.type, KERN_I4G);
    ck_assert_int_eq(m->layers[il].wo.type, KERN_I4G);
    ck_assert_int_eq(m->layers[il].w_gate_up.type, KERN_I4G);
    ck_assert_int_eq(m->layers[il].w_down.type, KERN_I4G);
  }
  ck_assert_int_eq(m->output.type, KERN_F16);
  ck_assert_int_eq(m->tok_embd.type, KERN_F16);
  ck_assert_int_eq(m->output.rows, 1000);
  expect_finite_logits(m);
  model_destroy(m);
  ck_assert_int_eq(model_dummy_weights(&lo, "i4g"), 0);
  ck_assert(lo.dummy_type == KERN_I4G && !lo.dummy_head_type);
  ck_assert_msg(model_load_dummy(&m, &cfg, be, &lo) == 0, "%s", fr_last_error());
  ck_assert_int_eq(m->output.type, KERN_I4G);
  model_destroy(m);
  kern_backend_destroy(be);
}
END_TEST

/* A folder with a small llama's config.json and, unless NULL, its
 * quantization_config (JSON text); the folder's path in dir. */
static void quant_folder(char *dir, size_t size, const char *qc) {
  snprintf(dir, size, "/tmp/ferrum-dummyq-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(dir));
  char path[512];
  snprintf(path, sizeof path, "%s/config.json", dir);
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fprintf(f, "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 256, "
             "\"intermediate_size\": 512, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
             "\"num_key_value_heads\": 2, \"vocab_size\": 1000, \"max_position_embeddings\": 256, "
             "\"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0%s%s}\n",
          qc ? ", \"quantization_config\": " : "", qc ? qc : "");
  ck_assert_int_eq(fclose(f), 0);
}

static void quant_folder_rm(const char *dir) {
  char path[512];
  snprintf(path, sizeof path, "%s/config.json", dir);
  ck_assert_int_eq(unlink(path), 0);
  ck_assert_int_eq(rmdir(dir), 0);
}

/* The I4G scale d of block b of w's first row (the CPU backend keeps the
 * blocks as they were loaded: d, m, then 16 bytes of nibbles). */
static float i4g_d(const kern_weight_t *w, int b) {
  float d;
  memcpy(&d, (const uint8_t *)w->data + 24 * (size_t)b, sizeof d);
  return d;
}

/* --load-format dummy on a GPTQ or AWQ folder keeps its quantization (as
 * vLLM's dummy load does): the gptq mix at the config's group size, whose
 * (d, m) change every group (64 columns: two blocks; -1: never along a
 * row); an unquantized folder and a built-in name leave the options; a
 * config the real load refuses is refused here too. */
START_TEST(dummy_keeps_a_folders_quantization) {
  kern_backend_t *be;
  ck_assert_int_eq(kern_cpu_create(&be, 0), 0);
  char dir[64];
  const struct {
    const char *qc;
    int group;
  } cases[] = {{"{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 64, \"desc_act\": false}", 64},
               {"{\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": -1, \"version\": \"gemm\"}", -1}};
  for (size_t i = 0; i < FR_ARRAY_SIZE(cases); i++) {
    quant_folder(dir, sizeof dir, cases[i].qc);
    model_load_opts_t lo = {.max_tokens = 64};
    model_config_t cfg;
    ck_assert_int_eq(model_dummy_config(dir, &cfg), 0);
    ck_assert_msg(model_dummy_weights_of(&lo, dir) == 0, "%s", fr_last_error());
    ck_assert(lo.dummy_type == KERN_I4G && lo.dummy_head_type == KERN_F16);
    ck_assert_int_eq(lo.dummy_group, cases[i].group);
    model_t *m;
    ck_assert_msg(model_load_dummy(&m, &cfg, be, &lo) == 0, "%s", fr_last_error());
    const kern_weight_t *wo = &m->layers[0].wo;
    ck_assert_int_eq(wo->type, KERN_I4G);
    ck_assert_int_eq(m->output.type, KERN_F16);
    if (cases[i].group == 64) {
      ck_assert(i4g_d(wo, 0) == i4g_d(wo, 1) && i4g_d(wo, 2) == i4g_d(wo, 3));
      ck_assert(i4g_d(wo, 1) != i4g_d(wo, 2) && i4g_d(wo, 3) != i4g_d(wo, 4)); /* 128-column groups: equal */
    } else {
      for (int b = 1; b < 8; b++) ck_assert(i4g_d(wo, b) == i4g_d(wo, 0));
    }
    expect_finite_logits(m);
    model_destroy(m);
    quant_folder_rm(dir);
  }
  /* unquantized, a built-in name: nothing changes */
  quant_folder(dir, sizeof dir, NULL);
  model_load_opts_t lo = {.max_tokens = 64, .dummy_type = KERN_Q8_0};
  ck_assert_int_eq(model_dummy_weights_of(&lo, dir), 0);
  ck_assert(lo.dummy_type == KERN_Q8_0 && !lo.dummy_head_type && !lo.dummy_group);
  quant_folder_rm(dir);
  ck_assert_int_eq(model_dummy_weights_of(&lo, "llama-3-8b"), 0);
  ck_assert(lo.dummy_type == KERN_Q8_0 && !lo.dummy_head_type);
  /* FP8: the checkpoint's form (dummy_fp8), kept where the backend keeps FP8; the CPU's are the act type */
  const struct {
    const char *qc;
    kern_type_t form;
  } fp8[] = {{"{\"quant_method\": \"fp8\", \"weight_block_size\": [128, 128]}", KERN_F8B},
             {"{\"quant_method\": \"fp8\", \"activation_scheme\": \"static\"}", KERN_F8R}};
  for (size_t i = 0; i < FR_ARRAY_SIZE(fp8); i++) {
    quant_folder(dir, sizeof dir, fp8[i].qc);
    model_load_opts_t fo = {.max_tokens = 64};
    model_config_t cfg;
    ck_assert_int_eq(model_dummy_config(dir, &cfg), 0);
    ck_assert_msg(model_dummy_weights_of(&fo, dir) == 0, "%s", fr_last_error());
    ck_assert_int_eq(fo.dummy_fp8, fp8[i].form);
    model_t *m;
    ck_assert_msg(model_load_dummy(&m, &cfg, be, &fo) == 0, "%s", fr_last_error());
    ck_assert_int_eq(m->layers[0].wo.type, be->act_type);
    expect_finite_logits(m);
    model_destroy(m);
    quant_folder_rm(dir);
  }
  /* 8 bits: what the real load says */
  quant_folder(dir, sizeof dir, "{\"quant_method\": \"gptq\", \"bits\": 8, \"group_size\": 128}");
  ck_assert_int_eq(model_dummy_weights_of(&lo, dir), FR_EUNSUPPORTED);
  ck_assert_msg(strstr(fr_last_error(), "8 bits"), "%s", fr_last_error());
  quant_folder_rm(dir);
  kern_backend_destroy(be);
}
END_TEST

START_TEST(chat_prompt_ids_match_llama_cpp) {
  golden_t g = {0};
  ck_assert_int_eq(golden_load(&g, "smollm2"), 0);
  kern_backend_t *be;
  ck_assert_int_eq(kern_cpu_create(&be, 1), 0);
  model_t *m;
  ck_assert_int_eq(model_load(&m, getenv("FERRUM_MODEL"), be, NULL), 0);
  for (size_t i = 0; i < g.n_cases; i++) {
    json_t *c = json_array_get(json_object_get(g.root, "cases"), i);
    size_t n_ref, n;
    int32_t *ref = json_ids(json_object_get(c, "ids"), &n_ref), *ids;
    ck_assert_int_eq(model_prompt_tokenize(m, json_string_value(json_object_get(c, "prompt")), false, &ids, &n), 0);
    ck_assert_uint_eq(n, n_ref);
    ck_assert_mem_eq(ids, ref, n * sizeof(int32_t));
    free(ids);
    free(ref);
  }
  model_destroy(m);
  kern_backend_destroy(be);
  golden_free(&g);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("model");
  TCase *tc = tcase_create("golden");
  tcase_set_timeout(tc, 600);
  if (getenv("FERRUM_MODEL") && access(getenv("FERRUM_MODEL"), R_OK) == 0) {
    tcase_add_test(tc, smollm2_matches_llama_cpp);
    tcase_add_test(tc, chat_prompt_ids_match_llama_cpp);
  }
  tcase_add_test(tc, tiny_llama_gguf_matches_llama_cpp);
  tcase_add_test(tc, tiny_llama_safetensors_matches_gguf);
  tcase_add_test(tc, tiny_qwen2_matches_llama_cpp);
  tcase_add_test(tc, tiny_qwen3_matches_llama_cpp);
  tcase_add_test(tc, tiny_qwen3moe_gguf_matches_llama_cpp);
  tcase_add_test(tc, tiny_qwen3moe_safetensors_matches_gguf);
  tcase_add_test(tc, tiny_qwen3moe_quantized_matches_llama_cpp);
  tcase_add_test(tc, moe_needs_the_backend_op);
  tcase_add_test(tc, fp8_needs_a_backend_that_keeps_it);
  tcase_add_test(tc, moe_dummy_runs);
  tcase_add_test(tc, q4_k_m_dummy_mix);
  tcase_add_test(tc, gptq_dummy_mix);
  tcase_add_test(tc, dummy_keeps_a_folders_quantization);
  suite_add_tcase(s, tc);
  return s;
}

/* The shared main (tests/common/test_main.c) runs this program's suites. */
#include "tests/common/test_main.h"

const test_prog_t test_prog = {.suites = {suite}};
