/* fuzz_tokenizer_json.c - libFuzzer target: arbitrary bytes as a
 * tokenizer.json (and the same bytes as tokenizer_config.json next to a
 * valid one); whatever loads is used to encode and decode a few strings. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const k_texts[] = {"", "Hello world 123", "<|im_start|>user\n\xF0\x9F\x98\x80<|im_end|>",
                                      "  \t\r\n x", "\xFF\xFE invalid", "ab ab abc"};

static void exercise(const model_tokenizer_t *t) {
  for (size_t i = 0; i < sizeof(k_texts) / sizeof(k_texts[0]); i++) {
    int32_t *ids;
    size_t n;
    if (model_tokenize(t, k_texts[i], strlen(k_texts[i]), true, i & 1, &ids, &n) != 0) continue;
    for (size_t k = 0; k < n; k++)
      if (ids[k] < 0 || ids[k] >= model_vocab_size(t)) abort();
    free(model_detokenize(t, ids, n, i & 1));
    free(ids);
  }
  for (int32_t id = -1; id <= model_vocab_size(t) && id < 64; id++) {
    size_t len;
    (void)model_token_bytes(t, id, &len);
    (void)model_token_is_eog(t, id);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1);
  memcpy(text, data, size);
  text[size] = '\0';
  model_tokenizer_t *t = NULL;
  if (model_tokenizer_from_json(&t, text, NULL) == 0) {
    exercise(t);
    model_tokenizer_destroy(t);
  }
  static const char *const base =
      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\"]}}";
  if (model_tokenizer_from_json(&t, base, text) == 0) {
    exercise(t);
    model_tokenizer_destroy(t);
  }
  free(text);
  return 0;
}
