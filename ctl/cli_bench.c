/* cli_bench.c - `ferrumctl bench`: a serving benchmark against a running
 * server over HTTP, like `vllm bench serve` with its random and ShareGPT
 * datasets (bench_dataset.c).
 * Streams every request (/v1/completions, token-id prompts, ignore_eos so
 * outputs have the asked length), measures TTFT, TPOT, ITL and end-to-end
 * latency, prints vLLM's result table, writes JSON (--result-file) and
 * draws latency against throughput over several concurrencies (--sweep,
 * --plot). */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "ctl/bench_dataset.h"
#include "ctl/cli.h"
#include "ctl/http_client.h"
#include "ctl/http_plot.h"

#define BENCH_MAX_SWEEP 16

typedef struct {
  const char *host, *rpc, *model, *api_key, *result_file, *plot_file; /* host NULL, port 0: found */
  const char *dataset_path, *tokenizer; /* ShareGPT prompts (else random ids); tokenizer: a model path */
  long sharegpt_out_len;                /* > 0: every ShareGPT request asks this many tokens */
  bool sharegpt;                        /* --dataset-name sharegpt */
  int port;
  long num_prompts, concurrency, in_len, out_len, seed, vocab_lo, vocab_hi, timeout_s;
  double rate, range_ratio, temperature;
  long sweep[BENCH_MAX_SWEEP];
  int n_sweep;
} bench_opts_t;

typedef struct {
  int32_t *ids; /* (in_len) prompt token ids */
  long in_len, out_len;
  double arrival; /* seconds after the start */
  /* results */
  bool ok;
  double ttft, e2e;   /* seconds */
  long out_tokens;
  double *itl;        /* (n_itl) seconds between chunks */
  long n_itl, cap_itl;
  char err[160];
} bench_req_t;

typedef struct {
  const bench_opts_t *o;
  bench_req_t *reqs;
  long n;
  atomic_long next;
  uint64_t t0;
} bench_run_t;

typedef struct {
  double mean, median, p99;
} bench_dist_t;

typedef struct {
  long concurrency, completed, failed, in_tokens, out_tokens;
  double duration, req_tput, out_tput, total_tput;
  bench_dist_t ttft, tpot, itl, e2e; /* ms */
} bench_result_t;

/* ---- options ---- */

static void bench_usage(FILE *f) {
  fprintf(f,
          "usage: ferrumctl bench [options]   (a running `ferrumctl serve`)\n"
          "  --host H / --port P / --base-url http://H:P   server (default: the running `ferrumctl serve`,\n"
          "                          found through its pid file, else 127.0.0.1:8000)\n"
          "  --rpc ADDR              the server bound to this RPC endpoint (its HTTP address)\n"
          "  --model NAME            served model (default: the server's first)\n"
          "  --api-key KEY           Authorization: Bearer KEY\n"
          "  --num-prompts N         requests (100)\n"
          "  --max-concurrency C     requests in flight at most (all)\n"
          "  --request-rate R        requests per second, Poisson arrivals (inf)\n"
          "  --random-input-len L    prompt tokens (128); --input-len is the same\n"
          "  --random-output-len L   output tokens (128); --output-len is the same\n"
          "  --random-range-ratio F  lengths drawn in [L(1-F), L(1+F)] (0: fixed)\n"
          "  --seed S                prompts and arrivals (0)\n"
          "  --temperature T         sampling temperature of every request (0: greedy)\n"
          "  --dataset-name NAME     random (default) or sharegpt\n"
          "  --dataset-path FILE     the ShareGPT JSON (vLLM's format); prompts are its first turns,\n"
          "                          output lengths its second turns' (vLLM's sampling and limits)\n"
          "  --tokenizer MODEL       the model whose tokenizer counts ShareGPT tokens (default: the\n"
          "                          default model; give the served model's)\n"
          "  --sharegpt-output-len L every ShareGPT request asks L tokens\n"
          "  --result-file FILE      write the results as JSON\n"
          "  --sweep 1,4,16          run once per concurrency\n"
          "  --plot FILE.png         latency against throughput over the sweep\n"
          "  --timeout S             per request wait (600)\n");
}

static int bench_parse_sweep(bench_opts_t *o, const char *s) {
  char *copy = fr_strdup(s), *save = NULL;
  o->n_sweep = 0;
  for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    if (o->n_sweep == BENCH_MAX_SWEEP || cli_parse_int("--sweep", t, 1, 100000, &o->sweep[o->n_sweep++])) {
      free(copy);
      return -1;
    }
  }
  free(copy);
  return o->n_sweep ? 0 : -1;
}

static int bench_parse_url(bench_opts_t *o, const char *url) {
  static char host[256];
  int port = 80;
  if (strncmp(url, "http://", 7) || sscanf(url + 7, "%255[^:/]:%d", host, &port) < 1) {
    fprintf(stderr, "ferrumctl bench: --base-url must look like http://127.0.0.1:8000\n");
    return -1;
  }
  o->host = host;
  o->port = port;
  return 0;
}

/* One option with its value; returns 0, 1 (not this kind) or -1. */
static int bench_opt_num(bench_opts_t *o, const char *k, const char *v) {
  static const struct {
    const char *name;
    size_t off;
    long lo, hi;
  } ints[] = {
      {"--port", 0, 1, 65535}, {"--num-prompts", offsetof(bench_opts_t, num_prompts), 1, 10000000},
      {"--max-concurrency", offsetof(bench_opts_t, concurrency), 1, 100000},
      {"--random-input-len", offsetof(bench_opts_t, in_len), 1, 1000000},
      {"--input-len", offsetof(bench_opts_t, in_len), 1, 1000000},
      {"--random-output-len", offsetof(bench_opts_t, out_len), 1, 1000000},
      {"--output-len", offsetof(bench_opts_t, out_len), 1, 1000000}, {"--seed", offsetof(bench_opts_t, seed), 0, LONG_MAX},
      {"--timeout", offsetof(bench_opts_t, timeout_s), 1, 86400},
      {"--sharegpt-output-len", offsetof(bench_opts_t, sharegpt_out_len), 1, 1000000},
  };
  for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
    if (strcmp(k, ints[i].name)) continue;
    long x;
    if (cli_parse_int(k, v, ints[i].lo, ints[i].hi, &x)) return -1;
    if (i == 0) o->port = (int)x;
    else *(long *)((char *)o + ints[i].off) = x;
    return 0;
  }
  if (!strcmp(k, "--request-rate"))
    return !strcmp(v, "inf") ? (o->rate = INFINITY, 0) : cli_parse_float(k, v, 1e-6, 1e9, &o->rate);
  if (!strcmp(k, "--random-range-ratio")) return cli_parse_float(k, v, 0, 0.999, &o->range_ratio);
  if (!strcmp(k, "--temperature")) return cli_parse_float(k, v, 0, 100, &o->temperature);
  return 1;
}

static int bench_opt(bench_opts_t *o, const char *k, const char *v) {
  int rc = bench_opt_num(o, k, v);
  if (rc <= 0) return rc;
  if (!strcmp(k, "--host")) o->host = v;
  else if (!strcmp(k, "--rpc")) o->rpc = v;
  else if (!strcmp(k, "--base-url")) return bench_parse_url(o, v);
  else if (!strcmp(k, "--model")) o->model = v;
  else if (!strcmp(k, "--api-key")) o->api_key = v;
  else if (!strcmp(k, "--result-file")) o->result_file = v;
  else if (!strcmp(k, "--plot")) o->plot_file = v;
  else if (!strcmp(k, "--sweep")) return bench_parse_sweep(o, v);
  else if (!strcmp(k, "--dataset-path")) o->dataset_path = v;
  else if (!strcmp(k, "--tokenizer")) o->tokenizer = v;
  else if (!strcmp(k, "--dataset-name")) {
    if (!strcmp(v, "random") || !strcmp(v, "sharegpt")) return (o->sharegpt = !strcmp(v, "sharegpt"), 0);
    fprintf(stderr, "ferrumctl bench: --dataset-name %s: random or sharegpt\n", v);
    return -1;
  }
  else {
    fprintf(stderr, "ferrumctl bench: unknown option %s\n", k);
    return -1;
  }
  return 0;
}

static int bench_parse(bench_opts_t *o, int argc, char **argv) {
  *o = (bench_opts_t){.num_prompts = 100, .in_len = 128, .out_len = 128,
                      .rate = INFINITY, .vocab_lo = 1000, .vocab_hi = 20000, .timeout_s = 600};
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      bench_usage(stdout);
      return 1;
    }
    const char *k = argv[i], *eq = strchr(k, '='), *v;
    char key[64];
    if (eq && (size_t)(eq - k) < sizeof key) { /* --opt=value */
      memcpy(key, k, (size_t)(eq - k));
      key[eq - k] = 0;
      k = key, v = eq + 1;
    } else if (i + 1 < argc) {
      v = argv[++i];
    } else {
      fprintf(stderr, "ferrumctl bench: %s needs a value\n", k);
      return -1;
    }
    if (bench_opt(o, k, v)) return -1;
  }
  if (o->plot_file && !o->n_sweep) o->sweep[o->n_sweep++] = o->concurrency ? o->concurrency : o->num_prompts;
  if (o->sharegpt != (o->dataset_path != NULL)) {
    fprintf(stderr, "ferrumctl bench: --dataset-name sharegpt and --dataset-path FILE go together\n");
    return -1;
  }
  if (o->sharegpt && !o->tokenizer) o->tokenizer = cli_default_model();
  return cli_http_target("bench", o->rpc, &o->host, &o->port);
}

/* ---- requests ---- */

static uint64_t bench_rand(uint64_t *s) { /* splitmix64 */
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static double bench_unit(uint64_t *s) { return (double)(bench_rand(s) >> 11) / 9007199254740992.0; }

static long bench_len(uint64_t *s, long len, double ratio) {
  long lo = (long)floor(len * (1 - ratio)), hi = (long)ceil(len * (1 + ratio));
  if (lo < 1) lo = 1;
  return hi > lo ? lo + (long)(bench_rand(s) % (uint64_t)(hi - lo + 1)) : lo;
}

/* Prompts (random ids, or ShareGPT's), lengths and Poisson arrival times,
 * from the seed; each run of a sweep gets prompts of its own (so that no
 * run hits the prefix cache with an earlier run's prompts; ShareGPT: a
 * shuffle of its own). NULL when the dataset cannot be read (said on
 * stderr). */
static bench_req_t *bench_make_reqs(const bench_opts_t *o, int run) {
  uint64_t s = ((uint64_t)o->seed * 2654435761u + 1) ^ ((uint64_t)run << 40);
  bench_sample_t *ds = NULL;
  if (o->sharegpt && bench_sharegpt_load(o->dataset_path, o->tokenizer, o->num_prompts, s, o->sharegpt_out_len, &ds)) {
    fprintf(stderr, "ferrumctl bench: %s\n", fr_last_error());
    return NULL;
  }
  bench_req_t *r = fr_calloc((size_t)o->num_prompts, sizeof *r);
  double t = 0;
  for (long i = 0; i < o->num_prompts; i++) {
    if (ds) { /* taken over */
      r[i].ids = ds[i].ids, r[i].in_len = ds[i].in_len, r[i].out_len = ds[i].out_len;
      ds[i].ids = NULL;
    } else {
      r[i].in_len = bench_len(&s, o->in_len, o->range_ratio);
      r[i].out_len = bench_len(&s, o->out_len, o->range_ratio);
      r[i].ids = fr_malloc((size_t)r[i].in_len * sizeof *r[i].ids);
      for (long k = 0; k < r[i].in_len; k++)
        r[i].ids[k] = (int32_t)(o->vocab_lo + (long)(bench_rand(&s) % (uint64_t)(o->vocab_hi - o->vocab_lo)));
    }
    r[i].arrival = t;
    if (isfinite(o->rate)) t += -log(1 - bench_unit(&s)) / o->rate;
  }
  bench_samples_free(ds, o->num_prompts);
  return r;
}

static void bench_reset(bench_req_t *r, long n) {
  for (long i = 0; i < n; i++) {
    free(r[i].itl);
    r[i].itl = NULL;
    r[i].n_itl = r[i].cap_itl = r[i].out_tokens = 0;
    r[i].ok = false;
    r[i].ttft = r[i].e2e = 0;
    r[i].err[0] = 0;
  }
}

static void bench_free_reqs(bench_req_t *r, long n) {
  bench_reset(r, n);
  for (long i = 0; i < n; i++) free(r[i].ids);
  free(r);
}

static char *bench_body(const bench_opts_t *o, const bench_req_t *r) {
  json_t *ids = json_array();
  for (long k = 0; k < r->in_len; k++) json_array_append_new(ids, json_integer(r->ids[k]));
  json_t *j = json_pack("{s:s,s:o,s:I,s:b,s:f,s:b,s:{s:b}}", "model", o->model, "prompt", ids, "max_tokens",
                        (json_int_t)r->out_len, "ignore_eos", 1, "temperature", o->temperature, "stream", 1,
                        "stream_options", "include_usage", 1);
  char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
  json_decref(j);
  return s;
}

/* Folds one SSE chunk into the request's timings. Returns 0, or -1 for an
 * error chunk. */
static int bench_chunk(bench_req_t *r, const char *data, uint64_t start, uint64_t *last) {
  json_t *j = json_loads(data, JSON_ALLOW_NUL, NULL); /* text may hold U+0000 */
  if (!j) return snprintf(r->err, sizeof r->err, "bad chunk"), -1;
  json_t *err = json_object_get(j, "error"), *usage = json_object_get(j, "usage");
  if (err) {
    snprintf(r->err, sizeof r->err, "%s", json_string_value(json_object_get(err, "message")));
    json_decref(j);
    return -1;
  }
  if (json_is_object(usage)) r->out_tokens = (long)json_integer_value(json_object_get(usage, "completion_tokens"));
  if (json_array_size(json_object_get(j, "choices")) > 0) {
    uint64_t now = fr_now_ns();
    if (!*last) r->ttft = (double)(now - start) / 1e9;
    else {
      if (r->n_itl == r->cap_itl) r->itl = fr_realloc(r->itl, (size_t)(r->cap_itl = r->cap_itl * 2 + 64) * sizeof *r->itl);
      r->itl[r->n_itl++] = (double)(now - *last) / 1e9;
    }
    *last = now;
  }
  json_decref(j);
  return 0;
}

static void bench_one(const bench_opts_t *o, bench_req_t *r) {
  char auth[512] = "";
  if (o->api_key) snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", o->api_key);
  char *body = bench_body(o, r);
  cli_http_t c;
  uint64_t start = fr_now_ns(), last = 0;
  int rc = cli_http_connect(&c, o->host, o->port, (int)o->timeout_s * 1000);
  if (!rc) rc = cli_http_send(&c, "POST", "/v1/completions", auth, body, strlen(body));
  if (!rc && c.status != 200) {
    char *b = NULL;
    cli_http_read_all(&c, 1 << 16, &b, NULL);
    snprintf(r->err, sizeof r->err, "HTTP %d: %.120s", c.status, b ? b : "");
    free(b);
    rc = -1;
  }
  const char *d;
  while (!rc && (rc = cli_http_next_sse(&c, &d)) == 1) {
    rc = 0;
    if (!strcmp(d, "[DONE]")) {
      r->ok = last != 0;
      break;
    }
    if (bench_chunk(r, d, start, &last)) rc = -1;
  }
  if (rc < 0 && !r->err[0]) snprintf(r->err, sizeof r->err, "%s", fr_last_error());
  r->e2e = (double)(fr_now_ns() - start) / 1e9;
  if (r->ok && !r->out_tokens) r->out_tokens = r->n_itl + 1;
  cli_http_close(&c);
  free(body);
}

static void *bench_worker(void *arg) {
  bench_run_t *run = arg;
  for (;;) {
    long i = atomic_fetch_add(&run->next, 1);
    if (i >= run->n) return NULL;
    bench_req_t *r = &run->reqs[i];
    double wait = r->arrival - (double)(fr_now_ns() - run->t0) / 1e9;
    if (wait > 0) usleep((useconds_t)(wait * 1e6));
    bench_one(run->o, r);
  }
}

/* ---- statistics ---- */

static int bench_cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* mean / median / p99 (numpy's linear interpolation) of v, in ms. */
static bench_dist_t bench_dist(double *v, long n) {
  bench_dist_t d = {0, 0, 0};
  if (n == 0) return d;
  qsort(v, (size_t)n, sizeof *v, bench_cmp);
  double sum = 0;
  for (long i = 0; i < n; i++) sum += v[i];
  d.mean = sum / n * 1e3;
  double pos[2] = {0.5 * (n - 1), 0.99 * (n - 1)}, *out[2] = {&d.median, &d.p99};
  for (int k = 0; k < 2; k++) {
    long lo = (long)floor(pos[k]);
    long hi = lo + 1 < n ? lo + 1 : lo;
    *out[k] = (v[lo] + (v[hi] - v[lo]) * (pos[k] - lo)) * 1e3;
  }
  return d;
}

static void bench_summarize(const bench_req_t *r, long n, double duration, bench_result_t *res) {
  long n_itl = 0;
  for (long i = 0; i < n; i++) n_itl += r[i].ok ? r[i].n_itl : 0;
  double *ttft = fr_malloc((size_t)(n + 1) * sizeof(double)), *tpot = fr_malloc((size_t)(n + 1) * sizeof(double));
  double *e2e = fr_malloc((size_t)(n + 1) * sizeof(double)), *itl = fr_malloc((size_t)(n_itl + 1) * sizeof(double));
  long k = 0, t = 0, m = 0;
  res->duration = duration;
  for (long i = 0; i < n; i++) {
    if (!r[i].ok) {
      res->failed++;
      continue;
    }
    res->completed++;
    res->in_tokens += r[i].in_len;
    res->out_tokens += r[i].out_tokens;
    ttft[k] = r[i].ttft, e2e[k++] = r[i].e2e;
    if (r[i].out_tokens > 1) tpot[t++] = (r[i].e2e - r[i].ttft) / (double)(r[i].out_tokens - 1);
    for (long j = 0; j < r[i].n_itl; j++) itl[m++] = r[i].itl[j];
  }
  res->req_tput = res->completed / duration;
  res->out_tput = res->out_tokens / duration;
  res->total_tput = (res->in_tokens + res->out_tokens) / duration;
  res->ttft = bench_dist(ttft, k), res->tpot = bench_dist(tpot, t);
  res->itl = bench_dist(itl, m), res->e2e = bench_dist(e2e, k);
  free(ttft), free(tpot), free(e2e), free(itl);
}

/* ---- output ---- */

static void bench_row(const char *k, double v, int prec) { printf("%-40s%-10.*f\n", k, prec, v); }

static void bench_dist_rows(const char *head, const char *name, const bench_dist_t *d) {
  char k[64];
  printf("%s\n", head);
  snprintf(k, sizeof k, "Mean %s (ms):", name), bench_row(k, d->mean, 2);
  snprintf(k, sizeof k, "Median %s (ms):", name), bench_row(k, d->median, 2);
  snprintf(k, sizeof k, "P99 %s (ms):", name), bench_row(k, d->p99, 2);
}

static void bench_print(const bench_opts_t *o, const bench_result_t *r) {
  printf("============ Serving Benchmark Result ============\n");
  printf("%-40s%-10ld\n", "Successful requests:", r->completed);
  if (r->failed) printf("%-40s%-10ld\n", "Failed requests:", r->failed);
  printf("%-40s%-10ld\n", "Maximum request concurrency:", r->concurrency);
  bench_row("Benchmark duration (s):", r->duration, 2);
  printf("%-40s%-10ld\n", "Total input tokens:", r->in_tokens);
  printf("%-40s%-10ld\n", "Total generated tokens:", r->out_tokens);
  bench_row("Request throughput (req/s):", r->req_tput, 2);
  bench_row("Output token throughput (tok/s):", r->out_tput, 2);
  bench_row("Total Token throughput (tok/s):", r->total_tput, 2);
  bench_dist_rows("---------------Time to First Token----------------", "TTFT", &r->ttft);
  bench_dist_rows("-----Time per Output Token (excl. 1st token)------", "TPOT", &r->tpot);
  bench_dist_rows("---------------Inter-token Latency----------------", "ITL", &r->itl);
  bench_dist_rows("----------------End-to-end Latency----------------", "E2EL", &r->e2e);
  printf("==================================================\n");
  fflush(stdout);
}

static void bench_json_dist(json_t *j, const char *name, const bench_dist_t *d) {
  char k[64];
  snprintf(k, sizeof k, "mean_%s_ms", name), json_object_set_new(j, k, json_real(d->mean));
  snprintf(k, sizeof k, "median_%s_ms", name), json_object_set_new(j, k, json_real(d->median));
  snprintf(k, sizeof k, "p99_%s_ms", name), json_object_set_new(j, k, json_real(d->p99));
}

static json_t *bench_json(const bench_opts_t *o, const bench_result_t *r) {
  json_t *j = json_pack("{s:s,s:s,s:I,s:I,s:o,s:I,s:I,s:f,s:I,s:I,s:I,s:f,s:f,s:f}", "backend", "ferrum", "model",
                        o->model, "num_prompts", (json_int_t)o->num_prompts, "max_concurrency",
                        (json_int_t)r->concurrency, "request_rate",
                        isfinite(o->rate) ? json_real(o->rate) : json_string("inf"), "random_input_len",
                        (json_int_t)o->in_len, "random_output_len", (json_int_t)o->out_len, "duration", r->duration,
                        "completed", (json_int_t)r->completed, "total_input_tokens", (json_int_t)r->in_tokens,
                        "total_output_tokens", (json_int_t)r->out_tokens, "request_throughput", r->req_tput,
                        "output_throughput", r->out_tput, "total_token_throughput", r->total_tput);
  if (!j) return NULL;
  json_object_set_new(j, "failed", json_integer(r->failed));
  bench_json_dist(j, "ttft", &r->ttft);
  bench_json_dist(j, "tpot", &r->tpot);
  bench_json_dist(j, "itl", &r->itl);
  bench_json_dist(j, "e2el", &r->e2e);
  return j;
}

static int bench_write_json(const bench_opts_t *o, const bench_result_t *res, int n) {
  char date[32];
  time_t now = time(NULL);
  strftime(date, sizeof date, "%Y%m%d-%H%M%S", localtime(&now));
  json_t *runs = json_array();
  for (int i = 0; i < n; i++) json_array_append_new(runs, bench_json(o, &res[i]));
  json_t *root = n == 1 ? json_incref(json_array_get(runs, 0)) : json_pack("{s:s,s:O}", "model", o->model, "runs", runs);
  json_object_set_new(root, "date", json_string(date));
  int rc = json_dump_file(root, o->result_file, JSON_INDENT(2));
  json_decref(root);
  json_decref(runs);
  if (rc) return fprintf(stderr, "ferrumctl bench: cannot write %s\n", o->result_file), -1;
  return 0;
}

static int bench_plot(const bench_opts_t *o, const bench_result_t *res, int n) {
  cli_plot_point_t pts[BENCH_MAX_SWEEP];
  char labels[BENCH_MAX_SWEEP][24];
  for (int i = 0; i < n; i++) {
    snprintf(labels[i], sizeof labels[i], "C=%ld", res[i].concurrency);
    pts[i] = (cli_plot_point_t){res[i].out_tput, res[i].e2e.median / 1e3, labels[i]};
  }
  int rc = cli_plot_png(o->plot_file, pts, n, "ferrum bench: latency vs throughput", "output tokens/s",
                        "median e2e latency (s)", 900, 600);
  if (rc) fprintf(stderr, "ferrumctl bench: %s\n", fr_last_error());
  return rc;
}

/* ---- running ---- */

/* The server's first model name (GET /v1/models) into a static buffer. */
static int bench_model(bench_opts_t *o) {
  static char name[256];
  cli_http_t c;
  char *b = NULL, auth[512] = "";
  if (o->api_key) snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", o->api_key);
  int rc = cli_http_connect(&c, o->host, o->port, 10000);
  if (!rc) rc = cli_http_send(&c, "GET", "/v1/models", auth, NULL, 0);
  if (!rc) rc = cli_http_read_all(&c, 1 << 20, &b, NULL);
  cli_http_close(&c);
  json_t *j = rc ? NULL : json_loads(b, JSON_ALLOW_NUL, NULL);
  free(b);
  const char *id = json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "id"));
  if (id) snprintf(name, sizeof name, "%s", id), o->model = name;
  json_decref(j);
  if (!o->model) fprintf(stderr, "ferrumctl bench: no model from http://%s:%d/v1/models\n", o->host, o->port);
  return o->model ? 0 : -1;
}

static void bench_run(const bench_opts_t *o, bench_req_t *reqs, long concurrency, bench_result_t *res) {
  bench_run_t run = {.o = o, .reqs = reqs, .n = o->num_prompts};
  long nt = concurrency < o->num_prompts ? concurrency : o->num_prompts;
  pthread_t *th = fr_calloc((size_t)nt, sizeof *th);
  atomic_init(&run.next, 0);
  run.t0 = fr_now_ns();
  long started = 0;
  for (; started < nt; started++)
    if (pthread_create(&th[started], NULL, bench_worker, &run)) break;
  for (long i = 0; i < started; i++) pthread_join(th[i], NULL);
  free(th);
  memset(res, 0, sizeof *res);
  res->concurrency = nt;
  bench_summarize(reqs, o->num_prompts, (double)(fr_now_ns() - run.t0) / 1e9, res);
  for (long i = 0; i < o->num_prompts; i++)
    if (!reqs[i].ok) {
      fprintf(stderr, "ferrumctl bench: request %ld failed: %s\n", i, reqs[i].err);
      break;
    }
}

int cli_cmd_bench(int argc, char **argv) {
  bench_opts_t o;
  int rc = bench_parse(&o, argc, argv);
  if (rc) return rc < 0 ? 2 : 0;
  if (!o.model && bench_model(&o)) return 1;
  bench_result_t res[BENCH_MAX_SWEEP];
  int n = o.n_sweep ? o.n_sweep : 1;
  for (int i = 0; i < n; i++) {
    long c = o.n_sweep ? o.sweep[i] : o.concurrency ? o.concurrency : o.num_prompts;
    if (o.sharegpt)
      fprintf(stderr, "ferrumctl bench: %ld requests, concurrency %ld, rate %g/s, ShareGPT prompts from %s\n",
              o.num_prompts, c, o.rate, o.dataset_path);
    else
      fprintf(stderr, "ferrumctl bench: %ld requests, concurrency %ld, rate %g/s, input %ld, output %ld tokens\n",
              o.num_prompts, c, o.rate, o.in_len, o.out_len);
    bench_req_t *reqs = bench_make_reqs(&o, i);
    if (!reqs) return 1;
    bench_run(&o, reqs, c, &res[i]);
    bench_free_reqs(reqs, o.num_prompts);
    bench_print(&o, &res[i]);
  }
  rc = 0;
  if (o.result_file && bench_write_json(&o, res, n)) rc = 1;
  if (o.plot_file && bench_plot(&o, res, n)) rc = 1;
  for (int i = 0; i < n; i++)
    if (res[i].completed == 0) rc = 1;
  return rc;
}
