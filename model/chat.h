/* chat.h - a chat as prompt tokens. The model's own Jinja chat template
 * (GGUF tokenizer.chat_template, tokenizer_config.json chat_template, a
 * chat_template.jinja beside it, or `serve --chat-template`) is rendered by
 * model/jinja.h as transformers' apply_chat_template does. The hand-written
 * renderers below are only the fallback for a model with no template, when
 * the template is given as a built-in name ("chatml", "llama3", ...):
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
  const char *role;    /* "system", "user", "assistant", "tool" */
  const char *content; /* UTF-8 (text parts joined) */
  const char *json;    /* or NULL: the message object as the request gave it (content parts,
                        * tool_calls, tool_call_id, name), what a Jinja template sees */
} model_chat_msg_t;

/* A chat: its messages and what else the template sees. Borrowed. */
typedef struct {
  const model_chat_msg_t *msgs; /* (n) */
  size_t n;
  const char *vars;             /* NULL, or a JSON object of more variables: the request's
                                 * chat_template_kwargs and its "tools" (a list) */
} model_chat_t;

/* Detects the family from the Jinja template text (NULL -> UNKNOWN). */
model_chat_kind_t model_chat_detect(const char *jinja_template);
const char *model_chat_kind_name(model_chat_kind_t k);

/* Renders messages plus the generation prompt into a fr_malloc'd string.
 * bos_text is the tokenizer's BOS token text, for templates that write it
 * (llama2, llama3, mistral); may be NULL. Returns 0 or FR_EUNSUPPORTED. */
int model_chat_render(model_chat_kind_t k, const model_chat_msg_t *msgs, size_t n, const char *bos_text, char **out);

/* A chat template for serve --chat-template: a built-in renderer's name
 * (kept as is), or a Jinja file's text, checked to parse. *out is
 * fr_malloc'd. Returns 0, the file's error, or FR_EFORMAT. */
int model_chat_template_load(const char *name_or_path, char **out);

/* Renders a chat with the tokenizer's Jinja template (messages,
 * add_generation_prompt=True, bos_token, eos_token, and chat->vars) into *out, fr_malloc'd. A template that is a built-in name
 * uses that hand-written renderer. Returns 0, FR_EUNSUPPORTED when the
 * tokenizer has no template, FR_EFORMAT for a template error (syntax,
 * raise_exception, ...: the message says which), FR_ETOOBIG for a limit. */
struct model_tokenizer;
int model_chat_apply(const struct model_tokenizer *tok, const model_chat_t *chat, char **out);

/* The prompt tokens of a chat: model_chat_apply, then tokenized with
 * special tokens parsed and no BOS added (the template writes it). This is
 * the one chat -> tokens path. *ids is fr_malloc'd. Returns 0,
 * model_chat_apply's errors, or the tokenizer's. */
int model_chat_tokenize(const struct model_tokenizer *tok, const model_chat_t *chat, int32_t **ids, size_t *n_ids);

#ifdef __cplusplus
}
#endif
