/* safetensors.c - safetensors reader: one mmap per shard, the JSON header
 * parsed with jansson, every entry checked against its file. */
#include "model/safetensors.h"

#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fr_err.h"
#include "common/fr_log.h"
#include "common/fr_util.h"
#include "model/file.h"

#define ST_MAX_HEADER (100u * 1000u * 1000u) /* the reference reader's cap */
#define ST_MAX_INDEX (100u * 1000u * 1000u)
#define ST_MAX_DIMS 8

typedef struct {
  const uint8_t *map;
  size_t size;
  bool mapped; /* unmapped on close */
  int fd;      /* open for weight reads, closed on close; -1 if none */
} st_shard_t;

typedef struct {
  size_t n_shards;
  st_shard_t *shards;
  size_t cap_tensors; /* allocated entries of model_st_t.tensors */
} st_priv_t;

/* ---- dtypes ----------------------------------------------------------- */

typedef struct {
  const char *name;
  int size;
  st_dtype_t dtype;
} st_dtype_info_t;

static const st_dtype_info_t st_dtypes[] = {
    {"F32", 4, ST_F32},      {"F16", 2, ST_F16},      {"BF16", 2, ST_BF16},
    {"BOOL", 1, ST_OTHER},   {"U8", 1, ST_OTHER},     {"I8", 1, ST_OTHER},
    {"I16", 2, ST_OTHER},    {"U16", 2, ST_OTHER},    {"I32", 4, ST_OTHER},
    {"U32", 4, ST_OTHER},    {"F64", 8, ST_OTHER},    {"I64", 8, ST_OTHER},
    {"U64", 8, ST_OTHER},    {"F8_E4M3", 1, ST_OTHER}, {"F8_E5M2", 1, ST_OTHER},
    {"F8_E8M0", 1, ST_OTHER},
};

static const st_dtype_info_t *dtype_find(const char *name) {
  for (size_t i = 0; i < FR_ARRAY_SIZE(st_dtypes); i++)
    if (strcmp(st_dtypes[i].name, name) == 0) return &st_dtypes[i];
  return NULL;
}

/* ---- one header entry ------------------------------------------------- */

/* Reads "shape" into t and returns the element count in *nel. */
static int parse_shape(const char *name, json_t *shape, st_tensor_t *t, uint64_t *nel) {
  if (!json_is_array(shape))
    return fr_errorf(FR_EFORMAT, "safetensors: tensor %s: shape is not an array", name);
  size_t nd = json_array_size(shape);
  if (nd > ST_MAX_DIMS)
    return fr_errorf(FR_EUNSUPPORTED, "safetensors: tensor %s: %zu dims (at most %d)", name, nd, ST_MAX_DIMS);
  *nel = 1;
  t->n_dims = (int)nd;
  for (size_t d = 0; d < nd; d++) {
    json_t *v = json_array_get(shape, d);
    if (!json_is_integer(v) || json_integer_value(v) < 0)
      return fr_errorf(FR_EFORMAT, "safetensors: tensor %s: shape[%zu] is not a non-negative integer", name, d);
    t->shape[d] = json_integer_value(v);
    if (__builtin_mul_overflow(*nel, (uint64_t)t->shape[d], nel))
      return fr_errorf(FR_EFORMAT, "safetensors: tensor %s: element count overflows", name);
  }
  return 0;
}

static int parse_offsets(const char *name, json_t *offs, uint64_t *begin, uint64_t *end) {
  json_t *b = json_array_get(offs, 0), *e = json_array_get(offs, 1);
  if (!json_is_array(offs) || json_array_size(offs) != 2 || !json_is_integer(b) || !json_is_integer(e) ||
      json_integer_value(b) < 0 || json_integer_value(e) < json_integer_value(b))
    return fr_errorf(FR_EFORMAT, "safetensors: tensor %s: data_offsets must be [begin, end] with 0 <= begin <= end",
                     name);
  *begin = (uint64_t)json_integer_value(b);
  *end = (uint64_t)json_integer_value(e);
  return 0;
}

/* Fills t from one header entry; buf is the data buffer (buf_size bytes). */
static int parse_entry(const char *name, json_t *e, const uint8_t *buf, uint64_t buf_size, st_tensor_t *t,
                       uint64_t *begin, uint64_t *end) {
  json_t *dt = json_object_get(e, "dtype");
  uint64_t nel = 0, bytes = 0;
  int rc;
  if (!json_is_object(e)) return fr_errorf(FR_EFORMAT, "safetensors: entry %s is not an object", name);
  if (!json_is_string(dt)) return fr_errorf(FR_EFORMAT, "safetensors: tensor %s: dtype missing", name);
  const st_dtype_info_t *di = dtype_find(json_string_value(dt));
  if (!di)
    return fr_errorf(FR_EUNSUPPORTED, "safetensors: tensor %s: unknown dtype %.16s", name, json_string_value(dt));
  t->dtype = di->dtype;
  snprintf(t->dtype_name, sizeof t->dtype_name, "%s", di->name);
  if ((rc = parse_shape(name, json_object_get(e, "shape"), t, &nel))) return rc;
  if ((rc = parse_offsets(name, json_object_get(e, "data_offsets"), begin, end))) return rc;
  if (__builtin_mul_overflow(nel, (uint64_t)di->size, &bytes) || bytes != *end - *begin)
    return fr_errorf(FR_EFORMAT, "safetensors: tensor %s: shape x %s needs %llu bytes, data_offsets span %llu",
                     name, di->name, (unsigned long long)(nel * (uint64_t)di->size),
                     (unsigned long long)(*end - *begin));
  if (*end > buf_size)
    return fr_errorf(FR_ETRUNCATED, "safetensors: tensor %s: data [%llu, %llu) past the buffer end %llu", name,
                     (unsigned long long)*begin, (unsigned long long)*end, (unsigned long long)buf_size);
  t->bytes = bytes;
  t->data = buf + *begin;
  t->fd = -1;
  t->file_off = 0;
  t->name = fr_strdup(name);
  return 0;
}

/* ---- buffer coverage -------------------------------------------------- */

typedef struct {
  uint64_t begin, end;
  const char *name;
} st_span_t;

static int cmp_span(const void *a, const void *b) {
  const st_span_t *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return x->end < y->end ? -1 : x->end > y->end;
}

/* The entries must tile the buffer exactly: no gap, no overlap. */
static int check_coverage(st_span_t *spans, size_t n, uint64_t buf_size) {
  uint64_t at = 0;
  qsort(spans, n, sizeof *spans, cmp_span);
  for (size_t i = 0; i < n; i++) {
    if (spans[i].begin < at)
      return fr_errorf(FR_EFORMAT, "safetensors: tensor %s overlaps the tensor before it", spans[i].name);
    if (spans[i].begin > at)
      return fr_errorf(FR_EFORMAT, "safetensors: gap in the buffer before tensor %s (bytes %llu..%llu)",
                       spans[i].name, (unsigned long long)at, (unsigned long long)spans[i].begin);
    at = spans[i].end;
  }
  if (at != buf_size)
    return fr_errorf(FR_EFORMAT, "safetensors: tensors cover %llu of the buffer's %llu bytes",
                     (unsigned long long)at, (unsigned long long)buf_size);
  return 0;
}

/* ---- one file --------------------------------------------------------- */

static int check_metadata(json_t *md) {
  const char *k;
  json_t *v;
  if (!json_is_object(md)) return fr_errorf(FR_EFORMAT, "safetensors: __metadata__ is not an object");
  json_object_foreach(md, k, v) {
    if (!json_is_string(v)) return fr_errorf(FR_EFORMAT, "safetensors: __metadata__.%.64s is not a string", k);
  }
  return 0;
}

static void reserve_tensors(model_st_t *st, st_priv_t *pv, size_t more) {
  if (st->n_tensors + more <= pv->cap_tensors) return;
  size_t cap = FR_MAX(pv->cap_tensors * 2, st->n_tensors + more);
  st->tensors = fr_realloc(st->tensors, cap * sizeof *st->tensors);
  memset(st->tensors + pv->cap_tensors, 0, (cap - pv->cap_tensors) * sizeof *st->tensors);
  pv->cap_tensors = cap;
}

/* Reads and checks the JSON header; *root is set on success. */
static int load_header(const uint8_t *data, size_t size, json_t **root, uint64_t *hlen) {
  json_error_t jerr;
  if (size < 8) return fr_errorf(FR_ETRUNCATED, "safetensors: file of %zu bytes has no header length", size);
  memcpy(hlen, data, 8);
  if (*hlen > ST_MAX_HEADER)
    return fr_errorf(FR_ETOOBIG, "safetensors: header of %llu bytes exceeds the %u byte limit",
                     (unsigned long long)*hlen, ST_MAX_HEADER);
  if (*hlen > size - 8)
    return fr_errorf(FR_ETRUNCATED, "safetensors: header of %llu bytes runs past the end of the file (%zu bytes)",
                     (unsigned long long)*hlen, size);
  *root = json_loadb((const char *)data + 8, (size_t)*hlen, JSON_REJECT_DUPLICATES, &jerr);
  if (!*root) return fr_errorf(FR_EFORMAT, "safetensors: bad header JSON: %s (at %d)", jerr.text, jerr.position);
  if (!json_is_object(*root)) {
    json_decref(*root);
    *root = NULL;
    return fr_errorf(FR_EFORMAT, "safetensors: header is not a JSON object");
  }
  return 0;
}

/* Appends one file's tensors to st. */
static int parse_file(model_st_t *st, st_priv_t *pv, const uint8_t *data, size_t size) {
  json_t *root = NULL, *v;
  const char *k;
  uint64_t hlen;
  size_t ns = 0;
  int rc = load_header(data, size, &root, &hlen);
  if (rc) return rc;
  const uint8_t *buf = data + 8 + hlen;
  uint64_t buf_size = size - 8 - hlen;
  reserve_tensors(st, pv, json_object_size(root));
  st_span_t *spans = fr_malloc(FR_MAX(json_object_size(root), 1) * sizeof *spans);
  json_object_foreach(root, k, v) {
    if (strcmp(k, "__metadata__") == 0) {
      if ((rc = check_metadata(v))) break;
      continue;
    }
    st_tensor_t *t = &st->tensors[st->n_tensors];
    if ((rc = parse_entry(k, v, buf, buf_size, t, &spans[ns].begin, &spans[ns].end))) break;
    spans[ns++].name = t->name;
    st->n_tensors++;
  }
  if (!rc) rc = check_coverage(spans, ns, buf_size);
  free(spans);
  json_decref(root);
  return rc;
}

static int cmp_tensor(const void *a, const void *b) {
  return strcmp(((const st_tensor_t *)a)->name, ((const st_tensor_t *)b)->name);
}

/* Sorts by name and rejects a name seen twice (across shards). */
static int sort_tensors(model_st_t *st) {
  if (st->n_tensors < 2) return 0;
  qsort(st->tensors, st->n_tensors, sizeof *st->tensors, cmp_tensor);
  for (size_t i = 1; i < st->n_tensors; i++)
    if (strcmp(st->tensors[i - 1].name, st->tensors[i].name) == 0)
      return fr_errorf(FR_EFORMAT, "safetensors: duplicate tensor %s", st->tensors[i].name);
  return 0;
}

/* ---- open / close ----------------------------------------------------- */

static model_st_t *st_new(void) {
  model_st_t *st = fr_calloc(1, sizeof *st);
  st->priv = fr_calloc(1, sizeof(st_priv_t));
  return st;
}

static st_shard_t *add_shard(model_st_t *st) {
  st_priv_t *pv = st->priv;
  pv->shards = fr_realloc(pv->shards, (pv->n_shards + 1) * sizeof *pv->shards);
  st_shard_t *sh = &pv->shards[pv->n_shards++];
  memset(sh, 0, sizeof *sh);
  sh->fd = -1;
  return sh;
}

int model_st_open_memory(model_st_t **out, const void *data, size_t size) {
  model_st_t *st = st_new();
  st_shard_t *sh = add_shard(st);
  sh->map = data;
  sh->size = size;
  int rc = data ? parse_file(st, st->priv, data, size) : fr_errorf(FR_ETRUNCATED, "safetensors: empty input");
  if (!rc) rc = sort_tensors(st);
  if (rc) {
    model_st_close(st);
    st = NULL;
  }
  *out = st;
  return rc;
}

/* Maps the file into sh and keeps it open (sh->fd) for weight reads. */
static int map_file(const char *path, st_shard_t *sh) {
  struct stat sb;
  int fd, rc = model__path_open("safetensors", path, MODEL_PATH_FILE, &fd, &sb);
  if (rc) return rc;
  if (sb.st_size < 8) {
    rc = fr_errorf(FR_ETRUNCATED, "safetensors: %s is shorter than 8 bytes", path);
  } else {
    void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      rc = fr_errorf(-errno, "safetensors: cannot map %s: %s", path, strerror(errno));
    } else {
      sh->map = p;
      sh->size = (size_t)sb.st_size;
      sh->mapped = true;
    }
  }
  if (rc) close(fd);
  else sh->fd = fd;
  return rc;
}

/* Maps one file and appends its tensors. */
static int open_one(model_st_t *st, const char *path) {
  st_shard_t *sh = add_shard(st);
  int rc = map_file(path, sh);
  if (rc) return rc;
  size_t first = st->n_tensors;
  if ((rc = parse_file(st, st->priv, sh->map, sh->size))) {
    char msg[400];
    snprintf(msg, sizeof msg, "%s", fr_last_error());
    return fr_errorf(rc, "%s (in %s)", msg, path);
  }
  for (size_t i = first; i < st->n_tensors; i++) {
    st->tensors[i].fd = sh->fd;
    st->tensors[i].file_off = (uint64_t)((const uint8_t *)st->tensors[i].data - sh->map);
  }
  return 0;
}

static char *join_path(const char *dir, const char *name) {
  size_t n = strlen(dir) + strlen(name) + 2;
  char *p = fr_malloc(n);
  snprintf(p, n, "%s/%s", dir, name);
  return p;
}

/* A shard name from weight_map: a plain file name inside the folder. */
static bool shard_name_ok(const char *s) {
  return s[0] && s[0] != '.' && !strchr(s, '/') && strlen(s) < 4096;
}

/* Collects the distinct shard names of weight_map in order of appearance. */
static int index_shards(json_t *wm, const char ***names, size_t *n) {
  const char *k;
  json_t *v;
  *names = fr_malloc(FR_MAX(json_object_size(wm), 1) * sizeof **names);
  *n = 0;
  json_object_foreach(wm, k, v) {
    if (!json_is_string(v) || !shard_name_ok(json_string_value(v)))
      return fr_errorf(FR_EFORMAT, "safetensors: weight_map entry %.64s is not a plain file name", k);
    size_t j = 0;
    while (j < *n && strcmp((*names)[j], json_string_value(v)) != 0) j++;
    if (j == *n) (*names)[(*n)++] = json_string_value(v);
  }
  return 0;
}

/* Every weight_map name must be a tensor of the shard it names; shards[i]
 * was mapped from names[i]. */
static int check_weight_map(model_st_t *st, json_t *wm, const char **names, size_t n) {
  const char *k;
  json_t *v;
  st_priv_t *pv = st->priv;
  json_object_foreach(wm, k, v) {
    const st_tensor_t *t = model_st_tensor(st, k);
    size_t i = 0;
    while (i < n && strcmp(names[i], json_string_value(v)) != 0) i++;
    const uint8_t *p = t ? t->data : NULL;
    if (!t || i == n || p < pv->shards[i].map || p > pv->shards[i].map + pv->shards[i].size)
      return fr_errorf(FR_EFORMAT, "safetensors: weight_map tensor %.64s is not in shard %.64s", k,
                       json_string_value(v));
  }
  return 0;
}

static int open_index(model_st_t *st, const char *dir, const char *index_path) {
  json_error_t jerr;
  const char **names = NULL;
  char *text;
  size_t n = 0, len;
  int rc = model__file_read("safetensors", index_path, ST_MAX_INDEX, &text, &len);
  if (rc) return rc;
  json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
  free(text);
  if (!root) return fr_errorf(FR_EFORMAT, "safetensors: %s: %s (line %d)", index_path, jerr.text, jerr.line);
  json_t *wm = json_object_get(root, "weight_map");
  if (!json_is_object(wm)) rc = fr_errorf(FR_EFORMAT, "safetensors: %s has no weight_map object", index_path);
  if (!rc) rc = index_shards(wm, &names, &n);
  for (size_t i = 0; i < n && !rc; i++) {
    char *p = join_path(dir, names[i]);
    rc = open_one(st, p);
    free(p);
  }
  if (!rc) rc = sort_tensors(st);
  if (!rc) rc = check_weight_map(st, wm, names, n);
  free(names);
  json_decref(root);
  return rc;
}

/* True when something is at p (not ENOENT): what it is, the open checks. */
static bool path_exists(const char *p) {
  struct stat sb;
  return stat(p, &sb) == 0 || errno != ENOENT;
}

static int open_dir(model_st_t *st, const char *dir) {
  int rc;
  char *idx = join_path(dir, "model.safetensors.index.json");
  char *single = join_path(dir, "model.safetensors");
  if (path_exists(idx)) {
    rc = open_index(st, dir, idx);
  } else if (path_exists(single)) {
    rc = open_one(st, single);
    if (!rc) rc = sort_tensors(st);
  } else {
    rc = fr_errorf(FR_ENOTFOUND, "safetensors: %s has neither model.safetensors.index.json nor model.safetensors",
                   dir);
  }
  free(idx);
  free(single);
  return rc;
}

int model_st_open(model_st_t **out, const char *path) {
  struct stat sb;
  int fd;
  *out = NULL;
  int rc = model__path_open("safetensors", path, MODEL_PATH_FILE | MODEL_PATH_DIR, &fd, &sb);
  if (rc) return rc;
  close(fd); /* each file is opened (and checked) again where it is read */
  model_st_t *st = st_new();
  if (S_ISDIR(sb.st_mode)) {
    rc = open_dir(st, path);
  } else {
    rc = open_one(st, path);
    if (!rc) rc = sort_tensors(st);
  }
  if (rc) {
    model_st_close(st);
    return rc;
  }
  *out = st;
  return 0;
}

void model_st_close(model_st_t *st) {
  if (!st) return;
  st_priv_t *pv = st->priv;
  for (size_t i = 0; i < st->n_tensors; i++) free(st->tensors[i].name);
  free(st->tensors);
  for (size_t i = 0; pv && i < pv->n_shards; i++) {
    if (pv->shards[i].mapped) munmap((void *)pv->shards[i].map, pv->shards[i].size);
    if (pv->shards[i].fd >= 0) close(pv->shards[i].fd);
  }
  if (pv) free(pv->shards);
  free(pv);
  free(st);
}

const st_tensor_t *model_st_tensor(const model_st_t *st, const char *name) {
  size_t lo = 0, hi = st->n_tensors;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(st->tensors[mid].name, name);
    if (c == 0) return &st->tensors[mid];
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  return NULL;
}
