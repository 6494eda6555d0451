/* bench_coord.c - the coordinator's own time per step (decode the result,
 * apply tokens, schedule, encode and send the next step, detokenize and
 * stream) at N running sequences. Workers run with --fake-workers (no
 * forward pass), so the loop's share is what is measured; every stream
 * event really goes to an RPC client (this program).
 *
 * usage: bench_coord [n_seqs (64)] [tokens per job (256)] [real]
 * ("real": the real worker runs the model; the loop's time is measured the
 * same way, from the result's arrival to the end of streaming). 
 * Needs FERRUM_BUILD_DIR (bin/ferrumctl) and FERRUM_MODEL (the tokenizer). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/engine/engine_fx.h"

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 64, len = argc > 2 ? atoi(argv[2]) : 256;
  if (n < 1 || n > 1024 || len < 1) return 2;
  char stats[400], seqs[16];
  efx_server_t s;
  snprintf(seqs, sizeof seqs, "%d", n);
  snprintf(stats, sizeof stats, "/tmp/ferrum-bench-coord-%d.txt", (int)getpid());
  bool real = argc > 3 && !strcmp(argv[3], "real");
  const char *extra[] = {"--step-stats", stats, "--max-num-seqs", seqs, "--num-kv-blocks", "8192",
                         real ? NULL : "--fake-workers", NULL};
  if (efx_start(&s, extra)) return 1;
  fr_client_t *c = NULL;
  efx_job_t *jobs = calloc((size_t)n, sizeof *jobs);
  if (fr_client_connect(&c, s.rpc)) return 1;
  for (int i = 0; i < n; i++) {
    char prompt[64];
    snprintf(prompt, sizeof prompt, "Request number %d: tell me a story", i);
    proto_submit_t r = efx_greedy(prompt, (uint32_t)len);
    if (fr_client_submit(c, &r, &jobs[i].id)) return 1;
  }
  int rc = efx_collect(c, jobs, n, 600000);
  fr_client_close(c);
  if (efx_stop(&s, false) != 0 || rc) return 1;
  FILE *f = fopen(stats, "r");
  if (!f) return 1;
  enum { K = 3 };
  uint32_t *v[K], x[K], items;
  for (int k = 0; k < K; k++) v[k] = malloc(1000000 * sizeof *v[k]);
  size_t m = 0, all = 0;
  char line[128];
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "%u %u %u %u", &x[0], &x[1], &x[2], &items) == 4 && ++all && (int)items == n && m < 1000000) {
      for (int k = 0; k < K; k++) v[k][m] = x[k];
      m++;
    }
  fclose(f);
  remove(stats);
  if (!m) return 1;
  printf("steps with %d running sequences: %zu (of %zu)\n", n, m, all);
  const char *what[K] = {"wall time per step", "CPU time per step", "wall time to the next step's send"};
  for (int k = 0; k < K; k++) {
    qsort(v[k], m, sizeof *v[k], cmp_u32);
    double sum = 0;
    for (size_t i = 0; i < m; i++) sum += v[k][i];
    printf("coordinator %s: mean %.1f us, p50 %.1f us, p90 %.1f us, p99 %.1f us, max %.1f us\n", what[k],
           sum / m / 1e3, v[k][m / 2] / 1e3, v[k][m * 9 / 10] / 1e3, v[k][m * 99 / 100] / 1e3, v[k][m - 1] / 1e3);
    free(v[k]);
  }
  free(jobs);
  return 0;
}
