/* tokenizer_gguf.c - builds a tokenizer from GGUF tokenizer.ggml.* metadata,
 * with llama.cpp's defaults (llama-vocab.cpp). Every array's element type and
 * count is checked before use. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_log.h"
#include "common/fr_util.h"
#include "model/gguf.h"
#include "model/tok_internal.h"

static bool str_is(gguf_str_t s, const char *lit) { return s.len == strlen(lit) && !memcmp(s.ptr, lit, s.len); }

/* An optional array: NULL when absent, an error when present but of the
 * wrong element type or count. */
static int get_array(const model_gguf_t *g, const char *key, gguf_vtype_t want, uint64_t count, bool any_int,
                     const gguf_kv_t **out) {
  *out = model_gguf_find(g, key);
  if (!*out) return 0;
  const gguf_kv_t *kv = *out;
  if (kv->type != GGUF_T_ARRAY) return fr_errorf(FR_EFORMAT, "gguf tokenizer: %s is not an array", key);
  bool type_ok = kv->arr_type == want;
  if (any_int) type_ok = kv->arr_type <= GGUF_T_INT32 || kv->arr_type == GGUF_T_UINT64 || kv->arr_type == GGUF_T_INT64;
  if (!type_ok)
    return fr_errorf(FR_EFORMAT, "gguf tokenizer: %s has elements of type %s, expected %s", key,
                     model_gguf_type_name(kv->arr_type), model_gguf_type_name(want));
  if (count != UINT64_MAX && kv->arr_count != count)
    return fr_errorf(FR_EFORMAT, "gguf tokenizer: %s has %llu elements, expected %llu", key,
                     (unsigned long long)kv->arr_count, (unsigned long long)count);
  return 0;
}

static int load_tokens(model_tokenizer_t *t, const model_gguf_t *g, const gguf_kv_t *tokens) {
  const gguf_kv_t *scores, *types;
  int rc = get_array(g, "tokenizer.ggml.scores", GGUF_T_FLOAT32, tokens->arr_count, false, &scores);
  if (!rc) rc = get_array(g, "tokenizer.ggml.token_type", GGUF_T_INT32, tokens->arr_count, true, &types);
  for (int32_t i = 0; rc == 0 && i < t->n_vocab; i++) {
    gguf_str_t s;
    float score = 0.0f;
    int64_t type = TOK_T_NORMAL;
    rc = model_gguf_arr_str(tokens, (uint64_t)i, &s);
    if (!rc && scores) rc = model_gguf_arr_f32(scores, (uint64_t)i, &score);
    if (!rc && types) rc = model_gguf_arr_i64(types, (uint64_t)i, &type);
    if (!rc) rc = tok__set_token(t, i, s.ptr, s.len, score, (int)(type >= 0 && type <= TOK_T_BYTE ? type : 1));
  }
  return rc;
}

static int load_merges(model_tokenizer_t *t, const model_gguf_t *g) {
  const gguf_kv_t *merges;
  int rc = get_array(g, "tokenizer.ggml.merges", GGUF_T_STRING, UINT64_MAX, false, &merges);
  if (rc) return rc;
  if (!merges) return fr_errorf(FR_EFORMAT, "gguf tokenizer: BPE vocabulary without tokenizer.ggml.merges");
  if (merges->arr_count > INT32_MAX) return fr_errorf(FR_ETOOBIG, "gguf tokenizer: too many merges");
  tok__index(t);
  size_t skipped = 0;
  for (uint64_t i = 0; i < merges->arr_count; i++) {
    gguf_str_t m;
    rc = model_gguf_arr_str(merges, i, &m);
    if (rc) return rc;
    /* llama.cpp splits at the first space after the first byte */
    const char *sp = m.len > 1 ? memchr(m.ptr + 1, ' ', m.len - 1) : NULL;
    if (!sp) return fr_errorf(FR_EFORMAT, "gguf tokenizer: merge %llu has no space", (unsigned long long)i);
    size_t al = (size_t)(sp - m.ptr);
    skipped += (size_t)tok__add_merge(t, m.ptr, al, sp + 1, m.len - al - 1, (int32_t)i);
  }
  if (skipped) FR_LOGW("gguf tokenizer: %zu merges name tokens not in the vocabulary", skipped);
  return 0;
}

static void get_id(const model_gguf_t *g, const char *key, int32_t *id) {
  int64_t v;
  if (model_gguf_get_i64(g, key, &v) == 0) *id = (v >= 0 && v <= INT32_MAX) ? (int32_t)v : -1;
}

static void get_flag(const model_gguf_t *g, const char *key, bool *b) {
  bool v;
  if (model_gguf_get_bool(g, key, &v) == 0) *b = v;
}

static int load_kind(model_tokenizer_t *t, const model_gguf_t *g) {
  gguf_str_t model;
  if (model_gguf_get_str(g, "tokenizer.ggml.model", &model))
    return fr_errorf(FR_EFORMAT, "gguf tokenizer: tokenizer.ggml.model missing or not a string");
  if (str_is(model, "llama")) {
    t->kind = MODEL_TOK_SPM;
    t->pre = TOK_PRE_NONE;
    snprintf(t->pre_name, sizeof(t->pre_name), "spm");
    t->bos = 1, t->eos = 2, t->unk = 0;
    t->add_bos = true, t->add_space_prefix = true;
    t->byte_fallback = true;
    return 0;
  }
  if (str_is(model, "gpt2")) {
    t->kind = MODEL_TOK_BPE;
    t->byte_level = true;
    gguf_str_t pre = {"default", 7};
    (void)model_gguf_get_str(g, "tokenizer.ggml.pre", &pre);
    tok__set_pre(t, pre.ptr, pre.len);
    t->add_bos = t->pre == TOK_PRE_LLAMA3;
    return 0;
  }
  if (str_is(model, "bert")) { /* WordPiece, llama.cpp's spelling (tok_wpm.c); [CLS] 101, [SEP] 102 by default */
    tok__wpm_defaults(t);
    t->wpm_phantom = true;
    t->wpm_prefix[0] = 0;
    t->bos = 101, t->eos = 102, t->unk = 100, t->pad = 0;
    return 0;
  }
  return fr_errorf(FR_EUNSUPPORTED, "gguf tokenizer: tokenizer model '%.*s' is not supported (llama, gpt2, bert)",
                   (int)FR_MIN(model.len, 64), model.ptr);
}

int model_tokenizer_from_gguf(model_tokenizer_t **out, const model_gguf_t *g) {
  *out = NULL;
  const gguf_kv_t *tokens;
  int rc = get_array(g, "tokenizer.ggml.tokens", GGUF_T_STRING, UINT64_MAX, false, &tokens);
  if (rc) return rc;
  if (!tokens) return fr_errorf(FR_EFORMAT, "gguf tokenizer: tokenizer.ggml.tokens missing");
  model_tokenizer_t *t;
  rc = tok__create(&t, (int64_t)FR_MIN(tokens->arr_count, (uint64_t)INT32_MAX));
  if (rc) return rc;
  rc = load_kind(t, g);
  if (!rc) rc = load_tokens(t, g, tokens);
  if (!rc && t->kind == MODEL_TOK_BPE) rc = load_merges(t, g);
  if (rc) goto fail;
  get_id(g, "tokenizer.ggml.bos_token_id", &t->bos);
  get_id(g, "tokenizer.ggml.eos_token_id", &t->eos);
  get_id(g, "tokenizer.ggml.eot_token_id", &t->eot);
  get_id(g, "tokenizer.ggml.eom_token_id", &t->eom);
  get_id(g, "tokenizer.ggml.unknown_token_id", &t->unk);
  get_id(g, "tokenizer.ggml.padding_token_id", &t->pad);
  if (t->kind == MODEL_TOK_WPM) { /* as llama.cpp: [CLS] is the BOS (or cls) id, [SEP] the separator (102) */
    get_id(g, "tokenizer.ggml.cls_token_id", &t->bos);
    t->eos = 102;
    get_id(g, "tokenizer.ggml.seperator_token_id", &t->eos);
  }
  get_flag(g, "tokenizer.ggml.add_bos_token", &t->add_bos);
  get_flag(g, "tokenizer.ggml.add_eos_token", &t->add_eos);
  if (t->kind == MODEL_TOK_WPM) { /* [SEP] follows add_sep_token (default on), not add_eos_token */
    t->add_eos = true;
    get_flag(g, "tokenizer.ggml.add_sep_token", &t->add_eos);
  }
  get_flag(g, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix);
  gguf_str_t tmpl;
  if (model_gguf_get_str(g, "tokenizer.chat_template", &tmpl) == 0 && tmpl.len < (1u << 24))
    t->chat_template = fr_strndup(tmpl.ptr, tmpl.len);
  rc = tok__finish(t);
  if (rc) goto fail;
  *out = t;
  return 0;
fail:
  model_tokenizer_destroy(t);
  return rc;
}
