/* kern_traits_local.c - the ggml type table (FORMATS.md section 2) for
 * building the formats tests before libferrum_kernels exists; the tests
 * link kernels/kern.c instead once the kernels library is built. */
#include "kernels/kern.h"

static const kern_type_traits_t local_traits[KERN_TYPE_MAX] = {
    [KERN_F32] = {"F32", 1, 4, false},      [KERN_F16] = {"F16", 1, 2, false},
    [KERN_Q4_0] = {"Q4_0", 32, 18, true},   [KERN_Q4_1] = {"Q4_1", 32, 20, true},
    [KERN_Q5_0] = {"Q5_0", 32, 22, true},   [KERN_Q5_1] = {"Q5_1", 32, 24, true},
    [KERN_Q8_0] = {"Q8_0", 32, 34, true},   [KERN_Q8_1] = {"Q8_1", 32, 36, true},
    [KERN_Q4_K] = {"Q4_K", 256, 144, true}, [KERN_Q5_K] = {"Q5_K", 256, 176, true},
    [KERN_Q6_K] = {"Q6_K", 256, 210, true}, [KERN_Q8_K] = {"Q8_K", 256, 292, true},
    [KERN_BF16] = {"BF16", 1, 2, false},
};

const kern_type_traits_t *kern_type_traits(int type) {
  if (type < 0 || type >= KERN_TYPE_MAX || !local_traits[type].name) return 0;
  return &local_traits[type];
}

size_t kern_row_bytes(int type, int64_t n) {
  const kern_type_traits_t *t = kern_type_traits(type);
  if (!t || n < 0 || n % t->blck) return 0;
  return (size_t)(n / t->blck) * (size_t)t->size;
}
