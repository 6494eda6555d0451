/* metrics.c - lock-free counters, gauges and histograms, rendered as
 * Prometheus text. See metrics.h. */
#include "coordinator/metrics.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define M_MAX_BUCKETS 24

typedef struct {
  const double *bounds; /* (n) upper bounds, ascending; +Inf is implied */
  int n;
  _Atomic uint64_t counts[M_MAX_BUCKETS + 1]; /* per bucket, not cumulative; [n] = +Inf */
  _Atomic uint64_t sum_ns;
} m_hist_t;

/* vLLM's bucket bounds (seconds). */
static const double m_ttft_bounds[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                                       1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
static const double m_itl_bounds[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                      0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
static const double m_e2e_bounds[] = {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,    10.0,  15.0, 20.0,
                                      30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
#define M_COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

struct coord_metrics {
  char *label; /* model_name="..." already escaped */
  _Atomic uint64_t received;
  _Atomic uint64_t finished[COORD_METRICS_FINISH_COUNT];
  _Atomic uint64_t prompt_tokens, generation_tokens;
  _Atomic uint64_t preemptions;
  _Atomic uint64_t nonfinite;
  _Atomic uint64_t forks, fork_shared, fork_copied;
  _Atomic uint64_t prefix_queries, prefix_hits;
  _Atomic uint32_t running, waiting, kv_used, kv_total, ranks, ready;
  _Atomic uint64_t rank_steps[COORD_METRICS_MAX_RANKS], rank_fw_us[COORD_METRICS_MAX_RANKS],
      rank_comm_us[COORD_METRICS_MAX_RANKS], rank_sample_us[COORD_METRICS_MAX_RANKS],
      rank_total_us[COORD_METRICS_MAX_RANKS], rank_mbox[COORD_METRICS_MAX_RANKS];
  _Atomic uint64_t steps, step_rt_ns;
  _Atomic uint64_t http[6]; /* [0] other, [1..5] 1xx..5xx */
  _Atomic uint64_t spec_drafts, spec_draft_tokens, spec_accepted;
  _Atomic uint64_t spec_pos_drafted[COORD_METRICS_SPEC_POS], spec_pos_accepted[COORD_METRICS_SPEC_POS];
  m_hist_t ttft, itl, e2e;
};

static void m_hist_init(m_hist_t *h, const double *bounds, int n) {
  h->bounds = bounds;
  h->n = n;
  for (int i = 0; i <= M_MAX_BUCKETS; i++) atomic_init(&h->counts[i], 0);
  atomic_init(&h->sum_ns, 0);
}

static void m_hist_observe(m_hist_t *h, double s) {
  if (!(s >= 0)) s = 0; /* NaN and negatives count as 0 */
  int i = 0;
  while (i < h->n && s > h->bounds[i]) i++;
  atomic_fetch_add_explicit(&h->counts[i], 1, memory_order_relaxed);
  double ns = s * 1e9;
  atomic_fetch_add_explicit(&h->sum_ns, ns < 1.8e19 ? (uint64_t)ns : UINT64_MAX / 2, memory_order_relaxed);
}

/* Escapes a label value: backslash, double quote and newline. */
static char *m_escape_label(const char *s) {
  size_t n = strlen(s);
  char *o = malloc(2 * n + 1), *p = o;
  if (!o) return NULL;
  for (; *s; s++) {
    if (*s == '\\' || *s == '"') *p++ = '\\', *p++ = *s;
    else if (*s == '\n') *p++ = '\\', *p++ = 'n';
    else *p++ = *s;
  }
  *p = 0;
  return o;
}

int coord_metrics_create(coord_metrics_t **out, const char *model_name) {
  coord_metrics_t *m = calloc(1, sizeof *m);
  if (!m) return -ENOMEM;
  m->label = m_escape_label(model_name ? model_name : "");
  if (!m->label) {
    free(m);
    return -ENOMEM;
  }
  m_hist_init(&m->ttft, m_ttft_bounds, M_COUNT(m_ttft_bounds));
  m_hist_init(&m->itl, m_itl_bounds, M_COUNT(m_itl_bounds));
  m_hist_init(&m->e2e, m_e2e_bounds, M_COUNT(m_e2e_bounds));
  *out = m;
  return 0;
}

void coord_metrics_destroy(coord_metrics_t *m) {
  if (!m) return;
  free(m->label);
  free(m);
}

#define M_ADD(field, v) atomic_fetch_add_explicit(&(field), (v), memory_order_relaxed)
#define M_SET(field, v) atomic_store_explicit(&(field), (v), memory_order_relaxed)
#define M_GET(field) atomic_load_explicit(&(field), memory_order_relaxed)

void coord_metrics_request_start(coord_metrics_t *m) { if (m) M_ADD(m->received, 1); }

void coord_metrics_request_finish(coord_metrics_t *m, coord_metrics_finish_t why) {
  if (!m) return;
  if ((unsigned)why >= COORD_METRICS_FINISH_COUNT) why = COORD_METRICS_FINISH_ABORT;
  M_ADD(m->finished[why], 1);
}

void coord_metrics_tokens(coord_metrics_t *m, uint64_t prompt, uint64_t generation) {
  if (!m) return;
  M_ADD(m->prompt_tokens, prompt);
  M_ADD(m->generation_tokens, generation);
}

void coord_metrics_ttft(coord_metrics_t *m, double s) { if (m) m_hist_observe(&m->ttft, s); }
void coord_metrics_itl(coord_metrics_t *m, double s) { if (m) m_hist_observe(&m->itl, s); }
void coord_metrics_e2e(coord_metrics_t *m, double s) { if (m) m_hist_observe(&m->e2e, s); }
void coord_metrics_preemption(coord_metrics_t *m, uint64_t n) { if (m) M_ADD(m->preemptions, n); }
void coord_metrics_nonfinite(coord_metrics_t *m) { if (m) M_ADD(m->nonfinite, 1); }
void coord_metrics_fork(coord_metrics_t *m, uint64_t seqs, uint64_t shared, uint64_t copied) {
  if (!m) return;
  M_ADD(m->forks, seqs);
  M_ADD(m->fork_shared, shared);
  M_ADD(m->fork_copied, copied);
}

void coord_metrics_prefix(coord_metrics_t *m, uint64_t queries, uint64_t hits) {
  if (!m) return;
  M_ADD(m->prefix_queries, queries);
  M_ADD(m->prefix_hits, hits);
}

void coord_metrics_set_running(coord_metrics_t *m, uint32_t n) { if (m) M_SET(m->running, n); }
void coord_metrics_set_waiting(coord_metrics_t *m, uint32_t n) { if (m) M_SET(m->waiting, n); }

void coord_metrics_set_kv(coord_metrics_t *m, uint32_t used, uint32_t total) {
  if (!m) return;
  M_SET(m->kv_used, used);
  M_SET(m->kv_total, total);
}

void coord_metrics_set_workers(coord_metrics_t *m, uint32_t ranks, uint32_t ready) {
  if (!m) return;
  M_SET(m->ranks, ranks);
  M_SET(m->ready, ready);
}

void coord_metrics_rank_step(coord_metrics_t *m, int rank, const coord_rank_times_t *t) {
  if (!m || rank < 0 || rank >= COORD_METRICS_MAX_RANKS) return;
  M_ADD(m->rank_steps[rank], 1);
  M_ADD(m->rank_fw_us[rank], t->forward_us);
  M_ADD(m->rank_comm_us[rank], t->comm_us);
  M_ADD(m->rank_sample_us[rank], t->sample_us);
  M_ADD(m->rank_total_us[rank], t->total_us);
}

void coord_metrics_rank_mailbox(coord_metrics_t *m, int rank) {
  if (m && rank >= 0 && rank < COORD_METRICS_MAX_RANKS) M_ADD(m->rank_mbox[rank], 1);
}

void coord_metrics_step(coord_metrics_t *m, uint64_t round_trip_ns) {
  if (!m) return;
  M_ADD(m->steps, 1);
  M_ADD(m->step_rt_ns, round_trip_ns);
}

void coord_metrics_http(coord_metrics_t *m, int status) {
  if (!m) return;
  int c = status / 100;
  M_ADD(m->http[c >= 1 && c <= 5 ? c : 0], 1);
}

/* ---- rendering ---- */

typedef struct {
  char *p;
  size_t len, cap;
  bool oom;
} m_out_t;

__attribute__((format(printf, 2, 3))) static void m_printf(m_out_t *o, const char *fmt, ...) {
  if (o->oom) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(o->p + o->len, o->cap - o->len, fmt, ap);
    va_end(ap);
    if (n < 0) {
      o->oom = true;
      return;
    }
    if ((size_t)n < o->cap - o->len) {
      o->len += (size_t)n;
      return;
    }
    size_t cap = o->cap * 2 + (size_t)n + 1;
    char *np = realloc(o->p, cap);
    if (!np) {
      o->oom = true;
      return;
    }
    o->p = np;
    o->cap = cap;
  }
}

static void m_head(m_out_t *o, const char *name, const char *type, const char *help) {
  m_printf(o, "# HELP ferrum:%s %s\n# TYPE ferrum:%s %s\n", name, help, name, type);
}

static void m_counter(m_out_t *o, const coord_metrics_t *m, const char *name, const char *help, uint64_t v) {
  m_head(o, name, "counter", help);
  m_printf(o, "ferrum:%s{model_name=\"%s\"} %llu\n", name, m->label, (unsigned long long)v);
}

static void m_gauge(m_out_t *o, const coord_metrics_t *m, const char *name, const char *help, double v) {
  m_head(o, name, "gauge", help);
  m_printf(o, "ferrum:%s{model_name=\"%s\"} %.17g\n", name, m->label, v);
}

static void m_hist(m_out_t *o, const coord_metrics_t *m, const m_hist_t *h, const char *name, const char *help) {
  m_head(o, name, "histogram", help);
  uint64_t cum = 0;
  for (int i = 0; i <= h->n; i++) {
    cum += atomic_load_explicit(&((m_hist_t *)h)->counts[i], memory_order_relaxed);
    if (i < h->n)
      m_printf(o, "ferrum:%s_bucket{le=\"%g\",model_name=\"%s\"} %llu\n", name, h->bounds[i], m->label,
               (unsigned long long)cum);
    else
      m_printf(o, "ferrum:%s_bucket{le=\"+Inf\",model_name=\"%s\"} %llu\n", name, m->label, (unsigned long long)cum);
  }
  uint64_t ns = atomic_load_explicit(&((m_hist_t *)h)->sum_ns, memory_order_relaxed);
  m_printf(o, "ferrum:%s_sum{model_name=\"%s\"} %llu.%09llu\n", name, m->label, (unsigned long long)(ns / 1000000000u),
           (unsigned long long)(ns % 1000000000u));
  m_printf(o, "ferrum:%s_count{model_name=\"%s\"} %llu\n", name, m->label, (unsigned long long)cum);
}

static void m_render_finish(m_out_t *o, const coord_metrics_t *m) {
  static const char *names[COORD_METRICS_FINISH_COUNT] = {"stop", "length", "abort"};
  m_head(o, "request_success_total", "counter", "Count of finished requests by finish reason.");
  for (int i = 0; i < COORD_METRICS_FINISH_COUNT; i++)
    m_printf(o, "ferrum:request_success_total{finished_reason=\"%s\",model_name=\"%s\"} %llu\n", names[i], m->label,
             (unsigned long long)M_GET(((coord_metrics_t *)m)->finished[i]));
}

static void m_render_http(m_out_t *o, const coord_metrics_t *m) {
  static const char *names[6] = {"other", "1xx", "2xx", "3xx", "4xx", "5xx"};
  m_head(o, "http_requests_total", "counter", "HTTP responses by status class.");
  for (int i = 0; i < 6; i++)
    m_printf(o, "ferrum:http_requests_total{code=\"%s\",model_name=\"%s\"} %llu\n", names[i], m->label,
             (unsigned long long)M_GET(((coord_metrics_t *)m)->http[i]));
}

static void m_render_gauges(m_out_t *o, const coord_metrics_t *m_) {
  coord_metrics_t *m = (coord_metrics_t *)m_;
  uint32_t used = M_GET(m->kv_used), total = M_GET(m->kv_total);
  double perc = total ? (double)used / total : 0.0;
  m_gauge(o, m, "num_requests_running", "Number of requests in model execution batches.", M_GET(m->running));
  m_gauge(o, m, "num_requests_waiting", "Number of requests waiting to be processed.", M_GET(m->waiting));
  m_gauge(o, m, "kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", perc);
  m_gauge(o, m, "gpu_cache_usage_perc", "KV-cache usage (vLLM's older name). 1 means 100 percent usage.", perc);
  m_gauge(o, m, "kv_blocks_used", "KV blocks in use.", used);
  m_gauge(o, m, "kv_blocks_total", "KV blocks in the pool.", total);
  m_gauge(o, m, "tensor_parallel_size", "Tensor-parallel ranks (worker processes).", M_GET(m->ranks));
  m_gauge(o, m, "workers_ready", "Workers loaded and ready.", M_GET(m->ready));
}

/* Per-rank step times: one family per name, a sample per rank that ran a step. */
static void m_render_ranks(m_out_t *o, const coord_metrics_t *m_) {
  coord_metrics_t *m = (coord_metrics_t *)m_;
  static const struct {
    const char *name, *help;
    size_t off;
    bool us;
  } fams[] = {
      {"worker_steps_total", "Steps each rank ran.", offsetof(coord_metrics_t, rank_steps), false},
      {"worker_forward_seconds_total", "Time each rank spent in forward passes.", offsetof(coord_metrics_t, rank_fw_us), true},
      {"worker_all_reduce_seconds_total",
       "Time each rank spent in tensor-parallel all-reduces, as the host saw it (0 on GPUs: inside graphs).",
       offsetof(coord_metrics_t, rank_comm_us), true},
      {"worker_sample_seconds_total", "Time each rank spent sampling (rank 0; the device's wait included).",
       offsetof(coord_metrics_t, rank_sample_us), true},
      {"worker_step_seconds_total", "Time each rank spent on steps, from the descriptor's decode to the result's send.",
       offsetof(coord_metrics_t, rank_total_us), true},
      {"worker_mailbox_results_total",
       "Step results each rank returned through the shared-memory mailbox (the rest came over ZeroMQ).",
       offsetof(coord_metrics_t, rank_mbox), false},
  };
  for (size_t f = 0; f < sizeof fams / sizeof fams[0]; f++) {
    _Atomic uint64_t *v = (_Atomic uint64_t *)((uint8_t *)m + fams[f].off);
    m_head(o, fams[f].name, "counter", fams[f].help);
    for (int r = 0; r < COORD_METRICS_MAX_RANKS; r++) {
      if (!M_GET(m->rank_steps[r])) continue;
      uint64_t x = M_GET(v[r]);
      if (fams[f].us)
        m_printf(o, "ferrum:%s{model_name=\"%s\",rank=\"%d\"} %llu.%06llu\n", fams[f].name, m->label, r,
                 (unsigned long long)(x / 1000000u), (unsigned long long)(x % 1000000u));
      else
        m_printf(o, "ferrum:%s{model_name=\"%s\",rank=\"%d\"} %llu\n", fams[f].name, m->label, r,
                 (unsigned long long)x);
    }
  }
}

static void m_render_spec(m_out_t *o, const coord_metrics_t *m_) {
  coord_metrics_t *m = (coord_metrics_t *)m_;
  m_counter(o, m, "spec_decode_num_drafts_total", "Number of spec decoding drafts.", M_GET(m->spec_drafts));
  m_counter(o, m, "spec_decode_num_draft_tokens_total", "Number of draft tokens.", M_GET(m->spec_draft_tokens));
  m_counter(o, m, "spec_decode_num_accepted_tokens_total", "Number of accepted tokens.", M_GET(m->spec_accepted));
  m_head(o, "spec_decode_num_accepted_tokens_per_pos_total", "counter", "Accepted tokens per draft position.");
  for (int i = 0; i < COORD_METRICS_SPEC_POS && M_GET(m->spec_pos_drafted[i]); i++)
    m_printf(o, "ferrum:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"%s\",position=\"%d\"} %llu\n",
             m->label, i, (unsigned long long)M_GET(m->spec_pos_accepted[i]));
}

void coord_metrics_spec(coord_metrics_t *m, int n_draft, int n_accepted) {
  if (!m || n_draft <= 0) return;
  atomic_fetch_add_explicit(&m->spec_drafts, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&m->spec_draft_tokens, (uint64_t)n_draft, memory_order_relaxed);
  atomic_fetch_add_explicit(&m->spec_accepted, (uint64_t)n_accepted, memory_order_relaxed);
  for (int i = 0; i < n_draft && i < COORD_METRICS_SPEC_POS; i++) {
    atomic_fetch_add_explicit(&m->spec_pos_drafted[i], 1, memory_order_relaxed);
    if (i < n_accepted) atomic_fetch_add_explicit(&m->spec_pos_accepted[i], 1, memory_order_relaxed);
  }
}

static void m_render_counters(m_out_t *o, const coord_metrics_t *m_) {
  coord_metrics_t *m = (coord_metrics_t *)m_;
  m_counter(o, m, "request_received_total", "Number of requests admitted.", M_GET(m->received));
  m_render_finish(o, m);
  m_counter(o, m, "prompt_tokens_total", "Number of prefill tokens processed.", M_GET(m->prompt_tokens));
  m_counter(o, m, "generation_tokens_total", "Number of generation tokens processed.", M_GET(m->generation_tokens));
  m_counter(o, m, "num_preemptions_total", "Cumulative number of preemptions.", M_GET(m->preemptions));
  m_counter(o, m, "nonfinite_logits_total", "Requests ended because the model produced NaN or infinite logits.",
            M_GET(m->nonfinite));
  m_counter(o, m, "forked_sequences_total", "Sequences (n > 1, best_of) started by sharing another's prompt KV.",
            M_GET(m->forks));
  m_counter(o, m, "kv_fork_shared_blocks_total", "Full prompt KV blocks shared by forked sequences, not computed again.",
            M_GET(m->fork_shared));
  m_counter(o, m, "kv_fork_copied_blocks_total", "Partially filled KV blocks copied on write when a sequence forked.",
            M_GET(m->fork_copied));
  m_counter(o, m, "prefix_cache_queries_total", "Prefix cache queries, in tokens.", M_GET(m->prefix_queries));
  m_counter(o, m, "prefix_cache_hits_total", "Prefix cache hits, in tokens.", M_GET(m->prefix_hits));
  m_counter(o, m, "steps_total", "Steps the coordinator sent and got every rank's result for.", M_GET(m->steps));
  m_head(o, "step_round_trip_seconds_total", "counter",
         "Time from each step's send to its last rank's result, as the coordinator saw it.");
  m_printf(o, "ferrum:step_round_trip_seconds_total{model_name=\"%s\"} %.6f\n", m->label,
           (double)M_GET(m->step_rt_ns) / 1e9);
  m_render_http(o, m);
  m_render_spec(o, m);
}

int coord_metrics_render(const coord_metrics_t *m, char **out, size_t *len) {
  m_out_t o = {.p = malloc(8192), .cap = 8192};
  if (!o.p) return -ENOMEM;
  o.p[0] = 0;
  m_render_gauges(&o, m);
  m_render_counters(&o, m);
  m_render_ranks(&o, m);
  m_hist(&o, m, &m->ttft, "time_to_first_token_seconds", "Histogram of time to first token in seconds.");
  m_hist(&o, m, &m->itl, "inter_token_latency_seconds", "Histogram of inter-token latency in seconds.");
  m_hist(&o, m, &m->itl, "time_per_output_token_seconds", "Histogram of time per output token in seconds.");
  m_hist(&o, m, &m->e2e, "e2e_request_latency_seconds", "Histogram of end-to-end request latency in seconds.");
  if (o.oom) {
    free(o.p);
    return -ENOMEM;
  }
  *out = o.p;
  *len = o.len;
  return 0;
}
