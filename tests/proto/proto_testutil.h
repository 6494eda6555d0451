/* proto_testutil.h - helpers for the proto suites: random messages that
 * satisfy every check (walking the schema tables), deep comparison of two
 * message bodies, and a seeded RNG. Memory from tu_rand_body lives until
 * tu_free_all(). */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "proto/proto.h"
#include "proto/proto_schema.h"

uint64_t tu_rand(void);
void tu_seed(uint64_t seed);
/* Uniform in [0, n). */
uint32_t tu_below(uint32_t n);

/* Fills body (a struct of the type) with random valid contents. big: 1
 * allows long strings and arrays (str16 / array16 encodings); 2 sets every
 * field (non-empty strings and arrays) that the checks allow. */
void tu_rand_body(proto_type_t type, void *body, int big);

/* Compares two bodies of a type field by field; 0 when equal, else -1 with
 * the first difference described in why (size n). */
int tu_compare(proto_type_t type, const void *a, const void *b, char *why, size_t n);

/* Schema-level compare (for nested objects). */
int tu_compare_schema(const proto_schema_t *s, const void *a, const void *b, char *why, size_t n);

/* A test allocation freed by tu_free_all. */
void *tu_alloc(size_t n);
void tu_free_all(void);
