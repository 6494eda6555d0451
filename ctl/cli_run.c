/* cli_run.c - `ferrumctl run`: generate text from a prompt. It uses the
 * server on the default RPC endpoint when one answers (and serves the same
 * model), otherwise it starts a private engine (coordinator + worker
 * processes) for the call; --in-process runs ferrum-run (worker/run.c),
 * which generates in one process.
 * stdout gets only the generated text; diagnostics go to stderr. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/fr_err.h"
#include "common/fr_log.h"
#include "common/fr_util.h"
#include "ctl/cli.h"
#include "coordinator/coord.h"
#include "kernels/kern_types.h"

typedef struct {
  const char *model, *prompt, *device;
  const char *kv_dtype; /* --kv-cache-dtype, NULL = auto */
  const char *quant;    /* --quantization (fp8), or NULL */
  const char *spec; /* --speculative-config JSON (a private engine's), or NULL */
  char model_buf[PATH_MAX]; /* a Hub name's file or folder in the Hugging Face cache */
  long max_tokens, threads, top_k;
  double temperature, top_p, min_p;
  unsigned long long seed;
  bool raw, seed_set, in_process;
} run_opts_t;

static void run_usage(FILE *f) {
  fprintf(f,
          "usage: ferrumctl run [--model PATH] --prompt TEXT [options]\n"
          "  --model PATH        GGUF file or Hugging Face folder (default: %s)\n"
          "  --prompt TEXT       the prompt (a user message unless --raw)\n"
          "  --raw               use the prompt as is, without the chat template\n"
          "  --max-tokens N      tokens to generate (default 256)\n"
          "  --temperature T     0 = greedy (default 0.8)\n"
          "  --top-k K           0 = off (default 40)\n"
          "  --top-p P           1 = off (default 0.95)\n"
          "  --min-p P           0 = off (default 0.05)\n"
          "  --seed S            RNG seed (default: random)\n"
          "  --threads N         CPU threads (default: all cores)\n"
          "  --device DEV        cpu (default) or cuda[:N]\n"
          "  --kv-cache-dtype T  auto (default), int8 or fp8: a quantized KV cache\n"
          "  --quantization fp8  FP8 weights, quantized at load (a CUDA device; as serve's)\n"
          "  --in-process        generate in one process (ferrum-run), without the engine\n"
          "  --speculative-config JSON   speculative decoding for the private engine, as serve's\n"
          "                      (e.g. '{\"method\": \"ngram\", \"num_speculative_tokens\": 4}'); a running\n"
          "                      server keeps its own\n",
          cli_default_model());
}

static int run_parse(int argc, char **argv, run_opts_t *o) {
  enum {
    O_MODEL = 256, O_PROMPT, O_MAXTOK, O_TEMP, O_TOPK, O_TOPP, O_MINP, O_SEED, O_RAW, O_THREADS, O_DEVICE, O_INPROC,
    O_KVDT, O_SPEC, O_QUANT
  };
  static const struct option lo[] = {
      {"model", required_argument, 0, O_MODEL},     {"prompt", required_argument, 0, O_PROMPT},
      {"max-tokens", required_argument, 0, O_MAXTOK}, {"temperature", required_argument, 0, O_TEMP},
      {"top-k", required_argument, 0, O_TOPK},      {"top-p", required_argument, 0, O_TOPP},
      {"min-p", required_argument, 0, O_MINP},      {"seed", required_argument, 0, O_SEED},
      {"raw", no_argument, 0, O_RAW},               {"threads", required_argument, 0, O_THREADS},
      {"device", required_argument, 0, O_DEVICE},   {"in-process", no_argument, 0, O_INPROC},
      {"kv-cache-dtype", required_argument, 0, O_KVDT},
      {"quantization", required_argument, 0, O_QUANT},
      {"speculative-config", required_argument, 0, O_SPEC},
      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  *o = (run_opts_t){.max_tokens = 256, .temperature = 0.8, .top_k = 40, .top_p = 0.95, .min_p = 0.05,
                    .device = "cpu"};
  long l;
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
    switch (c) {
    case O_MODEL: o->model = optarg; break;
    case O_PROMPT: o->prompt = optarg; break;
    case O_MAXTOK: if (cli_parse_int("--max-tokens", optarg, 0, 1 << 20, &o->max_tokens)) return 2; break;
    case O_TEMP: if (cli_parse_float("--temperature", optarg, 0, 100, &o->temperature)) return 2; break;
    case O_TOPK: if (cli_parse_int("--top-k", optarg, 0, 1 << 24, &o->top_k)) return 2; break;
    case O_TOPP: if (cli_parse_float("--top-p", optarg, 0, 1, &o->top_p)) return 2; break;
    case O_MINP: if (cli_parse_float("--min-p", optarg, 0, 1, &o->min_p)) return 2; break;
    case O_SEED:
      if (cli_parse_int("--seed", optarg, 0, 0x7fffffffffffffffL, &l)) return 2;
      o->seed = (unsigned long long)l;
      o->seed_set = true;
      break;
    case O_RAW: o->raw = true; break;
    case O_THREADS: if (cli_parse_int("--threads", optarg, 0, 1024, &o->threads)) return 2; break;
    case O_DEVICE: o->device = optarg; break;
    case O_INPROC: o->in_process = true; break;
    case O_KVDT:
      if (kern_kv_dtype_parse(optarg) < 0) {
        fprintf(stderr, "ferrumctl run: --kv-cache-dtype is auto, int8 or fp8, got '%s'\n", optarg);
        return 2;
      }
      o->kv_dtype = optarg;
      break;
    case O_QUANT:
      if (strcmp(optarg, "fp8")) {
        fprintf(stderr, "ferrumctl run: --quantization takes fp8, got '%s'\n", optarg);
        return 2;
      }
      o->quant = optarg;
      break;
    case O_SPEC: {
      coord_spec_config_t sc;
      if (coord_spec_parse(optarg, &sc)) {
        fprintf(stderr, "ferrumctl run: %s\n", fr_last_error());
        return 2;
      }
      o->spec = optarg;
      break;
    }
    case 'h': run_usage(stdout); return 1;
    default: run_usage(stderr); return 2;
    }
  }
  if (!o->prompt) {
    fprintf(stderr, "ferrumctl run: --prompt is required\n");
    run_usage(stderr);
    return 2;
  }
  if (!o->model) o->model = cli_default_model();
  if (cli_hf_is_name(o->model) && access(o->model, F_OK) != 0) {
    if (cli_hf_find(o->model, o->model_buf, sizeof o->model_buf)) {
      fprintf(stderr, "ferrumctl run: --model %s\n", fr_last_error());
      return 2;
    }
    o->model = o->model_buf;
  }
  if (!o->seed_set) o->seed = (unsigned long long)time(NULL) ^ ((unsigned long long)fr_now_ns() << 16);
  return 0;
}

/* The in-process path: ferrum-run, next to this program, generates in one
 * process (ferrumctl links no backend). Returns its exit code. */
static int run_in_process(const run_opts_t *o) {
  char exe[PATH_MAX + 32], num[7][32];
  int rc = cli_sibling_exe("ferrum-run", exe, sizeof exe);
  if (rc) {
    fprintf(stderr, "ferrumctl run: %s\n", fr_last_error());
    return 1;
  }
  snprintf(num[0], sizeof num[0], "%ld", o->max_tokens);
  snprintf(num[1], sizeof num[1], "%.9g", o->temperature);
  snprintf(num[2], sizeof num[2], "%ld", o->top_k);
  snprintf(num[3], sizeof num[3], "%.9g", o->top_p);
  snprintf(num[4], sizeof num[4], "%.9g", o->min_p);
  snprintf(num[5], sizeof num[5], "%llu", o->seed);
  snprintf(num[6], sizeof num[6], "%ld", o->threads);
  char *argv[] = {exe, "--model", (char *)o->model, "--prompt", (char *)o->prompt, "--device", (char *)o->device,
                  "--max-tokens", num[0], "--temperature", num[1], "--top-k", num[2], "--top-p", num[3],
                  "--min-p", num[4], "--seed", num[5], "--threads", num[6], "--kv-cache-dtype",
                  (char *)(o->kv_dtype ? o->kv_dtype : "auto"), NULL, NULL, NULL, NULL};
  int n = (int)FR_ARRAY_SIZE(argv) - 4; /* the optional ones */
  if (o->quant) argv[n++] = "--quantization", argv[n++] = (char *)o->quant;
  if (o->raw) argv[n++] = "--raw";
  fflush(NULL);
  execv(exe, argv);
  fprintf(stderr, "ferrumctl run: exec %s: %s\n", exe, strerror(errno));
  return 1;
}

/* The engine path: a running server, or a private one for this call. */
static int run_engine(const run_opts_t *o) {
  proto_submit_t req = {.sp = proto_sampling_default(), .max_tokens = (uint32_t)o->max_tokens, .stream = true};
  proto_chat_msg_t msg = {.role = "user", .content = (char *)o->prompt};
  if (o->raw) req.prompt = (char *)o->prompt;
  else req.messages = &msg, req.n_messages = 1;
  req.sp.temperature = (float)o->temperature;
  req.sp.top_k = (int32_t)o->top_k;
  req.sp.top_p = o->top_p > 0 ? (float)o->top_p : 1e-6f;
  req.sp.min_p = (float)o->min_p;
  req.sp.seed = o->seed, req.sp.has_seed = true;
  if (o->max_tokens == 0) {
    fputc('\n', stdout);
    return 0;
  }
  char rpc[700];
  int pid = -1, rc = coord_default_rpc_addr(rpc, sizeof rpc);
  if (rc == 0 && !cli_engine_running(rpc, o->model)) {
    FR_LOGI("no server at %s: starting a private engine", rpc);
    rc = cli_engine_start_private(o->model, o->device, (int)o->threads, o->kv_dtype, o->quant, o->spec, rpc,
                                  sizeof rpc, &pid);
  } else if (rc == 0 && o->spec) {
    FR_LOGW("a server runs at %s: --speculative-config applies only to a private engine", rpc);
  }
  if (rc == 0) rc = cli_engine_generate(rpc, NULL, &req, -1, true);
  int err = rc;
  char msgbuf[512];
  snprintf(msgbuf, sizeof msgbuf, "%s", rc ? fr_last_error() : "");
  cli_engine_stop_private(pid);
  if (err) fprintf(stderr, "ferrumctl run: %s\n", msgbuf);
  return err ? 1 : 0;
}

int cli_cmd_run(int argc, char **argv) {
  run_opts_t o;
  int prc = run_parse(argc, argv, &o);
  if (prc) return prc == 1 ? 0 : prc;
  return o.in_process ? run_in_process(&o) : run_engine(&o);
}
