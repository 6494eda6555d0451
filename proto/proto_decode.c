/* proto_decode.c - the schema-driven strict decoder of every message, on
 * msgpack-c. It runs msgpack-c's unpack state machine (msgpack/unpack_template.h,
 * the parser behind msgpack_unpack), compiled here with callbacks that
 * check every value against the schema as it arrives and store it straight
 * into the message struct, in the message's arena. There is no object tree:
 * msgpack-c's own callbacks would allocate a claimed element count (up to
 * 2^32-1 of 24 bytes) before a single element is there; ours check a count
 * against its limit and the bytes left first. Values of unknown keys never
 * reach the parser: the callback for such a key stops it, skip_value() steps
 * over the value (no recursion, no allocation, any depth) and the parser
 * resumes behind it. The decoder stays one file: its callbacks are inlined
 * into the parser's loop, which is the codec's hot path (docs/bench/proto.md). */
#include <msgpack.h>
#include <stdarg.h>
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

/* ------------------------------------------------------ decoder: state */

typedef enum { K_NIL, K_BOOL, K_UINT, K_INT, K_F32, K_F64, K_STR, K_BIN, K_EXT, K_ARR, K_MAP } kind_t;

static const char *const kind_names[] = {"nil", "bool", "integer", "integer", "float", "float",
                                         "string", "binary", "extension", "array", "map"};

/* One value as the parser hands it over. ptr is NULL for a str / bin /
 * ext whose bytes are not all there (a truncated message being diagnosed):
 * consumers check the length against its limit first (FR_ETOOBIG for a
 * huge claim), then rd_need_payload (FR_ETRUNCATED). */
typedef struct {
  kind_t kind;
  uint32_t len;       /* str / bin / ext bytes, array elements, map pairs */
  uint64_t u;         /* K_UINT, K_BOOL */
  int64_t i;          /* K_INT (negative) */
  double f;           /* K_F32, K_F64 */
  const uint8_t *ptr; /* str / bin / ext payload */
} mpv_t;

#define DEC_MAX_DEPTH 8

/* One open map or array, outermost first. */
typedef struct {
  const proto_schema_t *s; /* map: its schema; NULL: the top map before its type is known */
  const proto_field_t *f;  /* map: the field whose value comes next, NULL: a key comes next;
                            * array: the array's field */
  uint8_t *out;            /* map: the struct; array: its elements */
  uint32_t i;              /* array: the element being read */
  uint32_t seen, next;     /* map: fields seen (a bit each), the field expected next */
  bool is_map;
} frame_t;

/* How the top map's envelope is read: "v", "t" as its first keys (FAST,
 * one pass), or anywhere: a SCAN pass that reads only them, then a BODY
 * pass that skips them. */
typedef enum { DEC_FAST, DEC_SCAN, DEC_BODY } dec_mode_t;

/* The parser's user data: what the callbacks know. */
typedef struct {
  const uint8_t *data;
  size_t len;
  size_t pos;          /* where the parser was after the last str / bin / ext ... */
  uint32_t nvals;      /* ... plus the headers of this many values since (dec_where) */
  proto_arena_t *arena;
  void *body;          /* the message struct */
  uint32_t accept;     /* PROTO_MASK bits */
  const char *msg;     /* message name for errors */
  dec_mode_t mode;
  bool have_v, have_t;
  uint64_t version;
  proto_type_t type;
  uint32_t n_top;      /* pairs in the message map */
  const char *dup;     /* dup_key: the key seen twice ... */
  const char *dup_in;  /* ... and its object's name, NULL for "v" / "t" */
  int resync;          /* synthetic values to let through (dec_skip) */
  int err;             /* the error behind DEC_ERR */
  int depth;
  frame_t fr[DEC_MAX_DEPTH];
} dec_t;

/* What the callbacks return to stop the parser (msgpack-c's own codes are
 * -1 and -2). */
enum {
  DEC_ERR = -100,     /* d->err says what */
  DEC_SKIP = -101,    /* the key just read is unknown: skip its value */
  DEC_RESTART = -102, /* the envelope is not first: scan for it */
};

/* Pseudo fields of a map frame: the envelope keys of the top map, and a
 * key seen twice (the error comes with its value, as it always did: a
 * value cut short is a truncated message first). Their type is no
 * proto_ftype_t, so the callbacks' fast paths leave them alone. */
#define PF_PSEUDO 0xff
static const proto_field_t env_v = {.key = "v", .klen = 1, .type = PF_PSEUDO};
static const proto_field_t env_t = {.key = "t", .klen = 1, .type = PF_PSEUDO};
static const proto_field_t dup_key = {.key = "", .type = PF_PSEUDO};

#define KEY_NONE (~(uint64_t)0) /* matches no field: keys over 7 bytes */
#define KEY_V PROTO_KPACK("v")
#define KEY_T PROTO_KPACK("t")

/* Formats "<what> at <msg>.<key>[i].<key>" as the thread's error detail;
 * returns DEC_ERR, with the code in d->err. */
__attribute__((format(printf, 3, 4))) static int dec_fail(dec_t *d, int err, const char *fmt, ...) {
  char what[256], where[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  size_t n = (size_t)snprintf(where, sizeof where, "%s", d->msg);
  for (int k = 0; k < d->depth && n < sizeof where; k++) {
    const frame_t *F = &d->fr[k];
    if (!F->is_map)
      n += (size_t)snprintf(where + n, sizeof where - n, "[%u]", F->i);
    else if (F->f && F->f->type != PF_PSEUDO)
      n += (size_t)snprintf(where + n, sizeof where - n, ".%s", F->f->key);
  }
  d->err = fr_errorf(err, "proto: %s at %s", what, where);
  return DEC_ERR;
}

static int rd_truncated(dec_t *d) { return dec_fail(d, FR_ETRUNCATED, "message truncated"); }

static int rd_type_error(dec_t *d, const char *want, const mpv_t *v) {
  return dec_fail(d, FR_EPROTO, "expected %s, got %s", want, kind_names[v->kind]);
}

static inline int rd_need_payload(dec_t *d, const mpv_t *v) { return v->ptr ? 0 : rd_truncated(d); }

/* ------------------------------------------------- decoder: skipping */

/* The header of the value at p (left bytes there): its length, the
 * payload bytes after it and the values nested in it. 0, or -1 when the
 * header is cut short, -2 for the byte no value starts with (0xc1). */
static int mp_head(const uint8_t *p, size_t left, size_t *head, uint64_t *payload, uint64_t *nested) {
  static const uint8_t fixed[32] = {/* 0xc0..0xdf: header bytes (0xc1: none) */
                                    1, 0, 1, 1, 2, 3, 5, 2, 3, 5, 5, 9, 2, 3, 5, 9,
                                    2, 3, 5, 9, 1, 1, 1, 1, 1, 2, 3, 5, 3, 5, 3, 5};
  uint8_t b = p[0];
  *payload = *nested = 0;
  *head = 1;
  if (b < 0x80 || b >= 0xe0) return 0; /* fixints */
  if (b < 0xc0) {                       /* fixmap, fixarray, fixstr */
    if (b < 0x90) *nested = 2u * (b & 0x0f);
    else if (b < 0xa0) *nested = b & 0x0f;
    else *payload = b & 0x1f;
    return 0;
  }
  if (b == 0xc1) return -2;
  *head = fixed[b - 0xc0];
  if (left < *head) return -1;
  uint64_t n = 0; /* the big-endian length after the type byte */
  for (size_t k = 1; k < *head; k++) n = n << 8 | p[k];
  switch (b) {
  case 0xc4: case 0xc5: case 0xc6: case 0xd9: case 0xda: case 0xdb: *payload = n; break;
  case 0xc7: case 0xc8: case 0xc9: *payload = n + 1; break; /* + the ext type */
  case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8: *payload = (1u << (b - 0xd4)) + 1; break;
  case 0xdc: case 0xdd: *nested = n; break;
  case 0xde: case 0xdf: *nested = 2 * n; break;
  default: break; /* scalars: all in the header */
  }
  return 0;
}

/* Steps over the value at *at without recursion or allocation: every
 * value still to come needs at least one byte, so a count larger than the
 * bytes left is a truncated message, whatever a header claims. */
static int skip_value(dec_t *d, size_t *at) {
  uint64_t pending = 1;
  size_t i = *at;
  while (pending) {
    if (pending > d->len - i) return rd_truncated(d);
    size_t head;
    uint64_t payload, nested;
    int rc = mp_head(d->data + i, d->len - i, &head, &payload, &nested);
    if (rc == -2) return dec_fail(d, FR_EPROTO, "invalid msgpack byte 0x%02x", d->data[i]);
    if (rc || payload > d->len - i - head) return rd_truncated(d);
    i += head + (size_t)payload;
    pending += nested - 1;
  }
  *at = i;
  return 0;
}

/* Where the header of the value the parser is at begins: pos, then the
 * headers of the nvals values read since (scalars, container headers). */
static size_t dec_where(dec_t *d) {
  size_t i = d->pos, head;
  uint64_t payload, nested;
  for (; d->nvals > 0 && i < d->len; d->nvals--) {
    mp_head(d->data + i, d->len - i, &head, &payload, &nested);
    i += head + (size_t)payload;
  }
  d->nvals = 0;
  return d->pos = FR_MIN(i, d->len);
}

/* Whether the bytes after the header of the container that starts now
 * hold `need` values of a byte at least: FR_ETRUNCATED if not. Headers are
 * 1..9 bytes, so the bounds from pos mostly decide without dec_where. */
static int dec_room(dec_t *d, uint64_t need) {
  size_t most = d->len - FR_MIN(d->len, d->pos + 1), least = d->len - FR_MIN(d->len, d->pos + 9 * (size_t)d->nvals + 5);
  if (need <= least) return 0;
  if (need <= most) {
    size_t at = dec_where(d), head;
    uint64_t payload, nested;
    if (at < d->len && !mp_head(d->data + at, d->len - at, &head, &payload, &nested) && need <= d->len - at - head)
      return 0;
  }
  return rd_truncated(d);
}

/* ---------------------------------------------------- decoder: values */

static int rd_u64(dec_t *d, const mpv_t *v, uint64_t max, uint64_t *out) {
  if (v->kind == K_INT) return dec_fail(d, FR_EPROTO, "negative value %lld out of range", (long long)v->i);
  if (v->kind != K_UINT) return rd_type_error(d, "integer", v);
  if (v->u > max) return dec_fail(d, FR_EPROTO, "value %llu out of range", (unsigned long long)v->u);
  *out = v->u;
  return 0;
}

static int rd_i32(dec_t *d, const mpv_t *v, int32_t *out) {
  if (v->kind == K_UINT) {
    if (v->u > INT32_MAX) return dec_fail(d, FR_EPROTO, "value %llu out of range", (unsigned long long)v->u);
    *out = (int32_t)v->u;
    return 0;
  }
  if (v->kind != K_INT) return rd_type_error(d, "integer", v);
  if (v->i < INT32_MIN) return dec_fail(d, FR_EPROTO, "value %lld out of range", (long long)v->i);
  *out = (int32_t)v->i;
  return 0;
}

static int rd_f32(dec_t *d, const mpv_t *v, float *out) {
  switch (v->kind) {
  case K_F32: case K_F64: *out = (float)v->f; return 0;
  case K_UINT: *out = (float)v->u; return 0;
  case K_INT: *out = (float)v->i; return 0;
  default: return rd_type_error(d, "number", v);
  }
}

/* Copies a str payload into the arena, NUL-terminated. */
static int rd_str(dec_t *d, const mpv_t *v, uint32_t max, int allow_nul, char **out) {
  if (v->kind != K_STR) return rd_type_error(d, "string", v);
  if (v->len > max) return dec_fail(d, FR_ETOOBIG, "string of %u bytes exceeds the limit of %u", v->len, max);
  int rc = rd_need_payload(d, v);
  if (rc) return rc;
  if (!allow_nul && v->len && memchr(v->ptr, 0, v->len)) return dec_fail(d, FR_EPROTO, "string holds a NUL byte");
  char *s = arena_alloc(d->arena, (size_t)v->len + 1);
  if (v->len) memcpy(s, v->ptr, v->len);
  s[v->len] = 0;
  *out = s;
  return 0;
}

static int rd_f32bin(dec_t *d, const mpv_t *v, const proto_field_t *f, uint8_t *out) {
  if (v->kind != K_BIN) return rd_type_error(d, "binary", v);
  uint32_t n = v->len / 4;
  if (n > f->max || (n == f->max && v->len % 4))
    return dec_fail(d, FR_ETOOBIG, "%u bytes of floats exceed the limit of %u floats", v->len, f->max);
  int rc = rd_need_payload(d, v);
  if (rc) return rc;
  if (v->len % 4) return dec_fail(d, FR_EPROTO, "binary of %u bytes is not a float32 array", v->len);
  float *a = n ? arena_alloc(d->arena, v->len) : NULL;
  if (n) memcpy(a, v->ptr, v->len); /* little-endian on the wire */
  memcpy(out + f->off, &a, sizeof a);
  memcpy(out + f->off_n, &n, 4);
  return 0;
}

static int rd_enum(dec_t *d, const mpv_t *v, const proto_field_t *f, uint8_t *out) {
  if (v->kind != K_STR) return rd_type_error(d, "string", v);
  if (v->len > PROTO_MAX_STR) return dec_fail(d, FR_ETOOBIG, "string of %u bytes is too long", v->len);
  int rc = rd_need_payload(d, v);
  if (rc) return rc;
  for (uint32_t i = 1; i < f->max; i++) {
    if (strlen(f->names[i]) == v->len && memcmp(f->names[i], v->ptr, v->len) == 0) {
      int e = (int)i;
      memcpy(out + f->off, &e, sizeof e);
      return 0;
    }
  }
  return dec_fail(d, FR_EPROTO, "unknown value \"%.*s\"", (int)FR_MIN(v->len, 32u), (const char *)v->ptr);
}

/* Decodes a value that is no container into field f of out; a field that
 * takes a container gets a type error. */
static int rd_field(dec_t *d, const proto_field_t *f, const mpv_t *v, uint8_t *out) {
  uint64_t u = 0;
  int rc;
  switch (f->type) {
  case PF_U32:
    if ((rc = rd_u64(d, v, UINT32_MAX, &u))) return rc;
    *(uint32_t *)(out + f->off) = (uint32_t)u;
    return 0;
  case PF_U64: return rd_u64(d, v, UINT64_MAX, (uint64_t *)(out + f->off));
  case PF_I32: return rd_i32(d, v, (int32_t *)(out + f->off));
  case PF_F32: return rd_f32(d, v, (float *)(out + f->off));
  case PF_BOOL:
    if (v->kind != K_BOOL) return rd_type_error(d, "boolean", v);
    *(bool *)(out + f->off) = v->u != 0;
    return 0;
  case PF_ENUM: return rd_enum(d, v, f, out);
  case PF_STR: return rd_str(d, v, f->max, 0, (char **)(out + f->off));
  case PF_TEXT:
    if ((rc = rd_str(d, v, f->max, 1, (char **)(out + f->off)))) return rc;
    *(uint32_t *)(out + f->off_n) = v->len;
    return 0;
  case PF_F32BIN: return rd_f32bin(d, v, f, out);
  case PF_I32S: case PF_U32S: case PF_F32S: case PF_STRS: case PF_OBJS: return rd_type_error(d, "array", v);
  case PF_OBJ: return rd_type_error(d, "map", v);
  default: return dec_fail(d, FR_EPROTO, "bad schema");
  }
}

/* Decodes element F->i of an array of scalars or strings; arrays of
 * objects take maps only. */
static int rd_element(dec_t *d, frame_t *F, const mpv_t *v) {
  uint64_t u = 0;
  int rc;
  switch (F->f->type) {
  case PF_I32S: return rd_i32(d, v, (int32_t *)F->out + F->i);
  case PF_U32S:
    if ((rc = rd_u64(d, v, UINT32_MAX, &u))) return rc;
    ((uint32_t *)F->out)[F->i] = (uint32_t)u;
    return 0;
  case PF_F32S: return rd_f32(d, v, (float *)F->out + F->i);
  case PF_STRS: return rd_str(d, v, PROTO_MAX_STR, 0, (char **)F->out + F->i);
  default: return rd_type_error(d, "map", v);
  }
}

/* ------------------------------------------- decoder: keys, envelope */

/* Packs a key's bytes as PROTO_KPACK does. */
static inline uint64_t pack_key(const uint8_t *p, const uint8_t *end, uint32_t len) {
  static const uint64_t mask[8] = {0, 0xff, 0xffff, 0xffffff, 0xffffffffull, 0xffffffffffull, 0xffffffffffffull,
                                   0xffffffffffffffull};
  if (len > 7) return KEY_NONE;
  uint64_t k = 0;
  if (len == 0) return 0;
  if (end - p >= 8) {
    memcpy(&k, p, 8); /* little-endian: bytes in order */
    k &= mask[len];
  } else {
    for (uint32_t i = 0; i < len; i++) k |= (uint64_t)p[i] << (8 * i);
  }
  return k | (uint64_t)len << 56;
}

/* Finds the field a key names: the one after the previous first (our
 * encoder writes fields in table order), else a search. -1: unknown. */
static inline int find_field(const proto_schema_t *s, uint64_t key, uint32_t next) {
  if (next < s->n_fields && s->fields[next].kpack == key) return (int)next;
  for (uint32_t i = 0; i < s->n_fields; i++)
    if (s->fields[i].kpack == key) return (int)i;
  return -1;
}

/* The type is known: checks it against accept and its version. */
static int dec_check_type(dec_t *d) {
  if (d->type >= 32 || !(d->accept & PROTO_MASK(d->type)))
    return dec_fail(d, FR_EPROTO, "unexpected message type \"%s\"", proto_type_name(d->type));
  if (d->version < proto_type_version(d->type))
    return dec_fail(d, FR_EVERSION, "\"%s\" needs protocol version %u, got %llu", proto_type_name(d->type),
                    proto_type_version(d->type), (unsigned long long)d->version);
  d->msg = proto__schema(d->type)->name;
  return 0;
}

/* The top frame takes the body's fields from now on. */
static int dec_begin_body(dec_t *d, frame_t *F) {
  F->s = proto__schema(d->type);
  F->out = d->body;
  memcpy(d->body, F->s->defaults, F->s->size);
  return 0;
}

/* Reads the value of "v" or "t". */
static int dec_envelope_value(dec_t *d, frame_t *F, const mpv_t *v) {
  int rc;
  if (F->f == &env_v) {
    if (v->kind != K_UINT && v->kind != K_INT) return rd_type_error(d, "integer version", v);
    if (v->kind == K_INT || v->u < PROTO_VERSION_MIN || v->u > PROTO_VERSION)
      return dec_fail(d, FR_EVERSION, "protocol version %lld is not in [%d, %d]",
                      v->kind == K_INT ? (long long)v->i : (long long)v->u, PROTO_VERSION_MIN, PROTO_VERSION);
    d->version = v->u;
    d->have_v = true;
    return 0;
  }
  if (v->kind != K_STR) return rd_type_error(d, "string type", v);
  if ((rc = rd_need_payload(d, v))) return rc;
  d->type = proto_type_from_name((const char *)v->ptr, v->len);
  if (d->type == PROTO_T_NONE)
    return dec_fail(d, FR_EPROTO, "unknown message type \"%.*s\"", (int)FR_MIN(v->len, 32u), (const char *)v->ptr);
  d->have_t = true;
  if (d->mode != DEC_FAST) return 0;
  if ((rc = dec_check_type(d))) return rc;
  if ((uint64_t)(d->n_top - 2) * 2 > d->len - d->pos) return rd_truncated(d); /* the body's pairs; pos: after "t" */
  return dec_begin_body(d, F);
}

/* A key seen twice: its value comes first. */
static int dec_dup(dec_t *d, frame_t *F, const char *key, const char *in) {
  d->dup = key;
  d->dup_in = in;
  F->f = &dup_key;
  return 0;
}

static int dec_dup_error(dec_t *d, frame_t *F) {
  F->f = NULL;
  if (!d->dup_in) return dec_fail(d, FR_EPROTO, "duplicate key \"%s\"", d->dup);
  return dec_fail(d, FR_EPROTO, "duplicate key \"%s\" in %s", d->dup, d->dup_in);
}

/* A key of the top map. Returns 1 when it is to be looked up in the body's
 * schema, else 0 (an envelope key: its value comes next) or DEC_*. */
static int dec_top_key(dec_t *d, frame_t *F, uint64_t key) {
  int env = key == KEY_V || key == KEY_T;
  switch (d->mode) {
  case DEC_FAST: /* "v", "t" first, then the body */
    if (d->have_v && d->have_t) return env ? dec_dup(d, F, key == KEY_V ? "v" : "t", NULL) : 1;
    if (key != (d->have_v ? KEY_T : KEY_V)) return DEC_RESTART;
    break;
  case DEC_SCAN: /* only the envelope */
    if (!env) return DEC_SKIP;
    if (key == KEY_V ? d->have_v : d->have_t) return dec_fail(d, FR_EPROTO, "duplicate key \"%c\"", (char)key);
    break;
  default: /* DEC_BODY: the envelope is read */
    return env ? DEC_SKIP : 1;
  }
  F->f = key == KEY_V ? &env_v : &env_t;
  return 0;
}

/* A map key: selects the field its value goes to. */
static int dec_key(dec_t *d, frame_t *F, const mpv_t *k) {
  if (k->kind != K_STR) return dec_fail(d, FR_EPROTO, "map key is a %s, not a string", kind_names[k->kind]);
  int rc = rd_need_payload(d, k);
  if (rc) return rc;
  uint64_t key = pack_key(k->ptr, d->data + d->len, k->len);
  if (d->depth == 1 && (rc = dec_top_key(d, F, key)) <= 0) return rc;
  int idx = find_field(F->s, key, F->next);
  if (idx < 0) return DEC_SKIP; /* unknown field: forward compatible */
  const proto_field_t *f = &F->s->fields[idx];
  if (F->seen & (1u << idx)) return dec_dup(d, F, f->key, F->s->name);
  F->seen |= 1u << idx;
  F->next = (uint32_t)idx + 1;
  F->f = f;
  return 0;
}

/* Any value but a container: a key, an envelope value, a field's value or
 * an array element, as the innermost open container expects. */
static int dec_leaf(dec_t *d, const mpv_t *v) {
  if (d->depth == 0) return rd_type_error(d, "map", v);
  frame_t *F = &d->fr[d->depth - 1];
  if (!F->is_map) return rd_element(d, F, v);
  const proto_field_t *f = F->f;
  if (!f) return dec_key(d, F, v);
  if (f == &dup_key) return dec_dup_error(d, F);
  if (f == &env_v || f == &env_t) return dec_envelope_value(d, F, v);
  if (v->kind == K_NIL) { /* nil: absent */
    if (!(f->flags & PF_REQ)) return 0;
    F->f = NULL; /* said before the field is entered */
    return dec_fail(d, FR_EPROTO, "required field \"%s\" is nil", f->key);
  }
  int rc = rd_field(d, f, v, F->out);
  if (!rc && (f->flags & PF_HAS)) *(bool *)(F->out + f->off_n) = true;
  return rc;
}

/* ------------------------------------------- decoder: containers */

/* Opens a frame for a container of field f (NULL for the message) whose
 * data is out: a map of schema s, or an array when s is NULL and f is. */
static int dec_push(dec_t *d, const proto_schema_t *s, const proto_field_t *f, uint8_t *out, bool is_map) {
  if (d->depth >= DEC_MAX_DEPTH) return dec_fail(d, FR_EPROTO, "nested too deep");
  frame_t *F = &d->fr[d->depth++];
  F->s = s;
  F->f = is_map ? NULL : f;
  F->out = out;
  F->i = F->seen = F->next = 0;
  F->is_map = is_map;
  return 0;
}

/* A map of n pairs that fills out (schema s). */
static int dec_open_map(dec_t *d, const proto_schema_t *s, uint8_t *out, uint32_t n) {
  if (dec_room(d, (uint64_t)n * 2)) return DEC_ERR;
  if (s) memcpy(out, s->defaults, s->size);
  return dec_push(d, s, NULL, out, true);
}

/* The array of field f (of struct out): its count is checked against the
 * limit and the bytes left before its elements are allocated. */
static int dec_open_array(dec_t *d, const proto_field_t *f, uint8_t *out, uint32_t n) {
  if (n > f->max) return dec_fail(d, FR_ETOOBIG, "%u elements exceed the limit of %u", n, f->max);
  if (dec_room(d, n)) return DEC_ERR;
  size_t esize = f->type == PF_OBJS ? f->sub->size : f->type == PF_STRS ? sizeof(char *) : 4;
  void *data = n ? arena_alloc(d->arena, (size_t)n * esize) : NULL;
  memcpy(out + f->off, &data, sizeof data);
  memcpy(out + f->off_n, &n, 4);
  return dec_push(d, NULL, f, data, false);
}

/* A map or array header of n entries; *obj becomes its frame's index. */
static int dec_container(dec_t *d, kind_t kind, uint32_t n, uint32_t *obj) {
  mpv_t v = {.kind = kind, .len = n};
  *obj = (uint32_t)d->depth;
  if (d->depth == 0) { /* the message: its pairs are counted against the bytes once the body starts */
    if (kind != K_MAP) return rd_type_error(d, "map", &v);
    d->n_top = n;
    if (d->mode != DEC_BODY) return dec_push(d, NULL, NULL, NULL, true);
    return dec_open_map(d, NULL, NULL, n) ? DEC_ERR : dec_begin_body(d, &d->fr[0]);
  }
  frame_t *F = &d->fr[d->depth - 1];
  if (!F->is_map) { /* an element: arrays of objects hold maps */
    const proto_field_t *f = F->f;
    if (f->type != PF_OBJS || kind != K_MAP) return rd_element(d, F, &v);
    return dec_open_map(d, f->sub, F->out + (size_t)F->i * f->sub->size, n);
  }
  const proto_field_t *f = F->f;
  if (!f) return dec_key(d, F, &v);
  if (f == &dup_key) return dec_dup_error(d, F);
  if (f == &env_v || f == &env_t) return dec_envelope_value(d, F, &v);
  if (f->type == PF_OBJ) {
    if (kind != K_MAP) return rd_type_error(d, "map", &v);
    if (f->flags & PF_HAS) *(bool *)(F->out + f->off_n) = true;
    return dec_open_map(d, f->sub, F->out + f->off, n);
  }
  if (f->type >= PF_I32S && f->type != PF_F32BIN && kind == K_ARR) return dec_open_array(d, f, F->out, n);
  return rd_field(d, f, &v, F->out); /* a type error */
}

/* Closes the innermost container: an object's required fields and cross-
 * field checks. */
static int dec_close(dec_t *d) {
  frame_t *F = &d->fr[d->depth - 1];
  const proto_schema_t *s = F->s;
  if (F->is_map && s) {
    for (uint32_t i = 0; i < s->n_fields; i++) /* fields not seen: required? */
      if (!(F->seen & (1u << i)) && (s->fields[i].flags & PF_REQ))
        return dec_fail(d, FR_EPROTO, "missing required field \"%s\" in %s", s->fields[i].key, s->name);
    int rc;
    if (s->check && (rc = s->check(F->out))) return dec_fail(d, rc, "%s", fr_last_error());
  }
  d->depth--;
  return 0;
}

/* An entry of the container of frame `level` is complete: containers
 * opened inside it are closed, a map takes a key next, an array its next
 * element. */
static int dec_entry_done_slow(dec_t *d, uint32_t level) {
  while ((uint32_t)d->depth > level + 1) {
    int rc = dec_close(d);
    if (rc) return rc;
  }
  frame_t *F = &d->fr[level];
  if (F->is_map) F->f = NULL;
  else F->i++;
  return 0;
}

static inline int dec_entry_done(dec_t *d, uint32_t level) {
  if ((uint32_t)d->depth != level + 1) return dec_entry_done_slow(d, level);
  frame_t *F = &d->fr[level];
  if (F->is_map) F->f = NULL;
  else F->i++;
  return 0;
}

/* An error in the bytes of a value (a header cut short, a byte no value
 * starts with): said at its container, not yet at its key. */
__attribute__((format(printf, 3, 4))) static int dec_fail_bytes(dec_t *d, int err, const char *fmt, ...) {
  char what[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  if (d->depth > 0 && d->fr[d->depth - 1].is_map) d->fr[d->depth - 1].f = NULL;
  return dec_fail(d, err, "%s", what);
}

/* ------------------------------------------ decoder: msgpack-c parser */

/* The callbacks of msgpack-c's unpack template: the parser's object is a
 * frame index (containers) or 0 (anything else). */
static inline uint32_t dec_cb_root(dec_t *d) { return 0; }

/* Unsigned ints are most of a step (slots, positions, token ids): those
 * for an integer field or an int32 element go straight in. */
static inline int dec_uint(dec_t *d, uint64_t x, uint32_t *o) {
  *o = 0;
  d->nvals++;
  if (d->depth > 0) {
    frame_t *F = &d->fr[d->depth - 1];
    const proto_field_t *f = F->f;
    uint32_t u = (uint32_t)x;
    if (!F->is_map && (f->type == PF_I32S || f->type == PF_U32S) && x <= INT32_MAX) {
      memcpy(F->out + 4 * (size_t)F->i, &u, 4);
      return 0;
    }
    if (F->is_map && f && (f->type == PF_U64 || (x <= INT32_MAX && (f->type == PF_U32 || f->type == PF_I32)))) {
      if (f->type == PF_U64) memcpy(F->out + f->off, &x, 8);
      else memcpy(F->out + f->off, &u, 4);
      if (f->flags & PF_HAS) *(bool *)(F->out + f->off_n) = true;
      return 0;
    }
  }
  mpv_t v = {.kind = K_UINT, .u = x};
  return dec_leaf(d, &v);
}

static inline int dec_int(dec_t *d, int64_t x, uint32_t *o) {
  mpv_t v = {.kind = x < 0 ? K_INT : K_UINT, .i = x, .u = (uint64_t)x};
  *o = 0;
  d->nvals++;
  return dec_leaf(d, &v);
}
/* A float32 for a float field goes in as it came, bit for bit (a NaN
 * stays the NaN it was); anything else through a double. */
static inline int dec_float(dec_t *d, float x, uint32_t *o) {
  *o = 0;
  d->nvals++;
  if (d->depth > 0) {
    frame_t *F = &d->fr[d->depth - 1];
    const proto_field_t *f = F->f;
    if (F->is_map && f && f->type == PF_F32) {
      memcpy(F->out + f->off, &x, 4);
      return 0;
    }
  }
  mpv_t v = {.kind = K_F32, .f = x};
  return dec_leaf(d, &v);
}
static inline int dec_double(dec_t *d, double x, uint32_t *o) {
  mpv_t v = {.kind = K_F64, .f = x};
  *o = 0;
  d->nvals++;
  return dec_leaf(d, &v);
}
/* nil, true, false; the nils of a resync (dec_skip) are let through. */
static inline int dec_simple(dec_t *d, kind_t kind, uint64_t x, uint32_t *o) {
  mpv_t v = {.kind = kind, .u = x};
  *o = 0;
  if (d->resync) {
    d->resync--;
    return 0;
  }
  d->nvals++;
  return dec_leaf(d, &v);
}
/* Strings are mostly keys: a known key of a nested object, seen for the
 * first time, is taken here. */
static inline int dec_bytes(dec_t *d, kind_t kind, const char *p, unsigned int n, uint32_t *o) {
  static const uint8_t empty[1];
  const uint8_t *q = n ? (const uint8_t *)p : empty;
  *o = 0;
  if (n) { /* the exact position again */
    d->pos = (size_t)(q + n - d->data);
    d->nvals = 0;
  } else {
    d->nvals++;
  }
  if (kind == K_STR && d->depth > 1 && n && n <= 7) {
    frame_t *F = &d->fr[d->depth - 1];
    int idx = F->is_map && !F->f ? find_field(F->s, pack_key(q, d->data + d->len, n), F->next) : -1;
    if (idx >= 0 && !(F->seen & (1u << idx))) {
      F->seen |= 1u << idx;
      F->next = (uint32_t)idx + 1;
      F->f = &F->s->fields[idx];
      return 0;
    }
  }
  mpv_t v = {.kind = kind, .len = n, .ptr = q};
  return dec_leaf(d, &v);
}

static inline int dec_cb_uint8(dec_t *d, uint8_t x, uint32_t *o) { return dec_uint(d, x, o); }
static inline int dec_cb_uint16(dec_t *d, uint16_t x, uint32_t *o) { return dec_uint(d, x, o); }
static inline int dec_cb_uint32(dec_t *d, uint32_t x, uint32_t *o) { return dec_uint(d, x, o); }
static inline int dec_cb_uint64(dec_t *d, uint64_t x, uint32_t *o) { return dec_uint(d, x, o); }
static inline int dec_cb_int8(dec_t *d, int8_t x, uint32_t *o) { return dec_int(d, x, o); }
static inline int dec_cb_int16(dec_t *d, int16_t x, uint32_t *o) { return dec_int(d, x, o); }
static inline int dec_cb_int32(dec_t *d, int32_t x, uint32_t *o) { return dec_int(d, x, o); }
static inline int dec_cb_int64(dec_t *d, int64_t x, uint32_t *o) { return dec_int(d, x, o); }
static inline int dec_cb_float(dec_t *d, float x, uint32_t *o) { return dec_float(d, x, o); }
static inline int dec_cb_double(dec_t *d, double x, uint32_t *o) { return dec_double(d, x, o); }
static inline int dec_cb_nil(dec_t *d, uint32_t *o) { return dec_simple(d, K_NIL, 0, o); }
static inline int dec_cb_true(dec_t *d, uint32_t *o) { return dec_simple(d, K_BOOL, 1, o); }
static inline int dec_cb_false(dec_t *d, uint32_t *o) { return dec_simple(d, K_BOOL, 0, o); }
static inline int dec_cb_array(dec_t *d, unsigned int n, uint32_t *o) {
  int rc = dec_container(d, K_ARR, n, o);
  d->nvals++; /* its header */
  return rc;
}
static inline int dec_cb_map(dec_t *d, unsigned int n, uint32_t *o) {
  int rc = dec_container(d, K_MAP, n, o);
  d->nvals++;
  return rc;
}
static inline int dec_cb_array_item(dec_t *d, uint32_t *c, uint32_t o) { return dec_entry_done(d, *c); }
static inline int dec_cb_map_item(dec_t *d, uint32_t *c, uint32_t k, uint32_t v) { return dec_entry_done(d, *c); }
static inline int dec_cb_str(dec_t *d, const char *b, const char *p, unsigned int n, uint32_t *o) {
  return dec_bytes(d, K_STR, p, n, o);
}
static inline int dec_cb_bin(dec_t *d, const char *b, const char *p, unsigned int n, uint32_t *o) {
  return dec_bytes(d, K_BIN, p, n, o);
}
static inline int dec_cb_ext(dec_t *d, const char *b, const char *p, unsigned int n, uint32_t *o) {
  /* p: the ext type, then the data. n is never 0 but for an ext 32 of
   * 2^32-1 bytes, whose n + 1 the template wraps to 0 (p: its length):
   * its bytes are not there, what it is may be wrong already. */
  if (n == 0) {
    mpv_t v = {.kind = K_EXT, .len = UINT32_MAX};
    if ((const uint8_t *)p + 4 >= d->data + d->len) return dec_fail_bytes(d, FR_ETRUNCATED, "message truncated");
    if (dec_leaf(d, &v) == DEC_ERR) return DEC_ERR;
    return rd_truncated(d);
  }
  return dec_bytes(d, K_EXT, p, n, o);
}

#define msgpack_unpack_struct(name) struct proto__mp##name
#define msgpack_unpack_func(ret, name) __attribute__((unused)) static ret proto__mp##name
#define msgpack_unpack_callback(name) dec_cb##name
#define msgpack_unpack_object uint32_t
#define msgpack_unpack_user dec_t
#include "msgpack/unpack_define.h"
#include "msgpack/unpack_template.h"

typedef struct proto__mp_context mp_ctx_t; /* the parser: its state, then dec_t (user) */

/* ---------------------------------------------------- decoder: driver */

/* The parser stopped at an unknown key (*off: its last byte): skips the
 * key's value, then lets the parser finish the pair with a nil key and
 * value that the callbacks let through. Returns 0 to resume at *off, 1
 * when that completed the message, or an error. */
static int dec_skip(mp_ctx_t *ctx, size_t *off) {
  static const char nils[2] = {(char)0xc0, (char)0xc0};
  dec_t *d = &ctx->user;
  size_t at = *off + 1, o = 0;
  int rc = skip_value(d, &at);
  if (rc) return rc;
  *off = d->pos = at;
  d->nvals = 0;
  ctx->cs = MSGPACK_CS_HEADER;
  ctx->trail = 0;
  d->resync = 2;
  return proto__mp_execute(ctx, nils, sizeof nils, &o);
}

/* The parser wants more bytes at off: the message is truncated, unless the
 * value cut short is a str / bin / ext (header complete) that its field
 * refuses before its bytes: a claim over the limit, a wrong type. */
static int dec_truncated(mp_ctx_t *ctx, size_t off) {
  dec_t *d = &ctx->user;
  mpv_t v = {.len = ctx->trail};
  switch (ctx->cs) {
  case MSGPACK_ACS_STR_VALUE: v.kind = K_STR; break;
  case MSGPACK_ACS_BIN_VALUE: v.kind = K_BIN; break;
  case MSGPACK_ACS_EXT_VALUE: v.kind = K_EXT; break;
  default: return dec_fail_bytes(d, FR_ETRUNCATED, "message truncated");
  }
  if (v.kind == K_EXT && off >= d->len) return dec_fail_bytes(d, FR_ETRUNCATED, "message truncated"); /* ext type */
  if (dec_leaf(d, &v) == DEC_ERR) return DEC_ERR;
  return rd_truncated(d);
}

/* The message map is complete at off: closes it, checks the envelope and
 * that nothing follows. */
static int dec_finish(dec_t *d, size_t off) {
  while (d->depth > 0)
    if (dec_close(d)) return DEC_ERR;
  if (!d->have_v) return dec_fail(d, FR_EPROTO, "missing version key \"v\"");
  if (!d->have_t) return dec_fail(d, FR_EPROTO, "missing type key \"t\"");
  if (d->mode != DEC_SCAN && off != d->len) return dec_fail(d, FR_EPROTO, "%zu trailing bytes", d->len - off);
  return 0;
}

/* One pass of the parser over the message: 0, DEC_ERR or DEC_RESTART. */
static int dec_pass(mp_ctx_t *ctx) {
  dec_t *d = &ctx->user;
  size_t off = 0;
  proto__mp_init(ctx);
  int rc = proto__mp_execute(ctx, (const char *)d->data, d->len, &off);
  while (rc == DEC_SKIP) {
    rc = dec_skip(ctx, &off);
    if (rc == 0) rc = proto__mp_execute(ctx, (const char *)d->data, d->len, &off);
  }
  switch (rc) {
  case 1: return dec_finish(d, off);
  case 0: return dec_truncated(ctx, off);
  case DEC_ERR: case DEC_RESTART: return rc;
  case MSGPACK_UNPACK_NOMEM_ERROR: return dec_fail(d, FR_EPROTO, "nested too deep");
  default: return dec_fail_bytes(d, FR_EPROTO, "invalid msgpack byte 0x%02x", d->data[off]);
  }
}

/* Starts a pass in the given mode; a scan forgets what the first pass saw
 * of the envelope, the body pass keeps what the scan found. */
static void dec_reset(dec_t *d, dec_mode_t mode) {
  if (mode == DEC_SCAN) d->have_v = d->have_t = false;
  d->mode = mode;
  d->depth = 0;
  d->pos = 0;
  d->nvals = 0;
  d->resync = 0;
}

int proto_msg_decode(proto_msg_t *m, const void *data, size_t len, uint32_t accept) {
  mp_ctx_t ctx;
  dec_t *d = &ctx.user;
  memset(d, 0, offsetof(dec_t, fr));
  d->data = data;
  d->len = len;
  d->arena = &m->arena;
  d->body = &m->u;
  d->accept = accept;
  d->msg = "message";
  m->type = PROTO_T_NONE;
  arena_reset(&m->arena);
  if (len > PROTO_MAX_MSG_BYTES) {
    dec_fail(d, FR_ETOOBIG, "%zu bytes exceed the limit of %u", len, PROTO_MAX_MSG_BYTES);
    return d->err;
  }
  int rc = dec_pass(&ctx);
  if (rc == DEC_RESTART) { /* the envelope is not first: find it, then read the body */
    dec_reset(d, DEC_SCAN);
    rc = dec_pass(&ctx);
    if (!rc) rc = dec_check_type(d);
    dec_reset(d, DEC_BODY);
    if (!rc) rc = dec_pass(&ctx);
  }
  if (rc) return d->err;
  m->type = d->type;
  return 0;
}
