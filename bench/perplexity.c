/* perplexity.c - perplexity of a model over a text file, with any KV cache
 * dtype: the check that a quantized KV cache (--kv-cache-dtype int8 / fp8)
 * costs little (tests/model/test_kv_ppl.py; docs/bench/kv-cache-dtype.md).
 *
 * usage: perplexity --model PATH --text FILE [--ctx N] [--batch B]
 *                   [--kv-cache-dtype auto|int8|fp8] [--device DEV]
 *                   [--threads N] [--max-chunks N] [--tokens-out FILE]
 *
 * The text is tokenized as it is (the model's BOS first if it wants one)
 * and cut into chunks of --ctx tokens (default 512; a shorter tail is
 * dropped). Each chunk starts with an empty cache; every token but the
 * chunk's first is scored by the log-probability of it given the tokens
 * before it in the chunk. Perplexity = exp(mean negative log-probability).
 * All positions' logits come from steps of --batch tokens in which every
 * token is a one-token sequence over the chunk's shared block table (the
 * tokens' K/V are appended before attention reads them, and each reads
 * only its prefix), so the cache is read as the engine reads it.
 * --tokens-out writes the token ids (one per line) so that another engine
 * (llama.cpp in the test) scores the same tokens.
 * stdout: one line "tokens N scored M ppl P nll L kv DTYPE". Exit 0, 1 on
 * failure, 2 on usage. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_log.h"
#include "common/fr_util.h"
#include "kernels/kern.h"
#include "model/model.h"
#include "model/prompt.h"

typedef struct {
  const char *model, *text, *device, *tokens_out;
  int ctx, batch, threads, max_chunks;
  kern_kv_dtype_t kv_dtype;
} ppl_opts_t;

/* Reads a whole file into a NUL-terminated buffer (caller frees). */
static int ppl_read_file(const char *path, char **out) {
  FILE *f = fopen(path, "rb");
  if (!f) return fr_errorf(-errno, "%s: %s", path, strerror(errno));
  size_t cap = 1 << 16, n = 0;
  char *buf = fr_malloc(cap);
  for (size_t r; (r = fread(buf + n, 1, cap - n - 1, f)) > 0;) {
    n += r;
    if (cap - n - 1 == 0) buf = fr_realloc(buf, cap *= 2);
  }
  fclose(f);
  buf[n] = 0;
  *out = buf;
  return 0;
}

static int ppl_int(const char *opt, const char *s, int lo, int hi, int *out) {
  char *end;
  long v = strtol(s, &end, 10);
  if (end == s || *end || v < lo || v > hi) {
    fprintf(stderr, "perplexity: %s expects a number in [%d, %d], got '%s'\n", opt, lo, hi, s);
    return 2;
  }
  *out = (int)v;
  return 0;
}

static int ppl_parse(int argc, char **argv, ppl_opts_t *o) {
  enum { O_MODEL = 256, O_TEXT, O_CTX, O_BATCH, O_KV, O_DEV, O_THR, O_MAXC, O_TOK };
  static const struct option lo[] = {{"model", required_argument, 0, O_MODEL}, {"text", required_argument, 0, O_TEXT},
                                     {"ctx", required_argument, 0, O_CTX},     {"batch", required_argument, 0, O_BATCH},
                                     {"kv-cache-dtype", required_argument, 0, O_KV},
                                     {"device", required_argument, 0, O_DEV},  {"threads", required_argument, 0, O_THR},
                                     {"max-chunks", required_argument, 0, O_MAXC},
                                     {"tokens-out", required_argument, 0, O_TOK}, {0, 0, 0, 0}};
  *o = (ppl_opts_t){.device = "cpu", .ctx = 512, .batch = 64};
  int c, rc = 0, d;
  while (!rc && (c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
    switch (c) {
    case O_MODEL: o->model = optarg; break;
    case O_TEXT: o->text = optarg; break;
    case O_CTX: rc = ppl_int("--ctx", optarg, 2, 1 << 16, &o->ctx); break;
    case O_BATCH: rc = ppl_int("--batch", optarg, 1, 1024, &o->batch); break;
    case O_DEV: o->device = optarg; break;
    case O_THR: rc = ppl_int("--threads", optarg, 0, 1024, &o->threads); break;
    case O_MAXC: rc = ppl_int("--max-chunks", optarg, 1, 1 << 20, &o->max_chunks); break;
    case O_TOK: o->tokens_out = optarg; break;
    case O_KV:
      if ((d = kern_kv_dtype_parse(optarg)) < 0) {
        fprintf(stderr, "perplexity: --kv-cache-dtype is auto, int8 or fp8, got '%s'\n", optarg);
        rc = 2;
      }
      o->kv_dtype = (kern_kv_dtype_t)(d < 0 ? 0 : d);
      break;
    default: rc = 2;
    }
  }
  if (!rc && (!o->model || !o->text || optind != argc)) rc = 2;
  if (rc)
    fprintf(stderr, "usage: perplexity --model PATH --text FILE [--ctx N] [--batch B] "
                    "[--kv-cache-dtype auto|int8|fp8] [--device DEV] [--threads N] [--max-chunks N] "
                    "[--tokens-out FILE]\n");
  return rc;
}

typedef struct {
  model_t *m;
  kern_kv_pool_t pool;
  int ctx, batch, max_blocks, vocab;
  int32_t *pos, *slots, *qs, *cl, *bt; /* one step's metadata */
  float *logits;                       /* (batch, vocab) host */
} ppl_t;

/* Tokens [i0, i0 + n) of one chunk (tok: the chunk) as n one-token
 * sequences; adds the negative log-probability of each next token
 * inside the chunk to *nll and counts it in *scored. */
static int ppl_step(ppl_t *p, const int32_t *tok, int i0, int n, double *nll, long *scored) {
  for (int i = 0; i < n; i++) {
    p->pos[i] = p->slots[i] = i0 + i; /* identity block table */
    p->qs[i] = i;
    p->cl[i] = i0 + i + 1;
  }
  p->qs[n] = n;
  kern_step_t st = {.n_tokens = n, .tokens = tok + i0, .n_seqs = n, .positions = p->pos, .slots = p->slots,
                    .q_start = p->qs, .ctx_len = p->cl, .block_tables = p->bt, .max_blocks = p->max_blocks};
  const void *logits = NULL;
  int rc = model_forward(p->m, &p->pool, &st, &logits);
  if (!rc) rc = model_logits_to_host(p->m, logits, n, p->logits);
  if (rc) return rc;
  for (int i = 0; i < n && i0 + i + 1 < p->ctx; i++) {
    const float *l = p->logits + (size_t)i * p->vocab;
    double mx = -INFINITY, sum = 0;
    for (int v = 0; v < p->vocab; v++) mx = fmax(mx, l[v]);
    for (int v = 0; v < p->vocab; v++) sum += exp((double)l[v] - mx);
    *nll += mx + log(sum) - l[tok[i0 + i + 1]];
    (*scored)++;
  }
  return 0;
}

static int ppl_setup(ppl_t *p, model_t *m, const ppl_opts_t *o) {
  memset(p, 0, sizeof *p);
  p->m = m, p->ctx = o->ctx, p->batch = o->batch, p->vocab = m->cfg.vocab_size;
  const int bs = 16;
  p->max_blocks = (o->ctx + bs - 1) / bs;
  kern_kv_config_t kc = model_kv_config(m, bs, p->max_blocks, m->be->kv_type);
  kc.dtype = o->kv_dtype;
  if (!(m->be->kv_dtypes & (1u << o->kv_dtype)))
    return fr_errorf(FR_EUNSUPPORTED, "--kv-cache-dtype %s: the %s backend cannot keep it",
                     kern_kv_dtype_name(o->kv_dtype), m->be->ops->name);
  int rc = m->be->ops->kv_pool_init(m->be->ctx, &p->pool, &kc, NULL);
  if (rc) return rc;
  const size_t B = (size_t)o->batch;
  p->pos = fr_malloc(B * 4), p->slots = fr_malloc(B * 4), p->qs = fr_malloc((B + 1) * 4), p->cl = fr_malloc(B * 4);
  p->bt = fr_malloc(B * (size_t)p->max_blocks * 4);
  for (size_t s = 0; s < B; s++)
    for (int b = 0; b < p->max_blocks; b++) p->bt[s * (size_t)p->max_blocks + (size_t)b] = b;
  p->logits = fr_malloc(B * (size_t)p->vocab * sizeof(float));
  return 0;
}

static void ppl_free(ppl_t *p) {
  if (p->pool.base) p->m->be->ops->kv_pool_deinit(p->m->be->ctx, &p->pool);
  free(p->pos), free(p->slots), free(p->qs), free(p->cl), free(p->bt), free(p->logits);
}

static int ppl_write_tokens(const char *path, const int32_t *ids, size_t n) {
  FILE *f = fopen(path, "w");
  if (!f) return fr_errorf(-errno, "%s: %s", path, strerror(errno));
  for (size_t i = 0; i < n; i++) fprintf(f, "%d\n", ids[i]);
  return fclose(f) ? fr_errorf(-EIO, "%s: write failed", path) : 0;
}

/* Scores every whole chunk of ids; prints the result line. */
static int ppl_run(ppl_t *p, const ppl_opts_t *o, const int32_t *ids, size_t n_ids) {
  size_t n_chunks = n_ids / (size_t)o->ctx;
  if (o->max_chunks && n_chunks > (size_t)o->max_chunks) n_chunks = (size_t)o->max_chunks;
  if (n_chunks == 0) return fr_errorf(-EINVAL, "the text has %zu tokens, fewer than one chunk of %d", n_ids, o->ctx);
  double nll = 0;
  long scored = 0;
  uint64_t t0 = fr_now_ns();
  for (size_t c = 0; c < n_chunks; c++) {
    const int32_t *tok = ids + c * (size_t)o->ctx;
    for (int i0 = 0; i0 < o->ctx; i0 += o->batch) {
      int rc = ppl_step(p, tok, i0, FR_MIN(o->batch, o->ctx - i0), &nll, &scored);
      if (rc) return rc;
    }
  }
  FR_LOGI("%zu chunks of %d tokens in %.2f s", n_chunks, o->ctx, (fr_now_ns() - t0) / 1e9);
  printf("tokens %zu scored %ld ppl %.6f nll %.6f kv %s\n", n_chunks * (size_t)o->ctx, scored, exp(nll / scored),
         nll / scored, kern_kv_dtype_name(o->kv_dtype));
  return 0;
}

int main(int argc, char **argv) {
  ppl_opts_t o;
  int rc = ppl_parse(argc, argv, &o);
  if (rc) return rc;
  kern_backend_t *be = NULL;
  model_t *m = NULL;
  char *text = NULL;
  int32_t *ids = NULL;
  size_t n_ids = 0;
  ppl_t p = {0};
  model_load_opts_t lo = {.max_tokens = o.batch, .max_seqs = o.batch};
  if ((rc = ppl_read_file(o.text, &text))) goto done;
  if ((rc = kern_backend_create(&be, o.device, o.threads))) goto done;
  if ((rc = model_load(&m, o.model, be, &lo))) goto done;
  if (!m->tok) {
    rc = fr_errorf(FR_EUNSUPPORTED, "%s has no tokenizer", o.model);
    goto done;
  }
  if ((rc = model_prompt_tokenize(m, text, true, &ids, &n_ids))) goto done;
  if (o.tokens_out && (rc = ppl_write_tokens(o.tokens_out, ids, n_ids))) goto done;
  if ((rc = ppl_setup(&p, m, &o))) goto done;
  rc = ppl_run(&p, &o, ids, n_ids);
done:
  if (rc) fprintf(stderr, "perplexity: %s\n", fr_last_error());
  if (p.m) ppl_free(&p);
  free(ids);
  free(text);
  model_destroy(m);
  kern_backend_destroy(be);
  return rc ? 1 : 0;
}
