/* test_http_streams.c - HTTP streams of a real `ferrumctl serve` (SmolLM2
 * on a CPU worker) that wait or are drained:
 *   - a stream whose worker hangs mid-stream (SIGSTOP; the coordinator
 *     replaces it after about 5 s) gets SSE keep-alive comments meanwhile,
 *     then every token (the text an undisturbed run gives), its
 *     finish_reason and [DONE];
 *   - SIGTERM or `ferrumctl stop` under 24 streams ends every one of them
 *     with its finish_reason chunk and [DONE] (four times: a lost last
 *     chunk was a race, about one stream in 48);
 *   - with 300 slow-loris sockets and 2000 idle kept-alive connections
 *     open, /health answers at once, a completion streams to its end, and
 *     the server holds them all with a handful of threads.
 * A test program of its own, with a plain main(). */
#include <check.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <jansson.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "ctl/http_client.h"
#include "tests/engine/engine_fx.h"

/* One streamed request and what came back. */
typedef struct {
  int port;
  char body[512];
  /* filled by stream_run */
  atomic_int n_data;        /* data chunks so far (JSON ones) */
  int status, n_keepalive;  /* keep-alive comment lines */
  int gap_keepalives;       /* keep-alives in the longest wait between two data chunks */
  double gap_s;             /* that wait */
  char finish[32];          /* the last finish_reason seen */
  long completion_tokens;   /* from the usage chunk; -1 none */
  bool error, done, cut;    /* an error chunk; [DONE]; the body ended early */
  char text[8192];
  size_t text_len;
} stream_t;

static void stream_init(stream_t *s, int port, const char *prompt, int max_tokens) {
  memset(s, 0, sizeof *s);
  s->port = port;
  s->completion_tokens = -1;
  snprintf(s->body, sizeof s->body,
           "{\"prompt\":\"%s\",\"max_tokens\":%d,\"temperature\":0,\"ignore_eos\":true,\"stream\":true,"
           "\"stream_options\":{\"include_usage\":true}}",
           prompt, max_tokens);
}

/* One JSON data chunk. */
static void stream_chunk(stream_t *s, const char *data) {
  json_t *j = json_loads(data, 0, NULL);
  if (!j) {
    s->error = true;
    return;
  }
  if (json_object_get(j, "error")) s->error = true;
  json_t *c = json_array_get(json_object_get(j, "choices"), 0);
  const char *t = json_string_value(json_object_get(c, "text"));
  size_t n = t ? strlen(t) : 0;
  if (n && s->text_len + n < sizeof s->text) memcpy(s->text + s->text_len, t, n), s->text_len += n;
  const char *f = json_string_value(json_object_get(c, "finish_reason"));
  if (f) snprintf(s->finish, sizeof s->finish, "%s", f);
  json_t *u = json_object_get(j, "usage");
  if (json_is_object(u)) s->completion_tokens = (long)json_integer_value(json_object_get(u, "completion_tokens"));
  json_decref(j);
  atomic_fetch_add(&s->n_data, 1);
}

/* One SSE line; last_ns / since are the time of the last data chunk and
 * the keep-alives after it. */
static void stream_line(stream_t *s, const char *line, uint64_t *last_ns, int *since) {
  if (!strcmp(line, ": keep-alive")) {
    s->n_keepalive++, (*since)++;
    return;
  }
  if (strncmp(line, "data: ", 6)) return;
  if (!strcmp(line + 6, "[DONE]")) {
    s->done = true;
    return;
  }
  uint64_t now = fr_now_ns();
  if (*last_ns && (double)(now - *last_ns) / 1e9 > s->gap_s) s->gap_s = (double)(now - *last_ns) / 1e9, s->gap_keepalives = *since;
  *last_ns = now, *since = 0;
  stream_chunk(s, line + 6);
}

/* Sends the request and reads the whole stream (each read waits 60 s at
 * most; 4 MiB at most). */
static void *stream_run(void *arg) {
  stream_t *s = arg;
  cli_http_t c;
  char line[65536], buf[4096];
  size_t n = 0, total = 0;
  uint64_t last_ns = 0;
  int since = 0;
  s->cut = true;
  if (cli_http_connect(&c, "127.0.0.1", s->port, 60000)) return NULL;
  if (cli_http_send(&c, "POST", "/v1/completions", NULL, s->body, strlen(s->body)) == 0) s->status = c.status;
  for (long r; s->status == 200 && total < (4u << 20) && (r = cli_http_read(&c, buf, sizeof buf)) >= 0; total += (size_t)r) {
    if (r == 0) {
      s->cut = false; /* the body's end */
      break;
    }
    for (long i = 0; i < r; i++) {
      if (buf[i] != '\n') {
        if (n + 1 < sizeof line) line[n++] = buf[i];
        continue;
      }
      line[n] = 0;
      stream_line(s, line, &last_ns, &since);
      n = 0;
    }
  }
  cli_http_close(&c);
  return NULL;
}

/* The HTTP port from the server's pid file (its 4th line), once /health
 * answers (10 s at most). */
static int http_port(const efx_server_t *s) {
  char path[600], line[600];
  for (int i = 0; i < 200; i++) {
    int port = 0;
    snprintf(path, sizeof path, "%s/ferrum", s->dir);
    DIR *d = opendir(path);
    struct dirent *e;
    while (d && (e = readdir(d)))
      if (!strncmp(e->d_name, "server-", 7) && strstr(e->d_name, ".pid")) {
        snprintf(path, sizeof path, "%s/ferrum/%s", s->dir, e->d_name);
        FILE *f = fopen(path, "r");
        for (int k = 0; f && k < 4 && fgets(line, sizeof line, f); k++) {
          const char *colon = k == 3 ? strrchr(line, ':') : NULL;
          if (colon) port = atoi(colon + 1);
        }
        if (f) fclose(f);
      }
    if (d) closedir(d);
    cli_http_t c;
    if (port > 0 && cli_http_connect(&c, "127.0.0.1", port, 2000) == 0) {
      int ok = cli_http_send(&c, "GET", "/health", NULL, NULL, 0) == 0 && c.status == 200;
      cli_http_close(&c);
      if (ok) return port;
    }
    usleep(50000);
  }
  ck_abort_msg("no HTTP frontend in %s", s->dir);
  return -1;
}

/* Waits until every stream has count data chunks (ms at most). */
static void wait_data(stream_t *st, int n, int count, int ms) {
  for (int t = 0; t < ms / 10; t++) {
    int ready = 0;
    for (int i = 0; i < n; i++) ready += atomic_load(&st[i].n_data) >= count;
    if (ready == n) return;
    usleep(10000);
  }
  ck_abort_msg("the streams did not start within %d ms", ms);
}

static void check_complete(const stream_t *s, int i, long max_tokens) {
  ck_assert_msg(s->status == 200, "stream %d: status %d", i, s->status);
  ck_assert_msg(!s->cut, "stream %d was cut after %d chunks", i, atomic_load(&s->n_data));
  ck_assert_msg(!s->error, "stream %d got an error chunk", i);
  ck_assert_msg(!strcmp(s->finish, "length"), "stream %d: finish_reason '%s'", i, s->finish);
  ck_assert_msg(s->done, "stream %d: no [DONE]", i);
  ck_assert_msg(s->completion_tokens == max_tokens, "stream %d: %ld tokens", i, s->completion_tokens);
}

/* The text of a request that nothing disturbs, not streamed. */
static void reference_text(int port, const stream_t *like, char *out, size_t cap) {
  char body[512];
  snprintf(body, sizeof body, "%s", like->body);
  char *p = strstr(body, ",\"stream\":true,\"stream_options\":{\"include_usage\":true}");
  ck_assert_ptr_nonnull(p);
  strcpy(p, "}");
  cli_http_t c;
  ck_assert_int_eq(cli_http_connect(&c, "127.0.0.1", port, 60000), 0);
  ck_assert_int_eq(cli_http_send(&c, "POST", "/v1/completions", NULL, body, strlen(body)), 0);
  ck_assert_int_eq(c.status, 200);
  char *b;
  ck_assert_int_eq(cli_http_read_all(&c, 1 << 20, &b, NULL), 0);
  cli_http_close(&c);
  json_t *j = json_loads(b, 0, NULL);
  ck_assert_ptr_nonnull(j);
  const char *t = json_string_value(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text"));
  snprintf(out, cap, "%s", t ? t : "");
  json_decref(j);
  free(b);
}

#define HUNG_TOKENS 64

START_TEST(test_stream_survives_hung_worker) {
  efx_server_t s;
  efx_opts_t o = {.http = true};
  const char *const extra[] = {"--sse-keepalive", "1", NULL};
  ck_assert_int_eq(efx_start_opts(&s, &o, extra), 0);
  int port = http_port(&s);
  stream_t st;
  stream_init(&st, port, "Once upon a time, in a small village,", HUNG_TOKENS);
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, stream_run, &st), 0);
  wait_data(&st, 1, 3, 120000);
  pid_t w[4];
  ck_assert_int_eq(efx_worker_pids(&s, w, 4), 1);
  ck_assert_int_eq(kill(w[0], SIGSTOP), 0); /* the coordinator kills and replaces it */
  pthread_join(th, NULL);
  fprintf(stderr, "hung worker: the stream waited %.1f s, %d keep-alives meanwhile\n", st.gap_s, st.gap_keepalives);
  check_complete(&st, 0, HUNG_TOKENS);
  ck_assert_msg(st.gap_s > 3, "the stream never waited (%.1f s): the worker was not stopped in time", st.gap_s);
  ck_assert_msg(st.gap_keepalives >= 3, "%d keep-alives in %.1f s", st.gap_keepalives, st.gap_s);
  char ref[8192];
  reference_text(port, &st, ref, sizeof ref);
  ck_assert_msg(st.text_len == strlen(ref) && !memcmp(st.text, ref, st.text_len), "text '%.*s', alone '%s'",
                (int)st.text_len, st.text, ref);
  ck_assert_int_eq(efx_stop(&s, false), 0);
  ck_assert_int_eq(efx_shm_count(&s), 0);
}
END_TEST

#define DRAIN_STREAMS 24
#define DRAIN_TOKENS 32

static const char *const drain_prompts[] = {
    "The capital of France is", "Once upon a time,", "def fibonacci(n):", "The three primary colors are",
    "Water boils at", "In 1492,", "The quick brown fox", "My favourite language is",
};

/* 24 streams, then SIGTERM (cli: `ferrumctl stop`) while they run: each
 * one ends with its last chunk (finish_reason "length"), the usage chunk
 * and [DONE], and the server exits cleanly. */
static void drain_round(bool cli) {
  efx_server_t s;
  efx_opts_t o = {.http = true};
  ck_assert_int_eq(efx_start_opts(&s, &o, NULL), 0);
  int port = http_port(&s);
  static stream_t st[DRAIN_STREAMS];
  pthread_t th[DRAIN_STREAMS];
  for (int i = 0; i < DRAIN_STREAMS; i++) {
    stream_init(&st[i], port, drain_prompts[i % 8], DRAIN_TOKENS);
    ck_assert_int_eq(pthread_create(&th[i], NULL, stream_run, &st[i]), 0);
  }
  wait_data(st, DRAIN_STREAMS, 1, 120000);
  ck_assert_int_eq(efx_stop(&s, cli), 0); /* returns once the server exited */
  for (int i = 0; i < DRAIN_STREAMS; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < DRAIN_STREAMS; i++) check_complete(&st[i], i, DRAIN_TOKENS);
  ck_assert_int_eq(efx_shm_count(&s), 0);
}

START_TEST(test_drain_ends_every_stream) {
  for (int round = 0; round < 4; round++) drain_round(round % 2 == 1);
}
END_TEST

#define LORIS 300       /* sockets that send one header byte every LORIS_EVERY_MS */
#define LORIS_EVERY_MS 2000
#define IDLE 2000       /* kept-alive connections, idle after one answer each */
#define IDLE_ADDRS 8    /* their source addresses (127.0.0.10...): each stays under the per-address cap */
#define CROWD_THREADS 64

/* A connection from 127.0.0.src to port; -1 when it fails. */
static int crowd_connect(int port, unsigned src) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_in me = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000000u | src)};
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(0x7f000001)};
  if (bind(fd, (struct sockaddr *)&me, sizeof me) || connect(fd, (struct sockaddr *)&a, sizeof a)) {
    close(fd);
    return -1;
  }
  return fd;
}

/* Sends GET /health on fd (kept alive) and reads the answer's head, 5 s at
 * most; returns the status or 0. */
static int crowd_health(int fd) {
  static const char req[] = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  if (send(fd, req, sizeof req - 1, MSG_NOSIGNAL) != (ssize_t)(sizeof req - 1)) return 0;
  char buf[1024];
  size_t n = 0;
  for (int i = 0; i < 50 && n < sizeof buf - 1; i++) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 100) != 1) continue;
    ssize_t r = read(fd, buf + n, sizeof buf - 1 - n);
    if (r <= 0) return 0;
    n += (size_t)r;
    buf[n] = 0;
    if (strstr(buf, "\r\n\r\n")) break; /* /health's body is empty */
  }
  buf[n] = 0;
  int st = 0;
  return sscanf(buf, "HTTP/1.1 %d", &st) == 1 ? st : 0;
}

/* /health on a new connection: the status, and the seconds it took. */
static int crowd_fresh_health(int port, double *secs) {
  uint64_t t0 = fr_now_ns();
  int fd = crowd_connect(port, 1), st = fd >= 0 ? crowd_health(fd) : 0;
  *secs = (double)(fr_now_ns() - t0) / 1e9;
  if (fd >= 0) close(fd);
  return st;
}

/* The next byte of a slow-loris request on each socket; false when one
 * was closed. */
static bool loris_step(const int *fds, int n, int *sent) {
  static const char req[] = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow-Loris: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
  bool ok = true;
  for (int i = 0; i < n; i++) ok &= send(fds[i], req + (*sent % (int)(sizeof req - 1)), 1, MSG_NOSIGNAL) == 1;
  (*sent)++;
  return ok;
}

/* A field of /proc/<pid>/status ("Threads:"), or -1. */
static long proc_status(pid_t pid, const char *key) {
  char path[64], line[256];
  long v = -1;
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, key, strlen(key))) v = atol(line + strlen(key));
  if (f) fclose(f);
  return v;
}

/* Open descriptors of pid. */
static int proc_fds(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
  DIR *d = opendir(path);
  int n = 0;
  for (struct dirent *e; d && (e = readdir(d));) n += e->d_name[0] != '.';
  if (d) closedir(d);
  return n;
}

/* 300 slow-loris sockets (a header byte every 2 s, never a whole request)
 * and 2000 kept-alive connections, idle after one /health each, held at
 * once: /health still answers within a second, a completion streams to its
 * finish_reason and [DONE], the server holds every connection (its
 * descriptors) with fewer than 64 threads, and none of them is dropped. */
START_TEST(test_many_idle_connections) {
  struct rlimit rl;
  ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
  rl.rlim_cur = rl.rlim_max; /* the test holds every client socket */
  ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
  ck_assert_msg(rl.rlim_cur >= LORIS + IDLE + 256, "ulimit -Hn %llu is too low", (unsigned long long)rl.rlim_cur);
  efx_server_t s;
  efx_opts_t o = {.http = true};
  ck_assert_int_eq(efx_start_opts(&s, &o, NULL), 0);
  int port = http_port(&s);
  long threads0 = proc_status(s.pid, "Threads:");
  static int loris[LORIS], idle[IDLE];
  int sent = 0;
  for (int i = 0; i < LORIS; i++) ck_assert_int_ge(loris[i] = crowd_connect(port, 2), 0);
  ck_assert(loris_step(loris, LORIS, &sent));
  uint64_t next_loris = fr_now_ns() + LORIS_EVERY_MS * 1000000ull;
  for (int i = 0; i < IDLE; i++) {
    ck_assert_int_ge(idle[i] = crowd_connect(port, 10 + (unsigned)(i % IDLE_ADDRS)), 0);
    ck_assert_msg(crowd_health(idle[i]) == 200, "idle connection %d: no answer", i);
  }
  ck_assert(loris_step(loris, LORIS, &sent));
  double secs;
  for (int i = 0; i < 3; i++) {
    ck_assert_int_eq(crowd_fresh_health(port, &secs), 200);
    ck_assert_msg(secs < 1.0, "/health took %.2f s beside %d connections", secs, LORIS + IDLE);
  }
  stream_t st;
  stream_init(&st, port, "Once upon a time,", 16);
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, stream_run, &st), 0);
  /* the slow clients go on while it streams (120 s at most) */
  for (int i = 0; i < 1200 && atomic_load(&st.n_data) < 17 && !st.done; i++) {
    usleep(100 * 1000);
    if (fr_now_ns() >= next_loris) {
      ck_assert_msg(loris_step(loris, LORIS, &sent), "a slow-loris socket was closed early");
      next_loris = fr_now_ns() + LORIS_EVERY_MS * 1000000ull;
    }
  }
  pthread_join(th, NULL);
  check_complete(&st, 0, 16);
  long threads = proc_status(s.pid, "Threads:");
  int fds = proc_fds(s.pid);
  fprintf(stderr, "crowd: %d connections held, server threads %ld (%ld before), %d descriptors, /health %.3f s\n",
          LORIS + IDLE, threads, threads0, fds, secs);
  ck_assert_msg(threads > 0 && threads < CROWD_THREADS, "the server runs %ld threads", threads);
  ck_assert_msg(fds > LORIS + IDLE, "the server holds %d descriptors: connections were dropped", fds);
  ck_assert_int_eq(crowd_fresh_health(port, &secs), 200);
  ck_assert_msg(secs < 1.0, "/health took %.2f s after the stream", secs);
  for (int i = 0; i < IDLE; i += 97) ck_assert_msg(crowd_health(idle[i]) == 200, "idle connection %d was dropped", i);
  ck_assert(loris_step(loris, LORIS, &sent));
  for (int i = 0; i < LORIS; i++) close(loris[i]);
  for (int i = 0; i < IDLE; i++) close(idle[i]);
  ck_assert_int_eq(efx_stop(&s, false), 0);
}
END_TEST

static Suite *http_streams_suite(void) {
  Suite *s = suite_create("http_streams");
  TCase *t = tcase_create("e2e");
  tcase_set_timeout(t, 240);
  tcase_add_test(t, test_stream_survives_hung_worker);
  tcase_add_test(t, test_drain_ends_every_stream);
  tcase_add_test(t, test_many_idle_connections);
  suite_add_tcase(s, t);
  return s;
}

#include "tests/common/test_main.h"

static int http_streams_setup(int argc, char **argv) {
  if (access(efx_model(), R_OK) != 0) {
    fprintf(stderr, "skip: no model at %s\n", efx_model());
    return TEST_SKIP;
  }
  return 0;
}

const test_prog_t test_prog = {.suites = {http_streams_suite}, .setup = http_streams_setup};
