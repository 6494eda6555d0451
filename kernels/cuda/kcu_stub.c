/* kcu_stub.c - kern_cuda_create and kern_nccl_new_id when ferrum is built without CUDA
 * (FERRUM_CUDA=OFF): links, and says so. */
#include "common/fr_err.h"
#include "kernels/kern.h"

int kern_cuda_create(kern_backend_t **out, int device) {
  (void)device;
  *out = NULL;
  return fr_errorf(FR_EUNSUPPORTED, "ferrum was built without CUDA (configure with -DFERRUM_CUDA=ON)");
}

uint64_t kern_cuda_f8_twin_hits(const kern_backend_t *b) {
  (void)b;
  return 0;
}

uint64_t kern_cuda_kvd_runs(const kern_backend_t *b) {
  (void)b;
  return 0;
}

int kern_nccl_new_id(char *out, size_t cap) {
  if (cap) out[0] = 0;
  return fr_errorf(FR_EUNSUPPORTED, "ferrum was built without CUDA: no NCCL");
}
