/* spec.h - speculative decoding's coordinator side, the parts that stand
 * alone: the configuration (vLLM's --speculative-config JSON) and the
 * n-gram proposer (vLLM's "ngram" method, prompt lookup). The glue that
 * puts proposals in steps and applies the verified tokens is in
 * spec_step.c (ferrum_engine).
 *
 * Threads: pure functions, no state.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Proposed tokens per step at most (the wire's PROTO_MAX_SPEC). */
#define COORD_SPEC_MAX_TOKENS 32
/* Longest draft model path (the wire's load option values, PROTO_MAX_STR). */
#define COORD_SPEC_PATH_MAX 4096
/* Defaults by device (docs/bench/speculative.md): disable_by_batch_size,
 * speculation off for a step while more jobs than this run or wait; and
 * min_acceptance_rate, a job stops proposing while the share of its recent
 * proposals that were accepted is below it (a verified token costs about
 * 0.8 of a decode step on the CPU, which computes rather than waits for
 * memory even at batch 1, and little on a GPU at small batches). */
#define COORD_SPEC_BATCH_CPU 4
#define COORD_SPEC_BATCH_GPU 8
#define COORD_SPEC_RATE_CPU 0.75f
#define COORD_SPEC_RATE_GPU 0.1f
/* A draft model on a GPU: each proposal costs one of its decode passes
 * (a 1B draft's is a fifth to a third of an 8B target's step), so it pays
 * only at small batches and high acceptance (H100, Llama-3-8B shapes with
 * a 1B-shaped draft, 4 proposals: 1.46x at batch 1 and 1.10x at batch 4
 * with 80% accepted, 0.83x and 0.58x with 50%; docs/bench/speculative.md). */
#define COORD_SPEC_BATCH_GPU_DRAFT 4
#define COORD_SPEC_RATE_GPU_DRAFT 0.6f

typedef struct {
  int num_speculative_tokens; /* proposals per decode, 1..COORD_SPEC_MAX_TOKENS; 0 = off */
  int prompt_lookup_max;      /* longest n-gram matched (>= prompt_lookup_min) */
  int prompt_lookup_min;      /* shortest n-gram matched (>= 1) */
  int disable_by_batch_size;  /* off while more jobs than this run or wait (>= 1; 0 = the device's default) */
  float min_acceptance_rate;  /* a job proposes while its recent acceptance is at least this, in [0, 1]
                               * (ferrum's own field; < 0 = the device's default) */
  char draft_model[COORD_SPEC_PATH_MAX]; /* "model": the draft model's path (the workers load it; proposals
                                          * are made there, worker/draft.c); "" = the n-gram proposer */
} coord_spec_config_t;

/* Parses a --speculative-config JSON object as vLLM spells it:
 * {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
 * "prompt_lookup_min": 1, "disable_by_batch_size": 4}, or a draft model,
 * {"model": PATH, "num_speculative_tokens": 4} ("method": "draft_model"
 * may be given, and needs "model"), and ferrum's own
 * "min_acceptance_rate" (0..1; 0 keeps proposing whatever the acceptance).
 * The two left out take the device's defaults (0 and -1 here). method is
 * required without a model; num_speculative_tokens is required; as in
 * vLLM, prompt_lookup_max and prompt_lookup_min default to 5 and one given
 * alone sets both (n-gram only). Unknown keys, wrong types and
 * out-of-range values are errors. Returns 0 and *out, or -EINVAL with a
 * message naming the field. */
int coord_spec_parse(const char *json, coord_spec_config_t *out);

/* The n-gram proposer: for n from cfg->prompt_lookup_max down to
 * prompt_lookup_min, finds the most recent earlier occurrence of the last
 * n tokens of tok[0..n_tok) and proposes the tokens that followed it, up
 * to k_max of them (never past n_tok). Writes them to out (k_max entries)
 * and returns their count (0: no match). */
int coord_spec_propose(const coord_spec_config_t *cfg, const int32_t *tok, int n_tok, int k_max, int32_t *out);

#ifdef __cplusplus
}
#endif
