/* sampler.c - host sampling. */
#include "model/sampler.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_hash.h"
#include "common/fr_util.h"

model_sampling_t model_sampling_default(void) {
  model_sampling_t p = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f,
                        .repetition_penalty = 1.0f, .presence_penalty = 0.0f, .frequency_penalty = 0.0f,
                        .seed = 0};
  return p;
}

void model_sampler_init(model_sampler_t *s, int vocab) {
  s->vocab = vocab;
  s->probs = fr_malloc((size_t)vocab * sizeof(float));
  s->idx = fr_malloc((size_t)vocab * sizeof(int32_t));
  s->count = fr_calloc((size_t)vocab, sizeof(uint16_t));
  s->seen = fr_calloc((size_t)vocab, 1);
  s->raw = fr_malloc((size_t)vocab * sizeof(float));
}

void model_sampler_deinit(model_sampler_t *s) {
  free(s->probs);
  free(s->idx);
  free(s->count);
  free(s->seen);
  free(s->raw);
  memset(s, 0, sizeof *s);
}

static int32_t model__argmax(const float *x, int n) {
  int32_t best = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[best]) best = i;
  return best;
}

static float model__logsumexp(const float *x, int n) {
  float mx = -INFINITY;
  for (int i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
  double sum = 0;
  for (int i = 0; i < n; i++) sum += exp((double)(x[i] - mx));
  return mx + (float)log(sum);
}

static void model__apply_penalties(model_sampler_t *s, const model_sampling_t *p, float *logits,
                                   const int32_t *prompt, size_t n_prompt, const int32_t *out, size_t n_out) {
  const int V = s->vocab;
  bool rep = p->repetition_penalty > 0 && p->repetition_penalty != 1.0f;
  bool pf = p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
  if (!rep && !pf) return;
  for (size_t i = 0; i < n_out; i++)
    if (out[i] >= 0 && out[i] < V) {
      if (s->count[out[i]] < UINT16_MAX) s->count[out[i]]++;
      s->seen[out[i]] = 1;
    }
  if (rep)
    for (size_t i = 0; i < n_prompt; i++)
      if (prompt[i] >= 0 && prompt[i] < V) s->seen[prompt[i]] = 1;
  /* Visit each touched token once, then clear what we set. */
  const int32_t *lists[2] = {out, prompt};
  size_t lens[2] = {n_out, rep ? n_prompt : 0};
  for (int l = 0; l < 2; l++)
    for (size_t i = 0; i < lens[l]; i++) {
      int32_t t = lists[l][i];
      if (t < 0 || t >= V || !s->seen[t]) continue;
      if (rep) logits[t] = logits[t] > 0 ? logits[t] / p->repetition_penalty : logits[t] * p->repetition_penalty;
      if (s->count[t]) logits[t] -= p->presence_penalty + p->frequency_penalty * (float)s->count[t];
      s->seen[t] = 0;
      s->count[t] = 0;
    }
}

/* Uniform in [0, 1) from (seed, draw): counter-based, batch-independent. */
static double model__uniform(uint64_t seed, uint64_t draw) {
  uint64_t x = fr_mix64(seed ^ fr_mix64(draw + 0x632be59bd9b4e019ull));
  return (double)(x >> 11) * (1.0 / 9007199254740992.0);
}

static int model__cmp_desc(const void *a, const void *b, void *probs) {
  const float *p = probs;
  float x = p[*(const int32_t *)a], y = p[*(const int32_t *)b];
  return x < y ? 1 : x > y ? -1 : (*(const int32_t *)a - *(const int32_t *)b);
}

/* Keeps candidates (idx[0..n)) whose probability >= the threshold t that
 * top-k / top-p / min-p imply; returns the new count. */
static int model__filter(model_sampler_t *s, const model_sampling_t *p, int n) {
  float *pr = s->probs;
  float pmax = 0;
  for (int i = 0; i < n; i++) pmax = pr[s->idx[i]] > pmax ? pr[s->idx[i]] : pmax;
  float t = 0;
  if (p->min_p > 0) t = p->min_p * pmax;
  if (p->top_p < 1.0f) { /* bisect the largest threshold whose mass >= top_p */
    float lo = 0, hi = pmax;
    for (int it = 0; it < 40; it++) {
      float mid = 0.5f * (lo + hi);
      double mass = 0;
      for (int i = 0; i < n; i++)
        if (pr[s->idx[i]] >= mid) mass += pr[s->idx[i]];
      if (mass >= p->top_p) lo = mid; else hi = mid;
    }
    t = lo > t ? lo : t;
  }
  int m = 0;
  for (int i = 0; i < n; i++)
    if (pr[s->idx[i]] >= t) s->idx[m++] = s->idx[i];
  if (p->top_k > 0 && m > p->top_k) {
    qsort_r(s->idx, (size_t)m, sizeof(int32_t), model__cmp_desc, pr);
    m = p->top_k;
  }
  return m > 0 ? m : 1;
}

int32_t model_sample(model_sampler_t *s, const model_sampling_t *p, float *logits, const int32_t *prompt,
                     size_t n_prompt, const int32_t *output, size_t n_output, uint64_t draw, float *logprob) {
  const int V = s->vocab;
  bool penalized = (p->repetition_penalty > 0 && p->repetition_penalty != 1.0f) || p->presence_penalty != 0.0f ||
                   p->frequency_penalty != 0.0f;
  float raw_lse = 0;
  if (logprob) {
    raw_lse = model__logsumexp(logits, V);
    if (penalized) memcpy(s->raw, logits, (size_t)V * sizeof(float));
  }
  model__apply_penalties(s, p, logits, prompt, n_prompt, output, n_output);
  int32_t chosen;
  if (p->temperature <= 0.0f) {
    chosen = model__argmax(logits, V);
  } else {
    float mx = logits[model__argmax(logits, V)];
    double sum = 0;
    for (int i = 0; i < V; i++) {
      s->probs[i] = expf((logits[i] - mx) / p->temperature);
      sum += s->probs[i];
      s->idx[i] = i;
    }
    for (int i = 0; i < V; i++) s->probs[i] = (float)(s->probs[i] / sum);
    int n = model__filter(s, p, V);
    double mass = 0;
    for (int i = 0; i < n; i++) mass += s->probs[s->idx[i]];
    double u = model__uniform(p->seed, draw) * mass, acc = 0;
    chosen = s->idx[n - 1];
    for (int i = 0; i < n; i++) {
      acc += s->probs[s->idx[i]];
      if (u < acc) {
        chosen = s->idx[i];
        break;
      }
    }
  }
  if (logprob) *logprob = (penalized ? s->raw[chosen] : logits[chosen]) - raw_lse;
  return chosen;
}

void model_logprobs(const float *logits, int vocab, int top_n, int32_t *top_ids, float *top_lp, float *lse_out) {
  float lse = model__logsumexp(logits, vocab);
  if (lse_out) *lse_out = lse;
  int k = 0; /* top_ids[0..k) sorted by descending logit */
  for (int i = 0; i < vocab && top_n > 0; i++) {
    if (k == top_n && logits[i] <= logits[top_ids[k - 1]]) continue;
    int j = k < top_n ? k++ : k - 1;
    while (j > 0 && logits[top_ids[j - 1]] < logits[i]) {
      top_ids[j] = top_ids[j - 1];
      j--;
    }
    top_ids[j] = i;
  }
  for (int j = 0; j < k; j++) top_lp[j] = logits[top_ids[j]] - lse;
}
