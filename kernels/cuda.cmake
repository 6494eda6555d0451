# The CUDA backend (kernels/cuda/). With FERRUM_CUDA on it is its own library,
# ferrum_kernels_cuda, linked into ferrum_kernels; without it a stub
# kern_cuda_create that returns FR_EUNSUPPORTED joins ferrum_kernels.
if(NOT FERRUM_CUDA)
  target_sources(ferrum_kernels PRIVATE cuda/kcu_stub.c)
  return()
endif()

# nvcc does not take the project's C warning flags (add_compile_options):
# CUDA targets get their own.
function(ferrum_cuda_flags target)
  set_property(TARGET ${target} PROPERTY COMPILE_OPTIONS "")
  set_target_properties(${target} PROPERTIES CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}"
    CUDA_STANDARD 17 POSITION_INDEPENDENT_CODE ON)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo -Xcompiler=-Wall,-Wno-unused-parameter>
    $<$<COMPILE_LANGUAGE:C>:-Wall -Wextra -Wno-unused-parameter>)
  if(FERRUM_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings>
      $<$<COMPILE_LANGUAGE:C>:-Werror>)
  endif()
endfunction()

add_library(ferrum_kernels_cuda STATIC
  cuda/kcu_backend.cu
  cuda/kcu_weights.cu
  cuda/kcu_ops.cu
  cuda/kcu_matmul.cu
  cuda/kcu_f8.cu
  cuda/kcu_q4f.cu
  cuda/kcu_q4f_wide.cu
  cuda/kcu_attn.cu
  cuda/kcu_moe.cu
  cuda/kcu_ggemm.cu
  cuda/kcu_sample.cu
  cuda/kcu_comm.cu
  cuda/kcu_car.cu)
ferrum_cuda_flags(ferrum_kernels_cuda)
# The wgmma kernels (kcu_ggemm_wg.cu: the grouped GEMM's large tiles;
# kcu_q4f_wg.cu: the 4-bit matmul over many rows) are sm_90a code: built
# when the build targets Hopper, used on a compute capability 9.0 device.
if(CMAKE_CUDA_ARCHITECTURES MATCHES "(^|;)90")
  add_library(ferrum_kernels_cuda_wg OBJECT cuda/kcu_ggemm_wg.cu cuda/kcu_q4f_wg.cu)
  ferrum_cuda_flags(ferrum_kernels_cuda_wg)
  set_target_properties(ferrum_kernels_cuda_wg PROPERTIES CUDA_ARCHITECTURES OFF)
  target_compile_options(ferrum_kernels_cuda_wg PRIVATE -gencode=arch=compute_90a,code=sm_90a)
  ferrum_headers(ferrum_kernels_cuda_wg FOLDER kernels)
  target_link_libraries(ferrum_kernels_cuda_wg PRIVATE ferrum_kern_types ferrum_common CUDA::cudart)
  target_sources(ferrum_kernels_cuda PRIVATE $<TARGET_OBJECTS:ferrum_kernels_cuda_wg>)
  target_compile_definitions(ferrum_kernels_cuda PRIVATE KCU_HAVE_WG)
endif()
if(FERRUM_CUDA_TRACE)
  target_compile_definitions(ferrum_kernels_cuda PRIVATE KCU_TRACE)
endif()
# NCCL ships with the CUDA toolkit here (lib64/libnccl.so) or as a system
# package; either way its header sits beside the toolkit's or in /usr/include.
find_library(FERRUM_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} REQUIRED)
ferrum_headers(ferrum_kernels_cuda FOLDER kernels)
target_link_libraries(ferrum_kernels_cuda PUBLIC ferrum_kern_types ferrum_common CUDA::cudart CUDA::cublas CUDA::cublasLt ${FERRUM_NCCL_LIBRARY})
target_link_libraries(ferrum_kernels PUBLIC ferrum_kernels_cuda)
