/* sampler.c - host sampling. */
#include "model/sampler.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_hash.h"
#include "common/fr_util.h"
#include "kernels/kern.h"

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

/* The largest of x[0..n) that is not NaN (-inf if none): what
 * `m = x[i] > m ? x[i] : m` from -inf gives, but in 8 chains so that the
 * loop is not one comparison's latency an element (a zero maximum may come
 * back with either sign). */
static float model__max(const float *x, int n) {
  float m[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; k++) m[k] = x[i + k] > m[k] ? x[i + k] : m[k];
  for (; i < n; i++) m[0] = x[i] > m[0] ? x[i] : m[0];
  for (int k = 1; k < 8; k++) m[0] = m[k] > m[0] ? m[k] : m[0];
  return m[0];
}

/* The first index of the largest x (NaN never is, unless x[0] is NaN: 0). */
static int32_t model__argmax(const float *x, int n) {
  if (isnan(x[0])) return 0;
  const float m = model__max(x, n);
  for (int32_t i = 0; i < n; i++)
    if (x[i] == m) return i;
  return 0;
}

/* log(sum(exp(x))): the terms in float (libm's expf bits, computed by the
 * CPU kernels' vector form: kern_cpu_expf_shift; exp in double cost half a
 * millisecond per token over a 49k vocabulary), summed in double in
 * order. A NaN or +Inf anywhere makes it NaN. */
static float model__logsumexp(const float *x, int n) {
  enum { CHUNK = 1024 };
  float e[CHUNK];
  const float mx = model__max(x, n);
  double sum = 0;
  for (int i0 = 0; i0 < n; i0 += CHUNK) {
    const int c = FR_MIN(CHUNK, n - i0);
    kern_cpu_expf_shift(c, x + i0, mx, 1.0f, e);
    for (int i = 0; i < c; i++) sum += e[i];
  }
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

static bool model__allowed(const model_sampling_t *p, int t) {
  return t / 32 < p->n_allow && (p->allow[t / 32] >> (t % 32) & 1);
}

/* The min_tokens bans leave something a mask allows (a grammar that must
 * end now allows only EOS: the mask wins over min_tokens). */
static bool model__bans_leave_some(const model_sampler_t *s, const model_sampling_t *p, const float *logits) {
  if (!p->allow) return true;
  for (int t = 0; t < s->vocab; t++) {
    if (!(logits[t] > -INFINITY)) continue;
    bool banned = false;
    for (int i = 0; i < p->n_ban && !banned; i++) banned = p->ban[i] == t;
    if (!banned) return true;
  }
  return false;
}

/* The allowed-token mask, logit bias, then the min_tokens bans (-inf)
 * while too few tokens exist. */
static void model__apply_bias(const model_sampler_t *s, const model_sampling_t *p, float *logits, size_t n_out) {
  if (p->allow)
    for (int t = 0; t < s->vocab; t++)
      if (!model__allowed(p, t)) logits[t] = -INFINITY;
  for (int i = 0; i < p->n_bias; i++)
    if (p->bias[i].token >= 0 && p->bias[i].token < s->vocab) logits[p->bias[i].token] += p->bias[i].bias;
  if (n_out >= (size_t)FR_MAX(p->min_tokens, 0) || !model__bans_leave_some(s, p, logits)) return;
  for (int i = 0; i < p->n_ban; i++)
    if (p->ban[i] >= 0 && p->ban[i] < s->vocab) logits[p->ban[i]] = -INFINITY;
}

/* True when model__apply_bias changes something. */
static bool model__biased(const model_sampling_t *p, size_t n_out) {
  return p->allow || p->n_bias > 0 || (p->n_ban > 0 && n_out < (size_t)FR_MAX(p->min_tokens, 0));
}

/* Uniform in [0, 1) from (seed, draw): counter-based, batch-independent. */
static double model__uniform(uint64_t seed, uint64_t draw) {
  uint64_t x = fr_mix64(seed ^ fr_mix64(draw + 0x632be59bd9b4e019ull));
  return (double)(x >> 11) * (1.0 / 9007199254740992.0);
}

/* Probability order with a deterministic tie-break (lower id first). */
static inline bool model__above(const float *pr, int32_t a, int32_t b) {
  return pr[a] > pr[b] || (pr[a] == pr[b] && a < b);
}

static int model__cmp_desc(const void *a, const void *b, void *probs) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return model__above(probs, x, y) ? -1 : model__above(probs, y, x) ? 1 : 0;
}

/* Min-heap sift-down over idx[0..k) (idx[0] = least probable kept). */
static void model__sift_down(const float *pr, int32_t *idx, int k, int i) {
  for (;;) {
    int c = 2 * i + 1, low = i;
    if (c < k && model__above(pr, idx[low], idx[c])) low = c;
    if (c + 1 < k && model__above(pr, idx[low], idx[c + 1])) low = c + 1;
    if (low == i) return;
    int32_t t = idx[i];
    idx[i] = idx[low];
    idx[low] = t;
    i = low;
  }
}

/* Moves the k most probable of idx[0..n) to idx[0..k), most probable
 * first: one pass with a size-k heap, O(n log k). */
static void model__top_k(const float *pr, int32_t *idx, int n, int k) {
  for (int i = k / 2 - 1; i >= 0; i--) model__sift_down(pr, idx, k, i);
  for (int i = k; i < n; i++)
    if (model__above(pr, idx[i], idx[0])) {
      idx[0] = idx[i];
      model__sift_down(pr, idx, k, 0);
    }
  qsort_r(idx, (size_t)k, sizeof(int32_t), model__cmp_desc, (void *)pr);
}

/* The least probability top-p keeps among idx[0..n): the largest t whose
 * candidates (probability >= t) hold at least top_p of their mass. */
static float model__top_p_threshold(const float *pr, const int32_t *idx, int n, bool sorted, float top_p) {
  double total = 0;
  for (int i = 0; i < n; i++) total += pr[idx[i]];
  const double target = top_p * total;
  if (sorted) { /* cumulative over descending candidates */
    double acc = 0;
    for (int i = 0; i < n; i++)
      if ((acc += pr[idx[i]]) >= target) return pr[idx[i]];
    return 0;
  }
  float lo = 0, hi = 0;
  for (int i = 0; i < n; i++) hi = pr[idx[i]] > hi ? pr[idx[i]] : hi;
  for (int it = 0; it < 40; it++) { /* bisect: no sort of the whole vocabulary */
    float mid = 0.5f * (lo + hi);
    double mass = 0;
    for (int i = 0; i < n; i++)
      if (pr[idx[i]] >= mid) mass += pr[idx[i]];
    if (mass >= target) lo = mid; else hi = mid;
  }
  return lo;
}

/* Filters the candidates idx[0..n) in vLLM's order: top-k, then top-p over
 * what top-k kept (renormalized), then min-p (relative to the most
 * probable). Returns the new count (at least 1). */
static int model__filter(model_sampler_t *s, const model_sampling_t *p, int n) {
  float *pr = s->probs;
  bool sorted = false;
  if (p->top_k > 0 && n > p->top_k) {
    model__top_k(pr, s->idx, n, p->top_k);
    n = p->top_k;
    sorted = true;
  }
  float pmax = 0, t = 0;
  if (sorted) /* top-k's candidates */
    for (int i = 0; i < n; i++) pmax = pr[s->idx[i]] > pmax ? pr[s->idx[i]] : pmax;
  else { /* idx is 0..n-1 */
    const float m = model__max(pr, n);
    pmax = m > 0 ? m : 0;
  }
  if (p->top_p < 1.0f) t = model__top_p_threshold(pr, s->idx, n, sorted, p->top_p);
  if (p->min_p > 0 && p->min_p * pmax > t) t = p->min_p * pmax;
  int m = 0;
  for (int i = 0; i < n; i++)
    if (pr[s->idx[i]] >= t) s->idx[m++] = s->idx[i];
  return m > 0 ? m : 1;
}

/* Bias, bans and penalties on logits in place; *raw_lse (when logprob is
 * wanted) gets the raw logits' log-sum-exp and s->raw a copy of them if
 * they change. Returns whether they changed. */
static bool model__prepare(model_sampler_t *s, const model_sampling_t *p, float *logits, const int32_t *prompt,
                           size_t n_prompt, const int32_t *output, size_t n_output, bool want_lp, float *raw_lse) {
  bool penalized = (p->repetition_penalty > 0 && p->repetition_penalty != 1.0f) || p->presence_penalty != 0.0f ||
                   p->frequency_penalty != 0.0f || model__biased(p, n_output);
  if (want_lp) {
    *raw_lse = model__logsumexp(logits, s->vocab);
    if (penalized) memcpy(s->raw, logits, (size_t)s->vocab * sizeof(float));
  }
  model__apply_bias(s, p, logits, n_output);
  model__apply_penalties(s, p, logits, prompt, n_prompt, output, n_output);
  return penalized;
}

/* The distribution temperature > 0 samples from: s->probs (softmax at the
 * temperature, over the vocabulary), the candidates the filters keep in
 * s->idx[0..n) (returned), their total probability in *mass. */
static int model__dist(model_sampler_t *s, const model_sampling_t *p, const float *logits, double *mass) {
  const int V = s->vocab;
  float mx = logits[model__argmax(logits, V)];
  kern_cpu_expf_shift(V, logits, mx, p->temperature, s->probs); /* expf((logits[i] - mx) / temperature) */
  double sum = 0;
  for (int i = 0; i < V; i++) {
    sum += s->probs[i];
    s->idx[i] = i;
  }
  for (int i = 0; i < V; i++) s->probs[i] = (float)(s->probs[i] / sum);
  int n = model__filter(s, p, V);
  *mass = 0;
  for (int i = 0; i < n; i++) *mass += s->probs[s->idx[i]];
  return n;
}

/* Inverse CDF over the candidates s->idx[0..n), leaving out `skip` (-1:
 * none): u in [0, mass of the others). */
static int32_t model__pick(const model_sampler_t *s, int n, double u, int32_t skip) {
  double acc = 0;
  int32_t chosen = s->idx[0] != skip || n == 1 ? s->idx[0] : s->idx[1];
  for (int i = 0; i < n; i++) {
    int32_t t = s->idx[i];
    if (t == skip) continue;
    if (s->probs[t] > 0) chosen = t; /* rounding: the last possible one, never a banned one */
    acc += s->probs[t];
    if (u < acc) return t;
  }
  return chosen;
}

static float model__lp(const model_sampler_t *s, bool penalized, const float *logits, float raw_lse, int32_t t) {
  return (penalized ? s->raw[t] : logits[t]) - raw_lse;
}

int32_t model_sample(model_sampler_t *s, const model_sampling_t *p, float *logits, const int32_t *prompt,
                     size_t n_prompt, const int32_t *output, size_t n_output, uint64_t draw, float *logprob) {
  float raw_lse = 0;
  bool penalized = model__prepare(s, p, logits, prompt, n_prompt, output, n_output, logprob != NULL, &raw_lse);
  int32_t chosen;
  if (p->temperature <= 0.0f) {
    chosen = model__argmax(logits, s->vocab);
  } else {
    double mass;
    int n = model__dist(s, p, logits, &mass);
    chosen = model__pick(s, n, model__uniform(p->seed, draw) * mass, -1);
  }
  if (logprob) *logprob = model__lp(s, penalized, logits, raw_lse, chosen);
  return chosen;
}

/* Salt of the acceptance draws, apart from the sampling draws. */
#define MODEL__SPEC_SALT 0x9e3779b97f4a7c15ull

/* The draft's draw stream (model_sample_draft), apart from the others. */
#define MODEL__DRAFT_SALT 0x5851f42d4c957f2dull

int32_t model_sample_draft(model_sampler_t *s, const model_sampling_t *p, float *logits, const int32_t *prompt,
                           size_t n_prompt, const int32_t *output, size_t n_output, uint64_t draw, float *q) {
  float raw_lse = 0;
  model__prepare(s, p, logits, prompt, n_prompt, output, n_output, false, &raw_lse);
  if (p->temperature <= 0.0f) return model__argmax(logits, s->vocab);
  double mass;
  int n = model__dist(s, p, logits, &mass);
  memset(q, 0, (size_t)s->vocab * sizeof(float));
  for (int i = 0; i < n; i++) q[s->idx[i]] = (float)(s->probs[s->idx[i]] / mass);
  return model__pick(s, n, model__uniform(p->seed ^ MODEL__DRAFT_SALT, draw) * mass, -1);
}

/* The residual max(0, p - q) over the candidates s->idx[0..n) into
 * s->probs (p = probs / mass); returns its total. */
static double model__residual(model_sampler_t *s, int n, double mass, const float *q) {
  double total = 0;
  for (int i = 0; i < n; i++) {
    int32_t t = s->idx[i];
    double r = s->probs[t] - mass * (double)q[t];
    s->probs[t] = r > 0 ? (float)r : 0.0f;
    total += s->probs[t];
  }
  return total;
}

/* Rejection sampling of a proposal x drawn from q (NULL: one-hot at x):
 * accept with probability min(1, p(x) / q(x)); else a sample from the
 * residual max(0, p - q) renormalised (broken, tests only: from p). */
static int32_t model__reject(model_sampler_t *s, const model_sampling_t *p, const float *logits, uint64_t draw,
                             int32_t proposal, const float *q, bool broken) {
  double mass;
  int n = model__dist(s, p, logits, &mass);
  double px = 0; /* the proposal's probability after the filters (0 if they drop it), times mass */
  for (int i = 0; i < n && proposal >= 0 && proposal < s->vocab; i++)
    if (s->idx[i] == proposal) px = s->probs[proposal];
  double qx = q && proposal >= 0 && proposal < s->vocab ? (double)q[proposal] : 1.0;
  if (model__uniform(p->seed ^ MODEL__SPEC_SALT, draw) * mass * qx < px) return proposal;
  if (broken) return model__pick(s, n, model__uniform(p->seed, draw) * mass, -1);
  if (!q) /* q one-hot: the residual is p without the proposal */
    return model__pick(s, n, model__uniform(p->seed, draw) * (mass - px), proposal);
  double r = model__residual(s, n, mass, q);
  if (r <= 0) { /* p <= q everywhere: a rejection has probability 0; rounding got here */
    model__dist(s, p, logits, &mass);
    r = mass;
  }
  return model__pick(s, n, model__uniform(p->seed, draw) * r, -1);
}

/* model_sample_verify; broken: the residual is p itself (tests only). */
static int32_t model__verify(model_sampler_t *s, const model_sampling_t *p, float *logits, const int32_t *prompt,
                             size_t n_prompt, const int32_t *output, size_t n_output, uint64_t draw,
                             int32_t proposal, const float *q, float *logprob, bool broken) {
  float raw_lse = 0;
  bool penalized = model__prepare(s, p, logits, prompt, n_prompt, output, n_output, logprob != NULL, &raw_lse);
  int32_t chosen = p->temperature <= 0.0f ? model__argmax(logits, s->vocab) /* accepted iff it is the proposal */
                                          : model__reject(s, p, logits, draw, proposal, q, broken);
  if (logprob) *logprob = model__lp(s, penalized, logits, raw_lse, chosen);
  return chosen;
}

int32_t model_sample_verify(model_sampler_t *s, const model_sampling_t *p, float *logits, const int32_t *prompt,
                            size_t n_prompt, const int32_t *output, size_t n_output, uint64_t draw, int32_t proposal,
                            const float *q, float *logprob) {
  return model__verify(s, p, logits, prompt, n_prompt, output, n_output, draw, proposal, q, logprob, false);
}

int32_t model__sample_verify_broken(model_sampler_t *s, const model_sampling_t *p, float *logits,
                                    const int32_t *prompt, size_t n_prompt, const int32_t *output, size_t n_output,
                                    uint64_t draw, int32_t proposal, const float *q) {
  return model__verify(s, p, logits, prompt, n_prompt, output, n_output, draw, proposal, q, NULL, true);
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
