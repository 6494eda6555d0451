/* sampler.h - token sampling on the host: greedy, temperature, top-k,
 * top-p, min-p, repetition / presence / frequency penalties, with a
 * counter-based RNG so the same seed gives the same tokens whatever the
 * batch. Order (as vLLM): the allowed-token mask of constrained
 * decoding, logit bias and min_tokens bans, penalties, temperature,
 * top-k, top-p, min-p. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One logit bias (the wire's proto_bias_t has the same layout). */
typedef struct {
  int32_t token;
  float bias; /* added to the logit */
} model_bias_t;

typedef struct {
  float temperature;        /* 0 = greedy */
  int top_k;                /* <= 0: off */
  float top_p;              /* >= 1: off */
  float min_p;              /* <= 0: off */
  float repetition_penalty; /* 1: off; applies to prompt and output tokens */
  float presence_penalty;   /* 0: off; output tokens */
  float frequency_penalty;  /* 0: off; output tokens */
  uint64_t seed;
  const model_bias_t *bias; /* (n_bias) borrowed for the call; ids out of the vocabulary are skipped */
  int n_bias;
  const int32_t *ban;       /* (n_ban) borrowed: ids that get no probability while n_output < min_tokens */
  int n_ban;
  int min_tokens;
  const uint32_t *allow;    /* (n_allow words) borrowed, or NULL: constrained decoding, only tokens whose bit
                             * (word t / 32, bit t % 32) is set may be sampled; ids past the words are not */
  int n_allow;
} model_sampling_t;

/* Defaults: greedy, every filter off. */
model_sampling_t model_sampling_default(void);

/* Scratch for one sampler thread: sized for a vocabulary once. */
typedef struct {
  int vocab;
  float *probs;    /* (vocab) */
  int32_t *idx;    /* (vocab) */
  uint16_t *count; /* (vocab) output-token counts for penalties */
  uint8_t *seen;   /* (vocab) prompt/output presence for repetition penalty */
  float *raw;      /* (vocab) raw logits kept for logprobs when penalties apply */
} model_sampler_t;

void model_sampler_init(model_sampler_t *s, int vocab);
void model_sampler_deinit(model_sampler_t *s);

/* Samples one token from logits (vocab floats, modified in place).
 * prompt/output: the sequence's tokens so far, for penalties. draw: the
 * index of this draw (tokens generated so far) for the RNG. *logprob gets
 * the log-softmax of the raw logits at the chosen token (NULL to skip). */
int32_t model_sample(model_sampler_t *s, const model_sampling_t *p, float *logits, const int32_t *prompt,
                     size_t n_prompt, const int32_t *output, size_t n_output, uint64_t draw, float *logprob);

/* Speculative decoding: verifies one proposed token at a position whose
 * logits are given, with the same bias, bans, penalties and filters as
 * model_sample. q: the distribution the proposal was drawn from (vocab
 * floats, a draft model's, see model_sample_draft), or NULL for a
 * deterministic proposer (q one-hot at the proposal: n-gram). Greedy: the
 * argmax, which accepts the proposal iff it is the proposal. Temperature
 * > 0: rejection sampling (accept with probability min(1, p(x) / q(x));
 * on rejection, a sample from the residual max(0, p - q) renormalised),
 * which keeps the output distribution p. Returns the token to emit: the
 * proposal when accepted. draw as model_sample (the acceptance draw uses
 * its own stream). */
int32_t model_sample_verify(model_sampler_t *s, const model_sampling_t *p, float *logits, const int32_t *prompt,
                            size_t n_prompt, const int32_t *output, size_t n_output, uint64_t draw, int32_t proposal,
                            const float *q, float *logprob);

/* A draft model's proposal from its logits (modified), with the same
 * bias, bans, penalties, temperature and filters as model_sample but its
 * own draw stream: greedy, the argmax (q untouched); temperature > 0, a
 * sample whose distribution goes to q (vocab floats, summing to 1) for
 * model_sample_verify. */
int32_t model_sample_draft(model_sampler_t *s, const model_sampling_t *p, float *logits, const int32_t *prompt,
                           size_t n_prompt, const int32_t *output, size_t n_output, uint64_t draw, float *q);

/* Tests only: model_sample_verify with a wrong residual (p itself, so a
 * rejected proposal can come back), to show that a statistical test of
 * model_sample_verify can fail. */
int32_t model__sample_verify_broken(model_sampler_t *s, const model_sampling_t *p, float *logits,
                                    const int32_t *prompt, size_t n_prompt, const int32_t *output, size_t n_output,
                                    uint64_t draw, int32_t proposal, const float *q);

/* The top_n alternatives of logits (ids and log-softmax values, by
 * descending logit) and the log-sum-exp (NULL to skip). */
void model_logprobs(const float *logits, int vocab, int top_n, int32_t *top_ids, float *top_lp, float *lse_out);

#ifdef __cplusplus
}
#endif
