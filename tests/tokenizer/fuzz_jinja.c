/* fuzz_jinja.c - libFuzzer target: arbitrary bytes as a chat template,
 * parsed and rendered with a small chat (messages, tools, flags) under
 * tight limits. Any input must end in 0 or an error code with a message,
 * within the limits: never a crash, a hang or a leak (ASan/UBSan). */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "model/jinja.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static json_t *g_vars;

static json_t *vars(void) {
  if (!g_vars)
    g_vars = json_loads("{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
                        " {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"hi é\"}]},"
                        " {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"type\": \"function\","
                        " \"function\": {\"name\": \"f\", \"arguments\": {\"a\": 1.5}}}]}],"
                        " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}],"
                        " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\","
                        " \"enable_thinking\": false}",
                        0, NULL);
  return g_vars;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  model_jinja_t *t = NULL;
  if (model_jinja_parse(&t, (const char *)data, size) != 0) {
    if (t || !*fr_last_error()) abort();
    return 0;
  }
  model_jinja_limits_t lim = {.max_output = 1 << 16, .max_steps = 100000, .max_depth = 16, .max_memory = 16u << 20};
  char *out = NULL;
  size_t n = 0;
  int rc = model_jinja_render(t, vars(), &lim, &out, &n);
  if (rc == 0 && (!out || n > lim.max_output || strlen(out) > n)) abort();
  if (rc != 0 && (out || (rc != FR_EFORMAT && rc != FR_ETOOBIG))) abort();
  free(out);
  model_jinja_destroy(t);
  return 0;
}
