/* prompt.h - turning a user's text into prompt tokens: the chat template
 * (as a single user message) or the raw text. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/chat.h"
#include "model/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Renders msgs with the model's chat template and tokenizes the result
 * (special tokens parsed, no extra BOS: the template writes it). */
int model_prompt_chat(const model_t *m, const model_chat_msg_t *msgs, size_t n, int32_t **ids, size_t *n_ids);

/* raw: tokenizes text as is (the model's BOS added if it wants one);
 * otherwise text is one user message. */
int model_prompt_tokenize(const model_t *m, const char *text, bool raw, int32_t **ids, size_t *n_ids);

#ifdef __cplusplus
}
#endif
