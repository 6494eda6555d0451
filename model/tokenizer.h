/* tokenizer.h - tokenizers: byte-level BPE (gpt2 / llama3 / qwen2 / smollm
 * pre-tokenizers, PCRE2 regexes) and SentencePiece BPE with byte fallback,
 * loaded from GGUF metadata or a Hugging Face tokenizer.json.
 *
 * Encoding matches Hugging Face `tokenizers` and llama.cpp on the same
 * vocabulary. Special / added tokens are matched in the text (longest
 * first) when parse_special is true. Decoding is streaming-safe through
 * model_detok_t, which never emits an incomplete UTF-8 sequence.
 *
 * Threads: an opened tokenizer is immutable; encode/decode may run from
 * several threads at once.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/gguf.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { MODEL_TOK_BPE = 0, MODEL_TOK_SPM = 1, MODEL_TOK_WPM = 2 /* WordPiece (BERT) */ } model_tok_kind_t;

typedef struct model_tokenizer model_tokenizer_t;

int model_tokenizer_from_gguf(model_tokenizer_t **out, const model_gguf_t *g);
/* From the JSON texts of tokenizer.json and tokenizer_config.json (NUL-
 * terminated; the config may be NULL: it supplies bos/eos/add_bos and the
 * chat template). */
int model_tokenizer_from_json(model_tokenizer_t **out, const char *tokenizer_json,
                              const char *tokenizer_config_json);
/* Same, from the files' paths (config_path may be NULL). */
int model_tokenizer_from_json_files(model_tokenizer_t **out, const char *tokenizer_path, const char *config_path);
void model_tokenizer_destroy(model_tokenizer_t *t);

/* Encodes UTF-8 text (len bytes; need not be NUL-terminated). add_special
 * adds BOS/EOS as the model's config says; parse_special matches special
 * tokens in the text. *out is fr_malloc'd (caller frees), *n_out its length.
 * Invalid UTF-8 is encoded byte-wise, never rejected. */
int model_tokenize(const model_tokenizer_t *t, const char *text, size_t len, bool add_special, bool parse_special,
                   int32_t **out, size_t *n_out);

/* The raw bytes of a token after byte-level / SPM decoding (no cleanup);
 * NULL and 0 for an invalid id. Special tokens give their text. */
const char *model_token_bytes(const model_tokenizer_t *t, int32_t id, size_t *len);

/* Decodes ids to UTF-8 into a fr_malloc'd NUL-terminated string. skip_special
 * drops control tokens (BOS, EOS, ...). Invalid ids are skipped; bytes that
 * do not form valid UTF-8 come out as U+FFFD (as HF's decode does). For
 * SentencePiece vocabularies the space prefix of the first piece is
 * removed, as llama.cpp and HF do. */
char *model_detokenize(const model_tokenizer_t *t, const int32_t *ids, size_t n, bool skip_special);

int model_vocab_size(const model_tokenizer_t *t);
model_tok_kind_t model_tokenizer_kind(const model_tokenizer_t *t);
const char *model_tokenizer_pre(const model_tokenizer_t *t); /* "smollm", "llama3", ... */
int32_t model_token_bos(const model_tokenizer_t *t); /* -1 when none */
int32_t model_token_eos(const model_tokenizer_t *t); /* -1 when none */
bool model_tokenizer_adds_bos(const model_tokenizer_t *t);
/* True for tokens that end generation (EOS, EOT, <|im_end|>, <|eot_id|>, ...). */
bool model_token_is_eog(const model_tokenizer_t *t, int32_t id);
/* True for control tokens (not printed when skip_special). */
bool model_token_is_control(const model_tokenizer_t *t, int32_t id);
/* Token id of an exact token text, or -1. */
int32_t model_token_lookup(const model_tokenizer_t *t, const char *text, size_t len);
/* The chat template text shipped with the tokenizer, or NULL. */
const char *model_tokenizer_chat_template(const model_tokenizer_t *t);
/* Replaces the chat template (serve --chat-template), before any thread
 * uses the tokenizer; text is copied. */
void model_tokenizer_set_chat_template(model_tokenizer_t *t, const char *text);

/* Streaming detokenizer: feed tokens one at a time, get the bytes that are
 * complete UTF-8 so far. */
typedef struct {
  const model_tokenizer_t *tok;
  bool skip_special;
  char pending[8]; /* bytes of an incomplete UTF-8 sequence */
  int n_pending;
  bool strip_space; /* SPM: drop the leading space of the first piece */
} model_detok_t;

void model_detok_init(model_detok_t *d, const model_tokenizer_t *t, bool skip_special);
/* Writes the complete UTF-8 text after feeding `id` to out (up to cap
 * bytes, NUL-terminated) and returns the number of bytes written, or a
 * negative error (FR_ETOOBIG, state unchanged) when out is too small.
 * Invalid byte sequences come out as U+FFFD; skip_special drops control
 * tokens. A cap of 4 * (longest token + 4) bytes is always enough. */
int model_detok_feed(model_detok_t *d, int32_t id, char *out, size_t cap);
/* Flushes pending bytes (invalid tail as U+FFFD). */
int model_detok_flush(model_detok_t *d, char *out, size_t cap);

#ifdef __cplusplus
}
#endif
