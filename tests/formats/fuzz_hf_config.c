/* fuzz_hf_config.c - libFuzzer target: model_config_from_hf_json_buf and
 * model_quant_parse on arbitrary bytes (a config.json as found in a Hugging
 * Face folder, a quantization config: GPTQ, AWQ, FP8, compressed-tensors). */
#include <stddef.h>
#include <stdint.h>

#include "model/quant.h"
#include "model/source.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  model_config_t cfg;
  model_quant_t q;
  (void)model_config_from_hf_json_buf(&cfg, data, size);
  (void)model_quant_parse(&q, data, size);
  return 0;
}
