/* fuzz_spec_config.c - libFuzzer target over the --speculative-config
 * parser: any bytes; an accepted config is within its ranges (a draft
 * model path a terminated string), and the
 * proposer runs with it over the same bytes taken as tokens. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_util.h"
#include "coordinator/spec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *s = malloc(size + 1);
  memcpy(s, data, size);
  s[size] = 0;
  coord_spec_config_t c;
  if (coord_spec_parse(s, &c) == 0) {
    FR_ASSERT(c.num_speculative_tokens >= 1 && c.num_speculative_tokens <= COORD_SPEC_MAX_TOKENS);
    FR_ASSERT(c.prompt_lookup_min >= 1 && c.prompt_lookup_min <= c.prompt_lookup_max);
    FR_ASSERT(c.disable_by_batch_size >= 0 && c.min_acceptance_rate <= 1);
    FR_ASSERT(memchr(c.draft_model, 0, sizeof c.draft_model) != NULL); /* a C string, within its buffer */
    int32_t tok[256], out[COORD_SPEC_MAX_TOKENS];
    int n = (int)FR_MIN(size, sizeof tok / sizeof tok[0]);
    for (int i = 0; i < n; i++) tok[i] = data[i] % 7; /* few distinct tokens: many matches */
    int k = coord_spec_propose(&c, tok, n, c.num_speculative_tokens, out);
    FR_ASSERT(k >= 0 && k <= c.num_speculative_tokens && k < FR_MAX(n, 1));
  }
  free(s);
  return 0;
}
