/* cpu_matmul.c - micro-benchmark of the CPU backend's matvec (n = 1), the
 * decode-time hot spot: GB/s of weight bytes streamed for SmolLM2-135M
 * shapes, at 1 and 2 threads. "hot" reuses one weight copy (cache-resident
 * when it fits); "cold" rotates over copies totalling >= 128 MB, as decode
 * streams each layer's weights from memory once per token.
 *
 * With N > 1 activation rows (prefill), also GMAC/s. Shapes: SmolLM2-135M's
 * and Qwen2.5-1.5B's (the K-quants take only the latter: 256-element rows).
 *
 * BENCH_COLD_MB sets the cold set's size (128 by default; a host with a
 * large L3, like the 480 MiB one in docs/bench/cpu-model.md, needs 1024 to
 * measure memory rather than L3).
 *
 * usage: bench_matmul [TYPE (default Q4_1)] [seconds per case (0.3)] [N (1)]
 * FERRUM_CPU_ISA selects the kernel path as usual; FERRUM_CPU_PANELS=0 the
 * row dots. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/fr_util.h"
#include "kernels/kern.h"

static uint64_t g_rng = 12345;
static uint32_t rnd32(void) {
  g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(g_rng >> 33);
}

/* Random bytes with sane f16 fields for every block type. */
static void fill(uint8_t *p, size_t n, kern_type_t t) {
  for (size_t i = 0; i < n; i++) p[i] = (uint8_t)rnd32();
  const kern_type_traits_t *tr = kern_type_traits(t);
  if (!tr->quantized) {
    for (size_t i = 0; i + 1 < n; i += 2) { /* small finite halves/bf16 */
      p[i + 1] &= 0x3b;
    }
    return;
  }
  if (t == KERN_I4G) { /* f32 d and m */
    const float d = 0.01f, m = -0.08f;
    for (size_t b = 0; b + 24 <= n; b += 24) memcpy(p + b, &d, 4), memcpy(p + b + 4, &m, 4);
    return;
  }
  uint16_t h = fr_fp32_to_fp16(0.01f);
  int off = t == KERN_Q6_K ? 208 : 0;
  for (size_t b = 0; b + (size_t)tr->size <= n; b += (size_t)tr->size) {
    memcpy(p + b + off, &h, 2);
    if (t == KERN_Q4_1 || t == KERN_Q5_1 || t == KERN_Q4_K || t == KERN_Q5_K) memcpy(p + b + 2, &h, 2);
  }
}

static kern_type_t parse_type(const char *s) {
  for (int t = 0; t < KERN_TYPE_MAX; t++)
    if (kern_type_traits(t) && !strcmp(kern_type_traits(t)->name, s)) return (kern_type_t)t;
  fprintf(stderr, "unknown type %s\n", s);
  exit(2);
}

static double cpu_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* GB/s by wall time; *cpu_gbs by process CPU time (with 1 thread: immune to
 * being descheduled on a busy machine). */
static double run_case(kern_backend_t *b, kern_weight_t *ws, int n_copies, const float *x, float *y, int n,
                       double secs, double *cpu_gbs, double *gmacs) {
  for (int i = 0; i < 3; i++) b->ops->matmul(b->ctx, y, &ws[i % n_copies], NULL, x, n);
  uint64_t t0 = fr_now_ns(), t;
  double c0 = cpu_seconds();
  long iters = 0;
  do {
    for (int i = 0; i < 8; i++, iters++) b->ops->matmul(b->ctx, y, &ws[iters % n_copies], NULL, x, n);
    t = fr_now_ns();
  } while ((double)(t - t0) < secs * 1e9);
  double bytes = (double)ws[0].rows * (double)ws[0].row_bytes * (double)iters;
  *cpu_gbs = bytes / (cpu_seconds() - c0) / 1e9;
  *gmacs = (double)ws[0].rows * (double)ws[0].cols * n * (double)iters / ((double)(t - t0) / 1e9) / 1e9;
  return bytes / ((double)(t - t0) / 1e9) / 1e9;
}

int main(int argc, char **argv) {
  kern_type_t type = argc > 1 ? parse_type(argv[1]) : KERN_Q4_1;
  double secs = argc > 2 ? atof(argv[2]) : 0.3;
  const int n = argc > 3 ? atoi(argv[3]) : 1;
  const int shapes[6][2] = {{576, 1536}, {1536, 576}, {49152, 576}, {1536, 1536}, {8960, 1536}, {1536, 8960}};
  printf("type %s\n", kern_type_traits(type)->name);
  for (int nt = 1; nt <= 2; nt++) {
    kern_backend_t *b = NULL;
    if (kern_cpu_create(&b, nt) != 0) {
      fprintf(stderr, "kern_cpu_create failed\n");
      return 1;
    }
    for (int s = 0; s < 6; s++) {
      int rows = shapes[s][0], cols = shapes[s][1];
      size_t rb = kern_row_bytes(type, cols), bytes = rb * (size_t)rows;
      if (!rb) continue;
      const char *cold_mb = getenv("BENCH_COLD_MB");
      int copies = (int)(((size_t)(cold_mb ? atoi(cold_mb) : 128) << 20) / bytes) + 1;
      uint8_t *mem = fr_malloc_aligned(bytes * (size_t)copies);
      fill(mem, bytes * (size_t)copies, type);
      kern_weight_t *ws = calloc((size_t)copies, sizeof *ws);
      for (int c = 0; c < copies; c++) {
        ws[c] = (kern_weight_t){.type = type, .rows = rows, .cols = cols, .row_bytes = rb};
        b->ops->weight_load(b->ctx, &ws[c], mem + (size_t)c * bytes);
      }
      float *x = malloc(sizeof(float) * (size_t)cols * (size_t)n), *y = malloc(sizeof(float) * (size_t)rows * n);
      for (size_t i = 0; i < (size_t)cols * (size_t)n; i++) x[i] = (float)rnd32() / 4294967296.0f - 0.5f;
      double hot_cpu, cold_cpu, hot_gmacs, cold_gmacs;
      double hot = run_case(b, ws, 1, x, y, n, secs, &hot_cpu, &hot_gmacs),
             cold = run_case(b, ws, copies, x, y, n, secs, &cold_cpu, &cold_gmacs);
      printf("%-6s threads %d  %5dx%-5d (%6.2f MB) n %d  hot %6.2f GB/s (%7.1f us)  cold %6.2f GB/s (%7.1f us)"
             "  per CPU-second: hot %6.2f cold %6.2f GB/s  GMAC/s hot %.1f cold %.1f\n",
             kern_cpu_isa(b), nt, rows, cols, (double)bytes / 1e6, n, hot, (double)bytes / hot / 1e3, cold,
             (double)bytes / cold / 1e3, hot_cpu, cold_cpu, hot_gmacs, cold_gmacs);
      free(x), free(y), free(ws);
      fr_free_aligned(mem);
    }
    kern_backend_destroy(b);
  }
  return 0;
}
