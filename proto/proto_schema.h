/* proto_schema.h - internal: the field tables that drive the generic
 * msgpack encoder and decoder (proto_encode.c, proto_decode.c). One proto_schema_t per
 * struct; one proto_field_t per wire key. proto_msgs.c defines the tables;
 * tests walk them to generate random messages and malformed variants.
 *
 * Not part of the public API: only proto/ and tests/proto include it.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "proto/proto.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  PF_U32,    /* uint32_t */
  PF_I32,    /* int32_t */
  PF_U64,    /* uint64_t */
  PF_F32,    /* float; wire float32 (decoder also takes float64 and ints) */
  PF_BOOL,   /* bool */
  PF_ENUM,   /* int-sized enum; wire: the string names[v], v >= 1 (0 = absent) */
  PF_STR,    /* char *, NUL-free, <= max bytes */
  PF_TEXT,   /* char * + uint32_t length at off_n, <= max bytes, NULs allowed */
  PF_I32S,   /* int32_t * + uint32_t count at off_n, <= max elements */
  PF_U32S,   /* uint32_t * + count */
  PF_F32S,   /* float * + count; wire: array of numbers */
  PF_F32BIN, /* float * + count; wire: bin of little-endian f32 */
  PF_STRS,   /* char ** + count; each NUL-free, <= PROTO_MAX_STR */
  PF_OBJ,    /* struct of schema sub, inline */
  PF_OBJS,   /* sub-struct * + count */
} proto_ftype_t;

enum {
  PF_REQ = 1, /* required: the decoder fails without it, the encoder always writes it */
  PF_HAS = 2, /* off_n is a bool saying whether the field is present */
};

typedef struct proto_schema proto_schema_t;

/* A key of <= 7 bytes packed with its length, for one-compare matching:
 * bytes little-endian in bits 0..55, length in bits 56..63. */
#define PROTO__KB(k, i) \
  (sizeof(k) > (i) + 1 ? (uint64_t)(uint8_t)(k)[(i) + 1 < sizeof(k) ? (i) : 0] << (8 * (i)) : 0)
#define PROTO_KPACK(k)                                                                                   \
  (PROTO__KB(k, 0) | PROTO__KB(k, 1) | PROTO__KB(k, 2) | PROTO__KB(k, 3) | PROTO__KB(k, 4) |             \
   PROTO__KB(k, 5) | PROTO__KB(k, 6) | (uint64_t)(sizeof(k) - 1) << 56)

typedef struct {
  uint64_t kpack;               /* PROTO_KPACK(key) */
  const char *key;              /* wire key, <= 7 bytes */
  uint8_t klen;                 /* strlen(key) */
  uint8_t type;                 /* proto_ftype_t */
  uint8_t flags;                /* PF_REQ | PF_HAS */
  uint16_t off;                 /* offset of the value (or pointer) in the struct */
  uint16_t off_n;               /* offset of the uint32_t count / length, or of the has-bool */
  uint32_t max;                 /* elements (arrays), bytes (strings), names (enums) */
  const proto_schema_t *sub;    /* PF_OBJ / PF_OBJS */
  const char *const *names;     /* PF_ENUM: names[1..max-1] */
} proto_field_t;

struct proto_schema {
  const char *name;             /* for error messages: "step", "step item" */
  uint32_t size;                /* sizeof the struct */
  uint32_t n_fields;            /* <= 13: with the envelope, a fixmap */
  const proto_field_t *fields;
  const void *defaults;         /* a struct of this schema holding the defaults */
  /* Optional: cross-field checks after decode and before encode;
   * returns 0 or fr_errorf(FR_EPROTO, ...). */
  int (*check)(const void *body);
};

/* The schema of a message type's body; NULL for PROTO_T_NONE / unknown. */
const proto_schema_t *proto__schema(proto_type_t t);

#ifdef __cplusplus
}
#endif
