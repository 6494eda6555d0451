/* kcu_weights.cu - weights of the CUDA backend: which types it takes,
 * uploads through a ring of pinned host chunks on a copy stream, conversion
 * of dense weights to the activation type, and the dequant scratch that the
 * quantized matmuls need. The ops table (kcu_backend.cu) calls in here. */
#include <stdio.h>
#include <string.h>

#include "common/fr_log.h"
#include "common/fr_read.h"
#include "common/fr_util.h"
#include "kernels/cuda/kcu.cuh"

#define KCU_DEQ_MAX_ELEMS (64ll << 20) /* prefill dequant scratch: at most 128 MB of bf16 */

static bool kcu_is_dense(kern_type_t t) { return t == KERN_F32 || t == KERN_F16 || t == KERN_BF16; }

/* Dense types and the quantized types the kernels read. */
bool kcu__supports_type(kern_type_t t) {
  switch (t) {
  case KERN_F32: case KERN_F16: case KERN_BF16: case KERN_Q4_0: case KERN_Q4_1: case KERN_Q5_0:
  case KERN_Q5_1: case KERN_Q8_0: case KERN_Q4_K: case KERN_Q5_K: case KERN_Q6_K: case KERN_I4G:
    return true;
  default:
    return false;
  }
}

/* Grows the prefill dequant scratch for a quantized weight (outside capture,
 * at load time, so matmul never allocates). */
static int kcu_grow_deq(kcu_ctx_t *c, const kern_weight_t *w) {
  long long want = w->rows * w->cols;
  if (want > KCU_DEQ_MAX_ELEMS) want = FR_MAX(KCU_DEQ_MAX_ELEMS / w->cols, 1) * w->cols;
  if (w->perm) want = FR_MAX(want, (long long)c->q4f_max_n * w->cols); /* a Q4F matmul's gathered input */
#ifdef KCU_HAVE_WG
  if (c->q4f_wg) want = FR_MAX(want, (long long)kcu__q4f_wg_scratch(c, w)); /* the wgmma matmul's */
#endif
  size_t xq_need = (size_t)KCU_QGEMV_MAX_N * (size_t)w->cols;
  if (xq_need > c->xq_cap) {
    kcu__free(c->xq);
    kcu__free(c->xqd);
    c->xq = NULL;
    c->xqd = NULL;
    c->xq_cap = 0;
    int rc = kcu__alloc(c, xq_need, (void **)&c->xq, "GEMV activation scratch");
    if (!rc) rc = kcu__alloc(c, xq_need / KCU_QSUB * sizeof(float2), &c->xqd, "GEMV activation scales");
    if (rc) return rc;
    c->xq_cap = xq_need;
  }
  if ((size_t)want <= c->deq_elems) return 0;
  kcu__free(c->deq);
  c->deq = NULL;
  c->deq_elems = 0;
  int rc = kcu__alloc(c, (size_t)want * c->act_size, &c->deq, "dequant scratch");
  if (rc) return rc;
  c->deq_elems = (size_t)want;
  return 0;
}

/* A permuted weight's column order (kern_weight_t.perm, host) copied to
 * the device into w->priv, where the quantized matmuls read it (a fixed
 * address, so captured graphs replay it). */
static int kcu_perm_upload(kcu_ctx_t *c, kern_weight_t *w) {
  if (!w->perm) return 0;
  int rc = kcu__alloc(c, (size_t)w->cols * sizeof(int32_t), &w->priv, "a weight's column permutation");
  if (rc) return rc;
  KCU_CHECK(cudaMemcpyAsync(w->priv, w->perm, (size_t)w->cols * sizeof(int32_t), cudaMemcpyHostToDevice,
                            c->stream));
  return 0;
}

/* ---- weight uploads through pinned staging -------------------------------------
 * A weight's bytes reach the device through a ring of pinned host chunks
 * and a copy stream (load_stream). They come from mapped host memory (a
 * mmap'd file: each chunk is copied into its pinned chunk, so the page
 * faults of one chunk overlap the DMA of the ones before it) or from spans
 * of files (weight_load_file: io_uring reads straight into the pinned
 * chunks, up to KCU_STAGE_AHEAD chunks read ahead of the DMA, each chunk in
 * pieces that the kernel copies in parallel; the reads run on across
 * weights, and load_end sends the last chunks). Conversions (f32/f16 ->
 * bf16) run chunk by chunk on the backend stream from device staging
 * chunks. Nothing waits at the end of a weight: the backend stream waits on
 * load_tail, and load_end synchronizes. */

/* Where a weight's bytes come from. */
typedef struct {
  const uint8_t *host;            /* mapped bytes, or NULL: */
  const kern_file_span_t *spans;  /* (n_spans) the bytes in order */
  int n_spans;
} kcu_src_t;

static int kcu_read_error(int rc) {
  return fr_errorf(rc, "reading weights: %s", rc == FR_ETRUNCATED ? "the file is shorter than its header says"
                                                                   : fr_strerror(rc));
}

/* Waits for the reads of every chunk being filled and forgets them (no
 * DMA): after a failure, before the ring is freed. */
static void kcu_stage_abandon(kcu_ctx_t *c) {
  for (; c->n_fills > 0; c->n_fills--, c->fill_head = (c->fill_head + 1) % KCU_STAGE_AHEAD)
    fr_reader_wait(c->reader, &c->fills[c->fill_head].reads);
  c->fill_head = 0;
}

/* Waits for the ring's copies and frees it (cleanup; errors ignored). */
void kcu__stage_free(kcu_ctx_t *c) {
  if (c->reader) kcu_stage_abandon(c);
  if (c->load_stream) cudaStreamSynchronize(c->load_stream);
  for (int i = 0; i < KCU_STAGE_N; i++) {
    if (c->stage_free[i]) cudaEventSynchronize(c->stage_free[i]);
    if (c->stage_free[i]) cudaEventDestroy(c->stage_free[i]);
    if (c->stage_copied[i]) cudaEventDestroy(c->stage_copied[i]);
    if (c->stage_pin[i]) cudaFreeHost(c->stage_pin[i]);
    c->stage_free[i] = c->stage_copied[i] = NULL;
    c->stage_pin[i] = NULL;
  }
  kcu__free(c->stage_dev);
  if (c->load_tail) cudaEventDestroy(c->load_tail);
  if (c->load_stream) cudaStreamDestroy(c->load_stream);
  fr_reader_destroy(c->reader);
  c->reader = NULL;
  c->stage_dev = NULL;
  c->load_tail = NULL;
  c->load_stream = NULL;
  c->stage_next = 0;
  memset(c->load_ns, 0, sizeof c->load_ns);
}

static int kcu_stage_alloc(kcu_ctx_t *c) {
  KCU_CHECK(cudaStreamCreateWithFlags(&c->load_stream, cudaStreamNonBlocking));
  KCU_CHECK(cudaEventCreateWithFlags(&c->load_tail, cudaEventDisableTiming));
  for (int i = 0; i < KCU_STAGE_N; i++) {
    KCU_CHECK(cudaHostAlloc(&c->stage_pin[i], KCU_STAGE_BYTES, cudaHostAllocDefault));
    KCU_CHECK(cudaEventCreateWithFlags(&c->stage_copied[i], cudaEventDisableTiming));
    KCU_CHECK(cudaEventCreateWithFlags(&c->stage_free[i], cudaEventDisableTiming));
  }
  c->reader = fr_reader_create(0, 0);
  return 0;
}

/* Makes the staging ring unless it exists. On failure nothing is left. */
static int kcu_stage_make(kcu_ctx_t *c) {
  if (c->load_stream) return 0;
  int rc = kcu_stage_alloc(c);
  if (rc) kcu__stage_free(c);
  return rc;
}

static int kcu_stage_retire(kcu_ctx_t *c);

/* The ring's next chunk (the one taken longest ago), once the copy and
 * conversion that used it last finished reading it; when it is still
 * being read (host chunks taken since made the ring come round), its DMA
 * goes out first. */
static int kcu_stage_take(kcu_ctx_t *c, int *slot) {
  int rc = 0;
  while (rc == 0 && c->n_fills > 0 && c->fills[c->fill_head].slot == c->stage_next) rc = kcu_stage_retire(c);
  if (rc) return rc;
  int i = c->stage_next;
  c->stage_next = (i + 1) % KCU_STAGE_N;
  uint64_t t0 = fr_now_ns();
  KCU_CHECK(cudaEventSynchronize(c->stage_free[i]));
  c->load_ns[1] += fr_now_ns() - t0;
  *slot = i;
  return 0;
}

/* Fills f's pinned chunk from src: copied now (host) or reads queued (files). */
static int kcu_stage_fill(kcu_ctx_t *c, const kcu_src_t *src, kcu_fill_t *f) {
  uint8_t *dst = (uint8_t *)c->stage_pin[f->slot];
  size_t off = f->off, len = f->len, at = 0; /* at: the span's first byte in the weight */
  if (src->host) {
    memcpy(dst, src->host + off, len);
    return 0;
  }
  for (int s = 0; s < src->n_spans && len > 0; at += src->spans[s].len, s++) {
    const kern_file_span_t *sp = &src->spans[s];
    if (off >= at + sp->len) continue;
    size_t in = off - at, n = FR_MIN(sp->len - in, len);
    int rc = fr_reader_read(c->reader, sp->fd, sp->off + in, dst, n, &f->reads);
    if (rc) return kcu_read_error(rc);
    dst += n, off += n, len -= n;
  }
  return 0;
}

/* Queues the filled chunk f's copy to its weight (dst_t == src_t) or to its
 * device staging chunk and its conversion into the weight. */
static int kcu_stage_drain(kcu_ctx_t *c, const kcu_fill_t *f) {
  const int i = f->slot;
  if (f->dst_t == f->src_t) {
    KCU_CHECK(cudaMemcpyAsync((char *)f->dst + f->off, c->stage_pin[i], f->len, cudaMemcpyHostToDevice,
                              c->load_stream));
    KCU_CHECK(cudaEventRecord(c->stage_free[i], c->load_stream));
    return 0;
  }
  const size_t ss = (size_t)kern_type_traits(f->src_t)->size, ds = (size_t)kern_type_traits(f->dst_t)->size;
  char *chunk = (char *)c->stage_dev + (size_t)i * KCU_STAGE_BYTES;
  KCU_CHECK(cudaMemcpyAsync(chunk, c->stage_pin[i], f->len, cudaMemcpyHostToDevice, c->load_stream));
  KCU_CHECK(cudaEventRecord(c->stage_copied[i], c->load_stream));
  KCU_CHECK(cudaStreamWaitEvent(c->stream, c->stage_copied[i], 0));
  int rc = kcu__convert(c, (char *)f->dst + f->off / ss * ds, f->dst_t, chunk, f->src_t, f->len / ss);
  if (rc) return rc;
  KCU_CHECK(cudaEventRecord(c->stage_free[i], c->stream));
  return 0;
}

/* The oldest chunk being filled: once its reads are done, its DMA goes out. */
static int kcu_stage_retire(kcu_ctx_t *c) {
  kcu_fill_t *f = &c->fills[c->fill_head];
  uint64_t t0 = fr_now_ns();
  int err = fr_reader_wait(c->reader, &f->reads);
  c->load_ns[0] += fr_now_ns() - t0;
  c->fill_head = (c->fill_head + 1) % KCU_STAGE_AHEAD;
  c->n_fills--;
  return err ? kcu_read_error(err) : kcu_stage_drain(c, f);
}

/* Sends every chunk being filled (after its reads). */
static int kcu_stage_flush(kcu_ctx_t *c) {
  int rc = 0;
  while (rc == 0 && c->n_fills > 0) rc = kcu_stage_retire(c);
  return rc;
}

/* Queues `bytes` bytes of src of type src_t to dst (device) as dst_t,
 * chunk by chunk through the ring. A chunk from the host goes out as soon
 * as it is copied, past the file chunks being read; from files, the last
 * chunks may still be read when it returns (a later call or load_end sends
 * them). */
static int kcu_stage_upload(kcu_ctx_t *c, void *dst, kern_type_t dst_t, const kcu_src_t *src, kern_type_t src_t,
                            size_t bytes) {
  const size_t ss = dst_t == src_t ? 1 : (size_t)kern_type_traits(src_t)->size;
  const size_t per = KCU_STAGE_BYTES / ss * ss;
  int rc = 0;
  if (dst_t != src_t && !c->stage_dev &&
      (rc = kcu__alloc(c, (size_t)KCU_STAGE_N * KCU_STAGE_BYTES, &c->stage_dev, "weight conversion staging")))
    return rc;
  for (size_t off = 0; rc == 0 && off < bytes; off += per) {
    kcu_fill_t one, *f = &one;
    if (!src->host) {
      if (c->n_fills == KCU_STAGE_AHEAD && (rc = kcu_stage_retire(c))) break;
      f = &c->fills[(c->fill_head + c->n_fills) % KCU_STAGE_AHEAD];
    }
    *f = (kcu_fill_t){.slot = 0, .off = off, .len = FR_MIN(bytes - off, per), .dst = dst, .dst_t = dst_t,
                      .src_t = src_t, .reads = {0, 0}};
    if ((rc = kcu_stage_take(c, &f->slot))) break;
    if (src->host) {
      if ((rc = kcu_stage_fill(c, src, f)) == 0) rc = kcu_stage_drain(c, f);
      continue;
    }
    c->n_fills++;
    rc = kcu_stage_fill(c, src, f);
  }
  return rc;
}

/* Orders the backend stream after every copy queued so far. */
static int kcu_stage_fence(kcu_ctx_t *c) {
  KCU_CHECK(cudaEventRecord(c->load_tail, c->load_stream));
  KCU_CHECK(cudaStreamWaitEvent(c->stream, c->load_tail, 0));
  return 0;
}

/* A 4-bit (or Q6_K) weight's file blocks, uploaded into raw, become
 * w->data's KERN_Q4F, KERN_Q4G or KERN_Q6F (*type; kcu_q4f.cu), allocated
 * here once the blocks say which: once every read and copy of them is
 * done, and the repacking has run, raw may be freed. */
static int kcu_q4f_finish(kcu_ctx_t *c, kern_weight_t *w, const void *raw, kern_type_t *type, const char *what) {
  bool grouped = false;
  int rc = kcu_stage_flush(c);
  if (!rc) rc = kcu_stage_fence(c);
  if (!rc) rc = kcu__q4f_grouped(c, w, raw, &grouped);
  if (rc) return rc;
  *type = kcu__q4f_type(w, grouped);
  uint64_t t0 = fr_now_ns();
  rc = kcu__alloc(c, kcu__q4f_bytes(w, *type), &w->data, what);
  c->load_ns[2] += fr_now_ns() - t0;
  if (!rc) rc = kcu__q4f_repack(c, w->data, w, raw, *type);
  if (!rc) KCU_CHECK(cudaStreamSynchronize(c->stream));
  return rc;
}

/* A dense weight marked fp8, uploaded into raw in the act type, becomes
 * w->data's KERN_F8R (kcu_f8.cu) once every read and copy of it is done;
 * raw may then be freed. */
static int kcu_f8_finish(kcu_ctx_t *c, kern_weight_t *w, const void *raw, const char *what) {
  int rc = kcu_stage_flush(c);
  if (!rc) rc = kcu_stage_fence(c);
  return rc ? rc : kcu__f8_quantize(c, w, raw, what);
}

/* Dense weights become the act type (2-D) or F32 (1-D: norms, biases,
 * inv_freq), or KERN_F8R where the model asks (kern_weight_t.fp8); KERN_F8R
 * and KERN_F8B ones (an FP8 checkpoint's) stay as they are; 4-bit
 * and Q6_K ones that only matmul reads become KERN_Q4F (KERN_Q4G where
 * their (d, m) allow) and KERN_Q6F; other quantized weights are copied as
 * they are. A permutation, if any, goes to w->priv.
 * w->type and w->row_bytes describe what is stored on the device
 * afterwards. On failure nothing is allocated and w->data is NULL. */
static int kcu_weight_upload(kcu_ctx_t *c, kern_weight_t *w, const kcu_src_t *src) {
  int rc = kcu__not_capturing(c, "weight_load");
  if (rc) return rc;
  if (kcu_is_f8(w->type)) { /* an FP8 checkpoint's layer, as it is */
    if (!w->fp8 || !c->be.fp8_weights || w->keep_layout || w->perm)
      return fr_errorf(FR_EUNSUPPORTED, "cuda: a %s weight needs fp8 set, a device of compute capability 8.9 or newer, "
                       "and only matmul reading it", kern_type_traits(w->type)->name);
    char what[96];
    snprintf(what, sizeof what, "a weight (%lld x %lld %s)", (long long)w->rows, (long long)w->cols,
             kern_type_traits(w->type)->name);
    w->data = w->priv = NULL;
    return kcu__f8_upload(c, w, src->host, what);
  }
  if (!kcu__supports_type(w->type) || w->rows <= 0 || w->cols <= 0)
    return fr_errorf(FR_EUNSUPPORTED, "cuda: weight of type %d (%lld x %lld) not supported", (int)w->type,
                     (long long)w->rows, (long long)w->cols);
  const bool dense = kcu_is_dense(w->type);
  if (dense && w->perm) /* the dense GEMV and cuBLAS read x in order */
    return fr_errorf(FR_EUNSUPPORTED, "cuda: a %s weight with a column permutation (act-order) is not supported",
                     kern_type_traits(w->type)->name);
  if (w->fp8 && (!dense || w->rows < 2 || w->keep_layout || !c->be.fp8_weights))
    return fr_errorf(FR_EUNSUPPORTED, "cuda: FP8 weights need %s", !c->be.fp8_weights
                     ? "a device of compute capability 8.9 or newer" : "a dense 2-D weight that only matmul reads");
  const bool q4f = kcu__q4f_takes(c, w), f8 = w->fp8;
  if (kern_weight_x_cols(w) != w->cols && !q4f) /* padding columns: only the Q4F matmul and dequant skip them */
    return fr_errorf(FR_EUNSUPPORTED, "cuda: a GPTQ act-order part with padding columns needs the 4-bit tensor-core "
                     "layout (FERRUM_CUDA_Q4F is off, or %lld columns are not a multiple of 32)", (long long)w->cols);
  /* q4f: the sizes checked are KERN_Q4F's, the larger 4-bit layout; kcu_q4f_finish picks one */
  kern_type_t dst_t = q4f ? kcu__q4f_type(w, false) : !dense ? w->type : w->rows == 1 ? KERN_F32 : c->act;
  size_t row_bytes = kern_row_bytes(w->type, w->cols), dst_rb = kern_row_bytes(dst_t, w->cols), bytes, dst_bytes;
  if (row_bytes == 0 || fr_mul_size(row_bytes, (size_t)w->rows, &bytes) ||
      fr_mul_size(dst_rb, (size_t)w->rows, &dst_bytes))
    return fr_errorf(FR_EFORMAT, "cuda: weight size overflows or cols %lld not a block multiple", (long long)w->cols);
  size_t span_bytes = 0;
  for (int s = 0; !src->host && s < src->n_spans; s++) span_bytes += src->spans[s].len;
  if (!src->host && span_bytes != bytes)
    return fr_errorf(FR_EFORMAT, "cuda: weight of %zu bytes given as file spans of %zu", bytes, span_bytes);
  char what[96];
  snprintf(what, sizeof what, "a weight (%lld x %lld %s)", (long long)w->rows, (long long)w->cols,
           kern_type_traits(w->type)->name);
  w->data = NULL;
  w->priv = NULL;
  void *raw = NULL; /* q4f: the file's blocks, before repacking; f8: the act-type rows, before quantizing */
  if ((rc = kcu_stage_make(c))) return rc;
  uint64_t t0 = fr_now_ns();
  rc = q4f  ? kcu__alloc(c, bytes, &raw, "a weight's blocks before repacking")
       : f8 ? kcu__alloc(c, dst_bytes, &raw, "a weight's rows before FP8 quantization")
            : kcu__alloc(c, dst_bytes, &w->data, what);
  c->load_ns[2] += fr_now_ns() - t0;
  if (rc) goto fail;
  if ((rc = kcu_stage_upload(c, raw ? raw : w->data, q4f ? w->type : dst_t, src, w->type, bytes))) goto fail;
  rc = q4f ? kcu_q4f_finish(c, w, raw, &dst_t, what) : f8 ? kcu_f8_finish(c, w, raw, what) : kcu_stage_fence(c);
  if (rc) goto fail;
  if (f8) dst_t = KERN_F8R;
  dst_rb = kern_row_bytes(dst_t, w->cols);
  kcu__free(raw);
  raw = NULL;
  if (!dense && (rc = kcu_grow_deq(c, w))) goto fail;
  if ((rc = kcu_perm_upload(c, w))) goto fail;
  w->type = dst_t;
  w->row_bytes = dst_rb;
  return 0;
fail:
  /* earlier weights' chunks still go out (this one's too, into memory freed only after the syncs); no
   * read, copy or conversion may still write w->data when it is freed */
  if (c->reader && kcu_stage_flush(c)) kcu_stage_abandon(c);
  if (c->load_stream) cudaStreamSynchronize(c->load_stream);
  cudaStreamSynchronize(c->stream);
  kcu__free(raw);
  kcu__free(w->data);
  kcu__free(w->priv);
  w->data = NULL;
  w->priv = NULL;
  return rc;
}

int kcu__weight_load(kcu_ctx_t *c, kern_weight_t *w, const void *host_data) {
  const kcu_src_t src = {.host = (const uint8_t *)host_data, .spans = NULL, .n_spans = 0};
  return kcu_weight_upload(c, w, &src);
}

int kcu__weight_load_file(kcu_ctx_t *c, kern_weight_t *w, const kern_file_span_t *spans, int n_spans) {
  const kcu_src_t src = {.host = NULL, .spans = spans, .n_spans = n_spans};
  return kcu_weight_upload(c, w, &src);
}

/* Waits for the weight copies in flight and frees the staging ring. */
int kcu__load_end(kcu_ctx_t *c) {
  int rc = kcu__not_capturing(c, "load_end");
  if (rc || !c->load_stream) return rc;
  if ((rc = kcu_stage_flush(c))) {
    kcu__stage_free(c);
    return rc;
  }
  KCU_CHECK(cudaStreamSynchronize(c->load_stream));
  KCU_CHECK(cudaStreamSynchronize(c->stream));
  FR_LOGD("cuda: weight staging %s: %.3f s waiting for reads, %.3f s for free chunks, %.3f s in cudaMalloc",
          fr_reader_async(c->reader) ? "io_uring" : "pread", c->load_ns[0] / 1e9, c->load_ns[1] / 1e9,
          c->load_ns[2] / 1e9);
  kcu__stage_free(c);
  return 0;
}

/* Frees a weight's device copy (and its device permutation). */
void kcu__weight_release(kern_weight_t *w) {
  kcu__free(w->data);
  kcu__free(w->priv);
  w->data = NULL;
  w->priv = NULL;
}
