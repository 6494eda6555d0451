/* test_proto_mbox.c - the shared-memory step mailbox (proto/proto_mbox.h):
 * one message at a time, BUSY until the last one is decoded or when too
 * large, a corrupt length clamped to the mailbox, RING only while the
 * consumer sleeps, a restarted consumer skips what was there, and two
 * processes ping-ponging 20,000 messages of random sizes through a pair of
 * mailboxes get every byte in order. */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "proto/proto_mbox.h"

static void *base;

static void setup(void) {
  base = mmap(NULL, proto_mbox_bytes(2), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ck_assert_ptr_ne(base, MAP_FAILED);
}

static void teardown(void) { munmap(base, proto_mbox_bytes(2)); }

START_TEST(test_one_at_a_time) {
  proto_mbox_t *m = proto_mbox_at(base, 1, PROTO_MBOX_UP);
  ck_assert_ptr_eq(m, (proto_mbox_t *)base + 3);
  size_t len = 1;
  ck_assert_ptr_null(proto_mbox_peek(m, &len));
  ck_assert_int_eq(proto_mbox_post(m, "step one", 8), PROTO_MBOX_POSTED);
  ck_assert_int_eq(proto_mbox_post(m, "step two", 8), PROTO_MBOX_BUSY); /* one not decoded yet */
  const char *p = proto_mbox_peek(m, &len);
  ck_assert_ptr_nonnull(p);
  ck_assert_uint_eq(len, 8);
  ck_assert_int_eq(memcmp(p, "step one", 8), 0);
  ck_assert_ptr_nonnull(proto_mbox_peek(m, &len)); /* still there until done */
  proto_mbox_done(m);
  ck_assert_ptr_null(proto_mbox_peek(m, &len));
  ck_assert_int_eq(proto_mbox_post(m, "step two", 8), PROTO_MBOX_POSTED);
  p = proto_mbox_peek(m, &len);
  ck_assert_int_eq(memcmp(p, "step two", 8), 0);
  proto_mbox_done(m);
  /* the other mailboxes are untouched */
  for (int r = 0; r < 2; r++)
    for (int d = 0; d < 2; d++)
      if (r != 1 || d != PROTO_MBOX_UP) ck_assert_ptr_null(proto_mbox_peek(proto_mbox_at(base, r, d), &len));
}
END_TEST

START_TEST(test_too_large_and_empty) {
  proto_mbox_t *m = proto_mbox_at(base, 0, PROTO_MBOX_DOWN);
  char *big = calloc(1, PROTO_MBOX_CAP + 1);
  ck_assert_int_eq(proto_mbox_post(m, big, PROTO_MBOX_CAP + 1), PROTO_MBOX_BUSY);
  size_t len = 1;
  ck_assert_ptr_null(proto_mbox_peek(m, &len));
  ck_assert_int_eq(proto_mbox_post(m, big, PROTO_MBOX_CAP), PROTO_MBOX_POSTED);
  ck_assert_ptr_nonnull(proto_mbox_peek(m, &len));
  ck_assert_uint_eq(len, PROTO_MBOX_CAP);
  proto_mbox_done(m);
  ck_assert_int_eq(proto_mbox_post(m, big, 0), PROTO_MBOX_POSTED); /* an empty message is a message */
  ck_assert_ptr_nonnull(proto_mbox_peek(m, &len));
  ck_assert_uint_eq(len, 0);
  proto_mbox_done(m);
  /* a producer that writes a length past the mailbox: the consumer reads no further than it */
  ck_assert_int_eq(proto_mbox_post(m, big, 8), PROTO_MBOX_POSTED);
  m->len = 0xffffffffu;
  ck_assert_ptr_nonnull(proto_mbox_peek(m, &len));
  ck_assert_uint_eq(len, PROTO_MBOX_CAP);
  free(big);
}
END_TEST

START_TEST(test_doorbell_and_skip) {
  proto_mbox_t *m = proto_mbox_at(base, 0, PROTO_MBOX_DOWN);
  size_t len;
  proto_mbox_sleeping(m, true);
  ck_assert_int_eq(proto_mbox_post(m, "a", 1), PROTO_MBOX_RING);
  proto_mbox_sleeping(m, false);
  proto_mbox_done(m);
  ck_assert_int_eq(proto_mbox_post(m, "b", 1), PROTO_MBOX_POSTED);
  /* a consumer that starts after a post drops it, and the next one comes */
  proto_mbox_skip(m);
  ck_assert_ptr_null(proto_mbox_peek(m, &len));
  ck_assert_int_eq(proto_mbox_post(m, "c", 1), PROTO_MBOX_POSTED);
  const char *p = proto_mbox_peek(m, &len);
  ck_assert_ptr_nonnull(p);
  ck_assert_int_eq(p[0], 'c');
}
END_TEST

/* A message of `len` bytes numbered i: every byte depends on both. */
static void fill(uint8_t *b, size_t len, uint32_t i) {
  for (size_t k = 0; k < len; k++) b[k] = (uint8_t)(i * 131u + k * 7u + (k >> 8));
}

static size_t size_of(uint32_t i) { return (i * 2654435761u) % 70000u; }

START_TEST(test_two_processes) {
  enum { N = 20000 };
  proto_mbox_t *down = proto_mbox_at(base, 0, PROTO_MBOX_DOWN), *up = proto_mbox_at(base, 0, PROTO_MBOX_UP);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) { /* the worker: checks each message, answers with its number */
    uint8_t *want = malloc(70000);
    for (uint32_t i = 0; i < N; i++) {
      size_t len;
      const uint8_t *p;
      while (!(p = proto_mbox_peek(down, &len))) {
      }
      fill(want, size_of(i), i);
      int ok = len == size_of(i) && memcmp(p, want, len) == 0;
      proto_mbox_done(down);
      uint32_t ans[2] = {i, (uint32_t)ok};
      while (proto_mbox_post(up, ans, sizeof ans) == PROTO_MBOX_BUSY) {
      }
    }
    _exit(0);
  }
  uint8_t *msg = malloc(70000);
  for (uint32_t i = 0; i < N; i++) {
    fill(msg, size_of(i), i);
    ck_assert_int_eq(proto_mbox_post(down, msg, size_of(i)), PROTO_MBOX_POSTED);
    size_t len;
    const uint32_t *a;
    while (!(a = proto_mbox_peek(up, &len))) {
    }
    ck_assert_uint_eq(len, 8);
    ck_assert_msg(a[0] == i && a[1] == 1, "message %u came back as %u (intact: %u)", i, a[0], a[1]);
    proto_mbox_done(up);
  }
  int st = 0;
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
  ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  free(msg);
}
END_TEST

#include "tests/common/test_main.h"

static Suite *mbox_suite(void) {
  Suite *s = suite_create("proto_mbox");
  TCase *tc = tcase_create("mbox");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_one_at_a_time);
  tcase_add_test(tc, test_too_large_and_empty);
  tcase_add_test(tc, test_doorbell_and_skip);
  tcase_add_test(tc, test_two_processes);
  suite_add_tcase(s, tc);
  return s;
}

const test_prog_t test_prog = {.suites = {mbox_suite}};
