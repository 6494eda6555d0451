/* proto_encode.c - the schema-driven encoder of every message, on msgpack-c:
 * the schema tables (proto_msgs.c) are walked and each value goes through
 * msgpack-c's packer (msgpack/pack_template.h, compiled here so that it
 * appends straight into a proto_buf_t). */
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "proto/proto.h"
#include "proto/proto_schema.h"

/* Keys are matched as packed little-endian words; bins hold little-endian
 * floats, written and read as they lie in memory. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the codec assumes a little-endian host");

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

/* -------------------------------------------------------------- encoder */

/* Appends n bytes to the buffer. */
static inline int wr_append(proto_buf_t *b, const void *p, size_t n) {
  if (b->cap - b->len < n) buf_grow(b, n);
  memcpy(b->data + b->len, p, n);
  b->len += n;
  return 0;
}

/* msgpack-c's packer: the code behind msgpack_pack_* (pack_template.h),
 * compiled here as wr_pack_* to append to a proto_buf_t directly. The
 * public msgpack_packer calls its write callback through a pointer for
 * every header and scalar, which makes a step descriptor's encode twice as
 * slow (docs/bench/proto.md). */
#define msgpack_pack_inline_func(name) static inline int wr_pack##name
#define msgpack_pack_inline_func_cint(name) static inline int wr_pack##name
#define msgpack_pack_inline_func_fixint(name) static inline int wr_pack_fix##name
#define msgpack_pack_user proto_buf_t *
#define msgpack_pack_append_buffer(user, buf, len) return wr_append(user, buf, len)
#include "msgpack/pack_template.h"

static inline void wr_pack_str_with_body(proto_buf_t *b, const void *s, size_t n) {
  wr_pack_str(b, n);
  wr_pack_str_body(b, s, n);
}

#define WR_MAX_DEPTH 8

typedef struct {
  proto_buf_t *b;
  const char *msg;
  int depth;
  const char *path[WR_MAX_DEPTH];
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

static int wr_obj(wr_t *w, const proto_schema_t *s, const uint8_t *in, proto_type_t top);

/* Array data must exist when the count says so; counts obey the limit. */
static int wr_array_check(wr_t *w, const proto_field_t *f, const uint8_t *in, uint32_t *n, const void **data) {
  *n = get_u32(in, f->off_n);
  *data = get_ptr(in, f->off);
  if (*n > f->max) return wr_fail(w, FR_ETOOBIG, "%u elements exceed the limit of %u", *n, f->max);
  if (*n && !*data) return wr_fail(w, FR_EPROTO, "%u elements but no data", *n);
  return 0;
}

/* Arrays of numbers: the packer picks the shortest encoding of each. */
static int wr_nums(wr_t *w, const proto_field_t *f, const uint8_t *in) {
  uint32_t n;
  const void *data;
  int rc = wr_array_check(w, f, in, &n, &data);
  if (rc) return rc;
  wr_pack_array(w->b, n);
  if (f->type == PF_U32S) {
    const uint32_t *a = data;
    for (uint32_t i = 0; i < n; i++) wr_pack_uint32(w->b, a[i]);
  } else if (f->type == PF_I32S) {
    const int32_t *a = data;
    for (uint32_t i = 0; i < n; i++) wr_pack_int32(w->b, a[i]);
  } else {
    const float *a = data;
    for (uint32_t i = 0; i < n; i++) wr_pack_float(w->b, a[i]);
  }
  return 0;
}

static int wr_f32bin(wr_t *w, const proto_field_t *f, const uint8_t *in) {
  uint32_t n;
  const void *data;
  int rc = wr_array_check(w, f, in, &n, &data);
  if (rc) return rc;
  wr_pack_bin(w->b, (size_t)n * 4);
  if (n) wr_pack_bin_body(w->b, data, (size_t)n * 4); /* little-endian, as in memory */
  return 0;
}

static int wr_string(wr_t *w, const char *s, size_t n, uint32_t max) {
  if (!s) return wr_fail(w, FR_EPROTO, "required string is NULL");
  if (n > max) return wr_fail(w, FR_ETOOBIG, "string of %zu bytes exceeds the limit of %u", n, max);
  wr_pack_str_with_body(w->b, s, n);
  return 0;
}

static int wr_strs(wr_t *w, const proto_field_t *f, const uint8_t *in) {
  uint32_t n;
  const void *data;
  int rc = wr_array_check(w, f, in, &n, &data);
  if (rc) return rc;
  wr_pack_array(w->b, n);
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
  wr_pack_array(w->b, n);
  for (uint32_t i = 0; i < n; i++)
    if ((rc = wr_obj(w, f->sub, (const uint8_t *)data + (size_t)i * f->sub->size, PROTO_T_NONE))) return rc;
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
  switch (f->type) {
  case PF_U32: wr_pack_uint32(w->b, get_u32(in, f->off)); return 0;
  case PF_U64: {
    uint64_t u;
    memcpy(&u, in + f->off, 8);
    wr_pack_uint64(w->b, u);
    return 0;
  }
  case PF_I32: wr_pack_int32(w->b, (int32_t)get_u32(in, f->off)); return 0;
  case PF_F32: {
    float x;
    memcpy(&x, in + f->off, 4);
    wr_pack_float(w->b, x);
    return 0;
  }
  case PF_BOOL:
    if (*(const bool *)(in + f->off)) wr_pack_true(w->b);
    else wr_pack_false(w->b);
    return 0;
  case PF_ENUM: return wr_enum(w, f, in);
  case PF_STR: {
    const char *s = get_ptr(in, f->off);
    return wr_string(w, s, s ? strlen(s) : 0, f->max);
  }
  case PF_TEXT: return wr_text(w, f, in);
  case PF_I32S: case PF_U32S: case PF_F32S: return wr_nums(w, f, in);
  case PF_F32BIN: return wr_f32bin(w, f, in);
  case PF_STRS: return wr_strs(w, f, in);
  case PF_OBJ: return wr_obj(w, f->sub, in + f->off, PROTO_T_NONE);
  case PF_OBJS: return wr_objs(w, f, in);
  default: return wr_fail(w, FR_EPROTO, "bad schema");
  }
}

/* Writes one object as a map of the fields that differ from their default
 * (and the required ones); top != NONE adds the envelope. */
static int wr_obj(wr_t *w, const proto_schema_t *s, const uint8_t *in, proto_type_t top) {
  int rc;
  if (s->check && (rc = s->check(in))) return wr_fail(w, rc, "%s", fr_last_error());
  uint32_t present = 0, n = top ? 2 : 0;
  for (uint32_t i = 0; i < s->n_fields; i++)
    if (field_present(&s->fields[i], in, s->defaults)) {
      present |= 1u << i;
      n++;
    }
  wr_pack_map(w->b, n);
  if (top) {
    const char *tname = proto_type_name(top);
    wr_pack_str_with_body(w->b, "v", 1);
    wr_pack_uint32(w->b, proto_type_version(top));
    wr_pack_str_with_body(w->b, "t", 1);
    wr_pack_str_with_body(w->b, tname, strlen(tname));
  }
  for (uint32_t i = 0; i < s->n_fields; i++) {
    if (!(present & (1u << i))) continue;
    const proto_field_t *f = &s->fields[i];
    wr_pack_str_with_body(w->b, f->key, f->klen);
    if (w->depth >= WR_MAX_DEPTH) return wr_fail(w, FR_EPROTO, "nested too deep");
    w->path[w->depth++] = f->key;
    if ((rc = wr_field(w, f, in))) return rc;
    w->depth--;
  }
  return 0;
}

int proto_encode(proto_buf_t *b, proto_type_t type, const void *body) {
  const proto_schema_t *s = proto__schema(type);
  b->len = 0;
  if (!s) return fr_errorf(FR_EPROTO, "proto: encode: unknown message type %d", (int)type);
  wr_t w = {.b = b, .msg = s->name};
  int rc = wr_obj(&w, s, body, type);
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
