/* kcu_car.cu - the one-shot all-reduce over CUDA IPC peer memory, for the
 * small all-reduces of decode (vLLM's custom all-reduce does the same).
 *
 * Each rank owns one IPC buffer: two slots of KCU_CAR_MAX_BYTES (calls
 * alternate between them) and a flag word per (block, rank). The ranks
 * exchange the buffers' IPC handles once, through an NCCL all-gather, and
 * map each other's. One kernel does a call: block b copies its chunk of
 * the input into this rank's slot, tells every peer it is there (a release
 * store of its per-block call count into the peer's flag (b, rank)), waits
 * until every peer said the same for this call, then sums the chunk over
 * all ranks' slots in rank order (f32), writing the result in place; every
 * rank adds the same values in the same order, so all get the same bits.
 *
 * Why one barrier is enough: a rank writes slot s again two calls later,
 * and to get there its block b must pass the next call's barrier, which
 * needs every peer's block b in that next call, which starts only after
 * the peer's kernel of this call (reading slot s) finished.
 *
 * Graph-safe: the per-block call counts live in device memory, so a
 * captured call replays with new flag values. The blocks of one call wait
 * only for the same block index on the other GPUs, all launched by then;
 * grids are small (<= KCU_CAR_BLOCKS) and resident.
 */
#include <cuda/atomic>
#include <stdlib.h>
#include <string.h>

#include <nccl.h>

#include "common/fr_log.h"
#include "kernels/cuda/kcu.cuh"

#define KCU_CAR_BLOCKS 32  /* most CTAs of one call */
#define KCU_CAR_NT 512     /* threads per CTA */
#define KCU_CAR_VEC 8      /* elements per 16-byte vector */

typedef struct {
  uint8_t *slots[KCU_CAR_MAX_RANKS];  /* each rank's two slots */
  uint32_t *flags[KCU_CAR_MAX_RANKS]; /* each rank's (KCU_CAR_BLOCKS, KCU_CAR_MAX_RANKS) flags */
} kcu_car_peers_t;

static size_t kcu_car_flags_off(void) { return 2 * (size_t)KCU_CAR_MAX_BYTES; }
static size_t kcu_car_bytes(void) {
  return kcu_car_flags_off() + (size_t)KCU_CAR_BLOCKS * KCU_CAR_MAX_RANKS * sizeof(uint32_t);
}

template <typename T>
__global__ void kcu_car_k(T *buf, size_t n_vec, kcu_car_peers_t p, int rank, int n_ranks, uint32_t *counts) {
  __shared__ uint32_t call;
  kcu_pdl_enter();
  const int b = blockIdx.x;
  if (threadIdx.x == 0) call = ++counts[b];
  __syncthreads();
  const uint32_t e = call;
  const size_t slot = (size_t)(e & 1u) * KCU_CAR_MAX_BYTES;
  const size_t per = (n_vec + gridDim.x - 1) / gridDim.x, v0 = (size_t)b * per;
  const size_t v1 = v0 + per < n_vec ? v0 + per : n_vec;
  uint4 *x = reinterpret_cast<uint4 *>(buf);
  uint4 *mine = reinterpret_cast<uint4 *>(p.slots[rank] + slot);
  for (size_t v = v0 + threadIdx.x; v < v1; v += blockDim.x) mine[v] = x[v];
  __syncthreads();
  if (threadIdx.x < n_ranks) {
    const int r = threadIdx.x;
    cuda::atomic_ref<uint32_t, cuda::thread_scope_system> out(p.flags[r][b * KCU_CAR_MAX_RANKS + rank]);
    out.store(e, cuda::memory_order_release); /* my chunk b is in my slot */
    cuda::atomic_ref<uint32_t, cuda::thread_scope_system> in(p.flags[rank][b * KCU_CAR_MAX_RANKS + r]);
    while ((int32_t)(in.load(cuda::memory_order_acquire) - e) < 0) {
    }
  }
  __syncthreads();
  for (size_t v = v0 + threadIdx.x; v < v1; v += blockDim.x) {
    float acc[KCU_CAR_VEC] = {0}, f[KCU_CAR_VEC];
    for (int r = 0; r < n_ranks; r++) {
      uint4 y = __ldcg(reinterpret_cast<const uint4 *>(p.slots[r] + slot) + v);
      kcu_unpack8(y, f, (const T *)nullptr);
#pragma unroll
      for (int i = 0; i < KCU_CAR_VEC; i++) acc[i] += f[i];
    }
    x[v] = kcu_pack8<T>(acc);
  }
}

/* The buffers' handles, gathered over NCCL: handles[r] is rank r's. */
static int kcu_car_exchange(kcu_ctx_t *c, const cudaIpcMemHandle_t *mine, cudaIpcMemHandle_t *all) {
  const size_t hb = sizeof(cudaIpcMemHandle_t);
  void *dev = NULL;
  int rc = kcu__alloc(c, hb * (size_t)c->comm_size, &dev, "IPC handles");
  if (rc) return rc;
  cudaError_t e = cudaMemcpyAsync((uint8_t *)dev + hb * (size_t)c->comm_rank, mine, hb, cudaMemcpyHostToDevice, c->stream);
  ncclResult_t ne = e == cudaSuccess ? ncclAllGather((uint8_t *)dev + hb * (size_t)c->comm_rank, dev, hb, ncclUint8,
                                                    (ncclComm_t)c->nccl, c->stream)
                                     : ncclSuccess;
  if (e == cudaSuccess && ne == ncclSuccess) e = cudaMemcpyAsync(all, dev, hb * (size_t)c->comm_size, cudaMemcpyDeviceToHost, c->stream);
  if (e == cudaSuccess && ne == ncclSuccess) e = cudaStreamSynchronize(c->stream);
  kcu__free(dev);
  if (ne != ncclSuccess) return fr_errorf(FR_ENCCL, "custom all-reduce: handle exchange: %s", ncclGetErrorString(ne));
  KCU_CHECK(e);
  return 0;
}

/* Whether this GPU reaches every peer's memory directly (NVLink or PCIe P2P). */
static bool kcu_car_p2p(const kcu_ctx_t *c, const int *devices) {
  for (int r = 0; r < c->comm_size; r++) {
    int ok = 0;
    if (r != c->comm_rank && (cudaDeviceCanAccessPeer(&ok, c->device, devices[r]) != cudaSuccess || !ok)) {
      (void)cudaGetLastError();
      return false;
    }
  }
  return true;
}

int kcu__car_init(kcu_ctx_t *c) {
  const char *env = getenv("FERRUM_CUSTOM_AR");
  if ((env && !strcmp(env, "0")) || c->comm_size < 2 || c->comm_size > KCU_CAR_MAX_RANKS) return 0;
  /* every rank's device ordinal, to ask about peer access (gathered like the handles) */
  cudaIpcMemHandle_t dev_h = {};
  memcpy(&dev_h, &c->device, sizeof c->device);
  cudaIpcMemHandle_t all[KCU_CAR_MAX_RANKS];
  int rc = kcu_car_exchange(c, &dev_h, all);
  if (rc) return rc;
  int devices[KCU_CAR_MAX_RANKS];
  for (int r = 0; r < c->comm_size; r++) memcpy(&devices[r], &all[r], sizeof(int));
  bool p2p = kcu_car_p2p(c, devices);
  /* the decision must be the same on every rank: a rank without P2P says so through its buffer handle below */
  void *buf = NULL;
  if ((rc = kcu__alloc(c, kcu_car_bytes(), &buf, "custom all-reduce buffer"))) return rc;
  KCU_CHECK(cudaMemset(buf, 0, kcu_car_bytes()));
  cudaIpcMemHandle_t mine = {};
  if (p2p) KCU_CHECK(cudaIpcGetMemHandle(&mine, buf));
  if ((rc = kcu_car_exchange(c, &mine, all))) {
    kcu__free(buf);
    return rc;
  }
  static const cudaIpcMemHandle_t none = {};
  bool everyone = true;
  for (int r = 0; r < c->comm_size; r++) everyone &= memcmp(&all[r], &none, sizeof none) != 0;
  if (!everyone) {
    FR_LOGI("custom all-reduce off: not every GPU of the group reaches the others directly");
    kcu__free(buf);
    return 0;
  }
  kcu_car_t *car = (kcu_car_t *)fr_calloc(1, sizeof *car);
  car->buf = buf;
  for (int r = 0; r < c->comm_size; r++) {
    if (r == c->comm_rank) {
      car->peer[r] = buf;
      continue;
    }
    cudaError_t e = cudaIpcOpenMemHandle(&car->peer[r], all[r], cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
      car->peer[r] = NULL;
      kcu__car_destroy(c, car);
      return fr_errorf(FR_ECUDA, "custom all-reduce: opening rank %d's buffer: %s", r, cudaGetErrorString(e));
    }
  }
  if ((rc = kcu__alloc(c, KCU_CAR_BLOCKS * sizeof(uint32_t), (void **)&car->counts, "custom all-reduce counts")) ||
      cudaMemset(car->counts, 0, KCU_CAR_BLOCKS * sizeof(uint32_t)) != cudaSuccess) {
    kcu__car_destroy(c, car);
    return rc ? rc : fr_errorf(FR_ECUDA, "custom all-reduce: memset");
  }
  const char *mx = getenv("FERRUM_CUSTOM_AR_MAX");
  car->max_bytes = mx && *mx ? (size_t)strtoull(mx, NULL, 10) : KCU_CAR_MAX_BYTES;
  if (car->max_bytes > KCU_CAR_MAX_BYTES) car->max_bytes = KCU_CAR_MAX_BYTES;
  KCU_CHECK(cudaDeviceSynchronize());
  c->car = car;
  FR_LOGI("custom all-reduce on: one-shot over peer memory up to %zu KiB, NCCL above", car->max_bytes >> 10);
  return 0;
}

bool kcu__car_fits(const kcu_ctx_t *c, size_t n) {
  return c->car && n % KCU_CAR_VEC == 0 && n * c->act_size <= c->car->max_bytes;
}

int kcu__car_all_reduce(kcu_ctx_t *c, void *buf, size_t n) {
  const kcu_car_t *car = c->car;
  kcu_car_peers_t p = {};
  for (int r = 0; r < c->comm_size; r++) {
    p.slots[r] = (uint8_t *)car->peer[r];
    p.flags[r] = (uint32_t *)((uint8_t *)car->peer[r] + kcu_car_flags_off());
  }
  const size_t n_vec = n / KCU_CAR_VEC;
  int blocks = (int)((n_vec + KCU_CAR_NT - 1) / KCU_CAR_NT);
  blocks = blocks < 1 ? 1 : blocks > KCU_CAR_BLOCKS ? KCU_CAR_BLOCKS : blocks;
  KCU_ACT_DISPATCH(c, KCU_LAUNCH(c, kcu_car_k<T>, blocks, KCU_CAR_NT, 0, (T *)buf, n_vec, p, c->comm_rank,
                                 c->comm_size, car->counts));
  return 0;
}

void kcu__car_destroy(kcu_ctx_t *c, kcu_car_t *car) {
  if (!car) return;
  for (int r = 0; r < KCU_CAR_MAX_RANKS; r++)
    if (car->peer[r] && car->peer[r] != car->buf) cudaIpcCloseMemHandle(car->peer[r]);
  kcu__free(car->buf);
  kcu__free(car->counts);
  free(car);
  if (c->car == car) c->car = NULL;
}
