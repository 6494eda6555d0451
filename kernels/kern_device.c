/* kern_device.c - device names ("cpu", "cuda:N"): see kern_types.h. */
#include <errno.h>
#include <stdio.h>
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

/* The rank-th entry of a "cuda:a,b,c" list, or -1 when the list is shorter
 * or malformed; *n gets the entries counted. */
static int kern__cuda_list_entry(const char *list, int rank, int *n) {
  int found = -1;
  *n = 0;
  for (const char *p = list;; p++) {
    char *end;
    errno = 0;
    long v = strtol(p, &end, 10);
    if (errno || end == p || v < 0 || v > KERN__MAX_DEVICE_INDEX || (*end && *end != ',')) return -1;
    if ((*n)++ == rank) found = (int)v;
    if (!*end) return found;
    p = end;
  }
}

int kern_device_for_rank(const char *name, int rank, int size, char *out, size_t cap) {
  kern_device_t d;
  if (name && !strncmp(name, "cuda:", 5) && strchr(name, ',')) { /* one GPU per rank */
    int n, idx = kern__cuda_list_entry(name + 5, rank, &n);
    if (n != size || idx < 0)
      return fr_errorf(-EINVAL, "device '%s' names %d GPU(s) for a tensor-parallel size of %d: name one per rank",
                       name, n, size);
    snprintf(out, cap, "cuda:%d", idx);
    return 0;
  }
  int rc = kern_device_parse(name, &d);
  if (rc) return rc;
  if (d.kind == KERN_DEVICE_CPU || size == 1) {
    snprintf(out, cap, "%s", name);
    return 0;
  }
  if (name[4] == ':')
    return fr_errorf(-EINVAL, "device '%s' is one GPU for %d tensor-parallel ranks: give cuda (rank r on GPU r) "
                              "or one GPU per rank (cuda:0,1)", name, size);
  snprintf(out, cap, "cuda:%d", rank);
  return 0;
}
