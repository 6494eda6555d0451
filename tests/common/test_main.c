/* test_main.c - see test_main.h. */
#include "tests/common/test_main.h"

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
  if (test_prog.setup) {
    int rc = test_prog.setup(argc, argv);
    if (rc == TEST_SKIP) {
      fprintf(stderr, "%s: skipped\n", argv[0]);
      return TEST_SKIP;
    }
    if (rc != 0) {
      fprintf(stderr, "%s: set-up failed (%d)\n", argv[0], rc);
      return 1;
    }
  }
  if (!test_prog.suites[0]) {
    fprintf(stderr, "%s: test_prog lists no suite\n", argv[0]);
    return 1;
  }
  SRunner *sr = srunner_create(test_prog.suites[0]());
  for (int i = 1; i < TEST_MAX_SUITES && test_prog.suites[i]; i++) srunner_add_suite(sr, test_prog.suites[i]());
  if (!getenv("CK_FORK")) srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_ENV);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
