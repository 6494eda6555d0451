/* gpu_main.c - see gpu_main.h. */
#include "tests/gpu/gpu_main.h"

#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fr_err.h"
#include "kernels/kern.h"
#include "tests/common/test_main.h"

int gpu_test_setup(int argc, char **argv) {
  pid_t pid = fork();
  if (pid == 0) {
    kern_backend_t *b = NULL;
    int rc = kern_cuda_create(&b, 0);
    if (rc) fprintf(stderr, "%s: no CUDA device: %s\n", argv[0], fr_last_error());
    kern_backend_destroy(b);
    _exit(rc ? TEST_SKIP : 0);
  }
  int st = 0;
  if (pid < 0 || waitpid(pid, &st, 0) < 0) return TEST_SKIP;
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : TEST_SKIP;
}
