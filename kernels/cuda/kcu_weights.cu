/* kcu_weights.cu - weights of the CUDA backend: which types it takes,
 * uploads through a ring of pinned host chunks on a copy stream, conversion
 * of dense weights to the activation type, and the dequant scratch that the
 * quantized matmuls need. The ops table (kcu_backend.cu) calls in here. */
#include <stdio.h>
#include <string.h>

#include "common/fr_util.h"
#include "kernels/cuda/kcu.cuh"

#define KCU_DEQ_MAX_ELEMS (64ll << 20) /* prefill dequant scratch: at most 128 MB of bf16 */

static bool kcu_is_dense(kern_type_t t) { return t == KERN_F32 || t == KERN_F16 || t == KERN_BF16; }

/* Dense types and the quantized types the kernels read. */
bool kcu__supports_type(kern_type_t t) {
  switch (t) {
  case KERN_F32: case KERN_F16: case KERN_BF16: case KERN_Q4_0: case KERN_Q4_1: case KERN_Q5_0:
  case KERN_Q5_1: case KERN_Q8_0: case KERN_Q4_K: case KERN_Q5_K: case KERN_Q6_K:
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

/* ---- weight uploads through pinned staging -------------------------------------
 * weight_load copies each chunk of the host data (pageable, often a mmap'd
 * file) into a free pinned chunk on the CPU and queues its DMA on
 * load_stream, so the page faults of one chunk overlap the DMA of the ones
 * before it. Conversions (f32/f16 -> bf16) run chunk by chunk on the backend
 * stream from device staging chunks. Nothing waits at the end of a weight:
 * the backend stream waits on load_tail, and load_end synchronizes. */

/* Waits for the staging ring's copies and frees it (cleanup; errors ignored). */
void kcu__stage_free(kcu_ctx_t *c) {
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
  c->stage_dev = NULL;
  c->load_tail = NULL;
  c->load_stream = NULL;
  c->stage_next = 0;
}

static int kcu_stage_alloc(kcu_ctx_t *c) {
  KCU_CHECK(cudaStreamCreateWithFlags(&c->load_stream, cudaStreamNonBlocking));
  KCU_CHECK(cudaEventCreateWithFlags(&c->load_tail, cudaEventDisableTiming));
  for (int i = 0; i < KCU_STAGE_N; i++) {
    KCU_CHECK(cudaHostAlloc(&c->stage_pin[i], KCU_STAGE_BYTES, cudaHostAllocDefault));
    KCU_CHECK(cudaEventCreateWithFlags(&c->stage_copied[i], cudaEventDisableTiming));
    KCU_CHECK(cudaEventCreateWithFlags(&c->stage_free[i], cudaEventDisableTiming));
  }
  return 0;
}

/* Makes the staging ring unless it exists. On failure nothing is left. */
static int kcu_stage_make(kcu_ctx_t *c) {
  if (c->load_stream) return 0;
  int rc = kcu_stage_alloc(c);
  if (rc) kcu__stage_free(c);
  return rc;
}

/* The ring's next chunk, once the copy and conversion that used it last
 * finished reading it. */
static int kcu_stage_take(kcu_ctx_t *c, int *slot) {
  int i = c->stage_next;
  c->stage_next = (i + 1) % KCU_STAGE_N;
  KCU_CHECK(cudaEventSynchronize(c->stage_free[i]));
  *slot = i;
  return 0;
}

/* Queues bytes of host memory at src to dst (device) through the ring. */
static int kcu_stage_copy(kcu_ctx_t *c, void *dst, const void *src, size_t bytes) {
  for (size_t off = 0; off < bytes; off += KCU_STAGE_BYTES) {
    size_t len = FR_MIN(bytes - off, (size_t)KCU_STAGE_BYTES);
    int i = 0, rc = kcu_stage_take(c, &i);
    if (rc) return rc;
    memcpy(c->stage_pin[i], (const char *)src + off, len);
    KCU_CHECK(cudaMemcpyAsync((char *)dst + off, c->stage_pin[i], len, cudaMemcpyHostToDevice, c->load_stream));
    KCU_CHECK(cudaEventRecord(c->stage_free[i], c->load_stream));
  }
  return 0;
}

/* Queues n dense elements of src_t at src (host) converted to dst_t at dst
 * (device): each chunk is copied to its device staging chunk, then
 * converted on the backend stream once the copy is done. */
static int kcu_stage_convert(kcu_ctx_t *c, void *dst, kern_type_t dst_t, const void *src, kern_type_t src_t,
                             size_t n) {
  const size_t ss = (size_t)kern_type_traits(src_t)->size, ds = (size_t)kern_type_traits(dst_t)->size;
  const size_t per = KCU_STAGE_BYTES / ss;
  int rc = 0;
  if (!c->stage_dev &&
      (rc = kcu__alloc(c, (size_t)KCU_STAGE_N * KCU_STAGE_BYTES, &c->stage_dev, "weight conversion staging")))
    return rc;
  for (size_t e0 = 0; e0 < n; e0 += per) {
    size_t k = FR_MIN(n - e0, per);
    int i = 0;
    if ((rc = kcu_stage_take(c, &i))) return rc;
    char *chunk = (char *)c->stage_dev + (size_t)i * KCU_STAGE_BYTES;
    memcpy(c->stage_pin[i], (const char *)src + e0 * ss, k * ss);
    KCU_CHECK(cudaMemcpyAsync(chunk, c->stage_pin[i], k * ss, cudaMemcpyHostToDevice, c->load_stream));
    KCU_CHECK(cudaEventRecord(c->stage_copied[i], c->load_stream));
    KCU_CHECK(cudaStreamWaitEvent(c->stream, c->stage_copied[i], 0));
    if ((rc = kcu__convert(c, (char *)dst + e0 * ds, dst_t, chunk, src_t, k))) return rc;
    KCU_CHECK(cudaEventRecord(c->stage_free[i], c->stream));
  }
  return 0;
}

/* Orders the backend stream after every copy queued so far. */
static int kcu_stage_fence(kcu_ctx_t *c) {
  KCU_CHECK(cudaEventRecord(c->load_tail, c->load_stream));
  KCU_CHECK(cudaStreamWaitEvent(c->stream, c->load_tail, 0));
  return 0;
}

/* Dense weights become the act type (2-D) or F32 (1-D: norms, biases,
 * inv_freq); quantized weights are copied as they are. w->type and
 * w->row_bytes describe what is stored on the device afterwards. On failure
 * nothing is allocated and w->data is NULL. */
int kcu__weight_load(kcu_ctx_t *c, kern_weight_t *w, const void *host_data) {
  int rc = kcu__not_capturing(c, "weight_load");
  if (rc) return rc;
  if (!kcu__supports_type(w->type) || w->rows <= 0 || w->cols <= 0)
    return fr_errorf(FR_EUNSUPPORTED, "cuda: weight of type %d (%lld x %lld) not supported", (int)w->type,
                     (long long)w->rows, (long long)w->cols);
  const bool dense = kcu_is_dense(w->type);
  const kern_type_t dst_t = !dense ? w->type : w->rows == 1 ? KERN_F32 : c->act;
  size_t row_bytes = kern_row_bytes(w->type, w->cols), dst_rb = kern_row_bytes(dst_t, w->cols), bytes, dst_bytes;
  if (row_bytes == 0 || fr_mul_size(row_bytes, (size_t)w->rows, &bytes) ||
      fr_mul_size(dst_rb, (size_t)w->rows, &dst_bytes))
    return fr_errorf(FR_EFORMAT, "cuda: weight size overflows or cols %lld not a block multiple", (long long)w->cols);
  char what[96];
  snprintf(what, sizeof what, "a weight (%lld x %lld %s)", (long long)w->rows, (long long)w->cols,
           kern_type_traits(w->type)->name);
  w->data = NULL;
  w->priv = NULL;
  if ((rc = kcu__alloc(c, dst_bytes, &w->data, what))) return rc;
  if ((rc = kcu_stage_make(c))) goto fail;
  if (dst_t == w->type) rc = kcu_stage_copy(c, w->data, host_data, bytes);
  else rc = kcu_stage_convert(c, w->data, dst_t, host_data, w->type, (size_t)w->rows * (size_t)w->cols);
  if (rc || (rc = kcu_stage_fence(c))) goto fail;
  if (!dense && (rc = kcu_grow_deq(c, w))) goto fail;
  w->type = dst_t;
  w->row_bytes = dst_rb;
  return 0;
fail:
  /* no copy or conversion may still write w->data */
  if (c->load_stream) cudaStreamSynchronize(c->load_stream);
  cudaStreamSynchronize(c->stream);
  kcu__free(w->data);
  w->data = NULL;
  return rc;
}

/* Waits for the weight copies in flight and frees the staging ring. */
int kcu__load_end(kcu_ctx_t *c) {
  int rc = kcu__not_capturing(c, "load_end");
  if (rc || !c->load_stream) return rc;
  KCU_CHECK(cudaStreamSynchronize(c->load_stream));
  KCU_CHECK(cudaStreamSynchronize(c->stream));
  kcu__stage_free(c);
  return 0;
}

/* Frees a weight's device copy. */
void kcu__weight_release(kern_weight_t *w) {
  kcu__free(w->data);
  w->data = NULL;
  w->priv = NULL;
}
