/* test_main.h - the one main of ferrum's Check test programs (test_main.c,
 * library ferrum_testmain; ferrum_add_check links it). A test program
 * defines no main of its own, only what it runs:
 *
 *   const test_prog_t test_prog = {.suites = {kv_suite}, .setup = kv_setup};
 *
 * The main calls setup (when set) with main's arguments, then makes every
 * suite, runs them in one runner in fork mode (CK_FORK=no in the environment
 * runs them in-process, for a debugger), prints Check's summary (verbosity
 * from CK_VERBOSITY, normal by default) and exits 0 when every test passed,
 * 1 when one failed or set-up failed, TEST_SKIP when set-up skipped. */
#pragma once

#include <check.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ctest's SKIP_RETURN_CODE (ferrum_add_check). */
#define TEST_SKIP 77
#define TEST_MAX_SUITES 8

typedef struct {
  /* Suite makers in run order; the first NULL ends the list. Called after
   * setup, in the parent process. */
  Suite *(*suites[TEST_MAX_SUITES])(void);
  /* Optional. Runs once before any suite is made, in the parent (what it
   * loads is inherited by the forked tests). Returns 0 to run, TEST_SKIP to
   * skip the program (it prints why on stderr), anything else to fail it. */
  int (*setup)(int argc, char **argv);
} test_prog_t;

/* Defined by each test program. */
extern const test_prog_t test_prog;

#ifdef __cplusplus
}
#endif
