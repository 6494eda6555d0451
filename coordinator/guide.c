/* guide.c - constrained decoding in the coordinator: a job's grammar (a
 * JSON schema or a regex from its submit) and state; the state moves past
 * each token the job gets, and each final step item of the job carries
 * the mask of the tokens that keep its output in the grammar, which the
 * worker's sampler applies (docs/ARCHITECTURE.md, "Constrained decoding").
 * The mask is worked out when the step is built, from the state after the
 * previous token: the loop appends a step's tokens before it builds the
 * next one. A guide with a start text (gd.a: a reasoning model's
 * "</think>", as vLLM starts the grammar when the reasoning ends) sends
 * no mask until the output holds that text; the bytes after it, in the
 * token that ends it, are the grammar's first. Loop thread only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_log.h"
#include "common/fr_util.h"
#include "coordinator/coord_impl.h"
#include "model/grammar.h"

struct coord_guide {
  model_grammar_t *g;
  model_gstate_t state;
  uint32_t *mask;            /* (model_gvocab_words) sent with the next final item */
  char *after;               /* the start text (after_len bytes), or NULL: the grammar holds from the start */
  uint32_t after_len;
  char *tail;                /* the output's last after_len - 1 bytes (at most) while the start text is awaited */
  uint32_t tail_len;
  char *scratch;             /* (scratch_cap) the tail and a token's bytes */
  size_t scratch_cap;
  bool started;              /* the grammar holds (no start text, or it came) */
};

int coord__guide_init(coord_t *c, coord_job_t *j, const proto_submit_t *s, const char **msg) {
  static char err[512];
  char why[400] = "";
  if (s->guide.kind == PROTO_GUIDE_NONE) return 0;
  if ((!c->gvocab && model_gvocab_create(&c->gvocab, c->tok, c->vocab)) ||
      (!c->gscratch && model_gscratch_create(&c->gscratch, c->gvocab))) {
    *msg = "out of memory";
    return -1;
  }
  struct coord_guide *gd = fr_calloc(1, sizeof *gd);
  size_t n = s->guide.spec ? (s->guide.spec_len ? s->guide.spec_len : strlen(s->guide.spec)) : 0;
  int rc = s->guide.kind == PROTO_GUIDE_JSON ? model_grammar_json(&gd->g, s->guide.spec, n, why, sizeof why)
                                             : model_grammar_regex(&gd->g, s->guide.spec, n, why, sizeof why);
  if (rc) {
    snprintf(err, sizeof err, "%s: %s", s->guide.kind == PROTO_GUIDE_JSON ? "response_format" : "guided_regex",
             why[0] ? why : fr_strerror(rc));
    free(gd);
    *msg = err;
    return -1;
  }
  model_gstate_init(gd->g, &gd->state);
  gd->mask = fr_malloc(model_gvocab_words(c->gvocab) * sizeof *gd->mask);
  gd->started = !s->guide.after || !s->guide.after_len;
  if (!gd->started) {
    gd->after = fr_malloc(s->guide.after_len);
    memcpy(gd->after, s->guide.after, s->guide.after_len);
    gd->after_len = s->guide.after_len;
    gd->tail = fr_malloc(gd->after_len);
    gd->scratch = fr_malloc(gd->scratch_cap = gd->after_len + 1024); /* grows for a longer token */
  }
  j->guide = gd;
  return 0;
}

/* Before the grammar starts: looks for the start text in the output's
 * tail and a token's n bytes b; once found, the grammar starts and *rest
 * (rest_n bytes, in gd->scratch) is what followed it in b; else *rest is
 * NULL. */
static void guide_await(struct coord_guide *gd, const char *b, size_t n, const char **rest, size_t *rest_n) {
  size_t len = gd->tail_len + n;
  if (len > gd->scratch_cap) gd->scratch = fr_realloc(gd->scratch, gd->scratch_cap = len);
  char *scratch = gd->scratch;
  memcpy(scratch, gd->tail, gd->tail_len);
  memcpy(scratch + gd->tail_len, b, n);
  *rest = NULL, *rest_n = 0;
  for (size_t i = 0; i + gd->after_len <= len; i++)
    if (!memcmp(scratch + i, gd->after, gd->after_len)) {
      gd->started = true;
      *rest = scratch + i + gd->after_len, *rest_n = len - i - gd->after_len;
      return;
    }
  size_t keep = len < gd->after_len - 1 ? len : gd->after_len - 1;
  memcpy(gd->tail, scratch + len - keep, keep);
  gd->tail_len = (uint32_t)keep;
}

void coord__guide_advance(coord_t *c, coord_job_t *j, int32_t t) {
  struct coord_guide *gd = j->guide;
  size_t n = 0;
  const char *b = model_token_bytes(c->tok, t, &n);
  if (!gd || model_token_is_eog(c->tok, t) || !b) return;
  if (!gd->started) guide_await(gd, b, n, &b, &n);
  if (b && !model_gstate_feed(gd->g, &gd->state, b, n)) /* the mask allowed it (or it ended the start text with bytes the grammar refuses): only EOS comes next */
    FR_LOGW("job %llu: token %d leaves its grammar", (unsigned long long)j->id, t);
}

void coord__guide_item(coord_t *c, coord_job_t *j, proto_step_item_t *it) {
  struct coord_guide *gd = j->guide;
  it->n_mask = 0, it->mask = NULL;
  if (!gd || !it->final || !gd->started) return;
  model_grammar_mask(gd->g, &gd->state, c->gvocab, gd->mask, c->gscratch);
  it->mask = gd->mask;
  it->n_mask = model_gvocab_words(c->gvocab);
}

void coord__guide_free(coord_job_t *j) {
  if (!j->guide) return;
  model_grammar_destroy(j->guide->g);
  free(j->guide->mask);
  free(j->guide->after);
  free(j->guide->tail);
  free(j->guide->scratch);
  free(j->guide);
  j->guide = NULL;
}
