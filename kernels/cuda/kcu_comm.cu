/* kcu_comm.cu - the CUDA backend's tensor-parallel all-reduce over NCCL
 * ("nccl:<hex>" groups, kern.h).
 *
 * Rank 0 makes the unique id (kern_nccl_new_id: NCCL's bootstrap root runs
 * in that process), the coordinator hands it to every rank in the load, and
 * each rank joins with ncclCommInitRank on its device. The all-reduce runs
 * on the backend's stream, so it orders after the matmul that produced the
 * partial sums and is captured into decode graphs like any other op.
 * Calls up to KCU_CAR_MAX_BYTES (decode's) go to the one-shot all-reduce
 * over peer memory instead (kcu_car.cu), when the GPUs reach each other;
 * there the all-reduce before an add_rms_norm is one kernel with it.
 * NVLink SHARP (NVLS) stays off unless the environment sets it: the lent
 * machines' fabric does not offer it (see docs/ARCHITECTURE.md).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nccl.h>

#include "common/fr_log.h"
#include "kernels/cuda/kcu.cuh"

#define KCU_NCCL(call) KCU_CHECK_GEN(call, ncclResult_t, ncclSuccess, FR_ENCCL, ncclGetErrorString)

static const char kcu_hex[] = "0123456789abcdef";

extern "C" int kern_nccl_new_id(char *out, size_t cap) {
  if (cap < 5 + 2 * NCCL_UNIQUE_ID_BYTES + 1) return fr_errorf(-EINVAL, "nccl id: buffer of %zu bytes", cap);
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  ncclUniqueId id;
  KCU_NCCL(ncclGetUniqueId(&id));
  memcpy(out, "nccl:", 5);
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) {
    out[5 + 2 * i] = kcu_hex[(uint8_t)id.internal[i] >> 4];
    out[6 + 2 * i] = kcu_hex[(uint8_t)id.internal[i] & 15];
  }
  out[5 + 2 * NCCL_UNIQUE_ID_BYTES] = 0;
  return 0;
}

static int kcu_hex_val(char ch) {
  return ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
}

static int kcu_parse_id(const char *s, ncclUniqueId *id) {
  if (!s || strncmp(s, "nccl:", 5) || strlen(s) != 5 + 2 * NCCL_UNIQUE_ID_BYTES)
    return fr_errorf(-EINVAL, "tensor parallel on CUDA needs an nccl:<hex> group id (made by rank 0)");
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) {
    int hi = kcu_hex_val(s[5 + 2 * i]), lo = kcu_hex_val(s[6 + 2 * i]);
    if (hi < 0 || lo < 0) return fr_errorf(-EINVAL, "nccl group id: not hex");
    id->internal[i] = (char)(hi << 4 | lo);
  }
  return 0;
}

int kcu__comm_init(void *ctx, const kern_comm_t *cm) {
  kcu_ctx_t *c = (kcu_ctx_t *)ctx;
  if (c->nccl) return fr_errorf(FR_ESTATE, "tensor parallel: this backend is in a group already");
  if (cm->size < 1 || cm->rank < 0 || cm->rank >= cm->size)
    return fr_errorf(-EINVAL, "tensor parallel: rank %d of %d", cm->rank, cm->size);
  ncclUniqueId id;
  int rc = kcu_parse_id(cm->id, &id);
  if (rc) return rc;
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  KCU_CHECK(cudaSetDevice(c->device));
  ncclComm_t comm;
  uint64_t t0 = fr_now_ns();
  KCU_NCCL(ncclCommInitRank(&comm, cm->size, id, cm->rank));
  c->nccl = comm;
  c->comm_rank = cm->rank;
  c->comm_size = cm->size;
  c->gather_max = cm->max_gather;
  if (cm->rank == 0 && cm->max_gather) { /* the other ranks' parts land here */
    int rc = kcu__alloc(c, cm->max_gather * (size_t)cm->size * c->act_size, &c->gather_stage, "gather staging");
    if (rc) return rc;
  }
  FR_LOGI("tensor parallel: rank %d of %d on cuda:%d joined in %.2f s (NCCL %d)", cm->rank, cm->size, c->device,
          (double)(fr_now_ns() - t0) / 1e9, NCCL_VERSION_CODE);
  if (cm->multi_host) { /* a device ordinal or an IPC handle from another host means nothing here */
    FR_LOGI("custom all-reduce off: the group spans hosts");
    return 0;
  }
  return kcu__car_init(c);
}

int kcu__all_reduce(void *ctx, void *buf, size_t n) {
  kcu_ctx_t *c = (kcu_ctx_t *)ctx;
  if (!c->nccl) return fr_errorf(FR_ESTATE, "all_reduce: the backend is in no tensor-parallel group");
  if (c->comm_size == 1 || n == 0) return 0;
  if (kcu__car_fits(c, n)) return kcu__car_all_reduce(c, buf, n); /* small: one shot over peer memory */
  ncclDataType_t t = c->act == KERN_BF16 ? ncclBfloat16 : ncclFloat16;
  kcu__x8_drop(c);
  KCU_NCCL(ncclAllReduce(buf, buf, n, t, ncclSum, (ncclComm_t)c->nccl, c->stream));
  return 0;
}

/* The all-reduce and the add_rms_norm after it: one kernel where the call
 * fits the one-shot buffer, the two ops otherwise (same bits either way). */
int kcu__all_reduce_add_rms_norm(void *ctx, void *out, void *residual, void *part, const kern_weight_t *w, int n,
                                 int dim, float eps) {
  kcu_ctx_t *c = (kcu_ctx_t *)ctx;
  if (!c->nccl) return fr_errorf(FR_ESTATE, "all_reduce: the backend is in no tensor-parallel group");
  const float *wf = (const float *)w->data;
  if (c->comm_size > 1 && kcu__car_norm_fits(c, out, residual, part, wf, n, dim))
    return kcu__car_add_rms_norm(c, out, residual, part, wf, n, dim, eps);
  int rc = kcu__all_reduce(ctx, part, (size_t)n * (size_t)dim);
  return rc ? rc : kcu__rms_norm(c, out, residual, part, wf, n, dim, eps);
}

/* Rank 0 receives every other rank's part (NCCL send/recv, grouped), then
 * places each as its columns of out with one strided copy per rank. */
int kcu__gather_cols(void *ctx, void *out, const void *part, int n, int cols) {
  kcu_ctx_t *c = (kcu_ctx_t *)ctx;
  if (!c->nccl) return fr_errorf(FR_ESTATE, "gather_cols: the backend is in no tensor-parallel group");
  const size_t per = (size_t)n * (size_t)cols, es = c->act_size;
  if (n < 0 || cols < 0 || per > c->gather_max)
    return fr_errorf(FR_ETOOBIG, "gather_cols of %d x %d, the group holds %zu", n, cols, c->gather_max);
  ncclDataType_t t = c->act == KERN_BF16 ? ncclBfloat16 : ncclFloat16;
  ncclComm_t comm = (ncclComm_t)c->nccl;
  uint8_t *stage = (uint8_t *)c->gather_stage;
  kcu__x8_drop(c);
  KCU_NCCL(ncclGroupStart());
  for (int r = 1; r < c->comm_size && c->comm_rank == 0; r++)
    KCU_NCCL(ncclRecv(stage + (size_t)r * per * es, per, t, r, comm, c->stream));
  if (c->comm_rank != 0) KCU_NCCL(ncclSend(part, per, t, 0, comm, c->stream));
  KCU_NCCL(ncclGroupEnd());
  if (c->comm_rank != 0) return 0;
  const size_t pitch = (size_t)cols * (size_t)c->comm_size * es;
  for (int r = 0; r < c->comm_size; r++) {
    const uint8_t *src = r == 0 ? (const uint8_t *)part : stage + (size_t)r * per * es;
    KCU_CHECK(cudaMemcpy2DAsync((uint8_t *)out + (size_t)r * cols * es, pitch, src, (size_t)cols * es,
                                (size_t)cols * es, (size_t)n, cudaMemcpyDeviceToDevice, c->stream));
  }
  return 0;
}

void kcu__comm_destroy(kcu_ctx_t *c) {
  kcu__car_destroy(c, c->car);
  kcu__free(c->gather_stage);
  c->gather_stage = NULL;
  if (!c->nccl) return;
  ncclCommDestroy((ncclComm_t)c->nccl);
  c->nccl = NULL;
}
