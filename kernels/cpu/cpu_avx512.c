/* cpu_avx512.c - the AVX-512 (F, BW, VL, DQ) kernel table (cpu_x512_impl.h),
 * for hosts without VNNI, with the AVX2 panel kernels (cpu_x86_panel.h). */
#if defined(__x86_64__)
#include "kernels/cpu/cpu_x512_impl.h"
#include "kernels/cpu/cpu_x86_panel.h"

const cpu_isa_t cpu_isa_avx512 = X512_ISA_TABLE("avx512", X86P_PANEL_TABLE);
#endif
