/* test_proto_curve.c - CURVE keys (proto/curve.c): key pairs written and
 * read back, the environment's secret key, key files and lists with
 * comments, quotes and '#' inside keys, the errors bad files get (with the
 * line), loopback endpoints, and a CURVE pair of sockets: the right server
 * key connects, a wrong one does not. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "common/fr_err.h"
#include "proto/curve.h"

static char dir[64];

static void setup(void) {
  snprintf(dir, sizeof dir, "/tmp/ferrum-curve-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(dir));
  unsetenv(PROTO_CURVE_ENV);
}

static void teardown(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  ck_assert_int_eq(system(cmd), 0);
}

static void write_text(const char *name, const char *text) {
  char path[128];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fputs(text, f);
  fclose(f);
}

static const char *at(const char *name) {
  static char path[4][128];
  static int i;
  char *p = path[i++ % 4];
  snprintf(p, 128, "%s/%s", dir, name);
  return p;
}

START_TEST(test_keygen_round_trip) {
  proto_curve_pair_t kp, back;
  ck_assert(proto_curve_available());
  ck_assert_int_eq(proto_curve_generate(&kp), 0);
  ck_assert_int_eq(strlen(kp.pub), 40);
  ck_assert_int_eq(proto_curve_write(&kp, at("a")), 0);
  struct stat st;
  ck_assert_int_eq(stat(at("a.key"), &st), 0);
  ck_assert_int_eq(st.st_mode & 0777, 0600);
  ck_assert_int_eq(stat(at("a.pub"), &st), 0);
  ck_assert_int_eq(st.st_mode & 0777, 0644);
  ck_assert_int_eq(proto_curve_load(&back, at("a.key")), 0);
  ck_assert_str_eq(back.pub, kp.pub);
  ck_assert_str_eq(back.sec, kp.sec);
  char pub[PROTO_CURVE_Z85];
  ck_assert_int_eq(proto_curve_public(pub, at("a.pub")), 0);
  ck_assert_str_eq(pub, kp.pub);
  ck_assert_int_eq(proto_curve_public(pub, at("a.key")), 0); /* a pair file names its public key too */
  ck_assert_str_eq(pub, kp.pub);
  ck_assert_int_eq(proto_curve_public(pub, kp.pub), 0); /* the key itself */
  ck_assert_int_eq(proto_curve_write(&kp, at("a")), -EEXIST); /* never overwrites a key */
  ck_assert_int_eq(proto_curve_load(&back, at("a.pub")), FR_EFORMAT); /* no secret in it */
  ck_assert(strstr(fr_last_error(), "no secret-key"));
}
END_TEST

START_TEST(test_environment) {
  proto_curve_pair_t kp, got;
  bool found = true;
  ck_assert_int_eq(proto_curve_find(&got, NULL, &found), 0);
  ck_assert(!found);
  ck_assert_int_eq(proto_curve_generate(&kp), 0);
  setenv(PROTO_CURVE_ENV, kp.sec, 1);
  ck_assert_int_eq(proto_curve_find(&got, NULL, &found), 0);
  ck_assert(found);
  ck_assert_str_eq(got.pub, kp.pub);
  setenv(PROTO_CURVE_ENV, "not a key", 1);
  ck_assert_int_eq(proto_curve_find(&got, NULL, &found), FR_EFORMAT);
  ck_assert(strstr(fr_last_error(), PROTO_CURVE_ENV));
  unsetenv(PROTO_CURVE_ENV);
}
END_TEST

/* Z85 keys may hold '#' and '=': comments are whole lines, a bare key is
 * a line that is one key. */
START_TEST(test_files_and_lists) {
  proto_curve_pair_t kp;
  ck_assert_int_eq(proto_curve_generate(&kp), 0);
  for (int i = 0; i < 500 && !strchr(kp.pub, '#') && !strchr(kp.sec, '#'); i++)
    ck_assert_int_eq(proto_curve_generate(&kp), 0);
  ck_assert(strchr(kp.pub, '#') || strchr(kp.sec, '#'));
  char text[512];
  snprintf(text, sizeof text, "  # a comment\n\nsecret-key=%s\n   public-key =  \"%s\"  \n", kp.sec, kp.pub);
  write_text("k", text);
  proto_curve_pair_t back;
  ck_assert_int_eq(proto_curve_load(&back, at("k")), 0);
  ck_assert_str_eq(back.pub, kp.pub);
  proto_curve_pair_t other;
  ck_assert_int_eq(proto_curve_generate(&other), 0);
  snprintf(text, sizeof text, "secret-key = %s\npublic-key = %s\n", kp.sec, other.pub);
  write_text("mismatch", text);
  ck_assert_int_eq(proto_curve_load(&back, at("mismatch")), FR_EFORMAT);
  ck_assert(strstr(fr_last_error(), "does not match"));
  write_text("bad", "# ok\n\npublic-key = tooshort\n");
  ck_assert_int_eq(proto_curve_load(&back, at("bad")), FR_EFORMAT);
  ck_assert_msg(strstr(fr_last_error(), "line 3"), "%s", fr_last_error());
  ck_assert_int_eq(proto_curve_load(&back, at("missing")), -ENOENT);
  /* a list: bare keys and public-key lines, comments and blanks */
  snprintf(text, sizeof text, "# clients\n%s\n\npublic-key = \"%s\"\n", kp.pub, other.pub);
  write_text("list", text);
  uint8_t *keys;
  int n;
  ck_assert_msg(proto_curve_read_list(at("list"), &keys, &n) == 0, "%s", fr_last_error());
  ck_assert_int_eq(n, 2);
  uint8_t raw[32];
  ck_assert_int_eq(proto_curve_decode(raw, other.pub), 0);
  ck_assert(!memcmp(keys + 32, raw, 32));
  free(keys);
  snprintf(text, sizeof text, "%s\nsecret-key = %s\n", kp.pub, kp.sec); /* a secret has no place in a list */
  write_text("list2", text);
  ck_assert_int_eq(proto_curve_read_list(at("list2"), &keys, &n), FR_EFORMAT);
  ck_assert(strstr(fr_last_error(), "line 2"));
  ck_assert_ptr_null(keys);
  write_text("empty", "# nobody\n");
  ck_assert_int_eq(proto_curve_read_list(at("empty"), &keys, &n), 0);
  ck_assert_int_eq(n, 0);
  free(keys);
  char pub[PROTO_CURVE_Z85];
  ck_assert_int_eq(proto_curve_public(pub, "no-such-file-or-key"), -ENOENT);
}
END_TEST

START_TEST(test_endpoints) {
  ck_assert(proto_endpoint_tcp("tcp://0.0.0.0:1"));
  ck_assert(!proto_endpoint_tcp("ipc:///tmp/x"));
  ck_assert(proto_endpoint_loopback("tcp://127.0.0.1:5555"));
  ck_assert(proto_endpoint_loopback("tcp://127.1.2.3:5555"));
  ck_assert(proto_endpoint_loopback("tcp://localhost:5555"));
  ck_assert(proto_endpoint_loopback("tcp://[::1]:5555"));
  ck_assert(!proto_endpoint_loopback("tcp://0.0.0.0:5555"));
  ck_assert(!proto_endpoint_loopback("tcp://*:5555"));
  ck_assert(!proto_endpoint_loopback("tcp://127.0.0.1.example.com:5555"));
  ck_assert(!proto_endpoint_loopback("tcp://10.0.0.1:5555"));
  ck_assert(!proto_endpoint_loopback("ipc:///tmp/x"));
}
END_TEST

/* One message over a CURVE pair of sockets, with the right or a wrong
 * server key (no ZAP handler: CURVE alone, the coordinator adds ZAP). */
static bool curve_talks(const proto_curve_pair_t *srv, const proto_curve_pair_t *cli, const char *server_pub) {
  void *ctx = zmq_ctx_new(), *s = zmq_socket(ctx, ZMQ_PAIR), *c = zmq_socket(ctx, ZMQ_PAIR);
  int zero = 0, tmo = 1500;
  zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
  zmq_setsockopt(c, ZMQ_LINGER, &zero, sizeof zero);
  zmq_setsockopt(s, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
  ck_assert_int_eq(proto_curve_server(s, srv), 0);
  ck_assert_int_eq(zmq_bind(s, "tcp://127.0.0.1:*"), 0);
  char ep[64];
  size_t n = sizeof ep;
  zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, ep, &n);
  ck_assert_int_eq(proto_curve_client(c, cli, server_pub), 0);
  ck_assert_int_eq(zmq_connect(c, ep), 0);
  zmq_send(c, "hi", 2, ZMQ_DONTWAIT);
  char buf[8];
  bool got = zmq_recv(s, buf, sizeof buf, 0) == 2;
  zmq_close(c);
  zmq_close(s);
  zmq_ctx_term(ctx);
  return got;
}

START_TEST(test_sockets) {
  proto_curve_pair_t srv, cli, other;
  ck_assert_int_eq(proto_curve_generate(&srv), 0);
  ck_assert_int_eq(proto_curve_generate(&cli), 0);
  ck_assert_int_eq(proto_curve_generate(&other), 0);
  ck_assert(curve_talks(&srv, &cli, srv.pub));
  ck_assert(!curve_talks(&srv, &cli, other.pub));
  void *ctx = zmq_ctx_new(), *c = zmq_socket(ctx, ZMQ_DEALER);
  ck_assert_int_eq(proto_curve_client(c, &cli, "bad key"), FR_EFORMAT);
  zmq_close(c);
  zmq_ctx_term(ctx);
}
END_TEST

#include "tests/common/test_main.h"

static Suite *curve_suite(void) {
  Suite *s = suite_create("proto_curve");
  TCase *tc = tcase_create("curve");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_keygen_round_trip);
  tcase_add_test(tc, test_environment);
  tcase_add_test(tc, test_files_and_lists);
  tcase_add_test(tc, test_endpoints);
  tcase_add_test(tc, test_sockets);
  suite_add_tcase(s, tc);
  return s;
}

const test_prog_t test_prog = {.suites = {curve_suite}};
