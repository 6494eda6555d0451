/* test_runtime.c - the runtime folder (coordinator/runtime.c): it is never
 * reached through a link another user could plant, and what killed servers
 * left in it (worker sockets, pid files, RPC sockets) is cleaned up. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fr_err.h"
#include "coordinator/coord_impl.h"
#include "tests/common/test_main.h"

static char base[256];

static void setup(void) {
  snprintf(base, sizeof base, "/tmp/ferrum-rt-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(base));
  setenv("XDG_RUNTIME_DIR", base, 1);
}

static void teardown(void) {
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", base);
  ck_assert_int_eq(system(cmd), 0);
}

/* A pid that belonged to a process that has exited. */
static pid_t dead_pid(void) {
  pid_t p = fork();
  if (p == 0) _exit(0);
  ck_assert_int_eq(waitpid(p, NULL, 0), p);
  return p;
}

static void touch(const char *dir, const char *name, const char *text) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fputs(text, f);
  fclose(f);
}

static bool exists(const char *dir, const char *name) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  struct stat st;
  return lstat(path, &st) == 0;
}

START_TEST(test_runtime_dir_made_private) {
  char dir[512], want[512];
  ck_assert_int_eq(coord_runtime_dir(dir, sizeof dir), 0);
  snprintf(want, sizeof want, "%s/ferrum", base);
  ck_assert_str_eq(dir, want);
  ck_assert_int_eq(chmod(dir, 0755), 0);
  ck_assert_int_eq(coord_runtime_dir(dir, sizeof dir), 0); /* tightened again */
  struct stat st;
  ck_assert_int_eq(stat(dir, &st), 0);
  ck_assert_int_eq(st.st_mode & 0777, 0700);
}
END_TEST

/* A link planted where the folder goes is refused, and what it points to
 * is left as it was (no chmod through it). */
START_TEST(test_runtime_dir_link_refused) {
  char target[300], link[300], dir[512];
  snprintf(target, sizeof target, "%s/elsewhere", base);
  snprintf(link, sizeof link, "%s/ferrum", base);
  ck_assert_int_eq(mkdir(target, 0755), 0);
  ck_assert_int_eq(chmod(target, 0755), 0);
  ck_assert_int_eq(symlink(target, link), 0);
  ck_assert_int_ne(coord_runtime_dir(dir, sizeof dir), 0);
  ck_assert_msg(strstr(fr_last_error(), "not a folder"), "%s", fr_last_error());
  struct stat st;
  ck_assert_int_eq(stat(target, &st), 0);
  ck_assert_int_eq(st.st_mode & 0777, 0755);
  char rpc[700];
  ck_assert_int_ne(coord_default_rpc_addr(rpc, sizeof rpc), 0);
}
END_TEST

/* Files of dead servers go; a live server's stay. */
START_TEST(test_stale_files_removed) {
  char dir[512], name[128], text[900];
  ck_assert_int_eq(coord_runtime_dir(dir, sizeof dir), 0);
  pid_t dead = dead_pid(), live = getpid();
  snprintf(name, sizeof name, "p%d.abc123.workers", (int)dead);
  touch(dir, name, "");
  char dead_workers[128];
  snprintf(dead_workers, sizeof dead_workers, "%s", name);
  snprintf(name, sizeof name, "p%d.def456.workers", (int)live);
  touch(dir, name, "");
  char live_workers[128];
  snprintf(live_workers, sizeof live_workers, "%s", name);
  snprintf(text, sizeof text, "%d\np%d.abc123\nipc://%s/old.sock\n", (int)dead, (int)dead, dir);
  touch(dir, "server-00000000000000aa.pid", text);
  touch(dir, "old.sock", "");
  snprintf(text, sizeof text, "%d\np%d.def456\nipc://%s/rpc.sock\n", (int)live, (int)live, dir);
  touch(dir, "server-00000000000000bb.pid", text);
  touch(dir, "rpc.sock", "");
  coord__runtime_clean_stale(dir);
  ck_assert(!exists(dir, dead_workers));
  ck_assert(!exists(dir, "server-00000000000000aa.pid"));
  ck_assert(!exists(dir, "old.sock"));
  ck_assert(exists(dir, live_workers));
  ck_assert(exists(dir, "server-00000000000000bb.pid"));
  ck_assert(exists(dir, "rpc.sock"));
}
END_TEST

static Suite *runtime_suite(void) {
  Suite *s = suite_create("runtime");
  TCase *t = tcase_create("runtime");
  tcase_add_checked_fixture(t, setup, teardown);
  tcase_add_test(t, test_runtime_dir_made_private);
  tcase_add_test(t, test_runtime_dir_link_refused);
  tcase_add_test(t, test_stale_files_removed);
  suite_add_tcase(s, t);
  return s;
}

const test_prog_t test_prog = {.suites = {runtime_suite}};
