/* dump_weight - writes one weight of a model source as the source decodes
 * it: rows x cols f32 (little-endian, row-major), in the file's column
 * order (a GPTQ act-order permutation undone; an FP8 layer decoded to BF16
 * a row at a time, as the loader reads it). test_gptq.py and
 * test_fp8_ckpt.py compare it with the reference decoders of
 * tests/golden/make_gptq.py and make_fp8.py, bit for bit.
 *
 * With --cols C0 NC, it writes instead the part of a KERN_I4G weight that
 * takes inputs [C0, C0 + NC), as tensor parallelism loads it for a rank
 * (model_quant_cols): OUT is rows x (the part's cols) f32 in the part's own
 * column order, padding included, and OUT.perm the part's perm as int32
 * (-1: padding; 0, 1, ... when it has none).
 *
 * usage: dump_weight [--cols C0 NC] MODEL GGUF_TENSOR_NAME OUT_FILE [NAME OUT_FILE ...]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "kernels/kern_types.h"
#include "model/quant.h"
#include "model/source.h"

static int dump(const model_source_t *s, const model_tensor_t *t, FILE *f) {
  const size_t rb = kern_row_bytes(t->type, t->cols), cols = (size_t)t->cols;
  float *row = fr_malloc(cols * sizeof *row), *out = fr_malloc(cols * sizeof *out);
  uint8_t *bytes = fr_malloc(rb);
  int rc = 0;
  for (int64_t r = 0; r < t->rows && !rc; r++) {
    if ((rc = model_source_read(s, t, r, 1, 0, t->cols, bytes))) break;
    kern_dequantize_row(t->type, bytes, row, t->cols);
    for (size_t k = 0; k < cols; k++) out[t->perm ? (size_t)t->perm[k] : k] = row[k];
    if (fwrite(out, sizeof *out, cols, f) != cols) rc = -1;
  }
  free(bytes);
  free(row);
  free(out);
  return rc;
}

/* The part's rows, decoded in its own column order, then its perm to path.perm. */
static int dump_part(const model_quant_weight_t *q, FILE *f, const char *path) {
  const size_t rb = kern_row_bytes(KERN_I4G, q->cols), cols = (size_t)q->cols;
  float *row = fr_malloc(cols * sizeof *row);
  int rc = 0;
  for (int64_t r = 0; r < q->rows && !rc; r++) {
    kern_dequantize_row(KERN_I4G, q->data + (size_t)r * rb, row, q->cols);
    if (fwrite(row, sizeof *row, cols, f) != cols) rc = -1;
  }
  free(row);
  char pp[4096];
  snprintf(pp, sizeof pp, "%s.perm", path);
  FILE *pf = rc ? NULL : fopen(pp, "wb");
  for (size_t k = 0; pf && k < cols && !rc; k++) {
    int32_t v = q->perm ? q->perm[k] : (int32_t)k;
    if (fwrite(&v, sizeof v, 1, pf) != 1) rc = -1;
  }
  if (!pf || fclose(pf)) rc = -1;
  return rc;
}

/* Tensor t's part for inputs [c0, c0 + nc) to path. */
static int dump_cols(const model_source_t *s, const model_tensor_t *t, int64_t c0, int64_t nc, FILE *f,
                     const char *path) {
  if (t->type != KERN_I4G) return fr_errorf(FR_EUNSUPPORTED, "--cols needs an I4G tensor");
  uint8_t *rows = fr_malloc(kern_row_bytes(KERN_I4G, t->cols) * (size_t)t->rows);
  int rc = model_source_read(s, t, 0, t->rows, 0, t->cols, rows);
  const model_quant_weight_t whole = {.rows = t->rows, .cols = t->cols, .x_cols = t->cols, .data = rows,
                                      .perm = (int32_t *)t->perm};
  model_quant_weight_t q;
  if (!rc) rc = model_quant_cols(&whole, c0, nc, &q);
  free(rows);
  if (rc) return rc;
  rc = dump_part(&q, f, path);
  printf("%s I4G %lld %lld %lld\n", t->name, (long long)q.rows, (long long)q.cols, (long long)q.x_cols);
  free(q.data);
  free(q.perm);
  return rc;
}

/* Writes tensor name of s to path (nc > 0: its part for inputs [c0, c0 + nc)); prints its type and shape. */
static int dump_one(const model_source_t *s, const char *name, const char *path, int64_t c0, int64_t nc) {
  const model_tensor_t *t = model_source_tensor(s, name);
  FILE *f = t ? fopen(path, "wb") : NULL;
  int rc = t && f ? (nc > 0 ? dump_cols(s, t, c0, nc, f, path) : dump(s, t, f)) : -1;
  if (f && fclose(f)) rc = -1;
  if (rc) fprintf(stderr, "dump_weight: %s: no such tensor, or cannot write %s: %s\n", name, path, fr_last_error());
  else if (nc <= 0) printf("%s %s %lld %lld\n", name, kern_type_traits(t->type)->name, (long long)t->rows,
                           (long long)t->cols);
  return rc;
}

int main(int argc, char **argv) {
  int64_t c0 = 0, nc = 0;
  if (argc > 3 && !strcmp(argv[1], "--cols")) {
    c0 = strtoll(argv[2], NULL, 10), nc = strtoll(argv[3], NULL, 10);
    argc -= 3, argv += 3;
  }
  if (argc < 4 || argc % 2 || nc < 0) {
    fprintf(stderr, "usage: dump_weight [--cols C0 NC] MODEL GGUF_TENSOR_NAME OUT_FILE [NAME OUT_FILE ...]\n");
    return 2;
  }
  model_source_t *s;
  if (model_source_open(&s, argv[1])) {
    fprintf(stderr, "dump_weight: %s\n", fr_last_error());
    return 1;
  }
  int rc = 0;
  for (int i = 2; i + 1 < argc && !rc; i += 2) rc = dump_one(s, argv[i], argv[i + 1], c0, nc);
  model_source_close(s);
  return rc ? 1 : 0;
}
