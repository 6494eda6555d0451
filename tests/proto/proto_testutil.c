/* proto_testutil.c - random valid messages and deep comparison, driven by
 * the schema tables (proto_schema.h). */
#include "proto_testutil.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_util.h"

static uint64_t rng = 0x243f6a8885a308d3ull;

void tu_seed(uint64_t seed) { rng = seed ? seed : 1; }

uint64_t tu_rand(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

uint32_t tu_below(uint32_t n) { return n ? (uint32_t)(tu_rand() % n) : 0; }

static void **allocs;
static size_t n_allocs, cap_allocs;

void *tu_alloc(size_t n) {
  if (n_allocs == cap_allocs) {
    cap_allocs = cap_allocs ? 2 * cap_allocs : 256;
    allocs = realloc(allocs, cap_allocs * sizeof *allocs);
  }
  void *p = calloc(1, n ? n : 1);
  allocs[n_allocs++] = p;
  return p;
}

void tu_free_all(void) {
  for (size_t i = 0; i < n_allocs; i++) free(allocs[i]);
  free(allocs);
  allocs = NULL;
  n_allocs = cap_allocs = 0;
}

/* Integers spread over every msgpack width. */
static uint64_t rand_width(void) {
  switch (tu_below(5)) {
  case 0: return tu_below(128);
  case 1: return tu_below(256);
  case 2: return tu_below(65536);
  case 3: return (uint32_t)tu_rand();
  default: return tu_rand();
  }
}

static int32_t rand_i32(void) {
  int32_t v = (int32_t)(uint32_t)rand_width();
  return tu_below(3) == 0 ? -(v & 0x7fffffff) : v;
}

static float rand_f32(void) {
  switch (tu_below(6)) {
  case 0: return 0.0f;
  case 1: return -INFINITY;
  case 2: return (float)(tu_rand() % 100000) / 7.0f;
  default: return -(float)(tu_rand() % 1000000) / 1000.0f;
  }
}

static char *rand_str(int allow_nul, int big, uint32_t *len_out) {
  uint32_t len = tu_below(big == 1 && tu_below(4) == 0 ? 700 : 40) + (big == 2);
  char *s = tu_alloc(len + 1);
  for (uint32_t i = 0; i < len; i++) {
    char c = (char)(tu_rand() & 0xff);
    if (!allow_nul && c == 0) c = 'x';
    s[i] = c;
  }
  if (len_out) *len_out = len;
  return s;
}

static uint32_t rand_count(uint32_t max, int big) {
  uint32_t n = tu_below(big == 1 && tu_below(4) == 0 ? 300 : 6) + (big == 2);
  return n > max ? max : n;
}

static void rand_obj(const proto_schema_t *s, uint8_t *out, int big, int depth);

static void *rand_array(const proto_field_t *f, uint8_t *out, size_t esize, int big, uint32_t *n) {
  *n = rand_count(f->max, big);
  void *data = *n ? tu_alloc(*n * esize) : NULL;
  memcpy(out + f->off, &data, sizeof data);
  memcpy(out + f->off_n, n, 4);
  return data;
}

static void rand_field(const proto_field_t *f, uint8_t *out, int big, int depth) {
  uint32_t n, len;
  switch (f->type) {
  case PF_U32: *(uint32_t *)(out + f->off) = (uint32_t)rand_width(); break;
  case PF_I32: *(int32_t *)(out + f->off) = rand_i32(); break;
  case PF_U64: *(uint64_t *)(out + f->off) = rand_width(); break;
  case PF_F32: *(float *)(out + f->off) = rand_f32(); break;
  case PF_BOOL: *(bool *)(out + f->off) = tu_below(2); break;
  case PF_ENUM: { /* a required enum has no 0 (absent) value */
    int lo = big == 2 || (f->flags & PF_REQ);
    *(int *)(out + f->off) = (int)tu_below(f->max - (uint32_t)lo) + lo;
    break;
  }
  case PF_STR:
    *(char **)(out + f->off) = tu_below(4) == 0 && !(f->flags & PF_REQ) && big != 2 ? NULL : rand_str(0, big, NULL);
    break;
  case PF_TEXT:
    if (tu_below(4) == 0 && !(f->flags & PF_REQ) && big != 2) {
      *(char **)(out + f->off) = NULL;
      *(uint32_t *)(out + f->off_n) = 0;
    } else {
      *(char **)(out + f->off) = rand_str(1, big, &len);
      *(uint32_t *)(out + f->off_n) = len;
    }
    break;
  case PF_I32S: case PF_U32S: {
    int32_t *a = rand_array(f, out, 4, big, &n);
    for (uint32_t i = 0; i < n; i++) a[i] = f->type == PF_U32S ? (int32_t)(uint32_t)rand_width() : rand_i32();
    break;
  }
  case PF_F32S: case PF_F32BIN: {
    float *a = rand_array(f, out, 4, big, &n);
    for (uint32_t i = 0; i < n; i++) a[i] = rand_f32();
    break;
  }
  case PF_STRS: {
    char **a = rand_array(f, out, sizeof(char *), big, &n);
    for (uint32_t i = 0; i < n; i++) {
      a[i] = rand_str(0, 0, &len);
      if (!len) a[i] = "s"; /* stop strings must not be empty */
    }
    break;
  }
  case PF_OBJ: rand_obj(f->sub, out + f->off, big, depth + 1); break;
  case PF_OBJS: {
    uint32_t max = depth > 0 ? 3 : f->max;
    const proto_field_t g = {.off = f->off, .off_n = f->off_n, .max = max};
    uint8_t *a = rand_array(&g, out, f->sub->size, big, &n);
    for (uint32_t i = 0; i < n; i++) rand_obj(f->sub, a + (size_t)i * f->sub->size, big, depth + 1);
    break;
  }
  }
  if ((f->flags & PF_HAS)) {
    bool has = big == 2 || tu_below(2);
    *(bool *)(out + f->off_n) = has;
    if (!has) { /* absent: the decoder leaves the default */
      const uint8_t *def = NULL;
      size_t size = 0;
      if (f->type == PF_OBJ) {
        def = f->sub->defaults;
        size = f->sub->size;
        memcpy(out + f->off, def, size);
      } else {
        *(uint64_t *)(out + f->off) = 0;
      }
    }
  }
}

static float rand_unit(void) { return (float)(1 + tu_below(1000)) / 1000.0f; }

/* Makes a random object pass its schema's check. */
static void fixup(const proto_schema_t *s, uint8_t *out) {
  if (!strcmp(s->name, "sampling")) {
    proto_sampling_t *p = (proto_sampling_t *)out;
    p->temperature = tu_below(3) ? rand_unit() * 2 : 0;
    p->top_k = (int32_t)tu_below(100);
    p->top_p = rand_unit();
    p->min_p = rand_unit() - 0.001f;
    p->repetition_penalty = 0.5f + rand_unit();
    p->presence_penalty = rand_unit() * 4 - 2;
    p->frequency_penalty = -(rand_unit() * 2);
    p->logprobs = (int32_t)tu_below(PROTO_MAX_TOPN + 2) - 1;
    for (uint32_t i = 0, t = 0; p->bias && i < p->n_bias; i++) { /* strictly increasing tokens, biases in range */
      t += 1 + tu_below(1000);
      p->bias[i].token = (int32_t)t;
      p->bias[i].bias = rand_unit() * 200 - 100;
    }
  } else if (!strcmp(s->name, "hello")) {
    proto_hello_t *h = (proto_hello_t *)out;
    h->world_size = 1 + (int32_t)tu_below(8);
    h->rank = (int32_t)tu_below((uint32_t)h->world_size);
    h->block_size = 1 + tu_below(64);
    h->max_batch = 1 + tu_below(512);
  } else if (!strcmp(s->name, "load")) {
    proto_load_t *l = (proto_load_t *)out;
    l->tp_size = 1 + tu_below(8);
    uint32_t mode = tu_below(3); /* fixed, a byte budget, a memory fraction */
    if (mode != 1) l->kv_bytes = 0;
    if (mode == 1 && !l->kv_bytes) l->kv_bytes = 1;
    l->kv_util = mode == 2 ? rand_unit() : 0;
    if (mode) l->kv_blocks = 0, l->block_size = 1 + tu_below(64);
  } else if (!strcmp(s->name, "kv_init")) {
    proto_kv_init_t *k = (proto_kv_init_t *)out;
    k->kv_blocks = k->kv_blocks ? k->kv_blocks : 1;
  } else if (!strcmp(s->name, "block table")) {
    proto_table_t *t = (proto_table_t *)out;
    t->first = tu_below(PROTO_MAX_TABLE - t->n_blocks + 1);
  } else if (!strcmp(s->name, "step item")) {
    proto_step_item_t *it = (proto_step_item_t *)out;
    if (!it->n_tokens) {
      it->n_tokens = 1;
      it->tokens = tu_alloc(4);
      it->tokens[0] = 42;
    }
    it->n_spec = it->final ? tu_below(FR_MIN(it->n_tokens, PROTO_MAX_SPEC + 1)) : 0; /* < n_tokens, final only */
    if (!it->n_spec) it->draft = false; /* draft proposals need room */
    it->n_plp = it->n_spec ? 0 : tu_below(it->n_tokens + 1); /* prompt logprob rows: not with proposals */
    it->plp_top = it->n_plp ? (int32_t)tu_below(PROTO_MAX_TOPN + 1) : 0;
    it->next = it->n_plp == it->n_tokens ? (int32_t)tu_below(50000) : (int32_t)tu_below(2) - 1;
  } else if (!strcmp(s->name, "result item")) {
    proto_result_item_t *r = (proto_result_item_t *)out;
    if (r->n_extra_lp != r->n_extra) r->n_extra_lp = 0;
    r->n_extra_top = r->n_extra * r->n_top;
    r->extra_top = r->n_extra_top ? tu_alloc(r->n_extra_top * sizeof *r->extra_top) : NULL;
    for (uint32_t i = 0; i < r->n_extra_top; i++) r->extra_top[i] = (proto_toplp_t){rand_i32(), rand_f32()};
    if (r->n_plp_rank != r->n_plp) r->n_plp_rank = 0;
    r->n_plp_top = r->n_plp * tu_below(3);
    r->plp_top = r->n_plp_top ? tu_alloc(r->n_plp_top * sizeof *r->plp_top) : NULL;
    for (uint32_t i = 0; i < r->n_plp_top; i++) r->plp_top[i] = (proto_toplp_t){rand_i32(), rand_f32()};
  } else if (!strcmp(s->name, "prompt handling")) {
    proto_prompt_opts_t *p = (proto_prompt_opts_t *)out;
    p->logprobs_top = p->logprobs ? tu_below(PROTO_MAX_TOPN + 1) : 0;
  } else if (!strcmp(s->name, "prompt logprobs")) {
    proto_prompt_lp_t *p = (proto_prompt_lp_t *)out;
    uint32_t n = p->n_tokens ? p->n_tokens - 1 : 0;
    p->lp = tu_alloc((n + 1) * sizeof *p->lp), p->rank = tu_alloc((n + 1) * sizeof *p->rank);
    p->n_lp = p->n_rank = n;
    for (uint32_t i = 0; i < n; i++) p->lp[i] = rand_f32(), p->rank[i] = (uint32_t)rand_i32();
    p->top_n = n ? tu_below(3) : 0;
    p->n_top = n * p->top_n;
    p->top = p->n_top ? tu_alloc(p->n_top * sizeof *p->top) : NULL;
    for (uint32_t i = 0; i < p->n_top; i++) p->top[i] = (proto_toplp_t){rand_i32(), rand_f32()};
  } else if (!strcmp(s->name, "submit")) {
    proto_submit_t *r = (proto_submit_t *)out;
    r->id = r->id ? r->id : 1;
    uint32_t pick = tu_below(3);
    if (pick != 0) r->prompt = NULL, r->prompt_len = 0;
    if (pick == 0 && !r->prompt) r->prompt = "hello", r->prompt_len = 5;
    if (pick != 1) r->n_tokens = 0, r->tokens = NULL;
    if (pick == 1 && !r->n_tokens) r->n_tokens = 1, r->tokens = tu_alloc(4);
    if (pick != 2) r->n_messages = 0, r->messages = NULL;
    if (pick == 2 && !r->n_messages) {
      r->n_messages = 1;
      r->messages = tu_alloc(sizeof *r->messages);
      r->messages[0].role = "user";
      r->messages[0].content = "hi";
      r->messages[0].content_len = 2;
    }
  } else if (!strcmp(s->name, "event")) {
    proto_event_t *e = (proto_event_t *)out;
    e->id = e->id ? e->id : 7;
    if (e->n_logprobs != e->n_tokens) e->n_logprobs = 0;
    e->top_n = e->n_tokens ? tu_below(4) : 0;
    e->n_top = e->n_tokens * e->top_n;
    e->top = e->n_top ? tu_alloc(e->n_top * sizeof *e->top) : NULL;
    for (uint32_t i = 0; i < e->n_top; i++) e->top[i] = (proto_toplp_t){rand_i32(), rand_f32()};
  } else if (!strcmp(s->name, "cancel")) {
    proto_cancel_t *c = (proto_cancel_t *)out;
    c->id = c->id ? c->id : 3;
  }
}

static void rand_obj(const proto_schema_t *s, uint8_t *out, int big, int depth) {
  memcpy(out, s->defaults, s->size);
  for (uint32_t i = 0; i < s->n_fields; i++) {
    const proto_field_t *f = &s->fields[i];
    /* leave some optional fields at their default (left out on the wire) */
    if (!(f->flags & PF_REQ) && big != 2 && tu_below(4) == 0) continue;
    rand_field(f, out, big, depth);
  }
  fixup(s, out);
}

void tu_rand_body(proto_type_t type, void *body, int big) { rand_obj(proto__schema(type), body, big, 0); }

/* ------------------------------------------------------------ compare */

static const void *ptr_at(const void *base, uint16_t off) {
  const void *p;
  memcpy(&p, (const uint8_t *)base + off, sizeof p);
  return p;
}
static uint32_t u32_at(const void *base, uint16_t off) {
  uint32_t n;
  memcpy(&n, (const uint8_t *)base + off, 4);
  return n;
}

static int differ(char *why, size_t n, const char *schema, const char *key, const char *what) {
  snprintf(why, n, "%s.%s: %s", schema, key, what);
  return -1;
}

static int cmp_field(const proto_schema_t *s, const proto_field_t *f, const uint8_t *a, const uint8_t *b, char *why,
                     size_t n) {
  const char *sn = s->name, *k = f->key;
  if (f->flags & PF_HAS) {
    bool ha = *(const bool *)(a + f->off_n), hb = *(const bool *)(b + f->off_n);
    if (ha != hb) return differ(why, n, sn, k, "presence differs");
  }
  switch (f->type) {
  case PF_U32: case PF_I32: case PF_F32:
    return memcmp(a + f->off, b + f->off, 4) ? differ(why, n, sn, k, "4-byte value differs") : 0;
  case PF_U64: return memcmp(a + f->off, b + f->off, 8) ? differ(why, n, sn, k, "u64 differs") : 0;
  case PF_BOOL: return *(const bool *)(a + f->off) != *(const bool *)(b + f->off) ? differ(why, n, sn, k, "bool") : 0;
  case PF_ENUM: return *(const int *)(a + f->off) != *(const int *)(b + f->off) ? differ(why, n, sn, k, "enum") : 0;
  case PF_STR: {
    const char *x = ptr_at(a, f->off), *y = ptr_at(b, f->off);
    if (!x || !y) return x == y ? 0 : differ(why, n, sn, k, "NULL vs string");
    return strcmp(x, y) ? differ(why, n, sn, k, "string differs") : 0;
  }
  case PF_TEXT: {
    const char *x = ptr_at(a, f->off), *y = ptr_at(b, f->off);
    if (!x || !y) return x == y ? 0 : differ(why, n, sn, k, "NULL vs text");
    uint32_t lx = u32_at(a, f->off_n), ly = u32_at(b, f->off_n);
    if (lx == 0) lx = (uint32_t)strlen(x);
    if (ly == 0) ly = (uint32_t)strlen(y);
    return lx != ly || memcmp(x, y, lx) ? differ(why, n, sn, k, "text differs") : 0;
  }
  case PF_OBJ: return tu_compare_schema(f->sub, a + f->off, b + f->off, why, n);
  default: break;
  }
  uint32_t na = u32_at(a, f->off_n), nb = u32_at(b, f->off_n);
  if (na != nb) return differ(why, n, sn, k, "counts differ");
  const uint8_t *x = ptr_at(a, f->off), *y = ptr_at(b, f->off);
  if (!na) return 0;
  switch (f->type) {
  case PF_STRS:
    for (uint32_t i = 0; i < na; i++)
      if (strcmp(((char *const *)x)[i], ((char *const *)y)[i])) return differ(why, n, sn, k, "string element");
    return 0;
  case PF_OBJS:
    for (uint32_t i = 0; i < na; i++)
      if (tu_compare_schema(f->sub, x + (size_t)i * f->sub->size, y + (size_t)i * f->sub->size, why, n)) return -1;
    return 0;
  default: return memcmp(x, y, (size_t)na * 4) ? differ(why, n, sn, k, "elements differ") : 0;
  }
}

int tu_compare_schema(const proto_schema_t *s, const void *a, const void *b, char *why, size_t n) {
  for (uint32_t i = 0; i < s->n_fields; i++)
    if (cmp_field(s, &s->fields[i], a, b, why, n)) return -1;
  return 0;
}

int tu_compare(proto_type_t type, const void *a, const void *b, char *why, size_t n) {
  return tu_compare_schema(proto__schema(type), a, b, why, n);
}
