/* cli_chat.c - `ferrumctl chat`: an interactive chat with a running server
 * over HTTP (/v1/chat/completions, streamed). Reads one user turn per line
 * from stdin (a terminal or a pipe), prints the answer as it arrives, keeps
 * the history; "/exit" or end of input quits, "/clear" forgets. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "ctl/cli.h"
#include "ctl/http_client.h"

typedef struct {
  const char *host, *rpc, *model, *api_key, *system; /* host NULL, port 0: found (cli_http_target) */
  int port;
  double temperature; /* < 0: the server's default */
  long max_tokens;    /* 0: the server's default */
} chat_opts_t;

static void chat_usage(FILE *f) {
  fprintf(f,
          "usage: ferrumctl chat [options]   (a running `ferrumctl serve`)\n"
          "  --host H / --port P / --base-url http://H:P   server (default: the running `ferrumctl serve`,\n"
          "                      found through its pid file, else 127.0.0.1:8000)\n"
          "  --rpc ADDR          the server bound to this RPC endpoint (its HTTP address)\n"
          "  --model NAME        served model name (default: the server's)\n"
          "  --api-key KEY       Authorization: Bearer KEY\n"
          "  --system TEXT       a system message first\n"
          "  --temperature T     sampling temperature\n"
          "  --max-tokens N      answer length cap\n"
          "One line of stdin per turn; /clear forgets the history, /exit (or EOF) quits.\n");
}

static int chat_opt(chat_opts_t *o, const char *k, const char *v) {
  static char host[256];
  long n;
  if (!strcmp(k, "--host")) o->host = v;
  else if (!strcmp(k, "--rpc")) o->rpc = v;
  else if (!strcmp(k, "--port")) {
    if (cli_parse_int(k, v, 1, 65535, &n)) return -1;
    o->port = (int)n;
  } else if (!strcmp(k, "--base-url")) {
    o->port = 80;
    if (strncmp(v, "http://", 7) || sscanf(v + 7, "%255[^:/]:%d", host, &o->port) < 1) {
      fprintf(stderr, "ferrumctl chat: --base-url must look like http://127.0.0.1:8000\n");
      return -1;
    }
    o->host = host;
  } else if (!strcmp(k, "--model")) o->model = v;
  else if (!strcmp(k, "--api-key")) o->api_key = v;
  else if (!strcmp(k, "--system")) o->system = v;
  else if (!strcmp(k, "--temperature")) return cli_parse_float(k, v, 0, 100, &o->temperature);
  else if (!strcmp(k, "--max-tokens")) return cli_parse_int(k, v, 1, 1 << 30, &o->max_tokens);
  else {
    fprintf(stderr, "ferrumctl chat: unknown option %s\n", k);
    return -1;
  }
  return 0;
}

static int chat_parse(chat_opts_t *o, int argc, char **argv) {
  *o = (chat_opts_t){.temperature = -1};
  for (int i = 1; i < argc; i += 2) { /* OPTION VALUE pairs */
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      chat_usage(stdout);
      return 1;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "ferrumctl chat: %s needs a value\n", argv[i]);
      return -1;
    }
    if (chat_opt(o, argv[i], argv[i + 1])) return -1;
  }
  return cli_http_target("chat", o->rpc, &o->host, &o->port);
}

static json_t *chat_body(const chat_opts_t *o, json_t *history) {
  json_t *j = json_pack("{s:O,s:b}", "messages", history, "stream", 1);
  if (j && o->model) json_object_set_new(j, "model", json_string(o->model));
  if (j && o->temperature >= 0) json_object_set_new(j, "temperature", json_real(o->temperature));
  if (j && o->max_tokens) json_object_set_new(j, "max_tokens", json_integer(o->max_tokens));
  return j;
}

/* Prints an error body's message. */
static void chat_print_error(cli_http_t *c) {
  char *b = NULL;
  cli_http_read_all(c, 1 << 20, &b, NULL);
  json_t *j = b ? json_loads(b, JSON_ALLOW_NUL, NULL) : NULL;
  const char *m = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
  fprintf(stderr, "ferrumctl chat: HTTP %d: %s\n", c->status, m ? m : b ? b : "");
  json_decref(j);
  free(b);
}

/* Streams one answer to stdout and appends its text to *reply. */
static int chat_stream(cli_http_t *c, char **reply, size_t *len) {
  const char *d;
  int rc;
  while ((rc = cli_http_next_sse(c, &d)) == 1) {
    if (!strcmp(d, "[DONE]")) break;
    json_t *j = json_loads(d, JSON_ALLOW_NUL, NULL); /* text may hold U+0000 */
    json_t *err = json_object_get(j, "error");
    if (err) {
      fprintf(stderr, "\nferrumctl chat: %s\n", json_string_value(json_object_get(err, "message")));
      json_decref(j);
      return -1;
    }
    json_t *delta = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "delta");
    json_t *content = json_object_get(delta, "content");
    const char *t = json_string_value(content);
    size_t n = json_string_length(content);
    if (t && n) {
      *reply = fr_realloc(*reply, *len + n + 1);
      memcpy(*reply + *len, t, n + 1);
      *len += n;
      fwrite(t, 1, n, stdout);
      fflush(stdout);
    }
    json_decref(j);
  }
  fputc('\n', stdout);
  fflush(stdout);
  if (rc < 0) fprintf(stderr, "ferrumctl chat: %s\n", fr_last_error());
  return rc < 0 ? -1 : 0;
}

/* Sends the history, prints the answer, appends it to the history. */
static int chat_turn(const chat_opts_t *o, json_t *history) {
  char auth[512] = "";
  if (o->api_key) snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", o->api_key);
  json_t *body = chat_body(o, history);
  char *s = body ? json_dumps(body, JSON_COMPACT) : NULL;
  json_decref(body);
  if (!s) return -ENOMEM;
  cli_http_t c;
  char *reply = fr_strdup("");
  size_t len = 0;
  int rc = cli_http_connect(&c, o->host, o->port, 600000);
  if (!rc) rc = cli_http_send(&c, "POST", "/v1/chat/completions", auth, s, strlen(s));
  if (rc) fprintf(stderr, "ferrumctl chat: %s\n", fr_last_error());
  else if (c.status != 200) chat_print_error(&c), rc = -1;
  else rc = chat_stream(&c, &reply, &len);
  if (!rc) json_array_append_new(history, json_pack("{s:s,s:s}", "role", "assistant", "content", reply));
  cli_http_close(&c);
  free(reply);
  free(s);
  return rc;
}

static json_t *chat_history_new(const chat_opts_t *o) {
  json_t *h = json_array();
  if (o->system) json_array_append_new(h, json_pack("{s:s,s:s}", "role", "system", "content", o->system));
  return h;
}

int cli_cmd_chat(int argc, char **argv) {
  chat_opts_t o;
  int rc = chat_parse(&o, argc, argv);
  if (rc) return rc < 0 ? 2 : 0;
  bool tty = isatty(STDIN_FILENO);
  json_t *history = chat_history_new(&o);
  char *line = NULL;
  size_t cap = 0;
  int failures = 0;
  for (;;) {
    if (tty) fputs("> ", stderr);
    ssize_t n = getline(&line, &cap, stdin);
    if (n < 0) break;
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
    if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) break;
    if (!strcmp(line, "/clear")) {
      json_decref(history);
      history = chat_history_new(&o);
      continue;
    }
    if (!n) continue;
    json_t *msg = json_pack("{s:s,s:s}", "role", "user", "content", line);
    if (!msg) { /* not UTF-8 */
      fprintf(stderr, "ferrumctl chat: the line is not UTF-8\n");
      continue;
    }
    json_array_append_new(history, msg);
    if (chat_turn(&o, history)) {
      failures++;
      json_array_remove(history, json_array_size(history) - 1); /* the turn did not happen */
    }
  }
  free(line);
  json_decref(history);
  return failures ? 1 : 0;
}
