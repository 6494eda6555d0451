/* cli.h - ferrumctl's subcommands and their shared helpers. Each cmd_*
 * returns the process exit code (0 ok, 1 failure, 2 usage). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/fr_client.h"
#include "proto/proto.h"

#ifdef __cplusplus
extern "C" {
#endif

int cli_cmd_run(int argc, char **argv);
int cli_cmd_tokenize(int argc, char **argv);
int cli_cmd_inspect(int argc, char **argv);
int cli_cmd_pull(int argc, char **argv);
int cli_cmd_list(int argc, char **argv);
int cli_cmd_rm(int argc, char **argv);
int cli_cmd_serve(int argc, char **argv);
int cli_cmd_stop(int argc, char **argv);
int cli_cmd_submit(int argc, char **argv);
int cli_cmd_status(int argc, char **argv);
int cli_cmd_cancel(int argc, char **argv);
/* clients of the HTTP API: */
int cli_cmd_chat(int argc, char **argv);
int cli_cmd_bench(int argc, char **argv);
int cli_cmd_keygen(int argc, char **argv);
int cli_cmd_health(int argc, char **argv);

/* The default model's path: $FERRUM_MODEL, else models/<default> under the
 * working directory, else under the source tree ferrumctl was built from. */
const char *cli_default_model(void);

/* The model path as other processes (the workers) can open it, wherever
 * they run: a relative path becomes absolute, its folder through realpath,
 * its last component as given (a symlinked file keeps its name, and so the
 * served model name). An absolute path, or one that does not exist, is
 * copied as given, so that the error of whoever opens it names what the
 * user typed. Returns 0, or an error when out is too small or the folder
 * cannot be resolved. */
int cli_model_path_abs(const char *path, char *out, size_t cap);

/* Models by Hub name (hf_cache.c): the Hugging Face cache folder (HF_HUB_CACHE,
 * HF_HOME/hub, XDG_CACHE_HOME/huggingface/hub, ~/.cache/huggingface/hub);
 * whether s reads as "org/name" or "org/name:PATTERN"; the snapshot folder
 * (config.json) or .gguf file (the one there, or the one whose name
 * contains PATTERN) that such a name loads from the cache, or an error that
 * says what is missing (nothing is downloaded). cli_model_resolve: a path
 * that exists as cli_model_path_abs makes it, else a Hub name resolved,
 * pulled first when the cache lacks it (unless HF_HUB_OFFLINE is set). */
int cli_hf_cache_dir(char *out, size_t cap);
bool cli_hf_is_name(const char *s);
int cli_hf_resolve(const char *name, char *out, size_t cap);
/* cli_hf_resolve, pulling the model first when the cache lacks it (an
 * error instead when HF_HUB_OFFLINE is set). */
int cli_hf_find(const char *name, char *out, size_t cap);
int cli_model_resolve(const char *arg, char *out, size_t cap);

/* Downloads the files that name ("org/name" or "org/name:PATTERN") loads
 * from the Hub's revision (NULL: main) into the Hugging Face cache
 * (hf_pull.c): resumable, each file checked against the Hub's sha256 (or
 * git sha1), laid out as huggingface_hub lays it out. Returns 0, or an error
 * (fr_last_error) that says what failed; a partial download stays as
 * blobs/ETAG.incomplete for the next pull to resume. */
int cli_hf_pull(const char *name, const char *revision);

/* The Hub's listing of a revision (the JSON body of GET
 * /api/models/REPO/revision/REV, len bytes) read: its commit (40 hex
 * digits) into commit, and the names of the files a pull of
 * repo_id[:pattern] downloads into names[0..cap) (the safetensors folder's
 * weights, configs, tokenizer and templates, or the one .gguf the pattern
 * matches). Returns their count, or an error that says what is wrong. */
int cli_hf_listing_files(const char *repo_id, const char *json, size_t len, const char *pattern, char commit[41],
                         char (*names)[512], int cap);

/* Whether HF_HUB_OFFLINE is set (1, true, yes, on): nothing is downloaded. */
bool cli_hf_offline(void);

/* Parses an int / float option value; prints a usage error and returns -1
 * when it is not a number in [lo, hi]. */
int cli_parse_int(const char *opt, const char *s, long lo, long hi, long *out);
int cli_parse_float(const char *opt, const char *s, double lo, double hi, double *out);
/* Parses a byte count as vLLM reads one: plain bytes, or a number (decimals
 * allowed) with a suffix, k / m / g / t for powers of 1000 and K / M / G / T
 * for powers of 1024 ("4G", "512M", "1.5g"). Prints a usage error and
 * returns -1 when it is not a whole count in [1, 2^63). */
int cli_parse_size(const char *opt, const char *s, uint64_t *out);

/* The HTTP server for chat and bench, in *host / *port (NULL / 0: not
 * given). Given ones stand (127.0.0.1 or 8000 for the other); with none,
 * the server that cli_server_http(rpc) finds; with none found and no rpc,
 * 127.0.0.1:8000. Returns 0, or -1 after a message on stderr (several
 * servers run, or none at rpc). */
int cli_http_target(const char *cmd, const char *rpc, const char **host, int *port);

/* ---- engine client helpers (cli_rpc.c, cli_serve.c) ---- */
/* CURVE keys a client command was given (NULL: the environment's,
 * FERRUM_SERVER_KEY and FERRUM_CURVE_SECRET_KEY). */
typedef struct {
  const char *server_key; /* the server's public key: Z85 or a file */
  const char *curve_key;  /* this client's key pair file */
} cli_curve_t;
/* Connects to the server at rpc, with CURVE when a server key is given
 * (k or the environment). Returns 0 or an error with a message. */
int cli_connect(fr_client_t **out, const char *rpc, const cli_curve_t *k);

/* The pid of the ferrumctl server bound to an RPC endpoint (its pid file),
 * or -1 when none runs. */
int cli_server_pid(const char *rpc);
/* The HTTP address of a running server, from the pid files in the runtime
 * folder (coordinator/coord.h): the server bound to rpc, or with rpc NULL
 * the one at the default RPC endpoint, else the only one with HTTP. A
 * wildcard bind (0.0.0.0, ::) gives loopback. Returns 0 with host and port,
 * FR_ENOTFOUND when none runs, FR_EBUSY when several do and none is the
 * default (the message says so). */
int cli_server_http(const char *rpc, char *host, size_t cap, int *port);
/* True when a ready server answers at rpc and serves the model file's name. */
bool cli_engine_running(const char *rpc, const char *model_path);
/* Submits req at rpc, streams the text to stdout (then a newline); stats:
 * timings on stderr. Returns 0 or an error (the job's error included). */
int cli_engine_generate(const char *rpc, const cli_curve_t *k, const proto_submit_t *req, int timeout_ms, bool stats);
/* Starts a private server (ferrumctl serve --no-http on a private ipc://
 * endpoint, written to rpc; kv_dtype: its --kv-cache-dtype, NULL = auto;
 * quant: its --quantization, NULL = none; spec: its --speculative-config
 * JSON, NULL = none) and waits until it is ready; *pid gets its pid. */
int cli_engine_start_private(const char *model, const char *device, int threads, const char *kv_dtype,
                             const char *quant, const char *spec, char *rpc, size_t cap, int *pid);
/* Drains and reaps a private server. */
void cli_engine_stop_private(int pid);

/* The path of a program that ships next to ferrumctl (ferrum-run), in out.
 * Returns 0, or -ENOENT when it is not there or not executable. */
int cli_sibling_exe(const char *name, char *out, size_t cap);

#ifdef __cplusplus
}
#endif
