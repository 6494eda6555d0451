/* run.c - ferrum-run: generates text from a prompt in one process, without
 * the engine (`ferrumctl run --in-process` execs it). It is a model-running
 * program, so it lives beside ferrum-worker and links a backend; ferrumctl
 * does not.
 *
 * usage: ferrum-run --model PATH --prompt TEXT [--raw] [--max-tokens N]
 *                   [--temperature T] [--top-k K] [--top-p P] [--min-p P]
 *                   [--seed S] [--threads N] [--device DEV] [--kv-cache-dtype T]
 * stdout gets only the generated text; progress and speed go to stderr.
 * Exit: 0 done, 1 failure, 2 usage. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_log.h"
#include "common/fr_util.h"
#include "kernels/kern.h"
#include "model/generate.h"
#include "model/model.h"
#include "model/prompt.h"
#include "model/sampler.h"

typedef struct {
  const char *model, *prompt, *device;
  long max_tokens, threads, top_k;
  double temperature, top_p, min_p;
  unsigned long long seed;
  bool raw;
  int kv_dtype; /* kern_kv_dtype_t */
  bool fp8;     /* --quantization fp8 */
} run_opts_t;

/* Parses a number in [lo, hi]; false (with a message) otherwise. */
static bool run_number(const char *opt, const char *s, double lo, double hi, double *out) {
  char *end = NULL;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !(v >= lo && v <= hi)) {
    fprintf(stderr, "ferrum-run: %s expects a number in [%g, %g], got '%s'\n", opt, lo, hi, s);
    return false;
  }
  *out = v;
  return true;
}

/* Parses a seed (a whole number below 2^63); false (with a message) otherwise. */
static bool run_seed(const char *s, unsigned long long *out) {
  char *end = NULL;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s || *end || *s == '-' || v > 0x7fffffffffffffffULL) {
    fprintf(stderr, "ferrum-run: --seed expects a whole number, got '%s'\n", s);
    return false;
  }
  *out = v;
  return true;
}

static int run_parse(int argc, char **argv, run_opts_t *o) {
  enum { O_MODEL = 256, O_PROMPT, O_MAXTOK, O_TEMP, O_TOPK, O_TOPP, O_MINP, O_SEED, O_RAW, O_THREADS, O_DEVICE, O_KVDT,
         O_QUANT };
  static const struct option lo[] = {
      {"model", required_argument, 0, O_MODEL},       {"prompt", required_argument, 0, O_PROMPT},
      {"max-tokens", required_argument, 0, O_MAXTOK}, {"temperature", required_argument, 0, O_TEMP},
      {"top-k", required_argument, 0, O_TOPK},        {"top-p", required_argument, 0, O_TOPP},
      {"min-p", required_argument, 0, O_MINP},        {"seed", required_argument, 0, O_SEED},
      {"raw", no_argument, 0, O_RAW},                 {"threads", required_argument, 0, O_THREADS},
      {"device", required_argument, 0, O_DEVICE},     {"kv-cache-dtype", required_argument, 0, O_KVDT},
      {"quantization", required_argument, 0, O_QUANT}, {0, 0, 0, 0}};
  *o = (run_opts_t){.max_tokens = 256, .temperature = 0.8, .top_k = 40, .top_p = 0.95, .min_p = 0.05,
                    .device = "cpu"};
  double v;
  int c;
  bool ok = true;
  while (ok && (c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
    switch (c) {
    case O_MODEL: o->model = optarg; break;
    case O_PROMPT: o->prompt = optarg; break;
    case O_MAXTOK: ok = run_number("--max-tokens", optarg, 0, 1 << 20, &v), o->max_tokens = (long)v; break;
    case O_TEMP: ok = run_number("--temperature", optarg, 0, 100, &o->temperature); break;
    case O_TOPK: ok = run_number("--top-k", optarg, 0, 1 << 24, &v), o->top_k = (long)v; break;
    case O_TOPP: ok = run_number("--top-p", optarg, 0, 1, &o->top_p); break;
    case O_MINP: ok = run_number("--min-p", optarg, 0, 1, &o->min_p); break;
    case O_SEED: ok = run_seed(optarg, &o->seed); break;
    case O_RAW: o->raw = true; break;
    case O_THREADS: ok = run_number("--threads", optarg, 0, 1024, &v), o->threads = (long)v; break;
    case O_DEVICE: o->device = optarg; break;
    case O_KVDT:
      if ((o->kv_dtype = kern_kv_dtype_parse(optarg)) < 0)
        fprintf(stderr, "ferrum-run: --kv-cache-dtype is auto, int8 or fp8, got '%s'\n", optarg), ok = false;
      break;
    case O_QUANT:
      if (!(o->fp8 = !strcmp(optarg, "fp8")))
        fprintf(stderr, "ferrum-run: --quantization takes fp8, got '%s'\n", optarg), ok = false;
      break;
    default: ok = false;
    }
  }
  if (ok && o->model && o->prompt && optind == argc) return 0;
  fprintf(stderr, "usage: ferrum-run --model PATH --prompt TEXT [--raw] [--max-tokens N] [--temperature T] "
                  "[--top-k K] [--top-p P] [--min-p P] [--seed S] [--threads N] [--device DEV] "
                  "[--kv-cache-dtype auto|int8|fp8] [--quantization fp8]\n");
  return 2;
}

static model_sampling_t run_sampling(const run_opts_t *o) {
  model_sampling_t sp = model_sampling_default();
  sp.temperature = (float)o->temperature;
  sp.top_k = (int)o->top_k;
  sp.top_p = (float)o->top_p;
  sp.min_p = (float)o->min_p;
  sp.seed = o->seed;
  return sp;
}

/* Generates up to max_tokens after the prompt, streaming text to stdout. */
static int run_generate(model_t *m, model_gen_t *g, const run_opts_t *o, const int32_t *prompt, int n_prompt) {
  model_sampler_t smp;
  model_sampler_init(&smp, m->cfg.vocab_size);
  model_sampling_t sp = run_sampling(o);
  model_detok_t dt;
  model_detok_init(&dt, m->tok, true);
  int32_t *out = fr_malloc((size_t)(o->max_tokens + 1) * sizeof(int32_t));
  char text[1024];
  uint64_t t0 = fr_now_ns();
  int rc = model_gen_feed(g, prompt, n_prompt), n = 0;
  uint64_t t1 = fr_now_ns();
  while (rc == 0 && n < o->max_tokens) {
    int32_t tok = model_sample(&smp, &sp, g->logits, prompt, (size_t)n_prompt, out, (size_t)n, (uint64_t)n, NULL);
    if (model_token_is_eog(m->tok, tok)) break;
    out[n++] = tok;
    int w = model_detok_feed(&dt, tok, text, sizeof text);
    if (w > 0) fwrite(text, 1, (size_t)w, stdout), fflush(stdout);
    if (n < o->max_tokens) rc = model_gen_feed(g, &tok, 1);
  }
  int w = model_detok_flush(&dt, text, sizeof text);
  if (w > 0) fwrite(text, 1, (size_t)w, stdout);
  fputc('\n', stdout);
  fflush(stdout);
  uint64_t t2 = fr_now_ns();
  if (rc == 0)
    FR_LOGI("prompt %d tokens in %.3f s (%.1f tok/s), generated %d tokens in %.3f s (%.1f tok/s)", n_prompt,
            (t1 - t0) / 1e9, n_prompt / ((t1 - t0) / 1e9), n, (t2 - t1) / 1e9, n > 1 ? (n - 1) / ((t2 - t1) / 1e9) : 0);
  free(out);
  model_sampler_deinit(&smp);
  return rc;
}

int main(int argc, char **argv) {
  run_opts_t o;
  int prc = run_parse(argc, argv, &o);
  if (prc) return prc;
  kern_backend_t *be = NULL;
  model_t *m = NULL;
  model_gen_t *g = NULL;
  int32_t *ids = NULL;
  size_t n_ids = 0;
  model_load_opts_t lo = {.progress = true, .fp8_weights = o.fp8};
  int rc = kern_backend_create(&be, o.device, (int)o.threads);
  if (rc) goto done;
  if ((rc = model_load(&m, o.model, be, &lo))) goto done;
  if (!m->tok) {
    rc = fr_errorf(FR_EUNSUPPORTED, "%s has no tokenizer", o.model);
    goto done;
  }
  if ((rc = model_prompt_tokenize(m, o.prompt, o.raw, &ids, &n_ids))) goto done;
  if ((rc = model_gen_create_kv(&g, m, 0, (kern_kv_dtype_t)o.kv_dtype))) goto done;
  if ((int)n_ids + o.max_tokens > g->max_ctx) {
    rc = fr_errorf(FR_ECONTEXT, "prompt (%zu tokens) + --max-tokens %ld exceed the context of %d tokens", n_ids,
                   o.max_tokens, g->max_ctx);
    goto done;
  }
  rc = run_generate(m, g, &o, ids, (int)n_ids);
done:
  if (rc) fprintf(stderr, "ferrum-run: %s\n", fr_last_error());
  free(ids);
  model_gen_destroy(g);
  model_destroy(m);
  kern_backend_destroy(be);
  return rc ? 1 : 0;
}
