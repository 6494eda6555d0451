/* kern_types.h - tensor element types, their traits and sizes, the
 * reference dequantizer (ggml's block layouts), KV pool geometry, and device
 * names.
 *
 * Backend-free: the file readers (model/ formats), the coordinator and the
 * CLI use it without linking any backend (ferrum_kern_types). kern.h, the
 * backend interface, includes it.
 *
 * Threads: pure functions over constant tables; any thread.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Tensor element types. Values equal ggml's type ids (GGUF tensor types). */
typedef enum {
  KERN_F32 = 0,
  KERN_F16 = 1,
  KERN_Q4_0 = 2,
  KERN_Q4_1 = 3,
  KERN_Q5_0 = 6,
  KERN_Q5_1 = 7,
  KERN_Q8_0 = 8,
  KERN_Q8_1 = 9, /* activation-side only */
  KERN_Q4_K = 12,
  KERN_Q5_K = 13,
  KERN_Q6_K = 14,
  KERN_Q8_K = 15, /* activation-side only */
  KERN_BF16 = 30,
  /* Not a ggml type (GGUF files never carry it): the form GPTQ and AWQ
   * int4 weights take in memory (model/quant.c, docs/QUANTIZED.md). 32
   * elements: f32 d, f32 m, then 16 bytes of nibbles as Q4_1 (low nibble
   * element j, high nibble element j + 16); x = d * q + m, m = -d * zero. */
  KERN_I4G = 40,
  /* Not a ggml type, and never in host memory: the CUDA backend's layout of
   * a 4-bit weight (Q4_0, Q4_1, Q4_K, I4G) repacked at load for its tensor
   * cores (kernels/cuda/kcu_q4f.cu). Its size traits say 5 bits a
   * weight; its rows are tiled, so a row is not contiguous. */
  KERN_Q4F = 41,
  /* The same for a Q6_K weight (kcu_q4f.cuh): 7 bits a weight. */
  KERN_Q6F = 42,
  /* KERN_Q4F for a weight whose (d, m) are the same over each aligned run
   * of 128 columns in every row (GPTQ and AWQ at group size 128), stored
   * once a run: 4.25 bits a weight. */
  KERN_Q4G = 43,
  /* Not a ggml type: an FP8 E4M3 matmul weight (kern_weight_t.fp8), its
   * rows x cols bytes row after row (row_bytes = cols), then one f32 scale
   * a row (element (r, k) = e4m3 * scale[r]). The CUDA backend makes it at
   * load from a dense weight (vLLM's --quantization fp8), as
   * kern_fp8_quantize_row does; in host memory only as the model hands an
   * FP8 checkpoint's layer to weight_load (a scale per tensor or per row). */
  KERN_F8R = 44,
  /* The same with a scale per 128 x 128 block (an FP8 checkpoint's
   * weight_block_size [128, 128], DeepSeek-V3's and Qwen3's): rows and cols
   * multiples of 128; after the bytes, rows / 128 rows of
   * kern_f8b_scale_cols(cols) f32, block (i, j)'s scale at
   * i * kern_f8b_scale_cols(cols) + j, the rest zero (cuBLASLt's
   * BLK128x128_32F layout). */
  KERN_F8B = 45,
  KERN_TYPE_MAX = 46
} kern_type_t;

typedef struct {
  const char *name; /* "Q4_K" */
  int blck;         /* elements per block (1 for float types) */
  int size;         /* bytes per block */
  bool quantized;
} kern_type_traits_t;

/* Traits of a type, or NULL when the id is unknown or unsupported. */
const kern_type_traits_t *kern_type_traits(int type);

/* The type named by name ("q4_k", "BF16"; case-insensitive), or -1. */
int kern_type_from_name(const char *name);

/* Bytes of a row of n elements; 0 when n is not a multiple of the block
 * size or the type is unknown. */
size_t kern_row_bytes(int type, int64_t n);

/* Dequantizes n elements (a multiple of the block size) of `type` from src
 * into dst (host memory, f32). Reference implementation, also used by tests. */
void kern_dequantize_row(int type, const void *src, float *dst, int64_t n);

/* How a KV pool stores K and V (--kv-cache-dtype, vLLM's names).
 * KERN_KV_AUTO keeps elements of the config's `type`. KERN_KV_INT8 and
 * KERN_KV_FP8 keep one byte per element (int8, or FP8 E4M3) and one
 * symmetric f16 scale per (token, KV head): x = q * scale, with scale =
 * max|x| / 127 (int8) or / 448 (E4M3) over the head's row. */
typedef enum { KERN_KV_AUTO = 0, KERN_KV_INT8 = 1, KERN_KV_FP8 = 2 } kern_kv_dtype_t;

/* A paged KV pool: per layer, K and V each of (n_blocks, block_size,
 * n_kv_heads, head_dim) elements of `type` (F32 or F16 on the CPU, BF16/F16
 * on CUDA), or of bytes when dtype quantizes; then (quantized only) every
 * layer's K and V scales, each (n_blocks, block_size, n_kv_heads) f16. */
typedef struct {
  int n_layers, n_kv_heads, head_dim;
  int block_size, n_blocks;
  kern_type_t type;      /* the element type when dtype is KERN_KV_AUTO */
  kern_kv_dtype_t dtype; /* 0 (auto) unless a quantized cache was asked for */
} kern_kv_config_t;

/* Bytes a pool of this config needs: n_blocks times kern_kv_block_bytes
 * (0 when the config is bad or the size overflows). */
size_t kern_kv_pool_bytes(const kern_kv_config_t *cfg);

/* Bytes of one block over every layer, K and V, scales included. */
size_t kern_kv_block_bytes(const kern_kv_config_t *cfg);

/* Bytes of one layer's K (or V) elements, and of its scales (0 when not
 * quantized). Layer l's K is at base + 2 l layer_bytes, V after it; layer
 * l's K scales at base + 2 n_layers layer_bytes + 2 l scale_bytes, V's
 * after them. */
size_t kern_kv_layer_bytes(const kern_kv_config_t *cfg);
size_t kern_kv_scale_bytes(const kern_kv_config_t *cfg);

/* Parses "auto", "int8", "fp8" (or "fp8_e4m3"), case-insensitive; -1 for
 * anything else. */
int kern_kv_dtype_parse(const char *name);

/* "auto", "int8" or "fp8". */
const char *kern_kv_dtype_name(kern_kv_dtype_t d);

/* FP8 E4M3 (OCP, as CUDA's __nv_fp8_e4m3): to f32, and from f32 rounding
 * to nearest even and saturating to +-448. */
float kern_fp8_e4m3_to_f32(uint8_t x);
uint8_t kern_fp8_e4m3_from_f32(float x);

/* The reference quantizer of a row of n elements to FP8 E4M3 with one f32
 * scale (KERN_F8R's rows, and the FP8 matmul's activations, a token a
 * row): with m = max|x|, q = x * (448 / m) rounded to nearest even and
 * saturated; returns the scale m / 448 (x ~ q * scale). A zero row gets
 * zero bytes and scale 0. */
float kern_fp8_quantize_row(const float *x, int64_t n, uint8_t *q);

/* KERN_F8B: the f32 slots of a block row of scales (cols / 128 rounded up
 * to a multiple of 4), and the scales' bytes after a KERN_F8R or KERN_F8B
 * weight's rows x cols bytes. */
static inline int64_t kern_f8b_scale_cols(int64_t cols) { return (cols / 128 + 3) / 4 * 4; }
static inline size_t kern_f8_scale_bytes(int type, int64_t rows, int64_t cols) {
  return (size_t)(type == KERN_F8B ? rows / 128 * kern_f8b_scale_cols(cols) : rows) * sizeof(float);
}

/* The reference quantizer of one (token, KV head) row of n elements: q
 * (n bytes) and its f16 scale, as every backend's KV append stores them
 * (scale = f16(max|x| / 127 or 448); q = x / scale rounded to nearest even,
 * clamped; a zero row has scale 0). dtype is KERN_KV_INT8 or KERN_KV_FP8. */
void kern_kv_quantize_row(kern_kv_dtype_t dtype, const float *x, int n, void *q, uint16_t *scale);

/* The element of a quantized row as f32 (without the scale). */
static inline float kern_kv_dequant(kern_kv_dtype_t dtype, const void *q, int i) {
  return dtype == KERN_KV_INT8 ? (float)((const int8_t *)q)[i] : kern_fp8_e4m3_to_f32(((const uint8_t *)q)[i]);
}

/* Which pairs of a head rope rotates: a property of how the weights were
 * stored (docs/ARCHITECTURE.md, rope convention), so the file readers report it. */
typedef enum {
  KERN_ROPE_NORM = 0, /* pairs (x[2i], x[2i+1]): GGUF llama */
  KERN_ROPE_NEOX = 1  /* pairs (x[i], x[i + n_rot/2]): HF rotate-half, qwen */
} kern_rope_mode_t;

/* A device name as users write it (--device): "cpu", "cuda" or "cuda:N". */
typedef enum { KERN_DEVICE_CPU = 0, KERN_DEVICE_CUDA = 1 } kern_device_kind_t;

typedef struct {
  kern_device_kind_t kind;
  int index; /* CUDA device ordinal (0 for the CPU) */
} kern_device_t;

/* Parses a device name into out. Returns 0, or -EINVAL (with a message for
 * fr_last_error naming the accepted forms) and leaves out unchanged. */
int kern_device_parse(const char *name, kern_device_t *out);

#define KERN_COMM_ID_MAX 300 /* bytes of the longest tensor-parallel group id (kern.h), NUL included */

/* The device of rank `rank` of a tensor-parallel group of `size` on the
 * device named by name, into out: "cpu" for every rank; "cuda" puts rank r
 * on GPU r (of those CUDA_VISIBLE_DEVICES shows); "cuda:2,3" names one GPU
 * per rank. Returns 0, or -EINVAL with a message (a list shorter than the
 * ranks, one GPU named for several ranks). */
int kern_device_for_rank(const char *name, int rank, int size, char *out, size_t cap);

#ifdef __cplusplus
}
#endif
