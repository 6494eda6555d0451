/* gpu_main.h - the main of the GPU test programs: skip (exit 77) unless a
 * CUDA device is usable, else run the suite in fork mode. */
#pragma once

#include <check.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Probes for a device in a child (so this process never creates a CUDA
 * context before the forked tests do), then runs s. Returns main's code:
 * 77 when skipped, 1 when a test failed, else 0. */
int gpu_test_main(Suite *s, const char *name);

#ifdef __cplusplus
}
#endif
