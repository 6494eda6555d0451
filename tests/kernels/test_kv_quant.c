/* test_kv_quant.c - the quantized KV cache (--kv-cache-dtype int8 / fp8) on
 * the CPU backend, on every kernel path this CPU runs with 1 and 2 threads:
 * the FP8 E4M3 codec against a brute-force nearest-value search, the pool
 * geometry (a block's bytes, the tokens a budget holds), the quantizing
 * append (bytes and scales equal the reference quantizer), block copies
 * (scales move with their block) and attention over the quantized cache
 * against a double-precision reference over the dequantized K/V, and
 * against the unquantized cache by normalized error. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_util.h"
#include "kernels/kern.h"
#include "tests/common/test_main.h"

static const struct {
  const char *isa;
  int threads;
} kCfg[] = {{"scalar", 1}, {"scalar", 2}, {"avx2", 1}, {"avx2", 2}, {"avx512", 1}, {"avx512", 2},
             {"avx512vnni", 1}, {"avx512vnni", 2}};
#define N_CFG ((int)(sizeof kCfg / sizeof kCfg[0]))

static kern_backend_t *backend_for(int i) {
  if (!kern_cpu_isa_supported(kCfg[i].isa)) {
    fprintf(stderr, "skip: %s not supported here\n", kCfg[i].isa);
    return NULL;
  }
  setenv("FERRUM_CPU_ISA", kCfg[i].isa, 1);
  kern_backend_t *b = NULL;
  ck_assert_int_eq(kern_cpu_create(&b, kCfg[i].threads), 0);
  return b;
}

static uint64_t g_rng = 0x2545F4914F6CDD1Dull;
static uint64_t rnd_u64(void) {
  uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static float rnd_f(void) { return (float)(2.0 * ((double)(rnd_u64() >> 11) / 9007199254740992.0) - 1.0); }

/* ---- FP8 E4M3 ---- */

/* The nearest finite E4M3 value to x by search (ties: the even code), saturating. */
static uint8_t fp8_nearest(float x) {
  int best = 0;
  double bd = INFINITY;
  for (int c = 0; c < 0x7F; c++) { /* 0x7F is NaN */
    double d = fabs(fabs((double)x) - kern_fp8_e4m3_to_f32((uint8_t)c));
    if (d < bd || (d == bd && (c & 1) == 0)) bd = d, best = c;
  }
  return (uint8_t)(best | (signbit(x) ? 0x80 : 0));
}

START_TEST(test_fp8_codec) {
  ck_assert_float_eq(kern_fp8_e4m3_to_f32(0x7E), 448.0f);
  ck_assert_float_eq(kern_fp8_e4m3_to_f32(0x01), 0x1p-9f);
  ck_assert_float_eq(kern_fp8_e4m3_to_f32(0x38), 1.0f);
  ck_assert_float_eq(kern_fp8_e4m3_to_f32(0xC0), -2.0f);
  ck_assert(isnan(kern_fp8_e4m3_to_f32(0x7F)));
  for (int c = 0; c < 256; c++) {
    if ((c & 0x7F) == 0x7F) continue;
    float v = kern_fp8_e4m3_to_f32((uint8_t)c);
    ck_assert_int_eq(kern_fp8_e4m3_from_f32(v), c);
    if ((c & 0x7F) < 0x7E) { /* the midpoint to the next code rounds to the even one */
      float mid = (v + kern_fp8_e4m3_to_f32((uint8_t)(c + 1))) / 2;
      ck_assert_int_eq(kern_fp8_e4m3_from_f32(mid), fp8_nearest(mid));
    }
  }
  ck_assert_int_eq(kern_fp8_e4m3_from_f32(1e6f), 0x7E);
  ck_assert_int_eq(kern_fp8_e4m3_from_f32(-500.0f), 0xFE);
  for (int i = 0; i < 20000; i++) {
    float x = rnd_f() * ldexpf(1.0f, (int)(rnd_u64() % 22) - 12);
    ck_assert_msg(kern_fp8_e4m3_from_f32(x) == fp8_nearest(x), "%a: %#x vs %#x", (double)x,
                  kern_fp8_e4m3_from_f32(x), fp8_nearest(x));
  }
}
END_TEST

/* ---- geometry ---- */

START_TEST(test_kv_quant_sizing) {
  /* SmolLM2-135M: 30 layers, 3 KV heads of 64; blocks of 16 tokens */
  kern_kv_config_t f16 = {.n_layers = 30, .n_kv_heads = 3, .head_dim = 64, .block_size = 16, .n_blocks = 1,
                          .type = KERN_F16};
  kern_kv_config_t i8 = f16, f8 = f16;
  i8.dtype = KERN_KV_INT8, f8.dtype = KERN_KV_FP8;
  ck_assert_uint_eq(kern_kv_block_bytes(&f16), 30u * 2 * 16 * 3 * 64 * 2);
  ck_assert_uint_eq(kern_kv_block_bytes(&i8), 30u * 2 * 16 * 3 * (64 + 2));
  ck_assert_uint_eq(kern_kv_block_bytes(&f8), kern_kv_block_bytes(&i8));
  const size_t budget = 64u << 20; /* --kv-cache-memory-bytes 64M */
  size_t tf = budget / kern_kv_block_bytes(&f16) * 16, ti = budget / kern_kv_block_bytes(&i8) * 16;
  fprintf(stderr, "64 MiB of KV holds %zu tokens as f16, %zu as int8 (%.3fx)\n", tf, ti, (double)ti / tf);
  ck_assert_msg((double)ti / (double)tf >= 1.9, "int8 holds %zu tokens, f16 %zu", ti, tf);
  /* a pool is exactly n blocks, and its layers and scales tile it */
  i8.n_blocks = f16.n_blocks = 37;
  ck_assert_uint_eq(kern_kv_pool_bytes(&i8), 37 * kern_kv_block_bytes(&i8));
  ck_assert_uint_eq(2 * 30 * (kern_kv_layer_bytes(&i8) + kern_kv_scale_bytes(&i8)), kern_kv_pool_bytes(&i8));
  ck_assert_uint_eq(kern_kv_scale_bytes(&f16), 0);
  ck_assert_int_eq(kern_kv_dtype_parse("INT8"), KERN_KV_INT8);
  ck_assert_int_eq(kern_kv_dtype_parse("fp8_e4m3"), KERN_KV_FP8);
  ck_assert_int_eq(kern_kv_dtype_parse("auto"), KERN_KV_AUTO);
  ck_assert_int_eq(kern_kv_dtype_parse("fp16"), -1);
  ck_assert_int_eq(kern_kv_dtype_parse(NULL), -1);
}
END_TEST

/* ---- append, copy ---- */

#define MAXT 256
typedef struct {
  int32_t tokens[MAXT], positions[MAXT], slots[MAXT], q_start[16], ctx_len[16], bt[16 * 8];
} step_buf_t;

/* A step that only writes K/V of n tokens at slots (no sequences). */
static void begin_writes(kern_backend_t *b, step_buf_t *s, const int32_t *slots, int n) {
  memset(s, 0, sizeof *s);
  memcpy(s->slots, slots, (size_t)n * sizeof(int32_t));
  kern_step_t st = {.n_tokens = n, .tokens = s->tokens, .positions = s->positions, .slots = s->slots,
                    .q_start = s->q_start, .ctx_len = s->ctx_len, .block_tables = s->bt};
  ck_assert_int_eq(b->ops->step_begin(b->ctx, &st), 0);
}

/* Element e of a slot's row as stored (dequantized), from the pool. */
static double kvq_get(const kern_kv_pool_t *p, int layer, int is_v, long slot, int e) {
  const int hd = p->cfg.head_dim, nkv = p->cfg.n_kv_heads;
  const uint8_t *q = kern_kv_pool_elems(p, layer, is_v);
  const uint16_t *sc = kern_kv_pool_scales(p, layer, is_v);
  return (double)kern_kv_dequant(p->cfg.dtype, q + (size_t)slot * nkv * hd, e) *
         fr_fp16_to_fp32(sc[(size_t)slot * nkv + e / hd]);
}

static void check_append(kern_backend_t *b, kern_kv_dtype_t dt) {
  kern_kv_config_t cfg = {.n_layers = 2, .n_kv_heads = 3, .head_dim = 40, .block_size = 8, .n_blocks = 10,
                          .dtype = dt};
  kern_kv_pool_t pool;
  ck_assert_int_eq(b->ops->kv_pool_init(b->ctx, &pool, &cfg, NULL), 0);
  ck_assert_uint_eq(2 * 2 * (pool.layer_bytes + pool.scale_bytes), kern_kv_pool_bytes(&cfg));
  const int nt = 12, kvd = 120, ks = kvd + 5, vs = kvd + 3;
  int32_t slots[12];
  float *k = malloc(sizeof(float) * nt * ks), *v = malloc(sizeof(float) * nt * vs);
  for (int i = 0; i < nt * ks; i++) k[i] = 3 * rnd_f();
  for (int i = 0; i < nt * vs; i++) v[i] = rnd_f() * (i % 7 == 0 ? 20.0f : 0.5f);
  for (int t = 0; t < nt; t++) k[t * ks + 7] = 0; /* a zero and an all-zero head */
  for (int e = 0; e < 40; e++) v[3 * vs + 40 + e] = 0;
  for (int t = 0; t < nt; t++) slots[t] = t == 4 ? -1 : 8 + t; /* block 1 and into 2; one padding token */
  step_buf_t s;
  begin_writes(b, &s, slots, nt);
  ck_assert_int_eq(b->ops->kv_append(b->ctx, &pool, 1, k, ks, v, vs), 0);
  for (int t = 0; t < nt; t++) {
    if (slots[t] < 0) continue;
    for (int isv = 0; isv < 2; isv++)
      for (int h = 0; h < 3; h++) {
        const float *x = (isv ? v + (size_t)t * vs : k + (size_t)t * ks) + h * 40;
        uint8_t q[40];
        uint16_t sc;
        kern_kv_quantize_row(dt, x, 40, q, &sc);
        const uint8_t *got = (const uint8_t *)kern_kv_pool_elems(&pool, 1, isv) + ((size_t)slots[t] * 3 + h) * 40;
        ck_assert(!memcmp(got, q, 40));
        ck_assert_uint_eq(kern_kv_pool_scales(&pool, 1, isv)[slots[t] * 3 + h], sc);
        float amax = 0;
        for (int e = 0; e < 40; e++) amax = fmaxf(amax, fabsf(x[e]));
        for (int e = 0; e < 40; e++) { /* int8: half a step; E4M3: 2^-4 relative, or a subnormal step */
          double d = fabs(kvq_get(&pool, 1, isv, slots[t], h * 40 + e) - x[e]);
          double tol = dt == KERN_KV_INT8 ? amax / 127 * 0.51 + 1e-6 : fabs(x[e]) / 16 + amax / 448 * 0x1p-9 * 1.01;
          ck_assert_msg(d <= tol, "%s t %d h %d e %d: %g vs %g", kern_kv_dtype_name(dt), t, h, e,
                        kvq_get(&pool, 1, isv, slots[t], h * 40 + e), x[e]);
        }
      }
  }
  ck_assert_uint_eq(kern_kv_pool_scales(&pool, 1, 1)[(size_t)slots[3] * 3 + 1], 0); /* the zero head */
  for (long e = 0; e < (long)kern_kv_layer_bytes(&cfg); e++) /* layer 0 untouched */
    ck_assert_int_eq(((uint8_t *)kern_kv_pool_elems(&pool, 0, 0))[e], 0);
  int32_t pairs[2] = {1, 5}, bad[2] = {0, 10};
  ck_assert_int_eq(b->ops->kv_copy_blocks(b->ctx, &pool, pairs, 1), 0);
  for (int isv = 0; isv < 2; isv++)
    for (int o = 0; o < 8; o++)
      for (int e = 0; e < kvd; e++)
        ck_assert(kvq_get(&pool, 1, isv, 8 + o, e) == kvq_get(&pool, 1, isv, 40 + o, e));
  ck_assert_int_lt(b->ops->kv_copy_blocks(b->ctx, &pool, bad, 1), 0);
  b->ops->kv_pool_deinit(b->ctx, &pool);
  free(k), free(v);
}

START_TEST(test_kv_quant_append) {
  kern_backend_t *b = backend_for(_i);
  if (!b) return;
  check_append(b, KERN_KV_INT8);
  check_append(b, KERN_KV_FP8);
  kern_backend_destroy(b);
}
END_TEST

/* ---- attention ---- */

static const struct {
  int n_q, ctx;
} kSeqs[] = {{1, 37}, {7, 27}, {9, 9}, {1, 0}, {3, 48}, {2, 2}, {1, 64}};
#define N_SEQS ((int)(sizeof kSeqs / sizeof kSeqs[0]))

static double nerr(const float *a, const double *b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    ck_assert_msg(isfinite(a[i]), "element %zu not finite (%g)", i, a[i]);
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return sqrt(num / (den > 0 ? den : 1));
}

/* Attention over a quantized pool whose K/V came through kv_append, against
 * double precision over the dequantized values, and against the same
 * attention over an f32 pool of the unquantized values. */
static void check_attention(kern_backend_t *b, kern_kv_dtype_t dt, int hd, int window) {
  const int nh = 6, nkv = 2, bs = 16, max_blocks = 4, kvd = nkv * hd, NB = 40;
  kern_kv_config_t cfg = {.n_layers = 2, .n_kv_heads = nkv, .head_dim = hd, .block_size = bs, .n_blocks = NB,
                          .dtype = dt};
  kern_kv_config_t cf32 = cfg;
  cf32.dtype = KERN_KV_AUTO, cf32.type = KERN_F32;
  kern_kv_pool_t pool, p32;
  ck_assert_int_eq(b->ops->kv_pool_init(b->ctx, &pool, &cfg, NULL), 0);
  ck_assert_int_eq(b->ops->kv_pool_init(b->ctx, &p32, &cf32, NULL), 0);
  int perm[40];
  for (int i = 0; i < NB; i++) perm[i] = i;
  for (int i = NB - 1; i > 0; i--) {
    int j = (int)(rnd_u64() % (uint64_t)(i + 1)), t = perm[i];
    perm[i] = perm[j], perm[j] = t;
  }
  int32_t bt[N_SEQS * 4], slots[MAXT];
  int used = 0, n_w = 0;
  for (int q = 0; q < N_SEQS; q++)
    for (int k = 0; k < max_blocks; k++) bt[q * max_blocks + k] = k * bs < kSeqs[q].ctx ? perm[used++] : -1;
  for (int q = 0; q < N_SEQS; q++)
    for (int p = 0; p < kSeqs[q].ctx; p++) slots[n_w++] = bt[q * max_blocks + p / bs] * bs + p % bs;
  float *K = malloc(sizeof(float) * (size_t)n_w * kvd), *V = malloc(sizeof(float) * (size_t)n_w * kvd);
  for (int i = 0; i < n_w * kvd; i++) K[i] = 2 * rnd_f(), V[i] = rnd_f();
  step_buf_t s;
  begin_writes(b, &s, slots, n_w);
  for (int l = 0; l < 2; l++) /* layer 0 gets other values */
    for (int pass = 0; pass < 2; pass++) {
      kern_kv_pool_t *p = pass ? &p32 : &pool;
      ck_assert_int_eq(b->ops->kv_append(b->ctx, p, l, l ? K : V, kvd, l ? V : K, kvd), 0);
    }
  /* the attention step */
  memset(&s, 0, sizeof s);
  for (int q = 0; q < N_SEQS; q++) {
    s.q_start[q + 1] = s.q_start[q] + kSeqs[q].n_q;
    s.ctx_len[q] = kSeqs[q].ctx;
  }
  memcpy(s.bt, bt, sizeof bt);
  const int nt = s.q_start[N_SEQS];
  for (int t = 0; t < nt; t++) s.slots[t] = -1;
  kern_step_t st = {.n_tokens = nt, .tokens = s.tokens, .n_seqs = N_SEQS, .positions = s.positions,
                    .slots = s.slots, .q_start = s.q_start, .ctx_len = s.ctx_len, .block_tables = s.bt,
                    .max_blocks = max_blocks};
  ck_assert_int_eq(b->ops->step_begin(b->ctx, &st), 0);
  const int qstride = nh * hd + 8;
  float *qv = malloc(sizeof(float) * (size_t)nt * qstride), *out = malloc(sizeof(float) * (size_t)nt * nh * hd);
  float *o32 = malloc(sizeof(float) * (size_t)nt * nh * hd);
  for (int i = 0; i < nt * qstride; i++) qv[i] = rnd_f();
  double *ref = calloc((size_t)nt * nh * hd, sizeof(double)), *r32 = calloc((size_t)nt * nh * hd, sizeof(double));
  double sc[64];
  const float scale = 1.0f / sqrtf((float)hd);
  for (int q = 0; q < N_SEQS; q++) {
    if (kSeqs[q].ctx == 0) continue;
    const int32_t *row = bt + q * max_blocks;
    for (int i = 0; i < kSeqs[q].n_q; i++) {
      int t = s.q_start[q] + i, pos = kSeqs[q].ctx - kSeqs[q].n_q + i;
      int lo = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
      for (int h = 0; h < nh; h++) {
        int kh = h / (nh / nkv);
        double mx = -INFINITY, sum = 0;
        for (int p = lo; p <= pos; p++) {
          long slot = (long)row[p / bs] * bs + p % bs;
          double d = 0;
          for (int e = 0; e < hd; e++) d += (double)qv[(size_t)t * qstride + h * hd + e] * kvq_get(&pool, 1, 0, slot, kh * hd + e);
          sc[p] = d * scale;
          mx = fmax(mx, sc[p]);
        }
        for (int p = lo; p <= pos; p++) sum += (sc[p] = exp(sc[p] - mx));
        for (int p = lo; p <= pos; p++) {
          long slot = (long)row[p / bs] * bs + p % bs;
          for (int e = 0; e < hd; e++)
            ref[((size_t)t * nh + h) * hd + e] += sc[p] / sum * kvq_get(&pool, 1, 1, slot, kh * hd + e);
        }
      }
    }
  }
  for (size_t i = 0; i < (size_t)nt * nh * hd; i++) out[i] = o32[i] = NAN;
  ck_assert_int_eq(b->ops->attention(b->ctx, out, qv, qstride, &pool, 1, nh, hd, scale, window), 0);
  ck_assert_int_eq(b->ops->attention(b->ctx, o32, qv, qstride, &p32, 1, nh, hd, scale, window), 0);
  const size_t n = (size_t)nt * nh * hd;
  double e = nerr(out, ref, n);
  ck_assert_msg(e < 1e-5, "%s hd %d window %d: error %g against the dequantized reference", kern_kv_dtype_name(dt),
                hd, window, e);
  for (size_t i = 0; i < n; i++) r32[i] = o32[i];
  double eq = nerr(out, r32, n);
  ck_assert_msg(eq < (dt == KERN_KV_INT8 ? 1.5e-2 : 6e-2), "%s hd %d window %d: error %g against the f32 cache",
                kern_kv_dtype_name(dt), hd, window, eq);
  ck_assert_msg(eq > 0, "the quantized cache gave exactly the f32 result");
  for (int h = 0; h < nh * hd; h++) ck_assert_float_eq(out[(size_t)s.q_start[3] * nh * hd + h], 0.0f);
  b->ops->kv_pool_deinit(b->ctx, &pool);
  b->ops->kv_pool_deinit(b->ctx, &p32);
  free(K), free(V), free(qv), free(out), free(o32), free(ref), free(r32);
}

START_TEST(test_kv_quant_attention) {
  kern_backend_t *b = backend_for(_i);
  if (!b) return;
  for (int dt = KERN_KV_INT8; dt <= KERN_KV_FP8; dt++) {
    check_attention(b, (kern_kv_dtype_t)dt, 64, 0);
    check_attention(b, (kern_kv_dtype_t)dt, 40, 0);
    check_attention(b, (kern_kv_dtype_t)dt, 128, 0);
    check_attention(b, (kern_kv_dtype_t)dt, 64, 5);
    check_attention(b, (kern_kv_dtype_t)dt, 40, 16);
  }
  kern_backend_destroy(b);
}
END_TEST

static Suite *kvq_suite(void) {
  Suite *s = suite_create("kernels_kv_quant");
  TCase *tc = tcase_create("kv_quant");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_fp8_codec);
  tcase_add_test(tc, test_kv_quant_sizing);
  tcase_add_loop_test(tc, test_kv_quant_append, 0, N_CFG);
  tcase_add_loop_test(tc, test_kv_quant_attention, 0, N_CFG);
  suite_add_tcase(s, tc);
  return s;
}

const test_prog_t test_prog = {.suites = {kvq_suite}};
