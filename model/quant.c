/* quant.c - GPTQ and AWQ int4 layers read from safetensors and repacked
 * into KERN_I4G rows, and the quantization configs of GPTQ, AWQ and FP8
 * checkpoints (quant.h; layouts in docs/QUANTIZED.md; FP8 layers:
 * quant_fp8.c). */
#include "model/quant.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "kernels/kern_types.h"
#include "model/file.h"

#define QUANT_MAX_JSON (16u << 20)
#define QUANT_MAX_DIM (1 << 24)   /* input or output features of one layer */
#define QUANT_TILE 64             /* output features unpacked at a time */

const char *model_quant_name(model_quant_method_t m) {
  return m == MODEL_QUANT_GPTQ ? "gptq" : m == MODEL_QUANT_AWQ ? "awq" : m == MODEL_QUANT_FP8 ? "fp8" : "none";
}

/* ---- config ------------------------------------------------------------ */

static int quant_int(json_t *o, const char *key, int *out) {
  json_t *v = json_object_get(o, key);
  if (!json_is_integer(v)) return fr_errorf(FR_EFORMAT, "quantization config: %s must be an integer", key);
  json_int_t x = json_integer_value(v);
  if (x < -1 || x > QUANT_MAX_DIM) return fr_errorf(FR_EFORMAT, "quantization config: %s %lld is out of range", key,
                                                    (long long)x);
  *out = (int)x;
  return 0;
}

/* An optional string field; *out is NULL when absent. */
static int quant_str(json_t *o, const char *key, const char **out) {
  json_t *v = json_object_get(o, key);
  *out = NULL;
  if (!v || json_is_null(v)) return 0;
  if (!json_is_string(v)) return fr_errorf(FR_EFORMAT, "quantization config: %s must be a string", key);
  *out = json_string_value(v);
  return 0;
}

/* GPTQ: checkpoint_format "gptq" (v1, zeros stored minus 1; the default) or
 * "gptq_v2"; Marlin-packed files are another layout. */
static int quant_gptq_format(model_quant_t *q, json_t *o) {
  const char *fmt;
  int rc = quant_str(o, "checkpoint_format", &fmt);
  if (rc) return rc;
  if (json_is_true(json_object_get(o, "is_marlin_format")) || (fmt && !strcasecmp(fmt, "marlin")))
    return fr_errorf(FR_EUNSUPPORTED, "quantization config: Marlin-packed GPTQ files are not supported");
  if (fmt && strcasecmp(fmt, "gptq") && strcasecmp(fmt, "gptq_v2"))
    return fr_errorf(FR_EUNSUPPORTED, "quantization config: checkpoint_format %.32s (gptq and gptq_v2 are supported)",
                     fmt);
  q->zeros_minus_1 = !fmt || !strcasecmp(fmt, "gptq");
  return 0;
}

/* AWQ: the GEMM layout (version "gemm", the default) with zero points. */
static int quant_awq_format(json_t *o) {
  const char *ver;
  int rc = quant_str(o, "version", &ver);
  if (rc) return rc;
  if (ver && strcasecmp(ver, "gemm"))
    return fr_errorf(FR_EUNSUPPORTED, "quantization config: AWQ version %.32s (gemm is supported)", ver);
  json_t *zp = json_object_get(o, "zero_point");
  if (zp && !json_is_boolean(zp)) return fr_errorf(FR_EFORMAT, "quantization config: zero_point must be a boolean");
  if (json_is_false(zp)) return fr_errorf(FR_EUNSUPPORTED, "quantization config: AWQ without zero_point");
  return 0;
}

/* A weight scale's block, [rows, columns] (weight_block_size,
 * block_structure), into q->fp8_block. */
static int quant_fp8_block(model_quant_t *q, json_t *a, const char *key) {
  if (!json_is_array(a) || json_array_size(a) != 2)
    return fr_errorf(FR_EFORMAT, "quantization config: %s must be an array of two integers", key);
  for (int i = 0; i < 2; i++) {
    json_t *v = json_array_get(a, (size_t)i);
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > QUANT_MAX_DIM)
      return fr_errorf(FR_EFORMAT, "quantization config: %s must be two integers in 1..%d", key, QUANT_MAX_DIM);
    q->fp8_block[i] = (int)json_integer_value(v);
  }
  return 0;
}

/* quant_method "fp8" (vLLM's Fp8Config, transformers' FineGrainedFP8):
 * E4M3 weights, a scale per tensor or per weight_block_size block.
 * Activations are quantized per token at run time whatever
 * activation_scheme says: a static input_scale is not read. */
static int quant_fp8_config(model_quant_t *q, json_t *o) {
  const char *scheme, *fmt;
  int rc = quant_str(o, "activation_scheme", &scheme);
  if (!rc) rc = quant_str(o, "fmt", &fmt);
  if (rc) return rc;
  if (scheme && strcasecmp(scheme, "dynamic") && strcasecmp(scheme, "static"))
    return fr_errorf(FR_EUNSUPPORTED, "quantization config: activation_scheme %.32s (dynamic and static are "
                     "supported)", scheme);
  if (fmt && strcasecmp(fmt, "e4m3"))
    return fr_errorf(FR_EUNSUPPORTED, "quantization config: fp8 fmt %.32s (e4m3 is supported)", fmt);
  json_t *block = json_object_get(o, "weight_block_size");
  if (block && !json_is_null(block)) rc = quant_fp8_block(q, block, "weight_block_size");
  q->method = MODEL_QUANT_FP8, q->bits = 8;
  return rc;
}

/* One group of a compressed-tensors config: its weights must be 8-bit
 * floats, symmetric, per tensor, channel or block (one block shape for
 * every group). */
static int quant_ct_group(model_quant_t *q, const char *name, json_t *g) {
  json_t *w = json_is_object(g) ? json_object_get(g, "weights") : NULL;
  const char *type, *strategy;
  if (!json_is_object(w))
    return fr_errorf(FR_EFORMAT, "quantization config: config_groups.%.32s has no weights object", name);
  int rc = quant_str(w, "type", &type), bits = 0;
  if (!rc) rc = quant_str(w, "strategy", &strategy);
  if (!rc) rc = quant_int(w, "num_bits", &bits);
  if (rc) return rc;
  if (bits != 8 || !type || strcasecmp(type, "float"))
    return fr_errorf(FR_EUNSUPPORTED, "quantization config: compressed-tensors weights of %d-bit %.16s (8-bit float, "
                     "FP8, is supported; GPTQ and AWQ int4 files are loaded in their own formats)", bits,
                     type ? type : "?");
  if (json_is_false(json_object_get(w, "symmetric")))
    return fr_errorf(FR_EUNSUPPORTED, "quantization config: asymmetric FP8 weights (zero points)");
  if (!strategy || !strcasecmp(strategy, "tensor") || !strcasecmp(strategy, "channel")) return 0;
  if (strcasecmp(strategy, "block"))
    return fr_errorf(FR_EUNSUPPORTED, "quantization config: FP8 weights with strategy %.16s (tensor, channel and "
                     "block are supported)", strategy);
  int old[2] = {q->fp8_block[0], q->fp8_block[1]};
  if ((rc = quant_fp8_block(q, json_object_get(w, "block_structure"), "block_structure"))) return rc;
  if (old[0] && (old[0] != q->fp8_block[0] || old[1] != q->fp8_block[1]))
    return fr_errorf(FR_EUNSUPPORTED, "quantization config: FP8 groups with different block structures");
  return 0;
}

/* quant_method "compressed-tensors" (llm-compressor), format
 * float-quantized: FP8 E4M3 weights with a scale per tensor, per output
 * row or per block. */
static int quant_ct_config(model_quant_t *q, json_t *o) {
  const char *fmt;
  int rc = quant_str(o, "format", &fmt);
  if (rc) return rc;
  if (fmt && strcasecmp(fmt, "float-quantized"))
    return fr_errorf(FR_EUNSUPPORTED, "quantization config: compressed-tensors format %.32s (float-quantized, FP8, "
                     "is supported)", fmt);
  json_t *groups = json_object_get(o, "config_groups"), *g;
  const char *name;
  if (!json_is_object(groups) || !json_object_size(groups))
    return fr_errorf(FR_EFORMAT, "quantization config: compressed-tensors without config_groups");
  json_object_foreach(groups, name, g) {
    if ((rc = quant_ct_group(q, name, g))) return rc;
  }
  q->method = MODEL_QUANT_FP8, q->bits = 8;
  return 0;
}

static int quant_from_object(model_quant_t *q, json_t *o) {
  const char *method;
  memset(q, 0, sizeof *q);
  if (!json_is_object(o)) return fr_errorf(FR_EFORMAT, "quantization config is not an object");
  int rc = quant_str(o, "quant_method", &method);
  if (rc) return rc;
  if (method && !strcasecmp(method, "fp8")) return quant_fp8_config(q, o);
  if (method && !strcasecmp(method, "compressed-tensors")) return quant_ct_config(q, o);
  if (!method || !strcasecmp(method, "gptq")) q->method = MODEL_QUANT_GPTQ; /* AutoGPTQ's files may omit it */
  else if (!strcasecmp(method, "awq")) q->method = MODEL_QUANT_AWQ;
  else return fr_errorf(FR_EUNSUPPORTED, "quantization method %.32s is not supported (gptq, awq, fp8 and "
                        "compressed-tensors FP8 are)", method);
  if ((rc = quant_int(o, "bits", &q->bits)) || (rc = quant_int(o, "group_size", &q->group_size))) return rc;
  if (q->bits != 4) return fr_errorf(FR_EUNSUPPORTED, "quantization config: %d bits (4 are supported)", q->bits);
  if (q->group_size != -1 && (q->group_size <= 0 || q->group_size % 32))
    return fr_errorf(FR_EUNSUPPORTED, "quantization config: group_size %d (a multiple of 32, or -1, is supported)",
                     q->group_size);
  return q->method == MODEL_QUANT_GPTQ ? quant_gptq_format(q, o) : quant_awq_format(o);
}

int model_quant_parse(model_quant_t *q, const void *json, size_t len) {
  json_error_t jerr;
  memset(q, 0, sizeof *q);
  json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
  if (!root) return fr_errorf(FR_EFORMAT, "quantization config: %s (line %d)", jerr.text, jerr.line);
  int rc = quant_from_object(q, root);
  json_decref(root);
  return rc;
}

static char *quant_join(const char *dir, const char *name) {
  size_t n = strlen(dir) + strlen(name) + 2;
  char *p = fr_malloc(n);
  snprintf(p, n, "%s/%s", dir, name);
  return p;
}

/* dir/quantize_config.json when it is there; nothing is not an error. */
static int quant_read_sidecar(model_quant_t *q, const char *dir) {
  char *path = quant_join(dir, "quantize_config.json"), *text;
  size_t len;
  int rc = 0;
  if (access(path, F_OK) == 0) {
    rc = model__file_read("model", path, QUANT_MAX_JSON, &text, &len);
    if (!rc) {
      rc = model_quant_parse(q, text, len);
      free(text);
    }
    if (rc) {
      char why[400];
      snprintf(why, sizeof why, "%s", fr_last_error());
      rc = fr_errorf(rc, "%s: %s", path, why);
    }
  }
  free(path);
  return rc;
}

int model_quant_read(model_quant_t *q, const char *dir) {
  char *path = quant_join(dir, "config.json"), *text;
  size_t len;
  json_error_t jerr;
  memset(q, 0, sizeof *q);
  int rc = model__file_read("model", path, QUANT_MAX_JSON, &text, &len);
  json_t *root = rc ? NULL : json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
  if (!rc) free(text);
  if (!rc && !root) rc = fr_errorf(FR_EFORMAT, "%s: %s (line %d)", path, jerr.text, jerr.line);
  json_t *qc = root ? json_object_get(root, "quantization_config") : NULL;
  if (!rc && qc && !json_is_null(qc)) {
    if ((rc = quant_from_object(q, qc))) {
      char why[400];
      snprintf(why, sizeof why, "%s", fr_last_error());
      rc = fr_errorf(rc, "%s: %s", path, why);
    }
  } else if (!rc) {
    rc = quant_read_sidecar(q, dir);
  }
  json_decref(root);
  free(path);
  return rc;
}

/* ---- the layer's tensors ----------------------------------------------- */

/* base + sfx with dtype dt and n_dims 2 (1 for g_idx); NULL when absent. */
static int quant_tensor(const model_st_t *st, const char *base, const char *sfx, const char *dt, const char *dt2,
                        int n_dims, bool required, const st_tensor_t **out) {
  char name[512];
  snprintf(name, sizeof name, "%s.%s", base, sfx);
  const st_tensor_t *t = *out = model_st_tensor(st, name);
  if (!t) return required ? fr_errorf(FR_EFORMAT, "model: tensor %s is missing", name) : 0;
  if (strcmp(t->dtype_name, dt) && !(dt2 && !strcmp(t->dtype_name, dt2)))
    return fr_errorf(FR_EFORMAT, "model: tensor %s has dtype %s, expected %s%s%s", name, t->dtype_name, dt,
                     dt2 ? " or " : "", dt2 ? dt2 : "");
  if (t->n_dims != n_dims) return fr_errorf(FR_EFORMAT, "model: tensor %s has %d dims, expected %d", name, t->n_dims,
                                            n_dims);
  for (int d = 0; d < n_dims; d++)
    if (t->shape[d] <= 0 || t->shape[d] > QUANT_MAX_DIM)
      return fr_errorf(FR_EFORMAT, "model: tensor %s: dim %d is %lld (1..%d)", name, d, (long long)t->shape[d],
                       QUANT_MAX_DIM);
  return 0;
}

static int quant_shape_error(const char *base, const char *sfx, const st_tensor_t *t, int64_t a, int64_t b) {
  return fr_errorf(FR_EFORMAT, "model: tensor %s.%s has shape [%lld, %lld], expected [%lld, %lld]", base, sfx,
                   (long long)t->shape[0], (long long)(t->n_dims > 1 ? t->shape[1] : 1), (long long)a, (long long)b);
}

/* Finds the layer's tensors and checks every shape against the packing. */
static int quant_layer(const model_quant_t *q, const model_st_t *st, const char *base, model_quant_layer_t *L) {
  memset(L, 0, sizeof *L);
  L->q = *q;
  int rc = quant_tensor(st, base, "qweight", "I32", NULL, 2, true, &L->qweight);
  if (!rc) rc = quant_tensor(st, base, "qzeros", "I32", NULL, 2, true, &L->qzeros);
  if (!rc) rc = quant_tensor(st, base, "scales", "F16", "BF16", 2, true, &L->scales);
  if (!rc && q->method == MODEL_QUANT_GPTQ) rc = quant_tensor(st, base, "g_idx", "I32", NULL, 1, false, &L->g_idx);
  if (rc) return rc;
  const int64_t *qs = L->qweight->shape;
  /* GPTQ: [in / 8, out], packed along the input; AWQ: [in, out / 8], along the output. */
  L->in = q->method == MODEL_QUANT_GPTQ ? qs[0] * 8 : qs[0];
  L->out = q->method == MODEL_QUANT_GPTQ ? qs[1] : qs[1] * 8;
  if (L->in % 32 || L->out % 8 || L->in > QUANT_MAX_DIM || L->out > QUANT_MAX_DIM)
    return fr_errorf(FR_EUNSUPPORTED, "model: %s has %lld inputs and %lld outputs (multiples of 32 and 8 needed)",
                     base, (long long)L->in, (long long)L->out);
  L->groups = q->group_size < 0 ? 1 : (L->in + q->group_size - 1) / q->group_size;
  if (L->scales->shape[0] != L->groups || L->scales->shape[1] != L->out)
    return quant_shape_error(base, "scales", L->scales, L->groups, L->out);
  if (L->qzeros->shape[0] != L->groups || L->qzeros->shape[1] != L->out / 8)
    return quant_shape_error(base, "qzeros", L->qzeros, L->groups, L->out / 8);
  if (L->g_idx && L->g_idx->shape[0] != L->in)
    return fr_errorf(FR_EFORMAT, "model: tensor %s.g_idx has %lld entries, expected %lld", base,
                     (long long)L->g_idx->shape[0], (long long)L->in);
  return 0;
}

static inline uint32_t quant_u32(const st_tensor_t *t, int64_t i) {
  uint32_t v;
  memcpy(&v, (const uint8_t *)t->data + (size_t)i * 4, 4);
  return v;
}

/* AWQ's nibble position of output column c within its 32-bit word: the
 * packer stores columns 0,2,4,6,1,3,5,7 in nibbles 0..7. */
static const int kAwqPos[8] = {0, 4, 1, 5, 2, 6, 3, 7};

/* The zero point of (group g, output n). */
static int quant_zero(const model_quant_layer_t *L, int64_t g, int64_t n) {
  const model_quant_t *q = &L->q;
  uint32_t w = quant_u32(L->qzeros, g * (L->out / 8) + n / 8);
  if (q->method == MODEL_QUANT_AWQ) return (int)(w >> (4 * kAwqPos[n % 8]) & 15);
  return (int)(w >> (4 * (n % 8)) & 15) + (q->zeros_minus_1 ? 1 : 0);
}

static float quant_scale(const model_quant_layer_t *L, int64_t g, int64_t n) {
  uint16_t h;
  memcpy(&h, (const uint8_t *)L->scales->data + (size_t)(g * L->out + n) * 2, 2);
  return strcmp(L->scales->dtype_name, "F16") ? fr_bf16_to_fp32(h) : fr_fp16_to_fp32(h);
}

/* ---- groups and the column order ---------------------------------------- */

/* The group of input k. */
static int64_t quant_group(const model_quant_layer_t *L, int64_t k) {
  const model_quant_t *q = &L->q;
  if (L->g_idx) return (int32_t)quant_u32(L->g_idx, k);
  return q->group_size < 0 ? 0 : k / q->group_size;
}

/* Sorts the inputs by group (stably) into perm; every 32 consecutive sorted
 * inputs must share one group. perm is freed and set to NULL when it is the
 * identity. */
static int quant_order(const model_quant_layer_t *L, const char *base, int32_t **perm_out) {
  int64_t *start = fr_calloc((size_t)L->groups + 1, sizeof *start);
  int32_t *perm = fr_malloc((size_t)L->in * sizeof *perm);
  int rc = 0;
  for (int64_t k = 0; k < L->in && !rc; k++) {
    int64_t g = quant_group(L, k);
    if (g < 0 || g >= L->groups)
      rc = fr_errorf(FR_EFORMAT, "model: %s.g_idx[%lld] = %lld is not a group in [0, %lld)", base, (long long)k,
                     (long long)g, (long long)L->groups);
    else start[g + 1]++;
  }
  for (int64_t g = 0; g < L->groups && !rc; g++) {
    if (start[g + 1] % 32)
      rc = fr_errorf(FR_EUNSUPPORTED, "model: %s: group %lld has %lld inputs (a multiple of 32 is needed)", base,
                     (long long)g, (long long)start[g + 1]);
    start[g + 1] += start[g];
  }
  bool identity = true;
  for (int64_t k = 0; k < L->in && !rc; k++) {
    int64_t j = start[quant_group(L, k)]++;
    perm[j] = (int32_t)k;
    identity = identity && j == k;
  }
  free(start);
  if (rc || identity) {
    free(perm);
    perm = NULL;
  }
  *perm_out = perm;
  return rc;
}

/* ---- repacking ---------------------------------------------------------- */

/* The 4-bit values of outputs [n0, n0 + nt) for every input: v[(n - n0) * in + k]. */
static void quant_unpack_tile(const model_quant_layer_t *L, int64_t n0, int64_t nt, uint8_t *v) {
  const int64_t in = L->in, out = L->out;
  if (L->q.method == MODEL_QUANT_GPTQ) { /* word (k / 8, n), nibble k % 8 */
    for (int64_t kp = 0; kp < in / 8; kp++)
      for (int64_t n = n0; n < n0 + nt; n++) {
        uint32_t w = quant_u32(L->qweight, kp * out + n);
        for (int i = 0; i < 8; i++) v[(n - n0) * in + kp * 8 + i] = (uint8_t)(w >> (4 * i) & 15);
      }
    return;
  }
  for (int64_t k = 0; k < in; k++) /* AWQ: word (k, n / 8), nibble kAwqPos[n % 8] */
    for (int64_t n8 = n0 / 8; n8 < (n0 + nt) / 8; n8++) {
      uint32_t w = quant_u32(L->qweight, k * (out / 8) + n8);
      for (int c = 0; c < 8; c++) v[(n8 * 8 + c - n0) * in + k] = (uint8_t)(w >> (4 * kAwqPos[c]) & 15);
    }
}

/* Row n's I4G blocks from its unpacked values v (in entries). */
static void quant_pack_row(const model_quant_layer_t *L, int64_t n, const uint8_t *v, uint8_t *row) {
  const int32_t *perm = L->perm;
  for (int64_t b = 0; b < L->in / 32; b++) {
    uint8_t *blk = row + b * 24;
    const int64_t k0 = perm ? perm[b * 32] : b * 32, g = quant_group(L, k0);
    const float d = quant_scale(L, g, n), m = -d * (float)quant_zero(L, g, n); /* exact: d has <= 11 bits */
    memcpy(blk, &d, 4);
    memcpy(blk + 4, &m, 4);
    for (int j = 0; j < 16; j++) {
      const int64_t lo = perm ? perm[b * 32 + j] : b * 32 + j, hi = perm ? perm[b * 32 + j + 16] : b * 32 + j + 16;
      blk[8 + j] = (uint8_t)(v[lo] | v[hi] << 4);
    }
  }
}

int model_quant_open(const model_quant_t *q, const model_st_t *st, const char *base, model_quant_layer_t *out) {
  memset(out, 0, sizeof *out);
  if (q->method != MODEL_QUANT_GPTQ && q->method != MODEL_QUANT_AWQ)
    return fr_errorf(FR_EFORMAT, "model: %s.qweight is GPTQ/AWQ-packed, but the model has no quantization config "
                     "for GPTQ or AWQ", base);
  int rc = quant_layer(q, st, base, out);
  if (!rc) rc = quant_order(out, base, &out->perm);
  if (rc) model_quant_close(out);
  return rc;
}

void model_quant_close(model_quant_layer_t *l) {
  free(l->perm);
  memset(l, 0, sizeof *l);
}

/* Rows [r0, r0 + nr) of L, already checked, into dst. */
static void quant_rows_range(const model_quant_layer_t *L, int64_t r0, int64_t nr, uint8_t *dst) {
  const size_t row_bytes = kern_row_bytes(KERN_I4G, L->in);
  uint8_t *v = fr_malloc((size_t)QUANT_TILE * (size_t)L->in);
  for (int64_t n0 = r0 / 8 * 8; n0 < r0 + nr; n0 += QUANT_TILE) { /* tiles of whole 32-bit words (AWQ) */
    const int64_t nt = FR_MIN((int64_t)QUANT_TILE, L->out - n0);
    quant_unpack_tile(L, n0, nt, v);
    for (int64_t n = FR_MAX(n0, r0); n < FR_MIN(n0 + nt, r0 + nr); n++)
      quant_pack_row(L, n, v + (n - n0) * L->in, dst + (size_t)(n - r0) * row_bytes);
  }
  free(v);
}

typedef struct {
  const model_quant_layer_t *L;
  int64_t r0, nr;
  uint8_t *dst;
} quant_rows_job_t;

/* A part's share of the rows, in whole 8-row words (fr_pool_fn). */
static void quant_rows_part(void *arg, int ith, int nth) {
  const quant_rows_job_t *j = arg;
  const int64_t a = j->r0 / 8, b = (j->r0 + j->nr + 7) / 8; /* the words the rows touch */
  long lo, hi;
  fr_pool_split((long)(b - a), ith, nth, &lo, &hi);
  const int64_t r0 = FR_MAX((a + lo) * 8, j->r0), r1 = FR_MIN((a + hi) * 8, j->r0 + j->nr);
  if (r0 < r1) quant_rows_range(j->L, r0, r1 - r0, j->dst + (size_t)(r0 - j->r0) * kern_row_bytes(KERN_I4G, j->L->in));
}

int model_quant_rows(const model_quant_layer_t *L, int64_t r0, int64_t nr, fr_pool_t *pool, uint8_t *dst) {
  if (r0 < 0 || nr <= 0 || r0 + nr > L->out)
    return fr_errorf(-EINVAL, "model: rows [%lld, %lld) of a quantized layer of %lld", (long long)r0,
                     (long long)(r0 + nr), (long long)L->out);
  quant_rows_job_t j = {.L = L, .r0 = r0, .nr = nr, .dst = dst};
  if (pool && fr_pool_size(pool) > 1 && nr >= 2 * QUANT_TILE) fr_pool_run(pool, quant_rows_part, &j);
  else quant_rows_part(&j, 0, 1);
  return 0;
}

int model_quant_repack(const model_quant_t *q, const model_st_t *st, const char *base, model_quant_weight_t *out) {
  model_quant_layer_t L;
  memset(out, 0, sizeof *out);
  int rc = model_quant_open(q, st, base, &L);
  if (rc) return rc;
  uint8_t *data = fr_malloc_aligned(kern_row_bytes(KERN_I4G, L.in) * (size_t)L.out);
  rc = model_quant_rows(&L, 0, L.out, NULL, data);
  if (rc) {
    fr_free_aligned(data);
    model_quant_close(&L);
    return rc;
  }
  *out = (model_quant_weight_t){.rows = L.out, .cols = L.in, .x_cols = L.in, .data = data, .perm = L.perm};
  L.perm = NULL; /* the caller's now */
  model_quant_close(&L);
  return 0;
}

/* ---- a range of inputs (tensor parallelism) ------------------------------ */

#define QUANT_BLOCK_BYTES 24 /* an I4G block: f32 d, f32 m, 16 bytes of nibbles */

/* Whether block b of every row of w has block b - 1's (d, m): the columns
 * of both may then share a block exactly. The blocks of one group do. */
static bool quant_same_dm(const model_quant_weight_t *w, size_t row_bytes, int64_t b) {
  for (int64_t r = 0; r < w->rows; r++) {
    const uint8_t *blk = w->data + (size_t)r * row_bytes + (size_t)b * QUANT_BLOCK_BYTES;
    if (memcmp(blk - QUANT_BLOCK_BYTES, blk, 8)) return false;
  }
  return true;
}

/* Ends the part's block in progress with padding columns. */
static void quant_pad_block(int32_t *src, int32_t *perm, int64_t *n) {
  for (; *n % 32; (*n)++) src[*n] = perm[*n] = -1;
}

/* Where each column of the part comes from: src[j], a column of w, and
 * perm[j], the part's input it multiplies (both -1 for padding). The
 * columns of a block in progress all come from w blocks of block k/32 - 1's
 * (d, m), so only a block in progress is checked at w's block boundaries.
 * Returns the part's column count, at most nc + w->cols. */
static int64_t quant_cols_plan(const model_quant_weight_t *w, int64_t c0, int64_t nc, int32_t *src, int32_t *perm) {
  const size_t row_bytes = kern_row_bytes(KERN_I4G, w->cols);
  int64_t n = 0;
  for (int64_t k = 0; k < w->cols; k++) {
    if (k % 32 == 0 && k > 0 && n % 32 && !quant_same_dm(w, row_bytes, k / 32)) quant_pad_block(src, perm, &n);
    const int64_t i = (w->perm ? w->perm[k] : k) - c0;
    if (i < 0 || i >= nc) continue;
    src[n] = (int32_t)k;
    perm[n++] = (int32_t)i;
  }
  quant_pad_block(src, perm, &n);
  return n;
}

/* Nibble k of an I4G row (Q4_1's order: byte j holds columns j and j + 16). */
static uint8_t quant_nibble(const uint8_t *row, int32_t k) {
  if (k < 0) return 0;
  const uint8_t byte = row[(size_t)(k / 32) * QUANT_BLOCK_BYTES + 8 + (size_t)(k % 16)];
  return k % 32 < 16 ? byte & 15 : byte >> 4;
}

/* A row of the part from w's row: each block's (d, m) from the w block of
 * its first column (never padding: padding only ends a block), nibbles from
 * src's columns. */
static void quant_cols_row(const uint8_t *wrow, const int32_t *src, int64_t cols, uint8_t *out) {
  for (int64_t b = 0; b < cols / 32; b++) {
    const int32_t *s = src + b * 32;
    uint8_t *blk = out + (size_t)b * QUANT_BLOCK_BYTES;
    FR_ASSERT(s[0] >= 0);
    memcpy(blk, wrow + (size_t)(s[0] / 32) * QUANT_BLOCK_BYTES, 8);
    for (int j = 0; j < 16; j++) blk[8 + j] = (uint8_t)(quant_nibble(wrow, s[j]) | quant_nibble(wrow, s[j + 16]) << 4);
  }
}

/* Frees perm when it is 0, 1, ..., n - 1 (no padding, no permutation). */
static int32_t *quant_drop_identity(int32_t *perm, int64_t n) {
  for (int64_t j = 0; j < n; j++)
    if (perm[j] != j) return perm;
  free(perm);
  return NULL;
}

int model_quant_cols(const model_quant_weight_t *w, int64_t c0, int64_t nc, model_quant_weight_t *out) {
  memset(out, 0, sizeof *out);
  if (c0 < 0 || nc <= 0 || c0 + nc > w->x_cols || w->cols % 32)
    return fr_errorf(-EINVAL, "model: inputs [%lld, %lld) of a layer of %lld", (long long)c0, (long long)(c0 + nc),
                     (long long)w->x_cols);
  const size_t most = (size_t)(nc + w->cols); /* columns, padding included */
  int32_t *src = fr_malloc(most * sizeof *src), *perm = fr_malloc(most * sizeof *perm);
  const int64_t cols = quant_cols_plan(w, c0, nc, src, perm);
  const size_t rb = kern_row_bytes(KERN_I4G, w->cols), part_rb = kern_row_bytes(KERN_I4G, cols);
  uint8_t *data = fr_malloc((size_t)w->rows * part_rb);
  for (int64_t r = 0; r < w->rows; r++) quant_cols_row(w->data + (size_t)r * rb, src, cols, data + (size_t)r * part_rb);
  free(src);
  *out = (model_quant_weight_t){.rows = w->rows, .cols = cols, .x_cols = nc, .data = data,
                                .perm = quant_drop_identity(perm, cols)};
  return 0;
}
