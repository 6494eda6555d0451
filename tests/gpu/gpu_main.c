/* gpu_main.c - see gpu_main.h. */
#include "tests/gpu/gpu_main.h"

#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fr_err.h"
#include "kernels/kern.h"

static int gpu__available(const char *name) {
  pid_t pid = fork();
  if (pid == 0) {
    kern_backend_t *b = NULL;
    int rc = kern_cuda_create(&b, 0);
    if (rc) fprintf(stderr, "%s: skipped: %s\n", name, fr_last_error());
    kern_backend_destroy(b);
    _exit(rc ? 77 : 0);
  }
  int st = 0;
  if (pid < 0 || waitpid(pid, &st, 0) < 0) return 0;
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

int gpu_test_main(Suite *s, const char *name) {
  if (!gpu__available(name)) return 77; /* s is left to the exit */
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
