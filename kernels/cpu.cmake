# ferrum_kernels: kern.c (backend creation from a device name) plus the CPU
# backend, kernels/cpu/.
# SIMD kernel tables are separate translation units with their own flags,
# chosen at run time (FERRUM_CPU_ISA=scalar|avx2|avx512|avx512vnni forces one).
set(_cpu_sources
  kern.c
  cpu/cpu_backend.c
  cpu/cpu_matmul.c
  cpu/cpu_moe.c
  cpu/cpu_ops.c
  cpu/cpu_attn.c
  cpu/cpu_encoder.c
  cpu/cpu_comm.c
  cpu/cpu_panel.c
  cpu/cpu_scalar.c)
if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64|amd64")
  list(APPEND _cpu_sources cpu/cpu_avx2.c cpu/cpu_avx512.c cpu/cpu_avx512_vnni.c cpu/cpu_amx.c)
  # -O3 on the SIMD tables: GCC's -O2 keeps their small fixed loops rolled
  # (run-time shuffle indices, accumulators in memory); measured in
  # docs/bench/cpu-model.md (AVX2 on an EPYC; AVX-512 on a Xeon, session 21:
  # SmolLM2 Q4_K_M pp512 976-990 -> 1065-1082 tok/s), the same bits.
  set_source_files_properties(cpu/cpu_avx2.c PROPERTIES COMPILE_OPTIONS "-mavx2;-mfma;-mf16c;-O3")
  set_source_files_properties(cpu/cpu_avx512.c PROPERTIES COMPILE_OPTIONS
    "-mavx2;-mfma;-mf16c;-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-O3")
  set_source_files_properties(cpu/cpu_avx512_vnni.c PROPERTIES COMPILE_OPTIONS
    "-mavx2;-mfma;-mf16c;-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx512vnni;-O3")
  set_source_files_properties(cpu/cpu_amx.c PROPERTIES COMPILE_OPTIONS
    "-mavx2;-mfma;-mf16c;-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx512bf16;-mamx-tile;-mamx-bf16;-O3")
endif()
add_library(ferrum_kernels STATIC ${_cpu_sources})
ferrum_headers(ferrum_kernels FOLDER kernels PUBLIC kern.h kern_types.h)
target_link_libraries(ferrum_kernels PUBLIC ferrum_kern_types ferrum_common)
