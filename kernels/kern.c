/* kern.c - backend creation from a device name and destruction: the one
 * place that maps a device to a backend (the worker and the tools call it). */
#include "kernels/kern.h"

#include <errno.h>

#include "common/fr_err.h"

int kern_backend_create(kern_backend_t **out, const char *device, int n_threads) {
  kern_device_t d;
  int rc = kern_device_parse(device ? device : "cpu", &d);
  if (rc) return rc;
  switch (d.kind) {
  case KERN_DEVICE_CPU: return kern_cpu_create(out, n_threads);
  case KERN_DEVICE_CUDA: return kern_cuda_create(out, d.index);
  }
  return fr_errorf(-EINVAL, "unknown device kind %d", (int)d.kind);
}

void kern_backend_destroy(kern_backend_t *b) {
  if (!b) return;
  b->ops->destroy(b->ctx);
}
