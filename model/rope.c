/* rope.c - rope inverse frequencies. */
#include "model/rope.h"

#include <math.h>

static double model__llama3_scale(const model_config_t *c, double inv) {
  const double pi = 3.14159265358979323846;
  double low = c->rope_low_freq_factor > 0 ? c->rope_low_freq_factor : 1.0;
  double high = c->rope_high_freq_factor > 0 ? c->rope_high_freq_factor : 4.0;
  double L = c->rope_orig_ctx > 0 ? c->rope_orig_ctx : 8192;
  double factor = c->rope_factor > 0 ? c->rope_factor : 8.0;
  double wavelen = 2 * pi / inv;
  if (wavelen < L / high) return inv;
  if (wavelen > L / low) return inv / factor;
  double s = (L / wavelen - low) / (high - low);
  return (1 - s) * inv / factor + s * inv;
}

void model_rope_inv_freq(const model_config_t *c, float *inv) {
  int half = c->rope_dim / 2;
  for (int i = 0; i < half; i++) {
    double f = pow((double)c->rope_theta, -2.0 * i / c->rope_dim);
    if (c->rope_scaling == MODEL_ROPE_SCALING_LINEAR && c->rope_factor > 0) f /= c->rope_factor;
    if (c->rope_scaling == MODEL_ROPE_SCALING_LLAMA3) f = model__llama3_scale(c, f);
    inv[i] = (float)f;
  }
}
