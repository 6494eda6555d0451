/* prompt.c - chat template + tokenizer. */
#include "model/prompt.h"

#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"

int model_prompt_chat(const model_t *m, const model_chat_msg_t *msgs, size_t n, int32_t **ids, size_t *n_ids) {
  model_chat_t chat = {.msgs = msgs, .n = n};
  return model_chat_tokenize(m->tok, &chat, ids, n_ids);
}

int model_prompt_tokenize(const model_t *m, const char *text, bool raw, int32_t **ids, size_t *n_ids) {
  if (raw) return model_tokenize(m->tok, text, strlen(text), true, true, ids, n_ids);
  model_chat_msg_t msg = {.role = "user", .content = text};
  return model_prompt_chat(m, &msg, 1, ids, n_ids);
}
