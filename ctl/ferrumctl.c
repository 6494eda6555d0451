/* ferrumctl - the one command users touch. */
#include <stdio.h>
#include <string.h>

#include "ctl/cli.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: ferrumctl <command> [options]\n"
          "\n"
          "commands:\n"
          "  serve     start the engine: coordinator, workers, HTTP and RPC\n"
          "  run       generate text from a prompt\n"
          "  chat      interactive chat with a running server\n"
          "  submit    submit a job to a running server (RPC)\n"
          "  status    show a running server's queues and KV usage\n"
          "  cancel    cancel a job\n"
          "  stop      drain and stop a running server\n"
          "  health    exit 0 when a running server's /health answers 200\n"
          "  bench     benchmark a running server (like vllm bench serve)\n"
          "  tokenize  print the token ids of a text as JSON\n"
          "  inspect   print a model's architecture, tokenizer and tensors\n"
          "  pull      fetch a model from the Hugging Face Hub into its cache (no name: the default model into models/)\n"
          "  list      the models in the Hugging Face cache (--model ORG/NAME loads them)\n"
          "  rm        delete a model from the Hugging Face cache\n"
          "  keygen    make a CURVE key pair for tcp:// sockets (servers, clients, remote workers)\n"
          "\n"
          "ferrumctl <command> --help shows a command's options.\n");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const char *cmd = argv[1];
  static const struct {
    const char *name;
    int (*fn)(int, char **);
  } cmds[] = {
      {"run", cli_cmd_run},       {"tokenize", cli_cmd_tokenize}, {"inspect", cli_cmd_inspect},
      {"pull", cli_cmd_pull},     {"serve", cli_cmd_serve},       {"stop", cli_cmd_stop},
      {"submit", cli_cmd_submit}, {"status", cli_cmd_status},     {"cancel", cli_cmd_cancel},
      {"chat", cli_cmd_chat},     {"bench", cli_cmd_bench},       {"keygen", cli_cmd_keygen},
      {"health", cli_cmd_health}, {"list", cli_cmd_list},         {"rm", cli_cmd_rm},
  };
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
    if (!strcmp(cmd, cmds[i].name)) return cmds[i].fn(argc - 1, argv + 1);
  if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
    usage(stdout);
    return 0;
  }
  fprintf(stderr, "ferrumctl: unknown command '%s'\n", cmd);
  usage(stderr);
  return 2;
}
