/* cli_serve.c - `ferrumctl serve` (the coordinator is this process; it
 * starts and supervises the workers and the HTTP frontend) and `ferrumctl
 * stop` (drain the server bound to an RPC endpoint). */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fr_err.h"
#include "common/fr_log.h"
#include "common/fr_util.h"
#include "ctl/cli.h"
#include "coordinator/coord.h"
#include "coordinator/http/http.h"
#include "coordinator/metrics.h"
#include "kernels/kern_types.h"
#include "model/config.h"

typedef struct {
  coord_config_t k;
  const char *model_given; /* --model as given (or the default) */
  char model_abs[4096];    /* k.model_path: that, made absolute for the workers */
  const char *host, *api_key;
  long port;
  long keepalive_s, max_conn, per_ip; /* 0: the HTTP frontend's defaults */
  bool no_http;
  const char *tool_parser;  /* --tool-call-parser */
  bool auto_tools;          /* --enable-auto-tool-choice */
  const char *reasoning;    /* --reasoning-parser */
} serve_opts_t;

static void serve_usage(FILE *f) {
  fprintf(f,
          "usage: ferrumctl serve [--model PATH] [options]\n"
          "  --model PATH                  GGUF file or Hugging Face folder (default: %s)\n"
          "  --device DEV                  cpu (default), cuda[:N], or cuda:A,B,.. (one GPU per rank)\n"
          "  --load-format FMT             auto (default) or dummy: random weights of the folder's config.json\n"
          "                                (GPTQ / AWQ configs: their 4-bit layout)\n"
          "  --tensor-parallel-size N      shard the model over N workers, one per device (default 1)\n"
          "  --threads N                   CPU threads per worker (default: all cores)\n"
          "  --host ADDR / --port N        HTTP address (default 127.0.0.1:8000; port 0 = any)\n"
          "  --no-http                     RPC only\n"
          "  --rpc ADDR                    RPC endpoint (default ipc://<runtime dir>/rpc.sock)\n"
          "  --max-model-len N             context length (default: the model's)\n"
          "  --max-num-seqs N              sequences per step (default 64 on the CPU, 256 on a GPU)\n"
          "  --max-num-batched-tokens N    tokens per step (default 512 on the CPU, 2048 on a GPU)\n"
          "  --block-size N                tokens per KV block (default 16)\n"
          "  --gpu-memory-utilization F    fraction of the device's total memory each worker may use for weights,\n"
          "                                activations and KV cache, in (0, 1] (default 0.9 on a GPU; the CPU\n"
          "                                reports no memory size: there the KV pool holds 4 contexts' worth,\n"
          "                                at most 4096 blocks)\n"
          "  --kv-cache-memory-bytes N     KV cache bytes per worker, on any device: bytes, or K/M/G/T (powers\n"
          "                                of 1024) or k/m/g/t (of 1000), e.g. 4G; overrides --gpu-memory-utilization\n"
          "  --num-kv-blocks N             exactly N KV blocks (overrides both)\n"
          "  --task generate|embed         embed: serve /v1/embeddings (final hidden states pooled as the model\n"
          "                                says, L2-normalized) instead of text generation\n"
          "  --pooling last|mean|cls       embed: how to pool (default: the GGUF's pooling_type or the\n"
          "                                sentence-transformers Pooling config, else last); mean and cls embed\n"
          "                                a prompt in one step (at most --max-num-batched-tokens tokens)\n"
          "  --override-pooler-config JSON vLLM's spelling of --pooling: '{\"pooling_type\": \"MEAN\"}' (MEAN,\n"
          "                                CLS or LAST; \"normalize\" may only be true); --pooler-config too\n"
          "  --kv-cache-dtype T            auto (default: f16 on the CPU, the activation type on a GPU), int8\n"
          "                                or fp8 (E4M3): one byte per element and an f16 scale per token and KV\n"
          "                                head, so the same bytes hold about twice the tokens\n"
          "  --quantization fp8            keep the layers' dense weights as FP8 E4M3, a scale per output row,\n"
          "                                quantized at load (vLLM's dynamic FP8; a CUDA device of compute\n"
          "                                capability 8.9 or newer)\n"
          "  --enable-prefix-caching / --no-enable-prefix-caching   (default on)\n"
          "  --api-key KEY                 HTTP clients must send this bearer token\n"
          "  --sse-keepalive S             a waiting stream gets an SSE comment line this often, so that\n"
          "                                clients and proxies keep it open (default 5)\n"
          "  --max-connections N           open HTTP connections (default 4096, idle ones cost no thread;\n"
          "                                fewer when the descriptor limit, raised to its hard limit, is lower)\n"
          "  --max-connections-per-ip N    HTTP connections one client address may hold (default half of\n"
          "                                --max-connections, at least 128: 2048; behind a proxy every client\n"
          "                                has the proxy's address)\n"
          "  --served-model-name NAME      model name for clients (default: the file name, or the Hub name given)\n"
          "  --chat-template FILE          Jinja chat template to use instead of the model's (or a\n"
          "                                built-in name: chatml, smollm2, qwen2.5, qwen3, llama3, ...)\n"
          "  --enable-auto-tool-choice     tool_choice \"auto\" (the default when a request has tools): the\n"
          "                                model may call tools, its output is parsed (needs --tool-call-parser)\n"
          "  --tool-call-parser NAME       how tool calls look in the output: hermes (Qwen, Hermes: <tool_call>),\n"
          "                                llama3_json (Llama 3.x JSON), mistral ([TOOL_CALLS])\n"
          "  --reasoning-parser NAME       chat answers put the model's think block in reasoning_content: qwen3\n"
          "                                (<think>...</think>), deepseek_r1 (...</think>, <think> in the prompt)\n"
          "  --max-queue N                 waiting jobs before new ones get 429 (default 1024)\n"
          "  --step-stats FILE             write the coordinator's own time per step at exit (ns, items)\n"
          "  --restart-backoff-max MS      longest wait before restarting a worker that keeps dying (default 30000)\n"
          "  --curve-key FILE              this server's CURVE key pair (`ferrumctl keygen`; or the secret key in\n"
          "                                $FERRUM_CURVE_SECRET_KEY): every tcp:// socket (RPC, workers) encrypts\n"
          "                                and lets in only the keys of --curve-clients and its own. Without it a\n"
          "                                tcp:// endpoint other hosts can reach is refused\n"
          "  --curve-clients FILE          public keys allowed to connect, one per line (`cat a.pub b.pub`)\n"
          "  --worker-endpoint ADDR        where workers connect (default ipc:// in the runtime folder;\n"
          "                                tcp://0.0.0.0:5556 for remote workers)\n"
          "  --remote-workers N            the last N ranks are not started here: they join from other hosts\n"
          "                                (`ferrum-worker --connect` the worker endpoint; default 0)\n"
          "  --speculative-config JSON     speculative decoding, as vLLM spells it: '{\"method\": \"ngram\",\n"
          "                                \"num_speculative_tokens\": 4, \"prompt_lookup_max\": 4, \"prompt_lookup_min\": 1}'\n"
          "                                (n-gram prompt lookup; \"disable_by_batch_size\": N turns it off while more\n"
          "                                than N requests run or wait, default 4 on the CPU, 8 on a GPU, 4 on a GPU\n"
          "                                with a draft model; \"min_acceptance_rate\": R, a request whose proposals\n"
          "                                are accepted less often stops proposing, default 0.75 on the CPU, 0.1 on\n"
          "                                a GPU, 0.6 on a GPU with a draft model);\n"
          "                                a draft model: '{\"model\": PATH, \"num_speculative_tokens\": 4}', a smaller\n"
          "                                model with this model's tokenizer, run by the same workers\n",
          cli_default_model());
}

enum {
  O_MODEL = 256, O_DEVICE, O_TP, O_THREADS, O_HOST, O_PORT, O_NOHTTP, O_RPC, O_MML, O_MNS, O_MNBT, O_BS, O_NKV,
  O_PC, O_NOPC, O_KEY, O_NAME, O_CHATTPL, O_STATS, O_FAKE, O_QUEUE, O_LOADFMT, O_GMU, O_KVBYTES, O_BACKOFF, O_KEEPALIVE, O_PERIP,
  O_MAXCONN, O_CURVE, O_CLIENTS, O_WEP, O_REMOTE, O_KVDTYPE, O_QUANT, O_SPEC, O_AUTOTOOLS, O_TOOLPARSER, O_TASK, O_REASONING, O_POOLING, O_POOLERCFG
};

/* vLLM's --override-pooler-config: {"pooling_type": MEAN|CLS|LAST,
 * "normalize": true}; anything else is refused by name. */
static int serve_pooler_config(const char *arg, coord_config_t *k) {
  json_error_t err;
  json_t *root = json_loads(arg, 0, &err), *v;
  const char *key, *why = NULL;
  if (!json_is_object(root)) why = "not a JSON object";
  json_object_foreach(json_is_object(root) ? root : NULL, key, v) {
    if (!strcmp(key, "normalize") && json_is_true(v)) continue;
    int p = !strcmp(key, "pooling_type") && json_is_string(v) ? model_pooling_parse(json_string_value(v)) : -1;
    if (p > MODEL_POOL_NONE) { /* the names are lowercase: MEAN arrives as mean below */
      k->pooling = model_pooling_name((model_pooling_t)p);
      continue;
    }
    why = !strcmp(key, "normalize") ? "normalize: embeddings are always L2-normalized"
          : !strcmp(key, "pooling_type") ? "pooling_type: MEAN, CLS or LAST" : key;
    break;
  }
  if (why) fprintf(stderr, "ferrumctl serve: --override-pooler-config: %s%s\n", why,
                   why == key ? " is not supported" : "");
  json_decref(root);
  return why ? 2 : 0;
}

static int serve_opt(serve_opts_t *o, int c) {
  long v;
  coord_config_t *k = &o->k;
  switch (c) {
  case O_MODEL: k->model_path = optarg; return 0;
  case O_DEVICE: k->device = optarg; return 0;
  case O_LOADFMT:
    if (strcmp(optarg, "auto") && strcmp(optarg, "dummy")) {
      fprintf(stderr, "ferrumctl serve: --load-format is auto or dummy, got '%s'\n", optarg);
      return 2;
    }
    k->load_format = optarg;
    return 0;
  case O_TP: if (cli_parse_int("--tensor-parallel-size", optarg, 1, 16, &v)) return 2; k->tp_size = (int)v; return 0;
  case O_THREADS: if (cli_parse_int("--threads", optarg, 0, 1024, &v)) return 2; k->threads = (int)v; return 0;
  case O_HOST: o->host = optarg; return 0;
  case O_PORT: if (cli_parse_int("--port", optarg, 0, 65535, &o->port)) return 2; return 0;
  case O_NOHTTP: o->no_http = true; return 0;
  case O_RPC: k->rpc_addr = optarg; return 0;
  case O_MML: if (cli_parse_int("--max-model-len", optarg, 2, 1 << 20, &v)) return 2; k->max_model_len = (int)v; return 0;
  case O_MNS: if (cli_parse_int("--max-num-seqs", optarg, 1, 4096, &v)) return 2; k->max_num_seqs = (int)v; return 0;
  case O_MNBT:
    if (cli_parse_int("--max-num-batched-tokens", optarg, 1, 65536, &v)) return 2;
    k->max_num_batched_tokens = (int)v;
    return 0;
  case O_BS: if (cli_parse_int("--block-size", optarg, 1, 256, &v)) return 2; k->block_size = (int)v; return 0;
  case O_NKV: if (cli_parse_int("--num-kv-blocks", optarg, 1, 1 << 24, &v)) return 2; k->num_kv_blocks = (int)v; return 0;
  case O_GMU:
    if (cli_parse_float("--gpu-memory-utilization", optarg, 1e-6, 1, &k->gpu_memory_utilization)) return 2;
    return 0;
  case O_KVDTYPE:
    if (kern_kv_dtype_parse(optarg) < 0) {
      fprintf(stderr, "ferrumctl serve: --kv-cache-dtype is auto, int8 or fp8, got '%s'\n", optarg);
      return 2;
    }
    k->kv_cache_dtype = optarg;
    return 0;
  case O_QUANT:
    if (strcmp(optarg, "fp8")) {
      fprintf(stderr, "ferrumctl serve: --quantization takes fp8 (GPTQ and AWQ checkpoints say so themselves), got "
              "'%s'\n", optarg);
      return 2;
    }
    k->quantization = optarg;
    return 0;
  case O_TASK:
    if (strcmp(optarg, "generate") && strcmp(optarg, "embed")) {
      fprintf(stderr, "ferrumctl serve: --task is generate or embed, got '%s'\n", optarg);
      return 2;
    }
    k->embed = !strcmp(optarg, "embed");
    return 0;
  case O_POOLING:
    if (model_pooling_parse(optarg) <= MODEL_POOL_NONE) {
      fprintf(stderr, "ferrumctl serve: --pooling is last, mean or cls, got '%s'\n", optarg);
      return 2;
    }
    k->pooling = optarg;
    return 0;
  case O_POOLERCFG: return serve_pooler_config(optarg, k);
  case O_KVBYTES: if (cli_parse_size("--kv-cache-memory-bytes", optarg, &k->kv_cache_memory_bytes)) return 2; return 0;
  case O_PC: k->no_prefix_caching = false; return 0;
  case O_NOPC: k->no_prefix_caching = true; return 0;
  case O_KEY: o->api_key = optarg; return 0;
  case O_KEEPALIVE: return cli_parse_int("--sse-keepalive", optarg, 1, 3600, &o->keepalive_s) ? 2 : 0;
  case O_MAXCONN: return cli_parse_int("--max-connections", optarg, 1, 1 << 20, &o->max_conn) ? 2 : 0;
  case O_PERIP: return cli_parse_int("--max-connections-per-ip", optarg, 1, 1 << 20, &o->per_ip) ? 2 : 0;
  case O_NAME: k->served_model_name = optarg; return 0;
  case O_CHATTPL: k->chat_template = optarg; return 0;
  case O_STATS: k->step_stats_path = optarg; return 0;
  case O_FAKE: k->fake_workers = true; return 0;
  case O_QUEUE: if (cli_parse_int("--max-queue", optarg, 1, 1 << 20, &v)) return 2; k->max_waiting = (int)v; return 0;
  case O_BACKOFF:
    if (cli_parse_int("--restart-backoff-max", optarg, 1, 3600000, &v)) return 2;
    k->restart_backoff_max_ms = (int)v;
    return 0;
  case O_CURVE: k->curve_key_path = optarg; return 0;
  case O_CLIENTS: k->curve_clients_path = optarg; return 0;
  case O_WEP: k->worker_endpoint = optarg; return 0;
  case O_SPEC:
    if (coord_spec_parse(optarg, &k->spec)) {
      fprintf(stderr, "ferrumctl serve: %s\n", fr_last_error());
      return 2;
    }
    return 0;
  case O_REMOTE: if (cli_parse_int("--remote-workers", optarg, 0, 16, &v)) return 2; k->remote_workers = (int)v; return 0;
  case O_AUTOTOOLS: o->auto_tools = true; return 0;
  case O_TOOLPARSER:
    if (strcmp(optarg, "hermes") && strcmp(optarg, "llama3_json") && strcmp(optarg, "mistral")) {
      fprintf(stderr, "ferrumctl serve: --tool-call-parser is hermes, llama3_json or mistral, got '%s'\n", optarg);
      return 2;
    }
    o->tool_parser = optarg;
    return 0;
  case O_REASONING:
    if (strcmp(optarg, "qwen3") && strcmp(optarg, "deepseek_r1")) {
      fprintf(stderr, "ferrumctl serve: --reasoning-parser is qwen3 or deepseek_r1, got '%s'\n", optarg);
      return 2;
    }
    o->reasoning = optarg;
    return 0;
  case 'h': serve_usage(stdout); return 1;
  default: serve_usage(stderr); return 2;
  }
}

static int serve_parse(int argc, char **argv, serve_opts_t *o) {
  static const struct option lo[] = {
      {"model", required_argument, 0, O_MODEL},
      {"device", required_argument, 0, O_DEVICE},
      {"load-format", required_argument, 0, O_LOADFMT},
      {"tensor-parallel-size", required_argument, 0, O_TP},
      {"threads", required_argument, 0, O_THREADS},
      {"host", required_argument, 0, O_HOST},
      {"port", required_argument, 0, O_PORT},
      {"no-http", no_argument, 0, O_NOHTTP},
      {"rpc", required_argument, 0, O_RPC},
      {"max-model-len", required_argument, 0, O_MML},
      {"max-num-seqs", required_argument, 0, O_MNS},
      {"max-num-batched-tokens", required_argument, 0, O_MNBT},
      {"block-size", required_argument, 0, O_BS},
      {"num-kv-blocks", required_argument, 0, O_NKV},
      {"gpu-memory-utilization", required_argument, 0, O_GMU},
      {"kv-cache-memory-bytes", required_argument, 0, O_KVBYTES},
      {"kv-cache-dtype", required_argument, 0, O_KVDTYPE},
      {"quantization", required_argument, 0, O_QUANT},
      {"task", required_argument, 0, O_TASK},
      {"pooling", required_argument, 0, O_POOLING},
      {"override-pooler-config", required_argument, 0, O_POOLERCFG},
      {"pooler-config", required_argument, 0, O_POOLERCFG},
      {"enable-prefix-caching", no_argument, 0, O_PC},
      {"no-enable-prefix-caching", no_argument, 0, O_NOPC},
      {"api-key", required_argument, 0, O_KEY},
      {"sse-keepalive", required_argument, 0, O_KEEPALIVE},
      {"max-connections", required_argument, 0, O_MAXCONN},
      {"max-connections-per-ip", required_argument, 0, O_PERIP},
      {"served-model-name", required_argument, 0, O_NAME},
      {"chat-template", required_argument, 0, O_CHATTPL},
      {"step-stats", required_argument, 0, O_STATS},
      {"fake-workers", no_argument, 0, O_FAKE},
      {"max-queue", required_argument, 0, O_QUEUE},
      {"restart-backoff-max", required_argument, 0, O_BACKOFF},
      {"curve-key", required_argument, 0, O_CURVE},
      {"curve-clients", required_argument, 0, O_CLIENTS},
      {"worker-endpoint", required_argument, 0, O_WEP},
      {"remote-workers", required_argument, 0, O_REMOTE},
      {"speculative-config", required_argument, 0, O_SPEC},
      {"enable-auto-tool-choice", no_argument, 0, O_AUTOTOOLS},
      {"tool-call-parser", required_argument, 0, O_TOOLPARSER},
      {"reasoning-parser", required_argument, 0, O_REASONING},
      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  memset(o, 0, sizeof *o);
  o->port = 8000;
  o->host = "127.0.0.1";
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
    int rc = serve_opt(o, c);
    if (rc) return rc;
  }
  if (optind < argc) {
    fprintf(stderr, "ferrumctl serve: unexpected argument '%s'\n", argv[optind]);
    return 2;
  }
  if (o->auto_tools && !o->tool_parser) { /* as vLLM refuses it */
    fprintf(stderr, "ferrumctl serve: --enable-auto-tool-choice requires --tool-call-parser\n");
    return 2;
  }
  if (!o->k.model_path) o->k.model_path = cli_default_model();
  if (cli_model_resolve(o->k.model_path, o->model_abs, sizeof o->model_abs)) {
    fprintf(stderr, "ferrumctl serve: --model %s\n", fr_last_error());
    return 2;
  }
  o->model_given = o->k.model_path;
  o->k.model_path = o->model_abs;
  if (!o->k.served_model_name && cli_hf_is_name(o->model_given) && access(o->model_given, F_OK) != 0)
    o->k.served_model_name = o->model_given; /* a Hub name is served as given, as vLLM does */
  return 0;
}

static void serve_hook_ready(void *arg, bool ready) { coord_http_set_ready(arg, ready); }
static void serve_hook_drain(void *arg) { coord_http_set_draining(arg); }

static int serve_http_start(coord_t *c, const serve_opts_t *o, coord_metrics_t *m, coord_http_t **out) {
  coord_http_config_t hc = {.zmq_ctx = coord_zmq_ctx(c),
                            .rpc_endpoint = coord_inproc_endpoint(c),
                            .host = o->host,
                            .port = (int)o->port,
                            .api_key = o->api_key,
                            .keepalive_ms = (unsigned)o->keepalive_s * 1000u,
                            .max_connections = (unsigned)o->max_conn,
                            .max_connections_per_ip = (unsigned)o->per_ip,
                            .served_model_name = coord_served_model_name(c),
                            .max_model_len = (uint32_t)coord_max_model_len(c),
                            .metrics = m,
                            .tokenizer = coord_tokenizer(c),
                            .tool_call_parser = o->tool_parser,
                            .enable_auto_tool_choice = o->auto_tools,
                            .reasoning_parser = o->reasoning};
  int rc = coord_http_start(out, &hc);
  if (rc) return rc;
  coord_set_hooks(c, serve_hook_ready, serve_hook_drain, *out);
  FR_LOGI("HTTP on http://%s:%d", o->host, coord_http_port(*out));
  if (coord_set_http_addr(c, o->host, coord_http_port(*out))) /* chat and bench will not find it */
    FR_LOGW("pid file: %s", fr_last_error());
  return 0;
}

int cli_cmd_serve(int argc, char **argv) {
  serve_opts_t o;
  int prc = serve_parse(argc, argv, &o);
  if (prc) return prc == 1 ? 0 : prc;
  fr_log_set_tag("coord");
  if (strcmp(o.model_given, o.model_abs)) FR_LOGI("model %s is %s", o.model_given, o.model_abs);
  const coord_spec_config_t *sc = &o.k.spec;
  if (sc->num_speculative_tokens > 0)
    FR_LOGI("speculative decoding: ngram, %d tokens, n-grams of %d..%d", sc->num_speculative_tokens,
            sc->prompt_lookup_min, sc->prompt_lookup_max);
  coord_t *c = NULL;
  coord_metrics_t *metrics = NULL;
  coord_http_t *http = NULL;
  int rc = coord_create(&c, &o.k);
  if (rc) goto done;
  if (!o.no_http) {
    if ((rc = coord_metrics_create(&metrics, coord_served_model_name(c)))) goto done;
    coord_set_metrics(c, metrics);
    /* the frontend checks lengths against the context: start it once that is final */
    if (coord_kv_sized(c) && (rc = serve_http_start(c, &o, metrics, &http))) goto done;
  }
  FR_LOGI("waiting for the workers to load the model");
  if ((rc = coord_wait_ready(c, 600000))) {
    if (rc == FR_ECANCELED) rc = 0; /* stopped while loading */
    goto done;
  }
  if (!o.no_http && !http && (rc = serve_http_start(c, &o, metrics, &http))) goto done;
  FR_LOGI("ready: RPC %s", coord_rpc_endpoint(c));
  rc = coord_run(c);
done:
  if (rc) fprintf(stderr, "ferrumctl serve: %s\n", fr_last_error());
  coord_http_stop(http);
  coord_destroy(c);
  coord_metrics_destroy(metrics);
  if (!rc) FR_LOGI("stopped");
  return rc ? 1 : 0;
}

/* ---- stop ----------------------------------------------------------------------- */

/* True while pid runs (a zombie has finished). */
static bool cli_pid_alive(int pid) {
  if (kill(pid, 0) != 0) return false;
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE *f = fopen(path, "r");
  if (!f) return false;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  const char *p = strrchr(buf, ')');
  return !(p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X'));
}

/* Reads a pid file: the pid when that process runs and is a ferrumctl (a
 * reused pid is not), else -1; http gets its HTTP line ("" when none). */
static int cli_pidfile_read(const char *path, char *http, size_t cap) {
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  char line[700];
  int pid = -1;
  if (http) http[0] = 0;
  for (int i = 0; i < 4 && fgets(line, sizeof line, f); i++) {
    line[strcspn(line, "\n")] = 0;
    if (i == 0 && sscanf(line, "%d", &pid) != 1) pid = -1;
    if (i == 3 && http && strlen(line) < cap) memcpy(http, line, strlen(line) + 1); /* longer: none */
  }
  fclose(f);
  if (pid <= 0 || !cli_pid_alive(pid)) return -1;
  char path2[64], cmd[256] = {0};
  snprintf(path2, sizeof path2, "/proc/%d/cmdline", pid);
  FILE *cf = fopen(path2, "r");
  size_t n = cf ? fread(cmd, 1, sizeof cmd - 1, cf) : 0;
  if (cf) fclose(cf);
  for (size_t i = 0; i < n; i++)
    if (!cmd[i]) cmd[i] = ' ';
  return strstr(cmd, "ferrumctl") ? pid : -1;
}

int cli_server_pid(const char *rpc) {
  char pf[700];
  if (coord_pidfile_path(rpc, pf, sizeof pf)) return -1;
  return cli_pidfile_read(pf, NULL, 0);
}

/* Splits http://host:port (or http://[v6]:port) into a host a client can
 * connect to (a wildcard bind becomes loopback) and a port. */
static int cli_http_url_split(const char *url, char *host, size_t cap, int *port) {
  const char *h = !strncmp(url, "http://", 7) ? url + 7 : NULL;
  const char *end = h && *h == '[' ? strchr(h, ']') : h ? strrchr(h, ':') : NULL;
  const char *colon = end && *end == ']' ? end + 1 : end;
  if (!end || !colon || *colon != ':' || sscanf(colon + 1, "%d", port) != 1 || *port <= 0 || *port > 65535)
    return fr_errorf(FR_EFORMAT, "HTTP address '%s' is not http://host:port", url);
  if (*h == '[') h++;
  int n = (int)(end - h);
  if (n <= 0 || (size_t)n >= cap) return fr_errorf(FR_EFORMAT, "HTTP address '%s' has a bad host", url);
  snprintf(host, cap, "%.*s", n, h);
  if (!strcmp(host, "0.0.0.0")) snprintf(host, cap, "127.0.0.1");
  else if (!strcmp(host, "::")) snprintf(host, cap, "::1");
  return 0;
}

/* Every running server's HTTP address in the runtime folder: the one at
 * the default RPC endpoint if it has one, else the only one. */
static int cli_server_http_scan(char *url, size_t cap) {
  char dir[512], def[600], def_pf[700] = "";
  int rc = coord_runtime_dir(dir, sizeof dir);
  if (rc) return rc;
  if (coord_default_rpc_addr(def, sizeof def) == 0) coord_pidfile_path(def, def_pf, sizeof def_pf);
  DIR *d = opendir(dir);
  if (!d) return fr_errorf(-errno, "%s: %s", dir, strerror(errno));
  int found = 0;
  bool is_default = false;
  struct dirent *e;
  while ((e = readdir(d)) && !is_default) {
    size_t n = strlen(e->d_name);
    if (strncmp(e->d_name, "server-", 7) || n < 4 || strcmp(e->d_name + n - 4, ".pid")) continue;
    char pf[1100], http[320];
    snprintf(pf, sizeof pf, "%s/%s", dir, e->d_name);
    if (cli_pidfile_read(pf, http, sizeof http) < 0 || !http[0]) continue;
    is_default = !strcmp(pf, def_pf);
    if (found++ && !is_default) continue;
    snprintf(url, cap, "%s", http);
  }
  closedir(d);
  if (!found) return fr_errorf(FR_ENOTFOUND, "no running server with HTTP in %s", dir);
  if (found > 1 && !is_default)
    return fr_errorf(FR_EBUSY, "%d servers with HTTP run (pid files in %s): give --port or --rpc", found, dir);
  return 0;
}

int cli_server_http(const char *rpc, char *host, size_t cap, int *port) {
  char url[320] = "";
  int rc = 0;
  if (rpc) {
    char pf[700];
    if ((rc = coord_pidfile_path(rpc, pf, sizeof pf))) return rc;
    if (cli_pidfile_read(pf, url, sizeof url) < 0) return fr_errorf(FR_ENOTFOUND, "no server runs at %s", rpc);
    if (!url[0]) return fr_errorf(FR_ENOTFOUND, "the server at %s has no HTTP frontend", rpc);
  } else if ((rc = cli_server_http_scan(url, sizeof url))) {
    return rc;
  }
  return cli_http_url_split(url, host, cap, port);
}

int cli_cmd_stop(int argc, char **argv) {
  static const struct option lo[] = {
      {"rpc", required_argument, 0, 'r'}, {"timeout", required_argument, 0, 't'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
  const char *rpc = NULL;
  long timeout = 300;
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
    if (c == 'r') rpc = optarg;
    else if (c == 't' && cli_parse_int("--timeout", optarg, 1, 86400, &timeout) == 0) continue;
    else {
      fprintf(c == 'h' ? stdout : stderr, "usage: ferrumctl stop [--rpc ADDR] [--timeout SECONDS]\n");
      return c == 'h' ? 0 : 2;
    }
  }
  char def[600];
  if (!rpc && coord_default_rpc_addr(def, sizeof def) == 0) rpc = def;
  int pid = rpc ? cli_server_pid(rpc) : -1;
  if (pid < 0) {
    fprintf(stderr, "ferrumctl stop: no server runs at %s\n", rpc ? rpc : "(default)");
    return 1;
  }
  if (kill(pid, SIGTERM) != 0) {
    fprintf(stderr, "ferrumctl stop: kill %d: %s\n", pid, strerror(errno));
    return 1;
  }
  fprintf(stderr, "ferrumctl stop: draining server %d\n", pid);
  uint64_t deadline = fr_now_ns() + (uint64_t)timeout * 1000000000ull;
  while (cli_pid_alive(pid)) {
    if (fr_now_ns() > deadline) {
      fprintf(stderr, "ferrumctl stop: server %d still running after %ld s\n", pid, timeout);
      return 1;
    }
    usleep(20000);
  }
  fprintf(stderr, "ferrumctl stop: stopped\n");
  return 0;
}
