/* cli_chat.c - `ferrumctl chat` (being written). */
#include <stdio.h>

#include "coordinator/cli.h"

int cli_cmd_chat(int argc, char **argv) {
  fprintf(stderr, "ferrumctl chat: not implemented yet\n");
  return 1;
}
