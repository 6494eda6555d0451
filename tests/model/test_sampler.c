/* test_sampler.c - host sampler: greedy, filters, penalties, seeding, and
 * that sampling at temperature 1 follows softmax(logits). */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/sampler.h"

#define V 64

static void fill(float *l) {
  for (int i = 0; i < V; i++) l[i] = sinf((float)i * 1.7f) * 3.0f;
}

static int32_t draw(model_sampler_t *s, model_sampling_t *p, uint64_t d) {
  float l[V];
  fill(l);
  return model_sample(s, p, l, NULL, 0, NULL, 0, d, NULL);
}

static int32_t argmax_ref(void) {
  float l[V];
  fill(l);
  int32_t b = 0;
  for (int i = 1; i < V; i++)
    if (l[i] > l[b]) b = i;
  return b;
}

START_TEST(greedy_and_degenerate_filters_pick_argmax) {
  model_sampler_t s;
  model_sampler_init(&s, V);
  model_sampling_t p = model_sampling_default();
  ck_assert_int_eq(draw(&s, &p, 0), argmax_ref());
  p.temperature = 1.0f;
  p.top_k = 1;
  for (int d = 0; d < 50; d++) ck_assert_int_eq(draw(&s, &p, (uint64_t)d), argmax_ref());
  p.top_k = 0;
  p.top_p = 1e-6f;
  for (int d = 0; d < 50; d++) ck_assert_int_eq(draw(&s, &p, (uint64_t)d), argmax_ref());
  p.top_p = 1.0f;
  p.min_p = 0.999f;
  for (int d = 0; d < 50; d++) ck_assert_int_eq(draw(&s, &p, (uint64_t)d), argmax_ref());
  model_sampler_deinit(&s);
}
END_TEST

/* Greedy is the first index of the largest logit, as a loop of `>` from
 * index 0 finds it: ties, NaNs (skipped, unless the first logit is NaN),
 * zeros of both signs, lengths around the sampler's 8-wide chains. */
START_TEST(greedy_is_the_first_largest) {
  enum { N = 1003 };
  float l[N], ref[N];
  srand(7);
  for (int trial = 0; trial < 400; trial++) {
    const int n = 1 + trial % 37 + (trial % 3 == 0 ? N - 40 : 0);
    for (int i = 0; i < n; i++) l[i] = (float)(rand() % 9) - 4.0f; /* many ties */
    if (trial % 5 == 1) l[rand() % n] = NAN;
    if (trial % 7 == 2) l[0] = NAN;
    if (trial % 11 == 3)
      for (int i = 0; i < n; i++) l[i] = (rand() & 1) ? -0.0f : 0.0f;
    int32_t want = 0;
    for (int i = 1; i < n; i++)
      if (l[i] > l[want]) want = i;
    memcpy(ref, l, sizeof(float) * (size_t)n);
    model_sampler_t s;
    model_sampler_init(&s, n);
    model_sampling_t p = model_sampling_default();
    ck_assert_int_eq(model_sample(&s, &p, l, NULL, 0, NULL, 0, 0, NULL), want);
    ck_assert(!memcmp(l, ref, sizeof(float) * (size_t)n));
    model_sampler_deinit(&s);
  }
}
END_TEST

START_TEST(same_seed_same_tokens) {
  model_sampler_t s;
  model_sampler_init(&s, V);
  model_sampling_t p = model_sampling_default();
  p.temperature = 1.5f;
  p.seed = 42;
  int32_t a[100], b[100];
  for (int d = 0; d < 100; d++) a[d] = draw(&s, &p, (uint64_t)d);
  for (int d = 0; d < 100; d++) b[d] = draw(&s, &p, (uint64_t)d);
  ck_assert_mem_eq(a, b, sizeof a);
  p.seed = 43;
  int diff = 0;
  for (int d = 0; d < 100; d++) diff += draw(&s, &p, (uint64_t)d) != a[d];
  ck_assert_int_gt(diff, 10);
  model_sampler_deinit(&s);
}
END_TEST

START_TEST(temperature_one_follows_softmax) {
  model_sampler_t s;
  model_sampler_init(&s, V);
  model_sampling_t p = model_sampling_default();
  p.temperature = 1.0f;
  p.seed = 7;
  enum { N = 40000 };
  static int count[V];
  memset(count, 0, sizeof count);
  for (int d = 0; d < N; d++) count[draw(&s, &p, (uint64_t)d)]++;
  float l[V];
  fill(l);
  double z = 0;
  for (int i = 0; i < V; i++) z += exp(l[i]);
  for (int i = 0; i < V; i++) {
    double pi = exp(l[i]) / z, sd = sqrt(N * pi * (1 - pi));
    ck_assert_msg(fabs(count[i] - N * pi) <= 5 * sd + 2, "token %d: %d draws, expected %.1f", i, count[i], N * pi);
  }
  model_sampler_deinit(&s);
}
END_TEST

START_TEST(top_k_restricts_support) {
  model_sampler_t s;
  model_sampler_init(&s, V);
  model_sampling_t p = model_sampling_default();
  p.temperature = 2.0f;
  p.top_k = 3;
  float l[V];
  fill(l);
  int32_t top[3];
  float lp[3];
  model_logprobs(l, V, 3, top, lp, NULL);
  for (int d = 0; d < 500; d++) {
    int32_t t = draw(&s, &p, (uint64_t)d);
    ck_assert(t == top[0] || t == top[1] || t == top[2]);
  }
  model_sampler_deinit(&s);
}
END_TEST

/* vLLM's order: top-p applies to what top-k kept, renormalized. With
 * probabilities 0.5 / 0.3 / 0.2, top-k 2 leaves 0.625 / 0.375, so top-p 0.6
 * keeps only the first (over the full distribution it would keep two). */
START_TEST(top_p_after_top_k) {
  model_sampler_t s;
  model_sampler_init(&s, 3);
  model_sampling_t p = model_sampling_default();
  p.temperature = 1.0f;
  p.top_k = 2;
  p.top_p = 0.6f;
  for (int d = 0; d < 200; d++) {
    float l[3] = {logf(0.5f), logf(0.3f), logf(0.2f)};
    ck_assert_int_eq(model_sample(&s, &p, l, NULL, 0, NULL, 0, (uint64_t)d, NULL), 0);
  }
  p.top_k = 0; /* top-p alone over 0.5 / 0.3 / 0.2 keeps two */
  int second = 0;
  for (int d = 0; d < 400; d++) {
    float l[3] = {logf(0.5f), logf(0.3f), logf(0.2f)};
    int32_t t = model_sample(&s, &p, l, NULL, 0, NULL, 0, (uint64_t)d, NULL);
    ck_assert_int_ne(t, 2);
    second += t == 1;
  }
  ck_assert_int_gt(second, 80); /* about 3/8 of the draws */
  model_sampler_deinit(&s);
}
END_TEST

START_TEST(penalties_change_greedy_choice) {
  model_sampler_t s;
  model_sampler_init(&s, V);
  model_sampling_t p = model_sampling_default();
  int32_t best = argmax_ref();
  float l[V];
  fill(l);
  p.presence_penalty = 100.0f;
  ck_assert_int_ne(model_sample(&s, &p, l, NULL, 0, &best, 1, 0, NULL), best);
  fill(l);
  p = model_sampling_default();
  p.repetition_penalty = 1000.0f; /* prompt tokens count too */
  ck_assert_int_ne(model_sample(&s, &p, l, &best, 1, NULL, 0, 0, NULL), best);
  /* penalty state is cleared between calls */
  fill(l);
  p = model_sampling_default();
  ck_assert_int_eq(model_sample(&s, &p, l, NULL, 0, NULL, 0, 0, NULL), best);
  model_sampler_deinit(&s);
}
END_TEST

START_TEST(logprob_is_raw_log_softmax) {
  model_sampler_t s;
  model_sampler_init(&s, V);
  model_sampling_t p = model_sampling_default();
  p.frequency_penalty = 0.5f;
  float l[V], lp;
  fill(l);
  double z = 0;
  for (int i = 0; i < V; i++) z += exp(l[i]);
  int32_t out = 5;
  int32_t t = model_sample(&s, &p, l, NULL, 0, &out, 1, 0, &lp);
  float r[V];
  fill(r);
  ck_assert_double_eq_tol(lp, r[t] - log(z), 1e-4);
  model_sampler_deinit(&s);
}
END_TEST

/* A bias list: +100 makes its token the greedy choice; -100 on the argmax
 * gives the second best; the logprob stays that of the raw logits. */
START_TEST(logit_bias_moves_greedy_choice) {
  model_sampler_t s;
  model_sampler_init(&s, V);
  model_sampling_t p = model_sampling_default();
  float l[V];
  fill(l);
  int32_t best = argmax_ref(), second = best == 0 ? 1 : 0;
  for (int i = 0; i < V; i++)
    if (i != best && l[i] > l[second]) second = i;
  int32_t low = 0; /* the least likely token */
  for (int i = 1; i < V; i++)
    if (l[i] < l[low]) low = i;
  model_bias_t up[] = {{.token = low, .bias = 100}, {.token = V + 5, .bias = 100}}; /* out of the vocabulary: skipped */
  p.bias = up, p.n_bias = 2;
  float lp;
  ck_assert_int_eq(model_sample(&s, &p, l, NULL, 0, NULL, 0, 0, &lp), low);
  float r[V];
  fill(r);
  double z = 0;
  for (int i = 0; i < V; i++) z += exp(r[i]);
  ck_assert_double_eq_tol(lp, r[low] - log(z), 1e-4); /* raw, as vLLM reports it */
  model_bias_t down = {.token = best, .bias = -100};
  p.bias = &down, p.n_bias = 1;
  ck_assert_int_eq(draw(&s, &p, 0), second);
  p.temperature = 1.0f; /* sampling: the banished token never comes */
  for (uint64_t d = 0; d < 200; d++) ck_assert_int_ne(draw(&s, &p, d), best);
  model_sampler_deinit(&s);
}
END_TEST

/* min_tokens: banned ids get no probability until n_output reaches it. */
START_TEST(min_tokens_bans_until_reached) {
  model_sampler_t s;
  model_sampler_init(&s, V);
  model_sampling_t p = model_sampling_default();
  int32_t best = argmax_ref(), out[4] = {1, 2, 3, 4};
  int32_t ban[] = {best, V + 1};
  p.ban = ban, p.n_ban = 2, p.min_tokens = 3;
  float l[V];
  for (size_t n = 0; n <= 4; n++) {
    fill(l);
    int32_t t = model_sample(&s, &p, l, NULL, 0, out, n, n, NULL);
    if (n < 3) ck_assert_int_ne(t, best);
    else ck_assert_int_eq(t, best);
  }
  p.temperature = 2.0f;
  for (uint64_t d = 0; d < 300; d++) {
    fill(l);
    ck_assert_int_ne(model_sample(&s, &p, l, NULL, 0, out, 2, d, NULL), best);
  }
  model_sampler_deinit(&s);
}
END_TEST

/* ---- speculative decoding: model_sample_verify ---------------------------- */

/* Greedy verification: the proposal is accepted iff it is the argmax after
 * the penalties, and the argmax comes back otherwise. */
START_TEST(verify_greedy_accepts_only_the_argmax) {
  model_sampler_t s;
  model_sampler_init(&s, V);
  model_sampling_t p = model_sampling_default();
  int32_t best = argmax_ref();
  float l[V], lp, lp_ref;
  fill(l);
  ck_assert_int_eq(model_sample_verify(&s, &p, l, NULL, 0, NULL, 0, 0, best, NULL, &lp), best);
  fill(l);
  ck_assert_int_eq(model_sample(&s, &p, l, NULL, 0, NULL, 0, 0, &lp_ref), best);
  ck_assert_float_eq(lp, lp_ref);
  fill(l);
  ck_assert_int_eq(model_sample_verify(&s, &p, l, NULL, 0, NULL, 0, 0, (best + 1) % V, NULL, NULL), best);
  /* a presence penalty on the argmax (it is in the output) moves the choice, as in model_sample */
  p.presence_penalty = 2.0f;
  int32_t out[1] = {best};
  fill(l);
  int32_t pen = model_sample(&s, &p, l, NULL, 0, out, 1, 1, NULL);
  ck_assert_int_ne(pen, best);
  fill(l);
  ck_assert_int_eq(model_sample_verify(&s, &p, l, NULL, 0, out, 1, 1, best, NULL, NULL), pen);
  fill(l);
  ck_assert_int_eq(model_sample_verify(&s, &p, l, NULL, 0, out, 1, 1, pen, NULL, NULL), pen);
  model_sampler_deinit(&s);
}
END_TEST

/* A toy model over SV tokens: the logits after token `prev`. */
#define SV 6
static void toy_logits(int32_t prev, float *l) {
  for (int t = 0; t < SV; t++) l[t] = 2.0f * sinf((float)(prev * 7 + t) * 1.3f);
}

/* Its exact next-token distribution at temperature T with a presence
 * penalty on the tokens in out[0..n). */
static void toy_probs(int32_t prev, const int32_t *out, int n, float T, float pres, double *pr) {
  float l[SV];
  toy_logits(prev, l);
  double z = 0;
  for (int t = 0; t < SV; t++) {
    double x = l[t];
    for (int i = 0; i < n; i++)
      if (out[i] == t) {
        x -= pres;
        break;
      }
    pr[t] = exp(x / T);
    z += pr[t];
  }
  for (int t = 0; t < SV; t++) pr[t] /= z;
}

/* Two tokens after token 0, as speculation makes them: a step verifies
 * the proposals d[0], d[1]; if d[0] is rejected, a second step verifies
 * d[1] after what came. Returns the pair as t1 * SV + t2. broken: the
 * wrong residual. */
static int toy_spec_pair(model_sampler_t *s, const model_sampling_t *p, const int32_t *d, bool broken) {
  int32_t out[2];
  float l[SV];
  for (int j = 0; j < 2; j++) {
    int32_t prev = j == 0 ? 0 : out[0];
    toy_logits(prev, l);
    out[j] = broken ? model__sample_verify_broken(s, p, l, NULL, 0, out, (size_t)j, (uint64_t)j, d[j], NULL)
                    : model_sample_verify(s, p, l, NULL, 0, out, (size_t)j, (uint64_t)j, d[j], NULL, NULL);
  }
  return out[0] * SV + out[1];
}

static int toy_plain_pair(model_sampler_t *s, const model_sampling_t *p) {
  int32_t out[2];
  float l[SV];
  for (int j = 0; j < 2; j++) {
    toy_logits(j == 0 ? 0 : out[0], l);
    out[j] = model_sample(s, p, l, NULL, 0, out, (size_t)j, (uint64_t)j, NULL);
  }
  return out[0] * SV + out[1];
}

/* Pearson's chi-square of counts (n draws) against the exact pair law. */
static double toy_chi2(const int *count, int n, float T, float pres) {
  double chi2 = 0, p1[SV], p2[SV];
  toy_probs(0, NULL, 0, T, pres, p1);
  for (int a = 0; a < SV; a++) {
    int32_t out[1] = {a};
    toy_probs(a, out, 1, T, pres, p2);
    for (int b = 0; b < SV; b++) {
      double e = n * p1[a] * p2[b];
      chi2 += (count[a * SV + b] - e) * (count[a * SV + b] - e) / e;
    }
  }
  return chi2;
}

/* Rejection sampling keeps the distribution: 20000 seeded pairs (fixed
 * seeds, so the test is deterministic) with speculation, without, and
 * with a broken residual, each against the exact law of the pair. 35
 * degrees of freedom: chi-square > 80 has probability < 1e-5 for a right
 * sampler; the broken residual gives thousands. */
START_TEST(verify_rejection_sampling_keeps_the_distribution) {
  model_sampler_t s;
  model_sampler_init(&s, SV);
  model_sampling_t p = model_sampling_default();
  p.temperature = 0.9f, p.presence_penalty = 0.4f;
  double p1[SV];
  toy_probs(0, NULL, 0, p.temperature, p.presence_penalty, p1);
  int32_t d[2] = {0, 3}; /* proposals: the second likeliest first token (rejected often), then token 3 */
  int first = 0;
  for (int t = 1; t < SV; t++) first = p1[t] > p1[first] ? t : first;
  d[0] = first == 0 ? 1 : 0;
  for (int t = 0; t < SV; t++)
    if (t != first && p1[t] > p1[d[0]]) d[0] = t;
  d[1] = 3;
  ck_assert(p1[d[0]] > 0.1 && p1[d[0]] < 0.6);
  enum { N = 20000 };
  static int c_spec[SV * SV], c_plain[SV * SV], c_broken[SV * SV];
  memset(c_spec, 0, sizeof c_spec), memset(c_plain, 0, sizeof c_plain), memset(c_broken, 0, sizeof c_broken);
  int accepted = 0;
  for (int i = 0; i < N; i++) {
    p.seed = 1000003ull * (uint64_t)i + 17;
    int pair = toy_spec_pair(&s, &p, d, false);
    c_spec[pair]++;
    accepted += pair / SV == d[0];
    c_plain[toy_plain_pair(&s, &p)]++;
    c_broken[toy_spec_pair(&s, &p, d, true)]++;
  }
  double chi_spec = toy_chi2(c_spec, N, p.temperature, p.presence_penalty);
  double chi_plain = toy_chi2(c_plain, N, p.temperature, p.presence_penalty);
  double chi_broken = toy_chi2(c_broken, N, p.temperature, p.presence_penalty);
  ck_assert_msg(chi_spec < 80, "speculative chi2 %.1f", chi_spec);
  ck_assert_msg(chi_plain < 80, "plain chi2 %.1f", chi_plain);
  ck_assert_msg(chi_broken > 1000, "broken residual chi2 %.1f: the check cannot see it", chi_broken);
  /* the proposal was accepted about as often as its probability */
  ck_assert_msg(fabs((double)accepted / N - p1[d[0]]) < 0.02, "accepted %.3f, p %.3f", (double)accepted / N, p1[d[0]]);
  model_sampler_deinit(&s);
}
END_TEST

/* A toy draft model: other logits over the same SV tokens. */
static void toy_draft_logits(int32_t prev, float *l) {
  for (int t = 0; t < SV; t++) l[t] = 1.5f * cosf((float)(prev * 3 + t) * 0.9f);
}

/* Two tokens after token 0 as a draft model makes them: the draft samples
 * two proposals (recording q), the target verifies them in order; a
 * rejection ends the step, and the second token comes from a fresh draft
 * proposal verified in a second step. mode 0: verified against q; 1:
 * as if the draft were deterministic (q one-hot: exact too, but accepts
 * less); 2: against q with the wrong residual (p itself). Returns t1 * SV
 * + t2; *acc counts accepted proposals. */
static int toy_draft_pair(model_sampler_t *s, const model_sampling_t *p, int mode, int *acc) {
  int32_t out[2];
  float l[SV], q[SV];
  for (int j = 0; j < 2; j++) {
    int32_t prev = j == 0 ? 0 : out[0];
    toy_draft_logits(prev, l);
    int32_t d = model_sample_draft(s, p, l, NULL, 0, out, (size_t)j, (uint64_t)j, q);
    toy_logits(prev, l);
    out[j] = mode == 2 ? model__sample_verify_broken(s, p, l, NULL, 0, out, (size_t)j, (uint64_t)j, d, q)
                       : model_sample_verify(s, p, l, NULL, 0, out, (size_t)j, (uint64_t)j, d, mode ? NULL : q, NULL);
    *acc += out[j] == d;
  }
  return out[0] * SV + out[1];
}

/* A draft model's proposals (drawn from its own q) keep the target's
 * distribution: 20000 seeded pairs against the exact law (35 degrees of
 * freedom, chi-square > 80 has probability < 1e-5); a wrong residual is
 * caught; verifying against q accepts more than taking the proposals for
 * deterministic ones (min(p, q) summed against p q). The greedy draft
 * proposes its argmax. */
START_TEST(draft_proposals_keep_the_distribution) {
  model_sampler_t s;
  model_sampler_init(&s, SV);
  model_sampling_t p = model_sampling_default();
  p.temperature = 0.9f, p.presence_penalty = 0.4f;
  enum { N = 20000 };
  static int c_ok[SV * SV], c_hot[SV * SV], c_bad[SV * SV];
  memset(c_ok, 0, sizeof c_ok), memset(c_hot, 0, sizeof c_hot), memset(c_bad, 0, sizeof c_bad);
  int acc = 0, acc_hot = 0, acc_bad = 0;
  for (int i = 0; i < N; i++) {
    p.seed = 1000003ull * (uint64_t)i + 29;
    c_ok[toy_draft_pair(&s, &p, 0, &acc)]++;
    c_hot[toy_draft_pair(&s, &p, 1, &acc_hot)]++;
    c_bad[toy_draft_pair(&s, &p, 2, &acc_bad)]++;
  }
  double chi_ok = toy_chi2(c_ok, N, p.temperature, p.presence_penalty);
  double chi_hot = toy_chi2(c_hot, N, p.temperature, p.presence_penalty);
  double chi_bad = toy_chi2(c_bad, N, p.temperature, p.presence_penalty);
  ck_assert_msg(chi_ok < 80, "draft chi2 %.1f", chi_ok);
  ck_assert_msg(chi_hot < 80, "one-hot chi2 %.1f", chi_hot);
  ck_assert_msg(chi_bad > 1000, "broken residual: chi2 %.1f, the check cannot see it", chi_bad);
  ck_assert_msg(acc > N / 4 && acc < 2 * N - N / 4, "accepted %d of %d proposals", acc, 2 * N); /* a real mix */
  ck_assert_msg(acc > acc_hot + N / 20, "accepted %d against q, %d one-hot", acc, acc_hot);
  float l[SV], q[SV];
  toy_draft_logits(0, l);
  int32_t best = 0;
  for (int t = 1; t < SV; t++) best = l[t] > l[best] ? t : best;
  p = model_sampling_default();
  ck_assert_int_eq(model_sample_draft(&s, &p, l, NULL, 0, NULL, 0, 0, q), best);
  model_sampler_deinit(&s);
}
END_TEST

/* The shared main (tests/common/test_main.c) runs this program's suites. */
#include "tests/common/test_main.h"

static Suite *sampler_suite(void) {
  Suite *s = suite_create("sampler");
  TCase *tc = tcase_create("sampler");
  tcase_add_test(tc, greedy_and_degenerate_filters_pick_argmax);
  tcase_add_test(tc, greedy_is_the_first_largest);
  tcase_add_test(tc, same_seed_same_tokens);
  tcase_add_test(tc, temperature_one_follows_softmax);
  tcase_add_test(tc, top_k_restricts_support);
  tcase_add_test(tc, top_p_after_top_k);
  tcase_add_test(tc, penalties_change_greedy_choice);
  tcase_add_test(tc, logprob_is_raw_log_softmax);
  tcase_add_test(tc, logit_bias_moves_greedy_choice);
  tcase_add_test(tc, min_tokens_bans_until_reached);
  tcase_add_test(tc, verify_greedy_accepts_only_the_argmax);
  tcase_add_test(tc, verify_rejection_sampling_keeps_the_distribution);
  tcase_add_test(tc, draft_proposals_keep_the_distribution);
  suite_add_tcase(s, tc);
  return s;
}

const test_prog_t test_prog = {.suites = {sampler_suite}};
