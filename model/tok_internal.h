/* tok_internal.h - private to the tokenizer library (model/tokenizer*.c,
 * model/tok_*.c): the tokenizer object, its builders and the encoders.
 *
 * A tokenizer is built in three steps by a loader (GGUF or tokenizer.json):
 * tok__create() with the vocabulary size, tok__set_token() / tok__add_merge()
 * for the contents, then tok__finish() which derives every lookup table. After
 * tok__finish() the object is immutable and safe to share between threads.
 */
#pragma once

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Token types, as GGUF's tokenizer.ggml.token_type. */
enum {
  TOK_T_UNDEFINED = 0,
  TOK_T_NORMAL = 1,
  TOK_T_UNKNOWN = 2,
  TOK_T_CONTROL = 3,
  TOK_T_USER = 4,
  TOK_T_UNUSED = 5,
  TOK_T_BYTE = 6,
};

typedef enum {
  TOK_PRE_DEFAULT = 0,
  TOK_PRE_GPT2,
  TOK_PRE_LLAMA3,
  TOK_PRE_QWEN2,
  TOK_PRE_SMOLLM,
  TOK_PRE_NONE, /* no pre-tokenizer (SPM, or HF BPE without one) */
} tok_pre_t;

#define TOK_MAX_RE 5
#define TOK_MAX_TOKEN_LEN 4096 /* longest token text we accept */

typedef struct {
  uint32_t off, len;   /* token text in the arena (as stored in the vocab) */
  uint32_t doff, dlen; /* decoded bytes in the arena */
  float score;
  uint8_t type;        /* TOK_T_* */
} tok_entry_t;

typedef struct {
  uint64_t key; /* (left id << 32) | right id; UINT64_MAX = empty */
  int32_t rank;
  int32_t id;   /* the merged token */
} tok_merge_slot_t;

struct model_tokenizer {
  model_tok_kind_t kind;
  tok_pre_t pre;
  char pre_name[32];
  int32_t n_vocab;
  tok_entry_t *tok; /* (n_vocab) */
  char *arena;      /* texts of all tokens, then their decoded bytes */
  size_t arena_len, arena_cap;

  int32_t *vmap;    /* open addressing text -> id; -1 empty; (vmap_cap) */
  size_t vmap_cap;
  tok_merge_slot_t *mmap; /* (mmap_cap) */
  size_t mmap_cap, n_merges;

  int32_t *special; /* ids matched in text, longest first; (n_special) */
  size_t n_special;

  pcre2_code *re[TOK_MAX_RE];
  int n_re;

  bool byte_level;       /* GPT-2 byte-to-unicode mapping of words */
  bool spm_merges;       /* SPM-style text (▁) encoded with BPE merges (HF) */
  bool ignore_merges;    /* a word found whole in the vocab is one token */
  bool byte_fallback;    /* unknown pieces become <0xXX> tokens */
  bool add_bos, add_eos, add_space_prefix;
  int prepend_scheme;    /* SPM: 0 every fragment, 1 first fragment only, 2 never */
  int32_t byte_tok[256]; /* byte-level: id of the mapped char; SPM: <0xXX> */
  int32_t bos, eos, eot, eom, unk, pad; /* WordPiece: bos is [CLS], eos [SEP] */
  /* WordPiece (kind MODEL_TOK_WPM): BertNormalizer's options, the
   * continuing-subword prefix ("##"; empty for GGUF vocabularies, whose
   * word-initial pieces start with U+2581 instead, as llama.cpp stores
   * them: wpm_phantom) and the longest word it splits (longer: [UNK]). */
  bool wpm_clean, wpm_chinese, wpm_strip_accents, wpm_lower, wpm_phantom;
  char wpm_prefix[16];
  int wpm_max_chars;
  uint8_t *eog;          /* (n_vocab) */
  char *chat_template;
};

/* --- building (tokenizer.c) --- */
int tok__create(model_tokenizer_t **out, int64_t n_vocab);
/* Sets token id's text (copied), score and type. */
int tok__set_token(model_tokenizer_t *t, int32_t id, const char *text, size_t len, float score, int type);
/* Adds the merge "a b" with the given rank; ids must already be set. Returns
 * 0, or 1 when the merge was skipped (a part or the result is not a token). */
int tok__add_merge(model_tokenizer_t *t, const char *a, size_t alen, const char *b, size_t blen, int32_t rank);
/* Selects the pre-tokenizer by llama.cpp's tokenizer.ggml.pre name. */
int tok__set_pre(model_tokenizer_t *t, const char *name, size_t len);
/* Builds the lookup tables, special-token list, EOG set, regexes. */
int tok__finish(model_tokenizer_t *t);
/* Text -> id lookup over the vocab, usable after tok__create (the map is
 * built lazily by tok__index); -1 when absent. */
int32_t tok__lookup(const model_tokenizer_t *t, const char *s, size_t len);
int tok__index(model_tokenizer_t *t);
static inline const char *tok__text(const model_tokenizer_t *t, int32_t id) { return t->arena + t->tok[id].off; }

/* --- unicode helpers (tok_unicode.c) --- */
/* Length of the UTF-8 sequence at s (1..4), or 0 when it is not a valid,
 * complete sequence within n bytes. */
int tok__utf8_len(const unsigned char *s, size_t n);
/* Decodes a valid sequence of length l. */
/* Length of the maximal valid prefix of a sequence at s (>= 1 when n > 0);
 * *full is 1 for a whole character, 2 when the bytes ran out before it was
 * complete, 0 when it is invalid. */
int tok__utf8_prefix(const unsigned char *s, size_t n, int *full);
uint32_t tok__utf8_cp(const unsigned char *s, int l);
int tok__utf8_put(uint32_t cp, char *out);
/* GPT-2 bytes_to_unicode: the code point byte b maps to. */
uint32_t tok__byte_to_cp(uint8_t b);
/* Reverse mapping: -1 when cp is not a mapped byte. */
int tok__cp_to_byte(uint32_t cp);
/* Appends a lossy UTF-8 copy of in (invalid sequences as U+FFFD) to out,
 * which must hold 3*n bytes. Returns bytes written. */
size_t tok__utf8_lossy(const unsigned char *in, size_t n, char *out);
/* Python str.isspace() for a code point. */
bool tok__is_py_space(uint32_t cp);

/* --- encoders (tok_bpe.c, tok_spm.c) --- */
typedef struct {
  int32_t *v;
  size_t n, cap;
} tok_ids_t;
void tok__ids_push(tok_ids_t *ids, int32_t id);

/* Encodes one raw-text fragment (no special tokens inside). first tells
 * whether it starts the text or follows a special token (SPM space prefix). */
int tok__bpe_fragment(const model_tokenizer_t *t, const char *s, size_t n, bool first, bool at_start, tok_ids_t *out);
int tok__spm_fragment(const model_tokenizer_t *t, const char *s, size_t n, bool first, bool at_start, tok_ids_t *out);
/* WordPiece (tok_wpm.c): BertNormalizer, BertPreTokenizer and WordPiece
 * over one fragment. */
int tok__wpm_fragment(const model_tokenizer_t *t, const char *s, size_t n, tok_ids_t *out);
/* Sets BERT's defaults (lowercase, strip accents, Chinese characters and
 * clean text on; "##"; 100 characters a word). */
void tok__wpm_defaults(model_tokenizer_t *t);
/* Compiles the regexes of t->pre into t->re. */
int tok__compile_pre(model_tokenizer_t *t);
int tok__compile_one(model_tokenizer_t *t, const char *pattern);

/* --- loaders --- */
int tok__parse_template_json(model_tokenizer_t *t, const char *tokenizer_config_json);

#ifdef __cplusplus
}
#endif
