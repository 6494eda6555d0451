/* gpu_main.h - the set-up hook of the GPU test programs (test_prog's
 * .setup, tests/common/test_main.h): the program is skipped (exit 77) unless
 * a CUDA device is usable. */
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

/* Probes for a device in a child, so this process never creates a CUDA
 * context before the forked tests do. Returns 0 when a device answers, else
 * TEST_SKIP (77) with the reason on stderr. */
int gpu_test_setup(int argc, char **argv);

#ifdef __cplusplus
}
#endif
