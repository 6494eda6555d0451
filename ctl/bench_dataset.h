/* bench_dataset.h - prompts for `ferrumctl bench` from a dataset file, so
 * that published comparisons (`vllm bench serve --dataset-name sharegpt`)
 * can be rerun against ferrum. */
#pragma once

#include <stdint.h>

/* One request: prompt token ids and the output length to ask for. */
typedef struct {
  int32_t *ids; /* fr_malloc'd */
  long in_len, out_len;
} bench_sample_t;

/* ShareGPT as vLLM samples it (benchmarks/datasets.py, ShareGPTDataset):
 * the JSON array's entries with at least two "conversations" turns,
 * shuffled by seed; the first turn's "value" is the prompt, the second's
 * token count the output length (or out_len when > 0); pairs with a prompt
 * or output under 4 tokens, a prompt over 1024 or both over 2048 are
 * skipped, until n are taken. Fewer valid pairs than n: they are reused in
 * order, as vLLM oversamples. Tokens come from the tokenizer of the model
 * at tokenizer_model (GGUF file or HF folder), with the model's special
 * tokens (BOS) added as the server would. Returns 0 with *out (n entries;
 * bench_samples_free), or an error with a message. */
int bench_sharegpt_load(const char *path, const char *tokenizer_model, long n, uint64_t seed, long out_len,
                        bench_sample_t **out);

void bench_samples_free(bench_sample_t *s, long n);
