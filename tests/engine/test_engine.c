/* test_engine.c - the engine end to end: real `ferrumctl serve` processes
 * (coordinator + ferrum-worker) with the real SmolLM2 model, driven over
 * RPC: batching and preemption give the tokens each request gets alone,
 * chunked prefill, priorities, the prefix cache, cancels and disconnects,
 * relative model paths and finding a server, the KV pool's size.
 * test_faults.c (worker deaths, hangs, NaN logits, drains) and
 * test_requests.c (what requests carry) share its fixture (engine_refs.h).
 *
 * Reference for the tokens: the in-process single-sequence generator
 * (model/generate.h), itself checked against llama.cpp by test_generate. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "kv/kv.h"
#include "model/generate.h"
#include "model/model.h"
#include "model/prompt.h"
#include "model/source.h"
#include "model/tok_internal.h"
#include "model/gguf.h"
#include "tests/engine/engine_fx.h"
#include "tests/engine/engine_refs.h"

/* ---- batching -------------------------------------------------------------------- */

START_TEST(test_concurrent_same_as_alone) {
  efx_need_model();
  efx_load_refs(EFX_N_PROMPTS);
  efx_server_t s;
  ck_assert_int_eq(efx_start(&s, NULL), 0);
  efx_job_t alone;
  proto_submit_t r = efx_greedy(efx_prompts[0], EFX_N_OUT);
  ck_assert_int_eq(efx_run_one(&s, &r, &alone), 0);
  efx_check_ref(&alone, 0);
  static efx_job_t jobs[EFX_N_PROMPTS];
  efx_run_batch(&s, EFX_N_PROMPTS, jobs);
  for (int i = 0; i < EFX_N_PROMPTS; i++) efx_check_ref(&jobs[i], i);
  efx_stop_clean(&s, false);
}
END_TEST

START_TEST(test_preemption_same_outputs) {
  efx_need_model();
  efx_load_refs(8);
  efx_server_t s;
  /* 6 blocks of 16 tokens (block size as the reference: attention's
   * online softmax goes block by block): 8 jobs of ~10 + 16 tokens need 2
   * blocks each */
  const char *extra[] = {"--num-kv-blocks", "6", "--max-num-batched-tokens", "64", "--no-enable-prefix-caching",
                         NULL};
  ck_assert_int_eq(efx_start(&s, extra), 0);
  static efx_job_t jobs[8];
  efx_run_batch(&s, 8, jobs);
  for (int i = 0; i < 8; i++) efx_check_ref(&jobs[i], i);
  proto_status_reply_t st;
  ck_assert_int_eq(efx_status(&s, &st), 0);
  ck_assert_msg(st.preemptions > 0, "no preemption happened");
  ck_assert_int_eq(st.kv_used_blocks, 0);
  efx_stop_clean(&s, false);
}
END_TEST


/* A prompt longer than the step budget is prefilled in chunks while other
 * jobs decode; every job still gets the generator's tokens. */
START_TEST(test_chunked_prefill_with_decodes) {
  efx_need_model();
  efx_load_refs(3);
  char long_prompt[2048] = "A list of fruits and their colors: ";
  for (int i = 0; i < 8; i++) strcat(long_prompt, "banana is yellow, cherry is red, grape is purple, lime is green, ");
  strcat(long_prompt, "and orange is");
  int32_t ref_long[EFX_N_OUT];
  ck_assert_int_eq(efx_reference(long_prompt, EFX_N_OUT, ref_long), EFX_N_OUT);
  efx_server_t s;
  const char *extra[] = {"--max-num-batched-tokens", "32", NULL};
  ck_assert_int_eq(efx_start(&s, extra), 0);
  fr_client_t *c = NULL;
  ck_assert_int_eq(fr_client_connect(&c, s.rpc), 0);
  efx_job_t jobs[4];
  memset(jobs, 0, sizeof jobs);
  for (int i = 0; i < 3; i++) {
    proto_submit_t r = efx_greedy(efx_prompts[i], EFX_N_OUT);
    ck_assert_int_eq(fr_client_submit(c, &r, &jobs[i].id), 0);
  }
  /* decodes are running when the long prompt arrives; the others' first tokens are kept (prompts are
   * tokenized in parallel, so any of the three may start first) */
  ck_assert_int_eq(efx_collect_until(c, jobs, 3, 0, 1, 60000), 0);
  proto_submit_t r = efx_greedy(long_prompt, EFX_N_OUT);
  ck_assert_int_eq(fr_client_submit(c, &r, &jobs[3].id), 0);
  ck_assert_int_eq(efx_collect(c, jobs, 4, 120000), 0);
  for (int i = 1; i < 3; i++) efx_check_ref(&jobs[i], i);
  ck_assert_int_ge(jobs[3].usage.prompt_tokens, 100); /* > 3 chunks of 32 */
  ck_assert_int_eq(jobs[3].n_tokens, EFX_N_OUT);
  ck_assert_mem_eq(jobs[3].tokens, ref_long, sizeof ref_long);
  fr_client_close(c);
  efx_stop_clean(&s, false);
}
END_TEST

/* One sequence at a time: waiting jobs start by priority, then in order of
 * arrival. */
START_TEST(test_priority_then_fifo) {
  efx_need_model();
  efx_server_t s;
  const char *extra[] = {"--max-num-seqs", "1", NULL};
  ck_assert_int_eq(efx_start(&s, extra), 0);
  fr_client_t *c = NULL;
  ck_assert_int_eq(fr_client_connect(&c, s.rpc), 0);
  efx_job_t jobs[4];
  memset(jobs, 0, sizeof jobs);
  int32_t prio[4] = {0, 0, 5, 0}; /* job 0 runs first; then 2 (priority), 1, 3 */
  proto_submit_t r = efx_greedy(efx_prompts[0], 6);
  ck_assert_int_eq(fr_client_submit(c, &r, &jobs[0].id), 0);
  efx_wait_events(c, jobs[0].id, 1);
  for (int i = 1; i < 4; i++) {
    r.priority = prio[i];
    ck_assert_int_eq(fr_client_submit(c, &r, &jobs[i].id), 0);
  }
  int order[4], n_done = 0;
  while (n_done < 4) {
    proto_event_t ev;
    ck_assert_int_eq(fr_client_next_event(c, 60000, &ev), 0);
    for (int i = 0; i < 4; i++)
      if (ev.id == jobs[i].id && ev.finish != PROTO_FINISH_NONE) order[n_done++] = i;
  }
  ck_assert_int_eq(order[0], 0);
  ck_assert_int_eq(order[1], 2);
  ck_assert_int_eq(order[2], 1);
  ck_assert_int_eq(order[3], 3);
  fr_client_close(c);
  efx_stop_clean(&s, false);
}
END_TEST

/* ---- prefix cache ----------------------------------------------------------------- */

START_TEST(test_prefix_cache_hit) {
  efx_need_model();
  char prompt[4096] = "Here is a long story about a robot who learns to paint. ";
  for (int i = 0; i < 12; i++)
    strcat(prompt, "Every morning the robot walked to the hill, looked at the sky and mixed new colors. ");
  strcat(prompt, "In the end, the robot");
  efx_server_t s;
  ck_assert_int_eq(efx_start(&s, NULL), 0);
  efx_job_t a, b;
  proto_submit_t r = efx_greedy(prompt, 12);
  ck_assert_int_eq(efx_run_one(&s, &r, &a), 0);
  ck_assert_int_eq(a.usage.cached_tokens, 0);
  ck_assert_int_ge(a.usage.prompt_tokens, 200);
  ck_assert_int_eq(efx_run_one(&s, &r, &b), 0);
  ck_assert_int_ge(b.usage.cached_tokens, a.usage.prompt_tokens - 16);
  ck_assert_int_lt(b.usage.cached_tokens, a.usage.prompt_tokens);
  ck_assert_int_eq(a.n_tokens, 12);
  ck_assert_int_eq(b.n_tokens, 12);
  ck_assert_mem_eq(a.tokens, b.tokens, 12 * sizeof(int32_t));
  proto_status_reply_t st;
  ck_assert_int_eq(efx_status(&s, &st), 0);
  ck_assert_uint_eq(st.prefix_hits, b.usage.cached_tokens);
  ck_assert_uint_eq(st.prefix_queries, 2 * (uint64_t)a.usage.prompt_tokens);
  efx_stop_clean(&s, true);
}
END_TEST

/* ---- cancel and disconnect ----------------------------------------------------------- */

START_TEST(test_cancel_and_disconnect_free_blocks) {
  efx_need_model();
  efx_server_t s;
  ck_assert_int_eq(efx_start(&s, NULL), 0);
  proto_status_reply_t st;
  ck_assert_int_eq(efx_status(&s, &st), 0);
  uint32_t base = st.kv_used_blocks;
  ck_assert_int_eq(base, 0);
  /* cancel mid-stream: the last event says "cancel" */
  fr_client_t *c = NULL;
  ck_assert_int_eq(fr_client_connect(&c, s.rpc), 0);
  proto_submit_t r = efx_greedy(efx_prompts[1], 400);
  uint64_t id;
  ck_assert_int_eq(fr_client_submit(c, &r, &id), 0);
  efx_wait_events(c, id, 3);
  ck_assert_int_eq(efx_status(&s, &st), 0);
  ck_assert_int_gt(st.kv_used_blocks, 0);
  ck_assert_int_eq(fr_client_cancel(c, id), 0);
  efx_job_t j = {.id = id};
  ck_assert_int_eq(efx_collect(c, &j, 1, 30000), 0);
  ck_assert_int_eq(j.finish, PROTO_FINISH_CANCEL);
  efx_wait_idle(&s, base);
  /* cancels racing steps: sent right after submit, after 1 event, ... */
  for (int k = 0; k < 6; k++) {
    ck_assert_int_eq(fr_client_submit(c, &r, &id), 0);
    if (k) efx_wait_events(c, id, k);
    ck_assert_int_eq(fr_client_cancel(c, id), 0);
    efx_job_t jj = {.id = id};
    ck_assert_int_eq(efx_collect(c, &jj, 1, 30000), 0);
    ck_assert(jj.finish == PROTO_FINISH_CANCEL || jj.finish == PROTO_FINISH_LENGTH);
  }
  efx_wait_idle(&s, base);
  /* disconnect mid-stream: two clients close with jobs running */
  for (int k = 0; k < 2; k++) {
    fr_client_t *d = NULL;
    ck_assert_int_eq(fr_client_connect(&d, s.rpc), 0);
    ck_assert_int_eq(fr_client_submit(d, &r, &id), 0);
    efx_wait_events(d, id, 2);
    fr_client_close(d);
  }
  efx_wait_idle(&s, base);
  /* a client that disconnects while its job is not streaming: noticed at
   * once (the connection closed), not when the job would have ended */
  {
    fr_client_t *d = NULL;
    ck_assert_int_eq(fr_client_connect(&d, s.rpc), 0);
    proto_submit_t quiet = efx_greedy(efx_prompts[1], 4000);
    quiet.stream = false;
    ck_assert_int_eq(fr_client_submit(d, &quiet, &id), 0);
    /* up to 30 s: under ASan, beside the golden suite, the prompt can
     * take more than 5 s to reach a step */
    for (int i = 0; i < 3000; i++) {
      ck_assert_int_eq(efx_status(&s, &st), 0);
      if (st.running == 1 && st.kv_used_blocks > 0) break;
      usleep(10000);
    }
    ck_assert_int_eq(st.running, 1);
    uint64_t t0 = fr_now_ns();
    fr_client_close(d);
    efx_wait_idle(&s, base);
    ck_assert_msg(fr_now_ns() - t0 < 5000000000ull, "disconnect noticed late");
  }
  /* the allocator's invariants hold, read from the control segment */
  kv_ctl_t *ctl = NULL;
  ck_assert_int_eq(kv_control_attach(&ctl, s.instance), 0);
  ck_assert_int_eq(kv_control_verify(ctl), 0);
  ck_assert_int_eq(kv_blocks_free_count(ctl), (int)st.kv_total_blocks);
  kv_control_destroy(ctl);
  fr_client_close(c);
  efx_stop_clean(&s, false);
}
END_TEST

/* ---- paths and finding the server ------------------------------------------------------------ */

/* The HTTP line of the server's pid file ("" when none). */
static void pidfile_http(const efx_server_t *s, char *url, size_t cap) {
  char path[600], line[600];
  snprintf(path, sizeof path, "%s/ferrum", s->dir);
  DIR *d = opendir(path);
  ck_assert_ptr_nonnull(d);
  url[0] = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (!strncmp(e->d_name, "server-", 7) && strstr(e->d_name, ".pid")) {
      snprintf(path, sizeof path, "%s/ferrum/%s", s->dir, e->d_name);
      FILE *f = fopen(path, "r");
      for (int i = 0; f && i < 4 && fgets(line, sizeof line, f); i++)
        if (i == 3) snprintf(url, cap, "%.*s", (int)strcspn(line, "\n"), line);
      if (f) fclose(f);
    }
  closedir(d);
}

/* Runs `ferrumctl chat ARGS...` from / with the server's runtime folder and
 * one user line on stdin; returns its exit code (-1: killed after 120 s),
 * its stdout in out. */
static int run_chat(const efx_server_t *s, const char *const *args, char *out, size_t cap) {
  char in_path[400], out_path[400], exe[4096];
  snprintf(in_path, sizeof in_path, "%s/chat.in", s->dir);
  snprintf(out_path, sizeof out_path, "%s/chat.out", s->dir);
  FILE *f = fopen(in_path, "w");
  ck_assert_ptr_nonnull(f);
  fputs("Say hello.\n", f);
  fclose(f);
  ck_assert_ptr_nonnull(realpath(efx_bin("ferrumctl"), exe));
  pid_t pid = fork();
  if (pid == 0) {
    const char *argv[16] = {exe, "chat"};
    int n = 2;
    for (int i = 0; args[i] && n < 15; i++) argv[n++] = args[i];
    argv[n] = NULL;
    int in = open(in_path, O_RDONLY), o = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (in < 0 || o < 0 || dup2(in, 0) < 0 || dup2(o, 1) < 0 || chdir("/") != 0) _exit(126);
    setenv("XDG_RUNTIME_DIR", s->dir, 1);
    execv(exe, (char *const *)argv);
    _exit(127);
  }
  int st = 0;
  uint64_t deadline = fr_now_ns() + 120ull * 1000000000ull;
  while (waitpid(pid, &st, WNOHANG) == 0) {
    if (fr_now_ns() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      return -1;
    }
    usleep(20000);
  }
  f = fopen(out_path, "r");
  size_t len = f ? fread(out, 1, cap - 1, f) : 0;
  if (f) fclose(f);
  out[len] = 0;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A Hugging Face folder for --load-format dummy: a one-layer llama
 * config.json (with quant, unless NULL, as its quantization_config) and a
 * byte-level BPE tokenizer.json (the 256 byte tokens and one special, the
 * EOS). */
static void write_dummy_folder(const char *dir, const char *quant) {
  char path[512];
  ck_assert_int_eq(mkdir(dir, 0700), 0);
  snprintf(path, sizeof path, "%s/config.json", dir);
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fputs("{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 64, "
        "\"intermediate_size\": 128, \"num_hidden_layers\": 1, \"num_attention_heads\": 2, "
        "\"num_key_value_heads\": 1, \"head_dim\": 32, \"vocab_size\": 257, \"max_position_embeddings\": 256, "
        "\"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0, \"tie_word_embeddings\": true, \"hidden_act\": \"silu\", "
        "\"bos_token_id\": 256, \"eos_token_id\": 256", f);
  if (quant) fprintf(f, ", \"quantization_config\": %s", quant);
  fputs("}\n", f);
  ck_assert_int_eq(fclose(f), 0);
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fputs("{\"model\": {\"type\": \"BPE\", \"merges\": [], \"vocab\": {", f);
  for (int b = 0; b < 256; b++) {
    char u[8] = {0};
    tok__utf8_put(tok__byte_to_cp((uint8_t)b), u);
    fprintf(f, "%s\"%s%s\": %d", b ? ", " : "", b == '"' || b == '\\' ? "\\" : "", u, b);
  }
  fputs("}}, \"added_tokens\": [{\"id\": 256, \"content\": \"<|endoftext|>\", \"special\": true}], "
        "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false}}\n", f);
  ck_assert_int_eq(fclose(f), 0);
}

static void rm_dummy_folder(const char *dir) {
  char path[512];
  snprintf(path, sizeof path, "%s/config.json", dir);
  ck_assert_int_eq(unlink(path), 0);
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  ck_assert_int_eq(unlink(path), 0);
  ck_assert_int_eq(rmdir(dir), 0);
}

/* `ferrumctl serve --model ../models/<file>` from another working folder
 * (through a symlinked folder) serves the model; `ferrumctl chat` with no
 * address finds the server's HTTP port (ephemeral, not 8000) through its
 * pid file; a bare folder name serves (dummy weights: the worker once took
 * it for a built-in config's name); a relative path that does not exist
 * fails naming the path as given. */
START_TEST(test_relative_model_and_chat_finds_server) {
  efx_need_model();
  char model_abs[4096], tmp[] = "/tmp/ferrum-relpath-XXXXXX", cwd[128], link[128], rel[4200], name[64];
  ck_assert_ptr_nonnull(realpath(efx_model(), model_abs));
  ck_assert_ptr_nonnull(mkdtemp(tmp));
  snprintf(cwd, sizeof cwd, "%s/cwd", tmp);
  snprintf(link, sizeof link, "%s/models", tmp);
  ck_assert_int_eq(mkdir(cwd, 0700), 0);
  char *slash = strrchr(model_abs, '/');
  *slash = 0;
  ck_assert_int_eq(symlink(model_abs, link), 0);
  snprintf(rel, sizeof rel, "../models/%s", slash + 1);
  snprintf(name, sizeof name, "relpath-%d", (int)getpid()); /* no other server on 8000 serves this */
  efx_server_t s;
  efx_opts_t o = {.cwd = cwd, .model = rel, .http = true};
  const char *extra[] = {"--served-model-name", name, "--max-model-len", "256", "--max-num-seqs", "2", NULL};
  ck_assert_int_eq(efx_start_opts(&s, &o, extra), 0);
  efx_job_t j;
  proto_submit_t r = efx_greedy(efx_prompts[0], 4);
  ck_assert_int_eq(efx_run_one(&s, &r, &j), 0);
  ck_assert_int_eq(j.finish, PROTO_FINISH_LENGTH);
  ck_assert_int_eq(j.n_tokens, 4);
  /* the pid file says where HTTP listens */
  char url[320];
  int port = 0;
  pidfile_http(&s, url, sizeof url);
  ck_assert_msg(sscanf(url, "http://127.0.0.1:%d", &port) == 1 && port > 0 && port != 8000, "HTTP line '%s'", url);
  char out[4096];
  const char *found[] = {"--model", name, "--max-tokens", "4", "--temperature", "0", NULL};
  ck_assert_int_eq(run_chat(&s, found, out, sizeof out), 0);
  ck_assert_msg(strlen(out) > 1 && out[strlen(out) - 1] == '\n', "chat printed '%s'", out);
  const char *by_rpc[] = {"--rpc", s.rpc, "--model", name, "--max-tokens", "2", NULL};
  ck_assert_int_eq(run_chat(&s, by_rpc, out, sizeof out), 0);
  ck_assert(strlen(out) > 1);
  const char *nowhere[] = {"--rpc", "ipc:///nonexistent/rpc.sock", NULL};
  ck_assert_int_eq(run_chat(&s, nowhere, out, sizeof out), 2);
  efx_stop_clean(&s, false);
  /* a bare folder name, from the folder above it */
  char tiny[160];
  snprintf(tiny, sizeof tiny, "%s/tiny", cwd);
  write_dummy_folder(tiny, NULL);
  efx_opts_t d = {.cwd = cwd, .model = "tiny"};
  const char *dummy[] = {"--load-format", "dummy", "--max-model-len", "64", NULL};
  ck_assert_int_eq(efx_start_opts(&s, &d, dummy), 0);
  r = efx_greedy("hi", 3);
  ck_assert_int_eq(efx_run_one(&s, &r, &j), 0);
  ck_assert_int_eq(j.finish, PROTO_FINISH_LENGTH);
  ck_assert_int_eq(j.n_tokens, 3);
  proto_status_reply_t st;
  ck_assert_int_eq(efx_status(&s, &st), 0);
  ck_assert_str_eq(st.model, "tiny"); /* the served name is still the one given */
  efx_stop_clean(&s, false);
  rm_dummy_folder(tiny);
  /* a relative path that is not there: the error names it as typed */
  efx_opts_t bad = {.cwd = cwd, .model = "./no-such-model.gguf"};
  ck_assert_int_eq(efx_start_opts(&s, &bad, NULL), -1);
  ck_assert_int_eq(s.exit_status, 1);
  ck_assert_msg(efx_log_has(&s, "./no-such-model.gguf"), "the error does not name the path (%s)", s.err_path);
  efx_cleanup(&s);
  ck_assert_int_eq(unlink(link), 0);
  ck_assert_int_eq(rmdir(cwd), 0);
  ck_assert_int_eq(rmdir(tmp), 0);
}
END_TEST

/* --load-format dummy on a GPTQ folder serves the checkpoint's layout (I4G
 * layers, F16 embedding and output; the worker says so), as vLLM's dummy
 * load keeps a checkpoint's quantization; a quantization the real load
 * refuses stops the start with its reason. */
START_TEST(test_dummy_gptq_folder) {
  char tmp[] = "/tmp/ferrum-gptq-XXXXXX", dir[96];
  ck_assert_ptr_nonnull(mkdtemp(tmp));
  snprintf(dir, sizeof dir, "%s/tiny-gptq", tmp);
  write_dummy_folder(dir, "{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 32, \"desc_act\": true}");
  efx_server_t s;
  efx_opts_t o = {.model = dir};
  const char *dummy[] = {"--load-format", "dummy", "--max-model-len", "64", NULL};
  ck_assert_int_eq(efx_start_opts(&s, &o, dummy), 0);
  efx_job_t j;
  proto_submit_t r = efx_greedy("hi", 3);
  ck_assert_int_eq(efx_run_one(&s, &r, &j), 0);
  ck_assert_int_eq(j.finish, PROTO_FINISH_LENGTH);
  ck_assert_int_eq(j.n_tokens, 3);
  ck_assert_msg(efx_log_has(&s, "I4G weights, embedding and output F16"), "no gptq layout in %s", s.err_path);
  efx_stop_clean(&s, false);
  rm_dummy_folder(dir);
  write_dummy_folder(dir, "{\"quant_method\": \"gptq\", \"bits\": 3, \"group_size\": 128}");
  ck_assert_int_eq(efx_start_opts(&s, &o, dummy), -1);
  ck_assert_msg(efx_log_has(&s, "3 bits"), "the error does not say why (%s)", s.err_path);
  efx_cleanup(&s);
  rm_dummy_folder(dir);
  ck_assert_int_eq(rmdir(tmp), 0);
}
END_TEST

/* ---- KV pool sized from a memory budget ---------------------------------------------------- */

/* Bytes of one KV block of the model: K and V of every layer, f16 (the CPU
 * worker's pool), worked out from the file's config, not the engine's code. */
/* Bytes of a KV block of the model (f16 K and V) for kv_heads KV heads (0:
 * all of them). */
static uint64_t kv_block_bytes_heads(int block_size, int kv_heads) {
  model_source_t *src = NULL;
  ck_assert_int_eq(model_source_open(&src, efx_model()), 0);
  uint64_t b = 2ull * (uint64_t)src->config.n_layers * (uint64_t)(kv_heads ? kv_heads : src->config.n_kv_heads) *
               (uint64_t)src->config.head_dim * (uint64_t)block_size * 2;
  model_source_close(src);
  return b;
}

static uint64_t kv_block_bytes(int block_size) { return kv_block_bytes_heads(block_size, 0); }

/* Kills every worker of s and waits until they are all back (restarted
 * with the block count fixed at start-up). */
static void kill_workers_and_wait(efx_server_t *s, int n) {
  pid_t w[8];
  ck_assert_int_eq(efx_worker_pids(s, w, 8), n);
  for (int i = 0; i < n; i++) ck_assert_int_eq(kill(w[i], SIGKILL), 0);
  uint64_t t0 = fr_now_ns();
  proto_status_reply_t st = {0};
  while (st.worker_restarts == 0 || st.n_workers != (uint32_t)n) {
    ck_assert_msg(fr_now_ns() - t0 < 60000000000ull, "workers not back within 60 s");
    usleep(20000);
    ck_assert_int_eq(efx_status(s, &st), 0);
  }
}

/* --kv-cache-memory-bytes on the CPU, two tensor-parallel ranks: each
 * reports the blocks that fit the budget with its KV heads (SmolLM2's 3 KV
 * groups split 1 and 2), the pool gets the fewer (rank 1's); requests run
 * to their length, and after the workers were restarted with the fixed
 * count they give the same tokens as before. (Two ranks add partial sums
 * in another order than one worker, so their greedy tokens may part from
 * efx_refs at a near tie; tests/engine/test_tp.py holds them to that rule.) */
START_TEST(test_kv_cache_memory_bytes) {
  efx_need_model();
  const uint64_t budget = 48ull << 20, bpb = kv_block_bytes_heads(16, 2);
  efx_server_t s;
  const char *extra[] = {"--kv-cache-memory-bytes", "48M", "--tensor-parallel-size", "2",
                         "--max-num-batched-tokens", "64", NULL};
  ck_assert_int_eq(efx_start(&s, extra), 0);
  proto_status_reply_t st;
  ck_assert_int_eq(efx_status(&s, &st), 0);
  ck_assert_uint_eq(st.kv_total_blocks, budget / bpb);
  ck_assert_uint_eq(st.n_workers, 2);
  static efx_job_t before[3], after[3];
  efx_run_batch(&s, 3, before);
  for (int i = 0; i < 3; i++) {
    ck_assert_int_eq(before[i].finish, PROTO_FINISH_LENGTH);
    ck_assert_int_eq(before[i].n_tokens, EFX_N_OUT);
  }
  kill_workers_and_wait(&s, 2);
  ck_assert_int_eq(efx_status(&s, &st), 0);
  ck_assert_uint_eq(st.kv_total_blocks, budget / bpb);
  efx_run_batch(&s, 3, after);
  for (int i = 0; i < 3; i++) {
    ck_assert_int_eq(after[i].n_tokens, EFX_N_OUT);
    ck_assert_msg(!memcmp(after[i].tokens, before[i].tokens, sizeof(int32_t) * EFX_N_OUT),
                  "prompt %d: other tokens after the restart", i);
  }
  efx_stop_clean(&s, false);
}
END_TEST

/* Starts a server that must fail to start; returns its log (static). */
static const char *start_fails(const char *const *extra) {
  static char log[16384];
  efx_server_t s;
  ck_assert_int_eq(efx_start(&s, extra), -1);
  ck_assert_int_eq(s.exit_status, 1); /* an error, not a crash (signal) or a usage error (2) */
  FILE *f = fopen(s.err_path, "r");
  ck_assert_ptr_nonnull(f);
  size_t n = fread(log, 1, sizeof log - 1, f);
  fclose(f);
  log[n] = 0;
  /* nothing left in shared memory: the instance is in the log */
  const char *p = strstr(log, "instance ");
  char inst[64] = "";
  ck_assert_ptr_nonnull(p);
  ck_assert_int_eq(sscanf(p, "instance %63[^:]", inst), 1);
  snprintf(s.instance, sizeof s.instance, "%s", inst);
  ck_assert_int_eq(efx_shm_count(&s), 0);
  efx_cleanup(&s);
  return log;
}

/* Exit code of `ferrumctl serve --no-http OPT VALUE` on a model that does
 * not exist (2: usage error; a value that is taken fails later, with 1). */
static int serve_exit(const char *opt, const char *value) {
  pid_t p = fork();
  if (p == 0) {
    int fd = open("/dev/null", O_WRONLY);
    if (fd >= 0) dup2(fd, 2), dup2(fd, 1);
    execl(efx_bin("ferrumctl"), "ferrumctl", "serve", "--no-http", "--model", "/nonexistent/m.gguf", opt, value,
          (char *)NULL);
    _exit(127);
  }
  int st = 0;
  waitpid(p, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Budgets that cannot hold the minimum fail the start with a message that
 * says what was needed and what there is; values that are no budget are
 * usage errors. */
START_TEST(test_kv_budget_too_small) {
  efx_need_model();
  const char *bad_bytes[] = {"12x", "1.5", "0", "-1G", "4GiB", "G", "", "1e30"};
  for (size_t i = 0; i < sizeof bad_bytes / sizeof bad_bytes[0]; i++)
    ck_assert_msg(serve_exit("--kv-cache-memory-bytes", bad_bytes[i]) == 2, "'%s' taken", bad_bytes[i]);
  const char *bad_util[] = {"0", "1.01", "-0.5", "nan", "x"};
  for (size_t i = 0; i < sizeof bad_util / sizeof bad_util[0]; i++)
    ck_assert_msg(serve_exit("--gpu-memory-utilization", bad_util[i]) == 2, "'%s' taken", bad_util[i]);
  ck_assert_int_eq(serve_exit("--kv-cache-memory-bytes", "1.5g"), 1); /* taken: fails on the model */
  ck_assert_int_eq(serve_exit("--gpu-memory-utilization", "1"), 1);
  const uint64_t bpb = kv_block_bytes(16);
  char need[128], mib[64];
  /* one sequence of an explicit --max-model-len (4096 tokens: 256 blocks) must fit */
  const char *a[] = {"--kv-cache-memory-bytes", "16M", "--max-model-len", "4096", NULL};
  const char *log = start_fails(a);
  snprintf(need, sizeof need, "needs at least 256 block(s) of 16 tokens (%.1f MiB", 256.0 * bpb / 1048576.0);
  ck_assert_msg(strstr(log, need), "no '%s' in:\n%s", need, log);
  snprintf(mib, sizeof mib, "only 16.0 MiB (%llu blocks)", (unsigned long long)((16ull << 20) / bpb));
  ck_assert_msg(strstr(log, mib), "no '%s' in:\n%s", mib, log);
  ck_assert_ptr_nonnull(strstr(log, "ferrumctl serve: worker 0:"));
  /* less than one block */
  char tiny[32];
  snprintf(tiny, sizeof tiny, "%llu", (unsigned long long)bpb - 1);
  const char *b[] = {"--kv-cache-memory-bytes", tiny, NULL};
  log = start_fails(b);
  ck_assert_msg(strstr(log, "needs at least 1 block(s)") && strstr(log, "(0 blocks) are available"), "%s", log);
  /* the CPU reports no memory size: a fraction of it is refused, clearly */
  const char *c[] = {"--gpu-memory-utilization", "0.5", NULL};
  log = start_fails(c);
  ck_assert_msg(strstr(log, "--gpu-memory-utilization needs a device that reports its memory"), "%s", log);
}
END_TEST

static Suite *engine_suite(void) {
  Suite *s = suite_create("engine");
  TCase *t = tcase_create("e2e");
  tcase_set_timeout(t, 240);
  EFX_ADD(t, test_concurrent_same_as_alone);
  EFX_ADD(t, test_preemption_same_outputs);
  EFX_ADD(t, test_chunked_prefill_with_decodes);
  EFX_ADD(t, test_priority_then_fifo);
  EFX_ADD(t, test_prefix_cache_hit);
  EFX_ADD(t, test_cancel_and_disconnect_free_blocks);
  EFX_ADD(t, test_relative_model_and_chat_finds_server);
  EFX_ADD(t, test_dummy_gptq_folder);
  EFX_ADD(t, test_kv_cache_memory_bytes);
  EFX_ADD(t, test_kv_budget_too_small);
  suite_add_tcase(s, t);
  return s;
}

#include "tests/common/test_main.h"

const test_prog_t test_prog = {.suites = {engine_suite}, .setup = efx_setup};
