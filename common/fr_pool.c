/* fr_pool.c - fixed thread pool: the caller is thread 0, workers wait on a
 * generation counter (spin ~60 us, then futex sleep).
 *
 * Protocol. The caller publishes fn/arg, sets `pending` to nth-1 and bumps
 * `gen`; workers that see a new generation run their part and decrement
 * `pending`; the caller runs part 0 and then waits for `pending` to reach 0.
 * Futex waits are only issued after a spin; `sleepers`/`caller_sleeps` say
 * whether a wake syscall is needed (all seq_cst, so a sleeper either sees the
 * new value or its waker sees it counted).
 *
 * Parts are claimed: worker i runs part i only if it claims it first; the
 * caller, done with part 0, claims and runs the parts whose workers have not
 * started (asleep or descheduled on a busy machine), so a run never waits for
 * a thread that is not running. Part ith may thus run on another thread, but
 * each part still runs exactly once per run.
 */
#include "fr_pool.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "fr_err.h"
#include "fr_util.h"

#define FR_POOL_SPIN_NS 60000ull /* how long an idle thread spins before sleeping */

typedef struct {
  fr_pool_t *pool;
  int ith;
  pthread_t tid;
  _Alignas(64) atomic_int claimed; /* part ith of the current run is taken */
} fr__pool_worker_t;

struct fr_pool {
  int n_threads;
  fr__pool_worker_t *workers; /* (n_threads - 1) */
  fr_pool_fn fn;
  void *arg;
  _Alignas(64) atomic_int gen;
  atomic_int sleepers;
  atomic_int stop;
  _Alignas(64) atomic_int pending;
  atomic_int caller_sleeps;
};

static void fr__futex_wait(atomic_int *addr, int val) {
  syscall(SYS_futex, (int *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void fr__futex_wake(atomic_int *addr, int n) {
  syscall(SYS_futex, (int *)addr, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

static inline void fr__cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* Spins until *addr != val or the spin budget is spent; returns the last value read. */
static int fr__spin_while_eq(atomic_int *addr, int val) {
  uint64_t t0 = 0;
  for (unsigned i = 1;; i++) {
    int v = atomic_load_explicit(addr, memory_order_acquire);
    if (v != val) return v;
    fr__cpu_relax();
    if ((i & 63) == 0) {
      uint64_t now = fr_now_ns();
      if (t0 == 0) t0 = now;
      else if (now - t0 > FR_POOL_SPIN_NS) return v;
    }
  }
}

/* Spins until *addr is 0 or the spin budget is spent; returns the last value read. */
static int fr__spin_while_ne0(atomic_int *addr) {
  uint64_t t0 = 0;
  for (unsigned i = 1;; i++) {
    int v = atomic_load_explicit(addr, memory_order_acquire);
    if (v == 0) return 0;
    fr__cpu_relax();
    if ((i & 63) == 0) {
      uint64_t now = fr_now_ns();
      if (t0 == 0) t0 = now;
      else if (now - t0 > FR_POOL_SPIN_NS) return v;
    }
  }
}

/* Waits until pool->gen differs from seen; returns the new generation. */
static int fr__wait_gen(fr_pool_t *pool, int seen) {
  int g = fr__spin_while_eq(&pool->gen, seen);
  while (g == seen) {
    atomic_fetch_add(&pool->sleepers, 1);
    if (atomic_load(&pool->gen) == seen) fr__futex_wait(&pool->gen, seen);
    atomic_fetch_sub(&pool->sleepers, 1);
    g = atomic_load_explicit(&pool->gen, memory_order_acquire);
  }
  return g;
}

static void *fr__pool_main(void *p) {
  fr__pool_worker_t *w = p;
  fr_pool_t *pool = w->pool;
  int seen = 0;
  for (;;) {
    seen = fr__wait_gen(pool, seen);
    if (atomic_load(&pool->stop)) break;
    if (atomic_exchange(&w->claimed, 1)) continue; /* the caller ran our part */
    pool->fn(pool->arg, w->ith, pool->n_threads);
    if (atomic_fetch_sub(&pool->pending, 1) == 1 && atomic_load(&pool->caller_sleeps))
      fr__futex_wake(&pool->pending, 1);
  }
  return NULL;
}

static int fr__online_cores(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n < 1 ? 1 : (n > 1024 ? 1024 : (int)n);
}

int fr_pool_create(fr_pool_t **out, int n_threads) {
  *out = NULL;
  if (n_threads <= 0) n_threads = fr__online_cores();
  if (n_threads > 1024) return fr_errorf(-EINVAL, "thread pool: %d threads is too many", n_threads);
  fr_pool_t *pool = fr_malloc_aligned(sizeof *pool);
  memset(pool, 0, sizeof *pool);
  pool->n_threads = n_threads;
  pool->workers = fr_calloc((size_t)n_threads, sizeof *pool->workers);
  int started = 0, err = 0;
  for (int i = 1; i < n_threads; i++, started++) {
    fr__pool_worker_t *w = &pool->workers[i - 1];
    w->pool = pool;
    w->ith = i;
    err = pthread_create(&w->tid, NULL, fr__pool_main, w);
    if (err) break;
  }
  if (err) {
    pool->n_threads = started + 1;
    fr_pool_destroy(pool);
    return fr_errorf(-err, "thread pool: pthread_create failed (%d threads)", n_threads);
  }
  *out = pool;
  return 0;
}

void fr_pool_destroy(fr_pool_t *pool) {
  if (!pool) return;
  atomic_store(&pool->stop, 1);
  atomic_fetch_add(&pool->gen, 1);
  fr__futex_wake(&pool->gen, INT_MAX);
  for (int i = 1; i < pool->n_threads; i++) pthread_join(pool->workers[i - 1].tid, NULL);
  free(pool->workers);
  fr_free_aligned(pool);
}

int fr_pool_size(const fr_pool_t *pool) { return pool->n_threads; }

void fr_pool_run(fr_pool_t *pool, fr_pool_fn fn, void *arg) {
  int nth = pool->n_threads;
  if (nth == 1) {
    fn(arg, 0, 1);
    return;
  }
  pool->fn = fn;
  pool->arg = arg;
  atomic_store(&pool->pending, nth - 1);
  for (int i = 1; i < nth; i++) atomic_store(&pool->workers[i - 1].claimed, 0);
  atomic_fetch_add(&pool->gen, 1); /* seq_cst: publishes fn/arg/pending/claims */
  if (atomic_load(&pool->sleepers) > 0) fr__futex_wake(&pool->gen, INT_MAX);
  fn(arg, 0, nth);
  for (int i = 1; i < nth; i++) /* parts whose worker has not started yet */
    if (!atomic_exchange(&pool->workers[i - 1].claimed, 1)) {
      fn(arg, i, nth);
      atomic_fetch_sub(&pool->pending, 1);
    }
  if (fr__spin_while_ne0(&pool->pending) == 0) return;
  atomic_store(&pool->caller_sleeps, 1);
  int p;
  while ((p = atomic_load(&pool->pending)) != 0) fr__futex_wait(&pool->pending, p);
  atomic_store(&pool->caller_sleeps, 0);
}
