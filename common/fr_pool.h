/* fr_pool.h - a fixed thread pool for data-parallel kernels.
 *
 * fr_pool_run(pool, fn, arg) calls fn(arg, ith, nth) once for each part
 * ith in [0, nth) and returns when all have finished, like ggml's compute
 * threads. The caller runs part 0; worker i runs part i unless it has not
 * started by the time the caller is done, in which case the caller runs it
 * (so a descheduled worker never stalls a run). Parts must therefore not
 * assume which OS thread runs them, only that no two run the same ith at
 * once. Workers spin briefly (~60 us), then sleep on a futex, between runs,
 * so back-to-back small ops stay cheap. One caller at a time.
 */
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fr_pool fr_pool_t;
typedef void (*fr_pool_fn)(void *arg, int ith, int nth);

/* n_threads <= 0 means one per online core. */
int fr_pool_create(fr_pool_t **out, int n_threads);
void fr_pool_destroy(fr_pool_t *pool);
int fr_pool_size(const fr_pool_t *pool);
void fr_pool_run(fr_pool_t *pool, fr_pool_fn fn, void *arg);

/* Splits [0, n) into nth nearly equal parts; part ith is [*lo, *hi). */
static inline void fr_pool_split(long n, int ith, int nth, long *lo, long *hi) {
  long q = n / nth, r = n % nth;
  *lo = ith * q + (ith < r ? ith : r);
  *hi = *lo + q + (ith < r ? 1 : 0);
}

#ifdef __cplusplus
}
#endif
