/* fuzz_tokenizer.c - libFuzzer target: arbitrary bytes as text into
 * tokenizers, checking invariants: ids are in the vocabulary, byte-level and
 * byte-fallback tokenizers round-trip valid UTF-8, and the streaming
 * detokenizer gives the same text as the batch one.
 *
 * Tokenizers: FERRUM_FUZZ_TOKENIZER (a .gguf or tokenizer.json path, e.g. the
 * SmolLM2 GGUF) when set, plus three small built-in vocabularies (byte-level
 * BPE with specials, SentencePiece-style BPE with byte fallback, BERT's
 * WordPiece with BertNormalizer and [CLS] / [SEP]). The first
 * input byte picks the tokenizer and the parse_special flag. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "model/gguf.h"
#include "model/tok_internal.h"
#include "model/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static model_tokenizer_t *g_tok[4];
static bool g_roundtrip[4];
static int g_n;
static model_gguf_t *g_gguf;

#define CHECK(x)                                                              \
  do {                                                                        \
    if (!(x)) {                                                               \
      fprintf(stderr, "fuzz_tokenizer: check failed: %s (line %d)\n", #x, __LINE__); \
      abort();                                                                \
    }                                                                         \
  } while (0)

static void append(char **s, size_t *n, size_t *cap, const char *add) {
  size_t l = strlen(add);
  while (*n + l + 1 > *cap) *s = realloc(*s, *cap = *cap * 2 + 64);
  memcpy(*s + *n, add, l + 1);
  *n += l;
}

/* A byte-level vocabulary: the 256 mapped bytes, a few merges, specials. */
static char *builtin_bytelevel(void) {
  char *s = NULL, buf[64];
  size_t n = 0, cap = 0;
  append(&s, &n, &cap, "{\"model\": {\"type\": \"BPE\", \"vocab\": {");
  for (int b = 0; b < 256; b++) {
    char u[8] = {0};
    tok__utf8_put(tok__byte_to_cp((uint8_t)b), u);
    snprintf(buf, sizeof(buf), "%s\"%s%s\": %d", b ? ", " : "", b == '"' || b == '\\' ? "\\" : "", u, b);
    append(&s, &n, &cap, buf);
  }
  append(&s, &n, &cap, ", \"he\": 256, \"ll\": 257, \"hell\": 258, \"hello\": 259, \"\xC4\xA0t\": 260, \"\xC4\xA0th\": 261}, "
                       "\"merges\": [\"h e\", \"l l\", \"he ll\", \"hell o\", \"\xC4\xA0 t\", \"\xC4\xA0t h\"]}, "
                       "\"added_tokens\": [{\"id\": 262, \"content\": \"<|im_start|>\", \"special\": true}, "
                       "{\"id\": 263, \"content\": \"<|im_end|>\", \"special\": true}, "
                       "{\"id\": 264, \"content\": \"<user>\", \"special\": false}], "
                       "\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\", "
                       "\"individual_digits\": true}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false}]}}");
  return s;
}

/* SentencePiece-style: U+2581 text, byte fallback for everything else. */
static char *builtin_spm(void) {
  char *s = NULL, buf[64];
  size_t n = 0, cap = 0;
  append(&s, &n, &cap, "{\"model\": {\"type\": \"BPE\", \"byte_fallback\": true, \"unk_token\": \"<unk>\", \"vocab\": "
                       "{\"<unk>\": 0, \"<s>\": 1, \"</s>\": 2");
  for (int b = 0; b < 256; b++) {
    snprintf(buf, sizeof(buf), ", \"<0x%02X>\": %d", b, 3 + b);
    append(&s, &n, &cap, buf);
  }
  append(&s, &n, &cap, ", \"\xE2\x96\x81\": 259, \"a\": 260, \"\xE2\x96\x81" "a\": 261, \"b\": 262, \"ab\": 263}, "
                       "\"merges\": [\"\xE2\x96\x81 a\", \"a b\"]}, "
                       "\"added_tokens\": [{\"id\": 1, \"content\": \"<s>\", \"special\": true}], "
                       "\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": "
                       "\"\xE2\x96\x81\"}, {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": "
                       "\"\xE2\x96\x81\"}]}}");
  return s;
}

/* WordPiece (BERT): lowercased, accents stripped, CJK split, "##" pieces. */
static const char *builtin_wordpiece(void) {
  return "{\"model\": {\"type\": \"WordPiece\", \"unk_token\": \"[UNK]\", \"continuing_subword_prefix\": \"##\", "
         "\"max_input_chars_per_word\": 12, \"vocab\": {\"[PAD]\": 0, \"[UNK]\": 1, \"[CLS]\": 2, \"[SEP]\": 3, "
         "\"a\": 4, \"##b\": 5, \"ab\": 6, \"e\": 7, \"##a\": 8, \"!\": 9, \"\xE4\xB8\xAD\": 10, \"##\xE1\x84\x80\": 11}}, "
         "\"added_tokens\": [{\"id\": 2, \"content\": \"[CLS]\", \"special\": true}, "
         "{\"id\": 3, \"content\": \"[SEP]\", \"special\": true}], "
         "\"normalizer\": {\"type\": \"BertNormalizer\", \"clean_text\": true, \"handle_chinese_chars\": true, "
         "\"strip_accents\": null, \"lowercase\": true}, \"pre_tokenizer\": {\"type\": \"BertPreTokenizer\"}, "
         "\"post_processor\": {\"type\": \"BertProcessing\", \"sep\": [\"[SEP]\", 3], \"cls\": [\"[CLS]\", 2]}}";
}

static model_tokenizer_t *from_path(const char *path) {
  model_tokenizer_t *t = NULL;
  size_t n = strlen(path);
  if (n > 5 && !strcmp(path + n - 5, ".gguf")) {
    if (model_gguf_open(&g_gguf, path) == 0) model_tokenizer_from_gguf(&t, g_gguf);
  } else {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)len + 1);
    buf[fread(buf, 1, (size_t)len, f)] = '\0';
    fclose(f);
    model_tokenizer_from_json(&t, buf, NULL);
    free(buf);
  }
  if (!t) fprintf(stderr, "fuzz_tokenizer: cannot load %s: %s\n", path, fr_last_error());
  return t;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  char *js = builtin_bytelevel();
  CHECK(model_tokenizer_from_json(&g_tok[g_n], js, NULL) == 0);
  g_roundtrip[g_n++] = true;
  free(js);
  js = builtin_spm();
  CHECK(model_tokenizer_from_json(&g_tok[g_n], js, NULL) == 0);
  g_roundtrip[g_n++] = true;
  free(js);
  CHECK(model_tokenizer_from_json(&g_tok[g_n], builtin_wordpiece(), NULL) == 0);
  g_roundtrip[g_n++] = false; /* lowercased, accents stripped */
  const char *p = getenv("FERRUM_FUZZ_TOKENIZER");
  if (p && (g_tok[g_n] = from_path(p))) g_roundtrip[g_n++] = false;
  return 0;
}

static bool valid_utf8(const uint8_t *s, size_t n) {
  for (size_t i = 0; i < n;) {
    int l = tok__utf8_len(s + i, n - i);
    if (!l) return false;
    i += (size_t)l;
  }
  return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0) return 0;
  const model_tokenizer_t *t = g_tok[data[0] % g_n];
  bool rt = g_roundtrip[data[0] % g_n];
  bool parse_special = data[0] & 0x80;
  const char *text = (const char *)data + 1;
  size_t n = size - 1, nids;
  int32_t *ids;
  CHECK(model_tokenize(t, text, n, data[0] & 0x40, parse_special, &ids, &nids) == 0);
  for (size_t i = 0; i < nids; i++) CHECK(ids[i] >= 0 && ids[i] < model_vocab_size(t));
  char *back = model_detokenize(t, ids, nids, false);
  if (rt && !parse_special && !(data[0] & 0x40) && !memchr(text, 0, n) && valid_utf8(data + 1, n) &&
      !memmem(text, n, "<user>", 6) && !memmem(text, n, "\xE2\x96\x81", 3)) /* a literal U+2581 decodes to ' ' */
    CHECK(strlen(back) == n && !memcmp(back, text, n));
  /* streaming gives the batch result */
  model_detok_t d;
  model_detok_init(&d, t, false);
  size_t cap = 64, o = 0;
  for (size_t i = 0; i < nids; i++) {
    size_t l;
    model_token_bytes(t, ids[i], &l);
    cap += 3 * l;
  }
  char *stream = malloc(cap), piece[4 * 4200];
  for (size_t i = 0; i <= nids; i++) {
    int w = i < nids ? model_detok_feed(&d, ids[i], piece, sizeof(piece)) : model_detok_flush(&d, piece, sizeof(piece));
    CHECK(w >= 0 && d.n_pending <= 3);
    CHECK(o + (size_t)w < cap);
    memcpy(stream + o, piece, (size_t)w);
    o += (size_t)w;
  }
  stream[o] = '\0';
  if (!memchr(back, 0, strlen(back)) && !memchr(stream, 0, o)) CHECK(!strcmp(stream, back));
  free(stream);
  free(back);
  free(ids);
  return 0;
}
