/* safetensors.h - reader for Hugging Face safetensors files (mmap'd) and
 * sharded folders (model.safetensors.index.json).
 *
 * Validation on open: header length (<= 100 MB and inside the file), JSON
 * well-formed, every entry's dtype known, shape non-negative with an
 * overflow-checked byte count equal to its data_offsets span, offsets inside
 * the buffer, no overlaps, no duplicate names. Bad files give FR_EFORMAT /
 * FR_ETRUNCATED / FR_EUNSUPPORTED with a message, never a crash.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "kernels/kern_types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  ST_F32 = 0,
  ST_F16,
  ST_BF16,
  ST_OTHER, /* a valid dtype we do not load as a weight (I64, U8, F8, ...) */
} st_dtype_t;

typedef struct {
  char *name;          /* owned */
  st_dtype_t dtype;
  char dtype_name[12]; /* as in the file ("BF16") */
  int n_dims;
  int64_t shape[8];    /* row-major, shape[0] slowest (HF order) */
  const void *data;    /* pointer into the mapping */
  uint64_t bytes;
  int fd;              /* its file, open for reads; -1 for a memory image */
  uint64_t file_off;   /* where data starts in that file */
} st_tensor_t;

typedef struct model_st {
  size_t n_tensors;
  st_tensor_t *tensors; /* sorted by name */
  void *priv;           /* mappings of every shard */
} model_st_t;

/* Opens one .safetensors file, or a folder: its model.safetensors.index.json
 * (every shard listed in weight_map) or else its model.safetensors. */
int model_st_open(model_st_t **out, const char *path);

/* Parses one file image in memory (fuzzing, tests); bytes must outlive it. */
int model_st_open_memory(model_st_t **out, const void *data, size_t size);

void model_st_close(model_st_t *st);

/* Tensor by name, NULL when absent. */
const st_tensor_t *model_st_tensor(const model_st_t *st, const char *name);

#ifdef __cplusplus
}
#endif
