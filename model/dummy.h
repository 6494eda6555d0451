/* dummy.h - built-in configs of well-known models for --load-format dummy. */
#pragma once

#include "model/config.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Fills cfg from a built-in name (llama-3-8b, llama-3-70b, qwen2.5-7b, qwen3-8b, qwen3-0.6b,
 * smollm2-135m) or a config.json path / HF folder. */
int model_dummy_config(const char *name_or_path, model_config_t *cfg);

#ifdef __cplusplus
}
#endif
