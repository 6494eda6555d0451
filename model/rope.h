/* rope.h - rope inverse frequencies for a config: base^(-2i/d), with linear
 * and llama3 scaling folded in (as transformers' llama3 rope init computes it). */
#pragma once

#include "model/config.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Fills inv[rope_dim / 2]. */
void model_rope_inv_freq(const model_config_t *c, float *inv);

#ifdef __cplusplus
}
#endif
