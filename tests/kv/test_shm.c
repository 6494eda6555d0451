/* test_shm.c - kv shared-memory segments: names, create / attach / unlink,
 * header checks, mode 0600, read-only mappings fault on write, the stale
 * scan (SIGKILLed owner, zombie owner, reused pid, live and adopted
 * segments, foreign names), KV pool sizes. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fr_err.h"
#include "kv/kv_shm.h"

static char g_inst[32];

/* In a child with a mount namespace of its own and a 1 MiB /dev/shm (root
 * only): a 4 MiB segment is refused at creation with a message, and leaves
 * nothing. Exit 0 passed, 1 failed, 77 no privilege for namespaces. */
static int small_shm_child(void) {
  if (unshare(CLONE_NEWNS) != 0) return 77;
  if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
      mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=1m") != 0)
    return 77;
  kv_segment_t seg;
  int rc = kv_segment_create(&seg, g_inst, "big", 4u << 20, 1);
  if (rc != -ENOSPC || !strstr(fr_last_error(), "shared memory (/dev/shm)") || !strstr(fr_last_error(), "--shm-size")) {
    fprintf(stderr, "create gave %d: %s\n", rc, fr_last_error());
    return 1;
  }
  if (kv_segment_create(&seg, g_inst, "small", 64u << 10, 1) != 0) return 1; /* what fits still does */
  kv_segment_detach(&seg);
  kv_segment_unlink(g_inst, "small");
  return access("/dev/shm/ferrum-big", F_OK) == 0 ? 1 : 0;
}

static void set_inst(const char *tag) { snprintf(g_inst, sizeof g_inst, "tkv%s%d", tag, (int)getpid()); }

static int exists(const char *instance, const char *what) {
  kv_segment_t seg;
  int err = kv_segment_attach(&seg, instance, what, KV_SEG_RDONLY);
  if (err == 0) kv_segment_detach(&seg);
  return err == 0;
}

START_TEST(test_names) {
  char buf[KV_SEG_NAME_MAX];
  ck_assert_int_eq(kv_segment_name(buf, sizeof buf, "prod_1.a", "kv-pool.r0"), 0);
  ck_assert_str_eq(buf, "/ferrum-prod_1.a-kv-pool.r0");
  const char *bad_inst[] = {"", "a-b", "a/b", "a b", "0123456789012345678901234567890123"};
  for (size_t i = 0; i < sizeof bad_inst / sizeof bad_inst[0]; i++)
    ck_assert_int_eq(kv_segment_name(buf, sizeof buf, bad_inst[i], "x"), -EINVAL);
  ck_assert_int_eq(kv_segment_name(buf, sizeof buf, "a", ""), -EINVAL);
  ck_assert_int_eq(kv_segment_name(buf, sizeof buf, "a", "x/y"), -EINVAL);
  ck_assert_int_eq(kv_segment_name(buf, sizeof buf, NULL, "x"), -EINVAL);
  ck_assert_int_eq(kv_segment_name(buf, 8, "abcdef", "x"), -EINVAL); /* buffer too small */
}
END_TEST

/* A full /dev/shm fails the creation, not a process later (SIGBUS). */
START_TEST(test_create_reserves_its_pages) {
  set_inst("full");
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) _exit(small_shm_child());
  int st;
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
  ck_assert(WIFEXITED(st));
  if (WEXITSTATUS(st) == 77) {
    fprintf(stderr, "test_create_reserves_its_pages: no mount namespace (not root): skipped\n");
    return;
  }
  ck_assert_int_eq(WEXITSTATUS(st), 0);
}
END_TEST

START_TEST(test_create_attach_unlink) {
  set_inst("c");
  kv_segment_t seg, ro, rw;
  ck_assert_int_eq(kv_segment_create(&seg, g_inst, "data", 10000, 42), 0);
  const kv_seg_header_t *h = kv_segment_header(&seg);
  ck_assert_uint_eq(h->magic, KV_SEG_MAGIC);
  ck_assert_uint_eq(h->version, KV_SEG_VERSION);
  ck_assert_int_eq(h->owner_pid, getpid());
  ck_assert_uint_gt(h->owner_start, 0);
  ck_assert_uint_eq(h->epoch, 42);
  ck_assert_str_eq(h->instance, g_inst);
  ck_assert_str_eq(h->what, "data");
  ck_assert_uint_eq(h->data_bytes, 10000);
  ck_assert_uint_eq(seg.size % (size_t)sysconf(_SC_PAGESIZE), 0);
  ck_assert_uint_ge(kv_segment_data_size(&seg), 10000);
  ck_assert_uint_eq((uintptr_t)kv_segment_data(&seg) % 4096, 0);
  struct stat st;
  ck_assert_int_eq(fstat(seg.fd, &st), 0);
  ck_assert_int_eq(st.st_mode & 0777, 0600);
  ck_assert_int_eq((size_t)st.st_size, seg.size);
  ck_assert(kv_segment_owner_alive(h));
  /* The name is taken. */
  kv_segment_t dup;
  ck_assert_int_eq(kv_segment_create(&dup, g_inst, "data", 10, 1), -EEXIST);
  /* Readers and read-write users see the same bytes. */
  ck_assert_int_eq(kv_segment_attach(&ro, g_inst, "data", KV_SEG_RDONLY), 0);
  ck_assert_int_eq(kv_segment_attach(&rw, g_inst, "data", KV_SEG_RDWR), 0);
  ck_assert_int_eq(ro.writable, 0);
  ((char *)kv_segment_data(&rw))[5] = 'x';
  ck_assert_int_eq(((char *)kv_segment_data(&ro))[5], 'x');
  ck_assert_int_eq(((char *)kv_segment_data(&seg))[5], 'x');
  ck_assert_int_eq(kv_segment_adopt(&ro, 1), -EPERM);
  ck_assert_int_eq(kv_segment_adopt(&rw, 43), 0);
  ck_assert_uint_eq(h->epoch, 43);
  /* Wrong kind, missing names. */
  ck_assert_int_eq(kv_segment_attach(&dup, g_inst, "other", KV_SEG_RDONLY), -ENOENT);
  kv_segment_detach(&ro);
  kv_segment_detach(&rw);
  kv_segment_detach(&ro); /* twice is fine */
  kv_segment_detach(NULL);
  ck_assert_int_eq(kv_segment_unlink(g_inst, "data"), 0);
  ck_assert_int_eq(kv_segment_unlink(g_inst, "data"), -ENOENT);
  ck_assert(!exists(g_inst, "data"));
  /* Still mapped after the unlink. */
  ck_assert_int_eq(((char *)kv_segment_data(&seg))[5], 'x');
  kv_segment_detach(&seg);
}
END_TEST

START_TEST(test_readonly_write_faults) {
  set_inst("f");
  kv_segment_t seg;
  ck_assert_int_eq(kv_segment_create(&seg, g_inst, "ro", 100, 1), 0);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    kv_segment_t ro;
    if (kv_segment_attach(&ro, g_inst, "ro", KV_SEG_RDONLY) != 0) _exit(3);
    signal(SIGSEGV, SIG_DFL);
    ((volatile char *)kv_segment_data(&ro))[0] = 1;
    _exit(0);
  }
  int st = 0;
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
  ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV, "child status %#x: no fault", st);
  ck_assert_int_eq(((char *)kv_segment_data(&seg))[0], 0);
  ck_assert_int_eq(kv_segment_unlink(g_inst, "ro"), 0);
  kv_segment_detach(&seg);
}
END_TEST

START_TEST(test_bad_headers) {
  set_inst("h");
  kv_segment_t seg, x;
  ck_assert_int_eq(kv_segment_create(&seg, g_inst, "hdr", 100, 1), 0);
  kv_seg_header_t *h = seg.base;
  h->magic ^= 1;
  ck_assert_int_eq(kv_segment_attach(&x, g_inst, "hdr", KV_SEG_RDONLY), FR_EFORMAT);
  h->magic ^= 1;
  h->version = 2;
  ck_assert_int_eq(kv_segment_attach(&x, g_inst, "hdr", KV_SEG_RDONLY), FR_EVERSION);
  h->version = KV_SEG_VERSION;
  h->total_bytes += 4096;
  ck_assert_int_eq(kv_segment_attach(&x, g_inst, "hdr", KV_SEG_RDONLY), FR_EFORMAT);
  h->total_bytes -= 4096;
  h->data_bytes = h->total_bytes;
  ck_assert_int_eq(kv_segment_attach(&x, g_inst, "hdr", KV_SEG_RDONLY), FR_EFORMAT);
  h->data_bytes = 100;
  memset(h->what, 'a', sizeof h->what); /* unterminated */
  ck_assert_int_eq(kv_segment_attach(&x, g_inst, "hdr", KV_SEG_RDONLY), FR_EFORMAT);
  strcpy(h->what, "other"); /* names another segment */
  ck_assert_int_eq(kv_segment_attach(&x, g_inst, "hdr", KV_SEG_RDONLY), FR_EFORMAT);
  strcpy(h->what, "hdr");
  ck_assert_int_eq(kv_segment_attach(&x, g_inst, "hdr", KV_SEG_RDONLY), 0);
  kv_segment_detach(&x);
  /* Shorter than a header (a creator that has not sized it yet). */
  ck_assert_int_eq(ftruncate(seg.fd, 100), 0);
  ck_assert_int_eq(kv_segment_attach(&x, g_inst, "hdr", KV_SEG_RDONLY), FR_ETRUNCATED);
  ck_assert_int_eq(kv_segment_unlink(g_inst, "hdr"), 0);
  kv_segment_detach(&seg);
}
END_TEST

/* A child that creates a segment, reports, then waits to be killed. */
static pid_t spawn_owner(const char *what) {
  int fds[2];
  ck_assert_int_eq(pipe(fds), 0);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    kv_segment_t seg;
    char ok = kv_segment_create(&seg, g_inst, what, 64, 1) == 0 ? 'y' : 'n';
    if (write(fds[1], &ok, 1) != 1) _exit(2);
    for (;;) pause();
  }
  close(fds[1]);
  char ok = 0;
  ck_assert_int_eq(read(fds[0], &ok, 1), 1);
  ck_assert_int_eq(ok, 'y');
  close(fds[0]);
  return pid;
}

/* A stale scan here. The tests assert what it leaves, not how many it
 * removed: another process's scan (a coordinator starting beside these
 * tests, as ctest runs them in parallel) may remove a dead owner's
 * segment first, from the moment the owner dies. For the same reason a
 * dead owner's segment is looked at through a mapping taken while it
 * lived. */
static void scan(int *live) { ck_assert_int_eq(kv_segment_scan_stale(NULL, live), 0); }

START_TEST(test_stale_scan_killed_owner) {
  set_inst("s");
  pid_t dead = spawn_owner("pool"), alive = spawn_owner("live");
  kv_segment_t mine, pool;
  ck_assert_int_eq(kv_segment_create(&mine, g_inst, "mine", 64, 1), 0);
  ck_assert_int_eq(kv_segment_attach(&pool, g_inst, "pool", KV_SEG_RDONLY), 0);
  ck_assert(kv_segment_owner_alive(kv_segment_header(&pool)));
  ck_assert_int_eq(kill(dead, SIGKILL), 0);
  ck_assert_int_eq(waitpid(dead, NULL, 0), dead);
  ck_assert(!kv_segment_owner_alive(kv_segment_header(&pool)));
  kv_segment_detach(&pool);
  int live = 0;
  scan(&live);
  ck_assert_int_ge(live, 2);
  ck_assert(!exists(g_inst, "pool"));
  ck_assert(exists(g_inst, "live"));
  ck_assert(exists(g_inst, "mine"));
  kill(alive, SIGKILL);
  waitpid(alive, NULL, 0);
  scan(NULL);
  ck_assert(!exists(g_inst, "live"));
  ck_assert(exists(g_inst, "mine"));
  ck_assert_int_eq(kv_segment_unlink(g_inst, "mine"), 0);
  kv_segment_detach(&mine);
}
END_TEST

START_TEST(test_stale_scan_zombie_and_reused_pid) {
  set_inst("z");
  /* An owner killed but not reaped yet (a zombie) is dead. */
  pid_t z = spawn_owner("zombie");
  kv_segment_t zs;
  ck_assert_int_eq(kv_segment_attach(&zs, g_inst, "zombie", KV_SEG_RDONLY), 0);
  ck_assert_int_eq(kill(z, SIGKILL), 0);
  bool zombie = false;
  for (int i = 0; i < 200 && !zombie; i++) { /* wait until it is a zombie */
    siginfo_t si = {0};
    zombie = waitid(P_PID, (id_t)z, &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == z;
    if (!zombie) usleep(10000);
  }
  ck_assert(zombie);
  ck_assert(!kv_segment_owner_alive(kv_segment_header(&zs)));
  kv_segment_detach(&zs);
  scan(NULL);
  ck_assert(!exists(g_inst, "zombie"));
  waitpid(z, NULL, 0);
  /* A live pid with another start time is a reused pid: stale. */
  kv_segment_t seg;
  ck_assert_int_eq(kv_segment_create(&seg, g_inst, "reused", 64, 1), 0);
  ((kv_seg_header_t *)seg.base)->owner_start += 1;
  ck_assert(!kv_segment_owner_alive(kv_segment_header(&seg)));
  scan(NULL);
  ck_assert(!exists(g_inst, "reused"));
  kv_segment_detach(&seg);
}
END_TEST

START_TEST(test_stale_scan_adopted_and_foreign) {
  set_inst("a");
  pid_t owner = spawn_owner("adopted");
  kv_segment_t rw;
  ck_assert_int_eq(kv_segment_attach(&rw, g_inst, "adopted", KV_SEG_RDWR), 0);
  ck_assert_int_eq(kv_segment_adopt(&rw, 5), 0);
  kill(owner, SIGKILL);
  waitpid(owner, NULL, 0);
  scan(NULL);
  ck_assert(exists(g_inst, "adopted")); /* this process owns it now */
  /* A /ferrum-* name without a header this code knows is left alone. */
  char name[KV_SEG_NAME_MAX];
  ck_assert_int_eq(kv_segment_name(name, sizeof name, g_inst, "foreign"), 0);
  int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(ftruncate(fd, 8192), 0);
  ck_assert_int_eq(pwrite(fd, "not a header", 12, 0), 12);
  close(fd);
  scan(NULL);
  ck_assert_int_eq(kv_segment_unlink(g_inst, "foreign"), 0);
  ck_assert_int_eq(kv_segment_unlink(g_inst, "adopted"), 0);
  kv_segment_detach(&rw);
}
END_TEST

START_TEST(test_pool_bytes) {
  /* SmolLM2-135M: 30 layers, 3 KV heads of 64, f16, 1000 blocks of 16. */
  kv_pool_geom_t g = {.n_layers = 30, .n_kv_heads = 3, .head_dim = 64, .elem_bytes = 2, .block_size = 16,
                      .n_blocks = 1000};
  size_t data = 0, total = 0, pg = (size_t)sysconf(_SC_PAGESIZE);
  ck_assert_int_eq(kv_pool_data_bytes(&g, &data), 0);
  ck_assert_uint_eq(data, 30ull * 2 * 1000 * 16 * 3 * 64 * 2);
  ck_assert_int_eq(kv_pool_bytes(&g, &total), 0);
  ck_assert_uint_eq(total, (data + 4096 + pg - 1) / pg * pg);
  g.n_blocks = 1;
  g.n_layers = 1;
  g.n_kv_heads = 1;
  g.head_dim = 1;
  ck_assert_int_eq(kv_pool_bytes(&g, &total), 0);
  ck_assert_uint_eq(total, pg > 4096 ? pg : 8192);
  g.n_layers = 0;
  ck_assert_int_eq(kv_pool_bytes(&g, &total), -EINVAL);
  g = (kv_pool_geom_t){.n_layers = 1 << 30, .n_kv_heads = 1 << 30, .head_dim = 1 << 30, .elem_bytes = 4,
                       .block_size = 16, .n_blocks = 1 << 30};
  ck_assert_int_eq(kv_pool_data_bytes(&g, &data), FR_ETOOBIG);
  ck_assert_int_eq(kv_pool_bytes(&g, &total), FR_ETOOBIG);
  /* A pool segment holds its payload. */
  set_inst("p");
  g = (kv_pool_geom_t){.n_layers = 2, .n_kv_heads = 2, .head_dim = 8, .elem_bytes = 4, .block_size = 16,
                       .n_blocks = 5};
  ck_assert_int_eq(kv_pool_data_bytes(&g, &data), 0);
  ck_assert_int_eq(kv_pool_bytes(&g, &total), 0);
  kv_segment_t seg;
  ck_assert_int_eq(kv_segment_create(&seg, g_inst, "kvpool.r0", data, 1), 0);
  ck_assert_uint_eq(seg.size, total);
  memset(kv_segment_data(&seg), 1, data);
  ck_assert_int_eq(kv_segment_unlink(g_inst, "kvpool.r0"), 0);
  kv_segment_detach(&seg);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("kv_shm");
  TCase *tc = tcase_create("shm");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_names);
  tcase_add_test(tc, test_create_attach_unlink);
  tcase_add_test(tc, test_create_reserves_its_pages);
  tcase_add_test(tc, test_readonly_write_faults);
  tcase_add_test(tc, test_bad_headers);
  tcase_add_test(tc, test_stale_scan_killed_owner);
  tcase_add_test(tc, test_stale_scan_zombie_and_reused_pid);
  tcase_add_test(tc, test_stale_scan_adopted_and_foreign);
  tcase_add_test(tc, test_pool_bytes);
  suite_add_tcase(s, tc);
  return s;
}

/* The shared main (tests/common/test_main.c) runs this program's suites. */
#include "tests/common/test_main.h"

const test_prog_t test_prog = {.suites = {suite}};
