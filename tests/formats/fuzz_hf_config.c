/* fuzz_hf_config.c - libFuzzer target: model_config_from_hf_json_buf on
 * arbitrary bytes (a config.json as found in a Hugging Face folder). */
#include <stddef.h>
#include <stdint.h>

#include "model/source.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  model_config_t cfg;
  (void)model_config_from_hf_json_buf(&cfg, data, size);
  return 0;
}
