/* test_cuda_weights.c - weight_load and weight_load_file of the CUDA
 * backend (pinned staging ring, io_uring reads, copy stream, chunked
 * conversion, 4-bit repacking), checked bit-exactly: each weight
 * is downloaded and compared with its host bytes (copied types), with the
 * host conversion (f32/f16 -> the activation type, f16 -> f32 vectors) or
 * with a host repacking into KERN_Q4F written from its layout
 * (kernels/cuda/kcu_q4f.cu). The staging tests load with keep_layout, so
 * quantized bytes are copied as they are.
 * Sizes cross the staging chunk (KCU_STAGE_BYTES, 16 MiB) and are not
 * multiples of it; enough weights go through to wrap the ring many times.
 *
 * Exits 77 (skipped) when built without CUDA or when no CUDA device is
 * present. The device probe runs in a child process: a CUDA context must not
 * exist in the parent before Check forks the tests. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "kernels/kern.h"
#include "tests/gpu/gpu_main.h"

#define CHUNK (16u << 20) /* KCU_STAGE_BYTES */

static kern_backend_t *gpu;
static uint64_t rng_state;

static void setup(void) {
  rng_state = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
  int rc = kern_cuda_create(&gpu, 0);
  ck_assert_msg(rc == 0, "kern_cuda_create: %s", fr_last_error());
}

static void teardown(void) {
  kern_backend_destroy(gpu);
  gpu = NULL;
}

static uint64_t rnd64(void) {
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Random bytes of a weight: any bytes for quantized types (copied), finite
 * values for float types (converted). */
static void *rand_bytes(kern_type_t t, size_t bytes) {
  uint8_t *p = fr_malloc(bytes + 8);
  for (size_t i = 0; i < bytes; i += 8) {
    uint64_t v = rnd64();
    memcpy(p + i, &v, 8);
  }
  if (t == KERN_F32) {
    float *f = (float *)p;
    for (size_t i = 0; i < bytes / 4; i++) {
      uint64_t r = rnd64();
      f[i] = (float)((int64_t)(r >> 40) - (1 << 23)) * 0x1p-23f * (float)(1 << (r % 16));
    }
  } else if (t == KERN_F16 || t == KERN_BF16) { /* no inf / NaN (bf16 converts in f16 mode) */
    uint16_t *h = (uint16_t *)p;
    for (size_t i = 0; i < bytes / 2; i++) {
      if (t == KERN_F16 && ((h[i] >> 10) & 0x1f) == 0x1f) h[i] &= 0xbfff;
      if (t == KERN_BF16 && ((h[i] >> 7) & 0xff) == 0xff) h[i] &= 0xbfff;
    }
  }
  return p;
}

/* What the device should hold for a weight loaded from src: the bytes
 * themselves, or src converted to dst_t element by element. */
static void *expected(kern_type_t src_t, kern_type_t dst_t, const void *src, size_t n, size_t bytes) {
  if (src_t == dst_t) {
    void *e = fr_malloc(bytes);
    memcpy(e, src, bytes);
    return e;
  }
  float *f = fr_malloc(n * sizeof(float));
  kern_dequantize_row(src_t, src, f, (int64_t)n);
  if (dst_t == KERN_F32) return f;
  uint16_t *h = fr_malloc(n * 2);
  for (size_t i = 0; i < n; i++) h[i] = dst_t == KERN_BF16 ? fr_fp32_to_bf16(f[i]) : fr_fp32_to_fp16(f[i]);
  free(f);
  return h;
}

typedef struct {
  kern_weight_t w;
  void *want;       /* expected device bytes */
  size_t want_bytes;
} loaded_t;

/* Loads a random weight of type t (rows, cols); the host data is
 * overwritten right after weight_load returns (the backend must be done
 * reading it). */
static loaded_t load_one(kern_type_t t, int64_t rows, int64_t cols) {
  loaded_t l = {.w = {.type = t, .rows = rows, .cols = cols, .row_bytes = kern_row_bytes(t, cols),
                      .keep_layout = true}};
  ck_assert_uint_gt(l.w.row_bytes, 0);
  size_t bytes = l.w.row_bytes * (size_t)rows, n = (size_t)rows * (size_t)cols;
  bool dense = t == KERN_F32 || t == KERN_F16 || t == KERN_BF16;
  kern_type_t dst_t = !dense ? t : rows == 1 ? KERN_F32 : gpu->act_type;
  void *src = rand_bytes(t, bytes);
  l.want = expected(t, dst_t, src, n, bytes);
  l.want_bytes = kern_row_bytes(dst_t, cols) * (size_t)rows;
  int rc = gpu->ops->weight_load(gpu->ctx, &l.w, src);
  ck_assert_msg(rc == 0, "weight_load %s (%lld x %lld): %s", kern_type_traits(t)->name, (long long)rows,
                (long long)cols, fr_last_error());
  memset(src, 0xa5, bytes);
  free(src);
  ck_assert_int_eq(l.w.type, dst_t);
  ck_assert_uint_eq(l.w.row_bytes * (size_t)rows, l.want_bytes);
  return l;
}

/* Downloads the weight, compares it bit for bit, releases it. */
static void check_one(loaded_t *l) {
  uint8_t *got = fr_malloc(l->want_bytes);
  ck_assert_int_eq(gpu->ops->download(gpu->ctx, got, l->w.data, l->want_bytes), 0);
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < l->want_bytes; i++)
    if (got[i] != ((const uint8_t *)l->want)[i] && !bad++) first = i;
  ck_assert_msg(bad == 0, "%s (%lld x %lld): %zu of %zu bytes differ, first at %zu",
                kern_type_traits(l->w.type)->name, (long long)l->w.rows, (long long)l->w.cols, bad, l->want_bytes,
                first);
  free(got);
  free(l->want);
  gpu->ops->weight_release(gpu->ctx, &l->w);
}

static void load_check(kern_type_t t, int64_t rows, int64_t cols) {
  loaded_t l = load_one(t, rows, cols);
  check_one(&l);
}

/* An unlinked temporary file for file-backed weights. */
static int temp_file(void) {
  char path[] = "/tmp/ferrum-weights-XXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  unlink(path);
  return fd;
}

static void write_at(int fd, const void *p, size_t n, uint64_t off) {
  ck_assert_int_eq(pwrite(fd, p, n, (off_t)off), (ssize_t)n);
}

/* How a file-backed weight's bytes are laid out in its file. */
typedef enum {
  SPANS_ONE,   /* one span, at an odd offset */
  SPANS_CUTS,  /* cut at random points into spans, some a few bytes long, stored in reverse order */
  SPANS_ROWS,  /* one span per row, each row followed by other bytes (a column slice of a wider tensor) */
} spans_kind_t;

/* Loads a random weight of type t (rows, cols) with weight_load_file from
 * fd, laid out as kind says; the bytes are on disk only (the page cache). */
static loaded_t load_one_file(int fd, kern_type_t t, int64_t rows, int64_t cols, spans_kind_t kind) {
  loaded_t l = {.w = {.type = t, .rows = rows, .cols = cols, .row_bytes = kern_row_bytes(t, cols),
                      .keep_layout = true}};
  size_t rb = l.w.row_bytes, bytes = rb * (size_t)rows, n = (size_t)rows * (size_t)cols;
  bool dense = t == KERN_F32 || t == KERN_F16 || t == KERN_BF16;
  kern_type_t dst_t = !dense ? t : rows == 1 ? KERN_F32 : gpu->act_type;
  uint8_t *src = rand_bytes(t, bytes);
  l.want = expected(t, dst_t, src, n, bytes);
  l.want_bytes = kern_row_bytes(dst_t, cols) * (size_t)rows;
  ck_assert_int_eq(ftruncate(fd, 0), 0);
  kern_file_span_t *spans = NULL;
  int ns = 0;
  if (kind == SPANS_ONE) {
    spans = fr_malloc(sizeof *spans);
    spans[ns++] = (kern_file_span_t){.fd = fd, .off = 4099, .len = bytes};
    write_at(fd, src, bytes, 4099);
  } else if (kind == SPANS_ROWS) {
    spans = fr_malloc((size_t)rows * sizeof *spans);
    for (int64_t r = 0; r < rows; r++) {
      uint64_t off = 512 + (uint64_t)r * (rb + 96);
      spans[ns++] = (kern_file_span_t){.fd = fd, .off = off, .len = rb};
      write_at(fd, src + (size_t)r * rb, rb, off);
    }
  } else { /* pieces of 1 byte to 3 MB, written back to front in the file */
    spans = fr_malloc(4096 * sizeof *spans);
    uint64_t end = bytes + 1000000;
    for (size_t at = 0; at < bytes && ns < 4095;) {
      size_t r = rnd64() % 4 == 0 ? 1 + rnd64() % 64 : 1 + rnd64() % (3u << 20), len = FR_MIN(bytes - at, r);
      end -= len + 7;
      spans[ns++] = (kern_file_span_t){.fd = fd, .off = end, .len = len};
      write_at(fd, src + at, len, end);
      at += len;
    }
    ck_assert_int_lt(ns, 4095);
  }
  int rc = gpu->ops->weight_load_file(gpu->ctx, &l.w, spans, ns);
  ck_assert_msg(rc == 0, "weight_load_file %s (%lld x %lld): %s", kern_type_traits(t)->name, (long long)rows,
                (long long)cols, fr_last_error());
  free(spans);
  free(src);
  ck_assert_int_eq(l.w.type, dst_t);
  return l;
}

/* ---- tests ---------------------------------------------------------------------- */

/* Shapes around the chunk size: under it, just over it, several chunks
 * (more than the ring holds), none a multiple of it. */
static const struct {
  kern_type_t type;
  int64_t rows, cols;
} k_shapes[] = {
    {KERN_F32, 3001, 2048},   /* 24.6 MB f32 -> act: 2 conversion chunks */
    {KERN_F32, 9, 4096},      /* small conversion */
    {KERN_F16, 11007, 4096},  /* 90 MB f16 -> act: 6 chunks, the ring wraps */
    {KERN_BF16, 5003, 2048},  /* 20.5 MB copied as is (bf16 act) or converted (f16 act) */
    {KERN_F32, 1, 100003},    /* a vector: stays f32 */
    {KERN_F16, 1, 4097},      /* an f16 vector: converted to f32 */
    {KERN_Q4_K, 7777, 4096},  /* 17.9 MB: one chunk and a bit */
    {KERN_Q8_0, 20011, 4096}, /* 87 MB: 6 chunks */
    {KERN_Q6_K, 3, 256},      /* one small copy */
    {KERN_Q4_1, 49152, 576},  /* SmolLM2's embedding table */
    {KERN_I4G, 14336, 4096},  /* 44 MB of GPTQ int4 (Llama-3-8B's down_proj transposed): 3 chunks */
};

START_TEST(test_shapes) {
  load_check(k_shapes[_i].type, k_shapes[_i].rows, k_shapes[_i].cols);
  ck_assert_int_eq(gpu->ops->load_end(gpu->ctx), 0);
}
END_TEST

/* Many weights loaded back to back, checked only after all of them were
 * queued (and before load_end): later ops are ordered after the copies. */
START_TEST(test_many_in_flight) {
  enum { N = 24 };
  loaded_t ls[N];
  for (int i = 0; i < N; i++) {
    int64_t rows = 1 + (int64_t)(rnd64() % 3000);
    ls[i] = load_one(i % 3 == 0 ? KERN_F32 : i % 3 == 1 ? KERN_Q4_0 : KERN_BF16, rows, 1024 + 32 * (i % 5));
  }
  for (int i = 0; i < N; i++) check_one(&ls[i]);
  ck_assert_int_eq(gpu->ops->load_end(gpu->ctx), 0);
}
END_TEST

/* load_end frees the staging; a later load makes it again; load_end with
 * nothing loaded is fine. */
START_TEST(test_load_end_then_load) {
  ck_assert_ptr_nonnull(gpu->ops->load_end);
  ck_assert_int_eq(gpu->ops->load_end(gpu->ctx), 0);
  load_check(KERN_Q4_K, 8000, 4096);
  ck_assert_int_eq(gpu->ops->load_end(gpu->ctx), 0);
  ck_assert_int_eq(gpu->ops->load_end(gpu->ctx), 0);
  load_check(KERN_F32, 2100, 2048);
  ck_assert_int_eq(gpu->ops->load_end(gpu->ctx), 0);
  /* loaded weights stay usable by ops after load_end */
  loaded_t l = load_one(KERN_F32, 64, 256);
  ck_assert_int_eq(gpu->ops->load_end(gpu->ctx), 0);
  check_one(&l);
}
END_TEST

/* A weight that cannot fit is FR_EDEVOOM with a message, and the backend
 * loads the next one. */
START_TEST(test_oom_is_an_error) {
  kern_weight_t w = {.type = KERN_Q8_0, .rows = (int64_t)1 << 32, .cols = 4096};
  w.row_bytes = kern_row_bytes(w.type, w.cols);
  static const uint8_t dummy[64];
  int rc = gpu->ops->weight_load(gpu->ctx, &w, dummy); /* fails before reading host data */
  ck_assert_int_eq(rc, FR_EDEVOOM);
  ck_assert_ptr_null(w.data);
  ck_assert_ptr_nonnull(strstr(fr_last_error(), "weight"));
  fprintf(stderr, "  oom message: %s\n", fr_last_error());
  load_check(KERN_Q4_K, 100, 4096);
  ck_assert_int_eq(gpu->ops->load_end(gpu->ctx), 0);
}
END_TEST

/* The shapes again, read from files by the backend (each layout), checked
 * after load_end. */
START_TEST(test_files_shapes) {
  int fd = temp_file();
  loaded_t l = load_one_file(fd, k_shapes[_i].type, k_shapes[_i].rows, k_shapes[_i].cols, (spans_kind_t)(_i % 3));
  ck_assert_int_eq(gpu->ops->load_end(gpu->ctx), 0);
  check_one(&l);
  close(fd);
}
END_TEST

/* File-backed weights and host weights interleaved, more than the ring
 * holds in flight, each file its own; all checked after load_end. */
START_TEST(test_files_many) {
  enum { N = 30 };
  loaded_t ls[N];
  int fds[N];
  for (int i = 0; i < N; i++) {
    int64_t rows = 1 + (int64_t)(rnd64() % 6000);
    kern_type_t t = i % 3 == 0 ? KERN_F32 : i % 3 == 1 ? KERN_Q4_0 : KERN_BF16;
    fds[i] = temp_file();
    ls[i] = i % 4 == 3 ? load_one(t, rows, 2048) : load_one_file(fds[i], t, rows, 2048, (spans_kind_t)(i % 3));
  }
  ck_assert_int_eq(gpu->ops->load_end(gpu->ctx), 0);
  for (int i = 0; i < N; i++) {
    check_one(&ls[i]);
    close(fds[i]);
  }
}
END_TEST

/* A span past the end of its file: the load fails with a message naming the
 * read (from weight_load_file or load_end), and the backend loads on. */
START_TEST(test_file_too_short) {
  int fd = temp_file();
  uint8_t junk[4096] = {0};
  write_at(fd, junk, sizeof junk, 0);
  kern_weight_t w = {.type = KERN_Q8_0, .rows = 64, .cols = 4096};
  w.row_bytes = kern_row_bytes(w.type, w.cols);
  kern_file_span_t span = {.fd = fd, .off = 0, .len = w.row_bytes * 64};
  int rc = gpu->ops->weight_load_file(gpu->ctx, &w, &span, 1);
  if (rc == 0) rc = gpu->ops->load_end(gpu->ctx);
  ck_assert_int_eq(rc, FR_ETRUNCATED);
  ck_assert_ptr_nonnull(strstr(fr_last_error(), "reading weights"));
  if (w.data) gpu->ops->weight_release(gpu->ctx, &w);
  span.len = 100; /* spans that do not add up to the weight */
  w = (kern_weight_t){.type = KERN_Q8_0, .rows = 64, .cols = 4096, .row_bytes = kern_row_bytes(KERN_Q8_0, 4096)};
  ck_assert_int_eq(gpu->ops->weight_load_file(gpu->ctx, &w, &span, 1), FR_EFORMAT);
  loaded_t l = load_one_file(fd, KERN_Q4_K, 100, 4096, SPANS_ONE);
  ck_assert_int_eq(gpu->ops->load_end(gpu->ctx), 0);
  check_one(&l);
  close(fd);
}
END_TEST

/* ---- KERN_Q4F -------------------------------------------------------------------- */

/* The 4-bit value of (row, col) and the (d, m) of its 32-column block in a
 * Q4_0 or I4G weight (the nibbles of both: byte j holds element j low,
 * j + 16 high, after 2 bytes of f16 d or 8 bytes of f32 d, m). */
static int q4_at(kern_type_t t, const uint8_t *w, size_t rb, int64_t row, int64_t col) {
  const int bytes = t == KERN_Q4_0 ? 18 : 24, off = t == KERN_Q4_0 ? 2 : 8;
  int b = w[(size_t)row * rb + (size_t)(col / 32) * bytes + off + col % 16];
  return col % 32 < 16 ? b & 15 : b >> 4;
}

static void q4_dm(kern_type_t t, const uint8_t *w, size_t rb, int64_t row, int64_t blk, float *d, float *m) {
  const uint8_t *p = w + (size_t)row * rb + (size_t)blk * (t == KERN_Q4_0 ? 18 : 24);
  if (t == KERN_Q4_0) {
    uint16_t h;
    memcpy(&h, p, 2);
    *d = fr_fp16_to_fp32(h), *m = -8.f * *d;
  } else {
    memcpy(d, p, 4), memcpy(m, p + 4, 4);
  }
}

/* KERN_Q4F of w as its layout says: per (16-row tile, 64-column unit),
 * 512 bytes of nibbles (lane L = 4 g + t: 4 words, word 2 b + s with slot
 * p the weight at row g + 8 (p & 1), column 32 b + 8 t + 4 s + 2 (p >> 1)
 * and slot p + 4 the next column), all nibbles first, then per (tile,
 * unit) 128 bytes of act-type (d, m): 16 per g, rows g and g + 8 of block
 * 0, then of block 1. Rows and columns past the weight are zero.
 * KERN_Q4G (grouped): the same nibbles, then per (tile, pair of units) 64
 * bytes: 8 per g, the (d, m) of rows g and g + 8 at the pair's first
 * block. */
static uint8_t *q4f_ref(kern_type_t t, const uint8_t *w, int64_t rows, int64_t cols, bool grouped, size_t *bytes) {
  const size_t rb = kern_row_bytes(t, cols);
  const int64_t tiles = (rows + 15) / 16, units = (cols + 63) / 64, pairs = (units + 1) / 2;
  *bytes = (size_t)(tiles * units) * 512 + (size_t)(tiles * (grouped ? pairs * 64 : units * 128));
  uint8_t *out = calloc(1, *bytes);
  uint32_t *nib = (uint32_t *)out;
  uint16_t *dm = (uint16_t *)(out + (size_t)(tiles * units) * 512);
  for (int64_t tile = 0; tile < tiles; tile++)
    for (int64_t u = 0; u < units; u++)
      for (int lane = 0; lane < 32; lane++) {
        const int g = lane / 4, tt = lane % 4;
        uint32_t *wd = nib + ((size_t)(tile * units + u) * 32 + lane) * 4;
        for (int b = 0; b < 2; b++)
          for (int sk = 0; sk < 2; sk++)
            for (int p = 0; p < 4; p++) {
              int64_t row = tile * 16 + g + 8 * (p & 1), col = u * 64 + 32 * b + 8 * tt + 4 * sk + 2 * (p >> 1);
              if (row >= rows || col >= cols) continue;
              wd[2 * b + sk] |= (uint32_t)q4_at(t, w, rb, row, col) << (4 * p);
              wd[2 * b + sk] |= (uint32_t)q4_at(t, w, rb, row, col + 1) << (16 + 4 * p);
            }
        if (tt || (grouped && u % 2)) continue;
        uint16_t *o = dm + ((size_t)(grouped ? tile * pairs + u / 2 : tile * units + u) * 8 + g) * (grouped ? 4 : 8);
        for (int j = 0; j < (grouped ? 2 : 4); j++) {
          int64_t row = tile * 16 + g + 8 * (j & 1), blk = 2 * u + (j >> 1);
          float d = 0, m = 0;
          if (row < rows && 32 * blk < cols) q4_dm(t, w, rb, row, blk, &d, &m);
          o[2 * j] = fr_fp32_to_bf16(d), o[2 * j + 1] = fr_fp32_to_bf16(m);
        }
      }
  return out;
}

/* Q6_K's 6-bit q (0..63) of (row, col) and its 16 columns' scale, from
 * ggml's dequantize_row_q6_K: per 256 columns ql[128], qh[64], int8
 * scales[16], f16 d; column e of a super-block, e = 128 n + 32 k + l:
 * low 4 bits from ql[64 n + 32 (k % 2) + l] (high nibble for k >= 2),
 * high 2 from qh[32 n + l] >> 2 k, scale d * scales[8 n + 2 k + l / 16]. */
static int q6k_at(const uint8_t *w, size_t rb, int64_t row, int64_t col, float *scale) {
  const uint8_t *sb = w + (size_t)row * rb + (size_t)(col / 256) * 210;
  const int e = (int)(col % 256), n = e / 128, k = e % 128 / 32, l = e % 32;
  const int lo = (sb[64 * n + 32 * (k % 2) + l] >> (4 * (k / 2))) & 15, hi = (sb[128 + 32 * n + l] >> (2 * k)) & 3;
  uint16_t d;
  memcpy(&d, sb + 208, 2);
  *scale = fr_fp16_to_fp32(d) * (float)(int8_t)sb[192 + 8 * n + 2 * k + l / 16];
  return lo | hi << 4;
}

/* KERN_Q6F of a Q6_K w as its layout says (kcu_q4f.cuh): the nibbles of
 * q's low bits as q4f_ref places them, then per (tile, unit) 256 bytes of
 * high bits (lane L: 2 words, word b holding nibble word 2 b + s's slot p
 * at bit 8 s + 2 p and slot p + 4 at 16 + 8 s + 2 p), then per (tile,
 * unit) 128 bytes of bf16 scale pairs (columns 0..15, 16..31 of a block)
 * where q4f_ref has (d, m). Rows past the weight are zero. */
static uint8_t *q6f_ref(const uint8_t *w, int64_t rows, int64_t cols, size_t *bytes) {
  const size_t rb = kern_row_bytes(KERN_Q6_K, cols);
  const int64_t tiles = (rows + 15) / 16, units = cols / 64;
  *bytes = (size_t)(tiles * units) * 896;
  uint8_t *out = calloc(1, *bytes);
  uint32_t *nib = (uint32_t *)out, *hi = (uint32_t *)(out + (size_t)(tiles * units) * 512);
  uint16_t *sc = (uint16_t *)(out + (size_t)(tiles * units) * 768);
  float unused;
  for (int64_t tile = 0; tile < tiles; tile++)
    for (int64_t u = 0; u < units; u++)
      for (int lane = 0; lane < 32; lane++) {
        const int g = lane / 4, tt = lane % 4;
        const size_t at = (size_t)(tile * units + u) * 32 + lane;
        for (int b = 0; b < 2; b++)
          for (int sk = 0; sk < 2; sk++)
            for (int p = 0; p < 8; p++) { /* slots 4..7: the next column */
              int64_t row = tile * 16 + g + 8 * (p & 1), col = u * 64 + 32 * b + 8 * tt + 4 * sk + 2 * ((p & 3) >> 1) + p / 4;
              if (row >= rows) continue;
              const uint32_t q = (uint32_t)q6k_at(w, rb, row, col, &unused);
              nib[at * 4 + 2 * b + sk] |= (q & 15) << (4 * (p & 3) + 16 * (p / 4));
              hi[at * 2 + b] |= (q >> 4) << (8 * sk + 2 * (p & 3) + 16 * (p / 4));
            }
        if (tt) continue;
        uint16_t *o = sc + ((size_t)(tile * units + u) * 8 + g) * 8;
        for (int j = 0; j < 4; j++) {
          int64_t row = tile * 16 + g + 8 * (j & 1), c0 = u * 64 + 32 * (j >> 1);
          float s0 = 0, s1 = 0;
          if (row < rows) q6k_at(w, rb, row, c0, &s0), q6k_at(w, rb, row, c0 + 16, &s1);
          o[2 * j] = fr_fp32_to_bf16(s0), o[2 * j + 1] = fr_fp32_to_bf16(s1);
        }
      }
  return out;
}

/* Random Q4_0 / I4G / Q6_K bytes with finite scales; a 4-bit type's the
 * same over each run of `run` blocks of a row (1: all differ). */
static uint8_t *rand_q4(kern_type_t t, int64_t rows, int64_t cols, int run) {
  const size_t rb = kern_row_bytes(t, cols);
  uint8_t *h = rand_bytes(t, rb * (size_t)rows);
  if (t == KERN_Q6_K) {
    for (int64_t r = 0; r < rows; r++)
      for (int64_t b = 0; b < cols / 256; b++) {
        uint16_t f = fr_fp32_to_fp16((float)(rnd64() % 1000 + 1) * 1e-5f);
        memcpy(h + (size_t)r * rb + (size_t)b * 210 + 208, &f, 2);
      }
    return h;
  }
  float d = 0, m = 0;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t b = 0; b < cols / 32; b++) {
      uint8_t *p = h + (size_t)r * rb + (size_t)b * (t == KERN_Q4_0 ? 18 : 24);
      if (b % run == 0) d = (float)(rnd64() % 1000 + 1) * 1e-5f, m = -d * (float)(rnd64() % 16);
      if (t == KERN_Q4_0) {
        uint16_t f = fr_fp32_to_fp16(d);
        memcpy(p, &f, 2);
      } else {
        memcpy(p, &d, 4), memcpy(p + 4, &m, 4);
      }
    }
  return h;
}

/* A matmul-only 4-bit weight (keep_layout false) becomes KERN_Q4F, a
 * Q6_K one KERN_Q6F, from host memory and from a file cut into spans (the
 * repacking waits for the reads still in flight): rows not a multiple of
 * 16, a last unit of 32 columns, weights past one staging chunk. One whose
 * (d, m) repeat over each 4 blocks of a row (run 4: GPTQ's group of 128)
 * becomes KERN_Q4G, also with a last pair of one unit, of one block, or
 * (4160 columns) of a run of 2 blocks; one such run broken in one row
 * (`odd`) leaves it KERN_Q4F. Downloaded and compared with q4f_ref bit for
 * bit (bf16 activations: the default). */
START_TEST(test_q4f_repack) {
  ck_assert_int_eq(gpu->act_type, KERN_BF16);
  static const struct {
    kern_type_t t;
    int64_t rows, cols;
    int run;
    bool odd;
  } shapes[] = {{KERN_Q4_0, 1000, 4128, 1, false}, {KERN_I4G, 5003, 4096, 1, false}, {KERN_I4G, 37, 96, 1, false},
                {KERN_Q6_K, 1003, 4096, 1, false}, {KERN_Q6_K, 37, 256, 1, false}, {KERN_I4G, 1003, 4096, 4, false},
                {KERN_I4G, 37, 96, 4, false},      {KERN_I4G, 37, 4160, 4, false}, {KERN_Q4_0, 45, 4128, 4, false},
                {KERN_I4G, 37, 4096, 4, true}};
  int fd = temp_file();
  for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
    for (int from_file = 0; from_file < 2; from_file++) {
      const kern_type_t t = shapes[i].t;
      const int64_t rows = shapes[i].rows, cols = shapes[i].cols;
      const size_t rb = kern_row_bytes(t, cols);
      uint8_t *host = rand_q4(t, rows, cols, shapes[i].run);
      if (shapes[i].odd) { /* the last row's block 6 (of the run 4..7): twice the d */
        float d;
        memcpy(&d, host + (size_t)(rows - 1) * rb + 6 * 24, 4);
        d *= 2;
        memcpy(host + (size_t)(rows - 1) * rb + 6 * 24, &d, 4);
      }
      const bool grouped = shapes[i].run == 4 && !shapes[i].odd;
      size_t want_bytes;
      uint8_t *want = t == KERN_Q6_K ? q6f_ref(host, rows, cols, &want_bytes)
                                     : q4f_ref(t, host, rows, cols, grouped, &want_bytes);
      kern_weight_t w = {.type = t, .rows = rows, .cols = cols, .row_bytes = rb};
      int rc;
      if (from_file) {
        ck_assert_int_eq(ftruncate(fd, 0), 0);
        write_at(fd, host, rb * (size_t)rows / 2, 100);
        write_at(fd, host + rb * (size_t)rows / 2, rb * (size_t)rows - rb * (size_t)rows / 2, 1u << 26);
        kern_file_span_t sp[2] = {{.fd = fd, .off = 100, .len = rb * (size_t)rows / 2},
                                  {.fd = fd, .off = 1u << 26, .len = rb * (size_t)rows - rb * (size_t)rows / 2}};
        rc = gpu->ops->weight_load_file(gpu->ctx, &w, sp, 2);
      } else {
        rc = gpu->ops->weight_load(gpu->ctx, &w, host);
      }
      ck_assert_msg(rc == 0, "weight_load: %s", fr_last_error());
      ck_assert_int_eq(w.type, t == KERN_Q6_K ? KERN_Q6F : grouped ? KERN_Q4G : KERN_Q4F);
      uint8_t *got = fr_malloc(want_bytes);
      ck_assert_int_eq(gpu->ops->download(gpu->ctx, got, w.data, want_bytes), 0);
      size_t bad = 0, first = 0;
      for (size_t k = 0; k < want_bytes; k++)
        if (got[k] != want[k] && !bad++) first = k;
      ck_assert_msg(bad == 0, "%s of %s (%lld x %lld, %s): %zu of %zu bytes differ, first at %zu",
                    kern_type_traits(w.type)->name, kern_type_traits(t)->name, (long long)rows, (long long)cols, from_file ? "file" : "host", bad,
                    want_bytes, first);
      gpu->ops->weight_release(gpu->ctx, &w);
      free(got);
      free(want);
      free(host);
    }
  }
  ck_assert_int_eq(gpu->ops->load_end(gpu->ctx), 0);
  close(fd);
}
END_TEST

/* GPTQ/AWQ int4 rows (KERN_I4G) kept in their layout load as they are
 * (24-byte blocks; the shapes above check the bytes); an act-order weight's permutation goes to
 * the device beside it (w->priv, freed by weight_release), checked here
 * value for value; a dense weight with a permutation is refused. */
START_TEST(test_i4g_perm) {
  ck_assert(gpu->ops->supports_type(gpu->ctx, KERN_I4G));
  enum { ROWS = 64, COLS = 4096 };
  int32_t *perm = fr_malloc(COLS * sizeof *perm);
  for (int i = 0; i < COLS; i++) perm[i] = i;
  for (int i = COLS - 1; i > 0; i--) {
    int j = (int)(rnd64() % (uint64_t)(i + 1)), t = perm[i];
    perm[i] = perm[j], perm[j] = t;
  }
  size_t rb = kern_row_bytes(KERN_I4G, COLS);
  uint8_t *host = rand_bytes(KERN_I4G, rb * ROWS);
  kern_weight_t w = {.type = KERN_I4G, .rows = ROWS, .cols = COLS, .row_bytes = rb, .perm = perm,
                     .keep_layout = true};
  ck_assert_msg(gpu->ops->weight_load(gpu->ctx, &w, host) == 0, "weight_load: %s", fr_last_error());
  ck_assert_ptr_nonnull(w.priv);
  int32_t *got = fr_malloc(COLS * sizeof *got);
  uint8_t *bytes = fr_malloc(rb * ROWS);
  ck_assert_int_eq(gpu->ops->download(gpu->ctx, got, w.priv, COLS * sizeof *got), 0);
  ck_assert_int_eq(gpu->ops->download(gpu->ctx, bytes, w.data, rb * ROWS), 0);
  ck_assert(memcmp(got, perm, COLS * sizeof *got) == 0);
  ck_assert(memcmp(bytes, host, rb * ROWS) == 0);
  gpu->ops->weight_release(gpu->ctx, &w);
  ck_assert_ptr_null(w.data);
  ck_assert_ptr_null(w.priv);
  float *dense = calloc((size_t)ROWS * COLS, sizeof(float));
  w = (kern_weight_t){.type = KERN_F32, .rows = ROWS, .cols = COLS, .row_bytes = kern_row_bytes(KERN_F32, COLS),
                      .perm = perm};
  ck_assert_int_eq(gpu->ops->weight_load(gpu->ctx, &w, dense), FR_EUNSUPPORTED);
  ck_assert_ptr_null(w.data);
  ck_assert_ptr_null(w.priv);
  ck_assert_int_eq(gpu->ops->load_end(gpu->ctx), 0);
  free(dense);
  free(got);
  free(bytes);
  free(host);
  free(perm);
}
END_TEST

static Suite *weights_suite(void) {
  Suite *s = suite_create("cuda_weights");
  TCase *tc = tcase_create("weights");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, test_shapes, 0, (int)FR_ARRAY_SIZE(k_shapes));
  tcase_add_test(tc, test_many_in_flight);
  tcase_add_test(tc, test_load_end_then_load);
  tcase_add_test(tc, test_oom_is_an_error);
  tcase_add_loop_test(tc, test_files_shapes, 0, (int)FR_ARRAY_SIZE(k_shapes));
  tcase_add_test(tc, test_files_many);
  tcase_add_test(tc, test_file_too_short);
  tcase_add_test(tc, test_i4g_perm);
  tcase_add_test(tc, test_q4f_repack);
  suite_add_tcase(s, tc);
  return s;
}

/* The shared main (tests/common/test_main.c) runs this program's suites. */
#include "tests/common/test_main.h"

const test_prog_t test_prog = {.suites = {weights_suite}, .setup = gpu_test_setup};
