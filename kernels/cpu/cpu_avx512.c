/* cpu_avx512.c - the AVX-512 (F, BW, VL, DQ) kernel table (cpu_x512_impl.h),
 * for hosts without VNNI. */
#if defined(__x86_64__)
#include "kernels/cpu/cpu_x512_impl.h"

const cpu_isa_t cpu_isa_avx512 = X512_ISA_TABLE("avx512", {0});
#endif
