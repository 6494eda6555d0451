/* gguf.h - GGUF v2/v3 reader over a read-only mmap of the file.
 *
 * model_gguf_open() validates the whole file up front: header, every
 * metadata key and value (types, counts and string lengths against the
 * bytes left), tensor infos (n_dims <= 4, ne > 0, overflow-checked sizes,
 * known types, ne[0] a multiple of the block size, aligned offsets,
 * data inside the file, no overlaps, no duplicate names or keys). After a
 * successful open every accessor is bounds-safe. A hostile or truncated
 * file gives FR_EFORMAT / FR_ETRUNCATED / FR_EUNSUPPORTED / FR_ETOOBIG with a
 * message in fr_last_error(), never a crash.
 *
 * Ownership: strings and arrays returned point into the mapping and are
 * borrowed until model_gguf_close(). Not thread-safe to close while in use;
 * reads are safe from any thread.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/kern_types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  GGUF_T_UINT8 = 0,
  GGUF_T_INT8 = 1,
  GGUF_T_UINT16 = 2,
  GGUF_T_INT16 = 3,
  GGUF_T_UINT32 = 4,
  GGUF_T_INT32 = 5,
  GGUF_T_FLOAT32 = 6,
  GGUF_T_BOOL = 7,
  GGUF_T_STRING = 8,
  GGUF_T_ARRAY = 9,
  GGUF_T_UINT64 = 10,
  GGUF_T_INT64 = 11,
  GGUF_T_FLOAT64 = 12,
} gguf_vtype_t;

/* A string inside the mapping: not NUL-terminated. */
typedef struct {
  const char *ptr;
  uint64_t len;
} gguf_str_t;

typedef struct {
  gguf_str_t key;
  gguf_vtype_t type;      /* value type */
  gguf_vtype_t arr_type;  /* element type when type == GGUF_T_ARRAY */
  uint64_t arr_count;     /* elements when type == GGUF_T_ARRAY */
  /* The value's bytes in the mapping: scalars at `value`; strings start
   * with their u64 length prefix; arrays: the first element. */
  const uint8_t *value;
  /* For string arrays: offsets of each element's u64 length prefix,
   * relative to `value` (arr_count entries), so access is O(1). */
  const uint64_t *str_offsets;
} gguf_kv_t;

typedef struct {
  gguf_str_t name;
  int n_dims;
  int64_t ne[4];       /* ne[0] varies fastest; unused dims are 1 */
  kern_type_t type;
  uint64_t offset;     /* relative to the data section */
  uint64_t bytes;      /* size of the tensor's data */
  const void *data;    /* pointer into the mapping */
} gguf_tensor_t;

typedef struct model_gguf {
  const uint8_t *map;  /* whole file */
  size_t size;
  int fd;              /* the file, open for reads (a tensor is at data - map); -1 for a memory image */
  uint32_t version;
  uint32_t alignment;
  uint64_t n_kv;
  gguf_kv_t *kv;       /* (n_kv) */
  uint64_t n_tensors;
  gguf_tensor_t *tensors; /* (n_tensors) */
  size_t data_offset;  /* start of the tensor data section in the file */
  void *priv;          /* implementation data (hash index) */
} model_gguf_t;

/* Opens and validates a GGUF file. On failure *out is NULL. */
int model_gguf_open(model_gguf_t **out, const char *path);

/* Same, over caller-owned bytes (used by the fuzz target and tests); the
 * bytes must outlive the returned object. */
int model_gguf_open_memory(model_gguf_t **out, const void *data, size_t size);

void model_gguf_close(model_gguf_t *g);

/* Key lookup; NULL when absent. */
const gguf_kv_t *model_gguf_find(const model_gguf_t *g, const char *key);

/* Typed getters. Each returns 0, or FR_ENOTFOUND when the key is absent,
 * or FR_EFORMAT when it has an incompatible type. Integer getters accept
 * any integer type whose value fits; float getters accept f32/f64. */
int model_gguf_get_i64(const model_gguf_t *g, const char *key, int64_t *out);
int model_gguf_get_f32(const model_gguf_t *g, const char *key, float *out);
int model_gguf_get_bool(const model_gguf_t *g, const char *key, bool *out);
int model_gguf_get_str(const model_gguf_t *g, const char *key, gguf_str_t *out);

/* Array element access (bounds-checked; FR_EFORMAT on type mismatch or
 * index out of range). */
int model_gguf_arr_str(const gguf_kv_t *kv, uint64_t i, gguf_str_t *out);
int model_gguf_arr_f32(const gguf_kv_t *kv, uint64_t i, float *out);
int model_gguf_arr_i64(const gguf_kv_t *kv, uint64_t i, int64_t *out);

/* Tensor lookup by name; NULL when absent. */
const gguf_tensor_t *model_gguf_tensor(const model_gguf_t *g, const char *name);

/* Name of a value type ("uint32"). */
const char *model_gguf_type_name(gguf_vtype_t t);

#ifdef __cplusplus
}
#endif
