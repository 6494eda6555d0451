/* proto_codec.c - the msgpack reader and writer behind every message: a
 * cursor over the input bytes (strict, allocation-safe), a growable output
 * buffer, the per-message arena, and the schema-driven encode / decode. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "proto/proto.h"
#include "proto/proto_schema.h"

/* ---------------------------------------------------------------- arena */

struct proto_arena_chunk {
  proto_arena_chunk_t *next;
  size_t cap, used;
  _Alignas(16) uint8_t data[];
};

#define ARENA_MIN_CHUNK 8192u

static void arena_release(proto_arena_t *a, int keep_head) {
  proto_arena_chunk_t *c = a->head, *next;
  if (keep_head && c) {
    c->used = 0;
    next = c->next;
    c->next = NULL;
    c = next;
  } else {
    a->head = NULL;
  }
  for (; c; c = next) {
    next = c->next;
    free(c);
  }
}

/* Returns n zeroed-or-not bytes aligned to 8; the caller initializes them. */
static void *arena_alloc(proto_arena_t *a, size_t n) {
  n = (n + 7) & ~(size_t)7;
  proto_arena_chunk_t *c = a->head;
  if (!c || c->cap - c->used < n) {
    size_t cap = c ? c->cap * 2 : ARENA_MIN_CHUNK;
    if (cap < n) cap = n;
    proto_arena_chunk_t *nc = fr_malloc(sizeof *nc + cap);
    nc->cap = cap;
    nc->used = 0;
    nc->next = c;
    a->head = c = nc;
  }
  void *p = c->data + c->used;
  c->used += n;
  return p;
}

/* After a decode that needed several chunks, keep one chunk as big as all
 * of them so that the next decode of a similar message needs one. */
static void arena_reset(proto_arena_t *a) {
  proto_arena_chunk_t *c = a->head;
  if (!c || !c->next) {
    if (c) c->used = 0;
    return;
  }
  size_t total = 0;
  for (; c; c = c->next) total += c->cap;
  arena_release(a, 0);
  proto_arena_chunk_t *nc = fr_malloc(sizeof *nc + total);
  nc->cap = total;
  nc->used = 0;
  nc->next = NULL;
  a->head = nc;
}

void proto_msg_init(proto_msg_t *m) { memset(m, 0, sizeof *m); }

void proto_msg_free(proto_msg_t *m) {
  if (!m) return;
  arena_release(&m->arena, 0);
  memset(m, 0, sizeof *m);
}

/* --------------------------------------------------------------- buffer */

void proto_buf_init(proto_buf_t *b) { memset(b, 0, sizeof *b); }

void proto_buf_free(proto_buf_t *b) {
  if (!b) return;
  free(b->data);
  memset(b, 0, sizeof *b);
}

static void buf_grow(proto_buf_t *b, size_t need) {
  size_t cap = b->cap ? b->cap : 4096;
  while (cap - b->len < need) cap *= 2;
  b->data = fr_realloc(b->data, cap);
  b->cap = cap;
}

/* Makes room for n more bytes; writes after it need no checks. */
static inline uint8_t *buf_reserve(proto_buf_t *b, size_t n) {
  if (b->cap - b->len < n) buf_grow(b, n);
  return b->data + b->len;
}

/* --------------------------------------------------------------- writer */

static inline uint8_t *put_be16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)(v >> 8);
  p[1] = (uint8_t)v;
  return p + 2;
}
static inline uint8_t *put_be32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24);
  p[1] = (uint8_t)(v >> 16);
  p[2] = (uint8_t)(v >> 8);
  p[3] = (uint8_t)v;
  return p + 4;
}
static inline uint8_t *put_be64(uint8_t *p, uint64_t v) {
  p = put_be32(p, (uint32_t)(v >> 32));
  return put_be32(p, (uint32_t)v);
}

/* At most 9 bytes. */
static inline uint8_t *put_uint(uint8_t *p, uint64_t v) {
  if (v < 128) {
    *p++ = (uint8_t)v;
  } else if (v <= 0xff) {
    *p++ = 0xcc;
    *p++ = (uint8_t)v;
  } else if (v <= 0xffff) {
    *p++ = 0xcd;
    p = put_be16(p, (uint16_t)v);
  } else if (v <= 0xffffffffu) {
    *p++ = 0xce;
    p = put_be32(p, (uint32_t)v);
  } else {
    *p++ = 0xcf;
    p = put_be64(p, v);
  }
  return p;
}

static inline uint8_t *put_int(uint8_t *p, int64_t v) {
  if (v >= 0) return put_uint(p, (uint64_t)v);
  if (v >= -32) {
    *p++ = (uint8_t)(int8_t)v;
  } else if (v >= INT8_MIN) {
    *p++ = 0xd0;
    *p++ = (uint8_t)(int8_t)v;
  } else if (v >= INT16_MIN) {
    *p++ = 0xd1;
    p = put_be16(p, (uint16_t)(int16_t)v);
  } else if (v >= INT32_MIN) {
    *p++ = 0xd2;
    p = put_be32(p, (uint32_t)(int32_t)v);
  } else {
    *p++ = 0xd3;
    p = put_be64(p, (uint64_t)v);
  }
  return p;
}

static inline uint8_t *put_f32(uint8_t *p, float f) {
  uint32_t bits;
  memcpy(&bits, &f, 4);
  *p++ = 0xca;
  return put_be32(p, bits);
}

/* Header of a str / array / map / bin; at most 5 bytes. */
static inline uint8_t *put_str_head(uint8_t *p, uint32_t n) {
  if (n < 32) {
    *p++ = (uint8_t)(0xa0 | n);
  } else if (n <= 0xff) {
    *p++ = 0xd9;
    *p++ = (uint8_t)n;
  } else if (n <= 0xffff) {
    *p++ = 0xda;
    p = put_be16(p, (uint16_t)n);
  } else {
    *p++ = 0xdb;
    p = put_be32(p, n);
  }
  return p;
}
static inline uint8_t *put_arr_head(uint8_t *p, uint32_t n) {
  if (n < 16) {
    *p++ = (uint8_t)(0x90 | n);
  } else if (n <= 0xffff) {
    *p++ = 0xdc;
    p = put_be16(p, (uint16_t)n);
  } else {
    *p++ = 0xdd;
    p = put_be32(p, n);
  }
  return p;
}
static inline uint8_t *put_bin_head(uint8_t *p, uint32_t n) {
  if (n <= 0xff) {
    *p++ = 0xc4;
    *p++ = (uint8_t)n;
  } else if (n <= 0xffff) {
    *p++ = 0xc5;
    p = put_be16(p, (uint16_t)n);
  } else {
    *p++ = 0xc6;
    p = put_be32(p, n);
  }
  return p;
}

static inline uint8_t *put_str(uint8_t *p, const void *s, uint32_t n) {
  p = put_str_head(p, n);
  memcpy(p, s, n);
  return p + n;
}

/* --------------------------------------------------------------- reader */

typedef enum { K_NIL, K_BOOL, K_UINT, K_INT, K_F32, K_F64, K_STR, K_BIN, K_EXT, K_ARR, K_MAP } kind_t;

static const char *const kind_names[] = {"nil", "bool", "integer", "integer", "float", "float",
                                         "string", "binary", "extension", "array", "map"};

typedef struct {
  kind_t kind;
  uint32_t len;       /* str / bin / ext bytes, array elements, map pairs */
  uint64_t u;         /* K_UINT, K_BOOL */
  int64_t i;          /* K_INT (negative) */
  double f;           /* K_F32, K_F64 */
  const uint8_t *ptr; /* str / bin / ext payload */
} mpv_t;

#define RD_MAX_DEPTH 8

typedef struct {
  const uint8_t *p, *end;
  proto_arena_t *arena;
  const char *msg;                  /* message name for errors */
  int depth;
  const char *path[RD_MAX_DEPTH];   /* keys */
  int64_t index[RD_MAX_DEPTH];      /* element index, -1 = none */
} rd_t;

static inline uint16_t get_be16(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }
static inline uint32_t get_be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static inline uint64_t get_be64(const uint8_t *p) { return (uint64_t)get_be32(p) << 32 | get_be32(p + 4); }

/* Formats "<what> at <msg>.<key>[i].<key>" as the thread's error detail. */
__attribute__((format(printf, 3, 4))) static int rd_fail(const rd_t *r, int err, const char *fmt, ...) {
  char what[256], where[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  size_t n = (size_t)snprintf(where, sizeof where, "%s", r->msg ? r->msg : "message");
  for (int d = 0; d < r->depth && n < sizeof where; d++) {
    if (r->index[d] >= 0)
      n += (size_t)snprintf(where + n, sizeof where - n, ".%s[%lld]", r->path[d], (long long)r->index[d]);
    else
      n += (size_t)snprintf(where + n, sizeof where - n, ".%s", r->path[d]);
  }
  return fr_errorf(err, "proto: %s at %s", what, where);
}

static inline size_t rd_left(const rd_t *r) { return (size_t)(r->end - r->p); }

static int rd_truncated(const rd_t *r) { return rd_fail(r, FR_ETRUNCATED, "message truncated"); }

/* Reads a payload of n bytes (str / bin / ext). When the bytes are not
 * all there, ptr is NULL and the input is used up: the consumer checks
 * the length against its limit first (FR_ETOOBIG for a huge claim), then
 * calls rd_need_payload (FR_ETRUNCATED). */
static inline int rd_payload(rd_t *r, mpv_t *v, size_t n) {
  v->len = (uint32_t)n;
  if (rd_left(r) < n) {
    v->ptr = NULL;
    r->p = r->end;
    return 0;
  }
  v->ptr = r->p;
  r->p += n;
  return 0;
}

static inline int rd_need_payload(const rd_t *r, const mpv_t *v) {
  return v->ptr ? 0 : rd_truncated(r);
}

/* Reads the first bytes of one value: scalars whole, str/bin/ext with their
 * payload, arrays and maps only their header (len = element count). */
static int rd_value_slow(rd_t *r, mpv_t *v) {
  if (rd_left(r) < 1) return rd_truncated(r);
  uint8_t b = *r->p++;
  size_t need;
  switch (b) {
  case 0xc0: v->kind = K_NIL; return 0;
  case 0xc2: case 0xc3: v->kind = K_BOOL; v->u = b & 1; return 0;
  case 0xc4: case 0xd9: need = 1; break;
  case 0xc5: case 0xda: case 0xdc: case 0xde: need = 2; break;
  case 0xc6: case 0xdb: case 0xdd: case 0xdf: need = 4; break;
  case 0xc7: need = 2; break; /* ext8: len, type */
  case 0xc8: need = 3; break;
  case 0xc9: need = 5; break;
  case 0xca: case 0xd2: case 0xce: need = 4; break;
  case 0xcb: case 0xd3: case 0xcf: need = 8; break;
  case 0xcc: case 0xd0: need = 1; break;
  case 0xcd: case 0xd1: need = 2; break;
  case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8: need = 1; break; /* fixext: type */
  default: return rd_fail(r, FR_EPROTO, "invalid msgpack byte 0x%02x", b);
  }
  if (rd_left(r) < need) return rd_truncated(r);
  const uint8_t *q = r->p;
  r->p += need;
  switch (b) {
  case 0xc4: v->kind = K_BIN; return rd_payload(r, v, q[0]);
  case 0xc5: v->kind = K_BIN; return rd_payload(r, v, get_be16(q));
  case 0xc6: v->kind = K_BIN; return rd_payload(r, v, get_be32(q));
  case 0xd9: v->kind = K_STR; return rd_payload(r, v, q[0]);
  case 0xda: v->kind = K_STR; return rd_payload(r, v, get_be16(q));
  case 0xdb: v->kind = K_STR; return rd_payload(r, v, get_be32(q));
  case 0xc7: v->kind = K_EXT; return rd_payload(r, v, q[0]);
  case 0xc8: v->kind = K_EXT; return rd_payload(r, v, get_be16(q));
  case 0xc9: v->kind = K_EXT; return rd_payload(r, v, get_be32(q));
  case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8:
    v->kind = K_EXT;
    return rd_payload(r, v, (size_t)1 << (b - 0xd4));
  case 0xdc: v->kind = K_ARR; v->len = get_be16(q); return 0;
  case 0xdd: v->kind = K_ARR; v->len = get_be32(q); return 0;
  case 0xde: v->kind = K_MAP; v->len = get_be16(q); return 0;
  case 0xdf: v->kind = K_MAP; v->len = get_be32(q); return 0;
  case 0xca: {
    uint32_t bits = get_be32(q);
    float f;
    memcpy(&f, &bits, 4);
    v->kind = K_F32;
    v->f = f;
    return 0;
  }
  case 0xcb: {
    uint64_t bits = get_be64(q);
    memcpy(&v->f, &bits, 8);
    v->kind = K_F64;
    return 0;
  }
  case 0xcc: v->kind = K_UINT; v->u = q[0]; return 0;
  case 0xcd: v->kind = K_UINT; v->u = get_be16(q); return 0;
  case 0xce: v->kind = K_UINT; v->u = get_be32(q); return 0;
  case 0xcf: v->kind = K_UINT; v->u = get_be64(q); return 0;
  case 0xd0: v->i = (int8_t)q[0]; break;
  case 0xd1: v->i = (int16_t)get_be16(q); break;
  case 0xd2: v->i = (int32_t)get_be32(q); break;
  default: v->i = (int64_t)get_be64(q); break; /* 0xd3 */
  }
  /* signed encodings of non-negative values are plain unsigned ints */
  if (v->i >= 0) {
    v->kind = K_UINT;
    v->u = (uint64_t)v->i;
  } else {
    v->kind = K_INT;
  }
  return 0;
}

/* Fast path for the one-byte forms (fixint, fixstr, fixarray, fixmap). */
static inline int rd_value(rd_t *r, mpv_t *v) {
  if (r->p < r->end) {
    uint8_t b = *r->p;
    if (b < 0x80) {
      r->p++;
      v->kind = K_UINT;
      v->u = b;
      return 0;
    }
    if (b >= 0xe0) {
      r->p++;
      v->kind = K_INT;
      v->i = (int8_t)b;
      return 0;
    }
    if (b < 0xc0) {
      r->p++;
      if (b >= 0xa0) {
        v->kind = K_STR;
        return rd_payload(r, v, b & 0x1f);
      }
      v->kind = b >= 0x90 ? K_ARR : K_MAP;
      v->len = b & 0x0f;
      return 0;
    }
  }
  return rd_value_slow(r, v);
}

/* Skips one value of any shape without recursion: every element still to
 * come needs at least one byte, so a count larger than the bytes left is a
 * truncated message, whatever a header claims. */
static int rd_skip_value(rd_t *r, const mpv_t *first) {
  uint64_t pending = 0;
  if ((first->kind == K_STR || first->kind == K_BIN || first->kind == K_EXT) && !first->ptr) return rd_truncated(r);
  if (first->kind == K_ARR) pending = first->len;
  if (first->kind == K_MAP) pending = 2 * (uint64_t)first->len;
  while (pending) {
    if (pending > rd_left(r)) return rd_truncated(r);
    mpv_t v;
    int rc = rd_value(r, &v);
    if (rc) return rc;
    pending--;
    if ((v.kind == K_STR || v.kind == K_BIN || v.kind == K_EXT) && !v.ptr) return rd_truncated(r);
    if (v.kind == K_ARR) pending += v.len;
    if (v.kind == K_MAP) pending += 2 * (uint64_t)v.len;
  }
  return 0;
}

static int rd_type_error(const rd_t *r, const char *want, const mpv_t *v) {
  return rd_fail(r, FR_EPROTO, "expected %s, got %s", want, kind_names[v->kind]);
}

/* Checks an array / str count against its limit and the bytes left
 * (min_elem bytes per element at least). */
static int rd_check_count(const rd_t *r, uint64_t n, uint32_t max, size_t min_elem) {
  if (n > max) return rd_fail(r, FR_ETOOBIG, "%llu elements exceed the limit of %u", (unsigned long long)n, max);
  if (n * min_elem > rd_left(r)) return rd_truncated(r);
  return 0;
}

/* -------------------------------------------------------------- decoder */

static int rd_obj(rd_t *r, const proto_schema_t *s, void *out, uint32_t n_pairs, int top);

static int rd_u64(rd_t *r, const mpv_t *v, uint64_t max, uint64_t *out) {
  if (v->kind == K_INT) return rd_fail(r, FR_EPROTO, "negative value %lld out of range", (long long)v->i);
  if (v->kind != K_UINT) return rd_type_error(r, "integer", v);
  if (v->u > max) return rd_fail(r, FR_EPROTO, "value %llu out of range", (unsigned long long)v->u);
  *out = v->u;
  return 0;
}

static int rd_i32(rd_t *r, const mpv_t *v, int32_t *out) {
  if (v->kind == K_UINT) {
    if (v->u > INT32_MAX) return rd_fail(r, FR_EPROTO, "value %llu out of range", (unsigned long long)v->u);
    *out = (int32_t)v->u;
    return 0;
  }
  if (v->kind != K_INT) return rd_type_error(r, "integer", v);
  if (v->i < INT32_MIN) return rd_fail(r, FR_EPROTO, "value %lld out of range", (long long)v->i);
  *out = (int32_t)v->i;
  return 0;
}

static int rd_f32(rd_t *r, const mpv_t *v, float *out) {
  switch (v->kind) {
  case K_F32: case K_F64: *out = (float)v->f; return 0;
  case K_UINT: *out = (float)v->u; return 0;
  case K_INT: *out = (float)v->i; return 0;
  default: return rd_type_error(r, "number", v);
  }
}

/* Copies a str payload into the arena, NUL-terminated. */
static int rd_str(rd_t *r, const mpv_t *v, uint32_t max, int allow_nul, char **out) {
  if (v->kind != K_STR) return rd_type_error(r, "string", v);
  if (v->len > max) return rd_fail(r, FR_ETOOBIG, "string of %u bytes exceeds the limit of %u", v->len, max);
  int rc = rd_need_payload(r, v);
  if (rc) return rc;
  if (!allow_nul && memchr(v->ptr, 0, v->len)) return rd_fail(r, FR_EPROTO, "string holds a NUL byte");
  char *s = arena_alloc(r->arena, (size_t)v->len + 1);
  memcpy(s, v->ptr, v->len);
  s[v->len] = 0;
  *out = s;
  return 0;
}

/* Reads an array header for field f and allocates n elements of esize. */
static int rd_array(rd_t *r, const mpv_t *v, const proto_field_t *f, size_t esize, void **data, uint32_t *n) {
  if (v->kind != K_ARR) return rd_type_error(r, "array", v);
  int rc = rd_check_count(r, v->len, f->max, 1);
  if (rc) return rc;
  *n = v->len;
  *data = v->len ? arena_alloc(r->arena, (size_t)v->len * esize) : NULL;
  return 0;
}

/* Int arrays are the bulk of a step: their loop reads elements inline. */
static int rd_i32s(rd_t *r, const mpv_t *v, const proto_field_t *f, uint8_t *out) {
  void *data;
  uint32_t n;
  int rc = rd_array(r, v, f, 4, &data, &n);
  if (rc) return rc;
  int32_t *a = data;
  int is_u32 = f->type == PF_U32S;
  for (uint32_t i = 0; i < n; i++) {
    const uint8_t *p = r->p;
    if (r->end - p >= 5) { /* the unsigned forms inline */
      if (*p < 0x80) {
        a[i] = *p;
        r->p = p + 1;
        continue;
      }
      if (*p == 0xcd) {
        a[i] = get_be16(p + 1);
        r->p = p + 3;
        continue;
      }
      if (*p == 0xcc) {
        a[i] = p[1];
        r->p = p + 2;
        continue;
      }
      if (*p == 0xce && (is_u32 || get_be32(p + 1) <= INT32_MAX)) {
        a[i] = (int32_t)get_be32(p + 1);
        r->p = p + 5;
        continue;
      }
    }
    mpv_t e;
    r->index[r->depth - 1] = i;
    if ((rc = rd_value(r, &e))) return rc;
    if (is_u32) {
      uint64_t u;
      if ((rc = rd_u64(r, &e, UINT32_MAX, &u))) return rc;
      a[i] = (int32_t)(uint32_t)u;
    } else if ((rc = rd_i32(r, &e, &a[i]))) {
      return rc;
    }
  }
  r->index[r->depth - 1] = -1;
  memcpy(out + f->off, &data, sizeof data);
  memcpy(out + f->off_n, &n, 4);
  return 0;
}

static int rd_f32s(rd_t *r, const mpv_t *v, const proto_field_t *f, uint8_t *out) {
  void *data;
  uint32_t n;
  int rc = rd_array(r, v, f, 4, &data, &n);
  if (rc) return rc;
  float *a = data;
  for (uint32_t i = 0; i < n; i++) {
    mpv_t e;
    r->index[r->depth - 1] = i;
    if ((rc = rd_value(r, &e)) || (rc = rd_f32(r, &e, &a[i]))) return rc;
  }
  r->index[r->depth - 1] = -1;
  memcpy(out + f->off, &data, sizeof data);
  memcpy(out + f->off_n, &n, 4);
  return 0;
}

static int rd_f32bin(rd_t *r, const mpv_t *v, const proto_field_t *f, uint8_t *out) {
  if (v->kind != K_BIN) return rd_type_error(r, "binary", v);
  uint32_t n = v->len / 4;
  if (n > f->max || (n == f->max && v->len % 4))
    return rd_fail(r, FR_ETOOBIG, "%u bytes of floats exceed the limit of %u floats", v->len, f->max);
  int rc = rd_need_payload(r, v);
  if (rc) return rc;
  if (v->len % 4) return rd_fail(r, FR_EPROTO, "binary of %u bytes is not a float32 array", v->len);
  float *a = n ? arena_alloc(r->arena, v->len) : NULL;
  for (uint32_t i = 0; i < n; i++) { /* little-endian on the wire */
    const uint8_t *q = v->ptr + 4 * i;
    uint32_t bits = (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
    memcpy(&a[i], &bits, 4);
  }
  memcpy(out + f->off, &a, sizeof a);
  memcpy(out + f->off_n, &n, 4);
  return 0;
}

static int rd_strs(rd_t *r, const mpv_t *v, const proto_field_t *f, uint8_t *out) {
  void *data;
  uint32_t n;
  int rc = rd_array(r, v, f, sizeof(char *), &data, &n);
  if (rc) return rc;
  char **a = data;
  for (uint32_t i = 0; i < n; i++) {
    mpv_t e;
    r->index[r->depth - 1] = i;
    if ((rc = rd_value(r, &e)) || (rc = rd_str(r, &e, PROTO_MAX_STR, 0, &a[i]))) return rc;
  }
  r->index[r->depth - 1] = -1;
  memcpy(out + f->off, &data, sizeof data);
  memcpy(out + f->off_n, &n, 4);
  return 0;
}

static int rd_objs(rd_t *r, const mpv_t *v, const proto_field_t *f, uint8_t *out) {
  void *data;
  uint32_t n;
  int rc = rd_array(r, v, f, f->sub->size, &data, &n);
  if (rc) return rc;
  for (uint32_t i = 0; i < n; i++) {
    mpv_t e;
    r->index[r->depth - 1] = i;
    if ((rc = rd_value(r, &e))) return rc;
    if (e.kind != K_MAP) return rd_type_error(r, "map", &e);
    if ((rc = rd_obj(r, f->sub, (uint8_t *)data + (size_t)i * f->sub->size, e.len, 0))) return rc;
  }
  r->index[r->depth - 1] = -1;
  memcpy(out + f->off, &data, sizeof data);
  memcpy(out + f->off_n, &n, 4);
  return 0;
}

static int rd_enum(rd_t *r, const mpv_t *v, const proto_field_t *f, uint8_t *out) {
  if (v->kind != K_STR) return rd_type_error(r, "string", v);
  if (v->len > PROTO_MAX_STR) return rd_fail(r, FR_ETOOBIG, "string of %u bytes is too long", v->len);
  int rc = rd_need_payload(r, v);
  if (rc) return rc;
  for (uint32_t i = 1; i < f->max; i++) {
    if (strlen(f->names[i]) == v->len && memcmp(f->names[i], v->ptr, v->len) == 0) {
      int e = (int)i;
      memcpy(out + f->off, &e, sizeof e);
      return 0;
    }
  }
  return rd_fail(r, FR_EPROTO, "unknown value \"%.*s\"", (int)FR_MIN(v->len, 32u), (const char *)v->ptr);
}

/* Decodes the value of field f (already read as v) into out. */
static int rd_field(rd_t *r, const proto_field_t *f, const mpv_t *v, uint8_t *out) {
  uint64_t u;
  int rc;
  switch (f->type) {
  case PF_U32:
    if ((rc = rd_u64(r, v, UINT32_MAX, &u))) return rc;
    *(uint32_t *)(out + f->off) = (uint32_t)u;
    return 0;
  case PF_U64: return rd_u64(r, v, UINT64_MAX, (uint64_t *)(out + f->off));
  case PF_I32: return rd_i32(r, v, (int32_t *)(out + f->off));
  case PF_F32: return rd_f32(r, v, (float *)(out + f->off));
  case PF_BOOL:
    if (v->kind != K_BOOL) return rd_type_error(r, "boolean", v);
    *(bool *)(out + f->off) = v->u != 0;
    return 0;
  case PF_ENUM: return rd_enum(r, v, f, out);
  case PF_STR: return rd_str(r, v, f->max, 0, (char **)(out + f->off));
  case PF_TEXT:
    if ((rc = rd_str(r, v, f->max, 1, (char **)(out + f->off)))) return rc;
    *(uint32_t *)(out + f->off_n) = v->len;
    return 0;
  case PF_I32S: case PF_U32S: return rd_i32s(r, v, f, out);
  case PF_F32S: return rd_f32s(r, v, f, out);
  case PF_F32BIN: return rd_f32bin(r, v, f, out);
  case PF_STRS: return rd_strs(r, v, f, out);
  case PF_OBJ:
    if (v->kind != K_MAP) return rd_type_error(r, "map", v);
    return rd_obj(r, f->sub, out + f->off, v->len, 0);
  case PF_OBJS: return rd_objs(r, v, f, out);
  default: return rd_fail(r, FR_EPROTO, "bad schema");
  }
}

#define KEY_NONE (~(uint64_t)0) /* matches no field: keys over 7 bytes */
#define KEY_V PROTO_KPACK("v")
#define KEY_T PROTO_KPACK("t")

/* Packs a key's bytes as PROTO_KPACK does. */
static inline uint64_t pack_key(const uint8_t *p, const uint8_t *end, uint32_t len) {
  static const uint64_t mask[8] = {0, 0xff, 0xffff, 0xffffff, 0xffffffffull, 0xffffffffffull, 0xffffffffffffull,
                                   0xffffffffffffffull};
  if (len > 7) return KEY_NONE;
  uint64_t k = 0;
  if (end - p >= 8) {
    memcpy(&k, p, 8); /* little-endian hosts: bytes in order */
    k &= mask[len];
  } else {
    for (uint32_t i = 0; i < len; i++) k |= (uint64_t)p[i] << (8 * i);
  }
  return k | (uint64_t)len << 56;
}

/* Reads a map key (a string) packed; *text / *len for messages. */
static inline int rd_key(rd_t *r, uint64_t *key) {
  if (r->p < r->end && (*r->p & 0xf8) == 0xa0) { /* fixstr of <= 7 bytes */
    uint32_t len = *r->p & 7;
    if (rd_left(r) < 1 + (size_t)len) return rd_truncated(r);
    *key = pack_key(r->p + 1, r->end, len);
    r->p += 1 + len;
    return 0;
  }
  mpv_t k = {.len = 0};
  int rc = rd_value(r, &k);
  if (rc) return rc;
  if (k.kind != K_STR) return rd_fail(r, FR_EPROTO, "map key is a %s, not a string", kind_names[k.kind]);
  if ((rc = rd_need_payload(r, &k))) return rc;
  *key = pack_key(k.ptr, r->end, k.len);
  return 0;
}

/* Finds the field a key names: the one after the previous first (our
 * encoder writes fields in table order), else a search. -1: unknown. */
static inline int find_field(const proto_schema_t *s, uint64_t key, uint32_t next) {
  if (next < s->n_fields && s->fields[next].kpack == key) return (int)next;
  for (uint32_t i = 0; i < s->n_fields; i++)
    if (s->fields[i].kpack == key) return (int)i;
  return -1;
}

static int rd_missing(rd_t *r, const proto_schema_t *s, uint32_t seen) {
  for (uint32_t i = 0; i < s->n_fields; i++)
    if ((s->fields[i].flags & PF_REQ) && !(seen & (1u << i)))
      return rd_fail(r, FR_EPROTO, "missing required field \"%s\" in %s", s->fields[i].key, s->name);
  return 0;
}

/* The common scalar encodings, read straight into the field: returns 1
 * when it took the value, 0 to leave it to the general path. */
static inline int rd_scalar_fast(rd_t *r, const proto_field_t *f, uint8_t *out) {
  const uint8_t *p = r->p;
  if (r->end - p < 9) return 0;
  uint8_t b = *p;
  switch (f->type) {
  case PF_U32: case PF_I32: case PF_U64: {
    uint32_t x;
    if (b < 0x80) {
      x = b;
      r->p = p + 1;
    } else if (b == 0xcd) {
      x = get_be16(p + 1);
      r->p = p + 3;
    } else if (b == 0xcc) {
      x = p[1];
      r->p = p + 2;
    } else if (b == 0xce && (f->type != PF_I32 || get_be32(p + 1) <= INT32_MAX)) {
      x = get_be32(p + 1);
      r->p = p + 5;
    } else {
      return 0;
    }
    if (f->type == PF_U64) {
      uint64_t u = x;
      memcpy(out + f->off, &u, 8);
    } else {
      memcpy(out + f->off, &x, 4);
    }
    return 1;
  }
  case PF_F32:
    if (b != 0xca) return 0;
    uint32_t bits = get_be32(p + 1);
    memcpy(out + f->off, &bits, 4);
    r->p = p + 5;
    return 1;
  case PF_BOOL:
    if ((b & 0xfe) != 0xc2) return 0;
    *(bool *)(out + f->off) = b & 1;
    r->p = p + 1;
    return 1;
  default:
    return 0;
  }
}

/* Decodes one key/value pair of an object into out; seen/next track the
 * fields. top: 1 = envelope keys already read (another is a duplicate),
 * 2 = envelope keys to skip (already checked by the prescan). */
static int rd_pair(rd_t *r, const proto_schema_t *s, uint8_t *out, int top, uint32_t *seen, uint32_t *next) {
  uint64_t key;
  mpv_t v;
  int rc = rd_key(r, &key);
  if (rc) return rc;
  int idx = find_field(s, key, *next);
  if (idx >= 0 && !(*seen & (1u << idx)) && rd_scalar_fast(r, &s->fields[idx], out)) {
    *seen |= 1u << idx;
    *next = (uint32_t)idx + 1;
    if (s->fields[idx].flags & PF_HAS) *(bool *)(out + s->fields[idx].off_n) = true;
    return 0;
  }
  if ((rc = rd_value(r, &v))) return rc;
  if (idx < 0) {
    if (top == 1 && (key == KEY_V || key == KEY_T))
      return rd_fail(r, FR_EPROTO, "duplicate key \"%c\"", (char)key);
    return rd_skip_value(r, &v); /* unknown field: forward compatible */
  }
  const proto_field_t *f = &s->fields[idx];
  if (*seen & (1u << idx)) return rd_fail(r, FR_EPROTO, "duplicate key \"%s\" in %s", f->key, s->name);
  *seen |= 1u << idx;
  *next = (uint32_t)idx + 1;
  if (v.kind == K_NIL) { /* nil: absent */
    if (f->flags & PF_REQ) return rd_fail(r, FR_EPROTO, "required field \"%s\" is nil", f->key);
    return 0;
  }
  if (r->depth >= RD_MAX_DEPTH) return rd_fail(r, FR_EPROTO, "nested too deep");
  r->path[r->depth] = f->key;
  r->index[r->depth] = -1;
  r->depth++;
  rc = rd_field(r, f, &v, out);
  if (rc) return rc;
  r->depth--;
  if (f->flags & PF_HAS) *(bool *)(out + f->off_n) = true;
  return 0;
}

static int rd_obj(rd_t *r, const proto_schema_t *s, void *out, uint32_t n_pairs, int top) {
  int rc;
  if ((uint64_t)n_pairs * 2 > rd_left(r)) return rd_truncated(r);
  memcpy(out, s->defaults, s->size);
  uint32_t seen = 0, next = 0;
  for (uint32_t i = 0; i < n_pairs; i++)
    if ((rc = rd_pair(r, s, out, top, &seen, &next))) return rc;
  if ((rc = rd_missing(r, s, seen))) return rc;
  if (s->check && (rc = s->check(out))) return rd_fail(r, rc, "%s", fr_last_error());
  return 0;
}

/* ------------------------------------------------------------- envelope */

/* Reads the value of "v" or "t" into *version / *type. */
static int rd_envelope_value(rd_t *r, uint64_t key, uint64_t *version, proto_type_t *type) {
  mpv_t v;
  int rc = rd_value(r, &v);
  if (rc) return rc;
  if (key == KEY_V) {
    if (v.kind != K_UINT && v.kind != K_INT) return rd_type_error(r, "integer version", &v);
    if (v.kind == K_INT || v.u < PROTO_VERSION_MIN || v.u > PROTO_VERSION)
      return rd_fail(r, FR_EVERSION, "protocol version %lld is not in [%d, %d]",
                     v.kind == K_INT ? (long long)v.i : (long long)v.u, PROTO_VERSION_MIN, PROTO_VERSION);
    *version = v.u;
    return 0;
  }
  if (v.kind != K_STR) return rd_type_error(r, "string type", &v);
  if ((rc = rd_need_payload(r, &v))) return rc;
  *type = proto_type_from_name((const char *)v.ptr, v.len);
  if (*type == PROTO_T_NONE)
    return rd_fail(r, FR_EPROTO, "unknown message type \"%.*s\"", (int)FR_MIN(v.len, 32u), (const char *)v.ptr);
  return 0;
}

/* Finds "v" and "t" anywhere in the top map (keys in any order). */
static int rd_envelope_scan(rd_t *r, uint32_t n_pairs, uint64_t *version, proto_type_t *type) {
  int seen_v = 0, seen_t = 0, rc;
  for (uint32_t i = 0; i < n_pairs; i++) {
    uint64_t key;
    mpv_t v;
    if ((rc = rd_key(r, &key))) return rc;
    if (key == KEY_V || key == KEY_T) {
      int *seen = key == KEY_V ? &seen_v : &seen_t;
      if (*seen) return rd_fail(r, FR_EPROTO, "duplicate key \"%c\"", (char)key);
      *seen = 1;
      if ((rc = rd_envelope_value(r, key, version, type))) return rc;
      continue;
    }
    if ((rc = rd_value(r, &v)) || (rc = rd_skip_value(r, &v))) return rc;
  }
  if (!seen_v) return rd_fail(r, FR_EPROTO, "missing version key \"v\"");
  if (!seen_t) return rd_fail(r, FR_EPROTO, "missing type key \"t\"");
  return 0;
}

/* Reads the envelope; *top says how the body decoder treats "v" / "t". The
 * fast path: "v" then "t" as the first two keys. */
static int rd_envelope(rd_t *r, uint32_t *n_pairs, proto_type_t *type, uint64_t *version, int *top) {
  const uint8_t *start = r->p;
  uint64_t key;
  int rc;
  if (*n_pairs >= 2) {
    if ((rc = rd_key(r, &key))) return rc;
    if (key == KEY_V) {
      if ((rc = rd_envelope_value(r, key, version, type))) return rc;
      if ((rc = rd_key(r, &key))) return rc;
      if (key == KEY_T) {
        if ((rc = rd_envelope_value(r, key, version, type))) return rc;
        *n_pairs -= 2;
        *top = 1;
        return 0;
      }
    }
  }
  r->p = start;
  if ((rc = rd_envelope_scan(r, *n_pairs, version, type))) return rc;
  r->p = start;
  *top = 2;
  return 0;
}

int proto_msg_decode(proto_msg_t *m, const void *data, size_t len, uint32_t accept) {
  rd_t r = {.p = data, .end = (const uint8_t *)data + len, .arena = &m->arena, .msg = "message"};
  proto_type_t type = PROTO_T_NONE;
  mpv_t v;
  int top, rc;
  m->type = PROTO_T_NONE;
  arena_reset(&m->arena);
  if (len > PROTO_MAX_MSG_BYTES)
    return rd_fail(&r, FR_ETOOBIG, "%zu bytes exceed the limit of %u", len, PROTO_MAX_MSG_BYTES);
  if ((rc = rd_value(&r, &v))) return rc;
  if (v.kind != K_MAP) return rd_type_error(&r, "map", &v);
  uint32_t n_pairs = v.len;
  uint64_t version = 0;
  if ((rc = rd_envelope(&r, &n_pairs, &type, &version, &top))) return rc;
  if (type >= 32 || !(accept & PROTO_MASK(type)))
    return rd_fail(&r, FR_EPROTO, "unexpected message type \"%s\"", proto_type_name(type));
  if (version < proto_type_version(type))
    return rd_fail(&r, FR_EVERSION, "\"%s\" needs protocol version %u, got %llu", proto_type_name(type),
                   proto_type_version(type), (unsigned long long)version);
  const proto_schema_t *s = proto__schema(type);
  r.msg = s->name;
  if ((rc = rd_obj(&r, s, &m->u, n_pairs, top))) return rc;
  if (r.p != r.end) return rd_fail(&r, FR_EPROTO, "%zu trailing bytes", rd_left(&r));
  m->type = type;
  return 0;
}

/* -------------------------------------------------------------- encoder */

typedef struct {
  proto_buf_t *b;
  const char *msg;
  int depth;
  const char *path[RD_MAX_DEPTH];
} wr_t;

__attribute__((format(printf, 3, 4))) static int wr_fail(const wr_t *w, int err, const char *fmt, ...) {
  char what[256], where[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  size_t n = (size_t)snprintf(where, sizeof where, "%s", w->msg);
  for (int d = 0; d < w->depth && n < sizeof where; d++)
    n += (size_t)snprintf(where + n, sizeof where - n, ".%s", w->path[d]);
  return fr_errorf(err, "proto: encode %s: %s", where, what);
}


static inline uint32_t get_u32(const uint8_t *in, uint16_t off) {
  uint32_t n;
  memcpy(&n, in + off, 4);
  return n;
}
static inline const void *get_ptr(const uint8_t *in, uint16_t off) {
  const void *p;
  memcpy(&p, in + off, sizeof p);
  return p;
}

/* Whether the encoder writes field f of in (def: the defaults). */
static int field_has_content(const proto_field_t *f, const uint8_t *in, const uint8_t *def);

static inline int field_present(const proto_field_t *f, const uint8_t *in, const uint8_t *def) {
  if (f->flags & PF_REQ) return 1;
  return field_has_content(f, in, def);
}

/* Whether a nested object holds anything but defaults (its required
 * fields count only when they differ from the default too). */
static int obj_has_content(const proto_schema_t *s, const uint8_t *in) {
  for (uint32_t i = 0; i < s->n_fields; i++)
    if (field_has_content(&s->fields[i], in, s->defaults)) return 1;
  return 0;
}

static int field_has_content(const proto_field_t *f, const uint8_t *in, const uint8_t *def) {
  if (f->flags & PF_HAS) return *(const bool *)(in + f->off_n);
  switch (f->type) {
  case PF_STR: case PF_TEXT: return get_ptr(in, f->off) != NULL;
  case PF_I32S: case PF_U32S: case PF_F32S: case PF_F32BIN: case PF_STRS: case PF_OBJS:
    return get_u32(in, f->off_n) != 0;
  case PF_OBJ: return obj_has_content(f->sub, in + f->off);
  case PF_U64: {
    uint64_t x, y;
    memcpy(&x, in + f->off, 8);
    memcpy(&y, def + f->off, 8);
    return x != y;
  }
  case PF_BOOL: return *(const bool *)(in + f->off) != *(const bool *)(def + f->off);
  default: return get_u32(in, f->off) != get_u32(def, f->off); /* 4-byte scalars, enums (bits) */
  }
}

static int wr_obj(wr_t *w, const proto_schema_t *s, const uint8_t *in, proto_type_t top, uint32_t *n_written);

/* Array data must exist when the count says so; counts obey the limit. */
static int wr_array_check(wr_t *w, const proto_field_t *f, const uint8_t *in, uint32_t *n, const void **data) {
  *n = get_u32(in, f->off_n);
  *data = get_ptr(in, f->off);
  if (*n > f->max) return wr_fail(w, FR_ETOOBIG, "%u elements exceed the limit of %u", *n, f->max);
  if (*n && !*data) return wr_fail(w, FR_EPROTO, "%u elements but no data", *n);
  return 0;
}

static int wr_ints(wr_t *w, const proto_field_t *f, const uint8_t *in) {
  uint32_t n;
  const void *data;
  int rc = wr_array_check(w, f, in, &n, &data);
  if (rc) return rc;
  uint8_t *p = buf_reserve(w->b, 5 + (size_t)n * 9), *p0 = p;
  p = put_arr_head(p, n);
  if (f->type == PF_U32S) {
    const uint32_t *a = data;
    for (uint32_t i = 0; i < n; i++) p = put_uint(p, a[i]);
  } else if (f->type == PF_I32S) {
    const int32_t *a = data;
    for (uint32_t i = 0; i < n; i++) p = put_int(p, a[i]);
  } else {
    const float *a = data;
    for (uint32_t i = 0; i < n; i++) p = put_f32(p, a[i]);
  }
  w->b->len += (size_t)(p - p0);
  return 0;
}

static int wr_f32bin(wr_t *w, const proto_field_t *f, const uint8_t *in) {
  uint32_t n;
  const void *data;
  int rc = wr_array_check(w, f, in, &n, &data);
  if (rc) return rc;
  uint8_t *p = buf_reserve(w->b, 5 + (size_t)n * 4), *p0 = p;
  p = put_bin_head(p, n * 4);
  const float *a = data;
  for (uint32_t i = 0; i < n; i++) {
    uint32_t bits;
    memcpy(&bits, &a[i], 4);
    p[0] = (uint8_t)bits;
    p[1] = (uint8_t)(bits >> 8);
    p[2] = (uint8_t)(bits >> 16);
    p[3] = (uint8_t)(bits >> 24);
    p += 4;
  }
  w->b->len += (size_t)(p - p0);
  return 0;
}

static int wr_string(wr_t *w, const char *s, size_t n, uint32_t max) {
  if (!s) return wr_fail(w, FR_EPROTO, "required string is NULL");
  if (n > max) return wr_fail(w, FR_ETOOBIG, "string of %zu bytes exceeds the limit of %u", n, max);
  uint8_t *p = buf_reserve(w->b, 5 + n);
  w->b->len += (size_t)(put_str(p, s, (uint32_t)n) - p);
  return 0;
}

static int wr_strs(wr_t *w, const proto_field_t *f, const uint8_t *in) {
  uint32_t n;
  const void *data;
  int rc = wr_array_check(w, f, in, &n, &data);
  if (rc) return rc;
  uint8_t *p = buf_reserve(w->b, 5);
  w->b->len += (size_t)(put_arr_head(p, n) - p);
  char *const *a = data;
  for (uint32_t i = 0; i < n; i++)
    if ((rc = wr_string(w, a[i], a[i] ? strlen(a[i]) : 0, PROTO_MAX_STR))) return rc;
  return 0;
}

static int wr_objs(wr_t *w, const proto_field_t *f, const uint8_t *in) {
  uint32_t n;
  const void *data;
  int rc = wr_array_check(w, f, in, &n, &data);
  if (rc) return rc;
  uint8_t *p = buf_reserve(w->b, 5);
  w->b->len += (size_t)(put_arr_head(p, n) - p);
  for (uint32_t i = 0; i < n; i++)
    if ((rc = wr_obj(w, f->sub, (const uint8_t *)data + (size_t)i * f->sub->size, PROTO_T_NONE, NULL))) return rc;
  return 0;
}

static int wr_enum(wr_t *w, const proto_field_t *f, const uint8_t *in) {
  int e;
  memcpy(&e, in + f->off, sizeof e);
  if (e < 1 || (uint32_t)e >= f->max) return wr_fail(w, FR_EPROTO, "enum value %d out of range", e);
  return wr_string(w, f->names[e], strlen(f->names[e]), PROTO_MAX_STR);
}

static int wr_text(wr_t *w, const proto_field_t *f, const uint8_t *in) {
  const char *s = get_ptr(in, f->off);
  uint32_t n = get_u32(in, f->off_n);
  return wr_string(w, s, (n == 0 && s) ? strlen(s) : n, f->max);
}

/* Writes the value of field f (its key is written). */
static int wr_field(wr_t *w, const proto_field_t *f, const uint8_t *in) {
  uint8_t *p = buf_reserve(w->b, 16), *p0 = p;
  switch (f->type) {
  case PF_U32: p = put_uint(p, get_u32(in, f->off)); break;
  case PF_U64: {
    uint64_t u;
    memcpy(&u, in + f->off, 8);
    p = put_uint(p, u);
    break;
  }
  case PF_I32: p = put_int(p, (int32_t)get_u32(in, f->off)); break;
  case PF_F32: {
    float x;
    memcpy(&x, in + f->off, 4);
    p = put_f32(p, x);
    break;
  }
  case PF_BOOL: *p++ = *(const bool *)(in + f->off) ? 0xc3 : 0xc2; break;
  case PF_ENUM: return wr_enum(w, f, in);
  case PF_STR: {
    const char *s = get_ptr(in, f->off);
    return wr_string(w, s, s ? strlen(s) : 0, f->max);
  }
  case PF_TEXT: return wr_text(w, f, in);
  case PF_I32S: case PF_U32S: case PF_F32S: return wr_ints(w, f, in);
  case PF_F32BIN: return wr_f32bin(w, f, in);
  case PF_STRS: return wr_strs(w, f, in);
  case PF_OBJS: return wr_objs(w, f, in);
  default: return wr_fail(w, FR_EPROTO, "bad schema");
  }
  w->b->len += (size_t)(p - p0);
  return 0;
}

/* Writes a nested object under its key; leaves it out when it holds only
 * defaults (unless required or flagged present). *n counts written keys. */
static int wr_nested(wr_t *w, const proto_field_t *f, const uint8_t *in, uint32_t *n) {
  if (!(f->flags & (PF_REQ | PF_HAS)) && !obj_has_content(f->sub, in + f->off)) {
    w->b->len -= 1 + (size_t)f->klen; /* take back the key */
    return 0;
  }
  (*n)++;
  return wr_obj(w, f->sub, in + f->off, PROTO_T_NONE, NULL);
}

/* Writes one object as a map; top != NONE adds the envelope. Every schema
 * has <= 13 fields, so the map header is one byte, patched at the end. */
static int wr_obj(wr_t *w, const proto_schema_t *s, const uint8_t *in, proto_type_t top, uint32_t *n_written) {
  int rc;
  if (s->check && (rc = s->check(in))) return wr_fail(w, rc, "%s", fr_last_error());
  const char *tname = top ? proto_type_name(top) : NULL;
  size_t head = w->b->len;
  uint8_t *p = buf_reserve(w->b, 16 + (tname ? strlen(tname) : 0)), *p0 = p;
  uint32_t n = 0;
  p++; /* fixmap, patched below */
  if (top) {
    p = put_str(p, "v", 1);
    p = put_uint(p, proto_type_version(top));
    p = put_str(p, "t", 1);
    p = put_str(p, tname, (uint32_t)strlen(tname));
    n = 2;
  }
  w->b->len += (size_t)(p - p0);
  for (uint32_t i = 0; i < s->n_fields; i++) {
    const proto_field_t *f = &s->fields[i];
    if (!field_present(f, in, s->defaults)) continue;
    p = buf_reserve(w->b, 8);
    uint64_t kenc = (f->kpack & 0xffffffffffffffull) << 8 | (0xa0u | f->klen);
    memcpy(p, &kenc, 8); /* header and up to 7 key bytes, little-endian */
    w->b->len += 1 + (size_t)f->klen;
    if (w->depth >= RD_MAX_DEPTH) return wr_fail(w, FR_EPROTO, "nested too deep");
    w->path[w->depth++] = f->key;
    rc = f->type == PF_OBJ ? wr_nested(w, f, in, &n) : (n++, wr_field(w, f, in));
    if (rc) return rc;
    w->depth--;
  }
  FR_ASSERT(n < 16);
  w->b->data[head] = (uint8_t)(0x80 | n);
  if (n_written) *n_written = n - (top ? 2 : 0);
  return 0;
}

int proto_encode(proto_buf_t *b, proto_type_t type, const void *body) {
  const proto_schema_t *s = proto__schema(type);
  b->len = 0;
  if (!s) return fr_errorf(FR_EPROTO, "proto: encode: unknown message type %d", (int)type);
  wr_t w = {.b = b, .msg = s->name};
  int rc = wr_obj(&w, s, body, type, NULL);
  if (rc) {
    b->len = 0;
    return rc;
  }
  if (b->len > PROTO_MAX_MSG_BYTES) {
    b->len = 0;
    return fr_errorf(FR_ETOOBIG, "proto: encode %s: message exceeds %u bytes", s->name, PROTO_MAX_MSG_BYTES);
  }
  return 0;
}

int proto_msg_encode(proto_buf_t *b, const proto_msg_t *m) { return proto_encode(b, m->type, &m->u); }
