/* ipc_rtt.c - round trip between two processes: ZeroMQ ROUTER/DEALER over
 * ipc:// (both sides busy-polling with ZMQ_DONTWAIT) and a shared-memory
 * mailbox (both sides spinning on a sequence number). */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}
static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}
static void report(const char *what, size_t bytes, uint64_t *t, int n) {
  qsort(t, (size_t)n, sizeof *t, cmp_u64);
  printf("%-34s %6zu B  p50 %7.1f us  p90 %7.1f us  p99 %7.1f us\n", what, bytes, t[n / 2] / 1e3, t[n * 9 / 10] / 1e3,
         t[n * 99 / 100] / 1e3);
}

static void zmq_case(size_t bytes, int n, int spin) {
  char addr[64];
  snprintf(addr, sizeof addr, "ipc:///tmp/ipc_rtt_%d", (int)getpid());
  pid_t pid = fork();
  if (pid == 0) { /* the worker: DEALER, echoes */
    void *ctx = zmq_ctx_new(), *s = zmq_socket(ctx, ZMQ_DEALER);
    zmq_connect(s, addr);
    char *buf = malloc(bytes + 1);
    zmq_send(s, "hi", 2, 0);
    for (int i = 0; i < n; i++) {
      int r;
      while ((r = zmq_recv(s, buf, bytes, spin ? ZMQ_DONTWAIT : 0)) < 0) {}
      zmq_send(s, buf, (size_t)r, 0);
    }
    zmq_close(s);
    zmq_ctx_term(ctx);
    _exit(0);
  }
  void *ctx = zmq_ctx_new(), *s = zmq_socket(ctx, ZMQ_ROUTER);
  zmq_bind(s, addr);
  char id[256], tmp[16];
  int idn = zmq_recv(s, id, sizeof id, 0);
  zmq_recv(s, tmp, sizeof tmp, 0);
  char *buf = calloc(1, bytes + 1);
  uint64_t *t = malloc(sizeof(uint64_t) * (size_t)n);
  for (int i = 0; i < n; i++) {
    uint64_t t0 = now_ns();
    zmq_send(s, id, (size_t)idn, ZMQ_SNDMORE);
    zmq_send(s, buf, bytes, 0);
    while (zmq_recv(s, id, sizeof id, spin ? ZMQ_DONTWAIT : 0) < 0) {}
    while (zmq_recv(s, buf, bytes, spin ? ZMQ_DONTWAIT : 0) < 0) {}
    t[i] = now_ns() - t0;
  }
  waitpid(pid, NULL, 0);
  report(spin ? "zmq ROUTER/DEALER ipc, busy poll" : "zmq ROUTER/DEALER ipc, blocking", bytes, t + n / 10, n - n / 10);
  zmq_close(s);
  zmq_ctx_term(ctx);
  unlink(addr + 6);
  free(t);
  free(buf);
}

typedef struct {
  _Atomic uint64_t req, rsp;
  char data[1 << 20];
} box_t;

static void shm_case(size_t bytes, int n) {
  box_t *b = mmap(NULL, sizeof *b, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  atomic_store(&b->req, 0);
  atomic_store(&b->rsp, 0);
  char *buf = calloc(1, bytes + 1);
  pid_t pid = fork();
  if (pid == 0) {
    for (uint64_t i = 1; i <= (uint64_t)n; i++) {
      while (atomic_load_explicit(&b->req, memory_order_acquire) != i) {}
      memcpy(buf, b->data, bytes);
      memcpy(b->data, buf, bytes);
      atomic_store_explicit(&b->rsp, i, memory_order_release);
    }
    _exit(0);
  }
  uint64_t *t = malloc(sizeof(uint64_t) * (size_t)n);
  for (uint64_t i = 1; i <= (uint64_t)n; i++) {
    uint64_t t0 = now_ns();
    memcpy(b->data, buf, bytes);
    atomic_store_explicit(&b->req, i, memory_order_release);
    while (atomic_load_explicit(&b->rsp, memory_order_acquire) != i) {}
    memcpy(buf, b->data, bytes);
    t[i - 1] = now_ns() - t0;
  }
  waitpid(pid, NULL, 0);
  report("shared-memory mailbox, spinning", bytes, t + n / 10, n - n / 10);
  free(t);
  free(buf);
  munmap(b, sizeof *b);
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 20000;
  size_t sizes[] = {256, 4096};
  for (int k = 0; k < 2; k++) {
    zmq_case(sizes[k], n, 1);
    zmq_case(sizes[k], n / 4, 0);
    shm_case(sizes[k], n);
  }
  return 0;
}
