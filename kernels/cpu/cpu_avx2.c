/* cpu_avx2.c - the AVX2 + FMA + F16C kernel table (compiled with those
 * flags; chosen at run time only where the CPU has them), with the AVX2
 * panel kernels (cpu_x86_panel.h). */
#if defined(__x86_64__)
#include "kernels/cpu/cpu_x86_impl.h"
#include "kernels/cpu/cpu_x86_panel.h"

const cpu_isa_t cpu_isa_avx2 = {
    .name = "avx2",
    .vec_dot =
        {
            [KERN_F32] = x86__vec_dot_f32,
            [KERN_F16] = x86__vec_dot_f16,
            [KERN_BF16] = x86__vec_dot_bf16,
            [KERN_Q4_0] = x86__vec_dot_q4_0,
            [KERN_Q4_1] = x86__vec_dot_q4_1,
            [KERN_I4G] = x86__vec_dot_i4g,
            [KERN_Q5_0] = x86__vec_dot_q5_0,
            [KERN_Q5_1] = x86__vec_dot_q5_1,
            [KERN_Q8_0] = x86__vec_dot_q8_0,
            [KERN_Q4_K] = x86__vec_dot_q4_K,
            [KERN_Q5_K] = x86__vec_dot_q5_K,
            [KERN_Q6_K] = x86__vec_dot_q6_K,
        },
    .vec_dot_x4 = {[KERN_Q4_1] = x86__vec_dot_x4_q4_1, [KERN_Q8_0] = x86__vec_dot_x4_q8_0,
                   [KERN_I4G] = x86__vec_dot_x4_i4g, [KERN_Q5_0] = x86__vec_dot_x4_q5_0,
                   [KERN_Q4_K] = x86__vec_dot_x4_q4_K, [KERN_Q5_K] = x86__vec_dot_x4_q5_K,
                   [KERN_Q6_K] = x86__vec_dot_x4_q6_K},
    .vec_dot_2x4 = {[KERN_Q4_1] = x86__vec_dot_2x4_q4_1},
    .quantize =
        {
            [KERN_Q8_0] = x86__quantize_q8_0,
            [KERN_Q8_1] = x86__quantize_q8_1,
            [KERN_Q8_K] = x86__quantize_q8_K,
        },
    .panel_gemm = X86P_PANEL_TABLE,
    .dot_f32 = x86__dot_f32,
    .dot_f16 = x86__dot_f16,
    .axpy_f32 = x86__axpy_f32,
    .axpy_f16 = x86__axpy_f16,
    .dot_i8 = x86__dot_i8,
    .axpy_i8 = x86__axpy_i8,
    .dot_e4m3 = x86__dot_e4m3,
    .axpy_e4m3 = x86__axpy_e4m3,
    .scores_f16 = x86__scores_f16,
    .pv_f16 = x86__pv_f16,
    .silu_mul = x86__silu_mul,
    .exp_shift = x86__exp_shift,
};
#endif
