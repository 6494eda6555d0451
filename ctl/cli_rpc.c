/* cli_rpc.c - ferrumctl's RPC client side: `submit`, `status`, `cancel`,
 * and the engine path of `run` (a running server, or a private one started
 * for the call). stdout gets only generated text (submit, run) or the
 * status; diagnostics go to stderr. */
#include <errno.h>
#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fr_err.h"
#include "common/fr_log.h"
#include "common/fr_util.h"
#include "ctl/cli.h"
#include "coordinator/coord.h"
#include "proto/curve.h"
#include "proto/fr_client.h"

static const char *cli_rpc_default(const char *rpc) {
  static char def[600];
  if (rpc) return rpc;
  if (coord_default_rpc_addr(def, sizeof def)) return NULL;
  return def;
}

/* ---- connecting, with CURVE where the server asks for it ------------------------- */

int cli_connect(fr_client_t **out, const char *rpc, const cli_curve_t *k) {
  const char *server = k && k->server_key ? k->server_key : getenv(PROTO_CURVE_SERVER_ENV);
  *out = NULL;
  if (!server || !*server) return fr_client_connect(out, rpc);
  char server_pub[PROTO_CURVE_Z85];
  proto_curve_pair_t kp;
  bool found;
  int rc = proto_curve_public(server_pub, server);
  if (!rc) rc = proto_curve_find(&kp, k ? k->curve_key : NULL, &found);
  if (rc) return rc;
  if (!found)
    return fr_errorf(-EINVAL, "a server key needs this client's key pair too (--curve-key FILE or %s)", PROTO_CURVE_ENV);
  fr_client_keys_t keys = {.server_key = server_pub, .public_key = kp.pub, .secret_key = kp.sec};
  return fr_client_connect_curve(out, rpc, &keys);
}

/* ---- streaming one job ---------------------------------------------------------- */

int cli_engine_generate(const char *rpc, const cli_curve_t *k, const proto_submit_t *req, int timeout_ms, bool stats) {
  fr_client_t *cl = NULL;
  int rc = cli_connect(&cl, rpc, k);
  if (rc) return rc;
  uint64_t id, t0 = fr_now_ns(), t1 = 0;
  proto_event_t ev;
  uint32_t n_tok = 0;
  if ((rc = fr_client_submit(cl, req, &id))) goto done;
  for (;;) {
    if ((rc = fr_client_next_event(cl, timeout_ms, &ev))) goto done;
    if (ev.id != id) continue;
    if (ev.n_tokens && !t1) t1 = fr_now_ns();
    n_tok += ev.n_tokens;
    if (ev.text_len) fwrite(ev.text, 1, ev.text_len, stdout), fflush(stdout);
    if (ev.finish != PROTO_FINISH_NONE) break;
  }
  fputc('\n', stdout);
  fflush(stdout);
  if (ev.finish == PROTO_FINISH_ERROR) {
    rc = fr_errorf(FR_EPROTO, "error %d: %s", ev.error.code, ev.error.message ? ev.error.message : "job failed");
    goto done;
  }
  if (stats) {
    uint64_t t2 = fr_now_ns();
    FR_LOGI("finish %s: prompt %u tokens (%u cached), first token after %.3f s, generated %u tokens in %.3f s (%.1f tok/s)",
            proto_finish_name(ev.finish), ev.usage.prompt_tokens, ev.usage.cached_tokens, t1 ? (t1 - t0) / 1e9 : 0,
            n_tok, (t2 - (t1 ? t1 : t0)) / 1e9, n_tok > 1 && t1 ? (n_tok - 1) / ((t2 - t1) / 1e9) : 0);
  }
done:
  fr_client_close(cl);
  return rc;
}

/* ---- submit ------------------------------------------------------------------------ */

static void submit_usage(FILE *f) {
  fprintf(f, "usage: ferrumctl submit [--rpc ADDR] (--prompt TEXT | --chat TEXT) [options]\n"
             "  --server-key KEY   the server's CURVE public key (Z85 or a .pub file; or $FERRUM_SERVER_KEY)\n"
             "  --curve-key FILE   this client's key pair, listed in the server's --curve-clients\n"
             "                     (or the secret key in $FERRUM_CURVE_SECRET_KEY)\n"
             "  --prompt TEXT      raw prompt (no chat template)\n"
             "  --chat TEXT        one user message through the model's chat template\n"
             "  --max-tokens N     (default 128)\n"
             "  --temperature T    (default 0 = greedy)   --top-k K  --top-p P  --min-p P  --seed S\n"
             "  --repetition-penalty R  --presence-penalty P  --frequency-penalty F\n"
             "  --stop TEXT        stop string (repeatable, up to 16)\n"
             "  --ignore-eos       --priority N\n");
}

typedef struct {
  proto_submit_t req;
  proto_chat_msg_t msg;
  char *stops[PROTO_MAX_STOP];
  const char *rpc;
  cli_curve_t keys;
} submit_opts_t;

static int submit_float(const char *name, float lo, float hi, float *out) {
  double d;
  if (cli_parse_float(name, optarg, lo, hi, &d)) return 2;
  *out = (float)d;
  return 0;
}

static int submit_opt(submit_opts_t *o, int c) {
  long v;
  proto_sampling_t *sp = &o->req.sp;
  switch (c) {
  case 'r': o->rpc = optarg; return 0;
  case 'K': o->keys.server_key = optarg; return 0;
  case 'C': o->keys.curve_key = optarg; return 0;
  case 'p': o->req.prompt = optarg; return 0;
  case 'c':
    o->msg = (proto_chat_msg_t){.role = "user", .content = optarg};
    o->req.messages = &o->msg;
    o->req.n_messages = 1;
    return 0;
  case 'm': if (cli_parse_int("--max-tokens", optarg, 1, 1 << 20, &v)) return 2; o->req.max_tokens = (uint32_t)v; return 0;
  case 't': return submit_float("--temperature", 0, 100, &sp->temperature);
  case 'k': if (cli_parse_int("--top-k", optarg, 0, 1 << 24, &v)) return 2; sp->top_k = (int32_t)v; return 0;
  case 'P': return submit_float("--top-p", 0.000001f, 1, &sp->top_p);
  case 'M': return submit_float("--min-p", 0, 1, &sp->min_p);
  case 'R': return submit_float("--repetition-penalty", 0.01f, 100, &sp->repetition_penalty);
  case 'E': return submit_float("--presence-penalty", -2, 2, &sp->presence_penalty);
  case 'F': return submit_float("--frequency-penalty", -2, 2, &sp->frequency_penalty);
  case 's':
    if (cli_parse_int("--seed", optarg, 0, 0x7fffffffffffffffL, &v)) return 2;
    sp->seed = (uint64_t)v, sp->has_seed = true;
    return 0;
  case 'S':
    if (o->req.stop.n_strs >= PROTO_MAX_STOP || !*optarg) return 2;
    o->stops[o->req.stop.n_strs++] = optarg;
    return 0;
  case 'i': o->req.stop.ignore_eos = true; return 0;
  case 'y': if (cli_parse_int("--priority", optarg, -1000000, 1000000, &v)) return 2; o->req.priority = (int32_t)v; return 0;
  case 'h': submit_usage(stdout); return 1;
  default: submit_usage(stderr); return 2;
  }
}

int cli_cmd_submit(int argc, char **argv) {
  static const struct option lo[] = {
      {"rpc", required_argument, 0, 'r'},         {"prompt", required_argument, 0, 'p'},
      {"chat", required_argument, 0, 'c'},        {"max-tokens", required_argument, 0, 'm'},
      {"temperature", required_argument, 0, 't'}, {"top-k", required_argument, 0, 'k'},
      {"top-p", required_argument, 0, 'P'},       {"min-p", required_argument, 0, 'M'},
      {"repetition-penalty", required_argument, 0, 'R'}, {"presence-penalty", required_argument, 0, 'E'},
      {"frequency-penalty", required_argument, 0, 'F'},  {"seed", required_argument, 0, 's'},
      {"stop", required_argument, 0, 'S'},        {"ignore-eos", no_argument, 0, 'i'},
      {"priority", required_argument, 0, 'y'},    {"help", no_argument, 0, 'h'},
      {"server-key", required_argument, 0, 'K'},  {"curve-key", required_argument, 0, 'C'},
      {0, 0, 0, 0}};
  submit_opts_t o;
  memset(&o, 0, sizeof o);
  o.req.sp = proto_sampling_default();
  o.req.sp.temperature = 0;
  o.req.max_tokens = 128;
  o.req.stream = true;
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
    int rc = submit_opt(&o, c);
    if (rc) return rc == 1 ? 0 : rc;
  }
  if ((o.req.prompt != NULL) == (o.req.n_messages > 0)) {
    fprintf(stderr, "ferrumctl submit: give one of --prompt and --chat\n");
    return 2;
  }
  o.req.stop.strs = o.stops;
  const char *rpc = cli_rpc_default(o.rpc);
  int rc = rpc ? cli_engine_generate(rpc, &o.keys, &o.req, 600000, true) : -EINVAL;
  if (rc) fprintf(stderr, "ferrumctl submit: %s\n", fr_last_error());
  return rc ? 1 : 0;
}

/* ---- status / cancel ---------------------------------------------------------------- */

static const struct option cli_rpc_lo[] = {{"rpc", required_argument, 0, 'r'},
                                           {"server-key", required_argument, 0, 'K'},
                                           {"curve-key", required_argument, 0, 'C'},
                                           {"help", no_argument, 0, 'h'},
                                           {0, 0, 0, 0}};

/* The options status and cancel share: --rpc and the CURVE keys. Returns 0,
 * 1 after --help, 2 on a bad option. */
static int cli_rpc_opts(int argc, char **argv, const char *usage, const char **rpc, cli_curve_t *k) {
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", cli_rpc_lo, NULL)) != -1) {
    if (c == 'r') *rpc = optarg;
    else if (c == 'K') k->server_key = optarg;
    else if (c == 'C') k->curve_key = optarg;
    else {
      fprintf(c == 'h' ? stdout : stderr, "usage: %s\n", usage);
      return c == 'h' ? 1 : 2;
    }
  }
  return 0;
}

int cli_cmd_status(int argc, char **argv) {
  const char *rpc = NULL;
  cli_curve_t keys = {0};
  int orc = cli_rpc_opts(argc, argv, "ferrumctl status [--rpc ADDR] [--server-key KEY --curve-key FILE]", &rpc, &keys);
  if (orc) return orc == 1 ? 0 : 2;
  rpc = cli_rpc_default(rpc);
  fr_client_t *cl = NULL;
  proto_status_reply_t st;
  int rc = rpc ? cli_connect(&cl, rpc, &keys) : -EINVAL;
  if (!rc) fr_client_set_timeout(cl, 3000), rc = fr_client_status(cl, NULL, &st);
  if (!rc)
    printf("{\"model\": \"%s\", \"waiting\": %u, \"running\": %u, \"kv_used_blocks\": %u, \"kv_total_blocks\": %u, "
           "\"workers_ready\": %u, \"prefix_cache_queries\": %llu, \"prefix_cache_hits\": %llu, \"preemptions\": %llu, "
           "\"worker_restarts\": %u, \"draining\": %s, \"tensor_parallel_size\": %u, \"devices\": [",
           st.model ? st.model : "", st.queued, st.running, st.kv_used_blocks, st.kv_total_blocks, st.n_workers,
           (unsigned long long)st.prefix_queries, (unsigned long long)st.prefix_hits,
           (unsigned long long)st.preemptions, st.worker_restarts, st.draining ? "true" : "false", st.tp.size);
  for (uint32_t i = 0; !rc && i < st.tp.n_devices; i++) printf("%s\"%s\"", i ? ", " : "", st.tp.devices[i]);
  if (!rc) printf("]}\n");
  else fprintf(stderr, "ferrumctl status: %s: %s\n", rpc ? rpc : "", fr_last_error());
  fr_client_close(cl);
  return rc ? 1 : 0;
}

int cli_cmd_cancel(int argc, char **argv) {
  const char *rpc = NULL;
  cli_curve_t keys = {0};
  long id = 0;
  int orc = cli_rpc_opts(argc, argv, "ferrumctl cancel [--rpc ADDR] [--server-key KEY --curve-key FILE] JOB_ID", &rpc,
                         &keys);
  if (orc) return orc == 1 ? 0 : 2;
  if (optind != argc - 1 || cli_parse_int("JOB_ID", argv[optind], 1, 0x7fffffffffffffffL, &id)) return 2;
  rpc = cli_rpc_default(rpc);
  fr_client_t *cl = NULL;
  int rc = rpc ? cli_connect(&cl, rpc, &keys) : -EINVAL;
  if (!rc) rc = fr_client_cancel(cl, (uint64_t)id);
  proto_event_t ev;
  if (!rc && fr_client_next_event(cl, 500, &ev) == 0 && ev.error.code)
    rc = fr_errorf(FR_ENOTFOUND, "%s", ev.error.message ? ev.error.message : "no such job");
  if (rc) fprintf(stderr, "ferrumctl cancel: %s\n", fr_last_error());
  fr_client_close(cl);
  return rc ? 1 : 0;
}

/* ---- the engine behind `run` ----------------------------------------------------------- */

/* True when a server answers at rpc and serves a model named like path. */
bool cli_engine_running(const char *rpc, const char *model_path) {
  if (cli_server_pid(rpc) < 0) return false;
  fr_client_t *cl = NULL;
  proto_status_reply_t st;
  bool ok = false;
  if (fr_client_connect(&cl, rpc) == 0) {
    fr_client_set_timeout(cl, 2000);
    if (fr_client_status(cl, NULL, &st) == 0 && st.n_workers > 0 && !st.draining) {
      char *tmp = fr_strdup(model_path);
      ok = st.model && !strcmp(st.model, basename(tmp));
      free(tmp);
    }
  }
  fr_client_close(cl);
  return ok;
}

int cli_engine_start_private(const char *model, const char *device, int threads, const char *kv_dtype,
                             const char *quant, const char *spec, char *rpc, size_t cap, int *pid_out) {
  char dir[512], self[PATH_MAX], th[16];
  int rc = coord_runtime_dir(dir, sizeof dir);
  if (rc) return rc;
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return fr_errorf(-errno, "readlink /proc/self/exe");
  self[n] = 0;
  snprintf(rpc, cap, "ipc://%s/run-%d.sock", dir, (int)getpid());
  snprintf(th, sizeof th, "%d", threads);
  char *argv[] = {self, "serve", "--no-http", "--model", (char *)model, "--device", (char *)device, "--threads", th,
                  "--rpc", rpc, "--max-num-seqs", "4", "--num-kv-blocks", "256", "--kv-cache-dtype",
                  (char *)(kv_dtype ? kv_dtype : "auto"), NULL, NULL, NULL, NULL, NULL};
  int n_args = (int)FR_ARRAY_SIZE(argv) - 5; /* the optional ones */
  if (quant) argv[n_args++] = "--quantization", argv[n_args++] = (char *)quant;
  if (spec) argv[n_args++] = "--speculative-config", argv[n_args++] = (char *)spec;
  pid_t parent = getpid(), pid = fork();
  if (pid < 0) return fr_errorf(-errno, "fork: %s", strerror(errno));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    if (!getenv("FERRUM_LOG")) setenv("FERRUM_LOG", "warn", 1);
    execv(self, argv);
    _exit(127);
  }
  *pid_out = pid;
  uint64_t deadline = fr_now_ns() + 600ull * 1000000000ull;
  while (fr_now_ns() < deadline) {
    int st;
    if (waitpid(pid, &st, WNOHANG) == pid) return fr_errorf(FR_EDEAD, "the private engine exited before it was ready");
    fr_client_t *cl = NULL;
    proto_status_reply_t s;
    bool ready = false;
    if (fr_client_connect(&cl, rpc) == 0) {
      fr_client_set_timeout(cl, 500);
      ready = fr_client_status(cl, NULL, &s) == 0 && s.n_workers > 0;
    }
    fr_client_close(cl);
    if (ready) return 0;
    usleep(100000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  return fr_errorf(FR_ETIMEOUT, "the private engine did not become ready");
}

void cli_engine_stop_private(int pid) {
  if (pid <= 0) return;
  kill(pid, SIGTERM);
  int st;
  for (int i = 0; i < 3000 && waitpid(pid, &st, WNOHANG) == 0; i++) usleep(10000);
  if (waitpid(pid, &st, WNOHANG) == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
  }
}
