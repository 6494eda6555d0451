/* ferrumctl - the one command users touch. */
#include <stdio.h>
#include <string.h>

#include "coordinator/cli.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: ferrumctl <command> [options]\n"
          "\n"
          "commands:\n"
          "  run       generate text from a prompt\n"
          "  tokenize  print the token ids of a text as JSON\n"
          "  inspect   print a model's architecture, tokenizer and tensors\n"
          "\n"
          "ferrumctl <command> --help shows a command's options.\n");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "run")) return cli_cmd_run(argc - 1, argv + 1);
  if (!strcmp(cmd, "tokenize")) return cli_cmd_tokenize(argc - 1, argv + 1);
  if (!strcmp(cmd, "inspect")) return cli_cmd_inspect(argc - 1, argv + 1);
  if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
    usage(stdout);
    return 0;
  }
  fprintf(stderr, "ferrumctl: unknown command '%s'\n", cmd);
  usage(stderr);
  return 2;
}
