/* gguf.c - GGUF v2/v3 reader: validates the whole file on open, then serves
 * keys, arrays and tensors from the mapping through two hash indexes. */
#include "model/gguf.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fr_err.h"
#include "common/fr_hash.h"
#include "common/fr_util.h"
#include "model/file.h"

#define GGUF_MAX_KEY 65535u   /* keys are at most 65535 bytes */
#define GGUF_MAX_NAME 63u     /* tensor names: < 64 bytes, as ggml */
#define GGUF_MAX_DIMS 4
#define GGUF_DEFAULT_ALIGN 32u
#define GGUF_MAX_ALIGN (1u << 20)
#define GGUF_MIN_KV_BYTES 14u     /* u64 len + 1 key byte + u32 type + 1 value byte */
#define GGUF_MIN_TENSOR_BYTES 33u /* u64 len + 1 name byte + u32 + u64 ne + u32 + u64 */

/* Open-addressing index of names: slots hold (index + 1), 0 is empty. */
typedef struct {
  uint32_t *slots;
  uint64_t mask;
} gguf_idx_t;

typedef struct {
  bool mapped;        /* map came from mmap and is unmapped on close */
  gguf_idx_t kv_idx;  /* over kv[].key */
  gguf_idx_t t_idx;   /* over tensors[].name */
} gguf_priv_t;

/* A bounds-checked cursor over the file. */
typedef struct {
  const uint8_t *p;
  size_t size;
  size_t pos;
} gguf_rd_t;

/* ---- small readers ---------------------------------------------------- */

static int rd_need(const gguf_rd_t *r, uint64_t n, const char *what) {
  if (r->size - r->pos < n)
    return fr_errorf(FR_ETRUNCATED, "gguf: truncated at offset %zu reading %s (%llu bytes needed, %zu left)",
                     r->pos, what, (unsigned long long)n, r->size - r->pos);
  return 0;
}

static int rd_u32(gguf_rd_t *r, uint32_t *out, const char *what) {
  int rc = rd_need(r, 4, what);
  if (rc) return rc;
  memcpy(out, r->p + r->pos, 4);
  r->pos += 4;
  return 0;
}

static int rd_u64(gguf_rd_t *r, uint64_t *out, const char *what) {
  int rc = rd_need(r, 8, what);
  if (rc) return rc;
  memcpy(out, r->p + r->pos, 8);
  r->pos += 8;
  return 0;
}

/* Reads a u64-prefixed string of at most max_len bytes. */
static int rd_str(gguf_rd_t *r, gguf_str_t *s, uint64_t max_len, const char *what) {
  uint64_t len;
  int rc = rd_u64(r, &len, what);
  if (rc) return rc;
  if (len > max_len)
    return fr_errorf(FR_EFORMAT, "gguf: %s at offset %zu is %llu bytes long (limit %llu)", what,
                     r->pos - 8, (unsigned long long)len, (unsigned long long)max_len);
  if ((rc = rd_need(r, len, what))) return rc;
  s->ptr = (const char *)r->p + r->pos;
  s->len = len;
  r->pos += len;
  return 0;
}

/* ---- value types ------------------------------------------------------ */

static const char *const gguf_type_names[] = {
    "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
    "bool", "string", "array", "uint64", "int64", "float64",
};

const char *model_gguf_type_name(gguf_vtype_t t) {
  if ((unsigned)t < FR_ARRAY_SIZE(gguf_type_names)) return gguf_type_names[t];
  return "unknown";
}

/* Bytes of a fixed-size value type; 0 for string/array/unknown. */
static size_t vtype_size(uint32_t t) {
  switch (t) {
  case GGUF_T_UINT8: case GGUF_T_INT8: case GGUF_T_BOOL: return 1;
  case GGUF_T_UINT16: case GGUF_T_INT16: return 2;
  case GGUF_T_UINT32: case GGUF_T_INT32: case GGUF_T_FLOAT32: return 4;
  case GGUF_T_UINT64: case GGUF_T_INT64: case GGUF_T_FLOAT64: return 8;
  default: return 0;
  }
}

static bool vtype_is_int(uint32_t t) {
  return t <= GGUF_T_INT32 || t == GGUF_T_UINT64 || t == GGUF_T_INT64;
}

/* Reads an integer of type t at p; FR_EFORMAT when a u64 exceeds INT64_MAX. */
static int load_int(uint32_t t, const uint8_t *p, int64_t *out) {
  switch (t) {
  case GGUF_T_UINT8: *out = p[0]; return 0;
  case GGUF_T_INT8: *out = (int8_t)p[0]; return 0;
  case GGUF_T_UINT16: { uint16_t v; memcpy(&v, p, 2); *out = v; return 0; }
  case GGUF_T_INT16: { int16_t v; memcpy(&v, p, 2); *out = v; return 0; }
  case GGUF_T_UINT32: { uint32_t v; memcpy(&v, p, 4); *out = v; return 0; }
  case GGUF_T_INT32: { int32_t v; memcpy(&v, p, 4); *out = v; return 0; }
  case GGUF_T_INT64: memcpy(out, p, 8); return 0;
  case GGUF_T_UINT64: {
    uint64_t v;
    memcpy(&v, p, 8);
    if (v > (uint64_t)INT64_MAX) return FR_EFORMAT;
    *out = (int64_t)v;
    return 0;
  }
  default: return FR_EFORMAT;
  }
}

static int load_float(uint32_t t, const uint8_t *p, float *out) {
  if (t == GGUF_T_FLOAT32) { memcpy(out, p, 4); return 0; }
  if (t == GGUF_T_FLOAT64) { double d; memcpy(&d, p, 8); *out = (float)d; return 0; }
  return FR_EFORMAT;
}

/* ---- hash index ------------------------------------------------------- */

typedef const gguf_str_t *(*gguf_name_fn)(const model_gguf_t *g, uint64_t i);

static const gguf_str_t *kv_name(const model_gguf_t *g, uint64_t i) { return &g->kv[i].key; }
static const gguf_str_t *tensor_name(const model_gguf_t *g, uint64_t i) { return &g->tensors[i].name; }

static void idx_init(gguf_idx_t *idx, uint64_t n) {
  uint64_t cap = 16;
  while (cap < 2 * n) cap <<= 1;
  idx->slots = fr_calloc(cap, sizeof *idx->slots);
  idx->mask = cap - 1;
}

/* Returns the slot holding name, or the empty slot where it would go. */
static uint64_t idx_probe(const gguf_idx_t *idx, const model_gguf_t *g, gguf_name_fn name_at,
                          const char *name, size_t len) {
  uint64_t h = fr_hash64(name, len, 0) & idx->mask;
  for (;; h = (h + 1) & idx->mask) {
    uint32_t s = idx->slots[h];
    if (s == 0) return h;
    const gguf_str_t *n = name_at(g, s - 1);
    if (n->len == len && memcmp(n->ptr, name, len) == 0) return h;
  }
}

/* Adds entry i; returns false when its name is already present. */
static bool idx_insert(gguf_idx_t *idx, const model_gguf_t *g, gguf_name_fn name_at, uint64_t i) {
  const gguf_str_t *n = name_at(g, i);
  uint64_t h = idx_probe(idx, g, name_at, n->ptr, n->len);
  if (idx->slots[h]) return false;
  idx->slots[h] = (uint32_t)(i + 1);
  return true;
}

static int64_t idx_find(const gguf_idx_t *idx, const model_gguf_t *g, gguf_name_fn name_at,
                        const char *name) {
  if (!idx->slots) return -1;
  uint64_t h = idx_probe(idx, g, name_at, name, strlen(name));
  return idx->slots[h] ? (int64_t)idx->slots[h] - 1 : -1;
}

/* ---- metadata --------------------------------------------------------- */

/* Reads the elements of a string array, recording each one's offset. */
static int parse_str_array(gguf_rd_t *r, gguf_kv_t *kv) {
  if (kv->arr_count > (r->size - r->pos) / 8)
    return fr_errorf(FR_EFORMAT, "gguf: key %.*s: string array of %llu elements exceeds the file",
                     (int)FR_MIN(kv->key.len, 64), kv->key.ptr, (unsigned long long)kv->arr_count);
  uint64_t *offs = fr_malloc(FR_MAX(kv->arr_count, 1) * sizeof *offs);
  kv->str_offsets = offs;
  for (uint64_t i = 0; i < kv->arr_count; i++) {
    gguf_str_t s;
    offs[i] = r->pos - (size_t)(kv->value - r->p);
    int rc = rd_str(r, &s, UINT64_MAX, "string array element");
    if (rc) return rc;
  }
  return 0;
}

/* Reads a fixed-size array; bool elements must be 0 or 1. */
static int parse_fixed_array(gguf_rd_t *r, gguf_kv_t *kv, size_t esize) {
  if (kv->arr_count > (r->size - r->pos) / esize)
    return fr_errorf(FR_ETRUNCATED, "gguf: key %.*s: array of %llu %s elements exceeds the file",
                     (int)FR_MIN(kv->key.len, 64), kv->key.ptr, (unsigned long long)kv->arr_count,
                     model_gguf_type_name(kv->arr_type));
  if (kv->arr_type == GGUF_T_BOOL) {
    for (uint64_t i = 0; i < kv->arr_count; i++)
      if (kv->value[i] > 1)
        return fr_errorf(FR_EFORMAT, "gguf: key %.*s: bool element %llu is %u",
                         (int)FR_MIN(kv->key.len, 64), kv->key.ptr, (unsigned long long)i, kv->value[i]);
  }
  r->pos += kv->arr_count * esize;
  return 0;
}

static int parse_array(gguf_rd_t *r, gguf_kv_t *kv) {
  uint32_t et;
  int rc = rd_u32(r, &et, "array element type");
  if (rc) return rc;
  if (et == GGUF_T_ARRAY)
    return fr_errorf(FR_EUNSUPPORTED, "gguf: key %.*s: nested arrays are not supported",
                     (int)FR_MIN(kv->key.len, 64), kv->key.ptr);
  if (et > GGUF_T_FLOAT64)
    return fr_errorf(FR_EFORMAT, "gguf: key %.*s: unknown array element type %u",
                     (int)FR_MIN(kv->key.len, 64), kv->key.ptr, et);
  kv->arr_type = (gguf_vtype_t)et;
  if ((rc = rd_u64(r, &kv->arr_count, "array count"))) return rc;
  kv->value = r->p + r->pos;
  if (et == GGUF_T_STRING) return parse_str_array(r, kv);
  return parse_fixed_array(r, kv, vtype_size(et));
}

/* Reads one value of kv->type at the cursor. */
static int parse_value(gguf_rd_t *r, gguf_kv_t *kv) {
  int rc;
  if (kv->type == GGUF_T_ARRAY) return parse_array(r, kv);
  kv->value = r->p + r->pos;
  if (kv->type == GGUF_T_STRING) {
    gguf_str_t s;
    return rd_str(r, &s, UINT64_MAX, "string value");
  }
  size_t n = vtype_size(kv->type);
  if ((rc = rd_need(r, n, "value"))) return rc;
  if (kv->type == GGUF_T_BOOL && kv->value[0] > 1)
    return fr_errorf(FR_EFORMAT, "gguf: key %.*s: bool value is %u", (int)FR_MIN(kv->key.len, 64),
                     kv->key.ptr, kv->value[0]);
  r->pos += n;
  return 0;
}

static int parse_kv(gguf_rd_t *r, gguf_kv_t *kv) {
  uint32_t t;
  int rc = rd_str(r, &kv->key, GGUF_MAX_KEY, "key");
  if (rc) return rc;
  if (kv->key.len == 0) return fr_errorf(FR_EFORMAT, "gguf: empty key at offset %zu", r->pos - 8);
  if ((rc = rd_u32(r, &t, "value type"))) return rc;
  if (t > GGUF_T_FLOAT64)
    return fr_errorf(FR_EFORMAT, "gguf: key %.*s: unknown value type %u", (int)FR_MIN(kv->key.len, 64),
                     kv->key.ptr, t);
  kv->type = (gguf_vtype_t)t;
  return parse_value(r, kv);
}

static int parse_kvs(gguf_rd_t *r, model_gguf_t *g, gguf_priv_t *pv) {
  if (g->n_kv > (r->size - r->pos) / GGUF_MIN_KV_BYTES)
    return fr_errorf(FR_EFORMAT, "gguf: kv count %llu exceeds what the file can hold",
                     (unsigned long long)g->n_kv);
  if (g->n_kv >= UINT32_MAX) return fr_errorf(FR_ETOOBIG, "gguf: too many keys");
  g->kv = fr_calloc(FR_MAX(g->n_kv, 1), sizeof *g->kv);
  idx_init(&pv->kv_idx, g->n_kv);
  for (uint64_t i = 0; i < g->n_kv; i++) {
    int rc = parse_kv(r, &g->kv[i]);
    if (rc) return rc;
    if (!idx_insert(&pv->kv_idx, g, kv_name, i))
      return fr_errorf(FR_EFORMAT, "gguf: duplicate key %.*s", (int)FR_MIN(g->kv[i].key.len, 64),
                       g->kv[i].key.ptr);
  }
  return 0;
}

/* Known keys whose type we rely on: a wrong type is a format error. */
typedef struct {
  const char *key;
  gguf_vtype_t type;
  int arr_type; /* -1: not an array, -2: any integer */
} gguf_known_key_t;

static const gguf_known_key_t gguf_known_keys[] = {
    {"general.alignment", GGUF_T_UINT32, -1},
    {"general.architecture", GGUF_T_STRING, -1},
    {"general.name", GGUF_T_STRING, -1},
    {"tokenizer.ggml.model", GGUF_T_STRING, -1},
    {"tokenizer.ggml.pre", GGUF_T_STRING, -1},
    {"tokenizer.chat_template", GGUF_T_STRING, -1},
    {"tokenizer.ggml.tokens", GGUF_T_ARRAY, GGUF_T_STRING},
    {"tokenizer.ggml.merges", GGUF_T_ARRAY, GGUF_T_STRING},
    {"tokenizer.ggml.scores", GGUF_T_ARRAY, GGUF_T_FLOAT32},
    {"tokenizer.ggml.token_type", GGUF_T_ARRAY, -2},
};

static int check_known_keys(const model_gguf_t *g) {
  for (size_t i = 0; i < FR_ARRAY_SIZE(gguf_known_keys); i++) {
    const gguf_known_key_t *k = &gguf_known_keys[i];
    const gguf_kv_t *kv = model_gguf_find(g, k->key);
    if (!kv) continue;
    bool ok = kv->type == k->type;
    if (ok && k->arr_type == -2) ok = vtype_is_int(kv->arr_type);
    else if (ok && k->arr_type >= 0) ok = (int)kv->arr_type == k->arr_type;
    if (!ok)
      return fr_errorf(FR_EFORMAT, "gguf: key %s has type %s%s%s, expected %s", k->key,
                       model_gguf_type_name(kv->type), kv->type == GGUF_T_ARRAY ? " of " : "",
                       kv->type == GGUF_T_ARRAY ? model_gguf_type_name(kv->arr_type) : "",
                       model_gguf_type_name(k->type));
  }
  return 0;
}

static int read_alignment(model_gguf_t *g) {
  const gguf_kv_t *kv = model_gguf_find(g, "general.alignment");
  g->alignment = GGUF_DEFAULT_ALIGN;
  if (!kv) return 0;
  uint32_t a;
  memcpy(&a, kv->value, 4);
  if (a < 8 || a > GGUF_MAX_ALIGN || (a & (a - 1)))
    return fr_errorf(FR_EFORMAT, "gguf: general.alignment %u is not a power of two in [8, %u]", a,
                     GGUF_MAX_ALIGN);
  g->alignment = a;
  return 0;
}

/* ---- tensor infos ----------------------------------------------------- */

/* The tensor types a GGUF file may carry for us (kern_type_t = ggml ids). */
static bool tensor_type_ok(uint32_t t) {
  switch (t) {
  case KERN_F32: case KERN_F16: case KERN_BF16: case KERN_Q8_0: case KERN_Q4_0: case KERN_Q4_1:
  case KERN_Q5_0: case KERN_Q5_1: case KERN_Q4_K: case KERN_Q5_K: case KERN_Q6_K:
    return true;
  default:
    return false;
  }
}

static int parse_dims(gguf_rd_t *r, gguf_tensor_t *t) {
  uint32_t nd;
  int64_t nel = 1;
  int rc = rd_u32(r, &nd, "tensor n_dims");
  if (rc) return rc;
  if (nd < 1 || nd > GGUF_MAX_DIMS)
    return fr_errorf(FR_EFORMAT, "gguf: tensor %.*s: n_dims %u (must be 1..4)", (int)t->name.len,
                     t->name.ptr, nd);
  t->n_dims = (int)nd;
  for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
  for (uint32_t d = 0; d < nd; d++) {
    uint64_t ne;
    if ((rc = rd_u64(r, &ne, "tensor ne"))) return rc;
    if (ne == 0 || ne > (uint64_t)INT64_MAX)
      return fr_errorf(FR_EFORMAT, "gguf: tensor %.*s: ne[%u] = %lld (must be > 0)", (int)t->name.len,
                       t->name.ptr, d, (long long)ne);
    t->ne[d] = (int64_t)ne;
    if (__builtin_mul_overflow(nel, t->ne[d], &nel))
      return fr_errorf(FR_EFORMAT, "gguf: tensor %.*s: element count overflows", (int)t->name.len,
                       t->name.ptr);
  }
  return 0;
}

static int parse_tensor_info(gguf_rd_t *r, gguf_tensor_t *t) {
  uint32_t type;
  int rc = rd_str(r, &t->name, GGUF_MAX_NAME, "tensor name");
  if (rc) return rc;
  if (t->name.len == 0) return fr_errorf(FR_EFORMAT, "gguf: empty tensor name at offset %zu", r->pos - 8);
  if ((rc = parse_dims(r, t))) return rc;
  if ((rc = rd_u32(r, &type, "tensor type"))) return rc;
  if (!tensor_type_ok(type) || !kern_type_traits((int)type))
    return fr_errorf(FR_EUNSUPPORTED, "gguf: tensor %.*s: unsupported tensor type %u", (int)t->name.len,
                     t->name.ptr, type);
  t->type = (kern_type_t)type;
  return rd_u64(r, &t->offset, "tensor offset");
}

/* Size of a tensor's data, overflow-checked; ne[0] must fill whole blocks. */
static int tensor_bytes(gguf_tensor_t *t) {
  const kern_type_traits_t *tr = kern_type_traits(t->type);
  uint64_t b;
  if (t->ne[0] % tr->blck)
    return fr_errorf(FR_EFORMAT, "gguf: tensor %.*s: ne[0] = %lld is not a multiple of the %s block size %d",
                     (int)t->name.len, t->name.ptr, (long long)t->ne[0], tr->name, tr->blck);
  b = (uint64_t)(t->ne[0] / tr->blck);
  bool ovf = __builtin_mul_overflow(b, (uint64_t)tr->size, &b);
  for (int d = 1; d < GGUF_MAX_DIMS; d++) ovf |= __builtin_mul_overflow(b, (uint64_t)t->ne[d], &b);
  if (ovf)
    return fr_errorf(FR_EFORMAT, "gguf: tensor %.*s: byte size overflows", (int)t->name.len, t->name.ptr);
  t->bytes = b;
  return 0;
}

/* Places a tensor in the data section: aligned, inside the file. */
static int place_tensor(model_gguf_t *g, gguf_tensor_t *t) {
  uint64_t end;
  int rc = tensor_bytes(t);
  if (rc) return rc;
  if (t->offset % g->alignment)
    return fr_errorf(FR_EFORMAT, "gguf: tensor %.*s: offset %llu is not aligned to %u", (int)t->name.len,
                     t->name.ptr, (unsigned long long)t->offset, g->alignment);
  if (__builtin_add_overflow((uint64_t)g->data_offset, t->offset, &end) ||
      __builtin_add_overflow(end, t->bytes, &end) || end > g->size)
    return fr_errorf(FR_ETRUNCATED, "gguf: tensor %.*s: data [%llu, +%llu) lies past the end of the file (%zu bytes)",
                     (int)t->name.len, t->name.ptr, (unsigned long long)t->offset,
                     (unsigned long long)t->bytes, g->size);
  t->data = g->map + g->data_offset + t->offset;
  return 0;
}

static int cmp_by_offset(const void *a, const void *b) {
  const gguf_tensor_t *x = *(const gguf_tensor_t *const *)a, *y = *(const gguf_tensor_t *const *)b;
  return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static int check_overlaps(model_gguf_t *g) {
  int rc = 0;
  gguf_tensor_t **order = fr_malloc(FR_MAX(g->n_tensors, 1) * sizeof *order);
  for (uint64_t i = 0; i < g->n_tensors; i++) order[i] = &g->tensors[i];
  qsort(order, g->n_tensors, sizeof *order, cmp_by_offset);
  for (uint64_t i = 1; i < g->n_tensors && !rc; i++) {
    const gguf_tensor_t *a = order[i - 1], *b = order[i];
    if (a->offset + a->bytes > b->offset) /* both end inside the file: no overflow */
      rc = fr_errorf(FR_EFORMAT, "gguf: tensors %.*s and %.*s overlap", (int)a->name.len, a->name.ptr,
                     (int)b->name.len, b->name.ptr);
  }
  free(order);
  return rc;
}

static int parse_tensors(gguf_rd_t *r, model_gguf_t *g, gguf_priv_t *pv) {
  int rc;
  if (g->n_tensors > (r->size - r->pos) / GGUF_MIN_TENSOR_BYTES)
    return fr_errorf(FR_EFORMAT, "gguf: tensor count %llu exceeds what the file can hold",
                     (unsigned long long)g->n_tensors);
  if (g->n_tensors >= UINT32_MAX) return fr_errorf(FR_ETOOBIG, "gguf: too many tensors");
  g->tensors = fr_calloc(FR_MAX(g->n_tensors, 1), sizeof *g->tensors);
  idx_init(&pv->t_idx, g->n_tensors);
  for (uint64_t i = 0; i < g->n_tensors; i++) {
    if ((rc = parse_tensor_info(r, &g->tensors[i]))) return rc;
    if (!idx_insert(&pv->t_idx, g, tensor_name, i))
      return fr_errorf(FR_EFORMAT, "gguf: duplicate tensor %.*s", (int)g->tensors[i].name.len,
                       g->tensors[i].name.ptr);
  }
  uint64_t pad = (g->alignment - r->pos % g->alignment) % g->alignment;
  g->data_offset = (size_t)FR_MIN((uint64_t)r->pos + pad, (uint64_t)g->size);
  if (g->n_tensors && r->pos + pad > g->size)
    return fr_errorf(FR_ETRUNCATED, "gguf: data section starts past the end of the file");
  for (uint64_t i = 0; i < g->n_tensors; i++)
    if ((rc = place_tensor(g, &g->tensors[i]))) return rc;
  return check_overlaps(g);
}

/* ---- open / close ----------------------------------------------------- */

static int parse_header(gguf_rd_t *r, model_gguf_t *g) {
  uint32_t magic;
  int rc = rd_u32(r, &magic, "magic");
  if (rc) return rc;
  if (memcmp(r->p, "GGUF", 4) != 0) return fr_errorf(FR_EFORMAT, "gguf: bad magic (not a GGUF file)");
  if ((rc = rd_u32(r, &g->version, "version"))) return rc;
  if ((g->version & 0xFFFF) == 0)
    return fr_errorf(FR_EUNSUPPORTED, "gguf: big-endian files are not supported (version 0x%08x)", g->version);
  if (g->version != 2 && g->version != 3)
    return fr_errorf(FR_EVERSION, "gguf: version %u is not supported (2 and 3 are)", g->version);
  if ((rc = rd_u64(r, &g->n_tensors, "tensor count"))) return rc;
  return rd_u64(r, &g->n_kv, "kv count");
}

static int parse_all(model_gguf_t *g, gguf_priv_t *pv) {
  gguf_rd_t r = {.p = g->map, .size = g->size, .pos = 0};
  int rc = parse_header(&r, g);
  if (!rc) rc = parse_kvs(&r, g, pv);
  if (!rc) rc = check_known_keys(g);
  if (!rc) rc = read_alignment(g);
  if (!rc) rc = parse_tensors(&r, g, pv);
  return rc;
}

int model_gguf_open_memory(model_gguf_t **out, const void *data, size_t size) {
  *out = NULL;
  model_gguf_t *g = fr_calloc(1, sizeof *g);
  gguf_priv_t *pv = fr_calloc(1, sizeof *pv);
  g->priv = pv;
  g->map = data;
  g->size = size;
  g->fd = -1;
  int rc = data ? parse_all(g, pv) : fr_errorf(FR_ETRUNCATED, "gguf: empty input");
  if (rc) {
    model_gguf_close(g);
    return rc;
  }
  *out = g;
  return 0;
}

/* Maps the file; *fd_out keeps it open (for weight reads), -1 on failure. */
static int map_file(const char *path, const uint8_t **map, size_t *size, int *fd_out) {
  struct stat st;
  int fd, rc = model__path_open("gguf", path, MODEL_PATH_FILE, &fd, &st);
  *fd_out = -1;
  if (rc) return rc;
  if (st.st_size < 24) {
    rc = fr_errorf(FR_ETRUNCATED, "gguf: %s is too short (%lld bytes) for a GGUF header", path,
                   (long long)st.st_size);
  } else {
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) rc = fr_errorf(-errno, "gguf: cannot map %s: %s", path, strerror(errno));
    else { *map = p; *size = (size_t)st.st_size; }
  }
  if (rc) close(fd);
  else *fd_out = fd;
  return rc;
}

int model_gguf_open(model_gguf_t **out, const char *path) {
  const uint8_t *map = NULL;
  size_t size = 0;
  int fd;
  *out = NULL;
  int rc = map_file(path, &map, &size, &fd);
  if (rc) return rc;
  if ((rc = model_gguf_open_memory(out, map, size))) {
    munmap((void *)map, size);
    close(fd);
    return rc;
  }
  ((gguf_priv_t *)(*out)->priv)->mapped = true;
  (*out)->fd = fd;
  return 0;
}

void model_gguf_close(model_gguf_t *g) {
  if (!g) return;
  gguf_priv_t *pv = g->priv;
  if (g->kv)
    for (uint64_t i = 0; i < g->n_kv; i++) free((void *)g->kv[i].str_offsets);
  free(g->kv);
  free(g->tensors);
  if (pv) {
    free(pv->kv_idx.slots);
    free(pv->t_idx.slots);
    if (pv->mapped) munmap((void *)g->map, g->size);
    free(pv);
  }
  if (g->fd >= 0) close(g->fd);
  free(g);
}

/* ---- lookups and getters ---------------------------------------------- */

const gguf_kv_t *model_gguf_find(const model_gguf_t *g, const char *key) {
  const gguf_priv_t *pv = g->priv;
  int64_t i = idx_find(&pv->kv_idx, g, kv_name, key);
  return i < 0 ? NULL : &g->kv[i];
}

const gguf_tensor_t *model_gguf_tensor(const model_gguf_t *g, const char *name) {
  const gguf_priv_t *pv = g->priv;
  int64_t i = idx_find(&pv->t_idx, g, tensor_name, name);
  return i < 0 ? NULL : &g->tensors[i];
}

static int type_err(const gguf_kv_t *kv, const char *want) {
  return fr_errorf(FR_EFORMAT, "gguf: key %.*s has type %s, expected %s", (int)FR_MIN(kv->key.len, 64),
                   kv->key.ptr, model_gguf_type_name(kv->type), want);
}

int model_gguf_get_i64(const model_gguf_t *g, const char *key, int64_t *out) {
  const gguf_kv_t *kv = model_gguf_find(g, key);
  if (!kv) return FR_ENOTFOUND;
  if (!vtype_is_int(kv->type) || load_int(kv->type, kv->value, out)) return type_err(kv, "an integer");
  return 0;
}

int model_gguf_get_f32(const model_gguf_t *g, const char *key, float *out) {
  const gguf_kv_t *kv = model_gguf_find(g, key);
  if (!kv) return FR_ENOTFOUND;
  if (load_float(kv->type, kv->value, out)) return type_err(kv, "a float");
  return 0;
}

int model_gguf_get_bool(const model_gguf_t *g, const char *key, bool *out) {
  const gguf_kv_t *kv = model_gguf_find(g, key);
  if (!kv) return FR_ENOTFOUND;
  if (kv->type != GGUF_T_BOOL) return type_err(kv, "bool");
  *out = kv->value[0] != 0;
  return 0;
}

int model_gguf_get_str(const model_gguf_t *g, const char *key, gguf_str_t *out) {
  const gguf_kv_t *kv = model_gguf_find(g, key);
  if (!kv) return FR_ENOTFOUND;
  if (kv->type != GGUF_T_STRING) return type_err(kv, "string");
  memcpy(&out->len, kv->value, 8);
  out->ptr = (const char *)kv->value + 8;
  return 0;
}

static int arr_check(const gguf_kv_t *kv, uint64_t i, bool type_ok) {
  if (kv->type != GGUF_T_ARRAY || !type_ok)
    return fr_errorf(FR_EFORMAT, "gguf: key %.*s: not an array of the requested type",
                     (int)FR_MIN(kv->key.len, 64), kv->key.ptr);
  if (i >= kv->arr_count)
    return fr_errorf(FR_EFORMAT, "gguf: key %.*s: index %llu out of range (%llu elements)",
                     (int)FR_MIN(kv->key.len, 64), kv->key.ptr, (unsigned long long)i,
                     (unsigned long long)kv->arr_count);
  return 0;
}

int model_gguf_arr_str(const gguf_kv_t *kv, uint64_t i, gguf_str_t *out) {
  int rc = arr_check(kv, i, kv->arr_type == GGUF_T_STRING && kv->str_offsets);
  if (rc) return rc;
  const uint8_t *p = kv->value + kv->str_offsets[i];
  memcpy(&out->len, p, 8);
  out->ptr = (const char *)p + 8;
  return 0;
}

int model_gguf_arr_f32(const gguf_kv_t *kv, uint64_t i, float *out) {
  bool ok = kv->arr_type == GGUF_T_FLOAT32 || kv->arr_type == GGUF_T_FLOAT64;
  int rc = arr_check(kv, i, ok);
  if (rc) return rc;
  return load_float(kv->arr_type, kv->value + i * vtype_size(kv->arr_type), out);
}

int model_gguf_arr_i64(const gguf_kv_t *kv, uint64_t i, int64_t *out) {
  int rc = arr_check(kv, i, vtype_is_int(kv->arr_type));
  if (rc) return rc;
  if (load_int(kv->arr_type, kv->value + i * vtype_size(kv->arr_type), out))
    return fr_errorf(FR_EFORMAT, "gguf: key %.*s: element %llu does not fit int64",
                     (int)FR_MIN(kv->key.len, 64), kv->key.ptr, (unsigned long long)i);
  return 0;
}
