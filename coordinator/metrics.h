/* metrics.h - the engine's metrics registry and its Prometheus text form
 * (what GET /metrics answers). Names follow vLLM's under a "ferrum:" prefix
 * (vllm:num_requests_running -> ferrum:num_requests_running), each series
 * labelled model_name="<served name>".
 *
 * Threads: every update and the render are lock-free (C11 atomics), so the
 * coordinator loop updates while HTTP threads render. A render may see one
 * histogram observation counted and its sum not yet added (Prometheus
 * tolerates that). Ownership: the registry is the creator's.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct coord_metrics coord_metrics_t;

/* Finish reasons counted by coord_metrics_request_finish (the label
 * finished_reason of ferrum:request_success_total; vLLM's values). */
typedef enum {
  COORD_METRICS_FINISH_STOP = 0, /* "stop" */
  COORD_METRICS_FINISH_LENGTH,   /* "length" */
  COORD_METRICS_FINISH_ABORT,    /* "abort": canceled, disconnected, error */
  COORD_METRICS_FINISH_COUNT
} coord_metrics_finish_t;

/* Creates a registry with every counter at zero; model_name (copied) is the
 * model_name label. Returns 0 or -ENOMEM. */
int coord_metrics_create(coord_metrics_t **out, const char *model_name);
void coord_metrics_destroy(coord_metrics_t *m); /* NULL is fine */

/* A job was admitted to the queue (ferrum:request_received_total). */
void coord_metrics_request_start(coord_metrics_t *m);
/* A job ended (ferrum:request_success_total{finished_reason}). */
void coord_metrics_request_finish(coord_metrics_t *m, coord_metrics_finish_t why);
/* Adds prompt tokens computed or cached for an admitted job
 * (ferrum:prompt_tokens_total) and generated tokens
 * (ferrum:generation_tokens_total). Call as they happen, per step. */
void coord_metrics_tokens(coord_metrics_t *m, uint64_t prompt, uint64_t generation);
/* Latency observations in seconds: time to first token
 * (ferrum:time_to_first_token_seconds), each inter-token gap
 * (ferrum:inter_token_latency_seconds, also exported as vLLM's older
 * ferrum:time_per_output_token_seconds), end-to-end per finished job
 * (ferrum:e2e_request_latency_seconds). */
void coord_metrics_ttft(coord_metrics_t *m, double seconds);
void coord_metrics_itl(coord_metrics_t *m, double seconds);
void coord_metrics_e2e(coord_metrics_t *m, double seconds);
/* n sequences were preempted (ferrum:num_preemptions_total). */
/* One request ended because the model produced NaN or infinite logits. */
void coord_metrics_nonfinite(coord_metrics_t *m);
void coord_metrics_preemption(coord_metrics_t *m, uint64_t n);
/* Sequences forked from another's prompt (n > 1, best_of): how many
 * (ferrum:forked_sequences_total), the full KV blocks they share instead of
 * computing (ferrum:kv_fork_shared_blocks_total) and the partial last
 * blocks copied on write (ferrum:kv_fork_copied_blocks_total). */
void coord_metrics_fork(coord_metrics_t *m, uint64_t seqs, uint64_t shared, uint64_t copied);
/* Prefix cache lookups, in tokens as vLLM counts them: queries = prompt
 * tokens looked up, hits = tokens found (ferrum:prefix_cache_queries_total,
 * ferrum:prefix_cache_hits_total). */
void coord_metrics_prefix(coord_metrics_t *m, uint64_t queries, uint64_t hits);
/* Gauges, set each scheduler iteration: sequences running, waiting in the
 * queue (ferrum:num_requests_running / _waiting), KV blocks used of total
 * (ferrum:kv_cache_usage_perc in [0, 1], vLLM's gpu_cache_usage_perc too,
 * and ferrum:kv_blocks_used / ferrum:kv_blocks_total). */
void coord_metrics_set_running(coord_metrics_t *m, uint32_t n);
void coord_metrics_set_waiting(coord_metrics_t *m, uint32_t n);
void coord_metrics_set_kv(coord_metrics_t *m, uint32_t used_blocks, uint32_t total_blocks);
/* Workers: tensor-parallel ranks and how many are ready
 * (ferrum:tensor_parallel_size, ferrum:workers_ready), set with the gauges;
 * each rank's time per step, from its results: the forward pass and, of
 * it, the all-reduces as the host saw them (ferrum:worker_forward_seconds_total
 * {rank}, ferrum:worker_all_reduce_seconds_total{rank}; the latter stays 0
 * on GPUs, where they run inside the step's graph), sampling
 * (ferrum:worker_sample_seconds_total{rank}) and the whole step from the
 * descriptor's decode to the result's send (ferrum:worker_step_seconds_total
 * {rank}), steps counted in ferrum:worker_steps_total{rank}. Ranks past
 * COORD_METRICS_MAX_RANKS are not counted. */
#define COORD_METRICS_MAX_RANKS 16
void coord_metrics_set_workers(coord_metrics_t *m, uint32_t ranks, uint32_t ready);
typedef struct {
  uint64_t forward_us, comm_us, sample_us, total_us;
} coord_rank_times_t;
void coord_metrics_rank_step(coord_metrics_t *m, int rank, const coord_rank_times_t *t);
/* A rank's step result came through the shared-memory mailbox
 * (ferrum:worker_mailbox_results_total). */
void coord_metrics_rank_mailbox(coord_metrics_t *m, int rank);
/* The coordinator's view of one step: from its send to the last rank's
 * result (ferrum:step_round_trip_seconds_total, ferrum:steps_total).
 * Round trip minus the ranks' step time is the transport's share; the wall
 * time between steps minus the round trip is the coordinator's. */
void coord_metrics_step(coord_metrics_t *m, uint64_t round_trip_ns);
/* Speculative decoding, vLLM's counters: one draft of n_draft proposed
 * tokens was verified and its first n_accepted were accepted
 * (ferrum:spec_decode_num_drafts_total, _num_draft_tokens_total,
 * _num_accepted_tokens_total, and _num_accepted_tokens_per_pos_total
 * {position} for the positions of the drafts so far, 0-based). Positions
 * past COORD_METRICS_SPEC_POS are counted in the totals only. */
#define COORD_METRICS_SPEC_POS 32
void coord_metrics_spec(coord_metrics_t *m, int n_draft, int n_accepted);
/* HTTP responses by status class, counted by the frontend
 * (ferrum:http_requests_total{code="2xx"...}). */
void coord_metrics_http(coord_metrics_t *m, int status);

/* Renders the Prometheus text exposition (format 0.0.4) into a malloc'd
 * NUL-terminated string (*out, *len without the NUL; caller frees).
 * Returns 0 or -ENOMEM. */
int coord_metrics_render(const coord_metrics_t *m, char **out, size_t *len);

#ifdef __cplusplus
}
#endif
