/* test_proto_malformed.c - the decoder on bad input. Valid messages of
 * every type are unpacked with msgpack-c into an object tree, changed (a
 * value of a wrong type, a required key removed, a huge length claimed, an
 * unknown key added, keys reordered or repeated), packed again and decoded:
 * every change must give its error (or, for unknown keys and reordering,
 * the same message), never a crash. Also: every truncation of every
 * message, trailing bytes, versions, types. */
#include <check.h>
#include <msgpack.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "proto/proto.h"
#include "proto/proto_schema.h"
#include "proto_testutil.h"

static proto_msg_t msg;
static proto_buf_t buf;
static _Alignas(16) uint8_t body[sizeof msg.u];

static void setup(void) {
  proto_msg_init(&msg);
  proto_buf_init(&buf);
  tu_seed(777);
}
static void teardown(void) {
  proto_msg_free(&msg);
  proto_buf_free(&buf);
  tu_free_all();
}

/* Encodes a random message of type t (full: every field set) into buf. */
static void make(proto_type_t t, int full) {
  tu_rand_body(t, body, full ? 2 : 0);
  int rc = proto_encode(&buf, t, body);
  ck_assert_msg(rc == 0, "%s: %s", proto_type_name(t), fr_last_error());
}

static void unpack(msgpack_unpacked *up) {
  size_t off = 0;
  msgpack_unpacked_init(up);
  ck_assert_int_eq(msgpack_unpack_next(up, (const char *)buf.data, buf.len, &off), MSGPACK_UNPACK_SUCCESS);
}

/* Packs root and decodes it; returns the decoder's code. */
static int repack_decode(const msgpack_object *root, uint32_t accept) {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_object(&pk, *root);
  int rc = proto_msg_decode(&msg, sb.data, sb.size, accept);
  msgpack_sbuffer_destroy(&sb);
  return rc;
}

static msgpack_object obj_str(const char *s, uint32_t n) {
  msgpack_object o = {.type = MSGPACK_OBJECT_STR};
  o.via.str.ptr = s;
  o.via.str.size = n;
  return o;
}

/* ------------------------------------------------------ tree walking */

typedef void (*visit_fn)(msgpack_object *root, msgpack_object *map, uint32_t i, const proto_field_t *f,
                         proto_type_t t);

static const proto_field_t *field_of(const proto_schema_t *s, const msgpack_object_kv *kv) {
  if (kv->key.type != MSGPACK_OBJECT_STR) return NULL;
  for (uint32_t j = 0; j < s->n_fields; j++)
    if (strlen(s->fields[j].key) == kv->key.via.str.size &&
        !memcmp(s->fields[j].key, kv->key.via.str.ptr, kv->key.via.str.size))
      return &s->fields[j];
  return NULL;
}

/* Calls visit for every known key of every map (the first two elements of
 * arrays of objects), depth first. */
static void walk(msgpack_object *root, msgpack_object *map, const proto_schema_t *s, visit_fn visit, proto_type_t t) {
  for (uint32_t i = 0; i < map->via.map.size; i++) {
    msgpack_object_kv *kv = &map->via.map.ptr[i];
    const proto_field_t *f = field_of(s, kv);
    if (!f) continue;
    visit(root, map, i, f, t);
    if (f->type == PF_OBJ && kv->val.type == MSGPACK_OBJECT_MAP) walk(root, &kv->val, f->sub, visit, t);
    if (f->type == PF_OBJS && kv->val.type == MSGPACK_OBJECT_ARRAY)
      for (uint32_t j = 0; j < kv->val.via.array.size && j < 2; j++)
        if (kv->val.via.array.ptr[j].type == MSGPACK_OBJECT_MAP)
          walk(root, &kv->val.via.array.ptr[j], f->sub, visit, t);
  }
}

/* Runs visit over full random messages of every type. */
static void for_all_fields(visit_fn visit, int rounds) {
  for (int t = 1; t < PROTO_T_COUNT; t++) {
    for (int r = 0; r < rounds; r++) {
      make((proto_type_t)t, 1);
      msgpack_unpacked up;
      unpack(&up);
      walk(&up.data, &up.data, proto__schema((proto_type_t)t), visit, (proto_type_t)t);
      msgpack_unpacked_destroy(&up);
      tu_free_all();
    }
  }
}

/* ------------------------------------------------------- wrong types */

enum { W_STR, W_ARR, W_MAP, W_BOOL, W_FLOAT, W_BIN, W_NEG, W_BIG, W_EXT, W_UINT1, W_ARR_BAD, W_BIN3, W_COUNT };

static msgpack_object wrong_value(int w) {
  static msgpack_object bad_elem[1];
  static const char bytes[3] = {1, 2, 3};
  msgpack_object o = {.type = MSGPACK_OBJECT_NIL};
  switch (w) {
  case W_STR: return obj_str("bogus", 5);
  case W_ARR: o.type = MSGPACK_OBJECT_ARRAY; break;
  case W_MAP: o.type = MSGPACK_OBJECT_MAP; break;
  case W_BOOL: o.type = MSGPACK_OBJECT_BOOLEAN; o.via.boolean = true; break;
  case W_FLOAT: o.type = MSGPACK_OBJECT_FLOAT64; o.via.f64 = 1.5; break;
  case W_BIN: o.type = MSGPACK_OBJECT_BIN; o.via.bin.ptr = bytes; o.via.bin.size = 2; break;
  case W_NEG: o.type = MSGPACK_OBJECT_NEGATIVE_INTEGER; o.via.i64 = -1; break;
  case W_BIG: o.type = MSGPACK_OBJECT_POSITIVE_INTEGER; o.via.u64 = 1ull << 40; break;
  case W_EXT: o.type = MSGPACK_OBJECT_EXT; o.via.ext.type = 1; o.via.ext.ptr = bytes; o.via.ext.size = 3; break;
  case W_UINT1: o.type = MSGPACK_OBJECT_POSITIVE_INTEGER; o.via.u64 = 1; break;
  case W_ARR_BAD: /* an array whose element has a wrong type for any element */
    bad_elem[0].type = MSGPACK_OBJECT_BOOLEAN;
    bad_elem[0].via.boolean = false;
    o.type = MSGPACK_OBJECT_ARRAY;
    o.via.array.ptr = bad_elem;
    o.via.array.size = 1;
    break;
  case W_BIN3: o.type = MSGPACK_OBJECT_BIN; o.via.bin.ptr = bytes; o.via.bin.size = 3; break;
  }
  return o;
}

/* Whether value kind w is wrong for field type ft. */
static int is_wrong(int w, uint8_t ft) {
  switch (ft) {
  case PF_U32: return w != W_UINT1;
  case PF_I32: return w != W_UINT1 && w != W_NEG;
  case PF_U64: return w != W_UINT1 && w != W_BIG;
  case PF_F32: return w != W_UINT1 && w != W_NEG && w != W_BIG && w != W_FLOAT;
  case PF_BOOL: return w != W_BOOL;
  case PF_ENUM: return 1; /* "bogus" is no finish reason */
  case PF_STR: case PF_TEXT: return w != W_STR;
  case PF_I32S: case PF_U32S: case PF_F32S: case PF_STRS: case PF_OBJS: return w != W_ARR;
  case PF_F32BIN: return w != W_BIN || w == W_BIN3;
  case PF_OBJ: return w != W_MAP;
  default: return 0;
  }
}

static int n_wrong;

static void visit_wrong(msgpack_object *root, msgpack_object *map, uint32_t i, const proto_field_t *f, proto_type_t t) {
  msgpack_object saved = map->via.map.ptr[i].val;
  for (int w = 0; w < W_COUNT; w++) {
    if (!is_wrong(w, f->type)) continue;
    map->via.map.ptr[i].val = wrong_value(w);
    int rc = repack_decode(root, PROTO_ACCEPT_ANY);
    ck_assert_msg(rc == FR_EPROTO || (w == W_BIN3 && rc == FR_EPROTO), "%s.%s value kind %d: rc %d (%s)",
                  proto_type_name(t), f->key, w, rc, fr_last_error());
    ck_assert_msg(strstr(fr_last_error(), f->key), "%s: error does not name the field: %s", f->key, fr_last_error());
    n_wrong++;
  }
  map->via.map.ptr[i].val = saved;
}

START_TEST(wrong_types) {
  n_wrong = 0;
  for_all_fields(visit_wrong, 3);
  ck_assert_int_gt(n_wrong, 1000);
}
END_TEST

/* ---------------------------------------------------- required / nil */

static int n_missing;

static void visit_missing(msgpack_object *root, msgpack_object *map, uint32_t i, const proto_field_t *f,
                          proto_type_t t) {
  if (!(f->flags & PF_REQ)) return;
  msgpack_object_kv *kv = map->via.map.ptr;
  uint32_t n = map->via.map.size;
  msgpack_object_kv saved = kv[i];
  /* remove the key: move the last pair into its place */
  kv[i] = kv[n - 1];
  map->via.map.size = n - 1;
  int rc = repack_decode(root, PROTO_ACCEPT_ANY);
  ck_assert_msg(rc == FR_EPROTO, "%s without %s: rc %d", proto_type_name(t), f->key, rc);
  ck_assert_ptr_nonnull(strstr(fr_last_error(), "missing required"));
  /* nil in a required field is no better */
  kv[i] = saved;
  map->via.map.size = n;
  kv[i].val.type = MSGPACK_OBJECT_NIL;
  ck_assert_int_eq(repack_decode(root, PROTO_ACCEPT_ANY), FR_EPROTO);
  kv[i] = saved;
  n_missing++;
}

START_TEST(missing_required) {
  n_missing = 0;
  for_all_fields(visit_missing, 2);
  ck_assert_int_gt(n_missing, 40);
}
END_TEST

/* Optional nil means absent: the default. */
START_TEST(nil_is_absent) {
  static const uint8_t step[] = {0x84, 0xa1, 'v', 0x05, 0xa1, 't', 0xa4, 's', 't', 'e', 'p', 0xa2, 'i', 'd', 0x05,
                                 0xa2, 'e', 'p', 0xc0}; /* "ep": nil is required -> error */
  ck_assert_int_eq(proto_msg_decode(&msg, step, sizeof step, PROTO_ACCEPT_ANY), FR_EPROTO);
  static const uint8_t hb[] = {0x84, 0xa1, 'v', 0x01, 0xa1, 't', 0xa2, 'h', 'b', 0xa1, 'r', 0xc0, 0xa3, 's', 'e', 'q', 0x07};
  ck_assert_int_eq(proto_msg_decode(&msg, hb, sizeof hb, PROTO_ACCEPT_ANY), 0);
  ck_assert_int_eq(msg.u.heartbeat.rank, -1); /* nil: the default */
  ck_assert_uint_eq(msg.u.heartbeat.seq, 7);
}
END_TEST

/* ---------------------------------------------------------- oversize */

static const uint8_t placeholder[] = "\x7fPLACEHOLDER\x7f"; /* 13 bytes + NUL */

/* Replaces the placeholder string in packed bytes with a header claiming
 * 2^32-1 elements (kind: 0xdd array, 0xdb str, 0xc6 bin, 0xdf map) or n. */
static int decode_claim(const msgpack_object *root, uint8_t head, uint32_t n) {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_object(&pk, *root);
  size_t plen = sizeof placeholder - 1, at = 0;
  for (; at + plen + 1 <= sb.size; at++)
    if ((uint8_t)sb.data[at] == (0xa0 | plen) && !memcmp(sb.data + at + 1, placeholder, plen)) break;
  ck_assert_uint_lt(at + plen, sb.size);
  uint8_t *p = (uint8_t *)sb.data + at;
  p[0] = head;
  p[1] = (uint8_t)(n >> 24);
  p[2] = (uint8_t)(n >> 16);
  p[3] = (uint8_t)(n >> 8);
  p[4] = (uint8_t)n;
  memmove(p + 5, p + 1 + plen, sb.size - at - 1 - plen);
  size_t len = sb.size - (plen + 1 - 5);
  int rc = proto_msg_decode(&msg, sb.data, len, PROTO_ACCEPT_ANY);
  msgpack_sbuffer_destroy(&sb);
  return rc;
}

static int n_oversize;

static void visit_oversize(msgpack_object *root, msgpack_object *map, uint32_t i, const proto_field_t *f,
                           proto_type_t t) {
  uint8_t head;
  switch (f->type) {
  case PF_STR: case PF_TEXT: head = 0xdb; break;
  case PF_F32BIN: head = 0xc6; break;
  case PF_I32S: case PF_U32S: case PF_F32S: case PF_STRS: case PF_OBJS: head = 0xdd; break;
  case PF_OBJ: head = 0xdf; break;
  default: return;
  }
  msgpack_object saved = map->via.map.ptr[i].val;
  map->via.map.ptr[i].val = obj_str((const char *)placeholder, sizeof placeholder - 1);
  int rc = decode_claim(root, head, 0xffffffffu);
  if (f->type == PF_OBJ) /* maps have no count limit: the bytes run out */
    ck_assert_msg(rc == FR_ETRUNCATED, "%s.%s: rc %d", proto_type_name(t), f->key, rc);
  else
    ck_assert_msg(rc == FR_ETOOBIG, "%s.%s: rc %d (%s)", proto_type_name(t), f->key, rc, fr_last_error());
  if (f->type != PF_OBJ) {
    /* exactly at the limit but the bytes are not there: truncated, and
     * nothing of the claimed size was allocated first (ASan would say) */
    uint32_t at_limit = f->type == PF_F32BIN ? f->max * 4 : f->max;
    rc = decode_claim(root, head, at_limit);
    ck_assert_msg(f->max < 4096 ? rc < 0 : rc == FR_ETRUNCATED, "%s.%s at limit: rc %d (%s)", proto_type_name(t), f->key, rc, fr_last_error());
    rc = decode_claim(root, head, f->type == PF_F32BIN ? at_limit + 4 : at_limit + 1);
    ck_assert_msg(rc == FR_ETOOBIG, "%s.%s over limit: rc %d", proto_type_name(t), f->key, rc);
  }
  map->via.map.ptr[i].val = saved;
  n_oversize++;
}

START_TEST(oversize_claims) {
  n_oversize = 0;
  for_all_fields(visit_oversize, 1);
  ck_assert_int_gt(n_oversize, 30);
}
END_TEST

/* Real arrays and strings one past their limits. */
static void visit_real_oversize(msgpack_object *root, msgpack_object *map, uint32_t i, const proto_field_t *f,
                                proto_type_t t) {
  msgpack_object saved = map->via.map.ptr[i].val, big = {.type = MSGPACK_OBJECT_NIL};
  void *mem = NULL;
  if (f->type == PF_STR || f->type == PF_TEXT) {
    mem = malloc(f->max + 1);
    memset(mem, 'a', f->max + 1);
    big = obj_str(mem, f->max + 1);
  } else if (f->type == PF_F32BIN) {
    mem = calloc((size_t)f->max + 1, 4);
    big.type = MSGPACK_OBJECT_BIN;
    big.via.bin.ptr = mem;
    big.via.bin.size = (f->max + 1) * 4;
  } else if (f->type >= PF_I32S && f->type != PF_OBJ) {
    mem = calloc((size_t)f->max + 1, sizeof(msgpack_object)); /* nils */
    big.type = MSGPACK_OBJECT_ARRAY;
    big.via.array.ptr = mem;
    big.via.array.size = f->max + 1;
  } else {
    return;
  }
  map->via.map.ptr[i].val = big;
  int rc = repack_decode(root, PROTO_ACCEPT_ANY);
  ck_assert_msg(rc == FR_ETOOBIG, "%s.%s real oversize: rc %d", proto_type_name(t), f->key, rc);
  map->via.map.ptr[i].val = saved;
  free(mem);
}

START_TEST(oversize_real) { for_all_fields(visit_real_oversize, 1); }
END_TEST

/* ------------------------------------------------------- truncation */

START_TEST(truncated_everywhere) {
  long n = 0;
  for (int t = 1; t < PROTO_T_COUNT; t++) {
    for (int r = 0; r < 4; r++) {
      make((proto_type_t)t, r & 1);
      for (size_t len = 0; len < buf.len; len++) {
        int rc = proto_msg_decode(&msg, buf.data, len, PROTO_ACCEPT_ANY);
        ck_assert_msg(rc == FR_ETRUNCATED, "%s cut at %zu of %zu: rc %d (%s)", proto_type_name(t), len, buf.len, rc,
                      fr_last_error());
        ck_assert_int_eq(msg.type, PROTO_T_NONE);
        n++;
      }
      ck_assert_int_eq(proto_msg_decode(&msg, buf.data, buf.len, PROTO_ACCEPT_ANY), 0);
      tu_free_all();
    }
  }
  ck_assert_int_gt(n, 1000);
}
END_TEST

START_TEST(trailing_bytes) {
  for (int t = 1; t < PROTO_T_COUNT; t++) {
    make((proto_type_t)t, 0);
    size_t len = buf.len;
    uint8_t *twice = malloc(2 * len);
    memcpy(twice, buf.data, len);
    memcpy(twice + len, buf.data, len);
    ck_assert_int_eq(proto_msg_decode(&msg, twice, len + 1, PROTO_ACCEPT_ANY), FR_EPROTO);
    ck_assert_ptr_nonnull(strstr(fr_last_error(), "trailing"));
    ck_assert_int_eq(proto_msg_decode(&msg, twice, 2 * len, PROTO_ACCEPT_ANY), FR_EPROTO);
    free(twice);
    tu_free_all();
  }
}
END_TEST

/* ---------------------------------------------------- envelope checks */

static msgpack_object *find_key(msgpack_object *map, const char *k) {
  for (uint32_t i = 0; i < map->via.map.size; i++)
    if (map->via.map.ptr[i].key.via.str.size == strlen(k) && !memcmp(map->via.map.ptr[i].key.via.str.ptr, k, strlen(k)))
      return &map->via.map.ptr[i].val;
  return NULL;
}

START_TEST(versions_and_types) {
  make(PROTO_T_STEP, 0);
  msgpack_unpacked up;
  unpack(&up);
  msgpack_object *root = &up.data, *v = find_key(root, "v"), *t = find_key(root, "t");
  msgpack_object sv = *v, st = *t;
  ck_assert_uint_eq(sv.via.u64, 5); /* a step is written as version 5: its items may ask prompt logprobs or draft
                                     * proposals */
  v->via.u64 = 2; /* an older coordinator's step (no logit bias, no min_tokens) is refused */
  ck_assert_int_eq(repack_decode(root, PROTO_ACCEPT_ANY), FR_EVERSION);
  v->via.u64 = 3; /* ... and a version-3 one (its worker would take proposals for plain tokens) */
  ck_assert_int_eq(repack_decode(root, PROTO_ACCEPT_ANY), FR_EVERSION);
  v->via.u64 = 4; /* ... and a version-4 one (its worker would skip the prompt logprobs asked, or verify a
                   * draft's placeholders) */
  ck_assert_int_eq(repack_decode(root, PROTO_ACCEPT_ANY), FR_EVERSION);
  v->via.u64 = PROTO_VERSION; /* a newer peer's step is read */
  ck_assert_int_eq(repack_decode(root, PROTO_ACCEPT_ANY), 0);
  v->via.u64 = PROTO_VERSION + 1;
  ck_assert_int_eq(repack_decode(root, PROTO_ACCEPT_ANY), FR_EVERSION);
  v->via.u64 = 0;
  ck_assert_int_eq(repack_decode(root, PROTO_ACCEPT_ANY), FR_EVERSION);
  v->type = MSGPACK_OBJECT_NEGATIVE_INTEGER;
  v->via.i64 = -1;
  ck_assert_int_eq(repack_decode(root, PROTO_ACCEPT_ANY), FR_EVERSION);
  *v = obj_str("1", 1);
  ck_assert_int_eq(repack_decode(root, PROTO_ACCEPT_ANY), FR_EPROTO);
  *v = sv;
  ck_assert_int_eq(repack_decode(root, PROTO_ACCEPT_ANY), 0);
  *t = obj_str("bogus", 5);
  ck_assert_int_eq(repack_decode(root, PROTO_ACCEPT_ANY), FR_EPROTO);
  ck_assert_ptr_nonnull(strstr(fr_last_error(), "unknown message type"));
  t->type = MSGPACK_OBJECT_POSITIVE_INTEGER;
  t->via.u64 = PROTO_T_STEP;
  ck_assert_int_eq(repack_decode(root, PROTO_ACCEPT_ANY), FR_EPROTO);
  *t = st;
  /* a step is no message a client accepts */
  ck_assert_int_eq(repack_decode(root, PROTO_ACCEPT_CLIENT), FR_EPROTO);
  ck_assert_int_eq(repack_decode(root, PROTO_ACCEPT_WORKER), 0);
  /* without "v" / without "t" */
  msgpack_object_kv *kv = root->via.map.ptr;
  msgpack_object_kv k0 = kv[0];
  kv[0] = kv[root->via.map.size - 1];
  root->via.map.size--;
  ck_assert_int_eq(repack_decode(root, PROTO_ACCEPT_ANY), FR_EPROTO);
  ck_assert_ptr_nonnull(strstr(fr_last_error(), "\"v\""));
  root->via.map.size++;
  kv[root->via.map.size - 1] = kv[0];
  kv[0] = k0;
  msgpack_object_kv k1 = kv[1];
  kv[1] = kv[root->via.map.size - 1];
  root->via.map.size--;
  ck_assert_int_eq(repack_decode(root, PROTO_ACCEPT_ANY), FR_EPROTO);
  ck_assert_ptr_nonnull(strstr(fr_last_error(), "\"t\""));
  root->via.map.size++;
  kv[root->via.map.size - 1] = kv[1];
  kv[1] = k1;
  ck_assert_int_eq(repack_decode(root, PROTO_ACCEPT_ANY), 0);
  msgpack_unpacked_destroy(&up);

  static const uint8_t not_map[] = {0x92, 0x01, 0x02}, empty_map[] = {0x80}, bad_byte[] = {0xc1};
  ck_assert_int_eq(proto_msg_decode(&msg, not_map, sizeof not_map, PROTO_ACCEPT_ANY), FR_EPROTO);
  ck_assert_int_eq(proto_msg_decode(&msg, empty_map, sizeof empty_map, PROTO_ACCEPT_ANY), FR_EPROTO);
  ck_assert_int_eq(proto_msg_decode(&msg, bad_byte, sizeof bad_byte, PROTO_ACCEPT_ANY), FR_EPROTO);
  ck_assert_int_eq(proto_msg_decode(&msg, "", 0, PROTO_ACCEPT_ANY), FR_ETRUNCATED);
}
END_TEST

/* ------------------------------------------- unknown keys, key order */

static msgpack_object extra_vals[4];
static msgpack_object_kv extra_kv[3], inner_kv[2];

/* {"zz": {"a": [1, [], {}], "b": nil}, "a_key_longer_than_7": [[], [[]]], "x": ext, 7: ...} */
static void build_extras(void) {
  static msgpack_object arr[3], deep[2], deeper[1];
  arr[0].type = MSGPACK_OBJECT_POSITIVE_INTEGER;
  arr[0].via.u64 = 1;
  arr[1].type = MSGPACK_OBJECT_ARRAY;
  arr[2].type = MSGPACK_OBJECT_MAP;
  inner_kv[0].key = obj_str("a", 1);
  inner_kv[0].val.type = MSGPACK_OBJECT_ARRAY;
  inner_kv[0].val.via.array.ptr = arr;
  inner_kv[0].val.via.array.size = 3;
  inner_kv[1].key = obj_str("b", 1);
  inner_kv[1].val.type = MSGPACK_OBJECT_NIL;
  extra_kv[0].key = obj_str("zz", 2);
  extra_kv[0].val.type = MSGPACK_OBJECT_MAP;
  extra_kv[0].val.via.map.ptr = inner_kv;
  extra_kv[0].val.via.map.size = 2;
  deeper[0].type = MSGPACK_OBJECT_ARRAY;
  deep[0].type = MSGPACK_OBJECT_ARRAY;
  deep[1].type = MSGPACK_OBJECT_ARRAY;
  deep[1].via.array.ptr = deeper;
  deep[1].via.array.size = 1;
  extra_kv[1].key = obj_str("a_key_longer_than_7", 19);
  extra_kv[1].val.type = MSGPACK_OBJECT_ARRAY;
  extra_kv[1].val.via.array.ptr = deep;
  extra_kv[1].val.via.array.size = 2;
  extra_kv[2].key = obj_str("x", 1);
  extra_kv[2].val = (msgpack_object){.type = MSGPACK_OBJECT_EXT};
  extra_kv[2].val.via.ext.type = 5;
  extra_kv[2].val.via.ext.ptr = "abcd";
  extra_kv[2].val.via.ext.size = 4;
  (void)extra_vals;
}

/* Adds the extra keys to every map of the tree (maps that are values of
 * known keys), in front or at the end. */
static void add_extras(msgpack_object *map, const proto_schema_t *s, int front) {
  uint32_t n = map->via.map.size;
  msgpack_object_kv *kv = tu_alloc((n + 3) * sizeof *kv);
  for (uint32_t i = 0; i < n; i++) {
    msgpack_object_kv *src = &map->via.map.ptr[i];
    const proto_field_t *f = s ? field_of(s, src) : NULL;
    if (f && f->type == PF_OBJ) add_extras(&src->val, f->sub, !front);
    if (f && f->type == PF_OBJS)
      for (uint32_t j = 0; j < src->val.via.array.size; j++) add_extras(&src->val.via.array.ptr[j], f->sub, !front);
  }
  if (front) {
    memcpy(kv, extra_kv, sizeof extra_kv);
    memcpy(kv + 3, map->via.map.ptr, n * sizeof *kv);
  } else {
    memcpy(kv, map->via.map.ptr, n * sizeof *kv);
    memcpy(kv + n, extra_kv, sizeof extra_kv);
  }
  map->via.map.ptr = kv;
  map->via.map.size = n + 3;
}

static void reverse_keys(msgpack_object *map) {
  msgpack_object_kv *kv = map->via.map.ptr;
  for (uint32_t i = 0, j = map->via.map.size - 1; map->via.map.size && i < j; i++, j--) {
    msgpack_object_kv x = kv[i];
    kv[i] = kv[j];
    kv[j] = x;
  }
}

/* Types changed in version 2 are written as 2, and a version-1 message of
 * such a type is refused (a peer of another build), whatever it holds. */
START_TEST(type_versions) {
  static const proto_type_t v2[] = {PROTO_T_LOAD, PROTO_T_LOADED, PROTO_T_KV_INIT, PROTO_T_KV_READY};
  for (size_t i = 0; i < sizeof v2 / sizeof v2[0]; i++) {
    ck_assert_uint_eq(proto_type_version(v2[i]), 2);
    make(v2[i], 0);
    msgpack_unpacked up;
    unpack(&up);
    msgpack_object *v = find_key(&up.data, "v");
    ck_assert_uint_eq(v->via.u64, 2);
    ck_assert_int_eq(repack_decode(&up.data, PROTO_ACCEPT_ANY), 0);
    v->via.u64 = 1;
    ck_assert_int_eq(repack_decode(&up.data, PROTO_ACCEPT_ANY), FR_EVERSION);
    ck_assert_ptr_nonnull(strstr(fr_last_error(), "needs protocol version 2"));
    msgpack_unpacked_destroy(&up);
  }
  for (int t = 1; t < PROTO_T_COUNT; t++) {
    ck_assert_uint_ge(proto_type_version((proto_type_t)t), PROTO_VERSION_MIN);
    ck_assert_uint_le(proto_type_version((proto_type_t)t), PROTO_VERSION);
  }
  /* version 3 moved submit's stop fields into "stop": an older client's stops would be skipped, so it is
   * refused instead; steps carry the logit bias and min_tokens an older worker would skip; version 4 gave
   * submit its fork and truncation, which an older coordinator must not skip, and steps and results the
   * proposed tokens of speculative decoding (ns), the allowed-token masks of constrained decoding (am) and the
   * several tokens per result item (xt); submit got its guide (an older coordinator would answer unconstrained);
   * version 5 gave submit its prompt logprobs and kept special tokens, steps and results the prompt logprob
   * rows (an older worker would skip them), step items the draft model's proposals (dm) */
  ck_assert_uint_eq(proto_type_version(PROTO_T_SUBMIT), 5);
  ck_assert_uint_eq(proto_type_version(PROTO_T_STEP), 5);
  ck_assert_uint_eq(proto_type_version(PROTO_T_RESULT), 5);
  ck_assert_uint_eq(proto_type_version(PROTO_T_EVENT), 1); /* v4's stop reason and v5's prompt logprobs are skipped
                                                            * by older clients */
  ck_assert_uint_eq(proto_type_version(PROTO_T_COUNT), 0);
}
END_TEST

START_TEST(unknown_fields_skipped) {
  build_extras();
  for (int t = 1; t < PROTO_T_COUNT; t++) {
    for (int r = 0; r < 6; r++) {
      make((proto_type_t)t, r & 1);
      msgpack_unpacked up;
      unpack(&up);
      if (r < 3) add_extras(&up.data, proto__schema((proto_type_t)t), r & 1);
      if (r >= 2) reverse_keys(&up.data); /* "v" and "t" last: the envelope scan */
      int rc = repack_decode(&up.data, PROTO_ACCEPT_ANY);
      ck_assert_msg(rc == 0, "%s round %d: %s", proto_type_name(t), r, fr_last_error());
      char why[256];
      ck_assert_msg(tu_compare((proto_type_t)t, body, &msg.u, why, sizeof why) == 0, "%s: %s", proto_type_name(t),
                    why);
      msgpack_unpacked_destroy(&up);
      tu_free_all();
    }
  }
}
END_TEST

static int n_dup;

static void visit_dup(msgpack_object *root, msgpack_object *map, uint32_t i, const proto_field_t *f, proto_type_t t) {
  msgpack_object_kv *old = map->via.map.ptr;
  uint32_t n = map->via.map.size;
  msgpack_object_kv *kv = malloc((n + 1) * sizeof *kv);
  memcpy(kv, old, n * sizeof *kv);
  kv[n] = old[i];
  map->via.map.ptr = kv;
  map->via.map.size = n + 1;
  int rc = repack_decode(root, PROTO_ACCEPT_ANY);
  ck_assert_msg(rc == FR_EPROTO, "%s: duplicate %s: rc %d", proto_type_name(t), f->key, rc);
  ck_assert_ptr_nonnull(strstr(fr_last_error(), "duplicate"));
  /* a key that is not a string */
  kv[n].key.type = MSGPACK_OBJECT_POSITIVE_INTEGER;
  kv[n].key.via.u64 = 7;
  ck_assert_int_eq(repack_decode(root, PROTO_ACCEPT_ANY), FR_EPROTO);
  map->via.map.ptr = old;
  map->via.map.size = n;
  free(kv);
  n_dup++;
}

START_TEST(duplicate_keys) {
  n_dup = 0;
  for_all_fields(visit_dup, 1);
  ck_assert_int_gt(n_dup, 80);
  /* the envelope twice, in both decoder paths */
  static const uint8_t vv[] = {0x83, 0xa1, 'v', 0x01, 0xa1, 't', 0xa2, 'h', 'b', 0xa1, 'v', 0x01};
  ck_assert_int_eq(proto_msg_decode(&msg, vv, sizeof vv, PROTO_ACCEPT_ANY), FR_EPROTO);
  static const uint8_t tt[] = {0x83, 0xa1, 't', 0xa2, 'h', 'b', 0xa1, 'v', 0x01, 0xa1, 't', 0xa2, 'h', 'b'};
  ck_assert_int_eq(proto_msg_decode(&msg, tt, sizeof tt, PROTO_ACCEPT_ANY), FR_EPROTO);
}
END_TEST

/* An unknown key whose value claims 2^32-1 elements, and one nested
 * 200000 deep: skipped without recursion, quickly. */
START_TEST(unknown_value_shapes) {
  static const uint8_t huge[] = {0x83, 0xa1, 'v', 0x01, 0xa1, 't', 0xa2, 'h', 'b', 0xa1, 'z', 0xdd, 0xff, 0xff, 0xff, 0xff, 0x01};
  ck_assert_int_eq(proto_msg_decode(&msg, huge, sizeof huge, PROTO_ACCEPT_ANY), FR_ETRUNCATED);
  static const uint8_t hugemap[] = {0x83, 0xa1, 'v', 0x01, 0xa1, 't', 0xa2, 'h', 'b', 0xa1, 'z', 0xdf, 0xff, 0xff, 0xff, 0xff};
  ck_assert_int_eq(proto_msg_decode(&msg, hugemap, sizeof hugemap, PROTO_ACCEPT_ANY), FR_ETRUNCATED);
  size_t depth = 200000, n = 11 + depth + 1;
  uint8_t *deep = malloc(n);
  memcpy(deep, (const uint8_t[]){0x83, 0xa1, 'v', 0x01, 0xa1, 't', 0xa2, 'h', 'b', 0xa1, 'z'}, 11);
  memset(deep + 11, 0x91, depth); /* [[[[...]]]] */
  deep[n - 1] = 0x90;
  ck_assert_int_eq(proto_msg_decode(&msg, deep, n, PROTO_ACCEPT_ANY), 0);
  ck_assert_int_eq(msg.type, PROTO_T_HEARTBEAT);
  ck_assert_int_eq(proto_msg_decode(&msg, deep, n - 1, PROTO_ACCEPT_ANY), FR_ETRUNCATED);
  free(deep);
}
END_TEST

/* Unknown keys inside nested objects, their values deep or claiming
 * 2^32-1 elements, as the first or the last key of an item (the last one
 * of the message: the map ends right behind the skipped value). */
static void pack_str(msgpack_packer *pk, const char *s) { msgpack_pack_str_with_body(pk, s, strlen(s)); }

/* {v, t: "step", id: 1, ep: 2, it: [{s: 1, tk: [5], <extra>}, {<extra>, s: 2, tk: [6]}]};
 * extra is "zz" and the bytes of its value. */
static void pack_step_extra(msgpack_sbuffer *sb, const uint8_t *val, size_t n) {
  msgpack_packer pk;
  msgpack_sbuffer_init(sb);
  msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 5);
  pack_str(&pk, "v");
  msgpack_pack_uint32(&pk, PROTO_VERSION);
  pack_str(&pk, "t");
  pack_str(&pk, "step");
  pack_str(&pk, "id");
  msgpack_pack_uint32(&pk, 1);
  pack_str(&pk, "ep");
  msgpack_pack_uint32(&pk, 2);
  pack_str(&pk, "it");
  msgpack_pack_array(&pk, 2);
  for (int i = 0; i < 2; i++) {
    msgpack_pack_map(&pk, 3);
    if (i == 1) {
      pack_str(&pk, "zz");
      msgpack_sbuffer_write(sb, (const char *)val, n);
    }
    pack_str(&pk, "s");
    msgpack_pack_uint32(&pk, (uint32_t)i + 1);
    pack_str(&pk, "tk");
    msgpack_pack_array(&pk, 1);
    msgpack_pack_uint32(&pk, (uint32_t)i + 5);
    if (i == 0) {
      pack_str(&pk, "zz");
      msgpack_sbuffer_write(sb, (const char *)val, n);
    }
  }
}

START_TEST(unknown_nested_shapes) {
  size_t depth = 100000;
  uint8_t *deep = malloc(depth + 1);
  memset(deep, 0x91, depth); /* [[[[...]]]] */
  deep[depth] = 0x90;
  msgpack_sbuffer sb;
  pack_step_extra(&sb, deep, depth + 1);
  ck_assert_msg(proto_msg_decode(&msg, sb.data, sb.size, PROTO_ACCEPT_ANY) == 0, "%s", fr_last_error());
  ck_assert_uint_eq(msg.u.step.n_items, 2);
  for (uint32_t i = 0; i < 2; i++) {
    ck_assert_uint_eq(msg.u.step.items[i].slot, i + 1);
    ck_assert_uint_eq(msg.u.step.items[i].n_tokens, 1);
    ck_assert_int_eq(msg.u.step.items[i].tokens[0], (int32_t)i + 5);
  }
  ck_assert_uint_eq(msg.u.step.epoch, 2);
  ck_assert_int_eq(proto_msg_decode(&msg, sb.data, sb.size - 1, PROTO_ACCEPT_ANY), FR_ETRUNCATED);
  msgpack_sbuffer_destroy(&sb);
  /* a value that claims 2^32-1 elements: the bytes run out */
  static const uint8_t huge[] = {0xdd, 0xff, 0xff, 0xff, 0xff, 0x01};
  pack_step_extra(&sb, huge, sizeof huge);
  ck_assert_int_eq(proto_msg_decode(&msg, sb.data, sb.size, PROTO_ACCEPT_ANY), FR_ETRUNCATED);
  msgpack_sbuffer_destroy(&sb);
  /* nested maps, strings, an ext: skipped, the items as sent */
  static const uint8_t mixed[] = {0x82, 0xa1, 'a', 0x92, 0xc0, 0x81, 0xa1, 'b', 0xd4, 0x01, 0x02,
                                  0xa1, 'c', 0xdc, 0x00, 0x02, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xc3};
  pack_step_extra(&sb, mixed, sizeof mixed);
  ck_assert_msg(proto_msg_decode(&msg, sb.data, sb.size, PROTO_ACCEPT_ANY) == 0, "%s", fr_last_error());
  ck_assert_int_eq(msg.u.step.items[1].tokens[0], 6);
  msgpack_sbuffer_destroy(&sb);
  free(deep);
}
END_TEST

/* Encodings other writers pick: signed ints for positive values, float64,
 * str8 keys, array16 of one element. */
START_TEST(other_encodings) {
  static const uint8_t m[] = {0x85, 0xd9, 0x01, 'v', 0xd0, 0x01, 0xa1, 't', 0xa2, 'h', 'b',
                              0xa1, 'r', 0xd1, 0x00, 0x05,                              /* int16 5 */
                              0xa3, 's', 'e', 'q', 0xd3, 0, 0, 0, 0, 0, 0, 0, 9,        /* int64 9 */
                              0xa2, 't', 's', 0xcf, 0, 0, 0, 1, 0, 0, 0, 0};           /* uint64 */
  ck_assert_msg(proto_msg_decode(&msg, m, sizeof m, PROTO_ACCEPT_ANY) == 0, "%s", fr_last_error());
  ck_assert_int_eq(msg.u.heartbeat.rank, 5);
  ck_assert_uint_eq(msg.u.heartbeat.seq, 9);
  ck_assert_uint_eq(msg.u.heartbeat.ts_ns, 1ull << 32);
  static const uint8_t c[] = {0x83, 0xa1, 'v', 0x01, 0xa1, 't', 0xa6, 'c', 'a', 'n', 'c', 'e', 'l',
                              0xa2, 'i', 'd', 0xcb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0}; /* id 1.0: not an int */
  ck_assert_int_eq(proto_msg_decode(&msg, c, sizeof c, PROTO_ACCEPT_ANY), FR_EPROTO);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("proto_malformed");
  TCase *tc = tcase_create("malformed");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, wrong_types);
  tcase_add_test(tc, missing_required);
  tcase_add_test(tc, nil_is_absent);
  tcase_add_test(tc, oversize_claims);
  tcase_add_test(tc, oversize_real);
  tcase_add_test(tc, truncated_everywhere);
  tcase_add_test(tc, trailing_bytes);
  tcase_add_test(tc, versions_and_types);
  tcase_add_test(tc, type_versions);
  tcase_add_test(tc, unknown_fields_skipped);
  tcase_add_test(tc, duplicate_keys);
  tcase_add_test(tc, unknown_value_shapes);
  tcase_add_test(tc, unknown_nested_shapes);
  tcase_add_test(tc, other_encodings);
  suite_add_tcase(s, tc);
  return s;
}

/* The shared main (tests/common/test_main.c) runs this program's suites. */
#include "tests/common/test_main.h"

const test_prog_t test_prog = {.suites = {suite}};
