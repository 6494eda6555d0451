/* chat.h - chat templates for the families ferrum loads, detected from the
 * tokenizer's Jinja template text and rendered byte-equal to Hugging Face's
 * apply_chat_template(add_generation_prompt=True) for those families:
 *   CHATML (incl. SmolLM2's and Qwen2.5's default system prompts),
 *   LLAMA3, LLAMA2 / MISTRAL [INST], QWEN3 (enable_thinking=False).
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  MODEL_CHAT_UNKNOWN = 0,
  MODEL_CHAT_CHATML,       /* plain <|im_start|> template, no default system prompt */
  MODEL_CHAT_SMOLLM2,      /* chatml + "You are a helpful AI assistant named SmolLM, ..." */
  MODEL_CHAT_QWEN25,       /* chatml + "You are Qwen, created by Alibaba Cloud. ..." */
  MODEL_CHAT_QWEN3,        /* chatml, <think>\n\n</think>\n\n after the generation prompt */
  MODEL_CHAT_LLAMA3,
  MODEL_CHAT_LLAMA2,       /* <s>[INST] <<SYS>> ... */
  MODEL_CHAT_MISTRAL,      /* [INST] ... [/INST] (v1/v3 style) */
} model_chat_kind_t;

typedef struct {
  const char *role;    /* "system", "user", "assistant" */
  const char *content; /* UTF-8 */
} model_chat_msg_t;

/* Detects the family from the Jinja template text (NULL -> UNKNOWN). */
model_chat_kind_t model_chat_detect(const char *jinja_template);
const char *model_chat_kind_name(model_chat_kind_t k);

/* Renders messages plus the generation prompt into a fr_malloc'd string.
 * bos_text is the tokenizer's BOS token text, for templates that write it
 * (llama2, llama3, mistral); may be NULL. Returns 0 or FR_EUNSUPPORTED. */
int model_chat_render(model_chat_kind_t k, const model_chat_msg_t *msgs, size_t n, const char *bos_text, char **out);

/* The prompt tokens of a chat: rendered with the template of kind k (the
 * tokenizer's BOS text handed to it), then tokenized with special tokens
 * parsed and no BOS added (the template writes it). *ids is fr_malloc'd.
 * Returns 0, FR_EUNSUPPORTED for MODEL_CHAT_UNKNOWN, or the tokenizer's error. */
struct model_tokenizer;
int model_chat_tokenize(const struct model_tokenizer *tok, model_chat_kind_t k, const model_chat_msg_t *msgs, size_t n,
                        int32_t **ids, size_t *n_ids);

#ifdef __cplusplus
}
#endif
