/* kcu_car.cu - the one-shot all-reduce over CUDA IPC peer memory, for the
 * small all-reduces of decode, alone or fused with the residual add and
 * RMS norm that follow it (TensorRT-LLM's "Lamport" all-reduce and its
 * fusion with the norm work the same way).
 *
 * Each rank owns one IPC buffer: two slots, each with a region per source
 * rank. A call pushes: every rank writes its input straight into its
 * region of each peer's buffer (remote stores over NVLink), then waits on
 * its own buffer until every peer's values are there. There are no flags:
 * the buffer holds negative zero (0x8000 in bf16 and f16 alike) wherever no
 * value has arrived, a rank sends its values with negative zeros made
 * positive (a sum does not change), so an element has arrived once it is
 * not 0x8000; the receiver writes the sentinel back as it reads. One
 * one-way trip over the link, where a flag would need a second. Every rank
 * adds the ranks' values in rank order (f32), so all get the same bits.
 *
 * Why two slots suffice: a peer writes slot s again two calls later. To
 * start that call it must have finished the next one, which needs this
 * rank's values of the next call, sent only after this rank's kernel of
 * this call (which read and cleared slot s) finished: every kernel waits
 * for the one before it (kcu_pdl_wait), so the order is transitive.
 *
 * Calls alternate slots by a call count in device memory, so a captured
 * call replays with new values; the last CTA of a call to finish advances
 * it. A CTA waits only for the same elements from the other GPUs, whose
 * CTAs send before they wait; grids are small and resident.
 *
 * Fused with the norm: a CTA per row; after the sum (rounded to T, as an
 * all-reduce stores it), residual += sum and out = rms_norm(residual) * w,
 * the operations of kcu_rms_norm_vec_k in its order, so the bits are those
 * of the all-reduce followed by add_rms_norm.
 */
#include <stdlib.h>
#include <string.h>

#include <nccl.h>

#include "common/fr_log.h"
#include "kernels/cuda/kcu.cuh"

#define KCU_CAR_NT 512        /* threads per CTA of the plain all-reduce (a 16-byte vector each) */
#define KCU_CAR_MAX_ROWS 1024 /* most rows (CTAs) of the fused call */
#define KCU_CAR_SENT 0x80008000u /* two negative zeros: nothing has arrived */

typedef struct {
  uint4 *buf[KCU_CAR_MAX_RANKS]; /* each rank's buffer, mapped here */
} kcu_car_peers_t;

static size_t kcu_car_region(void) { return KCU_CAR_MAX_BYTES; }
static size_t kcu_car_bytes(int ranks) { return 2 * (size_t)ranks * kcu_car_region(); }

__device__ __forceinline__ uint4 kcu_car_ld(const uint4 *p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}
__device__ __forceinline__ void kcu_car_st(uint4 *p, uint4 v) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}
/* Two elements with negative zeros made positive: never the sentinel. */
__device__ __forceinline__ uint32_t kcu_car_pos0(uint32_t w) {
  if ((w & 0xffffu) == 0x8000u) w &= 0xffff0000u;
  if ((w >> 16) == 0x8000u) w &= 0x0000ffffu;
  return w;
}
__device__ __forceinline__ bool kcu_car_here(uint32_t w) { return (w & 0xffffu) != 0x8000u && (w >> 16) != 0x8000u; }
__device__ __forceinline__ bool kcu_car_here4(uint4 v) {
  return kcu_car_here(v.x) && kcu_car_here(v.y) && kcu_car_here(v.z) && kcu_car_here(v.w);
}

/* Rank r's vector j of this call: its values as they arrive in this
 * rank's buffer (then cleared), or this rank's own. */
__device__ __forceinline__ uint4 kcu_car_take(const kcu_car_peers_t &p, size_t slot, int r, int rank,
                                              size_t region_vec, size_t j, uint4 mine) {
  if (r == rank) return mine;
  uint4 *src = p.buf[rank] + (slot + (size_t)r) * region_vec + j;
  uint4 y = kcu_car_ld(src);
  while (!kcu_car_here4(y)) y = kcu_car_ld(src);
  kcu_car_st(src, make_uint4(KCU_CAR_SENT, KCU_CAR_SENT, KCU_CAR_SENT, KCU_CAR_SENT));
  return y;
}

/* One call: CTA b takes vectors [b * row_vec, (b + 1) * row_vec) of x's
 * n_vec; out gets the sum (NORM: residual += the sum and out its norm, one
 * row a CTA). out may alias x. */
template <typename T, int NT, int V, bool NORM>
__global__ void __launch_bounds__(NT) kcu_car_k(T *out, T *res, const T *x, const float *w, size_t n_vec, int row_vec,
                                                float eps, kcu_car_peers_t p, int rank, int n_ranks,
                                                size_t region_vec, uint32_t *count) {
  __shared__ float red[KCU_MAX_WARPS];
  __shared__ uint32_t call;
  const size_t v0 = (size_t)blockIdx.x * row_vec;
  const int len = (int)min((size_t)row_vec, n_vec - v0);
  float4 wv[V][2];
  if (NORM) kcu_norm_load_w<NT, V>(wv, w, len);
  kcu_pdl_enter();
  if (threadIdx.x == 0) call = count[0];
  __syncthreads();
  const size_t slot = (size_t)(call & 1u) * (size_t)n_ranks;
  const uint4 *x8 = reinterpret_cast<const uint4 *>(x) + v0;
  uint4 mine[V];
#pragma unroll
  for (int c = 0; c < V; c++) {
    const int j = threadIdx.x + c * NT;
    if (j >= len) break;
    uint4 m = x8[j];
    mine[c] = make_uint4(kcu_car_pos0(m.x), kcu_car_pos0(m.y), kcu_car_pos0(m.z), kcu_car_pos0(m.w));
    for (int r = 0; r < n_ranks; r++)
      if (r != rank) kcu_car_st(p.buf[r] + (slot + (size_t)rank) * region_vec + v0 + j, mine[c]);
  }
  float v[V][8], ss = 0.f;
#pragma unroll
  for (int c = 0; c < V; c++) {
    const int j = threadIdx.x + c * NT;
    if (j >= len) break;
    float acc[8] = {0}, f[8];
    for (int r = 0; r < n_ranks; r++) {
      kcu_unpack8(kcu_car_take(p, slot, r, rank, region_vec, v0 + j, mine[c]), f, (const T *)nullptr);
#pragma unroll
      for (int e = 0; e < 8; e++) acc[e] += f[e];
    }
    uint4 *o8 = reinterpret_cast<uint4 *>(out) + v0;
    if (!NORM) {
      o8[j] = kcu_pack8<T>(acc);
      continue;
    }
    uint4 *r8 = reinterpret_cast<uint4 *>(res) + v0;
    float r[8];
    kcu_unpack8(r8[j], r, (const T *)nullptr);
#pragma unroll
    for (int e = 0; e < 8; e++) v[c][e] = kcu_f(kcu_t<T>(r[e] + kcu_f(kcu_t<T>(acc[e]))));
    r8[j] = kcu_pack8<T>(v[c]);
#pragma unroll
    for (int e = 0; e < 8; e++) ss += v[c][e] * v[c][e];
  }
  if (NORM) kcu_norm_row_out<T, NT, V>(v, ss, wv, reinterpret_cast<uint4 *>(out) + v0, len, len * 8, eps, red);
  __syncthreads(); /* every read of the slot is done: the call may advance */
  if (threadIdx.x == 0 && atomicAdd(&count[1], 1u) == gridDim.x - 1) {
    count[1] = 0;
    count[0] = call + 1;
  }
}

__global__ void kcu_car_fill_k(uint32_t *p, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = KCU_CAR_SENT;
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
  const size_t bytes = kcu_car_bytes(c->comm_size);
  if ((rc = kcu__alloc(c, bytes, &buf, "custom all-reduce buffer"))) return rc;
  /* nothing has arrived; a plain launch (no PDL, so no kcu_pdl_wait in the kernel): once, at the group's start */
  kcu_car_fill_k<<<64, 256, 0, c->stream>>>((uint32_t *)buf, bytes / sizeof(uint32_t));
  KCU_CHECK(cudaGetLastError());
  KCU_CHECK(cudaStreamSynchronize(c->stream));
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
  if ((rc = kcu__alloc(c, 2 * sizeof(uint32_t), (void **)&car->count, "custom all-reduce count")) ||
      cudaMemset(car->count, 0, 2 * sizeof(uint32_t)) != cudaSuccess) {
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

static kcu_car_peers_t kcu_car_peers(const kcu_ctx_t *c) {
  kcu_car_peers_t p = {};
  for (int r = 0; r < c->comm_size; r++) p.buf[r] = (uint4 *)c->car->peer[r];
  return p;
}

bool kcu__car_fits(const kcu_ctx_t *c, size_t n) { return c->car && n % 8 == 0 && n * c->act_size <= c->car->max_bytes; }

int kcu__car_all_reduce(kcu_ctx_t *c, void *buf, size_t n) {
  const size_t n_vec = n / 8, region_vec = kcu_car_region() / 16;
  const int blocks = kcu_div_up((long long)n_vec, KCU_CAR_NT);
  if (blocks < 1) return 0;
  KCU_ACT_DISPATCH(c, KCU_LAUNCH(c, kcu_car_k<T, KCU_CAR_NT, 1, false>, blocks, KCU_CAR_NT, 0, (T *)buf, (T *)nullptr,
                                 (const T *)buf, (const float *)nullptr, n_vec, KCU_CAR_NT, 0.f, kcu_car_peers(c),
                                 c->comm_rank, c->comm_size, region_vec, c->car->count));
  return 0;
}

bool kcu__car_norm_fits(const kcu_ctx_t *c, const void *out, const void *residual, const void *x, const float *w, int n,
                        int dim) {
  return n >= 1 && n <= KCU_CAR_MAX_ROWS && dim % 8 == 0 && dim <= 8 * KCU_NORM_NT * KCU_NORM_V &&
         kcu__car_fits(c, (size_t)n * (size_t)dim) && kcu_al16(out) && kcu_al16(residual) && kcu_al16(x) &&
         kcu_al16(w);
}

int kcu__car_add_rms_norm(kcu_ctx_t *c, void *out, void *residual, const void *x, const float *w, int n, int dim,
                          float eps) {
  const size_t n_vec = (size_t)n * (size_t)(dim / 8), region_vec = kcu_car_region() / 16;
  const kcu_car_peers_t p = kcu_car_peers(c);
  if (dim <= 8 * KCU_NORM_NT_SMALL * KCU_NORM_V) { /* the row kernel's sizes (kcu__rms_norm) */
    KCU_ACT_DISPATCH(c, KCU_LAUNCH(c, kcu_car_k<T, KCU_NORM_NT_SMALL, KCU_NORM_V, true>, n, KCU_NORM_NT_SMALL, 0,
                                   (T *)out, (T *)residual, (const T *)x, w, n_vec, dim / 8, eps, p, c->comm_rank,
                                   c->comm_size, region_vec, c->car->count));
    return 0;
  }
  KCU_ACT_DISPATCH(c, KCU_LAUNCH(c, kcu_car_k<T, KCU_NORM_NT, KCU_NORM_V, true>, n, KCU_NORM_NT, 0, (T *)out,
                                 (T *)residual, (const T *)x, w, n_vec, dim / 8, eps, p, c->comm_rank, c->comm_size,
                                 region_vec, c->car->count));
  return 0;
}

void kcu__car_destroy(kcu_ctx_t *c, kcu_car_t *car) {
  if (!car) return;
  for (int r = 0; r < KCU_CAR_MAX_RANKS; r++)
    if (car->peer[r] && car->peer[r] != car->buf) cudaIpcCloseMemHandle(car->peer[r]);
  kcu__free(car->buf);
  kcu__free(car->count);
  free(car);
  if (c->car == car) c->car = NULL;
}
