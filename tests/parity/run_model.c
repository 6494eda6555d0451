/* run_model - feeds token ids to a model on a backend and prints what the
 * parity scripts compare: the last prompt token's logits (f32 file) and N
 * greedy tokens (JSON on stdout). Used by tests/parity/hf_parity.py (GPU vs
 * transformers) and tests/parity/device_check.sh's cross step (CPU vs CUDA).
 * usage: run_model (--model PATH | --dummy NAME [--type T]) [--device D]
 *                  --ids 1,2,3 [--greedy N] [--logits-out FILE] [--quantization fp8]
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "kernels/kern.h"
#include "model/dummy.h"
#include "model/generate.h"
#include "model/model.h"
#include "model/sampler.h"

int main(int argc, char **argv) {
  const char *model = NULL, *dummy = NULL, *device = "cpu", *ids_s = NULL, *out = NULL, *type = NULL;
  int greedy = 32;
  bool fp8 = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--model")) model = argv[i + 1];
    else if (!strcmp(argv[i], "--dummy")) dummy = argv[i + 1];
    else if (!strcmp(argv[i], "--type")) type = argv[i + 1];
    else if (!strcmp(argv[i], "--device")) device = argv[i + 1];
    else if (!strcmp(argv[i], "--ids")) ids_s = argv[i + 1];
    else if (!strcmp(argv[i], "--greedy")) greedy = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--logits-out")) out = argv[i + 1];
    else if (!strcmp(argv[i], "--quantization")) fp8 = !strcmp(argv[i + 1], "fp8");
  }
  if ((!model && !dummy) || !ids_s) {
    fprintf(stderr, "usage: run_model (--model PATH | --dummy NAME) [--device D] --ids 1,2,3 [--greedy N]\n");
    return 2;
  }
  int32_t ids[8192];
  int n = 0;
  for (char *s = (char *)ids_s; *s && n < 8192;) {
    ids[n++] = (int32_t)strtol(s, &s, 10);
    if (*s == ',') s++;
  }
  kern_backend_t *be;
  model_t *m = NULL;
  model_gen_t *g = NULL;
  int rc = kern_backend_create(&be, device, 0);
  model_load_opts_t lo = {.max_tokens = 512, .max_seqs = 4, .seed = 7, .fp8_weights = fp8};
  if (!rc) rc = model_dummy_weights(&lo, type);
  if (!rc && dummy) {
    model_config_t cfg;
    rc = model_dummy_config(dummy, &cfg);
    if (!rc) rc = model_load_dummy(&m, &cfg, be, &lo);
  } else if (!rc) {
    rc = model_load(&m, model, be, &lo);
  }
  if (!rc) rc = model_gen_create(&g, m, n + greedy + 16);
  if (!rc) rc = model_gen_feed(g, ids, n);
  if (!rc && out) {
    FILE *f = fopen(out, "wb");
    if (!f || fwrite(g->logits, sizeof(float), (size_t)m->cfg.vocab_size, f) != (size_t)m->cfg.vocab_size) rc = -EIO;
    if (f) fclose(f);
  }
  /* greedy tokens and the top-5 at each step (for vLLM's divergence rule) */
  int32_t *toks = fr_calloc((size_t)greedy + 1, sizeof(int32_t)), (*top)[5] = fr_calloc((size_t)greedy + 1, sizeof *top);
  int done = 0;
  for (; !rc && done < greedy; done++) {
    float lp[5];
    model_logprobs(g->logits, m->cfg.vocab_size, 5, top[done], lp, NULL);
    toks[done] = top[done][0];
    if (done + 1 < greedy) rc = model_gen_feed(g, &toks[done], 1);
  }
  printf("{\"vocab\": %d, \"greedy\": [", m ? m->cfg.vocab_size : 0);
  for (int t = 0; t < done; t++) printf(t ? ", %d" : "%d", toks[t]);
  printf("], \"top5\": [");
  for (int t = 0; t < done; t++)
    printf("%s[%d, %d, %d, %d, %d]", t ? ", " : "", top[t][0], top[t][1], top[t][2], top[t][3], top[t][4]);
  printf("]}\n");
  free(toks);
  free(top);
  if (rc) fprintf(stderr, "run_model: %s\n", fr_last_error());
  model_gen_destroy(g);
  model_destroy(m);
  kern_backend_destroy(be);
  return rc ? 1 : 0;
}
