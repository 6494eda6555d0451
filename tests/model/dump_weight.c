/* dump_weight - writes one weight of a model source as the source decodes
 * it: rows x cols f32 (little-endian, row-major), in the file's column
 * order (a GPTQ act-order permutation undone). test_gptq.py compares it
 * with the reference decoder of tests/golden/make_gptq.py, bit for bit.
 * usage: dump_weight MODEL GGUF_TENSOR_NAME OUT_FILE [NAME OUT_FILE ...]
 */
#include <stdio.h>
#include <stdlib.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "kernels/kern_types.h"
#include "model/source.h"

static int dump(const model_tensor_t *t, FILE *f) {
  const size_t rb = kern_row_bytes(t->type, t->cols), cols = (size_t)t->cols;
  float *row = fr_malloc(cols * sizeof *row), *out = fr_malloc(cols * sizeof *out);
  int rc = 0;
  for (int64_t r = 0; r < t->rows && !rc; r++) {
    kern_dequantize_row(t->type, (const uint8_t *)t->data + (size_t)r * rb, row, t->cols);
    for (size_t k = 0; k < cols; k++) out[t->perm ? (size_t)t->perm[k] : k] = row[k];
    if (fwrite(out, sizeof *out, cols, f) != cols) rc = -1;
  }
  free(row);
  free(out);
  return rc;
}

/* Writes tensor name of s to path; prints its type and shape. */
static int dump_one(const model_source_t *s, const char *name, const char *path) {
  const model_tensor_t *t = model_source_tensor(s, name);
  FILE *f = t ? fopen(path, "wb") : NULL;
  int rc = t && f ? dump(t, f) : -1;
  if (f && fclose(f)) rc = -1;
  if (rc) fprintf(stderr, "dump_weight: %s: no such tensor, or cannot write %s\n", name, path);
  else printf("%s %s %lld %lld\n", name, kern_type_traits(t->type)->name, (long long)t->rows, (long long)t->cols);
  return rc;
}

int main(int argc, char **argv) {
  if (argc < 4 || argc % 2) {
    fprintf(stderr, "usage: dump_weight MODEL GGUF_TENSOR_NAME OUT_FILE [NAME OUT_FILE ...]\n");
    return 2;
  }
  model_source_t *s;
  if (model_source_open(&s, argv[1])) {
    fprintf(stderr, "dump_weight: %s\n", fr_last_error());
    return 1;
  }
  int rc = 0;
  for (int i = 2; i + 1 < argc && !rc; i += 2) rc = dump_one(s, argv[i], argv[i + 1]);
  model_source_close(s);
  return rc ? 1 : 0;
}
