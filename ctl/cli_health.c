/* cli_health.c - `ferrumctl health`: asks a running server's /health
 * whether it is ready, for container health checks (deploy/docker/), where
 * no curl is installed. Exit status 0 when /health answers 200, 1 when it
 * answers anything else or nothing within the timeout, 2 on a usage error. */
#include <stdio.h>
#include <string.h>

#include "common/fr_err.h"
#include "ctl/cli.h"
#include "ctl/http_client.h"

static void health_usage(FILE *f) {
  fprintf(f,
          "usage: ferrumctl health [options]   (a running `ferrumctl serve`)\n"
          "  --host H / --port P   server (default: the running `ferrumctl serve`,\n"
          "                        found through its pid file, else 127.0.0.1:8000)\n"
          "  --rpc ADDR            the server bound to this RPC endpoint (its HTTP address)\n"
          "  --timeout SECONDS     for the connection and the answer (default 5)\n"
          "Exit status 0 when GET /health answers 200 (the workers are ready), else 1.\n");
}

int cli_cmd_health(int argc, char **argv) {
  const char *host = NULL, *rpc = NULL;
  int port = 0;
  long timeout = 5, n;
  for (int i = 1; i < argc; i++) {
    const char *k = argv[i];
    if (!strcmp(k, "-h") || !strcmp(k, "--help")) {
      health_usage(stdout);
      return 0;
    }
    const char *v = i + 1 < argc ? argv[++i] : NULL;
    if (!v) {
      fprintf(stderr, "ferrumctl health: %s needs a value\n", k);
      return 2;
    }
    if (!strcmp(k, "--host")) host = v;
    else if (!strcmp(k, "--rpc")) rpc = v;
    else if (!strcmp(k, "--port") && cli_parse_int(k, v, 1, 65535, &n) == 0) port = (int)n;
    else if (!strcmp(k, "--timeout") && cli_parse_int(k, v, 1, 3600, &timeout) == 0) continue;
    else {
      if (strcmp(k, "--port") && strcmp(k, "--timeout")) health_usage(stderr);
      return 2;
    }
  }
  if (cli_http_target("health", rpc, &host, &port)) return 1;
  cli_http_t c;
  int rc = cli_http_connect(&c, host, port, (int)timeout * 1000);
  if (!rc) rc = cli_http_send(&c, "GET", "/health", NULL, NULL, 0);
  int status = rc ? 0 : c.status;
  cli_http_close(&c);
  if (rc) {
    fprintf(stderr, "ferrumctl health: http://%s:%d/health: %s\n", host, port, fr_last_error());
    return 1;
  }
  printf("http://%s:%d/health: %d %s\n", host, port, status, status == 200 ? "ready" : "not ready");
  return status == 200 ? 0 : 1;
}
