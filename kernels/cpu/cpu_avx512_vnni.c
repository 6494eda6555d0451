/* cpu_avx512_vnni.c - the AVX-512 kernel table (cpu_x512_impl.h) compiled
 * with -mavx512vnni: its u8 x s8 dots are vpdpbusd, with the same results
 * as cpu_avx512.c's bit for bit (test_matmul_vnni_exact); and the panel
 * kernels (cpu_x512_panel.h), which the other tables do not have. */
#if defined(__x86_64__)
#include "kernels/cpu/cpu_x512_impl.h"
#include "kernels/cpu/cpu_x512_panel.h"

const cpu_isa_t cpu_isa_avx512vnni = X512_ISA_TABLE("avx512vnni", X512P_PANEL_TABLE);
#endif
