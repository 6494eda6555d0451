/* tokenizer_json.c - builds a tokenizer from a Hugging Face tokenizer.json
 * (model.type BPE) and, optionally, tokenizer_config.json.
 *
 * Supported pipelines: byte-level BPE (pre_tokenizer ByteLevel, alone or in
 * a Sequence with Digits / Split, where a Split regex must be one of the
 * known gpt2 / llama3 / qwen2 patterns) and SentencePiece-style BPE
 * (normalizer Prepend("▁") + Replace(" ", "▁") or pre_tokenizer Metaspace,
 * with byte_fallback). An NFC normalizer is accepted and not applied, as
 * llama.cpp does. Anything else is FR_EUNSUPPORTED with a message. */
#include <jansson.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "model/file.h"
#include "model/tok_internal.h"

const char *tok__known_regex(tok_pre_t pre);

#define TOK_MAX_JSON (256u << 20) /* tokenizer.json, tokenizer_config.json */
#define SPM_SPACE "\xE2\x96\x81"

/* HF spellings of the known Split patterns (Oniguruma syntax). */
static const struct {
  const char *re;
  tok_pre_t pre;
} k_hf_regex[] = {
    {"'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+", TOK_PRE_GPT2},
    {"'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)", TOK_PRE_GPT2},
    {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
     "\\s+(?!\\S)|\\s+",
     TOK_PRE_LLAMA3},
    {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
     "\\s+(?!\\S)|\\s+",
     TOK_PRE_QWEN2},
};

typedef struct {
  model_tokenizer_t *t;
  int n_steps;       /* pre-tokenizer steps seen */
  int kinds[8];      /* step kinds, for naming the pipeline */
  tok_pre_t split_pre;
  bool spm;          /* SentencePiece-style text */
} json_ctx_t;

enum { STEP_BYTELEVEL_RE = 1, STEP_BYTELEVEL, STEP_DIGITS1, STEP_DIGITS, STEP_SPLIT, STEP_METASPACE };

static const char *jstr(json_t *o, const char *key) {
  json_t *v = json_object_get(o, key);
  return json_is_string(v) ? json_string_value(v) : NULL;
}

static bool jbool(json_t *o, const char *key, bool dflt) {
  json_t *v = json_object_get(o, key);
  return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static int add_step(json_ctx_t *c, int kind) {
  if (c->n_steps >= (int)FR_ARRAY_SIZE(c->kinds))
    return fr_errorf(FR_EUNSUPPORTED, "tokenizer.json: pre_tokenizer has too many steps");
  c->kinds[c->n_steps++] = kind;
  return 0;
}

static int pre_split(json_ctx_t *c, json_t *p) {
  json_t *pat = json_object_get(p, "pattern");
  const char *re = json_is_object(pat) ? jstr(pat, "Regex") : NULL;
  const char *beh = jstr(p, "behavior");
  if (!re) return fr_errorf(FR_EUNSUPPORTED, "tokenizer.json: Split without a Regex pattern is not supported");
  if (jbool(p, "invert", false) || (beh && strcmp(beh, "Isolated")))
    return fr_errorf(FR_EUNSUPPORTED, "tokenizer.json: Split with behavior %s/invert is not supported",
                     beh ? beh : "?");
  for (size_t i = 0; i < FR_ARRAY_SIZE(k_hf_regex); i++) {
    const char *ours = tok__known_regex(k_hf_regex[i].pre);
    if (!strcmp(re, k_hf_regex[i].re) || (ours && !strcmp(re, ours))) {
      c->split_pre = k_hf_regex[i].pre;
      int rc = add_step(c, STEP_SPLIT);
      return rc ? rc : tok__compile_one(c->t, tok__known_regex(k_hf_regex[i].pre));
    }
  }
  return fr_errorf(FR_EUNSUPPORTED, "tokenizer.json: Split regex '%.80s' is not a known pre-tokenizer", re);
}

static int pre_metaspace(json_ctx_t *c, json_t *p) {
  const char *rep = jstr(p, "replacement");
  if (rep && strcmp(rep, SPM_SPACE))
    return fr_errorf(FR_EUNSUPPORTED, "tokenizer.json: Metaspace replacement must be U+2581");
  const char *scheme = jstr(p, "prepend_scheme");
  bool add = jbool(p, "add_prefix_space", true);
  c->spm = true;
  c->t->add_space_prefix = scheme ? strcmp(scheme, "never") != 0 : add;
  c->t->prepend_scheme = scheme && !strcmp(scheme, "first") ? 1 : 0;
  int rc = add_step(c, STEP_METASPACE);
  if (!rc && jbool(p, "split", true)) rc = tok__compile_one(c->t, "\\x{2581}[^\\x{2581}]*|[^\\x{2581}]+");
  return rc;
}

static int pre_one(json_ctx_t *c, json_t *p) {
  const char *type = json_is_object(p) ? jstr(p, "type") : NULL;
  if (!type) return fr_errorf(FR_EFORMAT, "tokenizer.json: pre_tokenizer entry without a type");
  if (!strcmp(type, "Sequence")) {
    json_t *arr = json_object_get(p, "pretokenizers"), *e;
    size_t i;
    if (!json_is_array(arr)) return fr_errorf(FR_EFORMAT, "tokenizer.json: Sequence without pretokenizers");
    json_array_foreach(arr, i, e) {
      int rc = pre_one(c, e);
      if (rc) return rc;
    }
    return 0;
  }
  if (!strcmp(type, "ByteLevel")) {
    if (jbool(p, "add_prefix_space", false))
      return fr_errorf(FR_EUNSUPPORTED, "tokenizer.json: ByteLevel add_prefix_space is not supported");
    c->t->byte_level = true;
    bool re = jbool(p, "use_regex", true);
    int rc = add_step(c, re ? STEP_BYTELEVEL_RE : STEP_BYTELEVEL);
    return rc ? rc : re ? tok__compile_one(c->t, tok__known_regex(TOK_PRE_GPT2)) : 0;
  }
  if (!strcmp(type, "Digits")) {
    bool one = jbool(p, "individual_digits", false);
    int rc = add_step(c, one ? STEP_DIGITS1 : STEP_DIGITS);
    return rc ? rc : tok__compile_one(c->t, one ? "\\p{N}" : "\\p{N}+");
  }
  if (!strcmp(type, "Split")) return pre_split(c, p);
  if (!strcmp(type, "Metaspace")) return pre_metaspace(c, p);
  return fr_errorf(FR_EUNSUPPORTED, "tokenizer.json: pre_tokenizer %s is not supported", type);
}

/* Names the pipeline after llama.cpp's pre-tokenizers where it is one. */
static void name_pipeline(json_ctx_t *c) {
  model_tokenizer_t *t = c->t;
  const int *k = c->kinds;
  tok_pre_t pre = TOK_PRE_NONE;
  const char *name = c->n_steps ? "custom" : "none";
  if (c->n_steps == 1 && k[0] == STEP_BYTELEVEL_RE) pre = TOK_PRE_GPT2, name = "gpt2";
  if (c->n_steps == 2 && k[0] == STEP_DIGITS1 && k[1] == STEP_BYTELEVEL_RE) pre = TOK_PRE_SMOLLM, name = "smollm";
  if (c->n_steps == 2 && k[0] == STEP_SPLIT && k[1] == STEP_BYTELEVEL) {
    pre = c->split_pre;
    name = pre == TOK_PRE_LLAMA3 ? "llama3" : pre == TOK_PRE_QWEN2 ? "qwen2" : "gpt2";
  }
  if (c->spm) name = "spm";
  t->pre = pre;
  snprintf(t->pre_name, sizeof(t->pre_name), "%s", name);
}

/* normalizer: null, or Prepend("▁") / Replace(" ", "▁") (alone or in a
 * Sequence) for SentencePiece-style text. */
static int normalizer(json_ctx_t *c, json_t *n) {
  if (!n || json_is_null(n)) return 0;
  const char *type = jstr(n, "type");
  if (!type) return fr_errorf(FR_EFORMAT, "tokenizer.json: normalizer without a type");
  if (!strcmp(type, "Sequence")) {
    json_t *arr = json_object_get(n, "normalizers"), *e;
    size_t i;
    if (!json_is_array(arr)) return fr_errorf(FR_EFORMAT, "tokenizer.json: Sequence without normalizers");
    json_array_foreach(arr, i, e) {
      int rc = normalizer(c, e);
      if (rc) return rc;
    }
    return 0;
  }
  if (!strcmp(type, "NFC")) {
    /* Qwen2/Qwen3 ship NFC; like llama.cpp (whose GGUF has no normalizer)
     * we leave the text as it is: most input is NFC already. */
    return 0;
  }
  if (!strcmp(type, "Prepend")) {
    const char *p = jstr(n, "prepend");
    if (!p || strcmp(p, SPM_SPACE)) return fr_errorf(FR_EUNSUPPORTED, "tokenizer.json: Prepend other than U+2581");
    c->spm = true;
    c->t->add_space_prefix = true;
    c->t->prepend_scheme = 0;
    return 0;
  }
  if (!strcmp(type, "Replace")) {
    json_t *pat = json_object_get(n, "pattern");
    const char *from = json_is_object(pat) ? jstr(pat, "String") : NULL;
    const char *to = jstr(n, "content");
    if (!from || !to || strcmp(from, " ") || strcmp(to, SPM_SPACE))
      return fr_errorf(FR_EUNSUPPORTED, "tokenizer.json: only Replace(' ', U+2581) is supported");
    c->spm = true;
    return 0;
  }
  return fr_errorf(FR_EUNSUPPORTED, "tokenizer.json: normalizer %s is not supported", type);
}

/* ---------- vocabulary ---------- */

static int check_id(json_t *v, const char *what, int64_t *out) {
  if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= (1 << 22))
    return fr_errorf(FR_EFORMAT, "tokenizer.json: %s has an invalid id", what);
  *out = json_integer_value(v);
  return 0;
}

static int vocab_size(json_t *vocab, json_t *added, int64_t *n) {
  const char *key;
  json_t *v;
  size_t i;
  *n = 0;
  json_object_foreach(vocab, key, v) {
    int64_t id = 0;
    int rc = check_id(v, "model.vocab entry", &id);
    if (rc) return rc;
    *n = FR_MAX(*n, id + 1);
  }
  json_array_foreach(added, i, v) {
    int64_t id = 0;
    const char *content = json_is_object(v) ? jstr(v, "content") : NULL;
    if (!content) return fr_errorf(FR_EFORMAT, "tokenizer.json: added_tokens[%zu] has no content", i);
    int rc = check_id(json_object_get(v, "id"), "added token", &id);
    if (rc) return rc;
    *n = FR_MAX(*n, id + 1);
  }
  if (*n == 0) return fr_errorf(FR_EFORMAT, "tokenizer.json: empty vocabulary");
  /* ids may have gaps, but not so many that a tiny file allocates a huge table */
  size_t entries = json_object_size(vocab) + json_array_size(added);
  if ((size_t)*n > entries + 65536)
    return fr_errorf(FR_EFORMAT, "tokenizer.json: ids up to %lld for %zu tokens", (long long)*n - 1, entries);
  return 0;
}

static bool is_byte_token(const char *s, size_t n) {
  return n == 6 && !memcmp(s, "<0x", 3) && s[5] == '>' && strchr("0123456789ABCDEF", s[3]) &&
         strchr("0123456789ABCDEF", s[4]) && s[3] && s[4];
}

static int load_vocab(model_tokenizer_t *t, json_t *vocab, json_t *added) {
  const char *key;
  json_t *v;
  size_t i;
  for (int32_t id = 0; id < t->n_vocab; id++) tok__set_token(t, id, "", 0, 0.0f, TOK_T_UNUSED);
  json_object_foreach(vocab, key, v) {
    size_t len = strlen(key);
    int type = t->byte_fallback && is_byte_token(key, len) ? TOK_T_BYTE : TOK_T_NORMAL;
    int rc = tok__set_token(t, (int32_t)json_integer_value(v), key, len, 0.0f, type);
    if (rc) return rc;
  }
  json_array_foreach(added, i, v) {
    const char *content = jstr(v, "content");
    int type = jbool(v, "special", false) ? TOK_T_CONTROL : TOK_T_USER;
    int rc = tok__set_token(t, (int32_t)json_integer_value(json_object_get(v, "id")), content, strlen(content), 0.0f,
                            type);
    if (rc) return rc;
  }
  return tok__index(t);
}

static int load_merges(model_tokenizer_t *t, json_t *merges) {
  json_t *m;
  size_t i;
  if (!merges) return 0;
  if (!json_is_array(merges)) return fr_errorf(FR_EFORMAT, "tokenizer.json: model.merges is not an array");
  if (json_array_size(merges) > INT32_MAX) return fr_errorf(FR_ETOOBIG, "tokenizer.json: too many merges");
  json_array_foreach(merges, i, m) {
    const char *a = NULL, *b = NULL;
    size_t al = 0, bl = 0;
    if (json_is_string(m)) {
      const char *s = json_string_value(m), *sp = strchr(s, ' ');
      if (sp) a = s, al = (size_t)(sp - s), b = sp + 1, bl = strlen(sp + 1);
    } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
               json_is_string(json_array_get(m, 1))) {
      a = json_string_value(json_array_get(m, 0)), al = json_string_length(json_array_get(m, 0));
      b = json_string_value(json_array_get(m, 1)), bl = json_string_length(json_array_get(m, 1));
    }
    if (!a || al == 0 || bl == 0)
      return fr_errorf(FR_EFORMAT, "tokenizer.json: merges[%zu] is not \"a b\" or [a, b]", i);
    if (tok__add_merge(t, a, al, b, bl, (int32_t)i))
      return fr_errorf(FR_EFORMAT, "tokenizer.json: merges[%zu] ('%.40s' + '%.40s') names a token not in the vocabulary",
                       i, a, b);
  }
  return 0;
}

/* post_processor TemplateProcessing: a special token before $A adds BOS,
 * one after adds EOS. */
static void post_processor(model_tokenizer_t *t, json_t *pp) {
  json_t *single = json_is_object(pp) ? json_object_get(pp, "single") : NULL, *e;
  size_t i;
  bool seen_seq = false;
  if (!json_is_array(single)) return;
  json_array_foreach(single, i, e) {
    json_t *sp = json_object_get(e, "SpecialToken");
    if (json_object_get(e, "Sequence")) seen_seq = true;
    const char *id = json_is_object(sp) ? jstr(sp, "id") : NULL;
    int32_t tok = id ? tok__lookup(t, id, strlen(id)) : -1;
    if (tok < 0) continue;
    if (!seen_seq) t->bos = tok, t->add_bos = true;
    else t->eos = tok, t->add_eos = true;
  }
}

static int32_t token_field(model_tokenizer_t *t, json_t *cfg, const char *key) {
  json_t *v = json_object_get(cfg, key);
  const char *s = json_is_string(v) ? json_string_value(v) : json_is_object(v) ? jstr(v, "content") : NULL;
  return s ? tok__lookup(t, s, strlen(s)) : -1;
}

int tok__parse_template_json(model_tokenizer_t *t, const char *text) {
  json_error_t err;
  /* numbers as reals: only strings and booleans are read, and transformers
   * writes model_max_length 1e30 as an integer past int64 */
  json_t *cfg = json_loads(text, JSON_DECODE_INT_AS_REAL, &err);
  if (!json_is_object(cfg)) {
    json_decref(cfg);
    return fr_errorf(FR_EFORMAT, "tokenizer_config.json: %s (line %d)", err.text, err.line);
  }
  int32_t id = token_field(t, cfg, "bos_token");
  if (id >= 0) t->bos = id;
  if ((id = token_field(t, cfg, "eos_token")) >= 0) t->eos = id;
  if ((id = token_field(t, cfg, "unk_token")) >= 0) t->unk = id;
  if ((id = token_field(t, cfg, "pad_token")) >= 0) t->pad = id;
  t->add_bos = jbool(cfg, "add_bos_token", t->add_bos);
  t->add_eos = jbool(cfg, "add_eos_token", t->add_eos);
  json_t *ct = json_object_get(cfg, "chat_template"), *e;
  size_t i;
  const char *tmpl = json_is_string(ct) ? json_string_value(ct) : NULL;
  if (json_is_array(ct)) {
    json_array_foreach(ct, i, e) {
      const char *name = jstr(e, "name");
      if (name && !strcmp(name, "default")) tmpl = jstr(e, "template");
    }
  }
  if (tmpl) {
    free(t->chat_template);
    t->chat_template = fr_strdup(tmpl);
  }
  json_decref(cfg);
  return 0;
}

static int check_model(json_t *model) {
  const char *type = jstr(model, "type");
  if (type && strcmp(type, "BPE") && strcmp(type, "WordPiece"))
    return fr_errorf(FR_EUNSUPPORTED, "tokenizer.json: model type %s is not supported (BPE, WordPiece)", type);
  if (type && !strcmp(type, "WordPiece")) return json_is_object(json_object_get(model, "vocab")) ? 0
      : fr_errorf(FR_EFORMAT, "tokenizer.json: model.vocab missing or not an object");
  if (!json_is_object(json_object_get(model, "vocab")))
    return fr_errorf(FR_EFORMAT, "tokenizer.json: model.vocab missing or not an object");
  const char *pfx = jstr(model, "continuing_subword_prefix"), *sfx = jstr(model, "end_of_word_suffix");
  if ((pfx && *pfx) || (sfx && *sfx))
    return fr_errorf(FR_EUNSUPPORTED, "tokenizer.json: BPE subword prefix/suffix is not supported");
  json_t *drop = json_object_get(model, "dropout");
  if (json_is_number(drop) && json_number_value(drop) > 0.0)
    return fr_errorf(FR_EUNSUPPORTED, "tokenizer.json: BPE dropout is not supported");
  return 0;
}

/* WordPiece (BERT): the model's prefix and word limit, a BertNormalizer
 * (or none) and a BertPreTokenizer; [CLS] / [SEP] from the post-processor. */
static int wordpiece(model_tokenizer_t *t, json_t *root, json_t *model) {
  json_t *norm = json_object_get(root, "normalizer"), *pre = json_object_get(root, "pre_tokenizer");
  tok__wpm_defaults(t);
  t->add_bos = t->add_eos = false; /* the post-processor says */
  const char *pfx = jstr(model, "continuing_subword_prefix");
  if (pfx && strlen(pfx) >= sizeof t->wpm_prefix)
    return fr_errorf(FR_EUNSUPPORTED, "tokenizer.json: continuing_subword_prefix is too long");
  if (pfx) snprintf(t->wpm_prefix, sizeof t->wpm_prefix, "%s", pfx);
  json_t *mc = json_object_get(model, "max_input_chars_per_word");
  if (json_is_integer(mc)) t->wpm_max_chars = (int)FR_MAX(0, FR_MIN(json_integer_value(mc), 1 << 20));
  const char *nt = json_is_object(norm) ? jstr(norm, "type") : NULL;
  if (nt && strcmp(nt, "BertNormalizer"))
    return fr_errorf(FR_EUNSUPPORTED, "tokenizer.json: WordPiece with normalizer %s (BertNormalizer only)", nt);
  if (!nt) t->wpm_clean = t->wpm_chinese = t->wpm_strip_accents = t->wpm_lower = false;
  else {
    t->wpm_clean = jbool(norm, "clean_text", true);
    t->wpm_chinese = jbool(norm, "handle_chinese_chars", true);
    t->wpm_lower = jbool(norm, "lowercase", true);
    json_t *sa = json_object_get(norm, "strip_accents"); /* null: as lowercase */
    t->wpm_strip_accents = json_is_boolean(sa) ? json_is_true(sa) : t->wpm_lower;
  }
  const char *pt = json_is_object(pre) ? jstr(pre, "type") : NULL;
  if (!pt || strcmp(pt, "BertPreTokenizer"))
    return fr_errorf(FR_EUNSUPPORTED, "tokenizer.json: WordPiece with pre_tokenizer %s (BertPreTokenizer only)",
                     pt ? pt : "none");
  json_t *pp = json_object_get(root, "post_processor");
  const char *ppt = json_is_object(pp) ? jstr(pp, "type") : NULL;
  if (ppt && !strcmp(ppt, "BertProcessing")) { /* "cls": ["[CLS]", 101], "sep": ["[SEP]", 102] */
    json_t *cls = json_object_get(pp, "cls"), *sep = json_object_get(pp, "sep");
    if (json_is_integer(json_array_get(cls, 1))) t->bos = (int32_t)json_integer_value(json_array_get(cls, 1));
    if (json_is_integer(json_array_get(sep, 1))) t->eos = (int32_t)json_integer_value(json_array_get(sep, 1));
    t->add_bos = t->bos >= 0 && t->bos < t->n_vocab;
    t->add_eos = t->eos >= 0 && t->eos < t->n_vocab;
  } else {
    post_processor(t, pp);
  }
  const char *unk = jstr(model, "unk_token");
  if (unk) t->unk = tok__lookup(t, unk, strlen(unk));
  return 0;
}

static int build(model_tokenizer_t **out, json_t *root) {
  json_t *model = json_object_get(root, "model");
  json_t *added = json_object_get(root, "added_tokens");
  if (!json_is_object(model)) return fr_errorf(FR_EFORMAT, "tokenizer.json: no model object");
  if (added && !json_is_null(added) && !json_is_array(added))
    return fr_errorf(FR_EFORMAT, "tokenizer.json: added_tokens is not an array");
  if (!json_is_array(added)) added = NULL;
  int rc = check_model(model);
  int64_t n = 0;
  json_t *empty = json_array();
  if (!rc) rc = vocab_size(json_object_get(model, "vocab"), added ? added : empty, &n);
  model_tokenizer_t *t = NULL;
  if (!rc) rc = tok__create(&t, n);
  if (rc) goto done;
  t->kind = MODEL_TOK_BPE;
  const char *type = jstr(model, "type");
  if (type && !strcmp(type, "WordPiece")) {
    rc = load_vocab(t, json_object_get(model, "vocab"), added ? added : empty);
    if (!rc) rc = wordpiece(t, root, model);
    goto done;
  }
  t->byte_fallback = jbool(model, "byte_fallback", false);
  t->ignore_merges = jbool(model, "ignore_merges", false);
  rc = load_vocab(t, json_object_get(model, "vocab"), added ? added : empty);
  if (!rc) rc = load_merges(t, json_object_get(model, "merges"));
  json_ctx_t c = {.t = t};
  if (!rc) rc = normalizer(&c, json_object_get(root, "normalizer"));
  json_t *pre = json_object_get(root, "pre_tokenizer");
  if (!rc && pre && !json_is_null(pre)) rc = pre_one(&c, pre);
  if (rc) goto done;
  name_pipeline(&c);
  if (c.spm) t->kind = MODEL_TOK_SPM, t->spm_merges = true;
  if (c.spm && t->byte_level) {
    rc = fr_errorf(FR_EUNSUPPORTED, "tokenizer.json: both ByteLevel and SentencePiece-style steps");
    goto done;
  }
  const char *unk = jstr(model, "unk_token");
  if (unk) t->unk = tok__lookup(t, unk, strlen(unk));
  post_processor(t, json_object_get(root, "post_processor"));
done:
  json_decref(empty);
  if (rc) model_tokenizer_destroy(t);
  else *out = t;
  return rc;
}

int model_tokenizer_from_json(model_tokenizer_t **out, const char *tokenizer_json, const char *tokenizer_config_json) {
  *out = NULL;
  if (!tokenizer_json) return fr_errorf(-EINVAL, "tokenizer.json: no text");
  json_error_t err;
  json_t *root = json_loads(tokenizer_json, JSON_REJECT_DUPLICATES, &err);
  if (!json_is_object(root)) {
    json_decref(root);
    return fr_errorf(FR_EFORMAT, "tokenizer.json: %s (line %d, column %d)", err.text, err.line, err.column);
  }
  model_tokenizer_t *t = NULL;
  int rc = build(&t, root);
  json_decref(root);
  if (!rc && tokenizer_config_json) rc = tok__parse_template_json(t, tokenizer_config_json);
  if (!rc) rc = tok__finish(t);
  if (rc) {
    model_tokenizer_destroy(t);
    return rc;
  }
  *out = t;
  return 0;
}

/* A chat_template.jinja beside tokenizer.json wins over tokenizer_config.json's,
 * as in transformers. */
static void tok__chat_template_file(model_tokenizer_t *t, const char *tokenizer_path) {
  const char *slash = strrchr(tokenizer_path, '/');
  size_t dir = slash ? (size_t)(slash - tokenizer_path) + 1 : 0;
  char *path = fr_malloc(dir + sizeof "chat_template.jinja");
  memcpy(path, tokenizer_path, dir);
  memcpy(path + dir, "chat_template.jinja", sizeof "chat_template.jinja");
  char *text = NULL;
  if (access(path, R_OK) == 0 && model__file_read("chat template", path, TOK_MAX_JSON, &text, NULL) == 0) {
    free(t->chat_template);
    t->chat_template = text;
  }
  free(path);
}

int model_tokenizer_from_json_files(model_tokenizer_t **out, const char *tokenizer_path, const char *config_path) {
  *out = NULL;
  char *tok = NULL, *cfg = NULL;
  int rc = model__file_read("tokenizer", tokenizer_path, TOK_MAX_JSON, &tok, NULL);
  if (!rc && config_path) rc = model__file_read("tokenizer", config_path, TOK_MAX_JSON, &cfg, NULL);
  if (!rc) rc = model_tokenizer_from_json(out, tok, cfg);
  free(tok);
  free(cfg);
  if (!rc) tok__chat_template_file(*out, tokenizer_path);
  return rc;
}
