/* kern_device.c - device names ("cpu", "cuda:N"): see kern_types.h. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "kernels/kern_types.h"

#define KERN__MAX_DEVICE_INDEX 1023

int kern_device_parse(const char *name, kern_device_t *out) {
  if (name && !strcmp(name, "cpu")) {
    *out = (kern_device_t){.kind = KERN_DEVICE_CPU};
    return 0;
  }
  if (name && !strncmp(name, "cuda", 4) && (!name[4] || name[4] == ':')) {
    long index = 0;
    char *end = (char *)name + 4;
    if (name[4] == ':') {
      errno = 0;
      index = strtol(name + 5, &end, 10);
      if (errno || end == name + 5 || index < 0 || index > KERN__MAX_DEVICE_INDEX) end = NULL;
    }
    if (end && !*end) {
      *out = (kern_device_t){.kind = KERN_DEVICE_CUDA, .index = (int)index};
      return 0;
    }
  }
  return fr_errorf(-EINVAL, "unknown device '%s' (cpu, cuda or cuda:N)", name ? name : "");
}
