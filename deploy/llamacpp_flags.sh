#!/bin/sh
# llamacpp_flags.sh - CMake arguments for every llama.cpp that the tests and
# benchmarks build (llama-cpp-python's by deploy/setup.sh, llama-server's by
# bench/cpu_serve_vs_llamacpp.sh), printed on one line.
#
# Built with GGML_NATIVE, llama.cpp compiles its AMX kernels on a CPU with
# AMX, and on such hosts they crash: ggml_backend_amx_mul_mat faults on
# its ldtilecfg (an invalid tile configuration; llama.cpp issues 20824 and
# 26954), which killed every golden test on a 2-core Xeon with AMX-INT8
# here. GCC's explicit -mno-* options win over -march=native in either
# order, so llama.cpp keeps the host's other instructions (AVX-512, VNNI).
case $(uname -m) in
x86_64) echo "-DCMAKE_C_FLAGS=-mno-amx-tile\ -mno-amx-int8\ -mno-amx-bf16 -DCMAKE_CXX_FLAGS=-mno-amx-tile\ -mno-amx-int8\ -mno-amx-bf16" ;;
esac
