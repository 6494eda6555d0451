/* bench_cuda.h - the standalone CUDA benchmark programs' error check (not
 * the backend's: these link only the CUDA libraries). */
#ifndef FERRUM_BENCH_CUDA_H
#define FERRUM_BENCH_CUDA_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

/* Exits with the file, line, call and CUDA's message where x fails. */
#define CU(x)                                                                                                   \
  do {                                                                                                          \
    cudaError_t e_ = (x);                                                                                       \
    if (e_ != cudaSuccess) {                                                                                    \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));                      \
      exit(1);                                                                                                  \
    }                                                                                                           \
  } while (0)

#endif
